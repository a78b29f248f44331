"""Fleet mode for plan / install / doctor: run on many nodes, draw one live view from the main thread,
print one summary. Workers never touch the console; they send events (gpunode/fleet.py)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.live import Live
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from gpunode import SCHEMA_VERSION
from gpunode.cli._target import Target, rewrite_fixes
from gpunode.fleet import Event, FleetResults, HostResult, interrupt_text, run_fleet
from gpunode.inventory import InventoryHost
from gpunode.ui import STATUS_STYLE, clean, counted, err, labelled, node_text, out, print_json

RESULT_STYLE = {**STATUS_STYLE, "unreachable": "bold red", "skipped": "dim", "planned": "yellow",
                "interrupted": "bold magenta"}


class FleetView:
    """hosts x steps, updated from events. A live table on a terminal; plain progress lines otherwise."""

    def __init__(self, hosts: Sequence[InventoryHost], columns: Sequence[str]) -> None:
        self.columns = list(columns)
        self.cells: dict[str, dict[str, Text]] = {h.name: {} for h in hosts}
        self.status: dict[str, Text] = {h.name: Text("waiting", style="dim") for h in hosts}
        self.live: Live | None = None
        if err.is_terminal:
            self.live = Live(self._table(), console=err, refresh_per_second=4, transient=True)

    def __enter__(self) -> FleetView:
        if self.live is not None:
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.__exit__(None, None, None)

    def _table(self) -> Table:
        table = Table(box=None, header_style="bold", pad_edge=False)
        table.add_column("host")
        for column in self.columns:
            table.add_column(column)
        table.add_column("status")
        for host, cells in self.cells.items():
            table.add_row(host, *(cells.get(c, Text("")) for c in self.columns), self.status[host])
        return table

    def update(self, event: Event) -> None:
        kind, host, payload = event
        line: str | None = None
        if kind == "node":
            self.status[host] = Text("running", style="cyan")
        elif kind == "planned":
            step, status = payload
            self.cells[host][step] = Text(status, style=STATUS_STYLE.get(status, ""))
        elif kind == "action":
            step, state, summary = payload
            mark = {"start": "…", "done": "✓", "failed": "✗"}.get(state, "·")
            self.cells[host][step] = Text(mark, style="red" if state == "failed" else "cyan")
            line = f"{host} [{step}] {mark} {summary}"
        elif kind == "message":
            line = f"{host}: {payload}"
        elif kind == "done":
            result: HostResult = payload
            self.status[host] = Text(result.status, style=RESULT_STYLE.get(result.status, ""))
            line = f"{host}: {result.status}" + (f" ({clean(result.error)})" if result.error else "")
        elif kind == "interrupt":  # Ctrl-C: said in live mode too (above the table), with its countdown
            text = interrupt_text(payload)
            if self.live is not None:
                self.live.console.print(node_text(text, "bold yellow"), soft_wrap=True)
            else:
                err.print(node_text(text, "bold yellow"), soft_wrap=True)
        if self.live is not None:
            self.live.update(self._table())
        elif line is not None:
            err.print(node_text(line), soft_wrap=True)


def default_log_dir(explicit: str | None, read_only: bool = False) -> Path | None:
    """--log-dir, else ./gpunode-logs/<time>/ for a run that changes nodes; a read-only run (plan, doctor,
    uninstall --dry-run) writes nothing on this machine unless --log-dir asks for it."""
    if explicit:
        return Path(explicit)
    return None if read_only else Path("gpunode-logs") / time.strftime("%Y%m%dT%H%M%S")


def run_with_view(hosts: list[InventoryHost], columns: Sequence[str], work: Callable[..., HostResult],
                  target: Target, read_only: bool = False) -> tuple[list[HostResult], Path | None]:
    """Every option was checked before this (gpunode/cli/_inputs.py): the log directory is created only now."""
    directory = default_log_dir(target.log_dir, read_only)
    with FleetView(hosts, columns) as view:
        results = run_fleet(hosts, work, parallel=target.parallel, batch=target.batch, max_fail=target.max_fail,
                            log_dir=directory, on_event=view.update, log_level=target.log_level)
    return results, directory


def fleet_exit_code(results: Sequence[HostResult]) -> int:
    """130 after a Ctrl-C, 143 after a SIGTERM (whatever the nodes did), else 1 if any node failed or was skipped, 3 if one waits
    for a reboot, 0 when every node is done."""
    if isinstance(results, FleetResults) and results.interrupted:
        return results.interrupted_exit
    if any(r.failed for r in results) or any(r.status == "skipped" for r in results):
        return 1
    if any(r.status == "reboot-pending" for r in results):
        return 3
    return 0


_TITLE = {"uninstall-dry-run": "uninstall --dry-run"}


def fits(table: Table) -> bool:
    """Whether the table's natural width fits the console (a pipe without COLUMNS is never too narrow)."""
    from rich.measure import Measurement

    return Measurement.get(out, out.options.update_width(10_000), table).maximum <= out.width


def _steps_view(mode: str, title: str, results: Sequence[HostResult], steps: Sequence[str]) -> None:
    """hosts x steps; too wide for the console (80 columns), one block per host instead: its name on a line,
    then its steps grouped by result, wrapped between words."""
    shown: dict[str, list[tuple[str, str]]] = {}
    for r in results:
        outcome = {o.step: o for o in r.report.outcomes} if r.report is not None else {}
        shown[r.host] = [(step, (o.result if mode in ("install", "uninstall") else o.plan.status.value)
                          if (o := outcome.get(step)) is not None else "-") for step in steps]
    grid = Table(box=None, header_style="bold", pad_edge=False, title=f"gpunode {title}: nodes x steps")
    grid.add_column("host", no_wrap=True)
    for step in steps:
        grid.add_column(step, justify="center", no_wrap=True)
    for host, cells in shown.items():
        grid.add_row(node_text(host), *(Text(value, style=RESULT_STYLE.get(value, "dim")) for _, value in cells))
    if fits(grid):
        out.print(grid)
        return
    out.print(Text(f"gpunode {title}: nodes x steps", style="bold"))
    for host, cells in shown.items():
        groups: dict[str, list[str]] = {}
        for step, value in cells:
            groups.setdefault(value, []).append(step)
        line = Text()
        for index, (value, names) in enumerate(groups.items()):
            line.append("; " if index else "")
            line.append(value, style=RESULT_STYLE.get(value, "dim"))
            line.append(": " + ", ".join(names))
        out.print(node_text(host, "bold"))
        out.print(Padding(line, (0, 0, 0, 2)))


def _hosts_view(mode: str, title: str, results: Sequence[HostResult], log_dir: Path | None) -> None:
    """One row per host; too wide for the console, a line per host (name, status, counts) with its error and
    log on indented lines under it, so neither is folded into a narrow column."""
    pipeline = mode in ("plan", "install", "uninstall", "uninstall-dry-run")
    columns = ["host", "status", *(["steps changed", "reboot pending"] if pipeline else []), "error",
               *(["log"] if log_dir else [])]
    table = Table(box=None, header_style="bold", pad_edge=False,
                  title=f"gpunode {title}: {counted(len(results), 'node')}")
    for column in columns:
        table.add_column(column, overflow="fold", no_wrap=column in ("host", "status"))
    for r in results:
        middle = [str(r.steps_changed), "yes" if r.reboot_pending else ""] if pipeline else []
        table.add_row(node_text(r.host), Text(r.status, style=RESULT_STYLE.get(r.status, "")), *middle,
                      node_text(r.error or ""), *([node_text(r.log or "")] if log_dir else []))
    if fits(table):
        out.print(table)
        return
    out.print(Text(f"gpunode {title}: {counted(len(results), 'node')}", style="bold"))
    pad = min(max((len(clean(r.host)) for r in results), default=0), 40)
    for r in results:
        counts = [counted(r.steps_changed, "step") + " changed", *(["reboot pending"] if r.reboot_pending else [])] \
            if pipeline else []
        out.print(Text.assemble((clean(r.host).ljust(pad), "bold"), "  ", (r.status, RESULT_STYLE.get(r.status, "")),
                                *(("  " + ", ".join(counts)),) if counts else ()))
        for label, value in (("error:", r.error), ("log:", r.log if log_dir else None)):
            if value:
                out.print(labelled(label, node_text(value), style="", indent=2))  # the command as typed, where the JSON mode differs


def print_summary(mode: str, results: Sequence[HostResult], log_dir: Path | None, target: Target,
                  hosts: Sequence[InventoryHost], extra: Callable[[HostResult], dict[str, Any]] | None = None) -> None:
    counts: dict[str, int] = {}
    for r in results:
        counts[r.status] = counts.get(r.status, 0) + 1
    by_name = {h.name: h for h in hosts}
    if target.json_output:
        print_json({"schema_version": SCHEMA_VERSION, "mode": mode, "log_dir": str(log_dir) if log_dir else None,
                    "hosts": [rewrite_fixes({**r.to_dict(), **(extra(r) if extra else {})},
                                            target.fixer(by_name.get(r.host))) for r in results],
                    "summary": {"hosts": len(results), **counts,
                                "reboot_pending": sum(1 for r in results if r.reboot_pending)},
                    "exit_code": fleet_exit_code(results)})
        return
    title = _TITLE.get(mode, mode)
    steps = next(([o.step for o in r.report.outcomes] for r in results if r.report is not None), [])
    if steps:  # plan / install: one table of hosts x steps
        _steps_view(mode, title, results, steps)
    _hosts_view(mode, title, results, log_dir)
    for r in results:  # what to do about each blocked or failed step, runnable for its node
        for o in r.report.outcomes if r.report is not None else []:
            if o.result in ("blocked", "failed", "interrupted") and o.fix:
                out.print(Text.assemble((f"{clean(r.host)} {o.step}: ", "bold red"), clean(o.error or o.plan.reason)))
                out.print(labelled("fix:", node_text(target.fixer(by_name.get(r.host))(o.fix), "bold green"),
                                   indent=2))
    out.print(Text("summary: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())), style="bold"))
