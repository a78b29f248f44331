"""The `gpunode` command line. Each command lives in its own module; this file only composes them.

Commands are imported when they run, not at start-up: `gpunode --help` and `--version` load neither the compat
tables, nor paramiko, nor the pipeline. The listing in `--help` comes from COMMANDS (a test keeps each line equal
to the first paragraph of the command's own docstring, which `gpunode COMMAND --help` shows)."""

from __future__ import annotations

import importlib
import shlex
from typing import Annotated, Any, NoReturn

import typer
from typer._click.exceptions import UsageError as ClickUsageError
from typer.core import TyperCommand, TyperGroup

from gpunode import __version__
from gpunode.cli._help import HelpCommand, HelpOpt, format_help
from gpunode.cli._typerpatch import defer_coercion

# name -> (module, function, the one-line help shown by `gpunode --help`)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "plan": ("gpunode.cli.pipeline", "plan",
             "Show what `install` would change, step by step, with exact commands and file diffs. Changes nothing."),
    "install": ("gpunode.cli.pipeline", "install",
                "Apply the pipeline: each step is planned, applied, then planned again and must report `ok`."),
    "doctor": ("gpunode.cli.doctor", "doctor",
               "Diagnose the node (read-only): exit 0 all pass, 1 any failure, 2 usage or connection error."),
    "verify": ("gpunode.cli.verify", "verify",
               "Run nvidia-smi in a container per engine (docker, containerd, podman), or in a Kubernetes pod with "
               "--k8s; compare its GPUs with the host's."),
    "compat": ("gpunode.cli.compat", "compat",
               "CUDA / driver / GPU compatibility, offline: --driver, --cuda, --image, --gpu (combinable)."),
    "uninstall": ("gpunode.cli.uninstall", "uninstall",
                  "Undo what gpunode installed, in reverse order, from the node's journal. Never removes what gpunode "
                  "did not install."),
    "status": ("gpunode.cli.status", "status",
               "Show the node's journal: runs, steps applied, backups made. Exit 1 if the last run did not finish."),
    "explain": ("gpunode.cli.explain", "explain",
                "Explain an error message: cause and fix. Exit 0 recognised, 1 nothing recognised, 2 usage error."),
    "facts": ("gpunode.cli.facts", "facts",
              "Print the parsed facts of the node as JSON (read-only). The output is always JSON; --json is "
              "accepted."),
}


def load_command(name: str) -> Any:
    """The click command of `name`, built by typer from its module (imported now)."""
    module, function, _ = COMMANDS[name]
    single = typer.Typer(add_completion=False, pretty_exceptions_show_locals=False)
    single.command(name=name, add_help_option=False, cls=HelpCommand)(getattr(importlib.import_module(module), function))
    return defer_coercion(typer.main.get_command(single))


def usage_error(exc: ClickUsageError, command: str | None = None) -> NoReturn:
    """click's own usage errors (an unknown option or command, a missing value) as gpunode prints every usage
    error: `error:` and a runnable `fix:` (the command's --help), exit 2."""
    path = exc.ctx.command_path.split() if exc.ctx is not None else ["gpunode"]
    if len(path) == 1 and command in COMMANDS:  # an error click raised without the command's context
        path.append(command)
    listing = "lists the commands" if len(path) == 1 else "lists its options"
    # imported on the error paths only: `gpunode --help` does not load the output module
    from gpunode.ui import print_error

    print_error(exc.format_message(), shlex.join([*path, "--help"]) + f"  # {listing}")
    raise typer.Exit(2)


class LazyGroup(TyperGroup):
    """Lists every command from COMMANDS; imports a command's module only when that command is resolved. Usage
    errors click finds itself (gpunode --bogus, gpunode plan --driver with no value) get a fix line, exit 2."""

    _listing = False

    def make_context(self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any) -> Any:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except ClickUsageError as exc:
            usage_error(exc)

    def invoke(self, ctx: Any) -> Any:
        given = [*(getattr(ctx, "_protected_args", None) or getattr(ctx, "protected_args", None) or []), *ctx.args]
        try:
            return super().invoke(ctx)
        except ClickUsageError as exc:
            usage_error(exc, given[0] if given else None)

    def list_commands(self, ctx: Any) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name not in COMMANDS:
            return None
        if self._listing:  # the help listing needs only the name and the line
            return TyperCommand(cmd_name, help=COMMANDS[cmd_name][2], add_help_option=False)
        if cmd_name not in self.commands:
            self.commands[cmd_name] = load_command(cmd_name)
        return self.commands[cmd_name]

    def get_params(self, ctx: Any) -> list[Any]:
        """typer's --install-completion / --show-completion are flags: no `<bool>` after them in --help, like
        gpunode's own flags."""
        params = super().get_params(ctx)
        defer_coercion(self)  # typer's completion flags would import pydantic for their value None
        for param in params:
            if param.name in ("install_completion", "show_completion") and param.metavar is None:
                param.metavar = ""
        return params

    def shell_complete(self, ctx: Any, incomplete: str) -> list[Any]:
        """Completing a command name (`gpunode ins<TAB>`) lists COMMANDS without importing every command; the
        options of a command (`gpunode install --<TAB>`) import only that command's module."""
        self._listing = True
        try:
            return list(super().shell_complete(ctx, incomplete))
        finally:
            self._listing = False

    def format_help(self, ctx: Any, formatter: Any) -> None:
        self._listing = True
        try:
            listed = (self.get_command(ctx, name) for name in self.list_commands(ctx))
            format_help(self, ctx, formatter, tuple(c for c in listed if c is not None and not c.hidden))
        finally:
            self._listing = False


app = typer.Typer(
    name="gpunode",
    cls=LazyGroup,
    help="Turn a Linux box with NVIDIA GPUs into a working GPU container host, locally or over SSH.",
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion [bash|zsh|fish|powershell]
    pretty_exceptions_show_locals=False,  # locals may hold passwords
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        print(f"gpunode {__version__}")
        raise typer.Exit(0)


@app.callback(add_help_option=False)
def _main(
    help_: HelpOpt = False,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, metavar="",
                                          help="Print the version and exit.")] = False,
) -> None:
    """gpunode: plan, install, doctor, verify, compat."""


def run() -> None:
    """`gpunode` with sys.argv, ending in SystemExit like any typer app. Expected errors are handled inside each
    command (gpunode/cli/_params.py); a reader that closes the pipe early ends the program quietly with 141, like
    any Unix filter."""
    try:
        app()
    except BrokenPipeError:
        from gpunode.ui import broken_pipe

        broken_pipe()


def main() -> None:
    """The `gpunode` entry point: `run`, then the process ends at once (end_now)."""
    try:
        run()
    except SystemExit as done:
        end_now(done.code)
        raise
    end_now(0)


def end_now(code: object) -> None:
    """End the process with `code` without the interpreter's teardown, which frees every module and object one by
    one: ~40 ms of CPU after a converged install has printed its report. What that teardown does that matters is
    done first: the atexit handlers run (logging's flush and close among them) and stdout and stderr are flushed.
    Returns, for the usual exit, while a thread that is not a daemon still runs (the interpreter waits for it) or
    when `code` is not a number (SystemExit prints it)."""
    import atexit
    import os
    import sys
    import threading

    if not (code is None or isinstance(code, int)):
        return
    if any(thread is not threading.current_thread() and not thread.daemon and thread.is_alive()
           for thread in threading.enumerate()):
        return
    atexit._run_exitfuncs()
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except BrokenPipeError:
        from gpunode.ui import BROKEN_PIPE_EXIT

        os._exit(BROKEN_PIPE_EXIT)
    os._exit(code or 0)
