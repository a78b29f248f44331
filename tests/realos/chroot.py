"""A Debian 12 node at native speed: a real Debian userland (the nvidia image's kept tree) in namespaces the test
creates, reached over its own sshd. For what must run natively (a real DKMS build takes hours under TCG).

Isolation (tests/realos/README.md, "the chroot node"):
- a user namespace whose root is host uid 100000 (not the host's root: no capability outside it, so no module
  can be loaded, no sysctl or host file written; CAP_SYS_MODULE is never granted in a user namespace);
- a mount namespace: the tree's /proc, /sys, /dev (only null, zero, full, random, urandom, tty), /run exist
  there only and vanish with it; the host's mount table never sees them;
- a pid namespace (its init is the holder below: killing it ends everything in the node);
- a network namespace with only `lo`, carrying 10.0.2.100, the address the image's apt sources name: the test
  listens there (inside the namespace) and relays to the tier's mirror (mirror.py), so nothing listens outside.
- sshd is started per connection in inetd mode (`sshd -i`) by the ssh config's ProxyCommand (nsenter + chroot):
  no port is opened anywhere.

    python3 -m tests.realos.chroot hold UID_BASE -- ARGV...   (the holder: used by ChrootNode, not by hand)
"""

from __future__ import annotations

import ctypes
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from tests.realos.vm import HOST_ALIAS, Result, ssh

UID_BASE = 100000  # the node's root is this host uid; 65536 ids are mapped
CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
APT_ADDRESS = ("10.0.2.100", 80)  # the image's sources: deb http://10.0.2.100/debian ...
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")

# Runs as the namespace's init (pid 1), as the node's root: unpack the tree from stdin, mount what a booted
# Debian has, put the apt address on lo, then hold the namespaces until killed.
SETUP = r"""
set -eu
R=$1 S=$2
mount --make-rprivate /
zstd -q -dc | tar -C "$R" --numeric-owner -xpf - --exclude='./dev/*'
# It never boots: initramfs-tools' rebuilds are switched off (with the image's MODULES=dep they would fail here,
# "failed to determine device for /": the node's / is no block device of its own)
sed -i 's/^update_initramfs=.*/update_initramfs=no/' "$R/etc/initramfs-tools/update-initramfs.conf"
mount -t proc proc "$R/proc"
mount -t sysfs sysfs "$R/sys"
mount -t tmpfs -o mode=755,nosuid tmpfs "$R/dev"
for d in DEVICES; do : > "$R/dev/$d"; mount --bind "/dev/$d" "$R/dev/$d"; done
mkdir -p "$R/dev/pts" "$R/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666 devpts "$R/dev/pts"
ln -s pts/ptmx "$R/dev/ptmx"; ln -s /proc/self/fd "$R/dev/fd"
ln -s /proc/self/fd/0 "$R/dev/stdin"; ln -s /proc/self/fd/1 "$R/dev/stdout"; ln -s /proc/self/fd/2 "$R/dev/stderr"
mount -t tmpfs -o mode=1777 tmpfs "$R/dev/shm"
mount -t tmpfs -o mode=755,nosuid,nodev tmpfs "$R/run"
mkdir -p "$R/run/lock" "$R/run/sshd" "$R/run/realos"
mount --bind "$S" "$R/run/realos"
ip link set lo up
ip addr add 10.0.2.100/32 dev lo
echo ready
exec sleep infinity
""".replace("DEVICES", " ".join(DEVICES))


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def hold(uid_base: int, argv: list[str]) -> int:
    """The holder: a child in new user/mount/net/pid namespaces (root there = host `uid_base`), whose child, the
    namespace's pid 1, execs `argv`. Prints `pid N` (pid 1's host pid) first. Each process dies with its
    parent (PR_SET_PDEATHSIG), so killing this one by its PID ends the whole node."""
    libc = _libc()
    _check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL), "prctl")
    unshared_r, unshared_w = os.pipe()
    mapped_r, mapped_w = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            os.close(unshared_r)
            os.close(mapped_w)
            _check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL), "prctl")
            _check(libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID), "unshare")
            os.write(unshared_w, b"u")
            if os.read(mapped_r, 1) != b"m":
                os._exit(70)
            os.setgroups([])
            os.setgid(0)
            os.setuid(0)
            _check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL), "prctl")  # cleared by the credential change
            init = os.fork()
            if init == 0:
                _check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL), "prctl")
                os.execvp(argv[0], argv)
            sys.stdout.write(f"pid {init}\n")
            sys.stdout.flush()
            _, status = os.waitpid(init, 0)
            os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
        except BaseException as exc:  # noqa: BLE001 - the child must never return into the caller
            print(f"holder: {exc}", file=sys.stderr)
            os._exit(71)
    os.close(unshared_w)
    os.close(mapped_r)
    if os.read(unshared_r, 1) != b"u":
        return 72
    for name in ("uid_map", "gid_map"):
        Path(f"/proc/{child}/{name}").write_text(f"0 {uid_base} 65536\n")
    os.write(mapped_w, b"m")
    _, status = os.waitpid(child, 0)
    return os.waitstatus_to_exitcode(status)


class _Relay:
    """Listens on 10.0.2.100:80 inside the node's network namespace (its socket is made by a thread that joined
    that namespace) and relays every connection to the mirror on the host's 127.0.0.1."""

    def __init__(self, netns_pid: int, target_port: int) -> None:
        self.target_port = target_port
        made: dict[str, object] = {}
        path = f"/proc/{netns_pid}/ns/net"

        def listen_inside() -> None:  # setns(CLONE_NEWNET) moves only the calling thread
            try:
                fd = os.open(path, os.O_RDONLY)
                try:
                    _check(_libc().setns(fd, CLONE_NEWNET), "setns")
                finally:
                    os.close(fd)
                sock = socket.socket()
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(APT_ADDRESS)
                sock.listen(32)
                made["sock"] = sock
            except BaseException as exc:  # noqa: BLE001 - reported to the caller
                made["error"] = exc

        t = threading.Thread(target=listen_inside, name="realos-chroot-netns")
        t.start()
        t.join()
        if "error" in made:
            raise RuntimeError(f"cannot listen in the node's network namespace: {made['error']}")
        self.sock: socket.socket = made["sock"]  # type: ignore[assignment]
        threading.Thread(target=self._accept, name="realos-chroot-relay", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._pipe, args=(conn,), daemon=True).start()

    def _pipe(self, conn: socket.socket) -> None:
        try:
            up = socket.create_connection(("127.0.0.1", self.target_port))
        except OSError:
            conn.close()
            return

        def copy(src: socket.socket, dst: socket.socket) -> None:
            try:
                while data := src.recv(65536):
                    dst.sendall(data)
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass

        t = threading.Thread(target=copy, args=(up, conn), daemon=True)
        t.start()
        copy(conn, up)
        t.join()
        conn.close()
        up.close()

    def stop(self) -> None:
        self.sock.close()


class ChrootNode:
    """The node: `start()` unpacks `tree` (a tree.tar.zst) in its namespaces and makes the ssh config; it looks
    like a `vm.Vm` to the tier's fixtures (ssh_config, ssh, timings). `stop()` kills the holder by its PID and
    removes the tree."""

    def __init__(self, tree: Path, mirror_port: int) -> None:
        self.tree = tree
        # its own directory, traversable by the node's root (host uid UID_BASE): never pytest's tmp_path, whose
        # rotation could remove it while the node runs
        self.workdir = Path(tempfile.mkdtemp(prefix="gpunode-realos-chroot."))
        self.mirror_port = mirror_port
        self.root = self.workdir / "root"
        self.sshd_dir = self.workdir / "sshd"
        self.proc: subprocess.Popen | None = None
        self.init_pid = 0
        self.relay: _Relay | None = None
        self.timings: dict[str, float] = {}

    @property
    def ssh_config(self) -> Path:
        return self.workdir / "client" / "ssh_config"

    def _keys(self) -> None:
        client = self.workdir / "client"
        client.mkdir(mode=0o700)
        for d in (self.root, self.sshd_dir):
            d.mkdir(mode=0o755 if d == self.root else 0o700)
            os.chown(d, UID_BASE, UID_BASE)
        self.workdir.chmod(0o755)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(client / "id_ed25519")], check=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.sshd_dir / "host_key")],
                       check=True)
        shutil.copy(client / "id_ed25519.pub", self.sshd_dir / "authorized_keys")
        (self.sshd_dir / "sshd_config").write_text(
            "HostKey /run/realos/host_key\nPidFile none\nAuthorizedKeysFile /run/realos/authorized_keys\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            "UsePAM no\nStrictModes no\nSubsystem sftp internal-sftp\nLogLevel ERROR\n")
        for f in self.sshd_dir.iterdir():
            os.chown(f, UID_BASE, UID_BASE)
            f.chmod(0o600)
        host_key = (self.sshd_dir / "host_key.pub").read_text().split()[:2]
        (client / "known_hosts").write_text(f"{HOST_ALIAS} {' '.join(host_key)}\n")

    def start(self, timeout: float = 900) -> ChrootNode:
        self._keys()
        started = time.monotonic()
        argv = [sys.executable, "-m", "tests.realos.chroot", "hold", str(UID_BASE), "--",
                "sh", "-c", SETUP, "setup", str(self.root), str(self.sshd_dir)]
        env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
        with open(self.tree, "rb") as tree:
            self.proc = subprocess.Popen(argv, stdin=tree, stdout=subprocess.PIPE, text=True, env=env,
                                         stderr=open(self.workdir / "holder.stderr", "w"),
                                         preexec_fn=lambda: _libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL))
        assert self.proc.stdout is not None
        lines = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the node's holder ended: {(self.workdir / 'holder.stderr').read_text()[-3000:]}")
            lines.append(line.strip())
            if line.startswith("pid "):
                self.init_pid = int(line.split()[1])
            if line.strip() == "ready":
                break
        else:
            raise TimeoutError(f"the node was not ready within {timeout:.0f} s: {lines}")
        self.timings["tree unpacked and mounted"] = time.monotonic() - started
        self.relay = _Relay(self.init_pid, self.mirror_port)
        proxy = shlex.join(["nsenter", "-t", str(self.init_pid), "-U", "-m", "-p", "-n",
                            "chroot", str(self.root), "/usr/sbin/sshd", "-i", "-f", "/run/realos/sshd_config"])
        client = self.workdir / "client"
        self.ssh_config.write_text(
            f"Host {HOST_ALIAS}\n  HostName {HOST_ALIAS}\n  User root\n  IdentityFile {client / 'id_ed25519'}\n"
            f"  IdentitiesOnly yes\n  UserKnownHostsFile {client / 'known_hosts'}\n  StrictHostKeyChecking yes\n"
            f"  ProxyCommand {proxy}\n")
        self.ssh("true", check=True, timeout=60)
        return self

    def ssh(self, command: str, timeout: float = 600, check: bool = False) -> Result:
        return ssh(self.ssh_config, command, timeout, check)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """Kill the holder by its PID (its children die with it: PR_SET_PDEATHSIG; the namespace's init takes
        every process and mount of the node with it), then remove the tree."""
        if self.relay is not None:
            self.relay.stop()
            self.relay = None
        if self.proc is not None:
            if self.proc.poll() is None:
                os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=60)
            self.proc = None
        if self.init_pid:
            deadline = time.monotonic() + 60  # pid 1 of the node: gone once the kernel has torn the namespace down
            while Path(f"/proc/{self.init_pid}").exists() and time.monotonic() < deadline:
                time.sleep(0.2)
            if Path(f"/proc/{self.init_pid}").exists():
                raise RuntimeError(f"the node's init (pid {self.init_pid}) did not end: its tree is left in place")
        shutil.rmtree(self.workdir, ignore_errors=True)


def main(argv: list[str]) -> int:
    if len(argv) >= 4 and argv[0] == "hold" and argv[2] == "--":
        return hold(int(argv[1]), argv[3:])
    print(__doc__)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
