"""`gpunode uninstall`: undo what gpunode did, step by step in the reverse of the pipeline's order, from the
typed undo records the node's journal keeps (gpunode/journal.py) and the node's current state.

Each step's undo planner is a pure function (records, NodeState, facts, UndoRequest) -> StepPlan whose actions
are ordinary actions (gpunode/actions/, gpunode/undo/actions.py): `--dry-run` renders them like `plan`, `--json`
like `plan --json`. gpunode/undo/engine.py reads the state and applies them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gpunode.errors import UsageError
from gpunode.facts import Facts
from gpunode.plan import StepPlan
from gpunode.steps import PIPELINE
from gpunode.undo import driver, fabricmanager, generic, nodesettings, nouveau, prerequisites, runtime
from gpunode.undo.state import NodeState, Record, UndoRequest

Planner = Callable[[list[Record], NodeState, Facts, UndoRequest], StepPlan]

_OWN: dict[str, Planner] = {"nouveau": nouveau.plan, "prerequisites": prerequisites.plan, "driver": driver.plan,
                            "runtime": runtime.plan, "nodesettings": nodesettings.plan,
                            "fabricmanager": fabricmanager.plan}
_WHAT = {"toolkit": "container toolkit", "compat": "compat step", "k8s": "Kubernetes setup"}

# the pipeline's order, reversed: what was installed last is undone first
ORDER: tuple[tuple[str, str, Planner], ...] = tuple(
    (s.name, s.title, _OWN.get(s.name) or generic.planner(s.name, _WHAT.get(s.name, s.name)))
    for s in reversed(PIPELINE))


def select(only: Sequence[str] = ()) -> UndoRequest:
    """--only STEP... -> the steps to undo, in undo order. Prerequisites are removed only when named."""
    known = [name for name, _, _ in ORDER]
    for name in only:
        if name not in known:
            raise UsageError(f"unknown step {name!r}", fix=f"choose from: {', '.join(s.name for s in PIPELINE)}")
    steps = tuple(n for n in known if not only or n in only)
    return UndoRequest(steps, prerequisites="prerequisites" in only)


def plan_step(name: str, records: list[Record], state: NodeState, facts: Facts, request: UndoRequest) -> StepPlan:
    planner = next(p for n, _, p in ORDER if n == name)
    return planner([r for r in records if r.step == name], state, facts, request)
