"""HTTP downloads into the cache: resumable (HTTP Range), retried, a timeout on every call, one downloader per
file (a lock), and every failure a one-line DownloadError that says what went wrong and what to do instead.

Progress goes to a plain `ProgressFn(done, total)`; nothing here draws. `requests` is imported when something
is downloaded, not at CLI start-up.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import socket
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from gpunode.artifacts import DownloadError, ProgressFn
from gpunode.artifacts.checksums import parse_sha256sum, sha256sum_line
from gpunode.artifacts.naming import (
    LOCK_SUFFIX,
    MARKER_SUFFIX,
    MIRROR_ENV,
    PART_SUFFIX,
    beside,
    checksum_urls,
    url_file_name,
)

if TYPE_CHECKING:
    import requests

CONNECT_TIMEOUT = 15.0
READ_TIMEOUT = 60.0  # seconds without a byte before a read gives up
RETRIES = 3  # further attempts after a failed or dropped connection
RETRY_PAUSE = 1.0  # seconds times the attempt number, when the last attempt received nothing
NET_CHUNK = 1 << 16  # small reads: bytes received before a dropped connection are kept for the resume
SUM_MAX = 1 << 16  # a .sha256sum file is a line or two; anything bigger is not one


def timeout() -> tuple[float, float]:
    """(connect, read) seconds, for every request."""
    return (CONNECT_TIMEOUT, READ_TIMEOUT)


class NotPublished(Exception):
    """The server answered, but not with the file (404, 403, ...): the next URL may have it."""


class _Cut(Exception):
    """The server closed the connection before sending everything it announced."""


# -- the cache --------------------------------------------------------------------------------------------------
def cache_error(exc: OSError, path: Path) -> DownloadError:
    """A failed write or read in the cache, as one line with the fix."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        reason = "no space left on the device"
    else:
        reason = (exc.strerror or type(exc).__name__).lower()
    return DownloadError(f"cannot write the driver download cache {path.parent}: {reason}",
                         fix="free space there, or use another cache directory: --cache-dir DIR "
                             "(or GPUNODE_CACHE_DIR=DIR)")


@contextmanager
def cache_lock(dest: Path) -> Iterator[None]:
    """Several nodes of one run share the cache: one downloads a file, the others wait for it."""
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        fh = open(beside(dest, LOCK_SUFFIX), "a+b")  # closed by the with below
    except OSError as exc:
        raise cache_error(exc, dest) from None
    with fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def write_marker(dest: Path, digest: str) -> None:
    """Record `dest` as verified, atomically: a marker is complete or absent, never half written."""
    marker = beside(dest, MARKER_SUFFIX)
    tmp = beside(marker, ".tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(sha256sum_line(digest, dest.name))
        os.replace(tmp, marker)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        dest.unlink(missing_ok=True)  # not recorded as verified: do not keep it around on a full disk
        raise cache_error(exc, dest) from None


# -- network errors in one line -----------------------------------------------------------------------------------
def _chain(exc: BaseException) -> Iterator[BaseException]:
    """The exception and everything it wraps: causes, contexts, urllib3's `reason` and exceptions in args."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        item = todo.pop()
        if item is None or id(item) in seen:
            continue
        seen.add(id(item))
        yield item
        reason = getattr(item, "reason", None)
        todo += [item.__cause__, item.__context__, reason if isinstance(reason, BaseException) else None]
        todo += [a for a in item.args if isinstance(a, BaseException)]


def _errno(found: Iterable[BaseException], *codes: int) -> bool:
    return any(isinstance(e, OSError) and e.errno in codes for e in found)


def network_reason(exc: BaseException, url: str) -> tuple[str, bool]:
    """(what went wrong, in a few words; whether trying again soon can help)."""
    import requests

    parts = urlsplit(url)
    host = parts.hostname or url
    where = f"{host}:{parts.port}" if parts.port else host
    found = list(_chain(exc))

    def has(*kinds: type[BaseException]) -> bool:
        return any(isinstance(e, kinds) for e in found)

    if has(_Cut):
        return str(next(e for e in found if isinstance(e, _Cut))), True
    if has(requests.exceptions.InvalidURL, requests.exceptions.MissingSchema, requests.exceptions.InvalidSchema):
        return "the URL is not a valid http(s) URL", False
    if has(socket.gaierror) or any(type(e).__name__ == "NameResolutionError" for e in found):
        return f"cannot resolve {host} (no DNS: is this machine offline?)", False
    if has(ConnectionRefusedError) or _errno(found, errno.ECONNREFUSED):
        return f"{where} refused the connection", True
    if _errno(found, errno.ENETUNREACH, errno.EHOSTUNREACH):
        return f"{host} is unreachable (no network route)", False
    if has(requests.exceptions.SSLError):
        return f"the TLS connection to {host} failed (untrusted certificate, or a proxy in the way)", False
    if has(requests.exceptions.ProxyError):
        return f"the proxy would not connect to {host}", True
    if has(requests.exceptions.ConnectTimeout):
        return f"{host} did not answer within {CONNECT_TIMEOUT:.0f}s", True
    if has(requests.exceptions.ReadTimeout) or any(type(e).__name__ == "ReadTimeoutError" for e in found):
        return f"{host} sent nothing for {READ_TIMEOUT:.0f}s", True
    if has(ConnectionResetError):
        return f"{host} reset the connection", True
    if has(requests.exceptions.ChunkedEncodingError):
        return "the connection broke off during the transfer", True
    return f"the connection to {host} failed ({type(found[-1]).__name__})", True


def network_error(exc: BaseException, url: str, part: Path, attempts: int) -> DownloadError:
    reason, _ = network_reason(exc, url)
    tries = f" ({attempts} attempts)" if attempts > 1 else ""
    kept = part.stat().st_size if part.is_file() else 0
    offline = (f"without access to {urlsplit(url).hostname or 'the server'}, copy the .run to this machine and "
               f"pass --driver-run FILE, or set {MIRROR_ENV} to a mirror with NVIDIA's layout")
    fix = (f"run the same command again to resume from the {kept} bytes kept in {part.name}; "
           + offline) if kept else offline
    return DownloadError(f"downloading {url_file_name(url) or url} failed: {reason}{tries}", fix=fix)


# -- downloading ----------------------------------------------------------------------------------------------------
def _size(path: Path) -> int:
    return path.stat().st_size if path.is_file() else 0


def _total_from_content_range(value: str) -> int | None:
    match = re.search(r"/(\d+)\s*$", value)
    return int(match.group(1)) if match else None


def fetch(http: requests.Session, url: str, dest: Path, progress: ProgressFn) -> None:
    """GET `url` into `dest` via `dest.part`: an interrupted download continues with HTTP Range, now (up to
    RETRIES more attempts) or in a later run. Raises NotPublished when the server does not have the file."""
    import requests

    part = beside(dest, PART_SUFFIX)
    attempts = 0
    while True:
        before = _size(part)
        try:
            if _get(http, url, part, progress):
                break
        except (requests.RequestException, _Cut) as exc:
            attempts += 1
            _, transient = network_reason(exc, url)
            if not transient or attempts > RETRIES:
                raise network_error(exc, url, part, attempts) from None
            if _size(part) == before:
                time.sleep(RETRY_PAUSE * attempts)
        except OSError as exc:  # writing the part file (requests' errors are OSErrors too: caught above)
            part.unlink(missing_ok=True)  # a disk-full leaves nothing behind
            raise cache_error(exc, dest) from None
    try:
        os.replace(part, dest)
    except OSError as exc:
        raise cache_error(exc, dest) from None


def _get(http: requests.Session, url: str, part: Path, progress: ProgressFn) -> bool:
    """One GET from where `part` ends. True when `part` is complete; False to ask for another request."""
    import requests

    have = _size(part)
    headers = {"Range": f"bytes={have}-"} if have else {}
    with http.get(url, headers=headers, stream=True, timeout=timeout()) as resp:
        if resp.status_code == 416 and have:
            if _total_from_content_range(resp.headers.get("Content-Range", "")) == have:
                return True  # the partial file is already complete
            part.unlink()
            return False
        if resp.status_code not in (200, 206):
            raise NotPublished("not found (HTTP 404)" if resp.status_code == 404 else f"HTTP {resp.status_code}")
        if resp.status_code == 200:
            have = 0  # no Range asked, or the server ignored it: start over
        length = resp.headers.get("Content-Length")
        total = have + int(length) if length and length.isdigit() else None
        if resp.status_code == 206:
            total = _total_from_content_range(resp.headers.get("Content-Range", "")) or total
        progress(have, total)
        with open(part, "ab" if have else "wb") as fh:
            try:
                for data in resp.iter_content(NET_CHUNK):
                    fh.write(data)
                    have += len(data)
                    progress(have, total)
            except requests.exceptions.ChunkedEncodingError as exc:  # fewer bytes than announced
                if total is None:
                    raise
                raise _Cut(f"the connection closed at {have} of {total} bytes") from exc
    if total is not None and have < total:
        raise _Cut(f"the connection closed at {have} of {total} bytes")
    return True


def published_sha256(http: requests.Session, url: str, version: str, arch: str,
                     mirror: str | None) -> tuple[str | None, str]:
    """(NVIDIA's published sha256 of the file at `url`, the .sha256sum URL it came from), or (None, "")."""
    import requests

    name = url_file_name(url)
    for sum_url in checksum_urls(url, version, arch, mirror):
        try:
            with http.get(sum_url, stream=True, timeout=timeout()) as resp:
                if resp.status_code != 200:
                    continue
                body = b""
                for data in resp.iter_content(4096):
                    body += data
                    if len(body) > SUM_MAX:
                        break
        except requests.RequestException:
            continue
        if len(body) <= SUM_MAX:
            digest = parse_sha256sum(body.decode("utf-8", "replace"), name)
            if digest:
                return digest, sum_url
    return None, ""
