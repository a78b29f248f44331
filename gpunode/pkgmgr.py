"""Package-manager differences, in one place: the command lines apt, dnf, yum and zypper take for each thing
gpunode does with packages, where their repository files live, and how gpunode waits for their locks.

Everything here is pure (argv tuples and text); gpunode/actions/packages.py runs them on the node, each inside
the lock wait below, so --lock-timeout covers every package-manager call.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from gpunode.facts import kernel as kernel_facts
from gpunode.facts.packages import pin_spec
from gpunode.record import Frozen


@dataclass(frozen=True, eq=False, repr=False)
class Manager(Frozen):
    name: str  # apt | dnf | yum | zypper
    package_format: str  # deb | rpm
    install_argv: tuple[str, ...]
    downgrade_flag: str | None  # the flag that lets an install go down a version (None: dnf does it anyway)
    remove_argv: tuple[str, ...]
    refresh_argv: tuple[str, ...] | None  # None: the manager refreshes its metadata by itself
    hold_argv: tuple[str, ...]
    unhold_argv: tuple[str, ...]
    hold_takes_version: bool  # versionlock pins NAME-VERSION; apt-mark and zypper lock the name
    add_repo_argv: tuple[str, ...] | None  # None: a repository is a file (apt)
    repo_dir: str
    versionlock_plugin: str | None = None  # the package that provides `versionlock`
    local_flags: tuple[str, ...] = ()  # extra flags to install package files that are not from a repository
    lock_files: tuple[str, ...] = ()  # pid files of a running transaction (apt names its holder itself)

    def spec(self, name: str, version: str) -> str:
        return pin_spec(self.name, name, version)

    def install(self, packages: tuple[str, ...] | list[str], *, downgrade: bool = False) -> tuple[str, ...]:
        flag = (self.downgrade_flag,) if downgrade and self.downgrade_flag else ()
        return (*self.install_argv, *flag, *packages)

    def install_files(self, paths: tuple[str, ...] | list[str]) -> tuple[str, ...]:
        return self.install((*self.local_flags, *paths), downgrade=True)

    def downgrade(self, packages: tuple[str, ...] | list[str]) -> tuple[str, ...]:
        """yum's install refuses to go down a version; its `downgrade` does."""
        return (self.name, "downgrade", "-y", *packages) if self.name == "yum" else self.install(packages,
                                                                                                 downgrade=True)

    def remove(self, names: tuple[str, ...] | list[str]) -> tuple[str, ...]:
        return (*self.remove_argv, *names)

    def purge(self, names: tuple[str, ...] | list[str]) -> tuple[str, ...]:
        """Remove packages with their configuration (apt's purge, held or not; dnf remove: a versionlock does
        not stop a removal; zypper remove: a lock does, see purge_held)."""
        if self.name == "apt":
            return ("apt-get", "purge", "-y", "--allow-change-held-packages", *names)
        return self.remove(names)

    def purge_held(self, names: tuple[str, ...] | list[str]) -> tuple[tuple[str, ...], ...]:
        """The commands that remove packages whatever holds them: zypper releases its locks first (zypper(8)
        addlock: a locked package is not installed, updated or removed)."""
        if self.name == "zypper":
            return (self.unhold(names), self.purge(names))
        return (self.purge(names),)

    def reinstall(self, packages: tuple[str, ...] | list[str]) -> tuple[str, ...]:
        """Install the same version again (a file of the package was deleted)."""
        if self.name == "apt":
            return (*self.install_argv, "--reinstall", *packages)
        if self.name == "zypper":
            return (*self.install_argv, "--force", *packages)
        return (self.name, "reinstall", "-y", *packages)

    def hold(self, name: str, version: str) -> tuple[str, ...]:
        return (*self.hold_argv, self.spec(name, version) if self.hold_takes_version else name)

    def unhold(self, names: tuple[str, ...] | list[str]) -> tuple[str, ...]:
        return (*self.unhold_argv, *names)

    def hold_all(self, packages: tuple[tuple[str, str], ...] | list[tuple[str, str]]) -> tuple[str, ...]:
        """One command holding several (name, version) packages: apt-mark and zypper take names, versionlock
        NAME-VERSION specs."""
        return (*self.hold_argv, *(self.spec(n, v) if self.hold_takes_version else n for n, v in packages))

    def add_repo(self, url: str) -> tuple[str, ...]:
        if self.add_repo_argv is None:
            raise ValueError(f"{self.name} repositories are files: write one into {self.repo_dir}")
        return (*self.add_repo_argv, url)

    def is_refresh(self, argv: tuple[str, ...]) -> bool:
        return self.refresh_argv is not None and argv == self.refresh_argv


_DNF_LOCKS = ("/var/cache/dnf/metadata_lock.pid", "/var/cache/dnf/download_lock.pid", "/var/lib/dnf/rpmdb_lock.pid")

MANAGERS: dict[str, Manager] = {m.name: m for m in (
    Manager("apt", "deb", ("apt-get", "install", "-y", "--no-install-recommends"), "--allow-downgrades",
            ("apt-get", "remove", "-y"), ("apt-get", "update"), ("apt-mark", "hold"), ("apt-mark", "unhold"),
            False, None, "/etc/apt/sources.list.d"),
    Manager("dnf", "rpm", ("dnf", "install", "-y"), None, ("dnf", "remove", "-y"), None,
            ("dnf", "versionlock", "add"), ("dnf", "versionlock", "delete"), True,
            ("dnf", "config-manager", "--add-repo"), "/etc/yum.repos.d", "python3-dnf-plugin-versionlock",
            lock_files=_DNF_LOCKS),
    Manager("yum", "rpm", ("yum", "install", "-y"), None, ("yum", "remove", "-y"), None,
            ("yum", "versionlock", "add"), ("yum", "versionlock", "delete"), True,
            ("yum-config-manager", "--add-repo"), "/etc/yum.repos.d", "yum-plugin-versionlock",
            lock_files=("/var/run/yum.pid",)),
    Manager("zypper", "rpm", ("zypper", "--non-interactive", "install"), "--oldpackage",
            ("zypper", "--non-interactive", "remove"), ("zypper", "--non-interactive", "--gpg-auto-import-keys",
                                                        "refresh"),
            ("zypper", "--non-interactive", "addlock"), ("zypper", "--non-interactive", "removelock"), False,
            ("zypper", "--non-interactive", "addrepo"), "/etc/zypp/repos.d", local_flags=("--allow-unsigned-rpm",),
            lock_files=("/run/zypp.pid",)),
)}


# ---------------------------------------------------------------------------------------------------------
# kernel packages: the headers of one kernel, the metapackages that bring new kernels (what a kernel hold holds)
# ---------------------------------------------------------------------------------------------------------


def headers_package(manager: str, kernel: str) -> str | None:
    """The package with the headers of kernel release `kernel`: linux-headers-K (Debian, Ubuntu), kernel-devel-K
    (RHEL family: `kernel-devel-5.14.0-427.13.1.el9_4.x86_64` is its name-version-release.arch),
    kernel-FLAVOUR-devel=VERSION on SUSE
    (zypper's capability form); None: unknown."""
    if manager == "apt":
        return f"linux-headers-{kernel}"
    if manager in ("dnf", "yum"):
        return f"kernel-devel-{kernel}"
    if manager == "zypper":
        flavour, version = suse_kernel(kernel)
        return f"kernel-{flavour}-devel={version}" if flavour else None
    return None


def suse_kernel(kernel: str) -> tuple[str, str]:
    """6.4.0-150600.23.25-default -> ("default", "6.4.0-150600.23.25"); ("", kernel) when there is no flavour."""
    version, _, flavour = kernel.rpartition("-")
    return (flavour, version) if version and re.fullmatch(r"[a-z][a-z0-9]*", flavour) else ("", kernel)


# Debian/Ubuntu metapackages that follow the newest kernel of a flavour: linux-generic, linux-image-generic,
# linux-headers-generic, linux-generic-hwe-22.04, linux-image-amd64, linux-headers-cloud-amd64, linux-aws, ...
# (not versioned kernels, not linux-firmware/-base/-libc-dev/-tools, not the nvidia module packages)
_DEB_KERNEL_META = re.compile(
    r"^linux-(?!.*-tools)(?:(?:image|headers)-)?(?!(?:image|headers|modules|objects|signatures|tools|cloud-tools|firmware|base|"
    r"libc|source|doc|sound|crashdump|unsigned|buildinfo|uc|lib|hwe-tools)\b)[a-z][a-z0-9.+-]*$")
# RHEL family: the kernel is install-only; a versionlock on these keeps dnf from installing another one
RPM_KERNEL_PACKAGES = ("kernel", "kernel-core", "kernel-modules", "kernel-devel")


def is_kernel_metapackage(manager: str, name: str) -> bool:
    if manager == "apt":
        return bool(_DEB_KERNEL_META.match(name))
    if manager == "zypper":  # multiversion kernel-<flavour>, kernel-<flavour>-devel (a lock keeps new ones out)
        return any(name in (f"kernel-{f}", f"kernel-{f}-devel") for f in kernel_facts.SUSE_FLAVOURS)
    return name in RPM_KERNEL_PACKAGES


def rpm_kernel_version(kernel: str) -> str:
    """5.14.0-362.8.1.el9_3.x86_64 -> 5.14.0-362.8.1.el9_3: the version-release of the kernel packages."""
    return re.sub(r"\.(x86_64|aarch64|ppc64le|s390x)$", "", kernel)


def remove_kernel(manager: str, kernel: str, headers: bool = False) -> str | None:
    """The command (run as root) that removes kernel release `kernel` (and its headers with `headers`), asking
    before it does (a metapackage that depends on it goes too); None: unknown manager."""
    if manager == "apt":
        names = [f"linux-image-{kernel}"] + ([f"linux-headers-{kernel}"] if headers else [])
    elif manager in ("dnf", "yum"):
        version = rpm_kernel_version(kernel)
        names = [f"kernel-core-{version}"] + ([f"kernel-devel-{version}"] if headers else [])
    elif manager == "zypper":
        flavour, version = suse_kernel(kernel)
        if not flavour:
            return None
        names = [f"kernel-{flavour}={version}"] + ([f"kernel-{flavour}-devel={version}"] if headers else [])
    else:
        return None
    # the release is the node's text (a directory name under /lib/modules): quoted for the shell it is printed for
    return shlex.join([manager if manager != "apt" else "apt-get", "remove", *names])


# Where repository definitions live, for every manager: a file under one of these configures a repository.
REPO_CONFIG_ROOTS = ("/etc/apt/", "/etc/yum.repos.d/", "/etc/zypp/")


def get(name: str) -> Manager:
    try:
        return MANAGERS[name]
    except KeyError:
        raise ValueError(f"unknown package manager {name!r}; known: {', '.join(MANAGERS)}") from None


# ---------------------------------------------------------------------------------------------------------
# waiting for the package lock
# ---------------------------------------------------------------------------------------------------------

LOCKED_RUN_NAME = "pkg-locked-run"
LOCK_TIMEOUT_EXIT = 75
LOCK_WAIT_PREFIX = "gpunode-lock-wait:"
LOCK_TIMEOUT_PREFIX = "gpunode-lock-timeout:"
_PID_FILES = " ".join(dict.fromkeys(f for m in MANAGERS.values() for f in m.lock_files))

# Runs "$@" (after wait and poll), retrying while another package manager holds the lock, for at most `wait`
# seconds. apt names the holder itself ("Could not get lock X. It is held by process N (name)"); dnf and yum wait
# silently, so their pid files are checked first; zypper says "System management is locked by the application
# with pid N (name)". Exit 75 and a `gpunode-lock-timeout:` line on stderr when the lock is still held at the end.
LOCKED_RUN = r"""wait=$1; poll=$2; shift 2
start=$(date +%s)
while :; do
  holder=
  for f in @PIDFILES@; do
    [ -r "$f" ] || continue
    p=$(cat "$f" 2>/dev/null)
    if [ -n "$p" ] && [ -d "/proc/$p" ]; then holder="process $p ($(cat "/proc/$p/comm" 2>/dev/null)) holds $f"; fi
  done
  if [ -z "$holder" ]; then
    out=$("$@" 2>&1); rc=$?
    if [ "$rc" -eq 0 ]; then printf '%s\n' "$out"; exit 0; fi
    holder=$(printf '%s\n' "$out" | sed -n -e 's/.*Could not get lock \([^ ]*\)\. It is held by process \([0-9]*\) (\([^)]*\)).*/process \2 (\3) holds \1/p' -e 's/.*System management is locked by the application with pid \([0-9]*\) (\([^)]*\)).*/process \1 (\2) holds the zypp lock/p' | head -n 1)
    if [ -z "$holder" ]; then
      case $out in
        *"Could not get lock"*|*"Unable to acquire the dpkg frontend lock"*|*"System management is locked"*) holder="another package manager holds the lock" ;;
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
""".replace("@PIDFILES@", _PID_FILES)

LOCK_FIX = ("a first boot often runs unattended-upgrades or cloud-init: let it finish (`cloud-init status --wait`), "
            "then run the same command again, or raise --lock-timeout")


# ---------------------------------------------------------------------------------------------------------
# what a failed transaction means
# ---------------------------------------------------------------------------------------------------------

HEADERS_FIX = ("the running kernel is older (or newer) than what the repositories carry: install the distribution's "
               "current kernel with its headers (Ubuntu: linux-generic; Debian: linux-image-amd64 and "
               "linux-headers-amd64; RHEL family: kernel and kernel-devel; SUSE: kernel-default and "
               "kernel-default-devel), reboot into it, and run the same "
               "command again; or install the matching headers by hand")

_SUSE_HEADERS = re.compile(r"kernel-[a-z0-9]+-devel(=|$)")
_MISSING = re.compile(r"Unable to locate package (\S+)|No match for argument: (\S+)|"
                      r"Package '(\S+)' has no installation candidate|No provider of '(\S+)' found")


def explain_failure(output: str, command: str, code: int) -> tuple[str, str]:
    """(message, fix) for a failed package-manager command, naming the cause users actually hit."""
    tail = "\n".join(output.strip().splitlines()[-8:])
    names = sorted({n for group in _MISSING.findall(output) for n in group if n})
    headers = [n for n in names if n.startswith(("linux-headers-", "kernel-devel-")) or _SUSE_HEADERS.match(n)]
    if headers:
        return f"{headers[0]} is not available from the configured repositories\n{tail}", HEADERS_FIX
    if names:
        return (f"`{command}` failed: no package {', '.join(names)} in the configured repositories\n{tail}",
                "check the node's package sources (and EPEL for dkms on the RHEL family), then run again")
    return (f"`{command}` failed with exit code {code}\n{tail}",
            "fix the package manager error above, then run the same command again")
