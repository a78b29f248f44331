"""Start-up: `gpunode --help`, `--version`, `compat --gpu T4` against `python3 -c pass` (the reference)."""

from __future__ import annotations

import statistics
import sys
import time

from benchmarks.measure import Row, ms, run
from benchmarks.nodes import gpunode_bin

HELP_TARGET = 10.0  # --help against `python3 -c pass`, same run (issue 25)


def _median(argv: list[str], repeat: int) -> float:
    samples = []
    run(argv)  # warm the page cache and the .pyc files first
    for _ in range(repeat):
        start = time.perf_counter()
        run(argv)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def bench(repeat: int) -> list[Row]:
    base = _median([sys.executable, "-c", "pass"], repeat)
    rows = []
    for args in (["--help"], ["--version"], ["compat", "--gpu", "T4"]):
        took = _median([gpunode_bin(), *args], repeat)
        target, met = (f"<= {HELP_TARGET:.0f}x", took / base <= HELP_TARGET) if args == ["--help"] else ("", None)
        rows.append(Row("start-up", f"gpunode {' '.join(args)} (median of {repeat})", ms(took),
                        f"python3 -c pass {ms(base)}", took / base, target, met))
    return rows
