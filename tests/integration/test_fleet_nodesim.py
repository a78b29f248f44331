"""Fleet mode over real sshd (issue 8): 20 simulated nodes of mixed profiles from an Ansible inventory, one
unreachable and one with a changed host key, in parallel, with batches and --max-fail."""

import json
import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpunode import runner as gpunode_runner
from gpunode.cli import app

cli = CliRunner()

PROFILES = ["ubuntu-22.04-t4", "rocky-9-t4", "ubuntu-24.04-rtx4090", "debian-12-t4", "ubuntu-22.04-nogpu"]


@pytest.fixture(autouse=True)
def _fast_reboot_polls(monkeypatch):
    monkeypatch.setattr(gpunode_runner, "REBOOT_POLL_SECONDS", 0.2)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def fleet(sim_fleet, tmp_path):
    """18 reachable nodes + a dead address + a node whose recorded host key is another node's."""
    nodes = sim_fleet([PROFILES[i % len(PROFILES)] for i in range(19)])
    reachable, impostor = nodes[:18], nodes[18]
    known = "".join(Path(n.known_hosts).read_text() for n in reachable)
    # gpu-changed is impostor's address, but known_hosts holds node 0's key for it: the key "changed".
    first_key = Path(reachable[0].known_hosts).read_text().split(" ", 1)[1]
    known += f"[127.0.0.1]:{impostor.port} {first_key}"
    kh = tmp_path / "known_hosts"
    kh.write_text(known)
    lines = ["[gpus]"]
    lines += [f"gpu-{i:02d} ansible_host=127.0.0.1 ansible_port={n.port} ansible_ssh_private_key_file={n.key_path}"
              for i, n in enumerate(reachable)]
    lines += [f"gpu-dead ansible_host=127.0.0.1 ansible_port={closed_port()} "
              f"ansible_ssh_private_key_file={reachable[0].key_path}",
              f"gpu-changed ansible_host=127.0.0.1 ansible_port={impostor.port} "
              f"ansible_ssh_private_key_file={impostor.key_path}",
              "", "[gpus:vars]", "ansible_user=root", "", "[rack:children]", "gpus"]
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("\n".join(lines) + "\n")
    return reachable, impostor, inventory, kh


def run(inventory, kh, tmp_path, *args):
    return cli.invoke(app, [*args, "--inventory", str(inventory), "--known-hosts", str(kh), "--connect-timeout", "5",
                            "--log-dir", str(tmp_path / "logs"), "--json"])


def test_twenty_nodes_converge_and_two_bad_ones_do_not_stop_the_others(fleet, tmp_path):
    reachable, impostor, inventory, kh = fleet
    result = run(inventory, kh, tmp_path, "install", "--only", "nouveau", "--reboot", "--parallel", "8")
    assert result.stdout.startswith("{"), (result.output, result.exception)
    data = json.loads(result.stdout)
    by_host = {h["host"]: h for h in data["hosts"]}
    assert len(by_host) == 20
    assert by_host["gpu-dead"]["status"] == "unreachable" and "cannot connect" in by_host["gpu-dead"]["error"]
    assert by_host["gpu-changed"]["status"] == "unreachable" and "CHANGED" in by_host["gpu-changed"]["error"]
    good = [by_host[f"gpu-{i:02d}"] for i in range(18)]
    assert all(h["status"] in ("changed", "ok") for h in good), [(h["host"], h["status"], h["error"]) for h in good]
    with_gpu = [n for n in reachable if "nogpu" not in n.profile.name]
    assert with_gpu and all(not n.is_loaded("nouveau") for n in with_gpu)  # converged, through a reboot
    assert all(n.reboots == 1 for n in with_gpu) and all(n.reboots == 0 for n in reachable if n not in with_gpu)
    assert impostor.calls() == [] or all(c[0] != "update-initramfs" for c in impostor.calls())
    assert result.exit_code == 1  # two nodes failed
    log = Path(by_host["gpu-00"]["log"]).read_text()
    assert "update-initramfs -u" in log or "dracut -f" in log

    # A second pass over the fleet finds nothing to do anywhere it can reach.
    again = json.loads(run(inventory, kh, tmp_path, "plan", "--only", "nouveau", "--limit", "gpus:!gpu-dead:!gpu-changed"
                           ).stdout)
    assert {h["status"] for h in again["hosts"]} == {"ok"} and len(again["hosts"]) == 18


def test_batches_and_max_fail(fleet, tmp_path):
    reachable, impostor, inventory, kh = fleet
    # Put the two bad nodes first: the first batch of 5 has 2 failures = 10% of 20 > 5%: no more batches.
    text = inventory.read_text().splitlines()
    bad = [line for line in text if line.startswith(("gpu-dead", "gpu-changed"))]
    rest = [line for line in text if line not in bad]
    inventory.write_text("\n".join([rest[0], *bad, *rest[1:]]) + "\n")
    result = run(inventory, kh, tmp_path, "plan", "--only", "nouveau", "--batch", "5", "--max-fail", "5%")
    hosts = json.loads(result.stdout)["hosts"]
    statuses = [h["status"] for h in hosts]
    assert statuses[:2] == ["unreachable", "unreachable"]
    assert all(s != "skipped" for s in statuses[:5]) and statuses[5:] == ["skipped"] * 15
    assert "--max-fail 5%" in hosts[10]["error"]
    assert result.exit_code == 1
    # Without --max-fail every batch runs.
    hosts = json.loads(run(inventory, kh, tmp_path, "plan", "--only", "nouveau", "--batch", "25%").stdout)["hosts"]
    assert sum(h["status"] == "skipped" for h in hosts) == 0 and len(hosts) == 20


def test_doctor_across_a_fleet_is_one_table(sim_fleet, tmp_path):
    a, b = sim_fleet(["ubuntu-22.04-t4", "rocky-9-nogpu"])
    kh = tmp_path / "kh"
    kh.write_text(Path(a.known_hosts).read_text() + Path(b.known_hosts).read_text())
    args = ["doctor", "--host", f"root@127.0.0.1:{a.port}", "--host", f"root@127.0.0.1:{b.port}",
            "--identity", str(a.key_path), "--identity", str(b.key_path), "--known-hosts", str(kh),
            "--log-dir", str(tmp_path / "logs")]
    human = cli.invoke(app, args)
    assert human.exit_code == 1  # the T4 node has nouveau loaded, the other has no GPU
    assert "kernel.nouveau-loaded" in human.stdout and "hw.gpu-present" in human.stdout
    data = json.loads(cli.invoke(app, [*args, "--json"]).stdout)
    checks = {h["host"]: {c["id"]: c["status"] for c in h["checks"]} for h in data["hosts"]}
    assert checks[f"root@127.0.0.1:{a.port}"]["kernel.nouveau-loaded"] == "fail"
    assert checks[f"root@127.0.0.1:{b.port}"]["hw.gpu-present"] == "fail"
