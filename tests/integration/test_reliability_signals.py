"""The reliability suite: how a run ends when it is asked to stop (SIGTERM from systemd, a CI timeout or `timeout`;
Ctrl-C during the very last action), and the test run itself stopping when asked (Ctrl-C, SIGTERM) with its
simulated nodes cleaned up. See docs/reliability.md."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gpunode.cli import pipeline as cli_pipeline
from tests.integration.test_driver_nodesim import V, mirror  # noqa: F401 - pytest fixture
from tests.integration.test_driver_nodesim import install as install_driver
from tests.integration.test_reliability_faults import (
    container_node,
    converges_then_changes_nothing,
    flat,
    install,
    journal,
)
from tests.nodesim.fixtures import host_guard, nodesim_available, sim_node  # noqa: F401 - pytest fixtures

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def signal_at(sig: int, when) -> type:
    """A ConsoleReporter that sends `sig` to this process once, when an action for which `when(step, plan,
    action)` is true starts (the install's own handler takes it: the test uses `cli_owns_signals`)."""

    class Sending(cli_pipeline.ConsoleReporter):
        sent = False
        plans: dict = {}

        def planned(self, host, step, plan):
            super().planned(host, step, plan)
            Sending.plans[step.name] = plan

        def action(self, host, step, action, state, detail=""):
            super().action(host, step, action, state, detail)
            if state == "start" and not Sending.sent and when(step, Sending.plans[step.name], action):
                Sending.sent = True
                os.kill(os.getpid(), sig)

    return Sending


def temp_left(node) -> list[str]:
    return [n for n in node.listdir("/var/tmp") if n.startswith(("gpunode.", ".gpunode-"))]


@pytest.mark.usefixtures("cli_owns_signals")
def test_sigterm_during_the_driver_upload_abandons_it_cleanly_with_exit_143(sim_node, mirror, tmp_path,  # noqa: F811
                                                                            monkeypatch):
    mirror.publish(V)
    node = sim_node("ubuntu-22.04-t4", nouveau_loaded=False)
    monkeypatch.setattr(cli_pipeline, "ConsoleReporter",
                        signal_at(signal.SIGTERM, lambda step, plan, action: action.kind == "driver-install"))
    result = install_driver(node, tmp_path)
    assert result.exit_code == 143, result.output
    shown = flat(result.output)
    assert "stopped (SIGTERM): stopping at the next safe point" in shown and "install interrupted" in shown
    assert "stopped before running NVIDIA-Linux-x86_64-535.129.03.run: stopped (SIGTERM)" in shown
    assert node.driver() is None and [c for c in node.calls("nvidia-installer") if "--version" not in c] == []
    assert temp_left(node) == []  # the uploaded installer and its work directory are gone
    assert journal(node)["runs"][-1]["status"] == "interrupted"
    assert not node.exists("/var/lib/gpunode/run.lock")  # the node lock was released
    monkeypatch.undo()
    again = install_driver(node, tmp_path)
    assert again.exit_code == 0, again.output
    assert node.driver() is not None


@pytest.mark.usefixtures("cli_owns_signals")
def test_ctrl_c_during_the_last_action_ends_interrupted_never_done(sim_node, monkeypatch):  # noqa: F811
    node = container_node(sim_node)

    def last_action(step, plan, action):
        return step.name == "nodesettings" and action is [a for a in plan.actions if a.kind != "reboot"][-1]

    monkeypatch.setattr(cli_pipeline, "ConsoleReporter", signal_at(signal.SIGINT, last_action))
    result = install(node)
    assert result.exit_code == 130, result.output
    shown = flat(result.output)
    assert "install interrupted" in shown and "stopped before the end of the run: interrupted (Ctrl-C)" in shown
    assert journal(node)["runs"][-1]["status"] == "interrupted"
    monkeypatch.undo()
    converges_then_changes_nothing(node)  # every change had been made: the re-run finds nothing left to do


# -- the test run itself ------------------------------------------------------------------------------------------

INNER = '''
import time
from pathlib import Path

from typer.testing import CliRunner

from gpunode import connection
from gpunode.cli import app
from tests.fakes.connection import FakeConnection, FakeNode
from tests.nodesim.fixtures import nodesim_available, sim_node  # noqa: F401


def test_waits(sim_node, monkeypatch, tmp_path):
    node = sim_node("ubuntu-22.04-nogpu")
    Path({state!r}).write_text(f"{{node.sshd_pid}} {{node.dir}}")
    fake = FakeNode(tools={{"update-initramfs", "modprobe", "systemctl"}})
    fake.add_gpu(0x1EB8)

    def slow(node, argv, stdin):  # a long remote command, as an install runs them
        Path({state!r} + ".running").write_text("yes")
        time.sleep(60)
        return 0, "", ""

    fake.handlers["update-initramfs"] = slow
    monkeypatch.setattr(connection, "open_connection", lambda spec: FakeConnection(fake))
    result = CliRunner().invoke(app, ["install", "--host", "gpu-01"])
    assert result.exit_code != 0  # the run did not finish: the signal reached it


def test_never_reached():
    Path({state!r} + ".next").write_text("ran")
'''


# in one process, and in pytest-xdist workers as README's test command runs (the signal reaches only the
# controller, which passes it on to its workers: tests/conftest.py)
@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one-process", "xdist"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_the_test_run_stops_when_asked_and_removes_its_simulated_nodes(nodesim_available, tmp_path, sig,  # noqa: F811
                                                                     workers):
    state = tmp_path / "state"
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(INNER.format(state=str(state))))
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
                             *workers, "--rootdir", str(tmp_path), str(tmp_path / "test_inner.py")],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not Path(f"{state}.running").exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert Path(f"{state}.running").exists(), proc.communicate(timeout=30)[0].decode()
        sshd_pid, node_dir = state.read_text().split(" ", 1)
        started = time.monotonic()
        proc.send_signal(sig)
        out = proc.communicate(timeout=30)[0].decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert time.monotonic() - started < 20, out  # it did not wait for the 60 s command, nor run on
    assert not Path(f"{state}.next").exists(), out  # no further test ran
    assert proc.returncode == 2, out  # pytest's "interrupted"
    assert not Path(f"/proc/{sshd_pid}").exists(), out  # the simulated node's sshd was stopped...
    assert not Path(node_dir).exists(), out  # ...and its directory removed
