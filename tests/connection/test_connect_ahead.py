"""Connecting ahead (gpunode/connection/ssh.py connect_ahead): the login and the command channel are made in a
thread of their own while the caller goes on; the first use waits for them and raises what connecting raised,
word for word what `connect` raises; `close` stops a login still under way, and nothing is left running."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import paramiko
import pytest

from gpunode.connection import ConnectionSpec, open_connection
from gpunode.connection.ssh import SSHConnection, SSHOptions
from gpunode.errors import ConnectError
from gpunode.facts import gather


def _ahead_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("gpunode-connect ") and t.is_alive()]


@contextmanager
def silent_server() -> Iterator[tuple[int, list[socket.socket]]]:
    """A TCP server on 127.0.0.1 that accepts and never says anything (sshd hung before its banner); yields the
    port and the connections it accepted."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    accepted: list[socket.socket] = []
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                accepted.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1], accepted
    finally:
        done.set()
        thread.join(2)
        server.close()
        for conn in accepted:
            conn.close()


def _key(tmp_path: Path) -> str:
    path = tmp_path / "id_rsa"
    paramiko.RSAKey.generate(2048).write_private_key_file(str(path))
    return str(path)


def _closed_by_peer(conn: socket.socket, within: float = 3.0) -> bool:
    conn.settimeout(within)
    try:
        while True:
            data = conn.recv(4096)  # paramiko's banner first, then EOF once the client closed
            if not data:
                return True
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_connect_ahead_returns_at_once_and_close_stops_the_login_under_way(tmp_path):
    with silent_server() as (port, accepted):
        options = SSHOptions(identity=[_key(tmp_path)], known_hosts=[str(tmp_path / "known_hosts")],
                             ssh_config=str(tmp_path / "none"), connect_timeout=30)
        (tmp_path / "none").write_text("")
        conn = SSHConnection(f"root@127.0.0.1:{port}", options)
        started = time.monotonic()
        conn.connect_ahead()
        assert time.monotonic() - started < 1.0  # the banner never comes: the login itself would wait 30 s
        deadline = time.monotonic() + 10
        while not accepted and time.monotonic() < deadline:
            time.sleep(0.01)
        assert accepted and _ahead_threads()  # connecting really is under way, in its own thread
        started = time.monotonic()
        conn.close()
        assert time.monotonic() - started < 3.0
        assert _ahead_threads() == []
        assert _closed_by_peer(accepted[0])  # the socket it had opened is closed
        conn.wait_connected()  # closed: nothing left to wait for, nothing raised


def test_an_error_while_connecting_ahead_is_raised_by_the_first_use_as_connect_raises_it(tmp_path):
    with socket.socket() as unused:  # a port nobody listens on: refused
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    (tmp_path / "none").write_text("")
    options = SSHOptions(identity=[_key(tmp_path)], known_hosts=[str(tmp_path / "known_hosts")],
                         ssh_config=str(tmp_path / "none"), connect_timeout=5)
    with pytest.raises(ConnectError) as direct:
        SSHConnection(f"root@127.0.0.1:{port}", options).connect(defer_checks=True)
    ahead = SSHConnection(f"root@127.0.0.1:{port}", options).connect_ahead()
    with pytest.raises(ConnectError) as waited:
        ahead.wait_connected()
    assert "cannot connect to 127.0.0.1" in direct.value.message
    assert (waited.value.message, waited.value.fix) == (direct.value.message, direct.value.fix)
    later = SSHConnection(f"root@127.0.0.1:{port}", options).connect_ahead()
    with pytest.raises(ConnectError) as first_use:
        later.run(["true"])  # no wait_connected: the first command raises it
    assert first_use.value.message == direct.value.message
    assert _ahead_threads() == []


# -- against a real sshd (the node simulator) ---------------------------------------------------------------------

def _spec(node, tmp_path, **given) -> ConnectionSpec:
    cfg = tmp_path / "ssh_config"
    cfg.write_text("")
    return ConnectionSpec(**{"host": f"root@127.0.0.1:{node.port}", "identity": [node.key_path],
                             "known_hosts": [node.known_hosts], "ssh_config": str(cfg), **given})


def _channels(node) -> int:
    return Path(node.sshd_log).read_text(errors="replace").count("server_input_channel_open: ctype session")


@pytest.mark.integration
def test_the_login_is_made_ahead_and_every_command_runs_on_the_one_channel_opened_behind_it(sim_node, tmp_path):
    node = sim_node("ubuntu-22.04-t4", sshd_log_level="DEBUG1")
    before = _channels(node)
    with open_connection(_spec(node, tmp_path, ahead=True)) as conn:
        conn.wait_connected()
        # the command channel's open follows the login request (it may still be on its way to sshd's log here);
        # the first command rides in its exec request, so nothing else is opened ahead
        assert _channels(node) - before <= 1
        assert _ahead_threads() == []
        facts = gather(conn)
        assert facts.kernel == node.kernel
        assert conn.run(["id", "-u"], sudo=True).stdout == "0\n"  # root learnt from the first command, as before
        assert _channels(node) - before == 1
    assert node.calls("sudo") == []


@pytest.mark.integration
def test_host_keys_are_checked_ahead_as_connect_checks_them(sim_node, tmp_path):
    node = sim_node("ubuntu-22.04-nogpu")
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    errors = []
    for ahead in (False, True):
        with pytest.raises(ConnectError) as info:
            conn = open_connection(_spec(node, tmp_path, known_hosts=[str(empty)], ahead=ahead))
            conn.wait_connected()
        errors.append((info.value.message, info.value.fix))
    assert errors[0] == errors[1]
    assert "is not in known_hosts (ssh-ed25519 SHA256:" in errors[0][0]
    assert empty.read_text() == ""  # nothing trusted on the way
    other = tmp_path / "other"
    paramiko.RSAKey.generate(2048).write_private_key_file(str(other))
    refused = []
    for ahead in (False, True):
        with pytest.raises(ConnectError) as info:
            open_connection(_spec(node, tmp_path, identity=[str(other)], ahead=ahead)).run(["true"])
        refused.append((info.value.message, info.value.fix))
    assert refused[0] == refused[1] and "authentication failed for user root" in refused[0][0]
    assert _ahead_threads() == []


@pytest.mark.integration
def test_a_refusing_login_shell_found_ahead_is_named_by_the_first_command(sim_node, tmp_path):
    import pwd

    node = sim_node("ubuntu-22.04-nogpu")
    shell = pwd.getpwuid(0).pw_shell  # sshd runs the host user's shell path inside the chroot
    node.write(shell, "#!/bin/sh\necho 'This account is currently not available.'\nexit 1\n", 0o755)
    conn = open_connection(_spec(node, tmp_path, ahead=True))
    with pytest.raises(ConnectError) as info:
        gather(conn)
    assert info.value.message == (f"root@127.0.0.1:{node.port}: the login shell of root refuses to run commands "
                                  "(it said: 'This account is currently not available.')")
    conn.close()
    assert _ahead_threads() == []
