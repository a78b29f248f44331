"""The pipeline, in order. This tuple is the one place that order is defined."""

from __future__ import annotations

from collections.abc import Sequence

from gpunode.errors import UsageError
from gpunode.steps import (
    compat,
    driver,
    fabricmanager,
    k8s,
    nodesettings,
    nouveau,
    prerequisites,
    runtime,
    toolkit,
)
from gpunode.steps.base import Step

PIPELINE: tuple[Step, ...] = (
    nouveau.STEP,
    prerequisites.STEP,
    driver.STEP,
    compat.STEP,
    toolkit.STEP,
    runtime.STEP,
    fabricmanager.STEP,
    nodesettings.STEP,
    k8s.STEP,
)

# Steps of the full pipeline whose implementation has not landed yet. Shown by `plan`, never faked.
NOT_BUILT: tuple[str, ...] = ()


def select(only: Sequence[str] = (), skip: Sequence[str] = ()) -> tuple[Step, ...]:
    """The pipeline filtered by --only / --skip, order kept. Unknown names are a usage error."""
    known = {s.name for s in PIPELINE}
    for name in [*only, *skip]:
        if name in NOT_BUILT:
            raise UsageError(f"step {name!r} is not built yet", fix=f"available steps: {', '.join(sorted(known))}")
        if name not in known:
            raise UsageError(f"unknown step {name!r}", fix=f"choose from: {', '.join(s.name for s in PIPELINE)}")
    return tuple(s for s in PIPELINE if (not only or s.name in only) and s.name not in skip)
