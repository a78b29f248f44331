"""GPU health facts only the doctor reads: per GPU from `nvidia-smi -q`, the ECC mode and error counts, retired
pages, remapped rows and the GSP firmware; the MIG devices `nvidia-smi -L` lists and the MIG layout mig-parted is
told to apply; upgrades the package manager has pending; the node's own reboot-required flag.

Parsers are pure and generalise over driver generations: ECC counters are read by meaning (correctable or not,
volatile or aggregate) from whatever leaves a driver prints (`DRAM Uncorrectable`, `SRAM Uncorrectable SEC-DED`,
`Double Bit / Total` of R4xx), never by position.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpunode.facts.driver import pci_address
from gpunode.facts.registry import Section, command, command_section, smi_output
from gpunode.record import Frozen

_M = "health"

# ---- nvidia-smi -q: ECC, retired pages, remapped rows, GSP ----------------------------------------------------

_BLOCKS = ("GSP Firmware Version", "ECC Mode", "ECC Errors", "Retired Pages", "Remapped Rows")


@dataclass(frozen=True, eq=False, repr=False)
class GpuHealth(Frozen):
    bus: str  # 0000:10:1c.0
    gsp: str | None = None  # GSP firmware version; None: N/A (GSP not used) or not reported
    ecc_current: str = ""  # Enabled | Disabled | N/A ("" not reported)
    ecc_pending: str = ""
    volatile_uncorrectable: int | None = None  # since the driver loaded; None: N/A
    volatile_correctable: int | None = None
    aggregate_uncorrectable: int | None = None  # over the GPU's life
    retired_double_bit: int | None = None  # pages retired for double-bit errors (pre-Ampere)
    retired_pending: bool = False  # a page waits for a reboot to be retired
    remapped_uncorrectable: int | None = None  # rows remapped for uncorrectable errors (Ampere and newer)
    remap_pending: bool = False  # a remap waits for a GPU reset
    remap_failed: bool = False  # the bank ran out of spare rows: the GPU must be replaced
    remap_reported: bool = False  # the GPU has row remapping at all (not N/A)


def _number(value: str) -> int | None:
    value = value.strip()
    return int(value) if value.isdigit() else None


def _add(total: int | None, value: int | None) -> int | None:
    if value is None:
        return total
    return value if total is None else total + value


def _ecc_kind(path: tuple[str, ...]) -> str | None:
    """"u" (uncorrectable) or "c" (correctable) for one ECC counter's path, None for a sub-total to skip."""
    words = " ".join(path).lower()
    if "uncorrectable" in words or "double bit" in words:
        return "u"
    if "correctable" in words or "single bit" in words:
        return "c"
    return None


def _counter_leaves(rows: list[tuple[tuple[str, ...], str]]) -> list[tuple[tuple[str, ...], str]]:
    """Of the R4xx layout (`Double Bit` / `Device Memory`, ..., `Total`) keep only the `Total` of each group."""
    groups_with_total = {path[:-1] for path, _ in rows if path[-1].lower() == "total"}
    return [(path, value) for path, value in rows if path[:-1] not in groups_with_total or path[-1].lower() == "total"]


def _gpu_health(bus: str, rows: list[tuple[tuple[str, ...], str]]) -> GpuHealth:
    fields: dict[str, object] = {}
    counters: list[tuple[tuple[str, ...], str]] = []
    for path, value in rows:
        head = path[0]
        if head == "GSP Firmware Version":
            fields["gsp"] = None if value in ("", "N/A") else value
        elif head == "ECC Mode" and len(path) == 2:
            fields["ecc_" + path[1].lower()] = value
        elif head == "ECC Errors" and len(path) >= 3:
            counters.append((path, value))
        elif head == "Retired Pages" and len(path) >= 2:
            key = " ".join(path[1:]).lower()
            if "double bit" in key and "count" not in key and _number(value) is not None:
                fields["retired_double_bit"] = _add(fields.get("retired_double_bit"), _number(value))  # type: ignore[arg-type]
            elif "pending" in key and value.lower() == "yes":
                fields["retired_pending"] = True
        elif head == "Remapped Rows":
            if len(path) == 1:
                continue  # "Remapped Rows : N/A"
            key = path[1].lower()
            fields["remap_reported"] = fields.get("remap_reported", False) or value not in ("", "N/A")
            if key.startswith("uncorrectable"):
                fields["remapped_uncorrectable"] = _number(value)
            elif key == "pending":
                fields["remap_pending"] = value.lower() == "yes"
            elif key.startswith("remapping failure"):
                fields["remap_failed"] = value.lower() == "yes"
    for path, value in _counter_leaves(counters):
        kind, scope = _ecc_kind(path[2:]), path[1].lower()
        if kind is None or scope not in ("volatile", "aggregate"):
            continue
        if kind == "u":
            name = f"{scope}_uncorrectable"
            fields[name] = _add(fields.get(name), _number(value))  # type: ignore[arg-type]
        elif scope == "volatile":
            fields["volatile_correctable"] = _add(fields.get("volatile_correctable"), _number(value))  # type: ignore[arg-type]
    fields.pop("aggregate_correctable", None)
    return GpuHealth(pci_address(bus), **fields)  # type: ignore[arg-type]


def parse_gpu_health(text: str) -> tuple[GpuHealth, ...]:
    """`nvidia-smi -q` text (whole, or the blocks the probe keeps) -> one GpuHealth per `GPU <bus>` block. A
    field's path is the chain of section headers above it, found by indentation."""
    found: list[GpuHealth] = []
    bus: str | None = None
    rows: list[tuple[tuple[str, ...], str]] = []
    stack: list[tuple[int, str]] = []
    for line in text.splitlines():
        if line.startswith("GPU ") and ":" in line:
            if bus is not None:
                found.append(_gpu_health(bus, rows))
            bus, rows, stack = line[4:].strip(), [], []
            continue
        if bus is None or not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        key, colon, value = line.strip().partition(":")
        key = key.strip()
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = tuple(name for _, name in stack) + (key,)
        if colon and value.strip():
            if path[0] in _BLOCKS:
                rows.append((path, value.strip()))
        else:
            stack.append((indent, key))
    if bus is not None:
        found.append(_gpu_health(bus, rows))
    return tuple(found)


# ---- MIG: the devices there are, and the layout mig-parted is configured to apply ------------------------------

_MIG_GPU = re.compile(r"^GPU (\d+): .*\(UUID: (GPU-[^)]+)\)")
_MIG_DEVICE = re.compile(r"^\s+MIG (\S+)\s+Device\s+\d+: \(UUID: (MIG-[^)]+)\)")


@dataclass(frozen=True, eq=False, repr=False)
class MigLayout(Frozen):
    devices: dict[int, tuple[str, ...]]  # GPU index -> MIG profiles of its MIG devices ("1g.10gb", ...)
    selected: str | None = None  # MIG_PARTED_SELECTED_CONFIG of nvidia-mig-manager.service
    config: str = ""  # mig-parted's config file (YAML), when one is selected


def parse_mig(text: str) -> MigLayout:
    """`nvidia-smi -L` lines (GPU lines, indented MIG device lines), then `@selected NAME` and `@config` followed
    by mig-parted's config file."""
    devices: dict[int, list[str]] = {}
    selected = None
    config: list[str] = []
    in_config = False
    gpu: int | None = None
    for line in text.splitlines():
        if in_config:
            config.append(line)
        elif line.startswith("@selected "):
            selected = line.split(" ", 1)[1].strip().strip("\"'") or None
        elif line == "@config":
            in_config = True
        elif match := _MIG_GPU.match(line):
            gpu = int(match[1])
            devices.setdefault(gpu, [])
        elif (match := _MIG_DEVICE.match(line)) and gpu is not None:
            devices[gpu].append(match[1])
    return MigLayout({g: tuple(p) for g, p in devices.items()}, selected, "\n".join(config))


def selected_layout(layout: MigLayout, gpu_count: int) -> dict[int, dict[str, int]] | None:
    """What the selected mig-parted configuration asks for: GPU index -> {profile: count} ({} = MIG disabled).
    None when no configuration is selected or the file does not define it in the form read here (mig-configs ->
    NAME -> list of `devices`, `mig-enabled`, `mig-devices`)."""
    if not layout.selected or not layout.config:
        return None
    lines = [ln.split("#", 1)[0].rstrip() for ln in layout.config.splitlines()]
    start = next((i for i, ln in enumerate(lines) if ln.strip().rstrip(":").strip("\"'") == layout.selected
                  and ln.strip().endswith(":")), None)
    if start is None:
        return None
    indent = len(lines[start]) - len(lines[start].lstrip())
    body = []
    for ln in lines[start + 1:]:
        if ln.strip() and len(ln) - len(ln.lstrip()) <= indent:
            break
        body.append(ln)
    wanted: dict[int, dict[str, int]] = {}
    entries: list[dict[str, object]] = []
    current: dict[str, object] | None = None
    in_devices = False
    for ln in body:
        stripped = ln.strip()
        if not stripped:
            continue
        if stripped.startswith("- "):
            current = {}
            entries.append(current)
            stripped = stripped[2:].strip()
            in_devices = False
        if current is None:
            return None
        key, _, value = stripped.partition(":")
        key, value = key.strip().strip("\"'"), value.strip()
        if key == "devices":
            current["devices"] = value
            in_devices = False
        elif key == "mig-enabled":
            current["enabled"] = value.lower() == "true"
            in_devices = False
        elif key == "mig-devices":
            current["profiles"] = {}
            in_devices = not value or value == "{}"
        elif in_devices and value.isdigit():
            current["profiles"][key] = int(value)  # type: ignore[index]
    for entry in entries:
        devices = str(entry.get("devices", "all"))
        if devices == "all":
            indexes = list(range(gpu_count))
        else:
            found = re.findall(r"\d+", devices)
            if not found:
                return None
            indexes = [int(i) for i in found]
        for index in indexes:
            wanted[index] = dict(entry.get("profiles", {})) if entry.get("enabled") else {}  # type: ignore[call-overload]
    return wanted


# ---- pending upgrades ---------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False, repr=False)
class Upgrade(Frozen):
    name: str
    new: str
    old: str | None = None  # None: a new package (a new kernel is usually one)


_APT_INST = re.compile(r"^Inst (\S+) (?:\[(\S+)\] )?\((\S+)")
_DNF_LINE = re.compile(r"^(\S+?)\.(?:x86_64|aarch64|noarch|i686|ppc64le|s390x)\s+(\S+)\s+\S+\s*$")


def parse_upgrades(section: Section) -> tuple[Upgrade, ...] | None:
    """`apt-get -s dist-upgrade` `Inst` lines, or `dnf -C check-update` package lines (exit 100: updates).
    None when no package manager could be asked."""
    if section.status not in (0, 100):
        return None
    found = []
    for line in section.text.splitlines():
        if match := _APT_INST.match(line):
            found.append(Upgrade(match[1], match[3], match[2]))
        elif (match := _DNF_LINE.match(line)) and not line.startswith(("Last metadata", "Obsoleting")):
            found.append(Upgrade(match[1], match[2]))
    return tuple(found)


def parse_reboot_flag(text: str) -> tuple[str, ...] | None:
    """/var/run/reboot-required (Debian family, written by package scripts): None when absent, else the packages
    listed in reboot-required.pkgs."""
    lines = text.splitlines()
    if not lines or lines[0] != "required":
        return None
    return tuple(ln.strip() for ln in lines[1:] if ln.strip())


# ---- the facts ------------------------------------------------------------------------------------------------

# per GPU from nvidia-smi -q: the GSP firmware line and the ECC, retired-page and remapped-row blocks
GPU_HEALTH = command("doctor_gpu_health", (
    '[ -r /proc/driver/nvidia/version ] && command -v nvidia-smi >/dev/null 2>&1 || exit 3; '
    + smi_output("-q") + " | awk '/^GPU /{print; next} "
    "/^    [^ ]/{h=$0; sub(/^ +/, \"\", h); sub(/ *:.*$/, \"\", h); "
    "k=(h==\"GSP Firmware Version\"||h==\"ECC Mode\"||h==\"ECC Errors\"||h==\"Retired Pages\"||"
    "h==\"Remapped Rows\"); if (k) print; next} /^     +[^ ]/{if (k) print}'"
), parse_gpu_health, module=_M, full_only=True)
# MIG devices as nvidia-smi -L lists them, and the configuration nvidia-mig-manager applies at boot
MIG = command("doctor_mig", (
    '[ -r /proc/driver/nvidia/version ] && command -v nvidia-smi >/dev/null 2>&1 || exit 3; '
    + smi_output("-L") + '; '
    'u="/etc/systemd/system/nvidia-mig-manager.service /etc/systemd/system/nvidia-mig-manager.service.d/*.conf"; '
    'sel=$(cat $u 2>/dev/null | tr " " "\\n" | sed -n "s/.*MIG_PARTED_SELECTED_CONFIG=\\([^\\"]*\\).*/\\1/p" | tail -n 1); '
    'cfg=$(cat $u 2>/dev/null | tr " " "\\n" | sed -n "s/.*MIG_PARTED_CONFIG_FILE=\\([^\\"]*\\).*/\\1/p" | tail -n 1); '
    '[ -n "$cfg" ] || cfg=/etc/nvidia-mig-manager/config.yaml; '
    '[ -n "$sel" ] && echo "@selected $sel" && [ -r "$cfg" ] && echo "@config" && cat "$cfg"; true'
), parse_mig, module=_M, full_only=True)
# upgrades the package manager would install now (simulated: no lock, no change; dnf from its cache only)
UPGRADES = command_section("doctor_upgrades", (
    'if command -v apt-get >/dev/null 2>&1; then '
    'apt-get -s -o Debug::NoLocking=true dist-upgrade 2>/dev/null | grep "^Inst "; exit 0; '
    'elif command -v dnf >/dev/null 2>&1; then dnf -q -C check-update 2>/dev/null; rc=$?; '
    '[ $rc -eq 1 ] && exit 4; exit $rc; fi; exit 3'
), parse_upgrades, module=_M, full_only=True)
# the Debian family's own "a package asks for a reboot" flag
REBOOT_FLAG = command("doctor_reboot_flag", (
    '[ -f /var/run/reboot-required ] && echo required && cat /var/run/reboot-required.pkgs 2>/dev/null; true'
), parse_reboot_flag, module=_M, full_only=True)
