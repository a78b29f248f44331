"""Facts of the node settings: nvidia-persistenced's unit files and drop-ins in systemd's search path, and the
udev rules that mention nvidia in udev's, and the module lists systemd-modules-load (and Debian's /etc/modules)
reads at boot. (The /dev/char links are kernel.DEV_CHAR, unit states packages.UNITS.)"""

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
MODULES_LOAD_DIRS = ("/etc/modules-load.d", "/run/modules-load.d", "/usr/local/lib/modules-load.d",
                     "/usr/lib/modules-load.d", "/lib/modules-load.d")
MODULES_LOAD = files("modules_load", tuple(f"{d}/*.conf" for d in MODULES_LOAD_DIRS) + ("/etc/modules",), module=_M)


def loads_at_boot(lists: dict[str, str], module: str) -> list[str]:
    """The module lists that load `module` at boot (names compare with - and _ alike; # and ; start comments)."""
    want = module.replace("-", "_")
    return sorted(path for path, text in lists.items()
                  if any(line.split("#", 1)[0].split(";", 1)[0].strip().replace("-", "_") == want
                         for line in text.splitlines()))
