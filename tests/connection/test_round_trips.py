"""Round trips: the CLI's connection learns that the login shell works and that the login user is root from
the first command itself, so `plan` and `doctor` open one SSH channel (the probe); later commands run on that
same channel (gpunode/connection/ssh.py, _SERVE). Counted from sshd's own log
at DEBUG1, which records every channel a client opens."""

from __future__ import annotations

import pwd
from pathlib import Path

import pytest

from gpunode.connection import ConnectionSpec, open_connection
from gpunode.errors import ConnectError
from gpunode.facts import gather

pytestmark = pytest.mark.integration


def channels(node) -> int:
    return Path(node.sshd_log).read_text(errors="replace").count("server_input_channel_open: ctype session")


def spec(node, tmp_path) -> ConnectionSpec:
    cfg = tmp_path / "ssh_config"
    cfg.write_text("")
    return ConnectionSpec(host=f"root@127.0.0.1:{node.port}", identity=[node.key_path],
                          known_hosts=[node.known_hosts], ssh_config=str(cfg))


def test_the_probe_is_the_only_channel_and_root_is_learnt_from_it(sim_node, tmp_path):
    node = sim_node("ubuntu-22.04-t4", sshd_log_level="DEBUG1")
    before = channels(node)
    with open_connection(spec(node, tmp_path)) as conn:
        facts = gather(conn)
        assert channels(node) - before == 1
        assert facts.kernel == node.kernel
        assert conn.run(["id", "-u"], sudo=True).stdout == "0\n"  # no sudo prefix, no second root check
        assert channels(node) - before == 1  # later commands ride on the same channel
    assert node.calls("sudo") == []


def test_a_refusing_login_shell_is_named_by_the_first_command(sim_node, tmp_path):
    node = sim_node("ubuntu-22.04-nogpu")
    shell = pwd.getpwuid(0).pw_shell  # sshd runs the host user's shell path inside the chroot
    node.write(shell, "#!/bin/sh\necho 'This account is currently not available.'\nexit 1\n", 0o755)
    conn = open_connection(spec(node, tmp_path))
    with pytest.raises(ConnectError) as info:
        gather(conn)
    assert info.value.message == (f"root@127.0.0.1:{node.port}: the login shell of root refuses to run commands "
                                  "(it said: 'This account is currently not available.')")
    assert info.value.fix.endswith("chsh -s /bin/sh root")


def test_stderr_of_the_first_command_is_the_command_s_own(sim_node, tmp_path):
    node = sim_node("ubuntu-22.04-nogpu")
    with open_connection(spec(node, tmp_path)) as conn:
        result = conn.run(["sh", "-c", "echo out; echo err >&2; exit 3"], sudo=True)
    assert (result.exit_code, result.stdout, result.stderr, result.command) == (3, "out\n", "err\n",
                                                                                "sh -c 'echo out; echo err >&2; exit 3'")


def test_a_fleet_logged_connection_also_learns_root_from_the_probe(sim_node, tmp_path):
    import io

    from gpunode.fleet import LoggedConnection

    node = sim_node("ubuntu-22.04-t4", sshd_log_level="DEBUG1")
    before = channels(node)
    log = io.StringIO()
    with LoggedConnection(open_connection(spec(node, tmp_path)), log) as conn:
        gather(conn)
        assert channels(node) - before == 1
        assert conn.run(["id", "-u"], sudo=True).stdout == "0\n"
        assert channels(node) - before == 1
    assert "$ " in log.getvalue()


def test_the_socket_sends_at_once_and_the_cipher_is_aes_gcm(sim_node, tmp_path):
    """TCP_NODELAY (no Nagle wait on each command's small packets) and an AEAD cipher where sshd offers one."""
    import socket

    node = sim_node("ubuntu-22.04-nogpu")
    with open_connection(spec(node, tmp_path)) as conn:
        conn.run(["true"])
        transport = conn._client.get_transport()
        assert transport.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        assert transport.local_cipher == transport.remote_cipher == "aes128-gcm@openssh.com"


def test_aes_gcm_is_only_a_preference_a_node_without_it_connects_and_uploads_verified(sim_node, tmp_path,
                                                                                      monkeypatch):
    """A node whose sshd offers no AEAD cipher (Ciphers aes128-ctr,aes256-ctr) still connects, with a cipher it
    offers (and paramiko's HMAC), and an upload there is still verified on the node and placed."""
    import hashlib

    from tests.nodesim.node import SimNode

    real = SimNode._write_sshd_config

    def no_gcm(self):
        cfg = real(self)
        cfg.write_text(cfg.read_text() + "Ciphers aes128-ctr,aes256-ctr\n")
        return cfg

    monkeypatch.setattr(SimNode, "_write_sshd_config", no_gcm)
    node = sim_node("ubuntu-22.04-nogpu")
    payload = tmp_path / "payload.bin"
    payload.write_bytes(bytes(range(256)) * 4096)
    with open_connection(spec(node, tmp_path)) as conn:
        conn.run(["true"])
        transport = conn._client.get_transport()
        assert transport.local_cipher == transport.remote_cipher == "aes128-ctr"
        assert transport.local_mac.startswith("hmac-sha2-")
        want = hashlib.sha256(payload.read_bytes()).hexdigest()
        assert conn.upload(payload, "/var/tmp/payload.bin", sha256=want) == want
    assert node.read_bytes("/var/tmp/payload.bin") == payload.read_bytes()


def test_commands_share_one_channel_and_each_keeps_its_own_stdin_output_and_exit_code(sim_node, tmp_path):
    """The command channel (gpunode/connection/ssh.py, _SERVE): a command that reads only part of its stdin, one
    that prints no final newline, one that tries to read stdin it was not given, one that runs past its deadline:
    each gets exactly its own bytes and status, and the next command is unaffected."""
    from gpunode.shell import Script

    node = sim_node("ubuntu-22.04-nogpu", sshd_log_level="DEBUG1")
    before = channels(node)
    with open_connection(spec(node, tmp_path)) as conn:
        partial = conn.run(Script("head -c 3; echo; exit 4", (), "partial"), stdin=b"abcdef\nNOT-A-FRAME\n\x00\xff")
        assert (partial.exit_code, partial.stdout) == (4, "abc\n")
        whole = conn.run(["cat"], stdin=b"line one\n\x00binary\xfe tail")
        assert whole.stdout.encode("utf-8", "surrogateescape")[:9] == b"line one\n" and whole.stdout.endswith(" tail")
        bare = conn.run(Script("printf no-newline; printf err >&2", (), "bare"))
        assert (bare.exit_code, bare.stdout, bare.stderr) == (0, "no-newline", "err")
        empty = conn.run(Script("cat; echo rc=$?", (), "nostdin"))
        assert empty.stdout == "rc=0\n"
        big = conn.run(Script("head -c 3000000 /dev/zero | tr '\\0' a; echo; echo e >&2", (), "big"))
        assert (len(big.stdout), big.stdout.count("a"), big.stderr) == (3000001, 3000000, "e\n")
        for filler in ("y" * 70, "é" * 35):  # long lines: read by dd when ASCII, line by line otherwise
            long = conn.run(Script("\n".join(f": {filler}" for _ in range(600)) + "\necho long; exit 2", (), "long"))
            assert (long.exit_code, long.stdout) == (2, "long\n")
        assert channels(node) - before == 1
        late = conn.run(Script("sleep 5", (), "late"), timeout=1)
        assert late.timed_out
        after = conn.run(["echo", "fresh"])
        assert after.stdout == "fresh\n" and channels(node) - before == 2  # the late command took its channel along


def test_a_command_whose_frame_could_not_be_sent_whole_ran_nothing_and_is_sent_again_once(sim_node, tmp_path):
    """The loop runs only whole frames: when sending one fails (the connection went), the node ran nothing of it,
    so the connection is made again and the command sent once more; a second failure is the dropped connection."""
    from gpunode.connection import ssh as ssh_module
    from gpunode.shell import Script

    node = sim_node("ubuntu-22.04-nogpu")
    fails = [1]

    class Flaky(ssh_module.SSHConnection):
        def _send_stdin(self, chan, data):
            chan.sendall(data[: len(data) // 2])
            if fails[0]:
                fails[0] -= 1
                raise EOFError()
            chan.sendall(data[len(data) // 2:])

    s = spec(node, tmp_path)
    conn = Flaky(s.host, ssh_module.SSHOptions(identity=s.identity, known_hosts=s.known_hosts,
                                               ssh_config=s.ssh_config))
    with conn:
        result = conn.run(Script("cat >> /root/ran; echo >> /root/ran", (), "append"), stdin=b"once")
        assert result.ok and node.read("/root/ran") == "once\n"
        fails[0] = 2
        with pytest.raises(ConnectError, match="dropped"):
            conn.run(Script("cat >> /root/ran; echo >> /root/ran", (), "append"), stdin=b"twice")
    assert node.read("/root/ran") == "once\n"


def test_the_connection_s_socket_acknowledges_at_once(sim_node, tmp_path, monkeypatch):
    """The socket paramiko reads is the one that sets TCP_QUICKACK after each read (see
    test_ssh_unit: without it sshd holds a small packet ~40 ms for gpunode's delayed ACK)."""
    import socket

    from gpunode.connection import ssh

    armed = []

    def record(self, level, option, value):
        armed.append((level, option))
        return socket.socket.setsockopt(self, level, option, value)

    monkeypatch.setattr(ssh._AckingSocket, "setsockopt", record)
    node = sim_node("ubuntu-22.04-nogpu")
    with open_connection(spec(node, tmp_path)) as conn:
        assert conn.run(["echo", "hi"]).stdout == "hi\n"
        transport = conn._client.get_transport()
        assert isinstance(transport.sock, ssh._AckingSocket)
        assert armed.count((socket.IPPROTO_TCP, socket.TCP_QUICKACK)) >= 4  # banner, kex, login, command


def test_a_converged_install_s_session_takes_three_round_trips_after_the_key_exchange(sim_node, tmp_path,
                                                                                         monkeypatch):
    """The session of a converged install (log in, the node lock taken with the probe, the release), through a relay
    that delays each direction 50 ms and counts the turns: each time gpunode sends after the node sent (it waited
    for an answer; benchmarks/relay.py, as the benchmark counts them). Counted from the login on (paramiko's
    service request: the key exchange before it is the same for every client, and whether sshd's KEXINIT passes
    the relay before or after paramiko's ECDH init is a race of no consequence). Three: the service request, the
    login request and the command channel's opening together (gpunode/connection/ssh.py _LoginAtOnce,
    _Transport.open_early); the channel's exec request carrying the lock and the probe (serve_command: no wait for
    the loop's greeting); the release. Six on main at 9c0f4a4, which waited for each of those answers."""
    import paramiko

    from benchmarks.relay import DelayRelay
    from gpunode import nodelock
    from gpunode.facts import first_probe

    node = sim_node("ubuntu-22.04-nogpu")
    with DelayRelay(node.port, delay=0.05, lifetime=120) as relay:
        real = paramiko.auth_handler.AuthHandler._request_auth

        def marked(self):  # right before the service request: the key exchange is done
            relay.mark()
            real(self)

        monkeypatch.setattr(paramiko.auth_handler.AuthHandler, "_request_auth", marked)
        known = tmp_path / "known_hosts"
        known.write_text(f"[127.0.0.1]:{relay.port} " + " ".join(Path(node.known_hosts).read_text().split()[1:3]) + "\n")
        cfg = tmp_path / "ssh_config"
        cfg.write_text("")
        conn = open_connection(ConnectionSpec(host=f"root@127.0.0.1:{relay.port}", identity=[node.key_path],
                                              known_hosts=[str(known)], ssh_config=str(cfg)))
        with conn:
            first = first_probe()
            with nodelock.held(conn, "install", 10, then=first.script, then_timeout=60) as lock:
                facts = gather(conn, first=(first, lock.then))
                assert facts.kernel == node.kernel and lock.held is None  # the connection's process holds it
        assert relay.turns() == 3
    assert not node.exists(nodelock.LOCK_PATH)


def test_the_login_request_sent_at_once_logs_in_with_an_rsa_key_after_a_refused_one(sim_node, tmp_path, monkeypatch):
    """The login request rides right behind the service request (gpunode/connection/ssh.py _LoginAtOnce): sshd
    refuses a key it does not know as before (the next identity is tried), and an RSA key, whose signature
    algorithm follows the server's server-sig-algs, logs in."""
    import subprocess

    from gpunode.connection import ssh as ssh_module

    node = sim_node("ubuntu-22.04-nogpu")
    keys = {}
    for kind in ("ed25519", "rsa"):
        keys[kind] = tmp_path / f"id_{kind}"
        subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-f", str(keys[kind])], check=True, timeout=60)
    authorized = Path(node.dir) / "authorized_keys"
    authorized.write_text(authorized.read_text() + (tmp_path / "id_rsa.pub").read_text())
    early = []
    real = ssh_module._LoginAtOnce._request_auth

    def spy(self):
        real(self)
        early.append((self._get_key_type_and_bits(self.private_key)[0], self._sent_early))

    monkeypatch.setattr(ssh_module._LoginAtOnce, "_request_auth", spy)
    s = spec(node, tmp_path)
    conn = ssh_module.SSHConnection(s.host, ssh_module.SSHOptions(
        identity=[str(keys["ed25519"]), str(keys["rsa"])], known_hosts=s.known_hosts, ssh_config=s.ssh_config))
    with conn.connect(defer_checks=True):
        assert conn.run(["echo", "in"]).stdout == "in\n"
    assert early[0] == ("ssh-ed25519", True)  # refused, then the next identity on a new connection
    assert early[1][0] == "ssh-rsa" and len(early) == 2


def test_a_first_command_too_long_for_the_exec_request_comes_as_a_frame_on_the_same_channel(sim_node, tmp_path):
    """A channel's first command rides in its exec request only up to _SERVE_INLINE (one argument of the login
    shell's `-c`); a longer one is the loop's first frame, read after the greeting as any other."""
    from gpunode.connection import ssh as ssh_module
    from gpunode.shell import Script

    node = sim_node("ubuntu-22.04-nogpu", sshd_log_level="DEBUG1")
    before = channels(node)
    filler = "\n".join(f": {'x' * 70}" for _ in range(ssh_module._SERVE_INLINE // 70 + 10))
    with open_connection(spec(node, tmp_path)) as conn:
        long = conn.run(Script(filler + "\necho long; echo err >&2; exit 3", (), "long"))
        assert (long.exit_code, long.stdout, long.stderr) == (3, "long\n", "err\n")
        assert conn.run(["echo", "next"]).stdout == "next\n"
    assert channels(node) - before == 1


def test_a_refusing_login_shell_is_named_when_the_first_command_has_stdin(sim_node, tmp_path):
    """A first command with stdin waits for the loop's greeting (base64 or not): a login shell that refuses
    commands is named there too."""
    node = sim_node("ubuntu-22.04-nogpu")
    shell = pwd.getpwuid(0).pw_shell
    node.write(shell, "#!/bin/sh\necho 'This account is currently not available.'\nexit 1\n", 0o755)
    conn = open_connection(spec(node, tmp_path))
    with pytest.raises(ConnectError) as info:
        conn.run(["cat"], stdin=b"data")
    assert "the login shell of root refuses to run commands (it said: 'This account" in info.value.message
