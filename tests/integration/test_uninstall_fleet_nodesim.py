"""`gpunode uninstall` on a fleet (several --host, or --inventory/--limit) over real sshd: three simulated nodes get
the toolkit, docker's nvidia runtime, the nouveau blacklist and node settings (their driver is preinstalled, so no
reboot), then one uninstall undoes them all in parallel; a node whose journal is corrupt fails alone, with the
journal's fix, and the others are undone. A second uninstall finds nothing to undo."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpunode.cli import app
from gpunode.journal import JOURNAL_PATH

pytestmark = pytest.mark.integration

cli = CliRunner()
DRIVER = "535.274.02"
PROFILES = ["ubuntu-22.04-t4", "rocky-9-t4", "debian-12-t4"]
PACKAGE = "nvidia-container-toolkit"


@pytest.fixture
def fleet(sim_fleet, tmp_path):
    nodes = sim_fleet([(p, {"preinstalled_driver": DRIVER, "nouveau_loaded": False, "engines": ("docker",)})
                       for p in PROFILES])
    kh = tmp_path / "known_hosts"
    kh.write_text("".join(Path(n.known_hosts).read_text() for n in nodes))
    args = [w for n in nodes for w in ("--host", f"root@{n.host}:{n.port}", "--identity", n.key_path)]
    return nodes, [*args, "--known-hosts", str(kh), "--connect-timeout", "10"]


def run(tmp_path, reach, *args):
    return cli.invoke(app, [*args, *reach, "--log-dir", str(tmp_path / "logs")])


def by_host(result) -> dict[str, dict]:
    assert result.stdout.startswith("{"), (result.output, result.exception)
    return {h["host"]: h for h in json.loads(result.stdout)["hosts"]}


def test_a_fleet_is_undone_in_parallel_and_a_node_with_a_corrupt_journal_fails_alone(fleet, tmp_path):
    nodes, reach = fleet
    names = [f"root@{n.host}:{n.port}" for n in nodes]
    done = run(tmp_path, reach, "install", "--json")
    assert done.exit_code == 0, done.output
    assert all(h["status"] == "changed" for h in by_host(done).values())
    assert all(PACKAGE in n.installed_packages() and "nvidia" in n.read("/etc/docker/daemon.json") for n in nodes)
    broken = nodes[2]
    broken.write(JOURNAL_PATH, "{ not json")
    broken_state = (broken.installed_packages(), broken.read("/etc/docker/daemon.json"))

    # --dry-run over the fleet: what each node would undo, nothing changes
    dry = run(tmp_path, reach, "uninstall", "--dry-run", "--json")
    hosts = by_host(dry)
    assert dry.exit_code == 1 and [hosts[n]["status"] for n in names] == ["planned", "planned", "failed"]
    assert all(PACKAGE in n.installed_packages() for n in nodes)

    undone = run(tmp_path, reach, "uninstall", "--json")
    assert undone.exit_code == 1, undone.output  # one node failed: the fleet's exit code is install's
    hosts = by_host(undone)
    for name, node in zip(names[:2], nodes[:2], strict=True):
        host = hosts[name]
        assert host["status"] == "changed" and host["nothing_to_undo"] is False, host
        steps = {s["step"]: s["result"] for s in host["report"]["steps"]}
        assert steps["toolkit"] == steps["runtime"] == steps["nouveau"] == "changed", steps
        assert host["report"]["mode"] == "uninstall"
        assert PACKAGE not in node.installed_packages() and not node.exists("/etc/modprobe.d/blacklist-nouveau.conf")
        daemon = node.read("/etc/docker/daemon.json")
        assert daemon is None or "nvidia" not in daemon
    failed = hosts[names[2]]
    assert failed["status"] == "failed" and "is not valid JSON" in failed["error"] and failed["report"] is None
    # the move runs on that node: through ssh, as printed
    assert failed["fix"].startswith("move it aside (it is only a record): ssh -t ")
    assert failed["fix"].endswith(f'"sudo mv {JOURNAL_PATH} {JOURNAL_PATH}.broken"')
    assert (broken.installed_packages(), broken.read("/etc/docker/daemon.json")) == broken_state  # untouched
    assert Path(failed["log"]).is_file() and "not valid JSON" in Path(failed["log"]).read_text()

    # human output: the grid, the failed node's fix
    human = run(tmp_path, reach, "uninstall")
    assert human.exit_code == 1
    assert "gpunode uninstall: 3 nodes" in human.stdout and f"sudo mv {JOURNAL_PATH}" in " ".join(human.stdout.split())

    # the journal moved aside as the fix says: every node now has nothing to undo (the broken one never had
    # readable records), and nothing is written
    broken.ssh(f"mv {JOURNAL_PATH} {JOURNAL_PATH}.broken")
    journals = [n.read(JOURNAL_PATH) for n in nodes[:2]]
    for node in nodes:
        node.clear_calls()
    again = run(tmp_path, reach, "uninstall", "--json")
    assert again.exit_code == 0, again.output
    hosts = by_host(again)
    assert all(h["status"] == "ok" and h["nothing_to_undo"] for h in hosts.values()), hosts
    assert [n.read(JOURNAL_PATH) for n in nodes[:2]] == journals and not broken.exists(JOURNAL_PATH)  # no run
    assert not [c for n in nodes for c in n.calls() if c[0] in ("apt-get", "dnf", "rm", "systemctl")
                and {"remove", "-f", "disable", "restart"} & set(c)]

    # --inventory / --limit pick the nodes as for install
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("[gpu]\n" + "".join(
        f"gpu-{i} ansible_host={n.host} ansible_port={n.port} ansible_user=root ansible_ssh_private_key_file={n.key_path}\n"
        for i, n in enumerate(nodes)))
    limited = cli.invoke(app, ["uninstall", "--inventory", str(inventory), "--limit", "gpu-0:gpu-2", "--known-hosts",
                               reach[reach.index("--known-hosts") + 1], "--log-dir", str(tmp_path / "logs2"), "--json"])
    assert limited.exit_code == 0, limited.output
    assert {h: r["nothing_to_undo"] for h, r in by_host(limited).items()} == {"gpu-0": True, "gpu-2": True}
