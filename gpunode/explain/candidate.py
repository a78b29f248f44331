"""One detector's match in a text (`Candidate`) and the finding its row describes (`render`): read by the engine,
which finds the candidates, and by the hooks, which refine them."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from gpunode import fixes
from gpunode.explain.finding import Doc, Finding
from gpunode.explain.tables import PLACEHOLDER, Detector
from gpunode.record import Record

_LOWER = {"pci", "pci_id"}
_INT = {"devices", "count", "port"}


@dataclass(eq=False, repr=False)
class Candidate(Record):
    detector: Detector
    match: re.Match[str]
    matches: list[re.Match[str]]
    values: dict[str, Any]


def _values(match: re.Match[str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name, value in match.groupdict().items():
        if value is None:
            continue
        name = re.sub(r"__\d+$", "", name)
        value = value.strip()
        if name in _LOWER:
            value = value.lower()
        if name in _INT and value.isdigit():
            value = int(value)
        values.setdefault(name, value)
    return values


def candidates(detector: Detector, doc: Doc) -> Iterator[Candidate]:
    groups: dict[tuple[Any, ...], Candidate] = {}
    for match in detector.regex.finditer(doc.text):
        values = _values(match)
        key = tuple(values.get(name) for name in detector.key)
        known = groups.get(key)
        if known is None:
            groups[key] = Candidate(detector, match, [match], values)
        else:
            known.matches.append(match)
            for name, value in values.items():
                known.values.setdefault(name, value)
    yield from groups.values()


def fill(text: str, values: dict[str, Any]) -> str:
    """The %(name)s placeholders of a table text filled in; a fix's parts (gpunode/fixes.py) are kept."""
    return fixes.fill(text, lambda words: PLACEHOLDER.sub(lambda m: str(values.get(m[1], m[0])), words))


def render(candidate: Candidate, doc: Doc, **override: Any) -> Finding:
    """The finding a candidate's row describes, with `override` replacing fields (title, cause, fix, also, values)."""
    d = candidate.detector
    values = {k: v for k, v in override.pop("values", candidate.values).items() if not k.startswith("_")}
    texts = {"title": d.title, "cause": d.cause, "fix": d.fix, "also": d.also, **override}
    return Finding(d.id, fill(texts["title"], values), fill(texts["cause"], values), fill(texts["fix"], values),
                   override.get("excerpt") or doc.excerpt(candidate.match.start(), candidate.match.end()), values,
                   tuple(fill(a, values) for a in texts["also"]), d.strength)
