"""What a simulated node is: distribution, GPUs, engines and the state it boots in.

`PROFILES` holds every distro x GPU combination, named "<distro>-<gpu>", e.g. "ubuntu-22.04-t4",
"rocky-9-a100x8", "ubuntu-24.04-h100x8", "debian-12-nogpu".  Any field can be overridden:
`get_profile("ubuntu-22.04-t4", secure_boot=True, engines=("containerd",))`.

Numbers shown by nvidia-smi (names, memory, power caps, idle readings, bus ids) come from the real captures in
shared/fixtures/real (see data/smi/); where no capture exists (T4, B200) they are marked "no capture" below
and follow the same output format.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

# ----------------------------------------------------------------------------------------------------------
# GPUs


@dataclass(frozen=True)
class GpuModel:
    key: str
    name: str                 # as nvidia-smi prints it
    device_id: int
    pci_class: int
    subsys_vendor: int
    subsys_device: int
    memory_mib: int
    power_cap_w: int
    idle_power_w: tuple[int, ...]   # per GPU index (cycled)
    temp_c: tuple[int, ...]
    perf: str
    fan: str                  # "N/A" on passively cooled boards
    ecc: str                  # "Volatile Uncorr. ECC" column
    mig: str                  # "MIG M." column
    used_mib: int
    compute_cap: str
    vbios: str
    min_driver: int           # oldest driver branch that supports it
    open_only: bool           # Blackwell / Grace Hopper: proprietary module refuses it
    display: bool             # consumer board driving a console: nouveau is busy while loaded
    source: str               # where the shown numbers come from


T4 = GpuModel("t4", "Tesla T4", 0x1EB8, 0x030200, 0x10DE, 0x12A2, 15360, 70, (9,), (32,), "P8", "N/A", "0",
              "N/A", 1, "7.5", "90.04.96.00.02", 418, False, False, "no capture: format of the 550/565 tables")
RTX4090 = GpuModel("rtx4090", "NVIDIA GeForce RTX 4090", 0x2684, 0x030000, 0x10DE, 0x167C, 24564, 450,
                   (20, 20, 27, 20, 29, 31, 26, 19), (28, 27, 26, 27, 26, 26, 26, 25), "P8", "0%", "Off", "N/A",
                   2, "8.9", "95.02.3C.00.8D", 525, False, True, "nvidia-smi-table/geforce-rtx-4090_driver-550.127.05.txt")
A100 = GpuModel("a100", "NVIDIA A100-SXM4-80GB", 0x20B2, 0x030200, 0x10DE, 0x1463, 81920, 500,
                (59, 60, 58, 58), (25, 22, 23, 23), "P0", "N/A", "0", "Disabled", 1, "8.0", "92.00.45.00.03",
                450, False, False, "nvidia-smi-table/a100-sxm4-x4_driver-555.42.02.txt")
H100 = GpuModel("h100", "NVIDIA H100 80GB HBM3", 0x2330, 0x030200, 0x10DE, 0x16C1, 81559, 700,
                (100, 82, 85, 85, 84, 85, 86, 75), (30, 30, 31, 30, 28, 30, 29, 29), "P0", "N/A", "0", "Disabled",
                1, "9.0", "96.00.A5.00.01", 525, False, False,
                "nvidia-smi-table/h100-sxm5-80gb-hbm3-x8_driver-565.57.01.txt")
B200 = GpuModel("b200", "NVIDIA B200", 0x2901, 0x030200, 0x10DE, 0x1999, 183359, 1000, (140,), (33,), "P0",
                "N/A", "0", "Disabled", 1, "10.0", "97.00.4A.00.0C", 570, True, False,
                "no capture: PCI id 10de:2901 is 'GB100 [B200]' in pci.ids; format of the 565 table")


@dataclass(frozen=True)
class NvSwitch:
    device_id: int
    pci_class: int = 0x068000


@dataclass(frozen=True)
class GpuSet:
    key: str
    model: GpuModel | None
    bus_ids: tuple[str, ...] = ()            # sysfs form, lowercase: "0000:18:00.0"
    switch: NvSwitch | None = None
    switch_bus_ids: tuple[str, ...] = ()

    @property
    def count(self) -> int:
        return len(self.bus_ids) if self.model else 0


GPU_SETS: dict[str, GpuSet] = {
    "nogpu": GpuSet("nogpu", None),
    # AWS g4dn: the T4 sits at 00:1e.0
    "t4": GpuSet("t4", T4, ("0000:00:1e.0",)),
    "rtx4090": GpuSet("rtx4090", RTX4090, ("0000:01:00.0",)),
    # Azure ND A100 v4 layout (lspci/azure-nd-a100-v4_8x-a100-sxm4-80gb_6x-nvswitch_lspci-nn.txt)
    "a100x8": GpuSet("a100x8", A100,
                     ("0001:00:00.0", "0002:00:00.0", "0003:00:00.0", "0004:00:00.0",
                      "000b:00:00.0", "000c:00:00.0", "000d:00:00.0", "000e:00:00.0"),
                     NvSwitch(0x1AF1),
                     ("0005:00:00.0", "0006:00:00.0", "0007:00:00.0", "0008:00:00.0", "0009:00:00.0",
                      "000a:00:00.0")),
    # HGX H100: GPU bus ids from the 565.57.01 capture, NVSwitch 22a3 bridges from the HGX lspci -vvv
    "h100x8": GpuSet("h100x8", H100,
                     ("0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0",
                      "0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0", "0000:db:00.0"),
                     NvSwitch(0x22A3), ("0000:83:00.0", "0000:84:00.0", "0000:85:00.0", "0000:86:00.0")),
    # HGX B200: NVLink-5 switches are not PCI bridges on the host (managed through CX7/NVLSM): none listed
    "b200x8": GpuSet("b200x8", B200,
                     ("0000:1b:00.0", "0000:43:00.0", "0000:52:00.0", "0000:61:00.0",
                      "0000:9d:00.0", "0000:c3:00.0", "0000:d1:00.0", "0000:df:00.0")),
}

# Non-NVIDIA devices present on every node, so that scanners must filter by vendor/class.
OTHER_PCI = (
    ("0000:00:00.0", 0x8086, 0x1237, 0x060000, 0x1AF4, 0x1100),   # host bridge
    ("0000:00:02.0", 0x1234, 0x1111, 0x030000, 0x1AF4, 0x1100),   # emulated VGA (BMC / QEMU std vga)
    ("0000:00:03.0", 0x1AF4, 0x1000, 0x020000, 0x1AF4, 0x0001),   # virtio-net
    ("0000:00:04.0", 0x15B3, 0x101E, 0x020700, 0x15B3, 0x0061),   # ConnectX VF (InfiniBand)
)

# ----------------------------------------------------------------------------------------------------------
# distributions


@dataclass(frozen=True)
class Distro:
    key: str
    os_release: str           # file in data/os-release/
    family: str               # "debian" | "rhel" | "suse"
    pkg: str                  # "apt" | "dnf"
    initramfs: str            # "update-initramfs" | "dracut"
    kernel: str
    gcc: str                  # as in /proc/driver/nvidia/version "GCC version:" line
    libdir: str
    cuda_repo: str            # NVIDIA CUDA repo directory name
    containerd_config_version: int
    containerd_version: str
    docker_version: str
    hostname_prefix: str


DISTROS: dict[str, Distro] = {
    "ubuntu-22.04": Distro("ubuntu-22.04", "ubuntu-22.04", "debian", "apt", "update-initramfs",
                           "5.15.0-91-generic", "gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)",
                           "/usr/lib/x86_64-linux-gnu", "ubuntu2204", 2, "1.7.12", "24.0.7", "jammy"),
    "ubuntu-24.04": Distro("ubuntu-24.04", "ubuntu-24.04", "debian", "apt", "update-initramfs",
                           "6.8.0-45-generic", "gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04)",
                           "/usr/lib/x86_64-linux-gnu", "ubuntu2404", 3, "2.0.2", "27.3.1", "noble"),
    "debian-12": Distro("debian-12", "debian-12", "debian", "apt", "update-initramfs",
                        "6.1.0-18-amd64", "gcc version 12.2.0 (Debian 12.2.0-14)",
                        "/usr/lib/x86_64-linux-gnu", "debian12", 2, "1.6.20", "20.10.24", "bookworm"),
    "rocky-9": Distro("rocky-9", "rocky-9", "rhel", "dnf", "dracut",
                      "5.14.0-362.8.1.el9_3.x86_64", "gcc version 11.4.1 20230605 (Red Hat 11.4.1-2) (GCC)",
                      "/usr/lib64", "rhel9", 2, "1.7.22", "27.3.1", "rocky"),
    # SLES 15 SP6: zypper/rpm, dracut, the SP6 kernel 6.4.0-150600.23.25-default (SUSE names a kernel's packages
    # by its flavour: kernel-default, kernel-default-devel), NVIDIA's repository directory sles15
    "sles-15": Distro("sles-15", "sles-15", "suse", "zypper", "dracut",
                      "6.4.0-150600.23.25-default", "gcc version 7.5.0 (SUSE Linux)",
                      "/usr/lib64", "sles15", 2, "1.7.21", "24.0.7", "sles"),
}

# ----------------------------------------------------------------------------------------------------------
# profile


@dataclass(frozen=True)
class Profile:
    distro: str
    gpu: str = "nogpu"
    engines: tuple[str, ...] = ("docker",)      # any of "docker", "containerd"
    efi: bool = True
    secure_boot: bool = False
    kernel_headers: bool = True
    nouveau_loaded: bool | None = None          # None: decided like a real boot
    nouveau_busy: bool | None = None            # None: busy on consumer boards (console on the GPU)
    preinstalled_driver: str | None = None      # e.g. "535.129.03": installed (.run) and loaded
    driver_flavor: str | None = None            # "open" | "proprietary"; None: installer default
    toolkit_version: str | None = None          # e.g. "1.17.8-1": nvidia-container-toolkit preinstalled
    mokutil: bool = True
    kernel: str | None = None
    cmdline: str | None = None
    hostname: str | None = None
    apt_locked: bool = False
    containerd_config_version: int | None = None
    reboot_downtime: float = 0.0                # >0: sshd stops accepting for that long on reboot
    # `docker run --gpus` works only once daemon.json has an nvidia runtime (strict, the default), or - like
    # moby really does - as soon as nvidia-container-runtime-hook was on PATH when dockerd started (False).
    docker_gpus_need_runtime: bool = True
    tcp_forwarding: bool = False  # a jump host (ProxyJump) needs sshd to forward TCP to 127.0.0.1
    extra_packages: tuple[str, ...] = ()        # catalog names installed at creation
    cuda_repo: bool = False                     # NVIDIA's CUDA repository configured at creation (RHEL family, SUSE)
    # a one-node Kubernetes cluster (node_files/py/kube.py): "kubelet" (kubeadm-style, on the system's
    # containerd: pass engines=("containerd",)) or "k3s" (its own containerd, config from its template)
    kubernetes: str | None = None
    served_urls: tuple[tuple[str, str], ...] = field(default_factory=tuple)  # (url, host file) pairs

    @property
    def name(self) -> str:
        return f"{self.distro}-{self.gpu}"

    @property
    def d(self) -> Distro:
        return DISTROS[self.distro]

    @property
    def gpus(self) -> GpuSet:
        return GPU_SETS[self.gpu]

    @property
    def running_kernel(self) -> str:
        return self.kernel or self.d.kernel

    @property
    def cc_version(self) -> int:
        return self.containerd_config_version or self.d.containerd_config_version

    @property
    def is_nouveau_busy(self) -> bool:
        if self.nouveau_busy is not None:
            return self.nouveau_busy
        return bool(self.gpus.model and self.gpus.model.display)

    def with_overrides(self, **overrides) -> Profile:
        unknown = set(overrides) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise TypeError(f"unknown profile option(s): {', '.join(sorted(unknown))}")
        p = dataclasses.replace(self, **overrides)
        p.validate()
        return p

    def validate(self) -> None:
        if self.distro not in DISTROS:
            raise ValueError(f"unknown distro {self.distro!r}; known: {', '.join(DISTROS)}")
        if self.cuda_repo and DISTROS[self.distro].family == "debian":
            raise ValueError("cuda_repo: the Debian family's repository comes from the cuda-keyring package "
                             "(install it with extra_packages=('cuda-keyring',))")
        if self.gpu not in GPU_SETS:
            raise ValueError(f"unknown gpu set {self.gpu!r}; known: {', '.join(GPU_SETS)}")
        if self.kubernetes not in (None, "kubelet", "k3s"):
            raise ValueError(f"kubernetes={self.kubernetes!r}: use None, 'kubelet' or 'k3s'")
        for e in self.engines:
            if e not in ("docker", "containerd"):
                raise ValueError(f"unknown engine {e!r}")
        if self.secure_boot and not self.efi:
            raise ValueError("secure_boot needs efi=True")
        if self.driver_flavor not in (None, "open", "proprietary"):
            raise ValueError("driver_flavor must be 'open' or 'proprietary'")


PROFILES: dict[str, Profile] = {
    f"{d}-{g}": Profile(distro=d, gpu=g) for d in DISTROS for g in GPU_SETS
}


def get_profile(name: str, **overrides) -> Profile:
    """A named profile ("ubuntu-22.04-t4") or a bare distro ("rocky-9", then pass gpu=...), with overrides."""
    if name in PROFILES:
        base = PROFILES[name]
    elif name in DISTROS:
        base = Profile(distro=name)
    else:
        raise KeyError(f"unknown profile {name!r}; known: {', '.join(sorted(PROFILES))}")
    return base.with_overrides(**overrides)


# ----------------------------------------------------------------------------------------------------------
# driver branch facts used by the shims


CUDA_BY_BRANCH = (  # driver branch -> highest CUDA version it supports (CUDA toolkit release notes, Table 3)
    (418, "10.1"), (440, "10.2"), (450, "11.0"), (455, "11.1"), (460, "11.2"), (465, "11.3"), (470, "11.4"),
    (495, "11.5"), (510, "11.6"), (515, "11.7"), (520, "11.8"), (525, "12.0"), (530, "12.1"), (535, "12.2"),
    (545, "12.3"), (550, "12.4"), (555, "12.5"), (560, "12.6"), (565, "12.7"), (570, "12.8"), (575, "12.9"),
    (580, "13.0"), (590, "13.1"), (595, "13.2"),
)


def cuda_for_driver(version: str) -> str:
    branch = int(version.split(".")[0])
    best = CUDA_BY_BRANCH[0][1]
    for b, cuda in CUDA_BY_BRANCH:
        if branch >= b:
            best = cuda
    return best


def default_flavor(version: str) -> str:
    """nvidia-installer's default kernel module type: open from 560 on."""
    return "open" if int(version.split(".")[0]) >= 560 else "proprietary"
