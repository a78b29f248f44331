"""`gpunode plan` and `gpunode install`: the pipeline, previewed or applied."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Annotated, Any, TextIO

import typer

from gpunode import steps as pipeline
from gpunode import versions
from gpunode.artifacts.request import request as driver_request
from gpunode.cli._common import (
    AcceptNewOpt,
    AskBecomePassOpt,
    AskPassOpt,
    BatchOpt,
    ConnectTimeoutOpt,
    DriverOpt,
    HostsOpt,
    IdentityOpt,
    InventoryOpt,
    JsonOpt,
    KnownHostsOpt,
    LimitOpt,
    LogDirOpt,
    MaxFailOpt,
    OnlyOpt,
    ParallelOpt,
    Reach,
    SkipOpt,
    SshConfigOpt,
    expected_errors,
)
from gpunode.cli._fleet import fleet_exit_code, print_summary, run_with_view
from gpunode.cli.compat import CudaOpt, ImageOpt, check_cuda_option, check_image_option
from gpunode.cli.progress import rich_bars
from gpunode.errors import UsageError
from gpunode.fleet import HostResult, LoggedConnection, QueueReporter, result_from_report
from gpunode.inventory import InventoryHost
from gpunode.options import Options
from gpunode.runner import apply_pipeline, plan_pipeline
from gpunode.steps.base import Step
from gpunode.ui import ConsoleReporter, print_json, render_plan

DriverRunOpt = Annotated[str | None, typer.Option(
    "--driver-run", help="The NVIDIA .run installer to use instead of NVIDIA's download: a local file or a URL.",
    show_default=False)]
Sha256Opt = Annotated[str | None, typer.Option("--sha256", help="Expected sha256 of the .run; refused if different.",
                                               show_default=False)]
KernelModuleOpt = Annotated[str | None, typer.Option(
    "--kernel-module", help="open | proprietary. Default: chosen from the GPUs and the driver branch.",
    show_default=False)]
SigningKeyOpt = Annotated[str | None, typer.Option(
    "--module-signing-key", help="Secure Boot: private key (path on the node) the installer signs the module with.",
    show_default=False)]
SigningCertOpt = Annotated[str | None, typer.Option(
    "--module-signing-cert", help="Secure Boot: its certificate (path on the node), enrolled with mokutil.",
    show_default=False)]
CacheDirOpt = Annotated[str | None, typer.Option(
    "--cache-dir", help="Download cache. Default: $GPUNODE_CACHE_DIR or ~/.cache/gpunode/drivers.",
    show_default=False)]
LockTimeoutOpt = Annotated[float, typer.Option(
    "--lock-timeout", help="Seconds to wait for apt/dpkg or dnf locks held by another process (unattended-upgrades).")]
ToolkitVersionOpt = Annotated[str | None, typer.Option(
    "--toolkit-version", help="Pin the NVIDIA Container Toolkit (all four packages), e.g. 1.17.8 or 1.17.8-1. "
    "Default: keep an installed toolkit, else install the newest.", show_default=False)]
ToolkitPackageOpt = Annotated[list[Path] | None, typer.Option(
    "--toolkit-package", exists=True, dir_okay=False, readable=True, help="Offline: a toolkit .deb/.rpm file on "
    "this machine to upload and install instead of using NVIDIA's repository (repeatable).", show_default=False)]
SetAsDefaultOpt = Annotated[bool, typer.Option(
    "--set-as-default", help="Make nvidia the default runtime of every configured container engine.")]
K8sOpt = Annotated[bool, typer.Option(
    "--k8s", help="Kubernetes node: nvidia becomes the default runtime of containerd / CRI-O, and docker's own "
    "containerd is configured too.")]
EngineOpt = Annotated[list[str] | None, typer.Option(
    "--engine", help="Configure only this container engine: docker, containerd or crio (repeatable). "
    "Default: every engine found.", show_default=False)]

_TOOLKIT_VERSION = re.compile(r"^\d+\.\d+\.\d+(-[0-9A-Za-z.+~]+)?$")
ENGINE_NAMES = ("docker", "containerd", "crio", "cri-o")


def _container_options(options: Options, toolkit_version: str | None, toolkit_package: list[Path] | None,
                       set_as_default: bool, k8s: bool, engine: list[str] | None) -> Options:
    """Adds the toolkit / runtime choices (gpunode/steps/toolkit.py, runtime.py) to the options."""
    if toolkit_version is not None and not _TOOLKIT_VERSION.match(toolkit_version.strip()):
        raise UsageError(f"--toolkit-version {toolkit_version!r} is not a toolkit version",
                         fix="use a release number such as 1.17.8 or 1.17.8-1")
    for name in engine or []:
        if name.lower() not in ENGINE_NAMES:
            raise UsageError(f"--engine {name!r} is not an engine nvidia-ctk configures",
                             fix="choose docker, containerd or crio")
    return dataclasses.replace(options, toolkit_version=toolkit_version.strip() if toolkit_version else None,
                               toolkit_packages=tuple(str(p.resolve()) for p in toolkit_package or []),
                               set_as_default=set_as_default, k8s=k8s,
                               engines=tuple(e.lower() for e in engine or []))


def _options(driver: str | None, reboot: bool = False, reboot_timeout: float = 900.0, cuda: str | None = None,
             image: str | None = None, driver_run: str | None = None, sha256: str | None = None,
             kernel_module: str | None = None, module_signing_key: str | None = None,
             module_signing_cert: str | None = None, cache_dir: str | None = None,
             lock_timeout: float = 600.0) -> Options:
    version = versions.check_driver(driver)
    fields = driver_request(version, driver_run, sha256, kernel_module, module_signing_key, module_signing_cert,
                            cache_dir)
    return Options(reboot=reboot, reboot_timeout=reboot_timeout, cuda=check_cuda_option(cuda),
                   image=check_image_option(image), lock_timeout=lock_timeout, **fields)  # type: ignore[arg-type]


def plan(
    host: HostsOpt = None, identity: IdentityOpt = None, known_hosts: KnownHostsOpt = None,
    accept_new_host_key: AcceptNewOpt = False, ssh_config: SshConfigOpt = None, ask_pass: AskPassOpt = False,
    ask_become_pass: AskBecomePassOpt = False, connect_timeout: ConnectTimeoutOpt = 15.0,
    json_output: JsonOpt = False, only: OnlyOpt = None, skip: SkipOpt = None, driver: DriverOpt = None,
    cuda: CudaOpt = None, image: ImageOpt = None, driver_run: DriverRunOpt = None, sha256: Sha256Opt = None,
    kernel_module: KernelModuleOpt = None, module_signing_key: SigningKeyOpt = None,
    module_signing_cert: SigningCertOpt = None, cache_dir: CacheDirOpt = None, lock_timeout: LockTimeoutOpt = 600.0,
    toolkit_version: ToolkitVersionOpt = None, toolkit_package: ToolkitPackageOpt = None,
    set_as_default: SetAsDefaultOpt = False, k8s: K8sOpt = False, engine: EngineOpt = None,
    inventory: InventoryOpt = None, limit: LimitOpt = None, parallel: ParallelOpt = 8, batch: BatchOpt = None,
    max_fail: MaxFailOpt = None, log_dir: LogDirOpt = None,
) -> None:
    """Show what `install` would change, step by step, with exact commands and file diffs. Changes nothing."""
    _run("plan", dict(locals()))


def install(
    host: HostsOpt = None, identity: IdentityOpt = None, known_hosts: KnownHostsOpt = None,
    accept_new_host_key: AcceptNewOpt = False, ssh_config: SshConfigOpt = None, ask_pass: AskPassOpt = False,
    ask_become_pass: AskBecomePassOpt = False, connect_timeout: ConnectTimeoutOpt = 15.0,
    json_output: JsonOpt = False, only: OnlyOpt = None, skip: SkipOpt = None, driver: DriverOpt = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Same as `gpunode plan`: show, change nothing.")] = False,
    reboot: Annotated[bool, typer.Option("--reboot", help="Reboot the node when a step needs it, wait for it to come "
                                         "back (new boot id) and carry on.")] = False,
    reboot_timeout: Annotated[float, typer.Option("--reboot-timeout", help="Seconds to wait for a rebooted node.")]
    = 900.0,
    cuda: CudaOpt = None, image: ImageOpt = None, driver_run: DriverRunOpt = None, sha256: Sha256Opt = None,
    kernel_module: KernelModuleOpt = None, module_signing_key: SigningKeyOpt = None,
    module_signing_cert: SigningCertOpt = None, cache_dir: CacheDirOpt = None, lock_timeout: LockTimeoutOpt = 600.0,
    toolkit_version: ToolkitVersionOpt = None, toolkit_package: ToolkitPackageOpt = None,
    set_as_default: SetAsDefaultOpt = False, k8s: K8sOpt = False, engine: EngineOpt = None,
    inventory: InventoryOpt = None, limit: LimitOpt = None, parallel: ParallelOpt = 8, batch: BatchOpt = None,
    max_fail: MaxFailOpt = None, log_dir: LogDirOpt = None,
) -> None:
    """Apply the pipeline: each step is planned, applied, then planned again and must report `ok`."""
    args = dict(locals())
    _run("plan" if args.pop("dry_run") else "install", args)


def _run(mode: str, a: dict[str, Any]) -> None:
    """One implementation of plan and install, for one node or a fleet."""
    with expected_errors():
        options = _options(a["driver"], a.get("reboot", False), a.get("reboot_timeout", 900.0), cuda=a["cuda"],
                           image=a["image"], driver_run=a["driver_run"], sha256=a["sha256"],
                           kernel_module=a["kernel_module"], module_signing_key=a["module_signing_key"],
                           module_signing_cert=a["module_signing_cert"], cache_dir=a["cache_dir"],
                           lock_timeout=a["lock_timeout"])
        options = _container_options(options, a["toolkit_version"], a["toolkit_package"], a["set_as_default"],
                                     a["k8s"], a["engine"])
        selected = pipeline.select(a["only"] or [], a["skip"] or [])
        reach = Reach(list(a["host"] or []), list(a["identity"] or []), list(a["known_hosts"] or []),
                      a["accept_new_host_key"], a["ssh_config"], a["ask_pass"], a["ask_become_pass"],
                      a["connect_timeout"], a["inventory"], a["limit"])
        hosts = reach.targets()
        if hosts is not None:
            _run_fleet(mode, reach, hosts, selected, options, a)  # no progress bars: workers do not draw
            return
        options = dataclasses.replace(options, progress=rich_bars)
        with reach.open() as conn:
            if mode == "plan":
                report = plan_pipeline(conn, selected, options)
            else:
                report = apply_pipeline(conn, selected, options, None if a["json_output"] else ConsoleReporter())
        if a["json_output"]:
            print_json(report.to_dict())
        else:
            render_plan(report)
    raise typer.Exit(report.exit_code)


def _run_fleet(mode: str, reach: Reach, hosts: list[InventoryHost], selected: tuple[Step, ...], options: Options,
               a: dict[str, Any]) -> None:
    reach.secrets()  # prompt before any worker starts

    def work(host: InventoryHost, reporter: QueueReporter, log: TextIO) -> HostResult:
        with LoggedConnection(reach.open(host), log) as conn:
            if mode == "plan":
                report = plan_pipeline(conn, selected, options, reporter)
            else:
                report = apply_pipeline(conn, selected, options, reporter)
        log.write(json.dumps(report.to_dict(), indent=2) + "\n")
        return result_from_report(host.name, report)

    results, log_dir = run_with_view(hosts, [s.name for s in selected], work, a["parallel"], a["batch"],
                                     a["max_fail"], a["log_dir"])
    print_summary(mode, results, log_dir, a["json_output"])
    raise typer.Exit(fleet_exit_code(results))
