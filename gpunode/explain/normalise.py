"""Normalise a pasted error text before matching: what people paste is rarely what the program printed.

Removes ANSI escapes, shell prompts (bash, zsh, PowerShell, `(env) user@host:~$`, `[root@host dir]#`), markdown
quoting (`> `, e-mail replies), code fences and common indentation, log prefixes (dmesg in every format: `[  12.3]`,
`[+0.000421]`, `-T`, `-e`, `-x`; journald/syslog with or without host, ISO stamps, /dev/kmsg records, rsyslog's
`#012`, CI step prefixes), folds curly quotes, odd spaces and hyphens, decodes HTML entities (`&quot;`, `&#39;`),
unescapes messages quoted by Go/JSON (the 2017-2019 `\\\"error running hook` form) or logfmt (`msg="...\\"nvidia\\"..."`),
reads a JSON log record (docker json-file, CRI, `journalctl -o json`) as its message, and joins lines a terminal or
the kernel wrapped.
"""

from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass

from gpunode.record import Record

_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_CHARS = str.maketrans({
    "\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'", "\u2032": "'", "\u00b4": "'",
    "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u201f": '"', "\u2033": '"', "\u00ab": '"', "\u00bb": '"',
    "\u00a0": " ", "\u2002": " ", "\u2003": " ", "\u2009": " ", "\u202f": " ", "\u3000": " ",
    "\u200b": "", "\u200c": "", "\u200d": "", "\u2060": "", "\ufeff": "",
    "\u2010": "-", "\u2011": "-",
})

# Log prefixes a line may carry, stripped repeatedly (a syslog line can wrap a dmesg one).
_STAMPS = tuple(re.compile(p) for p in (
    r"^\d+,\d+,\d+,[^;]*;",  # /dev/kmsg record: priority,sequence,usec,flags;message
    r"^<\d{1,3}>",  # printk priority
    # syslog / journalctl: "Jun 30 11:07:05 host ident[pid]: " or ISO time
    r"^(?:[A-Za-z][a-z]{2}\s+\d{1,2}\s+\d\d:\d\d:\d\d|\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?"
    r"(?:Z|[+-]\d\d:?\d\d)?)\s+(?:[\w.-]+\s+)?[\w.@/-]+(?:\[\d+\])?:\s",  # host optional (--no-hostname)
    r"^\d{4}/\d\d/\d\d \d\d:\d\d:\d\d(?:\.\d+)?\s",  # Go's log package (nvidia-container-runtime.log)
    r"^\[\s*[+-]?\d+\.\d+\]",  # dmesg: [  123.456789], dmesg -d: [  +0.000421]
    r"^\[(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)\s+[A-Z][a-z]{2}\s+\d{1,2}\s+\d\d:\d\d:\d\d\s+\d{4}\]",  # dmesg -T
    r"^\[[A-Z][a-z]{2}\s?\d{1,2}\s+\d\d:\d\d\]",  # dmesg -e: [Aug30 11:43]
    r"^\[?\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\]?(?=\s)",  # ISO time
    r"^\[[A-Z][a-z]{2}\s+\d{1,2}\s+\d{4}\s+\d\d:\d\d:\d\d\]",  # fabricmanager.log
    r"^\[(?:INFO|WARNING|WARN|ERROR|FATAL|DEBUG|CRITICAL)\](?:\s*\[tid \d+\])?",  # fabricmanager level
    r"^(?:kern|user|daemon|syslog)\s*:\s*(?:emerg|alert|crit|err|warn|notice|info|debug)\s*:",  # dmesg -x
    r"^(?:[\w.-]+\s+)?kernel:\s",  # "kernel: " left by grep, or "host kernel: " after a monotonic stamp
    r"^\[\d{1,2}:\d\d(?::\d\d)?(?:\s?[AaPp][Mm])?\]",  # a chat message's time: [10:42 AM]
    r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ [\w.-]+:\d+\]\s",  # klog (kubelet, device plugin): E1124 10:11:12.1 42 x.go:9]
    r"^[\w.-]+[-_]\d+\s+\|\s",  # docker compose's service prefix: "app-1  | " (v1: "app_1  | ")
    r"^(?:Normal|Warning)\s{2,}\w+\s{2,}\S.*?\s{2,}[\w/-]+\s{2,}(?=\S)",  # kubectl describe's Events row
))
_PROMPTS = tuple(re.compile(p) for p in (
    r"^(?:\([\w.-]+\)\s+)?[\w.-]+@[\w.-]+:[^\s$#]*\s?[$#]\s?",  # (env) user@host:~/dir$
    r"^(?:\([\w.-]+\)\s+)?\[[\w.-]+@[\w.-]+(?:\s[^\]]*)?\]\s?[$#]\s?",  # [root@host dir]#
    r"^(?:\([\w.-]+\)\s+)?[\w.-]+@[\w.-]+\s?[$#%>]\s",  # user@host$
    r"^(?:\([\w.-]+\)\s+)?[$#%]\s",  # "$ cmd", "# cmd"
    r"^\$(?=[a-z])",  # "$nvidia-smi"
    r"^(?:\u276f|\u279c|\u03bb)\s+(?:~\S*\s+)?",  # zsh-style arrows
    r"^PS [A-Za-z]:\\[^>]*>\s?",  # PowerShell
))
_QUOTE = re.compile(r"^(?:[ \t]{0,3}>[ \t]?)+")
_FENCE = re.compile(r"^\s*(?:```|~~~)")
_FENCE_WITH_TEXT = re.compile(r"^(\s*)(```+|~~~+)(.*\S.*)$")  # "```docker: Error ..." (or "```bash", an info string)
_BULLET = re.compile(r"^(?:(?:[-*+\u2022]|\d{1,2}[.)])\s+(?:\[[ xX]\]\s+)?|#{2,6}\s+)")  # a Markdown or chat list
# item ("- ", "* ", "1. ", "2) ", a task "- [ ] ") or a heading of two levels or more ("## "; "# " is a root prompt)
_EMPHASIS = re.compile(r"^([*_])(?=[^\s*_])(.*[^\s*_])\1$")  # a whole line in Markdown emphasis: *...*, _..._
_HTML_BREAK = re.compile(r"<br\s*/?>", re.IGNORECASE)
_HTML_ENTITY = re.compile(r"&(?:#\d{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z][A-Za-z0-9]{1,7});")  # &quot; &#34; &gt; (a page or e-mail copy)
_HTML_TAG = re.compile(r"</?(?:details|summary|code|pre|kbd|tt|b|strong|em|i|p|div|span)(?:\s[^<>]*)?>", re.IGNORECASE)
_TABLE_ROW = re.compile(r"^\s*\|.*\|\s*$")
_TABLE_RULE = re.compile(r"^\s*\|?(?:\s*:?-{3,}:?\s*\|)+\s*:?-*:?\s*$")  # |---|:--:| (not nvidia-smi's +---+)
_MARKUP = re.compile(r"`+|\*\*_(?=\S)|(?<=\S)_\*\*|\*\*|(?<!\S)__|__(?!\S)")  # inline code, bold and bold italic
# (**_..._**) around a pasted message or a part of it
_DUNDER = re.compile(r"(?<!\w)(__[A-Za-z]\w*?__)(?!\w)")  # a Python name (__init__): a traceback's words, not bold
# A line that begins a message of its own, never the tail of a wrapped one.
_RECORD_START = re.compile(r"^(?:[\w.\-/]+(?:\[\d+\])?:\s|[A-Z]{4,}\[|\[|Error\b|ERROR\b|WARNING\b|Failed\b|"
                           r"Unable\b|NVIDIA-SMI\b|NVRM\b|Traceback\b|terminate\b)")


def _unmark(line: str) -> str:
    """The line without Markdown's inline markup, Python's double-underscore names kept whole."""
    parts = _DUNDER.split(line)
    return "".join(part if i % 2 else _MARKUP.sub("", part) for i, part in enumerate(parts))


@dataclass(eq=False, repr=False)
class _Line(Record):
    text: str  # content after prefixes
    stamped: bool  # carried a log timestamp
    prompt: bool  # was a shell prompt (the rest is a command)
    indent: int  # leading whitespace after dedent, before prefixes
    width: int  # width as pasted (after quoting and dedent)
    stamp: str = ""  # the log prefix it carried


def _fences(line: str) -> list[str]:
    """A fence with the message on the same line ("```docker: Error ...```") as the fence alone, then the message;
    a fence followed by one word ("```bash", "```console") is an info string and stays as it is."""
    match = _FENCE_WITH_TEXT.match(line)
    if not match:
        return [line]
    rest = match[3].strip()
    if not re.search(r"\s|:", rest) and not rest.endswith(("`", "~")):
        return [line]
    return [match[1] + match[2], match[1] + re.sub(r"\s*(?:`{3,}|~{3,})$", "", rest)]  # and a closing fence


_JSON_RECORD = re.compile(r'^\s*\{.*"(?:log|msg|message|MESSAGE)"\s*:.*\}\s*$')
_LOGFMT = re.compile(r'\b(?:msg|error|err)="')


_LOGFMT_FIELD = re.compile(r'\b(msg|error|err)="((?:[^"\\]|\\.)*)"')


def _logfmt_record(line: str) -> str:
    """A logfmt record (containerd, the toolkit's runtime log: `time=... level=error msg="..." error="..."`) as its
    message and error fields, unescaped; any other line as it is."""
    if not re.search(r"\blevel=\w+", line):
        return line
    fields = _LOGFMT_FIELD.findall(line)
    if not fields:
        return line
    return " ".join(re.sub(r'\\(["\\])', r"\1", value) for _, value in fields)


def _json_record(line: str) -> str:
    """A JSON log record (docker's json-file, the CRI log of a pod, `journalctl -o json`, a structured logger) as its
    message, then its error field; any other line as it is."""
    if not _JSON_RECORD.match(line):
        return line
    try:
        record = json.loads(line)
    except ValueError:
        return line
    if not isinstance(record, dict):
        return line
    parts = [record.get(key) for key in ("log", "msg", "message", "MESSAGE", "error", "err")]
    text = " ".join(part.rstrip("\n") for part in parts if isinstance(part, str) and part.strip())
    return text or line


def _unescape(text: str) -> str:
    text = "\n".join(_logfmt_record(_json_record(line)) for line in text.split("\n"))
    text = re.sub(r"#012(?![0-9A-Fa-f]{3})", "\n", text)  # rsyslog's escaped newline / tab
    text = re.sub(r"#011(?![0-9A-Fa-f]{3})", "\t", text)
    if _LOGFMT.search(text):  # logfmt (containerd, the toolkit's runtime log): msg="... \"nvidia\" ..."
        text = re.sub(r'\\+"', '"', text)
    if re.search(r"\\+n", text) and re.search(r'\\+"|\\\\', text):  # a message quoted (maybe twice) in Go/JSON
        text = re.sub(r"\\+n", "\n", text)
        text = re.sub(r'\\+"', '"', text)
    return text


def _strip_prefixes(line: str) -> tuple[str, str, bool]:
    """(the text, the log prefixes stripped from it, whether it was a shell prompt)."""
    stamped = prompt = False
    text = line.strip()
    original = text
    bullet = _BULLET.match(text)
    if bullet:  # a list item begins a record of its own, like a log line
        text = text[bullet.end():]
    changed = True
    while changed and text:
        changed = False
        for pattern in _STAMPS:
            match = pattern.match(text)
            if match and match.end() > 0:
                text, stamped, changed = text[match.end():].lstrip(), True, True
                break
    if not stamped:
        for pattern in _PROMPTS:
            match = pattern.match(text)
            if match:
                text, prompt = text[match.end():].lstrip(), True
                break
    return text, original[:len(original) - len(text)].strip() if stamped or bullet else "", prompt


_BOX = re.compile(r"^\s*[|+]|[|+]\s*$")  # table borders (nvidia-smi): every line as wide as the widest
_TOKEN_END = re.compile(r"[\w./:=\\-]$")


def _starts_record(line: str) -> bool:
    stripped = line.strip()
    return any(p.match(stripped) for p in (*_STAMPS, *_PROMPTS)) or bool(_RECORD_START.match(stripped)) \
        or stripped.startswith("NVRM:")


def _unwrap_hard(lines: list[str]) -> list[str]:
    """Join the lines a terminal cut at its width (mid-word, with no regard for the text): a line exactly as wide as
    the widest is continued by the next one, when that one does not begin a record of its own and either the cut
    fell inside a word or several lines share that width (a terminal's, not a coincidence)."""
    widths = [len(line) for line in lines if line.strip() and not _BOX.search(line) and not _FENCE.match(line)]
    width = max(widths, default=0)
    if width < 60:
        return lines
    repeated = widths.count(width) >= 2
    out: list[str] = []
    joining = False
    for line in lines:
        if joining and line.strip() and not _FENCE.match(line):
            # cut inside a word: "capab" / "ilities: [[gpu]]" (which would otherwise look like a record "ilities: ")
            mid_word = bool(_TOKEN_END.search(out[-1])) and bool(re.match(r"[a-z0-9_./\\\"':,;)\]}-]", line)) \
                and not any(p.match(line) for p in (*_STAMPS, *_PROMPTS))
            if mid_word or (repeated and not _starts_record(line)):
                out[-1] += line
                joining = len(line) == width and not _BOX.search(line)
                continue
        out.append(line)
        joining = len(line) == width and not _BOX.search(line) and not _FENCE.match(line)
    return out


def _table_cells(lines: list[str]) -> list[str]:
    """The rows of a Markdown table (one with a |---| rule) as one cell a paragraph: a message pasted into a cell
    is then a line of its own."""
    if not any(_TABLE_RULE.match(line) for line in lines):
        return lines
    out: list[str] = []
    for line in lines:
        if _TABLE_RULE.match(line):
            out.append("")
        elif _TABLE_ROW.match(line):
            for cell in line.strip().strip("|").split("|"):
                out += [cell.strip(), ""]
        else:
            out.append(line)
    return out


def _lines(text: str, terminal: bool) -> list[_Line]:
    text = _ANSI.sub("", text).replace("\r\n", "\n").replace("\r", "\n")
    text = _HTML_ENTITY.sub(lambda m: html.unescape(m[0]), text)
    text = _HTML_TAG.sub("", _HTML_BREAK.sub("\n", text))
    text = _CONTROL.sub("", text.translate(_CHARS)).expandtabs(8)
    physical = _table_cells([part for line in text.split("\n") for part in _fences(_QUOTE.sub("", line))])
    text = _unescape("\n".join(_unwrap_hard(physical) if terminal else physical))
    raw = []
    for line in text.split("\n"):
        if _FENCE.match(line):
            raw.append("")  # a fence ends a paragraph
            continue
        raw.append(_EMPHASIS.sub(r"\2", _unmark(line).rstrip()))
    widths = [len(line) - len(line.lstrip()) for line in raw if line.strip()]
    common = min(widths, default=0)
    lines = []
    for line in raw:
        line = line[common:] if line.strip() else ""
        content, stamp, prompt = _strip_prefixes(line)
        lines.append(_Line(re.sub(r"\s+", " ", content).strip(), bool(stamp), prompt,
                           len(line) - len(line.lstrip()), len(line), stamp))
    return lines


_NVRM = re.compile(r"^NVRM:\s*")


def _continues(prev: _Line, head: _Line, line: _Line, widest: int) -> bool:
    """Is `line` the tail of the logical line that began with `head`, last ended with `prev`, and whose widest
    physical line so far is `widest` columns?"""
    if line.prompt or head.prompt:
        return False
    nvrm = _NVRM.match(line.text)
    if nvrm and _NVRM.match(head.text) and (not line.stamped or not prev.stamped or line.stamp == prev.stamp):
        # the kernel splits one message over several "NVRM:" lines, each with the message's stamp or none
        rest = line.text[nvrm.end():]
        if rest and (rest[0].islower() or rest[0] == "(") and not prev.text.endswith((".", "!", "?")):
            return True
    if line.stamped:
        return False
    if line.indent > head.indent:  # hanging indent: nvidia-installer paragraphs, dmesg continuation lines
        return True
    if prev.text.endswith((".", "!", "?", ":")) or line.indent != prev.indent:
        return False
    split_word = re.search(r"[A-Za-z0-9]-$", prev.text) and line.text[:1].isalnum()
    if not split_word and _RECORD_START.match(line.text):
        return False
    if line.indent == 0:
        # wrapped at a fixed width of 60 to 120 columns (a split word says so more surely): the line before was
        # ended early only because this line's first word did not fit
        word = len(line.text.split(" ", 1)[0])
        return (40 if split_word else 60) <= widest <= 120 and (prev is head or prev.width + 1 + word > widest)
    return True  # wrapped inside an indented paragraph


def _logical(text: str, terminal: bool = False) -> list[str]:
    out: list[list[str]] = []  # logical lines, as the parts that were joined
    head: _Line | None = None
    prev: _Line | None = None
    widest = 0
    for line in _lines(text, terminal):
        if not line.text:
            if out and out[-1]:
                out.append([])
            head = prev = None
            continue
        if head is not None and prev is not None and _continues(prev, head, line, max(widest, prev.width)):
            parts, tail = out[-1], line.text
            if _NVRM.match(tail) and _NVRM.match(parts[0]):
                tail = _NVRM.sub("", tail)
            # a word split at its hyphen ("libnvidia-" / "ml.so.1") is joined back without a space
            split_word = re.search(r"[A-Za-z0-9]-$", parts[-1]) and tail[:1].isalnum()
            parts.append(tail if split_word else " " + tail)
            widest = max(widest, prev.width)
        else:
            out.append([line.text])
            head, widest = line, 0
        prev = line
    while out and not out[-1]:
        out.pop()
    return ["".join(parts) for parts in out]


def normalise(text: str, terminal: bool = False) -> str:
    """The paste as plain logical lines: no ANSI escapes, shell prompts, markdown quoting or common
    indentation, log timestamps or priorities; straight quotes; wrapped lines re-joined; runs of
    whitespace collapsed. Blank lines between paragraphs are kept (one).

    A line exactly as wide as the widest may have been cut by a terminal inside a word, or wrapped at a space by
    a program; the text alone cannot always tell. `terminal=True` reads such cuts as a terminal's (joined without
    a space); explain matches both readings."""
    return "\n".join(_logical(text, terminal))
