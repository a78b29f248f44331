"""`gpunode facts`: what gpunode sees on the node, as JSON. For debugging and bug reports."""

from __future__ import annotations

import dataclasses

from gpunode.cli._common import (
    AcceptNewOpt,
    AskPassOpt,
    ConnectTimeoutOpt,
    HostOpt,
    IdentityOpt,
    KnownHostsOpt,
    SshConfigOpt,
    connect,
    expected_errors,
)
from gpunode.facts import gather
from gpunode.ui import print_json


def facts(
    host: HostOpt = None, identity: IdentityOpt = None, known_hosts: KnownHostsOpt = None,
    accept_new_host_key: AcceptNewOpt = False, ssh_config: SshConfigOpt = None, ask_pass: AskPassOpt = False,
    connect_timeout: ConnectTimeoutOpt = 15.0,
) -> None:
    """Print the parsed facts of the node as JSON (read-only)."""
    with expected_errors():
        with connect(host, identity, known_hosts, accept_new_host_key, ssh_config, ask_pass, False,
                     connect_timeout) as conn:
            found = gather(conn)
    data = dataclasses.asdict(found)
    data["nouveau_block"] = dataclasses.asdict(found.nouveau_block())
    print_json(_plain(data))


def _plain(value: object) -> object:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, frozenset, set)):
        items = [_plain(v) for v in value]
        return sorted(items, key=str) if isinstance(value, (frozenset, set)) else items
    return value
