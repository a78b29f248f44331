"""Driver facts: the user space and module on disk, NVML's answer, distribution driver packages, the GPUs as
nvidia-smi -q reports them, and the CUDA toolkits installed. All parsers are pure; `driver_state` combines them
with the loaded module into what the driver step and the doctor reason about."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from packaging.version import Version

from gpunode import versions
from gpunode.facts.containers import journal_text
from gpunode.facts.kernel import (
    FIRST_MAIN_MODULE,
    MODPROBE_D,
    LoadedDriver,
    effective_modprobe_files,
    parse_modprobe_directives,
)
from gpunode.facts.packages import dpkg_status
from gpunode.facts.registry import (
    HUNG,
    RELEASE,
    SMI_CALL,
    Section,
    command,
    command_section,
    files,
    hushed,
    smi_output,
)
from gpunode.record import Frozen

if TYPE_CHECKING:
    from gpunode.facts import Facts

_M = __name__.rsplit(".", 1)[-1]

# ---- the driver on disk ----------------------------------------------------------------------------------------

# (Debian's own names too, as its packaged driver installs them: nvidia-smi, nvidia-alternative, libcuda1,
# libnvidia-cfg1, libnvidia-ptxjitcompiler1, firmware-nvidia-gsp; nvidia-modprobe and nvidia-persistenced are
# not counted: repositories ship them for .run drivers too)
DRIVER_PACKAGE = re.compile(
    r"^(nvidia-driver|nvidia-dkms|nvidia-kernel|nvidia-headless|nvidia-utils|nvidia-compute-utils|"
    r"libnvidia-(?!container)|linux-modules-nvidia|linux-objects-nvidia|cuda-drivers|"
    r"nvidia-open|kmod-nvidia|akmod-nvidia|xorg-x11-drv-nvidia|dkms-nvidia|nvidia-kmod|"
    r"nvidia-smi$|nvidia-alternative$|nvidia-tesla-|libcuda1$|firmware-nvidia-gsp$)")


@dataclass(frozen=True, eq=False, repr=False)
class PackagedDriver(Frozen):
    """A driver installed by the distribution's packages, as Debian ships it: the package that builds its kernel
    module (nvidia-kernel-dkms, nvidia-open-kernel-dkms, nvidia-tesla-535-kernel-dkms, ...), the upstream
    version that package carries, the module flavour that package means, and Debian's own names: the
    alternative that selects the driver (/usr/lib/nvidia/current) and the module files the kernel knows by
    another name (nvidia-current.ko is `nvidia`)."""

    owner: str  # the package that owns the kernel module (or, without one, the first driver package)
    version: str | None  # upstream version of that package (535.261.03 of 535.261.03-1)
    package_version: str  # the package's own version string
    flavour: str | None  # "open" | "proprietary" from the package's name; None: cannot tell
    alternative: str | None = None  # update-alternatives --query nvidia: the selected value
    module_files: tuple[tuple[str, str], ...] = ()  # (file, name the kernel gives it) for the running kernel
    modprobe_nvidia: str | None = None  # the modprobe configuration's `install nvidia ...`/`alias nvidia ...` line

    @property
    def loads_as_nvidia(self) -> bool:
        """`modprobe nvidia` finds the module: a file named nvidia.ko, or a configuration line that redirects the
        name (Debian's `install nvidia modprobe -i nvidia-current`, linked in only with its glx alternative)."""
        return self.modprobe_nvidia is not None or not self.renamed

    @property
    def renamed(self) -> bool:
        """The module file of `nvidia` is not nvidia.ko (Debian's nvidia-current.ko, nvidia-tesla-535.ko)."""
        return any(name == "nvidia" and not f.rsplit("/", 1)[-1].startswith("nvidia.ko") for f, name in
                   self.module_files)


@dataclass(frozen=True, eq=False, repr=False)
class DriverState(Frozen):
    loaded: LoadedDriver | None = None
    libraries: tuple[str, ...] = ()  # versions of the libnvidia-ml.so.<version> files found
    installer: str | None = None  # `nvidia-installer --version`: what the .run installed
    module: str | None = None  # version of the nvidia.ko the running kernel would load
    module_flavour: str | None = None  # from its license: "Dual MIT/GPL" is the open module
    packages: tuple[tuple[str, str], ...] = ()  # distribution driver packages: (name, version)
    smi_status: int | None = None  # nvidia-smi's exit status; None: no nvidia-smi
    smi_text: str = ""
    packaged: PackagedDriver | None = None  # the distribution's driver, when packages installed one

    @property
    def installed(self) -> str | None:
        """The user-space version on disk: the installer's record, else the library suffix."""
        if self.installer:
            return self.installer
        return max(self.libraries, key=Version) if self.libraries else None

    @property
    def mismatch(self) -> bool:
        """NVML's "Driver/library version mismatch": the loaded module is not the installed user space."""
        if "version mismatch" in self.smi_text.lower():
            return True
        return bool(self.loaded and self.installed and self.loaded.version != self.installed)


def parse_userspace(text: str) -> tuple[tuple[str, ...], str | None]:
    libs = sorted({m.group(1) for m in re.finditer(rf"libnvidia-ml\.so\.({versions.DRIVER})\s*$", text, re.M)})
    record = re.search(rf"^installer .*?version\s+({versions.DRIVER})", text, re.M | re.I)
    return tuple(libs), record.group(1) if record else None


@dataclass(frozen=True, eq=False, repr=False)
class ModuleInfo(Frozen):
    """`modinfo nvidia`: the module the running kernel would load."""

    version: str | None = None
    flavour: str | None = None  # from its license: "open" ("Dual MIT/GPL") | "proprietary" ("NVIDIA")
    signer: str | None = None  # who signed it (Secure Boot); None: unsigned
    filename: str | None = None  # /lib/modules/K/updates/dkms/nvidia-current.ko on Debian
    name: str | None = None  # the kernel's name for it (`nvidia`, whatever the file is called)


def parse_module(text: str) -> ModuleInfo:
    """`modinfo nvidia` lines (filename, version, license, signer) -> ModuleInfo."""
    version = re.search(rf"^version:\s*({versions.DRIVER})", text, re.M)
    licence = re.search(r"^license:\s*(.+)$", text, re.M)
    signer = re.search(r"^signer:\s*(\S.*)$", text, re.M)
    filename = re.search(r"^filename:\s*(/\S+)", text, re.M)
    name = re.search(r"^name:\s*(\S+)", text, re.M)
    flavour = None
    if licence:
        flavour = "proprietary" if licence.group(1).strip() == "NVIDIA" else "open"
    return ModuleInfo(version.group(1) if version else None, flavour, signer.group(1).strip() if signer else None,
                      filename.group(1) if filename else None, name.group(1) if name else None)


def parse_packages(text: str) -> tuple[tuple[str, str], ...]:
    found = []
    for line in text.splitlines():
        name, _, version = line.strip().partition(" ")
        if DRIVER_PACKAGE.match(name) and "container" not in name:
            found.append((name, version.strip()))
    return tuple(found)


# the package that builds the kernel module, per distribution naming: Debian's nvidia-kernel-dkms,
# nvidia-open-kernel-dkms, nvidia-tesla-535-kernel-dkms, nvidia-tesla-470-kernel-dkms (and -source variants),
# Ubuntu's nvidia-dkms-535(-open) and linux-modules-nvidia-535(-open)-K, RHEL's kmod-nvidia and akmod-nvidia
_MODULE_PACKAGE = re.compile(r"^(?:nvidia(?:-tesla-\d+)?(?:-open)?-kernel-(?:dkms|source)|nvidia-dkms-\d+(?:-open)?|"
                             r"linux-modules-nvidia-\d+|kmod-nvidia|akmod-nvidia|dkms-nvidia|nvidia-kmod)")


def upstream_version(package_version: str) -> str | None:
    """The NVIDIA release inside a package version: 535.261.03 of `535.261.03-1`, `3:580.95.05-1.el9`,
    `535.183.01-0ubuntu0.22.04.1`, SUSE's kernel module packages `580.95.05_k6.4.0_150600.23.25-1`; None when it
    carries none."""
    found = re.search(rf"(?:^|:)({versions.DRIVER})(?=-|$|\+|~|_k)", package_version)
    return found.group(1) if found else None


@dataclass(frozen=True, eq=False, repr=False)
class DebianNames(Frozen):
    alternative: str | None = None
    module_files: tuple[tuple[str, str], ...] = ()


def parse_debian_names(text: str) -> DebianNames:
    """Lines `alt VALUE` (update-alternatives --query nvidia) and `ko FILE [NAME]`, one per nvidia*.ko in the running
    kernel's DKMS/installer directories (without NAME: the name the kernel gives that file, by kernel_name)."""
    alternative = None
    files = []
    for line in text.splitlines():
        word, _, rest = line.partition(" ")
        if word == "alt" and rest.strip():
            alternative = rest.strip()
        elif word == "ko":
            path, _, name = rest.strip().partition(" ")
            if path.startswith("/"):
                files.append((path, name.strip() or kernel_name(path)))
    return DebianNames(alternative, tuple(files))


def kernel_name(path: str) -> str:
    """The name the kernel gives a driver module file: Debian's renamed files drop their flavour part
    (nvidia-current-uvm.ko, nvidia-tesla-535-uvm.ko, nvidia-current-open.ko -> nvidia_uvm, nvidia_uvm, nvidia), and
    `-` reads as `_` (`modinfo -F name`, checked on the real-OS tier's nvidia VM)."""
    base = path.rsplit("/", 1)[-1].split(".ko", 1)[0]
    base = re.sub(r"^nvidia-(?:current|tesla-\d+)(?:-open)?", "nvidia", base)
    return base.replace("-", "_")


def modprobe_redirect(modprobe_files: Mapping[str, str], name: str = "nvidia") -> str | None:
    """The modprobe.d line that makes `modprobe NAME` load something (`install nvidia modprobe -i nvidia-current`,
    `alias nvidia nvidia-current`), from the files kmod reads; None without one."""
    for text in effective_modprobe_files(modprobe_files).values():
        for words in parse_modprobe_directives(text):
            if len(words) >= 3 and words[0] in ("install", "alias") and words[1] == name:
                return " ".join(words)
    return None


def packaged_driver(packages: tuple[tuple[str, str], ...], names: DebianNames,
                    modprobe_files: Mapping[str, str] | None = None) -> PackagedDriver | None:
    """The distribution's driver from the installed driver packages and Debian's names; None without packages."""
    if not packages:
        return None
    owner = next(((n, v) for n, v in packages if _MODULE_PACKAGE.match(n)), None)
    name, version = owner or next(((n, v) for n, v in packages if upstream_version(v)), packages[0])
    flavour = None
    if owner is not None:
        flavour = "open" if "open" in name else "proprietary"
    return PackagedDriver(name, upstream_version(version), version, flavour, names.alternative, names.module_files,
                          modprobe_redirect(modprobe_files or {}))


@dataclass(frozen=True, eq=False, repr=False)
class Smi(Frozen):
    """`nvidia-smi --query-gpu=driver_version`: its exit status (None: no nvidia-smi) and the first lines it printed."""

    status: int | None = None
    text: str = ""


def parse_smi(section: Section) -> Smi:
    text = section.text.strip()
    if section.status == HUNG:  # the shell's "Killed" may come first: the line that names the hang is what counts
        text = next((line for line in text.splitlines() if line.endswith("(hung)")), text)
    return Smi(None if section.status in (3, 127) else section.status, text)


def driver_state(facts: Facts) -> DriverState:
    libs, record = facts[USERSPACE]
    module = facts[MODULE]
    smi = facts[SMI]
    packages = facts[PACKAGES]
    names = facts[DEBIAN_NAMES]
    if module.filename and module.name and (module.filename, module.name) not in names.module_files:
        names = DebianNames(names.alternative, (*names.module_files, (module.filename, module.name)))
    return DriverState(facts.loaded_driver, libs, record, module.version, module.flavour, packages, smi.status,
                       smi.text, packaged_driver(packages, names, facts[MODPROBE_D]))


# ---- nvidia-smi -q -------------------------------------------------------------------------------------------


def pci_address(bus: str) -> str:
    """nvidia-smi's 00000000:00:1E.0 and the kernel's 0000:00:1e.0 -> 0000:00:1e.0 (also for a bare 00:1e.0)."""
    parts = bus.strip().lower().split(":")
    if len(parts) == 2:
        parts = ["0000", *parts]
    if len(parts) != 3:
        return bus.strip().lower()
    domain = parts[0][-4:].rjust(4, "0")
    return f"{domain}:{parts[1]}:{parts[2] if '.' in parts[2] else parts[2] + '.0'}"


@dataclass(frozen=True, eq=False, repr=False)
class SmiGpu(Frozen):
    index: int  # position in nvidia-smi's output: NVML's index, what --gpus device=N and ctr --gpus N mean
    bus: str  # 0000:00:1e.0
    name: str = ""
    brand: str = ""
    uuid: str = ""
    persistence: str = ""  # Enabled | Disabled
    mig_current: str = ""  # Enabled | Disabled | N/A ("" when not reported)
    mig_pending: str = ""
    virtualization: str = ""  # None | Pass-Through | VGPU | Host VGPU | ...
    license: str = ""  # vGPU guests: "Licensed (Expiry: ...)" | "Unlicensed ..."


_SECTION_KEYS = {("MIG Mode", "Current"): "mig_current", ("MIG Mode", "Pending"): "mig_pending",
                 ("GPU Virtualization Mode", "Virtualization Mode"): "virtualization",
                 ("vGPU Software Licensed Product", "License Status"): "license"}
_TOP_KEYS = {"Product Name": "name", "Product Brand": "brand", "GPU UUID": "uuid", "Persistence Mode": "persistence"}


def parse_gpus(text: str) -> tuple[SmiGpu, ...]:
    """The lines the probe keeps of `nvidia-smi -q`: `GPU <bus>` headers, four-space fields and section
    headers, and eight-space fields of the MIG, virtualization and vGPU licence sections."""
    found: list[SmiGpu] = []
    current: dict[str, str] | None = None
    section = ""

    def flush() -> None:
        if current is not None:
            found.append(SmiGpu(len(found), pci_address(current.pop("bus")), **current))

    for line in text.splitlines():
        if line.startswith("GPU "):
            flush()
            current, section = {"bus": line[4:].strip()}, ""
            continue
        if current is None or not line.strip():
            continue
        key, colon, value = line.strip().partition(":")
        key, value = key.strip(), value.strip()
        if line.startswith("        "):
            name = _SECTION_KEYS.get((section, key))
            if name:
                current[name] = value
        elif line.startswith("    "):
            if colon and key in _TOP_KEYS:
                current[_TOP_KEYS[key]] = value
                section = ""
            else:
                section = key
    flush()
    return tuple(found)


# ---- CUDA toolkits -------------------------------------------------------------------------------------------

_CUDA_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def parse_cuda_toolkits(files: Mapping[str, str]) -> dict[str, list[str]]:
    """/usr/local/cuda*/version.json ({"cuda": {"version": "12.4.1"}}) or version.txt ("CUDA Version 10.1.243")
    -> {version: [directories]} (/usr/local/cuda is usually a link to one of the others)."""
    found: dict[str, list[str]] = {}
    for path, text in sorted(files.items()):
        if not path.startswith("/usr/local/cuda") or not path.endswith(("/version.json", "/version.txt")):
            continue
        version = None
        if path.endswith(".json"):
            try:
                data = json.loads(text)
                version = data.get("cuda", {}).get("version") if isinstance(data, dict) else None
            except (ValueError, AttributeError):
                version = None
        else:
            match = re.search(r"CUDA Version\s+(\d+\.\d+(?:\.\d+)?)", text)
            version = match[1] if match else None
        if isinstance(version, str) and _CUDA_VERSION.fullmatch(version):
            found.setdefault(version, []).append(path.rsplit("/", 1)[0])
    return found


# ---- the facts ------------------------------------------------------------------------------------------------

# user-space libraries of an installed driver (their suffix is the version), and the .run installer's own record
# of what it installed
# (Debian keeps them in /usr/lib/<triplet>/nvidia/current/, or nvidia/tesla-535/, behind its alternatives)
USERSPACE = command("driver_userspace", (
    'for f in /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.* /usr/lib64/libnvidia-ml.so.* '
    '/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.* /usr/lib/libnvidia-ml.so.* '
    '/usr/lib/x86_64-linux-gnu/nvidia/*/libnvidia-ml.so.* /usr/lib/aarch64-linux-gnu/nvidia/*/libnvidia-ml.so.*; do '
    '[ -e "$f" ] && echo "lib $f"; done; '
    'command -v nvidia-installer >/dev/null 2>&1 && '
    'echo "installer $(nvidia-installer --version 2>/dev/null | grep -i -m 1 version)"; true'
), parse_userspace, module=_M)
# the nvidia module the running kernel would load (built by DKMS or the installer): version, license, signer. Where
# `modinfo nvidia` finds none, the running kernel's module file whose own name is `nvidia` (Debian installs it as
# nvidia-current.ko, selected through its alternatives)
# (one find in the DKMS/installer directories and one modinfo: the probe runs under a time limit, and on a slow node,
# a VM without KVM, each modinfo of the 60 MB module costs seconds; no find where neither directory is)
# where DKMS and nvidia-installer put the running kernel's nvidia modules ($k), and the find of them there (run only
# when one of the directories exists: no find process otherwise)
_EXTRA_DIRS = '{ [ -d "/lib/modules/$k/updates" ] || [ -d "/lib/modules/$k/extra" ]; }'
_FIND_EXTRA = 'find "/lib/modules/$k/updates" "/lib/modules/$k/extra" -name "nvidia*.ko*" 2>/dev/null'
# modinfo's lines MODULE reads, picked out of its answer by the shell (`grep -E "^(filename|...):"` before: a
# process, ~45 ms on the real VM); status 1 where there is none, as grep's
_MODINFO_PICK = (
    'gpunode_modinfo() { ' + hushed('p=$(modinfo "$1")') + '; f=; while [ -n "$p" ]; do l=${p%%"\n"*}; '
    'case $l in filename:*|version:*|license:*|signer:*|name:*) printf "%s\\n" "$l"; f=1 ;; esac; '
    'case $p in *"\n"*) p=${p#*"\n"} ;; *) p= ;; esac; done; [ -n "$f" ]; }; ')
MODULE = command("driver_module", (
    _MODINFO_PICK + 'if ! gpunode_modinfo nvidia; then '
    + RELEASE + 'm=; ' + _EXTRA_DIRS + ' && { r=$(' + _FIND_EXTRA + '); ' + FIRST_MAIN_MODULE + '}; '
    '[ -n "$m" ] && gpunode_modinfo "$m"; fi; true'
), parse_module, module=_M)
# Debian's names: the driver alternative its packages select, and the nvidia*.ko files in the running kernel's DKMS
# and installer directories (no modinfo per file: the probe has a time limit, and on a slow node each modinfo of
# the 60 MB module costs seconds; MODULE reads the main one's own name). What `modprobe nvidia` resolves through
# is read from the modprobe.d files (kernel.MODPROBE_D) in driver_state
# (no update-alternatives where no alternative named nvidia is recorded: dpkg's in its admin directory, the RHEL
# family's in /var/lib/alternatives; --query would only fail there)
DEBIAN_NAMES = command("driver_debian_names", (
    'command -v update-alternatives >/dev/null 2>&1 && { [ -n "$DPKG_ADMINDIR$DPKG_ROOT" ] || '
    '[ -e /var/lib/dpkg/alternatives/nvidia ] || [ -e /var/lib/alternatives/nvidia ]; } && '
    'update-alternatives --query nvidia 2>/dev/null | sed -n "s/^Value: /alt /p"; '
    + RELEASE + _EXTRA_DIRS + ' && ' + _FIND_EXTRA + ' | sort | sed "s/^/ko /"; true'
), parse_debian_names, module=_M)
# does NVML answer? (its error text names a driver/library mismatch)
SMI = command_section("driver_smi", (
    'command -v nvidia-smi >/dev/null 2>&1 || exit 3; ' + SMI_CALL +
    'out=$(gpunode_smi --query-gpu=driver_version --format=csv,noheader 2>&1); rc=$?; '
    'printf "%s\\n" "$out" | head -n 20; exit $rc'
), parse_smi, module=_M)
# a driver installed by the distribution's packages (never mixed with the .run): dpkg's `ii ` and `hi ` (install or
# hold, ok, installed) of the driver's names, asked by name: from the probe's one dpkg-query (packages.dpkg_status)
PACKAGES = command("driver_packages", (
    'if command -v dpkg-query >/dev/null 2>&1; then '
    + dpkg_status(("nvidia*", "libnvidia*", "linux-modules-nvidia*", "linux-objects-nvidia*", "cuda-drivers*",
                   "libcuda1", "firmware-nvidia*"), 'case $st in [hi]"i ") printf "%s %s\\n" "$n" "$v" ;; esac') + '; '
    'elif command -v rpm >/dev/null 2>&1; then '
    'rpm -qa --qf "%{NAME} %{VERSION}-%{RELEASE}\\n" 2>/dev/null | '
    'grep -E "^(nvidia|kmod-nvidia|akmod-nvidia|xorg-x11-drv-nvidia|cuda-drivers|dkms-nvidia)"; fi; true'
), parse_packages, module=_M)
# per GPU from nvidia-smi -q: the bus id header, name, brand, UUID, persistence, and the MIG, virtualization and
# vGPU licence blocks (their indented lines only)
GPUS = command("doctor_gpus", (
    '[ -r /proc/driver/nvidia/version ] && command -v nvidia-smi >/dev/null 2>&1 || exit 3; '
    + smi_output("-q") + " | awk '/^GPU /{print; next} "
    "/^    [^ ]/{h=$0; sub(/^ +/, \"\", h); sub(/ *:.*$/, \"\", h); "
    "k=(h==\"MIG Mode\"||h==\"GPU Virtualization Mode\"||h==\"vGPU Software Licensed Product\"); "
    "if (k||h==\"Product Name\"||h==\"Product Brand\"||h==\"Persistence Mode\"||h==\"GPU UUID\") print; next} "
    "/^        [^ ]/{if (k) print}'"
), parse_gpus, module=_M, full_only=True)
CUDA_TOOLKITS = files("doctor_cuda", ("/usr/local/cuda*/version.json", "/usr/local/cuda*/version.txt"), module=_M, full_only=True)


# ---- the packages route (--driver-source packages, gpunode/driver_packages.py) ---------------------------------


def parse_offered(text: str) -> dict[str, list[str]]:
    """`apt-cache policy NAME...`, `dnf list --showduplicates NAME...` or zypper's `search -s` table ->
    {name: versions the configured repositories offer} (an installed version apt lists from dpkg's status only
    counts when a repository has it too: apt prints it with the repository's priority line)."""
    from gpunode.facts.fabric import parse_available

    offered = parse_available(text)
    for line in text.splitlines():  # zypper: "v | nvidia-compute-utils-G06 | package | 580.95.05-1 | x86_64 | cuda"
        cells = [c.strip() for c in line.split("|")]
        if len(cells) >= 6 and cells[2] == "package" and re.match(r"\d", cells[3]):
            offered.setdefault(cells[1], []).append(cells[3])
    return {name: list(dict.fromkeys(found)) for name, found in offered.items()}


def _offered_snippet() -> str:
    from gpunode import driver_packages as routes

    deb = "|".join(p for os_key in ("debian", "ubuntu") for p in routes.candidate_names(os_key))
    rpm = " ".join(routes.route_names("rhel"))
    suse = " ".join(routes.route_names("sles"))
    # apt: every name the package lists know that a route may install; the precompiled module packages only for
    # the kernels installed here (Ubuntu's archive has one per kernel release ever published)
    return (
        "if command -v apt-cache >/dev/null 2>&1; then "
        "ks=$(ls /lib/modules 2>/dev/null | tr '\\n' ' '); "
        f"names=$(apt-cache pkgnames 2>/dev/null | grep -E '{deb}' | awk -v ks=\" $ks\" "
        "'!/^linux-modules-nvidia-/ { print; next } { n = split(ks, k, \" \"); for (i = 1; i <= n; i++) "
        "if (k[i] != \"\" && substr($0, length($0) - length(k[i])) == \"-\" k[i]) { print; next } }' | sort -u); "
        '[ -n "$names" ] && apt-cache policy $names 2>/dev/null; '
        f"elif command -v dnf >/dev/null 2>&1; then dnf -q -C list --showduplicates {rpm} 2>/dev/null; "
        f"elif command -v zypper >/dev/null 2>&1; then zypper -n -q search -s --match-exact {suse} 2>/dev/null; "
        "fi; true")


# versions of the packages routes' names the configured repositories offer (local metadata only: `apt-get update`
# is the fix when the lists are old), read by the driver step with --driver-source packages
OFFERED = command("driver_offered", _offered_snippet(), parse_offered, module=_M, late=True)


@dataclass(frozen=True, eq=False, repr=False)
class GpunodeDriver(Frozen):
    """What gpunode's journal says its driver step put on this node and has not undone: the packages of a
    packages route (names), and whether it ran a .run (its version)."""

    packages: tuple[str, ...] = ()
    run: str | None = None
    source: str = ""  # the source of the last driver gpunode installed: "packages" | "run" | ""
    version: str | None = None  # the version of the last driver gpunode installed (either source)
    pinned: tuple[tuple[str, str], ...] = ()  # packages: every package of the route at its exact version
    held: tuple[str, ...] = ()  # the holds the driver step placed and has not released


def parse_gpunode_driver(text: str) -> GpunodeDriver:
    from gpunode.records import RecordError, parse_records

    try:
        data = json.loads(text) if text.strip() else {}
        records = parse_records(data.get("undo") or []) if isinstance(data, dict) else []
    except (ValueError, RecursionError, RecordError):
        return GpunodeDriver()
    return driver_of_records(records)


def driver_of_records(records: list[Any]) -> GpunodeDriver:
    """The driver step's undo records that are not undone, read as GpunodeDriver (the journal's `undo` list)."""
    from gpunode.records import DriverRecord, HoldRecord, PackagesRecord

    mine = [r for r in records if r.step == "driver" and not r.undone]
    names = tuple(dict.fromkeys(n for r in mine if isinstance(r, PackagesRecord) for n in r.names))
    drivers = [r for r in mine if isinstance(r, DriverRecord)]
    runs = [r for r in drivers if r.source != "packages"]
    source = ("packages" if drivers[-1].source == "packages" else "run") if drivers else ""
    pinned = tuple((p.split("=", 1)[0], p.split("=", 1)[1]) for p in drivers[-1].packages if "=" in p) if drivers else ()
    held = tuple(dict.fromkeys(n for r in mine if isinstance(r, HoldRecord) for n in r.held))
    return GpunodeDriver(names, runs[-1].version if runs else None, source,
                         drivers[-1].version if drivers else None, pinned, held)


def gpunode_driver(facts: Facts) -> GpunodeDriver:
    """The journal's record of the driver gpunode installed (which source), read by the driver step to switch
    sources: parsed from the journal the probe already read for owed restarts (one read per probe)."""
    return parse_gpunode_driver(journal_text(facts) or "")

# the apt pin gpunode writes for a packages route (gpunode/driver_packages.py APT_PIN)
APT_PIN_FILE = files("driver_apt_pin", ("/etc/apt/preferences.d/gpunode-nvidia-driver",), module=_M)

# a display manager installed (Debian's and Ubuntu's display managers write the file at install; debconf's
# shared/default-x-display-manager): the packages route on Ubuntu installs the full driver, not the headless set
DISPLAY_MANAGER = files("driver_display_manager", ("/etc/X11/default-display-manager",), module=_M)
