"""The typed undo records the node's journal keeps (gpunode/journal.py `undo`): what one change did, so that
`gpunode uninstall` (gpunode/undo/) can take it back. Actions make them when they run (`Action.apply_recorded`);
the journal stores them as JSON objects with a "kind" and reads them back through `from_dict`, which checks every
field's type: a damaged or hand-edited journal is an error with its place named, never a traceback later.

Journals written by earlier releases hold the same objects (the fields were always these): they are read as they
are; a field an old record lacks takes its default.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from gpunode.record import Frozen


class RecordError(ValueError):
    """An undo record that is not what gpunode writes (its message names the field)."""


def _text(data: dict[str, Any], key: str, *, optional: bool = False, default: str = "") -> Any:
    value = data.get(key, None if optional else default)
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise RecordError(f"{key!r} is {type(value).__name__}, not a string")
    return value


def _flag(data: dict[str, Any], key: str, *, optional: bool = False) -> Any:
    value = data.get(key, None if optional else False)
    if value is None and optional:
        return None
    if not isinstance(value, bool):
        raise RecordError(f"{key!r} is {type(value).__name__}, not true or false")
    return value


def _names(data: dict[str, Any], key: str) -> tuple[str, ...]:
    value = data.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RecordError(f"{key!r} is not a list of names")
    return tuple(value)


@dataclass(frozen=True, kw_only=True, eq=False, repr=False)
class UndoRecord(Frozen):
    """What every record carries besides its kind's own fields: its id, the run and step that made it, when, and
    the run that undid it (empty while not undone)."""

    id: str = ""
    run: str = ""
    step: str = ""
    time: str = ""
    undone: str = ""

    kind: ClassVar[str] = ""
    # fields written only when set (the others always are, as earlier releases wrote them)
    optional: ClassVar[frozenset[str]] = frozenset({"id", "run", "step", "time", "undone", "mode", "engine", "restart",
                                                     "repository", "marker", "unknown", "source",
                                                     "packages"})

    @property
    def gap(self) -> str | None:
        """What this record could not capture (the node did not answer a look-up), for a warning when it is made;
        None when it is complete."""
        return None

    def to_dict(self) -> dict[str, Any]:
        shown: dict[str, Any] = {"kind": self.kind}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in self.optional and not value:
                continue
            shown[f.name] = [list(v) for v in value] if f.name == "installed" else (
                list(value) if isinstance(value, tuple) else value)
        return shown

    @classmethod
    def _own(cls, data: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def from_dict(cls, data: object) -> UndoRecord:
        """A record from the journal's JSON. Raises RecordError naming what is wrong."""
        if not isinstance(data, dict):
            raise RecordError(f"a record is {type(data).__name__}, not an object")
        kind = data.get("kind")
        made = KINDS.get(kind) if isinstance(kind, str) else None
        if made is None:
            raise RecordError(f"unknown record kind {kind!r}")
        common = {k: _text(data, k) for k in ("id", "run", "step", "time")}
        undone = data.get("undone") or ""
        if not isinstance(undone, str):
            raise RecordError(f"'undone' is {type(undone).__name__}, not a run id")
        return made(**common, undone=undone, **made._own(data))


@dataclass(frozen=True, kw_only=True, eq=False, repr=False)
class FileRecord(UndoRecord):
    """A file gpunode wrote (or a command it ran created): whether it existed before, the copy of the user's file
    made first, the sha256 of what gpunode left there. `engine`/`restart` for a container engine's config,
    `repository` for a repository file a package created, `marker` for an old journal's guess."""

    path: str
    existed: bool | None = None  # None: could not tell
    backup: str | None = None
    sha256: str | None = None
    mode: str | None = None
    engine: str = ""
    restart: str = ""
    repository: bool = False
    marker: bool = False

    kind: ClassVar[str] = "file"

    @classmethod
    def _own(cls, data: dict[str, Any]) -> dict[str, Any]:
        path = _text(data, "path")
        if not path:
            raise RecordError("a file record names no path")
        return {"path": path, "existed": _flag(data, "existed", optional=True),
                "backup": _text(data, "backup", optional=True) or None,
                "sha256": _text(data, "sha256", optional=True), "mode": _text(data, "mode", optional=True),
                "engine": _text(data, "engine", optional=True) or "",
                "restart": _text(data, "restart", optional=True) or "",
                "repository": bool(_flag(data, "repository", optional=True)),
                "marker": bool(_flag(data, "marker", optional=True))}


@dataclass(frozen=True, kw_only=True, eq=False, repr=False)
class PackagesRecord(UndoRecord):
    """The packages one transaction installed that were not there before (name, version); `unknown` when the node
    could not list its packages, so what it installed is not known."""

    manager: str
    installed: tuple[tuple[str, str], ...] = ()
    unknown: bool = False

    kind: ClassVar[str] = "packages"

    @classmethod
    def _own(cls, data: dict[str, Any]) -> dict[str, Any]:
        found = data.get("installed") or []
        if not isinstance(found, list) or not all(
                isinstance(p, list) and len(p) == 2 and all(isinstance(v, str) for v in p) for p in found):
            raise RecordError("'installed' is not a list of [name, version] pairs")
        return {"manager": _text(data, "manager"), "installed": tuple((p[0], p[1]) for p in found),
                "unknown": bool(_flag(data, "unknown", optional=True))}

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.installed)

    @property
    def gap(self) -> str | None:
        return ("the node did not list its packages, so what this transaction installed is not known: uninstall "
                "will keep it") if self.unknown else None


@dataclass(frozen=True, kw_only=True, eq=False, repr=False)
class HoldRecord(UndoRecord):
    """The package holds (apt-mark hold, versionlock, zypper locks) that appeared with one of gpunode's holds."""

    manager: str
    held: tuple[str, ...] = ()
    unknown: bool = False

    kind: ClassVar[str] = "hold"

    @property
    def gap(self) -> str | None:
        return ("the node did not list its package holds, so the hold placed is not known: uninstall will keep it"
                if self.unknown else None)

    @classmethod
    def _own(cls, data: dict[str, Any]) -> dict[str, Any]:
        return {"manager": _text(data, "manager"), "held": _names(data, "held"),
                "unknown": bool(_flag(data, "unknown", optional=True))}


@dataclass(frozen=True, kw_only=True, eq=False, repr=False)
class UnitRecord(UndoRecord):
    """A unit gpunode enabled, and its `systemctl is-enabled` word before ("unknown": could not tell)."""

    unit: str
    was: str = "unknown"

    kind: ClassVar[str] = "unit"

    @classmethod
    def _own(cls, data: dict[str, Any]) -> dict[str, Any]:
        unit = _text(data, "unit")
        if not unit:
            raise RecordError("a unit record names no unit")
        return {"unit": unit, "was": _text(data, "was", optional=True) or "unknown"}


@dataclass(frozen=True, kw_only=True, eq=False, repr=False)
class DriverRecord(UndoRecord):
    """The driver gpunode installed (None: the node could not tell) and the one in place before it (None:
    none; "unknown": could not tell); `source` "packages" when it came from repository packages (their
    PackagesRecord and HoldRecord say which: `uninstall` removes those), "" for the .run. `packages`: every
    package of the route as NAME=VERSION, the ones already there too (what status lists and doctor checks)."""

    version: str | None = None
    previous: str | None = None
    source: str = ""
    packages: tuple[str, ...] = ()

    kind: ClassVar[str] = "driver"

    @property
    def gap(self) -> str | None:
        return ("the node did not report the .run driver's version after the install: uninstall will not remove "
                "it" if self.version is None else None)

    @classmethod
    def _own(cls, data: dict[str, Any]) -> dict[str, Any]:
        return {"version": _text(data, "version", optional=True), "previous": _text(data, "previous", optional=True),
                "source": _text(data, "source", optional=True) or "", "packages": _names(data, "packages")}


KINDS: dict[str, type[UndoRecord]] = {k.kind: k for k in (FileRecord, PackagesRecord, HoldRecord, UnitRecord,
                                                          DriverRecord)}


def parse_records(found: object, where: str = "undo") -> list[UndoRecord]:
    """The journal's `undo` list, typed. Raises RecordError naming the first bad entry."""
    if not isinstance(found, list):
        raise RecordError(f"{where!r} is {type(found).__name__}, not a list")
    records = []
    for i, item in enumerate(found):
        try:
            records.append(UndoRecord.from_dict(item))
        except RecordError as exc:
            raise RecordError(f"{where}[{i}]: {exc}") from None
    return records
