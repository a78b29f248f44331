"""gpunode.doctor.virt (hw.passthrough-bars): an unplaced GPU BAR fails with the hypervisor's own fix (from
data/passthrough.csv), or the BIOS setting on bare metal; placed BARs pass with their sizes."""

from __future__ import annotations

import pytest

from gpunode import passthrough
from tests.doctor.fakes import check_results, finished, set_output, virt_output

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
