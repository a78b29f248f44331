"""The NVIDIA driver version grammar and the .run installer's file name, written once.

A driver version is BRANCH.MINOR[.PATCH] with a three-digit branch: 535.129.03, 570.26. `Ver` keeps the text as
NVIDIA writes it (535.129.03, not packaging's 535.129.3) and compares like any packaging Version. Every module
that reads, validates or names a driver version uses this one: the CLI, the steps, the compat tables, the facts
parsers and the artifact naming.
"""

from __future__ import annotations

import re

from packaging.version import Version

from gpunode.errors import UsageError

# BRANCH.MINOR[.PATCH], as a regex fragment with no groups, for other patterns to embed.
DRIVER = r"\d{3}\.\d{1,3}(?:\.\d{1,3})?"
DRIVER_EXACT = re.compile(rf"^{DRIVER}$")
DRIVER_IN_TEXT = re.compile(rf"(?<![\d.])({DRIVER})(?![\d.]*\d)")
BRANCH_EXACT = re.compile(r"^\d{3}$")

# NVIDIA-Linux-<arch>-<version>[-<suffix>].run
RUNFILE = re.compile(
    r"^NVIDIA-Linux-(?P<arch>x86_64|aarch64)-(?P<version>\d+\.\d+(?:\.\d+)?)(?:-[\w-]+)?\.run$")
ARCHES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}
# the same architectures by dpkg's names (apt's $(ARCH) in a repository line)
DEB_ARCHES = {arch: name for name, arch in ARCHES.items() if name != arch}

DRIVER_FIX = "use the full version from NVIDIA's download page, e.g. 535.129.03 or 550.54.15"


class Ver(Version):
    """A packaging Version that prints exactly as written: NVIDIA's 535.129.03 stays 535.129.03 (a plain
    Version prints 535.129.3). Compares like any Version."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self._text = text.strip()

    def __str__(self) -> str:
        return self._text

    def __repr__(self) -> str:
        return f"<Ver({self._text!r})>"


def is_driver(text: str | None) -> bool:
    return bool(text) and DRIVER_EXACT.match(text.strip()) is not None  # type: ignore[union-attr]


def parse_driver(text: str | None, what: str = "--driver") -> Ver:
    """An NVIDIA driver version (535.129.03, 570.26) as a comparable Ver; bad input is a UsageError."""
    value = (text or "").strip()
    if not DRIVER_EXACT.match(value):
        raise UsageError(f"{what} {text!r} is not an NVIDIA driver version", fix=DRIVER_FIX)
    return Ver(value)


def check_driver(value: str | None, what: str = "--driver") -> str | None:
    """None stays None; anything else must be a driver version (returned stripped)."""
    return None if value is None else str(parse_driver(value, what))


def branch_of(driver: Version | str) -> int:
    """The driver branch (535 for 535.129.03)."""
    version = driver if isinstance(driver, Version) else Ver(str(driver))
    return version.release[0]


def drivers_in(text: str) -> list[str]:
    """Every driver version written in a free text, in order."""
    return DRIVER_IN_TEXT.findall(text or "")


def normalize_arch(arch: str) -> str:
    """`uname -m` -> the architecture word NVIDIA uses in file names."""
    try:
        return ARCHES[arch.strip()]
    except KeyError:
        raise UsageError(f"NVIDIA publishes no .run driver for architecture {arch!r}",
                         fix="NVIDIA's Linux drivers exist for x86_64 and aarch64 only") from None


def runfile_name(version: str, arch: str) -> str:
    return f"NVIDIA-Linux-{normalize_arch(arch)}-{version}.run"


def parse_runfile_name(name: str) -> tuple[str, str] | None:
    """'NVIDIA-Linux-x86_64-535.129.03.run' (a path or URL is fine) -> ('x86_64', '535.129.03'); None for any
    other name."""
    match = RUNFILE.match(name.rsplit("/", 1)[-1].split("?", 1)[0])
    return (match["arch"], match["version"]) if match else None
