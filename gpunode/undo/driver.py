"""Undo the driver step: the .run driver gpunode installed is removed by its own uninstaller
(`nvidia-installer --uninstall`); a driver that was there before gpunode, or was replaced since, is left alone;
the package holds gpunode placed for it (kernel holds) are released.

The uninstaller unloads the modules first and stops when something holds the GPU, so what holds it is read
before (gpunode/facts/holders.py, as for a driver upgrade) and decides the sequence:
- GPU services the earlier undo steps of this run do not stop themselves (persistenced and fabric manager are
  stopped by the nodesettings and fabricmanager undo when gpunode enabled them) -> blocked with the list unless
  --stop-gpu-services; with it they are stopped (StopGpuServices) and stay stopped: the driver they need is gone;
- processes that are no known service, and containers given GPUs -> blocked with the list (never ended);
- nvidia_drm held by DRM clients (a display server, the framebuffer console), which gpunode does not stop ->
  the uninstaller removes the files without unloading (`--skip-module-unload`) and a reboot follows (predicted),
  after which no NVIDIA module is loaded.
"""

from __future__ import annotations

import dataclasses
import shlex

from gpunode import fixes, pkgmgr
from gpunode.actions.driver import StopGpuServices, UnloadModules
from gpunode.actions.packages import package_command
from gpunode.facts import Facts
from gpunode.facts.holders import MODULES, Holders, gpu_holders
from gpunode.plan import Action, Reboot, RunCommand, Status, StepPlan, blocked, change, ok
from gpunode.records import DriverRecord
from gpunode.steps import PIPELINE
from gpunode.undo.common import file_actions, hold_actions, installed_by_gpunode
from gpunode.undo.state import LEGACY_NOTE, NodeState, Record, UndoRequest

NAME = "driver"
UNINSTALL = ("nvidia-installer", "--uninstall", "--silent")
SKIP_UNLOAD = "--skip-module-unload"


def _again(request: UndoRequest, *, stop_gpu_services: bool = False) -> fixes.Fix:
    """The same uninstall (its --only steps), with --stop-gpu-services when asked (gpunode/fixes.py)."""
    every = {s.name for s in PIPELINE}
    only = list(request.steps) if set(request.steps) != every else None
    return fixes.gpunode("uninstall", only=only, stop_gpu_services=stop_gpu_services)


def plan(records: list[Record], state: NodeState, facts: Facts, request: UndoRequest) -> StepPlan:
    holds, hold_notes = hold_actions(records, state, request)
    decided = _driver(records, state, facts, request)
    if not holds or decided.status is Status.BLOCKED:
        return dataclasses.replace(decided, notes=(*decided.notes, *hold_notes)) if hold_notes else decided
    actions = [*holds, *decided.actions]
    return change(NAME, decided.reason if decided.actions else "release the holds gpunode placed for the driver",
                  actions, *decided.notes, *hold_notes)


def _driver(records: list[Record], state: NodeState, facts: Facts, request: UndoRequest) -> StepPlan:
    installs = [r for r in records if isinstance(r, DriverRecord)]
    if not installs:
        return ok(NAME, "gpunode installed no driver here") if not request.legacy else ok(
            NAME, "not undone: the journal predates undo records", LEGACY_NOTE,
            "to remove a .run driver by hand: sudo nvidia-installer --uninstall --silent")
    first, last = installs[0], installs[-1]
    if last.source == "packages":
        return _packages(records, state, facts, request, last)
    previous, version = first.previous, last.version
    if version is None:  # the node did not say which version it installed: nothing to compare, so nothing removed
        return ok(NAME, "the driver gpunode installed was not recorded (the node did not report its version); left "
                        "as it is", "to remove a .run driver by hand: sudo nvidia-installer --uninstall --silent")
    if previous not in (None, "-"):
        return ok(NAME, f"driver {previous} was installed before gpunode; left in place",
                  f"gpunode installed {version} over it; to go back: " + fixes.gpunode("install", driver=previous)
                  if previous != "unknown" else "the driver installed before gpunode could not be told")
    loaded = facts.loaded_driver.version if facts.loaded_driver else None
    if state.driver is None:
        return ok(NAME, "could not tell which .run driver is installed; left as it is")
    if state.driver == "-":
        if loaded is not None and loaded == version:  # removed without unloading: the reboot unloads it
            return change(NAME, f"driver {version} is removed but still loaded",
                          [Reboot(f"reboot: driver {version} is removed from disk and still loaded (DRM clients "
                                  "hold nvidia_drm); no NVIDIA module loads at the next boot")])
        return ok(NAME, f"driver {version} is no longer installed")
    if state.driver != version:
        return ok(NAME, f"driver {state.driver} was installed since gpunode installed {version}; left in place")
    return _remove(facts, request, str(version), loaded)


def _packages(records: list[Record], state: NodeState, facts: Facts, request: UndoRequest, last: DriverRecord
              ) -> StepPlan:
    """--driver-source packages: purge exactly the packages the driver step's transactions added (still
    installed), with the same unloading sequence as the .run's uninstaller."""
    manager, names, notes = installed_by_gpunode(records, state)
    version = last.version or "(unknown version)"
    files, file_notes = file_actions(records, state)  # the apt pin gpunode wrote for the packages
    notes = [*notes, *file_notes]
    if not names:
        if files:
            return change(NAME, f"remove the apt pin of driver {version} (its packages are gone)", files, *notes)
        return ok(NAME, f"the driver packages gpunode installed (driver {version}) are no longer installed", *notes)
    loaded = facts.loaded_driver.version if facts.loaded_driver else None
    m = pkgmgr.get(manager or "apt")
    purge = package_command(f"remove NVIDIA driver {version} from packages (gpunode installed them): "
                            + ", ".join(names), m.name, m.purge(names), packages=names,
                            lock_timeout=request.lock_timeout)
    decided = _remove(facts, request, version, loaded, purge)
    if decided.status is Status.CHANGE and files:
        decided = dataclasses.replace(decided, actions=(*decided.actions, *files))
    return dataclasses.replace(decided, notes=(*decided.notes, *notes)) if notes else decided


def _remove(facts: Facts, request: UndoRequest, version: str, loaded: str | None,
            packaged: Action | None = None) -> StepPlan:
    modules = tuple(m for m in MODULES if facts.module_loaded(m))
    summary = f"remove NVIDIA driver {version} (gpunode installed it)"
    uninstall: Action = packaged or RunCommand(f"uninstall NVIDIA driver {version} (its own uninstaller; it "
                                               "unloads the modules)", UNINSTALL, timeout=1800)
    if loaded is None and not modules:
        return change(NAME, summary, [uninstall])
    found = gpu_holders(facts)
    notes: list[str] = []
    if found.unread:
        notes.append(f"could not read {', '.join(found.unread)}: the list of what holds the GPU may be incomplete")
    if found.kubelet:
        notes.append(f"a Kubernetes node ({found.kubelet}): drain it first (`{found.drain()}`)")
    services = tuple(u for u in found.services if u not in request.stopping)
    if found.blocking:
        return _blocked(found, services, version, request, notes)
    if services and not request.stop_gpu_services:
        listing = ", ".join(services)
        return blocked(NAME, f"driver {version} is loaded and held by {listing}: the uninstaller cannot unload it",
                       _again(request, stop_gpu_services=True) + f"  # stops {listing}; they stay stopped (the "
                       "driver they need is removed)", *notes)
    stays = tuple(m for m in found.stuck_modules if m in modules)
    actions: list[Action] = []
    if services:
        actions.append(StopGpuServices(f"stop {', '.join(services)} (they hold driver {version})", units=services,
                                       owed=()))
        notes.append(f"{', '.join(services)} stay stopped: the driver they need is removed (start them again once a "
                     "driver is installed)")
    if request.stopping and any(u in found.services for u in request.stopping):
        notes.append(f"{', '.join(u for u in request.stopping if u in found.services)} stopped by the earlier undo "
                     "steps (gpunode enabled them)")
    if modules:
        actions.append(UnloadModules(f"unload the driver {version} modules ({' '.join(modules)})", modules=modules,
                                     may_stay=stays))
    if stays:
        actions.append(packaged or RunCommand(f"uninstall NVIDIA driver {version} without unloading "
                                              f"{', '.join(stays)} (its own uninstaller)", (*UNINSTALL, SKIP_UNLOAD),
                                              timeout=1800))
        actions.append(Reboot(f"reboot: {', '.join(stays)} stays loaded (DRM clients use it) until the next boot, "
                              "which loads no NVIDIA module"))
        notes.append(f"{', '.join(stays)} is in use by DRM clients (a display server, the framebuffer console) that "
                     "gpunode does not stop: the driver's files are removed and the reboot unloads it")
    else:
        actions.append(uninstall)
    return change(NAME, summary, actions, *notes)


def _blocked(found: Holders, services: tuple[str, ...], version: str, request: UndoRequest, notes: list[str]
             ) -> StepPlan:
    fixes = []
    procs = [p for p in found.processes if not p.in_pod and not p.container]
    if procs:
        fixes.append("end or move " + ", ".join(f"PID {p.pid} ({p.name})" for p in procs[:6])
                     + " yourself (gpunode never ends a process that is not a known GPU service)")
    names = [c.name or c.id[:12] for c in found.containers] + \
        [p.container[:12] for p in found.processes if p.container and not p.in_pod]
    if names:
        fixes.append("`docker stop " + " ".join(shlex.quote(n) for n in dict.fromkeys(names)) + "`")
    if any(p.in_pod for p in found.processes):
        fixes.append(f"drain the node (`{found.drain()}`) and remove the GPU DaemonSet pods from it")
    again = _again(request, stop_gpu_services=bool(services) or request.stop_gpu_services)
    return blocked(NAME, f"driver {version} is in use: {'; '.join(found.lines())}. Its uninstaller needs every one "
                         "of these gone", "; ".join(fixes) + "; then " + again, *notes)
