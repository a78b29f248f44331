"""`gpunode facts`: what gpunode sees on the node, as JSON. For debugging and bug reports."""

from __future__ import annotations

import dataclasses

from gpunode.cli._params import command, expected_errors
from gpunode.cli._target import Target
from gpunode.facts import gather
from gpunode.ui import print_json


@command(reach="one")
def facts(target: Target) -> None:
    """Print the parsed facts of the node as JSON (read-only). The output is always JSON; --json is accepted."""
    with expected_errors(target.fixer()):
        with target.open() as conn:
            found = gather(conn)
    data = dataclasses.asdict(found)
    data["nouveau_block"] = dataclasses.asdict(found.nouveau_block())
    print_json(_plain(data))


def _plain(value: object) -> object:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, frozenset, set)):
        items = [_plain(v) for v in value]
        return sorted(items, key=str) if isinstance(value, (frozenset, set)) else items
    return value
