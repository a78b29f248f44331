"""`gpunode status`: what gpunode has done on the node, from its journal (read-only)."""

from __future__ import annotations

import typer
from rich.table import Table
from rich.text import Text

from gpunode.cli._common import (
    AcceptNewOpt,
    AskPassOpt,
    ConnectTimeoutOpt,
    HostOpt,
    IdentityOpt,
    JsonOpt,
    KnownHostsOpt,
    SshConfigOpt,
    connect,
    expected_errors,
)
from gpunode.journal import JOURNAL_PATH, read_journal
from gpunode.ui import STATUS_STYLE, out, print_json


def status(
    host: HostOpt = None, identity: IdentityOpt = None, known_hosts: KnownHostsOpt = None,
    accept_new_host_key: AcceptNewOpt = False, ssh_config: SshConfigOpt = None, ask_pass: AskPassOpt = False,
    connect_timeout: ConnectTimeoutOpt = 15.0, json_output: JsonOpt = False,
) -> None:
    """Show the node's journal: runs, steps applied, backups made. Exit 1 if the last run did not finish."""
    with expected_errors():
        with connect(host, identity, known_hosts, accept_new_host_key, ssh_config, ask_pass, False,
                     connect_timeout) as conn:
            journal = read_journal(conn)
    runs = journal["runs"]
    if json_output:
        print_json({"schema_version": 1, "host": conn.name, "journal": JOURNAL_PATH, "runs": runs})
    elif not runs:
        out.print(f"{conn.name}: gpunode has not changed anything here yet ({JOURNAL_PATH} is absent)")
    else:
        table = Table(box=None, header_style="bold", pad_edge=False)
        for column in ("run", "started", "status", "step", "result", "detail"):
            table.add_column(column, overflow="fold")
        for run in runs:
            steps = run.get("steps") or [{}]
            for index, step in enumerate(steps):
                first = index == 0
                detail = step.get("error") or "; ".join(step.get("backups") or []) or step.get("reason", "")
                table.add_row(run["id"] if first else "", run["started"] if first else "",
                              Text(run["status"], style=STATUS_STYLE.get(run["status"], "")) if first else "",
                              step.get("step", ""), step.get("result", ""), detail)
        out.print(f"[bold]{conn.name}[/]: {JOURNAL_PATH}")
        out.print(table)
    last = runs[-1]["status"] if runs else "done"
    raise typer.Exit(0 if last in ("done", "reboot-pending") else 1)
