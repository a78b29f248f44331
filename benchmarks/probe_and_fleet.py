"""Benchmarks on node-simulator nodes over real sshd (needs root and openssh-server, like the integration tests).

Prints ratios against a reference measured in the same run, never absolute targets:

1. facts: gpunode's one batched probe vs. the same sections sent as one SSH command each (the reference).
2. fleet: `plan` on N nodes with --parallel N vs. --parallel 1 (the reference).

    python benchmarks/probe_and_fleet.py [--nodes 8] [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpunode.connection.ssh import SSHConnection, SSHOptions  # noqa: E402
from gpunode.facts import gather  # noqa: E402
from gpunode.facts.probe import all_sections  # noqa: E402
from gpunode.fleet import result_from_report, run_fleet  # noqa: E402
from gpunode.inventory import InventoryHost  # noqa: E402
from gpunode.options import Options  # noqa: E402
from gpunode.runner import plan_pipeline  # noqa: E402
from gpunode.shell import Script  # noqa: E402
from gpunode.steps import PIPELINE  # noqa: E402
from tests.nodesim.node import SimNode  # noqa: E402
from tests.nodesim.profiles import get_profile  # noqa: E402
from tests.nodesim.rootfs import missing_requirements  # noqa: E402


def connect(node: SimNode) -> SSHConnection:
    return SSHConnection(f"root@127.0.0.1:{node.port}",
                         SSHOptions(identity=[str(node.key_path)], known_hosts=[str(node.known_hosts)])).connect()


def timed(fn, repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def bench_probe(node: SimNode, repeat: int) -> None:
    sections = all_sections()
    with connect(node) as conn:
        batched = timed(lambda: gather(conn), repeat)
        one_by_one = timed(lambda: [conn.run(Script(snippet.replace("@FILE@", "@x@file"), name=name))
                                    for name, snippet in sections.items()], repeat)
    print(f"facts  ({len(sections)} sections, median of {repeat}): batched probe {batched * 1000:.0f} ms; "
          f"one command per section {one_by_one * 1000:.0f} ms; speed-up x{one_by_one / batched:.1f}")


def bench_fleet(nodes: list[SimNode], repeat: int) -> None:
    hosts = [InventoryHost(f"n{i}") for i in range(len(nodes))]
    by_name = {h.name: n for h, n in zip(hosts, nodes, strict=True)}

    def work(host, reporter, log):
        with connect(by_name[host.name]) as conn:
            return result_from_report(host.name, plan_pipeline(conn, PIPELINE, Options(), reporter))

    serial = timed(lambda: run_fleet(hosts, work, parallel=1), repeat)
    parallel = timed(lambda: run_fleet(hosts, work, parallel=len(hosts)), repeat)
    print(f"fleet  (plan, {len(hosts)} nodes, median of {repeat}): --parallel 1 {serial:.2f} s; "
          f"--parallel {len(hosts)} {parallel:.2f} s; speed-up x{serial / parallel:.1f} "
          f"(on a 2-core machine where the nodes' shells also run)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    missing = missing_requirements()
    if missing:
        print("cannot run: " + "; ".join(missing))
        return 2
    profiles = ["ubuntu-22.04-t4", "rocky-9-t4", "ubuntu-24.04-h100x8", "debian-12-rtx4090"]
    nodes = [SimNode(get_profile(profiles[i % len(profiles)]), name=f"bench-{i}") for i in range(args.nodes)]
    try:
        for node in nodes:
            node.start()
        bench_probe(nodes[0], args.repeat)
        bench_fleet(nodes, args.repeat)
    finally:
        for node in nodes:
            node.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
