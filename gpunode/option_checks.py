"""Every check of the pipeline options a user gives, below every front door: the CLI (gpunode/cli/_inputs.py) and
the library (gpunode/api.py, and through it Ansible) call the same functions. Each problem is a UsageError that
names the option and the fix (exit 2), raised before anything connects, prompts, downloads or creates a directory.

A front door passes `spell`: how its users write an option named in gpunode/options.py OPTION_TABLE (the CLI:
`--driver-run`, the library: `driver_run`). Version grammar lives in gpunode/versions.py, CUDA and image lookups in
gpunode/compat.py, GPU names in gpunode/gpus.py; this module only calls them.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpunode import fixes, versions
from gpunode import options as table
from gpunode.artifacts.naming import is_url
from gpunode.artifacts.request import check_sha256_option
from gpunode.artifacts.request import request as driver_request
from gpunode.errors import UsageError
from gpunode.options import Options, OptionSpec, Request, choices_of

if TYPE_CHECKING:
    from gpunode.steps.base import Step

Spelling = Callable[[str], str]


def cli_spelling(name: str) -> str:
    """The command line's word for a table option: --driver-run, --kernel (bake_kernel), --engine (engines)."""
    return spec(name).cli_flag


def spec(name: str) -> OptionSpec:
    return next(o for o in table.option_table() if o.name == name)


_TOOLKIT_VERSION = re.compile(r"^\d+\.\d+\.\d+(-[0-9A-Za-z.+~]+)?$")
_KERNEL_RELEASE = re.compile(r"^[0-9][A-Za-z0-9._+~-]*$")
_MIG_PROFILE = re.compile(r"^[1-9]g\.[0-9]+gb(\+me)?$|^[0-9]{1,2}$")


def seconds(value: float, option: str, *, zero_ok: bool = False, example: str = "60") -> float:
    """A duration in seconds: finite, and more than 0 (or at least 0 where 0 means 'do not wait')."""
    if math.isnan(value) or math.isinf(value) or value < 0 or (value == 0 and not zero_ok):
        bound = "0 or more" if zero_ok else "more than 0"
        raise UsageError(f"{option} {value:g} is not a valid number of seconds (it must be {bound})",
                         fix=f"use e.g. {option} {example}")
    return value


def _respelled(exc: UsageError, spell: Spelling, *names: str) -> UsageError:
    """An error raised by a checker that names the option the command line's way (versions, compat, artifacts),
    with the option named the caller's way: only the named options' own flags are replaced."""
    message, fix = exc.message, exc.fix
    for name in names:
        flag, ours = cli_spelling(name), spell(name)
        if flag != ours:
            pattern = re.compile(rf"(?<![\w-]){re.escape(flag)}(?![\w-])")
            message = pattern.sub(ours, message)
            fix = pattern.sub(ours, fix) if fix else fix
    return UsageError(message, fix=fix)


def defaults(front: str) -> dict[str, Any]:
    """Every option a front door has, at its default."""
    return {o.name: o.default for o in table.option_table() if front in o.fronts}


def steps(only: list[str] | None, skip: list[str] | None, spell: Spelling = cli_spelling) -> tuple[Step, ...]:
    # the pipeline (its facts, its rules): only when the steps are selected
    from gpunode import steps as pipeline

    selected = pipeline.select(only or [], skip or [])
    if not selected:
        given = " ".join([*(f"{spell('only')} {s}" for s in only or []), *(f"{spell('skip')} {s}" for s in skip or [])])
        raise UsageError(f"{given} selects no step", fix=f"drop the {spell('skip')} that names an {spell('only')} "
                         "step, or choose other steps: " + ", ".join(s.name for s in pipeline.PIPELINE))
    return selected


def table_checks(values: Mapping[str, Any], spell: Spelling = cli_spelling) -> None:
    """What the table itself says about each given value: a row with `choices` takes only those (the options
    with checks of their own above have already said more)."""
    for row in table.option_table():
        value = values.get(row.name)
        if value is None or value == row.default:
            continue
        allowed = choices_of(row)  # the step names import gpunode.steps: only for a value given
        if not allowed:
            continue
        given = value.split(row.split) if row.split and isinstance(value, str) else value
        for item in given if isinstance(given, (list, tuple)) else [given]:
            if str(item).strip().lower() not in (*allowed, *row.aliases):
                raise UsageError(f"{spell(row.name)} {item!r} is not one of {', '.join(allowed)}",
                                 fix=f"use e.g. {spell(row.name)} {allowed[0]}")


def request(values: Mapping[str, Any], spell: Spelling = cli_spelling) -> Request:
    """The pipeline options (named as in the option table, every one present) -> a Request."""
    return selected(values, checked(values, spell))


def checked(values: Mapping[str, Any], spell: Spelling = cli_spelling) -> Options:
    """Every check of `request`, in its order, and the Options: each problem is raised here. The pipeline is loaded
    only to check step names that were given (with neither --only nor --skip every step runs), so a front door can
    start connecting before it selects the steps (gpunode/cli/pipeline.py)."""
    if values["only"] or values["skip"]:
        steps(values["only"], values["skip"], spell)
    options = pipeline_options(values, spell)
    table_checks(values, spell)
    return options


def selected(values: Mapping[str, Any], options: Options) -> Request:
    """The Request of options `checked` accepted: the steps selected, in pipeline order (this loads the pipeline)."""
    chosen = steps(values["only"], values["skip"])
    if options.bake:  # the steps that need no GPU, then the marker (gpunode/bake.py)
        from gpunode import bake
        from gpunode.steps import bake as bake_step

        chosen = (*(s for s in chosen if s.name in bake.BAKE_STEPS), bake_step.STEP)
    return Request(chosen, options)


def bake_options(a: Mapping[str, Any], driver: str | None, spell: Spelling = cli_spelling) -> tuple[bool, str | None]:
    """--bake and --kernel: an image build needs a driver version, never reboots, and names a kernel release."""
    bake, kernel = bool(a.get("bake")), a.get("bake_kernel")
    b, k = spell("bake"), spell("bake_kernel")
    if kernel is not None and not bake:
        raise UsageError(f"{k} goes with {b} (an image build)", fix=f"add {b}, or drop {k}")
    if kernel is not None and not _KERNEL_RELEASE.match(kernel):
        raise UsageError(f"{k} {kernel!r} is not a kernel release", fix="use the name `uname -r` prints for "
                         f"that kernel, e.g. {k} 5.15.0-92-generic (ls /lib/modules lists the installed ones)")
    if bake and a.get("reboot"):
        raise UsageError(f"{b} never reboots: the image is rebooted when it boots as a node",
                         fix="drop --reboot (the first boot runs `" + fixes.gpunode("install", local=True) + "`, docs/engines.md)")
    if bake and not driver and not a.get("driver_run"):
        raise UsageError(f"{b} needs the driver to build into the image", fix=f"add {spell('driver')} VERSION, e.g. "
                         f"{spell('driver')} 535.129.03")
    return bake, kernel


def _driver_fields(a: Mapping[str, Any], spell: Spelling) -> dict[str, object]:
    try:
        driver = versions.check_driver(a["driver"], spell("driver"))
        module = a["kernel_module"]
        allowed = choices_of(spec("kernel_module")) or ()
        if module is not None and module.strip().lower() not in allowed:
            m = spell("kernel_module")
            raise UsageError(f"{m} {module!r} is not a kernel module flavour (allowed: {', '.join(allowed)})",
                             fix=f"use {m} open or {m} proprietary, or leave it out to let gpunode choose from the "
                                 "GPUs")
        check_sha256_option(a["sha256"])
        if bool(a["module_signing_key"]) != bool(a["module_signing_cert"]):
            raise UsageError(f"{spell('module_signing_key')} and {spell('module_signing_cert')} go together",
                             fix="pass both: the private key and its certificate, as paths on the node")
        run = a["driver_run"]
        if run and not is_url(run) and not Path(run).expanduser().is_file():
            raise UsageError(f"--driver-run {run}: no such file", fix="pass a .run file or its URL")
        source = _driver_source(a, driver, spell)
        if source == "packages":  # no installer: nothing to download, verify or sign
            return {"driver": driver, "kernel_module": module.strip().lower() if module else None,
                    "driver_source": source}
        return {**driver_request(driver, run, a["sha256"], module.strip() if module else None,
                                 a["module_signing_key"], a["module_signing_cert"], a["cache_dir"]),
                "driver_source": source}
    except UsageError as exc:
        raise _respelled(exc, spell, "driver", "driver_run", "sha256") from None


def _driver_source(a: Mapping[str, Any], driver: str | None, spell: Spelling) -> str:
    """--driver-source run|packages; packages takes the version from --driver and nothing of the .run's options."""
    given = a.get("driver_source") or "run"
    source = given.strip().lower()
    allowed = choices_of(spec("driver_source")) or ()
    flag = spell("driver_source")
    if source not in allowed:
        raise UsageError(f"{flag} {given!r} is not a driver source (allowed: {', '.join(allowed)})",
                         fix=f"use {flag} run (NVIDIA's .run installer) or {flag} packages (repository packages)")
    if source == "packages":
        for name in ("driver_run", "sha256", "module_signing_key", "module_signing_cert"):
            if a.get(name):
                raise UsageError(f"{spell(name)} is an option of the .run installer; {flag} packages installs "
                                 "the repository's packages", fix=f"drop {spell(name)}, or use {flag} run")
        if not driver and _asks_for_driver(a):
            raise UsageError(f"{flag} packages needs the exact driver version to install",
                             fix=f"add {spell('driver')} VERSION, e.g. {spell('driver')} 535.261.03")
    return source


def _asks_for_driver(a: Mapping[str, Any]) -> bool:
    """Whether the run includes the driver step (packages without --driver would install nothing)."""
    only, skip = a.get("only") or [], a.get("skip") or []
    return ("driver" in only or not only) and "driver" not in skip


def _image(value: str | None, spell: Spelling) -> str | None:
    """--image for plan/install: reference syntax; nvidia/cuda tags must carry a known CUDA."""
    if value is None:
        return None
    from gpunode import compat as cm  # the compat tables: only for an --image given

    try:
        cm.image_needs(value)
    except UsageError as exc:
        raise _respelled(exc, spell, "image") from None
    return value.strip()


def _cuda(value: str | None, spell: Spelling) -> str | None:
    """--cuda for plan/install: a CUDA release gpunode knows."""
    if value is None:
        return None
    from gpunode import compat as cm  # the compat tables: only for a --cuda given

    try:
        return cm.driver_needed_for_cuda(value).cuda
    except UsageError as exc:
        raise _respelled(exc, spell, "cuda") from None


def _toolkit_packages(paths: list[Any] | None, spell: Spelling) -> tuple[str, ...]:
    found = []
    for given in paths or []:
        path = Path(given).expanduser()
        if not path.is_file():
            raise UsageError(f"{spell('toolkit_packages')} {path}: no such file on this machine",
                             fix="pass .deb/.rpm files that exist on the machine running gpunode")
        found.append(str(path.resolve()))
    return tuple(found)


def pipeline_options(a: Mapping[str, Any], spell: Spelling = cli_spelling) -> Options:
    """The plan/install options -> Options (no progress bars: a front door adds its own). Local files are read here
    (the --driver-run header, the cache listing) so that plans never do I/O."""
    fields = _driver_fields(a, spell)
    toolkit = a["toolkit_version"]
    if toolkit is not None and not _TOOLKIT_VERSION.match(toolkit.strip()):
        raise UsageError(f"{spell('toolkit_version')} {toolkit!r} is not a toolkit version",
                         fix="use a release number such as 1.17.8 or 1.17.8-1")
    for name in a["engines"] or []:
        if name.lower() not in (*(choices_of(spec("engines")) or ()), *spec("engines").aliases):
            raise UsageError(f"{spell('engines')} {name!r} is not an engine nvidia-ctk configures",
                             fix="choose docker, containerd or crio")
    kubeconfig, replicas = kubernetes(a.get("kubeconfig"), a.get("gpu_replicas", 1), spell)
    lock = seconds(float(a["lock_timeout"]), spell("lock_timeout"), zero_ok=True, example="600")
    reboot_timeout = seconds(a.get("reboot_timeout", 900.0), "--reboot-timeout", example="900")
    bake, bake_kernel = bake_options(a, fields["driver"], spell)  # type: ignore[arg-type]
    options = Options(reboot=a.get("reboot", False), reboot_timeout=reboot_timeout,
                      cuda=_cuda(a["cuda"], spell), image=_image(a["image"], spell), lock_timeout=lock,
                      **fields)  # type: ignore[arg-type]
    return dataclasses.replace(options, toolkit_version=toolkit.strip() if toolkit else None,
                               toolkit_packages=_toolkit_packages(a["toolkit_packages"], spell),
                               set_as_default=a["set_as_default"], k8s=a["k8s"],
                               engines=tuple(e.lower() for e in a["engines"] or []), kubeconfig=kubeconfig,
                               gpu_replicas=replicas, mps=a.get("mps", False),
                               mps_thread_percentage=mps_limit(a.get("mps"), a.get("mps_thread_percentage"), spell),
                               mig_layout=mig_layout(a.get("mig_layout"), spell), bake=bake, bake_kernel=bake_kernel,
                               hold_kernel=a.get("hold_kernel"), hold_driver=a.get("hold_driver"),
                               stop_gpu_services=a.get("stop_gpu_services", False))


def mig_layout(given: str | list[str] | tuple[str, ...] | None, spell: Spelling = cli_spelling) -> tuple[str, ...]:
    """--mig-layout 1g.10gb,1g.10gb (or a list) -> ("1g.10gb", "1g.10gb"): profile names (or numeric profile ids)."""
    if given is None:
        return ()
    text = given if isinstance(given, str) else ",".join(given)
    profiles = tuple(p.strip() for p in text.split(",") if p.strip())
    bad = [p for p in profiles if not _MIG_PROFILE.match(p)]
    if not profiles or bad:
        m = spell("mig_layout")
        raise UsageError(f"{m} {text!r}: {bad[0] if bad else 'no profile'} is not a MIG profile",
                         fix="list GPU instance profiles as `" + fixes.on_node("nvidia-smi mig -lgip")
                             + f"` names them, e.g. {m} 1g.10gb,1g.10gb,2g.20gb")
    return profiles


def mps_limit(mps: bool | None, percentage: int | None, spell: Spelling = cli_spelling) -> int | None:
    if percentage is None:
        return None
    p = spell("mps_thread_percentage")
    if not mps:
        raise UsageError(f"{p} needs {spell('mps')}", fix=f"add {spell('mps')}, or leave the percentage out")
    if not 1 <= percentage <= 100:
        raise UsageError(f"{p} {percentage} is out of range", fix=f"pass a percentage from 1 to 100, e.g. {p} 50")
    return percentage


def kubernetes(kubeconfig: str | None, replicas: int, spell: Spelling = cli_spelling) -> tuple[str | None, int]:
    """--kubeconfig (an absolute path on the node) and --gpu-replicas (1..64)."""
    if kubeconfig is not None and (not kubeconfig.startswith("/") or "\n" in kubeconfig or "\0" in kubeconfig):
        k = spell("kubeconfig")
        raise UsageError(f"{k} {kubeconfig!r} is not an absolute path on the node",
                         fix=f"pass the kubeconfig's absolute path on the node, e.g. {k} /etc/kubernetes/admin.conf")
    if not 1 <= replicas <= 64:
        r = spell("gpu_replicas")
        raise UsageError(f"{r} {replicas} is out of range",
                         fix=f"pass a number of pods per GPU from 1 (no sharing) to 64, e.g. {r} 4")
    return kubeconfig, replicas
