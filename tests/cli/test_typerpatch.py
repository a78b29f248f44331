"""gpunode/cli/_typerpatch.py: typer's help without rich.markdown / rich.traceback, and typer's parameter coercion
without pydantic for the values its adapter returns the same. Each is checked against typer's own behaviour."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any

import pytest
import typer
from typer._click import Context
from typer._click.exceptions import BadParameter
from typer._coercion import build_runtime_param

from gpunode.cli._typerpatch import _Deferred, defer_coercion

ROOT = Path(__file__).resolve().parents[2]
# what `gpunode --help` no longer imports (typer.rich_utils' Markdown and Traceback; typer's pydantic coercion)
NOT_FOR_HELP = ("markdown_it", "mdurl", "rich.markdown", "rich.traceback", "rich.pretty", "rich.syntax", "pygments",
                "attr", "pydantic", "typer._adapters")
# and what `gpunode --help` (the listing) no longer loads of gpunode's own: the option table, the output module
NOT_FOR_THE_LISTING = ("gpunode.options", "gpunode.cli._params", "gpunode.ui", "json")


def _run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={"COLUMNS": "100", "PATH": "/usr/bin:/bin", "TERM": "dumb", **env})


def _main(argv: list[str], before: str = "") -> str:
    return (f"import sys\n{before}\nfrom gpunode.cli import run\nsys.argv = ['gpunode', *{argv!r}]\n"
            "try:\n    run()\nexcept SystemExit:\n    pass\n"
            "print('MODULES', ' '.join(sorted(sys.modules)), file=sys.stderr)\n")


def _modules(stderr: str) -> set[str]:
    line = next(line for line in stderr.splitlines() if line.startswith("MODULES "))
    return set(line.split()[1:])


def _loaded(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in names))


@pytest.mark.parametrize("argv", [["--help"], [], ["plan", "--help"], ["compat", "--help"], ["compat", "--gpu", "T4"]])
def test_help_and_an_offline_command_import_neither_markdown_nor_traceback_nor_pydantic(argv):
    done = _run(_main(argv))
    assert "gpunode" in done.stdout or "Tesla T4" in done.stdout  # the help (or compat's answer) was printed
    assert _loaded(_modules(done.stderr), NOT_FOR_HELP) == []


def test_the_listing_loads_neither_the_option_table_nor_the_output_module():
    done = _run(_main(["--help"]))
    assert "Commands" in done.stdout
    assert _loaded(_modules(done.stderr), NOT_FOR_THE_LISTING) == []


@pytest.mark.parametrize("argv", [["--help"], [], ["plan", "--help"], ["install", "--help"], ["uninstall", "-h"]])
def test_help_is_the_same_as_with_typers_own_import(argv):
    # TERMINAL_WIDTH (a width fixed for rich) is left to typer's renderer (elsewhere gpunode/cli/_plainhelp.py
    # draws the help, see tests/cli/test_plainhelp.py)
    ours = _run(_main(argv), TERMINAL_WIDTH="100")
    theirs = _run(_main(argv, before="import typer.rich_utils"), TERMINAL_WIDTH="100")  # as typer imports it
    assert "rich.markdown" in _modules(theirs.stderr)  # the reference really is typer's own import
    assert "typer.rich_utils" in _modules(ours.stderr) and "rich.markdown" not in _modules(ours.stderr)
    assert ours.stdout == theirs.stdout and ours.stdout.count("\n") > 10


def test_the_stand_ins_import_the_real_classes_when_used():
    done = _run(
        "import sys\nfrom gpunode.cli._typerpatch import import_rich_help\nru = import_rich_help()\n"
        "assert 'rich.markdown' not in sys.modules and 'rich.traceback' not in sys.modules\n"
        "md = ru.Markdown('# title', style='')\n"
        "import rich.markdown, rich.traceback\n"
        "assert type(md) is rich.markdown.Markdown and isinstance(md, ru.Markdown)\n"
        "assert sys.modules['rich.markdown'] is rich.markdown and hasattr(rich.markdown, 'Heading')\n"
        "try:\n    1 / 0\nexcept ZeroDivisionError as exc:\n    tb = ru.Traceback.from_exception(type(exc), exc, exc.__traceback__)\n"
        "assert type(tb) is rich.traceback.Traceback\nprint('ok')\n")
    assert done.stdout.strip() == "ok", done.stderr


def test_a_typer_wanting_more_of_rich_markdown_gets_its_own_import(tmp_path):
    (tmp_path / "wants_more.py").write_text("from rich.markdown import Markdown, Heading\n")
    done = _run(f"import sys\nsys.path.insert(0, {str(tmp_path)!r})\n"
                "from gpunode.cli._typerpatch import import_rich_help\nm = import_rich_help('wants_more')\n"
                "import rich.markdown\nassert m.Heading is rich.markdown.Heading and m.Markdown is rich.markdown.Markdown\n"
                "print('ok')\n")
    assert done.stdout.strip() == "ok", done.stderr


def test_markdown_help_still_renders_markdown():
    # gpunode never uses rich_markup_mode="markdown"; if it did, the stand-in must give typer the real Markdown
    app = ("import typer\napp = typer.Typer(rich_markup_mode='markdown')\n@app.command()\n"
           "def hello(name: str = 'x') -> None:\n    '''Say **hello** to `name`.\n\n* one\n* two\n    '''\n"
           "@app.command()\ndef bye() -> None:\n    pass\n")
    run = "import sys\nsys.argv = ['x', 'hello', '--help']\ntry:\n    app()\nexcept SystemExit:\n    pass\n"
    ours = _run(app + "from gpunode.cli._typerpatch import import_rich_help\nimport_rich_help()\n" + run)
    theirs = _run(app + run)
    assert "•" in theirs.stdout and "**" not in theirs.stdout  # markdown really rendered
    assert ours.stdout == theirs.stdout, ours.stderr


# -- the deferred coercion against typer's own, value by value --------------------------------------------------
def _command() -> Any:
    app = typer.Typer()

    @app.command()
    def cmd(s: Annotated[str, typer.Option()] = "a", o: Annotated[str | None, typer.Option()] = None,
            i: Annotated[int, typer.Option()] = 8, f: Annotated[float, typer.Option()] = 15.0,
            oi: Annotated[int | None, typer.Option()] = None, b: Annotated[bool, typer.Option()] = False,
            ls: Annotated[list[str] | None, typer.Option()] = None,
            r: Annotated[int, typer.Option(min=1, max=5)] = 2) -> None:
        pass

    @app.command()
    def other() -> None:
        pass

    return typer.main.get_command(app).commands["cmd"]


VALUES = [None, "", "x", "8", "08", "0", "-1", "+3", " 3", "3 ", "1_000", "1e3", "2.5", "2.", ".5", "0.1", "٣", "9" * 19,
          "1.0000000000000002", "1.2.3", "..", "inf", "nan", "0x10", "00", "-0", "1" * 30, "0." + "1" * 20, 8, 8.0,
          True, 0, ("a", "b"), ["a"], (), ("a", 1), "7", "1", "6"]


def _outcome(coerce: Any, value: Any) -> tuple[str, Any]:
    try:
        got = coerce(value)
    except BadParameter as exc:
        return "error", exc.format_message()
    return type(got).__name__, repr(got)  # repr: nan equals nan


@pytest.mark.parametrize("name", ["s", "o", "i", "f", "oi", "b", "ls", "r"])
def test_deferred_coercion_gives_what_typers_adapter_gives(name):
    command = _command()
    param = next(p for p in command.params if p.name == name)
    ctx = Context(command)
    theirs = build_runtime_param(param.type_descriptor)
    desc = param.type_descriptor
    for value in VALUES:
        ours = _Deferred(parameter_info=desc.parameter_info, annotation=desc.annotation, descriptor=desc)
        param._runtime_param = None
        expected = _outcome(lambda v: theirs.coerce(v, param=param, ctx=ctx), value)
        assert _outcome(lambda v, ours=ours: ours.coerce(v, param=param, ctx=ctx), value) == expected, (name, value)


def test_defer_coercion_builds_no_adapter_for_plain_values_and_typers_own_for_the_rest():
    command = defer_coercion(_command())
    ctx = Context(command)
    params = {p.name: p for p in command.params}
    assert all(isinstance(p._runtime_param, _Deferred) for p in params.values())
    assert params["i"].process_value(ctx, "8") == 8 and isinstance(params["i"]._runtime_param, _Deferred)
    assert params["ls"].process_value(ctx, ("a", "b")) == ["a", "b"]
    assert params["i"].process_value(ctx, "-1") == -1  # not a plain decimal: typer's adapter, kept from now on
    assert not isinstance(params["i"]._runtime_param, _Deferred)
    with pytest.raises(BadParameter):
        params["r"].process_value(ctx, "9")  # a range: always typer's adapter


def test_a_command_given_string_options_imports_no_pydantic():
    # the argv of a converged install in benchmarks/roundtrips.py: strings only (the node is unreachable here)
    done = _run(_main(["plan", "--host", "127.0.0.1:1", "--driver", "550.54.14", "--parallel", "3",
                       "--connect-timeout", "0.5"]))
    assert "cannot connect" in done.stderr  # the options were read and checked: it got as far as connecting
    assert _loaded(_modules(done.stderr), ("pydantic", "typer._adapters")) == []
