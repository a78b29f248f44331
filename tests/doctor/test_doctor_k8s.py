"""Kubernetes doctor checks from facts: each passes on a converged node and fails (or warns) on its broken variant,
and all of them skip where there is no kubelet."""

from __future__ import annotations

import pytest

from gpunode.doctor.base import Node
from gpunode.doctor.k8s import allocatable, device_plugin, kubelet_runtime, sharing_units
from gpunode.facts import k8s as k8s_facts
from gpunode.facts.containers import CONTAINERD_CONFIG
from gpunode.steps import k8s, k8s_sharing
from tests.steps.test_k8s import K3S_DIR, K3S_GENERATED, cluster_text, facts

NVIDIA = ('[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]\n  runtime_type = "io.containerd.runc.v2"\n'
          '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]\n'
          '  BinaryName = "/usr/bin/nvidia-container-runtime"\n')
CHECKS = (kubelet_runtime, device_plugin, allocatable, sharing_units)


def run(f, fn):
    return fn(Node(f))


def converged(replicas=1, **kw):
    deployed = k8s.objects(replicas)
    text = cluster_text(deployed=deployed, gpus=replicas, socket=True)
    text = text.replace('"kind": "DaemonSet"', '"kind": "DaemonSet", "status": {"numberReady": 1}')
    return facts(text, files={CONTAINERD_CONFIG: 'version = 2\n' + NVIDIA} | kw.pop("files", {}), **kw)


def test_every_check_skips_without_a_kubelet():
    f = facts(cluster_text(kubectl="", kubeconfig=""), tools="")
    assert {run(f, c).status for c in CHECKS} == {"skip"}


@pytest.mark.parametrize("replicas", [1, 4])
def test_a_converged_node_passes(replicas):
    f = converged(replicas)
    results = {c.id: run(f, c) for c in CHECKS[:3]}
    assert {n: r.status for n, r in results.items()} == {n: "pass" for n in results}, results
    assert results["container.k8s-allocatable"].evidence.startswith(f"node advertises {replicas} nvidia.com/gpu")


def test_broken_variants_name_the_problem_and_the_fix():
    no_runtime = facts(cluster_text(), files={CONTAINERD_CONFIG: "version = 2\n"})
    r = run(no_runtime, kubelet_runtime)
    assert r.status == "fail" and r.fix == "gpunode install --k8s --only runtime"
    r = run(facts(cluster_text()), device_plugin)
    assert r.status == "fail" and r.evidence.startswith("the NVIDIA device plugin is not deployed")
    full = converged()
    no_socket = facts(full.section(k8s_facts.CLUSTER).text.replace("socket=yes", ""), files=dict(full.files))
    r = run(no_socket, device_plugin)
    assert r.status == "fail" and "nvidia-gpu.sock is missing" in r.evidence
    r = run(facts(cluster_text(deployed=k8s.objects(1), gpus=0)), allocatable)
    assert r.status == "fail" and r.fix == "gpunode install --only k8s"
    drifted = facts(cluster_text(deployed=k8s.objects(4), gpus=1))
    assert run(drifted, allocatable).status == "warn"
    down = facts(cluster_text(node_error="Unable to connect to the server: dial tcp 10.0.0.1:6443: i/o timeout"))
    r = run(down, device_plugin)
    assert r.status == "fail" and "i/o timeout" in r.evidence


def test_k3s_runtime_is_read_from_its_generated_config():
    tools = "k3s /usr/local/bin/k3s\nkubectl /usr/local/bin/kubectl"
    bare = facts(cluster_text(), tools=tools, files={f"{K3S_DIR}/config.toml": K3S_GENERATED})
    assert run(bare, kubelet_runtime).fix == "gpunode install --only k8s"
    done = facts(cluster_text(), tools=tools, files={f"{K3S_DIR}/config.toml": K3S_GENERATED + NVIDIA})
    assert run(done, kubelet_runtime).status == "pass"


def test_sharing_units_must_be_enabled_running_and_before_the_kubelet():
    path = f"/etc/systemd/system/{k8s_sharing.MPS_UNIT}"
    good = converged(files={path: k8s_sharing.mps_unit(None)}, units="nvidia-mps.service\tactive\tenabled\n")
    assert run(good, sharing_units).status == "pass"
    disabled = converged(files={path: k8s_sharing.mps_unit(None)}, units="nvidia-mps.service\tinactive\tdisabled\n")
    r = run(disabled, sharing_units)
    assert r.status == "fail" and "does not run at boot" in r.evidence
    unordered = converged(files={path: "[Unit]\nDescription=x\n[Service]\nExecStart=/bin/true\n"},
                          units="nvidia-mps.service\tactive\tenabled\n")
    r = run(unordered, sharing_units)
    assert r.status == "fail" and "not ordered before kubelet.service" in r.evidence
