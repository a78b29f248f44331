"""The reliability suite, on simulated nodes (real sshd, the node's own sh and shims): for each fault a clear error
naming the cause and the fix, nothing lost or half-written, and once the fault is cleared a re-run converges and a
further run changes nothing. See docs/reliability.md for the list and what gpunode does about each."""

from __future__ import annotations

import json
import os
import signal

import pytest
from typer.testing import CliRunner

from gpunode import runner as gpunode_runner
from gpunode.actions import packages as package_actions
from gpunode.cli import app
from gpunode.cli import pipeline as cli_pipeline
from gpunode.connection.ssh import SSHConnection, SSHOptions
from gpunode.journal import JOURNAL_PATH
from gpunode.options import Options
from gpunode.runner import NullReporter, apply_pipeline
from gpunode.shell import Script
from gpunode.steps import PIPELINE
from tests.integration.test_driver_nodesim import V, mirror  # noqa: F401 - pytest fixture
from tests.integration.test_driver_nodesim import install as install_driver
from tests.nodesim.fixtures import host_guard, nodesim_available, sim_node  # noqa: F401 - pytest fixtures
from tests.nodesim.node import changes_systemd

pytestmark = pytest.mark.integration
cli = CliRunner()
CONTAINER_STEPS = ["--only", "toolkit", "--only", "runtime", "--only", "nodesettings"]
GOOD_DAEMON_JSON = '{\n  "log-driver": "journald"\n}\n'


@pytest.fixture(autouse=True)
def _fast_polls(monkeypatch):
    monkeypatch.setattr(gpunode_runner, "REBOOT_POLL_SECONDS", 0.2)
    monkeypatch.setattr(package_actions, "LOCK_POLL_SECONDS", 0.5)


def flat(text: str) -> str:
    return " ".join(text.split())


def container_node(sim_node, **overrides):  # noqa: F811
    """A T4 node with its driver and docker: the toolkit, runtime and node settings steps have work."""
    return sim_node("ubuntu-22.04-t4", preinstalled_driver="535.129.03", engines=("docker",), **overrides)


def install(node, *extra: str, steps=CONTAINER_STEPS):
    return cli.invoke(app, ["install", *node.cli_args(), *steps, *extra])


def converges_then_changes_nothing(node, *extra: str, steps=CONTAINER_STEPS) -> None:
    again = install(node, *extra, steps=steps)
    assert again.exit_code == 0, again.output
    node.clear_calls()
    last = install(node, *extra, steps=steps)
    assert last.exit_code == 0, last.output
    assert "changed" not in last.stdout.replace("not changed", ""), last.stdout
    assert changing_calls(node) == [], changing_calls(node)


def changing_calls(node) -> list[list[str]]:
    return [c for c in node.calls()
            if (c[0] in ("apt-get", "dnf") and any(w in c for w in ("install", "update", "remove")))
            or (c[0] == "nvidia-ctk" and ("configure" in c or "create-dev-char-symlinks" in c))
            or changes_systemd(c)
            or c[0] in ("reboot", "update-initramfs", "dracut", "udevadm")]


def installer_runs(node) -> list[list[str]]:
    return [c for c in node.calls("nvidia-installer") if "--version" not in c]


def journal(node) -> dict:
    return json.loads(node.read(JOURNAL_PATH) or '{"runs": []}')


def ssh(node) -> SSHConnection:
    return SSHConnection(f"root@127.0.0.1:{node.port}",
                         SSHOptions(identity=[str(node.key_path)], known_hosts=[str(node.known_hosts)],
                                    connect_timeout=3.0))


# -- the connection killed at a step boundary ------------------------------------------------------------------

class NodeGoesAwayBefore(NullReporter):
    """At the boundary before `step`, the node stops answering (sshd down, every session dropped)."""

    def __init__(self, node, step: str) -> None:
        self.sim, self.step, self.cut = node, step, False

    def planned(self, host, step, plan):
        if step.name == self.step and not self.cut:
            self.cut = True
            self.sim._stop_sshd()
            self.sim._drop_sessions()


@pytest.mark.parametrize("boundary", ["toolkit", "runtime", "nodesettings"])
def test_connection_killed_at_a_step_boundary_fails_that_step_and_a_rerun_converges(sim_node, boundary):  # noqa: F811
    node = container_node(sim_node)
    selected = tuple(s for s in PIPELINE if s.name in ("toolkit", "runtime", "nodesettings"))
    with ssh(node) as conn:
        report = apply_pipeline(conn, selected, Options(lock_timeout=5), NodeGoesAwayBefore(node, boundary))
    by_step = {o.step: o for o in report.outcomes}
    before = [s.name for s in selected][: [s.name for s in selected].index(boundary)]
    assert [by_step[name].result for name in before] == ["changed"] * len(before)  # done before the cut, stays done
    cut = by_step[boundary]
    assert cut.result == "failed" and "cannot connect" in (cut.error or "") and cut.fix
    assert report.exit_code == 1 and report.state == "failed"
    node._start_sshd()  # the fault cleared
    runs = journal(node)["runs"]
    if before:  # the cut run could not finish its record: the next one says so
        assert runs[-1]["status"] == "running"
    else:  # cut before the first change: nothing was recorded because nothing was changed
        assert runs == []
    again = install(node)
    assert ("was interrupted; resuming" in flat(again.output)) == bool(before)
    assert again.exit_code == 0, again.output
    node.clear_calls()
    last = install(node)
    assert last.exit_code == 0 and changing_calls(node) == []
    assert [r["status"] for r in journal(node)["runs"]] == ["interrupted", "done"] if before else ["done"]


# -- package locks -------------------------------------------------------------------------------------------

def test_apt_lock_held_during_the_toolkit_step_names_the_holder_and_a_rerun_converges(sim_node):  # noqa: F811
    node = container_node(sim_node)
    node.set_apt_lock(1000)
    result = install(node, "--lock-timeout", "2")
    assert result.exit_code == 1, result.output
    shown = flat(result.output)
    assert "the apt lock is still held after 2s: process 1717 (unattended-upgr)" in shown
    assert "fix:" in shown and "--lock-timeout" in shown
    assert "failed toolkit" in shown and "not-run runtime" in shown
    assert node.read("etc/docker/daemon.json") is None  # nothing after the failed step ran
    node.set_apt_lock(0)
    converges_then_changes_nothing(node)


def test_apt_lock_held_during_the_prerequisites_step_is_waited_for(sim_node, mirror, tmp_path):  # noqa: F811
    mirror.publish(V)
    node = sim_node("ubuntu-22.04-t4", nouveau_loaded=False)
    node.set_apt_lock(1000)
    held = install_driver(node, tmp_path, "--lock-timeout", "2")
    assert held.exit_code == 1 and "the apt lock is still held after 2s" in flat(held.output)
    assert node.driver() is None and not installer_runs(node)
    node.set_apt_lock(2)  # unattended-upgrades finishes while we wait
    waited = install_driver(node, tmp_path)
    assert waited.exit_code == 0, waited.output
    assert "waited for the package lock" in flat(waited.output) and node.driver()["version"] == V
    node.clear_calls()
    assert install_driver(node, tmp_path).exit_code == 0 and not installer_runs(node)


# -- installers ------------------------------------------------------------------------------------------------

def test_a_truncated_run_is_refused_before_any_change_and_a_good_one_converges(sim_node, mirror, tmp_path):  # noqa: F811
    path = mirror.publish(V)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])  # the mirror serves a truncated file
    node = sim_node("ubuntu-22.04-t4", nouveau_loaded=True)
    result = install_driver(node, tmp_path, "--reboot", "--reboot-timeout", "60")
    assert result.exit_code == 1, result.output
    shown = flat(result.output)
    assert "found before any change: nothing was changed" in shown and "fix:" in shown
    assert not node.exists("etc/modprobe.d/blacklist-nouveau.conf") and node.reboots == 0
    assert not (tmp_path / "cache" / V / "x86_64" / path.name).exists()  # never kept
    mirror.publish(V)  # the fault cleared
    again = install_driver(node, tmp_path, "--reboot", "--reboot-timeout", "60")
    assert again.exit_code == 0, again.output
    node.clear_calls()
    assert install_driver(node, tmp_path, "--reboot").exit_code == 0 and not installer_runs(node)


# -- engine configurations that cannot be parsed ----------------------------------------------------------------

def test_invalid_daemon_json_is_named_left_untouched_and_a_rerun_converges_once_repaired(sim_node):  # noqa: F811
    node = container_node(sim_node)
    broken = '{\n  "log-driver": "journald",\n}\n'
    node.write("etc/docker/daemon.json", broken)
    result = install(node)
    assert result.exit_code == 1, result.output
    shown = flat(result.output)
    assert "/etc/docker/daemon.json" in shown and "repair /etc/docker/daemon.json by hand" in shown
    assert node.read("etc/docker/daemon.json") == broken  # not rewritten, not half-written
    assert [c for c in node.calls("systemctl") if c[1:2] == ["restart"]] == []
    node.write("etc/docker/daemon.json", GOOD_DAEMON_JSON)
    converges_then_changes_nothing(node)
    assert json.loads(node.read("etc/docker/daemon.json"))["log-driver"] == "journald"


def test_unparseable_containerd_config_is_named_left_untouched_and_a_rerun_converges(sim_node):  # noqa: F811
    node = sim_node("ubuntu-22.04-t4", preinstalled_driver="535.129.03", engines=("containerd",))
    good = node.read("etc/containerd/config.toml") or 'version = 2\n'
    broken = good + '\n[plugins."io.containerd.grpc.v1.cri"\n'
    node.write("etc/containerd/config.toml", broken)
    result = install(node)
    assert result.exit_code == 1, result.output
    shown = flat(result.output)
    assert "/etc/containerd/config.toml" in shown and "repair /etc/containerd/config.toml by hand" in shown
    assert node.read("etc/containerd/config.toml") == broken
    node.write("etc/containerd/config.toml", good)
    converges_then_changes_nothing(node)


# -- a reboot that never comes back ---------------------------------------------------------------------------

def test_a_reboot_that_never_comes_back_times_out_with_the_fix_and_a_rerun_converges(sim_node, monkeypatch):  # noqa: F811
    node = sim_node("ubuntu-22.04-t4", nouveau_loaded=True)
    monkeypatch.setattr(gpunode_runner, "_REBOOT", Script('(sleep 1; poweroff) >/dev/null 2>&1 </dev/null &',
                                                          name="reboot"))  # the node powers off instead
    steps = ["--only", "nouveau"]
    result = install(node, "--reboot", "--reboot-timeout", "5", steps=steps)
    assert result.exit_code == 1, result.output
    shown = flat(result.output)
    assert "did not come back with a new boot id within 5s" in shown and "raise --reboot-timeout" in shown
    assert "Traceback" not in result.output
    node.power_on()  # the fault cleared: someone powers the node on
    record = journal(node)
    assert record["pending"][0]["effect"] == "reboot"  # the owed reboot was recorded before it was started
    monkeypatch.undo()
    converges_then_changes_nothing(node, "--reboot", "--reboot-timeout", "60", steps=steps)
    assert journal(node)["pending"] == []  # the boot since then settled it
    assert not node.is_loaded("nouveau")


# -- Ctrl-C on one node -------------------------------------------------------------------------------------------

def ctrl_c_at(first_action: str, times: int):
    """A ConsoleReporter that presses Ctrl-C `times` times when an action whose summary starts with
    `first_action` starts (SIGINT to this process: the install's own handler takes it)."""

    class Pressing(cli_pipeline.ConsoleReporter):
        pressed = False

        def action(self, host, step, action, state, detail=""):
            super().action(host, step, action, state, detail)
            if state == "start" and action.summary.startswith(first_action) and not Pressing.pressed:
                Pressing.pressed = True
                for _ in range(times):
                    os.kill(os.getpid(), signal.SIGINT)

    return Pressing


@pytest.mark.usefixtures("cli_owns_signals")  # gpunode's own handler (tests/conftest.py)
def test_one_ctrl_c_finishes_the_running_action_then_stops_and_a_rerun_converges(sim_node, monkeypatch):  # noqa: F811
    node = container_node(sim_node)
    monkeypatch.setattr(cli_pipeline, "ConsoleReporter", ctrl_c_at("add the nvidia runtime", 1))
    result = install(node)
    assert result.exit_code == 130, result.output
    shown = flat(result.output)
    assert "stopping at the next safe point" in shown and "install interrupted" in shown
    assert "interrupted runtime: stopped before runtime: restart docker" in shown
    assert "nvidia" in node.read("etc/docker/daemon.json")  # the running action finished...
    assert [c for c in node.calls("systemctl") if c[1:2] == ["restart"]] == []  # ...and nothing after it started
    record = journal(node)
    assert record["runs"][-1]["status"] == "interrupted"
    assert [p["target"] for p in record["pending"]] == ["docker.service"]  # the restart it still owes
    monkeypatch.undo()
    converges_then_changes_nothing(node)
    assert journal(node)["pending"] == []


@pytest.mark.usefixtures("cli_owns_signals")  # gpunode's own handler (tests/conftest.py)
def test_two_ctrl_c_stop_at_once_and_the_journal_says_interrupted(sim_node, monkeypatch):  # noqa: F811
    node = container_node(sim_node)
    monkeypatch.setattr(cli_pipeline, "ConsoleReporter", ctrl_c_at("add the nvidia runtime", 2))
    result = install(node)
    assert result.exit_code == 130, result.output
    assert "aborted (Ctrl-C twice)" in flat(result.output) and "Traceback" not in result.output
    assert journal(node)["runs"][-1]["status"] == "interrupted"
    monkeypatch.undo()
    converges_then_changes_nothing(node)
