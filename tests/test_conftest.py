"""The session guard in tests/conftest.py: it must see gpunode's node-side writes on this machine, and name them."""

from __future__ import annotations

from tests.conftest import NODE_TEMP_DIRS, node_side_changes, node_side_snapshot


def test_the_guard_names_node_state_written_and_temporaries_left(tmp_path):
    state, temp, key = tmp_path / "var-lib-gpunode", tmp_path / "var-tmp", tmp_path / "root" / "gpunode-mok.priv"
    temp.mkdir()
    (temp / "unrelated.XXXXXX").mkdir()
    (temp / "gpunode-realos-build.abcdef").mkdir()  # not a node-side name
    patterns = {str(temp): NODE_TEMP_DIRS["/var/tmp"]}

    def snap():
        return node_side_snapshot((str(state),), patterns, (str(key),))

    before = snap()
    assert node_side_changes(before, snap()) == []
    state.mkdir()
    (state / "run.lock").write_text("pid 1")
    (temp / "gpunode.Ab12Cd").mkdir()
    (temp / ".gpunode-upload.Zz9Yy8").write_bytes(b"x")
    key.parent.mkdir()
    key.write_text("key")
    assert node_side_changes(before, snap()) == sorted(
        [str(state), str(state / "run.lock"), str(temp / "gpunode.Ab12Cd"), str(temp / ".gpunode-upload.Zz9Yy8"),
         str(key)])


def test_the_guard_sees_a_journal_rewritten_in_place(tmp_path):
    state = tmp_path / "gpunode"
    state.mkdir()
    journal = state / "journal.json"
    journal.write_text("{}")
    before = node_side_snapshot((str(state),), {}, ())
    journal.write_text('{"runs": []}')
    assert node_side_changes(before, node_side_snapshot((str(state),), {}, ())) == [str(journal)]
