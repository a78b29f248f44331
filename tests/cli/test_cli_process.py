"""The real `gpunode` process: what a shell sees (exit codes, stderr) when stdout is a pipe."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

GPUNODE = [sys.executable, "-m", "gpunode"]


@pytest.mark.parametrize("args", [["compat", "--driver", "535.129.03"], ["compat", "--driver", "535.129.03", "--json"],
                                  ["explain", "Failed to initialize NVML: Driver/library version mismatch"]])
def test_a_closed_pipe_ends_quietly_with_141(args):
    # the reader goes away before gpunode writes (like `gpunode compat ... | head -0`)
    proc = subprocess.Popen([*GPUNODE, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    code = proc.wait(timeout=120)
    stderr = proc.stderr.read().decode()
    assert code == 141, stderr
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr and "Exception ignored" not in stderr


def test_piped_output_is_not_wrapped_at_80_columns():
    done = subprocess.run([*GPUNODE, "compat", "--image", "nvidia/cuda:12.4.1-base-ubuntu22.04", "--driver",
                           "535.129.03"], capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert max(len(line) for line in done.stdout.splitlines()) > 200  # one long explanation line, not folded


def test_usage_error_from_the_real_process_has_no_traceback():
    done = subprocess.run([*GPUNODE, "plan", "--connect-timeout", "0"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "error: --connect-timeout 0" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.skipif(shutil.which("sh") is None, reason="needs a POSIX shell")
def test_head_in_a_shell_pipeline():
    done = subprocess.run(["sh", "-c", f"'{sys.executable}' -m gpunode compat --driver 535.129.03 | head -n 1"],
                          capture_output=True, text=True, timeout=120)
    assert done.stdout == "driver 535.129.03\n" and done.stderr == ""
