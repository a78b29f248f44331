"""Undo the driver step: the .run driver gpunode installed is removed by its own uninstaller
(`nvidia-installer --uninstall`), which unloads the modules first; a driver that was there before gpunode, or
was replaced since, is left alone."""

from __future__ import annotations

from gpunode.facts import Facts
from gpunode.plan import RunCommand, StepPlan, change, ok
from gpunode.undo.state import LEGACY_NOTE, NodeState, Record, UndoRequest

NAME = "driver"
UNINSTALL = ("nvidia-installer", "--uninstall", "--silent")


def plan(records: list[Record], state: NodeState, facts: Facts, request: UndoRequest) -> StepPlan:
    installs = [r for r in records if r.get("kind") == "driver"]
    if not installs:
        return ok(NAME, "gpunode installed no driver here") if not request.legacy else ok(
            NAME, "not undone: the journal predates undo records", LEGACY_NOTE,
            "to remove a .run driver by hand: sudo nvidia-installer --uninstall --silent")
    first, last = installs[0], installs[-1]
    previous, version = first.get("previous"), last.get("version")
    if previous not in (None, "-"):
        return ok(NAME, f"driver {previous} was installed before gpunode; left in place",
                  f"gpunode installed {version} over it; to go back: gpunode install --driver {previous}"
                  if previous != "unknown" else "the driver installed before gpunode could not be told")
    if state.driver is None:
        return ok(NAME, "could not tell which .run driver is installed; left as it is")
    if state.driver == "-":
        return ok(NAME, f"driver {version} is no longer installed")
    if state.driver != version:
        return ok(NAME, f"driver {state.driver} was installed since gpunode installed {version}; left in place")
    return change(NAME, f"remove NVIDIA driver {version} (gpunode installed it)",
                  [RunCommand(f"uninstall NVIDIA driver {version} (its own uninstaller; it unloads the modules)",
                              UNINSTALL, timeout=1800)],
                  "if a process still uses the GPU the uninstaller stops: stop it (or reboot), then run again")
