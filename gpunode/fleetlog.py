"""Per-node log files of a fleet run, made safe: inventory names never become paths as they are, files are
private (0600 in a 0700 directory), and secrets are masked in whatever is written, at any log level."""

from __future__ import annotations

import functools
import hashlib
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import TextIO

LOG_LEVELS = ("info", "debug")

_UNSAFE = r"[^A-Za-z0-9._@+-]"  # compiled (re's cache) when a fleet names its log files
_MAX_NAME = 80


def safe_log_name(name: str) -> str:
    """A file name for a host's log: the name itself when it is harmless, else a sanitised form plus a short
    hash of the original (so `a/b` and `a_b` never share a file). Never empty, never hidden, never `..`."""
    cleaned = re.sub(_UNSAFE, "_", name).lstrip(".-") or "host"
    if cleaned == name and len(name) <= _MAX_NAME:
        return name
    return f"{cleaned[:_MAX_NAME]}-{hashlib.sha256(name.encode('utf-8', 'surrogatepass')).hexdigest()[:8]}"


def log_file_names(names: Iterable[str]) -> dict[str, str]:
    """Host name -> `<safe name>.log`, unique even if two names sanitise alike (or differ only in case)."""
    chosen: dict[str, str] = {}
    used: set[str] = set()
    for name in names:
        base = safe_log_name(name)
        candidate, n = base, 1
        while candidate.lower() in used:
            n += 1
            candidate = f"{base}-{n}"
        used.add(candidate.lower())
        chosen[name] = f"{candidate}.log"
    return chosen


def make_log_dir(path: Path) -> Path:
    """Create the directory (and missing parents) as 0700. An existing directory is used as it is: the
    files in it are 0600 anyway."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for directory in reversed(missing):
        directory.mkdir(mode=0o700)
        os.chmod(directory, 0o700)  # mkdir's mode is filtered by the umask; say exactly what we mean
    if not path.is_dir():
        raise NotADirectoryError(str(path))
    return path


# Values that are secrets wherever they appear: JSON ("auth": "..."), TOML / INI (password = "..."),
# environment style (TOKEN=...), HTTP headers, and credentials in URLs.
_SECRET_KEYS = (r"auths?|identitytoken|registrytoken|token|access_token|refresh_token|api_?key|password|passwd"
                r"|secret|client_secret|private_key")


@functools.cache
def _patterns() -> tuple[tuple[re.Pattern[str], str], ...]:
    # compiled when a fleet log first writes a line, not when a single-node run imports this module for
    # LOG_LEVELS
    return (
        (re.compile(rf'("(?:{_SECRET_KEYS})"\s*:\s*)"(?:[^"\\]|\\.)*"', re.IGNORECASE), r'\1"***"'),
        (re.compile(rf"(\b(?:{_SECRET_KEYS})\s*=\s*)(\"(?:[^\"\\]|\\.)*\"|'[^']*')", re.IGNORECASE), r'\1"***"'),
        # the same inside a JSON string (a TOML diff in a JSON report): password = \"...\"
        (re.compile(rf'(\b(?:{_SECRET_KEYS})\s*=\s*)\\"(?:[^"\\]|\\[^"])*\\"', re.IGNORECASE), r'\1\\"***\\"'),
        (re.compile(r"(\b[A-Z0-9_]*(?:TOKEN|PASSWORD|PASSWD|SECRET|API_?KEY)[A-Z0-9_]*=)\S+"), r"\1***"),
        (re.compile(r"(\bauthorization:\s*(?:basic|bearer|token)\s+)\S+", re.IGNORECASE), r"\1***"),
        (re.compile(r"(\b[a-z][a-z0-9+.-]*://[^/\s:@]+:)[^@\s/]+@", re.IGNORECASE), r"\1***@"),
    )


def mask_secrets(text: str) -> str:
    for pattern, replacement in _patterns():
        text = pattern.sub(replacement, text)
    return text


class FleetLog:
    """One host's log: private file, secrets masked line by line. `debug` says whether node output (file
    contents included) may be copied in; connections read it (gpunode.fleet.LoggedConnection)."""

    def __init__(self, stream: TextIO, *, debug: bool = False) -> None:
        self._stream = stream
        self.debug = debug
        self._pending = ""

    @classmethod
    def create(cls, path: Path, *, debug: bool = False) -> FleetLog:
        # O_NOFOLLOW: never follow a planted symlink. A log left by an earlier run in the same directory is
        # replaced, and made private whatever its mode was.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        os.fchmod(fd, 0o600)
        return cls(os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace"), debug=debug)

    def write(self, text: str) -> int:
        # Mask whole lines, so a secret split across two write() calls is still seen as one.
        self._pending += text
        if "\n" in self._pending:
            complete, self._pending = self._pending.rsplit("\n", 1)
            self._stream.write(mask_secrets(complete) + "\n")
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def close(self) -> None:
        if self._pending:
            self._stream.write(mask_secrets(self._pending))
            self._pending = ""
        self._stream.close()

    def __enter__(self) -> FleetLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
