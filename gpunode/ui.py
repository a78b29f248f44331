"""Everything a human sees. Results go to stdout (`out`), progress and errors to stderr (`err`).
Only the main thread calls into this module.

Node text is untrusted: os-release, logs, journal lines and command output may hold escape sequences or
`[brackets]`. Both consoles therefore never parse markup (styles come from `Text` objects only), and every
character written passes through `clean()`: control characters other than newline are shown as `\\xNN`, so
nothing a node sends can move the cursor, retitle the terminal or hide text. On a pipe nothing is wrapped.
"""

from __future__ import annotations

import json
import os
import re
import sys
import unicodedata
from collections.abc import Callable, Iterable
from functools import cache
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.segment import Segment
    from rich.table import Table
    from rich.text import Text

    from gpunode.facts import Facts

# rich is imported when something is first printed (`out`, `err`, `SafeConsole` are made on first use, see
# __getattr__ at the end), so `gpunode --help` and `--version` do not pay for it.

BROKEN_PIPE_EXIT = 141  # what a shell reports for a program stopped by SIGPIPE (`gpunode doctor | head`)
NO_WRAP_WIDTH = 4000  # the width of a pipe or file: long lines, URLs and commands are never wrapped

STATUS_STYLE = {"ok": "green", "change": "yellow", "planned": "yellow", "changed": "cyan", "blocked": "red",
                "failed": "bold red", "unknown": "magenta", "reboot-pending": "yellow", "not-run": "dim"}

# Bidirectional overrides and isolates reorder what the reader sees; they are shown escaped like controls.
_BIDI = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f")


def _escape_char(ch: str) -> str:
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _unsafe(ch: str) -> bool:
    return ch != "\n" and (unicodedata.category(ch) in ("Cc", "Cs") or ch in _BIDI)


def clean(text: object) -> str:
    """Node-provided text made safe for a terminal: CRLF becomes a newline, a tab four spaces, and every
    other control character (ESC, BEL, CR, C1 codes, bidi overrides, lone surrogates) a visible \\xNN."""
    value = str(text).replace("\r\n", "\n").replace("\t", "    ")
    if not any(_unsafe(ch) for ch in value):
        return value
    return "".join(_escape_char(ch) if _unsafe(ch) else ch for ch in value)


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """`1 node`, `2 nodes`: a count with its noun in the right number."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def node_text(text: object, style: str = "") -> Text:
    """A Text of untrusted text: cleaned, never parsed as markup."""
    from rich.text import Text

    return Text(clean(text), style=style)


@cache
def _safe_console_class() -> type[Console]:
    from rich.console import Console, ConsoleDimensions
    from rich.segment import Segment

    class SafeConsole(Console):
        """A rich Console for gpunode: no markup, no highlighting, every character cleaned on its way out, no
        wrapping on a pipe, and a reader that goes away (`| head`) ends the program quietly."""

        def __init__(self, *, stderr: bool = False, file: IO[str] | None = None, force_terminal: bool | None = None,
                     width: int | None = None) -> None:
            fixed = os.environ.get("GPUNODE_WIDTH", "")
            super().__init__(stderr=stderr, file=file, force_terminal=force_terminal, highlight=False, markup=False,
                             emoji=False, width=width or (int(fixed) if fixed.isdigit() else None))

        @property
        def size(self) -> ConsoleDimensions:
            size = super().size
            if self._width is None and not self.is_terminal:
                return ConsoleDimensions(NO_WRAP_WIDTH, size.height)
            return size

        @size.setter
        def size(self, new_size: tuple[int, int]) -> None:
            self._width, self._height = new_size

        def _render_buffer(self, buffer: Iterable[Segment]) -> str:
            safe = (segment if segment.control else Segment(clean(segment.text), segment.style)
                    for segment in buffer)
            rendered = super()._render_buffer(safe)
            return rendered if self.is_terminal else re.sub(r"[ \t]+\n", "\n", rendered)

        def on_broken_pipe(self) -> None:
            broken_pipe()

    return SafeConsole


def broken_pipe() -> None:
    """The reader of stdout went away: stop quietly, without the 'Exception ignored' noise at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    raise SystemExit(BROKEN_PIPE_EXIT)


@cache
def _console(name: str) -> Console:
    return _safe_console_class()(stderr=name == "err")


class _Console:
    """`out` or `err` until it is first used: a command module imports them at its top, and `gpunode <command>
    --help` (gpunode/cli/_plainhelp.py) imports no rich console; the first attribute makes the console (rich's)
    and every attribute, and `with`, is that console's."""

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "_name", name)

    def __getattr__(self, attr: str) -> Any:
        return getattr(_console(self._name), attr)

    def __setattr__(self, attr: str, value: Any) -> None:
        setattr(_console(self._name), attr, value)

    # special methods are looked up on the type, not through __getattr__: rich's Live does `with console:`
    def __enter__(self) -> Console:
        return _console(self._name).__enter__()

    def __exit__(self, *exc: Any) -> None:
        _console(self._name).__exit__(*exc)


_LATER = {"out": _Console("out"), "err": _Console("err")}


def __getattr__(name: str) -> Any:
    """`out`, `err` (the two consoles, see _Console) and `SafeConsole`, made on first use."""
    if name in _LATER:
        return _LATER[name]
    if name == "SafeConsole":
        return _safe_console_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def print_json(data: object) -> None:
    """Machine output: plain JSON on stdout, never styled or wrapped (json escapes control characters)."""
    try:
        print(json.dumps(data, indent=2, sort_keys=False), flush=True)
    except BrokenPipeError:
        broken_pipe()


Fixer = Callable[[str], str]


def labelled(label: str, text: str | Text, style: str = "bold", indent: int = 0) -> Table:
    """`label text` where the text's continuation lines stay under its first line, not under the label."""
    from rich.table import Table
    from rich.text import Text

    grid = Table.grid(padding=(0, 1, 0, 0))
    grid.add_column(no_wrap=True)
    grid.add_column(overflow="fold")
    body = text if isinstance(text, Text) else node_text(text, style)
    grid.add_row(Text(" " * indent + label, style="bold"), body)
    return grid


def print_error(message: str, fix: str | None = None, console: Console | None = None) -> None:
    """`error: ...` and `fix: ...` on stderr."""
    console = console or _console("err")
    console.print(labelled("error:", node_text(message)))
    if fix:
        console.print(labelled("fix:", node_text(fix, "bold green"), indent=2))


def print_note(message: str, console: Console | None = None) -> None:
    """`note: ...` on stderr: something the user should know that does not stop the run."""
    (console or _console("err")).print(labelled("note:", node_text(message, "dim")))


def describe_node(host: str, facts: Facts) -> str:
    gpus = facts.gpus
    gpu_text = f"{len(gpus)} NVIDIA GPU{'s' if len(gpus) != 1 else ''}" if gpus else "no NVIDIA GPU"
    if gpus:
        ids = sorted({f"10de:{g.device_id}" for g in gpus})
        gpu_text += f" ({', '.join(ids)})"
    if facts.nvswitches:
        gpu_text += f", {len(facts.nvswitches)} NVSwitch"
    driver = f"driver {facts.loaded_driver.version} loaded" if facts.loaded_driver else "no NVIDIA driver loaded"
    sb = {True: "Secure Boot on", False: "Secure Boot off", None: "Secure Boot unknown"}[facts.secure_boot.enabled]
    return clean(f"{host}: {facts.os}, kernel {facts.kernel} {facts.arch}; {gpu_text}; {driver}; {sb}")
