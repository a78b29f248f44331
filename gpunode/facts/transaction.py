"""What the package manager would do with an exact transaction, asked before it runs: `apt-get -s install`,
`dnf --assumeno install`, `zypper --xmlout install --dry-run` (command and parser in one place).

Unlike the probe's facts (one fixed script), a transaction's simulation depends on the plan (the exact names and
versions), so it is a `Query`: the plan names it on the action that runs the transaction (`Action.query`), the
runner asks it read-only (facts.ask) and plans the step again with the answer (`Facts.answer`). Output formats:
- apt (apt-pkg's pkgSimulate, apt-get(8) `-s`): `Inst NAME [OLD] (NEW RELEASE [ARCH])`, `Remv NAME [OLD]`,
  `Purg NAME [OLD]`, `Conf ...`; `E: ...` on stderr and exit 100 when apt refuses.
- dnf (dnf(8) `--assumeno`): the transaction table (`Installing:`, `Installing dependencies:`, `Upgrading:`,
  `Downgrading:`, `Removing:`, ...; a long name alone on its line, the rest on the next), then "Operation
  aborted." with exit 1; an unresolvable request is `Error: ...` / ` Problem: ...`.
- zypper (zypper(8) `--xmlout`, `install --dry-run`): `<install-summary>` with `<to-install>`, `<to-upgrade>`,
  `<to-downgrade>`, `<to-reinstall>`, `<to-remove>` lists of `<solvable ... name=".." edition=".."
  edition-old=".."/>`; a resolver problem is `<message type="error">`.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from gpunode.facts.registry import Section
from gpunode.record import Frozen

INSTALL, UPGRADE, DOWNGRADE, REINSTALL, REMOVE = "install", "upgrade", "downgrade", "reinstall", "remove"
SIMULATE_TIMEOUT = 300.0  # seconds: apt/dnf/zypper resolve from local metadata (dnf -C: no refresh)


@dataclass(frozen=True, eq=False, repr=False)
class Change(Frozen):
    """One package the transaction would touch: what happens to it, the version it ends at (for a removal, the
    version removed) and the version before (None: not installed)."""

    action: str
    name: str
    version: str
    old: str | None = None

    def show(self) -> str:
        if self.action == REMOVE:
            return f"{self.name} {self.version} (removed)"
        if self.old and self.action != REINSTALL:
            return f"{self.name} {self.version} ({self.action} from {self.old})"
        return f"{self.name} {self.version}" + (" (reinstalled)" if self.action == REINSTALL else "")


@dataclass(frozen=True, eq=False, repr=False)
class Transaction(Frozen):
    """The parsed simulation: every package the manager would change, or why it refuses (`error`)."""

    changes: tuple[Change, ...] = ()
    error: str | None = None

    @property
    def removes(self) -> tuple[Change, ...]:
        return tuple(c for c in self.changes if c.action == REMOVE)

    @property
    def installs(self) -> tuple[Change, ...]:
        return tuple(c for c in self.changes if c.action != REMOVE)


A = TypeVar("A")


@dataclass(frozen=True, eq=False, repr=False)
class Query(Frozen, Generic[A]):
    """A read-only command whose answer a plan reads, built from the plan's own values (`script`, every value
    quoted) and parsed by `parse` (the Section: output and exit status) into a Transaction here, or another
    answer (facts/offers.py: what a repository offers)."""

    name: str
    script: str
    parse: Callable[[Section], A]
    timeout: float = SIMULATE_TIMEOUT
    label: str = "simulate"  # the script's name on the node (gpunode-LABEL in its command line)


# ---- apt -------------------------------------------------------------------------------------------------------

_APT_LINE = re.compile(r"^(Inst|Remv|Purg) (\S+)(?: \[([^\]]+)\])?(?: \((\S+)[^)]*\))?", re.M)


def parse_apt(section: Section) -> Transaction:
    changes = []
    for verb, name, old, new in _APT_LINE.findall(section.text):
        name = name.split(":", 1)[0] if name.endswith((":amd64", ":arm64", ":i386", ":all")) else name
        if verb in ("Remv", "Purg"):
            changes.append(Change(REMOVE, name, old or "", None))
            continue
        action = INSTALL if not old else (DOWNGRADE if _older(new, old) else UPGRADE if new != old else REINSTALL)
        changes.append(Change(action, name, new, old or None))
    return Transaction(tuple(changes), _refusal(section, r"^E: .*$"))


def _older(new: str, old: str) -> bool:
    from gpunode.facts.packages import compare_versions

    return compare_versions(new, old) < 0


def _refusal(section: Section, pattern: str) -> str | None:
    """None when the manager accepted the transaction; else its error lines (or the exit status)."""
    if section.status == 0:
        return None
    found = [m.group(0).strip() for m in re.finditer(pattern, section.text, re.M)]
    unmet = [line.strip() for line in section.text.splitlines() if " : Depends: " in line or "Problem:" in line]
    return "; ".join(dict.fromkeys([*unmet, *found])) or f"exit status {section.status}"


def simulate_apt(specs: Sequence[str], pin: tuple[str, str] | None = None) -> str:
    """`apt-get -s install` of the specs (NAME=VERSION, pkgmgr's spelling); with `pin` ((file name, text): gpunode's preferences pin not written
    yet) apt reads a copy of /etc/apt/preferences.d with the pin added, in a throwaway directory removed after."""
    line = shlex.join(["apt-get", "-s", "install", "--no-install-recommends", "--allow-downgrades",
                       *specs])
    if pin is None:
        return f"LC_ALL=C {line} 2>&1"
    name, text = pin
    parts = 'apt-get -s -o Dir::Etc::PreferencesParts="$d"'
    return ('d=$(mktemp -d) || exit 1; cp -p /etc/apt/preferences.d/* "$d"/ 2>/dev/null; '
            f'printf \'%s\' {shlex.quote(text)} > "$d"/{shlex.quote(name)}; '
            f"LC_ALL=C {line.replace('apt-get -s', parts, 1)} 2>&1; "
            'rc=$?; rm -rf "$d"; exit $rc')


# ---- dnf -------------------------------------------------------------------------------------------------------

_DNF_HEADINGS = {"Installing": INSTALL, "Installing dependencies": INSTALL, "Installing weak dependencies": INSTALL,
                 "Upgrading": UPGRADE, "Downgrading": DOWNGRADE, "Reinstalling": REINSTALL, "Removing": REMOVE,
                 "Removing dependent packages": REMOVE, "Removing unused dependencies": REMOVE,
                 "Installing group/module packages": INSTALL, "Upgrading dependencies": UPGRADE}


def parse_dnf(section: Section) -> Transaction:
    changes: list[Change] = []
    action: str | None = None
    carry = ""
    for raw in section.text.splitlines():
        line = raw.rstrip()
        heading = line.rstrip(":").strip() if line.endswith(":") and not line.startswith(" ") else None
        if heading is not None:
            action, carry = _DNF_HEADINGS.get(heading), ""
            continue
        if not line.startswith(" ") or action is None:
            if line and not line.startswith(" "):
                action = None if not line.startswith("=") else action
            continue
        cells = (carry + " " + line).split() if carry else line.split()
        if len(cells) == 1:  # a long name alone on its line: the rest follows on the next
            carry = cells[0]
            continue
        carry = ""
        if len(cells) >= 4 and re.match(r"\d|\d+:", cells[2]):
            changes.append(Change(action, cells[0], _no_epoch(cells[2])))
    error = None
    if section.status != 0 and not re.search(r"^Operation aborted\.", section.text, re.M):
        error = _refusal(section, r"^Error: .*$|^ Problem.*$") or f"exit status {section.status}"
    return Transaction(tuple(changes), error)


def _no_epoch(version: str) -> str:
    return version.split(":", 1)[1] if re.match(r"\d+:", version) else version


def simulate_dnf(specs: Sequence[str]) -> str:
    return f"LC_ALL=C {shlex.join(['dnf', '-C', '--assumeno', 'install', *specs])} 2>&1"


# ---- zypper ----------------------------------------------------------------------------------------------------

_ZYPPER_LISTS = {"to-install": INSTALL, "to-upgrade": UPGRADE, "to-downgrade": DOWNGRADE,
                 "to-reinstall": REINSTALL, "to-remove": REMOVE}
_ATTR = re.compile(r'([\w-]+)="([^"]*)"')


def parse_zypper(section: Section) -> Transaction:
    changes = []
    for tag, body in re.findall(r"<(to-[a-z]+)>(.*?)</\1>", section.text, re.S):
        action = _ZYPPER_LISTS.get(tag)
        if action is None:
            continue
        for attrs in re.findall(r"<solvable\b([^>]*)>", body):
            a = dict(_ATTR.findall(attrs))
            if a.get("type", a.get("kind", "package")) != "package" or not a.get("name"):
                continue
            changes.append(Change(action, a["name"], a.get("edition", ""), a.get("edition-old")))
    errors = [_unescape(m) for m in re.findall(r'<message type="error">(.*?)</message>', section.text, re.S)]
    error = "; ".join(errors) or (None if section.status == 0 else f"exit status {section.status}")
    return Transaction(tuple(changes), error)


def _unescape(text: str) -> str:
    return (text.replace("&apos;", "'").replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">")
            .replace("&amp;", "&").strip())


def simulate_zypper(specs: Sequence[str]) -> str:
    return ("LC_ALL=C " + shlex.join(["zypper", "--non-interactive", "--xmlout", "install", "--dry-run",
                                      "--oldpackage", *specs]) + " 2>&1")


def simulation(manager: str, specs: Sequence[str], pin: tuple[str, str] | None = None) -> Query[Transaction]:
    """The query that simulates installing `specs` (exact versions, spelled by pkgmgr) with `manager`."""
    if manager == "apt":
        return Query("apt-get -s install", simulate_apt(specs, pin), parse_apt)
    if manager in ("dnf", "yum"):
        return Query("dnf --assumeno install", simulate_dnf(specs), parse_dnf)
    return Query("zypper install --dry-run", simulate_zypper(specs), parse_zypper)
