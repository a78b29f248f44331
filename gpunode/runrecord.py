"""This run's record in the node's journal (the format, and how it is read: gpunode/journal.py). Only runs that
change the node write it: install (gpunode/runner.py) and uninstall (gpunode/undo/engine.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import time
import uuid
from collections.abc import Iterator
from typing import Any

from gpunode import __version__
from gpunode.connection.base import Connection
from gpunode.errors import GpunodeError
from gpunode.journal import JOURNAL_PATH, KEEP_RUNS, journal_from, to_json
from gpunode.nodelock import Lock
from gpunode.records import UndoRecord
from gpunode.shell import Script


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class Journal:
    """This run's record in the node's journal. Writes are few: `batch()` gathers every record made inside it into
    one write, and a step's result waits for the next write (the run's `finish` at the latest, also after an error
    or Ctrl-C)."""

    def __init__(self, conn: Connection, command: str, text: str | None = None) -> None:
        """`text`: the journal as the probe read it, "" when there is none (saves a read); None: read it now."""
        self.conn = conn
        self.data = journal_from(conn, text)
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

    def finish(self, status: str, lock: Lock | None = None) -> None:
        """Record how the run ended (when it wrote anything at all). `lock`: the node's lock, released by the same
        command as this write, one round trip for both (a run that wrote nothing leaves it to Lock.release)."""
        if self.begun or self._unsaved:
            self.run["status"] = status
            self.run["finished"] = _now()
            unlock = lock.unlock() if lock is not None else None
            if self._save(unlock) and lock is not None and unlock is not None:
                lock.carried()

    def _save(self, then: Script | None = None) -> bool:
        """Best effort: the journal is a record, so failing to write it never fails the run itself (a failure is
        kept in `error`, for the run to show as a warning). True when the write succeeded, and so `then` (run after
        it in the same command) ran too; after a failure whether it ran is not always known."""
        if self._batching:
            self._unsaved = True
            return False
        self._unsaved = False
        try:
            self.conn.write_file(JOURNAL_PATH, to_json(self.data), mode=0o644, backup=False, then=then)
            self.error = None
        except GpunodeError as exc:
            self.error = f"could not update {JOURNAL_PATH}: {exc.message}"
            return False
        return True
