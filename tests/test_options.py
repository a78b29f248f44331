"""The option table (gpunode/options.py) is the one place an option is declared: a row added to it shows up in
the CLI's --help and parsing, in the library's accepted options and checks, and in the Ansible argument_spec."""

from __future__ import annotations

import importlib

import pytest
from typer.testing import CliRunner

from gpunode import ansible_spec, api, options
from gpunode.errors import UsageError
from gpunode.options import OPTION_TABLE, OptionSpec

NEW = OptionSpec("widget_colour", "--widget-colour", "str", "The colour of the widgets (a test option).", "Driver",
                 choices=("red", "blue"), metavar="COLOUR")


@pytest.fixture
def extended(monkeypatch):
    """The table with one more row, as if someone added it; the CLI's commands are rebuilt from it."""
    import gpunode.cli.pipeline as pipeline_cli

    monkeypatch.setattr(options, "option_table", lambda: (*OPTION_TABLE, NEW))
    importlib.reload(pipeline_cli)
    yield NEW
    monkeypatch.undo()
    importlib.reload(pipeline_cli)


def _plan(*args: str):
    from gpunode.cli import app

    return CliRunner().invoke(app, ["plan", *args], env={"COLUMNS": "200"})


def test_a_new_row_is_in_the_cli_help_and_parsed(extended):
    result = _plan("--help")
    assert result.exit_code == 0
    assert "--widget-colour" in result.output and "The colour of the widgets" in result.output
    bad = _plan("--widget-colour", "green")
    assert bad.exit_code == 2 and "--widget-colour 'green' is not one of red, blue" in bad.output


def test_a_new_row_is_accepted_and_checked_by_the_library(extended):
    assert api.pipeline_options()["widget_colour"] is None
    api.request({"widget_colour": "red"})  # known: no "unknown option"
    with pytest.raises(UsageError, match="widget_colour 'green' is not one of red, blue"):
        api.request({"widget_colour": "green"})


def test_a_new_row_is_in_the_ansible_argument_spec(extended):
    spec = ansible_spec.node_spec()
    assert spec["widget_colour"] == {"type": "str", "choices": ["red", "blue"]}
    assert "widget_colour" in ansible_spec.gpunode_options()
    assert "widget_colour" in ansible_spec.rendered()  # the copy in module_utils/specs.py would be out of date


def test_without_the_row_the_option_is_unknown_everywhere():
    with pytest.raises(UsageError, match="unknown option widget_colour"):
        api.request({"widget_colour": "red"})
    assert "widget_colour" not in ansible_spec.node_spec()
    result = _plan("--widget-colour", "red")
    assert result.exit_code == 2


def test_every_row_is_well_formed():
    names = [o.name for o in OPTION_TABLE]
    flags = [o.cli_flag for o in OPTION_TABLE]
    assert len(set(names)) == len(names) and len(set(flags)) == len(flags)
    for row in OPTION_TABLE:
        assert row.type in ("str", "int", "float", "bool", "path", "list"), row
        assert (row.type == "list") == (row.elements is not None), row
        assert row.inapplicable in ("", "note", "refuse"), row
        assert row.group and row.help and row.commands and row.fronts, row
        assert row.flag.startswith("--") and row.name.isidentifier(), row
        assert "/" not in row.flag or (row.type == "bool" and row.default is None), row  # --x/--no-x: tri-state
        if row.type != "bool":
            assert row.metavar, row


def test_the_library_takes_every_row_it_is_given_and_the_cli_every_cli_row():
    from gpunode.cli import _params

    cli_names = {name for name, _, _ in (*_params.pipeline_params(), *_params.reboot_params())}
    assert cli_names == {o.name for o in OPTION_TABLE if options.CLI in o.fronts and "plan" in o.commands
                         or o.group == "Reboots"}
    assert set(api.PIPELINE_OPTIONS) == {o.name for o in OPTION_TABLE if options.API in o.fronts}
    assert {k: v for k, v in api.PIPELINE_OPTIONS.items()} == {o.name: o.default for o in OPTION_TABLE
                                                                if options.API in o.fronts}


def test_plan_help_is_readable_at_80_columns_every_option_whole_and_grouped():
    import re

    from gpunode.cli import _params

    result = CliRunner().invoke(__import__("gpunode.cli", fromlist=["app"]).app, ["plan", "--help"],
                                env={"COLUMNS": "80", "TERMINAL_WIDTH": "80"})
    assert result.exit_code == 0
    assert max(len(line) for line in result.output.splitlines()) <= 80 and "…" not in result.output
    words = set(re.findall(r"--[a-z0-9-]+", result.output))
    shared = [_params.option_name(a) for _, a, _ in (*_params.REACH["rolling"], *_params.pipeline_params())]
    missing = [flag.partition("/")[0] for flag in shared if flag.partition("/")[0] not in words]
    assert not missing, missing  # none cut short by a too narrow column
    panels = re.findall(r"╭─ (.+?) ─", result.output)
    assert {o.group for o in OPTION_TABLE if "plan" in o.commands} <= set(panels)
    assert {"Connection", "Fleet", "Output"} <= set(panels)


def test_a_new_row_reaches_the_fixes_and_their_renderers(extended):
    from ansible_collections.gpunode.gpu.plugins.plugin_utils.gpunode_bridge import ansible_fix
    from gpunode import fixes
    from gpunode.cli._target import runnable

    fix = fixes.gpunode("install", widget_colour="red")
    assert runnable(fix, ["--host", "gpu-01"]) == "gpunode install --host gpu-01 --widget-colour red"
    assert ansible_fix(fix, ["--host", "gpu-01"]) == 'gpunode.gpu.node: {widget_colour: "red"}'


def test_one_request_class_for_the_library_and_the_cli():
    """plan/install's Request is declared once, beside Options; the library and the CLI both make that class."""
    from gpunode import option_checks
    from gpunode.cli import _inputs

    made = api.request({"only": ["driver"]})
    assert type(made) is options.Request
    assert api.Request is option_checks.Request is _inputs.Request is options.Request
    assert [s.name for s in made.steps] == ["driver"] and made.options.reboot is False
