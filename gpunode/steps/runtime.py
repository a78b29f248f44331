"""Step: wire the nvidia runtime into the container engines (docker, containerd, CRI-O) with nvidia-ctk.

nvidia-ctk does the writing: it is NVIDIA's supported path and knows each engine's format. gpunode predicts its
result (gpunode/facts/containers.py) to show the diff beforehand and, above all, to decide from the engine's
effective configuration whether anything would change: when the nvidia runtime is already there, nothing runs
and the engine is not restarted (restarting containerd or docker kills running workloads' shims and health).
A config the engine cannot parse is reported and left alone. Snap and rootless docker are explained, not
configured: the system-wide configure does not reach them.
"""

from __future__ import annotations

import dataclasses
import posixpath
from dataclasses import dataclass

from gpunode import fixes
from gpunode.facts import Facts
from gpunode.facts import containers as container_facts
from gpunode.facts import packages as package_facts
from gpunode.facts.containers import (
    CONFIG_SOURCE_SINCE,
    CONTAINERD_CONFIG,
    CONTAINERD_DROPIN,
    CONTAINERD_DROPIN_DIRS,
    CRIO_CONFIG,
    CRIO_DROPIN,
    DOCKER_CONFIG,
    DROPIN_SINCE,
    ENGINES,
    ConfigError,
    Effective,
    EngineSurvey,
    RuntimeState,
    configure_docker,
    containerd_config_version,
    containerd_state,
    cri_disabled,
    crio_state,
    docker_state,
    dump_daemon_json,
    effective_containerd,
    effective_crio,
    parse_ctk_version,
    parse_daemon_json,
    parse_toml,
    predict_containerd,
    predict_crio,
    runtime_binary_missing,
    survey_engines,
)
from gpunode.facts.containers import NVIDIA as NVIDIA_RUNTIME
from gpunode.facts.packages import UnitState, unit
from gpunode.options import Options
from gpunode.plan import Action, Earlier, RestartService, StepPlan, blocked, change, ok
from gpunode.record import Frozen
from gpunode.rules import runtime_binary_fix
from gpunode.steps.base import Step
from gpunode.steps.outputs import RuntimeOutputs, ToolkitOutputs

NAME = "runtime"
TITLE = "Wire the nvidia runtime into the container engines"
READS = ("toolkit",)  # nvidia-ctk may come with it
ASSUMED_CTK = DROPIN_SINCE  # what the toolkit step installs when no version is pinned: current releases
ENGINE_ALIASES = {"cri-o": "crio", "docker": "docker", "containerd": "containerd", "crio": "crio"}
DISPLAY = {"docker": "docker", "containerd": "containerd", "crio": "CRI-O"}

@dataclass(frozen=True, eq=False, repr=False)
class EnginePlan(Frozen):
    engine: str
    reason: str
    actions: tuple[Action, ...] = ()
    notes: tuple[str, ...] = ()
    blocked: tuple[str, str] | None = None  # (reason, fix)
    lasting: bool = False  # blocked by a file no earlier step touches (an unparseable config)


def _ctk_version(facts: Facts, earlier: Earlier) -> tuple[tuple[int, ...] | None, str]:
    """The nvidia-ctk that will run: the installed one, else the one the toolkit step is about to install."""
    found = facts[container_facts.CTK_VERSION]
    if found:
        return found, ""
    if facts.has("nvidia-ctk"):
        return ASSUMED_CTK, "nvidia-ctk did not print its version; predicted as a current (1.18+) release"
    toolkit = earlier.outputs("toolkit", ToolkitOutputs)
    if toolkit is not None and toolkit.installs:
        pinned = parse_ctk_version("version " + toolkit.version.split("-")[0]) if toolkit.version else None
        shown = toolkit.version.split("-")[0] if toolkit.version else "a current release"
        return pinned or ASSUMED_CTK, (f"predicted for nvidia-ctk {shown}, which the toolkit step installs first; "
                                       "decided again once it is installed")
    return None, ""


def _flags(name: str, config: str, dropin: str | None, ctk: tuple[int, ...], set_default: bool) -> tuple[str, ...]:
    argv = ["nvidia-ctk", "runtime", "configure", f"--runtime={name}", f"--config={config}"]
    if name != "docker" and ctk >= CONFIG_SOURCE_SINCE:
        argv.append("--config-source=file")  # never `containerd config dump`: we predicted from the file
    if dropin and ctk >= DROPIN_SINCE:
        argv.append(f"--drop-in-config={dropin}")  # explicit: 1.18.0 used config.d/, later conf.d/
    if set_default:
        argv.append("--set-as-default")
    return tuple(argv)


def _describe(state: RuntimeState) -> str:
    return f"nvidia runtime in place ({state.binary}" + (", the default)" if state.nvidia_is_default else ")")


def _containerd_major(facts: Facts, main: dict) -> int:
    found = facts[container_facts.CONTAINERD_VERSION]
    if found:
        return found[0]
    return 2 if containerd_config_version(main) >= 3 else 1


def _engine_plan(name: str, facts: Facts, options: Options, ctk: tuple[int, ...], state_of: UnitState,
                 toolkit_installs: bool = False) -> EnginePlan:
    files = facts.files
    engine = ENGINES[name]
    notes: list[str] = []
    want_default = options.set_as_default or (options.k8s and name in ("containerd", "crio"))
    try:
        if name == "docker":
            data = parse_daemon_json(files.get(DOCKER_CONFIG))
            before = docker_state(data)
            want_default = want_default or before.nvidia_is_default
            predicted = {DOCKER_CONFIG: dump_daemon_json(configure_docker(data, want_default))}
            after = docker_state(configure_docker(data, want_default))
            dropin = None
        elif name == "containerd":
            main = parse_toml(files.get(CONTAINERD_CONFIG), CONTAINERD_CONFIG)
            major = _containerd_major(facts, main)
            current: Effective = effective_containerd(files, major=major)
            before = containerd_state(current.config)
            notes += [f"containerd imports {p}, which gpunode did not read" for p in current.unread]
            want_default = want_default or before.nvidia_is_default
            predicted = predict_containerd(files.get(CONTAINERD_CONFIG), set_as_default=want_default, ctk=ctk)
            after = containerd_state(effective_containerd({**files, **predicted}, major=major).config)
            dropin = CONTAINERD_DROPIN
        else:
            current = effective_crio(files)
            before = crio_state(current.config)
            want_default = want_default or before.nvidia_is_default
            predicted = predict_crio(files.get(CRIO_CONFIG), set_as_default=want_default, ctk=ctk)
            after = crio_state(effective_crio({**files, **predicted}).config)
            dropin = CRIO_DROPIN
    except ConfigError as exc:
        return EnginePlan(name, f"{DISPLAY[name]}: {exc}", blocked=(
            f"{DISPLAY[name]}: {exc}",
            f"repair {exc.path} by hand ({DISPLAY[name]} itself cannot load it), then run again; gpunode and "
            "nvidia-ctk leave a file they cannot parse untouched"), lasting=True)

    if before.satisfies(want_default) and runtime_binary_missing(before, facts.tools) and not toolkit_installs:
        why = f"{DISPLAY[name]}: its nvidia runtime is {before.binary}, which is missing: every GPU container fails"
        return EnginePlan(name, why, blocked=(why, runtime_binary_fix(facts.os.package_manager)))
    if before.satisfies(want_default):
        owed = _restart_owed(name, facts, want_default, state_of)
        if owed:
            restart = RestartService(f"restart {DISPLAY[name]} so it loads the nvidia runtime", unit=engine.unit)
            return EnginePlan(name, f"{DISPLAY[name]}: {owed}", (restart,), tuple(notes))
        return EnginePlan(name, f"{DISPLAY[name]}: {_describe(before)}", notes=tuple(notes))
    if not after.satisfies(want_default):
        version = containerd_config_version(parse_toml(files.get(CONTAINERD_CONFIG), CONTAINERD_CONFIG))
        why = (f"config version {version}: nvidia-ctk writes the runtime to {CONTAINERD_DROPIN}, which a version-1 "
               "config never imports" if name == "containerd" and version == 1 else
               "nvidia-ctk's change would not reach the configuration the engine loads")
        return EnginePlan(name, f"{DISPLAY[name]}: {why}", blocked=(
            f"{DISPLAY[name]}: {why}",
            "migrate the config to version 2 (`containerd config migrate` on containerd 2, or `containerd config "
            "default` and re-apply your settings on 1.x), then run again"
            if name == "containerd" else f"check {engine.config} and its drop-ins, then run again"))

    missing = "nvidia runtime missing" if not before.has_nvidia else "nvidia is not the default runtime"
    changed = tuple((path, files.get(path), text) for path, text in predicted.items() if files.get(path) != text)
    keep = tuple(p for p, before_text, _ in changed if before_text is not None
                 and posixpath.dirname(p) not in (*CONTAINERD_DROPIN_DIRS, posixpath.dirname(CRIO_DROPIN)))
    argv = _flags(name, engine.config, dropin, ctk, want_default)
    from gpunode.actions.runtime import ConfigureRuntime

    actions: list[Action] = [ConfigureRuntime(
        f"add the nvidia runtime to {DISPLAY[name]}" + (" as its default" if want_default else ""),
        engine=name, argv=argv, files=changed, backups=keep, restart=engine.unit if state_of.is_active else "")]
    if state_of.is_active:
        actions.append(RestartService(f"restart {DISPLAY[name]} so it loads the nvidia runtime", unit=engine.unit))
    else:
        notes.append(f"{engine.unit} is not running ({state_of.active}): it loads the new config when it starts")
    if keep:
        how = "re-sorted and re-indented" if name == "docker" else "every key stays, comments do not"
        notes.append(f"nvidia-ctk rewrites {', '.join(keep)} ({how}); a copy is kept next to it")
    return EnginePlan(name, f"{DISPLAY[name]}: {missing}", tuple(actions), tuple(notes))


# what the running daemon loaded, per engine (None: it did not say; CRI-O is not asked)
LOADED = {"docker": container_facts.DOCKER_LOADED, "containerd": container_facts.CONTAINERD_LOADED}


def _restart_owed(name: str, facts: Facts, want_default: bool, state_of: UnitState) -> str | None:
    """Why a running engine must restart although its file is right: the daemon still runs the old config
    (drift, seen in `docker info` / `crictl info`), or gpunode's journal records a restart it never made (a run
    cut between the config change and the restart). None when nothing is owed."""
    if not state_of.is_active:
        return None
    loaded = facts[LOADED[name]] if name in LOADED else None
    if loaded is not None and not loaded.satisfies(want_default):
        what = "the nvidia runtime" if NVIDIA_RUNTIME not in loaded.runtimes else "nvidia as its default runtime"
        return f"the config file has the nvidia runtime, but the running daemon has not loaded {what} (restart pending)"
    if loaded is None and ENGINES[name].unit in facts[container_facts.PENDING_RESTARTS]:
        return "the config file has the nvidia runtime; the restart that loads it is still pending (gpunode journal)"
    return None


def _select(survey: EngineSurvey, options: Options, facts: Facts) -> tuple[list[str], list[str], tuple[str, str] | None]:
    """(engines to configure, notes, blocked). --engine picks explicitly; by default every engine present,
    except a containerd next to docker (docker's backend) unless --k8s asks for Kubernetes."""
    notes: list[str] = []
    unreachable = []
    if survey.snap_docker:
        unreachable.append("docker from the snap store (its daemon.json lives under /var/snap/docker and it cannot "
                           "use the host's nvidia-container-runtime)")
        notes.append("snap docker found: nvidia-ctk does not configure it; remove it (`" + fixes.on_node("snap remove docker")
                     + "`) and use docker-ce or docker.io from apt")
    for home in survey.rootless_docker:
        unreachable.append(f"rootless docker of {home}")
        notes.append(f"rootless docker in {home}: configure it as that user with `"
                     + fixes.on_node(f"nvidia-ctk runtime configure --runtime=docker --config={home}/.config/docker/"
                                     "daemon.json") + "`, `" + fixes.on_node("systemctl --user restart docker")
                     + "`, and `" + fixes.on_node("sudo nvidia-ctk config --set nvidia-container-cli.no-cgroups "
                                                  "--in-place") + "`")
    if options.engines:
        wanted = []
        for raw in options.engines:
            name = ENGINE_ALIASES.get(raw.lower(), raw.lower())
            if name not in survey.present:
                return [], notes, (f"--engine {raw}: no system {DISPLAY.get(name, name)} on this node"
                                   + (" (only " + "; ".join(unreachable) + ")" if unreachable and name == "docker"
                                      else ""),
                                   "install the engine first, or choose from: " + (", ".join(survey.present) or
                                                                                  "none found"))
            if name not in wanted:
                wanted.append(name)
        return wanted, notes, None
    selected = list(survey.present)
    if "containerd" in selected and "docker" in selected and not options.k8s:
        try:
            main = parse_toml(facts.files.get(CONTAINERD_CONFIG), CONTAINERD_CONFIG)
        except ConfigError:
            main = {}
        selected.remove("containerd")  # docker's backend: restarting it for nothing would disturb docker
        notes.append("containerd runs under docker here" + (" (its CRI plugin is disabled)" if cri_disabled(main)
                                                            else "") + ": left alone; pass --k8s or --engine "
                     "containerd to give it the nvidia runtime too")
    if not selected and unreachable:
        return [], notes, ("the only container engine is " + "; ".join(unreachable) + ", which gpunode cannot "
                           "configure", "install docker-ce/docker.io, containerd or CRI-O from the distribution, "
                           "or configure it by hand as described in the notes")
    return selected, notes, None


def plan(facts: Facts, options: Options, earlier: Earlier | None = None) -> StepPlan:
    """The plan, with the engines that have or will have the nvidia runtime as its outputs."""
    decided, engines = _plan(facts, options, earlier or Earlier({}, READS))
    return decided.with_outputs(RuntimeOutputs(tuple(engines)))


def _plan(facts: Facts, options: Options, earlier: Earlier) -> tuple[StepPlan, list[str]]:
    if not facts.gpus and not options.bake:  # an image build configures it for the GPU it will boot with
        return ok(NAME, "no NVIDIA GPU on this node: no engine needs the nvidia runtime"), []
    units = facts[package_facts.UNITS]
    survey = survey_engines(facts.tools, {name: u.exists for name, u in units.items()}, facts.files)
    selected, notes, stop = _select(survey, options, facts)
    if stop:
        return blocked(NAME, stop[0], stop[1], *notes), []
    if not selected:
        return ok(NAME, "no container engine (docker, containerd, CRI-O) on this node: nothing to wire in", *notes,
                  "install an engine, then run again to give it the nvidia runtime"), []
    ctk, ctk_note = _ctk_version(facts, earlier)
    if ctk is None:
        return blocked(NAME, "nvidia-ctk is not installed (it comes with the NVIDIA Container Toolkit)",
                       "run the toolkit step first: " + fixes.gpunode("install", only="toolkit"), *notes), []
    if ctk_note:
        notes.append(ctk_note)
    toolkit = earlier.outputs("toolkit", ToolkitOutputs)
    installs = toolkit is not None and toolkit.installs  # the toolkit step brings the runtime binary first
    plans = [_engine_plan(name, facts, options, ctk, unit(units, ENGINES[name].unit), installs) for name in selected]
    for p in plans:
        notes.extend(p.notes)
    stops = [p.blocked for p in plans if p.blocked]
    if stops:
        others = [n for n in selected if n not in {p.engine for p in plans if p.blocked}]
        fix = fixes.join_with("; ", (s[1] for s in stops)) + (f" (or pass --engine {others[0]} to configure only "
                                                               "that)" if others else "")
        stopped = blocked(NAME, "; ".join(s[0] for s in stops), fix, *notes)
        return dataclasses.replace(stopped, lasting=any(p.lasting for p in plans if p.blocked)), []
    actions = [a for p in plans for a in p.actions]
    reason = "; ".join(p.reason for p in plans)
    return (change(NAME, reason, actions, *notes) if actions else ok(NAME, reason, *notes)), selected


STEP = Step(NAME, TITLE, plan, READS)
