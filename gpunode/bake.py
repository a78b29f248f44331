"""Image builds: `gpunode install --bake [--kernel K]` and the boot-time check of what was baked.

A bake runs where the image is built (a Packer VM, often without a GPU). It installs the driver with its module
built for K, the kernel the image will boot, and loads nothing. K defaults to the newest installed kernel, not
`uname -r`: a build VM often runs the kernel of its base image while the image's package upgrade installed a
newer one, which is what the image boots. Last it writes a marker (MARKER_PATH) with what was built:

    {"schema": 1, "gpunode_version": ..., "driver": {"version": ..., "flavour": ...}, "kernel": K,
     "modules": {"updates/dkms/nvidia.ko": "<sha256>", ...}, "toolkit": "1.17.8-1" | null, "time": "...Z"}

At boot, `gpunode install --local` with the same driver reads the marker as a fact: when the running kernel is
K and every recorded module file still has its sha256, the module needs no rebuild (the driver step says so);
otherwise the driver step plans as on any node, and says why the marker did not apply.

Everything here is pure (facts -> values): the steps use it, the marker is written by a WriteFile action.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from gpunode import __version__
from gpunode.facts import Facts
from gpunode.facts import bake as bake_facts
from gpunode.options import Options
from gpunode.record import Frozen

MARKER_PATH = bake_facts.MARKER_PATH
MARKER_SCHEMA = 1
# the steps a bake runs; the rest need the GPU and run at first boot (fabric manager, node settings, Kubernetes)
BAKE_STEPS = ("nouveau", "prerequisites", "driver", "compat", "toolkit", "runtime")


def target_kernel(facts: Facts, options: Options) -> str | None:
    """The kernel a bake builds for: --kernel, else the newest installed kernel (None: none found)."""
    return options.bake_kernel or facts[bake_facts.KERNELS].newest


def installed_kernels(facts: Facts) -> tuple[str, ...]:
    return facts[bake_facts.KERNELS].images


def module_sums(facts: Facts, kernel: str) -> dict[str, str]:
    """The NVIDIA modules built for `kernel`: {path under /lib/modules/KERNEL: sha256}."""
    return dict(facts[bake_facts.MODULE_SUMS].get(kernel, {}))


def headers_present(facts: Facts, kernel: str) -> bool:
    return kernel in facts[bake_facts.KERNELS].headers


def initramfs_mtime(facts: Facts, kernel: str) -> int | None:
    return facts[bake_facts.KERNELS].initramfs.get(kernel)


@dataclass(frozen=True, eq=False, repr=False)
class Marker(Frozen):
    driver: str
    flavour: str
    kernel: str
    modules: dict[str, str]
    toolkit: str | None
    time: str
    gpunode_version: str = __version__

    def to_dict(self) -> dict[str, object]:
        return {"schema": MARKER_SCHEMA, "gpunode_version": self.gpunode_version,
                "driver": {"version": self.driver, "flavour": self.flavour}, "kernel": self.kernel,
                "modules": dict(sorted(self.modules.items())), "toolkit": self.toolkit, "time": self.time}

    def text(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def same_build(self, other: Marker) -> bool:
        """The same bake, whenever and by whichever gpunode it was recorded."""
        return (self.driver, self.flavour, self.kernel, self.modules, self.toolkit) == (
            other.driver, other.flavour, other.kernel, other.modules, other.toolkit)


def read_marker(facts: Facts) -> Marker | str | None:
    """The marker on the node; None when there is none; a string saying why when it cannot be read."""
    text = facts[bake_facts.MARKER].get(MARKER_PATH)
    if text is None:
        return None
    try:
        data = json.loads(text)
        driver = data["driver"]
        modules = data["modules"]
        marker = Marker(str(driver["version"]), str(driver["flavour"]), str(data["kernel"]),
                        {str(k): str(v) for k, v in modules.items()},
                        None if data.get("toolkit") is None else str(data["toolkit"]), str(data.get("time", "")),
                        str(data.get("gpunode_version", "")))
        if data.get("schema") != MARKER_SCHEMA:
            return f"{MARKER_PATH} has schema {data.get('schema')!r}, not {MARKER_SCHEMA}"
    except (ValueError, KeyError, TypeError, AttributeError):
        return f"{MARKER_PATH} is not a marker gpunode can read"
    return marker


@dataclass(frozen=True, eq=False, repr=False)
class BakedCheck(Frozen):
    """What the marker says about the running node. `applies`: the module was baked for this kernel and is
    unchanged, so the driver step needs no rebuild. `why`: words for people either way ("" without a marker)."""

    applies: bool
    why: str
    kernel: str = ""


def check(facts: Facts, version: str | None) -> BakedCheck:
    """The boot-time check of the marker against the running kernel, the module files and the driver asked for."""
    marker = read_marker(facts)
    if marker is None:
        return BakedCheck(False, "")
    if isinstance(marker, str):
        return BakedCheck(False, f"baked image marker ignored: {marker}")
    if version is not None and marker.driver != version:
        return BakedCheck(False, f"baked image marker ignored: it records driver {marker.driver}, not the "
                                 f"requested {version}", marker.kernel)
    if marker.kernel != facts.kernel:
        return BakedCheck(False, f"baked image marker ignored: the module was built for kernel {marker.kernel}, but "
                                 f"{facts.kernel} is running", marker.kernel)
    now = module_sums(facts, marker.kernel)
    changed = sorted(p for p, s in marker.modules.items() if now.get(p) != s)
    if not marker.modules or changed:
        what = ", ".join(changed[:3]) if changed else "no module recorded"
        return BakedCheck(False, f"baked image marker ignored: the module files of {marker.kernel} changed since the "
                                 f"bake ({what})", marker.kernel)
    return BakedCheck(True, f"baked image: module built for {marker.kernel} at bake time", marker.kernel)
