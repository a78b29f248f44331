"""The package catalog a simulated node's package manager can see, per distribution.

Each entry: name, version, repo, deps, effects, arch, summary.  `repo` is "base" (the distribution's own
repositories, always configured) or one of REPOS, configured only once a sources/.repo file names its marker
(and, for apt, after `apt-get update`; a `signed-by=` keyring must exist).  `deps` is a comma list of
"name" or "name=exact-version".  `effects` (";"-separated) are applied by node_files/lib/pkg.sh:
    tool:/usr/bin/x:shim          symlink to a simulator shim
    file:/etc/x:datafile          copy of /var/lib/nodesim/pkgdata/datafile (not overwritten if present)
    unit:name.service:desc:enable systemd unit (enable = enabled and started on install, Debian style)
    headers:KVER                  /lib/modules/KVER/build (then DKMS's header_postinst hook builds for KVER)
    kernel:KVER                   a kernel image: modules tree, /boot/vmlinuz-KVER, the boot default becomes the
                                  newest kernel, DKMS's kernel postinst hook builds for KVER if its headers exist
    driver:VER:FLAVOR:SIGN        NVIDIA driver (SIGN: dkms = built+signed by DKMS, distro = prebuilt signed)
    fm:VER                        nvidia-fabricmanager of that version
    glx                           Debian's glx alternative: links /etc/modprobe.d/nvidia.conf to the renamed
                                  modules' configuration (/etc/nvidia/nvidia-modprobe.conf)
Versions are realistic strings for each distribution; they are not a copy of any real repository index.
"""

from __future__ import annotations

from dataclasses import dataclass

from tests.nodesim.profiles import Distro, Profile

REPOS = {  # repo id -> text whose presence in a sources file means the repo is configured
    "cuda": "developer.download.nvidia.com/compute/cuda/repos",
    "nvidia-container-toolkit": "nvidia.github.io/libnvidia-container",
    "docker": "download.docker.com/linux",
    "epel": "epel",
    # Debian's non-free component (the driver packages): a sources line naming it, as the default image's does
    "debian-non-free": "contrib non-free",
}

TOOLKIT_VERSIONS = ("1.17.8-1", "1.18.0-1", "1.20.0-1")
# (branch, full driver version in the CUDA repos)
CUDA_REPO_DRIVERS = (("535", "535.274.02"), ("550", "550.163.01"), ("560", "560.35.03"), ("565", "565.57.01"),
                     ("570", "570.195.03"), ("575", "575.57.08"), ("580", "580.95.05"), ("590", "590.48.01"))
# (branch, version in Ubuntu's own archive)
UBUNTU_DRIVERS = (("535", "535.230.02"), ("550", "550.144.03"), ("570", "570.133.20"))
# older releases of a branch the archive still lists (an upgrade within the branch; no precompiled modules: the
# archive builds linux-modules-nvidia for a branch's current release)
UBUNTU_OLDER = (("535", "535.183.06"),)
# Debian 12's non-free: bookworm (535.261.03-1) and bookworm-security (535.309.01-0+deb12u1), the
# compute set of the real-OS tier's nvidia VM (tests/realos/test_debian12_packages.py); nvidia-persistenced and nvidia-modprobe
# are separate source packages with versions of their own
DEBIAN_DRIVERS = (("535.261.03", "535.261.03-1"), ("535.309.01", "535.309.01-0+deb12u1"))


@dataclass(frozen=True)
class Entry:
    name: str
    version: str
    repo: str = "base"
    deps: str = "-"
    effects: str = "-"
    arch: str = "amd64"
    summary: str = ""

    def line(self) -> str:
        return "\t".join((self.name, self.version, self.repo, self.deps or "-", self.effects or "-", self.arch,
                          self.summary or self.name))


def _containerd_effects(docker_bundled: bool) -> str:
    """Docker's containerd.io ships a config.toml (CRI disabled); distribution packages ship none."""
    cfg = "file:/etc/containerd/config.toml:containerd-docker.toml;" if docker_bundled else ""
    # crictl stands for cri-tools, which Kubernetes nodes carry next to containerd: it asks the running daemon
    return (f"tool:/usr/bin/containerd:engine;tool:/usr/bin/ctr:engine;tool:/usr/bin/crictl:engine;{cfg}"
            "unit:containerd.service:containerd container runtime:enable")


DOCKER_EFFECTS = "tool:/usr/bin/docker:engine;unit:docker.service:Docker Application Container Engine:enable"


# the commands the gcc and make packages install (shims/toolchain)
TOOLCHAIN = {"gcc": "tool:/usr/bin/gcc:toolchain", "make": "tool:/usr/bin/make:toolchain"}


def debian_catalog(p: Profile) -> list[Entry]:
    d: Distro = p.d
    k = p.running_kernel
    ubuntu = d.key.startswith("ubuntu")
    suffix = {"ubuntu-22.04": "22.04", "ubuntu-24.04": "24.04"}.get(d.key, "")
    a = "amd64"
    e: list[Entry] = []
    base = [
        ("base-files", "12ubuntu4.6" if ubuntu else "12.4+deb12u5"), ("coreutils", "8.32-4.1ubuntu1.2"),
        ("dpkg", "1.21.1ubuntu2.3"), ("apt", "2.4.13"), ("libc6", "2.35-0ubuntu3.8"), ("kmod", "29-1ubuntu1"),
        ("systemd", "249.11-0ubuntu3.12"), ("openssh-server", "1:8.9p1-3ubuntu0.10"),
        ("ca-certificates", "20240203~22.04.1"), ("curl", "7.81.0-1ubuntu1.18"), ("gnupg", "2.2.27-3ubuntu2.1"),
        ("wget", "1.21.2-2ubuntu1.1"), ("initramfs-tools", "0.140ubuntu13.4"), ("gcc", "4:11.2.0-1ubuntu1"),
        ("make", "4.3-4.1build1"), ("build-essential", "12.9ubuntu3"),
    ]
    for name, ver in base:
        e.append(Entry(name, ver, effects=TOOLCHAIN.get(name, ""), arch=a))
    e.append(Entry("pciutils", "1:3.7.0-6", effects="tool:/usr/bin/lspci:lspci", arch=a))
    e.append(Entry("mokutil", "0.6.0-2~22.04.1", effects="tool:/usr/bin/mokutil:mokutil", arch=a))
    e.append(Entry(f"linux-image-{k}", k.rsplit("-", 1)[0] + ".1", arch=a, summary="Linux kernel image"))
    e.append(Entry(f"linux-headers-{k}", k.rsplit("-", 1)[0] + ".1", effects=f"headers:{k}", arch=a,
                   summary="Linux kernel headers"))
    meta = "linux-headers-generic" if ubuntu else "linux-headers-amd64"
    e.append(Entry(meta, k.rsplit("-", 1)[0] + ".1", deps=f"linux-headers-{k}", arch=a))
    e.append(Entry("dkms", "2.8.7-2ubuntu2.2" if ubuntu else "3.0.10-8+deb12u1", deps="gcc,make",
                   effects="tool:/usr/sbin/dkms:dkms", arch="all"))
    e.append(Entry("docker.io", {"ubuntu-22.04": "24.0.7-0ubuntu2~22.04.1", "ubuntu-24.04": "26.1.3-0ubuntu1~24.04.1"}
                   .get(d.key, "20.10.24+dfsg1-1+b3"), deps="containerd", effects=DOCKER_EFFECTS, arch=a))
    e.append(Entry("containerd", f"{d.containerd_version}-0ubuntu1" if ubuntu else f"{d.containerd_version}~ds1-1",
                   effects=_containerd_effects(False), arch=a))
    if ubuntu:
        e.append(Entry("ubuntu-drivers-common", "1:0.9.6.2~0.22.04.8", arch=a))
        for br, ver in UBUNTU_DRIVERS:
            dv = f"{ver}-0ubuntu0.{suffix}.1"
            for flavor, tag in (("proprietary", ""), ("open", "-open")):
                e.append(Entry(f"nvidia-dkms-{br}-server{tag}", dv, deps="dkms",
                               effects=f"driver:{ver}:{flavor}:dkms", arch=a, summary="NVIDIA DKMS package"))
                e.append(Entry(f"nvidia-driver-{br}-server{tag}", dv, deps=f"nvidia-dkms-{br}-server{tag}={dv}", arch=a,
                               summary="NVIDIA Server Driver metapackage"))
                e.append(Entry(f"nvidia-headless-{br}-server{tag}", dv, deps=f"nvidia-dkms-{br}-server{tag}={dv}",
                               arch=a))
            e.append(Entry(f"nvidia-utils-{br}-server", dv, arch=a, summary="NVIDIA Server Driver support binaries"))
            for flavor, tag in (("proprietary", ""), ("open", "-open")):
                e.append(Entry(f"nvidia-headless-no-dkms-{br}-server{tag}", dv, arch=a,
                               summary="NVIDIA headless metapackage - no DKMS"))
                e.append(Entry(f"linux-modules-nvidia-{br}-server{tag}-{k}", k.rsplit("-", 1)[0] + ".1",
                               deps=f"nvidia-headless-no-dkms-{br}-server{tag}={dv}",
                               effects=f"driver:{ver}:{flavor}:distro", arch=a,
                               summary="Linux kernel nvidia modules (signed)"))
            e.append(Entry(f"linux-modules-nvidia-{br}-server-generic", k.rsplit("-", 1)[0] + ".1",
                           deps=f"linux-modules-nvidia-{br}-server-{k}", arch=a))
            e.append(Entry(f"nvidia-fabricmanager-{br}", f"{ver}-0ubuntu0.{suffix}.1", effects=f"fm:{ver}", arch=a))
        for br, ver in UBUNTU_OLDER:
            dv = f"{ver}-0ubuntu0.{suffix}.1"
            e.append(Entry(f"nvidia-utils-{br}-server", dv, arch=a))
            for flavor, tag in (("proprietary", ""), ("open", "-open")):
                e.append(Entry(f"nvidia-dkms-{br}-server{tag}", dv, deps="dkms", effects=f"driver:{ver}:{flavor}:dkms",
                               arch=a, summary="NVIDIA DKMS package"))
                e.append(Entry(f"nvidia-headless-{br}-server{tag}", dv, deps=f"nvidia-dkms-{br}-server{tag}={dv}",
                               arch=a))
                e.append(Entry(f"nvidia-headless-no-dkms-{br}-server{tag}", dv, arch=a))
    else:
        for ver, dv in DEBIAN_DRIVERS:
            nf = "debian-non-free"
            e.append(Entry("nvidia-kernel-dkms", dv, nf, deps="dkms", effects=f"driver:{ver}:proprietary:dkms", arch=a))
            # libcuda1 (like the GL libraries nvidia-driver brings) registers the glx alternative, whose slaves link
            # /etc/modprobe.d/nvidia.conf: without it `modprobe nvidia` finds no module (real-OS tier)
            e.append(Entry("nvidia-driver", dv, nf, deps=f"nvidia-kernel-dkms={dv},libcuda1={dv}", arch=a))
            e.append(Entry("nvidia-open-kernel-dkms", dv, nf, deps="dkms", effects=f"driver:{ver}:open:dkms", arch=a))
            e.append(Entry("nvidia-smi", dv, nf, deps=f"libnvidia-ml1={dv}", arch=a,
                           summary="NVIDIA System Management Interface"))
            e.append(Entry("libnvidia-ml1", dv, nf, arch=a, summary="NVIDIA Management Library (NVML) runtime library"))
            e.append(Entry("libcuda1", dv, nf, effects="glx", arch=a, summary="NVIDIA CUDA Driver Library"))
            e.append(Entry("firmware-nvidia-gsp", dv, nf, arch=a, summary="NVIDIA GSP firmware"))
        e.append(Entry("nvidia-persistenced", "535.171.04-1~deb12u1", "debian-non-free", arch=a,
                       summary="daemon to maintain persistent software state in the NVIDIA driver"))
        e.append(Entry("nvidia-modprobe", "535.171.04-1~deb12u1", "debian-non-free", arch=a,
                       summary="utility to load NVIDIA kernel modules and create device nodes"))
    # NVIDIA CUDA repository
    e.append(Entry("cuda-keyring", "1.1-1", repo="cuda", arch="all",
                   effects=f"file:/etc/apt/sources.list.d/cuda-{d.cuda_repo}-x86_64.list:cuda-list;"
                           "file:/usr/share/keyrings/cuda-archive-keyring.gpg:cuda-keyring-gpg"))
    for br, ver in CUDA_REPO_DRIVERS:
        e.append(Entry(f"nvidia-driver-{br}", f"{ver}-0ubuntu1", repo="cuda", deps="dkms",
                       effects=f"driver:{ver}:proprietary:dkms", arch=a))
        e.append(Entry(f"nvidia-driver-{br}-open", f"{ver}-0ubuntu1", repo="cuda", deps="dkms",
                       effects=f"driver:{ver}:open:dkms", arch=a))
        e.append(Entry(f"cuda-drivers-{br}", f"{ver}-1", repo="cuda", deps=f"nvidia-driver-{br}={ver}-0ubuntu1", arch=a))
        fm_name = "nvidia-fabricmanager" if int(br) >= 580 else f"nvidia-fabricmanager-{br}"
        e.append(Entry(fm_name, f"{ver}-1", repo="cuda", effects=f"fm:{ver}", arch=a))
    latest_br, latest = CUDA_REPO_DRIVERS[-1]
    e.append(Entry("cuda-drivers", f"{latest}-1", repo="cuda", deps=f"nvidia-driver-{latest_br}={latest}-0ubuntu1", arch=a))
    e.append(Entry("nvidia-open", f"{latest}-1", repo="cuda", deps=f"nvidia-driver-{latest_br}-open={latest}-0ubuntu1", arch=a))
    e.append(Entry("datacenter-gpu-manager", "1:3.3.9", repo="cuda", arch=a,
                   effects="tool:/usr/bin/dcgmi:nvidia-tool;unit:nvidia-dcgm.service:NVIDIA DCGM service:enable"))
    # NVIDIA Container Toolkit repository
    for v in TOOLKIT_VERSIONS:
        e += _toolkit(v, a)
    # Docker's repository
    ubuntu_tag = f"~ubuntu.{suffix}~{d.hostname_prefix}" if ubuntu else f"~debian.12~{d.hostname_prefix}"
    e.append(Entry("docker-ce", f"5:27.3.1-1{ubuntu_tag}", repo="docker", deps="docker-ce-cli,containerd.io",
                   effects=DOCKER_EFFECTS, arch=a))
    e.append(Entry("docker-ce-cli", f"5:27.3.1-1{ubuntu_tag}", repo="docker", arch=a))
    e.append(Entry("containerd.io", "1.7.22-1", repo="docker", effects=_containerd_effects(True), arch=a))
    e.append(Entry("docker-buildx-plugin", "0.17.1-1" + ubuntu_tag, repo="docker", arch=a))
    e.append(Entry("docker-compose-plugin", "2.29.7-1" + ubuntu_tag, repo="docker", arch=a))
    return e


def _toolkit(v: str, arch: str) -> list[Entry]:
    return [
        Entry("nvidia-container-toolkit", v, repo="nvidia-container-toolkit", arch=arch,
              deps=f"nvidia-container-toolkit-base={v},libnvidia-container-tools={v}",
              effects="tool:/usr/bin/nvidia-container-runtime-hook:nvidia-tool", summary="NVIDIA Container toolkit"),
        Entry("nvidia-container-toolkit-base", v, repo="nvidia-container-toolkit", arch=arch,
              effects="tool:/usr/bin/nvidia-ctk:nvidia-ctk;tool:/usr/bin/nvidia-container-runtime:nvidia-tool;"
                      "tool:/usr/bin/nvidia-cdi-hook:nvidia-tool;"
                      "file:/etc/nvidia-container-runtime/config.toml:nvidia-container-runtime-config.toml"),
        Entry("libnvidia-container-tools", v, repo="nvidia-container-toolkit", arch=arch,
              deps=f"libnvidia-container1={v}", effects="tool:/usr/bin/nvidia-container-cli:nvidia-tool"),
        Entry("libnvidia-container1", v, repo="nvidia-container-toolkit", arch=arch),
    ]


def rhel_catalog(p: Profile) -> list[Entry]:
    k = p.running_kernel
    kv = k.rsplit(".", 1)[0]  # without .x86_64
    a = "x86_64"
    e: list[Entry] = []
    for name, ver in (("kernel", kv), ("kernel-core", kv), ("kernel-modules", kv), ("systemd", "252-18.el9"),
                      ("kmod", "28-9.el9"), ("dracut", "057-44.git20230822.el9"), ("openssh-server", "8.7p1-34.el9"),
                      ("curl", "7.76.1-26.el9_3.2"), ("wget", "1.21.1-7.el9"), ("dnf", "4.14.0-8.el9"),
                      ("dnf-plugins-core", "4.3.0-11.el9"), ("gcc", "11.4.1-2.1.el9"), ("make", "4.3-7.el9"),
                      ("elfutils-libelf-devel", "0.189-3.el9"), ("kernel-headers", kv), ("podman", "4.6.1-5.el9")):
        e.append(Entry(name, ver, effects=TOOLCHAIN.get(name, ""), arch=a))
    e.append(Entry("kernel-devel", kv, effects=f"headers:{k}", arch=a, summary="Development package for building kernel modules"))
    e.append(Entry("pciutils", "3.7.0-5.el9", effects="tool:/usr/bin/lspci:lspci", arch=a))
    e.append(Entry("mokutil", "0.6.0-4.el9", effects="tool:/usr/bin/mokutil:mokutil", arch=a))
    e.append(Entry("python3-dnf-plugin-versionlock", "4.3.0-11.el9", arch="noarch"))
    e.append(Entry("epel-release", "9-7.el9", arch="noarch", effects="file:/etc/yum.repos.d/epel.repo:epel-repo"))
    e.append(Entry("containerd", "1.7.22-3.1.el9", repo="docker", effects=_containerd_effects(False), arch=a))
    e.append(Entry("dkms", "3.0.13-1.el9", repo="epel", deps="gcc,make,kernel-devel", effects="tool:/usr/sbin/dkms:dkms",
                   arch="noarch"))
    for br, ver in CUDA_REPO_DRIVERS:
        rel = f"{ver}-1.el9"
        e.append(Entry("nvidia-driver", rel, repo="cuda", deps=f"kmod-nvidia-latest-dkms={rel}", arch=a))
        e.append(Entry("kmod-nvidia-latest-dkms", rel, repo="cuda", deps="dkms", effects=f"driver:{ver}:proprietary:dkms", arch=a))
        e.append(Entry("kmod-nvidia-open-dkms", rel, repo="cuda", deps="dkms", effects=f"driver:{ver}:open:dkms", arch=a))
        e.append(Entry(f"cuda-drivers-{br}", f"{ver}-1", repo="cuda", deps=f"nvidia-driver={rel}", arch=a))
        fm_name = "nvidia-fabricmanager" if int(br) >= 580 else "nvidia-fabric-manager"
        e.append(Entry(fm_name, f"{ver}-1", repo="cuda", effects=f"fm:{ver}", arch=a))
    latest = CUDA_REPO_DRIVERS[-1][1]
    e.append(Entry("cuda-drivers", f"{latest}-1", repo="cuda", deps=f"nvidia-driver={latest}-1.el9", arch=a))
    e.append(Entry("nvidia-open", f"{latest}-1", repo="cuda", deps=f"kmod-nvidia-open-dkms={latest}-1.el9", arch=a))
    e.append(Entry("datacenter-gpu-manager", "3.3.9-1", repo="cuda", arch=a,
                   effects="tool:/usr/bin/dcgmi:nvidia-tool;unit:nvidia-dcgm.service:NVIDIA DCGM service:noenable"))
    for v in TOOLKIT_VERSIONS:
        e += _toolkit(v, a)
    e.append(Entry("docker-ce", "3:27.3.1-1.el9", repo="docker", deps="docker-ce-cli,containerd.io",
                   effects=DOCKER_EFFECTS.replace(":enable", ":noenable"), arch=a))
    e.append(Entry("docker-ce-cli", "1:27.3.1-1.el9", repo="docker", arch=a))
    e.append(Entry("containerd.io", "1.7.22-3.1.el9", repo="docker",
                   effects=_containerd_effects(True).replace(":enable", ":noenable"), arch=a))
    return e


def suse_catalog(p: Profile) -> list[Entry]:
    """SLES 15 SP6: SUSE's modules (base: Basesystem, Development Tools, Containers; dkms from PackageHub) and
    NVIDIA's sles15 repository. NVIDIA's SUSE driver is kernel module packages (KMP) built for a kernel, the
    kernel in their version (`<release>_k6.4.0_150600.23.25-1`), with the compute-only userspace
    nvidia-compute-G06 / nvidia-compute-utils-G06 (data/driver_package_routes.csv cites the names)."""
    k = p.running_kernel
    kv = k.rsplit("-", 1)[0]  # 6.4.0-150600.23.25: the kernel packages' version without the .1 rebuild counter
    a = "x86_64"
    e: list[Entry] = []
    for name, ver in (("kernel-default", f"{kv}.1"), ("systemd", "254.19-150600.4.15.1"), ("kmod", "29-150600.13.3.1"),
                      ("dracut", "059+suse.552.g8f1f3e5c-150600.3.9.1"), ("openssh-server", "9.6p1-150600.6.3.1"),
                      ("curl", "8.6.0-150600.4.9.1"), ("wget", "1.20.3-150600.19.9.1"), ("zypper", "1.14.77-150600.10.20.1"),
                      ("rpm", "4.14.3-150400.59.16.1"), ("gcc", "7-150000.1.3"), ("make", "4.2.1-7.3.2")):
        e.append(Entry(name, ver, arch=a))
    kk = kv.replace("-", "_")
    e.append(Entry("kernel-default-devel", f"{kv}.1", effects=f"headers:{k}", arch=a,
                   summary="Development files necessary for building kernel modules"))
    e.append(Entry("pciutils", "3.5.6-150300.5.3.1", effects="tool:/usr/bin/lspci:lspci", arch=a))
    e.append(Entry("mokutil", "0.6.0-150600.1.2", effects="tool:/usr/bin/mokutil:mokutil", arch=a))
    e.append(Entry("dkms", "3.0.13-bp156.1.1", deps="gcc,make,kernel-default-devel", effects="tool:/usr/sbin/dkms:dkms",
                   arch="noarch"))
    e.append(Entry("docker", "24.0.7_ce-150000.198.2", deps="containerd", effects=DOCKER_EFFECTS.replace(":enable", ":noenable"),
                   arch=a))
    e.append(Entry("containerd", "1.7.21-150000.117.1", effects=_containerd_effects(False).replace(":enable", ":noenable"),
                   arch=a))
    for br, ver in CUDA_REPO_DRIVERS:
        kmp = f"{ver}_k{kk}-1"
        e.append(Entry("nvidia-open-driver-G06-kmp-default", kmp, repo="cuda", effects=f"driver:{ver}:open:distro",
                       arch=a, summary="NVIDIA open kernel module driver for GeForce RTX 2000 series and newer"))
        e.append(Entry("nvidia-driver-G06-kmp-default", kmp, repo="cuda", effects=f"driver:{ver}:proprietary:distro",
                       arch=a, summary="NVIDIA graphics driver kernel module for GeForce 700 series and newer"))
        e.append(Entry("nvidia-compute-G06", f"{ver}-1", repo="cuda", arch=a, summary="NVIDIA driver for computing with GPGPU"))
        e.append(Entry("nvidia-compute-utils-G06", f"{ver}-1", repo="cuda", deps=f"nvidia-compute-G06={ver}-1", arch=a,
                       summary="NVIDIA driver tools for computing with GPGPU"))
        e.append(Entry(f"cuda-drivers-{br}", f"{ver}-1", repo="cuda",
                       deps=f"nvidia-driver-G06-kmp-default={kmp},nvidia-compute-utils-G06={ver}-1", arch=a))
        fm_name = "nvidia-fabricmanager" if int(br) >= 580 else f"nvidia-fabricmanager-{br}"
        e.append(Entry(fm_name, f"{ver}-1", repo="cuda", effects=f"fm:{ver}", arch=a))
    for v in TOOLKIT_VERSIONS:
        e += _toolkit(v, a)
    return e


def catalog(p: Profile) -> list[Entry]:
    if p.d.family == "suse":
        return suse_catalog(p)
    return rhel_catalog(p) if p.d.family == "rhel" else debian_catalog(p)


def preinstalled(p: Profile) -> list[str]:
    """Package names installed on a fresh node of this profile."""
    if p.d.family == "suse":
        names = ["kernel-default", "systemd", "kmod", "dracut", "openssh-server", "curl", "wget", "zypper", "rpm",
                 "pciutils"]
        if p.kernel_headers:
            names.append("kernel-default-devel")
    elif p.d.family == "rhel":
        names = ["kernel", "kernel-core", "kernel-modules", "systemd", "kmod", "dracut", "openssh-server", "curl",
                 "wget", "dnf", "dnf-plugins-core", "pciutils", "kernel-headers"]
        if p.kernel_headers:
            names.append("kernel-devel")
    else:
        names = ["base-files", "coreutils", "dpkg", "apt", "libc6", "kmod", "systemd", "openssh-server",
                 "ca-certificates", "curl", "gnupg", "wget", "initramfs-tools", "pciutils",
                 f"linux-image-{p.running_kernel}"]
        if p.kernel_headers:
            names.append(f"linux-headers-{p.running_kernel}")
    if p.mokutil:
        names.append("mokutil")
    for eng in p.engines:
        if eng == "docker":
            names += {"rhel": ["docker-ce", "docker-ce-cli", "containerd.io"], "suse": ["docker", "containerd"]}.get(
                p.d.family, ["docker.io", "containerd"])
        elif eng == "containerd" and "docker" not in p.engines:
            names.append("containerd")
    return names
