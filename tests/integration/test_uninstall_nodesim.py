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
    assert as_json["mode"] == "plan" and steps["driver"]["status"] == "change"
    assert steps["driver"]["actions"][0]["commands"] == ["nvidia-installer --uninstall --silent"]  # root: no sudo
    assert steps["prerequisites"]["status"] == "ok" and not as_json["summary"]["nothing_to_undo"]
    assert node.driver() is not None  # --dry-run changed nothing

    done = uninstall(node, "--reboot")
    assert done.exit_code == 0, done.output
    assert node.driver() is None and "nvidia-container-toolkit" not in node.installed_packages()
    assert "kept: " in done.stdout  # the build prerequisites stay by default
    # only the build prerequisites' traces remain (dkms's file, dpkg's status listing gcc, make, dkms)
    assert differences(before, snapshot(node)) == ["+ usr/sbin/dkms", "~ var/lib/dpkg/status"]
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
