"""The NVIDIA .run installer: fetched and verified on the machine running gpunode, then uploaded into a root-only
directory on the node, checked again there (sha256) and run."""

from __future__ import annotations

import os
from dataclasses import dataclass

from gpunode import cancel, fixes
from gpunode.actions.base import Action, Looks, command_line
from gpunode.actions.packages import PackageCommand
from gpunode.artifacts import ProgressBars, silent
from gpunode.artifacts.makeself import read_header
from gpunode.artifacts.source import Source, Verified, obtain
from gpunode.connection.base import TEMP_PARENT, Connection, DiskFree, megabytes
from gpunode.errors import CommandError
from gpunode.facts.transaction import Query, Transaction
from gpunode.records import DriverRecord, UndoRecord
from gpunode.shell import Script

LOG = "/var/log/nvidia-installer.log"
WORK_PARENT = TEMP_PARENT  # /var/tmp, not /tmp: often a small tmpfs, and the extracted driver is ~1 GB
INSTALL_TIMEOUT = 3600.0  # a DKMS build of the module takes minutes on small VMs

def _mb(size: int) -> str:
    return f"{size / 1e6:.0f} MB" if size >= 1e6 else f"{size / 1e3:.0f} kB"


@dataclass(frozen=True, eq=False, repr=False)
class FetchInstaller(Action):
    """Runs on the machine running gpunode: download (or reuse) and verify the .run. Nothing touches the node."""

    source: Source | None = None
    local_size: int | None = None  # known size of the file already here (cache or --driver-run)
    progress: ProgressBars | None = None  # the CLI's progress displays; None: silent

    kind = "download"
    where = "control"

    def details(self) -> list[str]:
        assert self.source is not None
        src = self.source
        checks = "sha256 against " + ("--sha256" if src.sha256 else "NVIDIA's published .sha256sum when there is one")
        checks += ", and the makeself archive's own checksums (as `sh FILE --check`), here, without running it"
        if src.local:
            lines = [f"use {src.local}" + (f" ({_mb(self.local_size)})" if self.local_size else "")]
        elif self.local_size is not None:
            lines = [f"cached: {src.cache} ({_mb(self.local_size)})"]
        else:
            lines = [f"download {src.urls[0]}", *(f"  or {u}" for u in src.urls[1:]),
                     f"  into {src.cache} (resumable)"]
        return [*lines, f"verify {checks}"]

    def to_dict(self) -> dict[str, object]:
        assert self.source is not None
        return {**super().to_dict(), "urls": list(self.source.urls), "local": self.source.local,
                "cache": self.source.cache, "cached": self.local_size is not None and not self.source.local,
                "size": self.local_size, "sha256": self.source.sha256}

    def apply(self, conn: Connection) -> str | None:
        assert self.source is not None
        verified = obtain(self.source, progress=self.progress)
        return f"{verified.path}: {', '.join(verified.checks)}"


# Runs on the node as root: check the uploaded file is the verified one (a loaded driver was unloaded by the
# UnloadModules action the plan shows before this one), run the installer with TMPDIR on disk, and on failure print its output
# and log tail. The work directory (root-only, from make_private_dir) is removed either way.
_INSTALL = r"""dir=$1; run=$2; want=$3; log=$4; key=$5; cert=$6; shift 6
trap 'rm -rf -- "$dir"' EXIT
# an empty $want: the upload already checked what arrived against the verified hash (no second read of the file)
[ -z "$want" ] || { got=$(sha256sum -- "$dir/$run" 2>/dev/null); got=${got%% *}; }
if [ -n "$want" ] && [ "$got" != "$want" ]; then
  echo "gpunode: the uploaded installer has sha256 ${got:-?}, not the verified $want: nothing was run" >&2
  exit 90
fi
for f in "$key" "$cert"; do
  if [ -n "$f" ] && [ ! -r "$f" ]; then echo "gpunode: module signing file $f is not readable on the node" >&2; exit 91; fi
done
cd "$dir" || exit 92
# SETUP_NOCHECK=1: makeself's own CRC and MD5 pass would read the whole file on the node once more. These are the
# bytes whose sha256 and makeself checksums (`sh FILE --check`) were verified where gpunode runs, and they
# arrived with that sha256 (checked above or by the upload): the node's check could only repeat that answer.
SETUP_NOCHECK=1 TMPDIR=$dir sh "./$run" "$@" > "$dir/installer.out" 2>&1
rc=$?
if [ "$rc" -ne 0 ]; then
  tail -n 25 "$dir/installer.out" >&2
  if [ -r "$log" ]; then echo "gpunode-log-tail: $log" >&2; tail -n 40 "$log" >&2; fi
fi
exit "$rc"
"""


# what makeself (its disk space check before unpacking) and tar print when the extraction directory is full
_NO_ROOM = ("Not enough space left in", "No space left on device")


def space_problem(conn: Connection, run: str | os.PathLike[str], name: str, unpacked: int | None = None
                  ) -> tuple[str, str] | None:
    """(error, fix) when the node has less room under WORK_PARENT than the .run at `run` and what it unpacks to
    need (read-only: df on the node, the makeself header here); None when there is room or df cannot say."""
    if unpacked is None:
        kb = read_header(run).unpacked_kb
        unpacked = kb * 1024 if kb is not None else None
    if unpacked is None:
        return None
    sized = Verified(str(run), "", os.path.getsize(run), (), unpacked)
    room = conn.disk_free(WORK_PARENT)
    if room is None or room.available >= _needed(sized):
        return None
    return (f"{conn.name}: not enough disk space for the NVIDIA installer in {WORK_PARENT}: {room.describe()}, "
            f"{name} needs {_space(sized)}", _free_fix(room, sized))


def _needed(verified: Verified) -> int:
    """Bytes the install takes under WORK_PARENT: the uploaded .run and what it unpacks to."""
    return verified.size + (verified.unpacked or 0)


def _space(verified: Verified) -> str:
    unpacked = f", {megabytes(verified.unpacked)} unpacked" if verified.unpacked is not None else ""
    return f"{megabytes(_needed(verified))} ({megabytes(verified.size)} uploaded{unpacked})"


def _free_fix(room: DiskFree | None, verified: Verified) -> str:
    where = f"on {room.mount} " if room else ""
    short = f"{megabytes(_needed(verified) - room.available)} more " if room and room.available < _needed(verified) else ""
    return (f"free {short}space {where}(see: df -h {WORK_PARENT}; e.g. sudo apt-get clean, or remove old files under "
            f"{WORK_PARENT}), then run the same command again")


def explain_failure(output: str) -> tuple[str, str]:
    """(what went wrong, the fix) from the installer's output and log tail (data/installer_failures.csv and the
    other explain tables), else a pointer at the log. The explain tables load only here: an install whose
    installer succeeds (or that has nothing to install) never reads them."""
    from gpunode.explain import installer_failure

    return installer_failure(output) or (
        "the NVIDIA installer failed",
        f"read {LOG} on the node (its tail is above), fix the cause and run the same command again")


@dataclass(frozen=True, eq=False, repr=False)
class RunInstaller(Action):
    """Upload the verified .run into a root-only directory on the node and run it there."""

    source: Source | None = None
    flags: tuple[str, ...] = ()
    signing_key: str = ""
    signing_cert: str = ""
    progress: ProgressBars | None = None  # the CLI's progress displays; None: silent

    kind = "driver-install"

    def commands(self) -> list[str]:
        assert self.source is not None
        return [command_line(("sh", self.source.name, *self.flags))]

    restore_modules: tuple[str, ...] = ()  # modules unloaded for this install: loaded again if it fails
    restore_units: tuple[str, ...] = ()  # services stopped for this install: started again if it fails

    def details(self) -> list[str]:
        assert self.source is not None
        lines = [f"upload {self.source.name} into a root-only directory under {WORK_PARENT}, check its sha256 on "
                 "the node, then run the installer there"]
        if self.restore_units or self.restore_modules:
            lines.append("if it fails: load the driver on disk again (" + " ".join(self.restore_modules or ("nvidia",))
                         + ")" + (f" and start {', '.join(self.restore_units)} again" if self.restore_units else ""))
        return lines

    def to_dict(self) -> dict[str, object]:
        return {**super().to_dict(), "flags": list(self.flags), "log": LOG}

    def apply(self, conn: Connection) -> str | None:
        return self._apply(conn, Looks())

    def _apply(self, conn: Connection, looks: Looks) -> str | None:
        """apply(), with `looks` riding in the installer's own command."""
        assert self.source is not None
        verified = obtain(self.source, progress=self.progress)  # the file uploaded is the file verified
        problem = space_problem(conn, verified.path, self.source.name, verified.unpacked)
        if problem is not None:
            raise CommandError(f"{problem[0]}; nothing was changed", fix=problem[1])
        workdir = conn.make_private_dir(WORK_PARENT)
        try:
            with (self.progress or silent)(f"upload {self.source.name}") as report:
                # the node's copy must have the verified sha256 (so the file is read here once, only to send it)
                arrived = conn.upload(verified.path, f"{workdir}/{self.source.name}", mode=0o700, progress=report,
                                      sha256=verified.sha256)
            if arrived != verified.sha256:  # the local file changed after it was verified
                raise CommandError(f"the uploaded installer has sha256 {arrived}, not the verified {verified.sha256}: "
                                   "nothing was run", fix="the upload was altered or truncated: run again")
            # a stop asked for during the upload (Ctrl-C, SIGTERM) ends here, before the installer changes anything
            cancel.checkpoint(f"running {self.source.name}")
        except BaseException:
            conn.run(Script('rm -rf -- "$1"', (workdir,), "cleanup"), sudo=True, timeout=60)
            raise
        # the node's copy is the verified file (its hash checked on arrival): the install script need not hash it
        script = Script(_INSTALL, (workdir, self.source.name, "", LOG, self.signing_key,
                                   self.signing_cert, *self.flags), "driver-install")
        result = looks.run(conn, script, sudo=True, timeout=INSTALL_TIMEOUT)
        if result.timed_out:
            raise CommandError(f"the NVIDIA installer did not finish within {INSTALL_TIMEOUT:.0f}s",
                               fix=f"look at {LOG} on the node; it may still be building", stderr=result.stderr)
        if not result.ok:
            output = result.stdout + "\n" + result.stderr
            if result.exit_code == 90:
                raise CommandError(result.stderr.strip(), fix="the upload was altered or truncated: run again")
            meaning, fix = explain_failure(output)
            if any(sign in output for sign in _NO_ROOM):  # makeself's own check, or tar's ENOSPC while unpacking
                room = conn.disk_free(WORK_PARENT)
                meaning = (f"the disk filled up while it unpacked in {WORK_PARENT}: "
                           + (f"{room.describe()} now, " if room else "") + f"{self.source.name} needs {_space(verified)}")
                fix = _free_fix(room, verified)
            tail = "\n".join(line for line in result.stderr.strip().splitlines()[-30:])
            restored = restore(conn, self.restore_modules, self.restore_units)
            raise CommandError(f"the NVIDIA installer failed (exit {result.exit_code}): {meaning}\n"
                               f"installer log: {LOG}\n{tail}" + (f"\n{restored}" if restored else ""), fix=fix,
                               stdout=result.stdout, stderr=result.stderr, exit_code=result.exit_code)
        return f"installed from {verified.path} (sha256 {verified.sha256[:16]}...); installer log: {LOG}"

    def apply_recorded(self, conn: Connection) -> tuple[str | None, list[UndoRecord]]:
        """For `gpunode uninstall`: the .run driver version in place before (None: none) and the one installed."""
        looks = Looks(before=(("driver",),), after=(("driver",),))
        note = self._apply(conn, looks)
        (seen,), (seen_after,) = looks.answers()
        before, after = (seen or {}).get("driver"), (seen_after or {}).get("driver")
        return note, [DriverRecord(version=after if after and after != "-" else None,
                                   previous=None if before == "-" else before or "unknown")]

# ---------------------------------------------------------------------------------------------------------
# replacing a loaded driver: stop the GPU services, unload the modules, (install), load, start them again
# ---------------------------------------------------------------------------------------------------------

# Unloads each loaded module of $@ in order; prints `stays MODULE` for one that will not unload (in use).
_UNLOAD = r"""for m; do
  grep -q "^$m " /proc/modules || continue
  modprobe -r "$m" >/dev/null 2>&1 || rmmod "$m" >/dev/null 2>&1 || echo "stays $m"
done
true
"""
# Best effort after a failure: load the driver on disk again, start the services again (in order).
_RESTORE = r"""mods=$1; shift
for m in $mods; do modprobe "$m" >/dev/null 2>&1 || echo "not loaded: $m"; done
for u; do systemctl start "$u" >/dev/null 2>&1 && echo "started: $u" || echo "not started: $u"; done
true
"""


def restore(conn: Connection, modules: tuple[str, ...], units: tuple[str, ...]) -> str:
    """After a failed unload or install: the driver on disk loaded again and the stopped services started
    again, as far as they go. Returns what happened, for the error message ("" when there was nothing to do)."""
    if not modules and not units:
        return ""
    loads = tuple(m for m in ("nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm", "nvidia_peermem") if m in modules)
    result = conn.run(Script(_RESTORE, (" ".join(loads), *units), "restore-gpu-services"), sudo=True, timeout=600)
    lines = result.stdout.split("\n")
    started = [ln.split(": ", 1)[1] for ln in lines if ln.startswith("started: ")]
    missing = [ln.split(": ", 1)[1] for ln in lines if ln.startswith(("not started: ", "not loaded: "))]
    words = []
    if started:
        words.append("started again: " + ", ".join(started))
    if missing:
        words.append("could not restore: " + ", ".join(missing) + " (the next run starts the services gpunode "
                     "stopped: its journal keeps them owed)")
    return "; ".join(words)


@dataclass(frozen=True, eq=False, repr=False)
class StopGpuServices(Action):
    """systemctl stop, in order; each is owed a start (journal) until a later action starts it again."""

    units: tuple[str, ...] = ()
    owed: tuple[str, ...] | None = None  # the ones owed a start; None: all (enabled ones start at a reboot anyway)

    kind = "service"

    def commands(self) -> list[str]:
        return [command_line(("systemctl", "stop", u)) for u in self.units]

    def deferred(self) -> tuple[tuple[str, str], ...]:
        return tuple(("start", u) for u in (self.units if self.owed is None else self.owed))

    def to_dict(self) -> dict[str, object]:
        return {**super().to_dict(), "units": list(self.units)}

    def apply(self, conn: Connection) -> str | None:
        for unit in self.units:
            result = conn.run(("systemctl", "stop", unit), sudo=True, timeout=300)
            if not result.ok:
                stopped = self.units[:self.units.index(unit)]
                restored = restore(conn, (), tuple(reversed(stopped)))
                raise CommandError(f"could not stop {unit}: " + (result.stderr.strip() or f"exit {result.exit_code}")
                                   + (f"\n{restored}" if restored else ""),
                                   fix="`" + fixes.on_node(f"systemctl status {unit}")
                                   + "` says why; stop it yourself, then run again",
                                   stderr=result.stderr, exit_code=result.exit_code)
        return None


@dataclass(frozen=True, eq=False, repr=False)
class UnloadModules(Action):
    """Unload the loaded nvidia modules, each before the module it uses. One that will not unload: fine when
    the plan predicted it (`may_stay`: the new driver loads at the reboot), else the services stopped before are
    started again and the step fails, naming it."""

    modules: tuple[str, ...] = ()
    may_stay: tuple[str, ...] = ()  # predicted to stay loaded (nvidia_drm with DRM clients): reboot planned
    restore_units: tuple[str, ...] = ()  # services stopped for this: started again if the unload fails

    kind = "modules"

    def script(self) -> Script:
        return Script(_UNLOAD, self.modules, "unload-nvidia-modules")

    def commands(self) -> list[str]:
        return [command_line(self.script())]

    def to_dict(self) -> dict[str, object]:
        return {**super().to_dict(), "modules": list(self.modules), "may_stay": list(self.may_stay)}

    def apply(self, conn: Connection) -> str | None:
        result = conn.run(self.script(), sudo=True, timeout=300)
        result.check(self.summary)
        stays = [ln.split()[1] for ln in result.stdout.splitlines() if ln.startswith("stays ")]
        if not stays:
            return None
        if self.may_stay:  # the plan installs with the old driver loaded and reboots
            return f"still loaded: {', '.join(stays)} (the new driver loads at the reboot)"
        users = conn.run(("lsmod",), sudo=False, timeout=60).stdout
        used = [ln for ln in users.splitlines() if ln.split()[:1] and ln.split()[0] in stays]
        restored = restore(conn, self.modules, self.restore_units)
        raise CommandError(f"{', '.join(stays)} would not unload: something the plan did not see holds it"
                           + ("\n" + "\n".join(used) if used else "") + (f"\n{restored}" if restored else ""),
                           fix="find what holds the GPU (`" + fixes.on_node("sudo fuser -v /dev/nvidia*") + "`, `"
                               + fixes.on_node("nvidia-smi") + "`), stop it, then run the same command again; or "
                               "reboot and run it again")


@dataclass(frozen=True, eq=False, repr=False)
class StartGpuServices(Action):
    """systemctl start, in order: the services stopped for the install (or owed since an earlier run)."""

    units: tuple[str, ...] = ()

    kind = "service"

    def commands(self) -> list[str]:
        return [command_line(("systemctl", "start", u)) for u in self.units]

    def settles(self) -> tuple[tuple[str, str], ...]:
        return tuple(("start", u) for u in self.units)

    def to_dict(self) -> dict[str, object]:
        return {**super().to_dict(), "units": list(self.units)}

    def apply(self, conn: Connection) -> str | None:
        failed = []
        for unit in self.units:
            result = conn.run(("systemctl", "start", unit), sudo=True, timeout=300)
            if not result.ok:
                failed.append(f"{unit}: {result.stderr.strip() or f'exit {result.exit_code}'}")
        if failed:
            raise CommandError("could not start again: " + "; ".join(failed),
                               fix="`" + fixes.on_node(f"journalctl -u {failed[0].split(':')[0]}")
                               + "` says why; fix it and run again")
        return None


@dataclass(frozen=True, eq=False, repr=False)
class InstallDriverPackages(PackageCommand):
    """--driver-source packages: the route's packages at their exact versions in one transaction (DKMS, where the
    route builds, runs in their post-install scripts). Records what the transaction added (PackagesRecord, so
    `uninstall` purges exactly those) and the driver it put in place with its source."""

    version: str = ""
    previous: str | None = None
    # the package manager's simulation of the install command (facts/transaction.py), asked before the first
    # change so the plan lists every package the transaction would change (preflight.plan_asking)
    query: Query[Transaction] | None = None
    route: tuple[str, ...] = ()  # every package of the route as NAME=VERSION (recorded on the DriverRecord)

    kind = "driver-packages"

    def apply_recorded(self, conn: Connection) -> tuple[str | None, list[UndoRecord]]:
        note, records = super().apply_recorded(conn)
        return note, [*records, DriverRecord(version=self.version, previous=self.previous, source="packages",
                                                    packages=self.route)]
