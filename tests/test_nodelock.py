"""gpunode/nodelock.py on the test fake (a transport that cannot keep a command running: the lock without a
keeper); the node-side keeper, SIGKILL and stale pids are tested on simulated nodes in
tests/integration/test_reliability_lock.py."""

from __future__ import annotations

import json
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


@pytest.mark.parametrize("shell", [s for s in ("dash", "bash", "busybox") if shutil.which(s)])
def test_taking_the_lock_removes_the_stale_temp_files_in_the_same_command(tmp_path, shell):
    # the lock's own script (run here in a real shell, on paths under tmp_path) removes what a run killed hard left
    # behind, once it holds the lock, and lists it after the end marker: no round trip of its own
    work, lib = tmp_path / "var-tmp", tmp_path / "lib"
    work.mkdir()
    (work / "gpunode.abcdef").mkdir()
    (work / ".gpunode-upload.123456").write_text("part")
    (work / "someone-else.txt").write_text("")
    argv = [*([shell, "sh"] if shell == "busybox" else [shell]), "-c", nodelock._LOCK, "node-lock",
            str(lib / "run.lock"), "command=gpunode install", "once", str(work), str(lib)]
    taken = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert taken.returncode == 0 and taken.stdout.startswith("gpunode-lock-taken\n")
    removed = taken.stdout.split("gpunode-lock-end\n", 1)[1].splitlines()
    assert sorted(removed) == [f"{work}/.gpunode-upload.123456", f"{work}/gpunode.abcdef"]
    assert sorted(p.name for p in work.iterdir()) == ["someone-else.txt"] and (lib / "run.lock").is_symlink()
    # while another run holds the lock, its temp files are not stale: nothing is removed
    (work / "gpunode.ghijkl").mkdir()
    held = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert held.returncode == 75 and held.stdout.startswith("gpunode-lock-held\n")
    assert held.stdout.endswith("gpunode-lock-end\n") and (work / "gpunode.ghijkl").is_dir()
