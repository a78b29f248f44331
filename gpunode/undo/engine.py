"""Runs an uninstall on one node: read the journal's undo records and the state they name, plan each step's
undo (reverse pipeline order), and apply it like install does: plan -> apply -> read again -> re-plan, which must
be `ok`. The uninstall is a run in the journal; the records it undid are marked so a second one has nothing to do."""

from __future__ import annotations

from dataclasses import replace

from gpunode import cancel, nodelock
from gpunode.actions.base import undo_look
from gpunode.connection.base import Connection
from gpunode.errors import GpunodeError
from gpunode.facts import Facts, gather
from gpunode.journal import Journal, read_journal
from gpunode.options import Options
from gpunode.plan import Status, StepPlan
from gpunode.runner import NullReporter, Reporter, RunReport, StepOutcome, converge
from gpunode.steps import nodesettings, nouveau, toolkit
from gpunode.steps.base import Step
from gpunode.undo import ORDER, plan_step, state
from gpunode.undo.common import stopped_units
from gpunode.undo.state import NodeState, Record, UndoRequest

_BINARY = (".gpg",)  # keyrings: compared by hash, never shown


# the files gpunode writes with its marker, per step: all an old journal (before undo records) can go by
LEGACY_FILES = {"nouveau": (nouveau.PATH,), "toolkit": (toolkit.APT_LIST, toolkit.YUM_REPO, toolkit.ZYPP_REPO),
                "nodesettings": (nodesettings.UNIT_PATH, nodesettings.DROPIN_PATH, nodesettings.RULE_PATH,
                                 nodesettings.UVM_LOAD_PATH)}


def active_records(journal: dict[str, object]) -> list[Record]:
    found = journal.get("undo")
    return [r for r in found if isinstance(r, dict) and not r.get("undone")] if isinstance(found, list) else []


def legacy_records(journal: dict[str, object]) -> list[Record]:
    """A journal with changed steps but no `undo` key: one marker record per file gpunode may have written."""
    runs = journal.get("runs")
    if "undo" in journal or not isinstance(runs, list) or not any(
            isinstance(s, dict) and s.get("result") in ("changed", "reboot-pending", "failed", "interrupted")
            for run in runs if isinstance(run, dict) for s in run.get("steps") or []):
        return []
    return [{"kind": "file", "path": path, "existed": False, "backup": None, "sha256": None, "marker": True,
             "step": step} for step, paths in LEGACY_FILES.items() for path in paths]


def read_state(conn: Connection, records: list[Record]) -> NodeState:
    """Read-only: the hashes (and texts) of every file the records name, the installed packages, the units."""
    paths = state.paths(records)
    files = undo_look(conn, "files", *paths) if paths else {}
    texts: dict[str, str | None] = {}
    for path in paths:
        if (files or {}).get(path, "-") != "-" and not path.endswith(_BINARY):
            try:
                texts[path] = conn.read_file(path, sudo=True)
            except GpunodeError:
                texts[path] = None
    packages = undo_look(conn, "packages") if any(r.get("kind") == "packages" for r in records) else {}
    units = state.units(records)
    driver = (undo_look(conn, "driver") or {}).get("driver") if any(r.get("kind") == "driver" for r in records) \
        else None
    holds = undo_look(conn, "holds") if any(r.get("kind") == "hold" for r in records) else {}
    return NodeState(files=files or {}, texts=texts, packages=packages,
                     units=(undo_look(conn, "units", *units) or {}) if units else {}, driver=driver,
                     holds=None if holds is None else frozenset(holds))


def _first_blocked(records: list[Record], current: NodeState, facts: Facts, request: UndoRequest) -> str | None:
    """Plan every step from the state now (as --dry-run does); the first one blocked, if any."""
    for name, _, _ in ORDER:
        if name not in request.steps:
            continue
        plan = plan_step(name, records, current, facts, request)
        if plan.status is Status.BLOCKED:
            return name
        if plan.status is Status.CHANGE:
            request = replace(request, stopping=tuple(dict.fromkeys((*request.stopping, *stopped_units(plan.actions)))))
    return None


def kept_packages(records: list[Record], current: NodeState, request: UndoRequest) -> frozenset[str]:
    """Packages gpunode installed that stay installed after this uninstall: those of steps it does not undo (not
    selected with --only; the prerequisites unless named)."""
    keep = [r for r in records if r.get("kind") == "packages" and (
        r.get("step") not in request.steps or (r.get("step") == "prerequisites" and not request.prerequisites))]
    return frozenset(str(p[0]) for r in keep for p in r.get("installed") or []
                     if isinstance(p, list) and p and current.packages and p[0] in current.packages)


def _step(name: str, title: str) -> Step:
    return Step(name, f"undo: {title}", lambda facts, options, earlier: StepPlan(name, Status.OK, ""))


def uninstall(conn: Connection, request: UndoRequest, options: Options, reporter: Reporter | None = None, *,
              dry_run: bool = False, command: str = "uninstall") -> RunReport:
    """Undo the journal's records; all but a dry run hold the node's lock (gpunode/nodelock.py) throughout."""
    shown = reporter or NullReporter()
    if dry_run:
        return _uninstall(conn, request, options, shown, dry_run=True, command=command)
    with nodelock.held(conn, command, options.lock_timeout, lambda text: shown.message(conn.name, text)):
        return _uninstall(conn, request, options, shown, command=command)


def _uninstall(conn: Connection, request: UndoRequest, options: Options, reporter: Reporter | None = None, *,
               dry_run: bool = False, command: str = "uninstall") -> RunReport:
    reporter = reporter or NullReporter()
    report = RunReport(conn.name, "plan" if dry_run else "uninstall")
    journal = read_journal(conn)
    records = active_records(journal)
    legacy = legacy_records(journal)
    if legacy:
        records, request = legacy, replace(request, legacy=True)
    facts = gather(conn)
    report.node, report.facts = facts.summary(), facts
    reporter.node(conn.name, facts)
    if not records:
        return report  # nothing to undo: no outcomes, nothing written
    record = None if dry_run else Journal(conn, command)
    current = read_state(conn, records)
    request = replace(request, kept_packages=kept_packages(records, current, request),
                      stop_gpu_services=request.stop_gpu_services or options.stop_gpu_services)
    stopped: str | None = None
    blocked = None if dry_run else _first_blocked(records, current, facts, request)
    if blocked is not None:  # know before you touch: a step that cannot be undone stops the run before any change
        stopped = f"not run: step {blocked} is blocked (nothing was changed)"
        dry_run, record = True, None
    for name, title, _ in ORDER:
        if name not in request.steps:
            continue
        step = _step(name, title)
        plan = plan_step(name, records, current, facts, request)
        reporter.planned(conn.name, step, plan)
        if plan.status is Status.CHANGE:  # what this step stops, the later steps (the driver's) need not stop
            request = replace(request, stopping=tuple(dict.fromkeys((*request.stopping, *stopped_units(plan.actions)))))
        if dry_run and stopped:  # blocked before the first change
            blocks = plan.status is Status.BLOCKED
            report.outcomes.append(StepOutcome(name, step.title, plan, "blocked" if blocks else "not-run",
                                               error=None if blocks else stopped))
            continue
        if dry_run:
            result = {"ok": "ok", "change": "planned", "blocked": "blocked", "unknown": "unknown"}[plan.status.value]
            report.outcomes.append(StepOutcome(name, step.title, plan, result))
            continue
        outcome = StepOutcome(name, step.title, plan, "ok")
        report.outcomes.append(outcome)
        ids = {str(r["id"]) for r in records if r.get("step") == name and r.get("id")}
        if stopped:
            outcome.result, outcome.error = "not-run", stopped
            continue
        try:
            if plan.status is Status.BLOCKED:
                outcome.result, stopped = "blocked", f"not run: step {name} is blocked"
                continue
            if plan.status is Status.CHANGE:
                assert record is not None
                record.begin()
                facts, current = _apply(conn, step, plan, records, facts, request, options, reporter, report,
                                        outcome, record)
            kept = name == "prerequisites" and not request.prerequisites  # kept: still owed to a later --only
            if outcome.result in ("ok", "changed") and ids and record is not None and not kept:
                record.undone(ids)
        except cancel.Cancelled as exc:
            outcome.result, outcome.error, outcome.error_fix = "interrupted", exc.message, exc.fix
            report.interrupted, stopped = True, f"not run: {exc.message}"
        except GpunodeError as exc:
            outcome.result, outcome.error, outcome.error_fix = "failed", exc.message, exc.fix
            stopped = f"not run: step {name} failed"
        finally:
            if record is not None and outcome.result not in ("ok", "not-run"):
                record.step(name, outcome.result, plan.reason, outcome.backups, outcome.error)
    if record is not None and legacy and not stopped:
        record.start_undo_records()
    if record is not None:
        with cancel.bind(cancel.CancelToken()):
            record.finish({0: "done", 3: "reboot-pending"}.get(report.exit_code, "failed")
                          if not report.interrupted else "interrupted")
    report.facts = facts
    return report


def _apply(conn: Connection, step: Step, plan: StepPlan, records: list[Record], facts: Facts,
           request: UndoRequest, options: Options, reporter: Reporter, report: RunReport, outcome: StepOutcome,
           record: Journal) -> tuple[Facts, NodeState]:
    """The runner's apply-and-converge loop (gpunode/runner.converge), re-planning this step's undo from the
    state the records name, read again after every change and reboot."""
    seen: list[NodeState] = []

    def replan(fresh: Facts) -> StepPlan:
        seen.append(read_state(conn, records))
        return plan_step(step.name, records, seen[-1], fresh, request)

    facts = converge(conn, step, plan, facts, options, replan, reporter, report, outcome, record, undoable=False,
                     what=f"undoing {step.name}")
    return facts, seen[-1]
