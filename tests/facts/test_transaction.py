"""The package managers' simulations of an exact transaction (gpunode/facts/transaction.py): apt's Inst/Remv
lines, dnf's --assumeno table, zypper's --xmlout install summary, each as the real programs print them."""

from __future__ import annotations

import shlex

from gpunode.facts.registry import Section
from gpunode.facts.transaction import (
    DOWNGRADE,
    INSTALL,
    REMOVE,
    UPGRADE,
    Change,
    parse_apt,
    parse_dnf,
    parse_zypper,
    simulation,
)

# apt-get -s install on Debian 12 with the nvidia image's 535.309.01 compute set, run as a user (apt's NOTE),
# asking for 535.261.03 (the real-OS tier's transaction: apt-pkg's pkgSimulate prints Inst NAME [OLD] (NEW REL [ARCH]))
APT_DOWN = """NOTE: This is only a simulation!
      apt-get needs root privileges for real execution.
      Keep also in mind that locking is deactivated,
      so don't depend on the relevance to the real current situation!
Reading package lists...
Building dependency tree...
Reading state information...
The following additional packages will be installed:
  libnvidia-ptxjitcompiler1 nvidia-support
The following packages will be REMOVED:
  nvidia-open-kernel-dkms xserver-xorg-video-nouveau
The following NEW packages will be installed:
  libcuda1 libnvidia-ptxjitcompiler1 nvidia-support
The following packages will be DOWNGRADED:
  nvidia-smi
0 upgraded, 3 newly installed, 1 downgraded, 2 to remove and 0 not upgraded.
Remv nvidia-open-kernel-dkms [535.309.01-0+deb12u1]
Purg xserver-xorg-video-nouveau [1:1.0.17-2]
Inst nvidia-support (20220217+3~deb12u1 Debian:12.12/stable [amd64])
Inst libnvidia-ptxjitcompiler1 (535.261.03-1 Debian:12.12/stable [amd64])
Inst nvidia-smi [535.309.01-0+deb12u1] (535.261.03-1 Debian:12.12/stable [amd64])
Inst libcuda1:amd64 (535.261.03-1 Debian:12.12/stable [amd64]) []
Conf nvidia-support (20220217+3~deb12u1 Debian:12.12/stable [amd64])
Conf libnvidia-ptxjitcompiler1 (535.261.03-1 Debian:12.12/stable [amd64])
Conf nvidia-smi (535.261.03-1 Debian:12.12/stable [amd64])
Conf libcuda1 (535.261.03-1 Debian:12.12/stable [amd64])
"""

APT_REFUSED = """Reading package lists...
Building dependency tree...
Reading state information...
Some packages could not be installed. This may mean that you have
requested an impossible situation or if you are using the unstable
distribution that some required packages have not yet been created
or been moved out of Incoming.
The following information may help to resolve the situation:

The following packages have unmet dependencies:
 libcuda1 : Depends: nvidia-alternative (= 535.261.03-1) but 535.309.01-0+deb12u1 is to be installed
E: Unable to correct problems, you have held broken packages.
"""


def test_apt_simulation_lists_every_package_with_its_version_and_what_it_removes():
    found = parse_apt(Section(APT_DOWN, 0))
    assert found.error is None
    assert found.changes == (
        Change(REMOVE, "nvidia-open-kernel-dkms", "535.309.01-0+deb12u1"),
        Change(REMOVE, "xserver-xorg-video-nouveau", "1:1.0.17-2"),
        Change(INSTALL, "nvidia-support", "20220217+3~deb12u1"),
        Change(INSTALL, "libnvidia-ptxjitcompiler1", "535.261.03-1"),
        Change(DOWNGRADE, "nvidia-smi", "535.261.03-1", "535.309.01-0+deb12u1"),
        Change(INSTALL, "libcuda1", "535.261.03-1"),
    )
    assert found.changes[4].show() == "nvidia-smi 535.261.03-1 (downgrade from 535.309.01-0+deb12u1)"
    assert [c.name for c in found.removes] == ["nvidia-open-kernel-dkms", "xserver-xorg-video-nouveau"]
    up = parse_apt(Section("Inst nvidia-smi [535.261.03-1] (535.309.01-0+deb12u1 Debian-Security:12/stable-security "
                           "[amd64])\n", 0))
    assert up.changes == (Change(UPGRADE, "nvidia-smi", "535.309.01-0+deb12u1", "535.261.03-1"),)


def test_apt_refusal_keeps_the_unmet_dependency_and_the_error():
    found = parse_apt(Section(APT_REFUSED, 100))
    assert found.changes == ()
    assert found.error == ("libcuda1 : Depends: nvidia-alternative (= 535.261.03-1) but 535.309.01-0+deb12u1 is to "
                           "be installed; E: Unable to correct problems, you have held broken packages.")


# dnf 4 (Rocky 9) with --assumeno: the long name wraps, module streams are not packages, "Operation aborted." exit 1
DNF4 = """Last metadata expiration check: 0:12:01 ago on Tue 24 Nov 2026 04:00:00 PM UTC.
Dependencies resolved.
================================================================================
 Package                        Arch    Version               Repository   Size
================================================================================
Installing:
 kmod-nvidia-latest-dkms        x86_64  3:535.274.02-1.el9    cuda-rhel9-x86_64
                                                                            40 M
 nvidia-driver                  x86_64  3:535.274.02-1.el9    cuda-rhel9-x86_64
                                                                           123 M
Upgrading:
 dkms                           noarch  3.1.5-1.el9           epel        84 k
Installing dependencies:
 nvidia-kmod-common-with-a-very-long-package-name
                                noarch  3:535.274.02-1.el9    cuda-rhel9-x86_64
                                                                            12 k
Removing dependent packages:
 kmod-nvidia-open-dkms          x86_64  3:535.261.03-1.el9    @cuda-rhel9-x86_64
                                                                            80 M
Enabling module streams:
 nvidia-driver                          535-dkms

Transaction Summary
================================================================================
Install  3 Packages
Upgrade  1 Package
Remove   1 Package

Total download size: 163 M
Operation aborted.
"""


def test_dnf_assumeno_table_with_wrapped_rows_and_streams():
    found = parse_dnf(Section(DNF4, 1))
    assert found.error is None  # --assumeno's "Operation aborted." is the answer, not a refusal
    assert [(c.action, c.name, c.version) for c in found.changes] == [
        (INSTALL, "kmod-nvidia-latest-dkms", "535.274.02-1.el9"), (INSTALL, "nvidia-driver", "535.274.02-1.el9"),
        (UPGRADE, "dkms", "3.1.5-1.el9"),
        (INSTALL, "nvidia-kmod-common-with-a-very-long-package-name", "535.274.02-1.el9"),
        (REMOVE, "kmod-nvidia-open-dkms", "535.261.03-1.el9")]
    refused = parse_dnf(Section("Last metadata expiration check: 0:00:42 ago.\nError: \n Problem: conflicting "
                                "requests\n  - nothing provides nvidia-kmod-common = 3:535.274.02 needed by "
                                "nvidia-driver-3:535.274.02-1.el9.x86_64\n", 1))
    assert refused.changes == () and refused.error is not None and "Problem: conflicting requests" in refused.error


# zypper --non-interactive --xmlout install --dry-run (SLES 15 SP6, NVIDIA's repository)
ZYPPER = """<?xml version='1.0'?>
<stream>
<message type="info">Loading repository data...</message>
<message type="info">Reading installed packages...</message>
<message type="info">Resolving package dependencies...</message>
<install-summary download-size="51234567" space-usage-diff="212345678" packages-to-change="3" need-restart="0" need-reboot="0">
<to-upgrade>
<solvable type="package" name="nvidia-compute-utils-G06" edition="580.95.05-1" arch="x86_64" edition-old="580.82.07-1" arch-old="x86_64" repository="cuda-sles15-x86_64" summary="NVIDIA driver tools for computing with GPGPU"/>
</to-upgrade>
<to-install>
<solvable type="package" name="nvidia-open-driver-G06-kmp-default" edition="580.95.05_k6.4.0_150600.23.25-1" arch="x86_64" repository="cuda-sles15-x86_64" summary="NVIDIA open kernel module"/>
<solvable type="pattern" name="ignored" edition="1" arch="noarch"/>
</to-install>
<to-remove>
<solvable type="package" name="nvidia-driver-G06-kmp-default" edition="580.82.07_k6.4.0_150600.23.25-1" arch="x86_64" repository="@System"/>
</to-remove>
</install-summary>
<message type="info">Continue? [y/n/v/...? shows all options] (y): y</message>
</stream>
"""


def test_zypper_xml_summary_and_its_error_message():
    found = parse_zypper(Section(ZYPPER, 0))
    assert found.error is None
    assert found.changes == (
        Change(UPGRADE, "nvidia-compute-utils-G06", "580.95.05-1", "580.82.07-1"),
        Change(INSTALL, "nvidia-open-driver-G06-kmp-default", "580.95.05_k6.4.0_150600.23.25-1"),
        Change(REMOVE, "nvidia-driver-G06-kmp-default", "580.82.07_k6.4.0_150600.23.25-1"))
    refused = parse_zypper(Section('<stream>\n<message type="error">No provider of &apos;nvidia-compute-utils-G06 = '
                                   '9.9&apos; found.</message>\n</stream>\n', 104))
    assert refused.error == "No provider of 'nvidia-compute-utils-G06 = 9.9' found."


def test_simulation_commands_quote_every_value_and_keep_the_pin_in_a_throwaway_directory():
    apt = simulation("apt", ["nvidia-smi=535.261.03-1", "x=1;rm -rf /"], ("gpunode-nvidia-driver", "Pin: it's\n"))
    assert "'x=1;rm -rf /'" in apt.script and "'Pin: it'\"'\"'s\n'" in apt.script
    assert "-o Dir::Etc::PreferencesParts=\"$d\"" in apt.script and apt.script.endswith('rm -rf "$d"; exit $rc')
    plain = simulation("apt", ["nvidia-smi=535.261.03-1"])
    assert shlex.split(plain.script) == ["LC_ALL=C", "apt-get", "-s", "install", "--no-install-recommends",
                                         "--allow-downgrades", "nvidia-smi=535.261.03-1", "2>&1"]
    assert "--assumeno" in simulation("dnf", ["nvidia-driver-535.274.02-1.el9"]).script
    assert "--dry-run" in simulation("zypper", ["nvidia-compute-utils-G06-580.95.05-1"]).script
