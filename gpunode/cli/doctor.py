"""`gpunode doctor`: read-only diagnosis. One probe, every check, a table grouped by layer (or --json)."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, TextIO

import typer

from gpunode import SCHEMA_VERSION, __version__
from gpunode.cli._params import command, expected_errors
from gpunode.errors import GpunodeError
from gpunode.ui import Fixer, clean, counted, describe_node, labelled, node_text, out, print_error, print_json

# the checks, the facts and the fleet are imported when doctor runs: `gpunode doctor --help` needs only its options
# (and rich: its help is drawn without it when stdout is not a terminal, gpunode/cli/_plainhelp.py)
if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text

    from gpunode.cli._target import Target
    from gpunode.doctor import CheckResult
    from gpunode.doctor import verdict as readiness
    from gpunode.facts import Facts
    from gpunode.fleet import HostResult, QueueReporter
    from gpunode.inventory import InventoryHost

STATUS_STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}


EVIDENCE_MIN_WIDTH = 50  # narrower than this, the evidence goes on its own lines under each check


def render_checks(host: str, facts: Facts, results: Sequence[CheckResult], console: Console | None = None,
                  fixer: Fixer | None = None) -> None:
    """One node's checks grouped by layer, then the counts. Fixes are made runnable for the node by `fixer`
    (gpunode/cli/_target.py). On a wide console a table; on a narrow one (80 columns, a split pane) each check
    on a line of its own with its evidence and fix indented under it, so neither is squeezed into a column."""
    from rich.text import Text

    from gpunode.doctor import summary

    console = console or out
    console.print(Text(describe_node(host, facts), style="bold"))
    id_width = max((len(r.id) for r in results), default=0)
    layer_width = max((len(r.layer) for r in results), default=0)
    if console.width - (layer_width + id_width + len("status") + 3) >= EVIDENCE_MIN_WIDTH:
        _checks_table(results, console, fixer)
    else:
        _checks_stacked(results, console, fixer, id_width)
    counts = summary(results)
    line = Text("summary: ", style="bold")
    line.append(", ".join(f"{counts[s]} {s}" for s in STATUS_STYLE), style="bold")
    failing = [r.id for r in results if r.status == "fail"]
    if failing:
        line.append("; failed: " + ", ".join(failing), style="bold red")
    console.print(line)


def _detail(r: CheckResult, fixer: Fixer | None) -> Text:
    detail = node_text(r.evidence, "dim" if r.status == "skip" else "")
    if r.fix and r.status in ("warn", "fail"):
        detail.append("\nfix: ", style="bold")
        detail.append_text(node_text(fixer(r.fix) if fixer else r.fix, "bold green"))
    return detail


def _checks_table(results: Sequence[CheckResult], console: Console, fixer: Fixer | None) -> None:
    from rich.table import Table
    from rich.text import Text
    table = Table(box=None, header_style="bold", pad_edge=False, show_edge=False)
    table.add_column("layer", style="bold")
    table.add_column("check", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("evidence / fix", overflow="fold")
    layer = None
    for r in results:
        if r.layer != layer and layer is not None:
            table.add_section()
        table.add_row(r.layer if r.layer != layer else "", r.id, Text(r.status, style=STATUS_STYLE[r.status]),
                      _detail(r, fixer))
        layer = r.layer
    console.print(table)


def _checks_stacked(results: Sequence[CheckResult], console: Console, fixer: Fixer | None, id_width: int) -> None:
    from rich.padding import Padding
    from rich.text import Text

    layer = None
    for r in results:
        if r.layer != layer:
            console.print(Text(r.layer, style="bold"))
            layer = r.layer
        console.print(Text.assemble("  ", r.id.ljust(id_width), "  ", (r.status, STATUS_STYLE[r.status])),
                      no_wrap=True, overflow="ellipsis")
        detail = _detail(r, fixer)
        detail.overflow = "fold"
        console.print(Padding(detail, (0, 0, 0, 6)))


FormatOpt = Annotated[str | None, typer.Option(
    "--format", metavar="FORMAT", help="table (default), json (same as --json), nhc (one Slurm drain-reason line), "
    "k8s (readiness document; see --ready-file, --reboot-marker), prometheus (node_exporter textfile metrics).")]
ReadyFileOpt = Annotated[str | None, typer.Option(
    "--ready-file", metavar="PATH", help="With --format k8s on this machine: write the readiness document here while "
    "the node is ready, remove it when it is not (atomic).")]
RebootMarkerOpt = Annotated[str | None, typer.Option(
    "--reboot-marker", metavar="PATH", help="With --format k8s on this machine: create this file while a reboot is "
    "required (kured watches /var/run/reboot-required), remove gpunode's marker when not.")]
TextfileOpt = Annotated[str | None, typer.Option(
    "--textfile", metavar="PATH", help="With --format prometheus on this machine: write the metrics here atomically "
    "(a *.prom file in node_exporter's --collector.textfile.directory).")]


def _output_format(target: Target, fmt: str | None, ready_file: str | None, reboot_marker: str | None,
                   textfile: str | None) -> str:
    """The format asked for, checked against the other options (usage errors exit 2)."""
    from gpunode.doctor import verdict as readiness

    chosen = (fmt or ("json" if target.json_output else "table")).lower()
    if chosen not in readiness.FORMATS:
        print_error(f"--format {clean(fmt or '')}: not a format", "use one of: " + ", ".join(readiness.FORMATS))
        raise typer.Exit(2)
    if target.json_output and chosen != "json":
        print_error(f"--json and --format {chosen} ask for two formats", f"drop --json: gpunode doctor --format {chosen}")
        raise typer.Exit(2)
    if (ready_file or reboot_marker) and chosen != "k8s":
        print_error("--ready-file and --reboot-marker go with --format k8s", "add --format k8s")
        raise typer.Exit(2)
    if textfile and chosen != "prometheus":
        print_error("--textfile goes with --format prometheus", "add --format prometheus")
        raise typer.Exit(2)
    if target.fleet is not None and chosen not in ("table", "json"):
        print_error(f"--format {chosen} describes one node", f"run `gpunode doctor --format {chosen}` on each node "
                    "(or once per --host)")
        raise typer.Exit(2)
    return chosen


@command(reach="fleet")
def doctor(target: Target, format: FormatOpt = None, ready_file: ReadyFileOpt = None,  # noqa: A002 - the option
           reboot_marker: RebootMarkerOpt = None, textfile: TextfileOpt = None) -> None:
    """Diagnose the node (read-only): exit 0 all pass, 1 any failure, 2 usage or connection error."""
    from gpunode.cli._target import rewrite_fixes
    from gpunode.doctor import run_checks
    from gpunode.doctor import verdict as readiness
    from gpunode.doctor.document import doctor_document
    from gpunode.facts import FULL, gather

    chosen = _output_format(target, format, ready_file, reboot_marker, textfile)
    if target.fleet is not None:
        _doctor_fleet(target, target.fleet)
    name = target.host or "local"
    try:
        with target.open() as conn:
            name = conn.name
            facts = gather(conn, FULL)
    except GpunodeError as exc:
        # doctor cannot diagnose a node it cannot read: that is a connection-level problem, never a check failure
        if chosen == "nhc":
            print(clean(f"ERROR: gpunode: {name}: connection: {exc.message}").replace("\n", " "))
            raise typer.Exit(2) from None
        if chosen == "json":
            print_json({"schema_version": SCHEMA_VERSION, "gpunode_version": __version__, "host": name,
                        "node": None, "checks": [], "summary": None, "failures": [], "warnings": [], "exit_code": 2,
                        "error": {"message": exc.message, "fix": target.fix(exc.fix)}})
        else:
            print_error(exc.message, target.fix(exc.fix))
        raise typer.Exit(2) from None
    results = run_checks(facts)
    verdict = readiness.readiness(name, facts, results)
    local = target.host is None
    if chosen == "json":
        print_json(rewrite_fixes(doctor_document(name, facts, results), target.fixer()))
    elif chosen == "nhc":
        line = readiness.nhc_line(verdict)
        if line:
            print(line)
    elif chosen == "k8s":
        _k8s(verdict, ready_file, reboot_marker, local)
    elif chosen == "prometheus":
        _metrics(readiness.prometheus(verdict, time.time()), textfile, local)
    else:
        render_checks(name, facts, results, fixer=target.fixer())
    raise typer.Exit(0 if verdict.ready else 1)


def _remote_note(what: str) -> None:
    print(f"gpunode: the node is remote, so {what} is printed here instead of written on this machine; run doctor "
          "on the node itself (no --host) to write it", file=sys.stderr)


def _k8s(verdict: readiness.Readiness, ready_file: str | None, reboot_marker: str | None, local: bool) -> None:
    """The readiness file exists only while the node is ready; the reboot marker only while a reboot is due."""
    from gpunode.doctor import verdict as readiness

    document = readiness.readiness_document(verdict)
    marker = readiness.reboot_marker(verdict)
    if not local and (ready_file or reboot_marker):
        _remote_note("the readiness document")
        ready_file = reboot_marker = None
    try:
        if ready_file:
            if verdict.ready:
                readiness.write_atomic(ready_file, document)
            elif not readiness.remove_if_ours(ready_file, readiness.READY_MARK):
                print_error(f"{ready_file} was not written by gpunode; left as it is", "pass another --ready-file")
        if reboot_marker:
            if marker is not None:
                readiness.write_atomic(reboot_marker, marker)
            else:
                readiness.remove_if_ours(reboot_marker, readiness.MARKER_HEADER)
    except OSError as exc:
        print_error(f"cannot write {exc.filename}: {exc.strerror}", "run as a user who may write there, or pass "
                    "another path")
        raise typer.Exit(2) from None
    sys.stdout.write(document)


def _metrics(text: str, textfile: str | None, local: bool) -> None:
    from gpunode.doctor import verdict as readiness

    if textfile and local:
        try:
            readiness.write_atomic(textfile, text)
        except OSError as exc:
            print_error(f"cannot write {exc.filename}: {exc.strerror}", "run as a user who may write there, or pass "
                        "another --textfile")
            raise typer.Exit(2) from None
        return
    if textfile:
        _remote_note("the metrics text")
    sys.stdout.write(text)


_LETTER = {"pass": ("✓", "green"), "warn": ("!", "yellow"), "fail": ("✗", "bold red"), "skip": ("·", "dim")}


def _doctor_fleet(target: Target, hosts: list[InventoryHost]) -> None:
    """Every node diagnosed in parallel; one table of checks x hosts, failures listed with their fix."""
    from rich.table import Table
    from rich.text import Text

    from gpunode.cli._fleet import fits, print_summary, run_with_view
    from gpunode.doctor import run_checks, summary
    from gpunode.facts import FULL, gather
    from gpunode.fleet import HostResult, LoggedConnection

    target.secrets()
    checks: dict[str, list[CheckResult]] = {}
    by_name = {h.name: h for h in hosts}

    def work(host: InventoryHost, reporter: QueueReporter, log: TextIO) -> HostResult:
        with LoggedConnection(target.open(host), log) as conn:
            facts = gather(conn, FULL)
        results = run_checks(facts)
        checks[host.name] = results  # one writer per key; read by the main thread after the pool is done
        for r in results:
            log.write(f"{r.id}: {r.status}: {r.evidence}" + (f" -> fix: {target.fix(r.fix, host)}" if r.fix else "")
                      + "\n")
        failing = [r.id for r in results if r.status == "fail"]
        return HostResult(host.name, "failed" if failing else "ok",
                          error=("failed: " + ", ".join(failing)) if failing else None)

    with expected_errors():
        results, directory = run_with_view(hosts, [], work, target, read_only=True)
    if target.json_output:
        print_summary("doctor", results, directory, target, hosts,
                      extra=lambda r: {"checks": [c.to_dict() for c in checks.get(r.host, [])]})
    else:
        ids = [c.id for c in next(iter(checks.values()), [])]
        table = Table(box=None, header_style="bold", pad_edge=False, title=f"gpunode doctor: {counted(len(hosts), 'node')}")
        table.add_column("check")
        for h in hosts:
            table.add_column(node_text(h.name), justify="center")
        for index, check_id in enumerate(ids):
            row = []
            for h in hosts:
                result = checks.get(h.name)
                mark, style = _LETTER[result[index].status] if result else ("?", "bold red")
                row.append(Text(mark, style=style))
            table.add_row(check_id, *row)
        if fits(table):
            out.print(table)
            out.print(Text("  ".join(f"{mark} {status}" for status, (mark, _) in _LETTER.items())
                           + "  ? not diagnosed (unreachable)", style="dim"))
        else:  # too many nodes for the console's width: each node's counts on a line of its own
            out.print(Text(f"gpunode doctor: {counted(len(hosts), 'node')}", style="bold"))
            pad = min(max(len(clean(h.name)) for h in hosts), 40)
            for h in hosts:
                counts = summary(checks[h.name]) if h.name in checks else None
                out.print(Text.assemble((clean(h.name).ljust(pad), "bold"), "  ", ", ".join(
                    f"{counts[s]} {s}" for s in STATUS_STYLE) if counts else ("not diagnosed", "bold red")))
        for r in results:
            if r.status == "unreachable":
                out.print(Text.assemble((f"{clean(r.host)}: ", "bold red"), ("unreachable: ", "bold red"),
                                        clean(r.error or "")))
            for c in checks.get(r.host, []):
                if c.status == "fail":
                    out.print(Text.assemble((f"{clean(r.host)} {c.id}: ", "bold red"), clean(c.evidence)))
                    if c.fix:
                        out.print(labelled("fix:", node_text(target.fix(c.fix, by_name.get(r.host)) or "",
                                                             "bold green"), indent=2))
        print_summary("doctor", results, directory, target, hosts)
    raise typer.Exit(1 if any(r.failed for r in results) else 0)
