"""The fake NVIDIA .run driver installer: a real makeself archive running the simulated nvidia-installer."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ERRORS = Path(__file__).parent / "data" / "errors"
RUN = "/root/NVIDIA-Linux-x86_64-{v}.run"


def _put(node, run_path: Path, version: str) -> str:
    dest = RUN.format(v=version)
    node.write(dest, run_path.read_bytes(), 0o755)
    return dest


def test_makeself_check_on_the_host(fake_driver_run):
    good = fake_driver_run("535.129.03")
    bad = fake_driver_run("535.129.03", corrupt=True)
    res = subprocess.run(["sh", str(good), "--check"], capture_output=True, text=True)
    assert res.returncode == 0 and "All good." in res.stdout
    res = subprocess.run(["sh", str(bad), "--check"], capture_output=True, text=True)
    assert res.returncode == 2 and "Error in MD5 checksums" in res.stderr
    res = subprocess.run(["sh", str(good), "--info"], capture_output=True, text=True)
    assert "Identification: NVIDIA Accelerated Graphics Driver for Linux-x86_64 535.129.03" in res.stdout


def test_check_and_corrupt_archive_on_the_node(sim_node, fake_driver_run):
    node = sim_node("ubuntu-22.04-t4", nouveau_loaded=False)
    good = _put(node, fake_driver_run("535.129.03"), "535.129.03")
    node.write("/root/bad.run", fake_driver_run("535.129.03", corrupt=True).read_bytes(), 0o755)
    rc, out, err = node.ssh(f"sh {good} --check")
    assert rc == 0 and "All good." in out
    rc, out, err = node.ssh("sh /root/bad.run --check")
    assert rc == 2 and "Error in MD5 checksums" in err
    rc, out, err = node.ssh("sh /root/bad.run --silent")
    assert rc == 2 and node.driver() is None


def test_nouveau_loaded_fails_with_the_real_text(sim_node, fake_driver_run):
    node = sim_node("ubuntu-22.04-t4")
    run = _put(node, fake_driver_run("535.129.03"), "535.129.03")
    rc, out, err = node.ssh(f"sh {run} --silent --dkms")
    assert rc == 1
    assert (ERRORS / "nvidia-installer_nouveau-in-use_installation-failed.txt").read_text().strip() in err
    assert node.driver() is None and not node.exists("/usr/bin/nvidia-smi")
    log = node.read("/var/log/nvidia-installer.log")
    assert log.startswith("nvidia-installer log file '/var/log/nvidia-installer.log'\ncreation time: ")
    assert "installer version: 535.129.03" in log and "    --silent\n    --dkms\n" in log
    assert "The Nouveau kernel driver is currently in use" in log
    assert node.calls("nvidia-installer") == [["nvidia-installer", "--silent", "--dkms"]]


def test_missing_kernel_headers(sim_node, fake_driver_run):
    node = sim_node("rocky-9-t4", nouveau_loaded=False, kernel_headers=False)
    run = _put(node, fake_driver_run("550.127.05"), "550.127.05")
    rc, out, err = node.ssh(f"sh {run} --silent")
    assert rc == 1
    assert "ERROR: Unable to find the kernel source tree for the currently running kernel." in err
    node.add_kernel_headers()
    rc, out, err = node.ssh(f"sh {run} --silent")
    assert rc == 0, err


def test_remove_kernel_headers_setter(sim_node, fake_driver_run):
    node = sim_node("ubuntu-24.04-t4", nouveau_loaded=False)
    node.remove_kernel_headers()
    assert f"linux-headers-{node.kernel}" not in node.installed_packages()
    run = _put(node, fake_driver_run("550.127.05"), "550.127.05")
    assert node.ssh(f"sh {run} --silent")[0] == 1


def test_successful_install_and_nvidia_smi(sim_node, fake_driver_run):
    node = sim_node("ubuntu-22.04-t4", nouveau_loaded=False)
    run = _put(node, fake_driver_run("535.129.03"), "535.129.03")
    rc, out, err = node.ssh("nvidia-smi")
    assert rc == 127  # not installed: command not found
    rc, out, err = node.ssh(f"sh {run} --silent --tmpdir=/var/tmp --no-questions --ui=none --accept-license")
    assert rc == 0, err
    assert "Uncompressing NVIDIA Accelerated Graphics Driver for Linux-x86_64 535.129.03" in out
    assert node.driver()["version"] == "535.129.03" and node.driver()["flavor"] == "proprietary"
    assert node.driver()["method"] == "run" and node.driver()["dkms"] == "0"
    assert node.read("/proc/driver/nvidia/version") == (
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.129.03  Thu Oct 19 18:56:32 UTC 2023\n"
        "GCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)\n")
    rc, out, _ = node.ssh("nvidia-smi --query-gpu=name,driver_version,pci.bus_id,uuid --format=csv")
    assert rc == 0
    assert out == ("name, driver_version, pci.bus_id, uuid\n"
                   f"Tesla T4, 535.129.03, 00000000:00:1E.0, {node.gpu_uuids[0]}\n")
    assert "-> Using temporary directory /var/tmp" in node.read("/var/log/nvidia-installer.log")
    assert node.ssh("nvidia-installer --version")[1].strip().startswith("nvidia-installer:  version 535.129.03")


def test_open_modules_dkms_and_tmpdir(sim_node, fake_driver_run):
    node = sim_node("ubuntu-24.04-h100x8", nouveau_loaded=False, extra_packages=("dkms",))
    run = _put(node, fake_driver_run("550.127.05"), "550.127.05")
    rc, _, err = node.ssh(f"sh {run} --silent --tmpdir=/nonexistent")
    assert rc == 1 and "/nonexistent" in err
    rc, out, err = node.ssh(f"sh {run} --silent --dkms -m=kernel-open --tmpdir=/var/tmp")
    assert rc == 0, err
    assert node.driver()["flavor"] == "open" and node.driver()["dkms"] == "1"
    assert node.read("/proc/driver/nvidia/version").startswith(
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.127.05  Release Build")
    assert node.ssh("dkms status")[1] == "nvidia/550.127.05, 6.8.0-45-generic, x86_64: installed\n"
    # the real installer's default flips to the open modules at 560
    run2 = _put(node, fake_driver_run("570.133.07"), "570.133.07")
    assert node.ssh(f"sh {run2} --silent -M=proprietary")[0] == 0
    assert node.driver()["flavor"] == "proprietary"
    assert node.ssh(f"sh {run2} --silent")[0] == 0
    assert node.driver()["flavor"] == "open"


def test_blackwell_needs_open_modules(sim_node, fake_driver_run):
    node = sim_node("ubuntu-24.04-b200x8", nouveau_loaded=False)
    run = _put(node, fake_driver_run("570.133.07"), "570.133.07")
    rc, _, err = node.ssh(f"sh {run} --silent -m=kernel")
    assert rc == 1 and "ERROR: Unable to load the kernel module 'nvidia.ko'." in err
    assert "'/var/log/nvidia-installer.log'" in err
    rc, _, err = node.ssh(f"sh {run} --silent -m=kernel-open")
    assert rc == 0, err
    old = _put(node, fake_driver_run("535.129.03"), "535.129.03")
    assert node.ssh(f"sh {old} --silent -m=kernel-open")[0] == 1  # B200 is newer than R535


def test_secure_boot_needs_signing_keys_and_enrolment(sim_node, fake_driver_run):
    node = sim_node("ubuntu-22.04-t4", secure_boot=True,
                    cmdline="BOOT_IMAGE=/vmlinuz root=/dev/vda1 ro modprobe.blacklist=nouveau")
    run = _put(node, fake_driver_run("550.127.05"), "550.127.05")
    rc, _, err = node.ssh(f"sh {run} --silent")
    assert rc == 1
    assert (ERRORS / "nvidia-installer_unable-to-load-nvidia.ko_390.46.txt").read_text().splitlines()[0] in err
    node.write("/root/mok.priv", "private")
    node.write("/root/mok.der", "public")
    keys = "--module-signing-secret-key=/root/mok.priv --module-signing-public-key=/root/mok.der"
    rc, _, err = node.ssh(f"sh {run} --silent {keys}")
    assert rc == 1  # signed, but the key is not enrolled
    rc, _, err = node.ssh("mokutil --import /root/mok.der && mokutil --list-new")
    assert rc == 0
    node.reboot()  # the operator confirms the enrolment in MokManager
    rc, _, err = node.ssh(f"sh {run} --silent {keys}")
    assert rc == 0, err
    assert "nvidia" in node.loaded_modules()
    node.reboot()
    assert "nvidia" in node.loaded_modules()


def test_installer_refusals(sim_node, fake_driver_run):
    node = sim_node("debian-12-t4", nouveau_loaded=False)
    run = _put(node, fake_driver_run("535.129.03"), "535.129.03")
    rc, _, err = node.ssh(f"sh {run} --frobnicate")
    assert rc == 1 and 'unrecognized option: "--frobnicate"' in err
    rc, _, err = node.ssh(f"sh {run}")  # no terminal, no --silent
    assert rc == 1 and node.driver() is None
    # a distribution package driver is detected
    node.install_package("nvidia-kernel-dkms")
    rc, _, err = node.ssh(f"sh {run} --silent")
    assert rc == 1 and "An alternate method of installing the NVIDIA driver was detected" in err


def test_uninstall_and_running_driver(sim_node, fake_driver_run):
    node = sim_node("ubuntu-22.04-t4", nouveau_loaded=False)
    run = _put(node, fake_driver_run("535.129.03"), "535.129.03")
    assert node.ssh(f"sh {run} --silent")[0] == 0
    node.set_unit("nvidia-persistenced", active="active", enabled="enabled")
    run2 = _put(node, fake_driver_run("550.127.05"), "550.127.05")
    rc, _, err = node.ssh(f"sh {run2} --silent")
    assert rc == 1 and "An NVIDIA kernel module 'nvidia-drm' appears to already be loaded" in err
    node.set_unit("nvidia-persistenced", active="inactive")
    assert node.ssh(f"sh {run2} --silent")[0] == 0
    assert node.ssh("nvidia-smi -L")[0] == 0
    rc, _, err = node.ssh("nvidia-uninstall --silent")
    assert rc == 0, err
    assert node.driver() is None and "nvidia" not in node.loaded_modules()
    assert not node.exists("/usr/bin/nvidia-smi")


def test_upgrade_without_reload_gives_version_mismatch(sim_node):
    node = sim_node("ubuntu-22.04-t4", preinstalled_driver="535.129.03")
    assert node.ssh("nvidia-smi -L")[0] == 0
    node.write("/var/lib/nodesim/driver.env",
               node.read("/var/lib/nodesim/driver.env").replace("535.129.03", "570.124.04"))
    rc, out, _ = node.ssh("nvidia-smi")
    assert rc == 18
    assert out == "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 570.124\n"
