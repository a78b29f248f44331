"""The makeself archive an NVIDIA .run is: its shell header, and what `sh FILE --check` verifies, done here in
Python without running the file."""

from __future__ import annotations

import hashlib
import os
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

from gpunode.artifacts import DownloadError
from gpunode.record import Frozen

CHUNK = 1 << 20
HEADER_MAX = 1 << 20  # makeself headers are ~20-40 KiB of shell

_LABEL = re.compile(r"Linux-(?P<arch>x86_64|aarch64)\s+(?P<version>\d+\.\d+(?:\.\d+)?)")


@dataclass(frozen=True, eq=False, repr=False)
class MakeselfHeader(Frozen):
    label: str
    target_dir: str
    offset: int  # where the payload starts (bytes)
    filesizes: tuple[int, ...]
    crcs: tuple[str, ...]
    md5s: tuple[str, ...]
    shas: tuple[str, ...]
    total_size: int | None
    unpacked_kb: int | None = None  # what the payload takes once extracted ("Uncompressed size: N KB")

    @property
    def arch_version(self) -> tuple[str, str] | None:
        """From the label NVIDIA gives its archives: '... for Linux-x86_64 535.129.03'."""
        match = _LABEL.search(self.label) or _LABEL.search(self.target_dir.replace("-", " ", 2))
        return (match["arch"], match["version"]) if match else None


def _field(text: str, name: str) -> str | None:
    match = re.search(rf'^{name}="([^"\n]*)"', text, re.M)
    return match.group(1) if match else None


def read_header(path: str | os.PathLike[str]) -> MakeselfHeader:
    """Parse the shell header of a makeself archive (NVIDIA's 2.1.x-derived one or makeself 2.4)."""
    with open(path, "rb") as fh:
        head = fh.read(HEADER_MAX)
    text = head.decode("latin-1")
    if not text.startswith("#!") or "Makeself" not in text[:4096] and "makeself" not in text[:4096]:
        raise DownloadError(f"{path} is not a makeself archive (an NVIDIA .run file starts with a shell header)",
                            fix="check the file: an HTML error page or a truncated download is not an installer")
    skip = _field(text, "skip")
    if skip is None or not skip.isdigit():  # older makeself: `head -n 573 "$1"` with the count inline
        match = re.search(r'head -n (\d+) "\$[01]"', text)
        skip = match.group(1) if match else None
    sizes = _field(text, "filesizes")
    if skip is None or sizes is None or not all(s.isdigit() for s in sizes.split()):
        raise DownloadError(f"{path}: makeself header without a payload offset or file sizes",
                            fix="the file is damaged or not an NVIDIA installer; download it again")
    lines = head.split(b"\n")
    if len(lines) <= int(skip):
        raise DownloadError(f"{path}: the makeself header is truncated", fix="download the file again")
    offset = sum(len(line) + 1 for line in lines[: int(skip)])
    total = _field(text, "totalsize")
    return MakeselfHeader(
        label=_field(text, "label") or "",
        target_dir=_field(text, "targetdir") or "",
        offset=offset,
        filesizes=tuple(int(s) for s in sizes.split()),
        crcs=tuple((_field(text, "CRCsum") or "").split()),
        md5s=tuple((_field(text, "MD5") or "").split()),
        shas=tuple((_field(text, "SHA") or "").split()),
        total_size=int(total) if total and total.isdigit() else None,
        unpacked_kb=int(unpacked.group(1)) if (unpacked := re.search(r"Uncompressed size: (\d+) KB", text)) else None,
    )


_BITREV = bytes(int(f"{i:08b}"[::-1], 2) for i in range(256))


def _rev32(value: int) -> int:
    return int(f"{value:032b}"[::-1], 2)


class PosixCksum:
    """POSIX `cksum` CRC (what makeself stores in CRCsum). It is the MSB-first CRC-32; zlib computes the
    bit-reflected one, so feeding zlib bit-reversed bytes and reversing the result gives the same value at
    C speed (a pure-Python CRC over a 300 MB driver would take minutes)."""

    def __init__(self) -> None:
        self._crc = 0  # reflected register, initial value 0, no final xor until value()
        self.length = 0

    def update(self, data: bytes) -> None:
        self._crc = zlib.crc32(data.translate(_BITREV), self._crc ^ 0xFFFFFFFF) ^ 0xFFFFFFFF
        self.length += len(data)

    def value(self) -> int:
        length = self.length
        tail = bytearray()
        while length:
            tail.append(length & 0xFF)
            length >>= 8
        crc = zlib.crc32(bytes(tail).translate(_BITREV), self._crc ^ 0xFFFFFFFF) ^ 0xFFFFFFFF
        return _rev32(crc) ^ 0xFFFFFFFF


def _segments(path: str | os.PathLike[str], offset: int, sizes: tuple[int, ...]) -> Iterator[Iterator[bytes]]:
    with open(path, "rb") as fh:
        fh.seek(offset)
        for size in sizes:
            def chunks(left: int = size) -> Iterator[bytes]:
                while left > 0:
                    data = fh.read(min(CHUNK, left))
                    if not data:
                        return
                    left -= len(data)
                    yield data
            yield chunks()


def _want(values: tuple[str, ...], i: int) -> str:
    value = values[i] if i < len(values) else ""
    return "" if set(value) <= {"0"} else value  # makeself writes zeros for a sum it did not compute


def check_makeself(path: str | os.PathLike[str], header: MakeselfHeader | None = None) -> list[str]:
    """What `sh FILE --check` verifies, done here: payload size, then each embedded SHA256, MD5 and CRC.
    Returns what was checked; raises DownloadError on the first mismatch."""
    header = header or read_header(path)
    size = os.path.getsize(path)
    payload = size - header.offset
    if header.total_size is not None and payload != header.total_size:
        raise DownloadError(f"{path}: the archive is {payload} bytes after its header, the header says "
                            f"{header.total_size}: truncated or altered", fix="download it again")
    if payload < sum(header.filesizes):
        raise DownloadError(f"{path}: the archive is shorter than its header says ({payload} < "
                            f"{sum(header.filesizes)} bytes): truncated", fix="download it again")
    checked: set[str] = set()
    for i, chunks in enumerate(_segments(path, header.offset, header.filesizes)):
        sha, md5, crc = hashlib.sha256(), hashlib.md5(usedforsecurity=False), PosixCksum()
        for data in chunks:
            sha.update(data)
            md5.update(data)
            crc.update(data)
        for kind, want, got in (("SHA256", _want(header.shas, i).lower(), sha.hexdigest()),
                                ("MD5", _want(header.md5s, i).lower(), md5.hexdigest()),
                                ("CRC", _want(header.crcs, i), str(crc.value()))):
            if not want:
                continue
            if got != want:
                raise DownloadError(f"{path}: makeself {kind} mismatch (embedded {want}, computed {got}): "
                                    "the archive is corrupt", fix="download it again")
            checked.add(kind)
    if not checked:
        raise DownloadError(f"{path}: the makeself archive carries no checksum to verify",
                            fix="use an official NVIDIA .run file, or pass --sha256 with its published checksum")
    return [f"makeself {kind} OK" for kind in ("SHA256", "MD5", "CRC") if kind in checked]
