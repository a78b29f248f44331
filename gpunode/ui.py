"""Everything a human sees. Results go to stdout (`out`), progress and errors to stderr (`err`).
Only the main thread calls into this module.

Node text is untrusted: os-release, logs, journal lines and command output may hold escape sequences or
`[brackets]`. Both consoles therefore never parse markup (styles come from `Text` objects only), and every
character written passes through `clean()`: control characters other than newline are shown as `\\xNN`, so
nothing a node sends can move the cursor, retitle the terminal or hide text. On a pipe nothing is wrapped.
"""

from __future__ import annotations

import json
import os
import re
import sys
import unicodedata
from collections.abc import Callable, Iterable
from typing import IO

from rich.console import Console, ConsoleDimensions, RenderableType
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from gpunode.facts import Facts
from gpunode.plan import Action, StepPlan
from gpunode.runner import RunReport
from gpunode.steps import NOT_BUILT
from gpunode.steps.base import Step

BROKEN_PIPE_EXIT = 141  # what a shell reports for a program stopped by SIGPIPE (`gpunode doctor | head`)
NO_WRAP_WIDTH = 4000  # the width of a pipe or file: long lines, URLs and commands are never wrapped

STATUS_STYLE = {"ok": "green", "change": "yellow", "planned": "yellow", "changed": "cyan", "blocked": "red",
                "failed": "bold red", "unknown": "magenta", "reboot-pending": "yellow", "not-run": "dim"}

# Bidirectional overrides and isolates reorder what the reader sees; they are shown escaped like controls.
_BIDI = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f")


def _escape_char(ch: str) -> str:
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _unsafe(ch: str) -> bool:
    return ch != "\n" and (unicodedata.category(ch) in ("Cc", "Cs") or ch in _BIDI)


def clean(text: object) -> str:
    """Node-provided text made safe for a terminal: CRLF becomes a newline, a tab four spaces, and every
    other control character (ESC, BEL, CR, C1 codes, bidi overrides, lone surrogates) a visible \\xNN."""
    value = str(text).replace("\r\n", "\n").replace("\t", "    ")
    if not any(_unsafe(ch) for ch in value):
        return value
    return "".join(_escape_char(ch) if _unsafe(ch) else ch for ch in value)


def node_text(text: object, style: str = "") -> Text:
    """A Text of untrusted text: cleaned, never parsed as markup."""
    return Text(clean(text), style=style)


class SafeConsole(Console):
    """A rich Console for gpunode: no markup, no highlighting, every character cleaned on its way out, no
    wrapping on a pipe, and a reader that goes away (`| head`) ends the program quietly."""

    def __init__(self, *, stderr: bool = False, file: IO[str] | None = None, force_terminal: bool | None = None,
                 width: int | None = None) -> None:
        fixed = os.environ.get("GPUNODE_WIDTH", "")
        super().__init__(stderr=stderr, file=file, force_terminal=force_terminal, highlight=False, markup=False,
                         emoji=False, width=width or (int(fixed) if fixed.isdigit() else None))

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        if self._width is None and not self.is_terminal:
            return ConsoleDimensions(NO_WRAP_WIDTH, size.height)
        return size

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        self._width, self._height = new_size

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        safe = (segment if segment.control else Segment(clean(segment.text), segment.style)
                for segment in buffer)
        rendered = super()._render_buffer(safe)
        return rendered if self.is_terminal else re.sub(r"[ \t]+\n", "\n", rendered)

    def on_broken_pipe(self) -> None:
        broken_pipe()


def broken_pipe() -> None:
    """The reader of stdout went away: stop quietly, without the 'Exception ignored' noise at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    raise SystemExit(BROKEN_PIPE_EXIT)


out = SafeConsole()
err = SafeConsole(stderr=True)


def print_json(data: object) -> None:
    """Machine output: plain JSON on stdout, never styled or wrapped (json escapes control characters)."""
    try:
        print(json.dumps(data, indent=2, sort_keys=False), flush=True)
    except BrokenPipeError:
        broken_pipe()


Fixer = Callable[[str], str]


def _same(text: str) -> str:
    return text


def labelled(label: str, text: str | Text, style: str = "bold", indent: int = 0) -> Table:
    """`label text` where the text's continuation lines stay under its first line, not under the label."""
    grid = Table.grid(padding=(0, 1, 0, 0))
    grid.add_column(no_wrap=True)
    grid.add_column(overflow="fold")
    body = text if isinstance(text, Text) else node_text(text, style)
    grid.add_row(Text(" " * indent + label, style="bold"), body)
    return grid


def print_error(message: str, fix: str | None = None, console: Console | None = None) -> None:
    """`error: ...` and `fix: ...` on stderr."""
    console = console or err
    console.print(labelled("error:", node_text(message)))
    if fix:
        console.print(labelled("fix:", node_text(fix, "bold green"), indent=2))


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
    return clean(f"{host}: {facts.os}, kernel {facts.kernel} {facts.arch}; {gpu_text}; {driver}; {sb}")


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
    where = action.to_dict().get("where", "node")
    if where == "control":
        return [Text.assemble("  • ", ("on this machine: ", "bold cyan"), (clean(action.summary), "bold"))]
    parts: list[RenderableType] = [Text.assemble("  • ", (clean(action.summary), "bold"))]
    for command in action.shown_commands(as_root):
        parts.append(node_text("      $ " + command, "dim"))
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
    table.add_column("status" if report.mode == "plan" else "result")
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
    console.print(_step_table(report, ((o.step, o.plan.status.value, fixer(o.error or o.plan.reason))
                                       for o in report.outcomes)))
    for outcome in report.outcomes:
        plan = outcome.plan
        if not plan.actions and not plan.fix and not plan.notes:
            continue
        console.print(Text(f"\n{outcome.step}:", style="bold"))
        for action in plan.actions:
            for part in action_lines(action, report.as_root):
                console.print(part)
        if plan.fix:
            console.print(labelled("fix:", node_text(fixer(plan.fix), "bold green"), indent=2))
        for note in plan.notes:
            console.print(labelled("note:", node_text(fixer(note), "dim"), indent=2))
    summary = report.to_dict()["summary"]
    assert isinstance(summary, dict)
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
    order = ("changed", "ok", "planned", "reboot-pending", "blocked", "failed", "unknown", "not-run")
    words = {"planned": "to change", "ok": "already ok", "not-run": "not run"}
    bits = ", ".join(f"{counts[k]} {words.get(k, k)}" for k in order if counts.get(k))
    if not report.outcomes:
        return "summary: no steps selected"
    line = f"summary: {bits}"
    state = summary["state"]
    if report.mode == "plan":
        line += {"ready": "; nothing to change", "changes-pending": "; nothing was changed (this is a plan)",
                 "blocked": "; blocked: fix the step marked blocked first",
                 "failed": "; the plan could not be computed"}.get(state, "")
        if report.reboot_pending:
            line += "; a reboot is required"
    else:
        ready = "; the node is ready" if report.ready else "; every step is done, but no NVIDIA driver is loaded"
        line += {"ready": ready, "reboot-pending": "; a reboot is required before it is ready",
                 "blocked": "; the node is NOT ready", "failed": "; the node is NOT ready"}.get(state, "")
    if report.reboots:
        line += f"; rebooted {report.reboots}x"
    return line


def render_install(report: RunReport, console: Console | None = None, fixer: Fixer = _same,
                   next_step: str | None = None) -> None:
    """The end of `gpunode install`: the steps were shown live as they ran (stderr), so this is the recap:
    what changed, what stopped the run and its fix, the backups made, whether the node is ready, what next."""
    console = console or out
    console.print(Text(f"{clean(report.host)}: install finished", style="bold"))
    changed = [o.step for o in report.outcomes if o.result == "changed"]
    unchanged = [o.step for o in report.outcomes if o.result == "ok"]
    if changed:
        console.print(labelled("changed:", ", ".join(changed)))
    if unchanged:
        console.print(labelled("already ok:", ", ".join(unchanged)))
    for outcome in report.outcomes:
        if outcome.result in ("ok", "changed"):
            continue
        head = Text.assemble((outcome.result, STATUS_STYLE.get(outcome.result, "")), (f" {outcome.step}: ", "bold"),
                             clean(fixer(outcome.error or outcome.plan.reason)))
        console.print(head)
        if outcome.result in ("blocked", "failed") and outcome.plan.fix:
            console.print(labelled("fix:", node_text(fixer(outcome.plan.fix), "bold green"), indent=2))
    for outcome in report.outcomes:
        for backup in outcome.backups:
            console.print(node_text("  " + backup, "dim"))
    if report.error:
        console.print(labelled("error:", node_text(report.error)))
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
        where = "on this machine: " if action.to_dict().get("where") == "control" else ""
        text = Text(f"  {marks.get(state, '·')} {where}{clean(action.summary)}")
        if detail:
            text.append(f" ({clean(detail)})", style="dim")
        self.console.print(text)

    def message(self, host: str, text: str) -> None:
        self.console.print(node_text(f"  {text}", "yellow"))
