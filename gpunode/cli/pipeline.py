"""`gpunode plan` and `gpunode install`: the pipeline, previewed or applied."""

from __future__ import annotations

from typing import Annotated

import typer

from gpunode import steps as pipeline
from gpunode.cli._common import (
    AcceptNewOpt,
    AskBecomePassOpt,
    AskPassOpt,
    ConnectTimeoutOpt,
    DriverOpt,
    HostOpt,
    IdentityOpt,
    JsonOpt,
    KnownHostsOpt,
    OnlyOpt,
    SkipOpt,
    SshConfigOpt,
    check_driver_version,
    connect,
    expected_errors,
)
from gpunode.errors import NotBuiltError
from gpunode.options import Options
from gpunode.runner import apply_pipeline, plan_pipeline
from gpunode.ui import ConsoleReporter, print_json, render_plan


def _options(driver: str | None, reboot: bool = False, reboot_timeout: float = 900.0) -> Options:
    version = check_driver_version(driver)
    if version is not None and "driver" in pipeline.NOT_BUILT:
        raise NotBuiltError(f"--driver {version}: the driver step is not built yet",
                            fix="for now, install the driver by hand; `gpunode plan` shows what is built")
    return Options(driver=version, reboot=reboot, reboot_timeout=reboot_timeout)


def plan(
    host: HostOpt = None, identity: IdentityOpt = None, known_hosts: KnownHostsOpt = None,
    accept_new_host_key: AcceptNewOpt = False, ssh_config: SshConfigOpt = None, ask_pass: AskPassOpt = False,
    ask_become_pass: AskBecomePassOpt = False, connect_timeout: ConnectTimeoutOpt = 15.0,
    json_output: JsonOpt = False, only: OnlyOpt = None, skip: SkipOpt = None, driver: DriverOpt = None,
) -> None:
    """Show what `install` would change, step by step, with exact commands and file diffs. Changes nothing."""
    with expected_errors():
        options = _options(driver)
        selected = pipeline.select(only or [], skip or [])
        with connect(host, identity, known_hosts, accept_new_host_key, ssh_config, ask_pass, ask_become_pass,
                     connect_timeout) as conn:
            report = plan_pipeline(conn, selected, options)
        if json_output:
            print_json(report.to_dict())
        else:
            render_plan(report)
    raise typer.Exit(report.exit_code)


def install(
    host: HostOpt = None, identity: IdentityOpt = None, known_hosts: KnownHostsOpt = None,
    accept_new_host_key: AcceptNewOpt = False, ssh_config: SshConfigOpt = None, ask_pass: AskPassOpt = False,
    ask_become_pass: AskBecomePassOpt = False, connect_timeout: ConnectTimeoutOpt = 15.0,
    json_output: JsonOpt = False, only: OnlyOpt = None, skip: SkipOpt = None, driver: DriverOpt = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Same as `gpunode plan`: show, change nothing.")] = False,
    reboot: Annotated[bool, typer.Option("--reboot", help="Reboot the node when a step needs it, wait for it to come "
                                         "back (new boot id) and carry on.")] = False,
    reboot_timeout: Annotated[float, typer.Option("--reboot-timeout", help="Seconds to wait for a rebooted node.")]
    = 900.0,
) -> None:
    """Apply the pipeline: each step is planned, applied, then planned again and must report `ok`."""
    if dry_run:
        plan(host, identity, known_hosts, accept_new_host_key, ssh_config, ask_pass, ask_become_pass,
             connect_timeout, json_output, only, skip, driver)
        return
    with expected_errors():
        options = _options(driver, reboot, reboot_timeout)
        selected = pipeline.select(only or [], skip or [])
        with connect(host, identity, known_hosts, accept_new_host_key, ssh_config, ask_pass, ask_become_pass,
                     connect_timeout) as conn:
            report = apply_pipeline(conn, selected, options, None if json_output else ConsoleReporter())
        if json_output:
            print_json(report.to_dict())
        else:
            render_plan(report)
    raise typer.Exit(report.exit_code)
