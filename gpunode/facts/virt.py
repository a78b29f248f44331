"""Virtual machine facts: whether the node is a VM and on which hypervisor (systemd-detect-virt, the DMI vendor
and product, the CPU's hypervisor flag), and the BARs of each NVIDIA GPU as the kernel placed them
(/sys/bus/pci/devices/*/resource): a GPU passed through to a VM whose firmware had no room for its memory window
shows an unassigned BAR there. Also, to weigh the memory window against the memory: the BAR1 sizes a Resizable-BAR
GPU offers (sysfs resource1_resize) and each GPU's memory (nvidia-smi, when the driver runs); and for the host side
of passthrough: the kernel driver bound to each GPU, its IOMMU group with every member's class and driver (sysfs), how many IOMMU groups the kernel made, whether interrupts are remapped (the `IR-` interrupt chips in
/proc/interrupts), the Intel IOMMU units' capability registers and the kernel command line."""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpunode.facts.driver import pci_address
from gpunode.facts.registry import SMI_CALL, command
from gpunode.record import Frozen

_M = __name__.rsplit(".", 1)[-1]

IORESOURCE_IO = 0x100
IORESOURCE_MEM = 0x200
IORESOURCE_PREFETCH = 0x2000
IORESOURCE_MEM_64 = 0x100000
IORESOURCE_UNSET = 0x20000000
IORESOURCE_DISABLED = 0x10000000
NOT_A_VM = ("", "none")


@dataclass(frozen=True, eq=False, repr=False)
class Bar(Frozen):
    index: int  # 0-5 (a 64-bit BAR takes two indexes; the second reads as zeros)
    start: int
    size: int  # bytes; 0 when the BAR has no range
    flags: int

    @property
    def is_64bit(self) -> bool:
        return bool(self.flags & IORESOURCE_MEM_64)

    @property
    def assigned(self) -> bool:
        """Has a range the device can be reached at (the kernel found room for it)."""
        return self.size > 0 and self.start > 0 and not self.flags & (IORESOURCE_UNSET | IORESOURCE_DISABLED)


@dataclass(frozen=True, eq=False, repr=False)
class GroupMember(Frozen):
    address: str  # 0000:0b:00.1
    pci_class: int  # 0x040300
    driver: str  # bound kernel driver; "" none

    @property
    def is_bridge(self) -> bool:
        return self.pci_class >> 16 == 0x06  # bridges stay with the host (vfio allows pcieport)


@dataclass(frozen=True, eq=False, repr=False)
class GpuBars(Frozen):
    address: str  # 0000:0b:00.0
    bars: tuple[Bar, ...]  # indexes 0-5, as listed
    device: int = 0  # PCI device id (0x20b0); 0 unknown
    driver: str = ""  # kernel driver bound to it: nvidia, vfio-pci, nouveau; "" none or unknown
    group: str = ""  # IOMMU group number; "" none (no IOMMU) or unknown
    members: tuple[GroupMember, ...] = ()  # every device of that IOMMU group, the GPU included
    memory_mib: int | None = None  # its memory (nvidia-smi memory.total); None unknown
    bar1_sizes: int = 0  # resource1_resize: bit n set = BAR1 can be 2^n MiB (Resizable BAR); 0 not resizable/unknown

    @property
    def bar1_max(self) -> int:
        """The largest BAR1 the GPU offers (bytes), 0 when it has no Resizable BAR (or the kernel does not say)."""
        return (1 << (self.bar1_sizes.bit_length() - 1)) << 20 if self.bar1_sizes else 0

    def bar(self, index: int) -> Bar | None:
        return next((b for b in self.bars if b.index == index), None)


@dataclass(frozen=True, eq=False, repr=False)
class Virt(Frozen):
    detected: str = ""  # systemd-detect-virt --vm: kvm, vmware, microsoft, xen, amazon, ..., "none"; "" unknown
    vendor: str = ""  # /sys/class/dmi/id/sys_vendor
    product: str = ""  # /sys/class/dmi/id/product_name
    cpu_hypervisor: bool = False  # the CPU flags carry "hypervisor"
    gpus: tuple[GpuBars, ...] = ()
    iommu_groups: int | None = None  # entries of /sys/kernel/iommu_groups; None unknown
    ir_chips: int | None = None  # interrupt chips named IR-* in /proc/interrupts (remapped); None unknown
    dmar_ecaps: tuple[int, ...] = ()  # each Intel IOMMU unit's extended capability register
    amd_iommu: bool = False  # an AMD IOMMU unit is registered
    cmdline: str = ""  # /proc/cmdline

    @property
    def interrupt_remapping(self) -> bool | None:
        """Are the host's interrupts remapped by the IOMMU (what vfio needs to assign a device safely)? True when
        remapped interrupt chips exist; False when the IOMMU is on and none do; None when unknown."""
        if self.ir_chips:
            return True
        if self.ir_chips == 0 and self.iommu_groups:
            return False
        return None

    @property
    def intel_ir_capable(self) -> bool | None:
        """Do the Intel IOMMU units support interrupt remapping (ecap bit 3, IR)? None without Intel units."""
        if not self.dmar_ecaps:
            return None
        return all(ecap & (1 << 3) for ecap in self.dmar_ecaps)

    @property
    def is_vm(self) -> bool | None:
        """True on a VM, False on bare metal, None when nothing says (the tools and files were missing)."""
        if self.detected and self.detected not in NOT_A_VM:
            return True
        if self.cpu_hypervisor:
            return True
        if self.detected == "none" or self.vendor:
            return False
        return None


def _int(text: str) -> int:
    try:
        return int(text, 16)
    except ValueError:
        return 0


def parse_bars(lines: list[str]) -> tuple[Bar, ...]:
    """The first six lines of a PCI device's sysfs `resource` file (`start end flags`, hex) -> its BARs."""
    bars = []
    for index, line in enumerate(lines[:6]):
        parts = line.split()
        if len(parts) != 3:
            continue
        start, end, flags = (_int(p) for p in parts)
        size = end - start + 1 if end else 0
        bars.append(Bar(index, start, size, flags))
    return tuple(bars)


def _number(text: str, base: int = 10) -> int | None:
    try:
        return int(text.strip(), base)
    except ValueError:
        return None


def _gpu(address: str, lines: list[str]) -> GpuBars:
    """One `@gpu` block: the resource lines, then `~key=value` lines (device, driver, group, member)."""
    extra: dict[str, str] = {}
    members: list[GroupMember] = []
    for line in lines:
        if not line.startswith("~"):
            continue
        key, _, value = line[1:].partition("=")
        if key == "member":
            parts = value.split()
            if len(parts) >= 2:
                members.append(GroupMember(parts[0], _number(parts[1], 16) or 0, parts[2] if len(parts) > 2 else ""))
        else:
            extra[key] = value.strip()
    bars = parse_bars([line for line in lines if not line.startswith("~")])
    return GpuBars(address, bars, _number(extra.get("device", ""), 16) or 0, extra.get("driver", ""),
                   extra.get("group", ""), tuple(members), None, _number(extra.get("rebar", ""), 16) or 0)


def parse_virt(text: str) -> Virt:
    values: dict[str, str] = {}
    gpus: list[GpuBars] = []
    memory: dict[str, int] = {}  # bus id -> MiB
    ecaps: list[int] = []
    address, lines = "", list[str]()  # the GPU being read, and its lines
    for line in text.splitlines():
        if line.startswith("@mem "):  # nvidia-smi: "00000000:18:00.0, 15360"
            bus, _, mib = line[5:].partition(",")
            size = _number(mib)
            if size is not None:
                memory[pci_address(bus.strip())] = size
        elif line.startswith("@gpu "):
            if address:
                gpus.append(_gpu(address, lines))
            address, lines = line[5:].strip(), []
        elif address and not line.startswith(("iommu_groups=", "ir_chips=", "dmar_ecap=", "amd_iommu=", "cmdline=")):
            lines.append(line)
        elif line.startswith("dmar_ecap="):
            ecap = _number(line.partition("=")[2], 16)
            if ecap is not None:
                ecaps.append(ecap)
        elif "=" in line:
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    if address:
        gpus.append(_gpu(address, lines))
    gpus = [replace(g, memory_mib=memory.get(pci_address(g.address))) for g in gpus]
    return Virt(values.get("detect", "").lower(), values.get("sys_vendor", ""), values.get("product_name", ""),
                values.get("cpu_hypervisor") == "1", tuple(gpus), _number(values.get("iommu_groups", "")),
                _number(values.get("ir_chips", "")), tuple(ecaps), values.get("amd_iommu") == "1",
                values.get("cmdline", ""))


# systemd-detect-virt may be missing (minimal images): DMI and the CPU flag still tell
VIRT = command("virt", (
    "d=$(systemd-detect-virt --vm 2>/dev/null); echo \"detect=$d\"; "
    "for f in sys_vendor product_name; do [ -r /sys/class/dmi/id/$f ] && echo \"$f=$(cat /sys/class/dmi/id/$f)\"; "
    "done; grep -qw hypervisor /proc/cpuinfo 2>/dev/null && echo cpu_hypervisor=1; "
    "[ -d /sys/kernel/iommu_groups ] && echo \"iommu_groups=$(ls /sys/kernel/iommu_groups | wc -l)\"; "
    "[ -r /proc/interrupts ] && echo \"ir_chips=$(grep -c ' IR-' /proc/interrupts)\"; "
    "for u in /sys/class/iommu/*; do [ -r \"$u/intel-iommu/ecap\" ] && echo \"dmar_ecap=$(cat \"$u/intel-iommu/ecap\")\"; "
    "[ -d \"$u/amd-iommu\" ] && echo amd_iommu=1; done; "
    "[ -r /proc/cmdline ] && echo \"cmdline=$(cat /proc/cmdline)\"; "
    "for p in /sys/bus/pci/devices/*; do [ -r \"$p/vendor\" ] || continue; read ven < \"$p/vendor\"; "
    "[ \"$ven\" = 0x10de ] || continue; read cls < \"$p/class\"; case \"$cls\" in 0x03*) ;; *) continue ;; esac; "
    "echo \"@gpu ${p##*/}\"; cat \"$p/resource\" 2>/dev/null; echo \"~device=$(cat \"$p/device\" 2>/dev/null)\"; "
    "[ -r \"$p/resource1_resize\" ] && echo \"~rebar=$(cat \"$p/resource1_resize\")\"; "
    "[ -e \"$p/driver\" ] && d=$(readlink \"$p/driver\") && echo \"~driver=${d##*/}\"; "
    "if [ -e \"$p/iommu_group\" ]; then g=$(readlink \"$p/iommu_group\"); echo \"~group=${g##*/}\"; "
    "for m in \"$p\"/iommu_group/devices/*; do md=; [ -e \"$m/driver\" ] && md=$(readlink \"$m/driver\") && md=${md##*/}; "
    "echo \"~member=${m##*/} $(cat \"$m/class\" 2>/dev/null) $md\"; done; fi; done; "
    # through the probe's nvidia-smi wrapper: a hung nvidia-smi costs one deadline, and none once an earlier
    # section found it hung (registry.SMI_CALL)
    "if command -v nvidia-smi >/dev/null 2>&1; then " + SMI_CALL
    + "m=$(gpunode_smi --query-gpu=pci.bus_id,memory.total --format=csv,noheader,nounits 2>/dev/null) && "
    "printf '%s\\n' \"$m\" | sed 's/^/@mem /'; fi; true"
), parse_virt, module=_M, full_only=True)  # doctor reads it; plan and install never do
