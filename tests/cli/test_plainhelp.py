"""gpunode/cli/_plainhelp.py: `--help` drawn without rich's console is, byte for byte, what typer's rich renderer
draws, on a pipe (plain text) and at a terminal (ANSI styles, in each colour system rich picks); where it cannot be
sure it steps aside and typer's renderer draws it."""

from __future__ import annotations

import io
import os
from collections.abc import Mapping
from typing import Annotated

import pytest
import typer
from typer import rich_utils
from typer.testing import CliRunner

import gpunode.cli._plainhelp as plainhelp
from gpunode.cli import COMMANDS, app, load_command
from gpunode.cli._help import HelpCommand, HelpOpt

runner = CliRunner()
# nothing in the environment forces a terminal, a colour or a width on either renderer
PLAIN = {"FORCE_COLOR": None, "PY_COLORS": None, "GITHUB_ACTIONS": None, "TTY_COMPATIBLE": None,
         "TERMINAL_WIDTH": None, "_TYPER_FORCE_DISABLE_TERMINAL": None, "NO_COLOR": None, "COLORTERM": None,
         "TERM": "xterm"}
# how rich would print (CliRunner's stdout is not a terminal): plain text, or a terminal in each colour system rich
# picks (from TERM and COLORTERM), or one with NO_COLOR (bold and dim, no colour)
CONSOLES = {"plain": {}, "standard": {"FORCE_COLOR": "1"},
            "256": {"TTY_COMPATIBLE": "1", "TERM": "xterm-256color"},
            "truecolor": {"PY_COLORS": "1", "COLORTERM": "truecolor"},
            "no_color": {"FORCE_COLOR": "1", "NO_COLOR": "1"}}


def _typer_s_force_terminal(env: Mapping[str, str | None]) -> bool | None:
    """typer.rich_utils' FORCE_TERMINAL, as if it were imported in `env` (it reads the environment once, then)."""
    if env.get("_TYPER_FORCE_DISABLE_TERMINAL"):
        return False
    return True if env.get("GITHUB_ACTIONS") or env.get("FORCE_COLOR") or env.get("PY_COLORS") else None


def _help(target: typer.Typer, argv: list[str], width: int, monkeypatch: pytest.MonkeyPatch,
          typers: bool, console: str = "plain", extra: Mapping[str, str] | None = None) -> tuple[str, int]:
    """The help printed for argv in that console (and `extra` environment), by gpunode's renderer or (typers=True)
    by typer's; and how many times gpunode's drew it."""
    drawn = []
    real = plainhelp.render

    def counted(*args, **kwargs):
        text = real(*args, **kwargs)
        drawn.append(1)
        return text

    env = {**PLAIN, **CONSOLES[console], "COLUMNS": str(width), **(extra or {})}
    with monkeypatch.context() as m:
        m.setattr(rich_utils, "FORCE_TERMINAL", _typer_s_force_terminal(env))
        m.setattr(plainhelp, "render", counted)
        if typers:
            m.setattr(plainhelp, "console", lambda: None)
        result = runner.invoke(target, argv, env=env)
    assert result.exit_code == 0, result.output
    return result.stdout, len(drawn)


def _typer_s_console(console: str, monkeypatch: pytest.MonkeyPatch) -> tuple[bool, str | None, bool]:
    """What rich's Console, made as typer makes it, decides in that environment: a terminal? its colour system,
    and NO_COLOR."""
    from rich.console import Console

    for name, value in {**PLAIN, **CONSOLES[console]}.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    monkeypatch.setenv("COLUMNS", "100")
    forced = _typer_s_force_terminal(os.environ)
    monkeypatch.setattr(rich_utils, "FORCE_TERMINAL", forced)
    made = Console(force_terminal=forced, file=io.StringIO())
    return made.is_terminal, made.color_system, made.no_color


@pytest.mark.parametrize(("console", "decided"), [("plain", (False, None, False)),
                                                  ("standard", (True, "standard", False)),
                                                  ("256", (True, "256", False)),
                                                  ("truecolor", (True, "truecolor", False)),
                                                  ("no_color", (True, "standard", True))])
def test_each_console_is_the_one_rich_picks(console, decided, monkeypatch):
    assert _typer_s_console(console, monkeypatch) == decided
    assert plainhelp.console() == (100, [plainhelp.PLAIN, plainhelp.COLOUR, plainhelp.COLOUR, plainhelp.COLOUR,
                                         plainhelp.NO_COLOUR][list(CONSOLES).index(console)])


@pytest.mark.parametrize("console", CONSOLES)
@pytest.mark.parametrize("width", [60, 80, 100, 133, 200])
@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_the_help_is_typer_s_byte_for_byte(command, width, console, monkeypatch):
    argv = [command, "--help"] if command else ["--help"]
    ours, drawn = _help(app, argv, width, monkeypatch, typers=False, console=console)
    theirs, _ = _help(app, argv, width, monkeypatch, typers=True, console=console)
    assert "Usage: " in theirs and " Options " in theirs  # typer's renderer really drew its panels
    assert ("\x1b[1;36m-\x1b[0m" in theirs) is (console not in ("plain", "no_color"))  # in colour: --x in bold cyan
    assert ("\x1b[1m" in theirs) is (console != "plain")
    assert ours == theirs
    if width >= 80:  # the common case (80 columns or more) really is drawn without rich's console
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


@pytest.mark.parametrize("console", CONSOLES)
@pytest.mark.parametrize("width", [30, 45, 60, 80, 120])
@pytest.mark.parametrize("command", ["run", "styled"])
def test_a_command_unlike_gpunode_s_is_drawn_the_same(command, width, console, monkeypatch):
    ours, drawn = _help(_toy(command == "styled"), [command, "--help"], width, monkeypatch, typers=False,
                        console=console)
    theirs, _ = _help(_toy(command == "styled"), [command, "--help"], width, monkeypatch, typers=True,
                      console=console)
    if console in ("standard", "256", "truecolor") and command == "run" and width >= 80:  # --quiet: bold magenta
        assert "\x1b[1;35m-\x1b[0m\x1b[1;35m-quiet\x1b[0m" in theirs
    assert f"root {command} [OPTIONS]" in theirs
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


@pytest.mark.parametrize("env", [{"FORCE_COLOR": "1", "TERM": "dumb"}, {"FORCE_COLOR": "1", "TERMINAL_WIDTH": "90"},
                                 {"TERMINAL_WIDTH": "90"}])
def test_a_dumb_terminal_or_a_fixed_width_is_left_to_typer(env, monkeypatch):
    out, drawn = _help(app, ["compat", "--help"], 100, monkeypatch, typers=False, extra=env)
    assert "driver" in out and drawn == 0


@pytest.mark.parametrize(("env", "drawn"), [({}, (100, plainhelp.PLAIN)), ({"COLUMNS": "120"}, (120, plainhelp.PLAIN)),
                                            ({"FORCE_COLOR": "1"}, (100, plainhelp.COLOUR)),
                                            ({"TTY_COMPATIBLE": "1"}, (100, plainhelp.COLOUR)),
                                            ({"GITHUB_ACTIONS": "true"}, (100, plainhelp.COLOUR)),
                                            ({"FORCE_COLOR": ""}, (100, plainhelp.PLAIN)),
                                            ({"FORCE_COLOR": "1", "_TYPER_FORCE_DISABLE_TERMINAL": "1"},
                                             (100, plainhelp.PLAIN)),
                                            ({"TTY_COMPATIBLE": "0"}, (100, plainhelp.PLAIN)),
                                            ({"FORCE_COLOR": "1", "NO_COLOR": "1"}, (100, plainhelp.NO_COLOUR)),
                                            ({"FORCE_COLOR": "1", "TERM": "dumb"}, None),
                                            ({"TERMINAL_WIDTH": "90"}, None)])
def test_the_console_follows_rich_s_rules(env, drawn, monkeypatch):
    for name in PLAIN:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("COLUMNS", "100")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(rich_utils, "FORCE_TERMINAL", _typer_s_force_terminal(os.environ))
    # pytest captures stdout: not a terminal
    assert plainhelp.console() == drawn


def test_the_wrap_is_rich_s():
    from rich.console import Console
    from rich.text import Text

    text = "aaa bbbb  c dddddddddddddd e f ggggggggggg hh"
    for width in range(3, 30):
        console = Console(width=width, color_system=None, file=None)
        with console.capture() as captured:
            console.print(Text(text), overflow="fold")
        assert [line.ljust(width) for line in captured.get().split("\n")[:-1]] == \
            [text[a:b].ljust(width) for a, b in plainhelp._pieces(text, width, fold=True)], width


def test_each_command_is_built_with_the_help_command():
    assert all(isinstance(load_command(name), HelpCommand) for name in COMMANDS)
