"""The prerequisites step: plans from facts, and the lock-waiting package transaction on a fake node."""

import dataclasses

import pytest

from gpunode.actions.packages import PackageCommand
from gpunode.errors import CommandError
from gpunode.facts import Facts, Later
from gpunode.facts import packages as package_facts
from gpunode.facts.kernel import PciDevice
from gpunode.facts.osinfo import parse_os_release
from gpunode.facts.probe import Section
from gpunode.options import Options
from gpunode.plan import Status
from gpunode.steps import prerequisites
from tests.fakes.connection import ROCKY_9, FakeConnection, FakeNode

UBUNTU = parse_os_release('ID=ubuntu\nID_LIKE=debian\nVERSION_ID="22.04"\nPRETTY_NAME="Ubuntu 22.04.5 LTS"\n')
ROCKY = parse_os_release('ID="rocky"\nID_LIKE="rhel centos fedora"\nVERSION_ID="9.3"\nPRETTY_NAME="Rocky Linux 9.3"\n')
RHEL = parse_os_release('ID="rhel"\nID_LIKE="fedora"\nVERSION_ID="9.3"\nPRETTY_NAME="Red Hat Enterprise Linux 9.3"\n')
KERNEL = "5.15.0-91-generic"
T4 = PciDevice("0000:17:00.0", 0x10DE, 0x1EB8, 0x030200)
DRIVER = Options(driver="535.129.03")


def facts(**changes) -> Facts:
    base = Facts(os=UBUNTU, kernel=KERNEL, arch="x86_64", tools={"apt-get": "/usr/bin/apt-get"}, pci=(T4,))
    return dataclasses.replace(base, **changes)


def outputs(**sections: str) -> dict[str, Section]:
    return {name: Section(text, 0) for name, text in sections.items()}


def plan(f: Facts, options: Options = DRIVER):
    return prerequisites.plan(f, options)


def test_nothing_to_build_without_a_driver_request():
    p = plan(facts(), Options())
    assert p.status is Status.OK and "no --driver" in p.reason


def test_fresh_ubuntu_installs_compiler_dkms_and_headers_for_the_running_kernel():
    p = plan(facts())
    assert p.status is Status.CHANGE
    (action,) = p.actions
    assert isinstance(action, PackageCommand) and action.lock_timeout == 600
    assert action.commands() == [
        "sudo apt-get update",
        f"sudo apt-get install -y --no-install-recommends gcc make dkms linux-headers-{KERNEL}",
    ]
    assert "waits up to 600s for the package lock" in p.notes[0]


def test_everything_present_is_ok():
    f = facts(tools={"apt-get": "x", "gcc": "x", "make": "x", "dkms": "x"},
              outputs=outputs(kernel_headers=f"build /lib/modules/{KERNEL}/build\n"))
    assert plan(f).status is Status.OK


def test_a_node_with_the_three_commands_and_the_headers_asks_nothing_late():
    # the package list (prereq_available) is a late fact: reading it costs a converged install a second round trip
    # to the node. With gcc, make and dkms found as commands it is not read; with one of them absent it is.
    def fetch():
        raise AssertionError("the probe's second round trip was asked for")

    present = facts(tools={"apt-get": "x", "gcc": "x", "make": "x", "dkms": "x"},
                    outputs=outputs(kernel_headers=f"build /lib/modules/{KERNEL}/build\n"),
                    later=Later({package_facts.PREREQ_AVAILABLE.name}, fetch))
    assert plan(present).status is Status.OK and present.later.fetches == 0
    absent = dataclasses.replace(present, tools={"apt-get": "x", "gcc": "x", "dkms": "x"},
                                 later=Later({package_facts.PREREQ_AVAILABLE.name},
                                             lambda: {"cmd:prereq_available": Section("installed make\n", 0)}))
    assert plan(absent).status is Status.OK and absent.later.fetches == 1  # make's package is installed


def test_only_the_missing_headers_are_installed():
    f = facts(tools={"apt-get": "x", "gcc": "x", "make": "x", "dkms": "x"})
    assert plan(f).actions[0].packages == (f"linux-headers-{KERNEL}",)


def test_headers_not_in_the_repositories_block_with_the_fix():
    f = facts(outputs=outputs(prereq_available=f"avail gcc\navail make\navail dkms\nmissing linux-headers-{KERNEL}\n"))
    p = plan(f)
    assert p.status is Status.BLOCKED and f"linux-headers-{KERNEL}" in p.reason
    assert p.fix == (f"the running kernel {KERNEL} is not the one the repositories carry headers for: install the "
                     "current kernel with `sudo apt-get update && sudo apt-get install -y --no-install-recommends "
                     "linux-generic`, reboot into it (`sudo reboot`), and run the same command again")


@pytest.mark.parametrize(("os_release", "kernel", "tools", "avail", "command"), [
    ('ID=debian\nVERSION_ID="12"\n', "6.1.0-18-amd64", {"apt-get": "x"}, "missing linux-headers-6.1.0-18-amd64\n",
     "sudo apt-get update && sudo apt-get install -y --no-install-recommends linux-image-amd64 linux-headers-amd64"),
    ('ID=ubuntu\nID_LIKE=debian\nVERSION_ID="22.04"\n', "6.8.0-1015-aws", {"apt-get": "x"},
     "missing linux-headers-6.8.0-1015-aws\n", "sudo apt-get update && sudo apt-get install -y "
     "--no-install-recommends linux-aws"),
    ('ID="rocky"\nID_LIKE="rhel centos fedora"\nVERSION_ID="9.3"\n', "5.14.0-362.8.1.el9_3.x86_64", {"dnf": "x"},
     "dnf gcc.x86_64 11.4.1-2.1.el9 appstream\ndnf make.x86_64 1:4.3-7.el9 baseos\n"
     "dnf dkms.noarch 3.0.12-1.el9 epel\ndnf kernel-devel.x86_64 5.14.0-427.13.1.el9_4 appstream\n",
     "sudo dnf install -y kernel kernel-devel"),
])
def test_headers_fix_names_this_distributions_kernel_packages(os_release, kernel, tools, avail, command):
    f = facts(os=parse_os_release(os_release), kernel=kernel, tools=tools, outputs=outputs(prereq_available=avail))
    p = plan(f)
    assert p.status is Status.BLOCKED and f"`{command}`" in (p.fix or "")
    assert ("apt-get" in p.fix) == ("apt-get" in tools) and ("dnf" in p.fix) == ("dnf" in tools)


def test_no_gpu_is_the_first_blocker_not_missing_headers():
    f = facts(pci=(), outputs=outputs(prereq_available=f"missing linux-headers-{KERNEL}\n"))
    p = plan(f)
    assert p.status is Status.BLOCKED and p.reason.startswith("no NVIDIA GPU on this node")
    assert "headers" not in p.reason and "apt-get" not in (p.fix or "")
    assert plan(f, Options()).status is Status.OK  # nothing asked for, nothing to say


def test_unknown_availability_still_tries():
    f = facts(outputs={"prereq_available": Section("", 3)})
    assert plan(f).status is Status.CHANGE


def test_rocky_uses_dnf_kernel_devel_and_enables_epel_for_dkms():
    p = plan(facts(os=ROCKY, kernel="5.14.0-362.8.1.el9_3.x86_64", tools={"dnf": "x"}))
    epel, main = p.actions
    assert epel.commands() == ["sudo dnf install -y epel-release"]
    assert main.commands() == ["sudo dnf install -y gcc make dkms kernel-devel-5.14.0-362.8.1.el9_3.x86_64"]


def test_rocky_with_epel_already_enabled_installs_in_one_go():
    f = facts(os=ROCKY, kernel="5.14.0-362.8.1.el9_3.x86_64", tools={"dnf": "x"},
              outputs=outputs(prereq_available="installed epel-release\n"))
    assert len(plan(f).actions) == 1


def test_rhel_without_epel_is_blocked_with_the_fix():
    p = plan(facts(os=RHEL, kernel="5.14.0-362.el9.x86_64", tools={"dnf": "x"}))
    assert p.status is Status.BLOCKED and "EPEL" in (p.fix or "")


SLES = parse_os_release('NAME="SLES"\nVERSION_ID="15.6"\nID="sles"\nID_LIKE="suse"\n'
                        'PRETTY_NAME="SUSE Linux Enterprise Server 15 SP6"\n')
SUSE_KERNEL = "6.4.0-150600.23.25-default"
# zypper -n -q search -s --match-exact gcc make dkms kernel-default-devel, as the probe reads it
ZYPPER_SEARCH = ("S  | Name                 | Type    | Version              | Arch   | Repository\n"
                 "---+----------------------+---------+----------------------+--------+---------------------------\n"
                 "v  | gcc                  | package | 7-150000.1.3         | x86_64 | SLE-Module-Basesystem15-SP6\n"
                 "v  | kernel-default-devel | package | 6.4.0-150600.23.38.1 | x86_64 | SLE-Module-Basesystem15-SP6\n")


def test_sles_installs_with_zypper_and_the_running_kernels_flavoured_headers():
    f = facts(os=SLES, kernel=SUSE_KERNEL, tools={"zypper": "x", "rpm": "x"})
    p = plan(f)
    assert p.status is Status.CHANGE
    (install,) = p.actions
    assert install.commands() == ["sudo zypper --non-interactive --gpg-auto-import-keys refresh",
                                  "sudo zypper --non-interactive install gcc make dkms "
                                  "kernel-default-devel=6.4.0-150600.23.25"]
    # headers the repositories lack (the probe's verdict): blocked with SUSE's kernel packages as the fix
    gone = facts(os=SLES, kernel=SUSE_KERNEL, tools={"zypper": "x"}, outputs=outputs(
        prereq_available="avail gcc\navail make\nmissing dkms\nmissing kernel-default-devel=6.4.0-150600.23.25\n"))
    blocked = plan(gone)
    assert blocked.status is Status.BLOCKED and "kernel-default-devel=6.4.0-150600.23.25" in blocked.reason
    assert "sudo zypper --non-interactive install kernel-default kernel-default-devel" in (blocked.fix or "")
    # dkms not offered (SLES without SUSE Package Hub): blocked before any change, with the command that enables it
    hub = plan(facts(os=SLES, kernel=SUSE_KERNEL, tools={"zypper": "x"}, outputs=outputs(
        prereq_available="missing gcc\navail make\nmissing dkms\navail kernel-default-devel=6.4.0-150600.23.25\n")))
    assert hub.status is Status.BLOCKED and "dkms" in hub.reason
    assert "sudo SUSEConnect -p PackageHub/15.6/x86_64 && sudo zypper --non-interactive refresh" in (hub.fix or "")
    # os-release is the node's text: a hostile VERSION_ID stays one word of the printed command
    odd = dataclasses.replace(SLES, version="15.6;reboot")
    hostile = plan(facts(os=odd, kernel=SUSE_KERNEL, tools={"zypper": "x"}, outputs=outputs(
        prereq_available="missing gcc\navail make\nmissing dkms\navail kernel-default-devel=6.4.0-150600.23.25\n")))
    assert "sudo SUSEConnect -p 'PackageHub/15.6;reboot/x86_64' && " in (hostile.fix or ""), hostile.fix
    # the packages route: NVIDIA's kernel module packages come built, nothing to install for a build
    kmp = plan(f, Options(driver="580.95.05", driver_source="packages"))
    assert kmp.status is Status.OK and "KMP" in kmp.reason


def test_unknown_distribution_is_blocked():
    other = parse_os_release("ID=flatcar\nVERSION_ID=3139.2.0\n")
    assert plan(facts(os=other, tools={})).status is Status.BLOCKED


# -- applying on a fake node (the lock wait itself: tests/actions/test_packages.py) -------------------------
def test_apply_installs_and_the_step_converges():
    node = FakeNode(tools={"apt-get"})
    conn = FakeConnection(node)
    action = plan(facts()).actions[0]
    action.apply(conn)
    assert node.ran("apt-get") == [["apt-get", "update"],
                                   ["apt-get", "install", "-y", "--no-install-recommends", "gcc", "make", "dkms",
                                    f"linux-headers-{KERNEL}"]]
    assert {"gcc", "make", "dkms"} <= node.tools
    assert "build" in node.outputs["kernel_headers"][0]


def test_missing_headers_at_install_time_are_explained():
    node = FakeNode(tools={"apt-get"})
    node.files["/fake/unavailable-packages"] = f"linux-headers-{KERNEL}"
    with pytest.raises(CommandError) as exc:
        plan(facts()).actions[0].apply(FakeConnection(node))
    assert f"linux-headers-{KERNEL} is not available from the configured repositories" in exc.value.message


def test_rocky_end_to_end_on_a_fake_node():
    from gpunode.runner import apply_pipeline
    from gpunode.steps import nouveau
    from gpunode.steps import prerequisites as step

    node = FakeNode(os_release=ROCKY_9, kernel="5.14.0-362.8.1.el9_3.x86_64", tools={"dnf", "dracut", "modprobe"})
    node.add_gpu(0x1EB8)
    report = apply_pipeline(FakeConnection(node), (nouveau.STEP, step.STEP), DRIVER, journal=False)
    assert [o.result for o in report.outcomes] == ["changed", "changed"], report.outcomes
    assert node.ran("dnf")[0] == ["dnf", "install", "-y", "epel-release"]
    assert node.ran("dracut") == [["dracut", "-f"]]


def test_dnf_cache_listing_tells_whether_kernel_devel_exists_for_the_running_kernel():
    listing = ("dnf gcc.x86_64 11.4.1-2.1.el9 baseos\ndnf kernel-devel.x86_64 5.14.0-362.8.1.el9_3 appstream\n"
               "dnf kernel-devel.x86_64 5.14.0-362.13.1.el9_3 appstream\n")
    found = prerequisites.parse_available(listing, "5.14.0-362.8.1.el9_3.x86_64")
    assert found.known and "kernel-devel-5.14.0-362.8.1.el9_3.x86_64" in found.available and "dkms" in found.missing
    newer = "5.14.0-427.13.1.el9_4.x86_64"
    p = plan(facts(os=ROCKY, kernel=newer, tools={"dnf": "x"}, outputs=outputs(prereq_available=listing)))
    assert p.status is Status.BLOCKED and f"kernel-devel-{newer}" in p.reason


def test_packages_installed_without_their_command_count_as_present():
    f = facts(outputs=outputs(prereq_available="installed gcc\ninstalled make\ninstalled dkms\n",
                              kernel_headers=f"build /lib/modules/{KERNEL}/build\n"))
    assert plan(f).status is Status.OK
