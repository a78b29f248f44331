"""Step 3: check the driver against the node's GPUs and the user's CUDA / image targets.

The driver is the one the driver step's outputs say will be in place (requested, to be installed, or loaded);
without a driver step in the run, --driver, else the loaded one. Each GPU's architecture must be supported by that driver branch (not dropped, not too new);
--cuda must run on it (natively or through minor-version compatibility); --image's NVIDIA_REQUIRE_CUDA must
hold. The step changes nothing: it is `ok` or `blocked` with the reason and a fix naming a driver that works.
It also picks the CUDA base image `verify` runs for this driver: CompatOutputs.verify_image (and a note for
people: "verify image: ...").
"""

from __future__ import annotations

from gpunode import compat, gpus, rules
from gpunode.errors import UsageError
from gpunode.facts import Facts
from gpunode.options import Options
from gpunode.plan import Earlier, Status, StepPlan, blocked, ok, unknown
from gpunode.steps.base import Step
from gpunode.steps.outputs import CompatOutputs, DriverOutputs

NAME = "compat"
TITLE = "Check CUDA / driver / GPU compatibility"
READS = ("driver",)
VERIFY_NOTE = "verify image: "  # the human note; later steps and `verify` read CompatOutputs.verify_image


def _driver(facts: Facts, options: Options, earlier: Earlier) -> tuple[str | None, str, StepPlan | None]:
    """(version, where it comes from, a plan to return instead): the driver step's outputs when it is part of
    this run, else --driver, else the loaded driver."""
    driver_plan = earlier.plan("driver")
    out = earlier.outputs("driver", DriverOutputs) if driver_plan is not None else None
    found = rules.driver_in_place(facts.loaded_driver.version if facts.loaded_driver else None, options.driver, out)
    if found is None:
        if driver_plan is not None and out is not None and driver_plan.status in (Status.UNKNOWN, Status.BLOCKED):
            return None, "", unknown(NAME, f"waits for the driver step ({driver_plan.status.value})")
        if driver_plan is not None and out is not None and driver_plan.status is Status.CHANGE:
            return None, "", unknown(NAME, "waits for the driver step: the version it installs is not known yet")
        return None, "", None
    if found.source == "--driver":
        return found.version, "requested", None
    return found.version, "to be installed by the driver step" if found.changes else "loaded", None


def plan(facts: Facts, options: Options, earlier: Earlier | None = None) -> StepPlan:
    """The check, with the driver version checked and its verify image as outputs."""
    decided, driver, image = _plan(facts, options, earlier or Earlier({}, READS))
    return decided.with_outputs(CompatOutputs(driver, image))


def _plan(facts: Facts, options: Options, earlier: Earlier) -> tuple[StepPlan, str | None, str | None]:
    if not facts.gpus:
        return ok(NAME, "no NVIDIA GPU on this node: nothing to check"), None, None
    text, where, instead = _driver(facts, options, earlier)
    if instead is not None:
        return instead, None, None
    if text is None:
        return ok(NAME, "no NVIDIA driver loaded or requested: nothing to check yet "
                        "(pass --driver to check a version before installing it)"), None, None
    try:
        driver = compat.parse_driver(text)
    except UsageError:
        return ok(NAME, f"driver version {text!r} is not in NVIDIA's usual form: compatibility not checked"), \
            text, None

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
    image: str | None = None
    try:
        image = compat.verify_image_for(driver)
        notes.append(VERIFY_NOTE + image)
    except compat.CompatError as exc:
        notes.append(f"no verify image known: {exc.message}")

    failing = [c for c in checks if not c.ok]
    if failing:
        reason = "; ".join(c.reason for c in failing)
        return blocked(NAME, reason, compat.fix_for(checks, driver), *notes), text, image
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
    return ok(NAME, "; ".join(summary), *notes), text, image


STEP = Step(NAME, TITLE, plan, READS)
