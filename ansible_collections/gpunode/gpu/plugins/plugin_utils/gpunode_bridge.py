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

import json
import re
import shlex

from ansible.errors import AnsibleConnectionFailure, AnsibleError

try:
    from gpunode.cli._target import rewrite_fixes, runnable
    from gpunode.connection.base import Connection
    from gpunode.errors import ConnectError
    from gpunode.fixes import Fix, Gpunode, Here, OnNode
    from gpunode import options as gpunode_options
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
        self.transcript = []  # the commands run and the end of what they printed: a failed task's `output`
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
        self._record(line, result)
        out = result["stdout"].encode("utf-8", "surrogateescape")
        err = result["stderr"].encode("utf-8", "surrogateescape")
        return int(result["rc"]), out, err, False

    def _record(self, line, result):
        lines = line.strip().splitlines() or [""]
        self.transcript.append({"command": lines[0][:300] + (" ..." if len(lines) > 1 or len(lines[0]) > 300 else ""),
                                "rc": int(result["rc"]),
                                "stdout": _tail(result["stdout"]), "stderr": _tail(result["stderr"])})
        del self.transcript[:-TRANSCRIPT_COMMANDS]

    def output(self):
        """What a terminal would have shown above a failure: the commands that failed (else the last ones)."""
        failed = [entry for entry in self.transcript if entry["rc"] != 0]
        return failed[-OUTPUT_COMMANDS:] or self.transcript[-OUTPUT_COMMANDS:]


TRANSCRIPT_COMMANDS = 40
OUTPUT_COMMANDS = 5
OUTPUT_LINES = 20


def _tail(text):
    return "\n".join(text.splitlines()[-OUTPUT_LINES:])


def _yaml(value):
    """A value as YAML in flow style (one line)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_yaml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return f"{value:g}" if isinstance(value, float) else str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_yaml(v) for v in value) + "]"
    return json.dumps(str(value))


def module_args(command):
    """A gpunode command (gpunode/fixes.py Gpunode) as (module, its arguments, check mode, reboot first) of the
    collection's module that does the same, or None for the commands the collection has no module for (verify,
    compat, explain ...: run on the controller)."""
    if command.command not in ("install", "plan", "uninstall", "doctor"):
        return None
    if command.command == "doctor":
        return "gpunode.gpu.doctor", {}, False, False
    rows = {row.name: row for row in gpunode_options.option_table() if gpunode_options.ANSIBLE in row.fronts}
    args = {"state": "absent"} if command.command == "uninstall" else {}
    reboot = False
    for name, value in command.options:
        if name == "reboot":
            reboot = bool(value)
        elif name in rows and value is not None and rows[name].type == "list":  # repeated: one list
            args[name] = [*args.get(name, []), *(value if isinstance(value, (list, tuple)) else [value])]
        elif name in rows and value is not None:
            args[name] = value
    return "gpunode.gpu.node", args, command.command == "plan", reboot


def module_call(command):
    """A gpunode command as the collection's module call that does the same, in words, or None (module_args)."""
    found = module_args(command)
    if found is None:
        return None
    module, args, check, reboot = found
    text = module + (": " + _yaml(args) if args else "")
    if check:
        text += " in check mode"
    if reboot:
        text += ", then ansible.builtin.reboot and the same task again"
    return text


# `sudo` at the start of a command in a line (not `sudo -u USER`): become does it for the whole task
_SUDO = re.compile(r"(^|[|;&(]\s*)sudo\s+(?=[^-\s])")
# what only a shell understands: pipes, lists, redirections, expansions, globs, quotes
_SHELL = re.compile(r"[|;&<>()$`*?\[\]'\"\\~]")


def command_task(line, *, controller=False):
    """A command line as the Ansible task that runs it: ansible.builtin.command (or .shell, when the line needs a
    shell), with `become: true` for the `sudo` it drops; on the controller (`delegate_to: localhost`) for what
    runs where the user is."""
    bare = _SUDO.sub(r"\1", line)
    task = {"ansible.builtin.shell" if _SHELL.search(bare) else "ansible.builtin.command": bare}
    if bare != line:
        task["become"] = True
    if controller:
        task["delegate_to"] = "localhost"
    return task


def fix_tasks(fix, node_args):
    """The commands of a fix as tasks an Ansible user can paste (each a dict, as YAML): gpunode's own commands as
    the collection's module with its arguments (`check_mode: true` for a plan; a reboot first named by
    ansible.builtin.reboot), node commands as command/shell tasks with become, what runs where the user is
    delegated to localhost. Words are not tasks. A plain text fix has none."""
    tasks = []
    for part in fix.parts if isinstance(fix, Fix) else ():
        if isinstance(part, Gpunode):
            found = module_args(part)
            if found is None:
                tasks.append(command_task(part.text(node_args), controller=True))
                continue
            module, args, check, reboot = found
            task = {module: args}
            if check:
                task["check_mode"] = True
            tasks.append(task)
            if reboot:
                tasks += [{"ansible.builtin.reboot": {}}, dict(task)]
        elif isinstance(part, OnNode):
            task = command_task(part.command)
            if part.into is not None:  # its output goes to a gpunode command on the controller
                task["register"] = "node_output"
                tasks += [task, {**command_task(part.into.text(), controller=True),
                                 "args": {"stdin": "{{ node_output.stdout }}"}}]
            else:
                tasks.append(task)
        elif isinstance(part, Here):
            tasks.append(command_task(part.command, controller=True))
    return tasks


def _task_text(task):
    """A task as one line of YAML (a flow mapping): pasted after `- ` in a playbook's tasks, it runs."""
    return _yaml(task)


def ansible_fix(fix, node_args):
    """A fix as an Ansible user acts on it: gpunode's own commands as module arguments, node commands as the
    task that runs them (one line of YAML), other gpunode commands (verify, compat) runnable from the controller,
    the failed commands' output where the task result has it."""
    if not isinstance(fix, Fix):
        return runnable(fix, node_args)
    return fix.render(lambda command: module_call(command) or command.text(node_args),
                      lambda part: (_task_text(command_task(part.command)) if part.into is None else
                                    " then ".join(_task_text(t) for t in fix_tasks(Fix(part), node_args))),
                      lambda part: "see `output` in this task's result")


def fix_entry(fix, node_args, **about):
    """One entry of the task result's `fixes`: the fix in words as ansible_fix renders it, and its tasks."""
    return {**about, "fix": ansible_fix(fix, node_args), "tasks": fix_tasks(fix, node_args)}


def node_args(task_vars, inventory_hostname):
    """How a gpunode command run on the controller reaches this host (--host, --identity), from Ansible's
    inventory variables."""
    address = task_vars.get("ansible_host") or inventory_hostname
    user = task_vars.get("ansible_user") or task_vars.get("ansible_ssh_user")
    port = task_vars.get("ansible_port") or task_vars.get("ansible_ssh_port")
    host = (f"{user}@" if user else "") + str(address) + (f":{port}" if port else "")
    args = ["--host", host]
    key = task_vars.get("ansible_ssh_private_key_file") or task_vars.get("ansible_private_key_file")
    if key:
        args += ["--identity", str(key)]
    return args


def node_fixer(task_vars, inventory_hostname):
    """The function that renders gpunode's fixes for this host, for an Ansible user."""
    args = node_args(task_vars, inventory_hostname)

    def fix(text):
        return ansible_fix(text, args)

    return fix


def rewrite(data, task_vars, inventory_hostname):
    return rewrite_fixes(data, node_fixer(task_vars, inventory_hostname))
