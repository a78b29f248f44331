"""The fact registry: registered units, typed access that refuses strangers, one probe round trip for all."""

from __future__ import annotations

import importlib
import json
import re
import sys
from pathlib import Path

import pytest

from gpunode.facts import (
    FULL,
    Facts,
    bake,
    containers,
    driver,
    fabric,
    gather,
    health,
    k8s,
    kernel,
    packages,
    system,
)
from gpunode.facts.probe import build_probe, registered
from gpunode.facts.registry import (
    REGISTRY,
    DuplicateFactError,
    Fact,
    Section,
    UnknownFactError,
    command,
)
from tests.fakes.connection import FakeConnection, FakeNode

ROOT = Path(__file__).resolve().parents[2]


def test_a_duplicate_name_is_refused_when_its_module_is_imported(tmp_path, monkeypatch):
    (tmp_path / "dup_facts.py").write_text(
        "from gpunode.facts.registry import command\n"
        "AGAIN = command('units', 'true', str, module='dup_facts')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = REGISTRY["units"]
    with pytest.raises(DuplicateFactError, match="'units'.*already registered by packages"):
        importlib.import_module("dup_facts")
    sys.modules.pop("dup_facts", None)
    assert REGISTRY["units"] is before is packages.UNITS


def test_an_unregistered_fact_object_is_an_error_even_with_a_known_name():
    stranger = Fact("units", "true", lambda s: s.text)
    facts = Facts(outputs={"units": Section("docker.service\tactive\tenabled\n", 0)})
    for read in (facts.__getitem__, facts.get, facts.section, facts.ran):
        with pytest.raises(UnknownFactError, match="not a registered fact"):
            read(stranger)
    with pytest.raises(UnknownFactError):
        facts["units"]  # type: ignore[index]  # no string lookups
    assert facts[packages.UNITS]["docker.service"].is_active  # the registered one reads fine


def test_a_misspelt_fact_fails_when_the_attribute_is_read():
    with pytest.raises(AttributeError):
        driver.USERSPAC  # type: ignore[attr-defined]  # noqa: B018


def test_every_fact_is_registered_once_under_its_subsystem():
    modules = {"system", "kernel", "driver", "packages", "containers", "fabric", "nodesettings", "health", "k8s",
               "bake", "holders", "virt"}
    facts = registered()
    assert len({f.name for f in facts}) == len(facts) == len(REGISTRY)
    assert {f.module for f in facts} == modules
    for module in (system, kernel, driver, packages, containers, fabric, health, k8s, bake):
        declared = [v for v in vars(module).values() if isinstance(v, Fact)]
        assert declared and all(REGISTRY[f.name] is f for f in declared), module.__name__


def test_failure_and_empty_output_are_told_apart():
    facts = Facts(outputs={"nvidia_ctk_version": Section("", 127), "apt_keyrings": Section("", 0)})
    assert facts.get(containers.CTK_VERSION) is None and not facts.ran(containers.CTK_VERSION)
    assert facts.get(packages.APT_KEYRINGS) == frozenset() and facts.ran(packages.APT_KEYRINGS)
    assert facts.section(fabric.FABRIC_STATE) == Section("", 127)  # not in the output at all
    assert facts[fabric.FABRIC_STATE] == []  # the typed value of "nothing"


def test_values_are_parsed_once():
    calls = []
    counted = command("test_counted", "true", lambda text: calls.append(text) or len(calls))
    try:
        facts = Facts(outputs={"test_counted": Section("x", 0)})
        assert facts[counted] == 1 and facts[counted] == 1 and facts.get(counted) == 1
        assert calls == ["x"]
    finally:
        del REGISTRY[counted.name]


def test_one_probe_round_trip_gathers_every_fact():
    node = FakeNode()
    node.add_gpu(0x1EB8)
    conn = FakeConnection(node)
    runs = []
    real_run = conn.run

    def counting_run(*args, **kwargs):
        runs.append(args[0])
        return real_run(*args, **kwargs)

    conn.run = counting_run  # type: ignore[method-assign]
    facts = gather(conn, FULL)
    assert len(runs) == 1  # one conn.run for every fact
    assert [c[-1] for c in node.calls if c[:2] == ["sh", "-c"]] == ["gpunode-probe"]  # besides: the `id -u` check
    assert node.changing_calls() == []
    script = runs[0].body
    for fact in registered():
        assert f"@begin {fact.section}\"" in script, fact
    assert facts.kernel == node.kernel and facts[system.TOOLS] == facts.tools
    assert [g.device for g in facts[kernel.PCI]] == [0x1EB8]


def test_core_facts_are_the_typed_fields():
    script, nonce = build_probe("n")
    out = (f"@{nonce}@begin kernel\n5.15.0-91-generic\n@{nonce}@end kernel 0\n"
           f"@{nonce}@begin uid\n0\n@{nonce}@end uid 0\n")
    from gpunode.facts import facts_from_probe_output

    facts = facts_from_probe_output(out, nonce)
    assert facts[system.KERNEL] == facts.kernel == "5.15.0-91-generic" and facts[system.UID] == 0
    assert facts.get(system.KERNEL) == "5.15.0-91-generic"


def test_no_string_lookup_of_a_fact_remains_outside_the_registry():
    # Facts are read by object; the raw outputs by name are the registry's business only.
    offenders = []
    for path in sorted((ROOT / "gpunode").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("gpunode/facts/") or rel.startswith("gpunode/connection/"):
            continue
        text = path.read_text()
        if re.search(r"\bfacts\.output\(|\bfacts\.outputs\b", text):
            offenders.append(rel)
    assert offenders == []


def test_json_shows_parsed_values_by_subsystem():
    facts = Facts(kernel="6.8.0-45-generic", outputs={
        "units": Section("docker.service\tactive\tenabled\n", 0), "driver_smi": Section("", 3)})
    data = facts.to_json()["facts"]
    assert data["system"]["kernel"] == "6.8.0-45-generic"
    assert data["packages"]["units"] == {"status": 0, "value": {"docker.service": {
        "name": "docker.service", "active": "active", "enabled": "enabled"}}}
    assert data["driver"]["driver_smi"] == {"status": 3, "value": {"status": None, "text": ""}}


def test_json_of_a_whole_gathered_node_is_plain_json():
    node = FakeNode()
    node.add_gpu(0x2330)
    node.outputs["units"] = ("docker.service\tactive\tenabled\n", 0)
    data = json.loads(json.dumps(gather(FakeConnection(node)).to_json()))
    assert data["facts"]["kernel"]["pci"][0]["device"] == 0x2330
    assert data["facts"]["packages"]["units"]["value"]["docker.service"]["active"] == "active"
    assert set(data["facts"]) == {f.module for f in registered()}


def test_the_run_probe_leaves_out_only_what_doctor_and_verify_read():
    """plan and install gather RUN: every fact but the full_only ones (the upgrade simulation, nvidia-smi -q,
    the kernel log...), and a full_only fact read from RUN facts is an error, never a silent empty value."""
    from gpunode.facts import RUN
    from gpunode.facts.gpuhealth import UPGRADES
    from gpunode.facts.registry import NotGatheredError

    node = FakeNode()
    facts = gather(FakeConnection(node))  # the default: RUN
    script = build_probe("n", probe=RUN)[0].body
    left_out = {f.name for f in registered() if f.section not in script}
    assert left_out == {f.name for f in registered() if f.full_only}
    assert {"doctor_upgrades", "doctor_gpu_health", "doctor_gpus", "doctor_kernel_log"} <= left_out
    assert "apt-get -s" not in script and "check-update" not in script and "journalctl" not in script
    assert all(f"@begin {f.section}\"" in script for f in registered(RUN))
    with pytest.raises(NotGatheredError):
        facts[UPGRADES]
    with pytest.raises(NotGatheredError):
        facts.section(UPGRADES)
    assert gather(FakeConnection(node), FULL).section(UPGRADES).status == 127  # FULL asks; the fake has no answer


def test_every_probe_snippet_calls_nvidia_smi_through_the_deadline_wrapper():
    """A bare nvidia-smi call in any section makes a hung GPU cost the probe's whole timeout (found once: the VM
    facts' memory query); each call goes through registry.SMI_CALL's gpunode_smi."""
    import re

    from gpunode.facts.probe import all_sections
    from gpunode.facts.registry import FULL, SMI_CALL
    bare = {name: snippet for name, snippet in all_sections(FULL).items()
            if re.search(r"(?<![\w/-])nvidia-smi\s+-", snippet.replace(SMI_CALL, ""))}
    assert bare == {}
