"""The RUN probe's two round trips on simulated nodes (gpunode/facts/__init__.py, gather): a converged node's
plan makes one; a plan with changes may make the second; either way `plan` decides exactly as the probe gathered
in one round trip does (the golden plans, tests/golden, are the same files)."""

from __future__ import annotations

import functools
import json
from typing import Any

import pytest
from typer.testing import CliRunner

import gpunode.facts as facts_mod
import gpunode.runner as runner
from gpunode.cli import app
from tests.golden.test_plan_golden import CASES, normalise
from tests.nodesim.fixtures import host_guard, nodesim_available, sim_node  # noqa: F401 - pytest fixtures

pytestmark = pytest.mark.integration

BY_NAME = {case[0]: case for case in CASES}


def _plan(node: Any, args: tuple[str, ...], cache: str) -> Any:
    result = CliRunner().invoke(app, ["plan", *node.cli_args(), "--json", "--cache-dir", cache, *args])
    assert result.exit_code in (0, 1), result.output
    return normalise(json.loads(result.stdout), node, cache)


@pytest.mark.parametrize("case,late_trips", [
    ("ubuntu2204-t4-installed", 0),  # converged: the first round trip decides everything
    ("rocky9-h100x8-installed-580", 0),
    ("debian12-nogpu", 0),
    ("ubuntu2204-t4-upgrade-to-570", 1),  # replacing a loaded driver reads what holds the GPU: late facts
])
def test_plan_decides_as_the_probe_in_one_round_trip(case, late_trips, sim_node, tmp_path,  # noqa: F811
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("GPUNODE_DRIVER_MIRROR", "GPUNODE_CACHE_DIR"):
        monkeypatch.delenv(var, raising=False)
    _, profile, overrides, args = BY_NAME[case]
    node = sim_node(profile, **overrides)
    trips: list[str] = []
    complete = facts_mod.Later.complete

    def counted(self: facts_mod.Later, fact: Any, outputs: Any) -> None:
        if fact.name in self.names:
            trips.append(fact.name)
        complete(self, fact, outputs)

    monkeypatch.setattr(facts_mod.Later, "complete", counted)
    two = _plan(node, args, str(tmp_path / "cache"))
    assert len(trips) == late_trips, trips
    monkeypatch.setattr(runner, "gather", functools.partial(facts_mod.gather, at_once=True))
    one = _plan(node, args, str(tmp_path / "cache"))
    assert len(trips) == late_trips  # the one-round-trip probe has nothing late to fetch
    assert two == one
