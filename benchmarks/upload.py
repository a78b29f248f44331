"""Upload: a file through gpunode's upload path (SSHConnection.upload: staged, sha256-verified on the node,
installed) against `scp` of the same file to the same sshd (the reference). The test file lives in /var/tmp and
is deleted at the end, as are both copies on the node."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

from benchmarks.measure import Row, run
from gpunode.connection.ssh import SSHConnection, SSHOptions
from tests.nodesim.node import SimNode

TARGET = 0.9


def bench(node: SimNode, megabytes: int) -> list[Row]:
    local = Path(f"/var/tmp/gpunode-bench-{os.getpid()}.bin")
    digest = hashlib.sha256()
    try:
        with open(local, "wb") as fh:
            for _ in range(megabytes):
                block = os.urandom(1 << 20)
                digest.update(block)
                fh.write(block)
        want = digest.hexdigest()
        start = time.perf_counter()
        run(["scp", "-q", "-P", str(node.port), "-i", node.key_path, "-o", f"UserKnownHostsFile={node.known_hosts}",
             "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", str(local), "root@127.0.0.1:/var/tmp/scp.bin"])
        scp = time.perf_counter() - start
        _check(node, "/var/tmp/scp.bin", want)
        options = SSHOptions(identity=[node.key_path], known_hosts=[node.known_hosts])
        with SSHConnection(f"root@127.0.0.1:{node.port}", options).connect() as conn:
            start = time.perf_counter()
            conn.upload(local, "/var/tmp/gpunode.bin")
            ours = time.perf_counter() - start
        _check(node, "/var/tmp/gpunode.bin", want)
    finally:
        local.unlink(missing_ok=True)
        for name in ("scp.bin", "gpunode.bin"):
            if node.exists(f"var/tmp/{name}"):
                node.remove(f"var/tmp/{name}")
    ratio = scp / ours  # throughput ratio: same bytes, so the inverse of the time ratio
    return [Row("upload", f"{megabytes} MB through gpunode's upload (sha256 verified on the node)",
                f"{megabytes / ours:.0f} MB/s", f"scp {megabytes / scp:.0f} MB/s", ratio, f">= {TARGET}x",
                ratio >= TARGET)]


def _check(node: SimNode, path: str, want: str) -> None:
    code, out, err = node.ssh(f"sha256sum {path}", timeout=300)
    if code != 0 or out.split()[0] != want:
        raise RuntimeError(f"{path} on the node does not match the local file: {out or err}")
