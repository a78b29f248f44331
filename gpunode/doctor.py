"""Read-only diagnosis of a node: checks with stable ids, a status, the evidence seen and the exact fix.

Every check is a pure function of the facts. A check whose precondition is missing says `skip`, never a
cascade of failures.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpunode.facts import Facts
from gpunode.steps import nouveau


@dataclass(frozen=True)
class CheckResult:
    id: str
    layer: str
    title: str
    status: str  # pass | warn | fail | skip
    evidence: str
    fix: str | None = None

    def to_dict(self) -> dict[str, object]:
        return {"id": self.id, "layer": self.layer, "title": self.title, "status": self.status,
                "evidence": self.evidence, "fix": self.fix}


CheckFn = Callable[[Facts], CheckResult]
CHECKS: list[CheckFn] = []


def check(fn: CheckFn) -> CheckFn:
    CHECKS.append(fn)
    return fn


def _gpu_ids(facts: Facts) -> str:
    return ", ".join(f"{g.address} 10de:{g.device_id}" for g in facts.gpus)


@check
def gpu_present(facts: Facts) -> CheckResult:
    args = ("hw.gpu-present", "hardware", "NVIDIA GPU present (PCI)")
    if facts.gpus:
        return CheckResult(*args, "pass", f"{len(facts.gpus)} NVIDIA GPU(s): {_gpu_ids(facts)}")
    return CheckResult(*args, "fail", "no NVIDIA GPU was found: no PCI display device with vendor 0x10de",
                       "run gpunode on a node with an NVIDIA GPU (on a VM, check the GPU is attached/passed through)")


@check
def nouveau_loaded(facts: Facts) -> CheckResult:
    args = ("kernel.nouveau-loaded", "kernel", "nouveau not loaded")
    if not facts.gpus:
        return CheckResult(*args, "skip", "no NVIDIA GPU")
    if facts.module_loaded("nouveau"):
        return CheckResult(*args, "fail", "nouveau is in /proc/modules: it owns the GPU and blocks the NVIDIA driver",
                           "gpunode install --only nouveau --reboot")
    return CheckResult(*args, "pass", "nouveau is not loaded")


@check
def nouveau_blacklisted(facts: Facts) -> CheckResult:
    args = ("kernel.nouveau-blacklisted", "kernel", "nouveau blacklisted")
    if not facts.gpus:
        return CheckResult(*args, "skip", "no NVIDIA GPU")
    block = facts.nouveau_block()
    if block.effective:
        return CheckResult(*args, "pass", "; ".join(block.sources))
    seen = "; ".join(block.sources) or "no modprobe.d file or kernel argument blocks nouveau"
    return CheckResult(*args, "warn" if facts.loaded_driver else "fail", seen,
                       f"gpunode install --only nouveau (writes {nouveau.PATH} and rebuilds the initramfs)")


@check
def secure_boot(facts: Facts) -> CheckResult:
    args = ("boot.secure-boot", "boot", "Secure Boot")
    sb = facts.secure_boot
    if sb.enabled:
        return CheckResult(*args, "warn", f"Secure Boot is enabled ({sb.evidence}): the NVIDIA kernel modules must "
                           "be signed with a key enrolled in MOK",
                           "pass --module-signing-key/--module-signing-cert, or disable Secure Boot in firmware")
    if sb.enabled is None:
        return CheckResult(*args, "warn", sb.evidence or "could not read the Secure Boot state",
                           "install mokutil, or check the firmware settings")
    return CheckResult(*args, "pass", sb.evidence or "Secure Boot is off")


@check
def driver_loaded(facts: Facts) -> CheckResult:
    args = ("driver.loaded", "driver", "NVIDIA kernel module loaded")
    if not facts.gpus:
        return CheckResult(*args, "skip", "no NVIDIA GPU")
    if facts.loaded_driver:
        d = facts.loaded_driver
        return CheckResult(*args, "pass", f"/proc/driver/nvidia/version: {d.version} ({d.flavour} kernel module)")
    return CheckResult(*args, "fail", "/proc/driver/nvidia/version does not exist: the nvidia module is not loaded",
                       "gpunode install --driver VERSION")


def run_checks(facts: Facts) -> list[CheckResult]:
    return [fn(facts) for fn in CHECKS]


def exit_code(results: list[CheckResult]) -> int:
    return 1 if any(r.status == "fail" for r in results) else 0
