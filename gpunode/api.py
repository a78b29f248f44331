"""gpunode as a library, for tools that bring their own way of reaching a node (the Ansible collection in
ansible_collections/gpunode/gpu/ drives nodes through Ansible's connection plugins).

The caller supplies a Connection (gpunode/connection/base.py: one `_exec`), the options as a mapping of
snake_case names (the option table's, gpunode/options.py: `driver_run` for --driver-run), and gets typed results
back. Options are checked by the checks the CLI uses (gpunode/option_checks.py), so the errors are the same, with
the option spelled the caller's way. Nothing here reboots a node: a run that needs a reboot ends `reboot-pending`
and says so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpunode.actions.base import Action, Reboot, WriteFile
from gpunode.connection.base import Connection
from gpunode.doctor.document import doctor_document
from gpunode.errors import UsageError
from gpunode.facts import FULL, gather
from gpunode.fixes import Fix
from gpunode.options import API, Options, Request, options_for
from gpunode.plan import StepPlan
from gpunode.record import Frozen, Record
from gpunode.runner import NullReporter, RunReport, apply_pipeline, plan_pipeline
from gpunode.steps.base import Step
from gpunode.undo.state import UndoRequest


def pipeline_options() -> dict[str, Any]:
    """The pipeline options a caller may give, with their defaults: the option table's library rows
    (gpunode/options.py). Lists are lists; `engines` / `toolkit_packages` are the CLI's repeatable --engine /
    --toolkit-package, `mig_layout` a list of profiles."""
    return {o.name: o.default for o in options_for(API)}


PIPELINE_OPTIONS: dict[str, Any] = pipeline_options()


def _own_name(name: str) -> str:
    return name


def request(values: Mapping[str, Any]) -> Request:
    """Options (snake_case, see pipeline_options(); None means the default) -> a Request, checked by the checks
    the CLI uses (gpunode/option_checks.py), the option named as the caller spells it."""
    from gpunode import option_checks  # the checks load the compat tables' code: not for `doctor` callers

    known = pipeline_options()
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise UsageError(f"unknown option {unknown[0]}", fix="use one of: " + ", ".join(known))
    given = {k: (known[k] if v is None else v) for k, v in {**known, **values}.items()}
    chosen = option_checks.request({**given, "reboot": False}, _own_name)
    return Request(chosen.steps, dataclasses.replace(chosen.options, progress=None))


@dataclass(frozen=True, eq=False, repr=False)
class FileDiff(Frozen):
    """A file's text before and after a change; `before` None: it did not exist, `after` None: it is removed."""

    path: str
    before: str | None
    after: str | None


@dataclass(eq=False, repr=False)
class PipelineResult(Record):
    """One node's plan (check mode) or install. `changed` is true exactly when something on the node changed
    (install) or would change (plan): a step whose only action left is a reboot changes nothing itself."""

    report: RunReport
    changed_steps: list[str] = field(default_factory=list)
    applied: list[tuple[str, Action]] = field(default_factory=list)  # (step, action) carried out, in order
    undo: bool = False  # an uninstall (its dry run's report has mode `uninstall-dry-run`)

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
        return [a for a in self._file_actions() if isinstance(a, WriteFile)]

    def file_diffs(self) -> list[FileDiff]:
        """Every file written, edited by a tool (nvidia-ctk), restored from its backup or removed (or that would be),
        in order: for diffs. An uninstall's RestoreFile / RemoveFile (gpunode/undo/actions.py) included."""
        from gpunode.undo.actions import RemoveFile, RestoreFile

        found: list[FileDiff] = []
        for a in self._file_actions():
            if isinstance(a, RestoreFile):
                found.append(FileDiff(a.path, a.before, a.after or ""))
            elif isinstance(a, RemoveFile):
                found.append(FileDiff(a.path, a.before or "", None))
            else:  # a written file, or one a tool edits (nvidia-ctk's daemon.json, config.toml): Action.changed_files
                found += [FileDiff(path, before, after) for path, before, after in a.changed_files()]
        return found

    def _file_actions(self) -> list[Action]:
        if not self.report.dry_run:
            return [a for _, a in self.applied]
        return [a for o in self.report.outcomes if o.result == "planned" for a in o.plan.actions]

    def fixes(self) -> list[dict[str, object]]:
        """What to do about each step that did not finish, as data (gpunode/fixes.py Fix.to_data): a gpunode
        command as the options this module's `request` takes, a command for the node, words."""
        found: list[dict[str, object]] = []
        for o in self.report.outcomes:
            fix = o.fix
            if fix and o.result not in ("ok", "changed", "planned", "not-run"):
                parts = fix.to_data() if isinstance(fix, Fix) else [{"words": str(fix)}]
                found.append({"step": o.step, "result": o.result, "fix": str(fix), "parts": parts})
        return found

    def to_dict(self) -> dict[str, object]:
        data = self.report.to_dict()
        data["changed"] = self.changed
        data["changed_steps"] = list(self.changed_steps)
        if self.undo:
            summary = data["summary"]
            assert isinstance(summary, dict)
            summary["nothing_to_undo"] = not self.report.outcomes
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


# --- uninstall (gpunode/undo/): what `gpunode uninstall` takes; the rest of PIPELINE_OPTIONS is install's ---------
# `only` (which steps to undo) and the option table's rows an uninstall reads
UNINSTALL_OPTIONS = ("only", *(o.name for o in options_for(API, "uninstall")))


@dataclass(frozen=True, eq=False, repr=False)
class UndoChoice(Frozen):
    """What to undo: the steps (reverse pipeline order) and the options the undo reads (reboot always off)."""

    request: UndoRequest
    options: Options


def uninstall_request(values: Mapping[str, Any]) -> UndoChoice:
    """Options for an uninstall, snake_case as for request(): `only` (the prerequisites are undone only when named),
    `lock_timeout`, `stop_gpu_services`. An install option given a value other than its default is refused, so
    nothing the caller asked for is silently ignored."""
    from gpunode import option_checks
    from gpunode.undo import select

    unknown = sorted(set(values) - set(PIPELINE_OPTIONS))
    if unknown:
        raise UsageError(f"unknown option {unknown[0]}", fix="use one of: " + ", ".join(UNINSTALL_OPTIONS))
    given = {k: (PIPELINE_OPTIONS[k] if v is None else v) for k, v in {**PIPELINE_OPTIONS, **values}.items()}
    extra = [k for k in PIPELINE_OPTIONS if k not in UNINSTALL_OPTIONS and given[k] not in (PIPELINE_OPTIONS[k], [])]
    if extra:
        raise UsageError(f"{extra[0]} is an install option; an uninstall undoes what the node's journal records",
                         fix=f"drop {extra[0]} (an uninstall takes only {', '.join(UNINSTALL_OPTIONS)})")
    lock = option_checks.seconds(float(given["lock_timeout"]), "lock_timeout", zero_ok=True, example="600")
    try:
        chosen = select(list(given["only"] or []))
    except UsageError as exc:
        raise UsageError(exc.message.replace("unknown step", "only: unknown step"), fix=exc.fix) from None
    options = Options(reboot=False, lock_timeout=lock, stop_gpu_services=bool(given["stop_gpu_services"]))
    return UndoChoice(dataclasses.replace(chosen, lock_timeout=lock), options)


def uninstall(conn: Connection, chosen: UndoChoice, *, dry_run: bool = False) -> PipelineResult:
    """`gpunode uninstall` (or `uninstall --dry-run`) on this connection, never rebooting. `changed` is true when
    a step undid (or would undo) something; a node whose journal records nothing left to undo is unchanged."""
    from gpunode.undo.engine import uninstall as run_uninstall

    if dry_run:
        report = run_uninstall(conn, chosen.request, chosen.options, dry_run=True)
        changed = [o.step for o in report.outcomes if o.result == "planned" and _changes(o.plan)]
        return PipelineResult(report, changed, undo=True)
    applied = _Applied()
    report = run_uninstall(conn, chosen.request, chosen.options, applied,
                           command="uninstall " + " ".join(chosen.request.steps))
    return PipelineResult(report, list(dict.fromkeys(step for step, _ in applied.done)), applied.done, undo=True)


def doctor(conn: Connection) -> dict[str, object]:
    """Read-only diagnosis of the node behind `conn`: the doctor document (see doctor_document)."""
    return doctor_document(conn.name, gather(conn, FULL))
