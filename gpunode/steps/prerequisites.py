"""Step 2: what the NVIDIA installer needs to build its kernel module: gcc, make, dkms and the kernel headers
for the RUNNING kernel (`linux-headers-$(uname -r)` / `kernel-devel-$(uname -r)`).

Headers for another kernel are useless (the module is built for the running one), and headers the
repositories no longer carry make the step `blocked` with the fix rather than fail half-way. On a fresh cloud
VM apt/dpkg is often busy with unattended-upgrades or cloud-init: the install waits for the lock (up to
--lock-timeout) and names the holder instead of failing on the first "Could not get lock".
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from gpunode import bake, fixes, pkgmgr
from gpunode import driver_packages as routes
from gpunode.facts import Facts
from gpunode.facts import kernel as kernel_facts
from gpunode.facts import packages as package_facts
from gpunode.options import Options
from gpunode.pkgmgr import HEADERS_FIX
from gpunode.plan import Action, Earlier, StepPlan, blocked, change, ok
from gpunode.record import Frozen
from gpunode.rules import NO_GPU, NO_GPU_FIX, package_manager
from gpunode.steps.base import Step

NAME = "prerequisites"
TITLE = "Build prerequisites for the driver"

# Where dkms comes from on the RHEL family: EPEL. The release package that enables it, per distribution.
_EPEL = {"rocky": "epel-release", "almalinux": "epel-release", "centos": "epel-release",
         "ol": "oracle-epel-release-el{major}"}


def wants_driver(options: Options) -> bool:
    return bool(options.driver or options.driver_run)


@dataclass(frozen=True, eq=False, repr=False)
class Availability(Frozen):
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


def headers_package(facts: Facts, manager: str, kernel: str | None = None) -> str:
    """The headers package of `kernel` (default: the running one), named by gpunode/pkgmgr.py."""
    release = kernel or facts.kernel
    return pkgmgr.headers_package(manager, release) or f"kernel-devel-{release}"


def kernel_packages(facts: Facts, manager: str) -> tuple[str, ...]:
    """The packages that bring the distribution's newest kernel of the running flavour with its headers
    (5.15.0-91-generic -> linux-generic on Ubuntu; 6.1.0-18-amd64 -> linux-image-amd64 on Debian), or () when
    the flavour cannot be told."""
    if manager == "zypper":  # multiversion: installs the newest of the running flavour, next to the running one
        flavour = pkgmgr.suse_kernel(facts.kernel)[0]
        return (f"kernel-{flavour}", f"kernel-{flavour}-devel") if flavour else ()
    if manager != "apt":
        return ("kernel", "kernel-devel")  # installonly: installs the newest, next to the running one
    flavour = facts.kernel.rsplit("-", 1)[-1] if "-" in facts.kernel else ""
    if not re.fullmatch(r"[a-z][a-z0-9]*", flavour):
        return ()
    if facts.os.id == "ubuntu" or "ubuntu" in facts.os.like:
        return (f"linux-{flavour}",)
    return (f"linux-image-{flavour}", f"linux-headers-{flavour}")


def headers_fix(facts: Facts, manager: str) -> str:
    """The fix for headers the repositories no longer carry, for this node's package manager."""
    wanted = kernel_packages(facts, manager)
    if not wanted:
        return HEADERS_FIX
    m = pkgmgr.get(manager)
    steps = [m.refresh_argv] if m.refresh_argv else []
    command = fixes.on_node(" && ".join("sudo " + shlex.join(argv) for argv in [*steps, m.install(wanted)]))
    return (f"the running kernel {facts.kernel} is not the one the repositories carry headers for: install the "
            "current kernel with `" + command + "`, reboot into it (`" + fixes.on_node("sudo reboot")
            + "`), and run the same command again")


# ---------------------------------------------------------------------------------------------------------
# the plan
# ---------------------------------------------------------------------------------------------------------


def missing_packages(facts: Facts, manager: str) -> list[str]:
    """gcc, make and dkms count as present when the command exists or the package is installed. The packages are
    asked for only when a command is not found: they are a late fact (the probe's second round trip), which a
    converged node, with all three commands, never pays for."""
    absent = [name for name in ("gcc", "make", "dkms") if not facts.has(name)]
    installed = parse_available(facts.get(package_facts.PREREQ_AVAILABLE), facts.kernel).installed if absent else ()
    missing = [name for name in absent if name not in installed]
    if not headers_present(facts):
        missing.append(headers_package(facts, manager))
    return missing


def plan(facts: Facts, options: Options, earlier: Earlier | None = None) -> StepPlan:
    if not wants_driver(options):
        return ok(NAME, "no --driver requested: nothing will be built")
    if not facts.gpus and not options.bake:  # the first thing to say (a bake builds without a GPU)
        return blocked(NAME, NO_GPU, NO_GPU_FIX)
    manager = package_manager(facts)
    if manager is None:
        return blocked(NAME, f"no supported package manager on {facts.os}",
                       "install gcc, make, dkms and the headers for the running kernel by hand, then run again")
    if options.driver_source == "packages" and routes.route_os(facts.os.id, facts.os.family) in routes.KMP_ROUTES:
        return ok(NAME, "the driver packages are kernel module packages (KMP) with the module built for the "
                        "kernel's ABI: nothing is built on the node")
    missing = missing_packages(facts, manager)
    if options.bake:  # the headers of the image's kernel, not of the one this build runs (gpunode/bake.py)
        missing = _bake_headers(facts, options, manager, missing)
    if not missing:
        return ok(NAME, f"gcc, make, dkms and the headers for {facts.kernel} are installed")

    avail = parse_available(facts.get(package_facts.PREREQ_AVAILABLE), facts.kernel)
    headers = headers_package(facts, manager)
    if headers in missing and avail.known and headers in avail.missing:
        return blocked(NAME, f"{headers} (headers for the running kernel) is not available from the configured "
                             "repositories: the NVIDIA module cannot be built", headers_fix(facts, manager))

    if manager == "zypper" and "dkms" in missing and avail.known and "dkms" in avail.missing:
        return blocked(NAME, "dkms is not in the configured repositories: on SUSE it comes from SUSE Package Hub "
                             "(SLES) or openSUSE's backports repository (Leap)", _package_hub_fix(facts))

    from gpunode.actions.packages import install_packages  # a change: a converged run never loads the actions

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
            actions.append(install_packages(f"enable EPEL ({epel}): dkms comes from there", manager, (epel,),
                                            lock_timeout=options.lock_timeout))
    actions.append(install_packages(f"install {', '.join(missing)}", manager, missing, refresh=True,
                                    lock_timeout=options.lock_timeout))
    return change(NAME, f"missing: {', '.join(missing)}", actions, *notes)


def _package_hub_fix(facts: Facts) -> str:
    """SLES: SUSE Package Hub, the module that carries dkms, enabled by SUSEConnect
    (https://packagehub.suse.com/how-to-use/: `SUSEConnect -p PackageHub/<version>/<arch>`); openSUSE Leap: its
    backports repository (https://en.opensuse.org/Portal:Backports)."""
    if facts.os.id.startswith("sles"):
        product = shlex.quote(f"PackageHub/{facts.os.version}/{facts.arch}")  # os-release is the node's text
        command = fixes.on_node(f"sudo SUSEConnect -p {product} && sudo zypper --non-interactive refresh")
        return command + "  # enables SUSE Package Hub, which carries dkms; then run the same command again"
    return ("enable openSUSE's backports repository (https://en.opensuse.org/Portal:Backports), which carries dkms, "
            "then run the same command again")


def _bake_headers(facts: Facts, options: Options, manager: str, missing: list[str]) -> list[str]:
    kernel = bake.target_kernel(facts, options) or facts.kernel
    missing = [m for m in missing if m != headers_package(facts, manager)]
    if not bake.headers_present(facts, kernel):
        missing.append(headers_package(facts, manager, kernel))
    return missing


STEP = Step(NAME, TITLE, plan)
