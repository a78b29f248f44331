"""Peers that accept TCP on 127.0.0.1 but are not sshd (a wrong port, a port forward or load balancer in
front of a node that is down): one clear error, the true timing, no paramiko traceback on stderr, and the
reboot wait keeps waiting through them."""

import os
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from gpunode.connection.ssh import SSHConnection, SSHOptions
from gpunode.errors import ConnectError

ROOT = Path(__file__).resolve().parents[2]


class Listener:
    """A TCP server on 127.0.0.1 with one behaviour per connection: 'reset', 'close' or 'garbage'."""

    def __init__(self, behaviour: str) -> None:
        self.behaviour = behaviour
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            if self.behaviour == "garbage":  # a chatty non-SSH service that keeps the connection open
                try:
                    conn.sendall(b"HTTP/1.1 400 Bad Request\r\n" * 101)
                except OSError:
                    pass
                time.sleep(1.0)
            elif self.behaviour == "reset":
                time.sleep(0.3)
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST on close
            conn.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


@pytest.fixture
def listener():
    made = []

    def make(behaviour):
        made.append(Listener(behaviour))
        return made[-1]

    yield make
    for item in made:
        item.stop()


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)


def connect(port, timeout=3.0):
    return SSHConnection(f"root@127.0.0.1:{port}", SSHOptions(connect_timeout=timeout, known_hosts=[])).connect()


def test_a_peer_that_resets_is_not_reported_as_a_timeout(listener):
    peer = listener("reset")
    started = time.monotonic()
    with pytest.raises(ConnectError) as info:
        connect(peer.port, timeout=3.0)
    took = time.monotonic() - started
    assert took < 2.5
    assert "timed out" not in info.value.message
    assert f"127.0.0.1:{peer.port} accepted the connection, then reset the connection after 0." in info.value.message
    assert info.value.fix == f"check the port, and that sshd runs on the node: ssh -v -p {peer.port} 127.0.0.1"


def test_a_peer_that_speaks_something_else_is_named(listener):
    peer = listener("garbage")
    with pytest.raises(ConnectError, match=r"something answers on 127\.0\.0\.1:\d+ but it is not an SSH server "
                                           r"\(it said 'HTTP/1\.1 400 Bad Request"):
        connect(peer.port)


def test_a_closed_port_is_connection_refused(listener):
    peer = listener("close")
    port = peer.port
    peer.stop()  # nothing listens there any more
    with pytest.raises(ConnectError, match=f"cannot connect to 127.0.0.1:{port}: Connection refused"):
        connect(port)


CHILD = textwrap.dedent("""
    import sys, time
    from gpunode.connection.ssh import SSHConnection, SSHOptions
    from gpunode.errors import ConnectError
    conn = SSHConnection("root@127.0.0.1:" + sys.argv[1], SSHOptions(connect_timeout=2.0, known_hosts=[]))
    started = time.monotonic()
    try:
        conn.reconnect(float(sys.argv[2]))
    except ConnectError as exc:
        print("waited %.1f: %s" % (time.monotonic() - started, exc.message))
""")


@pytest.mark.parametrize("behaviour", ["close", "garbage", "reset"])
def test_waiting_for_a_reboot_behind_a_port_forward_prints_no_traceback(listener, behaviour, tmp_path):
    """A separate interpreter, because pytest's own log capture would hide paramiko's stderr output."""
    peer = listener(behaviour)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)}
    child = subprocess.run([sys.executable, "-c", CHILD, str(peer.port), "4"], capture_output=True, text=True,
                           timeout=60, env=env, cwd=tmp_path)
    assert child.returncode == 0, child.stderr
    assert child.stderr == ""  # no paramiko traceback, no log line
    assert child.stdout.startswith("waited ") and "did not come back within 4s" in child.stdout
    assert float(child.stdout.split()[1].rstrip(":")) >= 3.5  # kept waiting until its deadline ...
    assert peer.accepted >= 2  # ... and kept trying
