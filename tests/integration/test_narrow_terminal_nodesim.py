"""What `COLUMNS=80 gpunode status | less` shows (the real process, stdout a pipe, a node-simulator node): every
line fits, and run ids, times, statuses and step names are never broken across lines."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from gpunode.cli import app
from tests.nodesim.fixtures import host_guard, nodesim_available, sim_node  # noqa: F401 - pytest fixtures

pytestmark = pytest.mark.integration
cli = CliRunner()


def test_status_piped_at_80_columns_keeps_its_words_whole(sim_node):  # noqa: F811
    node = sim_node("ubuntu-22.04-t4", nouveau_loaded=True)
    for _ in range(2):  # two runs: the blacklist (reboot pending), then the same again
        done = cli.invoke(app, ["install", *node.cli_args(), "--only", "nouveau"])
        assert done.exit_code in (0, 3), done.output
    runs = json.loads(cli.invoke(app, ["status", *node.cli_args(), "--json"]).stdout)["runs"]
    env = {k: v for k, v in os.environ.items() if k != "GPUNODE_WIDTH"}
    shown = subprocess.run([sys.executable, "-m", "gpunode", "status", *node.cli_args()], capture_output=True,
                           text=True, timeout=300, env={**env, "COLUMNS": "80"})
    assert shown.returncode in (0, 1), shown.stderr
    lines = shown.stdout.splitlines()
    assert runs and max(len(line) for line in lines) <= 80
    for run in runs:
        assert ["run", run["id"], run["started"], run["status"]] in [line.split() for line in lines]
        for step in run["steps"]:
            assert any(line.split()[:2] == [step["step"], step["result"]] for line in lines), (step, lines)
