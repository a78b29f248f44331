"""An install on one node sends its first command (the node's lock and the RUN probe's first part) as soon as the
login is done, and loads the steps, the runner and the output while the node works (gpunode/cli/pipeline.py
`_first_command`, gpunode/firstcommand.py, nodelock.Sent). The command is the one the runner makes; a start-up that
fails after it was sent releases the lock it took, closes the connection and leaves no thread."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpunode import nodelock, option_checks
from gpunode.cli import app
from gpunode.cli._inputs import Checked
from tests.integration.test_reliability_faults import container_node
from tests.nodesim.fixtures import host_guard, nodesim_available, sim_node  # noqa: F401 - pytest fixtures

ROOT = Path(__file__).resolve().parents[2]

_FIRST = """
import json, sys, threading
from gpunode import connection
from gpunode.errors import ConnectError
seen, closed = [], []
class Node:  # answers nothing: the first command's error ends the run
    name, is_local = "gpu-01", False
    def __enter__(self): return self
    def __exit__(self, *_): self.close()
    def close(self): closed.append(True)
    def wait_connected(self): pass
    def lock_owner(self): return "4242"
    def run(self, cmd, **_):
        seen.append({"script": cmd.name, "args": list(cmd.args), "thread": threading.current_thread().name,
                     "loaded": sorted(m for m in sys.modules if m.startswith("gpunode.steps.")
                                      or m in ("gpunode.runner", "gpunode.cli._pipeline_view", "rich.console"))})
        raise ConnectError("the node went away", fix="nothing to fix")
connection.open_connection = lambda spec: Node()
from gpunode.cli import run
sys.argv = ["gpunode", *json.loads(sys.argv[1])]
try:
    run()
except SystemExit as done:
    from gpunode.steps import PIPELINE
    print(json.dumps({"code": done.code, "seen": seen, "closed": closed, "names": [s.name for s in PIPELINE],
                      "threads": [t.name for t in threading.enumerate() if t.name.startswith("gpunode")]}))
"""


def _first(*argv: str) -> dict:
    done = subprocess.run([sys.executable, "-c", _FIRST, json.dumps(argv)], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert done.stdout.strip(), done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_the_lock_and_the_probe_leave_before_the_steps_the_runner_and_the_output_are_loaded():
    got = _first("install", "--host", "gpu-01", "--driver", "535.129.03")
    first = got["seen"][0]
    assert first["script"] == "node-lock" and first["thread"] == "gpunode-first-command"
    # no step module and no runner yet (the output's import may have begun: the thread waits for the GIL, one
    # switch interval at most, once it gave it up for a system call)
    assert [m for m in first["loaded"] if m.startswith("gpunode.steps.") or m == "gpunode.runner"] == []
    # the same command the runner makes: every step of the pipeline, in order, and the probe after the lock
    assert f"command=gpunode install {' '.join(got['names'])}\n" in first["args"][1]
    assert first["args"][2] == "4242"
    assert got["seen"] == [first]  # the error was raised in the run, from the answer: nothing sent again
    assert got["code"] != 0 and got["closed"] and got["threads"] == []


def test_a_named_step_names_the_lock_from_the_selection_and_a_plan_sends_nothing_ahead():
    named = _first("install", "--host", "gpu-01", "--driver", "535.129.03", "--skip", "k8s")
    assert f"command=gpunode install {' '.join(named['names'][:-1])}\n" in named["seen"][0]["args"][1]
    plan = _first("plan", "--host", "gpu-01")
    assert [s["script"] for s in plan["seen"]] == ["probe"] and plan["seen"][0]["thread"] == "MainThread"


def test_the_default_selection_is_named_without_loading_the_steps_and_agrees_with_it():
    values = option_checks.defaults("cli")
    options = option_checks.checked(values)
    assert Checked(values, options).step_names == tuple(
        s.name for s in option_checks.selected(values, options).steps)


def test_the_run_probe_is_the_same_before_the_steps_and_the_runner_are_loaded():
    """The first command is built once gpunode.facts is loaded, before any step: every fact of the RUN probe must be
    registered by gpunode.facts itself (no step or later module may add one, or the probe would differ)."""
    script = """
import sys
from gpunode.facts.probe import build_probe
from gpunode.facts.registry import CHECK, LATE, RUN
import gpunode.facts
def text():
    made = [build_probe(probe=RUN, part=part) for part in (CHECK, LATE)]
    return [script.body.replace(nonce, "N") for script, nonce in made]
before = text()
import gpunode.steps, gpunode.runner, gpunode.preflight, gpunode.cli._pipeline_view, gpunode.undo.engine
gpunode.steps.PIPELINE
print(before == text() and "gpunode.steps.driver" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.stdout.strip() == "True", done.stderr


@pytest.mark.integration
def test_a_start_up_that_fails_after_the_first_command_releases_the_lock_and_leaves_no_thread(sim_node,  # noqa: F811
                                                                                              monkeypatch):
    node = container_node(sim_node)

    def broken(*_: object) -> None:
        raise RuntimeError("a bug while the steps were being selected")

    monkeypatch.setattr(option_checks, "selected", broken)
    result = CliRunner().invoke(app, ["install", *node.cli_args(), "--driver", "535.129.03"])
    assert isinstance(result.exception, RuntimeError)
    assert not node.exists(nodelock.LOCK_PATH)  # it was taken (the lock went first), then released
    assert not [t for t in threading.enumerate() if t.name.startswith("gpunode")]
    monkeypatch.undo()
    again = CliRunner().invoke(app, ["install", *node.cli_args(), "--driver", "535.129.03", "--only", "nouveau"])
    assert "stale" not in again.output, again.output
