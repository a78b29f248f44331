"""The one interface gpunode uses to touch a node. Local, SSH and fake connections implement `_exec`;
reading and writing files, uploads and privilege escalation are built once here on top of it, as POSIX sh,
so the node needs nothing but a shell and core utilities (no Python)."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

from gpunode.errors import CommandError, CommandTimeout
from gpunode.shell import Cmd, Script, Secret, display, render

DEFAULT_TIMEOUT = 600.0
ProgressCallback = Callable[[int, int], None]

_READ_FILE = Script(
    name="read-file",
    body='if [ -e "$1" ]; then exec cat -- "$1"; else exit 44; fi',
)

# Atomic replace with a backup: write a temp file in the same directory, keep a copy of the old file
# next to it (suffix never matches *.conf / *.toml / *.json, so modprobe, containerd and docker ignore it),
# then rename over the destination. Identical content leaves everything untouched.
_WRITE_FILE = Script(
    name="write-file",
    body=r"""set -e
dest=$1; mode=$2; keep=$3
dir=$(dirname -- "$dest")
mkdir -p -- "$dir"
tmp=$(mktemp "$dir/.gpunode-tmp.XXXXXX")
trap 'rm -f -- "$tmp"' EXIT
cat > "$tmp"
chmod "$mode" "$tmp"
if [ -e "$dest" ] && cmp -s -- "$tmp" "$dest"; then
  echo "gpunode-unchanged"
  exit 0
fi
backup=
if [ "$keep" = 1 ] && [ -e "$dest" ]; then
  backup="$dest.gpunode-bak.$(date +%Y%m%dT%H%M%S)"
  [ ! -e "$backup" ] || backup="$backup.$$"
  cp -p -- "$dest" "$backup"
fi
mv -f -- "$tmp" "$dest"
trap - EXIT
echo "gpunode-written $backup"
""",
)

_MKTEMP_DIR = Script(name="mktemp-dir", body='umask 077; mktemp -d "${1:-/var/tmp}/gpunode.XXXXXX"')


@dataclass(frozen=True)
class Result:
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


@dataclass(frozen=True)
class WriteOutcome:
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
            else:
                code, _, err, _ = self._exec(render(["true"], privilege=("sudo", "-n", "--")), b"", 30)
                if code == 0:
                    self._privilege_cache = (("sudo", "-n", "--"), False)
                elif self._become_password is not None:
                    prefix = ("sudo", "-S", "-k", "-p", "", "--")
                    code, _, err, _ = self._exec(render(["true"], privilege=prefix), self._password_line(), 30)
                    if code != 0:
                        raise CommandError(f"{self.name}: sudo rejected the password",
                                           fix="check the password given to --ask-become-pass")
                    self._privilege_cache = (prefix, True)
                else:
                    raise CommandError(
                        f"{self.name}: root is needed and `sudo -n` was refused "
                        f"({err.decode(errors='replace').strip() or 'a password is required'})",
                        fix="re-run with --ask-become-pass, or log in as root, or allow passwordless sudo")
        return self._privilege_cache

    def _password_line(self) -> bytes:
        assert self._become_password is not None
        return self._become_password.value.encode() + b"\n"

    # -- the interface every step uses -----------------------------------------------------------------
    def run(self, cmd: Cmd, *, sudo: bool = False, stdin: bytes | None = None,
            timeout: float | None = DEFAULT_TIMEOUT, check: bool = False) -> Result:
        prefix: tuple[str, ...] = ()
        feed = b""
        if sudo:
            prefix, with_password = self._privilege()
            if with_password:
                feed = self._password_line()
        line = render(cmd, privilege=prefix)
        code, out, err, timed_out = self._exec(line, feed + (stdin or b""), timeout)
        shown = ("sudo " if prefix else "") + display(cmd)
        result = Result(shown, code, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), timed_out)
        return result.check() if check else result

    def read_file(self, path: str, *, sudo: bool = False) -> str | None:
        """The file's text, or None when it does not exist."""
        result = self.run(Script(_READ_FILE.body, (path,), _READ_FILE.name), sudo=sudo, timeout=60)
        if result.exit_code == 44:
            return None
        result.check(f"reading {path}")
        return result.stdout

    def write_file(self, path: str, content: str | bytes, *, mode: int = 0o644, sudo: bool = True,
                   backup: bool = True) -> WriteOutcome:
        """Atomically replace `path`, keeping the previous content as `path.gpunode-bak.<time>`."""
        data = content.encode() if isinstance(content, str) else content
        script = Script(_WRITE_FILE.body, (path, f"{mode:o}", "1" if backup else "0"), _WRITE_FILE.name)
        result = self.run(script, sudo=sudo, stdin=data, timeout=120).check(f"writing {path}")
        if "gpunode-unchanged" in result.stdout:
            return WriteOutcome(False, None)
        written = result.stdout.split("gpunode-written", 1)[-1].strip()
        return WriteOutcome(True, written or None)

    def make_private_dir(self, parent: str = "/var/tmp", *, sudo: bool = True) -> str:
        """A fresh directory only its owner (root, with sudo) can read."""
        script = Script(_MKTEMP_DIR.body, (parent,), _MKTEMP_DIR.name)
        return self.run(script, sudo=sudo, timeout=60).check("creating a private directory").stdout.strip()

    def upload(self, local_path: str | os.PathLike[str], remote_path: str, *, mode: int = 0o644,
               sudo: bool = True, progress: ProgressCallback | None = None) -> None:
        """Copy a local file to the node. The base version streams it through the command's stdin."""
        with open(local_path, "rb") as fh:
            data = fh.read()
        self.write_file(remote_path, data, mode=mode, sudo=sudo, backup=False)
        if progress:
            progress(len(data), len(data))
