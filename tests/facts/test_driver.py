"""Driver facts (gpunode/facts/driver.py): user space, module, distribution packages, NVML's answer, the GPUs as
nvidia-smi -q reports them (on real captures), CUDA toolkits; and the driver state built from them."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from gpunode import rules
from gpunode.facts import Facts
from gpunode.facts import driver as d
from gpunode.facts.kernel import parse_nvidia_version
from gpunode.facts.registry import Section
from tests.conftest import FIXTURES

Q_TEXT = FIXTURES / "nvidia-smi-q-text"
NVRM = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.129.03  Thu Oct 19 18:56:32 UTC 2023\n"


def test_userspace_module_and_packages_parsers():
    libs, record = d.parse_userspace("lib /usr/lib64/libnvidia-ml.so.1\nlib /usr/lib64/libnvidia-ml.so.550.54.15\n"
                                     "installer nvidia-installer:  version 550.54.15\n")
    assert libs == ("550.54.15",) and record == "550.54.15"
    assert d.parse_module("filename: /x.ko\nversion:        570.124.06\nlicense:        Dual MIT/GPL\n") == \
        d.ModuleInfo("570.124.06", "open", None, "/x.ko")
    assert d.parse_module("version:        535.129.03\nlicense:        NVIDIA\nsigner:         DKMS module signing key\n") \
        == d.ModuleInfo("535.129.03", "proprietary", "DKMS module signing key")
    assert d.parse_packages("nvidia-container-toolkit 1.17\nkmod-nvidia-latest-dkms 550.54.15-1.el9\n") == (
        ("kmod-nvidia-latest-dkms", "550.54.15-1.el9"),)


def test_a_version_outside_the_driver_grammar_is_not_read():
    libs, record = d.parse_userspace("lib /usr/lib64/libnvidia-ml.so.1\ninstaller nvidia-installer: version 1.2\n")
    assert libs == () and record is None
    assert d.parse_module("version:        12.5\n").version is None


def test_driver_state_from_typed_facts():
    facts = Facts(loaded_driver=parse_nvidia_version(NVRM), outputs={
        "driver_userspace": Section("lib /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15\n", 0),
        "driver_module": Section("version:        550.54.15\nlicense:        NVIDIA\n", 0),
        "driver_smi": Section("Failed to initialize NVML: Driver/library version mismatch", 18)})
    state = d.driver_state(facts)
    assert (state.installed, state.module, state.module_flavour, state.smi_status) == (
        "550.54.15", "550.54.15", "proprietary", 18)
    assert state.mismatch


def test_no_nvidia_smi_is_not_a_failure_status():
    assert d.parse_smi(Section("", 3)) == d.Smi(None, "")
    assert d.parse_smi(Section("", 127)).status is None
    assert d.parse_smi(Section("535.129.03\n", 0)) == d.Smi(0, "535.129.03")
    assert d.driver_state(Facts()).smi_status is None


def _awk_filter() -> str:
    snippet = d.GPUS.snippet
    return snippet[snippet.index("awk '"):]


@pytest.mark.skipif(shutil.which("awk") is None, reason="no awk")
@pytest.mark.parametrize("capture", ["h100-mig_driver-590.48.01_q_idle.txt", "a100-sxm4-x4_driver-555.42.02_q.txt",
                                     "l40s_driver-550.127.05_q.txt"])
def test_gpu_query_filter_keeps_what_the_parser_needs(capture):
    text = (Q_TEXT / capture).read_text()
    kept = subprocess.run(["sh", "-c", _awk_filter()], input=text, capture_output=True, text=True, check=True).stdout
    assert d.parse_gpus(kept) == d.parse_gpus(text)
    assert len(kept) < len(text) / 5


def test_parse_gpus_mig_and_virtualization_from_a_real_capture():
    (gpu,) = d.parse_gpus((Q_TEXT / "h100-mig_driver-590.48.01_q_idle.txt").read_text())
    assert gpu == d.SmiGpu(0, "0000:00:09.0", "NVIDIA H100 80GB HBM3", "NVIDIA",
                               "GPU-00000000-0000-0000-0000-000000000000", "Enabled", "Enabled", "Enabled",
                               "Pass-Through", "")


def test_parse_gpus_several():
    found = d.parse_gpus((Q_TEXT / "a100-sxm4-x4_driver-555.42.02_q.txt").read_text())
    assert [g.index for g in found] == [0, 1, 2, 3]
    assert {(g.name, g.mig_current, g.virtualization, g.persistence) for g in found} == {
        ("NVIDIA A100-SXM4-80GB", "Disabled", "None", "Enabled")}
    assert found[0].bus == "0000:68:00.0" and found[0].uuid == "GPU-31515c3d-1414-7c2c-004a-f86a898946ac"


def test_parse_gpus_vgpu_licence():
    text = ("GPU 00000000:02:00.0\n    Product Name : NVIDIA A10-24Q\n    GPU Virtualization Mode\n"
            "        Virtualization Mode : VGPU\n    vGPU Software Licensed Product\n"
            "        Product Name : NVIDIA RTX Virtual Workstation\n        License Status : Licensed (Expiry: N/A)\n")
    (gpu,) = d.parse_gpus(text)
    assert (gpu.name, gpu.virtualization, gpu.license) == ("NVIDIA A10-24Q", "VGPU", "Licensed (Expiry: N/A)")


@pytest.mark.parametrize("bus, address", [("00000000:00:1E.0", "0000:00:1e.0"), ("0000:3b:00.0", "0000:3b:00.0"),
                                          ("00000001:00:00.0", "0001:00:00.0"), ("3b:00.0", "0000:3b:00.0")])
def test_pci_address(bus, address):
    assert d.pci_address(bus) == address


def test_cuda_toolkits_from_version_files():
    files = {"/usr/local/cuda/version.json": '{"cuda": {"name": "CUDA SDK", "version": "12.4.1"}}',
             "/usr/local/cuda-12.4/version.json": '{"cuda": {"name": "CUDA SDK", "version": "12.4.1"}}',
             "/usr/local/cuda-10.1/version.txt": "CUDA Version 10.1.243\n",
             "/usr/local/cuda-11.8/version.json": '{"cuda": {"version": "11.8.20220929"}}',
             "/usr/local/cuda-x/version.json": "not json"}
    assert d.parse_cuda_toolkits(files) == {"10.1.243": ["/usr/local/cuda-10.1"],
                                                "11.8.20220929": ["/usr/local/cuda-11.8"],
                                                "12.4.1": ["/usr/local/cuda-12.4", "/usr/local/cuda"]}


# ---- Debian's packaged driver (real outputs from the real-OS tier's nvidia VM) ---------------------------------

DEBIAN = FIXTURES / "debian-nvidia"


def _debian_names() -> d.DebianNames:
    alternative = next(line.split(": ", 1)[1] for line in
                       (DEBIAN / "update-alternatives-query-nvidia.txt").read_text().splitlines()
                       if line.startswith("Value: "))
    kos = "".join(f"ko {line}\n" for line in (DEBIAN / "modinfo-F-name.txt").read_text().splitlines())
    return d.parse_debian_names(f"alt {alternative}\n{kos}")


def test_debian_names_module_files_and_alternative():
    names = _debian_names()
    assert names.alternative == "/usr/lib/nvidia/current"
    assert ("/lib/modules/6.1.0-56-amd64/updates/dkms/nvidia-current.ko", "nvidia") in names.module_files
    assert ("/lib/modules/6.1.0-56-amd64/updates/dkms/nvidia-current-uvm.ko", "nvidia_uvm") in names.module_files
    module = d.parse_module((DEBIAN / "modinfo-nvidia-current.txt").read_text())
    assert module == d.ModuleInfo("535.309.01", "proprietary", None,
                                  "/lib/modules/6.1.0-56-amd64/updates/dkms/nvidia-current.ko", "nvidia")


def test_kernel_name_rule_agrees_with_real_modinfo():
    """The probe lists the files without a modinfo each (time limit); the names it derives must be the ones the
    real `modinfo -F name` gave for every file on the tier's nvidia VM."""
    for line in (DEBIAN / "modinfo-F-name.txt").read_text().splitlines():
        path, name = line.split()
        assert d.kernel_name(path) == name, line
    bare = d.parse_debian_names("".join(f"ko {line.split()[0]}\n" for line in
                                        (DEBIAN / "modinfo-F-name.txt").read_text().splitlines()))
    assert bare.module_files == _debian_names().module_files


def test_debian_packaged_driver_owner_version_flavour_and_modprobe_redirect():
    packages = d.parse_packages((DEBIAN / "dpkg-query.txt").read_text())
    names = [n for n, _ in packages]
    assert {"nvidia-kernel-dkms", "nvidia-smi", "libnvidia-ml1", "libcuda1", "firmware-nvidia-gsp"} <= set(names)
    assert "nvidia-persistenced" not in names and "nvidia-modprobe" not in names  # shipped for .run drivers too
    linked = {"/etc/modprobe.d/nvidia.conf": (DEBIAN / "etc-nvidia-nvidia-modprobe.conf").read_text()}
    found = d.packaged_driver(packages, _debian_names(), linked)
    assert found is not None
    assert (found.owner, found.version, found.package_version, found.flavour) == (
        "nvidia-kernel-dkms", "535.309.01", "535.309.01-0+deb12u1", "proprietary")
    assert found.renamed and found.loads_as_nvidia
    assert found.modprobe_nvidia == "install nvidia modprobe -i nvidia-current $CMDLINE_OPTS"
    # the compute-only set (no libcuda1): Debian's modprobe configuration is not linked into /etc/modprobe.d
    unlinked = d.packaged_driver(packages, _debian_names(), {})
    assert unlinked is not None and not unlinked.loads_as_nvidia
    state = d.DriverState(packages=tuple(packages), packaged=unlinked)
    assert "libcuda1" in rules.load_fix(state)  # the fix for it (gpunode/rules.py)
    assert d.packaged_driver((), _debian_names(), linked) is None


@pytest.mark.parametrize("package_version, upstream", [
    ("535.309.01-0+deb12u1", "535.309.01"), ("535.261.03-1", "535.261.03"), ("3:580.95.05-1.el9", "580.95.05"),
    ("535.183.01-0ubuntu0.22.04.1", "535.183.01"), ("20220217+3~deb12u1", None), ("1.2.2", None)])
def test_upstream_version_of_a_package_version(package_version, upstream):
    assert d.upstream_version(package_version) == upstream


def test_open_flavour_comes_from_the_module_package_name():
    found = d.packaged_driver((("nvidia-open-kernel-dkms", "535.261.03-1"),), d.DebianNames(), {})
    assert found is not None and found.flavour == "open" and found.version == "535.261.03"


def test_offered_versions_from_apt_dnf_and_zypper():
    from gpunode.facts.driver import parse_offered

    apt = ("nvidia-kernel-dkms:\n  Installed: (none)\n  Candidate: 535.309.01-0+deb12u1\n  Version table:\n"
           "     535.309.01-0+deb12u1 500\n        500 http://deb.debian.org/debian-security bookworm-security/non-free "
           "amd64 Packages\n *** 535.261.03-1 500\n        500 http://deb.debian.org/debian bookworm/non-free "
           "amd64 Packages\n        100 /var/lib/dpkg/status\n")
    assert parse_offered(apt) == {"nvidia-kernel-dkms": ["535.309.01-0+deb12u1", "535.261.03-1"]}
    dnf = ("Available Packages\nkmod-nvidia-latest-dkms.x86_64      3:535.274.02-1.el9      cuda-rhel9-x86_64\n"
           "kmod-nvidia-latest-dkms.x86_64      3:570.195.03-1.el9      cuda-rhel9-x86_64\n")
    assert parse_offered(dnf) == {"kmod-nvidia-latest-dkms": ["535.274.02-1.el9", "570.195.03-1.el9"]}
    zypper = ("S | Name                      | Type    | Version     | Arch   | Repository\n"
              "--+---------------------------+---------+-------------+--------+-----------\n"
              "  | nvidia-compute-utils-G06  | package | 580.95.05-1 | x86_64 | cuda-sles15\n")
    assert parse_offered(zypper) == {"nvidia-compute-utils-G06": ["580.95.05-1"]}


def test_the_journal_says_which_driver_source_gpunode_installed():
    import json

    from gpunode.facts.driver import parse_gpunode_driver

    undo = [{"kind": "packages", "step": "driver", "manager": "apt",
             "installed": [["nvidia-kernel-dkms", "535.261.03-1"], ["libcuda1", "535.261.03-1"]]},
            {"kind": "driver", "step": "driver", "version": "535.261.03", "previous": None, "source": "packages"},
            {"kind": "packages", "step": "prerequisites", "manager": "apt", "installed": [["dkms", "3.0.10"]]}]
    found = parse_gpunode_driver(json.dumps({"runs": [], "undo": undo}))
    assert found.source == "packages" and found.packages == ("nvidia-kernel-dkms", "libcuda1") and found.run is None
    undone = [dict(r, undone="r2") for r in undo]
    assert parse_gpunode_driver(json.dumps({"runs": [], "undo": undone})).source == ""
    run = [{"kind": "driver", "step": "driver", "version": "535.129.03", "previous": None}]
    assert parse_gpunode_driver(json.dumps({"runs": [], "undo": run})).run == "535.129.03"
    assert parse_gpunode_driver("{broken") == parse_gpunode_driver("")
