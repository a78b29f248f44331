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


# A module-level object whose finalizer speaks: the interpreter's teardown runs it, os._exit does not.
_TEARDOWN = ("import atexit, sys\n"
             "class Spoken:\n    def __del__(self):\n        print('teardown', file=sys.stderr, flush=True)\n"
             "spoken = Spoken()\n"
             "atexit.register(lambda: print('atexit ran', file=sys.stderr, flush=True))\n")


def _main(argv: list[str], before: str = "") -> subprocess.CompletedProcess[str]:
    code = f"{_TEARDOWN}{before}\nsys.argv = ['gpunode', *{argv!r}]\nfrom gpunode.cli import main\nmain()\n"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_the_process_ends_without_the_teardown_after_atexit_and_with_its_output_flushed():
    done = _main(["compat", "--driver", "535.129.03"])
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("driver 535.129.03\n") and done.stdout.endswith("\n")  # all of it, through a pipe
    assert done.stdout == subprocess.run([*GPUNODE, "compat", "--driver", "535.129.03"], capture_output=True,
                                         text=True, timeout=120).stdout
    assert done.stderr == "atexit ran\n"  # the handlers ran; the teardown (the finalizer) did not


def test_the_exit_code_of_a_usage_error_survives_the_quick_end():
    done = _main(["plan", "--connect-timeout", "0"])
    assert done.returncode == 2 and "error: --connect-timeout 0" in done.stderr
    assert done.stderr.endswith("atexit ran\n") and "teardown" not in done.stderr


def test_a_thread_still_running_is_waited_for_by_the_usual_exit():
    before = ("import threading, time\n"
              "threading.Thread(target=lambda: (time.sleep(0.3), print('thread done', flush=True))).start()\n")
    done = _main(["--version"], before)
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith("thread done\n")
    assert done.stderr == "atexit ran\nteardown\n"  # the interpreter's own exit, teardown included


def test_a_code_that_is_not_a_number_is_left_to_systemexit():
    code = f"{_TEARDOWN}from gpunode.cli import end_now\nend_now('bye')\nprint('returned')\nraise SystemExit('bye')\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout) == (1, "returned\n")
    assert done.stderr.startswith("bye\natexit ran\n")
