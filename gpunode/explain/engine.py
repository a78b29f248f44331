"""Run the table-driven detectors over a normalised text and rank what they found.

Every row of the detector tables is one detector: its pattern is searched in the text; each distinct match (by
the row's `key`) becomes a candidate finding whose values are the pattern's named groups and whose texts are the
row's, filled in. A few causes need code to say more than the row can (a version looked up in the compat tables,
a reason read elsewhere in the text): `gpunode.explain.hooks` refines those. Xid/SXid lines come from
`gpunode.explain.xid` with the Xid table.

Ranking: the strongest evidence first (the row's strength: a root cause such as Secure Boot rejecting the
module outranks its consequence, nvidia-smi failing), then the order in the text. A finding whose row says it is
superseded by another id present in the same text is dropped; of several variants of one cause, the strongest
stays, and a weaker finding of the same id that adds no value of its own (a prose mention) is dropped.
"""

from __future__ import annotations

from typing import Any

from gpunode.explain import generic, hooks, xid
from gpunode.explain.candidate import candidates
from gpunode.explain.finding import Doc, Finding
from gpunode.explain.normalise import normalise
from gpunode.explain.tables import tables

GENERIC = True  # the generic layer (gpunode.explain.generic and the family-wide decisive line); benchmarks switch it off


def _superseded(finding: Finding, superseded_by: dict[str, set[str]], present: set[str]) -> bool:
    for other in superseded_by.get(finding.id, ()):
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
    if GENERIC:
        hits += generic.findings(doc, hits)
    if GENERIC:  # the component the paste shows decides between sibling causes of one message (first: a device
        # plugin's pod started by a plain `docker run` is the plugin's case, not a user's container without a GPU)
        for i, (_, position, finding, key) in enumerate(hits):
            refined = generic.in_component(finding, doc)
            if refined is not None:
                hits[i] = (refined.strength, position, refined, (refined.id, *key[1:]))
    if GENERIC and not any(hit[2].id == "container.no-gpu-injected" for hit in hits):  # the decisive line, any wording
        for i, (_, position, finding, key) in enumerate(hits):
            refined = hooks.in_container_without_gpu(finding, doc)
            if refined is not None and generic.in_component(finding, doc) is None:  # the component's cause stands
                hits[i] = (refined.strength, position, refined, ("container.no-gpu-injected", *key[1:]))
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
    specific = {hit[2].id for hit in hits if "generic" not in hit[2].values}
    hits = [hit for hit in hits if "generic" not in hit[2].values or hit[2].id not in specific]  # either reading's row
    present = {hit[2].id for hit in hits if not hit[2].values.get("from_prose")}  # a mere mention supersedes nothing
    superseded_by: dict[str, set[str]] = {}  # what any variant of an id yields to (a finding does not keep its variant)
    for detector in tables()[0]:
        superseded_by.setdefault(detector.id, set()).update(detector.superseded_by)
    kept = [hit for hit in hits if not _superseded(hit[2], superseded_by, present)]
    kept.sort(key=lambda hit: (-hit[0], hit[1]))
    return _distinct([hit[2] for hit in kept])


def _distinct(findings: list[Finding]) -> list[Finding]:
    """Drop a finding that repeats a stronger one of the same id and says nothing it does not (a mention of the
    cause in prose next to the log line that proves it, a second wording of the same message)."""
    out: list[Finding] = []
    for finding in findings:
        same = [f for f in out if f.id == finding.id]
        if any(all(other.values.get(k) == v for k, v in finding.values.items()) for other in same):
            continue
        out.append(finding)
    return out
