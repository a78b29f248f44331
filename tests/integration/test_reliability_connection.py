"""The connection layer under faults, on simulated nodes (real sshd, real SFTP, the node's own sh):
for each fault a clear error naming cause and fix, the old file intact, and a re-run that converges."""

import _thread
import json
import os
import pwd
import socket
import threading
import time

import pytest

from gpunode.cancel import Cancelled
from gpunode.connection.base import NoSpaceError
from gpunode.connection.ssh import SSHConnection, SSHOptions
from gpunode.errors import ConnectError
from gpunode.journal import JOURNAL_PATH, read_journal
from gpunode.runrecord import Journal


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home" / ".ssh").mkdir(parents=True)
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)


def options(node, **kw):
    kw.setdefault("identity", [str(node.key_path)])
    kw.setdefault("known_hosts", [str(node.known_hosts)])
    kw.setdefault("connect_timeout", 5.0)
    return SSHOptions(**kw)


class CutMidStream(SSHConnection):
    """Drops the TCP connection once half of a command's stdin has been sent: the node sees end-of-input."""

    cut = True

    def _send_stdin(self, chan, data):
        if not self.cut:
            return super()._send_stdin(chan, data)
        half = len(data) // 2
        super()._send_stdin(chan, data[:half])
        time.sleep(0.2)  # let the first half reach the node's temp file
        chan.get_transport().sock.shutdown(socket.SHUT_RDWR)
        super()._send_stdin(chan, data[half:])


def wait_no_temp_files(node, directory, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [n for n in node.listdir(directory) if n.startswith(".gpunode-tmp")]
        if not left:
            return []
        time.sleep(0.1)
    return left


def test_connection_dropped_mid_write_keeps_the_old_file_and_a_rerun_converges(sim_node):
    node = sim_node("ubuntu-22.04-nogpu")
    node.write("/etc/modprobe.d/blacklist-nouveau.conf", "old\n")
    content = "blacklist nouveau\noptions nouveau modeset=0\n" + "# padding\n" * 3000
    conn = CutMidStream(f"root@127.0.0.1:{node.port}", options(node))
    with pytest.raises(ConnectError) as info:
        conn.write_file("/etc/modprobe.d/blacklist-nouveau.conf", content)
    assert "dropped" in info.value.message and "the node keeps its previous file" in info.value.message
    assert info.value.fix
    assert wait_no_temp_files(node, "/etc/modprobe.d") == []
    assert node.read("/etc/modprobe.d/blacklist-nouveau.conf") == "old\n"
    conn.cut = False
    conn.close()
    outcome = conn.write_file("/etc/modprobe.d/blacklist-nouveau.conf", content)  # fault cleared
    assert outcome.changed and node.read("/etc/modprobe.d/blacklist-nouveau.conf") == content
    conn.close()


def test_connection_dropped_while_saving_the_journal_never_corrupts_it(sim_node):
    node = sim_node("ubuntu-22.04-nogpu")
    runs = [{"id": f"r{i}", "started": "2026-01-01T00:00:00Z", "finished": "2026-01-01T00:10:00Z",
             "command": "install", "status": "done", "steps": [{"step": "driver", "reason": "x" * 400}] * 3}
            for i in range(15)]
    original = json.dumps({"schema_version": 1, "runs": runs}, indent=2) + "\n"
    assert len(original) > 20_000
    node.write(JOURNAL_PATH, original)
    conn = CutMidStream(f"root@127.0.0.1:{node.port}", options(node))
    record = Journal(conn, "install driver")
    record.begin()  # saves the journal: the connection is cut half way
    assert record.error and "could not update" in record.error
    assert wait_no_temp_files(node, "/var/lib/gpunode") == []
    assert node.read(JOURNAL_PATH) == original  # intact, so install and status still run
    conn.cut = False
    conn.close()
    assert len(read_journal(conn)["runs"]) == 15
    record = Journal(conn, "install driver")
    record.begin()
    assert record.error is None and len(read_journal(conn)["runs"]) == 16
    conn.close()


def test_connection_dropped_mid_upload_installs_nothing_and_a_rerun_converges(sim_node, tmp_path):
    node = sim_node("ubuntu-22.04-nogpu")
    payload = tmp_path / "driver.run"
    payload.write_bytes(os.urandom(3_000_000))
    node.write("/root/driver.run", b"old")
    conn = SSHConnection(f"root@127.0.0.1:{node.port}", options(node))

    def cut(done, total):
        if done > 1_000_000:
            conn._client.get_transport().sock.shutdown(socket.SHUT_RDWR)

    with pytest.raises(ConnectError, match=r"dropped during the upload \(\d+ of 3000000 bytes sent\); nothing "
                                           "was installed"):
        conn.upload(payload, "/root/driver.run", progress=cut)
    assert node.read_bytes("/root/driver.run") == b"old"
    conn.close()
    conn.upload(payload, "/root/driver.run")
    assert node.read_bytes("/root/driver.run") == payload.read_bytes()
    conn.close()


def test_ctrl_c_during_an_upload_returns_promptly_and_the_connection_still_works(sim_node, tmp_path):
    node = sim_node("ubuntu-22.04-nogpu")
    payload = tmp_path / "driver.run"
    payload.write_bytes(os.urandom(4_000_000))
    conn = SSHConnection(f"root@127.0.0.1:{node.port}", options(node))

    def ctrl_c(done, total):
        if done > 1_000_000:
            raise KeyboardInterrupt  # where the signal lands: in the main thread, inside the upload loop

    started = time.monotonic()
    with pytest.raises(Cancelled, match="interrupted \\(Ctrl-C\\) during the upload"):
        conn.upload(payload, "/root/driver.run", progress=ctrl_c)
    assert time.monotonic() - started < 10
    assert not node.exists("/root/driver.run")
    assert conn.run(["echo", "still here"]).stdout == "still here\n"
    conn.upload(payload, "/root/driver.run")
    assert node.read_bytes("/root/driver.run") == payload.read_bytes()
    conn.close()


@pytest.mark.usefixtures("cli_owns_signals")  # gpunode's own handler (tests/conftest.py)
def test_ctrl_c_during_a_remote_command_is_an_error_not_a_traceback(sim_node):
    node = sim_node("ubuntu-22.04-nogpu")
    with SSHConnection(f"root@127.0.0.1:{node.port}", options(node)) as conn:
        timer = threading.Timer(0.5, _thread.interrupt_main)
        timer.start()
        started = time.monotonic()
        with pytest.raises(Cancelled) as info:
            conn.run(["sleep", "20"])
        timer.join()
        assert time.monotonic() - started < 5
        assert "interrupted (Ctrl-C) while a command was running on the node" in info.value.message
        assert info.value.exit_code == 130 and "run the same command again" in info.value.fix
        assert conn.run(["echo", "ok"]).stdout == "ok\n"


DISK_FULL_CAT = """#!/bin/sh
# nodesim: a full filesystem for gpunode's writes (stdin copied to a file): the kernel's /dev/full says ENOSPC
if [ $# -eq 0 ] && [ -e /var/lib/nodesim/disk-full ]; then exec /bin/cat >/dev/full; fi
exec /bin/cat "$@"
"""


def test_disk_full_on_the_node_is_named_and_nothing_is_replaced(sim_node):
    node = sim_node("ubuntu-22.04-nogpu")
    node.write("/usr/local/sbin/cat", DISK_FULL_CAT, 0o755)
    node.write("/var/lib/nodesim/disk-full", "")
    node.write("/etc/docker/daemon.json", '{"data-root": "/data"}\n')
    with SSHConnection(f"root@127.0.0.1:{node.port}", options(node)) as conn:
        with pytest.raises(NoSpaceError) as info:
            conn.write_file("/etc/docker/daemon.json", '{"runtimes": {}}\n')
        assert "no space left on the node in /etc/docker" in info.value.message
        assert "df -h /etc/docker" in info.value.fix
        assert node.read("/etc/docker/daemon.json") == '{"data-root": "/data"}\n'
        assert wait_no_temp_files(node, "/etc/docker") == []
        node.remove("/var/lib/nodesim/disk-full")  # space freed
        assert conn.write_file("/etc/docker/daemon.json", '{"runtimes": {}}\n').changed
    assert node.read("/etc/docker/daemon.json") == '{"runtimes": {}}\n'


def test_a_symlinked_apt_source_is_written_through_over_ssh(sim_node):
    node = sim_node("ubuntu-22.04-nogpu")
    node.write("/srv/cm/cuda.list", "deb old\n")
    node.run_local("ln -s /srv/cm/cuda.list /etc/apt/sources.list.d/cuda.list")
    with SSHConnection(f"root@127.0.0.1:{node.port}", options(node)) as conn:
        outcome = conn.write_file("/etc/apt/sources.list.d/cuda.list", "deb new\n")
    assert node.run_local("readlink /etc/apt/sources.list.d/cuda.list")[1].strip() == "/srv/cm/cuda.list"
    assert node.read("/srv/cm/cuda.list") == "deb new\n"
    assert outcome.backup.startswith("/srv/cm/cuda.list.gpunode-bak.") and node.read(outcome.backup) == "deb old\n"


def test_unreachable_host_is_a_connect_error_and_works_once_it_is_back(sim_node):
    node = sim_node("ubuntu-22.04-nogpu")
    node.run_local("poweroff")
    with pytest.raises(ConnectError, match=f"cannot connect to 127.0.0.1:{node.port}: Connection refused") as info:
        SSHConnection(f"root@127.0.0.1:{node.port}", options(node)).connect()
    assert "sshd is running" in info.value.fix
    node.power_on()
    with SSHConnection(f"root@127.0.0.1:{node.port}", options(node)) as conn:
        assert conn.run(["true"]).ok


def test_a_login_shell_that_refuses_commands_is_named(sim_node):
    node = sim_node("ubuntu-22.04-nogpu")
    shell = pwd.getpwuid(0).pw_shell  # sshd runs the host user's shell path inside the chroot
    node.write(shell, "#!/bin/sh\necho 'This account is currently not available.'\nexit 1\n", 0o755)
    with pytest.raises(ConnectError) as info:
        SSHConnection(f"root@127.0.0.1:{node.port}", options(node)).connect()
    assert info.value.message == (f"root@127.0.0.1:{node.port}: the login shell of root refuses to run commands "
                                  "(it said: 'This account is currently not available.')")
    assert info.value.fix.endswith("chsh -s /bin/sh root") and info.value.exit_code == 2


def test_no_key_and_no_password_points_at_identity_agent_or_ask_pass(sim_node):
    node = sim_node("ubuntu-22.04-nogpu")
    with pytest.raises(ConnectError, match="no SSH key or password to log in as root") as info:
        SSHConnection(f"root@127.0.0.1:{node.port}", options(node, identity=[])).connect()
    assert "--identity" in info.value.fix and "ssh-add" in info.value.fix and "--ask-pass" in info.value.fix
