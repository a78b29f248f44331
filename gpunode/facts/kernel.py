"""Kernel-side facts: loaded modules, modprobe.d configuration, the kernel command line, Secure Boot,
the NVIDIA kernel module's own version file, and NVIDIA PCI functions. All parsers are pure."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpunode.facts.packages import parse_packages
from gpunode.facts.registry import CAT, RELEASE, STAT_TAKE, command, command_section, core, files, hushed
from gpunode.record import Frozen

_M = __name__.rsplit(".", 1)[-1]

MODPROBE_DIRS = ("/etc/modprobe.d", "/run/modprobe.d", "/usr/local/lib/modprobe.d", "/usr/lib/modprobe.d",
                 "/lib/modprobe.d")

EFI_SECURE_BOOT_VAR = "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"


def parse_modules(text: str) -> frozenset[str]:
    """/proc/modules (or lsmod) -> module names. modprobe treats '-' and '_' alike; we keep '_'."""
    names = set()
    for line in text.splitlines():
        word = line.split(" ", 1)[0].strip()
        if word and word != "Module":
            names.add(word.replace("-", "_"))
    return frozenset(names)


def parse_modprobe_directives(text: str) -> list[tuple[str, ...]]:
    """modprobe.d syntax: '#' comments, trailing-backslash continuation, whitespace-separated words."""
    directives: list[tuple[str, ...]] = []
    pending = ""
    for raw in text.splitlines():
        line = pending + raw
        pending = ""
        if line.rstrip().endswith("\\"):
            pending = line.rstrip()[:-1] + " "
            continue
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        directives.append(tuple(stripped.split()))
    if pending.strip() and not pending.strip().startswith("#"):
        directives.append(tuple(pending.split()))
    return directives


def effective_modprobe_files(files: Mapping[str, str]) -> dict[str, str]:
    """kmod's rule: a file in an earlier directory hides a file with the same name in a later one
    (/etc/modprobe.d/x.conf overrides /usr/lib/modprobe.d/x.conf). Returned in kmod's read order."""
    chosen: dict[str, tuple[int, str]] = {}
    for path in files:
        directory, _, name = path.rpartition("/")
        rank = MODPROBE_DIRS.index(directory) if directory in MODPROBE_DIRS else len(MODPROBE_DIRS)
        if name not in chosen or rank < chosen[name][0]:
            chosen[name] = (rank, path)
    return {chosen[name][1]: files[chosen[name][1]] for name in sorted(chosen)}


_DISABLING_INSTALL = {"/bin/false", "/usr/bin/false", "/bin/true", "/usr/bin/true", "false", "true"}


@dataclass(frozen=True, eq=False, repr=False)
class ModuleBlock(Frozen):
    """How a kernel module is kept from loading, from modprobe.d and the kernel command line."""

    module: str
    blacklisted: bool = False  # `blacklist M` (stops alias auto-loading) or modprobe.blacklist=M
    modeset_off: bool = False  # `options M modeset=0` or M.modeset=0: inert even if loaded by hand
    install_disabled: bool = False  # `install M /bin/false`: never loads at all
    sources: tuple[str, ...] = ()

    @property
    def effective(self) -> bool:
        return (self.blacklisted and self.modeset_off) or self.install_disabled


def module_block(module: str, modprobe_files: Mapping[str, str], cmdline: str = "") -> ModuleBlock:
    blacklisted = modeset_off = install_disabled = False
    sources: list[str] = []
    for path, text in effective_modprobe_files(modprobe_files).items():
        for words in parse_modprobe_directives(text):
            if len(words) < 2 or words[1].replace("-", "_") != module:
                continue
            if words[0] == "blacklist":
                blacklisted = True
                sources.append(f"{path}: blacklist {module}")
            elif words[0] == "options" and "modeset=0" in words[2:]:
                modeset_off = True
                sources.append(f"{path}: options {module} modeset=0")
            elif words[0] == "install" and len(words) >= 3 and words[2] in _DISABLING_INSTALL:
                install_disabled = True
                sources.append(f"{path}: install {module} {words[2]}")
    for arg in cmdline.split():
        key, _, value = arg.partition("=")
        if key in ("modprobe.blacklist", "module_blacklist") and module in value.split(","):
            blacklisted = True
            sources.append(f"kernel command line: {arg}")
        elif key == f"{module}.modeset" and value == "0":
            modeset_off = True
            sources.append(f"kernel command line: {arg}")
    return ModuleBlock(module, blacklisted, modeset_off, install_disabled, tuple(sources))


@dataclass(frozen=True, eq=False, repr=False)
class SecureBoot(Frozen):
    efi: bool
    enabled: bool | None  # None: could not tell
    evidence: str = ""


def parse_secure_boot(text: str) -> SecureBoot:
    """Probe lines: 'efi'|'bios', optional 'efivar <bytes>' (4 attribute bytes then the value),
    optional 'mokutil <first line of mokutil --sb-state>'."""
    efi = False
    enabled: bool | None = None
    evidence: list[str] = []
    for line in text.splitlines():
        word, _, rest = line.strip().partition(" ")
        if word == "efi":
            efi = True
        elif word == "efivar":
            values = rest.split()
            if len(values) >= 5 and values[4].isdigit():
                enabled = values[4] == "1"
                evidence.append(f"SecureBoot efivar = {values[4]}")
        elif word == "mokutil":
            low = rest.lower()
            if "secureboot enabled" in low:
                enabled = True
            elif "secureboot disabled" in low:
                enabled = False if enabled is None else enabled
            elif "not supported" in low:
                efi = efi and enabled is not None
            evidence.append(f"mokutil: {rest.strip()}")
    if not efi and enabled is None:
        return SecureBoot(False, False, "legacy BIOS boot: no Secure Boot")
    return SecureBoot(efi, enabled, "; ".join(evidence) or "UEFI, Secure Boot state unreadable")


@dataclass(frozen=True, eq=False, repr=False)
class LoadedDriver(Frozen):
    """/proc/driver/nvidia/version: exists only while the nvidia module is loaded."""

    version: str
    flavour: str  # "open" | "proprietary"
    raw: str = field(default="", compare=False)


_NVRM = re.compile(r"NVRM version:\s*NVIDIA UNIX\s+(?P<open>Open\s+)?.*?Kernel Module(?:\s+for\s+\S+)?\s+"
                   r"(?P<version>\d+\.\d+(?:\.\d+)?)")


def parse_nvidia_version(text: str) -> LoadedDriver | None:
    match = _NVRM.search(text)
    if not match:
        return None
    return LoadedDriver(match["version"], "open" if match["open"] else "proprietary", text)


@dataclass(frozen=True, eq=False, repr=False)
class PciDevice(Frozen):
    address: str  # 0000:3b:00.0
    vendor: int
    device: int
    pci_class: int  # 0x030200

    @property
    def device_id(self) -> str:
        return f"{self.device:04x}"

    @property
    def is_gpu(self) -> bool:
        return self.pci_class >> 16 == 0x03  # display controller: VGA 0x0300, 3D 0x0302

    @property
    def is_nvswitch(self) -> bool:
        return self.pci_class >> 8 == 0x0680  # "Bridge: other", how NVSwitches enumerate


def parse_pci(text: str) -> tuple[PciDevice, ...]:
    """Probe lines '<address> <vendor> <device> <class>' in sysfs hex form (0x10de 0x2330 0x030200)."""
    devices = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 4:
            continue
        try:
            vendor, device, cls = (int(p, 16) for p in parts[1:])
        except ValueError:
            continue
        devices.append(PciDevice(parts[0], vendor, device, cls))
    return tuple(sorted(devices, key=lambda d: d.address))


def loaded(modules: Iterable[str], name: str) -> bool:
    return name.replace("-", "_") in set(modules)


# ---- NVIDIA device nodes and their /dev/char links (probe command doctor_dev_char) ---------------------------

# The device nodes the NVIDIA container runtime puts into containers, i.e. the ones whose /dev/char/MAJ:MIN link
# systemd needs when it re-applies device rules on `daemon-reload`; `nvidia-ctk system create-dev-char-symlinks
# --create-all` links exactly these. NVSwitch nodes (nvidia-nvswitch*, for fabric manager on the host) are not.
CONTAINER_DEVICE = re.compile(r"^nvidia(\d+|ctl|-modeset|-uvm|-uvm-tools)$")


@dataclass(frozen=True, eq=False, repr=False)
class DevChar(Frozen):
    devices: tuple[str, ...] = ()  # /dev/nvidia0, /dev/nvidiactl, ... (every /dev/nvidia* node)
    links: Mapping[str, str] = field(default_factory=dict)  # device basename -> /dev/char/MAJ:MIN

    @property
    def container_devices(self) -> list[str]:
        return [d for d in self.devices if CONTAINER_DEVICE.match(d.rsplit("/", 1)[-1])]

    @property
    def missing(self) -> list[str]:
        """Container device nodes without a /dev/char link."""
        return [d for d in self.container_devices if d.rsplit("/", 1)[-1] not in self.links]


def parse_dev_char(text: str) -> DevChar:
    """Probe lines `dev /dev/nvidia0` (a device node) and `link 195:0 /dev/nvidia0` (from `ls -l /dev/char`)."""
    devices, links = [], {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "dev":
            devices.append(parts[1])
        elif len(parts) == 3 and parts[0] == "link":
            links[parts[2].rsplit("/", 1)[-1]] = f"/dev/char/{parts[1]}"
    return DevChar(tuple(devices), links)


def parse_initramfs(text: str) -> int | None:
    """`MTIME PATH` lines -> the newest initramfs image's mtime; None: no image found for the running kernel."""
    stamps = [int(line.split()[0]) for line in text.splitlines() if line.split() and line.split()[0].isdigit()]
    return max(stamps) if stamps else None


def parse_headers(text: str) -> tuple[str, ...]:
    """`build PATH` (/lib/modules/$(uname -r)/build, what DKMS and nvidia-installer look for) or `devel PATH`
    (/usr/src/kernels/$(uname -r) on the RHEL family) -> the header directories found."""
    return tuple(line.split(" ", 1)[1] for line in text.splitlines()
                 if line.split(" ", 1)[0] in ("build", "devel") and " " in line)


def _stripped(text: str) -> str:
    return text.strip()


# ---- the facts ------------------------------------------------------------------------------------------------

# small files are read by the shell itself (registry.CAT): a process costs a slow node tens of ms
CMDLINE = core("cmdline", CAT + "gpunode_cat /proc/cmdline", _stripped, module=_M)
MODULES = core("modules", "cat /proc/modules", parse_modules, module=_M)
LOADED_DRIVER = core("nvidia_version", CAT + "gpunode_cat /proc/driver/nvidia/version", parse_nvidia_version, module=_M)
PCI = core("pci", (
    'for d in /sys/bus/pci/devices/*; do [ -r "$d/vendor" ] || continue; '
    'read v < "$d/vendor"; [ "$v" = 0x10de ] || continue; '
    'read dev < "$d/device"; read cls < "$d/class"; echo "${d##*/} $v $dev $cls"; done; true'
), parse_pci, module=_M)
SECURE_BOOT = core("secure_boot", (
    'if [ -d /sys/firmware/efi ]; then echo efi; else echo bios; fi; '
    f'[ -r {EFI_SECURE_BOOT_VAR} ] && echo "efivar $(od -An -tu1 {EFI_SECURE_BOOT_VAR} | tr -s " \\n" " ")"; '
    'command -v mokutil >/dev/null 2>&1 && echo "mokutil $(mokutil --sb-state 2>&1 | head -n 1)"; true'
), parse_secure_boot, module=_M)
# initramfs images for the running kernel, with their modification time (seconds since the epoch): Debian's
# initramfs-tools (initrd.img-K), Red Hat's dracut (initramfs-K.img), SUSE's dracut (initrd-K), Arch
# (their mtimes from the probe's shared stat where it made one: registry.STAT_TAKE)
INITRAMFS_PATHS = ('"/boot/initrd.img-$k"', '"/boot/initramfs-$k.img"', '"/boot/initrd-$k"', "/boot/initramfs-linux.img")
INITRAMFS = core("initramfs", (
    RELEASE + STAT_TAKE + 'set --; for f in ' + " ".join(INITRAMFS_PATHS) + '; do [ -e "$f" ] && set -- "$@" "$f"; '
    'done; gpunode_take "$@"; for f; do if [ -n "$m" ]; then t=${m%%[!0-9]*}; m=${m#*"$gpunode_nl"}; '
    'echo "$t $f"; else echo "$(stat -c %Y "$f") $f"; fi; done; true'
), parse_initramfs, module=_M, stats=INITRAMFS_PATHS)
MODPROBE_D = files("modprobe_d", tuple(f"{d}/*.conf" for d in MODPROBE_DIRS), module=_M)
# headers of the running kernel, where DKMS and nvidia-installer look for them
HEADERS = command("kernel_headers", RELEASE + '[ -d "/lib/modules/$k/build" ] && echo "build /lib/modules/$k/build"; '
                  '[ -d "/usr/src/kernels/$k" ] && echo "devel /usr/src/kernels/$k"; true', parse_headers, module=_M)
# NVIDIA device nodes and the /dev/char links to them (runc needs those links after a systemd reload)
# (the links from `ls -l /dev/char`: of a line with nvidia in it, the last ` MAJ:MIN -> ` and what follows, picked
# by the shell, as `sed -n "/nvidia/s/.* \([0-9][0-9]*:[0-9][0-9]*\) -> /link \1 /p"` printed them: a process
# fewer. The lines are read from a here-document, not cut off the answer one by one: on the real VM bash took
# ~95 ms to cut 125 lines and 20 ms to read them. Where no line names nvidia, none is read. An ls -l line has a
# blank before the link's name.)
DEV_CHAR = command("doctor_dev_char", (
    'for d in /dev/nvidia*; do [ -e "$d" ] && [ ! -d "$d" ] && echo "dev $d"; done; '
    + hushed('o=$(ls -l /dev/char)') + '; case $o in *nvidia*) '
    'while IFS= read -r l; do case $l in *nvidia*) t=$l; '
    'while case $t in *" -> "*) true ;; *) false ;; esac; do p=${t%" -> "*}; n=${p##* }; t=$p; '
    'case $n in [0-9]*:[0-9]*) case ${n%%:*}${n#*:} in *[!0-9]*) ;; *) '
    'printf "link %s %s\\n" "$n" "${l#"$p -> "}"; break ;; esac ;; esac; done ;; esac; done <<GPUNODE_LS\n'
    '$o\nGPUNODE_LS\n;; esac; true'
), parse_dev_char, module=_M)


# ---- installed kernels, the one the next boot runs, and DKMS's builds ------------------------------------------


@dataclass(frozen=True, eq=False, repr=False)
class Kernel(Frozen):
    name: str  # 5.15.0-91-generic
    headers: bool  # /lib/modules/K/build resolves (what DKMS and nvidia-installer build against)
    module: str | None  # path of an nvidia.ko built for it
    image: bool | None = None  # /boot/vmlinuz-K (or /lib/modules/K/vmlinuz) exists; None: not reported


@dataclass(frozen=True, eq=False, repr=False)
class DkmsEntry(Frozen):
    module: str
    version: str
    kernel: str | None  # None: added or built for no kernel yet
    status: str  # installed | built | added | ...


@dataclass(frozen=True, eq=False, repr=False)
class DkmsFailure(Frozen):
    """DKMS's last build of an nvidia module, when it failed: its build tree keeps make.log, whose first line names
    the module, the version and the kernel (`DKMS make.log for nvidia-current-open-535.261.03 for kernel K (x86_64)`),
    and the compiler's first error. A build that succeeded afterwards for the same kernel supersedes it
    (Kernels.failed_build)."""

    log: str  # /var/lib/dkms/MODULE/VERSION/build/make.log
    module: str  # nvidia-current-open-535.261.03: DKMS's "MODULE-VERSION"
    kernel: str
    error: str  # the compiler's first error line, the build tree's path left out


@dataclass(frozen=True, eq=False, repr=False)
class Kernels(Frozen):
    """`known`: the probe ran. `kernels`: modules trees with a kernel/ directory whose image is in /boot (a tree
    left behind by a removed kernel, with only DKMS's updates/ in it, is not a kernel). `grub_default`: GRUB_DEFAULT
    from /etc/default/grub; `grubby`: what `grubby --default-kernel` names (the RHEL family)."""

    known: bool = False
    kernels: tuple[Kernel, ...] = ()
    dkms: tuple[DkmsEntry, ...] = ()
    grubby: str | None = None
    grub_default: str | None = None
    failures: tuple[DkmsFailure, ...] = ()

    def failed_build(self, kernel: str) -> DkmsFailure | None:
        """DKMS's failed build of an nvidia module for `kernel`, unless a module for it is there after all."""
        if self.built_for(kernel):
            return None
        return next((f for f in self.failures if f.kernel == kernel), None)

    @property
    def newest(self) -> Kernel | None:
        return max(self.kernels, key=lambda k: kernel_key(k.name)) if self.kernels else None

    def get(self, name: str) -> Kernel | None:
        return next((k for k in self.kernels if k.name == name), None)

    @property
    def boot_default(self) -> tuple[Kernel | None, str]:
        """The kernel the next boot runs, and how that was decided. grubby answers on the RHEL family; elsewhere
        GRUB_DEFAULT=0 (the default) boots the first menu entry, which grub's 10_linux makes the newest kernel;
        any other GRUB_DEFAULT (saved, a menu title) is not evaluated and the newest is assumed."""
        if self.grubby:
            named = self.get(self.grubby)
            if named is not None:
                return named, "grubby --default-kernel"
        newest = self.newest
        if self.grub_default in (None, "", "0"):
            return newest, "the newest installed kernel: GRUB_DEFAULT=0 boots it"
        return newest, f"assumed the newest installed kernel: GRUB_DEFAULT={self.grub_default} is not evaluated"

    def built_for(self, kernel: str) -> list[str]:
        """Where an nvidia module for `kernel` comes from: its file, or DKMS's record."""
        found = [k.module for k in self.kernels if k.name == kernel and k.module]
        found += [f"dkms {e.module}/{e.version}" for e in self.dkms
                  if e.module.startswith("nvidia") and e.kernel == kernel and e.status.startswith("installed")]
        return [f for f in found if f]

    def dkms_versions(self, module: str = "nvidia") -> tuple[str, ...]:
        """The versions of `module` DKMS knows (added, built or installed for some kernel)."""
        return tuple(dict.fromkeys(e.version for e in self.dkms if e.module == module))

    def dkms_installed(self, kernel: str, version: str, module: str = "nvidia") -> bool:
        return any(e.module == module and e.version == version and e.kernel == kernel and
                   e.status.startswith("installed") for e in self.dkms)

    def later_than(self, running: str) -> tuple[Kernel, ...]:
        """Installed kernels the next boot may run instead of `running`: those newer than it, and the boot default."""
        default, _ = self.boot_default
        return tuple(k for k in sorted(self.kernels, key=lambda k: kernel_key(k.name))
                     if k.name != running and (kernel_key(k.name) > kernel_key(running) or k == default))


def kernel_key(name: str) -> tuple[tuple[int, str], ...]:
    """Version order of kernel release names: numbers compare as numbers (5.15.0-100 after 5.15.0-91), separators
    do not count, and a number is newer than letters in the same place, as rpm compares them (RHEL's z-stream
    5.14.0-362.8.1.el9_3 after 5.14.0-362.el9)."""
    return tuple((int(part), "") if part.isdigit() else (-1, part) for part in re.findall(r"\d+|[A-Za-z]+", name))


def parse_dkms_status(text: str) -> tuple[DkmsEntry, ...]:
    """`dkms status` lines of dkms 3 (`nvidia/535.129.03, 5.15.0-91-generic, x86_64: installed`) and dkms 2
    (`nvidia, 535.129.03, 5.15.0-91-generic, x86_64: installed`), or `nvidia/535.129.03: added`; a status may carry
    a remark (`installed (WARNING! Diff between built and installed module!)`)."""
    entries = []
    for line in text.splitlines():
        left, colon, status = line.strip().partition(": ")
        if not colon or not status.strip():
            continue
        parts = [p.strip() for p in left.split(",")]
        if "/" in parts[0]:
            module, _, version = parts[0].partition("/")
            rest = parts[1:]
        elif len(parts) >= 2:
            module, version, rest = parts[0], parts[1], parts[2:]
        else:
            continue
        entries.append(DkmsEntry(module, version, rest[0] if rest else None, status.strip().split()[0]))
    return tuple(entries)


def parse_kernels(text: str | None) -> Kernels:
    """Probe lines `kernel NAME headers|- MODULE|- [image|-]`, `dkms <dkms status line>`, `grubby PATH` and
    `grubdefault VALUE`."""
    if text is None:
        return Kernels()
    kernels = []
    dkms_lines = []
    grubby = grub_default = None
    failures: list[DkmsFailure] = []
    for line in text.splitlines():
        word, _, rest = line.partition(" ")
        if word == "kernel":
            parts = rest.split()
            if len(parts) >= 3:
                image = None if len(parts) < 4 else parts[3] == "image"
                if image is False:
                    continue  # a modules tree without a kernel image: leftovers of a removed kernel
                kernels.append(Kernel(parts[0], parts[1] == "headers", None if parts[2] == "-" else parts[2], image))
        elif word == "dkms":
            dkms_lines.append(rest)
        elif word == "grubby" and rest.strip():
            grubby = rest.strip().rsplit("/", 1)[-1].removeprefix("vmlinuz-")
        elif word == "grubdefault":
            grub_default = rest.strip().strip("\"'")
        elif word == "dkmsfail":
            failure = _dkms_failure(rest)
            if failure is not None:
                failures.append(failure)
    return Kernels(True, tuple(kernels), parse_dkms_status("\n".join(dkms_lines)), grubby, grub_default,
                   tuple(failures))


_MAKE_LOG_HEAD = re.compile(r"DKMS make\.log for (?P<module>\S+) for kernel (?P<kernel>\S+)")


def _dkms_failure(rest: str) -> DkmsFailure | None:
    """`dkmsfail LOG | FIRST LINE OF make.log | FIRST ERROR LINE` (the probe's line)."""
    parts = [p.strip() for p in rest.split(" | ", 2)]
    if len(parts) != 3 or not parts[2]:
        return None
    head = _MAKE_LOG_HEAD.match(parts[1])
    if head is None:
        return None
    build = parts[0].removesuffix("make.log")  # the compiler names sources by their path in the build tree
    error = parts[2].replace(build, "") if build.endswith("/build/") else parts[2]
    return DkmsFailure(parts[0], head["module"], head["kernel"], error)


# installed kernels (a modules tree with kernel/): headers (build resolves), an nvidia module (nvidia.ko, or Debian's
# nvidia-current.ko / nvidia-tesla-535.ko: the same module under the file name its packages give it), the image in /boot;
# DKMS's view and its last failed build of an nvidia module (make.log with a compiler error); the boot default (grubby on the RHEL family, GRUB_DEFAULT elsewhere). The name is historical: the
# doctor read it first; the driver step reads it too.
# The first path of $r (one a line) whose file name is the main nvidia module's, in $m: nvidia.ko, nvidia-open.ko,
# nvidia-current[-open].ko, nvidia-tesla-N[-open].ko, compressed or not (what `grep -E
# "/nvidia(-current|-tesla-[0-9]+)?(-open)?\\.ko" | head -n 1` kept, two processes fewer per kernel).
FIRST_MAIN_MODULE = (
    'm=; while [ -n "$r" ] && [ -z "$m" ]; do p=${r%%"\n"*}; r=${r#"$p"}; r=${r#"\n"}; b=${p##*/}; '
    'case $b in nvidia.ko*|nvidia-open.ko*|nvidia-current.ko*|nvidia-current-open.ko*) m=$p;; '
    'nvidia-tesla-[0-9]*.ko*) t=${b#nvidia-tesla-}; t=${t%%.ko*}; t=${t%-open}; '
    'case $t in *[!0-9]*) ;; *) m=$p;; esac;; esac; done; ')
KERNELS = command_section("doctor_kernels", (
    'for d in /lib/modules/*; do [ -d "$d/kernel" ] || continue; k=${d##*/}; '
    + hushed('r=$(find "$d/" -name "nvidia*.ko*")') + '; ' + FIRST_MAIN_MODULE + 'h=-; [ -e "$d/build" ] && h=headers; '
    'i=-; { [ -e "/boot/vmlinuz-$k" ] || [ -e "$d/vmlinuz" ]; } && i=image; '
    'echo "kernel $k $h ${m:--} $i"; done; '
    'command -v dkms >/dev/null 2>&1 && dkms status 2>/dev/null | sed "s/^/dkms /"; '
    'for l in /var/lib/dkms/nvidia*/*/build/make.log; do [ -r "$l" ] || continue; '
    'e=$(grep -m 1 -E ": (fatal )?error: " "$l"); [ -n "$e" ] && echo "dkmsfail $l | $(head -n 1 "$l") | $e"; done; '
    'command -v grubby >/dev/null 2>&1 && echo "grubby $(grubby --default-kernel 2>/dev/null)"; '
    '[ -r /etc/default/grub ] && { g=; while IFS= read -r l || [ -n "$l" ]; do case $l in GRUB_DEFAULT=*) g=$l;; esac; '
    'l=; done < /etc/default/grub; [ -n "$g" ] && printf "grubdefault %s\\n" "${g#GRUB_DEFAULT=}"; }; true'
), lambda s: parse_kernels(s.text if s.ok else None), module=_M)


# ---- kernel packages: metapackages and their holds, headers packages the repositories offer ---------------------


def parse_headers_available(text: str) -> dict[str, bool]:
    """Probe lines `avail PACKAGE` / `missing PACKAGE` (apt-cache policy's candidate, per headers package) and
    `dnf kernel-devel.ARCH VERSION REPO` (dnf's cached list) -> {package name: offered}. dnf's rows become
    `kernel-devel-VERSION.ARCH` names, the way the running kernel's release spells them."""
    found: dict[str, bool] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in ("avail", "missing"):
            found[parts[1]] = parts[0] == "avail"
        elif len(parts) >= 3 and parts[0] == "dnf":
            name, _, arch = parts[1].rpartition(".")
            found[f"{name}-{parts[2].split(':')[-1]}.{arch}"] = True
    return found


# SUSE names a kernel's packages by its flavour, the tail of the release: 6.4.0-150600.23.25-default is
# kernel-default 6.4.0-150600.23.25.x, its headers kernel-default-devel (NVIDIA's installation guide for SUSE:
# `zypper install -y kernel-<variant>-devel=<version>`, variant=$(uname -r | awk -F- '{print $NF}'),
# version=$(uname -r | sed "s/-${variant}//"): https://docs.nvidia.com/cuda/cuda-installation-guide-linux/).
SUSE_FLAVOURS = ("default", "azure", "rt", "64kb", "kvmsmall")
# kernel packages with their dpkg status (an "h" is an apt-mark hold) or rpm versions, as "STATUS<TAB>NAME<TAB>VER"
KERNEL_PACKAGES = command("kernel_packages", (
    "if command -v dpkg-query >/dev/null 2>&1; then "
    "dpkg-query -W -f='${db:Status-Abbrev}\\t${Package}\\t${Version}\\n' 'linux-*' 2>/dev/null; "
    "elif command -v rpm >/dev/null 2>&1; then "
    "rpm -q --qf 'ii \\t%{NAME}\\t%{VERSION}-%{RELEASE}\\n' kernel kernel-core kernel-modules kernel-devel "
    + "".join(f"kernel-{f} kernel-{f}-devel " for f in SUSE_FLAVOURS) +
    "2>/dev/null | grep '^ii '; fi; true"
), parse_packages, module=_M, late=True)
# can the package manager install the headers of the installed kernels that lack them? (local metadata only)
HEADERS_AVAILABLE = command("kernel_headers_available", (
    'if command -v apt-cache >/dev/null 2>&1; then '
    'for d in /lib/modules/*; do [ -d "$d/kernel" ] && [ ! -e "$d/build" ] || continue; p="linux-headers-${d##*/}"; '
    'c=$(apt-cache policy "$p" 2>/dev/null | sed -n "s/^ *Candidate: //p"); '
    'if [ -n "$c" ] && [ "$c" != "(none)" ]; then echo "avail $p"; else echo "missing $p"; fi; done; '
    'elif command -v dnf >/dev/null 2>&1; then '
    'dnf -q -C list --available --showduplicates kernel-devel 2>/dev/null | grep -E "^kernel-devel\\." | '
    'sed "s/^/dnf /"; fi; true'
), parse_headers_available, module=_M, late=True)
