"""How the user asked to reach nodes, checked once (gpunode/cli/_inputs.py), and the one function that makes
a printed `gpunode ...` fix runnable for the node it was about."""

from __future__ import annotations

import getpass
import re
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpunode import connection
from gpunode.connection import Connection, ConnectionSpec
from gpunode.inventory import InventoryHost
from gpunode.shell import Secret

DEFAULT_CONNECT_TIMEOUT = 15.0
NODE_COMMANDS = ("plan", "install", "doctor", "verify", "status", "facts")  # the commands that take --host
_GPUNODE = re.compile(rf"(?<![\w./-])gpunode ({'|'.join(NODE_COMMANDS)})(?![\w-])")


def runnable(fix: str, node_args: Sequence[str]) -> str:
    """Every `gpunode <command>` in a fix, with the node's options (already quoted) right after the command.
    `gpunode install --driver X` about gpu-01 becomes `gpunode install --host gpu-01 --driver X`."""
    if not node_args:
        return fix
    inserted = " " + shlex.join(node_args)
    # idempotent: a command already made for this node (e.g. the `next` command) is left as it is
    return _GPUNODE.sub(lambda m: m.group(0) if m.string.startswith(inserted, m.end()) else m.group(0) + inserted,
                        fix)


TEXT_KEYS = frozenset({"fix", "reason", "notes", "error", "evidence", "also", "next"})  # prose that may hold a fix


def rewrite_fixes(data: Any, fixer: Callable[[str], str], prose: bool = False) -> Any:
    """Every fix (and any `gpunode ...` in reasons and notes) in a JSON document, made runnable for the node:
    the same text a human sees."""
    if isinstance(data, str):
        return fixer(data) if prose else data
    if isinstance(data, dict):
        return {k: rewrite_fixes(v, fixer, k in TEXT_KEYS) for k, v in data.items()}
    if isinstance(data, list):
        return [rewrite_fixes(v, fixer, prose) for v in data]
    return data


@dataclass
class Target:
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

    def open(self, host: InventoryHost | None = None) -> Connection:
        password, become = self.secrets()
        address = host.target if host is not None else self.host
        identity = [host.identity] if host is not None and host.identity else list(self.identity)
        spec = ConnectionSpec(host=address, identity=identity, known_hosts=list(self.known_hosts),
                              accept_new_host_key=self.accept_new_host_key, ssh_config=self.ssh_config,
                              password=password, become_password=become, connect_timeout=self.connect_timeout)
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

    def fix(self, text: str | None, host: InventoryHost | None = None) -> str | None:
        """A fix made runnable for this node (or one node of the fleet)."""
        return None if text is None else runnable(text, self.node_args(host))

    def fixer(self, host: InventoryHost | None = None) -> Callable[[str], str]:
        args = self.node_args(host)
        return lambda text: runnable(text, args)

    def command(self, name: str, *extra: str, host: InventoryHost | None = None) -> str:
        """`gpunode <name>` for this node, e.g. the `gpunode verify ...` to run after an install."""
        return shlex.join(["gpunode", name, *self.node_args(host), *extra])
