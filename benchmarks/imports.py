"""Start-up: what each runtime dependency costs to import, alone in a fresh interpreter (`python -X importtime`,
the cumulative time of its top-level module; the median of several runs), against `python3 -c pass`; and what
gpunode's own command paths import (`gpunode.cli` for `--help`, a command's module when it runs).

typer >= 0.2x coerces every parameter's value through pydantic when a command runs (typer/_coercion.py imports
pydantic's TypeAdapter then): the pydantic row is that cost. gpunode defers it (gpunode/cli/_typerpatch.py) to a
value pydantic must convert (a path, a choice, a signed number, a bad value): absent options, defaults, strings
and plain numbers never import it. typer.rich_utils (any rich --help) imports rich.markdown and rich.traceback at its top
level; gpunode imports it without them (gpunode/cli/_typerpatch.py), so its row is typer's cost, not gpunode's."""

from __future__ import annotations

import statistics
import subprocess
import sys

from benchmarks.measure import Row, ms

DEPENDENCIES = ("typer", "rich", "paramiko", "requests", "distro", "packaging", "yaml", "pydantic", "invoke",
                "markdown_it", "rich.markdown", "rich.traceback", "typer.rich_utils")
# gpunode.cli.pipeline is what `plan --help` loads; a run adds gpunode.cli._inputs (the checks, the steps) and
# gpunode.runner, and SSH
OWN = ("gpunode.cli", "gpunode.cli.pipeline", "gpunode.cli._inputs", "gpunode.runner", "gpunode.cli.doctor",
       "gpunode.connection.ssh")


def import_cost(module: str, repeat: int) -> float:
    """Seconds to import `module` (with what it imports) in a fresh interpreter; the median of `repeat`."""
    samples = []
    for _ in range(repeat):
        err = subprocess.run([sys.executable, "-X", "importtime", "-c", f"import {module}"], capture_output=True,
                             text=True, check=True).stderr
        line = next(line for line in reversed(err.splitlines()) if line.rstrip().endswith(f"| {module}"))
        samples.append(int(line.split("|")[1]) / 1e6)
    return statistics.median(samples)


def _pass(repeat: int) -> float:
    import time

    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def bench(repeat: int) -> list[Row]:
    for module in (*DEPENDENCIES, *OWN):  # once, unmeasured: the .pyc files (see bench.py), the page cache
        subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, check=True)
    base = _pass(repeat)
    rows = []
    for module in (*DEPENDENCIES, *OWN):
        took = import_cost(module, repeat)
        rows.append(Row("imports", f"import {module} (alone, median of {repeat})", ms(took),
                        f"python3 -c pass {ms(base)}", took / base))
    return rows


if __name__ == "__main__":
    for row in bench(5):
        print(" | ".join(c for c in row.cells() if c))
