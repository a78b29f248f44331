"""Fleet execution with fake nodes: parallel bound, batches, max-fail, failures isolated, main-thread events."""

import threading
import time

import pytest

from gpunode.errors import ConnectError, UsageError
from gpunode.fleet import HostResult, LoggedConnection, batches, result_from_report, run_fleet
from gpunode.inventory import InventoryHost
from gpunode.options import Options
from gpunode.runner import apply_pipeline
from gpunode.steps import PIPELINE
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
