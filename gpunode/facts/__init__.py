"""What gpunode knows about a node: gathered by one batched probe, parsed by pure functions.

`Facts` is immutable. After any change the runner gathers a fresh one; nothing simulates the effect of a
step on stale facts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpunode.connection.base import Connection
from gpunode.errors import CommandError
from gpunode.facts.kernel import (
    LoadedDriver,
    ModuleBlock,
    PciDevice,
    SecureBoot,
    module_block,
    parse_modules,
    parse_nvidia_version,
    parse_pci,
    parse_secure_boot,
    parse_tools,
)
from gpunode.facts.osinfo import UNKNOWN_OS, OsInfo, parse_os_release
from gpunode.facts.probe import (
    COMMANDS,
    FILE_GROUPS,
    MODPROBE_DIRS,
    Section,
    build_probe,
    split_files,
    split_sections,
)

__all__ = ["Facts", "gather", "facts_from_probe_output"]


@dataclass(frozen=True)
class Facts:
    os: OsInfo = UNKNOWN_OS
    kernel: str = ""
    arch: str = ""
    uid: int | None = None
    boot_id: str = ""
    cmdline: str = ""
    modules: frozenset[str] = frozenset()
    pci: tuple[PciDevice, ...] = ()
    loaded_driver: LoadedDriver | None = None
    tools: Mapping[str, str] = field(default_factory=dict)
    secure_boot: SecureBoot = SecureBoot(False, False, "")
    files: Mapping[str, str] = field(default_factory=dict)  # every file of probe.FILE_GROUPS: path -> text
    mtimes: Mapping[str, int] = field(default_factory=dict)  # path -> mtime (seconds since the epoch)
    outputs: Mapping[str, Section] = field(default_factory=dict)  # probe.COMMANDS: name -> raw output
    initramfs_mtime: int | None = None  # newest initramfs image for the running kernel; None: not found

    @property
    def gpus(self) -> tuple[PciDevice, ...]:
        return tuple(d for d in self.pci if d.vendor == 0x10DE and d.is_gpu)

    @property
    def nvswitches(self) -> tuple[PciDevice, ...]:
        return tuple(d for d in self.pci if d.vendor == 0x10DE and d.is_nvswitch)

    def has(self, tool: str) -> bool:
        return tool in self.tools

    def module_loaded(self, name: str) -> bool:
        return name.replace("-", "_") in self.modules

    @property
    def modprobe_files(self) -> dict[str, str]:
        return {p: t for p, t in self.files.items() if p.rpartition("/")[0] in MODPROBE_DIRS}

    def output(self, name: str) -> str | None:
        """Output of an extra probe command, or None when it failed (tool missing, file absent)."""
        section = self.outputs.get(name)
        return section.text if section is not None and section.ok else None

    def nouveau_block(self) -> ModuleBlock:
        return module_block("nouveau", self.modprobe_files, self.cmdline)

    def summary(self) -> dict[str, object]:
        """The node in a few fields, for reports and --json."""
        return {
            "os": {"id": self.os.id, "version": self.os.version, "name": self.os.name, "family": self.os.family},
            "kernel": self.kernel,
            "arch": self.arch,
            "gpus": [{"pci": d.address, "device_id": f"10de:{d.device_id}"} for d in self.gpus],
            "nvswitches": len(self.nvswitches),
            "driver_loaded": self.loaded_driver.version if self.loaded_driver else None,
            "secure_boot": self.secure_boot.enabled,
            "boot_id": self.boot_id,
        }


def facts_from_sections(sections: Mapping[str, Section], nonce: str) -> Facts:
    def text(name: str) -> str:
        section = sections.get(name)
        return section.text if section is not None and section.ok else ""

    uid_text = text("uid").strip()
    files: dict[str, tuple[int, str]] = {}
    for name in FILE_GROUPS:
        section = sections.get(f"files:{name}")
        files.update(split_files(section.text if section is not None else "", nonce))
    return Facts(
        os=parse_os_release(text("os_release")),
        kernel=text("kernel").strip(),
        arch=text("arch").strip(),
        uid=int(uid_text) if uid_text.isdigit() else None,
        boot_id=text("boot_id").strip(),
        cmdline=text("cmdline").strip(),
        modules=parse_modules(text("modules")),
        pci=parse_pci(text("pci")),
        loaded_driver=parse_nvidia_version(text("nvidia_version")),
        tools=parse_tools(text("tools")),
        secure_boot=parse_secure_boot(sections["secure_boot"].text if "secure_boot" in sections else ""),
        files={path: content for path, (_, content) in files.items()},
        mtimes={path: mtime for path, (mtime, _) in files.items()},
        outputs={name: sections[f"cmd:{name}"] for name in COMMANDS if f"cmd:{name}" in sections},
        initramfs_mtime=_newest_initramfs(text("initramfs")),
    )


def _newest_initramfs(text: str) -> int | None:
    stamps = [int(line.split()[0]) for line in text.splitlines() if line.split() and line.split()[0].isdigit()]
    return max(stamps) if stamps else None


def facts_from_probe_output(output: str, nonce: str) -> Facts:
    return facts_from_sections(split_sections(output, nonce), nonce)


def gather(conn: Connection) -> Facts:
    """Run the probe on the node and parse it. The probe only reads; it runs as root when root is available
    (root-only configs such as a 0600 containerd config.toml must not look empty), else as the login user."""
    script, nonce = build_probe()
    try:
        result = conn.run(script, sudo=True, timeout=120)
    except CommandError:
        result = conn.run(script, timeout=120)
    sections = split_sections(result.stdout, nonce)
    if "os_release" not in sections:
        raise CommandError(f"{conn.name}: the fact probe printed nothing usable (exit {result.exit_code})",
                           fix="check that the node has a POSIX /bin/sh and core utilities",
                           stdout=result.stdout, stderr=result.stderr)
    return facts_from_sections(sections, nonce)
