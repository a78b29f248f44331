"""What the actions record at change time for the fabric manager's undo: the holds gpunode placed (not one that
was there), the repository files a repository-adding command created, whether fabric manager was enabled before."""

from __future__ import annotations

from gpunode.actions import fabric, packages
from gpunode.actions.base import Looks
from gpunode.actions.packages import package_command
from gpunode.connection.base import Result
from gpunode.records import HoldRecord, UnitRecord
from gpunode.shell import Script


def looks(monkeypatch, module, answers: list[dict[str, str] | None]) -> list[tuple[str, ...]]:
    """Every look an action folds into its commands is answered, in order, from `answers`; the commands
    themselves run nothing. Returns the looks asked for."""
    asked: list[tuple[str, ...]] = []

    def run(self, conn, cmd, *, first=True, last=True, **kwargs):
        before, after = self.before if first else (), self.after if last else ()
        asked.extend((*before, *after))
        if first:
            self.seen_before = [answers.pop(0) for _ in before]
        if last:
            self.seen_after = [answers.pop(0) for _ in after]
        return Result("fake", 0, "", "")
    monkeypatch.setattr(Looks, "run", run)
    return asked


class Ran:
    """A connection on which every command succeeds and prints nothing."""

    name = "fake"

    def run(self, cmd, **kwargs):
        return Result("fake", 0, "", "")


def test_a_hold_records_only_the_holds_that_appeared(monkeypatch):
    looks(monkeypatch, packages, [{"curl": "held"}, {"curl": "held", "nvidia-fabricmanager-535": "held"}])
    hold = package_command("hold", "apt", ("apt-mark", "hold", "nvidia-fabricmanager-535"))
    assert hold.apply_recorded(None)[1] == [  # type: ignore[arg-type]
        HoldRecord(manager="apt", held=("nvidia-fabricmanager-535",))]
    looks(monkeypatch, packages, [{"x": "held"}, {"x": "held"}])
    assert package_command("hold", "apt", ("apt-mark", "hold", "x")).apply_recorded(None)[1] == []  # type: ignore[arg-type]
    looks(monkeypatch, packages, [None, {}])
    assert package_command("hold", "apt", ("apt-mark", "hold", "x")).apply_recorded(None)[1][0].unknown  # type: ignore[arg-type]


def test_the_cuda_keyring_script_records_its_package_and_the_repository_file_it_created(monkeypatch):
    listed = "/etc/apt/sources.list.d/cuda-ubuntu2204-x86_64.list"
    asked = looks(monkeypatch, packages, [
        {"curl": "7"}, {"/etc/apt/sources.list.d/docker.list": "d" * 64},  # packages and dir before
        {"curl": "7", "cuda-keyring": "1.1-1"},  # packages after
        {"/etc/apt/sources.list.d/docker.list": "d" * 64, listed: "c" * 64}])  # dir after
    add = package_command("add the CUDA repository", "apt", Script("dpkg -i x.deb", (), "install-cuda-keyring"))
    records = add.apply_recorded(None)[1]  # type: ignore[arg-type]
    assert asked == [("packages",), ("dir", "/etc/apt/sources.list.d")] * 2
    assert [r.to_dict() for r in records] == [
                       {"kind": "packages", "manager": "apt", "installed": [["cuda-keyring", "1.1-1"]]},
                       {"kind": "file", "path": listed, "existed": False, "backup": None, "sha256": "c" * 64,
                        "repository": True}]


def test_removes_and_refreshes_record_nothing(monkeypatch):
    asked = looks(monkeypatch, packages, [])
    assert package_command("r", "apt", ("apt-get", "remove", "-y", "x"), ("apt-get", "update")
                           ).apply_recorded(None)[1] == []  # type: ignore[arg-type]
    assert asked == []


def test_starting_fabric_manager_records_whether_it_was_enabled(monkeypatch):
    looks(monkeypatch, fabric, [{"nvidia-fabricmanager.service": "disabled"}])
    monkeypatch.setattr(fabric, "POLL_SECONDS", 0)
    assert fabric.StartFabricManager("start", wait=0).apply_recorded(Ran())[1] == [  # type: ignore[arg-type]
        UnitRecord(unit="nvidia-fabricmanager.service", was="disabled")]
