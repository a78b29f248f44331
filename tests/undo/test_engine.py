"""The uninstall engine on the fake connection: an install's records undone, a second uninstall has nothing to do,
--dry-run writes nothing, and an old journal (no undo records) removes only files that carry gpunode's marker."""

from __future__ import annotations

import json

from gpunode.journal import JOURNAL_PATH
from gpunode.options import Options
from gpunode.runner import apply_pipeline
from gpunode.steps import PIPELINE, nouveau
from gpunode.undo import select
from gpunode.undo.engine import uninstall
from tests.fakes.connection import FakeConnection, FakeNode


def gpu_node() -> FakeNode:
    node = FakeNode(tools={"update-initramfs", "modprobe", "systemctl"})
    node.add_gpu(0x1EB8)
    return node


def test_the_nouveau_blacklist_is_undone_and_a_second_uninstall_has_nothing_to_do():
    node = gpu_node()
    node.put("/etc/modprobe.d/user.conf", "options snd power_save=1\n")
    conn = FakeConnection(node)
    apply_pipeline(conn, [s for s in PIPELINE if s.name == "nouveau"], Options())
    assert nouveau.PATH in node.files
    records = json.loads(node.files[JOURNAL_PATH])["undo"]
    assert [(r["kind"], r["path"], r["existed"]) for r in records] == [("file", nouveau.PATH, False)]

    before = len(node.calls)
    dry = uninstall(conn, select([]), Options(), dry_run=True)
    assert [o.result for o in dry.outcomes if o.step == "nouveau"] == ["planned"]
    assert node.changing_calls(before) == [] and nouveau.PATH in node.files

    report = uninstall(conn, select([]), Options())
    assert [o.result for o in report.outcomes if o.step == "nouveau"] == ["changed"] and report.exit_code == 0
    assert nouveau.PATH not in node.files and node.files["/etc/modprobe.d/user.conf"]
    assert len(node.ran("update-initramfs")) == 2  # the install's rebuild, and the uninstall's
    journal = json.loads(node.files[JOURNAL_PATH])
    assert journal["runs"][-1]["command"].startswith("uninstall") and journal["runs"][-1]["status"] == "done"
    assert all(r.get("undone") for r in journal["undo"])

    before = len(node.calls)
    again = uninstall(conn, select([]), Options())
    assert again.outcomes == [] and again.exit_code == 0 and node.changing_calls(before) == []


def test_an_old_journal_removes_only_files_with_gpunode_marker():
    node = gpu_node()
    node.put(JOURNAL_PATH, json.dumps({"schema_version": 1, "runs": [
        {"id": "a", "command": "install nouveau", "status": "done",
         "steps": [{"step": "nouveau", "result": "changed"}]}]}))
    node.put(nouveau.PATH, nouveau.desired_content(None))
    node.put("/etc/apt/sources.list.d/nvidia-container-toolkit.list", "deb https://example.invalid/ ./\n")  # user's
    conn = FakeConnection(node)
    report = uninstall(conn, select([]), Options())
    assert report.exit_code == 0 and nouveau.PATH not in node.files
    assert "/etc/apt/sources.list.d/nvidia-container-toolkit.list" in node.files  # no marker: not gpunode's
    notes = [n for o in report.outcomes for n in o.plan.notes]
    assert any("predates gpunode's undo records" in n for n in notes)
    again = uninstall(conn, select([]), Options())
    assert again.outcomes == []  # from now on the (empty) records decide
