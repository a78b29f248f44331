"""SimNode: one simulated GPU node behind a real OpenSSH server on 127.0.0.1.

    node = SimNode(get_profile("ubuntu-22.04-t4"))
    node.start()
    rc, out, err = node.ssh("nvidia-smi")
    node.stop()

The node is a chroot (rootfs.py) served by /usr/sbin/sshd with its own config, host key, user key, pid file and
log; logins are as root, and the login shell inside the chroot is dash.  Every tool gpunode may run is either a
busybox applet or a simulator shim (node_files/shims) that keeps /proc, /sys and /var/lib/nodesim consistent.

Reboots: a `reboot`/`shutdown -r`/`systemctl reboot` on the node asks the host (a watcher thread) to drop every
session of the node - as a real reboot would - and then boot it again (node_files/lib/boot.sh).
"""

from __future__ import annotations

import atexit
import base64
import gzip
import hashlib
import os
import random
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from tests.nodesim import catalog as catalog_mod
from tests.nodesim import rootfs
from tests.nodesim.profiles import Profile, default_flavor, get_profile

STATE = "var/lib/nodesim"
REAL_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "real"  # real programs' output
CHROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SB_EFIVAR = "sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"

BOOT_TIMEOUT = 300.0   # seconds a boot (lib/boot.sh) may take on a loaded machine
SSHD_PORT_WAIT = 120.0  # seconds a rebooted node's sshd keeps trying its own port

_ports_lock = threading.Lock()
_ports_in_use: set[int] = set()


def _below_ephemeral() -> range:
    """Ports below the kernel's ephemeral range: no outgoing connection and no bind to port 0 (another test
    process's node, an xdist worker's) takes a node's port while its sshd is down for a reboot, so the node comes
    back on the port its clients (an Ansible inventory) know."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    return range(10000, max(low, 11000))


def _free_port() -> int:
    with _ports_lock:
        ports = _below_ephemeral()
        for _ in range(200):
            port = random.choice(ports)
            if port in _ports_in_use:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            _ports_in_use.add(port)
            return port
    raise RuntimeError("no free port on 127.0.0.1")


def _release_port(port: int) -> None:
    with _ports_lock:
        _ports_in_use.discard(port)


def _root_shell() -> str:
    """Login shell of root on this host: sshd runs it (inside the chroot) for every command."""
    try:
        with open("/etc/passwd", encoding="utf-8") as fh:
            for line in fh:
                f = line.rstrip("\n").split(":")
                if f[0] == "root" and len(f) >= 7 and f[6]:
                    return f[6]
    except OSError:
        pass
    return "/bin/sh"


# ----------------------------------------------------------------------------------------------------------
# reboot watcher: one thread for every live node



TOOLKIT_REPO = "https://nvidia.github.io/libnvidia-container/stable"


def headers_tree(family: str, kernel: str) -> str:
    """Where /lib/modules/K/build points: the RHEL family's /usr/src/kernels/K, SUSE's kernel-<flavour>-devel
    object tree /usr/src/linux-<version>-obj/<arch>/<flavour>, Debian's /usr/src/linux-headers-K."""
    if family == "rhel":
        return f"/usr/src/kernels/{kernel}"
    if family == "suse":
        version, _, flavour = kernel.rpartition("-")
        return f"/usr/src/linux-{version}-obj/x86_64/{flavour}"
    return f"/usr/src/linux-headers-{kernel}"


def headers_package(family: str, kernel: str) -> str:
    """The catalog's headers package of the running kernel."""
    return {"rhel": "kernel-devel", "suse": "kernel-default-devel"}.get(family, f"linux-headers-{kernel}")


def toolkit_metadata(family: str, entries: list[catalog_mod.Entry]) -> dict[str, bytes]:
    """NVIDIA's toolkit repository metadata for the catalog's toolkit packages, laid out as the real one
    (github.com/NVIDIA/libnvidia-container, branch gh-pages): a flat apt repository's uncompressed
    stable/deb/amd64/Packages; for rpm, stable/rpm/x86_64/repodata/repomd.xml naming a gzip'd primary.xml by its
    sha512."""
    toolkit = [e for e in entries if e.repo == "nvidia-container-toolkit"]
    if family == "debian":
        index = "".join(f"Package: {e.name}\nVersion: {e.version}\nArchitecture: {e.arch}\n"
                        f"Filename: ./{e.name}_{e.version}_{e.arch}.deb\n\n" for e in toolkit)
        return {f"{TOOLKIT_REPO}/deb/amd64/Packages": index.encode()}
    packages = "".join(
        f'<package type="rpm">\n  <name>{e.name}</name>\n  <arch>{e.arch}</arch>\n  <version epoch="0" '
        f'ver="{e.version.rsplit("-", 1)[0]}" rel="{e.version.rsplit("-", 1)[1]}"/>\n</package>\n' for e in toolkit)
    primary = gzip.compress(('<?xml version="1.0" encoding="UTF-8"?>\n<metadata xmlns="http://linux.duke.edu/'
                             f'metadata/common" packages="{len(toolkit)}">\n{packages}</metadata>\n').encode(),
                            mtime=0)
    digest = hashlib.sha512(primary).hexdigest()
    repomd = ('<?xml version="1.0" encoding="UTF-8"?>\n<repomd xmlns="http://linux.duke.edu/metadata/repo">\n'
              f'  <data type="filelists">\n    <location href="repodata/{"0" * 128}-filelists.xml.gz"/>\n  </data>\n'
              f'  <data type="primary">\n    <checksum type="sha512">{digest}</checksum>\n'
              f'    <location href="repodata/{digest}-primary.xml.gz"/>\n  </data>\n</repomd>\n')
    base = f"{TOOLKIT_REPO}/rpm/x86_64/repodata"
    return {f"{base}/repomd.xml": repomd.encode(), f"{base}/{digest}-primary.xml.gz": primary}

class _Watcher:
    def __init__(self) -> None:
        self.nodes: set[SimNode] = set()
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None

    def add(self, node: SimNode) -> None:
        with self.lock:
            self.nodes.add(node)
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, name="nodesim-reboot-watcher", daemon=True)
                self.thread.start()

    def remove(self, node: SimNode) -> None:
        with self.lock:
            self.nodes.discard(node)

    def _run(self) -> None:
        while True:
            with self.lock:
                nodes = list(self.nodes)
            for n in nodes:
                try:
                    n._poll_reboot()
                except Exception as err:  # noqa: BLE001 - a failing node must not stop the others' reboots,
                    n.faults.append(f"reboot failed: {err!r}")  # but its test hears of it (SimNode.faults)
                    print(f"nodesim: {n}: reboot failed: {err!r}", file=sys.stderr, flush=True)
            time.sleep(0.05)


_watcher = _Watcher()


def _stop_all_at_exit() -> None:
    """Nodes a caller forgot to stop are stopped (by PID) when the interpreter exits."""
    with _watcher.lock:
        nodes = list(_watcher.nodes)
    for n in nodes:
        try:
            n.stop()
        except Exception:  # noqa: BLE001 - best effort at exit; cleanup_stale() catches the rest next run
            pass


atexit.register(_stop_all_at_exit)


# ----------------------------------------------------------------------------------------------------------


SYSTEMCTL_QUERIES = ("is-", "show", "status", "list-", "cat")  # verbs that only read systemd's state


def changes_systemd(call: list[str]) -> bool:
    """A recorded call (argv, argv[0] the tool) that is systemctl changing something, not one of its queries."""
    return call[0] == "systemctl" and not (len(call) > 1 and call[1].startswith(SYSTEMCTL_QUERIES))


class SimNode:
    host = "127.0.0.1"
    user = "root"

    def __init__(self, profile: Profile, name: str | None = None, *, sshd_log_level: str = "INFO") -> None:
        """`sshd_log_level` DEBUG1 makes sshd log each channel it opens (benchmarks count round trips)."""
        profile.validate()
        self.sshd_log_level = sshd_log_level
        self.profile = profile
        self.name = name or profile.name
        self.dir: Path | None = None
        self.port: int = 0
        self._proc: subprocess.Popen | None = None
        self._held: dict[int, subprocess.Popen] = {}  # hold_gpu processes by PID
        self._lock = threading.RLock()
        self.reboots = 0
        self._port_hold: socket.socket | None = None  # the port, kept while sshd is down for a reboot
        self.faults: list[str] = []  # what went wrong on the host side (a reboot that failed): tests report it
        self.powered_on = False
        self.started_seconds = 0.0
        self._gpu_uuids: list[str] = []

    # ---- paths ------------------------------------------------------------------------------------------
    @property
    def root(self) -> Path:
        assert self.dir is not None, "node not started"
        return self.dir / "root"

    @property
    def key_path(self) -> str:
        assert self.dir is not None
        return str(self.dir / "id_ed25519")

    @property
    def known_hosts(self) -> str:
        assert self.dir is not None
        return str(self.dir / "known_hosts")

    @property
    def sshd_log(self) -> str:
        assert self.dir is not None
        return str(self.dir / "sshd.log")

    @property
    def sshd_pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def cli_args(self) -> list[str]:
        """The gpunode CLI options that reach this node."""
        return ["--host", f"root@{self.host}:{self.port}", "--identity", self.key_path,
                "--known-hosts", self.known_hosts]

    def _p(self, path: str, follow_last: bool = True) -> Path:
        """Host path of a path inside the node, resolving symlinks the way the chroot would (an absolute link
        target is relative to the node root), so nothing done through SimNode can touch the host's files."""
        root = self.root
        parts = [p for p in str(path).split("/") if p not in ("", ".")]
        cur: list[str] = []
        hops = 0
        while parts:
            part = parts.pop(0)
            if part == "..":
                if cur:
                    cur.pop()
                continue
            candidate = root.joinpath(*cur, part)
            if candidate.is_symlink() and (parts or follow_last):
                hops += 1
                if hops > 40:
                    raise OSError(f"too many levels of symbolic links in {path!r}")
                target = os.readlink(candidate)
                if target.startswith("/"):
                    cur = []
                parts = [p for p in target.split("/") if p not in ("", ".")] + parts
                continue
            cur.append(part)
        return root.joinpath(*cur)

    # ---- lifecycle --------------------------------------------------------------------------------------
    def start(self) -> SimNode:
        t0 = time.monotonic()
        rootfs.template()  # builds (once) or raises NodesimUnavailable
        self.dir = rootfs.new_dir("node")
        try:
            rootfs.clone_template(self.root)
            self._populate()
            self._keys()
            self._boot(initial=True)
            self._apply_post_boot_overrides()
            self._start_sshd()
            self.powered_on = True
        except BaseException:
            self.stop()
            raise
        _watcher.add(self)
        self.started_seconds = time.monotonic() - t0
        return self

    def stop(self) -> None:
        """Stop sshd and everything running in the node (by PID) and remove the node directory."""
        _watcher.remove(self)
        with self._lock:
            pid = self.sshd_pid
            for held in self._held.values():  # by PID: the hold_gpu processes this node started
                held.kill()
                held.wait()
            self._held.clear()
            if self.dir is not None and self.dir.exists():
                rootfs.destroy_node_dir(self.dir, pid)
            if self._proc is not None:
                try:
                    self._proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait()
                self._proc = None
            self._let_go_of_port()
            if self.port:
                _release_port(self.port)
            self.powered_on = False

    close = stop

    def __enter__(self) -> SimNode:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<SimNode {self.name} {self.host}:{self.port}>"

    # ---- building the root ------------------------------------------------------------------------------
    def _w(self, path: str, data: str | bytes, mode: int = 0o644) -> None:
        p = self._p(path, follow_last=False)
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.is_symlink() or p.exists():
            p.unlink()
        if isinstance(data, str):
            data = data.encode()
        p.write_bytes(data)
        os.chmod(p, mode)

    def _link_tool(self, path: str, shim: str) -> None:
        p = self._p(path, follow_last=False)
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.is_symlink() or p.exists():
            p.unlink()
        os.symlink(f"/opt/nodesim/shims/{shim}", p)

    def _populate(self) -> None:
        p, d = self.profile, self.profile.d
        r = self.root
        k = p.running_kernel
        for sub, mode in (("etc", 0o755), ("root", 0o700), ("tmp", 0o1777), ("var/tmp", 0o1777), ("var/log", 0o755),
                          ("run", 0o755), ("proc", 0o555), ("sys", 0o555), ("dev", 0o755), ("boot", 0o755),
                          ("home", 0o755), ("usr/src", 0o755), ("mnt", 0o755), ("opt", 0o755),
                          (STATE, 0o755), (f"{STATE}/units", 0o755), (f"{STATE}/pkgfiles", 0o755),
                          (f"{STATE}/pkgdata", 0o755), (f"{STATE}/urls", 0o755), (f"{STATE}/initramfs", 0o755),
                          (f"{STATE}/mok/enrolled", 0o755), (f"{STATE}/engines", 0o755),
                          ("etc/modprobe.d", 0o755), ("usr/lib/modprobe.d", 0o755), ("run/modprobe.d", 0o755),
                          ("sys/module", 0o755), ("sys/bus/pci/devices", 0o755), ("sys/bus/pci/drivers", 0o755),
                          ("proc/driver", 0o755), ("proc/sys/kernel/random", 0o755), ("var/lib/dpkg", 0o755)):
            q = r / sub
            q.mkdir(parents=True, exist_ok=True)
            os.chmod(q, mode)
        for name, major, minor in (("null", 1, 3), ("zero", 1, 5), ("random", 1, 8), ("urandom", 1, 9),
                                   ("tty", 5, 0), ("full", 1, 7)):
            os.mknod(r / "dev" / name, 0o666 | 0o020000, os.makedev(major, minor))
            os.chmod(r / "dev" / name, 0o666)
        os.symlink("/proc/self/fd", r / "dev/fd")

        shell = _root_shell()
        # the login shell (sshd runs it for every command) is the real dash
        sp = self._p(shell)
        if not (sp.exists() or sp.is_symlink()):
            sp.parent.mkdir(parents=True, exist_ok=True)
            os.symlink("/usr/bin/dash", sp)
        hostname = p.hostname or f"{d.hostname_prefix}-{self.name.split('-')[-1]}-{self.dir.name[-4:]}"  # type: ignore[union-attr]
        self._w("etc/passwd", f"root:x:0:0:root:/root:{shell}\ndaemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n"
                              "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
        self._w("etc/group", "root:x:0:\ndaemon:x:1:\nnogroup:x:65534:\ndocker:x:999:\n")
        self._w("etc/hostname", hostname + "\n")
        self._w("etc/hosts", f"127.0.0.1 localhost\n127.0.1.1 {hostname}\n")
        self._w("etc/machine-id", uuid.uuid4().hex + "\n")
        # As captured: some real os-release files have no final newline, and gpunode must cope.
        osr = (rootfs.DATA / "os-release" / d.os_release).read_bytes()
        self._w("usr/lib/os-release", osr)
        os.symlink("../usr/lib/os-release", r / "etc/os-release")
        self._w("etc/default/grub", 'GRUB_DEFAULT=0\nGRUB_TIMEOUT=5\nGRUB_CMDLINE_LINUX_DEFAULT="quiet splash"\n'
                                    'GRUB_CMDLINE_LINUX=""\n')
        pretty = next((ln.split("=", 1)[1].strip('"') for ln in osr.decode().splitlines()
                       if ln.startswith("PRETTY_NAME=")), d.key)

        # --- distribution files
        if d.family == "debian":
            self._w("etc/modprobe.d/blacklist.conf",
                    "# This file lists those modules which we don't want to be loaded by\n# alias expansion.\n"
                    "blacklist evbug\nblacklist usbmouse\nblacklist usbkbd\nblacklist eepro100\nblacklist de4x5\n"
                    "blacklist eth1394\nblacklist snd_intel8x0m\nblacklist snd_aw2\nblacklist prism54\n"
                    "blacklist bcm43xx\nblacklist garmin_gps\nblacklist asus_acpi\nblacklist snd_pcsp\n"
                    "blacklist pcspkr\nblacklist amd76x_edac\n")
            self._w("etc/modprobe.d/blacklist-framebuffer.conf",
                    "# Framebuffer drivers are generally buggy and poorly-supported, and cause\n"
                    "# suspend failures, kernel panics and general mayhem.\nblacklist aty128fb\nblacklist atyfb\n"
                    "blacklist radeonfb\nblacklist cirrusfb\nblacklist cyber2000fb\nblacklist nvidiafb\n"
                    "blacklist rivafb\nblacklist savagefb\nblacklist tdfxfb\nblacklist vesafb\nblacklist vga16fb\n")
            self._w("usr/lib/modprobe.d/aliases.conf", "alias net-pf-10 ipv6\nalias binfmt-0064 binfmt_aout\n")
            if d.key == "ubuntu-24.04":
                self._w("etc/apt/sources.list.d/ubuntu.sources",
                        "Types: deb\nURIs: http://archive.ubuntu.com/ubuntu/\nSuites: noble noble-updates noble-backports\n"
                        "Components: main restricted universe multiverse\n"
                        "Signed-By: /usr/share/keyrings/ubuntu-archive-keyring.gpg\n")
                self._w("etc/apt/sources.list", "# Ubuntu sources have moved to /etc/apt/sources.list.d/ubuntu.sources\n")
            elif d.key.startswith("ubuntu"):
                self._w("etc/apt/sources.list",
                        f"deb http://archive.ubuntu.com/ubuntu/ {d.hostname_prefix} main restricted universe multiverse\n"
                        f"deb http://archive.ubuntu.com/ubuntu/ {d.hostname_prefix}-updates main restricted universe multiverse\n"
                        f"deb http://security.ubuntu.com/ubuntu/ {d.hostname_prefix}-security main restricted universe multiverse\n")
            else:
                self._w("etc/apt/sources.list",
                        "deb http://deb.debian.org/debian bookworm main contrib non-free non-free-firmware\n"
                        "deb http://deb.debian.org/debian-security bookworm-security main contrib non-free non-free-firmware\n")
            (r / "etc/apt/sources.list.d").mkdir(parents=True, exist_ok=True)
            (r / "etc/apt/keyrings").mkdir(parents=True, exist_ok=True)
            (r / "usr/share/keyrings").mkdir(parents=True, exist_ok=True)
            (r / "etc/initramfs-tools").mkdir(parents=True, exist_ok=True)
            self._w(f"boot/initrd.img-{k}", "initramfs\n")
            self._w(f"boot/vmlinuz-{k}", "kernel\n")
            mirror = "http://archive.ubuntu.com/ubuntu " + d.hostname_prefix + " InRelease" if d.key.startswith("ubuntu") \
                else "http://deb.debian.org/debian bookworm InRelease"
        else:
            self._w("etc/modprobe.d/firewalld-sysctls.conf", "install nf_conntrack /usr/sbin/modprobe --ignore-install nf_conntrack $CMDLINE_OPTS && /usr/sbin/sysctl --quiet --pattern 'net[.]netfilter[.]nf_conntrack.*' --system\n")
            self._w("usr/lib/modprobe.d/dist-blacklist.conf",
                    "#\n# Listing a module here prevents the hotplug scripts from loading it.\n#\n"
                    "# framebuffer drivers\nblacklist aty128fb\nblacklist atyfb\nblacklist radeonfb\n"
                    "blacklist i810fb\nblacklist cirrusfb\nblacklist intelfb\nblacklist kyrofb\nblacklist i2c-matroxfb\n"
                    "blacklist hgafb\nblacklist nvidiafb\nblacklist rivafb\nblacklist savagefb\nblacklist sstfb\n"
                    "blacklist neofb\nblacklist tridentfb\nblacklist tdfxfb\nblacklist virgefb\nblacklist vga16fb\n"
                    "blacklist viafb\n")
            if d.family == "suse":  # SUSEConnect's module repositories (the catalog's "base")
                self._w("etc/zypp/repos.d/SLE-Module-Basesystem15-SP6-Pool.repo",
                        "[SLE-Module-Basesystem15-SP6-Pool]\nname=SLE-Module-Basesystem15-SP6-Pool\nenabled=1\n"
                        "autorefresh=0\nbaseurl=https://updates.suse.com/SUSE/Products/SLE-Module-Basesystem/15-SP6/"
                        "x86_64/product/\ntype=rpm-md\nkeeppackages=0\n")
            else:
                self._w("etc/yum.repos.d/rocky.repo",
                        "[baseos]\nname=Rocky Linux $releasever - BaseOS\n"
                        "mirrorlist=https://mirrors.rockylinux.org/mirrorlist?arch=$basearch&repo=BaseOS-$releasever$rltype\n"
                        "gpgcheck=1\nenabled=1\n\n[appstream]\nname=Rocky Linux $releasever - AppStream\n"
                        "mirrorlist=https://mirrors.rockylinux.org/mirrorlist?arch=$basearch&repo=AppStream-$releasever$rltype\n"
                        "gpgcheck=1\nenabled=1\n")
            (r / "etc/dracut.conf.d").mkdir(parents=True, exist_ok=True)
            # dracut's image: SUSE's dracut names it initrd-K (and links /boot/initrd to it), Red Hat's initramfs-K.img
            self._w(f"boot/initrd-{k}" if d.family == "suse" else f"boot/initramfs-{k}.img", "initramfs\n")
            self._w(f"boot/vmlinuz-{k}", "kernel\n")
            mirror = "none"
        self._w(f"boot/config-{k}", "CONFIG_MODULES=y\nCONFIG_MODULE_SIG=y\nCONFIG_MODULE_SIG_ALL=y\n")

        # --- kernel modules tree and headers
        mod = f"usr/lib/modules/{k}"
        self._w(f"{mod}/kernel/drivers/gpu/drm/nouveau/nouveau.ko", "")
        self._w(f"{mod}/modules.dep", "kernel/drivers/gpu/drm/nouveau/nouveau.ko: kernel/drivers/gpu/drm/drm.ko\n")
        if p.kernel_headers:
            src = headers_tree(d.family, k)
            (r / src.lstrip("/") / "include").mkdir(parents=True, exist_ok=True)
            os.symlink(src, r / mod / "build")

        # --- procfs / sysfs as plain files
        cmdline = p.cmdline or (f"BOOT_IMAGE=/vmlinuz-{k} root=UUID=3f2a9c1e-8d4b-4b7e-9a61-2c5d0e7f1a22 ro quiet splash"
                                if d.family == "debian" else
                                f"BOOT_IMAGE=/boot/vmlinuz-{k} root=UUID=9c1f0d2e-5b7a-4e3c-8f21-6a4d2b9e0c71 splash=silent "
                                "mitigations=auto quiet security=apparmor" if d.family == "suse" else
                                f"BOOT_IMAGE=(hd0,gpt2)/vmlinuz-{k} root=/dev/mapper/rl-root ro crashkernel=1G-4G:192M,"
                                "4G-64G:256M,64G-:512M resume=/dev/mapper/rl-swap rd.lvm.lv=rl/root rhgb quiet")
        self._w("proc/cmdline", cmdline + "\n")
        build = "#101-Ubuntu SMP Tue Nov 14 13:30:08 UTC 2023" if d.key.startswith("ubuntu") else (
            "#1 SMP PREEMPT_DYNAMIC Debian 6.1.76-1 (2024-02-01)" if d.family == "debian" else
            "#1 SMP PREEMPT_DYNAMIC Wed Nov 8 17:51:03 UTC 2023")
        self._w("proc/version", f"Linux version {k} (buildd@lcy02-amd64) ({d.gcc}) {build}\n")
        self._w("proc/mounts", "/dev/vda1 / ext4 rw,relatime 0 0\ntmpfs /run tmpfs rw,nosuid,nodev 0 0\n")
        self._w("proc/meminfo", "MemTotal:       2113531904 kB\nMemFree:        2051234816 kB\n"
                                "MemAvailable:   2089012224 kB\n")
        self._w("proc/cpuinfo", "".join(f"processor\t: {i}\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9654 96-Core Processor\n\n"
                                        for i in range(4)))
        self._w("proc/uptime", "1234.56 4567.89\n")
        self._w("proc/modules", "")
        self._w("proc/sys/kernel/random/boot_id", str(uuid.uuid4()) + "\n")
        if p.efi:
            self._w("sys/firmware/efi/fw_platform_size", "64\n")
            self._w(SB_EFIVAR, bytes([0x06, 0, 0, 0, 1 if p.secure_boot else 0]))

        # --- PCI devices
        gpu_lines, switch_lines = self._gpu_devices(p.gpus)
        for bus, ven, dev, cls, sv, sd in rootfs_other_pci():
            self._pci(bus, ven, dev, cls, sv, sd)

        # --- simulator state
        s = STATE
        gpu_model = p.gpus.model
        env = {
            "DISTRO": d.key, "FAMILY": d.family, "PKG": d.pkg, "INITRAMFS": d.initramfs, "LIBDIR": d.libdir,
            "GCC_VERSION": d.gcc, "CUDA_REPO": d.cuda_repo, "CODENAME": d.hostname_prefix,
            "NOUVEAU_BUSY": "1" if p.is_nouveau_busy else "0",
            "CONTAINERD_VERSION": d.containerd_version, "DOCKER_VERSION": d.docker_version,
            "KERNEL_BUILD": build, "NVLINK5": "1" if gpu_model and gpu_model.key == "b200" else "0",
            "PRETTY_NAME": pretty, "BASE_MIRROR": mirror,
            "DOCKER_GPUS_NEED_RUNTIME": "1" if p.docker_gpus_need_runtime else "0",
            "K8S": p.kubernetes or "",
        }
        self._w(f"{s}/profile.env", "".join(f"{key}={shlex.quote(val)}\n" for key, val in env.items()))
        self._w(f"{s}/kernel", k + "\n")
        self._w(f"{s}/kernels", k + "\n")
        self._w(f"{s}/gpus", "".join(line + "\n" for line in gpu_lines))
        self._w(f"{s}/switches", "".join(line + "\n" for line in switch_lines))
        base_mods = ["overlay", "br_netfilter", "ip_tables", "x_tables", "drm", "drm_kms_helper", "wmi", "video"]
        self._w(f"{s}/base-modules", "\n".join(base_mods) + "\n")
        entries = catalog_mod.catalog(p)
        self._w(f"{s}/catalog", "".join(e.line() + "\n" for e in entries))
        self._w(f"{s}/repos.tab", "".join(f"{rid}\t{marker}\n" for rid, marker in catalog_mod.REPOS.items()))
        # the package lists of a fresh image: its own sources' (Debian's default sources name non-free)
        self._w(f"{s}/apt-updated", "base debian-non-free\n" if p.d.key == "debian-12" else "base\n")
        self._pkgdata()
        self._urls()
        self._w(f"{s}/calls.log", "")

        # --- installed packages (applied directly: same effects as node_files/lib/pkg.sh)
        by_name: dict[str, catalog_mod.Entry] = {}
        for e in entries:
            if e.name not in by_name or e.repo == "base":
                by_name.setdefault(e.name, e)
        installed = catalog_mod.preinstalled(p)
        if p.toolkit_version:
            installed += ["nvidia-container-toolkit", "nvidia-container-toolkit-base", "libnvidia-container-tools",
                          "libnvidia-container1"]
        installed += list(p.extra_packages)
        db = []
        for name in installed:
            cands = [e for e in entries if e.name == name]
            if not cands:
                raise ValueError(f"profile installs {name!r}, which is not in the {d.key} catalog")
            e = cands[-1]
            if p.toolkit_version and name in ("nvidia-container-toolkit", "nvidia-container-toolkit-base",
                                              "libnvidia-container-tools", "libnvidia-container1"):
                e = next(x for x in cands if x.version == p.toolkit_version)
            self._apply_effects(e)
            db.append(f"{e.name}\t{e.version}\t{e.arch}\t0\t0")
        self._w(f"{s}/pkgdb", "".join(line + "\n" for line in db))
        if d.family == "debian":  # a real Debian-family node always has dpkg's status file (as pkg_sync_status)
            summaries = {e.name: e.summary or e.name for e in entries}
            self._w("var/lib/dpkg/status", "".join(
                f"Package: {n}\nStatus: install ok installed\nPriority: optional\nSection: misc\nMaintainer: nodesim\n"
                f"Architecture: {a}\nVersion: {v}\nDescription: {summaries.get(n, n)}\n\n"
                for n, v, a, _, _ in (line.split("\t") for line in sorted(db, key=str.encode))))
        if "containerd" in p.engines:
            self._w("etc/containerd/config.toml",
                    (rootfs.DATA / "containerd" / f"default-v{p.cc_version}.toml").read_bytes())
            self._link_tool("usr/local/bin/nerdctl", "engine")

        # --- base tools
        tools = {
            "usr/bin/uname": "uname", "usr/bin/hostname": "hostname", "usr/bin/systemctl": "systemctl",
            "usr/bin/sudo": "sudo", "usr/bin/curl": "curl", "usr/bin/wget": "curl", "usr/bin/gpg": "gpg",
            "usr/sbin/ldconfig": "ldconfig", "usr/bin/dmesg": "dmesg", "usr/bin/journalctl": "journalctl",
            "usr/sbin/reboot": "reboot", "usr/sbin/shutdown": "reboot", "usr/sbin/poweroff": "reboot",
            "usr/sbin/halt": "reboot",
        }
        for t in ("modprobe", "rmmod", "insmod", "lsmod", "depmod", "modinfo"):
            tools[f"usr/sbin/{t}"] = "kmod"
        if d.family == "debian":
            tools.update({"usr/bin/apt-get": "apt-get", "usr/bin/apt": "apt-get", "usr/bin/dpkg": "dpkg",
                          "usr/bin/dpkg-query": "dpkg", "usr/bin/apt-mark": "dpkg", "usr/bin/apt-cache": "dpkg",
                          "usr/sbin/update-initramfs": "update-initramfs"})
        elif d.family == "suse":
            tools.update({"usr/bin/zypper": "zypper", "usr/bin/rpm": "rpm", "usr/bin/dracut": "dracut"})
        else:
            tools.update({"usr/bin/dnf": "dnf", "usr/bin/yum": "dnf", "usr/bin/rpm": "rpm", "usr/bin/dracut": "dracut"})
        for path, shim in tools.items():
            self._link_tool(path, shim)

        if p.kubernetes:
            self._kubernetes(p.kubernetes)

        # --- initial initramfs contents and a preinstalled driver
        if p.preinstalled_driver:
            self._install_driver_state(p.preinstalled_driver, p.driver_flavor or default_flavor(p.preinstalled_driver))

    def _kubernetes(self, flavor: str) -> None:
        """A one-node cluster: kubectl, the kubelet's unit (kubelet, or k3s with its generated containerd config)."""
        s = STATE
        if flavor == "k3s":
            for path in ("usr/local/bin/k3s", "usr/local/bin/kubectl"):
                self._link_tool(path, "kube")
            self._w("etc/rancher/k3s/k3s.yaml", "apiVersion: v1\nkind: Config\nclusters: []\n", 0o600)
            self._w("etc/systemd/system/k3s.service", "[Unit]\nDescription=Lightweight Kubernetes\n\n[Service]\n"
                    "ExecStart=/usr/local/bin/k3s server\n\n[Install]\nWantedBy=multi-user.target\n")
            self._w(f"{s}/units/k3s.service", "ACTIVE=active\nENABLED=enabled\nDESC=Lightweight Kubernetes\n")
            # what k3s generates from its built-in template at start (containerd config version 2)
            self._w("var/lib/rancher/k3s/agent/etc/containerd/config.toml",
                    "version = 2\n\n[plugins.\"io.containerd.internal.v1.opt\"]\n  path = \"/var/lib/rancher/k3s/agent/containerd\"\n\n"
                    "[plugins.\"io.containerd.grpc.v1.cri\"]\n  stream_server_address = \"127.0.0.1\"\n  enable_selinux = false\n\n"
                    "[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  snapshotter = \"overlayfs\"\n\n"
                    "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n\n"
                    "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]\n  SystemdCgroup = true\n")
            return
        for path in ("usr/bin/kubectl", "usr/bin/kubelet"):
            self._link_tool(path, "kube")
        self._w("etc/kubernetes/admin.conf", "apiVersion: v1\nkind: Config\nclusters: []\n", 0o600)
        self._w("var/lib/kubelet/config.yaml", "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
                "cgroupDriver: systemd\n")
        self._w("lib/systemd/system/kubelet.service", "[Unit]\nDescription=kubelet: The Kubernetes Node Agent\n\n"
                "[Service]\nExecStart=/usr/bin/kubelet\n\n[Install]\nWantedBy=multi-user.target\n")
        self._w(f"{s}/units/kubelet.service", "ACTIVE=active\nENABLED=enabled\nDESC=kubelet: The Kubernetes Node Agent\n")

    def _gpu_devices(self, gpus) -> tuple[list[str], list[str]]:
        """The PCI devices of a GPU set, and its lines of the simulator's gpus / switches tables."""
        gpu_lines: list[str] = []
        self._gpu_uuids = []
        if gpus.model:
            m = gpus.model
            fabric = 0
            if m.key in ("h100", "b200"):
                fabric = 2 if (gpus.switch or m.key == "b200") else 1
            for i, bus in enumerate(gpus.bus_ids):
                u = "GPU-" + str(uuid.uuid4())
                self._gpu_uuids.append(u)
                self._pci(bus, 0x10DE, m.device_id, m.pci_class, m.subsys_vendor, m.subsys_device)
                self._w(f"sys/bus/pci/devices/{bus}/resource", gpu_resource(i))
                gpu_lines.append("\t".join(str(x) for x in (
                    i, bus, f"0x{m.device_id:04x}", m.name, m.memory_mib, m.power_cap_w,
                    m.idle_power_w[i % len(m.idle_power_w)], m.temp_c[i % len(m.temp_c)], m.perf, m.fan, m.ecc,
                    m.mig, m.used_mib, m.compute_cap, m.vbios, m.min_driver, 1 if m.open_only else 0, u,
                    f"0x{m.subsys_device:04X}{m.subsys_vendor:04X}", f"165{i:010d}", fabric)))
        switch_lines: list[str] = []
        if gpus.switch:
            for bus in gpus.switch_bus_ids:
                self._pci(bus, 0x10DE, gpus.switch.device_id, gpus.switch.pci_class, 0x10DE, 0x1623)
                switch_lines.append(f"{bus}\t0x{gpus.switch.device_id:04x}")
        return gpu_lines, switch_lines

    def attach_gpus(self, gpu: str) -> None:
        """Image builds: the image baked on a node without GPUs now sits in a machine with the GPU set `gpu`
        ("t4", "h100x8", ...): their PCI devices appear and nvidia-smi knows them. Call reboot() next, as the
        machine would boot the image (boot rules then load the baked driver)."""
        if self._gpu_uuids:
            raise ValueError("attach_gpus: this node already has GPUs")
        gpu_lines, switch_lines = self._gpu_devices(get_profile(self.profile.distro, gpu=gpu).gpus)
        self._w(f"{STATE}/gpus", "".join(line + "\n" for line in gpu_lines))
        self._w(f"{STATE}/switches", "".join(line + "\n" for line in switch_lines))

    def _pci(self, bus: str, ven: int, dev: int, cls: int, sv: int, sd: int) -> None:
        base = f"sys/bus/pci/devices/{bus}"
        for name, val in (("vendor", f"0x{ven:04x}"), ("device", f"0x{dev:04x}"), ("class", f"0x{cls:06x}"),
                          ("subsystem_vendor", f"0x{sv:04x}"), ("subsystem_device", f"0x{sd:04x}"),
                          ("numa_node", "0"), ("enable", "1")):
            self._w(f"{base}/{name}", val + "\n")

    def _pkgdata(self) -> None:
        d = self.profile.d
        s = f"{STATE}/pkgdata"
        data = rootfs.DATA
        self._w(f"{s}/containerd-default-v2.toml", (data / "containerd/default-v2.toml").read_bytes())
        self._w(f"{s}/containerd-default-v3.toml", (data / "containerd/default-v3.toml").read_bytes())
        self._w(f"{s}/containerd-docker.toml",
                "#   Copyright 2018-2022 Docker Inc.\n\n#   Licensed under the Apache License, Version 2.0 (the \"License\");\n"
                "#   you may not use this file except in compliance with the License.\n\n"
                "disabled_plugins = [\"cri\"]\n\n#root = \"/var/lib/containerd\"\n#state = \"/run/containerd\"\n")
        self._w(f"{s}/nvidia-container-runtime-config.toml",
                "#accept-nvidia-visible-devices-as-volume-mounts = false\n#accept-nvidia-visible-devices-envvar-when-unprivileged = true\n"
                "disable-require = false\nsupported-driver-capabilities = \"compat32,compute,display,graphics,ngx,utility,video\"\n\n"
                "[nvidia-container-cli]\nenvironment = []\nldconfig = \"@/sbin/ldconfig.real\"\nload-kmods = true\n\n"
                "[nvidia-container-runtime]\nlog-level = \"info\"\nmode = \"auto\"\nruntimes = [\"runc\", \"crun\"]\n")
        self._w(f"{s}/cuda-list",
                f"deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] "
                f"https://developer.download.nvidia.com/compute/cuda/repos/{d.cuda_repo}/x86_64/ /\n")
        self._w(f"{s}/cuda-keyring-gpg", "NODESIM-GPG-KEYRING\ncuda-archive-keyring\n")
        # Debian's /etc/nvidia/nvidia-modprobe.conf as the real-OS tier's nvidia VM has it
        self._w(f"{s}/nvidia-modprobe.conf", (REAL_FIXTURES / "debian-nvidia" / "etc-nvidia-nvidia-modprobe.conf").read_bytes())
        self._w(f"{s}/epel-repo",
                "[epel]\nname=Extra Packages for Enterprise Linux 9 - $basearch\n"
                "metalink=https://mirrors.fedoraproject.org/metalink?repo=epel-9&arch=$basearch\nenabled=1\ngpgcheck=1\n")

    def _urls(self) -> None:
        d = self.profile.d
        urls: dict[str, bytes] = {
            "https://nvidia.github.io/libnvidia-container/gpgkey":
                b"-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nmQINBF3gj4sBEADQ (nodesim)\n-----END PGP PUBLIC KEY BLOCK-----\n",
            "https://nvidia.github.io/libnvidia-container/stable/deb/nvidia-container-toolkit.list":
                b"deb https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH) /\n"
                b"#deb https://nvidia.github.io/libnvidia-container/experimental/deb/$(ARCH) /\n",
            "https://nvidia.github.io/libnvidia-container/stable/rpm/nvidia-container-toolkit.repo":
                b"[nvidia-container-toolkit]\nname=nvidia-container-toolkit\n"
                b"baseurl=https://nvidia.github.io/libnvidia-container/stable/rpm/$basearch\nrepo_gpgcheck=1\n"
                b"gpgcheck=0\nenabled=1\ngpgkey=https://nvidia.github.io/libnvidia-container/gpgkey\nsslverify=1\n"
                b"sslcacert=/etc/pki/tls/certs/ca-bundle.crt\n\n[nvidia-container-toolkit-experimental]\n"
                b"name=nvidia-container-toolkit-experimental\n"
                b"baseurl=https://nvidia.github.io/libnvidia-container/experimental/rpm/$basearch\nrepo_gpgcheck=1\n"
                b"gpgcheck=0\nenabled=0\ngpgkey=https://nvidia.github.io/libnvidia-container/gpgkey\n",
            "https://download.docker.com/linux/ubuntu/gpg": b"-----BEGIN PGP PUBLIC KEY BLOCK-----\n(docker, nodesim)\n-----END PGP PUBLIC KEY BLOCK-----\n",
            "https://download.docker.com/linux/debian/gpg": b"-----BEGIN PGP PUBLIC KEY BLOCK-----\n(docker, nodesim)\n-----END PGP PUBLIC KEY BLOCK-----\n",
            "https://download.docker.com/linux/centos/docker-ce.repo":
                b"[docker-ce-stable]\nname=Docker CE Stable - $basearch\n"
                b"baseurl=https://download.docker.com/linux/centos/$releasever/$basearch/stable\nenabled=1\ngpgcheck=1\n"
                b"gpgkey=https://download.docker.com/linux/centos/gpg\n",
            "https://download.docker.com/linux/rhel/docker-ce.repo":
                b"[docker-ce-stable]\nname=Docker CE Stable - $basearch\n"
                b"baseurl=https://download.docker.com/linux/rhel/$releasever/$basearch/stable\nenabled=1\ngpgcheck=1\n"
                b"gpgkey=https://download.docker.com/linux/rhel/gpg\n",
        }
        base = f"https://developer.download.nvidia.com/compute/cuda/repos/{d.cuda_repo}/x86_64"
        if d.family == "debian":
            pkg = self.root / STATE / "pkgdata"
            effects = (f"file:/etc/apt/sources.list.d/cuda-{d.cuda_repo}-x86_64.list:cuda-list;"
                       "file:/usr/share/keyrings/cuda-archive-keyring.gpg:cuda-keyring-gpg")
            deb = ("NODESIM-DEB\nPackage: cuda-keyring\nVersion: 1.1-1\nArchitecture: all\n"
                   f"Effects: {effects}\nDescription: GPG keyring for the CUDA repository\n"
                   f"Data: cuda-list={base64.b64encode((pkg / 'cuda-list').read_bytes()).decode()}\n"
                   f"Data: cuda-keyring-gpg={base64.b64encode((pkg / 'cuda-keyring-gpg').read_bytes()).decode()}\n")
            urls[f"{base}/cuda-keyring_1.1-1_all.deb"] = deb.encode()
        else:
            urls[f"{base}/cuda-{d.cuda_repo}.repo"] = (
                f"[cuda-{d.cuda_repo}-x86_64]\nname=cuda-{d.cuda_repo}-x86_64\nbaseurl={base}\nenabled=1\ngpgcheck=1\n"
                f"gpgkey={base}/D42D0685.pub\n").encode()
            if self.profile.cuda_repo:  # as `dnf config-manager --add-repo` / `zypper addrepo` of that file leave it
                where = (f"etc/zypp/repos.d/cuda-{d.cuda_repo}-x86_64.repo" if d.family == "suse"
                         else f"etc/yum.repos.d/cuda-{d.cuda_repo}.repo")
                self._w(where, urls[f"{base}/cuda-{d.cuda_repo}.repo"])
        urls.update(toolkit_metadata(d.family, catalog_mod.catalog(self.profile)))
        for url, host_file in self.profile.served_urls:
            urls[url] = Path(host_file).read_bytes()
        self._w(f"{STATE}/urls.tsv", "")
        for url, data in urls.items():
            self.serve_url(url, data)

    def _apply_effects(self, e: catalog_mod.Entry) -> None:
        if e.effects in ("", "-"):
            return
        rec: list[str] = []
        for eff in e.effects.split(";"):
            typ, _, rest = eff.partition(":")
            if typ == "tool":
                path, shim = rest.split(":", 1)
                self._link_tool(path, shim)
                rec.append(path)
            elif typ == "file":
                dest, src = rest.split(":", 1)
                if not self._p(dest).exists():
                    self._w(dest, (self.root / STATE / "pkgdata" / src).read_bytes())
                    rec.append(dest)
            elif typ == "unit":
                unit, desc, enable = rest.split(":", 2)
                active = "active" if enable == "enable" or (
                    unit in ("docker.service", "containerd.service")) else "inactive"
                enabled = "enabled" if enable == "enable" or unit in ("docker.service", "containerd.service") else "disabled"
                self._w(f"{STATE}/units/{unit}", f"ACTIVE={active}\nENABLED={enabled}\nDESC={desc}\n")
                rec.append("unit:" + unit)
            elif typ == "headers":
                pass  # the kernel tree was prepared from profile.kernel_headers
        if rec:
            self._w(f"{STATE}/pkgfiles/{e.name}", "".join(x + "\n" for x in rec))

    def _install_driver_state(self, version: str, flavor: str) -> None:
        """A driver installed earlier with the .run installer (not DKMS)."""
        k = self.profile.running_kernel
        d = self.profile.d
        self._link_tool("usr/bin/nvidia-smi", "nvidia-smi")
        for t in ("nvidia-persistenced", "nvidia-modprobe", "nvidia-debugdump"):
            self._link_tool(f"usr/bin/{t}", "nvidia-tool")
        self._w(f"{d.libdir.lstrip('/')}/libnvidia-ml.so.{version}", "")
        for m in ("nvidia", "nvidia-uvm", "nvidia-modeset", "nvidia-drm"):
            self._w(f"usr/lib/modules/{k}/kernel/drivers/video/{m}.ko", "")
        self._w(f"{STATE}/driver.env",
                f"DRIVER_VERSION='{version}'\nDRIVER_FLAVOR='{flavor}'\nDRIVER_METHOD='run'\nDRIVER_PKG=''\n"
                f"DRIVER_DKMS='0'\nDRIVER_KERNELS='{k}'\nDRIVER_SIGNKEY='none'\n")

    def _keys(self) -> None:
        assert self.dir is not None
        for key in ("ssh_host_ed25519_key", "id_ed25519"):
            subprocess.run([rootfs.SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", f"nodesim-{self.name}",
                            "-f", str(self.dir / key)], check=True, capture_output=True)
        shutil.copy(self.dir / "id_ed25519.pub", self.dir / "authorized_keys")

    def _chroot_sh(self, script: str, *, log_calls: bool = False, timeout: float = 60) -> subprocess.CompletedProcess:
        env = {"PATH": CHROOT_PATH, "HOME": "/root", "LC_ALL": "C"}
        if not log_calls:
            env["NODESIM_NOLOG"] = "1"
        return subprocess.run(["/usr/sbin/chroot", str(self.root), "/bin/sh", "-c", script], env=env,
                              capture_output=True, text=True, timeout=timeout, check=False)

    def _boot(self, initial: bool = False) -> None:
        script = ""
        if initial:
            # the initramfs on a fresh node was built from the modprobe.d it ships with
            script += (". /opt/nodesim/lib/common.sh; for k in $(cat \"$NS/kernels\"); do ns_snapshot_initramfs \"$k\"; done; ")
        script += ". /opt/nodesim/lib/boot.sh"
        # a loaded CI machine (the real-OS tier's QEMU and DKMS builds beside it) may take long: a boot cut short
        # leaves a node that never answers again
        res = self._chroot_sh(script, timeout=BOOT_TIMEOUT)
        if res.returncode != 0:
            raise RuntimeError(f"node boot failed ({res.returncode}): {res.stderr}{res.stdout}")

    def _apply_post_boot_overrides(self) -> None:
        p = self.profile
        if p.apt_locked:  # unattended-upgrades holds the package lock for the next two attempts
            self.set_apt_lock(2)
        if p.nouveau_loaded is True and not self.is_loaded("nouveau"):
            self.set_module_loaded("nouveau", True)
        elif p.nouveau_loaded is False and self.is_loaded("nouveau"):
            self.set_module_loaded("nouveau", False)

    # ---- sshd -------------------------------------------------------------------------------------------
    def _write_sshd_config(self) -> Path:
        assert self.dir is not None
        cfg = self.dir / "sshd_config"
        cfg.write_text(
            f"# node simulator sshd for {self.name}\n"
            f"Port {self.port}\nListenAddress 127.0.0.1\nAddressFamily inet\n"
            f"HostKey {self.dir / 'ssh_host_ed25519_key'}\nPidFile {self.dir / 'sshd.pid'}\n"
            f"AuthorizedKeysFile {self.dir / 'authorized_keys'}\nChrootDirectory {self.root}\n"
            "PermitRootLogin prohibit-password\nPubkeyAuthentication yes\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nAuthenticationMethods publickey\nUsePAM no\nStrictModes no\n"
            "Subsystem sftp internal-sftp\nX11Forwarding no\nAllowAgentForwarding no\n"
            f"AllowTcpForwarding {'local' if self.profile.tcp_forwarding else 'no'}\n"
            + ("PermitOpen 127.0.0.1:*\n" if self.profile.tcp_forwarding else "") +
            "PermitTunnel no\nPrintMotd no\nPrintLastLog no\nUseDNS no\nPermitUserEnvironment no\n"
            "MaxStartups 200:30:400\nMaxSessions 100\nLoginGraceTime 60\n"
            f"LogLevel {self.sshd_log_level}\n")
        return cfg

    def _start_sshd(self, *, same_port: bool = False) -> None:
        """Start the node's sshd. After a reboot (`same_port`) it must come back on the port its clients know:
        a busy port is tried again until SSHD_PORT_WAIT runs out, never swapped for another."""
        assert self.dir is not None
        if not os.path.isdir("/run/sshd"):
            # sshd's compiled-in privilege-separation directory (Debian creates it from the service unit)
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        last_err = ""
        give_up = time.monotonic() + SSHD_PORT_WAIT
        attempt = 0
        while attempt < 5 or (same_port and time.monotonic() < give_up):
            attempt += 1
            if not self.port:
                self.port = _free_port()
            cfg = self._write_sshd_config()
            log = self.dir / "sshd.log"
            log.write_text("")
            self._let_go_of_port()
            proc = subprocess.Popen([rootfs.SSHD, "-D", "-f", str(cfg), "-E", str(log)], stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
            deadline = time.monotonic() + 10
            ready = False
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    break
                # its words on success; "Bind to port N on 127.0.0.1 failed" names the port too
                if f"Server listening on {self.host} port {self.port}." in log.read_text(errors="replace"):
                    ready = True
                    break
                time.sleep(0.01)
            if ready:
                self._proc = proc
                (self.dir / "known_hosts").write_text(
                    f"[{self.host}]:{self.port} " + " ".join(
                        (self.dir / "ssh_host_ed25519_key.pub").read_text().split()[:2]) + "\n")
                return
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            last_err = log.read_text(errors="replace") + (proc.stderr.read().decode(errors="replace") if proc.stderr else "")
            if same_port:
                time.sleep(0.5)
                continue
            _release_port(self.port)
            self.port = 0
        raise RuntimeError(f"sshd did not start{f' on port {self.port}' if same_port else ''}: {last_err}")

    def _hold_port(self) -> None:
        """Keep the node's port while its sshd is down: a socket bound to it (not listening, so a client is
        refused as by a machine that is off) keeps any other bind and any outgoing connection's port choice
        off it. _start_sshd lets go of it just before sshd binds."""
        hold = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        hold.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the old boot's connections in TIME_WAIT
        try:
            hold.bind(("127.0.0.1", self.port))
        except OSError:
            hold.close()
            return
        self._port_hold = hold

    def _let_go_of_port(self) -> None:
        if self._port_hold is not None:
            self._port_hold.close()
            self._port_hold = None

    def _stop_sshd(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            pid = self._proc.pid
            rootfs.kill_pids(rootfs.descendants(pid))
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()

    # ---- reboots ----------------------------------------------------------------------------------------
    def _poll_reboot(self) -> None:
        if self.dir is None:
            return
        req = self.root / STATE / "reboot-request"
        if not req.exists():
            return
        try:
            words = req.read_text().split()
        except OSError:
            return
        if len(words) < 2:  # the shim's `echo "$action $$" >` has created the file but not written it yet
            return  # (read as "reboot", a poweroff came back up under load): the next poll reads it whole
        self._power_cycle(words[0])

    def _drop_sessions(self) -> None:
        pids = []
        if self.sshd_pid:
            pids += rootfs.descendants(self.sshd_pid)
        pids += rootfs.processes_rooted_in(self.root)
        rootfs.kill_pids(sorted(set(pids)))
        time.sleep(0.02)
        rootfs.kill_pids(rootfs.processes_rooted_in(self.root))

    def _power_cycle(self, action: str = "reboot") -> None:
        """Like a real machine: sshd stops answering and every session of the old boot dies, then the node
        boots (new boot id, modules decided again), then sshd answers again. No session can ever see both
        boots, so a client that reconnects and reads the new boot id keeps a working session."""
        with self._lock:
            if self.dir is None:
                return
            self._stop_sshd()
            self._hold_port()
            self._drop_sessions()
            try:
                (self.root / STATE / "reboot-request").unlink()
            except FileNotFoundError:
                pass
            if action == "poweroff":
                self.powered_on = False
                return
            self._boot()
            self.reboots += 1
            if self.profile.reboot_downtime > 0:
                time.sleep(self.profile.reboot_downtime)
            self._start_sshd(same_port=True)

    def reboot(self) -> None:
        """Reboot from the outside (like a BMC power cycle): sessions drop, the node boots."""
        self._power_cycle("reboot")

    def power_on(self) -> None:
        """Boot a node that was powered off (`poweroff`, `shutdown -h`)."""
        with self._lock:
            if self.powered_on:
                return
            self._boot()
            self.reboots += 1
            self._start_sshd(same_port=True)
            self.powered_on = True

    def wait_for_reboot(self, count: int = 1, timeout: float = 30) -> None:
        """Wait until the node has rebooted `count` times since it started."""
        deadline = time.monotonic() + timeout
        while self.reboots < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self} did not reboot {count} time(s) within {timeout}s")
            time.sleep(0.05)
        # the count moves before sshd is started again: the power cycle ends when it releases the lock
        if not self._lock.acquire(timeout=max(1.0, deadline - time.monotonic())):
            raise TimeoutError(f"{self} rebooted but sshd did not come back within {timeout}s")
        self._lock.release()

    # ---- file access ------------------------------------------------------------------------------------
    def dkms_fails_for(self, kernel: str) -> None:
        """DKMS's build of the driver fails for `kernel` from now on: its sources do not compile against that kernel
        (a kernel-API change; the make.log and messages are the real ones of tests/realos's nvidia-open image)."""
        fails = self.read("/var/lib/nodesim/dkms-fails") or ""
        self.write("/var/lib/nodesim/dkms-fails", fails + kernel + "\n")

    def read(self, path: str) -> str | None:
        p = self._p(path)
        try:
            return p.read_text(errors="replace")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def read_bytes(self, path: str) -> bytes | None:
        try:
            return self._p(path).read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def exists(self, path: str) -> bool:
        p = self._p(path, follow_last=False)
        return p.is_symlink() or self._p(path).exists()

    def write(self, path: str, text: str | bytes, mode: int = 0o644) -> None:
        self._w(path, text, mode)

    def remove(self, path: str) -> None:
        p = self._p(path, follow_last=False)
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.exists() or p.is_symlink():
            p.unlink()

    def listdir(self, path: str) -> list[str]:
        p = self._p(path)
        return sorted(os.listdir(p)) if p.is_dir() else []

    # ---- running commands -------------------------------------------------------------------------------
    def ssh(self, cmd: str, timeout: float = 60, stdin: bytes | str | None = None) -> tuple[int, str, str]:
        """Run `cmd` over SSH (paramiko, host key checked against .known_hosts); returns (rc, stdout, stderr).
        rc is -1 when the session was dropped (e.g. by a reboot)."""
        import paramiko

        client = paramiko.SSHClient()
        client.load_host_keys(self.known_hosts)
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        client.connect(self.host, port=self.port, username=self.user, key_filename=self.key_path,
                       look_for_keys=False, allow_agent=False, timeout=timeout, banner_timeout=timeout,
                       auth_timeout=timeout)
        try:
            chan = client.get_transport().open_session(timeout=timeout)  # type: ignore[union-attr]
            chan.settimeout(timeout)
            chan.exec_command(cmd)
            if stdin is not None:
                chan.sendall(stdin.encode() if isinstance(stdin, str) else stdin)
            chan.shutdown_write()
            out, err = bytearray(), bytearray()
            deadline = time.monotonic() + timeout
            while True:
                got = False
                if chan.recv_ready():
                    out += chan.recv(65536)
                    got = True
                if chan.recv_stderr_ready():
                    err += chan.recv_stderr(65536)
                    got = True
                # sshd may send exit-status before the last output: wait for EOF as well
                if chan.eof_received and chan.exit_status_ready() and not chan.recv_ready() \
                        and not chan.recv_stderr_ready():
                    break
                if chan.closed and not chan.recv_ready() and not chan.recv_stderr_ready():
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{cmd!r} timed out after {timeout}s")
                if not got:
                    time.sleep(0.002)
            rc = chan.recv_exit_status() if chan.exit_status_ready() else -1
            return rc, out.decode(errors="replace"), err.decode(errors="replace")
        finally:
            client.close()

    def run_local(self, cmd: str, log_calls: bool = False) -> tuple[int, str, str]:
        """Run `cmd` inside the node without SSH (chroot from the host); simulator bookkeeping by default does
        not appear in .calls()."""
        res = self._chroot_sh(cmd, log_calls=log_calls)
        return res.returncode, res.stdout, res.stderr

    # ---- state ------------------------------------------------------------------------------------------
    @property
    def boot_id(self) -> str:
        return (self.read("proc/sys/kernel/random/boot_id") or "").strip()

    @property
    def kernel(self) -> str:
        return (self.read(f"{STATE}/kernel") or "").strip()

    @property
    def gpu_uuids(self) -> list[str]:
        return list(self._gpu_uuids)

    def loaded_modules(self) -> list[str]:
        return [line.split(" ", 1)[0] for line in (self.read("proc/modules") or "").splitlines() if line.strip()]

    def is_loaded(self, module: str) -> bool:
        return module.replace("-", "_") in self.loaded_modules()

    def installed_packages(self) -> dict[str, str]:
        out = {}
        for line in (self.read(f"{STATE}/pkgdb") or "").splitlines():
            f = line.split("\t")
            if len(f) >= 2:
                out[f[0]] = f[1]
        return out

    def held_packages(self) -> list[str]:
        return sorted(line.split("\t")[0] for line in (self.read(f"{STATE}/pkgdb") or "").splitlines()
                      if len(line.split("\t")) >= 4 and line.split("\t")[3] == "1")

    def diagnose(self) -> str:
        """What a test prints when a client never got an answer: reboots, host-side faults, sshd, the pending
        reboot request, the last shim calls and sshd's log."""
        if self.dir is None:
            return f"{self}: not started"
        log = (self.dir / "sshd.log").read_text(errors="replace") if (self.dir / "sshd.log").exists() else ""
        return (f"{self}: port {self.port}, sshd pid {self.sshd_pid}, reboots {self.reboots}, faults {self.faults}, "
                f"reboot-request {self.read(f'{STATE}/reboot-request')!r}, last calls {self.calls()[-8:]}, "
                f"sshd.log tail {log[-1500:]!r}")

    def calls(self, tool: str | None = None) -> list[list[str]]:
        """Shim invocations, oldest first, each as argv (argv[0] = tool name); only `tool`'s when given."""
        raw = self.read(f"{STATE}/calls.log") or ""
        out = []
        for rec in raw.split("\x1e"):
            if not rec:
                continue
            argv = rec.split("\x1f")
            if tool is None or argv[0] == tool:
                out.append(argv)
        return out

    def clear_calls(self) -> None:
        self.write(f"{STATE}/calls.log", "")

    def unit(self, name: str) -> dict[str, str] | None:
        """{"active": ..., "enabled": ...} of a systemd unit, or None when it does not exist."""
        if "." not in name:
            name += ".service"
        text = self.read(f"{STATE}/units/{name}")
        if text is None:
            return None
        kv = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
        return {"active": kv.get("ACTIVE", ""), "enabled": kv.get("ENABLED", "")}

    def driver(self) -> dict[str, str] | None:
        """The installed NVIDIA driver (version, flavor, method, dkms, kernels, ...) or None."""
        text = self.read(f"{STATE}/driver.env")
        if not text:
            return None
        kv = {}
        for line in text.splitlines():
            k, _, v = line.partition("=")
            kv[k.replace("DRIVER_", "").lower()] = v.strip("'")
        return kv

    def initramfs_blacklist(self, kernel: str | None = None) -> list[str] | None:
        """What the last initramfs build for `kernel` recorded (None: never built)."""
        text = self.read(f"{STATE}/initramfs/{kernel or self.kernel}")
        return None if text is None else [ln for ln in text.splitlines() if ln]

    # ---- state setters ----------------------------------------------------------------------------------
    def _node_fn(self, script: str) -> None:
        res = self._chroot_sh(". /opt/nodesim/lib/common.sh; . /opt/nodesim/lib/units.sh; " + script)
        if res.returncode != 0:
            raise RuntimeError(f"simulator state change failed: {res.stderr}{res.stdout}")

    def set_module_loaded(self, module: str, loaded: bool = True) -> None:
        """Force a module in or out of /proc/modules (and the derived /sys, /proc/driver files)."""
        m = module.replace("-", "_")
        if loaded:
            if m.startswith("nvidia") and self.driver():
                drv = self.driver() or {}
                self.write(f"{STATE}/loaded.env", f"LOADED_VERSION={drv.get('version')}\nLOADED_FLAVOR={drv.get('flavor')}\n")
            self._node_fn(f'ns_write_modules {m} $(ns_loaded_list | grep -vx {m})')
        else:
            self._node_fn(f'ns_write_modules $(ns_loaded_list | grep -vx {m})')
            if m == "nvidia":
                self.remove(f"{STATE}/loaded.env")
                self._node_fn("ns_sync_derived")

    def set_secure_boot(self, enabled: bool) -> None:
        if not self.exists("sys/firmware/efi"):
            raise ValueError("this node boots with legacy BIOS (efi=False): no Secure Boot")
        self.write(SB_EFIVAR, bytes([0x06, 0, 0, 0, 1 if enabled else 0]))

    def enroll_mok(self, pubkey_path_in_node: str) -> None:
        """Enrol a machine-owner key (as if confirmed in MokManager)."""
        self._node_fn(f'mkdir -p "$NS/mok/enrolled"; cp {shlex.quote(pubkey_path_in_node)} "$NS/mok/enrolled/$(ns_key_id {shlex.quote(pubkey_path_in_node)})"')

    def remove_kernel_headers(self) -> None:
        k = self.kernel
        self.remove(f"usr/lib/modules/{k}/build")
        name = headers_package(self.profile.d.family, k)
        self._node_fn(f'. /opt/nodesim/lib/pkg.sh; pkg_db_del {shlex.quote(name)}')

    def add_kernel_headers(self) -> None:
        self.install_package(headers_package(self.profile.d.family, self.kernel))

    def install_package(self, spec: str) -> None:
        """Install a catalog package from the host side, bypassing repos and locks (setup for a test)."""
        self._node_fn(
            '. /opt/nodesim/lib/pkg.sh; '
            f'pkg_available $(awk -F"\\t" "{{print \\$1}}" "$NS/repos.tab") base local > "$NS/.avail"; '
            f'mode=$([ "$FAMILY" = debian ] && echo apt || echo dnf); '
            f'pkg_resolve $mode "$NS/.avail" {shlex.quote(spec)} | awk \'$1 == "INST" {{ print $2, $3 }} $1 == "CHANGE" {{ print $2, $4 }} $1 == "NOTFOUND" {{ print "!" $2 }}\' > "$NS/.todo"; '
            'if grep -q "^!" "$NS/.todo"; then cat "$NS/.todo" >&2; exit 1; fi; '
            'while read -r n v; do pkg_db_set "$n" "$v" "$(pkg_arch "$n" "$v")" 0; pkg_apply_effects "$n" "$v" || true; done < "$NS/.todo"; '
            'rm -f "$NS/.todo" "$NS/.avail"')

    def install_driver(self, version: str, flavor: str | None = None, load: bool = True) -> None:
        """State of a driver installed earlier with the .run installer; loaded now unless load=False."""
        self._install_driver_state(version, flavor or default_flavor(version))
        if load:
            self.set_module_loaded("nouveau", False)
            self._node_fn("ns_load_module nvidia")

    def set_kernel(self, version: str, headers: bool = True) -> None:
        """Install another kernel as its package would (modules tree, /boot image, then DKMS's kernel postinst hook:
        a registered DKMS driver is built for it only if `headers`) and make it the one the next boot runs."""
        self._w(f"boot/config-{version}", "CONFIG_MODULES=y\nCONFIG_MODULE_SIG=y\nCONFIG_MODULE_SIG_ALL=y\n")
        if headers:
            src = headers_tree(self.profile.d.family, version)
            self._p(src).joinpath("include").mkdir(parents=True, exist_ok=True)
            self._p(f"usr/lib/modules/{version}").mkdir(parents=True, exist_ok=True)
            link = self._p(f"usr/lib/modules/{version}/build")
            if not link.is_symlink():
                os.symlink(src, link)
        q = shlex.quote(version)
        self._node_fn(f'ns_kernel_add {q}; echo {q} > "$NS/next-kernel"; ns_kernel_postinst_dkms {q} >/dev/null')

    def add_kernel_log(self, text: str) -> None:
        """Append lines (e.g. Xid errors) to the node's kernel log, shown by dmesg / journalctl -k."""
        self._node_fn("while IFS= read -r l; do ns_kmsg \"$l\"; done <<'NODESIM_EOF'\n" + text.rstrip("\n") + "\nNODESIM_EOF")

    # health state nvidia-smi -q reports (node_files/lib/smiqtext.awk): key -> what it sets, per GPU
    HEALTH_KEYS = ("ecc", "ecc_pending", "vol_sram_cor", "vol_sram_unc", "vol_dram_cor", "vol_dram_unc",
                   "agg_sram_cor", "agg_sram_unc", "agg_dram_cor", "agg_dram_unc", "retired_sbe", "retired_dbe",
                   "retired_pending", "remap_cor", "remap_unc", "remap_pending", "remap_failed", "gsp",
                   "mig_pending", "mig_devices", "virt_mode", "host_vgpu_mode", "vgpu_product", "vgpu_license")

    def set_gpu_health(self, index: int | None = None, **values: object) -> None:
        """What `nvidia-smi -q` reports for GPU `index` (None: every GPU): `ecc`/`ecc_pending` ("Enabled",
        "Disabled"), error counters (`vol_dram_unc=2`, `agg_dram_unc`, `vol_sram_cor` ...), `retired_dbe`,
        `retired_pending` / `remap_pending` / `remap_failed` (True/False), `remap_unc`, `remap_cor`, `gsp`
        (True: firmware in use, False: N/A; default: in use with the open module only), and how the GPU is attached:
        `virt_mode` ("None", "Pass-Through", "VGPU", "Host VGPU"), `host_vgpu_mode`, and for the vGPU (GRID)
        driver `vgpu_product` / `vgpu_license` ("Licensed (Expiry: ...)", "Unlicensed (Restricted)"), which add
        the "vGPU Software Licensed Product" block. None removes a value."""
        unknown = set(values) - set(self.HEALTH_KEYS)
        if unknown:
            raise TypeError(f"unknown GPU health key(s): {', '.join(sorted(unknown))}")
        indexes = range(len(self.gpu_uuids)) if index is None else (index,)
        rows = {(r[0], r[1]): r[2] for r in (ln.split("\t") for ln in (self.read(f"{STATE}/gpuhealth") or "")
                                           .splitlines()) if len(r) == 3}
        for i in indexes:
            for key, value in values.items():
                if value is None:
                    rows.pop((str(i), key), None)
                    continue
                if isinstance(value, bool):
                    value = ("on" if value else "off") if key == "gsp" else ("Yes" if value else "No")
                if isinstance(value, (tuple, list)):
                    value = ",".join(value)
                rows[(str(i), key)] = str(value)
        self.write(f"{STATE}/gpuhealth", "".join(f"{i}\t{k}\t{v}\n" for (i, k), v in sorted(rows.items())))

    def passthrough_paths(self, index: int = 0) -> tuple[str, ...]:
        """Every path pass_through_gpu changes (for a caller that restores them)."""
        bus = self.profile.gpus.bus_ids[index]
        return (f"sys/bus/pci/devices/{bus}/driver", f"sys/bus/pci/devices/{bus}/iommu_group",
                f"sys/bus/pci/devices/{_function(bus, 1)}", "sys/bus/pci/drivers/vfio-pci", "sys/kernel/iommu_groups",
                "sys/bus/pci/drivers/snd_hda_intel", "proc/interrupts", "sys/class/iommu")

    def pass_through_gpu(self, index: int = 0, *, group: int = 14, audio_driver: str | None = "vfio-pci",
                         iommu: bool = True, remapped: bool = True) -> None:
        """This node as a KVM host handing GPU `index` to a VM, as sysfs shows it: the GPU bound to vfio-pci, in
        IOMMU group `group` with its HDMI audio function (.1, class 0x040300) bound to `audio_driver` (None: no
        driver); with `iommu` False the kernel made no IOMMU groups (the IOMMU is off); /proc/interrupts has
        remapped (IR-) interrupt chips when `remapped`, and an Intel IOMMU unit whose ecap says so. The simulated
        nvidia-smi still answers for the GPU (the simulator does not model the driver losing it)."""
        bus = self.profile.gpus.bus_ids[index]
        audio = _function(bus, 1)
        dev = f"sys/bus/pci/devices/{bus}"
        self._w(f"sys/bus/pci/devices/{audio}/class", "0x040300\n")
        (self.root / "sys/bus/pci/drivers/vfio-pci").mkdir(parents=True, exist_ok=True)
        for name in {"vfio-pci", audio_driver} - {None}:
            (self.root / "sys/bus/pci/drivers" / str(name)).mkdir(parents=True, exist_ok=True)
        self.remove(f"{dev}/driver")
        os.symlink("../../drivers/vfio-pci", self.root / dev / "driver")
        self.remove(f"sys/bus/pci/devices/{audio}/driver")
        if audio_driver:
            os.symlink(f"../../drivers/{audio_driver}", self.root / "sys/bus/pci/devices" / audio / "driver")
        self.remove("sys/kernel/iommu_groups")
        self.remove(f"{dev}/iommu_group")
        if iommu:
            members = self.root / "sys/kernel/iommu_groups" / str(group) / "devices"
            members.mkdir(parents=True)
            for other in range(group):  # the rest of the machine's groups
                (self.root / "sys/kernel/iommu_groups" / str(other) / "devices").mkdir(parents=True)
            for function in (bus, audio):
                os.symlink(f"../../../../bus/pci/devices/{function}", members / function)
                self.remove(f"sys/bus/pci/devices/{function}/iommu_group")
                os.symlink(f"../../../../kernel/iommu_groups/{group}",
                           self.root / "sys/bus/pci/devices" / function / "iommu_group")
        chip = "IR-PCI-MSI" if remapped else "PCI-MSI"
        self._w("proc/interrupts", "           CPU0       CPU1\n"
                f"  24:          0         12  {chip} 524288-edge      vfio-msix[0]({bus})\n"
                f"  25:          0          3  {chip} 2623488-edge      snd_hda_intel:card0\n")
        self.remove("sys/class/iommu")
        if iommu:  # DMAR unit: ecap bit 3 is interrupt remapping
            self._w("sys/class/iommu/dmar0/intel-iommu/ecap", ("f020df" if remapped else "f020d7") + "\n")

    def set_mig(self, index: int, enabled: bool, devices: tuple[str, ...] = (), pending: bool | None = None) -> None:
        """MIG mode of GPU `index` (nvidia-smi's mig.mode.current, -q, and the MIG devices `-L` lists, e.g.
        ("3g.40gb", "1g.10gb")); `pending` differs from the current mode until a GPU reset."""
        lines = [ln.split("\t") for ln in (self.read(f"{STATE}/gpus") or "").splitlines()]
        if lines[index][11] == "N/A":
            raise ValueError(f"GPU {index} ({lines[index][3]}) has no MIG mode")
        lines[index][11] = "Enabled" if enabled else "Disabled"
        self.write(f"{STATE}/gpus", "".join("\t".join(ln) + "\n" for ln in lines))
        mode = None if pending is None else ("Enabled" if pending else "Disabled")
        self.set_gpu_health(index, mig_devices=tuple(devices) if enabled and devices else None, mig_pending=mode)

    def offer_package(self, name: str, version: str, deps: str = "-", effects: str = "-", repo: str = "base") -> None:
        """Add a package version to the node's catalog (what `apt-get -s dist-upgrade` / `dnf check-update` and
        installs can see): a pending upgrade when `name` is installed at an older version."""
        arch = "amd64" if self.profile.d.family == "debian" else "x86_64"
        with open(self.root / STATE / "catalog", "a") as f:
            f.write("\t".join((name, version, repo, deps or "-", effects or "-", arch, name)) + "\n")

    def offer_kernel_upgrade(self, version: str, headers: bool = True) -> str:
        """A newer kernel in the distribution's repository, pulled in by the installed kernel metapackage
        (`linux-generic` / `linux-image-amd64`, dnf: `kernel`): returns the kernel package that upgrade installs.
        With headers=False the metapackage does not bring the new headers (e.g. only linux-image-* is tracked; apt
        can still install linux-headers-VERSION by name; dnf: kernel-devel is not offered)."""
        if self.profile.d.family == "rhel":
            rel = version.rsplit(".", 1)[0]  # 5.14.0-427.13.1.el9_4.x86_64 -> version-release
            self.offer_package("kernel", rel)
            self.offer_package("kernel-core", rel, effects=f"kernel:{version}")
            if headers:
                self.offer_package("kernel-devel", rel, effects=f"headers:{version}")
            return "kernel"
        pkgver = version.rsplit("-", 1)[0] + ".1"

        def metaver(kernel: str) -> str:  # 5.15.0-92-generic -> 5.15.0.92.1
            return kernel.rsplit("-", 1)[0].replace("-", ".") + ".1"
        meta = "linux-generic" if self.profile.distro.startswith("ubuntu") else "linux-image-amd64"
        current = self.kernel
        self.offer_package(meta, metaver(current), deps=f"linux-image-{current}")
        self.install_package(f"{meta}={metaver(current)}")
        self.offer_package(f"linux-image-{version}", pkgver, effects=f"kernel:{version}")
        deps = f"linux-image-{version}"
        self.offer_package(f"linux-headers-{version}", pkgver, effects=f"headers:{version}")  # in the archive anyway
        if headers:
            deps += f",linux-headers-{version}"
        self.offer_package(meta, metaver(version), deps=deps)
        return f"linux-image-{version}"

    def set_disk_free(self, kb: int | None) -> None:
        """How much room `df` reports on every filesystem of the node (None: the real figures). makeself's own
        check before unpacking reads it too, so a .run then fails as on a full /var/tmp."""
        if kb is None:
            self.remove(f"{STATE}/df.avail_kb")
            self.remove("bin/df")
            os.symlink("busybox", self._p("bin/df", follow_last=False))
            return
        self.write(f"{STATE}/df.avail_kb", f"{kb}\n")
        self._link_tool("bin/df", "df")

    def set_apt_lock(self, attempts: int) -> None:
        """The next `attempts` apt-get/dnf runs fail on the package lock (as with unattended-upgrades)."""
        if attempts > 0:
            self.write(f"{STATE}/apt.lock", f"{attempts}\n")
        else:
            self.remove(f"{STATE}/apt.lock")

    def set_unit(self, name: str, active: str | None = None, enabled: str | None = None,
                 description: str | None = None) -> None:
        if "." not in name:
            name += ".service"
        cur = self.unit(name) or {"active": "inactive", "enabled": "disabled"}
        desc = description or name
        self.write(f"{STATE}/units/{name}", f"ACTIVE={active or cur['active']}\nENABLED={enabled or cur['enabled']}\n"
                                            f"DESC={desc}\n")
        self._node_fn(f"ns_daemon_sync {shlex.quote(name)}")  # a GPU daemon's /proc entry follows its state

    def hold_gpu(self, name: str = "python3", device: str = "/dev/nvidia0", compute: bool = True,
                 cgroup: str = "/user.slice/user-1000.slice/session-3.scope") -> int:
        """A process outside any GPU service that keeps `device` open (a user's CUDA job): a real `sleep` inside
        the chroot with the file open, and its /proc/PID entry (comm, cgroup, fd/3 and fd/4 -> device and
        /dev/nvidiactl) as gpunode reads it; with `compute` NVML lists it (`nvidia-smi --query-compute-apps`).
        It holds the nvidia module until release_gpu(pid), a reboot, or stop(). Returns the PID."""
        proc = subprocess.Popen(["/usr/sbin/chroot", str(self.root), "/bin/sh", "-c",
                                 f"exec 3<{shlex.quote(device)} 4</dev/nvidiactl; exec sleep 3600"],
                                env={"PATH": CHROOT_PATH}, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        self._held[proc.pid] = proc
        exe = f"/usr/bin/{name}"
        self._node_fn(f"ns_proc_create {proc.pid} {shlex.quote(name)} {shlex.quote(exe)} {shlex.quote(cgroup)} "
                      f"{shlex.quote(device)} /dev/nvidiactl; echo {proc.pid} >> \"$NS/held.pids\""
                      + (f"; echo {proc.pid} {shlex.quote(exe)} >> \"$NS/compute-apps\"" if compute else ""))
        return proc.pid

    def set_drm_clients(self, count: int) -> None:
        """DRM clients of nvidia_drm (a display server, the framebuffer console): while there are any it cannot
        unload, and /sys/module/nvidia_drm/refcnt counts them. They come back at every boot."""
        self.write(f"{STATE}/drm-clients", f"{count}\n")
        self._node_fn("ns_sync_derived")

    def release_gpu(self, pid: int) -> None:
        """End a hold_gpu process (by its PID) and remove its /proc entry."""
        proc = self._held.pop(pid)
        proc.kill()
        proc.wait()
        self._node_fn(f"rm -rf /proc/{pid}")

    def serve_url(self, url: str, data: bytes | str | os.PathLike[str]) -> None:
        """Make `url` downloadable on the node (curl/wget/dnf config-manager): bytes/str are the content, a
        Path (os.PathLike) is a host file whose content is served."""
        if isinstance(data, os.PathLike):
            data = Path(data).read_bytes()
        if isinstance(data, str):
            data = data.encode()
        index = self.root / STATE / "urls.tsv"
        lines = [ln for ln in index.read_text().splitlines() if ln and ln.split("\t", 1)[0] != url]
        fname = f"u{len(lines):04d}-{abs(hash(url)) % 10**8}"
        (self.root / STATE / "urls" / fname).write_bytes(data)
        lines.append(f"{url}\t{fname}")
        index.write_text("\n".join(lines) + "\n")


def _function(bus: str, function: int) -> str:
    """Another function of the PCI device at `bus` (0000:00:1e.0 -> 0000:00:1e.1)."""
    return f"{bus.rpartition('.')[0]}.{function}"


def gpu_resource(index: int, bar1: str = "") -> str:
    """A GPU's sysfs `resource` file as the kernel writes it (start end flags per BAR, then the ROM): BAR0 16 MiB
    of registers, BAR1 a 64-bit prefetchable 16 GiB memory window (`bar1` replaces its line), BAR3 32 MiB, I/O."""
    zero = "0x0000000000000000 0x0000000000000000 0x0000000000000000\n"
    base = 0xC000000000 + index * 0x800000000
    bar1 = bar1 or f"0x{base:016x} 0x{base + (16 << 30) - 1:016x} 0x000000000014220c"
    return (f"0x00000000{0xd9 - index:02x}000000 0x00000000{0xd9 - index:02x}ffffff 0x0000000000040200\n{bar1}\n{zero}"
            f"0x{base + (16 << 30):016x} 0x{base + (16 << 30) + (32 << 20) - 1:016x} 0x000000000014220c\n{zero}"
            f"0x000000000000{0xe0 + index:02x}00 0x000000000000{0xe0 + index:02x}7f 0x0000000000040101\n" + zero)


def rootfs_other_pci():
    from tests.nodesim.profiles import OTHER_PCI
    return OTHER_PCI
