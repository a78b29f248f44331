"""`--progress jsonl`: machine-readable progress for engines (DaemonSets, Slurm, cloud-init, Packer).

One JSON object per line on stdout, flushed per line; every human word goes to stderr. The events come from the
runner's Reporter (the same calls that draw the human progress), so they are the same for this machine and for a
node over SSH. Schema 1 (docs/engines.md); every event has `schema`, `event`, `time` (UTC) and `host`:

    run_start       mode, gpunode_version, steps, node (os, kernel, gpus, driver_loaded, ...)
    step_planned    step, status (ok|change|blocked|unknown), reason, actions, reboot_required
    action_start    step, action
    action_end      step, action, result (done|failed), detail
    message         text
    step_result     step, result (runner.RESULTS), error, fix
    reboot_required step, reason
    run_end         mode, state, exit_code, ready, reboot_required, reboots, error, fix, next

Node text (reasons, errors, details) is passed through ui.clean(): plain text, control characters made visible,
then JSON-escaped. Fixes and `next` are runnable for the node as printed (gpunode/cli/_target.py)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import TextIO

from gpunode import __version__
from gpunode.facts import Facts
from gpunode.plan import Action, StepPlan
from gpunode.runner import RunReport, StepOutcome
from gpunode.steps.base import Step
from gpunode.ui import Fixer, clean

SCHEMA = 1
EVENTS = ("run_start", "step_planned", "action_start", "action_end", "message", "step_result", "reboot_required",
          "run_end")
FORMATS = ("human", "jsonl")


def _same(text: str) -> str:
    return text


def _text(value: str | None, fixer: Fixer = _same) -> str | None:
    return None if value is None else clean(fixer(value))


class JsonlReporter:
    """The runner's Reporter (and OutcomeReporter) writing schema-1 events to a stream, one line each."""

    def __init__(self, mode: str, steps: Sequence[Step], fixer: Fixer = _same, stream: TextIO | None = None) -> None:
        self.mode = mode
        self.steps = [s.name for s in steps]
        self.fixer = fixer
        self.stream = stream if stream is not None else sys.stdout
        self.reported: set[str] = set()

    def emit(self, event: str, host: str, **fields: object) -> None:
        record = {"schema": SCHEMA, "event": event,
                  "time": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"), "host": clean(host), **fields}
        self.stream.write(json.dumps(record, ensure_ascii=True, sort_keys=False) + "\n")
        self.stream.flush()

    # -- the runner's Reporter ----------------------------------------------------------------------------------
    def node(self, host: str, facts: Facts) -> None:
        summary = json.loads(json.dumps(facts.summary(), default=str))  # plain JSON values only
        self.emit("run_start", host, mode=self.mode, gpunode_version=__version__, steps=self.steps,
                  node=_cleaned(summary))

    def planned(self, host: str, step: Step, plan: StepPlan) -> None:
        self.emit("step_planned", host, step=step.name, status=plan.status.value,
                  reason=_text(plan.reason, self.fixer), actions=[clean(a.summary) for a in plan.actions],
                  reboot_required=plan.reboot_required)

    def action(self, host: str, step: Step, action: Action, state: str, detail: str = "") -> None:
        if state == "start":
            self.emit("action_start", host, step=step.name, action=clean(action.summary))
        else:
            self.emit("action_end", host, step=step.name, action=clean(action.summary), result=state,
                      detail=clean(detail))

    def message(self, host: str, text: str) -> None:
        self.emit("message", host, text=_text(text, self.fixer))

    def step_done(self, host: str, outcome: StepOutcome) -> None:
        self.reported.add(outcome.step)
        self.emit("step_result", host, step=outcome.step, result=outcome.result,
                  reason=_text(outcome.plan.reason, self.fixer), error=_text(outcome.error, self.fixer),
                  fix=_text(outcome.fix, self.fixer))
        if outcome.result == "reboot-pending":
            self.emit("reboot_required", host, step=outcome.step, reason=_text(outcome.error, self.fixer))

    # -- the end of the run ---------------------------------------------------------------------------------------
    def finish(self, report: RunReport, next_step: str | None) -> None:
        """The results the runner did not report live (plan mode, steps not run), then `run_end`."""
        for outcome in report.outcomes:
            if outcome.step not in self.reported:
                self.step_done(report.host, outcome)
        self.emit("run_end", report.host, mode=report.mode, state=report.state, exit_code=report.exit_code,
                  ready=report.ready, reboot_required=report.reboot_pending, reboots=report.reboots,
                  error=_text(report.error, self.fixer), fix=_text(report.error_fix, self.fixer),
                  next=_text(next_step))


def _cleaned(value: object) -> object:
    if isinstance(value, str):
        return clean(value)
    if isinstance(value, dict):
        return {clean(k): _cleaned(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_cleaned(v) for v in value]
    return value
