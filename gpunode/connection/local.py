"""The machine gpunode runs on. The only place (with ssh.py) that starts processes."""

from __future__ import annotations

import os
import signal
import subprocess

from gpunode.connection.base import Connection
from gpunode.shell import Secret


class LocalConnection(Connection):
    name = "local"
    is_local = True

    def __init__(self, *, become_password: Secret | None = None) -> None:
        super().__init__(become_password=become_password)

    def _exec(self, line: str, stdin: bytes, timeout: float | None) -> tuple[int, bytes, bytes, bool]:
        proc = subprocess.Popen(["/bin/sh", "-c", line], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
        try:
            out, err = proc.communicate(stdin, timeout=timeout)
            return proc.returncode, out, err, False
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            out, err = proc.communicate()
            return -signal.SIGKILL, out, err, True
