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
    "lsinitrd", "snap", "curl", "gpg",
    # doctor (gpunode/doctor/)
    "nvidia-container-runtime", "nvidia-container-runtime-hook", "nvidia-container-cli", "nvidia-persistenced",
    "nvidia-gridd", "kubelet",
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

# The driver and its prerequisites (parsed in gpunode/steps/driver.py and gpunode/steps/prerequisites.py).
COMMANDS.update({
    # user-space libraries of an installed driver (their suffix is the version), and the .run installer's
    # own record of what it installed
    "driver_userspace": (
        'for f in /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.* /usr/lib64/libnvidia-ml.so.* '
        '/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.* /usr/lib/libnvidia-ml.so.*; do '
        '[ -e "$f" ] && echo "lib $f"; done; '
        'command -v nvidia-installer >/dev/null 2>&1 && '
        'echo "installer $(nvidia-installer --version 2>/dev/null | grep -i -m 1 version)"; true'
    ),
    # the nvidia module the running kernel would load (built by DKMS or the installer): version and license
    "driver_module": 'modinfo nvidia 2>/dev/null | grep -E "^(filename|version|license|signer):"; true',
    # does NVML answer? (its error text names a driver/library mismatch)
    "driver_smi": (
        'command -v nvidia-smi >/dev/null 2>&1 || exit 3; t=; command -v timeout >/dev/null 2>&1 && t="timeout 30"; '
        'out=$($t nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>&1); rc=$?; '
        'printf "%s\\n" "$out" | head -n 20; exit $rc'
    ),
    # a driver installed by the distribution's packages (never mixed with the .run)
    "driver_packages": (
        'if command -v dpkg-query >/dev/null 2>&1; then '
        'dpkg-query -W -f \'${Status} ${Package} ${Version}\\n\' 2>/dev/null | grep "^install ok installed" | '
        'cut -d" " -f4- | grep -E "^(nvidia|libnvidia|linux-modules-nvidia|linux-objects-nvidia|cuda-drivers)"; '
        'elif command -v rpm >/dev/null 2>&1; then '
        'rpm -qa --qf "%{NAME} %{VERSION}-%{RELEASE}\\n" 2>/dev/null | '
        'grep -E "^(nvidia|kmod-nvidia|akmod-nvidia|xorg-x11-drv-nvidia|cuda-drivers|dkms-nvidia)"; fi; true'
    ),
    # headers of the running kernel, where DKMS and nvidia-installer look for them
    "kernel_headers": 'k=$(uname -r); [ -d "/lib/modules/$k/build" ] && echo "build /lib/modules/$k/build"; '
                      '[ -d "/usr/src/kernels/$k" ] && echo "devel /usr/src/kernels/$k"; true',
    # which prerequisites are installed as packages, and can the package manager install the others? (local
    # metadata only, never refreshed: apt answers per package once its lists know `make`; dnf lists its cache)
    "prereq_available": (
        'k=$(uname -r); '
        'for p in gcc make dkms epel-release; do '
        'if command -v dpkg-query >/dev/null 2>&1; then '
        '[ "$(dpkg-query -W -f \'${Status}\' "$p" 2>/dev/null)" = "install ok installed" ] && echo "installed $p"; '
        'elif command -v rpm >/dev/null 2>&1; then rpm -q "$p" >/dev/null 2>&1 && echo "installed $p"; fi; done; '
        'if command -v apt-cache >/dev/null 2>&1; then '
        'cand() { apt-cache policy "$1" 2>/dev/null | sed -n "s/^ *Candidate: //p"; }; '
        'c=$(cand make); [ -n "$c" ] && [ "$c" != "(none)" ] || exit 0; '
        'for p in gcc make dkms "linux-headers-$k"; do c=$(cand "$p"); '
        'if [ -n "$c" ] && [ "$c" != "(none)" ]; then echo "avail $p"; else echo "missing $p"; fi; done; '
        'elif command -v dnf >/dev/null 2>&1; then '
        'out=$(dnf -q -C list --available --showduplicates gcc make dkms kernel-devel 2>/dev/null) || exit 0; '
        'printf "%s\\n" "$out" | grep -E "^(gcc|make|dkms|kernel-devel)\\." | sed "s/^/dnf /"; '
        'fi; true'
    ),
})


# Container toolkit, runtime configuration and fabric manager (parsed in gpunode/facts/packages.py,
# gpunode/facts/containers.py and gpunode/steps/fabricmanager.py).
FILE_GROUPS.update({
    "docker_daemon": ("/etc/docker/daemon.json", "/var/snap/docker/current/config/daemon.json"),
    "containerd_config": ("/etc/containerd/config.toml", "/etc/containerd/conf.d/*.toml",
                          "/etc/containerd/config.d/*.toml"),
    "crio_config": ("/etc/crio/crio.conf", "/etc/crio/crio.conf.d/*"),
    "rootless_docker": ("/root/.config/systemd/user/docker.service", "/home/*/.config/systemd/user/docker.service"),
    "package_sources": ("/etc/apt/sources.list", "/etc/apt/sources.list.d/*.list",
                        "/etc/apt/sources.list.d/*.sources", "/etc/yum.repos.d/*.repo", "/etc/zypp/repos.d/*.repo"),
    "package_locks": ("/etc/dnf/plugins/versionlock.list", "/etc/yum/pluginconf.d/versionlock.list",
                      "/etc/zypp/locks"),
})
COMMANDS.update({
    # installed packages as "STATUS<TAB>NAME<TAB>VERSION"; a dpkg status starting with "h" is an apt-mark hold
    "pkg_status": (
        "if command -v dpkg-query >/dev/null 2>&1; then "
        "dpkg-query -W -f='${db:Status-Abbrev}\\t${Package}\\t${Version}\\n' 'nvidia*' 'libnvidia*' "
        "'cuda-drivers*' 2>/dev/null; "
        "elif command -v rpm >/dev/null 2>&1; then "
        "rpm -qa --qf 'ii \\t%{NAME}\\t%{VERSION}-%{RELEASE}\\n' 2>/dev/null | grep -E "
        "'^ii .(nvidia|libnvidia|cuda-drivers|python3-dnf-plugin-versionlock|yum-plugin-versionlock)'; fi; true"
    ),
    # "UNIT<TAB>is-active<TAB>is-enabled" (is-enabled prints nothing or "not-found" for a missing unit)
    "units": (
        "for u in docker.service containerd.service crio.service snap.docker.dockerd.service "
        "nvidia-fabricmanager.service nvidia-persistenced.service; do "
        'printf "%s\\t%s\\t%s\\n" "$u" "$(systemctl is-active "$u" 2>/dev/null)" '
        '"$(systemctl is-enabled "$u" 2>/dev/null)"; done'
    ),
    "nvidia_ctk_version": "nvidia-ctk --version",
    "containerd_version": "containerd --version",
    # NVSwitches the loaded driver has bound (before it loads, PCI class 0x0680 is the evidence)
    "nvswitch_devices": "ls -1 /proc/driver/nvidia-nvswitch/devices",
    # NVLink-5 switch trays (HGX B200) show up as InfiniBand devices whose VPD says SW_MNG
    "nvlink5_switches": "grep -l SW_MNG /sys/class/infiniband/*/device/vpd",
    # the per-GPU "Fabric" blocks of nvidia-smi -q; only where a fabric can exist (NVSwitch bound, or Grace)
    "fabric_state": (
        '[ -r /proc/driver/nvidia/version ] && command -v nvidia-smi >/dev/null 2>&1 || exit 3; '
        '[ -n "$(ls -A /proc/driver/nvidia-nvswitch/devices 2>/dev/null)" ] || [ "$(uname -m)" = aarch64 ] || exit 3; '
        't=; command -v timeout >/dev/null 2>&1 && t="timeout 60"; '
        "$t nvidia-smi -q 2>/dev/null | awk '/^GPU /{print; next} /^    Fabric *$/{f=1; print; next} "
        "f && /^        /{print; next} {f=0}'"
    ),
    "fabricmanager_log": "tail -n 5 /var/log/fabricmanager.log",
    # dnf/yum version locks as the plugin reports them (cache only, no metadata refresh), on NVSwitch nodes only
    "versionlocks": (
        "found=; for d in /sys/bus/pci/devices/*; do [ -r \"$d/class\" ] || continue; read v < \"$d/vendor\"; "
        'read c < "$d/class"; [ "$v" = 0x10de ] && [ "${c%??}" = 0x0680 ] && found=1; done; '
        '[ -n "$found" ] || [ -d /proc/driver/nvidia-nvswitch ] || exit 3; '
        "if command -v dnf >/dev/null 2>&1; then dnf -q -C versionlock list; "
        "elif command -v yum >/dev/null 2>&1; then yum -q -C versionlock list; else exit 3; fi"
    ),
    # fabric manager versions the configured repositories offer (local metadata only), on NVSwitch nodes only
    "fm_available": (
        "found=; for d in /sys/bus/pci/devices/*; do [ -r \"$d/class\" ] || continue; read v < \"$d/vendor\"; "
        'read c < "$d/class"; [ "$v" = 0x10de ] && [ "${c%??}" = 0x0680 ] && found=1; done; '
        '[ -n "$found" ] || [ -d /proc/driver/nvidia-nvswitch ] || exit 3; '
        "if command -v apt-cache >/dev/null 2>&1; then apt-cache policy nvidia-fabricmanager "
        + " ".join(f"nvidia-fabricmanager-{b}" for b in (450, 460, 470, 495, 510, 515, 520, 525, 530, 535, 545,
                                                             550, 555, 560, 565, 570, 575))
        + " 2>/dev/null; elif command -v dnf >/dev/null 2>&1; then dnf -q -C list --showduplicates "
        "nvidia-fabric-manager nvidia-fabricmanager 2>/dev/null; "
        "elif command -v yum >/dev/null 2>&1; then yum -q -C list --showduplicates nvidia-fabric-manager "
        "nvidia-fabricmanager 2>/dev/null; fi; true"
    ),
    # non-empty keyrings apt can name in signed-by=
    "apt_keyrings": ('for f in /usr/share/keyrings/* /etc/apt/keyrings/* /etc/apt/trusted.gpg.d/*; do '
                     '[ -s "$f" ] && echo "$f"; done; true'),
})

# Persistence daemon and /dev/char links (parsed in gpunode/steps/nodesettings.py; its /dev/char links come from
# the doctor's `doctor_dev_char` below, its unit state from `units` above). Unit files and drop-ins in systemd's
# search path, and the udev rules that mention nvidia, in udev's.
SYSTEMD_UNIT_DIRS = ("/etc/systemd/system", "/run/systemd/system", "/usr/local/lib/systemd/system",
                     "/usr/lib/systemd/system", "/lib/systemd/system")
UDEV_RULES_DIRS = ("/etc/udev/rules.d", "/run/udev/rules.d", "/usr/local/lib/udev/rules.d", "/usr/lib/udev/rules.d",
                   "/lib/udev/rules.d")
FILE_GROUPS.update({
    "persistenced_unit": tuple(f"{d}/nvidia-persistenced.service" for d in SYSTEMD_UNIT_DIRS)
    + tuple(f"{d}/nvidia-persistenced.service.d/*.conf" for d in SYSTEMD_UNIT_DIRS),
    "udev_nvidia": tuple(f"{d}/*nvidia*.rules" for d in UDEV_RULES_DIRS),
})

# doctor (parsed in gpunode/doctor/facts.py). Each is read-only and cheap; the NVIDIA ones run only once the
# module is loaded.
FILE_GROUPS.update({
    "doctor_cuda": ("/usr/local/cuda*/version.json", "/usr/local/cuda*/version.txt"),
    "doctor_ctk_config": ("/etc/nvidia-container-runtime/config.toml",),
})
COMMANDS.update({
    # per GPU from nvidia-smi -q: the bus id header, name, brand, UUID, persistence, and the MIG, virtualization
    # and vGPU licence blocks (their indented lines only)
    "doctor_gpus": (
        '[ -r /proc/driver/nvidia/version ] && command -v nvidia-smi >/dev/null 2>&1 || exit 3; '
        't=; command -v timeout >/dev/null 2>&1 && t="timeout 30"; '
        "$t nvidia-smi -q 2>/dev/null | awk '/^GPU /{print; next} "
        "/^    [^ ]/{h=$0; sub(/^ +/, \"\", h); sub(/ *:.*$/, \"\", h); "
        "k=(h==\"MIG Mode\"||h==\"GPU Virtualization Mode\"||h==\"vGPU Software Licensed Product\"); "
        "if (k||h==\"Product Name\"||h==\"Product Brand\"||h==\"Persistence Mode\"||h==\"GPU UUID\") print; next} "
        "/^        [^ ]/{if (k) print}'"
    ),
    # NVIDIA lines of the kernel log since boot: dmesg, else the journal (dmesg is often root-only); exit 3 when
    # neither is readable
    "doctor_kernel_log": (
        'if out=$(dmesg 2>/dev/null) && [ -n "$out" ]; then src=dmesg; '
        'elif command -v journalctl >/dev/null 2>&1 && out=$(journalctl -k -b --no-pager -q 2>/dev/null | '
        'grep -v "^-- ") && [ -n "$out" ]; then src=journal; else exit 3; fi; echo "@source $src"; '
        "printf '%s\\n' \"$out\" | grep -E 'NVRM|Xid|nvidia|nouveau|NVSwitch|nvswitch|Lockdown|unsigned module|"
        "Key was rejected' | tail -n 400; true"
    ),
    # installed kernels (a modules tree with kernel/), their headers and nvidia module; and DKMS's view
    "doctor_kernels": (
        'for d in /lib/modules/*; do [ -d "$d/kernel" ] || continue; '
        'm=$(find "$d/" -name "nvidia.ko*" 2>/dev/null | head -n 1); h=-; [ -e "$d/build" ] && h=headers; '
        'echo "kernel ${d##*/} $h ${m:--}"; done; '
        'command -v dkms >/dev/null 2>&1 && dkms status 2>/dev/null | sed "s/^/dkms /"; true'
    ),
    # NVIDIA device nodes and the /dev/char links to them (runc needs those links after a systemd reload)
    "doctor_dev_char": (
        'for d in /dev/nvidia*; do [ -e "$d" ] && [ ! -d "$d" ] && echo "dev $d"; done; '
        'ls -l /dev/char 2>/dev/null | grep nvidia | sed -n "s/.* \\([0-9][0-9]*:[0-9][0-9]*\\) -> /link \\1 /p"; true'
    ),
    # "UNIT<TAB>is-active<TAB>is-enabled", like `units`
    "doctor_units": (
        'command -v systemctl >/dev/null 2>&1 || exit 3; '
        'for u in nvidia-persistenced.service nvidia-gridd.service unattended-upgrades.service '
        'apt-daily-upgrade.timer dnf-automatic.timer dnf-automatic-install.timer; do '
        'printf "%s\\t%s\\t%s\\n" "$u" "$(systemctl is-active "$u" 2>/dev/null)" '
        '"$(systemctl is-enabled "$u" 2>/dev/null)"; done'
    ),
    # automatic upgrades: apt's merged configuration (or its files when apt-config is missing), dnf-automatic's
    "doctor_auto_upgrade": (
        'if command -v apt-config >/dev/null 2>&1; then apt-config dump 2>/dev/null | grep -E '
        '"^(APT::Periodic::Unattended-Upgrade|Unattended-Upgrade::(Package-Blacklist|Allowed-Origins|'
        'Origins-Pattern))" | sed "s/^/apt /"; '
        'elif [ -d /etc/apt/apt.conf.d ]; then for f in /etc/apt/apt.conf.d/*; do [ -f "$f" ] && '
        'grep -q "Unattended-Upgrade" "$f" && { echo "file $f"; cat "$f"; echo; }; done; fi; '
        '[ -e /usr/bin/unattended-upgrade ] && echo "installed unattended-upgrades"; '
        '[ -r /etc/dnf/automatic.conf ] && grep -E "^[[:space:]]*(apply_updates|upgrade_type)" '
        '/etc/dnf/automatic.conf | sed "s/^/dnf /"; true'
    ),
    # client versions (no daemon contacted)
    "doctor_engines": (
        'command -v docker >/dev/null 2>&1 && echo "docker $(docker --version 2>/dev/null | head -n 1)"; '
        'command -v dockerd >/dev/null 2>&1 && echo "dockerd $(dockerd --version 2>/dev/null | head -n 1)"; '
        'command -v podman >/dev/null 2>&1 && echo "podman $(podman --version 2>/dev/null | head -n 1)"; true'
    ),
    # CDI specs and the driver version their library mounts name
    "doctor_cdi": (
        'for f in /etc/cdi/*.yaml /etc/cdi/*.json /var/run/cdi/*.yaml /var/run/cdi/*.json; do [ -f "$f" ] || '
        'continue; echo "spec $f $(grep -o "libnvidia-ml\\.so\\.[0-9][0-9.]*[0-9]" "$f" 2>/dev/null | head -n 1)"; '
        'done; true'
    ),
    # the node's date, so checks of driver-branch end of life stay pure functions of the facts
    "doctor_date": "date -u +%Y-%m-%d",
})


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
        # The bare `echo` ends a last line that has no newline (an os-release file without a final newline),
        # so the end marker always starts a line; split_sections drops the one empty line it adds otherwise.
        parts.append(f'echo "@{nonce}@begin {name}"\n( {body}\n) 2>/dev/null; s=$?; echo\n'
                     f'echo "@{nonce}@end {name} $s"')
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
            if lines and lines[-1] == "":
                lines.pop()  # the newline the wrapper's `echo` added
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
