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

Round trips: the command that takes the lock also removes stale temp files and runs the RUN probe's first part
(`then`), so a run's first look at the node costs nothing extra; the release rides on the journal's last write
when there is one (`Lock.unlock`). A converged install sends two commands: lock + probe, and the release.
"""

from __future__ import annotations

import contextlib
import getpass
import posixpath
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from gpunode import cancel, fixes
from gpunode.connection.base import STALE_TEMP_BODY, TEMP_PARENT, Connection, Held, Result
from gpunode.errors import CommandError, GpunodeError
from gpunode.record import Frozen, Record
from gpunode.shell import Script, display

LOCK_PATH = "/var/lib/gpunode/run.lock"
POLL_SECONDS = 2.0
_END = "gpunode-lock-end"
STALE_PLACES = (TEMP_PARENT, posixpath.dirname(LOCK_PATH))  # where a run killed hard can leave temp files

# $1 the lock's path, $2 the holder's description (command, since, from). Prints `gpunode-lock-taken`, `-stale`
# or `-held` (exit 75), its own text, `gpunode-lock-other` and the other holder's text (stale, held), then
# `gpunode-lock-end`.
# $3 = "keep": this script keeps the lock itself (stdin stays open); a pid: the lock lives while that process runs
# (and outlives the script); "once": the lock outlives the script and names no process. Anything else (an empty
# pid, 1: a connection's process that is already gone) takes nothing and says so on stderr (exit 1).
# $4 a fresh marker; $5...: the directories where a run killed hard leaves temp files.
# Once the lock is taken, in the same command (no round trip of their own): the temp files an earlier run left
# in $5... are removed (gpunode/connection/base.py) and listed after `gpunode-lock-end`; then `$4 begin`, the
# output of the script that follows this one (`then`: the RUN probe's first part, run as if in a shell of its own:
# none of the lock's variables or functions, no positional parameters, stdin from /dev/null), and `$4 end`. A
# keeper then keeps the lock until its stdin ends.
_LOCK_TAKE = r"""lock=$1; info=$2; keep=$3; mark=$4; shift 4
mkdir -p -- "${lock%/*}" || exit 1
boot=$(cat /proc/sys/kernel/random/boot_id 2>/dev/null)
pid=-
case $keep in
  keep) pid=$$ ;;
  once) ;;
  ''|*[!0-9]*|0|1) printf 'gpunode-lock: no process on the node to name as the lock'"'"'s owner (%s)\n' "$keep" >&2; exit 1 ;;
  *) pid=$keep ;;
esac
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
""" + STALE_TEMP_BODY + r"""gpunode_lock_path=$lock; gpunode_lock_me=$me; gpunode_lock_keep=$keep; gpunode_lock_mark=$mark
unset lock info keep mark boot pid me old p b d
unset -f field alive report
set --
printf '%s begin\n' "$gpunode_lock_mark"
{
"""
_LOCK_KEEP = r"""
} </dev/null
printf '%s end\n' "$gpunode_lock_mark"
[ "$gpunode_lock_keep" = keep ] || exit 0
cat >/dev/null
[ "$(readlink -- "$gpunode_lock_path" && echo x)" = "$gpunode_lock_me
x" ] && rm -f -- "$gpunode_lock_path"
exit 0
"""


def lock_script(then: str = ":") -> str:
    """The lock's script, running `then` (a script's body, no arguments of its own) once the lock is taken."""
    return _LOCK_TAKE + then + _LOCK_KEEP


# $1 the lock's path, $2 the text it must still hold (a lock taken over by another run is not ours to remove).
# Ends in `true`, not `exit`: another command can carry it at its end (the journal's last write, Lock.unlock).
_UNLOCK = r"""[ "$(readlink -- "$1" && echo x)" = "$2
x" ] && rm -f -- "$1"
true"""
_READ = r"""readlink -- "$1" || exit 3"""


@dataclass(frozen=True, eq=False, repr=False)
class Holder(Frozen):
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
    """A taken lock: `release()` lets it go (safe to call twice). `then`: what the script given to `acquire` printed,
    run in the lock's own command once the lock was taken (None when none was given)."""

    def __init__(self, conn: Connection, text: str, held: Held | None, stale: Holder | None,
                 removed: list[str], then: Result | None = None) -> None:
        self.conn, self.text, self.held, self.stale = conn, text, held, stale
        self.removed = removed  # the stale temp files the taking removed
        self.then = then

    def unlock(self) -> Script | None:
        """The release as a script another command can run at its end, saving the release its own round trip (the
        journal's last write, gpunode/runrecord.py); call `carried()` once that command ran to its end. None when
        the lock is released otherwise (a keeper's input ends) or already was."""
        if self.held is not None or not self.text:
            return None
        return Script(_UNLOCK, (LOCK_PATH, self.text), "node-unlock")

    def carried(self) -> None:
        """The command that carried `unlock()` ran to its end on the node: the lock is released."""
        self.text = ""

    def release(self) -> None:
        if self.held is not None:
            self.held.release()  # the keeper removes the link once its input ends
            self.held = None
            return
        script = self.unlock()
        if script is not None:
            self.text = ""
            self.conn.run(script, sudo=True, timeout=30)


@dataclass(eq=False, repr=False)
class _Answer(Record):
    """One try at the lock: state taken | stale | held; ours the text we wrote, other the holder's; removed the
    stale temp files the script removed once it took the lock; then the `then` script's result."""

    state: str
    ours: str
    other: str
    keeper: Held | None
    removed: list[str]
    then: Result | None

    def lock(self, conn: Connection, stale: Holder | None = None) -> Lock:
        """The lock this try took (state taken or stale): a keeper releases it, else the text we wrote does."""
        return Lock(conn, "" if self.keeper is not None else self.ours, self.keeper, stale, self.removed, self.then)


def _try(conn: Connection, info: str, then: Script | None, then_timeout: float) -> _Answer:
    if then is not None and then.args:
        raise ValueError("the script run with the lock takes no arguments of its own")
    mark = f"gpunode-lock-{secrets.token_hex(8)}"
    body = lock_script(then.body if then is not None else ":")
    timeout = 60 + (then_timeout if then is not None else 0)
    owner = conn.lock_owner()
    held = None if owner else conn.hold(Script(body, (LOCK_PATH, info, "keep", mark, *STALE_PLACES), "node-lock"),
                                        sudo=True, until=f"{mark} end\n", timeout=timeout)
    code, timed_out, stderr = 0, False, ""
    if held is not None:
        output, keeper = held.output, held
        timed_out = held.ended and _END in output  # taken, but `then` did not finish in time
    else:  # the connection's own process on the node names the lock; or, for a transport that can keep no
        # command running (Ansible's), none: the lock outlives the script either way
        result = conn.run(Script(body, (LOCK_PATH, info, owner or "once", mark, *STALE_PLACES), "node-lock"),
                          sudo=True, timeout=timeout)
        if _END not in result.stdout and result.exit_code != 75:
            result.check("taking the node's gpunode lock")
        output, keeper = result.stdout, None
        code, timed_out, stderr = result.exit_code, result.timed_out, result.stderr
    head, _, rest = output.partition("\n")
    reported, _, after = rest.partition(_END + "\n")
    ours, _, other = reported.partition("\ngpunode-lock-other\n")
    removed_text, _, then_text = after.partition(f"{mark} begin\n")
    then_text, ended, _ = then_text.partition(f"{mark} end\n")
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
    shown = None
    if then is not None and state != "held":  # held: the script did not run `then` (nothing of it is used)
        shown = Result(display(then), 0 if ended else (code if code not in (0, 75) else -1), then_text, stderr,
                       timed_out and not ended)
    return _Answer(state, ours, other, keeper, [line for line in removed_text.splitlines() if line], shown)


_ABANDON_STOP = 5.0  # seconds an abandoned first try gets to end once its connection is closed


class Sent:
    """`acquire`'s first try, sent at once by a thread of its own, while the caller loads what the run needs
    (gpunode/cli/pipeline.py: an install's first command goes out as soon as the login is done). `acquire(...,
    sent=this)` reads its answer instead of making the first try; `abandon()` releases a lock it took when the run
    ends before that (a failed start-up), so no run finds it stale. Nothing else uses the connection meanwhile."""

    def __init__(self, conn: Connection, command: str, then: Script | None = None, then_timeout: float = 0.0) -> None:
        self.conn, self.command, self.then, self.then_timeout = conn, command, then, then_timeout
        self.info = _me(command)
        self.started = time.monotonic()  # --lock-timeout counts from here
        self._answer: _Answer | None = None
        self._error: BaseException | None = None
        self._read = False
        self._stop = cancel.CancelToken()  # the thread's own: abandon() aborts the try under way
        self._thread = threading.Thread(target=self._send, name="gpunode-first-command", daemon=True)
        self._thread.start()

    def _send(self) -> None:
        try:
            with cancel.bind(self._stop):
                self._answer = _try(self.conn, self.info, self.then, self.then_timeout)
        except BaseException as exc:  # noqa: BLE001 - raised again by answer(), in the caller's thread
            self._error = exc

    def answer(self) -> _Answer:
        """The first try's answer, waited for (a hard abort, the second Ctrl-C, stops the wait), or what it raised."""
        while self._thread.is_alive():
            self._thread.join(0.05)
            cancel.check_abort("taking the node's gpunode lock")
        self._read = True
        if self._error is not None:
            raise self._error
        assert self._answer is not None
        return self._answer

    def abandon(self, wait: float) -> None:
        """The run ends before reading the answer (a failed start-up, Ctrl-C): wait up to `wait` seconds for it and
        release a lock it took. With no answer by then the try is aborted and the connection closed (a lock the try
        took dies with the connection's process: stale for the next run). Nothing once `answer()` returned."""
        if self._read:
            return
        self._read = True
        self._thread.join(wait)
        if self._thread.is_alive():
            self._stop.abort()  # no new login, no more waiting on the node (cancel.check_abort)
            self.conn.close()
            self._thread.join(_ABANDON_STOP)
            return
        answer = self._answer
        if answer is not None and answer.state != "held":
            with contextlib.suppress(GpunodeError):
                answer.lock(self.conn).release()


def acquire(conn: Connection, command: str, timeout: float, note: Callable[[str], None] = lambda text: None,
            then: Script | None = None, then_timeout: float = 0.0, sent: Sent | None = None) -> Lock:
    """Take the node's lock, waiting up to `timeout` seconds while another run holds it; NodeLocked (exit 2)
    naming the holder when it is still held then. A stale lock (its keeper gone) is taken over, with a note.
    `then`, a read-only script (the RUN probe's first part), runs as root in the same command once the lock is
    taken: one round trip for both, `then_timeout` seconds more for it. A try that finds the lock held does not
    run it (nothing of that try is used); its output is `Lock.then`."""
    if sent is not None and (sent.conn, sent.command, sent.then, sent.then_timeout) != (conn, command, then,
                                                                                         then_timeout):
        raise ValueError("the lock's first try was sent for another command")
    info = _me(command) if sent is None else sent.info
    deadline = (time.monotonic() if sent is None else sent.started) + timeout
    announced = False
    while True:
        answer = _try(conn, info, then, then_timeout) if sent is None else sent.answer()
        sent = None
        if answer.state != "held":
            stale = Holder.parse(answer.other) if answer.state == "stale" else None
            if stale is not None:
                note(f"took over a stale gpunode lock (its run is gone from the node): {stale.describe()}")
            return answer.lock(conn, stale)
        holder = Holder.parse(answer.other)
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
def held(conn: Connection, command: str, timeout: float, note: Callable[[str], None] = lambda text: None,
         then: Script | None = None, then_timeout: float = 0.0, sent: Sent | None = None) -> Iterator[Lock]:
    """The node's lock for the duration of the block, released on every way out of it (errors, Ctrl-C,
    SIGTERM). Taking it removes the temp files an earlier run left behind (no other run is active) and runs
    `then` (see `acquire`). A release that fails (the connection is gone) leaves a lock the next run finds stale."""
    lock = acquire(conn, command, timeout, note, then, then_timeout, sent)
    try:
        if lock.removed:
            note(f"removed {len(lock.removed)} temporary file(s) an earlier run left behind: {', '.join(lock.removed)}")
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
