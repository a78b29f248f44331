"""`gpunode uninstall`: undo what gpunode installed (gpunode/undo/), or show it with --dry-run."""

from __future__ import annotations

import dataclasses
import json
import shlex
from typing import TYPE_CHECKING, TextIO

import typer

from gpunode.cli._params import (
    LockTimeoutOpt,
    RebootOpt,
    RebootTimeoutOpt,
    UndoDryRunOpt,
    UndoOnlyOpt,
    UndoStopGpuServicesOpt,
    command,
    expected_errors,
)
from gpunode.options import Options
from gpunode.ui import STATUS_STYLE, clean, labelled, node_text, out, print_json

# the undo engine, the runner, the fleet and SSH are imported when uninstall runs: `gpunode uninstall --help`
# needs only its options
if TYPE_CHECKING:
    from gpunode.cli._target import Target
    from gpunode.fleet import HostResult, QueueReporter
    from gpunode.inventory import InventoryHost
    from gpunode.runner import RunReport
    from gpunode.undo.state import UndoRequest


@command(reach="rolling")
def uninstall(target: Target, argv: list[str], only: UndoOnlyOpt = None, dry_run: UndoDryRunOpt = False,
              reboot: RebootOpt = False, reboot_timeout: RebootTimeoutOpt = 900.0,
              lock_timeout: LockTimeoutOpt = 600.0, stop_gpu_services: UndoStopGpuServicesOpt = False) -> None:
    """Undo what gpunode installed, in reverse order, from the node's journal. Never removes what gpunode did not install.

    Files gpunode created are removed; files it replaced come back from their backups.

    A file changed since keeps the user's change and loses only gpunode's entries, or stays as it is.

    The packages and the driver gpunode installed are removed; the build prerequisites only with --only prerequisites.

    Several --host, or --inventory: every node is undone in parallel; one failing node does not stop the others.

    Exit 0 done (or nothing to undo), 1 failed or blocked, 3 a reboot is needed, 2 usage error, 130 interrupted.
    """
    from gpunode import cancel
    from gpunode.cli._inputs import seconds
    from gpunode.cli._pipeline_view import ConsoleReporter, render_plan
    from gpunode.cli._target import rewrite_fixes
    from gpunode.cli.pipeline import stopped_by, two_stage_interrupt
    from gpunode.undo import select
    from gpunode.undo.engine import uninstall as run_uninstall

    with expected_errors():
        request = select(only or [])
        options = Options(reboot=reboot, reboot_timeout=seconds(reboot_timeout, "--reboot-timeout"),
                          lock_timeout=seconds(lock_timeout, "--lock-timeout", zero_ok=True),
                          stop_gpu_services=stop_gpu_services)
        request = type(request)(request.steps, request.prerequisites, options.lock_timeout)
    words = ["gpunode", "uninstall", *[w for w in argv if w != "--dry-run"]]
    with expected_errors(target.fixer()):
        if target.fleet is not None:
            _uninstall_fleet(target, target.fleet, request, options, dry_run)
        with target.open() as conn:
            if dry_run:
                report = run_uninstall(conn, request, options, dry_run=True)
            else:
                reporter = None if target.json_output else ConsoleReporter()
                with two_stage_interrupt() as token, cancel.bind(token):
                    report = run_uninstall(conn, request, options, reporter,
                                            command="uninstall " + " ".join(request.steps))
                stopped_by(report, token)
    code = report.exit_code
    nothing = not report.outcomes
    if target.json_output:
        data = report.to_dict()
        summary = data["summary"]
        assert isinstance(summary, dict)
        summary["nothing_to_undo"] = nothing
        print_json(rewrite_fixes(data, target.fixer()))
    elif nothing:
        out.print(node_text(f"{report.host}: nothing to undo (the journal records no change gpunode has not undone)"))
    elif dry_run:
        render_plan(report, fixer=target.fixer(),
                    next_step=shlex.join(words) if report.state == "changes-pending" else None)
    else:
        _recap(report, target)
    raise typer.Exit(code)


def _recap(report: RunReport, target: Target) -> None:
    from rich.text import Text
    fixer = target.fixer()
    out.print(Text(f"{clean(report.host)}: uninstall {'interrupted' if report.interrupted else 'finished'}",
                   style="bold"))
    for o in report.outcomes:
        shown = {"changed": "undone", "ok": "nothing to undo"}.get(o.result, o.result)
        out.print(Text.assemble((f"{shown:>16} ", STATUS_STYLE.get(o.result, "")), (o.step, "bold"), ": ",
                                clean(fixer(o.error or o.plan.reason))))
        if o.result in ("blocked", "failed", "interrupted") and o.fix:
            out.print(labelled("fix:", node_text(fixer(o.fix), "bold green"), indent=2))
        for note in o.plan.notes:
            out.print(labelled("note:", node_text(fixer(note), "dim"), indent=2))
    out.print(Text(f"summary: {report.state}" + (f"; rebooted {report.reboots}x" if report.reboots else ""),
                   style="bold"))


def _uninstall_fleet(target: Target, hosts: list[InventoryHost], request: UndoRequest, options: Options,
                     dry_run: bool) -> None:
    """The fleet: each node's undo with the same engine, the same live view, summary and exit code as install;
    `--json`: one document with each node's report (and `nothing_to_undo`, and the fix of a node that could not
    start its undo, e.g. a corrupt journal)."""
    from rich.text import Text

    from gpunode.cli._fleet import fleet_exit_code, print_summary, run_with_view
    from gpunode.cli._target import rewrite_fixes
    from gpunode.errors import ConnectError, GpunodeError
    from gpunode.fleet import LoggedConnection, result_from_report
    from gpunode.runner import UNINSTALL_DRY_RUN, UNINSTALL_MODE
    from gpunode.undo.engine import uninstall as run_uninstall

    target.secrets()  # prompt before any worker starts
    options = dataclasses.replace(options, progress=None)
    fixes: dict[str, str | None] = {}

    def work(host: InventoryHost, reporter: QueueReporter, log: TextIO) -> HostResult:
        with LoggedConnection(target.open(host), log) as conn:
            try:
                report = run_uninstall(conn, request, options, reporter, dry_run=dry_run,
                                       command="uninstall " + " ".join(request.steps))
            except ConnectError:
                raise
            except GpunodeError as exc:  # before any step: the journal; the node fails alone, with the fix
                fixes[host.name] = exc.fix
                raise
        if getattr(log, "debug", False):  # the report holds file diffs (node file contents): debug level only
            log.write(json.dumps(rewrite_fixes(report.to_dict(), target.fixer(host)), indent=2) + "\n")
        result = result_from_report(host.name, report)
        if not report.outcomes:
            log.write("nothing to undo (the journal records no change gpunode has not undone)\n")
        return result

    def extra(result: HostResult) -> dict[str, object]:
        shown: dict[str, object] = {"nothing_to_undo": result.report is not None and not result.report.outcomes}
        if fixes.get(result.host):
            shown["fix"] = fixes[result.host]
        return shown

    mode = UNINSTALL_DRY_RUN if dry_run else UNINSTALL_MODE
    results, log_dir = run_with_view(hosts, [name for name in request.steps], work, target, read_only=dry_run)
    print_summary(mode, results, log_dir, target, hosts, extra)
    if not target.json_output:
        by_name = {h.name: h for h in hosts}
        for name, fix in fixes.items():
            if fix:
                out.print(Text.assemble((f"{clean(name)}: ", "bold red"), "could not start the uninstall"))
                out.print(labelled("fix:", node_text(target.fixer(by_name.get(name))(fix), "bold green"), indent=2))
    raise typer.Exit(fleet_exit_code(results))
