"""Node health facts only the doctor reads: the kernel log and automatic upgrades (installed kernels and DKMS
live in gpunode/facts/kernel.py)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpunode.facts.registry import Section, command, command_section
from gpunode.record import Frozen

_M = __name__.rsplit(".", 1)[-1]

# ---- kernel log ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False, repr=False)
class KernelLog(Frozen):
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


# ---- automatic upgrades -----------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False, repr=False)
class AutoUpgrade(Frozen):
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
), lambda s: parse_kernel_log(_or_none(s)), module=_M, full_only=True)
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
), parse_auto_upgrade, module=_M, full_only=True)


# installed kernels and DKMS moved to gpunode/facts/kernel.py (the driver step reads them too); kept importable
# GPU health (ECC, row remapping, GSP), MIG layout, pending upgrades, the reboot flag: registered by importing
from gpunode.facts import gpuhealth  # noqa: E402,F401
from gpunode.facts.kernel import (  # noqa: E402,F401
    KERNELS,
    DkmsEntry,
    Kernel,
    Kernels,
    kernel_key,
    parse_dkms_status,
    parse_kernels,
)
