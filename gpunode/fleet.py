"""Many nodes at once: bounded parallelism, rolling batches, a failure budget.

Each node runs in a worker thread with its own connection and a QueueReporter; only the main thread draws
(rich is not thread-safe). One node's failure never stops the others; `max_fail` only stops *new* batches
from starting once the share of failed nodes exceeds it, like Ansible's max_fail_percentage.
"""

from __future__ import annotations

import math
import queue
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from gpunode.connection.base import Connection
from gpunode.errors import ConnectError, GpunodeError, UsageError
from gpunode.facts import Facts
from gpunode.inventory import InventoryHost
from gpunode.plan import Action, StepPlan
from gpunode.runner import RunReport
from gpunode.steps.base import Step

Event = tuple[str, str, Any]  # (kind, host, payload)


@dataclass
class HostResult:
    host: str
    status: str  # ok | changed | planned | failed | blocked | reboot-pending | unreachable | skipped
    steps_changed: int = 0
    reboot_pending: bool = False
    error: str | None = None
    report: RunReport | None = field(default=None, repr=False)
    log: str | None = None

    @property
    def failed(self) -> bool:
        return self.status in ("failed", "blocked", "unreachable")

    def to_dict(self) -> dict[str, object]:
        return {"host": self.host, "status": self.status, "steps_changed": self.steps_changed,
                "reboot_pending": self.reboot_pending, "error": self.error, "log": self.log,
                "report": self.report.to_dict() if self.report else None}


def result_from_report(host: str, report: RunReport) -> HostResult:
    results = [o.result for o in report.outcomes]
    changed = sum(1 for r in results if r in ("changed", "planned"))
    first_error = next((o.error or o.plan.reason for o in report.outcomes
                        if o.result in ("failed", "blocked")), report.error)
    if "failed" in results or report.error:
        status = "failed"
    elif "blocked" in results:
        status = "blocked"
    elif "reboot-pending" in results:
        status = "reboot-pending"
    elif report.mode == "plan":
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
    """Wraps a connection so every command, its exit code and its output land in the host's log file."""

    def __init__(self, inner: Connection, log: TextIO) -> None:
        super().__init__()
        self.inner, self.log = inner, log
        self.name, self.is_local = inner.name, inner.is_local
        self._privilege_cache = None

    def _privilege(self) -> tuple[tuple[str, ...], bool]:
        return self.inner._privilege()

    def _password_line(self) -> bytes:
        return self.inner._password_line()

    def _exec(self, line: str, stdin: bytes, timeout: float | None) -> tuple[int, bytes, bytes, bool]:
        code, out, err, timed_out = self.inner._exec(line, stdin, timeout)
        shown = line if len(line) < 400 else line[:400] + f"... ({len(line)} chars)"
        self.log.write(f"$ {shown}\n  exit {code}{' (timed out)' if timed_out else ''}\n")
        for label, data in (("stdout", out), ("stderr", err)):
            if data:
                text = data.decode("utf-8", "replace")
                self.log.write(f"  {label}:\n" + "".join(f"    {ln}\n" for ln in text[-20000:].splitlines()))
        self.log.flush()
        return code, out, err, timed_out

    def upload(self, *args: Any, **kwargs: Any) -> None:
        self.inner.upload(*args, **kwargs)

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


def run_fleet(hosts: Sequence[InventoryHost], work: Work, *, parallel: int = 8, batch: str | None = None,
              max_fail: float | None = None, log_dir: Path | None = None,
              on_event: Callable[[Event], None] = lambda event: None) -> list[HostResult]:
    """Run `work` on every host; the calling (main) thread receives every event through `on_event`."""
    if parallel < 1:
        raise UsageError(f"--parallel {parallel} must be at least 1", fix="use e.g. --parallel 8")
    events: queue.Queue[Event] = queue.Queue()
    results: dict[str, HostResult] = {}
    failed = 0
    stop_reason: str | None = None
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
    for group in batches(hosts, batch):
        if stop_reason:
            for host in group:
                results[host.name] = HostResult(host.name, "skipped", error=stop_reason)
                on_event(("done", host.name, results[host.name]))
            continue
        with ThreadPoolExecutor(max_workers=min(parallel, len(group)), thread_name_prefix="gpunode") as pool:
            futures: dict[Future[HostResult], InventoryHost] = {
                pool.submit(_guarded, work, host, events, log_dir): host for host in group}
            while any(not f.done() for f in futures) or not events.empty():
                try:
                    on_event(events.get(timeout=0.05))
                except queue.Empty:
                    pass
            for future, host in futures.items():
                result = future.result()
                results[host.name] = result
                failed += result.failed
                on_event(("done", host.name, result))
        if max_fail is not None and failed * 100 / len(hosts) > max_fail:
            stop_reason = f"not started: {failed} of {len(hosts)} nodes failed, more than --max-fail {max_fail:g}%"
    return [results[h.name] for h in hosts]


def _guarded(work: Work, host: InventoryHost, events: queue.Queue[Event], log_dir: Path | None) -> HostResult:
    """Run one host; whatever happens becomes a HostResult, never an exception in the pool."""
    log_path = log_dir / f"{host.name}.log" if log_dir is not None else None
    sink: Any = open(log_path, "w", encoding="utf-8") if log_path else _NullLog()  # noqa: SIM115
    with sink as log:
        reporter = QueueReporter(events, log, host.name)
        try:
            result = work(host, reporter, log)
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
    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass

    def __enter__(self) -> _NullLog:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

