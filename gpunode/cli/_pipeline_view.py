"""What plan and install show: a plan step by step (actions, diffs, fixes, notes), the live progress of an
install, and its recap. Node text goes through gpunode/ui.py's clean() and node_text(); fixes through the
`fixer` the CLI gives (gpunode/cli/_target.py), so each is runnable for the node as printed."""

from __future__ import annotations

from collections.abc import Iterable

from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text

from gpunode.facts import Facts
from gpunode.plan import Action, StepPlan
from gpunode.runner import RunReport
from gpunode.steps import NOT_BUILT
from gpunode.steps.base import Step
from gpunode.ui import STATUS_STYLE, Fixer, clean, describe_node, err, labelled, node_text, out


def _same(text: str) -> str:
    return text


def diff_text(diff: str, indent: int = 6) -> Text:
    """A unified diff, coloured line by line (the file's content is node text: cleaned, never markup)."""
    text = Text()
    for line in diff.splitlines():
        style = ("green" if line.startswith("+") and not line.startswith("+++") else
                 "red" if line.startswith("-") and not line.startswith("---") else
                 "cyan" if line.startswith("@@") else "bold" if line.startswith(("+++", "---")) else "")
        text.append(" " * indent + clean(line) + "\n", style=style)
    text.rstrip()
    return text


def action_lines(action: Action, as_root: bool) -> list[RenderableType]:
    """One action of a plan. Actions on this machine (downloads, checksums) are labelled so; only commands
    that run on the node are shown as `$ ` lines."""
    parts: list[RenderableType]
    if action.where == "control":
        parts = [Text.assemble("  • ", ("on this machine: ", "bold cyan"), (clean(action.summary), "bold"))]
    else:
        parts = [Text.assemble("  • ", (clean(action.summary), "bold"))]
    if action.where != "control":  # only what runs on the node is a `$ ` line
        for command in action.shown_commands(as_root):
            parts.append(node_text("      $ " + command, "dim"))
    for line in action.details():  # words, not commands: downloads, uploads, waits
        parts.append(node_text("      - " + line, "dim"))
    diff_of = getattr(action, "diff", None)  # file writes, and actions that predict a tool's edit
    if callable(diff_of):
        diff = diff_of()
        if diff:
            parts.append(diff_text(diff))
    return parts


def _step_table(report: RunReport, rows: Iterable[tuple[str, str, str]]) -> Table:
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    table.add_column("#", justify="right")
    table.add_column("step")
    table.add_column("status" if report.dry_run else "result")
    table.add_column("reason", overflow="fold")
    for index, (step, shown, reason) in enumerate(rows, 1):
        table.add_row(str(index), step, Text(shown, style=STATUS_STYLE.get(shown, "")), node_text(reason))
    return table


def render_plan(report: RunReport, console: Console | None = None, fixer: Fixer = _same,
                next_step: str | None = None) -> None:
    """`gpunode plan`: the node, one row per step, then each step's actions, diffs, fixes and notes."""
    console = console or out
    if report.facts is not None:
        console.print(Text(describe_node(report.host, report.facts), style="bold"))
    console.print(_step_table(report, ((o.step, "failed" if o.result == "failed" else o.plan.status.value,
                                        fixer(o.error or o.plan.reason)) for o in report.outcomes)))
    for outcome in report.outcomes:
        plan = outcome.plan
        if not plan.actions and not outcome.fix and not plan.notes:
            continue
        console.print(Text(f"\n{outcome.step}:", style="bold"))
        for action in plan.actions:
            for part in action_lines(action, report.as_root):
                console.print(part)
        if outcome.error and outcome.result == "failed":
            console.print(labelled("error:", node_text(fixer(outcome.error), "bold red"), indent=2))
        if outcome.fix:
            console.print(labelled("fix:", node_text(fixer(outcome.fix), "bold green"), indent=2))
        for note in plan.notes:
            console.print(labelled("note:", node_text(fixer(note), "dim"), indent=2))
    if report.error:
        console.print(labelled("error:", node_text(report.error)))
        if report.error_fix:
            console.print(labelled("fix:", node_text(fixer(report.error_fix), "bold green")))
    console.print(Text("\n" + summary_line(report), style="bold"))
    if next_step:
        console.print(labelled("next:", node_text(next_step, "bold green")))
    if NOT_BUILT:
        console.print(Text("not built yet: " + ", ".join(NOT_BUILT), style="dim"))


def summary_line(report: RunReport) -> str:
    """One line that says what the run did (install) or would do (plan), and what is left."""
    summary = report.to_dict()["summary"]
    assert isinstance(summary, dict)
    counts: dict[str, int] = summary["steps"]
    order = ("changed", "ok", "planned", "reboot-pending", "blocked", "failed", "interrupted", "unknown", "not-run")
    words = {"planned": "to change", "ok": "already ok", "not-run": "not run"}
    bits = ", ".join(f"{counts[k]} {words.get(k, k)}" for k in order if counts.get(k))
    if not report.outcomes:
        return "summary: no steps selected"
    line = f"summary: {bits}"
    state = summary["state"]
    if report.dry_run:
        line += {"ready": "; nothing to change", "changes-pending": "; nothing was changed (this is a plan)",
                 "blocked": "; blocked: fix the step marked blocked first",
                 "failed": "; a check failed: install would stop before changing anything"}.get(state, "")
        if report.reboot_pending:
            line += "; a reboot is required"
    else:
        ready = "; the node is ready" if report.ready else "; every step is done, but no NVIDIA driver is loaded"
        line += {"ready": ready, "reboot-pending": "; a reboot is required before it is ready",
                 "blocked": "; the node is NOT ready", "failed": "; the node is NOT ready",
                 "interrupted": "; interrupted (Ctrl-C): the node is NOT ready"}.get(state, "")
    if report.reboots:
        line += f"; rebooted {report.reboots}x"
    return line


def install_heading(report: RunReport) -> str:
    """`install finished` only when it did; a run stopped by a blocked or failed step says so, and one stopped
    by a blocked step before any step ran (the checks made before any change) says that nothing was changed."""
    if report.interrupted:
        return "install interrupted"
    if report.state not in ("blocked", "failed"):
        return "install finished"
    if all(o.result in ("not-run", "blocked") for o in report.outcomes):  # a blocked step runs nothing
        return "install stopped before changing anything"
    return "install stopped"


def render_install(report: RunReport, console: Console | None = None, fixer: Fixer = _same,
                   next_step: str | None = None) -> None:
    """The end of `gpunode install`: the steps were shown live as they ran (stderr), so this is the recap:
    what changed, what stopped the run and its fix, the backups made, whether the node is ready, what next."""
    console = console or out
    console.print(Text(f"{clean(report.host)}: {install_heading(report)}", style="bold"))
    changed = [o.step for o in report.outcomes if o.result == "changed"]
    unchanged = [o.step for o in report.outcomes if o.result == "ok"]
    if changed:
        console.print(labelled("changed:", ", ".join(changed)))
    if unchanged:
        console.print(labelled("already ok:", ", ".join(unchanged)))
    not_run: dict[str, list[str]] = {}  # one line per reason, not one per step (a stop leaves up to eight)
    for outcome in report.outcomes:
        if outcome.result == "not-run":
            reason = fixer(outcome.error or outcome.plan.reason)
            not_run.setdefault(reason.removeprefix("not run: "), []).append(outcome.step)
            continue
        if outcome.result in ("ok", "changed"):
            continue
        head = Text.assemble((outcome.result, STATUS_STYLE.get(outcome.result, "")), (f" {outcome.step}: ", "bold"),
                             clean(fixer(outcome.error or outcome.plan.reason)))
        console.print(head)
        if outcome.result in ("blocked", "failed", "interrupted") and outcome.fix:
            console.print(labelled("fix:", node_text(fixer(outcome.fix), "bold green"), indent=2))
    for reason, steps in not_run.items():
        console.print(Text.assemble(("not-run", STATUS_STYLE["not-run"]), (f" {', '.join(steps)}: ", "bold"),
                                    clean(reason)))
    for outcome in report.outcomes:
        for backup in outcome.backups:
            console.print(node_text("  " + backup, "dim"))
    if report.error:
        console.print(labelled("error:", node_text(report.error)))
        if report.error_fix:
            console.print(labelled("fix:", node_text(fixer(report.error_fix), "bold green")))
    console.print(Text(summary_line(report), style="bold"))
    if next_step:
        console.print(labelled("next:", node_text(next_step, "bold green")))


class ConsoleReporter:
    """Progress for humans on stderr, each step once: its plan when it comes up, then its actions."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or err

    def node(self, host: str, facts: Facts) -> None:
        self.console.print(Text(describe_node(host, facts), style="bold"))

    def planned(self, host: str, step: Step, plan: StepPlan) -> None:
        style = STATUS_STYLE.get(plan.status.value, "")
        self.console.print(Text.assemble(f"[{step.name}] ", (plan.status.value, style), " ", clean(plan.reason)))

    def action(self, host: str, step: Step, action: Action, state: str, detail: str = "") -> None:
        marks = {"start": "→", "done": "✓", "failed": "✗"}
        where = "on this machine: " if action.where == "control" else ""
        text = Text(f"  {marks.get(state, '·')} {where}{clean(action.summary)}")
        if detail:
            text.append(f" ({clean(detail)})", style="dim")
        self.console.print(text)

    def message(self, host: str, text: str) -> None:
        self.console.print(node_text(f"  {text}", "yellow"))
