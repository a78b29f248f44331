"""The pipeline, in order. ORDER is the one place that order is defined: each name is a step's module in this
package and the name of that module's STEP. The modules are imported when PIPELINE is first read (`_pipeline`), so
that a run can name its steps (the node lock's command, gpunode/cli/pipeline.py) before it loads them."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

from gpunode.errors import UsageError

if TYPE_CHECKING:
    from gpunode.steps.base import Step

ORDER: tuple[str, ...] = ("nouveau", "prerequisites", "driver", "compat", "toolkit", "runtime", "fabricmanager",
                          "nodesettings", "k8s")
PIPELINE: tuple[Step, ...]  # the steps of ORDER, made on first read (__getattr__)

# Steps of the full pipeline whose implementation has not landed yet. Shown by `plan`, never faked.
NOT_BUILT: tuple[str, ...] = ()


def _pipeline() -> tuple[Step, ...]:
    loaded = globals().get("PIPELINE")
    if loaded is None:
        loaded = tuple(importlib.import_module(f"{__name__}.{name}").STEP for name in ORDER)
        wrong = [(name, step.name) for name, step in zip(ORDER, loaded, strict=True) if step.name != name]
        if wrong:
            raise ImportError(f"gpunode.steps.ORDER names a module whose STEP has another name: {wrong}")
        globals()["PIPELINE"] = loaded
    return loaded


def __getattr__(name: str) -> object:
    if name == "PIPELINE":
        return _pipeline()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def select(only: Sequence[str] = (), skip: Sequence[str] = ()) -> tuple[Step, ...]:
    """The pipeline filtered by --only / --skip, order kept. Unknown names are a usage error."""
    pipeline = _pipeline()
    known = set(ORDER)
    for name in [*only, *skip]:
        if name in NOT_BUILT:
            raise UsageError(f"step {name!r} is not built yet", fix=f"available steps: {', '.join(sorted(known))}")
        if name not in known:
            raise UsageError(f"unknown step {name!r}", fix=f"choose from: {', '.join(ORDER)}")
    return tuple(s for s in pipeline if (not only or s.name in only) and s.name not in skip)
