"""Fabric facts (gpunode/facts/fabric.py): the fabric state nvidia-smi -q reports (real captures), the fabric
manager versions the repositories offer, and version locks."""

from __future__ import annotations

from gpunode.facts import Facts
from gpunode.facts import fabric as f
from gpunode.facts.registry import Section
from tests.conftest import FIXTURES
from tests.steps.test_fabricmanager import POLICY


def test_parse_fabric_on_a_real_h100_hgx_capture():
    text = (FIXTURES / "nvidia-smi-q-text" / "h100-sxm5-80gb-hbm3-x8_driver-565.57.01_q.txt").read_text()
    gpus = f.parse_fabric(text)
    assert len(gpus) == 8 and all(g.settled and g.reported for g in gpus)
    assert gpus[0].gpu == "00000000:18:00.0" and not f.off_host_fabric(gpus)
    pcie = f.parse_fabric((FIXTURES / "nvidia-smi-q-text" / "l40s_driver-550.127.05_q.txt").read_text())
    assert pcie and not any(g.reported for g in pcie)


def test_versions_offered_by_apt_and_dnf():
    assert f.parse_available(POLICY) == {"nvidia-fabricmanager-535": [
        "535.183.01-1", "535.129.03-0ubuntu0.22.04.2", "535.104.05-1"]}
    dnf = "Available Packages\nnvidia-fabric-manager.x86_64    535.129.03-1    cuda-rhel9-x86_64\n"
    assert f.parse_available(dnf) == {"nvidia-fabric-manager": ["535.129.03-1"]}


def test_fabric_manager_package_names():
    assert all(f.FM_PACKAGE.match(n) for n in ("nvidia-fabricmanager-535", "nvidia-fabric-manager",
                                               "nvidia-fabricmanager"))
    assert not any(f.FM_PACKAGE.match(n) for n in ("nvidia-fabricmanager-dev-535", "nvidia-fabric-manager-devel"))


def test_typed_reads_of_the_switch_facts():
    facts = Facts(outputs={"nvswitch_devices": Section("0000:05:00.0\n0000:06:00.0\n", 0),
                           "versionlocks": Section("nvidia-fabric-manager-0:535.129.03-1.*\n", 0),
                           "fabricmanager_log": Section("", 1)})
    assert facts[f.NVSWITCH_DEVICES] == ("0000:05:00.0", "0000:06:00.0")
    assert facts[f.VERSIONLOCKS] == {"nvidia-fabric-manager": "535.129.03-1"}
    assert facts[f.NVLINK5_SWITCHES] == () and facts.get(f.FABRICMANAGER_LOG) is None
