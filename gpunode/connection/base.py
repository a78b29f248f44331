"""The one interface gpunode uses to touch a node. Local, SSH and fake connections implement `_exec`;
reading and writing files, uploads and privilege escalation are built once here on top of it, as POSIX sh,
so the node needs nothing but a shell and core utilities (a large upload is hashed as it arrives either way: by
python3 where the node has it, else by openssl or sha256sum reading the file as it is written)."""

from __future__ import annotations

import hashlib
import os
import posixpath
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

from gpunode.errors import CommandError, CommandTimeout, ConnectError
from gpunode.record import Frozen
from gpunode.shell import Cmd, Script, Secret, display, quote, render

DEFAULT_TIMEOUT = 600.0
ProgressCallback = Callable[[int, int], None]

_READ_FILE = Script(
    name="read-file",
    body='if [ -e "$1" ]; then exec cat -- "$1"; else exit 44; fi',
)

# Receive stdin into a temp file beside $dest and check that exactly $size bytes arrived; leaves its SHA256 in
# $sum. The temp file is removed on any exit unless the script clears the EXIT trap. Shared by the verified write
# and the upload. A large file that python3 did not hash (below) is hashed by openssl where the node has it: it
# uses the CPU's SHA instructions, ~7x faster than coreutils' or busybox's sha256sum (400 MB: 0.3 s of CPU against
# 2 s); its start-up (~30 ms) costs more than that saves below 16 MiB. An answer that is not 64 hex digits (no
# openssl, a broken one) means sha256sum.
# Above 16 MiB, where the node has python3, the bytes are hashed as they arrive by the process that writes them
# (_STREAM_HASH), so the hash overlaps the transfer instead of following it, and the file is never read back.
# After the transfer, openssl's hash took ~0.56 s of a 400 MB upload's ~1.8 s (0.63x scp's speed; 0.92x with
# the hash in the stream: benchmarks/upload.py, docs/benchmarks.md). Its pipe from sshd is raised to 1 MiB:
# at the default 64 KiB, sshd waited on every hash update and the stream was slower than cat's (0.59x).
# python3 prints `gpunode-py` before it reads a byte: without that line (no python3, a broken one) stdin is
# untouched and `cat` takes it, with the hash following the file (_FOLLOW_HASH); after it, python3 owns the stream,
# and its failure (a full disk) is the upload's. The length check, and no rename unless the sha256 matches, are the
# same either way.
_STREAM_HASH = r"""import os, sys
try:
    import hashlib
    h = hashlib.sha256()
    f = os.open(sys.argv[1], os.O_WRONLY | os.O_TRUNC)
except Exception:
    sys.exit(3)
try:
    import fcntl
    fcntl.fcntl(0, 1031, 1 << 20)
except Exception:
    pass
print("gpunode-py", flush=True)
try:
    while True:
        b = os.read(0, 1048576)
        if not b:
            break
        h.update(b)
        v = memoryview(b)
        while v:
            v = v[os.write(f, v):]
    os.close(f)
except OSError as e:
    sys.stderr.write("gpunode-receive: %s\n" % (e.strerror or e))
    sys.exit(1)
print(h.hexdigest())
"""
# Above 16 MiB without python3: `cat` writes the stream to the temp file (as fast as it did alone) while a
# background job feeds the part written so far to the hash tool: whole MiB with dd as the file grows (polled every
# 50 ms), the rest once cat is done. The hash then runs on the other core during the transfer instead of after it,
# and it reads what is in the file, not a copy of the stream. `tee` into a FIFO costs more than hashing after: GNU
# tee copies 8 KiB per read, busybox tee 1 KiB (docs/benchmarks.md, "Upload: the node hashes a large upload as it
# arrives"). The tool is chosen as before, in the background while the first bytes arrive: openssl if it hashes
# nothing correctly (a FIPS refusal or a library mismatch fails that), else sha256sum (coreutils' or busybox's).
# Once chosen, a tool that dies, or a feed that stops (the file gone), fails the upload with `gpunode-hash`: never
# an unverified file. Its work directory, named as the temp file is (so the stale-temp sweep, _STALE_TEMP, finds it
# after a SIGKILL), holds the tool's name, its answer and the `done`/`fed` marks, and goes on every exit. Where dd
# or that directory is missing: `cat`, then the hash after, as before.
_EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
_FOLLOW_HASH = r"""      gpunode_feed() {
        n=0
        while [ ! -e "$work/done" ]; do
          kill -0 "$$" 2>/dev/null || return 1
          out=$(ls -ln -- "$tmp" 2>/dev/null) || return 1
          set -- $out
          case $5 in "" | *[!0-9]*) return 1 ;; esac
          k=$(($5 / 1048576 - n))
          if [ "$k" -gt 0 ]; then
            dd if="$tmp" bs=1048576 skip="$n" count="$k" 2>/dev/null || return 1
            n=$((n + k))
          else
            sleep 0.05 2>/dev/null || sleep 1
          fi
        done
        dd if="$tmp" bs=1048576 skip="$n" 2>/dev/null
      }
      gpunode_sum() {
        e=$(openssl dgst -sha256 -r < /dev/null 2>/dev/null) || e=
        if [ "${e%% *}" = @EMPTY@ ]; then set -- openssl dgst -sha256 -r; else set -- sha256sum; fi
        printf '%s' "$1" > "$work/tool"
        { gpunode_feed && : > "$work/fed"; } | "$@" > "$work/sum"
      }
      gpunode_sum &
      hashing=$!
      cat > "$tmp"
      : > "$work/done"
      st=0
      wait "$hashing" || st=$?
      hashing=
      if [ "$st" != 0 ] || [ ! -e "$work/fed" ]; then
        tool=$(cat -- "$work/tool" 2>/dev/null) || tool="sha256 tool"
        echo "gpunode-hash the node's $tool stopped before the end of the upload (exit $st)" >&2
        exit 47
      fi
      sum=$(cat -- "$work/sum")
      rm -rf -- "$work"
      work=
""".replace("@EMPTY@", _EMPTY_SHA256)
_RECEIVE = r"""dir=$(dirname -- "$dest" && echo x); dir=${dir%??}
mkdir -p -- "$dir"
@UMASK@tmp=$(mktemp "$dir/.gpunode-@KIND@.XXXXXX" && echo x); tmp=${tmp%??}
work=; hashing=
gpunode_clean() {
  rm -f -- "$tmp"
  if [ -n "$hashing" ]; then
    { : > "$work/done"; } 2>/dev/null || :
    wait "$hashing" || :
  fi
  [ -z "$work" ] || rm -rf -- "$work"
}
trap gpunode_clean EXIT
trap 'exit 129' HUP INT TERM PIPE
set -f
if [ "$size" -gt 16777216 ]; then big=1; else big=; fi
py=
if [ -n "$big" ] && command -v python3 >/dev/null 2>&1; then
  py=$(python3 -I -S -c '""" + _STREAM_HASH + r"""' "$tmp") || py="$py x"
fi
sum=
case $py in
  "" | " x")
    if [ -n "$big" ] && command -v dd >/dev/null 2>&1 \
        && work=$(mktemp -d "$dir/.gpunode-@KIND@.XXXXXX" 2>/dev/null && echo x); then
      work=${work%??}
""" + _FOLLOW_HASH + r"""    else
      cat > "$tmp"
    fi ;;
  *" x") exit 1 ;;
  *) sum=${py#gpunode-py?} ;;
esac
# the length from ls (busybox wc -c reads the whole file); the fields before the size hold no blanks
set -- $(ls -ln -- "$tmp")
got=$5
if [ "$got" != "$size" ]; then
  echo "gpunode-short only $got of $size bytes arrived" >&2
  exit 46
fi
sum=${sum%% *}
case $sum in *[!0-9a-f]*) sum= ;; esac
if [ "${#sum}" != 64 ] && [ -n "$big" ]; then
  sum=$(openssl dgst -sha256 -r < "$tmp" 2>/dev/null) || sum=
  sum=${sum%% *}
  case $sum in *[!0-9a-f]*) sum= ;; esac
fi
[ "${#sum}" = 64 ] || sum=$(sha256sum < "$tmp")
"""


def _receive(kind: str, private: bool) -> str:
    return _RECEIVE.replace("@KIND@", kind).replace("@UMASK@", "umask 077\n" if private else "")


# Atomic, verified replace with a backup. The content arrives on stdin into a temp file in the destination's
# directory; nothing is renamed unless exactly SIZE bytes with the expected SHA256 arrived (a dropped
# connection ends stdin early: that must never look like success). Then fsync the file, keep a copy of the
# old one (its suffix never matches *.conf / *.toml / *.json / *.list, so modprobe, containerd, docker and apt
# ignore it), rename over the destination and fsync the directory. A symlink is written through: its
# target is replaced and the link stays (configuration management often links these files).
# A symlink at $dest is written through: $dest becomes its target, the link stays. A link to a directory, or one
# that cannot be resolved, is refused (exit 45, `gpunode-badlink`). Shared by the write script and by uninstall's
# restore (gpunode/undo/actions.py), so a file is put back where install wrote it.
THROUGH_LINK = r"""if [ -L "$dest" ]; then
  target=$(readlink -f -- "$dest" && echo x) && target=${target%??} || target=
  if [ -z "$target" ] || [ -d "$target" ]; then
    echo "gpunode-badlink $dest points to ${target:-a path that cannot be resolved}" >&2
    exit 45
  fi
  dest=$target
fi
"""
_WRITE_FILE = Script(
    name="write-file",
    body=r"""set -e
dest=$1; mode=$2; keep=$3; size=$4; want=$5
""" + THROUGH_LINK + r"""# (command substitution drops trailing newlines, which a path may end with: keep them behind an "x")
""" + _receive("tmp", private=False) + r"""if [ "${sum%% *}" != "$want" ]; then
  echo "gpunode-checksum the content that arrived does not match its sha256" >&2
  exit 46
fi
chmod "$mode" "$tmp"
if [ -f "$dest" ] && cmp -s -- "$tmp" "$dest"; then
  echo "gpunode-unchanged"
  exit 0
fi
sync -- "$tmp" 2>/dev/null || sync
backup=
if [ "$keep" = 1 ] && [ -e "$dest" ]; then
  backup="$dest.gpunode-bak.$(date +%Y%m%dT%H%M%S)"
  [ ! -e "$backup" ] || backup="$backup.$$"
  cp -p -- "$dest" "$backup"
fi
mv -f -- "$tmp" "$dest"
trap - EXIT
sync -- "$dir" 2>/dev/null || sync
echo "gpunode-written $backup"
""",
)

# The first privileged command checks for root in the same round trip (see Connection._run_if_root).
_NOT_ROOT = "gpunode-not-root"
_NOT_ROOT_EXIT = 86

# An upload streamed through a command's stdin (an exec channel: as fast as scp, no SFTP subsystem needed),
# into a private temp file next to the destination (same filesystem, so the final rename is atomic). The
# node reports the length and sha256 of what arrived; the client compares them with what it sent and only
# then renames (UPLOAD_INSTALL). A dropped connection ends stdin early: the length check fails and the trap
# removes the temp file, so a half-written file is never left, least of all under the final name.
UPLOAD_RECEIVE = Script(
    name="upload-receive",
    body=r"""set -e
dest=$1; size=$2
""" + _receive("upload", private=True) + r"""trap - EXIT
printf 'gpunode-received %s %s\n%s' "$got" "${sum%% *}" "$tmp"
""",
)
UPLOAD_INSTALL = Script(name="upload-install", body='chmod "$3" -- "$1" && mv -f -- "$1" "$2"')
UPLOAD_DISCARD = Script(name="upload-discard", body='rm -f -- "$1"')


def parse_received(stdout: bytes) -> tuple[int, str, str] | None:
    """(length, sha256, temp path) from UPLOAD_RECEIVE's output; None when it did not finish."""
    head, sep, path = stdout.decode("utf-8", "surrogateescape").partition("\n")
    fields = head.split(" ")
    if not sep or len(fields) != 3 or fields[0] != "gpunode-received" or not fields[1].isdigit() or not path:
        return None
    return int(fields[1]), fields[2], path


_MKTEMP_DIR = Script(name="mktemp-dir", body='umask 077; mktemp -d "${1:-/var/tmp}/gpunode.XXXXXX"')
TEMP_PARENT = "/var/tmp"  # where private work directories (driver uploads) are made
# The temp files and directories gpunode itself makes (the receive script's `.gpunode-KIND.XXXXXX` beside a
# destination, make_private_dir's `gpunode.XXXXXX`) that a run killed hard (SIGKILL, a lost node) can leave
# behind, in the places they go: the work directory's parent and the journal's directory. Prints each removed.
# Run by the node lock's script once it has taken the lock (gpunode/nodelock.py): then no other run is active.
STALE_TEMP_BODY = r"""for d; do
  [ -d "$d" ] || continue
  for p in "$d"/gpunode.?????? "$d"/.gpunode-upload.?????? "$d"/.gpunode-tmp.??????; do
    [ -e "$p" ] || [ -L "$p" ] || continue
    rm -rf -- "$p" && printf '%s\n' "$p"
  done
done
true
"""


# df -P of a path: one line "FILESYSTEM 1024-BLOCKS USED AVAILABLE CAPACITY MOUNTED-ON" (the name may hold blanks
# in theory; the last four fields never do)
_DISK_FREE = Script(name="disk-free", body='df -kP -- "$1" 2>/dev/null | tail -n 1')


@dataclass(frozen=True, eq=False, repr=False)
class DiskFree(Frozen):
    """Where a path lives on the node and how much room it has (df -kP)."""

    filesystem: str
    mount: str
    available: int  # bytes

    def describe(self) -> str:
        return f"{self.filesystem} (mounted on {self.mount}) has {megabytes(self.available)} free"


def megabytes(size: int) -> str:
    return f"{size / 1e6:,.0f} MB" if size >= 1e6 else f"{size / 1e3:,.0f} kB"


def parse_disk_free(line: str) -> DiskFree | None:
    fields = line.split()
    if len(fields) < 6 or not fields[-3].isdigit():
        return None
    return DiskFree(" ".join(fields[:-5]), fields[-1], int(fields[-3]) * 1024)


class NoSpaceError(CommandError):
    """The node's filesystem is full: nothing was replaced."""

    def __init__(self, node: str, directory: str, what: str) -> None:
        super().__init__(f"{node}: no space left on the node in {directory} ({what}; nothing was replaced)",
                         fix=f"free space on the node (see: df -h {quote(directory)}), then run the same command again")
        self.directory = directory


def write_error(node: str, path: str, result: Result) -> CommandError:
    """Turn a failed write-file run into an error that names the cause and the fix."""
    text = result.stderr + result.stdout
    if "No space left on device" in text or "Disk quota exceeded" in text:
        return NoSpaceError(node, posixpath.dirname(path) or "/", f"writing {path}")
    if result.timed_out:
        return CommandTimeout(f"{node}: writing {path} timed out; the previous file was kept",
                              fix="check the node's disk and load, then run the same command again")
    if "gpunode-short" in text or "gpunode-checksum" in text:
        detail = next(line for line in text.splitlines() if line.startswith(("gpunode-short", "gpunode-checksum")))
        return CommandError(f"{node}: writing {path}: {detail.split(' ', 1)[1]}; the previous file was kept",
                            fix="the transfer was cut short; run the same command again",
                            stdout=result.stdout, stderr=result.stderr, exit_code=result.exit_code)
    if "gpunode-badlink" in text:
        detail = next(line for line in text.splitlines() if line.startswith("gpunode-badlink"))
        return CommandError(f"{node}: cannot write through the symlink {detail.split(' ', 1)[1]}",
                            fix=f"point the symlink at a regular file, or remove it: rm {quote(path)}",
                            exit_code=result.exit_code)
    try:
        result.check(f"writing {path}")
    except CommandError as exc:
        return exc
    return CommandError(f"writing {path} failed")  # pragma: no cover - result.ok is False here


@dataclass(frozen=True, eq=False, repr=False)
class Result(Frozen):
    command: str  # display form: never contains secrets
    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    def check(self, what: str | None = None) -> Result:
        if self.timed_out:
            raise CommandTimeout(f"{what or self.command}: timed out", stdout=self.stdout, stderr=self.stderr)
        if self.exit_code != 0:
            tail = (self.stderr.strip() or self.stdout.strip()).splitlines()[-5:]
            detail = ("\n" + "\n".join(tail)) if tail else ""
            raise CommandError(f"{what or self.command} failed with exit code {self.exit_code}{detail}",
                               stdout=self.stdout, stderr=self.stderr, exit_code=self.exit_code)
        return self


def sudo_refusal(code: int, output: bytes) -> str:
    """Why sudo refused: missing | tty | not-allowed | wrong-password | password | other."""
    text = output.decode("utf-8", "replace").lower()
    if code == 127 or "sudo: not found" in text or "command not found" in text or "no such file" in text:
        return "missing"
    if "must have a tty" in text or "a terminal is required" in text and "-s option" not in text:
        return "tty"
    if "not in the sudoers" in text or "is not allowed to" in text or "may not run sudo" in text:
        return "not-allowed"
    if "incorrect password" in text or "try again" in text or "no password was provided" in text:
        return "wrong-password"
    if "password is required" in text or "a terminal is required" in text:
        return "password"
    return "other"


class PrivilegeError(CommandError):
    """Root is needed and sudo refused. A CommandError, so read-only probes can fall back to the login user."""

    exit_code = 2


def _as_root(node: str) -> str:
    """--host for the same node as root: `ubuntu@gpu-01:2222` -> `root@gpu-01:2222`, quoted for a shell."""
    return quote("root@" + node.rsplit("@", 1)[-1])


def sudo_error(node: str, code: int, output: bytes, *, with_password: bool) -> PrivilegeError:
    """The refusal as an error that says which of the four cases it is, and its fix."""
    said = output.decode("utf-8", "replace").strip().splitlines()
    detail = f" (sudo said: {said[-1][:200]})" if said else ""
    kind = sudo_refusal(code, output)
    if kind == "missing":
        return PrivilegeError(f"{node}: root is needed, the login user is not root and sudo is not installed",
                              fix=f"log in as root (--host {_as_root(node)}), or install sudo on the node")
    if kind == "tty":
        return PrivilegeError(f"{node}: sudo on the node requires a terminal (Defaults requiretty){detail}",
                              fix="allow sudo without a tty for this user on the node: run visudo and add "
                                  "'Defaults:USER !requiretty', or log in as root")
    if kind == "not-allowed":
        return PrivilegeError(f"{node}: the login user is not allowed to use sudo (not in sudoers){detail}",
                              fix=f"log in as a user who may use sudo, or as root (--host {_as_root(node)}), "
                                  "or grant sudo to this user on the node")
    if kind == "wrong-password":
        return PrivilegeError(f"{node}: sudo rejected the password given to --ask-become-pass",
                              fix="run again and type the login user's own password at the become-password prompt")
    if kind == "password" and not with_password:
        return PrivilegeError(f"{node}: root is needed and sudo asks for a password{detail}",
                              fix="re-run with --ask-become-pass, or log in as root, or allow passwordless sudo")
    return PrivilegeError(f"{node}: root is needed and sudo failed with exit code {code}{detail}",
                        fix="run 'sudo true' on the node as the login user to see why, or log in as root")


class Held:
    """A command left running on the node (Connection.hold): what it printed so far, and how to end it."""

    def __init__(self, output: bytes, ended: bool, release: Callable[[], None]) -> None:
        self.output = output.decode("utf-8", "replace")
        self.ended = ended  # the command ended on its own before printing `until`
        self._release = release

    def release(self) -> None:
        """Close the command's input (it then ends) and let go of it. Safe to call twice."""
        release, self._release = self._release, lambda: None
        release()


@dataclass(frozen=True, eq=False, repr=False)
class WriteOutcome(Frozen):
    changed: bool
    backup: str | None


class Connection(ABC):
    """A node. `name` is what reports show; `is_local` protects the machine gpunode runs on."""

    name: str = "node"
    is_local: bool = False

    def __init__(self, *, become_password: Secret | None = None) -> None:
        self._become_password = become_password
        self._privilege_cache: tuple[tuple[str, ...], bool] | None = None

    # -- transport -------------------------------------------------------------------------------------
    @abstractmethod
    def _exec(self, line: str, stdin: bytes, timeout: float | None) -> tuple[int, bytes, bytes, bool]:
        """Run one shell command line. Returns (exit code, stdout, stderr, timed_out)."""

    def _hold(self, line: str, stdin: bytes, until: bytes, timeout: float) -> Held | None:
        """Start `line` and leave it running with its stdin open; return once its output holds `until` (or it
        ended). None: this transport cannot keep a command running (the caller falls back)."""
        return None

    def wait_connected(self) -> None:  # noqa: B027 - optional hook: only SSH connects ahead
        """Wait for a connection made ahead (gpunode/connection/ssh.py connect_ahead) and raise what making it
        raised; at once for any other."""

    def close(self) -> None:  # noqa: B027 - optional hook: only SSH holds a transport
        """Release the transport. Safe to call twice."""

    def reconnect(self, timeout: float) -> None:  # noqa: B027 - optional hook
        """Open the transport again (after a reboot). Local and fake connections need nothing."""

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- privilege -------------------------------------------------------------------------------------
    def _privilege(self) -> tuple[tuple[str, ...], bool]:
        """(prefix, needs password on stdin). Root needs nothing; otherwise `sudo -n`, and only when that
        is refused and a password was given, `sudo -S -k` with the password fed on stdin."""
        if self._privilege_cache is None:
            code, out, _, _ = self._exec(render(["id", "-u"]), b"", 30)
            if code == 0 and out.strip() == b"0":
                self._privilege_cache = ((), False)
                return self._privilege_cache
            code, out, err, _ = self._exec(render(["true"], privilege=("sudo", "-n", "--")), b"", 30)
            if code == 0:
                self._privilege_cache = (("sudo", "-n", "--"), False)
            elif self._become_password is not None and sudo_refusal(code, out + err) == "password":
                prefix = ("sudo", "-S", "-k", "-p", "", "--")
                code, out, err, _ = self._exec(render(["true"], privilege=prefix), self._password_line(), 30)
                if code != 0:
                    raise sudo_error(self.name, code, out + err, with_password=True)
                self._privilege_cache = (prefix, True)
            else:
                raise sudo_error(self.name, code, out + err, with_password=False)
        return self._privilege_cache

    def _learns_root_inline(self) -> bool:
        """Whether the first privileged command may carry the root check itself (one round trip instead of
        an `id -u` before it). Connections where a round trip is cheap keep the separate check."""
        return False

    def _run_if_root(self, cmd: Cmd, timeout: float | None) -> Result | None:
        """Run `cmd` as is when the login user is root, learning that in the same round trip. None when the
        login user is not root: nothing ran, and the ordinary sudo discovery follows."""
        line = f'[ "$(id -u)" = 0 ] || {{ echo {_NOT_ROOT} >&2; exit {_NOT_ROOT_EXIT}; }}; ' + render(cmd)
        code, out, err, timed_out = self._exec(line, b"", timeout)
        if code == _NOT_ROOT_EXIT and err.startswith(_NOT_ROOT.encode() + b"\n"):
            return None
        if not timed_out:
            self._privilege_cache = ((), False)
        return Result(display(cmd), code, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), timed_out)

    def _password_line(self) -> bytes:
        assert self._become_password is not None
        return self._become_password.value.encode() + b"\n"

    # -- the interface every step uses -----------------------------------------------------------------
    def run(self, cmd: Cmd, *, sudo: bool = False, stdin: bytes | None = None,
            timeout: float | None = DEFAULT_TIMEOUT, check: bool = False) -> Result:
        if sudo and self._privilege_cache is None and not stdin and self._learns_root_inline():
            result = self._run_if_root(cmd, timeout)
            if result is not None:
                return result.check() if check else result
        prefix, feed = self._elevation(sudo)
        line = render(cmd, privilege=prefix)
        code, out, err, timed_out = self._exec(line, feed + (stdin or b""), timeout)
        shown = ("sudo " if prefix else "") + display(cmd)
        result = Result(shown, code, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), timed_out)
        return result.check() if check else result

    def _elevation(self, sudo: bool) -> tuple[tuple[str, ...], bytes]:
        """The privilege prefix a command runs with, and the password line to feed it first (empty: none)."""
        if not sudo:
            return (), b""
        prefix, with_password = self._privilege()
        return prefix, self._password_line() if with_password else b""

    def lock_owner(self) -> str | None:
        """The pid of a process on the node that runs exactly as long as this connection (SSH: sshd's process of
        the connection), for the node lock to name (gpunode/nodelock.py); None when there is none (local, Ansible,
        the test fake)."""
        return None

    def hold(self, cmd: Cmd, *, sudo: bool = False, until: str, timeout: float = 60.0) -> Held | None:
        """Run `cmd` on the node and keep it running, its stdin open, until `Held.release()` closes that input
        (or the connection goes: gpunode stopped or died). Returns once the command printed `until` or ended;
        None when the transport cannot keep a command running."""
        prefix, feed = self._elevation(sudo)
        return self._hold(render(cmd, privilege=prefix), feed, until.encode(), timeout)

    def read_file(self, path: str, *, sudo: bool = False) -> str | None:
        """The file's text, or None when it does not exist."""
        result = self.run(Script(_READ_FILE.body, (path,), _READ_FILE.name), sudo=sudo, timeout=60)
        if result.exit_code == 44:
            return None
        result.check(f"reading {path}")
        return result.stdout

    def write_file(self, path: str, content: str | bytes, *, mode: int = 0o644, sudo: bool = True,
                   backup: bool = True, then: Script | None = None) -> WriteOutcome:
        """Atomically replace `path` (or a symlink's target), keeping the previous content as
        `path.gpunode-bak.<time>`. Nothing changes unless every byte arrived intact. `then` runs after the write
        in the same command, whatever the write's outcome (its output is dropped, the write's status is kept):
        the node lock's release after the journal's last write (gpunode/nodelock.py Lock.unlock)."""
        data = content.encode() if isinstance(content, str) else content
        digest = hashlib.sha256(data).hexdigest()
        args = (path, f"{mode:o}", "1" if backup else "0", str(len(data)), digest)
        script = Script(_WRITE_FILE.body, args, _WRITE_FILE.name)
        if then is not None:
            script = Script(f"(\n{_WRITE_FILE.body}); gpunode_w=$?; shift {len(args)}\n(\n{then.body}\n) >/dev/null 2>&1\n"
                            "exit $gpunode_w\n", (*args, *then.args), _WRITE_FILE.name)
        try:
            result = self.run(script, sudo=sudo, stdin=data, timeout=120)
        except ConnectError as exc:
            raise ConnectError(f"{exc.message} (writing {path}: the node keeps its previous file, since nothing "
                               "is renamed into place before every byte arrived and its sha256 matched)",
                               fix=exc.fix) from None
        if not result.ok:
            raise write_error(self.name, path, result)
        if "gpunode-unchanged" in result.stdout:
            return WriteOutcome(False, None)
        written = result.stdout.split("gpunode-written", 1)[-1].strip()
        return WriteOutcome(True, written or None)

    def disk_free(self, path: str) -> DiskFree | None:
        """The filesystem `path` is on and its free space (None when df cannot say)."""
        result = self.run(Script(_DISK_FREE.body, (path,), _DISK_FREE.name), timeout=60)
        return parse_disk_free(result.stdout.strip()) if result.ok else None

    def make_private_dir(self, parent: str = TEMP_PARENT, *, sudo: bool = True) -> str:
        """A fresh directory only its owner (root, with sudo) can read."""
        script = Script(_MKTEMP_DIR.body, (parent,), _MKTEMP_DIR.name)
        return self.run(script, sudo=sudo, timeout=60).check("creating a private directory").stdout.strip()

    def upload(self, local_path: str | os.PathLike[str], remote_path: str, *, mode: int = 0o644,
               sudo: bool = True, progress: ProgressCallback | None = None, sha256: str | None = None) -> str:
        """Copy a local file to the node; returns the sha256 of what arrived there (the node checked it against
        what was sent, or against `sha256`, the file's known hash, when given: nothing is installed unless it
        matches), so a caller that knows the file's hash need not have the node read it again. The base
        version streams it through the command's stdin."""
        with open(local_path, "rb") as fh:
            data = fh.read()
        if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
            raise CommandError(f"{local_path} no longer has the sha256 {sha256}; nothing was uploaded to {remote_path}",
                               fix="run the same command again")
        self.write_file(remote_path, data, mode=mode, sudo=sudo, backup=False)
        if progress:
            progress(len(data), len(data))
        return hashlib.sha256(data).hexdigest()
