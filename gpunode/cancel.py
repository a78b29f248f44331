"""Stopping a run on request (Ctrl-C), in two stages.

A `CancelToken` is shared by the fleet's main thread and its workers:

- `cancel()` (first Ctrl-C): no new node and no new step starts. The runner calls `checkpoint()` between
  steps and between actions; it raises `Cancelled` there, so a running step ends at a safe point.
- `abort()` (second Ctrl-C, or the grace period ran out): the connection layer also gives up on the command
  it is waiting for (`check_abort()` in its polling loops) and the fleet returns at once.

Worker threads are bound to a token with `bind(token)`; code that runs in them asks `current()`. Code that
runs outside any fleet (a single-node run) sees a token that is never cancelled.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from gpunode import fixes
from gpunode.errors import GpunodeError


class Cancelled(GpunodeError):
    """The run was interrupted (Ctrl-C) and stopped at a safe point, or was aborted."""

    exit_code = 130


class CancelToken:
    def __init__(self) -> None:
        self._cancelled = threading.Event()
        self._aborted = threading.Event()
        self.reason = "interrupted (Ctrl-C)"

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    @property
    def aborted(self) -> bool:
        return self._aborted.is_set()

    def cancel(self, reason: str | None = None) -> None:
        if reason:
            self.reason = reason
        self._cancelled.set()

    def abort(self) -> None:
        self._cancelled.set()
        self._aborted.set()

    def checkpoint(self, where: str = "") -> None:
        """Raise `Cancelled` when a stop was requested: call it only where stopping leaves the node consistent."""
        if self.cancelled:
            at = f" before {where}" if where else ""
            raise Cancelled(f"stopped{at}: {self.reason}", fix="run the same command again to continue")

    def check_abort(self, doing: str = "") -> None:
        """Raise `Cancelled` only on a hard abort: for loops that wait on the network."""
        if self.aborted:
            what = f" while {doing}" if doing else ""
            raise Cancelled(f"aborted{what}: {self.reason}; the node may be in the middle of a step",
                            fix=fixes.CHECK_AND_RERUN)

    def sleep(self, seconds: float) -> bool:
        """Sleep, waking early on cancel. Returns True when cancelled."""
        return self._cancelled.wait(max(0.0, seconds))


_NEVER = CancelToken()
_local = threading.local()


def current() -> CancelToken:
    """The token of the calling thread's run (a token never cancelled outside a fleet)."""
    token: CancelToken | None = getattr(_local, "token", None)
    return token if token is not None else _NEVER


@contextmanager
def bind(token: CancelToken) -> Iterator[CancelToken]:
    """Make `token` the calling thread's token for the duration of the block."""
    previous = getattr(_local, "token", None)
    _local.token = token
    try:
        yield token
    finally:
        _local.token = previous


def checkpoint(where: str = "") -> None:
    """The runner's hook: `cancel.checkpoint(f"step {step.name}")` between steps and actions."""
    current().checkpoint(where)


def check_abort(doing: str = "") -> None:
    current().check_abort(doing)


def sleep(seconds: float) -> bool:
    """An interruptible time.sleep for wait loops (reboot polling). True when cancelled."""
    return current().sleep(seconds)
