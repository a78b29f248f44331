"""The fabric manager step on fake nodes: detection, exact version pinning per branch and distro, hold, start,
fabric state, and a later driver/fabric-manager mismatch."""

from __future__ import annotations

import pytest

from gpunode import driver_packages as routes
from gpunode import fabric_packages
from gpunode.actions import fabric as fabric_actions
from gpunode.actions.base import Action
from gpunode.actions.fabric import StartFabricManager
from gpunode.actions.packages import PackageCommand
from gpunode.facts import gather
from gpunode.options import Options
from gpunode.plan import Earlier, Status, StepPlan, change, ok
from gpunode.runner import apply_pipeline
from gpunode.shell import to_argv
from gpunode.steps import fabricmanager as fm
from gpunode.steps.base import Step
from gpunode.steps.outputs import DriverOutputs
from tests.conftest import FIXTURES
from tests.fakes.connection import ROCKY_9, FakeConnection, FakeNode, FakeSystem

SWITCHES = ("0000:83:00.0", "0000:84:00.0", "0000:85:00.0", "0000:86:00.0")


@pytest.fixture(autouse=True)
def _no_waiting(monkeypatch):
    monkeypatch.setattr(fabric_actions, "POLL_SECONDS", 0.0)


CUDA_LIST = ("/etc/apt/sources.list.d/cuda-ubuntu2204-x86_64.list",
             "deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] "
             "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/x86_64/ /\n")


def hgx(driver="535.129.03", os_release=None, packages=None, bound=True, cuda=True):
    """8x H100 SXM with 4 NVSwitch (10de:22a3, class 0x0680); `driver` loaded (None: not yet); NVIDIA's CUDA
    repository configured unless cuda=False."""
    node = FakeNode(nvidia_version=driver, **({"os_release": os_release} if os_release else {}))
    if cuda and not os_release:
        node.files[CUDA_LIST[0]] = CUDA_LIST[1]
    elif cuda:
        node.files["/etc/yum.repos.d/cuda-rhel9.repo"] = (
            "[cuda-rhel9-x86_64]\nbaseurl=https://developer.download.nvidia.com/compute/cuda/repos/rhel9/x86_64\n")
    for i in range(8):
        node.add_gpu(0x2330, f"0000:{0x18 + i:02x}:00.0")
    for address in SWITCHES:
        node.pci.append((address, 0x10DE, 0x22A3, 0x068000))
    if driver and bound:
        node.outputs["nvswitch_devices"] = ("".join(a + "\n" for a in SWITCHES), 0)
    system = FakeSystem(node, packages=dict(packages or {})).attach()
    return node, system


def plan_of(node, earlier=None, **options):
    return fm.plan(gather(FakeConnection(node)), Options(**options), Earlier(earlier or {}, fm.READS))


def argv(action: Action) -> tuple[str, ...]:
    """The (last) command line of a command or package action, as argv."""
    assert isinstance(action, PackageCommand), action
    return to_argv(action.cmds[-1])


def run(node, steps=(fm.STEP,), **options):
    return apply_pipeline(FakeConnection(node), steps, Options(**options))


def test_hgx_h100_gets_fabric_manager_pinned_held_and_running():
    node, system = hgx()
    plan = plan_of(node)
    assert plan.status is Status.CHANGE
    assert plan.reason == "4 NVSwitch: nvidia-fabricmanager-535 is not installed"
    update, install, hold, start = plan.actions
    assert argv(update) == ("apt-get", "update")  # the version is not in the local lists yet
    assert argv(install) == ("apt-get", "install", "-y", "--no-install-recommends", "--allow-downgrades",
                           "nvidia-fabricmanager-535=535.129.03-1")
    assert argv(hold) == ("apt-mark", "hold", "nvidia-fabricmanager-535")
    assert isinstance(start, StartFabricManager)
    assert all(a.lock_timeout == 600 for a in (update, install, hold))  # every package call waits for the lock
    assert "driver version 535.129.03 from the loaded driver" in plan.notes
    report = run(node)
    assert report.outcomes[0].result == "changed", report.outcomes[0].error
    assert system.packages["nvidia-fabricmanager-535"] == "535.129.03-1"
    assert "nvidia-fabricmanager-535" in system.held
    assert system.units["nvidia-fabricmanager.service"] == ["active", "enabled"]
    again = plan_of(node)
    assert again.status is Status.OK
    assert again.reason == "4 NVSwitch: nvidia-fabricmanager-535 535.129.03-1 held, running, fabric Completed"
    calls = len(node.calls)
    assert run(node).outcomes[0].result == "ok"
    assert node.changing_calls(calls) == []


def test_from_r580_the_package_has_no_branch_suffix():
    node, _ = hgx("580.65.06")
    assert argv(plan_of(node).actions[1])[-1] == "nvidia-fabricmanager=580.65.06-1"
    assert fabric_packages.package_name(580, "rpm") == "nvidia-fabricmanager"
    assert fabric_packages.package_name(570, "rpm") == "nvidia-fabric-manager"
    assert fabric_packages.package_name(570, "deb") == "nvidia-fabricmanager-570"


def test_rocky_pins_with_dnf_and_versionlock():
    node, system = hgx(os_release=ROCKY_9)
    node.tools.add("dnf")
    plan = plan_of(node)
    install, plugin, lock, _ = plan.actions
    assert argv(install) == ("dnf", "install", "-y", "nvidia-fabric-manager-535.129.03-1")
    assert isinstance(plugin, PackageCommand) and plugin.packages == ("python3-dnf-plugin-versionlock",)
    assert argv(lock) == ("dnf", "versionlock", "add", "nvidia-fabric-manager-535.129.03-1")
    system.versions["python3-dnf-plugin-versionlock"] = "4.3.0-13.el9"
    assert run(node).outcomes[0].result == "changed"
    assert "nvidia-fabric-manager-0:535.129.03-1.*" in node.files["/etc/dnf/plugins/versionlock.list"]
    assert plan_of(node).status is Status.OK


def test_before_the_driver_loads_it_is_installed_and_enabled_and_starts_after_the_reboot():
    node, system = hgx(driver=None)
    assert plan_of(node).status is Status.UNKNOWN
    assert "driver version is not known yet" in plan_of(node).reason
    plan = plan_of(node, driver="550.90.07")
    assert [a.summary for a in plan.actions][-1] == "enable nvidia-fabricmanager (it starts with driver 550.90.07)"
    assert not any(isinstance(a, StartFabricManager) for a in plan.actions)
    assert run(node, driver="550.90.07").outcomes[0].result == "changed"
    assert system.units["nvidia-fabricmanager.service"] == ["inactive", "enabled"]
    after = plan_of(node, driver="550.90.07")
    assert after.status is Status.OK and any("starts once it is (after the reboot)" in n for n in after.notes)


def test_the_driver_steps_outputs_give_the_version():
    node, _ = hgx(driver=None)
    installs = change("driver", "driver 535.129.03 is installed; 550.54.15 was requested: upgrading", []
                      ).with_outputs(DriverOutputs("550.54.15", "--driver-run", changes=True))
    plan = plan_of(node, {"driver": installs})
    assert argv(plan.actions[1])[-1] == "nvidia-fabricmanager-550=550.54.15-1"  # not the 535 the reason names first
    assert "driver version 550.54.15 from the driver step" in plan.notes
    # with the driver step in the run, its outputs win over --driver (the step already took --driver into account)
    assert argv(plan_of(node, {"driver": installs}, driver="535.129.03").actions[1])[-1].endswith("550.54.15-1")
    # without it, --driver decides
    assert argv(plan_of(node, driver="535.129.03").actions[1])[-1].endswith("535.129.03-1")
    unknown_version = StepPlan("driver", Status.BLOCKED, "cannot tell", outputs=DriverOutputs(None))
    assert plan_of(node, {"driver": unknown_version}).status is Status.UNKNOWN


def test_a_later_driver_update_makes_it_plan_the_matching_fabric_manager():
    node, system = hgx()
    run(node)
    node.nvidia_version = "535.183.01"  # the driver moved on (reboot into a newer driver)
    system.sync()
    plan = plan_of(node)
    assert plan.reason == "4 NVSwitch: nvidia-fabricmanager-535 535.129.03-1 does not match driver 535.183.01"
    assert [a.summary for a in plan.actions[:4]] == [
        "release the hold on nvidia-fabricmanager-535",
        "refresh the package lists",
        "install nvidia-fabricmanager-535 535.183.01-1, pinned to the driver version",
        "hold nvidia-fabricmanager-535 so upgrades cannot separate it from the driver"]
    assert run(node).outcomes[0].result == "changed"
    assert system.packages["nvidia-fabricmanager-535"] == "535.183.01-1" and "nvidia-fabricmanager-535" in system.held
    assert plan_of(node).status is Status.OK


def test_another_branch_is_removed_first():
    node, system = hgx("550.90.07", packages={"nvidia-fabricmanager-535": "535.129.03-1"})
    system.held.add("nvidia-fabricmanager-535")
    system.sync()
    summaries = [a.summary for a in plan_of(node).actions]
    assert summaries[:4] == ["release the hold on nvidia-fabricmanager-535",
                             "remove nvidia-fabricmanager-535 (another fabric manager branch)",
                             "refresh the package lists",
                             "install nvidia-fabricmanager-550 550.90.07-1, pinned to the driver version"]
    assert run(node).outcomes[0].result == "changed"
    assert "nvidia-fabricmanager-535" not in system.packages


def test_a_failed_service_with_the_right_version_is_restarted_and_its_log_shown():
    node, system = hgx(packages={"nvidia-fabricmanager-535": "535.129.03-1"})
    system.held.add("nvidia-fabricmanager-535")
    system.unit(fm.UNIT, "failed", "enabled")
    log = (FIXTURES / "errors" / "nvidia-fabricmanager_log_multicast-team.log").read_text()  # a real log
    node.outputs["fabricmanager_log"] = ("\n".join(log.splitlines()[-5:]) + "\n", 0)  # what `tail -n 5` shows
    plan = plan_of(node)
    assert plan.reason == "4 NVSwitch: nvidia-fabricmanager.service is failed"
    assert [type(a).__name__ for a in plan.actions] == ["StartFabricManager"]
    assert ("/var/log/fabricmanager.log: [Feb 27 2025 15:10:02] [ERROR] [tid 12727] detected NVSwitch non-fatal "
            "error 12028 on fid 0 on NVSwitch pci bus id 00000000:86:00.0 physical id 3 port 61") in plan.notes


def test_fabric_not_ready_under_a_running_service_plans_a_restart():
    node, system = hgx(packages={"nvidia-fabricmanager-535": "535.129.03-1"})
    system.held.add("nvidia-fabricmanager-535")
    system.unit(fm.UNIT, "active", "enabled")
    node.handlers["fabric-state"] = system._handle
    node.outputs["fabric_state"] = ("GPU 00000000:18:00.0\n    Fabric\n        State : Not Started\n"
                                    "        Status : N/A\n", 0)
    original = system.sync
    system.sync = lambda: None  # freeze the broken fabric for the plan
    plan = plan_of(node)
    assert plan.reason == "4 NVSwitch: fabric not ready: GPU 00000000:18:00.0 Not Started/N/A"
    system.sync = original


def test_a_start_that_fails_brings_the_log_along():
    node, system = hgx(packages={"nvidia-fabricmanager-535": "535.104.05-1"})
    system.unit(fm.UNIT, "inactive", "disabled")
    # the install "succeeds" but leaves the old version: the start must fail with the real log line
    node.handlers["apt-get"] = lambda n, argv, stdin: (0, "", "")
    report = run(node)
    assert report.outcomes[0].result == "failed"
    assert "driver interface version 535.129.03 don't match with driver version 535.104.05" in report.outcomes[0].error


def test_masked_service_is_blocked():
    node, system = hgx(packages={"nvidia-fabricmanager-535": "535.129.03-1"})
    system.unit(fm.UNIT, "inactive", "masked")
    plan = plan_of(node)
    assert plan.status is Status.BLOCKED and "unmask" in plan.fix


def test_a_t4_node_skips():
    node = FakeNode(nvidia_version="535.129.03")
    node.add_gpu(0x1EB8)
    FakeSystem(node).attach()
    plan = plan_of(node)
    assert plan.status is Status.OK and plan.reason.startswith("no NVSwitch on this node")


def test_installed_but_useless_fabric_manager_is_mentioned():
    node = FakeNode()
    node.add_gpu(0x20B5)
    FakeSystem(node, packages={"nvidia-fabricmanager-535": "535.129.03-1"}).attach()
    assert any("nothing to manage here" in n for n in plan_of(node).notes)


def test_gb200_style_off_host_fabric_skips():
    node = FakeNode(nvidia_version="570.133.20", arch="aarch64")
    for i in range(4):
        node.add_gpu(0x2941, f"0000:{i:02x}:00.0")
    FakeSystem(node).attach()
    node.outputs["fabric_state"] = ("GPU 00000008:01:00.0\n    Fabric\n        State : Completed\n"
                                    "        Status : Success\n        CliqueId : 32766\n"
                                    "        ClusterUUID : 3a4f8b4e-6b4c-4b0e-9e2a-1f3c2d4e5f60\n", 0)
    plan = plan_of(node)
    assert plan.status is Status.OK and "managed off this host" in plan.reason


def test_nvlink5_switch_trays_are_blocked_with_an_explanation():
    node = FakeNode(nvidia_version="570.133.20")
    node.add_gpu(0x2901)
    FakeSystem(node).attach()
    node.outputs["nvlink5_switches"] = ("/sys/class/infiniband/mlx5_4/device/vpd\n", 0)
    plan = plan_of(node)
    assert plan.status is Status.BLOCKED and "NVLSM" in plan.reason


def test_after_the_driver_loads_bound_switches_count_even_without_pci_class():
    node = FakeNode(nvidia_version="535.129.03")
    node.add_gpu(0x20B2)
    FakeSystem(node).attach()
    node.outputs["nvswitch_devices"] = ("0000:05:00.0\n", 0)
    assert plan_of(node).reason == "1 NVSwitch: nvidia-fabricmanager-535 is not installed"


def test_in_a_pipeline_the_loaded_driver_is_used_when_the_driver_step_is_ok():
    node, _ = hgx()
    driver_ok = Step("driver", "Driver", lambda f, o, e: ok("driver", "nothing requested"))
    report = run(node, steps=(driver_ok, fm.STEP))
    assert [o.result for o in report.outcomes] == ["ok", "changed"]


POLICY = """nvidia-fabricmanager-535:
  Installed: (none)
  Candidate: 535.183.01-1
  Version table:
     535.183.01-1 600
        600 https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/x86_64  Packages
     535.129.03-0ubuntu0.22.04.2 500
        500 http://archive.ubuntu.com/ubuntu jammy-updates/multiverse amd64 Packages
 *** 535.104.05-1 100
        100 /var/lib/dpkg/status
"""


def test_the_exact_version_the_repositories_offer_is_pinned():
    node, _ = hgx(cuda=False)  # a driver from Ubuntu's archive: its fabric manager is there too
    node.outputs["fm_available"] = (POLICY, 0)
    (install, *_) = plan_of(node).actions
    assert argv(install)[-1] == "nvidia-fabricmanager-535=535.129.03-0ubuntu0.22.04.2"
    assert fm.pick_version(["535.129.03-0ubuntu1", "535.129.03-1"], "535.129.03") == "535.129.03-1"


def test_without_the_cuda_repository_it_is_added_first():
    node, system = hgx(cuda=False)
    plan = plan_of(node)
    keyring = plan.actions[0]
    assert isinstance(keyring, PackageCommand) and keyring.cmds[0].args == (  # type: ignore[union-attr]
        "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/x86_64/cuda-keyring_1.1-1_all.deb",)
    assert run(node).outcomes[0].result == "changed"
    assert system.packages["cuda-keyring"] == "1.1-1" and plan_of(node).status is Status.OK
    rocky, _ = hgx(os_release=ROCKY_9, cuda=False)
    assert argv(plan_of(rocky).actions[0]) == (
        "dnf", "config-manager", "--add-repo",
        "https://developer.download.nvidia.com/compute/cuda/repos/rhel9/x86_64/cuda-rhel9.repo")
    assert routes.cuda_repo_dir("ubuntu", "23.10", "debian") is None
    odd, _ = hgx(os_release='ID=ubuntu\nVERSION_ID="23.10"\nPRETTY_NAME="Ubuntu 23.10"\n', cuda=False)
    assert plan_of(odd).status is Status.BLOCKED and "no build for Ubuntu 23.10" in plan_of(odd).reason


def node_from_lspci(name: str) -> FakeNode:
    """A node whose NVIDIA PCI functions are those of a real lspci capture (-nn or -vvv form)."""
    import re

    node = FakeNode(nvidia_version="535.129.03")
    for line in (FIXTURES / "lspci" / name).read_text().splitlines():
        nn = re.match(r"^(\S+) .*\[(\w{4})\]: NVIDIA .*\[10de:(\w{4})\]", line)
        vvv = re.match(r"^(\S+) (3D controller|Bridge): NVIDIA Corporation Device (\w{4})", line)
        if nn:
            node.pci.append((nn[1], 0x10DE, int(nn[3], 16), int(nn[2], 16) << 8))
        elif vvv:
            node.pci.append((vvv[1], 0x10DE, int(vvv[3], 16), 0x030200 if vvv[2] == "3D controller" else 0x068000))
    FakeSystem(node).attach()
    return node


@pytest.mark.parametrize("capture, expected", [
    ("azure-nd-a100-v4_8x-a100-sxm4-80gb_6x-nvswitch_lspci-nn.txt", "6 NVSwitch: nvidia-fabricmanager-535 is not installed"),
    ("hgx-h100-8gpu_4x-nvswitch-22a3_cx7_lspci-vvv_unresolved-names.txt",
     "4 NVSwitch: nvidia-fabricmanager-535 is not installed"),
    ("qemu-vm_1x-a10_lspci-nn.txt", "no NVSwitch on this node (PCIe or directly linked GPUs): fabric manager is not needed"),
])
def test_nvswitch_detection_on_real_lspci_captures(capture, expected):
    node = node_from_lspci(capture)
    assert node.pci and plan_of(node).reason == expected


def test_versionlocks_reported_by_the_plugin_count_as_holds():
    node, system = hgx(os_release=ROCKY_9, packages={"nvidia-fabric-manager": "535.129.03-1",
                                                    "python3-dnf-plugin-versionlock": "4.3.0-13.el9"})
    node.tools.add("dnf")
    system.unit(fm.UNIT, "active", "enabled")
    assert [a.summary for a in plan_of(node).actions] == ["versionlock nvidia-fabric-manager at 535.129.03-1"]
    node.outputs["versionlocks"] = ("nvidia-fabric-manager-0:535.129.03-1.*\n", 0)
    assert plan_of(node).status is Status.OK
