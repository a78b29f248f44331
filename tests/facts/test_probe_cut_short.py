"""A fact probe cut short (past its time limit, or its shell killed) is an error naming the section it stopped
in, never a node that reads as empty ("no driver, no packages"): found on the real-OS tier's TCG VM, where a
slow probe used to lose 41 facts silently."""

from __future__ import annotations

import pytest

from gpunode.errors import CommandError, CommandTimeout
from gpunode.facts import FULL, RUN, driver, gather, holders
from gpunode.facts.probe import all_sections
from gpunode.facts.registry import ALL, CHECK, LATE
from tests.fakes.connection import FakeConnection, FakeNode

PACKAGES = driver.PACKAGES.section  # "cmd:driver_packages": a section the RUN probe reaches late


class CutShort(FakeConnection):
    """The fake node's probe answer, cut inside section `stop_in` as a timed-out or killed run leaves it: the
    section's begin marker and part of its text arrived, nothing after."""

    def __init__(self, node: FakeNode, stop_in: str, timed_out: bool = True, exit_code: int = -1) -> None:
        super().__init__(node)
        self.stop_in, self.timed_out, self.exit_code = stop_in, timed_out, exit_code

    def _exec(self, line, stdin, timeout):
        code, out, err, _ = super()._exec(line, stdin, timeout)
        text = out.decode()
        marker = f"@begin {self.stop_in}\n"
        if "@begin " not in text or marker not in text:
            return code, out, err, False
        cut = text.index(marker) + len(marker)
        return self.exit_code, (text[:cut] + "partial outp").encode(), err, self.timed_out


def packaged_node() -> FakeNode:
    node = FakeNode()
    node.outputs["driver_packages"] = ("ii nvidia-kernel-dkms 535.261.03-1\n", 0)
    return node


def test_the_whole_probe_still_reads_the_node():
    facts = gather(FakeConnection(packaged_node()))
    assert facts.ran(driver.PACKAGES)


def test_a_probe_past_its_time_limit_is_an_error_naming_the_section_it_stopped_in():
    with pytest.raises(CommandTimeout) as caught:
        gather(CutShort(packaged_node(), PACKAGES))
    message = str(caught.value)
    assert "ran past its 120 s limit" in message and repr(PACKAGES) in message
    assert "unknown (not absent)" in message
    first = list(all_sections(RUN, CHECK))  # the RUN probe's first round trip
    missing = len(first[first.index(PACKAGES):])
    assert f"{missing} of {len(first)} sections" in message
    assert caught.value.fix and "too slowly" in caught.value.fix and PACKAGES in caught.value.fix


@pytest.mark.parametrize("probe", [RUN, FULL])
def test_every_section_cut_short_is_an_error_in_either_probe(probe):
    names = list(all_sections(probe, CHECK if probe == RUN else ALL))
    for name in (names[1], names[len(names) // 2], names[-1]):  # os_release itself is the "nothing usable" case
        with pytest.raises(CommandTimeout, match=repr(name)):
            gather(CutShort(packaged_node(), name), probe=probe)


def test_the_late_round_trip_cut_short_is_an_error_when_a_late_fact_is_read_never_an_absent_fact():
    late = list(all_sections(RUN, LATE))
    for name in (late[0], late[-1]):
        facts = gather(CutShort(packaged_node(), name))  # the first round trip is whole
        with pytest.raises(CommandTimeout, match=repr(name)):
            facts[holders.GPU_PROCESSES]


def test_a_probe_whose_shell_died_is_an_error_with_its_exit_status_not_a_timeout():
    with pytest.raises(CommandError) as caught:
        gather(CutShort(packaged_node(), PACKAGES, timed_out=False, exit_code=137))
    assert not isinstance(caught.value, CommandTimeout)
    assert "stopped (exit 137)" in str(caught.value) and repr(PACKAGES) in str(caught.value)


def test_a_probe_that_timed_out_before_any_section_is_a_timeout_too():
    with pytest.raises(CommandTimeout, match="'os_release'"):
        gather(CutShort(packaged_node(), "os_release"))
