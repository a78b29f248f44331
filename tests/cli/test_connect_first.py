"""`plan` and `install` on one node over SSH start connecting as soon as every option is checked, before the
pipeline, its facts and the output are loaded (gpunode/cli/pipeline.py `_run`, gpunode/connection/ssh.py
connect_ahead). A run refused for its options never connects; a Ctrl-C or an error while the login is under way
ends the run cleanly, with the connection closed and no thread left; fleets connect as they always did."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import paramiko
import pytest
from typer.testing import CliRunner

from gpunode import connection
from gpunode.cli import app
from tests.connection.test_connect_ahead import _ahead_threads, _closed_by_peer, silent_server

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


@pytest.mark.parametrize(("argv", "named"), [
    (["--only", "bogus"], "unknown step 'bogus'"),
    (["--skip", "nouveau", "--only", "nouveau"], "selects no step"),
    (["--driver", "not-a-version"], "--driver"),
    (["--cuda", "99.9"], "CUDA 99.9"),
    (["--connect-timeout", "0"], "--connect-timeout"),
    (["--progress", "xml"], "--progress 'xml'"),
    (["--progress", "jsonl", "--json"], "--json and --progress jsonl"),
    (["--mig-layout", "huge"], "--mig-layout"),
    (["--identity", "/nonexistent/key"], "--identity /nonexistent/key: no such file"),
])
@pytest.mark.parametrize("command", ["plan", "install"])
def test_a_run_refused_for_its_options_never_connects(monkeypatch, command, argv, named):
    opened = []
    monkeypatch.setattr(connection, "open_connection", lambda spec: opened.append(spec))
    result = runner.invoke(app, [command, "--host", "gpu-01", *argv])
    assert result.exit_code == 2, result.output
    assert named in result.output and "fix:" in result.output
    assert opened == []


_RECORD = """
import json, sys
from gpunode import connection
from gpunode.errors import ConnectError
seen = []
def record(spec):
    seen.append({"ahead": spec.ahead, "loaded": sorted(m for m in ("gpunode.steps", "gpunode.facts", "gpunode.runner",
                                                                     "gpunode.cli._pipeline_view", "rich.console")
                                                       if m in sys.modules)})
    raise ConnectError("no node here", fix="nothing to fix")
connection.open_connection = record
from gpunode.cli import run
sys.argv = ["gpunode", *json.loads(sys.argv[1])]
try:
    run()
except SystemExit as done:
    print(json.dumps({"code": done.code, "seen": seen}))
"""


def _recorded(*argv: str) -> dict:
    done = subprocess.run([sys.executable, "-c", _RECORD, json.dumps(argv)], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("command", ["plan", "install"])
def test_one_node_is_connected_to_ahead_before_the_pipeline_and_the_output_are_loaded(command):
    got = _recorded(command, "--host", "gpu-01", "--driver", "535.129.03")
    assert got["seen"] == [{"ahead": True, "loaded": []}]
    assert got["code"] != 0  # the connection's error ended the run


def test_a_named_step_is_checked_first_and_a_fleet_connects_as_before():
    named = _recorded("install", "--host", "gpu-01", "--only", "driver")
    assert named["seen"][0]["ahead"] and "gpunode.steps" in named["seen"][0]["loaded"]  # its name was checked
    fleet = _recorded("plan", "--host", "gpu-01", "--host", "gpu-02")
    assert [s["ahead"] for s in fleet["seen"]] == [False, False]


def _ssh_args(tmp_path: Path, port: int) -> list[str]:
    key = tmp_path / "id_rsa"
    paramiko.RSAKey.generate(2048).write_private_key_file(str(key))
    return ["--host", f"root@127.0.0.1:{port}", "--identity", str(key), "--known-hosts", str(tmp_path / "kh"),
            "--driver", "535.129.03", "--cache-dir", str(tmp_path / "cache")]


def test_ctrl_c_while_the_login_is_under_way_ends_the_run_at_once_and_closes_the_connection(tmp_path):
    with silent_server() as (port, accepted):  # sshd that never answers: the login waits
        process = subprocess.Popen([sys.executable, "-m", "gpunode", "install", *_ssh_args(tmp_path, port),
                                    "--connect-timeout", "60"],
                                   cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 60
            while not accepted and time.monotonic() < deadline and process.poll() is None:
                time.sleep(0.02)
            assert accepted, process.communicate()[1]
            time.sleep(0.3)
            process.send_signal(signal.SIGINT)
            started = time.monotonic()
            out, err = process.communicate(timeout=10)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        assert time.monotonic() - started < 5
        assert process.returncode == 130, err
        assert "interrupted (Ctrl-C)" in err and "Traceback" not in err
        assert _closed_by_peer(accepted[0])


def test_an_error_while_the_login_is_under_way_closes_the_connection(tmp_path, monkeypatch):
    from gpunode import option_checks

    def broken(*_: object) -> None:
        raise RuntimeError("a bug while the steps were being selected")

    monkeypatch.setattr(option_checks, "selected", broken)
    with silent_server() as (port, accepted):
        result = runner.invoke(app, ["install", *_ssh_args(tmp_path, port), "--connect-timeout", "60"])
        assert isinstance(result.exception, RuntimeError)
        assert accepted and _closed_by_peer(accepted[0])
    assert _ahead_threads() == [] and not any(t.name.startswith("gpunode-connect") for t in threading.enumerate())
