"""Start-up: `gpunode --help`, `--version`, every command's `--help`, `compat --gpu T4` against `python3 -c pass`
(the reference, run in turn with them); and what shell completion (`--install-completion`, typer's) adds to `--help`:
the same process with completion switched off is the reference.

stdout is /dev/null, not a terminal: the help is drawn by gpunode/cli/_plainhelp.py. What a terminal gets (typer's
rich renderer, in colour) is measured too, with FORCE_COLOR=1 (rich's and typer's switch for a terminal's path)."""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from benchmarks.measure import Row, ms, run, run_usage
from benchmarks.nodes import gpunode_bin
from gpunode.cli import COMMANDS as CLI_COMMANDS

HELP_TARGET = 10.0  # --help (the listing's and each command's) against `python3 -c pass`, same run (issue 25)
COMPLETION_TARGET = 1.05  # --help with completion against without: at most 5% slower

_HELP_WITH = ("import sys\nimport gpunode.cli as c\nc.app._add_completion = {on}\nsys.argv = ['gpunode', '--help']\n"
              "try:\n    c.main()\nexcept SystemExit:\n    pass\n")


COMMANDS = (["--help"], ["--version"], *([name, "--help"] for name in CLI_COMMANDS), ["compat", "--gpu", "T4"])
TERMINAL = [a for a in COMMANDS if a[-1] == "--help"]


def _medians(argvs: list[list[str]], repeat: int) -> list[tuple[float, float]]:
    """The median wall time and CPU time (user + system, from wait4) of each command, run in turn
    (A B C A B C ...) so that load on the machine hits all of them alike. On a loaded machine the wall ratio
    moves with the load; the CPU ratio is the stable one."""
    samples: list[list[tuple[float, float]]] = [[] for _ in argvs]
    for argv in argvs:
        run(argv)  # warm the page cache and the .pyc files first
    for _ in range(repeat):
        for i, argv in enumerate(argvs):
            wall, _, cpu = run_usage(argv)
            samples[i].append((wall, cpu))
    return [(statistics.median(w for w, _ in s), statistics.median(c for _, c in s)) for s in samples]


@contextmanager
def _environ(**changes: str | None) -> Iterator[None]:
    """os.environ with `changes` (None: unset) while the block runs; the child processes inherit it."""
    def put(values: dict[str, str | None]) -> None:
        for name, value in values.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

    saved = {name: os.environ.get(name) for name in changes}
    put(changes)
    try:
        yield
    finally:
        put(saved)


def bench(repeat: int) -> list[Row]:
    (base, base_cpu), *took = _medians([[sys.executable, "-c", "pass"],
                                         *([gpunode_bin(), *a] for a in COMMANDS)], repeat)
    rows = []
    for args, (t, cpu) in zip(COMMANDS, took, strict=True):
        target, met = (f"<= {HELP_TARGET:.0f}x", t / base <= HELP_TARGET) if args[-1] == "--help" else ("", None)
        rows.append(Row("start-up", f"gpunode {' '.join(args)} (median of {repeat}, interleaved)", ms(t),
                        f"python3 -c pass {ms(base)}", t / base, target, met))
        cpu_met = cpu / base_cpu <= HELP_TARGET if target else None
        rows.append(Row("start-up", "  the same, CPU (user+system)", ms(cpu), f"python3 -c pass {ms(base_cpu)}",
                        cpu / base_cpu, target, cpu_met))
    with _environ(FORCE_COLOR="1"):  # what a terminal gets: the help in colour
        (_, term_base_cpu), *term = _medians([[sys.executable, "-c", "pass"],
                                                      *([gpunode_bin(), *a] for a in TERMINAL)], repeat)
    for args, (_, cpu) in zip(TERMINAL, term, strict=True):
        ratio = cpu / term_base_cpu
        rows.append(Row("start-up", f"gpunode {' '.join(args)} at a terminal (FORCE_COLOR=1), CPU", ms(cpu),
                        f"python3 -c pass {ms(term_base_cpu)}", ratio, f"<= {HELP_TARGET:.0f}x", ratio <= HELP_TARGET))
    with_completion, without = _interleaved(repeat)
    ratio = with_completion / without
    rows.append(Row("start-up", f"gpunode --help with shell completion (median of {repeat})", ms(with_completion),
                    f"completion off {ms(without)}", ratio, f"<= {COMPLETION_TARGET:.2f}x",
                    ratio <= COMPLETION_TARGET))
    return rows


def _interleaved(repeat: int) -> tuple[float, float]:
    """Medians of `--help` with and without completion, run alternately so load on the machine hits both."""
    samples: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(repeat):
        for on in (True, False):
            start = time.perf_counter()
            run([sys.executable, "-c", _HELP_WITH.format(on=on)])
            samples[on].append(time.perf_counter() - start)
    return statistics.median(samples[True]), statistics.median(samples[False])
