"""How often `gpunode explain` names the right cause on real error texts it was not written against.

The corpus is tests/fixtures/explain/: real texts from public issue trackers, each with the cause a maintainer or
the thread settled on (corpus.csv, provenance in MANIFEST.md). A fixed rule split it before development (the
first hex digit of sha256(file name) 0-3 -> holdout/, else dev/). The dev texts are also tests
(tests/explain/test_corpus.py); the held-out ones are never tuned on. The `unseen` set (issue 26) holds real
texts added later, of families and wordings no rule was written from; like the held-out set it is only measured.
This prints the hit rates as measured by this run:

    python benchmarks/explain_holdout.py            # rates, and the dev misses by name
    python benchmarks/explain_holdout.py --json

A hit means the first (strongest) finding has the expected id; "anywhere" also counts the expected id further
down the list. Held-out misses are counted, not listed, so that nobody tunes on them by accident.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpunode.explain import explain  # noqa: E402
from gpunode.explain.tables import catalogue  # noqa: E402

CORPUS = ROOT / "tests" / "fixtures" / "explain"


def evaluate(part: str) -> dict[str, object]:
    with (CORPUS / "corpus.csv").open(newline="", encoding="utf-8") as handle:
        rows = [row for row in csv.DictReader(handle) if row["set"] == part]
    top = anywhere = 0
    misses: list[tuple[str, str, list[str]]] = []
    for row in rows:
        text = (CORPUS / part / row["file"]).read_text(encoding="utf-8")
        ids = [finding.id for finding in explain(text)]
        if ids[:1] == [row["expected"]]:
            top += 1
        else:
            misses.append((row["file"], row["expected"], ids))
        anywhere += row["expected"] in ids
    total = len(rows)
    return {"texts": total, "top": top, "anywhere": anywhere,
            "top_rate": top / total if total else 0.0, "anywhere_rate": anywhere / total if total else 0.0,
            "misses": misses}


# Blind batches: real texts collected after the rules of their time and measured once before any change was made
# for them (tests/fixtures/explain/MANIFEST.md). The first figure is the honest "never seen" accuracy; the figure
# this run prints for the same texts is no longer blind once rules were written after it.
BLIND_AT_COLLECTION = {"batch 4": (5, 16), "batch 5": (24, 40), "batch 6": (13, 31), "batch 7": (13, 30),
                       "batch 8": (18, 40), "batch 9": (19, 51)}
_BATCH = re.compile(r"\((batch \d+), blind")


def blind_batches() -> dict[str, dict[str, object]]:
    """Each blind batch of the unseen set: its figure when first measured, and what this run scores on it."""
    with (CORPUS / "corpus.csv").open(newline="", encoding="utf-8") as handle:
        rows = [row for row in csv.DictReader(handle) if row["set"] == "unseen"]
    batches: dict[str, list[dict[str, str]]] = {}
    for row in rows:
        found = _BATCH.search(row["what"])
        if found:
            batches.setdefault(found.group(1), []).append(row)
    out: dict[str, dict[str, object]] = {}
    for name, members in sorted(batches.items()):
        now = sum([f.id for f in explain((CORPUS / "unseen" / row["file"]).read_text(encoding="utf-8"))][:1]
                  == [row["expected"]] for row in members)
        first = BLIND_AT_COLLECTION.get(name)
        out[name] = {"texts": len(members), "now": now,
                     "blind": None if first is None else {"top": first[0], "texts": first[1]}}
    return out


def coverage() -> dict[str, object]:
    """How many catalogued messages (data/explain_catalogue.csv: what each component can print) give their finding
    first, rendered with sample values."""
    messages = catalogue()
    hit = sum([f.id for f in explain(m.render())][:1] == [m.id] for m in messages)
    emitters = len({m.emitter for m in messages})
    return {"messages": len(messages), "emitters": emitters, "recognised": hit,
            "rate": hit / len(messages) if messages else 0.0}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the rates as JSON")
    args = parser.parse_args()
    dev, holdout, unseen = evaluate("dev"), evaluate("holdout"), evaluate("unseen")
    covered = coverage()
    batches = blind_batches()
    if args.json:
        out: dict[str, object] = {name: {k: v for k, v in result.items() if k != "misses"} for name, result in
                                  (("dev", dev), ("holdout", holdout), ("unseen", unseen))}
        out["catalogue"] = covered
        out["blind_batches"] = batches
        print(json.dumps(out, indent=2))
        return 0
    print(f"catalogue {covered['recognised']}/{covered['messages']} = {covered['rate']:.1%} catalogued messages "
          f"recognised ({covered['emitters']} emitters)")
    for name, result in (("dev", dev), ("held-out", holdout), ("unseen", unseen)):
        print(f"{name:9} {result['top']}/{result['texts']} = {result['top_rate']:.1%} right cause first;"
              f" {result['anywhere']}/{result['texts']} = {result['anywhere_rate']:.1%} anywhere")
    for name, batch in batches.items():
        first = batch["blind"]
        blind = (f"{first['top']}/{first['texts']} = {first['top'] / first['texts']:.1%} measured blind"  # type: ignore[index,operator]
                 if first else "not recorded blind")
        print(f"blind {name}: {blind}; now {batch['now']}/{batch['texts']}")
    for file, expected, ids in dev["misses"]:  # type: ignore[union-attr]
        print(f"  dev miss: {file}: expected {expected}, got {ids or 'nothing'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
