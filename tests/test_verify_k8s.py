"""`verify --k8s` against a scripted kubectl: a pod the scheduler cannot place fails with the scheduler's reason,
a pod that lists a GPU not on the host fails, and the test pod and its manifest are removed in every case."""

from __future__ import annotations

import json

from gpunode import verify_k8s as vk
from gpunode.facts.driver import SmiGpu
from gpunode.verify import Report
from tests.fakes.connection import FakeConnection, FakeNode

HOST = (SmiGpu(0, "0000:3b:00.0", "Tesla T4", uuid="GPU-11111111-2222-3333-4444-555555555555"),)
PENDING = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."


def kubectl(phase: str, logs: str = ""):
    def handler(node, argv, stdin):
        args = argv[argv.index("--request-timeout=30s") + 1:]
        if args[0] == "apply":
            return 0, "pod/x created\n", ""
        if args[:2] == ["get", "pod"]:
            conditions = ([{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": PENDING}]
                          if phase == "Pending" else [])
            return 0, json.dumps({"status": {"phase": phase, "conditions": conditions}}), ""
        if args[0] == "logs":
            return 0, logs, ""
        if args[0] == "delete":
            return 0, "", ""
        return 1, "", "unexpected"
    return handler


def node_with(handler) -> FakeNode:
    node = FakeNode()
    node.handlers["/usr/bin/kubectl"] = handler
    node.handlers["rm"] = lambda n, argv, stdin: (n.files.pop(argv[-1], None), (0, "", ""))[1]
    return node


def run_pod(node: FakeNode, timeout: float = 0.0):
    report = Report("n", {}, host_gpus=HOST)
    kube = lambda *a: ("/usr/bin/kubectl", "--kubeconfig", "/etc/kubernetes/admin.conf", "--request-timeout=30s", *a)  # noqa: E731
    return vk._pod(FakeConnection(node), kube, report, "gpu-1", "nvidia/cuda:12.4.1-base-ubuntu22.04", timeout)


def test_a_pending_pod_fails_with_the_schedulers_reason_and_is_deleted():
    node = node_with(kubectl("Pending"))
    outcome = run_pod(node)
    assert outcome.status == "fail" and PENDING in outcome.reason
    deletes = [c for c in node.calls if "delete" in c]
    assert len(deletes) == 1 and deletes[0][-3].startswith("gpunode-verify-")
    assert not [p for p in node.files if "gpunode-verify-" in p]  # the manifest is gone too


def test_the_pod_must_list_exactly_one_of_the_hosts_gpus():
    good = run_pod(node_with(kubectl("Succeeded", f"GPU 0: Tesla T4 (UUID: {HOST[0].uuid})\n")))
    assert good.status == "pass" and good.seen == (HOST[0].uuid,)
    stranger = "GPU-99999999-2222-3333-4444-555555555555"
    bad = run_pod(node_with(kubectl("Succeeded", f"GPU 0: Tesla T4 (UUID: {stranger})\n")))
    assert bad.status == "fail" and f"{stranger} not on the host" in bad.reason
    failed = run_pod(node_with(kubectl("Failed", "Failed to initialize NVML: Unknown Error\n")))
    assert failed.status == "fail"


def test_the_manifest_asks_for_one_gpu_on_this_node_with_the_nvidia_runtime_class():
    pod = vk.pod_manifest("gpunode-verify-1", "gpu-1", "img")
    spec = pod["spec"]
    assert spec["runtimeClassName"] == "nvidia" and spec["nodeSelector"] == {"kubernetes.io/hostname": "gpu-1"}
    assert spec["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": 1}
    assert spec["containers"][0]["command"] == ["nvidia-smi", "-L"] and spec["restartPolicy"] == "Never"
