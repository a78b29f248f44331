"""The driver step's second half (a helper, not a step): the kernels the next boot may run, and package holds.

A .run driver registered with DKMS is built by nvidia-installer for the RUNNING kernel only. A kernel installed
later gets its module from DKMS's kernel postinst hook, and only if that kernel's headers were there at that
moment: a kernel metapackage that pulls in a new image without its headers (or headers the repositories no longer
carry) leaves the next boot without a driver. So, whenever the driver is (or is about to be) in place, every
installed kernel newer than the running one, and the boot default, must have an nvidia module of the driver's
version: missing headers are installed (linux-headers-K / kernel-devel-K), then `dkms install -m nvidia -v VER
-k K` builds it. The re-plan reads `dkms status` again, so the build is verified, not assumed. Headers the
repositories do not offer make the step `blocked` before anything changes.

Holds (`--hold-kernel`, `--hold-driver`, tri-state: absent leaves holds as they are) live here too, because what
they protect is the driver: a held kernel metapackage cannot bring a kernel DKMS has not built for. The .run
driver is not a package, so `--hold-driver` has nothing to hold for it (it says so); fabric manager's package is
held by the fabricmanager step already.
"""

from __future__ import annotations

import dataclasses

from gpunode import fixes, pkgmgr
from gpunode.facts import Facts
from gpunode.facts import kernel as kernel_facts
from gpunode.facts import packages as package_facts
from gpunode.facts.driver import DriverState
from gpunode.facts.kernel import Kernel, Kernels
from gpunode.options import Options
from gpunode.plan import Action, Reboot, RunCommand, Status, StepPlan, blocked, change
from gpunode.rules import package_manager

NAME = "driver"
DKMS_MODULE = "nvidia"  # PACKAGE_NAME in the dkms.conf nvidia-installer registers


def build_command(version: str, kernel: str) -> tuple[str, ...]:
    """dkms 2 and 3 both take -m/-v/-k (dkms 3 also `nvidia/VER`); `dkms autoinstall -k K` would build every
    AUTOINSTALL module, not only NVIDIA's."""
    return ("dkms", "install", "-m", DKMS_MODULE, "-v", version, "-k", kernel)


def _installs_with_dkms(plan: StepPlan) -> bool:
    return any(a.kind == "driver-install" for a in plan.actions)


def _remove_kernel(manager: str, kernel: str, headers: bool = False) -> str:
    remove = pkgmgr.remove_kernel(manager, kernel, headers) or \
        f"{manager} remove kernel-core-{pkgmgr.rpm_kernel_version(kernel)}"
    return fixes.on_node(f"sudo {remove}")


def _headers_offered(facts: Facts, package: str) -> bool | None:
    """From the local package metadata: True offered, False not offered, None cannot tell."""
    offered = facts.get(kernel_facts.HEADERS_AVAILABLE)
    if offered is None:
        return None
    if package in offered:
        return offered[package]
    if package.startswith("kernel-devel-") and any(n.startswith("kernel-devel-") for n in offered):
        return False  # dnf listed the kernel-devel versions it has, and not this one
    return None


def kernel_builds(facts: Facts, options: Options, version: str, running: str,
                  kernels: Kernels) -> tuple[list[Action], list[str], StepPlan | None]:
    """Actions that give every later kernel an nvidia `version` module, the notes, or a blocked plan."""
    targets: list[Kernel] = [k for k in kernels.later_than(running) if not kernels.dkms_installed(k.name, version)]
    if not targets:
        return [], [], None
    from gpunode.actions.packages import install_packages

    manager = package_manager(facts)
    actions: list[Action] = []
    notes: list[str] = []
    default, how = kernels.boot_default
    for k in targets:
        failure = kernels.failed_build(k.name)
        if failure is not None and failure.module.endswith(f"-{version}"):
            remove = _remove_kernel(manager or "", k.name, headers=True)
            return [], [], blocked(
                NAME, f"DKMS's build of {failure.module} for kernel {k.name} failed ({failure.error}; {failure.log}): "
                      f"building it again fails the same way, and a boot into {k.name} comes up without the driver",
                f"remove that kernel (`{remove}`) so the next boot stays on {running}, or install a driver release "
                f"that builds for {k.name}; then run the same command again")
        if not k.headers:
            package = pkgmgr.headers_package(manager or "", k.name)
            if manager is None or package is None:
                return [], [], blocked(NAME, f"kernel {k.name} is installed but has no headers, and gpunode does not "
                                             f"know this node's package manager ({facts.os})",
                                       f"install the headers of kernel {k.name}, then run the same command again")
            offered = _headers_offered(facts, package)
            if offered is False:
                return [], [], blocked(
                    NAME, f"kernel {k.name} is installed but {package} (its headers) is not available from the "
                          f"configured repositories: DKMS cannot build the nvidia module for it, and a boot into it "
                          "comes up without the driver",
                    f"install {package} from where kernel {k.name} came from, or remove that kernel (`"
                    + _remove_kernel(manager, k.name) + f"`) so the next boot stays on {running}; then run the same "
                    "command again")
            actions.append(install_packages(f"install {package}: kernel {k.name} has no headers to build against",
                                            manager, (package,), refresh=offered is None,
                                            lock_timeout=options.lock_timeout))
        actions.append(RunCommand(f"build the nvidia {version} module for kernel {k.name} (DKMS)",
                                  build_command(version, k.name), timeout=1800))
    boots = f"; the next boot runs {default.name} ({how})" if default is not None else ""
    notes.append(f"installed kernel(s) not running: {', '.join(k.name for k in targets)}{boots}")
    if facts.secure_boot.enabled:
        from gpunode import signing

        notes.append(signing.dkms_note(facts.os.id))
    return actions, notes, None


def _held(facts: Facts, manager: str, names: list[str], packages: dict[str, package_facts.Package]) -> set[str]:
    locks = package_facts.held_packages(packages, facts[package_facts.PACKAGE_LOCKS])
    return {n for n in names if n in locks}


def _hold_actions(facts: Facts, options: Options, manager: str, what: str, wanted: bool,
                  packages: list[tuple[str, str]], held: set[str]) -> tuple[list[Action], list[str]]:
    m = pkgmgr.get(manager)
    if wanted:
        todo = [(n, v) for n, v in packages if n not in held]
        if not todo:
            return [], [f"{what} already held: {', '.join(n for n, _ in packages)}"]
        from gpunode.actions.packages import package_command, versionlock_plugin

        actions: list[Action] = [*versionlock_plugin(manager, facts[package_facts.PKG_STATUS],
                                                     lock_timeout=options.lock_timeout)]
        names = ", ".join(n for n, _ in todo)
        actions.append(package_command(f"hold {what} ({names}): released with --no-{_flag(what)}", manager,
                                       m.hold_all(todo), packages=[n for n, _ in todo],
                                       lock_timeout=options.lock_timeout, timeout=600))
        return actions, []
    release = [n for n, _ in packages if n in held]
    if not release:
        return [], [f"{what} not held"]
    from gpunode.actions.packages import package_command

    return [package_command(f"release the hold on {what} ({', '.join(release)})", manager, m.unhold(release),
                            packages=release, lock_timeout=options.lock_timeout, timeout=600)], []


def _flag(what: str) -> str:
    return "hold-kernel" if what.startswith("the kernel") else "hold-driver"


def holds(facts: Facts, options: Options, state: DriverState) -> tuple[list[Action], list[str], StepPlan | None]:
    """The hold actions --hold-kernel / --hold-driver ask for (and --no-hold-* to release), idempotent: the
    current holds come from dpkg's selections and the versionlock list."""
    if options.hold_kernel is None and options.hold_driver is None:
        return [], [], None
    manager = package_manager(facts)
    if manager is None or manager not in ("apt", "dnf", "yum", "zypper"):
        return [], [], blocked(NAME, f"--hold-kernel/--hold-driver: gpunode holds packages with apt-mark, dnf/yum "
                                     f"versionlock or zypper addlock, and {facts.os} has none", "leave out --hold-kernel and "
                                     "--hold-driver, and hold the packages with the node's own tools")
    actions: list[Action] = []
    notes: list[str] = []
    if options.hold_kernel is not None:
        installed = facts[kernel_facts.KERNEL_PACKAGES]
        names = [n for n in sorted(installed) if pkgmgr.is_kernel_metapackage(manager, n)]
        if not names:
            notes.append("no kernel metapackage is installed: no upgrade brings a new kernel, nothing to hold")
        else:
            release = pkgmgr.rpm_kernel_version(facts.kernel)
            packages = [(n, installed[n].version if manager == "apt" else release) for n in names]
            more, said = _hold_actions(facts, options, manager, "the kernel packages", options.hold_kernel, packages,
                                       _held(facts, manager, names, installed))
            actions += more
            notes += said
    if options.hold_driver is not None:
        if not state.packages:
            notes.append("--hold-driver: the .run driver is not a package, so there is nothing to hold (fabric "
                         "manager's package is held by its own step); --hold-kernel keeps upgrades from bringing a "
                         "kernel the module is not built for")
        else:
            installed = facts[package_facts.PKG_STATUS]
            packages = [(n, v) for n, v in state.packages]
            more, said = _hold_actions(facts, options, manager, "the driver packages", options.hold_driver, packages,
                                       _held(facts, manager, [n for n, _ in packages], installed))
            actions += more
            notes += said
    return actions, notes, None


def extend(facts: Facts, options: Options, state: DriverState, decided: StepPlan, version: str | None) -> StepPlan:
    """The driver step's plan for the running kernel, completed with the builds for the other kernels and the holds.
    Blocked and unknown plans stay as they are; `version` is the driver that will be in place."""
    if decided.status not in (Status.OK, Status.CHANGE):
        return decided
    actions: list[Action] = []
    notes: list[str] = []
    kernels = facts[kernel_facts.KERNELS]
    dkms = _installs_with_dkms(decided) or (version is not None and version in kernels.dkms_versions())
    if version and not state.packages and kernels.known and dkms:
        builds, said, stop = kernel_builds(facts, options, version, facts.kernel, kernels)
        if stop is not None:
            return stop
        actions += builds
        notes += said
    elif version and not state.packages and kernels.known and state.loaded:
        missing = [k.name for k in kernels.later_than(facts.kernel) if not kernels.built_for(k.name)]
        if missing:
            notes.append(f"kernel {', '.join(missing)} has no nvidia module and driver {version} is not registered "
                         "with DKMS: `" + fixes.gpunode("install", driver=version) + "` after booting it builds one")
    held, said, stop = holds(facts, options, state)
    if stop is not None:
        return stop
    notes += said
    if not actions and not held:
        return dataclasses.replace(decided, notes=(*decided.notes, *notes)) if notes else decided
    if decided.status is Status.OK:
        parts = []
        if actions:
            built = [a.cmd[-1] for a in actions if isinstance(a, RunCommand) and isinstance(a.cmd, tuple)
                     and a.cmd[:2] == ("dkms", "install")]
            parts.append(f"installed kernel {', '.join(built)} (not running) has no nvidia {version} module: "
                         "building it so the next boot has a driver")
        if held:
            parts.append("; ".join(a.summary for a in held if "hold" in a.summary))
        return change(NAME, f"{decided.reason}; " + "; ".join(parts), [*actions, *held], *decided.notes, *notes)
    # a change already: builds after the install (before a reboot it needs), holds last
    before = [a for a in decided.actions if not isinstance(a, Reboot)]
    reboots = [a for a in decided.actions if isinstance(a, Reboot)]
    return dataclasses.replace(decided, actions=(*before, *actions, *held, *reboots),
                               notes=(*decided.notes, *notes))
