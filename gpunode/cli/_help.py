"""The --help option every command and the group share. Its own module so that `gpunode --help` loads neither the
option table nor the shared options (gpunode/cli/_params.py): only this, typer and the rich help."""

from __future__ import annotations

from typing import Annotated

import typer

from gpunode.cli._typerpatch import import_rich_help


def _help(ctx: typer.Context, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        import_rich_help()
        typer.echo(ctx.get_help(), color=ctx.color)
        raise typer.Exit(0)


# typer's own help option shows a `<bool>` type; commands use this one instead (app.command(add_help_option=False))
HelpOpt = Annotated[bool, typer.Option("--help", "-h", metavar="", is_eager=True, expose_value=False,
                                       callback=_help, help="Show this message and exit.")]
