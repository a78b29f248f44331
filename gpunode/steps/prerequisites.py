"""Step 2: what the NVIDIA installer needs to build its kernel module: gcc, make, dkms and the kernel headers
for the RUNNING kernel (`linux-headers-$(uname -r)` / `kernel-devel-$(uname -r)`).

Headers for another kernel are useless (the module is built for the running one), and headers the
repositories no longer carry make the step `blocked` with the fix rather than fail half-way. On a fresh cloud
VM apt/dpkg is often busy with unattended-upgrades or cloud-init: the install waits for the lock (up to
--lock-timeout) and names the holder instead of failing on the first "Could not get lock".
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from gpunode.connection.base import Connection
from gpunode.errors import CommandError
from gpunode.facts import Facts
from gpunode.facts import kernel as kernel_facts
from gpunode.facts import packages as package_facts
from gpunode.options import Options
from gpunode.plan import Action, StepPlan, blocked, change, ok
from gpunode.shell import Script, display
from gpunode.steps.base import Step

NAME = "prerequisites"
TITLE = "Build prerequisites for the driver"
LOCK_POLL_SECONDS = 5.0

# Where dkms comes from on the RHEL family: EPEL. The release package that enables it, per distribution.
_EPEL = {"rocky": "epel-release", "almalinux": "epel-release", "centos": "epel-release",
         "ol": "oracle-epel-release-el{major}"}


def wants_driver(options: Options) -> bool:
    return bool(options.driver or options.driver_run)


@dataclass(frozen=True)
class Availability:
    """What the package manager could install, from its local metadata. `known` False: could not tell."""

    known: bool
    available: frozenset[str] = frozenset()
    missing: frozenset[str] = frozenset()
    installed: frozenset[str] = frozenset()


def parse_available(text: str | None, kernel: str = "") -> Availability:
    """Probe lines `avail NAME` / `missing NAME` (apt: apt-cache policy per package), `dnf NAME.ARCH VERSION REPO`
    (dnf's cached list of available packages) and `installed NAME`. Neither: the metadata could not tell."""
    if text is None:
        return Availability(False)
    found: dict[str, set[str]] = {"avail": set(), "missing": set(), "installed": set()}
    offered: set[tuple[str, str]] = set()
    for line in text.splitlines():
        word, _, rest = line.strip().partition(" ")
        if word in found and rest.strip():
            found[word].add(rest.strip())
        elif word == "dnf" and len(rest.split()) >= 2:
            name_arch, version = rest.split()[:2]
            offered.add((name_arch.rsplit(".", 1)[0], version.split(":")[-1]))
    if offered:
        running = kernel.rsplit(".", 1)[0] if re.search(r"\.(x86_64|aarch64)$", kernel) else kernel
        names = {name for name, _ in offered}
        for wanted in ("gcc", "make", "dkms"):
            found["avail" if wanted in names else "missing"].add(wanted)
        found["avail" if ("kernel-devel", running) in offered else "missing"].add(f"kernel-devel-{kernel}")
    return Availability(bool(found["avail"] or found["missing"]), frozenset(found["avail"]),
                        frozenset(found["missing"] - found["avail"]), frozenset(found["installed"]))


def headers_present(facts: Facts) -> bool:
    """/lib/modules/$(uname -r)/build (what DKMS and nvidia-installer look for) or /usr/src/kernels/$(uname -r)
    on the RHEL family exists (kernel.HEADERS)."""
    return bool(facts[kernel_facts.HEADERS])


def package_manager(facts: Facts) -> str | None:
    if facts.os.family == "debian" or facts.has("apt-get"):
        return "apt"
    if facts.os.family == "rhel":
        return "dnf" if facts.has("dnf") or not facts.has("yum") else "yum"
    return None


def headers_package(facts: Facts, manager: str) -> str:
    return f"linux-headers-{facts.kernel}" if manager == "apt" else f"kernel-devel-{facts.kernel}"


# ---------------------------------------------------------------------------------------------------------
# the action: a package transaction that waits for the package manager's lock
# ---------------------------------------------------------------------------------------------------------

# Runs "$@" (after wait and poll), retrying while another package manager holds the lock, for at most
# `wait` seconds. apt names the holder itself ("Could not get lock X. It is held by process N (name)");
# dnf waits silently, so its pid files are checked first. Exit 75 and a `gpunode-lock-timeout:` line on stderr
# when the lock is still held at the deadline.
_LOCKED_RUN = r"""wait=$1; poll=$2; shift 2
start=$(date +%s)
while :; do
  holder=
  for f in /var/cache/dnf/metadata_lock.pid /var/cache/dnf/download_lock.pid /var/lib/dnf/rpmdb_lock.pid /var/run/yum.pid; do
    [ -r "$f" ] || continue
    p=$(cat "$f" 2>/dev/null)
    if [ -n "$p" ] && [ -d "/proc/$p" ]; then holder="process $p ($(cat "/proc/$p/comm" 2>/dev/null)) holds $f"; fi
  done
  if [ -z "$holder" ]; then
    out=$("$@" 2>&1); rc=$?
    if [ "$rc" -eq 0 ]; then printf '%s\n' "$out"; exit 0; fi
    holder=$(printf '%s\n' "$out" | sed -n 's/.*Could not get lock \([^ ]*\)\. It is held by process \([0-9]*\) (\([^)]*\)).*/process \2 (\3) holds \1/p' | head -n 1)
    if [ -z "$holder" ]; then
      case $out in
        *"Could not get lock"*|*"Unable to acquire the dpkg frontend lock"*) holder="another package manager holds the lock" ;;
        *) printf '%s\n' "$out"; exit "$rc" ;;
      esac
    fi
  fi
  if [ $(( $(date +%s) - start )) -ge "$wait" ]; then
    ci=$(cloud-init status 2>/dev/null | head -n 1)
    echo "gpunode-lock-timeout: $holder${ci:+ (cloud-init $ci)}" >&2
    exit 75
  fi
  echo "gpunode-lock-wait: $holder" >&2
  sleep "$poll"
done
"""


@dataclass(frozen=True)
class PackageTransaction(Action):
    """`apt-get update` (apt only) then one install, each waiting for the package lock."""

    manager: str = "apt"
    packages: tuple[str, ...] = ()
    update: bool = False
    lock_timeout: float = 600.0

    kind = "packages"

    def argvs(self) -> list[tuple[str, ...]]:
        runs: list[tuple[str, ...]] = []
        if self.update and self.manager == "apt":
            runs.append(("apt-get", "update"))
        if self.manager == "apt":
            runs.append(("apt-get", "install", "-y", "--no-install-recommends", *self.packages))
        else:
            runs.append((self.manager, "install", "-y", *self.packages))
        return runs

    def commands(self) -> list[str]:
        return ["sudo " + display(argv) for argv in self.argvs()]

    def to_dict(self) -> dict[str, object]:
        return {**super().to_dict(), "manager": self.manager, "packages": list(self.packages),
                "lock_timeout": self.lock_timeout}

    def apply(self, conn: Connection) -> str | None:
        notes: list[str] = []
        for argv in self.argvs():
            script = Script(_LOCKED_RUN, (str(int(self.lock_timeout)), str(LOCK_POLL_SECONDS), *argv),
                            "pkg-locked-run")
            result = conn.run(script, sudo=True, timeout=self.lock_timeout + 3600)
            waits = [line.split(":", 1)[1].strip() for line in result.stderr.splitlines()
                     if line.startswith("gpunode-lock-wait:")]
            if waits:
                notes.append(f"waited for the package lock ({waits[-1]})")
            if result.exit_code == 75:
                holder = next((line.split(":", 1)[1].strip() for line in result.stderr.splitlines()
                               if line.startswith("gpunode-lock-timeout:")), "unknown holder")
                raise CommandError(
                    f"the {self.manager} lock is still held after {self.lock_timeout:.0f}s: {holder}",
                    fix="a first boot often runs unattended-upgrades or cloud-init: let it finish "
                        "(`cloud-init status --wait`), then run the same command again, or raise --lock-timeout",
                    stdout=result.stdout, stderr=result.stderr, exit_code=75)
            if argv[-1] == "update" and not result.ok:
                notes.append("`apt-get update` reported errors (a broken repository?); installing anyway")
                continue
            if not result.ok:
                raise explain_failure(result.stdout + "\n" + result.stderr, " ".join(argv), result.exit_code)
        return "; ".join(notes) or None


def explain_failure(output: str, command: str, code: int) -> CommandError:
    """A failed install, with the cause users actually hit named in the message."""
    tail = "\n".join(output.strip().splitlines()[-8:])
    missing = re.findall(r"Unable to locate package (\S+)|No match for argument: (\S+)|"
                         r"Package '(\S+)' has no installation candidate", output)
    names = sorted({n for group in missing for n in group if n})
    headers = [n for n in names if n.startswith(("linux-headers-", "kernel-devel-"))]
    if headers:
        return CommandError(f"{headers[0]} is not available from the configured repositories\n{tail}",
                            fix=_HEADERS_FIX, stdout=output, exit_code=code)
    if names:
        return CommandError(f"`{command}` failed: no package {', '.join(names)} in the configured repositories"
                            f"\n{tail}", fix="check the node's package sources (and EPEL for dkms on the RHEL "
                            "family), then run again", stdout=output, exit_code=code)
    return CommandError(f"`{command}` failed with exit code {code}\n{tail}",
                        fix="fix the package manager error above, then run the same command again",
                        stdout=output, exit_code=code)


_HEADERS_FIX = ("the running kernel is older (or newer) than what the repositories carry: upgrade the kernel "
                "package (apt-get install linux-generic / dnf update kernel), reboot into it, and run the same "
                "command again; or install the matching headers by hand")


# ---------------------------------------------------------------------------------------------------------
# the plan
# ---------------------------------------------------------------------------------------------------------


def missing_packages(facts: Facts, manager: str) -> list[str]:
    """gcc, make and dkms count as present when the command exists or the package is installed."""
    installed = parse_available(facts.get(package_facts.PREREQ_AVAILABLE), facts.kernel).installed
    missing = [name for name in ("gcc", "make", "dkms") if not facts.has(name) and name not in installed]
    if not headers_present(facts):
        missing.append(headers_package(facts, manager))
    return missing


def plan(facts: Facts, options: Options, earlier: Mapping[str, StepPlan] | None = None) -> StepPlan:
    if not wants_driver(options):
        return ok(NAME, "no --driver requested: nothing will be built")
    manager = package_manager(facts)
    if manager is None:
        return blocked(NAME, f"no supported package manager on {facts.os}",
                       "install gcc, make, dkms and the headers for the running kernel by hand, then run again")
    missing = missing_packages(facts, manager)
    if not missing:
        return ok(NAME, f"gcc, make, dkms and the headers for {facts.kernel} are installed")

    avail = parse_available(facts.get(package_facts.PREREQ_AVAILABLE), facts.kernel)
    headers = headers_package(facts, manager)
    if headers in missing and avail.known and headers in avail.missing:
        return blocked(NAME, f"{headers} (headers for the running kernel) is not available from the configured "
                             "repositories: the NVIDIA module cannot be built", _HEADERS_FIX)

    actions: list[Action] = []
    notes: list[str] = [f"waits up to {options.lock_timeout:.0f}s for the package lock (--lock-timeout)"]
    if manager != "apt" and "dkms" in missing and not avail.installed & {"epel-release"}:
        epel = _EPEL.get(facts.os.id, "")
        if facts.os.id == "rhel":
            return blocked(NAME, "dkms comes from EPEL, which is not enabled on this RHEL node",
                           "enable CodeReady Builder and EPEL (see https://docs.fedoraproject.org/en-US/epel/), "
                           "then run again")
        if epel and not (avail.known and "dkms" in avail.available):
            epel = epel.format(major=facts.os.version.split(".")[0])
            actions.append(PackageTransaction(f"enable EPEL ({epel}): dkms comes from there", manager=manager,
                                              packages=(epel,), lock_timeout=options.lock_timeout))
    actions.append(PackageTransaction(
        f"install {', '.join(missing)}", manager=manager, packages=tuple(missing), update=manager == "apt",
        lock_timeout=options.lock_timeout))
    return change(NAME, f"missing: {', '.join(missing)}", actions, *notes)


STEP = Step(NAME, TITLE, plan)
