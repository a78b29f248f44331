"""Connections: the only way gpunode reaches a node (local, SSH, fake)."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpunode.connection.base import Connection, Result, WriteOutcome
from gpunode.record import Record
from gpunode.shell import Secret

__all__ = ["Connection", "ConnectionSpec", "Result", "WriteOutcome", "open_connection"]


@dataclass(eq=False, repr=False)
class ConnectionSpec(Record):
    """How the user asked to reach the node. host None means this machine."""

    host: str | None = None
    identity: list[str] = field(default_factory=list)
    known_hosts: list[str] = field(default_factory=list)
    accept_new_host_key: bool = False
    ssh_config: str | None = None
    password: Secret | None = None
    become_password: Secret | None = None
    connect_timeout: float = 15.0
    ahead: bool = False  # SSH: log in in the background while the caller prepares its first command


def open_connection(spec: ConnectionSpec) -> Connection:
    """The connection `spec` asks for. A node over SSH is logged into now, or with `spec.ahead` in a thread of its
    own while the caller goes on (gpunode/connection/ssh.py connect_ahead: its errors come at `wait_connected` or
    the first use). This machine needs no connecting."""
    if spec.host is None or spec.host in ("local", "localhost-direct"):
        from gpunode.connection.local import LocalConnection

        return LocalConnection(become_password=spec.become_password)
    from gpunode.connection.ssh import SSHConnection, SSHOptions

    options = SSHOptions(identity=spec.identity, known_hosts=spec.known_hosts,
                         accept_new_host_key=spec.accept_new_host_key, ssh_config=spec.ssh_config,
                         password=spec.password, connect_timeout=spec.connect_timeout)
    conn = SSHConnection(spec.host, options, become_password=spec.become_password)
    return conn.connect_ahead() if spec.ahead else conn.connect(defer_checks=True)
