"""NVIDIA GPUs by PCI device id and by name, and the kernel-module flavour they need.

The table is data/gpus.csv (PCI ids checked against pci.ids; compute capabilities from NVIDIA's CUDA GPUs
list); the architecture of each GPU comes from its compute capability in data/gpu_architectures.csv.

`module_flavour` implements nvidia_facts §4.1: Blackwell and Grace Hopper need the open kernel modules,
Maxwell/Pascal/Volta cannot use them, Turing to Hopper can use either (open is the installer's default from
R560). GPUs missing from the table are placed by PCI device-id range (derived from pci.ids, see
`generation_for_id`), and say so.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

from gpunode import compat
from gpunode.compat import Architecture, Tables, Version
from gpunode.errors import UsageError
from gpunode.record import Frozen

NVIDIA_VENDOR = 0x10DE

OPEN_DEFAULT_FROM = 560  # nvidia-installer defaults to the open modules from 560.28.03
BOTH_FLAVOURS_FROM = 515  # the .run ships both flavours from R515


@dataclass(frozen=True, eq=False, repr=False)
class Gpu(Frozen):
    device_id: int  # 0x2330
    name: str  # "H100 SXM5 80GB"
    aliases: tuple[str, ...]
    pci_ids_name: str  # as pci.ids has it: "GH100 [H100 SXM5 80GB]"
    compute_capability: str  # "9.0"
    architecture: str  # "Hopper"
    segment: str  # datacenter | workstation | geforce
    open_module: str  # required | supported | unsupported
    source: str

    @property
    def pci_id(self) -> str:
        return f"10de:{self.device_id:04x}"

    def to_dict(self) -> dict[str, object]:
        return {"pci_id": self.pci_id, "name": self.name, "architecture": self.architecture,
                "compute_capability": self.compute_capability, "segment": self.segment,
                "open_module": self.open_module}


def _build(t: Tables) -> tuple[Gpu, ...]:
    archs = {a.compute_capability: a for a in t.architectures}
    gpus = []
    for row in t.gpus:
        arch = archs[row["compute_capability"]]
        aliases = tuple(a.strip() for a in (row["aliases"] or "").split(";") if a.strip())
        gpus.append(Gpu(row["pci_id"], row["name"], aliases, row["pci_ids_name"], row["compute_capability"],
                        arch.name, row["segment"], row["open_module"] or arch.open_module, row["source"]))
    return tuple(gpus)


@lru_cache(maxsize=1)
def all_gpus() -> tuple[Gpu, ...]:
    return _build(compat.tables())


def parse_device_id(value: int | str) -> int | None:
    """0x2330, "2330", "0x2330", "10de:2330" -> 0x2330; None when the text is not a PCI id."""
    if isinstance(value, int):
        return value
    text = value.strip().lower()
    match = re.fullmatch(r"(?:10de:)?(?:0x)?([0-9a-f]{4})", text)
    return int(match[1], 16) if match else None


def lookup_id(device: int | str, gpus: Iterable[Gpu] | None = None) -> Gpu | None:
    device_id = parse_device_id(device)
    if device_id is None:
        return None
    return next((g for g in (gpus if gpus is not None else all_gpus()) if g.device_id == device_id), None)


_VENDOR_WORDS = ("nvidia", "tesla", "geforce", "quadro")


def _norm(text: str) -> str:
    text = text.lower()
    for word in _VENDOR_WORDS:
        text = re.sub(rf"\b{word}\b", " ", text)
    return re.sub(r"[^a-z0-9]", "", text)


# Words in a product name that describe a variant, not the model: memory size, memory type, form factor.
# nvidia-smi writes them in its own order ("NVIDIA H100 80GB HBM3", "NVIDIA A100 80GB PCIe").
_DESCRIPTORS = (
    ("memory", re.compile(r"^\d+(?:g|gb|gib)$")),
    ("memory type", re.compile(r"^(?:hbm\d*e?|gddr\d+x?)$")),
    ("form factor", re.compile(r"^(?:pcie|sxm\d*|nvl|oam|mezzanine)$")),
)


def _parts(text: str) -> tuple[str, dict[str, set[str]]]:
    """A product name -> (model key, descriptors by kind). 'NVIDIA H100 80GB HBM3' -> ('h100', {memory: {80gb},
    memory type: {hbm3}}). Vendor words are dropped; sizes like 80G and 80GB compare equal; SXM5 is an SXM."""
    core: list[str] = []
    found: dict[str, set[str]] = {}
    for token in re.split(r"[^a-z0-9]+", text.lower()):
        if not token or token in _VENDOR_WORDS:
            continue
        kind = next((k for k, pattern in _DESCRIPTORS if pattern.match(token)), None)
        if kind is None:
            core.append(token)
        else:
            value = re.sub(r"(?:gb|gib)$", "g", token) if kind == "memory" else token
            found.setdefault(kind, set()).add("sxm" if value.startswith("sxm") else value)
    return "".join(core), found


def _by_variant(key: str, wanted: dict[str, set[str]], pool: tuple[Gpu, ...]) -> list[Gpu]:
    """GPUs of the model `key`, best variant first: those whose descriptors agree most with the query's and
    contradict none of them. A query variant the table lacks (another memory size) still names the model."""
    scored: list[tuple[int, Gpu]] = []
    for g in pool:
        labels = [_parts(n) for n in (g.name, *g.aliases)]
        if not any(core == key for core, _ in labels):
            continue
        have: dict[str, set[str]] = {}
        for _, found in [*labels, _parts(g.pci_ids_name.partition("[")[2])]:
            for kind, values in found.items():
                have.setdefault(kind, set()).update(values)
        agree = sum(1 for kind in wanted if wanted[kind] & have.get(kind, set()))
        conflicts = sum(1 for kind in wanted if kind in have and not wanted[kind] & have[kind])
        scored.append((agree - 100 * conflicts, g))
    if not scored:
        return []
    best = max(score for score, _ in scored)
    return [g for score, g in scored if score == best]


def find(query: str, gpus: Iterable[Gpu] | None = None) -> list[Gpu]:
    """GPUs matching a name ("H100", "rtx 4090", "Tesla T4", "NVIDIA H100 80GB HBM3") or a PCI id
    ("10de:2330", "2330").

    Name matching is case-insensitive and ignores spaces, dashes and the words NVIDIA/Tesla/GeForce/Quadro;
    a name matches a GPU's name or one of its aliases exactly ("A10" is not "A100"). Failing that, the name is
    read as nvidia-smi and lspci print it: the model plus variant words (memory size, memory type, form
    factor) in any order; the variant that agrees best is returned. No match is a UsageError that lists close
    names."""
    pool = tuple(gpus if gpus is not None else all_gpus())
    text = (query or "").strip()
    if not text:
        raise UsageError("--gpu needs a GPU name or PCI id", fix="e.g. --gpu H100 or --gpu 10de:2330")
    explicit_pci = text.lower().startswith(("10de:", "0x"))
    device_id = parse_device_id(text) if explicit_pci or re.fullmatch(r"[0-9a-fA-F]{4}", text) else None
    if explicit_pci and device_id is None:
        raise UsageError(f"--gpu {query!r} is not a PCI id", fix="use the form 10de:2330 or 2330")
    if device_id is not None:
        found = [g for g in pool if g.device_id == device_id]
        if found:
            return found
        if explicit_pci:
            raise UsageError(f"PCI id 10de:{device_id:04x} is not in gpunode's GPU table",
                             fix="`lspci -nn -d 10de:` shows the GPU's name; try --gpu with that name")
    key = _norm(text)
    found = [g for g in pool if key in {_norm(g.name), *(_norm(a) for a in g.aliases)}]
    if found:
        return found
    model, wanted = _parts(text)
    found = _by_variant(model, wanted, pool) if model else []
    if found:
        return found
    names = sorted({n for g in pool for n in (g.name, *g.aliases)})
    by_norm = {_norm(n): n for n in names}
    close = [by_norm[n] for n in difflib.get_close_matches(key, list(by_norm), n=6, cutoff=0.5)]
    close += [n for n in names if key and key in _norm(n) and n not in close][: 6 - len(close)]
    fix = ("close matches: " + ", ".join(close)) if close else ("known GPUs: " + ", ".join(
        sorted({g.aliases[0] if g.aliases else g.name for g in pool})))
    raise UsageError(f"unknown GPU {query!r}", fix=fix)


# ---------------------------------------------------------------------------------------------------------
# Kernel-module flavour
# ---------------------------------------------------------------------------------------------------------

# NVIDIA GPU device-id ranges by generation, read off pci.ids (pciutils/pciids @006181e2): every display
# device below 0x1e00 is Volta or older; 0x1e00-0x28ff is Turing, Ampere, Hopper and Ada; 0x2900 and up is
# Blackwell and newer. nvidia-installer forces the open module for Grace Hopper at 0x2340-0x237f.
_SELF_HOSTED = ((0x2340, 0x237F), (0x2940, 0x297F), (0x31C0, 0x31FF), (0x31A1, 0x31A1))


def generation_for_id(device_id: int) -> tuple[str, str]:
    """(generation label, open-module need) for a device id missing from the table; derived from ranges."""
    if any(lo <= device_id <= hi for lo, hi in _SELF_HOSTED):
        return "a self-hosted (Grace) GPU", "required"
    if device_id < 0x1E00:
        return "pre-Turing (Volta or older)", "unsupported"
    if device_id < 0x2900:
        return "Turing to Hopper", "supported"
    return "Blackwell or newer", "required"


@dataclass(frozen=True, eq=False, repr=False)
class _Placed(Frozen):
    device_id: int
    label: str  # "H100 SXM5 80GB (Hopper)" or "10de:2b00 (Blackwell or newer, by PCI id range)"
    open_module: str


def _place(device: int | str) -> _Placed:
    device_id = parse_device_id(device)
    if device_id is None:
        raise ValueError(f"{device!r} is not a PCI device id")
    gpu = lookup_id(device_id)
    if gpu is not None:
        return _Placed(device_id, f"{gpu.name} ({gpu.architecture})", gpu.open_module)
    label, need = generation_for_id(device_id)
    return _Placed(device_id, f"10de:{device_id:04x} ({label}, by PCI id range)", need)


def _names(placed: list[_Placed]) -> str:
    seen: list[str] = []
    for p in placed:
        if p.label not in seen:
            seen.append(p.label)
    return ", ".join(seen)


def _verb(placed: list[_Placed], one: str, many: str) -> str:
    return one if len({p.label for p in placed}) == 1 else many


def module_flavour(device_ids: Iterable[int | str], driver_version: str | Version | None = None) -> tuple[str, str]:
    """Which NVIDIA kernel module to install for these GPUs: ("open" | "proprietary" | "conflict", reason).

    - Blackwell and Grace Hopper need the open module; Maxwell, Pascal and Volta cannot use it.
    - A mix of pre-Turing and Turing-or-newer GPUs gets the proprietary module (it drives both).
    - A mix that needs open *and* proprietary is a "conflict": no single module drives all of them.
    - Turing to Hopper: open from R560 (the installer's default), proprietary before (both flavours ship
      from R515; before R515 only proprietary exists).
    `driver_version` is the driver to install (None: a current one)."""
    placed = [_place(d) for d in device_ids]
    branch = None
    if driver_version is not None:
        version = driver_version if isinstance(driver_version, Version) else compat.parse_driver(str(driver_version))
        branch = compat.branch_of(version)
    need_open = [p for p in placed if p.open_module == "required"]
    no_open = [p for p in placed if p.open_module == "unsupported"]
    either = [p for p in placed if p.open_module == "supported"]
    if need_open and no_open:
        return "conflict", (f"{_names(need_open)} {_verb(need_open, 'needs', 'need')} the open kernel module and "
                            f"{_names(no_open)} cannot use it: no single NVIDIA module drives both; put these GPUs "
                            "in different nodes")
    if need_open:
        reason = f"{_names(need_open)} {_verb(need_open, 'needs', 'need')} the open kernel module"
        if branch is not None and branch < BOTH_FLAVOURS_FROM:
            reason += f"; R{branch} has no open module (it ships from R{BOTH_FLAVOURS_FROM})"
        return "open", reason
    if no_open:
        reason = f"{_names(no_open)} cannot use the open kernel module (it needs Turing or newer)"
        if either:
            reason += f"; the proprietary module also drives {_names(either)}, so it serves the whole mix"
        if branch is not None and branch > 580:
            reason += f"; note that R{branch} no longer supports Maxwell, Pascal or Volta (R580 is the last)"
        return "proprietary", reason
    what = _names(either) if either else "no NVIDIA GPU"
    if branch is None or branch >= OPEN_DEFAULT_FROM:
        where = "a current driver" if branch is None else f"R{branch}"
        return "open", (f"{what}: either module works; open is recommended and nvidia-installer's default from "
                        f"R{OPEN_DEFAULT_FROM} ({where})")
    if branch < BOTH_FLAVOURS_FROM:
        return "proprietary", f"{what}: R{branch} ships only the proprietary module"
    return "proprietary", (f"{what}: either module works; R{branch} defaults to proprietary (open is the default "
                           f"from R{OPEN_DEFAULT_FROM})")


def architecture_of(gpu: Gpu) -> Architecture:
    arch = compat.architecture_for(gpu.compute_capability)
    assert arch is not None  # load_tables checks every GPU's compute capability
    return arch
