"""SSH pieces that need no server: target parsing, ssh_config resolution, host-key policy."""

import os
import shutil
import subprocess
import sys

import paramiko
import pytest

from gpunode.connection.ssh import (
    SSHOptions,
    SSHTarget,
    _HostKeyPolicy,
    _load_known_hosts,
    _resolve,
    _UnknownHostKey,
    fingerprint,
)
from gpunode.errors import UsageError


@pytest.mark.parametrize("text,host,user,port", [
    ("gpu-01", "gpu-01", None, None),
    ("ubuntu@gpu-01", "gpu-01", "ubuntu", None),
    ("ubuntu@gpu-01:2222", "gpu-01", "ubuntu", 2222),
    ("10.0.0.5:22", "10.0.0.5", None, 22),
    ("[fe80::1]:2200", "fe80::1", None, 2200),
    ("root@[::1]", "::1", "root", None),
    ("fe80::1", "fe80::1", None, None),
])
def test_target_parse(text, host, user, port):
    t = SSHTarget.parse(text)
    assert (t.host, t.user, t.port) == (host, user, port)


@pytest.mark.parametrize("text", ["", "a b", "@host", "host:99999", "host:abc", "[::1", "user@"])
def test_bad_targets_are_usage_errors(text):
    with pytest.raises(UsageError):
        SSHTarget.parse(text)


def test_ssh_config_alias_hostname_user_port_identity_proxyjump(tmp_path):
    key = tmp_path / "id_gpu"
    key.write_text("not read here")
    config = tmp_path / "config"
    config.write_text(f"""Host gpu-*
    User ops
Host gpu-a
    HostName 10.1.2.3
    Port 2222
    IdentityFile {key}
    ProxyJump bastion.example
    UserKnownHostsFile {tmp_path}/kh
""")
    r = _resolve(SSHTarget.parse("gpu-a"), SSHOptions(ssh_config=str(config)))
    assert (r.host, r.port, r.user) == ("10.1.2.3", 2222, "ops")
    assert r.identities == [str(key)] and r.proxy_jump == "bastion.example"
    assert r.known_hosts[0] == tmp_path / "kh"
    # What the user typed wins over the config.
    r2 = _resolve(SSHTarget.parse("root@gpu-a:22"), SSHOptions(ssh_config=str(config)))
    assert (r2.user, r2.port) == ("root", 22)


def test_missing_explicit_ssh_config_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        _resolve(SSHTarget.parse("h"), SSHOptions(ssh_config=str(tmp_path / "nope")))


def test_unknown_host_key_is_refused_by_default(tmp_path):
    host_key = paramiko.RSAKey.generate(1024)
    policy = _HostKeyPolicy(accept_new=False, save_to=tmp_path / "known_hosts")
    with pytest.raises(_UnknownHostKey):
        policy.missing_host_key(paramiko.SSHClient(), "[10.0.0.1]:2222", host_key)
    assert not (tmp_path / "known_hosts").exists()


def test_accept_new_records_the_key(tmp_path):
    host_key = paramiko.RSAKey.generate(1024)
    client = paramiko.SSHClient()
    policy = _HostKeyPolicy(accept_new=True, save_to=tmp_path / "sub" / "known_hosts")
    policy.missing_host_key(client, "[10.0.0.1]:2222", host_key)
    line = (tmp_path / "sub" / "known_hosts").read_text()
    assert line.startswith("[10.0.0.1]:2222 ssh-rsa ")
    assert client.get_host_keys().lookup("[10.0.0.1]:2222") is not None


def test_known_hosts_with_a_malformed_line_still_loads_the_rest(tmp_path):
    good = paramiko.RSAKey.generate(1024)
    kh = tmp_path / "known_hosts"
    kh.write_text(f"garbage line without a key\n@cert-authority * ssh-rsa AAAA\n"
                  f"[127.0.0.1]:2222 ssh-rsa {good.get_base64()}\n")
    client = paramiko.SSHClient()
    _load_known_hosts(client, [kh, tmp_path / "missing"])
    assert client.get_host_keys().lookup("[127.0.0.1]:2222") is not None


def test_a_known_hosts_file_is_parsed_once_per_content_and_again_when_it_changes(tmp_path, monkeypatch):
    """A fleet connects to every node with the same known_hosts: it is parsed once, not once per node; a file
    changed since (a key accepted, ssh-keygen -R) is read again."""
    keys = [paramiko.ECDSAKey.generate() for _ in range(2)]
    kh = tmp_path / "known_hosts"
    kh.write_text("".join(f"[127.0.0.1]:{2200 + i} {k.get_name()} {k.get_base64()}\n" for i, k in enumerate(keys)))
    parsed = []
    real = paramiko.hostkeys.HostKeyEntry.from_line
    monkeypatch.setattr(paramiko.hostkeys.HostKeyEntry, "from_line",
                        classmethod(lambda cls, line, lineno=None: parsed.append(line) or real(line, lineno)))
    for _ in range(3):
        client = paramiko.SSHClient()
        _load_known_hosts(client, [kh])
        assert client.get_host_keys().lookup("[127.0.0.1]:2201")[keys[1].get_name()] == keys[1]
    assert len(parsed) == 2
    other = paramiko.ECDSAKey.generate()
    kh.write_text(f"[127.0.0.1]:2201 {other.get_name()} {other.get_base64()}\n")  # a changed key, one line
    client = paramiko.SSHClient()
    _load_known_hosts(client, [kh])
    assert client.get_host_keys().lookup("[127.0.0.1]:2201")[other.get_name()] == other
    assert client.get_host_keys().lookup("[127.0.0.1]:2200") is None and len(parsed) == 3


def test_fingerprint_format():
    assert fingerprint(paramiko.RSAKey.generate(1024)).startswith("SHA256:")


def test_a_silent_server_is_a_timeout_not_a_hang():
    """Something accepts TCP on 127.0.0.1 but never speaks SSH (a hung sshd): one line, within the timeout."""
    import socket
    import threading
    import time

    from gpunode.connection.ssh import SSHConnection
    from gpunode.errors import ConnectError

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    accepted = []
    stop = threading.Event()

    def accept():
        conn, _ = server.accept()
        accepted.append(conn)
        stop.wait(10)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        start = time.monotonic()
        with pytest.raises(ConnectError, match="timed out after 1s waiting for the SSH banner"):
            SSHConnection(f"root@127.0.0.1:{port}", SSHOptions(connect_timeout=1.0, known_hosts=[])).connect()
        assert time.monotonic() - start < 10
    finally:
        stop.set()
        for conn in accepted:
            conn.close()
        server.close()
        thread.join(5)


def test_gcm_ciphers_come_first_and_nothing_else_moves():
    from gpunode.connection.ssh import gcm_first

    assert gcm_first(("aes128-ctr", "aes256-ctr", "aes256-gcm@openssh.com", "aes128-gcm@openssh.com")) == (
        "aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "aes128-ctr", "aes256-ctr")
    assert gcm_first(("aes128-ctr", "aes256-ctr")) == ("aes128-ctr", "aes256-ctr")


def test_invoke_is_loaded_only_for_a_match_exec_config(tmp_path):
    """paramiko imports invoke only for ssh_config's `Match exec`: gpunode imports paramiko without it, and
    loads it when a config has such a line (which then still works)."""
    import subprocess
    import sys

    plain, matching = tmp_path / "plain", tmp_path / "matching"
    plain.write_text("Host gpu\n  Port 2222\n")
    matching.write_text("Match exec \"test -d /\"\n  Port 2200\n")
    code = ("import sys\nfrom gpunode.connection.ssh import SSHTarget, SSHOptions, _resolve\n"
            "print('invoke' in sys.modules)\n"
            f"print(_resolve(SSHTarget('gpu'), SSHOptions(ssh_config={str(plain)!r})).port, 'invoke' in sys.modules)\n"
            f"print(_resolve(SSHTarget('gpu'), SSHOptions(ssh_config={str(matching)!r})).port, 'invoke' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[:3] == ["False", "2222 False", "2200 True"]


def test_paramiko_is_imported_without_importlib_metadata_and_sends_its_own_version():
    """paramiko's __init__ reads its version through a stand-in (no importlib.metadata, ~4% of a converged
    install's CPU): the same version, the same SSH banner, and importlib.metadata is the real one afterwards."""
    import subprocess
    import sys

    code = ("import sys\nimport gpunode.connection.ssh, paramiko\nbefore = 'importlib.metadata' in sys.modules\n"
            "from importlib import metadata\nreal = metadata.version('paramiko')\n"
            "print(before, paramiko.__version__ == real, paramiko.Transport._CLIENT_ID == 'paramiko_' + real, "
            "hasattr(metadata, 'distributions'), hasattr(paramiko, 'metadata'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "True", "True", "True", "False"]


@pytest.mark.parametrize("ask", ["version", "anything else"])
def test_where_the_stand_in_has_no_answer_paramiko_gets_importlib_metadata_s(ask, tmp_path):
    """A layout _installed_version does not read, or a paramiko asking more of importlib.metadata than its version
    (here a stand-in paramiko package that does): the real module answers, imported in the stand-in's place with no
    recursion, and paramiko imports as it would."""
    import subprocess
    import sys

    fake = tmp_path / "paramiko"
    fake.mkdir()
    (fake / "__init__.py").write_text("from importlib import metadata\n__version__ = metadata.version('paramiko')\n"
                                      "FOUND = metadata.distribution('paramiko').metadata['Name']\n")
    code = ("import sys\nimport gpunode.connection.ssh as s\n"
            "for m in [m for m in sys.modules if m == 'paramiko' or m.startswith('paramiko.')]: del sys.modules[m]\n"
            "sys.modules.pop('importlib.metadata', None)\nimport importlib\n"
            "if hasattr(importlib, 'metadata'): del importlib.metadata\n"
            + ("s._installed_version = lambda name: None\n" if ask == "version" else "")
            + f"sys.path.insert(0, {str(tmp_path)!r})\n"
            "s._import_paramiko_without_invoke()\nimport paramiko\nfrom importlib import metadata\n"
            "print(paramiko.__file__.startswith(sys.path[0]), paramiko.__version__ == metadata.version('paramiko'),"
            " paramiko.FOUND, type(metadata).__name__, hasattr(metadata, 'distributions'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "True", "paramiko", "module", "True"]


def test_the_installed_version_is_importlib_metadata_s_or_none(tmp_path, monkeypatch):
    from importlib import metadata

    from gpunode.connection.ssh import _installed_version

    first, second, zipped = tmp_path / "first", tmp_path / "second", tmp_path / "lib.zip"
    for directory, version in ((first, "1.2.3"), (second, "9.9")):
        (directory / f"thing-{version}.dist-info").mkdir(parents=True)
        (directory / f"thing-{version}.dist-info" / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: thing\nVersion: {version}\n\nVersion: 0 (the body, not a header)\n")
    zipped.write_bytes(b"PK\x05\x06" + bytes(18))  # an empty zip file
    monkeypatch.setattr(sys, "path", [str(tmp_path / "missing"), str(first), str(second)])
    assert _installed_version("thing") == metadata.version("thing") == "1.2.3"  # the first directory on the path
    assert _installed_version("other") is None  # not installed: importlib.metadata answers (PackageNotFoundError)
    (first / "thing-1.3.dist-info").mkdir()
    assert _installed_version("thing") is None  # two candidates: importlib.metadata decides
    monkeypatch.setattr(sys, "path", [str(zipped), str(second)])
    assert _installed_version("thing") is None  # a zip on the path: importlib.metadata reads inside it
    monkeypatch.setattr(sys, "path", [str(second)])
    (second / "thing-9.9.dist-info" / "METADATA").write_text("Name: thing\n\n")
    assert _installed_version("thing") is None  # no Version header


SHELLS = [s for s in (["dash"], ["bash"], ["busybox", "sh"]) if shutil.which(s[0])]


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_the_command_loop_runs_whole_frames_and_nothing_of_a_frame_cut_short(shell, tmp_path):
    """gpunode/connection/ssh.py's _SERVE under the shells a node may log in with: a whole frame runs (short line,
    long ASCII line read by dd, base64 stdin) and reports its status; a frame whose command line, length-framed
    body or stdin line never arrived whole runs nothing."""
    import base64

    from gpunode.connection.ssh import _SERVE, _SERVE_DD

    mark = tmp_path / "ran"

    hello = b"gpunode-serve 1\n"  # base64 is there

    def serve(data: bytes) -> bytes:
        return subprocess.run([*shell, "-c", _SERVE], input=data, capture_output=True, timeout=30, check=False).stdout

    touch = f"touch {mark}; echo hi; exit 3".encode()
    out = serve(b"n1 0 -\n" + touch + b"\nn1\n")
    assert out == hello + b"hi\nn1 3\nn1 .\n" and mark.exists()
    mark.unlink()
    long = b": " + b"x" * _SERVE_DD + b"\n" + touch
    out = serve(b"n2 0 %d\n" % len(long) + long + b"n3 1 -\ncat\nn3\n" + base64.b64encode(b"in\x00put") + b"\n")
    assert out == hello + b"hi\nn2 3\nn2 .\nin\x00putn3 0\nn3 .\n" and mark.exists()
    mark.unlink()
    for cut in (b"n4 0 -\n" + touch,  # no terminator line
                b"n5 0 %d\n" % len(long) + long[:-5],  # fewer bytes than announced
                b"n6 1 -\n" + touch + b"\nn6\n" + base64.b64encode(b"partial")):  # stdin line without its end
        assert serve(cut) == hello and not mark.exists(), cut


def test_the_command_loop_greeting_is_found_after_what_a_login_script_printed():
    from gpunode.connection.ssh import _greeting

    assert _greeting(bytearray(b"Welcome to node-7\nlast login: today\ngpunode-serve 1\n")) == (b"1", b"")
    assert _greeting(bytearray(b"gpunode-serve\n")) == (b"", b"")  # the stderr greeting
    assert _greeting(bytearray(b"motd\ngpunode-serve 0\nthe first command's output")) == (
        b"0", b"the first command's output")  # the first frame's output follows it at once
    assert _greeting(bytearray(b"noise gpunode-serve 1\n")) is None  # only on a line of its own
    assert _greeting(bytearray(b"gpunode-serve 1")) is None  # not yet whole
    assert _greeting(bytearray(b"This account is currently not available.\n")) is None


@pytest.mark.skipif(not hasattr(__import__("socket"), "TCP_QUICKACK"), reason="TCP_QUICKACK is Linux's")
def test_the_tcp_socket_sends_at_once_and_acknowledges_every_read_at_once(monkeypatch):
    """TCP_NODELAY for what gpunode sends; TCP_QUICKACK set again after each read, since the kernel drops it by
    itself: otherwise sshd's next small packet waits for gpunode's delayed ACK (~40 ms, right after login)."""
    import socket

    from gpunode.connection import ssh

    armed: list[tuple[int, int, int]] = []

    def record(self, level, option, value):
        armed.append((level, option, value))
        return socket.socket.setsockopt(self, level, option, value)

    monkeypatch.setattr(ssh._AckingSocket, "setsockopt", record)
    with socket.create_server(("127.0.0.1", 0)) as server:
        sock = ssh._tcp_socket("127.0.0.1", server.getsockname()[1], 7.0)
        peer, _ = server.accept()
        with sock, peer:
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
            assert sock.gettimeout() == 7.0  # the connect timeout still holds on the re-wrapped socket
            quickack = (socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
            for round_ in (1, 2):
                peer.sendall(b"hello")
                assert sock.recv(5) == b"hello"
                assert armed.count(quickack) == round_  # each read arms it again
            sock.sendall(b"ok")
            assert peer.recv(2) == b"ok"
            peer.close()
            assert sock.recv(5) == b""  # the end of the stream reads as ever


def test_an_ascii_host_name_is_resolved_without_the_idna_codec():
    code = ("import socket, sys\nfrom gpunode.connection import ssh\n"
            "with socket.create_server(('127.0.0.1', 0)) as server:\n"
            "    before = 'encodings.idna' in sys.modules\n"
            "    ssh._tcp_socket('localhost', server.getsockname()[1], 5.0).close()\n"
            "    print(before, 'encodings.idna' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout == "False False\n", done.stderr


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_a_command_the_loop_runs_sees_the_loop_s_parent_as_ppid(shell):
    """The node lock names sshd's process of the connection without asking for it first: lock_owner is a word
    that becomes "$PPID" in the command line (SSHConnection._owned), which the loop's subshell expands to the
    loop's parent (here this process; on a node, sshd's process), also through `sh -c` and a privilege prefix."""
    from gpunode.connection.ssh import _SERVE, SSHConnection
    from gpunode.shell import Script, render

    conn = SSHConnection("root@127.0.0.1:22")
    line = conn._owned(render(Script('echo "$1"', (conn.lock_owner(),), "owner"), privilege=("env",)))
    assert conn.lock_owner() not in line and '"$PPID"' in line
    frame = b"n1 0 -\n" + line.encode() + b"\nn1\n"
    out = subprocess.run([*shell, "-c", _SERVE], input=frame, capture_output=True, timeout=30, check=False).stdout
    assert out == b"gpunode-serve 1\n%d\nn1 0\nn1 .\n" % os.getpid()
    assert SSHConnection("root@127.0.0.1:22").lock_owner() != conn.lock_owner()  # a fresh word per connection


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_the_channel_s_first_command_rides_in_the_exec_request_and_the_loop_goes_on(shell):
    """serve_command: the first command (quoted into the command the exec request runs) runs before the loop reads
    its first frame, with its stdin from /dev/null (the frames stay for the loop), and reports as a frame would."""
    from gpunode.connection.ssh import serve_command

    first = "cat; printf 'it'\"'\"'s\\n'; echo err >&2; exit 4"  # quotes, a newline escape, stdin it must not take
    out = subprocess.run([*shell, "-c", serve_command((b"n0", first))], input=b"n1 0 -\necho next\nn1\n",
                         capture_output=True, timeout=30, check=False)
    assert out.stdout == b"gpunode-serve 1\nit's\nn0 4\nn0 .\nnext\nn1 0\nn1 .\n"
    assert out.stderr == b"gpunode-serve\nerr\nn0\nn1\n"
