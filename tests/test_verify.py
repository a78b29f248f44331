"""`gpunode verify` on fake nodes: which containers run with which engine, how what they print is judged, and how
failures come back explained. The engines are a small fake that answers like the real CLIs (error texts from
tests/fixtures/real/errors)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pytest

from gpunode import verify
from gpunode.errors import UsageError
from gpunode.facts import FULL, gather
from gpunode.facts import containers as c
from gpunode.facts.driver import SmiGpu
from tests.conftest import FIXTURES
from tests.doctor.fakes import H100, V, finished, set_output, uuid
from tests.fakes.connection import FakeConnection, FakeNode

ERRORS = FIXTURES / "errors"
IMAGE = "nvidia/cuda:13.0.2-base-ubuntu24.04"


@dataclass
class Engines:
    """docker, ctr, nerdctl and podman as far as verify sees them: nvidia-smi -L inside, or the engine's error."""

    gpus: int = 1
    driver_cuda: tuple[int, int] = (13, 0)
    hook: bool = True  # docker restarted since the toolkit arrived: the --gpus device driver is registered
    honour_devices: bool = True
    runs: list[list[str]] = field(default_factory=list)

    def attach(self, node: FakeNode) -> Engines:
        for tool in ("docker", "ctr", "nerdctl", "podman"):
            node.handlers[tool] = self.handle
        return self

    def listing(self, indices: list[int]) -> str:
        return "".join(f"GPU {i}: Tesla T4 (UUID: {uuid(i)})\n" for i in indices)

    def handle(self, node: FakeNode, argv: list[str], stdin: bytes) -> tuple[int, str, str]:
        self.runs.append(argv)
        tool = argv[0]
        if tool == "ctr" and argv[1:3] == ["image", "pull"]:
            return 0, f"{argv[3]}: resolved\ndone: 1.0s\n", ""
        image = next(a for a in argv if a.startswith(("nvidia/", "docker.io/", "nvcr.io/")))
        wanted: list[int] = []
        if "--gpus" in argv:
            value = argv[argv.index("--gpus") + 1]
            if tool == "docker" and not self.hook:
                return 125, "", (ERRORS / "docker_could-not-select-device-driver_empty-name.txt").read_text()
            wanted = list(range(self.gpus)) if value == "all" else [int(value.removeprefix("device="))]
        if "--runtime=nvidia" in argv:
            data = c.parse_daemon_json(node.files.get(c.DOCKER_CONFIG))
            if "nvidia" not in data.get("runtimes", {}):
                return 125, "", "docker: Error response from daemon: unknown or invalid runtime name: nvidia.\n"
            wanted = list(range(self.gpus))
        if "--runc-binary" in argv or "nvidia.com/gpu=all" in argv:
            wanted = list(range(self.gpus))
        if not self.honour_devices:
            wanted = list(range(self.gpus))
        tag = image.rsplit(":", 1)[-1]
        found = re.search(r"(\d+)\.(\d+)", tag)
        need = (int(found[1]), int(found[2])) if found else (0, 0)
        if need > self.driver_cuda:
            text = (ERRORS / "nvidia-container-cli_requirement-cuda-12.8_legacy-mode_docker-run.txt").read_text()
            return 125, "", text.replace("cuda>=12.8", f"cuda>={need[0]}.{need[1]}")
        if "cuda-sample" in image:
            return 0, "[Vector addition of 50000 elements]\n...\nTest PASSED\nDone\n", ""
        return 0, self.listing(wanted), ""


def node_with(engines: Engines | None = None, **kw) -> tuple[FakeNode, Engines]:
    node = finished(**kw)
    return node, (engines or Engines()).attach(node)


def run(node: FakeNode, **kw) -> verify.Report:
    return verify.verify(FakeConnection(node), gather(FakeConnection(node), FULL), **kw)


def names(report: verify.Report) -> dict[str, str]:
    return {o.test.name: o.status for o in report.outcomes}


def test_finished_node_passes_every_engine_with_the_image_chosen_for_the_driver():
    node, engines = node_with()
    report = run(node)
    assert report.image == IMAGE and report.image_source == "compat" and report.driver == V
    assert names(report) == {"docker --gpus all": "pass", "docker --gpus device=0": "pass",
                             "docker --runtime=nvidia": "pass", "ctr --gpus 0": "pass",
                             "ctr --runc-binary (containerd's nvidia runtime)": "pass"}
    assert report.exit_code == 0
    assert ["docker", "run", "--rm", "--gpus", "all", IMAGE, "nvidia-smi", "-L"] in engines.runs
    assert ["ctr", "image", "pull", f"docker.io/{IMAGE}"] in engines.runs
    runc = next(r for r in engines.runs if "--runc-binary" in r)
    assert runc[runc.index("--runc-binary") + 1] == "/usr/bin/nvidia-container-runtime"
    assert report.outcomes[0].reason == "saw GPU 0 (Tesla T4)"


def test_containers_run_as_root_and_only_containers_run():
    node, _ = node_with()
    node.uid = 1000
    node.handlers["true"] = lambda n, argv, stdin: (0, "", "")  # sudo -n works
    files = dict(node.files)
    run(node)
    assert node.files == files
    assert {tuple(call[:1]) for call in node.calls} <= {("sh",), ("id",), ("true",), ("docker",), ("ctr",)}


def test_many_gpus_all_and_one():
    node, _ = node_with(Engines(gpus=8), device=H100, count=8, switches=4)
    report = run(node)
    assert report.exit_code == 0
    assert report.outcomes[0].reason == "saw GPU 0-7 (8 x NVIDIA H100 80GB HBM3)"
    assert report.outcomes[1].seen == (uuid(0),)


def test_a_single_device_request_that_sees_every_gpu_fails():
    node, _ = node_with(Engines(gpus=8, honour_devices=False), device=H100, count=8, switches=4)
    report = run(node)
    single = next(o for o in report.outcomes if o.test.name == "docker --gpus device=0")
    assert single.status == "fail" and "saw 8 GPU(s), expected 1: not requested GPU 1-7" in single.reason
    assert report.exit_code == 1


def test_runtime_not_wired_in_fails_explained():
    node, _ = node_with(Engines(hook=False))
    node.put(c.DOCKER_CONFIG, "{}")
    report = run(node)
    docker_all = report.outcomes[0]
    assert docker_all.status == "fail" and docker_all.findings[0].id == "docker.no-gpu-driver"
    assert docker_all.fix == docker_all.findings[0].fix and "gpunode install" in docker_all.fix
    assert "docker --runtime=nvidia" not in names(report)  # not configured: not tried, but said
    assert any("daemon.json has no nvidia runtime" in n for n in report.notes)
    assert names(report)["ctr --gpus 0"] == "pass" and report.exit_code == 1


def test_driver_too_old_for_the_image_fails_explained_with_a_working_image():
    node, _ = node_with()
    report = run(node, image="nvidia/cuda:13.1.1-base-ubuntu24.04")
    assert report.image_source == "--image" and not report.image_check.ok
    assert report.notes[0].startswith("expected to fail: driver 580.95.05 runs CUDA up to 13.0 natively")
    first = report.outcomes[0]
    assert first.status == "fail" and first.findings[0].id == "cuda.requirement"
    assert "cuda>=13.1" in first.reason
    assert first.fix.endswith(f"gpunode verify --image {IMAGE}")
    assert report.exit_code == 1


def test_cuda_test_runs_the_vectoradd_sample_per_engine():
    node, engines = node_with()
    report = run(node, cuda_test=True)
    assert report.cuda_image == "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0-ubuntu22.04"
    workloads = [o for o in report.outcomes if o.test.kind == "cuda"]
    assert [(o.test.name, o.status) for o in workloads] == [("docker CUDA workload", "pass"),
                                                             ("ctr CUDA workload", "pass")]
    assert ["docker", "run", "--rm", "--gpus", "all", report.cuda_image] in engines.runs


def test_cuda_workload_choice_follows_the_driver():
    assert verify.cuda_workload_for("580.95.05").endswith("vectoradd-cuda12.5.0-ubuntu22.04")
    assert verify.cuda_workload_for("535.129.03").endswith("vectoradd-cuda11.7.1-ubuntu20.04")
    with pytest.raises(Exception, match="no known CUDA workload image"):
        verify.cuda_workload_for("470.256.02")


def test_engine_selection():
    node, engines = node_with()
    node.tools |= {"nerdctl", "podman"}
    report = run(node, engines=["containerd", "podman"])
    assert list(names(report)) == ["nerdctl --gpus all", "ctr --gpus 0",
                                   "ctr --runc-binary (containerd's nvidia runtime)", "podman CDI nvidia.com/gpu=all"]
    podman = next(r for r in engines.runs if r[0] == "podman")
    assert podman == ["podman", "run", "--rm", "--device", "nvidia.com/gpu=all", "--security-opt=label=disable",
                      IMAGE, "nvidia-smi", "-L"]


def test_docker_private_containerd_is_left_out_unless_asked():
    node, _ = node_with()
    node.files.pop(c.CONTAINERD_DROPIN)
    node.put(c.CONTAINERD_CONFIG, 'disabled_plugins = ["cri"]\n')
    report = run(node)
    skipped = [o for o in report.outcomes if o.status == "skip"]
    assert [o.test.engine for o in skipped] == ["containerd"] and "serves only docker" in skipped[0].reason
    assert "ctr --gpus 0" not in names(report) and report.exit_code == 0
    assert "ctr --gpus 0" in names(run(node, engines=["containerd"]))


def test_an_engine_asked_for_but_missing_fails():
    node, _ = node_with()
    report = run(node, engines=["podman"])
    assert [(o.test.name, o.status) for o in report.outcomes] == [("podman", "fail")]
    assert report.exit_code == 1


def test_no_driver_or_no_gpu_stops_before_any_container():
    node, engines = node_with()
    node.nvidia_version = None
    node.modules.discard("nvidia")
    report = run(node)
    assert report.error[0].startswith("the NVIDIA driver is not loaded") and engines.runs == [] and report.exit_code == 1
    assert run(FakeNode()).error[0] == "no NVIDIA GPU was found on the node"


def test_nvidia_smi_failing_on_the_host_is_explained():
    node, engines = node_with()
    set_output(node, "doctor_gpus", "", 0)
    set_output(node, "driver_smi", "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: "
                                   "580.105", 18)
    report = run(node)
    assert report.error[0].startswith("nvidia-smi does not work on the host:") and engines.runs == []
    assert "reboot" in (report.error[1] or "")


def test_usage_errors():
    node, _ = node_with()
    facts = gather(FakeConnection(node), FULL)
    with pytest.raises(UsageError):
        verify.prepare("n", facts, engines=["lxc"])
    with pytest.raises(UsageError):
        verify.prepare("n", facts, image="nvidia/cuda")  # nvidia/cuda has no latest tag


@pytest.mark.parametrize("image, ref", [("nvidia/cuda:12.4.1-base-ubuntu22.04", "docker.io/nvidia/cuda:12.4.1-base-ubuntu22.04"),
                                        ("ubuntu:22.04", "docker.io/library/ubuntu:22.04"),
                                        ("nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
                                         "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04"),
                                        ("localhost:5000/cuda:1", "localhost:5000/cuda:1")])
def test_qualified_references_for_ctr(image, ref):
    assert verify.qualified(image) == ref


def test_judge():
    host = (SmiGpu(0, "0000:18:00.0", "Tesla T4", uuid=uuid(0)), SmiGpu(1, "0000:28:00.0", "Tesla T4", uuid=uuid(1)))
    test = verify.Test("docker", "t", ("docker",), (uuid(0), uuid(1)))
    listing = "".join(f"GPU {i}: Tesla T4 (UUID: {uuid(i)})\n" for i in range(2))
    assert verify.judge(test, 0, listing, "", host).status == "pass"
    missing = verify.judge(test, 0, listing.splitlines()[0] + "\n", "", host)
    assert missing.status == "fail" and "missing GPU 1 (Tesla T4)" in missing.reason
    empty = verify.judge(test, 0, "", "", host)
    assert empty.status == "fail" and "listed no GPU" in empty.reason
    load = (ERRORS / "nvidia-container-cli_load-library-failed_libnvidia-ml.so.1.txt").read_text()
    failed = verify.judge(test, 1, "", load, host)
    assert failed.status == "fail" and failed.findings and failed.findings[0].id == "lib.nvml-missing"
    unknown = verify.judge(test, 3, "", "something else broke", host)
    assert unknown.reason == "the container failed (exit 3): something else broke"


def test_report_json_shape():
    node, _ = node_with()
    data = run(node).to_dict(1)
    assert set(data) == {"schema_version", "gpunode_version", "host", "node", "driver", "image", "image_source",
                         "image_check", "cuda_image", "host_gpus", "tests", "summary", "notes", "exit_code", "error"}
    assert data["host_gpus"] == [{"index": 0, "uuid": uuid(0), "name": "Tesla T4", "pci": "0000:18:00.0"}]
    assert set(data["tests"][0]) == {"engine", "name", "kind", "command", "status", "reason", "fix", "exit_code",
                                     "expected_gpus", "seen_gpus", "findings", "output"}
    assert data["summary"] == {"pass": 5, "fail": 0, "skip": 0} and data["error"] is None


@pytest.mark.parametrize("file, cause", [("cuda-devices_with-libcuda1_chroot.txt", "cuda.no-device"),
                                         ("cuda-devices_without-libcuda1_open.txt", "cuda.insufficient-driver")])
def test_a_cuda_workload_failing_at_cudagetdevicecount_comes_back_with_its_cause(file, cause):
    """The real text of a program built with Debian's nvcc 11.8 (tests/realos, nvidia-open image) as a workload's
    output: verify fails it with explain's cause, not "did not report PASSED"."""
    text = (FIXTURES / "debian-nvidia" / file).read_text(encoding="utf-8")
    test = verify.Test("docker", "cuda", ("docker",), kind="cuda")
    outcome = verify.judge(test, 1, text, "", ())
    assert outcome.status == "fail" and outcome.findings and outcome.findings[0].id == cause, outcome
