"""Timing and process helpers shared by the benchmark sections."""

from __future__ import annotations

import os
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass
class Row:
    """One line of the table: a figure, the reference measured in the same run, their ratio and the target."""

    section: str
    what: str
    value: str
    reference: str
    ratio: float | None
    target: str = ""
    met: bool | None = None

    def cells(self) -> list[str]:
        ratio = "" if self.ratio is None else f"{self.ratio:.2f}x"
        met = {True: "yes", False: "NO", None: ""}[self.met]
        return [self.section, self.what, self.value, self.reference, ratio, self.target, met]


HEADER = ["section", "measured", "value", "reference (same run)", "ratio", "target", "met"]


def median_time(fn: Callable[[], object], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def run(argv: Sequence[str], *, ok: Sequence[int] = (0,), timeout: float = 1800, env: dict[str, str] | None = None,
        cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
    if result.returncode not in ok:
        raise RuntimeError(f"{argv[0]} exited {result.returncode}:\n{result.stdout[-2500:]}\n{result.stderr[-2500:]}")
    return result


def run_rss(argv: Sequence[str], *, ok: Sequence[int] = (0,), timeout: float = 1800) -> tuple[float, int]:
    """(wall seconds, peak RSS in KiB) of one process, from wait4's rusage of that very child."""
    elapsed, rss, _ = run_usage(argv, ok=ok, timeout=timeout)
    return elapsed, rss


def run_usage(argv: Sequence[str], *, ok: Sequence[int] = (0,), timeout: float = 1800) -> tuple[float, int, float]:
    """(wall seconds, peak RSS in KiB, CPU seconds: user + system) of one process, from wait4's rusage of that
    very child."""
    start = time.perf_counter()
    proc = subprocess.Popen(list(argv), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = start + timeout
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() > deadline:
            proc.kill()
            raise RuntimeError(f"{argv[0]} did not finish within {timeout:.0f}s")
        time.sleep(0.02)
    elapsed = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    stderr = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.returncode not in ok:
        raise RuntimeError(f"{argv[0]} exited {proc.returncode}: {stderr[-2500:]}")
    return elapsed, usage.ru_maxrss, usage.ru_utime + usage.ru_stime


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def secs(seconds: float) -> str:
    return f"{seconds:.2f} s"
