"""What undo needs to restore is recorded the same however it is looked up: the journal's undo records of a driver
upgrade (`install --driver 570 --stop-gpu-services` over 535 on an HGX H100) and of `uninstall --only runtime`
must equal the reference in data/undo_records.json. That reference was captured on the code where every undo
look-up was a remote command of its own (before they rode in the actions' own commands), so a change to how the
look-ups run that changed a record fails here.

The same runs count their remote commands (a spy on the SSH connection's `_exec`, `_hold` and `upload`): the
guards below say how many each flow may send, and the look-ups may add none.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpunode.cli import app
from gpunode.connection.ssh import SSHConnection
from gpunode.journal import JOURNAL_PATH
from tests.integration.test_reliability_runtime import install_runtime
from tests.integration.test_upgrade_nodesim import CHANNEL_LINE, NEW, hgx_with_535, mirror, run  # noqa: F401 - mirror: fixture
from tests.nodesim.fixtures import host_guard, nodesim_available, sim_node  # noqa: F401 - pytest fixtures

pytestmark = pytest.mark.integration

REFERENCE = Path(__file__).parent / "data" / "undo_records.json"
# per record, what differs from run to run: its id, its run's id and when it was made
VARYING = ("id", "run", "time", "undone")

# Remote commands, measured on the node simulator (issue 23). The upgrade: 39 when each undo look-up was a
# command of its own (7 of them), 32 since they ride in the command of the action they look around; 33 since the
# probe runs in two round trips (issue 25): what only a change reads (the processes holding the GPUs, for
# --stop-gpu-services) comes in a second one, which a converged run never sends; 32 since the stale temp-file
# sweep runs in the command that takes the node lock; 30 since the probe's first round trip runs in that command
# too and the lock's release rides on the journal's last write (gpunode/nodelock.py).
UPGRADE_COMMANDS = 30
# uninstall --only runtime: 12 with a look-up command each time the step planned (2); 10 since the files the
# probe reads come from its facts (the records name only daemon.json); 9 with the sweep in the lock's command;
# 7 with the first probe in the lock's command and the release in the journal's last write.
UNINSTALL_RUNTIME_COMMANDS = 7


def records(node) -> list[dict]:
    """The journal's undo records without what varies between runs (undone ones keep `undone: true`)."""
    found = json.loads(node.read(JOURNAL_PATH) or "{}").get("undo", [])
    return [{**{k: v for k, v in r.items() if k not in VARYING}, **({"undone": True} if r.get("undone") else {})}
            for r in found]


@pytest.fixture
def count_commands(monkeypatch):
    sent: list[str] = []

    def spy(name):
        real = getattr(SSHConnection, name)

        def counted(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            sent.append(name)
            return real(self, *args, **kwargs)
        monkeypatch.setattr(SSHConnection, name, counted)
    for name in ("_exec", "_hold", "upload"):
        spy(name)
    return sent


def check_reference(name: str, found: object) -> None:
    assert found == json.loads(REFERENCE.read_text())[name], json.dumps(found, indent=1)


def test_a_driver_upgrade_records_what_the_reference_records_in_few_commands(sim_node, mirror, tmp_path,  # noqa: F811
                                                                             count_commands):
    node = hgx_with_535(sim_node, mirror, tmp_path)
    count_commands.clear()
    result = run(node, tmp_path, "install", NEW, "--stop-gpu-services")
    assert result.exit_code == 0, result.output
    print(f"driver upgrade: {len(count_commands)} remote commands")
    check_reference("upgrade", records(node))
    assert len(count_commands) == UPGRADE_COMMANDS, count_commands


def test_uninstall_only_runtime_records_what_the_reference_records_in_few_commands(sim_node, count_commands):  # noqa: F811
    node = sim_node("ubuntu-22.04-t4", preinstalled_driver="535.129.03", toolkit_version="1.17.8-1",
                    engines=("docker",), sshd_log_level="DEBUG1")  # docker_node's, with sshd logging channels
    assert install_runtime(node).exit_code == 0
    installed = records(node)
    assert any(r["kind"] == "file" and r["path"] == "/etc/docker/daemon.json" for r in installed), installed
    count_commands.clear()
    opened = Path(node.sshd_log).read_text(errors="replace").count(CHANNEL_LINE)
    result = CliRunner().invoke(app, ["uninstall", *node.cli_args(), "--only", "runtime"])
    assert result.exit_code == 0, result.output
    print(f"uninstall --only runtime: {len(count_commands)} remote commands")
    check_reference("runtime", {"installed": installed, "uninstalled": records(node)})
    assert node.read("/etc/docker/daemon.json") is None
    assert len(count_commands) == UNINSTALL_RUNTIME_COMMANDS, count_commands
    # one channel: the command channel (the node lock no longer keeps one of its own)
    assert Path(node.sshd_log).read_text(errors="replace").count(CHANNEL_LINE) - opened == 1
