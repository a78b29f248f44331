"""Runs an uninstall on one node: read the journal's undo records and the state they name, plan each step's
undo (reverse pipeline order), and apply it with install's own loop (gpunode/runner.run_steps): plan -> apply ->
read again -> re-plan, which must be `ok`. The uninstall is a run in the journal; the records it undid are marked so a second one has nothing to do."""

from __future__ import annotations

import hashlib
from dataclasses import replace

from gpunode import cancel, nodelock
from gpunode.actions.base import undo_looks
from gpunode.connection.base import Connection
from gpunode.facts import Facts, gather
from gpunode.facts.containers import journal_text
from gpunode.facts.registry import FILES, facts_of
from gpunode.journal import journal_from
from gpunode.options import Options
from gpunode.plan import Earlier, Status, StepPlan
from gpunode.records import DriverRecord, FileRecord, HoldRecord, PackagesRecord, UndoRecord
from gpunode.runner import (
    UNINSTALL_DRY_RUN,
    UNINSTALL_MODE,
    Loop,
    NullReporter,
    Reporter,
    RunReport,
    StepOutcome,
    journal_status,
    locked,
    plan_steps,
    run_steps,
)
from gpunode.runrecord import Journal
from gpunode.steps import nodesettings, nouveau, toolkit
from gpunode.steps.base import PlanFn, Step
from gpunode.undo import ORDER, plan_step, scope, state
from gpunode.undo.common import stopped_units
from gpunode.undo.state import NodeState, Record, UndoRequest

_BINARY = (".gpg",)  # keyrings: compared by hash, never shown


# the files gpunode writes with its marker, per step: all an old journal (before undo records) can go by
LEGACY_FILES = {"nouveau": (nouveau.PATH,), "toolkit": (toolkit.APT_LIST, toolkit.YUM_REPO, toolkit.ZYPP_REPO),
                "nodesettings": (nodesettings.UNIT_PATH, nodesettings.DROPIN_PATH, nodesettings.RULE_PATH,
                                 nodesettings.UVM_LOAD_PATH)}


def active_records(journal: dict[str, object]) -> list[Record]:
    """The journal's records not undone yet (read_journal has typed and checked them)."""
    found = journal.get("undo")
    return [r for r in found if isinstance(r, UndoRecord) and not r.undone] if isinstance(found, list) else []


def legacy_records(journal: dict[str, object]) -> list[Record]:
    """A journal with changed steps but no `undo` key: one marker record per file gpunode may have written."""
    runs = journal.get("runs")
    if "undo" in journal or not isinstance(runs, list) or not any(
            isinstance(s, dict) and s.get("result") in ("changed", "reboot-pending", "failed", "interrupted")
            for run in runs if isinstance(run, dict) for s in run.get("steps") or []):
        return []
    return [FileRecord(path=path, existed=False, marker=True, step=step)
            for step, paths in LEGACY_FILES.items() for path in paths]


def probed_file(facts: Facts, path: str) -> str | None:
    """The sha256 of a file as the probe read it ("-": the probe looked for it and it is not there), or None when
    the probe did not look at that path (no file fact of its probe names it) or its text is not the file's bytes
    (it did not decode as UTF-8). The probe reads files byte for byte (facts/probe.py split_files), as root."""
    if not any(f.matches(path) and f.gathered_by(facts.probe) for f in facts_of(FILES)):
        return None
    text = facts.files.get(path)
    if text is None:
        return "-"
    return None if "\ufffd" in text else hashlib.sha256(text.encode()).hexdigest()


def read_state(conn: Connection, records: list[Record], facts: Facts) -> NodeState:
    """The state of what the records name: files the probe read come from the facts (no command); for the rest,
    read-only and in ONE command: the hashes and texts of the other files, the installed packages, the units, the
    .run driver, the holds (each only when a record needs it)."""
    paths = state.paths(records)
    units = state.units(records)
    probed = {p: h for p in paths for h in [probed_file(facts, p)] if h is not None}
    looked = [p for p in paths if p not in probed]
    wanted: dict[str, tuple[str, ...]] = {}
    if looked:
        wanted["files"] = ("files", *looked)
        wanted["texts"] = ("texts", *(p for p in looked if not p.endswith(_BINARY)))
    if any(isinstance(r, PackagesRecord) for r in records):
        wanted["packages"] = ("packages",)
    if units:
        wanted["units"] = ("units", *units)
    if any(isinstance(r, DriverRecord) for r in records):
        wanted["driver"] = ("driver",)
    if any(isinstance(r, HoldRecord) for r in records):
        wanted["holds"] = ("holds",)
    answers = dict(zip(wanted, undo_looks(conn, *wanted.values()), strict=True)) if wanted else {}
    known = {**probed, **(answers.get("files") or {})}
    files = {p: known[p] for p in paths if p in known}
    read = {**(answers.get("texts") or {}), **{p: facts.files[p] for p, h in probed.items() if h != "-"}}
    texts: dict[str, str | None] = {p: read.get(p) for p in paths
                                    if files.get(p, "-") != "-" and not p.endswith(_BINARY)}
    holds = answers.get("holds", {})
    return NodeState(files=files, texts=texts, packages=answers.get("packages", {}),
                     units=answers.get("units") or {}, driver=(answers.get("driver") or {}).get("driver"),
                     holds=None if holds is None else frozenset(holds))


def kept_packages(records: list[Record], current: NodeState, request: UndoRequest) -> frozenset[str]:
    """Packages gpunode installed that stay installed after this uninstall: those of steps it does not undo (not
    selected with --only; the prerequisites unless named)."""
    keep = [r for r in records if isinstance(r, PackagesRecord) and not _undoes(request, r)]
    return frozenset(n for r in keep for n in r.names if current.packages and n in current.packages)


def _undoes(request: UndoRequest, record: Record) -> bool:
    """Whether this uninstall undoes what the record names (its step selected; the prerequisites only when
    named): the records it keeps leave nothing for it to do."""
    return record.step in request.steps and (record.step != "prerequisites" or request.prerequisites)


class _Undo:
    """The undo of each selected step as a Step of the runner's one loop (gpunode/runner.run_steps): it plans from
    the records, the facts, and the state of what the records name, which is read again with each fresh set of
    facts (after every change and reboot); what the earlier undo steps of this run stop, it need not stop."""

    def __init__(self, conn: Connection, records: list[Record], request: UndoRequest,
                 ignored: list[tuple[str, str]]) -> None:
        self.conn, self.records, self.request, self.ignored = conn, records, request, ignored
        self._read: tuple[Facts, NodeState] | None = None

    def state(self, facts: Facts) -> NodeState:
        if self._read is None or self._read[0] is not facts:
            self._read = (facts, read_state(self.conn, self.records, facts))
        return self._read[1]

    def steps(self) -> list[Step]:
        names = [(n, t) for n, t, _ in ORDER if n in self.request.steps]
        return [Step(n, f"undo: {t}", self._planner(n), reads=tuple(e for e, _ in names[:i]))
                for i, (n, t) in enumerate(names)]

    def _planner(self, name: str) -> PlanFn:
        notes = tuple(w for s, w in self.ignored if s == name)

        def plan(facts: Facts, options: Options, earlier: Earlier) -> StepPlan:
            stopping = [u for e in earlier.reads for p in [earlier.plan(e)]
                        if p is not None and p.status is Status.CHANGE for u in stopped_units(p.actions)]
            request = replace(self.request, stopping=tuple(dict.fromkeys((*self.request.stopping, *stopping))))
            planned = plan_step(name, self.records, self.state(facts), facts, request)
            return replace(planned, notes=(*planned.notes, *notes)) if notes else planned
        return plan


def uninstall(conn: Connection, request: UndoRequest, options: Options, reporter: Reporter | None = None, *,
              dry_run: bool = False, command: str = "uninstall") -> RunReport:
    """Undo the journal's records; all but a dry run hold the node's lock (gpunode/nodelock.py) throughout."""
    shown = reporter or NullReporter()
    if dry_run:
        return _uninstall(conn, request, options, shown, gather(conn), None, dry_run=True, command=command)
    with locked(conn, command, options, shown) as (lock, facts):
        return _uninstall(conn, request, options, shown, facts, lock, command=command)


def _uninstall(conn: Connection, request: UndoRequest, options: Options, reporter: Reporter, facts: Facts,
               lock: nodelock.Lock | None, *, dry_run: bool = False, command: str = "uninstall") -> RunReport:
    report = RunReport(conn.name, UNINSTALL_DRY_RUN if dry_run else UNINSTALL_MODE)
    text = journal_text(facts)  # the probe read it: no second read
    journal = journal_from(conn, text)
    records, ignored = scope.within(active_records(journal))
    legacy = legacy_records(journal)
    if legacy:
        records, request = legacy, replace(request, legacy=True)
    report.node, report.facts = facts.summary(), facts
    reporter.node(conn.name, facts)
    for _, warning in ignored:
        reporter.message(conn.name, f"warning: {warning}")
    if not any(_undoes(request, r) for r in records):
        return report  # nothing to undo (kept prerequisites are not): no outcomes, nothing written
    undo = _Undo(conn, records, request, ignored)
    request = replace(request, kept_packages=kept_packages(records, undo.state(facts), request),
                      stop_gpu_services=request.stop_gpu_services or options.stop_gpu_services)
    undo.request = request
    steps = undo.steps()
    if dry_run:
        plan_steps(conn.name, steps, facts, options, reporter, report)
        return report
    check = RunReport(conn.name, "plan")  # know before you touch: plan every step from the state now
    plan_steps(conn.name, steps, facts, options, NullReporter(), check)
    blocked = next((o.step for o in check.outcomes if o.result == "blocked"), None)
    if blocked is not None:
        stopped = f"not run: step {blocked} is blocked (nothing was changed)"
        for step, o in zip(steps, check.outcomes, strict=True):
            reporter.planned(conn.name, step, o.plan)
            blocks = o.result == "blocked"
            report.outcomes.append(StepOutcome(o.step, o.title, o.plan, "blocked" if blocks else "not-run",
                                               error=None if blocks else stopped))
        return report
    record = Journal(conn, command, text)

    def done(step: Step, outcome: StepOutcome) -> None:
        """Records of a step undone (or with nothing left to undo) are marked; kept prerequisites stay owed to a
        later `--only prerequisites`."""
        kept = step.name == "prerequisites" and not request.prerequisites
        ids = {r.id for r in records if r.step == step.name and r.id}
        if outcome.result in ("ok", "changed") and ids and not kept:
            record.undone(ids, save=False)  # written with the next write, the run's finish at the latest

    try:
        run_steps(conn, steps, options, reporter, report, facts, record,
                  Loop(undoable=False, stop_at_reboot=False, what="undoing", done=done))
    except cancel.Cancelled as exc:
        report.interrupted, report.error, report.error_fix = True, exc.message, exc.fix
    finally:
        if legacy and report.exit_code in (0, 3):
            record.start_undo_records()
        with cancel.bind(cancel.CancelToken()):
            record.finish(journal_status(report), lock)  # the lock's release rides on its last write
    return report
