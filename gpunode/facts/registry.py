"""The fact registry: every fact is a registered unit (name, shell snippet, parser -> typed value).

A subsystem module (gpunode/facts/driver.py, fabric.py, ...) declares its facts as module-level objects next
to their parsers, e.g. `USERSPACE = command("driver_userspace", SNIPPET, parse_userspace)`. Callers read
`facts[driver.USERSPACE]`: a misspelt fact is an AttributeError when the module is imported (and a mypy
error), never a silent empty string. All registered facts are still gathered by ONE batched probe
(gpunode/facts/probe.py).

Three kinds:
- core: the few facts `Facts` keeps as typed fields (os, kernel, pci, ...), parsed at gather time;
- files: whole files found by glob, each with its mtime (`Facts.files`, `Facts.mtimes`);
- command: the output of a snippet, parsed on first read.
"""

from __future__ import annotations

import fnmatch
import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from gpunode.record import Frozen

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

CORE, FILES, COMMAND = "core", "files", "command"

# The probes: RUN is what plan, install, uninstall and status gather (a fact they never read costs the node
# nothing there); FULL is every registered fact (doctor, verify, `gpunode facts`). A fact gathered by FULL only
# says so where it is declared (`full_only=True`): a new fact is in both unless it asks otherwise.
RUN, FULL = "run", "full"

# The RUN probe goes in two parts (gpunode/facts/__init__.py, gather): CHECK, every fact a converged node's plan
# reads, in the first round trip; LATE, the facts declared `late=True` (what only a change reads: the processes
# and containers holding the GPU, the kernels installed, the package versions on offer, ...), in a second round
# trip made only when a decision reads one of them. Which facts are late decides only the cost, never a decision:
# reading a late fact before it is gathered gathers the LATE part first (or, where no node can be asked, raises
# NotGatheredError); it never reads as absent. ALL is both parts in one (FULL, doctor).
ALL, CHECK, LATE = "all", "check", "late"


# nvidia-smi hangs on a wedged GPU or a stuck driver. Every call of it in the probe goes through `gpunode_smi`,
# which gives it SMI_DEADLINE seconds; one that does not answer prints "... did not answer within Ns (hung)" and
# its section exits HUNG. The probe (build_probe) then skips every later nvidia-smi call, so a hung nvidia-smi
# costs one deadline, not one per call (and never the probe's own 120 s).
HUNG = 97
SMI_DEADLINE = 10
SMI_CALL = (
    'gpunode_smi() { [ -z "$gpunode_hung" ] || return ' + str(HUNG) + '; t=; '
    'command -v timeout >/dev/null 2>&1 && t="timeout -s KILL ' + str(SMI_DEADLINE) + '"; $t nvidia-smi "$@"; r=$?; '
    'if [ -n "$t" ] && { [ $r = 124 ] || [ $r = 137 ]; }; then '
    'echo "nvidia-smi $* did not answer within ' + str(SMI_DEADLINE) + 's (hung)"; return ' + str(HUNG) + '; fi; '
    'return $r; }; '
)


# `nvidia-smi -q` takes seconds on an 8-GPU node and several sections parse it (doctor's GPUs and GPU health, the
# fabric state): when two sections of one probe read it, the probe runs it once before the sections (SMI_Q_ONCE,
# added by build_probe) and each section reads that output instead of calling it again.
SMI_Q_ONCE = (
    'gpunode_smi_q_rc=; if [ -r /proc/driver/nvidia/version ] && command -v nvidia-smi >/dev/null 2>&1; then '
    + SMI_CALL + 'gpunode_smi_q=$(gpunode_smi -q 2>/dev/null); gpunode_smi_q_rc=$?; '
    f'[ $gpunode_smi_q_rc != {HUNG} ] || gpunode_hung=1; fi'
)
# A value two or more sections of one probe read, asked once: marker (a shell variable the readers name) -> the
# top-level shell that sets it, which build_probe runs just before the first section naming the marker when two
# or more sections of the probe name it. Each reader falls back to asking for itself when the marker is unset
# (a probe of one reader, a snippet run alone), so sharing decides only the cost, never the output.
SHARED: dict[str, str] = {}


def shared(marker: str, prelude: str) -> str:
    """Register a value asked once per probe (SHARED); returns the marker."""
    SHARED[marker] = prelude
    return marker


shared("gpunode_smi_q_rc", SMI_Q_ONCE)
# `VAR=$(command)` with the command's error text dropped: the redirection stands around the assignment, not inside
# the substitution (`$(command 2>/dev/null)`), where bash forks once more before it runs the command (a process more
# where the probe's shell is bash, root's login shell on Debian; dash forks once either way). The status is the
# command's.
def hushed(assignment: str) -> str:
    return "{ " + assignment + "; } 2>/dev/null"


# the running kernel's release (`uname -r`): read by five sections of the RUN probe; the same `uname` prints the
# machine (`uname -m`) for ARCH (gpunode/facts/system.py), which reads it where the release was asked
KERNEL_MARKER = shared("gpunode_kernel", hushed('gpunode_kernel=$(uname -rm)') + '; case $gpunode_kernel in '
                       '*" "*) gpunode_arch=${gpunode_kernel##* }; gpunode_kernel=${gpunode_kernel% *} ;; '
                       '*) gpunode_kernel= ;; esac')
RELEASE = 'k=${' + KERNEL_MARKER + ':-$(uname -r)}; '

# `cat FILE` without a process: the shell's own `read`, byte for byte but for NUL bytes (a last line without a
# newline is printed without one); status 1 when FILE is not readable. Each process costs a slow node tens of ms
# (a VM without KVM) while the few hundred bytes of a small file cost the shell a few hundred read()s, so the probe
# reads small files this way (files() below: up to CAT_MAX bytes) and leaves larger ones to cat.
CAT = ('gpunode_cat() { l=; [ -r "$1" ] && { while IFS= read -r l; do printf "%s\\n" "$l"; done < "$1"; '
       'printf %s "$l"; }; }; ')
CAT_MAX = 4096

_SMI_Q_READ = ('if [ -n "$gpunode_smi_q_rc" ]; then out=$gpunode_smi_q; r=$gpunode_smi_q_rc; '
               'else out=$(gpunode_smi -q 2>/dev/null); r=$?; fi; ')


def smi_output(args: str) -> str:
    """Shell that prints what `nvidia-smi ARGS` prints (stderr dropped), or exits HUNG when it hangs."""
    if args == "-q":
        return (SMI_CALL + _SMI_Q_READ + f'[ $r != {HUNG} ] || {{ echo "$out"; exit {HUNG}; }}; '
                'printf "%s\\n" "$out"')
    return (SMI_CALL + f'out=$(gpunode_smi {args} 2>/dev/null); [ $? != {HUNG} ] || {{ echo "$out"; exit {HUNG}; }}; '
            'printf "%s\\n" "$out"')


@dataclass(frozen=True, eq=False, repr=False)
class Section(Frozen):
    """One framed section of the probe's output."""

    text: str
    status: int  # exit status of the snippet; 127 when the section is missing from the output

    @property
    def ok(self) -> bool:
        return self.status == 0


NOT_RUN = Section("", 127)


class DuplicateFactError(ValueError):
    """Two facts registered under one name (raised while the second module is imported)."""


class UnknownFactError(LookupError):
    """A fact object that is not (or no longer) the registered one of its name."""


class NotGatheredError(LookupError):
    """A fact read from facts whose probe did not gather it (a programming error: declare it in both probes)."""


@dataclass(frozen=True, eq=False)
class Fact(Generic[T_co]):
    """A registered fact. Identity matters: only the object the registry holds can be read."""

    name: str
    snippet: str
    parse_section: Callable[[Section], T_co]
    kind: str = COMMAND
    module: str = ""  # the subsystem that declared it
    patterns: tuple[str, ...] = ()  # kind FILES: the globs read
    full_only: bool = False  # gathered by the FULL probe only (doctor, verify, facts), never by plan or install
    late: bool = False  # in the RUN probe's second round trip, made only when a decision reads a late fact
    stats: tuple[str, ...] = ()  # kind CORE: paths (shell words; the kernel release in $k) taken from the shared stat

    def gathered_by(self, probe: str) -> bool:
        return probe == FULL or not self.full_only

    def in_part(self, part: str) -> bool:
        """Is the fact in this part (ALL, CHECK, LATE) of a probe?"""
        return part == ALL or (part == LATE) == self.late

    @property
    def section(self) -> str:
        """The section name in the probe's output (core facts bare, `files:NAME`, `cmd:NAME`)."""
        return {CORE: self.name, FILES: f"files:{self.name}"}.get(self.kind, f"cmd:{self.name}")

    def parse(self, section: Section) -> T_co:
        return self.parse_section(section)

    def matches(self, path: str) -> bool:
        """A file fact's globs, with the shell's meaning (a `*` never crosses a `/`)."""
        return any(path.count("/") == p.count("/") and fnmatch.fnmatchcase(path, p) for p in self.patterns)

    def __repr__(self) -> str:
        return f"<fact {self.module}.{self.name}>"


REGISTRY: dict[str, Fact[object]] = {}

# Subsystems whose every fact the FULL probe alone gathers (doctor, verify, `gpunode facts`): name -> the module that
# declares them. They are imported (so registered) by load_full() when a FULL probe is built or the whole registry
# is read, never by plan or install, whose RUN probe has none of their facts (~3% of a converged install's CPU).
FULL_ONLY = {"health": "gpunode.facts.health", "virt": "gpunode.facts.virt"}


def load_full() -> None:
    """Register the facts of FULL_ONLY's modules (a no-op once they are imported)."""
    for module in FULL_ONLY.values():
        if module not in sys.modules:
            importlib.import_module(module)


def register(fact: Fact[T]) -> Fact[T]:
    if fact.module in FULL_ONLY and not fact.full_only:
        raise ValueError(f"fact {fact.name!r}: {fact.module} is registered only for the FULL probe "
                         "(registry.FULL_ONLY); declare it full_only=True or in another module")
    if fact.name in REGISTRY:
        raise DuplicateFactError(f"fact {fact.name!r} of {fact.module or 'unknown module'} is already registered by "
                                 f"{REGISTRY[fact.name].module}: give it another name")
    REGISTRY[fact.name] = fact
    return fact


def check(fact: Fact[T]) -> Fact[T]:
    """The fact itself if the registry holds it, else UnknownFactError."""
    if REGISTRY.get(getattr(fact, "name", None) or "") is not fact:
        raise UnknownFactError(f"{fact!r} is not a registered fact (declare it with gpunode.facts.registry)")
    return fact


def _text_or_empty(parse: Callable[[str], T]) -> Callable[[Section], T]:
    return lambda section: parse(section.text if section.ok else "")


def command(name: str, snippet: str, parse: Callable[[str], T], *, module: str = "",
            full_only: bool = False, late: bool = False) -> Fact[T]:
    """A command fact; `parse` gets the output, or "" when the snippet failed (ask `Facts.get` or
    `Facts.section` where failure and empty output differ). `late`: see LATE (only command facts can be late:
    core facts and file groups are read as fields, `Facts.files`, outside the checked access)."""
    return register(Fact(name, snippet, _text_or_empty(parse), COMMAND, module, full_only=full_only, late=late))


def command_section(name: str, snippet: str, parse: Callable[[Section], T], *, module: str = "",
                    full_only: bool = False, late: bool = False) -> Fact[T]:
    """A command fact whose parser needs the exit status too."""
    return register(Fact(name, snippet, parse, COMMAND, module, full_only=full_only, late=late))


def core(name: str, snippet: str, parse: Callable[[str], T], *, module: str = "", stats: tuple[str, ...] = ()) -> Fact[T]:
    """A core fact; `stats`: the paths its snippet takes from the shared stat (files_stat, STAT_TAKE) where one
    is made, each as a shell word that may name the kernel release as $k."""
    return register(Fact(name, snippet, _text_or_empty(parse), CORE, module, stats=stats))


# One `stat` for every file group of a probe and the paths core facts declare (`stats`: the initramfs images): what
# they find, in probe order (the core facts' paths that exist, then the files the groups' globs find), with their
# mtime, size and name (files_stat, which build_probe runs where two or more sections read it). Each section takes
# its own files' records off the front of that answer, name by name (STAT_TAKE); a record that is not the file the
# section found (a file made or removed in between) empties the answer, and that section and every later one ask
# `stat` themselves.
FILES_STAT_MARKER = "gpunode_stat"


def files_stat(stats: tuple[str, ...], patterns: tuple[str, ...]) -> str:
    """The top-level shell that stats the paths of `stats` (core facts', $k the kernel release asked once) and the
    files of every group (patterns: all their globs), in probe order."""
    return ('gpunode_stat_all() { set --; k=${' + KERNEL_MARKER + ':-}; for f in ' + " ".join(stats) + '; do '
            '[ -e "$f" ] && set -- "$@" "$f"; done; for f in ' + " ".join(patterns) + '; do [ -f "$f" ] && '
            'set -- "$@" "$f"; done; gpunode_nl="\n"; gpunode_stat=; [ $# = 0 ] || '
            + hushed('gpunode_stat=$(stat -c "%Y %s %n" -- "$@")') + ' || gpunode_stat=; }; gpunode_stat_all; unset f k')


# `gpunode_take FILE...`: m = the files' `MTIME SIZE` lines from the shared stat, taken off its front; m empty where
# there is none or its records are not these files (then none is taken from it again).
STAT_TAKE = ('gpunode_take() { m=; if [ -n "${' + FILES_STAT_MARKER + ':-}" ]; then for f; do '
             't=${gpunode_stat%%[!0-9]*}; r=${gpunode_stat#"$t "}; z=${r%%[!0-9]*}; r=${r#"$z "}; '
             'case $r in "$f"|"$f$gpunode_nl"*) ;; *) r= ;; esac; '
             'if [ -n "$t" ] && [ -n "$z" ] && [ -n "$r" ]; then m="$m$t $z$gpunode_nl"; gpunode_stat=${r#"$f"}; '
             'gpunode_stat=${gpunode_stat#?}; else gpunode_stat=; m=; break; fi; done; fi; }; ')


# A file group's work, a function of the shell defined once per probe (build_probe hoists FUNCTIONS): the files its
# globs (the arguments) find, each as `@FILE@ MTIME PATH` and its text. One `stat` for the group's mtimes (one line
# each, in argument order), not one per file: on a real node every process counts (benchmarks/probe.py). Should stat
# fail (a file gone in between), each file is asked alone. No `exit`: the probe runs a snippet like this one in its
# own shell, not in a subshell (probe.in_shell). A file of up to CAT_MAX bytes is read by the shell itself (CAT), a
# larger one by cat.
FILES_CALL = ('gpunode_files() { n=$#; for f; do [ -f "$f" ] && set -- "$@" "$f"; done; shift $n; '
              'if [ $# -gt 0 ]; then gpunode_take "$@"; '
              '[ -n "$m" ] || ' + hushed('m=$(stat -c "%Y %s" -- "$@")') + ' || '
              'm=$(for f; do stat -c "%Y %s" -- "$f" 2>/dev/null || echo "0 99999999"; done); '
              'for f; do t=${m%%[!0-9]*}; m=${m#"$t"}; m=${m#?}; z=${m%%[!0-9]*}; m=${m#"$z"}; m=${m#?}; '
              'echo "@FILE@ ${t:-0} $f"; if [ "${z:-' + str(CAT_MAX + 1) + '}" -le ' + str(CAT_MAX) + ' ]; '
              'then gpunode_cat "$f"; else cat "$f"; fi; echo; done; fi; }; ')
# Shell functions several sections define: the probe defines each once, at the top level before the first section
# that names it, and drops it from the sections' text (a long script costs a slow node's shell its parse time).
# Each snippet still defines what it calls, so it runs alone too.
FUNCTIONS = (CAT, SMI_CALL, STAT_TAKE, FILES_CALL)


def files(name: str, patterns: tuple[str, ...], *, module: str = "", full_only: bool = False) -> Fact[dict[str, str]]:
    """Whole files by glob; reading the fact gives {path: text} of the files found."""
    return register(Fact(name, files_snippet(patterns), lambda section: {}, FILES, module, patterns, full_only))


def files_snippet(patterns: tuple[str, ...]) -> str:
    """A file group's snippet: the files `patterns` find (FILES_CALL)."""
    return CAT + STAT_TAKE + FILES_CALL + 'gpunode_files ' + " ".join(patterns) + '; true'


def text(value: str) -> str:
    """The parser of facts whose raw text is the value."""
    return value


def words(value: str) -> tuple[str, ...]:
    return tuple(value.split())


def facts_of(kind: str) -> list[Fact[object]]:
    load_full()
    return [f for f in REGISTRY.values() if f.kind == kind]
