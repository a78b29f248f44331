"""`gpunode status`: what gpunode has done on the node, from its journal (read-only)."""

from __future__ import annotations

import dataclasses

import typer
from rich.table import Table
from rich.text import Text

from gpunode import nodelock
from gpunode.cli._params import command, expected_errors
from gpunode.cli._target import Target
from gpunode.journal import JOURNAL_PATH, read_journal
from gpunode.ui import STATUS_STYLE, clean, node_text, out, print_json


@command(reach="one")
def status(target: Target) -> None:
    """Show the node's journal: runs, steps applied, backups made. Exit 1 if the last run did not finish."""
    with expected_errors(target.fixer()):
        with target.open() as conn:
            journal = read_journal(conn)
            holder = nodelock.holder(conn)
    runs = journal["runs"]
    if holder is not None and not target.json_output:  # a run in progress, not one that stopped half-way
        out.print(node_text(f"{conn.name}: a gpunode run holds the node lock now: {holder.describe()}", "yellow"))
    if target.json_output:
        print_json({"schema_version": 1, "host": conn.name, "journal": JOURNAL_PATH, "runs": runs,
                    "pending": journal.get("pending") or [], "undo": journal.get("undo") or [],
                    "lock": dataclasses.asdict(holder) if holder is not None else None})
    elif not runs:
        out.print(node_text(f"{conn.name}: gpunode has not changed anything here yet ({JOURNAL_PATH} is absent)"))
    else:
        table = Table(box=None, header_style="bold", pad_edge=False)
        for column in ("run", "started", "command", "status", "step", "result", "detail"):
            table.add_column(column, overflow="fold")
        for run in runs:
            changes = [c.get("action", "") for c in run.get("changes") or [] if isinstance(c, dict)]
            steps = run.get("steps") or [{"reason": "; ".join(changes)}]
            for index, step in enumerate(steps):
                first = index == 0
                detail = step.get("error") or "; ".join(step.get("backups") or []) or step.get("reason", "")
                state = str(run.get("status", ""))
                table.add_row(node_text(run.get("id", "")) if first else "",
                              node_text(run.get("started", "")) if first else "",
                              node_text(str(run.get("command", "")).split(" --")[0]) if first else "",
                              Text(clean(state), style=STATUS_STYLE.get(state, "")) if first else "",
                              node_text(step.get("step", "")), node_text(step.get("result", "")), node_text(detail))
        out.print(Text.assemble((clean(conn.name), "bold"), f": {JOURNAL_PATH}"))
        out.print(table)
        for owed in journal.get("pending") or []:
            if isinstance(owed, dict):
                out.print(node_text(f"owed: {owed.get('effect')} {owed.get('target')} (step {owed.get('step')}, since "
                                    f"{owed.get('since')})", "yellow"))
        left = [r for r in journal.get("undo") or [] if isinstance(r, dict) and not r.get("undone")]
        if left:
            out.print(node_text(f"{len(left)} change(s) `gpunode uninstall` can undo", "dim"))
    last = runs[-1].get("status") if runs else "done"
    raise typer.Exit(0 if last in ("done", "reboot-pending") else 1)
