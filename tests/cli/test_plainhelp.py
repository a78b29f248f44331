"""gpunode/cli/_plainhelp.py: `--help` drawn without rich when stdout is not a terminal is, byte for byte, what
typer's rich renderer draws there; where it cannot be sure it steps aside and typer's renderer draws it."""

from __future__ import annotations

from typing import Annotated

import pytest
import typer
from typer.testing import CliRunner

import gpunode.cli._plainhelp as plainhelp
from gpunode.cli import COMMANDS, app, load_command
from gpunode.cli._help import HelpCommand, HelpOpt

runner = CliRunner()
# nothing in the environment forces a terminal, a colour or a width on either renderer
PLAIN = {"FORCE_COLOR": None, "PY_COLORS": None, "GITHUB_ACTIONS": None, "TTY_COMPATIBLE": None,
         "TERMINAL_WIDTH": None, "_TYPER_FORCE_DISABLE_TERMINAL": None}


def _help(target: typer.Typer, argv: list[str], width: int, monkeypatch: pytest.MonkeyPatch,
          typers: bool) -> tuple[str, int]:
    """The help printed for argv, by gpunode's renderer or (typers=True) by typer's; and how many times gpunode's
    drew it."""
    drawn = []
    real = plainhelp.render

    def counted(*args, **kwargs):
        text = real(*args, **kwargs)
        drawn.append(1)
        return text

    with monkeypatch.context() as m:
        m.setattr(plainhelp, "render", counted)
        if typers:
            m.setattr(plainhelp, "plain_width", lambda: None)
        result = runner.invoke(target, argv, env={**PLAIN, "COLUMNS": str(width)})
    assert result.exit_code == 0, result.output
    return result.stdout, len(drawn)


@pytest.mark.parametrize("width", [60, 80, 100, 133, 200])
@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_the_help_is_typer_s_byte_for_byte(command, width, monkeypatch):
    argv = [command, "--help"] if command else ["--help"]
    ours, drawn = _help(app, argv, width, monkeypatch, typers=False)
    theirs, _ = _help(app, argv, width, monkeypatch, typers=True)
    assert "Usage: gpunode" in theirs and "╭─ Options" in theirs  # typer's renderer really drew its panels
    assert ours == theirs
    if width >= 80:  # the common case (a pipe, 80 columns or more) really is drawn without rich
        assert drawn == 1


def _toy(markup: bool) -> typer.Typer:
    """A command with what gpunode's own do not use (yet): an argument, a --x/--no-x flag, a default shown as
    text, a two-paragraph docstring, long words, a panel of its own; with `markup`, a required argument and rich
    markup in a help (which gpunode's renderer leaves to typer's)."""
    toy = typer.Typer(add_completion=False)
    @toy.command(add_help_option=False, cls=HelpCommand)
    def run(name: Annotated[str, typer.Argument(help="The name.")] = "world",
            count: Annotated[int, typer.Option("--count", "-c", help="How many times, at most this many.")] = 3,
            loud: Annotated[bool, typer.Option("--loud/--quiet", help="Shout.")] = False,
            where: Annotated[str, typer.Option(help="A path: /a/very/long/path/without/any/space/in/it/at/all.",
                                               show_default="here", rich_help_panel="Place")] = ".",
            help_: HelpOpt = False) -> None:
        """Run the toy.

        A second paragraph
        on two lines.
        """

    @toy.command(add_help_option=False, cls=HelpCommand)
    def styled(name: Annotated[str, typer.Argument(help="The name.")],
               text: Annotated[str, typer.Option(help="Some [bold]bold[/bold] text.")] = "x",
               help_: HelpOpt = False) -> None:
        """Styled."""

    return toy


@pytest.mark.parametrize("width", [30, 45, 60, 80, 120])
@pytest.mark.parametrize("command", ["run", "styled"])
def test_a_command_unlike_gpunode_s_is_drawn_the_same(command, width, monkeypatch):
    ours, drawn = _help(_toy(command == "styled"), [command, "--help"], width, monkeypatch, typers=False)
    theirs, _ = _help(_toy(command == "styled"), [command, "--help"], width, monkeypatch, typers=True)
    assert f"Usage: root {command}" in theirs
    assert ours == theirs
    if command == "styled":
        assert drawn == 0  # the markup and the required argument: typer's renderer drew it
    elif width >= 80:
        assert drawn == 1


@pytest.mark.parametrize("mode", [None, "markdown"])
def test_another_markup_mode_is_left_to_typer(mode, monkeypatch):
    toy = typer.Typer(add_completion=False, rich_markup_mode=mode)

    @toy.command(add_help_option=False, cls=HelpCommand)
    def run(count: Annotated[int, typer.Option(help="How many.")] = 3, help_: HelpOpt = False) -> None:
        """Run."""

    ours, drawn = _help(toy, ["--help"], 80, monkeypatch, typers=False)
    theirs, _ = _help(toy, ["--help"], 80, monkeypatch, typers=True)
    assert "How many." in theirs and ours == theirs and drawn == 0


def test_a_terminal_gets_typer_s_colours(monkeypatch):
    # FORCE_COLOR makes rich (and typer) treat stdout as a colour terminal: gpunode's renderer steps aside
    result = runner.invoke(app, ["compat", "--help"], env={**PLAIN, "FORCE_COLOR": "1", "COLUMNS": "100"})
    assert "\x1b[" in result.stdout and "driver" in result.stdout


@pytest.mark.parametrize(("env", "plain"), [({}, True), ({"FORCE_COLOR": "1"}, False), ({"TTY_COMPATIBLE": "1"}, False),
                                            ({"TERMINAL_WIDTH": "90"}, False), ({"COLUMNS": "120"}, True)])
def test_plain_width_follows_rich_s_rules(env, plain, monkeypatch):
    for name in PLAIN:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("COLUMNS", "100")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    # pytest captures stdout: not a terminal
    assert plainhelp.plain_width() == ((int(env.get("COLUMNS", "100"))) if plain else None)


def test_the_wrap_is_rich_s():
    from rich.console import Console
    from rich.text import Text

    text = "aaa bbbb  c dddddddddddddd e f ggggggggggg hh"
    for width in range(3, 30):
        console = Console(width=width, color_system=None, file=None)
        with console.capture() as captured:
            console.print(Text(text), overflow="fold")
        assert [line.ljust(width) for line in captured.get().split("\n")[:-1]] == \
            plainhelp._wrap(text, width, fold=True), width


def test_each_command_is_built_with_the_help_command():
    assert all(isinstance(load_command(name), HelpCommand) for name in COMMANDS)
