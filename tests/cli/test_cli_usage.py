"""Bad input typed by hand: exit 2, the problem and the fix, BEFORE any connection, prompt or directory."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from gpunode import connection
from gpunode.cli import app
from tests.cli.conftest import flat

runner = CliRunner()


@pytest.fixture
def no_connection(monkeypatch):
    """Any attempt to reach a node fails the test: usage errors must come first."""
    opened: list[object] = []

    def refuse(spec):
        opened.append(spec)
        raise AssertionError(f"connected to {spec.host!r} before rejecting the input")

    monkeypatch.setattr(connection, "open_connection", refuse)
    monkeypatch.setattr("getpass.getpass", lambda prompt="": pytest.fail("prompted before rejecting the input"))
    return opened


@pytest.fixture
def empty_inventory(tmp_path):
    path = tmp_path / "hosts.ini"
    path.write_text("[gpu]\n# nobody yet\n")
    return str(path)


CASES = [
    (["plan", "--host", "n", "--only", "driver", "--skip", "driver"],
     "--only driver --skip driver selects no step", "choose other steps: nouveau"),
    (["install", "--host", "n", "--connect-timeout", "0"],
     "--connect-timeout 0 is not a valid number of seconds (it must be more than 0)", "--connect-timeout 15"),
    (["doctor", "--host", "n", "--connect-timeout", "-3"], "--connect-timeout -3", "--connect-timeout 15"),
    (["install", "--host", "n", "--lock-timeout", "-1"], "--lock-timeout -1", "0 or more"),
    (["install", "--host", "n", "--reboot-timeout", "-5"], "--reboot-timeout -5", "--reboot-timeout 900"),
    (["install", "--host", "n", "--reboot-timeout", "0"], "--reboot-timeout 0", "--reboot-timeout 900"),
    (["plan", "-H", "a", "-H", "b", "--parallel", "0"], "--parallel 0 must be at least 1", "--parallel 8"),
    (["doctor", "-H", "a", "-H", "b", "--parallel", "-1"], "--parallel -1 must be at least 1", "--parallel 8"),
    (["verify", "--host", "n", "--timeout", "0"], "--timeout 0 is not a valid number of seconds", "--timeout 600"),
    (["verify", "--host", "n", "--engine", "lxc"], "--engine 'lxc'", "docker, containerd, podman"),
    (["plan", "--host", "n", "--kernel-module", "bogus"],
     "--kernel-module 'bogus' is not a kernel module flavour (allowed: open, proprietary)",
     "--kernel-module open or --kernel-module proprietary"),
    (["plan", "-H", "a", "-H", "b", "--max-fail", "150%"], "--max-fail '150%'", "--max-fail 10%"),
    (["plan", "--host", "n", "--batch", "2"], "--batch and --max-fail need several nodes", "--inventory"),
    (["plan", "--host", "n", "--limit", "gpu-*"], "--limit needs --inventory", "drop --limit"),
    (["status", "--host", "n", "--identity", "/nonexistent/key"], "--identity /nonexistent/key: no such file",
     "check the path"),
    (["plan", "--host", "two words"], "--host 'two words' is not a host name", "ubuntu@10.0.0.5"),
]


@pytest.mark.parametrize("args, problem, fix", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_bad_input_is_exit_2_with_problem_and_fix_before_connecting(no_connection, args, problem, fix):
    result = runner.invoke(app, args)
    text = flat(result.output)
    assert result.exit_code == 2, result.output
    assert f"error: {problem}" in text and "fix:" in text and fix in text
    assert "Traceback" not in result.output
    assert no_connection == []


def test_bad_batch_creates_no_log_directory(no_connection, tmp_path):
    logs = tmp_path / "logs"
    result = runner.invoke(app, ["plan", "-H", "a", "-H", "b", "--batch", "foo", "--log-dir", str(logs)])
    assert result.exit_code == 2 and "--batch 'foo' is not a number or a percentage" in result.output
    assert not logs.exists()


def test_empty_inventory_is_a_usage_error_not_zero_nodes(no_connection, empty_inventory, tmp_path):
    for command in ("plan", "install", "doctor"):
        result = runner.invoke(app, [command, "--inventory", empty_inventory, "--log-dir", str(tmp_path / "l")])
        assert result.exit_code == 2, result.output
        assert f"inventory {empty_inventory} lists no hosts" in flat(result.output)
        assert "0 nodes" not in result.output
    assert not (tmp_path / "l").exists()


def test_limit_matching_nothing_is_a_usage_error(no_connection, tmp_path):
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("[gpu]\ngpu-01\ngpu-02\n")
    result = runner.invoke(app, ["doctor", "-I", str(inventory), "--limit", "cpu-*"])
    assert result.exit_code == 2 and "cpu-*" in result.output and "Traceback" not in result.output


def test_facts_accepts_json(monkeypatch):
    from tests.fakes.connection import FakeConnection, FakeNode

    monkeypatch.setattr(connection, "open_connection", lambda spec: FakeConnection(FakeNode(), name="n"))
    result = runner.invoke(app, ["facts", "--host", "n", "--json"])
    assert result.exit_code == 0 and result.stdout.lstrip().startswith("{")


@pytest.mark.parametrize("command", ["status", "facts"])
def test_status_and_facts_take_ask_become_pass(monkeypatch, command):
    from tests.fakes.connection import FakeConnection, FakeNode

    seen = []
    monkeypatch.setattr("getpass.getpass", lambda prompt="": "s3cret")

    def open_connection(spec):
        seen.append(spec.become_password)
        return FakeConnection(FakeNode(), name="n")

    monkeypatch.setattr(connection, "open_connection", open_connection)
    result = runner.invoke(app, [command, "--host", "n", "--ask-become-pass"])
    assert result.exit_code == 0, result.output
    assert seen and seen[0] is not None and seen[0].value == "s3cret"


def test_help_has_readable_metavars_and_says_user_at():
    result = runner.invoke(app, ["plan", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "<bool>" not in result.output and "<list[str]>" not in result.output and "<float>" not in result.output
    assert "[USER@]HOST[:PORT]" in result.output and "user@host" in result.output
    assert "SECONDS" in result.output


def test_ctrl_c_is_one_line_and_exit_130(monkeypatch):
    def interrupted(spec):
        raise KeyboardInterrupt

    monkeypatch.setattr(connection, "open_connection", interrupted)
    result = runner.invoke(app, ["status", "--host", "n"])
    assert result.exit_code == 130 and "interrupted (Ctrl-C)" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(("argv", "error", "fix"), [
    (["plan", "--bogus"], "No such option: --bogus", "gpunode plan --help"),
    (["install", "--driver"], "Option '--driver' requires an argument", "gpunode install --help"),
    (["plan", "--gpu-replicas", "x"], "Invalid value for '--gpu-replicas'", "gpunode plan --help"),
    (["bogus"], "No such command 'bogus'", "gpunode --help"),
    (["--bogus"], "No such option: --bogus", "gpunode --help"),
])
def test_clicks_own_usage_errors_get_a_runnable_fix_and_exit_2(argv, error, fix):
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2, result.output
    assert f"error: {error}" in result.output
    assert f"fix: {fix}  # lists" in result.output


def test_fleet_options_for_one_node_are_named_in_a_note(monkeypatch, tmp_path):
    from gpunode.cli import _inputs

    chosen = _inputs.target("rolling", {"host": ["gpu-01"], "identity": None, "known_hosts": None,
                                        "accept_new_host_key": False, "ssh_config": None, "ask_pass": False,
                                        "ask_become_pass": False, "connect_timeout": 15.0, "json_output": False,
                                        "inventory": None, "limit": None, "parallel": 8,
                                        "log_dir": str(tmp_path / "logs"), "log_level": "debug", "batch": None,
                                        "max_fail": None})
    assert chosen.fleet is None
    assert chosen.notes == ["--log-dir, --log-level apply to fleet runs (several --host, or --inventory): not used "
                            "for one node"]
    assert not (tmp_path / "logs").exists()
