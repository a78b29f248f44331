"""`gpunode uninstall` end to end on simulated nodes: install everything (driver 535.129.03 from the fake .run,
the container toolkit, docker's nvidia runtime, node settings), uninstall, and compare the node's file trees.

Snapshot: every regular file and symlink under /etc, /usr, /lib and /var/lib/dpkg of the node's root, as (path,
sha256 or link target, mode). Excluded, on purpose: directories themselves (an empty directory a tool created
is not compared: gpunode records files, not the directories a write or a package made); /etc/ld.so.cache
(the simulator's ldconfig); nothing else. Logs (/var/log), gpunode's journal (/var/lib/gpunode), the simulator's
bookkeeping (/var/lib/nodesim) and /var/tmp are outside the snapshot's roots.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import pytest
import tomllib
from typer.testing import CliRunner

from gpunode.cli import app
from tests.integration import test_driver_nodesim
from tests.integration.test_driver_nodesim import Mirror

mirror = test_driver_nodesim.mirror  # the fixture

pytestmark = pytest.mark.integration

V = "535.129.03"
ROOTS = ("etc", "usr", "lib", "var/lib/dpkg")
EXCLUDED = {"etc/ld.so.cache"}
cli = CliRunner()


def snapshot(node) -> dict[str, tuple[str, int]]:
    found: dict[str, tuple[str, int]] = {}
    root = Path(node.root)
    for top in ROOTS:
        base = root / top
        if base.is_symlink() or not base.exists():
            continue
        for directory, dirs, files in os.walk(base):
            for name in [*files, *(d for d in dirs if (Path(directory) / d).is_symlink())]:
                path = Path(directory) / name
                rel = str(path.relative_to(root))
                if rel in EXCLUDED:
                    continue
                info = path.lstat()
                value = ("-> " + os.readlink(path) if stat.S_ISLNK(info.st_mode)
                         else hashlib.sha256(path.read_bytes()).hexdigest())
                found[rel] = (value, stat.S_IMODE(info.st_mode))
    return found


def differences(before: dict, after: dict) -> list[str]:
    return sorted([f"+ {p}" for p in after.keys() - before.keys()] + [f"- {p}" for p in before.keys() - after.keys()]
                  + [f"~ {p}" for p in before.keys() & after.keys() if before[p] != after[p]])


def install(node, tmp_path: Path, *extra: str):
    return cli.invoke(app, ["install", *node.cli_args(), "--driver", V, "--cache-dir", str(tmp_path / "cache"),
                            "--reboot", "--reboot-timeout", "60", *extra])


def uninstall(node, *extra: str):
    return cli.invoke(app, ["uninstall", *node.cli_args(), *extra])


def installed(node, mirror_: Mirror, tmp_path: Path, **overrides):
    mirror_.publish(V)
    node = node("ubuntu-22.04-t4", nouveau_loaded=True, **overrides)
    before = snapshot(node)
    result = install(node, tmp_path)
    assert result.exit_code == 0, result.output
    assert node.driver() is not None and "nvidia-container-toolkit" in node.installed_packages()
    return node, before


def test_uninstall_returns_the_files_to_their_state_before_the_first_install(sim_node, mirror, tmp_path):
    node, before = installed(sim_node, mirror, tmp_path)
    assert differences(before, snapshot(node))  # the install did change the tree

    dry = uninstall(node, "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "nvidia-installer --uninstall --silent" in dry.stdout and "+++ /dev/null" in dry.stdout
    as_json = json.loads(uninstall(node, "--dry-run", "--json").stdout)
    steps = {s["step"]: s for s in as_json["steps"]}
    assert as_json["mode"] == "uninstall-dry-run" and steps["driver"]["status"] == "change"
    assert [a["kind"] for a in steps["driver"]["actions"]] == ["modules", "command"]  # unload, then its uninstaller
    assert steps["driver"]["actions"][-1]["commands"] == ["nvidia-installer --uninstall --silent"]  # root: no sudo
    assert steps["prerequisites"]["status"] == "ok" and not as_json["summary"]["nothing_to_undo"]
    assert node.driver() is not None  # --dry-run changed nothing

    done = uninstall(node, "--reboot")
    assert done.exit_code == 0, done.output
    assert node.driver() is None and "nvidia-container-toolkit" not in node.installed_packages()
    assert "kept: " in done.stdout  # the build prerequisites stay by default
    # only the build prerequisites' traces remain (their commands, dpkg's status listing gcc, make, dkms)
    assert differences(before, snapshot(node)) == ["+ usr/bin/gcc", "+ usr/bin/make", "+ usr/sbin/dkms",
                                                   "~ var/lib/dpkg/status"]
    assert {"gcc", "make", "dkms"} <= set(node.installed_packages())

    rest = uninstall(node, "--only", "prerequisites")
    assert rest.exit_code == 0, rest.output
    assert differences(before, snapshot(node)) == []

    again_tree = snapshot(node)
    again = uninstall(node)
    assert again.exit_code == 0, again.output
    assert "nothing to undo" in again.stdout and snapshot(node) == again_tree

    status = cli.invoke(app, ["status", *node.cli_args()])
    assert status.exit_code == 0, status.output
    assert "uninstall" in status.stdout and "install" in status.stdout


def test_a_user_edit_of_daemon_json_is_kept_and_only_gpunode_keys_go(sim_node, mirror, tmp_path):
    node, _ = installed(sim_node, mirror, tmp_path)
    data = json.loads(node.read("/etc/docker/daemon.json"))
    assert "nvidia" in data["runtimes"]
    data["log-level"] = "warn"  # the user's own edit, after gpunode's
    node.write("/etc/docker/daemon.json", json.dumps(data, indent=4) + "\n")
    node.write("/etc/modprobe.d/user-own.conf", "options snd_hda_intel power_save=1\n")

    done = uninstall(node)
    assert done.exit_code == 0, done.output
    kept = json.loads(node.read("/etc/docker/daemon.json"))
    assert kept.get("log-level") == "warn" and "nvidia" not in kept.get("runtimes", {})
    assert kept.get("default-runtime") != "nvidia"
    assert node.read("/etc/modprobe.d/user-own.conf") == "options snd_hda_intel power_save=1\n"


# ---- NVSwitch node: fabric manager (held, from NVIDIA's CUDA repository), docker and containerd --------------------

FM_V = "535.274.02"  # in the simulated CUDA repository, fabric manager included
FM_PKG = "nvidia-fabricmanager-535"
CONTAINERD = "/etc/containerd/config.toml"
# besides EXCLUDED: the edited containerd config itself (compared key by key below); the copy gpunode made of it at
# install time (`config.toml.gpunode-bak.TIME`) goes with gpunode's entries


def test_nvswitch_node_uninstall_removes_fabric_manager_its_hold_and_repository_and_keeps_the_users_containerd_edit(
        sim_node, mirror, tmp_path, monkeypatch):
    from gpunode.actions import fabric as fabric_actions
    monkeypatch.setattr(fabric_actions, "POLL_SECONDS", 0.2)
    mirror.publish(FM_V)
    node = sim_node("ubuntu-22.04-h100x8", engines=("docker", "containerd"), nouveau_loaded=True,
                    containerd_config_version=2)
    before = snapshot(node)
    original = node.read(CONTAINERD)
    done = cli.invoke(app, ["install", *node.cli_args(), "--driver", FM_V, "--cache-dir", str(tmp_path / "cache"),
                            "--engine", "docker", "--engine", "containerd", "--reboot", "--reboot-timeout", "60"])
    assert done.exit_code == 0, done.output
    assert node.installed_packages().get(FM_PKG) and FM_PKG in node.ssh("apt-mark showhold")[1].split()
    assert node.unit("nvidia-fabricmanager")["active"] == "active"
    assert node.unit("nvidia-persistenced")["active"] == "active"
    assert "cuda-keyring" in node.installed_packages()
    # real apt refuses to remove a held package; so does the simulator
    code, _, err = node.ssh(f"apt-get remove -y {FM_PKG}")
    assert code == 100 and "--allow-change-held-packages" in err

    # the user's own change to containerd's config, after gpunode's
    config = node.read(CONTAINERD)
    assert config is not None and "conf.d" in config  # nvidia-ctk added its drop-in import
    assert "format" not in tomllib.loads(config)["debug"]
    node.write(CONTAINERD, config.replace("[debug]\n", "[debug]\n  format = \"json\"\n", 1))  # a real option

    dry = cli.invoke(app, ["uninstall", *node.cli_args(), "--stop-gpu-services", "--dry-run", "--json"])
    assert dry.exit_code == 0, dry.output
    steps = {s["step"]: s for s in json.loads(dry.stdout)["steps"]}
    fm = [c for a in steps["fabricmanager"]["actions"] for c in a["commands"]]
    assert fm[:3] == [f"apt-mark unhold {FM_PKG}", "systemctl disable --now nvidia-fabricmanager.service",
                      f"apt-get remove -y {FM_PKG}"], fm
    assert "apt-get remove -y cuda-keyring" in fm
    runtime = steps["runtime"]["actions"]
    assert any(a["kind"] == "file" and a.get("path") == CONTAINERD and "-" in a["diff"] for a in runtime)
    driver = [c for a in steps["driver"]["actions"] for c in a["commands"]]
    assert driver[-1] == "nvidia-installer --uninstall --silent", driver  # persistenced and FM: stopped earlier
    assert node.installed_packages().get(FM_PKG)  # --dry-run changed nothing

    node.clear_calls()
    gone = cli.invoke(app, ["uninstall", *node.cli_args(), "--stop-gpu-services", "--reboot", "--reboot-timeout",
                            "60"])
    assert gone.exit_code == 0, gone.output
    assert node.driver() is None
    packages = node.installed_packages()
    assert FM_PKG not in packages and "cuda-keyring" not in packages
    assert FM_PKG not in node.ssh("apt-mark showhold")[1].split()
    assert not any("cuda" in p for p in node.ssh("ls /etc/apt/sources.list.d")[1].split())
    # the user's containerd edit stays, gpunode's entries are gone
    kept = tomllib.loads(node.read(CONTAINERD) or "")
    assert kept["debug"]["format"] == "json" and "imports" not in kept
    expected = tomllib.loads(original or "")
    expected["debug"]["format"] = "json"
    assert kept == expected
    after = snapshot(node)
    diff = differences(before, after)
    assert diff == ["+ usr/bin/gcc", "+ usr/bin/make", "+ usr/sbin/dkms", f"~ {CONTAINERD.lstrip('/')}",
                    "~ var/lib/dpkg/status"], diff

    again_tree = snapshot(node)
    again = uninstall(node, "--stop-gpu-services")
    assert again.exit_code == 0, again.output
    assert "nothing to undo" in again.stdout and snapshot(node) == again_tree


def test_a_users_dcgm_blocks_before_any_change_then_stop_gpu_services_and_drm_clients_plan_the_reboot(
        sim_node, mirror, tmp_path):
    node, _ = installed(sim_node, mirror, tmp_path)
    node.set_unit("nvidia-dcgm", active="active", enabled="enabled")  # the user's DCGM: not gpunode's
    tree = snapshot(node)
    blocked = uninstall(node, "--json")
    assert blocked.exit_code == 1, blocked.output
    steps = {s["step"]: s for s in json.loads(blocked.stdout)["steps"]}
    assert steps["driver"]["result"] == "blocked" and "nvidia-dcgm.service" in steps["driver"]["reason"]
    assert "nvidia-persistenced" not in steps["driver"]["reason"].split("held by")[-1]  # nodesettings' undo stops it
    assert steps["driver"]["fix"].startswith("gpunode uninstall --host ") and "--stop-gpu-services" in \
        steps["driver"]["fix"]
    assert {s["result"] for n, s in steps.items() if n != "driver"} == {"not-run"}
    assert snapshot(node) == tree and node.driver() is not None  # nothing was changed

    assert node.ssh("modprobe nvidia_drm")[0] == 0
    node.set_drm_clients(1)  # the framebuffer console holds nvidia_drm: it cannot unload before a reboot
    dry = json.loads(uninstall(node, "--stop-gpu-services", "--dry-run", "--json").stdout)
    driver = {s["step"]: s for s in dry["steps"]}["driver"]
    assert [a["kind"] for a in driver["actions"]] == ["service", "modules", "command", "reboot"], driver
    assert driver["actions"][0]["commands"] == ["systemctl stop nvidia-dcgm.service"]
    assert driver["actions"][2]["commands"] == ["nvidia-installer --uninstall --silent --skip-module-unload"]
    assert driver["reboot_required"] is True and any("stay stopped" in n for n in driver["notes"])

    boots = node.reboots
    done = uninstall(node, "--stop-gpu-services", "--reboot", "--reboot-timeout", "60")
    assert done.exit_code == 0, done.output
    assert "nvidia-dcgm.service stay stopped" in done.stdout
    assert node.driver() is None and node.reboots == boots + 1 and not node.is_loaded("nvidia")
    assert "nothing to undo" in uninstall(node).stdout
