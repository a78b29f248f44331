"""The real-OS tier, second VM: Debian's packaged NVIDIA driver (non-free, R535), installed by real apt and dpkg
with the real DKMS build of the real kernel modules for the VM's kernel (done at image build time, in the image's
chroot at native speed: build_image.sh OUT nvidia), on a machine with NO NVIDIA GPU. Real nvidia-smi,
nvidia-modprobe, nvidia-persistenced, libnvidia-ml; Debian's names (nvidia-current.ko, /usr/lib/x86_64-linux-gnu/
nvidia/current, the `nvidia` alternative). Tests run in file order on one VM: first the compute-only set as the
image has it, then with libcuda1 (real apt through the relay), then the refusal's fix run as printed. The whole
file runs once per flavour of the kernel modules: the proprietary ones (image "nvidia"), then the open ones
(image "nvidia-open", nvidia-open-kernel-dkms, derived from the nvidia image's tree); the open flavour's texts
are kept with the flavour in their names (fixture_name).

Every text the real programs print is captured (GPUNODE_REALOS_CAPTURE=DIR writes them there; the copies in
tests/fixtures/real/debian-nvidia are Debian's and NVIDIA's output) and explain must recognise each, by the same
table the fixture test reads (expected-explain.csv)."""

from __future__ import annotations

import csv
import os
import re
import shlex
import time
from pathlib import Path

import pytest

from gpunode.explain import explain

pytestmark = [pytest.mark.realos]

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "real" / "debian-nvidia"
EXPECTED = {row["file"]: row["detector"] for row in
            csv.DictReader((FIXTURES / "expected-explain.csv").open(encoding="utf-8", newline=""))}
# everything a gpunode run could change: /etc, /boot, the modules trees, the dpkg database, DKMS's state
FINGERPRINT = (
    "{ find /etc /boot /lib/modules -xdev -type f -print0 | sort -z | xargs -0 sha256sum; "
    "find /etc /boot /lib/modules -xdev -type l -printf '%p -> %l\\n' | sort; } | sha256sum; "
    "sha256sum /var/lib/dpkg/status; dkms status"
)
RUN_DRIVER = "550.54.15"  # any .run version: the plan must refuse it before anything is fetched
NODE: dict[str, str] = {}  # what the first test learns for the VM under test: kernel, version
CAPTURE_DIR = os.environ.get("GPUNODE_REALOS_CAPTURE")  # read at import: tests/conftest.py clears GPUNODE_* per test
# each image's flavour of the kernel modules, the package that builds them (build_image.sh) and Debian's name of
# the DKMS module and of the module files (nvidia-current.ko, nvidia-current-uvm.ko, ...)
FLAVOUR = {"nvidia": ("proprietary", "nvidia-kernel-dkms", "nvidia-current"),
           "nvidia-open": ("open", "nvidia-open-kernel-dkms", "nvidia-current-open")}
# the value of Debian's `nvidia` alternative: each flavour's kernel-support package registers its own directory
ALTERNATIVE = {"nvidia": "/usr/lib/nvidia/current", "nvidia-open": "/usr/lib/nvidia/current-open"}


def fixture_name(realnv, name: str) -> str:
    """The fixture file of a text: the proprietary flavour's keep their names, the others' carry the flavour."""
    flavour = FLAVOUR[realnv.variant][0]
    if flavour == "proprietary":
        return name
    stem, dot, ext = name.partition(".")
    return f"{stem}_{flavour}{dot}{ext}"


def capture(realnv, name: str, text: str) -> str:
    file = fixture_name(realnv, name)
    if CAPTURE_DIR:
        Path(CAPTURE_DIR).mkdir(parents=True, exist_ok=True)
        (Path(CAPTURE_DIR) / file).write_text(text)
    if name in EXPECTED:  # the same cause whatever the flavour
        found = [f.id for f in explain(text)]
        assert found and found[0] == EXPECTED[name], (file, text, found)
    return text


def sh(realnv, command: str) -> tuple[int, str]:
    """A guest command's exit status and its stdout+stderr as one text (as a person sees it)."""
    done = realnv.vm.ssh(f"{{ {command} ; }} 2>&1", timeout=900)
    return done.rc, done.out


def persistenced_journal(realnv) -> str:
    """The last failed start of nvidia-persistenced, as journalctl prints it (-o cat)."""
    since = realnv.ssh("date +%s").strip()
    sh(realnv, "sleep 1; systemctl reset-failed nvidia-persistenced; systemctl restart nvidia-persistenced")
    return realnv.ssh(f"journalctl -u nvidia-persistenced --no-pager -o cat --since @{since}")


def test_debian_packaged_driver_is_really_installed(realnv):
    realnv.vm.wait_booted()  # degraded: nvidia-persistenced's unit fails at boot (no GPU)
    assert realnv.ssh("systemctl --failed --no-legend --plain | cut -d' ' -f1").split() == \
        ["nvidia-persistenced.service"]
    NODE["kernel"] = kernel = realnv.ssh("uname -r").strip()
    # the open image boots the kernel of bookworm's point release once, its own (bookworm-security's) stays installed
    # as the boot default: nvidia-open.sh
    once = realnv.ssh("cat /etc/realos-boot-once 2>/dev/null || true").strip()
    NODE["second"] = ""
    if realnv.variant == "nvidia-open":
        assert once == kernel, (once, kernel)
        others = realnv.ssh("ls /boot | sed -n 's/^vmlinuz-//p'").split()
        NODE["second"] = next(k for k in others if k != kernel)
    else:
        assert once == ""
    packages = dict(line.split() for line in realnv.ssh(
        "dpkg-query -W -f '${Package} ${Version} ${db:Status-Status}\\n' 'nvidia-*' 'libnvidia-*' libcuda1 "
        "'firmware-nvidia-*' | awk '$3 == \"installed\" { print $1, $2 }'").splitlines())
    flavour, dkms_package, base = FLAVOUR[realnv.variant]
    assert {dkms_package, "nvidia-smi", "libnvidia-ml1", "nvidia-modprobe", "nvidia-persistenced",
            "firmware-nvidia-gsp"} <= set(packages), packages
    other = {"nvidia-kernel-dkms", "nvidia-open-kernel-dkms"} - {dkms_package}
    assert not other & set(packages), packages
    assert "libcuda1" not in packages
    NODE["version"] = version = re.match(r"\d+\.\d+\.\d+", packages[dkms_package]).group(0)
    dkms = capture(realnv, "dkms-status.txt", realnv.ssh("dkms status"))
    assert f"{base}/{version}, {kernel}, x86_64: installed" in dkms, dkms
    names = capture(realnv, "modinfo-F-name.txt", realnv.ssh(
        f"for f in /lib/modules/{kernel}/updates/dkms/*.ko; do echo \"$f $(modinfo -F name $f)\"; done"))
    assert f"/lib/modules/{kernel}/updates/dkms/{base}.ko nvidia\n" in names, names
    assert f"/lib/modules/{kernel}/updates/dkms/{base}-uvm.ko nvidia_uvm\n" in names, names
    assert f"Value: {ALTERNATIVE[realnv.variant]}\n" in capture(realnv, "update-alternatives-query-nvidia.txt",
                                                               realnv.ssh("update-alternatives --query nvidia"))
    assert f"libnvidia-ml.so.{version}" in realnv.ssh("ls /usr/lib/x86_64-linux-gnu/nvidia/current/").split()


def test_real_texts_of_the_compute_only_set(realnv):
    """Without libcuda1, Debian's modprobe configuration and library path (glx alternative) are not linked in."""
    started = time.monotonic()
    rc, out = sh(realnv, "modprobe nvidia")
    assert rc != 0 and "Module nvidia not found" in capture(realnv, "modprobe-nvidia_without-libcuda1.txt", out)
    rc, out = sh(realnv, "modprobe nvidia-uvm")
    assert rc != 0 and capture(realnv, "modprobe-nvidia-uvm_without-libcuda1.txt", out)
    rc, out = sh(realnv, "modinfo nvidia")
    assert rc != 0 and "Module nvidia not found" in capture(realnv, "modinfo-nvidia.txt", out)
    journal = capture(realnv, "journal_nvidia-persistenced_without-libcuda1.txt", persistenced_journal(realnv))
    assert "nvidia-persistenced failed to initialize" in journal
    rc, out = sh(realnv, "nvidia-smi")
    assert rc == 9 and capture(realnv, "nvidia-smi_no-gpu.txt", out)
    out = capture(realnv, "nvidia-modprobe_no-gpu.txt", realnv.ssh(
        'for c in "nvidia-modprobe -u -c=0" "nvidia-modprobe -c=0"; do echo "# $c"; $c 2>&1; echo "exit $?"; done'))
    assert out.count("exit 1") == 2 and len(out.splitlines()) == 4, out  # silent, exit 1
    realnv.stage(f"{realnv.label}real texts (compute-only set)", time.monotonic() - started)


def test_facts_read_the_packaged_driver(realnv):
    run = realnv.gpunode("facts", stage=f"{realnv.label}facts")
    assert run.rc == 0, run.err
    parsed = run.json()["facts"]
    driver = {name: value.get("value") for name, value in parsed["driver"].items()}  # file facts have none
    module = driver["driver_module"]
    flavour, dkms_package, base = FLAVOUR[realnv.variant]
    assert (module["version"], module["flavour"]) == (NODE["version"], flavour)
    assert module["filename"] == f"/lib/modules/{NODE['kernel']}/updates/dkms/{base}.ko"
    names = driver["driver_debian_names"]
    assert names["alternative"] == ALTERNATIVE[realnv.variant]
    assert [f"/lib/modules/{NODE['kernel']}/updates/dkms/{base}.ko", "nvidia"] in names["module_files"]
    libs, installer = driver["driver_userspace"]
    assert libs == [NODE["version"]] and installer is None
    assert dict(driver["driver_packages"])[dkms_package].startswith(NODE["version"])
    kernels = parsed["kernel"]["doctor_kernels"]["value"]
    running = [k for k in kernels["kernels"] if k["name"] == NODE["kernel"]]
    assert running and running[0]["module"].endswith(f"/{base}.ko"), kernels
    assert {"module": base, "version": NODE["version"], "kernel": NODE["kernel"],
            "status": "installed"} in kernels["dkms"]


def test_plan_and_install_refuse_a_run_over_the_packaged_driver(realnv):
    before = realnv.ssh(FINGERPRINT)
    plan = realnv.gpunode("plan", "--json", "--driver", RUN_DRIVER)
    driver = {s["step"]: s for s in plan.json()["steps"]}["driver"]
    assert driver["status"] == "blocked" and "would mix two drivers" in driver["reason"], driver
    assert f"driver {NODE['version']} from distribution packages" in driver["reason"]
    NODE["fix"] = driver["fix"]
    assert FLAVOUR[realnv.variant][1] in driver["fix"].split(), driver["fix"]  # purges this flavour's package
    run = realnv.gpunode("install", "--only", "driver", "--driver", RUN_DRIVER,
                         stage=f"{realnv.label}install --driver (refused)")
    assert run.rc != 0 and "would mix two drivers" in " ".join((run.out + run.err).split())
    quiet = {s["step"]: s for s in realnv.gpunode("plan", "--json").json()["steps"]}["driver"]
    assert quiet["status"] == "ok" and "left as it is" in quiet["reason"], quiet
    assert realnv.ssh(FINGERPRINT) == before


def test_doctor_verdicts_on_the_packaged_driver(realnv):
    run = realnv.gpunode("doctor", "--json", stage=f"{realnv.label}doctor")
    checks = {c["id"]: c for c in run.json()["checks"]}
    loaded = checks["driver.loaded"]
    assert loaded["status"] == "skip", loaded
    assert f"built for kernel {NODE['kernel']}" in loaded["evidence"] and "no NVIDIA GPU" in loaded["evidence"]
    assert "`modprobe nvidia` would not find it" in loaded["evidence"]  # no libcuda1 yet (prose: not an ssh line)
    assert checks["driver.single-source"]["status"] == "pass", checks["driver.single-source"]
    assert checks["kernel.headers"]["status"] == "pass", checks["kernel.headers"]
    newest = checks["kernel.dkms-newest-kernel"]
    if not NODE["second"]:  # the open image's next boot runs its second kernel: test_a_second_kernel_...
        assert newest["status"] == "pass" and newest["evidence"].endswith(f"/{FLAVOUR[realnv.variant][2]}.ko"), newest
    assert checks["hw.gpu-present"]["status"] == "fail" and run.rc == 1


def test_nodesettings_and_uninstall_leave_the_packaged_driver_alone(realnv):
    before = realnv.ssh(FINGERPRINT)
    plan = {s["step"]: s for s in realnv.gpunode("plan", "--json", "--only", "nodesettings").json()["steps"]}
    assert plan["nodesettings"]["status"] == "ok", plan
    run = realnv.gpunode("uninstall", stage=f"{realnv.label}uninstall")
    assert run.rc in (0, 1), run.out + run.err
    assert realnv.ssh(FINGERPRINT) == before


def test_a_second_kernel_whose_dkms_build_failed(realnv):
    """The open image (nvidia-open.sh): the headers of a second kernel, bookworm-security's, were installed after
    the open modules, as a kernel update brings them; DKMS's header hook built for it and the real build failed
    (535.261.03's sources against that kernel's pci_resize_resource), dpkg left the headers half-configured. That
    kernel is the boot default, so the next boot comes up without the driver: doctor reads the real DKMS state and
    says so, naming the failed build; the plan leaves a driver it did not install alone."""
    if not NODE["second"]:
        pytest.skip(f"the {realnv.variant} image has one kernel (the second kernel is in the nvidia-open image)")
    first, second = NODE["kernel"], NODE["second"]
    log = capture(realnv, "apt-get-install-linux-headers_second-kernel.txt",
                  realnv.ssh("cat /var/log/realos/second-kernel-headers.log"))
    assert f"Bad return status for module build on kernel: {second}" in log and log.rstrip().endswith("exit 100"), log
    make_log = f"/var/lib/dkms/{FLAVOUR[realnv.variant][2]}/{NODE['version']}/build/make.log"
    errors = capture(realnv, "dkms-make-log_second-kernel_errors.txt", realnv.ssh(
        f"head -n 1 {make_log}; grep -E ': (error|fatal error): ' {make_log}"))
    assert f"for kernel {second} (x86_64)" in errors.splitlines()[0] and ": error: " in errors, errors
    assert realnv.ssh(f"dpkg-query -W -f '${{db:Status-Status}}' linux-headers-{second}") == "half-configured"
    dkms = realnv.ssh("dkms status")
    assert f", {first}, x86_64: installed" in dkms and second not in dkms, dkms
    grubenv = realnv.ssh("grub-editenv list")  # grub used up the one boot into the first kernel (save_env)
    assert [line for line in grubenv.splitlines() if line.startswith("next_entry=") and line != "next_entry="] == [], \
        grubenv
    doctor = {c["id"]: c for c in realnv.gpunode("doctor", "--json", stage=f"{realnv.label}doctor, second kernel")
              .json()["checks"]}
    newest = doctor["kernel.dkms-newest-kernel"]
    assert newest["status"] == "fail", newest
    assert f"the next boot runs {second} (running {first})" in newest["evidence"], newest
    assert "which has no nvidia module" in newest["evidence"], newest
    assert "pci_resize_resource" in newest["evidence"] and make_log in newest["evidence"], newest
    assert f"dkms autoinstall -k {second}" not in newest["fix"], newest  # the same build fails the same way
    assert f"linux-image-{second}" in newest["fix"], newest
    assert doctor["kernel.headers"]["status"] == "pass", doctor["kernel.headers"]
    plan = {s["step"]: s for s in realnv.gpunode("plan", "--json").json()["steps"]}
    assert plan["driver"]["status"] == "ok", plan["driver"]  # a packaged driver: gpunode builds nothing for it


def test_a_cuda_program_built_with_debians_nvcc(realnv):
    """realos-cuda-devices, built with Debian's nvcc 11.8 (nvidia-cuda-toolkit, non-free) at image build time:
    cudaGetDeviceCount with no libcuda1 and no GPU."""
    if realnv.variant != "nvidia-open":
        pytest.skip("the CUDA program is built into the nvidia-open image (nvidia-open.sh)")
    rc, out = sh(realnv, "ldd /usr/local/bin/realos-cuda-devices")
    assert rc == 0 and "libcudart" not in out, out  # nvcc links the CUDA runtime statically
    rc, out = sh(realnv, "realos-cuda-devices")
    assert rc == 1 and "cudaGetDeviceCount returned 35" in capture(realnv, "cuda-devices_without-libcuda1.txt", out)
    doctor = {c["id"]: c for c in realnv.gpunode("doctor", "--json").json()["checks"]}
    assert doctor["hw.gpu-present"]["status"] == "fail"


# apt in the open image would configure the second kernel's half-configured headers first: DKMS's build for it,
# under TCG, takes hours (and fails); the packages they install are the same for both flavours
APT_FREE = "apt in the open image first reruns the second kernel's failed DKMS build (hours under TCG)"


def test_with_libcuda1_the_install_hook_and_the_persistence_daemon_say_more(realnv):
    """explain's fix for the persistence daemon's libnvidia-cfg failure, run as printed (real apt through the
    relay): Debian then links its modprobe configuration, and the real texts change."""
    if NODE["second"]:
        pytest.skip(APT_FREE)
    fix = next(f.fix for f in explain((FIXTURES / "journal_nvidia-persistenced_without-libcuda1.txt").read_text())
               if f.id == "persistenced.no-libnvidia-cfg")
    started = time.monotonic()
    realnv.ssh("apt-get update -qq", timeout=900)
    realnv.ssh(f"DEBIAN_FRONTEND=noninteractive {fix.split('  #')[0].removeprefix('sudo ')}", timeout=1800)
    realnv.stage(f"{realnv.label}apt-get install libcuda1 (real apt, initramfs)", time.monotonic() - started)
    assert "install nvidia modprobe -i nvidia-current" in realnv.ssh("cat /etc/modprobe.d/nvidia.conf")
    realnv.ssh("dmesg -C")
    rc, out = sh(realnv, "modprobe nvidia")
    internal = FLAVOUR[realnv.variant][2].replace("-", "_")  # kmod's name of the renamed file: nvidia_current
    assert rc != 0 and f"could not insert '{internal}': No such device" in \
        capture(realnv, "modprobe-nvidia_with-libcuda1.txt", out)
    capture(realnv, "dmesg_modprobe-nvidia_no-gpu.txt", realnv.ssh("dmesg | grep -E 'NVRM|nvidia'"))
    capture(realnv, "journal_nvidia-persistenced_no-gpu.txt", persistenced_journal(realnv))
    doctor = {c["id"]: c for c in realnv.gpunode("doctor", "--json").json()["checks"]}
    assert "would not find it" not in doctor["driver.loaded"]["evidence"], doctor["driver.loaded"]


# the first purge fix left nvidia-persistenced, and apt satisfied it with nvidia-tesla-470-alternative; the fix
# purges nvidia-persistenced/nvidia-modprobe too (passed on the VM, 2026-11-24)
def test_the_printed_fix_removes_the_packaged_driver(realnv):
    """The refusal's fix, run as printed, really removes Debian's driver (DKMS tree, module files); after it a
    .run is refused only for the missing GPU."""
    if NODE["second"]:
        pytest.skip(APT_FREE)
    command = NODE["fix"].split("  #")[0]
    if command.startswith("ssh "):  # printed for a remote node: `ssh -t -F CONFIG realos "COMMAND"`
        command = shlex.split(command)[-1]
    assert command.startswith("sudo apt-get purge -y --allow-change-held-packages "), command
    started = time.monotonic()
    realnv.ssh(f"DEBIAN_FRONTEND=noninteractive sh -c {shlex.quote(command.replace('sudo ', ''))}", timeout=1800)
    realnv.stage(f"{realnv.label}the refusal's purge fix", time.monotonic() - started)
    assert "nvidia-current" not in realnv.ssh("dkms status")
    assert realnv.ssh(f"ls /lib/modules/{NODE['kernel']}/updates/dkms/ 2>/dev/null || true").strip() == ""
    driver = {s["step"]: s for s in
              realnv.gpunode("plan", "--json", "--driver", RUN_DRIVER).json()["steps"]}["driver"]
    assert driver["status"] == "blocked" and "no NVIDIA GPU" in driver["reason"], driver


def test_no_traceback_in_any_run(realnv):
    assert realnv.runs and [r.argv for r in realnv.runs if "Traceback" in r.err] == []
