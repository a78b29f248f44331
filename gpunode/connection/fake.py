"""A node in memory, for unit tests and demos: files, modules, PCI devices and a boot id, behind the same
Connection interface. It understands gpunode's own scripts (probe, read-file, write-file) and a few tools;
anything else fails loudly unless a handler is registered, so a test cannot silently miss a command."""

from __future__ import annotations

import fnmatch
import re
import shlex
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from gpunode.connection.base import Connection
from gpunode.facts.probe import COMMANDS, EFI_SECURE_BOOT_VAR, FILE_GROUPS, TOOLS, all_sections

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
                return self._write(args[0], stdin.decode(), args[2] == "1")
            if name == "reboot":
                node.reboot()
                return 0, "", ""
            if name in node.handlers:
                return node.handlers[name](node, argv, stdin)
            return 127, "", f"fake node: no handler for script {name!r}"
        tool = argv[0]
        if tool in node.handlers:
            return node.handlers[tool](node, argv, stdin)
        if tool == "id" and argv[1:] == ["-u"]:
            return 0, f"{node.uid}\n", ""
        if tool == "true":
            return 0, "", ""
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
        for name in all_sections():
            if name not in renderers:
                raise AssertionError(f"FakeNode cannot answer probe section {name!r}: teach fake.py")
            text, status = renderers[name]
            parts.append(f"@{nonce}@begin {name}\n{text}" + ("" if text.endswith("\n") or not text else "\n")
                         + f"@{nonce}@end {name} {status}")
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
                if path.rpartition("/")[0] == directory and fnmatch.fnmatch(path, pattern):
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
    nvidia = (f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {node.nvidia_version}  Thu Oct 19 18:56:32 UTC 2023\n"
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
    sections.update({f"files:{name}": (file_section(p), 0) for name, p in FILE_GROUPS.items()})
    sections.update({f"cmd:{name}": node.outputs.get(name, ("", 127)) for name in COMMANDS})
    return sections


__all__ = ["FakeConnection", "FakeNode", "UBUNTU_2204", "ROCKY_9", "EFI_SECURE_BOOT_VAR"]
