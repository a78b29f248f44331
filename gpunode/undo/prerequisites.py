"""Undo the prerequisites step: KEPT by default (gcc, make, dkms and kernel headers are generic packages other
software uses); `gpunode uninstall --only prerequisites` removes the ones gpunode installed."""

from __future__ import annotations

from gpunode import fixes
from gpunode.facts import Facts
from gpunode.plan import StepPlan, change, ok
from gpunode.undo.common import installed_by_gpunode, package_actions
from gpunode.undo.state import NodeState, Record, UndoRequest

NAME = "prerequisites"


def plan(records: list[Record], state: NodeState, facts: Facts, request: UndoRequest) -> StepPlan:
    if not request.prerequisites:
        _, names, _ = installed_by_gpunode(records, state)
        if not names:
            return ok(NAME, "no build prerequisites of gpunode's installed")
        return ok(NAME, f"kept: {', '.join(names)} (build tools and headers other software uses)",
                  "to remove them too: " + fixes.gpunode("uninstall", only="prerequisites"))
    actions, notes = package_actions(records, state, request, "build prerequisites")
    if not actions:
        return ok(NAME, "no build prerequisites of gpunode's installed", *notes)
    return change(NAME, "remove the build prerequisites gpunode installed", actions, *notes)
