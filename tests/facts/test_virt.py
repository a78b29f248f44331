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


def test_the_host_side_of_passthrough_and_the_memory_window():
    text = ("iommu_groups=42\nir_chips=7\ndmar_ecap=f020df\ndmar_ecap=f020de\ncmdline=BOOT_IMAGE=/vmlinuz intel_iommu=on\n"
            + virt_output(["0000:18:00.0", "0000:3b:00.0"])
            + "~device=0x2236\n~rebar=0xff00\n~driver=vfio-pci\n~group=17\n"
              "~member=0000:3b:00.0 0x030200 vfio-pci\n~member=0000:3a:00.0 0x060400 pcieport\n"
              "@mem 00000000:3B:00.0, 24576\n")
    v = parse_virt(text)
    first, second = v.gpus
    assert first.driver == "" and first.group == "" and first.memory_mib is None and first.bar1_max == 0
    assert second.device == 0x2236 and second.driver == "vfio-pci" and second.group == "17"
    assert second.memory_mib == 24576 and second.bar1_max == 32 << 30  # bits 8-15: 256 MiB .. 32 GiB
    assert [m.is_bridge for m in second.members] == [False, True] and second.members[1].driver == "pcieport"
    assert second.bar(1) is not None and second.bar(1).size == 16 << 30  # the ~ lines are not BARs
    assert v.iommu_groups == 42 and v.interrupt_remapping is True and v.cmdline.endswith("intel_iommu=on")
    assert v.intel_ir_capable is True and v.dmar_ecaps == (0xf020df, 0xf020de)
    assert parse_virt("iommu_groups=3\nir_chips=0\n").interrupt_remapping is False
    assert parse_virt("dmar_ecap=f02052\n").intel_ir_capable is False  # bit 3 (IR) clear
    assert parse_virt("").interrupt_remapping is None and parse_virt("").intel_ir_capable is None
