"""data/explain_catalogue.csv: what each component can print, with its source. Every catalogued message, rendered
with sample values (and as people paste it: wrapped in a fence on the same line, quoted, in a log line), must give
its finding first; a message the rules do not recognise fails here."""

from __future__ import annotations

import json
import re

import pytest

from gpunode.compat import DataError
from gpunode.explain import engine, explain
from gpunode.explain.tables import Message, catalogue

MESSAGES = catalogue()


def test_the_catalogue_covers_every_emitter_of_the_issue():
    emitters = " ".join(m.emitter for m in MESSAGES).lower()
    for name in ("nvidia-container-cli", "container-device-interface", "nvml", "cuda runtime", "cuda driver api",
                 "pytorch", "tensorflow", "jax", "k8s device plugin", "kube-scheduler", "selinux", "apparmor",
                 "kernel nvrm", "kernel pci core", "vfio", "nvidia-installer", "docker", "containerd", "kubelet",
                 "apptainer", "enroot", "cgroup v2", "any cuda program", "gpu operator validator", "nvidia-modprobe",
                 "nvidia-persistenced", "cri-o", "podman", "crun"):
        assert name in emitters, name
    assert len(MESSAGES) >= 60 and all(m.source for m in MESSAGES)


@pytest.fixture
def rows_only(monkeypatch):
    """The detector rows alone: the generic layer reads the catalogue itself, so it must not pass this test for them."""
    monkeypatch.setattr(engine, "GENERIC", False)


@pytest.mark.parametrize("message", MESSAGES, ids=[f"{m.line}-{m.id}" for m in MESSAGES])
def test_every_catalogued_message_is_recognised(message, rows_only):
    text = message.render()
    assert [f.id for f in explain(text)][:1] == [message.id], text
    assert [f.id for f in explain(f"```{text}```")][:1] == [message.id]  # fenced on the same line
    assert [f.id for f in explain(f"> {text}")][:1] == [message.id]  # quoted


def test_a_catalogue_row_naming_an_unknown_finding_is_refused(tmp_path):
    (tmp_path / "explain_catalogue.csv").write_text(
        "emitter,message,id,source\nsome tool,some message,nope.unknown,some source document\n", encoding="utf-8")
    with pytest.raises(DataError, match="line 2: id nope.unknown"):
        catalogue(tmp_path)


def test_format_verbs_are_rendered_with_sample_values():
    message = Message("x", 'unit %s pid %d name %q err %v pid %"PRId32" mode %o %-8s 100%% {pci}', "x.y", "s", 1)
    text = message.render()
    assert "%" not in text.replace("100%", "") and "{" not in text
    assert text == 'unit nvidia pid 1 name "nvidia" err nvidia pid 1 mode 20600 nvidia   100% 0000:3b:00.0'.replace(
        "nvidia   ", "nvidia ")


def test_a_placeholder_without_a_sample_value_is_refused(tmp_path):
    (tmp_path / "explain_catalogue.csv").write_text(
        "emitter,message,id,source\nsome tool,failed for {nosuchvalue},driver.not-loaded,some source document\n",
        encoding="utf-8")
    with pytest.raises(DataError, match=r"line 2: \{nosuchvalue\} has no sample value"):
        catalogue(tmp_path)


# Repositories fetched for the catalogue: a row citing one names the commit, the file and the line.
FETCHED = ("NVIDIA/libnvidia-container", "NVIDIA/nvidia-container-toolkit", "NVIDIA/k8s-device-plugin",
           "NVIDIA/gpu-operator", "NVIDIA/nvidia-modprobe", "NVIDIA/nvidia-persistenced", "NVIDIA/nvidia-installer",
           "NVIDIA/open-gpu-kernel-modules", "NVIDIA/enroot", "NVIDIA/nvidia-docker", "moby/moby", "containers/crun",
           "cri-o/cri-o", "dell/dkms", "apptainer/apptainer")


@pytest.mark.parametrize("message", MESSAGES, ids=[f"{m.line}-{m.id}" for m in MESSAGES])
def test_a_source_in_a_fetched_repository_names_commit_file_and_line(message):
    cited = [repo for repo in FETCHED if f"{repo}@" in message.source or f"{repo} " in message.source]
    if cited:
        assert re.search(r"[\w-]+/[\w.-]+@[0-9a-f]{7,40} [\w./-]+:\d+", message.source), message.source
    emitter = message.emitter.lower()
    if "nvml" in emitter or emitter.startswith(("cuda runtime", "cuda driver api")):
        assert re.search(r"\b(?:nvml|driver_types|cuda)\.h:\d+|return\.go:\d+", message.source), message.source


# What a GPU node's NVML can answer (nvmlErrorString's table in libnvidia-ml, nvml.h's codes): every code a node
# can fail with is catalogued, in the library's words and in go-nvml's names.
NODE_NVML_CODES = {
    "Insufficient Permissions": "NO_PERMISSION", "Insufficient External Power": "INSUFFICIENT_POWER",
    "Driver Not Loaded": "DRIVER_NOT_LOADED", "Interrupt Request Issue": "IRQ_ISSUE",
    "NVML Shared Library Not Found": "LIBRARY_NOT_FOUND", "Function Not Found": "FUNCTION_NOT_FOUND",
    "Corrupted infoROM": "CORRUPTED_INFOROM", "GPU is lost": "GPU_IS_LOST", "GPU requires reset": "RESET_REQUIRED",
    "GPU access blocked by the operating system": "OPERATING_SYSTEM",
    "Driver/library version mismatch": "LIB_RM_VERSION_MISMATCH", "Unknown Error": "UNKNOWN"}
# libnvidia-container's stages (src/cli/configure.c): each one's error is catalogued.
CLI_STAGES = ("input", "initialization", "permission", "container", "detection", "device", "mig-config", "mig-monitor",
              "requirement", "mount", "ldcache")


def test_every_nvml_code_and_every_nvidia_container_cli_stage_is_catalogued():
    texts = [m.template.lower() for m in MESSAGES]
    for words, code in NODE_NVML_CODES.items():
        assert any(words.lower() in t for t in texts), words
        assert any(f"error_{code.lower()}" in t for t in texts), code
    for stage in CLI_STAGES:
        assert any(t.startswith(f"nvidia-container-cli: {stage} error: ") for t in texts), stage


@pytest.mark.parametrize("stage", CLI_STAGES)
def test_any_nvidia_container_cli_stage_error_is_recognised_with_its_detail(stage):
    text = f"nvidia-container-cli: {stage} error: frobnicate failed: no such widget: unknown"
    finding = explain(text)[0]
    assert finding.id == "toolkit.cli-failed"
    assert stage in finding.title and "frobnicate failed: no such widget" in finding.cause


# The CUDA errors a node (not the program) can cause, by their driver_types.h names (nvidia-cuda-runtime-cu12
# 12.9.79): each is catalogued with its header line.
NODE_CUDA_ERRORS = ("cudaErrorMemoryAllocation", "cudaErrorInitializationError", "cudaErrorStubLibrary",
                    "cudaErrorInsufficientDriver", "cudaErrorCallRequiresNewerDriver", "cudaErrorDevicesUnavailable",
                    "cudaErrorNoDevice", "cudaErrorInvalidDevice", "cudaErrorNoKernelImageForDevice",
                    "cudaErrorECCUncorrectable", "cudaErrorNvlinkUncorrectable", "cudaErrorUnsupportedPtxVersion",
                    "cudaErrorIllegalAddress", "cudaErrorLaunchFailure", "cudaErrorSystemNotReady",
                    "cudaErrorSystemDriverMismatch", "cudaErrorCompatNotSupportedOnDevice",
                    "cudaErrorMpsConnectionFailed", "cudaErrorUnknown")
# The GPU Operator validator's stages (cmd/nvidia-validator/main.go@a22dbf6 'error validating <stage>').
OPERATOR_STAGES = ("driver installation", "nvidia-fs driver installation", "gdrcopy driver installation",
                   "nvidia-peermem driver installation", "toolkit installation", "cuda workload",
                   "plugin installation", "MOFED driver installation", "vfio-pci driver installation",
                   "vGPU Manager installation", "vGPU devices", "CC Manager installation")


def test_every_node_cuda_error_and_every_operator_stage_is_catalogued():
    for name in NODE_CUDA_ERRORS:
        assert any(re.search(rf"driver_types\.h:\d+ {name} = \d+", m.source) for m in MESSAGES), name
    for stage in OPERATOR_STAGES:
        assert any(f"error validating {stage}: " in m.template for m in MESSAGES), stage


# The same message as the log collectors and tools people copy from print it.
PASTE_FORMS = {
    "klog": lambda m: f"E1124 10:11:12.123456    4242 kuberuntime_manager.go:1256] {m}",
    "journald": lambda m: f"Nov 24 10:11:12 node1 kubelet[123]: {m}",
    "compose": lambda m: f"app-1  | {m}",
    "docker json-file / CRI JSON": lambda m: json.dumps({"log": m + "\n", "stream": "stderr",
                                                         "time": "2024-01-01T00:00:00Z"}),
    "journalctl -o json": lambda m: json.dumps({"MESSAGE": m, "_PID": "12", "SYSLOG_IDENTIFIER": "containerd"}),
    "logfmt": lambda m: 'time="2024-01-01T00:00:00Z" level=error msg="' + m.replace('"', '\\"') + '"',
    "kubectl describe": lambda m: f"  Warning  Failed     3m (x4 over 5m)  kubelet            {m}",
    "ANSI and CRLF": lambda m: f"\x1b[31m{m}\x1b[0m\r\n",
}


@pytest.mark.parametrize("form", PASTE_FORMS)
def test_every_catalogued_message_is_recognised_in_every_log_form(form, rows_only):
    wrap = PASTE_FORMS[form]
    missed = [(m.line, m.id) for m in MESSAGES if [f.id for f in explain(wrap(m.render()))][:1] != [m.id]]
    assert missed == []


_UNFILLED = re.compile(r"%\(\w+\)s")


def test_no_finding_for_a_catalogued_message_prints_a_placeholder_it_did_not_fill():
    """A row's texts may name only values its own pattern captures: a fix with '%(pci)s' left in is not runnable."""
    unfilled = set()
    for message in MESSAGES:
        for finding in explain(message.render()):
            for text in (finding.title, finding.cause, finding.fix, *finding.also):
                unfilled.update((finding.id, name) for name in _UNFILLED.findall(text))
    assert unfilled == set()


def test_the_vfio_hint_alone_gives_a_fix_without_a_pci_address_and_beside_the_group_line_the_addressed_one():
    hint = "Please ensure all devices within the iommu_group are bound to their vfio bus driver."
    alone = explain(hint)[0]
    assert alone.id == "virt.iommu-group-not-viable" and "%(" not in alone.fix + alone.title + alone.cause
    both = explain("qemu-system-x86_64: -device vfio-pci,host=0000:01:00.0: vfio 0000:01:00.0: group 1 is not "
                   f"viable\n{hint}")[0]
    assert both.id == "virt.iommu-group-not-viable" and "/sys/bus/pci/devices/0000:01:00.0/iommu_group" in both.fix
