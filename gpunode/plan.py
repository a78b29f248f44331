"""What a step intends to do: a status, a reason, and concrete actions.

Plans are plain data computed by pure functions. The same plan is shown by `gpunode plan` and executed by
`gpunode install`, so what a dry run predicts is exactly what an apply does (Ansible's check-mode contract).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from enum import Enum

from gpunode.shell import Cmd, display


class Status(str, Enum):
    OK = "ok"  # nothing to do
    CHANGE = "change"  # the actions will run
    BLOCKED = "blocked"  # cannot proceed: reason + fix
    UNKNOWN = "unknown"  # depends on an earlier step's effect; decided when that step has run

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Action:
    """One thing a step will do. Built-in kinds are executed by the runner; a kind defined next to its
    step may add `apply(self, conn) -> str | None` (the optional note is kept in the report)."""

    summary: str

    kind = "action"

    def commands(self) -> list[str]:
        """The exact command lines this action runs, for the plan."""
        return []

    def shown_commands(self, as_root: bool = False) -> list[str]:
        """commands() as they will really run: on a root login there is no sudo in front."""
        return [c.removeprefix("sudo ") if as_root else c for c in self.commands()]

    def to_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "summary": self.summary, "commands": self.commands()}


@dataclass(frozen=True)
class RunCommand(Action):
    cmd: Cmd = ()
    sudo: bool = True
    timeout: float = 600.0

    kind = "command"

    def commands(self) -> list[str]:
        return [("sudo " if self.sudo else "") + display(self.cmd)]


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


@dataclass(frozen=True)
class InstallPackages(Action):
    manager: str = "apt"
    packages: tuple[str, ...] = ()

    kind = "packages"

    def argv(self) -> tuple[str, ...]:
        if self.manager == "apt":
            return ("apt-get", "install", "-y", "--no-install-recommends", *self.packages)
        if self.manager in ("dnf", "yum"):
            return (self.manager, "install", "-y", *self.packages)
        if self.manager == "zypper":
            return ("zypper", "--non-interactive", "install", *self.packages)
        raise ValueError(f"unknown package manager {self.manager}")

    def commands(self) -> list[str]:
        return ["sudo " + display(self.argv())]

    def to_dict(self) -> dict[str, object]:
        return {**super().to_dict(), "manager": self.manager, "packages": list(self.packages)}


@dataclass(frozen=True)
class RestartService(Action):
    unit: str = ""

    kind = "service"

    def commands(self) -> list[str]:
        return ["sudo " + display(("systemctl", "restart", self.unit))]

    def to_dict(self) -> dict[str, object]:
        return {**super().to_dict(), "unit": self.unit}


@dataclass(frozen=True)
class Reboot(Action):
    """A reboot the step needs before it can converge. The runner decides whether and how to reboot."""

    kind = "reboot"


@dataclass(frozen=True)
class StepPlan:
    step: str
    status: Status
    reason: str
    actions: tuple[Action, ...] = ()
    fix: str | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def reboot_required(self) -> bool:
        return any(isinstance(a, Reboot) for a in self.actions)

    @property
    def only_reboot_left(self) -> bool:
        return bool(self.actions) and all(isinstance(a, Reboot) for a in self.actions)

    def to_dict(self) -> dict[str, object]:
        return {
            "step": self.step,
            "status": self.status.value,
            "reason": self.reason,
            "fix": self.fix,
            "reboot_required": self.reboot_required,
            "actions": [a.to_dict() for a in self.actions],
            "notes": list(self.notes),
        }


def ok(step: str, reason: str, *notes: str) -> StepPlan:
    return StepPlan(step, Status.OK, reason, notes=notes)


def change(step: str, reason: str, actions: list[Action] | tuple[Action, ...], *notes: str) -> StepPlan:
    return StepPlan(step, Status.CHANGE, reason, tuple(actions), notes=notes)


def blocked(step: str, reason: str, fix: str, *notes: str) -> StepPlan:
    return StepPlan(step, Status.BLOCKED, reason, fix=fix, notes=notes)


def unknown(step: str, reason: str, *notes: str) -> StepPlan:
    return StepPlan(step, Status.UNKNOWN, reason, notes=notes)
