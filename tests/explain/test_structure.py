"""Generic readings that follow from how the emitters build their messages (explain10), each with twins that must
not be read that way:

- NVML: a call of the library followed by nvmlErrorString's words ("nvmlDeviceGetHandleByIndex(): Unknown Error")
  is that return code, for every code a node can cause; codes that are a program's own mistake give nothing;
- CUDA: the node-caused codes added from this machine's CUDA 13.0 headers, by name, number and string;
- a catalogued message cut at the end of a line (mid-word, or with an ellipsis) is read as that message when every
  catalogued message it can begin has the same cause;
- Markdown and chat pastes: task lists, headings, whole-line emphasis, a fence closed on the message's line.
"""

from __future__ import annotations

import pytest

from gpunode.explain import engine, explain
from gpunode.explain.generic import load
from gpunode.explain.tables import catalogue


def _ids(text: str) -> list[str]:
    return [f.id for f in explain(text)]


# --- NVML: <nvmlXxx()>: <nvmlErrorString> ---------------------------------------------------------------------

# nvml.h's return codes (NVIDIA/go-nvml@2f9e261 pkg/nvml/nvml.h:1306-1336). Each is either read by the codes table
# (data/explain_error_codes.csv) or is a program's own mistake or a feature the GPU lacks, which a node cannot fix.
NVML_CODES = {1: "UNINITIALIZED", 2: "INVALID_ARGUMENT", 3: "NOT_SUPPORTED", 4: "NO_PERMISSION",
              5: "ALREADY_INITIALIZED", 6: "NOT_FOUND", 7: "INSUFFICIENT_SIZE", 8: "INSUFFICIENT_POWER",
              9: "DRIVER_NOT_LOADED", 10: "TIMEOUT", 11: "IRQ_ISSUE", 12: "LIBRARY_NOT_FOUND",
              13: "FUNCTION_NOT_FOUND", 14: "CORRUPTED_INFOROM", 15: "GPU_IS_LOST", 16: "RESET_REQUIRED",
              17: "OPERATING_SYSTEM", 18: "LIB_RM_VERSION_MISMATCH", 19: "IN_USE", 20: "MEMORY", 21: "NO_DATA",
              22: "VGPU_ECC_NOT_SUPPORTED", 23: "INSUFFICIENT_RESOURCES", 24: "FREQ_NOT_SUPPORTED",
              25: "ARGUMENT_VERSION_MISMATCH", 26: "DEPRECATED", 27: "NOT_READY", 28: "GPU_NOT_FOUND",
              29: "INVALID_STATE", 30: "RESET_TYPE_NOT_SUPPORTED", 999: "UNKNOWN"}
# a caller's mistake (1, 2, 5, 7, 10, 21, 26), a feature or query this GPU or driver does not have (3, 6, 22, 24,
# 30), host memory (20), or a state whose cause the code alone does not settle (27, 29)
NVML_NOT_THE_NODES = {1, 2, 3, 5, 6, 7, 10, 20, 21, 22, 24, 26, 27, 29, 30}
NVML_TABLE = {c.code: c for c in load()[2] if c.family == "nvml"}


def test_every_nvml_return_code_is_read_or_is_not_the_nodes():
    assert set(NVML_TABLE) | NVML_NOT_THE_NODES == set(NVML_CODES)
    assert not set(NVML_TABLE) & NVML_NOT_THE_NODES
    for code, name in NVML_CODES.items():
        if code in NVML_TABLE:
            assert f"NVML_ERROR_{name}" in NVML_TABLE[code].names, code


@pytest.mark.parametrize("code", sorted(c for c in NVML_TABLE if NVML_TABLE[c].message or c == 999))
@pytest.mark.parametrize("form", ["{call}(): {string}", "{call}() failed: {string}", "{call} returned {string}",
                                  "error: {call}(0, &device) failed with error: {string}"])
def test_an_nvml_call_and_its_error_string_is_that_codes_cause(code: int, form: str):
    entry = NVML_TABLE[code]
    string = entry.message or "Unknown Error"
    text = form.format(call="nvmlDeviceGetHandleByIndex_v2", string=string)
    finding = explain(text)[0]
    assert finding.id == entry.id, text
    if finding.values.get("generic"):
        assert finding.values.get("call") in (None, "nvmlDeviceGetHandleByIndex_v2")


def test_unknown_error_is_nvmls_only_after_an_nvml_call():
    finding = explain("nvmlDeviceGetHandleByIndex(): Unknown Error")[0]
    assert finding.id == "nvml.unknown-error" and finding.values["call"] == "nvmlDeviceGetHandleByIndex"
    assert "nvmlDeviceGetHandleByIndex" in finding.cause
    # the twins: the same words alone, after another library's call, or CUDA's own unknown error
    assert explain("Unknown Error") == []
    assert explain("ioctl(): Unknown Error") == []
    assert "nvml.unknown-error" not in _ids("RuntimeError: CUDA error: unknown error")
    assert "nvml.unknown-error" not in _ids("cudaMalloc(): Unknown Error")


@pytest.mark.parametrize("string", ["Not Supported", "Invalid Argument", "Uninitialized", "Insufficient Size",
                                    "No data", "Timeout"])
def test_an_nvml_call_answering_a_programs_mistake_or_a_missing_feature_is_nothing(string: str):
    assert explain(f"nvmlDeviceGetPowerUsage(): {string}") == []


def test_nvml_words_that_are_not_an_nvml_answer_are_not_its_codes():
    assert "mig.insufficient-resources" not in _ids("kubelet: 0/3 nodes are available: Insufficient Resources.")
    assert "nvml.function-not-found" not in _ids("pip: argument version mismatch in setup.cfg")


# --- the codes added from nvml.h and the CUDA 13.0 headers -------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("nvmlDeviceCreateGpuInstance failed: Insufficient Resources", "mig.insufficient-resources"),
    ("pynvml.NVMLError_InUse: In use by another client", "mig.reset-blocked"),
    ("failed to get device memory info: ERROR_ARGUMENT_VERSION_MISMATCH", "nvml.function-not-found"),
    ("nvmlInit_v2: NVML_ERROR_GPU_NOT_FOUND", "smi.no-devices"),
    ("RuntimeError: CUDA error: the launch timed out and was terminated", "cuda.launch-timeout"),
    ("CUDA_ERROR_LAUNCH_TIMEOUT", "cuda.launch-timeout"),
    ("kernel.cu(42): CUDA error 702", "cuda.launch-timeout"),
    ("CUDA error: device doesn't have valid Grid license", "vgpu.unlicensed"),
    ("cuInit returned CUDA_ERROR_DEVICE_NOT_LICENSED", "vgpu.unlicensed"),
    ("cudaSetDevice failed: exclusive-thread device already in use by a different thread", "cuda.devices-busy"),
    ("cuCtxCreate: CUDA_ERROR_CONTEXT_ALREADY_IN_USE", "cuda.devices-busy"),
    ("RuntimeError: CUDA error: PTX JIT compiler library not found", "cuda.ptxjit-missing"),
    ("cuModuleLoadData failed with CUDA_ERROR_JIT_COMPILER_NOT_FOUND", "cuda.ptxjit-missing"),
    ("CUDA error 221 while loading the module", "cuda.ptxjit-missing"),
])
def test_nvml_and_cuda_codes_added_from_their_headers_name_their_cause(text: str, expected: str):
    assert _ids(text)[:1] == [expected]


@pytest.mark.parametrize("text", ["cuInit failed: unknown error", "cudaGetDeviceCount(): unknown error",
                                  "Error: cudaSetDevice(0) failed: unknown error",
                                  "cuDeviceGetCount() returned unknown error"])
def test_cudas_unknown_error_from_a_call_that_starts_cuda_is_the_nodes_start_up_failure(text: str):
    finding = explain(text)[0]
    assert finding.id == "cuda.unknown-error" and finding.values["call"] in text


def test_cudas_unknown_error_from_a_running_programs_call_or_alone_is_not_read_by_its_call():
    for text in ("cudaMemcpy failed: unknown error", "cudaMalloc(): unknown error", "unknown error",
                 "my_cuInit_wrapper: unknown error"):
        assert "cuda.unknown-error" not in _ids(text), text


def test_a_timeout_a_702_or_a_221_that_is_not_cudas_is_not_its_code():
    for text in ("ssh: connect to host gpu1 port 22: Connection timed out",
                 "the launch of the job timed out after 600 s", "HTTP error 702 from the proxy"):
        assert "cuda.launch-timeout" not in _ids(text), text
    # nor another compiler's JIT, or a 221 that is not CUDA's
    for text in ("numba: LLVM JIT compiler library not found", "HTTP/1.1 221 closing connection"):
        assert "cuda.ptxjit-missing" not in _ids(text), text


# --- a catalogued message cut at the end of a line ---------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("Failed to initialize NVML: Driver/library version misma", "nvml.mismatch"),
    ("NVIDIA-SMI has failed because it couldn't communicate with the NVI", "smi.no-driver"),
    ('docker: Error response from daemon: could not select device driver "" with capab', "docker.no-gpu-driver"),
    ("E0101 00:00:00.000000 1 factory.go:99] Failed to initialize NVML: ERROR_DRIVER_NOT_LOA", "driver.not-loaded"),
    ("NVIDIA-SMI has failed because it couldn't...", "smi.no-driver"),
    ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA\u2026", "smi.no-driver"),
])
def test_a_message_cut_at_the_end_of_a_line_is_read_as_the_message_it_begins(text: str, expected: str):
    finding = explain(text)[0]
    assert finding.id == expected
    if finding.values.get("generic"):
        assert finding.values["generic"] == "cut-message" and "cut short" in finding.title


def test_a_cut_that_is_too_short_complete_or_followed_by_other_words_is_not_read_as_cut():
    assert explain("NVIDIA-SMI has failed because") == []  # four fixed words: too little to go on
    assert explain("NVIDIA-SMI has failed because it") == []  # ends at a word's end: maybe a shorter message
    assert "smi.no-driver" not in _ids("NVIDIA-SMI has failed because it was run in a chroot without /proc")
    assert "smi.no-driver" not in _ids("NVIDIA-SMI has failed because it couldn't communicate with the NVI\nfine")[1:]


def test_a_cut_that_begins_messages_of_different_causes_is_not_read():
    # nvidia-container-cli's initialization stage begins messages of many causes (driver not loaded, permissions,
    # version mismatch, ...): cut before the cause, it names none of them
    ids = _ids("nvidia-container-cli: initialization error: nvml error: dri")
    assert not {"driver.not-loaded", "nvml.mismatch"} & set(ids[:1]) or ids[:1] == ["toolkit.cli-failed"]
    assert not any(f.values.get("generic") == "cut-message"
                   for f in explain("nvidia-container-cli: initialization error: nvml error: dri"))


def test_every_catalogued_message_cut_inside_its_last_word_is_read_when_it_is_the_only_one_it_begins(monkeypatch):
    """Each catalogued message, cut two letters before its end (inside its last word of four letters or more), must
    give its finding or, when the cut text also begins another catalogued message of another cause, not a cut
    finding of a wrong cause."""
    from gpunode.explain.normalise import normalise

    messages = catalogue()
    wrong = []
    for message in messages:
        text = normalise(message.render()).split("\n")[0]
        last = text.rstrip(" .!)'\"").split()[-1] if text.strip() else ""
        if len(text.split()) < 7 or len(last) < 4 or not last[-1].isalnum() or not last[-2].isalnum():
            continue
        cut = text.rstrip(" .!)'\"")[:-2]
        findings = explain(cut)
        cut_findings = [f for f in findings if f.values.get("generic") == "cut-message"]
        if cut_findings and cut_findings[0].id != message.id:
            others = {m.id for m in messages if normalise(m.render()).startswith(cut)}
            if cut_findings[0].id not in others:
                wrong.append((message.line, cut, cut_findings[0].id))
    assert wrong == []


# --- Markdown and chat pastes -------------------------------------------------------------------------------------

FORMS = {
    "task list item": lambda m: f"- [ ] {m}",
    "checked task": lambda m: f"* [x] {m}",
    "heading": lambda m: f"### {m}",
    "whole-line italic": lambda m: f"_{m}_",
    "whole-line emphasis": lambda m: f"*{m}*",
    "tilde fence on the line": lambda m: f"~~~{m}~~~",
    "fence opened and closed on the line, with a quote": lambda m: f"> ```{m}```",
}


@pytest.mark.parametrize("form", FORMS)
def test_every_catalogued_message_is_recognised_in_markdown_forms(form: str, monkeypatch):
    monkeypatch.setattr(engine, "GENERIC", False)
    wrap = FORMS[form]
    # two rows are anchored at the line's start on purpose ("No devices were found", the operator's "toolkit is not
    # ready"); a Markdown mark before them is removed, so they must be read too
    missed = [(m.line, m.id) for m in catalogue() if _ids(wrap(m.render()))[:1] != [m.id]]
    assert missed == []


def test_a_root_prompt_is_not_a_heading_and_a_star_inside_a_line_is_not_emphasis():
    from gpunode.explain.normalise import normalise

    # "# " is a root prompt, not a heading: what follows is a command, and stays one
    assert _ids("# nvidia-smi\nNVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")[:1] \
        == ["smi.no-driver"]
    assert normalise("# nvidia-smi") == "nvidia-smi" and normalise("## nvidia-smi") == "nvidia-smi"
    assert normalise("*/5 * * * * nvidia-smi -pm 1") == "*/5 * * * * nvidia-smi -pm 1"
    assert normalise("_ready is false, see foo_bar") == "_ready is false, see foo_bar"
