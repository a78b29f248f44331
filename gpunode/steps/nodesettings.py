"""Step: keep the GPUs initialised (nvidia-persistenced) and keep the /dev/char links containers need.

Persistence: without it the driver tears a GPU's state down whenever no process holds it, so every job start pays
the initialisation again. `nvidia-smi -pm 1` lasts only until the next reboot; NVIDIA's persistence daemon keeps it
for good. Distribution driver packages ship a unit for it; the .run installer installs /usr/bin/nvidia-persistenced
but no unit, so one is written, and only when systemd knows no unit at all (a unit someone else wrote is theirs).
Some distribution units start the daemon with --no-persistence-mode (Ubuntu's); a drop-in next to such a vendor unit
turns persistence on; the same flag in a unit or drop-in under /etc is the administrator's choice and stays.

/dev/char links: with systemd managing cgroups, `systemctl daemon-reload` re-applies container device rules by
their /dev/char/MAJ:MIN path, and NVIDIA's device nodes have no such links, so running containers lose their GPUs
("Failed to initialize NVML: Unknown Error"). NVIDIA's workaround: `nvidia-ctk system create-dev-char-symlinks
--create-all` now, and a udev rule that runs it whenever the nvidia driver binds (at every boot). Only where the
container toolkit is (or is about to be) installed.

Everything is decided from the facts: the unit's state (packages.UNITS), its files and drop-ins and the udev rules
(gpunode/facts/nodesettings.py), and the links (kernel.DEV_CHAR, which the doctor reads too).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gpunode import fixes
from gpunode.facts import Facts
from gpunode.facts import kernel as kernel_facts
from gpunode.facts import nodesettings as settings_facts
from gpunode.facts import packages as package_facts
from gpunode.facts.nodesettings import SYSTEMD_UNIT_DIRS, UDEV_RULES_DIRS
from gpunode.facts.packages import UnitState, unit
from gpunode.options import Options
from gpunode.plan import Action, Earlier, RunCommand, StepPlan, WriteFile, change, ok, unknown
from gpunode.record import Frozen
from gpunode.steps.base import Step
from gpunode.steps.outputs import DriverOutputs, ToolkitOutputs

NAME = "nodesettings"
TITLE = "Persistence daemon, nvidia_uvm and /dev/char links"
READS = ("driver", "toolkit")  # decided once the driver is in place; nvidia-ctk may come with the toolkit

SERVICE = "nvidia-persistenced"
UNIT = f"{SERVICE}.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT}"
DROPIN_PATH = f"/etc/systemd/system/{UNIT}.d/50-gpunode-persistence-mode.conf"
NO_PERSISTENCE = "--no-persistence-mode"
VENDOR_DIRS = ("/usr/lib/systemd/system", "/lib/systemd/system")  # the distribution's; /etc and /run are local

RULE_PATH = "/etc/udev/rules.d/71-nvidia-dev-char.rules"
UVM_LOAD_PATH = "/etc/modules-load.d/nvidia-uvm.conf"
UVM_LOAD_TEXT = ("# Written by gpunode: CUDA needs the unified-memory module, and nvidia-ctk's /dev/char links need its\n"
                 "# device major; nothing else loads it at boot (nvidia-modprobe does only on a host program's first use).\n"
                 "nvidia-uvm\n")
CTK = "/usr/bin/nvidia-ctk"  # where the toolkit packages put it
DEV_CHAR_ARGS = ("system", "create-dev-char-symlinks", "--create-all")


def unit_text(binary: str) -> str:
    """The unit for a .run-installed driver: NVIDIA's sample unit, run as root (the .run creates no daemon user)."""
    return (
        "# Written by gpunode: the NVIDIA .run installer installs nvidia-persistenced but no unit for it.\n"
        "# The daemon keeps persistence mode on, so the GPUs stay initialised while no process uses them.\n"
        "[Unit]\n"
        "Description=NVIDIA Persistence Daemon\n"
        "Wants=syslog.target\n"
        "\n"
        "[Service]\n"
        "Type=forking\n"
        "PIDFile=/run/nvidia-persistenced/nvidia-persistenced.pid\n"
        f"ExecStart={binary} --verbose\n"
        "ExecStopPost=/bin/rm -rf /run/nvidia-persistenced\n"
        "\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    )


def dropin_text(source: str, command: str) -> str:
    return (
        f"# Written by gpunode: {source} starts nvidia-persistenced with {NO_PERSISTENCE}, which leaves\n"
        "# persistence mode off. The same command with persistence mode on; delete this file to go back.\n"
        "[Service]\n"
        "ExecStart=\n"
        f"ExecStart={command}\n"
    )


def rule_text(ctk: str) -> str:
    return (
        "# Written by gpunode: when the nvidia driver binds (at every boot), link its device nodes from /dev/char.\n"
        "# Without the links, `systemctl daemon-reload` takes the GPUs away from running containers (\"Failed to\n"
        "# initialize NVML: Unknown Error\"); this is NVIDIA Container Toolkit's documented workaround.\n"
        f'ACTION=="add", DEVPATH=="/bus/pci/drivers/nvidia", RUN+="{ctk} {" ".join(DEV_CHAR_ARGS)}"\n'
    )


# ---- systemd and udev files, as the probe read them (pure) -------------------------------------------------


def _layered(files: Mapping[str, str], dirs: tuple[str, ...], name_ok: Callable[[str], bool],
             sub: str = "") -> list[str]:
    """Files of a search path the way systemd and udev layer them: one per file name, the first directory wins
    (/etc over /run over /usr/lib); in file-name order."""
    chosen: dict[str, str] = {}
    for directory in dirs:
        prefix = f"{directory}/{sub}"
        for path in sorted(files):
            name = path[len(prefix):]
            if path.startswith(prefix) and "/" not in name and name_ok(name):
                chosen.setdefault(name, path)
    return [chosen[name] for name in sorted(chosen)]


def unit_files(files: Mapping[str, str]) -> tuple[str | None, list[str]]:
    """(the unit file systemd loads, its drop-ins in the order systemd applies them)."""
    main = next((f"{d}/{UNIT}" for d in SYSTEMD_UNIT_DIRS if f"{d}/{UNIT}" in files), None)
    return main, _layered(files, SYSTEMD_UNIT_DIRS, lambda n: n.endswith(".conf"), f"{UNIT}.d/")


def exec_start(files: Mapping[str, str]) -> tuple[str, str] | None:
    """(the ExecStart command line in effect, the file that set it), from the unit and its drop-ins; an empty
    `ExecStart=` in a drop-in resets what came before."""
    main, dropins = unit_files(files)
    found: tuple[str, str] | None = None
    for path in ([main] if main else []) + dropins:
        section = ""
        for raw in files[path].splitlines():
            line = raw.strip()
            if not line or line.startswith(("#", ";")):
                continue
            if line.startswith("[") and line.endswith("]"):
                section = line[1:-1]
                continue
            key, sep, value = line.partition("=")
            if sep and section == "Service" and key.strip() == "ExecStart":
                found = (value.strip(), path) if value.strip() else None
    return found


def dev_char_rules(files: Mapping[str, str]) -> list[str]:
    """The udev rules in effect that run `create-dev-char-symlinks`."""
    active = _layered(files, UDEV_RULES_DIRS, lambda n: n.endswith(".rules"))
    return [path for path in active if any("create-dev-char-symlinks" in line and not line.lstrip().startswith("#")
                                           for line in files[path].splitlines())]


# ---- plan ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False, repr=False)
class Part(Frozen):
    reason: str
    actions: tuple[Action, ...] = ()
    notes: tuple[str, ...] = ()


def _systemctl(summary: str, *args: str) -> RunCommand:
    return RunCommand(summary, ("systemctl", *args), timeout=120)


def _persistence(facts: Facts, loaded: bool) -> Part:
    state: UnitState = unit(facts[package_facts.UNITS], UNIT)
    if state.masked:
        return Part(f"{UNIT} is masked: left alone", notes=(
            "persistence mode is not kept; `" + fixes.on_node(f"sudo systemctl unmask {SERVICE}")
            + "` and run again to have it",))
    actions: list[Action] = []
    problems: list[str] = []
    notes: list[str] = []
    reload = restart = False
    on_disk = facts[settings_facts.PERSISTENCED_UNIT]
    files = dict(on_disk)
    if not state.exists:
        if UNIT_PATH in files:
            problems.append(f"systemd has not loaded {UNIT_PATH} yet")
        else:
            binary = facts.tools.get(SERVICE)
            if not binary:
                return Part("nvidia-persistenced is not installed: persistence mode is not kept", notes=(
                    "it comes with the driver (the .run installs /usr/bin/nvidia-persistenced; distributions package "
                    "it as nvidia-persistenced or in nvidia-compute-utils); install it, then run again",))
            files[UNIT_PATH] = unit_text(binary)
            actions.append(WriteFile(f"write {UNIT_PATH} (the driver came without a unit)", path=UNIT_PATH,
                                     after=files[UNIT_PATH]))
            problems.append(f"no {UNIT}")
        reload = True

    command = exec_start(files)
    if command and NO_PERSISTENCE in command[0].split():
        line, source = command
        if source.rpartition("/")[0] in VENDOR_DIRS:
            fixed = " ".join(word for word in line.split() if word != NO_PERSISTENCE)
            files[DROPIN_PATH] = dropin_text(source, fixed)
            actions.append(WriteFile(f"drop-in: run nvidia-persistenced without {NO_PERSISTENCE}", path=DROPIN_PATH,
                                     before=on_disk.get(DROPIN_PATH), after=files[DROPIN_PATH]))
            problems.append(f"{source} starts it with {NO_PERSISTENCE}")
            reload = restart = True
        else:
            notes.append(f"{source} starts nvidia-persistenced with {NO_PERSISTENCE}: persistence mode stays off "
                         "(left as configured there)")

    if reload:
        actions.append(_systemctl("reload systemd's unit files", "daemon-reload"))
    enabled = state.is_enabled
    if loaded:
        if not state.exists or (not enabled and not state.is_active):
            actions.append(_systemctl(f"enable and start {SERVICE}", "enable", "--now", SERVICE))
            if state.exists:
                problems.append(f"{UNIT} is {state.enabled} and {state.active}")
        elif not enabled:
            actions.append(_systemctl(f"enable {SERVICE} so it starts at boot", "enable", SERVICE))
            problems.append(f"{UNIT} is {state.enabled}")
        elif not state.is_active:
            actions.append(_systemctl(f"start {SERVICE}", "start", SERVICE))
            problems.append(f"{UNIT} is {state.active}")
        elif restart:
            actions.append(_systemctl(f"restart {SERVICE} with persistence mode on", "restart", SERVICE))
    else:
        if not state.exists or not enabled:
            actions.append(_systemctl(f"enable {SERVICE} (it starts once the driver is loaded)", "enable", SERVICE))
            if state.exists:
                problems.append(f"{UNIT} is {state.enabled}")
        notes.append(f"the NVIDIA driver is not loaded: {SERVICE} starts with it (at the next boot)")
    if actions:
        return Part("; ".join(problems), tuple(actions), tuple(notes))
    running = "enabled and running" if loaded else "enabled"
    return Part(f"{UNIT} {running}" + (" (static: started by its driver's udev rule)"
                                       if state.enabled == "static" else ""), notes=tuple(notes))


def _uvm(facts: Facts, loaded: bool, reloaded: bool = False) -> Part:
    """nvidia_uvm loaded now (with /dev/nvidia-uvm) and at every boot: CUDA needs it, containers do not load it,
    and `nvidia-ctk system create-dev-char-symlinks --create-all` fails without its device major. `reloaded`: the
    driver step unloads it on the way (an upgrade without a reboot), so it is not loaded when this step runs."""
    actions: list[Action] = []
    problems: list[str] = []
    lists = facts[settings_facts.MODULES_LOAD]
    at_boot = settings_facts.loads_at_boot(lists, "nvidia-uvm")
    if not at_boot:
        actions.append(WriteFile(f"load nvidia_uvm at boot ({UVM_LOAD_PATH})", path=UVM_LOAD_PATH,
                                 before=lists.get(UVM_LOAD_PATH), after=UVM_LOAD_TEXT))
        problems.append("nothing loads nvidia_uvm at boot")
    if loaded:
        devices = facts.get(kernel_facts.DEV_CHAR)
        no_node = devices is not None and "/dev/nvidia-uvm" not in devices.devices
        uvm_loaded = facts.module_loaded("nvidia_uvm") and not reloaded
        if not uvm_loaded or no_node:
            # nvidia-modprobe (from the driver) loads the module AND creates /dev/nvidia-uvm{,-tools}
            argv = ("nvidia-modprobe", "-u", "-c=0") if facts.has("nvidia-modprobe") else ("modprobe", "nvidia-uvm")
            actions.append(RunCommand("load nvidia_uvm and create /dev/nvidia-uvm", argv, timeout=120))
            problems.append(("nvidia_uvm is unloaded by the driver step's upgrade" if reloaded else
                             "nvidia_uvm is not loaded") if not uvm_loaded else "/dev/nvidia-uvm is missing")
    if actions:
        return Part("; ".join(problems), tuple(actions))
    return Part(f"nvidia_uvm {'loaded and ' if loaded else ''}loaded at boot by {at_boot[0]}")


def _dev_char(facts: Facts, earlier: Earlier, loaded: bool) -> Part:
    found = facts.tools.get("nvidia-ctk")
    toolkit = earlier.outputs("toolkit", ToolkitOutputs)
    coming = found is None and toolkit is not None and toolkit.installs
    if found is None and not coming:
        return Part("no NVIDIA Container Toolkit (nvidia-ctk): no /dev/char links to keep")
    ctk = found or CTK
    actions: list[Action] = []
    problems: list[str] = []
    notes = [f"nvidia-ctk comes with the toolkit step (expected at {CTK})"] if coming else []
    udev = facts[settings_facts.UDEV_NVIDIA]
    rules = dev_char_rules(udev)
    if not rules:
        actions.append(WriteFile("udev rule: re-create the /dev/char links whenever the nvidia driver binds",
                                 path=RULE_PATH, before=udev.get(RULE_PATH), after=rule_text(ctk)))
        problems.append("no udev rule re-creates the /dev/char links at boot")
    links = facts.get(kernel_facts.DEV_CHAR)
    if loaded and links is not None:
        missing = links.missing
        if missing or not links.links:
            what = ", ".join(d.rsplit("/", 1)[-1] for d in missing) if missing else "any NVIDIA device"
            actions.append(RunCommand("link the NVIDIA device nodes from /dev/char",
                                      ("nvidia-ctk", *DEV_CHAR_ARGS), timeout=120))
            problems.append(f"no /dev/char link for {what}")
    elif loaded:
        notes.append("could not list /dev: the /dev/char links were not checked")
    else:
        notes.append("the NVIDIA driver is not loaded: the udev rule links its devices when it binds")
    if actions:
        return Part("; ".join(problems), tuple(actions), tuple(notes))
    if loaded and links is not None:
        return Part(f"/dev/char links in place, re-created at boot by {rules[0]}", notes=tuple(notes))
    return Part(f"{rules[0]} links the NVIDIA devices from /dev/char when the driver binds", notes=tuple(notes))


def plan(facts: Facts, options: Options, earlier: Earlier | None = None) -> StepPlan:
    earlier = earlier or Earlier({}, READS)
    if not facts.gpus:
        return ok(NAME, "no NVIDIA GPU on this node: no persistence daemon or /dev/char links to set up")
    loaded = facts.loaded_driver is not None
    driver = earlier.outputs("driver", DriverOutputs)
    reloads = False
    if driver is not None and driver.changes and driver.version:
        running = facts.loaded_driver.version if facts.loaded_driver else None
        if not loaded:
            return unknown(NAME, f"the driver step installs or loads NVIDIA driver {driver.version} first: decided "
                                 "once it is loaded")
        if running != driver.version:
            if not driver.reloads:
                return unknown(NAME, f"the driver step replaces the loaded driver {running} with {driver.version} "
                                     "first: decided once that is loaded")
            # an upgrade without a reboot: the driver step unloads every nvidia module and loads only nvidia (and
            # starts the GPU services it stopped again), so nvidia_uvm is this step's to load again; the rest is
            # as now (once the new driver runs, the facts decide)
            reloads = True
    if not (loaded or facts.has(SERVICE) or facts.has("nvidia-smi")):
        return ok(NAME, "no NVIDIA driver installed: nothing to keep persistent (install one with --driver VERSION)")
    parts = (_persistence(facts, loaded), _uvm(facts, loaded, reloaded=reloads), _dev_char(facts, earlier, loaded))
    reason = "; ".join(p.reason for p in parts)
    actions = [a for p in parts for a in p.actions]
    notes = [n for p in parts for n in p.notes]
    return change(NAME, reason, actions, *notes) if actions else ok(NAME, reason, *notes)


STEP = Step(NAME, TITLE, plan, READS)
