"""The reliability suite: one gpunode run at a time on a node (gpunode/nodelock.py), and the temp files a killed
run leaves behind. On simulated nodes: real sshd, the node's own sh. See docs/reliability.md."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpunode import nodelock
from gpunode.cli import app
from gpunode.connection.ssh import SSHConnection
from gpunode.facts import first_probe, gather
from gpunode.options import Options
from gpunode.runner import NullReporter, apply_pipeline
from gpunode.steps import PIPELINE
from tests.integration.test_reliability_faults import (
    changing_calls,
    container_node,
    flat,
    install,
    journal,
    ssh,
)
from tests.nodesim.fixtures import host_guard, nodesim_available, sim_node  # noqa: F401 - pytest fixtures

pytestmark = pytest.mark.integration
LOCK = nodelock.LOCK_PATH
SELECTED = tuple(s for s in PIPELINE if s.name in ("toolkit", "runtime", "nodesettings"))


def restarts(node) -> list[list[str]]:
    return [c for c in node.calls("systemctl") if c[1:2] == ["restart"]]


def test_a_second_run_stops_with_exit_2_naming_the_holder_and_changes_nothing(sim_node):  # noqa: F811
    node = container_node(sim_node)
    with ssh(node) as other, nodelock.held(other, "install driver", 0):
        assert node.exists(LOCK)
        node.clear_calls()
        result = install(node, "--lock-timeout", "1")
        assert result.exit_code == 2, result.output
        shown = flat(result.output)
        assert "another gpunode run holds the node" in shown and "`gpunode install driver`" in shown
        assert "pid " in shown and " on the node" in shown and " since 20" in shown and " from " in shown
        assert "--lock-timeout" in shown  # the fix
        assert changing_calls(node) == [] and journal(node)["runs"] == []
    assert not node.exists(LOCK)  # released with the block
    done = install(node)
    assert done.exit_code == 0, done.output


def test_two_runs_at_once_change_the_node_once_and_the_journal_keeps_every_record(sim_node):  # noqa: F811
    node = container_node(sim_node)
    reports = []

    def run() -> None:
        with ssh(node) as conn:
            reports.append(apply_pipeline(conn, SELECTED, Options(lock_timeout=120), NullReporter()))

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert [r.exit_code for r in reports] == [0, 0], [r.to_dict() for r in reports]
    # the second run waited, then found everything done: one configure, one engine restart
    assert len([c for c in node.calls("nvidia-ctk") if "configure" in c]) == 1, node.calls("nvidia-ctk")
    assert len(restarts(node)) == 1, restarts(node)
    record = journal(node)
    assert [r["status"] for r in record["runs"]] == ["done"]
    assert {r["step"] for r in record["undo"]} >= {"toolkit", "runtime"}
    assert not node.exists(LOCK)


def test_the_second_run_waits_for_the_first_and_says_so(sim_node):  # noqa: F811
    node = container_node(sim_node)
    with ssh(node) as other:
        lock = nodelock.acquire(other, "uninstall", 0)
        threading.Timer(2.0, lock.release).start()
        started = time.monotonic()
        result = install(node, "--lock-timeout", "60")
    assert result.exit_code == 0, result.output
    assert time.monotonic() - started >= 2.0
    assert "waiting up to 60s for another gpunode run on this node" in flat(result.output)


KILLED = '''
import sys, time
from gpunode import nodelock
from gpunode.connection.ssh import SSHConnection, SSHOptions
conn = SSHConnection(sys.argv[1], SSHOptions(identity=[sys.argv[2]], known_hosts=[sys.argv[3]]))
nodelock.acquire(conn, "install everything", 0)
print("held", flush=True)
time.sleep(120)
'''


def test_a_run_killed_with_sigkill_does_not_leave_the_node_locked(sim_node):  # noqa: F811
    node = container_node(sim_node)
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(KILLED), f"root@127.0.0.1:{node.port}",
                             str(node.key_path), str(node.known_hosts)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        assert node.exists(LOCK)
    finally:
        proc.kill()
        proc.wait()
    started = time.monotonic()
    result = install(node, "--lock-timeout", "30")
    assert result.exit_code == 0, result.output
    assert time.monotonic() - started < 25  # the node-side keeper let go when the connection went


def test_a_stale_lock_whose_keeper_is_gone_is_taken_over_with_a_note(sim_node):  # noqa: F811
    node = container_node(sim_node)
    boot = node.read("/proc/sys/kernel/random/boot_id").strip()
    dead = 999_999_999  # never a live pid (above pid_max)
    holder = (f"gpunode-lock pid={dead} boot={boot}\ncommand=gpunode install driver\nsince=2026-01-01T00:00:00Z\n"
              "from=ops@laptop")
    node.run_local(f"mkdir -p /var/lib/gpunode && ln -s '{holder}' {LOCK}")
    result = install(node, "--lock-timeout", "5")
    assert result.exit_code == 0, result.output
    shown = flat(result.output)
    assert "took over a stale gpunode lock (its run is gone from the node)" in shown
    assert f"pid {dead} on the node, `gpunode install driver` since 2026-01-01T00:00:00Z, from ops@laptop" in shown
    assert not node.exists(LOCK)


def test_partial_uploads_a_killed_receiver_left_in_var_tmp_are_removed(sim_node):  # noqa: F811
    node = container_node(sim_node)
    node.write("/var/tmp/gpunode.Ab12Cd/NVIDIA-Linux-x86_64-535.129.03.run", "half an installer", 0o700)
    node.write("/var/tmp/.gpunode-upload.Xy34Zw", "half an upload", 0o600)
    node.write("/var/lib/gpunode/.gpunode-tmp.Qr56St", "half a journal", 0o600)
    node.write("/var/tmp/gpunode-notes.txt", "not ours", 0o644)  # not gpunode's temp naming: kept
    result = install(node)
    assert result.exit_code == 0, result.output
    assert "removed 3 temporary file(s) an earlier run left behind" in flat(result.output)
    assert node.listdir("/var/tmp") == ["gpunode-notes.txt"]
    assert ".gpunode-tmp.Qr56St" not in node.listdir("/var/lib/gpunode")


CHANNEL_LINE = "server_input_channel_open: ctype session"  # sshd logs each channel a client opens (DEBUG1)


def test_over_ssh_the_lock_is_the_connections_and_costs_no_channel(sim_node):  # noqa: F811
    """The lock names sshd's process of the run's connection (the command channel's shell's parent): a second run
    is refused while that connection lives, takes the lock over once it is gone, and a converged install, plan
    and doctor each open ONE channel."""
    node = container_node(sim_node, sshd_log_level="DEBUG1")
    first = ssh(node)
    with first:
        lock = nodelock.acquire(first, "install driver", 0)  # the first command: its owner is resolved on the node
        owner = nodelock.holder(first).pid  # type: ignore[union-attr]
        assert owner.isdigit()
        code, _, _ = node.ssh(f"kill -0 {owner}")
        assert code == 0  # a live process on the node
        # sshd's process of this connection (the simulated node's processes are this machine's): the command
        # loop's shell runs under it
        assert Path(f"/proc/{owner}/comm").read_text().startswith("sshd")
        children = Path(f"/proc/{owner}/task/{owner}/children").read_text().split()
        assert any(b"gpunode-serve" in Path(f"/proc/{child}/cmdline").read_bytes() for child in children)
        with ssh(node) as second, pytest.raises(nodelock.NodeLocked) as caught:
            nodelock.acquire(second, "uninstall", 0)
        assert f"pid {owner} on the node" in caught.value.message
    # the connection closed without a release: its sshd process ended, so the lock is stale at once
    deadline = time.monotonic() + 10
    while node.ssh(f"kill -0 {owner}")[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    with ssh(node) as third:
        taken = nodelock.acquire(third, "install", 0)
        assert taken.stale is not None and taken.stale.pid == owner
        taken.release()
    assert not node.exists(LOCK)
    del lock

    assert install(node).exit_code == 0
    log = node.sshd_log
    for command in (["install", *node.cli_args(), "--only", "toolkit", "--only", "runtime", "--only", "nodesettings"],
                    ["plan", *node.cli_args()], ["doctor", *node.cli_args()]):
        before = open(log, errors="replace").read().count(CHANNEL_LINE)
        result = CliRunner().invoke(app, command)
        assert result.exit_code in (0, 1), result.output  # doctor: 1 when a check warns
        assert open(log, errors="replace").read().count(CHANNEL_LINE) - before == 1, command


def test_of_two_runs_taking_over_one_stale_lock_only_one_takes_it(tmp_path):
    """The takeover's mutex (LOCK_PATH.takeover): while another run is inside its takeover, a run that found the
    same stale lock reports it held and removes nothing; the mutex left by a run killed inside it expires."""
    lock = tmp_path / "run.lock"
    boot = open("/proc/sys/kernel/random/boot_id").read().strip()
    stale = f"gpunode-lock pid=999999999 boot={boot}\ncommand=gpunode install\nsince=x\nfrom=y"
    os.symlink(stale, lock)

    def take(owner: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["sh", "-c", nodelock.lock_script(), "node-lock", str(lock), f"command=gpunode {owner}",
                               str(os.getpid()), "MARK"], capture_output=True, text=True, timeout=30, check=False)
    (tmp_path / "run.lock.takeover").mkdir()  # another run is taking it over right now
    busy = take("second")
    assert busy.returncode == 75 and busy.stdout.startswith("gpunode-lock-held")
    assert os.readlink(lock) == stale  # nothing removed
    os.utime(tmp_path / "run.lock.takeover", (time.time() - 120, time.time() - 120))  # its run was killed inside
    assert take("third").returncode == 75  # this attempt clears the expired mutex ...
    again = take("third")  # ... and the next takes the stale lock over
    assert again.returncode == 0 and again.stdout.startswith("gpunode-lock-stale"), again
    assert f"pid={os.getpid()} " in os.readlink(lock) and not (tmp_path / "run.lock.takeover").exists()


def test_a_converged_install_over_ssh_sends_two_commands_the_lock_with_the_probe_and_the_release(sim_node,  # noqa: F811
                                                                                                  monkeypatch):
    """The node lock's command carries the RUN probe's first part (run once the lock is taken): a converged install
    sends the lock with the probe, then the release, and nothing else (gpunode/nodelock.py)."""
    node = container_node(sim_node)
    assert install(node).exit_code == 0  # converges the node
    sent: list[str] = []
    real = SSHConnection._exec

    def spy(self, line, stdin, timeout):  # type: ignore[no-untyped-def]
        sent.append(line)
        return real(self, line, stdin, timeout)

    monkeypatch.setattr(SSHConnection, "_exec", spy)
    result = install(node)
    assert result.exit_code == 0, result.output
    assert "changed" not in flat(result.output)
    # each line is `... sh -c 'BODY' gpunode-NAME ARGS`: the script's name follows its quoted body
    assert [re.findall(r"' (gpunode-[a-z-]+)", line)[-1] for line in sent] == ["gpunode-node-lock",
                                                                              "gpunode-node-unlock"]
    assert "@begin os_release" in sent[0] and sent[0].index("ln -s") < sent[0].index("@begin os_release")
    assert not node.exists(LOCK)


def test_where_the_connection_names_no_process_a_keeper_takes_the_lock_and_runs_the_probe(sim_node, monkeypatch):  # noqa: F811
    """A connection with no process to name (lock_owner None) keeps the lock by a keeper command on a channel of its
    own: it runs the probe once the lock is taken, prints its end marker, and removes the lock when let go."""
    node = container_node(sim_node)
    assert install(node).exit_code == 0
    monkeypatch.setattr(SSHConnection, "lock_owner", lambda self: None)
    with ssh(node) as conn:
        first = first_probe()
        with nodelock.held(conn, "install", 0, then=first.script, then_timeout=120) as lock:
            assert lock.held is not None and lock.then is not None  # a keeper, and the probe's output
            facts = gather(conn, first=(first, lock.then))
            assert facts.boot_id == node.boot_id and facts.loaded_driver is not None
            holder = nodelock.holder(conn)
            assert holder is not None and holder.pid not in ("-", "?")  # the keeper's own pid
            with ssh(node) as other, pytest.raises(nodelock.NodeLocked):
                nodelock.acquire(other, "uninstall", 0)
        deadline = time.monotonic() + 10
        while node.exists(LOCK) and time.monotonic() < deadline:
            time.sleep(0.1)
    assert not node.exists(LOCK)
