"""Health and packages layers: what the kernel log says about the GPUs since boot (Xid errors and driver errors,
read with gpunode explain's tables), and whether automatic upgrades could move NVIDIA packages under a running
driver."""

from __future__ import annotations

import re

from gpunode import fixes
from gpunode.doctor.base import NO_GPU, Node, Verdict, check, failed, passed, skipped, warned
from gpunode.explain import Finding
from gpunode.facts import health as health_facts
from gpunode.facts import packages as package_facts
from gpunode.facts.driver import DRIVER_PACKAGE
from gpunode.facts.fabric import FM_PACKAGE
from gpunode.facts.packages import held_packages

UNREADABLE = ("the kernel log is not readable: dmesg is restricted to root here and this user cannot read the "
              "journal (run doctor as root, or add the user to the adm or systemd-journal group)")
# worst first: what the operator must do
_RANK = {"reboot": 0, "hardware": 1, "reset": 2, "unknown": 3, "nvlink": 4, "app": 5, "info": 6}
_SEVERE = {"reboot", "hardware", "reset", "unknown"}


def _xid_text(f: Finding) -> str:
    v = f.values
    times = f" x{v['count']}" if v.get("count", 1) > 1 else ""
    return f"Xid {v.get('xid')} on {v.get('pci')}{times}: {v.get('meaning')} ({v.get('action')})"


@check("health.xid", "health", "no Xid errors in the kernel log")
def xid(node: Node) -> Verdict:
    """Xid is the driver's error report for one GPU. The meaning and the action come from explain's table:
    79 fallen off the bus, 48 double-bit ECC, 63/64 row remapping, 74 NVLink, 94/95 ECC containment, 119 GSP..."""
    if not node.has_gpu:
        return NO_GPU
    log = node.kernel_log
    if log is None:
        return skipped(UNREADABLE)
    xids = sorted((f for f in node.kernel_findings if f.id.startswith("xid.")),
                  key=lambda f: _RANK.get(str(f.values.get("severity")), 3))
    if not xids:
        return passed(f"no Xid errors since boot ({log.source})")
    evidence = "; ".join(_xid_text(f) for f in xids)
    worst = xids[0]
    if str(worst.values.get("severity")) in _SEVERE:
        return failed(evidence, worst.fix, reboot=str(worst.values.get("severity")) in ("reboot", "reset"))
    return warned(evidence, worst.fix)


@check("health.driver-errors", "health", "no NVIDIA driver errors in the kernel log")
def driver_errors(node: Node) -> Verdict:
    """Probe failures, RmInitAdapter errors, a GPU that fell off the bus, a GPU this driver does not support,
    NVSwitch SXid errors: the kernel log says why a driver does not work better than anything else."""
    if not node.has_gpu:
        return NO_GPU
    log = node.kernel_log
    if log is None:
        return skipped(UNREADABLE)
    found = [f for f in node.kernel_findings if f.id.startswith(("kernel.", "sxid.", "dkms."))]
    if not found:
        return passed(f"no NVIDIA driver errors since boot ({log.source})")
    evidence = "; ".join(f"{f.title}: {f.excerpt[:160]}" for f in found[:3])
    fatal_sxid = [f for f in found if f.id.startswith("sxid.") and f.values.get("fatal")]
    serious = [f for f in found if not f.id.startswith("sxid.")]
    working = node.facts.loaded_driver is not None and node.driver.smi_status == 0
    if fatal_sxid:
        return failed(evidence, fatal_sxid[0].fix)
    if serious and not working:
        return failed(evidence, serious[0].fix)
    earlier = "earlier in this boot (the driver works now): " if serious else ""
    return warned(earlier + evidence, found[0].fix)


# ---- automatic upgrades ------------------------------------------------------------------------------------


def _tied_to_driver(name: str) -> bool:
    """Packages whose version must equal the loaded module's: driver user space, fabric manager, NSCQ."""
    if name.startswith(("nvidia-container", "libnvidia-container")):
        return False
    return bool(DRIVER_PACKAGE.match(name) or FM_PACKAGE.match(name) or
                name.startswith("libnvidia-nscq"))


def _blacklisted(name: str, patterns: tuple[str, ...]) -> bool:
    for pattern in patterns:
        try:
            if re.match(pattern, name):
                return True
        except re.error:
            if name.startswith(pattern):
                return True
    return False


def _enabled(node: Node, unit: str) -> bool | None:
    """None when the unit does not exist or systemd was not asked (no systemd)."""
    state = node.units.get(unit)
    if state is None or not state.exists:
        return None
    return state.is_enabled or state.is_active


@check("pkg.unattended-upgrades", "packages", "automatic upgrades leave NVIDIA packages alone")
def unattended_upgrades(node: Node) -> Verdict:
    """unattended-upgrades (or dnf-automatic) replacing driver libraries under a loaded module gives "Driver/
    library version mismatch" at the next CUDA start; a new fabric manager stops starting. Held (or
    versionlocked, or blacklisted) packages are safe."""
    if not node.has_gpu:
        return NO_GPU
    settings = node.facts[health_facts.AUTO_UPGRADE]
    family = node.facts.os.family
    tied = sorted(name for name in node.packages if _tied_to_driver(name))
    if family == "debian":
        if not settings.apt_installed:
            return passed("unattended-upgrades is not installed")
        if (settings.apt_periodic or "0") == "0":
            return passed("unattended-upgrades is installed but off (APT::Periodic::Unattended-Upgrade is 0)")
        if _enabled(node, "apt-daily-upgrade.timer") is False:
            return passed("unattended-upgrades is configured but apt-daily-upgrade.timer is disabled")
        at_risk = [n for n in tied if not node.packages[n].held and not _blacklisted(n, settings.apt_blacklist)]
        if not at_risk:
            return passed("unattended-upgrades is on; no NVIDIA driver package it could upgrade"
                          + (f" ({', '.join(tied)} held or blacklisted)" if tied else ""))
        return warned(f"unattended-upgrades is on and may upgrade {', '.join(at_risk)} (not held, not in "
                      "Unattended-Upgrade::Package-Blacklist): new driver libraries under the loaded module break "
                      "NVML (Driver/library version mismatch)", fixes.on_node(f"sudo apt-mark hold {' '.join(at_risk)}"))
    if family == "rhel":
        installs = _enabled(node, "dnf-automatic-install.timer") or (
            _enabled(node, "dnf-automatic.timer") and settings.dnf.get("apply_updates", "no").lower() in
            ("yes", "true", "1"))
        if not installs:
            return passed("dnf-automatic does not install updates")
        held = held_packages(node.packages, node.facts[package_facts.PACKAGE_LOCKS])
        at_risk = [n for n in tied if n not in held]
        if not at_risk:
            return passed("dnf-automatic installs updates; the NVIDIA driver packages are versionlocked"
                          if tied else "dnf-automatic installs updates; no NVIDIA driver package is installed")
        return warned(f"dnf-automatic installs updates and may upgrade {', '.join(at_risk)} (not versionlocked)",
                      fixes.on_node(f"sudo dnf versionlock add {' '.join(at_risk)}"))
    return skipped(f"automatic upgrades are not checked on {node.facts.os}")
