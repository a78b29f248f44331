"""What steps hand to later steps, as typed values (StepPlan.outputs). Later steps read them through
`Earlier.outputs(step, Type)`; nothing reads another step's reason or notes."""

from __future__ import annotations

from dataclasses import dataclass

from gpunode.plan import Outputs


@dataclass(frozen=True, eq=False, repr=False)
class DriverOutputs(Outputs):
    version: str | None  # the driver version in place once the driver step has converged; None: none or unknown
    origin: str | None = None  # "--driver" | "--driver-run" (the version its file name carries) | "loaded"
    changes: bool = False  # the step installs, reinstalls or loads it: `version` is not what runs now
    # it unloads the loaded driver's modules (nvidia_uvm with them) and loads only nvidia, without a reboot
    reloads: bool = False


@dataclass(frozen=True, eq=False, repr=False)
class CompatOutputs(Outputs):
    driver: str | None  # the driver version checked; None: nothing to check
    verify_image: str | None = None  # the CUDA base image `verify` runs for that driver


@dataclass(frozen=True, eq=False, repr=False)
class ToolkitOutputs(Outputs):
    installs: bool  # the toolkit step installs or changes the toolkit packages
    version: str | None = None  # the version it installs; None: the current release, or nothing


@dataclass(frozen=True, eq=False, repr=False)
class RuntimeOutputs(Outputs):
    engines: tuple[str, ...] = ()  # the engines that have (or will have) the nvidia runtime
