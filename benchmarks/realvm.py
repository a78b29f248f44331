"""The probe and a converged check on a REAL userland: the Debian 12 VM of the real-OS tier (tests/realos: real
systemd, apt/dpkg, docker.io, containerd; booted with `python -m tests.realos.vm up`, which prints its ssh
config). Everything runs against that VM through its ssh config entry, interleaved so that load hits all alike:

- probe: the RUN probe's first round trip (all a converged plan or install reads; the late facts come in a
  second one only when a decision reads them), the whole RUN probe, the FULL probe (doctor) and
  benchmarks.probe.MINIMAL over ONE SSH connection; wall time and node CPU (the shell's `times`: user + system of everything it started);
- plan: `gpunode plan` (the RUN probe and the converged check install runs, without changing anything) against
  the lower bound, one `ssh` running MINIMAL; against `ansible-playbook` with its normal modules (the VM has
  python3: stat, command, slurp, service_facts), checking the same things; and against pyinfra
  with its facts, when the bench venv has them.

The VM runs under QEMU with TCG (no KVM here) on 1 vCPU of a 2-core machine shared with other work: every
process start costs tens of milliseconds there, so the figures say how many processes a probe starts more than
what a real node would take. Ratios from one run are what to compare.

    python -m benchmarks.realvm --ssh-config /tmp/gpunode-realos-vm.*/vm/ssh_config [--host realos] [--repeat 3]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.measure import Row, ms, secs
from benchmarks.nodes import gpunode_bin
from benchmarks.probe import MINIMAL, PLAN_TARGET, cpu_of
from benchmarks.roundtrips import ANSIBLE_ENV, ROOT_VENV, TOOLS, _env
from gpunode.connection.ssh import SSHConnection, SSHOptions
from gpunode.facts import FULL, RUN
from gpunode.facts.probe import build_probe
from gpunode.facts.registry import CHECK
from gpunode.shell import Script

LOWER_TARGET = 1.5
# PIDs the node handed out while the script ran (the last PID in /proc/loadavg, before and after): the processes
# it started, threads of multi-threaded tools (docker) included. Deterministic where times are not (TCG).
_COUNT = "read _ _ _ _ gpunode_p1 < /proc/loadavg\n"
_COUNTED = 'read _ _ _ _ gpunode_p2 < /proc/loadavg; echo "gpunode-procs $((gpunode_p2 - gpunode_p1))"\n'

TCG = "VM under QEMU TCG, 1 vCPU on 2 shared cores"


def probe_rows(config: str, host: str, repeat: int) -> list[Row]:
    scripts = {"RUN probe, first round trip (all a converged plan or install reads)":
               build_probe(probe=RUN, part=CHECK)[0].body,
               "RUN probe, whole (both parts in one script, as before the split)": build_probe(probe=RUN)[0].body,
               "FULL probe (doctor, verify)": build_probe(probe=FULL)[0].body,
               "minimal script": MINIMAL}
    wall: dict[str, list[float]] = {k: [] for k in scripts}
    cpu: dict[str, list[float]] = {k: [] for k in scripts}
    procs: dict[str, list[int]] = {k: [] for k in scripts}
    with SSHConnection(host, SSHOptions(ssh_config=config)).connect() as conn:
        for _ in range(repeat + 1):  # the first round warms the page cache and is not counted
            for name, body in scripts.items():
                start = time.perf_counter()
                result = conn.run(Script(_COUNT + body + "\n" + _COUNTED + "times\n", name="bench-probe"), timeout=600)
                wall[name].append(time.perf_counter() - start)
                cpu[name].append(cpu_of(result.stdout))
                procs[name].append(int(result.stdout.rsplit("gpunode-procs ", 1)[1].split()[0]))
    med = {k: (statistics.median(v[1:]), statistics.median(cpu[k][1:])) for k, v in wall.items()}
    base_wall, base_cpu = med["minimal script"]
    rows = []
    for name in scripts:
        if name == "minimal script":
            continue
        took, used = med[name]
        run_probe = name.startswith("RUN probe, first")
        rows.append(Row("real VM", f"{name}: wall ({TCG}; median of {repeat})", ms(took), f"minimal {ms(base_wall)}",
                        took / base_wall, f"<= {PLAN_TARGET:.0f}x" if run_probe else "",
                        took / base_wall <= PLAN_TARGET if run_probe else None))
        rows.append(Row("real VM", f"{name}: node CPU (shell's times)", ms(used), f"minimal {ms(base_cpu)}",
                        used / base_cpu if base_cpu else None))
        count, base_count = max(procs[name][1:]), max(procs["minimal script"][1:])
        rows.append(Row("real VM", f"{name}: processes started on the node (PIDs used, threads included)",
                        str(count), f"minimal {base_count}", count / base_count if base_count else None))
    return rows


def _ansible(config: str, host: str, work: Path) -> list[str] | None:
    playbook = shutil.which("ansible-playbook", path=str(ROOT_VENV / "bin"))
    if not playbook:
        return None
    inv = work / "realvm-ansible.ini"
    inv.write_text(f"[gpu]\n{host} ansible_python_interpreter=/usr/bin/python3\n"
                   f"[gpu:vars]\nansible_ssh_common_args='-F {config} -o ControlMaster=auto -o ControlPersist=60s "
                   f"-o ControlPath={work}/cm-%C'\n")
    return [playbook, "-i", str(inv), str(TOOLS / "converged_modules.yml")]


def _pyinfra(config: str, host: str, work: Path) -> list[str] | None:
    tool = shutil.which("pyinfra", path=str(ROOT_VENV / "bin"))
    if not tool:
        return None
    ssh = _ssh_fields(config, host)
    inv = work / "pyinfra_realvm.py"
    inv.write_text(f"gpu = [({ssh['hostname']!r}, {{'ssh_port': {int(ssh['port'])}, 'ssh_user': {ssh['user']!r}, "
                   f"'ssh_key': {ssh['identityfile']!r}, 'ssh_known_hosts_file': {ssh['userknownhostsfile']!r}, "
                   "'ssh_strict_host_key_checking': 'yes'})]\n")
    return [tool, "-y", str(inv), str(TOOLS / "converged_pyinfra_facts.py")]


def _ssh_fields(config: str, host: str) -> dict[str, str]:
    out = subprocess.run(["ssh", "-G", "-F", config, host], capture_output=True, text=True, check=True).stdout
    return {k: v for k, _, v in (line.partition(" ") for line in out.splitlines())}


def plan_rows(config: str, host: str, repeat: int, work: Path) -> list[Row]:
    runs = {
        "gpunode plan": [gpunode_bin(), "plan", "--host", host, "--ssh-config", config],
        "lower bound": ["ssh", "-F", config, "-o", "BatchMode=yes", "-o", "ControlMaster=no", "-o", "ControlPath=none",
                        host, MINIMAL],
    }
    envs = {"gpunode plan": None, "lower bound": None}
    for name, argv in (("ansible-playbook", _ansible(config, host, work)), ("pyinfra", _pyinfra(config, host, work))):
        if argv:
            runs[name], envs[name] = argv, _env(ANSIBLE_ENV if name == "ansible-playbook" else {})
    times: dict[str, list[float]] = {k: [] for k in runs}
    for round_ in range(repeat + 1):
        for name, argv in runs.items():
            start = time.perf_counter()
            result = subprocess.run(argv, capture_output=True, text=True, env=envs[name], timeout=900)
            took = time.perf_counter() - start
            if result.returncode not in (0, 1):  # plan exits 1 when the node is not converged; that is its answer
                raise RuntimeError(f"{name} exited {result.returncode}:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
            if round_:
                times[name].append(took)
    med = {k: statistics.median(v) for k, v in times.items()}
    plan = med["gpunode plan"]
    rows = [Row("real VM", f"gpunode plan vs the lower bound ({TCG})", secs(plan),
                f"ssh + minimal script {secs(med['lower bound'])}", plan / med["lower bound"], f"<= {LOWER_TARGET}x",
                plan / med["lower bound"] <= LOWER_TARGET)]
    for name, target in (("ansible-playbook", 0.3), ("pyinfra", 0.5)):
        if name in med:
            rows.append(Row("real VM", f"gpunode plan vs {name} (normal modules / facts)", secs(plan),
                            f"{name} {secs(med[name])}", plan / med[name], f"<= {target}x", plan / med[name] <= target))
    return rows


def bench(config: str, host: str, repeat: int, work: Path) -> list[Row]:
    return probe_rows(config, host, repeat) + plan_rows(config, host, repeat, work)


def main() -> int:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ssh-config", required=True)
    parser.add_argument("--host", default="realos")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpunode-realvm-") as tmp:
        for part in (lambda: probe_rows(args.ssh_config, args.host, args.repeat),
                     lambda: plan_rows(args.ssh_config, args.host, args.repeat, Path(tmp))):
            for row in part():  # each part as soon as it is measured (the whole takes many minutes under TCG)
                print(" | ".join(c for c in row.cells() if c), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
