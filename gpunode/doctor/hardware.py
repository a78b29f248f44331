"""Hardware layer: is there an NVIDIA GPU, is it a vGPU instance, is MIG where the operator expects it."""

from __future__ import annotations

import re

from gpunode import fixes
from gpunode.doctor.base import NO_GPU, Node, Verdict, check, failed, passed, skipped, warned

VGPU_LINE = re.compile(r"^.*NVRM.*\b(?:vGPU|GRID)\b.*$", re.M)
GRID_FIX = ("install NVIDIA's vGPU (GRID) guest driver for this vGPU software release (NVIDIA-Linux-x86_64-<version>-"
            "grid.run from the NVIDIA Licensing Portal or your cloud's GRID driver page), then: "
            + fixes.gpunode("install", skip="driver"))
LICENCE_FIX = ("set ServerAddress or the client configuration token in /etc/nvidia/gridd.conf, then: "
               + fixes.on_node("sudo systemctl restart nvidia-gridd"))


@check("hw.gpu-present", "hardware", "NVIDIA GPU present (PCI)")
def gpu_present(node: Node) -> Verdict:
    found = node.facts.gpus
    if found:
        where = ", ".join(g.address for g in found)
        return passed(f"{len(found)} NVIDIA GPU(s): {node.gpu_list()} at {where}")
    return failed("no NVIDIA GPU was found: no PCI display device with vendor 0x10de",
                  fixes.on_node("lspci -nn -d 10de:", note="on a VM, check that the GPU is attached or passed through"))


@check("hw.vgpu", "hardware", "vGPU instance has the vGPU (GRID) driver")
def vgpu(node: Node) -> Verdict:
    """A vGPU slice of a physical GPU runs only with NVIDIA's vGPU guest driver (and a licence); the data-center
    driver gpunode installs does not drive it."""
    if not node.has_gpu:
        return NO_GPU
    modes = {g.virtualization for g in node.smi_gpus if g.virtualization}
    if "VGPU" in modes:
        licences = [g.license for g in node.smi_gpus if g.virtualization == "VGPU"]
        unlicensed = [lic for lic in licences if lic and not lic.lower().startswith("licensed")]
        if unlicensed:
            return warned(f"vGPU guest with the vGPU driver, but its licence status is {unlicensed[0]!r}: an "
                          "unlicensed vGPU is throttled after a grace period",
                          LICENCE_FIX)
        gridd = node.units.get("nvidia-gridd.service")
        has_gridd = node.facts.has("nvidia-gridd") or (gridd is not None and gridd.exists)
        return passed("vGPU guest running the vGPU driver" + (" (nvidia-gridd present)" if has_gridd else ""))
    if modes:
        return passed(f"not a vGPU instance (virtualization mode: {', '.join(sorted(modes))})")
    log = node.kernel_log
    if log is not None:
        lines = VGPU_LINE.findall(log.text)
        if lines:
            return failed(f"{log.source}: {lines[-1].strip()[:240]}: this GPU looks like a vGPU instance, which "
                          "needs NVIDIA's vGPU guest driver", GRID_FIX)
    if node.smi_gpus:
        return passed("not a vGPU instance (nvidia-smi reports no virtualization mode)")
    return skipped("virtualization mode unknown: the NVIDIA driver is not loaded or nvidia-smi fails")


@check("hw.mig-mode", "hardware", "MIG mode")
def mig_mode(node: Node) -> Verdict:
    """MIG changes what a container sees (MIG devices instead of whole GPUs); a pending change waits for a GPU
    reset, which surprises people who enabled it and rebooted nothing."""
    if not node.has_gpu:
        return NO_GPU
    if not node.smi_gpus:
        return skipped("MIG mode unknown: the NVIDIA driver is not loaded or nvidia-smi fails")
    pending = [g for g in node.smi_gpus if g.mig_pending and g.mig_current and g.mig_pending != g.mig_current
               and "N/A" not in (g.mig_pending, g.mig_current)]
    if pending:
        first = pending[0]
        shown = "; ".join(f"GPU {g.index} ({g.bus}): MIG {g.mig_current}, pending {g.mig_pending}" for g in pending)
        return warned(f"{shown}: the change takes effect only after a GPU reset",
                      fixes.on_node(f"sudo nvidia-smi -r -i {first.index}") + "  # when the GPU is idle; or reboot the node",
                      reboot=True)
    enabled = [g for g in node.smi_gpus if g.mig_current == "Enabled"]
    if enabled:
        return passed(f"MIG enabled on GPU {', '.join(str(g.index) for g in enabled)}: containers get MIG devices "
                      "(--gpus device=GPU:MIG, NVIDIA_VISIBLE_DEVICES=MIG-<uuid>)")
    reported = [g for g in node.smi_gpus if g.mig_current]
    if reported:
        return passed("MIG disabled" if any(g.mig_current == "Disabled" for g in reported) else
                      "MIG not supported by these GPUs")
    return passed("nvidia-smi reports no MIG mode (not supported by these GPUs)")
