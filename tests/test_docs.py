"""What README.md says that the code can check: counts, the command table, examples' host names and shapes."""

from __future__ import annotations

import json
import re
from pathlib import Path

from typer.testing import CliRunner

from gpunode import connection
from gpunode.cli import COMMANDS, app
from gpunode.connection.local import LocalConnection
from gpunode.doctor import CHECKS
from tests.doctor.fakes import fresh
from tests.fakes.connection import FakeConnection

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()
DOCTOR_JSON = README[README.index("## doctor --json schema"):README.index("## Other `--json` shapes")]


def test_the_check_count_is_the_number_of_checks():
    counts = re.findall(r"(\d+) checks with stable ids", README)
    assert counts == [str(len(CHECKS))]


def test_the_doctor_json_example_counts_every_check_once():
    summary = re.search(r'"summary": (\{[^}]*\})', DOCTOR_JSON)
    assert summary is not None and sum(json.loads(summary[1]).values()) == len(CHECKS)


def test_the_command_table_lists_every_command():
    table = README[README.index("## Commands"):README.index("The pipeline (")]
    listed = re.findall(r"^\| `gpunode (\w+)` \|", table, re.MULTILINE)
    assert sorted(listed) == sorted(COMMANDS)


def test_the_nhc_example_shows_the_host_name_doctor_prints_on_the_node_itself():
    example = re.search(r"\$ gpunode doctor --format nhc; echo \$\?\n(.*)\n", README)
    assert example is not None and not re.search(r"--host", example[0])
    assert example[1].split(": ")[:2] == ["ERROR", "gpunode"]
    assert example[1].split(": ")[2] == LocalConnection.name


def test_the_doctor_json_example_fix_is_as_doctor_prints_it_for_that_host(monkeypatch):
    host = re.search(r'"host": "([^"]+)"', DOCTOR_JSON)
    fix = re.search(r'"fix": "(gpunode [^"]+)"', DOCTOR_JSON)
    assert host and fix
    monkeypatch.setattr(connection, "open_connection", lambda spec: FakeConnection(fresh(), name=spec.host))
    result = CliRunner().invoke(app, ["doctor", "--host", host[1], "--json"])
    fixes = {c["fix"] for c in json.loads(result.stdout)["checks"]}
    assert fix[1] in fixes
