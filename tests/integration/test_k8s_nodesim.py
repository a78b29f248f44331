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
from tests.integration.test_doctor_nodesim import V, Mirror, invoke
from tests.nodesim import SimNode, get_profile
from tests.nodesim.fixtures import host_guard, nodesim_available  # noqa: F401 - pytest fixtures

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
            or (c[0] == "nvidia-ctk" and "configure" in c) or (c[0] == "systemctl" and not c[1].startswith("is-"))
            or (c[0] == "apt-get" and "install" in c)]
