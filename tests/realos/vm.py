"""The real-OS tier's Debian 12 VM: image cache, QEMU lifecycle, ssh.

The image is built by build_image.sh into ~/.cache/gpunode-realos/[VARIANT-]image-<hash of what builds it>
(GPUNODE_REALOS_CACHE overrides the root) and never written afterwards: each VM boots a qcow2 overlay of it.
QEMU runs at nice 10 with KVM when the CPU exposes VMX/SVM and /dev/kvm opens, TCG otherwise
(GPUNODE_REALOS_ACCEL=tcg|kvm forces it). The guest's network is slirp with restrict=on: the only ways in and
out are the ssh forward on 127.0.0.1 and the guestfwd of 10.0.2.100:80 to the MirrorServer.

Keep a VM up to look around:  sudo .venv/bin/python -m tests.realos.vm up [nvidia|nvidia-open]   (prints the ssh command)
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.realos import toolkit_repo
from tests.realos.mirror import MirrorServer

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build_image.sh"
HOST_ALIAS = "realos"
TOOLS = ("qemu-system-x86_64", "qemu-img", "mmdebstrap", "mke2fs", "sfdisk", "ssh", "ssh-keygen", "zstd", "unshare")


def missing_requirements() -> str | None:
    """Why this machine cannot run the tier, or None."""
    if os.geteuid() != 0:
        return "the real-OS tier needs root (mmdebstrap --mode=root)"
    absent = [t for t in TOOLS if shutil.which(t) is None and not Path("/usr/sbin", t).exists()]
    if absent:
        return ("missing " + ", ".join(absent) + ": apt-get install qemu-system-x86 qemu-utils mmdebstrap "
                "e2fsprogs fdisk openssh-client zstd util-linux")
    return None


def cache_root() -> Path:
    return Path(os.environ.get("GPUNODE_REALOS_CACHE") or Path.home() / ".cache" / "gpunode-realos")


# What builds each variant beyond the shared inputs (build_image.sh and the rest of guest/), and the variant a
# derived one starts from: each image's key covers only what builds it, so a change to one variant's script
# rebuilds that image and those derived from it, never the others.
VARIANT_FILES = {
    "base": (),
    "nvidia": ("guest/usr/local/lib/realos/nvidia-packages.sh",),
    "nvidia-open": ("guest/usr/local/lib/realos/nvidia-open.sh",),
}
PARENT = {"nvidia-open": "nvidia"}
KEEP_OLD_IMAGES_DAYS = 3  # other worktrees may still boot an older key's image: only stale ones are removed


def image_key(variant: str = "base") -> str:
    if variant not in VARIANT_FILES:
        raise ValueError(f"unknown image variant {variant!r}: one of {', '.join(VARIANT_FILES)}")
    own = {path for files in VARIANT_FILES.values() for path in files}
    h = hashlib.sha256()
    if variant in PARENT:
        h.update(b"parent\0" + image_key(PARENT[variant]).encode() + b"\0")
    else:
        shared = [p for p in sorted(q for q in (HERE / "guest").rglob("*") if q.is_file())
                  if str(p.relative_to(HERE)) not in own]
        for path in [BUILD_SCRIPT, *shared]:
            h.update(str(path.relative_to(HERE)).encode() + b"\0" + path.read_bytes() + b"\0")
    for name in VARIANT_FILES[variant]:
        h.update(name.encode() + b"\0" + (HERE / name).read_bytes() + b"\0")
    return h.hexdigest()[:16]


def image_dir_prefix(variant: str) -> str:
    return "image-" if variant == "base" else f"{variant}-image-"


def ensure_image(log=print, variant: str = "base") -> Path:
    """The cached image directory, built first when missing (one builder at a time, others wait).
    "nvidia" also carries Debian's packaged NVIDIA driver; "nvidia-open" is derived from the nvidia image's tree
    with the open kernel modules instead (build_image.sh)."""
    parent = ensure_image(log, PARENT[variant]) if variant in PARENT else None
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    prefix = image_dir_prefix(variant)
    image = root / f"{prefix}{image_key(variant)}"
    if (image / "disk.raw").is_file():  # cached: no wait for another variant's build holding the lock
        return image
    with open(root / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (image / "disk.raw").is_file():
            return image
        tmp = root / f"building-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        started = time.monotonic()
        build_log = root / f"build-{variant}.log"
        argv = ["bash", str(BUILD_SCRIPT), str(tmp), variant, *([str(parent)] if parent else [])]
        with open(build_log, "w") as out:
            rc = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, timeout=3600).returncode
        if rc != 0:
            tail = build_log.read_text(errors="replace")[-4000:]
            raise RuntimeError(f"build_image.sh failed (exit {rc}); end of {build_log}:\n{tail}")
        stale = time.time() - KEEP_OLD_IMAGES_DAYS * 86400
        for old in root.glob(f"{prefix}*"):
            if old.name.removeprefix(prefix).isalnum() and old.stat().st_mtime < stale:
                shutil.rmtree(old, ignore_errors=True)
        shutil.copy(build_log, tmp / "build.log")
        tmp.rename(image)
        log(f"image built in {time.monotonic() - started:.0f} s: {image}")
        return image


def accel() -> str:
    forced = os.environ.get("GPUNODE_REALOS_ACCEL")
    if forced:
        return forced
    flags = Path("/proc/cpuinfo").read_text().split()
    if ("vmx" in flags or "svm" in flags) and os.access("/dev/kvm", os.R_OK | os.W_OK):
        return "kvm"
    return "tcg"  # a nested /dev/kvm without VMX hangs a Debian kernel in its decompressor


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Result:
    rc: int
    out: str
    err: str


def ssh(config: Path, command: str, timeout: float = 600, check: bool = False) -> Result:
    """`command` on the tier's node (a VM, or the chroot node) through real ssh with `config`; with `check`, a
    non-zero exit fails the test with its output."""
    done = subprocess.run(["ssh", "-F", str(config), "-o", "BatchMode=yes", HOST_ALIAS, command],
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    result = Result(done.returncode, done.stdout, done.stderr)
    if check and result.rc != 0:
        raise AssertionError(f"node command failed ({result.rc}): {command}\n{result.out}\n{result.err}")
    return result


@dataclass
class Vm:
    image: Path
    workdir: Path
    mirror: MirrorServer
    ssh_port: int = 0
    proc: subprocess.Popen | None = None
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def ssh_config(self) -> Path:
        return self.workdir / "ssh_config"

    @property
    def serial_log(self) -> Path:
        return self.workdir / "serial.log"

    def start(self) -> Vm:
        self.workdir.mkdir(parents=True, exist_ok=True)
        overlay = self.workdir / "overlay.qcow2"
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(self.image / "disk.raw"), "-F", "raw",
                        str(overlay)], check=True)
        key = self.workdir / "id_ed25519"
        shutil.copy(self.image / "id_ed25519", key)
        key.chmod(0o600)
        self.ssh_port = free_port()
        host_key = (self.image / "ssh_host_ed25519_key.pub").read_text().split()[:2]
        (self.workdir / "known_hosts").write_text(f"[127.0.0.1]:{self.ssh_port} {' '.join(host_key)}\n")
        self.ssh_config.write_text(
            f"Host {HOST_ALIAS}\n  HostName 127.0.0.1\n  Port {self.ssh_port}\n  User root\n"
            f"  IdentityFile {key}\n  IdentitiesOnly yes\n  UserKnownHostsFile {self.workdir / 'known_hosts'}\n"
            "  StrictHostKeyChecking yes\n  ConnectTimeout 10\n")
        relay = f"{sys.executable} {HERE / 'connect.py'} {self.mirror.port}"
        netdev = (f"user,id=n0,restrict=on,hostfwd=tcp:127.0.0.1:{self.ssh_port}-:22,"
                  f"guestfwd=tcp:10.0.2.100:80-cmd:{relay}")
        argv = ["nice", "-n", "10", "qemu-system-x86_64", "-accel", accel(), "-m", "2048", "-smp", "1",
                "-display", "none", "-serial", f"file:{self.serial_log}", "-monitor", "none",
                "-drive", f"file={overlay},format=qcow2,if=virtio,cache=unsafe",
                "-netdev", netdev, "-device", "virtio-net-pci,netdev=n0",
                "-device", "edu"]  # the driverless PCI device the guest presents as a Tesla T4
        started = time.monotonic()
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=open(self.workdir / "qemu.stderr", "w"), start_new_session=True)
        self.wait_ssh(timeout=600)
        self.timings["boot to ssh"] = time.monotonic() - started
        self.wait_booted()
        self.timings["boot finished (systemd)"] = time.monotonic() - started
        return self

    def wait_booted(self, timeout: float = 600) -> str:
        """Until systemd has finished starting the boot's units (sshd comes up before dockerd has, and
        dockerd's first start writes /etc/docker/key.json): "running", or "degraded" when a unit failed."""
        return self.ssh("systemctl is-system-running --wait", timeout=timeout).out.strip()

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)  # `nice` exec'd QEMU: the PID is QEMU's
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        self.proc = None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def ssh(self, command: str, timeout: float = 600, check: bool = False) -> Result:
        return ssh(self.ssh_config, command, timeout, check)

    def wait_ssh(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"QEMU exited; see {self.serial_log} and {self.workdir / 'qemu.stderr'}")
            try:
                if self.ssh("true", timeout=30).rc == 0:
                    return
            except subprocess.TimeoutExpired:
                pass
            time.sleep(2)
        raise TimeoutError(f"no ssh from the guest within {timeout:.0f} s; see {self.serial_log}")

    def boot_id(self) -> str:
        return self.ssh("cat /proc/sys/kernel/random/boot_id", check=True).out.strip()


def main(argv: list[str]) -> int:
    """`python -m tests.realos.vm up`: build/boot a VM and keep it up until Ctrl-C."""
    if argv[:1] != ["up"] or len(argv) > 2 or argv[1:2] not in ([], *([v] for v in VARIANT_FILES)):
        print(__doc__)
        return 2
    why = missing_requirements()
    if why:
        print(why)
        return 2
    import tempfile

    image = ensure_image(variant=argv[1] if argv[1:] else "base")
    work = Path(tempfile.mkdtemp(prefix="gpunode-realos-vm."))
    repo = work / "repo"
    toolkit_repo.build(repo)  # the stand-in toolkit, as the tests serve it
    mirror = MirrorServer(repo, cache_root() / "apt").start()
    vm = Vm(image, work / "vm", mirror).start()
    print(f"up in {vm.timings['boot to ssh']:.0f} s; QEMU pid {vm.proc.pid if vm.proc else '?'}\n"
          f"  ssh -F {vm.ssh_config} {HOST_ALIAS}\n  gpunode plan --host {HOST_ALIAS} --ssh-config {vm.ssh_config}\n"
          f"  serial console log: {vm.serial_log}\nCtrl-C (or SIGTERM to this process) stops it.")

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGINT, interrupted)  # also when started in the background, where SIGINT is ignored
    try:
        while vm.alive():
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        vm.stop()
        mirror.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
