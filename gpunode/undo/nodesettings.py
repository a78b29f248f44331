"""Undo the nodesettings step: nvidia-persistenced disabled and stopped if gpunode enabled it, then the unit,
drop-in, udev rule and modules-load.d file gpunode wrote are removed and systemd reloads its units."""

from __future__ import annotations

from gpunode.facts import Facts
from gpunode.plan import RunCommand, StepPlan, change, ok
from gpunode.steps.nodesettings import DROPIN_PATH, SERVICE, UNIT, UNIT_PATH
from gpunode.undo.actions import RemoveFile, RestoreFile
from gpunode.undo.common import file_actions, unit_actions
from gpunode.undo.state import NodeState, Record, UndoRequest

NAME = "nodesettings"


def plan(records: list[Record], state: NodeState, facts: Facts, request: UndoRequest) -> StepPlan:
    units, unit_notes = unit_actions(records, state)
    files, file_notes = file_actions(records, state)
    actions = [*units, *files]
    if request.legacy and any(isinstance(a, RemoveFile) and a.path == UNIT_PATH for a in files):
        actions.insert(0, RunCommand(f"disable and stop {SERVICE} (gpunode wrote its unit)",
                                     ("systemctl", "disable", "--now", UNIT), timeout=120))
    if any(isinstance(a, RemoveFile | RestoreFile) and a.path in (UNIT_PATH, DROPIN_PATH) for a in files):
        actions.append(RunCommand("reload systemd's unit files", ("systemctl", "daemon-reload"), timeout=120))
    if not actions:
        return ok(NAME, "no node settings of gpunode's left", *unit_notes, *file_notes)
    return change(NAME, "undo the node settings gpunode made", actions, *unit_notes, *file_notes,
                  "/dev/char links are not files on disk: they are gone at the next boot")
