"""docker / ctr / nerdctl / containerd for simulated nodes, plus the config checks systemctl runs when the
daemons start.  A container "runs" by deciding what the real stack would do with the GPU request:

- docker reads /etc/docker/daemon.json only when the daemon (re)starts: the simulator snapshots it then
  (/var/lib/nodesim/engines/docker.json), together with whether nvidia-container-runtime-hook was on PATH,
  which is when moby registers the `--gpus` device driver;
- the NVIDIA runtime / hook then need the driver: libnvidia-ml present (driver installed) and the kernel module
  loaded, and the image's CUDA requirement no newer than the driver supports.

Usage: engines.py docker|ctr|nerdctl|containerd ARGS... | docker-validate FILE | containerd-effective CFG OUT
"""

import json
import os
import re
import sys

# copy, glob, subprocess and tomllib are imported where they are used: `docker info`, `crictl info` and the other
# queries start this interpreter on every call and need none of them (tomllib and glob alone cost it ~13 ms)

NS = "/var/lib/nodesim"
ENG = NS + "/engines"
SHIMS = "/opt/nodesim/shims"
ERRORS = "/opt/nodesim/data/errors"


def env_file(path):
    out = {}
    try:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                k, eq, v = line.strip().partition("=")
                if eq:
                    out[k] = v.strip("'\"")
    except OSError:
        pass
    return out


PROFILE = env_file(NS + "/profile.env")


def unit_state(unit):
    return env_file(NS + "/units/" + unit).get("ACTIVE", "inactive")


def on_path(tool):
    for d in ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin"):
        if os.path.exists(os.path.join(d, tool)):
            return True
    return False


def read(path, default=None):
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except OSError:
        return default


def loaded(module):
    text = read("/proc/modules", "")
    return any(line.split(" ", 1)[0] == module for line in text.splitlines())


def cuda_for_driver(version):
    branch = int(version.split(".")[0])
    best = None
    for line in read("/opt/nodesim/lib/cuda.tab", "").splitlines():
        b, c = line.split()
        if branch >= int(b):
            best = c
    return best


def vtuple(v):
    return tuple(int(x) for x in re.findall(r"\d+", v))


# ---- images ------------------------------------------------------------------------------------------------

CUDA_TAG = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?-(base|runtime|devel|cudnn\d*-runtime|cudnn\d*-devel)-"
                      r"(ubuntu\d\d\.\d\d|ubi\d|rockylinux\d|centos\d)$")
PLAIN_IMAGES = ("ubuntu", "debian", "busybox", "alpine", "rockylinux", "hello-world", "centos", "fedora")


def normalize(ref):
    """(repository, tag) of an image reference, docker style."""
    name, tag = ref, "latest"
    last = ref.rsplit("/", 1)[-1]
    if ":" in last:
        name, tag = ref.rsplit(":", 1)
    for prefix in ("docker.io/library/", "docker.io/"):
        if name.startswith(prefix):
            name = name[len(prefix):]
    return name, tag


def image_known(ref):
    name, tag = normalize(ref)
    if name in ("nvidia/cuda", "nvcr.io/nvidia/cuda"):
        return bool(CUDA_TAG.match(tag))
    return name in PLAIN_IMAGES or name.split("/")[-1] in PLAIN_IMAGES


def image_cuda(ref):
    name, tag = normalize(ref)
    m = CUDA_TAG.match(tag) if name in ("nvidia/cuda", "nvcr.io/nvidia/cuda") else None
    return f"{m.group(1)}.{m.group(2)}" if m else None


# ---- what the NVIDIA hook decides ---------------------------------------------------------------------------


def nvidia_hook_error(ref, env):
    """None when the GPU can be handed to the container, else nvidia-container-cli's message."""
    if not on_path("nvidia-container-cli"):
        return "exec: \"nvidia-container-cli\": executable file not found in $PATH"
    driver = env_file(NS + "/driver.env")
    if not driver.get("DRIVER_VERSION"):
        return read(ERRORS + "/nvidia-container-cli_load-library-failed_libnvidia-ml.so.1.txt", "").splitlines()[-1]
    if not loaded("nvidia"):
        return "nvidia-container-cli: initialization error: nvml error: driver not loaded"
    need = image_cuda(ref)
    if need and env.get("NVIDIA_DISABLE_REQUIRE", "").lower() not in ("1", "true"):
        have = cuda_for_driver(env_file(NS + "/loaded.env").get("LOADED_VERSION", driver["DRIVER_VERSION"]))
        if have and vtuple(need) > vtuple(have):
            return (f"nvidia-container-cli: requirement error: unsatisfied condition: cuda>={need}, please update your "
                    "driver to a newer version, or use an earlier cuda container")
    return None


def run_in_container(cmd, gpu):
    """Run the container's command; returns exit code.  nvidia-smi is the one the toolkit mounts."""
    if not cmd:
        return 0
    import subprocess

    env = dict(os.environ, NODESIM_NOLOG="1")
    prog = cmd[0].rsplit("/", 1)[-1]
    if prog == "nvidia-smi":
        if not gpu:
            return None
        return subprocess.call([SHIMS + "/nvidia-smi", *cmd[1:]], env=env)
    if prog in ("true",):
        return 0
    if prog in ("false",):
        return 1
    if prog == "echo":
        print(" ".join(cmd[1:]))
        return 0
    if prog in ("sh", "bash", "dash"):
        return subprocess.call(["/bin/sh", *cmd[1:]], env=env)
    if prog in ("cat", "ls", "env", "uname", "nproc", "sleep"):
        return subprocess.call(cmd, env=env)
    return None


def oci_error(msg):
    return ("failed to create task for container: failed to create shim task: OCI runtime create failed: "
            "runc create failed: unable to start container process: error during container init: error running "
            f"hook #0: error running hook: exit status 1, stdout: , stderr: Auto-detected mode as 'legacy'\n{msg}: unknown")


# ---- docker ------------------------------------------------------------------------------------------------


def docker_effective():
    cfg = {}
    text = read(ENG + "/docker.json")
    if text and text.strip():
        try:
            cfg = json.loads(text)
        except ValueError:
            cfg = {}
    runtimes = {"io.containerd.runc.v2": {"path": "runc"}, "runc": {"path": "runc"}}
    for k, v in (cfg.get("runtimes") or {}).items():
        runtimes[k] = v
    return cfg, runtimes, cfg.get("default-runtime", "runc")


def docker_pull_msgs(ref):
    pulled = set(read(ENG + "/docker-images", "").split())
    if ref in pulled:
        return True
    name, tag = normalize(ref)
    sys.stderr.write(f"Unable to find image '{ref}' locally\n")
    if not image_known(ref):
        sys.stderr.write(f"docker: Error response from daemon: manifest for {name}:{tag} not found: manifest unknown: manifest unknown.\n"
                         "See 'docker run --help'.\n")
        return False
    sys.stderr.write("{}: Pulling from {}\nDigest: sha256:{}\nStatus: Downloaded newer image for {}:{}\n".format(tag, name if "/" in name else "library/" + name, "5" * 64, name, tag))
    with open(ENG + "/docker-images", "a", encoding="utf-8") as fh:
        fh.write(ref + "\n")
    return True


DOCKER_VALUE_OPTS = {"--gpus", "--runtime", "-e", "--env", "--name", "-v", "--volume", "--net", "--network",
                     "--ipc", "--entrypoint", "--shm-size", "--ulimit", "--device", "--security-opt", "-w",
                     "--workdir", "-u", "--user", "--pull", "--cap-add", "--cap-drop", "-p", "--publish",
                     "--mount", "--label", "-l", "--platform", "--memory", "-m", "--cpus", "--env-file",
                     "--hostname", "-h", "--pid", "--restart", "--add-host", "--group-add"}


def docker_run(args):
    opts = {"env": {}}
    i = 0
    while i < len(args):
        a = args[i]
        if not a.startswith("-") or a == "-":
            break
        flag, eq, val = a.partition("=")
        if flag in DOCKER_VALUE_OPTS:
            if not eq:
                i += 1
                val = args[i] if i < len(args) else ""
            if flag in ("-e", "--env"):
                k, _, v = val.partition("=")
                opts["env"][k] = v
            else:
                opts[flag.lstrip("-")] = val
        i += 1
    if i >= len(args):
        sys.stderr.write('"docker run" requires at least 1 argument.\nSee \'docker run --help\'.\n')
        return 1
    ref, cmd = args[i], args[i + 1:]
    if unit_state("docker.service") != "active":
        sys.stderr.write("docker: Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker "
                         "daemon running?.\nSee 'docker run --help'.\n")
        return 125
    if not docker_pull_msgs(ref):
        return 125
    cfg, runtimes, default = docker_effective()
    runtime = opts.get("runtime") or default
    if runtime not in runtimes:
        msg = read(ERRORS + "/docker_unknown-or-invalid-runtime-name-nvidia_transcript.txt", "").splitlines()[-1]
        sys.stderr.write(msg.replace("nvidia.", runtime + ".") + "\nSee 'docker run --help'.\n")
        return 125
    gpus = opts.get("gpus")
    nvidia_runtime = any(os.path.basename(str(v.get("path", ""))).startswith("nvidia-container-runtime")
                         for v in runtimes.values() if isinstance(v, dict))
    strict = PROFILE.get("DOCKER_GPUS_NEED_RUNTIME", "1") == "1"
    if gpus is not None and (read(ENG + "/docker.hook", "0").strip() != "1" or (strict and not nvidia_runtime)):
        sys.stderr.write(read(ERRORS + "/docker_could-not-select-device-driver_empty-name.txt", "")
                         + "See 'docker run --help'.\n")
        return 125
    rt_path = runtimes.get(runtime, {}).get("path", "runc")
    if runtime not in ("runc", "io.containerd.runc.v2") and not on_path(os.path.basename(rt_path)):
        sys.stderr.write("docker: Error response from daemon: failed to create task for container: failed to create "
                         f"shim task: OCI runtime create failed: unable to retrieve OCI runtime error: exec: \"{rt_path}\": "
                         "executable file not found in $PATH: unknown.\n")
        return 127
    env = dict(opts["env"])
    if image_cuda(ref) and "NVIDIA_VISIBLE_DEVICES" not in env:
        env["NVIDIA_VISIBLE_DEVICES"] = "all"   # set by the CUDA images
    wants_gpu = gpus is not None or (runtime != "runc" and os.path.basename(rt_path).startswith("nvidia")
                                     and env.get("NVIDIA_VISIBLE_DEVICES", "void") not in ("", "void", "none"))
    if wants_gpu:
        err = nvidia_hook_error(ref, env)
        if err:
            sys.stderr.write(f"docker: Error response from daemon: {oci_error(err)}.\nSee 'docker run --help'.\n")
            return 125
    rc = run_in_container(cmd, wants_gpu)
    if rc is None:
        sys.stderr.write("docker: Error response from daemon: failed to create task for container: failed to create "
                         "shim task: OCI runtime create failed: runc create failed: unable to start container "
                         f"process: exec: \"{cmd[0]}\": executable file not found in $PATH: unknown.\n")
        return 127
    return rc


def docker_info(args):
    if unit_state("docker.service") != "active":
        print("Client:\n Version:    {}\n Context:    default\n Debug Mode: false\n".format(PROFILE.get("DOCKER_VERSION")))
        print("Server:")
        sys.stderr.write("ERROR: Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker "
                         "daemon running?\nerrors pretty printing info\n")
        return 1
    cfg, runtimes, default = docker_effective()
    fmt = None
    for i, a in enumerate(args):
        if a in ("-f", "--format") and i + 1 < len(args):
            fmt = args[i + 1]
        elif a.startswith("--format="):
            fmt = a.split("=", 1)[1]
    data = {"ServerVersion": PROFILE.get("DOCKER_VERSION"), "DefaultRuntime": default,
            "Runtimes": {k: {"path": v.get("path", "runc")} for k, v in runtimes.items()},
            "CgroupDriver": "systemd", "Driver": "overlay2"}
    if fmt:
        out = fmt
        for m in re.findall(r"\{\{\s*json\s+\.(\w+)\s*\}\}", fmt):
            out = re.sub(rf"\{{\{{\s*json\s+\.{m}\s*\}}\}}", json.dumps(data.get(m), separators=(",", ":")), out)
        out = re.sub(r"\{\{\s*json\s+\.\s*\}\}", json.dumps(data, separators=(",", ":")), out)
        for m in re.findall(r"\{\{\s*\.(\w+)\s*\}\}", out):
            v = data.get(m)
            out = re.sub(rf"\{{\{{\s*\.{m}\s*\}}\}}", " ".join(sorted(v)) if isinstance(v, dict) else str(v), out)
        print(out)
        return 0
    print("Client:\n Version:    {}\n Context:    default\n Debug Mode: false\n".format(PROFILE.get("DOCKER_VERSION")))
    images = len(read(ENG + "/docker-images", "").split())
    print(f"Server:\n Containers: 0\n  Running: 0\n  Paused: 0\n  Stopped: 0\n Images: {images}")
    print(" Server Version: {}\n Storage Driver: overlay2\n Cgroup Driver: systemd\n Cgroup Version: 2".format(PROFILE.get("DOCKER_VERSION")))
    print(" Runtimes: {}\n Default Runtime: {}".format(" ".join(sorted(runtimes)), default))
    print(" Kernel Version: {}\n Operating System: {}\n Architecture: x86_64".format(read(NS + "/kernel", "").strip(), PROFILE.get("PRETTY_NAME", "Linux")))
    return 0


def docker(args):
    while args and args[0] in ("-H", "--host", "--context", "-c", "--config", "-D", "--debug", "-l", "--log-level"):
        args = args[2:] if args[0] not in ("-D", "--debug") else args[1:]
    if not args:
        print("Usage:  docker [OPTIONS] COMMAND")
        return 0
    cmd, rest = args[0], args[1:]
    version = PROFILE.get("DOCKER_VERSION", "24.0.7")
    if cmd in ("--version", "-v"):
        print(f"Docker version {version}, build afdd53b")
        return 0
    if cmd == "version":
        fmt = None
        for i, a in enumerate(rest):
            if a in ("-f", "--format") and i + 1 < len(rest):
                fmt = rest[i + 1]
            elif a.startswith("--format="):
                fmt = a.split("=", 1)[1]
        active = unit_state("docker.service") == "active"
        if fmt:
            out = fmt.replace("{{.Client.Version}}", version)
            if "{{.Server.Version}}" in out:
                if not active:
                    sys.stderr.write("Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?\n")
                    return 1
                out = out.replace("{{.Server.Version}}", version)
            print(out)
            return 0
        print(f"Client: Docker Engine - Community\n Version:           {version}")
        if not active:
            sys.stderr.write("Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?\n")
            return 1
        print(f"\nServer: Docker Engine - Community\n Engine:\n  Version:          {version}")
        return 0
    if cmd == "info" or (cmd == "system" and rest[:1] == ["info"]):
        return docker_info(rest if cmd == "info" else rest[1:])
    if cmd in ("run", "container") and (cmd == "run" or rest[:1] == ["run"]):
        return docker_run(rest if cmd == "run" else rest[1:])
    if unit_state("docker.service") != "active":
        sys.stderr.write("Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?\n")
        return 1
    if cmd == "pull":
        ref = [a for a in rest if not a.startswith("-")][0]
        pulled = ref in set(read(ENG + "/docker-images", "").split())
        if not pulled and not image_known(ref):
            name, tag = normalize(ref)
            sys.stderr.write(f"Error response from daemon: manifest for {name}:{tag} not found: manifest unknown: manifest unknown\n")
            return 1
        if not pulled:
            with open(ENG + "/docker-images", "a", encoding="utf-8") as fh:
                fh.write(ref + "\n")
        print(f"Status: Downloaded newer image for {ref}")
        return 0
    if cmd in ("images", "ps", "rm", "rmi", "stop", "kill", "logs", "image", "container", "system"):
        return 0
    sys.stderr.write(f"docker: '{cmd}' is not a docker command.\nSee 'docker --help'\n")
    return 1


# ---- containerd ---------------------------------------------------------------------------------------------


def deep_merge(base, over):
    import copy

    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def containerd_load(cfg_path):
    """The merged configuration containerd would run with; raises ValueError like containerd refuses (a TOML
    syntax error, tomllib.TOMLDecodeError, is one)."""
    import glob

    import tomllib

    text = read(cfg_path, "")
    doc = tomllib.loads(text) if text.strip() else {}
    version = int(doc.get("version", 1)) if text.strip() else 2
    major = int(PROFILE.get("CONTAINERD_VERSION", "1.7").split(".")[0])
    if version > 2 and major < 2:
        raise ValueError(f"containerd: failed to load TOML from {cfg_path}: unsupported config version `{version}`")
    merged = dict(doc)
    for pattern in doc.get("imports", []) or []:
        for f in sorted(glob.glob(pattern)):
            if os.path.abspath(f) == os.path.abspath(cfg_path):
                continue
            sub = tomllib.loads(read(f, ""))
            merged = deep_merge(merged, {k: v for k, v in sub.items() if k not in ("imports",)})
    merged["version"] = version
    return merged


def containerd(args):
    version = PROFILE.get("CONTAINERD_VERSION", "1.7.12")
    if not args or args[0] in ("--version", "-v"):
        if version.startswith("2."):
            print(f"containerd github.com/containerd/containerd/v2 v{version} 6c4c0fa7dfc1d54bcdfc4deedc0e18e08cbfe1a0")
        else:
            print(f"containerd containerd.io {version} 7f7fdf5fed64eb6a7caf99b3e12efcf9d60e311c")
        return 0
    if args[:2] == ["config", "dump"]:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import tomlw
        try:
            merged = containerd_load("/etc/containerd/config.toml")
        except ValueError as err:
            sys.stderr.write(f"containerd: {err}\n")
            return 1
        sys.stdout.write(tomlw.dumps(merged))
        return 0
    if args[:2] == ["config", "default"]:
        v = 3 if version.startswith("2.") else 2
        sys.stdout.write(read(f"/opt/nodesim/data/containerd/default-v{v}.toml", ""))
        return 0
    return 0


def ctr(args):
    version = PROFILE.get("CONTAINERD_VERSION", "1.7.12")
    while args and args[0] in ("-n", "--namespace", "-a", "--address"):
        args = args[2:]
    if not args or args[0] in ("--version", "-v", "version"):
        print(f"ctr github.com/containerd/containerd v{version}")
        return 0
    if unit_state("containerd.service") != "active":
        sys.stderr.write('ctr: failed to dial "/run/containerd/containerd.sock": connection error: desc = "transport: '
                         'error while dialing: dial unix:///run/containerd/containerd.sock: connect: no such file or directory"\n')
        return 1
    images = set(read(ENG + "/ctr-images", "").split())
    if args[0] in ("image", "images", "i") and len(args) > 1 and args[1] == "pull":
        refs = [a for a in args[2:] if not a.startswith("-")]
        ref = refs[0] if refs else ""
        if "/" not in ref.split(":")[0] or "." not in ref.split("/")[0]:
            sys.stderr.write(f'ctr: failed to resolve reference "{ref}": object required\n')
            return 1
        if not image_known(ref):
            sys.stderr.write(f'ctr: failed to resolve reference "{ref}": {ref}: not found\n')
            return 1
        with open(ENG + "/ctr-images", "a", encoding="utf-8") as fh:
            fh.write(ref + "\n")
        print(f"{ref}: resolved       |++++++++++++++++++++++++++++++++++++++|")
        print("done: 1.2s")
        return 0
    if args[0] in ("image", "images", "i"):
        print("REF TYPE DIGEST SIZE PLATFORMS LABELS")
        for r in sorted(images):
            print("{} application/vnd.docker.distribution.manifest.list.v2+json sha256:{} 80.0 MiB linux/amd64 -".format(r, "5" * 64))
        return 0
    if args[0] == "run":
        rest = args[1:]
        gpus = None
        runc_binary = None
        env = {}
        pos = []
        i = 0
        while i < len(rest):
            a = rest[i]
            if len(pos) >= 2:  # image and container id seen: the rest is the command
                pos.append(a)
                i += 1
                continue
            flag, eq, val = a.partition("=")
            if flag in ("--gpus", "--runc-binary", "--env", "--runtime", "--mount", "--label", "--cwd", "--user"):
                if not eq:
                    i += 1
                    val = rest[i] if i < len(rest) else ""
                if flag == "--gpus":
                    gpus = val
                elif flag == "--runc-binary":
                    runc_binary = val
                elif flag == "--env":
                    k, _, v = val.partition("=")
                    env[k] = v
            elif a.startswith("-"):
                pass
            else:
                pos.append(a)
            i += 1
        if len(pos) < 2:
            sys.stderr.write("ctr: image ref and container id must be provided\n")
            return 1
        ref, _cid, cmd = pos[0], pos[1], pos[2:]
        if ref not in images:
            sys.stderr.write(f'ctr: image "{ref}": not found\n')
            return 1
        wants_gpu = gpus is not None
        if runc_binary:
            if not os.path.exists(runc_binary):
                sys.stderr.write('ctr: failed to create shim task: OCI runtime create failed: unable to retrieve OCI '
                                 f'runtime error: exec: "{runc_binary}": stat {runc_binary}: no such file or directory: unknown\n')
                return 1
            if os.path.basename(runc_binary).startswith("nvidia") and env.get("NVIDIA_VISIBLE_DEVICES", "void") not in ("", "void", "none"):
                wants_gpu = True
        if wants_gpu:
            err = nvidia_hook_error(ref, env)
            if err:
                sys.stderr.write("ctr: failed to create shim task: OCI runtime create failed: runc create failed: "
                                 "unable to start container process: error during container init: error running "
                                 f"hook #0: error running hook: exit status 1, stdout: , stderr: {err}: unknown\n")
                return 1
        rc = run_in_container(cmd, wants_gpu)
        if rc is None:
            sys.stderr.write('ctr: failed to create shim task: OCI runtime create failed: runc create failed: unable to '
                             f'start container process: exec: "{cmd[0]}": executable file not found in $PATH: unknown\n')
            return 1
        return rc
    return 0


def nerdctl(args):
    if not args or args[0] in ("--version", "-v", "version"):
        print("nerdctl version 1.7.6")
        return 0
    if unit_state("containerd.service") != "active":
        sys.stderr.write('time="2024-01-01T00:00:00Z" level=fatal msg="cannot access containerd socket '
                         '\\"/run/containerd/containerd.sock\\": no such file or directory"\n')
        return 1
    if args[0] != "run":
        return 0
    rest = args[1:]
    gpus = None
    env = {}
    i = 0
    while i < len(rest):
        a = rest[i]
        if not a.startswith("-"):
            break
        flag, eq, val = a.partition("=")
        if flag in ("--gpus", "-e", "--env", "--name", "--runtime", "-v", "--net", "--network"):
            if not eq:
                i += 1
                val = rest[i] if i < len(rest) else ""
            if flag == "--gpus":
                gpus = val
            elif flag in ("-e", "--env"):
                k, _, v = val.partition("=")
                env[k] = v
        i += 1
    ref, cmd = rest[i], rest[i + 1:]
    if not image_known(ref):
        name, tag = normalize(ref)
        sys.stderr.write('time="2024-01-01T00:00:00Z" level=fatal msg="failed to resolve reference '
                         f'\\"docker.io/{name}:{tag}\\": docker.io/{name}:{tag}: not found"\n')
        return 1
    if gpus is not None:
        err = nvidia_hook_error(ref, env)
        if err:
            sys.stderr.write('time="2024-01-01T00:00:00Z" level=fatal msg="failed to create shim task: OCI runtime '
                             'create failed: runc create failed: unable to start container process: error during '
                             'container init: error running hook #0: error running hook: exit status 1, stdout: , '
                             f'stderr: {err}: unknown"\n')
            return 1
    rc = run_in_container(cmd, gpus is not None)
    if rc is None:
        sys.stderr.write(f'time="2024-01-01T00:00:00Z" level=fatal msg="exec: \\"{cmd[0]}\\": executable file not found in $PATH"\n')
        return 1
    return rc


# ---- crictl (cri-tools): asks the RUNNING containerd, which keeps the config it loaded at its last start ----------

CRI_SECTIONS = ("io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime", "cri")


def crictl(args):
    words = [a for a in args if not a.startswith("-")]
    if words[:1] in (["--version"], ["version"]) or "--version" in args:
        print("crictl version v1.29.0")
        return 0
    if "info" not in words:
        return 0
    loaded = read(ENG + "/containerd.json")
    if unit_state("containerd.service") != "active" or not loaded:
        sys.stderr.write('time="2024-01-01T00:00:00Z" level=fatal msg="validate service connection: validate CRI v1 '
                         'runtime API for endpoint \"unix:///run/containerd/containerd.sock\": rpc error: code = '
                         'Unavailable desc = connection error"\n')
        return 1
    merged = json.loads(loaded)
    disabled = merged.get("disabled_plugins") or []
    if any(isinstance(p, str) and p.split(".")[-1] == "cri" for p in disabled):
        sys.stderr.write('time="2024-01-01T00:00:00Z" level=fatal msg="validate service connection: CRI v1 runtime '
                         'API is not implemented for endpoint \"unix:///run/containerd/containerd.sock\""\n')
        return 1
    cri = {}
    for name in CRI_SECTIONS:
        section = (merged.get("plugins") or {}).get(name)
        if isinstance(section, dict) and isinstance(section.get("containerd"), dict):
            cri = section["containerd"]
            break
    runtimes = {"runc": {"runtimeType": "io.containerd.runc.v2"}}
    for k, v in (cri.get("runtimes") or {}).items():
        runtimes[k] = {"runtimeType": v.get("runtime_type", ""), "options": v.get("options", {})}
    print(json.dumps({"status": {"conditions": []}, "config": {"containerd": {
        "defaultRuntimeName": cri.get("default_runtime_name", "runc"), "runtimes": runtimes}}}, indent=2))
    return 0


def main(argv):
    what, args = argv[0], argv[1:]
    if what == "docker-validate":
        text = read(args[0], "")
        if not text.strip():
            return 0
        try:
            json.loads(text)
        except ValueError as err:
            print(f"unable to configure the Docker daemon with file {args[0]}: {err}")
            return 1
        return 0
    if what == "containerd-effective":
        try:
            merged = containerd_load(args[0])
        except ValueError as err:
            print(err)
            return 1
        with open(args[1], "w", encoding="utf-8") as fh:
            json.dump(merged, fh, default=str)
        return 0
    return {"docker": docker, "ctr": ctr, "nerdctl": nerdctl, "containerd": containerd, "crictl": crictl}[what](args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
