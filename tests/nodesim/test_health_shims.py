"""The health and upgrade side of the shims: `nvidia-smi -q` blocks read back by gpunode's own parsers, the real
captures' block layout, `nvidia-smi -L` MIG devices, and pending upgrades through apt-get -s / dnf check-update."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpunode.facts.gpuhealth import parse_gpu_health, parse_mig, parse_upgrades
from gpunode.facts.registry import Section

pytestmark = pytest.mark.integration

REAL = Path("/work/shared/fixtures/real/nvidia-smi-q-text")


def _blocks(text: str) -> list[str]:
    """Top-level field names under the first GPU, in order."""
    gpu = text.split("\nGPU ", 2)[1]
    return [ln.strip().split(":")[0].strip() for ln in gpu.splitlines()[1:] if re.match(r"^    [^ ]", ln)]


def test_q_health_blocks_read_back_by_gpunode(sim_node):
    node = sim_node("ubuntu-22.04-a100x8", preinstalled_driver="580.95.05", nouveau_loaded=False)
    node.set_gpu_health(0, vol_dram_unc=2, agg_dram_unc=5, vol_sram_cor=7)
    node.set_gpu_health(3, remap_unc=1, remap_pending=True)
    node.set_gpu_health(7, ecc="Disabled", ecc_pending="Enabled")
    rc, out, _ = node.ssh("nvidia-smi -q")
    assert rc == 0
    gpus = parse_gpu_health(out)
    assert [g.bus for g in gpus] == list(node.profile.gpus.bus_ids)
    assert (gpus[0].volatile_uncorrectable, gpus[0].aggregate_uncorrectable, gpus[0].volatile_correctable) == (2, 5, 7)
    assert gpus[1].volatile_uncorrectable == 0 and gpus[1].remap_reported and not gpus[1].remap_pending
    assert gpus[3].remap_pending and gpus[3].remapped_uncorrectable == 1
    assert (gpus[7].ecc_current, gpus[7].ecc_pending, gpus[7].volatile_uncorrectable) == ("Disabled", "Enabled", None)
    assert {g.gsp for g in gpus} == {"580.95.05"}  # open module: GSP always
    for name in ("MIG Mode", "GSP Firmware Version", "ECC Mode", "ECC Errors", "Retired Pages", "Remapped Rows"):
        assert name in _blocks(out)


def test_q_block_order_follows_the_real_captures(sim_node):
    node = sim_node("ubuntu-22.04-a100x8", preinstalled_driver="580.95.05", nouveau_loaded=False)
    ours = _blocks(node.ssh("nvidia-smi -q")[1])
    real = _blocks((REAL / "h100-80gb-hbm3_driver-590.48.01_q_idle.txt").read_text())
    common = [b for b in ours if b in real]
    assert len(common) >= 8 and common == [b for b in real if b in common]


def test_turing_retires_pages_and_has_no_row_remapping(sim_node):
    node = sim_node("ubuntu-22.04-t4", preinstalled_driver="570.195.03", driver_flavor="proprietary",
                    nouveau_loaded=False)
    node.set_gpu_health(retired_dbe=2, retired_pending=True)
    out = node.ssh("nvidia-smi -q")[1]
    assert re.search(r"^    Remapped Rows +: N/A$", out, re.M)
    (gpu,) = parse_gpu_health(out)
    assert (gpu.retired_double_bit, gpu.retired_pending, gpu.remap_reported, gpu.gsp) == (2, True, False, None)
    node.set_gpu_health(gsp=True)
    assert parse_gpu_health(node.ssh("nvidia-smi -q")[1])[0].gsp == "570.195.03"


def test_mig_devices_listed_like_the_real_listing(sim_node):
    node = sim_node("ubuntu-22.04-h100x8", preinstalled_driver="580.95.05", nouveau_loaded=False)
    node.set_mig(2, True, ("3g.40gb", "2g.20gb", "1g.10gb"))
    out = node.ssh("nvidia-smi -L")[1]
    real = Path("/work/shared/fixtures/real/nvidia-smi-table/h100-mig_driver-590.48.01_list-L.txt").read_text()
    line = re.compile(r"^  MIG \S+ +Device +\d+: \(UUID: MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-"
                      r"[0-9a-f]{12}\)$")
    assert all(line.match(ln) for ln in real.splitlines() if "MIG " in ln)
    mig_lines = [ln for ln in out.splitlines() if "MIG " in ln]
    assert len(mig_lines) == 3 and all(line.match(ln) for ln in mig_lines)
    assert out.splitlines()[3].startswith("  MIG 3g.40gb     Device  0:")  # spacing as in the capture
    assert parse_mig(out).devices[2] == ("3g.40gb", "2g.20gb", "1g.10gb")
    csv = node.ssh("nvidia-smi --query-gpu=index,mig.mode.current --format=csv,noheader")[1].splitlines()
    assert csv[2] == "2, Enabled" and csv[1] == "1, Disabled"
    with pytest.raises(ValueError, match="no MIG mode"):
        sim_node("ubuntu-22.04-t4").set_mig(0, True)


def test_apt_simulates_then_installs_a_kernel_upgrade(sim_node):
    node = sim_node("ubuntu-22.04-t4")
    rc, out, _ = node.ssh("apt-get -s dist-upgrade")
    assert rc == 0 and "0 upgraded, 0 newly installed" in out and "Inst " not in out
    node.offer_kernel_upgrade("5.15.0-92-generic", headers=False)
    rc, out, _ = node.ssh("apt-get -s upgrade")
    assert rc == 0 and "kept back:\n  linux-generic" in out and "Inst " not in out
    rc, out, _ = node.ssh("apt-get -s dist-upgrade")
    pending = parse_upgrades(Section(out, 0))
    assert [(u.name, u.old, u.new) for u in pending or ()] == [
        ("linux-image-5.15.0-92-generic", None, "5.15.0-92.1"), ("linux-generic", "5.15.0.91.1", "5.15.0.92.1")]
    assert node.installed_packages()["linux-generic"] == "5.15.0.91.1"  # -s changes nothing
    rc, out, _ = node.ssh("apt-get -y dist-upgrade")
    assert rc == 0, out
    assert node.installed_packages()["linux-image-5.15.0-92-generic"] == "5.15.0-92.1"
    assert "Inst " not in node.ssh("apt-get -s dist-upgrade")[1]


def test_held_packages_are_not_upgraded(sim_node):
    node = sim_node("debian-12-t4")
    node.offer_package("curl", "7.88.1-10+deb12u9")
    assert "Inst curl [" in node.ssh("apt-get -s dist-upgrade")[1]
    node.ssh("apt-mark hold curl")
    assert "Inst " not in node.ssh("apt-get -s dist-upgrade")[1]


def test_dnf_check_update_lists_upgrades_and_exits_100(sim_node):
    node = sim_node("rocky-9-t4")
    rc, out, _ = node.ssh("dnf -q -C check-update")
    assert (rc, out.strip()) == (0, "")
    node.offer_kernel_upgrade("5.14.0-427.13.1.el9_4.x86_64")
    rc, out, _ = node.ssh("dnf -q -C check-update")
    assert rc == 100
    pending = parse_upgrades(Section(out, rc))
    assert {(u.name, u.new) for u in pending or ()} == {("kernel", "5.14.0-427.13.1.el9_4"),
                                                        ("kernel-core", "5.14.0-427.13.1.el9_4"),
                                                        ("kernel-devel", "5.14.0-427.13.1.el9_4")}
    rc, out, _ = node.ssh("dnf -y upgrade")
    assert rc == 0, out
    assert node.installed_packages()["kernel"] == "5.14.0-427.13.1.el9_4"
    assert node.ssh("dnf -q -C check-update")[0] == 0
