"""The doctor's building blocks: the result of a check, the registry, and `Node`, the facts with everything
the checks derive from them computed once.

Why a derived view: a dozen checks need the same parsed things (the driver state, the packages, the units, the
kernel log's findings). Parsing them once keeps every check a short pure function of the facts, and keeps two
checks from disagreeing about what the node is.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

from gpunode import gpus as gpu_table
from gpunode.explain import Finding, explain
from gpunode.facts import Facts
from gpunode.facts import containers as container_facts
from gpunode.facts import driver as driver_facts
from gpunode.facts import health as health_facts
from gpunode.facts import packages as package_facts
from gpunode.facts import system as system_facts
from gpunode.facts.containers import EngineSurvey, survey_engines
from gpunode.facts.driver import DriverState, SmiGpu, driver_state
from gpunode.facts.health import KernelLog, Kernels
from gpunode.facts.packages import Package, UnitState
from gpunode.record import Frozen

STATUSES = ("pass", "warn", "fail", "skip")
LAYERS = ("hardware", "boot", "kernel", "driver", "cuda", "container", "fabric", "health", "packages")


@dataclass(frozen=True, eq=False, repr=False)
class CheckResult(Frozen):
    id: str  # stable: scripts match on it
    layer: str  # one of LAYERS
    title: str
    status: str  # pass | warn | fail | skip
    evidence: str  # what the check saw (or, for skip, why it could not look)
    fix: str | None = None  # the exact gpunode or shell command, for warn and fail
    reboot: bool = False  # a reboot (or GPU reset) is what clears this finding: the readiness verdict's marker

    def to_dict(self) -> dict[str, object]:
        return {"id": self.id, "layer": self.layer, "title": self.title, "status": self.status,
                "evidence": self.evidence, "fix": self.fix, "reboot": self.reboot}


class Verdict(NamedTuple):
    status: str
    evidence: str
    fix: str | None = None
    reboot: bool = False


def passed(evidence: str) -> Verdict:
    return Verdict("pass", evidence)


def warned(evidence: str, fix: str, reboot: bool = False) -> Verdict:
    return Verdict("warn", evidence, fix, reboot)


def failed(evidence: str, fix: str, reboot: bool = False) -> Verdict:
    return Verdict("fail", evidence, fix, reboot)


def skipped(reason: str) -> Verdict:
    return Verdict("skip", reason)


NO_GPU = skipped("no NVIDIA GPU")


@dataclass(frozen=True, eq=False, repr=False)
class Check(Frozen):
    id: str
    layer: str
    title: str
    fn: Callable[[Node], Verdict]

    def __call__(self, node: Node) -> CheckResult:
        try:
            verdict = self.fn(node)
        except Exception as exc:  # noqa: BLE001 - one check's bug must not hide the other checks
            where = traceback.extract_tb(exc.__traceback__)[-1]
            verdict = skipped(f"gpunode could not evaluate this check ({type(exc).__name__}: {exc} at "
                              f"{where.filename.rsplit('/', 1)[-1]}:{where.lineno}); please report it")
        return CheckResult(self.id, self.layer, self.title, verdict.status, verdict.evidence, verdict.fix,
                           verdict.reboot)


CHECKS: list[Check] = []


def check(check_id: str, layer: str, title: str) -> Callable[[Callable[[Node], Verdict]], Check]:
    """Register a check. Ids are unique; the layer decides where the check is shown."""
    assert layer in LAYERS, layer

    def register(fn: Callable[[Node], Verdict]) -> Check:
        assert all(c.id != check_id for c in CHECKS), f"duplicate check id {check_id}"
        made = Check(check_id, layer, title, fn)
        CHECKS.append(made)
        return made

    return register


# ---- the derived view ------------------------------------------------------------------------------------


class Node:
    """The facts, plus what the checks derive from them. Pure: built from the facts alone."""

    def __init__(self, facts: Facts) -> None:
        self.facts = facts

    @property
    def has_gpu(self) -> bool:
        return bool(self.facts.gpus)

    @cached_property
    def driver(self) -> DriverState:
        return driver_state(self.facts)

    @property
    def driver_on_disk(self) -> bool:
        """A driver is installed (packages, the .run's record, its libraries or its module), GPU or not: the checks
        about the software itself (its source, its module for each kernel, its branch) have something to say."""
        state = self.driver
        return bool(state.packages or state.installer or state.installed or state.module)

    @cached_property
    def driver_version(self) -> str | None:
        """The driver that drives the GPUs: the loaded module, else the module the running kernel would load, else
        the installed user space."""
        if self.facts.loaded_driver:
            return self.facts.loaded_driver.version
        return self.driver.module or self.driver.installed

    @cached_property
    def smi_gpus(self) -> tuple[SmiGpu, ...]:
        """GPUs as nvidia-smi -q reports them; empty when the driver is not loaded or nvidia-smi fails."""
        return self.facts[driver_facts.GPUS]

    @cached_property
    def packages(self) -> dict[str, Package]:
        return self.facts[package_facts.PKG_STATUS]

    @cached_property
    def units(self) -> dict[str, UnitState]:
        found = dict(self.facts[package_facts.UNITS])
        found.update(self.facts[package_facts.DOCTOR_UNITS])
        return found

    @cached_property
    def survey(self) -> EngineSurvey:
        return survey_engines(self.facts.tools, {n: u.exists for n, u in self.units.items()}, self.facts.files)

    @cached_property
    def kernel_log(self) -> KernelLog | None:
        return self.facts[health_facts.KERNEL_LOG]

    @cached_property
    def kernel_findings(self) -> list[Finding]:
        return explain(self.kernel_log.text) if self.kernel_log and self.kernel_log.text.strip() else []

    @cached_property
    def kernels(self) -> Kernels:
        return self.facts[health_facts.KERNELS]

    @cached_property
    def engines(self) -> dict[str, tuple[int, ...]]:
        return self.facts[container_facts.ENGINE_VERSIONS]

    @cached_property
    def today(self) -> str | None:
        return self.facts[system_facts.DATE]

    def gpu_label(self, device: int) -> str:
        """"Tesla T4 (Turing)", or the PCI id and its generation for a GPU missing from gpunode's table."""
        gpu = gpu_table.lookup_id(device)
        if gpu is not None:
            return f"{gpu.name} ({gpu.architecture})"
        return f"10de:{device:04x} ({gpu_table.generation_for_id(device)[0]})"

    def gpu_list(self) -> str:
        counts: dict[str, int] = {}
        for g in self.facts.gpus:
            label = self.gpu_label(g.device)
            counts[label] = counts.get(label, 0) + 1
        return ", ".join(f"{n} x {label}" if n > 1 else label for label, n in counts.items())
