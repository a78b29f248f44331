"""The generic layer: findings for lines no detector row was written for, read from what the line is made of.

Two tables, both data with sources:

    explain_error_codes.csv     each CUDA runtime/driver and NVML error code a node can cause, by number, by every
                                enum name its libraries and bindings print (cudaErrorX, CUDA_ERROR_X, NVML_ERROR_X,
                                go-nvml's ERROR_X, pynvml's NVMLError_X) and by its message, mapped to the finding
                                of its cause. A wrapper (vLLM, CuPy, JAX, a miner, a custom tool) that prints only
                                the code, the name or the string still names the cause.
    explain_error_classes.csv   the generic shapes of an error (permission denied, not found, version mismatch, out
                                of memory, timeout, busy, already exists, unsupported, invalid configuration,
                                insufficient), each a pattern with the wordings libc, Go, the loader and the
                                component libraries print.
    explain_generic.csv         component x error class: when a line shows a class and the thing the error is about
                                (the subject nearest the error words on the same line: a library, a program, a
                                device node, a cgroup file, a Kubernetes resource) is one of this row's, the finding
                                is this row's id, at the row's (lower) strength.

A generic finding takes its title, cause and fix from the id's detector row (one place for each fix) and says it is
generic: the title ends "(generic match)" and the cause begins with what was recognised and why. It quotes the line
it used. It is dropped when a detector row recognised something on the same line or gave the same id: the rows
written for a message know more than its shape.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from gpunode.datatables import DataError, data_dir, optional_field, read_table, source_field, text_field
from gpunode.explain.candidate import fill
from gpunode.explain.finding import Doc, Finding
from gpunode.explain.normalise import normalise
from gpunode.explain.tables import FORMAT_VERB, PLACEHOLDER, Detector, catalogue, group_names, tables
from gpunode.record import Frozen

CATCH_ALL = 44  # a row this weak is a component's catch-all ("stage failed", "hook failed"): it does not explain a line
MAX_GAP = 80  # characters between the error words and the thing they are about, on one line


@dataclass(frozen=True, eq=False, repr=False)
class ErrorClass(Frozen):
    name: str
    regex: re.Pattern[str]
    meaning: str


@dataclass(frozen=True, eq=False, repr=False)
class Subject(Frozen):
    id: str
    error_class: str
    regex: re.Pattern[str]
    strength: int
    row: Detector  # the detector row whose texts the finding shows
    line: int


@dataclass(frozen=True, eq=False, repr=False)
class Code(Frozen):
    family: str
    code: int
    names: tuple[str, ...]
    message: str
    id: str
    row: Detector
    regexes: tuple[tuple[str, re.Pattern[str], int], ...]  # (how it was read, pattern, strength)


@dataclass(frozen=True, eq=False, repr=False)
class Catalogued(Frozen):
    id: str
    emitter: str
    regex: re.Pattern[str]
    row: Detector


def _regex(text: str) -> re.Pattern[str]:
    try:
        return re.compile(text, re.IGNORECASE)
    except re.error as exc:
        raise ValueError(f"not a regular expression: {exc}") from None


def _strength(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 60:
        raise ValueError(f"{text!r} is not a generic strength from 1 to 60 (generic findings rank below specific ones)")
    return int(text)


def _int(text: str) -> int:
    if not text.isdigit():
        raise ValueError(f"{text!r} is not a number")
    return int(text)


def _names(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(";") if part.strip())


def _optional(text: str) -> str:
    return text.strip()


CLASS_SCHEMA = {"class": text_field, "pattern": _regex, "meaning": text_field, "source": source_field}
GENERIC_SCHEMA = {"id": text_field, "class": text_field, "subject": _regex, "strength": _strength,
                  "source": source_field}
CODE_SCHEMA = {"family": text_field, "code": _int, "names": optional_field(_names), "message": optional_field(_optional), "id": text_field,
               "source": source_field, "string": optional_field(_optional)}
# A call of the library's API right before its error string: "nvmlDeviceGetHandleByIndex(): Unknown Error",
# "nvmlInit_v2() failed: GPU is lost", "cuInit failed: unknown error". The function's name makes even a common
# string (Unknown Error) the library's. For CUDA only the calls that start it (initialise, count or pick a device,
# make the first context): there a code's cause is the node's; the same code from a running kernel's call is not.
_AFTER_CALL = r"(?:\([^()\n]{0,40}\))?[^\n\w]{0,4}(?:(?:failed|returned|error|with|:)\W{0,3}){0,3}"
_CALL = {"nvml": r"\b(?P<call>nvml[A-Z]\w*)" + _AFTER_CALL,
         "cuda": r"\b(?P<call>cuInit|cuDeviceGet(?:Count)?|cuCtxCreate\w*|cuDevicePrimaryCtxRetain|cudaGetDeviceCount"
                 r"|cudaSetDevice|cudaGetDevice|cudaInitDevice)\b" + _AFTER_CALL}
_CONTEXT = {"cuda": re.compile(r"cuda|\bcu[A-Z]\w+|\bGPU", re.IGNORECASE),
            "nvml": re.compile(r"nvml|nvidia-smi|\bGPU", re.IGNORECASE)}


def _row_for(finding_id: str, available: set[str], where: str) -> Detector:
    """The first detector row of an id whose texts need no value but `available` (the generic finding shows it)."""
    rows = [d for d in tables()[0] if d.id == finding_id]
    if not rows:
        raise DataError(f"{where}: id {finding_id} is not a finding id of the explain tables",
                        fix="name an id of data/explain_detectors.csv")
    for row in rows:
        texts = [row.title, row.cause, row.fix, *row.also]
        if {name for t in texts for name in PLACEHOLDER.findall(t)} <= available:
            return row
    raise DataError(f"{where}: every row of {finding_id} needs a value the generic match cannot give",
                    fix="name the value as a group of the subject pattern, e.g. (?P<library>...)")


def _loose(message: str) -> str:
    """A message as a pattern that tolerates other spacing and punctuation ("Driver / library" for
    "Driver/library"), and for a message of five words or more one word left out ("no CUDA-capable is detected")."""
    words = re.findall(r"[A-Za-z0-9]+", message)
    exact = r"[\W_]*".join(re.escape(w) for w in words)
    if len(words) < 5:
        return r"\b" + exact + r"\b"
    fewer = [r"[\W_]*".join(re.escape(w) for w in words[:i] + words[i + 1:]) for i in range(1, len(words) - 1)]
    return r"\b(?:" + "|".join([exact, *fewer]) + r")\b"


_WORDS = r"[\W_]+(?:[A-Za-z0-9]+[\W_]+)?"  # between two words of a catalogued message: punctuation, maybe one more word


def _tolerant(template: str) -> re.Pattern[str] | None:
    """A catalogued message as a pattern for other versions' and other values' wording: what varies (its {names}
    and format verbs) matches anything on the line, its words in order with at most one extra word between two,
    spacing and punctuation free. None for a message with fewer than four fixed words (too little to go on)."""
    text = re.sub(r"\{\w+\}", "\x00", FORMAT_VERB.sub("\x00", template))
    parts = [re.findall(r"[A-Za-z0-9]+", part) for part in text.split("\x00")]
    if sum(len(words) for words in parts) < 4:
        return None
    pattern = r"[^\n]{0,80}?".join(_WORDS.join(re.escape(w) for w in words) for words in parts if words)
    return re.compile(r"\b" + pattern + r"\b", re.IGNORECASE)


def _read(name: str) -> str:
    try:
        return str((data_dir() / name).read_text(encoding="utf-8"))
    except OSError as exc:
        raise DataError(f"data/{name} cannot be read: {exc}",
                        fix="reinstall gpunode; the data tables ship inside the package") from None


CONTEXT_SCHEMA = {"id": text_field, "context": _regex, "becomes": text_field, "source": source_field}


@lru_cache(maxsize=1)
def contexts() -> tuple[tuple[str, re.Pattern[str], Detector], ...]:
    """data/explain_component_context.csv: (id, what in the paste names the component, the row it then becomes).
    The component a paste shows (the device plugin's pod, the open kernel module) decides between sibling causes
    of one message."""
    out = []
    for row in read_table(_read("explain_component_context.csv"), "explain_component_context.csv", CONTEXT_SCHEMA,
                          key=None):
        where = f"data/explain_component_context.csv line {row['_line']}"
        out.append((row["id"], row["context"], _row_for(row["becomes"], set(), where)))
    return tuple(out)


def in_component(finding: Finding, doc: Doc) -> Finding | None:
    """`finding` told as the sibling cause of the component the paste shows, or None."""
    for finding_id, context, row in contexts():
        if finding.id != finding_id:
            continue
        match = context.search(doc.text)
        if match:
            line = doc.excerpt(match.start(), match.end())
            excerpt = finding.excerpt if line in finding.excerpt else f"{finding.excerpt}\n{line}"
            return Finding(row.id, row.title, row.cause, row.fix, excerpt,
                           {**finding.values, "component": match[0], "instead_of": finding.id}, row.also,
                           max(row.strength, finding.strength))
    return None


@lru_cache(maxsize=1)
def catalogued() -> tuple[Catalogued, ...]:
    """Every catalogued message (data/explain_catalogue.csv) whose id has a row the generic finding can show, as a
    tolerant pattern."""
    out = []
    for message in catalogue():
        regex = _tolerant(message.template)
        if regex is None or message.id.startswith(("xid.", "sxid.")):
            continue
        try:
            row = _row_for(message.id, set(), f"data/explain_catalogue.csv line {message.line}")
        except DataError:
            continue  # every row of that id needs a value from its own pattern
        out.append(Catalogued(message.id, message.emitter, regex, row))
    return tuple(out)


PREFIX_WORDS = 5  # the fixed words a message cut at the end of a line must keep to be read as that message


def _cut(template: str) -> tuple[str, re.Pattern[str]] | None:
    """A catalogued message as a pattern for a paste cut short at the end of a line ("... failed: ERROR_LIBRA",
    "... the client has the vers"): its first PREFIX_WORDS fixed words, then as many of the following words as the
    line still has, the line ending inside a word or inside what varies (a line ending at a word's end may be a
    shorter message, complete: only an ellipsis says it was cut there), with its first word in lower case (a line
    without it cannot match: no search needed). None for a message with fewer fixed words."""
    text = re.sub(r"\{\w+\}", "\x00", FORMAT_VERB.sub("\x00", template))
    tokens: list[str | None] = []  # words, None for what varies
    for i, part in enumerate(text.split("\x00")):
        tokens += ([None] if i else []) + re.findall(r"[A-Za-z0-9]+", part)
    while tokens and tokens[0] is None:
        tokens.pop(0)
    words = [i for i, token in enumerate(tokens) if token is not None]
    if len(words) < PREFIX_WORDS:
        return None
    head = words[PREFIX_WORDS - 1] + 1

    def piece(token: str | None) -> str:
        return r"[^\n]{1,80}?" if token is None else re.escape(token)

    ellipsis = r"[\W_]*(?:\.{3}|\u2026)"  # "..." or "…": the paster says it was cut, at a word's end too
    rest = "(?!)"  # built from the end: the line ends inside a word, inside a value, or at an ellipsis
    for token in reversed(tokens[head:]):
        cut = r"[^\n]{1,80}?" if token is None else "|".join(
            re.escape(token[:j]) for j in range(len(token) - 1, 0, -1)) or "(?!)"
        rest = r"[\W_]+(?:" + piece(token) + "(?:" + rest + "|" + ellipsis + ")|" + cut + ")"
    body = r"[\W_]+".join(piece(token) for token in tokens[:head])
    first = tokens[0]
    assert first is not None  # leading values were dropped above
    return first.lower(), re.compile(r"\b" + body + "(?:" + rest + "|" + ellipsis + r")[\W_]*$", re.IGNORECASE)


@lru_cache(maxsize=1)
def cut_messages() -> tuple[tuple[str, str, re.Pattern[str], Detector | None], ...]:
    """(id, first word, pattern, the row a finding shows or None) for every catalogued message long enough to be
    read cut."""
    rows = {m.id: m.row for m in catalogued()}
    out = []
    for message in catalogue():
        for line in normalise(message.template).split("\n"):  # as explain reads it: no log prefix
            cut = _cut(line)
            if cut is not None:
                out.append((message.id, *cut, rows.get(message.id)))
    return tuple(out)


@lru_cache(maxsize=1)
def load() -> tuple[tuple[ErrorClass, ...], tuple[Subject, ...], tuple[Code, ...]]:
    """Read and check the three generic tables (a bad row is a DataError naming file and line)."""
    classes = tuple(ErrorClass(row["class"], row["pattern"], row["meaning"])
                    for row in read_table(_read("explain_error_classes.csv"), "explain_error_classes.csv",
                                          CLASS_SCHEMA, key="class"))
    known = {c.name for c in classes}
    subjects = []
    for row in read_table(_read("explain_generic.csv"), "explain_generic.csv", GENERIC_SCHEMA, key=None):
        where = f"data/explain_generic.csv line {row['_line']}"
        if row["class"] not in known:
            raise DataError(f"{where}: class {row['class']} is not one of data/explain_error_classes.csv",
                            fix="use one of " + ", ".join(sorted(known)))
        detector = _row_for(row["id"], group_names(row["subject"]), where)
        subjects.append(Subject(row["id"], row["class"], row["subject"], row["strength"], detector, row["_line"]))
    codes = []
    for row in read_table(_read("explain_error_codes.csv"), "explain_error_codes.csv", CODE_SCHEMA, key=None):
        where = f"data/explain_error_codes.csv line {row['_line']}"
        detector = _row_for(row["id"], set(), where)
        family = row["family"].split("-")[0]
        regexes: list[tuple[str, re.Pattern[str], int]] = []
        if row["names"]:
            regexes.append(("name", re.compile(r"\b(?:" + "|".join(map(re.escape, row["names"])) + r")\b"), 58))
        string = row["string"] or row["message"]  # the library's own words (`string` where too common alone)
        if string and family in _CALL:
            regexes.append(("call", re.compile(_CALL[family] + r"\b" + r"[\W_]*".join(
                map(re.escape, re.findall(r"[A-Za-z0-9]+", string))) + r"\b", re.IGNORECASE), 58))
        if row["message"]:
            regexes.append(("message", re.compile(_loose(row["message"]), re.IGNORECASE), 54))
        number = (r"(?:\berror|\bcode|\berr|\breturn(?:ed|s)?|status|result|init failure)\W{0,3}(?:=\s*|\(\s*)?"
                  + str(row["code"]) + r"\b(?!\.\d)")  # "error 803", "code=46", "returned 100" (cuda-samples
        # deviceQuery: "cudaGetDeviceCount returned %d\n-> %s", retold "... return 35"), and ollama's
        # discovery "cuda driver library init failure: 999" (discover/gpu_info_nvcuda.c: the CUresult of cuInit)
        if row["code"] >= 100:  # "802 system error" (a small number before "error" is too often something else)
            number += r"|(?<![.\d])\b" + str(row["code"]) + r"\W{0,2}(?:[a-z]+ )?error\b"
        regexes.append(("code", re.compile(number, re.IGNORECASE), 54))
        if family not in _CONTEXT:
            raise DataError(f"{where}: family {row['family']} is not one of " + ", ".join(_CONTEXT))
        codes.append(Code(row["family"], row["code"], row["names"] or (), row["message"] or "", row["id"], detector,
                          tuple(regexes)))
    return classes, tuple(subjects), tuple(codes)


def _lines(text: str) -> list[tuple[int, str]]:
    out, start = [], 0
    for line in text.split("\n"):
        out.append((start, line))
        start += len(line) + 1
    return out


def _gap(subject: re.Match[str], error: re.Match[str]) -> int:
    if subject.end() <= error.start():
        return error.start() - subject.end()
    if subject.start() >= error.end():
        return subject.start() - error.end() + 5  # "<thing>: <error>" is the usual order; after it, a little farther
    return 0


def _emitter(line: str, subject: re.Match[str], error: re.Match[str]) -> bool:
    """Is `subject` the program that printed the error rather than what it is about? "nvidia-container-cli:
    ldcache error: ... no such file" names its emitter and then a stage; "libnvidia-container.so.1: cannot open
    shared object file" names the object right before the error. (An emitter rejecting its own configuration is
    still the object: the caller keeps it for that class.)"""
    after = line[subject.end():error.start()]
    return after.startswith(":") and len(after.strip(": ")) > 0


def _finding(row: Detector, values: dict[str, Any], line: str, title_note: str, cause_note: str,
             strength: int) -> Finding:
    shown = {k: v for k, v in values.items() if not k.startswith("_")}
    return Finding(row.id, fill(row.title, shown) + f" ({title_note})", cause_note + " " + fill(row.cause, shown),
                   fill(row.fix, shown), line.strip(), shown, tuple(fill(a, shown) for a in row.also), strength)


def _code_hits(start: int, line: str) -> list[tuple[int, int, Finding, tuple[Any, ...]]]:
    hits: list[tuple[int, int, Finding, tuple[Any, ...]]] = []
    for code in load()[2]:
        family = code.family.split("-")[0]
        for how, regex, strength in code.regexes:
            match = regex.search(line)
            if not match:
                continue
            words = len(re.findall(r"[A-Za-z0-9]+", code.message))
            if how != "name" and not (how == "message" and words >= 4) and not _CONTEXT[family].search(line):
                continue  # a bare number or a short message means nothing without CUDA/NVML on the line
            name = code.names[0] if code.names else f"{code.family} {code.code}"
            values = {"generic": "error-code", "code": f"{code.family} {code.code}", "error_name": name}
            read = f"read from its {how}"
            if how == "call":
                values["call"] = match["call"]
                read = f"returned by {match['call']}"
            hits.append((strength, start + match.start(), _finding(
                code.row, values, line, "generic match: error code",
                f"Generic finding: recognised by its {code.family.upper() if family == 'nvml' else code.family} "
                f"error code ({code.code}, {name}, {read}), not by a catalogued message; "
                "this is the code's usual cause on a node.", strength), (code.id, "generic")))
            break
    return hits


def _catalogue_hits(start: int, line: str) -> list[tuple[int, int, Finding, tuple[Any, ...]]]:
    hits: list[tuple[int, int, Finding, tuple[Any, ...]]] = []
    for message in catalogued():
        match = message.regex.search(line)
        if match:
            hits.append((50, start + match.start(), _finding(
                message.row, {"generic": "catalogue", "emitter": message.emitter}, line,
                "generic match: a catalogued message in other words",
                f"Generic finding: this line is {message.emitter}'s catalogued message in other words or with other "
                "values (no detector row matched it); that message's cause is the following.", 50),
                (message.id, "generic")))
    return hits


def _cut_hits(start: int, line: str) -> list[tuple[int, int, Finding, tuple[Any, ...]]]:
    """A line that ends inside a catalogued message (a paste cut mid-word): read as that message when every
    catalogued message it can be the beginning of has the same finding."""
    low = line.lower()
    found = [(finding_id, match, row) for finding_id, first, regex, row in cut_messages()
             if first in low for match in [regex.search(line)] if match]
    if not found or len({finding_id for finding_id, _, _ in found}) != 1:
        return []
    finding_id, match, row = min(found, key=lambda f: f[1].start())
    if row is None:
        return []
    return [(48, start + match.start(), _finding(
        row, {"generic": "cut-message"}, line, "generic match: a catalogued message cut short",
        "Generic finding: this line ends inside a catalogued message (the paste was cut at the end of the line) and "
        "every catalogued message it can be the beginning of has the same cause, the following.", 48),
        (finding_id, "generic"))]


def _class_hits(start: int, line: str) -> list[tuple[int, int, Finding, tuple[Any, ...]]]:
    classes, subjects, _ = load()
    errors = [(c, m) for c in classes for m in c.regex.finditer(line)]
    if not errors:
        return []
    things = [(s, m) for s in subjects for m in s.regex.finditer(line)]
    hits: list[tuple[int, int, Finding, tuple[Any, ...]]] = []
    for error_class, error in errors:
        near = sorted(((_gap(m, error), m.start(), s, m) for s, m in things
                       if s.error_class == error_class.name
                       and (error_class.name == "invalid-config" or not _emitter(line, m, error))),
                      key=lambda t: (t[0], t[1]))
        if not near or near[0][0] > MAX_GAP:
            continue
        gap, position = near[0][0], near[0][1]
        for _, _, subject, match in (t for t in near if t[0] == gap and t[1] == position):
            values: dict[str, Any] = {k: v for k, v in match.groupdict().items() if v}
            values.update({"generic": error_class.name, "subject": match[0]})
            hits.append((subject.strength, start + error.start(), _finding(
                subject.row, values, line, f"generic match: {error_class.name}",
                f"Generic finding: no catalogued message matched this line, but it says that {match[0]} "
                f"{error_class.meaning}; for {match[0]} that is most often the following.", subject.strength),
                (subject.id, "generic")))
    return hits


def findings(doc: Doc, specific: list[tuple[int, int, Finding, tuple[Any, ...]]]
             ) -> list[tuple[int, int, Finding, tuple[Any, ...]]]:
    """(strength, position, finding, key) for the lines of `doc` that no detector row explained."""
    explained_ids = {hit[2].id for hit in specific}
    out: list[tuple[int, int, Finding, tuple[Any, ...]]] = []
    seen: set[str] = set()
    for start, line in _lines(doc.text):
        if not line.strip():
            continue
        # a row written for this line's message explains it, unless that row is a weaker catch-all (a component's
        # "stage failed" headline): then the detail the generic layer read from the same line is the decisive one
        here = [hit[0] for hit in specific if start <= hit[1] <= start + len(line)]
        codes = _code_hits(start, line)
        # a line that names an error code is read by its code: the words around it ("Unable to load cudart library
        # ...: cuda driver library init failure: 3") are the wrapper, the code says what failed
        for hit in codes + _catalogue_hits(start, line) + _cut_hits(start, line) + (
                [] if codes else _class_hits(start, line)):
            if hit[2].id in explained_ids or hit[2].id in seen or any(strength > CATCH_ALL for strength in here):
                continue
            seen.add(hit[2].id)
            out.append(hit)
    return out
