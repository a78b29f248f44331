"""The doctor's probe sections and their parsers, on real captures where there are some."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from gpunode.doctor import parse
from gpunode.facts.probe import COMMANDS, FILE_GROUPS
from tests.conftest import FIXTURES

Q_TEXT = FIXTURES / "nvidia-smi-q-text"
DOCTOR_COMMANDS = {k: v for k, v in COMMANDS.items() if k.startswith("doctor_")}


def test_doctor_probe_sections_are_read_only_sh():
    assert set(DOCTOR_COMMANDS) >= {"doctor_gpus", "doctor_kernel_log", "doctor_kernels", "doctor_dev_char",
                                    "doctor_units", "doctor_auto_upgrade", "doctor_engines", "doctor_cdi",
                                    "doctor_date"}
    assert {"doctor_cuda", "doctor_ctk_config"} <= set(FILE_GROUPS)
    for name, snippet in DOCTOR_COMMANDS.items():
        assert "sudo" not in snippet and " rm " not in snippet and "tee" not in snippet, name
        # every redirection goes to /dev/null or duplicates a descriptor
        assert not re.search(r"(?<![0-9&-])>(?!/dev/null|&)", snippet.replace("2>/dev/null", "")
                             .replace(">/dev/null", "")), name


@pytest.mark.skipif(shutil.which("sh") is None, reason="no sh")
@pytest.mark.parametrize("name", sorted(DOCTOR_COMMANDS))
def test_doctor_probe_sections_parse_as_posix_sh(name):
    result = subprocess.run(["sh", "-n", "-c", DOCTOR_COMMANDS[name]], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def _awk_filter() -> str:
    snippet = COMMANDS["doctor_gpus"]
    return snippet[snippet.index("awk '"):]


@pytest.mark.skipif(shutil.which("awk") is None, reason="no awk")
@pytest.mark.parametrize("capture", ["h100-mig_driver-590.48.01_q_idle.txt", "a100-sxm4-x4_driver-555.42.02_q.txt",
                                     "l40s_driver-550.127.05_q.txt"])
def test_gpu_query_filter_keeps_what_the_parser_needs(capture):
    text = (Q_TEXT / capture).read_text()
    kept = subprocess.run(["sh", "-c", _awk_filter()], input=text, capture_output=True, text=True, check=True).stdout
    assert parse.parse_gpus(kept) == parse.parse_gpus(text)
    assert len(kept) < len(text) / 5


def test_parse_gpus_mig_and_virtualization_from_a_real_capture():
    (gpu,) = parse.parse_gpus((Q_TEXT / "h100-mig_driver-590.48.01_q_idle.txt").read_text())
    assert gpu == parse.SmiGpu(0, "0000:00:09.0", "NVIDIA H100 80GB HBM3", "NVIDIA",
                               "GPU-00000000-0000-0000-0000-000000000000", "Enabled", "Enabled", "Enabled",
                               "Pass-Through", "")


def test_parse_gpus_several():
    found = parse.parse_gpus((Q_TEXT / "a100-sxm4-x4_driver-555.42.02_q.txt").read_text())
    assert [g.index for g in found] == [0, 1, 2, 3]
    assert {(g.name, g.mig_current, g.virtualization, g.persistence) for g in found} == {
        ("NVIDIA A100-SXM4-80GB", "Disabled", "None", "Enabled")}
    assert found[0].bus == "0000:68:00.0" and found[0].uuid == "GPU-31515c3d-1414-7c2c-004a-f86a898946ac"


def test_parse_gpus_vgpu_licence():
    text = ("GPU 00000000:02:00.0\n    Product Name : NVIDIA A10-24Q\n    GPU Virtualization Mode\n"
            "        Virtualization Mode : VGPU\n    vGPU Software Licensed Product\n"
            "        Product Name : NVIDIA RTX Virtual Workstation\n        License Status : Licensed (Expiry: N/A)\n")
    (gpu,) = parse.parse_gpus(text)
    assert (gpu.name, gpu.virtualization, gpu.license) == ("NVIDIA A10-24Q", "VGPU", "Licensed (Expiry: N/A)")


@pytest.mark.parametrize("bus, address", [("00000000:00:1E.0", "0000:00:1e.0"), ("0000:3b:00.0", "0000:3b:00.0"),
                                          ("00000001:00:00.0", "0001:00:00.0"), ("3b:00.0", "0000:3b:00.0")])
def test_pci_address(bus, address):
    assert parse.pci_address(bus) == address


def test_dkms_status_formats():
    text = ("nvidia/535.129.03, 5.15.0-91-generic, x86_64: installed\n"
            "nvidia, 470.256.02, 5.4.0-150-generic, x86_64: installed (WARNING! Diff between built and installed "
            "module!)\nnvidia/580.95.05: added\nvirtualbox/7.0.14, 6.8.0-45-generic, x86_64: built\n")
    assert parse.parse_dkms_status(text) == (
        parse.DkmsEntry("nvidia", "535.129.03", "5.15.0-91-generic", "installed"),
        parse.DkmsEntry("nvidia", "470.256.02", "5.4.0-150-generic", "installed"),
        parse.DkmsEntry("nvidia", "580.95.05", None, "added"),
        parse.DkmsEntry("virtualbox", "7.0.14", "6.8.0-45-generic", "built"))


def test_kernels_newest_in_natural_order():
    info = parse.parse_kernels("kernel 5.15.0-91-generic headers /lib/modules/5.15.0-91-generic/updates/dkms/nvidia.ko\n"
                               "kernel 5.15.0-100-generic - -\n"
                               "dkms nvidia/535.129.03, 5.15.0-91-generic, x86_64: installed\n")
    assert info.newest == parse.Kernel("5.15.0-100-generic", False, None)
    assert info.built_for("5.15.0-91-generic") == ["/lib/modules/5.15.0-91-generic/updates/dkms/nvidia.ko",
                                                   "dkms nvidia/535.129.03"]
    assert info.built_for("5.15.0-100-generic") == []
    assert not parse.parse_kernels(None).known


def test_kernel_log_source_line():
    assert parse.parse_kernel_log(None) is None
    log = parse.parse_kernel_log("@source journal\nJun 30 kernel: NVRM: Xid (PCI:0000:3b:00): 79")
    assert log == parse.KernelLog("journal", "Jun 30 kernel: NVRM: Xid (PCI:0000:3b:00): 79")


def test_auto_upgrade_from_apt_config_dump():
    found = parse.parse_auto_upgrade('apt APT::Periodic::Unattended-Upgrade "1";\n'
                                     'apt Unattended-Upgrade::Package-Blacklist "";\n'
                                     'apt Unattended-Upgrade::Package-Blacklist:: "nvidia-";\n'
                                     'apt Unattended-Upgrade::Allowed-Origins "";\n'
                                     'apt Unattended-Upgrade::Allowed-Origins:: "${distro_id}:${distro_codename}";\n'
                                     "installed unattended-upgrades\ndnf apply_updates = yes\n")
    assert found.apt_installed and found.apt_periodic == "1"
    assert found.apt_blacklist == ("nvidia-",) and found.apt_origins == ("${distro_id}:${distro_codename}",)
    assert found.dnf == {"apply_updates": "yes"}


def test_auto_upgrade_from_files():
    found = parse.parse_auto_upgrade('file /etc/apt/apt.conf.d/20auto-upgrades\n'
                                     'APT::Periodic::Update-Package-Lists "1";\nAPT::Periodic::Unattended-Upgrade "0";\n'
                                     "file /etc/apt/apt.conf.d/50unattended-upgrades\n"
                                     'Unattended-Upgrade::Package-Blacklist {\n    // "vim";\n    "libnvidia-";\n};\n')
    assert not found.apt_installed and found.apt_periodic == "0" and found.apt_blacklist == ("libnvidia-",)


def test_dev_char_links():
    found = parse.parse_dev_char("dev /dev/nvidia0\ndev /dev/nvidia1\ndev /dev/nvidiactl\ndev /dev/nvidia-uvm\n"
                                 "link 195:0 ../nvidia0\nlink 195:255 ../nvidiactl\nlink 509:0 ../nvidia-uvm\n")
    assert found.missing == ["/dev/nvidia1"]
    assert found.links["nvidiactl"] == "/dev/char/195:255"


def test_engine_versions_cdi_and_cuda_toolkits():
    assert parse.parse_engine_versions("docker Docker version 24.0.7, build afdd53b\npodman podman version 4.9.3\n") \
        == {"docker": (24, 0, 7), "podman": (4, 9, 3)}
    assert parse.parse_cdi("spec /etc/cdi/nvidia.yaml libnvidia-ml.so.535.129.03\nspec /var/run/cdi/other.yaml \n") \
        == [("/etc/cdi/nvidia.yaml", "535.129.03"), ("/var/run/cdi/other.yaml", None)]
    files = {"/usr/local/cuda/version.json": '{"cuda": {"name": "CUDA SDK", "version": "12.4.1"}}',
             "/usr/local/cuda-12.4/version.json": '{"cuda": {"name": "CUDA SDK", "version": "12.4.1"}}',
             "/usr/local/cuda-10.1/version.txt": "CUDA Version 10.1.243\n",
             "/usr/local/cuda-11.8/version.json": '{"cuda": {"version": "11.8.20220929"}}',
             "/usr/local/cuda-x/version.json": "not json"}
    assert parse.parse_cuda_toolkits(files) == {"10.1.243": ["/usr/local/cuda-10.1"],
                                                "11.8.20220929": ["/usr/local/cuda-11.8"],
                                                "12.4.1": ["/usr/local/cuda-12.4", "/usr/local/cuda"]}
