"""The compat step: a pure plan from facts, options and earlier plans."""

from __future__ import annotations

import dataclasses

import pytest

from gpunode import steps
from gpunode.facts import Facts
from gpunode.facts.kernel import LoadedDriver, PciDevice
from gpunode.options import Options
from gpunode.plan import Earlier, RunCommand, Status, StepPlan, change, unknown
from gpunode.steps import compat as step
from gpunode.steps.outputs import CompatOutputs, DriverOutputs


def node(*devices: int, driver: str | None = None) -> Facts:
    pci = tuple(PciDevice(f"0000:{0x17 + i:02x}:00.0", 0x10DE, d, 0x030200) for i, d in enumerate(devices))
    loaded = LoadedDriver(driver, "open") if driver else None
    return Facts(pci=pci, loaded_driver=loaded)


H100, V100, K80, B200, RTX4090, T4 = 0x2330, 0x1DB1, 0x102D, 0x2901, 0x2684, 0x1EB8


def test_in_the_pipeline_after_nouveau_and_built():
    names = [s.name for s in steps.PIPELINE]
    assert names.index("compat") > names.index("nouveau") and "compat" not in steps.NOT_BUILT
    assert steps.select(only=["compat"])[0].name == "compat"


def test_no_gpu():
    plan = step.plan(node(driver="535.129.03"), Options(), {})
    assert plan.status is Status.OK and "no NVIDIA GPU" in plan.reason


def test_no_driver_known_yet():
    plan = step.plan(node(H100), Options(), {})
    assert plan.status is Status.OK and "nothing to check yet" in plan.reason


def test_loaded_driver_ok_and_verify_image_chosen():
    plan = step.plan(node(H100, H100, driver="535.129.03"), Options(), {})
    assert plan.status is Status.OK and not plan.actions
    assert "driver 535.129.03 (loaded, R535)" in plan.reason and "CUDA up to 12.2" in plan.reason
    assert "verify image: nvidia/cuda:12.2.2-base-ubuntu22.04" in plan.notes


def test_requested_driver_wins_over_the_loaded_one():
    plan = step.plan(node(H100, driver="535.129.03"), Options(driver="580.65.06"), {})
    assert "driver 580.65.06 (requested" in plan.reason
    assert "verify image: nvidia/cuda:13.0.2-base-ubuntu24.04" in plan.notes


def driver_step(plan: StepPlan) -> Earlier:
    return Earlier({"driver": plan}, step.READS)


def test_uses_what_an_earlier_driver_step_installs():
    driver_plan = change("driver", "install driver 580.105.08", [RunCommand("run the installer", ("true",))]
                         ).with_outputs(DriverOutputs("580.105.08", "--driver-run", changes=True))
    plan = step.plan(node(V100, driver="535.129.03"), Options(), driver_step(driver_plan))
    assert plan.status is Status.OK and "580.105.08 (to be installed by the driver step" in plan.reason
    assert plan.outputs == CompatOutputs("580.105.08", "nvidia/cuda:13.0.2-base-ubuntu24.04")


def test_the_driver_steps_outputs_not_its_reason_name_the_version():
    # the reason names the installed version first and the requested one last; only the outputs count
    driver_plan = change("driver", "driver 535.129.03 is installed; 590.48.01 was requested: upgrading", [],
                         "the loaded 535.129.03 module is unloaded first"
                         ).with_outputs(DriverOutputs("590.48.01", "--driver", changes=True))
    plan = step.plan(node(V100, driver="535.129.03"), Options(), driver_step(driver_plan))
    assert plan.status is Status.BLOCKED and "R580 is the last driver branch for Volta" in plan.reason
    assert plan.outputs is not None and plan.outputs.driver == "590.48.01"
    no_outputs = change("driver", "driver 535.129.03 is installed; 590.48.01 was requested: upgrading", [])
    assert step.plan(node(V100), Options(), driver_step(no_outputs)).reason.startswith("no NVIDIA driver")


def test_version_from_the_driver_run_file_name():
    from gpunode.steps import driver

    options = Options(driver_run="/srv/NVIDIA-Linux-x86_64-580.105.08.run")
    facts = dataclasses.replace(node(V100), arch="x86_64")
    driver_plan = driver.plan(facts, options)
    assert driver_plan.status is Status.CHANGE, driver_plan.reason
    assert driver_plan.outputs == DriverOutputs("580.105.08", "--driver-run", changes=True)
    plan = step.plan(facts, options, driver_step(driver_plan))
    assert plan.status is Status.OK and "driver 580.105.08 (to be installed" in plan.reason


def test_waits_for_a_driver_step_whose_version_is_unknown():
    installs = change("driver", "install the driver", []).with_outputs(DriverOutputs(None, changes=True))
    assert step.plan(node(H100), Options(), driver_step(installs)).status is Status.UNKNOWN
    later = unknown("driver", "after reboot").with_outputs(DriverOutputs(None))
    assert step.plan(node(H100), Options(), driver_step(later)).status is Status.UNKNOWN


def test_reading_a_step_it_did_not_declare_is_an_error():
    with pytest.raises(KeyError, match="without declaring it"):
        Earlier({"toolkit": unknown("toolkit", "x")}, step.READS).plan("toolkit")


def test_volta_on_r590_is_blocked_with_a_driver_that_works():
    plan = step.plan(node(V100, driver="590.48.01"), Options(), {})
    assert plan.status is Status.BLOCKED
    assert "GPU 10de:1db1 (Tesla V100 SXM2 16GB): R580 is the last driver branch for Volta" in plan.reason
    assert plan.fix.startswith("use an R580 driver or older, e.g. 580.")


def test_kepler_on_r535_is_blocked():
    plan = step.plan(node(K80), Options(driver="535.129.03"), {})
    assert plan.status is Status.BLOCKED and "R470 is the last driver branch for Kepler" in plan.reason
    assert "470.256.02" in plan.fix


def test_blackwell_on_a_driver_too_old():
    plan = step.plan(node(B200, driver="565.57.01"), Options(), {})
    assert plan.status is Status.BLOCKED and "needs CUDA 12.8, i.e. a driver >= 570.26" in plan.reason
    assert plan.fix.startswith("use a driver >= 570.26, e.g. ")


def test_cuda_target_through_minor_version_compatibility_is_ok_with_a_note():
    plan = step.plan(node(H100, driver="535.129.03"), Options(cuda="12.4"), {})
    assert plan.status is Status.OK and "fits CUDA 12.4 (through minor-version compatibility)" in plan.reason
    assert any("PTX JIT" in n and ">= 550.54.14" in n for n in plan.notes)


def test_cuda_target_across_a_major_is_blocked():
    plan = step.plan(node(H100, driver="535.129.03"), Options(cuda="13.0"), {})
    assert plan.status is Status.BLOCKED and "CUDA 13.0 needs a driver >= 580.65.06" in plan.reason
    assert plan.fix.startswith("use a driver >= 580.65.06")


def test_cuda_13_on_volta_is_blocked_whatever_the_driver():
    plan = step.plan(node(V100, driver="580.65.06"), Options(cuda="13.0"), {})
    assert plan.status is Status.BLOCKED and "CUDA 13.0 dropped Volta" in plan.reason
    assert plan.fix == "use CUDA 12.9 or older on Volta GPUs"


def test_the_issues_example():
    plan = step.plan(node(H100, driver="535.129.03"), Options(image="nvidia/cuda:12.4.0-base-ubuntu22.04"), {})
    assert plan.status is Status.BLOCKED
    assert plan.reason == ("driver 535.129.03 runs CUDA up to 12.2 natively; nvidia/cuda:12.4.0-base-ubuntu22.04 "
                           "fails with 'unsatisfied condition: cuda>=12.4'")
    assert plan.fix.startswith("use a driver >= 550.54.14, e.g. ")


@pytest.mark.parametrize("gpu, image, status, words", [
    (H100, "nvidia/cuda:12.4.1-base-ubuntu22.04", Status.OK, "ubuntu22.04 (through forward compatibility)"),
    (RTX4090, "nvidia/cuda:12.4.1-base-ubuntu22.04", Status.BLOCKED, "not support on GeForce"),
    (RTX4090, "nvidia/cuda:12.8.1-base-ubuntu22.04", Status.BLOCKED, "unsatisfied condition: cuda>=12.8"),
    (T4, "nvidia/cuda:12.2.2-base-ubuntu22.04", Status.OK, "fits image"),
])
def test_image_targets(gpu, image, status, words):
    plan = step.plan(node(gpu, driver="535.129.03"), Options(image=image), {})
    assert plan.status is status and (words in plan.reason or any(words in n for n in plan.notes)), plan


def test_image_other_than_nvidia_cuda_is_explained():
    plan = step.plan(node(H100, driver="550.54.15"), Options(image="ghcr.io/acme/trainer:1.0"), {})
    assert plan.status is Status.OK and any("cannot read another image's NVIDIA_REQUIRE_CUDA offline" in n
                                            for n in plan.notes)


def test_unknown_gpu_is_a_note():
    plan = step.plan(node(0x2B00, driver="580.65.06"), Options(), {})
    assert plan.status is Status.OK and any("10de:2b00 is not in gpunode's table" in n for n in plan.notes)


def test_plan_is_pure():
    facts, options = node(V100, H100, driver="590.48.01"), Options(cuda="12.4", image="nvidia/cuda:12.4.1-base-ubuntu22.04")
    first: StepPlan = step.plan(facts, options, {})
    assert step.plan(facts, options, {}) == first and first.to_dict() == step.plan(facts, options, {}).to_dict()
