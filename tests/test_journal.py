"""The node's journal read back: a damaged file is a clear error (never a traceback), undo records come back typed,
and a journal written by the previous release (plain objects) still reads."""

from __future__ import annotations

import json

import pytest

from gpunode.errors import GpunodeError
from gpunode.journal import JOURNAL_PATH, parse_journal, read_journal, to_json
from gpunode.records import DriverRecord, FileRecord, PackagesRecord, UnitRecord
from tests.fakes.connection import FakeConnection, FakeNode

# as the previous release wrote it (gpunode 0.x: dict records, no typed fields added since)
PREVIOUS_RELEASE = {
    "schema_version": 1,
    "runs": [{"id": "a1", "started": "2026-01-01T00:00:00Z", "finished": "2026-01-01T00:05:00Z",
              "gpunode_version": "0.9.0", "command": "install", "status": "done",
              "steps": [{"step": "nouveau", "result": "changed", "reason": "blacklist", "backups": [], "error": None,
                         "time": "2026-01-01T00:01:00Z"}]}],
    "pending": [],
    "undo": [
        {"kind": "file", "path": "/etc/modprobe.d/blacklist-nouveau.conf", "existed": False, "backup": None,
         "sha256": "a" * 64, "mode": "0644", "id": "r1", "run": "a1", "step": "nouveau", "time": "t"},
        {"kind": "packages", "manager": "apt", "installed": [["gcc", "11"], ["make", "4"]], "id": "r2", "run": "a1",
         "step": "prerequisites", "time": "t"},
        {"kind": "unit", "unit": "nvidia-persistenced.service", "was": "disabled", "id": "r3", "run": "a1",
         "step": "nodesettings", "time": "t", "undone": "b2"},
        {"kind": "driver", "version": "570.195.03", "previous": None, "id": "r4", "run": "a1", "step": "driver",
         "time": "t"},
    ],
}


def test_a_previous_release_journal_reads_as_typed_records_and_writes_back_the_same():
    data = parse_journal(json.dumps(PREVIOUS_RELEASE), "n1")
    kinds = [type(r) for r in data["undo"]]
    assert kinds == [FileRecord, PackagesRecord, UnitRecord, DriverRecord]
    assert data["undo"][1].names == ("gcc", "make") and data["undo"][2].undone == "b2"
    assert json.loads(to_json(data)) == PREVIOUS_RELEASE


@pytest.mark.parametrize(("damage", "named"), [
    (lambda j: j["runs"][0].update(steps="oops"), "runs[0].steps"),
    (lambda j: j["runs"][0]["steps"][0].update(backups=[1, 2]), "backups"),
    (lambda j: j["runs"][0].update(changes=[3]), "changes"),
    (lambda j: j.update(pending=[{"effect": 1}]), "pending[0]"),
    (lambda j: j["undo"][0].update(path=["/etc/x"]), "undo[0]: 'path'"),
    (lambda j: j["undo"][1].update(installed=[["gcc"]]), "undo[1]: 'installed'"),
    (lambda j: j["undo"][2].update(kind="rm -rf"), "undo[2]: unknown record kind"),
    (lambda j: j["undo"].append("x"), "undo[4]"),
    (lambda j: j.update(undo={"a": 1}), "'undo' is dict"),
])
def test_wrong_types_inside_the_journal_are_an_error_naming_the_place_and_the_fix(damage, named):
    broken = json.loads(json.dumps(PREVIOUS_RELEASE))
    damage(broken)
    with pytest.raises(GpunodeError) as caught:
        parse_journal(json.dumps(broken), "n1")
    assert named in caught.value.message and "unexpected shape" in caught.value.message
    assert caught.value.fix and f"{JOURNAL_PATH}.broken" in caught.value.fix


def test_deeply_nested_json_is_reported_not_a_recursion_error():
    node = FakeNode()
    node.put(JOURNAL_PATH, "[" * 100_000 + "]" * 100_000)
    with pytest.raises(GpunodeError) as caught:
        read_journal(FakeConnection(node))
    assert "not valid JSON" in caught.value.message and "nested too deeply" in caught.value.message
