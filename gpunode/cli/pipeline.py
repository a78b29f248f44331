"""`gpunode plan` and `gpunode install`: the pipeline, previewed or applied."""

from __future__ import annotations

import dataclasses
import importlib
import json
import shlex
import sys
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, TextIO

import typer

from gpunode.cli._params import DryRunOpt, ProgressFormatOpt, command, expected_errors
from gpunode.errors import UsageError

if TYPE_CHECKING:
    from gpunode import cancel
    from gpunode.cli._inputs import Checked
    from gpunode.cli._target import Target
    from gpunode.cli.events import JsonlReporter
    from gpunode.connection.base import Connection
    from gpunode.firstcommand import FirstCommand
    from gpunode.fleet import HostResult, QueueReporter
    from gpunode.inventory import InventoryHost
    from gpunode.options import Options
    from gpunode.runner import RunReport
    from gpunode.steps.base import Step

# What a run uses is imported when it runs, so that `gpunode plan --help` loads neither the pipeline nor the facts
# nor SSH. These stay attributes of this module (tests replace them), read through `_late`.
_LATE = {"ConsoleReporter": "gpunode.cli._pipeline_view", "apply_pipeline": "gpunode.runner",
         "plan_pipeline": "gpunode.runner"}


def __getattr__(name: str) -> Any:
    if name not in _LATE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LATE[name]), name)
    globals()[name] = value
    return value


def _late(name: str) -> Any:
    return getattr(sys.modules[__name__], name)


@command(reach="rolling", pipeline=True)
def plan(target: Target, request: Checked, argv: list[str], progress: ProgressFormatOpt = "human") -> None:
    """Show what `install` would change, step by step, with exact commands and file diffs. Changes nothing."""
    _run("plan", target, request, argv, progress)


@command(reach="rolling", pipeline=True, reboot=True)
def install(target: Target, request: Checked, argv: list[str], dry_run: DryRunOpt = False,
            progress: ProgressFormatOpt = "human") -> None:
    """Apply the pipeline: each step is planned, applied, then planned again and must report `ok`."""
    _run("plan" if dry_run else "install", target, request, [w for w in argv if w != "--dry-run"], progress)


def _check_progress(progress: str, target: Target) -> None:
    """--progress: its usage errors (exit 2), before anything connects."""
    if progress == "human":  # the default: the event writer stays unloaded
        return
    from gpunode.cli.events import FORMATS

    with expected_errors():
        if progress not in FORMATS:
            raise UsageError(f"--progress {progress!r} is not one of {', '.join(FORMATS)}",
                             fix="use --progress jsonl (events on stdout) or leave it out")
        if target.json_output:
            raise UsageError("--json and --progress jsonl both write stdout", fix="drop --json: the run_end event "
                             "carries the final state and exit code")
        if target.fleet is not None:
            raise UsageError("--progress jsonl describes one node", fix="run gpunode with --local on each node (a "
                             "DaemonSet, docs/engines.md), or drop --progress for the fleet view")


def _events(progress: str, mode: str, target: Target, steps: tuple[Step, ...]) -> JsonlReporter | None:
    """--progress (checked by _check_progress): None for human output, else the event writer (docs/engines.md)."""
    if progress == "human":
        return None
    from gpunode.cli.events import JsonlReporter

    return JsonlReporter(mode, steps, target.fixer())


def _first_command(mode: str, request: Checked, conn: Connection) -> AbstractContextManager[FirstCommand | None]:
    """An install's first command (the node's lock and the RUN probe, gpunode/firstcommand.py), sent as soon as the
    login is done: the steps, the runner and the output load while the node works, and the runner reads the answer.
    A plan sends nothing ahead."""
    if mode != "install":
        return nullcontext()
    from gpunode.firstcommand import install_command, sent_ahead

    return sent_ahead(conn, install_command(request.step_names))


def next_step(mode: str, report: RunReport, target: Target, argv: list[str]) -> str | None:
    """What to run after this run, for this node, runnable as printed."""
    state = report.state
    if mode == "plan":
        if state == "changes-pending":
            return shlex.join(["gpunode", "install", *argv])
        return None
    if state == "ready":
        if not report.ready:
            return target.command("doctor") + "  # says which driver suits the GPUs"
        return target.command("verify") + "  # containers see the GPUs"
    if state == "reboot-pending":
        again = shlex.join(["gpunode", "install", *argv, *([] if "--reboot" in argv else ["--reboot"])])
        return again + "  # or reboot the node yourself, then run the same install again"
    return None


def _run(mode: str, target: Target, request: Checked, argv: list[str], progress: str = "human") -> None:
    """One implementation of plan and install, for one node or a fleet. Every option was checked already (--progress
    here, first). One node over SSH is connected to ahead (gpunode/connection/ssh.py connect_ahead): the steps,
    the facts and the output are loaded while the network and the node log in."""
    _check_progress(progress, target)
    with expected_errors(target.fixer()):
        if target.fleet is not None:
            _run_fleet(mode, target, target.fleet, request.steps, request.options)
        with target.open(ahead=True) as conn, _first_command(mode, request, conn) as first:
            from gpunode import cancel
            from gpunode.cli._pipeline_view import render_install, render_plan
            from gpunode.runner import RunInterrupted

            steps = request.steps  # the pipeline is loaded here
            events = _events(progress, mode, target, steps)
            # stdout holds events only: no progress bars, the recap goes to stderr
            options = request.options if events is None else dataclasses.replace(request.options, progress=None)
            if mode == "plan":
                conn.wait_connected()  # a failed login is reported as it always was, before any step
                report = _late("plan_pipeline")(conn, steps, options, events, check_artifacts=True)
            else:
                reporter = events or (None if target.json_output else _late("ConsoleReporter")())
                conn.wait_connected()
                with two_stage_interrupt() as token, cancel.bind(token):
                    try:
                        report = _late("apply_pipeline")(conn, steps, options, reporter, first=first)
                    except RunInterrupted as stopped:
                        report = stopped.report
                stopped_by(report, token)
    from gpunode.cli._target import rewrite_fixes
    from gpunode.ui import err, print_json

    follow = next_step(mode, report, target, argv)
    if events is not None:
        events.finish(report, follow)
        (render_plan if mode == "plan" else render_install)(report, console=err, fixer=target.fixer(),
                                                             next_step=follow)
    elif target.json_output:
        data = report.to_dict()
        summary = data["summary"]
        assert isinstance(summary, dict)
        summary["next"] = follow
        print_json(rewrite_fixes(data, target.fixer()))
    elif mode == "plan":
        render_plan(report, fixer=target.fixer(), next_step=follow)
    else:
        render_install(report, fixer=target.fixer(), next_step=follow)
    raise typer.Exit(report.exit_code)


def _run_fleet(mode: str, target: Target, hosts: list[InventoryHost], selected: tuple[Step, ...],
               options: Options) -> None:
    from gpunode.cli._fleet import fleet_exit_code, print_summary, run_with_view
    from gpunode.cli._target import rewrite_fixes
    from gpunode.fleet import HostResult, LoggedConnection, result_from_report
    from gpunode.runner import RunInterrupted

    target.secrets()  # prompt before any worker starts
    options = dataclasses.replace(options, progress=None)

    def work(host: InventoryHost, reporter: QueueReporter, log: TextIO) -> HostResult:
        interrupted: RunInterrupted | None = None
        with LoggedConnection(target.open(host), log) as conn:
            if mode == "plan":
                report = _late("plan_pipeline")(conn, selected, options, reporter, check_artifacts=True)
            else:
                try:
                    report = _late("apply_pipeline")(conn, selected, options, reporter)
                except RunInterrupted as stopped:
                    interrupted, report = stopped, stopped.report
        if getattr(log, "debug", False):  # the report holds file diffs (node file contents): debug level only
            log.write(json.dumps(rewrite_fixes(report.to_dict(), target.fixer(host)), indent=2) + "\n")
            if report.traceback:
                log.write(report.traceback)
        if interrupted is not None:
            log.write(f"interrupted: {interrupted.message}\n")
            return HostResult(host.name, "interrupted", sum(1 for o in report.outcomes if o.result == "changed"),
                              report.reboot_pending, interrupted.message, report)
        return result_from_report(host.name, report)

    results, log_dir = run_with_view(hosts, [s.name for s in selected], work, target, read_only=mode == "plan")
    print_summary(mode, results, log_dir, target, hosts)
    raise typer.Exit(fleet_exit_code(results))


def two_stage_interrupt() -> AbstractContextManager[cancel.CancelToken]:
    """Ctrl-C or SIGTERM on a single-node install or uninstall (gpunode/cancel.py `signals`): the first asks the
    run to stop at the next safe point (a running command finishes), the second stops at once. The exit code is
    130 for Ctrl-C, 143 for SIGTERM (`stopped_by`)."""
    from gpunode import cancel
    from gpunode.ui import err, node_text

    return cancel.signals(lambda text: err.print(node_text(f"interrupted: {text}", "bold yellow")))


def stopped_by(report: RunReport, token: cancel.CancelToken) -> None:
    """An interrupted run exits with the code of the signal that stopped it (143 for SIGTERM)."""
    from gpunode import cancel

    if report.interrupted:
        report.interrupted_exit = cancel.exit_code(token)
