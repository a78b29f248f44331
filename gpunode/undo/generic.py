"""Undo for steps with nothing of their own to add (toolkit, compat, fabricmanager, k8s): units gpunode enabled,
holds it placed, packages it installed (after which the repository files and keyrings it created can go), files it wrote."""

from __future__ import annotations

from collections.abc import Callable

from gpunode.facts import Facts
from gpunode.plan import StepPlan, change, ok
from gpunode.undo.common import file_actions, hold_actions, package_actions, unit_actions
from gpunode.undo.state import LEGACY_NOTE, NodeState, Record, UndoRequest


def planner(name: str, what: str) -> Callable[[list[Record], NodeState, Facts, UndoRequest], StepPlan]:
    def plan(records: list[Record], state: NodeState, facts: Facts, request: UndoRequest) -> StepPlan:
        holds, hold_notes = hold_actions(records, state, request)
        units, unit_notes = unit_actions(records, state)
        packages, package_notes = package_actions(records, state, request, what)
        files, file_notes = file_actions(records, state)
        notes = [*hold_notes, *unit_notes, *package_notes, *file_notes, *([LEGACY_NOTE] if request.legacy else [])]
        actions = [*holds, *units, *packages, *files]
        if not actions:
            return ok(name, f"nothing of the {what} left to undo", *notes)
        return change(name, f"undo what gpunode installed for the {what}", actions, *notes)
    return plan
