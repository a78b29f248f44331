"""This run's record in the node's journal: records round-trip through the node, and writes are batched (one per
batch of actions; a step's result waits for the next write or the run's finish)."""

from __future__ import annotations

import json

from gpunode.journal import JOURNAL_PATH, read_journal
from gpunode.records import FileRecord
from gpunode.runrecord import Journal
from tests.fakes.connection import FakeConnection, FakeNode


def test_records_added_and_marked_undone_round_trip_through_the_node():
    node = FakeNode()
    conn = FakeConnection(node)
    journal = Journal(conn, "install")
    journal.undo("nouveau", [FileRecord(path="/etc/modprobe.d/blacklist-nouveau.conf", existed=False, sha256="b" * 64)])
    saved = json.loads(node.files[JOURNAL_PATH])["undo"]
    assert saved[0]["kind"] == "file" and saved[0]["step"] == "nouveau" and saved[0]["run"] == journal.run["id"]
    again = Journal(conn, "uninstall")
    [record] = again.undo_records
    assert isinstance(record, FileRecord) and record.existed is False
    again.undone({record.id})
    assert read_journal(conn)["undo"][0].undone == again.run["id"]


def test_a_batch_is_one_write_and_a_step_result_waits_for_the_next_write():
    node = FakeNode()
    conn = FakeConnection(node)
    journal = Journal(conn, "install")
    saved: list[str] = []
    real = conn.write_file

    def spy(path, content, **kwargs):
        saved.append(path)
        return real(path, content, **kwargs)
    conn.write_file = spy  # type: ignore[method-assign]
    with journal.batch():
        journal.begin()
        journal.change("runtime", "configure docker", (("restart", "docker.service"),))
        journal.undo("runtime", [FileRecord(path="/etc/docker/daemon.json", existed=True)])
        journal.settle((("restart", "docker.service"),))
        assert saved == []
    assert saved == [JOURNAL_PATH]
    journal.step("runtime", "changed", "configured", [])
    assert saved == [JOURNAL_PATH]  # not yet
    journal.finish("done")
    assert saved == [JOURNAL_PATH, JOURNAL_PATH]
    data = json.loads(node.files[JOURNAL_PATH])
    assert data["runs"][-1]["steps"][0]["step"] == "runtime" and data["runs"][-1]["status"] == "done"
    assert data["pending"] == [] and data["undo"][0]["path"] == "/etc/docker/daemon.json"
