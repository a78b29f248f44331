"""The machine gpunode runs on. The only place (with ssh.py) that starts processes."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time

from gpunode.cancel import Cancelled
from gpunode.connection.base import Connection, Held
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
        except KeyboardInterrupt:
            # Ctrl-C: the command runs in its own session, so pass the interrupt on, wait briefly, and report.
            _signal_group(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                _signal_group(proc.pid, signal.SIGKILL)
            raise Cancelled("interrupted (Ctrl-C) while a command was running on this machine",
                            fix="check what the command left behind, then run the same command again") from None
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            return -signal.SIGKILL, out, err, True


    def _hold(self, line: str, stdin: bytes, until: bytes, timeout: float) -> Held | None:
        proc = subprocess.Popen(["/bin/sh", "-c", line], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        assert proc.stdin is not None and proc.stdout is not None
        if stdin:
            proc.stdin.write(stdin)
            proc.stdin.flush()
        out = b""
        deadline = time.monotonic() + timeout
        while until not in out and time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], 0.1)
            if ready:
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    break
                out += chunk

        def release() -> None:
            assert proc.stdin is not None
            try:
                proc.stdin.close()
                proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                _signal_group(proc.pid, signal.SIGKILL)
            if proc.stdout is not None:
                proc.stdout.close()

        return Held(out, until not in out, release)


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
