"""The last step of an image build (`--bake`, gpunode/bake.py): the marker that says what was baked.

Not part of the ordinary pipeline: the CLI appends it to the steps a bake runs. It reads the driver step's
version and, from fresh facts (the runner gathers them after each step), the sha256 of every NVIDIA module built
for the bake's kernel and the installed toolkit version, and writes /var/lib/gpunode/baked.json with the verified
writer. A marker that already records the same build is left as it is (its time included).
"""

from __future__ import annotations

from gpunode import bake
from gpunode.facts import Facts
from gpunode.facts import packages as package_facts
from gpunode.options import Options
from gpunode.plan import Earlier, StepPlan, WriteFile, blocked, change, ok
from gpunode.steps.base import Step
from gpunode.steps.driver import Flavour, choose_flavour, requested_version
from gpunode.steps.outputs import DriverOutputs, ToolkitOutputs

NAME = "bake"
TITLE = "Image build marker"
READS = ("driver", "toolkit")


def plan(facts: Facts, options: Options, earlier: Earlier | None = None) -> StepPlan:
    earlier = earlier or Earlier({}, READS)
    if not options.bake:
        return ok(NAME, "not an image build (--bake): no marker to write")
    kernel = bake.target_kernel(facts, options)
    if kernel is None:
        return blocked(NAME, "no installed kernel found (/boot/vmlinuz-*)", "name the image's kernel with --kernel")
    driver = earlier.outputs("driver", DriverOutputs)
    version = (driver.version if driver else None) or requested_version(options)
    if version is None:
        return blocked(NAME, "no driver version to record", "pass --driver with the version the image carries")
    flavour = choose_flavour([g.device for g in facts.gpus], version, options.kernel_module)
    if not isinstance(flavour, Flavour):
        return blocked(NAME, flavour, "choose --kernel-module open or proprietary")
    modules = bake.module_sums(facts, kernel)
    building = bool(driver and driver.changes)
    if not modules and not building:
        return blocked(NAME, f"no NVIDIA kernel module is built for {kernel}: nothing to record",
                       "run the driver step too (do not --skip driver)")
    toolkit = facts[package_facts.PKG_STATUS].get("nvidia-container-toolkit")
    planned = earlier.outputs("toolkit", ToolkitOutputs)
    toolkit_version = toolkit.version if toolkit else (planned.version if planned and planned.installs else None)
    clock = facts[bake.bake_facts.CLOCK] or ""
    wanted = bake.Marker(version, flavour.flavour, kernel, modules, toolkit_version, clock)
    current = bake.read_marker(facts)
    what = f"driver {version} ({flavour.flavour}) built for kernel {kernel}"
    if isinstance(current, bake.Marker) and current.same_build(wanted):
        return ok(NAME, f"{bake.MARKER_PATH} records this bake: {what}")
    before = facts[bake.bake_facts.MARKER].get(bake.MARKER_PATH)
    notes = ["the module sha256s are read once the driver step has built them"] if building and not modules else []
    return change(NAME, f"record the bake in {bake.MARKER_PATH}: {what}",
                  [WriteFile(f"write {bake.MARKER_PATH}", path=bake.MARKER_PATH, before=before, after=wanted.text())],
                  *notes)


STEP = Step(NAME, TITLE, plan, READS)
