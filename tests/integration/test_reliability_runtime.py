"""The runtime step under faults, on simulated nodes whose docker keeps running its OLD configuration until it is
restarted (like dockerd): a run cut between `nvidia-ctk runtime configure` and the restart leaves a "restart
pending" record in the journal (written with the change), doctor reports the drift with a fix that works, and a
re-run makes the restart although the file already matches. Drift is also found without the journal, from what
the running daemon reports (`docker info`)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gpunode.cli import app
from gpunode.connection.ssh import SSHConnection, SSHOptions
from gpunode.errors import ConnectError
from gpunode.journal import JOURNAL_PATH
from gpunode.options import Options
from gpunode.runner import apply_pipeline
from gpunode.steps import runtime
from tests.nodesim.fixtures import host_guard, nodesim_available, sim_node  # noqa: F401 - pytest fixtures

pytestmark = pytest.mark.integration
cli = CliRunner()
RESTART = ("systemctl", "restart", "docker.service")


class CutBeforeRestart(SSHConnection):
    """The connection dies right after the config change, before the engine restart can be sent."""

    def run(self, cmd, *args, **kwargs):  # type: ignore[no-untyped-def]
        if tuple(getattr(cmd, "args", cmd)) == RESTART or cmd == RESTART:
            self.close()
            raise ConnectError(f"{self.name}: the SSH connection dropped while running a command (test cut)",
                               fix="the node may have rebooted or lost its network; run again")
        return super().run(cmd, *args, **kwargs)


def docker_node(sim_node):  # noqa: F811
    return sim_node("ubuntu-22.04-t4", preinstalled_driver="535.129.03", toolkit_version="1.17.8-1",
                    engines=("docker",))


def loaded_runtimes(node) -> list[str]:
    code, out, err = node.ssh("docker info --format '{{json .Runtimes}}'")
    assert code == 0, err
    return sorted(json.loads(out))


def journal(node) -> dict:
    return json.loads(node.read(JOURNAL_PATH) or "{}")


def restarts(node) -> list[list[str]]:
    return [c for c in node.calls("systemctl") if c[1:2] == ["restart"]]


def install_runtime(node, *extra):
    return cli.invoke(app, ["install", *node.cli_args(), "--only", "runtime", *extra])


def test_cut_between_config_change_and_restart_is_recorded_reported_and_finished_by_a_rerun(sim_node):  # noqa: F811
    node = docker_node(sim_node)
    assert "nvidia" not in loaded_runtimes(node)
    conn = CutBeforeRestart(f"root@127.0.0.1:{node.port}",
                            SSHOptions(identity=[str(node.key_path)], known_hosts=[str(node.known_hosts)]))
    with conn:
        report = apply_pipeline(conn, (runtime.STEP,), Options())
    outcome = report.outcomes[0]
    assert outcome.result == "failed" and "connection dropped" in (outcome.error or "")
    assert outcome.fix and "run again" in outcome.fix
    assert "nvidia" in json.loads(node.read("etc/docker/daemon.json"))["runtimes"]  # the file changed...
    assert "nvidia" not in loaded_runtimes(node)  # ...the daemon did not load it
    record = journal(node)
    assert [p["target"] for p in record["pending"]] == ["docker.service"]
    assert record["runs"][-1]["status"] == "failed"
    assert record["runs"][-1]["changes"][0]["owes"] == [["restart", "docker.service"]]

    doctor = cli.invoke(app, ["doctor", *node.cli_args(), "--json"])
    found = {c["id"]: c for c in json.loads(doctor.stdout)["checks"]}["container.runtime-loaded"]
    assert found["status"] == "fail" and "has not loaded it" in found["evidence"]
    assert "gpunode install" in found["fix"] and "--only runtime --engine docker" in found["fix"]

    planned = cli.invoke(app, ["plan", *node.cli_args(), "--only", "runtime"])
    assert planned.exit_code == 0 and "restart pending" in " ".join(planned.stdout.split())
    node.clear_calls()
    again = install_runtime(node)  # the fix doctor printed (and verify's): it must actually restart
    assert again.exit_code == 0, again.output
    assert restarts(node) == [["systemctl", "restart", "docker.service"]]
    assert "nvidia" in loaded_runtimes(node)
    assert journal(node)["pending"] == []

    node.clear_calls()
    last = install_runtime(node)
    assert last.exit_code == 0 and restarts(node) == [] and "1 already ok" in last.stdout


def test_drift_without_the_journal_is_found_from_what_the_daemon_loaded(sim_node):  # noqa: F811
    node = docker_node(sim_node)
    code, _, err = node.ssh("nvidia-ctk runtime configure --runtime=docker")  # by hand, and no restart
    assert code == 0, err
    assert node.read(JOURNAL_PATH) is None and "nvidia" not in loaded_runtimes(node)
    planned = cli.invoke(app, ["plan", *node.cli_args(), "--only", "runtime", "--json"])
    step = json.loads(planned.stdout)["steps"][0]
    assert step["status"] == "change" and "running daemon has not loaded the nvidia runtime" in step["reason"]
    assert [a["kind"] for a in step["actions"]] == ["service"]
    node.clear_calls()
    assert install_runtime(node).exit_code == 0
    assert "nvidia" in loaded_runtimes(node) and len(restarts(node)) == 1
    node.clear_calls()
    assert install_runtime(node).exit_code == 0 and restarts(node) == []


def test_containerd_drift_is_found_from_what_the_running_daemon_loaded(sim_node):  # noqa: F811
    node = sim_node("ubuntu-22.04-t4", preinstalled_driver="535.129.03", toolkit_version="1.17.8-1",
                    engines=("containerd",))
    code, out, err = node.ssh("crictl info")
    assert code == 0, err
    assert "nvidia" not in json.loads(out)["config"]["containerd"]["runtimes"]
    code, _, err = node.ssh("nvidia-ctk runtime configure --runtime=containerd")  # by hand, no restart
    assert code == 0, err
    planned = cli.invoke(app, ["plan", *node.cli_args(), "--only", "runtime", "--json"])
    step = json.loads(planned.stdout)["steps"][0]
    assert step["status"] == "change" and "running daemon has not loaded the nvidia runtime" in step["reason"], step
    assert [a["kind"] for a in step["actions"]] == ["service"]
    node.clear_calls()
    assert install_runtime(node).exit_code == 0
    assert [c for c in node.calls("systemctl") if c[1:2] == ["restart"]] == [["systemctl", "restart",
                                                                              "containerd.service"]]
    code, out, _ = node.ssh("crictl info")
    assert "nvidia" in json.loads(out)["config"]["containerd"]["runtimes"]
    node.clear_calls()
    assert install_runtime(node).exit_code == 0 and [c for c in node.calls("systemctl") if c[1:2] == ["restart"]] == []
