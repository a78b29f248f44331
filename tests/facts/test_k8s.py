"""gpunode/facts/k8s.py: the snippets, run for real under the shells a node may have."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from gpunode.facts import k8s


@pytest.mark.parametrize("shell", [s for s in ("dash", "bash", "busybox") if shutil.which(s)])
def test_the_tools_snippet_finds_what_command_v_finds_without_a_process_per_name(shell, tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir(), second.mkdir()
    (first / "kubelet").write_text("not executable\n")  # skipped, as command -v skips it
    for d, name in ((second, "kubelet"), (first, "k3s"), (second, "k3s")):
        (d / name).write_text("#!/bin/sh\n")
        (d / name).chmod(0o755)
    (first / "rke2").mkdir()  # a directory is not a program
    env = {"PATH": f"{first}:{second}"}
    exe = shutil.which(shell) or shell
    argv = [exe, "sh"] if shell == "busybox" else [exe]
    ours = subprocess.run([*argv, "-c", k8s.TOOLS.snippet], capture_output=True, text=True, env=env).stdout
    theirs = subprocess.run([*argv, "-c", 'for t in kubelet kubectl k3s rke2; do p=$(command -v "$t") && '
                             'echo "$t $p"; done'], capture_output=True, text=True, env=env).stdout
    assert ours == f"kubelet {second}/kubelet\nk3s {first}/k3s\n"
    if shell != "busybox":  # busybox's `command -v` also names a file that is not executable: not a program
        assert ours == theirs
