"""gpunode.explain.generic: lines no detector row was written for are recognised by their error code or by the
component they name and the shape of the error, at lower strength, saying so and quoting the line."""

from __future__ import annotations

import pytest

from gpunode.explain import engine, explain, generic
from gpunode.explain.finding import Doc


def _generic(text: str) -> list:  # type: ignore[type-arg]
    """What the generic layer alone finds (no detector row explained any line)."""
    return [hit[2] for hit in sorted(generic.findings(Doc(text), []), key=lambda h: (-h[0], h[1]))]


def _first(text: str) -> tuple[str, dict[str, object], str, str]:
    findings = _generic(text)
    assert findings, f"nothing recognised in {text!r}"
    return findings[0].id, findings[0].values, findings[0].title, findings[0].cause


@pytest.mark.parametrize(("text", "expected"), [
    # a wrapper that prints only the code, the enum name or the library's string, in words no row was written for
    ("vllm worker: cuda init returned error 803 on rank 3", "cuda.driver-mismatch"),
    ("cupy raised CUDARuntimeError(cudaErrorCompatNotSupportedOnDevice) while warming up", "cuda.compat-unsupported"),
    ("miner: board 2 fan query failed, NVMLError_GpuIsLost", "nvml.gpu-lost"),
    ("dcgm probe gave up: ERROR_OPERATING_SYSTEM", "nvml.os-blocked"),
    ("our launcher died with CUDA code=100 during startup", "cuda.no-device"),
    ("training aborted after a 802 system error from cuda", "fabricmanager.802"),
])
def test_a_cuda_or_nvml_error_code_names_its_cause_in_any_wrapper(text: str, expected: str) -> None:
    finding_id, values, title, cause = _first(text)
    assert finding_id == expected
    assert values["generic"] == "error-code"
    assert "(generic match: error code)" in title and cause.startswith("Generic finding: recognised by its")


def test_a_bare_number_without_cuda_or_nvml_on_its_line_is_no_finding() -> None:
    assert _generic("the web server returned error 803 to the client") == []


@pytest.mark.parametrize(("text", "expected", "subject"), [
    ("helper failed to dlopen libnvidia-container.so.1 at start", "toolkit.libnvidia-container-missing",
     "libnvidia-container.so.1"),
    ("the pre-start hook could not locate nvidia-container-cli in its search path", "docker.toolkit-binary-missing",
     "nvidia-container-cli"),
    ("worker: open /dev/nvidia-uvm: ENOENT", "driver.device-nodes-missing", "/dev/nvidia-uvm"),
    ("NUMA setup: write /sys/devices/system/memory/auto_online_blocks: EACCES", "persistenced.numa-online",
     "/sys/devices/system/memory/auto_online_blocks"),
    ("containerd: toml: cannot load TOML value for plugins", "containerd.config-invalid", "containerd"),
])
def test_a_component_named_beside_a_generic_error_gives_that_components_cause(text: str, expected: str,
                                                                               subject: str) -> None:
    finding = _generic(text)[0]
    assert finding.id == expected
    assert finding.values["subject"] == subject and finding.values["generic"]
    assert finding.title.endswith(f"(generic match: {finding.values['generic']})")
    assert finding.cause.startswith(f"Generic finding: no catalogued message matched this line, but it says that {subject}")
    assert finding.excerpt == text  # the line it used


def test_the_thing_nearest_the_error_words_is_what_the_error_is_about() -> None:
    # the program is named first, but what is missing is the device node next to "no such file"
    finding = _generic("nvidia-container-cli probe: lstat /dev/nvidia3: no such file or directory")[0]
    assert finding.id == "driver.device-nodes-missing"
    assert finding.values["subject"] == "/dev/nvidia3"


def test_a_row_written_for_the_line_wins_and_a_weaker_catch_all_does_not() -> None:
    # the libnvidia-container row knows this message: one finding, the row's own, not a generic one
    text = ("nvidia-container-cli: error while loading shared libraries: libnvidia-container.so.1: cannot open "
            "shared object file: No such file or directory")
    findings = explain(text)
    assert findings[0].id == "toolkit.libnvidia-container-missing"
    assert "generic" not in findings[0].values
    # toolkit.cli-failed is a catch-all for any stage error (strength 36): the cgroup detail on its line decides
    text = ("nvidia-container-cli: mount error: failed to add device rules: write "
            "/sys/fs/cgroup/devices/docker/ab12/devices.allow: permission denied: unknown")
    assert explain(text)[0].id == "toolkit.device-filter-denied"


def test_switching_the_generic_layer_off_leaves_only_the_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    text = "helper failed to dlopen libnvidia-container.so.1 at start"
    assert explain(text)
    monkeypatch.setattr(engine, "GENERIC", False)
    assert explain(text) == []


def test_every_code_and_every_generic_row_is_reachable() -> None:
    classes, subjects, codes = generic.load()
    for code in codes:
        for name in code.names:
            ids = [f.id for f in _generic(f"the wrapper reported {name} and stopped")]
            assert code.id in ids, (code.family, code.code, name, ids)
    assert {s.error_class for s in subjects} <= {c.name for c in classes}
    assert all(s.strength <= 60 for s in subjects)  # generic findings rank below the specific rows


def test_a_catalogued_message_in_other_words_or_with_other_values_is_recognised_and_says_so() -> None:
    from gpunode.explain.tables import catalogue
    coded = {code.id for code in generic.load()[2]}
    message = next(m for m in catalogue() if "%" not in m.template and "{" not in m.template
                   and len(m.template.split()) >= 6 and m.id not in coded and m.id.startswith("persistenced."))
    words = message.template.split()
    reworded = " ".join([*words[:2], "really", *words[2:]])  # one extra word between two of its words
    assert reworded != message.template
    hits = _generic(reworded)
    assert hits and hits[0].id == message.id
    assert hits[0].values["generic"] == "catalogue" and "in other words" in hits[0].title


def test_a_five_word_code_message_with_a_word_left_out_still_names_its_cause() -> None:
    assert _first("paddle: no CUDA-capable is detected")[0] == "cuda.no-device"


@pytest.mark.parametrize("line", [
    "RuntimeError: Found no NVIDIA driver on your system.",
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
    "helper failed to dlopen libcuda.so.1 at start",  # a generic finding too
])
def test_any_driver_unreachable_finding_in_a_container_run_without_a_gpu_is_the_missing_injection(line: str) -> None:
    with_run = explain(f"$ docker run -it myimage python train.py\n{line}")
    assert with_run[0].id == "container.no-gpu-injected"
    assert "docker run -it myimage python train.py" in with_run[0].excerpt and line.split()[0] in with_run[0].excerpt
    assert "command" in with_run[0].values
    asked = explain(f"$ docker run --gpus all -it myimage python train.py\n{line}")
    assert asked[0].id != "container.no-gpu-injected"  # the run asked for a GPU: the message keeps its own cause


def test_the_component_the_paste_shows_decides_between_sibling_causes() -> None:
    line = "libnvidia-ml.so.1: cannot open shared object file: No such file or directory"
    assert explain(line)[0].id == "lib.nvml-missing"  # nothing says where: the message's own cause
    finding = explain(f"$ kubectl logs -n kube-system nvidia-device-plugin-daemonset-x2\n{line}")[0]
    assert finding.id == "kube.device-plugin-no-nvml"
    assert "nvidia-device-plugin" in finding.excerpt and finding.values["component"] == "nvidia-device-plugin"


@pytest.mark.parametrize("text", [
    "single line cuda>=12.2 requirement error (devcontainer)",  # a version, not CUDA error 2
    "The current PCI-E link generation. These may be reduced when the GPU is not in use.",  # nvidia-smi's help
    "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-e78e68c0-4e6a-737e-f9cc-4223fe50aead)",
])
def test_ordinary_text_about_gpus_is_no_generic_finding(text: str) -> None:
    assert _generic(text) == []


def test_a_device_plugin_started_by_a_plain_docker_run_is_the_plugins_case_not_a_container_without_a_gpu() -> None:
    run = "docker run -it -v /var/lib/kubelet/device-plugins:/var/lib/kubelet/device-plugins nvidia/k8s-device-plugin:1.8"
    pod = "nvidia-device-plugin-daemonset-zb8xn   0/1       CrashLoopBackOff   6          9m"
    failure = "2017/11/29 01:54:30 could not load NVML library"
    assert explain(f"{run}\n{failure}")[0].id == "kube.device-plugin-no-nvml"  # the image names the component
    assert explain(f"{pod}\n$ {run}\n{failure}")[0].id == "kube.device-plugin-no-nvml"
    # the same failure in a user's own container started without a GPU stays the missing injection
    assert explain("$ docker run -it nvidia/cuda:12.4.1-base-ubuntu22.04 nvidia-smi\n"
                   "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")[0].id == \
        "container.no-gpu-injected"


@pytest.mark.parametrize(("run", "expected"), [
    ("docker run -it --gpus all nvcr.io/nvidia/pytorch:23.09-py3", "container.shm-too-small"),
    ("docker run -it --gpus all --ipc=host nvcr.io/nvidia/pytorch:23.09-py3", "installer.no-space"),
    ("docker run -it --gpus all --shm-size=16g nvcr.io/nvidia/pytorch:23.09-py3", "installer.no-space"),
    ("", "installer.no-space"),
])
def test_no_space_left_in_a_container_started_without_shm_settings_is_its_shared_memory(run: str, expected: str) -> None:
    text = f"{run}\nOSError: [Errno 28] No space left on device"
    finding = explain(text)[0]
    assert finding.id == expected
    if expected == "container.shm-too-small":
        assert finding.values["instead_of"] == "installer.no-space" and "docker run" in finding.excerpt


_L40S_UNSUPPORTED = ("NVRM: The NVIDIA GPU 0000:05:00.0 (PCI ID: 10de:26b9)\nNVRM: installed in this system is not "
                     "supported by the\nNVRM: NVIDIA 570.86.15 driver release.")


@pytest.mark.parametrize(("text", "expected"), [
    # a decisive NVRM line beside the installer's headline names which driver owns the GPU
    ("ERROR: Unable to load the kernel module 'nvidia.ko'.\n-> Kernel module load error: No such device\n"
     "[  201.910514] NVRM: GPU 0000:01:00.0 is already bound to NovaCore.\n"
     "[  201.913648] NVRM: No NVIDIA devices probed.", "kernel.no-adapter-probed"),
    ("ERROR: Unable to load the kernel module 'nvidia.ko'.\nNVRM: GPU 0000:65:00.0 is already bound to vfio-pci.",
     "kernel.no-adapter-probed"),
    # the headers the GPU Operator's driver container cannot find are its repositories' problem
    ("Installing Linux kernel headers...\nError: Unable to find a match: kernel-headers-4.18.0-240.23.2.el8_3.x86_64 "
     "kernel-devel-4.18.0-240.23.2.el8_3.x86_64", "operator.driver-kernel"),
    ("$ sudo dnf install kernel-devel-5.14.0-427.el9.x86_64\nError: Unable to find a match: "
     "kernel-devel-5.14.0-427.el9.x86_64", "dkms.headers-missing"),
    # the Windows build a WSL paste shows decides whether WSL can reach a GPU at all
    ("Microsoft Windows [Version 10.0.17763.292]\n$ nvidia-smi\nNVIDIA-SMI has failed because it couldn't "
     "communicate with the NVIDIA driver.", "wsl.gpu-unsupported"),
    ("Microsoft Windows [Version 10.0.19045.3570]\n$ nvidia-smi\nNVIDIA-SMI has failed because it couldn't "
     "communicate with the NVIDIA driver.", "smi.no-driver"),
    # a GPU the release supports, "not supported" with a vGPU attached: the vGPU guest driver is needed
    (f"{_L40S_UNSUPPORTED}\nThe VM has an L40S-8Q vGPU profile attached.", "vgpu.wrong-guest-driver"),
    (f"{_L40S_UNSUPPORTED}\nThe worker nodes are virtual machines.", "kernel.gpu-unsupported"),  # a VM alone: no
    (_L40S_UNSUPPORTED.replace("10de:26b9", "10de:0640") + "\nwith a vGPU", "kernel.gpu-unsupported"),  # G96: too old
])
def test_the_decisive_line_wins_over_the_headline(text: str, expected: str) -> None:
    finding = explain(text)[0]
    assert finding.id == expected, [f.id for f in explain(text)]


def test_another_driver_owning_the_gpu_is_named_with_its_address() -> None:
    finding = explain("NVRM: GPU 0000:01:00.0 is already bound to nouveau.")[0]
    assert finding.values["driver"] == "nouveau" and finding.values["pci"] == "0000:01:00.0"
    assert "nouveau" in finding.title and "lspci -nnk -s 0000:01:00.0" in str(finding.fix)


def test_an_apparmor_record_wrapped_over_lines_is_read_as_one() -> None:
    text = ('type=AVC msg=audit(1666461161.036:2784): apparmor="DENIED"\noperation="exec" profile="qtox" '
            'name="/usr/bin/nvidia-modprobe" pid=5150\ncomm="qtox" requested_mask="x" denied_mask="x"')
    finding = explain(text)[0]
    assert finding.id == "apparmor.device-denied" and finding.values["path"] == "/usr/bin/nvidia-modprobe"
    # a denial of something that is not the driver's is no NVIDIA finding
    assert explain('apparmor="DENIED" operation="open" profile="qtox" name="/proc/modules" pid=5139') == []


# Batch 10's classes (issue 26): the line beside the headline that decides, each with a text where it is absent.
_FALLBACK = "nvidia-fallback.service: NVIDIA kernel module missing. Falling back to nouveau."
_NO_DRIVER = "RuntimeError: Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU"
_SMI_MISSING = "/usr/local/bin/exporter: line 55: nvidia-smi: command not found"
_SMI_EXEC = 'exec: "nvidia-smi": executable file not found in $PATH: unknown.'
_CUDA_GDB = "Could not find CUDA Debugger back-end. Please try upgrading/re-installing the GPU driver"
_ERROR_500 = "CUDA error: CUDA driver version is insufficient for CUDA runtime version"


@pytest.mark.parametrize(("text", "expected"), [
    (f"$ mokutil --sb-state\nSecureBoot enabled\n{_FALLBACK}", "secureboot.module-rejected"),
    (_FALLBACK, "kernel.module-missing"),
    (f"$ docker compose --profile gpu up --build\n{_NO_DRIVER}", "container.no-gpu-injected"),
    (_NO_DRIVER, "cuda.no-driver"),
    (f"{_SMI_MISSING}\nafter we deployed it on kubernetes", "container.no-gpu-injected"),
    (_SMI_MISSING, "smi.not-installed"),
    (f"$ kubectl --context=kind-gpus apply -f pod.yaml\n{_SMI_EXEC}", "toolkit.volume-mounts-disabled"),
    (f"$ docker run --rm ubuntu nvidia-smi\n{_SMI_EXEC}", "container.no-gpu-injected"),
    (f"Docker Desktop 4.28.0 on Windows 11\n{_ERROR_500}", "docker.desktop-too-old"),
    (_ERROR_500, "cuda.insufficient-driver"),
    (f"$ apptainer shell --nv cuda.sif\nApptainer> cuda-gdb ./app\n{_CUDA_GDB}", "apptainer.nvliblist-incomplete"),
    (_CUDA_GDB, "cuda.libraries-missing"),
])
def test_the_line_beside_the_headline_decides_the_cause(text: str, expected: str) -> None:
    assert [f.id for f in explain(text)][:1] == [expected], [f.id for f in explain(text)]


def test_empty_driver_libraries_in_an_image_are_the_images_not_wsls() -> None:
    empty = ("/sbin/ldconfig.real: File /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 is empty, not checked.\n"
             "/sbin/ldconfig.real: /usr/lib/wsl/lib/libcuda.so.1 is not a symbolic link")
    finding = explain(empty)[0]
    assert finding.id == "container.driver-files-in-image" and finding.values["library"] == "libnvidia-ml.so.1"
    assert explain(empty.split("\n")[1])[0].id == "wsl.libcuda-not-symlink"  # the WSL warning alone stays harmless
    assert explain("ldconfig: File /usr/lib/libfoo.so.1 is empty, not checked.") == []  # not a driver library


def test_a_device_node_the_container_already_has_is_its_bind_mounted_dev() -> None:
    finding = explain("nvidia-container-cli: mount error: file creation failed: /scratch/enroot/app/dev/nvidia-uvm-tools: "
                      "operation not permitted")[0]
    assert finding.id == "enroot.dev-bind-conflict" and finding.values["path"].endswith("/dev/nvidia-uvm-tools")
    assert "RESTRICT_DEV" in str(finding.fix)


def test_secure_boot_refusing_any_named_module_is_reported_and_the_bare_message_without_a_gpu_is_not() -> None:
    finding = explain("modprobe: ERROR: could not insert 'nvhda': Required key not available")[0]
    assert finding.id == "secureboot.module-rejected" and "nvhda" in finding.title
    assert explain("Key was rejected by service") == []


# --- batch 11 (explain5): each rule with its twin that lacks the decisive line -----------------------------------

def test_a_dockerfile_from_line_shows_the_container_that_got_no_gpu() -> None:
    error = "RUN python -c 'import torch'\nCannot load libcuda.so.1"
    finding = explain("FROM nvidia/cuda:12.2.0-base-ubuntu22.04\n" + error)[0]
    assert finding.id == "container.no-gpu-injected" and finding.values["instead_of"] == "cuda.no-driver"
    assert "FROM nvidia/cuda:12.2.0-base-ubuntu22.04" in finding.excerpt  # it quotes the line it used
    assert explain(error)[0].id == "cuda.no-driver"  # no image in sight: the driver's library is missing on a host
    assert explain("From the log, line 3:\n" + error)[0].id == "cuda.no-driver"  # prose, not a Dockerfile
    asked = "FROM nvidia/cuda:12.2.0-base-ubuntu22.04\n$ docker run --gpus all img\n" + error
    assert explain(asked)[0].id == "cuda.no-driver"  # the GPU was requested: the FROM line decides nothing


def test_file_exists_in_prose_is_not_the_eexist_error() -> None:
    errno = "ln: failed to create symbolic link '/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1': File exists"
    assert explain(errno)[0].id == "container.driver-files-in-image"
    assert explain("The file exists in /usr/local/cuda-11.8/compat/libnvidia-ml.so.1, nothing loads it") == []


@pytest.mark.parametrize("line", [
    "[h264_cuvid @ 0x55d0c3a0e280] Cannot load libnvcuvid.so.1",
    "[hevc_nvenc @ 0x5581] Cannot load libnvidia-encode.so.1",
    "[h264_cuvid @ 0x1ec8780] Failed loading nvcuvid.",
    "Assert on \"lib_handle_\" failed: Failed to load libnvcuvid.so, needed by the VideoReader operator. If you are "
    "running in a Docker container, please refer to https://github.com/NVIDIA/nvidia-docker/wiki/Usage",
    "RuntimeError: LoadNvEncApi : NVENC library file is not found. Please ensure NV driver is installed",
    "./decoder: error while loading shared libraries: libnvcuvid.so.1: cannot open shared object file: No such file",
])
def test_the_drivers_video_codec_libraries_missing_is_the_video_capability_in_a_container(line: str) -> None:
    host = explain(line)[0]  # an emitter's own advice about Docker is no evidence of a container
    assert host.id == "lib.video-codec-missing" and "libnvidia-decode" in host.cause
    run = "$ docker run -d --gpus all -p 8096:8096 jellyfin/jellyfin\n"
    shown = explain(run + line)[0]
    assert shown.id == "container.no-gpu-injected" and "video" in shown.title
    assert "--gpus all" in shown.excerpt and "NVIDIA_DRIVER_CAPABILITIES" in str(shown.fix)
    assert [f.id for f in explain(run + line)].count("lib.video-codec-missing") == 0  # superseded, not repeated
    bare = explain("$ docker run -d -p 8096:8096 jellyfin/jellyfin\n" + line)[0]  # no GPU asked for at all
    assert bare.id == "container.no-gpu-injected"


def test_a_library_that_is_not_the_drivers_video_codec_is_no_video_finding() -> None:
    for text in ("[AVHWDeviceContext @ 0x5] Cannot load libfoo.so.1", "Failed loading libx264 presets",
                 "$ docker run --gpus all img\nCannot load libvdpau_nvidia.so"):
        assert not {"lib.video-codec-missing", "container.no-gpu-injected"} & {f.id for f in explain(text)}, text


@pytest.mark.parametrize(("code", "expected"), [("999", "cuda.unknown-error"), ("3", "cuda.init-error"),
                                               ("100", "cuda.no-device"), ("35", "cuda.insufficient-driver")])
def test_ollamas_init_failure_is_read_by_its_cuda_code_not_as_a_missing_library(code: str, expected: str) -> None:
    line = ('time=2025-08-02T22:42:20.643Z level=INFO source=gpu.go:612 msg="Unable to load cudart library '
            f'/usr/lib/x86_64-linux-gnu/libcuda.so.575.57.08: cuda driver library init failure: {code}"')
    assert [f.id for f in explain(line)][:1] == [expected]
    missing = line.replace(f"cuda driver library init failure: {code}", "cannot open shared object file")
    assert explain(missing)[0].id == "cuda.no-driver"  # without the code the library itself is what failed


def test_nvidia_uvms_hmm_failure_on_kaslr_kernels_names_the_module_option() -> None:
    line = "[64689.125237] nvidia-uvm: uvm_pmm_gpu.c:3176 devmem_alloc_pagemap[pid:92821] request_free_mem_region() err -34"
    finding = explain(line)[0]
    assert finding.id == "uvm.hmm-init-failed" and "uvm_disable_hmm=1" in str(finding.fix)
    assert explain("[    4.1] nvidia-uvm: Loaded the UVM driver, major device number 510.") == []
    assert explain(line.replace("err -34", "err -12")) == []  # another error of the same call is not this issue


def test_a_gpu_major_the_toolkit_cannot_find_is_a_toolkit_or_operator_older_than_the_driver() -> None:
    node = "failed to create device node nvidia-uvm: failed to determine major: invalid device node"
    finding = explain("$ sudo nvidia-ctk system create-device-nodes --control-devices\n" + node)[0]
    assert finding.id == "toolkit.too-old-for-driver" and finding.values["node"] == "nvidia-uvm"
    validator = ("Error: error validating driver installation: error creating symlink creator: failed to create NVIDIA "
                 "device nodes: failed to create device node nvidiactl: failed to determine major: invalid device node")
    ids = [f.id for f in explain(validator)]
    assert ids[0] == "operator.too-old" and "toolkit.too-old-for-driver" not in ids and "v24.3.0" in str(explain(validator)[0].fix)
    # twins without the decisive words: another failure of the same steps keeps its own cause
    assert not {"toolkit.too-old-for-driver", "operator.too-old"} & {f.id for f in explain(
        "failed to create device node nvidiactl: failed to stat /dev/nvidiactl: permission denied")}
    assert [f.id for f in explain("Error: error validating driver installation: driver is not ready: nvidia-smi failed")][:1] \
        == ["operator.driver-not-ready"]


def test_ffmpegs_cuda_hwcontext_that_cannot_load_libcuda_is_the_missing_driver_or_the_container_without_gpu() -> None:
    line = "[AVHWDeviceContext @ 0x562894e1d340] Could not dynamically load CUDA"
    assert explain(line)[0].id == "cuda.no-driver"
    assert explain("$ docker run -d -p 8096:8096 jellyfin/jellyfin\n" + line)[0].id == "container.no-gpu-injected"
    assert explain("[AVHWDeviceContext @ 0x562894e1d340] Could not dynamically load VAAPI") == []


# --- batch 12 (explain6): each rule with its twin that lacks the decisive line -----------------------------------

@pytest.mark.parametrize("line", ["cudaGetDeviceCount returned 35", "I just get a cudaGetDeviceCount return 35 error",
                                  "cuInit returns 35 here"])
def test_a_cuda_call_that_returned_a_code_is_read_by_the_code(line: str) -> None:
    assert [f.id for f in explain(line)][:1] == ["cuda.insufficient-driver"]  # cuda-samples deviceQuery's wording


def test_a_number_after_a_cuda_call_that_is_not_its_return_code_is_nothing() -> None:
    assert explain("cudaGetDeviceCount took 35 ms") == []
    assert explain("the function returned 35 rows") == []  # no CUDA call on the line: a bare number


@pytest.mark.parametrize("text", [
    "slurmd[5421]: fatal: can't stat gres.conf file /dev//nvidia0: No such file or directory",
    "slurmd[5421]: error: Waiting for gres.conf file /dev/nvidia1",
])
def test_slurmd_waiting_for_or_unable_to_stat_a_gres_device_is_the_missing_device_node(text: str) -> None:
    finding = explain(text)[0]
    assert finding.id == "slurm.gres-device-missing" and "nvidia" in finding.values["device"]


def test_both_slurmd_lines_give_one_finding_and_another_device_gives_none() -> None:
    both = ("slurmd[1]: error: Waiting for gres.conf file /dev//nvidia0\n"
            "slurmd[1]: fatal: can't stat gres.conf file /dev//nvidia0: No such file or directory")
    assert [f.id for f in explain(both)] == ["slurm.gres-device-missing"]  # the fatal line stays explained
    assert "slurm.gres-device-missing" not in {f.id for f in explain(
        "slurmd[1]: error: Waiting for gres.conf file /dev/infiniband/uverbs0")}


@pytest.mark.parametrize("line", [
    "Check failed: result == ncclSuccess (1 vs. 0)  unhandled cuda error",
    "_Check_ failed: result == ncclSuccess (1 vs. 0)  unhandled cuda _error_",  # markdown emphasis of a paste
    "RuntimeError: NCCL error in: NCCLUtils.hpp:275, unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
])
def test_nccls_unhandled_cuda_error_is_recognised_behind_any_wrapper(line: str) -> None:
    assert explain(line)[0].id == "nccl.cuda-error"


def test_a_cuda_check_failure_without_nccl_is_not_nccls() -> None:
    ids = {f.id for f in explain("Check failed: error == cudaSuccess (1 vs. 0)  invalid argument")}
    assert "nccl.cuda-error" not in ids
    assert "nccl.cuda-error" not in {f.id for f in explain("RuntimeError: unhandled cuda error in my kernel")}


def test_make_failing_in_dkmss_nvidia_build_directory_is_the_dkms_build_failure_in_any_language() -> None:
    for word in ("Error", "Chyba", "Fehler"):
        line = f"make[2]: *** [/usr/src/kernel-headers-6.12.7_1/Makefile:1937: /var/lib/dkms/nvidia/470.239.06/build] {word} 2"
        finding = explain(line)[0]
        assert finding.id == "dkms.build-failed" and "make.log" in str(finding.fix)
    # twin: the same make failure outside DKMS's NVIDIA build directory is someone else's build
    assert explain("make[2]: *** [/usr/src/linux/Makefile:1937: /home/me/project/build] Error 2") == []
    assert explain("make[1]: *** [Makefile:224: /var/lib/dkms/zfs/2.2.2/build] Error 2") == []


def test_the_make_line_adds_no_second_finding_next_to_dkmss_own_line() -> None:
    text = ("make[1]: *** [Makefile:2024: /var/lib/dkms/nvidia/390.157/build] Error 2\n"
            "Error! Bad return status for module build on kernel: 6.4.1-zen1-1-zen (x86_64)")
    assert [f.id for f in explain(text)] == ["dkms.build-failed"] and "6.4.1-zen1-1-zen" in explain(text)[0].title


STRACE = 'openat(AT_FDCWD, "/usr/share/glvnd/egl_vendor.d/10_nvidia.json", O_RDONLY) = -1 ENOENT (No such file or directory)'


def test_the_drivers_egl_vendor_file_missing_in_a_container_is_the_graphics_capability() -> None:
    finding = explain("$ docker run --gpus all -it sim:latest\n" + STRACE)[0]
    assert finding.id == "container.no-gpu-injected" and "graphics" in str(finding.fix)
    vulkan = "ERROR: /usr/share/vulkan/icd.d/nvidia_icd.json: No such file or directory"
    assert explain(vulkan)[0].id == "container.no-gpu-injected"


def test_under_apptainer_nv_the_missing_egl_vendor_file_is_the_incomplete_bind_list() -> None:
    text = "singularity shell --nv ubuntu24_with_virtualgl.img\nvglrun glxgears\n" + STRACE
    finding = explain(text)[0]
    assert finding.id == "apptainer.nvliblist-incomplete" and finding.values["instead_of"] == "container.no-gpu-injected"
    # twins: without the strace line nothing says which file is missing; without --nv no GPU was asked for
    assert explain("singularity shell --nv ubuntu24_with_virtualgl.img\n[VGL] ERROR: Could not enable OpenGL API") == []
    assert explain("singularity shell ubuntu24_with_virtualgl.img\n" + STRACE)[0].id == "container.no-gpu-injected"
    mesa = STRACE.replace("10_nvidia.json", "50_mesa.json")  # another vendor's file is not the NVIDIA driver's
    assert explain("singularity shell --nv img.sif\n" + mesa) == []


@pytest.mark.parametrize("text", ['The installation always fails with message:\n"unable to locate the kernel source"',
                                  "kernel source tree not found", "Could not find the kernel sources for 6.8.0-31"])
def test_the_kernel_source_reported_missing_in_any_words_is_the_installers_missing_headers(text: str) -> None:
    assert [f.id for f in explain(text)][:1] == ["installer.no-kernel-source"]


def test_a_kernel_source_that_is_found_or_another_missing_thing_is_not_the_missing_headers() -> None:
    for text in ("the kernel source is in /usr/src/linux-headers-6.8.0-31 and the build finds it",
                 "E: Unable to locate package nvidia-driver-999", "unable to locate the kernel module nvidia.ko"):
        assert "installer.no-kernel-source" not in {f.id for f in explain(text)}, text


# --- batch 13 (explain7): each rule with its twin that lacks the decisive line -----------------------------------

@pytest.mark.parametrize(("line", "module", "versions"), [
    ("nvidia-modeset: Version mismatch: nvidia.ko(378.13) nvidia-modeset(375.26)", "nvidia-modeset",
     ("378.13", "375.26")),  # older drivers: the second module without .ko
    ("[ 4.2] nvidia-modeset: Version mismatch: nvidia.ko(410.73) nvidia-modeset.ko(390.87)", "nvidia-modeset",
     ("410.73", "390.87")),
    ("[drm:nv_drm_init [nvidia_drm]] *ERROR* [nvidia-drm] Version mismatch: nvidia-modeset.ko(550.54.14) "
     "nvidia-drm.ko(550.67)", "nvidia-drm", ("550.54.14", "550.67")),
])
def test_nvidia_kernel_modules_of_two_versions_are_the_module_version_mix(line: str, module: str,
                                                                          versions: tuple[str, str]) -> None:
    finding = explain(line)[0]
    assert finding.id == "kernel.modules-version-mismatch"
    assert finding.values["module"] == module
    assert (finding.values["base_version"], finding.values["module_version"]) == versions


def test_a_version_mismatch_between_user_space_and_kernel_is_not_the_module_mix() -> None:
    ids = [f.id for f in explain("NVRM: API mismatch: the client has the version 535.54.03, but\n"
                                 "NVRM: this kernel module has the version 530.30.02.  Please")]
    assert ids[:1] == ["nvml.mismatch"] and "kernel.modules-version-mismatch" not in ids
    assert "kernel.modules-version-mismatch" not in {
        f.id for f in explain("nvidia-nvswitch: Version mismatch, kernel version 550.54 user version 550.90")}


@pytest.mark.parametrize("text", [
    "UserWarning: CUDA initialization: Unexpected error from cudaGetDeviceCount(). Error 304: OS call failed or "
    "operation not supported on this OS",
    "ggml_cuda_init: failed to initialize CUDA: OS call failed or operation not supported on this OS",
    "$ docker run --gpus all -it myimage python3 serve.py\nCUDA error 304 at ggml-cuda.cu:5065: OS call failed or "
    "operation not supported on this OS",
    "cuInit failed: CUDA_ERROR_OPERATING_SYSTEM",
])
def test_cuda_error_304_where_cuda_starts_or_in_a_container_is_a_refused_system_call(text: str) -> None:
    finding = explain(text)[0]
    assert finding.id == "container.seccomp-denied"
    assert "seccomp=unconfined" in finding.fix


@pytest.mark.parametrize("text", [
    "cudaHostRegister failed: OS call failed or operation not supported on this OS",  # an operation, not start-up
    "THCudaCheck FAIL file=StorageSharing.cpp line=252 error=63 : OS call failed or operation not supported on this OS",
    "the kernel says: operation not supported",
])
def test_the_same_error_from_a_running_programs_operation_is_not_the_nodes(text: str) -> None:
    assert "container.seccomp-denied" not in {f.id for f in explain(text)}


_PLUGIN_FAILS = ("E0801 1 main.go:132] error starting plugins: error creating plugin manager: unable to create plugin "
                 "manager: nvml init failed: ERROR_LIBRARY_NOT_FOUND")


@pytest.mark.parametrize("strategy", [
    "helm upgrade -i nvdp nvdp/nvidia-device-plugin --set runtimeClassName=nvidia --set deviceListStrategy=volume-mounts",
    "    deviceListStrategy: [\"volume-mounts\", \"cdi-annotations\"]",
    "nvidia-device-plugin --device-list-strategy=volume-mounts",
    "accept-nvidia-visible-devices-envvar-when-unprivileged = false",
])
def test_the_plugin_without_nvml_under_the_volume_mounts_strategy_is_its_missing_privilege(strategy: str) -> None:
    findings = explain(f"{_PLUGIN_FAILS}\n{strategy}")
    ids = [f.id for f in findings]
    assert ids[:1] == ["kube.device-plugin-unprivileged"] and "kube.device-plugin-no-nvml" not in ids  # it yields
    assert "ERROR_LIBRARY_NOT_FOUND" in findings[0].excerpt


def test_the_plugin_without_nvml_and_no_strategy_line_keeps_the_runtime_cause_and_the_strategy_alone_is_nothing() -> None:
    assert [f.id for f in explain(_PLUGIN_FAILS)][:1] == ["kube.device-plugin-no-nvml"]
    assert explain("helm install nvdp nvdp/nvidia-device-plugin --set deviceListStrategy=volume-mounts") == []
    assert explain("accept-nvidia-visible-devices-envvar-when-unprivileged = false") == []


# --- explain8: classes of the unseen set's remaining misses, each with its twin lacking the decisive line ----------

_WSL_LINE = "Ubuntu 22.04 under WSL2, kernel 5.15.133.1-microsoft-standard-WSL2"


@pytest.mark.parametrize("loader", [
    "thread 'main' panicked at 'Unable to find cuda lib under the names [\"cuda\", \"nvcuda\"]. Please open GitHub "
    "issue.'",  # cudarc before #257
    "panicked at src/lib.rs:161:5: Unable to dynamically load the \"cuda\" shared library - searched for library "
    "names: [\"libcuda.so\", \"libcuda64.so\"]. Ensure that `LD_LIBRARY_PATH` has the correct path",  # cudarc now
    "RuntimeError: Failed to dlopen libcuda.so",  # cuda-python's early cuPythonInit
])
def test_a_loader_of_the_unversioned_libcuda_under_wsl_is_wsls_copies_that_are_not_links(loader: str) -> None:
    findings = explain(f"{_WSL_LINE}\n{loader}")
    assert findings[0].id == "wsl.libcuda-not-symlink"
    assert "ln -s libcuda.so.1.1" in findings[0].fix and _WSL_LINE in findings[0].excerpt
    # the twin: the same line without WSL in the paste is the driver library missing, not WSL's copies
    alone = [f.id for f in explain(loader)]
    assert alone[:1] == ["cuda.no-driver"] and "wsl.libcuda-not-symlink" not in alone


def test_a_loader_of_the_versioned_libcuda_under_wsl_is_not_the_unversioned_name() -> None:
    ids = [f.id for f in explain(f"{_WSL_LINE}\npyptx shim: failed to dlopen libcuda.so.1: no such file")]
    assert "wsl.libcuda-not-symlink" not in ids


def test_gpu_feature_discovery_without_labels_is_its_pod_without_the_nvidia_runtime() -> None:
    text = ("I0412 09:12:03.004 main.go:144] Start running\n"
            "W0412 09:12:03.118 main.go:184] No labels generated from any source\n"
            "I0412 09:12:03.118 main.go:187] Creating Labels")
    finding = explain(text)[0]
    assert finding.id == "containerd.no-nvidia-runtime"
    assert "No labels generated from any source" in finding.cause and "config.toml.tmpl" in finding.cause
    assert explain("GFD returns 'no labels generated from any source'")[0].id == "containerd.no-nvidia-runtime"
    # the twin: GFD's start-up and the labels it did write are nothing
    assert explain("I0412 09:12:03.004 main.go:144] Start running\nI0412 09:12:03.118 main.go:187] Creating Labels\n"
                   "nvidia.com/gpu.count=1") == []


@pytest.mark.parametrize(("text", "gpu"), [
    ("[ERROR]: cudaErrorInsufficientDriver: CUDA driver version is insufficient for CUDA runtime version\n"
     "01:00.0 VGA compatible controller [0300]: NVIDIA Corporation G96C [GeForce 9500 GT] [10de:0640] (rev a1)",
     "GeForce 9500 GT"),
    ("NVIDIA insufficient driver\nMy GPU is a GeForce 8800GTX.", "GeForce 8800GTX"),
    ("CUDA_ERROR_INSUFFICIENT_DRIVER on my GeForce GTX 285", "GeForce GTX 285"),
    ("Quadro FX 3800: CUDA driver version is insufficient for CUDA runtime version", "Quadro FX 3800"),
])
def test_cudas_insufficient_driver_on_a_pre_fermi_gpu_is_the_gpu_no_driver_supports(text: str, gpu: str) -> None:
    finding = explain(text)[0]
    assert finding.id == "kernel.gpu-unsupported" and finding.values["gpu"] == gpu
    assert "340" in finding.cause


@pytest.mark.parametrize("text", [
    "CUDA driver version is insufficient for CUDA runtime version\nGPU: NVIDIA GeForce GTX 1060 6GB",  # Pascal
    "CUDA driver version is insufficient for CUDA runtime version on my GeForce RTX 2080",
    "cudaErrorInsufficientDriver\nGeForce GTX 750 Ti",  # Maxwell, still supported by 580
])
def test_insufficient_driver_on_a_gpu_current_drivers_support_keeps_the_driver_cause(text: str) -> None:
    ids = [f.id for f in explain(text)]
    assert ids[:1] == ["cuda.insufficient-driver"] and "kernel.gpu-unsupported" not in ids


def test_an_old_gpu_named_without_cudas_insufficient_driver_is_nothing() -> None:
    assert explain("01:00.0 VGA compatible controller: NVIDIA Corporation G96C [GeForce 9500 GT] (rev a1)") == []


_CODE_43_IN_A_VM = (
    "testing NVIDIA GPU passthrough, driver error code 43. kubevirt not support set features.kvm.hidden = on",
    "Proxmox VE 7, RTX 2070 passed to a Windows 10 VM: Windows has stopped this device because it has reported "
    "problems. (Code 43)",
    "qemu-system-x86_64 -enable-kvm -device vfio-pci,host=01:00.0\nDevice Manager shows Code 43 for the GeForce")


def test_code_43_for_a_gpu_in_a_virtual_machine_is_the_driver_refusing_the_hypervisor() -> None:
    firsts = [explain(text)[0] for text in _CODE_43_IN_A_VM]
    assert {f.id for f in firsts} == {"virt.hypervisor-hidden-required"}
    assert all("hidden state='on'" in f.fix for f in firsts)


@pytest.mark.parametrize("text", [
    "Windows 11 desktop: the GeForce shows Code 43 in Device Manager",  # bare metal: any driver failure
    "qemu-system-x86_64 -enable-kvm\nthe installer finished with exit code 43",  # a process's exit code
    "kubevirt virt-launcher: status code 43 from the API",
])
def test_code_43_on_bare_metal_or_as_an_exit_code_is_not_the_hypervisor_check(text: str) -> None:
    assert "virt.hypervisor-hidden-required" not in {f.id for f in explain(text)}


def test_microk8s_without_its_gpu_addon_on_arm64_is_the_addons_architecture() -> None:
    text = "g5g.metal instance (aarch64, NVIDIA T4G)\n$ sudo microk8s enable gpu\nAddon gpu was not found in any repository"
    finding = explain(text)[0]
    assert finding.id == "kube.microk8s-gpu-addon-arch" and finding.values["addon"] == "gpu"
    assert "aarch64" in finding.excerpt and finding.fix.startswith("uname -m")
    # the twin: the same message with no other architecture in the paste is not this finding
    assert "kube.microk8s-gpu-addon-arch" not in {
        f.id for f in explain("$ sudo microk8s enable nvidia\nAddon nvidia was not found in any repository")}
    assert explain("on arm64: Addon dashboard was not found in any repository") == []


def test_nvidia_ctk_refusing_a_list_value_is_a_toolkit_older_than_1_15() -> None:
    text = ("# nvidia-ctk config --set nvidia-container-runtime.runtimes=docker-runc,runc\n"
            "ERRO[0000] invalid --set option nvidia-container-runtime.runtimes=docker-runc,runc: unsupported type for "
            "[nvidia-container-runtime.runtimes docker-runc,runc] ([docker-runc runc])")
    finding = explain(text)[0]
    assert finding.id == "toolkit.too-old" and finding.values["option"] == "nvidia-container-runtime.runtimes"
    assert finding.fix == "gpunode install --only toolkit"
    # the twins: a current value that is no list, and containerd's own version field, are not the old parser
    for other in ("invalid --set option nvidia-container-cli.debug=1: unsupported type for "
                  "[nvidia-container-cli.debug 1] (<nil>)",
                  "unable to load containerd config: unsupported type for version field: 2.5"):
        assert "toolkit.too-old" not in {f.id for f in explain(other)}


@pytest.mark.parametrize("text", [
    "Error: OCI runtime error: error executing hook `/usr/bin/nvidia-container-runtime-hook` (exit code: 1)\n"
    "When the message happened, I tried \"**nvidia-container-cli list**\", but terminal hang.",
    "$ sudo nvidia-container-cli -k -d /dev/tty info  # it is stuck here and never returns",
    "the node freezes on nvidia-container-cli info for minutes",
])
def test_nvidia_container_cli_hanging_on_list_or_info_is_the_driver_too_slow_to_answer(text: str) -> None:
    finding = explain(text)[0]
    assert finding.id == "toolkit.driver-timeout" and "persistenced" in finding.fix


@pytest.mark.parametrize("text", [
    "Error: OCI runtime error: error executing hook `/usr/bin/nvidia-container-runtime-hook` (exit code: 1)\n"
    "nvidia-container-cli list prints /dev/nvidiactl and the libraries fine",
    "nvidia-smi hangs for a minute after boot",  # not the toolkit's call
])
def test_the_cli_answering_or_another_program_hanging_is_not_the_toolkits_wait(text: str) -> None:
    assert "toolkit.driver-timeout" not in {f.id for f in explain(text)}


_SYS_CLOSE = ("/var/lib/dkms/nvidia/465.31/build/nvidia/nv-caps.c:598:5: error: implicit declaration of function "
              "'sys_close' [-Werror=implicit-function-declaration]")


@pytest.mark.parametrize("said", ["DKMS fails for a custom Linux Kernel built from source:",
                                  "I run a self-compiled kernel (6.1.12)", "we compiled our own kernel for the box"])
def test_an_nvidia_dkms_failure_on_a_kernel_built_from_source_is_its_unprepared_headers(said: str) -> None:
    finding = explain(f"{said}\n{_SYS_CLOSE}")[0]
    assert finding.id == "dkms.headers-missing" and "modules_prepare" in finding.cause
    assert _SYS_CLOSE[:40] in finding.excerpt


def test_the_same_failure_on_a_distribution_kernel_or_a_custom_kernel_alone_is_not_its_headers() -> None:
    ids = [f.id for f in explain(_SYS_CLOSE)]
    assert ids[:1] == ["dkms.build-failed"] and "dkms.headers-missing" not in ids
    assert explain("I built a custom kernel from source yesterday and it boots fine") == []
    # another module's build failing beside a custom kernel is not the NVIDIA driver's
    assert "dkms.headers-missing" not in {f.id for f in explain(
        "custom kernel\n/var/lib/dkms/zfs/2.1.5/build/module/os/linux/zfs/zfs_vnops_os.c:10:1: error: unknown type")}


# --- batch 14 (explain9): classes of batch 14's misses, each from the emitter's schema or source, each with a twin ---

@pytest.mark.parametrize("text", [
    'docker-compose up -d fails with error: "services.api.deploy.resources.limits Additional property devices is not '
    'allowed"',
    "services.vllm.deploy.resources.limits additional properties 'devices' not allowed",
    "ERROR: The Compose file './docker-compose.yml' is invalid because:\n"
    "services.app.deploy.resources.limits value Additional properties are not allowed ('devices' was unexpected)",
])
def test_gpu_devices_under_compose_limits_are_a_misplaced_request_not_an_old_compose(text: str) -> None:
    ids = [f.id for f in explain(text)]
    assert ids[:1] == ["compose.devices-misplaced"] and "compose.too-old-for-gpus" not in ids
    assert "reservations" in explain(text)[0].cause


@pytest.mark.parametrize(("text", "expected"), [
    # devices under reservations refused: the compose binary predates GPU reservations (the older finding)
    ("services.app.deploy.resources.reservations value Additional properties are not allowed ('devices' was "
     "unexpected)", "compose.too-old-for-gpus"),
    # another key refused under limits is not a GPU request
    ("services.api.deploy.resources.limits Additional property gpus is not allowed", None),
])
def test_devices_under_reservations_or_another_key_under_limits_is_not_the_misplaced_request(
        text: str, expected: str | None) -> None:
    ids = [f.id for f in explain(text)]
    assert "compose.devices-misplaced" not in ids
    if expected:
        assert ids[:1] == [expected]


_V3 = 'time="2026-01-21T12:32:09Z" level=fatal msg="Error: unable to load config: unsupported config version: 3"'


def test_the_toolkit_refusing_containerds_config_version_3_is_a_toolkit_older_than_1_17_4() -> None:
    finding = explain(_V3 + '\ntime="2026-01-21T12:32:09Z" level=error msg="error running nvidia-toolkit: unable to '
                      'setup runtime: error running containerd command: exit status 1"')[0]
    assert (finding.id, finding.values.get("version")) == ("toolkit.too-old", "3")
    assert "v1.17.4" in finding.title and "unsupported config version: 3" in finding.excerpt


@pytest.mark.parametrize("text", [
    # the same loader failing on a broken file is not its version support
    "level=fatal msg=\"Error: unable to load config: toml: line 12: expected '.' or '=', but got '\\\"' instead\"",
    # versions 1 and 2 are read by every supported toolkit
    "unable to load config: unsupported config version: 2",
])
def test_a_broken_config_or_an_old_version_number_is_not_the_toolkit_too_old_for_version_3(text: str) -> None:
    assert "toolkit.too-old" not in {f.id for f in explain(text)}


def test_nvidia_ctks_own_wording_of_the_version_3_refusal_is_the_same_old_toolkit() -> None:
    finding = explain("ERRO[0000] unable to load config for runtime containerd: unsupported config version: 3")[0]
    assert finding.id == "toolkit.too-old" and "gpunode install --only toolkit" in finding.fix


# --- explain11: frameworks -----------------------------------------------------------------------------------------
# The ML frameworks' and inference servers' GPU start-up messages, from their sources (rows in
# data/explain_detectors.csv, messages in data/explain_catalogue.csv). Where two of them appear together, the one
# that names the reason must come first; a benign neighbour of each message is no finding.


def _ids(text: str) -> list[str]:
    return [f.id for f in explain(text)]


def test_vllms_start_up_memory_check_names_what_is_free_and_what_it_wants() -> None:
    finding = explain("(EngineCore_DP0 pid=212) ERROR 10-06 12:00:02 [core.py:708] ValueError: Free memory on device "
                      "cuda:0 (10.47/79.44 GiB) on startup is less than desired GPU memory utilization (0.9, 71.5 "
                      "GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.")[0]
    assert finding.id == "cuda.out-of-memory"
    assert finding.title == "Only 10.47 of 79.44 GiB are free on the GPU; vLLM wants 71.5 GiB"
    assert "(0.9)" in finding.cause and "--query-compute-apps" in finding.fix


def test_tensorflows_kernel_and_dso_versions_are_named_in_the_mismatch() -> None:
    finding = explain("E tensorflow/stream_executor/cuda/cuda_diagnostics.cc:313] kernel version 470.57.2 does not "
                      "match DSO version 470.63.1 -- cannot find working devices in this configuration")[0]
    assert finding.id == "cuda.driver-mismatch"
    assert "470.63.1" in finding.title and "470.57.2" in finding.title


def test_a_gpu_below_tensorflows_or_ollamas_minimum_is_the_build_without_code_for_it() -> None:
    tf = explain("Ignoring visible gpu device (device: 0, name: Tesla K80, pci bus id: 0000:00:1e.0, compute "
                 "capability: 3.7) with Cuda compute capability 3.7. The minimum required Cuda capability is 7.0.")[0]
    assert (tf.id, tf.values["capability"], tf.values["minimum"]) == ("cuda.no-kernel-image", "3.7", "7.0")
    # ollama prints both lines; the one that says why comes first
    ollama = _ids('level=INFO source=gpu.go:295 msg="[0] CUDA GPU is too old. Compute Capability detected: 3.0"\n'
                  'level=INFO source=gpu.go:396 msg="no compatible GPUs were discovered"')
    assert ollama[:2] == ["cuda.no-kernel-image", "cuda.no-device"]


@pytest.mark.parametrize(("beside", "first"), [
    # the driver library failing with 999 is nvidia_uvm's unknown error
    ('level=WARN source=gpu.go:562 msg="unable to load cuda driver library" library=/usr/lib/x86_64-linux-gnu/'
     'libcuda.so.550.54.15 error="cuda driver library init failure: 999"', "cuda.unknown-error"),
    (None, "cuda.no-device"),
])
def test_ollama_finding_no_gpu_gives_way_to_the_line_that_says_why(beside: str | None, first: str) -> None:
    text = 'time=2024-10-15T09:18:18.299Z level=INFO source=gpu.go:347 msg="no compatible GPUs were discovered"'
    assert _ids(f"{beside}\n{text}" if beside else text)[:1] == [first]


@pytest.mark.parametrize(("beside", "first"), [
    ("ggml_cuda_init: failed to initialize CUDA: unknown error", "cuda.unknown-error"),
    ("ggml_cuda_init: failed to initialize CUDA: no CUDA-capable device is detected", "cuda.no-device"),
    ("ggml_cuda_init: failed to initialize CUDA: CUDA driver version is insufficient for CUDA runtime version",
     "cuda.insufficient-driver"),
    (None, "cuda.cpu-only-build"),
])
def test_llama_cpp_without_a_usable_gpu_gives_way_to_the_cuda_error_beside_it(beside: str | None,
                                                                              first: str) -> None:
    text = ("warning: no usable GPU found, --gpu-layers option will be ignored\n"
            "warning: one possible reason is that llama.cpp was compiled without GPU support")
    assert _ids(f"{beside}\n{text}" if beside else text)[:1] == [first]


@pytest.mark.parametrize(("beside", "first"), [
    ("CUDA backend failed to initialize: Found cuDNN version 8600, but JAX was built against version 8907, which is "
     "newer. The copy of cuDNN that is installed must be at least as new as the version against which JAX was built.",
     "cuda.libraries-missing"),
    (None, "cuda.cpu-only-build"),
])
def test_jax_falling_back_to_the_cpu_gives_way_to_the_reason_its_plugin_printed(beside: str | None,
                                                                                first: str) -> None:
    text = "WARNING:jax._src.xla_bridge:No GPU/TPU found, falling back to CPU."
    assert _ids(f"{beside}\n{text}" if beside else text)[:1] == [first]


def test_tensorflow_without_the_kernel_module_gives_way_to_cuinits_no_device_and_stands_alone_otherwise() -> None:
    diag = ("I tensorflow/stream_executor/cuda/cuda_diagnostics.cc:156] kernel driver does not appear to be running "
            "on this host (59fb3b9908d3): /proc/driver/nvidia/version does not exist")
    cuinit = ("E tensorflow/stream_executor/cuda/cuda_driver.cc:351] failed call to cuInit: CUDA_ERROR_NO_DEVICE: no "
              "CUDA-capable device is detected")
    assert _ids(f"{cuinit}\n{diag}")[:2] == ["cuda.no-device", "driver.not-loaded"]
    assert _ids(diag)[:1] == ["driver.not-loaded"]


def test_vllm_without_a_platform_gives_way_to_the_missing_driver_library() -> None:
    text = ("WARNING [__init__.py:26] Failed to import from vllm._C with ImportError('libcuda.so.1: cannot open shared "
            "object file: No such file or directory')\nRuntimeError: Failed to infer device type")
    assert _ids(text)[:2] == ["cuda.no-driver", "cuda.no-device"]


@pytest.mark.parametrize("text", [
    # the versions agree: TensorFlow's diagnostics say so at INFO
    "I tensorflow/stream_executor/cuda/cuda_diagnostics.cc:200] kernel version seems to match DSO: 535.104.5",
    # a GPU skipped for its size, not its architecture (TF_MIN_GPU_MULTIPROCESSOR_COUNT)
    "Ignoring visible gpu device (device: 0, name: GeForce GT 710, pci bus id: 0000:01:00.0, compute capability: 3.5) "
    "with core count: 1. The minimum required count is 8. You can adjust this requirement with the env var "
    "TF_MIN_GPU_MULTIPROCESSOR_COUNT.",
    # a vLLM fork that casts to float16 itself only warns
    "WARNING bfloat16 is only supported on GPUs with compute capability of at least 8.0. Your Tesla T4 GPU has "
    "compute capability 7.5. bfloat16 will be converted to float16.",
    # JAX reporting the cuDNN it loaded
    "I external/xla/xla/stream_executor/cuda/cuda_dnn.cc:517] Loaded cuDNN version 8907",
    # llama.cpp reporting the GPU it found
    "ggml_cuda_init: found 1 CUDA devices:\n  Device 0: NVIDIA GeForce RTX 4090, compute capability 8.9, VMM: yes",
    # start-up lines of a working GPU
    "I tensorflow/core/common_runtime/gpu/gpu_device.cc:1886] Created device /job:localhost/replica:0/task:0/device:"
    "GPU:0 with 22272 MB memory:  -> device: 0, name: NVIDIA GeForce RTX 3090, pci bus id: 0000:01:00.0, compute "
    "capability: 8.6",
    "E external/local_xla/xla/stream_executor/cuda/cuda_dnn.cc:9261] Unable to register cuDNN factory: Attempting to "
    "register factory for plugin cuDNN when one has already been registered",
    "I tensorflow/compiler/xla/stream_executor/cuda/cuda_gpu_executor.cc:894] successful NUMA node read from SysFS had "
    "negative value (-1), but there must be at least one NUMA node, so returning NUMA node zero",
    "W tensorflow/compiler/tf2tensorrt/utils/py_utils.cc:38] TF-TRT Warning: Could not find TensorRT",
    'level=INFO source=types.go:131 msg="inference compute" id=GPU-1234 library=cuda variant=v12 compute=8.6 '
    'driver=12.4 name="NVIDIA GeForce RTX 3090" total="23.7 GiB" available="23.4 GiB"',
    "INFO 10-06 12:00:31 [gpu_worker.py:298] Available KV cache memory: 12.25 GiB",
    "Custom allreduce is disabled because your platform lacks GPU P2P capability or P2P test failed. To silence this "
    "warning, specify disable_custom_all_reduce=True explicitly.",
])
def test_the_benign_neighbours_of_the_framework_messages_are_no_finding(text: str) -> None:
    assert _ids(text) == []


def test_a_gpu_too_old_for_torch_compile_names_the_gpu_and_its_capability() -> None:
    finding = explain("torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised:\nRuntimeError: Found Tesla "
                      "P100-PCIE-16GB which is too old to be supported by the triton GPU compiler, which is used as the "
                      "backend. Triton only supports devices of CUDA Capability >= 7.0, but your device is of CUDA "
                      "capability 6.0")[0]
    assert (finding.id, finding.values["gpu"], finding.values["capability"]) == (
        "cuda.capability-too-low", "Tesla P100-PCIE-16GB", "6.0")


def test_vllm_asking_for_more_gpus_than_it_sees_names_both_counts() -> None:
    finding = explain("pydantic_core._pydantic_core.ValidationError: 1 validation error for ParallelConfig\n  Value "
                      "error, World size (4) is larger than the number of available GPUs (1) in this node.")[0]
    assert (finding.id, finding.title) == ("cuda.invalid-device", "vLLM needs 4 GPUs and sees 1")


@pytest.mark.parametrize(("text", "feature"), [
    ("2019-04-20 17:20:03.915545: F tensorflow/core/platform/cpu_feature_guard.cc:37] The TensorFlow library was "
     "compiled to use SSE4.1 instructions, but these aren't available on your machine.\nAborted (core dumped)",
     "SSE4.1"),
    ("The TensorFlow library was compiled to use AVX instructions, but these aren't available on your machine.",
     "AVX"),
])
def test_a_cpu_without_the_vector_extensions_a_build_needs_is_the_vcpu_model(text: str, feature: str) -> None:
    finding = explain(text)[0]
    assert (finding.id, finding.values["feature"]) == ("cpu.vector-extensions-missing", feature)
    assert "host-passthrough" in " ".join(str(a) for a in finding.also)


def test_onnx_runtimes_cuda_provider_failing_gives_way_to_the_library_it_could_not_load() -> None:
    text = ("[E:onnxruntime:Default, provider_bridge_ort.cc:2395 TryGetProviderInfo_CUDA] Failed to load library "
            "libonnxruntime_providers_cuda.so with error: libcublasLt.so.12: cannot open shared object file: No such "
            "file or directory\n[W:onnxruntime:Default, onnxruntime_pybind_state.cc:1139] Failed to create "
            "CUDAExecutionProvider. Require cuDNN 9.* and CUDA 12.*")
    finding = explain(text)[0]
    assert (finding.id, finding.values["library"]) == ("cuda.libraries-missing", "libcublasLt.so.12")


@pytest.mark.parametrize("text", [
    # the opposite notice: the CPU has more than the build uses
    "I tensorflow/core/platform/cpu_feature_guard.cc:142] Your CPU supports instructions that this TensorFlow binary "
    "was not compiled to use: AVX2 FMA",
    # another provider missing from the CPU package is not a GPU matter
    "UserWarning: Specified provider 'OpenVINOExecutionProvider' is not in available provider names.Available "
    "providers: 'AzureExecutionProvider, CPUExecutionProvider'",
    # triton present but broken is not the GPU's age
    "RuntimeError: Cannot find a working triton installation. More information on installing Triton can be found at "
    "https://github.com/openai/triton",
])
def test_the_neighbours_of_the_cpu_and_provider_messages_are_not_those_findings(text: str) -> None:
    assert not {"cpu.vector-extensions-missing", "cuda.cpu-only-build", "cuda.capability-too-low"} & set(_ids(text))


def test_nccl_finding_two_ranks_on_one_gpu_names_them_and_the_bus_id() -> None:
    finding = explain("ncclInvalidUsage: This usually reflects invalid usage of NCCL library.\nLast error:\nDuplicate "
                      "GPU detected : rank 1 and rank 0 both on CUDA device 1000")[0]
    assert (finding.id, finding.values["rank"], finding.values["other"], finding.values["busid"]) == (
        "nccl.duplicate-gpu", "1", "0", "1000")


def test_nccls_bootstrap_without_an_interface_outranks_the_invalid_usage_it_returns() -> None:
    text = ("node1:123:123 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to ens5\nnode1:123:123 [0] "
            "bootstrap.cc:126 NCCL WARN Bootstrap : no socket interface found\ntorch.distributed.DistBackendError: "
            "NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, invalid usage (run with "
            "NCCL_DEBUG=INFO for details), NCCL version 2.20.5")
    assert _ids(text)[:1] == ["nccl.no-socket-interface"]
    # NCCL naming the interface it did find is no finding
    assert _ids("node1:123:123 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.2<0>") == []


@pytest.mark.parametrize("text", [
    # NCCL's optional network plugin: without it NCCL uses its internal one (every PyTorch job without the plugin)
    "NCCL INFO NET/Plugin: Could not find: libnccl-net.so. Using internal network plugin.",
    "NCCL INFO NET/Plugin: Plugin load (libnccl-net.so) returned 2 : libnccl-net.so: cannot open shared object file: "
    "No such file or directory",
    "NCCL INFO NET/Plugin : No plugin found (libnccl-net.so), using internal implementation",
])
def test_nccl_without_its_optional_network_plugin_is_no_finding(text: str) -> None:
    assert _ids(text) == []


def test_nccl_itself_missing_is_still_the_missing_libraries() -> None:
    assert _ids("OSError: libnccl.so.2: cannot open shared object file: No such file or directory")[:1] == [
        "cuda.libraries-missing"]
    assert _generic("ncclx loader: libnccl.so.2 not found")[0].id == "cuda.libraries-missing"



def test_paddle_built_for_a_newer_cuda_than_the_driver_is_the_old_driver_and_its_cudnn_warning_is_not() -> None:
    finding = explain("W0315 gpu_resources.cc:164] WARNING: device: 0. The installed Paddle is compiled with CUDA "
                      "12.3, but CUDA runtime version in your machine is 11.4, which may cause serious incompatible "
                      "bug.")[0]
    assert (finding.id, finding.values["compiled"], finding.values["local"]) == (
        "cuda.insufficient-driver", "12.3", "11.4")
    # the same check for cuDNN is the library, not the driver
    assert "cuda.insufficient-driver" not in _ids(
        "WARNING: device: 0. The installed Paddle is compiled with CUDNN 8.9, but CUDNN version in your machine is "
        "8.6, which may cause serious incompatible bug.")


def test_xlas_ptxas_warning_names_the_drivers_cuda_and_the_compilers() -> None:
    finding = explain("W external/xla/xla/service/gpu/nvptx_compiler.cc:760] The NVIDIA driver's CUDA version is 12.4 "
                      "which is older than the ptxas CUDA version (12.5.40). Because the driver is older than the ptxas "
                      "version, XLA is disabling parallel compilation, which may slow down compilation.")[0]
    assert (finding.id, finding.title) == (
        "cuda.insufficient-driver", "The driver's CUDA (12.4) is older than the CUDA compiler XLA uses (12.5.40)")
