"""The shims gpunode's probe and the benchmarks' peer scripts ask (systemctl show and is-*, modinfo, nvidia-smi,
dpkg-query -W, uname, nvidia-ctk --version, docker info) cost what the real tools cost: one process each (issue 25:
a simulated node that charges ten processes for a `systemctl show` lies about what gpunode costs). And where the
simulator printed something the real tool does not, it now prints what the real one does."""

from __future__ import annotations

import shutil
import subprocess

import pytest

pytestmark = pytest.mark.integration

UNITS = ("docker.service containerd.service crio.service snap.docker.dockerd.service nvidia-fabricmanager.service "
         "nvidia-persistenced.service k3s.service kubelet.service nvidia-dcgm.service")
QUERIES = [
    f"systemctl show -p Id -p ActiveState -p UnitFileState {UNITS}",
    "systemctl is-active docker.service nvidia-persistenced.service",
    "systemctl is-enabled docker containerd",
    "systemctl list-units",
    f"systemctl list-units --all --plain --no-legend --full {UNITS}",
    "modinfo nvidia",
    "modinfo -F version nvidia",
    "nvidia-smi --query-gpu=driver_version --format=csv,noheader",
    "nvidia-smi --version",
    r"dpkg-query -W -f='${db:Status-Abbrev}\t${Package}\t${Version}\n' 'nvidia*' 'libnvidia*' libcuda1 'cuda-drivers*'",
    r"dpkg-query -W -f='${Status}\n' gcc make dkms nvidia-container-toolkit",
    "uname -r",
    "uname -rm",
    "nvidia-ctk --version",
    "docker info --format '{{json .DefaultRuntime}} {{json .Runtimes}}'",
]


def _processes(root: str, command: str) -> int:
    """How many processes `command` starts in the node's root: in a PID namespace of its own PIDs are handed out
    one after the other, so the PID of a process started after it says how many came before."""
    marker = "nodesim-last-pid"
    out = subprocess.run(
        ["unshare", "--pid", "--fork", "chroot", root, "/usr/bin/env", "-i", "HOME=/root",
         "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "/bin/sh", "-c",
         f"{command} >/dev/null 2>&1\n/bin/sh -c 'echo {marker} $$'\n"],
        capture_output=True, text=True, timeout=60, check=False).stdout
    return int(out.rsplit(marker, 1)[1].split()[0]) - 2  # PID 1 is the shell, the last one printed its PID


@pytest.fixture
def converged(sim_node):
    return sim_node("ubuntu-22.04-t4", preinstalled_driver="535.129.03", toolkit_version="1.17.8-1")


def test_each_query_is_one_process_like_the_real_tool(converged):
    assert shutil.which("unshare"), "unshare (util-linux) is needed to count a command's processes"
    root = str(converged.root)
    assert _processes(root, "true") == 0 and _processes(root, "/usr/bin/true") == 1  # the count counts
    costs = {query: _processes(root, query) for query in QUERIES}
    assert {q: n for q, n in costs.items() if n != 1} == {}


def test_the_queries_still_answer(converged):
    rc, out, err = converged.ssh("modinfo -F version nvidia; modinfo nvidia | tr -s ' '; uname -r; nvidia-ctk --version; "
                                 "nvidia-smi --query-gpu=driver_version --format=csv,noheader; nvidia-smi --version")
    assert rc == 0, err
    assert out.splitlines() == [
        "535.129.03",
        "filename: /lib/modules/5.15.0-91-generic/updates/dkms/nvidia.ko", "version: 535.129.03",
        "license: NVIDIA", "name: nvidia",
        "5.15.0-91-generic",
        "NVIDIA Container Toolkit CLI version 1.17.8", "commit: 6d6a6c5c1b43d0f87d7a77a4f69d4a2c0b1b12f3",
        "535.129.03",
        "NVIDIA-SMI version  : 535.129.03", "NVML version        : 535.129", "DRIVER version      : 535.129.03",
        "CUDA Version        : 12.2"]


def test_systemctl_show_prints_a_block_per_unit_in_systemds_order(sim_node):
    """systemctl show separates the units' blocks by an empty line and prints the properties in systemd's own
    order, whatever order -p named them in (tests/facts/test_probe_sections.py SHOW: systemd 252)."""
    node = sim_node("ubuntu-22.04-nogpu", engines=("docker",))
    rc, out, _ = node.ssh("systemctl show -p UnitFileState -p ActiveState -p Id docker nvidia-persistenced.service")
    assert rc == 0
    assert out == ("Id=docker.service\nActiveState=active\nUnitFileState=enabled\n\n"
                   "Id=nvidia-persistenced.service\nActiveState=inactive\nUnitFileState=\n")
    assert node.ssh("systemctl show -p SubState,ActiveState --value docker containerd")[1] == \
        "active\nrunning\n\nactive\nrunning\n"


def test_systemctl_list_units_lists_the_units_systemd_holds_by_pattern(sim_node):
    """`list-units --all PATTERNS` (packages.SHOW_CALL's question): the units systemd holds whose name matches,
    inactive ones included, as UNIT LOAD ACTIVE SUB DESCRIPTION; without --all the inactive ones are left out; a
    unit systemd does not hold is not listed, and the list loads nothing (a unit file named there stays unread)."""
    node = sim_node("ubuntu-22.04-nogpu", engines=("docker",))
    rc, _, err = node.ssh("systemctl stop docker; mkdir -p /etc/systemd/system; printf '[Service]\\nExecStart=/bin/true\\n' > /etc/systemd/system/x.service")
    assert rc == 0, err
    rc, out, _ = node.ssh("systemctl list-units --all --plain --no-legend --full docker.service 'contai*' crio.service "
                          "x.service")
    assert rc == 0
    assert [line.split()[:4] for line in out.splitlines()] == [
        ["containerd.service", "loaded", "active", "running"], ["docker.service", "loaded", "inactive", "dead"]]
    assert node.ssh("systemctl list-units --plain --no-legend docker.service containerd.service")[1].split()[:4] == \
        ["containerd.service", "loaded", "active", "running"]
    assert "x.service" in node.ssh("systemctl show -p Id x.service")[1]  # show loads the unit file it names


def test_dpkg_query_shows_each_package_once_in_name_order(sim_node):
    """dpkg-query -W goes through the packages in name order and shows each for the first pattern it matches;
    a pattern whose packages an earlier pattern took reports none (dpkg's showpackages)."""
    node = sim_node("ubuntu-22.04-t4", toolkit_version="1.17.8-1")
    rc, out, err = node.ssh(r"dpkg-query -W -f='${Package}\n' 'nvidia-container-toolkit*' 'lib*' 'libnvidia*' curl")
    assert rc == 1
    names = out.split()
    assert names == sorted(names) and len(names) == len(set(names))
    assert {"curl", "libc6", "libnvidia-container1", "nvidia-container-toolkit", "nvidia-container-toolkit-base"} \
        <= set(names)
    assert err == "dpkg-query: no packages found matching libnvidia*\n"
