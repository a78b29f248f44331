"""`--progress jsonl` (gpunode/cli/events.py), `--local`, and the exit codes an engine acts on: 0 done, 1 failed or
blocked, 2 usage, 3 reboot required. The event stream is validated strictly, line by line, against schema 1."""

from __future__ import annotations

import io
import json
import re

import pytest
from typer.testing import CliRunner

from gpunode import connection
from gpunode import runner as runner_module
from gpunode.cli import app
from gpunode.cli.events import EVENTS, JsonlReporter
from gpunode.connection.local import LocalConnection
from gpunode.plan import RunCommand, Status, StepPlan
from gpunode.runner import RESULTS, RunReport, StepOutcome
from gpunode.steps import nouveau
from tests.cli.conftest import flat
from tests.fakes.connection import FakeConnection, FakeNode

runner = CliRunner()
COMMON = {"schema", "event", "time", "host"}
FIELDS = {
    "run_start": {"mode", "gpunode_version", "steps", "node"},
    "step_planned": {"step", "status", "reason", "actions", "reboot_required"},
    "action_start": {"step", "action"},
    "action_end": {"step", "action", "result", "detail"},
    "message": {"text"},
    "step_result": {"step", "result", "reason", "error", "fix"},
    "reboot_required": {"step", "reason"},
    "run_end": {"mode", "state", "exit_code", "ready", "reboot_required", "reboots", "error", "fix", "next"},
}
TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


def check_event(event: dict) -> None:
    assert set(event) == COMMON | FIELDS[event["event"]], event
    assert event["schema"] == 1 and TIME.match(event["time"]) and isinstance(event["host"], str)
    kind = event["event"]
    if kind == "step_planned":
        assert event["status"] in ("ok", "change", "blocked", "unknown") and isinstance(event["actions"], list)
        assert isinstance(event["reboot_required"], bool)
    if kind == "step_result":
        assert event["result"] in RESULTS
    if kind == "action_end":
        assert event["result"] in ("done", "failed")
    if kind == "run_end":
        assert event["exit_code"] in (0, 1, 3, 130) and isinstance(event["ready"], bool)


def check_stream(stdout: str) -> list[dict]:
    """Every line of stdout is one schema-1 event; the run starts with run_start and ends with run_end."""
    lines = stdout.splitlines()
    assert lines and stdout.endswith("\n"), stdout
    events = [json.loads(line) for line in lines]
    assert sorted(FIELDS) == sorted(EVENTS)
    for event in events:
        check_event(event)
    assert events[0]["event"] == "run_start" and events[-1]["event"] == "run_end"
    assert [e["event"] for e in events].count("run_end") == 1
    return events


@pytest.fixture(autouse=True)
def _fast_reboots(monkeypatch):
    monkeypatch.setattr(runner_module, "REBOOT_POLL_SECONDS", 0.0)


@pytest.fixture
def node(monkeypatch):
    node = FakeNode(tools={"update-initramfs", "modprobe", "systemctl", "reboot"})
    node.add_gpu(0x1EB8)
    monkeypatch.setattr(connection, "open_connection", lambda spec: FakeConnection(node, name=spec.host or "local"))
    return node


def test_events_of_an_install_that_finishes(node):
    node.nvidia_version = "580.95.05"
    result = runner.invoke(app, ["install", "--host", "gpu-01", "--only", "nouveau", "--progress", "jsonl"])
    assert result.exit_code == 0, result.output
    events = check_stream(result.stdout)  # stdout holds the events and nothing else
    kinds = [e["event"] for e in events]
    assert kinds == ["run_start", "step_planned", "action_start", "action_end", "action_start", "action_end",
                     "step_result", "run_end"]
    assert events[0]["steps"] == ["nouveau"] and events[0]["mode"] == "install"
    assert events[-2]["result"] == "changed" and events[-1]["exit_code"] == 0 and events[-1]["state"] == "ready"
    assert events[-1]["next"].startswith("gpunode verify --host gpu-01")
    assert "install finished" in result.stderr  # the human recap goes to stderr


def test_reboot_required_is_exit_3_and_never_reboots_without_reboot(node):
    node.modules.add("nouveau")
    result = runner.invoke(app, ["install", "--host", "gpu-01", "--only", "nouveau", "--progress", "jsonl"])
    assert result.exit_code == 3, result.output
    events = check_stream(result.stdout)
    reboot = [e for e in events if e["event"] == "reboot_required"]
    assert len(reboot) == 1 and reboot[0]["step"] == "nouveau"
    assert events[-1] | {"time": ""} == events[-1] | {
        "time": "", "state": "reboot-pending", "exit_code": 3, "reboot_required": True, "reboots": 0}
    assert node.reboots == 0 and not node.ran("reboot") and not node.ran("systemctl")[-1:] == [["reboot"]]


def test_blocked_is_exit_1_with_the_fix(node):
    result = runner.invoke(app, ["install", "--host", "gpu-01", "--only", "driver", "--progress", "jsonl"])
    assert result.exit_code == 1, result.output
    events = check_stream(result.stdout)
    blocked = next(e for e in events if e["event"] == "step_result")
    assert blocked["result"] == "blocked" and "gpunode install --host gpu-01 --driver" in blocked["fix"]
    assert events[-1]["state"] == "blocked" and events[-1]["exit_code"] == 1


def test_plan_events_carry_every_step_result(node):
    result = runner.invoke(app, ["plan", "--host", "gpu-01", "--progress", "jsonl"])
    events = check_stream(result.stdout)
    planned = [e["step"] for e in events if e["event"] == "step_planned"]
    assert planned == [e["step"] for e in events if e["event"] == "step_result"] == events[0]["steps"]
    assert events[-1]["mode"] == "plan" and result.exit_code == events[-1]["exit_code"]


@pytest.mark.parametrize("args, words", [
    (["install", "--local", "--host", "gpu-01"], "--local and --host ask for two different targets"),
    (["plan", "--local", "--inventory", "hosts.ini"], "--local and --inventory"),
    (["doctor", "--local", "--host", "gpu-01"], "--local and --host"),
    (["install", "--kernel", "5.15.0-92-generic"], "--kernel goes with --bake"),
    (["install", "--bake", "--driver", "535.129.03", "--reboot"], "--bake never reboots"),
    (["install", "--bake"], "--bake needs the driver"),
    (["install", "--bake", "--driver", "535.129.03", "--kernel", "../../etc"], "is not a kernel release"),
    (["install", "--host", "gpu-01", "--progress", "xml"], "--progress 'xml' is not one of human, jsonl"),
    (["install", "--host", "gpu-01", "--progress", "jsonl", "--json"], "--json and --progress jsonl"),
])
def test_usage_errors_exit_2(node, args, words):
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert words in flat(result.stderr) and "fix:" in result.stderr
    assert result.stdout == "" and node.calls == []


def test_local_refuses_to_run_without_root(node, monkeypatch):
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    result = runner.invoke(app, ["install", "--local", "--driver", "535.129.03"])
    assert result.exit_code == 2
    assert "--local must run as root" in flat(result.stderr)
    assert "fix: sudo gpunode install --local --driver 535.129.03" in flat(result.stderr)
    assert node.calls == []


def test_local_selects_the_local_connection_without_touching_this_machine(monkeypatch):
    """The real open_connection picks LocalConnection; its process runner is replaced by the fake node's."""
    node = FakeNode(tools={"update-initramfs", "modprobe", "systemctl"})
    node.add_gpu(0x1EB8)
    node.nvidia_version = "580.95.05"
    fake = FakeConnection(node, name="local")
    opened: list[object] = []
    real_open = connection.open_connection

    def spy(spec):
        conn = real_open(spec)
        opened.append(conn)
        return conn

    monkeypatch.setattr(connection, "open_connection", spy)
    monkeypatch.setattr(LocalConnection, "_exec", lambda self, line, stdin, timeout: fake._exec(line, stdin, timeout))
    # the node lock's kept process (Connection.hold) would run on this machine: hold as the fake does (no keeper),
    # so the lock too goes through _exec to the fake node
    monkeypatch.setattr(LocalConnection, "_hold", lambda self, line, stdin, until, timeout: fake._hold(
        line, stdin, until, timeout))
    monkeypatch.setattr("os.geteuid", lambda: 0)
    result = runner.invoke(app, ["install", "--local", "--only", "nouveau", "--progress", "jsonl"])
    assert result.exit_code == 0, result.output
    assert len(opened) == 1 and type(opened[0]) is LocalConnection and opened[0].is_local
    events = check_stream(result.stdout)
    assert events[0]["host"] == "local"
    assert events[-1]["next"].startswith("gpunode verify --local  #")  # what to run next stays on this machine, no SSH
    assert "/etc/modprobe.d/blacklist-nouveau.conf" in node.files  # written to the fake, not to this machine


def test_hostile_node_text_stays_one_plain_line_per_event():
    out = io.StringIO()
    reporter = JsonlReporter("install", [nouveau.STEP], stream=out)
    hostile = 'evil\x1b]8;;http://x\x07[bold red]x[/]\n{"event": "run_end"}\r\u202e'
    plan = StepPlan("nouveau", Status.CHANGE, hostile, (RunCommand(hostile, ("true",)),))
    reporter.planned(hostile, nouveau.STEP, plan)
    reporter.message("n", hostile)
    reporter.step_done("n", StepOutcome("nouveau", "t", plan, "failed", error=hostile))
    report = RunReport("n", "install", outcomes=[StepOutcome("nouveau", "t", plan, "failed", error=hostile)])
    reporter.finish(report, None)
    lines = out.getvalue().splitlines()
    assert len(lines) == 4  # the planned event, the message, one step_result (finish does not repeat it), run_end
    for line in lines:
        assert line.isascii() and "\x1b" not in line and "\n" not in line
        check_event(json.loads(line))
    planned = json.loads(lines[0])
    assert planned["host"].startswith("evil\\x1b]8;;http://x\\x07[bold red]x[/]")  # visible, literal, no markup
    assert "\\x1b" in planned["reason"] and "\u202e" not in planned["reason"] and "\x1b" not in planned["reason"]
    assert json.loads(lines[-1])["event"] == "run_end"
