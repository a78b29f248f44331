"""The remote write on this machine's real /bin/sh, inside tmp_path only: nothing is renamed into place unless
every byte arrived intact; symlinks are written through; a full disk is named as such.

A "node-side shim" emulates a full disk: a `cat` earlier on PATH that writes to /dev/full, so the kernel
itself answers ENOSPC to the real write (nothing on this machine is filled up)."""

import hashlib
import os
import shutil
import stat

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpunode.connection.base import _WRITE_FILE, NoSpaceError
from gpunode.connection.local import LocalConnection
from gpunode.errors import CommandError
from gpunode.shell import Script


@pytest.fixture
def conn():
    c = LocalConnection()
    c._privilege_cache = ((), False)  # run as whoever runs the tests: everything stays in tmp_path
    return c


def leftovers(directory):
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(".gpunode-tmp"))


def run_write(conn, path, stdin: bytes, declared: bytes):
    """The write script fed `stdin` while told to expect `declared` (what a cut connection looks like)."""
    args = (str(path), "644", "1", str(len(declared)), hashlib.sha256(declared).hexdigest())
    return conn.run(Script(_WRITE_FILE.body, args, _WRITE_FILE.name), stdin=stdin)


def test_half_of_the_content_never_replaces_the_file(conn, tmp_path):
    journal = tmp_path / "journal.json"
    journal.write_text('{"runs": []}\n')
    full = b'{"runs": [' + b'{"step": "driver"},' * 1200 + b"]}\n"  # about 22 kB, like the real journal
    result = run_write(conn, journal, full[: len(full) // 2], full)
    assert result.exit_code == 46 and "only 11" in result.stderr
    assert journal.read_text() == '{"runs": []}\n'
    assert leftovers(tmp_path) == []


def test_same_length_but_wrong_bytes_never_replace_the_file(conn, tmp_path):
    target = tmp_path / "x.conf"
    target.write_text("old\n")
    result = run_write(conn, target, b"evil\n", b"good\n")
    assert result.exit_code == 46 and "sha256" in result.stderr
    assert target.read_text() == "old\n" and leftovers(tmp_path) == []


def test_write_file_error_for_a_short_transfer_names_the_cause(conn, tmp_path, monkeypatch):
    target = tmp_path / "blacklist.conf"
    target.write_text("old\n")
    real_exec = conn._exec

    def cut(line, stdin, timeout):  # the node receives only half of what was sent
        return real_exec(line, stdin[: len(stdin) // 2], timeout)

    monkeypatch.setattr(conn, "_exec", cut)
    with pytest.raises(CommandError, match="only 4 of 8 bytes arrived; the previous file was kept") as info:
        conn.write_file(str(target), "new one\n")
    assert "run the same command again" in info.value.fix
    assert target.read_text() == "old\n"
    monkeypatch.undo()
    assert conn.write_file(str(target), "new one\n").changed  # fault cleared: converges
    assert target.read_text() == "new one\n"


def test_a_symlink_is_written_through_and_stays_a_symlink(conn, tmp_path):
    managed = tmp_path / "cm" / "cuda.list"
    managed.parent.mkdir()
    managed.write_text("deb old\n")
    link_dir = tmp_path / "sources.list.d"
    link_dir.mkdir()
    link = link_dir / "cuda.list"
    link.symlink_to(managed)
    outcome = conn.write_file(str(link), "deb new\n")
    assert link.is_symlink() and os.readlink(link) == str(managed)
    assert managed.read_text() == "deb new\n"
    assert outcome.backup and outcome.backup.startswith(str(managed) + ".gpunode-bak.")
    assert open(outcome.backup).read() == "deb old\n"
    assert not conn.write_file(str(link), "deb new\n").changed  # idempotent through the link


def test_a_relative_symlink_is_resolved_from_its_own_directory(conn, tmp_path):
    (tmp_path / "real.conf").write_text("a\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "link.conf").symlink_to("../real.conf")
    conn.write_file(str(tmp_path / "sub" / "link.conf"), "b\n", backup=False)
    assert (tmp_path / "real.conf").read_text() == "b\n"
    assert (tmp_path / "sub" / "link.conf").is_symlink()


def test_a_symlink_to_a_directory_is_refused_with_a_fix(conn, tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "d")
    with pytest.raises(CommandError, match="cannot write through the symlink") as info:
        conn.write_file(str(tmp_path / "link"), "x\n")
    assert info.value.fix.startswith("point the symlink at a regular file, or remove it: rm ")


def test_mode_is_applied_and_new_directories_are_made(conn, tmp_path):
    target = tmp_path / "a" / "b" / "daemon.json"
    conn.write_file(str(target), "{}\n", mode=0o600)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600 and target.read_text() == "{}\n"


@pytest.fixture
def full_disk_conn(tmp_path):
    """A connection whose node has a `cat` that writes to /dev/full when stdin is copied to a file."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    shims = tmp_path / "shims"
    shims.mkdir()
    (shims / "cat").write_text('#!/bin/sh\n[ $# -eq 0 ] && exec /bin/cat >/dev/full\nexec /bin/cat "$@"\n')
    (shims / "cat").chmod(0o755)

    class FullDisk(LocalConnection):
        def _exec(self, line, stdin, timeout):
            return super()._exec(line.replace("PATH=/usr/local/sbin:", f"PATH={shims}:/usr/local/sbin:", 1),
                                 stdin, timeout)

    c = FullDisk()
    c._privilege_cache = ((), False)
    return c


def test_disk_full_is_named_with_the_directory_and_df_fix(full_disk_conn, tmp_path):
    target = tmp_path / "etc" / "modprobe.d" / "blacklist-nouveau.conf"
    target.parent.mkdir(parents=True)
    target.write_text("old\n")
    with pytest.raises(NoSpaceError) as info:
        full_disk_conn.write_file(str(target), "blacklist nouveau\n")
    assert info.value.message.endswith(
        f"no space left on the node in {target.parent} (writing {target}; nothing was replaced)")
    assert f"df -h {target.parent}" in info.value.fix
    assert target.read_text() == "old\n" and leftovers(target.parent) == []
    assert LocalConnection().write_file(str(target), "blacklist nouveau\n", sudo=False).changed  # space again


names = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00/"), min_size=1, max_size=20).filter(
    lambda n: n not in (".", "..") and len(n.encode()) < 200)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(directory=names, name=names, content=st.binary(max_size=3000))
@example(directory="dir\n", name="-n\n", content=b"x")
@example(directory="$(touch pwned)", name="'; rm -rf ~ '", content=b"")
@example(directory=" ", name="*", content=b"\n\n")
def test_any_path_and_content_round_trip_through_the_write_script(conn, tmp_path, directory, name, content):
    """Paths are values that reach the node's shell: quotes, newlines, leading dashes, `$(...)` included."""
    base = tmp_path / "p"
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir()
    target = base / directory / name
    outcome = conn.write_file(str(target), content, backup=False)
    assert outcome.changed and target.read_bytes() == content
    assert sorted(os.listdir(base)) == [directory] and sorted(os.listdir(base / directory)) == [name]
    assert conn.read_file(str(target)) == content.decode("utf-8", "replace")
