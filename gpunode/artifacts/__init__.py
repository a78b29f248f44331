"""Getting the NVIDIA .run installer onto the machine running gpunode, verified, before anything runs as root.

The node never needs internet: gpunode downloads here (resumable, HTTP Range), keeps the file in a cache keyed by
version and architecture, and checks it three ways before it is uploaded: `--sha256` when given, NVIDIA's
published `.sha256sum` when one exists, and the makeself archive's own CRC/MD5/SHA256 (what `sh FILE --check`
does), computed here in Python from the archive header. The .run is never executed on this machine.

- naming.py: official URLs, checksum URLs, mirror base, cache layout (pure; the runfile name and the
  architecture words are in gpunode/versions.py)
- makeself.py: the archive header, POSIX cksum, `check_makeself`
- checksums.py: sha256 of a file, sha256sum-format text
- download.py: HTTP with resume, retries, timeouts, the cache lock; progress through a plain callback
- source.py: `Source` (resolved at plan time, no I/O), `resolve`, `verify`, `obtain` (the I/O, at apply time)
- request.py: the driver options as typed on the command line -> Options fields

This package draws nothing: a transfer reports progress to a `ProgressFn`, made by the `ProgressBars` factory
the CLI puts in Options (gpunode/cli/progress.py); None means silent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

from gpunode.errors import GpunodeError

ProgressFn = Callable[[int, int | None], None]
"""progress(done, total): bytes transferred so far, and the size when known."""

ProgressBars = Callable[[str], AbstractContextManager[ProgressFn]]
"""title -> a progress display for one transfer, open while the transfer runs."""


class DownloadError(GpunodeError):
    """The installer could not be fetched, or failed verification: nothing was run."""


def _ignore(done: int, total: int | None) -> None:
    pass


@contextmanager
def silent(title: str) -> Iterator[ProgressFn]:
    """The ProgressBars to use when none was given: reports go nowhere."""
    yield _ignore
