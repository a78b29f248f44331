"""The probe's cost on the node: wall time and node CPU of the RUN probe's first round trip (what a converged plan
or install gathers; the target is on it), the whole RUN probe in one script, the FULL probe (doctor, verify) and
MINIMAL, a hand-written script that reads only the facts a converged check needs
(the lower bound the issue measures against), each over the same SSH connection, interleaved so that load on
the machine hits all three alike. Node CPU is what the shell's `times` reports for itself and the commands it ran."""

from __future__ import annotations

import statistics
import time

from benchmarks.measure import Row, ms
from gpunode.connection.ssh import SSHConnection, SSHOptions
from gpunode.facts import FULL, RUN
from gpunode.facts.probe import build_probe
from gpunode.facts.registry import CHECK
from gpunode.shell import Script
from tests.nodesim.node import SimNode

# What a converged install has to look at, read in one shell with as few processes as will do.
MINIMAL = r"""cat /etc/os-release; uname -rm; id -u; cat /proc/sys/kernel/random/boot_id /proc/cmdline /proc/modules
cat /proc/driver/nvidia/version 2>/dev/null
dpkg-query -W -f='${db:Status-Abbrev}\t${Package}\t${Version}\n' 'nvidia*' 'libnvidia*' 2>/dev/null
systemctl is-active docker.service nvidia-persistenced.service 2>/dev/null
cat /etc/docker/daemon.json /etc/modprobe.d/*.conf /etc/modules-load.d/*.conf 2>/dev/null
nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null
cat /var/lib/gpunode/journal.json 2>/dev/null
true
"""
PLAN_TARGET = 2.0  # RUN probe against MINIMAL, on the node


def cpu_of(stdout: str) -> float:
    """User + system seconds of the shell and of its children: the two lines `times` printed last
    (`0m0.12s 0m0.05s`). The shell's own share counts: the probe reads small files with the shell's `read`."""
    total = 0.0
    for field in " ".join(stdout.strip().splitlines()[-2:]).split():
        minutes, _, seconds = field.rstrip("s").partition("m")
        total += int(minutes) * 60 + float(seconds)
    return total


def bench(node: SimNode, repeat: int) -> list[Row]:
    scripts = {"RUN probe, first round trip (all a converged plan or install reads)":
               build_probe(probe=RUN, part=CHECK)[0].body,
               "RUN probe, whole (both parts in one script, as before the split)": build_probe(probe=RUN)[0].body,
               "FULL probe (doctor, verify)": build_probe(probe=FULL)[0].body,
               "minimal script": MINIMAL}
    wall: dict[str, list[float]] = {k: [] for k in scripts}
    cpu: dict[str, list[float]] = {k: [] for k in scripts}
    options = SSHOptions(identity=[node.key_path], known_hosts=[node.known_hosts])
    with SSHConnection(f"root@127.0.0.1:{node.port}", options).connect() as conn:
        for _ in range(repeat + 1):  # the first round warms caches and is not counted
            for name, body in scripts.items():
                start = time.perf_counter()
                result = conn.run(Script(body + "\ntimes\n", name="bench-probe"), timeout=300)
                took = time.perf_counter() - start
                wall[name].append(took)
                cpu[name].append(cpu_of(result.stdout))
    med = {k: (statistics.median(v[1:]), statistics.median(cpu[k][1:])) for k, v in wall.items()}
    base_wall, base_cpu = med["minimal script"]
    rows = []
    for name in scripts:
        if name == "minimal script":
            continue
        took, used = med[name]
        run_probe = name.startswith("RUN probe, first")
        rows.append(Row("probe", f"{name}: wall, simulated node (median of {repeat})", ms(took),
                        f"minimal {ms(base_wall)}", took / base_wall,
                        f"<= {PLAN_TARGET:.0f}x" if run_probe else "", took / base_wall <= PLAN_TARGET if run_probe
                        else None))
        rows.append(Row("probe", f"{name}: node CPU (shell's times)", ms(used), f"minimal {ms(base_cpu)}",
                        used / base_cpu if base_cpu else None))
    return rows
