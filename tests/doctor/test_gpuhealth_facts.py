"""The GPU health parsers on real `nvidia-smi -q` captures (tests/fixtures/real) and on package-manager output."""

from __future__ import annotations

from gpunode.facts.gpuhealth import MigLayout, parse_gpu_health, parse_mig, parse_upgrades, selected_layout
from gpunode.facts.registry import Section
from tests.conftest import FIXTURES

Q = FIXTURES / "nvidia-smi-q-text"


def _read(name: str) -> str:
    return (Q / name).read_text()


def test_a100_with_a_pending_row_remap_and_correctable_errors():
    (gpu,) = parse_gpu_health(_read("a100-sxm4-80gb-x8_driver-510.73.08_q_ecc-remapped-rows-pending_excerpt.txt"))
    assert gpu.bus == "0000:10:1c.0" and gpu.remap_pending and not gpu.remap_failed
    assert gpu.volatile_correctable == 177 and gpu.volatile_uncorrectable == 0 and gpu.remapped_uncorrectable == 0


def test_h100_healthy_with_gsp_and_ecc():
    gpus = parse_gpu_health(_read("h100-sxm5-80gb-hbm3-x8_driver-565.57.01_q.txt"))
    assert len(gpus) == 8 and all(g.gsp == "565.57.01" and g.ecc_current == "Enabled" for g in gpus)
    assert all(g.volatile_uncorrectable == 0 and not g.remap_pending and g.remap_reported for g in gpus)


def test_geforce_has_no_ecc_and_no_row_remapping():
    (gpu,) = parse_gpu_health(_read("geforce-rtx-2080-super_driver-595.71.05_q_idle.txt"))
    assert gpu.ecc_current == "N/A" and gpu.volatile_uncorrectable is None and not gpu.remap_reported


def test_r4xx_ecc_layout_counts_only_the_totals():
    text = ("GPU 00000000:00:1E.0\n    ECC Errors\n        Volatile\n            Single Bit\n"
            "                Device Memory     : 3\n                Total             : 3\n"
            "            Double Bit\n                Device Memory     : 1\n                Register File     : 1\n"
            "                Total             : 2\n        Aggregate\n            Double Bit\n"
            "                Total             : 5\n    Retired Pages\n        Double Bit ECC\n"
            "            Retired pages     : 2\n        Pending                   : Yes\n")
    (gpu,) = parse_gpu_health(text)
    assert (gpu.volatile_correctable, gpu.volatile_uncorrectable, gpu.aggregate_uncorrectable) == (3, 2, 5)
    assert gpu.retired_pending


def test_mig_devices_and_the_selected_mig_parted_layout():
    layout = parse_mig("GPU 0: NVIDIA A100 (UUID: GPU-1)\n  MIG 3g.40gb     Device  0: (UUID: MIG-a)\n"
                       "  MIG 3g.40gb     Device  1: (UUID: MIG-b)\nGPU 1: NVIDIA A100 (UUID: GPU-2)\n"
                       "@selected custom\n@config\nversion: v1\nmig-configs:\n  custom:\n    - devices: [0]\n"
                       "      mig-enabled: true\n      mig-devices:\n        \"3g.40gb\": 2\n    - devices: [1]\n"
                       "      mig-enabled: false\n")
    assert layout.devices == {0: ("3g.40gb", "3g.40gb"), 1: ()}
    assert selected_layout(layout, 2) == {0: {"3g.40gb": 2}, 1: {}}
    assert selected_layout(MigLayout({}, "missing", "mig-configs:\n  other:\n"), 1) is None


def test_upgrades_from_apt_and_dnf():
    apt = parse_upgrades(Section("Inst linux-image-5.15.0-92-generic (5.15.0-92.102 Ubuntu:22.04/jammy-updates "
                                 "[amd64])\nInst nvidia-utils-580 [580.95.05-0ubuntu1] (580.105.08-0ubuntu1 x [amd64])\n",
                                 0))
    assert apt is not None and [(u.name, u.old, u.new) for u in apt] == [
        ("linux-image-5.15.0-92-generic", None, "5.15.0-92.102"),
        ("nvidia-utils-580", "580.95.05-0ubuntu1", "580.105.08-0ubuntu1")]
    dnf = parse_upgrades(Section("\nkernel.x86_64    5.14.0-427.el9    baseos\n", 100))
    assert dnf is not None and [(u.name, u.new) for u in dnf] == [("kernel", "5.14.0-427.el9")]
    assert parse_upgrades(Section("", 3)) is None
