"""TOML writer producing the layout nvidia-ctk (go-toml) writes: keys sorted, plain keys before sub-tables,
every table gets a header (even when it only holds sub-tables), two spaces of indentation per level and a blank
line before each header.  Runs inside simulated nodes (stdlib only)."""

import datetime
import re

_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


def key(k):
    return k if _BARE.match(k) else quote(k)


def quote(s):
    out = ['"']
    for ch in s:
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if v != v:
            return "nan"
        if v in (float("inf"), float("-inf")):
            return "inf" if v > 0 else "-inf"
        r = repr(v)
        return r if ("." in r or "e" in r or "n" in r) else r + ".0"
    if isinstance(v, str):
        return quote(v)
    if isinstance(v, (datetime.datetime, datetime.date, datetime.time)):
        return v.isoformat()
    if isinstance(v, list):
        return "[" + ", ".join(value(x) for x in v) + "]"
    if isinstance(v, dict):  # inline table inside an array
        return "{" + ", ".join(f"{key(k)} = {value(x)}" for k, x in sorted(v.items())) + "}"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def _is_table_array(v):
    return isinstance(v, list) and v and all(isinstance(x, dict) for x in v)


def _emit(lines, path, table, depth, array=False):
    indent = "  " * (depth - 1)
    header = ".".join(key(p) for p in path)
    lines.append("")
    lines.append(f"{indent}[[{header}]]" if array else f"{indent}[{header}]")
    _body(lines, path, table, depth)


def _body(lines, path, table, depth):
    indent = "  " * depth if path else ""
    for k in sorted(table):
        v = table[k]
        if isinstance(v, dict) or _is_table_array(v):
            continue
        lines.append(f"{indent}{key(k)} = {value(v)}")
    for k in sorted(table):
        v = table[k]
        if isinstance(v, dict):
            _emit(lines, path + [k], v, depth + 1)
        elif _is_table_array(v):
            for item in v:
                _emit(lines, path + [k], item, depth + 1, array=True)


def dumps(doc):
    lines = []
    _body(lines, [], doc, 0)
    while lines and lines[0] == "":
        lines.pop(0)
    return "\n".join(lines) + "\n"
