"""Hardware layer, virtual machines: a GPU passed through to a VM whose firmware could not place the GPU's BARs
(its memory window, 16 GB to 128 GB on data-center GPUs, needs 64-bit MMIO space above 4 GB). The hypervisor comes
from systemd-detect-virt or DMI (gpunode.facts.virt); its own fix from data/passthrough.csv."""

from __future__ import annotations

from gpunode import passthrough
from gpunode.doctor.base import NO_GPU, Node, Verdict, check, failed, passed, skipped
from gpunode.facts import virt as virt_facts
from gpunode.facts.virt import Virt

BARE_METAL_FIX = ("enable 'Above 4G decoding' (64-bit MMIO above 4 GB; also called MMIOH or Memory Mapped I/O above "
                  "4GB) in the BIOS setup, then reboot")
GENERIC_VM_FIX = ("give the VM's firmware 64-bit MMIO space above 4 GB larger than the memory of its GPUs (UEFI "
                  "firmware, the hypervisor's 64-bit MMIO / PCI hole setting), then restart the VM")
BAR_IDS = ("kernel.bar-invalid", "kernel.bar-unassigned")


def _size(size: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift} {unit}"
    return f"{size} B"


def hypervisor(v: Virt) -> passthrough.Hypervisor | None:
    return passthrough.by_virt(v.detected) or (passthrough.in_text(f"{v.vendor} {v.product}") if v.is_vm else None)


def _where(v: Virt) -> str:
    if not v.is_vm:
        return "" if v.is_vm is False else " (bare metal or VM: unknown)"
    known = hypervisor(v)
    return f" in this {known.name} VM" if known else f" in this VM ({v.detected or v.vendor or 'hypervisor unknown'})"


def _fix(v: Virt) -> str:
    if not v.is_vm:
        return BARE_METAL_FIX
    known = hypervisor(v)
    return f"{known.name}: {known.bar_fix}" if known else GENERIC_VM_FIX


@check("hw.passthrough-bars", "hardware", "GPU memory window (BAR) placed, VM passthrough included")
def passthrough_bars(node: Node) -> Verdict:
    """A GPU whose BAR0 (registers) or BAR1 (memory window) has no address cannot be driven: nvidia.ko refuses it
    ('This PCI I/O region assigned to your NVIDIA device is invalid'). In a VM that is the hypervisor's virtual
    firmware lacking 64-bit MMIO space, fixed on the hypervisor; on bare metal a BIOS setting."""
    if not node.has_gpu:
        return NO_GPU
    v: Virt = node.facts[virt_facts.VIRT]
    broken = []
    for gpu in v.gpus:
        for index in (0, 1):
            bar = gpu.bar(index)
            if bar is None or not bar.assigned:
                broken.append(f"GPU {gpu.address}: BAR{index} has no address"
                              + (f" ({_size(bar.size)} needed)" if bar is not None and bar.size else ""))
    if not v.gpus:
        logged = [f for f in node.kernel_findings if f.id in BAR_IDS]
        if logged:
            return failed(f"kernel log: {logged[0].excerpt[:240]}{_where(v)}", _fix(v))
        return skipped("the GPUs' BARs are unknown (no /sys/bus/pci/devices/*/resource in the probe)")
    if broken:
        return failed("; ".join(broken) + f"{_where(v)}: the firmware had no room for the GPU's memory window, so "
                      "the NVIDIA driver cannot use it", _fix(v), reboot=True)
    windows = []
    for gpu in v.gpus:
        bar1 = gpu.bar(1)
        if bar1 is not None:
            windows.append(f"{gpu.address} BAR1 {_size(bar1.size)}{' (64-bit)' if bar1.is_64bit else ''}")
    where = _where(v)
    return passed(("every GPU's BARs are placed: " + ", ".join(windows)) + (f"{where}, GPU passed through" if v.is_vm
                                                                            else where))
