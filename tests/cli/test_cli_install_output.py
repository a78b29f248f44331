"""What install and plan print: what happened (not the plan again), whether the node is ready, what next;
control-machine actions labelled as such; no wrapping on a pipe; indented fix continuation lines."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass

import pytest
from typer.testing import CliRunner

from gpunode import connection
from gpunode import runner as runner_module
from gpunode.cli import app
from gpunode.cli._pipeline_view import render_plan
from gpunode.plan import Action, Status, StepPlan
from gpunode.runner import RunReport, StepOutcome
from gpunode.ui import SafeConsole
from tests.cli.conftest import flat
from tests.fakes.connection import FakeConnection, FakeNode

runner = CliRunner()


@pytest.fixture(autouse=True)
def _fast_reboots(monkeypatch):
    monkeypatch.setattr(runner_module, "REBOOT_POLL_SECONDS", 0.0)


@pytest.fixture
def node(monkeypatch):
    node = FakeNode(tools={"update-initramfs", "modprobe", "systemctl"})
    node.add_gpu(0x1EB8)
    monkeypatch.setattr(connection, "open_connection", lambda spec: FakeConnection(node, name=spec.host))
    return node


def test_a_finished_install_says_what_changed_and_shows_each_step_once(node):
    result = runner.invoke(app, ["install", "--host", "gpu-01", "--skip", "driver"])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "changed: nouveau" in out and "already ok: prerequisites" in out
    assert "summary: 1 changed, 7 already ok" in out and "change" not in out.replace("changed", "")
    # the step was shown live on stderr; stdout is the recap, not the plan again
    assert "blacklist nouveau in /etc/modprobe.d" in result.stderr
    assert "$ " not in out and "+blacklist nouveau" not in out
    assert out.count("nouveau") == 1
    # no driver yet: every step is done but the node is not called ready, and next says what to run
    assert "no NVIDIA driver is loaded" in out and "the node is ready" not in out
    assert "next: gpunode doctor --host gpu-01" in flat(out)


def test_install_json_summary_reports_results_not_the_plan(node):
    data = json.loads(runner.invoke(app, ["install", "--host", "gpu-01", "--skip", "driver", "--json"]).stdout)
    summary = data["summary"]
    assert summary["steps"]["changed"] == 1 and summary["steps"]["ok"] == 7 and summary["steps"]["planned"] == 0
    assert summary["state"] == "ready" and summary["changes_pending"] is False
    assert summary["ready"] is False  # no driver loaded
    assert summary["next"].startswith("gpunode doctor --host gpu-01")


def test_a_ready_node_is_sent_to_verify(node):
    node.nvidia_version = "580.95.05"  # the fake node reports this driver as loaded
    result = runner.invoke(app, ["install", "--host", "gpu-01", "--only", "nouveau"])
    assert result.exit_code == 0, result.output
    assert "the node is ready" in result.stdout
    assert "next: gpunode verify --host gpu-01" in flat(result.stdout)
    data = json.loads(runner.invoke(app, ["install", "--host", "gpu-01", "--only", "nouveau", "--json"]).stdout)
    assert data["summary"]["ready"] is True and data["summary"]["next"].startswith("gpunode verify --host gpu-01")


def test_reboot_pending_is_counted_as_such_never_as_blocked(node):
    node.modules.add("nouveau")
    result = runner.invoke(app, ["install", "--host", "gpu-01", "--only", "nouveau"])
    assert result.exit_code == 3
    out = flat(result.stdout)
    assert "1 reboot-pending" in out and "blocked" not in out
    assert "a reboot is required before it is ready" in out
    assert "next: gpunode install --host gpu-01 --only nouveau --reboot" in out
    data = json.loads(runner.invoke(app, ["install", "--host", "gpu-01", "--only", "nouveau", "--json"]).stdout)
    assert data["summary"]["steps"]["reboot-pending"] == 1 and data["summary"]["steps"]["blocked"] == 0
    assert data["summary"]["state"] == "reboot-pending" and data["summary"]["changes_pending"] is True


def test_plan_next_is_the_same_command_as_install(node):
    node.modules.add("nouveau")
    result = runner.invoke(app, ["plan", "--host", "gpu-01", "--only", "nouveau", "--lock-timeout", "30"])
    assert result.exit_code == 0
    assert "next: gpunode install --host gpu-01 --only nouveau --lock-timeout 30" in flat(result.stdout)
    assert "nothing was changed" in result.stdout


@dataclass(frozen=True)
class _Download(Action):
    kind = "download"
    where = "control"

    def commands(self) -> list[str]:
        return ["curl -o /tmp/x https://example.invalid/x.run"]

    def details(self) -> list[str]:
        return ["from https://example.invalid/x.run"]

    def apply(self, conn: object) -> None:
        return None


@dataclass(frozen=True)
class _OnNode(Action):
    kind = "command"

    def commands(self) -> list[str]:
        return ["sh /tmp/x.run --silent"]

    def apply(self, conn: object) -> None:
        return None


def _render(report: RunReport, width: int = 200, terminal: bool = False) -> str:
    buffer = io.StringIO()
    render_plan(report, SafeConsole(file=buffer, width=width, force_terminal=terminal))
    return buffer.getvalue()


def test_control_machine_actions_are_labelled_and_never_shown_as_node_commands():
    plan = StepPlan("driver", Status.CHANGE, "install driver",
                    (_Download("download NVIDIA-Linux-x86_64-580.95.05.run"), _OnNode("run the installer")))
    report = RunReport("gpu-01", "plan", outcomes=[StepOutcome("driver", "Driver", plan, "planned")])
    text = _render(report)
    assert "on this machine: download NVIDIA-Linux-x86_64-580.95.05.run" in text
    assert "$ curl" not in text and "curl" not in text
    assert "- from https://example.invalid/x.run" in text
    assert "$ sh /tmp/x.run --silent" in text


def test_a_pipe_gets_unwrapped_lines_and_a_narrow_terminal_indents_fix_continuations():
    url = "https://us.download.nvidia.com/tesla/580.95.05/NVIDIA-Linux-x86_64-580.95.05.run" * 2
    plan = StepPlan("driver", Status.BLOCKED, "cannot fetch " + url, fix="gpunode install --driver-run " + url +
                    " --sha256 0123456789abcdef")
    report = RunReport("gpu-01", "plan", outcomes=[StepOutcome("driver", "Driver", plan, "blocked")])
    piped = io.StringIO()
    render_plan(report, SafeConsole(file=piped))  # not a terminal, no width given: nothing wraps
    assert url in piped.getvalue()
    assert not any(line != line.rstrip() for line in piped.getvalue().splitlines())  # no trailing padding
    narrow = _render(report, width=60)
    lines = narrow.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("  fix: "))
    continuation = lines[start + 1]
    assert continuation.startswith(" " * len("  fix: ")) and continuation.strip()


@pytest.mark.parametrize("args, progress", [(["--json"], False), ([], True), (["-H", "a", "-H", "b"], False)])
def test_progress_bars_are_off_for_json_and_fleets(monkeypatch, node, tmp_path, args, progress):
    from gpunode.cli import pipeline

    seen = []

    def capture(conn, steps, options, reporter=None, first=None):
        seen.append(options.progress is not None)
        return runner_module.plan_pipeline(conn, steps, options)

    monkeypatch.setattr(pipeline, "apply_pipeline", capture)
    hosts = args if "-H" in args else ["--host", "gpu-01", *args]
    runner.invoke(app, ["install", *hosts, "--only", "nouveau", "--log-dir", str(tmp_path)])
    assert seen and set(seen) == {progress}


def test_a_stop_found_before_any_change_says_so_in_one_line_per_reason(monkeypatch):
    from gpunode.facts import containers as c
    from tests.steps.test_runtime import FIXTURES, make_node
    text = (FIXTURES / "docker-daemon-json" / "nvidia-ctk-style_args-key_default-runtime-first.json").read_text()
    blocked, _ = make_node(files={c.DOCKER_CONFIG: text}, tools={"update-initramfs", "modprobe", "systemctl"})
    blocked.tools.discard(c.RUNTIME_BINARY)  # the runtime step is blocked for good: found before any change
    monkeypatch.setattr(connection, "open_connection", lambda spec: FakeConnection(blocked, name=spec.host))
    result = runner.invoke(app, ["install", "--host", "gpu-01"])
    assert result.exit_code == 1, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "gpu-01: install stopped before changing anything" and "finished" not in result.stdout
    not_run = [line for line in lines if line.startswith("not-run")]
    assert not_run == ["not-run nouveau, prerequisites, driver, compat, toolkit, fabricmanager, nodesettings, k8s: "
                       "step runtime cannot finish (checked before any change)"]
    assert blocked.changing_calls() == []


def test_a_finished_install_still_says_finished(node):
    result = runner.invoke(app, ["install", "--host", "gpu-01", "--only", "nouveau"])
    assert result.stdout.splitlines()[0] == "gpu-01: install finished", result.output
