"""What holds the GPU: the things that keep the nvidia modules from unloading, read before a driver upgrade.

- GPU services from a known list (`GPU_SERVICES`, data below): systemd units whose daemons keep /dev/nvidia*
  open. gpunode may stop them (--stop-gpu-services) and start them again after the install.
- Processes with /dev/nvidia* open, found from /proc/*/fd (one `ls -l` over every process, no fuser), each with
  its systemd unit or container from /proc/PID/cgroup; and NVML's list of compute processes
  (`nvidia-smi --query-compute-apps`). A process that is not one of those services is never stopped by gpunode.
- Running docker containers given GPUs (`docker inspect`: DeviceRequests with the gpu capability, or the nvidia
  runtime with NVIDIA_VISIBLE_DEVICES), best effort.
- The use count of nvidia_drm (/sys/module/*/refcnt): DRM clients (a display server, the framebuffer console)
  keep it loaded, and gpunode stops none of those: the new module can only load at a reboot.

All parsers are pure; `gpu_holders(facts)` combines them.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpunode import fixes
from gpunode.facts.containers import JOURNAL
from gpunode.facts.k8s import CLUSTER, K8S_UNITS
from gpunode.facts.k8s import UNITS as K8S_UNIT_STATES
from gpunode.facts.packages import UnitState, parse_units, unit_states
from gpunode.facts.registry import command, smi_output
from gpunode.journal import JOURNAL_PATH, owed_targets
from gpunode.record import Frozen

if TYPE_CHECKING:
    from gpunode.facts import Facts

_M = __name__.rsplit(".", 1)[-1]

# ---- the known GPU services (data) ----------------------------------------------------------------------------
# (unit, what it is), in the order they are stopped: the GPU's users first, persistence last (it only keeps the
# GPUs initialised). Started again in the reverse order.
GPU_SERVICES: tuple[tuple[str, str], ...] = (
    # gpunode/steps/k8s_sharing.py MPS_UNIT: the MPS control daemon of the k8s step (--mps)
    ("nvidia-mps.service", "MPS control daemon"),
    # DCGM 3.x/4.x packages (datacenter-gpu-manager): nv-hostengine as nvidia-dcgm.service; DCGM 2.x: dcgm.service
    ("nvidia-dcgm.service", "DCGM host engine (nv-hostengine)"),
    ("dcgm.service", "DCGM host engine (nv-hostengine)"),
    # NVIDIA vGPU guest licensing daemon
    ("nvidia-gridd.service", "vGPU licensing daemon"),
    # fabric manager: the packages were renamed at R580 (gpunode/fabric_packages.py), the unit was not
    ("nvidia-fabricmanager.service", "fabric manager"),
    ("nvidia-persistenced.service", "persistence daemon"),
)
SERVICE_NAMES = tuple(u for u, _ in GPU_SERVICES)
FABRIC_MANAGER = "nvidia-fabricmanager.service"
# the kernel modules, in the order they unload (each before the module it uses)
MODULES = ("nvidia_peermem", "nvidia_drm", "nvidia_modeset", "nvidia_uvm", "nvidia")


def service_description(unit: str) -> str:
    return dict(GPU_SERVICES).get(unit, unit)


# ---- processes ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False, repr=False)
class GpuProcess(Frozen):
    pid: int
    name: str  # /proc/PID/comm (15 characters at most), or NVML's process name
    cgroup: str = ""  # the unified (or name=systemd) cgroup path
    devices: tuple[str, ...] = ()  # the /dev/nvidia* files it has open

    @property
    def unit(self) -> str:
        """The systemd service it runs in, "" when none (a login session, a container)."""
        last = self.cgroup.rstrip("/").rsplit("/", 1)[-1]
        return last if last.endswith(".service") else ""

    @property
    def container(self) -> str:
        """The docker/containerd container id from its cgroup (docker-ID.scope, cri-containerd-ID.scope)."""
        found = re.search(r"(?:docker|cri-containerd|crio|libpod)-([0-9a-f]{12,64})\.scope", self.cgroup) or \
            re.search(r"/docker/([0-9a-f]{12,64})$", self.cgroup)
        return found.group(1) if found else ""

    @property
    def in_pod(self) -> bool:
        return "kubepods" in self.cgroup

    def describe(self) -> str:
        where = (f"in pod cgroup {self.cgroup.rsplit('/', 2)[-2]}" if self.in_pod else
                 f"in container {self.container[:12]}" if self.container else
                 f"in {self.unit}" if self.unit else "")
        return f"PID {self.pid} {self.name or '?'}" + (f" ({where})" if where else "")


_UNSAFE = re.compile(r"[^\w.+:@/ -]")


def _safe(name: str) -> str:
    """A process, container or image name as shown in reasons and fixes: node text, so nothing that a shell or
    a terminal would read (backticks, quotes, $, control characters) survives; each becomes `?`."""
    return _UNSAFE.sub("?", name)[:80]


def parse_fd_scan(text: str) -> list[GpuProcess]:
    """Probe lines `PID<TAB>comm<TAB>cgroup<TAB>/dev/nvidia0,/dev/nvidiactl` -> the processes."""
    found: list[GpuProcess] = []
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) < 4 or not parts[0].strip().isdigit():
            continue
        devices = tuple(sorted({d for d in parts[3].split(",") if d.startswith("/dev/nvidia")}))
        if devices:
            found.append(GpuProcess(int(parts[0]), _safe(parts[1].strip()), parts[2].strip(), devices))
    return found


def parse_compute_apps(text: str) -> list[GpuProcess]:
    """`nvidia-smi --query-compute-apps=pid,process_name --format=csv,noheader`: `1234, /usr/bin/python3`."""
    apps: list[GpuProcess] = []
    for line in text.splitlines():
        pid, sep, name = line.partition(",")
        if sep and pid.strip().isdigit():
            apps.append(GpuProcess(int(pid.strip()), _safe(name.strip())))
    return apps


# ---- containers --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False, repr=False)
class GpuContainer(Frozen):
    id: str
    name: str
    image: str

    def describe(self) -> str:
        return f"container {self.name or self.id[:12]} ({self.image}, {self.id[:12]})"


_VOID = ("", "void", "none")


def _uses_gpu(runtime: str, requests: str, env: str) -> bool:
    """DeviceRequests with the gpu capability (`docker run --gpus`), or the nvidia runtime with devices in
    NVIDIA_VISIBLE_DEVICES (CUDA images set it: without the nvidia runtime it means nothing)."""
    if re.search(r'"Capabilities"\s*:\s*\[\s*\[[^\]]*"gpu"', requests) or re.search(r'"Driver"\s*:\s*"nvidia"', requests):
        return True
    visible = re.search(r'"NVIDIA_VISIBLE_DEVICES=([^"]*)"', env)
    return runtime == "nvidia" and visible is not None and visible.group(1).strip().lower() not in _VOID


def parse_containers(text: str) -> list[GpuContainer]:
    """`docker inspect --format` lines `ID<TAB>/name<TAB>image<TAB>runtime<TAB>DeviceRequests JSON<TAB>Env JSON`
    -> the containers that use GPUs."""
    found: list[GpuContainer] = []
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) < 6 or not re.fullmatch(r"[0-9a-f]{12,64}", parts[0].strip()):
            continue
        if _uses_gpu(parts[3].strip(), parts[4], parts[5]):
            found.append(GpuContainer(parts[0].strip(), _safe(parts[1].strip().lstrip("/")), _safe(parts[2].strip())))
    return found


# ---- module use counts -------------------------------------------------------------------------------------------


def parse_refcounts(text: str) -> dict[str, tuple[int, tuple[str, ...]]]:
    """Probe lines `MODULE REFCNT [HOLDER...]` -> {module: (refcnt, holder modules)}."""
    counts: dict[str, tuple[int, tuple[str, ...]]] = {}
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 2 and words[1].isdigit():
            counts[words[0]] = (int(words[1]), tuple(words[2:]))
    return counts


# ---- the facts ---------------------------------------------------------------------------------------------------

# without systemctl the units are unread (status 1, nothing printed; exit 3 from a subshell of its own before)
GPU_SERVICE_UNITS = command("gpu_services", "if command -v systemctl >/dev/null 2>&1; then "
                            + unit_states(*SERVICE_NAMES) + "; else false; fi", parse_units, module=_M)
# one `ls -l` over every process's fd directory; then, for the few holding /dev/nvidia*, comm and cgroup
# Without the driver loaded nothing can hold the GPU (a /dev/nvidia* node does not open, no container with a GPU
# runs), and these are read only to replace or remove a loaded driver: then they scan nothing (a process each,
# `docker ps` and `docker inspect` among them, on every node that has no driver loaded yet).
_LOADED = "[ -r /proc/driver/nvidia/version ] || exit 0; "
GPU_PROCESSES = command("gpu_processes", (
    # ls names each directory only when given more than one: with a single process, name it twice
    _LOADED + "set -- /proc/[0-9]*/fd; if [ ! -d \"$1\" ]; then [ -r /proc/modules ] && exit 0; exit 3; fi; [ $# -gt 1 ] || set -- \"$1\" \"$1\"; "
    "ls -l \"$@\" 2>/dev/null | awk '"
    "/^\\/proc\\/[0-9]+\\/fd:$/ { split($0, a, \"/\"); pid = a[3]; next } "
    "/ -> \\/dev\\/nvidia/ { d[pid] = d[pid] (d[pid] == \"\" ? \"\" : \",\") $NF } "
    "END { for (q in d) print q, d[q] }' | while read -r pid devs; do "
    '[ -d "/proc/$pid" ] || continue; '
    'cg=$(grep -E "^0::|name=systemd" "/proc/$pid/cgroup" 2>/dev/null | head -n 1); cg=${cg#*:*:}; '
    'printf "%s\\t%s\\t%s\\t%s\\n" "$pid" "$(cat "/proc/$pid/comm" 2>/dev/null)" "$cg" "$devs"; done'
), parse_fd_scan, module=_M, late=True)
COMPUTE_APPS = command("gpu_compute_apps", (
    "[ -r /proc/driver/nvidia/version ] && command -v nvidia-smi >/dev/null 2>&1 || exit 3; "
    + smi_output("--query-compute-apps=pid,process_name --format=csv,noheader")
), parse_compute_apps, module=_M, late=True)
GPU_CONTAINERS = command("gpu_containers", (
    _LOADED + "command -v docker >/dev/null 2>&1 || exit 3; "
    't=; command -v timeout >/dev/null 2>&1 && t="timeout 20"; '
    "ids=$($t docker ps -q 2>/dev/null) || exit 4; [ -n \"$ids\" ] || exit 0; tab=$(printf '\\t'); "
    '$t docker inspect --format "{{.Id}}$tab{{.Name}}$tab{{.Config.Image}}$tab{{.HostConfig.Runtime}}$tab'
    '{{json .HostConfig.DeviceRequests}}$tab{{json .Config.Env}}" $ids'
), parse_containers, module=_M, late=True)
MODULE_REFCOUNTS = command("nvidia_module_refcounts", (
    "for m in " + " ".join(MODULES) + "; do [ -r /sys/module/$m/refcnt ] || continue; "
    'printf "%s %s %s\\n" "$m" "$(cat /sys/module/$m/refcnt)" "$(ls /sys/module/$m/holders 2>/dev/null | tr "\\n" " ")"; '
    "done"
), parse_refcounts, module=_M, late=True)


def parse_owed_starts(text: str) -> tuple[str, ...]:
    """The units gpunode's journal says were stopped for a driver install and must be started again."""
    owed = owed_targets(text, "start")
    return tuple(u for u in SERVICE_NAMES if u in owed) + tuple(sorted(owed - set(SERVICE_NAMES)))


OWED_STARTS = command("gpunode_owed_starts", (  # the journal as read once per probe (containers.JOURNAL)
    f'if [ -n "${JOURNAL}" ]; then [ ${JOURNAL} = 0 ] && {{ [ -z "$gpunode_journal" ] || printf "%s\\n" "$gpunode_journal"; }}; '
    f'else cat {JOURNAL_PATH} 2>/dev/null; fi'), parse_owed_starts, module=_M)


# ---- together ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False, repr=False)
class Holders(Frozen):
    """What holds the GPU right now."""

    services: tuple[str, ...] = ()  # active known GPU services, in stop order
    processes: tuple[GpuProcess, ...] = ()  # other processes with /dev/nvidia* open (never stopped by gpunode)
    containers: tuple[GpuContainer, ...] = ()  # running containers given GPUs
    kubelet: str = ""  # an active kubelet-style unit: the node should be drained first
    node_name: str = ""  # the node's name for kubectl (its hostname)
    stuck_modules: tuple[str, ...] = ()  # modules whose users gpunode does not stop (nvidia_drm: DRM clients)
    unread: tuple[str, ...] = ()  # what could not be read (the list may be incomplete)

    @property
    def blocking(self) -> bool:
        """Something gpunode never stops holds the GPU."""
        return bool(self.processes or self.containers)

    @property
    def any(self) -> bool:
        return bool(self.services or self.blocking)

    def drain(self) -> str:
        """The kubectl command that drains this node: run where the user is (kubectl against the cluster), or on
        the node when only the node knows its name (`$(hostname)`)."""
        if self.node_name:
            return fixes.here(f"kubectl drain {shlex.quote(self.node_name)} --ignore-daemonsets --delete-emptydir-data")
        return fixes.on_node('kubectl drain "$(hostname)" --ignore-daemonsets --delete-emptydir-data')

    def lines(self) -> list[str]:
        return ([f"service {u} ({service_description(u)})" for u in self.services]
                + [f"process {p.describe()}: {', '.join(p.devices) or 'a CUDA context'}" for p in self.processes]
                + [c.describe() for c in self.containers])


def _active(units: dict[str, UnitState]) -> tuple[str, ...]:
    return tuple(u for u in SERVICE_NAMES if u in units and units[u].is_active)


def gpu_holders(facts: Facts) -> Holders:
    """The services, processes and containers holding the GPU, from the facts above."""
    unread = []
    units = facts.get(GPU_SERVICE_UNITS)
    if units is None:
        unread.append("systemd units")
    active = set(_active(units or {}))
    scanned = facts.get(GPU_PROCESSES)
    if scanned is None:
        unread.append("/proc/*/fd")
    processes: dict[int, GpuProcess] = {p.pid: p for p in scanned or []}
    for app in facts.get(COMPUTE_APPS) or []:
        processes.setdefault(app.pid, app)
    containers = list(facts.get(GPU_CONTAINERS) or [])
    known = {c.id for c in containers}
    others: list[GpuProcess] = []
    for proc in sorted(processes.values(), key=lambda p: p.pid):
        if proc.unit in SERVICE_NAMES:
            active.add(proc.unit)  # a known GPU service's daemon: stopping the service ends it
            continue
        if proc.container and any(c.startswith(proc.container) or proc.container.startswith(c) for c in known):
            continue  # listed as its container
        others.append(proc)
    services = tuple(u for u in SERVICE_NAMES if u in active)
    k8s_units = facts.get(K8S_UNIT_STATES) or {}
    kubelet = next((u for u in K8S_UNITS if u in k8s_units and k8s_units[u].is_active), "")
    counts = facts.get(MODULE_REFCOUNTS) or {}
    stuck = tuple(m for m in ("nvidia_drm",) if m in counts and counts[m][0] > len(counts[m][1]))
    cluster = facts.get(CLUSTER)
    return Holders(services, tuple(others), tuple(containers), kubelet, cluster.node_name if cluster else "", stuck,
                   tuple(unread))


__all__ = ["COMPUTE_APPS", "FABRIC_MANAGER", "GPU_CONTAINERS", "GPU_PROCESSES", "GPU_SERVICES", "GPU_SERVICE_UNITS",
           "MODULES", "MODULE_REFCOUNTS", "OWED_STARTS", "SERVICE_NAMES", "GpuContainer", "GpuProcess", "Holders", "gpu_holders",
           "parse_compute_apps", "parse_containers", "parse_fd_scan", "parse_owed_starts", "parse_refcounts", "service_description"]
