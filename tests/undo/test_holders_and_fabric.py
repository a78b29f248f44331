"""The driver's undo against what holds the GPU (services, processes, DRM clients), and the fabric manager's undo
(hold released first, service disabled, packages, then the CUDA repository unless a kept package needs it)."""

from __future__ import annotations

import dataclasses

from gpunode.actions.driver import StopGpuServices, UnloadModules
from gpunode.facts import Facts
from gpunode.plan import Reboot, RunCommand, Status
from gpunode.records import parse_records
from gpunode.undo import driver, fabricmanager
from gpunode.undo.common import stopped_units
from gpunode.undo.state import NodeState, UndoRequest
from tests.steps.test_driver_upgrade import DAEMONS, OLD, USER_JOB, node

MINE = parse_records([{"kind": "driver", "version": OLD, "previous": None}])
INSTALLED = NodeState(driver=OLD)
REQ = UndoRequest(("driver",))
PERSISTENCED, FM = "nvidia-persistenced.service", "nvidia-fabricmanager.service"


def commands(plan) -> list[str]:
    return [c for a in plan.actions for c in a.commands()]


def test_gpu_services_block_the_driver_uninstall_without_the_flag():
    p = driver.plan(MINE, INSTALLED, node(), REQ)
    assert p.status is Status.BLOCKED and p.actions == ()
    assert FM in p.reason and PERSISTENCED in p.reason
    assert p.fix is not None and p.fix.startswith("gpunode uninstall --only driver --stop-gpu-services")


def test_with_the_flag_they_are_stopped_and_stay_stopped_then_the_modules_unload_and_the_driver_goes():
    p = driver.plan(MINE, INSTALLED, node(), dataclasses.replace(REQ, stop_gpu_services=True))
    assert p.status is Status.CHANGE
    assert [type(a) for a in p.actions] == [StopGpuServices, UnloadModules, RunCommand]
    stop = p.actions[0]
    assert isinstance(stop, StopGpuServices) and stop.units == (FM, PERSISTENCED) and stop.deferred() == ()
    assert commands(p)[-1] == "sudo nvidia-installer --uninstall --silent"
    assert any("stay stopped" in n for n in p.notes)


def test_services_the_earlier_undo_steps_stop_need_no_flag():
    p = driver.plan(MINE, INSTALLED, node(), dataclasses.replace(REQ, stopping=(FM, PERSISTENCED)))
    assert p.status is Status.CHANGE and not any(isinstance(a, StopGpuServices) for a in p.actions)
    assert commands(p)[-1] == "sudo nvidia-installer --uninstall --silent"


def test_a_users_process_blocks_even_with_the_flag_and_is_named():
    p = driver.plan(MINE, INSTALLED, node(processes=DAEMONS + USER_JOB), dataclasses.replace(REQ, stop_gpu_services=True))
    assert p.status is Status.BLOCKED and "PID 40112 python3" in p.reason
    assert p.fix is not None and "end or move PID 40112 (python3)" in p.fix
    assert p.fix.endswith("then gpunode uninstall --only driver --stop-gpu-services")


def test_nvidia_drm_held_by_drm_clients_removes_the_files_without_unloading_then_reboots():
    facts = node(nvidia_module_refcounts="nvidia_drm 2 \nnvidia_modeset 1 nvidia_drm\nnvidia 3 nvidia_modeset\n")
    p = driver.plan(MINE, INSTALLED, facts, dataclasses.replace(REQ, stopping=(FM, PERSISTENCED)))
    assert p.status is Status.CHANGE and isinstance(p.actions[-1], Reboot) and p.reboot_required
    assert commands(p)[-1] == "sudo nvidia-installer --uninstall --silent --skip-module-unload"
    unload = next(a for a in p.actions if isinstance(a, UnloadModules))
    assert unload.may_stay == ("nvidia_drm",)
    # after: the files are gone, the module still loaded -> only the reboot is left; after it: done
    left = driver.plan(MINE, NodeState(driver="-"), facts, REQ)
    assert left.only_reboot_left
    assert driver.plan(MINE, NodeState(driver="-"), Facts(), REQ).status is Status.OK


def test_kernel_holds_gpunode_placed_are_released_with_the_driver():
    records = [*MINE, *parse_records([{"kind": "hold", "manager": "apt", "held": ["linux-headers-generic"]}])]
    p = driver.plan(records, dataclasses.replace(INSTALLED, holds=frozenset({"linux-headers-generic"})), Facts(), REQ)
    assert commands(p)[0] == "sudo apt-mark unhold linux-headers-generic"


# ---- fabric manager -------------------------------------------------------------------------------------------------

FM_PKG = "nvidia-fabricmanager-535"
FM_RECORDS = parse_records([
    {"kind": "packages", "manager": "apt", "installed": [["cuda-keyring", "1.1-1"]]},
    {"kind": "file", "path": "/etc/apt/sources.list.d/cuda-ubuntu2204-x86_64.list", "existed": False,
     "backup": None, "sha256": "a" * 64, "repository": True},
    {"kind": "packages", "manager": "apt", "installed": [[FM_PKG, "535.274.02-1"]]},
    {"kind": "hold", "manager": "apt", "held": [FM_PKG]},
    {"kind": "unit", "unit": FM, "was": "disabled"},
    {"kind": "unit", "unit": FM, "was": "enabled"},  # a later run's restart: the first record decides
])
FM_STATE = NodeState(files={"/etc/apt/sources.list.d/cuda-ubuntu2204-x86_64.list": "a" * 64},
                     packages={FM_PKG: "535.274.02-1", "cuda-keyring": "1.1-1"}, units={FM: "enabled"},
                     holds=frozenset({FM_PKG}))
FM_REQ = UndoRequest(("fabricmanager",))


def test_fabric_manager_hold_released_first_then_service_packages_and_repository():
    p = fabricmanager.plan(FM_RECORDS, FM_STATE, Facts(), FM_REQ)
    assert p.status is Status.CHANGE
    assert commands(p) == [
        f"sudo apt-mark unhold {FM_PKG}",
        f"sudo systemctl disable --now {FM}",
        f"sudo apt-get remove -y {FM_PKG}",
        "sudo apt-get remove -y cuda-keyring",
        "sudo rm -f -- /etc/apt/sources.list.d/cuda-ubuntu2204-x86_64.list"]
    assert stopped_units(p.actions) == (FM,)


def test_a_hold_on_a_package_that_was_there_before_is_released_and_the_package_kept():
    records = parse_records([{"kind": "hold", "manager": "apt", "held": [FM_PKG]}])
    p = fabricmanager.plan(records, FM_STATE, Facts(), FM_REQ)
    assert commands(p) == [f"sudo apt-mark unhold {FM_PKG}"]
    # released since (or never gpunode's): nothing
    assert fabricmanager.plan(records, dataclasses.replace(FM_STATE, holds=frozenset()), Facts(), FM_REQ
                              ).status is Status.OK


def test_the_cuda_repository_stays_while_a_package_gpunode_keeps_may_come_from_it():
    req = dataclasses.replace(FM_REQ, kept_packages=frozenset({"cuda-compat-12-8", "gcc"}))
    p = fabricmanager.plan(FM_RECORDS, FM_STATE, Facts(), req)
    assert "cuda-keyring" not in " ".join(commands(p)) and "sources.list.d" not in " ".join(commands(p))
    assert any("cuda-compat-12-8" in n for n in p.notes)
    only_gcc = dataclasses.replace(FM_REQ, kept_packages=frozenset({"gcc", "dkms"}))
    assert "sudo apt-get remove -y cuda-keyring" in commands(fabricmanager.plan(FM_RECORDS, FM_STATE, Facts(), only_gcc))


def test_holds_unknown_means_none_released():
    p = fabricmanager.plan(FM_RECORDS, dataclasses.replace(FM_STATE, holds=None), Facts(), FM_REQ)
    assert not any("unhold" in c for c in commands(p)) and any("no hold released" in n for n in p.notes)


def test_the_fix_repeats_the_only_steps_asked_for():
    p = driver.plan(MINE, INSTALLED, node(), UndoRequest(("driver", "nouveau")))
    assert p.fix is not None and p.fix.startswith("gpunode uninstall --only driver --only nouveau --stop-gpu-services")
