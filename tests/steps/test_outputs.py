"""Values a step hands to later steps travel as typed outputs: a driver upgrade A -> B reaches compat, fabric
manager and nodesettings as B, whatever the driver step's reason says (it names A first)."""

from __future__ import annotations

import pytest

from gpunode.actions.packages import PackageCommand
from gpunode.options import Options
from gpunode.plan import Status, StepPlan
from gpunode.runner import plan_pipeline
from gpunode.shell import to_argv
from gpunode.steps import PIPELINE
from gpunode.steps.outputs import CompatOutputs, DriverOutputs
from tests.fakes.connection import FakeConnection, FakeNode, FakeSystem

A, B = "535.129.03", "570.124.04"


def hgx_with_driver(version: str) -> FakeNode:
    """8x H100 SXM, 4 NVSwitch, driver `version` installed with the .run and loaded."""
    node = FakeNode(nvidia_version=version)
    for i in range(8):
        node.add_gpu(0x2330, f"0000:{0x18 + i:02x}:00.0")
    for i in range(4):
        node.pci.append((f"0000:{0x83 + i:02x}:00.0", 0x10DE, 0x22A3, 0x068000))
    FakeSystem(node).attach()
    return node


def plans(options: Options) -> dict[str, StepPlan]:
    report = plan_pipeline(FakeConnection(hgx_with_driver(A)), PIPELINE, options)
    return {o.step: o.plan for o in report.outcomes}


@pytest.mark.parametrize("options, origin", [
    (Options(driver=B), "--driver"),
    (Options(driver_run=f"/srv/NVIDIA-Linux-x86_64-{B}.run", sha256="0" * 64), "--driver-run"),
], ids=["--driver", "--driver-run"])
def test_an_upgrade_reaches_compat_fabric_manager_and_nodesettings_as_the_new_version(options, origin):
    got = plans(options)
    driver = got["driver"]
    assert driver.status is Status.CHANGE, driver.reason
    assert driver.reason.startswith(f"driver {A} is installed; {B} was requested")  # prose names A first
    assert driver.outputs == DriverOutputs(B, origin, changes=True, reloads=True)  # unload, install, modprobe

    compat = got["compat"]
    assert isinstance(compat.outputs, CompatOutputs) and compat.outputs.driver == B
    assert compat.outputs.verify_image and f"driver {B}" in compat.reason

    fm = got["fabricmanager"]
    installs = [to_argv(c)[-1] for a in fm.actions if isinstance(a, PackageCommand) for c in a.cmds
                if "install" in to_argv(c)]
    assert installs == [f"nvidia-fabricmanager-570={B}-1"], installs
    assert fm.notes[0] in (f"driver version {B} from --driver", f"driver version {B} from the driver step")
    # the driver step loads B in this run without a reboot, so fabric manager starts in the same run
    assert "enable and start nvidia-fabricmanager, wait for the fabric" in [a.summary for a in fm.actions]
    assert any("the driver step loads it in this run" in n for n in fm.notes)

    nodesettings = got["nodesettings"]
    # predicted: the upgrade unloads nvidia_uvm and loads only nvidia, so nodesettings loads nvidia_uvm again
    assert nodesettings.status is Status.CHANGE, nodesettings.reason
    assert "nvidia_uvm is unloaded by the driver step's upgrade" in nodesettings.reason


def test_no_step_reads_a_plan_it_did_not_declare():
    # the runner hands each step only the plans it declared; a plan of the whole pipeline would raise otherwise
    got = plans(Options(driver=B))
    assert set(got) == {s.name for s in PIPELINE}
    declared = {s.name: s.reads for s in PIPELINE}
    assert declared["compat"] == ("driver",) and declared["fabricmanager"] == ("driver",)
    assert all(r in [s.name for s in PIPELINE[:i]] for i, s in enumerate(PIPELINE) for r in s.reads)
