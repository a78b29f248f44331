"""`gpunode doctor` through typer's runner on fake nodes: the table, --json, exit codes, read-only."""

from __future__ import annotations

import json

from rich.console import Console
from typer.testing import CliRunner

from gpunode import connection
from gpunode.cli import app
from gpunode.cli.doctor import render_checks
from gpunode.doctor import CHECKS, run_checks
from gpunode.errors import ConnectError
from gpunode.facts import gather
from tests.cli.conftest import flat  # noqa: E402
from tests.doctor.fakes import finished, fresh, set_output
from tests.fakes.connection import FakeConnection

runner = CliRunner()


def test_finished_node_exits_0_with_a_table_grouped_by_layer(serve):
    serve(finished())
    result = runner.invoke(app, ["doctor", "--host", "gpu-01"])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert out.startswith("gpu-01: Ubuntu 22.04.5 LTS, kernel 5.15.0-91-generic x86_64; 1 NVIDIA GPU (10de:1eb8)")
    layers = [line.split()[0] for line in out.splitlines() if line and not line.startswith(" ") and
              line.split()[0] in ("hardware", "boot", "kernel", "driver", "cuda", "container", "fabric", "health",
                                  "packages")]
    assert layers == ["hardware", "boot", "kernel", "driver", "cuda", "container", "fabric", "health", "packages"]
    assert f"summary: {len(CHECKS) - 8} pass, 0 warn, 0 fail, 8 skip" in out  # 4 of them: Kubernetes (no kubelet)


def test_failures_show_the_fix_and_exit_1(serve):
    serve(fresh())
    result = runner.invoke(app, ["doctor", "--host", "gpu-01"])
    assert result.exit_code == 1
    out = flat(result.stdout)
    assert "kernel.nouveau-loaded fail nouveau is in /proc/modules" in out
    assert "fix: gpunode install --host gpu-01 --only nouveau --reboot" in out
    assert "failed: kernel.nouveau-loaded, kernel.nouveau-blacklisted, driver.loaded, container.toolkit-installed" in out


def test_warnings_alone_exit_0(serve):
    node = serve(finished())
    set_output(node, "doctor_dev_char", "dev /dev/nvidia0\n")
    result = runner.invoke(app, ["doctor", "--host", "gpu-01"])
    assert result.exit_code == 0 and "1 warn" in result.stdout
    assert "gpunode install --host gpu-01 --only nodesettings" in flat(result.stdout)


def test_json_document(serve):
    serve(fresh())
    result = runner.invoke(app, ["doctor", "--host", "gpu-01", "--json"])
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert set(data) == {"schema_version", "gpunode_version", "host", "node", "checks", "summary", "failures",
                         "warnings", "exit_code", "error"}
    assert data["schema_version"] == 1 and data["host"] == "gpu-01" and data["exit_code"] == 1 and data["error"] is None
    assert data["node"]["gpus"] == [{"pci": "0000:00:1e.0", "device_id": "10de:1eb8"}]
    assert len(data["checks"]) == len(CHECKS)
    assert set(data["checks"][0]) == {"id", "layer", "title", "status", "evidence", "fix"}
    assert sum(data["summary"].values()) == len(CHECKS) and set(data["summary"]) == {"pass", "warn", "fail", "skip"}
    assert data["failures"] == [c["id"] for c in data["checks"] if c["status"] == "fail"]
    assert data["summary"]["fail"] == len(data["failures"]) == 4


def test_connection_error_exits_2_and_json_says_why(monkeypatch):
    def refuse(spec):
        raise ConnectError("gpu-01: connection refused", fix="check that sshd runs on gpu-01")

    monkeypatch.setattr(connection, "open_connection", refuse)
    result = runner.invoke(app, ["doctor", "--host", "gpu-01"])
    assert result.exit_code == 2 and "connection refused" in result.output and "fix:" in result.output
    as_json = runner.invoke(app, ["doctor", "--host", "gpu-01", "--json"])
    assert as_json.exit_code == 2
    data = json.loads(as_json.stdout)
    assert data["error"] == {"message": "gpu-01: connection refused", "fix": "check that sshd runs on gpu-01"}
    assert data["checks"] == [] and data["exit_code"] == 2


def test_doctor_only_runs_the_probe(serve):
    node = serve(finished())
    files = dict(node.files)
    runner.invoke(app, ["doctor", "--host", "gpu-01"])
    assert node.files == files
    # `id -u` (is root available?) and the read-only probe: nothing else.
    assert [call[3] if call[:2] == ["sh", "-c"] else call[0] for call in node.calls] == ["id", "gpunode-probe"]


def test_render_checks_is_reusable_with_another_console():
    node = finished()
    facts = gather(FakeConnection(node))
    console = Console(record=True, width=160)
    render_checks("node-7", facts, run_checks(facts), console)
    text = console.export_text()
    assert text.startswith("node-7: Ubuntu 22.04.5 LTS") and "hw.gpu-present" in text and "summary:" in text
