"""`gpunode uninstall` at the command line: usage errors exit 2; a node without records has nothing to undo."""

from __future__ import annotations

from typer.testing import CliRunner

from gpunode.cli import app

cli = CliRunner()


def test_an_unknown_step_is_a_usage_error():
    result = cli.invoke(app, ["uninstall", "--only", "drivers"])
    assert result.exit_code == 2
    assert "unknown step 'drivers'" in result.output and "nouveau" in result.output


def test_a_bad_reboot_timeout_is_a_usage_error():
    result = cli.invoke(app, ["uninstall", "--reboot-timeout", "0"])
    assert result.exit_code == 2 and "--reboot-timeout" in result.output


def test_the_help_speaks_of_uninstall_not_install():
    result = cli.invoke(app, ["uninstall", "--help"], env={"COLUMNS": "200"})
    shown = " ".join(result.stdout.replace("│", " ").split())  # the option panel's frame
    assert result.exit_code == 0
    assert "Same as `gpunode plan`" not in shown and "Driver upgrade" not in shown
    assert "Show what uninstall would undo (commands and file diffs); change nothing." in shown
    assert "so it can be unloaded and removed; they are not started again" in shown


def test_dry_run_json_names_its_mode(monkeypatch):
    import json

    from gpunode import connection
    from tests.fakes.connection import FakeConnection, FakeNode

    node = FakeNode(tools={"update-initramfs", "modprobe"}, modules={"nouveau"})
    node.add_gpu(0x1EB8)
    monkeypatch.setattr(connection, "open_connection", lambda spec: FakeConnection(node, name=spec.host))
    cli.invoke(app, ["install", "--host", "n", "--only", "nouveau"])
    dry = json.loads(cli.invoke(app, ["uninstall", "--host", "n", "--dry-run", "--json"]).stdout)
    assert dry["mode"] == "uninstall-dry-run" and dry["summary"]["nothing_to_undo"] is False
    fleet = json.loads(cli.invoke(app, ["uninstall", "-H", "n", "-H", "m", "--dry-run", "--json"]).stdout)
    assert fleet["mode"] == "uninstall-dry-run"
    # each host's own report names the same mode, from the RunReport (not "plan", install's dry run)
    assert [h["report"]["mode"] for h in fleet["hosts"]] == ["uninstall-dry-run"] * 2
    assert {h["status"] for h in fleet["hosts"]} == {"planned"}  # a dry run's hosts are planned, not changed
    done = json.loads(cli.invoke(app, ["uninstall", "--host", "n", "--json"]).stdout)
    assert done["mode"] == "uninstall"
