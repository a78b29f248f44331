"""Container layer: an engine, the NVIDIA Container Toolkit, each engine's effective configuration (docker's
daemon.json; containerd's main config plus the drop-ins it actually imports; CRI-O's crio.conf.d), default
runtimes, docker's version, snap and rootless docker, /dev/char links and CDI specs.

Configuration is judged with gpunode/facts/containers.py, the same code the runtime step plans with, so doctor
and install never disagree about whether an engine is configured.
"""

from __future__ import annotations

import posixpath
from typing import Any

from gpunode import fixes, rules
from gpunode.doctor.base import NO_GPU, Node, Verdict, check, failed, passed, skipped, warned
from gpunode.facts import containers as container_facts
from gpunode.facts import kernel as kernel_facts
from gpunode.facts import packages as package_facts
from gpunode.facts.containers import (
    CONTAINERD_CONFIG,
    CONTAINERD_DROPIN_DIRS,
    CRIO_CONFIG,
    DOCKER_CONFIG,
    ENGINES,
    NVIDIA,
    SNAP_DOCKER_CONFIG,
    SNAP_DOCKER_UNIT,
    ConfigError,
    Effective,
    RuntimeState,
    containerd_config_version,
    containerd_state,
    cri_disabled,
    cri_plugin,
    crio_state,
    docker_state,
    effective_containerd,
    effective_crio,
    parse_daemon_json,
    parse_toml,
    runtime_binary_missing,
)
from gpunode.facts.packages import unit


def runtime_fix(engine: str) -> fixes.Fix:
    return fixes.gpunode("install", only="runtime", engines=[engine])
CTK_CONFIG = "/etc/nvidia-container-runtime/config.toml"


def _engines(node: Node) -> list[str]:
    found = list(node.survey.present)
    if node.facts.has("podman"):
        found.append("podman")
    if node.survey.snap_docker:
        found.append("snap docker")
    found += [f"rootless docker ({home})" for home in node.survey.rootless_docker]
    return found


def _docker(node: Node) -> dict[str, Any]:
    return parse_daemon_json(node.facts.files.get(DOCKER_CONFIG))


def _containerd(node: Node) -> tuple[dict[str, Any], Effective]:
    files = node.facts.files
    main = parse_toml(files.get(CONTAINERD_CONFIG), CONTAINERD_CONFIG)
    found = node.facts[container_facts.CONTAINERD_VERSION]
    major = found[0] if found else (2 if containerd_config_version(main) >= 3 else 1)
    return main, effective_containerd(files, major=major)


def docker_backend(node: Node) -> bool:
    """containerd next to docker and no kubelet: docker's backend, which the runtime step leaves alone (restarting
    it would disturb docker) unless --k8s or --engine containerd asks for it."""
    return "docker" in node.survey.present and not node.facts.has("kubelet")


def _runtime_installed(node: Node, state: RuntimeState) -> bool:
    return not runtime_binary_missing(state, node.facts.tools)


def _no_toolkit(node: Node) -> Verdict | None:
    """The runtime is configured with the toolkit's nvidia-ctk: without the toolkit that check is the failure."""
    if node.packages.get(rules.TOOLKIT_PACKAGES[0]) is None and not node.facts.has("nvidia-ctk"):
        return skipped("the NVIDIA Container Toolkit is not installed yet (see container.toolkit-installed)")
    return None


def _binary_missing(node: Node, what: str) -> Verdict:
    """The engine names the nvidia runtime but its binary is gone: without the toolkit package that is the
    toolkit check's failure; with it, a broken toolkit install."""
    if node.packages.get(rules.TOOLKIT_PACKAGES[0]) is None:
        return skipped(f"{what}, which is not installed (see container.toolkit-installed)")
    return failed(f"{what}, which is missing although nvidia-container-toolkit is installed",
                  rules.runtime_binary_fix(node.facts.os.package_manager))


@check("container.engine-present", "container", "a container engine is installed")
def engine_present(node: Node) -> Verdict:
    if not node.has_gpu:
        return NO_GPU
    found = _engines(node)
    if found:
        return passed(", ".join(found))
    install = fixes.on_node("sudo apt-get install -y docker.io") if node.facts.os.family == "debian" else \
        fixes.on_node("sudo dnf install -y podman") if node.facts.os.family == "rhel" else \
        fixes.join("install docker, containerd or podman")
    return warned("no docker, containerd, CRI-O or podman: nothing on this node runs GPU containers",
                  install + "  # then: " + fixes.gpunode("install"))


@check("container.toolkit-installed", "container", "NVIDIA Container Toolkit installed")
def toolkit_installed(node: Node) -> Verdict:
    if not node.has_gpu:
        return NO_GPU
    have = {name: node.packages.get(name) for name in rules.TOOLKIT_PACKAGES}
    main = have[rules.TOOLKIT_PACKAGES[0]]
    ctk = node.facts[container_facts.CTK_VERSION]
    ctk_text = f" (nvidia-ctk {'.'.join(map(str, ctk))})" if ctk else ""
    if main is None:
        if node.facts.has("nvidia-ctk"):
            return passed(f"nvidia-ctk installed outside the package manager{ctk_text}")
        if not _engines(node):
            return skipped("no container engine, and no toolkit")
        return failed("nvidia-container-toolkit is not installed: containers cannot get the GPU",
                      fixes.gpunode("install", only="toolkit"))
    wrong = [f"{name} {pkg.version if pkg else 'missing'}" for name, pkg in have.items()
             if pkg is None or pkg.upstream != main.upstream]
    if wrong:
        return failed(f"nvidia-container-toolkit {main.version}, but {', '.join(wrong)} (the four toolkit packages "
                      "must carry the same version)", fixes.gpunode("install", only="toolkit", toolkit_version=main.upstream))
    return passed(f"nvidia-container-toolkit {main.version}{ctk_text}")


@check("container.docker-version", "container", "docker >= 19.03 (--gpus)")
def docker_version(node: Node) -> Verdict:
    if not node.has_gpu:
        return NO_GPU
    if "docker" not in node.survey.present and not node.survey.snap_docker:
        return skipped("no docker")
    version = node.engines.get("dockerd") or node.engines.get("docker")
    if version is None:
        return skipped("docker did not print its version")
    shown = ".".join(map(str, version))
    if version[:2] < (19, 3):
        return failed(f"docker {shown}: --gpus needs docker 19.03 or newer",
                      fixes.on_node("sudo apt-get install -y docker.io") + "  # or docker-ce from Docker's "
                      "repository; then: " + fixes.gpunode("install", only="runtime"))
    return passed(f"docker {shown}")


@check("container.docker-nvidia-runtime", "container", "docker configured for nvidia (daemon.json)")
def docker_runtime(node: Node) -> Verdict:
    if not node.has_gpu:
        return NO_GPU
    if "docker" not in node.survey.present:
        return skipped("no system docker")
    if (missing := _no_toolkit(node)) is not None:
        return missing
    try:
        state = docker_state(_docker(node))
    except ConfigError as exc:
        return failed(f"{exc}: dockerd refuses to start with it",
                      fixes.on_node(f"sudo python3 -m json.tool {DOCKER_CONFIG}") + "  # shows where it breaks; "
                      "repair it, then: " + runtime_fix("docker"))
    if not state.has_nvidia:
        where = DOCKER_CONFIG if DOCKER_CONFIG in node.facts.files else f"{DOCKER_CONFIG} does not exist:"
        return failed(f"{where} no nvidia runtime (docker --runtime=nvidia and CDI need it)",
                      runtime_fix("docker"))
    if not _runtime_installed(node, state):
        return _binary_missing(node, f"{DOCKER_CONFIG} names {state.binary}")
    return passed(f"{DOCKER_CONFIG}: runtimes.nvidia -> {state.binary}")


def _orphan_dropins(node: Node, effective: Effective) -> list[str]:
    """Drop-ins that define the nvidia runtime but that the main config does not import."""
    orphans = []
    for path, text in sorted(node.facts.files.items()):
        if posixpath.dirname(path) not in CONTAINERD_DROPIN_DIRS or path in effective.sources:
            continue
        try:
            if containerd_state(parse_toml(text, path)).has_nvidia:
                orphans.append(path)
        except ConfigError:
            continue
    return orphans


@check("container.containerd-nvidia-runtime", "container", "containerd configured for nvidia (config + imports)")
def containerd_runtime(node: Node) -> Verdict:
    """containerd reads config.toml and only the drop-ins its `imports` name: a 99-nvidia.toml nobody imports
    configures nothing (version-1 configs never import it)."""
    if not node.has_gpu:
        return NO_GPU
    if "containerd" not in node.survey.present:
        return skipped("no containerd")
    if (missing := _no_toolkit(node)) is not None:
        return missing
    try:
        main, effective = _containerd(node)
    except ConfigError as exc:
        return failed(f"{exc}: containerd refuses to start with it",
                      f"repair {exc.path} (containerd config dump shows what it would load), then: "
                      + runtime_fix("containerd"))
    state = containerd_state(effective.config)
    if state.has_nvidia:
        if not _runtime_installed(node, state):
            return _binary_missing(node, f"containerd's nvidia runtime points at {state.binary}")
        return passed(f"nvidia runtime ({state.binary}) loaded from {', '.join(effective.sources)}")
    orphans = _orphan_dropins(node, effective)
    if orphans:
        version = containerd_config_version(main) if main else 2
        imports = main.get("imports") if isinstance(main.get("imports"), list) else []
        why = (f"config version {version} never imports drop-ins" if version == 1 else
               f"its imports are {imports}" if imports else "it has no `imports`")
        return failed(f"{', '.join(orphans)} defines the nvidia runtime, but {CONTAINERD_CONFIG} does not import it "
                      f"({why}): containerd runs without it", runtime_fix("containerd"))
    if main and cri_disabled(main):
        return passed(f"{CONTAINERD_CONFIG} disables the CRI plugin: this containerd serves only docker, which has its "
                      "own configuration")
    if docker_backend(node):
        return passed("containerd runs under docker here and there is no kubelet: docker's configuration is what "
                      "counts (" + fixes.gpunode("install", only="runtime", k8s=True)
                      + " configures containerd for Kubernetes)")
    unread = f" (imports {', '.join(effective.unread)} were not read)" if effective.unread else ""
    return failed(f"no nvidia runtime in containerd's configuration ({', '.join(effective.sources) or 'defaults'})"
                  + unread, runtime_fix("containerd"))


@check("container.crio-nvidia-runtime", "container", "CRI-O configured for nvidia")
def crio_runtime(node: Node) -> Verdict:
    if not node.has_gpu:
        return NO_GPU
    if "crio" not in node.survey.present:
        return skipped("no CRI-O")
    if (missing := _no_toolkit(node)) is not None:
        return missing
    try:
        effective = effective_crio(node.facts.files)
    except ConfigError as exc:
        return failed(f"{exc}: CRI-O refuses to start with it", f"repair {exc.path}, then: "
                      + runtime_fix("crio"))
    state = crio_state(effective.config)
    if not state.has_nvidia:
        return failed(f"no nvidia runtime in {', '.join(effective.sources) or CRIO_CONFIG}",
                      runtime_fix("crio"))
    if not _runtime_installed(node, state):
        return _binary_missing(node, f"CRI-O's nvidia runtime points at {state.binary}")
    return passed(f"nvidia runtime ({state.binary}) from {', '.join(effective.sources)}")


def _defaults(node: Node) -> tuple[list[str], list[str], list[str]]:
    """(what each engine defaults to, problems, engines serving Kubernetes without an nvidia default)."""
    shown: list[str] = []
    problems: list[str] = []
    k8s: list[str] = []
    if "docker" in node.survey.present:
        try:
            data = _docker(node)
            state = docker_state(data)
            declared = data.get("runtimes")
            runtimes: dict[str, Any] = declared if isinstance(declared, dict) else {}
            default = state.default or "runc"
            shown.append(f"docker: {default}")
            if default not in ("runc", "io.containerd.runc.v2") and default not in runtimes:
                problems.append(f"docker's default-runtime {default!r} is not in its runtimes: dockerd will not start")
            elif default == NVIDIA and not _runtime_installed(node, state):
                problems.append(f"docker defaults to nvidia, but {state.binary} is not installed: every container fails")
        except ConfigError:
            pass  # container.docker-nvidia-runtime reports it
    if "containerd" in node.survey.present:
        try:
            main, effective = _containerd(node)
            if not (main and cri_disabled(main)):
                state = containerd_state(effective.config)
                default = state.default or "runc"
                shown.append(f"containerd: {default}")
                if default != "runc" and default != NVIDIA and not _defined_containerd(effective.config, default):
                    problems.append(f"containerd's default_runtime_name {default!r} is not defined")
                elif default == NVIDIA and not state.has_nvidia:
                    problems.append("containerd defaults to nvidia, but no nvidia runtime is defined")
                elif default != NVIDIA:
                    k8s.append("containerd")
        except ConfigError:
            pass
    if "crio" in node.survey.present:
        try:
            state = crio_state(effective_crio(node.facts.files).config)
            default = state.default or "crun/runc"
            shown.append(f"CRI-O: {default}")
            if default == NVIDIA and not state.has_nvidia:
                problems.append("CRI-O defaults to nvidia, but no nvidia runtime is defined")
            elif default != NVIDIA:
                k8s.append("CRI-O")
        except ConfigError:
            pass
    return shown, problems, k8s


def _defined_containerd(config: dict[str, Any], name: str) -> bool:
    node: Any = config
    for key in ("plugins", cri_plugin(containerd_config_version(config) if config else 2), "containerd", "runtimes"):
        node = node.get(key) if isinstance(node, dict) else None
    return isinstance(node, dict) and name in node


@check("container.default-runtime", "container", "default runtime of each engine")
def default_runtime(node: Node) -> Verdict:
    """An undefined default runtime keeps the engine from starting; a default of nvidia whose binary is gone
    breaks every container. On a Kubernetes node, pods get the GPU only with nvidia as the default or with a
    RuntimeClass."""
    if not node.has_gpu:
        return NO_GPU
    shown, problems, k8s = _defaults(node)
    if not shown:
        return skipped("no docker, containerd (with CRI) or CRI-O")
    if problems:
        return failed("; ".join(problems), fixes.gpunode("install", only="runtime") + "  # or set the default "
                      "runtime back to runc in the engine's configuration and restart it")
    if node.facts.has("kubelet") and k8s:
        return warned(f"{'; '.join(shown)}: kubelet found, so pods get the GPU only with `runtimeClassName: nvidia` "
                      "(a RuntimeClass named nvidia must exist)", fixes.gpunode("install", only="runtime", k8s=True)
                      + "  # nvidia becomes the default runtime of containerd / CRI-O")
    note = "" if any(s.endswith(NVIDIA) for s in shown) else " (GPU containers ask with --gpus or --runtime=nvidia)"
    return passed("; ".join(shown) + note)


@check("container.snap-docker", "container", "docker is not the snap package")
def snap_docker(node: Node) -> Verdict:
    """Docker from the snap store keeps its own daemon.json and cannot use the host's nvidia runtime."""
    if not node.has_gpu:
        return NO_GPU
    if not node.survey.snap_docker:
        return passed("no snap docker")
    seen = [what for what, present in ((SNAP_DOCKER_UNIT, node.units.get(SNAP_DOCKER_UNIT) is not None and
                                        node.units[SNAP_DOCKER_UNIT].exists),
                                       (SNAP_DOCKER_CONFIG, SNAP_DOCKER_CONFIG in node.facts.files),
                                       (f"docker at {node.facts.tools.get('docker', '')}",
                                        node.facts.tools.get("docker", "").startswith("/snap/"))) if present]
    remove = fixes.on_node("sudo snap remove docker && sudo apt-get install -y docker.io") \
        if node.facts.os.family == "debian" else \
        fixes.on_node("sudo snap remove docker") + " && install docker-ce from Docker's repository"
    return failed(f"docker comes from the snap store ({', '.join(seen)}): it cannot use the NVIDIA runtime",
                  remove + "  # then: " + fixes.gpunode("install"))


def _no_cgroups(node: Node) -> bool:
    try:
        config = parse_toml(node.facts.files.get(CTK_CONFIG), CTK_CONFIG)
    except ConfigError:
        return False
    cli = config.get("nvidia-container-cli")
    return isinstance(cli, dict) and cli.get("no-cgroups") is True


@check("container.rootless-docker", "container", "rootless docker set up for the GPU")
def rootless_docker(node: Node) -> Verdict:
    """A rootless docker daemon cannot manage device cgroups: the toolkit must be told (no-cgroups), and each
    user's daemon.json needs the runtime; the system-wide configure does not reach it."""
    if not node.has_gpu:
        return NO_GPU
    homes = node.survey.rootless_docker
    if not homes:
        return passed("no rootless docker")
    if _no_cgroups(node):
        return passed(f"rootless docker in {', '.join(homes)}; {CTK_CONFIG} sets no-cgroups")
    home = homes[0]
    return warned(f"rootless docker in {', '.join(homes)}, but {CTK_CONFIG} does not set nvidia-container-cli."
                  "no-cgroups: its containers fail to get the GPU",
                  fixes.on_node("sudo nvidia-ctk config --set nvidia-container-cli.no-cgroups --in-place && (as that "
                                f"user) nvidia-ctk runtime configure --runtime=docker --config={home}/.config/docker/"
                                "daemon.json && systemctl --user restart docker"))


@check("container.dev-char-symlinks", "container", "/dev/char links to the NVIDIA devices")
def dev_char(node: Node) -> Verdict:
    """With systemd managing cgroups, `systemctl daemon-reload` re-applies device rules by /dev/char path; NVIDIA
    devices without those links are dropped and running containers get "Failed to initialize NVML: Unknown
    Error"."""
    if not node.has_gpu:
        return NO_GPU
    if not node.facts.loaded_driver:
        return skipped("the NVIDIA module is not loaded")
    if not _engines(node):
        return skipped("no container engine")
    found = node.facts.get(kernel_facts.DEV_CHAR)
    if found is None:
        return skipped("could not list /dev")
    if not found.container_devices:
        return skipped("no /dev/nvidia* device nodes yet (they appear on first use)")
    missing = found.missing
    if missing:
        return warned(f"no /dev/char link for {', '.join(missing)}: after `systemctl daemon-reload` running "
                      "containers lose the GPU (Failed to initialize NVML: Unknown Error)",
                      fixes.gpunode("install", only="nodesettings") + "  # the links now, and a udev rule that keeps them")
    return passed(f"{len(found.container_devices)} NVIDIA device node(s), all linked from /dev/char")


def _cdi_users(node: Node) -> list[str]:
    users = ["podman"] if node.facts.has("podman") else []
    try:
        features = _docker(node).get("features") if "docker" in node.survey.present else None
        if isinstance(features, dict) and features.get("cdi") is True:
            users.append("docker (CDI enabled)")
    except ConfigError:
        pass
    return users


@check("container.cdi-spec", "container", "CDI spec for engines that use CDI")
def cdi_spec(node: Node) -> Verdict:
    """Podman (and docker or containerd with CDI on) find GPUs through a CDI spec; one generated for another
    driver version mounts libraries that no longer exist."""
    if not node.has_gpu:
        return NO_GPU
    users = _cdi_users(node)
    if not users:
        return skipped("no engine here uses CDI (no podman; CDI not enabled in docker)")
    specs = node.facts[container_facts.CDI_SPECS]
    nvidia = [(path, version) for path, version in specs if "nvidia" in path or version]
    generate = fixes.on_node("sudo nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml")
    if not nvidia:
        return failed(f"{', '.join(users)} finds GPUs through a CDI spec, and there is none in /etc/cdi or "
                      "/var/run/cdi", generate)
    loaded = node.facts.loaded_driver.version if node.facts.loaded_driver else None
    stale = [(path, version) for path, version in nvidia if loaded and version and version != loaded]
    if stale:
        path, version = stale[0]
        return failed(f"{path} was generated for driver {version}, but {loaded} is loaded: containers would mount "
                      "libraries that are gone", fixes.on_node(f"sudo nvidia-ctk cdi generate --output={path}"))
    return passed(", ".join(path for path, _ in nvidia))


@check("container.runtime-loaded", "container", "running engines loaded the nvidia runtime their config names")
def runtime_loaded(node: Node) -> Verdict:
    """The file may be right while the daemon still runs the old config: a run cut between `nvidia-ctk runtime
    configure` and the restart. Seen in what the daemon reports (docker info, crictl info) or, when it does not
    say, in gpunode's journal (a restart recorded as owed)."""
    if not node.has_gpu:
        return NO_GPU
    units = node.facts[package_facts.UNITS]
    drifted: list[str] = []
    checked: list[str] = []
    for engine, fact in (("docker", container_facts.DOCKER_LOADED), ("containerd", container_facts.CONTAINERD_LOADED)):
        if engine not in node.survey.present or not unit(units, ENGINES[engine].unit).is_active:
            continue
        try:
            on_file = (docker_state(_docker(node)) if engine == "docker"
                       else containerd_state(_containerd(node)[1].config))
        except ConfigError:
            continue  # the configuration checks report it
        if not on_file.has_nvidia:
            continue  # the configuration checks report it
        loaded = node.facts[fact]
        if loaded is not None and NVIDIA not in loaded.runtimes:
            drifted.append(f"{engine}: the config names the nvidia runtime, but the running daemon has not loaded it "
                           "(it was not restarted)")
        elif loaded is None and ENGINES[engine].unit in node.facts[container_facts.PENDING_RESTARTS]:
            drifted.append(f"{engine}: gpunode changed its config and the restart that loads it is still pending")
        else:
            checked.append(engine)
    if drifted:
        engines = [d.split(":", 1)[0] for d in drifted]
        return failed("; ".join(drifted), fixes.gpunode("install", only="runtime", engines=engines)
                      + "  # restarts the engine so it loads the nvidia runtime")
    if not checked:
        return skipped("no running docker or containerd with the nvidia runtime configured")
    return passed(", ".join(checked) + ": the running daemon matches its config")
