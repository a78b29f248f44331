"""The batched probe: every fact gpunode needs, gathered by ONE shell command on the node.

Each section is a small POSIX sh snippet. Its output is framed by marker lines that carry a random nonce,
so no file content can forge a section boundary. Parsing the framed output is a pure function.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from gpunode.shell import Script

# Tools whose presence the steps and doctor care about (`command -v`).
TOOLS = (
    "nvidia-smi", "nvidia-ctk", "nvidia-installer", "modprobe", "update-initramfs", "dracut", "mkinitcpio",
    "apt-get", "dpkg", "dnf", "yum", "rpm", "zypper", "systemctl", "docker", "dockerd", "containerd", "ctr",
    "nerdctl", "crio", "podman", "mokutil", "gcc", "make", "dkms", "sudo", "sha256sum", "reboot", "lsinitramfs",
    "lsinitrd", "snap",
)

MODPROBE_DIRS = ("/etc/modprobe.d", "/run/modprobe.d", "/usr/local/lib/modprobe.d", "/usr/lib/modprobe.d",
                 "/lib/modprobe.d")

EFI_SECURE_BOOT_VAR = "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"

# name -> snippet. Order is the order of the output.
SECTIONS: dict[str, str] = {
    "os_release": "cat /etc/os-release 2>/dev/null || cat /usr/lib/os-release",
    "kernel": "uname -r",
    "arch": "uname -m",
    "uid": "id -u",
    "boot_id": "cat /proc/sys/kernel/random/boot_id",
    "cmdline": "cat /proc/cmdline",
    "modules": "cat /proc/modules",
    "nvidia_version": "cat /proc/driver/nvidia/version",
    "pci": (
        'for d in /sys/bus/pci/devices/*; do [ -r "$d/vendor" ] || continue; '
        'read v < "$d/vendor"; [ "$v" = 0x10de ] || continue; '
        'read dev < "$d/device"; read cls < "$d/class"; echo "${d##*/} $v $dev $cls"; done; true'
    ),
    "tools": 'for t in ' + " ".join(TOOLS) + '; do p=$(command -v "$t" 2>/dev/null) && echo "$t $p"; done; true',
    "secure_boot": (
        'if [ -d /sys/firmware/efi ]; then echo efi; else echo bios; fi; '
        f'[ -r {EFI_SECURE_BOOT_VAR} ] && echo "efivar $(od -An -tu1 {EFI_SECURE_BOOT_VAR} | tr -s " \\n" " ")"; '
        'command -v mokutil >/dev/null 2>&1 && echo "mokutil $(mokutil --sb-state 2>&1 | head -n 1)"; true'
    ),
    # initramfs images for the running kernel, with their modification time (seconds since the epoch)
    "initramfs": (
        'k=$(uname -r); for f in "/boot/initrd.img-$k" "/boot/initramfs-$k.img" /boot/initramfs-linux.img; do '
        '[ -e "$f" ] && echo "$(stat -c %Y "$f") $f"; done; true'
    ),
}


# Files to read whole, by glob: name -> patterns. Every file found is framed with its mtime and path and
# lands in Facts.files. Steps add their config files here (daemon.json, containerd config, ...).
FILE_GROUPS: dict[str, tuple[str, ...]] = {
    "modprobe_d": tuple(f"{d}/*.conf" for d in MODPROBE_DIRS),
}

# Extra commands whose raw output steps parse themselves: name -> snippet. Lands in Facts.outputs.
COMMANDS: dict[str, str] = {}


def _file_group_snippet(patterns: tuple[str, ...]) -> str:
    return ('for f in ' + " ".join(patterns) + '; do [ -f "$f" ] || continue; '
            'echo "@FILE@ $(stat -c %Y "$f" 2>/dev/null || echo 0) $f"; cat "$f"; echo; done; true')


def all_sections() -> dict[str, str]:
    """Core sections, then file groups (prefixed files:), then extra commands (prefixed cmd:)."""
    sections = dict(SECTIONS)
    sections.update({f"files:{name}": _file_group_snippet(p) for name, p in FILE_GROUPS.items()})
    sections.update({f"cmd:{name}": snippet for name, snippet in COMMANDS.items()})
    return sections


@dataclass(frozen=True)
class Section:
    text: str
    status: int  # exit status of the snippet

    @property
    def ok(self) -> bool:
        return self.status == 0


def build_probe(nonce: str | None = None) -> tuple[Script, str]:
    """The probe script and the nonce that frames its sections."""
    nonce = nonce or secrets.token_hex(8)
    parts = []
    for name, snippet in all_sections().items():
        body = snippet.replace("@FILE@", f"@{nonce}@file")
        parts.append(f'echo "@{nonce}@begin {name}"\n( {body}\n) 2>/dev/null\necho "@{nonce}@end {name} $?"')
    return Script(body="\n".join(parts) + "\n", name="probe"), nonce


def split_sections(output: str, nonce: str) -> dict[str, Section]:
    """Pure: framed probe output -> {section name: Section}."""
    sections: dict[str, Section] = {}
    begin, end = f"@{nonce}@begin ", f"@{nonce}@end "
    current: str | None = None
    lines: list[str] = []
    for line in output.split("\n"):
        if line.startswith(begin):
            current, lines = line[len(begin):].strip(), []
        elif line.startswith(end) and current is not None:
            name, _, status = line[len(end):].partition(" ")
            sections[name] = Section("\n".join(lines), int(status) if status.strip().isdigit() else 1)
            current = None
        elif current is not None:
            lines.append(line)
    return sections


def split_files(text: str, nonce: str) -> dict[str, tuple[int, str]]:
    """Pure: a section holding several files (`@nonce@file MTIME PATH` headers) -> {path: (mtime, content)}.

    The snippet prints each file followed by one newline, so the text up to the next header (or the end of
    the section) minus that newline is the file byte for byte, final newline or not."""
    files: dict[str, tuple[int, str]] = {}
    marker = f"@{nonce}@file "
    path: str | None = None
    mtime = 0
    lines: list[str] = []
    for line in text.split("\n"):
        if line.startswith(marker):
            if path is not None:
                files[path] = (mtime, "\n".join(lines))
            stamp, _, path = line[len(marker):].partition(" ")
            mtime = int(stamp) if stamp.isdigit() else 0
            lines = []
        elif path is not None:
            lines.append(line)
    if path is not None:
        files[path] = (mtime, "\n".join(lines))
    return files
