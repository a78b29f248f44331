"""Undo the fabricmanager step: the hold gpunode placed is released first (apt refuses to remove a held package:
"E: Held packages were changed and -y was used without --allow-change-held-packages"), the service gpunode
enabled is disabled and stopped, the packages gpunode installed are removed, then the CUDA repository gpunode
added for them (the cuda-keyring package, the repository files it created) unless a package another step of
gpunode installed, which this uninstall keeps, may still come from it. A hold on a package that was installed
before gpunode is released; the package stays."""

from __future__ import annotations

import re

from gpunode import pkgmgr
from gpunode.actions.packages import package_command
from gpunode.facts import Facts
from gpunode.plan import Action, StepPlan, change, ok
from gpunode.records import FileRecord
from gpunode.undo.common import file_actions, hold_actions, installed_by_gpunode, unit_actions
from gpunode.undo.state import LEGACY_NOTE, NodeState, Record, UndoRequest

NAME = "fabricmanager"
# what makes NVIDIA's CUDA repository on the node (the apt keyring package; dnf's is a .repo file)
REPOSITORY_PACKAGES = ("cuda-keyring",)
# packages NVIDIA's CUDA repository publishes (data): while gpunode keeps one of these, the repository stays
CUDA_REPO_PACKAGE = re.compile(r"^(cuda-|libcu|libnccl|libcudnn|libnvidia-|nvidia-|datacenter-gpu-manager|nsight)")


def plan(records: list[Record], state: NodeState, facts: Facts, request: UndoRequest) -> StepPlan:
    holds, hold_notes = hold_actions(records, state, request)
    units, unit_notes = unit_actions(records, state)
    manager, names, package_notes = installed_by_gpunode(records, state)
    needs = sorted(n for n in request.kept_packages if CUDA_REPO_PACKAGE.match(n))
    notes = [*hold_notes, *unit_notes, *package_notes]
    repo_records = [r for r in records if isinstance(r, FileRecord) and r.repository]
    repo_packages = [n for n in names if n in REPOSITORY_PACKAGES]
    if needs and (repo_records or repo_packages):
        notes.append(f"NVIDIA's CUDA repository is kept: {', '.join(needs)}, installed by gpunode and kept by this "
                     "uninstall, may come from it")
        names = [n for n in names if n not in REPOSITORY_PACKAGES]
        records = [r for r in records if not (isinstance(r, FileRecord) and r.repository)]
    files, file_notes = file_actions(records, state)
    notes += file_notes
    if request.legacy:
        notes.append(LEGACY_NOTE)
    actions: list[Action] = [*holds, *units]
    if names:
        m = pkgmgr.get(manager)
        first = [n for n in names if n not in REPOSITORY_PACKAGES]
        last = [n for n in names if n in REPOSITORY_PACKAGES]
        for group, what in ((first, "fabric manager packages gpunode installed"),
                            (last, "NVIDIA's CUDA repository gpunode added (its keyring package)")):
            if group:
                actions.append(package_command(f"remove the {what}: {', '.join(group)}", manager, m.remove(group),
                                               packages=group, lock_timeout=request.lock_timeout))
    actions += files
    if not actions:
        return ok(NAME, "nothing of the fabric manager left to undo", *notes)
    return change(NAME, "undo what gpunode installed for the fabric manager", actions, *notes)
