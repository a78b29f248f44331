"""Everything a human sees. Results go to stdout (`out`), progress and errors to stderr (`err`).
Only the main thread calls into this module."""

from __future__ import annotations

import json
import os

from rich.console import Console
from rich.padding import Padding
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from gpunode.facts import Facts
from gpunode.plan import Action, StepPlan
from gpunode.runner import RunReport
from gpunode.steps import NOT_BUILT
from gpunode.steps.base import Step

_width = int(os.environ["GPUNODE_WIDTH"]) if os.environ.get("GPUNODE_WIDTH", "").isdigit() else None
out = Console(highlight=False, width=_width)
err = Console(stderr=True, highlight=False, width=_width)

STATUS_STYLE = {"ok": "green", "change": "yellow", "planned": "yellow", "changed": "cyan", "blocked": "red",
                "failed": "bold red", "unknown": "magenta", "reboot-pending": "yellow", "not-run": "dim"}


def print_json(data: object) -> None:
    """Machine output: plain JSON on stdout, never styled or wrapped."""
    print(json.dumps(data, indent=2, sort_keys=False))


def describe_node(host: str, facts: Facts) -> str:
    gpus = facts.gpus
    gpu_text = f"{len(gpus)} NVIDIA GPU{'s' if len(gpus) != 1 else ''}" if gpus else "no NVIDIA GPU"
    if gpus:
        ids = sorted({f"10de:{g.device_id}" for g in gpus})
        gpu_text += f" ({', '.join(ids)})"
    if facts.nvswitches:
        gpu_text += f", {len(facts.nvswitches)} NVSwitch"
    driver = f"driver {facts.loaded_driver.version} loaded" if facts.loaded_driver else "no NVIDIA driver loaded"
    sb = {True: "Secure Boot on", False: "Secure Boot off", None: "Secure Boot unknown"}[facts.secure_boot.enabled]
    return f"{host}: {facts.os}, kernel {facts.kernel} {facts.arch}; {gpu_text}; {driver}; {sb}"


def _action_lines(action: Action, as_root: bool) -> list[object]:
    parts: list[object] = [Text.assemble("  • ", (action.summary, "bold"))]
    for command in action.shown_commands(as_root):
        parts.append(Text("      $ " + command, style="dim"))
    where = " (on this machine)" if action.where == "control" else ""
    for line in action.details():  # words, not commands: downloads, uploads, waits
        parts.append(Text("      - " + line + where, style="dim"))
    diff_of = getattr(action, "diff", None)  # file writes, and actions that predict a tool's edit
    if callable(diff_of):
        diff = diff_of()
        if diff:
            parts.append(Padding(Syntax(diff, "diff", theme="ansi_dark", background_color="default"), (0, 0, 0, 6)))
    return parts


def render_plan(report: RunReport, console: Console | None = None) -> None:
    console = console or out
    if report.facts is not None and report.mode == "plan":
        console.print(Text(describe_node(report.host, report.facts), style="bold"))
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    table.add_column("#", justify="right")
    table.add_column("step")
    table.add_column("status")
    table.add_column("reason", overflow="fold")
    for index, outcome in enumerate(report.outcomes, 1):
        shown = outcome.result if report.mode == "install" else outcome.plan.status.value
        table.add_row(str(index), outcome.step, Text(shown, style=STATUS_STYLE.get(shown, "")),
                      Text(outcome.error or outcome.plan.reason))
    console.print(table)
    for outcome in report.outcomes:
        plan = outcome.plan
        if not plan.actions and not plan.fix and not plan.notes:
            continue
        console.print(Text(f"\n{outcome.step}:", style="bold"))
        for action in plan.actions:
            for part in _action_lines(action, report.as_root):
                console.print(part)
        if plan.fix:
            console.print(Text.assemble("  fix: ", (plan.fix, "bold")))
        for note in plan.notes:
            console.print(Text("  note: " + note, style="dim"))
        for backup in outcome.backups:
            console.print(Text("  " + backup, style="dim"))
    summary = report.to_dict()["summary"]
    assert isinstance(summary, dict)
    bits = [f"{summary[k]} {k}" for k in ("ok", "change", "blocked", "unknown") if summary[k]]
    line = "summary: " + (", ".join(bits) or "no steps selected")
    if report.reboot_pending:
        line += "; a reboot is required"
    console.print(Text("\n" + line, style="bold"))
    if NOT_BUILT:
        console.print(Text("not built yet: " + ", ".join(NOT_BUILT), style="dim"))


class ConsoleReporter:
    """Progress for humans on stderr."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or err

    def node(self, host: str, facts: Facts) -> None:
        self.console.print(Text(describe_node(host, facts), style="bold"))

    def planned(self, host: str, step: Step, plan: StepPlan) -> None:
        style = STATUS_STYLE.get(plan.status.value, "")
        self.console.print(Text.assemble(f"[{step.name}] ", (plan.status.value, style), f" {plan.reason}"))

    def action(self, host: str, step: Step, action: Action, state: str, detail: str = "") -> None:
        marks = {"start": "→", "done": "✓", "failed": "✗"}
        text = Text(f"  {marks.get(state, '·')} {action.summary}")
        if detail:
            text.append(f" ({detail})", style="dim")
        self.console.print(text)

    def message(self, host: str, text: str) -> None:
        self.console.print(Text(f"  {text}", style="yellow"))
