"""The reliability suite: the node's disk too full for the NVIDIA installer. gpunode names the filesystem and the
space the .run needs (its upload and makeself's "Uncompressed size") before uploading; and when the installer
itself runs out of room (the real makeself header's check, as NVIDIA's .run has it), the error says so instead of
an exit code. On simulated nodes (real sshd, a real makeself archive). See docs/reliability.md."""

from __future__ import annotations

import pytest

from gpunode.connection.ssh import SSHConnection
from tests.integration.test_driver_nodesim import V, mirror  # noqa: F401 - pytest fixture
from tests.integration.test_driver_nodesim import install as install_driver
from tests.integration.test_reliability_faults import flat
from tests.nodesim.fixtures import host_guard, nodesim_available, sim_node  # noqa: F401 - pytest fixtures

pytestmark = pytest.mark.integration


def installer_runs(node) -> list[list[str]]:
    return [c for c in node.calls("nvidia-installer") if "--version" not in c]


def test_too_little_room_in_var_tmp_is_named_before_the_upload_and_a_rerun_converges(sim_node, mirror,  # noqa: F811
                                                                                      tmp_path):
    mirror.publish(V)
    node = sim_node("ubuntu-22.04-t4", nouveau_loaded=False)
    node.set_disk_free(4)  # 4 KB: less than the .run alone
    result = install_driver(node, tmp_path)
    assert result.exit_code == 1, result.output
    shown = flat(result.output)
    assert "not enough disk space for the NVIDIA installer in /var/tmp: /dev/vda1 (mounted on /) has 4 kB free" \
        in shown, shown
    assert f"NVIDIA-Linux-x86_64-{V}.run needs" in shown and "uploaded" in shown and "unpacked" in shown
    assert "fix: free" in shown and "df -h /var/tmp" in shown
    assert "found before any change: nothing was changed" in shown  # preflight: before nouveau and the packages
    assert installer_runs(node) == [] and node.driver() is None
    assert node.calls("update-initramfs") == [] and [c for c in node.calls("apt-get") if "install" in c] == []
    assert [n for n in node.listdir("/var/tmp") if n.startswith("gpunode.")] == []  # nothing uploaded
    node.set_disk_free(None)
    again = install_driver(node, tmp_path)
    assert again.exit_code == 0, again.output
    assert node.driver() is not None


def test_an_installer_that_runs_out_of_room_unpacking_says_so(sim_node, mirror, tmp_path, monkeypatch):  # noqa: F811
    """The checks before the upload cannot read df (None), so the installer itself finds the disk full."""
    mirror.publish(V)
    node = sim_node("ubuntu-22.04-t4", nouveau_loaded=False)
    real = SSHConnection.disk_free
    asked: list[str] = []

    def unknown_at_first(self, path):  # df unreadable for preflight and the upload; read after the failure
        asked.append(path)
        return None if len(asked) <= 2 else real(self, path)

    monkeypatch.setattr(SSHConnection, "disk_free", unknown_at_first)
    node.set_disk_free(1)  # 1 KB: makeself's own check before unpacking refuses
    result = install_driver(node, tmp_path)
    assert result.exit_code == 1, result.output
    shown = flat(result.output)
    assert "exit 15" not in shown
    assert "the disk filled up while it unpacked in /var/tmp: /dev/vda1 (mounted on /) has 1 kB free now" in shown
    assert f"NVIDIA-Linux-x86_64-{V}.run needs" in shown and "unpacked" in shown
    assert "Not enough space left in" in shown  # makeself's own words, in the installer's output tail
    assert node.driver() is None
