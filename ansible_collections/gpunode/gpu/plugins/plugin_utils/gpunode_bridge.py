# Copyright: gpunode contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Controller side of the collection: gpunode's Connection interface on top of the task's Ansible connection.

gpunode reaches a node through one primitive, `_exec(line, stdin, timeout)`, and builds reading, verified
writing, uploading and its own sudo handling on it as POSIX sh (gpunode/connection/base.py). Here that primitive
is ActionBase._low_level_execute_command, the same call Ansible's raw, script and reboot actions use: the
connection plugin (ssh, paramiko, local, mitogen...), the inventory's user, port and keys, and become (wrapped
the Ansible way, with its password prompt handling) all apply unchanged. gpunode therefore runs as whoever the
task runs as: with `become: true` every command already runs as root and gpunode adds no sudo of its own.
"""

from __future__ import annotations

import shlex

from ansible.errors import AnsibleConnectionFailure, AnsibleError

try:
    from gpunode.cli._target import rewrite_fixes, runnable
    from gpunode.connection.base import Connection
    from gpunode.errors import ConnectError
except ImportError as exc:  # the controller lacks gpunode: the action plugins say so as a task failure
    GPUNODE_IMPORT_ERROR: ImportError | None = exc
    Connection = object  # type: ignore[misc,assignment]
else:
    GPUNODE_IMPORT_ERROR = None

MISSING_GPUNODE = ("gpunode is not installed on the Ansible controller ({0}); the gpunode.gpu modules run there "
                   "and need it: pip install gpunode (in the Python that runs ansible-playbook)")


class AnsibleNodeConnection(Connection):  # type: ignore[misc,valid-type]
    """A gpunode Connection whose commands go through an action plugin's Ansible connection."""

    def __init__(self, action, name):
        super().__init__()
        self.name = name
        self._action = action
        self.failure = None  # the connection plugin's own message, when it could not reach the node
        conn = action._connection
        # gpunode reads exact bytes (framed probe sections, sha256 of uploads): no pty, which would turn "\n"
        # into "\r\n" and mix stderr into stdout. ssh only asks for one (-tt) for sudoable commands without stdin.
        if conn.has_option("use_tty"):
            conn.set_option("use_tty", False)

    def _learns_root_inline(self):
        return True  # each command is a round trip: learn "root or not" with the first privileged one

    def _exec(self, line, stdin, timeout):
        # Ansible connections have no per-command timeout: the task's `timeout:` keyword bounds the whole run.
        try:
            result = self._action._low_level_execute_command(line, sudoable=True, in_data=stdin or None,
                                                             encoding_errors="surrogateescape")
        except AnsibleConnectionFailure as exc:
            self.failure = str(exc.message)
            raise ConnectError(f"{self.name}: cannot reach the node through Ansible's connection: {exc.message}",
                               fix=f"check that Ansible reaches it: ansible {shlex.quote(self.name)} -m "
                                   "ansible.builtin.raw -a true") from None
        except AnsibleError as exc:  # e.g. "Missing sudo password", "Incorrect sudo password"
            raise ConnectError(f"{self.name}: {exc.message}",
                               fix="set the become password (--ask-become-pass / ansible_become_password), or "
                                   "allow passwordless sudo for the remote user") from None
        out = result["stdout"].encode("utf-8", "surrogateescape")
        err = result["stderr"].encode("utf-8", "surrogateescape")
        return int(result["rc"]), out, err, False


def node_fixer(task_vars, inventory_hostname):
    """The function that makes a printed `gpunode ...` fix runnable from the controller for this host."""
    address = task_vars.get("ansible_host") or inventory_hostname
    user = task_vars.get("ansible_user") or task_vars.get("ansible_ssh_user")
    port = task_vars.get("ansible_port") or task_vars.get("ansible_ssh_port")
    host = (f"{user}@" if user else "") + str(address) + (f":{port}" if port else "")
    args = ["--host", host]
    key = task_vars.get("ansible_ssh_private_key_file") or task_vars.get("ansible_private_key_file")
    if key:
        args += ["--identity", str(key)]

    def fix(text):
        return runnable(text, args)

    return fix


def rewrite(data, task_vars, inventory_hostname):
    return rewrite_fixes(data, node_fixer(task_vars, inventory_hostname))
