"""`gpunode doctor`: read-only diagnosis. One probe, every check, a table grouped by layer (or --json)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TextIO

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
    HostsOpt,
    IdentityOpt,
    InventoryOpt,
    JsonOpt,
    KnownHostsOpt,
    LimitOpt,
    LogDirOpt,
    ParallelOpt,
    Reach,
    SshConfigOpt,
    expected_errors,
    print_error,
)
from gpunode.cli._fleet import print_summary, run_with_view
from gpunode.doctor import CheckResult, exit_code, report, run_checks, summary
from gpunode.errors import GpunodeError
from gpunode.facts import Facts, gather
from gpunode.fleet import HostResult, LoggedConnection, QueueReporter
from gpunode.inventory import InventoryHost
from gpunode.runner import SCHEMA_VERSION
from gpunode.ui import describe_node, out, print_json

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
    host: HostsOpt = None, identity: IdentityOpt = None, known_hosts: KnownHostsOpt = None,
    accept_new_host_key: AcceptNewOpt = False, ssh_config: SshConfigOpt = None, ask_pass: AskPassOpt = False,
    ask_become_pass: AskBecomePassOpt = False, connect_timeout: ConnectTimeoutOpt = 15.0,
    json_output: JsonOpt = False, inventory: InventoryOpt = None, limit: LimitOpt = None,
    parallel: ParallelOpt = 8, log_dir: LogDirOpt = None,
) -> None:
    """Diagnose the node (read-only): exit 0 all pass, 1 any failure, 2 usage or connection error."""
    reach = Reach(list(host or []), list(identity or []), list(known_hosts or []), accept_new_host_key, ssh_config,
                  ask_pass, ask_become_pass, connect_timeout, inventory, limit)
    with expected_errors():
        hosts = reach.targets()
    if hosts is not None:
        _doctor_fleet(reach, hosts, parallel, log_dir, json_output)
    name = reach.hosts[0] if reach.hosts else "local"
    try:
        with reach.open() as conn:
            name = conn.name
            facts = gather(conn)
    except GpunodeError as exc:
        # doctor cannot diagnose a node it cannot read: that is a connection-level problem, never a check failure
        if json_output:
            print_json({"schema_version": SCHEMA_VERSION, "gpunode_version": __version__, "host": name,
                        "node": None, "checks": [], "summary": None, "failures": [], "warnings": [], "exit_code": 2,
                        "error": {"message": exc.message, "fix": exc.fix}})
        else:
            print_error(exc)
        raise typer.Exit(2) from None
    results = run_checks(facts)
    if json_output:
        print_json(report(name, facts, results, SCHEMA_VERSION))
    else:
        render_checks(name, facts, results)
    raise typer.Exit(exit_code(results))


_LETTER = {"pass": ("✓", "green"), "warn": ("!", "yellow"), "fail": ("✗", "bold red"), "skip": ("·", "dim")}


def _doctor_fleet(reach: Reach, hosts: list[InventoryHost], parallel: int, log_dir: str | None,
                  json_output: bool) -> None:
    """Every node diagnosed in parallel; one table of hosts x checks, failures listed with their fix."""
    reach.secrets()
    checks: dict[str, list[CheckResult]] = {}

    def work(host: InventoryHost, reporter: QueueReporter, log: TextIO) -> HostResult:
        with LoggedConnection(reach.open(host), log) as conn:
            facts = gather(conn)
        results = run_checks(facts)
        checks[host.name] = results  # one writer per key; read by the main thread after the pool is done
        for r in results:
            log.write(f"{r.id}: {r.status}: {r.evidence}" + (f" -> fix: {r.fix}" if r.fix else "") + "\n")
        failing = [r.id for r in results if r.status == "fail"]
        return HostResult(host.name, "failed" if failing else "ok",
                          error=("failed: " + ", ".join(failing)) if failing else None)

    with expected_errors():
        results, directory = run_with_view(hosts, [], work, parallel, None, None, log_dir)
    if json_output:
        print_summary("doctor", results, directory, True,
                      extra=lambda r: {"checks": [c.to_dict() for c in checks.get(r.host, [])]})
    else:
        ids = [c.id for c in next(iter(checks.values()), [])]
        table = Table(box=None, header_style="bold", pad_edge=False, title=f"gpunode doctor: {len(hosts)} nodes")
        table.add_column("check")
        for h in hosts:
            table.add_column(h.name, justify="center")
        for index, check_id in enumerate(ids):
            row = []
            for h in hosts:
                result = checks.get(h.name)
                mark, style = _LETTER[result[index].status] if result else ("?", "bold red")
                row.append(Text(mark, style=style))
            table.add_row(check_id, *row)
        out.print(table)
        for r in results:
            if r.status == "unreachable":
                out.print(Text(f"{r.host}: unreachable: {r.error}", style="bold red"))
            for c in checks.get(r.host, []):
                if c.status == "fail":
                    out.print(Text.assemble((f"{r.host} {c.id}: ", "bold red"), c.evidence,
                                            ("  fix: ", "bold"), c.fix or ""))
        print_summary("doctor", results, directory, False)
    raise typer.Exit(1 if any(r.failed for r in results) else 0)
