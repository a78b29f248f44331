"""`gpunode facts`: what gpunode sees on the node, as JSON. For debugging and bug reports."""

from __future__ import annotations

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
    print_json(found.to_json())  # every registered fact's parsed value, by subsystem
