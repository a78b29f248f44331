"""Stopping a run on request (Ctrl-C, SIGTERM), in two stages.

A `CancelToken` is shared by the fleet's main thread and its workers:

- `cancel()` (first Ctrl-C): no new node and no new step starts. The runner calls `checkpoint()` between
  steps and between actions; it raises `Cancelled` there, so a running step ends at a safe point.
- `abort()` (second Ctrl-C, or the grace period ran out): the connection layer also gives up on the command
  it is waiting for (`check_abort()` in its polling loops) and the fleet returns at once.

Worker threads are bound to a token with `bind(token)`; code that runs in them asks `current()`. Code that
runs outside any fleet (a single-node run) sees a token that is never cancelled.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

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
        self.signal: signal.Signals | None = None  # the signal that cancelled the run, if one did

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


# -- signals -------------------------------------------------------------------------------------------------
# SIGINT (Ctrl-C) and SIGTERM (systemd stopping a unit, a CI timeout, `timeout`) both ask the run to stop at the
# next safe point; a second signal of either kind stops at once. The exit code follows the shell's convention
# for the signal that stopped the run: 130 for SIGINT, 143 for SIGTERM.
EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}
REASONS = {signal.SIGINT: "interrupted (Ctrl-C)", signal.SIGTERM: "stopped (SIGTERM)"}


def exit_code(token: CancelToken) -> int:
    """The exit code of a run that `token` stopped (130 unless a SIGTERM stopped it)."""
    return EXIT_CODES.get(token.signal, 130) if token.signal is not None else 130


@contextmanager
def signals(announce: Callable[[str], None] | None = None) -> Iterator[CancelToken]:
    """A fresh token that SIGINT and SIGTERM cancel for the duration of the block: the first signal asks the run
    to stop at the next safe point (between steps or actions; a running command finishes), the second stops at
    once (KeyboardInterrupt, which the connection layer turns into `Cancelled`). Outside the main thread signals
    cannot be caught, and the token is simply never cancelled. A handler someone else installed (a test harness,
    an embedding program) is left in charge of its signal: gpunode takes over only Python's default ones."""
    token = CancelToken()
    if threading.current_thread() is not threading.main_thread():
        yield token
        return

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if token.cancelled:
            token.abort()
            raise KeyboardInterrupt
        token.signal = signal.Signals(signum)
        token.cancel(REASONS[token.signal])
        if announce is not None:
            announce(f"{REASONS[token.signal]}: stopping at the next safe point (the running command finishes); "
                     "press Ctrl-C again to stop at once")

    defaults = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}
    previous: dict[signal.Signals, object] = {}
    for sig, default in defaults.items():
        if signal.getsignal(sig) is default:
            previous[sig] = signal.signal(sig, on_signal)
    try:
        yield token
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]


@contextmanager
def sigterm_as_ctrl_c(token: CancelToken) -> Iterator[None]:
    """For a loop that stops on KeyboardInterrupt (the fleet's main thread): a SIGTERM is the same request as a
    Ctrl-C, remembered on `token` for the exit code (143). Only Python's default handler is taken over, and only
    in the main thread."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        if token.signal is None:
            token.signal = signal.Signals(signum)
            token.reason = REASONS[token.signal]
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
