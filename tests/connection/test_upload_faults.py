"""Upload faults at unit level, with a fake exec channel standing in for the node's receiving script: a full
disk (the script exits early with ENOSPC on stderr), a dropped transport, a stall, a Ctrl-C that must close the
channel at once, and a sha256 mismatch. In every case nothing is moved into place and the temp file goes."""

import hashlib
import os
import shutil
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


# The receiving script itself, without python3 on PATH, under the shells a node may log in with: it hashes the file
# as `cat` writes it (the stream is held open until the hash has read past 16 MiB, which it could not do if it ran
# after the transfer), and a stream cut short, a hash tool that dies, a full disk each end in a failure that says so,
# with nothing left beside the destination: no temp file, no work directory.
SHELLS = [s for s in (["dash"], ["bash", "--posix"], ["busybox", "sh"]) if shutil.which(s[0])]
LARGE = (17 << 20) + 5  # past the 16 MiB from which the node hashes while it receives
OPENSSL = shutil.which("openssl")
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


def _shims(tmp_path, **tools):
    shims = tmp_path / "shims"
    shims.mkdir(exist_ok=True)
    tools.setdefault("python3", "#!/bin/sh\nexit 127\n")  # a node without python3 (or one that cannot start)
    for name, text in tools.items():
        (shims / name).write_text(text)
        (shims / name).chmod(0o755)
    return shims


def _receive(shell, shims, dest, size, *, full=False):
    """The receiving script under `shell`; `full`: in a mount namespace of its own where `dest`'s directory is an
    8 MiB tmpfs (this machine's mounts are untouched), whose entries are listed on stderr after `left:`."""
    from gpunode.connection.base import UPLOAD_RECEIVE

    env = {**os.environ, "PATH": f"{shims}:{os.environ['PATH']}"}
    mount = ["unshare", "-m", "sh", "-c", 'mount -t tmpfs -o size=8m tmpfs "$0" || exit; "$@"; code=$?; '
             'echo left: $(ls -A "$0") >&2; exit $code', str(dest.parent)]
    return subprocess.Popen([*(mount if full else []), *shell, "-c", UPLOAD_RECEIVE.body, "gpunode-upload-receive",
                             str(dest), str(size)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)


def _feed(proc, data, *, until=None):
    """Write `data` to the receiver; with `until`, hold its stdin open after all but the last MiB until `until()`."""
    assert proc.stdin is not None
    head = len(data) - (1 << 20) if until else len(data)
    for at in range(0, head, 1 << 20):
        proc.stdin.write(data[at:min(at + (1 << 20), head)])
        proc.stdin.flush()
    if until:
        deadline = time.monotonic() + 60
        while not until() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.02)
        assert until(), "the hash did not read the file while the upload was still arriving"
        proc.stdin.write(data[head:])
    out, err = proc.communicate(timeout=120)  # (closes its stdin first)
    return proc.returncode, out.decode(), err.decode()


def _left(directory):
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(".gpunode-"))


@pytest.mark.skipif(OPENSSL is None, reason="no openssl here")
@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_without_python3_the_receiver_hashes_the_file_while_it_arrives(shell, tmp_path):
    log = tmp_path / "hashed"
    shims = _shims(tmp_path, openssl=f'#!/bin/sh\ntee -- "{log}" | exec {OPENSSL} "$@"\n')  # what openssl read
    data = os.urandom(LARGE)
    (tmp_path / "to").mkdir()
    proc = _receive(shell, shims, tmp_path / "to" / "driver.run", LARGE)
    code, out, err = _feed(proc, data, until=lambda: log.exists() and log.stat().st_size >= 16 << 20)
    assert code == 0, err
    head, staged = out.split("\n")
    assert head == f"gpunode-received {LARGE} {hashlib.sha256(data).hexdigest()}"
    assert open(staged, "rb").read() == data and log.read_bytes() == data  # openssl read the file, once
    assert _left(tmp_path / "to") == [os.path.basename(staged)]  # the staged file only: no work directory


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_without_a_working_openssl_the_receiver_streams_into_sha256sum(shell, tmp_path):
    shims = _shims(tmp_path, openssl="#!/bin/sh\necho 'Error setting digest' >&2; echo '(stdin)= '; exit 1\n")
    data = os.urandom(LARGE)
    (tmp_path / "to").mkdir()
    code, out, err = _feed(_receive(shell, shims, tmp_path / "to" / "driver.run", LARGE), data)
    assert code == 0, err
    assert out.split("\n")[0] == f"gpunode-received {LARGE} {hashlib.sha256(data).hexdigest()}"


@pytest.mark.skipif(OPENSSL is None, reason="no openssl here")
@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
@pytest.mark.parametrize("fault", ["cut", "hash-tool-dies", "hash-tool-killed", "disk-full"])
def test_without_python3_every_failure_is_named_and_leaves_nothing_behind(shell, fault, tmp_path):
    if fault == "disk-full" and (os.geteuid() != 0 or not shutil.which("unshare")):
        pytest.skip("a tmpfs in a mount namespace of its own needs root and unshare")
    tools = {}
    if fault.startswith("hash-tool"):  # an openssl that answers the receiver's check of it, then stops after 2 MiB
        stop = "exit 1" if fault == "hash-tool-dies" else "kill -9 $$"
        tools["openssl"] = (f'#!/bin/sh\nn=$(head -c 2097152 | wc -c)\n[ "$n" -gt 0 ] || '
                            f'{{ echo "{EMPTY_SHA256} *stdin"; exit 0; }}\n{stop}\n')
    shims = _shims(tmp_path, **tools)
    data = os.urandom(LARGE)
    (tmp_path / "to").mkdir()
    proc = _receive(shell, shims, tmp_path / "to" / "driver.run", LARGE, full=fault == "disk-full")
    try:
        code, out, err = _feed(proc, data[:3 << 20] if fault == "cut" else data)
    except BrokenPipeError:  # the receiver stopped reading (the full disk): what it said is all there is
        proc.stdin = None
        out, err = (b.decode() for b in proc.communicate(timeout=120))
        code = proc.returncode
    assert code != 0 and "gpunode-received" not in out
    expected = {"cut": f"gpunode-short only {3 << 20} of {LARGE} bytes arrived",
                "hash-tool-dies": "gpunode-hash the node's openssl stopped before the end of the upload (exit 1)",
                "hash-tool-killed": "gpunode-hash the node's openssl stopped before the end of the upload (exit 137)",
                "disk-full": "No space left on device"}[fault]
    assert expected in err
    if fault == "disk-full":  # (the tmpfs went with its namespace: it listed what it held)
        assert err.endswith("\nleft:\n")
    else:
        assert _left(tmp_path / "to") == []
