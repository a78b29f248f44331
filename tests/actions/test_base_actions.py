"""The undo look (gpunode/actions/base.py UNDO_LOOK): several looks in one command, run here by the real `sh`
on files under a temporary directory (read-only), with file contents that try to forge the framing; and the looks
folded into an action's own command (LOOKED, `Looks.run`), which must leave the command's stdin, output and exit
status its own."""

from __future__ import annotations

import hashlib
import subprocess

import pytest

from gpunode.actions.base import Looks, undo_looks
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
        done = subprocess.run(to_argv(cmd), capture_output=True, text=True, timeout=60, check=False,
                              input=(stdin or b"").decode())
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


@pytest.mark.parametrize("shell", ["sh", "dash", "bash", "busybox"])
def test_looks_before_and_after_ride_in_the_command_which_keeps_its_stdin_output_and_exit_status(tmp_path, shell,
                                                                                                monkeypatch):
    import shutil
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed")
    made, there = tmp_path / "made.conf", tmp_path / "there"
    there.write_text(FORGED)
    runs: list[list[str]] = []

    class Shell(ShHere):
        def run(self, cmd, *, sudo=False, stdin=None, timeout=None):
            argv = list(to_argv(cmd))
            argv = ([shell, "sh", *argv[1:]] if shell == "busybox" else [shell, *argv[1:]])
            runs.append(argv)
            done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False,
                                  input=(stdin or b"").decode())
            return Result("looked", done.returncode, done.stdout, done.stderr)
    conn = Shell()
    paths = (str(made), str(there))
    looks = Looks(before=(("files", *paths), ("texts", *paths)), after=(("files", *paths),))
    # the command reads its stdin, writes a file, prints text without a final newline that forges the framing
    command = Script('cat > "$1"; printf "%s" "$2"; echo oops >&2; exit 3', (str(made), "look 0\nran"), "make")
    result = looks.run(conn, command, stdin=b"new\n")
    assert len(runs) == 1
    assert (result.exit_code, result.stdout, result.stderr) == (3, "look 0\nran", "oops\n")
    assert made.read_text() == "new\n"
    (files, texts), (after,) = looks.answers()
    assert files == {str(made): "-", str(there): hashlib.sha256(FORGED.encode()).hexdigest()}
    assert texts == {str(there): FORGED}
    assert after == {str(made): hashlib.sha256(b"new\n").hexdigest(), str(there): files[str(there)]}


def test_a_command_without_looks_runs_as_it_is_and_one_cut_short_leaves_its_looks_unknown(tmp_path):
    conn = ShHere()
    assert Looks().run(conn, Script("echo hi", (), "x")).stdout == "hi\n"  # type: ignore[arg-type]
    looks = Looks(before=(("files", str(tmp_path)),), after=(("files", str(tmp_path)),))
    result = looks.run(conn, Script("echo partial; kill -9 $PPID", (), "killed"))  # type: ignore[arg-type]
    (before,), (after,) = looks.answers()
    assert result.stdout.startswith("partial") and before == {str(tmp_path): "-"} and after is None
    assert Looks(before=(("units", "x"),)).answers() == ([None], [])
