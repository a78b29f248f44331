"""Every check of what the user typed, in one place. Each problem is a UsageError that names the option and
the fix (exit 2), raised before anything connects, prompts, downloads or creates a directory.

Version grammar lives in gpunode/versions.py, CUDA and image lookups in gpunode/compat.py, GPU names in
gpunode/gpus.py; this module only calls them.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpunode import compat as cm
from gpunode import steps as pipeline
from gpunode import versions
from gpunode.artifacts.naming import is_url
from gpunode.artifacts.request import check_sha256_option
from gpunode.artifacts.request import request as driver_request
from gpunode.cli._target import Target
from gpunode.cli.progress import rich_bars
from gpunode.errors import UsageError
from gpunode.fleet import batches, parse_percent
from gpunode.fleetlog import LOG_LEVELS
from gpunode.inventory import InventoryHost, load_inventory
from gpunode.inventory import limit as limit_hosts
from gpunode.options import Options
from gpunode.steps.base import Step

KERNEL_MODULES = ("open", "proprietary")
ENGINE_NAMES = ("docker", "containerd", "crio", "cri-o")
_TOOLKIT_VERSION = re.compile(r"^\d+\.\d+\.\d+(-[0-9A-Za-z.+~]+)?$")


def seconds(value: float, option: str, *, zero_ok: bool = False, example: str = "60") -> float:
    """A duration in seconds: finite, and more than 0 (or at least 0 where 0 means 'do not wait')."""
    if math.isnan(value) or math.isinf(value) or value < 0 or (value == 0 and not zero_ok):
        bound = "0 or more" if zero_ok else "more than 0"
        raise UsageError(f"{option} {value:g} is not a valid number of seconds (it must be {bound})",
                         fix=f"use e.g. {option} {example}")
    return value


def target(reach: str, a: dict[str, Any], again: list[str] | None = None) -> Target:
    """The connection and fleet options -> a Target, with the fleet resolved. Nothing is contacted. `again` is
    the command line as given (the fix of a --local run that is not root)."""
    hosts = a["host"] if isinstance(a["host"], list) else [a["host"]] if a["host"] else []
    if a.get("local"):
        local_only(hosts, a.get("inventory"), again or ["gpunode"])
    for host in hosts:
        if not host.strip() or host.strip() != host or any(c.isspace() for c in host):
            raise UsageError(f"--host {host!r} is not a host name", fix="use e.g. --host gpu-01 or --host ubuntu@10.0.0.5")
    chosen = Target(list(hosts), list(a["identity"] or []), list(a["known_hosts"] or []), a["accept_new_host_key"],
                    a["ssh_config"], a["ask_pass"], a["ask_become_pass"],
                    seconds(a["connect_timeout"], "--connect-timeout", example="15"), a["json_output"],
                    local=bool(a.get("local")))
    for path, option in ([(p, "--identity") for p in chosen.identity] + [(p, "--known-hosts") for p in chosen.known_hosts]
                         + ([(chosen.ssh_config, "--ssh-config")] if chosen.ssh_config else [])):
        if not Path(path).expanduser().is_file() and option != "--known-hosts":
            raise UsageError(f"{option} {path}: no such file", fix=f"check the path given to {option}")
    if reach in ("fleet", "rolling"):
        chosen.inventory, chosen.limit, chosen.log_dir = a["inventory"], a["limit"], a["log_dir"]
        if a["parallel"] < 1:
            raise UsageError(f"--parallel {a['parallel']} must be at least 1", fix="use e.g. --parallel 8")
        chosen.parallel = a["parallel"]
        if a["log_level"] not in LOG_LEVELS:
            raise UsageError(f"--log-level {a['log_level']!r} is not one of {', '.join(LOG_LEVELS)}",
                             fix="use --log-level info (the default) or --log-level debug")
        chosen.log_level = a["log_level"]
        if chosen.log_dir and Path(chosen.log_dir).exists() and not Path(chosen.log_dir).is_dir():
            raise UsageError(f"--log-dir {chosen.log_dir} is a file, not a directory",
                             fix="pass a directory (it is created if missing)")
        chosen.fleet = _fleet(chosen)
    if reach == "rolling":
        chosen.batch = a["batch"]
        batches(chosen.fleet or [InventoryHost("node")], chosen.batch)  # raises on a bad --batch
        chosen.max_fail = parse_percent(a["max_fail"], "--max-fail")
        if chosen.fleet is None and (a["batch"] or a["max_fail"]):
            raise UsageError("--batch and --max-fail need several nodes", fix="add --inventory or more --host, or "
                             "drop --batch/--max-fail")
    return chosen


_REACH_OPTIONS = ("--host", "-H", "--inventory", "-I", "--limit", "-l")  # the options that name other nodes


def local_only(hosts: list[str], inventory: str | None, again: list[str]) -> None:
    """--local: this machine, no SSH, and as root (an engine has no terminal to answer a sudo prompt)."""
    if hosts or inventory:
        given = "--inventory" if inventory else "--host"
        here = [w for i, w in enumerate(again) if w not in _REACH_OPTIONS
                and (i == 0 or again[i - 1] not in _REACH_OPTIONS)]
        raise UsageError(f"--local and {given} ask for two different targets (--local is this machine, no SSH)",
                         fix=f"drop {given} to run here: {shlex.join(here)}  # or drop --local to reach the nodes "
                             "over SSH")
    if os.geteuid() != 0:
        raise UsageError("--local must run as root: it changes this machine, and an engine cannot answer a sudo "
                         "password prompt", fix="sudo " + shlex.join(again))


def _fleet(t: Target) -> list[InventoryHost] | None:
    """The fleet, or None for a single node (no inventory and at most one --host)."""
    if t.inventory is None and len(t.hosts) <= 1:
        if t.limit:
            raise UsageError("--limit needs --inventory or several --host", fix="drop --limit or add --inventory")
        return None
    found = load_inventory(t.inventory) if t.inventory else []
    if t.inventory and not found:
        raise UsageError(f"inventory {t.inventory} lists no hosts",
                         fix="add hosts to it (e.g. a line `gpu-01` under [gpu] in an INI inventory), or use --host")
    known = {h.name for h in found}
    found += [InventoryHost(name) for name in t.hosts if name not in known]
    chosen = limit_hosts(found, t.limit)
    if not chosen:
        raise UsageError(f"--limit {t.limit!r} matches no host", fix="list the hosts with names or groups that exist")
    return chosen


def steps(only: list[str] | None, skip: list[str] | None) -> tuple[Step, ...]:
    selected = pipeline.select(only or [], skip or [])
    if not selected:
        given = " ".join([*(f"--only {s}" for s in only or []), *(f"--skip {s}" for s in skip or [])])
        raise UsageError(f"{given} selects no step", fix="drop the --skip that names an --only step, or choose "
                         "other steps: " + ", ".join(s.name for s in pipeline.PIPELINE))
    return selected


def cuda(value: str | None) -> str | None:
    """--cuda for plan/install: a CUDA release gpunode knows."""
    return None if value is None else cm.driver_needed_for_cuda(value).cuda


def image(value: str | None) -> str | None:
    """--image for plan/install: reference syntax; nvidia/cuda tags must carry a known CUDA."""
    if value is None:
        return None
    cm.image_needs(value)
    return value.strip()


@dataclass(frozen=True)
class Request:
    """What plan / install were asked to do: the steps, in pipeline order, and the options they read."""

    steps: tuple[Step, ...]
    options: Options


def request(a: dict[str, Any], reach: Target | None) -> Request:
    """The pipeline options (and --reboot) -> a Request. Progress bars only for one node and human output."""
    chosen = steps(a["only"], a["skip"])
    quiet = reach is not None and (reach.json_output or reach.fleet is not None)
    options = pipeline_options(a, progress=not quiet)
    if options.bake:  # the steps that need no GPU, then the marker (gpunode/bake.py)
        from gpunode import bake
        from gpunode.steps import bake as bake_step

        chosen = (*(s for s in chosen if s.name in bake.BAKE_STEPS), bake_step.STEP)
    return Request(chosen, options)


_KERNEL_RELEASE = re.compile(r"^[0-9][A-Za-z0-9._+~-]*$")


def bake_options(a: dict[str, Any], driver: str | None) -> tuple[bool, str | None]:
    """--bake and --kernel: an image build needs a driver version, never reboots, and names a kernel release."""
    bake, kernel = bool(a.get("bake")), a.get("bake_kernel")
    if kernel is not None and not bake:
        raise UsageError("--kernel goes with --bake (an image build)", fix="add --bake, or drop --kernel")
    if kernel is not None and not _KERNEL_RELEASE.match(kernel):
        raise UsageError(f"--kernel {kernel!r} is not a kernel release", fix="use the name `uname -r` prints for "
                         "that kernel, e.g. --kernel 5.15.0-92-generic (ls /lib/modules lists the installed ones)")
    if bake and a.get("reboot"):
        raise UsageError("--bake never reboots: the image is rebooted when it boots as a node",
                         fix="drop --reboot (the first boot runs `gpunode install --local`, docs/engines.md)")
    if bake and not driver and not a.get("driver_run"):
        raise UsageError("--bake needs the driver to build into the image", fix="add --driver VERSION, e.g. "
                         "--driver 535.129.03")
    return bake, kernel


def pipeline_options(a: dict[str, Any], *, progress: bool) -> Options:
    """The plan/install options -> Options. Local files are read here (the --driver-run header, the cache
    listing) so that plans never do I/O."""
    driver = versions.check_driver(a["driver"])
    module = a["kernel_module"]
    if module is not None and module.strip().lower() not in KERNEL_MODULES:
        raise UsageError(f"--kernel-module {module!r} is not a kernel module flavour (allowed: open, proprietary)",
                         fix="use --kernel-module open or --kernel-module proprietary, or leave it out to let "
                         "gpunode choose from the GPUs")
    check_sha256_option(a["sha256"])
    if bool(a["module_signing_key"]) != bool(a["module_signing_cert"]):
        raise UsageError("--module-signing-key and --module-signing-cert go together",
                         fix="pass both: the private key and its certificate, as paths on the node")
    run = a["driver_run"]
    if run and not is_url(run) and not Path(run).expanduser().is_file():
        raise UsageError(f"--driver-run {run}: no such file", fix="pass a .run file or its URL")
    toolkit = a["toolkit_version"]
    if toolkit is not None and not _TOOLKIT_VERSION.match(toolkit.strip()):
        raise UsageError(f"--toolkit-version {toolkit!r} is not a toolkit version",
                         fix="use a release number such as 1.17.8 or 1.17.8-1")
    for name in a["engine"] or []:
        if name.lower() not in ENGINE_NAMES:
            raise UsageError(f"--engine {name!r} is not an engine nvidia-ctk configures",
                             fix="choose docker, containerd or crio")
    kubeconfig, replicas = kubernetes(a.get("kubeconfig"), a.get("gpu_replicas", 1))
    lock = seconds(a["lock_timeout"], "--lock-timeout", zero_ok=True, example="600")
    reboot_timeout = seconds(a.get("reboot_timeout", 900.0), "--reboot-timeout", example="900")
    fields = driver_request(driver, run, a["sha256"], module.strip() if module else None, a["module_signing_key"],
                               a["module_signing_cert"], a["cache_dir"])
    bake, bake_kernel = bake_options(a, driver)
    options = Options(reboot=a.get("reboot", False), reboot_timeout=reboot_timeout, cuda=cuda(a["cuda"]),
                      image=image(a["image"]), lock_timeout=lock, progress=rich_bars if progress else None,
                      **fields)  # type: ignore[arg-type]
    return dataclasses.replace(options, toolkit_version=toolkit.strip() if toolkit else None,
                               toolkit_packages=tuple(str(p.resolve()) for p in a["toolkit_package"] or []),
                               set_as_default=a["set_as_default"], k8s=a["k8s"],
                               engines=tuple(e.lower() for e in a["engine"] or []), kubeconfig=kubeconfig,
                               gpu_replicas=replicas, mps=a.get("mps", False),
                               mps_thread_percentage=mps_limit(a.get("mps"), a.get("mps_thread_percentage")),
                               mig_layout=mig_layout(a.get("mig_layout")), bake=bake, bake_kernel=bake_kernel,
                               hold_kernel=a.get("hold_kernel"), hold_driver=a.get("hold_driver"),
                               stop_gpu_services=a.get("stop_gpu_services", False))


_MIG_PROFILE = re.compile(r"^[1-9]g\.[0-9]+gb(\+me)?$|^[0-9]{1,2}$")


def mig_layout(text: str | None) -> tuple[str, ...]:
    """--mig-layout 1g.10gb,1g.10gb -> ("1g.10gb", "1g.10gb"): profile names (or numeric profile ids)."""
    if text is None:
        return ()
    profiles = tuple(p.strip() for p in text.split(",") if p.strip())
    bad = [p for p in profiles if not _MIG_PROFILE.match(p)]
    if not profiles or bad:
        raise UsageError(f"--mig-layout {text!r}: {bad[0] if bad else 'no profile'} is not a MIG profile",
                         fix="list GPU instance profiles as `nvidia-smi mig -lgip` names them, e.g. "
                             "--mig-layout 1g.10gb,1g.10gb,2g.20gb")
    return profiles


def mps_limit(mps: bool | None, percentage: int | None) -> int | None:
    if percentage is None:
        return None
    if not mps:
        raise UsageError("--mps-thread-percentage needs --mps", fix="add --mps, or leave the percentage out")
    if not 1 <= percentage <= 100:
        raise UsageError(f"--mps-thread-percentage {percentage} is out of range",
                         fix="pass a percentage from 1 to 100, e.g. --mps-thread-percentage 50")
    return percentage


def kubernetes(kubeconfig: str | None, replicas: int) -> tuple[str | None, int]:
    """--kubeconfig (an absolute path on the node) and --gpu-replicas (1..64)."""
    if kubeconfig is not None and (not kubeconfig.startswith("/") or "\n" in kubeconfig or "\0" in kubeconfig):
        raise UsageError(f"--kubeconfig {kubeconfig!r} is not an absolute path on the node",
                         fix="pass the kubeconfig's absolute path on the node, e.g. --kubeconfig /etc/kubernetes/admin.conf")
    if not 1 <= replicas <= 64:
        raise UsageError(f"--gpu-replicas {replicas} is out of range",
                         fix="pass a number of pods per GPU from 1 (no sharing) to 64, e.g. --gpu-replicas 4")
    return kubeconfig, replicas


def verify_options(timeout: float, engines: list[str] | None, known: tuple[str, ...]) -> list[str]:
    seconds(timeout, "--timeout", example="600")
    chosen = [e.lower() for e in engines or []]
    for name in chosen:
        if name not in known:
            raise UsageError(f"--engine {name!r} is not an engine verify runs", fix=f"choose {', '.join(known)}")
    return chosen
