"""sudo refusals are told apart (wrong password / not in sudoers / needs a tty / no sudo), each with its fix.
The node side is scripted with the texts real sudo prints."""

import pytest

from gpunode.connection.base import Connection, PrivilegeError
from gpunode.errors import CommandError
from gpunode.shell import Secret

NEEDS_PASSWORD = (1, b"sudo: a password is required\n")
WRONG = (1, b"Sorry, try again.\nsudo: no password was provided\nsudo: 1 incorrect password attempt\n")
NOT_IN_SUDOERS = (1, b"alice is not in the sudoers file.  This incident will be reported.\n")
NOT_ALLOWED_HERE = (1, b"Sorry, user alice is not allowed to execute '/usr/bin/true' as root on gpu-01.\n")
REQUIRETTY = (1, b"sudo: sorry, you must have a tty to run sudo\n")
NO_SUDO = (127, b"sh: 1: sudo: not found\n")


class ScriptedSudo(Connection):
    name = "gpu-01"

    def __init__(self, sudo_n, sudo_s=None, password=None):
        super().__init__(become_password=Secret(password) if password else None)
        self.sudo_n, self.sudo_s = sudo_n, sudo_s
        self.sent = []

    def _exec(self, line, stdin, timeout):
        self.sent.append(line)
        if line.endswith("id -u"):
            return 0, b"1000\n", b"", False
        if line.startswith("sudo -n"):
            code, err = self.sudo_n
            return code, b"", err, False
        if line.startswith("sudo -S"):
            code, err = self.sudo_s
            return code, b"", err, False
        return 0, b"", b"", False


@pytest.mark.parametrize("sudo_n, sudo_s, password, message, fix", [
    (NEEDS_PASSWORD, None, None, "root is needed and sudo asks for a password", "--ask-become-pass"),
    (NEEDS_PASSWORD, WRONG, "wrong", "sudo rejected the password given to --ask-become-pass", "password"),
    (NEEDS_PASSWORD, NOT_IN_SUDOERS, "right", "not allowed to use sudo (not in sudoers)", "--host root@gpu-01"),
    (NEEDS_PASSWORD, NOT_ALLOWED_HERE, "right", "not allowed to use sudo (not in sudoers)", "grant sudo"),
    (REQUIRETTY, None, "right", "sudo on the node requires a terminal (Defaults requiretty)", "!requiretty"),
    (NO_SUDO, None, None, "sudo is not installed", "log in as root"),
    (NO_SUDO, None, "right", "sudo is not installed", "install sudo"),
])
def test_each_refusal_is_named_with_its_own_fix(sudo_n, sudo_s, password, message, fix):
    conn = ScriptedSudo(sudo_n, sudo_s, password)
    with pytest.raises(PrivilegeError) as info:
        conn.run(["apt-get", "update"], sudo=True)
    assert info.value.message.startswith("gpu-01: ") and message in info.value.message
    assert fix in info.value.fix
    assert info.value.exit_code == 2
    assert isinstance(info.value, CommandError)  # read-only probes fall back to the login user on it
    assert not any("apt-get" in line for line in conn.sent)  # nothing ran
    if password:
        assert all(password not in line for line in conn.sent) and password not in str(info.value)


def test_a_password_is_only_tried_when_sudo_asks_for_one():
    conn = ScriptedSudo(REQUIRETTY, WRONG, "pw")
    with pytest.raises(PrivilegeError, match="requires a terminal"):
        conn.run(["true"], sudo=True)
    assert not any(line.startswith("sudo -S") for line in conn.sent)


def test_the_right_password_is_accepted_and_remembered():
    conn = ScriptedSudo(NEEDS_PASSWORD, (0, b""), "right")
    conn.run(["true"], sudo=True)
    conn.run(["true"], sudo=True)
    assert sum(line.startswith("sudo -S -k -p '' -- env") and line.endswith("true") for line in conn.sent) == 3
