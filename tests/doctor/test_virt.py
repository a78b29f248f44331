"""gpunode.doctor.virt (hw.passthrough-bars): an unplaced GPU BAR fails with the hypervisor's own fix (from
data/passthrough.csv), or the BIOS setting on bare metal; placed BARs pass with their sizes."""

from __future__ import annotations

import pytest

from gpunode import passthrough
from tests.doctor.fakes import check_results, finished, set_output, smi_q, virt_output

ZERO = "0x0000000000000000 0x0000000000000000 0x0000000000000000"


def _result(output: str | None, log: str = ""):
    node = finished()
    set_output(node, "virt", output)
    if log:
        set_output(node, "doctor_kernel_log", "@source dmesg\n" + log)
    return check_results(node)["hw.passthrough-bars"]


@pytest.mark.parametrize(("detect", "vendor", "product", "setting"), [
    ("vmware", "VMware, Inc.", "VMware7,1", "pciPassthru.64bitMMIOSizeGB"),
    ("kvm", "QEMU", "Standard PC (Q35 + ICH9, 2009)", "X-PciMmio64Mb"),
    ("microsoft", "Microsoft Corporation", "Virtual Machine", "HighMemoryMappedIoSpace"),
    ("xen", "Xen", "HVM domU", "mmio_hole"),
])
def test_an_unplaced_bar_in_a_vm_gets_the_hypervisors_fix(detect, vendor, product, setting):
    result = _result(virt_output(["0000:18:00.0"], detect, vendor, product, bar1=ZERO))
    assert result.status == "fail" and "BAR1 has no address" in result.evidence
    assert setting in result.fix and passthrough.by_virt(detect).name in result.evidence


def test_the_hypervisor_is_read_from_dmi_when_systemd_detect_virt_is_missing():
    result = _result(virt_output(["0000:18:00.0"], "", "VMware, Inc.", "VMware7,1", bar1=ZERO))
    assert result.status == "fail" and "use64bitMMIO" in result.fix


def test_on_bare_metal_the_fix_is_the_bios_setting():
    result = _result(virt_output(["0000:18:00.0"], bar1=ZERO))
    assert result.status == "fail" and "Above 4G decoding" in result.fix and "VM" not in result.evidence


def test_placed_bars_pass_with_their_sizes_and_the_hypervisor():
    result = _result(virt_output(["0000:18:00.0"], "kvm", "QEMU", "Standard PC (Q35 + ICH9, 2009)"))
    assert result.status == "pass" and "BAR1 16 GiB (64-bit)" in result.evidence and "KVM" in result.evidence


def test_without_the_bars_the_kernel_log_still_tells():
    log = ("[    5.0] NVRM: This PCI I/O region assigned to your NVIDIA device is invalid:\n"
           "               NVRM: BAR1 is 0M @ 0x0 (PCI:0000:18:00.0)\n")
    assert _result(None).status == "skip"
    result = _result(None, log)
    assert result.status == "fail" and "BAR1 is 0M" in result.evidence


# --- hw.bar1-size -------------------------------------------------------------------------------------------------

SMALL_BAR1 = "0x00000000c0000000 0x00000000cfffffff 0x000000000014220c"  # 256 MiB, 64-bit prefetchable


def _check(check_id: str, output: str | None, log: str = "", smi: str | None = None):
    node = finished()
    set_output(node, "virt", output)
    if log:
        set_output(node, "doctor_kernel_log", "@source dmesg\n" + log)
    if smi is not None:
        set_output(node, "doctor_gpus", smi)
    return check_results(node)[check_id]


def test_a_resizable_bar1_left_small_warns_with_the_bios_or_hypervisor_fix():
    # the GPU offers 256 MiB to 32 GiB (resource1_resize bits 8-15) and has 24 GiB of memory
    rebar = "~rebar=0xff00\n@mem 00000000:18:00.0, 24576\n"
    bare = _check("hw.bar1-size", virt_output(["0000:18:00.0"], bar1=SMALL_BAR1) + rebar)
    assert bare.status == "warn" and "BAR1 is 256 MiB, the GPU offers 32 GiB, memory 24 GiB" in bare.evidence
    assert "Re-Size BAR" in bare.fix
    vm = _check("hw.bar1-size", virt_output(["0000:18:00.0"], "kvm", "QEMU", "Standard PC (Q35 + ICH9, 2009)",
                                            bar1=SMALL_BAR1) + rebar)
    assert vm.status == "warn" and "X-PciMmio64Mb" in vm.fix and "KVM" in vm.evidence


def test_a_bar1_as_large_as_the_memory_passes_and_a_fixed_small_one_is_not_blamed():
    full = "0x000000c000000000 0x000000c7ffffffff 0x000000000014220c"  # 32 GiB
    ok = _check("hw.bar1-size", virt_output(["0000:18:00.0"], bar1=full) + "~rebar=0xff00\n"
                "@mem 00000000:18:00.0, 24576\n")
    assert ok.status == "pass" and "BAR1 32 GiB, memory 24 GiB" in ok.evidence
    # no Resizable BAR: 256 MiB is all the GPU has (T4 and most GeForce/older cards); nothing to enlarge
    fixed = _check("hw.bar1-size", virt_output(["0000:18:00.0"], bar1=SMALL_BAR1) + "@mem 00000000:18:00.0, 15360\n")
    assert fixed.status == "pass" and "BAR1 256 MiB, memory 15 GiB" in fixed.evidence


def test_the_kernel_log_tells_a_bar1_resize_that_failed():
    warn = _check("hw.bar1-size", None, "[    5.1] NVRM: No address space to allocate resized BAR1.\n")
    assert warn.status == "warn" and "No address space" in warn.evidence
    fail = _check("hw.bar1-size", None, "[    5.1] NVRM: FATAL: Failed to re-allocate BAR1.\n")
    assert fail.status == "fail" and "Above 4G decoding" not in fail.evidence and fail.fix
    assert _check("hw.bar1-size", None).status == "skip"


# --- hw.iommu -----------------------------------------------------------------------------------------------------

def _host(groups: str = "iommu_groups=42\nir_chips=12\n", members: str = "", driver: str = "vfio-pci") -> str:
    gpu = virt_output(["0000:18:00.0"])
    extra = f"~driver={driver}\n~group=17\n~member=0000:18:00.0 0x030200 {driver}\n" + members
    return groups + gpu + extra


def test_a_passthrough_host_with_a_viable_group_and_remapped_interrupts_passes():
    result = _check("hw.iommu", _host(members="~member=0000:17:00.0 0x060400 pcieport\n"))
    assert result.status == "pass" and "0000:18:00.0 group 17" in result.evidence and "remapped" in result.evidence


def test_the_iommu_off_fails_with_the_hosts_fix():
    result = _check("hw.iommu", _host(groups="iommu_groups=0\nir_chips=0\n"))
    assert result.status == "fail" and "no IOMMU groups" in result.evidence and "intel_iommu=on" in result.fix


def test_a_group_member_still_on_a_host_driver_is_named():
    result = _check("hw.iommu", _host(members="~member=0000:18:00.1 0x040300 snd_hda_intel\n"))
    assert result.status == "fail" and "0000:18:00.1 (snd_hda_intel)" in result.evidence
    assert "vfio-pci.ids" in result.fix


def test_interrupt_remapping_missing_warns_and_vfio_refusing_fails():
    warn = _check("hw.iommu", _host(groups="iommu_groups=42\nir_chips=0\n"))
    assert warn.status == "warn" and "allow_unsafe_interrupts" in warn.evidence
    no_cap = _check("hw.iommu", "dmar_ecap=f02052\n" + _host(groups="iommu_groups=42\n"))  # ecap bit 3 (IR) clear
    assert no_cap.status == "warn" and "lack interrupt remapping" in no_cap.evidence
    log = ("[ 99.0] vfio_iommu_type1_attach_group: No interrupt remapping support.  Use the module param "
           "\"allow_unsafe_interrupts\" to enable VFIO IOMMU support on this platform\n")
    assert _check("hw.iommu", _host(driver="nvidia"), log).status == "fail"


def test_a_node_passing_no_gpu_skips():
    result = _check("hw.iommu", _host(driver="nvidia"))
    assert result.status == "skip" and "vfio-pci" in result.evidence


# --- hw.vgpu-driver-mode ------------------------------------------------------------------------------------------

def test_the_vgpu_guest_driver_on_a_passed_through_gpu_needs_its_licence():
    warn = _check("hw.vgpu-driver-mode", virt_output(["0000:18:00.0"]),
                  smi=smi_q(["0000:18:00.0"], license="Unlicensed (Unrestricted)"))
    assert warn.status == "warn" and "passed through" in warn.evidence and "gridd.conf" in warn.fix
    ok = _check("hw.vgpu-driver-mode", virt_output(["0000:18:00.0"]),
                smi=smi_q(["0000:18:00.0"], license="Licensed (Expiry: 2027-1-1 0:0:0 GMT)"))
    assert ok.status == "pass" and "licensed" in ok.evidence
    plain = _check("hw.vgpu-driver-mode", virt_output(["0000:18:00.0"]), smi=smi_q(["0000:18:00.0"]))
    assert plain.status == "pass" and "Pass-Through" in plain.evidence


def test_the_vgpu_manager_inside_a_vm_fails():
    vm = virt_output(["0000:18:00.0"], "vmware", "VMware, Inc.", "VMware7,1")
    result = _check("hw.vgpu-driver-mode", vm, smi=smi_q(["0000:18:00.0"], virtualization="Host VGPU"))
    assert result.status == "fail" and "VMware ESXi" in result.evidence and "vGPU Manager" in result.evidence
    bare = _check("hw.vgpu-driver-mode", virt_output(["0000:18:00.0"]),
                  smi=smi_q(["0000:18:00.0"], virtualization="Host VGPU"))
    assert bare.status == "pass"  # the hypervisor host itself


def test_an_iommu_fault_naming_a_gpu_warns_with_iommu_pt_and_one_naming_another_device_does_not():
    log = "[ 412.3] DMAR: [DMA Read NO_PASID] Request device [18:00.0] fault addr 0x7f7c1000 [fault reason 0x06] " \
          "PTE Read access is not set\n"
    warn = _check("hw.iommu", _host(driver="nvidia"), log)
    assert warn.status == "warn" and "0000:18:00.0" in warn.evidence and "iommu=pt" in warn.fix
    amd = "[ 9.1] AMD-Vi: Event logged [IO_PAGE_FAULT device=0000:18:00.0 domain=0x000e address=0x7f7c1000 flags=0x0010]\n"
    passed_through = _check("hw.iommu", _host(), amd)  # a GPU given to VMs keeps the IOMMU on: the host's own fix
    assert passed_through.status == "warn" and "iommu=pt" not in passed_through.fix
    other = _check("hw.iommu", _host(driver="nvidia"), log.replace("[18:00.0]", "[3b:00.0]"))
    assert other.status == "skip"


# --- passthrough failures the kernel log shows (issue 26): each with a twin without the decisive line ----------------

HV_MMIO = ("[    2.1] hv_pci 47505500-0001-0000-3130-444531334632: Need 0x802000000 of high MMIO space. Consider "
           "reconfiguring the VM.\n")


def test_a_hyper_v_vm_whose_gpu_never_appeared_for_lack_of_mmio_space_fails_with_set_vm():
    node = finished(count=0)  # hv_pci could not place the assigned GPU: it is on no PCI bus of the guest
    set_output(node, "doctor_kernel_log", "@source dmesg\n" + HV_MMIO)
    result = check_results(node)["hw.passthrough-bars"]
    assert result.status == "fail" and "0x802000000" in result.evidence and "no NVIDIA GPU is visible" in result.evidence
    assert "HighMemoryMappedIoSpace" in result.fix
    twin = finished(count=0)
    set_output(twin, "doctor_kernel_log", "@source dmesg\n[    2.0] hv_vmbus: registering driver hv_pci\n")
    assert check_results(twin)["hw.passthrough-bars"].status == "skip"
    # a GPU whose BARs are placed: the message was about another assigned device, not the GPU
    placed = _result(virt_output(["0000:18:00.0"], "microsoft", "Microsoft Corporation", "Virtual Machine"), HV_MMIO)
    assert placed.status == "pass"


def test_vfio_failing_to_map_a_vms_memory_fails_with_the_rows_own_fix():
    memlock = "[ 88.2] vfio_pin_pages_remote: RLIMIT_MEMLOCK (65536) exceeded\n"
    fail = _check("hw.iommu", _host(members="~member=0000:17:00.0 0x060400 pcieport\n"), memlock)
    assert fail.status == "fail" and "RLIMIT_MEMLOCK (65536)" in fail.evidence and "ulimit -l unlimited" in fail.fix
    assert "LimitMEMLOCK=infinity" in fail.fix
    width = "[ 91.0] DMAR: intel_iommu_map: iommu width (39) is not sufficient for the mapped address (380000000000)\n"
    narrow = _check("hw.iommu", _host(), width)
    assert narrow.status == "fail" and "39 address bits" in narrow.evidence and "host-phys-bits-limit" in narrow.fix
    assert _check("hw.iommu", _host(), "[ 88.2] vfio-pci 0000:18:00.0: enabling device (0000 -> 0003)\n").status == "pass"
    assert _check("hw.iommu", _host(driver="nvidia"), memlock).status == "skip"  # no GPU passed to a VM here


def test_interrupt_remapping_turned_off_by_the_command_line_or_left_off_at_boot_warns_with_its_own_fix():
    cmdline = _check("hw.iommu", "cmdline=BOOT_IMAGE=/vmlinuz intel_iommu=on intremap=off\n" + _host())
    assert cmdline.status == "warn" and "(intremap=off)" in cmdline.evidence and "remove intremap=off" in cmdline.fix
    boot = ("[    0.0252] [Firmware Bug]: ioapic 2 has no mapping iommu, interrupt remapping will be disabled\n"
            "[    0.0252] Failed to enable irq remapping.  You are vulnerable to irq-injection attacks.\n")
    left_off = _check("hw.iommu", _host(groups="iommu_groups=42\n"), boot)  # /proc/interrupts unread
    assert left_off.status == "warn" and "no mapping iommu" in left_off.evidence and "BIOS" in left_off.fix
    twin = _check("hw.iommu", "cmdline=BOOT_IMAGE=/vmlinuz intel_iommu=on\n" + _host(groups="iommu_groups=42\n"))
    assert twin.status == "pass"


def test_an_interrupt_remapping_fault_naming_a_gpu_warns_and_one_naming_another_device_does_not():
    log = ("[ 58.4] DMAR: [INTR-REMAP] Request device [18:00.0] fault index 0x8800 [fault reason 0x26] Blocked an "
           "interrupt request due to source-id verification failure\n")
    warn = _check("hw.iommu", _host(driver="nvidia"), log)
    assert warn.status == "warn" and "GPU 0000:18:00.0" in warn.evidence and "intremap=nosid" in warn.fix
    other = _check("hw.iommu", _host(driver="nvidia"), log.replace("[18:00.0]", "[0x64:0x00.5]"))
    assert other.status == "skip"
