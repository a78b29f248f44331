"""The driver from the distribution's or NVIDIA's packages (`--driver-source packages`), in one place: which route
a node takes (data/driver_package_routes.csv, a source per row), the package names of a branch and flavour, and
which exact distribution version of each carries the upstream release asked for.

Pure: facts in (the OS, the kernel, Secure Boot, the versions the configured repositories offer), names and
versions out. The driver step (gpunode/steps/driver_packages.py) turns them into actions; doctor and status read
`owner_source` to say which source owns the driver.

Version schemes (each row's example_version): Debian `535.261.03-1`, Ubuntu `535.230.02-0ubuntu0.22.04.1`,
NVIDIA's RPMs `535.274.02-1.el9` (dnf prints no epoch for them), SUSE `580.95.05_k6.4.0_...-1`: the upstream
release is the part before the first `-`, `_`, `~` or `+` (facts/driver.py upstream_version). Rows whose version
is `own` (Debian's nvidia-persistenced and nvidia-modprobe, Ubuntu's precompiled linux-modules-nvidia, whose
version is the kernel's) are taken at the repository's candidate version, pinned exactly in the plan.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

from gpunode import fixes
from gpunode.datatables import choice_field, data_dir, read_table, source_field, text_field
from gpunode.record import Frozen

if TYPE_CHECKING:
    from collections.abc import Mapping

    from gpunode.facts import Facts

TABLE = "driver_package_routes.csv"
SCHEMA = {"route": text_field, "os": choice_field("debian", "ubuntu", "rhel", "sles"),
          "role": choice_field("module", "userspace", "firmware"), "package": text_field,
          "flavour": choice_field("any", "open", "proprietary"),
          "when": choice_field("always", "gsp", "dkms", "precompiled", "desktop"), "version": choice_field("driver", "own"),
          "example_version": text_field, "source": source_field}

# where a Debian node gets the non-free component: a gpunode-private list file, so the user's own sources are
# never edited (https://wiki.debian.org/SourcesList, https://wiki.debian.org/NvidiaGraphicsDrivers)
DEBIAN_NONFREE_LIST = "/etc/apt/sources.list.d/gpunode-nonfree.list"
# apt: a pin of every driver package at the release (apt_preferences(5): glob patterns in Package, `Pin: version`
# with a glob, priority over 1000 even where it means a downgrade). apt's resolver takes a dependency's candidate
# version and does not go back: without the pin, `nvidia-kernel-dkms=535.261.03-1` fails while the
# security suite offers 535.309.01 (its `nvidia-kernel-support (= 535.261.03-1)` meets the newer candidate).
# It also keeps unattended-upgrades from moving the driver, with the holds.
APT_PIN = "/etc/apt/preferences.d/gpunode-nvidia-driver"
PIN_PACKAGES = "nvidia-* libnvidia-* libcuda1 libcuda1-* firmware-nvidia-gsp xserver-xorg-video-nvidia*"


# every package of an NVIDIA driver that a route's transaction may install, replace or remove on its own: the apt
# pin's globs, NVIDIA's RPM kernel-module and meta packages, Ubuntu's per-kernel precompiled module packages. A
# simulated transaction that removes anything else is refused before the first change (steps/driver_packages.py).
DRIVER_FAMILY = (*PIN_PACKAGES.split(), "kmod-nvidia*", "cuda-drivers*", "linux-modules-nvidia-*",
                 "linux-objects-nvidia-*", "linux-signatures-nvidia-*", "libnvidia-*")


def of_the_driver(name: str) -> bool:
    """Whether a package belongs to an NVIDIA driver (DRIVER_FAMILY) or is one a route installs."""
    from fnmatch import fnmatchcase

    return any(fnmatchcase(name, p) for p in DRIVER_FAMILY) or is_route_package(name)


def apt_pin(version: str) -> str:
    """The preferences stanza (its Explanation lines are apt's own comment field)."""
    return ("Explanation: Written by gpunode (--driver-source packages): the NVIDIA driver's packages at release "
            f"{version}\nExplanation: removed again when gpunode uninstalls the driver\n"
            f"Package: {PIN_PACKAGES}\nPin: version {version}-*\nPin-Priority: 1001\n")


# NVIDIA's CUDA repository definitions (https://docs.nvidia.com/datacenter/tesla/driver-installation-guide/)
CUDA_REPO = "https://developer.download.nvidia.com/compute/cuda/repos"
CUDA_MARKER = "developer.download.nvidia.com/compute/cuda/repos"  # in a repository definition that uses it
CUDA_KEYRING_DEB = "cuda-keyring_1.1-1_all.deb"  # NVIDIA's package that writes its apt source and key


@dataclass(frozen=True, eq=False, repr=False)
class Row(Frozen):
    route: str
    os: str
    role: str
    package: str
    flavour: str
    when: str
    version: str
    example: str
    source: str


@cache
def rows() -> tuple[Row, ...]:
    text = (data_dir() / TABLE).read_text(encoding="utf-8")
    return tuple(Row(r["route"], r["os"], r["role"], r["package"], r["flavour"], r["when"], r["version"],
                     r["example_version"], r["source"]) for r in read_table(text, TABLE, SCHEMA))


def route_os(os_id: str, family: str) -> str | None:
    """The table's os key of a node: debian, ubuntu, rhel (RHEL, Rocky, Alma, ...), sles; None: no route."""
    if os_id == "ubuntu":
        return "ubuntu"
    if os_id == "debian":
        return "debian"
    if family == "rhel" or os_id in ("rhel", "rocky", "almalinux", "centos", "ol"):
        return "rhel"
    if os_id.startswith(("sles", "opensuse")) or family == "suse":
        return "sles"
    return None


def manager_of(facts: Facts, os_key: str) -> str | None:
    """The package manager of a route's node (rules.package_manager; zypper on SUSE whatever its os-release
    says about its family)."""
    from gpunode.rules import package_manager

    return "zypper" if os_key == "sles" else package_manager(facts)


def installed(facts: Facts) -> dict[str, tuple[str, bool]]:
    """{name: (version, held)} of the driver packages installed (dpkg/rpm, with apt-mark holds, versionlock and
    zypper locks)."""
    from gpunode.facts import driver as driver_facts
    from gpunode.facts.packages import PACKAGE_LOCKS, PKG_STATUS, held_packages

    status = facts.get(PKG_STATUS) or {}
    held = held_packages(status, facts.get(PACKAGE_LOCKS) or {})
    found = {n: (v, n in held) for n, v in facts[driver_facts.PACKAGES]}
    for name, pkg in status.items():
        found[name] = (pkg.version, name in held)
    return found


def kernel_flavour(kernel: str) -> str:
    """Ubuntu's kernel flavour, the tail of the release: 5.15.0-91-generic -> generic, 6.8.0-1015-aws -> aws."""
    return kernel.rsplit("-", 1)[-1] if "-" in kernel else kernel


def upstream(package_version: str) -> str | None:
    from gpunode.facts.driver import upstream_version  # the one grammar of a package's upstream release

    return upstream_version(package_version)


@dataclass(frozen=True, eq=False, repr=False)
class Wanted(Frozen):
    """One package of the plan: its name, the exact version to install (None: not offered), and why."""

    name: str
    version: str | None
    row: Row
    offered: tuple[str, ...] = ()  # what the repositories offer of it (for the refusal)


@dataclass(frozen=True, eq=False, repr=False)
class Route(Frozen):
    """What the packages route installs on this node: its id, the packages at exact versions, whether the
    module comes precompiled (signed by the distribution) or is built by DKMS, and why."""

    id: str
    packages: tuple[Wanted, ...]
    precompiled: bool
    why: str

    @property
    def missing(self) -> tuple[Wanted, ...]:
        return tuple(w for w in self.packages if w.version is None)

    @property
    def module(self) -> Wanted:
        return next(w for w in self.packages if w.row.role == "module")

    def specs(self) -> list[tuple[str, str]]:
        return [(w.name, w.version) for w in self.packages if w.version is not None]


def _pick(offered: list[str], want: str) -> str | None:
    """The newest offered package version whose upstream release is exactly `want`."""
    from packaging.version import InvalidVersion, Version

    found = [v for v in offered if upstream(v) == want]
    if not found:
        return None

    def order(v: str) -> tuple[object, str]:
        try:
            return (Version(re.sub(r"[^0-9.]", ".", v).strip(".").replace("..", ".")), v)
        except InvalidVersion:
            return (Version("0"), v)
    return max(found, key=order)


def plan_route(os_key: str, version: str, flavour: str, *, kernel: str, secure_boot: bool | None,
               gsp: bool, offered: dict[str, list[str]], desktop: bool = False) -> Route:
    """The route a node takes for driver `version` with the `flavour` module, for `kernel`: of the table's routes
    for `os_key`, in the table's order (the distribution's own archive first, then NVIDIA's CUDA repository), the
    first whose every package the configured repositories offer at exactly that release; when none does, the
    first (its refusal names what is missing)."""
    found = [_plan_one(route, os_key, version, flavour, kernel=kernel, secure_boot=secure_boot, gsp=gsp,
                       offered=offered, desktop=desktop) for route in dict.fromkeys(r.route for r in rows() if r.os == os_key)]
    return next((r for r in found if not r.missing), found[0])


def routes_of(os_key: str) -> tuple[str, ...]:
    """The route ids of an OS, in the order plan_route prefers them."""
    return tuple(dict.fromkeys(r.route for r in rows() if r.os == os_key))


def _plan_one(route: str, os_key: str, version: str, flavour: str, *, kernel: str, secure_boot: bool | None,
              gsp: bool, offered: dict[str, list[str]], desktop: bool = False) -> Route:
    branch = version.split(".", 1)[0]
    open_tag = "-open" if flavour == "open" else ""
    table = [r for r in rows() if r.os == os_key and r.route == route]
    precompiled_name = None
    why = "DKMS builds the module at package install"
    if any(r.when == "precompiled" for r in table):
        pre = next(r for r in table if r.when == "precompiled" and r.role == "module")
        name = pre.package.format(branch=branch, open=open_tag, kernel=kernel)
        utils = next((r for r in table if r.when == "always" and r.role == "userspace"), None)
        current = [routes_v for routes_v in (upstream(v) for v in offered.get(
            utils.package.format(branch=branch, open=open_tag, kernel=kernel), [])) if routes_v] if utils else []
        newest = max(current, key=_loose) if current else None
        # the archive builds the precompiled modules of a branch for its current release only
        if secure_boot and offered.get(name) and newest == version:
            precompiled_name = name
            why = (f"Secure Boot is on and the archive offers {name}: the precompiled module Canonical signed for "
                   f"kernel {kernel} (no DKMS, no key to enroll)")
        elif secure_boot:
            why = (f"Secure Boot is on but the archive offers no {name} for kernel {kernel}: DKMS builds the module "
                   "(see the Secure Boot note)")
    wanted: list[Wanted] = []
    for r in table:
        if r.flavour not in ("any", flavour):
            continue
        if r.when == "gsp" and not (gsp or flavour == "open"):
            continue
        if r.when == "dkms" and precompiled_name:
            continue
        if r.when == "precompiled" and not precompiled_name:
            continue
        # a display stack (`desktop`): the full driver (X driver, GL libraries) in place of the headless set; the
        # precompiled modules go with the headless no-DKMS set (the archive has no full one without DKMS)
        if r.when == "desktop" and (not desktop or precompiled_name):
            continue
        if r.when == "dkms" and r.role == "userspace" and desktop and not precompiled_name:
            continue
        name = r.package.format(branch=branch, open=open_tag, kernel=kernel)
        versions = offered.get(name, [])
        if os_key in KMP_ROUTES and r.role == "module":
            versions = kmp_for(versions, kernel)
        if r.version == "own":
            exact = max(versions, key=_loose) if versions else None
        else:
            exact = _pick(versions, version)
        wanted.append(Wanted(name, exact, r, tuple(versions)))
    if os_key in KMP_ROUTES:
        return Route(route, tuple(wanted), True, "NVIDIA's kernel module package (KMP) carries the module built for "
                     "SUSE's kernel ABI: no DKMS, nothing built on the node")
    return Route(route, tuple(wanted), precompiled_name is not None, why)


def kmp_for(versions: list[str], kernel: str) -> list[str]:
    """The kernel module package versions built for `kernel`'s version (`580.95.05_k6.4.0_150600.23.25-1` for
    6.4.0-150600.23.25-default: SUSE's KMP version names the kernel with `-` as `_`); all of them when none
    names it (a kernel of the same ABI takes the module through weak-updates)."""
    from gpunode.pkgmgr import suse_kernel

    tag = "_k" + suse_kernel(kernel)[1].replace("-", "_")
    mine = [v for v in versions if tag in v and not v.split(tag, 1)[1][:1].isalnum()]
    return mine or versions


def _loose(v: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", v)[:8])


def candidate_names(os_key: str) -> tuple[str, ...]:
    """Name patterns (extended regular expressions) a probe asks the repositories about for a route."""
    found = []
    for r in rows():
        if r.os != os_key:
            continue
        found.append("^" + r.package.replace("{branch}", "[0-9]+").replace("{open}", "(-open)?")
                     .replace("{kernel}", ".+") + "$")
    return tuple(dict.fromkeys(found))


def route_names(os_key: str) -> tuple[str, ...]:
    """Every fixed (branch-free) name of a route: what dnf/zypper are asked about."""
    return tuple(dict.fromkeys(r.package for r in rows() if r.os == os_key and "{" not in r.package))


def is_route_package(name: str) -> bool:
    """Whether an installed package is one a packages route installs (any distribution)."""
    return any(re.match(p, name) for os_key in ("debian", "ubuntu", "rhel", "sles") for p in candidate_names(os_key))


def cuda_repo_dir(os_id: str, version: str, family: str) -> str | None:
    """NVIDIA's directory name for the distribution in its CUDA repository (ubuntu2204, debian12, rhel9, amzn2023,
    sles15, opensuse15...), or None where NVIDIA publishes none."""
    major = version.split(".")[0]
    if os_id == "ubuntu" and version in ("20.04", "22.04", "24.04"):
        return "ubuntu" + version.replace(".", "")
    if os_id == "debian" and major in ("11", "12", "13"):
        return f"debian{major}"
    if os_id == "amzn" and major == "2023":
        return "amzn2023"
    if os_id == "fedora" and major:
        return f"fedora{major}"
    if family == "rhel" and major in ("8", "9", "10"):
        return f"rhel{major}"
    if family == "suse" and major == "15":
        return "sles15" if os_id.startswith("sle") else "opensuse15"
    return None


CUDA_REPO_ARCH = {"x86_64": "x86_64", "aarch64": "sbsa"}
"""NVIDIA's directory for a machine (`uname -m`) under each distribution's in its CUDA repository: Arm servers are
"sbsa" (Server Base System Architecture); other machines have no directory gpunode offers."""


def cuda_repo_base(os_id: str, version: str, family: str, arch: str) -> str | None:
    """The URL of NVIDIA's CUDA repository for a distribution and machine (…/ubuntu2204/sbsa), or None where NVIDIA
    publishes none."""
    directory, where = cuda_repo_dir(os_id, version, family), CUDA_REPO_ARCH.get(arch)
    return None if directory is None or where is None else f"{CUDA_REPO}/{directory}/{where}"


def cuda_repo_configured(files: Mapping[str, str]) -> bool:
    """Whether an enabled repository definition among the node's package-source files points at NVIDIA's CUDA
    repository."""
    # imported here: pkgmgr reads the facts, and a driver fact reads this module
    from gpunode.pkgmgr import REPO_CONFIG_ROOTS

    return any(CUDA_MARKER in line and not line.lstrip().startswith("#") and "enabled=0" not in text
               for path, text in files.items() if path.startswith(REPO_CONFIG_ROOTS)
               for line in text.splitlines())


def cuda_keyring_fix(os_id: str, os_version: str, family: str, arch: str) -> fixes.Fix | None:
    """apt: NVIDIA's CUDA repository, set up the way NVIDIA's installation guide does (its cuda-keyring package
    writes the sources list and the signing key); None for a release or machine NVIDIA publishes no repository
    for."""
    base = cuda_repo_base(os_id, os_version, family, arch)
    if base is None:
        return None
    url = f"{base}/{CUDA_KEYRING_DEB}"
    return fixes.on_node(f"wget -qO /tmp/cuda-keyring.deb {url} && sudo dpkg -i /tmp/cuda-keyring.deb && "
                         "sudo apt-get update")


def sources_fix(os_key: str, codename: str | None, version: str = "", repo_dir: str | None = None,
                arch: str = "x86_64") -> fixes.Fix:
    """The command that makes the route's repository available (runnable as printed on the node); `repo_dir`:
    NVIDIA's directory of the distribution (cuda_repo_dir: rhel9, sles15, opensuse15); `arch`: the node's machine
    (`uname -m`)."""
    machine = CUDA_REPO_ARCH.get(arch, arch)
    if os_key == "debian":
        suite = codename or "bookworm"
        lines = (f"deb http://deb.debian.org/debian {suite} main contrib non-free non-free-firmware\\n"
                 f"deb http://deb.debian.org/debian-security {suite}-security main contrib non-free "
                 "non-free-firmware\\n")
        return fixes.on_node(f"printf '{lines}' | sudo tee {DEBIAN_NONFREE_LIST} >/dev/null && sudo apt-get update")
    if os_key == "ubuntu":
        return fixes.on_node("sudo add-apt-repository -y restricted && sudo add-apt-repository -y multiverse && "
                "sudo apt-get update")
    if os_key == "rhel":
        where = repo_dir or f"rhel{version.split('.', 1)[0] or '9'}"
        return fixes.on_node(f"sudo dnf config-manager --add-repo {CUDA_REPO}/{where}/{machine}/cuda-{where}.repo && "
                "sudo dnf makecache")
    where = repo_dir or "sles15"  # openSUSE Leap: opensuse15
    return fixes.on_node(f"sudo zypper addrepo {CUDA_REPO}/{where}/{machine}/cuda-{where}.repo && sudo zypper refresh")


# ---- what a DKMS module package builds when it is installed ------------------------------------------------
# The kernels are chosen by the package's own maintainer script, not "every kernel with headers":
# - apt (Debian and Ubuntu: nvidia-kernel-dkms, nvidia-dkms-<branch>[-server]) run dkms's common.postinst
#   (github.com/dell/dkms, dkms_common.postinst; Debian 12's dkms 3.0.10 read and run on the real-OS tier, issue
#   27's realup): the running kernel and the newest installed one; when the running kernel is not installed (a
#   chroot, an image build on another host kernel) every installed kernel on a first install and only the newest
#   on an upgrade. A kernel without headers is skipped and the install still succeeds. (`autoinstall_all_kernels`
#   in /etc/dkms/framework.conf, all kernels, is not read.)
# - dnf/yum (NVIDIA's dkms-nvidia RPMs, github.com/NVIDIA/yum-packaging-dkms-nvidia dkms-nvidia.spec %post):
#   `dkms build` / `dkms install` without a kernel: the running kernel only.
# - zypper (SUSE): NVIDIA's repository carries kernel module packages (KMP, nvidia-open-driver-G06-kmp-<flavour>,
#   nvidia-driver-G06-kmp-<flavour>) whose version names the kernel they were built for
#   (`580.95.05_k6.4.0_150600.23.25-1`): the module comes built, nothing runs DKMS or a compiler on the node; a
#   kernel of the same ABI takes it through SUSE's weak-updates links (https://en.opensuse.org/Kernel_Module_Packages).
KMP_ROUTES = ("sles",)
DKMS_AT_INSTALL = {
    "apt": "the running kernel and the newest installed one, where their headers are installed",
    "dnf": "the running kernel only",
    "yum": "the running kernel only",
}


def dkms_kernels(manager: str, running: str, installed: tuple[str, ...], newest: str | None,
                 upgrade: bool) -> tuple[str, ...] | None:
    """The kernels a DKMS module package's install builds for (headers permitting), as its maintainer script
    decides (DKMS_AT_INSTALL); None when not known for `manager`."""
    if manager == "apt":
        if running in installed:
            return tuple(dict.fromkeys(k for k in (running, newest) if k))
        return (newest,) if upgrade and newest else installed
    if manager in ("dnf", "yum"):
        return (running,)
    return None
