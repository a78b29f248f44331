"""A record on each node of what gpunode did there: runs, steps applied, results, backups made.

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

import contextlib
import dataclasses
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

from gpunode import __version__
from gpunode.connection.base import Connection
from gpunode.errors import GpunodeError
from gpunode.records import RecordError, UndoRecord, parse_records

JOURNAL_PATH = "/var/lib/gpunode/journal.json"
KEEP_RUNS = 20


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


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


def read_journal(conn: Connection) -> dict[str, Any]:
    """The node's journal, or an empty one; its `undo` list typed (gpunode/records.py; absent: a journal from
    before undo records). A corrupt or damaged journal is reported with the fix, not overwritten silently."""
    text = conn.read_file(JOURNAL_PATH, sudo=False)
    if text is None:
        return {"schema_version": 1, "runs": []}
    return parse_journal(text, conn.name)


def parse_journal(text: str, host: str) -> dict[str, Any]:
    fix = f"move it aside (it is only a record): sudo mv {JOURNAL_PATH} {JOURNAL_PATH}.broken"
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


class Journal:
    """This run's record in the node's journal. Writes are few: `batch()` gathers every record made inside it into
    one write, and a step's result waits for the next write (the run's `finish` at the latest, also after an error
    or Ctrl-C)."""

    def __init__(self, conn: Connection, command: str, text: str | None = None) -> None:
        """`text`: the journal as the probe read it (saves a read); None: read it now."""
        self.conn = conn
        self.data = parse_journal(text, conn.name) if text is not None else read_journal(conn)
        previous = self.data["runs"][-1] if self.data["runs"] else None
        self.interrupted = previous if previous and previous.get("status") == "running" else None
        if self.interrupted:
            self.interrupted["status"] = "interrupted"
        self.run: dict[str, Any] = {"id": uuid.uuid4().hex[:12], "started": _now(), "finished": None,
                                    "gpunode_version": __version__, "command": command, "status": "running",
                                    "steps": []}
        self.begun = False
        self.error: str | None = None  # the last failure to write the journal, if any
        self._batching = 0
        self._unsaved = False

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Every record made inside is saved in ONE write when the block ends (also when it ends by an error)."""
        self._batching += 1
        try:
            yield
        finally:
            self._batching -= 1
            if not self._batching and self._unsaved:
                self._save()

    def begin(self) -> None:
        """Record the run as started: called right before the first change."""
        if not self.begun:
            self.begin_quietly()
            self._save()

    def step(self, name: str, result: str, reason: str, backups: list[str], error: str | None = None) -> None:
        self.begin()
        self.run["steps"].append({"step": name, "result": result, "reason": reason, "backups": backups,
                                  "error": error, "time": _now()})
        self._unsaved = True  # written with the next write: the next change, or the run's finish

    @property
    def pending(self) -> list[dict[str, Any]]:
        """Effects owed on this node across runs (a restart that must load a changed config, ...)."""
        found = self.data.get("pending")
        return found if isinstance(found, list) else []

    def change(self, step: str, summary: str, owed: tuple[tuple[str, str], ...]) -> None:
        """Record, in ONE write made right before an action runs, the change it makes and the effects it leaves
        owed: if the run is cut after the change, the next run still knows (the runtime step reads them)."""
        self.begin_quietly()
        entries = [{"effect": effect, "target": target, "step": step, "since": _now(), "run": self.run["id"]}
                   for effect, target in owed]
        known = {(p.get("effect"), p.get("target")) for p in self.pending if isinstance(p, dict)}
        self.data["pending"] = [*self.pending, *(e for e in entries if (e["effect"], e["target"]) not in known)]
        self.run.setdefault("changes", []).append({"step": step, "action": summary, "owes": [list(o) for o in owed],
                                                   "time": _now()})
        self._save()

    @property
    def undo_records(self) -> list[UndoRecord]:
        found = self.data.get("undo")
        return found if isinstance(found, list) else []

    def undo(self, step: str, records: list[UndoRecord], *, save: bool = True) -> None:
        """Keep what it takes to undo a change that was made (typed, never re-parsed from text)."""
        self.begin_quietly()
        self.data["undo"] = [*self.undo_records, *(dataclasses.replace(
            r, id=uuid.uuid4().hex[:12], run=self.run["id"], step=step, time=_now()) for r in records)]
        if save:
            self._save()

    def start_undo_records(self) -> None:
        """An old journal (no `undo` yet) once its marker-only uninstall has run: from now on, records decide."""
        if "undo" not in self.data:
            self.begin_quietly()
            self.data["undo"] = []
            self._save()

    def undone(self, ids: set[str], *, save: bool = True) -> None:
        """Mark records as undone by this run: a later uninstall no longer plans from them."""
        marked = [dataclasses.replace(r, undone=self.run["id"]) if r.id in ids and not r.undone else r
                  for r in self.undo_records]
        if marked != self.undo_records:
            self.begin_quietly()
            self.data["undo"] = marked
            if save:
                self._save()

    def settle(self, done: tuple[tuple[str, str], ...]) -> None:
        """Clear owed effects once carried out."""
        keep = [p for p in self.pending if not (isinstance(p, dict) and (p.get("effect"), p.get("target")) in done)]
        if len(keep) != len(self.pending):
            self.begin_quietly()
            self.data["pending"] = keep
            self._save()

    def begin_quietly(self) -> None:
        """Add this run to the record without saving (the caller saves)."""
        if not self.begun:
            self.begun = True
            self.data["runs"] = [*self.data["runs"], self.run][-KEEP_RUNS:]

    def finish(self, status: str) -> None:
        if self.begun or self._unsaved:
            self.run["status"] = status
            self.run["finished"] = _now()
            self._save()

    def _save(self) -> None:
        """Best effort: the journal is a record, so failing to write it never fails the run itself."""
        if self._batching:
            self._unsaved = True
            return
        self._unsaved = False
        try:
            self.conn.write_file(JOURNAL_PATH, to_json(self.data), mode=0o644, backup=False)
            self.error = None
        except GpunodeError as exc:
            self.error = f"could not update {JOURNAL_PATH}: {exc.message}"
