"""Node health facts only the doctor reads: the kernel log, installed kernels and DKMS, automatic upgrades."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpunode.facts.registry import Section, command, command_section

_M = __name__.rsplit(".", 1)[-1]

# ---- kernel log ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelLog:
    source: str  # dmesg | journal
    text: str  # the NVIDIA-related lines since boot


def parse_kernel_log(text: str | None) -> KernelLog | None:
    """None when neither dmesg nor the journal was readable."""
    if text is None:
        return None
    lines = text.splitlines()
    source = "kernel log"
    if lines and lines[0].startswith("@source "):
        source = lines.pop(0)[len("@source "):].strip()
    return KernelLog(source, "\n".join(lines))


# ---- installed kernels and DKMS -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Kernel:
    name: str  # 5.15.0-91-generic
    headers: bool
    module: str | None  # path of an nvidia.ko built for it


@dataclass(frozen=True)
class DkmsEntry:
    module: str
    version: str
    kernel: str | None  # None: added or built for no kernel yet
    status: str  # installed | built | added | ...


@dataclass(frozen=True)
class Kernels:
    known: bool = False  # the probe ran
    kernels: tuple[Kernel, ...] = ()
    dkms: tuple[DkmsEntry, ...] = ()

    @property
    def newest(self) -> Kernel | None:
        return max(self.kernels, key=lambda k: kernel_key(k.name)) if self.kernels else None

    def built_for(self, kernel: str) -> list[str]:
        """Where an nvidia module for `kernel` comes from: its file, or DKMS's record."""
        found = [k.module for k in self.kernels if k.name == kernel and k.module]
        found += [f"dkms {e.module}/{e.version}" for e in self.dkms
                  if e.module.startswith("nvidia") and e.kernel == kernel and e.status.startswith("installed")]
        return [f for f in found if f]


def kernel_key(name: str) -> tuple[tuple[int, object], ...]:
    """Natural order of kernel release names (5.15.0-100 after 5.15.0-91)."""
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", name) if part)


def parse_dkms_status(text: str) -> tuple[DkmsEntry, ...]:
    """`dkms status` lines of dkms 3 (`nvidia/535.129.03, 5.15.0-91-generic, x86_64: installed`) and dkms 2
    (`nvidia, 535.129.03, 5.15.0-91-generic, x86_64: installed`), or `nvidia/535.129.03: added`."""
    entries = []
    for line in text.splitlines():
        left, colon, status = line.strip().partition(": ")
        if not colon:
            continue
        parts = [p.strip() for p in left.split(",")]
        if "/" in parts[0]:
            module, _, version = parts[0].partition("/")
            rest = parts[1:]
        elif len(parts) >= 2:
            module, version, rest = parts[0], parts[1], parts[2:]
        else:
            continue
        entries.append(DkmsEntry(module, version, rest[0] if rest else None, status.strip().split()[0]))
    return tuple(entries)


def parse_kernels(text: str | None) -> Kernels:
    if text is None:
        return Kernels()
    kernels = []
    dkms_lines = []
    for line in text.splitlines():
        word, _, rest = line.partition(" ")
        if word == "kernel":
            parts = rest.split(" ", 2)
            if len(parts) == 3:
                kernels.append(Kernel(parts[0], parts[1] == "headers", None if parts[2] == "-" else parts[2]))
        elif word == "dkms":
            dkms_lines.append(rest)
    return Kernels(True, tuple(kernels), parse_dkms_status("\n".join(dkms_lines)))


# ---- automatic upgrades -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class AutoUpgrade:
    apt_installed: bool = False  # /usr/bin/unattended-upgrade exists
    apt_periodic: str | None = None  # APT::Periodic::Unattended-Upgrade ("0" off)
    apt_blacklist: tuple[str, ...] = ()  # Unattended-Upgrade::Package-Blacklist (regular expressions)
    apt_origins: tuple[str, ...] = ()  # Allowed-Origins and Origins-Pattern entries
    dnf: Mapping[str, str] = field(default_factory=dict)  # /etc/dnf/automatic.conf: apply_updates, upgrade_type


_APT_LINE = re.compile(r'^(?P<key>[\w:-]+?)(?P<list>::)?\s+"(?P<value>[^"]*)";?\s*$')
_PERIODIC = re.compile(r'APT::Periodic::Unattended-Upgrade\s+"(?P<v>[^"]*)"')
_BLOCK = re.compile(r'Unattended-Upgrade::(?P<key>Package-Blacklist|Allowed-Origins|Origins-Pattern)\s*\{(?P<body>.*?)\}',
                    re.S)


def _strip_comments(text: str) -> str:
    return "\n".join(line.split("//", 1)[0] for line in text.splitlines() if not line.lstrip().startswith("#"))


def parse_auto_upgrade(text: str | None) -> AutoUpgrade:
    """`apt <apt-config dump line>`, or `file PATH` followed by that apt.conf.d file when apt-config is missing;
    `installed unattended-upgrades`; `dnf key = value` from dnf-automatic's configuration."""
    installed = False
    periodic: str | None = None
    lists: dict[str, list[str]] = {"Package-Blacklist": [], "Allowed-Origins": [], "Origins-Pattern": []}
    dnf: dict[str, str] = {}
    raw: list[str] = []
    for line in (text or "").splitlines():
        if line.startswith("apt "):
            match = _APT_LINE.match(line[4:].strip())
            if not match:
                continue
            key = match["key"]
            if key == "APT::Periodic::Unattended-Upgrade":
                periodic = match["value"]
            elif key.startswith("Unattended-Upgrade::") and match["list"] and match["value"]:
                lists.setdefault(key.split("::", 1)[1], []).append(match["value"])
        elif line == "installed unattended-upgrades":
            installed = True
        elif line.startswith("dnf "):
            key, _, value = line[4:].partition("=")
            dnf[key.strip()] = value.strip()
        else:
            raw.append(line)
    if raw:  # apt.conf.d files read as they are (apt-config missing)
        body = _strip_comments("\n".join(raw))
        for match in _PERIODIC.finditer(body):
            periodic = match["v"]
        for match in _BLOCK.finditer(body):
            lists[match["key"]] += re.findall(r'"([^"]*)"', match["body"])
    return AutoUpgrade(installed, periodic, tuple(lists["Package-Blacklist"]),
                       tuple(lists["Allowed-Origins"] + lists["Origins-Pattern"]), dnf)


def _or_none(section: Section) -> str | None:
    return section.text if section.ok else None


# ---- the facts ------------------------------------------------------------------------------------------------

# NVIDIA lines of the kernel log since boot: dmesg, else the journal (dmesg is often root-only); exit 3 when
# neither is readable
KERNEL_LOG = command_section("doctor_kernel_log", (
    'if out=$(dmesg 2>/dev/null) && [ -n "$out" ]; then src=dmesg; '
    'elif command -v journalctl >/dev/null 2>&1 && out=$(journalctl -k -b --no-pager -q 2>/dev/null | '
    'grep -v "^-- ") && [ -n "$out" ]; then src=journal; else exit 3; fi; echo "@source $src"; '
    "printf '%s\\n' \"$out\" | grep -E 'NVRM|Xid|nvidia|nouveau|NVSwitch|nvswitch|Lockdown|unsigned module|"
    "Key was rejected' | tail -n 400; true"
), lambda s: parse_kernel_log(_or_none(s)), module=_M)
# installed kernels (a modules tree with kernel/), their headers and nvidia module; and DKMS's view
KERNELS = command_section("doctor_kernels", (
    'for d in /lib/modules/*; do [ -d "$d/kernel" ] || continue; '
    'm=$(find "$d/" -name "nvidia.ko*" 2>/dev/null | head -n 1); h=-; [ -e "$d/build" ] && h=headers; '
    'echo "kernel ${d##*/} $h ${m:--}"; done; '
    'command -v dkms >/dev/null 2>&1 && dkms status 2>/dev/null | sed "s/^/dkms /"; true'
), lambda s: parse_kernels(_or_none(s)), module=_M)
# automatic upgrades: apt's merged configuration (or its files when apt-config is missing), dnf-automatic's
AUTO_UPGRADE = command("doctor_auto_upgrade", (
    'if command -v apt-config >/dev/null 2>&1; then apt-config dump 2>/dev/null | grep -E '
    '"^(APT::Periodic::Unattended-Upgrade|Unattended-Upgrade::(Package-Blacklist|Allowed-Origins|'
    'Origins-Pattern))" | sed "s/^/apt /"; '
    'elif [ -d /etc/apt/apt.conf.d ]; then for f in /etc/apt/apt.conf.d/*; do [ -f "$f" ] && '
    'grep -q "Unattended-Upgrade" "$f" && { echo "file $f"; cat "$f"; echo; }; done; fi; '
    '[ -e /usr/bin/unattended-upgrade ] && echo "installed unattended-upgrades"; '
    '[ -r /etc/dnf/automatic.conf ] && grep -E "^[[:space:]]*(apply_updates|upgrade_type)" '
    '/etc/dnf/automatic.conf | sed "s/^/dnf /"; true'
), parse_auto_upgrade, module=_M)


# GPU health (ECC, row remapping, GSP), MIG layout, pending upgrades, the reboot flag: registered by importing
from gpunode.facts import gpuhealth  # noqa: E402,F401
