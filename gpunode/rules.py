"""Domain rules that the install steps, doctor and undo all read, written once here so that none of them has to
import another's machinery (a read-only command such as `doctor` loads nothing of the installer):

- which package manager a node's facts call for;
- which driver will be in place once the run is done (what later steps match: compat, fabric manager);
- the newest driver release of the first recommended branch that suits every GPU (the compatibility tables of
  gpunode/compat.py);
- the names gpunode's steps write or manage that the checks look at: the nouveau blacklist, the toolkit's
  packages, fabric manager's service and log.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from datetime import date
from typing import TYPE_CHECKING

from packaging.version import Version

from gpunode import compat, fixes, gpus, pkgmgr
from gpunode.errors import GpunodeError
from gpunode.record import Frozen

if TYPE_CHECKING:
    from gpunode.facts import Facts
    from gpunode.facts.driver import DriverState
    from gpunode.steps.outputs import DriverOutputs

NOUVEAU_BLACKLIST = "/etc/modprobe.d/blacklist-nouveau.conf"
TOOLKIT_PACKAGES = ("nvidia-container-toolkit", "nvidia-container-toolkit-base", "libnvidia-container-tools",
                    "libnvidia-container1")
FABRIC_MANAGER = "nvidia-fabricmanager"
FABRIC_MANAGER_UNIT = f"{FABRIC_MANAGER}.service"
FABRIC_MANAGER_LOG = "/var/log/fabricmanager.log"



def runtime_binary_fix(manager: str | None) -> str:
    """nvidia-container-runtime belongs to nvidia-container-toolkit-base: put its files back by reinstalling it.
    Shared by the runtime step (blocked) and doctor's runtime checks (fail)."""
    if manager is None:
        return f"reinstall {TOOLKIT_PACKAGES[1]} with the node's package manager"
    return fixes.on_node("sudo " + shlex.join(pkgmgr.get(manager).reinstall((TOOLKIT_PACKAGES[1],))))


def packages_remove(facts: Facts, state: DriverState) -> str:
    """The command that removes the packaged driver, by the names dpkg/rpm report (a pattern like 'nvidia-*' would
    also match the hundreds of uninstalled nvidia packages of a non-free source), and reboots if it is loaded.
    Read by the driver step (a .run over packages is refused) and by doctor (one driver source)."""
    listed = [n for n, _ in state.packages]
    if state.packaged is not None and state.packaged.alternative:
        # Debian: its nvidia-persistenced/nvidia-modprobe depend on the driver's libraries; left installed, apt
        # satisfies them with another flavour (seen on the real-OS tier: nvidia-tesla-470-alternative came in)
        listed += ["nvidia-persistenced", "nvidia-modprobe"]
    names = list(dict.fromkeys(listed))
    reboot = " && sudo reboot" if state.loaded is not None or facts.module_loaded("nvidia") else ""
    if facts.os.family == "rhel":
        return fixes.on_node("sudo " + shlex.join(pkgmgr.get("dnf").remove(names)) + reboot)
    # pkgmgr's purge removes held packages too (gpunode's --driver-source packages holds them; a plain `purge -y`
    # exits 100 on real apt)
    return fixes.on_node("sudo " + shlex.join(pkgmgr.get("apt").purge(names)) +
                         f" && sudo apt-get autoremove -y --purge{reboot}")


def load_fix(state: DriverState) -> str:
    """How to load an installed, unloaded driver: `modprobe nvidia`, unless the module file is renamed (Debian's
    nvidia-current.ko) and nothing redirects the name."""
    modprobe = fixes.on_node("sudo modprobe nvidia")
    if state.packaged is not None and not state.packaged.loads_as_nvidia:
        # Debian links its modprobe configuration (nvidia -> nvidia-current) and its libraries' loader path
        # through the glx alternative, which libcuda1 (or the full nvidia-driver) registers
        return (fixes.on_node("sudo apt-get install -y libcuda1") + "  # Debian links its modprobe configuration "
                "(nvidia -> nvidia-current) and the loader path of its libraries through the glx alternative, "
                "registered with libcuda1 (or the full nvidia-driver); then: " + modprobe)
    return (modprobe + "  # if it fails: " + fixes.on_node("sudo dmesg", fixes.gpunode("explain"))
            + "; a reboot also loads it")


NO_GPU = "no NVIDIA GPU on this node: the driver would have nothing to drive"
NO_GPU_FIX = "check `" + fixes.on_node("lspci -nn -d 10de:") + "` (a VM needs the GPU passed through), or drop --driver"


def package_manager(facts: Facts) -> str | None:
    """apt on Debian's family (or wherever apt-get is), dnf (yum without it) on RHEL's, zypper on SUSE (SLES,
    openSUSE Leap); None elsewhere."""
    if facts.os.family == "debian" or facts.has("apt-get"):
        return "apt"
    if facts.os.family == "rhel":
        return "dnf" if facts.has("dnf") or not facts.has("yum") else "yum"
    if facts.os.family == "suse":
        return "zypper"
    return None


def recommended_version(facts: Facts, cuda: str | None = None, at_least: Version | None = None,
                        today: date | None = None) -> str | None:
    """The newest release of the first recommended branch (gpunode/compat.py tables) that supports every GPU of
    the node (and `cuda` when given, and `at_least`). None when the tables know none."""
    lows: list[Version] = [at_least] if at_least is not None else []
    highs: list[int] = []
    for device in sorted({g.device for g in facts.gpus}):
        gpu = gpus.lookup_id(device)
        if gpu is None:
            continue
        arch = gpus.architecture_of(gpu)
        low = compat.architecture_min_driver(arch)
        if low is not None:
            lows.append(low)
        if gpu.open_module == "required":
            lows.append(Version(f"{gpus.BOTH_FLAVOURS_FROM}"))
        if arch.last_driver_branch is not None:
            highs.append(arch.last_driver_branch)
    if cuda:
        try:
            need = compat.driver_needed_for_cuda(cuda)
        except GpunodeError:
            need = None
        if need is not None and need.native_min is not None:
            lows.append(need.native_min)
    found = compat.recommended_drivers(max(lows) if lows else None, min(highs) if highs else None, today)
    return str(found[0].latest_known) if found and found[0].latest_known else None


@dataclass(frozen=True, eq=False, repr=False)
class InPlace(Frozen):
    """The driver that will be in place once this run is done, and whence that is known."""

    version: str
    source: str  # "--driver" (asked for) | "driver step" (its plan installs, loads or keeps it) | "loaded"
    changes: bool = False  # the driver step installs or loads it: not what runs now


def driver_in_place(loaded: str | None, requested: str | None, step: DriverOutputs | None) -> InPlace | None:
    """The driver step's outputs when it is part of this run (None when it does not know the version), else the
    version asked for with --driver, else the loaded driver; None when there is none."""
    if step is not None:
        if step.version is None:
            return None
        return InPlace(step.version, "--driver" if step.origin == "--driver" else "driver step", step.changes)
    if requested:
        return InPlace(requested, "--driver")
    return InPlace(loaded, "loaded") if loaded else None
