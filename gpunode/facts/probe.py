"""The batched probe: every registered fact (gpunode/facts/registry.py), gathered by ONE shell command.

Each fact's snippet becomes one section. Its output is framed by marker lines that carry a random nonce, so no
file content can forge a section boundary. Parsing the framed output is a pure function.
"""

from __future__ import annotations

import re
import secrets
from typing import Any

# Importing the subsystems registers their facts (registry.FULL_ONLY's when a FULL probe asks for them).
from gpunode.facts import (  # noqa: F401
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
from gpunode.facts.kernel import EFI_SECURE_BOOT_VAR, MODPROBE_DIRS
from gpunode.facts.nodesettings import SYSTEMD_UNIT_DIRS, UDEV_RULES_DIRS
from gpunode.facts.registry import (
    ALL,
    COMMAND,
    CORE,
    FILES,
    FILES_STAT_MARKER,
    FULL,
    FUNCTIONS,
    HUNG,
    NOT_RUN,
    REGISTRY,
    RUN,
    SHARED,
    Fact,
    Section,
    facts_of,
    files_stat,
    load_full,
)
from gpunode.facts.system import TOOL_NAMES as TOOLS
from gpunode.shell import Script

__all__ = ["EFI_SECURE_BOOT_VAR", "FULL", "MODPROBE_DIRS", "NOT_RUN", "RUN",
           "SYSTEMD_UNIT_DIRS", "Section", "TOOLS", "UDEV_RULES_DIRS", "all_sections", "build_probe", "registered", "split_files",
           "split_sections"]

# Read-only views by name, for the fake node that answers the probe in tests: SECTIONS (core facts), FILE_GROUPS and
# COMMANDS, made on first use (they hold registry.FULL_ONLY's facts too)
_VIEWS: dict[str, tuple[str, Any]] = {"SECTIONS": (CORE, lambda f: f.snippet), "FILE_GROUPS": (FILES, lambda f: f.patterns),
                                      "COMMANDS": (COMMAND, lambda f: f.snippet)}


def __getattr__(name: str) -> Any:
    if name in _VIEWS:
        kind, value = _VIEWS[name]
        view = globals()[name] = {f.name: value(f) for f in facts_of(kind)}
        return view
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def registered(probe: str = FULL, part: str = ALL) -> list[Fact[object]]:
    """The facts `probe` gathers (every registered fact for FULL) in probe order: core facts, then file groups,
    then commands; `part` (registry.CHECK or LATE) keeps one of the RUN probe's two round trips."""
    if probe == FULL:
        load_full()
    order = {CORE: 0, FILES: 1, COMMAND: 2}
    return sorted((f for f in REGISTRY.values() if f.gathered_by(probe) and f.in_part(part)),
                  key=lambda f: order[f.kind])  # stable: registration order within a kind


def all_sections(probe: str = FULL, part: str = ALL) -> dict[str, str]:
    """Section name -> snippet, in probe order (core facts bare, then `files:NAME`, then `cmd:NAME`)."""
    return {f.section: f.snippet for f in registered(probe, part)}


# A section runs in a subshell of its own unless its snippet can run as a function of the probe's shell: then it
# costs no process of its own (each costs tens of ms on a slow node; a section that only walks a glob costs none).
# A function has its own positional parameters (`set --`) but shares the shell's state, so a snippet qualifies
# only without anything that would end or change the probe's shell (exit, cd, IFS, traps, options, exec, eval...);
# the variables it assigns are unset after it, so none reaches a later section. `IFS= read` is allowed: an
# assignment before a regular built-in lasts only for it.
# a built-in at a command's start (after a separator or a keyword) that would end or change the shell: `set --`
# alone is allowed (a function's positional parameters are its own)
_SHELL_STATE = re.compile(r"(?:^|[;&|(){}]|\b(?:then|do|else|elif|if|while|until)\b)\s*!?\s*"
                          r"(exit|cd|trap|exec|umask|eval|readonly|export|unset|shopt|source|local|return|\.|"
                          r"set(?!\s+--[\s;]))(?=[\s;]|$)|\bIFS\b(?!=\s+read\s)", re.MULTILINE)
_ASSIGNED = re.compile(r"(?<![\w${#%/-])([A-Za-z_]\w*)=|\bfor\s+([A-Za-z_]\w*)\b|\bread\s+(?:-r\s+)?([A-Za-z_][\w ]*)")


_ENVIRONMENT = frozenset({"PATH", "HOME", "LANG", "LC_ALL", "ENV", "SHELL", "TMPDIR", "PS4", "OPTIND", "PWD"})


def in_shell(snippet: str) -> bool:
    """Can this snippet run as a function of the probe's own shell (no subshell)?"""
    return not _SHELL_STATE.search(snippet) and _ENVIRONMENT.isdisjoint(assigned(snippet))


def assigned(snippet: str) -> list[str]:
    """The shell variables a snippet sets (assignments, `for` and `read` targets), but the probe's own."""
    names: set[str] = set()
    for match in _ASSIGNED.finditer(snippet):
        for group in match.groups():
            names.update(group.split() if group else ())
    return sorted(n for n in names if not n.startswith("gpunode_") and n not in ("s", "IFS"))


# the shell functions several snippets define: registry's and the unit states' (packages.SHOW_CALL)
_FUNCTIONS = (*FUNCTIONS, packages.SHOW_CALL)


def build_probe(nonce: str | None = None, probe: str = FULL, part: str = ALL, *, hung: bool = False) -> tuple[Script, str]:
    """The probe script (the facts `probe` gathers: RUN for plan and install, FULL for doctor; `part` keeps one
    of RUN's two round trips) and the nonce that frames its sections. `hung`: an earlier part found nvidia-smi
    hung, so this one does not wait for it again."""
    nonce = nonce or secrets.token_hex(8)
    facts = registered(probe, part)
    sections = {f.section: f.snippet for f in facts}
    # A tool two or more sections read is asked once, at the top level just before the first of them, so the
    # calls happen in the order they always did (the first nvidia-smi to hang is the one named): `nvidia-smi -q`
    # (registry.SMI_Q_ONCE) and `systemctl show` (packages.shared_units). Each section then reads that answer.
    # registry.SHARED holds the others (the running kernel's release, gpunode's journal). The file groups and the
    # core facts that declare `stats` (the initramfs) take their mtimes from one `stat` (registry.files_stat), and
    # the shell functions several snippets define (_FUNCTIONS) are defined once, before the first caller.
    shared = {marker: prelude for marker, prelude in SHARED.items()
              if sum(marker in s for s in sections.values()) > 1}
    units = packages.shared_units(sections.values())
    if units:
        shared["gpunode_units_set"] = units
    groups = [f for f in facts if f.kind == FILES]
    stats = tuple(path for f in facts if f.kind == CORE for path in f.stats)  # the core facts come first
    if len(groups) + sum(bool(f.stats) for f in facts) > 1:
        shared[FILES_STAT_MARKER] = files_stat(stats, tuple(p for f in groups for p in f.patterns))
    parts = ["gpunode_hung=1"] if hung else []
    defined: set[str] = set()

    def hoisted(text: str) -> str:
        """`text` without the shell functions the probe defines once (_FUNCTIONS), each defined before its first use."""
        for function in _FUNCTIONS:
            if function in text:
                if function not in defined:
                    defined.add(function)
                    parts.append(function)
                text = text.replace(function, "")
        return text

    for name, snippet in sections.items():
        for marker in [m for m in shared if m in snippet]:
            parts.append(hoisted(shared.pop(marker)))
        body = hoisted(snippet)
        # The bare `echo` ends a last line that has no newline (an os-release file without a final newline),
        # so the end marker always starts a line; split_sections drops the one empty line it adds otherwise.
        # a section that found nvidia-smi hung (HUNG) spares the later ones the wait (registry.SMI_CALL)
        if in_shell(snippet):
            leaked = assigned(snippet)
            run = (f'gpunode_section() {{ {body}\n}}; gpunode_section 2>/dev/null; s=$?; '
                   + (f'unset {" ".join(leaked)}; ' if leaked else '') + 'echo\n')
        else:
            run = f'( {body}\n) 2>/dev/null; s=$?; echo\n'
        parts.append(f'echo "@{nonce}@begin {name}"\n{run}'
                     f'[ "$s" != {HUNG} ] || gpunode_hung=1\necho "@{nonce}@end {name} $s"')
    return Script(body="\n".join(parts).replace("@FILE@", f"@{nonce}@file") + "\n", name="probe"), nonce


def split_sections(output: str, nonce: str) -> dict[str, Section]:
    """Pure: framed probe output -> {section name: Section}."""
    sections: dict[str, Section] = {}
    begin, end = f"@{nonce}@begin ", f"@{nonce}@end "
    current: str | None = None
    lines: list[str] = []
    for line in output.split("\n"):
        if line.startswith(begin):
            current, lines = line[len(begin):].strip(), []
        elif line.startswith(end) and current is not None:
            if lines and lines[-1] == "":
                lines.pop()  # the newline the wrapper's `echo` added
            name, _, status = line[len(end):].partition(" ")
            sections[name] = Section("\n".join(lines), int(status) if status.strip().isdigit() else 1)
            current = None
        elif current is not None:
            lines.append(line)
    return sections


def split_files(text: str, nonce: str) -> dict[str, tuple[int, str]]:
    """Pure: a section holding several files (`@nonce@file MTIME PATH` headers) -> {path: (mtime, content)}.

    The snippet prints each file followed by one newline, so the text up to the next header (or the end of
    the section) minus that newline is the file byte for byte, final newline or not."""
    files: dict[str, tuple[int, str]] = {}
    marker = f"@{nonce}@file "
    path: str | None = None
    mtime = 0
    lines: list[str] = []
    for line in text.split("\n"):
        if line.startswith(marker):
            if path is not None:
                files[path] = (mtime, "\n".join(lines))
            stamp, _, path = line[len(marker):].partition(" ")
            mtime = int(stamp) if stamp.isdigit() else 0
            lines = []
        elif path is not None:
            lines.append(line)
    if path is not None:
        files[path] = (mtime, "\n".join(lines))
    return files
