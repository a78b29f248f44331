"""The real-OS tier, second VM: Debian's packaged NVIDIA driver (non-free, R535), installed by real apt and dpkg
with the real DKMS build of the real kernel modules for the VM's kernel (done at image build time, in the image's
chroot at native speed: build_image.sh nvidia), on a machine with NO NVIDIA GPU. Real nvidia-smi, nvidia-modprobe,
nvidia-persistenced, libnvidia-ml; Debian's names (nvidia-current.ko, /usr/lib/x86_64-linux-gnu/nvidia/current,
the `nvidia` alternative). Tests run in file order on one VM.

Every text the real programs print is captured (GPUNODE_REALOS_CAPTURE=DIR writes them there; the copies under
tests/fixtures/real/debian-nvidia are Debian's and NVIDIA's output) and `explain` must recognise each."""

from __future__ import annotations

import os
import re
import shlex
import time
from pathlib import Path

import pytest

from gpunode.explain import explain

pytestmark = [pytest.mark.realos]

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "real" / "debian-nvidia"
# what explain must say about each real text (detector ids): the fixture test (tests/explain) reads the same table
EXPECTED = {
    "modprobe-nvidia.txt": "debian.nvidia-current-insert-failed",
    "dmesg-modprobe-nvidia.txt": "kernel.no-nvidia-device",
    "nvidia-smi.txt": "smi.no-driver-communication",
    "nvidia-persistenced-journal.txt": "persistenced.no-devices",
}
FINGERPRINT = (
    "{ find /etc /boot /lib/modules -xdev -type f -print0 | sort -z | xargs -0 sha256sum; "
    "find /etc /boot /lib/modules -xdev -type l -printf '%p -> %l\\n' | sort; } | sha256sum; "
    "sha256sum /var/lib/dpkg/status; dkms status"
)
CAPTURED: dict[str, str] = {}


def capture(name: str, text: str) -> str:
    CAPTURED[name] = text
    where = os.environ.get("GPUNODE_REALOS_CAPTURE")
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        (Path(where) / name).write_text(text)
    return text


def sh(realnv, command: str) -> tuple[int, str]:
    """A guest command's exit status and its stdout+stderr as one text (as a person sees it)."""
    done = realnv.vm.ssh(f"{{ {command} ; }} 2>&1", timeout=600)
    return done.rc, done.out


def test_debian_packaged_driver_is_really_installed(realnv):
    realnv.vm.wait_booted()
    kernel = realnv.ssh("uname -r").strip()
    realnv.kernel = kernel
    packages = realnv.ssh("dpkg-query -W -f '${Package} ${Version} ${Status}\\n' 'nvidia-*' 'libnvidia-*' "
                          "'firmware-nvidia-*' | grep ' installed$' | cut -d' ' -f1,2")
    capture("dpkg-query.txt", packages)
    versions = dict(line.split() for line in packages.splitlines())
    assert {"nvidia-kernel-dkms", "nvidia-smi", "libnvidia-ml1", "nvidia-modprobe", "nvidia-persistenced",
            "firmware-nvidia-gsp"} <= set(versions), versions
    realnv.version = re.match(r"\d+\.\d+\.\d+", versions["nvidia-kernel-dkms"]).group(0)
    dkms = capture("dkms-status.txt", realnv.ssh("dkms status"))
    assert f"nvidia-current/{realnv.version}, {kernel}, x86_64: installed" in dkms
    names = capture("modinfo-name.txt", realnv.ssh(
        f"for f in /lib/modules/{kernel}/updates/dkms/*.ko*; do echo \"$f $(modinfo -F name $f)\"; done"))
    assert f"/lib/modules/{kernel}/updates/dkms/nvidia-current.ko nvidia" in names
    assert re.search(r"nvidia-current-uvm\.ko nvidia.uvm$", names, re.M), names
    capture("update-alternatives-nvidia.txt", realnv.ssh("update-alternatives --query nvidia"))
    capture("modprobe-d-nvidia.txt", realnv.ssh("cat /etc/modprobe.d/nvidia*.conf"))
    libs = realnv.ssh("ls /usr/lib/x86_64-linux-gnu/nvidia/current/")
    assert f"libnvidia-ml.so.{realnv.version}" in libs.split()


def test_real_texts_without_a_gpu(realnv):
    """What the real programs say on a machine with no NVIDIA GPU, each recognised by explain."""
    started = time.monotonic()
    realnv.ssh("dmesg -C")
    rc, out = sh(realnv, "modprobe nvidia")
    assert rc != 0
    capture("modprobe-nvidia.txt", out)
    dmesg = capture("dmesg-modprobe-nvidia.txt", realnv.ssh("dmesg | grep -E 'NVRM|nvidia' || true"))
    assert "NVRM" in dmesg, dmesg
    rc, out = sh(realnv, "nvidia-smi")
    assert rc != 0
    capture("nvidia-smi.txt", out)
    rc, out = sh(realnv, "systemctl restart nvidia-persistenced")
    capture("nvidia-persistenced-start.txt", out)
    journal = capture("nvidia-persistenced-journal.txt",
                      realnv.ssh("journalctl -b -u nvidia-persistenced -o cat --no-pager | grep -v '^Started\\|^Starting'"
                                 " || true"))
    assert "nvidia-persistenced" in journal or journal.strip(), journal
    rc, out = sh(realnv, "nvidia-modprobe -u -c=0; echo exit=$?")
    capture("nvidia-modprobe.txt", out)
    realnv.stage("nvidia VM: real texts without a GPU", time.monotonic() - started)
    for name, detector in EXPECTED.items():
        found = [f.id for f in explain(CAPTURED[name])]
        assert detector in found, (name, CAPTURED[name], found)


def test_facts_read_the_packaged_driver(realnv):
    run = realnv.gpunode("facts", stage="nvidia VM: facts")
    assert run.rc == 0, run.err
    driver = run.json()["facts"]["driver"]
    module = driver["driver_module"]
    assert module["version"] == realnv.version and module["flavour"] == "proprietary"
    assert module["filename"].endswith("/updates/dkms/nvidia-current.ko")
    names = driver["driver_debian_names"]
    assert names[0] == "/usr/lib/nvidia/current"
    assert [f"/lib/modules/{realnv.kernel}/updates/dkms/nvidia-current.ko", "nvidia"] in names[1]
    libs, installer = driver["driver_userspace"]
    assert libs == [realnv.version] and installer is None
    packages = dict(driver["driver_packages"])
    assert packages["nvidia-kernel-dkms"].startswith(realnv.version)
    kernels = run.json()["facts"]["health"]["doctor_kernels"]
    running = [k for k in kernels["kernels"] if k["name"] == realnv.kernel]
    assert running and running[0]["module"].endswith("nvidia-current.ko"), kernels


def test_plan_and_install_refuse_a_run_over_the_packaged_driver(realnv):
    before = realnv.ssh(FINGERPRINT)
    plan = realnv.gpunode("plan", "--json", "--driver", "550.54.15")
    steps = {s["step"]: s for s in plan.json()["steps"]}
    driver = steps["driver"]
    assert driver["status"] == "blocked" and "would mix two drivers" in driver["reason"], driver
    assert f"driver {realnv.version} from distribution packages" in driver["reason"]
    realnv.fix = driver["fix"]
    run = realnv.gpunode("install", "--only", "driver", "--driver", "550.54.15",
                         stage="nvidia VM: install --driver refused")
    assert run.rc != 0 and "would mix two drivers" in " ".join((run.out + run.err).split())
    quiet = {s["step"]: s for s in realnv.gpunode("plan", "--json").json()["steps"]}["driver"]
    assert quiet["status"] == "ok" and "left as it is" in quiet["reason"], quiet
    assert realnv.ssh(FINGERPRINT) == before


def test_doctor_verdicts_on_the_packaged_driver(realnv):
    run = realnv.gpunode("doctor", "--json", stage="nvidia VM: doctor")
    checks = {c["id"]: c for c in run.json()["checks"]}
    loaded = checks["driver.loaded"]
    assert loaded["status"] == "skip" and f"built for kernel {realnv.kernel}" in loaded["evidence"], loaded
    assert "no NVIDIA GPU" in loaded["evidence"]
    assert checks["driver.single-source"]["status"] == "pass", checks["driver.single-source"]
    assert checks["kernel.headers"]["status"] == "pass", checks["kernel.headers"]
    newest = checks["kernel.dkms-newest-kernel"]
    assert newest["status"] == "pass" and "nvidia-current" in newest["evidence"], newest
    assert checks["hw.gpu-present"]["status"] == "fail"


def test_nodesettings_and_debian_module_names(realnv):
    """nodesettings loads nvidia-uvm by that name (modules-load.d, modprobe): Debian's modprobe configuration must
    resolve it to nvidia-current-uvm.ko; without a GPU the step has nothing to do."""
    resolved = realnv.ssh("modprobe --show-depends nvidia-uvm 2>&1 || true")
    capture("modprobe-show-depends-nvidia-uvm.txt", resolved)
    assert "nvidia-current-uvm.ko" in resolved, resolved
    plan = {s["step"]: s for s in realnv.gpunode("plan", "--json", "--only", "nodesettings").json()["steps"]}
    assert plan["nodesettings"]["status"] == "ok", plan


def test_uninstall_leaves_a_driver_it_did_not_install(realnv):
    before = realnv.ssh(FINGERPRINT)
    run = realnv.gpunode("uninstall", "--yes", stage="nvidia VM: uninstall")
    assert run.rc in (0, 1), run.out + run.err
    assert realnv.ssh(FINGERPRINT) == before


def test_the_printed_fix_removes_the_packaged_driver(realnv):
    """The fix the refusal printed, run as printed, really removes Debian's driver (DKMS tree, module files);
    after it the .run path is refused only for the missing GPU."""
    command = realnv.fix.split("  #")[0]
    started = time.monotonic()
    realnv.ssh(f"DEBIAN_FRONTEND=noninteractive sh -c {shlex.quote(command)}", timeout=1200)
    realnv.stage("nvidia VM: the printed purge fix", time.monotonic() - started)
    assert "nvidia-current" not in realnv.ssh("dkms status")
    assert realnv.ssh(f"ls /lib/modules/{realnv.kernel}/updates/dkms/ 2>/dev/null || true").strip() == ""
    driver = {s["step"]: s for s in realnv.gpunode("plan", "--json", "--driver", "550.54.15").json()["steps"]}["driver"]
    assert driver["status"] == "blocked" and "no NVIDIA GPU" in driver["reason"], driver
