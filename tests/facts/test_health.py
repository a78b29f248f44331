"""Health facts (gpunode/facts/health.py): installed kernels and DKMS, the kernel log, automatic upgrades."""

from __future__ import annotations

from gpunode.facts import Facts
from gpunode.facts import health as h
from gpunode.facts.registry import Section


def test_dkms_status_formats():
    text = ("nvidia/535.129.03, 5.15.0-91-generic, x86_64: installed\n"
            "nvidia, 470.256.02, 5.4.0-150-generic, x86_64: installed (WARNING! Diff between built and installed "
            "module!)\nnvidia/580.95.05: added\nvirtualbox/7.0.14, 6.8.0-45-generic, x86_64: built\n")
    assert h.parse_dkms_status(text) == (
        h.DkmsEntry("nvidia", "535.129.03", "5.15.0-91-generic", "installed"),
        h.DkmsEntry("nvidia", "470.256.02", "5.4.0-150-generic", "installed"),
        h.DkmsEntry("nvidia", "580.95.05", None, "added"),
        h.DkmsEntry("virtualbox", "7.0.14", "6.8.0-45-generic", "built"))


def test_kernels_newest_in_natural_order():
    info = h.parse_kernels("kernel 5.15.0-91-generic headers /lib/modules/5.15.0-91-generic/updates/dkms/nvidia.ko\n"
                               "kernel 5.15.0-100-generic - -\n"
                               "dkms nvidia/535.129.03, 5.15.0-91-generic, x86_64: installed\n")
    assert info.newest == h.Kernel("5.15.0-100-generic", False, None)
    assert info.built_for("5.15.0-91-generic") == ["/lib/modules/5.15.0-91-generic/updates/dkms/nvidia.ko",
                                                   "dkms nvidia/535.129.03"]
    assert info.built_for("5.15.0-100-generic") == []
    assert not h.parse_kernels(None).known


def test_kernel_log_source_line():
    assert h.parse_kernel_log(None) is None
    log = h.parse_kernel_log("@source journal\nJun 30 kernel: NVRM: Xid (PCI:0000:3b:00): 79")
    assert log == h.KernelLog("journal", "Jun 30 kernel: NVRM: Xid (PCI:0000:3b:00): 79")


def test_auto_upgrade_from_apt_config_dump():
    found = h.parse_auto_upgrade('apt APT::Periodic::Unattended-Upgrade "1";\n'
                                     'apt Unattended-Upgrade::Package-Blacklist "";\n'
                                     'apt Unattended-Upgrade::Package-Blacklist:: "nvidia-";\n'
                                     'apt Unattended-Upgrade::Allowed-Origins "";\n'
                                     'apt Unattended-Upgrade::Allowed-Origins:: "${distro_id}:${distro_codename}";\n'
                                     "installed unattended-upgrades\ndnf apply_updates = yes\n")
    assert found.apt_installed and found.apt_periodic == "1"
    assert found.apt_blacklist == ("nvidia-",) and found.apt_origins == ("${distro_id}:${distro_codename}",)
    assert found.dnf == {"apply_updates": "yes"}


def test_auto_upgrade_from_files():
    found = h.parse_auto_upgrade('file /etc/apt/apt.conf.d/20auto-upgrades\n'
                                     'APT::Periodic::Update-Package-Lists "1";\nAPT::Periodic::Unattended-Upgrade "0";\n'
                                     "file /etc/apt/apt.conf.d/50unattended-upgrades\n"
                                     'Unattended-Upgrade::Package-Blacklist {\n    // "vim";\n    "libnvidia-";\n};\n')
    assert not found.apt_installed and found.apt_periodic == "0" and found.apt_blacklist == ("libnvidia-",)


def test_a_failed_snippet_reads_as_unknown_not_as_empty():
    failed = Facts(outputs={"doctor_kernel_log": Section("", 3), "doctor_kernels": Section("", 3)})
    assert failed[h.KERNEL_LOG] is None and not failed[h.KERNELS].known
    empty = Facts(outputs={"doctor_kernel_log": Section("@source dmesg", 0), "doctor_kernels": Section("", 0)})
    assert empty[h.KERNEL_LOG] == h.KernelLog("dmesg", "") and empty[h.KERNELS].known
