"""gpunode.facts.virt: the hypervisor (systemd-detect-virt, DMI, the CPU flag) and each NVIDIA GPU's BARs from
sysfs."""

from __future__ import annotations

from gpunode.facts.virt import IORESOURCE_UNSET, parse_bars, parse_virt
from tests.doctor.fakes import virt_output

ZERO = "0x0000000000000000 0x0000000000000000 0x0000000000000000"


def test_a_bare_metal_gpu_with_its_memory_window_placed():
    v = parse_virt(virt_output(["0000:18:00.0"]))
    assert v.is_vm is False and v.detected == "none" and v.vendor == "Dell Inc."
    gpu = v.gpus[0]
    assert gpu.address == "0000:18:00.0"
    bar0, bar1 = gpu.bar(0), gpu.bar(1)
    assert bar0 is not None and bar0.assigned and bar0.size == 16 << 20 and not bar0.is_64bit
    assert bar1 is not None and bar1.assigned and bar1.size == 16 << 30 and bar1.is_64bit
    assert gpu.bar(2) is not None and not gpu.bar(2).assigned  # the upper half of the 64-bit BAR1


def test_a_vm_whose_firmware_left_bar1_unplaced():
    v = parse_virt(virt_output(["0000:0b:00.0", "0000:13:00.0"], "vmware", "VMware, Inc.", "VMware7,1", bar1=ZERO))
    assert v.is_vm is True and v.cpu_hypervisor and [g.address for g in v.gpus] == ["0000:0b:00.0", "0000:13:00.0"]
    assert all(g.bar(1) is not None and not g.bar(1).assigned for g in v.gpus)


def test_what_tells_a_vm_when_tools_are_missing():
    assert parse_virt("detect=\ncpu_hypervisor=1\n").is_vm is True  # no systemd-detect-virt: the CPU flag
    assert parse_virt("detect=\nsys_vendor=Supermicro\n").is_vm is False
    assert parse_virt("").is_vm is None and parse_virt("").gpus == ()


def test_an_unset_bar_keeps_its_size_but_has_no_address():
    bars = parse_bars([f"0x0000000000000000 0x00000007ffffffff {0x14220c | IORESOURCE_UNSET:#018x}", "garbage"])
    assert bars[0].size == 32 << 30 and not bars[0].assigned and len(bars) == 1
