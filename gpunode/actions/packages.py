"""Package-manager actions. Every command runs inside the lock wait of gpunode/pkgmgr.py, for at most
--lock-timeout seconds, so a node busy with unattended-upgrades, cloud-init or another dnf does not fail at once.

`commands()` shows the package-manager command lines themselves; `lock_timeout` in to_dict says how long each
may wait for the lock first.
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Container
from dataclasses import dataclass
from typing import Any

from gpunode import fixes, pkgmgr
from gpunode.actions.base import Action, Answer, Looks, command_line
from gpunode.connection.base import Connection, Result
from gpunode.errors import CommandError
from gpunode.facts.transaction import Query
from gpunode.records import FileRecord, HoldRecord, PackagesRecord, UndoRecord
from gpunode.shell import Cmd, Script, to_argv

LOCK_POLL_SECONDS = 5.0

_REMOVE_DIR = Script(name="remove-dir", body='rm -rf -- "$1"')


def run_locked(conn: Connection, cmd: Cmd, lock_timeout: float, timeout: float, manager: str,
               looks: Looks | None = None, *, first: bool = True, last: bool = True) -> tuple[Result, str]:
    """Run one package-manager command, waiting for the package lock. (result, note about the wait). `looks`:
    undo looks that ride in this command (before it if `first`, after it if `last`)."""
    script = Script(pkgmgr.LOCKED_RUN, (str(int(lock_timeout)), str(LOCK_POLL_SECONDS), *to_argv(cmd)),
                    pkgmgr.LOCKED_RUN_NAME)
    result = (looks or Looks()).run(conn, script, sudo=True, timeout=lock_timeout + timeout, first=first, last=last)
    lines = result.stderr.splitlines()
    waits = [line.split(":", 1)[1].strip() for line in lines if line.startswith(pkgmgr.LOCK_WAIT_PREFIX)]
    if result.exit_code == pkgmgr.LOCK_TIMEOUT_EXIT:
        holder = next((line.split(":", 1)[1].strip() for line in lines
                       if line.startswith(pkgmgr.LOCK_TIMEOUT_PREFIX)), "unknown holder")
        raise CommandError(f"the {manager} lock is still held after {lock_timeout:.0f}s: {holder}",
                           fix=pkgmgr.LOCK_FIX, stdout=result.stdout, stderr=result.stderr,
                           exit_code=pkgmgr.LOCK_TIMEOUT_EXIT)
    return result, f"waited for the package lock ({waits[-1]})" if waits else ""


@dataclass(frozen=True, eq=False, repr=False)
class PackageCommand(Action):
    """Package-manager commands run in order, each after waiting for the package lock. A metadata refresh
    followed by more commands may fail (one broken repository) without stopping the rest."""

    manager: str = "apt"
    cmds: tuple[Cmd, ...] = ()
    packages: tuple[str, ...] = ()  # the packages it installs, removes or holds
    lock_timeout: float = 600.0
    timeout: float = 1800.0  # for each command, once the lock is free
    # a read-only question the plan asks the node before the first change (preflight.plan_asking): what the
    # repository offers (facts/offers.py), so the plan pins the exact version that will land
    query: Query[Any] | None = None

    kind = "packages"

    def commands(self) -> list[str]:
        return [command_line(c) for c in self.cmds]

    def to_dict(self) -> dict[str, object]:
        return {**super().to_dict(), "manager": self.manager, "packages": list(self.packages),
                "lock_timeout": self.lock_timeout}

    def apply(self, conn: Connection) -> str | None:
        return self._apply(conn, Looks())

    def _apply(self, conn: Connection, looks: Looks) -> str | None:
        """apply(), with `looks` riding in the first and the last command."""
        notes: list[str] = []
        for i, cmd in enumerate(self.cmds):
            self._run(conn, cmd, looks, notes, first=i == 0, last=i == len(self.cmds) - 1)
        return "; ".join(notes) or None

    def _run(self, conn: Connection, cmd: Cmd, looks: Looks, notes: list[str], *, first: bool,
             last: bool) -> None:
        """One command of the action under the package manager's lock (its wait noted in `notes`): a refresh
        that fails with more to come is noted and passed; any other failure is raised with the cause and fix."""
        result, waited = run_locked(conn, cmd, self.lock_timeout, self.timeout, self.manager, looks,
                                    first=first, last=last)
        if waited:
            notes.append(waited)
        argv = to_argv(cmd)
        if result.timed_out:
            result.check(self.summary)
        if not result.ok and pkgmgr.get(self.manager).is_refresh(argv) and not last:
            notes.append(f"`{shlex.join(argv)}` reported errors (a broken repository?); going on")
            return
        if not result.ok:
            message, fix = pkgmgr.explain_failure(result.stdout + "\n" + result.stderr, shlex.join(argv),
                                                  result.exit_code)
            raise CommandError(message, fix=fix, stdout=result.stdout, stderr=result.stderr,
                               exit_code=result.exit_code)

    def apply_recorded(self, conn: Connection) -> tuple[str | None, list[UndoRecord]]:
        """Installs record the packages that appeared; holds the holds gpunode placed (a hold already there is
        not gpunode's); a repository added (`config-manager --add-repo`, cuda-keyring's `dpkg -i` script) also
        the repository files it created."""
        m = pkgmgr.get(self.manager)
        argvs = [to_argv(c) for c in self.cmds]
        if any(a[:len(m.hold_argv)] == m.hold_argv for a in argvs):
            looks = Looks(before=(HOLDS,), after=(HOLDS,))
            note = self._apply(conn, looks)
            return note, held_records(self.manager, *looks.answers())
        adds_repo = any(isinstance(c, Script) for c in self.cmds) or (
            m.add_repo_argv is not None and any(a[:len(m.add_repo_argv)] == m.add_repo_argv for a in argvs))
        if not adds_repo and not any(a[:len(m.install_argv)] == m.install_argv for a in argvs):
            return self.apply(conn), []
        repo = (("dir", m.repo_dir),) if adds_repo else ()
        looks = Looks(before=(PACKAGES, *repo), after=(PACKAGES, *repo))
        note = self._apply(conn, looks)
        (packages, *dirs), (packages_after, *dirs_after) = looks.answers()
        records = installed_records(self.manager, [packages], [packages_after])
        before, after = (dirs[0], dirs_after[0]) if adds_repo else (None, None)
        for path, digest in sorted((after or {}).items()):
            if before is not None and path not in before and digest != "-":
                records.append(FileRecord(path=path, existed=False, sha256=digest, repository=True))
        return note, records


@dataclass(frozen=True, eq=False, repr=False)
class InstallOffered(PackageCommand):
    """Install `packages` at one version every one of them is offered at, read from the package manager's own
    lists after its refresh (a repository already configured: a mirror, another channel, whose versions gpunode
    cannot read before): `version` when asked (refused, before the install, when not offered for all of them),
    else the newest they share. `cmds` is the refresh and the unpinned install; the version goes in at apply."""

    version: str = ""
    # this run's gpunode command and the option (an Options field) that names the version: refused, the fix is that
    # command with the option set to a version the lists offer
    again: fixes.Fix | None = None
    option: str = ""

    def commands(self) -> list[str]:
        from gpunode.facts.offers import lists_command

        m = pkgmgr.get(self.manager)
        shown = self.version or "<newest offered for all>"
        refresh = [command_line(m.refresh_argv)] if m.refresh_argv else []
        return [*refresh, "sudo " + lists_command(self.manager, self.packages) + "  # read-only: the version to pin",
                command_line(m.install([m.spec(n, shown) for n in self.packages], downgrade=True))]

    def to_dict(self) -> dict[str, object]:
        return {**super().to_dict(), "version": self.version or None}

    def _apply(self, conn: Connection, looks: Looks) -> str | None:
        from gpunode.facts.offers import lists_command, parse_lists

        m = pkgmgr.get(self.manager)
        notes: list[str] = []
        if m.refresh_argv:
            self._run(conn, m.refresh_argv, looks, notes, first=True, last=False)
        listing = conn.run(Script("LC_ALL=C " + lists_command(self.manager, self.packages), name="read-lists"), sudo=True,
                           timeout=self.timeout)
        offered = parse_lists(listing.stdout)
        common = offered.common(self.packages)
        have = "; ".join(f"{n}: {', '.join(offered.versions.get(n, ())[:6]) or 'none'}" for n in self.packages)
        if self.version and self.version not in common or not common:
            what = f"{self.version} of" if self.version else "one version of all of"
            fix = (fixes.with_options(self.again, **{self.option: common[0]}) + "  # a version they offer"
                   if common and self.again is not None and self.option else
                   f"check the repository configured on the node (`{lists_command(self.manager, self.packages)}` "
                   "lists what it offers)")
            raise CommandError(f"the configured repositories do not offer {what} {', '.join(self.packages)} "
                               f"(offered: {have})", fix=fix, stdout=listing.stdout, stderr=listing.stderr,
                               exit_code=listing.exit_code)
        version = self.version or common[0]
        argv = m.install([m.spec(n, version) for n in self.packages], downgrade=True)
        self._run(conn, argv, looks, notes, first=not m.refresh_argv, last=True)
        notes.append(f"installed {version}, " + ("as asked" if self.version else
                                                 "the newest the configured repositories offer for all of them"))
        return "; ".join(notes)


HOLDS: tuple[str, ...] = ("holds",)  # the undo look at the held packages
PACKAGES: tuple[str, ...] = ("packages",)  # the undo look at the installed packages


def held_records(manager: str, before: list[Answer], after: list[Answer]) -> list[UndoRecord]:
    """From the looks at the held packages before and after a hold (HOLDS): the holds that appeared are gpunode's,
    so `gpunode uninstall` releases them (and only them)."""
    if before[0] is None or after[0] is None:
        return [HoldRecord(manager=manager, unknown=True)]
    new = tuple(sorted(name for name in after[0] if name not in before[0]))
    return [HoldRecord(manager=manager, held=new)] if new else []


def installed_records(manager: str, before: list[Answer], after: list[Answer]) -> list[UndoRecord]:
    """From the looks at the installed packages before and after a transaction (PACKAGES): what appeared is what
    it installed (dependencies too); a package there before is never recorded, so never removed by uninstall."""
    if before[0] is None or after[0] is None:
        return [PackagesRecord(manager=manager, unknown=True)]
    was = before[0]
    new = tuple(sorted((name, version) for name, version in after[0].items() if name not in was))
    return [PackagesRecord(manager=manager, installed=new)] if new else []


def package_command(summary: str, manager: str, *cmds: Cmd, packages: tuple[str, ...] | list[str] = (),
                    lock_timeout: float = 600.0, timeout: float = 1800.0) -> PackageCommand:
    return PackageCommand(summary, manager=manager, cmds=cmds, packages=tuple(packages), lock_timeout=lock_timeout,
                          timeout=timeout)


def install_packages(summary: str, manager: str, packages: tuple[str, ...] | list[str], *,
                     lock_timeout: float = 600.0, refresh: bool = False) -> PackageCommand:
    """Install packages from the configured repositories (after refreshing the metadata, if asked and the
    manager needs it)."""
    m = pkgmgr.get(manager)
    cmds = [m.refresh_argv] if refresh and m.refresh_argv else []
    return package_command(summary, manager, *cmds, m.install(tuple(packages)), packages=packages,
                           lock_timeout=lock_timeout)


def versionlock_plugin(manager: str, installed: Container[str], *, lock_timeout: float = 600.0) -> list[PackageCommand]:
    """What must come before a hold with this manager: its versionlock plugin installed when it has one and
    `installed` (the names the node has) lacks it; nothing otherwise."""
    plugin = pkgmgr.get(manager).versionlock_plugin
    if not plugin or plugin in installed:
        return []
    return [install_packages(f"install the {manager} versionlock plugin", manager, (plugin,),
                             lock_timeout=lock_timeout)]


@dataclass(frozen=True, eq=False, repr=False)
class InstallLocalPackages(Action):
    """Offline install: copy the given package files into a private directory on the node, install them there
    in one transaction (so they satisfy each other's dependencies), then remove the copies."""

    manager: str = "apt"
    files: tuple[str, ...] = ()  # paths on the machine gpunode runs on
    lock_timeout: float = 600.0

    kind = "local-packages"
    PLACEHOLDER = "<private dir>"  # made by mktemp when the action runs

    def remote_argv(self, directory: str) -> tuple[str, ...]:
        return pkgmgr.get(self.manager).install_files(tuple(f"{directory}/{posixpath.basename(f)}"
                                                            for f in self.files))

    def commands(self) -> list[str]:
        return [command_line(self.remote_argv(self.PLACEHOLDER))]

    def details(self) -> list[str]:
        return [f"upload {f} to {self.PLACEHOLDER}/ (a root-only directory made on the node)" for f in self.files]

    def to_dict(self) -> dict[str, object]:
        return {**super().to_dict(), "manager": self.manager, "files": list(self.files),
                "lock_timeout": self.lock_timeout}

    def apply(self, conn: Connection) -> str | None:
        return self._apply(conn, Looks())

    def _apply(self, conn: Connection, looks: Looks) -> str | None:
        directory = conn.make_private_dir()
        try:
            for path in self.files:
                conn.upload(path, f"{directory}/{posixpath.basename(path)}")
            result, waited = run_locked(conn, self.remote_argv(directory), self.lock_timeout, 1800, self.manager,
                                        looks)
            result.check(self.summary)
        finally:
            conn.run(Script(_REMOVE_DIR.body, (directory,), _REMOVE_DIR.name), sudo=True, timeout=60)
        return waited or None

    def apply_recorded(self, conn: Connection) -> tuple[str | None, list[UndoRecord]]:
        looks = Looks(before=(PACKAGES,), after=(PACKAGES,))
        note = self._apply(conn, looks)
        return note, installed_records(self.manager, *looks.answers())
