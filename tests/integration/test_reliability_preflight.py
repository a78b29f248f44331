"""Preflight on simulated nodes: `install` knows before its first change that it can finish. An offline control
machine changes NOTHING on the node before the download error; `plan` makes the same checks read-only."""

from __future__ import annotations

import json

import pytest

from gpunode import preflight
from gpunode.cli import app
from gpunode.journal import JOURNAL_PATH
from tests.integration.test_driver_nodesim import STEPS, V, changes, cli, flat, install, mirror  # noqa: F401
from tests.nodesim.driver_run import build_fake_driver_run

pytestmark = pytest.mark.integration
REAL_HEAD = preflight.head  # tests/conftest.py replaces it for every test; these tests use the real one


def test_offline_install_changes_nothing_before_the_download_error_and_a_rerun_converges(
        sim_node, mirror, tmp_path, monkeypatch):  # noqa: F811
    node = sim_node("ubuntu-22.04-t4", nouveau_loaded=True)  # nouveau, prerequisites and driver all have work
    boot = node.boot_id
    monkeypatch.setenv("GPUNODE_DRIVER_MIRROR", "http://nvidia-mirror.invalid")  # never resolves (RFC 2606)
    result = install(node, tmp_path, "--reboot", "--reboot-timeout", "60")
    assert result.exit_code == 1, result.output
    shown = flat(result.output)
    assert "cannot resolve nvidia-mirror.invalid" in shown and "found before any change: nothing was changed" in shown
    assert "--driver-run FILE" in shown and "GPUNODE_DRIVER_MIRROR" in shown
    # zero node changes: no blacklist file, no initramfs rebuild, no packages, no reboot, not even a journal
    assert changes(node) == []
    assert not node.exists("etc/modprobe.d/blacklist-nouveau.conf")
    assert node.read(JOURNAL_PATH) is None
    assert node.reboots == 0 and node.boot_id == boot and node.is_loaded("nouveau")

    monkeypatch.setenv("GPUNODE_DRIVER_MIRROR", mirror.url)  # the fault cleared: the mirror is reachable
    mirror.publish(V)
    again = install(node, tmp_path, "--reboot", "--reboot-timeout", "60")
    assert again.exit_code == 0, again.output
    assert node.driver() is not None and node.reboots == 1
    node.clear_calls()
    last = install(node, tmp_path, "--reboot")
    assert last.exit_code == 0 and changes(node) == []


def test_a_blocker_found_before_any_change_stops_the_run_before_step_one(sim_node, mirror, tmp_path):  # noqa: F811
    mirror.publish(V)
    node = sim_node("ubuntu-22.04-t4", nouveau_loaded=True)
    node.set_kernel("5.15.0-92-generic", headers=False)  # booted a kernel whose headers the repositories lack
    node.reboot()
    node.set_module_loaded("nouveau", True)
    node.clear_calls()
    result = install(node, tmp_path, "--reboot")
    assert result.exit_code == 1, result.output
    shown = flat(result.output)
    assert "linux-headers-5.15.0-92-generic (headers for the running kernel) is not available" in shown
    assert "found before any change: nothing was changed" in shown
    # the nouveau step (which comes first and has work to do) did not run: no blacklist, no reboot
    assert changes(node) == [] and not node.exists("etc/modprobe.d/blacklist-nouveau.conf")
    assert node.reboots == 1  # the test's own reboot above, none by gpunode
    assert mirror.paths == []  # the blocker is found before the download


def test_plan_with_a_wrong_sha256_exits_1_with_the_mismatch(sim_node, tmp_path, nodesim_available):
    run = build_fake_driver_run(V, tmp_path / f"NVIDIA-Linux-x86_64-{V}.run")
    node = sim_node("ubuntu-22.04-t4", nouveau_loaded=False)
    wrong = "0" * 64
    result = cli.invoke(app, ["plan", *node.cli_args(), "--driver-run", str(run), "--sha256", wrong, *STEPS])
    assert result.exit_code == 1, result.output
    shown = flat(result.output)
    assert f"does not match --sha256 {wrong}" in shown and "install would stop before changing anything" in shown
    right = cli.invoke(app, ["plan", *node.cli_args(), "--driver-run", str(run), *STEPS])
    assert right.exit_code == 0, right.output


def test_plan_on_an_offline_control_machine_exits_1_naming_the_offline_fixes(sim_node, tmp_path, monkeypatch,
                                                                             nodesim_available):
    monkeypatch.setattr(preflight, "head", REAL_HEAD)
    monkeypatch.setenv("GPUNODE_DRIVER_MIRROR", "http://nvidia-mirror.invalid")
    node = sim_node("ubuntu-22.04-t4", nouveau_loaded=False)
    result = cli.invoke(app, ["plan", *node.cli_args(), "--driver", V, "--cache-dir", str(tmp_path / "c"), *STEPS,
                              "--json"])
    assert result.exit_code == 1, result.output

    driver = next(s for s in json.loads(result.stdout)["steps"] if s["step"] == "driver")
    assert driver["result"] == "failed" and "cannot resolve nvidia-mirror.invalid" in driver["error"]
    assert "--driver-run FILE" in driver["fix"] and "GPUNODE_DRIVER_MIRROR" in driver["fix"]
    assert not (tmp_path / "c").exists() or not any((tmp_path / "c").rglob("*.run"))  # nothing was fetched


def test_plan_asks_the_server_with_a_head_request_and_downloads_nothing(sim_node, mirror, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setattr(preflight, "head", REAL_HEAD)
    node = sim_node("ubuntu-22.04-t4", nouveau_loaded=False)
    args = ["plan", *node.cli_args(), "--driver", V, "--cache-dir", str(tmp_path / "c"), *STEPS]
    missing = cli.invoke(app, args)
    assert missing.exit_code == 1 and "not found (HTTP 404)" in flat(missing.output)
    mirror.publish(V)
    found = cli.invoke(app, args)
    assert found.exit_code == 0, found.output
    assert not any((tmp_path / "c").rglob("*.run"))
