"""gpunode/nodelock.py on the test fake (a transport that cannot keep a command running: the lock without a
keeper); the node-side keeper, SIGKILL and stale pids are tested on simulated nodes in
tests/integration/test_reliability_lock.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
from typer.testing import CliRunner

from gpunode import connection, nodelock
from gpunode.cli import app
from tests.fakes.connection import FakeConnection, FakeNode


def test_a_held_lock_is_named_and_a_second_run_stops_with_exit_2():
    node = FakeNode()
    with nodelock.held(FakeConnection(node), "install driver toolkit", 0):
        assert node.node_lock is not None and "command=gpunode install driver toolkit" in node.node_lock
        with pytest.raises(nodelock.NodeLocked) as caught:
            nodelock.acquire(FakeConnection(node, name="gpu-01"), "uninstall", 0)
    assert caught.value.exit_code == 2
    message = caught.value.message
    assert message.startswith("gpu-01: another gpunode run holds the node: `gpunode install driver toolkit` since ")
    assert " from " in message and "(waited 0s for it)" in message
    assert "--lock-timeout" in (caught.value.fix or "")
    assert "sudo rm -f /var/lib/gpunode/run.lock" in (caught.value.fix or "")  # a keeper-less lock: how to clear it
    assert node.node_lock is None  # released with the block


def test_the_lock_is_released_when_the_block_fails():
    node = FakeNode()
    with pytest.raises(RuntimeError), nodelock.held(FakeConnection(node), "install", 0):
        raise RuntimeError("a bug in the run")
    assert node.node_lock is None


def test_a_lock_from_another_boot_is_stale_and_taken_over_with_a_note():
    node = FakeNode()
    nodelock.acquire(FakeConnection(node), "install everything", 0)  # never released: the run died
    node.reboot()
    notes: list[str] = []
    lock = nodelock.acquire(FakeConnection(node), "install", 0, notes.append)
    assert lock.stale is not None and lock.stale.command == "gpunode install everything"
    assert notes and notes[0].startswith("took over a stale gpunode lock (its run is gone from the node): "
                                         "`gpunode install everything` since ")
    lock.release()
    assert node.node_lock is None


def test_holder_text_parses_and_describes():
    text = ("gpunode-lock pid=4242 boot=b1\ncommand=gpunode install driver\nsince=2026-11-24T07:00:00Z\n"
            "from=ops@laptop")
    holder = nodelock.Holder.parse(text)
    assert holder == nodelock.Holder("4242", "gpunode install driver", "2026-11-24T07:00:00Z", "ops@laptop")
    assert holder.describe() == "pid 4242 on the node, `gpunode install driver` since 2026-11-24T07:00:00Z, from ops@laptop"


def test_status_says_when_a_run_holds_the_node(monkeypatch):
    node = FakeNode()
    monkeypatch.setattr(connection, "open_connection", lambda spec: FakeConnection(node, name=spec.host or "local"))
    runner = CliRunner()
    assert "holds the node lock" not in runner.invoke(app, ["status", "--host", "n"]).stdout
    nodelock.acquire(FakeConnection(node), "install driver", 0)
    shown = " ".join(runner.invoke(app, ["status", "--host", "n"]).stdout.split())
    assert "n: a gpunode run holds the node lock now: `gpunode install driver` since" in shown
    data = json.loads(runner.invoke(app, ["status", "--host", "n", "--json"]).stdout)
    assert data["lock"]["command"] == "gpunode install driver"


SHELLS = [s for s in ("dash", "bash", "busybox") if shutil.which(s)]


def _sh(shell: str) -> list[str]:
    return [shell, "sh"] if shell == "busybox" else [shell]


@pytest.mark.parametrize("shell", SHELLS)
def test_taking_the_lock_removes_the_stale_temp_files_and_runs_then_in_the_same_command(tmp_path, shell):
    # the lock's own script (run here in a real shell, on paths under tmp_path) removes what a run killed hard left
    # behind, once it holds the lock, lists it after the end marker, then runs the script it carries (the probe,
    # in a fresh shell state: no positional parameters, none of the lock's variables, stdin from /dev/null)
    work, lib = tmp_path / "var-tmp", tmp_path / "lib"
    work.mkdir()
    (work / "gpunode.abcdef").mkdir()
    (work / ".gpunode-upload.123456").write_text("part")
    (work / "someone-else.txt").write_text("")
    then = 'echo "args=$# lock=${lock-unset} me=${me-unset}"; cat; echo probed'
    argv = [*_sh(shell), "-c", nodelock.lock_script(then), "node-lock", str(lib / "run.lock"),
            "command=gpunode install", "once", "MARK", str(work), str(lib)]
    taken = subprocess.run(argv, capture_output=True, text=True, timeout=60, input="not for the probe\n")
    assert taken.returncode == 0 and taken.stdout.startswith("gpunode-lock-taken\n")
    removed, _, then_out = taken.stdout.split("gpunode-lock-end\n", 1)[1].partition("MARK begin\n")
    assert sorted(removed.splitlines()) == [f"{work}/.gpunode-upload.123456", f"{work}/gpunode.abcdef"]
    assert then_out == "args=0 lock=unset me=unset\nprobed\nMARK end\n"
    assert sorted(p.name for p in work.iterdir()) == ["someone-else.txt"] and (lib / "run.lock").is_symlink()
    # while another run holds the lock, its temp files are not stale: nothing is removed, and `then` never runs
    (work / "gpunode.ghijkl").mkdir()
    held = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert held.returncode == 75 and held.stdout.startswith("gpunode-lock-held\n")
    assert held.stdout.endswith("gpunode-lock-end\n") and (work / "gpunode.ghijkl").is_dir()
    assert "probed" not in held.stdout


@pytest.mark.parametrize("shell", SHELLS)
def test_a_keeper_runs_then_before_its_end_marker_and_removes_the_lock_when_its_input_ends(tmp_path, shell):
    lock = tmp_path / "lib" / "run.lock"
    argv = [*_sh(shell), "-c", nodelock.lock_script("echo probed"), "node-lock", str(lock), "command=gpunode install",
            "keep", "MARK", str(tmp_path)]
    keeper = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert keeper.stdout is not None
        lines = []
        while not lines or lines[-1] != "MARK end\n":
            lines.append(keeper.stdout.readline())
        assert lines[0] == "gpunode-lock-taken\n" and lines[-3:] == ["MARK begin\n", "probed\n", "MARK end\n"]
        assert lock.is_symlink() and keeper.poll() is None  # the lock is kept while the input is open
        keeper.communicate("", timeout=30)
    finally:
        if keeper.poll() is None:
            keeper.kill()
    assert keeper.returncode == 0 and not lock.is_symlink()


@pytest.mark.parametrize("shell", SHELLS)
def test_a_lock_whose_owner_did_not_expand_to_a_live_process_pid_takes_nothing(tmp_path, shell):
    # over SSH the owner is the command loop's "$PPID", expanded on the node (gpunode/connection/ssh.py _owned): an
    # empty value, 1 (the connection's process already gone) or a word left unexpanded takes no lock at all, and
    # says why on stderr; a pid does
    lock = tmp_path / "lib" / "run.lock"
    for owner in ("", "1", "gpunode.owner.0123abcd"):
        argv = [*_sh(shell), "-c", nodelock.lock_script("echo probed"), "node-lock", str(lock),
                "command=gpunode install", owner, "MARK", str(tmp_path)]
        refused = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert refused.returncode == 1 and refused.stdout == "" and not lock.is_symlink(), owner
        assert f"no process on the node to name as the lock's owner ({owner})" in refused.stderr
    argv[-3] = str(os.getpid())
    taken = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert taken.returncode == 0 and f"pid={os.getpid()} " in os.readlink(lock)
