"""The explain tables, read once and checked like gpunode.compat's (a bad row is a DataError naming file and line):

    explain_detectors.csv   one row per cause (or per variant of a cause): the pattern that recognises it in a
                            normalised text, how strong that evidence is, and the title, cause, fix and further
                            commands shown for it
    installer_failures.csv  the same columns, for nvidia-installer's failures (also read by the driver step
                            through `installer_failure`)
    xid.csv                 Xid number -> meaning and severity (the operator's immediate action)

Patterns are regular expressions matched case-insensitively against the normalised text, with two conveniences:
a literal space matches any run of whitespace (and a kernel `NVRM:` prefix where the kernel split the message),
so a message matches however it was wrapped; `@PCI@` and `@VER@` stand for a PCI address and a driver version.
Named groups become the finding's values (`name__2` is a second spelling of `name`; names starting with `_` stay
internal) and fill `%(name)s` in the texts. `key` names the values that make two matches separate findings (one
per GPU, one per condition); `superseded_by` lists ids (a trailing `.` = every id with that prefix) whose presence
makes this finding a mere consequence, dropped. `also` separates commands with ` ;; `. `runs` (optional, last)
says where each command runs, one word per command (the fix, then each of also): node (the CLI runs it through
ssh for a remote node), controller (where the user is: gpunode, kubectl) or manual (words for a person); left
empty, a gpunode command runs on the controller and anything else is words.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from gpunode import fixes
from gpunode.datatables import (
    DataError,
    choice_field,
    data_dir,
    optional_field,
    read_table,
    source_field,
    text_field,
)
from gpunode.record import Frozen

MACROS = {"@PCI@": r"[0-9A-Fa-f]{3,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?", "@VER@": r"\d+\.\d+(?:\.\d+)?"}
GAP = r"(?:\s+NVRM:)?\s+"  # between two words of a message: whitespace, maybe a line break and an NVRM: prefix
PLACEHOLDER = re.compile(r"%\((\w+)\)s")
SEVERITIES = ("info", "app", "reset", "reboot", "hardware", "nvlink")

# Values a detector's code adds (gpunode.explain.hooks), so that its texts may name them.
HOOK_VALUES: dict[str, frozenset[str]] = {
    "cuda.requirement": frozenset({"cuda_required", "driver_min", "driver_branch_min", "driver_min_minor_compat"}),
    "docker.no-gpu-driver": frozenset({"capabilities", "snap"}),
    "lib.nvml-missing": frozenset({"library", "reporter"}),
}


def compile_pattern(pattern: str) -> re.Pattern[str]:
    for macro, expansion in MACROS.items():
        pattern = pattern.replace(macro, expansion)
    return re.compile(pattern.replace(" ", GAP), re.IGNORECASE | re.MULTILINE)


def group_names(regex: re.Pattern[str]) -> set[str]:
    return {re.sub(r"__\d+$", "", name) for name in regex.groupindex}


@dataclass(frozen=True, eq=False, repr=False)
class Detector(Frozen):
    id: str
    variant: str
    strength: int  # 1-100: how surely this text names the root cause (findings are ranked by it)
    key: tuple[str, ...]
    regex: re.Pattern[str]
    title: str
    cause: str
    fix: str
    also: tuple[str, ...]
    superseded_by: tuple[str, ...]
    source: str
    table: str
    line: int


# --- column parsers (ValueError -> DataError naming the file, line and column) ----------------------------------

def _id(text: str) -> str:
    if not re.fullmatch(r"[a-z]+(?:\.[a-z0-9-]+)+", text):
        raise ValueError(f"{text!r} is not a finding id (area.name, lowercase)")
    return text


def _word(text: str) -> str:
    if not re.fullmatch(r"[a-z0-9-]+", text):
        raise ValueError(f"{text!r} is not a lowercase word")
    return text


def _strength(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 100:
        raise ValueError(f"{text!r} is not a strength from 1 to 100")
    return int(text)


def _pattern(text: str) -> re.Pattern[str]:
    if re.search(r"\[[^\]]* [^\]]*\]", text):
        raise ValueError("a space inside [...] would be read as a line gap; write \\s")
    try:
        return compile_pattern(text)
    except re.error as exc:
        raise ValueError(f"not a regular expression: {exc}") from None


def _names(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(";") if part.strip())


def _commands(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(" ;; ") if part.strip())


def _runs(text: str) -> tuple[str, ...]:
    words = tuple(text.split())
    wrong = [w for w in words if w not in fixes.RUNS]
    if wrong:
        raise ValueError(f"{wrong[0]!r} is not one of {', '.join(fixes.RUNS)}")
    return words


def _xid(text: str) -> int:
    if not text.isdigit():
        raise ValueError(f"{text!r} is not an Xid number")
    return int(text)


DETECTOR_SCHEMA = {"id": _id, "variant": optional_field(_word), "strength": _strength, "key": optional_field(_names),
                   "pattern": _pattern, "title": text_field, "cause": text_field, "fix": text_field, "also": optional_field(_commands),
                   "superseded_by": optional_field(_names), "source": source_field, "runs": optional_field(_runs)}
XID_SCHEMA = {"xid": _xid, "meaning": text_field, "severity": choice_field(*SEVERITIES), "source": source_field}
DETECTOR_TABLES = ("explain_detectors.csv", "installer_failures.csv")


def _detectors(text: str, name: str) -> list[Detector]:
    detectors = []
    seen: dict[tuple[str, str], int] = {}
    for row in read_table(text, name, DETECTOR_SCHEMA, key=None):
        where = f"data/{name} line {row['_line']}"
        variant = row["variant"] or ""
        if (row["id"], variant) in seen:
            raise DataError(f"{where}: id {row['id']} variant {variant!r} again (first on line "
                            f"{seen[(row['id'], variant)]})")
        seen[(row["id"], variant)] = row["_line"]
        regex = row["pattern"]
        available = group_names(regex) | HOOK_VALUES.get(row["id"], frozenset())
        key = row["key"] or ()
        texts = [row["title"], row["cause"], row["fix"], *(row["also"] or ())]
        unknown = {name for t in texts for name in PLACEHOLDER.findall(t)} - available
        if unknown or set(key) - group_names(regex):
            raise DataError(f"{where}: {', '.join(sorted(unknown | (set(key) - group_names(regex))))} is not a named "
                            "group of the pattern", fix="name the group in the pattern, or drop the placeholder")
        commands = [row["fix"], *(row["also"] or ())]
        runs = row["runs"] or (None,) * len(commands)
        if len(runs) != len(commands):
            raise DataError(f"{where}: column runs has {len(runs)} words for {len(commands)} commands (fix, then each "
                            "of also)", fix="give one of " + "/".join(fixes.RUNS) + " for each, or leave runs empty")
        fix, *also = (fixes.from_row(text, at) for text, at in zip(commands, runs, strict=True))
        detectors.append(Detector(row["id"], variant, row["strength"], key, regex, row["title"], row["cause"],
                                  fix, tuple(also),
                                  row["superseded_by"] or (), row["source"], name, row["_line"]))
    return detectors


def load(directory: Any = None) -> tuple[tuple[Detector, ...], dict[int, tuple[str, str]]]:
    """Read and check the explain tables (uncached; `tables()` is the cached form for the shipped data)."""
    directory = directory if directory is not None else data_dir()

    def read(name: str) -> str:
        try:
            return str((directory / name).read_text(encoding="utf-8"))
        except OSError as exc:
            raise DataError(f"data/{name} cannot be read: {exc}",
                            fix="reinstall gpunode; the data tables ship inside the package") from None

    detectors: list[Detector] = []
    for name in DETECTOR_TABLES:
        detectors += _detectors(read(name), name)
    ids = {d.id for d in detectors}
    for d in detectors:
        for other in d.superseded_by:
            if not other.endswith(".") and other not in ids and not other.startswith(("xid.", "sxid.")):
                raise DataError(f"data/{d.table} line {d.line}: superseded_by names {other}, which no row has")
    xids = {row["xid"]: (row["meaning"], row["severity"]) for row in read_table(read("xid.csv"), "xid.csv",
                                                                                 XID_SCHEMA, key="xid")}
    return tuple(detectors), xids


@lru_cache(maxsize=1)
def tables() -> tuple[tuple[Detector, ...], dict[int, tuple[str, str]]]:
    return load()


def ids(detectors: Iterable[Detector] | None = None) -> tuple[str, ...]:
    seen: dict[str, None] = {}
    for d in detectors if detectors is not None else tables()[0]:
        seen.setdefault(d.id)
    return tuple(seen)


# --- the catalogue: what each component can print (data/explain_catalogue.csv) -----------------------------------

CATALOGUE_SCHEMA = {"emitter": text_field, "message": text_field, "id": _id, "source": source_field}
# Values a catalogued message's {placeholders} are rendered with (tests and benchmarks/explain_holdout.py).
SAMPLE_VALUES = {"pci": "0000:3b:00.0", "hash": "0f3c9a1e7d2b4c6a8e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d",
                 "version": "535.161.08", "n": "1", "cuda": "12.4", "runtime": "nvidia",
                 "kernel": "6.8.0-45-generic", "uuid": "e78e68c0-4e6a-737e-f9cc-4223fe50aead", "pid": "4242",
                 "signal": "31", "code": "1", "ldconfig": "/sbin/ldconfig.real"}
# A message may also keep its source's own format verbs (C printf, Go fmt): each is rendered with a realistic value
# of its kind, so a row can be the format string exactly as the emitter's code spells it.
FORMAT_VERB = re.compile(r'%(?:"PRI[diux]\d*"|[-+ #0]*\d*(?:\.\d+)?(?:hh|h|ll|l|z|j|t)?([sdiuoxXqvwpfeg%]))')
VERB_VALUES = {"s": "nvidia", "v": "nvidia", "w": "no such file or directory", "q": '"nvidia"', "d": "1", "i": "1",
               "u": "1", "o": "20600", "x": "1f", "X": "1F", "p": "0x7ffd5e8c", "f": "1.5", "e": "1.5e+00", "g": "1.5", "%": "%", None: "1"}


@dataclass(frozen=True, eq=False, repr=False)
class Message(Frozen):
    emitter: str  # the component that prints it
    template: str  # the message, {name} for what varies
    id: str  # the finding explain must give for it first (its row holds the cause and the fix)
    source: str  # file and line, or document
    line: int

    def render(self, values: dict[str, str] | None = None) -> str:
        """The message with every {name} and every format verb (%s, %d, %q, %v, ...) filled with a sample value."""
        values = {**SAMPLE_VALUES, **(values or {})}
        text = FORMAT_VERB.sub(lambda m: VERB_VALUES[m[1]], self.template)
        return re.sub(r"\{(\w+)\}", lambda m: values.get(m[1], m[0]), text)

    def placeholders(self) -> set[str]:
        return set(re.findall(r"\{(\w+)\}", self.template))


def catalogue(directory: Any = None) -> tuple[Message, ...]:
    """Every catalogued message, checked: its finding id is one the tables (or the Xid code) can give."""
    directory = directory if directory is not None else data_dir()
    name = "explain_catalogue.csv"
    try:
        text = str((directory / name).read_text(encoding="utf-8"))
    except OSError as exc:
        raise DataError(f"data/{name} cannot be read: {exc}",
                        fix="reinstall gpunode; the data tables ship inside the package") from None
    known = set(ids())
    messages = []
    for row in read_table(text, name, CATALOGUE_SCHEMA, key=None):
        if row["id"] not in known and not row["id"].startswith(("xid.", "sxid.")):
            raise DataError(f"data/{name} line {row['_line']}: id {row['id']} is not a finding id of the explain "
                            "tables", fix="add a detector row for it, or name an existing id")
        message = Message(row["emitter"], row["message"], row["id"], row["source"], row["_line"])
        if message.placeholders() - set(SAMPLE_VALUES):
            raise DataError(f"data/{name} line {row['_line']}: {{{sorted(message.placeholders() - set(SAMPLE_VALUES))[0]}}} "
                            "has no sample value", fix="use a name of tables.SAMPLE_VALUES, or a format verb such as %s")
        messages.append(message)
    return tuple(messages)
