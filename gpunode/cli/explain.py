"""`gpunode explain`: say what a pasted error message means and what to run. Works offline; touches no node.

    gpunode explain "Failed to initialize NVML: Driver/library version mismatch"
    gpunode explain --file /var/log/nvidia-installer.log
    sudo dmesg | gpunode explain          (or --file -)

Exit codes: 0 something was recognised, 1 nothing was, 2 usage error (no text, unreadable file).

`--json` prints one object on stdout:

    {
      "schema_version": 1,
      "findings": [                       # the strongest evidence first (the likeliest root cause); [] when none
        {
          "id": "cuda.requirement",       # stable id; Xids are "xid.<N>", NVSwitch SXids "sxid.<N>"
          "title": "...",                 # one line
          "cause": "...",                 # why it happens, for this text
          "fix": "gpunode install --driver 580.178.04",   # the command to run first
          "also": ["nvidia-smi  # ..."],  # further commands or checks, in order (may be empty)
          "runs": {"fix": "controller",   # where each command runs: node (on the GPU machine), controller
                   "also": ["node"]},     #   (where you run gpunode, kubectl), manual (words for a person)
          "excerpt": "...",               # the line that proved it, normalised (prompts, timestamps removed)
          "values": {                     # what was read out of the text; keys depend on the id, e.g.
            "cuda_required": "12.8",      #   cuda.requirement: condition, cuda_required, driver_min,
            "driver_min": "570.26"        #     driver_branch_min, driver_min_minor_compat
          }                               #   xid.*: xid, pci, count, meaning, severity, action, detail,
        }                                 #     pids, processes, gpu_instance, reset_required, fatal, ...
      ]                                   #   nvml.mismatch: nvml_library_version, library_version,
    }                                     #     kernel_module_version
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gpunode.cli._params import JsonOpt, command, expected_errors
from gpunode.errors import UsageError
from gpunode.ui import clean, err, node_text, out, print_json

# the engine and its tables are imported when the command runs: `gpunode explain --help` needs only its options
if TYPE_CHECKING:
    from gpunode.explain import Finding

SCHEMA_VERSION = 1
MAX_BYTES = 64 * 1024 * 1024  # a whole journal is fine; anything larger is not a paste

_SEVERITY_STYLE = {"info": "green", "app": "yellow", "reset": "bold red", "reboot": "bold red",
                   "hardware": "bold red", "unknown": "magenta"}


def _read_stdin() -> str:
    stream = sys.stdin
    if stream is None:
        raise UsageError("no standard input to read")
    buffer = getattr(stream, "buffer", None)
    data = buffer.read(MAX_BYTES + 1) if buffer is not None else stream.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise UsageError("standard input is larger than 64 MiB", fix="pass the relevant part of the log")
    return data.decode("utf-8", "replace") if isinstance(data, bytes) else data


def _read_file(name: str) -> str:
    if name == "-":
        return _read_stdin()
    path = Path(name).expanduser()
    if not path.exists():
        raise UsageError(f"{name}: no such file", fix="check the path, or pipe the text in: ... | gpunode explain")
    if path.is_dir():
        raise UsageError(f"{name} is a directory, not a file", fix="pass a log file, e.g. --file /var/log/syslog")
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"cannot read {name}: {exc.strerror or exc}",
                         fix=f"check its permissions (sudo cat {name} | gpunode explain)") from None
    if len(data) > MAX_BYTES:
        raise UsageError(f"{name} is larger than 64 MiB", fix="pass the relevant part: tail -n 2000 FILE | gpunode explain")
    return data.decode("utf-8", "replace")


def _input(text: list[str] | None, file: str | None) -> str:
    if text and file is not None:
        raise UsageError("give the text or --file, not both")
    if file is not None:
        return _read_file(file)
    if text:
        return " ".join(text) if len(text) > 1 else text[0]
    if sys.stdin is None or sys.stdin.isatty():
        raise UsageError("nothing to explain",
                         fix='gpunode explain "ERROR TEXT", gpunode explain --file LOG, or: sudo dmesg | gpunode explain')
    return _read_stdin()


def _render(finding: Finding) -> None:
    from rich.text import Text  # here: `explain --help` imports no rich renderer (tests/cli/test_startup.py)

    from gpunode.cli._target import runnable

    severity = finding.values.get("severity")
    out.print(Text.assemble(("● ", _SEVERITY_STYLE.get(str(severity), "bold cyan")), (clean(finding.title), "bold"),
                            ("  " + finding.id, "dim")))
    rows: list[tuple[str, str, str]] = [("seen", finding.excerpt, "dim"), ("cause", finding.cause, ""),
                                        ("fix", runnable(finding.fix, []), "bold green")]
    rows += [("also", runnable(command, []), "") for command in finding.also]
    shown = {k: v for k, v in finding.values.items() if k not in ("meaning", "action", "detail") and v not in ("", [])}
    if shown:
        rows.append(("values", ", ".join(f"{k}={_value(v)}" for k, v in shown.items()), "dim"))
    indent = 9  # "  values " is the widest label
    width = max(20, out.width - indent)
    for label, value, style in rows:
        for number, line in enumerate(node_text(value, style).wrap(out, width, overflow="fold")):
            head = f"  {label:<{indent - 3}} " if number == 0 else " " * indent
            line.rstrip()
            out.print(Text.assemble((head, "bold"), line), soft_wrap=True)


def _document(finding: Finding) -> dict[str, object]:
    """A finding for --json: its fixes rendered here (explain reaches no node), and where each command runs."""
    from gpunode import fixes
    from gpunode.cli._target import rewrite_fixes, runnable

    data = rewrite_fixes(finding.to_dict(), lambda text: runnable(text, []))
    data["runs"] = {"fix": fixes.runs(finding.fix), "also": [fixes.runs(a) for a in finding.also]}
    return data


def _value(value: object) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


@command()
def explain(
    text: Annotated[list[str] | None, typer.Argument(
        help="The error text (quote it). Omit it to read --file or standard input.", show_default=False)] = None,
    file: Annotated[str | None, typer.Option(
        "--file", "-f", metavar="FILE", help="Read the text from this file ('-' for standard input).", show_default=False)] = None,
    json_output: JsonOpt = False,
) -> None:
    """Explain an error message: cause and fix. Exit 0 recognised, 1 nothing recognised, 2 usage error."""
    from gpunode.explain import explain as explain_text

    with expected_errors():
        content = _input(text, file)
        if not content.strip():
            raise UsageError("the text to explain is empty",
                             fix='gpunode explain "ERROR TEXT", --file LOG, or pipe the text in')
    findings = explain_text(content)
    if json_output:
        print_json({"schema_version": SCHEMA_VERSION, "findings": [_document(f) for f in findings]})
    elif findings:
        for index, finding in enumerate(findings):
            if index:
                out.print()
            _render(finding)
    else:
        out.print("No known NVIDIA, CUDA, container or driver error recognised in the text.")
        err.print("If this is a GPU error gpunode should know, please report it with the text.", style="dim")
    raise typer.Exit(0 if findings else 1)
