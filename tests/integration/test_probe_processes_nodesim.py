"""The processes the RUN probe's first round trip (all a converged plan or install reads) starts on a node: each
costs a slow node tens of milliseconds (issue 25; benchmarks/realvm.py counts them on the real Debian VM). Counted
here deterministically on a simulated converged node: the probe runs in the node's root in a PID namespace of its
own, where PIDs are handed out one after the other, so the PID of a last process says how many were started
before it. The simulator's tools are shell scripts that answer a query in one process, as the real tools do
(tests/nodesim/test_query_cost.py); the figure is a guard, not a measure: it fails when the probe starts more than
it does now."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from gpunode.facts.probe import build_probe
from gpunode.facts.registry import CHECK, RUN
from tests.golden.test_plan_golden import CASES

pytestmark = pytest.mark.integration

# processes started by the first round trip on the converged node below (327 before the probe read small files
# itself and asked the kernel release and the journal once, 301 before it asked dpkg once, picked systemctl's answer
# without awk and ran the tools, GPU services, version locks and fabric manager offers in its own shell, 287 before
# the simulator's shims cost what the real tools cost, one process per query: its `systemctl show` alone had 206;
# then the machine came from the release's uname and ls/grep ran only where there are NVSwitches or InfiniBand
# devices, 2026-11-25; 34 before every file group and the initramfs took their mtimes from one shared `stat`;
# the real Debian 12 VM starts 14; 32 still after `systemctl list-units` told `show` which units to ask about
# and the shell picked modinfo's lines without grep, 31 with /dev/char's links read without sed; the simulator's
# /bin/sh forks once for `$(cmd 2>/dev/null)` as for `{ x=$(cmd); } 2>/dev/null`: bash's second fork for the former
# shows only on the real VM, 21 -> 15 there); lower it when the probe gets cheaper
MOST = 31
CASE = "ubuntu2204-t4-installed"


def _started(root: str, body: str) -> int:
    marker = "gpunode-last-pid"
    out = subprocess.run(
        ["unshare", "--pid", "--fork", "chroot", root, "/usr/bin/env", "-i", "HOME=/root",
         "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "/bin/sh", "-c",
         body + f"\n/bin/sh -c 'echo {marker} $$'\n"],
        capture_output=True, text=True, timeout=120, check=False).stdout
    # PID 1 is the probe's shell, the last process the one that printed its PID
    return int(out.rsplit(marker, 1)[1].split()[0]) - 2


def test_the_run_probe_starts_no_more_processes_than_it_does_now(sim_node):
    assert shutil.which("unshare"), "unshare (util-linux) is needed to count a probe's processes"
    _, profile, overrides, _ = next(c for c in CASES if c[0] == CASE)
    node = sim_node(profile, **overrides)
    body = build_probe(probe=RUN, part=CHECK)[0].body
    counts = {_started(str(node.root), body) for _ in range(2)}
    assert len(counts) == 1, f"the count is not deterministic here: {counts}"
    count = counts.pop()
    assert count > 0 and _started(str(node.root), "true") == 0  # the count counts
    assert count <= MOST, (f"the RUN probe's first round trip now starts {count} processes on the simulated "
                           f"converged node, more than {MOST}: read files with the shell's own read (registry.CAT), "
                           "ask a tool once (registry.SHARED), or run the section in the probe's shell")
