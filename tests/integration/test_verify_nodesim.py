"""`gpunode verify` against node-simulator nodes: containers really start through the simulator's docker and ctr
(which decide like the NVIDIA stack would: hook registered at daemon start, NVIDIA_REQUIRE_CUDA against the loaded
driver), and what they list is compared with the host's GPUs."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner

from gpunode import fixes
from gpunode.cli import app
from gpunode.cli._target import runnable
from tests.integration.test_doctor_nodesim import Mirror, V, finish, invoke
from tests.nodesim import SimNode, get_profile
from tests.nodesim.fixtures import host_guard, nodesim_available, sim_node  # noqa: F401 - pytest fixtures
from tests.nodesim.node import changes_systemd

pytestmark = pytest.mark.integration

cli = CliRunner()
IMAGE = "nvidia/cuda:13.0.2-base-ubuntu24.04"  # what gpunode's compat tables pick for driver 580.95.05
TOO_NEW = "nvidia/cuda:13.1.1-base-ubuntu24.04"


@pytest.fixture(scope="module")
def mirror(tmp_path_factory: pytest.TempPathFactory, nodesim_available: bool) -> Iterator[Mirror]:  # noqa: F811
    served = Mirror(tmp_path_factory.mktemp("www"), (V,))
    yield served
    served.httpd.shutdown()
    served.httpd.server_close()


@pytest.fixture(scope="module")
def t4(mirror: Mirror) -> Iterator[SimNode]:
    node = finish(mirror, "ubuntu-22.04-t4")
    yield node
    node.stop()


def run_verify(node: SimNode, *args: str) -> tuple[int, dict]:
    result = cli.invoke(app, ["verify", *node.cli_args(), "--json", *args])
    return result.exit_code, json.loads(result.stdout)


def by_name(data: dict) -> dict[str, dict]:
    return {t["name"]: t for t in data["tests"]}


def test_finished_node_passes_with_every_engine(t4):
    code, data = run_verify(t4)
    assert code == 0, data
    assert data["image"] == IMAGE and data["image_source"] == "compat" and data["driver"] == V
    assert [g["uuid"] for g in data["host_gpus"]] == t4.gpu_uuids
    tests = by_name(data)
    assert {n: t["status"] for n, t in tests.items()} == {
        "docker --gpus all": "pass", "docker --gpus device=0": "pass", "docker --runtime=nvidia": "pass",
        "ctr --gpus 0": "pass", "ctr --runc-binary (containerd's nvidia runtime)": "pass"}
    assert all(t["seen_gpus"] == t4.gpu_uuids for t in tests.values())
    runs = t4.calls("docker") + t4.calls("ctr")
    assert ["docker", "run", "--rm", "--gpus", "all", IMAGE, "nvidia-smi", "-L"] in runs
    assert ["ctr", "image", "pull", f"docker.io/{IMAGE}"] in runs
    human = cli.invoke(app, ["verify", *t4.cli_args()])
    assert human.exit_code == 0 and "summary: 5 pass, 0 fail, 0 skip" in human.stdout


def test_driver_too_old_for_the_image_fails_explained(t4):
    code, data = run_verify(t4, "--image", TOO_NEW, "--engine", "docker")
    assert code == 1
    assert data["image_check"]["status"] == "blocked"
    assert data["notes"][0].startswith(f"expected to fail: driver {V} runs CUDA up to 13.0 natively")
    for test in data["tests"]:
        assert test["status"] == "fail" and test["findings"][0]["id"] == "cuda.requirement"
        assert "unsatisfied condition: cuda>=13.1" in test["output"]
        assert test["fix"].startswith(runnable(fixes.gpunode("install"), t4.cli_args()) + " --driver ")
        assert test["fix"].endswith(runnable(fixes.gpunode("verify", image=IMAGE), t4.cli_args()))


def test_runtime_not_configured_fails_explained_then_passes_once_wired_in(mirror):
    """The toolkit is installed but docker was started before it and never restarted (the runtime step skipped):
    moby has no `nvidia` device driver, so --gpus fails. `gpunode install --only runtime` fixes it."""
    node = finish_without_runtime(mirror)
    try:
        code, data = run_verify(node)
        assert code == 1
        tests = by_name(data)
        failed = tests["docker --gpus all"]
        assert failed["status"] == "fail" and failed["findings"][0]["id"] == "docker.no-gpu-driver"
        assert 'could not select device driver "" with capabilities: [[gpu]]' in failed["output"]
        assert "gpunode install" in failed["fix"] and "--only runtime" in failed["fix"]
        assert "docker --runtime=nvidia" not in tests  # not configured, so not tried; said in the notes
        assert any("daemon.json has no nvidia runtime" in note for note in data["notes"])
        assert tests["containerd"]["status"] == "skip"  # docker's backend, not configured

        wired = invoke(mirror, "install", *node.cli_args(), "--only", "runtime")
        assert wired.exit_code == 0, wired.output
        code, data = run_verify(node)
        assert code == 0 and {t["status"] for t in data["tests"] if t["name"].startswith("docker")} == {"pass"}
    finally:
        node.stop()


def finish_without_runtime(mirror: Mirror) -> SimNode:
    node = SimNode(get_profile("ubuntu-22.04-t4", nouveau_loaded=False)).start()
    try:
        result = invoke(mirror, "install", *node.cli_args(), "--driver", V, "--skip", "runtime")
        assert result.exit_code == 0, result.output
    except BaseException:
        node.stop()
        raise
    return node


def test_verify_changes_no_configuration(t4):
    before = {p: t4.read(p) for p in ("/etc/docker/daemon.json", "/etc/containerd/config.toml",
                                      "/etc/containerd/conf.d/99-nvidia.toml")}
    t4.clear_calls()
    run_verify(t4, "--engine", "docker")
    assert {p: t4.read(p) for p in before} == before
    changing = [c for c in t4.calls() if changes_systemd(c)
                or (c[0] == "nvidia-ctk" and "configure" in c) or c[0] in ("modprobe", "rmmod", "reboot")
                or (c[0] in ("apt-get", "dnf") and "install" in c)]
    assert changing == []
    # the probe's read-only `docker info` (the runtimes the daemon loaded) and `docker ps` (containers holding the
    # GPU, gpunode/facts/holders.py) aside
    assert [c[1] for c in t4.calls("docker") if c[1] not in ("info", "ps")] == ["--version", "run", "run", "run"]
