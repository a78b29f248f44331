"""The reliability suite: a file a later step must edit but cannot parse stops the run before the first change
(gpunode/preflight.py, `StepPlan.lasting`), not after nouveau, prerequisites, driver and toolkit changed the node.
On simulated nodes (real sshd, the node's own sh). See docs/reliability.md."""

from __future__ import annotations

import json

import pytest

from gpunode.journal import JOURNAL_PATH
from tests.integration.test_driver_nodesim import V, mirror  # noqa: F401 - pytest fixture
from tests.integration.test_reliability_faults import GOOD_DAEMON_JSON, changing_calls, flat, install
from tests.nodesim.fixtures import host_guard, nodesim_available, sim_node  # noqa: F401 - pytest fixtures

pytestmark = pytest.mark.integration
EVERY_STEP = ["--only", "nouveau", "--only", "prerequisites", "--only", "driver", "--only", "toolkit",
              "--only", "runtime"]


def test_an_invalid_daemon_json_stops_a_fresh_install_before_nouveau_is_touched(sim_node, mirror, tmp_path):  # noqa: F811
    mirror.publish(V)
    node = sim_node("ubuntu-22.04-t4", nouveau_loaded=True, engines=("docker",))
    broken = '{\n  "log-driver": "journald",\n'
    node.write("etc/docker/daemon.json", broken)
    node.clear_calls()
    result = install(node, "--driver", V, "--cache-dir", str(tmp_path / "cache"), "--reboot", steps=EVERY_STEP)
    assert result.exit_code == 1, result.output
    shown = flat(result.output)
    assert "found before any change: nothing was changed" in shown
    assert "repair /etc/docker/daemon.json by hand" in shown
    assert changing_calls(node) == []  # no blacklist, no initramfs, no packages, no installer, no reboot
    assert node.reboots == 0 and node.driver() is None and not node.exists(JOURNAL_PATH)
    assert not node.exists("/etc/modprobe.d/blacklist-nouveau.conf")
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.run"))  # nor downloaded
    assert node.read("etc/docker/daemon.json") == broken

    node.write("etc/docker/daemon.json", GOOD_DAEMON_JSON)  # repaired: the same command converges
    again = install(node, "--driver", V, "--cache-dir", str(tmp_path / "cache"), "--reboot", steps=EVERY_STEP)
    assert again.exit_code == 0, again.output
    assert json.loads(node.read("etc/docker/daemon.json"))["log-driver"] == "journald"
