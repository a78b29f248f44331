"""`gpunode doctor`: read-only diagnosis. One probe, every check, a table grouped by layer (or --json)."""

from __future__ import annotations

from collections.abc import Sequence

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from gpunode import __version__
from gpunode.cli._common import (
    AcceptNewOpt,
    AskBecomePassOpt,
    AskPassOpt,
    ConnectTimeoutOpt,
    HostOpt,
    IdentityOpt,
    JsonOpt,
    KnownHostsOpt,
    SshConfigOpt,
    connect,
    escape,
)
from gpunode.doctor import CheckResult, exit_code, report, run_checks, summary
from gpunode.errors import GpunodeError
from gpunode.facts import Facts, gather
from gpunode.runner import SCHEMA_VERSION
from gpunode.ui import describe_node, err, out, print_json

STATUS_STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}


def render_checks(host: str, facts: Facts, results: Sequence[CheckResult], console: Console | None = None) -> None:
    """One node's checks as a table grouped by layer, then the counts. A fleet view calls this per host."""
    console = console or out
    console.print(Text(describe_node(host, facts), style="bold"))
    table = Table(box=None, header_style="bold", pad_edge=False, show_edge=False)
    table.add_column("layer", style="bold")
    table.add_column("check", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("evidence / fix", overflow="fold", ratio=1)
    layer = None
    for r in results:
        if r.layer != layer and layer is not None:
            table.add_section()
        detail = Text(r.evidence, style="dim" if r.status == "skip" else "")
        if r.fix and r.status in ("warn", "fail"):
            detail.append("\nfix: ", style="bold")
            detail.append(r.fix, style="bold green")
        table.add_row(r.layer if r.layer != layer else "", r.id, Text(r.status, style=STATUS_STYLE[r.status]), detail)
        layer = r.layer
    console.print(table)
    counts = summary(results)
    line = Text("summary: ", style="bold")
    line.append(", ".join(f"{counts[s]} {s}" for s in STATUS_STYLE), style="bold")
    failing = [r.id for r in results if r.status == "fail"]
    if failing:
        line.append("; failed: " + ", ".join(failing), style="bold red")
    console.print(line)


def doctor(
    host: HostOpt = None, identity: IdentityOpt = None, known_hosts: KnownHostsOpt = None,
    accept_new_host_key: AcceptNewOpt = False, ssh_config: SshConfigOpt = None, ask_pass: AskPassOpt = False,
    ask_become_pass: AskBecomePassOpt = False, connect_timeout: ConnectTimeoutOpt = 15.0,
    json_output: JsonOpt = False,
) -> None:
    """Diagnose the node (read-only): exit 0 all pass, 1 any failure, 2 usage or connection error."""
    name = host or "local"
    try:
        with connect(host, identity, known_hosts, accept_new_host_key, ssh_config, ask_pass, ask_become_pass,
                     connect_timeout) as conn:
            name = conn.name
            facts = gather(conn)
    except GpunodeError as exc:
        # doctor cannot diagnose a node it cannot read: that is a connection-level problem, never a check failure
        if json_output:
            print_json({"schema_version": SCHEMA_VERSION, "gpunode_version": __version__, "host": name,
                        "node": None, "checks": [], "summary": None, "failures": [], "warnings": [], "exit_code": 2,
                        "error": {"message": exc.message, "fix": exc.fix}})
        else:
            err.print(f"[bold red]error:[/] {escape(exc.message)}")
            if exc.fix:
                err.print(f"[bold]fix:[/] {escape(exc.fix)}")
        raise typer.Exit(2) from None
    results = run_checks(facts)
    if json_output:
        print_json(report(name, facts, results, SCHEMA_VERSION))
    else:
        render_checks(name, facts, results)
    raise typer.Exit(exit_code(results))
