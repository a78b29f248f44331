"""kubectl / kubelet / k3s for simulated Kubernetes nodes: a one-node cluster whose API answers while the kubelet
(kubelet.service, or k3s.service for k3s) runs.  Objects applied with `kubectl apply -f FILE.json` are kept in
/var/lib/nodesim/k8s/objects.json with kubectl's last-applied-configuration annotation.

The NVIDIA device plugin "runs" when its DaemonSet and the RuntimeClass it names exist, the kubelet's containerd
loaded an nvidia runtime (the effective config snapshotted when containerd / k3s last started) whose binary is
installed, and `nvidia-smi -L` works.  Then its socket exists in /var/lib/kubelet/device-plugins and the node's
allocatable nvidia.com/gpu is the GPU count times the time-slicing replicas of the plugin's ConfigMap.
A pod asking for nvidia.com/gpu is Pending (Unschedulable, with the scheduler's message) when the node has too
few; with the RuntimeClass nvidia it runs `nvidia-smi -L` restricted to one GPU and Succeeds.

Usage: kube.py kubectl|kubelet|k3s ARGS...
"""

import json
import os
import re
import subprocess
import sys

from engines import env_file, unit_state  # this directory is sys.path[0]: the simulator's state readers

NS = "/var/lib/nodesim"
STATE = NS + "/k8s"
OBJECTS = STATE + "/objects.json"
SOCKET = "/var/lib/kubelet/device-plugins/nvidia-gpu.sock"
LAST = "kubectl.kubernetes.io/last-applied-configuration"
KIND = {"runtimeclass": "RuntimeClass", "runtimeclasses": "RuntimeClass", "configmap": "ConfigMap",
        "configmaps": "ConfigMap", "cm": "ConfigMap", "daemonset": "DaemonSet", "daemonsets": "DaemonSet",
        "ds": "DaemonSet", "pod": "Pod", "pods": "Pod", "node": "Node", "nodes": "Node"}
PLURAL = {"RuntimeClass": "runtimeclasses.node.k8s.io", "ConfigMap": "configmaps", "DaemonSet": "daemonsets.apps",
          "Pod": "pods", "Node": "nodes"}
CLUSTER_SCOPED = ("RuntimeClass", "Node")

PROFILE = env_file(NS + "/profile.env")
FLAVOR = PROFILE.get("K8S", "")


def unit_active(unit):
    return unit_state(unit) == "active"


def api_unit():
    return "k3s.service" if FLAVOR == "k3s" else "kubelet.service"


def hostname():
    with open("/etc/hostname", encoding="utf-8") as fh:
        return fh.read().strip()


def load():
    try:
        with open(OBJECTS, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return {}


def save(objs):
    os.makedirs(STATE, exist_ok=True)
    with open(OBJECTS, "w", encoding="utf-8") as fh:
        json.dump(objs, fh, indent=1, sort_keys=True)


def ident(kind, name, namespace):
    return f"{kind}/{'' if kind in CLUSTER_SCOPED else namespace}/{name}"


def on_path(path):
    if path.startswith("/"):
        return os.access(path, os.X_OK)
    return any(os.access(os.path.join(d, path), os.X_OK) for d in ("/usr/local/bin", "/usr/bin", "/usr/sbin"))


def runtimes_in(value):
    """Every containerd runtime table in an effective config: {name: BinaryName or ""}."""
    found = {}
    if isinstance(value, dict):
        for k, v in value.items():
            if k == "runtimes" and isinstance(v, dict):
                for name, rt in v.items():
                    found[name] = ((rt or {}).get("options") or {}).get("BinaryName", "") if isinstance(rt, dict) else ""
            else:
                found.update(runtimes_in(v))
    return found


def nvidia_runtime():
    """containerd, as the kubelet's runtime last loaded it, has a usable nvidia runtime handler."""
    snap = NS + "/engines/" + ("k3s-containerd.json" if FLAVOR == "k3s" else "containerd.json")
    unit = "k3s.service" if FLAVOR == "k3s" else "containerd.service"
    if not unit_active(unit):
        return False
    try:
        with open(snap, encoding="utf-8") as fh:
            config = json.load(fh)
    except (OSError, ValueError):
        return False
    binary = runtimes_in(config).get("nvidia")
    return bool(binary) and on_path(binary)


def smi_list():
    if not on_path("nvidia-smi"):
        return None
    env = dict(os.environ, NODESIM_NOLOG="1")
    try:
        done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, env=env, timeout=30)
    except OSError:
        return None
    return done.stdout if done.returncode == 0 else None


def replicas(objs):
    cm = objs.get(ident("ConfigMap", "nvidia-device-plugin-config", "kube-system"))
    text = ((cm or {}).get("data") or {}).get("config.yaml", "")
    found = re.search(r"timeSlicing:(?:.|\n)*?replicas:\s*(\d+)", text)
    return int(found.group(1)) if found else 1


def plugin(objs):
    """(running, why not, advertised GPUs)."""
    ds = objs.get(ident("DaemonSet", "nvidia-device-plugin-daemonset", "kube-system"))
    if ds is None:
        return False, "no device plugin DaemonSet", 0
    rc = (((ds.get("spec") or {}).get("template") or {}).get("spec") or {}).get("runtimeClassName")
    if rc and ident("RuntimeClass", rc, "") not in objs:
        return False, f'RuntimeClass "{rc}" not found', 0
    if not nvidia_runtime():
        return False, "containerd has no nvidia runtime", 0
    listed = smi_list()
    if listed is None:
        return False, "NVML: driver not loaded", 0
    gpus = len([line for line in listed.splitlines() if line.startswith("GPU ")])
    return True, "", gpus * replicas(objs)


def sync(objs):
    """Device plugin state -> its socket, the DaemonSet's status, the node's allocatable."""
    running, _, advertised = plugin(objs) if unit_active(api_unit()) else (False, "kubelet down", 0)
    if running:
        os.makedirs(os.path.dirname(SOCKET), exist_ok=True)
        open(SOCKET, "w").close()
    elif os.path.exists(SOCKET):
        os.remove(SOCKET)
    key = ident("DaemonSet", "nvidia-device-plugin-daemonset", "kube-system")
    if key in objs:
        objs[key]["status"] = {"desiredNumberScheduled": 1, "numberReady": 1 if running else 0,
                               "numberAvailable": 1 if running else 0, "numberUnavailable": 0 if running else 1}
    return advertised


def node_object(advertised):
    name = hostname()
    alloc = {"cpu": "2", "memory": "8049716Ki", "pods": "110"}
    if advertised:
        alloc["nvidia.com/gpu"] = str(advertised)
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "status": {"allocatable": alloc, "capacity": dict(alloc)}}


def gpu_request(pod):
    total = 0
    for c in (pod.get("spec") or {}).get("containers") or []:
        limits = ((c.get("resources") or {}).get("limits") or {})
        value = str(limits.get("nvidia.com/gpu", "0"))
        total += int(value) if value.isdigit() else 0
    return total


def pod_status(pod, objs, advertised):
    """Pending (unschedulable) or Succeeded, decided now; the logs a finished pod left."""
    want = gpu_request(pod)
    if want > advertised:
        return {"phase": "Pending", "conditions": [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": "0/1 nodes are available: 1 Insufficient nvidia.com/gpu. preemption: 0/1 nodes are "
                       "available: 1 No preemption victims found for incoming pod."}]}, ""
    rc = (pod.get("spec") or {}).get("runtimeClassName")
    listed = smi_list() if want and rc == "nvidia" and nvidia_runtime() else None
    if listed is None:
        return {"phase": "Failed", "conditions": [{"type": "PodScheduled", "status": "True"}]}, (
            "exec: \"nvidia-smi\": executable file not found in $PATH")
    first = [line for line in listed.splitlines() if line.startswith("GPU ")][:want]
    return {"phase": "Succeeded", "conditions": [{"type": "PodScheduled", "status": "True"}]}, "\n".join(first) + "\n"


def not_found(kind, name):
    print(f'Error from server (NotFound): {PLURAL.get(kind, kind.lower())} "{name}" not found', file=sys.stderr)
    return 1


def kubectl(args):
    namespace, output, files, rest, flags = "default", "", [], [], set()
    kubeconfig = os.environ.get("KUBECONFIG", "")
    i = 0
    while i < len(args):
        a = args[i]
        if a in ("--kubeconfig", "-n", "--namespace", "-o", "--output", "-f", "--filename"):
            value = args[i + 1] if i + 1 < len(args) else ""
            i += 2
        elif a.startswith("--") and "=" in a:
            name, _, value = a.partition("=")
            a = name
            i += 1
        else:
            rest.append(a)
            i += 1
            continue
        if a == "--kubeconfig":
            kubeconfig = value
        elif a in ("-n", "--namespace"):
            namespace = value
        elif a in ("-o", "--output"):
            output = value
        elif a in ("-f", "--filename"):
            files.append(value)
        else:
            flags.add(a + "=" + value)
    if rest[:1] == ["version"] and "--client" in args:
        print("Client Version: v1.31.2")
        return 0
    if not kubeconfig or not os.path.exists(kubeconfig):
        print("error: the server could not be reached: no kubeconfig (looked at " + (kubeconfig or "$KUBECONFIG")
              + ")", file=sys.stderr)
        return 1
    if not unit_active(api_unit()):
        print("The connection to the server 127.0.0.1:6443 was refused - did you specify the right host or port?",
              file=sys.stderr)
        return 1
    objs = load()
    advertised = sync(objs)
    save(objs)
    verb = rest[0] if rest else ""
    if verb == "apply":
        for path in files:
            with open(path, encoding="utf-8") as fh:
                doc = json.load(fh)
            for item in doc.get("items", []) if doc.get("kind") == "List" else [doc]:
                kind, meta = item["kind"], item["metadata"]
                key = ident(kind, meta["name"], meta.get("namespace", namespace))
                if kind == "Pod":
                    rc = (item.get("spec") or {}).get("runtimeClassName")
                    if rc and ident("RuntimeClass", rc, "") not in objs:
                        print(f'Error from server (Forbidden): pods "{meta["name"]}" is forbidden: pod rejected: '
                              f'RuntimeClass "{rc}" not found', file=sys.stderr)
                        return 1
                applied = json.dumps(item, sort_keys=True, separators=(",", ":"))
                old = objs.get(key)
                label = f"{kind.lower()}.{PLURAL[kind].partition('.')[2] or ''}".rstrip(".") + f"/{meta['name']}"
                if old is not None and old["metadata"].get("annotations", {}).get(LAST) == applied:
                    print(f"{label} unchanged")
                    continue
                stored = json.loads(applied)
                stored["metadata"].setdefault("annotations", {})[LAST] = applied
                if kind not in CLUSTER_SCOPED:
                    stored["metadata"]["namespace"] = meta.get("namespace", namespace)
                objs[key] = stored
                print(f"{label} {'configured' if old is not None else 'created'}")
        sync(objs)
        save(objs)
        return 0
    if verb in ("get", "logs", "delete"):
        target = rest[1:]
        if len(target) == 1 and "/" in target[0]:
            target = target[0].split("/", 1)
        if verb == "logs":
            target = ["pod", *target]
        if len(target) < 2:
            print("error: you must specify the type and name of the resource", file=sys.stderr)
            return 1
        kind = KIND.get(target[0].lower().split(".")[0])
        name = target[1]
        if kind is None:
            print(f'error: the server doesn\'t have a resource type "{target[0]}"', file=sys.stderr)
            return 1
        if kind == "Node":
            if name != hostname():
                return not_found(kind, name)
            obj = node_object(advertised)
        else:
            obj = objs.get(ident(kind, name, namespace))
            if obj is None:
                if verb == "delete" and any(a.startswith("--ignore-not-found") for a in args):
                    return 0
                return not_found(kind, name)
            obj = json.loads(json.dumps(obj))
        if kind == "Pod":
            status, log = pod_status(obj, objs, advertised)
            obj["status"] = status
            if verb == "logs":
                if status["phase"] == "Pending":
                    print(f'Error from server (BadRequest): container "{name}" in pod "{name}" is waiting to start: '
                          "ContainerCreating", file=sys.stderr)
                    return 1
                sys.stdout.write(log)
                return 0
        if verb == "delete":
            del objs[ident(kind, name, namespace)]
            save(objs)
            print(f'{kind.lower()} "{name}" deleted')
            return 0
        if output == "json":
            print(json.dumps(obj, indent=4))
        else:
            print(f"NAME\n{name}")
        return 0
    print(f"error: unknown command \"{verb}\" for \"kubectl\" (simulated: apply, get, logs, delete)", file=sys.stderr)
    return 1


def main(argv):
    tool, args = argv[0], argv[1:]
    if tool == "kubectl":
        return kubectl(args)
    if tool == "k3s":
        if args[:1] == ["kubectl"]:
            return kubectl(args[1:])
        if args[:1] in (["--version"], ["-v"]):
            print("k3s version v1.31.4+k3s1 (a562d090)\ngo version go1.22.9")
            return 0
    if tool == "kubelet" and args[:1] == ["--version"]:
        print("Kubernetes v1.31.2")
        return 0
    print(f"{tool}: not simulated: {' '.join(args)}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
