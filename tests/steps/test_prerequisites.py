"""The prerequisites step: plans from facts, and the lock-waiting package transaction on a fake node."""

import dataclasses

import pytest

from gpunode.errors import CommandError
from gpunode.facts import Facts
from gpunode.facts.osinfo import parse_os_release
from gpunode.facts.probe import Section
from gpunode.options import Options
from gpunode.plan import Status
from gpunode.steps import prerequisites
from gpunode.steps.prerequisites import PackageTransaction
from tests.fakes.connection import ROCKY_9, FakeConnection, FakeNode

UBUNTU = parse_os_release('ID=ubuntu\nID_LIKE=debian\nVERSION_ID="22.04"\nPRETTY_NAME="Ubuntu 22.04.5 LTS"\n')
ROCKY = parse_os_release('ID="rocky"\nID_LIKE="rhel centos fedora"\nVERSION_ID="9.3"\nPRETTY_NAME="Rocky Linux 9.3"\n')
RHEL = parse_os_release('ID="rhel"\nID_LIKE="fedora"\nVERSION_ID="9.3"\nPRETTY_NAME="Red Hat Enterprise Linux 9.3"\n')
KERNEL = "5.15.0-91-generic"
DRIVER = Options(driver="535.129.03")


def facts(**changes) -> Facts:
    base = Facts(os=UBUNTU, kernel=KERNEL, arch="x86_64", tools={"apt-get": "/usr/bin/apt-get"})
    return dataclasses.replace(base, **changes)


def outputs(**sections: str) -> dict[str, Section]:
    return {name: Section(text, 0) for name, text in sections.items()}


def plan(f: Facts, options: Options = DRIVER):
    return prerequisites.plan(f, options, {})


def test_nothing_to_build_without_a_driver_request():
    p = plan(facts(), Options())
    assert p.status is Status.OK and "no --driver" in p.reason


def test_fresh_ubuntu_installs_compiler_dkms_and_headers_for_the_running_kernel():
    p = plan(facts())
    assert p.status is Status.CHANGE
    (action,) = p.actions
    assert isinstance(action, PackageTransaction)
    assert action.commands() == [
        "sudo apt-get update",
        f"sudo apt-get install -y --no-install-recommends gcc make dkms linux-headers-{KERNEL}",
    ]
    assert "waits up to 600s for the package lock" in p.notes[0]


def test_everything_present_is_ok():
    f = facts(tools={"apt-get": "x", "gcc": "x", "make": "x", "dkms": "x"},
              outputs=outputs(kernel_headers=f"build /lib/modules/{KERNEL}/build\n"))
    assert plan(f).status is Status.OK


def test_only_the_missing_headers_are_installed():
    f = facts(tools={"apt-get": "x", "gcc": "x", "make": "x", "dkms": "x"})
    assert plan(f).actions[0].packages == (f"linux-headers-{KERNEL}",)


def test_headers_not_in_the_repositories_block_with_the_fix():
    f = facts(outputs=outputs(prereq_available=f"avail gcc\navail make\navail dkms\nmissing linux-headers-{KERNEL}\n"))
    p = plan(f)
    assert p.status is Status.BLOCKED and f"linux-headers-{KERNEL}" in p.reason
    assert "upgrade the kernel" in (p.fix or "") and "reboot into it" in (p.fix or "")


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


def test_unknown_distribution_is_blocked():
    other = parse_os_release("ID=flatcar\nVERSION_ID=3139.2.0\n")
    assert plan(facts(os=other, tools={})).status is Status.BLOCKED


# -- applying on a fake node -------------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def _no_waiting(monkeypatch):
    monkeypatch.setattr(prerequisites, "LOCK_POLL_SECONDS", 1.0)


def locked_apt(free_after: int):
    """apt-get that fails like apt does while unattended-upgrades holds the lock, `free_after` times."""
    state = {"calls": 0}

    def handler(node, argv, stdin):
        state["calls"] += 1
        if state["calls"] <= free_after:
            return 100, "", ("E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 1717 "
                             "(unattended-upgr)\nN: Be aware that removing the lock file is not a solution\n")
        node.tools.update(a for a in argv if a in ("gcc", "make", "dkms"))
        return 0, "Setting up gcc\n", ""
    return handler


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


def test_a_held_lock_is_waited_for_and_the_holder_named():
    node = FakeNode(tools={"apt-get"})
    node.handlers["apt-get"] = locked_apt(free_after=2)
    note = PackageTransaction("x", packages=("gcc",), lock_timeout=30).apply(FakeConnection(node))
    assert note == "waited for the package lock (process 1717 (unattended-upgr) holds /var/lib/dpkg/lock-frontend)"
    assert "gcc" in node.tools


def test_a_lock_held_past_the_timeout_fails_naming_the_holder():
    node = FakeNode(tools={"apt-get"})
    node.handlers["apt-get"] = locked_apt(free_after=1000)
    with pytest.raises(CommandError) as exc:
        PackageTransaction("x", packages=("gcc",), lock_timeout=3).apply(FakeConnection(node))
    assert "lock is still held after 3s: process 1717 (unattended-upgr)" in exc.value.message
    assert "--lock-timeout" in (exc.value.fix or "") and "cloud-init" in (exc.value.fix or "")


def test_missing_headers_at_install_time_are_explained():
    node = FakeNode(tools={"apt-get"})
    node.files["/fake/unavailable-packages"] = f"linux-headers-{KERNEL}"
    with pytest.raises(CommandError) as exc:
        plan(facts()).actions[0].apply(FakeConnection(node))
    assert f"linux-headers-{KERNEL} is not available from the configured repositories" in exc.value.message


def test_a_failing_apt_get_update_does_not_stop_the_install():
    node = FakeNode(tools={"apt-get"})

    def apt(node, argv, stdin):
        if argv[1] == "update":
            return 100, "", "E: The repository 'https://broken.example  InRelease' is not signed.\n"
        return 0, "", ""
    node.handlers["apt-get"] = apt
    note = PackageTransaction("x", packages=("gcc",), update=True).apply(FakeConnection(node))
    assert "apt-get update` reported errors" in (note or "")


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
