"""Step 3: the NVIDIA driver from NVIDIA's .run installer, at the version the user asked for.

What is on the node comes from three places that can disagree: the loaded module (/proc/driver/nvidia/version),
the user-space libraries (libnvidia-ml.so.<version>, nvidia-installer's record) and NVML (nvidia-smi). Loaded
and user space at the requested version is `ok`; another .run version is an upgrade; a loaded module older
than its libraries is NVML's "Driver/library version mismatch", which only a reboot fixes. A driver from the
distribution's packages is never mixed with a .run: that is `blocked`, explained.

The installer is downloaded and verified on the machine running gpunode (gpunode/artifacts/), uploaded into
a root-only directory, checked again on the node (sha256) and run silently with DKMS and an explicit kernel
module flavour. On failure the installer's log tail is shown with what it means.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from packaging.version import Version

from gpunode import gpus
from gpunode.artifacts import ProgressBars, silent
from gpunode.artifacts.source import Source, obtain, resolve
from gpunode.connection.base import Connection
from gpunode.errors import CommandError, GpunodeError
from gpunode.facts import Facts
from gpunode.facts.driver import driver_state
from gpunode.options import Options
from gpunode.plan import Action, Reboot, RunCommand, StepPlan, blocked, change, ok
from gpunode.shell import Script, display
from gpunode.steps.base import Step
from gpunode.versions import normalize_arch, parse_runfile_name

NAME = "driver"
TITLE = "NVIDIA driver"
LOG = "/var/log/nvidia-installer.log"
WORK_PARENT = "/var/tmp"  # not /tmp: often a small tmpfs, and the extracted driver is ~1 GB
INSTALL_TIMEOUT = 3600.0  # a DKMS build of the module takes minutes on small VMs

def branch(version: str) -> int:
    return int(version.split(".", 1)[0])


# ---------------------------------------------------------------------------------------------------------
# kernel module flavour
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Flavour:
    flavour: str  # "open" | "proprietary"
    reason: str
    flag: str | None  # the installer's -m= value; None before R515 (one flavour only)


def _open_need(device_id: int) -> str:
    gpu = gpus.lookup_id(device_id)
    return gpu.open_module if gpu is not None else gpus.generation_for_id(device_id)[1]


def choose_flavour(device_ids: list[int], version: str, override: str | None) -> Flavour | str:
    """The module to install, or a string saying why none can work."""
    major = branch(version)
    auto, reason = gpus.module_flavour(device_ids, version)
    if auto == "conflict":
        return reason
    needs = {_open_need(d) for d in device_ids}
    if override:
        if override == "proprietary" and "required" in needs:
            return "--kernel-module proprietary: these GPUs need the open module (" + reason + ")"
        if override == "open" and "unsupported" in needs:
            return "--kernel-module open: these GPUs cannot use the open module (" + reason + ")"
        auto, reason = override, f"--kernel-module {override} (automatic choice: {auto}; {reason})"
    if auto == "open" and major < gpus.BOTH_FLAVOURS_FROM:
        return f"R{major} has no open kernel module, and {reason}: choose R570 or newer"
    flag = None
    if major >= gpus.BOTH_FLAVOURS_FROM:
        flag = "kernel-open" if auto == "open" else "kernel"
    return Flavour(auto, reason, flag)


# ---------------------------------------------------------------------------------------------------------
# installer command line and failures
# ---------------------------------------------------------------------------------------------------------


def installer_flags(arch: str, flavour: Flavour, options: Options) -> tuple[str, ...]:
    """Silent, DKMS (rebuilt on kernel updates), temp files on disk rather than a small /tmp tmpfs, a known log
    path, no X server check (headless), no 32-bit libraries, the flavour always explicit, and the user's module
    signing keys. OpenGL/Vulkan libraries stay: containers that render need them."""
    flags = ["--silent", "--dkms", f"--tmpdir={WORK_PARENT}", f"--log-file-name={LOG}", "--no-x-check"]
    if arch == "x86_64":
        flags.append("--no-install-compat32-libs")
    if flavour.flag:
        flags.append(f"-m={flavour.flag}")
    if options.module_signing_key and options.module_signing_cert:
        flags += [f"--module-signing-secret-key={options.module_signing_key}",
                  f"--module-signing-public-key={options.module_signing_cert}"]
    return tuple(flags)


# (pattern in the installer's output or log, what it means, the fix) - wording from real installer errors
# (tests/fixtures/real/errors/nvidia-installer*).
EXPLANATIONS: tuple[tuple[str, str, str], ...] = (
    (r"Nouveau kernel driver is currently in use",
     "nouveau still drives the GPU, and the installer refuses to replace it while it is loaded",
     "the nouveau step blacklists it; reboot (or pass --reboot) and run the same command again"),
    (r"Unable to find the kernel source tree",
     "the kernel headers for the running kernel are missing",
     "install linux-headers-$(uname -r) / kernel-devel-$(uname -r) (the prerequisites step does) and run again"),
    (r"Key was rejected by service|Required key not available|signed kernel module failed to load",
     "Secure Boot rejected the module: it is unsigned or signed with a key that is not enrolled",
     "enroll the certificate with `mokutil --import CERT` and confirm it in MOK Manager at the next boot, "
     "then run again with --module-signing-key/--module-signing-cert"),
    (r"kernel module '?nvidia[-_a-z]*'? appears to already be loaded",
     "an older NVIDIA module is loaded and in use (nvidia-persistenced, DCGM, a container or X hold the GPU)",
     "stop what uses the GPU, or reboot the node, then run the same command again"),
    (r"GPL-incompatible module|GPL-only symbol|Unable to build the NVIDIA kernel module|"
     r"Failed to install the kernel module through DKMS|Bad return status for module build",
     "the NVIDIA kernel module did not build for this kernel: the driver is usually too old for the kernel",
     "choose a newer release of the driver branch (or a newer branch), or a kernel that branch supports"),
    (r"Unable to load the kernel module 'nvidia\.ko'",
     "the module built but the kernel would not load it (a GPU this flavour cannot drive, Secure Boot, or "
     "nouveau holding the GPU)",
     "see `dmesg | grep -i nvrm`: pre-Turing GPUs need --kernel-module proprietary, Blackwell needs open; with "
     "Secure Boot, sign the module with an enrolled key"),
    (r"No space left on device",
     "the disk filled up while extracting or building",
     f"free space in {WORK_PARENT} and /usr (the driver needs about 1.5 GB), then run again"),
    (r"CC version check failed|compiler used to compile the kernel",
     "the gcc on the node is not the one the kernel was built with",
     "install the gcc version the kernel was built with (see /proc/version), then run again"),
    (r"pre-install script failed",
     "the distribution's pre-install hook refused the .run installer",
     "the distribution wants its own packaged driver here: remove that hook or use the packages"),
)


def explain(output: str) -> tuple[str, str]:
    """(what went wrong, the fix) for an installer failure, from its output and log tail (whose lines the
    installer wraps at any width, so whitespace is collapsed before matching)."""
    text = " ".join(output.split())
    for pattern, meaning, fix in EXPLANATIONS:
        if re.search(pattern, text, re.I):
            return meaning, fix
    return ("the NVIDIA installer failed", f"read {LOG} on the node (its tail is above), fix the cause and run the "
            "same command again")


# ---------------------------------------------------------------------------------------------------------
# actions
# ---------------------------------------------------------------------------------------------------------


def _mb(size: int) -> str:
    return f"{size / 1e6:.0f} MB" if size >= 1e6 else f"{size / 1e3:.0f} kB"


@dataclass(frozen=True)
class FetchInstaller(Action):
    """Runs on the machine running gpunode: download (or reuse) and verify the .run. Nothing touches the node."""

    source: Source | None = None
    local_size: int | None = None  # known size of the file already here (cache or --driver-run)
    progress: ProgressBars | None = None

    kind = "download"

    def commands(self) -> list[str]:
        assert self.source is not None
        src = self.source
        checks = "sha256 against " + ("--sha256" if src.sha256 else "NVIDIA's published .sha256sum when there is one")
        checks += ", and the makeself archive's own checksums (as `sh FILE --check`), here, without running it"
        if src.local:
            lines = [f"(local) use {src.local}" + (f" ({_mb(self.local_size)})" if self.local_size else "")]
        elif self.local_size is not None:
            lines = [f"(local) cached: {src.cache} ({_mb(self.local_size)})"]
        else:
            lines = [f"(local) download {src.urls[0]}", *(f"(local)   or {u}" for u in src.urls[1:]),
                     f"(local)   into {src.cache} (resumable)"]
        return [*lines, f"(local) verify {checks}"]

    def to_dict(self) -> dict[str, object]:
        assert self.source is not None
        return {**super().to_dict(), "urls": list(self.source.urls), "local": self.source.local,
                "cache": self.source.cache, "cached": self.local_size is not None and not self.source.local,
                "size": self.local_size, "sha256": self.source.sha256}

    def apply(self, conn: Connection) -> str | None:
        assert self.source is not None
        verified = obtain(self.source, progress=self.progress)
        return f"{verified.path}: {', '.join(verified.checks)}"


# Runs on the node as root: check the uploaded file is the verified one, unload an older driver if one is
# loaded (the installer replaces it), run the installer with TMPDIR on disk, and on failure print its output
# and log tail. The work directory (root-only, from make_private_dir) is removed either way.
_INSTALL = r"""dir=$1; run=$2; want=$3; log=$4; key=$5; cert=$6; shift 6
trap 'rm -rf -- "$dir"' EXIT
got=$(sha256sum -- "$dir/$run" 2>/dev/null); got=${got%% *}
if [ "$got" != "$want" ]; then
  echo "gpunode: the uploaded installer has sha256 ${got:-?}, not the verified $want: nothing was run" >&2
  exit 90
fi
for f in "$key" "$cert"; do
  if [ -n "$f" ] && [ ! -r "$f" ]; then echo "gpunode: module signing file $f is not readable on the node" >&2; exit 91; fi
done
if [ -e /proc/driver/nvidia/version ]; then
  systemctl stop nvidia-persistenced >/dev/null 2>&1
  modprobe -r nvidia_drm nvidia_modeset nvidia_uvm nvidia_peermem nvidia >/dev/null 2>&1
fi
cd "$dir" || exit 92
TMPDIR=$dir sh "./$run" "$@" > "$dir/installer.out" 2>&1
rc=$?
if [ "$rc" -ne 0 ]; then
  tail -n 25 "$dir/installer.out" >&2
  if [ -r "$log" ]; then echo "gpunode-log-tail: $log" >&2; tail -n 40 "$log" >&2; fi
fi
exit "$rc"
"""


@dataclass(frozen=True)
class RunInstaller(Action):
    """Upload the verified .run into a root-only directory on the node and run it there."""

    source: Source | None = None
    flags: tuple[str, ...] = ()
    signing_key: str = ""
    signing_cert: str = ""
    progress: ProgressBars | None = None

    kind = "driver-install"

    def commands(self) -> list[str]:
        assert self.source is not None
        name = self.source.name
        return [f"upload {name} into a root-only directory under {WORK_PARENT}, check its sha256 on the node",
                "sudo " + display(("sh", name, *self.flags))]

    def to_dict(self) -> dict[str, object]:
        return {**super().to_dict(), "flags": list(self.flags), "log": LOG}

    def apply(self, conn: Connection) -> str | None:
        assert self.source is not None
        verified = obtain(self.source, progress=self.progress)  # the file uploaded is the file verified
        workdir = conn.make_private_dir(WORK_PARENT)
        try:
            with (self.progress or silent)(f"upload {self.source.name}") as report:
                conn.upload(verified.path, f"{workdir}/{self.source.name}", mode=0o700, progress=report)
        except BaseException:
            conn.run(Script('rm -rf -- "$1"', (workdir,), "cleanup"), sudo=True, timeout=60)
            raise
        script = Script(_INSTALL, (workdir, self.source.name, verified.sha256, LOG, self.signing_key,
                                   self.signing_cert, *self.flags), "driver-install")
        result = conn.run(script, sudo=True, timeout=INSTALL_TIMEOUT)
        if result.timed_out:
            raise CommandError(f"the NVIDIA installer did not finish within {INSTALL_TIMEOUT:.0f}s",
                               fix=f"look at {LOG} on the node; it may still be building", stderr=result.stderr)
        if not result.ok:
            output = result.stdout + "\n" + result.stderr
            if result.exit_code == 90:
                raise CommandError(result.stderr.strip(), fix="the upload was altered or truncated: run again")
            meaning, fix = explain(output)
            tail = "\n".join(line for line in result.stderr.strip().splitlines()[-30:])
            raise CommandError(f"the NVIDIA installer failed (exit {result.exit_code}): {meaning}\n"
                               f"installer log: {LOG}\n{tail}", fix=fix, stdout=result.stdout,
                               stderr=result.stderr, exit_code=result.exit_code)
        return f"installed from {verified.path} (sha256 {verified.sha256[:16]}...); installer log: {LOG}"


# ---------------------------------------------------------------------------------------------------------
# the plan
# ---------------------------------------------------------------------------------------------------------


def requested_version(options: Options) -> str | None:
    if options.driver:
        return options.driver
    if options.driver_run:
        found = parse_runfile_name(options.driver_run)
        return found[1] if found else None
    return None


def _packages_fix(facts: Facts) -> str:
    if facts.os.family == "rhel":
        remove = "dnf remove 'nvidia-driver*' 'kmod-nvidia*' 'cuda-drivers*' 'xorg-x11-drv-nvidia*'"
    else:
        remove = "apt-get purge 'nvidia-*' 'libnvidia-*' 'linux-modules-nvidia-*' && apt-get autoremove"
    return (f"either keep the packaged driver and run without --driver, or remove it ({remove}), reboot, and run "
            "the same command again")


_SECURE_BOOT_FIX = (
    "choose one: (1) pass --module-signing-key KEY --module-signing-cert CERT (paths on the node) of a key pair "
    "enrolled with `mokutil --import CERT` (confirm it in MOK Manager at the next boot); (2) disable Secure Boot "
    "in the firmware; (3) use the distribution's pre-signed driver packages instead of --driver (Ubuntu: "
    "`ubuntu-drivers install --gpgpu nvidia:<branch>-server`)")


def _install_actions(facts: Facts, options: Options, version: str, flavour: Flavour) -> list[Action]:
    source = resolve(version, facts.arch, driver_run=options.driver_run, sha256=options.sha256,
                     cache_root=options.cache_dir, mirror=options.driver_mirror)
    sizes = dict(options.local_installers)
    flags = installer_flags(source.arch, flavour, options)
    what = "download" if source.path not in sizes and not source.local else "verify"
    return [
        FetchInstaller(f"{what} {source.name} on this machine", source=source, local_size=sizes.get(source.path),
                       progress=options.progress),
        RunInstaller(f"install NVIDIA driver {version} ({flavour.flavour} kernel module, DKMS)", source=source,
                     flags=flags, signing_key=options.module_signing_key or "",
                     signing_cert=options.module_signing_cert or "", progress=options.progress),
    ]


def plan(facts: Facts, options: Options, earlier: Mapping[str, StepPlan] | None = None) -> StepPlan:
    earlier = earlier or {}
    state = driver_state(facts)
    version = requested_version(options)
    if version is None:
        if options.driver_run:
            return blocked(NAME, f"cannot tell which driver version {options.driver_run} installs",
                           "pass --driver VERSION as well")
        if state.loaded:
            return ok(NAME, f"no --driver requested; driver {state.loaded.version} ({state.loaded.flavour} module) "
                            "is loaded and left as it is")
        return ok(NAME, "no --driver requested: no driver is installed (pass --driver VERSION to install one)")
    if not facts.gpus:
        return blocked(NAME, "no NVIDIA GPU on this node: the driver would have nothing to drive",
                       "check `lspci -nn -d 10de:` (a VM needs the GPU passed through), or drop --driver")
    try:
        arch = normalize_arch(facts.arch)
    except GpunodeError as exc:
        return blocked(NAME, exc.message, exc.fix or "")
    named = parse_runfile_name(options.driver_run or "")
    if named and named[0] != arch:
        return blocked(NAME, f"{options.driver_run} is the {named[0]} installer; this node is {arch}",
                       f"use NVIDIA-Linux-{arch}-{version}.run")

    if state.packages:
        names = ", ".join(f"{n} {v}" for n, v in state.packages[:4]) + (" ..." if len(state.packages) > 4 else "")
        if state.loaded and state.loaded.version == version and not state.mismatch:
            return ok(NAME, f"driver {version} is loaded (installed from distribution packages: {names})")
        return blocked(NAME, f"a driver from distribution packages is installed ({names}); a .run install on top "
                             "would mix two drivers", _packages_fix(facts))

    choice = choose_flavour([d.device for d in facts.gpus], version, options.kernel_module)
    if isinstance(choice, str):
        return blocked(NAME, choice, "choose the --kernel-module the GPUs support, or put these GPUs in separate "
                                     "nodes")
    loaded = state.loaded
    current = state.installed or (loaded.version if loaded else None)
    notes = [f"kernel module: {choice.flavour} ({choice.reason})"]

    if current == version:
        if loaded and loaded.version == version and not state.mismatch:
            if options.kernel_module and loaded.flavour != choice.flavour:
                return _install(facts, options, version, choice, notes,
                                f"driver {version} runs the {loaded.flavour} module; --kernel-module asks for "
                                f"{choice.flavour}: reinstalling")
            if state.smi_status not in (None, 0):
                first = state.smi_text.splitlines()[0] if state.smi_text else f"exit {state.smi_status}"
                return blocked(NAME, f"driver {version} is loaded but nvidia-smi fails: {first}",
                               "see `dmesg | grep -i nvrm`: a GPU this module flavour cannot drive (--kernel-module), "
                               "or a GPU that fell off the bus")
            extra = () if loaded.flavour == choice.flavour else (
                f"the {loaded.flavour} module is loaded; the automatic choice would be {choice.flavour} "
                "(pass --kernel-module to switch)",)
            return ok(NAME, f"driver {version} ({loaded.flavour} kernel module) is loaded and nvidia-smi answers",
                      *extra)
        if loaded and (loaded.version != version or state.mismatch):
            return change(NAME, f"kernel module {loaded.version} is loaded but the user-space libraries are {version} "
                                "(NVML: Driver/library version mismatch)",
                          [Reboot(f"reboot to load the {version} kernel module")])
        if facts.module_loaded("nouveau"):
            return change(NAME, f"driver {version} is installed but nouveau holds the GPU",
                          [Reboot("reboot: nouveau is loaded and only a reboot unloads it")])
        if state.module == version:
            return change(NAME, f"driver {version} is installed but its kernel module is not loaded",
                          [RunCommand("load the nvidia kernel module", ("modprobe", "nvidia"), timeout=120)], *notes)
        return _install(facts, options, version, choice, notes,
                        f"driver {version} user space is installed but no {version} module exists for kernel "
                        f"{facts.kernel} (a kernel update that DKMS did not build for?): reinstalling")

    if current:
        verb = "upgrading" if Version(current) < Version(version) else "downgrading"
        reason = f"driver {current} is installed; {version} was requested: {verb}"
        if loaded:
            notes.append(f"the loaded {loaded.version} module is unloaded first; if something holds the GPU the "
                         "installer stops: stop it or reboot, then run again")
    else:
        reason = f"no NVIDIA driver installed; installing {version}"
    return _install(facts, options, version, choice, notes, reason, earlier)


def _install(facts: Facts, options: Options, version: str, choice: Flavour, notes: list[str], reason: str,
             earlier: Mapping[str, StepPlan] | None = None) -> StepPlan:
    if facts.secure_boot.enabled and not (options.module_signing_key and options.module_signing_cert):
        return blocked(NAME, "Secure Boot is enabled and no module signing key was given: the kernel would refuse "
                             "the unsigned NVIDIA module", _SECURE_BOOT_FIX)
    if facts.secure_boot.enabled:
        notes.append("Secure Boot is on: the module is signed with --module-signing-key; its certificate must be "
                     "enrolled (mokutil --import CERT, confirmed at the next boot) or the kernel refuses the module")
    elif facts.secure_boot.enabled is None:
        notes.append(f"Secure Boot state unknown ({facts.secure_boot.evidence}): an unsigned module may be refused")
    if facts.module_loaded("nouveau"):
        nouveau = (earlier or {}).get("nouveau")
        if nouveau is None or not nouveau.reboot_required:
            return blocked(NAME, "nouveau is loaded: the NVIDIA installer refuses to run while it is",
                           "let the nouveau step blacklist it (do not --skip nouveau), reboot, and run again")
        notes.append("runs after the reboot the nouveau step needs (pass --reboot to have gpunode do it)")
    return change(NAME, reason, _install_actions(facts, options, version, choice), *notes)


STEP = Step(NAME, TITLE, plan)
