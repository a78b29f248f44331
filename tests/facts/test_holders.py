"""What holds the GPU: the parsers on real-format outputs, and `gpu_holders` combining them."""

from __future__ import annotations

import json

from gpunode.facts import Facts
from gpunode.facts.holders import (
    GpuProcess,
    gpu_holders,
    parse_compute_apps,
    parse_containers,
    parse_fd_scan,
    parse_owed_starts,
    parse_refcounts,
)
from gpunode.facts.probe import Section

# what the probe prints after `ls -l /proc/[0-9]*/fd` (cgroup v2 lines as in /proc/PID/cgroup)
FD_SCAN = (
    "1830\tnvidia-persiste\t/system.slice/nvidia-persistenced.service\t/dev/nvidiactl,/dev/nvidia0,/dev/nvidia1\n"
    "2210\tnv-fabricmanage\t/system.slice/nvidia-fabricmanager.service\t/dev/nvidiactl,/dev/nvidia-nvswitchctl\n"
    "40112\tpython3\t/user.slice/user-1000.slice/session-7.scope\t/dev/nvidia0,/dev/nvidiactl,/dev/nvidia-uvm\n"
    "51000\tnvidia-device-p\t/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1f2e.slice/"
    "cri-containerd-9b1f0c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b.scope\t/dev/nvidiactl\n"
    "52000\tpython\t/system.slice/docker-4f5e6d7c8b9a0f1e2d3c4b5a6978695a4b3c2d1e0f9e8d7c6b5a49382716a5b4.scope"
    "\t/dev/nvidia1,/dev/nvidiactl,/dev/nvidia1\n"
    "garbage line\n"
)
# nvidia-smi --query-compute-apps=pid,process_name --format=csv,noheader (R535 output)
COMPUTE_APPS = "40112, /usr/bin/python3\n61234, ./train\n"
DOCKER = (
    # docker run --gpus all: DeviceRequests with the gpu capability
    "4f5e6d7c8b9a0f1e2d3c4b5a6978695a4b3c2d1e0f9e8d7c6b5a49382716a5b4\t/trainer\tnvcr.io/nvidia/pytorch:24.05-py3\t"
    'runc\t[{"Driver":"","Count":-1,"DeviceIDs":null,"Capabilities":[["gpu"]],"Options":{}}]\t'
    '["PATH=/usr/local/sbin:/usr/bin","NVIDIA_VISIBLE_DEVICES=all"]\n'
    # a CUDA image under runc: the env alone gives no GPU
    "0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9\t/cpu-only\tnvidia/cuda:12.4.1-base-ubuntu22.04\t"
    'runc\tnull\t["NVIDIA_VISIBLE_DEVICES=all"]\n'
    # the nvidia runtime with devices in the env
    "1111111111112222222222223333333333334444444444445555555555556666\t/legacy\tnvidia/cuda:12.4.1-base-ubuntu22.04\t"
    'nvidia\tnull\t["NVIDIA_VISIBLE_DEVICES=0,1"]\n'
    # the nvidia runtime with NVIDIA_VISIBLE_DEVICES=void: no GPU
    "7777777777778888888888889999999999990000000000001111111111112222\t/void\tubuntu:22.04\tnvidia\tnull\t"
    '["NVIDIA_VISIBLE_DEVICES=void"]\n'
)
UNITS = ("nvidia-mps.service\tinactive\tnot-found\nnvidia-dcgm.service\tactive\tenabled\n"
         "dcgm.service\tinactive\t\nnvidia-gridd.service\tinactive\t\n"
         "nvidia-fabricmanager.service\tactive\tenabled\nnvidia-persistenced.service\tactive\tenabled\n")


def test_fd_scan_lines_become_processes_with_unit_container_or_pod():
    procs = {p.pid: p for p in parse_fd_scan(FD_SCAN)}
    assert sorted(procs) == [1830, 2210, 40112, 51000, 52000]
    assert procs[1830].unit == "nvidia-persistenced.service" and procs[1830].name == "nvidia-persiste"
    assert procs[40112].unit == "" and procs[40112].devices == ("/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidiactl")
    assert procs[51000].in_pod and procs[51000].container.startswith("9b1f0c2d3e4f")
    assert procs[52000].container.startswith("4f5e6d7c8b9a") and procs[52000].devices == ("/dev/nvidia1",
                                                                                         "/dev/nvidiactl")
    assert procs[40112].describe() == "PID 40112 python3"
    assert "in container 4f5e6d7c8b9a" in procs[52000].describe()


def test_compute_apps_and_containers_parse_real_formats():
    assert parse_compute_apps(COMPUTE_APPS) == [GpuProcess(40112, "/usr/bin/python3"), GpuProcess(61234, "./train")]
    assert parse_compute_apps("") == [] and parse_compute_apps("pid, process_name\n") == []
    found = parse_containers(DOCKER)
    assert [c.name for c in found] == ["trainer", "legacy"]
    assert found[0].describe() == "container trainer (nvcr.io/nvidia/pytorch:24.05-py3, 4f5e6d7c8b9a)"


def test_names_from_the_node_lose_what_a_shell_or_terminal_would_read():
    procs = parse_fd_scan("77\tx`reboot`$(id)\x1b[2J\t/user.slice\t/dev/nvidia0\n")
    assert procs[0].name == "x?reboot???id???2J"  # the control character and [ ] ( ) $ ` are gone
    assert parse_compute_apps("88, /tmp/a'b\n")[0].name == "/tmp/a?b"


def test_refcounts_and_owed_starts():
    assert parse_refcounts("nvidia_drm 2 \nnvidia_modeset 1 nvidia_drm\nnvidia 58 nvidia_uvm nvidia_modeset\n") == {
        "nvidia_drm": (2, ()), "nvidia_modeset": (1, ("nvidia_drm",)), "nvidia": (58, ("nvidia_uvm", "nvidia_modeset"))}
    journal = {"pending": [{"effect": "start", "target": "nvidia-persistenced.service"},
                           {"effect": "restart", "target": "docker.service"},
                           {"effect": "start", "target": "nvidia-fabricmanager.service"}]}
    assert parse_owed_starts(json.dumps(journal)) == ("nvidia-fabricmanager.service", "nvidia-persistenced.service")
    assert parse_owed_starts("{not json") == () and parse_owed_starts("") == ()


def _facts(**outputs: str) -> Facts:
    return Facts(outputs={name: Section(text, 0) for name, text in outputs.items()})


def test_gpu_holders_keeps_services_apart_from_what_gpunode_never_stops():
    found = gpu_holders(_facts(gpu_services=UNITS, gpu_processes=FD_SCAN, gpu_compute_apps=COMPUTE_APPS,
                               gpu_containers=DOCKER, k8s_units="kubelet.service\tactive\tenabled\n",
                               nvidia_module_refcounts="nvidia_drm 1 \n"))
    # stop order: users of the GPU first, persistence last
    assert found.services == ("nvidia-dcgm.service", "nvidia-fabricmanager.service", "nvidia-persistenced.service")
    # the docker container's process is listed as its container; the pod's and the user's processes stay
    assert [p.pid for p in found.processes] == [40112, 51000, 61234]
    assert [c.name for c in found.containers] == ["trainer", "legacy"]
    assert found.kubelet == "kubelet.service" and found.stuck_modules == ("nvidia_drm",) and found.blocking
    assert found.lines()[0] == "service nvidia-dcgm.service (DCGM host engine (nv-hostengine))"


def test_only_services_is_not_blocking_and_an_unreadable_scan_is_said():
    found = gpu_holders(Facts(outputs={"gpu_services": Section(UNITS, 0), "gpu_processes": Section("", 3)}))
    assert not found.blocking and found.any and found.unread == ("/proc/*/fd",)
    idle = gpu_holders(_facts(gpu_services="", gpu_processes="", nvidia_module_refcounts="nvidia_drm 0 \n"))
    assert not idle.any and idle.stuck_modules == ()


def test_without_a_loaded_driver_the_holder_scans_run_nothing(tmp_path):
    """Nothing holds a GPU whose driver is not loaded: the /proc fd scan and docker's container listing (a
    process or several each, `docker ps` and `docker inspect`) are skipped and say "none"."""
    import subprocess

    from gpunode.facts.holders import GPU_CONTAINERS, GPU_PROCESSES
    from gpunode.facts.registry import Section

    (tmp_path / "docker").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/calls\n')
    (tmp_path / "docker").chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
    version = tmp_path / "version"
    for fact in (GPU_PROCESSES, GPU_CONTAINERS):
        out = subprocess.run(["sh", "-c", fact.snippet.replace("/proc/driver/nvidia/version", str(version))],
                             capture_output=True, text=True, env=env)
        assert (out.returncode, out.stdout) == (0, "") and fact.parse(Section(out.stdout, 0)) == []
    assert not (tmp_path / "calls").exists()
    version.write_text("NVRM version: 535.129.03\n")  # loaded: docker is asked
    subprocess.run(["sh", "-c", GPU_CONTAINERS.snippet.replace("/proc/driver/nvidia/version", str(version))],
                   capture_output=True, text=True, env=env)
    assert (tmp_path / "calls").read_text().splitlines() == ["ps -q"]
