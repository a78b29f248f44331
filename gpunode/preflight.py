"""Checks made before the first change: know before touching the node that the run can finish.

Every selected step is planned against the current facts (each reading the plans of the earlier steps it
declares, as in a plan). Then:

- queries: a step whose actions name a read-only question for the node (`Action.query`: the package manager's
  simulation of the exact transaction) is planned again with the answer (`plan_asking`), so the plan shows every
  package the transaction would change, and a transaction the manager would refuse blocks here.
- blockers: a step that is `blocked` although none of the steps it reads is about to change anything is
  blocked for good; no earlier step can lift it, so nothing runs. So is a step blocked by something no step
  touches (`StepPlan.lasting`: an unparseable daemon.json or containerd config, read with the facts before the
  first change), whatever the earlier steps are about to do.
- artifacts: every installer a plan would fetch on this machine (the driver's .run) is obtained and verified
  (`install`: download or cache, sha256, makeself checks) or, for `plan`, checked read-only: a local or cached
  file is verified fully; an uncached URL gets one HEAD request (a timeout on it) to show the download is
  possible, without fetching 400 MB. An offline control machine gets a fix naming --driver-run and
  GPUNODE_DRIVER_MIRROR.

- room (install only, once the installers are here): the node's disk under the work directory must hold each
  .run and what it unpacks to (`room`), or nothing is uploaded and nothing changes.

The result is a `Stop` (which step, why, the fix) or None.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpunode.artifacts import DownloadError, ProgressBars
from gpunode.artifacts.naming import MARKER_SUFFIX, PART_SUFFIX, beside, url_file_name
from gpunode.connection.base import Connection
from gpunode.facts import Facts
from gpunode.options import Options
from gpunode.plan import StepPlan
from gpunode.record import Frozen
from gpunode.steps.base import Step

if TYPE_CHECKING:
    from gpunode.actions.base import Action
    from gpunode.artifacts.source import Source

HEAD_TIMEOUT = (5.0, 10.0)  # (connect, read) seconds for plan's reachability check


@dataclass(frozen=True, eq=False, repr=False)
class Stop(Frozen):
    step: str
    result: str  # blocked | failed
    error: str
    fix: str | None


def plan_all(steps: Sequence[Step], facts: Facts, options: Options,
             conn: Connection | None = None) -> dict[str, StepPlan]:
    plans: dict[str, StepPlan] = {}
    for step in steps:
        plans[step.name], facts = plan_asking(conn, step, facts, options, plans)
    return plans


def plan_asking(conn: Connection | None, step: Step, facts: Facts, options: Options,
                plans: dict[str, StepPlan]) -> tuple[StepPlan, Facts]:
    """Plan a step; when its actions name queries (`Action.query`: a transaction's simulation, built from the
    plan's own values) the node has not answered yet, ask them (read-only) and plan it again with the answers."""
    plan = step.plan_with(facts, options, plans)
    queries = [q for a in plan.actions if (q := getattr(a, "query", None)) is not None
               and q.script not in facts.answers]
    if conn is None or not queries:
        return plan, facts
    from gpunode.facts import ask

    facts = ask(conn, facts, queries)
    return step.plan_with(facts, options, plans), facts


def blocker(steps: Sequence[Step], plans: dict[str, StepPlan]) -> Stop | None:
    """The first step blocked whatever the earlier steps do: none of the steps it reads will change."""
    for step in steps:
        plan = plans[step.name]
        if plan.status.value != "blocked":
            continue
        if not plan.lasting and any(name in plans and plans[name].status.value == "change" for name in step.reads):
            continue  # an earlier step's change may lift it: the run finds out when it gets there
        return Stop(step.name, "blocked", plan.reason, plan.fix)
    return None


def sources(plans: dict[str, StepPlan]) -> list[tuple[str, Source]]:
    """(step, installer source) for every installer a plan fetches on this machine."""
    found: list[tuple[str, Source]] = []
    for name, plan in plans.items():
        for action in plan.actions:
            source = _source(action, "download")
            if source is not None:
                found.append((name, source))
    return found


def _source(action: Action, kind: str) -> Source | None:
    """The installer a `kind` action carries, or None. The download code is imported with the first action that
    carries one: a converged run plans no action and never loads it."""
    source = getattr(action, "source", None)
    if action.kind != kind or source is None:
        return None
    from gpunode.artifacts.source import Source

    return source if isinstance(source, Source) else None


Probe = Callable[["Source"], None]


def artifacts(plans: dict[str, StepPlan], *, fetch: bool, progress: ProgressBars | None = None,
              probe: Probe | None = None) -> Stop | None:
    """Obtain and verify every installer (`fetch`, for install) or check it read-only (plan)."""
    for name, source in sources(plans):
        from gpunode.artifacts.source import obtain

        try:
            if fetch:
                obtain(source, progress=progress)
            else:
                check(source, probe or head)
        except DownloadError as exc:
            return Stop(name, "failed", exc.message, exc.fix)
    return None


def room(conn: Connection, plans: dict[str, StepPlan]) -> Stop | None:
    """Whether the node has room for every installer a plan uploads (driver-install actions): df of the work
    directory against the .run's size and its unpacked size (the makeself header's). Read-only on the node."""
    for name, plan in plans.items():
        for action in plan.actions:
            source = _source(action, "driver-install")
            if source is None:
                continue
            from gpunode.actions.driver import WORK_PARENT, space_problem

            path = Path(source.local or source.cache or "")
            if not path.is_file():
                continue
            problem = space_problem(conn, path, source.name)
            if problem is not None:
                return Stop(name, "failed", f"{problem[0]} (checked in {WORK_PARENT} before any change)", problem[1])
    return None


def check(source: Source, probe: Probe) -> None:
    """Read-only: verify a local or cached file fully; otherwise ask whether the download is possible."""
    from gpunode.artifacts.source import verify

    if source.local:
        verify(source.local, source)
        return
    assert source.cache
    dest = Path(source.cache)
    if dest.is_file() and beside(dest, MARKER_SUFFIX).is_file():
        verify(dest, source)  # sha256 (and --sha256), makeself checks; nothing is changed in the cache
        return
    probe(source)


def head(source: Source) -> None:
    """One HEAD request per URL until one answers 200: the download `install` will make is possible."""
    import requests

    from gpunode.artifacts.download import network_error

    missing: list[str] = []
    with requests.Session() as http:
        for url in source.urls:
            try:
                resp = http.head(url, allow_redirects=True, timeout=HEAD_TIMEOUT)
            except requests.RequestException as exc:
                raise network_error(exc, url, beside(Path(source.cache or "x"), PART_SUFFIX), 1) from None
            if resp.status_code == 200:
                return
            missing.append(f"{url}: " + ("not found (HTTP 404)" if resp.status_code == 404
                                         else f"HTTP {resp.status_code}"))
    raise DownloadError(f"could not find {url_file_name(source.urls[0]) if source.urls else source.name}: "
                        + "; ".join(missing),
                        fix="check the version on NVIDIA's driver pages, or pass --driver-run PATH|URL")

