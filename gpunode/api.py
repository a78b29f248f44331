"""gpunode as a library, for tools that bring their own way of reaching a node (the Ansible collection in
ansible_collections/gpunode/gpu/ drives nodes through Ansible's connection plugins).

The caller supplies a Connection (gpunode/connection/base.py: one `_exec`), the options as a mapping of
snake_case names (the CLI's long options: `driver_run` for --driver-run), and gets typed results back. Options are
checked by the CLI's own code (gpunode/cli/_inputs.py), so the errors are the same, with the option spelled the
caller's way. Nothing here reboots a node: a run that needs a reboot ends `reboot-pending` and says so.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpunode.actions.base import Action, Reboot, WriteFile
from gpunode.connection.base import Connection
from gpunode.errors import UsageError
from gpunode.facts import Facts, gather
from gpunode.options import Options
from gpunode.plan import StepPlan
from gpunode.runner import SCHEMA_VERSION, NullReporter, RunReport, apply_pipeline, plan_pipeline
from gpunode.steps.base import Step

# The pipeline options a caller may give, with the CLI's defaults (gpunode/cli/_params.py PIPELINE). Lists are
# lists; `engines` / `toolkit_packages` are the repeatable --engine / --toolkit-package.
PIPELINE_OPTIONS: dict[str, Any] = {
    "only": None, "skip": None, "driver": None, "cuda": None, "image": None, "driver_run": None, "sha256": None,
    "kernel_module": None, "module_signing_key": None, "module_signing_cert": None, "cache_dir": None,
    "lock_timeout": 600.0, "toolkit_version": None, "toolkit_packages": None, "set_as_default": False,
    "k8s": False, "engines": None, "kubeconfig": None, "gpu_replicas": 1, "mps": False,
    "mps_thread_percentage": None, "mig_layout": None,
}
# caller's name -> the CLI parameter name, where they differ (the CLI's options are singular and repeatable)
_CLI_NAME = {"engines": "engine", "toolkit_packages": "toolkit_package"}
_CLI_OPTION = re.compile(r"--([a-z][a-z0-9]*(?:-[a-z0-9]+)*)")


@dataclass(frozen=True)
class Request:
    """What to run: the steps in pipeline order and the options they read (reboot always off)."""

    steps: tuple[Step, ...]
    options: Options


def _spelled(text: str | None, known: set[str]) -> str | None:
    """`--driver-run` -> `driver_run` (and `--engine` -> `engines`) for the options a library caller has."""
    if text is None:
        return None
    back = {cli: ours for ours, cli in _CLI_NAME.items()}

    def name(m: re.Match[str]) -> str:
        snake = m.group(1).replace("-", "_")
        snake = back.get(snake, snake)
        return snake if snake in known else m.group(0)

    return _CLI_OPTION.sub(name, text)


def request(values: Mapping[str, Any]) -> Request:
    """Options (snake_case, see PIPELINE_OPTIONS; None means the default) -> a Request, checked exactly as the CLI
    checks them. Raises UsageError naming the option as the caller spells it."""
    from gpunode.cli import _inputs  # the CLI's checks; imported here so `doctor` callers do not load them

    unknown = sorted(set(values) - set(PIPELINE_OPTIONS))
    if unknown:
        raise UsageError(f"unknown option {unknown[0]}", fix="use one of: " + ", ".join(PIPELINE_OPTIONS))
    given = {k: (PIPELINE_OPTIONS[k] if v is None else v) for k, v in {**PIPELINE_OPTIONS, **values}.items()}
    try:
        packages = [Path(p).expanduser() for p in given["toolkit_packages"] or []]
        for path in packages:
            if not path.is_file():
                raise UsageError(f"--toolkit-package {path}: no such file on this machine",
                                 fix="pass .deb/.rpm files that exist on the machine running gpunode")
        cli = {_CLI_NAME.get(k, k): v for k, v in given.items()}
        cli["toolkit_package"] = packages
        mig = cli["mig_layout"]
        cli["mig_layout"] = ",".join(mig) if isinstance(mig, (list, tuple)) else mig
        cli["reboot"] = False
        steps = _inputs.steps(cli["only"], cli["skip"])
        options = _inputs.pipeline_options(cli, progress=False)
    except UsageError as exc:
        known = set(PIPELINE_OPTIONS)
        raise UsageError(_spelled(exc.message, known) or exc.message, fix=_spelled(exc.fix, known)) from None
    return Request(steps, options)


@dataclass
class PipelineResult:
    """One node's plan (check mode) or install. `changed` is true exactly when something on the node changed
    (install) or would change (plan): a step whose only action left is a reboot changes nothing itself."""

    report: RunReport
    changed_steps: list[str] = field(default_factory=list)
    applied: list[tuple[str, Action]] = field(default_factory=list)  # (step, action) carried out, in order

    @property
    def changed(self) -> bool:
        return bool(self.changed_steps)

    @property
    def state(self) -> str:
        return self.report.state

    @property
    def reboot_required(self) -> bool:
        return self.report.reboot_pending

    def file_changes(self) -> list[WriteFile]:
        """The files written (install) or that would be written (plan), in order: for diffs."""
        if self.report.mode == "install":
            return [a for _, a in self.applied if isinstance(a, WriteFile)]
        return [a for o in self.report.outcomes if o.result == "planned" for a in o.plan.actions
                if isinstance(a, WriteFile)]

    def to_dict(self) -> dict[str, object]:
        data = self.report.to_dict()
        data["changed"] = self.changed
        data["changed_steps"] = list(self.changed_steps)
        return data


def _changes(plan: StepPlan) -> bool:
    return any(not isinstance(a, Reboot) for a in plan.actions)


class _Applied(NullReporter):
    """Records every action that finished, to know exactly what changed."""

    def __init__(self) -> None:
        self.done: list[tuple[str, Action]] = []

    def action(self, host: str, step: Step, action: Action, state: str, detail: str = "") -> None:
        if state == "done":
            self.done.append((step.name, action))


def plan(conn: Connection, chosen: Request) -> PipelineResult:
    """`gpunode plan` on this connection: nothing on the node changes. The installers are checked read-only."""
    report = plan_pipeline(conn, chosen.steps, chosen.options, check_artifacts=True)
    changed = [o.step for o in report.outcomes if o.result == "planned" and _changes(o.plan)]
    return PipelineResult(report, changed)


def install(conn: Connection, chosen: Request) -> PipelineResult:
    """`gpunode install` on this connection, never rebooting: a step that needs one ends `reboot-pending`."""
    if chosen.options.reboot:
        raise UsageError("the library never reboots a node", fix="reboot it yourself when reboot_required is true, "
                         "then run again")
    applied = _Applied()
    report = apply_pipeline(conn, chosen.steps, chosen.options, applied)
    changed = list(dict.fromkeys(step for step, _ in applied.done))
    return PipelineResult(report, changed, applied.done)


def doctor_document(host: str, facts: Facts) -> dict[str, object]:
    """The `gpunode doctor --json` document of one node, with its readiness verdict."""
    from gpunode.doctor import report, run_checks
    from gpunode.doctor import verdict as readiness

    results = run_checks(facts)
    verdict = readiness.readiness(host, facts, results)
    document = report(host, facts, results, SCHEMA_VERSION)
    document["readiness"] = {"ready": verdict.ready, "reboot_required": verdict.reboot_required,
                             "reason": verdict.reason, "reboot_because": list(verdict.reboot_because)}
    return document


def doctor(conn: Connection) -> dict[str, object]:
    """Read-only diagnosis of the node behind `conn`: the doctor document (see doctor_document)."""
    return doctor_document(conn.name, gather(conn))
