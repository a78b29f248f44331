"""CUDA / driver / GPU-architecture compatibility, from NVIDIA's own tables.

The tables live in data/ (shipped in the wheel as gpunode/data/); every row names its source:

    compat_matrix.csv            CUDA toolkit release -> minimum Linux driver (release notes, Table 3)
    cuda_minor_compat.csv        CUDA major -> minimum driver for minor-version compatibility (Table 2)
    gpu_architectures.csv        compute capability -> architecture, first/last CUDA, last driver branch,
                                 open kernel-module support
    driver_branches.csv          driver branch -> LTSB / production / new-feature, end of life, latest known
    cuda_image_requirements.csv  nvidia/cuda image -> the forward-compatibility clauses of NVIDIA_REQUIRE_CUDA
    verify_images.csv            nvidia/cuda base tags `verify` may run
    gpus.csv                     PCI device id -> GPU (read by gpunode.gpus)

Every table is read through one schema check: a malformed row is a `DataError` naming the file and line.
Versions are compared with `packaging`. Nothing here touches a node: all functions are pure queries.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import date
from functools import lru_cache
from typing import Any

from packaging.version import InvalidVersion, Version

from gpunode import fixes
from gpunode.datatables import (
    DataError,
    Parser,
    choice_field,
    data_dir,
    optional_field,
    read_table,
    source_field,
    text_field,
)
from gpunode.errors import GpunodeError, UsageError
from gpunode.record import Frozen
from gpunode.versions import BRANCH_EXACT, Ver, branch_of, parse_driver

# re-exported: callers ask compat for the grammar, and for the loader of its tables (gpunode/datatables.py), too
__all__ = ["DataError", "Ver", "branch_of", "choice_field", "data_dir", "optional_field", "parse_driver",
           "read_table", "source_field", "text_field"]

# ---------------------------------------------------------------------------------------------------------
# Errors and small parsers
# ---------------------------------------------------------------------------------------------------------


class CompatError(GpunodeError):
    """A question the tables cannot answer (for example no verify image for a very old driver)."""


_CUDA_RE = re.compile(r"^\d{1,2}\.\d{1,2}(\.\d{1,3})?$")
_CC_RE = re.compile(r"^\d{1,2}\.\d$")


def parse_cuda(text: str, what: str = "--cuda") -> str:
    """A CUDA version as MAJOR.MINOR or MAJOR.MINOR.PATCH (a leading 'cuda' or 'v' is accepted)."""
    value = (text or "").strip().lower()
    for prefix in ("cuda-", "cuda", "v"):
        if value.startswith(prefix) and value[len(prefix):][:1].isdigit():
            value = value[len(prefix):]
            break
    if not _CUDA_RE.match(value):
        raise UsageError(f"{what} {text!r} is not a CUDA version",
                         fix="use MAJOR.MINOR or MAJOR.MINOR.PATCH, e.g. 12.4 or 12.4.1")
    return value


def major_minor(version: Version) -> str:
    release = (*version.release, 0)
    return f"{release[0]}.{release[1]}"


def _mm(version: Version) -> tuple[int, int]:
    release = (*version.release, 0)
    return release[0], release[1]


# ---------------------------------------------------------------------------------------------------------
# Table rows
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False, repr=False)
class CudaRelease(Frozen):
    version: Version  # 12.4.1
    release: str  # "CUDA 12.4 Update 1"
    min_driver: Version | None  # None: NVIDIA's minimum is not known (13.4.x)
    source: str
    note: str = ""

    @property
    def major(self) -> int:
        return self.version.release[0]

    @property
    def series(self) -> str:  # "12.4"
        return major_minor(self.version)

    def to_dict(self) -> dict[str, object]:
        return {"version": str(self.version), "release": self.release,
                "min_driver": str(self.min_driver) if self.min_driver else None, "source": self.source,
                "note": self.note or None}


@dataclass(frozen=True, eq=False, repr=False)
class MinorCompat(Frozen):
    major: int
    min_driver: Version
    source: str
    note: str = ""


@dataclass(frozen=True, eq=False, repr=False)
class Architecture(Frozen):
    compute_capability: str  # "9.0"
    name: str  # "Hopper"
    first_cuda: Version
    last_cuda: Version | None  # None: still supported by the newest CUDA
    last_driver_branch: int | None  # None: supported by current branches
    open_module: str  # required | supported | unsupported
    source: str

    @property
    def cc_version(self) -> Version:
        return Ver(self.compute_capability)


@dataclass(frozen=True, eq=False, repr=False)
class Branch(Frozen):
    branch: int
    type: str  # lts | production | new-feature
    end_of_life: str  # YYYY-MM, or "" when not recorded
    latest_known: Version | None
    source: str
    note: str = ""

    TYPE_LABELS = {"lts": "LTSB", "production": "production branch", "new-feature": "new feature branch"}

    @property
    def label(self) -> str:
        return self.TYPE_LABELS.get(self.type, self.type)

    def status(self, today: date | None = None) -> str:
        """supported | end-of-life | unknown, as of `today`."""
        if not self.end_of_life:
            return "unknown"
        year, month = (int(p) for p in self.end_of_life.split("-"))
        today = today or _today()
        return "end-of-life" if (today.year, today.month) > (year, month) else "supported"

    def to_dict(self, today: date | None = None) -> dict[str, object]:
        return {"branch": self.branch, "type": self.type, "end_of_life": self.end_of_life or None,
                "status": self.status(today), "latest_known": str(self.latest_known) if self.latest_known else None}


@dataclass(frozen=True, eq=False, repr=False)
class ImageRequirement(Frozen):
    cuda_version: Version
    branches: tuple[int, ...]
    brands: tuple[str, ...]
    source: str

    def condition(self) -> str:
        """NVIDIA_REQUIRE_CUDA as NVIDIA writes it: cuda>=X.Y, then one clause per branch and brand."""
        terms = [f"cuda>={major_minor(self.cuda_version)}"]
        for branch in self.branches:
            terms += [f"brand={brand},driver>={branch},driver<{branch + 1}" for brand in self.brands]
        return " ".join(terms)


@dataclass(frozen=True, eq=False, repr=False)
class VerifyImage(Frozen):
    image: str
    cuda_version: Version
    source: str


@dataclass(frozen=True, eq=False, repr=False)
class Tables(Frozen):
    releases: tuple[CudaRelease, ...]
    minor_compat: Mapping[int, MinorCompat]
    architectures: tuple[Architecture, ...]
    branches: Mapping[int, Branch]
    image_requirements: Mapping[Version, ImageRequirement]
    verify_images: tuple[VerifyImage, ...]
    gpus: tuple[dict[str, Any], ...]  # raw checked rows of gpus.csv; gpunode.gpus builds its records


# ---------------------------------------------------------------------------------------------------------
# Loading with a schema check
# ---------------------------------------------------------------------------------------------------------

def _version(text: str) -> Version:
    try:
        return Ver(text)
    except InvalidVersion:
        raise ValueError(f"{text!r} is not a version") from None


def _cuda_version(text: str) -> Version:
    if not _CUDA_RE.match(text):
        raise ValueError(f"{text!r} is not a CUDA version (MAJOR.MINOR[.PATCH])")
    return Ver(text)


def _driver_version(text: str) -> Version:
    if not re.match(r"^\d{3}(\.\d{1,3}){0,2}$", text):
        raise ValueError(f"{text!r} is not a driver version")
    return Ver(text)


def _int(text: str) -> int:
    if not text.isdigit():
        raise ValueError(f"{text!r} is not a whole number")
    return int(text)


def _branch(text: str) -> int:
    if not BRANCH_EXACT.match(text):
        raise ValueError(f"{text!r} is not a driver branch (three digits, e.g. 535)")
    return int(text)


def _month(text: str) -> str:
    if not re.match(r"^\d{4}-(0[1-9]|1[0-2])$", text):
        raise ValueError(f"{text!r} is not a month (YYYY-MM)")
    return text


def _cc(text: str) -> str:
    if not _CC_RE.match(text):
        raise ValueError(f"{text!r} is not a compute capability (e.g. 8.6)")
    return text


def _pci_id(text: str) -> int:
    if not re.match(r"^[0-9a-f]{4}$", text):
        raise ValueError(f"{text!r} is not a 4-digit lowercase hex PCI device id")
    return int(text, 16)


def _branch_list(text: str) -> tuple[int, ...]:
    return tuple(_branch(part) for part in text.split(";"))


def _word_list(text: str) -> tuple[str, ...]:
    words = tuple(part.strip() for part in text.split(";"))
    if not all(re.match(r"^[a-z]+$", w) for w in words):
        raise ValueError(f"{text!r} is not a ';'-separated list of lowercase words")
    return words


SCHEMAS: dict[str, dict[str, Parser]] = {
    "compat_matrix.csv": {"cuda_version": _cuda_version, "release": text_field, "min_driver_linux": optional_field(_driver_version),
                          "source": source_field, "note": optional_field(text_field)},
    "cuda_minor_compat.csv": {"cuda_major": _int, "min_driver_linux": _driver_version, "source": source_field,
                              "note": optional_field(text_field)},
    "gpu_architectures.csv": {"compute_capability": _cc, "architecture": text_field, "first_cuda": _cuda_version,
                              "last_cuda": optional_field(_cuda_version), "last_driver_branch": optional_field(_branch),
                              "open_module": choice_field("required", "supported", "unsupported"), "source": source_field},
    "driver_branches.csv": {"branch": _branch, "type": choice_field("lts", "production", "new-feature"),
                            "end_of_life": optional_field(_month), "latest_known": optional_field(_driver_version),
                            "source": source_field, "note": optional_field(text_field)},
    "cuda_image_requirements.csv": {"cuda_version": _cuda_version, "forward_compat_branches": _branch_list,
                                    "brands": _word_list, "source": source_field},
    "verify_images.csv": {"image": text_field, "cuda_version": _cuda_version, "source": source_field},
    "gpus.csv": {"pci_id": _pci_id, "name": text_field, "aliases": optional_field(text_field), "pci_ids_name": text_field,
                 "compute_capability": _cc, "segment": choice_field("datacenter", "workstation", "geforce"),
                 "open_module": optional_field(choice_field("required", "supported", "unsupported")), "source": source_field},
}
KEYS = {"compat_matrix.csv": "cuda_version", "cuda_minor_compat.csv": "cuda_major",
        "gpu_architectures.csv": "compute_capability", "driver_branches.csv": "branch",
        "cuda_image_requirements.csv": "cuda_version", "verify_images.csv": "image", "gpus.csv": "pci_id"}


def load_tables(directory: Any = None) -> Tables:
    """Read and check every table (uncached; `tables()` is the cached form for the shipped data)."""
    directory = directory if directory is not None else data_dir()

    def rows(name: str) -> list[dict[str, Any]]:
        try:
            text = (directory / name).read_text(encoding="utf-8")
        except (FileNotFoundError, OSError) as exc:
            raise DataError(f"data/{name} cannot be read: {exc}",
                            fix="reinstall gpunode; the data tables ship inside the package") from None
        return read_table(text, name, SCHEMAS[name], KEYS.get(name))

    releases = tuple(sorted(
        (CudaRelease(r["cuda_version"], r["release"], r["min_driver_linux"], r["source"], r["note"] or "")
         for r in rows("compat_matrix.csv")), key=lambda r: r.version))
    minor = {r["cuda_major"]: MinorCompat(r["cuda_major"], r["min_driver_linux"], r["source"], r["note"] or "")
             for r in rows("cuda_minor_compat.csv")}
    archs = tuple(sorted(
        (Architecture(r["compute_capability"], r["architecture"], r["first_cuda"], r["last_cuda"],
                      r["last_driver_branch"], r["open_module"], r["source"])
         for r in rows("gpu_architectures.csv")), key=lambda a: a.cc_version))
    branches = {r["branch"]: Branch(r["branch"], r["type"], r["end_of_life"] or "", r["latest_known"], r["source"],
                                    r["note"] or "") for r in rows("driver_branches.csv")}
    requirements = {r["cuda_version"]: ImageRequirement(r["cuda_version"], r["forward_compat_branches"], r["brands"],
                                                        r["source"]) for r in rows("cuda_image_requirements.csv")}
    verify = tuple(sorted((VerifyImage(r["image"], r["cuda_version"], r["source"]) for r in rows("verify_images.csv")),
                          key=lambda v: v.cuda_version))
    for v in verify:
        if parse_image(v.image).cuda != v.cuda_version:
            raise DataError(f"data/verify_images.csv: {v.image} does not carry CUDA {v.cuda_version}")
    gpus = tuple(rows("gpus.csv"))
    known_cc = {a.compute_capability for a in archs}
    for g in gpus:
        if g["compute_capability"] not in known_cc:
            raise DataError(f"data/gpus.csv line {g['_line']}: compute capability {g['compute_capability']} "
                            "is not in data/gpu_architectures.csv")
    return Tables(releases, minor, archs, branches, requirements, verify, gpus)


@lru_cache(maxsize=1)
def tables() -> Tables:
    """The shipped tables, checked once per process."""
    return load_tables()


def _today() -> date:
    return date.today()


# ---------------------------------------------------------------------------------------------------------
# Queries: driver -> CUDA
# ---------------------------------------------------------------------------------------------------------

MINOR_COMPAT_LIMITS = (
    "PTX JIT: PTX built by a newer toolkit is not compiled by an older driver; it needs that toolkit's own "
    "minimum driver (ship SASS for the GPU instead)",
    "APIs added after the driver's own CUDA version can fail with cudaErrorCallRequiresNewerDriver",
    "below the minor-version floor the CUDA runtime fails with cudaErrorInsufficientDriver",
)


@dataclass(frozen=True, eq=False, repr=False)
class DriverQuery(Frozen):
    """What `compat --driver` answers for: a release, or the newest known release of a branch asked for by its
    number (people ask by branch: `--driver 535`)."""
    version: Ver
    branch_asked: int | None  # 535 when the question was `--driver 535`
    beyond_latest_known: bool  # a release newer than the newest one of its branch in driver_branches.csv


def _with_release(t: Tables) -> str:
    return ", ".join(str(b) for b in sorted(t.branches) if t.branches[b].latest_known)


def known_branches(t: Tables | None = None) -> frozenset[int]:
    """The driver branches gpunode's tables name: driver_branches.csv and the branches of every minimum driver
    in compat_matrix.csv and cuda_minor_compat.csv (the old ones, 346 to 440, are only there)."""
    t = t or tables()
    drivers = [r.min_driver for r in t.releases] + [m.min_driver for m in t.minor_compat.values()]
    return frozenset(t.branches) | {branch_of(d) for d in drivers if d is not None}


def driver_query(text: str, t: Tables | None = None) -> DriverQuery:
    """`--driver` as compat reads it. A branch resolves to its newest known release; a version whose branch no
    table names is bad input (exit 2) rather than an answer made up from neighbouring rows."""
    t = t or tables()
    value = (text or "").strip()
    newest = max(t.branches)
    if BRANCH_EXACT.match(value):
        branch = t.branches.get(int(value))
        if branch is None or branch.latest_known is None:
            raise UsageError(f"--driver {value}: gpunode knows no release of branch R{value}",
                             fix=fixes.gpunode("compat", driver=newest) + "  # or a full version, or another branch "
                                 f"with a known release: {_with_release(t)}")
        return DriverQuery(Ver(str(branch.latest_known)), branch.branch, False)
    version = parse_driver(value)
    if branch_of(version) not in known_branches(t):
        later = f"; a branch after R{newest} needs a newer gpunode" if branch_of(version) > newest else ""
        raise UsageError(f"--driver {value}: R{branch_of(version)} is not an NVIDIA driver branch gpunode knows"
                         f"{later}",
                         fix=fixes.gpunode("compat", driver=newest) + "  # or another branch with a known release: "
                             f"{_with_release(t)}")
    row = t.branches.get(branch_of(version))
    beyond = row is not None and row.latest_known is not None and version > row.latest_known
    return DriverQuery(version, None, beyond)


def native_release(driver: Version | str, t: Tables | None = None) -> CudaRelease | None:
    """The newest CUDA release whose minimum driver the given driver meets (None: older than every row)."""
    t = t or tables()
    version = driver if isinstance(driver, Version) else parse_driver(str(driver))
    best = None
    for release in t.releases:
        if release.min_driver is not None and release.min_driver <= version:
            best = release
    return best


def cuda_reported_by(driver: Version | str, t: Tables | None = None) -> Version | None:
    """The CUDA version (MAJOR.MINOR) the driver reports, as `nvidia-smi` and NVIDIA_REQUIRE_CUDA see it."""
    release = native_release(driver, t)
    return Ver(release.series) if release else None


def series_min_driver(series: str, t: Tables | None = None) -> Version | None:
    """The lowest driver that reports CUDA `series` (12.4 -> 550.54.14): the minimum of its releases."""
    t = t or tables()
    mins = [r.min_driver for r in t.releases if r.series == series and r.min_driver is not None]
    return min(mins) if mins else None


@dataclass(frozen=True, eq=False, repr=False)
class MinorRange(Frozen):
    major: int
    min_driver: Version
    first: str  # "12.3"
    last: str  # "12.9"

    def to_dict(self) -> dict[str, object]:
        return {"major": self.major, "min_driver": str(self.min_driver), "cuda_range": [self.first, self.last]}


def minor_compat_ranges(driver: Version | str, t: Tables | None = None) -> list[MinorRange]:
    """The CUDA releases this driver runs only through minor-version compatibility (beyond its native one)."""
    t = t or tables()
    version = driver if isinstance(driver, Version) else parse_driver(str(driver))
    native = native_release(version, t)
    native_mm = _mm(native.version) if native else (0, 0)
    ranges = []
    for major, floor in sorted(t.minor_compat.items()):
        if floor.min_driver > version:
            continue
        series = sorted({_mm(r.version) for r in t.releases if r.major == major and _mm(r.version) > native_mm})
        if series:
            first, last = series[0], series[-1]
            ranges.append(MinorRange(major, floor.min_driver, f"{first[0]}.{first[1]}", f"{last[0]}.{last[1]}"))
    return ranges


# ---------------------------------------------------------------------------------------------------------
# Queries: CUDA -> driver
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False, repr=False)
class CudaNeed(Frozen):
    cuda: str  # as asked, normalised: "12.4" or "12.4.1"
    releases: tuple[CudaRelease, ...]
    native_min: Version | None  # None: NVIDIA's minimum is not known
    minor_compat_min: Version | None  # None: no minor-version compatibility for this major (before CUDA 11)

    @property
    def major(self) -> int:
        return self.releases[0].major

    @property
    def series(self) -> str:
        return self.releases[0].series

    def to_dict(self) -> dict[str, object]:
        return {"version": self.cuda, "releases": [r.to_dict() for r in self.releases],
                "native_min_driver": str(self.native_min) if self.native_min else None,
                "minor_compat_min_driver": str(self.minor_compat_min) if self.minor_compat_min else None}


def driver_needed_for_cuda(version: str, t: Tables | None = None) -> CudaNeed:
    """Minimum drivers for a CUDA version: natively, and through minor-version compatibility.

    `12.4` covers every 12.4.x release (the lowest minimum: a driver reporting CUDA 12.4); `12.4.1` that
    release only. Unknown or malformed versions are a UsageError naming the value."""
    t = t or tables()
    cuda = parse_cuda(version)
    wanted = Ver(cuda)
    exact = len(wanted.release) == 3
    releases = tuple(r for r in t.releases if (r.version == wanted if exact else _mm(r.version) == _mm(wanted)))
    if not releases:
        same_major = sorted({r.series for r in t.releases if r.major == wanted.release[0]}, key=Version)
        same_series = [str(r.version) for r in t.releases if _mm(r.version) == _mm(wanted)]
        if same_series:
            fix = f"known CUDA {major_minor(wanted)} releases: {', '.join(same_series)}"
        elif same_major:
            fix = f"known CUDA {wanted.release[0]}.x releases: {', '.join(same_major)}"
        else:
            fix = f"known CUDA versions: {t.releases[0].series} to {t.releases[-1].series}"
        raise UsageError(f"CUDA {cuda} is not a CUDA toolkit release in gpunode's table", fix=fix)
    mins = [r.min_driver for r in releases if r.min_driver is not None]
    native = min(mins) if mins else None
    floor = t.minor_compat.get(releases[0].major)
    return CudaNeed(cuda, releases, native, floor.min_driver if floor else None)


def recommended_drivers(min_driver: Version | None = None, max_branch: int | None = None,
                        today: date | None = None, t: Tables | None = None) -> list[Branch]:
    """Branches whose latest known release satisfies the bounds: supported LTSB/production branches first;
    other supported branches if there is none; end-of-life ones only as a last resort."""
    t = t or tables()
    fits = [b for b in t.branches.values() if b.latest_known is not None
            and (min_driver is None or b.latest_known >= min_driver)
            and (max_branch is None or b.branch <= max_branch)]
    order = {"lts": 0, "production": 1, "new-feature": 2}
    fits.sort(key=lambda b: (order.get(b.type, 3), -b.branch))
    main = [b for b in fits if b.status(today) == "supported" and b.type in ("lts", "production")]
    if main:
        return main
    supported = [b for b in fits if b.status(today) == "supported"]
    if supported:
        return supported
    undated = [b for b in fits if b.status(today) == "unknown"]
    if undated:
        return undated[:1]
    return sorted(fits, key=lambda b: -b.branch)[:1]


# ---------------------------------------------------------------------------------------------------------
# Queries: architectures
# ---------------------------------------------------------------------------------------------------------


def architecture_for(compute_capability: str, t: Tables | None = None) -> Architecture | None:
    t = t or tables()
    return next((a for a in t.architectures if a.compute_capability == compute_capability), None)


def architecture_min_driver(arch: Architecture, t: Tables | None = None) -> Version | None:
    """The lowest driver for an architecture: the minimum driver of the first CUDA release that supports it
    (derived; None when that CUDA predates the table, i.e. any driver in the table supports it)."""
    return series_min_driver(major_minor(arch.first_cuda), t)


def architecture_groups(t: Tables | None = None) -> list[tuple[str, list[Architecture]]]:
    """Architectures in table order, each with its compute capabilities."""
    t = t or tables()
    groups: dict[str, list[Architecture]] = {}
    for arch in t.architectures:
        groups.setdefault(arch.name, []).append(arch)
    return list(groups.items())


def driver_supports(arch: Architecture, driver: Version, t: Tables | None = None) -> tuple[bool, str | None]:
    """(supported, reason-if-not) for an architecture under a driver version."""
    branch = branch_of(driver)
    if arch.last_driver_branch is not None and branch > arch.last_driver_branch:
        return False, (f"R{arch.last_driver_branch} is the last driver branch for {arch.name}; "
                       f"driver {driver} is R{branch}")
    minimum = architecture_min_driver(arch, t)
    if minimum is not None and driver < minimum:
        return False, (f"{arch.name} (compute capability {arch.compute_capability}) needs CUDA "
                       f"{major_minor(arch.first_cuda)}, i.e. a driver >= {minimum}")
    return True, None


def cuda_supports(arch: Architecture, cuda: Version) -> bool:
    """Whether a CUDA toolkit release can build for (and ship libraries for) an architecture."""
    mm = _mm(cuda)
    if mm < _mm(arch.first_cuda):
        return False
    return arch.last_cuda is None or mm <= _mm(arch.last_cuda)


def cuda_majors(arch: Architecture, t: Tables | None = None) -> list[int]:
    t = t or tables()
    return sorted({r.major for r in t.releases if cuda_supports(arch, r.version)})


# ---------------------------------------------------------------------------------------------------------
# NVIDIA_REQUIRE_CUDA
# ---------------------------------------------------------------------------------------------------------

_TERM = re.compile(r"^(?P<key>cuda|driver|arch|brand)(?P<op>>=|<=|==|!=|=|<|>)(?P<value>[A-Za-z0-9._-]+)$")


@dataclass(frozen=True, eq=False, repr=False)
class Constraint(Frozen):
    key: str  # cuda | driver | arch | brand
    op: str  # = == != < <= > >=
    value: str

    def __str__(self) -> str:
        return f"{self.key}{self.op}{self.value}"

    def holds(self, facts: Mapping[str, str | None]) -> bool | None:
        actual = facts.get(self.key)
        if actual is None:
            return None
        if self.key == "brand":
            same = actual.lower() == self.value.lower()
            return {"=": same, "==": same, "!=": not same}.get(self.op, False)
        left, right = Ver(actual), Ver(self.value)
        return {"=": left == right, "==": left == right, "!=": left != right, "<": left < right,
                "<=": left <= right, ">": left > right, ">=": left >= right}[self.op]


@dataclass(frozen=True, eq=False, repr=False)
class Requirement(Frozen):
    """A parsed NVIDIA_REQUIRE_* condition: space-separated alternatives are OR-ed, comma-separated
    constraints inside one alternative are AND-ed (libnvidia-container's rules)."""

    text: str
    alternatives: tuple[tuple[Constraint, ...], ...]

    @property
    def cuda_minimum(self) -> str | None:
        """The X.Y of the bare `cuda>=X.Y` alternative, if there is one."""
        for alt in self.alternatives:
            if len(alt) == 1 and alt[0].key == "cuda" and alt[0].op == ">=":
                return alt[0].value
        return None

    def evaluate(self, *, cuda: str | None = None, driver: str | None = None, brand: str | None = None,
                 arch: str | None = None) -> bool | None:
        """True/False, or None when the answer depends on a value not given (e.g. the GPU's brand)."""
        facts = {"cuda": cuda, "driver": driver, "brand": brand, "arch": arch}
        results = []
        for alt in self.alternatives:
            values = [c.holds(facts) for c in alt]
            results.append(False if False in values else (None if None in values else True))
        if True in results:
            return True
        return None if None in results else False

    def satisfying(self, *, cuda: str | None = None, driver: str | None = None, brand: str | None = None,
                   arch: str | None = None) -> list[str]:
        """The alternatives that hold (unknown values count as holding)."""
        facts = {"cuda": cuda, "driver": driver, "brand": brand, "arch": arch}
        return [",".join(map(str, alt)) for alt in self.alternatives if all(c.holds(facts) is not False for c in alt)]


def parse_require_cuda(text: str) -> Requirement:
    """Parse `cuda>=12.4 brand=tesla,driver>=470,driver<471 ...` (an NVIDIA_REQUIRE_CUDA value, with or
    without the `NVIDIA_REQUIRE_CUDA=` prefix and surrounding quotes). Malformed terms are a UsageError."""
    value = (text or "").strip()
    if value.startswith("NVIDIA_REQUIRE_CUDA="):
        value = value.split("=", 1)[1]
    value = value.strip().strip("\"'")
    if not value:
        raise UsageError("empty NVIDIA_REQUIRE_CUDA condition", fix="pass e.g. 'cuda>=12.4'")
    alternatives = []
    for word in value.split():
        constraints = []
        for term in word.split(","):
            match = _TERM.match(term)
            if not match:
                raise UsageError(f"NVIDIA_REQUIRE_CUDA term {term!r} is not KEY OP VALUE",
                                 fix="keys are cuda, driver, arch and brand; operators =, ==, !=, <, <=, >, >=")
            key, op, val = match["key"], match["op"], match["value"]
            if key == "brand" and op not in ("=", "==", "!="):
                raise UsageError(f"NVIDIA_REQUIRE_CUDA term {term!r}: brand takes = or != only")
            if key != "brand":
                try:
                    Ver(val)
                except InvalidVersion:
                    raise UsageError(f"NVIDIA_REQUIRE_CUDA term {term!r}: {val!r} is not a version") from None
            constraints.append(Constraint(key, op, val))
        alternatives.append(tuple(constraints))
    return Requirement(value, tuple(alternatives))


# Which NVML brands each market segment can report. The images' forward-compatibility clauses list brands;
# a GPU's exact brand is only known on the node (nvidia-smi -q: Product Brand), so we test every candidate.
SEGMENT_BRANDS: dict[str, tuple[str, ...]] = {
    "datacenter": ("tesla", "nvidia"),
    "workstation": ("quadro", "quadrortx", "nvidiartx", "nvidia"),
    "geforce": ("geforce", "geforcertx", "titan", "titanrtx"),
}


# ---------------------------------------------------------------------------------------------------------
# Images
# ---------------------------------------------------------------------------------------------------------

_NVIDIA_CUDA_REPOS = {"nvidia/cuda", "docker.io/nvidia/cuda", "index.docker.io/nvidia/cuda",
                      "registry-1.docker.io/nvidia/cuda", "nvcr.io/nvidia/cuda", "docker.io/library/nvidia/cuda"}
_IMAGE_RE = re.compile(r"^[a-z0-9][a-z0-9._/:-]*(@sha256:[0-9a-f]{64})?$")
# A tag that names the CUDA it was built on, as a word of its own: 2.3-cuda12.4-ubuntu22.04, cuda-12.4.1_cudnn9.
_TAG_NAMES_CUDA = re.compile(r"(?:^|[-_.])cuda[-_]?(\d{1,2}\.\d{1,2}(?:\.\d{1,3})?)(?=$|[-_])", re.IGNORECASE)


@dataclass(frozen=True, eq=False, repr=False)
class ImageRef(Frozen):
    image: str
    repository: str
    tag: str | None
    cuda: Version | None  # from the tag of an nvidia/cuda image, or named in another image's tag (see below)
    cuda_from_tag_name: bool = False  # not nvidia/cuda, but the tag names its CUDA (`...-cuda12.4-...`)

    @property
    def is_nvidia_cuda(self) -> bool:
        return self.repository in _NVIDIA_CUDA_REPOS


def parse_image(ref: str) -> ImageRef:
    """Split an image reference; for nvidia/cuda read the CUDA version off the tag (12.4.1-base-ubuntu22.04)."""
    image = (ref or "").strip()
    if not image or not _IMAGE_RE.match(image.lower()) or image.endswith((":", "/")):
        raise UsageError(f"--image {ref!r} is not an image reference",
                         fix="use REPOSITORY:TAG, e.g. nvidia/cuda:12.4.1-base-ubuntu22.04")
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    repository, tag = (name[: -len(last)] + last.split(":", 1)[0], last.split(":", 1)[1]) if ":" in last \
        else (name, None)
    repository = repository.lower()
    cuda = None
    if repository in _NVIDIA_CUDA_REPOS:
        if tag is None:
            raise UsageError(f"--image {ref!r} has no tag, and nvidia/cuda has no 'latest' tag",
                             fix="name a tag, e.g. nvidia/cuda:12.4.1-base-ubuntu22.04")
        match = re.match(r"^(\d{1,2}\.\d{1,2}(?:\.\d{1,3})?)(?:-|$)", tag)
        if not match:
            raise UsageError(f"--image {ref!r}: the tag {tag!r} does not start with a CUDA version",
                             fix="nvidia/cuda tags look like 12.4.1-base-ubuntu22.04")
        cuda = Ver(match[1])
    elif tag is not None and (named := _TAG_NAMES_CUDA.search(tag)):
        return ImageRef(image, repository, tag, Ver(named[1]), cuda_from_tag_name=True)
    return ImageRef(image, repository, tag, cuda)


@dataclass(frozen=True, eq=False, repr=False)
class ImageNeed(Frozen):
    ref: ImageRef
    requirement: Requirement | None  # None: not an nvidia/cuda image (cannot be read offline)
    recorded: bool  # the full condition is in gpunode's table; else only cuda>=X.Y is known
    native_min: Version | None
    forward_compat: ImageRequirement | None

    def to_dict(self) -> dict[str, object]:
        fc = self.forward_compat
        return {"image": self.ref.image, "cuda": str(self.ref.cuda) if self.ref.cuda else None,
                "require_cuda": self.requirement.text if self.requirement else None,
                "require_cuda_recorded": self.recorded, "cuda_from_tag_name": self.ref.cuda_from_tag_name,
                "native_min_driver": str(self.native_min) if self.native_min else None,
                "forward_compat_branches": list(fc.branches) if fc else [],
                "forward_compat_brands": list(fc.brands) if fc else []}


def tag_name_note(ref: ImageRef) -> str:
    """What a check of an image whose CUDA comes from its tag's name rests on."""
    series = major_minor(ref.cuda) if ref.cuda else "?"
    return (f"{ref.image} is not an nvidia/cuda image; its tag names CUDA {series}, so it is checked as "
            f"cuda>={series} (what an image built on nvidia/cuda {series} inherits); confirm with: docker inspect "
            "--format '{{range .Config.Env}}{{println .}}{{end}}' IMAGE | grep NVIDIA_REQUIRE_CUDA")


UNREADABLE_IMAGE = ("gpunode cannot read another image's NVIDIA_REQUIRE_CUDA offline; on a machine with the "
                    "image run: docker inspect --format '{{range .Config.Env}}{{println .}}{{end}}' IMAGE "
                    "| grep NVIDIA_REQUIRE_CUDA, then `" + fixes.gpunode("compat", cuda="X.Y") + "` for the version it names")


def image_needs(ref: str | ImageRef, t: Tables | None = None) -> ImageNeed:
    """The NVIDIA_REQUIRE_CUDA condition of an image and the lowest driver that meets its `cuda>=X.Y` part."""
    t = t or tables()
    image = ref if isinstance(ref, ImageRef) else parse_image(ref)
    if image.cuda is None:
        return ImageNeed(image, None, False, None, None)
    series = major_minor(image.cuda)
    if image.cuda_from_tag_name:
        # read off the tag's name: an image built on nvidia/cuda X.Y inherits its cuda>=X.Y; a CUDA that is not
        # in the table leaves the image unread, as if the tag named none
        if not any(r.series == series for r in t.releases):
            return ImageNeed(image, None, False, None, None)
        return ImageNeed(image, parse_require_cuda(f"cuda>={series}"), False, series_min_driver(series, t), None)
    if not any(r.series == series for r in t.releases):
        raise UsageError(f"--image {image.image}: CUDA {series} is not a CUDA release in gpunode's table",
                         fix=f"known CUDA versions: {t.releases[0].series} to {t.releases[-1].series}")
    exact = Ver(f"{series}.{(*image.cuda.release, 0, 0)[2]}")
    recorded = t.image_requirements.get(exact) if len(image.cuda.release) == 3 else None
    condition = recorded.condition() if recorded else f"cuda>={series}"
    return ImageNeed(image, parse_require_cuda(condition), recorded is not None, series_min_driver(series, t), recorded)


def image_accepts(need: ImageNeed, driver: Version, segment: str | None = None,
                  t: Tables | None = None) -> tuple[bool | None, list[str]]:
    """Whether nvidia-container-cli would accept the image on this driver (and GPU segment, if known).
    Returns (answer, satisfying alternatives); None when it depends on the GPU's brand or on an unreadable
    condition."""
    if need.requirement is None:
        return None, []
    cuda = cuda_reported_by(driver, t)
    cuda_text = major_minor(cuda) if cuda else "0.0"
    brands = SEGMENT_BRANDS.get(segment or "", ()) or (None,)
    answers = [need.requirement.evaluate(cuda=cuda_text, driver=str(driver), brand=b) for b in brands]
    ways = sorted({w for b in brands for w in need.requirement.satisfying(cuda=cuda_text, driver=str(driver), brand=b)},
                  key=need.requirement.text.find)
    if all(a is True for a in answers):
        return True, ways
    if all(a is False for a in answers):
        return False, []
    return None, ways


def verify_image_for(driver_version: str | Version, t: Tables | None = None) -> str:
    """The nvidia/cuda base image `verify` runs for this driver: the newest known-good tag whose
    `cuda>=X.Y` condition the driver meets natively (no reliance on forward compatibility)."""
    t = t or tables()
    driver = driver_version if isinstance(driver_version, Version) else parse_driver(str(driver_version))
    reported = cuda_reported_by(driver, t)
    candidates = [v for v in t.verify_images if reported is not None and _mm(v.cuda_version) <= _mm(reported)]
    if not candidates:
        oldest = t.verify_images[0]
        raise CompatError(f"no known nvidia/cuda verify image runs on driver {driver} "
                          f"(it reports CUDA {major_minor(reported) if reported else 'older than 7.0'})",
                          fix=f"the oldest known image, {oldest.image}, needs a driver >= "
                              f"{series_min_driver(major_minor(oldest.cuda_version), t)}")
    return candidates[-1].image


# ---------------------------------------------------------------------------------------------------------
# Checks: one target against one driver. Shared by `gpunode compat` and the compat step.
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False, repr=False)
class Check(Frozen):
    target: str  # "GPU 10de:2330 (H100 SXM5 80GB)", "CUDA 12.4", "image nvidia/cuda:12.4.1-..."
    ok: bool
    reason: str
    min_driver: Version | None = None  # the lowest driver that satisfies this target
    max_branch: int | None = None  # the newest branch that satisfies it
    notes: tuple[str, ...] = field(default=())
    fix: str | None = None  # a fix that is not a driver change (e.g. "use CUDA 12.x for Volta")
    via: str | None = None  # how an ok target is met: native | minor-version compatibility | forward compatibility
    conditional: bool = False  # ok only under a condition the reason states (a GPU brand, an unchecked image)

    @property
    def status(self) -> str:
        """ok | conditional (works only if what the reason says holds) | blocked."""
        return "blocked" if not self.ok else "conditional" if self.conditional else "ok"

    def to_dict(self) -> dict[str, object]:
        return {"target": self.target, "status": self.status, "reason": self.reason,
                "min_driver": str(self.min_driver) if self.min_driver else None, "max_branch": self.max_branch,
                "notes": list(self.notes), "fix": self.fix, "via": self.via}


def native_phrase(driver: Version, t: Tables | None = None) -> str:
    release = native_release(driver, t)
    if release is None:
        return f"driver {driver} is older than every CUDA release in gpunode's table"
    return f"driver {driver} runs CUDA up to {release.series} natively"


def check_architecture(driver: Version, arch: Architecture, target: str, t: Tables | None = None) -> Check:
    ok, why = driver_supports(arch, driver, t)
    minimum = architecture_min_driver(arch, t)
    if ok:
        return Check(target, True, f"{arch.name} is supported by driver {driver}", minimum, arch.last_driver_branch)
    return Check(target, False, f"{target}: {why}", minimum, arch.last_driver_branch)


def check_cuda(driver: Version, cuda: str, t: Tables | None = None) -> Check:
    need = driver_needed_for_cuda(cuda, t)
    target = f"CUDA {need.cuda}"
    floor = need.minor_compat_min
    if need.native_min is not None and driver >= need.native_min:
        return Check(target, True, f"{native_phrase(driver, t)}, so {target} runs natively",
                     floor if floor is not None else need.native_min, via="native")
    reported = cuda_reported_by(driver, t)
    same_or_newer_major = reported is not None and reported.release[0] >= need.major
    native_text = f"a driver >= {need.native_min}" if need.native_min else "a driver whose minimum NVIDIA has not published"
    if floor is not None and driver >= floor and same_or_newer_major:
        return Check(target, True,
                     f"{native_phrase(driver, t)}; {target} runs through minor-version compatibility "
                     f"(CUDA {need.major}.x needs >= {floor})", floor, via="minor-version compatibility",
                     notes=(f"not through minor-version compatibility: PTX JIT of CUDA {need.series} PTX and APIs "
                            f"newer than the driver; for native CUDA {need.series} use {native_text}",))
    minimum = need.native_min if need.native_min is not None else floor
    why = (f"{native_phrase(driver, t)}; {target} needs {native_text}"
           + (f" (or >= {floor} through minor-version compatibility)" if floor is not None else
              " (no minor-version compatibility before CUDA 11)"))
    return Check(target, False, why, minimum)


def check_cuda_architecture(arch: Architecture, cuda: Version, target: str, gpu: str) -> Check | None:
    """A CUDA version against a GPU architecture: CUDA that dropped the architecture cannot run on it (no
    SASS and no usable PTX); CUDA older than the architecture only runs through PTX JIT (a note)."""
    series = major_minor(cuda)
    if arch.last_cuda is not None and _mm(cuda) > _mm(arch.last_cuda):
        last = major_minor(arch.last_cuda)
        return Check(f"{target} on {gpu}", False,
                     f"CUDA {series} dropped {arch.name} (compute capability {arch.compute_capability}); "
                     f"CUDA {last} is the last release for it", fix=f"use CUDA {last} or older on {arch.name} GPUs")
    if _mm(cuda) < _mm(arch.first_cuda):
        first = major_minor(arch.first_cuda)
        return Check(f"{target} on {gpu}", True, f"CUDA {series} predates {arch.name}",
                     notes=(f"CUDA {series} code runs on {arch.name} only through PTX JIT; NVIDIA supports "
                            f"{arch.name} from CUDA {first}",))
    return None


def check_image(driver: Version, image: str | ImageRef, segments: Sequence[str | None] = (),
                t: Tables | None = None) -> Check:
    """An image against a driver and the node's GPU segments (datacenter/workstation/geforce; None unknown)."""
    need = image_needs(image, t)
    check = _check_image(driver, need, segments, t)
    if need.ref.cuda_from_tag_name and need.requirement is not None:
        return replace(check, notes=(tag_name_note(need.ref), *check.notes))
    return check


def _check_image(driver: Version, need: ImageNeed, segments: Sequence[str | None], t: Tables | None) -> Check:
    name = need.ref.image
    target = f"image {name}"
    if need.requirement is None:
        return Check(target, True, f"{name} is not an nvidia/cuda image: its NVIDIA_REQUIRE_CUDA was not checked",
                     notes=(UNREADABLE_IMAGE,), conditional=True)
    cuda_min = need.requirement.cuda_minimum
    fix_min = need.native_min
    native = native_phrase(driver, t)
    results = []  # (segment, answer, satisfying alternatives, natively)
    for segment in list(segments) or [None]:
        answer, ways = image_accepts(need, driver, segment, t)
        results.append((segment, answer, ways, answer is True and bool(ways) and ways[0].startswith("cuda>=")))
    if all(natively for *_, natively in results):
        return Check(target, True, f"{native}; {name} requires cuda>={cuda_min}: satisfied", fix_min, via="native")
    if any(answer is False for _, answer, _, _ in results):
        extra: tuple[str, ...] = ()
        if not need.recorded:
            extra = (f"gpunode has not recorded the forward-compatibility clauses of {name}; they may admit some "
                     "driver branches on data-center GPUs; read them with: docker inspect --format "
                     "'{{range .Config.Env}}{{println .}}{{end}}' IMAGE | grep NVIDIA_REQUIRE_CUDA",)
        return Check(target, False, f"{native}; {name} fails with 'unsatisfied condition: cuda>={cuda_min}'",
                     fix_min, notes=extra)
    fc_note = ("CUDA forward compatibility (the image's cuda-compat libraries) is supported on data-center GPUs "
               f"and some workstation parts only; for native support use a driver >= {need.native_min}")
    geforce = [ways for segment, answer, ways, natively in results if segment == "geforce" and not natively]
    if geforce:
        return Check(target, False,
                     f"{native}; {name} requires cuda>={cuda_min}; its clause {geforce[0][0]} lets the container "
                     "start, but that relies on CUDA forward compatibility, which NVIDIA does not support on "
                     "GeForce GPUs", fix_min, notes=(fc_note,))
    if any(answer is None for _, answer, _, _ in results):
        branches = ", ".join(f"R{b}" for b in need.forward_compat.branches) if need.forward_compat else ""
        return Check(target, True,
                     f"{native}; {name} requires cuda>={cuda_min}: accepted only on GPUs whose brand its "
                     f"forward-compatibility clauses list ({branches})", fix_min, via="forward compatibility",
                     conditional=True, notes=("check the GPU's brand with nvidia-smi -q (Product Brand); newer images do not list "
                            "GeForce", fc_note))
    ways = next(w for _, _, w, natively in results if not natively)
    return Check(target, True,
                 f"{native}; {name} requires cuda>={cuda_min}, and is accepted through its forward-compatibility "
                 f"clause {ways[0]}", fix_min, notes=(fc_note,), via="forward compatibility")


def fix_for(checks: Iterable[Check], driver: Version | None = None, today: date | None = None,
            t: Tables | None = None) -> str:
    """One fix for a set of checks: the driver range that satisfies all of them (bounds the current driver
    already meets are left out), with an example release; plus any non-driver fixes of failing checks."""
    checks = list(checks)
    explicit = [c.fix for c in checks if not c.ok and c.fix]
    needs_driver = any(not c.ok and not c.fix for c in checks)
    lows = [c.min_driver for c in checks if c.min_driver is not None]
    highs = [c.max_branch for c in checks if c.max_branch is not None]
    low = max(lows) if lows else None
    high = min(highs) if highs else None
    parts: list[str] = []
    if needs_driver:
        if low is not None and high is not None and branch_of(low) > high:
            parts.append(f"no single driver fits: one target needs a driver >= {low}, another one R{high} or "
                         "older; split these GPUs or targets across nodes")
        else:
            show_low = low is not None and (driver is None or driver < low)
            show_high = high is not None and (driver is None or branch_of(driver) > high)
            if show_low and show_high:
                text = f"use a driver >= {low} on branch R{high} or older"
            elif show_low:
                text = f"use a driver >= {low}"
            elif show_high:
                text = f"use an R{high} driver or older"
            else:
                text = "use a supported driver"
            examples = recommended_drivers(low, high, today, t)
            if examples:
                best = examples[0]
                text += (f", e.g. {best.latest_known} (R{best.branch} {best.label}"
                         + (", end of life" if best.status(today) == "end-of-life" else "") + ")")
            parts.append(text)
    parts += [f for f in explicit if f not in parts]
    return "; ".join(parts) if parts else "nothing to fix"
