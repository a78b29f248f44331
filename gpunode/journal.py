"""A record on each node of what gpunode did there: runs, steps applied, results, backups made. This module is
the record's format and its reading (doctor's facts, `status`, uninstall); gpunode/runrecord.py writes it.

Written as the run goes (so an interrupted run is visible: its status stays "running"), and only once a
step actually has something to do: re-running on a finished node writes nothing at all. Read by
`gpunode status` and by the next `install`, which says it is resuming.

`pending` (top level, across runs) lists effects a change left owed, as {"effect", "target", "step", "since",
"run"}: ("restart", "docker.service") once nvidia-ctk changed docker's config, ("reboot", <boot id then>) once a
step needs a reboot. Each is written in the same write that records the change, BEFORE the change is made, and
cleared once carried out (the restart succeeded; the node runs another boot), so a run cut in between leaves it
for the next run (the runtime step restarts the engine; doctor reports it). Resuming needs no replay: every step
re-plans from fresh facts, so the next run simply continues where the node actually is.

`undo` (top level, never trimmed with old runs) holds typed records of what each change did
(gpunode/records.py, made by gpunode/actions/ `apply_recorded`), written with the step's result once its actions
have run: {"id", "run", "step", "time", "kind": "file" | "packages" | "hold" | "unit" | "driver", ...};
`gpunode uninstall` (gpunode/undo/) plans from them and marks each one it has undone with "undone": <run id>.

Reading checks the shape of everything it will use (`read_journal`): a damaged file is an error that names the
place and the fix, never a traceback in `status`, `install` or `uninstall`.
"""

from __future__ import annotations

import json
from typing import Any

from gpunode import fixes
from gpunode.connection.base import Connection
from gpunode.errors import GpunodeError
from gpunode.records import RecordError, parse_records

JOURNAL_PATH = "/var/lib/gpunode/journal.json"
KEEP_RUNS = 20


def owed_targets(text: str, effect: str) -> set[str]:
    """The targets of the owed effects of one kind ("restart", "start", ...) in a journal's text; nothing when the
    text is empty or not a journal (a fact reads the file raw: a broken journal is doctor's and install's concern)."""
    try:
        data = json.loads(text) if text.strip() else {}
    except (ValueError, RecursionError):
        return set()
    pending = data.get("pending") if isinstance(data, dict) else None
    if not isinstance(pending, list):
        return set()
    return {p["target"] for p in pending if isinstance(p, dict) and p.get("effect") == effect
            and isinstance(p.get("target"), str)}


def _shape(data: object) -> str | None:
    """What is wrong with a journal's shape (the parts gpunode reads), or None."""
    if not isinstance(data, dict):
        return f"it is a JSON {type(data).__name__}, not an object"
    runs = data.get("runs")
    if not isinstance(runs, list):
        return "'runs' is not a list"
    for i, run in enumerate(runs):
        if not isinstance(run, dict):
            return f"runs[{i}] is not an object"
        for key in ("id", "started", "status", "command"):
            if not isinstance(run.get(key, ""), str):
                return f"runs[{i}].{key} is not a string"
        steps = run.get("steps", [])
        if not isinstance(steps, list) or not all(isinstance(s, dict) for s in steps):
            return f"runs[{i}].steps is not a list of objects"
        for j, step in enumerate(steps):
            for key in ("step", "result", "reason"):
                if not isinstance(step.get(key, ""), str):
                    return f"runs[{i}].steps[{j}].{key} is not a string"
            if not isinstance(step.get("error") or "", str):
                return f"runs[{i}].steps[{j}].error is not a string"
            backups = step.get("backups") or []
            if not isinstance(backups, list) or not all(isinstance(b, str) for b in backups):
                return f"runs[{i}].steps[{j}].backups is not a list of paths"
        changes = run.get("changes") or []
        if not isinstance(changes, list) or not all(
                isinstance(c, dict) and isinstance(c.get("action", ""), str) for c in changes):
            return f"runs[{i}].changes is not a list of changes"
    pending = data.get("pending", [])
    if not isinstance(pending, list):
        return "'pending' is not a list"
    for i, p in enumerate(pending):
        if not isinstance(p, dict) or not all(isinstance(p.get(k, ""), str) for k in ("effect", "target", "step")):
            return f"pending[{i}] is not an owed effect (effect, target, step)"
    return None


def journal_from(conn: Connection, text: str | None) -> dict[str, Any]:
    """The journal from its text as the probe read it ("": there is none), or read now (None: not read yet)."""
    if text is None:
        return read_journal(conn)
    return parse_journal(text, conn.name) if text else {"schema_version": 1, "runs": []}


def read_journal(conn: Connection) -> dict[str, Any]:
    """The node's journal, or an empty one; its `undo` list typed (gpunode/records.py; absent: a journal from
    before undo records). A corrupt or damaged journal is reported with the fix, not overwritten silently."""
    text = conn.read_file(JOURNAL_PATH, sudo=False)
    if text is None:
        return {"schema_version": 1, "runs": []}
    return parse_journal(text, conn.name)


def parse_journal(text: str, host: str) -> dict[str, Any]:
    fix = "move it aside (it is only a record): " + fixes.on_node(f"sudo mv {JOURNAL_PATH} {JOURNAL_PATH}.broken")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested deeper than the parser goes
        why = str(exc) if isinstance(exc, ValueError) else "nested too deeply"
        raise GpunodeError(f"{host}: {JOURNAL_PATH} is not valid JSON ({why})", fix=fix) from None
    problem = _shape(data)
    if problem is None and "undo" in data:
        try:
            data["undo"] = parse_records(data["undo"])
        except RecordError as exc:
            problem = str(exc)
    if problem is not None:
        raise GpunodeError(f"{host}: {JOURNAL_PATH} has an unexpected shape: {problem}", fix=fix)
    return data


def to_json(data: dict[str, Any]) -> str:
    """The journal as written: typed records as their JSON objects."""
    undo = data.get("undo")
    shown = {**data, "undo": [r.to_dict() for r in undo]} if isinstance(undo, list) else data
    return json.dumps(shown, indent=2) + "\n"
