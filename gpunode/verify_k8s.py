"""`gpunode verify --k8s`: the node as Kubernetes sees it. First the device plugin (deployed, its pod ready, its
socket in the kubelet's directory, the node advertising nvidia.com/gpu), then a test pod pinned to the node with
`nvidia.com/gpu: 1` and the RuntimeClass nvidia, running `nvidia-smi -L`: the GPU it lists must be one of the
host's. The pod is deleted afterwards, whatever happened. Everything runs with the node's kubectl.

Without a kubelet, kubectl or kubeconfig nothing runs and the report says exactly which is missing.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable
from typing import Any

from gpunode import cancel, compat, fixes
from gpunode.actions.k8s import allocatable, kubectl_argv
from gpunode.connection.base import Connection
from gpunode.errors import GpunodeError
from gpunode.facts import Facts
from gpunode.facts import driver as driver_facts
from gpunode.facts import k8s as k8s_facts
from gpunode.verify import _GPU_LINE, Outcome, Report, Test, _gpus, judge

POLL_SECONDS = 2.0
ENGINE = "kubernetes"
PLUGIN_DS = "nvidia-device-plugin-daemonset"
FIX_DEPLOY = fixes.gpunode("install", only="k8s")


def pod_manifest(name: str, node: str, image: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "labels": {"app.kubernetes.io/created-by": "gpunode"}},
            "spec": {"restartPolicy": "Never", "runtimeClassName": "nvidia",
                     "nodeSelector": {"kubernetes.io/hostname": node},
                     "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                     "containers": [{"name": name, "image": image, "command": ["nvidia-smi", "-L"],
                                     "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}


def _missing(report: Report, facts: Facts, kubeconfig: str | None) -> tuple[str, str] | None:
    """What stops the Kubernetes checks before they start: (message, fix), or None."""
    dist = k8s_facts.distribution(facts[k8s_facts.TOOLS], facts[k8s_facts.UNITS])
    cluster = facts[k8s_facts.CLUSTER]
    if dist is None:
        return ("no kubelet on this node (no kubelet, k3s or RKE2 installed): it is not a Kubernetes node",
                "join the node to a cluster (kubeadm join, or install k3s / RKE2), then run " + fixes.gpunode("install"))
    if not cluster.kubectl:
        return (f"{dist.name} is installed but there is no kubectl on the node to ask the cluster",
                "install kubectl on the node (k3s and RKE2 ship one), then run again")
    if not (kubeconfig or cluster.kubeconfig):
        return ("no kubeconfig on the node (looked for " + ", ".join(k8s_facts.KUBECONFIGS) + ")",
                "pass --kubeconfig PATH (a kubeconfig on the node)")
    if not facts.gpus:
        return ("no NVIDIA GPU was found on the node", fixes.gpunode("doctor"))
    if not facts.loaded_driver:
        return ("the NVIDIA driver is not loaded on the node: the device plugin has no GPU to advertise",
                fixes.gpunode("doctor") + "  # says which driver suits the GPUs")
    if not report.host_gpus:
        return ("nvidia-smi lists no GPU on the host", fixes.gpunode("doctor"))
    return None


def _plugin(conn: Connection, kube: Callable[..., tuple[str, ...]], facts: Facts, node: str) -> Outcome:
    test = Test(ENGINE, "device plugin", kube("get", "node", node, "-o", "json"))
    result = conn.run(test.argv, sudo=True, timeout=60)
    if not result.ok:
        text = (result.stderr or result.stdout).strip()
        return Outcome(test, "fail", f"kubectl could not read node {node}: {text.splitlines()[-1] if text else 'no output'}",
                       "check that the API server is up and the node has joined (`" + fixes.here("kubectl get nodes") + "`)",
                       result.exit_code)
    advertised = allocatable(result.stdout) or 0
    ds = conn.run(kube("-n", k8s_facts.NAMESPACE, "get", "daemonset", PLUGIN_DS, "-o", "json"), sudo=True, timeout=60)
    if not ds.ok:
        return Outcome(test, "fail", "the NVIDIA device plugin is not deployed (no DaemonSet "
                       f"{k8s_facts.NAMESPACE}/{PLUGIN_DS})", FIX_DEPLOY, ds.exit_code)
    try:
        status = json.loads(ds.stdout).get("status") or {}
    except ValueError:
        status = {}
    ready = status.get("numberReady", 0)
    if not ready:
        return Outcome(test, "fail", f"the device plugin is not running ({ready} of {status.get('desiredNumberScheduled', '?')} "
                       "pods ready)", fixes.here(f"kubectl -n {k8s_facts.NAMESPACE} logs daemonset/{PLUGIN_DS}")
                       + "  # then " + fixes.gpunode("doctor"))
    if not facts[k8s_facts.CLUSTER].socket:
        return Outcome(test, "fail", f"the device plugin's socket {k8s_facts.DEVICE_PLUGIN_SOCKET} is missing: the "
                       "kubelet has no GPU plugin registered",
                       fixes.here(f"kubectl -n {k8s_facts.NAMESPACE} rollout restart daemonset/{PLUGIN_DS}"))
    if advertised < 1:
        return Outcome(test, "fail", f"node {node} advertises no allocatable nvidia.com/gpu", FIX_DEPLOY)
    return Outcome(test, "pass", f"device plugin running ({ready} ready), socket present, node advertises "
                   f"{advertised} nvidia.com/gpu")


def _pod(conn: Connection, kube: Callable[..., tuple[str, ...]], report: Report, node: str, image: str,
         timeout: float) -> Outcome:
    name = f"gpunode-verify-{secrets.token_hex(4)}"
    path = f"/var/lib/gpunode/k8s/{name}.json"
    test = Test(ENGINE, "pod nvidia.com/gpu: 1", kube("apply", "-f", path))
    conn.write_file(path, json.dumps(pod_manifest(name, node, image), indent=2) + "\n", mode=0o600)
    try:
        created = conn.run(test.argv, sudo=True, timeout=60)
        if not created.ok:
            text = (created.stderr or created.stdout).strip()
            return Outcome(test, "fail", f"the test pod was refused: {text.splitlines()[-1] if text else 'no output'}",
                           FIX_DEPLOY, created.exit_code)
        deadline = time.monotonic() + timeout
        pod: dict[str, Any] = {}
        while True:
            got = conn.run(kube("get", "pod", name, "-o", "json"), sudo=True, timeout=60)
            try:
                pod = json.loads(got.stdout) if got.ok else {}
            except ValueError:
                pod = {}
            phase = (pod.get("status") or {}).get("phase", "")
            if phase in ("Succeeded", "Failed") or time.monotonic() >= deadline:
                break
            if cancel.sleep(POLL_SECONDS):
                cancel.check_abort("waiting for the test pod")
        if phase == "Pending" or phase == "":
            why = next((c.get("message") or c.get("reason") for c in (pod.get("status") or {}).get("conditions", [])
                        if c.get("type") == "PodScheduled" and c.get("status") == "False"), None)
            return Outcome(test, "fail", f"the test pod is still {phase or 'not created'} after {timeout:.0f}s"
                           + (f": {why}" if why else " (image pull?)"),
                           fixes.gpunode("verify", k8s=True) + "  # after: " + (FIX_DEPLOY if why else "a larger --timeout"))
        logs = conn.run(kube("logs", name), sudo=True, timeout=60)
        if phase != "Succeeded":
            return judge(test, logs.exit_code or 1, logs.stdout, logs.stderr, report.host_gpus)
        seen = tuple(m["uuid"] for m in _GPU_LINE.finditer(logs.stdout))
        host = {g.uuid for g in report.host_gpus}
        if len(seen) != 1 or seen[0] not in host:
            return Outcome(test, "fail", f"the pod asked for 1 GPU and nvidia-smi -L listed {len(seen)}"
                           + (f" ({', '.join(u for u in seen if u not in host)} not on the host)"
                              if any(u not in host for u in seen) else ""), fixes.gpunode("doctor"), 0, seen, [],
                           logs.stdout.strip())
        return Outcome(test, "pass", f"pod {name} ran nvidia-smi -L: saw {_gpus(seen, report.host_gpus)}", None, 0,
                       seen, [], logs.stdout.strip())
    finally:
        conn.run(kube("delete", "pod", name, "--ignore-not-found", "--wait=false"), sudo=True, timeout=60)
        conn.run(("rm", "-f", "--", path), sudo=True, timeout=30)


def verify_k8s(conn: Connection, facts: Facts, image: str | None = None, kubeconfig: str | None = None,
               timeout: float = 300.0, progress: Callable[[Test], None] | None = None) -> Report:
    report = Report(conn.name, facts.summary())
    report.host_gpus = facts[driver_facts.GPUS]
    report.driver = facts.loaded_driver.version if facts.loaded_driver else None
    stop = _missing(report, facts, kubeconfig)
    if stop is not None:
        report.error = stop
        return report
    cluster = facts[k8s_facts.CLUSTER]
    try:
        report.image = image or compat.verify_image_for(report.driver or "")
        report.image_source = "--image" if image else "compat"
    except GpunodeError as exc:
        report.error = (exc.message, exc.fix)
        return report
    kc = kubeconfig or cluster.kubeconfig or ""

    def kube(*args: str) -> tuple[str, ...]:
        return kubectl_argv(cluster.kubectl or "kubectl", kc, *args)

    plugin = _plugin(conn, kube, facts, cluster.node_name)
    if progress is not None:
        progress(plugin.test)
    report.outcomes.append(plugin)
    if plugin.status != "pass":
        report.outcomes.append(Outcome(Test(ENGINE, "pod nvidia.com/gpu: 1", ()), "skip",
                                       "not started: the device plugin check failed"))
        return report
    if progress is not None:
        progress(Test(ENGINE, "pod nvidia.com/gpu: 1", ()))
    report.outcomes.append(_pod(conn, kube, report, cluster.node_name, report.image, timeout))
    return report
