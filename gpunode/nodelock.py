"""One gpunode run at a time on a node: a lock held on the node itself, so it works the same for a local run,
SSH and the node simulator, whichever machine (or how many) gpunode runs from.

The lock is a symlink, `LOCK_PATH`, whose target text names its holder: the node-side process whose life is the
lock's, the boot it was taken in, the command, when, and from which machine. Creating a symlink is atomic, so of
two runs only one takes it. Over SSH that process is sshd's process of the run's connection
(`Connection.lock_owner`, the parent of the command channel's shell): it ends when the connection does, however
gpunode stops (released, Ctrl-C, SIGTERM, a crash, a SIGKILL), and the lock costs no channel of its own. Where
there is no such process, a keeper does it: a small shell script left running on the node with its stdin open
(`Connection.hold`), which removes the link once its input ends. A lock whose process is gone on the node (not
running, or another boot) is stale: the next run takes it over and says so; a takeover holds a short-lived
mutex (`LOCK_PATH.takeover`, a directory) so of two runs that found the same stale lock only one takes it.

`install`, `uninstall` (and so the upgrade paths, which are installs) take it around everything that reads and
writes the journal; a second run waits up to --lock-timeout, then stops with exit 2 naming the holder.
Read-only commands never take it.
"""

from __future__ import annotations

import getpass
import posixpath
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from gpunode import cancel, fixes
from gpunode.connection.base import STALE_TEMP_BODY, TEMP_PARENT, Connection, Held
from gpunode.errors import CommandError, GpunodeError
from gpunode.shell import Script

LOCK_PATH = "/var/lib/gpunode/run.lock"
POLL_SECONDS = 2.0
_END = "gpunode-lock-end"
STALE_PLACES = (TEMP_PARENT, posixpath.dirname(LOCK_PATH))  # where a run killed hard can leave temp files

# $1 the lock's path, $2 the holder's description (command, since, from). Prints `gpunode-lock-taken`, `-stale`
# or `-held` (exit 75), its own text, `gpunode-lock-other` and the other holder's text (stale, held), then
# `gpunode-lock-end`; once taken, keeps it until stdin ends.
# $3 = "keep": this script keeps the lock itself (stdin stays open); a pid: the lock lives while that process runs
# (and outlives the script); else ("once") the lock outlives the script and names no process.
# $4...: unless keep, once the lock is taken the temp files an earlier run left in these directories are removed
# (gpunode/connection/base.py) and listed after `gpunode-lock-end`, in the same round trip.
_LOCK = r"""lock=$1; info=$2; keep=$3; shift 3
mkdir -p -- "${lock%/*}" || exit 1
boot=$(cat /proc/sys/kernel/random/boot_id 2>/dev/null)
pid=-
[ "$keep" = keep ] && pid=$$
case $keep in *[!0-9]*|'') ;; *) pid=$keep ;; esac
me="gpunode-lock pid=$pid boot=$boot
$info"
field() { printf '%s\n' "$1" | sed -n "1s/.* $2=\([^ ]*\).*/\1/p"; }
alive() {
  p=$(field "$1" pid); b=$(field "$1" boot)
  [ "$b" = "$boot" ] || return 1
  [ "$p" = - ] && return 0
  [ -n "$p" ] && kill -0 "$p" 2>/dev/null
}
report() { printf '%s\n%s\n%s\n%s\n%s\n' "$1" "$me" gpunode-lock-other "$2" gpunode-lock-end; }
if ! ln -s -- "$me" "$lock" 2>/dev/null; then
  old=$(readlink -- "$lock" && echo x); old=${old%??}
  if alive "$old"; then report gpunode-lock-held "$old"; exit 75; fi
  # the takeover: one run at a time (a mutex left by a run killed inside these lines is stale after a minute)
  if ! mkdir -- "$lock.takeover" 2>/dev/null; then
    [ -n "$(find "$lock.takeover" -maxdepth 0 -mmin +1 2>/dev/null)" ] && rmdir -- "$lock.takeover" 2>/dev/null
    report gpunode-lock-held "$old"; exit 75
  fi
  [ "$(readlink -- "$lock" && echo x)" = "$old
x" ] && rm -f -- "$lock"
  if ! ln -s -- "$me" "$lock" 2>/dev/null; then
    rmdir -- "$lock.takeover"; report gpunode-lock-held "$(readlink -- "$lock")"; exit 75
  fi
  rmdir -- "$lock.takeover"
  report gpunode-lock-stale "$old"
else
  report gpunode-lock-taken ""
fi
if [ "$keep" != keep ]; then
""" + STALE_TEMP_BODY + r"""exit 0
fi
cat >/dev/null
[ "$(readlink -- "$lock" && echo x)" = "$me
x" ] && rm -f -- "$lock"
exit 0
"""
# $1 the lock's path, $2 the text it must still hold (a lock taken over by another run is not ours to remove)
_UNLOCK = r"""[ "$(readlink -- "$1" && echo x)" = "$2
x" ] && rm -f -- "$1"; exit 0"""
_READ = r"""readlink -- "$1" || exit 3"""


@dataclass(frozen=True)
class Holder:
    """Who holds (or held) the lock, from the link's text."""

    pid: str
    command: str
    since: str
    source: str  # the machine (and user) gpunode ran on

    @classmethod
    def parse(cls, text: str) -> Holder:
        first, _, rest = text.partition("\n")
        fields = dict(w.split("=", 1) for w in first.split(" ")[1:] if "=" in w)
        info = dict(line.split("=", 1) for line in rest.splitlines() if "=" in line)
        return cls(fields.get("pid", "?"), info.get("command", "?"), info.get("since", "?"), info.get("from", "?"))

    def describe(self) -> str:
        pid = "" if self.pid in ("-", "?") else f"pid {self.pid} on the node, "
        return f"{pid}`{self.command}` since {self.since}, from {self.source}"


class NodeLocked(GpunodeError):
    """Another gpunode run holds the node's lock."""

    exit_code = 2


def _me(command: str) -> str:
    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = ""
    source = f"{user}@{socket.gethostname()}" if user else socket.gethostname()
    # one line each: the link's text is read back line by line
    return "\n".join((f"command=gpunode {' '.join(command.split())}", f"since={since}", f"from={' '.join(source.split())}"))


class Lock:
    """A taken lock: `release()` lets it go (safe to call twice)."""

    def __init__(self, conn: Connection, text: str, held: Held | None, stale: Holder | None,
                 removed: list[str] | None = None) -> None:
        self.conn, self.text, self.held, self.stale = conn, text, held, stale
        self.removed = removed  # the stale temp files the taking removed; None: not looked for yet

    def release(self) -> None:
        if self.held is not None:
            self.held.release()  # the keeper removes the link once its input ends
            self.held = None
            return
        if self.text:
            text, self.text = self.text, ""
            self.conn.run(Script(_UNLOCK, (LOCK_PATH, text), "node-unlock"), sudo=True, timeout=30)


def _try(conn: Connection, info: str) -> tuple[str, str, str, Held | None, list[str] | None]:
    """(state, ours, other, keeper, removed): state taken | stale | held; ours the text we wrote, other the
    holder's; removed the stale temp files the script removed once it took the lock (None with a keeper, whose
    output ends at the end marker: the caller removes them)."""
    owner = conn.lock_owner()
    held = None if owner else conn.hold(Script(_LOCK, (LOCK_PATH, info, "keep"), "node-lock"), sudo=True, until=_END,
                                        timeout=60)
    if held is not None:
        output, keeper = held.output, held
    else:  # the connection's own process on the node names the lock; or, for a transport that can keep no
        # command running (Ansible's), none: the lock outlives the script either way
        result = conn.run(Script(_LOCK, (LOCK_PATH, info, owner or "once", *STALE_PLACES), "node-lock"), sudo=True,
                          timeout=60)
        if result.exit_code not in (0, 75) or _END not in result.stdout:
            result.check("taking the node's gpunode lock")
        output, keeper = result.stdout, None
    head, _, rest = output.partition("\n")
    reported, _, after = rest.partition(_END)
    ours, _, other = reported.partition("\ngpunode-lock-other\n")
    removed = None if keeper is not None else [line for line in after.splitlines() if line]
    other = other.rstrip("\n")
    if head not in ("gpunode-lock-taken", "gpunode-lock-stale", "gpunode-lock-held") or _END not in output:
        if keeper is not None:
            keeper.release()
        raise CommandError(f"{conn.name}: could not take the node's gpunode lock at {LOCK_PATH} "
                           f"(it answered {output.strip()[:200]!r})",
                           fix="check that /var/lib/gpunode on the node is writable by root, then run again")
    state = head.removeprefix("gpunode-lock-")
    if state == "held" and keeper is not None:
        keeper.release()
        keeper = None
    return state, ours, other, keeper, removed


def acquire(conn: Connection, command: str, timeout: float, note: Callable[[str], None] = lambda text: None) -> Lock:
    """Take the node's lock, waiting up to `timeout` seconds while another run holds it; NodeLocked (exit 2)
    naming the holder when it is still held then. A stale lock (its keeper gone) is taken over, with a note."""
    info = _me(command)
    deadline = time.monotonic() + timeout
    announced = False
    while True:
        state, ours, other, keeper, removed = _try(conn, info)
        if state != "held":
            stale = Holder.parse(other) if state == "stale" else None
            if stale is not None:
                note(f"took over a stale gpunode lock (its run is gone from the node): {stale.describe()}")
            return Lock(conn, "" if keeper is not None else ours, keeper, stale, removed)
        holder = Holder.parse(other)
        left = deadline - time.monotonic()
        if left <= 0:
            raise NodeLocked(f"{conn.name}: another gpunode run holds the node: {holder.describe()}"
                             f" (waited {timeout:.0f}s for it)",
                             fix="let that run finish (" + fixes.gpunode("status") + " shows it), then run the same "
                                 "command again; or wait longer with --lock-timeout SECONDS" + (
                                     "" if holder.pid not in ("-", "?") else
                                     "; if no gpunode run is active on the node any more (this lock has no keeper "
                                     "process to tell), remove it: " + fixes.on_node(f"sudo rm -f {LOCK_PATH}")))
        if not announced:
            note(f"waiting up to {timeout:.0f}s for another gpunode run on this node: {holder.describe()}")
            announced = True
        cancel.checkpoint("taking the node's gpunode lock")
        cancel.sleep(min(POLL_SECONDS, max(0.0, left)))
        cancel.checkpoint("taking the node's gpunode lock")


@contextmanager
def held(conn: Connection, command: str, timeout: float, note: Callable[[str], None] = lambda text: None
         ) -> Iterator[Lock]:
    """The node's lock for the duration of the block, released on every way out of it (errors, Ctrl-C,
    SIGTERM). Once it is held, the temp files an earlier run left behind are removed (no other run is active).
    A release that fails (the connection is gone) leaves a lock the next run finds stale."""
    lock = acquire(conn, command, timeout, note)
    try:
        # no other run is active now: what a run killed hard left in the temp places is stale
        gone = lock.removed if lock.removed is not None else conn.remove_stale_temp(STALE_PLACES)
        if gone:
            note(f"removed {len(gone)} temporary file(s) an earlier run left behind: {', '.join(gone)}")
        yield lock
    finally:
        with cancel.bind(cancel.CancelToken()):  # released even after a hard abort
            try:
                lock.release()
            except GpunodeError:
                pass


def holder(conn: Connection) -> Holder | None:
    """Read-only: who holds the lock now (None: nobody; a lock whose run is gone still shows). For status."""
    result = conn.run(Script(_READ, (LOCK_PATH,), "node-lock-read"), timeout=30)
    return Holder.parse(result.stdout.rstrip("\n")) if result.ok and result.stdout.strip() else None
