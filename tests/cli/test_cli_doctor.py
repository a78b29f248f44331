"""`gpunode doctor` through typer's runner on fake nodes: the table, --json, exit codes, read-only."""

from __future__ import annotations

import json
import os

from rich.console import Console
from typer.testing import CliRunner

from gpunode import connection
from gpunode.cli import app
from gpunode.cli.doctor import render_checks
from gpunode.doctor import CHECKS, CheckResult, run_checks
from gpunode.errors import ConnectError
from gpunode.facts import FULL, gather
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
    # 10 skip: 4 Kubernetes (no kubelet), hw.iommu (no GPU bound to vfio-pci), driver.packages-held (a .run
    # driver) and 4 more that do not apply
    assert f"summary: {len(CHECKS) - 10} pass, 0 warn, 0 fail, 10 skip" in out


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
    set_output(node, "doctor_dev_char", "dev /dev/nvidia0\ndev /dev/nvidia-uvm\nlink 510:0 ../nvidia-uvm\n")
    result = runner.invoke(app, ["doctor", "--host", "gpu-01"])
    assert result.exit_code == 0 and "1 warn" in result.stdout
    assert "gpunode install --host gpu-01 --only nodesettings" in flat(result.stdout)


def test_json_document(serve):
    serve(fresh())
    result = runner.invoke(app, ["doctor", "--host", "gpu-01", "--json"])
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert set(data) == {"schema_version", "gpunode_version", "host", "node", "checks", "summary", "failures",
                         "warnings", "exit_code", "error", "readiness"}
    assert data["schema_version"] == 1 and data["host"] == "gpu-01" and data["exit_code"] == 1 and data["error"] is None
    assert data["node"]["gpus"] == [{"pci": "0000:00:1e.0", "device_id": "10de:1eb8"}]
    assert len(data["checks"]) == len(CHECKS)
    assert set(data["checks"][0]) == {"id", "layer", "title", "status", "evidence", "fix", "reboot"}
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
    facts = gather(FakeConnection(node), FULL)
    console = Console(record=True, width=160)
    render_checks("node-7", facts, run_checks(facts), console)
    text = console.export_text()
    assert text.startswith("node-7: Ubuntu 22.04.5 LTS") and "hw.gpu-present" in text and "summary:" in text


def test_format_nhc_prints_one_drain_line_and_exits_1(serve):
    serve(fresh())
    result = runner.invoke(app, ["doctor", "--host", "gpu-01", "--format", "nhc"])
    assert result.exit_code == 1
    assert result.stdout.count("\n") == 1
    assert result.stdout.startswith("ERROR: gpunode: gpu-01: kernel.nouveau-loaded: nouveau is in /proc/modules")


def test_format_nhc_is_silent_on_a_ready_node(serve):
    serve(finished())
    result = runner.invoke(app, ["doctor", "--host", "gpu-01", "--format", "nhc"])
    assert result.exit_code == 0 and result.stdout == ""


def test_json_alias_and_format_json_agree(serve):
    serve(fresh())
    a = json.loads(runner.invoke(app, ["doctor", "--host", "gpu-01", "--json"]).stdout)
    b = json.loads(runner.invoke(app, ["doctor", "--host", "gpu-01", "--format", "json"]).stdout)
    assert a == b and a["readiness"]["ready"] is False and a["readiness"]["reason"].startswith("kernel.nouveau-loaded")


def test_k8s_files_written_locally_and_removed_when_no_longer_true(serve, tmp_path):
    node = serve(finished())
    ready, marker = tmp_path / "ready", tmp_path / "reboot-required"
    args = ["doctor", "--format", "k8s", "--ready-file", str(ready), "--reboot-marker", str(marker)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0 and json.loads(ready.read_text())["ready"] is True and not marker.exists()
    set_output(node, "doctor_reboot_flag", "required\n")
    set_output(node, "driver_smi", "Failed to initialize NVML: Driver/library version mismatch\n", 18)
    result = runner.invoke(app, args)
    assert result.exit_code == 1 and not ready.exists()
    assert marker.read_text().startswith("gpunode: reboot required\n")
    assert json.loads(result.stdout)["reboot_required"] is True


def test_files_are_not_written_for_a_remote_node(serve, tmp_path):
    serve(finished())
    ready, prom = tmp_path / "ready", tmp_path / "gpunode.prom"
    result = runner.invoke(app, ["doctor", "--host", "gpu-01", "--format", "k8s", "--ready-file", str(ready)])
    assert result.exit_code == 0 and not ready.exists() and json.loads(result.stdout)["ready"] is True
    result = runner.invoke(app, ["doctor", "--host", "gpu-01", "--format", "prometheus", "--textfile", str(prom)])
    assert not prom.exists() and "gpunode_node_ready 1" in result.stdout


def test_prometheus_textfile_written_locally(serve, tmp_path):
    serve(finished())
    prom = tmp_path / "gpunode.prom"
    result = runner.invoke(app, ["doctor", "--format", "prometheus", "--textfile", str(prom)])
    assert result.exit_code == 0 and result.stdout == ""
    assert "gpunode_node_ready 1\n" in prom.read_text() and os.listdir(tmp_path) == ["gpunode.prom"]


def test_format_usage_errors_exit_2(serve):
    serve(finished())
    for args, says in ((["--format", "xml"], "not a format"), (["--json", "--format", "nhc"], "two formats"),
                       (["--ready-file", "/tmp/x"], "--format k8s"), (["--textfile", "/tmp/x"], "--format prometheus")):
        result = runner.invoke(app, ["doctor", "--host", "gpu-01", *args])
        assert result.exit_code == 2 and says in result.output, (args, result.output)


def _render(width: int) -> tuple[str, list[CheckResult]]:
    import io

    from gpunode.ui import SafeConsole
    facts = gather(FakeConnection(fresh()), FULL)
    results = run_checks(facts)
    buffer = io.StringIO()
    render_checks("gpu-01", facts, results, SafeConsole(file=buffer, width=width), fixer=lambda fix: fix)
    return buffer.getvalue(), results


def _assert_stacked_at_80(text: str, results) -> None:
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    for r in results:
        # the check and its status share one line; nothing else is squeezed beside them
        (row,) = [i for i, line in enumerate(lines) if line.split()[:1] == [r.id]]
        assert lines[row].split() == [r.id, r.status]
        # the evidence follows on its own indented lines, whole words, in order
        below = []
        for line in lines[row + 1:]:
            if not line.startswith("      ") or line.strip().startswith("fix:"):
                break
            below.append(line.strip())
        assert " ".join(below) == " ".join(r.evidence.split()), (r.id, below)


def test_at_80_columns_each_check_is_one_line_with_its_evidence_under_it():
    text, results = _render(80)
    _assert_stacked_at_80(text, results)
    failed = next(r for r in results if r.status == "fail" and r.fix)
    assert f"fix: {failed.fix.split()[0]}" in text


def test_a_wide_console_keeps_the_table():
    text, results = _render(200)
    first = results[0]
    row = next(line for line in text.splitlines() if first.id in line)
    assert row.split()[:3] == [first.layer, first.id, first.status] and first.evidence.split()[0] in row


def test_the_real_process_piped_with_columns_80_is_readable():
    # this machine, read-only (as test_cli's local doctor): what `COLUMNS=80 gpunode doctor | less` shows
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-m", "gpunode", "doctor"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "COLUMNS": "80"})
    assert done.returncode in (0, 1), done.stderr
    lines = done.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    ids = [c.id for c in CHECKS]
    rows = [line.split() for line in lines if line.split()[:1] and line.split()[0] in ids]
    assert len(rows) == len(ids) and all(len(row) == 2 for row in rows)
