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

`undo` (top level, never trimmed with old runs) holds typed records of what each change did, written right
after it (gpunode/actions/ `apply_recorded`): {"id", "run", "step", "time", "kind": "file" | "packages" |
"unit" | "driver", ...}; `gpunode uninstall` (gpunode/undo/) plans from them and marks each one it has undone
with "undone": <run id>.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from gpunode import __version__
from gpunode.connection.base import Connection
from gpunode.errors import GpunodeError

JOURNAL_PATH = "/var/lib/gpunode/journal.json"
KEEP_RUNS = 20


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def owed_targets(text: str, effect: str) -> set[str]:
    """The targets of the owed effects of one kind ("restart", "start", ...) in a journal's text; nothing when the
    text is empty or not a journal (a fact reads the file raw: a broken journal is doctor's and install's concern)."""
    try:
        data = json.loads(text) if text.strip() else {}
    except ValueError:
        return set()
    pending = data.get("pending") if isinstance(data, dict) else None
    if not isinstance(pending, list):
        return set()
    return {p["target"] for p in pending if isinstance(p, dict) and p.get("effect") == effect
            and isinstance(p.get("target"), str)}


def read_journal(conn: Connection) -> dict[str, Any]:
    """The node's journal, or an empty one. A corrupt journal is reported, not overwritten silently."""
    text = conn.read_file(JOURNAL_PATH, sudo=False)
    if text is None:
        return {"schema_version": 1, "runs": []}
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise GpunodeError(f"{conn.name}: {JOURNAL_PATH} is not valid JSON ({exc})",
                           fix=f"move it aside (it is only a record): sudo mv {JOURNAL_PATH} {JOURNAL_PATH}.broken"
                           ) from None
    if not isinstance(data, dict) or not isinstance(data.get("runs"), list):
        raise GpunodeError(f"{conn.name}: {JOURNAL_PATH} has an unexpected shape",
                           fix=f"move it aside: sudo mv {JOURNAL_PATH} {JOURNAL_PATH}.broken")
    return data


class Journal:
    def __init__(self, conn: Connection, command: str) -> None:
        self.conn = conn
        self.data = read_journal(conn)
        previous = self.data["runs"][-1] if self.data["runs"] else None
        self.interrupted = previous if previous and previous.get("status") == "running" else None
        if self.interrupted:
            self.interrupted["status"] = "interrupted"
        self.run: dict[str, Any] = {"id": uuid.uuid4().hex[:12], "started": _now(), "finished": None,
                                    "gpunode_version": __version__, "command": command, "status": "running",
                                    "steps": []}
        self.begun = False
        self.error: str | None = None  # the last failure to write the journal, if any

    def begin(self) -> None:
        """Record the run as started: called right before the first change."""
        if not self.begun:
            self.begin_quietly()
            self._save()

    def step(self, name: str, result: str, reason: str, backups: list[str], error: str | None = None) -> None:
        self.begin()
        self.run["steps"].append({"step": name, "result": result, "reason": reason, "backups": backups,
                                  "error": error, "time": _now()})
        self._save()

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
    def undo_records(self) -> list[dict[str, Any]]:
        found = self.data.get("undo")
        return [r for r in found if isinstance(r, dict)] if isinstance(found, list) else []

    def undo(self, step: str, records: list[dict[str, Any]]) -> None:
        """Keep what it takes to undo a change that was just made (typed, never re-parsed from text)."""
        self.begin_quietly()
        self.data["undo"] = [*self.undo_records, *({**r, "id": uuid.uuid4().hex[:12], "run": self.run["id"],
                                                     "step": step, "time": _now()} for r in records)]
        self._save()

    def start_undo_records(self) -> None:
        """An old journal (no `undo` yet) once its marker-only uninstall has run: from now on, records decide."""
        if "undo" not in self.data:
            self.begin_quietly()
            self.data["undo"] = []
            self._save()

    def undone(self, ids: set[str]) -> None:
        """Mark records as undone by this run: a later uninstall no longer plans from them."""
        marked = False
        for record in self.undo_records:
            if record.get("id") in ids and not record.get("undone"):
                record["undone"] = self.run["id"]
                marked = True
        if marked:
            self.begin_quietly()
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
        if self.begun:
            self.run["status"] = status
            self.run["finished"] = _now()
            self._save()

    def _save(self) -> None:
        """Best effort: the journal is a record, so failing to write it never fails the run itself."""
        try:
            self.conn.write_file(JOURNAL_PATH, json.dumps(self.data, indent=2) + "\n", mode=0o644, backup=False)
            self.error = None
        except GpunodeError as exc:
            self.error = f"could not update {JOURNAL_PATH}: {exc.message}"
