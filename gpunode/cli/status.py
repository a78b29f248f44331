"""`gpunode status`: what gpunode has done on the node, from its journal (read-only)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import typer

from gpunode.cli._params import command, expected_errors
from gpunode.ui import STATUS_STYLE, clean, counted, node_text, out, print_json

# the journal, the lock, the facts and SSH are imported when status runs: `gpunode status --help` needs only its
# options
if TYPE_CHECKING:
    from rich.console import Group

    from gpunode.cli._target import Target


def _run_view(run: dict[str, Any]) -> Group:
    """One run: a heading (id, start time, status), the command under it, then its steps as a grid whose step and
    result columns never fold, so at 80 columns only the command and the free-text detail wrap, between words."""
    from rich.console import Group
    from rich.padding import Padding
    from rich.table import Table
    from rich.text import Text

    state = clean(run.get("status", ""))
    heading = Text.assemble(("run ", "bold"), (clean(run.get("id", "")), "bold"), "  ", clean(run.get("started", "")),
                            "  ", (state, STATUS_STYLE.get(state, "")))
    command_line = Text(clean(str(run.get("command", "")).split(" --")[0]), style="dim")
    changes = [c.get("action", "") for c in run.get("changes") or [] if isinstance(c, dict)]
    steps = run.get("steps") or [{"reason": "; ".join(changes)}]
    grid = Table.grid(padding=(0, 2, 0, 0), pad_edge=False)
    grid.add_column(no_wrap=True)
    grid.add_column(no_wrap=True)
    grid.add_column(overflow="fold")
    for step in steps:
        result = clean(step.get("result", ""))
        detail = step.get("error") or "; ".join(step.get("backups") or []) or step.get("reason", "")
        grid.add_row(node_text(step.get("step", "")), Text(result, style=STATUS_STYLE.get(result, "")),
                     node_text(detail))
    return Group(heading, Padding(command_line, (0, 0, 0, 2)), Padding(grid, (0, 0, 0, 2)))


def driver_source(journal: dict[str, Any]) -> dict[str, Any] | None:
    """The driver gpunode installed and has not undone, and its source: {"version", "source": "packages" | "run",
    "packages": [names] (the packages its driver step's transactions added), "route": {name: version} (every
    package of the route at its exact version, those that were there already too), "held": [names]}, or None."""
    from gpunode.facts.driver import driver_of_records

    found = driver_of_records(journal.get("undo") or [])
    if not found.source:
        return None
    packages = found.source == "packages"
    return {"version": found.version, "source": found.source,
            "packages": list(found.packages) if packages else [],
            "route": dict(found.pinned) if packages else {}, "held": list(found.held) if packages else []}


def _driver_line(found: dict[str, Any]) -> str:
    version = found["version"] or "(version not recorded)"
    if found["source"] == "packages":
        route = found.get("route") or {}
        if not route:  # a record from before the route's set was recorded: what the transactions added
            return f"driver {version}: installed by gpunode from packages ({', '.join(found['packages'])})"
        listed = ", ".join(f"{n} {v}" for n, v in route.items())
        return f"driver {version}: installed by gpunode from packages: {listed}"
    return f"driver {version}: installed by gpunode from NVIDIA's .run installer"


@command(reach="one")
def status(target: Target) -> None:
    """Show the node's journal: runs, steps applied, backups made. Exit 1 if the last run did not finish."""
    from rich.text import Text

    from gpunode import nodelock
    from gpunode.journal import JOURNAL_PATH, read_journal

    with expected_errors(target.fixer()):
        with target.open() as conn:
            journal = read_journal(conn)
            holder = nodelock.holder(conn)
    runs = journal["runs"]
    if holder is not None and not target.json_output:  # a run in progress, not one that stopped half-way
        out.print(node_text(f"{conn.name}: a gpunode run holds the node lock now: {holder.describe()}", "yellow"))
    if target.json_output:
        print_json({"schema_version": 1, "host": conn.name, "journal": JOURNAL_PATH, "runs": runs,
                    "pending": journal.get("pending") or [], "undo": [r.to_dict() for r in journal.get("undo") or []],
                    "driver": driver_source(journal),
                    "lock": dataclasses.asdict(holder) if holder is not None else None})
    elif not runs:
        out.print(node_text(f"{conn.name}: gpunode has not changed anything here yet ({JOURNAL_PATH} is absent)"))
    else:
        out.print(Text.assemble((clean(conn.name), "bold"), f": {JOURNAL_PATH}"))
        for run in runs:
            out.print(_run_view(run))
        for owed in journal.get("pending") or []:
            if isinstance(owed, dict):
                out.print(node_text(f"owed: {owed.get('effect')} {owed.get('target')} (step {owed.get('step')}, since "
                                    f"{owed.get('since')})", "yellow"))
        found = driver_source(journal)
        if found is not None:
            out.print(node_text(_driver_line(found)))
        left = [r for r in journal.get("undo") or [] if not r.undone]
        if left:
            out.print(node_text(f"{counted(len(left), 'change')} `gpunode uninstall` can undo", "dim"))
    last = runs[-1].get("status") if runs else "done"
    raise typer.Exit(0 if last in ("done", "reboot-pending") else 1)
