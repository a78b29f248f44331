"""`gpunode install --driver` end to end against node-simulator nodes (real sshd on 127.0.0.1 serving a chroot).

The driver is "downloaded" from a local HTTP server laid out like NVIDIA's (GPUNODE_DRIVER_MIRROR), as a real
makeself archive whose payload is the simulator's nvidia-installer. Nothing here touches this machine.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpunode import runner as gpunode_runner
from gpunode.actions import packages as package_actions
from gpunode.cli import app
from tests.nodesim.driver_run import build_fake_driver_run

pytestmark = pytest.mark.integration

V = "535.129.03"
STEPS = ["--only", "nouveau", "--only", "prerequisites", "--only", "driver"]
cli = CliRunner()


class Mirror:
    """NVIDIA's download layout on 127.0.0.1, with a log of what was fetched."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.paths: list[str] = []
        mirror = self

        class Handler(SimpleHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                mirror.paths.append(self.path)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(root)))
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def publish(self, version: str, corrupt: bool = False) -> Path:
        path = self.root / "tesla" / version / f"NVIDIA-Linux-x86_64-{version}.run"
        return build_fake_driver_run(version, path, corrupt=corrupt)

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def mirror(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nodesim_available: bool) -> Iterator[Mirror]:
    m = Mirror(tmp_path / "www")
    monkeypatch.setenv("GPUNODE_DRIVER_MIRROR", m.url)
    monkeypatch.setattr(gpunode_runner, "REBOOT_POLL_SECONDS", 0.2)
    monkeypatch.setattr(package_actions, "LOCK_POLL_SECONDS", 1.0)
    yield m
    m.stop()


def install(node, tmp_path: Path, *extra: str):
    args = ["install", *node.cli_args(), "--driver", V, "--cache-dir", str(tmp_path / "cache"), *STEPS, *extra]
    return cli.invoke(app, args)


def flat(text: str) -> str:
    return " ".join(text.split())


def changes(node) -> list[list[str]]:
    """Calls on the node that change something (the probe's read-only queries are left out)."""
    return [c for c in node.calls() if c[0] in ("reboot", "update-initramfs", "dracut")
            or (c[0] in ("apt-get", "dnf") and ("install" in c or "update" in c))
            or (c[0] == "dkms" and c[1:2] != ["status"])
            or (c[0] in ("nvidia-installer", "modprobe") and "--version" not in c)]


def test_fresh_ubuntu_t4_reboots_for_nouveau_installs_and_a_rerun_changes_nothing(sim_node, mirror, tmp_path):
    mirror.publish(V)
    node = sim_node("ubuntu-22.04-t4", nouveau_loaded=True)
    boot = node.boot_id

    planned = cli.invoke(app, ["plan", *node.cli_args(), "--driver", V, "--cache-dir", str(tmp_path / "cache"),
                               *STEPS])
    shown = flat(planned.stdout)
    assert planned.exit_code == 0, planned.output
    assert f"{mirror.url}/tesla/{V}/NVIDIA-Linux-x86_64-{V}.run" in shown
    assert "--silent --dkms --tmpdir=/var/tmp" in shown and "-m=kernel" in shown
    assert "kernel module: proprietary (Tesla T4 (Turing)" in shown and "a reboot is required" in shown
    assert mirror.paths == [] and node.driver() is None  # the plan fetched and changed nothing

    result = install(node, tmp_path, "--reboot", "--reboot-timeout", "60")
    assert result.exit_code == 0, result.output
    assert node.reboots == 1 and node.boot_id != boot
    driver = node.driver()
    assert driver is not None and (driver["version"], driver["flavor"], driver["method"], driver["dkms"]) == (
        V, "proprietary", "run", "1")
    assert node.is_loaded("nvidia") and not node.is_loaded("nouveau")
    code, out, _ = node.ssh("nvidia-smi --query-gpu=driver_version --format=csv,noheader")
    assert code == 0 and out.strip() == V
    assert not [n for n in node.listdir("var/tmp") if n.startswith("gpunode.")]  # the upload is cleaned up
    assert node.exists("var/log/nvidia-installer.log")
    installer_call = node.calls("nvidia-installer")[0]
    assert "-m=kernel" in installer_call and "--dkms" in installer_call and "--tmpdir=/var/tmp" in installer_call

    node.clear_calls()
    fetched = len(mirror.paths)
    again = install(node, tmp_path, "--reboot")
    assert again.exit_code == 0, again.output
    assert "summary: 3 already ok; the node is ready" in flat(again.stdout) and "changed" not in again.stdout
    assert changes(node) == [] and node.reboots == 1 and len(mirror.paths) == fetched


def test_without_reboot_it_stops_and_says_to_run_again(sim_node, mirror, tmp_path):
    mirror.publish(V)
    node = sim_node("ubuntu-22.04-t4", nouveau_loaded=True)
    result = install(node, tmp_path)
    assert result.exit_code == 3, result.output
    assert "reboot required, then run the same command again" in flat(result.output)
    assert node.reboots == 0 and node.driver() is None


def test_corrupt_run_is_refused_and_nothing_is_installed(sim_node, mirror, tmp_path):
    mirror.publish(V, corrupt=True)
    node = sim_node("ubuntu-22.04-t4", nouveau_loaded=False)
    result = install(node, tmp_path)
    assert result.exit_code == 1, result.output
    assert "the archive is corrupt" in flat(result.output)
    assert node.driver() is None and node.calls("nvidia-installer") == []
    assert not [n for n in node.listdir("var/tmp") if n.startswith("gpunode.")]
    assert not (tmp_path / "cache" / V / "x86_64" / f"NVIDIA-Linux-x86_64-{V}.run").exists()


def test_secure_boot_without_keys_is_blocked(sim_node, mirror, tmp_path):
    mirror.publish(V)
    node = sim_node("ubuntu-22.04-t4", nouveau_loaded=False, secure_boot=True)
    result = install(node, tmp_path)
    out = flat(result.output)
    assert result.exit_code == 1 and "Secure Boot is enabled and no module signing key was given" in out
    assert "--module-signing-key" in out and "mokutil --import" in out
    assert node.driver() is None and node.calls("nvidia-installer") == [] and mirror.paths == []


def test_secure_boot_with_an_enrolled_key_signs_the_module(sim_node, mirror, tmp_path):
    mirror.publish(V)
    node = sim_node("ubuntu-22.04-t4", nouveau_loaded=False, secure_boot=True)
    node.write("root/mok.priv", "private key\n", mode=0o600)
    node.write("root/mok.der", "certificate\n")
    node.enroll_mok("/root/mok.der")
    result = install(node, tmp_path, "--module-signing-key", "/root/mok.priv", "--module-signing-cert",
                     "/root/mok.der")
    assert result.exit_code == 0, result.output
    assert node.driver()["signkey"] != "none" and node.is_loaded("nvidia")
    assert "--module-signing-secret-key=/root/mok.priv" in node.calls("nvidia-installer")[0]


@pytest.mark.parametrize("profile, headers", [("ubuntu-22.04-t4", "linux-headers-5.15.0-92-generic"),
                                              ("rocky-9-t4", "kernel-devel-5.14.0-362.13.1.el9_3.x86_64")])
def test_headers_missing_for_the_running_kernel_is_blocked(sim_node, mirror, tmp_path, profile, headers):
    mirror.publish(V)
    node = sim_node(profile, nouveau_loaded=False)
    kernel = headers.split("-", 2)[2]
    node.set_kernel(kernel, headers=False)  # an update booted a kernel whose headers the repositories lack
    node.reboot()
    node.set_module_loaded("nouveau", False)
    assert node.kernel == kernel
    result = install(node, tmp_path)
    out = flat(result.output)
    assert result.exit_code == 1, result.output
    assert f"{headers} (headers for the running kernel) is not available" in out and "reboot into it" in out
    assert node.driver() is None and node.calls("nvidia-installer") == []


def test_rocky_9_the_same_with_dnf_and_dracut(sim_node, mirror, tmp_path):
    mirror.publish(V)
    node = sim_node("rocky-9-t4", nouveau_loaded=True)
    result = install(node, tmp_path, "--reboot", "--reboot-timeout", "60")
    assert result.exit_code == 0, result.output
    assert node.calls("dracut") and not node.calls("update-initramfs")
    dnf = [c for c in node.calls("dnf") if "install" in c]
    assert dnf[0][-1] == "epel-release" and "dkms" in dnf[1]
    assert node.driver()["version"] == V and node.reboots == 1
    code, out, _ = node.ssh("nvidia-smi --query-gpu=driver_version --format=csv,noheader")
    assert code == 0 and out.strip() == V
    node.clear_calls()
    again = install(node, tmp_path, "--reboot")
    assert again.exit_code == 0 and "changed" not in again.stdout, again.output
    assert changes(node) == [] and node.reboots == 1


def test_package_lock_held_by_unattended_upgrades_is_waited_for(sim_node, mirror, tmp_path):
    mirror.publish(V)
    node = sim_node("ubuntu-22.04-t4", nouveau_loaded=False)
    node.set_apt_lock(2)  # the next two apt-get runs find the lock held
    result = install(node, tmp_path)
    assert result.exit_code == 0, result.output
    assert "waited for the package lock (process 1717 (unattended-upgr)" in flat(result.output)
    assert node.driver()["version"] == V


def test_package_lock_timeout_names_the_holder(sim_node, mirror, tmp_path):
    mirror.publish(V)
    node = sim_node("ubuntu-22.04-t4", nouveau_loaded=False)
    node.set_apt_lock(1000)
    result = install(node, tmp_path, "--lock-timeout", "2")
    out = flat(result.output)
    assert result.exit_code == 1
    assert "the apt lock is still held after 2s: process 1717 (unattended-upgr)" in out
    assert node.driver() is None


def test_another_run_version_is_upgraded(sim_node, mirror, tmp_path):
    mirror.publish(V)
    node = sim_node("ubuntu-22.04-t4", nouveau_loaded=False)
    node.install_driver("535.104.05", "proprietary")
    result = install(node, tmp_path)
    assert result.exit_code == 0, result.output
    assert "driver 535.104.05 is installed; 535.129.03 was requested: upgrading" in flat(result.output)
    assert node.driver()["version"] == V
    code, out, _ = node.ssh("nvidia-smi --query-gpu=driver_version --format=csv,noheader")
    assert code == 0 and out.strip() == V


def test_a_distro_packaged_driver_is_never_mixed(sim_node, mirror, tmp_path):
    mirror.publish(V)
    node = sim_node("ubuntu-22.04-t4", nouveau_loaded=False)
    node.install_package("nvidia-driver-535-server")
    result = install(node, tmp_path)
    out = flat(result.output)
    # the packages as dpkg-query lists them: in name order (the simulator's order before, 2026-11-25)
    assert result.exit_code == 1 and "from distribution packages (nvidia-dkms-535-server 535.230.02-0ubuntu0.22.04.1, " \
        "nvidia-driver-535-server 535.230.02-0ubuntu0.22.04.1" in out
    assert "would mix two drivers" in out
    assert "sudo apt-get purge -y --allow-change-held-packages nvidia-dkms-535-server nvidia-driver-535-server" in out
    assert node.calls("nvidia-installer") == []


def test_blackwell_gets_the_open_module_explicitly(sim_node, mirror, tmp_path):
    mirror.publish("570.124.06")
    node = sim_node("ubuntu-24.04-b200x8", nouveau_loaded=False)
    args = ["install", *node.cli_args(), "--driver", "570.124.06", "--cache-dir", str(tmp_path / "cache"), *STEPS]
    result = cli.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "-m=kernel-open" in node.calls("nvidia-installer")[0]
    assert node.driver()["flavor"] == "open" and node.is_loaded("nvidia")
    refused = cli.invoke(app, [*args, "--kernel-module", "proprietary"])
    assert refused.exit_code == 1 and "these GPUs need the open module" in flat(refused.output)
