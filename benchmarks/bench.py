"""gpunode benchmarks on node-simulator nodes (real sshd on 127.0.0.1; needs root and openssh-server, like the
integration tests). One entry point: `nox -s bench` (or `python -m benchmarks.bench`). Prints a table and
writes it to docs/benchmarks.md with the machine it ran on. Every figure is measured in this run and shown
as a ratio to a reference measured in the same run; nothing is typed in.

    python -m benchmarks.bench [--latency] [--repeat 5] [--upload-mb 50,400] [--fleet 1,20,100] [--only SECTION]
                               [--realvm-ssh-config /tmp/gpunode-realos-vm.*/vm/ssh_config]

The real-VM section (benchmarks/realvm.py) runs when --realvm-ssh-config names a running real-OS VM
(`python -m tests.realos.vm up` prints it).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import fleet, imports, nodes, probe, realvm, roundtrips, startup, upload
from benchmarks.measure import HEADER, Row
from gpunode import __version__
from tests.nodesim.rootfs import missing_requirements

ROOT = Path(__file__).resolve().parent.parent
SECTIONS = ("startup", "imports", "probe", "roundtrips", "upload", "fleet", "realvm")


def machine(load: tuple[float, float, float]) -> list[str]:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor() or "unknown")
    mem = next((line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("MemTotal")), "0")
    ssh = subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr.strip()
    tools = []
    for name in ("ansible-playbook", "pyinfra"):
        path = roundtrips.ROOT_VENV / "bin" / name
        if path.exists():
            out = subprocess.run([str(path), "--version"], capture_output=True, text=True).stdout
            tools.append(out.splitlines()[0].strip() if out else name)
    return [f"date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; gpunode {__version__}",
            f"machine: {platform.system()} {platform.release()} {platform.machine()}; {os.cpu_count()} CPUs ({cpu}); "
            f"{int(mem) // 1024} MiB RAM; load average at start {load[0]:.2f}",
            f"python {platform.python_version()}; {ssh}; {'; '.join(tools) or 'ansible-core/pyinfra not installed'}"]


def table(rows: list[Row]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row.cells()) + " |" for row in rows]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--latency", action="store_true", help="also run round trips through a 50 ms relay")
    parser.add_argument("--repeat", type=int, default=5, help="runs per timed figure (start-up uses 2x+1)")
    parser.add_argument("--upload-mb", default="50,400", help="upload sizes in MB, comma-separated")
    parser.add_argument("--fleet", default="1,20,100", help="fleet sizes, the first is the reference")
    parser.add_argument("--realvm-ssh-config", help="ssh config of a running real-OS VM (tests/realos)")
    parser.add_argument("--realvm-host", default="realos")
    parser.add_argument("--only", action="append", choices=SECTIONS, help="run only this section (repeatable)")
    parser.add_argument("--output", default=str(ROOT / "docs" / "benchmarks.md"))
    args = parser.parse_args()
    missing = missing_requirements()
    if missing:
        print("cannot run: " + "; ".join(missing), file=sys.stderr)
        return 2
    load = os.getloadavg()
    wanted = args.only or list(SECTIONS)
    sizes = [int(n) for n in args.fleet.split(",")]
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="gpunode-bench-", dir="/var/tmp") as tmp:
        work = Path(tmp)
        # An installed gpunode has its .pyc files (pip compiles them). Where PYTHONDONTWRITEBYTECODE is set (CI,
        # containers), every start-up figure would include compiling gpunode from source: the bench's processes
        # keep their bytecode in a cache of their own instead (the first, unmeasured run of each writes it).
        os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
        os.environ["PYTHONPYCACHEPREFIX"] = str(work / "pycache")
        if "startup" in wanted:
            rows += _report(startup.bench(max(10, 2 * args.repeat + 1)))
        if "imports" in wanted:
            rows += _report(imports.bench(args.repeat))
        if "roundtrips" in wanted or "upload" in wanted or "probe" in wanted:
            started = nodes.start(1, log_level="DEBUG1", prefix="bench-rt")
            try:
                if "probe" in wanted:
                    rows += _report(probe.bench(started[0], args.repeat))
                if "roundtrips" in wanted:
                    rows += _report(roundtrips.bench(started[0], work, args.repeat, args.latency))
                if "upload" in wanted:
                    rows += _report(upload.bench(started[0], [int(n) for n in args.upload_mb.split(",")],
                                                 max(3, args.repeat), args.latency, work))
            finally:
                nodes.stop(started)
        if "fleet" in wanted:
            started = nodes.start(max(sizes), prefix="bench-fl")
            try:
                rows += _report(fleet.bench(started, sizes, work, max(1, args.repeat)))
            finally:
                nodes.stop(started)
        if "realvm" in wanted and args.realvm_ssh_config:
            rows += _report(realvm.bench(args.realvm_ssh_config, args.realvm_host, args.repeat, work))
    text = table(rows)
    print(text)
    _write(Path(args.output), machine(load), text)
    return 0


def _report(rows: list[Row]) -> list[Row]:
    for row in rows:
        print("  " + " | ".join(c for c in row.cells() if c), flush=True)
    return rows


def _write(path: Path, about: list[str], text: str) -> None:
    head = path.read_text().split("<!-- results -->")[0] if path.exists() else "# Benchmarks\n\n"
    flags = " ".join(a for a in sys.argv[1:]) or "(defaults)"
    body = (f"<!-- results -->\n## Last run\n\n`python -m benchmarks.bench {flags}`\n\n"
            + "\n".join(f"- {line}" for line in about) + "\n\n" + text + "\n")
    path.write_text(head.rstrip() + "\n\n" + body)
    print(f"written to {path}")


if __name__ == "__main__":
    raise SystemExit(main())
