"""Facts of the node settings: nvidia-persistenced's unit files and drop-ins in systemd's search path, and the
udev rules that mention nvidia in udev's. (The /dev/char links are kernel.DEV_CHAR, unit states packages.UNITS.)"""

from __future__ import annotations

from gpunode.facts.registry import files

_M = __name__.rsplit(".", 1)[-1]

SYSTEMD_UNIT_DIRS = ("/etc/systemd/system", "/run/systemd/system", "/usr/local/lib/systemd/system",
                     "/usr/lib/systemd/system", "/lib/systemd/system")
UDEV_RULES_DIRS = ("/etc/udev/rules.d", "/run/udev/rules.d", "/usr/local/lib/udev/rules.d", "/usr/lib/udev/rules.d",
                   "/lib/udev/rules.d")

PERSISTENCED_UNIT = files("persistenced_unit", tuple(f"{d}/nvidia-persistenced.service" for d in SYSTEMD_UNIT_DIRS)
                          + tuple(f"{d}/nvidia-persistenced.service.d/*.conf" for d in SYSTEMD_UNIT_DIRS), module=_M)
UDEV_NVIDIA = files("udev_nvidia", tuple(f"{d}/*nvidia*.rules" for d in UDEV_RULES_DIRS), module=_M)
