"""Step: fabric manager on NVSwitch systems (HGX/DGX A100, H100, H200 boards).

On those boards every GPU sits in an NVLink fabric that nvidia-fabricmanager programs; without it, or with a
fabric manager whose version differs from the driver's by as much as a patch level, CUDA fails with "Error 802:
system not yet initialized" while nvidia-smi looks healthy. So the package is pinned to exactly the driver
version, held against upgrades, enabled and started, and the fabric state nvidia-smi reports is checked.
NVSwitches are found on PCI (class 0x0680) before the driver loads and in /proc/driver/nvidia-nvswitch after.
PCIe boards have none and skip; so do GB200/GB300-style racks, whose fabric is managed off the host.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass

from gpunode.connection.base import Connection
from gpunode.errors import CommandError
from gpunode.facts import Facts
from gpunode.facts import fabric as fabric_facts
from gpunode.facts import packages as package_facts
from gpunode.facts.fabric import FM_PACKAGE, FabricGpu, off_host_fabric, parse_fabric
from gpunode.facts.packages import (
    Package,
    compare_versions,
    held_packages,
    parse_versionlock,
    pin_spec,
    unit,
    upstream_version,
)
from gpunode.options import Options
from gpunode.plan import Action, InstallPackages, RunCommand, StepPlan, blocked, change, ok, unknown
from gpunode.shell import Script
from gpunode.steps.base import Step

NAME = "fabricmanager"
TITLE = "Fabric manager (NVSwitch systems)"
SERVICE = "nvidia-fabricmanager"
UNIT = f"{SERVICE}.service"
RENAMED_AT = 580  # from R580 the packages lose the branch suffix (apt) and the hyphen (rpm)
LOG = "/var/log/fabricmanager.log"
DRIVER_VERSION = re.compile(r"\b(\d{3}\.\d{1,3}(?:\.\d{1,3})?)\b")
VERSIONLOCK_PLUGIN = {"dnf": "python3-dnf-plugin-versionlock", "yum": "yum-plugin-versionlock"}


def package_name(branch: int, manager: str) -> str:
    """nvidia-fabricmanager-535 (apt) / nvidia-fabric-manager (rpm) below R580; nvidia-fabricmanager from R580."""
    if branch >= RENAMED_AT:
        return "nvidia-fabricmanager"
    return f"nvidia-fabricmanager-{branch}" if manager == "apt" else "nvidia-fabric-manager"


def package_version(driver: str) -> str:
    return f"{driver}-1"  # NVIDIA's CUDA repositories: revision 1


def pick_version(offered: list[str], driver: str) -> str | None:
    """The offered version built for exactly this driver; NVIDIA's own (-1) before a distribution rebuild."""
    exact = [v for v in offered if upstream_version(v) == driver]
    return next((v for v in exact if v.endswith("-1")), exact[0] if exact else None)


# ---- NVIDIA's CUDA repository, where fabric manager lives for drivers that did not come from the distribution

CUDA_REPOS = "https://developer.download.nvidia.com/compute/cuda/repos"
CUDA_MARKER = "developer.download.nvidia.com/compute/cuda/repos"


def cuda_repo_dir(os_id: str, version: str, family: str) -> str | None:
    """NVIDIA's directory name for the distribution: ubuntu2204, debian12, rhel9, amzn2023, sles15..."""
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


def cuda_repo_configured(files: Mapping[str, str]) -> bool:
    return any(CUDA_MARKER in line and not line.lstrip().startswith("#") and "enabled=0" not in text
               for path, text in files.items() if path.startswith(("/etc/apt/", "/etc/yum.repos.d/", "/etc/zypp/"))
               for line in text.splitlines())


_CUDA_KEYRING = Script(
    name="install-cuda-keyring",
    body='set -e; tmp=$(mktemp -d); trap \'rm -rf "$tmp"\' EXIT; curl -fsSL -o "$tmp/cuda-keyring.deb" "$1"; '
         'dpkg -i "$tmp/cuda-keyring.deb"',
)


def cuda_repo_actions(facts: Facts, manager: str) -> list[Action] | None:
    """Add NVIDIA's CUDA repository the way NVIDIA documents it (cuda-keyring on apt, the .repo elsewhere)."""
    directory = cuda_repo_dir(facts.os.id, facts.os.version, facts.os.family)
    arch = {"x86_64": "x86_64", "aarch64": "sbsa"}.get(facts.arch)
    if directory is None or arch is None:
        return None
    base = f"{CUDA_REPOS}/{directory}/{arch}"
    if manager == "apt":
        return [RunCommand("add NVIDIA's CUDA repository (cuda-keyring), where fabric manager is published",
                           Script(_CUDA_KEYRING.body, (f"{base}/cuda-keyring_1.1-1_all.deb",), _CUDA_KEYRING.name),
                           timeout=600)]
    repo = f"{base}/cuda-{directory}.repo"
    if manager == "zypper":
        return [RunCommand("add NVIDIA's CUDA repository", ("zypper", "--non-interactive", "addrepo", repo)),
                RunCommand("refresh it and accept NVIDIA's key",
                           ("zypper", "--non-interactive", "--gpg-auto-import-keys", "refresh"), timeout=900)]
    if manager == "yum":
        return [RunCommand("add NVIDIA's CUDA repository", ("yum-config-manager", "--add-repo", repo))]
    return [RunCommand("add NVIDIA's CUDA repository", ("dnf", "config-manager", "--add-repo", repo))]


# ---- which driver must it match ----------------------------------------------------------------------------


def planned_driver_version(plan: StepPlan) -> str | None:
    """The version the driver step works towards: an action's `version` attribute, else the first driver
    version its reason names."""
    for action in plan.actions:
        for attr in ("version", "driver_version"):
            value = getattr(action, attr, None)
            if isinstance(value, str) and DRIVER_VERSION.fullmatch(value):
                return value
    match = DRIVER_VERSION.search(plan.reason)
    return match.group(1) if match else None


def driver_target(facts: Facts, options: Options, earlier: Mapping[str, StepPlan]) -> tuple[str, str] | None:
    """(version, where it came from): --driver, else the driver step's plan, else the loaded driver."""
    if options.driver:
        return options.driver, "--driver"
    if "driver" in earlier:
        found = planned_driver_version(earlier["driver"])
        if found:
            return found, "the driver step"
    if facts.loaded_driver:
        return facts.loaded_driver.version, "the loaded driver"
    return None


# ---- actions -----------------------------------------------------------------------------------------------

_FABRIC = Script(
    name="fabric-state",
    body="nvidia-smi -q 2>/dev/null | awk '/^GPU /{print; next} /^    Fabric *$/{f=1; print; next} "
         "f && /^        /{print; next} {f=0}'",
)
_LOG_TAIL = Script(name="fabricmanager-log", body=f'tail -n 15 {LOG} 2>/dev/null; true')
POLL_SECONDS = 2.0


@dataclass(frozen=True)
class StartFabricManager(Action):
    """Enable and (re)start the service, then wait for the fabric to be programmed: the GPUs report state
    "Completed" once fabric manager is done, or the reason it failed. A failing start brings the log along."""

    wait: float = 180.0

    kind = "service"

    def commands(self) -> list[str]:
        return [f"sudo systemctl enable {SERVICE}", f"sudo systemctl restart {SERVICE}",
                f"wait up to {self.wait:.0f}s for every GPU's fabric state to be Completed (nvidia-smi -q)"]

    def to_dict(self) -> dict[str, object]:
        return {**super().to_dict(), "unit": UNIT}

    def apply(self, conn: Connection) -> str | None:
        conn.run(("systemctl", "enable", SERVICE), sudo=True, timeout=120).check(f"enabling {SERVICE}")
        result = conn.run(("systemctl", "restart", SERVICE), sudo=True, timeout=300)
        if not result.ok:
            log = conn.run(_LOG_TAIL, sudo=True, timeout=60).stdout.strip()
            raise CommandError(f"{SERVICE} did not start" + (f"; {LOG} says:\n{log}" if log else ""),
                               fix="the fabric manager version must equal the loaded driver's exactly; check "
                                   f"`journalctl -u {SERVICE}`")
        deadline = time.monotonic() + self.wait
        while True:
            fabric = [g for g in parse_fabric(conn.run(_FABRIC, sudo=True, timeout=120).stdout) if g.reported]
            if all(g.settled for g in fabric) or time.monotonic() >= deadline:
                break
            time.sleep(POLL_SECONDS)
        stuck = [g for g in fabric if not g.settled]
        if stuck:
            raise CommandError(f"{SERVICE} runs, but the fabric is not ready: " + "; ".join(
                f"GPU {g.gpu} {g.state}/{g.status}" for g in stuck[:4]),
                fix=f"look at {LOG} and `nvidia-smi -q` (Fabric section)")
        return None


def _hold(manager: str, name: str, version: str) -> Action:
    if manager == "apt":
        return RunCommand(f"hold {name} so upgrades cannot separate it from the driver", ("apt-mark", "hold", name))
    if manager == "zypper":
        return RunCommand(f"lock {name} against upgrades", ("zypper", "--non-interactive", "addlock", name))
    return RunCommand(f"versionlock {name} at {version}", (manager, "versionlock", "add", pin_spec(manager, name,
                                                                                                  version)))


def _unhold(manager: str, names: list[str]) -> Action:
    if manager == "apt":
        return RunCommand("release the hold on " + ", ".join(names), ("apt-mark", "unhold", *names))
    if manager == "zypper":
        return RunCommand("unlock " + ", ".join(names), ("zypper", "--non-interactive", "removelock", *names))
    return RunCommand("delete the versionlock of " + ", ".join(names), (manager, "versionlock", "delete", *names))


def _install(manager: str, name: str, version: str, current: Package | None) -> Action:
    spec = pin_spec(manager, name, version)
    what = f"install {name} {version}, pinned to the driver version"
    if manager == "apt":
        return RunCommand(what, ("apt-get", "install", "-y", "--no-install-recommends", "--allow-downgrades", spec),
                          timeout=1800)
    if manager == "zypper":
        return RunCommand(what, ("zypper", "--non-interactive", "install", "--oldpackage", spec), timeout=1800)
    if manager == "yum" and current is not None and compare_versions(current.version, version) > 0:
        return RunCommand(what, ("yum", "downgrade", "-y", spec), timeout=1800)
    return RunCommand(what, (manager, "install", "-y", spec), timeout=1800)


def _remove(manager: str, names: list[str]) -> Action:
    what = "remove " + ", ".join(names) + " (another fabric manager branch)"
    if manager == "apt":
        return RunCommand(what, ("apt-get", "remove", "-y", *names), timeout=900)
    if manager == "zypper":
        return RunCommand(what, ("zypper", "--non-interactive", "remove", *names), timeout=900)
    return RunCommand(what, (manager, "remove", "-y", *names), timeout=900)


# ---- plan --------------------------------------------------------------------------------------------------


def _no_switch_plan(facts: Facts, fabric: list[FabricGpu], installed: Mapping[str, Package]) -> StepPlan:
    notes = []
    present = sorted(n for n in installed if FM_PACKAGE.match(n))
    if present:
        notes.append(f"{', '.join(present)} is installed but has nothing to manage here "
                     "(it exits with NV_WARN_NOTHING_TO_DO)")
    if off_host_fabric(fabric):
        return ok(NAME, "the NVLink fabric is managed off this host (GB200/GB300-style rack: the NVLink switch trays "
                        "run fabric management, compute trays use IMEX): nothing to install here", *notes)
    switches = facts[fabric_facts.NVLINK5_SWITCHES]
    if switches:
        return blocked(NAME, f"NVLink 5 switches found ({', '.join(switches)}): HGX B200-class systems need fabric "
                             "manager together with NVLSM, which gpunode does not set up yet",
                       "install nvidia-fabricmanager and nvlsm matching the driver by hand (NVIDIA Fabric Manager "
                       "User Guide), then run again with --skip fabricmanager", *notes)
    return ok(NAME, "no NVSwitch on this node (PCIe or directly linked GPUs): fabric manager is not needed", *notes)


def plan(facts: Facts, options: Options, earlier: Mapping[str, StepPlan] | None = None) -> StepPlan:
    earlier = earlier or {}
    installed = facts[package_facts.PKG_STATUS]
    fabric = facts[fabric_facts.FABRIC_STATE]
    bound = facts[fabric_facts.NVSWITCH_DEVICES]
    if not facts.nvswitches and not bound:
        return _no_switch_plan(facts, fabric, installed)
    switches = f"{max(len(facts.nvswitches), len(bound))} NVSwitch"
    manager = facts.os.package_manager
    if manager is None:
        return blocked(NAME, f"{switches} found, but {facts.os} has no package manager gpunode drives",
                       f"install {SERVICE} at exactly the driver's version by hand, then run again with --skip "
                       "fabricmanager")
    target = driver_target(facts, options, earlier)
    if target is None:
        return unknown(NAME, f"{switches} found, but the driver version is not known yet and fabric manager must match "
                             "it exactly; pass --driver VERSION or install the driver first")
    driver, source = target
    name = package_name(int(driver.split(".")[0]), manager)
    offered = pick_version(facts[fabric_facts.FM_AVAILABLE].get(name, []), driver)
    version = offered or package_version(driver)
    present = {n: p for n, p in installed.items() if FM_PACKAGE.match(n)}
    current = present.get(name)
    matches = current is not None and current.upstream == driver
    lock_files = facts[package_facts.PACKAGE_LOCKS]
    locks = {k: v for text in (lock_files.get("/etc/dnf/plugins/versionlock.list", ""),
                               lock_files.get("/etc/yum/pluginconf.d/versionlock.list", ""))
             for k, v in parse_versionlock(text).items()}
    locks.update(facts[fabric_facts.VERSIONLOCKS])  # the files, and the plugin's own answer
    held = held_packages(installed, lock_files) | set(locks)
    state = unit(facts[package_facts.UNITS], UNIT)
    if state.masked:
        return blocked(NAME, f"{UNIT} is masked: fabric manager cannot start", f"sudo systemctl unmask {SERVICE}, "
                       "then run again")

    actions: list[Action] = []
    notes = [f"driver version {driver} from {source}"]
    problems = []
    if not matches:
        problems.append(f"{name} {current.version} does not match driver {driver}" if current else
                        f"{name} is not installed")
        stale = [n for n in present if n != name]
        unhold = [n for n in present if n in held]
        if unhold:
            actions.append(_unhold(manager, unhold))
        if stale:
            actions.append(_remove(manager, stale))
        if not offered:  # not in the local package metadata: NVIDIA's CUDA repository has it
            if not cuda_repo_configured(facts[package_facts.PACKAGE_SOURCES]):
                repo = cuda_repo_actions(facts, manager)
                if repo is None:
                    return blocked(NAME, f"{switches}: {name} {version} must come from NVIDIA's CUDA repository, "
                                         f"which has no build for {facts.os} ({facts.arch})",
                                   f"install {name} {version} by hand, hold it, then run again", *notes)
                actions += repo
            if manager == "apt":
                actions.append(RunCommand("refresh the package lists", ("apt-get", "update"), timeout=900))
        actions.append(_install(manager, name, version, current))
    hold_ok = matches and name in held and (manager not in VERSIONLOCK_PLUGIN or
                                            locks.get(name, "").split("-")[0] == driver)
    if not hold_ok:
        if matches:
            problems.append(f"{name} is not held")
            if name in locks:  # a lock on another version: replace it
                actions.append(_unhold(manager, [name]))
        if manager in VERSIONLOCK_PLUGIN and VERSIONLOCK_PLUGIN[manager] not in installed:
            actions.append(InstallPackages(f"install the {manager} versionlock plugin", manager=manager,
                                           packages=(VERSIONLOCK_PLUGIN[manager],)))
        actions.append(_hold(manager, name, version))

    loaded = facts.loaded_driver.version if facts.loaded_driver else None
    if loaded == driver:
        stuck = [g for g in fabric if g.reported and not g.settled and g.state != "In Progress"]
        if not matches or not state.is_active or not state.is_enabled:
            if matches and not state.is_active:
                problems.append(f"{UNIT} is {state.active}")
                log = facts.get(fabric_facts.FABRICMANAGER_LOG)
                if log and state.active == "failed":
                    notes.append(f"{LOG}: " + log.strip().splitlines()[-1])
            elif matches:
                problems.append(f"{UNIT} is not enabled")
            actions.append(StartFabricManager(f"enable and start {SERVICE}, wait for the fabric"))
        elif stuck:
            problems.append("fabric not ready: " + "; ".join(f"GPU {g.gpu} {g.state}/{g.status}" for g in stuck[:4]))
            actions.append(StartFabricManager(f"restart {SERVICE}, wait for the fabric"))
        elif any(g.state == "In Progress" for g in fabric):
            notes.append("the fabric is still being programmed (state In Progress)")
    else:
        if not matches or not state.is_enabled:
            actions.append(RunCommand(f"enable {SERVICE} (it starts with driver {driver})",
                                      ("systemctl", "enable", SERVICE)))
        notes.append(f"driver {driver} is not loaded yet ({'loaded: ' + loaded if loaded else 'none loaded'}): "
                     f"{SERVICE} starts once it is (after the reboot)")

    if not actions:
        running = "running" if loaded == driver else "enabled"
        settled = ", fabric Completed" if fabric and all(g.settled for g in fabric if g.reported) and \
            any(g.reported for g in fabric) else ""
        return ok(NAME, f"{switches}: {name} {current.version if current else version} held, {running}{settled}",
                  *notes)
    return change(NAME, f"{switches}: " + "; ".join(problems), actions, *notes)


STEP = Step(NAME, TITLE, plan)
