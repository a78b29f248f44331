"""Run the table-driven detectors over a normalised text and rank what they found.

Every row of the detector tables is one detector: its pattern is searched in the text; each distinct match (by
the row's `key`) becomes a candidate finding whose values are the pattern's named groups and whose texts are the
row's, filled in. A few causes need code to say more than the row can (a version looked up in the compat tables,
a reason read elsewhere in the text): `gpunode.explain.hooks` refines those. Xid/SXid lines come from
`gpunode.explain.xid` with the Xid table.

Ranking: the strongest evidence first (the row's strength: a root cause such as Secure Boot rejecting the
module outranks its consequence, nvidia-smi failing), then the order in the text. A finding whose row says it is
superseded by another id present in the same text is dropped; of several variants of one cause, the strongest
stays.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from gpunode import fixes
from gpunode.explain import hooks, xid
from gpunode.explain.finding import Doc, Finding
from gpunode.explain.normalise import normalise
from gpunode.explain.tables import PLACEHOLDER, Detector, tables

_LOWER = {"pci", "pci_id"}
_INT = {"devices", "count", "port"}


@dataclass
class Candidate:
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


def _superseded(finding: Finding, detectors: dict[str, Detector], present: set[str]) -> bool:
    detector = detectors.get(finding.id)
    if detector is None:
        return False
    for other in detector.superseded_by:
        if any(p != finding.id and (p.startswith(other) if other.endswith(".") else p == other) for p in present):
            return True
    return False


def _hits(doc: Doc) -> list[tuple[int, int, Finding, tuple[Any, ...]]]:
    """(strength, position, finding, key) for everything the tables recognise in one normalised text."""
    detectors, _ = tables()
    hits: list[tuple[int, int, Finding, tuple[Any, ...]]] = []
    best: dict[tuple[Any, ...], int] = {}  # (id, key) -> index in hits
    for detector in detectors:
        for candidate in candidates(detector, doc):
            finding = hooks.refine(candidate, doc)
            if finding is None:
                continue
            key = (finding.id, *(candidate.values.get(name) for name in detector.key))
            entry = (finding.strength, candidate.match.start(), finding, key)
            if key in best:  # another variant of the same cause: the stronger evidence stays
                if hits[best[key]][0] < finding.strength:
                    hits[best[key]] = entry
                continue
            best[key] = len(hits)
            hits.append(entry)
    for strength, position, finding in xid.findings(doc):
        hits.append((strength, position, finding, (finding.id, finding.values.get("pci"))))
    return hits


def explain(text: str) -> list[Finding]:
    """Every recognised problem in `text` (a paste, a log), the strongest evidence first."""
    normalised = normalise(text)
    if not normalised:
        return []
    hits = _hits(Doc(normalised))
    terminal = normalise(text, terminal=True)
    if terminal != normalised:  # lines that may have been cut by a terminal: read that way too
        known = {hit[3] for hit in hits}
        hits += [hit for hit in _hits(Doc(terminal)) if hit[3] not in known]
    present = {hit[2].id for hit in hits}
    by_id = {d.id: d for d in tables()[0]}
    kept = [hit for hit in hits if not _superseded(hit[2], by_id, present)]
    kept.sort(key=lambda hit: (-hit[0], hit[1]))
    return [hit[2] for hit in kept]
