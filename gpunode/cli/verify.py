"""`gpunode verify`: nvidia-smi in a container with each configured engine, compared with the host's GPUs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from gpunode import SCHEMA_VERSION, __version__
from gpunode.cli._params import command, expected_errors
from gpunode.errors import GpunodeError, UsageError
from gpunode.ui import Fixer, clean, describe_node, err, labelled, node_text, out, print_error, print_json
from gpunode.verify_engines import DEFAULT_TIMEOUT, ENGINES

# the probe, the tests and SSH are imported when verify runs: `gpunode verify --help` needs only its options
if TYPE_CHECKING:
    from rich.console import Console

    from gpunode.cli._target import Target
    from gpunode.verify import Report, Test

STYLE = {"pass": "green", "fail": "bold red", "skip": "dim"}

ImageOpt = Annotated[str | None, typer.Option(
    "--image", metavar="IMAGE", help="Image to run nvidia-smi in. Default: the newest nvidia/cuda base image the driver runs "
    "natively.", show_default=False)]
EngineOpt = Annotated[list[str] | None, typer.Option(
    "--engine", metavar="ENGINE", help=f"Only this engine: {', '.join(ENGINES)} (repeatable). Default: every engine found.",
    show_default=False)]
CudaTestOpt = Annotated[bool, typer.Option("--cuda-test", metavar="", help="Also run a small CUDA workload (vectorAdd) per "
                                           "engine.")]
CudaImageOpt = Annotated[str | None, typer.Option(
    "--cuda-image", metavar="IMAGE", help="The CUDA workload image for --cuda-test (it must print PASSED).", show_default=False)]
K8sOpt = Annotated[bool, typer.Option(
    "--k8s", metavar="", help="Kubernetes instead of container engines: the device plugin, then a pod with "
    "nvidia.com/gpu: 1 running nvidia-smi -L (deleted afterwards), with the node's kubectl.")]
KubeconfigOpt = Annotated[str | None, typer.Option(
    "--kubeconfig", metavar="PATH", show_default=False, help="With --k8s: a kubeconfig on the node. Default: the "
    "first of /etc/kubernetes/admin.conf, /etc/rancher/k3s/k3s.yaml, /etc/rancher/rke2/rke2.yaml, /root/.kube/config.")]
TimeoutOpt = Annotated[float, typer.Option(
    "--timeout", metavar="SECONDS", help="Seconds each container may take, image pull included (more than 0).")]


def render_report(report: Report, facts_line: str, console: Console | None = None,
                  fixer: Fixer | None = None) -> None:
    from rich.table import Table
    from rich.text import Text

    console = console or out

    fix = fixer or (lambda text: text)
    console.print(Text(facts_line, style="bold"))
    if report.image:
        how = "chosen for driver " + (report.driver or "?") if report.image_source == "compat" else "--image"
        console.print(Text.assemble(("image: ", "bold"), clean(report.image), (f" ({how})", "dim")))
    if report.cuda_image:
        console.print(Text.assemble(("CUDA workload: ", "bold"), clean(report.cuda_image)))
    for note in report.notes:
        console.print(labelled("note:", node_text(note, "yellow")))
    if report.error:
        console.print(labelled("error:", node_text(report.error[0])))
        if report.error[1]:
            console.print(labelled("fix:", node_text(fix(report.error[1]), "bold green"), indent=2))
        return
    table = Table(box=None, header_style="bold", pad_edge=False, show_edge=False)
    table.add_column("engine", style="bold")
    table.add_column("test", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("result / fix", overflow="fold")
    for o in report.outcomes:
        detail = node_text(o.reason, "dim" if o.status == "skip" else "")
        if o.status == "fail" and o.fix:
            detail.append("\nfix: ", style="bold")
            detail.append_text(node_text(fix(o.fix), "bold green"))
        table.add_row(o.test.engine, o.test.name, Text(o.status, style=STYLE[o.status]), detail)
    console.print(table)
    failed = [o for o in report.outcomes if o.status == "fail" and o.output]
    for o in failed:
        console.print(node_text(f"\n{o.test.name}: {' '.join(o.test.argv)}", "bold"))
        console.print(node_text(o.output, "dim"))
    counts = {s: sum(1 for o in report.outcomes if o.status == s) for s in STYLE}
    console.print(Text("\nsummary: " + ", ".join(f"{counts[s]} {s}" for s in STYLE), style="bold"))


@command(reach="one")
def verify(
    target: Target, image: ImageOpt = None, engine: EngineOpt = None, cuda_test: CudaTestOpt = False,
    cuda_image: CudaImageOpt = None, timeout: TimeoutOpt = DEFAULT_TIMEOUT, k8s: K8sOpt = False,
    kubeconfig: KubeconfigOpt = None,
) -> None:
    """Run nvidia-smi in a container per engine (docker, containerd, podman), or in a Kubernetes pod with --k8s;
    compare its GPUs with the host's.

    Exit 0 all pass, 1 any failure, 2 usage or connection error."""
    from gpunode.cli import _inputs
    from gpunode.cli._target import rewrite_fixes
    from gpunode.facts import FULL, gather
    from gpunode.verify import verify as run_verify
    from gpunode.verify_k8s import verify_k8s

    with expected_errors():
        engines = _inputs.verify_options(timeout, engine, ENGINES)
        if kubeconfig is not None or k8s:
            _inputs.kubernetes(kubeconfig, 1)
        if engine and k8s:
            raise UsageError("--engine and --k8s do not go together", fix="run gpunode verify --k8s and gpunode "
                             "verify --engine ENGINE separately")
    name = target.host or "local"
    json_output = target.json_output

    def progress(test: Test) -> None:
        if not json_output:
            err.print(node_text(f"  → {test.name}", "dim"))

    try:
        with target.open() as conn:
            name = conn.name
            facts = gather(conn, FULL)
            if not json_output:
                err.print(node_text(f"verifying {name}", "bold"))
            if k8s:
                report = verify_k8s(conn, facts, image=image, kubeconfig=kubeconfig, timeout=timeout,
                                    progress=progress)
            else:
                report = run_verify(conn, facts, image=image, engines=engines, cuda_test=cuda_test,
                                    cuda_image=cuda_image, timeout=timeout, progress=progress)
    except GpunodeError as exc:
        code = exc.exit_code if exc.exit_code == 2 else 2
        if json_output:
            print_json({"schema_version": SCHEMA_VERSION, "gpunode_version": __version__, "host": name,
                        "tests": [], "exit_code": code, "error": {"message": exc.message, "fix": target.fix(exc.fix)}})
        else:
            print_error(exc.message, target.fix(exc.fix))
        raise typer.Exit(code) from None
    if json_output:
        print_json(rewrite_fixes(report.to_dict(SCHEMA_VERSION), target.fixer()))
    else:
        render_report(report, describe_node(name, facts), fixer=target.fixer())
    raise typer.Exit(report.exit_code)
