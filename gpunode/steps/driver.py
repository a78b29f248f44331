"""Step 3: the NVIDIA driver from NVIDIA's .run installer, at the version the user asked for.

What is on the node comes from three places that can disagree: the loaded module (/proc/driver/nvidia/version),
the user-space libraries (libnvidia-ml.so.<version>, nvidia-installer's record) and NVML (nvidia-smi). Loaded
and user space at the requested version is `ok`; another .run version is an upgrade; a loaded module older
than its libraries is NVML's "Driver/library version mismatch", which only a reboot fixes. A driver from the
distribution's packages is never mixed with a .run: that is `blocked`, explained.

The installer is downloaded and verified on the machine running gpunode (gpunode/artifacts/), uploaded into
a root-only directory, checked again on the node (sha256) and run silently with DKMS and an explicit kernel
module flavour. On failure the installer's log tail is shown with what it means.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Callable
from dataclasses import dataclass

from packaging.version import Version

from gpunode import bake, fixes, gpus, pkgmgr, rules
from gpunode.errors import GpunodeError
from gpunode.facts import Facts
from gpunode.facts import driver as driver_facts
from gpunode.facts import holders as holder_facts
from gpunode.facts.driver import DriverState, driver_state
from gpunode.facts.holders import FABRIC_MANAGER, MODULES, Holders, gpu_holders
from gpunode.options import Options
from gpunode.plan import Action, Earlier, Reboot, RunCommand, Status, StepPlan, blocked, change, ok
from gpunode.record import Frozen
from gpunode.rules import NO_GPU, NO_GPU_FIX, load_fix, packages_remove, recommended_version
from gpunode.steps import driver_kernels
from gpunode.steps.base import Step
from gpunode.steps.outputs import DriverOutputs
from gpunode.versions import normalize_arch, parse_runfile_name

NAME = "driver"
TITLE = "NVIDIA driver"
READS = ("nouveau",)  # an install waits for the reboot the nouveau step needs

def branch(version: str) -> int:
    return int(version.split(".", 1)[0])


# ---------------------------------------------------------------------------------------------------------
# kernel module flavour
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False, repr=False)
class Flavour(Frozen):
    flavour: str  # "open" | "proprietary"
    reason: str
    flag: str | None  # the installer's -m= value; None before R515 (one flavour only)


def _open_need(device_id: int) -> str:
    gpu = gpus.lookup_id(device_id)
    return gpu.open_module if gpu is not None else gpus.generation_for_id(device_id)[1]


def choose_flavour(device_ids: list[int], version: str, override: str | None) -> Flavour | str:
    """The module to install, or a string saying why none can work."""
    major = branch(version)
    auto, reason = gpus.module_flavour(device_ids, version)
    if auto == "conflict":
        return reason
    needs = {_open_need(d) for d in device_ids}
    if override:
        if override == "proprietary" and "required" in needs:
            return "--kernel-module proprietary: these GPUs need the open module (" + reason + ")"
        if override == "open" and "unsupported" in needs:
            return "--kernel-module open: these GPUs cannot use the open module (" + reason + ")"
        auto, reason = override, f"--kernel-module {override} (automatic choice: {auto}; {reason})"
    if auto == "open" and major < gpus.BOTH_FLAVOURS_FROM:
        return f"R{major} has no open kernel module, and {reason}: choose R570 or newer"
    flag = None
    if major >= gpus.BOTH_FLAVOURS_FROM:
        flag = "kernel-open" if auto == "open" else "kernel"
    return Flavour(auto, reason, flag)


# ---------------------------------------------------------------------------------------------------------
# installer command line and failures
# ---------------------------------------------------------------------------------------------------------


def installer_flags(arch: str, flavour: Flavour, options: Options) -> tuple[str, ...]:
    """Silent, DKMS (rebuilt on kernel updates), temp files on disk rather than a small /tmp tmpfs, a known log
    path, no X server check (headless), no 32-bit libraries, the flavour always explicit, and the user's module
    signing keys. OpenGL/Vulkan libraries stay: containers that render need them."""
    from gpunode.actions.driver import LOG, WORK_PARENT

    flags = ["--silent", "--dkms", f"--tmpdir={WORK_PARENT}", f"--log-file-name={LOG}", "--no-x-check"]
    if arch == "x86_64":
        flags.append("--no-install-compat32-libs")
    if flavour.flag:
        flags.append(f"-m={flavour.flag}")
    if options.module_signing_key and options.module_signing_cert:
        flags += [f"--module-signing-secret-key={options.module_signing_key}",
                  f"--module-signing-public-key={options.module_signing_cert}"]
    return tuple(flags)


# ---------------------------------------------------------------------------------------------------------
# the plan
# ---------------------------------------------------------------------------------------------------------


def requested_version(options: Options) -> str | None:
    if options.driver:
        return options.driver
    if options.driver_run:
        found = parse_runfile_name(options.driver_run)
        return found[1] if found else None
    return None


def _packages_fix(facts: Facts, state: DriverState) -> str:
    return (packages_remove(facts, state) + "  # removes the packaged driver; then run this command again. To keep "
            "the packaged driver instead, run without --driver/--driver-run")


def _packaged_label(state: DriverState) -> str:
    """`driver 535.261.03 from Debian's packages (nvidia-kernel-dkms 535.261.03-1, ...)`."""
    names = ", ".join(f"{n} {v}" for n, v in state.packages[:4]) + (" ..." if len(state.packages) > 4 else "")
    found = state.packaged
    if found is None or found.version is None:
        return f"a driver from distribution packages ({names})"
    flavour = f", {found.flavour} kernel module" if found.flavour else ""
    return f"driver {found.version} from distribution packages ({names}{flavour})"


def _install_actions(facts: Facts, options: Options, version: str, flavour: Flavour) -> list[Action]:
    # the installer's actions and its download code are imported when a change is planned: a converged run plans
    # none and loads neither (tests/cli/test_startup.py)
    from gpunode.actions.driver import FetchInstaller, RunInstaller
    from gpunode.artifacts.source import resolve

    source = resolve(version, facts.arch, driver_run=options.driver_run, sha256=options.sha256,
                     cache_root=options.cache_dir, mirror=options.driver_mirror)
    sizes = dict(options.local_installers)
    flags = installer_flags(source.arch, flavour, options)
    what = "download" if source.path not in sizes and not source.local else "verify"
    return [
        FetchInstaller(f"{what} {source.name}", source=source, local_size=sizes.get(source.path),
                       progress=options.progress),
        RunInstaller(f"install NVIDIA driver {version} ({flavour.flavour} kernel module, DKMS)", source=source,
                     flags=flags, signing_key=options.module_signing_key or "",
                     signing_cert=options.module_signing_cert or "", progress=options.progress),
    ]


def plan(facts: Facts, options: Options, earlier: Earlier | None = None) -> StepPlan:
    """The plan, with the driver version that will be in place as its outputs."""
    state = driver_state(facts)
    decided = _plan(facts, options, earlier or Earlier({}, READS), state)
    decided = _start_owed(facts, _baked(decided, facts, options))  # image builds (gpunode/bake.py); owed starts
    version = requested_version(options)
    if version is not None:
        origin = "--driver" if options.driver else "--driver-run"
    elif not options.driver_run and state.loaded:
        version, origin = state.loaded.version, "loaded"
    else:
        origin = None
    decided = driver_kernels.extend(facts, options, state, decided, version)  # other kernels, holds
    changes = decided.status is Status.CHANGE
    reloads = False
    if changes and not decided.reboot_required:
        from gpunode.actions.driver import UnloadModules

        reloads = any(isinstance(a, UnloadModules) for a in decided.actions)
    return decided.with_outputs(DriverOutputs(version, origin if version else None, changes, reloads))


_ELSEWHERE = ("if a driver container or another tool provides the driver, leave the driver step out "
              "(--skip driver)")


def _no_driver(facts: Facts, state: DriverState, options: Options) -> StepPlan:
    """No --driver, nothing loaded: fine without a GPU; with one, the node would end up with a container
    toolkit and no driver, so say what is missing and the exact command that asks for it."""
    if not facts.gpus:
        if state.packages:
            return ok(NAME, f"no NVIDIA GPU on this node; {_packaged_label(state)} is installed and left as it is")
        return ok(NAME, "no NVIDIA GPU on this node: no driver to install")
    if state.packages:
        return blocked(NAME, f"{_packaged_label(state)} is installed but not loaded", load_fix(state))
    installed = state.installed or state.module
    if installed:
        return blocked(NAME, f"driver {installed} is installed but not loaded, and no --driver was given",
                       fixes.gpunode("install", driver=installed) + "  # loads it, or rebuilds its module",
                       _ELSEWHERE)
    version = recommended_version(facts, options.cuda)
    names = ", ".join(dict.fromkeys(_gpu_name(g.device) for g in facts.gpus))
    if version is None:
        return blocked(NAME, f"a GPU ({names}) but no NVIDIA driver, and no --driver was given: pass --driver with "
                             "a version that suits it", fixes.gpunode("compat", gpu=names.split(", ")[0]),
                       _ELSEWHERE)
    first = names.split(", ")[0]
    return blocked(NAME, f"a GPU ({names}) but no NVIDIA driver, and no --driver was given: the node would get a "
                         "container toolkit and no driver",
                   fixes.gpunode("install", driver=version) + "  # the recommended release for these GPUs; "
                   + fixes.gpunode("compat", gpu=first) + " lists the other branches", _ELSEWHERE)


def _gpu_name(device: int) -> str:
    gpu = gpus.lookup_id(device)
    return gpu.name if gpu is not None else f"10de:{device:04x}"


def _plan(facts: Facts, options: Options, earlier: Earlier, state: DriverState) -> StepPlan:
    version = requested_version(options)
    if version is None:
        if options.driver_run:
            return blocked(NAME, f"cannot tell which driver version {options.driver_run} installs",
                           ("the Identification line of `sh NVIDIA-Linux-*.run --info` on the downloaded file "
                            if "://" in options.driver_run else
                            f"the Identification line of `sh {shlex.quote(options.driver_run)} --info` ")
                           + "names it: run the same command again with --driver and that version")
        if state.loaded:
            return ok(NAME, f"no --driver requested; driver {state.loaded.version} ({state.loaded.flavour} module) "
                            "is loaded and left as it is")
        return _no_driver(facts, state, options)
    if options.driver_source == "packages":
        return _from_packages(facts, options, state, version, earlier)
    if state.packages and not (state.loaded and state.loaded.version == version and not state.mismatch):
        if _gpunode_packages(facts, state):  # gpunode put them there (--driver-source packages): switch
            return _switch_to_run(facts, options, earlier, state)
        # before the GPU check: the packaged driver is the reason a .run cannot go here, GPU or not
        return blocked(NAME, f"{_packaged_label(state)} is installed; a .run install on top would mix two drivers "
                             "(NVIDIA's installer and the distribution's packages overwrite each other's files)",
                       _packages_fix(facts, state))
    if not facts.gpus and not options.bake:  # a bake builds without a GPU
        return blocked(NAME, NO_GPU, NO_GPU_FIX)
    try:
        arch = normalize_arch(facts.arch)
    except GpunodeError as exc:
        return blocked(NAME, exc.message, exc.fix or "")
    named = parse_runfile_name(options.driver_run or "")
    if named and named[0] != arch:
        return blocked(NAME, f"{options.driver_run} is the {named[0]} installer; this node is {arch}",
                       f"use NVIDIA-Linux-{arch}-{version}.run")

    if state.packages:  # loaded at the requested version (any other case was refused above)
        return ok(NAME, f"driver {version} is loaded ({_packaged_label(state)})")

    choice = choose_flavour([d.device for d in facts.gpus], version, options.kernel_module)
    if isinstance(choice, str):
        return blocked(NAME, choice, "choose the --kernel-module the GPUs support, or put these GPUs in separate "
                                     "nodes")
    loaded = state.loaded
    current = state.installed or (loaded.version if loaded else None)
    notes = [f"kernel module: {choice.flavour} ({choice.reason})"]
    if options.bake:
        return _bake_plan(facts, options, version, choice, notes, state)

    if current == version:
        if loaded and loaded.version == version and not state.mismatch:
            if options.kernel_module and loaded.flavour != choice.flavour:
                return _install(facts, options, version, choice, notes,
                                f"driver {version} runs the {loaded.flavour} module; --kernel-module asks for "
                                f"{choice.flavour}: reinstalling")
            if state.smi_status not in (None, 0):
                first = state.smi_text.splitlines()[0] if state.smi_text else f"exit {state.smi_status}"
                return blocked(NAME, f"driver {version} is loaded but nvidia-smi fails: {first}",
                               "see `" + fixes.on_node("dmesg | grep -i nvrm") + "`: a GPU this module flavour cannot "
                               "drive (--kernel-module), or a GPU that fell off the bus")
            extra = () if loaded.flavour == choice.flavour else (
                f"the {loaded.flavour} module is loaded; the automatic choice would be {choice.flavour} "
                "(pass --kernel-module to switch)",)
            return ok(NAME, f"driver {version} ({loaded.flavour} kernel module) is loaded and nvidia-smi answers",
                      *extra)
        if loaded and (loaded.version != version or state.mismatch):
            return change(NAME, f"kernel module {loaded.version} is loaded but the user-space libraries are {version} "
                                "(NVML: Driver/library version mismatch)",
                          [Reboot(f"reboot to load the {version} kernel module")])
        if facts.module_loaded("nouveau"):
            return change(NAME, f"driver {version} is installed but nouveau holds the GPU",
                          [Reboot("reboot: nouveau is loaded and only a reboot unloads it")])
        if state.module == version:
            return change(NAME, f"driver {version} is installed but its kernel module is not loaded",
                          [RunCommand("load the nvidia kernel module", ("modprobe", "nvidia"), timeout=120)], *notes)
        return _install(facts, options, version, choice, notes,
                        f"driver {version} user space is installed but no {version} module exists for kernel "
                        f"{facts.kernel} (a kernel update that DKMS did not build for?): reinstalling")

    if current:
        verb = "upgrading" if Version(current) < Version(version) else "downgrading"
        reason = f"driver {current} is installed; {version} was requested: {verb}"
    else:
        reason = f"no NVIDIA driver installed; installing {version}"
    return _install(facts, options, version, choice, notes, reason, earlier)


def _gpunode_packages(facts: Facts, state: DriverState) -> tuple[str, ...]:
    """The installed driver packages gpunode's driver step installed (its journal), when they are the whole
    packaged driver (its module's package among them); () otherwise."""
    mine = driver_facts.gpunode_driver(facts)
    if mine.source != "packages" or state.packaged is None or state.packaged.owner not in mine.packages:
        return ()
    from gpunode.steps import driver_packages

    have = driver_packages.installed(facts)
    return tuple(n for n in mine.packages if n in have)


def _switch_to_run(facts: Facts, options: Options, earlier: Earlier, state: DriverState) -> StepPlan:
    """A .run asked for where gpunode installed the driver from packages: the packages are removed first (after
    the modules are unloaded), then the .run installs; never both."""
    from gpunode.actions.driver import FetchInstaller
    from gpunode.actions.packages import package_command

    names = list(_gpunode_packages(facts, state))
    rest = _plan(facts, options, earlier, dataclasses.replace(state, packages=(), packaged=None, libraries=()))
    at = next((i for i, a in enumerate(rest.actions) if isinstance(a, FetchInstaller)), None)
    if rest.status is not Status.CHANGE or at is None:
        return rest
    manager = rules.package_manager(facts) or "apt"
    purge = package_command(f"remove the driver packages gpunode installed (switching to the .run): "
                            f"{', '.join(names)}", manager, *pkgmgr.get(manager).purge_held(names),
                            packages=names, lock_timeout=options.lock_timeout)
    note = ("switching source: the driver packages gpunode installed are removed before the .run installs "
            "(never both)")
    return dataclasses.replace(rest, actions=(*rest.actions[:at], purge, *rest.actions[at:]),
                               notes=(*rest.notes, note))


def _from_packages(facts: Facts, options: Options, state: DriverState, version: str, earlier: Earlier
                   ) -> StepPlan:
    """--driver-source packages (gpunode/steps/driver_packages.py): the flavour chosen per GPU as for the .run."""
    choice = choose_flavour([d.device for d in facts.gpus], version, options.kernel_module)
    if isinstance(choice, str):
        return blocked(NAME, choice, "choose the --kernel-module the GPUs support, or put these GPUs in separate "
                                     "nodes")
    notes = [f"kernel module: {choice.flavour} ({choice.reason})"]
    if options.bake:
        kernel = bake.target_kernel(facts, options)
        if kernel is None or kernel not in bake.installed_kernels(facts):
            return _bake_plan(facts, options, version, choice, notes, state)  # its refusals name the kernel
        notes.append(f"bake: the module is built for {kernel} and not loaded")
    from gpunode.steps import driver_packages

    return driver_packages.plan(facts, options, state, version, choice.flavour, notes, earlier)


def _install(facts: Facts, options: Options, version: str, choice: Flavour, notes: list[str], reason: str,
             earlier: Earlier | None = None) -> StepPlan:
    if facts.secure_boot.enabled and not (options.module_signing_key and options.module_signing_cert):
        from gpunode import signing

        return blocked(NAME, "Secure Boot is enabled and no module signing key was given: the kernel would refuse "
                             "the unsigned NVIDIA module", signing.fix(version, facts.os.id))
    if facts.secure_boot.enabled:
        notes.append("Secure Boot is on: the module is signed with --module-signing-key; its certificate must be "
                     "enrolled (`" + fixes.on_node("sudo mokutil --import") + "` it, confirmed at the next boot) or the "
                     "kernel refuses the module")
    elif facts.secure_boot.enabled is None:
        notes.append(f"Secure Boot state unknown ({facts.secure_boot.evidence}): an unsigned module may be refused")
    if facts.module_loaded("nouveau"):
        nouveau = earlier.plan("nouveau") if earlier is not None else None
        if nouveau is None or not nouveau.reboot_required:
            return blocked(NAME, "nouveau is loaded: the NVIDIA installer refuses to run while it is",
                           "let the nouveau step blacklist it (do not --skip nouveau), reboot, and run again")
        notes.append("runs after the reboot the nouveau step needs (pass --reboot to have gpunode do it)")
    loaded = [m for m in MODULES if facts.module_loaded(m)]
    if facts.loaded_driver is not None or loaded:
        return _replace_loaded(facts, options, version, choice, notes, reason, loaded)
    actions = _install_actions(facts, options, version, choice)
    owed = _owed_down(facts)
    if owed:  # stopped for an install that failed: started again once this one is done
        from gpunode.actions.driver import StartGpuServices

        actions.append(StartGpuServices(f"start {', '.join(owed)} again (stopped by an earlier run)", units=owed))
    return change(NAME, reason, actions, *notes)


# ---------------------------------------------------------------------------------------------------------
# replacing a loaded driver (upgrade, downgrade, another flavour): what holds the GPU decides the sequence
# ---------------------------------------------------------------------------------------------------------

ALLOW_RUNNING = "--allow-installation-with-running-driver"


def _owed_down(facts: Facts) -> tuple[str, ...]:
    """Services an earlier run stopped for a driver install (journal) that are still down; fabric manager is
    the fabricmanager step's to start (at the version of the driver then in place)."""
    units = facts.get(holder_facts.GPU_SERVICE_UNITS) or {}
    return tuple(u for u in facts[holder_facts.OWED_STARTS]
                 if u != FABRIC_MANAGER and u in units and not units[u].is_active and not units[u].masked)


def _start_owed(facts: Facts, decided: StepPlan) -> StepPlan:
    """A driver already right, but services an earlier run stopped for its install still down: start them."""
    owed = _owed_down(facts)
    if decided.status is not Status.OK or not owed or facts.loaded_driver is None:
        return decided
    from gpunode.actions.driver import StartGpuServices

    return change(NAME, f"{', '.join(owed)} stopped for an earlier driver install and still down: starting again",
                  [StartGpuServices(f"start {', '.join(owed)} again", units=owed)], *decided.notes)


def same_install(options: Options, **changes: object) -> fixes.Fix:
    """`gpunode install` with the options of this run (gpunode/fixes.py same_run) and `changes`."""
    return fixes.same_run(options, "install", **changes)


def _joined(items: list[str], separator: str) -> list[str]:
    return [part for i, item in enumerate(items) for part in ([separator] if i else []) + [item]]


def _blocked_by_holders(loaded: str, version: str, found: Holders, options: Options, notes: list[str]) -> StepPlan:
    listing = "; ".join(found.lines())
    if found.blocking:
        todo: list[str] = []  # each a Fix or words
        procs = [p for p in found.processes if not p.in_pod and not p.container]
        if procs:
            todo.append("end or move " + ", ".join(f"PID {p.pid} ({p.name})" for p in procs[:6])
                         + " yourself (gpunode never ends a process that is not a known GPU service)")
        if found.containers or any(p.container for p in found.processes):
            names = [c.name or c.id[:12] for c in found.containers] + \
                [p.container[:12] for p in found.processes if p.container and not p.in_pod]
            todo.append("`" + fixes.on_node("docker stop " + " ".join(shlex.quote(n) for n in dict.fromkeys(names)))
                        + "`")
        if any(p.in_pod for p in found.processes):
            todo.append("drain the node (`" + found.drain() + "`) and remove the GPU DaemonSet pods "
                        "(device plugin, DCGM exporter) from it")
        then = same_install(options, stop_gpu_services=bool(found.services) or options.stop_gpu_services)
        return blocked(NAME, f"driver {loaded} is loaded and in use: {listing}. Replacing it with {version} needs "
                             "every one of these gone", fixes.join(*_joined(todo, "; "), "; then ", then), *notes)
    return blocked(NAME, f"driver {loaded} is loaded and held by {listing}. Replacing it with {version} stops "
                         "them first, unloads it, installs, and starts them again",
                   same_install(options, stop_gpu_services=True) + "  # stops "
                   + ", ".join(found.services) + " for the install and starts them again after it", *notes)


def _replace_loaded(facts: Facts, options: Options, version: str, choice: Flavour, notes: list[str], reason: str,
                    loaded_modules: list[str]) -> StepPlan:
    """The .run over a loaded driver: the installer told which modules to load back if it fails, and to install
    beside a module that stays loaded."""
    def installer(stays: tuple[str, ...], restart_on_failure: tuple[str, ...]) -> list[Action]:
        from gpunode.actions.driver import RunInstaller

        fetch, install = _install_actions(facts, options, version, choice)
        assert isinstance(install, RunInstaller)
        flags = install.flags + ((ALLOW_RUNNING,) if stays else ())
        return [fetch, dataclasses.replace(install, flags=flags, restore_modules=tuple(loaded_modules),
                                           restore_units=restart_on_failure)]
    return replace_loaded_with(facts, options, version, notes, reason, loaded_modules, installer)


def replace_loaded_with(facts: Facts, options: Options, version: str, notes: list[str], reason: str,
                        loaded_modules: list[str],
                        make_install: Callable[[tuple[str, ...], tuple[str, ...]], list[Action]],
                        after: tuple[Action, ...] = ()) -> StepPlan:
    """Stop the GPU services, unload the modules in order, install (`make_install(modules that stay loaded,
    services to start again if it fails)`: the .run, or the packages of --driver-source packages), load the new
    module, start the services again (fabric manager: the fabricmanager step moves it to the new version in the
    same run), then `after` (the packages' holds). A module whose users gpunode does not stop (nvidia_drm with DRM
    clients) stays: install beside it, then reboot."""
    from gpunode.actions.driver import StartGpuServices, StopGpuServices, UnloadModules

    found = gpu_holders(facts)
    old = facts.loaded_driver.version if facts.loaded_driver else "(unknown version)"
    if found.kubelet:
        notes.append(f"a Kubernetes node ({found.kubelet}): drain it first (`" + found.drain() + "`) so no pod loses "
                     "its GPU during the install")
    if found.unread:
        notes.append(f"could not read {', '.join(found.unread)}: the list of what holds the GPU may be incomplete")
    if found.blocking or (found.services and not options.stop_gpu_services):
        return _blocked_by_holders(old, version, found, options, notes)
    owed = tuple(u for u in facts[holder_facts.OWED_STARTS] if u not in found.services)
    again = tuple(u for u in (*reversed(found.services), *_owed_down(facts)) if u != FABRIC_MANAGER)
    again = tuple(dict.fromkeys(again))
    stays = tuple(m for m in found.stuck_modules if m in loaded_modules)
    actions: list[Action] = []
    if found.services:
        # with a reboot ahead, the enabled ones start at boot: only the others are owed a start
        units = facts.get(holder_facts.GPU_SERVICE_UNITS) or {}
        owed_now = tuple(u for u in found.services if not (u in units and units[u].is_enabled)) if stays else None
        actions.append(StopGpuServices(f"stop {', '.join(found.services)} (they hold driver {old})",
                                       units=found.services, owed=owed_now))
    restart_on_failure = tuple(reversed(found.services))
    actions.append(UnloadModules(f"unload the driver {old} modules ({' '.join(loaded_modules)})",
                                 modules=tuple(loaded_modules), may_stay=stays, restore_units=restart_on_failure))
    actions += make_install(stays, restart_on_failure)
    if stays:
        actions.append(Reboot(f"reboot: {', '.join(stays)} stays loaded (DRM clients use it), so driver {version} "
                              "loads at the next boot"))
        notes.append(f"{', '.join(stays)} is in use by DRM clients (a display server, the framebuffer console) that "
                     f"gpunode does not stop: {version} is installed beside the loaded {old} and loads at the reboot")
    else:
        actions.append(RunCommand(f"load the driver {version} kernel module", ("modprobe", "nvidia"), timeout=120))
    if again and not stays:
        actions.append(StartGpuServices(f"start {', '.join(again)} again", units=again))
    actions += after
    if FABRIC_MANAGER in found.services or FABRIC_MANAGER in owed:
        notes.append(f"{FABRIC_MANAGER} is started again by the fabricmanager step, moved to the fabric manager of "
                     f"driver {version} (with --skip fabricmanager it stays stopped)")
    if again and stays:
        notes.append(f"{', '.join(again)} start again at the reboot (if enabled; the next run starts the others)")
    return change(NAME, reason, actions, *notes)


# ---------------------------------------------------------------------------------------------------------
# image builds (--bake) and the boot-time check of a baked image (gpunode/bake.py)
# ---------------------------------------------------------------------------------------------------------


def _bake_plan(facts: Facts, options: Options, version: str, choice: Flavour, notes: list[str],
               state: DriverState) -> StepPlan:
    """--bake: the module built for the image's kernel, nothing loaded, no GPU needed."""
    kernel = bake.target_kernel(facts, options)
    installed = bake.installed_kernels(facts)
    if kernel is None:
        return blocked(NAME, "no installed kernel found (no /boot/vmlinuz-*): cannot tell which kernel the image "
                             "boots", "pass --kernel with the image's kernel release, e.g. --kernel "
                             + shlex.quote(facts.kernel or "6.8.0-45-generic"))
    if kernel not in installed:
        return blocked(NAME, f"--kernel {kernel} is not installed here (installed: {', '.join(installed) or 'none'})",
                       "install that kernel into the image first, or pass --kernel with one of the installed ones")
    why = "--kernel" if options.bake_kernel else "the newest installed kernel, which the image boots"
    notes.append(f"bake: the module is built for {kernel} ({why}; this build runs {facts.kernel}) and not loaded")
    if state.installed == version and bake.module_sums(facts, kernel):
        return ok(NAME, f"driver {version} is installed and its module is built for kernel {kernel} (bake: not "
                        "loaded)", *notes)
    planned = _install(facts, options, version, choice, notes,
                       f"bake: install driver {version} with its module built for kernel {kernel}")
    from gpunode.actions.driver import RunInstaller

    extra = (f"--kernel-name={kernel}", "--skip-module-load")
    return dataclasses.replace(planned, actions=tuple(
        dataclasses.replace(a, flags=(*a.flags, *extra)) if isinstance(a, RunInstaller) else a
        for a in planned.actions))


def _baked(decided: StepPlan, facts: Facts, options: Options) -> StepPlan:
    """At boot after a bake: say that the module was baked for this kernel, or why the marker does not apply."""
    if options.bake:
        return decided
    found = bake.check(facts, requested_version(options))
    if not found.why:
        return decided
    from gpunode.actions.driver import RunInstaller

    rebuilds = any(isinstance(a, RunInstaller) for a in decided.actions)
    if found.applies and not rebuilds:
        return dataclasses.replace(decided, reason=f"{found.why}; {decided.reason}")
    return dataclasses.replace(decided, notes=(*decided.notes, found.why + (
        ": the module is built again, as on any node" if rebuilds else "")))


STEP = Step(NAME, TITLE, plan, READS)
