"""`--help` drawn without rich, for the case where rich would draw it without colour: stdout is not a terminal
(`gpunode install --help | less`, a script, a test). Same text, byte for byte: the usage, the help, one box per
panel, its table laid out as typer's help renderer (typer.rich_utils) lays it out with rich's rules (the column
widths, the padding, the word wrap). Drawing install's 13 panels through rich's generic renderables took about
as long as starting Python four times; this takes a few milliseconds and imports no rich module but its width
arithmetic (rich._ratio).

Anything this does not draw the same way returns False, and the caller draws with typer's own renderer: a
terminal (colour), a markup mode other than typer's default "rich", a forced terminal or width (FORCE_COLOR, TTY_COMPATIBLE, TERMINAL_WIDTH...), a non-UTF-8
stdout, rich markup or an emoji code or a tab in a help text, a multi-line option help, an argument, a required
option, an environment variable shown, a deprecated command, an epilog, a word that does not fit its column.
tests/cli/test_plainhelp.py compares the two for every command at several widths, and checks that the common
case (piped, 80 or 100 columns) really is drawn here."""

from __future__ import annotations

import inspect
import os
import re
import sys
from collections.abc import Sequence
from typing import Any

# what typer.rich_utils prints around a panel's content and after a default (its English strings)
_DEFAULT = "[default: {}]"
_OPTIONS, _ARGUMENTS, _COMMANDS = "Options", "Arguments", "Commands"
# a help text rich would read differently from its plain text: markup tags, escapes, emoji codes, ANSI, tabs
_NOT_PLAIN = re.compile(r"\[|\\|:\S*?:|\x1b|\t|\r|\x0c|\x08")
_WORD = re.compile(r"\s*\S+\s*")


class _Unsupported(Exception):
    """Something this renderer does not draw as rich would: typer's renderer draws it."""


def plain_width() -> int | None:
    """The width rich would draw the help at, if it would draw it without colour (stdout not a terminal, nothing
    forcing one); None otherwise."""
    env = os.environ
    forced = bool(env.get("GITHUB_ACTIONS") or env.get("FORCE_COLOR") or env.get("PY_COLORS"))  # typer's rule
    if (forced and not env.get("_TYPER_FORCE_DISABLE_TERMINAL")) or env.get("TERMINAL_WIDTH") or \
            sys.platform == "win32" or "IPython" in sys.modules:
        return None
    if not env.get("_TYPER_FORCE_DISABLE_TERMINAL") and env.get("TTY_COMPATIBLE", "") != "0":
        if env.get("TTY_COMPATIBLE") == "1":
            return None
        try:
            if sys.stdout.isatty():
                return None
        except (AttributeError, ValueError):
            pass
    if not (getattr(sys.stdout, "encoding", None) or "utf-8").lower().startswith("utf"):
        return None  # rich would draw ASCII boxes
    width = 0
    for fd in (0, 1, 2):  # rich sizes a console from the first standard stream that is a terminal
        try:
            width = os.get_terminal_size(fd).columns
            break
        except (AttributeError, ValueError, OSError):
            continue
    columns = env.get("COLUMNS")
    if columns is not None and columns.isdigit():
        width = int(columns)
    width = width or 80
    return width if width >= 20 else None


def _text(text: str, markup: bool = True) -> str:
    """A text as rich shows it (from markup, unless `markup` is False): the same string, when nothing in it is
    markup and every character takes one cell."""
    if (markup and _NOT_PLAIN.search(text)) or not text.isascii() or not text.replace("\n", "").isprintable():
        raise _Unsupported(text)
    return text


def _wrap(text: str, width: int, fold: bool = False) -> list[str]:
    """Each line of `text` broken at word starts so that it fits `width`, rich's greedy rule; each line padded
    to `width`."""
    lines: list[str] = []
    for line in text.split("\n"):
        breaks, offset = [], 0
        for match in _WORD.finditer(line):
            start, word = match.start(), match.group()
            length = len(word.rstrip())
            if width - offset >= length:
                offset += len(word)
            elif length > width:
                if not fold:
                    raise _Unsupported(word)
                pieces = [word[i:i + width] for i in range(0, len(word), width)]  # folded, spaces and all
                for n, piece in enumerate(pieces):
                    if start:
                        breaks.append(start)
                    if n == len(pieces) - 1:
                        offset = len(piece)
                    else:
                        start += len(piece)
            elif offset and start:
                breaks.append(start)
                offset = len(word)
        for a, b in zip([0, *breaks], [*breaks, len(line)], strict=True):
            piece = line[a:b]
            if len(piece) > width and piece[width:].isspace():
                piece = piece[:width]
            lines.append(piece.ljust(width))
    return lines


def _measure(text: str) -> tuple[int, int]:
    """rich's measurement of a text: (its longest word, its longest line)."""
    widest = max((len(line) for line in text.splitlines()), default=0)
    return max((len(word) for word in text.split()), default=widest), widest


def _clamp(low: int, high: int, width: int) -> tuple[int, int]:
    """A measurement normalised and capped at `width`, as rich's Measurement.get returns it."""
    low = min(max(0, low), high)
    low, high = max(0, low), max(0, max(low, high))
    low, high = min(low, width), min(high, width)
    if high < 1:
        return 0, 0
    low = min(max(0, low), high)
    return max(0, low), max(0, max(low, high))


class _Table:
    """A rich Table as typer's help builds it: no box, no header, padding (0, 1) without the outer edges,
    expanded to the panel. A cell is a str, or a tuple of str (the help and its default, a rich Columns)."""

    def __init__(self, rows: Sequence[Sequence[Any]], fixed: int | None = None) -> None:
        self.rows, self.count = rows, len(rows[0])
        self.fixed = fixed  # the command listing: the first column's width, the second takes the rest

    def _pad(self, i: int) -> tuple[int, int]:
        return (0 if i == 0 else 1), (0 if i == self.count - 1 else 1)

    def _measure_cell(self, cell: Any, i: int, width: int) -> tuple[int, int]:
        left, right = self._pad(i)
        extra = left + right
        if width - extra < 1:
            low, high = width, width
        elif isinstance(cell, tuple):  # rich Columns: not measurable, takes what it is given
            low, high = 0 + extra, width + extra
        else:
            low, high = _clamp(*_measure(cell), width)
            low, high = low + extra, high + extra
        return _clamp(min(low, width), min(high, width), width)

    def _measure_column(self, i: int, width: int) -> tuple[int, int]:
        if width < 1:
            return 0, 0
        if self.fixed is not None and i == 0:
            w = self.fixed + sum(self._pad(i))
            return min(w, width), min(w, width)
        lows, highs = zip(*(self._measure_cell(row[i], i, width) for row in self.rows), strict=True)
        return min(max(lows), width), min(max(highs), width)

    def widths(self, width: int) -> list[int]:
        from rich._ratio import ratio_distribute, ratio_reduce

        widths = [self._measure_column(i, width)[1] or 1 for i in range(self.count)]
        if self.fixed is not None:  # the description column has ratio=10: it takes all that the name leaves
            fixed = widths[0]
            widths[1] = ratio_distribute(width - fixed, [10], [1 + sum(self._pad(1))])[0]
        total = sum(widths)
        if total > width:
            wrapable = [not (self.fixed is not None and i == 0) for i in range(self.count)]
            widths = _collapse(widths, wrapable, width, ratio_reduce)
            total = sum(widths)
            if total > width:
                widths = ratio_reduce(total - width, [1] * len(widths), widths, widths)
                total = sum(widths)
            widths = [self._measure_column(i, w)[1] or 0 for i, w in enumerate(widths)]
        if total < width:  # rich compares the width before the columns were measured again
            widths = [w + pad for w, pad in zip(widths, ratio_distribute(width - total, widths), strict=True)]
        return widths

    def lines(self, width: int) -> list[str]:
        widths = self.widths(width)
        out: list[str] = []
        for row in self.rows:
            cells = [self._cell(cell, i, w) for i, (cell, w) in enumerate(zip(row, widths, strict=True))]
            height = max(len(c) for c in cells)
            for n in range(height):
                out.append("".join(c[n] if n < len(c) else " " * w for c, w in zip(cells, widths, strict=True)))
        return out

    def _cell(self, cell: Any, i: int, width: int) -> list[str]:
        left, right = self._pad(i)
        inner = width - left - right
        if inner < 0:
            raise _Unsupported(cell)
        if isinstance(cell, tuple):
            body = _columns(cell, inner)
        elif inner < 1:
            if cell:
                raise _Unsupported(cell)
            body = [""]
        elif self.fixed is not None and i == 0:  # no_wrap
            if len(cell) > inner:
                raise _Unsupported(cell)
            body = [cell.ljust(inner)]
        else:
            body = _wrap(cell, inner, fold=i == 4 and self.fixed is None)  # the type column folds
        return [" " * left + line + " " * right for line in body]


def _collapse(widths: list[int], wrapable: list[bool], width: int, ratio_reduce: Any) -> list[int]:
    """rich's Table: shrink the widest wrapable columns, level with the next widest, until the table fits."""
    total = sum(widths)
    excess = total - width
    if any(wrapable):
        while total and excess > 0:
            widest = max(w for w, ok in zip(widths, wrapable, strict=True) if ok)
            second = max(w if ok and w != widest else 0 for w, ok in zip(widths, wrapable, strict=True))
            ratios = [1 if w == widest and ok else 0 for w, ok in zip(widths, wrapable, strict=True)]
            if not any(ratios) or not widest - second:
                break
            widths = ratio_reduce(excess, ratios, [min(excess, widest - second)] * len(widths), widths)
            total = sum(widths)
            excess = total - width
    return widths


def _columns(items: tuple[str, ...], width: int) -> list[str]:
    """rich Columns of an option's help and its default: side by side when both fit on one line, else one
    under the other, each wrapped to the cell."""
    if not items:
        return []
    if width < 1:
        raise _Unsupported(items)
    sizes = [_clamp(*_measure(item), width)[1] for item in items]
    if len(items) == 2 and sizes[0] + 1 + sizes[1] <= width:
        return [(items[0].ljust(sizes[0]) + " " + items[1].ljust(sizes[1])).ljust(width)]
    if len(items) > 2:
        raise _Unsupported(items)
    column = max(sizes) or 1
    return [line.ljust(width) for item in items for line in _wrap(item, column)]


def _panel(title: str, table: _Table, width: int) -> list[str]:
    head = f" {title} "
    if len(head) > width - 4 or width <= 4:
        raise _Unsupported(title)
    inner = width - 4
    body = table.lines(inner)
    if any(len(line) != inner for line in body):  # a layout this does not reproduce: typer's renderer draws it
        raise _Unsupported(title)
    top = "╭─" + head + "─" * (inner - len(head)) + "─╮"
    return [top, *(f"│ {line} │" for line in body), "╰" + "─" * (width - 2) + "╯"]


def _option_row(param: Any, ctx: Any) -> list[Any]:
    """The cells typer.rich_utils shows for one option or argument: long names, short names (an argument's
    name), the secondary (--no-x) names, the type, the help and its default."""
    from typer.core import TyperArgument, TyperOption

    if param.required or getattr(param, "deprecated", False) or param._get_number_range_help_str():
        raise _Unsupported(param.name)
    envvar = getattr(param, "envvar", None)
    if envvar is None and getattr(param, "allow_from_autoenv", None) and \
            getattr(ctx, "auto_envvar_prefix", None) is not None and param.name:
        envvar = f"{ctx.auto_envvar_prefix}_{param.name.upper()}"
    if envvar and getattr(param, "show_envvar", None):
        raise _Unsupported(param.name)
    shown_name = None
    if isinstance(param, TyperArgument):
        shown_name = param.display_name_raw + ("..." if param.metavar is None and param.nargs != 1 else "")
    names: list[list[str]] = [[], [], [], []]
    for column, opts in ((0, param.opts), (2, param.secondary_opts)):
        for opt in opts:
            names[column if "--" in opt else column + 1].append(opt if "--" in opt or not shown_name else shown_name)
    items: list[str] = []
    if param.help:
        paragraphs = param.help.split("\n\n")
        if any(p.startswith("\b") for p in paragraphs) or len(paragraphs) > 1:
            raise _Unsupported(param.name)
        items.append(_text(inspect.cleandoc(paragraphs[0].replace("\n", " ").strip())))
    if isinstance(param, (TyperOption, TyperArgument)):
        default = param._extract_default_help_str(ctx=ctx)
        show_str = isinstance(param.show_default, str)
        if show_str or (default is not None and (param.show_default or ctx.show_default)):
            shown = param._get_default_string(ctx=ctx, show_default_is_str=show_str, default_value=default)
            if shown:
                items.append(_text(_DEFAULT.format(shown), markup=False))
    kind = _text(param.display_type_rich(ctx=ctx) or "", markup=False)
    return [*(_text(",".join(n), markup=False) for n in names), kind, tuple(items)]


def _help_lines(obj: Any, width: int) -> list[str]:
    """The command's own help under the usage: its first paragraph, then the rest (rich's Padding (0, 1, 1, 1))."""
    if getattr(obj, "deprecated", False):
        raise _Unsupported("deprecated")
    text = inspect.cleandoc(obj.help or "").partition("\f")[0]
    first, *rest = text.split("\n\n")
    if first.startswith("\b"):
        raise _Unsupported("\\b")
    blocks = [_text(inspect.cleandoc(first.replace("\n", " ").strip()))]
    if rest:
        blocks += ["", _text(inspect.cleandoc("\n\n".join(rest)))]
    lines = [f" {line} " for block in blocks for line in _wrap(block, width - 2, fold=True)]
    return [*lines, " " * width]


def render(obj: Any, ctx: Any, commands: Sequence[Any] = ()) -> str:
    """The help of `obj` (a typer command or group) as typer's rich renderer prints it without colour; raises
    _Unsupported for anything it would not print the same. `commands`: a group's listing."""
    from typer.core import TyperArgument, TyperOption

    width = plain_width()
    if width is None or getattr(obj, "rich_markup_mode", None) != "rich" or getattr(obj, "epilog", None):
        raise _Unsupported("a terminal, another markup mode (click's plain help, Markdown) or an epilog")
    usage = obj.get_usage(ctx)
    if "\n" in usage or not usage.isascii():
        raise _Unsupported(usage)
    lines = [" " * width, *(f" {line} " for line in _wrap(_text(usage, markup=False), width - 2, fold=True)),
             " " * width]
    if obj.help:
        lines += _help_lines(obj, width)
    # typer's order: the Arguments panel, the other argument panels, the Options panel, the other option panels
    arguments: dict[str, list[Any]] = {_ARGUMENTS: []}
    options: dict[str, list[Any]] = {_OPTIONS: []}
    for param in obj.get_params(ctx):
        if getattr(param, "hidden", False) or not isinstance(param, (TyperArgument, TyperOption)):
            continue
        panels, default = (arguments, _ARGUMENTS) if isinstance(param, TyperArgument) else (options, _OPTIONS)
        panels.setdefault(getattr(param, "rich_help_panel", None) or default, []).append(param)
    for title, params in [*arguments.items(), *options.items()]:
        if params:
            lines += _panel(title, _Table([_option_row(p, ctx) for p in params]), width)
    if commands:
        if any(c.deprecated or getattr(c, "rich_help_panel", None) for c in commands):
            raise _Unsupported("panels")
        rows = []
        for command in commands:
            paragraph = inspect.cleandoc(command.short_help or command.help or "").split("\n\n")[0]
            if "\n" in paragraph or paragraph.startswith("\b"):
                raise _Unsupported(command.name)
            rows.append([_text(command.name or "", markup=False), _text(inspect.cleandoc(paragraph.strip()))])
        lines += _panel(_COMMANDS, _Table(rows, fixed=max(len(c.name or "") for c in commands)), width)
    return "".join(line + "\n" for line in lines)


def print_help(obj: Any, ctx: Any, commands: Sequence[Any] = ()) -> bool:
    """Print `obj`'s help as typer's rich renderer would without colour; False (nothing printed) where that is not
    certain, for the caller to use typer's."""
    try:
        text = render(obj, ctx, commands)
    except (_Unsupported, ImportError, AttributeError, TypeError):
        return False
    sys.stdout.write(text)
    return True
