"""Fleet execution with fake nodes: parallel bound, batches, max-fail, failures isolated, main-thread events."""

import _thread
import stat
import threading
import time
from pathlib import Path

import pytest

from gpunode import cancel
from gpunode.errors import ConnectError, UsageError
from gpunode.fleet import HostResult, LoggedConnection, batches, interrupt_text, result_from_report, run_fleet
from gpunode.inventory import InventoryHost
from gpunode.options import Options
from gpunode.runner import apply_pipeline
from gpunode.steps import PIPELINE as FULL
from tests.fakes.connection import FakeConnection, FakeNode

HOSTS = [InventoryHost(f"gpu-{i:02d}") for i in range(20)]


def gpu_node() -> FakeNode:
    node = FakeNode(tools={"update-initramfs", "modprobe"})
    node.add_gpu(0x2330)
    return node


def test_batches():
    assert [len(b) for b in batches(HOSTS, "6")] == [6, 6, 6, 2]
    assert [len(b) for b in batches(HOSTS, "25%")] == [5, 5, 5, 5]
    assert [len(b) for b in batches(HOSTS, None)] == [20]
    for bad in ("0", "x", "150%", "-1"):
        with pytest.raises(UsageError):
            batches(HOSTS, bad)


PIPELINE = tuple(s for s in FULL if s.name != "driver")  # no --driver: the driver step blocks a GPU node


def test_twenty_nodes_converge_and_failures_do_not_stop_others(tmp_path):
    nodes = {h.name: gpu_node() for h in HOSTS}
    active, peak, lock = 0, 0, threading.Lock()
    main = threading.current_thread()
    seen_threads = set()

    def work(host, reporter, log):
        nonlocal active, peak
        with lock:
            active += 1
            peak = max(peak, active)
        try:
            time.sleep(0.02)
            if host.name == "gpu-03":
                raise ConnectError("gpu-03: cannot connect to gpu-03:22: Connection refused")
            if host.name == "gpu-07":
                raise ConnectError("gpu-07: host key of gpu-07 has CHANGED; refusing to connect")
            conn = LoggedConnection(FakeConnection(nodes[host.name], name=host.name), log)
            return result_from_report(host.name, apply_pipeline(conn, PIPELINE, Options(), reporter))
        finally:
            with lock:
                active -= 1

    def on_event(event):
        seen_threads.add(threading.current_thread())

    results = run_fleet(HOSTS, work, parallel=4, log_dir=tmp_path, on_event=on_event)
    by_host = {r.host: r for r in results}
    assert [r.host for r in results] == [h.name for h in HOSTS]  # inventory order kept
    assert by_host["gpu-03"].status == "unreachable" and "refused" in by_host["gpu-03"].error
    assert by_host["gpu-07"].status == "unreachable" and "CHANGED" in by_host["gpu-07"].error
    converged = [r for r in results if r.host not in ("gpu-03", "gpu-07")]
    assert all(r.status == "changed" for r in converged)
    assert all("blacklist nouveau" in nodes[r.host].files["/etc/modprobe.d/blacklist-nouveau.conf"] for r in converged)
    assert 1 < peak <= 4  # really parallel, never above the bound
    assert seen_threads == {main}  # only the main thread saw events (and drew)
    log = (tmp_path / "gpu-05.log").read_text()
    assert "update-initramfs -u" in log and "exit 0" in log
    assert "unreachable" in (tmp_path / "gpu-03.log").read_text()


def test_max_fail_stops_new_batches_only():
    started = []

    def work(host, reporter, log):
        started.append(host.name)
        if host.name in ("gpu-00", "gpu-01", "gpu-02"):
            return HostResult(host.name, "failed", error="boom")
        return HostResult(host.name, "ok")

    results = run_fleet(HOSTS, work, parallel=5, batch="5", max_fail=10)
    # Batch 1 (5 hosts) runs completely; 3/20 = 15% > 10%: no further batch starts.
    assert sorted(started) == [f"gpu-{i:02d}" for i in range(5)]
    assert [r.status for r in results[5:]] == ["skipped"] * 15
    assert "--max-fail 10%" in results[10].error


def test_a_crash_in_one_node_is_contained():
    def work(host, reporter, log):
        if host.name == "gpu-01":
            raise RuntimeError("bug")
        return HostResult(host.name, "ok")

    results = run_fleet(HOSTS[:3], work, parallel=2)
    assert [r.status for r in results] == ["ok", "failed", "ok"]
    assert "internal error" in results[1].error


# -- Ctrl-C ---------------------------------------------------------------------------------------------------

def interrupt_after(*delays):
    """Deliver Ctrl-C to this test's own main thread (never to another process) after each delay."""
    timers = [threading.Timer(d, _thread.interrupt_main) for d in delays]
    for timer in timers:
        timer.start()
    return timers


def stepping_work(steps=20, seconds=0.05, honour_checkpoints=True, finished=None):
    """Work that behaves like the runner with its hook: a checkpoint before every step."""

    def work(host, reporter, log):
        for i in range(steps):
            if honour_checkpoints:
                cancel.checkpoint(f"step s{i}")
            reporter.events.put(("action", host.name, (f"s{i}", "start", "doing it")))
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:  # a command in flight: the connection polls for an abort
                cancel.check_abort("running a command")
                time.sleep(0.01)
        if finished is not None:
            finished.append(host.name)
        return HostResult(host.name, "changed")

    return work


@pytest.mark.usefixtures("cli_owns_signals")  # gpunode's own handler (tests/conftest.py)
def test_first_ctrl_c_stops_dispatch_lets_steps_stop_safely_and_returns_every_result():
    events = []
    timers = interrupt_after(0.3)
    started = time.monotonic()
    results = run_fleet(HOSTS[:6], stepping_work(), parallel=2, batch="4", on_event=events.append)
    for timer in timers:
        timer.join()
    assert time.monotonic() - started < 3
    assert results.interrupted and not results.aborted
    statuses = {r.host: r.status for r in results}
    assert statuses == {"gpu-00": "interrupted", "gpu-01": "interrupted", "gpu-02": "skipped",
                        "gpu-03": "skipped", "gpu-04": "skipped", "gpu-05": "skipped"}
    assert results[0].error.startswith("stopped before step s")  # at a safe point, between steps
    assert "not started: interrupted (Ctrl-C)" in results[3].error and "not started" in results[5].error
    stopping = [e[2] for e in events if e[0] == "interrupt"]
    assert stopping and stopping[0]["stage"] == "stopping" and stopping[0]["seconds_left"] == 30
    assert stopping[0]["running"] == ["gpu-00", "gpu-01"]
    assert "press Ctrl-C again to abort now" in interrupt_text(stopping[0])
    assert [e[1] for e in events if e[0] == "done"].count("gpu-05") == 1  # every host reported once


@pytest.mark.usefixtures("cli_owns_signals")  # gpunode's own handler (tests/conftest.py)
def test_second_ctrl_c_aborts_at_once_and_names_the_nodes_that_may_be_mid_step():
    events = []
    timers = interrupt_after(0.3, 0.6)
    started = time.monotonic()
    work = stepping_work(steps=1, seconds=30, honour_checkpoints=False)  # a step that would not stop
    results = run_fleet(HOSTS[:3], work, parallel=2, on_event=events.append)
    for timer in timers:
        timer.join()
    assert time.monotonic() - started < 3
    assert results.interrupted and results.aborted
    assert results.maybe_mid_step == ["gpu-00", "gpu-01"]
    assert [r.status for r in results] == ["interrupted", "interrupted", "skipped"]
    assert "may be in the middle" in results[0].error
    last = [e[2] for e in events if e[0] == "interrupt"][-1]
    assert last["stage"] == "aborted" and interrupt_text(last) == (
        "aborted: these nodes may be in the middle of a step: gpu-00, gpu-01")


@pytest.mark.usefixtures("cli_owns_signals")  # gpunode's own handler (tests/conftest.py)
def test_the_grace_period_counts_down_then_aborts():
    events = []
    timers = interrupt_after(0.2)
    results = run_fleet(HOSTS[:1], stepping_work(steps=1, seconds=30, honour_checkpoints=False), grace=2,
                        on_event=events.append)
    for timer in timers:
        timer.join()
    countdown = [e[2]["seconds_left"] for e in events if e[0] == "interrupt" and e[2]["stage"] == "stopping"]
    assert countdown == [2, 1, 0]
    assert results.aborted and results[0].status == "interrupted"


@pytest.mark.usefixtures("cli_owns_signals")  # gpunode's own handler (tests/conftest.py)
def test_a_sigterm_stops_a_fleet_as_the_first_ctrl_c_does_and_exits_143():
    import os
    import signal

    from gpunode.cli._fleet import fleet_exit_code
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM))  # this process only
    timer.start()
    results = run_fleet(HOSTS[:4], stepping_work(), parallel=2)
    timer.join()
    assert results.interrupted and not results.aborted
    assert [r.status for r in results] == ["interrupted", "interrupted", "skipped", "skipped"]
    assert "not started: stopped (SIGTERM)" in results[3].error
    assert fleet_exit_code(results) == 143
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handed back


def test_a_run_without_interrupt_is_not_marked_interrupted():
    results = run_fleet(HOSTS[:3], stepping_work(steps=2, seconds=0.01), parallel=3)
    assert not results.interrupted and [r.status for r in results] == ["changed"] * 3


# -- logs -----------------------------------------------------------------------------------------------------

def test_inventory_names_never_escape_the_log_dir_and_logs_are_private(tmp_path):
    names = ["../../escaped", "a/b", "a_b", "..", ".hidden", "gpu-01", "GPU-01"]
    hosts = [InventoryHost(n) for n in names]
    log_dir = tmp_path / "logs" / "run1"

    def work(host, reporter, log):
        log.write(f"hello from {host.name}\n")
        return HostResult(host.name, "ok")

    results = run_fleet(hosts, work, parallel=3, log_dir=log_dir)
    assert [r.status for r in results] == ["ok"] * len(names)  # nobody's result was lost
    paths = [Path(r.log) for r in results]
    assert len(set(paths)) == len(names)
    for path, name in zip(paths, names, strict=True):
        assert path.parent == log_dir and not path.name.startswith(".")
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert path.read_text() == f"hello from {name}\n"
    assert stat.S_IMODE(log_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE(log_dir.parent.stat().st_mode) == 0o700
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == sorted(p.name for p in paths)
    assert Path(results[5].log).name == "gpu-01.log"  # a harmless name stays as it is


DAEMON_JSON = '{\n  "auths": {"registry.example.com": {"auth": "c2VjcmV0OnRva2Vu"}},\n  "data-root": "/data/docker"\n}\n'


@pytest.mark.parametrize("level", ["info", "debug"])
def test_node_file_contents_reach_the_log_only_at_debug_and_secrets_never(tmp_path, level):
    node = FakeNode()
    node.put("/etc/docker/daemon.json", DAEMON_JSON)

    def work(host, reporter, log):
        conn = LoggedConnection(FakeConnection(node, name=host.name), log)
        assert conn.read_file("/etc/docker/daemon.json") == DAEMON_JSON
        conn.run(["false-tool"])  # fails: its stderr tail is worth keeping at any level
        log.write('report: {"after": "password = \\"hunter2\\""}\n')
        return HostResult(host.name, "ok")

    results = run_fleet(HOSTS[:1], work, log_dir=tmp_path, log_level=level)
    text = Path(results[0].log).read_text()
    assert "c2VjcmV0OnRva2Vu" not in text and "hunter2" not in text
    assert "read-file" in text and "exit 0" in text and "no handler for command" in text
    if level == "debug":
        assert '"data-root": "/data/docker"' in text and '"auth": "***"' in text
    else:
        assert "data-root" not in text


def test_an_unknown_log_level_is_a_usage_error():
    with pytest.raises(UsageError, match="--log-level 'trace'") as info:
        run_fleet(HOSTS[:1], lambda h, r, log: HostResult(h.name, "ok"), log_level="trace")
    assert "--log-level debug" in info.value.fix


def test_a_rerun_into_the_same_log_dir_replaces_the_logs_and_a_planted_symlink_is_refused(tmp_path):
    def work(host, reporter, log):
        log.write(f"run of {host.name}\n")
        return HostResult(host.name, "ok")

    assert [r.status for r in run_fleet(HOSTS[:2], work, log_dir=tmp_path)] == ["ok", "ok"]
    (tmp_path / "gpu-00.log").chmod(0o644)
    (tmp_path / "gpu-01.log").unlink()
    (tmp_path / "gpu-01.log").symlink_to(tmp_path / "victim")
    results = run_fleet(HOSTS[:2], work, log_dir=tmp_path)
    assert results[0].status == "ok" and (tmp_path / "gpu-00.log").read_text() == "run of gpu-00\n"
    assert stat.S_IMODE((tmp_path / "gpu-00.log").stat().st_mode) == 0o600
    assert results[1].status == "failed" and "cannot create the log file" in results[1].error
    assert not (tmp_path / "victim").exists()
