"""The actions an undo plan takes that install has no kind for: remove a file gpunode created, put back the
file gpunode replaced (from its backup). Diffs render like a plan's WriteFile (before -> after)."""

from __future__ import annotations

from dataclasses import dataclass

from gpunode.actions.base import Action, WriteFile, command_line
from gpunode.connection.base import THROUGH_LINK, Connection
from gpunode.records import UndoRecord
from gpunode.shell import Script

# the backup moves over the file; over a symlink's target, as install wrote through the link (the link stays)
_RESTORE = Script(name="restore-backup", body='b=$1; dest=$2; shift 2\n' + THROUGH_LINK
                  + 'mv -f -- "$b" "$dest" && rm -f -- "$@"')


@dataclass(frozen=True, eq=False, repr=False)
class RemoveFile(Action):
    """Remove a file gpunode created (its content is still what gpunode wrote), with its stale backups."""

    path: str = ""
    before: str | None = None  # the content now, for the diff
    leftovers: tuple[str, ...] = ()  # backups gpunode made of its own earlier versions
    restart: str = ""  # the engine that must restart to load the change (owed until it has)

    kind = "file"

    def argv(self) -> tuple[str, ...]:
        return ("rm", "-f", "--", self.path, *self.leftovers)

    def commands(self) -> list[str]:
        return [command_line(self.argv())]

    def diff(self) -> str:
        shown = WriteFile(self.summary, path=self.path, before=self.before or "", after="").diff()
        return shown.replace(f"+++ {self.path}", "+++ /dev/null", 1)

    def to_dict(self) -> dict[str, object]:
        return {**super().to_dict(), "path": self.path, "diff": self.diff(), "removes": [self.path, *self.leftovers]}

    def deferred(self) -> tuple[tuple[str, str], ...]:
        return (("restart", self.restart),) if self.restart else ()

    def apply(self, conn: Connection) -> str | None:
        conn.run(self.argv(), sudo=True, timeout=60).check(self.summary)
        return None


@dataclass(frozen=True, eq=False, repr=False)
class RestoreFile(Action):
    """Put back the file gpunode replaced: its backup moves over it (mode and owner as they were)."""

    path: str = ""
    backup: str = ""
    before: str | None = None  # the content now
    after: str | None = None  # the backup's content
    leftovers: tuple[str, ...] = ()  # later backups (of gpunode's own versions), removed with it
    restart: str = ""

    kind = "file"

    def script(self) -> Script:
        return Script(_RESTORE.body, (self.backup, self.path, *self.leftovers), _RESTORE.name)

    def commands(self) -> list[str]:
        return [command_line(self.script())]

    def diff(self) -> str:
        return WriteFile(self.summary, path=self.path, before=self.before, after=self.after or "").diff()

    def to_dict(self) -> dict[str, object]:
        return {**super().to_dict(), "path": self.path, "backup": self.backup, "diff": self.diff()}

    def deferred(self) -> tuple[tuple[str, str], ...]:
        return (("restart", self.restart),) if self.restart else ()

    def apply(self, conn: Connection) -> str | None:
        conn.run(self.script(), sudo=True, timeout=60).check(self.summary)
        return f"restored {self.path} from {self.backup}"


@dataclass(frozen=True, eq=False, repr=False)
class StripEntries(WriteFile):
    """Write a config the user changed since gpunode without gpunode's entries (key by key), then remove the
    copies gpunode made of it earlier (they hold what the user has changed since). A copy of the file as it is
    now is kept only when the rewrite cannot reproduce everything else in it (comments)."""

    removes: tuple[str, ...] = ()  # gpunode's backups of this file (the install-time copy included)
    keep_copy: bool = False  # the rewrite loses something of the user's (comments): keep a copy of it as it is

    def commands(self) -> list[str]:
        return [command_line(("rm", "-f", "--", *self.removes))] if self.removes else []

    def to_dict(self) -> dict[str, object]:
        return {**super().to_dict(), "removes": list(self.removes)}

    def apply_recorded(self, conn: Connection) -> tuple[str | None, list[UndoRecord]]:
        written = conn.write_file(self.path, self.after, mode=self.mode, backup=self.keep_copy)
        if self.removes:
            conn.run(("rm", "-f", "--", *self.removes), sudo=True, timeout=60).check(f"removing {', '.join(self.removes)}")
        return (f"copy of {self.path} as it was: {written.backup}" if written.backup else None), []
