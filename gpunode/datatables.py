"""The loader of gpunode's data tables (data/*.csv, shipped as gpunode/data/): one CSV table read against its
schema, every row checked, a malformed one a `DataError` naming the file and line. The compatibility tables
(gpunode/compat.py) and explain's tables (gpunode/explain/tables.py) are read with it.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gpunode.errors import GpunodeError


class DataError(GpunodeError):
    """A shipped data table is malformed. Names the file and the line."""


Parser = Callable[[str], Any]



def optional_field(parser: Parser) -> Parser:
    def parse(text: str) -> Any:
        return parser(text) if text else None
    parse.optional = True  # type: ignore[attr-defined]
    return parse


def choice_field(*choices: str) -> Parser:
    def parse(text: str) -> str:
        if text not in choices:
            raise ValueError(f"{text!r} is not one of {', '.join(choices)}")
        return text
    return parse


def text_field(text: str) -> str:
    return text


def source_field(text: str) -> str:
    if len(text) < 8:
        raise ValueError("every row needs its source")
    return text


def data_dir() -> Any:
    """gpunode/data inside an installed wheel; the repo's top-level data/ in an editable checkout."""
    here = Path(__file__).resolve().parent
    # what importlib.resources answers for a package on the file system, without importing it (~10 ms of imports)
    for directory in (here / "data", here.parent / "data"):
        if directory.is_dir():
            return directory
    from importlib import resources  # a package imported from a zip file

    packaged = resources.files("gpunode") / "data"
    return packaged if packaged.is_dir() else here.parent / "data"


def read_table(text: str, name: str, schema: Mapping[str, Parser], key: str | None = None) -> list[dict[str, Any]]:
    """Parse one CSV table and check every row against its schema (column -> parser, in order); `key`: the
    column whose values must be unique. Errors name `data/NAME line N`."""
    where = f"data/{name}"
    reader = csv.reader(io.StringIO(text))
    try:
        header = next(reader)
    except StopIteration:
        raise DataError(f"{where} is empty", fix="restore the file from the gpunode source tree") from None
    except csv.Error as exc:
        raise DataError(f"{where} line 1: {exc}") from None
    expected = list(schema)
    if [h.strip() for h in header] != expected:
        raise DataError(f"{where} line 1: expected the columns {','.join(expected)}, found {','.join(header)}",
                        fix="restore the file from the gpunode source tree")
    rows: list[dict[str, Any]] = []
    seen: dict[Any, int] = {}
    while True:
        try:
            fields = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            raise DataError(f"{where} line {reader.line_num}: {exc}") from None
        line = reader.line_num
        if not fields or all(not f.strip() for f in fields):
            continue
        # a row may leave out optional columns at the end (rows written before such a column was added)
        while len(fields) < len(expected) and getattr(schema[expected[len(fields)]], "optional", False):
            fields.append("")
        if len(fields) != len(expected):
            raise DataError(f"{where} line {line}: {len(fields)} fields, expected {len(expected)} "
                            f"({','.join(expected)})", fix="quote fields that contain commas")
        row: dict[str, Any] = {"_line": line}
        for column, raw in zip(expected, fields, strict=True):
            parser = schema[column]
            value = raw.strip()
            if not value and not getattr(parser, "optional", False):
                raise DataError(f"{where} line {line}: column {column} is empty")
            try:
                row[column] = parser(value)
            except ValueError as exc:
                raise DataError(f"{where} line {line}: column {column}: {exc}") from None
        if key is not None:
            if row[key] in seen:
                raise DataError(f"{where} line {line}: duplicate {key} {fields[expected.index(key)]!r} "
                                f"(first on line {seen[row[key]]})")
            seen[row[key]] = line
        rows.append(row)
    if not rows:
        raise DataError(f"{where} has a header but no rows")
    return rows
