"""Upload faults at unit level, with a fake exec channel standing in for the node's receiving script: a full
disk (the script exits early with ENOSPC on stderr), a dropped transport, a stall, a Ctrl-C that must close the
channel at once, and a sha256 mismatch. In every case nothing is moved into place and the temp file goes."""

import hashlib
import os
import subprocess
import sys
import time

import pytest

from gpunode.cancel import Cancelled
from gpunode.connection.base import NoSpaceError
from gpunode.connection.ssh import SEND_TIMEOUT, SSHConnection, SSHOptions
from gpunode.errors import CommandError, ConnectError

STAGED = "/root/.gpunode-upload.Ab12Cd"


class FakeTransport:
    active = True

    def __init__(self, node):
        self.node = node

    def is_active(self):
        return self.active

    def open_session(self, timeout=None):
        self.node.channel = FakeChannel(self.node)
        return self.node.channel


class FakeChannel:
    """The node side: receives stdin, then answers as UPLOAD_RECEIVE does (or fails as scripted)."""

    out_max_packet_size = 32768  # what OpenSSH's sshd offers for a session channel

    def __init__(self, node):
        self.node, self.timeout, self.line = node, None, None
        self.received = bytearray()
        self.sizes = []
        self.closed = self.eof_received = False
        self.status = None
        self.out, self.err = b"", b""

    def settimeout(self, value):
        self.timeout = value

    def exec_command(self, line):
        self.line = line

    def exit_status_ready(self):
        return self.status is not None

    def sendall(self, data):
        node = self.node
        if self.closed:
            raise OSError("Socket is closed")
        if node.fail_after is not None and len(self.received) + len(data) > node.fail_after:
            if node.fault == "disk-full":  # the script exits; the next send finds the channel closed
                self.status, self.err = 1, b"cat: write error: No space left on device\n"
                self.closed = self.eof_received = True
                return
            if node.fault == "drop":
                self.node.transport.active = False
                raise EOFError()
            if node.fault == "stall":
                raise TimeoutError()
        self.received += data
        self.sizes.append(len(data))

    def shutdown_write(self):
        if self.closed:
            return
        body = bytes(self.received)
        if self.node.tamper:
            body = body[:-1] + bytes([body[-1] ^ 0xFF])  # always a different last byte
        digest = hashlib.sha256(body).hexdigest()
        self.out = f"gpunode-received {len(body)} {digest}\n{STAGED}".encode()
        self.status, self.eof_received = 0, True

    def recv_ready(self):
        return bool(self.out)

    def recv(self, n):
        data, self.out = self.out, b""
        return data

    def recv_stderr_ready(self):
        return bool(self.err)

    def recv_stderr(self, n):
        data, self.err = self.err, b""
        return data

    def recv_exit_status(self):
        return self.status

    def close(self):
        self.closed = True


class FakeClient:
    def __init__(self, node):
        self.transport = FakeTransport(node)

    def get_transport(self):
        return self.transport


class UploadNode(SSHConnection):
    """SSHConnection whose exec channel is the fake above; other commands (install, discard) are recorded."""

    def __init__(self, fail_after=None, fault=None, tamper=False):
        super().__init__("root@gpu-01", SSHOptions(known_hosts=[]))
        self.fail_after, self.fault, self.tamper = fail_after, fault, tamper
        self._client = FakeClient(self)
        self.transport = self._client.transport
        self._privilege_cache = ((), False)
        self.channel = None
        self.lines = []

    def _exec(self, line, stdin, timeout):
        self.lines.append(line)
        return 0, b"", b"", False


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))


@pytest.fixture
def blob(tmp_path):
    path = tmp_path / "NVIDIA-Linux-x86_64-550.run"
    path.write_bytes(os.urandom(700_000))
    return path


def installed(node):
    return any("gpunode-upload-install" in line for line in node.lines)


def test_a_clean_upload_is_verified_then_moved_into_place_with_its_mode(blob):
    node = UploadNode()
    seen = []
    node.upload(blob, "/root/driver.run", mode=0o755, progress=lambda done, total: seen.append((done, total)))
    assert bytes(node.channel.received) == blob.read_bytes()
    assert "gpunode-upload-receive" in node.channel.line and "/root/driver.run" in node.channel.line
    assert "700000" in node.channel.line  # the node checks the length it received
    install = next(line for line in node.lines if "gpunode-upload-install" in line)
    assert STAGED in install and "/root/driver.run" in install and " 755" in install
    assert seen[-1] == (700_000, 700_000) and len(seen) > 1
    assert 0 < node.channel.timeout <= SEND_TIMEOUT  # every send waits a bounded time


def test_the_file_goes_out_in_pieces_of_one_packet_each_and_arrives_whole(blob):
    """paramiko's sendall copies the rest of what it is given after every packet: the upload hands it one packet's
    payload at a time (the node's maximum packet, less paramiko's 64 bytes of headroom), never a whole chunk."""
    node = UploadNode()
    node.upload(blob, "/root/driver.run")
    sizes = node.channel.sizes
    assert bytes(node.channel.received) == blob.read_bytes()
    assert max(sizes) == FakeChannel.out_max_packet_size - 64
    assert sum(sizes) == 700_000 and len(sizes) >= 700_000 // (FakeChannel.out_max_packet_size - 64)


def test_a_sha256_mismatch_installs_nothing_and_removes_the_temp_file(blob):
    node = UploadNode(tamper=True)
    with pytest.raises(CommandError, match="arrived altered .*sha256 mismatch.*nothing was installed"):
        node.upload(blob, "/root/driver.run")
    assert not installed(node)
    assert any("gpunode-upload-discard" in line and STAGED in line for line in node.lines)


def test_disk_full_during_upload_is_named_with_a_df_fix(blob):
    node = UploadNode(fail_after=300_000, fault="disk-full")
    with pytest.raises(NoSpaceError) as info:
        node.upload(blob, "/root/driver.run")
    assert info.value.message == ("root@gpu-01: no space left on the node in /root (uploading 700000 bytes; "
                                  "nothing was replaced)")
    assert "df -h /root" in info.value.fix
    assert not installed(node)


def test_a_connection_dropped_mid_upload_is_a_connect_error(blob):
    node = UploadNode(fail_after=300_000, fault="drop")
    with pytest.raises(ConnectError, match=r"dropped during the upload \(262144 of 700000 bytes sent\); "
                                           "nothing was installed"):
        node.upload(blob, "/root/driver.run")
    assert node.channel.closed and not installed(node)


def test_a_stalled_node_is_detected(blob):
    node = UploadNode(fail_after=300_000, fault="stall")
    with pytest.raises(ConnectError, match=f"stalled for {SEND_TIMEOUT:.0f}s \\(262144 of 700000 bytes sent\\)"):
        node.upload(blob, "/root/driver.run")
    assert node.channel.closed and not installed(node)


def test_ctrl_c_during_upload_closes_the_channel_at_once(blob):
    node = UploadNode()

    def progress(done, total):
        if done > 100_000:
            raise KeyboardInterrupt

    started = time.monotonic()
    with pytest.raises(Cancelled, match="interrupted \\(Ctrl-C\\) during the upload"):
        node.upload(blob, "/root/driver.run", progress=progress)
    assert time.monotonic() - started < 2
    assert node.channel.closed and len(node.channel.received) < 700_000
    assert not installed(node)


def _stream_hash(tmp_path, data, dest):
    """The node-side program that writes and hashes a large upload as it arrives, run here on its own."""
    from gpunode.connection.base import _STREAM_HASH

    return subprocess.run([sys.executable, "-I", "-S", "-c", _STREAM_HASH, str(dest)], input=data,
                          capture_output=True, timeout=60)


def test_the_streaming_hash_writes_every_byte_and_answers_their_sha256_after_its_marker(tmp_path):
    data = os.urandom(3 << 20)
    dest = tmp_path / ".gpunode-upload.X"
    dest.write_bytes(b"stale content longer than nothing")
    done = _stream_hash(tmp_path, data, dest)
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().split("\n") == ["gpunode-py", hashlib.sha256(data).hexdigest(), ""]
    assert dest.read_bytes() == data


def test_the_streaming_hash_reads_nothing_when_it_cannot_open_the_file_and_names_a_full_disk(tmp_path):
    done = _stream_hash(tmp_path, b"x" * 100, tmp_path / "missing" / "file")
    assert done.returncode == 3 and done.stdout == b""  # no marker: the receive script gives the stream to cat
    full = _stream_hash(tmp_path, os.urandom(1 << 20), "/dev/full")
    assert full.returncode == 1 and full.stdout == b"gpunode-py\n"  # marker, then the failure: the upload fails
    assert b"gpunode-receive: No space left on device" in full.stderr
