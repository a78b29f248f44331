"""System facts: the OS release, kernel release, architecture, user, boot, the tools on PATH, the date."""

from __future__ import annotations

from gpunode.facts.osinfo import OsInfo, parse_os_release
from gpunode.facts.registry import CAT, KERNEL_MARKER, RELEASE, command, core

_M = __name__.rsplit(".", 1)[-1]

# Tools whose presence the steps and doctor care about (`command -v`).
TOOL_NAMES = (
    "nvidia-smi", "nvidia-ctk", "nvidia-installer", "modprobe", "update-initramfs", "dracut", "mkinitcpio",
    "apt-get", "dpkg", "dnf", "yum", "rpm", "zypper", "systemctl", "docker", "dockerd", "containerd", "ctr",
    "nerdctl", "crio", "podman", "mokutil", "gcc", "make", "dkms", "sudo", "sha256sum", "reboot", "lsinitramfs",
    "lsinitrd", "snap", "curl", "gpg",
    # doctor (gpunode/doctor/)
    "nvidia-container-runtime", "nvidia-container-runtime-hook", "nvidia-container-cli", "nvidia-persistenced", "nvidia-modprobe",
    "nvidia-gridd", "kubelet",
)


def parse_tools(text: str) -> dict[str, str]:
    """`NAME PATH` lines of `command -v` -> {name: path}."""
    tools = {}
    for line in text.splitlines():
        name, _, path = line.strip().partition(" ")
        if name and path:
            tools[name] = path
    return tools


def parse_uid(text: str) -> int | None:
    return int(text.strip()) if text.strip().isdigit() else None


def parse_date(text: str) -> str | None:
    """`date -u +%Y-%m-%d` -> "2026-11-23"; None when the node printed something else."""
    value = text.strip()
    return value if len(value) == 10 and value[4] == "-" and value[7] == "-" else None


def _stripped(text: str) -> str:
    return text.strip()


# small files are read by the shell itself (registry.CAT), the kernel release asked once per probe (RELEASE), the
# effective uid read from the shell's own /proc/self/status (`id -u` where there is none): a process costs a slow
# node tens of ms
OS_RELEASE = core("os_release", CAT + "gpunode_cat /etc/os-release || gpunode_cat /usr/lib/os-release", parse_os_release,
                  module=_M)
KERNEL = core("kernel", RELEASE + 'echo "$k"', _stripped, module=_M)
# the machine from the `uname` that asked the release where the probe asked it (registry.KERNEL_MARKER)
ARCH = core("arch", 'a=${' + KERNEL_MARKER + ':+$gpunode_arch}; echo "${a:-$(uname -m)}"', _stripped, module=_M)
UID = core("uid", 'u=; while read -r n r e x; do [ "$n" = Uid: ] && { u=$e; break; }; done < /proc/self/status; '
           'if [ -n "$u" ]; then echo "$u"; else id -u; fi', parse_uid, module=_M)
BOOT_ID = core("boot_id", CAT + "gpunode_cat /proc/sys/kernel/random/boot_id", _stripped, module=_M)
# What `command -v` prints for a program, found by walking PATH with the shell's own tests: dash's `command -v`
# takes one name, and one `$(command -v ...)` per tool is a process each (~40 per probe). PATH is cut at its colons
# by the shell's own expansions, as field splitting on `IFS=:` cuts it (an empty entry is the current directory, a
# final colon adds none), so the section needs no subshell of its own (probe.in_shell).
TOOLS = core("tools", 'for t in ' + " ".join(TOOL_NAMES) + '; do p=$PATH; while [ -n "$p" ]; do d=${p%%:*}; '
             'case $p in *:*) p=${p#*:} ;; *) p= ;; esac; d=${d:-.}; '
             '[ -f "$d/$t" ] && [ -x "$d/$t" ] && { echo "$t $d/$t"; break; }; done; done; true', parse_tools, module=_M)
# the node's date, so checks of driver-branch end of life stay pure functions of the facts
DATE = command("doctor_date", "date -u +%Y-%m-%d", parse_date, module=_M, full_only=True)

__all__ = ["OsInfo", "OS_RELEASE", "KERNEL", "ARCH", "UID", "BOOT_ID", "TOOLS", "DATE", "TOOL_NAMES", "parse_tools",
           "parse_uid", "parse_date"]
