"""SSHConnection against real sshd: host keys, authentication, ssh_config, ProxyJump, big outputs."""

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpunode.cli import app
from gpunode.connection.ssh import SSHConnection, SSHOptions
from gpunode.errors import ConnectError

runner = CliRunner()


def options(node, **kw) -> SSHOptions:
    kw.setdefault("identity", [str(node.key_path)])
    kw.setdefault("known_hosts", [str(node.known_hosts)])
    return SSHOptions(**kw)


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path, monkeypatch):
    """Never read or write the real ~/.ssh of whoever runs the tests."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home" / ".ssh").mkdir(parents=True)


def test_unknown_host_key_is_refused_with_its_fingerprint(sim_node, tmp_path):
    node = sim_node("ubuntu-22.04-nogpu")
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    with pytest.raises(ConnectError, match=r"is not in known_hosts \(ssh-ed25519 SHA256:") as info:
        SSHConnection(f"root@127.0.0.1:{node.port}", options(node, known_hosts=[str(empty)])).connect()
    assert "--accept-new-host-key" in (info.value.fix or "")


def test_accept_new_records_the_key_then_strict_works(sim_node, tmp_path):
    node = sim_node("ubuntu-22.04-nogpu")
    kh = tmp_path / "kh"
    kh.write_text("")
    with SSHConnection(f"root@127.0.0.1:{node.port}", options(node, known_hosts=[str(kh)],
                                                              accept_new_host_key=True)) as conn:
        assert conn.run(["id", "-u"]).stdout.strip() == "0"
    assert kh.read_text().startswith(f"[127.0.0.1]:{node.port} ssh-ed25519 ")
    with SSHConnection(f"root@127.0.0.1:{node.port}", options(node, known_hosts=[str(kh)])) as conn:
        assert conn.run(["true"]).ok


def test_changed_host_key_is_refused_even_with_accept_new(sim_node, tmp_path):
    a, b = sim_node("ubuntu-22.04-nogpu"), sim_node("ubuntu-22.04-nogpu")
    # known_hosts says b's port has a's key: the key "changed".
    wrong = tmp_path / "kh"
    wrong.write_text(Path(a.known_hosts).read_text().replace(f"]:{a.port} ", f"]:{b.port} "))
    for accept in (False, True):
        with pytest.raises(ConnectError, match="has CHANGED") as info:
            SSHConnection(f"root@127.0.0.1:{b.port}", options(b, known_hosts=[str(wrong)],
                                                              accept_new_host_key=accept)).connect()
        assert "ssh-keygen -R" in (info.value.fix or "")


def test_wrong_key_is_an_authentication_failure(sim_node, tmp_path):
    node = sim_node("ubuntu-22.04-nogpu")
    import paramiko

    other = tmp_path / "other_key"  # a valid key (PEM RSA, as older ssh-keygen wrote) the node does not accept
    paramiko.RSAKey.generate(2048).write_private_key_file(str(other))
    with pytest.raises(ConnectError, match="authentication failed for user root"):
        SSHConnection(f"root@127.0.0.1:{node.port}", options(node, identity=[str(other)])).connect()


def test_unreadable_key_file_is_named(sim_node, tmp_path):
    node = sim_node("ubuntu-22.04-nogpu")
    junk = tmp_path / "junk_key"
    junk.write_text("this is not a key\n")
    with pytest.raises(ConnectError, match="cannot use the private key .*junk_key"):
        SSHConnection(f"root@127.0.0.1:{node.port}", options(node, identity=[str(junk)])).connect()


def test_cli_errors_are_one_line_and_exit_2(sim_node, tmp_path):
    node = sim_node("ubuntu-22.04-nogpu")
    empty = tmp_path / "kh"
    empty.write_text("")
    result = runner.invoke(app, ["plan", "--host", f"root@127.0.0.1:{node.port}", "--identity",
                                 str(node.key_path), "--known-hosts", str(empty)])
    assert result.exit_code == 2
    assert "is not in known_hosts" in result.output and "Traceback" not in result.output


def test_ssh_config_alias_and_proxyjump(sim_node, tmp_path):
    bastion, target = sim_node("ubuntu-22.04-nogpu", tcp_forwarding=True), sim_node("rocky-9-t4")
    kh = tmp_path / "known_hosts"
    kh.write_text(Path(bastion.known_hosts).read_text() + Path(target.known_hosts).read_text())
    config = tmp_path / "ssh_config"
    config.write_text(f"""Host bastion
    HostName 127.0.0.1
    Port {bastion.port}
    User root
    IdentityFile {bastion.key_path}
Host gpu-behind
    HostName 127.0.0.1
    Port {target.port}
    User root
    IdentityFile {target.key_path}
    ProxyJump bastion
""")
    result = runner.invoke(app, ["facts", "--host", "gpu-behind", "--ssh-config", str(config),
                                 "--known-hosts", str(kh)])
    assert result.exit_code == 0, result.output
    assert '"id": "rocky"' in result.stdout  # the target's facts, reached through the bastion


def test_large_output_and_timeout_over_ssh(sim_node):
    node = sim_node("ubuntu-22.04-nogpu")
    from gpunode.shell import Script

    with SSHConnection(f"root@127.0.0.1:{node.port}", options(node)) as conn:
        big = conn.run(Script("head -c 3000000 /dev/zero | tr '\\0' a; head -c 3000000 /dev/zero | tr '\\0' b >&2"),
                       timeout=120)
        assert len(big.stdout) == 3_000_000 and len(big.stderr) == 3_000_000
        slow = conn.run(Script("sleep 30"), timeout=1)
        assert slow.timed_out
        assert conn.run(["echo", "still usable"]).stdout == "still usable\n"


def test_write_file_over_ssh_is_atomic_with_backup(sim_node):
    node = sim_node("ubuntu-22.04-nogpu")
    with SSHConnection(f"root@127.0.0.1:{node.port}", options(node)) as conn:
        conn.write_file("/etc/gpunode-test.conf", "one\n")
        second = conn.write_file("/etc/gpunode-test.conf", "two\n")
    assert node.read("/etc/gpunode-test.conf") == "two\n"
    assert second.backup and node.read(second.backup) == "one\n"


def test_upload_verifies_and_places_the_file(sim_node, tmp_path):
    node = sim_node("ubuntu-22.04-nogpu")
    payload = tmp_path / "blob"
    payload.write_bytes(os.urandom(2_000_000))
    seen = []
    with SSHConnection(f"root@127.0.0.1:{node.port}", options(node)) as conn:
        target = conn.make_private_dir("/var/tmp") + "/blob"
        conn.upload(payload, target, mode=0o700, progress=lambda done, total: seen.append((done, total)))
    assert node.read_bytes(target) == payload.read_bytes()
    assert seen and seen[-1] == (2_000_000, 2_000_000)
    assert Path(target).parent.name.startswith("gpunode.")


def test_a_dropped_idle_connection_is_reestablished_before_the_next_command(sim_node):
    node = sim_node("ubuntu-22.04-nogpu")
    with SSHConnection(f"root@127.0.0.1:{node.port}", options(node)) as conn:
        first = conn.run(["cat", "/proc/sys/kernel/random/boot_id"]).stdout.strip()
        node.reboot()  # from outside, like a BMC power cycle: our idle session dies
        second = conn.run(["cat", "/proc/sys/kernel/random/boot_id"]).stdout.strip()
    assert first and second and first != second
