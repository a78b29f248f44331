"""Options shared by commands, and the one place expected errors become a message and an exit code."""

from __future__ import annotations

import getpass
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

import typer

from gpunode import connection
from gpunode.connection import Connection, ConnectionSpec
from gpunode.errors import GpunodeError, UsageError
from gpunode.shell import Secret
from gpunode.ui import err

HostOpt = Annotated[str | None, typer.Option(
    "--host", "-H", help="[user@]host[:port] or a Host alias from ~/.ssh/config. Default: this machine.",
    show_default=False)]
IdentityOpt = Annotated[list[str] | None, typer.Option(
    "--identity", "-i", help="Private key file (repeatable). Default: IdentityFile from ssh config, ssh-agent, "
    "~/.ssh/id_*.", show_default=False)]
KnownHostsOpt = Annotated[list[str] | None, typer.Option(
    "--known-hosts", help="Extra known_hosts file (repeatable); ~/.ssh/known_hosts is always read.",
    show_default=False)]
AcceptNewOpt = Annotated[bool, typer.Option(
    "--accept-new-host-key", help="Trust and record the host key of a node never seen before. A CHANGED key is "
    "still refused.")]
SshConfigOpt = Annotated[str | None, typer.Option("--ssh-config", help="ssh config file. Default: ~/.ssh/config.",
                                                  show_default=False)]
AskPassOpt = Annotated[bool, typer.Option("--ask-pass", help="Prompt for the SSH login password.")]
AskBecomePassOpt = Annotated[bool, typer.Option(
    "--ask-become-pass", "-K", help="Prompt once for the sudo password (sent on stdin, never on a command line).")]
ConnectTimeoutOpt = Annotated[float, typer.Option("--connect-timeout", help="Seconds to wait for SSH to connect.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON on stdout (schema in README).")]
OnlyOpt = Annotated[list[str] | None, typer.Option("--only", help="Run only this step (repeatable).",
                                                   show_default=False)]
SkipOpt = Annotated[list[str] | None, typer.Option("--skip", help="Skip this step (repeatable).", show_default=False)]
DriverOpt = Annotated[str | None, typer.Option("--driver", help="NVIDIA driver version, e.g. 535.129.03.",
                                               show_default=False)]

_DRIVER_VERSION = re.compile(r"^\d{3}\.\d{1,3}(\.\d{1,3})?$")


def check_driver_version(value: str | None) -> str | None:
    if value is None:
        return None
    if not _DRIVER_VERSION.match(value.strip()):
        raise UsageError(f"--driver {value!r} is not an NVIDIA driver version",
                         fix="use the full version from NVIDIA's download page, e.g. 535.129.03 or 550.54.15")
    return value.strip()


def connect(host: str | None, identity: list[str] | None, known_hosts: list[str] | None, accept_new: bool,
            ssh_config: str | None, ask_pass: bool, ask_become_pass: bool, connect_timeout: float) -> Connection:
    password = Secret(getpass.getpass("SSH password: ")) if ask_pass else None
    become = Secret(getpass.getpass("BECOME (sudo) password: ")) if ask_become_pass else None
    spec = ConnectionSpec(host=host, identity=list(identity or []), known_hosts=list(known_hosts or []),
                          accept_new_host_key=accept_new, ssh_config=ssh_config, password=password,
                          become_password=become, connect_timeout=connect_timeout)
    return connection.open_connection(spec)


@contextmanager
def expected_errors() -> Iterator[None]:
    """GpunodeError -> `error: ...` and `fix: ...` on stderr and its exit code; no traceback."""
    try:
        yield
    except GpunodeError as exc:
        err.print(f"[bold red]error:[/] {escape(exc.message)}")
        if exc.fix:
            err.print(f"[bold]fix:[/] {escape(exc.fix)}")
        raise typer.Exit(exc.exit_code) from None


def escape(text: str) -> str:
    from rich.markup import escape as rich_escape

    return rich_escape(text)
