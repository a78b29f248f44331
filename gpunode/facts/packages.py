"""Installed packages, package holds and systemd unit states, parsed from the probe. All pure.

Steps decide "already done?" from these: a package at the wanted version, a hold in place, a unit enabled and
running. The probe prints one `STATUS<TAB>NAME<TAB>VERSION` line per package for dpkg and rpm alike (rpm lines
carry a fixed "ii " status), so one parser serves both families.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpunode.facts.registry import command, files, hushed, shared
from gpunode.facts.registry import text as raw_text
from gpunode.record import Frozen

_M = __name__.rsplit(".", 1)[-1]


@dataclass(frozen=True, eq=False, repr=False)
class Package(Frozen):
    name: str
    version: str  # as the package manager prints it: 1.17.8-1, 1:2.0-3, 535.129.03-1
    held: bool = False  # dpkg "hold" selection (apt-mark hold); rpm holds come from versionlock files

    @property
    def upstream(self) -> str:
        return upstream_version(self.version)


def parse_packages(text: str) -> dict[str, Package]:
    """`dpkg-query -W -f='${db:Status-Abbrev}\\t${Package}\\t${Version}\\n'` (or the rpm equivalent) -> installed.

    The status abbreviation is want/state/error: "ii " installed, "hi " installed and held, "rc " only config
    files left (not installed), "un" unknown. Only installed states count. A package installed for several
    architectures (multiarch: libnvidia-* for amd64 and i386) has a line each under one name: the first line's
    version, and held when any of them is (apt moves a `Multi-Arch: same` package's architectures together, so a
    hold on one holds them all)."""
    packages: dict[str, Package] = {}
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) < 3 or not parts[1].strip():
            continue
        status, name, version = parts[0], parts[1].strip().split(":")[0], parts[2].strip()
        if len(status) < 2 or status[1] not in "iWt" or not version:
            continue
        seen = packages.get(name)
        held = status[0] == "h" or (seen is not None and seen.held)
        packages[name] = Package(name, seen.version if seen is not None else version, held=held)
    return packages


_LOCK_NEVRA = re.compile(r"^(?P<name>.+?)-(?:(?P<epoch>\d+):)?(?P<version>[^-:]+)-(?P<release>[^-]+?)(?:\.\*)?$")


def parse_versionlock(text: str) -> dict[str, str]:
    """dnf/yum versionlock.list lines (`nvidia-fabric-manager-0:535.129.03-1.*`) -> {name: version-release}.

    Lines starting with '!' are exclusions, not locks; comments and blank lines are skipped."""
    locks: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", "!")):
            continue
        match = _LOCK_NEVRA.match(line)
        if match:
            locks[match["name"]] = f"{match['version']}-{match['release']}"
    return locks


def parse_zypp_locks(text: str) -> set[str]:
    """/etc/zypp/locks: blank-line separated blocks; `solvable_name: X` names a locked package."""
    names = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "solvable_name" and value.strip():
            names.add(value.strip())
    return names


VERSIONLOCK_FILES = ("/etc/dnf/plugins/versionlock.list", "/etc/yum/pluginconf.d/versionlock.list")
ZYPP_LOCKS = "/etc/zypp/locks"


def held_packages(packages: Mapping[str, Package], files: Mapping[str, str]) -> set[str]:
    """Names held by any mechanism: dpkg hold selections, dnf/yum versionlock entries, zypper locks."""
    held = {name for name, pkg in packages.items() if pkg.held}
    for path in VERSIONLOCK_FILES:
        held.update(parse_versionlock(files.get(path, "")))
    held.update(parse_zypp_locks(files.get(ZYPP_LOCKS, "")))
    return held


def upstream_version(version: str) -> str:
    """The upstream part: no epoch, no Debian/RPM revision. 1:535.129.03-0ubuntu2 -> 535.129.03."""
    version = version.split(":", 1)[1] if ":" in version.split("-", 1)[0] else version
    return version.rsplit("-", 1)[0] if "-" in version else version


# ---- systemd -----------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False, repr=False)
class UnitState(Frozen):
    name: str
    active: str  # active | inactive | failed | activating | ...
    enabled: str  # enabled | disabled | static | masked | ...; "" when the unit does not exist

    @property
    def exists(self) -> bool:
        return self.enabled not in ("", "not-found")

    @property
    def is_active(self) -> bool:
        return self.active in ("active", "reloading", "activating")

    @property
    def is_enabled(self) -> bool:
        return self.enabled in ("enabled", "enabled-runtime", "static", "alias", "indirect", "generated")

    @property
    def masked(self) -> bool:
        return self.enabled.startswith("masked")


def parse_units(text: str) -> dict[str, UnitState]:
    """Probe lines `UNIT<TAB>is-active<TAB>is-enabled`. `systemctl is-enabled` prints nothing (older systemd)
    or "not-found" (newer) for a unit that does not exist."""
    units: dict[str, UnitState] = {}
    for line in text.splitlines():
        parts = line.split("\t")
        if not parts[0].strip():
            continue
        name = parts[0].strip()
        active = parts[1].strip() if len(parts) > 1 else ""
        enabled = parts[2].strip() if len(parts) > 2 else ""
        units[name] = UnitState(name, active or "inactive", enabled)
    return units


# systemd's search path for system units (`systemd-analyze unit-paths`, systemd 252 on Debian 12; the same compiled
# list on the RHEL and SUSE families, /lib/... being /usr/lib/... where /usr is merged). A unit systemd has a file,
# an alias link, a mask or a drop-in directory for is named in one of them.
UNIT_DIRS = ("/etc/systemd/system.control", "/run/systemd/system.control", "/run/systemd/transient",
             "/run/systemd/generator.early", "/etc/systemd/system", "/etc/systemd/system.attached",
             "/run/systemd/system", "/run/systemd/system.attached", "/run/systemd/generator",
             "/usr/local/lib/systemd/system", "/lib/systemd/system", "/usr/lib/systemd/system",
             "/run/systemd/generator.late")


# `systemctl show` costs a D-Bus GetAll of every property per unit (~20 ms a unit on the real VM, whatever -p asks
# for, whether the unit exists or not), and most of the units the probe asks about are absent from a node. So
# gpunode_show (a shell function: its arguments the units, its answer in $gpunode_shown) asks `show` only about the
# units systemd could say more of than "inactive, no file state":
# - those named in a unit directory (UNIT_DIRS, those that are directories: a file, an alias or mask link, a drop-in
#   directory), template instances (foo@bar.service: their file is foo@.service) and names without a type (show
#   reads `docker` as docker.service);
# - those systemd holds in memory other than as not-found: ONE `systemctl list-units --all` for the names (a unit
#   whose file went away stays there, active or failed, until it stops or is reset).
# A not-found unit in memory reads its ActiveState off that list, with an empty file state (systemd has no
# fragment for it). A unit neither named in a directory nor in memory is what `show` would load and report:
# inactive, no file state. Where PID 1's environment sets SYSTEMD_UNIT_PATH (another search path) or cannot be
# read, or the list fails (no systemctl, no systemd), every unit is asked, as before.
# Each unit's block in show's answer starts with its Id= line (systemd prints Id first; an alias shows its
# target's Id, hence by position, not by name). A unit `show` says nothing of has empty states, as before.
def _field(var: str, key: str) -> str:  # var = the value of show's block's line KEY=..., if it has one
    return f'case $gpunode_b in *"\n{key}="*) {var}=${{gpunode_b#*"\n{key}="}}; {var}=${{{var}%%"\n"*}} ;; esac'


_STRIP = 'gpunode_r=${gpunode_r#"${gpunode_r%%[! ]*}"}'  # leading blanks off
SHOW_CALL = (
    'gpunode_show() { gpunode_n=$#; gpunode_k="\n"; gpunode_all=; for gpunode_u; do '
    'gpunode_all="$gpunode_all$gpunode_u\n"; done; gpunode_x=1; if [ -r /proc/1/environ ]; then gpunode_x=; '
    'while IFS= read -r gpunode_r || [ -n "$gpunode_r" ]; do case $gpunode_r in *SYSTEMD_UNIT_PATH=*) gpunode_x=1 ;; '
    'esac; done < /proc/1/environ; fi; if [ -z "$gpunode_x" ] && '
    + hushed('gpunode_l="\n$(systemctl list-units --all --plain --no-legend --full "$@")"') + '; then '
    f'gpunode_ds=; for gpunode_d in {" ".join(UNIT_DIRS)}; do [ ! -d "$gpunode_d" ] || '
    'gpunode_ds="$gpunode_ds $gpunode_d"; done; '
    'for gpunode_u; do gpunode_f=; case $gpunode_u in *@*) gpunode_f=1 ;; *.*) ;; *) gpunode_f=1 ;; esac; '
    'for gpunode_d in $gpunode_ds; do [ -z "$gpunode_f" ] || break; '
    'if [ -e "$gpunode_d/$gpunode_u" ] || [ -h "$gpunode_d/$gpunode_u" ] || [ -e "$gpunode_d/$gpunode_u.d" ]; '
    'then gpunode_f=1; fi; done; '
    'if [ -z "$gpunode_f" ]; then case $gpunode_l in *"\n$gpunode_u "*) '
    'gpunode_r=${gpunode_l#*"\n$gpunode_u "}; gpunode_r=${gpunode_r%%"\n"*}; ' + _STRIP + '; '
    'gpunode_a=${gpunode_r%% *}; gpunode_r=${gpunode_r#"$gpunode_a"}; ' + _STRIP + '; '
    'if [ "$gpunode_a" = not-found ]; then gpunode_k="$gpunode_k$gpunode_u\t${gpunode_r%% *}\t\n"; '
    'else gpunode_f=1; fi ;; *) gpunode_k="$gpunode_k$gpunode_u\tinactive\t\n" ;; esac; fi; '
    '[ -z "$gpunode_f" ] || set -- "$@" "$gpunode_u"; done; else for gpunode_u; do set -- "$@" "$gpunode_u"; done; '
    'fi; shift $gpunode_n; gpunode_o="\n"; [ $# -eq 0 ] || '
    + hushed('gpunode_o="\n$(systemctl show -p Id -p ActiveState -p UnitFileState "$@")"') + '; gpunode_shown="\n"; '
    'while [ -n "$gpunode_all" ]; do gpunode_u=${gpunode_all%%"\n"*}; gpunode_all=${gpunode_all#*"\n"}; '
    'case $gpunode_k in '
    '*"\n$gpunode_u\t"*) gpunode_r=${gpunode_k#*"\n$gpunode_u\t"}; '
    'gpunode_shown="$gpunode_shown$gpunode_u\t${gpunode_r%%"\n"*}\n"; continue ;; esac; gpunode_a=; gpunode_e=; '
    'case $gpunode_o in *"\nId="*) gpunode_o=${gpunode_o#*"\nId="}; gpunode_b=${gpunode_o%%"\nId="*}; '
    + _field("gpunode_a", "ActiveState") + "; " + _field("gpunode_e", "UnitFileState") + ' ;; esac; '
    'gpunode_shown="$gpunode_shown$gpunode_u\t$gpunode_a\t$gpunode_e\n"; done; }; ')


def _show_units(units: tuple[str, ...], into: str) -> str:
    """Shell that sets `into` to a newline, then `UNIT<TAB>ActiveState<TAB>UnitFileState` and a newline for each
    unit, in the order given (SHOW_CALL: at most one `systemctl list-units` and one `systemctl show`; two
    `systemctl is-*` processes per unit before)."""
    return SHOW_CALL + f'gpunode_show {" ".join(shlex.quote(u) for u in units)}; {into}=$gpunode_shown'


# Several sections read unit states (the engines, the k8s units, the GPU services): where two of them are in one
# probe, build_probe runs ONE `systemctl show` for all their units before the first of them (shared_units) and
# each section picks its units' rows out of that answer with the shell's own expansions (no process). A section
# run on its own (the answer not there) asks systemctl itself.
_SHOWN: dict[str, tuple[str, ...]] = {}  # section snippet fragment -> its units
_SHARED_ROWS = "gpunode_units"


def unit_states(*units: str) -> str:
    """A snippet printing `UNIT<TAB>ActiveState<TAB>UnitFileState` for each unit, in the order given (see
    _show_units), from the probe's shared answer when there is one, else from its own `systemctl show`."""
    pick = (f'for u in {" ".join(shlex.quote(u) for u in units)}; do case "$x" in '
            '*"\n$u\t"*) r=${x#*"\n$u\t"}; printf "%s\\t%s\\n" "$u" "${r%%"\n"*}" ;; '
            '*) printf "%s\\t\\t\\n" "$u" ;; esac; done')
    snippet = (f'if [ -n "${{{_SHARED_ROWS}_set}}" ]; then x=${_SHARED_ROWS}; else {_show_units(units, "x")}; fi; '
               + pick)
    _SHOWN[snippet] = units
    return snippet


def shared_units(snippets: Iterable[str]) -> str | None:
    """The top-level shell that asks systemctl once for every unit the given section snippets read (None when
    fewer than two of them read unit states: then each asks for itself)."""
    texts = list(snippets)
    wanted = [units for fragment, units in _SHOWN.items() if any(fragment in s for s in texts)]
    if len(wanted) < 2:
        return None
    union = tuple(dict.fromkeys(u for units in wanted for u in units))
    return f'{_show_units(union, _SHARED_ROWS)}; {_SHARED_ROWS}_set=1'


def unit(units: Mapping[str, UnitState], name: str) -> UnitState:
    """The state of `name` (with or without `.service`), or a not-found state."""
    full = name if "." in name else f"{name}.service"
    return units.get(full) or UnitState(full, "inactive", "")


# ---- version order -----------------------------------------------------------------------------------------


def _order(char: str) -> int:
    if char == "~":
        return -1
    if char.isalpha():
        return ord(char)
    return ord(char) + 256


def _compare_part(a: str, b: str) -> int:
    """dpkg's verrevcmp: alternating non-digit and digit runs; '~' sorts before everything, even the end."""
    while a or b:
        na = re.match(r"\D*", a).group()  # type: ignore[union-attr]
        nb = re.match(r"\D*", b).group()  # type: ignore[union-attr]
        for i in range(max(len(na), len(nb))):
            ca = _order(na[i]) if i < len(na) else 0
            cb = _order(nb[i]) if i < len(nb) else 0
            if ca != cb:
                return -1 if ca < cb else 1
        a, b = a[len(na):], b[len(nb):]
        da = re.match(r"\d*", a).group()  # type: ignore[union-attr]
        db = re.match(r"\d*", b).group()  # type: ignore[union-attr]
        if int(da or 0) != int(db or 0):
            return -1 if int(da or 0) < int(db or 0) else 1
        a, b = a[len(da):], b[len(db):]
    return 0


def compare_versions(a: str, b: str) -> int:
    """Debian version order (epoch, upstream, revision). Close enough for RPM's simple N.N.N-R versions too;
    used only to tell an upgrade from a downgrade."""
    def split(v: str) -> tuple[int, str, str]:
        epoch, _, rest = v.partition(":") if ":" in v.split("-", 1)[0] else ("0", "", v)
        upstream, _, revision = rest.rpartition("-") if "-" in rest else (rest, "", "0")
        return int(epoch) if epoch.isdigit() else 0, upstream, revision

    ea, ua, ra = split(a)
    eb, ub, rb = split(b)
    if ea != eb:
        return -1 if ea < eb else 1
    return _compare_part(ua, ub) or _compare_part(ra, rb)


# ---- how each package manager spells a pinned version ------------------------------------------------------


def pin_spec(manager: str, name: str, version: str) -> str:
    """apt pins with `name=version`; dnf, yum and zypper take `name-version`."""
    return f"{name}={version}" if manager == "apt" else f"{name}-{version}"


# ---- the facts ------------------------------------------------------------------------------------------------

PACKAGE_SOURCES = files("package_sources", ("/etc/apt/sources.list", "/etc/apt/sources.list.d/*.list",
                                            "/etc/apt/sources.list.d/*.sources", "/etc/yum.repos.d/*.repo",
                                            "/etc/zypp/repos.d/*.repo"), module=_M)
PACKAGE_LOCKS = files("package_locks", (*VERSIONLOCK_FILES, ZYPP_LOCKS), module=_M)
# ---- dpkg's status of the driver's packages, asked once per probe ----------------------------------------------
# Two sections of the RUN probe read dpkg's status of NVIDIA's packages (PKG_STATUS here, driver.PACKAGES), each
# for its own names and in its own form. ONE `dpkg-query` for the names of both (DPKG_NAMES) is asked once per probe
# (registry.SHARED); each section picks its lines out of that answer with the shell's own expansions (no process),
# in dpkg's order (by package name, each package once, whatever the order of the patterns). A section run alone
# asks dpkg-query itself, for the same names, and picks the same way. The exact names stand before the glob that
# also matches them, so each package matches as it did when its section asked for it alone.
DPKG_NAMES = ("nvidia*", "libnvidia*", "cuda-drivers*", "libcuda1", "firmware-nvidia-gsp", "firmware-nvidia*",
              "linux-modules-nvidia*", "linux-objects-nvidia*")
_DPKG_QUERY = ("dpkg-query -W -f='${db:Status-Abbrev}\t${Package}\t${Version}\n' "
               + " ".join(shlex.quote(n) for n in DPKG_NAMES) + " 2>/dev/null")
_DPKG_ROWS = shared("gpunode_dpkg_set", "gpunode_dpkg_set=; if command -v dpkg-query >/dev/null 2>&1; then "
                    f"gpunode_dpkg=$({_DPKG_QUERY}); gpunode_dpkg_set=1; fi")


def dpkg_status(names: tuple[str, ...], emit: str) -> str:
    """Shell that runs `emit` for each package dpkg knows whose name matches one of `names` (globs, each one of
    DPKG_NAMES), in dpkg's order, with $l the line `STATUS<TAB>NAME<TAB>VERSION`, $st the status abbreviation
    (3 characters: `ii `), $n the name, $v the version. For a node with dpkg-query."""
    unknown = set(names) - set(DPKG_NAMES)
    if unknown:
        raise ValueError(f"dpkg_status: {sorted(unknown)} not in packages.DPKG_NAMES (the names asked once)")
    return (f'if [ -n "${_DPKG_ROWS}" ]; then d=$gpunode_dpkg; else d=$({_DPKG_QUERY}); fi; '
            'while [ -n "$d" ]; do l=${d%%"\n"*}; d=${d#"$l"}; d=${d#"\n"}; st=${l%%"\t"*}; n=${l#*"\t"}; '
            f'v=${{n#*"\t"}}; n=${{n%%"\t"*}}; case $n in {"|".join(names)}) {emit} ;; esac; done')


# installed packages as "STATUS<TAB>NAME<TAB>VERSION"; a dpkg status starting with "h" is an apt-mark hold
PKG_STATUS = command("pkg_status", (
    "if command -v dpkg-query >/dev/null 2>&1; then "
    + dpkg_status(("nvidia*", "libnvidia*", "cuda-drivers*", "libcuda1", "firmware-nvidia-gsp",
                   "linux-modules-nvidia*"), 'printf "%s\\n" "$l"') + "; "
    "elif command -v rpm >/dev/null 2>&1; then "
    "rpm -qa --qf 'ii \\t%{NAME}\\t%{VERSION}-%{RELEASE}\\n' 2>/dev/null | grep -E "
    "'^ii .(nvidia|libnvidia|cuda-drivers|python3-dnf-plugin-versionlock|yum-plugin-versionlock)'; fi; true"
), parse_packages, module=_M)
UNITS = command("units", unit_states(
    "docker.service", "containerd.service", "crio.service", "snap.docker.dockerd.service",
    "nvidia-fabricmanager.service", "nvidia-persistenced.service"), parse_units, module=_M)
# the units only the doctor looks at, in the same form
DOCTOR_UNITS = command("doctor_units", 'command -v systemctl >/dev/null 2>&1 || exit 3; ' + unit_states(
    "nvidia-persistenced.service", "nvidia-gridd.service", "unattended-upgrades.service",
    "apt-daily-upgrade.timer", "dnf-automatic.timer", "dnf-automatic-install.timer"),
    parse_units, module=_M, full_only=True)
# non-empty keyrings apt can name in signed-by=
APT_KEYRINGS = command("apt_keyrings", (
    'for f in /usr/share/keyrings/* /etc/apt/keyrings/* /etc/apt/trusted.gpg.d/*; do '
                 '[ -s "$f" ] && echo "$f"; done; true'
), lambda t: frozenset(t.split()), module=_M)
# which prerequisites are installed as packages, and can the package manager install the others? (local metadata
# only, never refreshed: apt answers per package once its lists know `make`; dnf lists its cache). The raw lines:
# gpunode/steps/prerequisites.py reads them against the running kernel; `Facts.get` is None when the probe failed.
PREREQ_AVAILABLE = command("prereq_available", (
    'k=$(uname -r); '
    # one dpkg-query (or rpm) for the four names, one apt-cache policy for the four candidates: apt-cache loads
    # its whole package cache on every call (~0.7 s of CPU where pkgcache.bin is absent), so not once per name
    'if command -v dpkg-query >/dev/null 2>&1; then '
    "dpkg-query -W -f='${Status} ${Package}\\n' gcc make dkms epel-release 2>/dev/null | "
    'awk \'$1 == "install" && $2 == "ok" && $3 == "installed" { print "installed " $4 }\'; '
    "elif command -v rpm >/dev/null 2>&1; then "
    "rpm -q --qf 'installed %{NAME}\\n' gcc make dkms epel-release 2>/dev/null | grep '^installed '; fi; "
    # availability matters only when something is missing (gpunode/steps/prerequisites.py): a converged node,
    # with the three tools and the running kernel's headers, never pays for the package manager's metadata
    'for t in gcc make dkms; do command -v "$t" >/dev/null 2>&1 || k=; done; '
    '[ -n "$k" ] && { [ -d "/lib/modules/$k/build" ] || [ -d "/usr/src/kernels/$k" ]; } && exit 0; k=$(uname -r); '
    'if command -v apt-cache >/dev/null 2>&1; then '
    'apt-cache policy gcc make dkms "linux-headers-$k" 2>/dev/null | awk -v want="gcc make dkms linux-headers-$k" '
    "'/^[^ ].*:$/ { p = $0; sub(/:$/, \"\", p); sub(/:(amd64|arm64|i386|armhf|ppc64el|s390x)$/, \"\", p); next } "
    '/^  Candidate: / { c[p] = $2 } '
    'END { if (c["make"] == "" || c["make"] == "(none)") exit; n = split(want, w, " "); '
    'for (i = 1; i <= n; i++) print ((c[w[i]] != "" && c[w[i]] != "(none)") ? "avail " : "missing ") w[i] }\'; '
    'elif command -v dnf >/dev/null 2>&1; then '
    'out=$(dnf -q -C list --available --showduplicates gcc make dkms kernel-devel 2>/dev/null) || exit 0; '
    'printf "%s\\n" "$out" | grep -E "^(gcc|make|dkms|kernel-devel)\\." | sed "s/^/dnf /"; '
    # zypper (SUSE): its `search -s` table from the local metadata; the headers are kernel-FLAVOUR-devel of the
    # running kernel's version (pkgmgr.headers_package), offered when one of its version-releases starts with it
    'elif command -v zypper >/dev/null 2>&1; then '
    'f=${k##*-}; v=${k%-*}; '
    'zypper -n -q search -s --match-exact gcc make dkms "kernel-$f-devel" 2>/dev/null | '
    'awk -F"|" -v h="kernel-$f-devel" -v v="$v" '
    "'{ for (i = 1; i <= NF; i++) gsub(/^ +| +$/, \"\", $i) } "
    '$3 == "package" { seen = 1; if ($2 != h) a[$2] = 1; else if ($4 == v || index($4, v ".") == 1) a[h] = 1 } '
    'END { if (!seen) exit; n = split("gcc make dkms " h, w, " "); '
    'for (i = 1; i <= n; i++) print (a[w[i]] ? "avail " : "missing ") w[i] (w[i] == h ? "=" v : "") }\'; '
    'fi; true'
), raw_text, module=_M, late=True)
