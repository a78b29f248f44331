"""Smoke test of the contract between gpunode's SSH transport and the node simulator: every primitive the
connection layer builds on (argv commands, read/write of files, SFTP upload, root detection) works on a
simulated node through the real sshd, with the host key checked against the node's known_hosts."""

from __future__ import annotations

import pytest

from tests.nodesim.fixtures import host_guard, nodesim_available, sim_node  # noqa: F401 - pytest fixtures

pytestmark = pytest.mark.integration

ssh_mod = pytest.importorskip("gpunode.connection.ssh")


def _connect(node, tmp_path):
    cfg = tmp_path / "ssh_config"
    cfg.write_text("")
    opts = ssh_mod.SSHOptions(identity=[node.key_path], known_hosts=[node.known_hosts], ssh_config=str(cfg))
    return ssh_mod.SSHConnection(f"root@127.0.0.1:{node.port}", opts).connect()


def test_gpunode_connection_primitives_on_a_simulated_node(sim_node, tmp_path):  # noqa: F811
    node = sim_node("ubuntu-22.04-t4")
    conn = _connect(node, tmp_path)
    try:
        assert conn.run(["id", "-u"]).stdout == "0\n"
        assert conn.run(["uname", "-r"]).stdout.strip() == node.kernel
        assert conn.read_file("/etc/os-release") == node.read("/etc/os-release")
        assert conn.read_file("/etc/no-such-file") is None
        first = conn.write_file("/etc/modprobe.d/blacklist-nouveau.conf", "blacklist nouveau\n")
        assert first.changed
        assert node.read("/etc/modprobe.d/blacklist-nouveau.conf") == "blacklist nouveau\n"
        assert not conn.write_file("/etc/modprobe.d/blacklist-nouveau.conf", "blacklist nouveau\n").changed
        blob = tmp_path / "blob.run"
        blob.write_bytes(b"\x7fELF" + bytes(range(256)) * 64)
        conn.upload(blob, "/var/tmp/blob.run", mode=0o755)
        assert node.read_bytes("/var/tmp/blob.run") == blob.read_bytes()
        assert conn.run(["sh", "-c", "command -v python3 || command -v python || echo none"]).stdout == "none\n"
    finally:
        conn.close()
