"""Driver and CUDA layers: the module is loaded, NVML answers, user space matches the module, one driver source,
persistence, the branch suits the GPUs (architecture and module flavour) and is still supported, and a CUDA
toolkit installed on the host runs on this driver."""

from __future__ import annotations

import shlex
from datetime import date

from packaging.version import Version

from gpunode import compat, fixes, gpus, rules
from gpunode.doctor.base import NO_GPU, Node, Verdict, check, failed, passed, skipped, warned
from gpunode.doctor.hardware import VGPU_LINE
from gpunode.errors import GpunodeError
from gpunode.explain import explain
from gpunode.facts import driver as driver_facts
from gpunode.facts.driver import parse_cuda_toolkits

# the kernel's messages, explained here: dmesg runs on the node, explain on this machine
_DMESG = fixes.on_node("sudo dmesg", fixes.gpunode("explain"))


def install_fix(node: Node, at_least: Version | None = None) -> fixes.Fix:
    """`gpunode install --driver` with a release that suits the node's GPUs (and `at_least`), from the tables."""
    day = date.fromisoformat(node.today) if node.today else None
    version = rules.recommended_version(node.facts, None, at_least, day)
    if version is None:
        known = [g for g in (gpus.lookup_id(d.device) for d in node.facts.gpus) if g is not None]
        if known:
            return fixes.gpunode("compat", gpu=known[0].name) + "  # names the drivers that suit it"
        return fixes.join("gpunode's tables know no driver for these GPUs: pick one at "
                          "https://www.nvidia.com/en-us/drivers/ for the PCI ids `", fixes.on_node("lspci -nn -d 10de:"),
                          "` shows")
    return fixes.gpunode("install", driver=version) + "  # a recommended release that suits these GPUs"


def _native_min(cuda: str) -> Version | None:
    for asked in (cuda, ".".join(cuda.split(".")[:2])):
        try:
            return compat.driver_needed_for_cuda(asked).native_min
        except GpunodeError:
            continue
    return None


def _driver(node: Node) -> Version | None:
    try:
        return compat.parse_driver(node.driver_version) if node.driver_version else None
    except GpunodeError:
        return None


def _suggest(low: Version | None, high: int | None, today: str | None) -> str | None:
    """An example release for a driver range, from gpunode's branch table."""
    day = date.fromisoformat(today) if today else None
    branches = compat.recommended_drivers(low, high, day)
    return str(branches[0].latest_known) if branches else None


def _load_blocker(node: Node) -> str | None:
    """Why an installed module cannot load, when another check already reports that cause."""
    if node.facts.module_loaded("nouveau"):
        return "nouveau holds the GPU (see kernel.nouveau-loaded)"
    if node.kernel_log is not None and VGPU_LINE.search(node.kernel_log.text):
        return "the GPU is a vGPU instance (see hw.vgpu)"
    sb = node.facts.secure_boot
    if sb.enabled and (any(f.id == "secureboot.module-rejected" for f in node.kernel_findings) or
                       node.facts[driver_facts.MODULE].signer is None):
        return "Secure Boot refuses it (see boot.secure-boot)"
    driver = _driver(node)
    if driver is not None:
        for _, _, gpu in _placed(node):
            if gpu is not None and not compat.driver_supports(gpus.architecture_of(gpu), driver)[0]:
                return "this branch does not support the GPU (see driver.branch-supports-gpu)"
        flavour = node.driver.module_flavour
        needs = {gpu.open_module for _, _, gpu in _placed(node) if gpu is not None}
        if (flavour == "proprietary" and "required" in needs) or (flavour == "open" and "unsupported" in needs):
            return f"the {flavour} module cannot drive these GPUs (see driver.module-flavour)"
    return None


def _installed_label(node: Node) -> str:
    state = node.driver
    packaged = state.packaged
    if packaged is not None and packaged.version:
        return f"driver {packaged.version} (distribution package {packaged.owner} {packaged.package_version})"
    if packaged is not None:
        return f"a driver from distribution packages ({packaged.owner} {packaged.package_version})"
    return f"driver {state.module or state.installed}"


@check("driver.loaded", "driver", "NVIDIA kernel module loaded")
def loaded(node: Node) -> Verdict:
    if not node.has_gpu:
        if not node.driver_on_disk:
            return NO_GPU
        kernel = node.facts.kernel
        built = node.kernels.built_for(kernel)
        where = f"its module is built for kernel {kernel} ({built[0]})" if built else \
            f"no nvidia module is built for the running kernel {kernel}"
        unresolved = ""
        if node.driver.packaged is not None and not node.driver.packaged.loads_as_nvidia:
            unresolved = ("; `modprobe nvidia` would not find it: no modprobe configuration maps nvidia to the renamed "
                          "module file (Debian links it in with libcuda1)")
        return skipped(f"{_installed_label(node)} is installed and {where}; it is not loaded and cannot be: no NVIDIA "
                       f"GPU on this node for it to drive{unresolved}")
    d = node.facts.loaded_driver
    if d:
        return passed(f"/proc/driver/nvidia/version: {d.version} ({d.flavour} kernel module)")
    state = node.driver
    if state.module:
        cause = _load_blocker(node)
        if cause:
            return skipped(f"driver {state.module} is installed but not loaded: {cause}")
        return failed(f"driver {state.module} is installed for kernel {node.facts.kernel} but not loaded "
                      "(/proc/driver/nvidia/version does not exist)",
                      fixes.on_node("sudo modprobe nvidia") + "  # if it fails: " + _DMESG)
    if state.installed:
        newest = node.kernels.newest
        if newest is not None and newest.name == node.facts.kernel and not node.kernels.built_for(newest.name):
            return skipped(f"driver {state.installed} is installed but has no module for kernel {node.facts.kernel} "
                           "(see kernel.dkms-newest-kernel)")
        return failed(f"driver {state.installed} user space is installed but no nvidia module exists for kernel "
                      f"{node.facts.kernel}", fixes.gpunode("install", driver=state.installed) + "  # rebuilds the module")
    return failed("no NVIDIA driver is installed (/proc/driver/nvidia/version does not exist)", install_fix(node))


@check("driver.single-source", "driver", "one driver, from one source")
def single_source(node: Node) -> Verdict:
    """A .run driver on top of distribution packages (or the reverse) leaves two sets of libraries and modules
    that overwrite each other at the next update. About the software: checked with no GPU too."""
    if not node.has_gpu and not node.driver_on_disk:
        return NO_GPU
    state = node.driver
    if not state.packages and not state.installer:
        return skipped("no NVIDIA driver installed") if not state.installed else passed(
            f"driver {state.installed} (no installer record, no driver packages)")
    if state.packages and state.installer:
        names = ", ".join(f"{n} {v}" for n, v in state.packages[:4]) + (" ..." if len(state.packages) > 4 else "")
        return failed(f"the .run installer installed {state.installer} and distribution packages are installed "
                      f"too ({names})", rules.packages_remove(node.facts, state) + "  # keep one source; then reboot "
                      "and: " + fixes.gpunode("install", driver=state.installer))
    if state.installer:
        return passed(f"driver {state.installer} from NVIDIA's .run installer")
    found = state.packaged
    version = f"driver {found.version} " if found is not None and found.version else "driver "
    mine = driver_facts.gpunode_driver(node.facts)
    by = (", installed by gpunode (--driver-source packages)" if mine.source == "packages"
          else "")
    return passed(f"{version}from distribution packages ({', '.join(n for n, _ in state.packages[:3])}"
                  + (" ..." if len(state.packages) > 3 else "") + f"), no .run installer record{by}")


@check("driver.packages-held", "driver", "the driver packages gpunode installed are at their versions and held")
def packages_held(node: Node) -> Verdict:
    """--driver-source packages: every package of the route is still at the exact version gpunode installed, and
    the holds it placed are still there (an unattended upgrade, or a person's `apt-mark unhold`, moves one package
    of the driver alone and the module no longer matches its libraries). About the software: no GPU needed."""
    from gpunode import driver_packages as routes
    from gpunode import pkgmgr

    mine = driver_facts.gpunode_driver(node.facts)
    if mine.source != "packages":
        return skipped("gpunode did not install the driver from packages")
    if not mine.pinned:
        return skipped(f"driver {mine.version} from packages: the journal's record names no package versions (written "
                       "by an older gpunode; the next install records them)")
    have = routes.installed(node.facts)
    moved = [f"{n} {have[n][0]} (installed {v})" for n, v in mine.pinned if n in have and have[n][0] != v]
    gone = [n for n, _ in mine.pinned if n not in have]
    if moved or gone:
        what = "; ".join([*(f"{m}" for m in moved), *(f"{n} removed" for n in gone)])
        return failed(f"driver {mine.version}'s packages moved since gpunode installed them: {what}",
                      fixes.gpunode("install", driver_source="packages", driver=mine.version)
                      + "  # puts every package back at its exact version and holds it")
    os_key = routes.route_os(node.facts.os.id, node.facts.os.family) or ""
    manager = routes.manager_of(node.facts, os_key)
    unheld = [(n, v) for n, v in mine.pinned if n in mine.held and not have[n][1]]
    if unheld and manager is not None:
        hold = " ".join(shlex.quote(w) for w in pkgmgr.get(manager).hold_all(unheld))
        return warned(f"driver {mine.version}'s packages are at their versions but no longer held: "
                      + ", ".join(n for n, _ in unheld) + " (an upgrade can move them alone)",
                      fixes.on_node(f"sudo {hold}"))
    held = [n for n, _ in mine.pinned if have[n][1]]
    return passed(f"driver {mine.version}: {len(mine.pinned)} packages at the versions gpunode installed"
                  + (f", {len(held)} held" if held else ", not held (--no-hold-driver)" if not mine.held else ""))


@check("driver.version-mismatch", "driver", "loaded module matches the user-space libraries")
def version_mismatch(node: Node) -> Verdict:
    if not node.has_gpu:
        return NO_GPU
    loaded_driver = node.facts.loaded_driver
    if not loaded_driver:
        return skipped("the NVIDIA module is not loaded")
    state = node.driver
    if state.mismatch:
        libs = state.installed or "another version"
        return failed(f"kernel module {loaded_driver.version} is loaded but the user-space libraries are {libs} "
                      "(NVML: Driver/library version mismatch)", fixes.on_node("sudo reboot") + "  # loads the module that matches",
                      reboot=True)
    return passed(f"module and libraries are both {loaded_driver.version}" if state.installed else
                  f"module {loaded_driver.version} loaded (no other library version found)")


@check("driver.smi", "driver", "nvidia-smi works")
def smi(node: Node) -> Verdict:
    if not node.has_gpu:
        return NO_GPU
    if not node.facts.loaded_driver:
        return skipped("the NVIDIA module is not loaded")
    state = node.driver
    if state.mismatch:
        return skipped("nvidia-smi fails because of the version mismatch (see driver.version-mismatch)")
    if state.smi_status is None:
        return failed("nvidia-smi is not installed although the module is loaded",
                      fixes.gpunode("install", driver=node.facts.loaded_driver.version) + "  # reinstalls user space")
    if state.smi_status == 0:
        return passed(f"nvidia-smi answers: driver {state.smi_text.splitlines()[0] if state.smi_text else '?'}")
    first = state.smi_text.splitlines()[0] if state.smi_text else f"exit status {state.smi_status}"
    findings = explain(state.smi_text)
    if findings:
        return failed(f"nvidia-smi fails: {first} ({findings[0].cause})", findings[0].fix)
    return failed(f"nvidia-smi fails: {first}", _DMESG)


@check("driver.persistence", "driver", "persistence mode")
def persistence(node: Node) -> Verdict:
    """Without persistence the driver tears the GPU state down whenever no process uses it: every job start
    pays the initialisation again, and monitoring sees GPUs come and go."""
    if not node.has_gpu:
        return NO_GPU
    if not node.smi_gpus:
        return skipped("persistence mode unknown: the NVIDIA driver is not loaded or nvidia-smi fails")
    off = [g for g in node.smi_gpus if g.persistence and g.persistence != "Enabled"]
    if not off:
        daemon = node.units.get("nvidia-persistenced.service")
        how = " (nvidia-persistenced)" if daemon is not None and daemon.is_active else ""
        return passed(f"persistence mode enabled on all {len(node.smi_gpus)} GPU(s){how}")
    # The nodesettings step covers every case: no unit yet, a disabled unit, a vendor unit started with
    # --no-persistence-mode. `nvidia-smi -pm 1` alone would not survive a reboot.
    return warned(f"persistence mode is off on GPU {', '.join(str(g.index) for g in off)}",
                  fixes.gpunode("install", only="nodesettings"))


def _placed(node: Node) -> list[tuple[int, str, gpus.Gpu | None]]:
    """(PCI device id, label, table entry or None) for each distinct GPU model on the node."""
    seen: dict[int, tuple[int, str, gpus.Gpu | None]] = {}
    for device in node.facts.gpus:
        seen.setdefault(device.device, (device.device, node.gpu_label(device.device), gpus.lookup_id(device.device)))
    return list(seen.values())


@check("driver.branch-supports-gpu", "driver", "driver branch supports the GPU architecture")
def branch_supports_gpu(node: Node) -> Verdict:
    """R580 is the last branch for Maxwell, Pascal and Volta; a new architecture needs a branch that knows it."""
    if not node.has_gpu:
        return NO_GPU
    driver = _driver(node)
    if driver is None:
        return skipped("no NVIDIA driver installed")
    checks, unknown = [], []
    for _, label, gpu in _placed(node):
        if gpu is None:
            unknown.append(label)
            continue
        checks.append(compat.check_architecture(driver, gpus.architecture_of(gpu), label))
    bad = [c for c in checks if not c.ok]
    if bad:
        lows = [c.min_driver for c in checks if c.min_driver is not None]
        highs = [c.max_branch for c in checks if c.max_branch is not None]
        example = _suggest(max(lows) if lows else None, min(highs) if highs else None, node.today)
        return failed("; ".join(c.reason for c in bad), fixes.gpunode("install", driver=example) if example else
                      compat.fix_for(checks, driver))
    if unknown:
        return warned(f"{', '.join(unknown)}: not in gpunode's GPU table, so driver {driver} could not be checked",
                      fixes.on_node("nvidia-smi -q | grep -i 'product name'",
                                    note="then check NVIDIA's supported-GPU list for the driver release"))
    return passed("; ".join(c.reason for c in checks))


@check("driver.module-flavour", "driver", "kernel module flavour suits the GPUs")
def module_flavour(node: Node) -> Verdict:
    """Blackwell and Grace Hopper run only with the open kernel module; Maxwell, Pascal and Volta only with the
    proprietary one. The wrong one loads and then finds no device ("No devices were found")."""
    if not node.has_gpu:
        return NO_GPU
    flavour = node.facts.loaded_driver.flavour if node.facts.loaded_driver else node.driver.module_flavour
    if flavour is None:
        return skipped("no NVIDIA module installed")
    version = node.driver_version or "VERSION"
    need_open: list[str] = []
    no_open: list[str] = []
    for device, label, gpu in _placed(node):
        need = gpu.open_module if gpu else gpus.generation_for_id(device)[1]
        if need == "required":
            need_open.append(label)
        elif need == "unsupported":
            no_open.append(label)
    where = "loaded" if node.facts.loaded_driver else "installed"
    if need_open and flavour != "open":
        return failed(f"the proprietary module is {where}, but {', '.join(need_open)} need(s) the open module",
                      fixes.gpunode("install", driver=version, kernel_module="open"))
    if no_open and flavour == "open":
        return failed(f"the open module is {where}, but {', '.join(no_open)} cannot use it",
                      fixes.gpunode("install", driver=version, kernel_module="proprietary") + "  # R580 or older")
    return passed(f"{flavour} module {where}; {node.gpu_list()} can use it")


@check("driver.branch-lifecycle", "driver", "driver branch still supported")
def branch_lifecycle(node: Node) -> Verdict:
    """An end-of-life branch gets no security or bug fixes; NVIDIA's data-center guidance is to move to a
    supported LTSB or production branch."""
    if not node.has_gpu and not node.driver_on_disk:
        return NO_GPU
    driver = _driver(node)
    if driver is None:
        return skipped("no NVIDIA driver installed")
    branch = compat.tables().branches.get(compat.branch_of(driver))
    if branch is None:
        return passed(f"R{compat.branch_of(driver)} is not in gpunode's branch table")
    if node.today is None:
        return skipped(f"R{branch.branch} {branch.label}: the node's date is unknown")
    status = branch.status(date.fromisoformat(node.today))
    if status != "end-of-life":
        until = f", supported until {branch.end_of_life}" if branch.end_of_life else ""
        return passed(f"driver {driver}: R{branch.branch} {branch.label}{until}")
    highs = []
    for _, _, gpu in _placed(node):
        if gpu is not None:
            arch = gpus.architecture_of(gpu)
            if arch.last_driver_branch is not None:
                highs.append(arch.last_driver_branch)
    example = _suggest(None, min(highs) if highs else None, node.today)
    fix = fixes.gpunode("install", driver=example) if example else install_fix(node)
    if node.driver.packages and example:
        # a .run over the packages is refused (driver step): the packages go first
        fix = (rules.packages_remove(node.facts, node.driver) + f"  # the distribution's driver is R{branch.branch}; "
               "then: " + fix)
    return warned(f"driver {driver}: R{branch.branch} {branch.label} reached end of life in {branch.end_of_life}", fix)


@check("cuda.toolkit-vs-driver", "cuda", "installed CUDA toolkit runs on the driver")
def cuda_toolkit(node: Node) -> Verdict:
    """A CUDA toolkit on the host (for builds outside containers) needs a driver at least as new as the one it
    was released with; minor-version compatibility covers most but not all of it (no PTX JIT)."""
    if not node.has_gpu:
        return NO_GPU
    toolkits = parse_cuda_toolkits(node.facts[driver_facts.CUDA_TOOLKITS])
    if not toolkits:
        return passed("no CUDA toolkit under /usr/local (containers bring their own CUDA)")
    driver = _driver(node)
    if driver is None:
        return skipped(f"CUDA {', '.join(toolkits)} installed, but no NVIDIA driver")
    problems, notes, fine = [], [], []
    for version, dirs in sorted(toolkits.items(), key=lambda item: Version(item[0])):
        result = None
        for asked in (version, ".".join(version.split(".")[:2])):  # 11.8.20220929 in old version.json files
            try:
                result = compat.check_cuda(driver, asked)
                break
            except GpunodeError:
                continue
        if result is None:
            notes.append(f"CUDA {version} ({dirs[0]}) is not in gpunode's table")
            continue
        for _, _, gpu in _placed(node):
            if gpu is not None:
                arch_check = compat.check_cuda_architecture(gpus.architecture_of(gpu), Version(version),
                                                            f"CUDA {version}", gpu.name)
                if arch_check is not None and not arch_check.ok:
                    problems.append((arch_check.reason, arch_check.fix or ""))
        if not result.ok:
            example = _suggest(result.min_driver, None, node.today)
            problems.append((f"{dirs[0]}: {result.reason}",
                             fixes.gpunode("install", driver=example) if example else install_fix(node)))
        elif result.via != "native":
            notes.append(f"{dirs[0]}: {result.reason}")
        else:
            fine.append(f"CUDA {version} ({dirs[0]})")
    if problems:
        return failed("; ".join(p for p, _ in problems), next((f for _, f in problems if f), install_fix(node)))
    if notes:
        newest = max(toolkits, key=Version)
        return warned("; ".join(notes), "for native support: " + install_fix(node, _native_min(newest)))
    return passed(f"{', '.join(fine)} runs natively on driver {driver}")
