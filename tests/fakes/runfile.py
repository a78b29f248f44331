"""A makeself archive in the format of NVIDIA's .run files, built here byte by byte (no makeself needed)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from gpunode.artifacts.makeself import PosixCksum

VERSION = "535.129.03"
NAME = f"NVIDIA-Linux-x86_64-{VERSION}.run"


def build_run(path: Path, version: str = VERSION, arch: str = "x86_64", payload: bytes | None = None,
              sha: bool = False) -> Path:
    """Header like NVIDIA's (makeself 2.1.x: the line count inline in `head -n N "$1"`), then the payload."""
    payload = payload if payload is not None else os.urandom(3000) + b"payload-end"
    crc = PosixCksum()
    crc.update(payload)
    lines = [
        "#!/bin/sh",
        "# This script was generated using Makeself 2.1.5",
        "",
        f'CRCsum="{crc.value()}"',
        f'MD5="{hashlib.md5(payload).hexdigest()}"',
        *([f'SHA="{hashlib.sha256(payload).hexdigest()}"'] if sha else []),
        "TMPROOT=${TMPDIR:=/tmp}",
        "",
        f'label="NVIDIA Accelerated Graphics Driver for Linux-{arch} {version}"',
        'script="./nvidia-installer"',
        f'targetdir="NVIDIA-Linux-{arch}-{version}"',
        f'filesizes="{len(payload)}"',
        "keep=y",
        "",
        "MS_Check()",
        "{",
        '    offset=`head -n 000 "$1" | wc -c | tr -d " "`',
        "}",
        "exit 0",
    ]
    at = next(i for i, line in enumerate(lines) if "head -n 000" in line)
    lines[at] = lines[at].replace("000", f"{len(lines):03d}")
    path.write_bytes(("\n".join(lines) + "\n").encode() + payload)
    return path
