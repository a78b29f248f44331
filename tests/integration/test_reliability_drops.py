"""The reliability suite: a command whose end gpunode never hears about (the connection dropped, or the command was
killed on the node) is named as such with how to go on, never "failed with exit code -1". On simulated nodes (real
sshd, the node's own sh). See docs/reliability.md."""

from __future__ import annotations

import threading

import pytest

from gpunode.cli import pipeline as cli_pipeline
from gpunode.errors import CommandError, ConnectError
from gpunode.shell import Script
from tests.integration.test_reliability_faults import (
    container_node,
    converges_then_changes_nothing,
    flat,
    install,
    ssh,
)
from tests.nodesim.fixtures import host_guard, nodesim_available, sim_node  # noqa: F401 - pytest fixtures

pytestmark = pytest.mark.integration


def test_a_connection_dropped_during_a_command_is_named_with_how_to_go_on(sim_node):  # noqa: F811
    node = sim_node("ubuntu-22.04-nogpu")
    with ssh(node) as conn:
        conn.run(["true"], check=True)
        threading.Timer(1.0, node._drop_sessions).start()
        with pytest.raises(ConnectError) as caught:
            conn.run(Script("sleep 20", (), "long"), timeout=60)
    message = caught.value.message
    assert "the SSH connection dropped while a command was running on the node" in message
    assert "exit code -1" not in message
    assert "gpunode status" in (caught.value.fix or "") and "run the same command again" in (caught.value.fix or "")


def test_a_command_killed_on_the_node_is_named_not_exit_code_minus_1(sim_node):  # noqa: F811
    node = sim_node("ubuntu-22.04-nogpu")
    with ssh(node) as conn:
        with pytest.raises(CommandError) as caught:
            conn.run(Script("kill -9 $PPID $$", (), "killed"), timeout=60)
        assert conn.run(["true"]).ok  # the connection itself is fine
    assert "ended without an exit status: it was killed on the node" in caught.value.message
    assert "exit code -1" not in caught.value.message


def test_a_drop_during_an_install_action_fails_the_step_saying_so_and_a_rerun_converges(sim_node,  # noqa: F811
                                                                                         monkeypatch):
    node = container_node(sim_node)
    node.set_apt_lock(1000)  # the package-list refresh waits on the apt lock: a long remote command

    class DropDuringRefresh(cli_pipeline.ConsoleReporter):
        def action(self, host, step, action, state, detail=""):
            super().action(host, step, action, state, detail)
            if state == "start" and action.summary.startswith("refresh the package lists"):
                threading.Timer(1.0, node._drop_sessions).start()

    monkeypatch.setattr(cli_pipeline, "ConsoleReporter", DropDuringRefresh)
    result = install(node, "--lock-timeout", "30")
    assert result.exit_code == 1, result.output
    shown = flat(result.output)
    assert "the SSH connection dropped while a command was running on the node" in shown, shown
    assert "check it with gpunode status" in shown and "then run the same command again" in shown
    assert "exit code -1" not in shown
    monkeypatch.undo()
    node.set_apt_lock(0)
    converges_then_changes_nothing(node)
