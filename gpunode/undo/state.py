"""What an undo plan is decided from, besides the facts: the journal's undo records and the node's current
state of exactly what they name (file hashes and texts, installed packages, units, the .run driver)."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpunode.record import Frozen
from gpunode.records import FileRecord, UndoRecord, UnitRecord

Record = UndoRecord


@dataclass(frozen=True, eq=False, repr=False)
class NodeState(Frozen):
    files: dict[str, str] = field(default_factory=dict)  # path -> sha256, or "-" when absent (missing: unknown)
    texts: dict[str, str | None] = field(default_factory=dict)  # path -> content (text files; for diffs)
    packages: dict[str, str] | None = None  # installed name -> version; None: could not tell
    units: dict[str, str] = field(default_factory=dict)  # unit -> `systemctl is-enabled` word
    driver: str | None = None  # the .run driver's version, "-" none, None unknown
    holds: frozenset[str] | None = None  # held packages (apt-mark showhold, versionlock list); None: unknown


@dataclass(frozen=True, eq=False, repr=False)
class UndoRequest(Frozen):
    steps: tuple[str, ...]  # the steps to undo (pipeline names), in undo order
    prerequisites: bool = False  # remove the build prerequisites gpunode installed (only with --only prerequisites)
    lock_timeout: float = 600.0
    legacy: bool = False  # the journal predates undo records: only files carrying gpunode's marker are removed
    stop_gpu_services: bool = False  # --stop-gpu-services: stop the GPU services still holding the driver to remove
    stopping: tuple[str, ...] = ()  # units the earlier undo steps of this run stop (disable --now)
    kept_packages: frozenset[str] = frozenset()  # packages other gpunode steps installed that this run keeps


MARKER = "Written by gpunode"
LEGACY_NOTE = ("the node's journal predates gpunode's undo records: only files that still carry gpunode's marker "
               "are removed; packages, the driver and engine configurations are not undone")


def paths(records: list[Record]) -> list[str]:
    """Every file a record names, and its backups."""
    found: list[str] = []
    for r in records:
        if isinstance(r, FileRecord):
            found += [p for p in (r.path, r.backup) if p]
    return list(dict.fromkeys(found))


def units(records: list[Record]) -> list[str]:
    return list(dict.fromkeys(r.unit for r in records if isinstance(r, UnitRecord)))
