"""The nodesettings step on fake nodes: nvidia-persistenced (a unit only where none exists, a vendor unit's
--no-persistence-mode, enable/start), the /dev/char links and their udev rule, and when it waits or skips."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gpunode import connection
from gpunode.cli import app
from gpunode.connection.base import Connection
from gpunode.facts import Facts, gather
from gpunode.options import Options
from gpunode.plan import Action, Earlier, RunCommand, Status, StepPlan, WriteFile, change, ok
from gpunode.runner import apply_pipeline, plan_pipeline
from gpunode.steps import PIPELINE
from gpunode.steps import nodesettings as ns
from gpunode.steps.base import Step
from gpunode.steps.outputs import DriverOutputs, ToolkitOutputs
from tests.fakes.connection import FakeConnection, FakeNode, FakeSystem

DRIVER = "580.95.05"
TOOLKIT = {"nvidia-container-toolkit": "1.17.8-1", "nvidia-container-toolkit-base": "1.17.8-1"}
NODES = "dev /dev/nvidia0\ndev /dev/nvidiactl\ndev /dev/nvidia-uvm\ndev /dev/nvidia-uvm-tools\n"
ENABLE_NOW = ("systemctl", "enable", "--now", "nvidia-persistenced")
LINK = ("nvidia-ctk", "system", "create-dev-char-symlinks", "--create-all")
RULE_LINE = ('ACTION=="add", DEVPATH=="/bus/pci/drivers/nvidia", '
             'RUN+="/usr/bin/nvidia-ctk system create-dev-char-symlinks --create-all"')
UBUNTU_UNIT = ("[Unit]\nDescription=NVIDIA Persistence Daemon\nWants=syslog.target\nStopWhenUnneeded=true\n\n"
               "[Service]\nType=forking\nExecStart=/usr/bin/nvidia-persistenced --user nvidia-persistenced "
               "--no-persistence-mode --verbose\nExecStopPost=/bin/rm -rf /var/run/nvidia-persistenced\n")


def make_node(driver: str | None = DRIVER, toolkit: bool = True, daemon: bool = True,
              units: dict[str, tuple[str, str]] | None = None) -> tuple[FakeNode, FakeSystem]:
    """A T4 node after the driver (.run: nvidia-smi and nvidia-persistenced, no unit) and toolkit steps; device
    nodes exist, no /dev/char links."""
    node = FakeNode(nvidia_version=driver)
    node.add_gpu(0x1EB8, "0000:00:1e.0")
    if driver:
        node.tools.add("nvidia-smi")
        node.outputs["doctor_dev_char"] = (NODES, 0)
        node.modules.add("nvidia_uvm")  # the device nodes above include /dev/nvidia-uvm
        if daemon:
            node.tools.add("nvidia-persistenced")
    system = FakeSystem(node, packages=dict(TOOLKIT) if toolkit else {}).attach()
    for name, (active, enabled) in (units or {}).items():
        system.unit(name, active, enabled)
    return node, system


def plan_of(node: FakeNode, earlier: dict[str, StepPlan] | None = None) -> StepPlan:
    return ns.plan(gather(FakeConnection(node)), Options(), Earlier(earlier or {}, ns.READS))


def run(node: FakeNode, steps: tuple[Step, ...] = (ns.STEP,)):
    return apply_pipeline(FakeConnection(node), steps, Options())


def commands(plan: StepPlan) -> list[tuple[str, ...]]:
    return [tuple(a.cmd) for a in plan.actions if isinstance(a, RunCommand)]  # type: ignore[arg-type]


def writes(plan: StepPlan) -> dict[str, WriteFile]:
    return {a.path: a for a in plan.actions if isinstance(a, WriteFile)}


def test_last_of_the_host_steps_the_k8s_step_comes_after_it():
    assert PIPELINE[-2] is ns.STEP and ns.STEP.name == "nodesettings" and PIPELINE[-1].name == "k8s"


def test_fresh_node_gets_a_unit_the_daemon_the_rule_and_the_links_and_a_rerun_changes_nothing():
    node, system = make_node()
    plan = plan_of(node)
    assert plan.status is Status.CHANGE
    assert plan.reason == ("no nvidia-persistenced.service; nothing loads nvidia_uvm at boot; no udev rule re-creates "
                           "the /dev/char links at boot; no /dev/char link for nvidia0, nvidiactl, nvidia-uvm, "
                           "nvidia-uvm-tools")
    assert [type(a).__name__ for a in plan.actions] == ["WriteFile", "RunCommand", "RunCommand", "WriteFile",
                                                        "WriteFile", "RunCommand"]
    assert writes(plan)[ns.UVM_LOAD_PATH].after.splitlines()[-1] == "nvidia-uvm"
    assert commands(plan) == [("systemctl", "daemon-reload"), ENABLE_NOW, LINK]
    unit = writes(plan)[ns.UNIT_PATH]
    assert unit.before is None and "ExecStart=/usr/bin/nvidia-persistenced --verbose\n" in unit.after
    assert "WantedBy=multi-user.target" in unit.after
    rule = writes(plan)[ns.RULE_PATH]
    assert rule.before is None and rule.after.splitlines()[-1] == RULE_LINE

    report = run(node)
    assert report.exit_code == 0 and report.outcomes[0].result == "changed", report.outcomes[0].error
    assert system.units["nvidia-persistenced.service"] == ["active", "enabled"]
    assert node.files[ns.UNIT_PATH] == unit.after and node.files[ns.RULE_PATH] == rule.after
    assert "link 195:0 /dev/nvidia0" in node.outputs["doctor_dev_char"][0]

    again = plan_of(node)
    assert again.status is Status.OK
    assert again.reason == ("nvidia-persistenced.service enabled and running; nvidia_uvm loaded and loaded at boot by "
                            f"{ns.UVM_LOAD_PATH}; /dev/char links in place, re-created at boot by {ns.RULE_PATH}")
    calls = len(node.calls)
    assert run(node).outcomes[0].result == "ok"
    assert node.changing_calls(calls) == []


def test_finished_node_is_ok_with_nothing_to_do():
    node, _ = make_node(units={"nvidia-persistenced": ("active", "enabled")})
    node.put(ns.RULE_PATH, ns.rule_text("/usr/bin/nvidia-ctk"))
    node.put(ns.UVM_LOAD_PATH, ns.UVM_LOAD_TEXT)
    node.outputs["doctor_dev_char"] = (NODES + "link 195:0 /dev/nvidia0\nlink 195:255 /dev/nvidiactl\n"
                                       "link 510:0 /dev/nvidia-uvm\nlink 510:1 /dev/nvidia-uvm-tools\n", 0)
    plan = plan_of(node)
    assert plan.status is Status.OK and plan.actions == ()


def test_a_unit_that_exists_is_never_rewritten_only_enabled_and_started():
    node, system = make_node(units={"nvidia-persistenced": ("inactive", "disabled")})
    node.put(ns.UNIT_PATH, "[Service]\nExecStart=/opt/site/nvidia-persistenced --user gpu\n[Install]\n"
                           "WantedBy=multi-user.target\n")
    user_unit = node.files[ns.UNIT_PATH]
    plan = plan_of(node)
    assert ns.UNIT_PATH not in writes(plan)
    assert commands(plan)[0] == ENABLE_NOW
    assert plan.reason.startswith("nvidia-persistenced.service is disabled and inactive")
    assert run(node).outcomes[0].result == "changed"
    assert node.files[ns.UNIT_PATH] == user_unit
    assert system.units["nvidia-persistenced.service"] == ["active", "enabled"]


@pytest.mark.parametrize("state, command", [
    (("inactive", "enabled"), ("systemctl", "start", "nvidia-persistenced")),
    (("active", "disabled"), ("systemctl", "enable", "nvidia-persistenced")),
    (("inactive", "static"), ("systemctl", "start", "nvidia-persistenced")),  # a static unit cannot be enabled
])
def test_only_what_is_missing_is_done(state, command):
    node, _ = make_node(units={"nvidia-persistenced": state})
    plan = plan_of(node)
    assert commands(plan)[0] == command
    assert run(node).outcomes[0].result == "changed"


def test_an_administrators_no_persistence_mode_is_kept():
    node, _ = make_node(units={"nvidia-persistenced": ("active", "enabled")})
    node.put(ns.UNIT_PATH, "[Service]\nExecStart=/usr/bin/nvidia-persistenced --no-persistence-mode\n")
    plan = plan_of(node)
    assert not any(c[:2] == ("systemctl", "restart") for c in commands(plan)) and ns.DROPIN_PATH not in writes(plan)
    assert any("--no-persistence-mode: persistence mode stays off" in n for n in plan.notes)


def test_a_vendor_unit_with_no_persistence_mode_gets_a_drop_in_and_a_restart():
    """Ubuntu's nvidia-compute-utils unit is static and runs the daemon with --no-persistence-mode."""
    node, system = make_node(units={"nvidia-persistenced": ("active", "static")})
    vendor = "/lib/systemd/system/nvidia-persistenced.service"
    node.put(vendor, UBUNTU_UNIT)
    plan = plan_of(node)
    assert plan.reason.startswith(f"{vendor} starts it with --no-persistence-mode")
    dropin = writes(plan)[ns.DROPIN_PATH]
    assert dropin.after.endswith("[Service]\nExecStart=\nExecStart=/usr/bin/nvidia-persistenced --user "
                                 "nvidia-persistenced --verbose\n")
    assert commands(plan)[:2] == [("systemctl", "daemon-reload"), ("systemctl", "restart", "nvidia-persistenced")]
    assert ns.UNIT_PATH not in writes(plan)
    assert run(node).outcomes[0].result == "changed"
    assert node.files[vendor] == UBUNTU_UNIT
    assert ns.exec_start(node.files) == ("/usr/bin/nvidia-persistenced --user nvidia-persistenced --verbose",
                                         ns.DROPIN_PATH)
    assert plan_of(node).reason.startswith("nvidia-persistenced.service enabled and running (static")


def test_exec_start_follows_systemds_layering():
    files = {"/usr/lib/systemd/system/nvidia-persistenced.service": "[Service]\nExecStart=/a\n",
             "/etc/systemd/system/nvidia-persistenced.service.d/10-x.conf": "[Service]\nExecStart=\n",
             "/usr/lib/systemd/system/nvidia-persistenced.service.d/20-y.conf": "[Service]\nExecStart=/b --x\n"}
    assert ns.exec_start(files) == ("/b --x", "/usr/lib/systemd/system/nvidia-persistenced.service.d/20-y.conf")
    files["/etc/systemd/system/nvidia-persistenced.service.d/20-y.conf"] = "# masks the vendor drop-in\n"
    assert ns.exec_start(files) is None
    files["/etc/systemd/system/nvidia-persistenced.service"] = "[Unit]\nExecStart=/not-a-service-key\n"
    assert ns.exec_start(files) is None


def test_a_masked_unit_is_left_alone():
    node, _ = make_node(units={"nvidia-persistenced": ("inactive", "masked")})
    plan = plan_of(node)
    assert plan.reason.startswith("nvidia-persistenced.service is masked: left alone")
    assert not any(c[0] == "systemctl" for c in commands(plan))


def test_without_the_daemon_binary_nothing_is_written_for_it():
    node, _ = make_node(daemon=False)
    plan = plan_of(node)
    assert plan.reason.startswith("nvidia-persistenced is not installed")
    assert ns.UNIT_PATH not in writes(plan) and ns.RULE_PATH in writes(plan)


def test_no_gpu_and_no_driver_skip_cleanly():
    node = FakeNode()
    assert plan_of(node) == ok(ns.NAME, "no NVIDIA GPU on this node: no persistence daemon or /dev/char links to set "
                                        "up")
    node, _ = make_node(driver=None)
    plan = plan_of(node)
    assert plan.status is Status.OK and plan.reason.startswith("no NVIDIA driver installed")


def test_waits_for_a_driver_the_driver_step_installs():
    node, _ = make_node(driver=None)
    installs = change("driver", "install 580", []).with_outputs(DriverOutputs("580.105.08", "--driver", changes=True))
    plan = plan_of(node, {"driver": installs})
    assert plan.status is Status.UNKNOWN and "decided once it is loaded" in plan.reason
    assert "580.105.08" in plan.reason


class InstallDriver(Action):
    """What the driver step's apply leaves behind on the fake node: the module loaded, its tools, device nodes."""

    kind = "test-driver"

    def apply(self, conn: Connection) -> str | None:
        node = conn.node  # type: ignore[attr-defined]
        node.nvidia_version = DRIVER
        node.tools.update({"nvidia-smi", "nvidia-persistenced"})
        node.outputs["doctor_dev_char"] = (NODES, 0)
        return None


def _driver_plan(facts: Facts, options: Options, earlier) -> StepPlan:
    if facts.loaded_driver:
        return ok("driver", f"driver {DRIVER} is loaded").with_outputs(DriverOutputs(DRIVER, "loaded"))
    return change("driver", f"install driver {DRIVER}", [InstallDriver("install the driver")]).with_outputs(
        DriverOutputs(DRIVER, "--driver", changes=True))


def test_decided_at_apply_time_once_the_driver_step_has_run():
    node, system = make_node(driver=None)
    steps = (Step("driver", "NVIDIA driver", _driver_plan), ns.STEP)  # ns.STEP declares it reads "driver"
    planned = plan_pipeline(FakeConnection(node), steps, Options())
    assert [o.plan.status for o in planned.outcomes] == [Status.CHANGE, Status.UNKNOWN]
    report = run(node, steps)
    assert [o.result for o in report.outcomes] == ["changed", "changed"], report.outcomes[1].error
    assert system.units["nvidia-persistenced.service"] == ["active", "enabled"]
    assert plan_of(node).status is Status.OK


def test_driver_installed_but_not_loaded_enables_without_starting():
    node, system = make_node(driver=None)
    node.tools.update({"nvidia-smi", "nvidia-persistenced"})
    plan = plan_of(node)
    assert commands(plan) == [("systemctl", "daemon-reload"), ("systemctl", "enable", "nvidia-persistenced")]
    assert ns.RULE_PATH in writes(plan)  # the rule links the devices when the driver binds
    assert run(node).outcomes[0].result == "changed"
    assert system.units["nvidia-persistenced.service"] == ["inactive", "enabled"]
    assert plan_of(node).status is Status.OK


def test_without_the_toolkit_there_are_no_links_to_keep():
    node, _ = make_node(toolkit=False)
    plan = plan_of(node)
    assert "no NVIDIA Container Toolkit (nvidia-ctk): no /dev/char links to keep" in plan.reason
    assert ns.RULE_PATH not in writes(plan) and LINK not in commands(plan)
    assert run(node).outcomes[0].result == "changed"
    assert plan_of(node).status is Status.OK


def test_a_toolkit_the_toolkit_step_installs_is_planned_for():
    node, _ = make_node(toolkit=False)
    toolkit = change("toolkit", "install nvidia-container-toolkit", []).with_outputs(ToolkitOutputs(True))
    plan = plan_of(node, {"toolkit": toolkit})
    assert ns.RULE_PATH in writes(plan) and LINK in commands(plan)
    assert "nvidia-ctk comes with the toolkit step (expected at /usr/bin/nvidia-ctk)" in plan.notes


def test_an_existing_rule_anywhere_in_udevs_path_is_enough():
    node, _ = make_node(units={"nvidia-persistenced": ("active", "enabled")})
    node.put("/lib/udev/rules.d/71-nvidia-dev-char.rules", RULE_LINE + "\n")
    assert ns.RULE_PATH not in writes(plan_of(node))
    node.put(ns.RULE_PATH, "# emptied by the administrator: hides the one in /lib\n")
    rule = writes(plan_of(node))[ns.RULE_PATH]
    assert rule.before == "# emptied by the administrator: hides the one in /lib\n"


def test_nvswitch_nodes_need_no_link():
    node, _ = make_node(units={"nvidia-persistenced": ("active", "enabled")})
    node.put(ns.RULE_PATH, ns.rule_text("/usr/bin/nvidia-ctk"))
    node.put(ns.UVM_LOAD_PATH, ns.UVM_LOAD_TEXT)
    node.outputs["doctor_dev_char"] = ("dev /dev/nvidia0\ndev /dev/nvidiactl\ndev /dev/nvidia-nvswitch0\n"
                                       "dev /dev/nvidia-nvswitchctl\ndev /dev/nvidia-uvm\ndev /dev/nvidia-uvm-tools\n"
                                       "link 195:0 /dev/nvidia0\nlink 195:255 /dev/nvidiactl\n"
                                       "link 511:0 /dev/nvidia-uvm\nlink 511:1 /dev/nvidia-uvm-tools\n", 0)
    assert plan_of(node).status is Status.OK


def test_dry_run_shows_the_diffs_and_the_exact_commands(monkeypatch):
    node, _ = make_node()
    monkeypatch.setattr(connection, "open_connection", lambda spec: FakeConnection(node, name="gpu-01"))
    result = CliRunner().invoke(app, ["install", "--dry-run", "--host", "gpu-01", "--only", "nodesettings", "--json"])
    assert result.exit_code == 0, result.output
    step = json.loads(result.stdout)["steps"][0]
    assert step["step"] == "nodesettings" and step["status"] == "change"
    diffs = {a["path"]: a["diff"] for a in step["actions"] if a["kind"] == "file"}
    assert diffs[ns.UNIT_PATH].startswith(f"--- /dev/null\n+++ {ns.UNIT_PATH}\n")
    assert "+ExecStart=/usr/bin/nvidia-persistenced --verbose\n" in diffs[ns.UNIT_PATH]
    assert f"+{RULE_LINE}\n" in diffs[ns.RULE_PATH]
    shown = [c for a in step["actions"] for c in a["commands"]]
    assert shown == ["systemctl daemon-reload", "systemctl enable --now nvidia-persistenced",
                     "nvidia-ctk system create-dev-char-symlinks --create-all"]  # a root login: no sudo
    human = CliRunner().invoke(app, ["plan", "--host", "gpu-01", "--only", "nodesettings"])
    assert "+ExecStart=/usr/bin/nvidia-persistenced --verbose" in human.stdout
    assert "$ systemctl enable --now nvidia-persistenced" in human.stdout
    assert ns.UNIT_PATH not in node.files and ns.RULE_PATH not in node.files and ns.UVM_LOAD_PATH not in node.files


def test_without_a_loaded_driver_the_rule_is_enough():
    node, _ = make_node(driver=None, units={"nvidia-persistenced": ("inactive", "enabled")})
    node.tools.update({"nvidia-smi", "nvidia-persistenced"})
    node.put(ns.RULE_PATH, ns.rule_text("/usr/bin/nvidia-ctk"))
    node.put(ns.UVM_LOAD_PATH, ns.UVM_LOAD_TEXT)
    plan = plan_of(node)
    assert plan.status is Status.OK
    assert plan.reason == (f"nvidia-persistenced.service enabled; nvidia_uvm loaded at boot by {ns.UVM_LOAD_PATH}; "
                           f"{ns.RULE_PATH} links the NVIDIA devices from /dev/char when the driver binds")


def test_nvidia_uvm_is_loaded_now_and_at_every_boot_and_an_existing_list_is_accepted():
    node, _ = make_node(units={"nvidia-persistenced": ("active", "enabled")})
    node.put(ns.RULE_PATH, ns.rule_text("/usr/bin/nvidia-ctk"))
    node.modules.discard("nvidia_uvm")
    node.tools.add("nvidia-modprobe")
    plan = plan_of(node)
    assert plan.status is Status.CHANGE
    assert "nothing loads nvidia_uvm at boot" in plan.reason and "nvidia_uvm is not loaded" in plan.reason
    assert ("nvidia-modprobe", "-u", "-c=0") in commands(plan)
    assert writes(plan)[ns.UVM_LOAD_PATH].before is None
    # a module list of the user's that already loads it (with _ for -, and a comment) is enough for boot
    node.put("/etc/modules", "# modules\nloop\nnvidia_uvm  # CUDA\n")
    again = plan_of(node)
    assert ns.UVM_LOAD_PATH not in writes(again) and "nothing loads nvidia_uvm at boot" not in again.reason


def test_an_upgrade_that_reloads_the_driver_is_predicted_the_one_through_a_reboot_waits():
    """The driver step's upgrade without a reboot unloads nvidia_uvm with the old modules and loads only nvidia:
    the plan predicts that this step loads nvidia_uvm again (check mode must show what the run will do); an
    upgrade that installs beside the loaded driver and reboots is decided after the reboot."""
    node, _ = make_node()
    assert [o.result for o in run(node).outcomes] == ["changed"] and plan_of(node).status is Status.OK
    reloads = change("driver", "upgrade", []).with_outputs(
        DriverOutputs("590.44.01", "--driver", changes=True, reloads=True))
    plan = plan_of(node, {"driver": reloads})
    assert plan.status is Status.CHANGE, plan.reason
    assert commands(plan) == [("modprobe", "nvidia-uvm")] or commands(plan) == [("nvidia-modprobe", "-u", "-c=0")]
    assert "nvidia_uvm is unloaded by the driver step's upgrade" in plan.reason
    # the runner's re-plan after the driver step: the new driver runs, the facts decide (here: nothing to do)
    applied = change("driver", "upgrade", []).with_outputs(DriverOutputs(DRIVER, "--driver", changes=True, reloads=True))
    assert plan_of(node, {"driver": applied}).status is Status.OK
    through_reboot = change("driver", "upgrade, then reboot", []).with_outputs(
        DriverOutputs("590.44.01", "--driver", changes=True))
    plan = plan_of(node, {"driver": through_reboot})
    assert plan.status is Status.UNKNOWN and "decided once that is loaded" in plan.reason
