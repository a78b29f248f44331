"""The undo look (gpunode/actions/base.py UNDO_LOOK): several looks in one command, run here by the real `sh`
on files under a temporary directory (read-only), with file contents that try to forge the framing."""

from __future__ import annotations

import hashlib
import subprocess

from gpunode.actions.base import undo_looks
from gpunode.connection.base import Result
from gpunode.shell import Script, to_argv

FORGED = "line one\nlook 1\nfile 0000 /etc/shadow\n"


class ShHere:
    """Runs a Script with the real sh, without sudo; nothing it runs here writes anything."""

    name = "here"
    calls = 0

    def run(self, cmd, *, sudo=False, stdin=None, timeout=None):
        assert isinstance(cmd, Script)
        self.calls += 1
        done = subprocess.run(to_argv(cmd), capture_output=True, text=True, timeout=60, check=False)
        return Result("undo-look", done.returncode, done.stdout, done.stderr)


def test_files_and_texts_in_one_command_and_no_content_forges_a_boundary(tmp_path):
    a, b, empty, gone = tmp_path / "a.conf", tmp_path / "b.json", tmp_path / "empty", tmp_path / "gone"
    a.write_text(FORGED)
    b.write_text('{"x": 1}')  # no newline at the end
    empty.write_text("")
    conn = ShHere()
    paths = [str(p) for p in (a, b, empty, gone)]
    files, texts, units = undo_looks(conn, ("files", *paths), ("texts", *paths), ("units",))  # type: ignore[arg-type]
    assert conn.calls == 1
    assert files == {str(a): hashlib.sha256(FORGED.encode()).hexdigest(),
                     str(b): hashlib.sha256(b'{"x": 1}').hexdigest(),
                     str(empty): hashlib.sha256(b"").hexdigest(), str(gone): "-"}
    assert texts == {str(a): FORGED, str(b): '{"x": 1}', str(empty): ""}
    assert units == {}


def test_a_failed_look_is_unknown_for_every_part():
    class Failing:
        name = "n"

        def run(self, cmd, **kwargs):
            return Result("undo-look", 1, "", "boom")
    assert undo_looks(Failing(), ("files", "/x"), ("texts", "/x")) == [None, None]  # type: ignore[arg-type]
