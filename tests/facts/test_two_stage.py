"""The RUN probe in two round trips (gpunode/facts/__init__.py, gather; registry.LATE): the facts a converged
node's plan reads first, the late ones only when a decision reads one. A late fact can never read as absent: it
is gathered when first read, or, where no node can be asked, reading it raises NotGatheredError."""

from __future__ import annotations

import pytest

from gpunode.facts import RUN, Facts, facts_from_sections, gather, holders, kernel
from gpunode.facts.probe import all_sections, build_probe, split_sections
from gpunode.facts.registry import ALL, CHECK, COMMAND, FULL, LATE, REGISTRY, NotGatheredError
from tests.fakes.connection import FakeConnection, FakeNode

LATE_FACTS = [f for f in REGISTRY.values() if f.late]


def probes(node: FakeNode) -> list[list[str]]:
    return [c for c in node.calls if "probe" in " ".join(c)]


def test_the_run_probe_is_split_in_two_parts_that_make_the_whole():
    check, late = all_sections(RUN, CHECK), all_sections(RUN, LATE)
    assert late, "no fact is late: the first round trip is the whole probe"
    assert set(check).isdisjoint(late)
    assert {**check, **late}.keys() == all_sections(RUN).keys()
    assert all_sections(FULL, ALL).keys() == all_sections(FULL).keys()  # doctor: one round trip, every fact


def test_only_command_facts_gathered_by_run_can_be_late():
    # core facts and file groups are read as fields (facts.kernel, facts.files), outside the checked access that
    # gathers a late fact: one of them late would read as absent
    assert all(f.kind == COMMAND and not f.full_only for f in LATE_FACTS)


def test_a_plan_run_asks_the_node_once_and_a_late_fact_read_asks_once_more():
    node = FakeNode()
    facts = gather(FakeConnection(node))
    assert len(probes(node)) == 1
    facts[kernel.CMDLINE], facts.get(kernel.MODULES)  # not late: no round trip
    assert len(probes(node)) == 1
    facts[holders.GPU_PROCESSES]
    assert len(probes(node)) == 2
    for fact in LATE_FACTS:  # every other late fact came with that round trip
        facts.section(fact), facts.ran(fact), facts.get(fact)
    assert len(probes(node)) == 2
    assert facts.later is not None and facts.later.fetches == 1


@pytest.mark.parametrize("fact", LATE_FACTS, ids=lambda f: f.name)
def test_each_late_fact_reads_as_it_does_from_the_probe_in_one_round_trip(fact):
    node = FakeNode()
    node.outputs[fact.name] = (f"some output of {fact.name}\n", 0)
    two, one = gather(FakeConnection(node)), gather(FakeConnection(node), at_once=True)
    assert one.later is None and two.later is not None
    assert two.section(fact) == one.section(fact)
    assert two[fact] == one[fact]


@pytest.mark.parametrize("fact", LATE_FACTS, ids=lambda f: f.name)
def test_a_late_fact_with_no_node_to_ask_raises_and_never_reads_as_absent(fact):
    script, nonce = build_probe("abc", RUN, CHECK)
    sections = split_sections(FakeConnection(FakeNode()).run(script).stdout, nonce)
    facts = facts_from_sections(sections, nonce, RUN, CHECK)
    for read in (facts.__getitem__, facts.get, facts.section, facts.ran):
        with pytest.raises(NotGatheredError, match=fact.name):
            read(fact)
    facts[kernel.CMDLINE]  # the first round trip's facts read as ever


def test_facts_built_in_one_part_have_nothing_late():
    assert Facts().later is None
    assert facts_from_sections({}, "n", RUN).later is None
    assert facts_from_sections({}, "n", RUN, CHECK).later is not None
