"""What gpunode manages on a node, and so what an undo record may name: the files its steps write (by their own
constants), the repository and keyring directories packages and repository commands write into, the container
engines' configs nvidia-ctk edits, and the units its steps enable. A record naming anything else (a hand-edited
or forged journal) is never acted on: uninstall says which record it ignored and why.
"""

from __future__ import annotations

import posixpath
import re

from gpunode import driver_packages, pkgmgr
from gpunode.facts.bake import MARKER_PATH
from gpunode.facts.containers import (
    CONTAINERD_CONFIG,
    CONTAINERD_DROPIN_DIRS,
    CRIO_CONFIG,
    CRIO_DROPIN_DIR,
    DOCKER_CONFIG,
)
from gpunode.records import FileRecord, UndoRecord, UnitRecord
from gpunode.steps import fabricmanager, k8s, k8s_sharing, nodesettings, nouveau, toolkit

FILES = frozenset({
    nouveau.PATH, nodesettings.UNIT_PATH, nodesettings.DROPIN_PATH, nodesettings.RULE_PATH, nodesettings.UVM_LOAD_PATH,
    toolkit.APT_LIST, toolkit.APT_KEYRING, toolkit.YUM_REPO, toolkit.ZYPP_REPO, DOCKER_CONFIG, CONTAINERD_CONFIG,
    CRIO_CONFIG, MARKER_PATH, k8s.MANIFEST_PATH, driver_packages.APT_PIN,
    *(f"{k8s_sharing.UNIT_DIR}/{u}" for u in (k8s_sharing.MPS_UNIT, k8s_sharing.MIG_UNIT))})
# directories whose files (directly in them) gpunode may create: repositories, keyrings, engine drop-ins
DIRECTORIES = frozenset({*(m.repo_dir for m in pkgmgr.MANAGERS.values()), "/usr/share/keyrings", "/etc/apt/keyrings",
                         "/etc/apt/trusted.gpg.d",
                         *CONTAINERD_DROPIN_DIRS, CRIO_DROPIN_DIR})
UNITS = frozenset({nodesettings.UNIT, fabricmanager.UNIT, k8s_sharing.MPS_UNIT, k8s_sharing.MIG_UNIT})
_BACKUP = re.compile(r"\.gpunode-bak\.[A-Za-z0-9_-][A-Za-z0-9._-]*")  # gpunode's own backup names: PATH.gpunode-bak.SUFFIX


def managed_path(path: str) -> bool:
    """A file gpunode may have written: absolute, normalised, and one of its own paths or in one of its
    directories."""
    if not path.startswith("/") or posixpath.normpath(path) != path or "\n" in path:
        return False
    return path in FILES or posixpath.dirname(path) in DIRECTORIES


def outside(record: UndoRecord) -> str | None:
    """Why a record names something gpunode does not manage, or None when it is within what gpunode manages."""
    if isinstance(record, FileRecord):
        if not managed_path(record.path):
            return f"{record.path} is not a file gpunode writes"
        suffix = record.backup[len(record.path):] if record.backup and record.backup.startswith(record.path) else ""
        if record.backup is not None and not _BACKUP.fullmatch(suffix):
            return f"{record.backup} is not a backup gpunode makes of {record.path}"
    if isinstance(record, UnitRecord):
        name = record.unit if "." in record.unit else f"{record.unit}.service"
        if name not in UNITS:
            return f"{record.unit} is not a unit gpunode enables"
    return None


def within(records: list[UndoRecord]) -> tuple[list[UndoRecord], list[tuple[str, str]]]:
    """(the records uninstall may act on, (step, warning) per record it must ignore)."""
    kept: list[UndoRecord] = []
    warnings: list[tuple[str, str]] = []
    for r in records:
        why = outside(r)
        if why is None:
            kept.append(r)
        else:
            warnings.append((r.step, f"ignored a journal record of step {r.step or '?'}: {why} (the journal was "
                                     "edited by hand or damaged); nothing it names was touched"))
    return kept, warnings
