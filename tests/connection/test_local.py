"""LocalConnection with a real /bin/sh, on temporary paths only."""

import os
import stat
import time

import pytest

from gpunode.connection.base import Connection
from gpunode.connection.local import LocalConnection
from gpunode.errors import CommandError, CommandTimeout
from gpunode.shell import Script, Secret


@pytest.fixture
def conn():
    return LocalConnection()


def test_run_argv_exit_code_and_streams(conn):
    result = conn.run(Script('echo out; echo err >&2; exit 7'))
    assert (result.exit_code, result.stdout, result.stderr) == (7, "out\n", "err\n")
    with pytest.raises(CommandError, match="exit code 7"):
        result.check()


def test_values_reach_the_shell_quoted(conn, tmp_path):
    hostile = "a b; touch " + str(tmp_path / "pwned") + " $(id) `id` 'q\""
    result = conn.run(["printf", "%s", hostile])
    assert result.stdout == hostile
    assert not (tmp_path / "pwned").exists()


def test_stdin_is_delivered_and_closed(conn):
    assert conn.run(["cat"], stdin=b"hello").stdout == "hello"
    assert conn.run(["cat"]).stdout == ""  # no stdin: EOF at once, never hangs


def test_wall_clock_timeout_kills_the_command(conn):
    start = time.monotonic()
    result = conn.run(Script("sleep 30"), timeout=0.5)
    assert result.timed_out and time.monotonic() - start < 10
    with pytest.raises(CommandTimeout):
        result.check()


def test_large_stdout_and_stderr_together_do_not_deadlock(conn):
    result = conn.run(Script("head -c 3000000 /dev/zero | tr '\\0' a; head -c 3000000 /dev/zero | tr '\\0' b >&2"),
                      timeout=60)
    assert len(result.stdout) == 3_000_000 and len(result.stderr) == 3_000_000


def test_read_file_missing_returns_none(conn, tmp_path):
    assert conn.read_file(str(tmp_path / "nope")) is None
    (tmp_path / "yes").write_text("content\n")
    assert conn.read_file(str(tmp_path / "yes")) == "content\n"


def test_write_file_is_atomic_and_keeps_a_backup(conn, tmp_path):
    target = tmp_path / "etc" / "modprobe.d" / "x.conf"  # the directory does not exist yet
    first = conn.write_file(str(target), "one\n", mode=0o640, sudo=False)
    assert first.changed and first.backup is None
    assert target.read_text() == "one\n" and stat.S_IMODE(target.stat().st_mode) == 0o640
    inode_before = target.stat().st_ino

    second = conn.write_file(str(target), "two\n", sudo=False)
    assert second.changed and second.backup is not None
    assert target.read_text() == "two\n"
    assert open(second.backup).read() == "one\n"  # the previous content survives
    assert target.stat().st_ino != inode_before  # replaced by rename, not rewritten in place
    assert not [p for p in target.parent.iterdir() if ".gpunode-tmp" in p.name]  # no temp file left

    same = conn.write_file(str(target), "two\n", sudo=False)
    assert not same.changed and same.backup is None
    assert len(list(target.parent.iterdir())) == 2  # no backup for an identical write


def test_failed_write_leaves_the_old_file_untouched(conn, tmp_path):
    target = tmp_path / "f.conf"
    target.write_text("keep me\n")
    with pytest.raises(CommandError):
        conn.write_file(str(target), "new\n", mode=0o777777, sudo=False)  # invalid mode: chmod fails
    assert target.read_text() == "keep me\n"
    assert [p.name for p in tmp_path.iterdir()] == ["f.conf"]


def test_upload_copies_bytes(conn, tmp_path):
    source = tmp_path / "src.bin"
    source.write_bytes(os.urandom(100_000))
    conn.upload(source, str(tmp_path / "dst" / "out.bin"), mode=0o600, sudo=False)
    assert (tmp_path / "dst" / "out.bin").read_bytes() == source.read_bytes()


class RecordingConnection(Connection):
    """Checks privilege handling without sudo on this machine: records what would be sent."""

    def __init__(self, uid: int, sudo_n_ok: bool, password: str | None = None):
        super().__init__(become_password=Secret(password) if password else None)
        self.uid, self.sudo_n_ok, self.sent = uid, sudo_n_ok, []

    def _exec(self, line, stdin, timeout):
        self.sent.append((line, stdin))
        if line.endswith("id -u"):
            return 0, f"{self.uid}\n".encode(), b"", False
        if line.startswith("sudo -n"):
            return (0, b"", b"", False) if self.sudo_n_ok else (1, b"", b"sudo: a password is required\n", False)
        return 0, b"", b"", False


def test_root_runs_without_sudo():
    c = RecordingConnection(uid=0, sudo_n_ok=False)
    c.run(["true"], sudo=True)
    assert not c.sent[-1][0].startswith("sudo")


def test_non_root_uses_sudo_n_by_default():
    c = RecordingConnection(uid=1000, sudo_n_ok=True)
    c.run(["apt-get", "update"], sudo=True)
    assert c.sent[-1][0].startswith("sudo -n -- env ")


def test_non_root_without_password_gets_a_clear_error():
    c = RecordingConnection(uid=1000, sudo_n_ok=False)
    with pytest.raises(CommandError, match="sudo asks for a password") as info:
        c.run(["true"], sudo=True)
    assert "ask-become-pass" in (info.value.fix or "")


def test_become_password_goes_on_stdin_never_on_the_command_line():
    c = RecordingConnection(uid=1000, sudo_n_ok=False, password="hunter2")
    result = c.run(["cat"], sudo=True, stdin=b"payload")
    line, stdin = c.sent[-1]
    assert line.startswith("sudo -S -k -p '' -- ")
    assert "hunter2" not in line and stdin == b"hunter2\npayload"
    assert "hunter2" not in result.command and "hunter2" not in repr(c._become_password)
