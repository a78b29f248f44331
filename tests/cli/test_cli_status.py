"""`gpunode status` and `gpunode uninstall` on a damaged journal: an error naming the place and the fix, exit 1,
never a traceback."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gpunode.cli import app
from gpunode.journal import JOURNAL_PATH
from tests.fakes.connection import FakeNode

runner = CliRunner()

DAMAGED = {
    "wrong types": json.dumps({"schema_version": 1, "runs": [{"id": "a", "command": "install", "status": "done",
                                                              "steps": [{"step": "x", "backups": [1, {"a": 2}]}]}]}),
    "a bad record": json.dumps({"schema_version": 1, "runs": [], "undo": [{"kind": "file", "path": 7}]}),
    "nested too deeply": "[" * 50_000 + "]" * 50_000,
}


@pytest.mark.parametrize("command", ["status", "uninstall"])
@pytest.mark.parametrize("damage", sorted(DAMAGED))
def test_a_damaged_journal_is_a_clear_error(serve, command, damage):
    node = serve(FakeNode())
    node.put(JOURNAL_PATH, DAMAGED[damage])
    result = runner.invoke(app, [command, "--host", "n"])
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output and JOURNAL_PATH in result.output and ".broken" in result.output
