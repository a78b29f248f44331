"""The action contract and the built-in kinds.

An action is frozen data: a summary, the exact command lines it runs on the node (`commands()`), lines that
describe what is not a command (`details()`: an upload, a wait), and where it runs (`where`: "node", or
"control" for work done on the machine running gpunode). `apply(conn)` carries it out and may return a note
worth keeping in the report (a backup path).
"""

from __future__ import annotations

import difflib
import shlex
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

from gpunode.connection.base import Connection
from gpunode.shell import Cmd, to_argv


def command_line(cmd: Cmd, sudo: bool = True) -> str:
    """The command line as it runs on the node (a Script in full: `sh -c BODY NAME ARGS`)."""
    return ("sudo " if sudo else "") + shlex.join(to_argv(cmd))


@dataclass(frozen=True)
class Action(ABC):
    summary: str

    kind: ClassVar[str] = "action"
    where: ClassVar[str] = "node"  # "node" | "control" (the machine running gpunode)

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


@dataclass(frozen=True)
class RunCommand(Action):
    cmd: Cmd = ()
    sudo: bool = True
    timeout: float = 600.0

    kind = "command"

    def commands(self) -> list[str]:
        return [command_line(self.cmd, self.sudo)]

    def apply(self, conn: Connection) -> str | None:
        conn.run(self.cmd, sudo=self.sudo, timeout=self.timeout).check(self.summary)
        return None


@dataclass(frozen=True)
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

    def to_dict(self) -> dict[str, object]:
        return {**super().to_dict(), "path": self.path, "mode": f"{self.mode:04o}", "diff": self.diff()}

    def apply(self, conn: Connection) -> str | None:
        written = conn.write_file(self.path, self.after, mode=self.mode)
        return f"backup of {self.path}: {written.backup}" if written.backup else None


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class Reboot(Action):
    """A reboot the step needs before it can converge. The runner decides whether and how to reboot, after the
    step's other actions; applying the action itself changes nothing."""

    kind = "reboot"

    def apply(self, conn: Connection) -> str | None:
        return None
