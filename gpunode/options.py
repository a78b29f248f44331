"""What the user asked for, as one immutable value every step's plan reads."""

from __future__ import annotations

from dataclasses import dataclass

from gpunode.artifacts import ProgressBars


@dataclass(frozen=True)
class Options:
    driver: str | None = None  # requested driver version, e.g. 535.129.03
    reboot: bool = False  # may gpunode reboot the node when a step needs it
    reboot_timeout: float = 900.0
    max_reboots: int = 2
    # displays for downloads/uploads, set by the CLI (gpunode/cli/progress.py); None: silent (fleet runs, tests)
    progress: ProgressBars | None = None
    cuda: str | None = None  # CUDA version the node must run, e.g. 12.4 (checked by the compat step)
    image: str | None = None  # container image the node must run, e.g. nvidia/cuda:12.4.1-base-ubuntu22.04
    # the driver step (gpunode/artifacts/, gpunode/steps/driver.py)
    driver_run: str | None = None  # --driver-run: a local .run file or its URL (instead of NVIDIA's URL)
    sha256: str | None = None  # --sha256: expected digest of the .run
    kernel_module: str | None = None  # --kernel-module: "open" | "proprietary" (default: chosen per GPU)
    module_signing_key: str | None = None  # path ON THE NODE of the private key that signs the module
    module_signing_cert: str | None = None  # path ON THE NODE of the matching public certificate (DER)
    cache_dir: str | None = None  # local download cache root (--cache-dir, $GPUNODE_CACHE_DIR)
    driver_mirror: str | None = None  # $GPUNODE_DRIVER_MIRROR: replaces https://us.download.nvidia.com
    lock_timeout: float = 600.0  # seconds to wait for apt/dpkg or dnf locks held by another process
    # (path, size) of installers already on this machine (verified cache entries, --driver-run file),
    # listed by the CLI so plans can show the cache state without doing I/O themselves
    local_installers: tuple[tuple[str, int], ...] = ()
    # container toolkit, runtime configuration (gpunode/steps/toolkit.py, gpunode/steps/runtime.py)
    toolkit_version: str | None = None  # --toolkit-version: pins all four toolkit packages, e.g. 1.17.8-1
    toolkit_packages: tuple[str, ...] = ()  # --toolkit-package: local .deb/.rpm files to install (offline)
    set_as_default: bool = False  # --set-as-default: nvidia becomes the engines' default runtime
    k8s: bool = False  # --k8s: Kubernetes node, nvidia is the default runtime of containerd / CRI-O
    engines: tuple[str, ...] = ()  # --engine: configure only these (docker, containerd, crio); () = all found
    # Kubernetes (gpunode/steps/k8s.py)
    kubeconfig: str | None = None  # --kubeconfig: path ON THE NODE; None: the first of facts.k8s.KUBECONFIGS found
    gpu_replicas: int = 1  # --gpu-replicas: time-slicing, each GPU advertised N times by the device plugin
    mps: bool = False  # --mps: NVIDIA's MPS control daemon as a systemd unit
    mps_thread_percentage: int | None = None  # --mps-thread-percentage: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
    mig_layout: tuple[str, ...] = ()  # --mig-layout: GPU instance profiles per GPU, e.g. ("1g.10gb", "1g.10gb")
    k8s_wait: float = 300.0  # seconds to wait until the node advertises its GPUs
    # image builds (gpunode/bake.py, docs/engines.md): --bake builds the driver for `bake_kernel` (None: the newest
    # installed kernel) without a GPU, loads nothing, and leaves the marker a boot-time install checks
    bake: bool = False
    bake_kernel: str | None = None
    # kernel upgrades and holds (gpunode/steps/driver_kernels.py): True hold, False release, None leave as is
    hold_kernel: bool | None = None  # --hold-kernel / --no-hold-kernel: the kernel metapackages
    hold_driver: bool | None = None  # --hold-driver / --no-hold-driver: the driver's packages (a .run has none)
    # driver upgrades (gpunode/steps/driver.py, gpunode/facts/holders.py)
    stop_gpu_services: bool = False  # --stop-gpu-services: stop the GPU services holding the old driver, start them after
