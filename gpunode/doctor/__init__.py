"""Read-only diagnosis of a node: checks with stable ids, a status, the evidence seen and the exact fix.

Every check is a pure function of the facts gathered by the one batched probe (gpunode/facts/). A check
whose precondition is missing says `skip` with the reason, never a cascade of failures. One module per layer:

    hardware   hardware.py   GPU present, vGPU instance, MIG mode
    hardware   virt.py       GPU BARs placed and BAR1 as large as offered (in a VM: the hypervisor's fix), IOMMU
                             and interrupt remapping on a passthrough host, driver flavour vs vGPU/passthrough
    boot       kernel.py     Secure Boot
    kernel     kernel.py     nouveau (loaded, blacklisted, initramfs), headers, module for the newest kernel
    driver     driver.py     loaded, one source, mismatch, nvidia-smi, persistence, branch vs GPU, flavour, EOL
    cuda       driver.py     an installed CUDA toolkit vs the driver
    container  container.py  engine, toolkit, docker/containerd/CRI-O configuration, defaults, snap, rootless,
                             /dev/char, CDI
    container  k8s.py        Kubernetes: kubelet's runtime, device plugin, allocatable GPUs, MPS/MIG units
    fabric     fabric.py     fabric manager on NVSwitch systems
    health     health.py     Xid and driver errors in the kernel log
    packages   health.py     automatic upgrades and NVIDIA packages
"""

from __future__ import annotations

from collections.abc import Sequence

from gpunode import __version__
from gpunode.doctor import (  # noqa: F401 - registers checks
    container,
    driver,
    fabric,
    gpuhealth,
    hardware,
    health,
    k8s,
    kernel,
    virt,
)
from gpunode.doctor.base import CHECKS, LAYERS, STATUSES, CheckResult, Node
from gpunode.facts import Facts

__all__ = ["CHECKS", "LAYERS", "STATUSES", "CheckResult", "exit_code", "report", "run_checks", "summary"]


def run_checks(facts: Facts) -> list[CheckResult]:
    """Every check against one node's facts, grouped by layer in LAYERS order."""
    node = Node(facts)
    ordered = sorted(CHECKS, key=lambda c: LAYERS.index(c.layer))
    return [c(node) for c in ordered]


def exit_code(results: Sequence[CheckResult]) -> int:
    """0 when nothing failed (warnings and skips included), 1 when any check failed."""
    return 1 if any(r.status == "fail" for r in results) else 0


def summary(results: Sequence[CheckResult]) -> dict[str, int]:
    return {status: sum(1 for r in results if r.status == status) for status in STATUSES}


def report(host: str, facts: Facts, results: Sequence[CheckResult], schema_version: int) -> dict[str, object]:
    """The `doctor --json` document (README: "doctor --json schema")."""
    return {
        "schema_version": schema_version,
        "gpunode_version": __version__,
        "host": host,
        "node": facts.summary(),
        "checks": [r.to_dict() for r in results],
        "summary": summary(results),
        "failures": [r.id for r in results if r.status == "fail"],
        "warnings": [r.id for r in results if r.status == "warn"],
        "exit_code": exit_code(results),
        "error": None,
    }
