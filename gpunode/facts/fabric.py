"""NVLink fabric facts: NVSwitches the driver bound, NVLink-5 switch trays, the fabric state per GPU, fabric
manager's log, and the fabric manager versions and locks the package manager knows (NVSwitch nodes only)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpunode.fabric_packages import PACKAGE, all_names
from gpunode.facts.packages import parse_versionlock
from gpunode.facts.registry import command, smi_output, words
from gpunode.record import Frozen

_M = __name__.rsplit(".", 1)[-1]

FM_PACKAGE = PACKAGE  # the service packages, not the -dev / -devel SDK
SETTLED = ("Completed",)
UNSET = ("", "N/A", "Not Supported", "[N/A]")

# ---- versions the repositories offer ---------------------------------------------------------------------------

_POLICY_VERSION = re.compile(r"^\s+(?:\*\*\* )?(\S+) -?\d+$")
_DNF_LINE = re.compile(r"^(\S+)\.(?:x86_64|aarch64|noarch)\s+(\S+)\s+\S+")


def parse_available(text: str) -> dict[str, list[str]]:
    """`apt-cache policy NAME...` or `dnf list --showduplicates NAME...` -> {name: versions offered}."""
    offered: dict[str, list[str]] = {}
    name = None
    for line in text.splitlines():
        if line and not line[0].isspace() and line.endswith(":") and " " not in line:
            name = line[:-1]
            continue
        match = _DNF_LINE.match(line)
        if match:
            offered.setdefault(match[1], []).append(match[2].split(":", 1)[-1])
            continue
        match = _POLICY_VERSION.match(line)
        if name and match and not match[1].isdigit():
            offered.setdefault(name, []).append(match[1])
    return offered


# ---- the fabric as nvidia-smi -q reports it ------------------------------------------------------------------


@dataclass(frozen=True, eq=False, repr=False)
class FabricGpu(Frozen):
    gpu: str  # PCI bus id as nvidia-smi prints it
    state: str  # Not Supported | Not Started | In Progress | Completed | N/A
    status: str  # Success | an NVML error | N/A
    cluster_uuid: str = ""

    @property
    def settled(self) -> bool:
        return self.state in SETTLED and self.status in ("Success", *UNSET)

    @property
    def reported(self) -> bool:
        return self.state not in UNSET and self.state != "Not Supported"


def parse_fabric(text: str) -> list[FabricGpu]:
    """The per-GPU `Fabric` blocks of `nvidia-smi -q` (lines `GPU <bus>`, then `    Fabric`, then indented
    `Key : Value` pairs)."""
    gpus: list[FabricGpu] = []
    current: dict[str, str] | None = None
    bus = ""
    for line in text.splitlines():
        if line.startswith("GPU "):
            if current is not None:
                gpus.append(FabricGpu(bus, current.get("State", ""), current.get("Status", ""),
                                      current.get("ClusterUUID", "")))
            bus, current = line[4:].strip(), None
        elif line.strip() == "Fabric":
            current = {}
        elif current is not None and ":" in line and line.startswith("        ") and not line.startswith("            "):
            key, _, value = line.partition(":")
            current[key.strip()] = value.strip()
    if current is not None:
        gpus.append(FabricGpu(bus, current.get("State", ""), current.get("Status", ""), current.get("ClusterUUID", "")))
    return gpus


def off_host_fabric(fabric: list[FabricGpu]) -> bool:
    """Multi-node NVLink (GB200/GB300 NVL racks): the switch trays run fabric management, and the GPUs report
    the cluster they were placed in."""
    return any(g.cluster_uuid not in UNSET and set(g.cluster_uuid) - set("0-") for g in fabric)


# ---- the facts ------------------------------------------------------------------------------------------------

# NVSwitches the loaded driver has bound (before it loads, PCI class 0x0680 is the evidence). No `ls` where the
# directory is not (most nodes): it would fail there (status 2), as the test does (status 1); both read as none
NVSWITCH_DEVICES = command("nvswitch_devices", (
    "[ -d /proc/driver/nvidia-nvswitch/devices ] && ls -1 /proc/driver/nvidia-nvswitch/devices"
), words, module=_M)
# NVLink-5 switch trays (HGX B200) show up as InfiniBand devices whose VPD says SW_MNG. No `grep` where no such file
# is (most nodes): it would fail on the unmatched pattern (status 2), as the test does (status 1)
NVLINK5_SWITCHES = command("nvlink5_switches", (
    'set -- /sys/class/infiniband/*/device/vpd; [ -e "$1" ] && grep -l SW_MNG "$@"'
), words, module=_M)
# the per-GPU "Fabric" blocks of nvidia-smi -q; only where a fabric can exist (NVSwitch bound, or Grace)
FABRIC_STATE = command("fabric_state", (
    '[ -r /proc/driver/nvidia/version ] && command -v nvidia-smi >/dev/null 2>&1 || exit 3; '
    '[ -n "$(ls -A /proc/driver/nvidia-nvswitch/devices 2>/dev/null)" ] || [ "$(uname -m)" = aarch64 ] || exit 3; '
    + smi_output("-q") + " | awk '/^GPU /{print; next} /^    Fabric *$/{f=1; print; next} "
    "f && /^        /{print; next} {f=0}'"
), parse_fabric, module=_M)
FABRICMANAGER_LOG = command("fabricmanager_log", (
    "tail -n 5 /var/log/fabricmanager.log"
), str.strip, module=_M, late=True)
# Is an NVSwitch on the PCI bus (class 0x0680, NVIDIA's vendor id)? `found` says. The two facts below are read on
# NVSwitch nodes only; elsewhere they fail (status 1, nothing printed: their parsers read that as nothing locked,
# nothing offered) without leaving the probe's shell (they exited 3 from a subshell of their own before).
_NVSWITCH = ("found=; for d in /sys/bus/pci/devices/*; do [ -r \"$d/class\" ] || continue; read v < \"$d/vendor\"; "
             'read c < "$d/class"; [ "$v" = 0x10de ] && [ "${c%??}" = 0x0680 ] && found=1; done; ')
# dnf/yum version locks as the plugin reports them (cache only, no metadata refresh), on NVSwitch nodes only
VERSIONLOCKS = command("versionlocks", (
    _NVSWITCH + "if [ -z \"$found\" ] && [ ! -d /proc/driver/nvidia-nvswitch ]; then false; "
    "elif command -v dnf >/dev/null 2>&1; then dnf -q -C versionlock list; "
    "elif command -v yum >/dev/null 2>&1; then yum -q -C versionlock list; else false; fi"
), parse_versionlock, module=_M)
# fabric manager versions the configured repositories offer (local metadata only), on NVSwitch nodes only
FM_AVAILABLE = command("fm_available", (
    _NVSWITCH + "if [ -z \"$found\" ] && [ ! -d /proc/driver/nvidia-nvswitch ]; then false; "
    "elif command -v apt-cache >/dev/null 2>&1; then apt-cache policy " + " ".join(all_names("deb"))
    + " 2>/dev/null; true; elif command -v dnf >/dev/null 2>&1; then dnf -q -C list --showduplicates "
    + " ".join(all_names("rpm")) + " 2>/dev/null; true; "
    "elif command -v yum >/dev/null 2>&1; then yum -q -C list --showduplicates " + " ".join(all_names("rpm"))
    + " 2>/dev/null; true; fi"
), parse_available, module=_M)
