"""Commands whose implementation has not landed yet. They say so and exit 2; they never pretend."""

from __future__ import annotations

import typer

from gpunode.ui import err


def _not_built(what: str) -> None:
    err.print(f"[bold red]error:[/] {what} is not built yet in gpunode.")
    raise typer.Exit(2)

