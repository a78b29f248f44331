"""Everything that becomes shell text on the node is built here, quoted, with secrets kept out.

A command is either an argv (preferred: each word quoted) or a `Script`: a POSIX sh body that receives
its values as positional parameters ("$1", "$2", ...), so values never need to be spliced into the body.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from gpunode.record import Frozen

# Inline environment for every command: parseable output, and apt/dpkg never prompt.
# Passed on the command line because SSH servers silently drop `exec_command(environment=...)`.
BASE_ENV: tuple[tuple[str, str], ...] = (
    ("LC_ALL", "C"),
    ("LANG", "C"),
    ("DEBIAN_FRONTEND", "noninteractive"),
    ("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"),
)


@dataclass(frozen=True, eq=False, repr=False)
class Secret(Frozen):
    """A value that must never be printed: str() and repr() mask it."""

    value: str

    def __str__(self) -> str:
        return "***"

    def __repr__(self) -> str:
        return "Secret(***)"


@dataclass(frozen=True, eq=False, repr=False)
class Script(Frozen):
    """A POSIX sh script; `args` become "$1".. inside it. `name` labels it in logs and plans."""

    body: str
    args: tuple[str, ...] = ()
    name: str = "script"

    def argv(self) -> tuple[str, ...]:
        return ("sh", "-c", self.body, f"gpunode-{self.name}", *self.args)

    def display(self) -> str:
        """Short form for plans and logs: the name and its arguments, not the whole body."""
        return shlex.join((f"<{self.name}>", *self.args))


Cmd = Sequence[str] | Script


def to_argv(cmd: Cmd) -> tuple[str, ...]:
    if isinstance(cmd, Script):
        return cmd.argv()
    if isinstance(cmd, str):
        raise TypeError("pass an argv sequence or a Script, not a bare string")
    return tuple(cmd)


def display(cmd: Cmd) -> str:
    if isinstance(cmd, Script):
        return cmd.display()
    return shlex.join(cmd)


def render(cmd: Cmd, *, privilege: Sequence[str] = ()) -> str:
    """The full command line sent to the node: privilege prefix, inline env, then the quoted argv."""
    env = ["env", *(f"{k}={v}" for k, v in BASE_ENV)]
    return shlex.join([*privilege, *env, *to_argv(cmd)])


def quote(value: str) -> str:
    return shlex.quote(value)
