"""Step: make a Kubernetes node schedule its GPUs.

On a node with a kubelet (kubeadm-style, k3s or RKE2):
- the kubelet's container runtime needs the nvidia runtime. For a kubelet on the system's containerd / CRI-O
  the runtime step does that (with --k8s also as the default); k3s and RKE2 run their own containerd and
  regenerate its config.toml from a template at every start, so this step gives the template (config.toml.tmpl,
  or config-v3.toml.tmpl for containerd 2 configs) the runtime, with nvidia-ctk as the runtime step does;
- the RuntimeClass `nvidia` and NVIDIA's device plugin (data/nvidia_device_plugin.json, pinned to a release)
  are applied with the node's kubectl, and the step waits until the node advertises nvidia.com/gpu;
- time-slicing (--gpu-replicas N) goes through the device plugin's config: each GPU is advertised N times.

What is deployed is compared with what kubectl last applied (its last-applied-configuration), object by
object: equal objects are left alone, so a re-run changes nothing. On a node without a kubelet the step is ok.
"""

from __future__ import annotations

import copy
import hashlib
import json
import posixpath
from dataclasses import dataclass
from functools import cache
from typing import Any

from gpunode import compat, fixes
from gpunode.facts import Facts
from gpunode.facts import k8s as k8s_facts
from gpunode.facts.containers import (
    ConfigError,
    containerd_config_version,
    containerd_state,
    effective_containerd,
    parse_toml,
    predict_containerd,
)
from gpunode.facts.k8s import Cluster, Distribution
from gpunode.facts.packages import unit
from gpunode.options import Options, unused_options
from gpunode.plan import Action, Earlier, Outputs, RestartService, StepPlan, blocked, change, ok
from gpunode.steps import runtime
from gpunode.steps.base import Step
from gpunode.steps.outputs import RuntimeOutputs

NAME = "k8s"
TITLE = "Kubernetes: nvidia runtime for the kubelet, device plugin, GPU sharing"
READS = ("toolkit", "runtime")  # nvidia-ctk may come with the toolkit; the runtime step wires containerd / CRI-O
MANIFEST_PATH = "/var/lib/gpunode/k8s/nvidia-device-plugin.json"
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


@dataclass(frozen=True, eq=False, repr=False)
class K8sOutputs(Outputs):
    distribution: str | None  # "kubelet" | "k3s" | "rke2"; None: no kubelet on this node
    gpus: int = 0  # the nvidia.com/gpu the node advertises once the step has converged


@cache
def device_plugin() -> dict[str, Any]:
    """The pinned device plugin manifest (data/nvidia_device_plugin.json) as loaded."""
    data: dict[str, Any] = json.loads((compat.data_dir() / "nvidia_device_plugin.json").read_text(encoding="utf-8"))
    return data


def plugin_config(replicas: int, mig: str = "none") -> str:
    """The device plugin's config file: time-slicing when each GPU is shared by more than one pod."""
    lines = ["version: v1", "flags:", f"  migStrategy: {mig}"]
    if replicas > 1:
        lines += ["sharing:", "  timeSlicing:", "    resources:", "    - name: nvidia.com/gpu",
                  f"      replicas: {replicas}"]
    return "\n".join(lines) + "\n"


def _fill(value: Any, values: dict[str, str]) -> Any:
    if isinstance(value, dict):
        return {k: _fill(v, values) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, values) for v in value]
    return values.get(value, value) if isinstance(value, str) else value


def objects(replicas: int, mig: str = "none") -> list[dict[str, Any]]:
    """The objects to apply, placeholders filled (the config's digest restarts the plugin when it changes)."""
    data = device_plugin()
    config = plugin_config(replicas, mig)
    values = {"@CONFIG@": config, "@CONFIG_SHA256@": hashlib.sha256(config.encode()).hexdigest(),
              "@IMAGE@": data["image"]}
    return [_fill(copy.deepcopy(o), values) for o in data["objects"]]


def key(obj: dict[str, Any]) -> str:
    return f"{obj['kind'].lower()}/{obj['metadata']['name']}"


def manifest(objs: list[dict[str, Any]]) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": objs}, indent=2, sort_keys=True) + "\n"


def shown(obj: dict[str, Any]) -> str:
    return json.dumps(obj, indent=2, sort_keys=True) + "\n"


def deployed(cluster: Cluster, name: str) -> dict[str, Any] | None:
    """The object as kubectl last applied it; None when it is not deployed (or not by kubectl apply)."""
    found = cluster.objects.get(name)
    if found is None:
        return None
    text = ((found.get("metadata") or {}).get("annotations") or {}).get(LAST_APPLIED)
    try:
        applied = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return None
    return applied if isinstance(applied, dict) else None


def plan(facts: Facts, options: Options, earlier: Earlier | None = None) -> StepPlan:
    decided, dist, gpus = _plan(facts, options, earlier or Earlier({}, READS))
    return decided.with_outputs(K8sOutputs(dist, gpus))


def _template_actions(d: Distribution, facts: Facts, options: Options, earlier: Earlier,
                      notes: list[str]) -> tuple[list[Action], str, tuple[str, str] | None]:
    """k3s / RKE2: (actions, reason, blocked) for their containerd template."""
    assert d.containerd_dir is not None
    files = facts[k8s_facts.RANCHER_CONTAINERD]
    generated_path = f"{d.containerd_dir}/config.toml"
    generated = files.get(generated_path)
    if generated is None:
        why = f"{generated_path} does not exist: {d.name} has not started its containerd yet"
        return [], why, (why, f"start {d.units[0]} once (`systemctl start {d.units[0]}`), then run again")
    try:
        version = containerd_config_version(parse_toml(generated, generated_path))
        template = f"{d.containerd_dir}/{'config-v3.toml.tmpl' if version >= 3 else 'config.toml.tmpl'}"
        dropin = f"{d.containerd_dir}/conf.d/99-nvidia.toml"
        known = (posixpath.dirname(dropin),)
        major = 2 if version >= 3 else 1
        source = files.get(template, generated)
        if template in files:
            state = containerd_state(effective_containerd(files, config=template, major=major, known_dirs=known).config)
        else:
            state = containerd_state(effective_containerd(files, config=generated_path, major=major,
                                                          known_dirs=known).config)
            if state.has_nvidia:
                notes.append(f"{d.name} found nvidia-container-runtime itself when it started; the nvidia runtime "
                             f"is in {generated_path}")
        want_default = options.k8s
        if state.satisfies(want_default):
            return [], f"{d.name}: containerd has the nvidia runtime", None
        ctk, ctk_note = runtime._ctk_version(facts, earlier)
        if ctk is None:
            why = "nvidia-ctk is not installed (it comes with the NVIDIA Container Toolkit)"
            return [], why, (why, "run the toolkit step first: " + fixes.gpunode("install", only="toolkit"))
        if ctk_note:
            notes.append(ctk_note)
        predicted = predict_containerd(source, config=template, dropin=dropin, set_as_default=want_default, ctk=ctk)
    except ConfigError as exc:
        why = f"{d.name}: {exc}"
        return [], why, (why, f"repair {exc.path} by hand (a template with Go template directives cannot be "
                              "edited by nvidia-ctk), then run again")
    changed = tuple((p, files.get(p), text) for p, text in predicted.items() if files.get(p) != text)
    argv = runtime._flags("containerd", template, dropin, ctk, want_default)
    from gpunode.actions.k8s import ConfigureTemplate

    actions: list[Action] = [ConfigureTemplate(
        f"add the nvidia runtime to {d.name}'s containerd template" + (" as its default" if want_default else ""),
        source=generated_path, template=template, argv=argv, files=changed)]
    units = facts[k8s_facts.UNITS]
    active = [u for u in d.units if unit(units, u).is_active]
    for name in active:
        actions.append(RestartService(f"restart {name.removesuffix('.service')} so it regenerates containerd's "
                                      "config from the template", unit=name))
    if not active:
        notes.append(f"{' / '.join(d.units)} not running: the template is read when it starts")
    if template not in files:
        notes.append(f"{template} starts as a copy of {generated_path}: {d.name} upgrades no longer change "
                     "containerd's config until the template is removed")
    return actions, f"{d.name}: containerd has no nvidia runtime", None


def _kubelet_runtime(facts: Facts, earlier: Earlier) -> tuple[str, tuple[str, str] | None]:
    """A kubelet on the system's containerd / CRI-O: the runtime step gives them the nvidia runtime."""
    out = earlier.outputs("runtime", RuntimeOutputs)
    if out is None:
        return "runtime step not in this run", None
    engines = [e for e in out.engines if e in ("containerd", "crio")]
    if engines:
        return f"{' and '.join(engines)}: nvidia runtime from the runtime step", None
    why = "the kubelet's container runtime (containerd or CRI-O) does not get the nvidia runtime"
    return why, (why, "run " + fixes.gpunode("install", k8s=True)
                 + " (containerd next to docker is left alone without --k8s)")


def _plan(facts: Facts, options: Options, earlier: Earlier) -> tuple[StepPlan, str | None, int]:
    d = k8s_facts.distribution(facts[k8s_facts.TOOLS], facts[k8s_facts.UNITS])
    if d is None:
        unused = unused_options(options, "kubelet")  # the option table's rule for these options: a note
        return ok(NAME, "no kubelet on this node", *([f"{', '.join(unused)} apply to a Kubernetes node: not used "
                                                        "here (no kubelet, k3s or RKE2)"] if unused else [])), None, 0
    if not facts.gpus:
        return ok(NAME, f"{d.name} node without an NVIDIA GPU: nothing to advertise"), d.name, 0
    notes: list[str] = []
    actions: list[Action] = []
    if d.containerd_dir:
        actions, runtime_reason, stop = _template_actions(d, facts, options, earlier, notes)
    else:
        runtime_reason, stop = _kubelet_runtime(facts, earlier)
    if stop:
        return blocked(NAME, stop[0], stop[1], *notes), d.name, 0
    # a node with a kubelet and a GPU: the sharing settings and the actions that deploy the plugin (a node without
    # one never loads them)
    from gpunode.actions.k8s import KubectlApply, WaitForGpus
    from gpunode.steps.k8s_sharing import mig_strategy, plan_sharing

    shared, shared_reasons, shared_notes = plan_sharing(facts, options)
    notes += shared_notes
    replicas = options.gpu_replicas
    mig = mig_strategy(options.mig_layout)
    per_gpu = len(options.mig_layout) if mig == "single" else 1
    expected = len(facts.gpus) * per_gpu * replicas
    sharing = (f" ({len(facts.gpus)} GPU(s)" + (f" x {per_gpu} MIG instances" if per_gpu > 1 else "")
               + (f" x {replicas} time-slicing replicas" if replicas > 1 else "") + ")") if expected > len(facts.gpus) else ""
    if mig == "mixed":
        notes.append("MIG layout with several profiles: the node advertises nvidia.com/mig-<profile> resources, "
                     "not nvidia.com/gpu; gpunode does not wait for them")
    cluster = facts[k8s_facts.CLUSTER]
    kubectl = cluster.kubectl
    kubeconfig = options.kubeconfig or cluster.kubeconfig
    if not kubectl:
        why = f"no kubectl on this node: the device plugin cannot be deployed ({runtime_reason})"
        return blocked(NAME, why, "install kubectl on the node (or the distribution's own: k3s and RKE2 ship one), "
                       "then run again", *notes), d.name, 0
    if not kubeconfig:
        why = "no kubeconfig on this node (looked for " + ", ".join(k8s_facts.KUBECONFIGS) + ")"
        return blocked(NAME, why, "pass --kubeconfig PATH (a kubeconfig on the node that may apply objects "
                       "in kube-system)", *notes), d.name, 0
    read_with_other = options.kubeconfig is not None and options.kubeconfig != cluster.kubeconfig
    if not cluster.reachable and not read_with_other:
        why = f"kubectl could not read node {cluster.node_name}: {cluster.error or 'no answer'}"
        return blocked(NAME, why, "check that the API server is up and that this node has joined the cluster "
                       "(`kubectl get nodes`), then run again", *notes), d.name, 0

    runtime_changes = bool(actions)  # k3s / RKE2 restart: the plugin registers again
    actions += shared
    runtime_reason = "; ".join([runtime_reason, *shared_reasons])
    wanted = objects(replicas, mig)
    changes: list[tuple[str, str | None, str]]
    if read_with_other:
        notes.append(f"the deployed objects were not read (the probe reads the cluster with "
                     f"{cluster.kubeconfig or 'no kubeconfig'}): kubectl apply leaves equal objects unchanged")
        changes = [(key(o), None, shown(o)) for o in wanted]
    else:
        changes = []
        for o in wanted:
            now = deployed(cluster, key(o))
            if now != o:
                changes.append((key(o), shown(now) if now is not None else None, shown(o)))
    version = device_plugin()["version"]
    if changes:
        what = ", ".join(c[0] for c in changes)
        actions.append(KubectlApply(f"apply the NVIDIA device plugin {version} ({what})", kubectl=kubectl,
                                    kubeconfig=kubeconfig, path=MANIFEST_PATH, manifest=manifest(wanted),
                                    changes=tuple(changes)))
    advertised = cluster.allocatable_gpus()
    if mig != "mixed" and (changes or runtime_changes or advertised != expected):
        actions.append(WaitForGpus(f"wait until the node advertises {expected} nvidia.com/gpu", kubectl=kubectl,
                                   kubeconfig=kubeconfig, node=cluster.node_name, expected=expected,
                                   wait=options.k8s_wait))
    plugin = (f"device plugin {version} " + ("to deploy" if any(c[1] is None for c in changes) else
                                             "to update" if changes else "deployed"))
    seen = "unknown" if advertised is None else str(advertised)
    reason = f"{runtime_reason}; {plugin}; node advertises {seen} nvidia.com/gpu, expected {expected}{sharing}"
    if not actions:
        return ok(NAME, reason, *notes), d.name, expected
    return change(NAME, reason, actions, *notes), d.name, expected


STEP = Step(NAME, TITLE, plan, READS)
