"""Options shared by commands, and the one place expected errors become a message and an exit code."""

from __future__ import annotations

import getpass
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Annotated

import typer

from gpunode import connection
from gpunode.connection import Connection, ConnectionSpec
from gpunode.errors import GpunodeError, UsageError
from gpunode.inventory import InventoryHost, load_inventory
from gpunode.inventory import limit as limit_hosts
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

HostsOpt = Annotated[list[str] | None, typer.Option(
    "--host", "-H", help="[user@]host[:port] or a Host alias from ~/.ssh/config. Repeatable: several nodes run in "
    "parallel. Default: this machine.", show_default=False)]
InventoryOpt = Annotated[str | None, typer.Option(
    "--inventory", "-I", help="Nodes from a file: gpunode TOML/YAML, or an Ansible INI/YAML inventory.",
    show_default=False)]
LimitOpt = Annotated[str | None, typer.Option(
    "--limit", "-l", help="Only these hosts/groups (globs; a,b union, !x exclude, &x intersect).",
    show_default=False)]
ParallelOpt = Annotated[int, typer.Option("--parallel", help="How many nodes at once.")]
BatchOpt = Annotated[str | None, typer.Option(
    "--batch", help="Rolling batches: N nodes or P% of them at a time; the next batch starts when one is done.",
    show_default=False)]
MaxFailOpt = Annotated[str | None, typer.Option(
    "--max-fail", help="Start no new batch once more than P% of the nodes failed.", show_default=False)]
LogDirOpt = Annotated[str | None, typer.Option(
    "--log-dir", help="Per-node logs of a fleet run. Default: ./gpunode-logs/<time>/.", show_default=False)]


@dataclass
class Reach:
    """How the user asked to reach nodes: one (this machine or one --host) or many (fleet mode)."""

    hosts: list[str]
    identity: list[str]
    known_hosts: list[str]
    accept_new_host_key: bool
    ssh_config: str | None
    ask_pass: bool
    ask_become_pass: bool
    connect_timeout: float
    inventory: str | None = None
    limit: str | None = None
    _secrets: tuple[Secret | None, Secret | None] | None = None

    def targets(self) -> list[InventoryHost] | None:
        """The fleet, or None for a single node (no inventory and at most one --host)."""
        if self.inventory is None and len(self.hosts) <= 1:
            if self.limit:
                raise UsageError("--limit needs --inventory or several --host", fix="drop --limit or add --inventory")
            return None
        found = load_inventory(self.inventory) if self.inventory else []
        known = {h.name for h in found}
        found += [InventoryHost(name) for name in self.hosts if name not in known]
        return limit_hosts(found, self.limit)

    def secrets(self) -> tuple[Secret | None, Secret | None]:
        """Prompted once, before any node is touched (never in the middle of a parallel run)."""
        if self._secrets is None:
            password = Secret(getpass.getpass("SSH password: ")) if self.ask_pass else None
            become = Secret(getpass.getpass("BECOME (sudo) password: ")) if self.ask_become_pass else None
            self._secrets = (password, become)
        return self._secrets

    def open(self, host: InventoryHost | None = None) -> Connection:
        password, become = self.secrets()
        target = host.target if host is not None else (self.hosts[0] if self.hosts else None)
        identity = [host.identity] if host is not None and host.identity else list(self.identity)
        spec = ConnectionSpec(host=target, identity=identity, known_hosts=list(self.known_hosts),
                              accept_new_host_key=self.accept_new_host_key, ssh_config=self.ssh_config,
                              password=password, become_password=become, connect_timeout=self.connect_timeout)
        return connection.open_connection(spec)


def connect(host: str | None, identity: list[str] | None, known_hosts: list[str] | None, accept_new: bool,
            ssh_config: str | None, ask_pass: bool, ask_become_pass: bool, connect_timeout: float) -> Connection:
    """One node, for the commands that take a single --host."""
    return Reach([host] if host else [], list(identity or []), list(known_hosts or []), accept_new, ssh_config,
                 ask_pass, ask_become_pass, connect_timeout).open()


def print_error(exc: GpunodeError) -> None:
    """`error: ...` and `fix: ...` on stderr."""
    err.print(f"[bold red]error:[/] {escape(exc.message)}")
    if exc.fix:
        err.print(f"[bold]fix:[/] {escape(exc.fix)}")


@contextmanager
def expected_errors() -> Iterator[None]:
    """GpunodeError -> `error: ...` and `fix: ...` on stderr and its exit code; no traceback."""
    try:
        yield
    except GpunodeError as exc:
        print_error(exc)
        raise typer.Exit(exc.exit_code) from None


def escape(text: str) -> str:
    from rich.markup import escape as rich_escape

    return rich_escape(text)
