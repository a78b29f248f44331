"""The `gpunode doctor --json` document of one node (also the library's `api.doctor`), with its readiness
verdict: made from checks already run when the caller has them, so they run once."""

from __future__ import annotations

from collections.abc import Sequence

from gpunode import SCHEMA_VERSION
from gpunode.doctor import CheckResult, report, run_checks
from gpunode.doctor import verdict as readiness
from gpunode.facts import Facts


def doctor_document(host: str, facts: Facts, results: Sequence[CheckResult] | None = None) -> dict[str, object]:
    """The document of one node; `results`: the checks of these facts, when already run."""
    results = list(results) if results is not None else run_checks(facts)
    verdict = readiness.readiness(host, facts, results)
    document = report(host, facts, results, SCHEMA_VERSION)
    document["readiness"] = {"ready": verdict.ready, "reboot_required": verdict.reboot_required,
                             "reason": verdict.reason, "reboot_because": list(verdict.reboot_because)}
    return document
