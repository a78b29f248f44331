"""The actions that replace a loaded driver, applied on the fake node: what runs, and what is put back when a
stop or an unload fails."""

from __future__ import annotations

import pytest

from gpunode.actions.driver import StartGpuServices, StopGpuServices, UnloadModules
from gpunode.errors import CommandError
from tests.fakes.connection import FakeConnection, FakeNode

PERSISTENCED, FM = "nvidia-persistenced.service", "nvidia-fabricmanager.service"
MODULES = ("nvidia_drm", "nvidia_modeset", "nvidia_uvm", "nvidia")


def node_with(unload_says: str = "", failing: tuple[str, ...] = ()) -> FakeNode:
    node = FakeNode()

    def unload(n, argv, stdin):
        return 0, unload_says, ""

    def restore(n, argv, stdin):  # sh -c BODY NAME MODULES UNIT...
        return 0, "".join(f"started: {u}\n" for u in argv[5:]), ""

    def systemctl(n, argv, stdin):
        return (1, "", f"Failed to {argv[1]} {argv[2]}: Unit is masked.\n") if argv[2] in failing else (0, "", "")

    node.handlers.update({"unload-nvidia-modules": unload, "restore-gpu-services": restore, "systemctl": systemctl,
                          "lsmod": lambda n, a, s: (0, "Module  Size  Used by\nnvidia_drm  122880  3\n", "")})
    return node


def ran(node: FakeNode) -> list[list[str]]:
    """The calls, without the privilege check (`id -u`, `sudo -n true`)."""
    return [c for c in node.calls if c not in (["id", "-u"], ["true"])]


def test_stop_then_unload_runs_in_order_and_owes_each_start():
    node = node_with()
    conn = FakeConnection(node)
    stop = StopGpuServices("stop", units=(FM, PERSISTENCED))
    assert stop.deferred() == (("start", FM), ("start", PERSISTENCED))
    assert stop.apply(conn) is None and UnloadModules("unload", modules=MODULES).apply(conn) is None
    calls = ran(node)
    assert calls[0] == ["systemctl", "stop", FM] and calls[1] == ["systemctl", "stop", PERSISTENCED]
    assert calls[2][3] == "gpunode-unload-nvidia-modules" and calls[2][4:] == list(MODULES)


def test_a_module_that_stays_unexpectedly_fails_and_starts_the_services_again():
    node = node_with(unload_says="stays nvidia_drm\nstays nvidia_modeset\nstays nvidia\n")
    with pytest.raises(CommandError) as err:
        UnloadModules("unload", modules=MODULES, restore_units=(PERSISTENCED, FM)).apply(FakeConnection(node))
    assert err.value.message.startswith("nvidia_drm, nvidia_modeset, nvidia would not unload")
    assert "nvidia_drm  122880  3" in err.value.message and f"started again: {PERSISTENCED}, {FM}" in err.value.message
    restore = next(c for c in node.calls if c[:2] == ["sh", "-c"] and c[3] == "gpunode-restore-gpu-services")
    assert restore[4:] == ["nvidia nvidia_uvm nvidia_modeset nvidia_drm", PERSISTENCED, FM]


def test_a_predicted_stay_is_a_note_not_a_failure():
    node = node_with(unload_says="stays nvidia_drm\n")
    note = UnloadModules("unload", modules=MODULES, may_stay=("nvidia_drm",)).apply(FakeConnection(node))
    assert note == "still loaded: nvidia_drm (the new driver loads at the reboot)"
    assert not [c for c in node.calls if c[:1] == ["sh"] and c[3] == "gpunode-restore-gpu-services"]


def test_a_service_that_will_not_stop_starts_the_ones_already_stopped():
    node = node_with(failing=(PERSISTENCED,))
    with pytest.raises(CommandError) as err:
        StopGpuServices("stop", units=(FM, PERSISTENCED)).apply(FakeConnection(node))
    assert f"could not stop {PERSISTENCED}: Failed to stop" in err.value.message
    assert f"started again: {FM}" in err.value.message


def test_start_reports_every_unit_that_would_not_start_and_settles_them_all():
    node = node_with(failing=(PERSISTENCED,))
    start = StartGpuServices("start", units=(PERSISTENCED, "nvidia-dcgm.service"))
    assert start.settles() == (("start", PERSISTENCED), ("start", "nvidia-dcgm.service"))
    with pytest.raises(CommandError) as err:
        start.apply(FakeConnection(node))
    assert err.value.message == f"could not start again: {PERSISTENCED}: Failed to start {PERSISTENCED}: Unit is masked."
    assert ["systemctl", "start", "nvidia-dcgm.service"] in node.calls  # the others were still started


def test_the_installer_runs_without_makeself_reading_the_verified_file_again(tmp_path):
    """makeself checks its CRC and MD5 before it unpacks (a whole read of a ~400 MB file); the bytes on the node
    are the verified ones (sha256 and `--check` where gpunode runs, sha256 again on arrival), so the node's
    install runs with makeself's check off. A real makeself archive shows it: no "Verifying archive integrity"."""
    import shutil
    import subprocess

    from gpunode.actions.driver import _INSTALL

    makeself = shutil.which("makeself")
    if makeself is None:
        pytest.skip("makeself is not installed")
    content = tmp_path / "content"
    content.mkdir()
    (content / "setup.sh").write_text("#!/bin/sh\necho unpacked-and-ran\nexit 3\n")
    (content / "setup.sh").chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    subprocess.run([makeself, "--nox11", str(content), str(work / "x.run"), "test", "./setup.sh"],
                   capture_output=True, check=True)
    checked = subprocess.run(["sh", str(work / "x.run"), "--nox11"], capture_output=True, text=True, cwd=tmp_path)
    assert "Verifying archive integrity" in checked.stdout + checked.stderr  # makeself checks by default
    result = subprocess.run(["sh", "-c", _INSTALL, "install", str(work), "x.run", "", str(tmp_path / "no-log"), "",
                             "", "--nox11"], capture_output=True, text=True)
    assert result.returncode == 3 and "unpacked-and-ran" in result.stderr  # it ran; its output came back
    assert "Verifying archive integrity" not in result.stderr
