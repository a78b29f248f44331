"""GPU health beyond the kernel log: ECC, row remapping and page retirement, the GSP firmware, the unified memory
module and its device node, the MIG layout against the one configured, and what the next package upgrade will do
to the driver and the kernel."""

from __future__ import annotations

from gpunode import fixes
from gpunode.doctor.base import NO_GPU, Node, Verdict, check, failed, passed, skipped, warned
from gpunode.doctor.health import _blacklisted, _tied_to_driver
from gpunode.facts import health as health_facts
from gpunode.facts import kernel as kernel_facts
from gpunode.facts.gpuhealth import GPU_HEALTH, MIG, UPGRADES, GpuHealth, selected_layout
from gpunode.facts.health import kernel_key

NOT_READ = "nvidia-smi -q could not be read (the NVIDIA driver is not loaded or nvidia-smi fails)"


def _health(node: Node) -> tuple[GpuHealth, ...]:
    return node.facts[GPU_HEALTH]


def _index(node: Node, bus: str) -> str:
    for g in node.smi_gpus:
        if g.bus == bus:
            return f"GPU {g.index} ({bus})"
    return bus


@check("health.ecc", "health", "ECC on, no uncorrectable ECC errors")
def ecc(node: Node) -> Verdict:
    """A double-bit (uncorrectable) error since the driver loaded means data a job read may be wrong; the
    counter clears only when the driver reloads. A pending ECC mode change waits for a reboot."""
    if not node.has_gpu:
        return NO_GPU
    gpus = _health(node)
    if not gpus:
        return skipped(NOT_READ)
    with_ecc = [g for g in gpus if g.ecc_current in ("Enabled", "Disabled")]
    if not with_ecc:
        return passed("these GPUs have no ECC memory (ECC Mode N/A)")
    bad = [g for g in with_ecc if g.volatile_uncorrectable]
    if bad:
        shown = "; ".join(f"{_index(node, g.bus)}: {g.volatile_uncorrectable} uncorrectable ECC error(s) since the "
                          "driver loaded" for g in bad)
        return failed(shown + ": results computed on it may be corrupt", "drain the node, then: "
                      + fixes.on_node("sudo nvidia-smi -r") + " # or reboot; if errors return, the GPU needs service",
                      reboot=True)
    pending = [g for g in with_ecc if g.ecc_pending and g.ecc_pending != g.ecc_current]
    if pending:
        return warned("; ".join(f"{_index(node, g.bus)}: ECC {g.ecc_current}, pending {g.ecc_pending}"
                                for g in pending) + ": takes effect at the next reboot", fixes.on_node("sudo reboot"), reboot=True)
    off = [g for g in with_ecc if g.ecc_current == "Disabled"]
    if off:
        return warned(f"ECC is disabled on {', '.join(_index(node, g.bus) for g in off)}: memory errors go "
                      "undetected", fixes.on_node("sudo nvidia-smi -e 1 && sudo reboot"), reboot=False)
    history = [g for g in with_ecc if g.aggregate_uncorrectable]
    if history:
        return passed("ECC enabled; no uncorrectable error since the driver loaded ("
                      + ", ".join(f"{_index(node, g.bus)}: {g.aggregate_uncorrectable} over its life" for g in history)
                      + ")")
    return passed(f"ECC enabled on {len(with_ecc)} GPU(s), no uncorrectable errors")


@check("health.row-remapping", "health", "no pending row remap or page retirement, spare rows left")
def row_remapping(node: Node) -> Verdict:
    """Ampere and newer repair a memory row after an uncorrectable error by remapping it, which takes effect at
    the next GPU reset; until then the GPU should not take jobs. A remapping failure (no spare row left) means
    the GPU must be replaced. Older GPUs retire pages instead, at the next reboot."""
    if not node.has_gpu:
        return NO_GPU
    gpus = _health(node)
    if not gpus:
        return skipped(NOT_READ)
    failed_gpus = [g for g in gpus if g.remap_failed]
    if failed_gpus:
        return failed(f"row remapping failed on {', '.join(_index(node, g.bus) for g in failed_gpus)}: no spare "
                      "memory row left", "drain the node and have the GPU replaced (RMA); nvidia-smi -q -d "
                      "ROW_REMAPPER shows the counts")
    pending = [g for g in gpus if g.remap_pending or g.retired_pending]
    if pending:
        what = "; ".join(f"{_index(node, g.bus)}: " + ("row remap pending" if g.remap_pending else
                                                       "page retirement pending") for g in pending)
        return failed(what + ": the GPU needs a reset before it takes jobs",
                      "drain the node, then: " + fixes.on_node("sudo nvidia-smi -r", note="or reboot"), reboot=True)
    remapped = [g for g in gpus if g.remapped_uncorrectable]
    if remapped:
        return passed("rows remapped earlier and in effect: " + ", ".join(
            f"{_index(node, g.bus)}: {g.remapped_uncorrectable}" for g in remapped))
    if not any(g.remap_reported or g.retired_double_bit is not None for g in gpus):
        return passed("these GPUs report no row remapping or page retirement")
    return passed(f"no pending row remap or page retirement on {len(gpus)} GPU(s)")


@check("driver.gsp", "driver", "GSP firmware answers")
def gsp(node: Node) -> Verdict:
    """Turing and newer can run most of the driver on the GPU System Processor; the open module always does. A
    GSP timeout (Xid 119/120) hangs the GPU until a reset; only the proprietary module can turn GSP off."""
    if not node.has_gpu:
        return NO_GPU
    gpus = _health(node)
    if not gpus:
        return skipped(NOT_READ)
    used = [g for g in gpus if g.gsp]
    errors = [f for f in node.kernel_findings if f.id == "kernel.gsp-timeout" or
              (f.id.startswith("xid.") and f.values.get("xid") in (119, 120))]
    flavour = node.facts.loaded_driver.flavour if node.facts.loaded_driver else node.driver.module_flavour
    if errors and used and flavour == "proprietary":
        return warned(f"GSP firmware errors since boot ({errors[0].title}; see health.xid) with the proprietary "
                      "module, which can run without GSP", "echo 'options nvidia NVreg_EnableGpuFirmware=0' | sudo "
                      "tee /etc/modprobe.d/nvidia-gsp.conf && sudo update-initramfs -u && sudo reboot", reboot=True)
    if errors:
        return skipped(f"GSP firmware errors since boot, reported by health.xid / health.driver-errors; the "
                       f"{flavour or 'open'} module cannot run without GSP")
    if not used:
        return passed("GSP firmware not in use (proprietary module on a GPU where it is optional, or an older GPU)")
    return passed(f"GSP firmware {used[0].gsp} on {len(used)} GPU(s), no GSP errors since boot")


@check("driver.uvm", "driver", "nvidia_uvm loaded and /dev/nvidia-uvm present")
def uvm(node: Node) -> Verdict:
    """CUDA needs the unified memory module and its device node; without them nvidia-smi works and every CUDA
    program fails (cudaErrorUnknown / "CUDA driver version is insufficient"). Both appear on first use only when
    something runs nvidia-modprobe, which containers do not."""
    if not node.has_gpu:
        return NO_GPU
    if not node.facts.loaded_driver:
        return skipped("the NVIDIA module is not loaded")
    devices = node.facts.get(kernel_facts.DEV_CHAR)
    has_node = devices is not None and "/dev/nvidia-uvm" in devices.devices
    if not node.facts.module_loaded("nvidia_uvm"):
        return failed("the nvidia_uvm module is not loaded: CUDA programs fail although nvidia-smi works",
                      fixes.gpunode("install", only="nodesettings") + "  # loads it now and at every boot")
    if devices is None:
        return skipped("nvidia_uvm is loaded; /dev could not be listed")
    if not has_node:
        return failed("nvidia_uvm is loaded but /dev/nvidia-uvm does not exist: CUDA in containers fails",
                      fixes.gpunode("install", only="nodesettings") + "  # creates /dev/nvidia-uvm and /dev/nvidia-uvm-tools")
    return passed("nvidia_uvm loaded, /dev/nvidia-uvm present")


def _wanted_text(wanted: dict[str, int]) -> str:
    return ", ".join(f"{n} x {p}" for p, n in sorted(wanted.items())) or "MIG disabled"


@check("hw.mig-layout", "hardware", "MIG layout is the configured one")
def mig_layout(node: Node) -> Verdict:
    """MIG instances do not survive a reboot: something (nvidia-mig-manager with mig-parted) must create them
    again at boot, or jobs find a MIG-enabled GPU with no MIG device."""
    if not node.has_gpu:
        return NO_GPU
    if not node.smi_gpus:
        return skipped("MIG layout unknown: the NVIDIA driver is not loaded or nvidia-smi fails")
    layout = node.facts.get(MIG)
    if layout is None:
        return skipped("nvidia-smi -L could not be read")
    wanted = selected_layout(layout, len(node.smi_gpus))
    enabled = [g.index for g in node.smi_gpus if g.mig_current == "Enabled"]
    if wanted is not None:
        differ = []
        for index, profiles in sorted(wanted.items()):
            have: dict[str, int] = {}
            for p in layout.devices.get(index, ()):
                have[p] = have.get(p, 0) + 1
            if have != profiles:
                differ.append(f"GPU {index}: {_wanted_text(have)}, configured {_wanted_text(profiles)}")
        if differ:
            return warned(f"MIG layout differs from mig-parted's {layout.selected!r}: " + "; ".join(differ),
                          fixes.on_node("sudo nvidia-mig-parted apply -f /etc/nvidia-mig-manager/config.yaml -c "
                                        f"{layout.selected}") + "  # and: sudo systemctl enable nvidia-mig-manager.service")
        return passed(f"MIG layout matches mig-parted's {layout.selected!r}")
    if not enabled:
        return passed("MIG is not enabled; no MIG layout configured")
    empty = [i for i in enabled if not layout.devices.get(i)]
    if empty:
        return warned(f"MIG is enabled on GPU {', '.join(map(str, empty))} but it has no MIG device (instances do "
                      "not survive a reboot) and no mig-parted configuration is selected",
                      fixes.on_node(f"sudo nvidia-smi mig -i {empty[0]} -cgi PROFILES -C") + "  # PROFILES from `"
                      + fixes.on_node(f"nvidia-smi mig -i {empty[0]} -lgip") + "`; to keep them: install nvidia-mig-manager")
    counts = ", ".join(f"GPU {i}: {len(layout.devices.get(i, ()))}" for i in enabled)
    return warned(f"MIG devices now ({counts}) but no mig-parted configuration is selected: the layout is lost at "
                  "the next reboot", "install nvidia-mig-manager and set MIG_PARTED_SELECTED_CONFIG for "
                  "nvidia-mig-manager.service (NVIDIA mig-parted README)")


def _kernel_release(name: str) -> str | None:
    """The release a Debian-family kernel image package installs (linux-image[-unsigned]-6.1.0-21-amd64 ->
    6.1.0-21-amd64); None for anything else, metapackages included (linux-image-amd64, linux-image-generic)."""
    for prefix in ("linux-image-unsigned-", "linux-image-"):
        if name.startswith(prefix) and name[len(prefix):][:1].isdigit():
            return name[len(prefix):]
    return None


def _is_kernel(name: str) -> bool:
    return _kernel_release(name) is not None or name in ("kernel", "kernel-core")


@check("pkg.pending-upgrades", "packages", "pending upgrades keep the driver working")
def pending_upgrades(node: Node) -> Verdict:
    """The next `apt upgrade` (or dnf update, by hand or unattended) may bring new driver libraries under the
    loaded module, or a new kernel. A new kernel is fine only if an nvidia module gets built for it: DKMS with
    its headers, or the distribution's prebuilt module package."""
    if not node.has_gpu:
        return NO_GPU
    pending = node.facts[UPGRADES]
    if pending is None:
        return skipped(f"no apt-get or dnf to ask for pending upgrades on {node.facts.os}")
    settings = node.facts[health_facts.AUTO_UPGRADE]
    driver = [u for u in pending if _tied_to_driver(u.name) and not _blacklisted(u.name, settings.apt_blacklist)]
    kernels = sorted((u for u in pending if _is_kernel(u.name)), key=lambda u: kernel_key(u.name))
    notes = []
    if driver:
        hold = "dnf versionlock add" if node.facts.os.family == "rhel" else "apt-mark hold"
        changes = ", ".join(f"{u.name} {u.old} -> {u.new}" if u.old else f"{u.name} {u.new}" for u in driver[:4])
        return warned(f"the next upgrade changes the driver: {changes}: the libraries then no longer match the "
                      "loaded module until a reboot (Driver/library version mismatch)",
                      fixes.on_node(f"sudo {hold} {' '.join(u.name for u in driver)}")
                      + "  # or upgrade in a maintenance window and reboot")
    if kernels and node.driver_version:
        new = kernels[-1]
        release = _kernel_release(new.name) or new.new
        dkms = any(e.module.startswith("nvidia") for e in node.kernels.dkms)
        headers = any(u.name.startswith(("linux-headers-", "kernel-devel")) for u in pending)
        prebuilt = any(u.name.startswith("linux-modules-nvidia-") for u in pending)
        if prebuilt:
            notes.append(f"new kernel {release}; its prebuilt nvidia module package comes with it")
        elif dkms and headers:
            notes.append(f"new kernel {release}; DKMS will build the nvidia module for it (headers are upgraded too)")
        elif dkms:
            return warned(f"the next upgrade installs kernel {release} without its headers: DKMS cannot build the "
                          "nvidia module and the node boots without a driver",
                          fixes.on_node(f"sudo apt-get install -y linux-headers-{release}")
                          if node.facts.os.family == "debian" else
                          fixes.on_node("sudo dnf install -y kernel-devel") + "  # the version of the new kernel")
        else:
            return warned(f"the next upgrade installs kernel {release} and the nvidia module is not built by DKMS "
                          "(a .run installed without --dkms?): the node boots without a driver",
                          "after the upgrade: " + fixes.gpunode("install", driver=node.driver_version or "VERSION")
                          + "  # rebuilds the module for the new kernel")
    if not pending:
        return passed("no pending upgrades")
    return passed(f"{len(pending)} pending upgrade(s); none changes the driver" + (f"; {notes[0]}" if notes else ""))
