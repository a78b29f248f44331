"""Which OS a node runs, from its os-release text, identified by `distro`; and what that means for us
(package manager, initramfs tool)."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import distro

from gpunode.record import Frozen

_DEBIAN_FAMILY = {"debian", "ubuntu"}
_RHEL_FAMILY = {"rhel", "fedora", "centos"}
_SUSE_FAMILY = {"suse", "sles", "opensuse"}


@dataclass(frozen=True, eq=False, repr=False)
class OsInfo(Frozen):
    id: str  # distro's normalised id: ubuntu, debian, rhel, rocky, almalinux, centos, amzn, sles, opensuse...
    version: str  # VERSION_ID, "" when the file has none
    like: tuple[str, ...]
    name: str  # PRETTY_NAME, for humans
    codename: str = ""

    @property
    def family(self) -> str:
        """debian | rhel | suse | other."""
        ids = {self.id, *self.like}
        if ids & _DEBIAN_FAMILY:
            return "debian"
        if ids & _RHEL_FAMILY or self.id in {"rocky", "almalinux", "amzn", "ol", "oracle"}:
            return "rhel"
        if ids & _SUSE_FAMILY or self.id.startswith("opensuse"):
            return "suse"
        return "other"

    @property
    def package_manager(self) -> str | None:
        if self.family == "rhel" and (self.id == "amzn" or (self.major.isdigit() and int(self.major) <= 7)):
            return "yum"  # RHEL/CentOS 7 and Amazon Linux 2 have no dnf
        return {"debian": "apt", "rhel": "dnf", "suse": "zypper"}.get(self.family)

    @property
    def major(self) -> str:
        return self.version.split(".")[0] if self.version else ""

    def __str__(self) -> str:
        return self.name or f"{self.id} {self.version}".strip()


UNKNOWN_OS = OsInfo("unknown", "", (), "unknown OS")


def parse_os_release(text: str) -> OsInfo:
    """Parse os-release content with `distro`, isolated from the machine gpunode runs on."""
    if not text.strip():
        return UNKNOWN_OS
    with tempfile.TemporaryDirectory(prefix="gpunode-os-") as root:
        etc = Path(root, "etc")
        etc.mkdir()
        (etc / "os-release").write_text(text if text.endswith("\n") else text + "\n", encoding="utf-8")
        info = distro.LinuxDistribution(root_dir=root, include_lsb=False, include_uname=False,
                                        include_oslevel=False)
        return OsInfo(
            id=info.id() or "unknown",
            version=info.os_release_attr("version_id") or "",
            like=tuple(info.like().split()),
            name=info.os_release_attr("pretty_name") or info.name(pretty=True),
            codename=info.os_release_attr("version_codename") or info.codename(),
        )
