"""What to install on a node and how it gets here verified: `resolve` (pure, at plan time: plans show the URLs
and the cache path), `obtain` (the I/O, at apply time) and `verify` (every check on a local file)."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpunode.artifacts import DownloadError, ProgressBars, silent
from gpunode.artifacts.checksums import parse_sha256sum, sha256_file
from gpunode.artifacts.download import NotPublished, cache_lock, fetch, published_sha256, write_marker
from gpunode.artifacts.makeself import check_makeself, read_header
from gpunode.artifacts.naming import (
    MARKER_SUFFIX,
    beside,
    cache_path,
    default_cache_root,
    is_url,
    official_urls,
)
from gpunode.record import Frozen
from gpunode.versions import normalize_arch, runfile_name

if TYPE_CHECKING:
    import requests

_PLAIN_NAME = re.compile(r"^[\w.+-]+$", re.ASCII)


@dataclass(frozen=True, eq=False, repr=False)
class Source(Frozen):
    """Where the installer for one node comes from, resolved at plan time without I/O."""

    version: str
    arch: str
    urls: tuple[str, ...] = ()  # tried in order; empty for a local file
    local: str | None = None  # --driver-run PATH
    cache: str | None = None  # where a download lands
    sha256: str | None = None  # --sha256
    mirror: str | None = None

    @property
    def name(self) -> str:
        """The file's name, and its name on the node: NVIDIA's name when the local one is not plain ASCII."""
        name = Path(self.local or self.cache or "").name
        return name if _PLAIN_NAME.match(name) and not name.startswith("-") else runfile_name(self.version, self.arch)

    @property
    def path(self) -> str:
        """The local file that will be uploaded."""
        return self.local or self.cache or ""


def resolve(version: str, arch: str, *, driver_run: str | None = None, sha256: str | None = None,
            cache_root: str | Path | None = None, mirror: str | None = None) -> Source:
    arch = normalize_arch(arch)
    root = Path(cache_root) if cache_root else default_cache_root(env={})
    if driver_run and not is_url(driver_run):
        return Source(version, arch, local=driver_run, sha256=sha256)
    urls = (driver_run,) if driver_run else official_urls(version, arch, mirror)
    return Source(version, arch, urls=urls, cache=str(cache_path(root, version, arch, driver_run)), sha256=sha256,
                  mirror=mirror)


@dataclass(frozen=True, eq=False, repr=False)
class Verified(Frozen):
    path: str
    sha256: str
    size: int
    checks: tuple[str, ...]
    unpacked: int | None = None  # bytes the installer takes once extracted on the node (makeself's header)


def verify(path: str | Path, source: Source, published: str | None = None, published_from: str = "") -> Verified:
    """All checks on a local file; raises DownloadError on any mismatch. The file is never executed."""
    path = Path(path)
    if not path.is_file():
        what = "is a directory" if path.is_dir() else "does not exist"
        raise DownloadError(f"{path} {what}", fix="check the --driver-run path: it must name the .run file")
    try:
        return _verify(path, source, published, published_from)
    except OSError as exc:
        raise DownloadError(f"cannot read {path}: {(exc.strerror or type(exc).__name__).lower()}",
                            fix="make the file readable by the user running gpunode") from None


def _verify(path: Path, source: Source, published: str | None, published_from: str) -> Verified:
    header = read_header(path)
    found = header.arch_version
    if found and found[0] != source.arch:
        raise DownloadError(f"{path.name} is an installer for {found[0]}, the node is {source.arch}",
                            fix=f"use the {source.arch} .run (NVIDIA-Linux-{source.arch}-<version>.run)")
    if found and found[1] != source.version:
        raise DownloadError(f"{path.name} installs driver {found[1]}, not the requested {source.version}",
                            fix="pass the matching --driver version, or the matching .run file")
    digest = sha256_file(path)
    checks: list[str] = []
    if source.sha256:
        if digest != source.sha256:
            raise DownloadError(f"{path.name}: sha256 {digest} does not match --sha256 {source.sha256}",
                                fix="the file is not the one you expect: download it again or check the digest")
        checks.append("--sha256 OK")
    if published:
        if digest != published:
            raise DownloadError(f"{path.name}: sha256 {digest} does not match NVIDIA's published {published} "
                                f"({published_from})", fix="the download is corrupt or altered: it was not used")
        checks.append("published .sha256sum OK")
    checks += check_makeself(path, header)
    return Verified(str(path), digest, path.stat().st_size, tuple(checks),
                    header.unpacked_kb * 1024 if header.unpacked_kb is not None else None)


def obtain(source: Source, *, progress: ProgressBars | None = None,
           session: requests.Session | None = None) -> Verified:
    """The verified local installer for `source`: the local file, the cached copy, or a fresh download.
    `progress` makes the display for a download; None downloads silently."""
    if source.local:
        return verify(source.local, source)
    assert source.cache
    dest = Path(source.cache)
    with cache_lock(dest):
        return _cached(source, dest) or _download(source, dest, progress or silent, session)


def _cached(source: Source, dest: Path) -> Verified | None:
    """The cached copy when it is complete and still what was verified when it was downloaded."""
    marker = beside(dest, MARKER_SUFFIX)
    if not (dest.is_file() and marker.is_file()):
        return None
    recorded = parse_sha256sum(marker.read_text(encoding="utf-8", errors="replace"), dest.name)
    try:
        verified = verify(dest, dataclasses.replace(source, sha256=None))
    except DownloadError:
        verified = None
    if verified is None or verified.sha256 != recorded:
        dest.unlink(missing_ok=True)  # damaged cache entry: fetch again
        marker.unlink(missing_ok=True)
        return None
    if source.sha256 and verified.sha256 != source.sha256:
        raise DownloadError(f"{dest.name}: sha256 {verified.sha256} does not match --sha256 {source.sha256}",
                            fix="the cached file is the one NVIDIA published: check the digest you passed")
    return dataclasses.replace(verified, checks=("cached copy", *(["--sha256 OK"] if source.sha256 else []),
                                                 *verified.checks))


def _download(source: Source, dest: Path, progress: ProgressBars, session: requests.Session | None) -> Verified:
    import requests

    http = session or requests.Session()
    try:
        missing: list[str] = []
        for url in source.urls:
            try:
                with progress(dest.name) as report:
                    fetch(http, url, dest, report)
            except NotPublished as exc:
                missing.append(f"{url}: {exc}")
                continue
            published, where = published_sha256(http, url, source.version, source.arch, source.mirror)
            try:
                verified = verify(dest, source, published, where)
            except DownloadError:
                dest.unlink(missing_ok=True)  # never keep a file that failed verification
                raise
            write_marker(dest, verified.sha256)
            return dataclasses.replace(verified, checks=(f"downloaded from {url}", *verified.checks))
    finally:
        if session is None:
            http.close()
    raise DownloadError(f"could not download {source.name}: " + "; ".join(missing),
                        fix="check the version on NVIDIA's driver pages, or pass --driver-run PATH|URL")
