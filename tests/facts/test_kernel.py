import shutil
import subprocess

import pytest

from gpunode.facts.kernel import (
    effective_modprobe_files,
    module_block,
    parse_dev_char,
    parse_headers,
    parse_initramfs,
    parse_modprobe_directives,
    parse_modules,
    parse_nvidia_version,
    parse_pci,
    parse_secure_boot,
)
from tests.conftest import fixture_files


def test_modules_from_proc_modules_and_lsmod():
    proc = "nvidia_uvm 1363968 0 - Live 0x0\nnouveau 2797568 1 - Live 0x0\n"
    lsmod = "Module                  Size  Used by\nnvidia-drm 77824 0\n"
    assert parse_modules(proc) == {"nvidia_uvm", "nouveau"}
    assert parse_modules(lsmod) == {"nvidia_drm"}


def test_modprobe_directives_comments_and_continuations():
    text = "# blacklist nouveau\n  blacklist   nouveau  \noptions nouveau \\\n  modeset=0\n\n"
    assert parse_modprobe_directives(text) == [("blacklist", "nouveau"), ("options", "nouveau", "modeset=0")]


def test_etc_file_hides_the_same_name_in_usr_lib():
    files = {"/usr/lib/modprobe.d/nv.conf": "blacklist nouveau\noptions nouveau modeset=0\n",
             "/etc/modprobe.d/nv.conf": "# emptied by the admin\n"}
    assert list(effective_modprobe_files(files)) == ["/etc/modprobe.d/nv.conf"]
    assert not module_block("nouveau", files).effective


@pytest.mark.parametrize("files,cmdline,effective", [
    ({"/etc/modprobe.d/x.conf": "blacklist nouveau\noptions nouveau modeset=0\n"}, "", True),
    ({"/etc/modprobe.d/x.conf": "blacklist nouveau\n"}, "", False),  # can still be loaded by hand / as a dep
    ({"/etc/modprobe.d/a.conf": "blacklist nouveau\n", "/lib/modprobe.d/b.conf": "options nouveau modeset=0"},
     "", True),
    ({"/etc/modprobe.d/x.conf": "install nouveau /bin/false\n"}, "", True),
    ({}, "ro quiet modprobe.blacklist=nouveau,floppy nouveau.modeset=0", True),
    ({"/etc/modprobe.d/x.conf": "#blacklist nouveau\n#options nouveau modeset=0\n"}, "", False),
])
def test_nouveau_block(files, cmdline, effective):
    assert module_block("nouveau", files, cmdline).effective is effective


@pytest.mark.parametrize("path", fixture_files("proc-driver-nvidia-version"), ids=lambda p: p.name)
def test_real_proc_driver_nvidia_version(path):
    driver = parse_nvidia_version(path.read_text())
    assert driver is not None
    expected_version = path.name.split("_")[1]
    assert driver.version == expected_version
    assert driver.flavour == ("open" if path.name.startswith("open") else "proprietary")


def test_nvidia_version_absent():
    assert parse_nvidia_version("") is None
    assert parse_nvidia_version("cat: /proc/driver/nvidia/version: No such file or directory") is None


def test_aarch64_open_module_line():
    line = "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  570.124.06  Release Build  (dvs-builder@U16)\n"
    driver = parse_nvidia_version(line)
    assert driver is not None and driver.version == "570.124.06" and driver.flavour == "open"


def test_pci_gpus_and_nvswitches():
    devices = parse_pci("0000:1b:00.0 0x10de 0x2330 0x030200\n0000:05:00.0 0x10de 0x22a3 0x068000\n"
                        "0000:00:02.0 0x10de 0x2684 0x030000\ngarbage\n")
    assert [d.address for d in devices] == ["0000:00:02.0", "0000:05:00.0", "0000:1b:00.0"]
    assert [d.is_gpu for d in devices] == [True, False, True]
    assert [d.is_nvswitch for d in devices] == [False, True, False]


@pytest.mark.parametrize("text,efi,enabled", [
    ("efi\nefivar 6 0 0 0 1\nmokutil SecureBoot enabled", True, True),
    ("efi\nefivar 6 0 0 0 0", True, False),
    ("efi\nmokutil SecureBoot disabled", True, False),
    ("bios\nmokutil EFI variables are not supported on this system", False, False),
    ("bios", False, False),
    ("efi", True, None),
])
def test_secure_boot(text, efi, enabled):
    sb = parse_secure_boot(text)
    assert (sb.efi, sb.enabled) == (efi, enabled)


def test_dev_char_links():
    found = parse_dev_char("dev /dev/nvidia0\ndev /dev/nvidia1\ndev /dev/nvidiactl\ndev /dev/nvidia-uvm\n"
                                 "link 195:0 ../nvidia0\nlink 195:255 ../nvidiactl\nlink 509:0 ../nvidia-uvm\n")
    assert found.missing == ["/dev/nvidia1"]
    assert found.links["nvidiactl"] == "/dev/char/195:255"


def test_headers_and_initramfs_lines():
    assert parse_headers("build /lib/modules/6.8.0-45-generic/build\n") == ("/lib/modules/6.8.0-45-generic/build",)
    assert parse_headers("") == ()
    assert parse_initramfs("1700000000 /boot/initrd.img-6.8\n1700000500 /boot/initramfs-linux.img\n") == 1700000500
    assert parse_initramfs("") is None


# ---- installed kernels, boot default, DKMS (kernel.KERNELS) --------------------------------------------------

def test_kernels_probe_lines_with_images_grub_and_dkms_formats():
    from gpunode.facts.kernel import DkmsEntry, parse_kernels

    info = parse_kernels("kernel 5.15.0-91-generic headers /lib/modules/5.15.0-91-generic/updates/dkms/nvidia.ko image\n"
                         "kernel 5.15.0-92-generic - - image\n"
                         "kernel 5.15.0-100-generic - /lib/modules/5.15.0-100-generic/updates/dkms/nvidia.ko -\n"
                         "dkms nvidia/535.129.03, 5.15.0-91-generic, x86_64: installed\n"
                         "dkms nvidia, 535.129.03, 5.15.0-90-generic, x86_64: installed (original_module exists)\n"
                         "dkms nvidia/550.127.05: added\n"
                         'grubdefault "0"\n')
    assert [k.name for k in info.kernels] == ["5.15.0-91-generic", "5.15.0-92-generic"]  # -100: no image, leftovers
    assert info.dkms[1] == DkmsEntry("nvidia", "535.129.03", "5.15.0-90-generic", "installed")
    assert info.dkms_versions() == ("535.129.03", "550.127.05")
    assert info.dkms_installed("5.15.0-91-generic", "535.129.03")
    assert not info.dkms_installed("5.15.0-92-generic", "535.129.03")
    default, how = info.boot_default
    assert default is not None and default.name == "5.15.0-92-generic" and "GRUB_DEFAULT=0" in how
    assert [k.name for k in info.later_than("5.15.0-91-generic")] == ["5.15.0-92-generic"]


def test_boot_default_from_grubby_and_an_unevaluated_grub_default():
    from gpunode.facts.kernel import parse_kernels

    rk = "5.14.0-362.8.1.el9_3.x86_64"
    info = parse_kernels(f"kernel {rk} headers - image\nkernel 5.14.0-427.13.1.el9_4.x86_64 headers - image\n"
                         f"grubby /boot/vmlinuz-{rk}\n")
    default, how = info.boot_default
    assert default is not None and default.name == rk and how == "grubby --default-kernel"
    saved = parse_kernels("kernel 6.1.0-18-amd64 headers - image\ngrubdefault saved\n")
    assert "GRUB_DEFAULT=saved is not evaluated" in saved.boot_default[1]
    old = parse_kernels("kernel 6.1.0-18-amd64 headers - \n")  # the older three-field form: image not reported
    assert old.kernels[0].image is None and old.newest is not None


def test_headers_available_from_apt_cache_policy_and_dnf_list():
    from gpunode.facts.kernel import parse_headers_available

    assert parse_headers_available("avail linux-headers-5.15.0-92-generic\nmissing linux-headers-5.15.0-99-generic\n"
                                   ) == {"linux-headers-5.15.0-92-generic": True,
                                         "linux-headers-5.15.0-99-generic": False}
    assert parse_headers_available("dnf kernel-devel.x86_64 5.14.0-427.13.1.el9_4 baseos\n") == {
        "kernel-devel-5.14.0-427.13.1.el9_4.x86_64": True}


def test_kernel_order_is_numeric_and_puts_a_rhel_z_stream_after_its_base():
    from gpunode.facts.kernel import kernel_key

    names = ["5.15.0-100-generic", "5.15.0-91-generic", "5.14.0-362.8.1.el9_3.x86_64", "5.14.0-362.el9.x86_64"]
    assert sorted(names, key=kernel_key) == ["5.14.0-362.el9.x86_64", "5.14.0-362.8.1.el9_3.x86_64",
                                             "5.15.0-91-generic", "5.15.0-100-generic"]


def test_a_failed_dkms_build_from_the_real_make_log():
    """The probe's `dkmsfail` line, built from a real make.log (Debian's open modules 535.261.03 against
    bookworm-security's kernel, tests/realos): the kernel, DKMS's module-version and the first compiler error,
    without the build tree's path. A module built for that kernel afterwards supersedes it."""
    from gpunode.facts.kernel import parse_kernels
    from tests.conftest import FIXTURES

    head, error = (FIXTURES / "debian-nvidia" / "dkms-make-log_second-kernel_errors_open.txt").read_text(
        encoding="utf-8").splitlines()[:2]
    log = "/var/lib/dkms/nvidia-current-open/535.261.03/build/make.log"
    info = parse_kernels("kernel 6.1.0-50-amd64 headers /lib/modules/6.1.0-50-amd64/updates/dkms/"
                         "nvidia-current-open.ko image\nkernel 6.1.0-56-amd64 headers - image\n"
                         "dkms nvidia-current-open/535.261.03, 6.1.0-50-amd64, x86_64: installed\n"
                         f"dkmsfail {log} | {head} | {error}\n")
    failure = info.failed_build("6.1.0-56-amd64")
    assert failure is not None and failure.module == "nvidia-current-open-535.261.03" and failure.log == log
    assert failure.error == "nvidia/nv-pci.c:223:9: error: too few arguments to function ‘pci_resize_resource’"
    assert info.failed_build("6.1.0-50-amd64") is None  # no failure recorded for it
    built = parse_kernels("kernel 6.1.0-56-amd64 headers /lib/modules/6.1.0-56-amd64/updates/dkms/nvidia.ko image\n"
                          f"dkmsfail {log} | {head} | {error}\n")
    assert built.failed_build("6.1.0-56-amd64") is None  # built after all: the log is an older attempt's
    assert parse_kernels(f"dkmsfail {log} | not a make.log | {error}\n").failures == ()
    assert parse_kernels(f"dkmsfail {log} | {head} | \n").failures == ()


@pytest.mark.parametrize("shell", [s for s in (["dash"], ["bash", "--posix"], ["busybox", "sh"]) if shutil.which(s[0])],
                         ids=lambda s: s[0])
def test_the_main_module_is_picked_as_grep_and_head_picked_it(shell, tmp_path):
    # kernel.FIRST_MAIN_MODULE keeps the first path grep -E "/nvidia(-current|-tesla-[0-9]+)?(-open)?\.ko" | head -n 1
    # kept, without the two processes
    from gpunode.facts.kernel import FIRST_MAIN_MODULE

    names = ["nvidia-modeset.ko", "nvidia-uvm.ko.xz", "nvidia.ko", "nvidia.ko.zst", "nvidia-open.ko",
             "nvidia-current.ko", "nvidia-current-open.ko.xz", "nvidia-tesla-535.ko", "nvidia-tesla-535-open.ko",
             "nvidia-tesla-53x.ko", "nvidia-tesla-.ko", "nvidia-tesla-535-uvm.ko", "nvidia-tesla-5.35.ko",
             "nvidia-drm.ko", "nvidia peermem.ko", "nvidia-current-uvm.ko"]
    for i, name in enumerate(names):
        for rest in ([], names[i:], names[:i][::-1], [n for n in names if n != name]):
            paths = "\n".join(f"/lib/modules/6.1/updates/dkms/{n}" for n in [name, *rest])
            want = subprocess.run(
                ["sh", "-c", 'printf "%s\\n" "$1" | grep -E "/nvidia(-current|-tesla-[0-9]+)?(-open)?\\.ko" | head -n 1',
                 "sh", paths], capture_output=True, text=True, check=False).stdout.strip()
            got = subprocess.run([*shell, "-c", 'r=$1; ' + FIRST_MAIN_MODULE + 'printf "%s\\n" "$m"', "sh", paths],
                                 capture_output=True, text=True, check=False).stdout.strip()
            assert got == want, (shell, paths)
    assert subprocess.run([*shell, "-c", 'r=; ' + FIRST_MAIN_MODULE + 'echo "[$m]"'], capture_output=True,
                          text=True, check=False).stdout == "[]\n"
