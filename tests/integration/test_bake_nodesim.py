"""`gpunode install --bake` (an image build without a GPU) and the boot-time install that reads its marker, end
to end on simulated nodes. The events of `--progress jsonl` are checked on the same runs: they come from the
runner's reporter, the same for this machine (--local) and a node over SSH."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpunode import runner as gpunode_runner
from gpunode.actions import packages as package_actions
from gpunode.cli import app
from tests.cli.test_events import check_stream
from tests.integration.test_driver_nodesim import Mirror

pytestmark = pytest.mark.integration

V = "535.129.03"
NEW = "5.15.0-92-generic"  # the kernel the image boots: installed by the image build, not running during it
OLD = "5.15.0-91-generic"  # the kernel the build VM runs
cli = CliRunner()


@pytest.fixture
def mirror(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nodesim_available: bool) -> Iterator[Mirror]:
    m = Mirror(tmp_path / "www")
    monkeypatch.setenv("GPUNODE_DRIVER_MIRROR", m.url)
    monkeypatch.setattr(gpunode_runner, "REBOOT_POLL_SECONDS", 0.2)
    monkeypatch.setattr(package_actions, "LOCK_POLL_SECONDS", 1.0)
    m.publish(V)
    yield m
    m.stop()


def run(node, tmp_path: Path, *args: str):
    return cli.invoke(app, ["install", *node.cli_args(), "--cache-dir", str(tmp_path / "cache"), "--driver", V,
                            "--progress", "jsonl", *args])


def events(output: str) -> list[dict]:
    return check_stream(output)


def baked_node(sim_node, tmp_path: Path):
    node = sim_node("ubuntu-22.04-nogpu")
    node.set_kernel(NEW)
    result = run(node, tmp_path, "--bake")
    return node, result


def test_bake_builds_for_the_newest_kernel_without_a_gpu_and_writes_the_marker(sim_node, mirror, tmp_path):
    node, result = baked_node(sim_node, tmp_path)
    seen = events(result.stdout)
    assert result.exit_code == 0, result.stdout + result.stderr
    installer = [c for c in node.calls("nvidia-installer") if "--version" not in c]
    assert len(installer) == 1 and f"--kernel-name={NEW}" in installer[0] and "--skip-module-load" in installer[0]
    assert ["update-initramfs", "-u", "-k", NEW] in node.calls("update-initramfs")
    assert node.initramfs_blacklist(NEW)  # the image's initramfs carries the nouveau blacklist
    assert not [c for c in node.calls("modprobe") if "nvidia" in " ".join(c) and "-r" not in c]
    assert not node.is_loaded("nvidia") and node.reboots == 0
    assert not [c for c in node.calls("nvidia-smi") if "-pm" in c]
    marker = json.loads(node.read("/var/lib/gpunode/baked.json"))
    assert marker["kernel"] == NEW and marker["driver"] == {"version": V, "flavour": "proprietary"}
    assert marker["modules"] and all(p.startswith("updates/dkms/nvidia") for p in marker["modules"])
    assert marker["toolkit"] and marker["schema"] == 1
    steps = [e["step"] for e in seen if e["event"] == "step_result"]
    assert steps == ["nouveau", "prerequisites", "driver", "compat", "toolkit", "runtime", "bake"]
    assert seen[-1]["event"] == "run_end" and seen[-1]["exit_code"] == 0 and seen[-1]["state"] == "ready"
    # a second bake changes nothing (the marker records the same build)
    again = run(node, tmp_path, "--bake")
    assert again.exit_code == 0
    assert {e["result"] for e in events(again.stdout) if e["event"] == "step_result"} == {"ok"}


def test_boot_with_a_gpu_uses_the_baked_module(sim_node, mirror, tmp_path):
    node, result = baked_node(sim_node, tmp_path)
    assert result.exit_code == 0, result.stdout + result.stderr
    node.attach_gpus("t4")
    node.reboot()  # the image boots NEW on a machine with a T4
    assert node.kernel == NEW
    node.clear_calls()
    boot = run(node, tmp_path, "--skip", "k8s")
    seen = events(boot.stdout)
    assert boot.exit_code == 0, boot.stdout + boot.stderr
    driver = next(e for e in seen if e["event"] == "step_planned" and e["step"] == "driver")
    assert driver["status"] == "ok" and driver["reason"].startswith(f"baked image: module built for {NEW} at bake time")
    assert not [c for c in node.calls("nvidia-installer") if "--version" not in c]  # no rebuild
    assert node.is_loaded("nvidia") and seen[-1]["state"] == "ready"


def test_a_marker_for_another_kernel_is_ignored_and_says_why(sim_node, mirror, tmp_path):
    node, result = baked_node(sim_node, tmp_path)
    assert result.exit_code == 0, result.stdout + result.stderr
    node.attach_gpus("t4")
    node.write("/var/lib/nodesim/next-kernel", OLD + "\n")  # the machine boots the build's old kernel instead
    node.reboot()
    assert node.kernel == OLD
    boot = cli.invoke(app, ["plan", *node.cli_args(), "--driver", V, "--only", "driver", "--json"])
    data = json.loads(boot.stdout)
    driver = data["steps"][0]
    assert not driver["reason"].startswith("baked image")
    assert any(f"built for kernel {NEW}, but {OLD} is running" in n for n in driver["notes"]), driver


ROCKY_NEW = "5.14.0-427.13.1.el9_4.x86_64"  # the rocky-9 image's new kernel (the build VM runs 5.14.0-362.8.1.el9_3)


def test_bake_on_rocky_9_rebuilds_the_new_kernels_initramfs_with_dracut_and_boots_the_baked_module(
        sim_node, mirror, tmp_path):
    node = sim_node("rocky-9-nogpu")
    running = node.kernel
    node.set_kernel(ROCKY_NEW, headers=False)  # the build's `dnf upgrade` brought the kernel, not kernel-devel
    node.offer_package("kernel-devel", ROCKY_NEW.rsplit(".", 1)[0], effects=f"headers:{ROCKY_NEW}")
    result = run(node, tmp_path, "--bake")
    seen = events(result.stdout)
    assert result.exit_code == 0, result.stdout + result.stderr
    assert node.calls("dracut") == [["dracut", "-f", "--kver", ROCKY_NEW]]  # not the running kernel's initramfs
    assert "blacklist nouveau" in node.initramfs_blacklist(ROCKY_NEW)
    assert "blacklist nouveau" not in (node.initramfs_blacklist(running) or [])
    installer = [c for c in node.calls("nvidia-installer") if "--version" not in c]
    assert len(installer) == 1 and f"--kernel-name={ROCKY_NEW}" in installer[0] and "--skip-module-load" in installer[0]
    assert [c for c in node.calls("dnf") if "install" in c and f"kernel-devel-{ROCKY_NEW}" in c]  # K's headers
    assert not node.is_loaded("nvidia") and node.reboots == 0
    marker = json.loads(node.read("/var/lib/gpunode/baked.json"))
    assert marker["kernel"] == ROCKY_NEW and marker["driver"]["version"] == V and marker["modules"]
    assert [e["step"] for e in seen if e["event"] == "step_result"] == [
        "nouveau", "prerequisites", "driver", "compat", "toolkit", "runtime", "bake"]
    node.clear_calls()
    again = run(node, tmp_path, "--bake")
    assert again.exit_code == 0 and node.calls("dracut") == []
    assert {e["result"] for e in events(again.stdout) if e["event"] == "step_result"} == {"ok"}

    node.attach_gpus("t4")
    node.reboot()
    assert node.kernel == ROCKY_NEW and node.is_loaded("nvidia") and not node.is_loaded("nouveau")
    node.clear_calls()
    boot = run(node, tmp_path, "--skip", "k8s")
    seen = events(boot.stdout)
    assert boot.exit_code == 0, boot.stdout + boot.stderr
    driver = next(e for e in seen if e["event"] == "step_planned" and e["step"] == "driver")
    assert driver["status"] == "ok" and driver["reason"].startswith(f"baked image: module built for {ROCKY_NEW}")
    assert not [c for c in node.calls("nvidia-installer") if "--version" not in c] and seen[-1]["state"] == "ready"
