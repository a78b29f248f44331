"""Facts of image builds (`gpunode install --bake`, gpunode/bake.py): the kernels installed on the node, the
NVIDIA modules built for each and their sha256, the headers and initramfs of each kernel, the node's clock, and
the marker a bake leaves (/var/lib/gpunode/baked.json). All parsers are pure and keep only well-formed lines:
every path and name here is node text."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpunode.facts.kernel import kernel_key
from gpunode.facts.registry import command, files
from gpunode.record import Frozen

_M = __name__.rsplit(".", 1)[-1]

MARKER_PATH = "/var/lib/gpunode/baked.json"
_KERNEL = r"[0-9][A-Za-z0-9._+~-]*"  # a kernel release (uname -r), as a directory name under /lib/modules
KERNEL_RE = re.compile(rf"^{_KERNEL}$")


@dataclass(frozen=True, eq=False, repr=False)
class KernelFiles(Frozen):
    """What is installed per kernel release: the image, the headers DKMS builds against, the initramfs."""

    images: tuple[str, ...] = ()  # kernels with an image (/boot/vmlinuz-K or /lib/modules/K/vmlinuz), version order
    headers: frozenset[str] = frozenset()  # kernels with /lib/modules/K/build or /usr/src/kernels/K
    initramfs: dict[str, int] = field(default_factory=dict)  # kernel -> mtime of its newest initramfs image

    @property
    def newest(self) -> str | None:
        return self.images[-1] if self.images else None


def parse_kernel_files(text: str) -> KernelFiles:
    """`image K`, `headers K`, `initramfs MTIME K` lines -> KernelFiles."""
    images: set[str] = set()
    headers: set[str] = set()
    initramfs: dict[str, int] = {}
    for line in text.splitlines():
        words = line.split()
        if len(words) == 2 and words[0] in ("image", "headers") and KERNEL_RE.match(words[1]):
            (images if words[0] == "image" else headers).add(words[1])
        elif len(words) == 3 and words[0] == "initramfs" and words[1].isdigit() and KERNEL_RE.match(words[2]):
            initramfs[words[2]] = max(initramfs.get(words[2], 0), int(words[1]))
    return KernelFiles(tuple(sorted(images, key=kernel_key)), frozenset(headers), initramfs)


_MODULE_LINE = re.compile(rf"^([0-9a-f]{{64}})  /lib/modules/({_KERNEL})/([A-Za-z0-9._/+-]+\.ko(?:\.[a-z]+)?)$")
# the NVIDIA driver's own module files: the .run's nvidia{,-modeset,-uvm,-drm,-peermem}.ko and the packages' names
# for them (Debian's nvidia-current*.ko / nvidia-tesla-535*.ko, with -open); not the kernel's in-tree modules whose
# names also start with "nvidia" (Debian 12's kernel ships kernel/drivers/platform/x86/nvidia-wmi-ec-backlight.ko)
_DRIVER_MODULE = re.compile(r"(?:^|/)nvidia(?:-current|-tesla-[0-9]+)?(?:-open)?(?:-modeset|-uvm|-drm|-peermem)?"
                            r"\.ko(?:\.[a-z]+)?$")


def parse_module_sums(text: str) -> dict[str, dict[str, str]]:
    """`sha256sum` lines of /lib/modules/*/.../nvidia*.ko* -> {kernel: {path under /lib/modules/K: sha256}}, the
    driver's module files only."""
    found: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        match = _MODULE_LINE.match(line.strip())
        if match and ".." not in match[3].split("/") and _DRIVER_MODULE.search(match[3]):
            found.setdefault(match[2], {})[match[3]] = match[1]
    return found


def parse_clock(text: str) -> str | None:
    value = text.strip()
    return value if re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", value) else None


# installed kernels (an image in /boot, or in /lib/modules/K/ on Fedora and RHEL 9), their headers and initramfs
KERNELS = command("kernel_files", (
    'for f in /boot/vmlinuz-* /lib/modules/*/vmlinuz; do [ -f "$f" ] || continue; '
    'case $f in /boot/*) k=${f#/boot/vmlinuz-} ;; *) k=${f#/lib/modules/}; k=${k%/vmlinuz} ;; esac; '
    'echo "image $k"; done; '
    'for d in /lib/modules/*/build /usr/src/kernels/*; do [ -d "$d" ] || continue; '
    'case $d in /lib/*) k=${d#/lib/modules/}; k=${k%/build} ;; *) k=${d#/usr/src/kernels/} ;; esac; '
    'echo "headers $k"; done; '
    'for f in /boot/initrd.img-* /boot/initramfs-*.img /boot/initrd-*; do [ -f "$f" ] || continue; '
    'case $f in /boot/initrd.img-*) k=${f#/boot/initrd.img-} ;; /boot/initrd-*) k=${f#/boot/initrd-} ;; '
    '*) k=${f#/boot/initramfs-}; k=${k%.img} ;; esac; '
    'echo "initramfs $(stat -c %Y "$f") $k"; done; true'
), parse_kernel_files, module=_M, late=True)
# every NVIDIA kernel module built for any installed kernel, with its sha256 (what a bake marker records)
MODULE_SUMS = command("nvidia_module_sums", (
    'find /lib/modules/ -name "nvidia*.ko*" -type f 2>/dev/null | while IFS= read -r f; do sha256sum "$f"; done; true'
), parse_module_sums, module=_M, late=True)
# the node's clock (UTC), for the time a bake records
CLOCK = command("clock", 'date -u +%Y-%m-%dT%H:%M:%SZ', parse_clock, module=_M, late=True)
# the marker of an image build: what was baked, for which kernel (gpunode/bake.py)
MARKER = files("bake_marker", (MARKER_PATH,), module=_M)
