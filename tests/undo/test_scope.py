"""What an undo record may name (gpunode/undo/scope.py): gpunode's own files, backups and units, nothing else."""

from __future__ import annotations

import pytest

from gpunode.records import FileRecord, PackagesRecord, UnitRecord
from gpunode.steps import nodesettings, nouveau, toolkit
from gpunode.undo.scope import outside, within


@pytest.mark.parametrize("path", [nouveau.PATH, nodesettings.UNIT_PATH, toolkit.APT_LIST, toolkit.APT_KEYRING,
                                  "/etc/docker/daemon.json", "/etc/containerd/conf.d/99-nvidia.toml",
                                  "/etc/apt/sources.list.d/cuda-ubuntu2204-x86_64.list", "/etc/yum.repos.d/cuda.repo"])
def test_gpunodes_own_files_are_within(path):
    assert outside(FileRecord(path=path, existed=True, backup=f"{path}.gpunode-bak.20260101T000000")) is None


@pytest.mark.parametrize(("path", "backup"), [
    ("/etc/passwd", None),
    ("/etc/apt/sources.list.d/../../passwd", None),
    ("/etc/apt/sources.list.d/sub/x.list", None),
    ("relative/daemon.json", None),
    ("/etc/docker/daemon.json", "/etc/shadow"),
    ("/etc/docker/daemon.json", "/etc/docker/daemon.json.gpunode-bak./../../shadow"),
    ("/etc/docker/daemon.json", "/etc/docker/daemon.json.orig"),
])
def test_anything_else_is_outside(path, backup):
    assert outside(FileRecord(path=path, existed=True, backup=backup)) is not None


def test_units_and_the_warning():
    kept, warnings = within([UnitRecord(unit="nvidia-persistenced", step="nodesettings"),
                             UnitRecord(unit="sshd.service", step="nodesettings"),
                             PackagesRecord(manager="apt", installed=(("gcc", "11"),), step="prerequisites")])
    assert [type(r) for r in kept] == [UnitRecord, PackagesRecord] and kept[0].unit == "nvidia-persistenced"
    assert warnings == [("nodesettings", "ignored a journal record of step nodesettings: sshd.service is not a unit "
                                         "gpunode enables (the journal was edited by hand or damaged); nothing it "
                                         "names was touched")]
