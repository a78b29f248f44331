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
