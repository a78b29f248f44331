"""The driver options as the user typed them -> Options fields. Runs in the CLI, before planning: it reads a
local --driver-run header (to learn its version) and lists the cache, so plans never do I/O."""

from __future__ import annotations

import os
import unicodedata
from pathlib import Path

from gpunode.artifacts import DownloadError
from gpunode.artifacts.checksums import SHA256
from gpunode.artifacts.naming import MIRROR_ENV, cached_files, default_cache_root, is_url
from gpunode.errors import UsageError
from gpunode.versions import parse_runfile_name


def check_sha256_option(value: str | None) -> str | None:
    if value is None:
        return None
    if not SHA256.match(value.strip()):
        raise UsageError(f"--sha256 {value!r} is not a SHA-256 digest", fix="pass the 64 hex digits of the .run")
    return value.strip().lower()


def _odd(text: str) -> bool:
    """Text that cannot be shown or passed on as it is: not UTF-8 (undecodable bytes arrive as surrogates),
    or with control characters such as a newline."""
    return any(unicodedata.category(c) in ("Cs", "Cc") for c in text)


def check_mirror(value: str | None) -> str | None:
    if not value:
        return None
    if _odd(value) or not is_url(value):
        raise UsageError(f"{MIRROR_ENV}={ascii(value)} is not an http(s) URL",
                         fix=f"set it to the mirror's base URL, e.g. {MIRROR_ENV}=https://mirror.example/nvidia")
    return value


def local_driver_run(text: str) -> tuple[Path, tuple[str, str] | None]:
    """A local --driver-run file -> (its absolute path, (arch, version) from its header or its name)."""
    if _odd(text):
        raise UsageError(f"--driver-run {ascii(text)}: the file name is not printable UTF-8 text",
                         fix="rename the file, e.g. to NVIDIA-Linux-x86_64-<version>.run, and pass the new name")
    path = Path(text).expanduser().resolve()
    if path.is_dir():
        raise UsageError(f"--driver-run {text}: is a directory", fix="pass the .run file itself, or its URL")
    if not path.is_file():
        raise UsageError(f"--driver-run {text}: no such file", fix="pass a .run file or its URL")
    from gpunode.artifacts.makeself import read_header  # a local .run only: a run without one never loads it

    try:
        found = read_header(path).arch_version
    except DownloadError as exc:
        raise UsageError(f"--driver-run {text}: {exc.message}", fix=exc.fix) from None
    except OSError as exc:
        raise UsageError(f"--driver-run {text}: cannot read it ({(exc.strerror or type(exc).__name__).lower()})",
                         fix="make the file readable by the user running gpunode") from None
    return path, found or parse_runfile_name(text)


def request(driver: str | None, driver_run: str | None, sha256: str | None, kernel_module: str | None,
            signing_key: str | None, signing_cert: str | None, cache_dir: str | None,
            env: dict[str, str] | None = None) -> dict[str, object]:
    """Validated option values (gpunode/cli/_inputs.py checks them first) -> Options fields: the local
    --driver-run read for its version, the cache listed, the mirror taken from the environment."""
    env = dict(os.environ) if env is None else env
    sha = check_sha256_option(sha256)
    mirror = check_mirror(env.get(MIRROR_ENV))
    root = default_cache_root(cache_dir, env)
    version = driver
    local: list[tuple[str, int]] = []
    if driver_run:
        if is_url(driver_run):
            if _odd(driver_run):
                raise UsageError(f"--driver-run {ascii(driver_run)}: the URL contains control characters",
                                 fix="pass the URL as it is shown on the download page")
            named = parse_runfile_name(driver_run)
        else:
            path, named = local_driver_run(driver_run)
            driver_run = str(path)
            local.append((driver_run, path.stat().st_size))
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
            "driver_mirror": mirror, "local_installers": tuple(local)}
