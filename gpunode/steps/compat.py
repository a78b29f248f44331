"""Step 3: check the driver against the node's GPUs and the user's CUDA / image targets.

The driver is the requested one (--driver), else the loaded one, else the one an earlier driver step plans
to install. Each GPU's architecture must be supported by that driver branch (not dropped, not too new);
--cuda must run on it (natively or through minor-version compatibility); --image's NVIDIA_REQUIRE_CUDA must
hold. The step changes nothing: it is `ok` or `blocked` with the reason and a fix naming a driver that works.
It also picks the CUDA base image `verify` runs for this driver (a note: "verify image: ...").
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from gpunode import compat, gpus
from gpunode.errors import UsageError
from gpunode.facts import Facts
from gpunode.options import Options
from gpunode.plan import Status, StepPlan, blocked, ok, unknown
from gpunode.steps.base import Step

NAME = "compat"
TITLE = "Check CUDA / driver / GPU compatibility"
VERIFY_NOTE = "verify image: "
DRIVER_NOTE = "driver version: "  # what a driver step's plan may note to say which version it installs

_VERSION_IN_TEXT = re.compile(r"\b(\d{3}\.\d{1,3}(?:\.\d{1,3})?)\b")
_RUNFILE = re.compile(r"NVIDIA-Linux-[A-Za-z0-9_]+-(\d{3}\.\d{1,3}(?:\.\d{1,3})?)(?:-[a-z0-9-]+)?\.run")


def _planned_driver(plan: StepPlan, options: Options) -> str | None:
    """The version an earlier driver-step plan installs: its 'driver version: X' note, else the version in the
    --driver-run file name, else the last driver version its reason names ("driver 535.129.03 is installed;
    580.105.08 was requested: upgrading" -> 580.105.08)."""
    for note in plan.notes:
        if note.startswith(DRIVER_NOTE):
            return note[len(DRIVER_NOTE):].split()[0]
    run = _RUNFILE.search(getattr(options, "driver_run", None) or "")
    if run:
        return run[1]
    found = _VERSION_IN_TEXT.findall(plan.reason)
    return found[-1] if found else None


def _driver(facts: Facts, options: Options, earlier: Mapping[str, StepPlan]) -> tuple[str | None, str, StepPlan | None]:
    """(version, where it comes from, a plan to return instead)."""
    if options.driver:
        return options.driver, "requested", None
    driver_plan = earlier.get("driver")
    if driver_plan is not None and driver_plan.status is Status.CHANGE:
        version = _planned_driver(driver_plan, options)
        if version:
            return version, "to be installed by the driver step", None
        return None, "", unknown(NAME, "waits for the driver step: the version it installs is not known yet")
    if facts.loaded_driver is not None:
        return facts.loaded_driver.version, "loaded", None
    if driver_plan is not None and driver_plan.status in (Status.UNKNOWN, Status.BLOCKED):
        return None, "", unknown(NAME, f"waits for the driver step ({driver_plan.status.value})")
    return None, "", None


def plan(facts: Facts, options: Options, earlier: Mapping[str, StepPlan] | None = None) -> StepPlan:
    earlier = earlier or {}
    if not facts.gpus:
        return ok(NAME, "no NVIDIA GPU on this node: nothing to check")
    text, where, instead = _driver(facts, options, earlier)
    if instead is not None:
        return instead
    if text is None:
        return ok(NAME, "no NVIDIA driver loaded or requested: nothing to check yet "
                        "(pass --driver to check a version before installing it)")
    try:
        driver = compat.parse_driver(text)
    except UsageError:
        return ok(NAME, f"driver version {text!r} is not in NVIDIA's usual form: compatibility not checked")

    checks: list[compat.Check] = []
    notes: list[str] = []
    segments: list[str | None] = []
    known: list[gpus.Gpu] = []
    for device in sorted({g.device for g in facts.gpus}):
        gpu = gpus.lookup_id(device)
        if gpu is None:
            notes.append(f"GPU 10de:{device:04x} is not in gpunode's table: its architecture was not checked")
            segments.append(None)
            continue
        known.append(gpu)
        segments.append(gpu.segment)
        checks.append(compat.check_architecture(driver, gpus.architecture_of(gpu), f"GPU {gpu.pci_id} ({gpu.name})"))
    targets: list[tuple[str, compat.Version]] = []
    if options.cuda:
        checks.append(compat.check_cuda(driver, options.cuda))
        targets.append((f"CUDA {options.cuda}", compat.Ver(options.cuda)))
    if options.image:
        checks.append(compat.check_image(driver, options.image, segments))
        image_cuda = compat.parse_image(options.image).cuda
        if image_cuda is not None:
            targets.append((f"image {options.image}", image_cuda))
    for target, cuda in targets:
        for gpu in known:
            check = compat.check_cuda_architecture(gpus.architecture_of(gpu), cuda, target, gpu.name)
            if check is not None:
                checks.append(check)

    for check in checks:
        notes.extend(n for n in check.notes if n not in notes)
    try:
        notes.append(VERIFY_NOTE + compat.verify_image_for(driver))
    except compat.CompatError as exc:
        notes.append(f"no verify image known: {exc.message}")

    failing = [c for c in checks if not c.ok]
    if failing:
        reason = "; ".join(c.reason for c in failing)
        return blocked(NAME, reason, compat.fix_for(checks, driver), *notes)
    release = compat.native_release(driver)
    summary = [f"driver {driver} ({where}, R{compat.branch_of(driver)})"]
    summary.append(f"runs CUDA up to {release.series} natively" if release else "predates every CUDA release known")
    fits = [c.target + (f" (through {c.via})" if c.via and c.via != "native" else "") for c in checks
            if c.target.startswith(("CUDA", "image")) and " on " not in c.target]
    archs = sorted({g.architecture for g in known})
    if archs:
        summary.append("supports " + ", ".join(archs))
    if fits:
        summary.append("fits " + ", ".join(fits))
    return ok(NAME, "; ".join(summary), *notes)


STEP = Step(NAME, TITLE, plan)
