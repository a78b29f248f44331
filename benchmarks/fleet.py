"""Fleet: `doctor` and a converged `install` over an inventory of 1, 10, 50 and 100 nodes with --parallel 50;
each against the same command on 1 node (the reference). Peak RSS of the gpunode process (wait4's rusage of
that one child) at the largest size, against the 1-node run."""

from __future__ import annotations

from pathlib import Path

from benchmarks.measure import Row, run_rss, secs
from benchmarks.nodes import DRIVER, converge, gpunode_bin, inventory
from tests.nodesim.node import SimNode

TARGET = 3.0


def _argv(command: str, nodes: list[SimNode], work: Path) -> list[str]:
    sub = work / f"{command}-{len(nodes)}"
    sub.mkdir(exist_ok=True)
    inv, known = inventory(nodes, sub)
    extra = ["--driver", DRIVER, "--cache-dir", str(work / "cache")] if command == "install" else []
    return [gpunode_bin(), command, "--inventory", str(inv), "--known-hosts", str(known), "--parallel", "50",
            "--log-dir", str(sub / "logs"), *extra]


def bench(nodes: list[SimNode], sizes: list[int], work: Path) -> list[Row]:
    converge(nodes, work)
    rows: list[Row] = []
    for command in ("doctor", "install"):
        base_time, base_rss = run_rss(_argv(command, nodes[:1], work), ok=(0, 1))
        for size in sizes[1:]:
            took, rss = run_rss(_argv(command, nodes[:size], work), ok=(0, 1))
            last = size == sizes[-1]
            rows.append(Row("fleet", f"{command}{' (converged)' if command == 'install' else ''}, {size} nodes, "
                            "--parallel 50", secs(took), f"1 node {secs(base_time)}", took / base_time,
                            "<= 3x" if last else "", took / base_time <= TARGET if last else None))
            if last:
                rows.append(Row("fleet", f"{command}: peak RSS of gpunode, {size} nodes", f"{rss / 1024:.0f} MiB",
                                f"1 node {base_rss / 1024:.0f} MiB", rss / base_rss))
    return rows
