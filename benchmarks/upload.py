"""Upload: a file through gpunode's upload path (SSHConnection.upload: streamed into a temp file on the node,
sha256-verified there, then renamed into place) against `scp` of the same file to the same sshd (the reference).

Rounds are interleaved (scp, `ssh node true`, gpunode with the file's sha256 known as the driver step passes it,
gpunode hashing what it sends as other callers do, gpunode with the sha256 known on a node without python3, then
again), each figure is the median of its rounds, and every copy is checked with sha256sum on the node. The node has
python3 on PATH (the simulator's private interpreter), as Ubuntu, Debian with its usual tools and RHEL (dnf) nodes
do: with it the node hashes a large upload as it arrives; the third way takes it away (openssl then hashes the temp
file as `cat` writes it). Client CPU (user+system) is gpunode's own process's for its ways, scp's and its ssh's for
scp. gpunode's connection is open before its clock starts, as in a run (the
probe opened it), so scp's reference time is less its log-in (the median `ssh node true`). With `latency`, the same again through the +50 ms relay, run in a process of its own
(in this one it would share the GIL with paramiko, which scp never does). The test files live in /var/tmp and are
deleted at the end, as are the copies on the node."""

from __future__ import annotations

import hashlib
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.measure import Row, run
from gpunode.connection.ssh import SSHConnection, SSHOptions
from tests.nodesim.node import SimNode

TARGET = 0.9
PYTHON = "/opt/nodesim/python/bin/python3"  # the simulator's private interpreter, as the node's python3
ROOT = Path(__file__).resolve().parent.parent


def bench(node: SimNode, sizes: list[int], rounds: int = 3, latency: bool = False,
          work: Path | None = None) -> list[Row]:
    rows: list[Row] = []
    links: list[tuple[str, int, str]] = [("", node.port, node.known_hosts)]
    relay = None
    if latency:
        relay = _Relay(node.port)
        known = Path(work or "/var/tmp") / f"known_hosts-upload-{relay.port}"
        known.write_text(f"[127.0.0.1]:{relay.port} " + " ".join(Path(node.known_hosts).read_text().split()[1:3]) + "\n")
        links.append((", +50 ms each way", relay.port, str(known)))
    try:
        for label, port, known_hosts in links:
            for megabytes in sizes:
                rows += _one(node, port, known_hosts, megabytes, rounds, label)
    finally:
        if relay:
            relay.stop()
    return rows


def _one(node: SimNode, port: int, known_hosts: str, megabytes: int, rounds: int, label: str) -> list[Row]:
    local = Path(f"/var/tmp/gpunode-bench-{os.getpid()}.bin")
    digest = hashlib.sha256()
    times: dict[str, list[float]] = {"scp": [], "ssh": [], "known": [], "hashed": [], "nopython": []}
    cpu: dict[str, list[float]] = {name: [] for name in times}
    python3 = node.root / "usr/bin/python3"
    if not python3.is_symlink():
        os.symlink(PYTHON, python3)
    try:
        with open(local, "wb") as fh:
            for _ in range(megabytes):
                block = os.urandom(1 << 20)
                digest.update(block)
                fh.write(block)
        want = digest.hexdigest()
        options = SSHOptions(identity=[node.key_path], known_hosts=[known_hosts])
        common = ["-i", node.key_path, "-o", f"UserKnownHostsFile={known_hosts}", "-o", "StrictHostKeyChecking=yes",
                  "-o", "BatchMode=yes"]
        scp = ["scp", "-q", "-P", str(port), *common, str(local), "root@127.0.0.1:/var/tmp/scp.bin"]
        ssh = ["ssh", "-p", str(port), *common, "root@127.0.0.1", "true"]
        with SSHConnection(f"root@127.0.0.1:{port}", options).connect() as conn:
            conn.run(["true"], timeout=60)  # connected and checked before the clock starts, as scp's is inside its time
            ways: dict[str, Callable[[], object]] = {
                "scp": lambda: run(scp),
                "ssh": lambda: run(ssh),
                "known": lambda: conn.upload(local, "/var/tmp/gpunode.bin", sha256=want),
                "hashed": lambda: conn.upload(local, "/var/tmp/gpunode.bin"),
                "nopython": lambda: conn.upload(local, "/var/tmp/gpunode.bin", sha256=want),
            }
            for _ in range(rounds):
                for name, way in ways.items():
                    if name == "nopython":
                        python3.unlink()
                    child = name in ("scp", "ssh")
                    used = _cpu(child)
                    start = time.perf_counter()
                    try:
                        way()
                    finally:
                        if name == "nopython":
                            os.symlink(PYTHON, python3)
                    times[name].append(time.perf_counter() - start)
                    cpu[name].append(_cpu(child) - used)
                    if name != "ssh":
                        _check(node, "/var/tmp/scp.bin" if name == "scp" else "/var/tmp/gpunode.bin", want)
    finally:
        local.unlink(missing_ok=True)
        if python3.is_symlink():
            python3.unlink()
        for name in ("scp.bin", "gpunode.bin"):
            if node.exists(f"var/tmp/{name}"):
                node.remove(f"var/tmp/{name}")
    # gpunode's connection is open before its clock starts (in a run, the probe opened it); scp's time includes
    # connecting and logging in: that (the median `ssh node true`, a little more than scp's share) is taken off
    connecting = statistics.median(times["ssh"])
    ref = max(statistics.median(times["scp"]) - connecting, 1e-3)
    rows = []
    scp_cpu = statistics.median(cpu["scp"])
    for name, what in (("known", "sha256 known (the driver's .run)"), ("hashed", "hashed while sent"),
                       ("nopython", "sha256 known, node without python3 (openssl follows the file cat writes)")):
        ours = statistics.median(times[name])
        ratio = ref / ours  # throughput ratio: same bytes, so the inverse of the time ratio
        rows.append(Row("upload", f"{megabytes} MB{label}, {what}; verified on the node; median of {rounds} "
                        "interleaved rounds", f"{megabytes / ours:.0f} MB/s",
                        f"scp {megabytes / ref:.0f} MB/s (less its log-in, ssh true {connecting:.2f} s)",
                        ratio, f">= {TARGET}x", ratio >= TARGET))
        used = statistics.median(cpu[name])
        rows.append(Row("upload", f"{megabytes} MB{label}, {what}: client CPU (user+system), median",
                        f"{used:.2f} s", f"scp and its ssh {scp_cpu:.2f} s (log-in included)", used / scp_cpu))
    return rows


def _cpu(children: bool = False) -> float:
    """CPU seconds (user+system) of this process (all its threads), or of its waited-for children (scp and the
    ssh it runs)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN if children else resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _check(node: SimNode, path: str, want: str) -> None:
    code, out, err = node.ssh(f"sha256sum {path}", timeout=300)
    if code != 0 or out.split()[0] != want:
        raise RuntimeError(f"{path} on the node does not match the local file: {out or err}")


class _Relay:
    """benchmarks/relay.py's DelayRelay in a child process (stopped by its PID)."""

    def __init__(self, target_port: int) -> None:
        code = ("import sys, time; from benchmarks.relay import DelayRelay; "
                f"r = DelayRelay({target_port}, delay=0.05, lifetime=1800); print(r.port, flush=True); "
                "sys.stdin.read(); r.stop()")
        self.proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())

    def stop(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
