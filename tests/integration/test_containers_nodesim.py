"""Toolkit, runtime and fabric manager end to end against node-simulator nodes (real sshd on 127.0.0.1 serving a
chroot whose apt/dnf/dpkg/rpm/systemctl/nvidia-ctk are simulator shims). Each node is installed, then installed
again: the second run must change nothing, and every key the user had in the engine's config must survive."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gpunode.actions import fabric as fabric_actions
from gpunode.cli import app
from gpunode.facts import containers as c
from tests.nodesim.fixtures import host_guard, nodesim_available, sim_node  # noqa: F401 - pytest fixtures
from tests.nodesim.node import changes_systemd

pytestmark = pytest.mark.integration

STEPS = ["--only", "toolkit", "--only", "runtime", "--only", "fabricmanager"]
cli = CliRunner()
USER_DAEMON_JSON = '{\n  "log-driver": "journald",\n  "registry-mirrors": ["https://mirror.gcr.io"],\n  "data-root": "/srv/docker"\n}\n'


@pytest.fixture(autouse=True)
def _fast_fabric_polls(monkeypatch):
    monkeypatch.setattr(fabric_actions, "POLL_SECONDS", 0.2)


def start(sim_node, profile: str, **overrides):  # noqa: F811
    return sim_node(profile, **overrides)


def install(node, *extra: str) -> dict:
    result = cli.invoke(app, ["install", *node.cli_args(), *STEPS, "--json", *extra])
    assert result.exit_code == 0, result.output
    return {s["step"]: s for s in json.loads(result.stdout)["steps"]}


def changes(node) -> list[list[str]]:
    """Calls that change the node (the probe's queries, `systemctl is-*`, `apt-cache`, `--version`, are not)."""
    return [call for call in node.calls()
            if (call[0] in ("apt-get", "dnf", "yum") and any(w in call for w in ("install", "update", "remove")))
            or call[0] in ("apt-mark", "curl", "gpg") or (call[0] == "dpkg" and "-i" in call)
            or (call[0] == "nvidia-ctk" and "configure" in call)
            or changes_systemd(call)]


def rerun_changes_nothing(node, *extra: str) -> None:
    node.clear_calls()
    again = install(node, *extra)
    assert {name: s["status"] for name, s in again.items()} == {name: "ok" for name in again}, again
    assert changes(node) == []


def test_ubuntu_22_04_docker_t4(sim_node):  # noqa: F811
    node = start(sim_node, "ubuntu-22.04-t4", engines=("docker",))
    node.write("etc/docker/daemon.json", USER_DAEMON_JSON)
    steps = install(node)
    assert [steps[s]["status"] for s in ("toolkit", "runtime", "fabricmanager")] == ["change", "change", "ok"]
    assert steps["fabricmanager"]["reason"].startswith("no NVSwitch on this node")
    packages = node.installed_packages()
    assert {p: packages.get(p) for p in ("nvidia-container-toolkit", "nvidia-container-toolkit-base",
                                         "libnvidia-container-tools", "libnvidia-container1")} == {
        p: "1.20.0-1" for p in ("nvidia-container-toolkit", "nvidia-container-toolkit-base",
                                "libnvidia-container-tools", "libnvidia-container1")}
    assert "signed-by=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg" in node.read(
        "etc/apt/sources.list.d/nvidia-container-toolkit.list")
    daemon = json.loads(node.read("etc/docker/daemon.json"))
    assert daemon["runtimes"]["nvidia"] == {"args": [], "path": "nvidia-container-runtime"}
    assert {k: daemon[k] for k in ("log-driver", "registry-mirrors", "data-root")} == json.loads(USER_DAEMON_JSON)
    assert [c for c in node.calls("systemctl") if "restart" in c] == [["systemctl", "restart", "docker.service"]]
    assert node.unit("docker")["active"] == "active"
    backups = [n for n in node.listdir("etc/docker") if n.startswith("daemon.json.gpunode-bak.")]
    assert len(backups) == 1 and node.read(f"etc/docker/{backups[0]}") == USER_DAEMON_JSON
    rerun_changes_nothing(node)


def test_rocky_9_containerd_config_v2_for_kubernetes(sim_node):  # noqa: F811
    node = start(sim_node, "rocky-9-t4", engines=("containerd",))
    before = c.parse_toml(node.read("etc/containerd/config.toml"), "toml")
    assert before["version"] == 2
    steps = install(node, "--k8s")
    assert steps["runtime"]["status"] == "change"
    assert "--set-as-default" in steps["runtime"]["actions"][0]["commands"][-1]  # after the backup-files command
    assert node.read("etc/yum.repos.d/nvidia-container-toolkit.repo")
    after = c.parse_toml(node.read("etc/containerd/config.toml"), "toml")
    assert after["imports"] == ["/etc/containerd/conf.d/*.toml"]
    dropin = c.parse_toml(node.read("etc/containerd/conf.d/99-nvidia.toml"), "toml")
    cri = dropin["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]
    assert cri["default_runtime_name"] == "nvidia"
    assert cri["runtimes"]["nvidia"]["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime"
    for key, value in before.items():  # every key the user had is still in config.toml
        assert after[key] == value
    assert [c for c in node.calls("systemctl") if "restart" in c] == [["systemctl", "restart", "containerd.service"]]
    rerun_changes_nothing(node, "--k8s")


def test_ubuntu_24_04_containerd_2_config_v3(sim_node):  # noqa: F811
    node = start(sim_node, "ubuntu-24.04-t4", engines=("containerd",))
    before = c.parse_toml(node.read("etc/containerd/config.toml"), "toml")
    assert before["version"] == 3
    steps = install(node)
    assert steps["runtime"]["reason"] == "containerd: nvidia runtime missing"
    files = {c.CONTAINERD_CONFIG: node.read("etc/containerd/config.toml"),
             c.CONTAINERD_DROPIN: node.read("etc/containerd/conf.d/99-nvidia.toml")}
    state = c.containerd_state(c.effective_containerd(files, major=2).config)
    assert state.has_nvidia and not state.nvidia_is_default
    assert "io.containerd.cri.v1.runtime" in c.parse_toml(files[c.CONTAINERD_DROPIN], "toml")["plugins"]
    assert c.parse_toml(files[c.CONTAINERD_CONFIG], "toml")["plugins"] == before["plugins"]
    rerun_changes_nothing(node)


def test_hgx_h100_nvswitch_gets_fabric_manager_pinned_and_running(sim_node):  # noqa: F811
    driver = "535.274.02"  # a .run driver: its fabric manager comes from NVIDIA's CUDA repository
    node = start(sim_node, "ubuntu-22.04-h100x8", engines=("docker",), preinstalled_driver=driver)
    steps = install(node)
    fm = steps["fabricmanager"]
    assert fm["status"] == "change" and fm["reason"] == "4 NVSwitch: nvidia-fabricmanager-535 is not installed"
    commands = [cmd for action in fm["actions"] for cmd in action["commands"]]
    # The simulator logs in as root, so the plan shows the commands without sudo, as they really run.
    assert "apt-get install -y --no-install-recommends --allow-downgrades nvidia-fabricmanager-535=535.274.02-1" \
        in commands and "apt-mark hold nvidia-fabricmanager-535" in commands
    assert node.installed_packages()["nvidia-fabricmanager-535"] == "535.274.02-1"
    assert "nvidia-fabricmanager-535" in node.held_packages()
    assert node.unit("nvidia-fabricmanager") == {"active": "active", "enabled": "enabled"}
    assert "Successfully configured all the available NVSwitches" in node.read("var/log/fabricmanager.log")
    assert node.installed_packages()["cuda-keyring"] == "1.1-1"  # NVIDIA's CUDA repository was added for it
    code, out, _ = node.ssh("nvidia-smi -q")
    assert code == 0 and out.count("State                         : Completed") == 8
    rerun_changes_nothing(node)


def test_a_t4_node_skips_fabric_manager_and_installs_nothing_for_it(sim_node):  # noqa: F811
    node = start(sim_node, "rocky-9-t4", engines=("docker",), toolkit_version="1.20.0-1",
                 preinstalled_driver="535.274.02")
    steps = install(node, "--only", "fabricmanager")
    assert steps["fabricmanager"]["status"] == "ok"
    assert not [p for p in node.installed_packages() if "fabric" in p]


def test_invalid_daemon_json_is_blocked_and_left_untouched(sim_node):  # noqa: F811
    node = start(sim_node, "ubuntu-22.04-t4", engines=("docker",), toolkit_version="1.20.0-1")
    broken = '{\n"default-runtime": "nvidia",\n"runtimes": {},\n}\n'
    node.write("etc/docker/daemon.json", broken)
    result = cli.invoke(app, ["install", *node.cli_args(), "--only", "runtime"])
    assert result.exit_code == 1 and "not valid JSON" in " ".join(result.stdout.split())
    assert node.read("etc/docker/daemon.json") == broken
    assert not [c for c in node.calls("nvidia-ctk") if "configure" in c]
    assert not [c for c in node.calls("systemctl") if "restart" in c]


def test_rocky_9_hgx_h100_gets_the_rpm_fabric_manager_versionlocked(sim_node):  # noqa: F811
    node = start(sim_node, "rocky-9-h100x8", engines=("containerd",), preinstalled_driver="535.274.02")
    steps = install(node, "--only", "fabricmanager")
    commands = [cmd for action in steps["fabricmanager"]["actions"] for cmd in action["commands"]]
    assert "dnf install -y nvidia-fabric-manager-535.274.02-1" in commands
    assert "dnf versionlock add nvidia-fabric-manager-535.274.02-1" in commands
    assert node.installed_packages()["nvidia-fabric-manager"] == "535.274.02-1"
    assert "nvidia-fabric-manager" in node.held_packages()
    assert node.unit("nvidia-fabricmanager")["active"] == "active"
    rerun_changes_nothing(node, "--only", "fabricmanager")
