"""The upload against a real sshd: the node hashes a large file as it arrives: python3 as it writes it, where the
node has python3; where not, openssl (sha256sum where there is no working openssl) reads the temp file as `cat`
writes it; where even that cannot be set up (no dd), openssl or sha256sum after the transfer. A stream cut short or
altered on its way, a hash tool that dies and a full disk are never placed: not under its name, not as a temp file
or a work directory beside it."""

import hashlib
import os

import paramiko
import pytest

from gpunode.connection.base import NoSpaceError
from gpunode.connection.ssh import SSHConnection, SSHOptions
from gpunode.errors import CommandError

BIG = 17 * 1024 * 1024 + 5  # past the 16 MiB from which the node hashes with openssl
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


def lying_openssl(answer: str) -> str:
    """An openssl that passes the receiver's check of it (the sha256 of nothing) and answers `answer` for the rest."""
    return (f'#!/bin/sh\nif [ "$(wc -c)" -eq 0 ]; then echo "{EMPTY_SHA256} *stdin"; else echo "{answer} *stdin"; '
            "fi\n")


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home" / ".ssh").mkdir(parents=True)


@pytest.fixture
def node(sim_node):
    return sim_node("ubuntu-22.04-nogpu")


@pytest.fixture
def payload(tmp_path):
    path = tmp_path / "NVIDIA-Linux-x86_64-570.run"
    path.write_bytes(os.urandom(BIG))
    return path


def connect(node) -> SSHConnection:
    return SSHConnection(f"root@127.0.0.1:{node.port}",
                         SSHOptions(identity=[str(node.key_path)], known_hosts=[str(node.known_hosts)]))


PYTHON = "/opt/nodesim/python/bin/python3"  # the simulator's private interpreter, put on PATH as a node's python3


def with_python3(node) -> None:
    os.symlink(PYTHON, node.root / "usr/bin/python3")  # an absolute link, resolved inside the node


def leftovers(node, directory="var/tmp") -> list[str]:
    return sorted(p.name for p in (node.root / directory).iterdir() if p.name.startswith(".gpunode-"))


@pytest.mark.parametrize("receiver", ["follow", "after"])
def test_a_large_upload_is_hashed_by_the_nodes_openssl_and_its_answer_is_checked(node, payload, receiver):
    """A node whose openssl answers a well-formed but wrong sha256 gets nothing installed: the node's own answer
    is the one compared (and openssl is the tool asked for a file this large), as it follows the file or after."""
    if receiver == "after":
        node.remove("/usr/bin/dd")
    want = hashlib.sha256(payload.read_bytes()).hexdigest()
    with connect(node) as conn:
        assert conn.upload(payload, "/var/tmp/good.run", sha256=want) == want
        assert node.read_bytes("/var/tmp/good.run") == payload.read_bytes()
        node.write("/usr/bin/openssl", lying_openssl("0" * 64), 0o755)
        with pytest.raises(CommandError, match="arrived altered"):
            conn.upload(payload, "/var/tmp/lied.run", sha256=want)
    assert not node.exists("/var/tmp/lied.run") and leftovers(node) == []


def test_with_python3_a_large_upload_is_hashed_as_it_arrives_and_that_answer_is_checked(node, payload):
    """openssl lying does not matter when python3 hashed the stream (it is never asked); a python3 that writes
    every byte but answers a wrong sha256 gets nothing installed: its answer is the one compared."""
    with_python3(node)
    node.write("/usr/bin/openssl", lying_openssl("0" * 64), 0o755)
    want = hashlib.sha256(payload.read_bytes()).hexdigest()
    with connect(node) as conn:
        assert conn.upload(payload, "/var/tmp/good.run", sha256=want) == want
        assert conn.upload(payload, "/var/tmp/sent.run") == want  # hashed while sent, too
        assert node.read_bytes("/var/tmp/good.run") == payload.read_bytes() == node.read_bytes("/var/tmp/sent.run")
        node.remove("/usr/bin/python3")
        node.write("/usr/bin/python3", '#!/bin/sh\necho gpunode-py; cat > "$5"; echo ' + "1" * 64 + "\n", 0o755)
        with pytest.raises(CommandError, match="arrived altered"):
            conn.upload(payload, "/var/tmp/lied.run", sha256=want)
    assert not node.exists("/var/tmp/lied.run") and leftovers(node) == []


@pytest.mark.parametrize("python3", ["fails-to-start", "fails-after-taking-the-stream"])
def test_a_python3_that_fails_before_its_marker_leaves_the_stream_to_cat_and_after_it_fails_the_upload(
        node, payload, python3):
    if python3 == "fails-to-start":  # a library missing, an interpreter too old: it reads nothing
        node.write("/usr/bin/python3", "#!/bin/sh\necho 'python3: error while loading shared libraries' >&2; exit 127\n",
                   0o755)
    else:
        node.write("/usr/bin/python3", "#!/bin/sh\necho gpunode-py; head -c 1000 >/dev/null; "
                   "echo 'gpunode-receive: Input/output error' >&2; exit 1\n", 0o755)
    want = hashlib.sha256(payload.read_bytes()).hexdigest()
    with connect(node) as conn:
        if python3 == "fails-to-start":
            assert conn.upload(payload, "/var/tmp/good.run", sha256=want) == want
            assert node.read_bytes("/var/tmp/good.run") == payload.read_bytes()
        else:
            with pytest.raises(CommandError) as info:
                conn.upload(payload, "/var/tmp/good.run", sha256=want)
            assert "Input/output error" in info.value.stderr + info.value.message
            assert not node.exists("/var/tmp/good.run")
        assert conn.run(["echo", "still here"]).stdout == "still here\n"
    assert leftovers(node) == []


@pytest.mark.parametrize("openssl", ["missing", "broken"])
def test_without_a_working_openssl_the_node_hashes_with_sha256sum(node, payload, openssl):
    if openssl == "missing":
        node.remove("/usr/bin/openssl")
    else:  # FIPS refusals, a library mismatch: anything but 64 hex digits
        node.write("/usr/bin/openssl", "#!/bin/sh\necho 'Error setting digest' >&2; echo '(stdin)= '; exit 1\n", 0o755)
    want = hashlib.sha256(payload.read_bytes()).hexdigest()
    with connect(node) as conn:
        assert conn.upload(payload, "/var/tmp/good.run", mode=0o700) == want
    assert node.read_bytes("/var/tmp/good.run") == payload.read_bytes()


class _Tamper:
    """paramiko's Channel.sendall, altering the upload's stream on its way: `cut` leaves out everything after the
    first MiB (the node's stdin ends short), `flip` inverts one byte in the middle."""

    def __init__(self, monkeypatch, how):
        self.how, self.seen, self.done = how, 0, False
        real, real_exec = paramiko.Channel.sendall, paramiko.Channel.exec_command

        def exec_command(chan, line):
            chan.gpunode_upload = "upload-receive" in line
            return real_exec(chan, line)

        def sendall(chan, data):
            if not getattr(chan, "gpunode_upload", False):  # the command loop's channel: untouched
                return real(chan, data)
            at, self.seen = self.seen, self.seen + len(data)
            if self.how == "cut" and self.seen > (1 << 20):
                self.done = True
                return None
            if self.how == "flip" and at <= BIG // 2 < self.seen and not self.done:
                self.done = True
                data = bytearray(data)
                data[BIG // 2 - at] ^= 0x01
                data = bytes(data)
            return real(chan, data)

        monkeypatch.setattr(paramiko.Channel, "sendall", sendall)
        monkeypatch.setattr(paramiko.Channel, "exec_command", exec_command)


@pytest.mark.parametrize("receiver", ["follow", "python3", "after"])
@pytest.mark.parametrize("known", [True, False], ids=["sha256-given", "sha256-of-what-was-sent"])
@pytest.mark.parametrize("how", ["cut", "flip"])
def test_a_stream_cut_short_or_altered_on_its_way_is_never_placed(node, payload, monkeypatch, how, known, receiver):
    """With each receiver: python3 hashing as it writes, openssl following the file `cat` writes (no python3), and
    `cat` then openssl (no python3, no dd)."""
    if receiver == "python3":
        with_python3(node)
    elif receiver == "after":
        node.remove("/usr/bin/dd")
    want = hashlib.sha256(payload.read_bytes()).hexdigest()
    node.write("/var/tmp/driver.run", b"old")
    with connect(node) as conn:
        conn.run(["true"])  # connected (and the command loop started) before the stream is tampered with
        tamper = _Tamper(monkeypatch, how)
        with pytest.raises(CommandError, match="nothing was installed") as info:
            conn.upload(payload, "/var/tmp/driver.run", mode=0o700, sha256=want if known else None)
        monkeypatch.undo()
        assert tamper.done
        if how == "cut":
            assert "only 1048576 of 17825797 bytes arrived" in info.value.stderr + info.value.message
        else:
            assert "sha256 mismatch" in info.value.message
        assert node.read_bytes("/var/tmp/driver.run") == b"old" and leftovers(node) == []
        assert conn.upload(payload, "/var/tmp/driver.run", sha256=want) == want  # the same connection, re-run
    assert node.read_bytes("/var/tmp/driver.run") == payload.read_bytes()


def test_a_local_file_that_shrinks_during_the_upload_is_named_and_nothing_is_placed(node, payload):
    with connect(node) as conn:
        def shrink(done, total):
            if done >= (2 << 20):
                os.truncate(payload, 3 << 20)

        with pytest.raises(CommandError, match=r"ended after \d+ of 17825797 bytes \(it changed during the upload\); "
                                               "nothing was installed"):
            conn.upload(payload, "/var/tmp/driver.run", progress=shrink)
        assert conn.run(["echo", "still here"]).stdout == "still here\n"
    assert not node.exists("/var/tmp/driver.run") and leftovers(node) == []


@pytest.mark.parametrize("stop", ["exits", "is-killed"])
def test_a_hash_tool_that_dies_while_it_follows_the_upload_fails_it(node, payload, stop):
    """No python3: the openssl that follows the file stops after 2 MiB. The upload fails and says which tool
    stopped; it is never installed unverified, and nothing is left beside it."""
    end = "exit 1" if stop == "exits" else "kill -9 $$"
    node.write("/usr/bin/openssl", f'#!/bin/sh\nn=$(head -c 2097152 | wc -c)\n[ "$n" -gt 0 ] || '
               f'{{ echo "{EMPTY_SHA256} *stdin"; exit 0; }}\n{end}\n', 0o755)
    want = hashlib.sha256(payload.read_bytes()).hexdigest()
    with connect(node) as conn:
        with pytest.raises(CommandError, match="nothing was installed") as info:
            conn.upload(payload, "/var/tmp/driver.run", sha256=want)
        assert "gpunode-hash the node's openssl stopped before the end of the upload" in info.value.message
        assert conn.run(["echo", "still here"]).stdout == "still here\n"
    assert not node.exists("/var/tmp/driver.run") and leftovers(node) == []


def test_a_full_disk_while_the_hash_follows_the_upload_is_named(node, payload):
    from tests.integration.test_reliability_connection import DISK_FULL_CAT

    node.write("/usr/local/sbin/cat", DISK_FULL_CAT, 0o755)
    node.write("/var/lib/nodesim/disk-full", "")
    with connect(node) as conn:
        with pytest.raises(NoSpaceError, match="no space left on the node in /var/tmp"):
            conn.upload(payload, "/var/tmp/driver.run")
        node.remove("/var/lib/nodesim/disk-full")  # space freed
        assert conn.upload(payload, "/var/tmp/driver.run") == hashlib.sha256(payload.read_bytes()).hexdigest()
    assert leftovers(node) == [] and node.read_bytes("/var/tmp/driver.run") == payload.read_bytes()
