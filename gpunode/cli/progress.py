"""Progress bars for transfers (the driver download, its upload), drawn by the CLI: the `ProgressBars` the
CLI puts in Options. gpunode/artifacts and the steps only call the plain callback they are given."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from gpunode.ui import err

if TYPE_CHECKING:
    from gpunode.artifacts import ProgressFn


def _ignore(done: int, total: int | None) -> None:
    pass


@contextmanager
def rich_bars(title: str) -> Iterator[ProgressFn]:
    """A bar on stderr fed with (bytes so far, total). gpunode.ui is main-thread only, and rich allows one live
    display at a time: elsewhere, or while another display is live, the transfer runs without a bar. rich's
    progress display is imported here, by a transfer: a converged run makes none."""
    from rich.errors import LiveError
    from rich.markup import escape
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    if threading.current_thread() is not threading.main_thread():
        yield _ignore
        return
    progress = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                        TimeRemainingColumn(), console=err, transient=False)
    try:
        progress.start()
    except LiveError:
        yield _ignore
        return
    task = progress.add_task(escape(title), total=None)

    def update(done: int, total: int | None) -> None:
        progress.update(task, completed=done, total=total)

    try:
        yield update
    finally:
        progress.stop()
