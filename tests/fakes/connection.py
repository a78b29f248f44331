"""A node in memory, for unit tests: files, modules, PCI devices and a boot id, behind the same
Connection interface. It understands gpunode's own scripts (probe, read-file, write-file) and a few tools;
anything else fails loudly unless a handler is registered, so a test cannot silently miss a command."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import re
import shlex
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from gpunode.connection.base import Connection
from gpunode.facts.containers import PENDING_RESTARTS
from gpunode.facts.probe import EFI_SECURE_BOOT_VAR, TOOLS
from gpunode.facts.registry import COMMAND, FILES, REGISTRY
from gpunode.journal import JOURNAL_PATH

Handler = Callable[["FakeNode", list[str], bytes], tuple[int, str, str]]

UBUNTU_2204 = """PRETTY_NAME="Ubuntu 22.04.5 LTS"
NAME="Ubuntu"
VERSION_ID="22.04"
VERSION="22.04.5 LTS (Jammy Jellyfish)"
VERSION_CODENAME=jammy
ID=ubuntu
ID_LIKE=debian
"""

ROCKY_9 = """NAME="Rocky Linux"
VERSION="9.3 (Blue Onyx)"
ID="rocky"
ID_LIKE="rhel centos fedora"
VERSION_ID="9.3"
PRETTY_NAME="Rocky Linux 9.3 (Blue Onyx)"
"""


@dataclass
class FakeNode:
    os_release: str = UBUNTU_2204
    kernel: str = "5.15.0-91-generic"
    arch: str = "x86_64"
    uid: int = 0
    boot_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    cmdline: str = "BOOT_IMAGE=/boot/vmlinuz ro quiet"
    modules: set[str] = field(default_factory=set)
    pci: list[tuple[str, int, int, int]] = field(default_factory=list)  # address, vendor, device, class
    nvidia_version: str | None = None
    nvidia_flavour: str = "proprietary"  # of the loaded module: "open" | "proprietary"
    tools: set[str] = field(default_factory=lambda: {"modprobe", "systemctl", "sudo", "sha256sum", "reboot"})
    efi: bool = True
    secure_boot: bool = False
    files: dict[str, str] = field(default_factory=dict)
    mtimes: dict[str, int] = field(default_factory=dict)
    clock: int = 1_700_000_000
    calls: list[list[str]] = field(default_factory=list)
    handlers: dict[str, Handler] = field(default_factory=dict)
    outputs: dict[str, tuple[str, int]] = field(default_factory=dict)  # probe COMMANDS: name -> (text, status)
    reboots: int = 0
    initramfs_blacklist: bool = False  # whether the initramfs image carries a nouveau blacklist
    node_lock: str | None = None  # gpunode's node lock (gpunode/nodelock.py): the holder's text, None when free
    lock_takes: int = 0  # how many times a run took it

    # -- state helpers ---------------------------------------------------------------------------------
    def tick(self) -> int:
        self.clock += 1
        return self.clock

    def put(self, path: str, content: str) -> None:
        self.files[path] = content
        self.mtimes[path] = self.tick()

    def add_gpu(self, device: int, address: str | None = None, pci_class: int = 0x030200) -> None:
        address = address or f"0000:{0x17 + len(self.pci):02x}:00.0"
        self.pci.append((address, 0x10DE, device, pci_class))

    @property
    def initramfs_path(self) -> str:
        return f"/boot/initrd.img-{self.kernel}"

    READ_ONLY_SCRIPTS = frozenset({"gpunode-probe", "gpunode-read-file", "gpunode-undo-look",
                                   # the run's node lock, taken and released, and the stale temp sweep: they
                                   # leave the node as they found it (a test of the lock reads `node_lock`)
                                   "gpunode-node-lock", "gpunode-node-unlock", "gpunode-stale-temp",
                                   "gpunode-disk-free", "gpunode-node-lock-read",
                                   "gpunode-simulate",  # a package transaction simulated (apt-get -s)
                                   "gpunode-read-offers"})  # a repository's metadata read (facts/offers.py)

    def changing_calls(self, since: int = 0) -> list[list[str]]:
        """Calls after `since` other than reads (the probe, read-file, and the `id -u` / `sudo -n true`
        privilege check). Empty means a run changed nothing."""
        def read_only(call: list[str]) -> bool:
            if call[:2] == ["sh", "-c"]:
                return len(call) > 3 and call[3] in self.READ_ONLY_SCRIPTS
            return call in (["id", "-u"], ["true"])
        return [c for c in self.calls[since:] if not read_only(c)]

    def ran(self, argv0: str) -> list[list[str]]:
        return [c for c in self.calls if c and c[0] == argv0]

    def blacklisted_in_etc(self) -> bool:
        from gpunode.facts.kernel import module_block

        conf = {p: c for p, c in self.files.items() if p.endswith(".conf") and "/modprobe.d/" in p}
        return module_block("nouveau", conf, self.cmdline).effective

    def reboot(self) -> None:
        """Boot again: new boot id; nouveau comes back unless the blacklist reached the initramfs."""
        self.reboots += 1
        self.boot_id = str(uuid.uuid4())
        has_gpu = any(v == 0x10DE and c >> 16 == 0x03 for _, v, _, c in self.pci)
        self.modules.discard("nouveau")
        built = _driver_field(self, "driver_module", "version:")
        if built:  # udev loads the installed nvidia module at boot (driver step handlers below)
            self.nvidia_version = built
        if has_gpu and not (self.initramfs_blacklist and self.blacklisted_in_etc()) and not self.nvidia_version:
            self.modules.add("nouveau")


class FakeConnection(Connection):
    def __init__(self, node: FakeNode | None = None, name: str = "fake-node") -> None:
        super().__init__()
        self.node = node or FakeNode()
        self.name = name

    def _exec(self, line: str, stdin: bytes, timeout: float | None) -> tuple[int, bytes, bytes, bool]:
        argv = _strip_wrappers(shlex.split(line))
        self.node.calls.append(argv)
        code, out, err = self._dispatch(argv, stdin)
        return code, out.encode(), err.encode(), False

    # -- dispatch --------------------------------------------------------------------------------------
    def _dispatch(self, argv: list[str], stdin: bytes) -> tuple[int, str, str]:
        node = self.node
        if argv[:2] == ["sh", "-c"]:
            name = argv[3].removeprefix("gpunode-") if len(argv) > 3 else ""
            args = argv[4:]
            if name == "probe":
                return 0, self._probe(argv[2]), ""
            if name == "read-file":
                return (0, node.files[args[0]], "") if args[0] in node.files else (44, "", "")
            if name == "write-file":
                written = self._write(args[0], stdin.decode("utf-8", "surrogateescape"), args[2] == "1")
                if len(args) > 5:  # the node lock's release carried at the end of the write (nodelock.Lock.unlock)
                    _fake_node_unlock(self, args[5:], b"")
                return written
            if name == "node-lock":
                return _fake_node_lock(self, args, argv[2])
            if name == "reboot":
                node.reboot()
                return 0, "", ""
            if name in node.handlers:
                return node.handlers[name](node, argv, stdin)
            if name in _SCRIPTS:
                return _SCRIPTS[name](self, args, stdin)
            return 127, "", f"fake node: no handler for script {name!r}"
        tool = argv[0]
        if tool in node.handlers:
            return node.handlers[tool](node, argv, stdin)
        if tool == "id" and argv[1:] == ["-u"]:
            return 0, f"{node.uid}\n", ""
        if tool == "true":
            return 0, "", ""
        if tool in _TOOLS:
            return _TOOLS[tool](self, argv, stdin)
        if tool in ("update-initramfs", "dracut", "mkinitcpio"):
            if tool not in node.tools:
                return 127, "", f"sh: 1: {tool}: not found\n"
            node.put(node.initramfs_path, "initramfs")
            node.initramfs_blacklist = node.blacklisted_in_etc()
            return 0, "", ""
        return 127, "", f"fake node: no handler for command {shlex.join(argv)!r}"

    def _write(self, path: str, content: str, keep: bool) -> tuple[int, str, str]:
        node = self.node
        if node.files.get(path) == content:
            return 0, "gpunode-unchanged\n", ""
        backup = ""
        if keep and path in node.files:
            backup = f"{path}.gpunode-bak.{node.clock}"
            node.files[backup] = node.files[path]
        node.put(path, content)
        return 0, f"gpunode-written {backup}\n", ""

    def _probe(self, script: str) -> str:
        match = re.search(r"@([0-9a-f]+)@begin", script)
        assert match, "not a gpunode probe"
        nonce = match.group(1)
        renderers = _section_renderers(self.node, nonce)
        parts = []
        # the sections in the probe's order (a RUN probe leaves doctor's out, and registers no FULL-only subsystem)
        for name in re.findall(rf'echo "@{nonce}@begin (\S+)"', script):
            if name not in renderers:
                raise AssertionError(f"FakeNode cannot answer probe section {name!r}: teach fake.py")
            text, status = renderers[name]
            parts.append(f"@{nonce}@begin {name}\n{text}\n@{nonce}@end {name} {status}")  # as the wrapper's echo
        return "\n".join(parts) + "\n"


def _strip_wrappers(argv: list[str]) -> list[str]:
    """Drop `sudo ... --` and `env K=V ...` so handlers see the real command."""
    if argv and argv[0] == "sudo":
        argv = argv[argv.index("--") + 1:] if "--" in argv else argv[1:]
    if argv and argv[0] == "env":
        argv = argv[1:]
        while argv and "=" in argv[0] and not argv[0].startswith("/"):
            argv = argv[1:]
    return argv


def _section_renderers(node: FakeNode, nonce: str) -> dict[str, tuple[str, int]]:
    def file_section(patterns: tuple[str, ...]) -> str:
        out = []
        for pattern in patterns:
            directory = pattern.rpartition("/")[0]
            for path in sorted(node.files):
                if fnmatch.fnmatch(path.rpartition("/")[0], directory) and fnmatch.fnmatch(path, pattern):
                    out.append(f"@{nonce}@file {node.mtimes.get(path, 0)} {path}\n{node.files[path]}\n")
        return "".join(out)

    sb = "efi\n" if node.efi else "bios\n"
    if node.efi:
        sb += f"efivar 6 0 0 0 {1 if node.secure_boot else 0}\n"
    if "mokutil" in node.tools:
        sb += "mokutil " + (("SecureBoot enabled" if node.secure_boot else "SecureBoot disabled") if node.efi
                            else "EFI variables are not supported on this system") + "\n"
    initramfs = (f"{node.mtimes.get(node.initramfs_path, 0)} {node.initramfs_path}\n"
                 if node.initramfs_path in node.files else "")
    kind = "Open Kernel Module for x86_64" if node.nvidia_flavour == "open" else "x86_64 Kernel Module"
    nvidia = (f"NVRM version: NVIDIA UNIX {kind}  {node.nvidia_version}  Thu Oct 19 18:56:32 UTC 2023\n"
              if node.nvidia_version else "")
    sections = {
        "os_release": (node.os_release, 0),
        "kernel": (node.kernel + "\n", 0),
        "arch": (node.arch + "\n", 0),
        "uid": (f"{node.uid}\n", 0),
        "boot_id": (node.boot_id + "\n", 0),
        "cmdline": (node.cmdline + "\n", 0),
        "modules": ("".join(f"{m} 16384 0 - Live 0x0000000000000000\n" for m in sorted(node.modules)), 0),
        "nvidia_version": (nvidia, 0 if nvidia else 1),
        "pci": ("".join(f"{a} 0x{v:04x} 0x{d:04x} 0x{c:06x}\n" for a, v, d, c in node.pci), 0),
        "tools": ("".join(f"{t} /usr/bin/{t}\n" for t in TOOLS if t in node.tools), 0),
        "secure_boot": (sb, 0),
        "initramfs": (initramfs, 0),
    }
    sections.update({f"files:{f.name}": (file_section(f.patterns), 0) for f in REGISTRY.values() if f.kind == FILES})
    sections.update({f"cmd:{f.name}": node.outputs.get(f.name, ("", 127)) for f in REGISTRY.values()
                     if f.kind == COMMAND})
    # the journal comes with the probe, as on a real node (facts/containers.JOURNAL): 3 when there is none
    journal = node.files.get(JOURNAL_PATH)
    if PENDING_RESTARTS.name not in node.outputs:
        sections[f"cmd:{PENDING_RESTARTS.name}"] = (journal, 0) if journal is not None else ("", 3)
    return sections


# -- the driver and prerequisites steps (gpunode/steps/driver.py, prerequisites.py) ---------------------------
# Package installs and the NVIDIA installer update the probe answers (FakeNode.outputs) the steps read.
# `FakeNode.handlers` still wins: a test registers "apt-get" to simulate a lock or a missing package.

def _driver_field(node: FakeNode, section: str, key: str) -> str | None:
    text = node.outputs.get(section, ("", 1))[0]
    for line in text.splitlines():
        if line.startswith(key):
            return line[len(key):].strip() or None
    return None


def _add_output(node: FakeNode, section: str, line: str) -> None:
    text = node.outputs.get(section, ("", 0))[0]
    node.outputs[section] = (text + line + "\n", 0)


def _fake_packages(conn: FakeConnection, argv: list[str], stdin: bytes) -> tuple[int, str, str]:
    node = conn.node
    if argv[:2] in (["apt-get", "update"], ["dnf", "makecache"]):
        return 0, "Reading package lists...\n", ""
    names = [a for a in argv[2:] if not a.startswith("-")]
    for name in names:
        if name in node.files.get("/fake/unavailable-packages", "").split():
            return 100, "", f"E: Unable to locate package {name}\n"
    for name in names:
        if name in ("gcc", "make", "dkms"):
            node.tools.add(name)
        elif name.startswith(("linux-headers-", "kernel-devel-")):
            _add_output(node, "kernel_headers", f"build /lib/modules/{node.kernel}/build")
        elif "epel-release" in name:
            _add_output(node, "prereq_available", "installed epel-release")
    return 0, f"Setting up {' '.join(names)}\n", ""


def _fake_locked_run(conn: FakeConnection, args: list[str], stdin: bytes) -> tuple[int, str, str]:
    """pkg-locked-run WAIT POLL ARGV...: retries while the command reports a held lock (no sleeping)."""
    wait, poll, argv = float(args[0]), float(args[1]), args[2:]
    waited, notes = 0.0, ""
    while True:
        conn.node.calls.append(argv)
        code, out, err = conn._dispatch(argv, b"")
        match = re.search(r"Could not get lock (\S+)\. It is held by process (\d+) \(([^)]*)\)", out + err)
        if code == 0 or not match:
            return code, out + err if code else out, notes
        holder = f"process {match[2]} ({match[3]}) holds {match[1]}"
        if waited >= wait:
            return 75, "", notes + f"gpunode-lock-timeout: {holder}\n"
        notes += f"gpunode-lock-wait: {holder}\n"
        waited += max(poll, 1.0)


def _fake_mktemp(conn: FakeConnection, args: list[str], stdin: bytes) -> tuple[int, str, str]:
    return 0, f"{args[0] or '/var/tmp'}/gpunode.fake{conn.node.tick()}\n", ""


def _fake_cleanup(conn: FakeConnection, args: list[str], stdin: bytes) -> tuple[int, str, str]:
    for path in [p for p in conn.node.files if p == args[0] or p.startswith(args[0] + "/")]:
        del conn.node.files[path]
    return 0, "", ""


def _fake_nvidia_installer(conn: FakeConnection, args: list[str], stdin: bytes) -> tuple[int, str, str]:
    """driver-install DIR RUN SHA256 LOG KEY CERT FLAGS...: what the .run does, as far as the facts see it."""
    import hashlib

    node = conn.node
    workdir, run, want, flags = args[0], args[1], args[2], args[6:]
    data = node.files.get(f"{workdir}/{run}")
    _fake_cleanup(conn, [workdir], b"")
    if data is None or want and hashlib.sha256(data.encode("utf-8", "surrogateescape")).hexdigest() != want:
        return 90, "", "gpunode: the uploaded installer has sha256 ?, not the verified one: nothing was run\n"
    if "nouveau" in node.modules:
        return 1, "", "ERROR: The Nouveau kernel driver is currently in use by your system.\n"
    if "build " not in node.outputs.get("kernel_headers", ("", 1))[0]:
        return 1, "", "ERROR: Unable to find the kernel source tree for the currently running kernel.\n"
    if node.secure_boot and not any(f.startswith("--module-signing-secret-key=") for f in flags):
        return 1, "", "ERROR: Unable to load the kernel module 'nvidia.ko'.\nKey was rejected by service\n"
    match = re.search(r"(\d+\.\d+(?:\.\d+)?)\.run$", run)
    version = match[1] if match else "0"
    flavour = "open" if "-m=kernel-open" in flags else "proprietary"
    node.nvidia_version, node.nvidia_flavour = version, flavour
    node.modules.add("nvidia")
    libdir = "/usr/lib64" if "rhel" in node.os_release or "rocky" in node.os_release else \
        "/usr/lib/x86_64-linux-gnu"
    node.outputs["driver_userspace"] = (f"lib {libdir}/libnvidia-ml.so.1\nlib {libdir}/libnvidia-ml.so.{version}\n"
                                        f"installer nvidia-installer:  version {version}\n", 0)
    licence = "Dual MIT/GPL" if flavour == "open" else "NVIDIA"
    node.outputs["driver_module"] = (f"version:        {version}\nlicense:        {licence}\n", 0)
    node.outputs["driver_smi"] = (f"{version}\n", 0)
    node.put(args[3], f"nvidia-installer log file '{args[3]}'\ninstaller version: {version}\n")
    return 0, "", ""


def _fake_modprobe(conn: FakeConnection, argv: list[str], stdin: bytes) -> tuple[int, str, str]:
    node = conn.node
    names = [a for a in argv[1:] if not a.startswith("-")]
    if "-r" in argv:
        node.modules.difference_update(names)
        return 0, "", ""
    for name in names:
        if name == "nvidia":
            built = _driver_field(node, "driver_module", "version:")
            if not built:
                return 1, "", "modprobe: FATAL: Module nvidia not found\n"
            node.nvidia_version = built
        node.modules.add(name)
    return 0, "", ""


def _fake_undo_look(conn: FakeConnection, args: list[str], stdin: bytes) -> tuple[int, str, str]:
    """undo-look NONCE COUNT WHAT ITEM... -- ...: files (sha256 of the fake's files) and texts; the other looks
    answer nothing (unknown)."""
    nonce, rest, out, index = args[0], args[2:2 + int(args[1])], [], 0
    files = conn.node.files
    while rest:
        end = rest.index("--") if "--" in rest else len(rest)
        what, items, rest = rest[0], rest[1:end], rest[end + 1:]
        if what == "files":
            out.append(f"{nonce} look {index}\n" + "".join(
                f"file {hashlib.sha256(files[p].encode()).hexdigest() if p in files else '-'} {p}\n" for p in items))
        elif what == "texts":
            out.append(f"{nonce} look {index}\n" + "".join(f"{nonce} {p}\n{files[p]}\n{nonce}\n"
                                                          for p in items if p in files))
        index += 1
    return 0, "".join(out), ""


def _fake_looked(conn: FakeConnection, args: list[str], stdin: bytes) -> tuple[int, str, str]:
    """looked NONCE COUNT BEFORE... COUNT AFTER... ARGV... (gpunode/actions/base.py LOOKED): the looks before (as
    undo-look answers them), the command itself (dispatched as if sent alone, and logged in the wrapper's place),
    then the looks after."""
    nonce, nb = args[0], int(args[1])
    before, na = args[2:2 + nb], int(args[2 + nb])
    after, argv = args[3 + nb:3 + nb + na], args[3 + nb + na:]
    conn.node.calls[-1] = argv
    _, seen, _ = _fake_undo_look(conn, [nonce, str(nb), *before], b"")
    code, out, err = conn._dispatch(argv, stdin)
    _, seen_after, _ = _fake_undo_look(conn, [nonce, str(na), *after], b"")
    return code, f"{seen}{nonce} ran\n{out}\n{nonce} after\n{seen_after}", err


def _fake_rm(conn: FakeConnection, argv: list[str], stdin: bytes) -> tuple[int, str, str]:
    for path in [a for a in argv[1:] if not a.startswith("-")]:
        conn.node.files.pop(path, None)
    return 0, "", ""


def _fake_node_lock(conn: FakeConnection, args: list[str], script: str) -> tuple[int, str, str]:
    """gpunode/nodelock.py's lock script without a keeper (this transport cannot keep a command running): once it
    takes the lock, it removes the stale temp files and runs the probe it carries (between `MARK begin` / `end`)."""
    node = conn.node
    me = f"gpunode-lock pid=- boot={node.boot_id}\n{args[1]}"
    old, state = node.node_lock, "taken"
    if old is not None and f" boot={node.boot_id}\n" in old:
        return 75, f"gpunode-lock-held\n{me}\ngpunode-lock-other\n{old}\ngpunode-lock-end\n", ""
    if old is not None:  # taken in another boot: stale
        state = "stale"
    node.node_lock = me
    node.lock_takes += 1
    removed = _fake_stale_temp(conn, args[4:], b"")[1]  # the places to clean, once taken
    probe = conn._probe(script) if "@begin" in script else ""
    return 0, (f"gpunode-lock-{state}\n{me}\ngpunode-lock-other\n{old or ''}\ngpunode-lock-end\n{removed}"
               f"{args[3]} begin\n{probe}{args[3]} end\n"), ""


def _fake_node_unlock(conn: FakeConnection, args: list[str], stdin: bytes) -> tuple[int, str, str]:
    if conn.node.node_lock == args[1]:
        conn.node.node_lock = None
    return 0, "", ""


def _fake_node_lock_read(conn: FakeConnection, args: list[str], stdin: bytes) -> tuple[int, str, str]:
    return (0, conn.node.node_lock + "\n", "") if conn.node.node_lock is not None else (3, "", "")


def _fake_stale_temp(conn: FakeConnection, args: list[str], stdin: bytes) -> tuple[int, str, str]:
    gone = [p for p in conn.node.files if any(p.startswith(f"{d}/gpunode.") or p.startswith(f"{d}/.gpunode-")
                                               for d in args)]
    for path in gone:
        del conn.node.files[path]
    return 0, "".join(f"{p}\n" for p in gone), ""


_SCRIPTS: dict[str, Callable[[FakeConnection, list[str], bytes], tuple[int, str, str]]] = {
    "node-unlock": _fake_node_unlock,
    "node-lock-read": _fake_node_lock_read,
    "stale-temp": _fake_stale_temp,
    "undo-look": _fake_undo_look,
    "looked": _fake_looked,
    "pkg-locked-run": _fake_locked_run,
    "mktemp-dir": _fake_mktemp,
    "cleanup": _fake_cleanup,
    "driver-install": _fake_nvidia_installer,
}
_TOOLS: dict[str, Callable[[FakeConnection, list[str], bytes], tuple[int, str, str]]] = {
    "apt-get": _fake_packages,
    "dnf": _fake_packages,
    "yum": _fake_packages,
    "modprobe": _fake_modprobe,
    "rm": _fake_rm,
}


# -- container toolkit, runtime and fabric manager steps (gpunode/steps/toolkit.py, runtime.py, fabricmanager.py)

_PKG_SPEC = re.compile(r"^(?P<name>.+?)-(?P<version>\d[^-]*-[^-]+)$")


@dataclass
class FakeSystem:
    """Packages, holds, systemd units and nvidia-ctk for one FakeNode, kept in step with the probe answers the
    toolkit, runtime and fabric-manager steps read. `attach()` registers its handlers on the node (node handlers
    win over the module-level ones above); tests read `packages`, `held`, `units` and `restarts`. nvidia-ctk
    writes what gpunode.facts.containers predicts for the installed toolkit version."""

    node: FakeNode
    packages: dict[str, str] = field(default_factory=dict)  # name -> version
    held: set[str] = field(default_factory=set)  # dpkg holds (rpm nodes keep versionlock.list in node.files)
    units: dict[str, list[str]] = field(default_factory=dict)  # unit -> [active, enabled]
    versions: dict[str, str] = field(default_factory=dict)  # what an unpinned install gets
    missing: set[str] = field(default_factory=set)  # names no repository offers
    restarts: list[str] = field(default_factory=list)

    TOOLKIT = ("nvidia-container-toolkit", "nvidia-container-toolkit-base", "libnvidia-container-tools",
               "libnvidia-container1")

    @property
    def debian(self) -> bool:
        return any(w in self.node.os_release.lower() for w in ("debian", "ubuntu"))

    def attach(self) -> FakeSystem:
        for name in ("apt-get", "apt-mark", "dnf", "yum", "zypper", "systemctl", "nvidia-ctk", "fetch-apt-key",
                     "backup-files", "remove-dir", "fabric-state", "fabricmanager-log", "install-cuda-keyring",
                     "read-offers"):
            self.node.handlers[name] = self._handle
        self.sync()
        return self

    def unit(self, name: str, active: str = "active", enabled: str = "enabled") -> FakeSystem:
        self.units[name if "." in name else f"{name}.service"] = [active, enabled]
        self.sync()
        return self

    # -- probe answers ---------------------------------------------------------------------------------------
    def sync(self) -> None:
        node = self.node
        node.outputs["pkg_status"] = ("".join(f"{'hi ' if n in self.held else 'ii '}\t{n}\t{v}\n"
                                              for n, v in sorted(self.packages.items())), 0)
        node.outputs["units"] = ("".join(f"{u}\t{a}\t{e}\n" for u, (a, e) in sorted(self.units.items())), 0)
        ctk = self.packages.get("nvidia-container-toolkit-base") or self.packages.get("nvidia-container-toolkit")
        if ctk:
            node.tools.update({"nvidia-ctk", "nvidia-container-runtime"})
            node.outputs["nvidia_ctk_version"] = (f"NVIDIA Container Toolkit CLI version {ctk.split('-')[0]}\n"
                                                  "commit: fake\n", 0)
        else:
            node.tools.discard("nvidia-ctk")
            node.outputs["nvidia_ctk_version"] = ("", 127)
        node.outputs["apt_keyrings"] = ("".join(p + "\n" for p in sorted(node.files) if p.startswith(
            ("/usr/share/keyrings/", "/etc/apt/keyrings/"))), 0)
        switches = node.outputs.get("nvswitch_devices", ("", 2))[1] == 0
        if node.nvidia_version and switches:
            fm = self.units.get("nvidia-fabricmanager.service", ["inactive", ""])[0] == "active"
            state, status = ("Completed", "Success") if fm else ("In Progress", "N/A")
            node.outputs["fabric_state"] = ("".join(
                f"GPU 0000{a.upper()}\n    Fabric\n        State : {state}\n        Status : {status}\n"
                f"        ClusterUUID : 00000000-0000-0000-0000-000000000000\n"
                for a, v, _, c in node.pci if v == 0x10DE and c >> 16 == 0x03), 0)

    # -- handlers --------------------------------------------------------------------------------------------
    def _read_offers(self, args: list[str]) -> tuple[int, str, str]:
        """NVIDIA's toolkit repository metadata as facts/offers.py's script prints it: the versions an unpinned
        install gets (`versions`), but none of the names in `missing`."""
        return 0, "".join(f"offer {n} {self.versions[n]}\n" for n in self.TOOLKIT
                          if n in self.versions and n not in self.missing), ""

    def _handle(self, node: FakeNode, argv: list[str], stdin: bytes) -> tuple[int, str, str]:
        name, args = (argv[3].removeprefix("gpunode-"), argv[4:]) if argv[:2] == ["sh", "-c"] else (argv[0], argv[1:])
        handler = getattr(self, "_" + name.replace("-", "_"))
        result = handler(args)
        self.sync()
        return result

    def _install(self, specs: list[str], flags: set[str], apt: bool) -> tuple[int, str, str]:
        from gpunode.facts.packages import compare_versions

        todo: dict[str, str] = {}
        for spec in specs:
            if spec.endswith((".deb", ".rpm")):
                base = spec.rsplit("/", 1)[-1]
                match = (re.match(r"^([^_]+)_([^_]+)_", base) if base.endswith(".deb") else
                         re.match(r"^(.+)-([^-]+-[^-]+)\.[^.]+\.rpm$", base))
                if spec not in self.node.files or not match:
                    return 1, "", f"E: Unsupported file {spec} given on commandline\n"
                todo[match[1]] = match[2]
                continue
            match = re.match(r"^(.+?)=(.+)$", spec) if apt else _PKG_SPEC.match(spec)
            name, version = (match[1], match[2]) if match else (spec, self.versions.get(spec, "1.0.0-1"))
            if name in self.missing or (not match and name not in self.versions and name not in self.TOOLKIT
                                        and "versionlock" not in name):
                return 100, "", f"E: Unable to locate package {name}\n"
            todo[name] = version
            if name == self.TOOLKIT[0] and not match:  # dependencies come along at the same version
                todo.update({dep: version for dep in self.TOOLKIT[1:] if dep not in self.packages})
        for name, version in todo.items():
            old = self.packages.get(name)
            if old and old != version and name in self.held and "--allow-change-held-packages" not in flags:
                return 100, "", "E: Held packages were changed and -y was used without --allow-change-held-packages.\n"
            if apt and old and compare_versions(old, version) > 0 and "--allow-downgrades" not in flags:
                return 100, "", "E: Packages were downgraded and -y was used without --allow-downgrades.\n"
            if not apt and name in self._locks() and old != version:
                return 1, "", f"Error: package {name} is filtered out by versionlock\n"
        for name, version in todo.items():
            self.packages[name] = version
            if re.match(r"^nvidia-fabric-?manager(-\d+)?$", name):
                self.units.setdefault("nvidia-fabricmanager.service", ["inactive", "disabled"])
        return 0, "".join(f"Setting up {n} ({v}) ...\n" for n, v in todo.items()), ""

    def _remove(self, names: list[str]) -> tuple[int, str, str]:
        for name in names:
            self.packages.pop(name, None)
            self.held.discard(name)
            if re.match(r"^nvidia-fabric-?manager(-\d+)?$", name):
                self.units.pop("nvidia-fabricmanager.service", None)
        return 0, "", ""

    def _apt_get(self, args: list[str]) -> tuple[int, str, str]:
        flags = {a for a in args if a.startswith("-")}
        words = [a for a in args if not a.startswith("-")]
        if words[0] == "update":
            return 0, "Reading package lists... Done\n", ""
        if words[0] == "remove":
            return self._remove(words[1:])
        return self._install(words[1:], flags, apt=True)

    def _apt_mark(self, args: list[str]) -> tuple[int, str, str]:
        for name in args[1:]:
            if name not in self.packages:
                return 100, "", f"E: Unable to locate package {name}\n"
            (self.held.add if args[0] == "hold" else self.held.discard)(name)
        return 0, "", ""

    def _lockfile(self) -> str:
        return "/etc/dnf/plugins/versionlock.list" if "dnf" in self.node.tools or "yum" not in self.node.tools \
            else "/etc/yum/pluginconf.d/versionlock.list"

    def _locks(self) -> list[str]:
        text = self.node.files.get(self._lockfile(), "") + self.node.files.get("/etc/zypp/locks", "")
        return [m[1] for m in re.finditer(r"^(?:solvable_name: )?(.+?)(?:-\d+:[^-]+-[^-]+\.\*)?$", text, re.M)
                if not m[0].startswith(("#", "type:", "match_exact:"))]

    def _dnf(self, args: list[str]) -> tuple[int, str, str]:
        words = [a for a in args if not a.startswith("-")]
        if words[0] == "config-manager":
            self.node.put("/etc/yum.repos.d/" + words[-1].rsplit("/", 1)[-1], f"[cuda]\nbaseurl={words[-1]}\n")
            return 0, "", ""
        if words[0] == "versionlock":
            plugin = "python3-dnf-plugin-versionlock" if self._lockfile().startswith("/etc/dnf") else \
                "yum-plugin-versionlock"
            if plugin not in self.packages:
                return 1, "", "No such command: versionlock.\n"
            text = self.node.files.get(self._lockfile(), "")
            for spec in words[2:]:
                if words[1] == "add":
                    match = _PKG_SPEC.match(spec)
                    name = match[1] if match else spec
                    text += f"{name}-0:{self.packages[name]}.*\n"
                else:
                    text = "".join(line + "\n" for line in text.splitlines() if not line.startswith(spec + "-0:"))
            self.node.put(self._lockfile(), text)
            return 0, "", ""
        if words[0] == "remove":
            return self._remove(words[1:])
        return self._install(words[1:], set(args), apt=False)

    _yum = _dnf

    def _zypper(self, args: list[str]) -> tuple[int, str, str]:
        words = [a for a in args if not a.startswith("-")]
        text = self.node.files.get("/etc/zypp/locks", "")
        if words[0] == "addlock":
            self.node.put("/etc/zypp/locks", text + "".join(f"type: package\nmatch_exact: 1\nsolvable_name: {n}\n\n"
                                                            for n in words[1:]))
            return 0, "", ""
        if words[0] == "removelock":
            blocks = [b for b in text.split("\n\n") if b.strip() and b.split("solvable_name: ")[-1].strip()
                      not in words[1:]]
            self.node.put("/etc/zypp/locks", "".join(b.strip() + "\n\n" for b in blocks))
            return 0, "", ""
        if words[0] == "refresh":
            return 0, "", ""
        if words[0] == "remove":
            return self._remove(words[1:])
        return self._install(words[1:], set(args), apt=False)

    UNIT_DIRS = ("/etc/systemd/system/", "/run/systemd/system/", "/usr/lib/systemd/system/", "/lib/systemd/system/")

    def _systemctl(self, args: list[str]) -> tuple[int, str, str]:
        words = [a for a in args if not a.startswith("-")]
        command, names = words[0], [n if "." in n else f"{n}.service" for n in words[1:]]
        if command == "daemon-reload":  # unit files written since are known from now on (static: no [Install])
            for path, text in sorted(self.node.files.items()):
                folder, _, name = path.rpartition("/")
                if folder + "/" in self.UNIT_DIRS and name.endswith(".service") and name not in self.units:
                    self.units[name] = ["inactive", "disabled" if "[Install]" in text else "static"]
            return 0, "", ""
        for name in names:
            if name not in self.units:
                return 5, "", f"Failed to {command} {name}: Unit {name} not found.\n"
            state = self.units[name]
            if command in ("enable", "disable"):
                state[1] = "enabled" if command == "enable" else "disabled"
            if command == "stop" or (command == "disable" and "--now" in args):
                state[0] = "inactive"
            if command in ("start", "restart") or (command == "enable" and "--now" in args):
                self.restarts.append(name)
                problem = self._start_problem(name)
                state[0] = "failed" if problem else "active"
                if problem:
                    return 1, "", f"Job for {name} failed because the control process exited with error code.\n"
        return 0, "", ""

    def _start_problem(self, name: str) -> str | None:
        node = self.node
        if name == "docker.service":
            try:
                json.loads(node.files.get("/etc/docker/daemon.json") or "{}")
            except ValueError:
                return "invalid daemon.json"
        if name == "nvidia-persistenced.service" and not node.nvidia_version:
            return "nvidia-persistenced failed to initialize: the NVIDIA kernel module is not loaded"
        if name == "nvidia-fabricmanager.service":
            fm = next((v for n, v in self.packages.items() if re.match(r"^nvidia-fabric-?manager(-\d+)?$", n)), "")
            problem = None
            if not node.nvidia_version:
                problem = "Fabric Manager failed to open the NVIDIA driver: driver not loaded"
            elif fm.split("-")[0] != node.nvidia_version:
                problem = (f"fabric manager NVIDIA GPU driver interface version {node.nvidia_version} don't match "
                           f"with driver version {fm.split('-')[0]}. Please update with matching NVIDIA driver package.")
            if problem:
                log = node.files.get("/var/log/fabricmanager.log", "") + f"[ERROR] {problem}\n"
                node.put("/var/log/fabricmanager.log", log)
                node.outputs["fabricmanager_log"] = (log, 0)
            return problem
        return None

    def _nvidia_ctk(self, args: list[str]) -> tuple[int, str, str]:
        from gpunode.facts import containers

        if args[:2] == ["system", "create-dev-char-symlinks"]:
            return self._dev_char_symlinks("--create-all" in args)
        opts = {a.split("=", 1)[0]: (a.split("=", 1)[1] if "=" in a else "") for a in args if a.startswith("--")}
        version = tuple(int(x) for x in self.node.outputs["nvidia_ctk_version"][0].split()[5].split("."))
        if "--drop-in-config" in opts and version < containers.DROPIN_SINCE:
            return 1, "", "Incorrect Usage: flag provided but not defined: -drop-in-config\n"
        runtime, config, default = opts.get("--runtime", "docker"), opts["--config"], "--set-as-default" in opts
        try:
            if runtime == "docker":
                data = containers.parse_daemon_json(self.node.files.get(config), config)
                written = {config: containers.dump_daemon_json(containers.configure_docker(data, default))}
            elif runtime == "containerd":
                written = containers.predict_containerd(self.node.files.get(config), config=config, set_as_default=default,
                                                        dropin=opts.get("--drop-in-config", containers.CONTAINERD_DROPIN),
                                                        ctk=version)
            else:
                written = containers.predict_crio(self.node.files.get(config), config=config, set_as_default=default,
                                                  dropin=opts.get("--drop-in-config", containers.CRIO_DROPIN), ctk=version)
        except containers.ConfigError as exc:
            return 1, "", f'level=error msg="unable to load config for runtime {runtime}: {exc.message}"\n'
        for path, text in written.items():
            self.node.put(path, text)
        return 0, "", f'level=info msg="It is recommended that {runtime} daemon be restarted."\n'

    def _dev_char_symlinks(self, create_all: bool) -> tuple[int, str, str]:
        """Links /dev/char/MAJ:MIN to the GPU and control device nodes (all possible ones with --create-all, else
        those that exist), as the `doctor_dev_char` probe command then lists them."""
        node = self.node
        lines = node.outputs.get("doctor_dev_char", ("", 0))[0].splitlines()
        devices = [line.split()[1] for line in lines if line.startswith("dev ")]
        links = {line.split()[2]: line.split()[1] for line in lines if line.startswith("link ")}
        gpus = sum(1 for _, v, _, c in node.pci if v == 0x10DE and c >> 16 == 0x03)
        numbers = {f"/dev/nvidia{i}": f"195:{i}" for i in range(gpus)} | {
            "/dev/nvidiactl": "195:255", "/dev/nvidia-modeset": "195:254", "/dev/nvidia-uvm": "510:0",
            "/dev/nvidia-uvm-tools": "510:1"}
        log = ""
        for device, number in numbers.items():
            if (create_all or device in devices) and device not in links.values():
                links[number] = device
                log += f'level=info msg="Creating link /dev/char/{number} => {device}"\n'
        node.outputs["doctor_dev_char"] = ("".join(f"dev {d}\n" for d in devices) + "".join(
            f"link {n} {d}\n" for n, d in links.items()), 0)
        return 0, "", log

    def _install_cuda_keyring(self, args: list[str]) -> tuple[int, str, str]:
        directory = args[0].split("/repos/")[1].split("/")[0]
        self.node.put(f"/etc/apt/sources.list.d/cuda-{directory}-x86_64.list",
                      f"deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] {args[0].rsplit('/', 1)[0]}/ /\n")
        self.node.put("/usr/share/keyrings/cuda-archive-keyring.gpg", "CUDA-KEYRING")
        self.packages["cuda-keyring"] = "1.1-1"
        return 0, "", ""

    def _fetch_apt_key(self, args: list[str]) -> tuple[int, str, str]:
        if not {"curl", "gpg"} <= self.node.tools:
            return 127, "", "sh: 1: curl: not found\n"
        self.node.put(args[1], "NVIDIA-KEYRING")
        return 0, "", ""

    def _backup_files(self, args: list[str]) -> tuple[int, str, str]:
        kept = []
        for path in args:
            if path in self.node.files:
                kept.append(f"{path}.gpunode-bak.{self.node.tick()}")
                self.node.files[kept[-1]] = self.node.files[path]
        return 0, "".join(k + "\n" for k in kept), ""

    def _remove_dir(self, args: list[str]) -> tuple[int, str, str]:
        for path in [p for p in self.node.files if p.startswith(args[0] + "/")]:
            del self.node.files[path]
        return 0, "", ""

    def _fabric_state(self, args: list[str]) -> tuple[int, str, str]:
        return 0, self.node.outputs.get("fabric_state", ("", 0))[0], ""

    def _fabricmanager_log(self, args: list[str]) -> tuple[int, str, str]:
        return 0, self.node.files.get("/var/log/fabricmanager.log", ""), ""

__all__ = ["FakeConnection", "FakeNode", "FakeSystem", "UBUNTU_2204", "ROCKY_9", "EFI_SECURE_BOOT_VAR"]
