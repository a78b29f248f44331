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
