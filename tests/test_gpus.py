"""gpunode.gpus: PCI ids (checked against pci.ids), names, architectures and the kernel-module flavour."""

from __future__ import annotations

import pytest

from gpunode import gpus
from gpunode.errors import UsageError

# PCI device ids as pci.ids lists them (pciutils/pciids), with NVIDIA's compute capabilities.
KNOWN = [
    (0x1EB8, "Tesla T4", "Turing", "7.5"),
    (0x1DB1, "Tesla V100 SXM2 16GB", "Volta", "7.0"),
    (0x1DB5, "Tesla V100 SXM2 32GB", "Volta", "7.0"),
    (0x15F8, "Tesla P100 PCIe 16GB", "Pascal", "6.0"),
    (0x20B0, "A100 SXM4 40GB", "Ampere", "8.0"),
    (0x20B2, "A100 SXM4 80GB", "Ampere", "8.0"),
    (0x20B5, "A100 PCIe 80GB", "Ampere", "8.0"),
    (0x2236, "A10", "Ampere", "8.6"),
    (0x2237, "A10G", "Ampere", "8.6"),
    (0x27B8, "L4", "Ada Lovelace", "8.9"),
    (0x26B9, "L40S", "Ada Lovelace", "8.9"),
    (0x2330, "H100 SXM5 80GB", "Hopper", "9.0"),
    (0x2331, "H100 PCIe", "Hopper", "9.0"),
    (0x2321, "H100 NVL", "Hopper", "9.0"),
    (0x2335, "H200 SXM 141GB", "Hopper", "9.0"),
    (0x2901, "B200", "Blackwell", "10.0"),
    (0x2941, "GB200", "Blackwell", "10.0"),
    (0x2684, "GeForce RTX 4090", "Ada Lovelace", "8.9"),
    (0x2204, "GeForce RTX 3090", "Ampere", "8.6"),
    (0x1B82, "GeForce GTX 1070 Ti", "Pascal", "6.1"),
    (0x1C30, "Quadro P2000", "Pascal", "6.1"),
    (0x1E81, "GeForce RTX 2080 SUPER", "Turing", "7.5"),
    (0x102D, "Tesla K80", "Kepler", "3.7"),
]


@pytest.mark.parametrize("device, name, architecture, cc", KNOWN)
def test_known_pci_ids(device, name, architecture, cc):
    gpu = gpus.lookup_id(device)
    assert (gpu.name, gpu.architecture, gpu.compute_capability) == (name, architecture, cc)
    assert gpu.pci_id == f"10de:{device:04x}"


@pytest.mark.parametrize("form", [0x2330, "2330", "0x2330", "10de:2330", "10DE:2330", " 10de:2330 "])
def test_id_forms(form):
    assert gpus.lookup_id(form).name == "H100 SXM5 80GB"


def test_unknown_id_is_none():
    assert gpus.lookup_id(0xFFFF) is None and gpus.lookup_id("zz") is None


def ids(found):
    return {g.device_id for g in found}


@pytest.mark.parametrize("query, expected", [
    ("H100", {0x2330, 0x2331, 0x2321}),
    ("h100 sxm", {0x2330}),
    ("H100-PCIe", {0x2331}),
    ("A10", {0x2236}),  # not A100
    ("A100", {0x20B0, 0x20B1, 0x20B2, 0x20B5}),
    ("a100 80gb", {0x20B2, 0x20B5}),
    ("T4", {0x1EB8}),
    ("tesla t4", {0x1EB8}),
    ("B200", {0x2901, 0x2909}),  # a hex-looking name is still a name
    ("GB200", {0x2941}),
    ("RTX 4090", {0x2684}),
    ("rtx4090", {0x2684}),
    ("NVIDIA GeForce RTX 4090", {0x2684}),
    ("4090", {0x2684}),
    ("L40S", {0x26B9}),
    ("V100", {0x1DB1, 0x1DB5, 0x1DB4, 0x1DB6}),
    ("10de:2330", {0x2330}),
    ("2331", {0x2331}),
])
def test_find(query, expected):
    assert ids(gpus.find(query)) == expected


def test_unknown_name_lists_close_matches():
    with pytest.raises(UsageError) as exc:
        gpus.find("H1000")
    assert exc.value.exit_code == 2 and "unknown GPU 'H1000'" in exc.value.message
    assert "H100" in exc.value.fix


def test_unknown_pci_id_is_a_usage_error():
    with pytest.raises(UsageError) as exc:
        gpus.find("10de:ffff")
    assert "10de:ffff" in exc.value.message


# --- kernel-module flavour (nvidia_facts §4.1) ---------------------------------------------------------

@pytest.mark.parametrize("devices, driver, flavour, words", [
    ([0x2901], None, "open", "needs the open kernel module"),  # Blackwell
    ([0x2941, 0x2941], "580.65.06", "open", "GB200 (Blackwell) needs"),
    ([0x2342], "550.54.15", "open", "GH200"),  # Grace Hopper: open required
    ([0x1DB1], None, "proprietary", "cannot use the open kernel module"),  # Volta
    ([0x15F8], "535.129.03", "proprietary", "Pascal"),
    ([0x13F2], "470.256.02", "proprietary", "Maxwell"),
    ([0x1DB1, 0x1EB8], "570.124.06", "proprietary", "serves the whole mix"),  # mix -> proprietary, explained
    ([0x1EB8], "535.129.03", "proprietary", "R535 defaults to proprietary"),  # Turing before R560
    ([0x1EB8], "560.28.03", "open", "default from R560"),
    ([0x2330], None, "open", "open is recommended"),
    ([0x2330], "510.108.03", "proprietary", "ships only the proprietary module"),
    ([0x2901, 0x1DB1], "580.65.06", "conflict", "no single NVIDIA module drives both"),
    ([0x1DB1], "590.48.01", "proprietary", "R580 is the last"),
    (["10de:2330", "2331"], "570.124.06", "open", "H100 PCIe"),
])
def test_module_flavour(devices, driver, flavour, words):
    got, reason = gpus.module_flavour(devices, driver)
    assert got == flavour and words in reason, reason


@pytest.mark.parametrize("device, flavour, words", [
    (0x2B00, "open", "Blackwell or newer, by PCI id range"),  # not in the table
    (0x1C31, "proprietary", "pre-Turing"),
    (0x2182, "open", "Turing to Hopper"),
    (0x2345, "open", "self-hosted"),
])
def test_module_flavour_for_unknown_ids_uses_id_ranges(device, flavour, words):
    assert gpus.lookup_id(device) is None
    got, reason = gpus.module_flavour([device], "570.124.06")
    assert got == flavour and words in reason


def test_id_ranges_agree_with_the_table():
    # The range fallback must classify every GPU in the table the way the table does.
    for gpu in gpus.all_gpus():
        _, need = gpus.generation_for_id(gpu.device_id)
        assert need == gpu.open_module, gpu


def test_module_flavour_rejects_garbage():
    with pytest.raises(ValueError):
        gpus.module_flavour(["H100"], None)


@pytest.mark.parametrize("name, expected", [
    # as nvidia-smi --query-gpu=name prints them: vendor prefix, memory size and type, form factor, any order
    ("NVIDIA H100 80GB HBM3", ["H100 SXM5 80GB"]),
    ("NVIDIA A100-SXM4-40GB", ["A100 SXM4 40GB"]),
    ("NVIDIA A100 80GB PCIe", ["A100 PCIe 80GB"]),
    ("NVIDIA GeForce RTX 4090", ["GeForce RTX 4090"]),
    ("NVIDIA H100 NVL", ["H100 NVL"]),
    ("NVIDIA GH200 480GB", ["GH200 120GB / 480GB"]),
    ("Tesla V100-PCIE-32GB", ["Tesla V100 PCIe 32GB"]),
    # a variant the table lacks (another memory size) still names the model; the agreeing form factor wins
    ("NVIDIA A100 96GB PCIe", ["A100 PCIe 40GB", "A100 PCIe 80GB"]),
])
def test_find_reads_nvidia_smi_names(name, expected):
    assert [g.name for g in gpus.find(name)] == expected


def test_variant_words_never_turn_one_model_into_another():
    with pytest.raises(UsageError, match="unknown GPU"):
        gpus.find("NVIDIA A1000 80GB PCIe")  # not an A100, not an A10
    assert {g.name for g in gpus.find("A10 24GB")} == {"A10"}
