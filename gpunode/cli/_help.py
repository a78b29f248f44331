"""The --help option every command and the group share, and the command class that draws it. Its own module so that
`gpunode --help` loads neither the option table nor the shared options (gpunode/cli/_params.py): only this, typer
and the help renderer (gpunode/cli/_plainhelp.py, typer's rich one where it steps aside)."""

from __future__ import annotations

from typing import Annotated

import typer
from typer.core import TyperCommand

from gpunode.cli._typerpatch import import_rich_help


def format_help(command: typer.core.TyperCommand | typer.core.TyperGroup, ctx: typer.Context, formatter: object,
                commands: tuple[object, ...] = ()) -> None:
    """`command`'s help: drawn by gpunode/cli/_plainhelp.py where it is sure to print what rich would (the same
    text), else by typer's rich renderer (imported without Markdown and Traceback, see _typerpatch)."""
    from gpunode.cli._plainhelp import print_help

    if not print_help(command, ctx, commands):
        import_rich_help()
        super(type(command), command).format_help(ctx, formatter)  # type: ignore[arg-type]


class HelpCommand(TyperCommand):
    """A typer command whose help is drawn by format_help above."""

    def format_help(self, ctx: typer.Context, formatter: object) -> None:  # type: ignore[override]
        format_help(self, ctx, formatter)


def _help(ctx: typer.Context, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        typer.echo(ctx.get_help(), color=ctx.color)
        raise typer.Exit(0)


# typer's own help option shows a `<bool>` type; commands use this one instead (app.command(add_help_option=False))
HelpOpt = Annotated[bool, typer.Option("--help", "-h", metavar="", is_eager=True, expose_value=False,
                                       callback=_help, help="Show this message and exit.")]
