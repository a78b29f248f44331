"""`gpunode facts`: what gpunode sees on the node, as JSON. For debugging and bug reports."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpunode.cli._params import command, expected_errors
from gpunode.ui import print_json

# the probe and SSH are imported when the command runs: `gpunode facts --help` needs only its options
if TYPE_CHECKING:
    from gpunode.cli._target import Target


@command(reach="one")
def facts(target: Target) -> None:
    """Print the parsed facts of the node as JSON (read-only). The output is always JSON; --json is accepted."""
    from gpunode.facts import FULL, gather

    with expected_errors(target.fixer()):
        with target.open() as conn:
            found = gather(conn, FULL)
    print_json(found.to_json())  # every registered fact's parsed value, by subsystem
