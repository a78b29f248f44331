"""Ctrl-C on a single-node install (real SIGINT to this test process, caught by the install's handler): the
first stops at the next safe point with the recap and exit 130; the second stops at once. Nothing says done."""

from __future__ import annotations

import json
import os
import signal

import pytest
from typer.testing import CliRunner

from gpunode.cli import app
from gpunode.cli.pipeline import two_stage_interrupt
from gpunode.journal import JOURNAL_PATH
from tests.cli.conftest import flat
from tests.fakes.connection import FakeNode

runner = CliRunner()


def gpu_node() -> FakeNode:
    node = FakeNode(tools={"update-initramfs", "modprobe", "systemctl"})
    node.add_gpu(0x1EB8)
    return node


def ctrl_c(times: int):
    def handler(node, argv, stdin):
        for _ in range(times):
            os.kill(os.getpid(), signal.SIGINT)
        return 0, "", ""
    return handler


@pytest.mark.usefixtures("cli_owns_signals")  # gpunode's own handler (tests/conftest.py)
def test_first_ctrl_c_lets_the_running_command_finish_then_stops_with_the_recap(serve):
    node = serve(gpu_node())
    node.handlers["update-initramfs"] = ctrl_c(1)  # Ctrl-C while the initramfs is rebuilt
    result = runner.invoke(app, ["install", "--host", "gpu-01"])
    assert result.exit_code == 130, result.output
    assert "stopping at the next safe point" in flat(result.stderr)
    out = flat(result.stdout)
    assert "install interrupted" in out and "changed: nouveau" in out  # its last command ran to its end
    assert "not-run prerequisites, driver, compat, toolkit, runtime, fabricmanager, nodesettings, k8s: stopped " \
           "before step prerequisites: interrupted (Ctrl-C)" in out
    assert "1 changed, 8 not run; interrupted (Ctrl-C): the node is NOT ready" in out
    assert "fix: run the same command again" in out
    assert len(node.ran("update-initramfs")) == 1  # it finished; nothing after it ran
    assert node.ran("modprobe") == []
    assert json.loads(node.files[JOURNAL_PATH])["runs"][-1]["status"] == "interrupted"


@pytest.mark.usefixtures("cli_owns_signals")  # gpunode's own handler (tests/conftest.py)
def test_json_output_of_an_interrupted_install_says_interrupted(serve):
    node = serve(gpu_node())
    node.handlers["update-initramfs"] = ctrl_c(1)
    result = runner.invoke(app, ["install", "--host", "gpu-01", "--json"])
    assert result.exit_code == 130
    data = json.loads(result.stdout)
    assert data["summary"]["state"] == "interrupted" and data["steps"][1]["result"] == "not-run"
    assert data["fix"].startswith("run the same command again")


@pytest.mark.usefixtures("cli_owns_signals")  # gpunode's own handler (tests/conftest.py)
def test_second_ctrl_c_stops_at_once_and_the_journal_does_not_say_done(serve):
    node = serve(gpu_node())
    node.handlers["update-initramfs"] = ctrl_c(2)
    result = runner.invoke(app, ["install", "--host", "gpu-01"])
    assert result.exit_code == 130, result.output
    assert "aborted (Ctrl-C twice)" in flat(result.stdout)
    assert "Traceback" not in result.output
    assert json.loads(node.files[JOURNAL_PATH])["runs"][-1]["status"] == "interrupted"


@pytest.mark.usefixtures("cli_owns_signals")  # gpunode's own handler (tests/conftest.py)
def test_the_handler_is_restored_after_the_run():
    before = signal.getsignal(signal.SIGINT)
    with two_stage_interrupt() as token:
        os.kill(os.getpid(), signal.SIGINT)
        assert token.cancelled and not token.aborted
    assert signal.getsignal(signal.SIGINT) is before


@pytest.mark.usefixtures("cli_owns_signals")  # gpunode's own handler (tests/conftest.py)
def test_fleet_ctrl_c_marks_the_running_node_interrupted_skips_the_rest_and_exits_130(serve, tmp_path):
    node = serve(gpu_node())  # every --host reaches this one fake node, one at a time (--parallel 1)
    node.handlers["update-initramfs"] = ctrl_c(1)
    result = runner.invoke(app, ["install", "--host", "gpu-01", "--host", "gpu-02", "--parallel", "1",
                                 "--log-dir", str(tmp_path / "logs"), "--json"])
    assert result.exit_code == 130, result.output
    data = json.loads(result.stdout)
    status = {h["host"]: h["status"] for h in data["hosts"]}
    assert status == {"gpu-01": "interrupted", "gpu-02": "skipped"}
    first = data["hosts"][0]["report"]
    assert first["summary"]["state"] == "interrupted" and first["steps"][1]["result"] == "not-run"
    log = (tmp_path / "logs" / "gpu-01.log").read_text()
    assert "interrupted: stopped before step prerequisites" in log
    assert '"schema_version"' not in log  # the report (with file diffs) goes into the log at debug level only


def test_fleet_log_level_debug_writes_the_report_into_the_log(serve, tmp_path):
    serve(gpu_node())
    result = runner.invoke(app, ["plan", "--host", "gpu-01", "--host", "gpu-02", "--log-dir", str(tmp_path / "l"),
                                 "--log-level", "debug", "--skip", "driver", "--json"])
    assert result.exit_code == 0, result.output
    assert '"schema_version"' in (tmp_path / "l" / "gpu-01.log").read_text()


def test_a_bad_log_level_is_refused_before_anything_runs(serve, tmp_path):
    serve(gpu_node())
    result = runner.invoke(app, ["plan", "--host", "a", "--host", "b", "--log-level", "loud",
                                 "--log-dir", str(tmp_path / "x")])
    assert result.exit_code == 2 and "--log-level 'loud' is not one of info, debug" in flat(result.stderr)
    assert not (tmp_path / "x").exists()


def test_a_bug_while_planning_prints_the_error_and_fix_without_a_traceback(serve, monkeypatch):
    from gpunode.steps.base import Step

    node = serve(gpu_node())

    def broken(self, facts, options, plans):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(Step, "plan_with", broken)
    for command in ("plan", "install"):
        result = runner.invoke(app, [command, "--host", "gpu-01"])
        assert result.exit_code == 1, result.output
        shown = flat(result.output)
        assert "error: internal error: ZeroDivisionError: division by zero" in shown and "this is a bug" in shown
        assert "Traceback" not in result.output
    assert node.changing_calls() == []
