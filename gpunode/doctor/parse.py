"""Pure parsers for the probe sections only the doctor reads (`doctor_*` in gpunode/facts/probe.py).

Everything else the doctor needs is parsed where it already is: the driver state in gpunode/steps/driver.py,
packages and units in gpunode/facts/packages.py, engine configuration in gpunode/facts/containers.py.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpunode.facts.kernel import DevChar, parse_dev_char  # noqa: F401 - the doctor's /dev/char check reads these


def pci_address(bus: str) -> str:
    """nvidia-smi's 00000000:00:1E.0 and the kernel's 0000:00:1e.0 -> 0000:00:1e.0 (also for a bare 00:1e.0)."""
    parts = bus.strip().lower().split(":")
    if len(parts) == 2:
        parts = ["0000", *parts]
    if len(parts) != 3:
        return bus.strip().lower()
    domain = parts[0][-4:].rjust(4, "0")
    return f"{domain}:{parts[1]}:{parts[2] if '.' in parts[2] else parts[2] + '.0'}"


# ---- nvidia-smi -q ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SmiGpu:
    index: int  # position in nvidia-smi's output: NVML's index, what --gpus device=N and ctr --gpus N mean
    bus: str  # 0000:00:1e.0
    name: str = ""
    brand: str = ""
    uuid: str = ""
    persistence: str = ""  # Enabled | Disabled
    mig_current: str = ""  # Enabled | Disabled | N/A ("" when not reported)
    mig_pending: str = ""
    virtualization: str = ""  # None | Pass-Through | VGPU | Host VGPU | ...
    license: str = ""  # vGPU guests: "Licensed (Expiry: ...)" | "Unlicensed ..."


_SECTION_KEYS = {("MIG Mode", "Current"): "mig_current", ("MIG Mode", "Pending"): "mig_pending",
                 ("GPU Virtualization Mode", "Virtualization Mode"): "virtualization",
                 ("vGPU Software Licensed Product", "License Status"): "license"}
_TOP_KEYS = {"Product Name": "name", "Product Brand": "brand", "GPU UUID": "uuid", "Persistence Mode": "persistence"}


def parse_gpus(text: str) -> tuple[SmiGpu, ...]:
    """The lines the probe keeps of `nvidia-smi -q`: `GPU <bus>` headers, four-space fields and section
    headers, and eight-space fields of the MIG, virtualization and vGPU licence sections."""
    found: list[SmiGpu] = []
    current: dict[str, str] | None = None
    section = ""

    def flush() -> None:
        if current is not None:
            found.append(SmiGpu(len(found), pci_address(current.pop("bus")), **current))

    for line in text.splitlines():
        if line.startswith("GPU "):
            flush()
            current, section = {"bus": line[4:].strip()}, ""
            continue
        if current is None or not line.strip():
            continue
        key, colon, value = line.strip().partition(":")
        key, value = key.strip(), value.strip()
        if line.startswith("        "):
            name = _SECTION_KEYS.get((section, key))
            if name:
                current[name] = value
        elif line.startswith("    "):
            if colon and key in _TOP_KEYS:
                current[_TOP_KEYS[key]] = value
                section = ""
            else:
                section = key
    flush()
    return tuple(found)


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


# ---- engines, CDI, CUDA toolkits ----------------------------------------------------------------------------

_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def parse_engine_versions(text: str) -> dict[str, tuple[int, ...]]:
    """`docker Docker version 24.0.7, build afdd53b` -> {"docker": (24, 0, 7)}; also dockerd and podman."""
    found: dict[str, tuple[int, ...]] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        match = _VERSION.search(rest)
        if name and match:
            found[name] = tuple(int(g) for g in match.groups() if g is not None)
    return found


def parse_cdi(text: str) -> list[tuple[str, str | None]]:
    """`spec PATH [libnvidia-ml.so.VERSION]` -> [(path, driver version the spec mounts, or None)]."""
    specs = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "spec":
            version = parts[2].split("libnvidia-ml.so.", 1)[1] if len(parts) > 2 and "so." in parts[2] else None
            specs.append((parts[1], version))
    return specs


def parse_cuda_toolkits(files: Mapping[str, str]) -> dict[str, list[str]]:
    """/usr/local/cuda*/version.json ({"cuda": {"version": "12.4.1"}}) or version.txt ("CUDA Version 10.1.243")
    -> {version: [directories]} (/usr/local/cuda is usually a link to one of the others)."""
    found: dict[str, list[str]] = {}
    for path, text in sorted(files.items()):
        if not path.startswith("/usr/local/cuda") or not path.endswith(("/version.json", "/version.txt")):
            continue
        version = None
        if path.endswith(".json"):
            try:
                data = json.loads(text)
                version = data.get("cuda", {}).get("version") if isinstance(data, dict) else None
            except (ValueError, AttributeError):
                version = None
        else:
            match = re.search(r"CUDA Version\s+(\d+\.\d+(?:\.\d+)?)", text)
            version = match[1] if match else None
        if isinstance(version, str) and _VERSION.fullmatch(version):
            found.setdefault(version, []).append(path.rsplit("/", 1)[0])
    return found
