"""Start-up stays cheap: importing the CLI (what `gpunode --help` and `--version` need) loads no command module,
no SSH, HTTP or YAML library, no compat tables and no pipeline; the lazy `--help` listing says what each
command's own docstring says."""

from __future__ import annotations

import importlib
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpunode.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("paramiko", "requests", "yaml", "gpunode.compat", "gpunode.gpus", "gpunode.runner", "gpunode.steps",
         "gpunode.facts", "gpunode.connection", "gpunode.cli.compat", "gpunode.cli.pipeline")


def run_main(*argv: str) -> str:
    return f"import sys\nfrom gpunode.cli import run\nsys.argv = ['gpunode', *{list(argv)!r}]\n" \
           "try:\n    run()\nexcept SystemExit:\n    pass"


def loaded_after(code: str) -> set[str]:
    script = f"import sys\n{code}\nimport json; print(json.dumps(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, check=True)
    return set(json.loads(result.stdout.splitlines()[-1]))


def heavy(modules: set[str], names: tuple[str, ...] = HEAVY) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in names))


def test_importing_the_cli_loads_nothing_heavy():
    modules = loaded_after("import gpunode.cli")
    assert "gpunode.cli" in modules  # the probe really imported it
    assert heavy(modules) == [] and "rich.table" not in modules  # typer's help renders with rich: not here


def test_help_and_version_load_nothing_heavy():
    for argv in (["--help"], ["--version"]):
        modules = loaded_after(run_main(*argv))
        assert heavy(modules) == [], argv


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_command_s_help_loads_only_its_options(command):
    # the options come from the option table; what a run uses (steps, checks, facts, SSH, the runner, the compat
    # and explain tables, the journal) is imported by the run
    module = COMMANDS[command][0]
    modules = loaded_after(run_main(command, "--help"))
    assert module in modules  # the command's module really was loaded, for its options
    assert heavy(modules - {module}) == [] and heavy(modules, RUN_TIME) == []


RUN_TIME = ("gpunode.runner", "gpunode.doctor", "gpunode.verify", "gpunode.verify_k8s", "gpunode.undo",
            "gpunode.explain", "gpunode.journal", "gpunode.nodelock", "gpunode.fleet", "gpunode.inventory",
            "gpunode.cli._target", "gpunode.cli._inputs", "gpunode.cli._fleet", "gpunode.cli._pipeline_view")


def _help_text(command: str, first: str = "") -> str:
    script = f"{first}\n{run_main(command, '--help')}"
    import os
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, check=True,
                          env={**os.environ, "COLUMNS": "100", "TERM": "dumb"})
    return done.stdout


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_command_s_help_is_the_same_when_what_it_runs_is_already_loaded(command):
    # the help of a lazy command is the help of the same command with every run-time module imported first (as it
    # was before they became lazy): an annotation, default or help string read from a run-time module shows the
    # same either way
    loaded_first = _help_text(command, "import gpunode.runner, gpunode.doctor, gpunode.verify, gpunode.verify_k8s, "
                                       "gpunode.undo.engine, gpunode.explain, gpunode.compat, gpunode.journal, "
                                       "gpunode.cli._target, gpunode.cli._inputs, gpunode.cli._fleet, "
                                       "gpunode.cli._pipeline_view")
    lazy = _help_text(command)
    assert "--help" in lazy and f"gpunode {command}" in lazy  # the help really was printed
    assert lazy == loaded_first


def test_install_loads_neither_the_explain_tables_nor_doctor():
    # a converged install reads no explain table: the driver step loads them only when the installer fails
    modules = loaded_after("import gpunode.cli.pipeline, gpunode.cli._inputs, gpunode.cli._fleet, gpunode.runner, "
                           "gpunode.cli._pipeline_view, gpunode.cli._target, gpunode.connection.ssh")
    assert "gpunode.runner" in modules and "paramiko" in modules  # the probe really imported the install side
    assert sorted(m for m in modules if m.startswith(("gpunode.explain", "gpunode.doctor", "gpunode.verify"))) == []
    assert "yaml" not in modules  # only a YAML inventory needs it (gpunode/inventory.py)
    assert "rich.progress" not in modules  # only a transfer draws a bar (gpunode/cli/progress.py)
    assert "importlib.metadata" not in modules  # paramiko reads its version without it (gpunode/connection/ssh.py)


def test_running_a_command_loads_its_module():
    modules = loaded_after(run_main("compat", "--gpu", "T4"))
    assert {"gpunode.cli.compat", "gpunode.compat"} <= modules and "paramiko" not in modules


@pytest.mark.parametrize("name", list(COMMANDS))
def test_the_help_listing_is_the_command_s_own_first_paragraph(name):
    module, function, line = COMMANDS[name]
    doc = inspect.getdoc(getattr(importlib.import_module(module), function)) or ""
    assert " ".join(doc.split("\n\n")[0].split()) == line


def _gpunode(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    import os
    return subprocess.run([sys.executable, "-c", run_main(*argv)], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, **env}, timeout=120)


def test_install_completion_writes_the_script_under_home_only(tmp_path):
    # the shell is named (typer's own switch turns its detection off), so the test does not depend on what
    # process started pytest
    home = tmp_path / "home"
    home.mkdir()
    done = _gpunode("--install-completion", "bash",
                    env={"HOME": str(home), "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"})
    assert done.returncode == 0, done.stderr
    script = home / ".bash_completions" / "gpunode.sh"
    assert "_GPUNODE_COMPLETE=complete_bash" in script.read_text()
    assert f"source '{script}'" in (home / ".bashrc").read_text()


def test_completing_a_command_name_lists_commands_without_importing_them():
    code = ("import os\nos.environ.update(_GPUNODE_COMPLETE='complete_bash', COMP_WORDS='gpunode ', COMP_CWORD='1')\n"
            + run_main())
    modules = loaded_after(code)
    assert heavy(modules) == [] and not any(m.startswith("gpunode.cli.") and m.split(".")[-1] in
                                            {"pipeline", "doctor", "verify", "uninstall", "status"} for m in modules)
    done = _gpunode(env={"_GPUNODE_COMPLETE": "complete_bash", "COMP_WORDS": "gpunode ", "COMP_CWORD": "1"})
    assert done.stdout.split() == list(COMMANDS)


def test_completing_an_option_of_a_command():
    done = _gpunode(env={"_GPUNODE_COMPLETE": "complete_bash", "COMP_WORDS": "gpunode compat --dr",
                         "COMP_CWORD": "2"})
    assert done.stdout.split() == ["--driver"]


def test_the_completion_flags_are_listed_as_flags():
    from typer.testing import CliRunner

    from gpunode.cli import app
    shown = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "120"}).stdout
    rows = [line for line in shown.splitlines() if "--install-completion" in line or "--show-completion" in line]
    assert len(rows) == 2 and not any("<bool>" in row for row in rows)


# What a converged single-node install imports (as test_install_loads_neither_the_explain_tables_nor_doctor)
CONVERGED_PATH = ("gpunode.cli.pipeline, gpunode.cli._inputs, gpunode.cli._fleet, gpunode.runner, "
                  "gpunode.cli._pipeline_view, gpunode.cli._target, gpunode.connection.ssh")
# Regexes gpunode's own modules compile while the converged path is imported, measured 2026-11-25 (docs/benchmarks.md,
# "client CPU of a converged install"); a new module-level pattern that only a rarer path needs belongs in a
# function that compiles it on first use (as gpunode/fleetlog.py's secret patterns)
IMPORT_TIME_REGEXES = 58


def _compiled_at_import() -> list[str]:
    # the module whose body compiled each distinct pattern (re's own cache would hide repeats)
    code = ("import re, sys\nseen, where = set(), []\noriginal = re._compile\n"
            "def spy(pattern, flags):\n"
            "    frame = sys._getframe(1)\n"
            "    while frame.f_globals.get('__name__') == 're':\n        frame = frame.f_back\n"
            "    if not isinstance(pattern, re.Pattern) and (pattern, flags) not in seen and "
            "frame.f_code.co_name == '<module>':\n"
            "        seen.add((pattern, flags)); where.append(frame.f_globals['__name__'])\n"
            "    return original(pattern, flags)\n"
            f"re._compile = spy\nimport {CONVERGED_PATH}\nimport json; print(json.dumps(where))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    return json.loads(result.stdout.splitlines()[-1])


def test_the_converged_path_compiles_only_the_regexes_it_parses_with():
    where = _compiled_at_import()
    ours = [m for m in where if m.split(".")[0] == "gpunode"]
    assert len(where) > len(ours) > 0  # the spy saw them (the standard library's and ours)
    assert "gpunode.fleetlog" not in ours  # a fleet log's secret patterns: compiled when a fleet log writes
    assert len(ours) <= IMPORT_TIME_REGEXES, sorted(ours)


# Modules in sys.modules after `gpunode <command> --help` on a pipe or at a terminal (the help drawn by
# gpunode/cli/_plainhelp.py), measured 2026-11-25 (docs/benchmarks.md, "--help in CPU"): 156 for the listing, 168-169 for
# a command (its options' dataclasses bring gpunode/record.py; explain's too, since its module imports rich.text where
# it renders); `python3 -c pass` has 33.
HELP_IMPORTS = 169
# what typer's rich renderer needs and gpunode's plain one does not
RICH_RENDERER = ("rich.console", "rich.table", "rich.panel", "rich.columns", "typer.rich_utils")


@pytest.mark.parametrize("terminal", [False, True])
@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_a_help_imports_no_rich_renderer_and_few_modules(command, terminal):
    # on a pipe (plain text) and at a terminal (FORCE_COLOR: rich would colour it), gpunode/cli/_plainhelp.py draws
    import os
    argv = [command, "--help"] if command else ["--help"]
    script = f"import sys\n{run_main(*argv)}\nimport json; print(json.dumps(sorted(sys.modules)))"
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "PY_COLORS", "GITHUB_ACTIONS",
                                                               "TTY_COMPATIBLE", "TERMINAL_WIDTH", "NO_COLOR")}
    if terminal:
        env.update(FORCE_COLOR="1", TERM="xterm-256color")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, check=True,
                          env={**env, "COLUMNS": "100"})
    modules = set(json.loads(done.stdout.splitlines()[-1]))
    # the help was drawn, in colour at a terminal
    assert ("\x1b[2m Options \x1b[0m" if terminal else "╭─ Options") in done.stdout
    assert ("\x1b[" in done.stdout) is terminal
    if command:
        assert COMMANDS[command][0] in modules  # with the command's options, from its module
    assert heavy(modules, RICH_RENDERER) == []
    assert len(modules) <= HELP_IMPORTS, len(modules)


def test_out_and_err_are_made_on_first_use():
    # a command module imports them at its top; the console (and rich.console) comes with the first use
    code = ("import sys\nfrom gpunode.ui import err, out\nassert 'rich.console' not in sys.modules\n"
            "with out:\n    out.print('printed')\nassert 'rich.console' in sys.modules\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "printed"

# What a converged install (every step `ok`, nothing planned) must not import: the actions a change would run and
# the code they need (the driver's download and its .run reader, package commands, kubectl, the fleet, the event
# writer), and what other commands use. Each is imported by the function that plans or runs the change.
NOT_ON_THE_CONVERGED_PATH = (
    "gpunode.actions.driver", "gpunode.actions.packages", "gpunode.actions.k8s", "gpunode.actions.fabric",
    "gpunode.actions.runtime", "gpunode.artifacts.source", "gpunode.artifacts.download", "gpunode.artifacts.makeself",
    "gpunode.signing", "gpunode.steps.driver_packages", "gpunode.steps.k8s_sharing", "gpunode.fleet", "gpunode.inventory",
    "gpunode.cli.events", "gpunode.cli._fleet", "gpunode.explain", "gpunode.doctor", "gpunode.verify",
    "gpunode.undo", "requests", "yaml", "rich.progress", "rich.live",
    # the FULL probe's subsystems (gpunode/facts/registry.py FULL_ONLY); what only a package inside a zip file
    # (gpunode/datatables.py) or a TOML config needs
    "gpunode.facts.health", "gpunode.facts.gpuhealth", "gpunode.facts.virt", "importlib.resources", "tomllib")
# gpunode's own modules a converged single-node install over the fake connection loads, measured 2026-11-25
# (docs/benchmarks.md, "the converged path's imports": 89 before the first cut, 75 after it; "client CPU, round 5":
# 73, gpunode/record.py added and the FULL probe's three fact modules gone; the SSH connection adds connection.ssh
# on a real node; 74: gpunode/firstcommand.py, an install's first command sent ahead). A new module-level import a
# converged run does not use moves it into the function that needs it.
CONVERGED_GPUNODE_MODULES = 74


def _converged_run(tmp_path: Path) -> tuple[str, set[str]]:
    """A converged install of a fake node (a first install converges it, in this process), run again in a fresh
    interpreter: its output and the modules it loaded."""
    import pickle

    from typer.testing import CliRunner

    from gpunode import connection
    from gpunode import runner as runner_module
    from gpunode.cli import app
    from tests.fakes.connection import FakeConnection, FakeNode

    node = FakeNode(tools={"update-initramfs", "modprobe", "systemctl"}, nvidia_version="535.129.03",
                    modules={"nvidia", "nvidia_uvm", "nvidia_modeset"})
    node.add_gpu(0x1EB8)
    argv = ["install", "--host", "gpu-01", "--driver", "535.129.03", "--reboot"]
    saved = connection.open_connection, runner_module.REBOOT_POLL_SECONDS
    connection.open_connection, runner_module.REBOOT_POLL_SECONDS = \
        lambda spec: FakeConnection(node, name=spec.host), 0.0
    try:
        first = CliRunner().invoke(app, argv)
    finally:
        connection.open_connection, runner_module.REBOOT_POLL_SECONDS = saved
    assert first.exit_code == 0, first.output
    (tmp_path / "node.pickle").write_bytes(pickle.dumps(node))
    code = ("import json, pickle, sys\nfrom gpunode import connection\nfrom tests.fakes.connection import FakeConnection\n"
            f"node = pickle.loads(open({str(tmp_path / 'node.pickle')!r}, 'rb').read())\n"
            "connection.open_connection = lambda spec: FakeConnection(node, name=spec.host)\n"
            f"{run_main(*argv)}\n"
            f"json.dump(sorted(sys.modules), open({str(tmp_path / 'modules.json')!r}, 'w'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout, set(json.loads((tmp_path / "modules.json").read_text()))


def test_a_converged_install_loads_no_action_and_no_download_code(tmp_path):
    out, modules = _converged_run(tmp_path)
    assert "summary: 9 already ok; the node is ready" in out  # converged: the run planned nothing
    assert {"gpunode.runner", "gpunode.steps.driver", "gpunode.preflight", "gpunode.facts"} <= modules
    assert heavy(modules, NOT_ON_THE_CONVERGED_PATH) == []
    ours = sorted(m for m in modules if m.split(".")[0] == "gpunode")
    assert len(ours) <= CONVERGED_GPUNODE_MODULES, ours
