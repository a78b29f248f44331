"""Virtual machine facts: whether the node is a VM and on which hypervisor (systemd-detect-virt, the DMI vendor
and product, the CPU's hypervisor flag), and the BARs of each NVIDIA GPU as the kernel placed them
(/sys/bus/pci/devices/*/resource): a GPU passed through to a VM whose firmware had no room for its memory window
shows an unassigned BAR there."""

from __future__ import annotations

from dataclasses import dataclass

from gpunode.facts.registry import command

_M = __name__.rsplit(".", 1)[-1]

IORESOURCE_IO = 0x100
IORESOURCE_MEM = 0x200
IORESOURCE_PREFETCH = 0x2000
IORESOURCE_MEM_64 = 0x100000
IORESOURCE_UNSET = 0x20000000
IORESOURCE_DISABLED = 0x10000000
NOT_A_VM = ("", "none")


@dataclass(frozen=True)
class Bar:
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


@dataclass(frozen=True)
class GpuBars:
    address: str  # 0000:0b:00.0
    bars: tuple[Bar, ...]  # indexes 0-5, as listed

    def bar(self, index: int) -> Bar | None:
        return next((b for b in self.bars if b.index == index), None)


@dataclass(frozen=True)
class Virt:
    detected: str = ""  # systemd-detect-virt --vm: kvm, vmware, microsoft, xen, amazon, ..., "none"; "" unknown
    vendor: str = ""  # /sys/class/dmi/id/sys_vendor
    product: str = ""  # /sys/class/dmi/id/product_name
    cpu_hypervisor: bool = False  # the CPU flags carry "hypervisor"
    gpus: tuple[GpuBars, ...] = ()

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


def parse_virt(text: str) -> Virt:
    values: dict[str, str] = {}
    gpus: list[GpuBars] = []
    address, lines = "", list[str]()  # the GPU being read, and its resource lines
    for line in text.splitlines():
        if line.startswith("@gpu "):
            if address:
                gpus.append(GpuBars(address, parse_bars(lines)))
            address, lines = line[5:].strip(), []
        elif address:
            lines.append(line)
        elif "=" in line:
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    if address:
        gpus.append(GpuBars(address, parse_bars(lines)))
    return Virt(values.get("detect", "").lower(), values.get("sys_vendor", ""), values.get("product_name", ""),
                values.get("cpu_hypervisor") == "1", tuple(gpus))


# systemd-detect-virt may be missing (minimal images): DMI and the CPU flag still tell
VIRT = command("virt", (
    "d=$(systemd-detect-virt --vm 2>/dev/null); echo \"detect=$d\"; "
    "for f in sys_vendor product_name; do [ -r /sys/class/dmi/id/$f ] && echo \"$f=$(cat /sys/class/dmi/id/$f)\"; "
    "done; grep -qw hypervisor /proc/cpuinfo 2>/dev/null && echo cpu_hypervisor=1; "
    "for p in /sys/bus/pci/devices/*; do [ -r \"$p/vendor\" ] || continue; read ven < \"$p/vendor\"; "
    "[ \"$ven\" = 0x10de ] || continue; read cls < \"$p/class\"; case \"$cls\" in 0x03*) ;; *) continue ;; esac; "
    "echo \"@gpu ${p##*/}\"; cat \"$p/resource\" 2>/dev/null; done; true"
), parse_virt, module=_M)
