"""Node text is untrusted: whatever a node sends (os-release, journal, logs, check evidence, container output)
reaches the terminal with no control character but newline, is never parsed as rich markup, and never
raises. Property tests drive every renderer; two CLI tests reproduce the screens users hit."""

from __future__ import annotations

import io
import json
import re
import unicodedata

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from gpunode import connection
from gpunode import verify as vf
from gpunode.cli import app
from gpunode.cli._fleet import FleetView
from gpunode.cli._pipeline_view import ConsoleReporter, render_install, render_plan
from gpunode.cli.doctor import render_checks
from gpunode.cli.verify import render_report
from gpunode.doctor import CheckResult
from gpunode.facts import FULL, gather
from gpunode.fleet import HostResult
from gpunode.inventory import InventoryHost
from gpunode.journal import JOURNAL_PATH
from gpunode.plan import RunCommand, Status, StepPlan, WriteFile
from gpunode.runner import RunReport, StepOutcome
from gpunode.ui import SafeConsole, clean, print_error
from tests.fakes.connection import FakeConnection, FakeNode

runner = CliRunner()

NASTY = ["\x1b[2J", "\x1b]0;owned\x07", "\x1b[31m", "\r", "\x07", "\x08", "\x9b1m", "\u202e", "[bold]", "[/]",
         "[link=file:///etc]", "make[2]: *** [/usr/src/nvidia/Kbuild] Error 1", "\t", "\x00", "\n", "é", "日本",
         "\ud800"]
node_strings = st.one_of(st.text(max_size=60), st.lists(st.sampled_from(NASTY), max_size=8).map("".join),
                         st.tuples(st.text(max_size=20), st.sampled_from(NASTY)).map("".join))

SGR = re.compile(r"\x1b\[[0-9;]*m")  # the colours rich itself writes on a terminal


def assert_safe(text: str, terminal: bool) -> None:
    shown = SGR.sub("", text) if terminal else text
    bad = [ch for ch in shown if ch != "\n" and unicodedata.category(ch) in ("Cc", "Cs")]
    assert not bad, f"control characters reached the terminal: {bad!r}"
    if not terminal:
        assert "\x1b" not in text


def consoles() -> list[tuple[SafeConsole, io.StringIO, bool]]:
    made = []
    for terminal in (False, True):
        buffer = io.StringIO()
        made.append((SafeConsole(file=buffer, force_terminal=terminal, width=100), buffer, terminal))
    return made


def _facts(os_name: str):
    node = FakeNode(os_release=f'PRETTY_NAME="{os_name}"\nID=ubuntu\nVERSION_ID="22.04"\n')
    node.add_gpu(0x1EB8)
    return gather(FakeConnection(node), FULL)


FACTS = _facts("Ubuntu 22.04.5 LTS")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=node_strings)
def test_every_renderer_shows_node_text_safely(text):
    plan = StepPlan("toolkit", Status.BLOCKED, text, (RunCommand(text, cmd=("echo", text)),
                                                       WriteFile(text, path="/etc/x", after=text + "\n", before=text)),
                    fix="gpunode install " + text, notes=(text,))
    report = RunReport(text, "plan", outcomes=[StepOutcome("toolkit", "Toolkit", plan, "blocked", text, [text])],
                       error=text, facts=FACTS)
    verify = vf.Report(text, {}, driver=text, image=text, cuda_image=text, notes=[text],
                    outcomes=[vf.Outcome(vf.Test("docker", text, (text,)), "fail", text, fix=text, output=text)])
    checks = [CheckResult("hw.gpu-present", "hardware", text, "fail", text, text)]
    for console, buffer, terminal in consoles():
        render_plan(report, console)
        report.mode = "install"
        render_install(report, console, next_step=text)
        report.mode = "plan"
        render_checks(text, FACTS, checks, console)
        render_report(verify, text, console)
        print_error(text, text, console)
        reporter = ConsoleReporter(console)
        reporter.message(text, text)
        reporter.action(text, type("S", (), {"name": "toolkit"})(), RunCommand(text), "done", text)  # type: ignore[arg-type]
        assert_safe(buffer.getvalue(), terminal)


@settings(max_examples=40, deadline=None)
@given(text=node_strings)
def test_clean_leaves_no_control_character_and_keeps_plain_text(text):
    shown = clean(text)
    assert all(ch == "\n" or unicodedata.category(ch) not in ("Cc", "Cs") for ch in shown)
    if all(ch == "\n" or (ch.isprintable() and ch not in "\u202e") for ch in text):
        assert shown == text


@settings(max_examples=30, deadline=None)
@given(text=node_strings)
def test_fleet_progress_lines_are_safe(text):
    buffer = io.StringIO()
    from gpunode.cli import _fleet

    original = _fleet.err
    _fleet.err = SafeConsole(file=buffer, width=100)
    try:
        view = FleetView([InventoryHost("gpu-01")], ["toolkit"])
        view.update(("message", "gpu-01", text))
        view.update(("done", "gpu-01", HostResult("gpu-01", "failed", error=text)))
    finally:
        _fleet.err = original
    assert_safe(buffer.getvalue(), False)


def test_status_renders_a_kernel_build_error_literally(monkeypatch):
    node = FakeNode()
    line = "make[2]: *** [/usr/src/nvidia-580.95.05/Kbuild:64: nvidia/nv.o] Error 1 \x1b]0;pwned\x07[/]"
    journal = {"schema_version": 1, "runs": [{"id": "r1", "started": "2026-11-21T10:00:00", "status": "failed",
                                              "steps": [{"step": "driver", "result": "failed", "error": line}]}]}
    node.put(JOURNAL_PATH, json.dumps(journal))
    monkeypatch.setattr(connection, "open_connection", lambda spec: FakeConnection(node, name=spec.host))
    result = runner.invoke(app, ["status", "--host", "gpu-01"])
    assert result.exit_code == 1, result.output
    assert "MarkupError" not in result.output and "Traceback" not in result.output
    assert "make[2]: *** [/usr/src/nvidia-580.95.05/Kbuild:64: nvidia/nv.o] Error 1" in result.stdout
    assert "\x1b" not in result.stdout and "\\x1b]0;pwned\\x07[/]" in result.stdout


def test_escape_sequences_in_os_release_are_shown_not_obeyed(monkeypatch):
    node = FakeNode(os_release='PRETTY_NAME="Ubuntu\x1b[2J\x1b]0;owned\x07 22.04"\nID=ubuntu\nVERSION_ID="22.04"\n')
    node.add_gpu(0x1EB8)
    monkeypatch.setattr(connection, "open_connection", lambda spec: FakeConnection(node, name=spec.host))
    for command in (["plan"], ["doctor"]):
        result = runner.invoke(app, [*command, "--host", "gpu-01"])
        assert "\x1b" not in result.stdout and "\x07" not in result.stdout
        assert "Ubuntu\\x1b[2J\\x1b]0;owned\\x07 22.04" in result.stdout
