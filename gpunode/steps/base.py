"""The step contract. A step is a module in gpunode/steps/ with a pure `plan` function:

    plan(facts, options, earlier) -> StepPlan

`earlier` (gpunode.plan.Earlier) holds the plans, in this run, of the earlier steps the step declares in
`reads`; a step uses their typed outputs (gpunode/steps/outputs.py) and returns `unknown` rather than guess.
Steps never touch the node and define no I/O: their actions (gpunode/actions/) carry `apply(conn)`, which
the runner calls.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpunode.facts import Facts
from gpunode.options import Options
from gpunode.plan import Earlier, StepPlan
from gpunode.record import Frozen

PlanFn = Callable[[Facts, Options, Earlier], StepPlan]


@dataclass(frozen=True, eq=False, repr=False)
class Step(Frozen):
    name: str  # used by --only / --skip and in reports
    title: str
    plan: PlanFn
    reads: tuple[str, ...] = ()  # the earlier steps whose plans it reads

    def plan_with(self, facts: Facts, options: Options, plans: dict[str, StepPlan]) -> StepPlan:
        """Plan with the earlier plans of this run, of which it sees only those it declared."""
        return self.plan(facts, options, Earlier(plans, self.reads))
