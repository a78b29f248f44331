"""Undo the runtime step: each engine config nvidia-ctk changed comes back from the copy made first, or, when the
user changed it since, loses only gpunode's entries (docker: the nvidia runtime and `default-runtime: nvidia`);
a file it created is removed. A running engine restarts to load it (owed in the journal until it has)."""

from __future__ import annotations

from gpunode.facts import Facts
from gpunode.facts import packages as package_facts
from gpunode.facts.containers import DOCKER_CONFIG, NVIDIA, ConfigError, dump_daemon_json, parse_daemon_json
from gpunode.facts.packages import unit
from gpunode.plan import Action, RestartService, StepPlan, change, ok
from gpunode.undo.common import file_actions
from gpunode.undo.state import LEGACY_NOTE, NodeState, Record, UndoRequest

NAME = "runtime"


def strip_docker(text: str) -> str | None:
    """daemon.json without the nvidia runtime and without nvidia as the default; every other key stays."""
    try:
        data = dict(parse_daemon_json(text))
    except ConfigError:
        return None
    runtimes = dict(data.get("runtimes") or {})
    if NVIDIA not in runtimes and data.get("default-runtime") != NVIDIA:
        return text
    runtimes.pop(NVIDIA, None)
    if runtimes:
        data["runtimes"] = runtimes
    else:
        data.pop("runtimes", None)
    if data.get("default-runtime") == NVIDIA:
        data.pop("default-runtime")
    return dump_daemon_json(data)


def plan(records: list[Record], state: NodeState, facts: Facts, request: UndoRequest) -> StepPlan:
    restart = {str(r["path"]): str(r.get("restart") or "") for r in records if r.get("kind") == "file"}
    files, notes = file_actions(records, state, strip={DOCKER_CONFIG: strip_docker}, restart=restart)
    if request.legacy:
        notes.append(LEGACY_NOTE)
    if not files:
        return ok(NAME, "no runtime configuration of gpunode's left", *notes)
    actions: list[Action] = list(files)
    units = facts[package_facts.UNITS]
    for name in dict.fromkeys(u for u in restart.values() if u):
        if unit(units, name).is_active:
            actions.append(RestartService(f"restart {name} so it loads its own configuration again", unit=name))
    return change(NAME, "take the nvidia runtime out of the engines gpunode configured", actions, *notes)
