"""What gpunode knows about a node: registered facts (gpunode/facts/registry.py) gathered by one batched probe.

`Facts` is immutable. After any change the runner gathers a fresh one; nothing simulates the effect of a
step on stale facts. Read a fact by its object: `facts[driver.USERSPACE]` is the parser's typed value (parsed
once, on first read), `facts.get(driver.USERSPACE)` is None when its snippet failed, `facts.section(...)` is the
raw output with its exit status. The core facts are also typed fields (`facts.kernel`, `facts.pci`, ...).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gpunode.connection.base import Connection, Result
from gpunode.errors import CommandError, CommandTimeout
from gpunode.facts import (
    bake,
    containers,
    driver,
    fabric,
    holders,
    k8s,
    kernel,
    nodesettings,
    packages,
    system,
)
from gpunode.facts.kernel import LoadedDriver, ModuleBlock, PciDevice, SecureBoot, module_block
from gpunode.facts.osinfo import UNKNOWN_OS, OsInfo
from gpunode.facts.probe import all_sections, build_probe, registered, split_files, split_sections
from gpunode.facts.registry import (
    ALL,
    CHECK,
    CORE,
    FILES,
    FULL,
    HUNG,
    LATE,
    NOT_RUN,
    RUN,
    Fact,
    NotGatheredError,
    Section,
    check,
)
from gpunode.facts.transaction import A, Query
from gpunode.record import Frozen
from gpunode.shell import Script

__all__ = ["FULL", "RUN", "Facts", "ProbeRequest", "first_probe", "gather", "facts_from_probe_output", "bake", "containers", "driver", "fabric", "holders",
           "k8s", "kernel",
           "nodesettings", "packages", "system"]  # health and virt: registry.FULL_ONLY

T = TypeVar("T")

PROBE_TIMEOUT = 120.0  # seconds for the whole probe; a probe cut short is an error (gather), never "absent"

SUBSYSTEMS = ("system", "kernel", "driver", "packages", "containers", "fabric", "nodesettings", "health", "k8s",
              "bake", "holders", "virt")

# core fact -> the Facts field that holds its parsed value
_FIELDS: dict[Fact[object], str] = {
    system.OS_RELEASE: "os", system.KERNEL: "kernel", system.ARCH: "arch", system.UID: "uid",
    system.BOOT_ID: "boot_id", system.TOOLS: "tools", kernel.CMDLINE: "cmdline", kernel.MODULES: "modules",
    kernel.PCI: "pci", kernel.LOADED_DRIVER: "loaded_driver", kernel.SECURE_BOOT: "secure_boot",
    kernel.INITRAMFS: "initramfs_mtime",
}


class Later:
    """The late facts (registry.LATE) of facts gathered in two round trips, not gathered yet, and how to gather
    them: `fetch` runs the LATE part on the node and returns its sections (None where no node can be asked:
    reading a late fact is then NotGatheredError). Completed at most once, on the first read of a late fact."""

    def __init__(self, names: set[str], fetch: Callable[[], Mapping[str, Section]] | None) -> None:
        self.names, self.fetch, self.lock = names, fetch, threading.Lock()
        self.fetches = 0  # round trips made (0 or 1): what a converged run is meant to leave at 0

    def complete(self, fact: Fact[object], outputs: dict[str, Section]) -> None:
        with self.lock:
            if fact.name not in self.names:
                return
            if self.fetch is None:
                raise NotGatheredError(f"{fact!r} is late (gathered in the probe's second round trip) and these "
                                       "facts have no node to ask for it")
            sections = self.fetch()
            self.fetches += 1
            for late in registered(RUN, LATE):
                if late.name in self.names and late.section in sections:
                    outputs[late.name] = sections[late.section]
            self.names = set()


@dataclass(frozen=True, eq=False, repr=False)
class Facts(Frozen):
    os: OsInfo = UNKNOWN_OS
    kernel: str = ""
    arch: str = ""
    uid: int | None = None
    boot_id: str = ""
    cmdline: str = ""
    modules: frozenset[str] = frozenset()
    pci: tuple[PciDevice, ...] = ()
    loaded_driver: LoadedDriver | None = None
    tools: Mapping[str, str] = field(default_factory=dict)
    secure_boot: SecureBoot = SecureBoot(False, False, "")
    files: Mapping[str, str] = field(default_factory=dict)  # every file of every file fact: path -> text
    mtimes: Mapping[str, int] = field(default_factory=dict)  # path -> mtime (seconds since the epoch)
    outputs: Mapping[str, Section] = field(default_factory=dict)  # command facts: registered name -> raw output
    initramfs_mtime: int | None = None  # newest initramfs image for the running kernel; None: not found
    probe: str = FULL  # which probe gathered these facts: reading a fact it does not gather is an error
    later: Later | None = field(default=None, repr=False, compare=False)  # RUN's late facts, until first read
    answers: Mapping[str, Section] = field(default_factory=dict)  # queries a plan asked (ask): script -> output
    _parsed: dict[str, object] = field(default_factory=dict, init=False, repr=False, compare=False)

    # ---- typed access --------------------------------------------------------------------------------------

    def __getitem__(self, fact: Fact[T]) -> T:
        """The fact's typed value. An object the registry does not hold is an UnknownFactError."""
        self._check(fact)
        if fact in _FIELDS:
            return getattr(self, _FIELDS[fact])
        if fact.kind == FILES:
            return {p: t for p, t in self.files.items() if fact.matches(p)}  # type: ignore[return-value]
        if fact.name not in self._parsed:
            self._parsed[fact.name] = fact.parse(self.section(fact))
        return self._parsed[fact.name]  # type: ignore[return-value]

    def get(self, fact: Fact[T]) -> T | None:
        """Like facts[fact], but None when the fact's snippet failed or did not run (a missing tool or file)."""
        return self[fact] if self.ran(fact) else None

    def answer(self, query: Query[A]) -> A | None:
        """A plan's query (gpunode/facts/transaction.py) parsed, or None when it was not asked of the node."""
        found = self.answers.get(query.script)
        return query.parse(found) if found is not None else None

    def section(self, fact: Fact[object]) -> Section:
        """The raw output of a command fact and its exit status (status 127: not in the probe's output)."""
        self._check(fact)
        return self.outputs.get(fact.name, NOT_RUN)

    def ran(self, fact: Fact[object]) -> bool:
        """Did the fact's snippet succeed? (An empty output is a success.) Core and file facts always count."""
        self._check(fact)
        return fact.kind in (CORE, FILES) or self.section(fact).ok

    def _check(self, fact: Fact[object]) -> None:
        check(fact)
        if not fact.gathered_by(self.probe):
            raise NotGatheredError(f"{fact!r} is read from the {self.probe} probe, which does not gather it "
                                   "(its declaration says full_only=True: drop that, or gather the FULL probe)")
        if self.later is not None and fact.late:
            self.later.complete(fact, self.outputs)  # type: ignore[arg-type]  # built as a dict, filled once

    # ---- derived -------------------------------------------------------------------------------------------

    @property
    def gpus(self) -> tuple[PciDevice, ...]:
        return tuple(d for d in self.pci if d.vendor == 0x10DE and d.is_gpu)

    @property
    def nvswitches(self) -> tuple[PciDevice, ...]:
        return tuple(d for d in self.pci if d.vendor == 0x10DE and d.is_nvswitch)

    def has(self, tool: str) -> bool:
        return tool in self.tools

    def module_loaded(self, name: str) -> bool:
        return name.replace("-", "_") in self.modules

    @property
    def modprobe_files(self) -> dict[str, str]:
        return self[kernel.MODPROBE_D]

    def nouveau_block(self) -> ModuleBlock:
        return module_block("nouveau", self.modprobe_files, self.cmdline)

    def summary(self) -> dict[str, object]:
        """The node in a few fields, for reports and --json."""
        return {
            "os": {"id": self.os.id, "version": self.os.version, "name": self.os.name, "family": self.os.family},
            "kernel": self.kernel,
            "arch": self.arch,
            "gpus": [{"pci": d.address, "device_id": f"10de:{d.device_id}"} for d in self.gpus],
            "nvswitches": len(self.nvswitches),
            "driver_loaded": self.loaded_driver.version if self.loaded_driver else None,
            "secure_boot": self.secure_boot.enabled,
            "boot_id": self.boot_id,
        }

    def to_json(self) -> dict[str, object]:
        """Every registered fact's parsed value by subsystem, with each command's exit status, the files read
        and the nouveau verdict: what a bug report needs."""
        out: dict[str, dict[str, object]] = {name: {} for name in SUBSYSTEMS}
        for fact in registered(self.probe):
            value: object = self[fact]
            if fact.kind not in (CORE, FILES):
                section = self.section(fact)
                value = {"status": section.status, "value": value}
            out.setdefault(fact.module, {})[fact.name] = _plain(value)
        return {"facts": out, "mtimes": dict(self.mtimes), "nouveau_block": _plain(self.nouveau_block())}


def _plain(value: object) -> object:
    """A parsed value as JSON: dataclasses as objects, sets sorted, tuples as lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)
                if not f.name.startswith("_")}
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, frozenset, set)):
        items = [_plain(v) for v in value]
        return sorted(items, key=str) if isinstance(value, (frozenset, set)) else items
    return value


def facts_from_sections(sections: Mapping[str, Section], nonce: str, probe: str = FULL, part: str = ALL,
                        later: Later | None = None) -> Facts:
    """Facts from a probe's sections; `part` CHECK leaves the late facts to `later` (which raises
    NotGatheredError when it cannot fetch them, as it does when None)."""
    core: dict[str, object] = {}
    files: dict[str, tuple[int, str]] = {}
    outputs: dict[str, Section] = {}
    if part == CHECK and later is None:
        later = Later({f.name for f in registered(probe, LATE)}, None)
    for fact in registered(probe, part):
        section = sections.get(fact.section)
        if fact in _FIELDS:
            core[_FIELDS[fact]] = fact.parse(section or NOT_RUN)
        elif fact.kind == FILES:
            files.update(split_files(section.text if section is not None else "", nonce))
        elif section is not None:
            outputs[fact.name] = section
    return Facts(**core,  # type: ignore[arg-type]
                 files={path: content for path, (_, content) in files.items()},
                 mtimes={path: mtime for path, (mtime, _) in files.items()},
                 outputs=outputs, probe=probe, later=later if part == CHECK else None)


def facts_from_probe_output(output: str, nonce: str, probe: str = FULL) -> Facts:
    return facts_from_sections(split_sections(output, nonce), nonce, probe)


@dataclass(frozen=True, eq=False, repr=False)
class ProbeRequest(Frozen):
    """One round trip of the probe: its script (no arguments of its own), its nonce, the probe and the part.
    `first_probe` makes gather's first, for a caller that runs the script inside a command of its own (the node
    lock's: gpunode/nodelock.py, so an install's first look costs no round trip of its own) as root;
    `gather(conn, first=(that, the Result))` parses it."""

    script: Script
    nonce: str
    probe: str
    part: str


def first_probe(probe: str = RUN, *, at_once: bool = False) -> ProbeRequest:
    part = CHECK if probe == RUN and not at_once else ALL
    script, nonce = build_probe(probe=probe, part=part)
    return ProbeRequest(script, nonce, probe, part)


def gather(conn: Connection, probe: str = RUN, *, at_once: bool = False,
           first: tuple[ProbeRequest, Result] | None = None) -> Facts:
    """Run the probe on the node and parse it. The probe only reads; it runs as root when root is available
    (root-only configs such as a 0600 containerd config.toml must not look empty), else as the login user.
    RUN (plan, install, uninstall, status) leaves out what only doctor and verify read (FULL): the package
    manager's upgrade simulation, nvidia-smi -q, the kernel log, ... and goes in two round trips: the CHECK part
    now, the LATE part (registry.LATE) only when a decision reads one of its facts (`at_once`: both in one, as
    the probe was gathered before it had two parts; the benchmarks and the tests compare the two).
    `first`: the first round trip already ran, as root, in another command (`first_probe`): its output is parsed."""
    if first is None:
        request = first_probe(probe, at_once=at_once)
        sections, sudo = _probe(conn, request, sudo=True)
    else:
        request, result = first
        sections, sudo = _parsed(conn, request, result), True
    probe, part, nonce = request.probe, request.part, request.nonce
    if part == ALL:
        return facts_from_sections(sections, nonce, probe)
    hung = any(s.status == HUNG for s in sections.values())

    def fetch() -> Mapping[str, Section]:  # as the first round trip ran: as root, else as the login user
        return _probe(conn, ProbeRequest(*build_probe(probe=probe, part=LATE, hung=hung), probe, LATE), sudo=sudo)[0]

    return facts_from_sections(sections, nonce, probe, CHECK, Later({f.name for f in registered(probe, LATE)}, fetch))


def _probe(conn: Connection, request: ProbeRequest, *, sudo: bool) -> tuple[dict[str, Section], bool]:
    """One round trip: the sections of the request's part of its probe, and whether it ran as root (`sudo` and
    root available; else as the login user)."""
    result = None
    if sudo:
        try:
            result = conn.run(request.script, sudo=True, timeout=PROBE_TIMEOUT)
        except CommandError:
            sudo = False
    if result is None:
        result = conn.run(request.script, timeout=PROBE_TIMEOUT)
    return _parsed(conn, request, result), sudo


def _parsed(conn: Connection, request: ProbeRequest, result: Result) -> dict[str, Section]:
    """The sections of one round trip's output; an error when it printed nothing usable or stopped short."""
    probe, part, nonce = request.probe, request.part, request.nonce
    sections = split_sections(result.stdout, nonce)
    first = system.OS_RELEASE.section if part != LATE else next(iter(all_sections(probe, part)), None)
    if first is not None and first not in sections and not result.timed_out:
        raise CommandError(f"{conn.name}: the fact probe printed nothing usable (exit {result.exit_code})",
                           fix="check that the node has a POSIX /bin/sh and core utilities",
                           stdout=result.stdout, stderr=result.stderr)
    _check_complete(conn.name, result, sections, nonce, probe, part)
    return sections


def ask(conn: Connection, facts: Facts, queries: Sequence[Query[Any]]) -> Facts:
    """Facts with the answers of the queries not asked yet (read-only commands a plan built from its own values:
    a transaction's simulation), run as root when root is available, like the probe."""
    todo = [q for q in dict.fromkeys(queries) if q.script not in facts.answers]
    if not todo:
        return facts
    answers = dict(facts.answers)
    for query in todo:
        script = Script(body=query.script, name=query.label)
        try:
            result = conn.run(script, sudo=True, timeout=query.timeout)
        except CommandError:
            result = conn.run(script, timeout=query.timeout)
        answers[query.script] = Section(result.stdout + result.stderr, -1 if result.timed_out else result.exit_code)
    return dataclasses.replace(facts, answers=answers)


def _check_complete(node: str, result: Result, sections: Mapping[str, Section], nonce: str, probe: str,
                    part: str = ALL) -> None:
    """A probe cut short (past its time limit, or its shell killed) must never read as an empty node: every
    missing section would otherwise parse as "not there" (no driver, no packages). Raise naming the section it
    stopped in."""
    expected = list(all_sections(probe, part))
    missing = [name for name in expected if name not in sections]
    if not missing:
        return
    begun = [line.split(" ", 1)[1].strip() for line in result.stdout.split("\n")
             if line.startswith(f"@{nonce}@begin ") and " " in line]
    stopped_in = next((name for name in reversed(begun) if name not in sections), missing[0])
    how = (f"ran past its {PROBE_TIMEOUT:.0f} s limit" if result.timed_out
           else f"stopped (exit {result.exit_code})")
    error = CommandTimeout if result.timed_out else CommandError
    raise error(
        f"{node}: the fact probe {how} in section {stopped_in!r}; {len(missing)} of {len(expected)} sections "
        "never finished, so what they read is unknown (not absent)",
        fix=(f"the node answered too slowly, or a command of section {stopped_in!r} hangs there: check the "
             "node's load (uptime) and what runs long (ps -eo pid,etime,args --sort=-etime), then run this "
             "command again"),
        stdout=result.stdout, stderr=result.stderr)
