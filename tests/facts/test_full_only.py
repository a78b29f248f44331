"""registry.FULL_ONLY: the subsystems whose facts only the FULL probe gathers are imported when a FULL probe (or
the whole registry) is asked for, never by plan's or install's RUN probe; the RUN probe is the same either way."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpunode.facts.registry import FULL_ONLY, Fact, command
from gpunode.facts.registry import REGISTRY as REGISTRY_NOW

ROOT = Path(__file__).resolve().parents[2]


def _fresh(code: str) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-c", "import json, sys\n" + code], capture_output=True, text=True,
                          cwd=ROOT, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def test_a_run_probe_imports_no_full_only_subsystem_and_a_full_probe_registers_them():
    seen = _fresh(
        "from gpunode.facts.probe import build_probe, registered\nfrom gpunode.facts.registry import RUN, CHECK, LATE\n"
        "run = [build_probe('0' * 16, RUN, part)[0].body for part in (CHECK, LATE)]\n"
        "loaded = sorted(m for m in ('gpunode.facts.health', 'gpunode.facts.gpuhealth', 'gpunode.facts.virt') "
        "if m in sys.modules)\n"
        "full = sorted({f.module for f in registered()})\n"
        "again = [build_probe('0' * 16, RUN, part)[0].body for part in (CHECK, LATE)]\n"
        "print(json.dumps({'loaded': loaded, 'full': full, 'same': run == again}))")
    assert seen["loaded"] == []  # building both parts of the RUN probe imported none of them
    assert set(FULL_ONLY) <= set(seen["full"])  # asking for FULL registered them
    assert seen["same"]  # and the RUN probe does not change once they are registered


def test_every_fact_of_a_full_only_subsystem_is_full_only():
    import gpunode.facts.probe as probe

    facts = [f for f in probe.registered() if f.module in FULL_ONLY]
    assert {f.module for f in facts} == set(FULL_ONLY) and all(f.full_only for f in facts)


def test_registering_a_run_fact_in_a_full_only_subsystem_is_refused():
    with pytest.raises(ValueError, match="FULL_ONLY"):
        command("test_not_full_only", "true", str, module="health")
    assert "test_not_full_only" not in REGISTRY_NOW


def test_the_probe_s_views_hold_the_full_only_facts():
    from gpunode.facts.probe import COMMANDS

    assert all(isinstance(f, Fact) for f in REGISTRY_NOW.values())
    assert {"doctor_kernel_log", "virt"} <= set(COMMANDS)
