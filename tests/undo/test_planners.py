"""The undo planners' rules (pure): files by hash and backup, packages only those gpunode installed, the driver
only when it is still the one gpunode installed, prerequisites kept unless asked, docker keys stripped."""

from __future__ import annotations

import hashlib
import json

from gpunode.facts import Facts
from gpunode.plan import Status, WriteFile
from gpunode.records import DriverRecord, FileRecord, parse_records
from gpunode.undo import driver, prerequisites, select
from gpunode.undo.actions import RemoveFile, RestoreFile
from gpunode.undo.common import file_actions, package_actions
from gpunode.undo.runtime import strip_docker
from gpunode.undo.state import NodeState, UndoRequest

OURS = "# Written by gpunode\nblacklist nouveau\n"
SHA = hashlib.sha256(OURS.encode()).hexdigest()
REQ = UndoRequest(("driver",))
UNLOADED = Facts()  # no driver loaded, nothing read about what holds the GPU


def rec(path: str, existed: bool, backup: str | None = None, sha: str = SHA) -> FileRecord:
    return FileRecord(path=path, existed=existed, backup=backup, sha256=sha, id=path)


def test_a_file_gpunode_created_is_removed_only_while_it_holds_gpunode_content():
    records = [rec("/etc/x.conf", False)]
    actions, _ = file_actions(records, NodeState(files={"/etc/x.conf": SHA}, texts={"/etc/x.conf": OURS}))
    assert [type(a) for a in actions] == [RemoveFile] and "+++ /dev/null" in actions[0].diff()
    actions, notes = file_actions(records, NodeState(files={"/etc/x.conf": "0" * 64}))
    assert actions == [] and "changed since" in notes[0]
    assert file_actions(records, NodeState(files={"/etc/x.conf": "-"})) == ([], [])  # gone already: nothing to do


def test_a_replaced_file_comes_back_from_its_backup():
    records = [rec("/etc/y.conf", True, "/etc/y.conf.gpunode-bak.1")]
    state = NodeState(files={"/etc/y.conf": SHA, "/etc/y.conf.gpunode-bak.1": "a" * 64},
                      texts={"/etc/y.conf": OURS, "/etc/y.conf.gpunode-bak.1": "user\n"})
    actions, _ = file_actions(records, state)
    assert isinstance(actions[0], RestoreFile) and actions[0].backup == "/etc/y.conf.gpunode-bak.1"
    assert "-blacklist nouveau" in actions[0].diff() and "+user" in actions[0].diff()
    # restored: the backup moved over it, so nothing is left to do
    done = NodeState(files={"/etc/y.conf": "a" * 64, "/etc/y.conf.gpunode-bak.1": "-"})
    assert file_actions(records, done) == ([], [])


def test_a_user_edited_daemon_json_loses_only_gpunode_keys():
    user = {"log-level": "warn", "default-runtime": "nvidia",
            "runtimes": {"nvidia": {"path": "nvidia-container-runtime", "args": []}, "crun": {"path": "/usr/bin/crun"}}}
    stripped = json.loads(strip_docker(json.dumps(user)) or "")
    assert stripped == {"log-level": "warn", "runtimes": {"crun": {"path": "/usr/bin/crun"}}}
    records = [rec("/etc/docker/daemon.json", False, sha="f" * 64)]
    state = NodeState(files={"/etc/docker/daemon.json": "e" * 64}, texts={"/etc/docker/daemon.json": json.dumps(user)})
    actions, _ = file_actions(records, state, strip={"/etc/docker/daemon.json": strip_docker})
    assert isinstance(actions[0], WriteFile) and '"log-level": "warn"' in actions[0].after


def test_only_packages_gpunode_installed_and_still_there_are_removed():
    records = parse_records([{"kind": "packages", "manager": "apt", "installed": [["nvidia-ctk-x", "1"], ["gone", "1"]]}])
    actions, _ = package_actions(records, NodeState(packages={"nvidia-ctk-x": "1", "curl": "7"}), REQ, "toolkit")
    assert actions[0].commands() == ["sudo apt-get remove -y nvidia-ctk-x"]
    assert package_actions(records, NodeState(packages={"curl": "7"}), REQ, "toolkit") == ([], [])


def test_the_driver_is_uninstalled_only_when_gpunode_installed_it_and_it_is_still_there():
    mine = [DriverRecord(version="535.129.03", previous=None)]
    plan = driver.plan(mine, NodeState(driver="535.129.03"), UNLOADED, REQ)
    assert plan.status is Status.CHANGE and plan.actions[0].commands() == ["sudo nvidia-installer --uninstall --silent"]
    assert driver.plan(mine, NodeState(driver="-"), UNLOADED, REQ).status is Status.OK
    assert driver.plan(mine, NodeState(driver="550.1"), UNLOADED, REQ).status is Status.OK
    over = [DriverRecord(version="535.129.03", previous="525.1")]
    kept = driver.plan(over, NodeState(driver="535.129.03"), UNLOADED, REQ)
    assert kept.status is Status.OK and "525.1 was installed before gpunode" in kept.reason


def test_a_packaged_driver_gpunode_installed_is_purged_exactly_and_its_record_round_trips():
    records = parse_records([
        {"kind": "packages", "step": "driver", "manager": "apt",
         "installed": [["nvidia-kernel-dkms", "535.261.03-1"], ["libcuda1", "535.261.03-1"]]},
        {"kind": "driver", "step": "driver", "version": "535.261.03", "previous": None, "source": "packages"}])
    assert records[1].to_dict()["source"] == "packages"
    assert "source" not in DriverRecord(version="535.129.03").to_dict()  # a .run's record is written as before
    state = NodeState(packages={"nvidia-kernel-dkms": "535.261.03-1", "libcuda1": "535.261.03-1",
                                "dkms": "3"})
    plan = driver.plan(records, state, UNLOADED, REQ)
    assert plan.status is Status.CHANGE
    assert plan.actions[-1].commands() == [
        "sudo apt-get purge -y --allow-change-held-packages nvidia-kernel-dkms libcuda1"]
    assert not any("nvidia-installer" in c for a in plan.actions for c in a.commands())
    gone = driver.plan(records, NodeState(packages={"dkms": "3"}), UNLOADED, REQ)
    assert gone.status is Status.OK and "no longer installed" in gone.reason


def test_prerequisites_are_kept_unless_named():
    records = parse_records([{"kind": "packages", "manager": "apt", "installed": [["gcc", "11"]]}])
    state = NodeState(packages={"gcc": "11"})
    default = select([])
    assert not default.prerequisites and default.steps[0] == "k8s" and default.steps[-1] == "nouveau"
    kept = prerequisites.plan(records, state, None, default)  # type: ignore[arg-type]
    assert kept.status is Status.OK and kept.reason.startswith("kept: gcc")
    asked = prerequisites.plan(records, state, None, select(["prerequisites"]))  # type: ignore[arg-type]
    assert asked.status is Status.CHANGE and "apt-get remove -y gcc" in asked.actions[0].commands()[0]
