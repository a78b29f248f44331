"""What a step intends to do: a status, a reason, concrete actions, and typed outputs for later steps.

Plans are plain data computed by pure functions. The same plan is shown by `gpunode plan` and executed by
`gpunode install`, so what a dry run predicts is exactly what an apply does (Ansible's check-mode contract).
A value a later step needs (the driver version that will be in place, the verify image...) travels in
`outputs`, never in the reason or the notes, which are for people.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import TypeVar

from gpunode.actions.base import Action, Reboot, RestartService, RunCommand, WriteFile
from gpunode.record import Frozen

__all__ = ["Action", "Earlier", "Outputs", "Reboot", "RestartService", "RunCommand", "Status", "StepPlan",
           "WriteFile", "blocked", "change", "ok", "unknown"]


class Status(str, Enum):
    OK = "ok"  # nothing to do
    CHANGE = "change"  # the actions will run
    BLOCKED = "blocked"  # cannot proceed: reason + fix
    UNKNOWN = "unknown"  # depends on an earlier step's effect; decided when that step has run

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, eq=False, repr=False)
class Outputs(Frozen):
    """Base of the typed values a step hands to later steps (gpunode/steps/outputs.py)."""

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


@dataclass(frozen=True, eq=False, repr=False)
class StepPlan(Frozen):
    step: str
    status: Status
    reason: str
    actions: tuple[Action, ...] = ()
    fix: str | None = None
    notes: tuple[str, ...] = field(default=())
    outputs: Outputs | None = None
    # blocked whatever the earlier steps do (a file on the node only a person can repair): preflight stops the run
    # before the first change even when a step this one reads is about to change something
    lasting: bool = False

    @property
    def reboot_required(self) -> bool:
        return any(isinstance(a, Reboot) for a in self.actions)

    @property
    def only_reboot_left(self) -> bool:
        return bool(self.actions) and all(isinstance(a, Reboot) for a in self.actions)

    def with_outputs(self, outputs: Outputs) -> StepPlan:
        return dataclasses.replace(self, outputs=outputs)

    def to_dict(self) -> dict[str, object]:
        return {
            "step": self.step,
            "status": self.status.value,
            "reason": self.reason,
            "fix": self.fix,
            "reboot_required": self.reboot_required,
            "actions": [a.to_dict() for a in self.actions],
            "notes": list(self.notes),
            "outputs": self.outputs.to_dict() if self.outputs is not None else None,
        }


OutputsT = TypeVar("OutputsT", bound=Outputs)


class Earlier:
    """The plans, in this run, of the earlier steps a step declared it reads (Step.reads). Asking for a step
    not declared is a programming error; a declared step that is not part of this run (--only/--skip) is None."""

    def __init__(self, plans: Mapping[str, StepPlan] | None = None, reads: Iterable[str] | None = None) -> None:
        self._plans = dict(plans or {})
        self.reads = tuple(self._plans) if reads is None else tuple(reads)
        self._plans = {name: plan for name, plan in self._plans.items() if name in self.reads}

    def plan(self, step: str) -> StepPlan | None:
        if step not in self.reads:
            raise KeyError(f"step reads {step!r} without declaring it (declared: {', '.join(self.reads) or 'none'})")
        return self._plans.get(step)

    def outputs(self, step: str, kind: type[OutputsT]) -> OutputsT | None:
        """The typed outputs of an earlier step's plan, or None when it is not in this run."""
        plan = self.plan(step)
        if plan is None or plan.outputs is None:
            return None
        if not isinstance(plan.outputs, kind):
            raise TypeError(f"step {step!r} hands {type(plan.outputs).__name__}, not {kind.__name__}")
        return plan.outputs


def ok(step: str, reason: str, *notes: str) -> StepPlan:
    return StepPlan(step, Status.OK, reason, notes=notes)


def change(step: str, reason: str, actions: list[Action] | tuple[Action, ...], *notes: str) -> StepPlan:
    return StepPlan(step, Status.CHANGE, reason, tuple(actions), notes=notes)


def blocked(step: str, reason: str, fix: str, *notes: str) -> StepPlan:
    return StepPlan(step, Status.BLOCKED, reason, fix=fix, notes=notes)


def unknown(step: str, reason: str, *notes: str) -> StepPlan:
    return StepPlan(step, Status.UNKNOWN, reason, notes=notes)
