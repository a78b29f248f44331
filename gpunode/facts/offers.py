"""What a package repository offers, read from its own metadata by the node before the repository is added: the
versions a plan can pin to exactly, known before the first change (a `Query`, gpunode/facts/transaction.py,
asked read-only by preflight.plan_asking; command and parser in one place).

Layouts read (as the repositories publish them):
- an apt flat repository (`deb URL /`, sources.list(5)): its index is `URL/Packages`, stanzas of `Package:` and
  `Version:` fields (deb-control(5)); NVIDIA's toolkit repository serves it uncompressed at
  https://nvidia.github.io/libnvidia-container/stable/deb/<arch>/Packages (github.com/NVIDIA/libnvidia-container,
  branch gh-pages, stable/deb/amd64/Packages).
- an rpm-md repository (createrepo_c): `URL/repodata/repomd.xml` names the primary metadata
  (`<data type="primary">` ... `<location href="repodata/...-primary.xml.gz"/>`), whose packages carry
  `<name>N</name>` and `<version epoch=".." ver="V" rel="R"/>` (same repository, stable/rpm/x86_64/repodata).

The node reads it with curl, wget or apt's own downloader (apt-helper: apt's proxy settings), so a node behind a
proxy or without a route to the repository answers as its package manager would at install time. Only the lines
of the packages asked for come back (`offer NAME VERSION`); an unreadable repository is `E: ...`.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from gpunode.facts.registry import Section
from gpunode.facts.transaction import Query
from gpunode.record import Frozen

OFFERS_TIMEOUT = 300.0  # seconds: two downloads (curl --max-time 120 each) and the parsing
LABEL = "read-offers"  # the script's name on the node: gpunode-read-offers

# curl, else wget, else apt's downloader (Debian and Ubuntu have it without curl): the body on stdout
_FETCH = (
    'fetch() { if command -v curl >/dev/null 2>&1; then curl -fsSL --max-time 120 "$1"; '
    'elif command -v wget >/dev/null 2>&1; then wget -q -T 120 -O - "$1"; '
    'elif [ -x /usr/lib/apt/apt-helper ]; then t=$(mktemp) || return 1; '
    '/usr/lib/apt/apt-helper download-file "$1" "$t" >/dev/null 2>&1 && cat "$t"; r=$?; rm -f "$t"; return $r; '
    'else echo "E: no curl, wget or apt-helper on the node to read $1"; return 1; fi; }; '
)


@dataclass(frozen=True, eq=False, repr=False)
class Offers(Frozen):
    """Versions offered per package name (in the repository's order), or why the repository could not be read."""

    url: str
    versions: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    error: str | None = None

    def common(self, names: Sequence[str]) -> list[str]:
        """Versions every one of `names` is offered at, newest first."""
        from functools import cmp_to_key

        from gpunode.facts.packages import compare_versions

        if not names:
            return []
        shared = set(self.versions.get(names[0], ()))
        for name in names[1:]:
            shared &= set(self.versions.get(name, ()))
        return sorted(shared, key=cmp_to_key(compare_versions), reverse=True)


def _parser(url: str) -> Callable[[Section], Offers]:
    def parse(section: Section) -> Offers:
        found: dict[str, list[str]] = {}
        errors = []
        for line in section.text.splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[0] == "offer":
                found.setdefault(parts[1], [])
                if parts[2] not in found[parts[1]]:
                    found[parts[1]].append(parts[2])
            elif line.startswith("E: "):
                errors.append(line[3:].strip())
            elif line.startswith(("curl: ", "wget: ")):  # the downloader's own reason (no route, 404, TLS)
                errors.insert(0, line.strip())
        error = "; ".join(errors) or (f"exit status {section.status}" if section.status != 0 else None)
        return Offers(url, {n: tuple(v) for n, v in found.items()}, error)

    return parse


def _want(names: Sequence[str]) -> str:
    return shlex.quote(" " + " ".join(names) + " ")


def apt_flat(url: str, names: Sequence[str]) -> Query[Offers]:
    """The versions of `names` in the flat apt repository at `url` (its Packages index)."""
    index = url.rstrip("/") + "/Packages"
    script = (_FETCH + f"u={shlex.quote(index)}; "
              'out=$(fetch "$u") || { echo "E: cannot read $u"; exit 1; }; '
              f'printf "%s\\n" "$out" | awk -v want={_want(names)} '
              "'/^Package:/ { p = $2 } /^Version:/ { if (index(want, \" \" p \" \")) print \"offer\", p, $2 }'")
    return Query("read the repository's Packages index", script, _parser(index), OFFERS_TIMEOUT, LABEL)


def rpm_md(url: str, names: Sequence[str]) -> Query[Offers]:
    """The versions (VERSION-RELEASE, no epoch) of `names` in the rpm-md repository at `url`."""
    base = url.rstrip("/")
    script = (_FETCH + f"b={shlex.quote(base)}; "
              'm=$(fetch "$b/repodata/repomd.xml") || { echo "E: cannot read $b/repodata/repomd.xml"; exit 1; }; '
              "p=$(printf '%s\\n' \"$m\" | tr '<' '\\n' | awk '/^data / { t = $0 } /^location / { if (t ~ "
              "/type=\"primary\"/) { sub(/^location href=\"/, \"\"); sub(/\".*/, \"\"); print; exit } }'); "
              '[ -n "$p" ] || { echo "E: $b/repodata/repomd.xml names no primary metadata"; exit 1; }; '
              'case $p in *.gz) d="gzip -dc" ;; *.zst) d="zstd -dc" ;; *.xz) d="xz -dc" ;; *.bz2) d="bzip2 -dc" ;; '
              "*) d=cat ;; esac; "
              't=$(mktemp) || exit 1; '
              'if fetch "$b/$p" > "$t"; then '
              f"$d < \"$t\" | tr '<' '\\n' | awk -v want={_want(names)} '/^name>/ {{ n = substr($0, 6) }} "
              "/^version / { if (index(want, \" \" n \" \")) { v = $0; sub(/.* ver=\"/, \"\", v); sub(/\".*/, \"\", v); "
              "r = $0; sub(/.* rel=\"/, \"\", r); sub(/\".*/, \"\", r); print \"offer\", n, v \"-\" r } }'; "
              'else echo "E: cannot read $b/$p"; fi; rm -f "$t"')
    return Query("read the repository's primary metadata", script, _parser(base), OFFERS_TIMEOUT, LABEL)


# ---- what the package manager's own lists offer (a repository already configured: a mirror, another channel) ----
# Read on the node after the manager's refresh, by the install itself (actions/packages.InstallOffered), in the
# three listings gpunode already parses (facts/driver.parse_offered): `apt-cache policy NAME...` (apt_preferences(5)
# version table), `dnf list --showduplicates NAME...` (dnf refreshes expired metadata by itself), zypper's
# `search -s --match-exact` table.


def lists_command(manager: str, names: Sequence[str]) -> str:
    """The read-only command that lists the versions the configured repositories offer of `names` (run with
    LC_ALL=C: the listings' headers are translated otherwise)."""
    quoted = shlex.join(list(names))
    if manager == "apt":
        return f"apt-cache policy {quoted}"
    if manager in ("dnf", "yum"):
        return f"{manager} -q list --showduplicates {quoted}"
    return f"zypper -n -q search -s --match-exact {quoted}"


def parse_lists(text: str, where: str = "the configured repositories") -> Offers:
    from gpunode.facts.driver import parse_offered

    return Offers(where, {name: tuple(found) for name, found in parse_offered(text).items()})
