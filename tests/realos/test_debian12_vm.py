"""The real-OS tier: gpunode against a real Debian 12 (QEMU VM, real grub/initramfs-tools/kmod/systemd/apt/dpkg,
Debian's docker.io and containerd). The tests share one VM and run in file order: each scenario starts from
the node the previous one left, as on a real machine. The container toolkit is the STAND-IN package built
from the simulator's nvidia-ctk (tests/realos/toolkit_repo.py); the driver step stays on the simulator.

Every gpunode run is checked for a traceback on stderr (conftest.Realos.gpunode)."""

from __future__ import annotations

import json
import time

import pytest

from tests.realos import toolkit_repo

pytestmark = [pytest.mark.realos]

# prerequisites only plans the build tools for a driver to build: a version is named, no .run is fetched
DRIVER = "550.54.15"

# Everything a run could change on the node, as one digest: /etc and /boot contents (gpunode's own journal
# under /var/lib/gpunode is a record, not a change), the dpkg database, and the engines' main PIDs.
FINGERPRINT = (
    "{ find /etc /boot -xdev -type f -print0 | sort -z | xargs -0 sha256sum; "
    "find /etc /boot -xdev -type l -printf '%p -> %l\\n' | sort; } | sha256sum; "
    "sha256sum /var/lib/dpkg/status; systemctl show -p MainPID -p ActiveEnterTimestampMonotonic docker containerd"
)
USER_DAEMON_JSON = {"log-driver": "json-file", "log-opts": {"max-size": "10m", "max-file": "3"},
                    "default-ulimits": {"nofile": {"Name": "nofile", "Soft": 65536, "Hard": 65536}}}
HELLO_C = r"""
#include <linux/module.h>
MODULE_LICENSE("GPL");
static int __init hello_init(void) { return 0; }
static void __exit hello_exit(void) { }
module_init(hello_init);
module_exit(hello_exit);
"""


def main_pid(realos, unit: str) -> int:
    return int(realos.ssh(f"systemctl show -p MainPID --value {unit}").strip())


def loaded(realos, module: str) -> bool:
    return any(line.split()[0] == module for line in realos.ssh("cat /proc/modules").splitlines())


def test_read_only_commands_change_nothing(realos):
    assert realos.vm.wait_booted() == "running", realos.ssh("systemctl --failed --no-legend")
    before = realos.ssh(FINGERPRINT)
    started = time.monotonic()
    facts = realos.gpunode("facts")
    assert facts.rc == 0, facts.err
    parsed = facts.json()["facts"]  # {subsystem: {fact: parsed value}}
    assert [(d["vendor"], d["device"]) for d in parsed["kernel"]["pci"]] == [(0x10DE, 0x1EB8)], \
        "the guest's edu device should read as a Tesla T4 (10de:1eb8)"
    os_release = parsed["system"]["os_release"]
    assert (os_release["id"], os_release["version"]) == ("debian", "12")
    assert "nouveau" in parsed["kernel"]["modules"]
    plan = realos.gpunode("plan", "--json")
    assert plan.rc in (0, 1), plan.err
    steps = {s["step"]: s for s in plan.json()["steps"]}
    assert steps["nouveau"]["status"] == "change", steps["nouveau"]
    doctor = realos.gpunode("doctor", "--json")
    assert doctor.rc == 1, "no NVIDIA driver on the guest: doctor must report a failed check"
    assert doctor.json()
    status = realos.gpunode("status")
    assert status.rc in (0, 1), status.err
    realos.stage("read-only commands (facts, plan, doctor, status)", time.monotonic() - started)
    assert realos.ssh(FINGERPRINT) == before


def test_nouveau_blacklisted_in_new_initramfs_and_gone_after_real_reboot(realos):
    assert loaded(realos, "nouveau"), "udev-style modalias load at boot should have loaded nouveau"
    boot = realos.vm.boot_id()
    run = realos.gpunode("install", "--only", "nouveau", "--reboot", timeout=1800,
                         stage="install --only nouveau --reboot (initramfs + real reboot)")
    assert run.rc == 0, run.out + run.err
    assert realos.vm.boot_id() != boot, "the guest did not reboot"
    assert realos.vm.wait_booted() == "running"
    kernel = realos.ssh("uname -r").strip()
    listing = realos.ssh(f"lsinitramfs /boot/initrd.img-{kernel}").split()
    blacklists = [p for p in listing if p.startswith("etc/modprobe.d/") or p.startswith("usr/lib/modprobe.d/")]
    assert "etc/modprobe.d/blacklist-nouveau.conf" in blacklists, blacklists
    conf = realos.ssh("cat /etc/modprobe.d/blacklist-nouveau.conf")
    assert "blacklist nouveau" in conf
    assert not loaded(realos, "nouveau")


def test_prerequisites_through_real_apt_then_a_kernel_module_builds(realos):
    run = realos.gpunode("install", "--only", "prerequisites", "--driver", DRIVER, timeout=2400,
                         stage="install --only prerequisites (real apt)")
    assert run.rc == 0, run.out + run.err
    kernel = realos.ssh("uname -r").strip()
    realos.ssh(f"dpkg-query -W gcc make dkms linux-headers-{kernel}")
    started = time.monotonic()
    realos.vm.ssh("mkdir -p /root/hello && echo 'obj-m := hello.o' > /root/hello/Makefile", check=True)
    realos.vm.ssh("cat > /root/hello/hello.c <<'EOF'\n" + HELLO_C + "EOF\n", check=True)
    realos.ssh(f"make -C /lib/modules/{kernel}/build M=/root/hello modules >/root/hello/build.log 2>&1 || "
               "{ cat /root/hello/build.log; exit 1; }")
    assert f"vermagic:       {kernel} " in realos.ssh("modinfo /root/hello/hello.ko")
    realos.ssh("insmod /root/hello/hello.ko && rmmod hello")
    realos.stage("kernel module build with the installed prerequisites", time.monotonic() - started)


def test_toolkit_from_the_local_repository_with_real_apt_dependencies(realos):
    realos.vm.ssh("cat > /etc/apt/sources.list.d/nvidia-toolkit-mirror.list <<'EOF'\n"
                  + toolkit_repo.apt_source("http://10.0.2.100/local") + "EOF\n", check=True)
    run = realos.gpunode("install", "--only", "toolkit", timeout=1800,
                         stage="install --only toolkit (local repository, stand-in packages)")
    assert run.rc == 0, run.out + run.err
    versions = dict(line.split("\t") for line in realos.ssh(
        "dpkg-query -W -f='${Package}\\t${Version}\\n' 'nvidia-container-*' 'libnvidia-container*'").splitlines())
    assert versions == {name: toolkit_repo.VERSION for name in toolkit_repo.PACKAGES}
    assert realos.ssh("nvidia-ctk --version").startswith("NVIDIA Container Toolkit CLI version")


def test_runtime_for_docker_restarts_dockerd_and_keeps_the_users_keys(realos):
    realos.vm.ssh("mkdir -p /etc/docker && cat > /etc/docker/daemon.json <<'EOF'\n"
                  + json.dumps(USER_DAEMON_JSON, indent=4) + "\nEOF\nsystemctl restart docker", check=True)
    pid = main_pid(realos, "docker")
    run = realos.gpunode("install", "--only", "runtime", "--engine", "docker", timeout=1200,
                         stage="install --only runtime --engine docker")
    assert run.rc == 0, run.out + run.err
    assert main_pid(realos, "docker") not in (0, pid), "dockerd was not restarted"
    runtimes = json.loads(realos.ssh("docker info --format '{{json .Runtimes}}'"))
    assert "nvidia" in runtimes, runtimes
    written = json.loads(realos.ssh("cat /etc/docker/daemon.json"))
    for key, value in USER_DAEMON_JSON.items():
        assert written[key] == value
    assert written["runtimes"]["nvidia"]["path"] == "nvidia-container-runtime"


def test_runtime_for_containerd_shows_in_config_dump(realos):
    pid = main_pid(realos, "containerd")
    run = realos.gpunode("install", "--only", "runtime", "--engine", "containerd", timeout=1200,
                         stage="install --only runtime --engine containerd")
    assert run.rc == 0, run.out + run.err
    assert main_pid(realos, "containerd") not in (0, pid), "containerd was not restarted"
    dump = realos.ssh("containerd config dump")
    assert 'runtimes.nvidia]' in dump, dump
    assert 'BinaryName = "/usr/bin/nvidia-container-runtime"' in dump


def test_doctor_on_the_configured_node(realos):
    run = realos.gpunode("doctor", "--json", stage="doctor")
    checks = {c["id"]: c["status"] for c in run.json()["checks"]}
    # everything gpunode did on this guest passes; the one failure is the driver the tier cannot install
    for check_id in ("hw.gpu-present", "kernel.nouveau-loaded", "kernel.nouveau-blacklisted",
                     "kernel.nouveau-initramfs", "kernel.headers", "container.engine-present",
                     "container.toolkit-installed", "container.docker-nvidia-runtime",
                     "container.containerd-nvidia-runtime"):
        assert checks[check_id] == "pass", (check_id, checks[check_id])
    # the failures: the driver the tier cannot install, and the stand-in GPU's BARs. QEMU's edu device plays the T4
    # (see README: the GPU) and has one 1 MiB BAR and no BAR1; in a KVM guest that is exactly what a passed-through
    # GPU whose large BAR the firmware could not place looks like, so doctor's passthrough check says so
    assert sorted(i for i, status in checks.items() if status == "fail") == ["driver.loaded", "hw.passthrough-bars"]
    bars = next(c for c in run.json()["checks"] if c["id"] == "hw.passthrough-bars")
    assert "BAR" in bars["evidence"] and bars["fix"], bars
    assert run.rc == 1


def test_second_run_changes_nothing_and_restarts_nothing(realos):
    before = realos.ssh(FINGERPRINT)
    boot = realos.vm.boot_id()
    run = realos.gpunode("install", "--only", "nouveau", "--only", "prerequisites", "--only", "toolkit",
                         "--only", "runtime", "--driver", DRIVER, "--reboot", timeout=1800,
                         stage="second install run (must change nothing)")
    assert run.rc == 0, run.out + run.err
    assert realos.vm.boot_id() == boot
    assert realos.ssh(FINGERPRINT) == before
    plan = realos.gpunode("plan", "--json", "--only", "nouveau", "--only", "prerequisites", "--only", "toolkit",
                          "--only", "runtime", "--driver", DRIVER)
    statuses = {s["step"]: s["status"] for s in plan.json()["steps"]}
    assert set(statuses.values()) == {"ok"}, statuses


def test_no_traceback_in_any_run(realos):
    assert realos.runs, "no gpunode run was made"
    assert [r.argv for r in realos.runs if "Traceback" in r.err] == []
