"""benchmarks/bench.py writes its results into docs/benchmarks.md section by section: a run of some sections
replaces only theirs."""

from __future__ import annotations

from benchmarks.bench import RESULTS, RESULTS_END, merged

ABOUT = ["date: today", "machine: this one"]


def test_a_run_of_some_sections_replaces_theirs_and_keeps_the_others_and_the_text_around_them():
    old = "# Benchmarks\n\nprose\n"
    first = merged(old, ABOUT, "--only startup --only roundtrips", {"startup": "| start-up table |",
                                                                    "roundtrips": "| round trips table |"})
    assert first.startswith("# Benchmarks\n\nprose\n\n" + RESULTS) and first.rstrip().endswith(RESULTS_END)
    hand = first + "\n### Notes written by hand\n\nkept\n"
    second = merged(hand, ["date: tomorrow"], "--only roundtrips", {"roundtrips": "| round trips again |"})
    assert "| start-up table |" in second and "date: today" in second  # the section not run: as it was
    assert "| round trips table |" not in second and "| round trips again |" in second
    assert second.count("`python -m benchmarks.bench --only roundtrips`") == 1 and "date: tomorrow" in second
    assert second.index("### startup") < second.index("### roundtrips")  # in the bench's order of sections
    assert second.endswith(RESULTS_END + "\n\n### Notes written by hand\n\nkept\n")  # after the block: untouched
    assert merged(second, ["date: tomorrow"], "--only roundtrips", {"roundtrips": "| round trips again |"}) == second


def test_an_older_results_block_without_sections_is_kept_after_the_new_one():
    old = f"# Benchmarks\n\nprose\n\n{RESULTS}\n## Last run\n\n| every section, one table |\n\n### Real VM, by hand\n"
    new = merged(old, ABOUT, "--only probe", {"probe": "| probe table |"})
    block, _, after = new.partition(RESULTS_END)
    assert "| probe table |" in block and "| every section, one table |" not in block
    assert after == "\n## An earlier run\n\n| every section, one table |\n\n### Real VM, by hand\n"
    assert new.count("## Last run") == 1


def test_a_missing_results_file_gets_a_title():
    assert merged("", ABOUT, "(defaults)", {"fleet": "| fleet |"}).startswith("# Benchmarks\n\n" + RESULTS)
