"""Driver upgrades while something holds the GPU, end to end on node-simulator nodes (HGX H100, 4 NVSwitch).

The node starts with driver 535 from the .run installer, fabric manager 535 held and running and
nvidia-persistenced running: both keep /dev/nvidia* open (their /proc/PID/fd entries in the simulator), so the
nvidia module cannot unload while they run. `install --driver 570... --stop-gpu-services` must converge in ONE
run; without the flag the plan is blocked before any change; a user's process holding /dev/nvidia0 blocks even
with it; a failing install starts the stopped services again.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpunode.actions import fabric as fabric_actions
from gpunode.cli import app
from gpunode.journal import JOURNAL_PATH
from tests.integration.test_driver_nodesim import mirror  # noqa: F401 - pytest fixture

pytestmark = pytest.mark.integration

OLD, NEW = "535.274.02", "570.195.03"  # both in the simulated CUDA repository, fabric manager included
STEPS = ["--only", "driver", "--only", "fabricmanager", "--only", "nodesettings"]
cli = CliRunner()


@pytest.fixture(autouse=True)
def _fast_fabric_polls(monkeypatch):
    monkeypatch.setattr(fabric_actions, "POLL_SECONDS", 0.2)


def run(node, tmp_path: Path, command: str, version: str, *extra: str):
    return cli.invoke(app, [command, *node.cli_args(), "--driver", version, "--cache-dir", str(tmp_path / "cache"),
                            *STEPS, "--json", *extra])


def steps_of(result) -> dict:
    return {s["step"]: s for s in json.loads(result.stdout)["steps"]}


def changes(node) -> list[list[str]]:
    """Calls that change the node (the probe's queries are left out)."""
    return [c for c in node.calls()
            if (c[0] in ("apt-get", "dnf") and any(w in c for w in ("install", "update", "remove")))
            or (c[0] in ("apt-mark", "nvidia-installer", "rmmod", "reboot") and "--version" not in c)
            or (c[0] == "modprobe" and "-n" not in c and "--version" not in c)
            or (c[0] == "systemctl" and c[1:2] and c[1] in ("start", "stop", "restart", "enable", "disable"))]


def hgx_with_535(sim_node, mirror, tmp_path: Path):  # noqa: F811
    """An HGX H100 set up by gpunode at 535: fabric manager held and running, persistenced running."""
    mirror.publish(OLD)
    mirror.publish(NEW)
    node = sim_node("ubuntu-22.04-h100x8", engines=("docker",), preinstalled_driver=OLD)
    result = run(node, tmp_path, "install", OLD)
    assert result.exit_code == 0, result.output
    assert node.unit("nvidia-fabricmanager")["active"] == "active"
    assert node.unit("nvidia-persistenced")["active"] == "active"
    node.clear_calls()
    return node


def test_upgrade_535_to_570_with_persistenced_and_fabric_manager_converges_in_one_run(sim_node, mirror, tmp_path):  # noqa: F811
    node = hgx_with_535(sim_node, mirror, tmp_path)

    planned = run(node, tmp_path, "plan", NEW, "--stop-gpu-services")
    assert planned.exit_code == 0, planned.output
    driver = steps_of(planned)["driver"]
    kinds = [(a["kind"], a["summary"].split(" ")[0]) for a in driver["actions"]]
    assert kinds == [("service", "stop"), ("modules", "unload"), ("download", "download"),
                     ("driver-install", "install"), ("command", "load"), ("service", "start")], kinds
    commands = [c for a in driver["actions"] for c in a["commands"]]
    assert commands[:2] == ["systemctl stop nvidia-fabricmanager.service", "systemctl stop nvidia-persistenced.service"]
    assert commands[-2:] == ["modprobe nvidia", "systemctl start nvidia-persistenced.service"]
    assert driver["reboot_required"] is False and json.loads(planned.stdout)["summary"]["reboot_required"] is False
    assert any("fabricmanager step" in n for n in driver["notes"])
    assert changes(node) == []

    result = run(node, tmp_path, "install", NEW, "--stop-gpu-services")
    assert result.exit_code == 0, result.output
    steps = steps_of(result)
    assert steps["driver"]["result"] == "changed" and steps["fabricmanager"]["result"] == "changed"
    code, out, _ = node.ssh("nvidia-smi --query-gpu=driver_version --format=csv,noheader")
    assert code == 0 and set(out.split()) == {NEW}
    assert node.installed_packages()["nvidia-fabricmanager-570"] == f"{NEW}-1"
    assert "nvidia-fabricmanager-535" not in node.installed_packages()
    assert node.unit("nvidia-fabricmanager")["active"] == "active"
    assert node.unit("nvidia-persistenced")["active"] == "active"
    code, out, _ = node.ssh("nvidia-smi -q")
    assert out.count("State                         : Completed") == 8
    # the sequence as it ran on the node
    ran = [c for c in changes(node) if c[0] in ("systemctl", "nvidia-installer", "modprobe")]
    first = [c for c in ran if c[0] != "modprobe"][:3]
    assert first[:2] == [["systemctl", "stop", "nvidia-fabricmanager.service"],
                         ["systemctl", "stop", "nvidia-persistenced.service"]] and first[2][0] == "nvidia-installer"
    pending = json.loads(node.read(JOURNAL_PATH)).get("pending", [])
    assert pending == [], pending  # every start owed by the stop was carried out

    node.clear_calls()
    again = run(node, tmp_path, "install", NEW, "--stop-gpu-services")
    assert again.exit_code == 0, again.output
    assert {s["result"] for s in steps_of(again).values()} == {"ok"} and changes(node) == []


def test_without_the_flag_it_is_blocked_with_the_list_and_changes_nothing(sim_node, mirror, tmp_path):  # noqa: F811
    node = hgx_with_535(sim_node, mirror, tmp_path)
    result = run(node, tmp_path, "install", NEW)
    assert result.exit_code == 1, result.output
    driver = steps_of(result)["driver"]
    assert driver["result"] == "blocked"
    assert "nvidia-fabricmanager.service (fabric manager)" in driver["reason"]
    assert "nvidia-persistenced.service (persistence daemon)" in driver["reason"]
    assert driver["fix"].startswith(f"gpunode install --host {shlex.quote(node.cli_args()[1])}")
    assert f"--driver {NEW} --stop-gpu-services" in driver["fix"]
    assert changes(node) == [] and node.driver()["version"] == OLD
    assert "pending" not in json.loads(node.read(JOURNAL_PATH)) or not json.loads(node.read(JOURNAL_PATH))["pending"]


def test_a_users_process_holding_the_gpu_blocks_even_with_the_flag(sim_node, mirror, tmp_path):  # noqa: F811
    node = hgx_with_535(sim_node, mirror, tmp_path)
    pid = node.hold_gpu("python3")
    result = run(node, tmp_path, "install", NEW, "--stop-gpu-services")
    assert result.exit_code == 1, result.output
    driver = steps_of(result)["driver"]
    assert driver["result"] == "blocked"
    assert f"process PID {pid} python3" in driver["reason"] and "/dev/nvidia0" in driver["reason"]
    assert f"PID {pid} (python3) yourself" in driver["fix"]
    assert changes(node) == [] and node.unit("nvidia-persistenced")["active"] == "active"
    assert node.driver()["version"] == OLD

    node.release_gpu(pid)  # the job ended: the same command goes through
    result = run(node, tmp_path, "install", NEW, "--stop-gpu-services")
    assert result.exit_code == 0, result.output
    assert node.driver()["version"] == NEW and node.unit("nvidia-persistenced")["active"] == "active"


def test_a_failing_install_starts_the_stopped_services_again(sim_node, mirror, tmp_path):  # noqa: F811
    node = hgx_with_535(sim_node, mirror, tmp_path)
    node.remove_kernel_headers()  # the installer fails: no kernel source tree to build the module against
    result = run(node, tmp_path, "install", NEW, "--stop-gpu-services")
    assert result.exit_code == 1, result.output
    driver = steps_of(result)["driver"]
    assert driver["result"] == "failed" and "started again: nvidia-persistenced.service" in driver["error"]
    # right away: the old driver loaded again, both services running again
    assert node.is_loaded("nvidia") and node.driver()["version"] == OLD
    assert node.unit("nvidia-persistenced")["active"] == "active"
    assert node.unit("nvidia-fabricmanager")["active"] == "active"
    owed = {p["target"] for p in json.loads(node.read(JOURNAL_PATH))["pending"] if p["effect"] == "start"}
    assert owed == {"nvidia-fabricmanager.service", "nvidia-persistenced.service"}  # kept until a run starts them

    node.add_kernel_headers()
    result = run(node, tmp_path, "install", NEW, "--stop-gpu-services")
    assert result.exit_code == 0, result.output
    assert node.driver()["version"] == NEW
    assert node.unit("nvidia-persistenced")["active"] == "active"
    assert node.unit("nvidia-fabricmanager")["active"] == "active"
    assert json.loads(node.read(JOURNAL_PATH))["pending"] == []


def test_nvidia_drm_held_by_drm_clients_installs_beside_it_and_the_predicted_reboot_finishes(sim_node, mirror,  # noqa: F811
                                                                                            tmp_path):
    node = hgx_with_535(sim_node, mirror, tmp_path)
    node.set_drm_clients(1)  # the framebuffer console: gpunode stops none of those
    planned = run(node, tmp_path, "plan", NEW, "--stop-gpu-services")
    assert planned.exit_code == 0, planned.output
    driver = steps_of(planned)["driver"]
    assert driver["reboot_required"] is True and json.loads(planned.stdout)["summary"]["reboot_required"] is True
    assert [a["kind"] for a in driver["actions"]] == ["service", "modules", "download", "driver-install", "reboot"]
    assert "--allow-installation-with-running-driver" in driver["actions"][3]["flags"]

    boot = node.boot_id
    result = run(node, tmp_path, "install", NEW, "--stop-gpu-services", "--reboot", "--reboot-timeout", "60")
    assert result.exit_code == 0, result.output
    assert node.reboots == 1 and node.boot_id != boot
    code, out, _ = node.ssh("nvidia-smi --query-gpu=driver_version --format=csv,noheader")
    assert code == 0 and set(out.split()) == {NEW}
    assert node.installed_packages()["nvidia-fabricmanager-570"] == f"{NEW}-1"
    assert node.unit("nvidia-fabricmanager")["active"] == "active"
    assert node.unit("nvidia-persistenced")["active"] == "active"  # enabled: started at boot
    assert [p for p in json.loads(node.read(JOURNAL_PATH))["pending"] if p["effect"] == "start"] == []
    node.clear_calls()
    again = run(node, tmp_path, "install", NEW, "--stop-gpu-services")
    assert again.exit_code == 0, again.output
    assert {s["result"] for s in steps_of(again).values()} == {"ok"} and changes(node) == []


CHANNEL_LINE = "server_input_channel_open: ctype session"  # sshd logs each channel a client opens (DEBUG1)
# measured: 41 with a channel per command, 34 after journal batching, +5 for the node lock; 3 since every command
# rides on one command channel (gpunode/connection/ssh.py, _SERVE); 2 since the node lock names the connection's
# sshd process instead of keeping a command running on a channel of its own. The 2: the command channel and the
# driver installer's upload (a stream of its own).
UPGRADE_CHANNELS = 2


def test_a_driver_upgrade_opens_few_ssh_channels(sim_node, mirror, tmp_path):  # noqa: F811
    mirror.publish(OLD)
    mirror.publish(NEW)
    node = sim_node("ubuntu-22.04-h100x8", engines=("docker",), preinstalled_driver=OLD, sshd_log_level="DEBUG1")
    assert run(node, tmp_path, "install", OLD).exit_code == 0
    log = Path(node.sshd_log)
    before = log.read_text(errors="replace").count(CHANNEL_LINE)
    result = run(node, tmp_path, "install", NEW, "--stop-gpu-services")
    assert result.exit_code == 0, result.output
    assert steps_of(result)["driver"]["result"] == "changed"
    opened = log.read_text(errors="replace").count(CHANNEL_LINE) - before
    print(f"driver upgrade: {opened} SSH channels")
    assert opened <= UPGRADE_CHANNELS, opened
    before = log.read_text(errors="replace").count(CHANNEL_LINE)
    again = run(node, tmp_path, "install", NEW, "--stop-gpu-services")
    assert again.exit_code == 0 and {s["result"] for s in steps_of(again).values()} == {"ok"}, again.output
    # converged: the command channel, probe, lock and all (4 when each command had a channel of its own, 2 while
    # the node lock's keeper had one)
    assert log.read_text(errors="replace").count(CHANNEL_LINE) - before == 1
