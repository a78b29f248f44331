"""The collection run by real ansible-playbook against simulated nodes (issue 18): check mode changes nothing and
predicts the run, a second run changes nothing, a failing node fails alone, the example playbook reboots through
ansible.builtin.reboot, and gpunode's own fleet mode reports the same nodes the same way."""

from __future__ import annotations

import hashlib
import json
import re
import socket
import time

import pytest
from typer.testing import CliRunner

from gpunode.cli import app
from tests.ansible.conftest import COLLECTION, node_play
from tests.integration.test_driver_nodesim import Mirror
from tests.nodesim.node import SimNode

pytestmark = pytest.mark.integration

DRIVER = "535.274.02"
# driver preinstalled and nouveau not loaded: the run changes nouveau (blacklist), toolkit, runtime, nodesettings
# and needs no reboot; four distributions, both package managers
PROFILES = ["ubuntu-22.04-t4", "rocky-9-t4", "debian-12-t4", "ubuntu-24.04-t4"]
# tools that change a node; check mode must call none of them in a changing way
CHANGING = {"apt-get": {"install", "remove", "purge", "upgrade"}, "dnf": {"install", "remove", "upgrade"},
            "systemctl": {"restart", "enable", "start", "stop", "daemon-reload", "reboot"},
            "update-initramfs": None, "dracut": None, "modprobe": None, "shutdown": None, "reboot": None,
            "nvidia-ctk": {"runtime", "system"}, "gpg": None, "apt-mark": None}


def ready_node(sim_fleet, count: int) -> list[SimNode]:
    return sim_fleet([(PROFILES[i % len(PROFILES)], {"preinstalled_driver": DRIVER, "nouveau_loaded": False,
                                                     "engines": ("docker",)}) for i in range(count)])


def node_state(node: SimNode) -> dict[str, object]:
    """What a change would touch: files under /etc, keyrings and gpunode's journal, packages, modules, units,
    the boot."""
    files = {}
    for top in ("etc", "usr/share/keyrings", "var/lib/gpunode"):
        base = node.root / top
        for path in sorted(base.rglob("*")) if base.exists() else []:
            if path.is_file() and not path.is_symlink():
                files[str(path.relative_to(node.root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return {"files": files, "packages": node.installed_packages(), "modules": node.loaded_modules(),
            "boot": node.boot_id, "units": {u: node.unit(u) for u in ("docker.service", "nvidia-persistenced.service")}}


def changing_calls(node: SimNode) -> list[list[str]]:
    found = []
    for argv in node.calls():
        words = CHANGING.get(argv[0], ())
        if words is None or (words and set(argv[1:]) & words):
            found.append(argv)
    return found


_NODE_ARGS = re.compile(r" --(host|identity|inventory|limit|known-hosts) \S+")


def same_node(text: str) -> str:
    """A text with its `gpunode ...` fixes made runnable for the node (--host/--identity from Ansible's inventory
    variables; --inventory/--limit in gpunode's fleet mode) without those options."""
    return _NODE_ARGS.sub("", text)


def steps_of(result: dict) -> list[tuple[str, str, str]]:
    return [(s["step"], s["result"], s["reason"]) for s in result["steps"]]


def test_ten_nodes_check_mode_predicts_the_run_which_converges_and_a_second_run_changes_nothing(sim_fleet, ansible):
    nodes = ready_node(sim_fleet, 10)
    inventory = ansible.hosts(nodes)
    names = [f"gpu-{i:02d}" for i in range(10)]
    before = {n.name: node_state(n) for n in nodes}
    for n in nodes:
        n.clear_calls()

    # check mode (gpunode plan), with the diffs: nothing on any node changes
    check = ansible.playbook(node_play(), "--check", "--diff")
    assert check.rc == 0, check.stdout[-3000:] + check.stderr[-3000:]
    planned = check.results()
    assert sorted(planned) == names
    assert all(r["mode"] == "plan" and r["state"] == "changes-pending" and r["changed"] for r in planned.values())
    assert {n.name: node_state(n) for n in nodes} == before
    assert all(changing_calls(n) == [] for n in nodes), [changing_calls(n) for n in nodes]
    assert "+blacklist nouveau" in check.stdout  # --diff printed by Ansible's callback

    # the run: every node converges, and changes exactly what check mode said
    run = ansible.playbook(node_play())
    assert run.rc == 0, run.stdout[-3000:] + run.stderr[-3000:]
    applied = run.results()
    for name in names:
        assert applied[name]["state"] == "ready" and applied[name]["ready"], (name, applied[name]["msg"])
        assert applied[name]["changed"] is planned[name]["changed"] is True
        assert applied[name]["changed_steps"] == planned[name]["changed_steps"] == [
            "nouveau", "toolkit", "runtime", "nodesettings"]
    # the diffs shown in check mode are the files the run wrote
    for node, name in zip(nodes, names, strict=True):
        diffs = planned[name]["diff"]
        assert {d["after_header"] for d in diffs} >= {"/etc/modprobe.d/blacklist-nouveau.conf"}
        for d in diffs:
            assert node.read(d["after_header"]) == d["after"]
    assert "changed=1" in run.stdout and "failed=0" in run.stdout

    # a second run: nothing to do anywhere
    again = ansible.playbook(node_play())
    assert again.rc == 0
    assert {h: (r["changed"], r["state"]) for h, r in again.results().items()} == {h: (False, "ready") for h in names}
    assert "changed=0" in again.stdout and "changed=1" not in again.stdout

    # gpunode's own fleet mode over the same inventory reports every node as check mode does
    replan = ansible.playbook(node_play(), "--check")
    ours = replan.results()
    started = time.monotonic()
    fleet = CliRunner().invoke(app, ["plan", "--inventory", str(inventory), "--known-hosts", str(ansible.known_hosts),
                                     "--log-dir", str(ansible.work / "logs"), "--json"])
    fleet_seconds = time.monotonic() - started
    assert fleet.exit_code == 0, fleet.output
    by_host = {h["host"]: h for h in json.loads(fleet.stdout)["hosts"]}
    assert sorted(by_host) == names
    for name in names:
        report = by_host[name]["report"]
        assert by_host[name]["status"] == "ok" and ours[name]["changed"] is False
        assert report["summary"]["state"] == ours[name]["state"] == "ready"
        assert [(s["step"], s["result"], s["reason"]) for s in report["steps"]] == steps_of(ours[name])

    # and doctor: the module's facts hold the same checks as `gpunode doctor --inventory`
    doctor = ansible.playbook("- hosts: gpu\n  gather_facts: false\n  tasks:\n    - gpunode.gpu.doctor:\n")
    facts = doctor.results("gpunode.gpu.doctor")
    theirs = CliRunner().invoke(app, ["doctor", "--inventory", str(inventory), "--known-hosts",
                                      str(ansible.known_hosts), "--log-dir", str(ansible.work / "logs"), "--json"])
    fleet_doctor = {h["host"]: h for h in json.loads(theirs.stdout)["hosts"]}
    for name in names:
        document = facts[name]["ansible_facts"]["gpunode_doctor"]
        assert facts[name]["changed"] is False
        # the same checks and verdicts; the evidence too, but for a gpunode command inside it, which each front
        # door renders for its users (module arguments for Ansible, a command line for the CLI: gpunode/fixes.py)
        def seen(checks):
            return [(c["id"], c["status"], None if "gpunode" in c["evidence"] else same_node(c["evidence"]))
                    for c in checks]
        assert seen(document["checks"]) == seen(fleet_doctor[name]["checks"])
        rendered = {c["id"]: c["evidence"] for c in document["checks"] if "gpunode.gpu.node:" in c["evidence"]}
        assert all("gpunode install" not in text for text in rendered.values()), rendered
        assert facts[name]["ready"] is (fleet_doctor[name]["status"] == "ok")
    print(f"10 nodes, ansible-playbook wall time: check {check.seconds:.1f}s, run {run.seconds:.1f}s, "
          f"second run {again.seconds:.1f}s, check again {replan.seconds:.1f}s, doctor {doctor.seconds:.1f}s; "
          f"gpunode plan --inventory (in-process) {fleet_seconds:.1f}s")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_failing_node_fails_alone_with_gpunode_reason_and_fix(sim_fleet, ansible):
    good = ready_node(sim_fleet, 2)
    # a GPU, no driver, none asked for: the driver step is blocked
    blocked = sim_fleet([("ubuntu-22.04-t4", {"nouveau_loaded": False})])[0]
    ansible.hosts([*good, blocked], names=["gpu-a", "gpu-b", "gpu-blocked"])
    # and a host nobody answers for
    text = ansible.inventory.read_text().replace(
        "\n\n[gpu:vars]", f"\ngpu-dead ansible_host=127.0.0.1 ansible_port={closed_port()} ansible_user=root "
        f"ansible_ssh_private_key_file={good[0].key_path}\n\n[gpu:vars]")
    ansible.inventory.write_text(text)
    before = node_state(blocked)

    run = ansible.playbook(node_play())
    results = run.results()
    assert run.rc == 4  # some host unreachable (and one failed); the others were not stopped
    assert results["gpu-a"]["state"] == results["gpu-b"]["state"] == "ready"
    assert results["gpu-a"]["changed"] and results["gpu-b"]["changed"]
    failed = results["gpu-blocked"]
    assert failed["_status"] == "failed" and failed["state"] == "blocked"
    assert failed["changed"] is True and failed["changed_steps"] == ["nouveau"]  # what ran before the block
    assert failed["msg"].startswith("driver: ") and failed["fix"]
    # gpunode's own command as this module's arguments (not a CLI line an Ansible user would have to translate)
    assert "gpunode.gpu.node: {driver: " in failed["fix"] and "gpunode install" not in failed["fix"], failed["fix"]
    assert failed["output"] is not None  # what the terminal would have shown above the failure
    step = next(s for s in failed["steps"] if s["step"] == "driver")
    assert step["result"] == "blocked" and step["fix"] == failed["fix"]
    assert results["gpu-dead"]["_status"] == "unreachable"
    assert "cannot reach the node" in results["gpu-dead"]["msg"]
    # the blocked node: the steps before the driver ran (nouveau), nothing after it
    assert [s["result"] for s in failed["steps"]][:3] == ["changed", "ok", "blocked"]
    assert all(s["result"] == "not-run" for s in failed["steps"][3:])
    assert node_state(blocked)["packages"] == before["packages"]


def test_bad_options_fail_before_any_node_is_touched_and_name_the_option(sim_node, ansible):
    node = sim_node("ubuntu-22.04-t4", preinstalled_driver=DRIVER, nouveau_loaded=False)
    ansible.hosts([node])
    node.clear_calls()
    run = ansible.playbook(node_play("{driver: '5x5', engines: [docker]}"))
    result = run.results()["gpu-00"]
    assert result["_status"] == "failed"
    assert "driver" in result["msg"] and "--driver" not in result["msg"], result["msg"]
    assert result["fix"]
    assert node.calls() == []
    # Ansible's own argument checks come first: an unknown engine never reaches gpunode
    run = ansible.playbook(node_play("{engines: [podman]}"))
    assert "value of engines must be one or more of" in run.results()["gpu-00"]["msg"]


def test_the_example_playbook_reboots_when_asked_and_runs_again_until_converged(sim_fleet, ansible):
    nodes = sim_fleet(["ubuntu-22.04-t4", "rocky-9-t4"])  # nouveau loaded: blacklisting it needs a reboot
    ansible.hosts(nodes)
    playbook = COLLECTION / "playbooks" / "converge.yml"
    # a node that does not come back fails in minutes, not at the playbook's 15-minute default
    extra = ["-e", json.dumps({"gpunode_options": {"only": ["nouveau"]}, "gpunode_reboot_timeout": 240})]
    before = [node_state(n) for n in nodes]

    check = ansible.playbook(playbook, "--check", *extra)
    assert check.rc == 0, check.stdout[-3000:]
    assert [node_state(n) for n in nodes] == before and all(n.reboots == 0 for n in nodes)
    assert all(r["changed"] and r["reboot_required"] for r in check.results(task="gpunode pass 1").values())

    run = ansible.playbook(playbook, *extra)
    assert run.rc == 0, run.stdout[-3000:] + run.stderr[-3000:] + "".join(f"{n}: {n.faults}" for n in nodes)
    first, second = run.results(task="gpunode pass 1"), run.results(task="gpunode pass 2")
    for name in ("gpu-00", "gpu-01"):
        assert first[name]["changed"] and first[name]["reboot_required"] and first[name]["state"] == "reboot-pending"
        assert second[name]["changed"] is False and second[name]["state"] == "ready"
        assert run.results(task="gpunode pass 3")[name]["_status"] == "skipped"
    reboots = sorted((r["_host"], r["_status"]) for r in run.all("ansible.builtin.reboot"))
    assert reboots == [("gpu-00", "ok"), ("gpu-00", "skipped"), ("gpu-00", "skipped"),
                       ("gpu-01", "ok"), ("gpu-01", "skipped"), ("gpu-01", "skipped")]
    assert all(n.reboots == 1 and not n.is_loaded("nouveau") for n in nodes)

    again = ansible.playbook(playbook, *extra)
    assert again.rc == 0
    assert all(not r["changed"] for r in again.results(task="gpunode pass 1").values())
    assert all(n.reboots == 1 for n in nodes)


def test_the_driver_run_goes_through_ansible_and_a_bad_checksum_fails_only_its_node(sim_fleet, ansible,
                                                                                      fake_driver_run):
    """The controller checks the .run, the adapter uploads it through Ansible's connection (binary stdin, verified
    on the node) and the installer runs there; the node given a wrong sha256 fails alone, untouched."""
    run_file = fake_driver_run(DRIVER)
    digest = hashlib.sha256(run_file.read_bytes()).hexdigest()
    good, bad = sim_fleet([("ubuntu-22.04-t4", {"nouveau_loaded": False}), ("ubuntu-22.04-t4", {"nouveau_loaded": False})])
    ansible.hosts([good, bad], extra={"gpu-00": {"want_sha": digest}, "gpu-01": {"want_sha": "0" * 64}})
    play = node_play("{only: [prerequisites, driver], driver_run: '" + str(run_file) + "', sha256: '{{ want_sha }}'}")

    run = ansible.playbook(play)
    results = run.results()
    assert results["gpu-00"]["state"] == "ready" and results["gpu-00"]["changed"], results["gpu-00"]["msg"]
    assert good.driver() is not None and good.driver()["version"] == DRIVER
    assert results["gpu-01"]["_status"] == "failed" and results["gpu-01"]["changed"] is False
    assert "sha256" in (results["gpu-01"]["msg"] + (results["gpu-01"]["fix"] or "")).lower()
    assert bad.driver() is None and all(c[0] not in ("sh", "nvidia-installer") for c in bad.calls())


def test_become_wraps_every_gpunode_command_the_ansible_way(sim_node, ansible):
    """With `become: true` Ansible's sudo become plugin wraps each command (the BECOME-SUCCESS marker is taken
    off, stdin still reaches the command), and gpunode adds no sudo of its own. The simulated nodes log in as
    root, so the test lets Ansible become root from root; its flags leave out -S, since the simulator's sudo
    would read a password line from stdin where the real one (no password to ask from root) does not."""
    node = sim_node("ubuntu-22.04-t4", preinstalled_driver=DRIVER, nouveau_loaded=False)
    ansible.hosts([node])
    become = {"ANSIBLE_BECOME_ALLOW_SAME_USER": "True", "ANSIBLE_SUDO_FLAGS": "-H -n"}
    node.clear_calls()
    run = ansible.playbook(node_play("{only: [nouveau, nodesettings]}", become=True), env=become)
    result = run.results()["gpu-00"]
    assert result["state"] == "ready" and result["changed_steps"] == ["nouveau", "nodesettings"], result["msg"]
    sudo = node.calls("sudo")
    assert sudo and all(c[1:4] == ["-H", "-n", "-u"] for c in sudo), sudo[:3]
    # every command went through sudo once: gpunode saw root and added none of its own
    assert not any(c[1:3] == ["-n", "--"] for c in sudo)
    assert node.read("/etc/modprobe.d/blacklist-nouveau.conf").startswith("# Written by gpunode")  # stdin intact
    again = ansible.playbook(node_play("{only: [nouveau, nodesettings]}", become=True), env=become)
    assert again.results()["gpu-00"]["changed"] is False


def test_state_absent_undoes_the_install_check_mode_predicts_it_and_a_second_run_changes_nothing(sim_fleet, ansible):
    nodes = ready_node(sim_fleet, 3)
    ansible.hosts(nodes)
    names = [f"gpu-{i:02d}" for i in range(3)]
    before = {n.name: node_state(n) for n in nodes}
    run = ansible.playbook(node_play())
    assert run.rc == 0, run.stdout + run.stderr
    assert all(run.results()[h]["changed"] for h in names)
    installed = {n.name: node_state(n) for n in nodes}

    # check mode: `uninstall --dry-run`, the diff shows what goes back, nothing changes
    for n in nodes:
        n.clear_calls()
    check = ansible.playbook(node_play("{state: absent}"), "--check", "--diff")
    assert check.rc == 0, check.stdout + check.stderr
    predicted = check.results()
    assert all(predicted[h]["changed"] and predicted[h]["mode"] == "uninstall-dry-run" for h in names), predicted
    assert all(node_state(n) == installed[n.name] and changing_calls(n) == [] for n in nodes)
    diffs = {d["after_header"] for d in predicted["gpu-00"]["diff"]}
    assert "/dev/null" in diffs  # a file gpunode created is removed
    assert "+++ after: /dev/null" in check.stdout  # Ansible shows it as a removal

    done = ansible.playbook(node_play("{state: absent}"))
    assert done.rc == 0, done.stdout + done.stderr
    results = done.results()
    for h, n in zip(names, nodes, strict=True):
        r = results[h]
        assert r["changed"] and r["mode"] == "uninstall" and r["nothing_to_undo"] is False, r
        assert r["changed_steps"] == predicted[h]["changed_steps"]  # check mode predicted the run
        assert "nvidia-container-toolkit" not in n.installed_packages()
        assert not n.exists("/etc/modprobe.d/blacklist-nouveau.conf")
        after = node_state(n)
        # the files under /etc are back as they were before the install (gpunode's journal stays, as a record)
        etc = {k: v for k, v in after["files"].items() if k.startswith("etc/")}
        assert etc == {k: v for k, v in before[n.name]["files"].items() if k.startswith("etc/")}

    again = ansible.playbook(node_play("{state: absent}"))
    assert again.rc == 0, again.stdout + again.stderr
    assert all(not r["changed"] and r["nothing_to_undo"] and r["msg"] == "gpunode uninstall: nothing to undo"
               for r in again.results().values()), again.results()
    assert len(again.results()) == 3

    # an install option with state=absent is refused before the host is touched
    bad = ansible.playbook(node_play("{state: absent, driver: 535.129.03}"))
    assert bad.rc != 0
    assert all("driver is an install option" in r["msg"] for r in bad.results().values())


UPGRADE_FROM, UPGRADE_TO = "535.274.02", "570.195.03"  # both in the simulated CUDA repository with fabric manager


def day2_play(options: str) -> str:
    return node_play("{only: [driver, fabricmanager, nodesettings], driver: '" + UPGRADE_TO + "', " + options + "}")


def actions_of(result: dict) -> dict[str, list[str]]:
    return {s["step"]: [a["summary"] for a in s["actions"]] for s in result["steps"] if s["actions"]}


def test_day2_stop_gpu_services_upgrade_and_kernel_holds_through_the_collection(sim_fleet, ansible, tmp_path):
    """An HGX H100 set up by gpunode at 535 (fabric manager held and running, persistenced running) is driven to 570
    with `stop_gpu_services: true` and `hold_kernel: true`, and a Rocky 9 node gets its kernel versionlocked in the
    same play; then `hold_kernel: false` releases both. Check mode predicts each run's steps and actions exactly, and
    each run again changes nothing. The driver comes from the controller's (mirror) download, uploaded per node."""
    mirror = Mirror(tmp_path / "www")
    mirror.publish(UPGRADE_FROM)
    mirror.publish(UPGRADE_TO)
    env = {"GPUNODE_DRIVER_MIRROR": mirror.url}
    try:
        hgx, rocky = sim_fleet([("ubuntu-22.04-h100x8", {"preinstalled_driver": UPGRADE_FROM, "engines": ("docker",)}),
                                ("rocky-9-t4", {"preinstalled_driver": UPGRADE_TO, "nouveau_loaded": False})])
        setup = CliRunner().invoke(app, ["install", *hgx.cli_args(), "--driver", UPGRADE_FROM, "--cache-dir",
                                 str(tmp_path / "cache"), "--only", "driver", "--only", "fabricmanager",
                                 "--only", "nodesettings"], env=env)
        assert setup.exit_code == 0, setup.output
        assert hgx.unit("nvidia-fabricmanager")["active"] == "active" and hgx.unit("nvidia-persistenced")["active"] == "active"
        hgx.offer_kernel_upgrade("5.15.0-92-generic")  # linux-generic installed: the kernel metapackage to hold
        ansible.hosts([hgx, rocky])
        names = ("gpu-00", "gpu-01")

        def converge(options: str, expect: dict[str, list[str]]) -> None:
            before = {n.name: node_state(n) for n in (hgx, rocky)}
            for n in (hgx, rocky):
                n.clear_calls()
            check = ansible.playbook(day2_play(options), "--check", timeout=900, env=env)
            assert check.rc == 0, check.stdout + check.stderr
            predicted = check.results()
            assert {h: predicted[h]["changed_steps"] for h in names} == expect, predicted
            assert all(node_state(n) == before[n.name] and changing_calls(n) == [] for n in (hgx, rocky))
            run = ansible.playbook(day2_play(options), timeout=900, env=env)
            assert run.rc == 0, run.stdout + run.stderr
            done = run.results()
            for h in names:
                assert done[h]["state"] == "ready" and done[h]["changed"] == bool(expect[h]), done[h]["msg"]
                assert done[h]["changed_steps"] == expect[h]
                assert actions_of(done[h]) == actions_of(predicted[h])  # check mode predicted the run exactly
            again = ansible.playbook(day2_play(options), timeout=900, env=env)
            assert again.rc == 0 and all(not r["changed"] for r in again.results().values()), again.results()

        # without stop_gpu_services the upgrade is blocked before any change, with gpunode's fix
        blocked = ansible.playbook(day2_play("hold_kernel: true"), "--limit", "gpu-00", env=env)
        result = blocked.results()["gpu-00"]
        assert result["_status"] == "failed" and "stop_gpu_services: true" in (result["fix"] or ""), result
        assert "hold_kernel: true" in result["fix"]  # the options the task gave are kept
        assert hgx.driver()["version"] == UPGRADE_FROM and "linux-generic" not in hgx.held_packages()

        converge("stop_gpu_services: true, hold_kernel: true",
                 # nodesettings: the upgrade unloads nvidia_uvm with the old driver, nodesettings loads it again
                 {"gpu-00": ["driver", "fabricmanager", "nodesettings"], "gpu-01": ["driver", "nodesettings"]})
        code, out, _ = hgx.ssh("nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1")
        assert code == 0 and out.strip() == UPGRADE_TO and hgx.is_loaded("nvidia")
        assert hgx.unit("nvidia-fabricmanager")["active"] == "active" and hgx.unit("nvidia-persistenced")["active"] == "active"
        assert {"linux-generic", "nvidia-fabricmanager-570"} <= set(hgx.held_packages())
        assert "kernel" in rocky.held_packages() and "kernel-0:" in rocky.read("/etc/dnf/plugins/versionlock.list")

        converge("hold_kernel: false", {"gpu-00": ["driver"], "gpu-01": ["driver"]})
        assert "linux-generic" not in hgx.held_packages() and "nvidia-fabricmanager-570" in hgx.held_packages()
        assert "kernel" not in rocky.held_packages()
    finally:
        mirror.stop()


def test_a_failed_tasks_fix_names_tasks_that_ansible_runs_as_printed(sim_node, ansible):
    """A real failure with a command for the host in its fix: a node lock left without a keeper (what a killed
    Ansible run leaves) and no wait. The result gives the fix as tasks, in `fixes` and at the end of `msg`; the
    task, pasted into a play as printed, runs, and the same task then goes through."""
    node = sim_node("ubuntu-22.04-t4", preinstalled_driver=DRIVER, nouveau_loaded=False)
    ansible.hosts([node])
    holder = f"gpunode-lock pid=- boot={node.boot_id}\ncommand=gpunode install\nsince=2026-01-01T00:00:00Z\nfrom=ci"
    code, _, err = node.ssh("mkdir -p /var/lib/gpunode && ln -s \"$(cat)\" /var/lib/gpunode/run.lock", stdin=holder)
    assert code == 0, err
    play = node_play("{lock_timeout: 0, only: [nouveau]}")
    result = ansible.playbook(play).results()["gpu-00"]
    assert result["_status"] == "failed" and "another gpunode run holds the node" in result["msg"], result
    assert result["msg"].endswith("; fix: " + result["fix"])
    (entry,) = result["fixes"]
    assert entry["fix"] == result["fix"]
    removal = {"ansible.builtin.command": "rm -f /var/lib/gpunode/run.lock", "become": True}
    assert removal in entry["tasks"], entry["tasks"]
    status = next(t for t in entry["tasks"] if "delegate_to" in t)
    assert status["ansible.builtin.command"].startswith("gpunode status --host root@127.0.0.1:"), status
    printed = re.search(r"\{ansible\.builtin\.command: [^}]*\}", result["fix"])
    assert printed is not None and "sudo" not in printed[0], result["fix"]
    pasted = ansible.playbook(f"- hosts: gpu\n  gather_facts: false\n  tasks:\n    - {printed[0]}\n")
    assert pasted.rc == 0, pasted
    assert node.ssh("test -L /var/lib/gpunode/run.lock")[0] == 1  # the link is gone
    again = ansible.playbook(play).results()["gpu-00"]
    assert again["_status"] != "failed" and again["state"] == "ready", again
