"""GPUs passed through to virtual machines: which hypervisor, its own fix for a GPU BAR the VM's firmware could
not place, and the host-side IOMMU set-up passthrough needs (data/passthrough.csv, a source per row). Read by doctor
(the node's DMI / systemd-detect-virt facts) and by explain (a hypervisor named in the pasted text)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from gpunode.compat import DataError, data_dir, read_table, source_field, text_field
from gpunode.record import Frozen


@dataclass(frozen=True, eq=False, repr=False)
class Hypervisor(Frozen):
    key: str  # vmware, kvm, microsoft, xen, cloud
    name: str  # as shown to people
    detect: tuple[str, ...]  # systemd-detect-virt --vm ids that mean this hypervisor
    evidence: re.Pattern[str]  # text in a log or paste that names it
    bar_fix: str  # how to give the VM room for the GPU's BARs
    iommu_fix: str  # on the host: the IOMMU (and interrupt remapping) passthrough needs
    source: str


def _ids(text: str) -> tuple[str, ...]:
    words = tuple(w.strip() for w in text.split(";") if w.strip())
    if not words or not all(re.fullmatch(r"[a-z0-9-]+", w) for w in words):
        raise ValueError(f"{text!r} is not a ';'-separated list of systemd-detect-virt ids")
    return words


def _regex(text: str) -> re.Pattern[str]:
    try:
        return re.compile(text, re.IGNORECASE)
    except re.error as exc:
        raise ValueError(f"not a regular expression: {exc}") from None


SCHEMA = {"hypervisor": text_field, "name": text_field, "detect": _ids, "evidence": _regex, "bar_fix": text_field,
          "iommu_fix": text_field, "source": source_field}


def load(text: str) -> tuple[Hypervisor, ...]:
    return tuple(Hypervisor(r["hypervisor"], r["name"], r["detect"], r["evidence"], r["bar_fix"], r["iommu_fix"],
                            r["source"])
                 for r in read_table(text, "passthrough.csv", SCHEMA, key="hypervisor"))


@lru_cache(maxsize=1)
def hypervisors() -> tuple[Hypervisor, ...]:
    try:
        text = (data_dir() / "passthrough.csv").read_text(encoding="utf-8")
    except OSError as exc:
        raise DataError(f"data/passthrough.csv cannot be read: {exc}",
                        fix="reinstall gpunode; the data tables ship inside the package") from None
    return load(text)


def by_virt(virt: str) -> Hypervisor | None:
    """The hypervisor systemd-detect-virt (or the DMI vendor mapped to its ids) names, None for none/unknown."""
    virt = virt.strip().lower()
    return next((h for h in hypervisors() if virt in h.detect), None)


def in_text(text: str) -> Hypervisor | None:
    """The hypervisor a log or paste names (the first row whose evidence it contains)."""
    return next((h for h in hypervisors() if h.evidence.search(text)), None)
