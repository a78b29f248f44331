"""The batched probe: every registered fact (gpunode/facts/registry.py), gathered by ONE shell command.

Each fact's snippet becomes one section. Its output is framed by marker lines that carry a random nonce, so no
file content can forge a section boundary. Parsing the framed output is a pure function.
"""

from __future__ import annotations

import secrets

# Importing the subsystems registers their facts.
from gpunode.facts import (  # noqa: F401
    containers,
    driver,
    fabric,
    health,
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
    COMMAND,
    CORE,
    FILES,
    FULL,
    HUNG,
    NOT_RUN,
    REGISTRY,
    RUN,
    SMI_Q_ONCE,
    Fact,
    Section,
    facts_of,
)
from gpunode.facts.system import TOOL_NAMES as TOOLS
from gpunode.shell import Script

__all__ = ["COMMANDS", "EFI_SECURE_BOOT_VAR", "FILE_GROUPS", "FULL", "MODPROBE_DIRS", "NOT_RUN", "RUN", "SECTIONS",
           "SYSTEMD_UNIT_DIRS", "Section", "TOOLS", "UDEV_RULES_DIRS", "all_sections", "build_probe", "registered", "split_files",
           "split_sections"]

# Read-only views by name, for the fake node that answers the probe in tests.
SECTIONS: dict[str, str] = {f.name: f.snippet for f in facts_of(CORE)}
FILE_GROUPS: dict[str, tuple[str, ...]] = {f.name: f.patterns for f in facts_of(FILES)}
COMMANDS: dict[str, str] = {f.name: f.snippet for f in facts_of(COMMAND)}


def registered(probe: str = FULL) -> list[Fact[object]]:
    """The facts `probe` gathers (every registered fact for FULL) in probe order: core facts, then file groups,
    then commands."""
    order = {CORE: 0, FILES: 1, COMMAND: 2}
    return sorted((f for f in REGISTRY.values() if f.gathered_by(probe)),
                  key=lambda f: order[f.kind])  # stable: registration order within a kind


def all_sections(probe: str = FULL) -> dict[str, str]:
    """Section name -> snippet, in probe order (core facts bare, then `files:NAME`, then `cmd:NAME`)."""
    return {f.section: f.snippet for f in registered(probe)}


def build_probe(nonce: str | None = None, probe: str = FULL) -> tuple[Script, str]:
    """The probe script (the facts `probe` gathers: RUN for plan and install, FULL for doctor) and the nonce
    that frames its sections."""
    nonce = nonce or secrets.token_hex(8)
    sections = all_sections(probe)
    # A tool two or more sections read is asked once, at the top level just before the first of them, so the
    # calls happen in the order they always did (the first nvidia-smi to hang is the one named): `nvidia-smi -q`
    # (registry.SMI_Q_ONCE) and `systemctl show` (packages.shared_units). Each section then reads that answer.
    shared: dict[str, str] = {}
    if sum("gpunode_smi_q_rc" in s for s in sections.values()) > 1:
        shared["gpunode_smi_q_rc"] = SMI_Q_ONCE
    units = packages.shared_units(sections.values())
    if units:
        shared["gpunode_units_set"] = units
    parts = []
    for name, snippet in sections.items():
        for marker in [m for m in shared if m in snippet]:
            parts.append(shared.pop(marker))
        body = snippet.replace("@FILE@", f"@{nonce}@file")
        # The bare `echo` ends a last line that has no newline (an os-release file without a final newline),
        # so the end marker always starts a line; split_sections drops the one empty line it adds otherwise.
        # a section that found nvidia-smi hung (HUNG) spares the later ones the wait (registry.SMI_CALL)
        parts.append(f'echo "@{nonce}@begin {name}"\n( {body}\n) 2>/dev/null; s=$?; echo\n'
                     f'[ "$s" != {HUNG} ] || gpunode_hung=1\necho "@{nonce}@end {name} $s"')
    return Script(body="\n".join(parts) + "\n", name="probe"), nonce


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
