"""An install's first command: the node's lock, taken with the RUN probe's first part in the same command (one
round trip for both, gpunode/nodelock.py). The runner makes it (runner.locked); the CLI can send it ahead, as soon
as the login is done, and load the steps, the runner and the output while the node works (gpunode/cli/pipeline.py).
Either way it is the same command, made here."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field

from gpunode import cancel, nodelock
from gpunode.connection.base import Connection
from gpunode.facts import PROBE_TIMEOUT, ProbeRequest, first_probe
from gpunode.record import Record


def install_command(names: Iterable[str]) -> str:
    """What an install's lock and journal call the run: the steps it runs, in order."""
    return "install " + " ".join(names)


@dataclass(eq=False, repr=False)
class FirstCommand(Record):
    command: str  # the lock's (install_command, or `gpunode uninstall`'s)
    probe: ProbeRequest = field(default_factory=first_probe)
    sent: nodelock.Sent | None = None  # sent ahead (`send`), its answer not read yet

    def send(self, conn: Connection) -> FirstCommand:
        """Send it now, from a thread of its own (nodelock.Sent); `held` reads its answer."""
        self.sent = nodelock.Sent(conn, self.command, self.probe.script, PROBE_TIMEOUT)
        return self

    def held(self, conn: Connection, timeout: float, note: Callable[[str], None]
             ) -> AbstractContextManager[nodelock.Lock]:
        """The lock for the block (nodelock.held), the probe's output in its `then`."""
        return nodelock.held(conn, self.command, timeout, note, self.probe.script, PROBE_TIMEOUT, self.sent)


ABANDON_WAIT = 5.0  # seconds a failed start-up waits for the answer of a command sent ahead, to release its lock


@contextmanager
def sent_ahead(conn: Connection, command: str) -> Iterator[FirstCommand]:
    """The first command, sent now; the block loads what the run needs and reads its answer (runner.locked). A
    block that ends before reading it (an error, Ctrl-C) releases the lock it took (nodelock.Sent.abandon)."""
    first = FirstCommand(command).send(conn)
    assert first.sent is not None
    wait = ABANDON_WAIT
    try:
        yield first
    except (KeyboardInterrupt, cancel.Cancelled):  # stopped by the user: at once
        wait = 0.0
        raise
    finally:
        first.sent.abandon(wait)
