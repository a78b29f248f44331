"""How NVIDIA names the fabric manager packages, in one place.

Below R580 they carry the driver branch on Debian/Ubuntu (nvidia-fabricmanager-535) and a hyphen on the RPM
distributions (nvidia-fabric-manager); from R580 both are plain nvidia-fabricmanager (NVIDIA Fabric Manager
User Guide, "Installing Fabric Manager"; CUDA repository listings). NVIDIA's own builds carry revision 1.
"""

from __future__ import annotations

import re

RENAMED_AT = 580  # the first branch whose packages are plain nvidia-fabricmanager
OLD_BRANCHES = (450, 460, 470, 495, 510, 515, 520, 525, 530, 535, 545, 550, 555, 560, 565, 570, 575)
PACKAGE = re.compile(r"^nvidia-fabric-?manager(-\d+)?$")  # the service packages, not the -dev / -devel SDK


def package_name(branch: int, package_format: str) -> str:
    """The fabric manager package for a driver branch; package_format "deb" or "rpm"."""
    if branch >= RENAMED_AT:
        return "nvidia-fabricmanager"
    return f"nvidia-fabricmanager-{branch}" if package_format == "deb" else "nvidia-fabric-manager"


def package_version(driver: str) -> str:
    """The package version built for a driver version in NVIDIA's CUDA repositories."""
    return f"{driver}-1"


def all_names(package_format: str) -> tuple[str, ...]:
    """Every name the package has had, newest first: what to ask a repository about."""
    if package_format == "deb":
        return ("nvidia-fabricmanager", *(f"nvidia-fabricmanager-{b}" for b in OLD_BRANCHES))
    return ("nvidia-fabric-manager", "nvidia-fabricmanager")
