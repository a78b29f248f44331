"""`gpunode verify`: nvidia-smi in a container with each configured engine, compared with the host's GPUs."""

from __future__ import annotations

from typing import Annotated

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
    print_error,
)
from gpunode.errors import GpunodeError
from gpunode.facts import gather
from gpunode.runner import SCHEMA_VERSION
from gpunode.ui import describe_node, err, out, print_json
from gpunode.verify import DEFAULT_TIMEOUT, ENGINES, Report, Test
from gpunode.verify import verify as run_verify

STYLE = {"pass": "green", "fail": "bold red", "skip": "dim"}

ImageOpt = Annotated[str | None, typer.Option(
    "--image", help="Image to run nvidia-smi in. Default: the newest nvidia/cuda base image the driver runs "
    "natively.", show_default=False)]
EngineOpt = Annotated[list[str] | None, typer.Option(
    "--engine", help=f"Only this engine: {', '.join(ENGINES)} (repeatable). Default: every engine found.",
    show_default=False)]
CudaTestOpt = Annotated[bool, typer.Option("--cuda-test", help="Also run a small CUDA workload (vectorAdd) per "
                                           "engine.")]
CudaImageOpt = Annotated[str | None, typer.Option(
    "--cuda-image", help="The CUDA workload image for --cuda-test (it must print PASSED).", show_default=False)]
TimeoutOpt = Annotated[float, typer.Option("--timeout", help="Seconds each container may take, image pull included.")]


def render_report(report: Report, facts_line: str, console: Console | None = None) -> None:
    console = console or out
    console.print(Text(facts_line, style="bold"))
    if report.image:
        how = "chosen for driver " + (report.driver or "?") if report.image_source == "compat" else "--image"
        console.print(Text.assemble(("image: ", "bold"), report.image, (f" ({how})", "dim")))
    if report.cuda_image:
        console.print(Text.assemble(("CUDA workload: ", "bold"), report.cuda_image))
    for note in report.notes:
        console.print(Text("note: " + note, style="yellow"))
    if report.error:
        console.print(Text.assemble(("error: ", "bold red"), report.error[0]))
        if report.error[1]:
            console.print(Text.assemble(("fix: ", "bold"), (report.error[1], "bold green")))
        return
    table = Table(box=None, header_style="bold", pad_edge=False, show_edge=False)
    table.add_column("engine", style="bold")
    table.add_column("test", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("result / fix", overflow="fold", ratio=1)
    for o in report.outcomes:
        detail = Text(o.reason, style="dim" if o.status == "skip" else "")
        if o.status == "fail" and o.fix:
            detail.append("\nfix: ", style="bold")
            detail.append(o.fix, style="bold green")
        table.add_row(o.test.engine, o.test.name, Text(o.status, style=STYLE[o.status]), detail)
    console.print(table)
    failed = [o for o in report.outcomes if o.status == "fail" and o.output]
    for o in failed:
        console.print(Text(f"\n{o.test.name}: {' '.join(o.test.argv)}", style="bold"))
        console.print(Text(o.output, style="dim"))
    counts = {s: sum(1 for o in report.outcomes if o.status == s) for s in STYLE}
    console.print(Text("\nsummary: " + ", ".join(f"{counts[s]} {s}" for s in STYLE), style="bold"))


def verify(
    host: HostOpt = None, identity: IdentityOpt = None, known_hosts: KnownHostsOpt = None,
    accept_new_host_key: AcceptNewOpt = False, ssh_config: SshConfigOpt = None, ask_pass: AskPassOpt = False,
    ask_become_pass: AskBecomePassOpt = False, connect_timeout: ConnectTimeoutOpt = 15.0,
    json_output: JsonOpt = False, image: ImageOpt = None, engine: EngineOpt = None, cuda_test: CudaTestOpt = False,
    cuda_image: CudaImageOpt = None, timeout: TimeoutOpt = DEFAULT_TIMEOUT,
) -> None:
    """Run nvidia-smi in a container with each configured engine (docker, containerd, podman) and compare the
    GPUs it sees with the host's. Exit 0 all pass, 1 any failure, 2 usage or connection error."""
    name = host or "local"
    engines = [e.lower() for e in engine or []]

    def progress(test: Test) -> None:
        if not json_output:
            err.print(Text(f"  → {test.name}", style="dim"))

    try:
        with connect(host, identity, known_hosts, accept_new_host_key, ssh_config, ask_pass, ask_become_pass,
                     connect_timeout) as conn:
            name = conn.name
            facts = gather(conn)
            if not json_output:
                err.print(Text(f"verifying {name}", style="bold"))
            report = run_verify(conn, facts, image=image, engines=engines, cuda_test=cuda_test,
                                cuda_image=cuda_image, timeout=timeout, progress=progress)
    except GpunodeError as exc:
        code = exc.exit_code if exc.exit_code == 2 else 2
        if json_output:
            print_json({"schema_version": SCHEMA_VERSION, "gpunode_version": __version__, "host": name,
                        "tests": [], "exit_code": code, "error": {"message": exc.message, "fix": exc.fix}})
        else:
            print_error(exc)
        raise typer.Exit(code) from None
    if json_output:
        print_json(report.to_dict(SCHEMA_VERSION))
    else:
        render_report(report, describe_node(name, facts))
    raise typer.Exit(report.exit_code)
