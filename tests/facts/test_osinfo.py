import pytest

from gpunode.facts.osinfo import parse_os_release
from tests.conftest import fixture_files

# file -> (distro id, VERSION_ID, family, package manager)
EXPECTED = {
    "almalinux-8.3-beta.os-release": ("almalinux", "8.3", "rhel", "dnf"),
    "almalinux-9.4_no-trailing-newline.os-release": ("almalinux", "9.4", "rhel", "dnf"),
    "alpine.os-release": ("alpine", "3.23.2", "other", None),
    "amazon-linux-2.os-release": ("amzn", "2", "rhel", "yum"),
    "amazon-linux-ami-2016.03.os-release": ("amzn", "2016.03", "rhel", "yum"),
    "centos-7.os-release": ("centos", "7", "rhel", "yum"),
    "centos-stream-8.os-release": ("centos", "8", "rhel", "dnf"),
    "centos-stream-9.os-release": ("centos", "9", "rhel", "dnf"),
    "debian-10.os-release": ("debian", "10", "debian", "apt"),
    "debian-12-bookworm_kvm-guest.os-release": ("debian", "12", "debian", "apt"),
    "debian-13-trixie.os-release": ("debian", "13", "debian", "apt"),
    "flatcar-3139.2.0.os-release": ("flatcar", "3139.2.0", "other", None),
    "linuxmint-17.os-release": ("ubuntu", "14.04", "debian", "apt"),
    "opensuse-leap-15.2.os-release": ("opensuse", "15.2", "suse", "zypper"),
    "pop-os-20.04.os-release": ("pop", "20.04", "debian", "apt"),
    "rhel-10.0.os-release": ("rhel", "10.0", "rhel", "dnf"),
    "rhel-7.os-release": ("rhel", "7.0", "rhel", "yum"),
    "rhel-9.4_no-trailing-newline.os-release": ("rhel", "9.4", "rhel", "dnf"),
    "rocky-8.4.os-release": ("rocky", "8.4", "rhel", "dnf"),
    "rocky-9.os-release": ("rocky", "9.3", "rhel", "dnf"),
    "sles-12-sp1.os-release": ("sles", "12.1", "suse", "zypper"),
    "ubuntu-18.04.3.os-release": ("ubuntu", "18.04", "debian", "apt"),
    "ubuntu-20.04.1.os-release": ("ubuntu", "20.04", "debian", "apt"),
    "ubuntu-22.04.5_gpu-node.os-release": ("ubuntu", "22.04", "debian", "apt"),
    "ubuntu-24.04.3.os-release": ("ubuntu", "24.04", "debian", "apt"),
    "ubuntu-26.04.os-release": ("ubuntu", "26.04", "debian", "apt"),
}


def test_every_fixture_has_an_expectation():
    assert {p.name for p in fixture_files("os-release")} == set(EXPECTED)


@pytest.mark.parametrize("path", fixture_files("os-release"), ids=lambda p: p.name)
def test_os_release_fixture_parses(path):
    info = parse_os_release(path.read_text())
    assert (info.id, info.version, info.family, info.package_manager) == EXPECTED[path.name]
    assert info.name  # PRETTY_NAME always present in these files


def test_empty_os_release_is_unknown_not_an_error():
    info = parse_os_release("")
    assert info.id == "unknown" and info.family == "other" and info.package_manager is None


def test_parsing_ignores_the_machine_running_gpunode():
    # Only the given text counts: a bare ID gives that ID, not this machine's distro.
    assert parse_os_release("ID=flatcar\n").id == "flatcar"
