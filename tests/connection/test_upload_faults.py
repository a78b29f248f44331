"""SFTP upload faults at unit level (a fake SFTP server side): a full disk (`OSError: Failure`, as paramiko
reports SSH_FX_FAILURE), a dropped transport, and a Ctrl-C that must not wait for the SFTP close."""

import os
import time

import pytest

from gpunode.cancel import Cancelled
from gpunode.connection.base import NoSpaceError
from gpunode.connection.ssh import SSHConnection, SSHOptions
from gpunode.errors import CommandError, ConnectError


class FakeChannel:
    def __init__(self):
        self.closed = False
        self.timeout = None

    def settimeout(self, value):
        self.timeout = value

    def close(self):
        self.closed = True


class FakeRemoteFile:
    def __init__(self, sftp):
        self.sftp = sftp
        self.written = 0

    def set_pipelined(self, value):
        pass

    def write(self, data):
        if self.sftp.fail_after is not None and self.written + len(data) > self.sftp.fail_after:
            if self.sftp.drop:
                self.sftp.transport.active = False
            raise self.sftp.error
        self.written += len(data)

    def close(self):
        self.sftp.file_closed = True
        if self.sftp.hang_on_close:
            time.sleep(60)  # what paramiko did after a Ctrl-C: wait for acknowledgements that never come


class FakeSFTP:
    def __init__(self, transport, fail_after=None, error=None, drop=False, hang_on_close=False):
        self.transport, self.fail_after, self.error, self.drop = transport, fail_after, error, drop
        self.hang_on_close = hang_on_close
        self.channel = FakeChannel()
        self.file_closed = False

    def get_channel(self):
        return self.channel

    def open(self, path, mode):
        self.path = path
        return FakeRemoteFile(self)


class FakeTransport:
    active = True

    def is_active(self):
        return self.active


class FakeClient:
    def __init__(self):
        self.transport = FakeTransport()

    def get_transport(self):
        return self.transport


class UploadNode(SSHConnection):
    """SSHConnection with a scripted shell and a fake SFTP; `free_kb` is what df reports for /var/tmp."""

    def __init__(self, free_kb=10_000_000, **sftp):
        super().__init__("root@gpu-01", SSHOptions(known_hosts=[]))
        self._client = FakeClient()
        self._privilege_cache = ((), False)
        self.fake_sftp = FakeSFTP(self._client.transport, **sftp)
        self.free_kb = free_kb
        self.lines = []

    def _open_sftp(self):
        self._sftp = self.fake_sftp
        return self.fake_sftp

    def _exec(self, line, stdin, timeout):
        self.lines.append(line)
        if "mktemp-dir" in line:
            return 0, b"/var/tmp/gpunode.abc123\n", b"", False
        if " df -Pk " in line:
            out = (f"Filesystem 1024-blocks Used Available Capacity Mounted on\n"
                   f"/dev/sda1 1000000 999000 {self.free_kb} 100% /\n")
            return 0, out.encode(), b"", False
        return 0, b"", b"", False


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))


@pytest.fixture
def blob(tmp_path):
    path = tmp_path / "NVIDIA-Linux-x86_64-550.run"
    path.write_bytes(os.urandom(300_000))
    return path


def test_disk_full_during_upload_is_named_with_a_df_fix(blob):
    node = UploadNode(free_kb=0, fail_after=100_000, error=OSError("Failure"))
    with pytest.raises(NoSpaceError) as info:
        node.upload(blob, "/root/driver.run")
    assert info.value.message == ("root@gpu-01: no space left on the node in /var/tmp (uploading 300000 bytes; "
                                  "nothing was replaced)")
    assert "df -h /var/tmp" in info.value.fix
    assert not any("install-upload" in line for line in node.lines)  # nothing moved into place
    assert any("gpunode-cleanup" in line for line in node.lines)  # the partial staging copy is removed


def test_an_sftp_failure_with_space_left_is_not_called_disk_full(blob):
    node = UploadNode(free_kb=50_000_000, fail_after=100_000, error=OSError("Failure"))
    with pytest.raises(CommandError, match="the upload to /var/tmp/gpunode.abc123/upload failed \\(Failure\\)") as info:
        node.upload(blob, "/root/driver.run")
    assert not isinstance(info.value, NoSpaceError)


def test_a_connection_dropped_mid_upload_is_a_connect_error(blob):
    node = UploadNode(fail_after=100_000, error=EOFError(), drop=True)
    with pytest.raises(ConnectError, match=r"dropped during the upload \(98304 of 300000 bytes sent\); "
                                           "nothing was installed"):
        node.upload(blob, "/root/driver.run")
    assert node.fake_sftp.channel.closed and node._sftp is None  # the next upload opens a fresh channel


def test_ctrl_c_during_upload_returns_at_once_without_the_sftp_close(blob):
    node = UploadNode(hang_on_close=True)

    def progress(done, total):
        if done > 100_000:
            raise KeyboardInterrupt

    started = time.monotonic()
    with pytest.raises(Cancelled, match="interrupted \\(Ctrl-C\\) during the upload"):
        node.upload(blob, "/root/driver.run", progress=progress)
    assert time.monotonic() - started < 2
    assert node.fake_sftp.channel.closed and not node.fake_sftp.file_closed
    assert not any("install-upload" in line for line in node.lines)


def test_every_sftp_request_has_a_timeout(blob):
    node = UploadNode()
    node._open_sftp = SSHConnection._open_sftp.__get__(node)  # the real one, on a client that returns our fake

    class Client(FakeClient):
        def open_sftp(self_inner):
            return node.fake_sftp

    node._client = Client()
    node.upload(blob, "/root/driver.run")
    assert node.fake_sftp.channel.timeout is not None and 0 < node.fake_sftp.channel.timeout <= 120
    assert node.fake_sftp.file_closed and any("install-upload" in line for line in node.lines)
