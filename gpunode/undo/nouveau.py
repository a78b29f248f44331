"""Undo the nouveau step: the blacklist gpunode wrote goes (or the user's file comes back), then the initramfs is
rebuilt with the distribution's tool (gpunode/steps/nouveau.py knows which) so early boot forgets it too."""

from __future__ import annotations

from gpunode.facts import Facts
from gpunode.plan import RunCommand, StepPlan, blocked, change, ok
from gpunode.steps.nouveau import initramfs_command
from gpunode.undo.common import file_actions
from gpunode.undo.state import NodeState, Record, UndoRequest

NAME = "nouveau"


def plan(records: list[Record], state: NodeState, facts: Facts, request: UndoRequest) -> StepPlan:
    actions, notes = file_actions(records, state)
    if not actions:
        return ok(NAME, "no nouveau blacklist of gpunode's left", *notes)
    rebuild = initramfs_command(facts)
    if rebuild is None:
        return blocked(NAME, f"no known initramfs tool on {facts.os}: the blacklist would stay in the initramfs",
                       "install update-initramfs (initramfs-tools) or dracut, then run the same command again")
    return change(NAME, "remove the nouveau blacklist gpunode wrote",
                  [*actions, RunCommand("rebuild the initramfs without the blacklist", rebuild, timeout=900)],
                  *notes, "nouveau drives the GPUs again after the next boot (when no NVIDIA driver is loaded)")
