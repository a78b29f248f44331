"""The checks of what the user typed that only the command line has (how to reach nodes, the fleet); the
pipeline options are checked below the CLI, in gpunode/option_checks.py, which the library shares. Each problem
is a UsageError that names the option and the fix (exit 2), raised before anything connects, prompts, downloads
or creates a directory.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpunode import option_checks
from gpunode.cli._target import Target
from gpunode.cli.progress import rich_bars
from gpunode.errors import UsageError
from gpunode.fleetlog import LOG_LEVELS
from gpunode.option_checks import Request, kubernetes, seconds
from gpunode.options import Options
from gpunode.record import Record

if TYPE_CHECKING:
    from gpunode.inventory import InventoryHost
    from gpunode.steps.base import Step

__all__ = ["Checked", "Request", "kubernetes", "local_only", "pipeline_options", "request", "seconds", "target",
           "verify_options"]


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
        if chosen.fleet is None:  # fleet options on one node: they do not apply, and the run says so
            given = [o for o, on in (("--log-dir", a["log_dir"] is not None), ("--log-level", a["log_level"] != "info"),
                                     ("--parallel", a["parallel"] != 8)) if on]
            if given:
                chosen.notes.append(f"{', '.join(given)} apply to fleet runs (several --host, or --inventory): not "
                                    "used for one node")
    if reach == "rolling":
        chosen.batch = a["batch"]
        if a["batch"] or a["max_fail"] is not None:  # without either, nothing to check: the fleet code stays unloaded
            from gpunode.fleet import batches, parse_percent
            from gpunode.inventory import InventoryHost

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
    from gpunode.inventory import InventoryHost, load_inventory  # a fleet: an inventory, or several --host
    from gpunode.inventory import limit as limit_hosts

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


@dataclass(eq=False, repr=False)
class Checked(Record):
    """A Request whose options are checked (every usage error raised) and whose steps are selected when first
    read: selecting loads the pipeline, its facts and rules, which `plan` and `install` do while their connection
    is being made (gpunode/cli/pipeline.py)."""

    values: dict[str, Any]
    options: Options

    @cached_property
    def steps(self) -> tuple[Step, ...]:
        return option_checks.selected(self.values, self.options).steps

    @property
    def step_names(self) -> tuple[str, ...]:
        """The names of `steps`. With neither --only nor --skip nor --bake every step runs, named by the pipeline's
        ORDER without loading the steps (an install's first command names them, gpunode/cli/pipeline.py)."""
        if self.values["only"] or self.values["skip"] or self.options.bake:
            return tuple(s.name for s in self.steps)
        from gpunode.steps import ORDER

        return ORDER


def request(a: dict[str, Any], reach: Target | None) -> Checked:
    """The pipeline options (and --reboot), checked below the CLI (gpunode/option_checks.py); the steps are selected
    when the run reads them. Progress bars only for one node and human output."""
    options = option_checks.checked(a)
    quiet = reach is not None and (reach.json_output or reach.fleet is not None)
    return Checked(dict(a), dataclasses.replace(options, progress=None if quiet else rich_bars))


def pipeline_options(a: dict[str, Any], *, progress: bool) -> Options:
    """The plan/install options -> Options, with the CLI's progress bars when `progress`."""
    options = option_checks.pipeline_options(a)
    return dataclasses.replace(options, progress=rich_bars) if progress else options


def verify_options(timeout: float, engines: list[str] | None, known: tuple[str, ...]) -> list[str]:
    seconds(timeout, "--timeout", example="600")
    chosen = [e.lower() for e in engines or []]
    for name in chosen:
        if name not in known:
            raise UsageError(f"--engine {name!r} is not an engine verify runs", fix=f"choose {', '.join(known)}")
    return chosen
