"""Step: fabric manager on NVSwitch systems (HGX/DGX A100, H100, H200 boards).

On those boards every GPU sits in an NVLink fabric that nvidia-fabricmanager programs; without it, or with a
fabric manager whose version differs from the driver's by as much as a patch level, CUDA fails with "Error 802:
system not yet initialized" while nvidia-smi looks healthy. So the package is pinned to exactly the driver
version, held against upgrades, enabled and started, and the fabric state nvidia-smi reports is checked.
NVSwitches are found on PCI (class 0x0680) before the driver loads and in /proc/driver/nvidia-nvswitch after.
PCIe boards have none and skip; so do GB200/GB300-style racks, whose fabric is managed off the host.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from gpunode import driver_packages as routes
from gpunode import fabric_packages, fixes, pkgmgr, rules
from gpunode.facts import Facts
from gpunode.facts import fabric as fabric_facts
from gpunode.facts import packages as package_facts
from gpunode.facts.fabric import FM_PACKAGE, FabricGpu, off_host_fabric, parse_fabric
from gpunode.facts.packages import (
    Package,
    compare_versions,
    held_packages,
    parse_versionlock,
    unit,
    upstream_version,
)
from gpunode.options import Options
from gpunode.plan import Action, Earlier, RunCommand, Status, StepPlan, blocked, change, ok, unknown
from gpunode.shell import Script
from gpunode.steps.base import Step
from gpunode.steps.outputs import DriverOutputs

if TYPE_CHECKING:  # the actions are imported when a change is planned: a converged run plans none
    from gpunode.actions.fabric import StartFabricManager

NAME = "fabricmanager"
TITLE = "Fabric manager (NVSwitch systems)"
SERVICE = rules.FABRIC_MANAGER
UNIT = rules.FABRIC_MANAGER_UNIT
READS = ("driver",)  # fabric manager must match the driver version that will be in place
LOG = rules.FABRIC_MANAGER_LOG


def pick_version(offered: list[str], driver: str) -> str | None:
    """The offered version built for exactly this driver; NVIDIA's own (-1) before a distribution rebuild."""
    exact = [v for v in offered if upstream_version(v) == driver]
    return next((v for v in exact if v.endswith("-1")), exact[0] if exact else None)


# ---- NVIDIA's CUDA repository, where fabric manager lives for drivers that did not come from the distribution

_CUDA_KEYRING = Script(
    name="install-cuda-keyring",
    body='set -e; tmp=$(mktemp -d); trap \'rm -rf "$tmp"\' EXIT; curl -fsSL -o "$tmp/cuda-keyring.deb" "$1"; '
         'dpkg -i "$tmp/cuda-keyring.deb"',
)


def cuda_repo_actions(facts: Facts, manager: str, lock_timeout: float) -> list[Action] | None:
    """Add NVIDIA's CUDA repository the way NVIDIA documents it (cuda-keyring on apt, the .repo elsewhere)."""
    directory = routes.cuda_repo_dir(facts.os.id, facts.os.version, facts.os.family)
    base = routes.cuda_repo_base(facts.os.id, facts.os.version, facts.os.family, facts.arch)
    if directory is None or base is None:
        return None
    from gpunode.actions.packages import package_command

    if manager == "apt":
        return [package_command("add NVIDIA's CUDA repository (cuda-keyring), where fabric manager is published",
                                manager, Script(_CUDA_KEYRING.body, (f"{base}/{routes.CUDA_KEYRING_DEB}",),
                                                _CUDA_KEYRING.name), packages=("cuda-keyring",),
                                lock_timeout=lock_timeout, timeout=600)]
    m = pkgmgr.get(manager)
    actions: list[Action] = [package_command("add NVIDIA's CUDA repository", manager, m.add_repo(f"{base}/cuda-{directory}.repo"),
                               lock_timeout=lock_timeout, timeout=600)]
    if m.refresh_argv:
        actions.append(package_command("refresh it and accept NVIDIA's key", manager, m.refresh_argv,
                                       lock_timeout=lock_timeout, timeout=900))
    return actions


# ---- which driver must it match ----------------------------------------------------------------------------


def driver_target(facts: Facts, options: Options, earlier: Earlier) -> tuple[str, str] | None:
    """(version, where it came from): the driver step's outputs when it is part of this run, else --driver,
    else the loaded driver."""
    found = rules.driver_in_place(facts.loaded_driver.version if facts.loaded_driver else None, options.driver,
                                  earlier.outputs("driver", DriverOutputs))
    if found is None:
        return None
    return found.version, {"--driver": "--driver", "driver step": "the driver step",
                           "loaded": "the loaded driver"}[found.source]


def _loaded_by_driver_step(earlier: Earlier) -> bool:
    """The driver step of this run installs the driver and loads it without a reboot (an upgrade with
    --stop-gpu-services): fabric manager can start in the same run."""
    driver = earlier.plan("driver")
    return driver is not None and driver.status is Status.CHANGE and not driver.reboot_required


def unsettled(text: str) -> list[str]:
    """The GPUs whose fabric is not programmed yet, from the `fabric-state` output (what StartFabricManager
    waits for)."""
    return [f"GPU {g.gpu} {g.state}/{g.status}" for g in parse_fabric(text) if g.reported and not g.settled]


def _start(summary: str) -> StartFabricManager:
    from gpunode.actions.fabric import StartFabricManager

    return StartFabricManager(summary, service=SERVICE, log=LOG, unsettled=unsettled)


def _hold(m: pkgmgr.Manager, name: str, version: str, lock_timeout: float) -> Action:
    from gpunode.actions.packages import package_command

    what = {"apt": f"hold {name} so upgrades cannot separate it from the driver",
            "zypper": f"lock {name} against upgrades"}.get(m.name, f"versionlock {name} at {version}")
    return package_command(what, m.name, m.hold(name, version), packages=(name,), lock_timeout=lock_timeout,
                           timeout=600)


def _unhold(m: pkgmgr.Manager, names: list[str], lock_timeout: float) -> Action:
    from gpunode.actions.packages import package_command

    what = {"apt": "release the hold on ", "zypper": "unlock "}.get(m.name, "delete the versionlock of ")
    return package_command(what + ", ".join(names), m.name, m.unhold(names), packages=names,
                           lock_timeout=lock_timeout, timeout=600)


def _install(m: pkgmgr.Manager, name: str, version: str, current: Package | None, lock_timeout: float) -> Action:
    from gpunode.actions.packages import package_command

    spec = m.spec(name, version)
    down = current is not None and compare_versions(current.version, version) > 0
    argv = m.downgrade([spec]) if down and m.name == "yum" else m.install([spec], downgrade=True)
    return package_command(f"install {name} {version}, pinned to the driver version", m.name, argv,
                           packages=(name,), lock_timeout=lock_timeout)


def _remove(m: pkgmgr.Manager, names: list[str], lock_timeout: float) -> Action:
    from gpunode.actions.packages import package_command

    return package_command("remove " + ", ".join(names) + " (another fabric manager branch)", m.name,
                           m.remove(names), packages=names, lock_timeout=lock_timeout, timeout=900)


# ---- plan --------------------------------------------------------------------------------------------------


def _no_switch_plan(facts: Facts, fabric: list[FabricGpu], installed: Mapping[str, Package]) -> StepPlan:
    notes = []
    present = sorted(n for n in installed if FM_PACKAGE.match(n))
    if present:
        notes.append(f"{', '.join(present)} is installed but has nothing to manage here "
                     "(it exits with NV_WARN_NOTHING_TO_DO)")
    if off_host_fabric(fabric):
        return ok(NAME, "the NVLink fabric is managed off this host (GB200/GB300-style rack: the NVLink switch trays "
                        "run fabric management, compute trays use IMEX): nothing to install here", *notes)
    switches = facts[fabric_facts.NVLINK5_SWITCHES]
    if switches:
        return blocked(NAME, f"NVLink 5 switches found ({', '.join(switches)}): HGX B200-class systems need fabric "
                             "manager together with NVLSM, which gpunode does not set up yet",
                       "install nvidia-fabricmanager and nvlsm matching the driver by hand (NVIDIA Fabric Manager "
                       "User Guide), then run again with --skip fabricmanager", *notes)
    return ok(NAME, "no NVSwitch on this node (PCIe or directly linked GPUs): fabric manager is not needed", *notes)


def plan(facts: Facts, options: Options, earlier: Earlier | None = None) -> StepPlan:
    earlier = earlier or Earlier({}, READS)
    installed = facts[package_facts.PKG_STATUS]
    fabric = facts[fabric_facts.FABRIC_STATE]
    bound = facts[fabric_facts.NVSWITCH_DEVICES]
    if not facts.nvswitches and not bound:
        return _no_switch_plan(facts, fabric, installed)
    switches = f"{max(len(facts.nvswitches), len(bound))} NVSwitch"
    manager = facts.os.package_manager
    if manager is None:
        return blocked(NAME, f"{switches} found, but {facts.os} has no package manager gpunode drives",
                       f"install {SERVICE} at exactly the driver's version by hand, then run again with --skip "
                       "fabricmanager")
    target = driver_target(facts, options, earlier)
    if target is None:
        return unknown(NAME, f"{switches} found, but the driver version is not known yet and fabric manager must match "
                             "it exactly; pass --driver VERSION or install the driver first")
    driver, source = target
    m = pkgmgr.get(manager)
    name = fabric_packages.package_name(int(driver.split(".")[0]), m.package_format)
    offered = pick_version(facts[fabric_facts.FM_AVAILABLE].get(name, []), driver)
    version = offered or fabric_packages.package_version(driver)
    present = {n: p for n, p in installed.items() if FM_PACKAGE.match(n)}
    current = present.get(name)
    matches = current is not None and current.upstream == driver
    lock_files = facts[package_facts.PACKAGE_LOCKS]
    locks = {k: v for text in (lock_files.get("/etc/dnf/plugins/versionlock.list", ""),
                               lock_files.get("/etc/yum/pluginconf.d/versionlock.list", ""))
             for k, v in parse_versionlock(text).items()}
    locks.update(facts[fabric_facts.VERSIONLOCKS])  # the files, and the plugin's own answer
    held = held_packages(installed, lock_files) | set(locks)
    state = unit(facts[package_facts.UNITS], UNIT)
    if state.masked:
        return blocked(NAME, f"{UNIT} is masked: fabric manager cannot start", fixes.on_node(f"sudo systemctl unmask {SERVICE}")
                       + ", then run again")

    actions: list[Action] = []
    notes = [f"driver version {driver} from {source}"]
    problems = []
    if not matches:
        problems.append(f"{name} {current.version} does not match driver {driver}" if current else
                        f"{name} is not installed")
        stale = [n for n in present if n != name]
        unhold = [n for n in present if n in held]
        if unhold:
            actions.append(_unhold(m, unhold, options.lock_timeout))
        if stale:
            actions.append(_remove(m, stale, options.lock_timeout))
        if not offered:  # not in the local package metadata: NVIDIA's CUDA repository has it
            if not routes.cuda_repo_configured(facts[package_facts.PACKAGE_SOURCES]):
                repo = cuda_repo_actions(facts, manager, options.lock_timeout)
                if repo is None:
                    return blocked(NAME, f"{switches}: {name} {version} must come from NVIDIA's CUDA repository, "
                                         f"which has no build for {facts.os} ({facts.arch})",
                                   f"install {name} {version} by hand, hold it, then run again", *notes)
                actions += repo
            if manager == "apt" and m.refresh_argv:
                from gpunode.actions.packages import package_command

                actions.append(package_command("refresh the package lists", manager, m.refresh_argv,
                                               lock_timeout=options.lock_timeout, timeout=900))
        actions.append(_install(m, name, version, current, options.lock_timeout))
    hold_ok = matches and name in held and (not m.versionlock_plugin or
                                            locks.get(name, "").split("-")[0] == driver)
    if not hold_ok:
        if matches:
            problems.append(f"{name} is not held")
            if name in locks:  # a lock on another version: replace it
                actions.append(_unhold(m, [name], options.lock_timeout))
        from gpunode.actions.packages import versionlock_plugin

        actions += versionlock_plugin(manager, installed, lock_timeout=options.lock_timeout)
        actions.append(_hold(m, name, version, options.lock_timeout))

    loaded = facts.loaded_driver.version if facts.loaded_driver else None
    if loaded == driver:
        stuck = [g for g in fabric if g.reported and not g.settled and g.state != "In Progress"]
        if not matches or not state.is_active or not state.is_enabled:
            if matches and not state.is_active:
                problems.append(f"{UNIT} is {state.active}")
                log = facts.get(fabric_facts.FABRICMANAGER_LOG)
                if log and state.active == "failed":
                    notes.append(f"{LOG}: " + log.strip().splitlines()[-1])
            elif matches:
                problems.append(f"{UNIT} is not enabled")
            actions.append(_start(f"enable and start {SERVICE}, wait for the fabric"))
        elif stuck:
            problems.append("fabric not ready: " + "; ".join(f"GPU {g.gpu} {g.state}/{g.status}" for g in stuck[:4]))
            actions.append(_start(f"restart {SERVICE}, wait for the fabric"))
        elif any(g.state == "In Progress" for g in fabric):
            notes.append("the fabric is still being programmed (state In Progress)")
    elif _loaded_by_driver_step(earlier):
        actions.append(_start(f"enable and start {SERVICE}, wait for the fabric"))
        notes.append(f"driver {driver} is not loaded yet ({'loaded: ' + loaded if loaded else 'none loaded'}): the "
                     f"driver step loads it in this run, without a reboot, before {SERVICE} starts")
    else:
        if not matches or not state.is_enabled:
            actions.append(RunCommand(f"enable {SERVICE} (it starts with driver {driver})",
                                      ("systemctl", "enable", SERVICE)))
        notes.append(f"driver {driver} is not loaded yet ({'loaded: ' + loaded if loaded else 'none loaded'}): "
                     f"{SERVICE} starts once it is (after the reboot)")

    if not actions:
        running = "running" if loaded == driver else "enabled"
        settled = ", fabric Completed" if fabric and all(g.settled for g in fabric if g.reported) and \
            any(g.reported for g in fabric) else ""
        return ok(NAME, f"{switches}: {name} {current.version if current else version} held, {running}{settled}",
                  *notes)
    return change(NAME, f"{switches}: " + "; ".join(problems), actions, *notes)


STEP = Step(NAME, TITLE, plan, READS)
