"""Every command-line option, declared once, and the decorator that gives a command its shared ones.

A command declares only its own options. `@command(reach=...)` adds the options that say how to reach nodes
(and the fleet options where a command has a fleet mode), checks them in gpunode/cli/_inputs.py before
anything connects or is created, and calls the command with one typed `Target`. Expected errors become
`error:` / `fix:` and their exit code; a closed stdout (`| head`) ends quietly.
"""

from __future__ import annotations

import functools
import inspect
import shlex
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Annotated, Any, get_args

import typer

from gpunode import options as table
from gpunode.cli._help import HelpOpt
from gpunode.errors import GpunodeError
from gpunode.options import CLI, OptionSpec, options_for
from gpunode.ui import broken_pipe, print_error, print_note

# -- connection (every command that reaches a node) ---------------------------------------------------------
HostOpt = Annotated[str | None, typer.Option(
    "--host", "-H", metavar="[USER@]HOST[:PORT]", show_default=False,
    help="The node: user@host, host:port, or a Host alias from ~/.ssh/config. Default: this machine.")]
HostsOpt = Annotated[list[str] | None, typer.Option(
    "--host", "-H", metavar="[USER@]HOST[:PORT]", show_default=False,
    help="The node: user@host, host:port, or a Host alias from ~/.ssh/config. Repeatable: several nodes run in "
    "parallel. Default: this machine.")]
IdentityOpt = Annotated[list[str] | None, typer.Option(
    "--identity", "-i", metavar="FILE", show_default=False,
    help="Private key file (repeatable). Default: IdentityFile from ssh config, ssh-agent, ~/.ssh/id_*.")]
KnownHostsOpt = Annotated[list[str] | None, typer.Option(
    "--known-hosts", metavar="FILE", show_default=False,
    help="Extra known_hosts file (repeatable); ~/.ssh/known_hosts is always read.")]
AcceptNewOpt = Annotated[bool, typer.Option(
    "--accept-new-host-key", metavar="",
    help="Trust and record the host key of a node never seen before. A CHANGED key is still refused.")]
SshConfigOpt = Annotated[str | None, typer.Option(
    "--ssh-config", metavar="FILE", show_default=False, help="ssh config file. Default: ~/.ssh/config.")]
AskPassOpt = Annotated[bool, typer.Option("--ask-pass", metavar="", help="Prompt for the SSH login password.")]
AskBecomePassOpt = Annotated[bool, typer.Option(
    "--ask-become-pass", "-K", metavar="",
    help="Prompt once for the sudo password (sent on stdin, never on a command line).")]
ConnectTimeoutOpt = Annotated[float, typer.Option(
    "--connect-timeout", metavar="SECONDS", help="Seconds to wait for SSH to connect (more than 0).")]
JsonOpt = Annotated[bool, typer.Option("--json", metavar="", help="Print JSON on stdout (schema in README).")]
# -- engines and image builds (docs/engines.md) ---------------------------------------------------------------
LocalOpt = Annotated[bool, typer.Option(
    "--local", metavar="", help="This machine, no SSH: for engines (DaemonSet, Slurm, cloud-init, Packer). Refused "
    "with --host or --inventory; must run as root.")]
ProgressFormatOpt = Annotated[str, typer.Option(
    "--progress", metavar="human|jsonl", help="jsonl: one JSON event per line on stdout (schema 1, docs/engines.md); "
    "human text goes to stderr.")]

# -- fleet (plan, install, doctor) --------------------------------------------------------------------------
InventoryOpt = Annotated[str | None, typer.Option(
    "--inventory", "-I", metavar="FILE", show_default=False,
    help="Nodes from a file: gpunode TOML/YAML, or an Ansible INI/YAML inventory.")]
LimitOpt = Annotated[str | None, typer.Option(
    "--limit", "-l", metavar="PATTERN", show_default=False,
    help="Only these hosts/groups (globs; a,b union, !x exclude, &x intersect).")]
ParallelOpt = Annotated[int, typer.Option("--parallel", metavar="N", help="How many nodes at once (1 or more).")]
LogDirOpt = Annotated[str | None, typer.Option(
    "--log-dir", metavar="DIR", show_default=False,
    help="Per-node logs of a fleet run. Default: ./gpunode-logs/<time>/ for install and uninstall; none for the "
    "read-only plan, doctor and uninstall --dry-run.")]
LogLevelOpt = Annotated[str, typer.Option(
    "--log-level", metavar="info|debug",
    help="Per-node log detail of a fleet run: info (commands and exit codes) or debug (also node output, file "
    "contents and the run's report, secrets masked).")]
BatchOpt = Annotated[str | None, typer.Option(
    "--batch", metavar="N|P%", show_default=False,
    help="Rolling batches: N nodes or P% of them at a time; the next batch starts when one is done.")]
MaxFailOpt = Annotated[str | None, typer.Option(
    "--max-fail", metavar="P%", show_default=False,
    help="Start no new batch once more than P% of the nodes failed.")]

# -- the pipeline (plan, install) ---------------------------------------------------------------------------
GpuOpt = Annotated[str | None, typer.Option(
    "--gpu", metavar="NAME|PCI-ID", show_default=False,
    help="GPU name as nvidia-smi or lspci prints it (H100, NVIDIA H100 80GB HBM3, RTX 4090) or PCI id (10de:2330).")]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", metavar="", help="Same as `gpunode plan`: show, change nothing.")]

# -- uninstall (gpunode/cli/uninstall.py) -------------------------------------------------------------------
UndoOnlyOpt = Annotated[list[str] | None, typer.Option(
    "--only", metavar="STEP", show_default=False,
    help="Undo only this step (repeatable). The build prerequisites are removed only when named.")]
UndoDryRunOpt = Annotated[bool, typer.Option(
    "--dry-run", metavar="", help="Show what uninstall would undo (commands and file diffs); change nothing.")]
UndoStopGpuServicesOpt = Annotated[bool, typer.Option(
    "--stop-gpu-services", metavar="", help="Stop the GPU services that hold the loaded driver (persistenced, "
    "fabric manager, DCGM, MPS) so it can be unloaded and removed; they are not started again. Never stops other "
    "processes.")]


def _panel(name: str, *annotations: Any) -> None:
    """--help lists these options under `name` (typer's rich help panels), not in one long table."""
    for annotation in annotations:
        get_args(annotation)[1].rich_help_panel = name


_panel("Connection", HostOpt, HostsOpt, LocalOpt, IdentityOpt, KnownHostsOpt, AcceptNewOpt, SshConfigOpt, AskPassOpt,
       AskBecomePassOpt, ConnectTimeoutOpt)
_panel("Output", JsonOpt, ProgressFormatOpt)
_panel("Fleet", InventoryOpt, LimitOpt, ParallelOpt, LogDirOpt, LogLevelOpt, BatchOpt, MaxFailOpt)

# name, annotation, default: the shared parameters, in the order --help lists them
CONNECTION: tuple[tuple[str, Any, Any], ...] = (
    ("local", LocalOpt, False), ("identity", IdentityOpt, None), ("known_hosts", KnownHostsOpt, None),
    ("accept_new_host_key", AcceptNewOpt, False), ("ssh_config", SshConfigOpt, None), ("ask_pass", AskPassOpt, False),
    ("ask_become_pass", AskBecomePassOpt, False), ("connect_timeout", ConnectTimeoutOpt, 15.0),
    ("json_output", JsonOpt, False))
FLEET: tuple[tuple[str, Any, Any], ...] = (
    ("inventory", InventoryOpt, None), ("limit", LimitOpt, None), ("parallel", ParallelOpt, 8),
    ("log_dir", LogDirOpt, None), ("log_level", LogLevelOpt, "info"))
ROLLING: tuple[tuple[str, Any, Any], ...] = (("batch", BatchOpt, None), ("max_fail", MaxFailOpt, None))



def cli_option(row: OptionSpec, panel: bool = True) -> Any:
    """The typer parameter type of one row of the option table (gpunode/options.py)."""
    python: Any = {"str": str, "path": str, "int": int, "float": float, "bool": bool}.get(row.type, str)
    if row.type == "list":
        python = str if row.split else list[str]
    optional = row.default is None
    info = typer.Option(row.flag, metavar="" if row.type == "bool" else row.metavar, help=row.help,
                        rich_help_panel=row.group if panel else None, show_default=not optional)
    return Annotated[python | None if optional else python, info]


def _row(name: str) -> OptionSpec:
    return next(o for o in table.option_table() if o.name == name)


def _group(command: str, *, reboot: bool = False) -> tuple[tuple[str, Any, Any], ...]:
    """(name, annotation, default) of the table's CLI options of `command`: the pipeline's or the reboot's."""
    return tuple((o.name, cli_option(o), o.default) for o in options_for(CLI, command)
                 if (o.group == "Reboots") == reboot)


# used by commands outside the pipeline (compat's --driver/--cuda/--image, uninstall's own)
DriverOpt = cli_option(_row("driver"), panel=False)
CudaOpt = cli_option(_row("cuda"), panel=False)
ImageOpt = cli_option(_row("image"), panel=False)
LockTimeoutOpt = cli_option(_row("lock_timeout"))
StopGpuServicesOpt = cli_option(_row("stop_gpu_services"))
RebootOpt = cli_option(_row("reboot"))
RebootTimeoutOpt = cli_option(_row("reboot_timeout"))


def pipeline_params() -> tuple[tuple[str, Any, Any], ...]:
    """plan and install: what to make true on the node (checked into a Request by _inputs.request)."""
    return _group("plan")


def reboot_params() -> tuple[tuple[str, Any, Any], ...]:
    return _group("install", reboot=True)


PIPELINE = pipeline_params()
REBOOT = reboot_params()

# reach: which shared options a command takes
REACH = {
    "none": (),  # compat, explain: offline
    "one": (("host", HostOpt, None), *CONNECTION),  # verify, status, facts
    "fleet": (("host", HostsOpt, None), *CONNECTION, *FLEET),  # doctor
    "rolling": (("host", HostsOpt, None), *CONNECTION, *FLEET, *ROLLING),  # plan, install
}


def option_name(annotation: Any) -> str:
    """--long-name of an Annotated typer option."""
    info = get_args(annotation)[1]
    first = [info.default] if isinstance(info.default, str) else []  # Annotated form: the first name is `default`
    return next(d for d in [*first, *info.param_decls] if d.startswith("--"))


def same_args(params: Sequence[inspect.Parameter], values: dict[str, Any], drop: Sequence[str] = ()) -> list[str]:
    """The options the user gave, as argv words, in a canonical order: to print the same command again."""
    words: list[str] = []
    for p in params:
        value = values.get(p.name, p.default)
        if p.name in drop or p.name == "help_" or value == p.default or value is None or value == []:
            continue
        name = option_name(p.annotation)
        if isinstance(value, bool):
            on, _, off = name.partition("/")  # "--hold-kernel/--no-hold-kernel": the word for the value given
            words.append(on if value or not off else off)
        elif isinstance(value, list):
            for item in value:
                words += [name, str(item)]
        else:
            words += [name, f"{value:g}" if isinstance(value, float) else str(value)]
    return words


def quoted(words: Sequence[str]) -> str:
    return shlex.join(words)


@contextmanager
def expected_errors(fixer: Callable[[str], str] | None = None) -> Iterator[None]:
    """GpunodeError -> `error: ...` and `fix: ...` on stderr and its exit code; no traceback."""
    try:
        yield
    except GpunodeError as exc:
        print_error(exc.message, fixer(exc.fix) if fixer and exc.fix else exc.fix)
        raise typer.Exit(exc.exit_code) from None


def _evaluated(annotation: Any, func: Callable[..., Any]) -> Any:
    """A parameter's annotation as `inspect.signature(eval_str=True)` gives it (a string under
    `from __future__ import annotations` is evaluated in the function's module)."""
    return eval(annotation, func.__globals__) if isinstance(annotation, str) else annotation


def command(reach: str = "none", pipeline: bool = False,
            reboot: bool = False) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Adds the shared options of `reach` (and of the pipeline, and --reboot) to a command. The command gets
    `target` (a Target, see gpunode/cli/_target.py), `request` (a Request: the steps and Options) and `argv`
    (the options it was given, to print the same command again), each only if it declares them."""
    def params(group: tuple[tuple[str, Any, Any], ...]) -> list[inspect.Parameter]:
        return [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
                for name, annotation, default in group]

    shared = params(REACH[reach])
    wanted = params((*(pipeline_params() if pipeline else ()), *(reboot_params() if reboot else ())))

    def decorate(func: Callable[..., None]) -> Callable[..., None]:
        # only the command's own options are evaluated: `target` and `request` may name their types under
        # TYPE_CHECKING, so that `gpunode plan --help` need not import what a run uses
        own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=_evaluated(p.annotation, func))
               for p in inspect.signature(func).parameters.values()
               if p.name not in ("target", "argv", "request")]
        every = [*shared, *wanted, *own, inspect.Parameter("help_", inspect.Parameter.KEYWORD_ONLY, default=False,
                                                  annotation=HelpOpt)]

        @functools.wraps(func)
        def run(**values: Any) -> None:
            values.pop("help_", None)
            from gpunode.cli import _inputs  # the checks load the pipeline: only when a command runs

            try:
                extra: dict[str, Any] = {}
                if "argv" in inspect.signature(func).parameters:
                    extra["argv"] = same_args(every, values, drop=("json_output",))
                with expected_errors():
                    if reach != "none":
                        again = ["gpunode", func.__name__, *same_args(every, values)]  # for the --local root fix
                        extra["target"] = _inputs.target(reach, {p.name: values.pop(p.name) for p in shared}, again)
                        for note in extra["target"].notes:
                            print_note(note)
                    if wanted:
                        extra["request"] = _inputs.request({p.name: values.pop(p.name) for p in wanted},
                                                           extra.get("target"))
                func(**values, **extra)
            except BrokenPipeError:
                broken_pipe()
            except KeyboardInterrupt:
                print_error("interrupted (Ctrl-C)", "run the same command again: every step starts from what it "
                            "finds on the node")
                raise typer.Exit(130) from None

        run.__signature__ = inspect.Signature(every)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in every}
        return run

    return decorate
