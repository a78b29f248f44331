"""nvidia-ctk for simulated nodes: `runtime configure` writes what NVIDIA Container Toolkit 1.20 writes
(checked against real runs in shared/fixtures/real/nvidia-ctk), plus --version and a small `cdi` subset.

Usage (from the shell wrapper: the simulator's shims/nvidia-ctk, the real-OS tier's stand-in package in
tests/realos/toolkit_repo.py): nvidia_ctk.py TOOLKIT_VERSION ARGS...
"""

import copy
import datetime
import json
import os
import sys

import tomllib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tomlw  # noqa: E402

NVIDIA_RUNTIME_PATH_DOCKER = "nvidia-container-runtime"
NVIDIA_RUNTIME_PATH_ABS = "/usr/bin/nvidia-container-runtime"
CRI_PLUGIN = {1: "cri", 2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime"}


def log(level, msg):
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    sys.stderr.write(f'time="{now}" level={level} msg={json.dumps(msg)}\n')


# ---- JSON the way Go's encoding/json reads and writes it ---------------------------------------------------


def _go_char(c):
    if c == "\n":
        return "'\\n'"
    if c == "\t":
        return "'\\t'"
    if c == "'":
        return "'\\''"
    return f"'{c}'"


def go_json_error(text, err):
    pos = err.pos
    c = text[pos] if pos < len(text) else ""
    m = err.msg
    if not c or m.startswith("Unterminated string"):
        return "unexpected end of JSON input"
    if m.startswith("Expecting property name"):
        return f"invalid character {_go_char(c)} looking for beginning of object key string"
    if m.startswith("Expecting value"):
        return f"invalid character {_go_char(c)} looking for beginning of value"
    if m.startswith("Expecting ':'"):
        return f"invalid character {_go_char(c)} after object key"
    if m.startswith("Expecting ',' delimiter"):
        depth = []
        in_str = esc = False
        for ch in text[:pos]:
            if in_str:
                if esc:
                    esc = False
                elif ch == "\\":
                    esc = True
                elif ch == '"':
                    in_str = False
            elif ch == '"':
                in_str = True
            elif ch in "[{":
                depth.append(ch)
            elif ch in "]}" and depth:
                depth.pop()
        where = "object key:value pair" if depth and depth[-1] == "{" else "array element"
        return f"invalid character {_go_char(c)} after {where}"
    if m.startswith("Extra data"):
        return f"invalid character {_go_char(c)} after top-level value"
    if m.startswith("Invalid control character"):
        return f"invalid character {_go_char(c)} in string literal"
    return m


def _go_floats(obj):
    if isinstance(obj, float) and obj.is_integer() and abs(obj) < 1e21:
        return int(obj)
    if isinstance(obj, dict):
        return {k: _go_floats(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_go_floats(v) for v in obj]
    return obj


def go_json_dumps(obj):
    s = json.dumps(_go_floats(obj), indent=4, sort_keys=True, ensure_ascii=False)
    return (s.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


# ---- docker ------------------------------------------------------------------------------------------------


def configure_docker(opts):
    path = opts["config"] or "/etc/docker/daemon.json"
    log("info", f"Loading config from {path}")
    cfg = {}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        if text.strip():
            try:
                cfg = json.loads(text)
            except json.JSONDecodeError as err:
                log("error", f"unable to load config for runtime docker: {go_json_error(text, err)}")
                return 1
        if not isinstance(cfg, dict):
            log("error", "unable to load config for runtime docker: json: cannot unmarshal array into Go value of type map[string]interface {}")
            return 1
    else:
        log("info", "Config file does not exist; using empty config")
    runtimes = cfg.get("runtimes")
    if not isinstance(runtimes, dict):
        runtimes = {}
    runtimes[opts["name"]] = {"args": [], "path": opts["path"] or NVIDIA_RUNTIME_PATH_DOCKER}
    cfg["runtimes"] = runtimes
    if opts["default"]:
        cfg["default-runtime"] = opts["name"]
    if opts["cdi"]:
        features = cfg.get("features") if isinstance(cfg.get("features"), dict) else {}
        features["cdi"] = True
        cfg["features"] = features
    out = go_json_dumps(cfg)
    if opts["dry_run"]:
        sys.stdout.write(out + "\n")
        return 0
    os.makedirs(os.path.dirname(path) or "/", exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(out)
    log("info", f"Wrote updated config to {path}")
    log("info", "It is recommended that docker daemon be restarted.")
    return 0


# ---- containerd --------------------------------------------------------------------------------------------


def _get(d, *path):
    for p in path:
        if not isinstance(d, dict) or p not in d:
            return None
        d = d[p]
    return d


def _ensure(d, *path):
    for p in path:
        if not isinstance(d.get(p), dict):
            d[p] = {}
        d = d[p]
    return d


def configure_containerd(opts):
    path = opts["config"] or "/etc/containerd/config.toml"
    dropin = opts["drop_in"] if opts["drop_in"] is not None else "/etc/containerd/conf.d/99-nvidia.toml"
    text = ""
    if os.path.exists(path):
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    try:
        cfg = tomllib.loads(text) if text.strip() else {}
    except tomllib.TOMLDecodeError as err:
        log("error", f"unable to load config for runtime containerd: {err}")
        return 1
    if not text.strip():
        version = 2
    else:
        version = int(cfg.get("version", 1))
    if version not in CRI_PLUGIN:
        log("error", f"unable to load config for runtime containerd: unsupported config version: {version}")
        return 1
    plugin = CRI_PLUGIN[version]
    log("info", f"Using config version {version}")
    log("info", f'Using CRI runtime plugin name "{plugin}"')

    work = copy.deepcopy(cfg)
    ctd = ("plugins", plugin, "containerd")
    name = opts["name"]
    # replace any previous entry: remove the runtime (and a default that pointed at it) first
    runtimes = _get(work, *ctd, "runtimes")
    if isinstance(runtimes, dict):
        runtimes.pop(name, None)
    cont = _get(work, *ctd)
    if isinstance(cont, dict) and cont.get("default_runtime_name") == name:
        del cont["default_runtime_name"]

    candidates = []
    default = _get(work, *ctd, "default_runtime_name")
    if isinstance(default, str) and default:
        candidates.append(default)
    for r in ("runc", "crun"):
        if r not in candidates:
            candidates.append(r)
    entry = None
    for r in candidates:
        found = _get(work, *ctd, "runtimes", r)
        if isinstance(found, dict):
            entry = copy.deepcopy(found)
            break
    if entry is None:
        log("warning", "Could not infer options from runtimes [{}]".format(" ".join(candidates)))
        entry = {"runtime_type": "io.containerd.runc.v2", "runtime_root": "", "runtime_engine": "",
                 "privileged_without_host_devices": False}
    options = entry.get("options") if isinstance(entry.get("options"), dict) else {}
    binary = opts["path"] or NVIDIA_RUNTIME_PATH_ABS
    options["BinaryName"] = binary
    if version == 1:
        options["Runtime"] = binary
    entry["options"] = options
    _ensure(work, *ctd, "runtimes")[name] = entry
    if opts["default"]:
        _ensure(work, *ctd)["default_runtime_name"] = name
    if opts["cdi"]:
        _ensure(work, "plugins", plugin)["enable_cdi"] = True

    if version == 1 or not dropin:
        out_doc = work
        if version == 1:
            out_doc = dict(work)
            out_doc["version"] = 1
        target = dropin or path
    else:
        out_doc = {"version": version, "plugins": {plugin: work["plugins"][plugin]}}
        target = dropin
    out = tomlw.dumps(out_doc)
    if opts["dry_run"]:
        sys.stdout.write(out)
        return 0
    os.makedirs(os.path.dirname(target) or "/", exist_ok=True)
    with open(target, "w", encoding="utf-8") as fh:
        fh.write(out)
    if version >= 2 and dropin:
        pattern = os.path.join(os.path.dirname(dropin), "*.toml")
        imports = cfg.get("imports") if isinstance(cfg.get("imports"), list) else []
        main = dict(cfg)
        if pattern not in imports:
            imports = imports + [pattern]
        main["imports"] = imports
        if "version" not in main:
            main["version"] = version
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(tomlw.dumps(main))
    log("info", f"Wrote updated config to {target}")
    log("info", "It is recommended that containerd daemon be restarted.")
    return 0


def configure_crio(opts):
    path = opts["drop_in"] or "/etc/crio/crio.conf.d/99-nvidia.toml"
    doc = {"crio": {"runtime": {"runtimes": {opts["name"]: {
        "runtime_path": opts["path"] or NVIDIA_RUNTIME_PATH_ABS, "runtime_type": "oci"}}}}}
    if opts["default"]:
        doc["crio"]["runtime"]["default_runtime"] = opts["name"]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(tomlw.dumps(doc))
    log("info", f"Wrote updated config to {path}")
    log("info", "It is recommended that crio daemon be restarted.")
    return 0


# ---- command line ------------------------------------------------------------------------------------------

BOOL_FLAGS = {"--set-as-default": "default", "--nvidia-set-as-default": "default", "--dry-run": "dry_run",
              "--cdi.enabled": "cdi", "--cdi.enable": "cdi", "--enable-cdi": "cdi"}
VALUE_FLAGS = {"--runtime": "runtime", "--config": "config", "--drop-in-config": "drop_in",
               "--nvidia-runtime-name": "name", "--nvidia-runtime-path": "path", "--runtime-path": "path",
               "--config-source": "source", "--config-mode": "mode", "--executable-path": "exe",
               "--nvidia-runtime-hook-path": "hook", "--oci-hook-path": "hook"}


def runtime_configure(args):
    opts = {"runtime": "docker", "config": None, "drop_in": None, "name": "nvidia", "path": None,
            "default": False, "dry_run": False, "cdi": False, "source": "file", "mode": "config-file",
            "exe": None, "hook": None}
    i = 0
    while i < len(args):
        a = args[i]
        flag, eq, val = a.partition("=")
        if flag in BOOL_FLAGS:
            opts[BOOL_FLAGS[flag]] = (val.lower() != "false") if eq else True
        elif flag in VALUE_FLAGS:
            if not eq:
                i += 1
                if i >= len(args):
                    sys.stderr.write(f"Incorrect Usage: flag needs an argument: {flag}\n")
                    return 1
                val = args[i]
            opts[VALUE_FLAGS[flag]] = val
        else:
            sys.stderr.write("Incorrect Usage: flag provided but not defined: -{}\n".format(a.lstrip("-").split("=")[0]))
            return 1
        i += 1
    rt = opts["runtime"]
    if rt == "docker":
        if opts["drop_in"]:
            log("error", "invalid flags: --drop-in-config is not supported for docker")
            return 1
        return configure_docker(opts)
    if rt == "containerd":
        return configure_containerd(opts)
    if rt == "crio":
        return configure_crio(opts)
    log("error", f"unrecognized runtime '{rt}'")
    return 1


def cdi(args, gpus_file="/var/lib/nodesim/gpus"):
    sub = args[0] if args else ""
    if sub == "generate":
        out = None
        for a in args[1:]:
            if a.startswith("--output="):
                out = a.split("=", 1)[1]
        if not os.path.exists("/proc/driver/nvidia/version"):
            log("error", "failed to generate CDI spec: failed to create device CDI specs: failed to initialize NVML: ERROR_LIBRARY_NOT_FOUND")
            return 1
        lines = ["---", "cdiVersion: 0.5.0", "containerEdits:", "  deviceNodes:", "  - path: /dev/nvidiactl",
                 "devices:"]
        with open(gpus_file, encoding="utf-8") as fh:
            gpus = [ln.rstrip("\n").split("\t") for ln in fh if ln.strip()]
        for g in gpus:
            for nm in (g[0], g[17]):
                lines += ["- containerEdits:", "    deviceNodes:", f"    - path: /dev/nvidia{g[0]}", f"  name: \"{nm}\""]
        lines += ["- containerEdits:", "    deviceNodes:"] + [f"    - path: /dev/nvidia{g[0]}" for g in gpus]
        lines += ["  name: all", "kind: nvidia.com/gpu", ""]
        text = "\n".join(lines)
        if out:
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with open(out, "w", encoding="utf-8") as fh:
                fh.write(text)
            log("info", "Generated CDI spec with version 0.5.0")
        else:
            sys.stdout.write(text)
        return 0
    if sub == "list":
        names = []
        for spec in ("/etc/cdi/nvidia.yaml", "/var/run/cdi/nvidia.yaml"):
            if os.path.exists(spec):
                with open(spec, encoding="utf-8") as fh:
                    for ln in fh:
                        if ln.startswith("  name: "):
                            names.append("nvidia.com/gpu=" + ln.split(":", 1)[1].strip().strip('"'))
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        sys.stderr.write(f'time="{now}" level=info msg="Found {len(names)} CDI devices"\n')
        for n in names:
            print(n)
        return 0
    return 0


# ---- system create-dev-char-symlinks ---------------------------------------------------------------------

CONTROL_DEVICES = (("nvidia", "/dev/nvidia-modeset", 254), ("nvidia", "/dev/nvidiactl", 255),
                   ("nvidia_uvm", "/dev/nvidia-uvm", 0), ("nvidia_uvm", "/dev/nvidia-uvm-tools", 1))
MAJORS = {"nvidia": 195, "nvidia_uvm": 510}  # what /proc/devices would say once the module is loaded


def _loaded_modules():
    try:
        with open("/proc/modules", encoding="utf-8") as fh:
            return {line.split(" ", 1)[0] for line in fh if line.strip()}
    except OSError:
        return set()


def _gpu_count(root="/sys/bus/pci/devices"):
    count = 0
    for dev in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        try:
            with open(os.path.join(root, dev, "vendor"), encoding="utf-8") as fh:
                vendor = fh.read().strip()
            with open(os.path.join(root, dev, "class"), encoding="utf-8") as fh:
                cls = fh.read().strip()
        except OSError:
            continue
        if vendor == "0x10de" and cls[:6] in ("0x0300", "0x0302"):
            count += 1
    return count


def create_dev_char_symlinks(args):
    """Links DEV_CHAR/MAJOR:MINOR -> device node. --create-all: every possible GPU and control device, with the
    majors real nvidia-ctk reads from /proc/devices first: with no nvidia* major there (nvidia not loaded) it
    fails with exit 1, as seen on a real Debian 12 (tests/realos). KNOWN DIFFERENCE, kept until gpunode's
    nodesettings udev rule copes with it: real nvidia-ctk also fails (exit 1, "missing required device major
    nvidia-uvm") when nvidia is loaded but nvidia_uvm is not (checked with /proc/devices bound over in the
    real-OS VM); here nvidia_uvm then gets major 0. Without
    --create-all: the device nodes that exist ("No NVIDIA devices found" when none does). An existing link is
    kept with a warning, as os.Symlink fails on it."""
    dev_char, create_all, dry_run = "/dev/char", False, False
    for a in args:
        if a.startswith("--dev-char-path="):
            dev_char = a.split("=", 1)[1]
        elif a == "--create-all":
            create_all = True
        elif a == "--dry-run":
            dry_run = True
        elif a.startswith("--") and a.split("=", 1)[0] not in ("--driver-root", "--load-kernel-modules",
                                                               "--create-device-nodes", "--watch"):
            sys.stderr.write(f"Incorrect Usage: flag provided but not defined: -{a.lstrip('-').split('=')[0]}\n")
            return 1
    if create_all and "--watch" in args:
        log("error", "create-all and watch are mutually exclusive")
        return 1
    loaded = _loaded_modules()
    if create_all:
        lister = "failed to create symlink creator: failed to create all possible device lister: "
        if "nvidia" not in loaded:
            log("error", lister + "failed reading device majors: no NVIDIA devices found")
            return 1
    major = {m: (n if m in loaded else 0) for m, n in MAJORS.items()}
    gpus = _gpu_count()
    if create_all and gpus == 0:
        log("info", "No NVIDIA devices found in /")
        return 0
    nodes = [(path, major[module], minor) for module, path, minor in CONTROL_DEVICES]
    nodes += [(f"/dev/nvidia{i}", major["nvidia"], i) for i in range(gpus)]
    if not create_all:
        nodes = [n for n in nodes if os.path.exists(n[0])]
        if not nodes:
            log("info", "No NVIDIA devices found in /")
            return 0
    if nodes and not dry_run:
        os.makedirs(dev_char, exist_ok=True)
    for path, maj, minor in nodes:
        link = os.path.join(dev_char, f"{maj}:{minor}")
        log("info", f"Creating link {link} => {path}")
        if dry_run:
            continue
        try:
            os.symlink(path, link)
        except OSError as exc:
            log("warning", f"Could not create symlink: symlink {path} {link}: {exc.strerror.lower()}")
    return 0


def main(argv):
    version = argv[0]
    args = argv[1:]
    if not args or args[0] in ("-h", "--help", "help"):
        print("NAME:\n   NVIDIA Container Toolkit CLI - Tools to configure the NVIDIA Container Toolkit")
        return 0
    if args[0] in ("--version", "-v", "-version"):
        print("NVIDIA Container Toolkit CLI version {}".format(version.split("-")[0]))
        print("commit: 6d6a6c5c1b43d0f87d7a77a4f69d4a2c0b1b12f3")
        return 0
    if args[0] == "runtime" and len(args) > 1 and args[1] == "configure":
        return runtime_configure(args[2:])
    if args[0] == "cdi":
        return cdi(args[1:])
    if args[0] == "system" and len(args) > 1 and args[1] == "create-dev-char-symlinks":
        return create_dev_char_symlinks(args[2:])
    if args[0] in ("system", "config", "hook", "info"):
        return 0
    sys.stderr.write(f"No help topic for '{args[0]}'\n")
    return 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
