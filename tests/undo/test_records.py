"""What the actions record at change time for the fabric manager's undo: the holds gpunode placed (not one that
was there), the repository files a repository-adding command created, whether fabric manager was enabled before."""

from __future__ import annotations

from gpunode.actions import fabric, packages
from gpunode.actions.packages import package_command
from gpunode.records import HoldRecord, UnitRecord
from gpunode.shell import Script


def looks(monkeypatch, module, answers: list[dict[str, str] | None]) -> list[tuple[str, ...]]:
    asked: list[tuple[str, ...]] = []

    def fake(conn, what, *items):
        asked.append((what, *items))
        return answers.pop(0)
    monkeypatch.setattr(module, "undo_look", fake)
    return asked


def test_a_hold_records_only_the_holds_that_appeared(monkeypatch):
    looks(monkeypatch, packages, [{"curl": "held"}, {"curl": "held", "nvidia-fabricmanager-535": "held"}])
    monkeypatch.setattr(packages.PackageCommand, "apply", lambda self, conn: None)
    hold = package_command("hold", "apt", ("apt-mark", "hold", "nvidia-fabricmanager-535"))
    assert hold.apply_recorded(None)[1] == [  # type: ignore[arg-type]
        HoldRecord(manager="apt", held=("nvidia-fabricmanager-535",))]
    looks(monkeypatch, packages, [{"x": "held"}, {"x": "held"}])
    assert package_command("hold", "apt", ("apt-mark", "hold", "x")).apply_recorded(None)[1] == []  # type: ignore[arg-type]
    looks(monkeypatch, packages, [None])
    assert package_command("hold", "apt", ("apt-mark", "hold", "x")).apply_recorded(None)[1][0].unknown  # type: ignore[arg-type]


def test_the_cuda_keyring_script_records_its_package_and_the_repository_file_it_created(monkeypatch):
    listed = "/etc/apt/sources.list.d/cuda-ubuntu2204-x86_64.list"
    asked = looks(monkeypatch, packages, [
        {"/etc/apt/sources.list.d/docker.list": "d" * 64},  # dir before
        {"curl": "7"}, {"curl": "7", "cuda-keyring": "1.1-1"},  # packages before, after
        {"/etc/apt/sources.list.d/docker.list": "d" * 64, listed: "c" * 64}])  # dir after
    monkeypatch.setattr(packages.PackageCommand, "apply", lambda self, conn: None)
    add = package_command("add the CUDA repository", "apt", Script("dpkg -i x.deb", (), "install-cuda-keyring"))
    records = add.apply_recorded(None)[1]  # type: ignore[arg-type]
    assert asked[0] == ("dir", "/etc/apt/sources.list.d")
    assert [r.to_dict() for r in records] == [
                       {"kind": "packages", "manager": "apt", "installed": [["cuda-keyring", "1.1-1"]]},
                       {"kind": "file", "path": listed, "existed": False, "backup": None, "sha256": "c" * 64,
                        "repository": True}]


def test_removes_and_refreshes_record_nothing(monkeypatch):
    looks(monkeypatch, packages, [])
    monkeypatch.setattr(packages.PackageCommand, "apply", lambda self, conn: None)
    assert package_command("r", "apt", ("apt-get", "remove", "-y", "x"), ("apt-get", "update")
                           ).apply_recorded(None)[1] == []  # type: ignore[arg-type]


def test_starting_fabric_manager_records_whether_it_was_enabled(monkeypatch):
    looks(monkeypatch, fabric, [{"nvidia-fabricmanager.service": "disabled"}])
    monkeypatch.setattr(fabric.StartFabricManager, "apply", lambda self, conn: None)
    assert fabric.StartFabricManager("start").apply_recorded(None)[1] == [  # type: ignore[arg-type]
        UnitRecord(unit="nvidia-fabricmanager.service", was="disabled")]
