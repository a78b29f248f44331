"""explain on the real texts of Debian's packaged NVIDIA driver without a GPU (tests/fixtures/real/debian-nvidia,
captured on the real-OS tier's nvidia VM): each gives its expected cause."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from gpunode.explain import explain

HERE = Path(__file__).resolve().parents[1] / "fixtures" / "real" / "debian-nvidia"
EXPECTED = list(csv.DictReader((HERE / "expected-explain.csv").open(encoding="utf-8", newline="")))


def flavours(name: str) -> list[Path]:
    """The captured files of a text: the proprietary flavour's under its name, the open flavour's with `_open`
    (tests/realos/test_debian12_nvidia.py fixture_name); texts only the open image produces exist only so."""
    stem, dot, ext = name.partition(".")
    return [p for p in (HERE / name, HERE / f"{stem}_open{dot}{ext}") if p.is_file()]


@pytest.mark.parametrize("row", EXPECTED, ids=[row["file"] for row in EXPECTED])
def test_each_real_text_is_recognised(row):
    files = flavours(row["file"])
    assert files, row["file"]
    for file in files:
        findings = explain(file.read_text(encoding="utf-8"))
        assert findings and findings[0].id == row["detector"], (file.name, [f.id for f in findings])


def test_the_install_hook_consequence_lines_are_not_findings_of_their_own():
    """kmod's three lines around Debian's install hook are one cause: the module found no device."""
    findings = explain((HERE / "modprobe-nvidia_with-libcuda1.txt").read_text(encoding="utf-8"))
    assert [f.id for f in findings] == ["debian.nvidia-current-no-device"]
    assert "nvidia_current" in findings[0].title


def test_persistenced_and_kernel_log_together_name_the_cause_not_the_symptom():
    text = "\n".join((HERE / name).read_text(encoding="utf-8") for name in
                     ("journal_nvidia-persistenced_no-gpu.txt", "dmesg_modprobe-nvidia_no-gpu.txt"))
    assert [f.id for f in explain(text)][0] == "kernel.no-nvidia-gpu"
