"""Errors gpunode expects. Each carries a one-line message and, where there is one, the fix.

The CLI prints them as `error: MESSAGE` and `fix: FIX` with no traceback. Exit codes follow the README:
1 for a failure on the node, 2 for bad usage or a connection problem.
"""

from __future__ import annotations


class GpunodeError(Exception):
    exit_code = 1

    def __init__(self, message: str, fix: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix

    def __str__(self) -> str:
        return self.message


class UsageError(GpunodeError):
    """Bad input from the user: an option, a version string, a file."""

    exit_code = 2


class ConnectError(GpunodeError):
    """The node could not be reached, or authentication or host-key verification failed."""

    exit_code = 2


class CommandError(GpunodeError):
    """A command on the node failed."""

    def __init__(self, message: str, fix: str | None = None, *, stdout: str = "", stderr: str = "",
                 exit_code: int | None = None) -> None:
        super().__init__(message, fix)
        self.stdout = stdout
        self.stderr = stderr
        self.command_exit_code = exit_code


class CommandTimeout(CommandError):
    """A command ran past its wall-clock limit. It may still be running on the node."""
