"""Step: install the NVIDIA Container Toolkit (nvidia-container-toolkit, -base, libnvidia-container-tools,
libnvidia-container1) from NVIDIA's repository, or from package files the user brought (offline).

Idempotent by installed version: with no --toolkit-version any installed toolkit is kept (gpunode never upgrades
behind the user's back); a pin must be met by all four packages, which since 1.18 must carry the same version.
The repository is added the way NVIDIA documents it (apt with a signed-by keyring, a .repo file for dnf/yum and
zypper), unless one already points at nvidia.github.io/libnvidia-container: a second copy with a different
signed-by breaks `apt-get update` for the whole machine.
"""

from __future__ import annotations

import dataclasses
import posixpath
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING
from urllib.parse import unquote

from gpunode import fixes, pkgmgr, rules, versions
from gpunode.facts import Facts, offers
from gpunode.facts import k8s as k8s_facts
from gpunode.facts import packages as package_facts
from gpunode.facts.containers import survey_engines
from gpunode.facts.offers import Offers
from gpunode.facts.packages import (
    Package,
    compare_versions,
    held_packages,
    upstream_version,
)
from gpunode.facts.transaction import Query
from gpunode.options import Options
from gpunode.plan import Action, Earlier, RunCommand, StepPlan, WriteFile, blocked, change, ok
from gpunode.shell import Script
from gpunode.steps.base import Step
from gpunode.steps.outputs import ToolkitOutputs

if TYPE_CHECKING:  # the package actions are imported when a change is planned: a converged run plans none
    from gpunode.actions.packages import PackageCommand

NAME = "toolkit"
TITLE = "NVIDIA Container Toolkit"
PACKAGES = rules.TOOLKIT_PACKAGES
ARCHES = ("x86_64", "aarch64")

REPO = "https://nvidia.github.io/libnvidia-container"
MARKER = "nvidia.github.io/libnvidia-container"
DEPRECATED = ("nvidia.github.io/nvidia-docker", "nvidia.github.io/nvidia-container-runtime")
KEY_URL = f"{REPO}/gpgkey"
APT_KEYRING = "/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg"
APT_LIST = "/etc/apt/sources.list.d/nvidia-container-toolkit.list"
REPO_FILE = "nvidia-container-toolkit.repo"  # in the rpm managers' repository directory (gpunode/pkgmgr.py)
YUM_REPO = f"{pkgmgr.get('dnf').repo_dir}/{REPO_FILE}"
ZYPP_REPO = f"{pkgmgr.get('zypper').repo_dir}/{REPO_FILE}"
HEADER = f"# Written by gpunode: NVIDIA Container Toolkit packages ({REPO})\n"

APT_SOURCE = HEADER + f"deb [signed-by={APT_KEYRING}] {REPO}/stable/deb/$(ARCH) /\n"


def rpm_repo(zypper: bool) -> str:
    """The stable section of NVIDIA's nvidia-container-toolkit.repo ($basearch is expanded by dnf and zypper)."""
    lines = ["[nvidia-container-toolkit]", "name=nvidia-container-toolkit",
             f"baseurl={REPO}/stable/rpm/$basearch", "repo_gpgcheck=1", "gpgcheck=0", "enabled=1",
             f"gpgkey={KEY_URL}", "sslverify=1"]
    lines += ["autorefresh=1", "type=rpm-md"] if zypper else ["sslcacert=/etc/pki/tls/certs/ca-bundle.crt"]
    return HEADER + "\n".join(lines) + "\n"


_FETCH_KEY = Script(
    name="fetch-apt-key",
    body='set -e; tmp=$(mktemp); trap \'rm -f "$tmp"\' EXIT; curl -fsSL -o "$tmp" "$1"; '
         'mkdir -p "$(dirname "$2")"; gpg --batch --yes --dearmor -o "$2" "$tmp"; chmod 0644 "$2"',
)
# ---- repositories already on the node ----------------------------------------------------------------------


def apt_sources(files: Mapping[str, str]) -> list[tuple[str, str | None]]:
    """(file, signed-by keyring or None) of every active apt source pointing at libnvidia-container, in
    one-line (.list) or deb822 (.sources) format."""
    found = []
    for path, text in sorted(files.items()):
        if not path.startswith("/etc/apt/sources.list"):
            continue
        if path.endswith(".sources"):
            for stanza in re.split(r"\n\s*\n", text):
                fields = {k.strip().lower(): v.strip() for k, _, v in
                          (line.partition(":") for line in stanza.splitlines() if not line.startswith("#"))}
                if MARKER in fields.get("uris", "") and fields.get("enabled", "yes").lower() != "no":
                    found.append((path, fields.get("signed-by") or None))
            continue
        for line in text.splitlines():
            line = line.split("#", 1)[0].strip()
            if line.startswith("deb ") and MARKER in line:
                keyring = re.search(r"signed-by=([^\]\s]+)", line)
                found.append((path, keyring.group(1) if keyring else None))
    return found


def rpm_repos(files: Mapping[str, str], directory: str) -> list[str]:
    """.repo files in `directory` with an enabled section whose baseurl points at libnvidia-container."""
    found = []
    for path, text in sorted(files.items()):
        if posixpath.dirname(path) != directory or not path.endswith(".repo"):
            continue
        for section in re.split(r"^\s*\[", text, flags=re.M)[1:]:
            values = dict((k.strip().lower(), v.strip()) for k, _, v in
                          (line.partition("=") for line in section.splitlines()[1:] if "=" in line))
            if MARKER in values.get("baseurl", "") and values.get("enabled", "1") not in ("0", "false", "no"):
                found.append(path)
                break
    return found


def deprecated_sources(files: Mapping[str, str]) -> list[str]:
    return sorted(p for p, text in files.items() if p.startswith(("/etc/apt/", "/etc/yum.repos.d/", "/etc/zypp/"))
                  and any(d in line and not line.lstrip().startswith("#") for d in DEPRECATED
                          for line in text.splitlines()))


def repo_actions(facts: Facts, manager: str, lock_timeout: float) -> tuple[list[Action], list[str]]:
    """What it takes to make NVIDIA's repository usable, and notes."""
    from gpunode.actions.packages import install_packages, package_command

    files, notes = facts.files, []
    actions: list[Action] = []
    m = pkgmgr.get(manager)
    if manager == "apt":
        keyrings = facts[package_facts.APT_KEYRINGS]
        sources = apt_sources(files)
        wanted = sorted({k for _, k in sources if k} if sources else {APT_KEYRING})
        missing = [k for k in wanted if k not in keyrings]
        if missing and not (facts.has("curl") and facts.has("gpg")):
            actions.append(install_packages("install curl and gnupg to fetch NVIDIA's signing key", manager,
                                            ("ca-certificates", "curl", "gnupg"), lock_timeout=lock_timeout))
        actions += [RunCommand(f"fetch NVIDIA's repository key into {k}", Script(_FETCH_KEY.body, (KEY_URL, k),
                                                                               _FETCH_KEY.name), timeout=300,
                               creates=(k,))
                    for k in missing]
        if sources:
            notes.append("NVIDIA's toolkit repository is already configured in " + ", ".join(sorted({p for p, _ in
                                                                                                     sources})))
        else:
            actions.append(WriteFile(f"add NVIDIA's toolkit repository ({APT_LIST})", path=APT_LIST,
                                     after=APT_SOURCE, before=files.get(APT_LIST)))
    else:
        path = f"{m.repo_dir}/{REPO_FILE}"
        existing = rpm_repos(files, m.repo_dir)
        if existing:
            notes.append("NVIDIA's toolkit repository is already configured in " + ", ".join(existing))
        else:
            actions.append(WriteFile(f"add NVIDIA's toolkit repository ({path})", path=path,
                                     after=rpm_repo(manager == "zypper"), before=files.get(path)))
    if m.refresh_argv:
        actions.append(package_command("refresh the package lists" if manager == "apt" else
                                       "refresh the repository and accept NVIDIA's key", manager, m.refresh_argv,
                                       lock_timeout=lock_timeout, timeout=900))
    old = deprecated_sources(files)
    if old:
        notes.append("deprecated NVIDIA repositories still configured (" + ", ".join(old) + "): the toolkit now "
                     "comes from libnvidia-container; nvidia-docker2 is no longer needed")
    return actions, notes


# ---- versions ----------------------------------------------------------------------------------------------


def wanted_version(requested: str) -> str:
    """1.17.8 -> 1.17.8-1 (NVIDIA's packages always carry revision 1); a given revision is kept."""
    return requested if "-" in requested else f"{requested}-1"


def satisfied(pkg: Package | None, requested: str) -> bool:
    if pkg is None:
        return False
    return pkg.version == requested if "-" in requested else pkg.upstream == requested


def install_actions(manager: str, specs: list[tuple[str, str]], installed: Mapping[str, Package],
                    lock_timeout: float = 600.0) -> list[PackageCommand]:
    """Pinned installs, allowed to go down a version. yum's install cannot: its `downgrade` takes those."""
    from gpunode.actions.packages import package_command

    m = pkgmgr.get(manager)
    down = [(n, v) for n, v in specs if n in installed and compare_versions(installed[n].version, v) > 0]
    what = f"install the container toolkit {specs[0][1]}"
    names = [n for n, _ in specs]
    if manager == "yum" and down:
        up = [(n, v) for n, v in specs if (n, v) not in down]
        actions = [package_command(what + " (downgrade)", manager,
                                                 m.downgrade([m.spec(n, v) for n, v in down]),
                                                 packages=[n for n, _ in down], lock_timeout=lock_timeout)]
        return actions + ([package_command(what, manager, m.install([m.spec(n, v) for n, v in up]),
                                           packages=[n for n, _ in up], lock_timeout=lock_timeout)] if up else [])
    return [package_command(what, manager, m.install([m.spec(n, v) for n, v in specs], downgrade=True),
                            packages=names, lock_timeout=lock_timeout)]


_DEB_FILE = re.compile(r"^(?P<name>[a-z0-9][a-z0-9+.-]+)_(?P<version>[^_]+)_(?P<arch>[^_]+)\.deb$")
_RPM_FILE = re.compile(r"^(?P<name>.+)-(?P<version>[^-]+-[^-]+)\.(?P<arch>[^.]+)\.rpm$")


def parse_package_file(path: str) -> tuple[str, str, str] | None:
    """name_version_arch.deb or name-version-release.arch.rpm -> (name, version, "deb"|"rpm")."""
    base = posixpath.basename(path)
    for pattern, kind in ((_DEB_FILE, "deb"), (_RPM_FILE, "rpm")):
        match = pattern.match(base)
        if match:
            return match["name"], unquote(match["version"]), kind
    return None


def _offline(facts: Facts, options: Options, manager: str, installed: Mapping[str, Package]) -> StepPlan:
    kind = "deb" if manager == "apt" else "rpm"
    parsed = []
    for path in options.toolkit_packages:
        found = parse_package_file(path)
        if found is None:
            return blocked(NAME, f"cannot tell the package name and version from the file name {path}",
                           "name it as its package manager does: NAME_VERSION_ARCH.deb or NAME-VERSION-RELEASE.ARCH.rpm")
        if found[2] != kind:
            return blocked(NAME, f"{path} is a .{found[2]} package but {facts.os} uses {manager} (.{kind})",
                           f"bring the .{kind} files of the toolkit")
        parsed.append(found)
    if options.toolkit_version and any(n == PACKAGES[0] and upstream_version(v) !=
                                       upstream_version(wanted_version(options.toolkit_version)) for n, v, _ in parsed):
        return blocked(NAME, f"--toolkit-version {options.toolkit_version} disagrees with the package files given",
                       "drop --toolkit-version (the files decide) or bring files of that version")
    todo = [f"{n} {v}" for n, v, _ in parsed if not (n in installed and installed[n].version == v)]
    names = {n for n, _, _ in parsed}
    notes = [f"not among the files: {', '.join(p for p in PACKAGES if p not in names)}"] \
        if any(p not in names for p in PACKAGES) else []
    if not todo:
        return ok(NAME, "the toolkit packages given are installed: " + ", ".join(f"{n} {v}" for n, v, _ in parsed),
                  *notes)
    from gpunode.actions.packages import InstallLocalPackages

    return change(NAME, "offline install of " + ", ".join(todo),
                  [InstallLocalPackages("install the toolkit from the package files given", manager=manager,
                                        files=tuple(options.toolkit_packages), lock_timeout=options.lock_timeout)],
                  *notes).with_outputs(ToolkitOutputs(True, next((v for n, v, _ in parsed if n == PACKAGES[0]), None)))


def plan(facts: Facts, options: Options, earlier: Earlier | None = None) -> StepPlan:
    """The plan, with whether it installs the toolkit (and which version) as its outputs."""
    decided = _plan(facts, options)
    return decided if decided.outputs is not None else decided.with_outputs(ToolkitOutputs(False))


def _plan(facts: Facts, options: Options) -> StepPlan:
    if not facts.gpus and not options.bake:  # an image build installs it for the GPU it will boot with
        return ok(NAME, "no NVIDIA GPU on this node: the container toolkit is not needed")
    units = facts[package_facts.UNITS]
    survey = survey_engines(facts.tools, {name: u.exists for name, u in units.items()}, facts.files)
    embedded = k8s_facts.distribution(facts[k8s_facts.TOOLS], facts[k8s_facts.UNITS])  # k3s / RKE2 run containerd
    if not survey.present and not survey.rootless_docker and not facts.has("podman") and not options.toolkit_packages \
            and not (embedded and embedded.containerd_dir):
        return ok(NAME, "no container engine (docker, containerd, CRI-O, podman) on this node: nothing would use the "
                        "toolkit", "install an engine, then run again")
    manager = facts.os.package_manager
    if manager is None:
        return blocked(NAME, f"NVIDIA publishes the container toolkit for apt (Debian, Ubuntu), dnf/yum (RHEL "
                             f"family, Fedora, Amazon Linux) and zypper (SUSE); {facts.os} has none of them",
                       "install the toolkit by hand (github.com/NVIDIA/nvidia-container-toolkit/releases), then run "
                       "again with --skip toolkit")
    if facts.arch not in ARCHES:
        return blocked(NAME, f"NVIDIA's toolkit packages exist for x86_64 and aarch64, not {facts.arch}",
                       "run again with --skip toolkit if you installed it another way")
    installed = facts[package_facts.PKG_STATUS]
    if options.toolkit_packages:
        return _offline(facts, options, manager, installed)
    have = {p: installed.get(p) for p in PACKAGES}
    main = have[PACKAGES[0]]
    if options.toolkit_version:
        wanted = options.toolkit_version
        wrong = [p for p in PACKAGES if not satisfied(have[p], wanted)]
        if not wrong:
            return _held(facts, options, manager, ok(NAME, f"container toolkit {wanted} installed (all four packages)"),
                         [(p, have[p].version) for p in PACKAGES])  # type: ignore[union-attr]
        shown = ", ".join(f"{p} {have[p].version if have[p] else 'missing'}" for p in wrong)  # type: ignore[union-attr]
        reason = f"--toolkit-version {wanted}: {shown}"
        version = wanted_version(wanted)
    elif main is not None:
        wrong = [p for p in PACKAGES if have[p] is None or have[p].upstream != main.upstream]  # type: ignore[union-attr]
        if not wrong:
            return _held(facts, options, manager, ok(NAME, f"container toolkit {main.version} installed"),
                         [(p, have[p].version) for p in PACKAGES])  # type: ignore[union-attr]
        reason = (f"nvidia-container-toolkit {main.version} installed, but " + ", ".join(
            f"{p} {have[p].version if have[p] else 'is missing'}" for p in wrong)  # type: ignore[union-attr]
            + " (since 1.18 all four must match)")
        version = main.version
    else:
        reason, version = "nvidia-container-toolkit is not installed", ""
    from gpunode.actions.packages import InstallOffered, install_packages

    actions, notes = repo_actions(facts, manager, options.lock_timeout)
    query = offers_query(facts, manager) if options.driver_source == "packages" else None
    if query is not None:
        found = facts.answer(query)
        if found is None:
            notes.append(f"the version is read from the repository's metadata on the node ({query.name}) before "
                         "any change")
        else:
            decided = _offered(found, version, bool(options.toolkit_version))
            if isinstance(decided, StepPlan):
                return decided
            version, note = decided
            notes.append(note)
    if options.driver_source == "packages" and query is None and manager != "yum":
        # a repository already configured (a mirror, another channel): its versions are read from the package
        # manager's own lists after the refresh, by the install itself, and pinned (actions/packages.InstallOffered)
        notes.append("a toolkit repository is configured on the node already: the install refreshes it, reads the "
                     "versions it offers from the package manager's lists and pins " + (
                         f"{version} (refused before installing when not offered for all four)" if version else
                         "the newest offered for all four packages"))
        install: list[PackageCommand] = [InstallOffered(f"install the container toolkit {version or '(the newest the repository offers)'}",
                                  manager=manager, cmds=_offered_cmds(manager), packages=PACKAGES,
                                  lock_timeout=options.lock_timeout, version=version,
                                  again=fixes.same_run(options, "install"), option="toolkit_version")]
    elif version:
        install = install_actions(manager, [(p, version) for p in PACKAGES], installed, options.lock_timeout)
    else:
        install = [install_packages("install the container toolkit", manager, (PACKAGES[0],),
                                    lock_timeout=options.lock_timeout)]
    if query is not None:
        install[-1] = dataclasses.replace(install[-1], query=query)
    actions += install
    planned = change(NAME, reason, actions, *notes).with_outputs(ToolkitOutputs(True, version or None))
    return _held(facts, options, manager, planned, [(p, version) for p in PACKAGES], installing=True)


def _offered_cmds(manager: str) -> tuple[tuple[str, ...], ...]:
    """InstallOffered's refresh and unpinned install (the undo record and the lock wait read them)."""
    m = pkgmgr.get(manager)
    return (*((m.refresh_argv,) if m.refresh_argv else ()), m.install(PACKAGES))


def configured(facts: Facts, manager: str) -> bool:
    """Whether a repository pointing at libnvidia-container is configured on the node already."""
    if manager == "apt":
        return bool(apt_sources(facts.files))
    return bool(rpm_repos(facts.files, pkgmgr.get(manager).repo_dir))


def offers_query(facts: Facts, manager: str) -> Query[Offers] | None:
    """The read of NVIDIA's toolkit repository metadata (facts/offers.py) at the address the step is about to
    add, so the plan pins the exact version before the repository is added; None when a repository is already
    configured (it may be a mirror or another channel: the package manager decides from it)."""
    if configured(facts, manager):
        return None
    if manager == "apt":
        return offers.apt_flat(f"{REPO}/stable/deb/{versions.DEB_ARCHES[facts.arch]}", PACKAGES)
    return offers.rpm_md(f"{REPO}/stable/rpm/{facts.arch}", PACKAGES)


def _offered(found: Offers, version: str, requested: bool) -> tuple[str, str] | StepPlan:
    """(the exact version to install, a note) from what the repository offers, or the plan blocked before any
    change: the repository cannot be read, offers no version of all four packages, or not the one asked for."""
    fix_reach = (f"make {found.url} readable from the node (its network, or a proxy in the package manager's "
                 "configuration), or install from package files: --toolkit-package FILE, once per package file")
    if found.error:
        return dataclasses.replace(blocked(NAME, f"NVIDIA's toolkit repository cannot be read from the node: "
                                                 f"{found.error}", fix_reach), lasting=True)
    common = found.common(PACKAGES)
    if not common:
        return dataclasses.replace(blocked(NAME, f"NVIDIA's toolkit repository ({found.url}) offers no version of "
                                                 f"all four packages ({', '.join(PACKAGES)})", fix_reach),
                                   lasting=True)
    shown = ", ".join(common[:5]) + (", ..." if len(common) > 5 else "")
    if not version:
        return common[0], (f"NVIDIA's toolkit repository offers {common[0]} as its newest release of all four "
                           f"packages ({found.url}); the install pins it")
    if version in common:
        return version, f"NVIDIA's toolkit repository offers {version} for all four packages ({found.url})"
    what = "--toolkit-version" if requested else "the installed nvidia-container-toolkit"
    return dataclasses.replace(blocked(
        NAME, f"NVIDIA's toolkit repository does not offer {version} ({what}) for all four packages; it offers "
              f"{shown}", f"choose one it offers: --toolkit-version {common[0]}"), lasting=True)


def _held(facts: Facts, options: Options, manager: str, plan: StepPlan, specs: list[tuple[str, str]],
          installing: bool = False) -> StepPlan:
    """--driver-source packages: the toolkit's four packages are held like the driver's (apt-mark hold, dnf
    versionlock at their versions, zypper addlock; recorded, so `uninstall` releases them), so no upgrade moves
    them alone; --no-hold-driver leaves them free. Without a version (the repository's newest at install time)
    the hold names the packages: apt-mark and zypper hold names, versionlock locks the version installed."""
    if options.driver_source != "packages" or options.hold_driver is False:
        return plan
    installed = facts[package_facts.PKG_STATUS]
    held = held_packages(installed, facts[package_facts.PACKAGE_LOCKS])
    names = [n for n, _ in specs if installing or n not in held]
    if not names:
        return plan
    from gpunode.actions.packages import package_command, versionlock_plugin

    m = pkgmgr.get(manager)
    pinned = [(n, v) for n, v in specs if n in names and v]
    argv = m.hold_all(pinned) if len(pinned) == len(names) else (*m.hold_argv, *names)
    hold: list[Action] = [
        *versionlock_plugin(manager, installed, lock_timeout=options.lock_timeout),
        package_command(f"hold the container toolkit ({', '.join(names)}) like the driver's packages "
                        "(--driver-source packages)", manager, argv, packages=names, lock_timeout=options.lock_timeout)]
    if plan.status.value == "ok":
        return change(NAME, f"{plan.reason}; holding it like the driver's packages", hold,
                      *plan.notes).with_outputs(ToolkitOutputs(False))
    return dataclasses.replace(plan, actions=(*plan.actions, *hold))


STEP = Step(NAME, TITLE, plan)
