"""SHA-256 of a file, and the `sha256sum` text format NVIDIA publishes its sums in."""

from __future__ import annotations

import hashlib
import os
import re

CHUNK = 1 << 20
SHA256 = re.compile(r"^[0-9a-fA-F]{64}$")


def sha256_file(path: str | os.PathLike[str]) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for data in iter(lambda: fh.read(CHUNK), b""):
            digest.update(data)
    return digest.hexdigest()


def parse_sha256sum(text: str, name: str) -> str | None:
    """`<hex>  <file>` lines (sha256sum format) -> the digest for `name` (or the only digest given)."""
    found: list[tuple[str, str]] = []
    for line in text.splitlines():
        parts = line.strip().split()
        if parts and SHA256.match(parts[0]):
            found.append((parts[0].lower(), parts[-1].lstrip("*") if len(parts) > 1 else ""))
    for digest, file in found:
        if file.rsplit("/", 1)[-1] == name:
            return digest
    return found[0][0] if len(found) == 1 else None


def sha256sum_line(digest: str, name: str) -> str:
    return f"{digest}  {name}\n"
