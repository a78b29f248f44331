"""Fabric layer: on NVSwitch systems, fabric manager installed, at exactly the driver's version, running, and the
fabric programmed. Without it CUDA fails with "system not yet initialized" (802) while nvidia-smi looks fine."""

from __future__ import annotations

from gpunode import fixes, rules
from gpunode.doctor.base import NO_GPU, Node, Verdict, check, failed, passed, skipped, warned
from gpunode.explain import explain
from gpunode.facts import fabric as fabric_facts
from gpunode.facts.fabric import off_host_fabric
from gpunode.facts.packages import Package

INSTALL = fixes.gpunode("install", only="fabricmanager")


def _switches(node: Node) -> int:
    bound = node.facts[fabric_facts.NVSWITCH_DEVICES]
    return max(len(node.facts.nvswitches), len(bound))


def _installed(node: Node) -> tuple[str, Package] | None:
    found = sorted((n, p) for n, p in node.packages.items() if fabric_facts.FM_PACKAGE.match(n))
    return found[0] if found else None


def _needs_fabric_manager(node: Node) -> int:
    """How many NVSwitches this host's fabric manager has to manage (0: none, or managed elsewhere)."""
    if off_host_fabric(node.facts[fabric_facts.FABRIC_STATE]):
        return 0
    return _switches(node)


@check("fabric.manager-installed", "fabric", "fabric manager installed on NVSwitch systems")
def manager_installed(node: Node) -> Verdict:
    if not node.has_gpu:
        return NO_GPU
    fabric = node.facts[fabric_facts.FABRIC_STATE]
    installed = _installed(node)
    if off_host_fabric(fabric):
        return passed("the NVLink fabric is managed off this host (GB200/GB300-style rack): nothing to run here")
    switches = _switches(node)
    nvlink5 = node.facts[fabric_facts.NVLINK5_SWITCHES]
    if not switches and not nvlink5:
        extra = f" ({installed[0]} is installed and has nothing to manage)" if installed else ""
        return passed(f"no NVSwitch (PCIe or directly linked GPUs): fabric manager is not needed{extra}")
    what = f"{switches} NVSwitch(es)" if switches else f"NVLink-5 switch trays ({', '.join(nvlink5)})"
    if installed:
        note = "; NVLSM is not checked" if nvlink5 and not switches else ""
        return passed(f"{what}: {installed[0]} {installed[1].version}{note}")
    fix = INSTALL if switches else ("install nvidia-fabricmanager and nvlsm at the driver's version (NVIDIA Fabric "
                                    "Manager User Guide)")
    return failed(f"{what} and no fabric manager: CUDA fails with 'system not yet initialized' (802)", fix)


@check("fabric.manager-version", "fabric", "fabric manager version equals the driver's")
def manager_version(node: Node) -> Verdict:
    if not node.has_gpu:
        return NO_GPU
    if not _needs_fabric_manager(node):
        return skipped("no NVSwitch managed from this host")
    installed = _installed(node)
    if installed is None:
        return skipped("fabric manager is not installed (see fabric.manager-installed)")
    if not node.facts.loaded_driver:
        return skipped("the NVIDIA module is not loaded")
    name, package = installed
    driver = node.facts.loaded_driver.version
    if package.upstream != driver:
        return failed(f"{name} {package.version}, driver {driver}: fabric manager refuses to start unless the versions "
                      "are identical", INSTALL)
    held = " (held)" if package.held else ""
    return passed(f"{name} {package.version}{held} matches driver {driver}")


@check("fabric.manager-active", "fabric", "fabric manager running, fabric programmed")
def manager_active(node: Node) -> Verdict:
    if not node.has_gpu:
        return NO_GPU
    if not _needs_fabric_manager(node):
        return skipped("no NVSwitch managed from this host")
    installed = _installed(node)
    if installed is None or not node.facts.loaded_driver:
        return skipped("fabric manager is not installed or the driver is not loaded")
    if installed[1].upstream != node.facts.loaded_driver.version:
        return skipped("fabric manager cannot start at another version than the driver (see fabric.manager-version)")
    unit = node.units.get(rules.FABRIC_MANAGER_UNIT)
    if unit is None or not unit.is_active:
        state = unit.active if unit else "unknown"
        log = node.facts[fabric_facts.FABRICMANAGER_LOG]
        last = log.splitlines()[-1] if log else ""
        findings = explain(log) if log else []
        why = f"; {rules.FABRIC_MANAGER_LOG}: {last}" if last else ""
        fix = (fixes.on_node(f"sudo systemctl enable --now {rules.FABRIC_MANAGER}")
               + f"  # then: journalctl -u {rules.FABRIC_MANAGER} -b")
        return failed(f"{rules.FABRIC_MANAGER_UNIT} is {state}{why}" + (f" ({findings[0].title})" if findings else ""), fix)
    fabric = [g for g in node.facts[fabric_facts.FABRIC_STATE] if g.reported]
    broken = [g for g in fabric if not g.settled and g.state != "In Progress"]
    if broken:
        return failed("fabric not ready: " + "; ".join(f"GPU {g.gpu} {g.state}/{g.status}" for g in broken[:4]),
                      fixes.on_node(f"sudo systemctl restart {rules.FABRIC_MANAGER}")
                      + f"  # and read {rules.FABRIC_MANAGER_LOG}")
    if not unit.is_enabled:
        return warned(f"{rules.FABRIC_MANAGER_UNIT} runs but is not enabled: after a reboot the fabric stays unprogrammed",
                      fixes.on_node(f"sudo systemctl enable {rules.FABRIC_MANAGER}"))
    busy = [g for g in fabric if g.state == "In Progress"]
    if busy:
        return warned(f"{rules.FABRIC_MANAGER_UNIT} is active; the fabric is still being programmed on {len(busy)} GPU(s)",
                      fixes.on_node("nvidia-smi -q | grep -A3 Fabric",
                                    note=f"should reach Completed; if not: sudo systemctl restart {rules.FABRIC_MANAGER}"))
    done = f", fabric Completed on {len(fabric)} GPU(s)" if fabric else ""
    return passed(f"{rules.FABRIC_MANAGER_UNIT} active and enabled{done}")
