"""The reliability suite: a hung nvidia-smi (a wedged GPU) costs one short deadline, is reported as hung with the
command named, and never turns into a two-minute wait ending in "exit 143". On simulated nodes (real sshd, the
node's own sh and busybox `timeout`). See docs/reliability.md."""

from __future__ import annotations

import time

import pytest
from typer.testing import CliRunner

from gpunode.cli import app
from gpunode.facts.registry import SMI_DEADLINE
from tests.integration.test_reliability_faults import flat
from tests.nodesim.fixtures import host_guard, nodesim_available, sim_node  # noqa: F401 - pytest fixtures

pytestmark = pytest.mark.integration
cli = CliRunner()
HUNG = f"nvidia-smi --query-gpu=driver_version --format=csv,noheader did not answer within {SMI_DEADLINE}s (hung)"


def hung_node(sim_node):  # noqa: F811
    node = sim_node("ubuntu-22.04-t4", preinstalled_driver="535.129.03")
    node.write("/var/lib/nodesim/nvidia-smi.hang", "")
    return node


@pytest.mark.parametrize("command", ["doctor", "plan"])
def test_a_hung_nvidia_smi_costs_one_deadline_and_is_named(sim_node, command):  # noqa: F811
    node = hung_node(sim_node)
    node.clear_calls()
    started = time.monotonic()
    result = cli.invoke(app, [command, *node.cli_args()])
    took = time.monotonic() - started
    shown = flat(result.output)
    assert took < 4 * SMI_DEADLINE, (took, shown)  # was ~120 s: the probe's own timeout
    assert "exit 143" not in shown and "exit status 143" not in shown
    if command == "doctor":
        assert result.exit_code == 1, shown
        assert HUNG in shown, shown
    else:
        assert result.exit_code in (0, 1), shown
    # every probe waits for one nvidia-smi call at most: the later ones are skipped once one hung
    probes = max(1, len([c for c in node.calls("uname")]))
    assert len(node.calls("nvidia-smi")) <= probes, node.calls("nvidia-smi")
