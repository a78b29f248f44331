"""The `gpunode` command line. Each command lives in its own module; this file only composes them."""

from __future__ import annotations

from typing import Annotated

import typer

from gpunode import __version__
from gpunode.cli._params import HelpOpt
from gpunode.cli.compat import compat
from gpunode.cli.doctor import doctor
from gpunode.cli.explain import explain
from gpunode.cli.facts import facts
from gpunode.cli.pipeline import install, plan
from gpunode.cli.status import status
from gpunode.cli.verify import verify
from gpunode.ui import broken_pipe

app = typer.Typer(
    name="gpunode",
    help="Turn a Linux box with NVIDIA GPUs into a working GPU container host, locally or over SSH.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,  # locals may hold passwords
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        print(f"gpunode {__version__}")
        raise typer.Exit(0)


@app.callback(add_help_option=False)
def _main(
    help_: HelpOpt = False,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, metavar="",
                                          help="Print the version and exit.")] = False,
) -> None:
    """gpunode: plan, install, doctor, verify, compat."""


app.command(add_help_option=False)(plan)
app.command(add_help_option=False)(install)
app.command(add_help_option=False)(doctor)
app.command(add_help_option=False)(verify)
app.command(add_help_option=False)(compat)
app.command(add_help_option=False)(status)
app.command(add_help_option=False)(explain)
app.command(add_help_option=False)(facts)


def main() -> None:
    """The `gpunode` entry point. Expected errors are handled inside each command (gpunode/cli/_params.py);
    a reader that closes the pipe early ends the program quietly with 141, like any Unix filter."""
    try:
        app()
    except BrokenPipeError:
        broken_pipe()
