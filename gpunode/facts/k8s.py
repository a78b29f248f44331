"""Kubernetes facts: the kubelet and its distribution (kubeadm-style kubelet, k3s, RKE2), the kubeconfig and kubectl
found on the node, the k3s/RKE2 containerd files, and what the cluster says about this node (its allocatable
`nvidia.com/gpu`, the device plugin's objects as last applied) and whether the device plugin's socket exists.

The cluster is read with the node's own kubectl and the first kubeconfig found in KUBECONFIGS, in one snippet
whose output is JSON between `@@` marker lines: kubectl prints JSON, which Python parses without a YAML library.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from gpunode.facts.packages import UnitState, parse_units, unit_states
from gpunode.facts.registry import command, files
from gpunode.record import Frozen

_M = __name__.rsplit(".", 1)[-1]

KUBECONFIGS = ("/etc/kubernetes/admin.conf", "/etc/rancher/k3s/k3s.yaml", "/etc/rancher/rke2/rke2.yaml",
               "/root/.kube/config", "/etc/kubernetes/kubelet.conf")
RKE2_KUBECTL = "/var/lib/rancher/rke2/bin/kubectl"
DEVICE_PLUGIN_SOCKET = "/var/lib/kubelet/device-plugins/nvidia-gpu.sock"
NAMESPACE = "kube-system"


@dataclass(frozen=True, eq=False, repr=False)
class Distribution(Frozen):
    """How the node runs Kubernetes: its name, the units that run the kubelet, and its containerd files."""

    name: str  # "kubelet" | "k3s" | "rke2"
    units: tuple[str, ...]  # the services that run the kubelet (k3s: server or agent)
    containerd_dir: str | None = None  # k3s/RKE2: the directory of their generated config.toml and templates


# k3s and RKE2 regenerate their containerd config.toml from a template at every start: the template is what
# must carry the nvidia runtime (https://docs.k3s.io/advanced#configuring-containerd, docs.rke2.io "Containerd
# Registry Configuration" / advanced: config.toml.tmpl; config-v3.toml.tmpl for containerd 2.0 based releases).
DISTRIBUTIONS = (
    Distribution("k3s", ("k3s.service", "k3s-agent.service"), "/var/lib/rancher/k3s/agent/etc/containerd"),
    Distribution("rke2", ("rke2-server.service", "rke2-agent.service"), "/var/lib/rancher/rke2/agent/etc/containerd"),
    Distribution("kubelet", ("kubelet.service",)),
)
K8S_UNITS = tuple(u for d in DISTRIBUTIONS for u in d.units)
SHARING_UNIT_NAMES = ("nvidia-mps.service", "gpunode-mig-layout.service")  # gpunode/steps/k8s_sharing.py
_RANCHER_DIRS = tuple(d.containerd_dir for d in DISTRIBUTIONS if d.containerd_dir)

UNITS = command("k8s_units", unit_states(*K8S_UNITS, *SHARING_UNIT_NAMES), parse_units, module=_M)

SHARING_UNITS = files("k8s_sharing_units", tuple(f"/etc/systemd/system/{u}" for u in SHARING_UNIT_NAMES), module=_M)

# generated config.toml (read only to start a template from it), the templates, and their drop-ins
RANCHER_CONTAINERD = files("k8s_rancher_containerd", tuple(
    f"{d}/{name}" for d in _RANCHER_DIRS for name in ("config.toml", "config.toml.tmpl", "config-v3.toml.tmpl"))
    + tuple(f"{d}/conf.d/*.toml" for d in _RANCHER_DIRS), module=_M)


def parse_tools(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        name, _, path = line.strip().partition(" ")
        if name and path:
            out.setdefault(name, path)
    return out


TOOLS = command("k8s_tools", (
    # PATH walked with the shell's own tests, as `command -v` finds a program, without a process per name
    'for t in kubelet kubectl k3s rke2; do r=$PATH:; while [ -n "$r" ]; do p=${r%%:*}; r=${r#*:}; p=${p:-.}; '
    'if [ -f "$p/$t" ] && [ -x "$p/$t" ]; then echo "$t $p/$t"; break; fi; done; done; '
    f'[ -x {RKE2_KUBECTL} ] && echo "kubectl {RKE2_KUBECTL}"; true'), parse_tools, module=_M)


@dataclass(frozen=True, eq=False, repr=False)
class Cluster(Frozen):
    """What the node's kubectl says (nothing when there is no kubectl or no kubeconfig)."""

    kubectl: str | None = None
    kubeconfig: str | None = None
    node_name: str = ""
    node: dict[str, Any] | None = None  # `kubectl get node NAME -o json`; None: not read
    error: str = ""  # why the node could not be read (kubectl's own words)
    objects: dict[str, dict[str, Any]] = field(default_factory=dict)  # "kind/name" -> object, found ones only
    socket: bool = False  # the device plugin's socket exists in the kubelet's directory

    @property
    def reachable(self) -> bool:
        return self.node is not None

    def allocatable_gpus(self) -> int | None:
        """The node's allocatable nvidia.com/gpu; 0 when it advertises none; None when the node was not read."""
        if self.node is None:
            return None
        value = ((self.node.get("status") or {}).get("allocatable") or {}).get("nvidia.com/gpu", "0")
        return int(value) if str(value).isdigit() else 0


# the objects gpunode deploys, as kubectl names them (kind/name)
OBJECT_KEYS = ("runtimeclass/nvidia", "configmap/nvidia-device-plugin-config",
               "daemonset/nvidia-device-plugin-daemonset")


def parse_cluster(text: str) -> Cluster:
    values: dict[str, str] = {}
    blocks: dict[str, tuple[int, str]] = {}
    current: str | None = None
    lines: list[str] = []
    for line in text.splitlines():
        if line.startswith("@@end "):
            rc = line.split()[-1]
            if current is not None:
                blocks[current] = (int(rc) if rc.isdigit() else 1, "\n".join(lines))
            current = None
        elif line.startswith("@@get "):
            current, lines = line[6:].strip(), []
        elif current is not None:
            lines.append(line)
        else:
            key, eq, value = line.partition("=")
            if eq:
                values[key.strip()] = value.strip()

    def loaded(name: str) -> dict[str, Any] | None:
        rc, body = blocks.get(name, (1, ""))
        if rc != 0:
            return None
        try:
            data = json.loads(body)
        except ValueError:
            return None
        return data if isinstance(data, dict) else None

    node = loaded("node")
    error = "" if node is not None else blocks.get("node", (1, ""))[1].strip()[-400:]
    objects = {key: obj for key in OBJECT_KEYS if (obj := loaded(key)) is not None}
    return Cluster(values.get("kubectl") or None, values.get("kubeconfig") or None, values.get("node", ""),
                   node, error, objects, values.get("socket") == "yes")


_KUBECTL = f'k=$(command -v kubectl 2>/dev/null) || {{ [ -x {RKE2_KUBECTL} ] && k={RKE2_KUBECTL}; }} || k=""'
_KUBECONFIG = 'kc=""; for f in ' + " ".join(KUBECONFIGS) + '; do [ -f "$f" ] && { kc=$f; break; }; done'
_GETS = "; ".join(
    [f'echo "@@get {key}"; "$k" --kubeconfig "$kc" --request-timeout=10s '
     f'{"-n " + NAMESPACE + " " if not key.startswith("runtimeclass") else ""}get {key} -o json 2>&1; '
     'r=$?; echo; echo "@@end $r"' for key in OBJECT_KEYS])
CLUSTER = command("k8s_cluster", (
    f'{_KUBECTL}; {_KUBECONFIG}; n=$(hostname); echo "node=$n"; '
    'echo "kubectl=$k"; echo "kubeconfig=$kc"; if [ -n "$k" ] && [ -n "$kc" ]; then '
    'echo "@@get node"; "$k" --kubeconfig "$kc" --request-timeout=10s get node "$n" -o json 2>&1; r=$?; echo; '
    f'echo "@@end $r"; if [ $r -eq 0 ]; then {_GETS}; fi; fi; '
    f'[ -e {DEVICE_PLUGIN_SOCKET} ] && echo socket=yes; true'), parse_cluster, module=_M, late=True)


def distribution(tools: dict[str, str], units: dict[str, UnitState]) -> Distribution | None:
    """The node's Kubernetes distribution, or None when no kubelet runs or is installed here."""
    for d in DISTRIBUTIONS:
        if d.name in tools or any(units.get(u) and units[u].exists for u in d.units):
            return d
    return None


__all__ = ["CLUSTER", "Cluster", "DEVICE_PLUGIN_SOCKET", "DISTRIBUTIONS", "Distribution", "KUBECONFIGS",
           "OBJECT_KEYS", "RANCHER_CONTAINERD", "SHARING_UNITS", "TOOLS", "UNITS", "distribution", "parse_cluster"]
