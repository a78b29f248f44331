"""The action contract and the built-in kinds.

An action is frozen data: a summary, the exact command lines it runs on the node (`commands()`), lines that
describe what is not a command (`details()`: an upload, a wait), and where it runs (`where`: "node", or
"control" for work done on the machine running gpunode). `apply(conn)` carries it out and may return a note
worth keeping in the report (a backup path).
"""

from __future__ import annotations

import difflib
import hashlib
import re
import secrets
import shlex
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from typing import ClassVar

from gpunode.connection.base import Connection, Result
from gpunode.record import Frozen, Record
from gpunode.records import FileRecord, UndoRecord, UnitRecord
from gpunode.shell import Cmd, Script, to_argv

# Read-only look at what an undo record needs: files' sha256, the installed packages, units' enablement, the
# .run driver's version, the held packages, the files in directories, files' texts. One line per item; a failure
# prints nothing (the record says "unknown"). A look is `WHAT ITEM... --`; `looks COUNT WORDS...` runs the looks
# among the first COUNT words, each answer after a `NONCE look N` line (N: its place); texts are framed by NONCE
# too, a random word the caller picks, so no file's content can forge a boundary.
_LOOK_FUNCTIONS = r"""look() {
what=$1; shift
case $what in
files) for f; do [ "$f" = -- ] && break; if [ -f "$f" ]; then s=$(sha256sum -- "$f" 2>/dev/null); echo "file ${s%% *} $f"; else echo "file - $f"; fi; done ;;
packages) if command -v dpkg-query >/dev/null 2>&1; then dpkg-query -W -f '${db:Status-Status} ${Package} ${Version}\n' '*' 2>/dev/null | sed -n 's/^installed /pkg /p'
  elif command -v rpm >/dev/null 2>&1; then rpm -qa --qf '%{NAME} %{VERSION}-%{RELEASE}\n' 2>/dev/null | sed 's/^/pkg /'; fi ;;
units) for u; do [ "$u" = -- ] && break; echo "unit $u $(systemctl is-enabled "$u" 2>/dev/null || true)"; done ;;
driver) v=$(nvidia-installer --version 2>/dev/null | sed -n 's/.*version *\([0-9][0-9.]*\).*/\1/p' | head -n 1); echo "driver ${v:--}" ;;
holds) if command -v apt-mark >/dev/null 2>&1; then apt-mark showhold 2>/dev/null | sed 's/^/hold /'
  elif command -v dnf >/dev/null 2>&1; then dnf -q -C versionlock list 2>/dev/null | sed -n 's/^\([A-Za-z0-9_.+-]*\)-[0-9]*:.*/hold \1/p'
  elif command -v yum >/dev/null 2>&1; then yum -q -C versionlock list 2>/dev/null | sed -n 's/^\([A-Za-z0-9_.+-]*\)-[0-9]*:.*/hold \1/p'
  elif [ -r /etc/zypp/locks ]; then sed -n 's/^solvable_name: *\(.*\)/hold \1/p' /etc/zypp/locks; fi ;;
dir) for d; do [ "$d" = -- ] && break; for f in "$d"/*; do [ -f "$f" ] || continue; s=$(sha256sum -- "$f" 2>/dev/null); echo "file ${s%% *} $f"; done; done ;;
texts) for f; do [ "$f" = -- ] && break; [ -f "$f" ] && [ -r "$f" ] || continue; echo "$n $f"; cat -- "$f"; echo; echo "$n"; done ;;
esac
}
looks() {
k=$1; shift; i=0
while [ "$k" -gt 0 ]; do
  echo "$n look $i"; look "$@"; i=$((i + 1))
  while [ "$1" != -- ]; do shift; k=$((k - 1)); done
  shift; k=$((k - 1))
done
}
"""
# The looks on their own: NONCE COUNT WORDS.
UNDO_LOOK = Script(name="undo-look", body=_LOOK_FUNCTIONS + 'n=$1; shift\nlooks "$@"\ntrue')
# The looks folded into the command of the action they look around, so they cost no remote command of their own:
# NONCE COUNT BEFORE-WORDS COUNT AFTER-WORDS ARGV... prints the looks before, `NONCE ran`, runs ARGV (its stdin,
# stdout, stderr and exit status are the command's own), then a newline, `NONCE after` and the looks after.
LOOKED = Script(name="looked", body=_LOOK_FUNCTIONS + r"""n=$1; shift
looks "$@"; shift "$1"; shift
echo "$n ran"
na=$1; shift
( shift "$na"; exec "$@" )
rc=$?
printf '\n%s after\n' "$n"
looks "$na" "$@"
exit "$rc"
""")

Look = tuple[str, ...]  # (what, item...): "files" PATH..., "texts" PATH..., "units" UNIT..., "packages", ...
# {item: value}: files: sha256 or "-"; packages: name -> version; units: name -> state; driver: "driver" ->
# version or "-"; holds: held package -> "held"; dir: the files in the directories -> sha256. None: the node could
# not tell.
Answer = dict[str, str] | None


def _parse_look(lines: list[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in lines:
        kind, _, rest = line.partition(" ")
        if kind == "file":
            digest, _, path = rest.partition(" ")
            found[path] = digest
        elif kind == "hold":
            found[rest.strip()] = "held"
        elif kind in ("pkg", "unit"):
            name, _, value = rest.partition(" ")
            found[name] = value.strip()
        elif kind == "driver":
            found["driver"] = rest.strip()
    return found


def _parse_texts(text: str, nonce: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for block in text.split(f"{nonce} ")[1:]:
        path, _, rest = block.partition("\n")
        body, ends, _ = rest.rpartition(f"\n{nonce}\n")
        if ends:  # the newline the script adds before the closing nonce is part of the separator
            found[path] = body
    return found


def _words(looks: tuple[Look, ...]) -> tuple[str, ...]:
    words = tuple(w for look in looks for w in (*look, "--"))
    return (str(len(words)), *words)


def _answers(text: str | None, nonce: str, looks: tuple[Look, ...]) -> list[Answer]:
    """The answers of `looks` in the output of the look functions (None: that output is missing)."""
    if text is None:
        return [None] * len(looks)
    parts = re.split(rf"(?m)^{nonce} look (\d+)\n", text)
    answers: dict[int, str] = {int(parts[i]): parts[i + 1] for i in range(1, len(parts) - 1, 2)}
    found: list[Answer] = []
    for i, look in enumerate(looks):
        part = answers.get(i)
        if part is None:
            found.append(None)
        elif look[0] == "texts":
            found.append(_parse_texts(part, nonce))
        else:
            found.append(_parse_look(part.splitlines()))
    return found


def undo_looks(conn: Connection, *looks: Look) -> list[Answer]:
    """Several looks (each `(what, item...)`; "texts": the files' contents) in ONE command on the node, for what
    reads the node's state without changing it (uninstall's planning). Each answer is None when the node could
    not tell."""
    nonce = secrets.token_hex(8)
    try:
        result = conn.run(Script(UNDO_LOOK.body, (nonce, *_words(looks)), UNDO_LOOK.name), sudo=True, timeout=120)
    except Exception:  # noqa: BLE001 - a record is best effort: the change itself must not fail for it
        return [None] * len(looks)
    return _answers(result.stdout if result.ok else None, nonce, looks)


@dataclass(eq=False, repr=False)
class Looks(Record):
    """Looks an action takes around its change, folded into its own remote commands (`LOOKED`): `before` rides in
    the first command run through `run`, `after` in the last (`first`/`last` say which a command is); their
    answers land in `seen_before` / `seen_after`. `Looks()` looks at nothing: `run` is `conn.run`."""

    before: tuple[Look, ...] = ()
    after: tuple[Look, ...] = ()
    seen_before: list[Answer] = field(default_factory=list)
    seen_after: list[Answer] = field(default_factory=list)

    def run(self, conn: Connection, cmd: Cmd, *, sudo: bool = True, stdin: bytes | None = None,
            timeout: float | None = None, first: bool = True, last: bool = True) -> Result:
        before, after = self.before if first else (), self.after if last else ()
        if not before and not after:
            return conn.run(cmd, sudo=sudo, stdin=stdin, timeout=timeout)
        nonce = secrets.token_hex(8)
        script = Script(LOOKED.body, (nonce, *_words(before), *_words(after), *to_argv(cmd)), LOOKED.name)
        result = conn.run(script, sudo=sudo, stdin=stdin, timeout=timeout)
        head, ran, rest = result.stdout.partition(f"{nonce} ran\n")
        out, ended, tail = rest.rpartition(f"\n{nonce} after\n")
        if not ended:  # the command did not come back to the looks after it (killed, timed out)
            out = rest
        if first:
            self.seen_before = _answers(head if ran else None, nonce, before)
        if last:
            self.seen_after = _answers(tail if ended else None, nonce, after)
        return replace(result, stdout=out if ran else result.stdout)

    def answers(self) -> tuple[list[Answer], list[Answer]]:
        """(before, after): each look's answer, None for a look the node did not answer (or never ran)."""
        return ((self.seen_before or [None] * len(self.before)), (self.seen_after or [None] * len(self.after)))


def command_line(cmd: Cmd, sudo: bool = True) -> str:
    """The command line as it runs on the node (a Script in full: `sh -c BODY NAME ARGS`)."""
    return ("sudo " if sudo else "") + shlex.join(to_argv(cmd))


@dataclass(frozen=True, eq=False, repr=False)
class Action(Frozen, ABC):
    summary: str

    kind: ClassVar[str] = "action"
    where: ClassVar[str] = "node"  # "node" | "control" (the machine running gpunode)

    def changed_files(self) -> tuple[tuple[str, str | None, str | None], ...]:
        """(path, text before or None: absent, text after or None: removed) of every file this action writes or
        would write, for diffs (`--diff` in Ansible, the library's file_diffs). Predicted where a tool writes it."""
        return ()

    def commands(self) -> list[str]:
        """The exact command lines this action runs on the node, for the plan."""
        return []

    def details(self) -> list[str]:
        """What else it does, in words: uploads, downloads, waits. Never command lines."""
        return []

    def shown_commands(self, as_root: bool = False) -> list[str]:
        """commands() as they will really run: on a root login there is no sudo in front."""
        return [c.removeprefix("sudo ") if as_root else c for c in self.commands()]

    def to_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "summary": self.summary, "where": self.where, "commands": self.commands(),
                "details": self.details()}

    def deferred(self) -> tuple[tuple[str, str], ...]:
        """Effects this action leaves owed once it has run, as (effect, target), e.g. ("restart",
        "docker.service"): the runner records them in the node's journal in the write made right before the
        action runs, so an interruption after it cannot lose them (gpunode/journal.py)."""
        return ()

    def settles(self) -> tuple[tuple[str, str], ...]:
        """The owed effects this action carries out; the runner clears them from the journal once it succeeds."""
        return ()

    @abstractmethod
    def apply(self, conn: Connection) -> str | None:
        """Carry the action out. Returns a note worth keeping (a backup path), if any."""

    def apply_recorded(self, conn: Connection) -> tuple[str | None, list[UndoRecord]]:
        """apply(), and the typed records the node's journal keeps to undo it (gpunode/undo/): the files it
        wrote, the packages it installed that were not there, the units it enabled. Most actions record none."""
        return self.apply(conn), []


@dataclass(frozen=True, eq=False, repr=False)
class RunCommand(Action):
    cmd: Cmd = ()
    sudo: bool = True
    timeout: float = 600.0
    creates: tuple[str, ...] = ()  # files the command creates (a keyring): recorded for `gpunode uninstall`

    kind = "command"

    def commands(self) -> list[str]:
        return [command_line(self.cmd, self.sudo)]

    def apply(self, conn: Connection) -> str | None:
        conn.run(self.cmd, sudo=self.sudo, timeout=self.timeout).check(self.summary)
        return None

    def enables(self) -> tuple[str, ...]:
        """The units a `systemctl enable [--now] UNIT...` command enables."""
        argv = () if isinstance(self.cmd, Script) else tuple(self.cmd)
        if argv[:2] != ("systemctl", "enable"):
            return ()
        return tuple(u if "." in u else f"{u}.service" for u in argv[2:] if not u.startswith("-"))

    def apply_recorded(self, conn: Connection) -> tuple[str | None, list[UndoRecord]]:
        units, created = self.enables(), self.creates
        if not units and not created:
            return self.apply(conn), []
        looks = Looks(before=((("units", *units),) if units else ()) + ((("files", *created),) if created else ()),
                      after=(("files", *created),) if created else ())
        looks.run(conn, self.cmd, sudo=self.sudo, timeout=self.timeout).check(self.summary)
        seen, seen_after = looks.answers()
        before_units, before_files = (seen[0] if units else None), (seen[-1] if created else None)
        after, note = (seen_after[0] if created else None), None
        records: list[UndoRecord] = [UnitRecord(unit=u, was=(before_units or {}).get(u, "unknown")) for u in units]
        for path in created:
            was, now = (before_files or {}).get(path), (after or {}).get(path)
            if was == "-" and now and now != "-":  # only what this command created
                records.append(FileRecord(path=path, existed=False, sha256=now))
        return note, records


@dataclass(frozen=True, eq=False, repr=False)
class WriteFile(Action):
    path: str = ""
    after: str = ""
    before: str | None = None  # None: the file does not exist yet
    mode: int = 0o644

    kind = "file"

    def diff(self) -> str:
        before = [] if self.before is None else self.before.splitlines(keepends=True)
        after = self.after.splitlines(keepends=True)
        lines = difflib.unified_diff(before, after, fromfile="/dev/null" if self.before is None else self.path,
                                     tofile=self.path)
        return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
                       for line in lines)

    def changed_files(self) -> tuple[tuple[str, str | None, str | None], ...]:
        return ((self.path, self.before, self.after),)

    def to_dict(self) -> dict[str, object]:
        return {**super().to_dict(), "path": self.path, "mode": f"{self.mode:04o}", "diff": self.diff()}

    def apply(self, conn: Connection) -> str | None:
        return self.apply_recorded(conn)[0]

    def apply_recorded(self, conn: Connection) -> tuple[str | None, list[UndoRecord]]:
        written = conn.write_file(self.path, self.after, mode=self.mode)
        record = FileRecord(path=self.path, existed=written.backup is not None, backup=written.backup,
                            sha256=hashlib.sha256(self.after.encode()).hexdigest(), mode=f"{self.mode:04o}")
        return (f"backup of {self.path}: {written.backup}" if written.backup else None), [record]


@dataclass(frozen=True, eq=False, repr=False)
class RestartService(Action):
    unit: str = ""

    kind = "service"

    def argv(self) -> tuple[str, ...]:
        return ("systemctl", "restart", self.unit)

    def commands(self) -> list[str]:
        return [command_line(self.argv())]

    def to_dict(self) -> dict[str, object]:
        return {**super().to_dict(), "unit": self.unit}

    def settles(self) -> tuple[tuple[str, str], ...]:
        return (("restart", self.unit),)

    def apply(self, conn: Connection) -> str | None:
        conn.run(self.argv(), sudo=True, timeout=300).check(self.summary)
        return None


@dataclass(frozen=True, eq=False, repr=False)
class Reboot(Action):
    """A reboot the step needs before it can converge. The runner decides whether and how to reboot, after the
    step's other actions; applying the action itself changes nothing."""

    kind = "reboot"

    def apply(self, conn: Connection) -> str | None:
        return None
