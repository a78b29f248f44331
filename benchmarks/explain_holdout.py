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
    if args.json:
        out: dict[str, object] = {name: {k: v for k, v in result.items() if k != "misses"} for name, result in
                                  (("dev", dev), ("holdout", holdout), ("unseen", unseen))}
        out["catalogue"] = covered
        print(json.dumps(out, indent=2))
        return 0
    print(f"catalogue {covered['recognised']}/{covered['messages']} = {covered['rate']:.1%} catalogued messages "
          f"recognised ({covered['emitters']} emitters)")
    for name, result in (("dev", dev), ("held-out", holdout), ("unseen", unseen)):
        print(f"{name:9} {result['top']}/{result['texts']} = {result['top_rate']:.1%} right cause first;"
              f" {result['anywhere']}/{result['texts']} = {result['anywhere_rate']:.1%} anywhere")
    for file, expected, ids in dev["misses"]:  # type: ignore[union-attr]
        print(f"  dev miss: {file}: expected {expected}, got {ids or 'nothing'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
