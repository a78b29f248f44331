"""Code for the few causes whose finding says more than its table row can: a driver version looked up in the compat
tables, a reason read elsewhere in the same text, a command that needs a value the message may lack.

`refine(candidate, doc)` returns the finding for a candidate (None drops it); causes without code here get their
row's texts, filled with the match's values."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from gpunode import fixes, passthrough, signing
from gpunode.explain.candidate import Candidate, render
from gpunode.explain.finding import Doc, Finding
from gpunode.explain.tables import compile_pattern, tables

Hook = Callable[[Candidate, Doc], "Finding | None"]
HOOKS: dict[str, Hook] = {}


def _hook(*ids: str) -> Callable[[Hook], Hook]:
    def register(fn: Hook) -> Hook:
        for finding_id in ids:
            HOOKS[finding_id] = fn
        return fn
    return register


def refine(candidate: Candidate, doc: Doc) -> Finding | None:
    finding_id = candidate.detector.id
    if finding_id in HOOKS:
        return HOOKS[finding_id](candidate, doc)
    if candidate.detector.table == "installer_failures.csv":
        return _installer(candidate, doc)
    return render(candidate, doc)


def _render(candidate: Candidate, doc: Doc, **override: Any) -> Finding:
    return render(candidate, doc, **override)


# --- docker ------------------------------------------------------------------------------------------------------

_SNAP = compile_pattern(r"\bsnap (?:services|list|install|remove)[^\n]*docker|/snap/docker\b|\bdocker\.dockerd\b|"
                        r"/var/snap/docker")


_DOCKER_DESKTOP = compile_pattern(r"\bDocker Desktop\b(?! for Windows)|\bdocker-desktop\b|\bdesktop-linux\b")


def _docker_desktop(c: Candidate, doc: Doc, line: re.Match[str], values: dict[str, Any]) -> Finding:
    """Docker Desktop on Linux runs its engine in a VM that has no NVIDIA driver: the decisive line wins."""
    return _render(c, doc, values={**values, "docker_desktop": True}, excerpt=_with_line(c, doc, line),
                   cause="This is Docker Desktop (the text shows it). On Linux Docker Desktop runs the engine inside "
                         "its own virtual machine, which has neither the host's NVIDIA driver nor the GPU, so GPU "
                         "containers cannot work there (Docker Desktop supports GPUs only on Windows with WSL 2). Use "
                         "Docker Engine on the host instead.",
                   fix=fixes.on_node("docker context use default"),
                   also=(fixes.on_node("curl -fsSL https://get.docker.com | sh",
                                       note="Docker Engine, if only Desktop is installed"),
                         fixes.gpunode("install", only=["toolkit", "runtime"])))


@_hook("docker.no-gpu-driver")
def _no_gpu_driver(c: Candidate, doc: Doc) -> Finding:
    caps = [cap.strip() for cap in c.values.get("caps", "").replace(" ", ",").split(",") if cap.strip()]
    values = {"driver": c.values.get("driver", ""), "capabilities": caps}
    desktop = doc.has(_DOCKER_DESKTOP)
    if desktop:
        return _docker_desktop(c, doc, desktop, values)
    if not doc.has(_SNAP):
        return _render(c, doc, values=values)
    values["snap"] = True
    return _render(c, doc, values=values,
                   cause="Docker here is the snap package (the text shows it). A snap's daemon runs confined and does "
                         "not see the NVIDIA Container Toolkit installed on the host, so `--gpus` finds no GPU device "
                         "driver. Use Docker from your distribution or docker.com instead.",
                   fix=fixes.on_node("sudo snap remove docker"),
                   also=(fixes.on_node("curl -fsSL https://get.docker.com | sh", note="or your distribution's docker package"),
                         fixes.gpunode("install", only=["toolkit", "runtime"])))


# --- CUDA requirement (versions from gpunode.compat) --------------------------------------------------------------

def _required_cuda(condition: str, value: str) -> str:
    try:
        from gpunode import compat
        return compat.parse_require_cuda(condition).cuda_minimum or value
    except Exception:
        return value


def _driver_for_cuda(cuda: str) -> dict[str, Any]:
    """Minimum drivers for a CUDA version from gpunode.compat (empty when the table does not know it)."""
    try:
        from gpunode import compat
        need = compat.driver_needed_for_cuda(cuda)
    except Exception:  # unknown version, or the tables are unavailable: say nothing rather than guess
        return {}
    values: dict[str, Any] = {}
    if need.native_min is not None:
        values["driver_min"] = str(need.native_min)
        values["driver_branch_min"] = compat.branch_of(need.native_min)
    if need.minor_compat_min is not None:
        values["driver_min_minor_compat"] = str(need.minor_compat_min)
    return values


def _recommended_install(driver_min: str) -> str | None:
    try:
        from gpunode import compat
        branches = compat.recommended_drivers(compat.parse_driver(driver_min))
    except Exception:
        return None
    if not branches or branches[0].latest_known is None:
        return None
    return fixes.gpunode("install", driver=branches[0].latest_known)


@_hook("cuda.requirement")
def _cuda_requirement(c: Candidate, doc: Doc) -> Finding:
    condition = f"cuda{c.values['_op']}{c.values['_value']}"
    value = _required_cuda(condition, c.values["_value"])
    values: dict[str, Any] = {"condition": condition, "cuda_required": value, **_driver_for_cuda(value)}
    if "driver_min" in values:
        need = (f" A driver that supports CUDA {value} natively is {values['driver_min']} or newer "
                f"(branch R{values['driver_branch_min']}+). Alternatively run an image built for the CUDA version "
                "`nvidia-smi` reports.")
        fix = _recommended_install(values["driver_min"]) or fixes.gpunode("compat", cuda=value)
    else:
        need = f" gpunode's CUDA table does not know CUDA {value}; check NVIDIA's release notes for its driver."
        fix = c.detector.fix
    return _render(c, doc, values=values, cause=c.detector.cause + need, fix=fix)


@_hook("container.requirement")
def _container_requirement(c: Candidate, doc: Doc) -> Finding:
    condition = f"{c.values['_req'].lower()}{c.values['_op']}{c.values['_value'].rstrip('.')}"
    return _render(c, doc, values={"condition": condition})


@_hook("cuda.insufficient-driver")
def _insufficient(c: Candidate, doc: Doc) -> Finding:
    values: dict[str, Any] = dict(c.values)  # each variant's own values (versions it names) fill its texts
    if "found" in c.values:
        found = int(c.values["found"])
        values["driver_cuda"] = f"{found // 1000}.{found % 1000 // 10}"
    return _render(c, doc, values=values)


@_hook("lib.nvml-missing")
def _nvml_missing(c: Candidate, doc: Doc) -> Finding:
    values = {"library": c.values.get("library", "libnvidia-ml.so.1"), "reporter": c.detector.variant}
    desktop = doc.has(_DOCKER_DESKTOP) if c.detector.variant == "nvidia-container-cli" else None
    if desktop:
        return _docker_desktop(c, doc, desktop, values)
    return _render(c, doc, values=values)


# --- NVML --------------------------------------------------------------------------------------------------------

_NVML_LIB_VERSION = compile_pattern(r"NVML library version: (?P<v>@VER@)")


@_hook("nvml.mismatch")
def _nvml_mismatch(c: Candidate, doc: Doc) -> Finding:
    values = {k: v for k, v in c.values.items() if k in ("client", "library_version", "kernel_module_version")}
    for m in c.matches:  # the API-mismatch line may come after the NVML one
        values.update({k: v for k, v in re_values(m).items() if k not in values})
    lib = doc.has(_NVML_LIB_VERSION)
    excerpt = ""
    if lib:
        values = {"nvml_library_version": lib["v"], **values}
        if lib.start() > c.match.start():
            excerpt = doc.excerpt(c.match.start(), lib.end())
    sides = ""
    if "library_version" in values:
        sides = (f" Here the user-space libraries are {values['library_version']} and the loaded kernel module is "
                 f"{values['kernel_module_version']}.")
    elif lib:
        sides = f" Here the NVML library is {lib['v']}; `cat /proc/driver/nvidia/version` shows the loaded module."
    return _render(c, doc, values=values, cause=c.detector.cause + sides, excerpt=excerpt)


def re_values(match: re.Match[str]) -> dict[str, str]:
    return {re.sub(r"__\d+$", "", k): v for k, v in match.groupdict().items() if v is not None}


@_hook("smi.device-handle")
def _device_handle(c: Candidate, doc: Doc) -> Finding:
    if "lost" not in c.values.get("error", "").lower():
        return _render(c, doc)
    return _render(c, doc, cause=c.detector.cause.replace(
        "a reboot (or a GPU reset, if the driver still allows one) is needed",
        "the driver has marked it lost, and only a reboot brings it back"))


# --- fabric manager ---------------------------------------------------------------------------------------------

@_hook("fabricmanager.802")
def _fm_802(c: Candidate, doc: Doc) -> Finding:
    values: dict[str, Any] = {"cuda_error": 802}
    if doc.has(compile_pattern(r"gpu count: 0")):
        values["gpu_count"] = 0
    return _render(c, doc, values=values)


@_hook("fabricmanager.version-mismatch")
def _fm_mismatch(c: Candidate, doc: Doc) -> Finding:
    if "driver_version" not in c.values:  # said in prose: no versions to pin
        return _render(c, doc)
    driver = c.values["driver_version"]
    branch = int(driver.split(".")[0])
    package = f"nvidia-fabricmanager={driver}-1" if branch >= 580 else f"nvidia-fabricmanager-{branch}={driver}-1"
    dnf = f"nvidia-fabric{'' if branch >= 580 else '-'}manager-{driver}-1"
    return _render(c, doc, also=(fixes.on_node(f"sudo apt-get install -y {package}",
                                               note=f"Ubuntu; RHEL: sudo dnf install -y {dnf}"), *c.detector.also))


# --- nvidia-installer -------------------------------------------------------------------------------------------

_INSTALLER_LOG = compile_pattern(r"Please see the file '(?P<log>[^']+)' for details|at the end of the file '(?P<log__2>"
                                 r"[^']+)'|nvidia-installer log file '(?P<log__3>[^']+)'")
_INSTALLER_VERSION = compile_pattern(r"installer version: (?P<v>@VER@)|NVIDIA-Linux-[\w]+-(?P<v__2>@VER@)"
                                     r"(?:-[\w-]+)?\.run|Installing NVIDIA driver version (?P<v__3>@VER@)")
_DEFAULT_LOG = "/var/log/nvidia-installer.log"


def _installer_values(doc: Doc) -> dict[str, Any]:
    values: dict[str, Any] = {}
    log = doc.has(_INSTALLER_LOG)
    if log:
        values["log_file"] = re_values(log)["log"]
    version = doc.has(_INSTALLER_VERSION)
    if version:
        values["driver_version"] = re_values(version)["v"]
    return values


def _installer(c: Candidate, doc: Doc, **override: Any) -> Finding:
    values = {**c.values, **_installer_values(doc), **override.pop("values", {})}
    log = values.get("log_file", _DEFAULT_LOG)
    texts = {name: getattr(c.detector, name) for name in ("cause", "fix")}
    texts["also"] = c.detector.also
    if log != _DEFAULT_LOG:  # the row's commands name the default log; this text names another
        texts = {"cause": texts["cause"].replace(_DEFAULT_LOG, log), "fix": texts["fix"].replace(_DEFAULT_LOG, log),
                 "also": tuple(a.replace(_DEFAULT_LOG, log) for a in texts["also"])}
    return _render(c, doc, values=values, **{**texts, **override})


_SB_EVIDENCE = compile_pattern(r"Key was rejected by service|Required key not available|Loading of unsigned module is "
                               r"(?:rejected|restricted)|unsigned module loading is restricted|Lockdown: [\w-]+: "
                               r"unsigned module")
_NOUVEAU_EVIDENCE = compile_pattern(r"^nouveau\s+\d+|\bnouveau \d{4}:|probe routine was not called|No NVIDIA graphics "
                                    r"adapter probed|Nouveau kernel driver is currently in use")
_VGPU_EVIDENCE = compile_pattern(r"\bvGPU\b|\bGRID\b|-grid\.run|\bVMware\b|\bhypervisor\b|virtual GPU")
_BUILD_EVIDENCE = compile_pattern(r"Invalid module format|Exec format error|Unknown symbol|disagrees about version of "
                                  r"symbol")
_UNSUPPORTED_EVIDENCE = compile_pattern(r"is not supported by (?:the )?NVIDIA [\d.]+ driver release|not supported by "
                                        r"open nvidia\.ko|Open nvidia\.ko is only ready for use on Data Center GPUs|"
                                        r"could not insert 'nvidia': No such device|Kernel module load error: No such "
                                        r"device")
_LIKELY = (("secure-boot", _SB_EVIDENCE, "Secure Boot is on and the module is not signed with a key the firmware trusts",
            fixes.on_node("mokutil --sb-state")),
           ("nouveau", _NOUVEAU_EVIDENCE, "nouveau (or another driver) holds the GPU",
            fixes.gpunode("install", only="nouveau")),
           ("vgpu", _VGPU_EVIDENCE, "this is a vGPU guest, which needs the vGPU (GRID) guest driver matching the host's "
            "vGPU manager", "nvidia-smi vgpu  # on the host: the vGPU manager version the guest driver must match"),
           ("kernel-mismatch", _BUILD_EVIDENCE, "the module was built for a different kernel than the running one",
            fixes.on_node("sudo apt-get install -y linux-headers-$(uname -r)", note="then re-run the installer")),
           ("unsupported-gpu", _UNSUPPORTED_EVIDENCE, "no GPU in the machine is supported by this driver release or "
            "module flavour (the kernel reports 'No such device')",
            fixes.on_node("lspci -nn -d 10de:", note="then pick a driver branch that supports that PCI id")))


@_hook("installer.nvidia-ko-load")
def _installer_ko(c: Candidate, doc: Doc) -> Finding:
    likely = [(name, reason, fix) for name, pattern, reason, fix in _LIKELY if doc.has(pattern)]
    module = c.values["module"]
    values = {"module": module if module.endswith(".ko") else f"{module}.ko", "likely": [n for n, _, _ in likely]}
    log = _installer_values(doc).get("log_file", _DEFAULT_LOG)
    also: list[str] = [fixes.on_node(f"sudo grep -A20 -E 'Kernel module load error|Kernel messages' {log}"),
                       fixes.gpunode("doctor")]
    if not likely:
        return _installer(c, doc, values=values, also=tuple(also))
    if likely[0][0] == "secure-boot":
        also.insert(0, "sign the module: " + signing.fix(_installer_values(doc).get("driver_version")))
    cause = ("nvidia.ko was built but the kernel refused to load it; the text points to: "
             + "; ".join(reason for _, reason, _ in likely) + ".")
    return _installer(c, doc, values=values, cause=cause, fix=likely[0][2], also=tuple(also))


# --- kernel log -------------------------------------------------------------------------------------------------

_CONFLICT = compile_pattern(r"a driver such as: (?P<drivers>[\w\s,]+?) was loaded and obtained ownership")


@_hook("kernel.no-adapter-probed")
def _not_probed(c: Candidate, doc: Doc) -> Finding:
    values = dict(c.values)
    count = next((int(m["devices"]) for m in c.matches if m["devices"]), None)
    if count is not None:
        values["devices"] = count
    conflict = doc.has(_CONFLICT)
    if conflict:
        values["conflicting_drivers"] = [d for d in re.split(r"[,\s]+|\bor\b", conflict["drivers"]) if d]
    if count is None and conflict is None:
        return _render(c, doc, values=values)
    shown = next((m for m in c.matches if m["devices"]), c.match)
    end = conflict.end() if conflict and conflict.start() > shown.start() else shown.end()
    return _render(c, doc, values=values, fix=fixes.gpunode("install", only="nouveau"), excerpt=doc.excerpt(shown.start(), end),
                   cause="nvidia.ko loaded but did not bind to any GPU because another kernel driver already owns "
                         "them: nouveau almost always (vfio-pci on a passthrough host). Blacklist it, rebuild the "
                         "initramfs and reboot.")


_FIRMWARE = compile_pattern(r"Direct firmware load for (?P<fw>nvidia/[\w./-]+) failed|RmFetchGspRmImages: No firmware "
                            r"image found")


@_hook("kernel.rm-init-failed")
def _rm_init(c: Candidate, doc: Doc) -> Finding:
    firmware = doc.has(_FIRMWARE)
    if not firmware:
        return _render(c, doc)
    return _render(c, doc, values={**c.values, "missing_firmware": firmware["fw"] or True},
                   cause="The driver could not load its GSP firmware (the firmware files do not match the kernel "
                         "module: a partial upgrade or a module built from another version), so the GPU did not start.",
                   fix=fixes.on_node("sudo reboot") + "  # if the packages are consistent; otherwise reinstall the driver")


@_hook("kernel.module-missing")
def _module_missing(c: Candidate, doc: Doc) -> Finding:
    kernel = c.values.get("kernel")
    if not kernel:
        return _render(c, doc)
    values = {"module": c.values["module"], "kernel": kernel}
    return _render(c, doc, values=values, title=f"No {values['module']} module for kernel {kernel}",
                   fix=fixes.on_node(f"sudo apt-get install -y linux-headers-{kernel} && sudo dkms autoinstall -k {kernel}"),
                   also=(fixes.on_node(f"sudo dnf install -y kernel-devel-{kernel} && sudo dkms autoinstall -k {kernel}",
                                       note="RHEL/Fedora"), fixes.on_node("dkms status")))


@_hook("secureboot.module-rejected")
def _secureboot(c: Candidate, doc: Doc) -> Finding | None:
    module = c.values.get("module") or ""
    if "nvidia" in doc.text.lower() or c.detector.variant == "installer-unsigned":  # (the NVIDIA installer's words)
        return _render(c, doc)
    if not module:  # the bare key message with nothing of a GPU in sight
        return None
    # The kernel's answer is the same for every module: a GPU's companion module (an NVIDIA HDMI-audio or peer-memory
    # helper, a vendor fork) is refused for the same reason, whatever its name.
    return _render(c, doc, title=f"Secure Boot rejected the unsigned kernel module {module}")


_DKMS_LOG = compile_pattern(r"Consult (?P<log>/\S*?/(?P<module>[\w-]+)/(?P<version>[\w.-]+)/build/make\.log)")


@_hook("dkms.build-failed")
def _dkms(c: Candidate, doc: Doc) -> Finding | None:
    log = doc.has(_DKMS_LOG)
    if log and "nvidia" not in log["module"]:
        return None  # another module's build failed
    values = dict(c.values)
    if not log:
        return _render(c, doc, values=values)
    values.update(log_file=log["log"], module=log["module"], module_version=log["version"])
    return _render(c, doc, values=values, fix=fixes.on_node(f"sudo tail -n 50 {log['log']}"))


# --- context: a decisive line elsewhere in the paste wins over the headline's stock cause -----------------------

def _with_line(c: Candidate, doc: Doc, line: re.Match[str]) -> str:
    """The excerpt of a finding that used two lines: its headline and the decisive line, in the text's order."""
    first, second = sorted((c.match, line), key=lambda m: m.start())
    a, b = doc.excerpt(first.start(), first.end()), doc.excerpt(second.start(), second.end())
    return a if a == b else f"{a}\n{b}"


def _beside(c: Candidate, doc: Doc, line: re.Match[str] | None, only: str | None = None) -> Finding | None:
    """The candidate's finding only beside its decisive line, quoted with it; None where the paste lacks that line.
    With `only`, that holds for that variant of the row, and the other variants stand as they are."""
    if only is not None and c.detector.variant != only:
        return _render(c, doc)
    return None if line is None else _render(c, doc, excerpt=_with_line(c, doc, line))


_NO_KERNEL_DRIVER = compile_pattern(r"kernel driver does not appear to be running on this host|/proc/driver/nvidia/"
                                    r"version does not exist")
_VISIBLE = compile_pattern(r"CUDA_VISIBLE_DEVICES\s*=\s*[\"']?(?P<visible>[\w,-]*)")


@_hook("cuda.no-device")
def _no_device(c: Candidate, doc: Doc) -> Finding:
    no_driver = doc.has(_NO_KERNEL_DRIVER)
    if no_driver:
        return _render(c, doc, values={"kernel_driver": False}, excerpt=_with_line(c, doc, no_driver),
                       cause="CUDA found no GPU because the NVIDIA kernel driver is not running where the program runs "
                             "(the text says /proc/driver/nvidia/version does not exist): in a container, it was "
                             "started without GPU access (no --gpus, no nvidia runtime); on a host, nvidia.ko is not "
                             "loaded or not installed.",
                       fix=fixes.gpunode("doctor"),
                       also=(fixes.on_node("docker run --rm --gpus all ubuntu nvidia-smi",
                                           note="a container needs --gpus (or the nvidia runtime)"),
                             fixes.on_node("cat /proc/driver/nvidia/version", note="on the host")))
    visible = doc.has(_VISIBLE)
    if visible:
        value = visible["visible"]
        return _render(c, doc, values={"cuda_visible_devices": value}, excerpt=_with_line(c, doc, visible),
                       cause=f"CUDA_VISIBLE_DEVICES is set to {value!r} here: CUDA sees only the GPUs it names "
                             "(0-based indexes or UUIDs of GPUs that exist); a wrong index or an empty value hides "
                             "every GPU.")
    return _render(c, doc)


_EXCLUSIVE = compile_pattern(r"(?P<mode>E\. Process|E\. Thread|Exclusive_Process|Exclusive_Thread|Prohibited)\b")


@_hook("cuda.devices-busy")
def _devices_busy(c: Candidate, doc: Doc) -> Finding:
    mode = doc.has(_EXCLUSIVE)
    if not mode:
        return _render(c, doc)
    name = {"e. process": "Exclusive_Process", "e. thread": "Exclusive_Thread"}.get(mode["mode"].lower(),
                                                                                      mode["mode"])
    return _render(c, doc, values={"compute_mode": name}, excerpt=_with_line(c, doc, mode),
                   cause=f"The GPU's compute mode is {name} (the text shows it): only one process may hold a CUDA "
                         "context on it, and another process already does. Wait for it, pick another GPU, or set the "
                         "compute mode back to Default if sharing is allowed.",
                   fix=fixes.on_node("nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv"),
                   also=(fixes.on_node("sudo nvidia-smi -c DEFAULT", note="only if several processes may share the GPU"),))


_SELINUX = compile_pattern(r"\bSELinux\b|\bsetenforce\b|\bgetenforce\b|\bcontainer_t\b|\bavc:|\bsetsebool\b|"
                           r"\.el[789](?:_\d+)?\b|\bRHEL\b|\bRed Hat Enterprise\b|\bFedora\b|\.fc\d\d\b|\bRocky\b|"
                           r"\bAlmaLinux\b|\bCentOS\b|-centos\d")
_ROOTLESS = compile_pattern(r"\brootless\b|\bpodman\b")


@_hook("nvml.no-permission")
def _nvml_permission(c: Candidate, doc: Doc) -> Finding:
    selinux = doc.has(_SELINUX)
    if selinux:
        return _render(c, doc, values={"security_module": "selinux"}, excerpt=_with_line(c, doc, selinux),
                       cause="NVML could not open the GPU device files, and this is a system with SELinux (the text "
                             "shows it): SELinux denies a container's processes (container_t) host devices unless the "
                             "container_use_devices boolean is on, and driver files need their labels. `--privileged` "
                             "works only because it lifts that confinement.",
                       fix=fixes.on_node("sudo setsebool -P container_use_devices on"),
                       also=(fixes.on_node("getenforce", note="Enforcing confirms it"),
                             fixes.on_node("sudo ausearch -m avc -ts recent | grep -i nvidia"),
                             fixes.on_node("sudo nvidia-container-cli -k list | sudo restorecon -v -f -",
                                           note="relabel the driver files")))
    rootless = doc.has(_ROOTLESS)
    if rootless:
        return _render(c, doc, values={"engine": "podman"}, excerpt=_with_line(c, doc, rootless),
                       cause="NVML could not open the GPU device files inside a podman container: a rootless "
                             "container passes /dev/nvidia* with the host's owner and mode, which must allow your "
                             "user (crw-rw-rw- by default), and SELinux (when enforcing) must allow container_t to use "
                             "devices.",
                       fix=fixes.on_node("ls -l /dev/nvidia*"),
                       also=(fixes.on_node("sudo setsebool -P container_use_devices on", note="when getenforce says Enforcing"),
                             fixes.on_node("sudo nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml",
                                           note="device nodes of the CDI spec")))
    mig = doc.has(_MIG)
    if mig:
        return _render(c, doc, values={"mig": True}, excerpt=_with_line(c, doc, mig),
                       cause="An NVML query was refused on a MIG-enabled GPU (the text shows MIG): a container sees "
                             "only its own MIG devices, and reading the parent GPU's state (memory, MIG layout) needs "
                             "the MIG monitor capability, which the NVIDIA runtime grants only with "
                             "NVIDIA_MIG_MONITOR_DEVICES=all (the device plugin and GPU feature discovery need it).",
                       fix=fixes.on_node("nvidia-smi -L", note="MIG devices listed"),
                       also=(fixes.here("kubectl -n kube-system set env ds/nvidia-device-plugin-daemonset "
                                        "NVIDIA_MIG_MONITOR_DEVICES=all", note="your plugin's namespace and name"),))
    return _render(c, doc)


_MIG = compile_pattern(r"\bMIG\b|\bmig-(?:enabled|mode|strategy|devices?)\b|MIG-GPU-|\bmigStrategy\b")


_SUSPEND = compile_pattern(r"\b(?:after|from) (?:waking|wake|resume|resuming|suspend|sleep|hibernat\w*)|\bsuspend(?:ed)?"
                           r"\b|\bhibernat\w*")
_NO_UVM = compile_pattern(r"/dev/nvidia-uvm\S*: No such file|nvidia_uvm\S* (?:is )?not (?:loaded|found)|"
                          r"could not insert 'nvidia_uvm'")


@_hook("cuda.unknown-error")
def _cuda_unknown(c: Candidate, doc: Doc) -> Finding:
    missing = doc.has(_NO_UVM)
    if missing:
        return _render(c, doc, values={"nvidia_uvm": "missing"}, excerpt=_with_line(c, doc, missing),
                       cause="CUDA failed with 'unknown error' because nvidia_uvm is not loaded (the text shows "
                             "/dev/nvidia-uvm or the module missing). CUDA needs it; containers cannot load it.")
    suspended = doc.has(_SUSPEND)
    if suspended:
        return _render(c, doc, values={"after_suspend": True}, excerpt=_with_line(c, doc, suspended),
                       cause="CUDA failed with 'unknown error' after a suspend/resume (the text says so): nvidia_uvm "
                             "lost its state across the sleep. Reloading it (with no CUDA process running) brings CUDA "
                             "back; keeping the NVIDIA suspend services enabled avoids it.",
                       fix=fixes.on_node("sudo rmmod nvidia_uvm && sudo modprobe nvidia_uvm"),
                       also=(fixes.on_node("sudo systemctl enable nvidia-suspend.service nvidia-resume.service",
                                           note="driver's own suspend hooks"), fixes.on_node("ls -l /dev/nvidia-uvm")))
    return _render(c, doc)


# --- GPU BARs, bare metal or a virtual machine (the hypervisor's own fix from data/passthrough.csv) -------------

@_hook("kernel.bar-invalid", "kernel.bar-unassigned", "kernel.bar1-no-space", "kernel.bar1-realloc-failed")
def _bar(c: Candidate, doc: Doc) -> Finding:
    hypervisor = passthrough.in_text(doc.text)
    if hypervisor is None:
        return _render(c, doc)
    named = hypervisor.evidence.search(doc.text)
    excerpt = _with_line(c, doc, named) if named else ""
    return _render(c, doc, values={**c.values, "hypervisor": hypervisor.key}, excerpt=excerpt,
                   cause=f"This is a virtual machine ({hypervisor.name}, the text shows it) with the GPU passed "
                         "through, and the VM's firmware had no room for the GPU's large 64-bit BAR (its memory "
                         "window), so " + ("BAR1 stays smaller than the GPU's memory (CUDA works, large-BAR users "
                                           "such as peer-to-peer and GPUDirect RDMA are limited)"
                                           if c.detector.id == "kernel.bar1-no-space" else
                                           "the guest cannot use the GPU") + ". The fix is in the VM's "
                         "configuration on the hypervisor, not in the guest.",
                   also=(f"{hypervisor.name}: {hypervisor.bar_fix}", f"source: {hypervisor.source}",
                         fixes.gpunode("doctor") + "  # in the guest: hw.passthrough-bars shows each GPU's BARs"))


# --- which kernel driver owns the GPU (lspci -k in the same paste) ----------------------------------------------

_OWNER = compile_pattern(r"Kernel driver in use: (?P<owner>nouveau|vfio-pci|pci-stub|nvidiafb)\b")


@_hook("smi.no-driver", "smi.no-devices")
def _gpu_owner(c: Candidate, doc: Doc) -> Finding:
    owner = doc.has(_OWNER)
    if not owner:
        return _render(c, doc)
    name = owner["owner"].lower()
    values = {"kernel_driver_in_use": name}
    if name in ("vfio-pci", "pci-stub"):
        return _render(c, doc, values=values, excerpt=_with_line(c, doc, owner),
                       cause=f"The GPU is bound to {name} (lspci -k in the text says so): it is reserved for "
                             "passthrough to a virtual machine, so nvidia.ko cannot drive it on this host. Either use "
                             "it in the VM, or remove the vfio-pci binding (modprobe.d ids=, or the kernel command "
                             "line) and reboot.",
                       fix=fixes.on_node("grep -rn -E 'vfio|pci-stub' /etc/modprobe.d /proc/cmdline"),
                       also=(fixes.on_node("lspci -nnk -d 10de:"),))
    return _render(c, doc, values=values, excerpt=_with_line(c, doc, owner),
                   cause=f"The GPU is driven by {name}, not nvidia.ko (lspci -k in the text says so): {name} must be "
                         "blacklisted, the initramfs rebuilt and the node rebooted before the NVIDIA driver can bind.",
                   fix=fixes.gpunode("install", only="nouveau"), also=(fixes.on_node("lspci -nnk -d 10de:"),))


# --- a container started without a GPU request (the run command in the same paste) ------------------------------

_CONTAINER_RUN = compile_pattern(r"\b(?:docker|podman|nerdctl)(?:\s+container)?\s+run\b[^\n]*")
_APPTAINER = compile_pattern(r"\b(?:singularity|apptainer)\b")
# The paste itself says the container has no GPU: nvidia-smi fails inside it, or containerd's default runtime is not nvidia
_NO_GPU_SAID = compile_pattern(r"nvidia-smi\b[^\n.]{0,40}?\b(?:didn'?t|doesn'?t|does not|did not|not) work\w*[^\n.]{0,20}?\b"
                               r"(?:in|inside) (?:the )?(?:docker|container|pod)|\bno\b[^\n]{0,12}default_runtime_name\s*=\s*\"?nvidia")
_GPU_REQUEST = compile_pattern(r"--gpus\b|--device[= ]+(?:[\w.-]+/[\w-]+=|/dev/nvidia)|--runtime[= ]+nvidia|"
                               r"NVIDIA_VISIBLE_DEVICES|--hooks-dir|--nv\b|--cdi")
# A Dockerfile's FROM instruction (upper case, alone on its line, as Docker's reference writes it): the program runs in
# an image, so a driver it cannot reach had to come from the container runtime.
_DOCKERFILE_FROM = re.compile(r"^[ \t]*FROM[ \t]+(?:--platform=\S+[ \t]+)?[a-z0-9][\w./-]*(?::[\w.-]+)?(?:@sha256:[0-9a-f]+)?"
                              r"(?:[ \t]+(?:AS|as)[ \t]+[\w.-]+)?[ \t]*$", re.MULTILINE)
# The paste shows a container being configured or run (a command, a compose key, the NVIDIA runtime's variables); an
# emitter's own advice ("If you are running in a Docker container, ...") is no evidence and is not matched.
_CONTAINER_SHOWN = compile_pattern(r"\b(?:docker|podman|nerdctl)(?:\s+container)?\s+(?:run|exec|start|create)\b|"
                                   r"\bdocker[- ]compose\b|\bkubectl\b|NVIDIA_(?:VISIBLE_DEVICES|DRIVER_CAPABILITIES)|"
                                   r"--gpus\b|--runtime[= ]+nvidia|^\s*runtime:\s*nvidia\b|^\s*capabilities:\s*\[")


@_hook("container.no-gpu-injected")
def _no_gpu_injected(c: Candidate, doc: Doc) -> Finding | None:
    if c.detector.variant == "video-capability":  # the video libraries: only when the paste shows a container
        shown = doc.has(_CONTAINER_SHOWN)
        return None if shown is None else _render(c, doc, excerpt=_with_line(c, doc, shown))
    if not c.detector.variant.startswith("cuda-in-container"):  # every "cuda-in-container*" variant needs the run line
        return _render(c, doc)
    run = _no_gpu_evidence(doc)
    if run is None:  # no container command, or one that asked for a GPU: the CUDA message keeps its own cause
        return None
    return _render(c, doc, values={"command": run[0].strip()}, excerpt=_with_line(c, doc, run))


# --- Apptainer --nv binds only the driver libraries its nvliblist.conf names ------------------------------------------

_APPTAINER_NV = compile_pattern(r"\b(?:apptainer|singularity)\b[^\n]*\s--nv\b|\s--nv\b[^\n]*\.sif\b|/\.singularity\.d/")


@_hook("apptainer.nvliblist-incomplete")
def _nvliblist(c: Candidate, doc: Doc) -> Finding | None:
    used = doc.has(_APPTAINER_NV)
    if used is None:  # without Apptainer's --nv in sight the library is the driver's to provide (cuda.libraries-missing)
        return None
    return _render(c, doc, excerpt=_with_line(c, doc, used))


# --- WSL: NVML's "blocked by the operating system" means the /dev/dxg path when the paste shows WSL ---------------

_WSL = compile_pattern(r"/usr/lib/wsl/|\bmicrosoft-standard|\bWSL ?2?\b|/dev/dxg\b|\bdxgkrnl\b|\bGPU-PV\b")


@_hook("nvml.os-blocked")
def _os_blocked(c: Candidate, doc: Doc) -> Finding | None:
    if c.detector.variant != "wsl":
        return _render(c, doc)
    wsl = doc.has(_WSL)
    if wsl is None:  # the WSL reading needs WSL in the paste; the code's general cause stands otherwise
        return None
    return _render(c, doc, values={"wsl": True}, excerpt=_with_line(c, doc, wsl))


# --- package repositories: only NVIDIA's key is ours to explain ---------------------------------------------------

_NVIDIA_KEYS = {"A4B469963BF863CC", "F60F4B3D7FA2AF80", "DDCAE044F796ECB0"}  # CUDA repo (2022, older), toolkit repo


@_hook("repo.nvidia-key-missing")
def _repo_key(c: Candidate, doc: Doc) -> Finding | None:
    line = doc.excerpt(c.match.start(), c.match.end())
    if c.values["key"].upper() not in _NVIDIA_KEYS and "nvidia" not in line.lower():
        return None  # another vendor's repository
    return _render(c, doc, values={"key": c.values["key"].upper()})


# --- the open kernel module flavour (GSP could not start with it) -------------------------------------------------

_OPEN_MODULE = compile_pattern(r"Open Kernel Module|nvidia-kernel-open|nvidia-open\b|open(?: source)? (?:kernel module|KM)\b|"
                               r"open-gpu-kernel-modules|NVreg_OpenRmEnableUnsupportedGpus")


@_hook("kernel.open-module-unsupported")
def _open_module(c: Candidate, doc: Doc) -> Finding | None:
    # GSP failing without the open module in sight: the RmInitAdapter finding explains it
    return _beside(c, doc, doc.has(_OPEN_MODULE), only="gsp-init")


# --- a riser or external link named next to a GPU that fails ---------------------------------------------------------

_GPU_FAILS = compile_pattern(r"GPU is lost|fallen off|fell off|falls? off|couldn'?t communicate with the NVIDIA driver|"
                             r"Unable to determine the device handle|No devices were found|Xid\W{0,12}79|not (?:be )?seen by "
                             r"nvidia-smi|(?:disconnects?|drops?) (?:from|off) the (?:PCIe )?bus")


@_hook("hw.pcie-link")
def _pcie_link(c: Candidate, doc: Doc) -> Finding | None:
    return _beside(c, doc, doc.has(_GPU_FAILS))  # a riser mentioned in passing is no finding


# --- the container that got no GPU, for any finding that says no driver is reachable -------------------------------

# Findings that mean "this program reached no NVIDIA driver". Inside a container started without any GPU request
# that is the cause whatever the program's wording, so the decisive line (the run command, Apptainer without --nv,
# the paste saying nvidia-smi does not work in the container) wins over each of them, specific or generic.
DRIVER_UNREACHABLE = frozenset({"cuda.insufficient-driver", "cuda.no-driver", "lib.nvml-missing", "smi.no-driver",
                                "smi.not-installed", "cuda.no-device", "driver.not-loaded", "cuda.libraries-missing",
                                "lib.video-codec-missing"})


def _no_gpu_evidence(doc: Doc) -> re.Match[str] | None:
    """The line showing a container that asked for no GPU: its run command without a GPU flag; with no GPU request
    anywhere in the paste, Apptainer without --nv, the paste saying so, or the image's Dockerfile (FROM)."""
    run = next((m for m in _CONTAINER_RUN.finditer(doc.text) if not _GPU_REQUEST.search(m[0])), None)
    if run is None and not _GPU_REQUEST.search(doc.text):
        run = doc.has(_APPTAINER) or doc.has(_NO_GPU_SAID) or _DOCKERFILE_FROM.search(doc.text)
    return run


def in_container_without_gpu(finding: Finding, doc: Doc) -> Finding | None:
    """`finding` (a driver that cannot be reached) told as the container that got no GPU, when the paste shows one;
    None when it does not. The finding quotes its own line and the decisive one."""
    if finding.id not in DRIVER_UNREACHABLE:
        return None
    run = _no_gpu_evidence(doc)
    rows = [d for d in tables()[0] if d.id == "container.no-gpu-injected"]
    if run is None or not rows:
        return None
    row = next((d for d in rows if d.variant.startswith("cuda-in-container")), rows[0])
    line = doc.excerpt(run.start(), run.end())
    excerpt = finding.excerpt if line in finding.excerpt else f"{finding.excerpt}\n{line}"
    values = {**finding.values, "command": run[0].strip(), "instead_of": finding.id}
    return Finding(row.id, row.title, row.cause, row.fix, excerpt, values, row.also, max(row.strength, finding.strength))


# --- a vGPU given to a virtual machine: the data-center driver "does not support" a GPU its release supports ------

# Evidence of a vGPU, not merely of a VM: a supported GPU passed through whole to a VM can print the same NVRM lines
# for other reasons (tests/fixtures/explain/dev/gpu-unsupported_first-line-unstamped_nvtrust-55.txt, a confidential VM).
_VGPU_ATTACHED = compile_pattern(r"\bvGPU\b|\bGRID\b|\bmdev\b|mediated device|virtual GPU|\bnvidia-\d{2,3}\b[^\n]{0,40}"
                                 r"\btype\b")


@_hook("vgpu.wrong-guest-driver")
def _vgpu_guest(c: Candidate, doc: Doc) -> Finding | None:
    """Only when the release supports the GPU (data/gpus.csv, data/gpu_architectures.csv) and the paste shows a
    vGPU; otherwise the message means what kernel.gpu-unsupported says."""
    from gpunode import compat, gpus  # the GPU tables only when such a line is present
    gpu = gpus.lookup_id(str(c.values.get("pci_id", "")))
    try:
        version = compat.Version(str(c.values.get("driver_version", "")))
    except compat.InvalidVersion:
        return None
    if gpu is None or not compat.driver_supports(gpus.architecture_of(gpu), version)[0]:
        return None
    if not doc.has(_VGPU_ATTACHED):
        return None
    return _render(c, doc, values={**c.values, "gpu": gpu.name})  # the name as a value, beside the row's texts


# --- CUDA error 304: a refused system call is the node's business only where CUDA cannot start -------------------

# cudaErrorOperatingSystem also answers operations a platform lacks (CUDA IPC on Windows, host-registering some
# mappings, a checkpoint restore): the program's affair. Where CUDA's start-up fails with it (cuInit, the device
# count, a framework's CUDA initialisation) or the paste shows a container or sandbox, a filter refused the driver's
# call: the seccomp profile.
_CUDA_START = compile_pattern(r"\bcuInit\b|cudaGetDeviceCount|\bdevice count\b|cudaSetDevice|cudaGetDevice\b|"
                              r"cuda(?:Runtime|Driver)GetVersion|failed to initiali[sz]e CUDA|CUDA initiali[sz]ation|"
                              r"\bcuda_?init\b")
_CONTAINED = compile_pattern(r"\b(?:docker|podman|nerdctl|ctr|crictl|kubectl)\b[^\n]*\b(?:run|exec)\b|"
                             r"\bseccomp\b|\bsandbox(?:es|ed)?\b|\bcontainer\b|\bpod\b")


@_hook("container.seccomp-denied")
def _seccomp(c: Candidate, doc: Doc) -> Finding | None:
    return _beside(c, doc, doc.has(_CUDA_START) or doc.has(_CONTAINED))


# --- the device plugin's pod without the privilege the volume-mounts strategy needs --------------------------------

# The strategy line alone is configuration; the finding needs the plugin failing to find the driver beside it.
_PLUGIN_NO_NVML = compile_pattern(r"ERROR_LIBRARY_NOT_FOUND|could not load NVML library|Failed to initiali[sz]e NVML|"
                                  r"nvml init failed|Incompatible strategy detected")


@_hook("kube.device-plugin-unprivileged")
def _plugin_unprivileged(c: Candidate, doc: Doc) -> Finding | None:
    return _beside(c, doc, doc.has(_PLUGIN_NO_NVML))


# --- a GPU older than any driver of today's CUDA, beside CUDA's "insufficient driver" -------------------------------

# The GPU's name alone is no finding: only with CUDA asking for a newer driver is the GPU's age the cause.
_INSUFFICIENT_DRIVER = compile_pattern(r"insufficient driver|driver version is insufficient|InsufficientDriver|"
                                       r"INSUFFICIENT_DRIVER")


# --- Windows' Code 43 is the NVIDIA driver refusing the hypervisor only where the paste shows a VM --------------------

_IN_VM = compile_pattern(r"pass-?through|\bvfio\b|\bkubevirt\b|\bProxmox\b|virtual machine|\bVMs?\b|\bguest\b|"
                         r"\bhypervisor\b")


@_hook("virt.hypervisor-hidden-required")
def _code_43(c: Candidate, doc: Doc) -> Finding | None:
    named = passthrough.in_text(doc.text)
    # Code 43 on bare metal is any driver's failure, not the hypervisor check
    return _beside(c, doc, named.evidence.search(doc.text) if named is not None else doc.has(_IN_VM))


# --- MicroK8s hides its gpu/nvidia addon on an architecture the addon does not declare -----------------------------

_NOT_AMD64 = compile_pattern(r"\baarch64\b|\barm64\b|\bppc64le\b|\bs390x\b|\bGraviton\d?\b|\bJetson\b|\bGrace\b|"
                             r"\bg5g\b")


# --- a kernel built from source is the cause of an NVIDIA DKMS build failure only beside that failure ---------------

_NVIDIA_DKMS_ERROR = compile_pattern(r"/var/lib/dkms/nvidia[^\n]*?\berror:")  # the compiler's line, quoted first
_NVIDIA_DKMS_FAILED = compile_pattern(r"Bad return status for module build|Building DKMS module[^\n]*?nvidia[^\n]*?"
                                      r"FAILED|\bDKMS\b[^\n]{0,40}?\bfail")


# --- rows that stand only beside their decisive line ---------------------------------------------------------------

# id -> (the variant gated, None for every row of the id; the decisive lines, the first one found is quoted). Without
# one of them in the paste the row's match is no finding.
_DECISIVE: dict[str, tuple[str | None, tuple[re.Pattern[str], ...]]] = {
    # a loader asking for the unversioned libcuda.so (cudarc, cuda-python's early releases, libfabric) fails under
    # WSL because the Windows driver's copies there are not links; elsewhere the same line is cuda.no-driver's
    "wsl.libcuda-not-symlink": ("unversioned-loader", (_WSL,)),
    # the GPU's name alone is no finding: only with CUDA asking for a newer driver is the GPU's age the cause
    "kernel.gpu-unsupported": ("legacy-cuda", (_INSUFFICIENT_DRIVER,)),
    # on amd64 the addon is missing for another reason (no core repository)
    "kube.microk8s-gpu-addon-arch": (None, (_NOT_AMD64,)),
    # a kernel built from source is no finding by itself; the compiler's line is quoted first
    "dkms.headers-missing": ("custom-kernel", (_NVIDIA_DKMS_ERROR, _NVIDIA_DKMS_FAILED)),
}


@_hook(*_DECISIVE)
def _decisive(c: Candidate, doc: Doc) -> Finding | None:
    only, lines = _DECISIVE[c.detector.id]
    return _beside(c, doc, next((m for p in lines if (m := doc.has(p))), None), only=only)
