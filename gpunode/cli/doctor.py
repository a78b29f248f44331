"""`gpunode doctor`: read-only diagnosis."""

from __future__ import annotations

import typer
from rich.table import Table
from rich.text import Text

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
    expected_errors,
)
from gpunode.doctor import exit_code, run_checks
from gpunode.facts import gather
from gpunode.runner import SCHEMA_VERSION
from gpunode.ui import describe_node, out, print_json

_STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}


def doctor(
    host: HostOpt = None, identity: IdentityOpt = None, known_hosts: KnownHostsOpt = None,
    accept_new_host_key: AcceptNewOpt = False, ssh_config: SshConfigOpt = None, ask_pass: AskPassOpt = False,
    ask_become_pass: AskBecomePassOpt = False, connect_timeout: ConnectTimeoutOpt = 15.0,
    json_output: JsonOpt = False,
) -> None:
    """Diagnose the node (read-only): exit 0 all pass, 1 any failure, 2 usage or connection error."""
    with expected_errors():
        with connect(host, identity, known_hosts, accept_new_host_key, ssh_config, ask_pass, ask_become_pass,
                     connect_timeout) as conn:
            facts = gather(conn)
        results = run_checks(facts)
    if json_output:
        print_json({"schema_version": SCHEMA_VERSION, "host": conn.name, "node": facts.summary(),
                    "checks": [r.to_dict() for r in results],
                    "summary": {s: sum(1 for r in results if r.status == s) for s in _STYLE}})
    else:
        out.print(Text(describe_node(conn.name, facts), style="bold"))
        table = Table(box=None, header_style="bold", pad_edge=False)
        for column in ("layer", "check", "status", "evidence", "fix"):
            table.add_column(column, overflow="fold")
        for r in results:
            table.add_row(r.layer, r.id, Text(r.status, style=_STYLE[r.status]), Text(r.evidence), Text(r.fix or ""))
        out.print(table)
    raise typer.Exit(exit_code(results))
