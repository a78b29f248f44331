"""Undo the runtime step: each engine config nvidia-ctk changed comes back from the copy made first, or, when the
user changed it since, loses only gpunode's entries (gpunode/undo/engines.py: docker's nvidia runtime and
`default-runtime: nvidia`; containerd's nvidia runtime tables, `default_runtime_name = "nvidia"` and the drop-in
import; CRI-O's nvidia runtime and default); a file it created is removed. A running engine restarts to load it
(owed in the journal until it has)."""

from __future__ import annotations

import re

from gpunode.facts import Facts
from gpunode.facts import packages as package_facts
from gpunode.facts.containers import ConfigError, parse_toml
from gpunode.facts.packages import unit
from gpunode.plan import Action, RestartService, StepPlan, change, ok
from gpunode.records import FileRecord
from gpunode.undo.common import file_actions
from gpunode.undo.engines import BY_HAND, STRIP, strip_docker
from gpunode.undo.state import LEGACY_NOTE, NodeState, Record, UndoRequest

NAME = "runtime"
__all__ = ["NAME", "plan", "strip_docker"]


_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'[^\']*\'')


def _rewrites_exactly(engine: str, text: str) -> bool:
    """Whether writing this config back from its parsed data keeps everything of the user's but the layout:
    JSON has nothing else; TOML loses its comments, so a file with one is not."""
    if engine == "docker":
        return True
    if engine not in ("containerd", "crio"):
        return False
    try:
        parse_toml(text, "config")
    except ConfigError:
        return False
    return not any("#" in _STRINGS.sub("", line) for line in text.splitlines())


def plan(records: list[Record], state: NodeState, facts: Facts, request: UndoRequest) -> StepPlan:
    files_of = [r for r in records if isinstance(r, FileRecord)]
    restart = {r.path: r.restart for r in files_of}
    engine = {r.path: r.engine for r in files_of}
    if not any(engine.values()):  # records written before the engine was kept: docker's file by its name
        engine = {p: "docker" for p in engine if p.endswith("daemon.json")}
    strip = {p: STRIP[e] for p, e in engine.items() if e in STRIP}
    hints = {p: BY_HAND[e] for p, e in engine.items() if e in BY_HAND}
    files, notes = file_actions(records, state, strip=strip, restart=restart, hints=hints,
                                exact=lambda path, text: _rewrites_exactly(engine.get(path, ""), text))
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
