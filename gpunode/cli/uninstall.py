"""`gpunode uninstall`: undo what gpunode installed (gpunode/undo/), or show it with --dry-run."""

from __future__ import annotations

import shlex

import typer
from rich.text import Text

from gpunode import cancel
from gpunode.cli._inputs import seconds
from gpunode.cli._params import (
    DryRunOpt,
    LockTimeoutOpt,
    RebootOpt,
    RebootTimeoutOpt,
    StopGpuServicesOpt,
    UndoOnlyOpt,
    command,
    expected_errors,
)
from gpunode.cli._pipeline_view import ConsoleReporter, render_plan
from gpunode.cli._target import Target, rewrite_fixes
from gpunode.cli.pipeline import two_stage_interrupt
from gpunode.options import Options
from gpunode.runner import RunReport
from gpunode.ui import STATUS_STYLE, clean, labelled, node_text, out, print_json
from gpunode.undo import select
from gpunode.undo.engine import uninstall as run_uninstall


@command(reach="one")
def uninstall(target: Target, argv: list[str], only: UndoOnlyOpt = None, dry_run: DryRunOpt = False,
              reboot: RebootOpt = False, reboot_timeout: RebootTimeoutOpt = 900.0,
              lock_timeout: LockTimeoutOpt = 600.0, stop_gpu_services: StopGpuServicesOpt = False) -> None:
    """Undo what gpunode installed, in reverse order, from the node's journal. Never removes what gpunode did not install.

    Files gpunode created are removed, files it replaced come back from their backups (a file changed since keeps
    the user's change and loses only gpunode's entries, or stays), packages and the driver gpunode installed are
    removed. The build prerequisites are kept unless named with --only prerequisites. Exit 0 done (or nothing to
    undo), 1 failed or blocked, 3 a reboot is needed, 2 usage error, 130 interrupted.
    """
    with expected_errors():
        request = select(only or [])
        options = Options(reboot=reboot, reboot_timeout=seconds(reboot_timeout, "--reboot-timeout"),
                          lock_timeout=seconds(lock_timeout, "--lock-timeout", zero_ok=True),
                          stop_gpu_services=stop_gpu_services)
        request = type(request)(request.steps, request.prerequisites, options.lock_timeout)
    words = ["gpunode", "uninstall", *[w for w in argv if w != "--dry-run"]]
    with expected_errors(target.fixer()):
        with target.open() as conn:
            if dry_run:
                report = run_uninstall(conn, request, options, dry_run=True)
            else:
                reporter = None if target.json_output else ConsoleReporter()
                with two_stage_interrupt() as token, cancel.bind(token):
                    report = run_uninstall(conn, request, options, reporter,
                                            command="uninstall " + " ".join(request.steps))
    code = 3 if report.state == "reboot-pending" else report.exit_code
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
