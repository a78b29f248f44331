"""The reliability suite: `gpunode uninstall` puts files back where install wrote them. On simulated nodes (real
sshd, the node's own sh). See docs/reliability.md."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gpunode.cli import app
from tests.integration.test_reliability_faults import GOOD_DAEMON_JSON, container_node, install
from tests.nodesim.fixtures import host_guard, nodesim_available, sim_node  # noqa: F401 - pytest fixtures

pytestmark = pytest.mark.integration
MANAGED = "/etc/managed/docker-daemon.json"  # where configuration management keeps the real file


def test_uninstall_of_a_symlinked_daemon_json_restores_the_target_and_keeps_the_link(sim_node):  # noqa: F811
    node = container_node(sim_node)
    node.write(MANAGED, GOOD_DAEMON_JSON)
    node.remove("/etc/docker/daemon.json")
    node.run_local(f"mkdir -p /etc/docker && ln -s {MANAGED} /etc/docker/daemon.json")
    done = install(node)
    assert done.exit_code == 0, done.output
    assert "nvidia" in json.loads(node.read(MANAGED)).get("runtimes", {}), (node.read(MANAGED), done.output)  # through the link
    assert node.run_local("readlink /etc/docker/daemon.json")[1].strip() == MANAGED

    undone = CliRunner().invoke(app, ["uninstall", *node.cli_args()])
    assert undone.exit_code == 0, undone.output
    assert node.run_local("readlink /etc/docker/daemon.json")[1].strip() == MANAGED  # still the link
    assert node.read(MANAGED) == GOOD_DAEMON_JSON  # and its target holds the user's file again
