"""Where NVIDIA publishes a .run and where gpunode keeps it (pure, except `cached_files`, which lists the cache).

The file name grammar and the architecture words are gpunode/versions.py's; this module adds the URL layout of
NVIDIA's download site (and of mirrors that copy it) and the cache layout.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from gpunode.versions import normalize_arch, parse_runfile_name, runfile_name

OFFICIAL_BASE = "https://us.download.nvidia.com"
MIRROR_ENV = "GPUNODE_DRIVER_MIRROR"
CACHE_ENV = "GPUNODE_CACHE_DIR"
DEFAULT_CACHE = "~/.cache/gpunode/drivers"
MARKER_SUFFIX = ".sha256"  # next to a verified download: `<sha256>  <file>`
PART_SUFFIX = ".part"  # a download in progress, resumed with HTTP Range
LOCK_SUFFIX = ".lock"


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


def is_url(text: str) -> bool:
    return text.startswith(("http://", "https://"))


def url_file_name(url: str) -> str:
    """The last path segment of a URL, without its query."""
    return url.split("?", 1)[0].rsplit("/", 1)[-1]


def default_cache_root(explicit: str | None = None, env: dict[str, str] | None = None) -> Path:
    """--cache-dir, else $GPUNODE_CACHE_DIR, else ~/.cache/gpunode/drivers."""
    env = dict(os.environ) if env is None else env
    chosen = explicit or env.get(CACHE_ENV)
    return Path(chosen or DEFAULT_CACHE).expanduser()


def cache_path(root: str | Path, version: str, arch: str, url: str | None = None) -> Path:
    """<root>/<version>/<arch>/<file>. A URL whose file name is not NVIDIA's keeps that name (made safe)."""
    name = runfile_name(version, arch)
    if url and parse_runfile_name(url) is None:
        name = re.sub(r"[^\w.+-]", "_", url_file_name(url), flags=re.ASCII).lstrip(".") or name
    return Path(root) / version / normalize_arch(arch) / name


def beside(path: Path, suffix: str) -> Path:
    """The marker, part or lock file that goes with a cached download."""
    return path.with_name(path.name + suffix)


def cached_files(root: str | Path, version: str) -> tuple[tuple[str, int], ...]:
    """(path, size) of complete, verified downloads of `version` in the cache, for plans to show."""
    base = Path(root) / version
    found = []
    if base.is_dir():
        for marker in sorted(base.glob(f"*/*{MARKER_SUFFIX}")):
            run = marker.with_name(marker.name[: -len(MARKER_SUFFIX)])
            if run.is_file():
                found.append((str(run), run.stat().st_size))
    return tuple(found)
