"""Boot and kernel layers: Secure Boot, nouveau (loaded, blacklisted, in the initramfs), kernel headers, and
whether the NVIDIA module exists for the kernel the next boot will run."""

from __future__ import annotations

import time

from gpunode import fixes, pkgmgr, rules, signing
from gpunode.doctor.base import NO_GPU, Node, Verdict, check, failed, passed, skipped, warned
from gpunode.errors import GpunodeError
from gpunode.facts import driver as driver_facts
from gpunode.facts import kernel as kernel_facts
from gpunode.versions import normalize_arch


def _signing_fix(node: Node) -> str:
    return signing.fix(node.driver_version, node.facts.os.id)


def _signer(node: Node) -> str | None:
    return node.facts[driver_facts.MODULE].signer


@check("boot.secure-boot", "boot", "Secure Boot lets the NVIDIA module load")
def secure_boot(node: Node) -> Verdict:
    """With Secure Boot on, the kernel refuses an unsigned (or foreign-signed) nvidia.ko: the driver installs
    and then never loads. Whether that bites depends on the module, not just on the firmware switch."""
    sb = node.facts.secure_boot
    if sb.enabled is False:
        return passed(sb.evidence or "Secure Boot is off")
    if not node.has_gpu:
        return NO_GPU
    rejected = [f for f in node.kernel_findings if f.id == "secureboot.module-rejected"]
    if sb.enabled is None:
        if rejected:
            return failed(f"the kernel rejected a module: {rejected[0].excerpt}", rejected[0].fix)
        return warned(sb.evidence or "could not read the Secure Boot state",
                      fixes.on_node("sudo mokutil --sb-state") + "  # install mokutil if it is missing")
    if node.facts.loaded_driver:
        signer = _signer(node)
        return passed(f"Secure Boot is on ({sb.evidence}) and the nvidia module is loaded"
                      + (f" (signed by {signer})" if signer else ""))
    if rejected:
        return failed(f"Secure Boot is on and the kernel rejected the module: {rejected[0].excerpt}", _signing_fix(node))
    if node.driver.module and not _signer(node):
        return failed(f"Secure Boot is on and the installed nvidia module {node.driver.module} is not signed: the "
                      "kernel will refuse it", _signing_fix(node))
    return warned(f"Secure Boot is on ({sb.evidence}): the NVIDIA module must be signed with an enrolled key",
                  _signing_fix(node))


@check("kernel.nouveau-loaded", "kernel", "nouveau not loaded")
def nouveau_loaded(node: Node) -> Verdict:
    if not node.has_gpu:
        return NO_GPU
    if node.facts.module_loaded("nouveau"):
        return failed("nouveau is in /proc/modules: it owns the GPU and blocks the NVIDIA driver",
                      fixes.gpunode("install", only="nouveau", reboot=True))
    return passed("nouveau is not loaded")


@check("kernel.nouveau-blacklisted", "kernel", "nouveau blacklisted")
def nouveau_blacklisted(node: Node) -> Verdict:
    if not node.has_gpu:
        return NO_GPU
    block = node.facts.nouveau_block()
    if block.effective:
        return passed("; ".join(block.sources))
    seen = "; ".join(block.sources) or "no modprobe.d file or kernel argument blocks nouveau"
    fix = fixes.gpunode("install", only="nouveau") + f"  # writes {rules.NOUVEAU_BLACKLIST} and rebuilds the initramfs"
    if node.facts.loaded_driver:
        return warned(f"{seen} (the NVIDIA driver holds the GPU now; at a boot where it does not load, nouveau "
                      "would)", fix)
    return failed(seen, fix)


def _date(stamp: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(stamp))


@check("kernel.nouveau-initramfs", "kernel", "nouveau blacklist is in the initramfs")
def nouveau_initramfs(node: Node) -> Verdict:
    """The initramfs loads modules before the root filesystem's modprobe.d is read: a blacklist written after
    the initramfs was built does not stop nouveau at early boot."""
    if not node.has_gpu:
        return NO_GPU
    block = node.facts.nouveau_block()
    if not block.effective:
        return skipped("nouveau is not blacklisted (see kernel.nouveau-blacklisted)")
    files = [s.split(":", 1)[0] for s in block.sources if s.startswith("/")]
    if not files:
        return passed("blacklisted on the kernel command line, which early boot honours too")
    image = node.facts.initramfs_mtime
    if image is None:
        return skipped(f"no initramfs image found for kernel {node.facts.kernel}")
    newest = max(files, key=lambda p: node.facts.mtimes.get(p, 0))
    written = node.facts.mtimes.get(newest, 0)
    if written > image:
        return failed(f"the initramfs ({_date(image)}) is older than {newest} ({_date(written)}): early boot can "
                      "still load nouveau", fixes.gpunode("install", only="nouveau") + "  # rebuilds the initramfs")
    return passed(f"the initramfs ({_date(image)}) was built after {newest} ({_date(written)})")


def _headers_install(node: Node, kernel: str) -> str:
    """The command that installs `kernel`'s headers on the node (a Fix), or words when no package manager is known."""
    manager = rules.package_manager(node.facts)
    package = pkgmgr.headers_package(manager or "", kernel)
    if package is not None:
        return fixes.on_node(f"sudo {'apt-get' if manager == 'apt' else manager} install -y {package}")
    return f"install the kernel headers for {kernel} with the distribution's package manager"


def _then(headers: str, build: str) -> str:
    """The headers installed, then `build` (a node command): one node command, or words then the command's text."""
    return fixes.on_node(f"{headers} && {build}") if isinstance(headers, fixes.Fix) else f"{headers} && {build}"


@check("kernel.headers", "kernel", "headers for the running kernel")
def headers(node: Node) -> Verdict:
    """DKMS (and nvidia-installer) build the module against /lib/modules/$(uname -r)/build; without it a driver
    install fails and a kernel update leaves the node without a driver. Checked with no GPU too when a DKMS
    driver is installed: its next build needs them all the same."""
    if not node.has_gpu and not any(e.module.startswith("nvidia") for e in node.kernels.dkms):
        return NO_GPU
    found = node.facts[kernel_facts.HEADERS]
    if found:
        return passed(f"headers for {node.facts.kernel}: {found[0]}")
    return failed(f"no headers for the running kernel {node.facts.kernel} (/lib/modules/{node.facts.kernel}/build "
                  "is missing): the NVIDIA module cannot be built for it", _headers_install(node, node.facts.kernel))


def _rebuild_fix(node: Node, kernel: str, has_headers: bool) -> str:
    version = node.driver_version or "VERSION"
    registered = node.kernels.dkms_versions()
    if not node.driver.packages and node.driver_version and node.driver_version in registered:
        # gpunode's own case (a .run with DKMS): the driver step installs the headers and builds for that kernel
        return fixes.gpunode("install", driver=version) + f"  # installs the headers of {kernel} if missing and " \
            "builds the nvidia module for it (DKMS)"
    if any(e.module.startswith("nvidia") for e in node.kernels.dkms):
        build = fixes.on_node(f"sudo dkms autoinstall -k {kernel}")
        return build if has_headers else _then(_headers_install(node, kernel), build)
    module_packages = [n for n in node.packages if n.startswith("linux-modules-nvidia-") and
                       n.endswith("-" + node.facts.kernel)]
    if module_packages:
        return fixes.on_node(f"sudo apt-get install -y {module_packages[0][: -len(node.facts.kernel)]}{kernel}")
    try:
        arch = normalize_arch(node.facts.arch)
    except GpunodeError:
        arch = node.facts.arch
    build = fixes.on_node(f"sudo sh NVIDIA-Linux-{arch}-{version}.run --silent --kernel-module-only --kernel-name={kernel}")
    return build if has_headers else _then(_headers_install(node, kernel), build)


def _failed_build_fix(node: Node, kernel: str, running: str) -> str:
    """DKMS cannot build this driver for `kernel`: the next boot must stay on `running` until a driver release (or
    another flavour) builds for it. Removing the kernel (and its half-configured headers) does that."""
    remove = pkgmgr.remove_kernel(rules.package_manager(node.facts) or "", kernel, headers=True)
    if remove is not None:
        return fixes.on_node(f"sudo {remove}", note=f"the next boot stays on {running}, until a driver release builds for "
                                          f"{kernel}")
    return f"remove kernel {kernel} with the distribution's package manager, or install a driver release that " \
        f"builds for it (DKMS's make.log says why this one does not)"


@check("kernel.dkms-newest-kernel", "kernel", "NVIDIA module built for the kernel the next boot runs")
def dkms_newest_kernel(node: Node) -> Verdict:
    """The next boot runs the boot loader's default: the newest installed kernel (GRUB_DEFAULT=0), or what grubby
    names. A kernel upgrade installs it; DKMS builds the nvidia module for it only if its headers were there at that
    moment. Without a module the node comes back without the NVIDIA driver. (A kernel not installed yet is
    pkg.pending-upgrades' business.) Checked with no GPU too when a driver is installed: the DKMS state is real
    either way."""
    if not node.has_gpu and not node.driver_on_disk:
        return NO_GPU
    info = node.kernels
    nxt, how = info.boot_default
    if not info.known or nxt is None:
        return skipped("could not list the installed kernels")
    if not node.driver_version and not any(k.module for k in info.kernels) and not info.dkms:
        return skipped("no NVIDIA driver installed")
    built = info.built_for(nxt.name)
    running = node.facts.kernel
    also = "" if nxt.name == running else f" (running {running})"
    if built:
        return passed(f"next boot runs {nxt.name}{also} ({how}): {built[0]}")
    failure = info.failed_build(nxt.name)
    if failure is not None:  # building again fails the same way: keep the kernel the module builds for
        return failed(f"the next boot runs {nxt.name}{also} ({how}), which has no nvidia module: DKMS's build of "
                      f"{failure.module} for it failed ({failure.error}; {failure.log}), so a boot into it comes up "
                      "without the NVIDIA driver", _failed_build_fix(node, nxt.name, running))
    return failed(f"the next boot runs {nxt.name}{also} ({how}), which has no nvidia module"
                  + ("" if nxt.headers else " and no headers")
                  + ": a boot into it comes up without the NVIDIA driver", _rebuild_fix(node, nxt.name, nxt.headers))
