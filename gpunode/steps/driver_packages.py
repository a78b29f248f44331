"""The driver step with `--driver-source packages`: the distribution's or NVIDIA's repository packages at exactly
the --driver release (routes and version schemes: gpunode/driver_packages.py, data/driver_package_routes.csv).

The same contract as the .run (gpunode/steps/driver.py): the open or proprietary module chosen per GPU; every
package at an exact distribution version in the plan, and the run refused before its first change when the
configured repositories do not offer one (with the command that adds the repository); the packages held
(apt-mark hold / dnf versionlock / zypper addlock) unless --no-hold-driver; a loaded driver replaced by the .run's
upgrade sequence (stop the GPU services that hold it, unload, install, load, start); the other source removed
first when a node switches (a .run that gpunode installed, by its own uninstaller; a .run installed by someone
else is refused with the command that removes it); --bake installs without a GPU and loads nothing; the package's
DKMS builds at install only for the kernels its maintainer script picks (routes.dkms_kernels), so a bake kernel
outside them gets its own `dkms autoinstall -k K`.
"""

from __future__ import annotations

import dataclasses
import shlex

from gpunode import bake, fixes, pkgmgr, signing
from gpunode import driver_packages as routes
from gpunode.facts import Facts, transaction
from gpunode.facts import driver as driver_facts
from gpunode.facts import fabric as fabric_facts
from gpunode.facts.driver import DriverState
from gpunode.facts.holders import MODULES
from gpunode.facts.packages import PKG_STATUS
from gpunode.options import Options
from gpunode.plan import Action, Earlier, Reboot, RunCommand, Status, StepPlan, WriteFile, blocked, change, ok
from gpunode.rules import NO_GPU, NO_GPU_FIX

NAME = "driver"
UNINSTALL_RUN = ("nvidia-installer", "--uninstall", "--silent")


manager_of = routes.manager_of
installed = routes.installed


def route_of(facts: Facts, options: Options, version: str, flavour: str) -> routes.Route | StepPlan:
    os_key = routes.route_os(facts.os.id, facts.os.family)
    if os_key is None:
        return blocked(NAME, f"no packages route for {facts.os.id or 'this OS'} {facts.os.version}: gpunode knows "
                             "Debian's non-free, Ubuntu's archive, NVIDIA's CUDA repository for the RHEL family and "
                             "SUSE", fixes.same_run(options, "install", driver_source="run") + "  # NVIDIA's .run")
    kernel = (bake.target_kernel(facts, options) if options.bake else None) or facts.kernel
    gsp = flavour == "open" or any(_gsp_gpu(d.device) for d in facts.gpus)
    return routes.plan_route(os_key, version, flavour, kernel=kernel, secure_boot=facts.secure_boot.enabled,
                             gsp=gsp, offered=facts[driver_facts.OFFERED],
                             desktop=bool(facts[driver_facts.DISPLAY_MANAGER]))


def _gsp_gpu(device: int) -> bool:
    """A GPU whose driver runs GSP firmware (Turing and newer: the GPUs that can run the open module)."""
    from gpunode.steps.driver import _open_need

    return _open_need(device) != "unsupported"


def _missing(facts: Facts, options: Options, route: routes.Route, version: str, notes: list[str]) -> StepPlan:
    os_key = routes.route_os(facts.os.id, facts.os.family) or ""
    lines = []
    for w in route.missing:
        have = ", ".join(w.offered[:6]) if w.offered else "none"
        lines.append(f"{w.name} (offered: {have})")
    offered_any = any(w.offered for w in route.packages)
    where = f" (into {routes.DEBIAN_NONFREE_LIST}, gpunode's own file)" if os_key == "debian" else ""
    repo_dir = routes.cuda_repo_dir(facts.os.id, facts.os.version, facts.os.family)
    fix = (routes.sources_fix(os_key, facts.os.codename, facts.os.version, repo_dir, facts.arch)
           + f"  # makes the repository available{where}; then run the same command again") if not offered_any else (
        fixes.on_node({"debian": "sudo apt-get update", "ubuntu": "sudo apt-get update",
                       "sles": "sudo zypper --non-interactive refresh"}.get(os_key, "sudo dnf makecache"))
        + "  # refreshes the package lists; if the version is still not offered, choose one the repositories "
        "have: " + fixes.same_run(options, "install", driver=_nearest(route) or version))
    keyring = routes.cuda_keyring_fix(facts.os.id, facts.os.version, facts.os.family, facts.arch)
    if os_key in ("debian", "ubuntu") and keyring is not None and not _cuda_repo(facts):
        # NVIDIA's CUDA repository carries every release of the supported branches (routes.plan_route takes it
        # when the distribution's archive does not offer the release); on Debian under Debian's own names
        fix = fix + "; or add NVIDIA's CUDA repository, which carries every release: " + keyring
    plan = blocked(NAME, f"the configured repositories do not offer driver {version} for the {route.id} route: "
                         + "; ".join(lines), fix, *notes, route.why)
    return dataclasses.replace(plan, lasting=True)  # no step of this run adds repositories: nothing runs


def _cuda_repo(facts: Facts) -> bool:
    from gpunode.facts.packages import PACKAGE_SOURCES

    return routes.cuda_repo_configured(facts.get(PACKAGE_SOURCES) or {})


def _nearest(route: routes.Route) -> str | None:
    found = [routes.upstream(v) for w in route.packages if w.row.version == "driver" for v in w.offered]
    return next((v for v in found if v), None)


def _fabric_missing(facts: Facts, version: str, manager: str) -> str | None:
    """On an NVSwitch node: the fabric manager package of exactly `version`, when a repository lists fabric
    manager at all and not that version (without a repository the fabricmanager step adds NVIDIA's)."""
    from gpunode.fabric_packages import package_name
    from gpunode.steps.fabricmanager import pick_version

    if not facts.nvswitches:
        return None
    name = package_name(int(version.split(".")[0]), pkgmgr.get(manager).package_format)
    offered = (facts.get(fabric_facts.FM_AVAILABLE) or {}).get(name, [])
    if offered and pick_version(offered, version) is None:
        return f"{name} {version} (offered: {', '.join(offered[:6])})"
    return None


def plan(facts: Facts, options: Options, state: DriverState, version: str, flavour: str, notes: list[str],
         earlier: Earlier | None = None) -> StepPlan:
    if not facts.gpus and not options.bake:
        return blocked(NAME, NO_GPU, NO_GPU_FIX)
    if facts.module_loaded("nouveau") and not options.bake:
        nouveau = earlier.plan("nouveau") if earlier is not None else None
        if nouveau is None or not nouveau.reboot_required:
            return blocked(NAME, "nouveau is loaded: the nvidia module cannot load while it holds the GPU",
                           "let the nouveau step blacklist it (do not --skip nouveau), reboot, and run again")
        notes = [*notes, "runs after the reboot the nouveau step needs (pass --reboot to have gpunode do it)"]
    found = route_of(facts, options, version, flavour)
    if isinstance(found, StepPlan):
        return found
    route = found
    os_key = routes.route_os(facts.os.id, facts.os.family) or ""
    manager = manager_of(facts, os_key) or "apt"
    if route.missing:
        return _missing(facts, options, route, version, notes)
    fm = _fabric_missing(facts, version, manager)
    if fm:
        return dataclasses.replace(blocked(NAME, f"NVSwitch node: the repositories offer the driver {version} but not "
                                                 f"its fabric manager: {fm}", "choose a --driver release whose fabric "
                                                 "manager the repositories carry (apt-cache policy / dnf list "
                                                 "--showduplicates / zypper search -s nvidia-fabricmanager*)"),
                            lasting=True)
    if facts.secure_boot.enabled and not route.precompiled:  # every DKMS route, NVIDIA's on Ubuntu too
        notes.append(signing.dkms_note(facts.os.id))
    elif facts.secure_boot.enabled and os_key in routes.KMP_ROUTES:  # built and signed by NVIDIA, not SUSE
        notes.append(signing.prebuilt_note(next(w.name for w in route.packages if w.row.role == "module")))
    notes = [*notes, f"{route.id}: {route.why}",
             "packages: " + ", ".join(f"{n} {v}" for n, v in route.specs())]
    have = installed(facts)
    mine = driver_facts.gpunode_driver(facts)
    wanted = {n for n, _ in route.specs()}
    # the other driver source: a .run on the node (nvidia-installer's record), or route packages of another
    # flavour or branch
    run_there = bool(state.installer)
    others = [n for n in have if n not in wanted and routes.is_route_package(n)
              and n not in ("nvidia-persistenced", "nvidia-modprobe")]
    if run_there and mine.run != state.installer:
        return blocked(NAME, f"driver {state.installer} was installed by NVIDIA's .run installer, not by gpunode: "
                             "packages on top would mix two drivers",
                       fixes.on_node("sudo nvidia-installer --uninstall --silent") + "  # removes the .run driver "
                       "(then reboot if it was loaded); then run this command again", *notes)
    pin = _pin(facts, manager, version)
    exact = all(have.get(n, ("", False))[0] == v for n, v in route.specs())
    hold = options.hold_driver is not False
    unheld = [n for n, _ in route.specs() if not have.get(n, ("", False))[1]]
    if exact and not others and not run_there:
        placed = _in_place(facts, options, state, version, route, manager, notes, unheld if hold else [])
        if pin is None:
            return placed
        if placed.status is Status.OK:
            return change(NAME, f"{placed.reason}; pinning its release for apt", [pin], *placed.notes)
        return dataclasses.replace(placed, actions=(pin, *placed.actions))
    decided = _install(facts, options, state, version, route, manager, notes, others, run_there)
    if decided.status is not Status.CHANGE:
        return decided
    from gpunode.actions.driver import InstallDriverPackages

    at = next(i for i, a in enumerate(decided.actions) if isinstance(a, InstallDriverPackages))
    if pin is not None:
        decided = dataclasses.replace(decided, actions=(*decided.actions[:at], pin, *decided.actions[at:]))
        at += 1
    return _simulated(facts, options, decided, at, manager, route, version, others, pin is not None)


def _simulated(facts: Facts, options: Options, plan: StepPlan, at: int, manager: str, route: routes.Route,
               version: str, others: list[str], pin: bool) -> StepPlan:
    """The install action with its simulation (facts/transaction.py: apt-get -s / dnf --assumeno / zypper
    --dry-run of exactly its specs, with the apt pin it writes first); once the node answered, the plan lists every
    package the transaction would change, and is blocked before any change when the manager would refuse it or
    it would remove a package that is not the driver's."""
    from gpunode.actions.driver import InstallDriverPackages

    m = pkgmgr.get(manager)
    specs = [m.spec(n, v) for n, v in route.specs()]
    query = transaction.simulation(manager, specs, (routes.APT_PIN.rsplit("/", 1)[1], routes.apt_pin(version))
                                   if pin else None)
    install = plan.actions[at]
    assert isinstance(install, InstallDriverPackages)
    actions = (*plan.actions[:at], dataclasses.replace(install, query=query), *plan.actions[at + 1:])
    plan = dataclasses.replace(plan, actions=actions)
    found = facts.answer(query)
    if found is None:
        return plan
    streams = _streams(facts, route)
    if found.error and not streams:
        return dataclasses.replace(blocked(
            NAME, f"{query.name} refuses the driver {version} transaction: {found.error}",
            transaction_line(manager, specs) + "  # shows the same refusal with the package "
            "manager's own explanation; make the repositories offer a consistent set (apt-get update / dnf "
            "makecache), or choose another --driver release", *plan.notes), lasting=True)
    if found.error:  # EL8/9: the stream is enabled by the same transaction, so a simulation cannot resolve yet
        return dataclasses.replace(plan, notes=(*plan.notes, f"{query.name}: not resolvable before `dnf module "
                                                             f"enable` runs ({found.error})"))
    foreign = [c for c in found.removes if not routes.of_the_driver(c.name) and c.name not in others]
    if foreign:
        names = [c.name for c in foreign]
        return dataclasses.replace(blocked(
            NAME, f"the driver {version} transaction would remove packages that are not the driver's ({query.name}): "
                  + ", ".join(c.show() for c in foreign),
            transaction_line(manager, specs) + "  # shows why; remove or replace "
            + ", ".join(names) + " yourself if that is intended, then run this command again", *plan.notes),
            lasting=True)
    wanted = {n for n, _ in route.specs()}
    listing = [c.show() + ("" if c.name in wanted or c.action == transaction.REMOVE else " (dependency)")
               for c in found.changes]
    return dataclasses.replace(plan, notes=(*plan.notes, f"the transaction, as {query.name} resolves it on the node: "
                                            + ("; ".join(listing) or "nothing to change")))


def _streams(facts: Facts, route: routes.Route) -> bool:
    """Whether the install enables a dnf module stream first (NVIDIA's repository on EL8/EL9)."""
    return route.id == "rhel-cuda" and facts.os.version.split(".", 1)[0] in ("8", "9")


def transaction_line(manager: str, specs: list[str]) -> fixes.Fix:
    """The simulation as a person runs it on the node (without the pin's throwaway directory)."""
    quoted = " ".join(shlex.quote(s) for s in specs)
    if manager == "apt":
        return fixes.on_node(f"apt-get -s install --no-install-recommends --allow-downgrades {quoted}")
    if manager in ("dnf", "yum"):
        return fixes.on_node(f"sudo dnf --assumeno install {quoted}")
    return fixes.on_node(f"sudo zypper --non-interactive install --dry-run --oldpackage {quoted}")


def _bake_build(facts: Facts, options: Options, manager: str, version: str, upgrade: bool,
                notes: list[str]) -> list[Action]:
    """--bake: the package's DKMS builds at install for the kernels its maintainer script picks
    (routes.dkms_kernels); the bake's kernel outside them (or not known) gets its own build after the install."""
    kernel = bake.target_kernel(facts, options)
    if kernel is None:
        return []
    kernels = bake.installed_kernels(facts)
    built = routes.dkms_kernels(manager, facts.kernel, kernels, kernels[-1] if kernels else None, upgrade)
    said = routes.DKMS_AT_INSTALL.get(manager, "the kernels its package scripts choose")
    if built is not None and kernel in built:
        notes.append(f"bake: the package's DKMS builds the module for {kernel} at install ({said})")
        return []
    notes.append(f"bake: the package's DKMS builds at install for {said}, not {kernel}: built for it "
                 "after the install")
    return [_dkms_build(version, kernel)]


def _dkms_build(version: str, kernel: str) -> RunCommand:
    """The package's DKMS module built for `kernel` (a bake kernel its maintainer script did not pick)."""
    return RunCommand(f"build the driver {version} module for kernel {kernel} (dkms autoinstall)",
                      ("dkms", "autoinstall", "-k", kernel), timeout=1800)


def _pin(facts: Facts, manager: str, version: str) -> WriteFile | None:
    """apt: the preferences file that pins the driver's packages at the release (routes.APT_PIN); None when it is
    there already, or the manager is not apt."""
    if manager != "apt":
        return None
    now = facts[driver_facts.APT_PIN_FILE].get(routes.APT_PIN)
    wanted = routes.apt_pin(version)
    if now is not None and now.rstrip("\n") == wanted.rstrip("\n"):
        return None
    return WriteFile(f"pin the driver's packages at release {version} for apt ({routes.APT_PIN})",
                     path=routes.APT_PIN, after=wanted, before=now)


def _hold(facts: Facts, manager: str, route: routes.Route, names: list[str], options: Options) -> list[Action]:
    """apt-mark hold / dnf versionlock add (its plugin installed first when missing) / zypper addlock."""
    from gpunode.actions.packages import package_command, versionlock_plugin

    m = pkgmgr.get(manager)
    specs = [(n, v) for n, v in route.specs() if n in names]
    first = versionlock_plugin(manager, facts.get(PKG_STATUS) or {}, lock_timeout=options.lock_timeout)
    return [*first, package_command(f"hold the driver packages ({', '.join(names)}) so no upgrade moves them alone",
                                    manager, m.hold_all(specs), packages=names, lock_timeout=options.lock_timeout)]


def _in_place(facts: Facts, options: Options, state: DriverState, version: str, route: routes.Route, manager: str,
              notes: list[str], unheld: list[str]) -> StepPlan:
    holds = _hold(facts, manager, route, unheld, options) if unheld else []
    label = f"driver {version} from packages ({route.module.name} {route.module.version})"
    loaded = state.loaded
    if options.bake or not facts.gpus:
        kernel = bake.target_kernel(facts, options) if options.bake and not route.precompiled else None
        if kernel is not None and not bake.module_sums(facts, kernel):
            return change(NAME, f"{label} is installed but its module is not built for kernel {kernel} (bake)",
                          [*holds, _dkms_build(version, kernel)],
                          *notes)
        if holds:
            return change(NAME, f"{label} is installed; holding its packages", holds, *notes)
        return ok(NAME, f"{label} is installed" + (" (bake: not loaded)" if options.bake else ""), *notes)
    if loaded and loaded.version == version and not state.mismatch:
        if holds:
            return change(NAME, f"{label} is loaded; holding its packages", holds, *notes)
        return ok(NAME, f"{label} is loaded and nvidia-smi answers" if state.smi_status in (None, 0) else
                  f"{label} is loaded", *notes)
    if loaded:
        return change(NAME, f"{label} is installed but {loaded.version} is loaded",
                      [*holds, Reboot(f"reboot to load driver {version}")], *notes)
    return change(NAME, f"{label} is installed but not loaded",
                  [*holds, RunCommand("load the nvidia kernel module", ("modprobe", "nvidia"), timeout=120)], *notes)


def _install(facts: Facts, options: Options, state: DriverState, version: str, route: routes.Route, manager: str,
             notes: list[str], others: list[str], run_there: bool) -> StepPlan:
    from gpunode.actions.driver import InstallDriverPackages
    from gpunode.actions.packages import package_command

    m = pkgmgr.get(manager)
    actions: list[Action] = []
    if run_there:
        notes.append(f"switching source: the .run driver {state.installer} gpunode installed is removed first by its "
                     "own uninstaller, then the packages are installed (never both)")
    if others:
        notes.append("switching: the driver packages of the other flavour or branch are removed first: "
                     + ", ".join(others))
    current = state.installed or (state.loaded.version if state.loaded else None)
    if current and current != version:
        reason = f"driver {current} is installed; installing {version} from packages ({route.id})"
    elif current:
        reason = f"driver {version} from packages ({route.id}): installing the missing or other-version packages"
    else:
        reason = f"no NVIDIA driver installed; installing {version} from packages ({route.id})"
    held = [n for n in (*others, *(n for n, _ in route.specs())) if installed(facts).get(n, ("", False))[1]]
    if held:
        actions.append(package_command(f"release the holds on {', '.join(held)} for the change", manager,
                                       m.unhold(held), packages=held, lock_timeout=options.lock_timeout))
    specs = [m.spec(n, v) for n, v in route.specs()]
    transaction: list[tuple[str, ...]] = []
    if _streams(facts, route):
        # the module stream of the branch and flavour (EL8/EL9 modular repositories; EL10 has no streams: the
        # packages alone, as NVIDIA's installation guide's table says)
        stream = f"nvidia-driver:{version.split('.')[0]}-{'open' if 'open' in route.module.name else 'dkms'}"
        transaction.append(("dnf", "module", "enable", "-y", stream))
    if others:
        transaction.append(pkgmgr.get(manager).purge(others))
    transaction.append(m.install(specs, downgrade=True))
    install = InstallDriverPackages(f"install NVIDIA driver {version} from packages: " + ", ".join(specs),
                                    manager=manager, cmds=tuple(transaction), packages=tuple(n for n, _ in
                                                                                             route.specs()),
                                    lock_timeout=options.lock_timeout, version=version,
                                    previous=current or None, route=tuple(f"{n}={v}" for n, v in route.specs()))
    loaded_modules = [mod for mod in MODULES if facts.module_loaded(mod)]
    if run_there:
        actions.append(RunCommand(f"remove the .run driver {state.installer} (its own uninstaller; it unloads the "
                                  "modules)", UNINSTALL_RUN, timeout=1800))
        loaded_modules = []
    if options.bake or not facts.gpus:
        notes.append("bake: nothing is loaded" if options.bake else "no GPU: nothing is loaded")
        actions.append(install)
        if options.bake and not route.precompiled:
            actions += _bake_build(facts, options, manager, version, bool(current), notes)
    elif loaded_modules or facts.loaded_driver is not None:
        from gpunode.steps.driver import replace_loaded_with

        hold = tuple(_hold(facts, manager, route, [n for n, _ in route.specs()], options)) \
            if options.hold_driver is not False else ()
        replaced = replace_loaded_with(facts, options, version, notes, reason, loaded_modules,
                                       lambda stays, units: [install], hold)
        return dataclasses.replace(replaced, actions=(*actions, *replaced.actions)) if actions else replaced
    else:
        actions += [install, RunCommand(f"load the driver {version} kernel module", ("modprobe", "nvidia"),
                                        timeout=120)]
    if options.hold_driver is not False:
        actions += _hold(facts, manager, route, [n for n, _ in route.specs()], options)
    return change(NAME, reason, actions, *notes)
