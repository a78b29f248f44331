"""Container engine configuration: parse what the node has, predict what `nvidia-ctk runtime configure` will
write, and decide from the engine's *effective* configuration whether the nvidia runtime is in place. All pure.

Why predict instead of writing ourselves: nvidia-ctk is NVIDIA's supported way to wire the runtime in, and it
knows each engine's format; gpunode only needs to know beforehand what it will change, to show the diff in a dry
run and to skip it (and the engine restart) when nothing would change. The prediction reproduces the real tool
byte for byte on every real run in tests/fixtures/real/nvidia-ctk/ (v1.20 line): docker's daemon.json is
re-marshalled by Go's encoding/json (sorted keys, 4-space indent, no final newline); containerd's TOML by
go-toml v1 (sorted keys, values before tables, two spaces of indent per level, comments dropped).

"Configured" is judged on what the engine will actually load: containerd merges `imports` into the main config
(plugin sections replaced whole in containerd 1.x, merged key by key in 2.x), CRI-O merges crio.conf.d/*, docker
reads one file. A drop-in nobody imports configures nothing, and the check says so.
"""

from __future__ import annotations

import copy
import fnmatch
import json
import math
import posixpath
import re
import sys
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from gpunode.facts.registry import CAT, CAT_MAX, command, files, hushed, shared
from gpunode.journal import JOURNAL_PATH, owed_targets
from gpunode.record import Frozen

if TYPE_CHECKING:
    from gpunode.facts import Facts

_M = __name__.rsplit(".", 1)[-1]

NVIDIA = "nvidia"
RUNTIME_BINARY = "nvidia-container-runtime"
RUNTIME_PATH = "/usr/bin/nvidia-container-runtime"

DOCKER_CONFIG = "/etc/docker/daemon.json"
SNAP_DOCKER_CONFIG = "/var/snap/docker/current/config/daemon.json"
CONTAINERD_CONFIG = "/etc/containerd/config.toml"
CONTAINERD_DROPIN = "/etc/containerd/conf.d/99-nvidia.toml"
CONTAINERD_DROPIN_DIRS = ("/etc/containerd/conf.d", "/etc/containerd/config.d")
CRIO_CONFIG = "/etc/crio/crio.conf"
CRIO_DROPIN_DIR = "/etc/crio/crio.conf.d"
CRIO_DROPIN = f"{CRIO_DROPIN_DIR}/99-nvidia.conf"

DROPIN_SINCE = (1, 18, 0)  # nvidia-ctk writes containerd / CRI-O drop-ins from 1.18.0 on
V3_SINCE = (1, 17, 4)  # first nvidia-ctk that understands containerd config version 3
CONFIG_SOURCE_SINCE = (1, 17, 0)  # --config-source exists


class ConfigError(ValueError):
    """A config file the engine (and nvidia-ctk) cannot parse. gpunode never touches such a file."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


# ---- docker: daemon.json -----------------------------------------------------------------------------------


def parse_daemon_json(text: str | None, path: str = DOCKER_CONFIG) -> dict[str, Any]:
    """daemon.json -> dict. Missing or blank is `{}` (what nvidia-ctk and dockerd assume)."""
    if text is None or not text.strip():
        return {}
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(path, f"not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})") from None
    if not isinstance(data, dict):
        raise ConfigError(path, f"must hold a JSON object, found {type(data).__name__}")
    return data


def configure_docker(data: Mapping[str, Any], set_as_default: bool) -> dict[str, Any]:
    """What nvidia-ctk does to daemon.json: `runtimes.nvidia` replaced by its own entry, every other key kept,
    `default-runtime` set when asked (an existing "nvidia" default is left alone)."""
    out = copy.deepcopy(dict(data))
    runtimes = out.get("runtimes")
    runtimes = dict(runtimes) if isinstance(runtimes, dict) else {}
    runtimes[NVIDIA] = {"args": [], "path": RUNTIME_BINARY}
    out["runtimes"] = runtimes
    if set_as_default:
        out["default-runtime"] = NVIDIA
    return out


def _go_json_numbers(value: Any) -> Any:
    """Go decodes every JSON number to float64 and prints whole ones without a fraction."""
    if isinstance(value, dict):
        return {k: _go_json_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_go_json_numbers(v) for v in value]
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return int(value)
    return value


def dump_daemon_json(data: Mapping[str, Any]) -> str:
    """Go's json.MarshalIndent(v, "", "    ") of a map: sorted keys, HTML-safe escapes, no final newline."""
    text = json.dumps(_go_json_numbers(data), indent=4, sort_keys=True, ensure_ascii=False)
    for char, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"),
                          ("\u2029", "\\u2029")):
        text = text.replace(char, escaped)
    return text


# ---- TOML: parse and emit like go-toml v1 ------------------------------------------------------------------


def parse_toml(text: str | None, path: str) -> dict[str, Any]:
    if text is None or not text.strip():
        return {}
    if sys.version_info >= (3, 11):  # imported here: a node without a TOML config (docker only) never needs it
        import tomllib
    else:  # Python 3.10
        import tomli as tomllib
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(path, f"not valid TOML: {exc}") from None


_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _toml_string(value: str) -> str:
    out = []
    for char in value:
        code = ord(char)
        if char in '"\\':
            out.append("\\" + char)
        elif char in "\b\t\n\f\r":
            out.append({"\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}[char])
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\u{code:04X}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def _toml_key(key: str) -> str:
    return key if _BARE_KEY.match(key) else _toml_string(key)


def _toml_float(value: float) -> str:
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    text = format(Decimal(repr(value)), "f")  # Go's strconv.FormatFloat(v, 'f', -1, 64): never an exponent
    return text if "." in text else text + ".0"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _toml_float(value)
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):  # only inside arrays; go-toml writes those inline
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in sorted(value.items())) + "}"
    if hasattr(value, "isoformat"):
        return value.isoformat()
    raise TypeError(f"cannot write {type(value).__name__} as TOML")


def _is_table_array(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def dump_toml(data: Mapping[str, Any]) -> str:
    """Serialise like go-toml v1's Tree.WriteTo, which nvidia-ctk uses: in each table the plain values first,
    sorted, then the sub-tables, sorted, each header after a blank line, two spaces of indent per level."""
    lines: list[str] = []

    def emit(table: Mapping[str, Any], path: tuple[str, ...]) -> None:
        indent = "  " * len(path)
        for key in sorted(k for k, v in table.items() if not isinstance(v, dict) and not _is_table_array(v)):
            lines.append(f"{indent}{_toml_key(key)} = {_toml_value(table[key])}\n")
        for key in sorted(k for k, v in table.items() if isinstance(v, dict) or _is_table_array(v)):
            name = ".".join(_toml_key(p) for p in (*path, key))
            head = "  " * len(path)
            if isinstance(table[key], dict):
                lines.append(f"\n{head}[{name}]\n")
                emit(table[key], (*path, key))
            else:
                for item in table[key]:
                    lines.append(f"\n{head}[[{name}]]\n")
                    emit(item, (*path, key))

    emit(data, ())
    return "".join(lines).lstrip("\n")


# ---- containerd --------------------------------------------------------------------------------------------

CRI_PLUGIN = {1: "cri", 2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime"}
LOW_LEVEL_RUNTIMES = ("runc", "crun")


def containerd_config_version(config: Mapping[str, Any]) -> int:
    """nvidia-ctk's rule: an empty or missing file is version 2, no `version` key is version 1."""
    if not config:
        return 2
    version = config.get("version")
    return version if isinstance(version, int) and not isinstance(version, bool) else 1


def cri_plugin(version: int) -> str:
    return CRI_PLUGIN.get(version, CRI_PLUGIN[3])


def _path(data: Mapping[str, Any], *keys: str) -> Any:
    for key in keys:
        if not isinstance(data, Mapping) or key not in data:
            return None
        data = data[key]
    return data


def _ensure(data: dict[str, Any], *keys: str) -> dict[str, Any]:
    for key in keys:
        if not isinstance(data.get(key), dict):
            data[key] = {}
        data = data[key]
    return data


def add_containerd_runtime(config: Mapping[str, Any], version: int, set_as_default: bool) -> dict[str, Any]:
    """nvidia-ctk's AddRuntime: the nvidia entry starts as a copy of the runc (or crun) entry, or of built-in
    defaults when there is neither; then BinaryName points at nvidia-container-runtime. An "nvidia" default
    runtime is dropped unless --set-as-default (what the real tool did to the GPU-operator config)."""
    out = copy.deepcopy(dict(config))
    out["version"] = version
    containerd = _ensure(out, "plugins", cri_plugin(version), "containerd")
    runtimes = _ensure(containerd, "runtimes")
    template = next((runtimes[r] for r in LOW_LEVEL_RUNTIMES if isinstance(runtimes.get(r), dict)), None)
    if template is not None:
        entry = copy.deepcopy(template)
    else:
        entry = runtimes[NVIDIA] if isinstance(runtimes.get(NVIDIA), dict) else {}
        entry.update({"runtime_type": "io.containerd.runc.v2", "runtime_root": "", "runtime_engine": "",
                      "privileged_without_host_devices": False})
    options = _ensure(entry, "options")
    options["BinaryName"] = RUNTIME_PATH
    if version == 1:
        options["Runtime"] = RUNTIME_PATH
    runtimes[NVIDIA] = entry
    if set_as_default:
        containerd["default_runtime_name"] = NVIDIA
    elif containerd.get("default_runtime_name") == NVIDIA:
        del containerd["default_runtime_name"]
    return out


def import_pattern(dropin: str) -> str:
    return posixpath.dirname(dropin) + "/*.toml"


def predict_containerd(main_text: str | None, *, config: str = CONTAINERD_CONFIG, dropin: str = CONTAINERD_DROPIN,
                       set_as_default: bool, ctk: tuple[int, ...]) -> dict[str, str]:
    """The files `nvidia-ctk runtime configure --runtime=containerd` leaves behind: {path: new content}.

    From 1.18 the CRI plugin section, with the nvidia runtime added, goes to the drop-in and the main config
    only gains `imports`; a version-1 config gets a full copy written to the drop-in and is not itself touched
    (so nothing imports it: the real v1.20 run does exactly that). Before 1.18 the main config is edited."""
    main = parse_toml(main_text, config)
    version = containerd_config_version(main)
    if version >= 3 and ctk < V3_SINCE:
        raise ConfigError(config, f"config version {version} needs nvidia-ctk {'.'.join(map(str, V3_SINCE))} "
                                  f"or newer (found {'.'.join(map(str, ctk))})")
    configured = add_containerd_runtime(main, version, set_as_default)
    if ctk < DROPIN_SINCE:
        return {config: dump_toml(configured)}
    if version == 1:
        return {dropin: dump_toml(configured)}
    plugin = cri_plugin(version)
    dropin_text = dump_toml({"version": version, "plugins": {plugin: configured["plugins"][plugin]}})
    top = copy.deepcopy(main)
    imports: list[Any] = top["imports"] if isinstance(top.get("imports"), list) else []
    if import_pattern(dropin) not in imports:
        if not top:
            top["version"] = version
        top["imports"] = [*imports, import_pattern(dropin)]
    return {config: dump_toml(top), dropin: dropin_text}


def _merge_deep(into: dict[str, Any], new: Mapping[str, Any]) -> None:
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge_deep(into[key], value)
        elif isinstance(value, list) and isinstance(into.get(key), list):
            into[key] = into[key] + [v for v in value if v not in into[key]]
        else:
            into[key] = copy.deepcopy(value)


def merge_containerd(into: dict[str, Any], new: Mapping[str, Any], major: int) -> None:
    """containerd's mergeConfig: later files win, lists are appended; proxy_plugins, stream_processors and
    timeouts entries are replaced whole; so are plugin sections in containerd 1.x (2.x merges them by key)."""
    replaced = {"proxy_plugins", "stream_processors", "timeouts"} | ({"plugins"} if major < 2 else set())
    for key, value in new.items():
        if key in replaced and isinstance(value, dict):
            section = into.setdefault(key, {})
            if not isinstance(section, dict):
                into[key] = section = {}
            for name, entry in value.items():
                section[name] = copy.deepcopy(entry)
        else:
            _merge_deep(into, {key: value})


@dataclass(frozen=True, eq=False, repr=False)
class Effective(Frozen):
    """An engine's merged configuration, the files it came from, and what could not be read."""

    config: dict[str, Any]
    sources: tuple[str, ...] = ()
    unread: tuple[str, ...] = ()  # import patterns outside the directories the probe reads


def _glob_known(pattern: str, files: Mapping[str, str], known_dirs: tuple[str, ...]) -> tuple[list[str], bool]:
    directory = posixpath.dirname(pattern)
    if "*" not in pattern and "?" not in pattern and "[" not in pattern:
        return ([pattern] if pattern in files else []), directory in known_dirs or pattern in files
    matches = sorted(p for p in files if posixpath.dirname(p) == directory and fnmatch.fnmatchcase(p, pattern))
    return matches, directory in known_dirs


def effective_containerd(files: Mapping[str, str], *, config: str = CONTAINERD_CONFIG, major: int = 1,
                         known_dirs: tuple[str, ...] = CONTAINERD_DROPIN_DIRS) -> Effective:
    """Load the main config and, breadth first, every file it imports, merging as containerd does."""
    merged: dict[str, Any] = {}
    pending, loaded, unread = [config], [], []
    while pending:
        path = pending.pop(0)
        if path in loaded:
            continue
        data = parse_toml(files.get(path), path)
        merge_containerd(merged, data, major)
        loaded.append(path)
        for entry in data.get("imports", []) if isinstance(data.get("imports"), list) else []:
            entry = entry if entry.startswith("/") else posixpath.join(posixpath.dirname(path), entry)
            matches, known = _glob_known(posixpath.normpath(entry), files, known_dirs)
            if not known:
                unread.append(entry)
            pending.extend(matches)
    merged.pop("imports", None)
    return Effective(merged, tuple(p for p in loaded if p in files), tuple(unread))


# ---- what nvidia-ctk writes ----------------------------------------------------------------------------------
# One description of nvidia-ctk's entries in each engine's config, read by the checks below (docker_state,
# containerd_state, crio_state) and by uninstall, which takes exactly these out again (gpunode/undo/engines.py).


@dataclass(frozen=True, eq=False, repr=False)
class CtkWrite(Frozen):
    """One thing `nvidia-ctk runtime configure` writes: the value at `keys` (the runtime's whole table), only when
    it is `value` (a default-runtime key it set to "nvidia"), or one `item` of the list at `keys` (an import)."""

    keys: tuple[str, ...]
    value: str | None = None
    item: str | None = None


def _runtime_writes(runtimes: tuple[str, ...], default: tuple[str, ...]) -> tuple[CtkWrite, CtkWrite]:
    return CtkWrite((*runtimes, NVIDIA)), CtkWrite(default, value=NVIDIA)


def containerd_keys(plugin: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The CRI plugin's runtimes table and default-runtime key in a containerd config."""
    return ("plugins", plugin, "containerd", "runtimes"), ("plugins", plugin, "containerd", "default_runtime_name")


DOCKER_KEYS = (("runtimes",), ("default-runtime",))
CRIO_KEYS = (("crio", "runtime", "runtimes"), ("crio", "runtime", "default_runtime"))
CTK_WRITES: dict[str, tuple[CtkWrite, ...]] = {
    "docker": _runtime_writes(*DOCKER_KEYS),
    "containerd": (*(w for plugin in CRI_PLUGIN.values() for w in _runtime_writes(*containerd_keys(plugin))),
                   *(CtkWrite(("imports",), item=import_pattern(posixpath.join(d, posixpath.basename(CONTAINERD_DROPIN)))) for d in CONTAINERD_DROPIN_DIRS)),
    "crio": _runtime_writes(*CRIO_KEYS),
}


# ---- CRI-O -------------------------------------------------------------------------------------------------


def add_crio_runtime(config: Mapping[str, Any], set_as_default: bool) -> dict[str, Any]:
    """nvidia-ctk's CRI-O AddRuntime: copy of the crun/runc entry (if any) plus runtime_path and type "oci"."""
    runtimes = _path(config, "crio", "runtime", "runtimes") or {}
    template: dict[str, Any] = next((runtimes[r] for r in ("crun", "runc") if isinstance(runtimes.get(r), dict)),
                                    {})
    entry = copy.deepcopy(template)
    entry.update({"runtime_path": RUNTIME_PATH, "runtime_type": "oci"})
    runtime: dict[str, Any] = {"runtimes": {NVIDIA: entry}}
    if set_as_default:
        runtime["default_runtime"] = NVIDIA
    return {"crio": {"runtime": runtime}}


def predict_crio(main_text: str | None, *, config: str = CRIO_CONFIG, dropin: str = CRIO_DROPIN,
                 set_as_default: bool, ctk: tuple[int, ...]) -> dict[str, str]:
    """Drop-in from 1.18 (read by CRI-O without any import line), in-place edit before. No real-run fixture
    exists for CRI-O, so unlike docker and containerd this prediction is not checked byte for byte."""
    main = parse_toml(main_text, config)
    addition = add_crio_runtime(main, set_as_default)
    if ctk < DROPIN_SINCE:
        merged = copy.deepcopy(main)
        _merge_deep(merged, addition)
        return {config: dump_toml(merged)}
    return {dropin: dump_toml(addition)}


def effective_crio(files: Mapping[str, str], *, config: str = CRIO_CONFIG,
                   dropin_dir: str = CRIO_DROPIN_DIR) -> Effective:
    """crio.conf, then every file of crio.conf.d in name order, each overriding key by key."""
    merged: dict[str, Any] = {}
    sources = []
    for path in [config, *sorted(p for p in files if posixpath.dirname(p) == dropin_dir)]:
        if path in files:
            _merge_deep(merged, parse_toml(files[path], path))
            sources.append(path)
    return Effective(merged, tuple(sources))


# ---- is the nvidia runtime in place? -----------------------------------------------------------------------


@dataclass(frozen=True, eq=False, repr=False)
class RuntimeState(Frozen):
    """What the engine will run with: the nvidia runtime's binary (None: no nvidia runtime) and the default."""

    binary: str | None
    default: str | None

    @property
    def has_nvidia(self) -> bool:
        return self.binary is not None and posixpath.basename(self.binary) == RUNTIME_BINARY

    @property
    def nvidia_is_default(self) -> bool:
        return self.default == NVIDIA

    def satisfies(self, want_default: bool) -> bool:
        return self.has_nvidia and (self.nvidia_is_default or not want_default)


def runtime_binary_missing(state: RuntimeState, tools: Collection[str]) -> bool:
    """The engine's config names the nvidia runtime but its binary is not on the node: every GPU container fails.
    The one rule install's runtime step and doctor's runtime checks both apply, so they never disagree."""
    return state.has_nvidia and RUNTIME_BINARY not in tools


def docker_state(data: Mapping[str, Any]) -> RuntimeState:
    runtimes, default_key = DOCKER_KEYS
    entry = _path(data, *runtimes, NVIDIA)
    binary = entry.get("path") if isinstance(entry, dict) and isinstance(entry.get("path"), str) else None
    default = _path(data, *default_key)
    return RuntimeState(binary, default if isinstance(default, str) else None)


def containerd_state(effective: Mapping[str, Any]) -> RuntimeState:
    version = containerd_config_version(effective) if effective else 2
    runtimes, default_key = containerd_keys(cri_plugin(version))
    binary = _path(effective, *runtimes, NVIDIA, "options", "BinaryName")
    default = _path(effective, *default_key)
    return RuntimeState(binary if isinstance(binary, str) else None, default if isinstance(default, str) else None)


def crio_state(effective: Mapping[str, Any]) -> RuntimeState:
    runtimes, default_key = CRIO_KEYS
    binary = _path(effective, *runtimes, NVIDIA, "runtime_path")
    default = _path(effective, *default_key)
    return RuntimeState(binary if isinstance(binary, str) else None, default if isinstance(default, str) else None)


def cri_disabled(config: Mapping[str, Any]) -> bool:
    """Docker's bundled containerd ships `disabled_plugins = ["cri"]`: no Kubernetes on that containerd."""
    disabled = config.get("disabled_plugins")
    return isinstance(disabled, list) and any(isinstance(p, str) and p.split(".")[-1] == "cri" or
                                              p in CRI_PLUGIN.values() for p in disabled)


# ---- versions of the tools ---------------------------------------------------------------------------------

_CTK_VERSION = re.compile(r"version (\d+)\.(\d+)\.(\d+)")
_CONTAINERD_VERSION = re.compile(r"\bv?(\d+)\.(\d+)\.(\d+)")


def parse_ctk_version(text: str | None) -> tuple[int, int, int] | None:
    """`nvidia-ctk --version` -> (1, 20, 0)."""
    match = _CTK_VERSION.search(text or "")
    return (int(match[1]), int(match[2]), int(match[3])) if match else None


def parse_containerd_version(text: str | None) -> tuple[int, int, int] | None:
    """`containerd --version`: "containerd containerd.io 1.7.12 71909c1" or "... github.com/containerd/
    containerd/v2 v2.0.2 c507a0..." -> (major, minor, patch). The module path's /v2 is not a version."""
    for match in _CONTAINERD_VERSION.finditer((text or "").replace("/v2 ", " ")):
        return int(match[1]), int(match[2]), int(match[3])
    return None


# ---- which engines does the node have ----------------------------------------------------------------------


@dataclass(frozen=True, eq=False, repr=False)
class Engine(Frozen):
    name: str  # docker | containerd | crio (the value of nvidia-ctk --runtime)
    unit: str
    config: str
    dropin: str | None = None


ENGINES = {
    "docker": Engine("docker", "docker.service", DOCKER_CONFIG),
    "containerd": Engine("containerd", "containerd.service", CONTAINERD_CONFIG, CONTAINERD_DROPIN),
    "crio": Engine("crio", "crio.service", CRIO_CONFIG, CRIO_DROPIN),
}
ENGINE_BINARIES = {"docker": "dockerd", "containerd": "containerd", "crio": "crio"}
SNAP_DOCKER_UNIT = "snap.docker.dockerd.service"
ROOTLESS_UNIT = re.compile(r"^(?P<home>/home/[^/]+|/root)/\.config/systemd/user/docker\.service$")


@dataclass(frozen=True, eq=False, repr=False)
class EngineSurvey(Frozen):
    present: tuple[str, ...] = ()  # engines nvidia-ctk can configure, in ENGINES order
    snap_docker: bool = False
    rootless_docker: tuple[str, ...] = field(default=())  # home directories with a rootless docker unit


def survey_engines(tools: Mapping[str, str], unit_exists: Mapping[str, bool], files: Mapping[str, str]) -> EngineSurvey:
    """An engine is present when its systemd unit exists or its daemon binary is on PATH. Snap docker (its own
    daemon.json under /var/snap, no host runtime hooks) and rootless docker (per-user daemon) are reported
    separately: nvidia-ctk's system-wide configure does not reach them."""
    present = []
    for name, engine in ENGINES.items():
        binary = tools.get(ENGINE_BINARIES[name], "")
        if unit_exists.get(engine.unit) or (binary and not binary.startswith("/snap/")):
            present.append(name)
    snap = bool(unit_exists.get(SNAP_DOCKER_UNIT)) or SNAP_DOCKER_CONFIG in files or \
        tools.get("docker", "").startswith("/snap/")
    rootless = tuple(sorted(m["home"] for p in files if (m := ROOTLESS_UNIT.match(p))))
    return EngineSurvey(tuple(present), snap, rootless)


# ---- engine versions, CDI specs ---------------------------------------------------------------------------------

_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def parse_engine_versions(text: str) -> dict[str, tuple[int, ...]]:
    """`docker Docker version 24.0.7, build afdd53b` -> {"docker": (24, 0, 7)}; also dockerd and podman."""
    found: dict[str, tuple[int, ...]] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        match = _VERSION.search(rest)
        if name and match:
            found[name] = tuple(int(g) for g in match.groups() if g is not None)
    return found


def parse_cdi(text: str) -> list[tuple[str, str | None]]:
    """`spec PATH [libnvidia-ml.so.VERSION]` -> [(path, driver version the spec mounts, or None)]."""
    specs = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "spec":
            version = parts[2].split("libnvidia-ml.so.", 1)[1] if len(parts) > 2 and "so." in parts[2] else None
            specs.append((parts[1], version))
    return specs


# ---- the facts ------------------------------------------------------------------------------------------------

DOCKER_DAEMON = files("docker_daemon", (DOCKER_CONFIG, SNAP_DOCKER_CONFIG), module=_M)
CONTAINERD_FILES = files("containerd_config", (CONTAINERD_CONFIG, *(f"{d}/*.toml" for d in CONTAINERD_DROPIN_DIRS)),
                         module=_M)
CRIO_FILES = files("crio_config", (CRIO_CONFIG, f"{CRIO_DROPIN_DIR}/*"), module=_M)
ROOTLESS_DOCKER = files("rootless_docker", ("/root/.config/systemd/user/docker.service",
                                            "/home/*/.config/systemd/user/docker.service"), module=_M)
CTK_CONFIG = files("doctor_ctk_config", ("/etc/nvidia-container-runtime/config.toml",), module=_M, full_only=True)
CTK_VERSION = command("nvidia_ctk_version", "nvidia-ctk --version", parse_ctk_version, module=_M)
CONTAINERD_VERSION = command("containerd_version", "containerd --version", parse_containerd_version, module=_M, late=True)
# client versions (no daemon contacted)
ENGINE_VERSIONS = command("doctor_engines", (
    'command -v docker >/dev/null 2>&1 && echo "docker $(docker --version 2>/dev/null | head -n 1)"; '
    'command -v dockerd >/dev/null 2>&1 && echo "dockerd $(dockerd --version 2>/dev/null | head -n 1)"; '
    'command -v podman >/dev/null 2>&1 && echo "podman $(podman --version 2>/dev/null | head -n 1)"; true'
), parse_engine_versions, module=_M, full_only=True)
# CDI specs and the driver version their library mounts name
CDI_SPECS = command("doctor_cdi", (
    'for f in /etc/cdi/*.yaml /etc/cdi/*.json /var/run/cdi/*.yaml /var/run/cdi/*.json; do [ -f "$f" ] || '
    'continue; echo "spec $f $(grep -o "libnvidia-ml\\.so\\.[0-9][0-9.]*[0-9]" "$f" 2>/dev/null | head -n 1)"; '
    'done; true'
), parse_cdi, module=_M, full_only=True)


# ---- what the running daemons loaded, and restarts gpunode still owes ------------------------------------------

@dataclass(frozen=True, eq=False, repr=False)
class LoadedRuntimes(Frozen):
    """The runtimes a running engine has loaded (which may differ from its config file until it restarts)."""

    runtimes: frozenset[str]
    default: str | None

    def satisfies(self, want_default: bool) -> bool:
        return NVIDIA in self.runtimes and (not want_default or self.default == NVIDIA)


DOCKER_BUILTIN_SHIMS = "io.containerd."  # dockerd's built-in runtimes named by their containerd shim


def parse_docker_loaded(text: str) -> LoadedRuntimes | None:
    """What dockerd loaded, from the Engine API's `GET /info` body (a JSON object: DOCKER_LOADED asks the socket
    itself where it can), from `docker info --format '{{json .DefaultRuntime}} {{json .Runtimes}}'` (the two
    JSON values on one line), or, where the running dockerd started after daemon.json last changed, from that
    file (`config PATH`, then the file; none: dockerd's defaults): its runtimes and runc, the built-in one every
    dockerd has, and its default runtime (runc unless it names one). The shim names dockerd also reports as built
    in (`io.containerd.runc.v2`, `io.containerd.runtime.v1.linux`: which ones depends on its version and on whether
    it was reloaded) are left out of the set, so that both ways of asking give one value. None when the daemon did
    not answer (not running, no docker)."""
    text = text.strip()
    try:
        if text.startswith("config "):
            body = text.partition("\n")[2].strip()
            config = json.loads(body) if body else {}
            listed = config.get("runtimes", {})
            if not isinstance(listed, dict):
                return None
            default, runtimes = config.get("default-runtime", "runc"), {"runc": {}, **listed}
        elif text.startswith("{"):
            info = json.loads(text)
            default, runtimes = info.get("DefaultRuntime"), info.get("Runtimes")
        else:
            head, _, rest = text.partition(" ")
            default, runtimes = json.loads(head), json.loads(rest)
    except (ValueError, AttributeError):
        return None
    if not isinstance(runtimes, dict):
        return None
    return LoadedRuntimes(frozenset(str(k) for k in runtimes if not str(k).startswith(DOCKER_BUILTIN_SHIMS)),
                          default if isinstance(default, str) else None)


def parse_cri_loaded(text: str) -> LoadedRuntimes | None:
    """`crictl info` (the CRI plugin's running config) -> the runtimes containerd or CRI-O loaded; None when it
    did not answer."""
    try:
        data = json.loads(text) if text.strip() else None
    except ValueError:
        return None
    config = data.get("config") if isinstance(data, dict) else None
    runtime = config.get("containerd") if isinstance(config, dict) else None
    if not isinstance(runtime, dict) or not isinstance(runtime.get("runtimes"), dict):
        return None
    default = runtime.get("defaultRuntimeName")
    return LoadedRuntimes(frozenset(str(k) for k in runtime["runtimes"]), default if isinstance(default, str) else None)


def parse_pending(text: str) -> tuple[str, ...]:
    """The units gpunode's journal says still need a restart to load a config gpunode changed."""
    return tuple(sorted(owed_targets(text, "restart")))


# What the RUNNING dockerd loaded (its runtimes may differ from daemon.json until it restarts). dockerd reads
# daemon.json when it starts (and again on SIGHUP), so where the running dockerd started after the file and its
# directory last changed, the file is what it loaded: the section then prints `config PATH` and the file (read by
# the shell, no process but one `stat`), and asks the daemon nothing. Changed is the inode's ctime, which no program
# can set back (an mtime can be: cp -p, touch -d, a backup moved back into place); the directory's ctime covers a
# daemon.json deleted or renamed into place. That path is taken only when every step is known:
# - the CLI would ask the default socket (as below), /var/run/docker.pid names a process called dockerd, and its
#   command line names no other config file and no runtime of its own (--config-file, --add-runtime,
#   --default-runtime: the words `config-file` and `runtime` anywhere in it send it to the daemon);
# - daemon.json and /etc/docker are no symbolic links (a link re-pointed keeps its target's ctime), the directory
#   can be searched and the file, if there is one, read (a probe not run as root), with 1 to CAT_MAX bytes;
# - when it started: the process's start (/proc/PID/stat, in ticks of 1/100 s since boot) on the wall clock of now
#   (the ctime of the `stat` process's own /proc entry, made as it runs, and /proc/uptime read after it): a lower
#   bound within 10 ms. The pid file (written by that dockerd as it started) must be from 1 s before to 5 s after
#   it: else the clock was stepped since, the tick is not 1/100 s, or the file is another process's;
# - the file's and the directory's ctime (whole seconds) + 1 s before that start.
# Else, or should anything fail, the daemon is asked as before. What dockerd reports beyond daemon.json are its
# built-in runtimes (runc, io.containerd.runc.v2, ...): parse_docker_loaded lists runc, the one they all have.
# `docker info` costs most of a second on a slow node: the CLI is a 45 MB Go binary (several threads) before it
# asks the daemon. Where the CLI would ask the default socket (no DOCKER_HOST, DOCKER_CONTEXT or current context in
# its config), a few lines of perl (perl-base is essential on Debian and Ubuntu; no module loaded) ask that socket
# for the same `GET /info` the CLI sends, and print the body; else, or without perl, `docker info` as before. When
# the socket does not answer, or answers an error, perl prints nothing: the daemon does not run, as `docker info`
# would say. Each /info also makes dockerd run `runc --version` and `docker-init --version` (~7 processes on the VM).
DOCKER_SOCKET = "/var/run/docker.sock"
DOCKER_PIDFILE = "/var/run/docker.pid"
DOCKER_CONFIG_DIR = posixpath.dirname(DOCKER_CONFIG)
_DOCKER_INFO = "docker info --format '{{json .DefaultRuntime}} {{json .Runtimes}}' 2>/dev/null"
_GET_INFO = (f'alarm 60; socket(S, 1, 1, 0) && connect(S, pack("S a108", 1, "{DOCKER_SOCKET}")) or die; '
             r'syswrite S, "GET /info HTTP/1.0\r\nHost: docker\r\n\r\n"; undef $/; my $r = readline S; '
             r'$r =~ s/\AHTTP\/1\.[01] 200 .*?\r\n\r\n//s or die; print $r')
_DOCKER_STARTED_AFTER = (  # sets j when daemon.json is what the running dockerd loaded (see above)
    f'j=; if [ -r {DOCKER_PIDFILE} ] && [ -d {DOCKER_CONFIG_DIR} ] && [ -x {DOCKER_CONFIG_DIR} ] && '
    f'[ ! -h {DOCKER_CONFIG_DIR} ] && [ ! -h {DOCKER_CONFIG} ] && '
    f'{{ {{ [ -f {DOCKER_CONFIG} ] && [ -r {DOCKER_CONFIG} ]; }} || [ ! -e {DOCKER_CONFIG} ]; }}; then '
    f'p=; n=; a=; read -r p < {DOCKER_PIDFILE}; '
    'case $p in ""|*[!0-9]*) ;; *) read -r n < "/proc/$p/comm"; IFS= read -r a < "/proc/$p/cmdline" ;; esac; '
    'case $n/$a in dockerd/*runtime*|dockerd/*config-file*) ;; dockerd/*) '
    'read -r x x x x x x x x x x x x x x x x x x x x x st x < "/proc/$p/stat"; '
    # one line "CTIME SIZE" each: now, the pid file, the directory, the file (the directory again where there is
    # none), CTIME in seconds with 2 decimals (GNU stat) or whole (busybox's stat): in hundredths, with 1 s more
    # margin where whole
    f'set -- /proc/self {DOCKER_PIDFILE} {DOCKER_CONFIG_DIR}; if [ -f {DOCKER_CONFIG} ]; then e=1; '
    f'set -- "$@" {DOCKER_CONFIG}; else e=; set -- "$@" {DOCKER_CONFIG_DIR}; fi; '
    + hushed('m=$(stat -L -c "%.2Z %s" -- "$@")') + ' && read -r up x < /proc/uptime && '
    'case $m in *.*) g=10 ;; *) g=110 ;; esac && t= && while [ -n "$m" ]; do v=${m%%"\n"*}; m=${m#"$v"}; '
    'm=${m#"\n"}; z=${v#* }; v=${v%% *}; case $v in [1-9]*.[0-9][0-9]) v=${v%.*}${v#*.} ;; [1-9]*) v=${v}00 ;; '
    '*) v=x ;; esac; t="$t $v"; done && '
    # whole numbers only (arithmetic on anything else would be an error, which ends the probe's shell)
    'case "$t" in *[!0-9\\ ]*) false ;; esac && case $st.$z in *[!0-9.]*|.*|*.) false ;; esac && '
    'case $up in [1-9]*.[0-9][0-9]) ;; *) false ;; esac && '
    'set -- $t && [ $# = 4 ] && b=$(($1 - ${up%.*}${up#*.} + st)) && w=$3 && { [ $3 -ge $4 ] || w=$4; } && '
    '[ $((w + g)) -lt $b ] && [ $2 -ge $((b - 200)) ] && [ $2 -le $((b + 500)) ] && '
    f'{{ [ -z "$e" ] || {{ [ $z -ge 1 ] && [ $z -le {CAT_MAX} ]; }}; }} && j=1 ;; esac; fi; '
)
DOCKER_LOADED = command("docker_loaded_runtimes", (
    CAT + f'c=; [ -n "$DOCKER_HOST$DOCKER_CONTEXT" ] && c=1; f=${{DOCKER_CONFIG:-$HOME/.docker}}/config.json; '
    '[ -r "$f" ] && while IFS= read -r l; do case $l in *\"currentContext\"*) c=1 ;; esac; done < "$f"; '
    f'if [ -z "$c" ] && [ -S {DOCKER_SOCKET} ] && command -v docker >/dev/null 2>&1; then {_DOCKER_STARTED_AFTER}'
    f'else j=; fi; if [ -n "$j" ]; then echo "config {DOCKER_CONFIG}"; ! [ -e {DOCKER_CONFIG} ] || '
    f'gpunode_cat {DOCKER_CONFIG}; elif [ -z "$c" ] && [ -S {DOCKER_SOCKET} ] && command -v docker >/dev/null 2>&1 && '
    f"command -v perl >/dev/null 2>&1; then perl -e '{_GET_INFO}'; else {_DOCKER_INFO}; fi"),
                        parse_docker_loaded, module=_M)
CONTAINERD_LOADED = command("containerd_loaded_runtimes", "command -v crictl >/dev/null 2>&1 && crictl --timeout 5s "
                            "--runtime-endpoint unix:///run/containerd/containerd.sock info 2>/dev/null",
                            parse_cri_loaded, module=_M)
# exit 3: no journal (runs that change the node, and the driver step, read the journal from this section: journal_text)
# The journal is read once per probe (registry.SHARED): this fact and holders.OWED_STARTS print it.
JOURNAL = shared("gpunode_journal_rc", f"gpunode_journal_rc=3; [ -e {JOURNAL_PATH} ] && "
                 + hushed(f"gpunode_journal=$(cat {JOURNAL_PATH}); gpunode_journal_rc=$?"))
PENDING_RESTARTS = command("gpunode_pending_restarts", (
    f'if [ -n "${JOURNAL}" ]; then [ ${JOURNAL} != 3 ] || exit 3; [ -z "$gpunode_journal" ] || printf "%s\\n" "$gpunode_journal"; exit ${JOURNAL}; '
    f'fi; [ -e {JOURNAL_PATH} ] || exit 3; cat {JOURNAL_PATH} 2>/dev/null'),
                           parse_pending, module=_M)


def journal_text(facts: Facts) -> str | None:
    """The node's journal as the probe read it (the fact that reads owed restarts cats it whole), "" when there is
    none, or None when the probe could not tell (then the journal is read on its own)."""
    section = facts.section(PENDING_RESTARTS)
    if section.status == 3:
        return ""
    return section.text if section.ok and section.text.strip() else None
