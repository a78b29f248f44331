"""Many nodes at once: bounded parallelism, rolling batches, a failure budget, Ctrl-C in two stages.

Each node runs in a worker thread with its own connection and a QueueReporter; only the main thread draws
(rich is not thread-safe). One node's failure never stops the others; `max_fail` only stops *new* batches
from starting once the share of failed nodes exceeds it, like Ansible's max_fail_percentage.

Ctrl-C: the first one stops dispatching (no new node, and through gpunode.cancel no new step) and gives the
running steps `grace` seconds to reach a safe point, announced by "interrupt" events with a countdown; a
second Ctrl-C, or the end of the grace period, aborts at once and names the nodes that may be mid-step.
Either way run_fleet returns every host's result (FleetResults.interrupted) so the caller prints the summary.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from gpunode.cancel import Cancelled, CancelToken, bind, exit_code, sigterm_as_ctrl_c
from gpunode.connection.base import Connection, Held
from gpunode.errors import ConnectError, GpunodeError, UsageError
from gpunode.facts import Facts
from gpunode.fleetlog import LOG_LEVELS, FleetLog, log_file_names, make_log_dir
from gpunode.inventory import InventoryHost
from gpunode.record import Record

if TYPE_CHECKING:  # for annotations only: a fleet of doctors loads nothing of the installer
    from gpunode.plan import Action, StepPlan
    from gpunode.runner import RunReport
    from gpunode.steps.base import Step

Event = tuple[str, str, Any]  # (kind, host, payload)


@dataclass(eq=False, repr=False)
class HostResult(Record):
    host: str
    status: str  # ok | changed | planned | failed | blocked | reboot-pending | unreachable | skipped | interrupted
    steps_changed: int = 0
    reboot_pending: bool = False
    error: str | None = None
    report: RunReport | None = field(default=None, repr=False)
    log: str | None = None

    @property
    def failed(self) -> bool:
        return self.status in ("failed", "blocked", "unreachable", "interrupted")

    def to_dict(self) -> dict[str, object]:
        return {"host": self.host, "status": self.status, "steps_changed": self.steps_changed,
                "reboot_pending": self.reboot_pending, "error": self.error, "log": self.log,
                "report": self.report.to_dict() if self.report else None}


def result_from_report(host: str, report: RunReport) -> HostResult:
    results = [o.result for o in report.outcomes]
    changed = sum(1 for r in results if r in ("changed", "planned"))
    first_error = next((o.error or o.plan.reason for o in report.outcomes
                        if o.result in ("failed", "blocked")), report.error)
    if report.interrupted:  # stopped by Ctrl-C at a safe point (the report's own state, as its exit code says)
        status = "interrupted"
    elif "failed" in results or report.error:
        status = "failed"
    elif "blocked" in results:
        status = "blocked"
    elif "reboot-pending" in results:
        status = "reboot-pending"
    elif report.dry_run:
        status = "planned" if changed else "ok"
    else:
        status = "changed" if changed else "ok"
    return HostResult(host, status, changed, report.reboot_pending, first_error, report)


class QueueReporter:
    """A runner Reporter for worker threads: events go to the main thread's queue and to the host's log."""

    def __init__(self, events: queue.Queue[Event], log: TextIO | None = None, name: str | None = None) -> None:
        self.events = events
        self.log = log
        self.name = name  # the inventory name: events are keyed by it, whatever the connection calls itself

    def _log(self, text: str) -> None:
        if self.log is not None:
            self.log.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {text}\n")
            self.log.flush()

    def node(self, host: str, facts: Facts) -> None:
        self._log(f"node: {facts.os}, kernel {facts.kernel}, {len(facts.gpus)} NVIDIA GPU(s)")
        self.events.put(("node", self.name or host, facts))

    def planned(self, host: str, step: Step, plan: StepPlan) -> None:
        self._log(f"[{step.name}] {plan.status.value}: {plan.reason}")
        self.events.put(("planned", self.name or host, (step.name, plan.status.value)))

    def action(self, host: str, step: Step, action: Action, state: str, detail: str = "") -> None:
        self._log(f"[{step.name}] {state}: {action.summary}" + (f" ({detail})" if detail else ""))
        self.events.put(("action", self.name or host, (step.name, state, action.summary)))

    def message(self, host: str, text: str) -> None:
        self._log(text)
        self.events.put(("message", self.name or host, text))


class LoggedConnection(Connection):
    """Wraps a connection so every command and its exit code land in the host's log file. Node output (which
    includes the contents of files read) is copied only at debug level (`log.debug`, see FleetLog); at the
    default level only a failed command's stderr tail is. Secrets are masked by the FleetLog either way."""

    def __init__(self, inner: Connection, log: TextIO, *, debug: bool | None = None) -> None:
        super().__init__()
        self.inner, self.log = inner, log
        self.debug = bool(getattr(log, "debug", False)) if debug is None else debug
        self.name, self.is_local = inner.name, inner.is_local
        self._privilege_cache = None

    def _privilege(self) -> tuple[tuple[str, ...], bool]:
        # learned here when the first command carried the root check (_run_if_root), else the inner one's
        return self._privilege_cache if self._privilege_cache is not None else self.inner._privilege()

    def _learns_root_inline(self) -> bool:
        return self.inner._privilege_cache is None and self.inner._learns_root_inline()

    def _password_line(self) -> bytes:
        return self.inner._password_line()

    def _exec(self, line: str, stdin: bytes, timeout: float | None) -> tuple[int, bytes, bytes, bool]:
        code, out, err, timed_out = self.inner._exec(line, stdin, timeout)
        shown = line if len(line) < 400 else line[:400] + f"... ({len(line)} chars)"
        self.log.write(f"$ {shown}\n  exit {code}{' (timed out)' if timed_out else ''}\n")
        failed = code != 0 or timed_out
        for label, data in (("stdout", out), ("stderr", err)):
            if not data or not (self.debug or (failed and label == "stderr")):
                continue
            lines = data.decode("utf-8", "replace")[-20000:].splitlines()
            if not self.debug:
                lines = lines[-20:]
            self.log.write(f"  {label}:\n" + "".join(f"    {ln}\n" for ln in lines))
        self.log.flush()
        return code, out, err, timed_out

    def upload(self, *args: Any, **kwargs: Any) -> str:
        return self.inner.upload(*args, **kwargs)

    def lock_owner(self) -> str | None:
        return self.inner.lock_owner()  # the node lock names the inner connection's process: no keeper channel

    def _hold(self, line: str, stdin: bytes, until: bytes, timeout: float) -> Held | None:
        self.log.write(f"$ {line[:400]}\n  (held until the run ends)\n")
        return self.inner._hold(line, stdin, until, timeout)

    def reconnect(self, timeout: float) -> None:
        self.inner.reconnect(timeout)

    def close(self) -> None:
        self.inner.close()


def batches(hosts: Sequence[InventoryHost], batch: str | None) -> list[list[InventoryHost]]:
    """--batch N or P% (of all hosts, rounded up, at least 1); None: one batch of everything."""
    if not batch:
        return [list(hosts)] if hosts else []
    text = batch.strip()
    try:
        size = math.ceil(len(hosts) * float(text[:-1]) / 100) if text.endswith("%") else int(text)
    except ValueError:
        raise UsageError(f"--batch {batch!r} is not a number or a percentage", fix="use e.g. --batch 5 or --batch 25%") \
            from None
    if size <= 0 or (text.endswith("%") and not 0 < float(text[:-1]) <= 100):
        raise UsageError(f"--batch {batch!r} must be positive", fix="use e.g. --batch 5 or --batch 25%")
    size = max(1, size)
    return [list(hosts[i:i + size]) for i in range(0, len(hosts), size)]


def parse_percent(value: str | None, option: str) -> float | None:
    if value is None:
        return None
    try:
        number = float(value.rstrip("%"))
    except ValueError:
        raise UsageError(f"{option} {value!r} is not a percentage", fix=f"use e.g. {option} 10%") from None
    if not 0 <= number <= 100:
        raise UsageError(f"{option} {value!r} must be between 0% and 100%", fix=f"use e.g. {option} 10%")
    return number


Work = Callable[[InventoryHost, QueueReporter, TextIO], HostResult]
GRACE_SECONDS = 30.0


class FleetResults(list[HostResult]):
    """Every host's result in inventory order; `interrupted` after a Ctrl-C, `aborted` after the second one
    (or when the grace period ran out), `maybe_mid_step` names hosts that were stopped while working."""

    interrupted: bool = False
    aborted: bool = False
    interrupted_exit: int = 130  # 143 when a SIGTERM stopped the run (gpunode/cancel.py EXIT_CODES)
    maybe_mid_step: list[str]

    def __init__(self, results: Sequence[HostResult] = ()) -> None:
        super().__init__(results)
        self.maybe_mid_step = []


def interrupt_text(payload: dict[str, Any]) -> str:
    """The line to show for an ("interrupt", "", payload) event."""
    running = ", ".join(payload.get("running", [])) or "none"
    if payload.get("stage") == "stopping":
        return (f"interrupted: no new node or step starts; waiting up to {payload['seconds_left']}s for the "
                f"running steps to stop at a safe point (running: {running}); press Ctrl-C again to abort now")
    return f"aborted: these nodes may be in the middle of a step: {running}"


def run_fleet(hosts: Sequence[InventoryHost], work: Work, *, parallel: int = 8, batch: str | None = None,
              max_fail: float | None = None, log_dir: Path | None = None,
              on_event: Callable[[Event], None] = lambda event: None, log_level: str = "info",
              grace: float = GRACE_SECONDS, token: CancelToken | None = None) -> FleetResults:
    """Run `work` on every host; the calling (main) thread receives every event through `on_event`.
    `log_level` "debug" copies node output into the per-host logs (see LoggedConnection)."""
    if parallel < 1:
        raise UsageError(f"--parallel {parallel} must be at least 1", fix="use e.g. --parallel 8")
    if log_level not in LOG_LEVELS:
        raise UsageError(f"--log-level {log_level!r} is not one of {', '.join(LOG_LEVELS)}",
                         fix="use --log-level info (default) or --log-level debug")
    groups = batches(hosts, batch)
    token = token or CancelToken()
    if log_dir is not None:
        try:
            make_log_dir(log_dir)
        except OSError as exc:
            raise UsageError(f"cannot create the log directory {log_dir}: {exc.strerror or exc}",
                             fix="pass a writable directory with --log-dir") from None
    run = _FleetRun(work, on_event, token, log_dir, log_file_names(h.name for h in hosts), log_level == "debug",
                    grace)
    failed = 0
    stop_reason: str | None = None
    with sigterm_as_ctrl_c(token):  # systemd stopping a unit, `timeout`, a CI limit: handled as a Ctrl-C
        for group in groups:
            if token.cancelled:
                stop_reason = f"not started: {token.reason}"
            if stop_reason:
                for host in group:
                    run.finish(host.name, HostResult(host.name, "skipped", error=stop_reason))
                continue
            failed += run.batch(group, parallel)
            if max_fail is not None and failed * 100 / len(hosts) > max_fail:
                stop_reason = (f"not started: {failed} of {len(hosts)} nodes failed, more than --max-fail "
                               f"{max_fail:g}%")
    results = FleetResults([run.results[h.name] for h in hosts])
    results.interrupted, results.aborted = token.cancelled, token.aborted
    results.interrupted_exit = exit_code(token)
    results.maybe_mid_step = run.mid_step
    return results


class _FleetRun:
    """One fleet run's state, driven from the main thread."""

    def __init__(self, work: Work, on_event: Callable[[Event], None], token: CancelToken, log_dir: Path | None,
                 log_names: dict[str, str], debug: bool, grace: float) -> None:
        self.work, self.on_event, self.token = work, on_event, token
        self.log_dir, self.log_names, self.debug, self.grace = log_dir, log_names, debug, grace
        self.events: queue.Queue[Event] = queue.Queue()
        self.results: dict[str, HostResult] = {}
        self.step: dict[str, str] = {}  # running host -> the step it is in
        self.mid_step: list[str] = []
        self.deadline: float | None = None
        self.announced: int | None = None

    def finish(self, host: str, result: HostResult) -> None:
        self.step.pop(host, None)
        self.results[host] = result
        self.on_event(("done", host, result))

    def batch(self, group: list[InventoryHost], parallel: int) -> int:
        """Run one batch to the end (or to an abort). Returns how many of its hosts failed."""
        pending: queue.Queue[InventoryHost] = queue.Queue()
        for host in group:
            pending.put(host)
        finished: queue.Queue[tuple[str, HostResult]] = queue.Queue()
        workers = [threading.Thread(target=self._worker, args=(pending, finished), daemon=True,
                                    name=f"gpunode-{i}") for i in range(min(parallel, len(group)))]
        for worker in workers:
            worker.start()
        while any(w.is_alive() for w in workers) or not self.events.empty() or not finished.empty():
            try:
                self._pump(finished)
            except KeyboardInterrupt:
                self._interrupted()
            if self.token.aborted:
                break
        if self.token.aborted:
            self._after_abort(group, workers, finished)
        else:
            while not pending.empty():  # dispatch stopped by the first Ctrl-C
                host = pending.get()
                self.finish(host.name, HostResult(host.name, "skipped", error=f"not started: {self.token.reason}"))
        return sum(1 for h in group if self.results[h.name].failed)

    def _pump(self, finished: queue.Queue[tuple[str, HostResult]]) -> None:
        try:
            event = self.events.get(timeout=0.1)
            kind, host, payload = event
            if kind == "action" and isinstance(payload, tuple):
                self.step[host] = payload[0]
            self.on_event(event)
        except queue.Empty:
            pass
        while not finished.empty():
            self.finish(*finished.get())
        if self.deadline is not None:
            left = max(0, int(self.deadline - time.monotonic() + 0.999))
            if left != self.announced:
                self.announced = left
                self._announce("stopping", left)
            if time.monotonic() >= self.deadline:
                self._abort()

    def _interrupted(self) -> None:
        if not self.token.cancelled:
            self.token.cancel()  # a SIGTERM's reason is on the token already (cancel.sigterm_as_ctrl_c)
            self.deadline = time.monotonic() + self.grace
        else:
            self._abort()

    def _abort(self) -> None:
        self.mid_step = sorted(h for h in self.step if h not in self.results)  # working at this moment
        self.token.abort()

    def _announce(self, stage: str, seconds_left: int = 0) -> None:
        running = self.mid_step if stage == "aborted" else sorted(self.step)
        payload = {"stage": stage, "seconds_left": seconds_left, "running": running}
        self.on_event(("interrupt", "", payload))

    def _after_abort(self, group: list[InventoryHost], workers: list[threading.Thread],
                     finished: queue.Queue[tuple[str, HostResult]]) -> None:
        """Give workers a moment to notice the abort (the connection layer polls for it), then report."""
        until = time.monotonic() + 1.0
        while any(w.is_alive() for w in workers) and time.monotonic() < until:
            time.sleep(0.05)
        while not finished.empty():
            self.finish(*finished.get())
        self._announce("aborted")
        for host in group:
            if host.name in self.results:
                continue
            if host.name in self.step:
                error = f"aborted during step {self.step[host.name]}: the node may be in the middle of it"
                self.finish(host.name, HostResult(host.name, "interrupted", error=error))
            else:
                self.finish(host.name, HostResult(host.name, "skipped", error=f"not started: {self.token.reason}"))

    def _worker(self, pending: queue.Queue[InventoryHost], finished: queue.Queue[tuple[str, HostResult]]) -> None:
        with bind(self.token):
            while not self.token.cancelled:
                try:
                    host = pending.get_nowait()
                except queue.Empty:
                    return
                self.step[host.name] = "connecting"
                finished.put((host.name, self._guarded(host)))

    def _guarded(self, host: InventoryHost) -> HostResult:
        """Run one host; whatever happens becomes a HostResult, never an exception in a worker."""
        log_path = self.log_dir / self.log_names[host.name] if self.log_dir is not None else None
        try:
            sink: Any = FleetLog.create(log_path, debug=self.debug) if log_path else _NullLog()
        except OSError as exc:
            return HostResult(host.name, "failed", error=f"cannot create the log file {log_path}: {exc.strerror}")
        with sink as log:
            reporter = QueueReporter(self.events, log, host.name)
            try:
                result = self.work(host, reporter, log)
            except Cancelled as exc:
                log.write(f"interrupted: {exc.message}\n")
                result = HostResult(host.name, "interrupted", error=exc.message)
            except ConnectError as exc:
                log.write(f"unreachable: {exc.message}\n")
                result = HostResult(host.name, "unreachable", error=exc.message)
            except GpunodeError as exc:
                log.write(f"failed: {exc.message}\n")
                result = HostResult(host.name, "failed", error=exc.message)
            except Exception as exc:  # noqa: BLE001 - one node's bug must not take the fleet down
                log.write(f"internal error: {exc!r}\n")
                result = HostResult(host.name, "failed", error=f"internal error: {exc!r}")
        result.log = str(log_path) if log_path else None
        return result


class _NullLog:
    debug = False

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass

    def __enter__(self) -> _NullLog:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

