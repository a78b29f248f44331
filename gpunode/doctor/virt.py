"""Hardware layer, virtual machines and passthrough: a GPU whose firmware (or VM firmware) could not place its BARs
(its memory window, 16 GB to 128 GB on data-center GPUs, needs 64-bit MMIO space above 4 GB) or left a Resizable BAR1
smaller than the GPU offers; on a host passing GPUs to VMs, the IOMMU, the GPU's IOMMU group and interrupt
remapping; and the driver flavour (vGPU guest driver, vGPU Manager, data-center driver) against how the GPU is
attached. The hypervisor comes from systemd-detect-virt or DMI (gpunode.facts.virt); its own fixes from
data/passthrough.csv."""

from __future__ import annotations

from gpunode import fixes, passthrough
from gpunode.doctor.base import NO_GPU, Node, Verdict, check, failed, passed, skipped, warned
from gpunode.doctor.hardware import LICENCE_FIX
from gpunode.explain.finding import Finding
from gpunode.facts import virt as virt_facts
from gpunode.facts.virt import Virt

BARE_METAL_FIX = ("enable 'Above 4G decoding' (64-bit MMIO above 4 GB; also called MMIOH or Memory Mapped I/O above "
                  "4GB) in the BIOS setup, then reboot")
GENERIC_VM_FIX = ("give the VM's firmware 64-bit MMIO space above 4 GB larger than the memory of its GPUs (UEFI "
                  "firmware, the hypervisor's 64-bit MMIO / PCI hole setting), then restart the VM")
BAR_IDS = ("kernel.bar-invalid", "kernel.bar-unassigned")
HYPERV_MMIO_IDS = ("virt.hyperv-mmio-too-small",)  # hv_pci: the VM's MMIO space cannot hold an assigned device's BARs


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


def _hyperv_fix() -> str:
    hyperv = passthrough.by_virt("microsoft")
    return f"{hyperv.name}: {hyperv.bar_fix}" if hyperv else GENERIC_VM_FIX


@check("hw.passthrough-bars", "hardware", "GPU memory window (BAR) placed, VM passthrough included")
def passthrough_bars(node: Node) -> Verdict:
    """A GPU whose BAR0 (registers) or BAR1 (memory window) has no address cannot be driven: nvidia.ko refuses it
    ('This PCI I/O region assigned to your NVIDIA device is invalid'). In a VM that is the hypervisor's virtual
    firmware lacking 64-bit MMIO space, fixed on the hypervisor; on bare metal a BIOS setting. A Hyper-V guest whose
    MMIO space cannot hold an assigned device never sees the GPU at all: hv_pci's 'Need ... of high MMIO space'."""
    hv_mmio = [f for f in node.kernel_findings if f.id in HYPERV_MMIO_IDS]
    if not node.has_gpu:
        if hv_mmio:  # a GPU given to a Hyper-V VM whose MMIO space cannot hold it never reaches the guest's PCI bus
            return failed(f"kernel log: {hv_mmio[0].excerpt[:240]}: no NVIDIA GPU is visible because Hyper-V gave "
                          "this VM too little MMIO space for the device assigned to it", _hyperv_fix(), reboot=True)
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
        if hv_mmio:
            return failed(f"kernel log: {hv_mmio[0].excerpt[:240]}: Hyper-V gave this VM too little MMIO space for a "
                          "device assigned to it", _hyperv_fix(), reboot=True)
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


# --- BAR1 against the GPU's memory --------------------------------------------------------------------------------

BAR1_SMALL_IDS = ("kernel.bar1-no-space",)
BAR1_LOST_IDS = ("kernel.bar1-realloc-failed",)
BARE_METAL_REBAR_FIX = ("enable 'Above 4G decoding' and 'Re-Size BAR Support' (Resizable BAR) in the BIOS setup, "
                        "then reboot: the driver enlarges BAR1 at load when there is room")


def _bar1_fix(v: Virt) -> str:
    return BARE_METAL_REBAR_FIX if not v.is_vm else _fix(v)


@check("hw.bar1-size", "hardware", "GPU memory window (BAR1) as large as the GPU offers")
def bar1_size(node: Node) -> Verdict:
    """BAR1 is the CPU's and other devices' window on the GPU's memory. A Resizable-BAR GPU offers a BAR1 as large
    as its memory, but keeps the small default (256 MiB) when the firmware or the VM's firmware has no 64-bit MMIO
    space for more: CUDA still works, peer-to-peer, GPUDirect RDMA and other large-BAR users are limited. When the
    driver lost BAR1 while resizing it, the GPU is unusable."""
    if not node.has_gpu:
        return NO_GPU
    v: Virt = node.facts[virt_facts.VIRT]
    lost = [f for f in node.kernel_findings if f.id in BAR1_LOST_IDS]
    if lost:
        return failed(f"kernel log: {lost[0].excerpt[:240]}{_where(v)}", _bar1_fix(v), reboot=True)
    small, sizes = [], []
    for gpu in v.gpus:
        bar1 = gpu.bar(1)
        if bar1 is None or not bar1.assigned:
            continue  # hw.passthrough-bars reports a BAR without an address
        memory = f", memory {_size(gpu.memory_mib << 20)}" if gpu.memory_mib else ""
        sizes.append(f"{gpu.address} BAR1 {_size(bar1.size)}{memory}")
        wanted = gpu.bar1_max
        if gpu.memory_mib:
            wanted = min(wanted, 1 << (((gpu.memory_mib << 20) - 1).bit_length())) if wanted else 0
        if wanted and bar1.size < wanted:
            small.append(f"GPU {gpu.address}: BAR1 is {_size(bar1.size)}, the GPU offers {_size(gpu.bar1_max)}"
                         + memory)
    if small:
        return warned("; ".join(small) + f"{_where(v)}: the firmware did not enlarge the memory window (Resizable "
                      "BAR off, or no 64-bit MMIO space left); CUDA works, peer-to-peer and GPUDirect RDMA are "
                      "limited", _bar1_fix(v), reboot=True)
    logged = [f for f in node.kernel_findings if f.id in BAR1_SMALL_IDS]
    if logged:
        return warned(f"kernel log: {logged[0].excerpt[:240]}{_where(v)}", _bar1_fix(v), reboot=True)
    if not sizes:
        return skipped("the GPUs' BAR1 sizes are unknown (no placed BAR1 in /sys/bus/pci/devices/*/resource)")
    return passed("BAR1 as large as each GPU offers: " + ", ".join(sizes))


# --- the host side of passthrough: IOMMU groups and interrupt remapping -------------------------------------------

VFIO_OK = ("", "vfio-pci", "pci-stub", "pcieport")  # drivers a viable IOMMU group may hold (Documentation/vfio)
NO_IR_IDS = ("virt.no-interrupt-remapping",)
IR_OFF_IDS = ("virt.interrupt-remapping-off",)  # the kernel left interrupt remapping off at boot (firmware, erratum)
DMA_FAULT_IDS = ("virt.iommu-dma-fault",)
INTR_FAULT_IDS = ("virt.intr-remap-fault",)
VFIO_MAP_IDS = ("virt.vfio-memlock", "virt.vfio-iova-above-iommu")  # vfio could not map a VM's memory for its device
NO_INTREMAP_ARGS = ("intremap=off", "nointremap")  # kernel-parameters.txt: both turn interrupt remapping off
IOMMU_PT_FIX = ("boot the host with iommu=pt on the kernel command line (Debian/Ubuntu: GRUB_CMDLINE_LINUX in "
                "/etc/default/grub, then update-grub; RHEL/Fedora: grubby --update-kernel=ALL --args=iommu=pt) so the "
                "GPUs it drives itself bypass DMA translation, then reboot")


def _host(v: Virt) -> passthrough.Hypervisor | None:
    """The hypervisor this node is the host of: Xen's dom0 says xen; a Linux host passing GPUs is KVM."""
    return passthrough.by_virt("xen" if v.detected == "xen" else "kvm")


def _iommu_fix(v: Virt) -> str:
    host = _host(v)
    return f"{host.name} host: {host.iommu_fix}" if host else "enable the IOMMU (VT-d / AMD-Vi) in the firmware"


@check("hw.iommu", "hardware", "IOMMU and interrupt remapping for GPUs passed to VMs")
def iommu(node: Node) -> Verdict:
    """On a host that passes GPUs to VMs (a GPU bound to vfio-pci), vfio needs the IOMMU on, every device of the
    GPU's IOMMU group bound to vfio-pci (or to nothing; bridges excepted), and interrupt remapping, or QEMU stops
    with 'group N is not viable' / 'no iommu_group found' / 'No interrupt remapping support'; interrupt remapping
    turned off on the kernel command line (intremap=off, nointremap) or left off at boot (firmware, erratum) warns,
    and vfio failing to map a VM's memory (the locked-memory limit, an address above the IOMMU's width) fails. On
    any GPU node, the kernel log's IOMMU faults naming a GPU warn: DMA (DMAR / AMD-Vi IO_PAGE_FAULT) or an interrupt
    (DMAR INTR-REMAP) the IOMMU blocked."""
    if not node.has_gpu:
        return NO_GPU
    v: Virt = node.facts[virt_facts.VIRT]
    no_ir = [f for f in node.kernel_findings if f.id in NO_IR_IDS]
    passed_gpus = [g for g in v.gpus if g.driver == "vfio-pci"]
    if no_ir:
        return failed(f"kernel log: {no_ir[0].excerpt[:240]}: vfio refuses to assign devices without interrupt "
                      "remapping", _iommu_fix(v), reboot=True)
    faults = [(f, g) for f in node.kernel_findings if f.id in DMA_FAULT_IDS for g in v.gpus
              if f.values.get("device") and g.address.endswith(str(f.values["device"]))]  # DMAR names bus:dev.fn only
    if faults:
        fault, gpu = faults[0]
        fix = _iommu_fix(v) if gpu.driver == "vfio-pci" else IOMMU_PT_FIX
        return warned(f"kernel log: {fault.excerpt[:240]}: the IOMMU blocked a DMA transfer of GPU {gpu.address}",
                      fix, reboot=True)
    blocked = [(f, g) for f in node.kernel_findings if f.id in INTR_FAULT_IDS for g in v.gpus
               if g.address.lower().endswith(f"{f.values.get('bus')}:{f.values.get('slot')}".lower())]
    if blocked:
        fault, gpu = blocked[0]
        return warned(f"kernel log: {fault.excerpt[:240]}: the IOMMU's interrupt remapping blocked an interrupt of "
                      f"GPU {gpu.address}; its driver loses that interrupt", _finding_fix(fault), reboot=True)
    if not passed_gpus:
        return skipped("no GPU is bound to vfio-pci: this node passes no GPU to a VM")
    mapping = [f for f in node.kernel_findings if f.id in VFIO_MAP_IDS]
    if mapping:
        return failed(f"kernel log: {mapping[0].excerpt[:240]}: vfio could not map a VM's memory for its passed-"
                      f"through device ({mapping[0].title})", _finding_fix(mapping[0]))
    names = ", ".join(g.address for g in passed_gpus)
    if v.iommu_groups == 0 or any(not g.group for g in passed_gpus):
        return failed(f"GPU {names} is bound to vfio-pci but the kernel made no IOMMU groups: the IOMMU is off, so "
                      "no VM can get the GPU", _iommu_fix(v), reboot=True)
    blocking = [f"{m.address} ({m.driver})" for g in passed_gpus for m in g.members
                if m.driver not in VFIO_OK and not m.is_bridge]
    if blocking:
        return failed(f"IOMMU group of GPU {names} is not viable: {', '.join(sorted(set(blocking)))} still "
                      "bound to a host driver", _iommu_fix(v), reboot=True)
    turned_off = [a for a in v.cmdline.split() if a in NO_INTREMAP_ARGS]
    ir_off = [f for f in node.kernel_findings if f.id in IR_OFF_IDS]
    if v.interrupt_remapping is False or v.intel_ir_capable is False or turned_off or ir_off:
        why = ("the Intel IOMMU units lack interrupt remapping" if v.intel_ir_capable is False
               else f"the kernel command line turns interrupt remapping off ({turned_off[0]})" if turned_off
               else f"the kernel left interrupt remapping off (kernel log: {ir_off[0].excerpt[:200]})" if ir_off
               else "no interrupt is remapped (no IR- interrupt chips in /proc/interrupts)")
        fix = (f"remove {turned_off[0]} from the kernel command line (Debian/Ubuntu: GRUB_CMDLINE_LINUX in "
               f"/etc/default/grub, then update-grub; RHEL/Fedora: grubby --update-kernel=ALL --remove-args="
               f"{turned_off[0]}), then reboot" if turned_off
               else "update the server's BIOS/firmware (its DMAR table or a chipset erratum keeps interrupt "
                    "remapping off), then reboot; " + _iommu_fix(v) if ir_off else _iommu_fix(v))
        return warned(f"GPU {names} is ready for vfio, but {why}: vfio refuses to assign it unless "
                      "allow_unsafe_interrupts is set", fix, reboot=True)
    groups = ", ".join(sorted({f"{g.address} group {g.group}" for g in passed_gpus}))
    remap = " and interrupts are remapped" if v.interrupt_remapping else ""
    return passed(f"IOMMU on ({v.iommu_groups} groups){remap}: {groups} viable for passthrough")


def _finding_fix(finding: Finding) -> str:
    """A kernel-log finding's own fix and further steps (its explain row, the one place for them), in order."""
    return " | then: ".join((finding.fix, *finding.also[:3]))


# --- the NVIDIA driver flavour against how the GPU is attached ----------------------------------------------------

@check("hw.vgpu-driver-mode", "hardware", "vGPU or data-center driver matches how the GPU is attached")
def vgpu_driver_mode(node: Node) -> Verdict:
    """A passed-through GPU is driven by the data-center driver; NVIDIA's vGPU (GRID) guest driver also drives it,
    but then needs a licence or it throttles. A vGPU needs the guest driver (hw.vgpu); the vGPU Manager (the host
    driver, 'Host VGPU' mode) belongs on the hypervisor, never inside a VM."""
    if not node.has_gpu:
        return NO_GPU
    if not node.smi_gpus:
        return skipped("virtualization mode unknown: the NVIDIA driver is not loaded or nvidia-smi fails")
    v: Virt = node.facts[virt_facts.VIRT]
    host_mode = [g for g in node.smi_gpus if g.virtualization.lower() == "host vgpu"]
    if host_mode and v.is_vm:
        known = hypervisor(v)
        return failed(f"GPU {host_mode[0].bus} runs NVIDIA's vGPU Manager (Host VGPU mode) inside a VM"
                      f"{' (' + known.name + ')' if known else ''}: the vGPU Manager belongs on the hypervisor host, "
                      "the VM needs the vGPU guest driver (for a vGPU) or the data-center driver (passed through)",
                      fixes.gpunode("install") + "  # the data-center driver, for a passed-through GPU")
    grid_on_pt = [g for g in node.smi_gpus if g.virtualization == "Pass-Through" and g.license]
    unlicensed = [g for g in grid_on_pt if not g.license.lower().startswith("licensed")]
    if unlicensed:
        return warned(f"GPU {unlicensed[0].bus} is passed through and driven by the vGPU (GRID) guest driver, "
                      f"licence status {unlicensed[0].license!r}: unlicensed, it throttles after the grace period",
                      LICENCE_FIX)
    modes = sorted({g.virtualization or "None" for g in node.smi_gpus})
    flavour = " with the vGPU guest driver, licensed" if grid_on_pt else ""
    return passed(f"virtualization mode {', '.join(modes)}{flavour}")
