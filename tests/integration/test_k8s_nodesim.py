"""Kubernetes nodes end to end on node-simulator nodes (a one-node cluster whose kubectl, kubelet and k3s are
simulator shims, tests/nodesim/node_files/py/kube.py): from a bare node to a passing `verify --k8s`, a re-run that
changes nothing, and time-slicing that makes the node advertise N times its GPUs."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner

from gpunode.actions import k8s as k8s_actions
from gpunode.cli import app
from tests.integration.test_doctor_nodesim import Mirror, V, invoke
from tests.nodesim import SimNode, get_profile
from tests.nodesim.fixtures import host_guard, nodesim_available  # noqa: F401 - pytest fixtures
from tests.nodesim.node import changes_systemd

pytestmark = pytest.mark.integration

cli = CliRunner()
DS = "/var/lib/nodesim/k8s/objects.json"


@pytest.fixture(autouse=True)
def _fast_polls(monkeypatch):
    monkeypatch.setattr(k8s_actions, "POLL_SECONDS", 0.2)


@pytest.fixture(scope="module")
def mirror(tmp_path_factory: pytest.TempPathFactory, nodesim_available: bool) -> Iterator[Mirror]:  # noqa: F811
    served = Mirror(tmp_path_factory.mktemp("www"), (V,))
    yield served
    served.httpd.shutdown()
    served.httpd.server_close()


def start(profile: str, **overrides) -> SimNode:
    return SimNode(get_profile(profile, nouveau_loaded=False, **overrides)).start()


def install(mirror: Mirror, node: SimNode, *extra: str) -> dict[str, dict]:
    result = invoke(mirror, "install", *node.cli_args(), "--driver", V, "--json", *extra)
    assert result.exit_code == 0, result.output
    return {s["step"]: s for s in json.loads(result.stdout)["steps"]}


def verify_k8s(node: SimNode, *extra: str) -> tuple[int, dict]:
    result = cli.invoke(app, ["verify", *node.cli_args(), "--k8s", "--json", "--timeout", "20", *extra])
    return result.exit_code, json.loads(result.stdout)


def allocatable(node: SimNode) -> str | None:
    rc, out, err = node.ssh(f"kubectl --kubeconfig {KUBECONFIG[node.profile.kubernetes]} get node "
                            "\"$(hostname)\" -o json")
    assert rc == 0, err
    return json.loads(out)["status"]["allocatable"].get("nvidia.com/gpu")


KUBECONFIG = {"kubelet": "/etc/kubernetes/admin.conf", "k3s": "/etc/rancher/k3s/k3s.yaml"}


def changes(node: SimNode) -> list[list[str]]:
    return [c for c in node.calls() if (c[0] in ("kubectl", "k3s") and "apply" in c)
            or (c[0] == "nvidia-ctk" and "configure" in c) or changes_systemd(c)
            or (c[0] == "apt-get" and "install" in c)]


def k8s_checks(node: SimNode) -> dict[str, str]:
    result = cli.invoke(app, ["doctor", *node.cli_args(), "--json"])
    return {c["id"]: c["status"] for c in json.loads(result.stdout)["checks"] if c["id"].startswith("container.k8s")}


def objects(node: SimNode) -> set[str]:
    return {key.split("/", 1)[0] + "/" + key.rsplit("/", 1)[1] for key in json.loads(node.read(DS))}


def check_pod_passed(node: SimNode, data: dict) -> None:
    tests = {t["name"]: t for t in data["tests"]}
    assert {n: t["status"] for n, t in tests.items()} == {"device plugin": "pass", "pod nvidia.com/gpu: 1": "pass"}
    assert tests["pod nvidia.com/gpu: 1"]["seen_gpus"] == node.gpu_uuids[:1]
    assert not [k for k in json.loads(node.read(DS)) if k.startswith("Pod/")]  # the test pod is gone
    assert not [n for n in node.listdir("var/lib/gpunode/k8s") if n.startswith("gpunode-verify-")]


def test_containerd_kubelet_from_bare_node_to_verified_gpu_pod_and_time_slicing(mirror):
    node = start("ubuntu-22.04-t4", engines=("containerd",), kubernetes="kubelet")
    try:
        code, data = verify_k8s(node)
        assert code == 1 and data["error"]["message"].startswith("the NVIDIA driver is not loaded on the node")

        plan = invoke(mirror, "plan", *node.cli_args(), "--driver", V, "--json")
        k8s = {s["step"]: s for s in json.loads(plan.stdout)["steps"]}["k8s"]
        assert k8s["status"] == "change" and "device plugin v0.17.0 to deploy" in k8s["reason"]
        apply_action = k8s["actions"][0]
        assert apply_action["kind"] == "kubectl-apply" and "daemonset/nvidia-device-plugin-daemonset: not deployed" \
            in apply_action["diff"]
        assert apply_action["commands"] == ["/usr/bin/kubectl --kubeconfig /etc/kubernetes/admin.conf "
                                            "--request-timeout=30s apply -f /var/lib/gpunode/k8s/nvidia-device-plugin.json"]

        steps = install(mirror, node)
        assert steps["runtime"]["status"] == "change" and steps["k8s"]["status"] == "change"
        assert allocatable(node) == "1"
        assert objects(node) == {"RuntimeClass/nvidia", "ConfigMap/nvidia-device-plugin-config",
                                 "DaemonSet/nvidia-device-plugin-daemonset"}

        code, data = verify_k8s(node)
        assert code == 0, data
        check_pod_passed(node, data)
        assert k8s_checks(node) == {"container.k8s-kubelet-runtime": "pass", "container.k8s-device-plugin": "pass",
                                    "container.k8s-allocatable": "pass", "container.k8s-sharing-units": "skip"}

        node.clear_calls()
        again = install(mirror, node)
        assert {s["status"] for s in again.values()} == {"ok"}, again
        assert changes(node) == []

        shared = install(mirror, node, "--gpu-replicas", "4")
        assert shared["k8s"]["status"] == "change" and "expected 4 (1 GPU(s) x 4" in shared["k8s"]["reason"]
        assert allocatable(node) == "4"
        config = json.loads(node.read(DS))["ConfigMap/kube-system/nvidia-device-plugin-config"]["data"]["config.yaml"]
        assert "timeSlicing:" in config and "replicas: 4" in config
        code, data = verify_k8s(node)
        assert code == 0, data
        node.clear_calls()
        again = install(mirror, node, "--gpu-replicas", "4")
        assert {s["status"] for s in again.values()} == {"ok"} and changes(node) == []
        back = install(mirror, node)  # without --gpu-replicas: each GPU advertised once again
        assert back["k8s"]["status"] == "change" and allocatable(node) == "1"
    finally:
        node.stop()


def test_k3s_from_bare_node_writes_the_template_not_etc_containerd(mirror):
    node = start("ubuntu-22.04-t4", engines=(), kubernetes="k3s")
    tmpl = "var/lib/rancher/k3s/agent/etc/containerd/config.toml.tmpl"
    try:
        code, data = verify_k8s(node)
        assert code == 1 and "driver is not loaded" in data["error"]["message"]
        steps = install(mirror, node)
        assert steps["runtime"]["status"] == "ok"  # no system containerd: nothing for the runtime step
        assert steps["k8s"]["status"] == "change" and steps["k8s"]["reason"].startswith(
            "k3s: containerd has no nvidia runtime")
        assert not node.exists("etc/containerd/config.toml")
        # nvidia-ctk 1.20 puts the runtime in a drop-in the template imports (k3s renders the template only)
        assert 'imports = ["/var/lib/rancher/k3s/agent/etc/containerd/conf.d/*.toml"]' in node.read(tmpl)
        assert 'BinaryName = "/usr/bin/nvidia-container-runtime"' in node.read(
            "var/lib/rancher/k3s/agent/etc/containerd/conf.d/99-nvidia.toml")
        assert ["systemctl", "restart", "k3s.service"] in node.calls("systemctl")
        generated = node.read("var/lib/rancher/k3s/agent/etc/containerd/config.toml")
        assert generated == node.read(tmpl)  # k3s regenerated it from the template at restart
        assert allocatable(node) == "1"

        code, data = verify_k8s(node)
        assert code == 0, data
        check_pod_passed(node, data)

        node.clear_calls()
        again = install(mirror, node)
        assert {s["status"] for s in again.values()} == {"ok"}, again
        assert changes(node) == []

        assert k8s_checks(node)["container.k8s-kubelet-runtime"] == "pass"
        install(mirror, node, "--gpu-replicas", "3")
        assert allocatable(node) == "3"
        assert k8s_checks(node)["container.k8s-allocatable"] == "pass"
    finally:
        node.stop()


def test_verify_k8s_on_a_node_without_kubernetes_says_what_is_missing(mirror):
    node = start("ubuntu-22.04-t4", engines=("containerd",))
    try:
        code, data = verify_k8s(node)
        assert code == 1
        assert data["error"]["message"].startswith("no kubelet on this node")
        plan = invoke(mirror, "plan", *node.cli_args(), "--driver", V, "--json", "--only", "k8s")
        step = json.loads(plan.stdout)["steps"][0]
        assert (step["status"], step["reason"]) == ("ok", "no kubelet on this node")
    finally:
        node.stop()


def test_verify_k8s_names_the_broken_part_when_the_plugin_is_not_deployed(mirror):
    node = start("ubuntu-22.04-t4", engines=("containerd",), kubernetes="kubelet")
    try:
        install(mirror, node, "--skip", "k8s")
        code, data = verify_k8s(node)
        tests = {t["name"]: t for t in data["tests"]}
        assert code == 1 and tests["device plugin"]["status"] == "fail"
        assert tests["device plugin"]["reason"].startswith("the NVIDIA device plugin is not deployed")
        assert tests["device plugin"]["fix"].startswith("gpunode install --host root@127.0.0.1:")
        assert tests["device plugin"]["fix"].endswith("--only k8s")
        assert tests["pod nvidia.com/gpu: 1"]["status"] == "skip"
    finally:
        node.stop()
