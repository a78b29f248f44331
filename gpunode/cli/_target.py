"""How the user asked to reach nodes, checked once (gpunode/cli/_inputs.py), and the CLI's renderer of fixes
(gpunode/fixes.py): each made runnable, as printed, for the node it was about."""

from __future__ import annotations

import getpass
import re
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpunode import connection
from gpunode.connection import Connection, ConnectionSpec
from gpunode.errors import GpunodeError
from gpunode.fixes import Fix, OnNode
from gpunode.record import Record
from gpunode.shell import Secret

if TYPE_CHECKING:  # an inventory is read for a fleet only (gpunode/cli/_inputs.py)
    from gpunode.inventory import InventoryHost

DEFAULT_CONNECT_TIMEOUT = 15.0
_DOUBLE_QUOTE_SAFE = re.compile(r'[^"$`\\!]*')


def _remote_word(command: str) -> str:
    """The command as one word for ssh (which hands its words to the node's shell joined by spaces)."""
    return f'"{command}"' if _DOUBLE_QUOTE_SAFE.fullmatch(command) else shlex.quote(command)


def runnable(fix: str, node_args: Sequence[str], ssh: Sequence[str] = ()) -> str:
    """A fix (gpunode/fixes.py) as printed for this node: each gpunode command with the node's options (already
    quoted) right after the command (`gpunode install --driver X` about gpu-01 becomes `gpunode install --host
    gpu-01 --driver X`); with `ssh` (the argv that reaches a remote node, e.g. ["ssh", "-p", "2222",
    "ubuntu@gpu-01"]) each command for the node through it (`ssh -t -p 2222 ubuntu@gpu-01 "sudo modprobe
    nvidia"`; piped into a gpunode command here: only its node side); commands where the user is (kubectl) and
    words as they are. Text that is not a Fix is words: nothing in it is guessed to be a command."""
    if not isinstance(fix, Fix):
        return fix

    def node(part: OnNode) -> str:
        if not ssh:
            return part.text()
        tty = [] if part.into else ["-t"]  # sudo may ask for a password; a pipe needs clean output instead
        there = shlex.join([ssh[0], *tty, *ssh[1:]]) + " " + _remote_word(part.command)
        return there + (" | " + part.into.text() if part.into else "")

    return fix.render(lambda command: command.text(node_args), node)


TEXT_KEYS = frozenset({"fix", "reason", "notes", "error", "evidence", "also", "next"})  # where a Fix may be


def rewrite_fixes(data: Any, fixer: Callable[[str], str], prose: bool = False) -> Any:
    """Every fix (a Fix in a fix, note, reason ...) in a JSON document, made runnable for the node: the same text a
    human sees."""
    if isinstance(data, str):
        return fixer(data) if prose else data
    if isinstance(data, dict):
        return {k: rewrite_fixes(v, fixer, k in TEXT_KEYS) for k, v in data.items()}
    if isinstance(data, list):
        return [rewrite_fixes(v, fixer, prose) for v in data]
    return data


@dataclass(eq=False, repr=False)
class Target(Record):
    """One node (this machine or one --host) or a fleet (several --host, or --inventory)."""

    hosts: list[str]
    identity: list[str]
    known_hosts: list[str]
    accept_new_host_key: bool
    ssh_config: str | None
    ask_pass: bool
    ask_become_pass: bool
    connect_timeout: float
    json_output: bool = False
    inventory: str | None = None
    limit: str | None = None
    parallel: int = 8
    log_dir: str | None = None
    log_level: str = "info"  # fleet logs: info | debug (gpunode/fleetlog.py)
    batch: str | None = None
    max_fail: float | None = None
    fleet: list[InventoryHost] | None = None  # resolved by _inputs.target(); None: a single node
    local: bool = False  # --local: this machine, no SSH (docs/engines.md); fixes and `next` repeat it
    notes: list[str] = field(default_factory=list)  # options given that do not apply (printed once, on stderr)
    _secrets: tuple[Secret | None, Secret | None] | None = None

    @property
    def host(self) -> str | None:
        return self.hosts[0] if self.hosts else None

    def secrets(self) -> tuple[Secret | None, Secret | None]:
        """Prompted once, before any node is touched (never in the middle of a parallel run)."""
        if self._secrets is None:
            password = Secret(getpass.getpass("SSH password: ")) if self.ask_pass else None
            become = Secret(getpass.getpass("BECOME (sudo) password: ")) if self.ask_become_pass else None
            self._secrets = (password, become)
        return self._secrets

    def open(self, host: InventoryHost | None = None, *, ahead: bool = False) -> Connection:
        """The connection to this node (or one node of the fleet); with `ahead`, logging in goes on in its own
        thread (gpunode/connection/__init__.py open_connection)."""
        password, become = self.secrets()
        address = host.target if host is not None else self.host
        identity = [host.identity] if host is not None and host.identity else list(self.identity)
        spec = ConnectionSpec(host=address, identity=identity, known_hosts=list(self.known_hosts),
                              accept_new_host_key=self.accept_new_host_key, ssh_config=self.ssh_config,
                              password=password, become_password=become, connect_timeout=self.connect_timeout,
                              ahead=ahead)
        return connection.open_connection(spec)

    def node_args(self, host: InventoryHost | None = None) -> list[str]:
        """The options that reach this node again: --host (or --inventory/--limit for an inventory host) and
        the connection options the user gave."""
        words: list[str] = []
        if host is not None and self.inventory is not None and host.name not in self.hosts:
            words += ["--inventory", self.inventory, "--limit", host.name]
        elif host is not None:
            words += ["--host", host.target]
        elif self.host:
            words += ["--host", self.host]
        elif self.local:
            words += ["--local"]
        if self.ssh_config:
            words += ["--ssh-config", self.ssh_config]
        for path in self.identity:
            words += ["--identity", path]
        for path in self.known_hosts:
            words += ["--known-hosts", path]
        if self.connect_timeout != DEFAULT_CONNECT_TIMEOUT:
            words += ["--connect-timeout", f"{self.connect_timeout:g}"]
        words += [flag for flag, on in (("--accept-new-host-key", self.accept_new_host_key),
                                        ("--ask-pass", self.ask_pass),
                                        ("--ask-become-pass", self.ask_become_pass)) if on]
        return words

    def ssh_args(self, host: InventoryHost | None = None) -> list[str]:
        """The OpenSSH command line that reaches this node (empty for this machine): what a node command in a
        fix is prefixed with. The same host, port, config, keys and known-hosts files gpunode used."""
        address = host.target if host is not None else self.host
        if not address:
            return []
        from gpunode.connection.ssh import SSHTarget  # paramiko only when a node is remote

        try:
            where = SSHTarget.parse(address)
        except GpunodeError:
            return []
        words = ["ssh"]
        if self.ssh_config:
            words += ["-F", self.ssh_config]
        identities = [host.identity] if host is not None and host.identity else self.identity
        for path in identities:
            words += ["-i", path]
        for path in self.known_hosts:
            words += ["-o", f"UserKnownHostsFile={path}"]
        if where.port:
            words += ["-p", str(where.port)]
        return [*words, f"{where.user}@{where.host}" if where.user else where.host]

    def fix(self, text: str | None, host: InventoryHost | None = None) -> str | None:
        """A fix made runnable for this node (or one node of the fleet)."""
        return None if text is None else runnable(text, self.node_args(host), self.ssh_args(host))

    def fixer(self, host: InventoryHost | None = None) -> Callable[[str], str]:
        args, ssh = self.node_args(host), self.ssh_args(host)
        return lambda text: runnable(text, args, ssh)

    def command(self, name: str, *extra: str, host: InventoryHost | None = None) -> str:
        """`gpunode <name>` for this node, e.g. the `gpunode verify ...` to run after an install."""
        return shlex.join(["gpunode", name, *self.node_args(host), *extra])
