"""Runs the pipeline on one node: plan (dry run) or apply.

Apply follows plan -> apply -> re-gather facts -> re-plan: a step that does not come back `ok` (or waiting
only for a reboot) fails loudly. Nothing here prints: every event goes to a Reporter, so many nodes can run in
worker threads later while one reporter draws from the main thread.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from gpunode import SCHEMA_VERSION, __version__, cancel, fixes, nodelock, preflight
from gpunode.connection.base import Connection
from gpunode.errors import CommandError, ConnectError, GpunodeError
from gpunode.facts import Facts, gather
from gpunode.facts.containers import journal_text
from gpunode.firstcommand import FirstCommand, install_command
from gpunode.options import Options
from gpunode.plan import Action, Reboot, Status, StepPlan
from gpunode.record import Frozen, Record
from gpunode.runrecord import Journal
from gpunode.shell import Script
from gpunode.steps import NOT_BUILT
from gpunode.steps.base import Step

# every StepOutcome.result, in the order summaries list them
RESULTS = ("ok", "changed", "planned", "reboot-pending", "blocked", "unknown", "failed", "interrupted", "not-run")
log = logging.getLogger("gpunode.runner")


class Reporter(Protocol):
    def node(self, host: str, facts: Facts) -> None: ...
    def planned(self, host: str, step: Step, plan: StepPlan) -> None: ...
    def action(self, host: str, step: Step, action: Action, state: str, detail: str = "") -> None: ...
    def message(self, host: str, text: str) -> None: ...


@runtime_checkable
class OutcomeReporter(Reporter, Protocol):
    """A reporter that also hears each step's result as soon as it is final (machine-readable progress,
    gpunode/cli/events.py). Steps the run did not reach are reported by whoever renders the RunReport."""

    def step_done(self, host: str, outcome: StepOutcome) -> None: ...


def _step_done(reporter: Reporter, host: str, outcome: StepOutcome) -> None:
    if isinstance(reporter, OutcomeReporter):
        reporter.step_done(host, outcome)


class NullReporter:
    def node(self, host: str, facts: Facts) -> None: ...
    def planned(self, host: str, step: Step, plan: StepPlan) -> None: ...
    def action(self, host: str, step: Step, action: Action, state: str, detail: str = "") -> None: ...
    def message(self, host: str, text: str) -> None: ...


@dataclass(eq=False, repr=False)
class StepOutcome(Record):
    step: str
    title: str
    plan: StepPlan  # as planned when the step came up
    result: str  # ok | changed | planned | blocked | unknown | failed | interrupted | reboot-pending | not-run
    error: str | None = None
    backups: list[str] = field(default_factory=list)
    error_fix: str | None = None  # the fix of the error that failed the step (the plan's own fix is plan.fix)

    @property
    def fix(self) -> str | None:
        """What to do about this step: the failing error's fix, else the plan's."""
        return self.error_fix or self.plan.fix

    def to_dict(self) -> dict[str, object]:
        shown = {"title": self.title, "result": self.result, "error": self.error, "backups": self.backups,
                 **self.plan.to_dict()}
        if self.error_fix:
            shown["fix"] = self.error_fix
        return shown


# A run's mode, the JSON report's "mode" for every front door (CLI, fleet, library, Ansible). A dry run changes
# nothing: install's is "plan", uninstall's "uninstall-dry-run".
PLAN_MODE, INSTALL_MODE, UNINSTALL_MODE, UNINSTALL_DRY_RUN = "plan", "install", "uninstall", "uninstall-dry-run"
DRY_RUNS = frozenset({PLAN_MODE, UNINSTALL_DRY_RUN})


@dataclass(eq=False, repr=False)
class RunReport(Record):
    host: str
    mode: str  # PLAN_MODE | INSTALL_MODE | UNINSTALL_MODE | UNINSTALL_DRY_RUN
    node: dict[str, object] = field(default_factory=dict)
    outcomes: list[StepOutcome] = field(default_factory=list)
    reboots: int = 0
    error: str | None = None
    error_fix: str | None = None
    interrupted: bool = False  # stopped by Ctrl-C (gpunode.cancel) at a safe point, or aborted
    interrupted_exit: int = 130  # the exit code when interrupted: 143 when a SIGTERM stopped the run
    facts: Facts | None = field(default=None, repr=False)  # the latest facts, for human output
    traceback: str | None = field(default=None, repr=False)  # an internal error's, for the debug log only

    @property
    def dry_run(self) -> bool:
        """A plan (install's dry run) or an uninstall's dry run: nothing on the node changes."""
        return self.mode in DRY_RUNS

    @property
    def reboot_pending(self) -> bool:
        return any(o.result == "reboot-pending" for o in self.outcomes) or (
            self.dry_run and any(o.plan.reboot_required for o in self.outcomes))

    @property
    def exit_code(self) -> int:
        """0 done (or plan computed), 1 failed or blocked, 3 a reboot is needed before going on (install and
        uninstall), 130 interrupted (Ctrl-C), 143 stopped by SIGTERM. Every front end (CLI, fleet, library, Ansible)
        takes it from here."""
        state = self.state
        if state == "interrupted":
            return self.interrupted_exit
        if state in ("failed", "blocked"):
            return 1
        return 3 if state == "reboot-pending" and self.mode in ("install", "uninstall") else 0

    @property
    def state(self) -> str:
        """Where the node stands after this run. install: ready | reboot-pending | blocked | failed;
        plan: ready (nothing to change) | changes-pending | blocked (a step cannot run as things are);
        either: interrupted (Ctrl-C)."""
        results = {o.result for o in self.outcomes}
        if self.interrupted:
            return "interrupted"
        if self.error or "failed" in results:
            return "failed"
        if "blocked" in results:
            return "blocked"
        if self.dry_run:
            return "changes-pending" if results - {"ok"} else "ready"
        if "reboot-pending" in results:
            return "reboot-pending"
        return "ready"

    @property
    def ready(self) -> bool:
        """Every step done and an NVIDIA driver loaded: the node can run GPU containers."""
        return self.state == "ready" and (self.facts is None or self.facts.loaded_driver is not None)

    @property
    def as_root(self) -> bool:
        return self.facts is not None and self.facts.uid == 0

    def to_dict(self) -> dict[str, object]:
        counts = {r: sum(1 for o in self.outcomes if o.result == r) for r in RESULTS}
        steps = [o.to_dict() for o in self.outcomes]
        for outcome, step in zip(self.outcomes, steps, strict=True):
            for action, shown in zip(outcome.plan.actions, step["actions"], strict=True):  # type: ignore[call-overload]
                shown["commands"] = action.shown_commands(self.as_root)
        return {
            "schema_version": SCHEMA_VERSION,
            "gpunode_version": __version__,
            "host": self.host,
            "mode": self.mode,
            "node": self.node,
            "steps": steps,
            "not_built": list(NOT_BUILT),
            "summary": {"steps": counts, "state": self.state, "ready": self.ready,
                        "changes_pending": self.state != "ready", "reboot_required": self.reboot_pending,
                        "reboots": self.reboots},
            "error": self.error,
            **({"fix": self.error_fix} if self.error_fix else {}),
        }


class RunInterrupted(cancel.Cancelled):
    """A run stopped by Ctrl-C: the Cancelled that stopped it, with the report of what was done until then."""

    def __init__(self, cause: cancel.Cancelled, report: RunReport) -> None:
        super().__init__(cause.message, cause.fix)
        self.report = report


def _ABORTED() -> cancel.Cancelled:  # noqa: N802 - reads as a constant error
    return cancel.Cancelled("aborted (Ctrl-C twice): the step may have stopped half-way",
                            fix=fixes.CHECK_AND_RERUN)


INTERNAL_FIX = ("this is a bug in gpunode: report it with the command that was run (a fleet run with --log-level debug "
                "keeps the traceback in each node's log)")


def internal_error(exc: BaseException) -> str:
    return f"internal error: {type(exc).__name__}: {exc}"


def plan_pipeline(conn: Connection, steps: Sequence[Step], options: Options,
                  reporter: Reporter | None = None, *, check_artifacts: preflight.Probe | bool = False) -> RunReport:
    """Dry run: plan every step against the current facts. Nothing on the node changes. With
    `check_artifacts` the installers are checked read-only as well (gpunode/preflight.py; a callable replaces
    the HEAD request for an uncached URL): a failed check makes its step `failed`, and the plan exit 1."""
    reporter = reporter or NullReporter()
    report = RunReport(conn.name, "plan")
    facts = gather(conn)
    report.node, report.facts = facts.summary(), facts
    reporter.node(conn.name, facts)
    try:
        earlier = plan_steps(conn.name, steps, facts, options, reporter, report, conn=conn)
    except GpunodeError:
        raise
    except Exception as exc:  # noqa: BLE001 - a bug: a failed plan with its cause, not a traceback
        _internal(report, exc)
        return report
    if check_artifacts:
        probe = check_artifacts if callable(check_artifacts) else None
        stop = preflight.artifacts(earlier, fetch=False, probe=probe)
        if stop is not None:
            outcome = next(o for o in report.outcomes if o.step == stop.step)
            outcome.result, outcome.error, outcome.error_fix = "failed", stop.error, stop.fix
    return report


PLANNED = {"ok": "ok", "change": "planned", "blocked": "blocked", "unknown": "unknown"}  # plan status -> result


def plan_steps(host: str, steps: Sequence[Step], facts: Facts, options: Options, reporter: Reporter,
               report: RunReport, *, conn: Connection | None = None) -> dict[str, StepPlan]:
    """Plan every step in order, each seeing the earlier plans: the outcomes of a dry run (plan, `uninstall
    --dry-run`). Returns the plans by step."""
    earlier: dict[str, StepPlan] = {}
    for step in steps:
        plan, facts = preflight.plan_asking(conn, step, facts, options, earlier)
        earlier[step.name] = plan
        reporter.planned(host, step, plan)
        report.outcomes.append(StepOutcome(step.name, step.title, plan, PLANNED[plan.status.value]))
    return earlier


@dataclass(frozen=True, eq=False, repr=False)
class Loop(Frozen):
    """What differs between the runs that change a node, in the one loop they share (`run_steps`): install and
    `gpunode uninstall` (gpunode/undo/engine.py)."""

    undoable: bool = True  # actions return what undoes them, kept in the journal (an undo records nothing)
    stop_at_reboot: bool = True  # a step left waiting for a reboot stops the later ones (install: they build on it)
    what: str = "step"  # how errors name a step: "step driver", "undoing driver"
    done: Callable[[Step, StepOutcome], None] | None = None  # told each step's final outcome (not the ones not run)


INSTALL = Loop()


def _preflight(conn: Connection, steps: Sequence[Step], options: Options, reporter: Reporter, report: RunReport,
               facts: Facts) -> bool:
    """Before the first change: every blocker that can be known, and every installer obtained and verified.
    False (with every step recorded, nothing changed on the node) when the run cannot finish."""
    plans = preflight.plan_all(steps, facts, options, conn)
    stop = (preflight.blocker(steps, plans) or preflight.artifacts(plans, fetch=True, progress=options.progress)
            or preflight.room(conn, plans))
    if stop is None:
        return True
    reporter.message(conn.name, f"{stop.step}: {stop.error} (found before any change: nothing was changed)")
    for step in steps:
        outcome = StepOutcome(step.name, step.title, plans[step.name], "not-run",
                              f"not run: step {stop.step} cannot finish (checked before any change)")
        if step.name == stop.step:
            outcome.result, outcome.error, outcome.error_fix = stop.result, stop.error, stop.fix
        report.outcomes.append(outcome)
    return False


def apply_pipeline(conn: Connection, steps: Sequence[Step], options: Options,
                   reporter: Reporter | None = None, *, journal: bool = True,
                   first: FirstCommand | None = None) -> RunReport:
    """Apply the pipeline in order, converging each step before the next one starts.
    Progress is recorded in the node's journal (gpunode/journal.py) unless `journal` is False. The whole run
    holds the node's lock (gpunode/nodelock.py): one gpunode run at a time changes a node. `first`: the run's
    first command, already sent (gpunode/cli/pipeline.py); it must be the one these steps make."""
    shown = reporter or NullReporter()
    with locked(conn, install_command(s.name for s in steps), options, shown, first) as (lock, facts):
        return _apply_pipeline(conn, steps, options, shown, facts, lock, journal=journal)


@contextlib.contextmanager
def locked(conn: Connection, command: str, options: Options, reporter: Reporter, first: FirstCommand | None = None
           ) -> Iterator[tuple[nodelock.Lock, Facts]]:
    """The node's lock for the block (nodelock.held: released on every way out) and the facts of the probe that
    ran in the same command once the lock was taken: a run that changes a node starts with one round trip.
    For install and `gpunode uninstall` (gpunode/undo/engine.py). `first`: that command, sent ahead."""
    first = first or FirstCommand(command)
    if first.command != command:
        raise ValueError(f"the first command was sent for {first.command!r}, not {command!r}")
    with first.held(conn, options.lock_timeout, lambda text: reporter.message(conn.name, text)) as lock:
        assert lock.then is not None  # given a script, a taken lock has its output
        yield lock, gather(conn, first=(first.probe, lock.then))


def _apply_pipeline(conn: Connection, steps: Sequence[Step], options: Options, reporter: Reporter, facts: Facts,
                    lock: nodelock.Lock, *, journal: bool = True) -> RunReport:
    report = RunReport(conn.name, "install")
    report.node, report.facts = facts.summary(), facts
    reporter.node(conn.name, facts)
    record = Journal(conn, install_command(s.name for s in steps), journal_text(facts)) if journal else None
    if record is not None:
        record.settle(_reboots_done(record, facts))  # a reboot owed since another boot has happened
    if record is not None and record.interrupted:
        reporter.message(conn.name, f"the run started {record.interrupted['started']} was interrupted; "
                                    "resuming from the node's current state")
    try:
        if _preflight(conn, steps, options, reporter, report, facts):
            run_steps(conn, steps, options, reporter, report, facts, record)
    except cancel.Cancelled as exc:
        report.interrupted, report.error, report.error_fix = True, exc.message, exc.fix
        raise RunInterrupted(exc, report) from None
    except GpunodeError:
        raise
    except Exception as exc:  # noqa: BLE001 - a bug outside any step (planning, preflight): failed, not a traceback
        _internal(report, exc)
    finally:
        if record is not None:
            # one bounded write, even after a hard abort (which stops every other remote command): the record
            # of how the run ended is what the next run and `gpunode status` go by
            with cancel.bind(cancel.CancelToken()):
                record.finish(journal_status(report), lock)  # the lock's release rides on its last write
            if record.error:
                reporter.message(conn.name, f"warning: {record.error}")
    return report


def _internal(report: RunReport, exc: Exception) -> None:
    report.traceback = traceback.format_exc()
    log.debug("%s", report.traceback)
    report.error, report.error_fix = internal_error(exc), INTERNAL_FIX


def _reboots_done(record: Journal, facts: Facts) -> tuple[tuple[str, str], ...]:
    """The owed reboots (recorded with the boot id of their time) that a boot since then has carried out."""
    return tuple(("reboot", str(p.get("target"))) for p in record.pending
                 if isinstance(p, dict) and p.get("effect") == "reboot" and facts.boot_id and p.get("target") != facts.boot_id)


def journal_status(report: RunReport) -> str:
    if report.interrupted:
        return "interrupted"
    return {0: "done", 3: "reboot-pending"}.get(report.exit_code, "failed")


def run_steps(conn: Connection, steps: Sequence[Step], options: Options, reporter: Reporter,
              report: RunReport, facts: Facts, record: Journal | None, loop: Loop = INSTALL) -> None:
    """THE run loop, for install and uninstall: every step in order, planned from the facts and the earlier plans,
    applied and converged (`converge`). Whatever stops a step (an error, a bug, Ctrl-C) is recorded on its outcome
    and in the journal before anything else happens; a Cancelled is then raised again, after the steps not
    reached are recorded as not run."""
    earlier: dict[str, StepPlan] = {}
    stopped: str | None = None
    interrupted: cancel.Cancelled | None = None
    for step in steps:
        if not stopped:
            try:
                cancel.checkpoint(f"step {step.name}")
            except cancel.Cancelled as exc:
                interrupted, stopped = exc, f"not run: {exc.message}"
        if stopped:
            plan = step.plan_with(facts, options, earlier)
            report.outcomes.append(StepOutcome(step.name, step.title, plan, "not-run", stopped))
            continue
        plan, facts = preflight.plan_asking(conn, step, facts, options, earlier)
        earlier[step.name] = plan
        reporter.planned(conn.name, step, plan)
        outcome = StepOutcome(step.name, step.title, plan, "ok")
        report.outcomes.append(outcome)
        try:
            if plan.status is Status.OK:
                continue
            if plan.status is Status.BLOCKED:
                outcome.result = "blocked"
                stopped = f"not run: step {step.name} is blocked"
                continue
            if plan.status is Status.UNKNOWN:
                outcome.result, outcome.error = "failed", f"could not decide what to do: {plan.reason}"
                stopped = f"not run: step {step.name} failed"
                continue
            try:
                facts = converge(conn, step, plan, facts, options, functools.partial(_replan, step, options, earlier),
                                 reporter, report, outcome, record, undoable=loop.undoable,
                                 what=f"{loop.what} {step.name}")
            except (cancel.Cancelled, KeyboardInterrupt) as exc:
                stop = exc if isinstance(exc, cancel.Cancelled) else _ABORTED()
                outcome.result, outcome.error, outcome.error_fix = "interrupted", stop.message, stop.fix
                interrupted, stopped = stop, f"not run: {stop.message}"
            except GpunodeError as exc:
                outcome.result, outcome.error, outcome.error_fix = "failed", exc.message, exc.fix
                stopped = f"not run: step {step.name} failed"
            except Exception as exc:  # noqa: BLE001 - a bug must still leave an honest record, not "done"
                report.traceback = traceback.format_exc()
                log.debug("step %s: %s", step.name, report.traceback)
                outcome.result, outcome.error = "failed", internal_error(exc)
                outcome.error_fix = INTERNAL_FIX
                stopped = f"not run: step {step.name} failed"
        finally:
            if record is not None and outcome.result != "ok":
                record.step(step.name, outcome.result, plan.reason, outcome.backups, outcome.error)
            if loop.done is not None:
                loop.done(step, outcome)
            _step_done(reporter, conn.name, outcome)
        if outcome.result == "reboot-pending" and loop.stop_at_reboot:
            stopped = "not run: waiting for the reboot"
    report.facts = facts
    if interrupted is None:
        interrupted = _stopped_at_the_end()
    if interrupted is not None:
        raise interrupted


def _replan(step: Step, options: Options, earlier: dict[str, StepPlan], fresh: Facts) -> StepPlan:
    return step.plan_with(fresh, options, earlier)


def _stopped_at_the_end() -> cancel.Cancelled | None:
    """A stop asked for during the last action (no checkpoint follows it): the run is still `interrupted`, never
    `done`, so whoever asked (Ctrl-C, a SIGTERM from systemd or `timeout`) is told it did not run to its end."""
    try:
        cancel.checkpoint("the end of the run")
    except cancel.Cancelled as exc:
        return exc
    return None


def converge(conn: Connection, step: Step, plan: StepPlan, facts: Facts, options: Options,
             replan: Callable[[Facts], StepPlan], reporter: Reporter, report: RunReport, outcome: StepOutcome,
             record: Journal | None = None, *, undoable: bool = True, what: str | None = None) -> Facts:
    """Apply a step's plan, then re-plan from fresh facts (`replan`) until it is `ok`, rebooting when only a reboot
    is left and --reboot allows it. Shared by install and `gpunode uninstall` (gpunode/undo/engine.py), which
    passes undoable=False: undoing a change records nothing to undo."""
    what = what or f"step {step.name}"
    actions = [a for a in plan.actions if not isinstance(a, Reboot)]
    if record is not None:  # ONE write before the first action: the run, and every effect the actions leave owed
        with record.batch():
            record.begin()
            for action in actions:
                if action.deferred():
                    record.change(step.name, action.summary, action.deferred())
    with record.batch() if record is not None else contextlib.nullcontext():  # ONE write after: undo, settled
        _apply_actions(conn, step, actions, reporter, outcome, record, undoable)
    facts = gather(conn)
    after = replan(facts)
    while after.status is not Status.OK:
        if not after.only_reboot_left:
            left = "; ".join(a.summary for a in after.actions) or after.reason
            raise CommandError(f"{what} did not converge: still {after.status} ({left})",
                               fix=fixes.SEE_OUTPUT_RERUN)
        if not options.reboot:
            if record is not None:  # the reboot is owed: `gpunode status` shows it until the node has rebooted
                record.change(step.name, "reboot required", (("reboot", facts.boot_id),))
            outcome.result = "reboot-pending"
            outcome.error = "reboot required, then run the same command again (or pass --reboot)"
            reporter.message(conn.name, f"{step.name}: {outcome.error}")
            return facts
        if conn.is_local:
            # The user asked for --reboot on the machine gpunode itself runs on: reboot, and say how to resume.
            conn.run(_REBOOT, sudo=True, timeout=60).check("starting the reboot")
            outcome.result = "reboot-pending"
            outcome.error = "this machine is rebooting now; run the same command again once it is back"
            reporter.message(conn.name, f"{step.name}: {outcome.error}")
            return facts
        if report.reboots >= options.max_reboots:
            raise CommandError(f"{what} still needs a reboot after {report.reboots} reboots",
                               fix="look at the node's console or logs; something undoes the change at boot")
        if record is not None:  # owed until the node answers with a new boot id
            record.change(step.name, "reboot", (("reboot", facts.boot_id),))
        facts = reboot_and_wait(conn, facts, options, reporter)
        report.reboots += 1
        if record is not None:
            record.settle(_reboots_done(record, facts))
        after = replan(facts)
    outcome.result = "changed"
    return facts


def _apply_actions(conn: Connection, step: Step, actions: list[Action], reporter: Reporter, outcome: StepOutcome,
                   record: Journal | None, undoable: bool) -> None:
    """Each action in order, with a Ctrl-C checkpoint before it; what it returns to undo it goes to the journal
    (in the caller's batch), and a record the node could not help make is a warning."""
    for action in actions:
        cancel.checkpoint(f"{step.name}: {action.summary}")
        reporter.action(conn.name, step, action, "start")
        try:
            # apply(), with what `gpunode uninstall` needs to undo it
            detail, undo = action.apply_recorded(conn) if undoable else (action.apply(conn), [])
        except Exception as exc:
            reporter.action(conn.name, step, action, "failed",
                            exc.message if isinstance(exc, GpunodeError) else internal_error(exc))
            raise
        if detail:
            outcome.backups.append(detail)
        if record is not None and undo:
            record.undo(step.name, undo)
        for gap in dict.fromkeys(r.gap for r in undo if r.gap):
            reporter.message(conn.name, f"warning: {step.name}: {action.summary}: {gap}")
        if record is not None and action.settles():
            record.settle(action.settles())
        reporter.action(conn.name, step, action, "done", detail or "")


# systemd queues the reboot and returns at once, so the command finishes before the connection drops;
# without systemd, a detached subshell reboots a second later.
_REBOOT = Script(
    name="reboot",
    body='if command -v systemctl >/dev/null 2>&1; then systemctl --no-block reboot; '
         'else (sleep 1; reboot) >/dev/null 2>&1 </dev/null & fi',
)
REBOOT_POLL_SECONDS = 2.0


def reboot_and_wait(conn: Connection, facts: Facts, options: Options, reporter: Reporter) -> Facts:
    """Reboot the node and wait until it answers with a NEW boot id (Ansible's reboot pattern)."""
    old = facts.boot_id
    reporter.message(conn.name, f"rebooting (boot id {old[:8]}), waiting up to {options.reboot_timeout:.0f}s")
    try:
        started = conn.run(_REBOOT, sudo=True, timeout=60)
        # No exit status (-1) means the session dropped before it could report: that is the reboot.
        if started.exit_code not in (0, -1) and not started.timed_out:
            started.check("starting the reboot")
    except ConnectError:
        pass  # the node went down before the command could report back: that is the reboot
    deadline = time.monotonic() + options.reboot_timeout
    _wait(REBOOT_POLL_SECONDS)
    while time.monotonic() < deadline:
        try:
            conn.reconnect(max(1.0, deadline - time.monotonic()))
            fresh = gather(conn)
        except cancel.Cancelled:
            raise
        except GpunodeError:
            _wait(REBOOT_POLL_SECONDS)
            continue
        if fresh.boot_id and fresh.boot_id != old:
            reporter.message(conn.name, f"back up (boot id {fresh.boot_id[:8]})")
            return fresh
        _wait(REBOOT_POLL_SECONDS)
    raise CommandError(f"{conn.name} did not come back with a new boot id within {options.reboot_timeout:.0f}s",
                       fix="check the node's console; raise --reboot-timeout if it boots slowly")


def _wait(seconds: float) -> None:
    """Sleep between reboot polls. The node is rebooting whatever we do, so the first Ctrl-C does not end the
    wait (the fleet's grace period bounds it); a hard abort (the second Ctrl-C) ends it at once."""
    end = time.monotonic() + seconds
    if cancel.sleep(seconds):  # woken by the first Ctrl-C: keep waiting, but in short naps that see an abort
        while time.monotonic() < end:
            cancel.check_abort("waiting for the node to come back from its reboot")
            time.sleep(min(0.1, max(0.0, end - time.monotonic())))
    cancel.check_abort("waiting for the node to come back from its reboot")
