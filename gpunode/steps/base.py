"""The step contract. A step is a module in gpunode/steps/ with a pure `plan` function:

    plan(facts, options, earlier) -> StepPlan

`earlier` holds the plans of the steps before it in this run, for steps whose answer depends on them
(they return `unknown` rather than guess). Steps never touch the node: the runner executes their actions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gpunode.facts import Facts
from gpunode.options import Options
from gpunode.plan import StepPlan

PlanFn = Callable[[Facts, Options, Mapping[str, StepPlan]], StepPlan]


@dataclass(frozen=True)
class Step:
    name: str  # used by --only / --skip and in reports
    title: str
    plan: PlanFn
