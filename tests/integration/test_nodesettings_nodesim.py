"""The nodesettings step end to end against node-simulator nodes: nvidia-persistenced and the /dev/char links,
checked by what the node then reports (nvidia-smi, the doctor) before and after a reboot, and a second install that
changes nothing."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gpunode.cli import app
from gpunode.steps import nodesettings as ns
from tests.nodesim import SimNode
from tests.nodesim.fixtures import host_guard, nodesim_available, sim_node  # noqa: F401 - pytest fixtures
from tests.nodesim.node import changes_systemd

pytestmark = pytest.mark.integration

V = "580.95.05"
cli = CliRunner()
ONLY = ["--only", "nodesettings"]
RULE = ('ACTION=="add", DEVPATH=="/bus/pci/drivers/nvidia", '
        'RUN+="/usr/bin/nvidia-ctk system create-dev-char-symlinks --create-all"')
# Ubuntu's nvidia-compute-utils: a static unit that runs the daemon with --no-persistence-mode, started by a udev
# rule when the nvidia module loads
UBUNTU_UNIT = ("[Unit]\nDescription=NVIDIA Persistence Daemon\nWants=syslog.target\nStopWhenUnneeded=true\n\n"
               "[Service]\nType=forking\nExecStart=/usr/bin/nvidia-persistenced --user nvidia-persistenced "
               "--no-persistence-mode --verbose\nExecStopPost=/bin/rm -rf /var/run/nvidia-persistenced\n")
UBUNTU_RULES = ('ACTION=="add" DEVPATH=="/module/nvidia" SUBSYSTEM=="module" '
                'RUN+="/bin/systemctl start --no-block nvidia-persistenced.service"\n'
                'ACTION=="remove" DEVPATH=="/module/nvidia" SUBSYSTEM=="module" '
                'RUN+="/bin/systemctl stop --no-block nvidia-persistenced"\n')


def steps_of(result) -> dict[str, dict]:
    assert result.exit_code == 0, result.output
    return {s["step"]: s for s in json.loads(result.stdout)["steps"]}


def install(node: SimNode, *extra: str) -> dict[str, dict]:
    return steps_of(cli.invoke(app, ["install", *node.cli_args(), *ONLY, "--json", *extra]))


def doctor(node: SimNode) -> dict[str, dict]:
    result = cli.invoke(app, ["doctor", *node.cli_args(), "--json"])
    return {c["id"]: c for c in json.loads(result.stdout)["checks"]}


def persistence(node: SimNode) -> str:
    rc, out, err = node.ssh("nvidia-smi --query-gpu=persistence_mode --format=csv,noheader")
    assert rc == 0, out + err
    return out.strip()


def changes(node: SimNode) -> list[list[str]]:
    return [c for c in node.calls() if changes_systemd(c) or c[0] == "nvidia-ctk"
            and "create-dev-char-symlinks" in c]


def test_run_driver_node_gets_the_daemon_and_the_links_which_survive_a_reboot(sim_node):  # noqa: F811
    node = sim_node("ubuntu-22.04-t4", nouveau_loaded=False, preinstalled_driver=V, toolkit_version="1.17.8-1")
    checks = doctor(node)
    assert checks["driver.persistence"]["status"] == "warn"
    assert checks["container.dev-char-symlinks"]["status"] == "warn"

    planned = steps_of(cli.invoke(app, ["plan", *node.cli_args(), *ONLY, "--json"]))["nodesettings"]
    assert planned["status"] == "change"
    assert [c for a in planned["actions"] for c in a["commands"]] == [
        "systemctl daemon-reload", "systemctl enable --now nvidia-persistenced",
        "nvidia-ctk system create-dev-char-symlinks --create-all"]
    assert not node.exists(ns.UNIT_PATH)  # a plan changes nothing

    node.clear_calls()
    done = install(node)["nodesettings"]
    assert done["result"] == "changed", done
    assert changes(node) == [["systemctl", "daemon-reload"], ["systemctl", "enable", "--now", "nvidia-persistenced"],
                             ["nvidia-ctk", "system", "create-dev-char-symlinks", "--create-all"]]
    assert node.unit("nvidia-persistenced") == {"active": "active", "enabled": "enabled"}
    assert node.read(ns.UNIT_PATH) == ns.unit_text("/usr/bin/nvidia-persistenced")
    assert node.read(ns.RULE_PATH).splitlines()[-1] == RULE
    assert persistence(node) == "Enabled"
    assert node.read(ns.UVM_LOAD_PATH).splitlines()[-1] == "nvidia-uvm"
    assert sorted(node.listdir("/dev/char")) == ["195:0", "195:254", "195:255", "510:0", "510:1"]
    checks = doctor(node)
    assert checks["driver.persistence"]["status"] == "pass"
    assert checks["driver.persistence"]["evidence"] == "persistence mode enabled on all 1 GPU(s) (nvidia-persistenced)"
    assert checks["container.dev-char-symlinks"]["status"] == "pass"

    node.clear_calls()
    again = install(node)["nodesettings"]
    assert again["status"] == "ok" and again["reason"] == (
        f"nvidia-persistenced.service enabled and running; nvidia_uvm loaded and loaded at boot by "
        f"{ns.UVM_LOAD_PATH}; /dev/char links in place, re-created at boot by {ns.RULE_PATH}")
    assert changes(node) == []

    node.reboot()  # a fresh /dev: the udev rule links the devices when the driver binds; the daemon starts
    assert persistence(node) == "Enabled"
    assert node.listdir("/dev/char")
    checks = doctor(node)
    assert (checks["driver.persistence"]["status"], checks["container.dev-char-symlinks"]["status"]) == ("pass",
                                                                                                          "pass")
    node.clear_calls()
    assert install(node)["nodesettings"]["status"] == "ok"
    assert changes(node) == []


def test_without_the_udev_rule_the_links_are_gone_after_a_reboot(sim_node):  # noqa: F811
    """Why the rule is there: the links the command makes live in /dev, which every boot starts afresh."""
    node = sim_node("ubuntu-22.04-t4", nouveau_loaded=False, preinstalled_driver=V, toolkit_version="1.17.8-1")
    install(node)
    node.remove(ns.RULE_PATH)
    node.reboot()
    assert doctor(node)["container.dev-char-symlinks"]["status"] == "warn"
    redo = install(node)["nodesettings"]
    assert redo["reason"].startswith(f"nvidia-persistenced.service enabled and running; nvidia_uvm loaded and loaded at "
                                     f"boot by {ns.UVM_LOAD_PATH}; no udev rule re-creates")
    assert doctor(node)["container.dev-char-symlinks"]["status"] == "pass"


def test_a_vendor_unit_without_persistence_mode_gets_a_drop_in(sim_node):  # noqa: F811
    node = sim_node("ubuntu-22.04-t4", nouveau_loaded=False, preinstalled_driver=V, toolkit_version="1.17.8-1")
    node.write("/lib/systemd/system/nvidia-persistenced.service", UBUNTU_UNIT)
    node.write("/lib/udev/rules.d/71-nvidia.rules", UBUNTU_RULES)
    node.reboot()
    assert node.unit("nvidia-persistenced") == {"active": "active", "enabled": "static"}  # started by udev
    assert persistence(node) == "Disabled"
    assert doctor(node)["driver.persistence"]["status"] == "warn"

    node.clear_calls()
    done = install(node)["nodesettings"]
    # /lib is /usr/lib on a merged-/usr system: the probe finds the file under both names
    assert done["reason"].startswith("/usr/lib/systemd/system/nvidia-persistenced.service starts it with "
                                     "--no-persistence-mode")
    assert changes(node)[:2] == [["systemctl", "daemon-reload"], ["systemctl", "restart", "nvidia-persistenced"]]
    assert node.read("/lib/systemd/system/nvidia-persistenced.service") == UBUNTU_UNIT  # the vendor's file stays
    assert not node.exists(ns.UNIT_PATH)
    assert "ExecStart=/usr/bin/nvidia-persistenced --user nvidia-persistenced --verbose" in node.read(ns.DROPIN_PATH)
    assert persistence(node) == "Enabled"

    node.reboot()
    assert persistence(node) == "Enabled"
    assert doctor(node)["driver.persistence"]["status"] == "pass"
    node.clear_calls()
    assert install(node)["nodesettings"]["status"] == "ok"
    assert changes(node) == []


def test_nodes_without_a_driver_or_a_toolkit_skip_cleanly(sim_node):  # noqa: F811
    bare = sim_node("debian-12-t4", nouveau_loaded=False)
    step = install(bare)["nodesettings"]
    assert step["status"] == "ok" and step["reason"].startswith("no NVIDIA driver installed")
    assert bare.unit("nvidia-persistenced") is None and not bare.exists(ns.RULE_PATH)

    no_toolkit = sim_node("rocky-9-t4", nouveau_loaded=False, preinstalled_driver=V)
    step = install(no_toolkit)["nodesettings"]
    assert step["result"] == "changed"
    assert "no NVIDIA Container Toolkit (nvidia-ctk): no /dev/char links to keep" in step["reason"]
    assert not no_toolkit.exists(ns.RULE_PATH)
    assert persistence(no_toolkit) == "Enabled"
