"""Recognise error messages people paste (docker, nvidia-container-cli, nvidia-smi, nvidia-installer, the kernel
log, fabric manager, CUDA programs) and say what caused them and what to run.

Pure: no I/O besides reading gpunode's own data tables. `normalise(text)` cleans a paste (gpunode.explain.normalise);
`explain(text)` returns one `Finding` per recognised problem, the strongest evidence first, each quoting the line
that proved it. Unknown text gives an empty list.

What is recognised is data: data/explain_detectors.csv, data/installer_failures.csv and data/xid.csv, one row per
cause with its source (gpunode.explain.tables); code only where a finding needs more than its row
(gpunode.explain.hooks, gpunode.explain.xid), chiefly a decisive line elsewhere in the same paste that refines the
headline's cause (the finding then quotes both lines). data/explain_catalogue.csv lists what each component
(nvidia-container-cli, NVML, CUDA, PyTorch/TensorFlow/JAX, the kernel, Kubernetes, ...) can print, with its source;
tests/explain/test_catalogue.py requires every catalogued message to be recognised. Lines no row explains go to the
generic layer (gpunode.explain.generic): an error code, a catalogued message in other words, or a component named
beside a generic error (permission denied, not found, ...) gives a weaker finding whose title says it is generic.

Finding ids are stable (scripts may match on them): `docker.no-gpu-driver`, `cuda.requirement`, `xid.79`, ...
`IDS` lists every fixed id; Xid and SXid findings are `xid.<N>` and `sxid.<N>`.
"""

from __future__ import annotations

from typing import Any

from gpunode.explain.engine import explain
from gpunode.explain.finding import Finding
from gpunode.explain.normalise import normalise
from gpunode.explain.tables import ids, tables
from gpunode.explain.xid import SEVERITY_TEXT, XID_CATALOG_URL

__all__ = ["IDS", "SEVERITY_TEXT", "XIDS", "XID_CATALOG_URL", "Finding", "explain", "installer_failure", "normalise"]


def installer_failure(text: str) -> tuple[str, str] | None:
    """(what went wrong, the command to run) for a failed NVIDIA driver install, from the installer's output and its
    log tail (any wrapping), or None when nothing in it is recognised. Uses every explain table, so a kernel message
    in the log (an unsupported GPU, Secure Boot, a DKMS build failure) is named rather than the installer's summary."""
    findings = explain(text)
    if not findings:
        return None
    first = findings[0]
    return f"{first.title}: {first.cause}", first.fix


def __getattr__(name: str) -> Any:  # the tables are read on first use, not at import
    if name == "IDS":
        return ids()
    if name == "XIDS":
        return dict(tables()[1])
    raise AttributeError(name)
