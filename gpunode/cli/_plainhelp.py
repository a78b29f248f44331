"""`--help` drawn without rich's console, tables and panels: the bytes typer's help renderer (typer.rich_utils)
prints, on a pipe (`gpunode install --help | less`, a script, a test: plain text) and at a terminal (with the same
ANSI styles: option names, switches, types, usage, dim borders and defaults). Same output, byte for byte: the usage,
the help, one box per panel, its table laid out with rich's rules (the column widths, the padding, the word wrap),
each piece of text cut into rich's segments (at every highlighter span's edge) and styled as rich styles it.
Drawing install's 13 panels through rich's generic renderables took about as long as starting Python four times;
this takes a few milliseconds and imports no rich module but its width arithmetic (rich._ratio).

Anything this does not draw the same way returns False, and the caller draws with typer's own renderer: a dumb
terminal, a fixed width (TERMINAL_WIDTH), a markup mode other than typer's default "rich", a non-UTF-8 stdout, rich
markup or an emoji code or a tab in a help text, a multi-line option help, an argument, a required option, an
environment variable shown, a deprecated command, an epilog, a word that does not fit its column.
tests/cli/test_plainhelp.py compares the two for every command at several widths, plain and in each colour system
rich picks, and checks that the common case (80 or 100 columns) really is drawn here."""

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

# how rich would draw: no terminal (plain text), a terminal (ANSI styles), a terminal with NO_COLOR set (bold and dim)
PLAIN, COLOUR, NO_COLOUR = 0, 1, 2
# a style: (attributes: 1 bold, 2 dim; the ANSI code of its colour, 0 for none); a segment: a text in a style
Style = tuple[int, int]
Segment = tuple[str, Style]
NULL, BOLD, DIM = (0, 0), (1, 0), (2, 0)
# typer.rich_utils' STYLE_* for the help, in that form: cyan 36, green 32, magenta 35, red 31, yellow 33
OPTION, SWITCH, NEGATIVE_OPTION, NEGATIVE_SWITCH = (1, 36), (1, 32), (1, 35), (1, 31)
TYPES, USAGE, FIRST_COLUMN = (1, 33), (0, 33), (1, 36)
# typer's highlighters (OptionHighlighter, NegativeOptionHighlighter, TypesHighlighter): each match's group x
_SWITCH = r"(^|\W)(?P<x>\-\w+)(?![a-zA-Z0-9])"
_LONG = r"(^|\W)(?P<x>\-\-[\w\-]+)(?![a-zA-Z0-9])"
_OPTIONS_RULES = [(re.compile(_SWITCH), SWITCH), (re.compile(_LONG), OPTION),
                  (re.compile(r"(?P<x>\<[^\>]+\>)"), TYPES), (re.compile(r"(?P<x>Usage: )"), USAGE)]
_NEGATIVE_RULES = [(re.compile(_SWITCH), NEGATIVE_SWITCH), (re.compile(_LONG), NEGATIVE_OPTION)]
_TYPES_RULES = [(re.compile(r"^(?P<x>(\[|<))"), DIM), (re.compile(r"(?P<x>\|)"), DIM),
                (re.compile(r"(?P<x>(\]|>))(\.\.\.)?$"), DIM)]


class _Unsupported(Exception):
    """Something this renderer does not draw as rich would: typer's renderer draws it."""


def _is_terminal(env: os._Environ[str]) -> bool:
    """Whether rich's Console, as typer makes it, treats stdout as a terminal: typer forces one for GITHUB_ACTIONS,
    FORCE_COLOR or PY_COLORS (none for _TYPER_FORCE_DISABLE_TERMINAL); rich then reads TTY_COMPATIBLE, FORCE_COLOR
    and stdout's isatty."""
    typer_s = sys.modules.get("typer.rich_utils")  # it reads them once, when imported
    forced = typer_s.FORCE_TERMINAL if typer_s is not None else \
        False if env.get("_TYPER_FORCE_DISABLE_TERMINAL") else \
        True if env.get("GITHUB_ACTIONS") or env.get("FORCE_COLOR") or env.get("PY_COLORS") else None
    if forced is not None:
        return bool(forced)
    if env.get("TTY_COMPATIBLE", "") in ("0", "1"):
        return env["TTY_COMPATIBLE"] == "1"
    if env.get("FORCE_COLOR") is not None:
        return False  # set and empty
    try:
        return bool(sys.stdout.isatty())
    except (AttributeError, ValueError):
        return False


def console() -> tuple[int, int] | None:
    """How rich would draw the help: (its width, PLAIN / COLOUR / NO_COLOUR); None where this renderer cannot
    say. At a terminal rich picks a colour system from COLORTERM and TERM (standard, 256 or truecolor), but every
    colour typer's help uses is one of the 8 standard ones, written the same in all three; NO_COLOR keeps bold and
    dim and drops the colours. A dumb terminal, a fixed width (TERMINAL_WIDTH), Windows and IPython are left to
    typer's renderer."""
    env = os.environ
    if env.get("TERMINAL_WIDTH") or sys.platform == "win32" or "IPython" in sys.modules:
        return None
    mode = PLAIN
    if _is_terminal(env):
        if env.get("TERM", "").lower() in ("dumb", "unknown"):
            return None
        mode = NO_COLOUR if env.get("NO_COLOR", "") != "" else COLOUR
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
    return (width, mode) if width >= 20 else None


def _text(text: str, markup: bool = True) -> str:
    """A text as rich shows it (from markup, unless `markup` is False): the same string, when nothing in it is
    markup and every character takes one cell."""
    if (markup and _NOT_PLAIN.search(text)) or not text.isascii() or not text.replace("\n", "").isprintable():
        raise _Unsupported(text)
    return text


def _add(under: Style, over: Style) -> Style:
    """rich's `under + over`: the attributes of both, `over`'s colour if it has one."""
    return under[0] | over[0], over[1] or under[1]


class _Rich:
    """A rich Text as typer builds it: its plain string, its spans (start, end, style) in rich's order, and its
    own style (which rich also gives to the spaces that pad a line of it)."""

    __slots__ = ("plain", "spans", "style")

    def __init__(self, plain: str, style: Style = NULL, rules: Sequence[tuple[re.Pattern[str], Style]] = ()) -> None:
        self.plain, self.style = plain, style
        # a highlighter's spans: each rule in turn, each match's named group
        self.spans = [(m.start("x"), m.end("x"), st) for rule, st in rules for m in rule.finditer(plain)
                      if m.end("x") > m.start("x")]

    def segments(self, start: int, end: int, pad: int = 0, under: Style = NULL) -> list[Segment]:
        """rich's segments for plain[start:end] and `pad` spaces: cut at every span's edge, each piece in the
        styles of the spans over it (in order, the text's own last), all over `under`."""
        line = self.plain[start:end] + " " * pad
        spans = [(max(a, start) - start, min(b, end) - start, st) for a, b, st in self.spans if a < end and b > start]
        if self.style != NULL:
            spans.append((0, len(line), self.style))
        cuts = sorted({0, len(line), *(a for a, _, _ in spans), *(b for _, b, _ in spans)})
        out = []
        for a, b in zip(cuts, cuts[1:], strict=False):
            style = under
            for x, y, st in spans:
                if x <= a < y:
                    style = _add(style, st)
            out.append((line[a:b], style))
        return out


def _pieces(text: str, width: int, fold: bool = False) -> list[tuple[int, int]]:
    """Where rich's greedy word wrap cuts `text` to fit `width`: (start, end) of each line, trailing spaces beyond
    the width dropped."""
    lines: list[tuple[int, int]] = []
    offset_of_line = 0
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
            if b - a > width and line[a + width:b].isspace():
                b = a + width
            lines.append((offset_of_line + a, offset_of_line + b))
        offset_of_line += len(line) + 1
    return lines


def _cell_lines(text: _Rich, width: int, fold: bool = False, under: Style = NULL) -> list[list[Segment]]:
    """A Text in a table cell (left-justified): each wrapped line padded to `width` in the text's own style."""
    return [text.segments(a, b, width - (b - a), under) for a, b in _pieces(text.plain, width, fold)]


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
    expanded to the panel. A cell is a _Rich, or a tuple of them (the help and its default, a rich Columns)."""

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
            low, high = _clamp(*_measure(cell.plain), width)
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

    def lines(self, width: int) -> list[list[Segment]]:
        widths = self.widths(width)
        out: list[list[Segment]] = []
        for row in self.rows:
            cells = [self._cell(cell, i, w) for i, (cell, w) in enumerate(zip(row, widths, strict=True))]
            under = [FIRST_COLUMN if self.fixed is not None and i == 0 else NULL for i in range(self.count)]
            height = max(len(c) for c in cells)
            for n in range(height):  # a shorter cell: blank lines in the column's style
                out.append([s for c, w, st in zip(cells, widths, under, strict=True)
                            for s in (c[n] if n < len(c) else [(" " * w, st)])])
        return out

    def _cell(self, cell: Any, i: int, width: int) -> list[list[Segment]]:
        left, right = self._pad(i)
        inner = width - left - right
        if inner < 0:
            raise _Unsupported(cell)
        under = NULL
        if isinstance(cell, tuple):
            body = _columns(cell, inner)
        elif inner < 1:
            if cell.plain:
                raise _Unsupported(cell.plain)
            body = [[]]
        elif self.fixed is not None and i == 0:  # no_wrap, in the first column's style (bold cyan)
            if len(cell.plain) > inner:
                raise _Unsupported(cell.plain)
            under = FIRST_COLUMN
            body = [cell.segments(0, len(cell.plain), inner - len(cell.plain), under)]
        else:
            body = _cell_lines(cell, inner, fold=i == 4 and self.fixed is None)  # the type column folds
        pads = [(" " * left, under)] if left else [], [(" " * right, under)] if right else []
        return [[*pads[0], *line, *pads[1]] for line in body]


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


def _columns(items: tuple[_Rich, ...], width: int) -> list[list[Segment]]:
    """rich Columns of an option's help and its default: side by side when both fit on one line, else one
    under the other, each wrapped to the cell; the rest of the cell is blank."""
    if not items:
        return []
    if width < 1:
        raise _Unsupported(items)
    sizes = [_clamp(*_measure(item.plain), width)[1] for item in items]
    if len(items) == 2 and sizes[0] + 1 + sizes[1] <= width:
        first, second = (item.segments(0, len(item.plain), size - len(item.plain))
                         for item, size in zip(items, sizes, strict=True))
        return [[*first, (" ", NULL), *second, (" " * (width - sizes[0] - 1 - sizes[1]), NULL)]]
    if len(items) > 2:
        raise _Unsupported(items)
    column = max(sizes) or 1
    return [[*line, (" " * (width - column), NULL)] for item in items for line in _cell_lines(item, column)]


def _panel(title: str, table: _Table, width: int) -> list[list[Segment]]:
    head = f" {title} "
    if len(head) > width - 4 or width <= 4:
        raise _Unsupported(title)
    inner = width - 4
    body = table.lines(inner)
    if any(sum(len(text) for text, _ in line) != inner for line in body):  # a layout this does not reproduce
        raise _Unsupported(title)
    top = [("╭─", DIM), (head, DIM), ("─" * (inner - len(head)), DIM), ("─╮", DIM)]
    side = [("│", DIM)]
    return [top, *([*side, (" ", NULL), *line, (" ", NULL), *side] for line in body),
            [("╰" + "─" * (width - 2) + "╯", DIM)]]


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
    items: list[_Rich] = []
    if param.help:
        paragraphs = param.help.split("\n\n")
        if any(p.startswith("\b") for p in paragraphs) or len(paragraphs) > 1:
            raise _Unsupported(param.name)
        items.append(_Rich(_text(inspect.cleandoc(paragraphs[0].replace("\n", " ").strip())), rules=_OPTIONS_RULES))
    if isinstance(param, (TyperOption, TyperArgument)):
        default = param._extract_default_help_str(ctx=ctx)
        show_str = isinstance(param.show_default, str)
        if show_str or (default is not None and (param.show_default or ctx.show_default)):
            shown = param._get_default_string(ctx=ctx, show_default_is_str=show_str, default_value=default)
            if shown:
                items.append(_Rich(_text(_DEFAULT.format(shown), markup=False), DIM))
    kind = _Rich(_text(param.display_type_rich(ctx=ctx) or "", markup=False), TYPES, _TYPES_RULES)
    return [*(_Rich(_text(",".join(n), markup=False), rules=rules)
              for n, rules in zip(names, (_OPTIONS_RULES, _OPTIONS_RULES, _NEGATIVE_RULES, _NEGATIVE_RULES),
                                  strict=True)),
            kind, tuple(items)]


def _block(text: _Rich, width: int, under: Style = NULL) -> list[list[Segment]]:
    """A Text printed in rich's Padding with one column each side: wrapped (fold) to width - 2, the rest of each
    line blank; all over `under`."""
    edge = [(" ", under)]
    lines = []
    for a, b in _pieces(text.plain, width - 2, fold=True):
        fill = width - 2 - (b - a)
        lines.append([*edge, *text.segments(a, b, 0, under), *([(" " * fill, under)] if fill else []), *edge])
    return lines


def _help_lines(obj: Any, width: int) -> list[list[Segment]]:
    """The command's own help under the usage: its first paragraph, then the rest in dim (rich's Padding (0, 1, 1,
    1))."""
    if getattr(obj, "deprecated", False):
        raise _Unsupported("deprecated")
    text = inspect.cleandoc(obj.help or "").partition("\f")[0]
    first, *rest = text.split("\n\n")
    if first.startswith("\b"):
        raise _Unsupported("\\b")
    lines = _block(_Rich(_text(inspect.cleandoc(first.replace("\n", " ").strip())), rules=_OPTIONS_RULES), width)
    if rest:
        lines += _block(_Rich(""), width)
        lines += _block(_Rich(_text(inspect.cleandoc("\n\n".join(rest))), DIM, _OPTIONS_RULES), width)
    return [*lines, [(" " * width, NULL)]]


def render_lines(obj: Any, ctx: Any, width: int, commands: Sequence[Any] = ()) -> list[list[Segment]]:
    """The help of `obj` (a typer command or group) as typer's rich renderer draws it, as lines of segments (text,
    style); raises _Unsupported for anything it would not draw the same. `commands`: a group's listing."""
    from typer.core import TyperArgument, TyperOption

    if getattr(obj, "rich_markup_mode", None) != "rich" or getattr(obj, "epilog", None):
        raise _Unsupported("another markup mode (click's plain help, Markdown) or an epilog")
    usage = obj.get_usage(ctx)
    if "\n" in usage or not usage.isascii():
        raise _Unsupported(usage)
    blank = [[(" " * width, BOLD)]]
    lines = [*blank, *_block(_Rich(_text(usage, markup=False), rules=_OPTIONS_RULES), width, BOLD), *blank]
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
            lines += _panel(_text(title), _Table([_option_row(p, ctx) for p in params]), width)
    if commands:
        if any(c.deprecated or getattr(c, "rich_help_panel", None) for c in commands):
            raise _Unsupported("panels")
        rows = []
        for command in commands:
            paragraph = inspect.cleandoc(command.short_help or command.help or "").split("\n\n")[0]
            if "\n" in paragraph or paragraph.startswith("\b"):
                raise _Unsupported(command.name)
            rows.append([_Rich(_text(command.name or "", markup=False)),
                         _Rich(_text(inspect.cleandoc(paragraph.strip())), rules=_OPTIONS_RULES)])
        lines += _panel(_COMMANDS, _Table(rows, fixed=max(len(c.name or "") for c in commands)), width)
    return lines


def _sgr(style: Style, mode: int) -> str:
    """The ANSI parameters rich writes for a style (NO_COLOUR: without its colour)."""
    codes = [code for bit, code in ((1, "1"), (2, "2")) if style[0] & bit]
    if style[1] and mode == COLOUR:
        codes.append(str(style[1]))
    return ";".join(codes)


def render(obj: Any, ctx: Any, commands: Sequence[Any] = ()) -> str:
    """The help of `obj` as typer's rich renderer prints it here (plain, or with its ANSI styles at a terminal);
    raises _Unsupported for anything it would not print the same."""
    drawn = console()
    if drawn is None:
        raise _Unsupported("a console this does not draw for (a dumb terminal, a fixed width, not UTF-8)")
    width, mode = drawn
    out = []
    for line in render_lines(obj, ctx, width, commands):
        for text, style in line:
            code = _sgr(style, mode) if mode != PLAIN and text else ""
            out.append(f"\x1b[{code}m{text}\x1b[0m" if code else text)
        out.append("\n")
    return "".join(out)


def print_help(obj: Any, ctx: Any, commands: Sequence[Any] = ()) -> bool:
    """Print `obj`'s help as typer's rich renderer would; False (nothing printed) where that is not certain, for
    the caller to use typer's."""
    try:
        text = render(obj, ctx, commands)
    except (_Unsupported, ImportError, AttributeError, TypeError):
        return False
    sys.stdout.write(text)
    return True
