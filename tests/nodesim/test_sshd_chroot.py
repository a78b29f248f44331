"""The simulator's plumbing: a real sshd per node, the chroot, the login shell, keys, several nodes at once."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import paramiko
import pytest

from tests.nodesim import rootfs
from tests.nodesim.profiles import DISTROS, PROFILES, get_profile

pytestmark = pytest.mark.integration


def test_sshd_serves_a_chrooted_node(sim_node):
    node = sim_node("ubuntu-22.04-t4")
    assert node.host == "127.0.0.1" and node.user == "root" and node.port > 0
    rc, out, err = node.ssh("id -u; cat /etc/hostname; ls /")
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0] == "0"
    assert lines[1] == (node.read("/etc/hostname") or "").strip()
    # the host's own tree is not visible: only the node's root
    assert "work" not in lines[2:]
    assert not node.exists("/work")
    rc, out, _ = node.ssh("test -e /work/main && echo leaked || echo contained")
    assert out.strip() == "contained"
    # sshd is ours, started with its own config, and chroots into the node root
    cfg = Path(node.dir, "sshd_config").read_text()
    assert f"ChrootDirectory {node.root}" in cfg and "ListenAddress 127.0.0.1" in cfg and "UsePAM no" in cfg
    assert f"AuthorizedKeysFile {node.dir}/authorized_keys" in cfg
    cmd = " ".join(rootfs.pid_cmdline(node.sshd_pid))
    assert f"{rootfs.SSHD} -D -f {node.dir / 'sshd_config'} -E {node.dir / 'sshd.log'}" in cmd
    assert rootfs.sshd_pid_if_ours(node.dir) == node.sshd_pid
    assert str(node.root).startswith("/var/lib/gpunode-nodesim/")


def test_sshd_listens_on_loopback_only(sim_node):
    node = sim_node("debian-12-nogpu")
    listening = []
    with open("/proc/net/tcp") as fh:
        for line in fh.readlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            ip_hex, port_hex = local.split(":")
            if state == "0A" and int(port_hex, 16) == node.port:
                listening.append(socket.inet_ntoa(bytes.fromhex(ip_hex)[::-1]))
    assert listening == ["127.0.0.1"]


def test_login_shell_is_dash_and_python_is_not_on_path(sim_node):
    node = sim_node("ubuntu-24.04-nogpu")
    shell = next(ln.split(":")[6] for ln in node.read("/etc/passwd").splitlines() if ln.startswith("root:"))
    assert node._p(shell) == node.root / "usr/bin/dash"
    assert node._p("/bin/sh") == node.root / "usr/bin/dash"
    # dash: no bash-isms
    rc, out, err = node.ssh("echo ${BASH_VERSION:-none}; [[ 1 == 1 ]] && echo bashism")
    assert out.splitlines()[0] == "none" and "bashism" not in out
    rc, out, _ = node.ssh("command -v python3 python python2 perl; echo rc=$?")
    assert out.strip().endswith("rc=127") and "/" not in out.replace("rc=127", "")
    rc, out, _ = node.ssh("ls /usr/bin /usr/sbin /usr/local/bin /usr/local/sbin | grep -i python; echo done")
    assert out.strip() == "done"
    # the private interpreter exists, off PATH, for the JSON/TOML shims only
    assert node.exists("/opt/nodesim/python/bin/python3")


def test_busybox_applets_and_tools(sim_node):
    node = sim_node("rocky-9-nogpu")
    script = ("for t in cat mkdir mv cp rm ls od grep sed awk sort head tail tr cut printf echo test chmod chown "
              "mktemp stat sleep date find xargs basename dirname readlink sha256sum gzip tar wc uname id env true "
              "false tee ln touch cmp diff sync hostname install nohup getent cksum flock; do "
              "command -v $t >/dev/null || echo missing $t; done; echo ok")
    rc, out, err = node.ssh(script)
    assert out.strip() == "ok", out + err
    rc, out, _ = node.ssh("echo hello | sha256sum; printf 'b\\na\\n' | sort | head -n1; uname -m; uname -r")
    assert out.splitlines()[1:] == ["a", "x86_64", "5.14.0-362.8.1.el9_3.x86_64"]


def test_host_key_is_checked(sim_node, tmp_path):
    node = sim_node("ubuntu-22.04-nogpu")
    other = sim_node("ubuntu-22.04-nogpu")
    assert node.known_hosts != other.known_hosts
    kh = Path(node.known_hosts).read_text().split()
    assert kh[0] == f"[127.0.0.1]:{node.port}" and kh[1] == "ssh-ed25519"
    # the other node's key under this node's name: refused
    wrong = tmp_path / "known_hosts"
    wrong.write_text(f"[127.0.0.1]:{node.port} " + " ".join(Path(other.known_hosts).read_text().split()[1:3]) + "\n")
    client = paramiko.SSHClient()
    client.load_host_keys(str(wrong))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    with pytest.raises(paramiko.BadHostKeyException):
        client.connect("127.0.0.1", port=node.port, username="root", key_filename=node.key_path,
                       look_for_keys=False, allow_agent=False, timeout=10)
    client.close()
    assert node.cli_args() == ["--host", f"root@127.0.0.1:{node.port}", "--identity", node.key_path,
                               "--known-hosts", node.known_hosts]


def test_sftp_upload_into_the_chroot(sim_node, tmp_path):
    node = sim_node("ubuntu-22.04-nogpu")
    client = paramiko.SSHClient()
    client.load_host_keys(node.known_hosts)
    client.connect("127.0.0.1", port=node.port, username="root", key_filename=node.key_path, look_for_keys=False,
                   allow_agent=False, timeout=10)
    try:
        sftp = client.open_sftp()
        src = tmp_path / "blob"
        src.write_bytes(os.urandom(300_000))
        sftp.put(str(src), "/var/tmp/blob")
        sftp.close()
    finally:
        client.close()
    assert node.read_bytes("/var/tmp/blob") == src.read_bytes()


def test_read_write_exists_and_stdin(sim_node):
    node = sim_node("ubuntu-22.04-nogpu")
    assert node.read("/nonexistent") is None and not node.exists("/nonexistent")
    node.write("/etc/modprobe.d/test.conf", "blacklist foo\n")
    assert node.exists("/etc/modprobe.d/test.conf")
    rc, out, _ = node.ssh("cat /etc/modprobe.d/test.conf; cat > /tmp/x; cat /tmp/x", stdin="from stdin\n")
    assert out == "blacklist foo\nfrom stdin\n"
    # paths are always inside the node, never the host's, also through absolute symlinks made on the node
    assert node._p("../../../etc/shadow") == node.root / "etc/shadow"
    node.ssh("mkdir -p /srv/real && ln -s /srv/real /etc/linked && ln -s /etc/passwd /tmp/pw")
    node.write("/etc/linked/file", "x")
    assert (node.root / "srv/real/file").read_text() == "x"
    assert node.read("/tmp/pw") == node.read("/etc/passwd") != Path("/etc/passwd").read_text()


def test_fleet_of_twenty_nodes(sim_fleet):
    import time

    t0 = time.monotonic()
    nodes = sim_fleet([("ubuntu-22.04-h100x8", {}) if i % 2 else ("rocky-9-t4", {}) for i in range(20)])
    elapsed = time.monotonic() - t0
    assert len({n.port for n in nodes}) == 20
    assert max(n.started_seconds for n in nodes) < 20 and elapsed < 60
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(10) as pool:
        outs = list(pool.map(lambda n: n.ssh("cat /proc/sys/kernel/random/boot_id")[1].strip(), nodes))
    assert outs == [n.boot_id for n in nodes] and len(set(outs)) == 20


def test_several_nodes_at_once_on_separate_ports(sim_fleet):
    nodes = sim_fleet(["ubuntu-22.04-t4", "ubuntu-24.04-h100x8", "rocky-9-a100x8", "debian-12-rtx4090"])
    assert len({n.port for n in nodes}) == 4
    assert len({n.boot_id for n in nodes}) == 4
    ids = [n.ssh(". /etc/os-release; echo $ID-$VERSION_ID; uname -r")[1].split() for n in nodes]
    assert [i[0] for i in ids] == ["ubuntu-22.04", "ubuntu-24.04", "rocky-9.3", "debian-12"]
    assert [i[1] for i in ids] == [DISTROS[d].kernel for d in ("ubuntu-22.04", "ubuntu-24.04", "rocky-9", "debian-12")]


def test_stop_kills_by_pid_and_removes_the_root(sim_node):
    node = sim_node("ubuntu-22.04-nogpu")
    node.ssh("nohup sleep 300 >/dev/null 2>&1 &")
    pid = node.sshd_pid
    root, d = node.root, node.dir
    assert rootfs.processes_rooted_in(root)  # the background sleep lives in the chroot
    node.stop()
    assert not d.exists()
    assert not rootfs.pid_cmdline(pid)
    assert not rootfs.processes_rooted_in(root)


def test_stale_directories_of_dead_runs_are_removed(nodesim_available):
    d = rootfs.new_dir("node")
    (d / "owner").write_text("999999999 12345")  # no such process
    (d / "root").mkdir()
    removed = rootfs.cleanup_stale()
    assert d.name in removed and not d.exists()


def test_a_directory_another_live_process_is_making_is_kept(nodesim_available):
    # new_dir makes the directory, then writes its owner: another test process (an xdist worker) cleaning up in
    # between must not take it for a dead run's
    d = rootfs.new_dir("node")
    try:
        (d / "owner").write_text("")  # as between mkdir and the owner's write, by this (live) process
        assert d.name not in rootfs.cleanup_stale() and d.exists()
        (d / "owner").write_text("")
        dead = d.with_name("node-999999999-" + d.name.rsplit("-", 1)[1])
        d.rename(dead)
        d = dead
        assert d.name in rootfs.cleanup_stale() and not d.exists()  # the same, of a process that is gone
    finally:
        rootfs.destroy_node_dir(d)


def test_profiles_cover_distros_and_gpus():
    assert {"ubuntu-22.04", "ubuntu-24.04", "debian-12", "rocky-9"} <= set(DISTROS)
    for g in ("nogpu", "t4", "rtx4090", "a100x8", "h100x8", "b200x8"):
        assert f"ubuntu-22.04-{g}" in PROFILES
    p = get_profile("rocky-9", gpu="b200x8", secure_boot=True)
    assert p.gpus.model.device_id == 0x2901 and p.gpus.count == 8
    with pytest.raises(TypeError):
        get_profile("rocky-9", colour="red")
    with pytest.raises(ValueError):
        get_profile("rocky-9", engines=("podman",))
