"""Kubernetes checks (layer "container"): on a node with a kubelet, the kubelet's containerd has the nvidia runtime,
the device plugin is deployed and registered (its socket), the node advertises nvidia.com/gpu as many times as
the plugin's config says (time-slicing, MIG), and the MPS / MIG units gpunode installed are enabled and ordered
before the kubelet. Every check skips on nodes without a kubelet."""

from __future__ import annotations

import re

from gpunode import fixes
from gpunode.doctor.base import NO_GPU, Node, Verdict, check, failed, passed, skipped, warned
from gpunode.facts import containers as container_facts
from gpunode.facts import k8s as k8s_facts
from gpunode.facts.containers import ConfigError, containerd_state, effective_containerd
from gpunode.facts.k8s import Distribution
from gpunode.facts.packages import unit

PLUGIN = "daemonset/nvidia-device-plugin-daemonset"
CONFIG = "configmap/nvidia-device-plugin-config"
FIX_K8S = fixes.gpunode("install", only="k8s")
_RESTART_PLUGIN = fixes.here("kubectl -n kube-system rollout restart daemonset/nvidia-device-plugin-daemonset")
_REPLICAS = re.compile(r"timeSlicing:(?:.|\n)*?replicas:\s*(\d+)")


def _dist(node: Node) -> Distribution | None:
    return k8s_facts.distribution(node.facts[k8s_facts.TOOLS], node.facts[k8s_facts.UNITS])


def _kubelet_gpu_node(node: Node) -> Distribution | Verdict:
    """The node's Kubernetes distribution, or the verdict of a check that has nothing to look at (no kubelet, no
    GPU)."""
    d = _dist(node)
    if d is None:
        return skipped("no kubelet on this node")
    if not node.has_gpu:
        return NO_GPU
    return d


@check("container.k8s-kubelet-runtime", "container", "the kubelet's containerd has the nvidia runtime")
def kubelet_runtime(node: Node) -> Verdict:
    d = _kubelet_gpu_node(node)
    if not isinstance(d, Distribution):
        return d
    try:
        if d.containerd_dir:
            files = node.facts[k8s_facts.RANCHER_CONTAINERD]
            generated = f"{d.containerd_dir}/config.toml"
            if generated not in files:
                return skipped(f"{generated} does not exist ({d.name} has not started)")
            state = containerd_state(effective_containerd(files, config=generated, major=2,
                                                          known_dirs=(f"{d.containerd_dir}/conf.d",)).config)
            where = f"{d.name}'s {generated}"
        else:
            state = containerd_state(effective_containerd(node.facts[container_facts.CONTAINERD_FILES], major=2).config)
            where = container_facts.CONTAINERD_CONFIG
    except ConfigError as exc:
        return failed(f"{exc.path}: {exc}", f"repair {exc.path}, then: " + FIX_K8S)
    if state.has_nvidia:
        return passed(f"{where}: nvidia runtime ({state.binary})" + (", the default" if state.nvidia_is_default else ""))
    fix = FIX_K8S if d.containerd_dir else fixes.gpunode("install", k8s=True, only="runtime")
    return failed(f"{where}: no nvidia runtime: pods with runtimeClassName nvidia cannot start", fix)


@check("container.k8s-device-plugin", "container", "NVIDIA device plugin deployed and registered with the kubelet")
def device_plugin(node: Node) -> Verdict:
    d = _kubelet_gpu_node(node)
    if not isinstance(d, Distribution):
        return d
    cluster = node.facts[k8s_facts.CLUSTER]
    if not cluster.kubectl or not cluster.kubeconfig:
        return skipped("no kubectl or kubeconfig on the node to ask the cluster" if not cluster.kubectl else
                       "no kubeconfig on the node (looked for " + ", ".join(k8s_facts.KUBECONFIGS) + ")")
    if not cluster.reachable:
        return failed(f"kubectl could not read node {cluster.node_name}: {cluster.error or 'no answer'}",
                      "check the API server and that the node joined: " + fixes.here("kubectl get nodes"))
    if PLUGIN not in cluster.objects:
        return failed("the NVIDIA device plugin is not deployed (kube-system/nvidia-device-plugin-daemonset)", FIX_K8S)
    ready = (cluster.objects[PLUGIN].get("status") or {}).get("numberReady", 0)
    if not ready:
        return failed("the device plugin's pods are not ready",
                      fixes.here("kubectl -n kube-system logs daemonset/nvidia-device-plugin-daemonset"))
    if not cluster.socket:
        return failed(f"{k8s_facts.DEVICE_PLUGIN_SOCKET} is missing: the plugin has not registered with the kubelet",
                      _RESTART_PLUGIN)
    return passed(f"device plugin ready ({ready}), socket {k8s_facts.DEVICE_PLUGIN_SOCKET} present")


@check("container.k8s-allocatable", "container", "node advertises nvidia.com/gpu (time-slicing replicas included)")
def allocatable(node: Node) -> Verdict:
    d = _kubelet_gpu_node(node)
    if not isinstance(d, Distribution):
        return d
    cluster = node.facts[k8s_facts.CLUSTER]
    seen = cluster.allocatable_gpus()
    if seen is None:
        return skipped("the node object could not be read")
    config = ((cluster.objects.get(CONFIG) or {}).get("data") or {}).get("config.yaml", "")
    if "migStrategy: mixed" in config:
        return skipped("MIG mixed strategy: the node advertises nvidia.com/mig-* resources")
    found = _REPLICAS.search(config)
    replicas = int(found.group(1)) if found else 1
    expected = len(node.facts.gpus) * replicas
    if seen == 0:
        return failed(f"node {cluster.node_name} advertises no nvidia.com/gpu", FIX_K8S)
    if "migStrategy: single" not in config and seen != expected:
        return warned(f"node advertises {seen} nvidia.com/gpu; {len(node.facts.gpus)} GPU(s) x {replicas} replicas "
                      f"is {expected}", _RESTART_PLUGIN)
    return passed(f"node advertises {seen} nvidia.com/gpu" + (f" ({replicas} time-slicing replicas per GPU)"
                                                              if replicas > 1 else ""))


@check("container.k8s-sharing-units", "container", "MPS / MIG units enabled and ordered before the kubelet")
def sharing_units(node: Node) -> Verdict:
    files = node.facts[k8s_facts.SHARING_UNITS]
    if not files:
        return skipped("no MPS or MIG unit from gpunode on this node")
    units = node.facts[k8s_facts.UNITS]
    problems = []
    for path, text in sorted(files.items()):
        name = path.rsplit("/", 1)[-1]
        state = unit(units, name)
        before = " ".join(line.partition("=")[2] for line in text.splitlines() if line.startswith("Before="))
        d = _dist(node)
        if d is not None and not set(d.units) & set(before.split()):
            problems.append(f"{name} is not ordered before {d.units[0]}")
        if not state.is_enabled:
            problems.append(f"{name} is {state.enabled or 'not known to systemd'}: it does not run at boot")
        elif not state.is_active:
            problems.append(f"{name} is {state.active}")
    if problems:
        return failed("; ".join(problems), FIX_K8S + "  # with the same --mps / --mig-layout options")
    return passed(", ".join(p.rsplit("/", 1)[-1] for p in sorted(files)) + " enabled, before the kubelet")


__all__ = ["allocatable", "device_plugin", "kubelet_runtime", "sharing_units"]
