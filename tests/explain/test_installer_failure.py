"""gpunode.explain.installer_failure: the driver step's reading of a failed nvidia-installer run (output and log
tail), from the same tables `gpunode explain` uses (data/installer_failures.csv and the kernel-log rows)."""

from __future__ import annotations

import pytest

from gpunode.explain import installer_failure
from tests.conftest import FIXTURES

ERRORS = FIXTURES / "errors"


@pytest.mark.parametrize("name,words,fix", [
    ("nvidia-installer_nouveau-in-use_installation-failed.txt", "nouveau", "gpunode install --only nouveau"),
    ("nvidia-installer_kernel-source-tree-not-found_fedora27.txt", "headers",
     "sudo apt-get install -y linux-headers-$(uname -r)"),
    ("nvidia-installer_nvidia-drm-already-loaded_410.72.txt", "in use", "sudo systemctl stop nvidia-persistenced"),
])
def test_real_installer_output_gives_meaning_and_a_command(name, words, fix):
    result = installer_failure((ERRORS / name).read_text(encoding="utf-8", errors="replace"))
    assert result is not None
    meaning, command = result
    assert words in meaning.lower() and command.startswith(fix)


@pytest.mark.parametrize("text,fix", [
    ("ERROR: Unable to load the kernel module 'nvidia.ko'.\n-> Kernel module load error: Key was rejected by service",
     "mokutil --sb-state"),  # the reason in the log tail wins over the installer's summary
    ("ERROR: Unable to build the NVIDIA kernel module.\nERROR: Installation has failed.  Please see the file\n"
     "       '/var/log/nvidia-installer.log' for details.", "sudo tail -n 60 /var/log/nvidia-installer.log"),
    ("tar: NVIDIA-Linux-x86_64-550.120/kernel: Cannot write: No space left on device", "df -h /tmp /var/tmp /usr"),
    ("ERROR: The kernel was built with gcc version 12, but the current compiler is 11. CC version check failed",
     "cat /proc/version"),
    ("ERROR: The signed kernel module failed to load.", "mokutil --sb-state"),
])
def test_installer_failures_table_rows(text, fix):
    result = installer_failure(text)
    assert result is not None and result[1].startswith(fix), result


def test_the_log_named_in_the_output_is_the_one_to_read():
    text = ("ERROR: Unable to build the NVIDIA kernel module.\n\nERROR: Installation has failed.  Please see the file "
            "'/usr/local/nvidia/nvidia-installer.log' for details.")
    result = installer_failure(text)
    assert result is not None and result[1] == "sudo tail -n 60 /usr/local/nvidia/nvidia-installer.log"


def test_unrecognised_output_gives_none():
    assert installer_failure("Verifying archive integrity... OK\nsomething else went wrong") is None
