"""gpunode benchmarks on node-simulator nodes (real sshd on 127.0.0.1; needs root and openssh-server, like the
integration tests). One entry point: `nox -s bench` (or `python -m benchmarks.bench`). Prints a table and
writes each section's rows into docs/benchmarks.md (or --output) with the machine it ran on, in place of that
section's earlier rows; the sections not run keep theirs (`merged`). Every figure is measured in this run and shown
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
    done: dict[str, list[Row]] = {}  # the rows of each section run, by section
    with tempfile.TemporaryDirectory(prefix="gpunode-bench-", dir="/var/tmp") as tmp:
        work = Path(tmp)
        # An installed gpunode has its .pyc files (pip compiles them). Where PYTHONDONTWRITEBYTECODE is set (CI,
        # containers), every start-up figure would include compiling gpunode from source: the bench's processes
        # keep their bytecode in a cache of their own instead (the first, unmeasured run of each writes it).
        os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
        os.environ["PYTHONPYCACHEPREFIX"] = str(work / "pycache")
        if "startup" in wanted:
            done["startup"] = _report(startup.bench(max(10, 2 * args.repeat + 1)))
        if "imports" in wanted:
            done["imports"] = _report(imports.bench(args.repeat))
        if "roundtrips" in wanted or "upload" in wanted or "probe" in wanted:
            started = nodes.start(1, log_level="DEBUG1", prefix="bench-rt")
            try:
                if "probe" in wanted:
                    done["probe"] = _report(probe.bench(started[0], args.repeat))
                if "roundtrips" in wanted:
                    done["roundtrips"] = _report(roundtrips.bench(started[0], work, args.repeat, args.latency))
                if "upload" in wanted:
                    done["upload"] = _report(upload.bench(started[0], [int(n) for n in args.upload_mb.split(",")],
                                                          max(3, args.repeat), args.latency, work))
            finally:
                nodes.stop(started)
        if "fleet" in wanted:
            started = nodes.start(max(sizes), prefix="bench-fl")
            try:
                done["fleet"] = _report(fleet.bench(started, sizes, work, max(1, args.repeat)))
            finally:
                nodes.stop(started)
        if "realvm" in wanted and args.realvm_ssh_config:
            done["realvm"] = _report(realvm.bench(args.realvm_ssh_config, args.realvm_host, args.repeat, work))
    print(table([row for rows in done.values() for row in rows]))
    flags = " ".join(sys.argv[1:]) or "(defaults)"
    path = Path(args.output)
    path.write_text(merged(path.read_text() if path.exists() else "", machine(load), flags,
                           {name: table(rows) for name, rows in done.items()}))
    print(f"written to {path}")
    return 0


def _report(rows: list[Row]) -> list[Row]:
    for row in rows:
        print("  " + " | ".join(c for c in row.cells() if c), flush=True)
    return rows


RESULTS, RESULTS_END = "<!-- results -->", "<!-- results end -->"
_SECTION = "<!-- section {} -->"


def merged(old: str, about: list[str], flags: str, tables: dict[str, str]) -> str:
    """`old` (the results file's text, "" for none) with the results of the sections in `tables` (section name:
    its table) in place of theirs: the results block holds one part per section, each with the command and the
    machine of the run that measured it, so a run of some sections keeps what earlier runs wrote for the others.
    What precedes the block and what follows its end stays as it was; so does the text after an older file's
    `<!-- results -->` that has no end mark (it follows the new block's end)."""
    head, marker, rest = old.partition(RESULTS)
    if not marker:
        head, rest = (old or "# Benchmarks\n\n"), ""
    block, ended, tail = rest.partition(RESULTS_END)
    if not ended:  # a block written before sections were kept apart: kept whole, after the new block
        block, tail = "", "\n" + rest.replace("\n## Last run\n", "\n## An earlier run\n", 1).lstrip("\n")
    parts = {}
    for chunk in block.split("<!-- section ")[1:]:
        name, _, body = chunk.partition(" -->")
        parts[name] = _SECTION.format(name) + body.rstrip() + "\n"
    for name, text in tables.items():
        parts[name] = (_SECTION.format(name) + f"\n### {name}\n\n`python -m benchmarks.bench {flags}`\n\n"
                       + "".join(f"- {line}\n" for line in about) + "\n" + text + "\n")
    order = [name for name in SECTIONS if name in parts] + sorted(set(parts) - set(SECTIONS))
    body = "\n".join(parts[name] for name in order)
    return (head.rstrip() + "\n\n" + RESULTS + "\n## Last run\n\nEach section as its latest run measured it.\n\n"
            + body + "\n" + RESULTS_END + (tail if tail.strip() else "\n"))


if __name__ == "__main__":
    raise SystemExit(main())
