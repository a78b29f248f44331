"""Getting the NVIDIA .run installer onto the machine running gpunode, verified, before anything runs as root.

The node never needs internet: gpunode downloads here (resumable, HTTP Range), keeps the file in a cache keyed
by version and architecture, and checks it three ways before it is uploaded: `--sha256` when given, NVIDIA's
published `.sha256sum` when one exists, and the makeself archive's own CRC/MD5/SHA256 (what `sh FILE --check`
does), computed here in Python from the archive header. The .run is never executed on this machine.

URL and cache-path resolution are pure (plans show them); `obtain()` does the I/O at apply time.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import os
import re
import threading
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpunode.errors import GpunodeError, UsageError
from gpunode.versions import normalize_arch, parse_runfile_name, runfile_name

__all__ = ["normalize_arch", "parse_runfile_name", "runfile_name"]

if TYPE_CHECKING:  # requests is imported when something is downloaded, not at CLI start-up
    import requests

OFFICIAL_BASE = "https://us.download.nvidia.com"
CHUNK = 1 << 20
NET_CHUNK = 1 << 16  # small reads: bytes received before a dropped connection are kept for the resume
CONNECT_TIMEOUT = 15.0
READ_TIMEOUT = 60.0
RETRIES = 3  # resumed attempts after a dropped connection

_LABEL = re.compile(r"Linux-(?P<arch>x86_64|aarch64)\s+(?P<version>\d+\.\d+(?:\.\d+)?)")
_SHA256 = re.compile(r"^[0-9a-fA-F]{64}$")


class DownloadError(GpunodeError):
    """The installer could not be fetched, or failed verification: nothing was run."""


# -- names and URLs (pure) -------------------------------------------------------------------------------
def official_urls(version: str, arch: str, base: str | None = None) -> tuple[str, ...]:
    """Where NVIDIA publishes the .run, most likely first: the data-center ("tesla") directory, then the
    XFree86 Unix-driver archive (which also mirrors data-center releases). `base` replaces the host for
    a mirror with the same layout (GPUNODE_DRIVER_MIRROR)."""
    root = (base or OFFICIAL_BASE).rstrip("/")
    arch = normalize_arch(arch)
    name = runfile_name(version, arch)
    xfree_dirs = ("Linux-x86_64",) if arch == "x86_64" else ("aarch64", "Linux-aarch64")
    return (f"{root}/tesla/{version}/{name}",
            *(f"{root}/XFree86/{d}/{version}/{name}" for d in xfree_dirs))


def checksum_urls(url: str, version: str, arch: str, base: str | None = None) -> tuple[str, ...]:
    """Published `.sha256sum` files to consult for a download from `url`: the one next to it first, then (for
    a data-center download) the XFree86 one, since NVIDIA publishes sums only there."""
    urls = [url + ".sha256sum"]
    if parse_runfile_name(url) == (normalize_arch(arch), version):
        urls += [u + ".sha256sum" for u in official_urls(version, arch, base)[1:] if u != url]
    return tuple(urls)


def default_cache_root(explicit: str | None = None, env: dict[str, str] | None = None) -> Path:
    """--cache-dir, else $GPUNODE_CACHE_DIR, else ~/.cache/gpunode/drivers."""
    env = dict(os.environ) if env is None else env
    chosen = explicit or env.get("GPUNODE_CACHE_DIR")
    return Path(chosen).expanduser() if chosen else Path("~/.cache/gpunode/drivers").expanduser()


def cache_path(root: str | Path, version: str, arch: str, url: str | None = None) -> Path:
    """<root>/<version>/<arch>/<file>. A URL whose file name is not NVIDIA's keeps that name."""
    name = runfile_name(version, arch)
    if url and parse_runfile_name(url) is None:
        name = re.sub(r"[^\w.+-]", "_", url.rsplit("/", 1)[-1].split("?", 1)[0]) or name
    return Path(root) / version / normalize_arch(arch) / name


def is_url(text: str) -> bool:
    return text.startswith(("http://", "https://"))


# -- makeself header and checks (pure, reading only) --------------------------------------------------------
@dataclass(frozen=True)
class MakeselfHeader:
    label: str
    target_dir: str
    offset: int  # where the payload starts (bytes)
    filesizes: tuple[int, ...]
    crcs: tuple[str, ...]
    md5s: tuple[str, ...]
    shas: tuple[str, ...]
    total_size: int | None

    @property
    def arch_version(self) -> tuple[str, str] | None:
        """From the label NVIDIA gives its archives: '... for Linux-x86_64 535.129.03'."""
        match = _LABEL.search(self.label) or _LABEL.search(self.target_dir.replace("-", " ", 2))
        return (match["arch"], match["version"]) if match else None


_HEADER_MAX = 1 << 20  # makeself headers are ~20-40 KiB of shell


def _field(text: str, name: str) -> str | None:
    match = re.search(rf'^{name}="([^"\n]*)"', text, re.M)
    return match.group(1) if match else None


def read_header(path: str | os.PathLike[str]) -> MakeselfHeader:
    """Parse the shell header of a makeself archive (NVIDIA's 2.1.x-derived one or makeself 2.4)."""
    with open(path, "rb") as fh:
        head = fh.read(_HEADER_MAX)
    text = head.decode("latin-1")
    if not text.startswith("#!") or "Makeself" not in text[:4096] and "makeself" not in text[:4096]:
        raise DownloadError(f"{path} is not a makeself archive (an NVIDIA .run file starts with a shell header)",
                            fix="check the file: an HTML error page or a truncated download is not an installer")
    skip = _field(text, "skip")
    if skip is None or not skip.isdigit():  # older makeself: `head -n 573 "$1"` with the count inline
        match = re.search(r'head -n (\d+) "\$[01]"', text)
        skip = match.group(1) if match else None
    sizes = _field(text, "filesizes")
    if skip is None or sizes is None:
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
    )


_BITREV = bytes(int(f"{i:08b}"[::-1], 2) for i in range(256))


def _rev32(value: int) -> int:
    return int(f"{value:032b}"[::-1], 2)


class PosixCksum:
    """POSIX `cksum` CRC (what makeself stores in CRCsum). It is the MSB-first CRC-32; zlib computes the
    bit-reflected one, so feeding zlib bit-reversed bytes and reversing the result gives the same value at
    C speed (a pure-Python CRC over a 300 MB driver would take minutes)."""

    def __init__(self) -> None:
        self._crc = 0  # reflected register, initial value 0, no final xor until digest()
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
        want_sha = header.shas[i] if i < len(header.shas) else ""
        want_md5 = header.md5s[i] if i < len(header.md5s) else ""
        want_crc = header.crcs[i] if i < len(header.crcs) else ""
        sha, md5, crc = hashlib.sha256(), hashlib.md5(usedforsecurity=False), PosixCksum()
        for data in chunks:
            sha.update(data)
            md5.update(data)
            crc.update(data)
        if want_sha and set(want_sha) != {"0"}:
            if sha.hexdigest() != want_sha.lower():
                raise DownloadError(f"{path}: makeself SHA256 mismatch (embedded {want_sha}, computed "
                                    f"{sha.hexdigest()}): the archive is corrupt", fix="download it again")
            checked.add("SHA256")
        if want_md5 and set(want_md5) != {"0"}:
            if md5.hexdigest() != want_md5.lower():
                raise DownloadError(f"{path}: makeself MD5 mismatch (embedded {want_md5}, computed "
                                    f"{md5.hexdigest()}): the archive is corrupt", fix="download it again")
            checked.add("MD5")
        if want_crc and set(want_crc) != {"0"}:
            if str(crc.value()) != want_crc:
                raise DownloadError(f"{path}: makeself CRC mismatch (embedded {want_crc}, computed "
                                    f"{crc.value()}): the archive is corrupt", fix="download it again")
            checked.add("CRC")
    if not checked:
        raise DownloadError(f"{path}: the makeself archive carries no checksum to verify",
                            fix="use an official NVIDIA .run file, or pass --sha256 with its published checksum")
    return [f"makeself {kind} OK" for kind in ("SHA256", "MD5", "CRC") if kind in checked]


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
        if parts and _SHA256.match(parts[0]):
            found.append((parts[0].lower(), parts[-1].lstrip("*") if len(parts) > 1 else ""))
    for digest, file in found:
        if file.rsplit("/", 1)[-1] == name:
            return digest
    return found[0][0] if len(found) == 1 else None


def check_sha256_option(value: str | None) -> str | None:
    if value is None:
        return None
    if not _SHA256.match(value.strip()):
        raise UsageError(f"--sha256 {value!r} is not a SHA-256 digest", fix="pass the 64 hex digits of the .run")
    return value.strip().lower()


# -- what to fetch (pure) ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Source:
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
        return Path(self.local or self.cache or runfile_name(self.version, self.arch)).name

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


# -- fetching (I/O, at apply time) ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Verified:
    path: str
    sha256: str
    size: int
    checks: tuple[str, ...]


def _marker(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def verify(path: str | os.PathLike[str], source: Source, published: str | None = None,
           published_from: str = "") -> Verified:
    """All checks on a local file; raises DownloadError on any mismatch. The file is never executed."""
    path = Path(path)
    if not path.is_file():
        raise DownloadError(f"{path} does not exist", fix="check the --driver-run path")
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
    return Verified(str(path), digest, path.stat().st_size, tuple(checks))


def obtain(source: Source, *, progress: bool = True, session: requests.Session | None = None) -> Verified:
    """The verified local installer for `source`: the local file, the cached copy, or a fresh download."""
    if source.local:
        return verify(source.local, source)
    assert source.cache
    dest = Path(source.cache)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with _locked(dest):  # several nodes of one run share the cache: one downloads, the others wait
        return _obtain_cached(source, dest, progress, session)


@contextmanager
def _locked(dest: Path) -> Iterator[None]:
    with open(dest.with_name(dest.name + ".lock"), "a+b") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _obtain_cached(source: Source, dest: Path, progress: bool, session: requests.Session | None) -> Verified:
    marker = _marker(dest)
    if dest.is_file() and marker.is_file():
        recorded = parse_sha256sum(marker.read_text(encoding="utf-8", errors="replace"), dest.name)
        try:
            verified = verify(dest, dataclasses.replace(source, sha256=None))
        except DownloadError:
            verified = None
        if verified and verified.sha256 == recorded:
            if source.sha256 and verified.sha256 != source.sha256:
                raise DownloadError(f"{dest.name}: sha256 {verified.sha256} does not match --sha256 {source.sha256}",
                                    fix="the cached file is the one NVIDIA published: check the digest you passed")
            return Verified(verified.path, verified.sha256, verified.size,
                            ("cached copy", *(["--sha256 OK"] if source.sha256 else []), *verified.checks))
        dest.unlink(missing_ok=True)  # damaged cache entry: fetch again
        marker.unlink(missing_ok=True)
    import requests

    http = session or requests.Session()
    try:
        return _download_verified(http, source, dest, marker, progress)
    finally:
        if session is None:
            http.close()


def _download_verified(http: requests.Session, source: Source, dest: Path, marker: Path, progress: bool) -> Verified:
    errors: list[str] = []
    for url in source.urls:
        try:
            _download(http, url, dest, progress)
        except _NotThere as exc:
            errors.append(f"{url}: {exc}")
            continue
        published, where = _published_sha256(http, url, source)
        try:
            verified = verify(dest, source, published, where)
        except DownloadError:
            dest.unlink(missing_ok=True)  # never keep a file that failed verification
            raise
        marker.write_text(f"{verified.sha256}  {dest.name}\n", encoding="utf-8")
        return Verified(verified.path, verified.sha256, verified.size, (f"downloaded from {url}", *verified.checks))
    raise DownloadError(f"could not download {source.name}: " + "; ".join(errors),
                        fix="check the version on NVIDIA's driver pages, or pass --driver-run PATH|URL")


class _NotThere(Exception):
    pass


def _published_sha256(http: requests.Session, url: str, source: Source) -> tuple[str | None, str]:
    import requests

    name = url.rsplit("/", 1)[-1].split("?", 1)[0]
    for sum_url in checksum_urls(url, source.version, source.arch, source.mirror):
        try:
            response = http.get(sum_url, timeout=(CONNECT_TIMEOUT, READ_TIMEOUT))
        except requests.RequestException:
            continue
        if response.status_code == 200 and len(response.content) < 65536:
            digest = parse_sha256sum(response.text, name)
            if digest:
                return digest, sum_url
    return None, ""


def _download(http: requests.Session, url: str, dest: Path, progress: bool) -> None:
    """Resumable GET into `dest` via `dest.part`: an interrupted download continues with HTTP Range."""
    import requests

    part = dest.with_name(dest.name + ".part")
    attempts = 0
    with _progress_bar(dest.name, progress) as bar:
        while True:
            have = part.stat().st_size if part.exists() else 0
            headers = {"Range": f"bytes={have}-"} if have else {}
            try:
                with http.get(url, headers=headers, stream=True, timeout=(CONNECT_TIMEOUT, READ_TIMEOUT)) as resp:
                    if resp.status_code == 404:
                        raise _NotThere("not found (HTTP 404)")
                    if resp.status_code == 416 and have:
                        total = _total_from_content_range(resp.headers.get("Content-Range", ""))
                        if total == have:
                            break  # the partial file is already complete
                        part.unlink()
                        continue
                    if resp.status_code not in (200, 206):
                        raise _NotThere(f"HTTP {resp.status_code}")
                    if resp.status_code == 200 and have:
                        have = 0  # the server ignored Range: start over
                    length = resp.headers.get("Content-Length")
                    total = have + int(length) if length and length.isdigit() else None
                    if resp.status_code == 206:
                        total = _total_from_content_range(resp.headers.get("Content-Range", "")) or total
                    bar(have, total)
                    with open(part, "ab" if have else "wb") as fh:
                        for data in resp.iter_content(NET_CHUNK):
                            fh.write(data)
                            have += len(data)
                            bar(have, total)
                    if total is not None and have < total:
                        raise requests.ConnectionError(f"connection closed at {have} of {total} bytes")
                    break
            except (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError) as exc:
                attempts += 1
                if attempts > RETRIES:
                    raise DownloadError(f"downloading {url} failed after {RETRIES} retries: {exc}",
                                        fix="run the same command again: the download resumes where it "
                                            f"stopped ({part})") from None
    os.replace(part, dest)


def _total_from_content_range(value: str) -> int | None:
    match = re.search(r"/(\d+)\s*$", value)
    return int(match.group(1)) if match else None


class _progress_bar:
    """A rich progress bar on stderr (gpunode.ui.err), or nothing when progress is off."""

    def __init__(self, title: str, enabled: bool) -> None:
        self.title, self.enabled = title, enabled
        self._progress: object | None = None
        self._task: object | None = None

    def __enter__(self) -> Callable[[int, int | None], None]:
        # ui is main-thread only, and rich allows one live display at a time: fleet workers go without a bar
        if self.enabled and threading.current_thread() is threading.main_thread():
            from rich.errors import LiveError
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
                TransferSpeedColumn,
            )

            from gpunode.ui import err

            progress = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                                TransferSpeedColumn(), TimeRemainingColumn(), console=err, transient=False)
            try:
                progress.start()
            except LiveError:
                return self.update
            self._progress, self._task = progress, progress.add_task(self.title, total=None)
        return self.update

    def update(self, done: int, total: int | None) -> None:
        if self._progress is not None:
            self._progress.update(self._task, completed=done, total=total)  # type: ignore[attr-defined]

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()  # type: ignore[attr-defined]


def progress_bar(title: str, enabled: bool = True) -> _progress_bar:
    """For uploads: the same bar, fed (bytes so far, total)."""
    return _progress_bar(title, enabled)


def cached_files(root: str | Path, version: str) -> tuple[tuple[str, int], ...]:
    """(path, size) of complete, verified downloads of `version` in the cache, for plans to show."""
    base = Path(root) / version
    found = []
    if base.is_dir():
        for marker in sorted(base.glob("*/*.run.sha256")):
            run = marker.with_name(marker.name[: -len(".sha256")])
            if run.is_file():
                found.append((str(run), run.stat().st_size))
    return tuple(found)


def request(driver: str | None, driver_run: str | None, sha256: str | None, kernel_module: str | None,
            signing_key: str | None, signing_cert: str | None, cache_dir: str | None,
            env: dict[str, str] | None = None) -> dict[str, object]:
    """The driver options as the user typed them -> Options fields. Runs in the CLI, before planning: it reads
    a local --driver-run header (to learn its version) and lists the cache, so plans never do I/O."""
    env = dict(os.environ) if env is None else env
    sha = check_sha256_option(sha256)
    if kernel_module is not None and kernel_module.lower() not in ("open", "proprietary"):
        raise UsageError(f"--kernel-module {kernel_module!r}", fix="use --kernel-module open or proprietary")
    if bool(signing_key) != bool(signing_cert):
        raise UsageError("--module-signing-key and --module-signing-cert go together",
                         fix="pass both: the private key and its certificate, as paths on the node")
    root = default_cache_root(cache_dir, env)
    version = driver
    local: list[tuple[str, int]] = []
    if driver_run:
        named = parse_runfile_name(driver_run)
        if not is_url(driver_run):
            path = Path(driver_run).expanduser().resolve()
            if not path.is_file():
                raise UsageError(f"--driver-run {driver_run}: no such file", fix="pass a .run file or its URL")
            try:
                found = read_header(path).arch_version or named
            except DownloadError as exc:
                raise UsageError(f"--driver-run {driver_run}: {exc.message}", fix=exc.fix) from None
            driver_run = str(path)
            local.append((driver_run, path.stat().st_size))
            named = found
        if named and version and named[1] != version:
            raise UsageError(f"--driver-run installs driver {named[1]}, but --driver asks for {version}",
                             fix="drop --driver, or pass the matching .run")
        version = version or (named[1] if named else None)
        if version is None:
            raise UsageError(f"cannot tell which driver version {driver_run} installs",
                             fix="pass --driver VERSION as well")
    if version:
        local += cached_files(root, version)
    return {"driver": version, "driver_run": driver_run, "sha256": sha,
            "kernel_module": kernel_module.lower() if kernel_module else None,
            "module_signing_key": signing_key, "module_signing_cert": signing_cert, "cache_dir": str(root),
            "driver_mirror": env.get("GPUNODE_DRIVER_MIRROR") or None, "local_installers": tuple(local)}
