"""The driver step replacing a loaded driver: what holds the GPU decides between blocked, the stop / unload /
install / load / start sequence, and install-then-reboot (facts only, no node)."""

from __future__ import annotations

import dataclasses
import json

from gpunode.actions.driver import RunInstaller, StartGpuServices, StopGpuServices, UnloadModules
from gpunode.facts import Facts
from gpunode.facts.probe import Section
from gpunode.options import Options
from gpunode.plan import Reboot, RunCommand, Status
from gpunode.steps import driver
from tests.steps.test_driver import installed

NEW = "570.195.03"
OLD = "535.274.02"
H100 = 0x2330
SERVICES = ("nvidia-mps.service\tinactive\t\nnvidia-dcgm.service\tinactive\t\ndcgm.service\tinactive\t\n"
            "nvidia-gridd.service\tinactive\t\nnvidia-fabricmanager.service\tactive\tenabled\n"
            "nvidia-persistenced.service\tactive\tenabled\n")
DAEMONS = ("1830\tnvidia-persiste\t/system.slice/nvidia-persistenced.service\t/dev/nvidiactl,/dev/nvidia0\n"
           "2210\tnv-fabricmanage\t/system.slice/nvidia-fabricmanager.service\t/dev/nvidiactl\n")
USER_JOB = "40112\tpython3\t/user.slice/user-1000.slice/session-7.scope\t/dev/nvidia0,/dev/nvidiactl\n"


def node(*, services: str = SERVICES, processes: str = DAEMONS, modules=("nvidia_drm", "nvidia_modeset", "nvidia_uvm",
                                                                          "nvidia"), **outputs: str) -> Facts:
    f = installed(OLD, devices=(H100,))
    extra = {"gpu_services": Section(services, 0), "gpu_processes": Section(processes, 0),
             **{k: Section(v, 0) for k, v in outputs.items()}}
    return dataclasses.replace(f, outputs={**f.outputs, **extra}, modules=frozenset(modules))


def plan(f: Facts, **options: object):
    return driver.plan(f, Options(driver=NEW, **options), {})  # type: ignore[arg-type]


def test_services_holding_the_driver_block_without_the_flag_with_the_same_command_plus_it():
    p = plan(node(), kernel_module="open")
    assert p.status is Status.BLOCKED and p.actions == ()
    assert p.reason.startswith(f"driver {OLD} is loaded and held by service nvidia-fabricmanager.service (fabric "
                               "manager); service nvidia-persistenced.service (persistence daemon)")
    assert p.fix is not None and p.fix.startswith(
        f"gpunode install --driver {NEW} --kernel-module open --stop-gpu-services  # stops "
        "nvidia-fabricmanager.service, nvidia-persistenced.service")


def test_with_the_flag_the_sequence_is_stop_unload_install_load_start_and_the_stops_are_owed():
    p = plan(node(), stop_gpu_services=True)
    assert p.status is Status.CHANGE and not p.reboot_required
    stop, unload, _fetch, install, load, start = p.actions
    assert isinstance(stop, StopGpuServices) and stop.units == ("nvidia-fabricmanager.service",
                                                                 "nvidia-persistenced.service")
    assert stop.deferred() == (("start", "nvidia-fabricmanager.service"), ("start", "nvidia-persistenced.service"))
    assert isinstance(unload, UnloadModules) and unload.modules == ("nvidia_drm", "nvidia_modeset", "nvidia_uvm",
                                                                    "nvidia")
    assert unload.may_stay == () and unload.restore_units == ("nvidia-persistenced.service",
                                                              "nvidia-fabricmanager.service")
    assert isinstance(install, RunInstaller) and driver.ALLOW_RUNNING not in install.flags
    assert install.restore_units == unload.restore_units and "nvidia" in install.restore_modules
    assert isinstance(load, RunCommand) and load.commands() == ["sudo modprobe nvidia"]
    # fabric manager is the fabricmanager step's: it moves it to the new version in the same run
    assert isinstance(start, StartGpuServices) and start.units == ("nvidia-persistenced.service",)
    assert start.settles() == (("start", "nvidia-persistenced.service"),)
    assert any("fabricmanager step" in n for n in p.notes)
    shown = json.dumps(p.to_dict())
    assert "systemctl stop nvidia-fabricmanager.service" in shown and "unload-nvidia-modules" in shown


def test_a_users_process_blocks_even_with_the_flag_and_is_never_stopped():
    p = plan(node(processes=DAEMONS + USER_JOB), stop_gpu_services=True)
    assert p.status is Status.BLOCKED and "process PID 40112 python3: /dev/nvidia0, /dev/nvidiactl" in p.reason
    assert p.fix is not None and "PID 40112 (python3) yourself" in p.fix
    # the follow-up is the user's own command again: it keeps the --stop-gpu-services they gave (it was dropped)
    assert p.fix.endswith(f"then gpunode install --driver {NEW} --stop-gpu-services")
    held = plan(node(processes=DAEMONS + USER_JOB), stop_gpu_services=True, hold_kernel=True, k8s=True)
    assert held.fix is not None and held.fix.endswith(f"then gpunode install --driver {NEW} --k8s --hold-kernel "
                                                      "--stop-gpu-services")
    without = plan(node(processes=DAEMONS + USER_JOB))
    assert without.fix is not None and without.fix.endswith(f"--driver {NEW} --stop-gpu-services")


def test_gpu_containers_and_pods_block_with_their_own_fixes():
    docker = ("4f5e6d7c8b9a0f1e2d3c4b5a6978695a4b3c2d1e0f9e8d7c6b5a49382716a5b4\t/trainer\tpytorch:24.05\trunc\t"
              '[{"Driver":"","Count":-1,"Capabilities":[["gpu"]]}]\t[]\n')
    pod = ("51000\tnvidia-device-p\t/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1f2e.slice/"
           "cri-containerd-9b1f0c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b.scope\t/dev/nvidiactl\n")
    p = plan(node(processes=DAEMONS + pod, gpu_containers=docker, k8s_units="kubelet.service\tactive\tenabled\n"),
             stop_gpu_services=True)
    assert p.status is Status.BLOCKED and "container trainer (pytorch:24.05, 4f5e6d7c8b9a)" in p.reason
    assert p.fix is not None and "`docker stop trainer`" in p.fix and "`kubectl drain \"$(hostname)\" --ignore-daemonsets" in p.fix
    assert any("a Kubernetes node (kubelet.service): drain it first" in n for n in p.notes)


def test_nvidia_drm_in_use_by_drm_clients_installs_beside_it_and_predicts_the_reboot():
    p = plan(node(nvidia_module_refcounts="nvidia_drm 3 \nnvidia 40 nvidia_modeset nvidia_uvm\n"),
             stop_gpu_services=True)
    assert p.status is Status.CHANGE and p.reboot_required
    kinds = [a.kind for a in p.actions]
    assert kinds == ["service", "modules", "download", "driver-install", "reboot"]
    unload, install = p.actions[1], p.actions[3]
    assert isinstance(unload, UnloadModules) and unload.may_stay == ("nvidia_drm",)
    assert isinstance(install, RunInstaller) and install.flags[-1] == driver.ALLOW_RUNNING
    assert isinstance(p.actions[-1], Reboot) and "nvidia_drm stays loaded" in p.actions[-1].summary
    assert p.to_dict()["reboot_required"] is True


def test_nothing_holding_the_gpu_needs_no_flag():
    p = plan(node(services=SERVICES.replace("\tactive\t", "\tinactive\t"), processes=""))
    assert p.status is Status.CHANGE
    assert [a.kind for a in p.actions] == ["modules", "download", "driver-install", "command"]


def test_services_an_earlier_run_stopped_are_started_again_once_the_driver_is_right():
    journal = json.dumps({"pending": [{"effect": "start", "target": "nvidia-persistenced.service"},
                                      {"effect": "start", "target": "nvidia-fabricmanager.service"}]})
    down = SERVICES.replace("active\tenabled", "inactive\tenabled")
    f = dataclasses.replace(node(services=down, processes="", gpunode_owed_starts=journal))
    ok_now = driver.plan(f, Options(driver=OLD), {})
    assert ok_now.status is Status.CHANGE and [a.commands() for a in ok_now.actions] == [
        ["sudo systemctl start nvidia-persistenced.service"]]  # fabric manager: the fabricmanager step's
    upgrade = plan(f, stop_gpu_services=True)
    start = upgrade.actions[-1]
    assert isinstance(start, StartGpuServices) and start.units == ("nvidia-persistenced.service",)
    up = driver.plan(node(processes="", gpunode_owed_starts=journal), Options(driver=OLD), {})
    assert up.status is Status.OK  # running again: nothing to do
