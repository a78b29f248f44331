"""Fake nodes for the doctor and verify unit tests: a finished node (driver, toolkit, docker and containerd wired
in, fabric manager where there are NVSwitches) described by the probe answers gpunode reads, and helpers to
break it one fact at a time."""

from __future__ import annotations

from gpunode.doctor import run_checks
from gpunode.facts import FULL, gather
from gpunode.facts import containers as c
from tests.fakes.connection import FakeConnection, FakeNode

V = "580.95.05"
K = "5.15.0-91-generic"
T4 = 0x1EB8
H100 = 0x2330
TOOLKIT = ("nvidia-container-toolkit", "nvidia-container-toolkit-base", "libnvidia-container-tools",
           "libnvidia-container1")
TOOLS = {"modprobe", "systemctl", "sudo", "sha256sum", "reboot", "update-initramfs", "dkms", "mokutil", "nvidia-smi",
         "nvidia-ctk", "nvidia-container-runtime", "nvidia-container-runtime-hook", "nvidia-container-cli", "docker",
         "dockerd", "containerd", "ctr", "apt-get", "dpkg", "gcc", "make", "curl", "gpg"}
DATE = "2026-11-21"


def uuid(i: int) -> str:
    return f"GPU-{i:08x}-1111-2222-3333-444455556666"


def smi_q(buses: list[str], name: str = "Tesla T4", persistence: str = "Enabled", mig: tuple[str, str] | None = None,
          virtualization: str = "Pass-Through", license: str | None = None) -> str:
    """What the probe keeps of `nvidia-smi -q` (see gpunode/facts/driver.py GPUS), one block per GPU."""
    out = []
    for i, bus in enumerate(buses):
        domain, rest = bus.split(":", 1)
        out += [f"GPU 0000{domain.upper()}:{rest.upper()}",
                f"    Product Name                          : {name}",
                "    Product Brand                         : NVIDIA",
                f"    Persistence Mode                      : {persistence}"]
        if mig:
            out += ["    MIG Mode", f"        Current                           : {mig[0]}",
                    f"        Pending                           : {mig[1]}"]
        out += [f"    GPU UUID                              : {uuid(i)}", "    GPU Virtualization Mode",
                f"        Virtualization Mode               : {virtualization}",
                "        Host VGPU Mode                    : N/A"]
        if license:
            out += ["    vGPU Software Licensed Product", "        Product Name                      : NVIDIA Virtual "
                    "Compute Server", f"        License Status                    : {license}"]
    return "\n".join(out) + "\n"


def smi_health(buses: list[str], gsp: str | None = V, ecc: tuple[str, str] = ("Enabled", "Enabled"),
               volatile_dram_uncorrectable: int = 0, aggregate_dram_uncorrectable: int = 0, remap: str = "0 0 No No",
               retired: tuple[str, str, str] = ("N/A", "N/A", "N/A")) -> str:
    """The blocks the probe keeps of `nvidia-smi -q` for GPU health (gpunode/facts/gpuhealth.py GPU_HEALTH), laid
    out as R535+ prints them (see shared/fixtures/real/nvidia-smi-q-text). `remap`: "correctable uncorrectable
    pending failure", or "N/A" for GPUs without row remapping."""
    out = []
    for bus in buses:
        domain, rest = bus.split(":", 1)
        out += [f"GPU 0000{domain.upper()}:{rest.upper()}",
                f"    GSP Firmware Version                  : {gsp or 'N/A'}",
                "    ECC Mode", f"        Current                           : {ecc[0]}",
                f"        Pending                           : {ecc[1]}", "    ECC Errors"]
        for scope, dram in (("Volatile", volatile_dram_uncorrectable), ("Aggregate", aggregate_dram_uncorrectable)):
            na = ecc[0] == "N/A"
            out += [f"        {scope}", f"            SRAM Correctable              : {'N/A' if na else 0}",
                    f"            SRAM Uncorrectable Parity     : {'N/A' if na else 0}",
                    f"            SRAM Uncorrectable SEC-DED    : {'N/A' if na else 0}",
                    f"            DRAM Correctable              : {'N/A' if na else 0}",
                    f"            DRAM Uncorrectable            : {'N/A' if na else dram}"]
        out += ["    Retired Pages", f"        Single Bit ECC                    : {retired[0]}",
                f"        Double Bit ECC                    : {retired[1]}",
                f"        Pending Page Blacklist            : {retired[2]}"]
        if remap == "N/A":
            out.append("    Remapped Rows                         : N/A")
        else:
            corr, uncorr, pending, failure = remap.split()
            out += ["    Remapped Rows", f"        Correctable Error                 : {corr}",
                    f"        Uncorrectable Error               : {uncorr}",
                    f"        Pending                           : {pending}",
                    f"        Remapping Failure Occurred        : {failure}",
                    "        Bank Remap Availability Histogram", "            Max                           : 640 bank(s)"]
    return "\n".join(out) + "\n"


def smi_list(names: list[str], mig: dict[int, list[str]] | None = None) -> str:
    """`nvidia-smi -L`, with MIG devices under their GPU."""
    out = []
    for i, name in enumerate(names):
        out.append(f"GPU {i}: {name} (UUID: {uuid(i)})")
        for j, profile in enumerate((mig or {}).get(i, [])):
            out.append(f"  MIG {profile:<12} Device  {j}: (UUID: MIG-{i:04x}{j:04x}-aaaa-bbbb-cccc-dddddddddddd)")
    return "\n".join(out) + "\n"


def set_output(node: FakeNode, name: str, text: str | None, status: int = 0) -> None:
    """A probe command's answer; None makes it fail like a missing tool (exit 127)."""
    node.outputs[name] = ("", 127) if text is None else (text, status)


def packages(node: FakeNode, found: dict[str, str], held: tuple[str, ...] = ()) -> None:
    set_output(node, "pkg_status", "".join(f"{'hi ' if n in held else 'ii '}\t{n}\t{v}\n"
                                           for n, v in sorted(found.items())))


def units(node: FakeNode, states: dict[str, tuple[str, str]]) -> None:
    set_output(node, "units", "".join(f"{u}\t{a}\t{e}\n" for u, (a, e) in sorted(states.items())))


def installed(node: FakeNode) -> dict[str, str]:
    return {parts[1]: parts[2] for line in node.outputs.get("pkg_status", ("", 0))[0].splitlines()
            if len(parts := line.split("\t")) == 3}


def virt_output(buses: list[str], detect: str = "none", vendor: str = "Dell Inc.", product: str = "PowerEdge R750",
                bar1: str = "0x000000c000000000 0x000000c3ffffffff 0x000000000014220c") -> str:
    """The `virt` probe command's answer: systemd-detect-virt, DMI, and each GPU's sysfs resource lines (BAR0 16 MiB
    of registers, BAR1 the memory window: 16 GiB 64-bit prefetchable by default)."""
    out = f"detect={detect}\nsys_vendor={vendor}\nproduct_name={product}\n"
    if detect != "none":
        out += "cpu_hypervisor=1\n"
    for i, bus in enumerate(buses):
        zero = "0x0000000000000000 0x0000000000000000 0x0000000000000000\n"
        out += (f"@gpu {bus}\n0x00000000{0xd9 - i:02x}000000 0x00000000{0xd9 - i:02x}ffffff 0x0000000000040200\n"
                f"{bar1}\n{zero}0x000000c400000000 0x000000c401ffffff 0x000000000014220c\n{zero}"
                "0x000000000000e000 0x000000000000e07f 0x0000000000040101\n")
    return out


def finished(device: int = T4, count: int = 1, version: str = V, flavour: str = "open",
             switches: int = 0) -> FakeNode:
    node = FakeNode(kernel=K, tools=set(TOOLS), modules={"nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm"},
                    nvidia_version=version, nvidia_flavour=flavour)
    buses = [f"0000:{0x18 + 0x10 * i:02x}:00.0" for i in range(count)]
    for bus in buses:
        node.add_gpu(device, bus)
    for i in range(switches):
        node.add_gpu(0x22A3, f"0000:{0x83 + i:02x}:00.0", pci_class=0x068000)
    node.put("/etc/modprobe.d/blacklist-nouveau.conf", "blacklist nouveau\noptions nouveau modeset=0\n")
    node.put(node.initramfs_path, "initramfs")  # built after the blacklist
    node.put(c.DOCKER_CONFIG, c.dump_daemon_json(c.configure_docker({}, False)))
    for path, text in c.predict_containerd(None, set_as_default=False, ctk=(1, 20, 0)).items():
        node.put(path, text)
    lib = "/usr/lib/x86_64-linux-gnu"
    licence = "Dual MIT/GPL" if flavour == "open" else "NVIDIA"
    set_output(node, "driver_userspace", f"lib {lib}/libnvidia-ml.so.1\nlib {lib}/libnvidia-ml.so.{version}\n"
                                         f"installer nvidia-installer:  version {version}\n")
    set_output(node, "driver_module", f"filename:       /lib/modules/{K}/updates/dkms/nvidia.ko\n"
                                      f"version:        {version}\nlicense:        {licence}\n")
    set_output(node, "driver_smi", f"{version}\n")
    set_output(node, "driver_packages", "")
    set_output(node, "kernel_headers", f"build /lib/modules/{K}/build\n")
    set_output(node, "nvidia_ctk_version", "NVIDIA Container Toolkit CLI version 1.20.0\ncommit: fake\n")
    set_output(node, "containerd_version", "containerd containerd.io 1.7.12 71909c1\n")
    found = {p: "1.20.0-1" for p in TOOLKIT}
    states = {"docker.service": ("active", "enabled"), "containerd.service": ("active", "enabled")}
    held: tuple[str, ...] = ()
    if switches:
        found["nvidia-fabricmanager"] = f"{version}-1"
        held = ("nvidia-fabricmanager",)
        states["nvidia-fabricmanager.service"] = ("active", "enabled")
        set_output(node, "nvswitch_devices", "".join(f"0000:{0x83 + i:02x}:00.0\n" for i in range(switches)))
        set_output(node, "fabric_state", "".join(
            f"GPU 0000{b.upper()}\n    Fabric\n        State : Completed\n        Status : Success\n"
            "        ClusterUUID : 00000000-0000-0000-0000-000000000000\n" for b in buses))
    packages(node, found, held)
    units(node, states)
    name = {T4: "Tesla T4", H100: "NVIDIA H100 80GB HBM3"}.get(device, "NVIDIA GPU")
    set_output(node, "doctor_gpus", smi_q(buses, name))
    set_output(node, "doctor_gpu_health", smi_health(buses, version if flavour == "open" else None))
    set_output(node, "doctor_mig", smi_list([name] * count))
    set_output(node, "doctor_upgrades", "")
    set_output(node, "doctor_reboot_flag", "")
    set_output(node, "doctor_kernel_log", "@source dmesg\n[    5.1] nvidia: loading out-of-tree module taints kernel.\n"
                                          f"[    5.2] NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  {version}\n")
    set_output(node, "doctor_kernels", f"kernel {K} headers /lib/modules/{K}/updates/dkms/nvidia.ko\n"
                                       f"dkms nvidia/{version}, {K}, x86_64: installed\n")
    set_output(node, "doctor_dev_char", "".join(f"dev /dev/nvidia{i}\n" for i in range(count)) + "dev /dev/nvidiactl\n"
               + "dev /dev/nvidia-uvm\n" + "".join(f"link 195:{i} ../nvidia{i}\n" for i in range(count))
               + "link 195:255 ../nvidiactl\nlink 510:0 ../nvidia-uvm\n")
    set_output(node, "doctor_units", "nvidia-persistenced.service\tactive\tenabled\n")
    set_output(node, "doctor_auto_upgrade", "")
    set_output(node, "doctor_engines", "docker Docker version 24.0.7, build afdd53b\n")
    set_output(node, "doctor_cdi", "")
    set_output(node, "doctor_date", DATE + "\n")
    set_output(node, "virt", virt_output(buses))
    return node


def fresh(device: int = T4) -> FakeNode:
    """A cloud VM as delivered: nouveau loaded, docker and containerd, nothing NVIDIA."""
    node = FakeNode(kernel=K, tools={"modprobe", "systemctl", "sudo", "update-initramfs", "mokutil", "docker", "dockerd",
                                     "containerd", "ctr", "apt-get", "dpkg", "curl", "gpg"}, modules={"nouveau"})
    node.add_gpu(device, "0000:00:1e.0")
    node.put(node.initramfs_path, "initramfs")
    set_output(node, "kernel_headers", f"build /lib/modules/{K}/build\n")
    set_output(node, "containerd_version", "containerd containerd.io 1.7.12 71909c1\n")
    packages(node, {})
    units(node, {"docker.service": ("active", "enabled"), "containerd.service": ("active", "enabled")})
    set_output(node, "doctor_kernel_log", "@source dmesg\n[    3.0] nouveau 0000:00:1e.0: NVIDIA TU104 (164000a1)\n")
    set_output(node, "doctor_kernels", f"kernel {K} headers -\n")
    set_output(node, "doctor_engines", "docker Docker version 24.0.7, build afdd53b\n")
    set_output(node, "doctor_date", DATE + "\n")
    return node


def check_results(node: FakeNode) -> dict[str, object]:
    return {r.id: r for r in run_checks(gather(FakeConnection(node), FULL))}


def statuses(node: FakeNode) -> dict[str, str]:
    return {i: r.status for i, r in check_results(node).items()}  # type: ignore[attr-defined]
