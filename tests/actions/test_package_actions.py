"""Package-manager actions on a fake node: every command waits for the package lock (--lock-timeout), names
the holder, and a refresh that fails does not stop the install after it."""

import pytest

from gpunode.actions import packages
from gpunode.actions.packages import install_packages, package_command
from gpunode.errors import CommandError
from tests.fakes.connection import FakeConnection, FakeNode


@pytest.fixture(autouse=True)
def _no_waiting(monkeypatch):
    monkeypatch.setattr(packages, "LOCK_POLL_SECONDS", 1.0)


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


def test_a_held_lock_is_waited_for_and_the_holder_named():
    node = FakeNode(tools={"apt-get"})
    node.handlers["apt-get"] = locked_apt(free_after=2)
    note = install_packages("x", "apt", ("gcc",), lock_timeout=30).apply(FakeConnection(node))
    assert note == "waited for the package lock (process 1717 (unattended-upgr) holds /var/lib/dpkg/lock-frontend)"
    assert "gcc" in node.tools


def test_a_lock_held_past_the_timeout_fails_naming_the_holder():
    node = FakeNode(tools={"apt-get"})
    node.handlers["apt-get"] = locked_apt(free_after=1000)
    with pytest.raises(CommandError) as exc:
        install_packages("x", "apt", ("gcc",), lock_timeout=3).apply(FakeConnection(node))
    assert "lock is still held after 3s: process 1717 (unattended-upgr)" in exc.value.message
    assert "--lock-timeout" in (exc.value.fix or "") and "cloud-init" in (exc.value.fix or "")


def test_a_failing_apt_get_update_does_not_stop_the_install():
    node = FakeNode(tools={"apt-get"})

    def apt(node, argv, stdin):
        if argv[1] == "update":
            return 100, "", "E: The repository 'https://broken.example  InRelease' is not signed.\n"
        return 0, "", ""
    node.handlers["apt-get"] = apt
    note = install_packages("x", "apt", ("gcc",), refresh=True).apply(FakeConnection(node))
    assert "apt-get update` reported errors" in (note or "")




def test_a_refresh_on_its_own_also_waits_for_the_lock_and_fails_when_it_fails():
    node = FakeNode(tools={"apt-get"})
    node.handlers["apt-get"] = locked_apt(free_after=1)
    refresh = package_command("refresh", "apt", ("apt-get", "update"), lock_timeout=30)
    assert "waited for the package lock" in (refresh.apply(FakeConnection(node)) or "")
    node.handlers["apt-get"] = lambda node, argv, stdin: (100, "", "E: Failed to fetch https://x InRelease\n")
    with pytest.raises(CommandError) as exc:
        refresh.apply(FakeConnection(node))
    assert "`apt-get update` failed with exit code 100" in exc.value.message
