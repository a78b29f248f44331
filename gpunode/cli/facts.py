"""`gpunode facts`: what gpunode sees on the node, as JSON. For debugging and bug reports."""

from __future__ import annotations

from gpunode.cli._params import command, expected_errors
from gpunode.cli._target import Target
from gpunode.facts import FULL, gather
from gpunode.ui import print_json


@command(reach="one")
def facts(target: Target) -> None:
    """Print the parsed facts of the node as JSON (read-only). The output is always JSON; --json is accepted."""
    with expected_errors(target.fixer()):
        with target.open() as conn:
            found = gather(conn, FULL)
    print_json(found.to_json())  # every registered fact's parsed value, by subsystem
