"""What the user asked for, as one immutable value every step's plan reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpunode.record import Frozen

if TYPE_CHECKING:
    from gpunode.artifacts import ProgressBars
    from gpunode.steps.base import Step


@dataclass(frozen=True, eq=False, repr=False)
class Options(Frozen):
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
    # --driver-source: "run" (NVIDIA's .run installer) | "packages" (the distribution's or NVIDIA's repository
    # packages at exactly --driver: gpunode/driver_packages.py, gpunode/steps/driver_packages.py)
    driver_source: str = "run"
    sha256: str | None = None  # --sha256: expected digest of the .run
    kernel_module: str | None = None  # --kernel-module: "open" | "proprietary" (default: chosen per GPU)
    module_signing_key: str | None = None  # path ON THE NODE of the private key that signs the module
    module_signing_cert: str | None = None  # path ON THE NODE of the matching public certificate (DER)
    cache_dir: str | None = None  # local download cache root (--cache-dir, $GPUNODE_CACHE_DIR)
    driver_mirror: str | None = None  # $GPUNODE_DRIVER_MIRROR: replaces https://us.download.nvidia.com
    lock_timeout: float = 600.0  # seconds to wait for apt/dpkg, dnf or the node's gpunode lock
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


@dataclass(frozen=True, eq=False, repr=False)
class Request(Frozen):
    """What plan / install were asked to do: the steps, in pipeline order, and the options they read. Made by
    the checks (gpunode/option_checks.py) for every front door: the CLI (gpunode/cli/_inputs.py) and the library
    (gpunode/api.py, which always turns reboot off)."""

    steps: tuple[Step, ...]
    options: Options


# --- the option table ---------------------------------------------------------------------------------------------
# Every option a user gives the pipeline, declared once. The CLI's parameters (gpunode/cli/_params.py), the library's
# accepted names and defaults (gpunode/api.py), its checks (gpunode/option_checks.py) and the Ansible module's
# argument_spec (gpunode/ansible_spec.py, written into the collection's module_utils/specs.py) are made from it.
# A test adds a row at test time and finds it in all three front doors (tests/test_options.py).

CLI, API, ANSIBLE = "cli", "api", "ansible"
STEPS = "<steps>"  # `choices`: the pipeline's step names (gpunode/steps/__init__.py), resolved where they are needed


@dataclass(frozen=True, eq=False, repr=False)
class OptionSpec(Frozen):
    """One option. `name` is the library's and Ansible's name (snake_case) and the CLI's parameter name; `flag`
    the CLI's spelling (`--x/--no-x` for a tri-state bool). `type` is Ansible's vocabulary: str, int, float, bool,
    path, or list (of `elements`). `inapplicable` is the rule when the node cannot use the option (an option
    meant for a Kubernetes node on a node without a kubelet, `needs`): "note" (the plan says so, the run goes on),
    "refuse" (a usage error, exit 2: --kernel without --bake) or "" (the option always applies)."""

    name: str
    flag: str
    type: str
    help: str
    group: str  # the --help panel
    default: object = None
    elements: str | None = None
    choices: tuple[str, ...] | str | None = None  # or STEPS
    aliases: tuple[str, ...] = ()  # other spellings the checks accept (not offered as choices)
    metavar: str = ""
    commands: tuple[str, ...] = ("plan", "install")
    fronts: tuple[str, ...] = (CLI, API, ANSIBLE)  # where the option exists
    split: str | None = None  # the CLI takes the list as one word split on this (--mig-layout 1g.10gb,1g.10gb)
    no_log: bool | None = None  # Ansible: a name with "key" in it that is not a secret says so
    inapplicable: str = ""
    needs: str = ""  # what the node must have for the option to apply ("kubelet"); checked by the step that reads it

    @property
    def cli_flag(self) -> str:
        """The option's word on the command line (for a --x/--no-x option, the --x)."""
        return self.flag.partition("/")[0]


_K8S = "Kubernetes"
OPTION_TABLE: tuple[OptionSpec, ...] = (
    OptionSpec("only", "--only", "list", "Run only this step (repeatable).", "Steps", elements="str", choices=STEPS,
               metavar="STEP"),
    OptionSpec("skip", "--skip", "list", "Skip this step (repeatable).", "Steps", elements="str", choices=STEPS,
               metavar="STEP"),
    OptionSpec("driver", "--driver", "str", "NVIDIA driver version, e.g. 535.129.03.", "Driver", metavar="VERSION"),
    OptionSpec("cuda", "--cuda", "str", "CUDA version, e.g. 12.4 or 12.4.1.", "What the node must run",
               metavar="VERSION"),
    OptionSpec("image", "--image", "str", "Container image, e.g. nvidia/cuda:12.4.1-base-ubuntu22.04.",
               "What the node must run", metavar="IMAGE"),
    OptionSpec("driver_source", "--driver-source", "str", "Where the driver comes from: run (NVIDIA's .run "
               "installer) or packages (the distribution's or NVIDIA's repository packages at exactly --driver, "
               "held; the plan lists each package and version).", "Driver", default="run",
               choices=("run", "packages"), metavar="run|packages"),
    OptionSpec("driver_run", "--driver-run", "str", "The NVIDIA .run installer to use instead of NVIDIA's download: "
               "a local file or a URL.", "Driver", metavar="FILE|URL"),
    OptionSpec("sha256", "--sha256", "str", "Expected sha256 of the .run; refused if different.", "Driver",
               metavar="HEX"),
    OptionSpec("kernel_module", "--kernel-module", "str", "open or proprietary. Default: chosen from the GPUs and the "
               "driver branch.", "Driver", choices=("open", "proprietary"), metavar="open|proprietary"),
    OptionSpec("module_signing_key", "--module-signing-key", "str", "Secure Boot: private key (path on the node) the "
               "installer signs the module with.", "Driver", metavar="PATH", no_log=False),
    OptionSpec("module_signing_cert", "--module-signing-cert", "str", "Secure Boot: its certificate (path on the "
               "node), enrolled with mokutil.", "Driver", metavar="PATH"),
    OptionSpec("cache_dir", "--cache-dir", "path", "Download cache. Default: $GPUNODE_CACHE_DIR or "
               "~/.cache/gpunode/drivers.", "Driver", metavar="DIR"),
    OptionSpec("lock_timeout", "--lock-timeout", "float", "Seconds to wait for a lock another process holds: apt/dpkg "
               "or dnf (unattended-upgrades), or the node's gpunode lock (another gpunode run); 0: do not wait.", "Upgrades and holds", default=600.0,
               metavar="SECONDS", commands=("plan", "install", "uninstall")),
    OptionSpec("toolkit_version", "--toolkit-version", "str", "Pin the NVIDIA Container Toolkit (all four packages), "
               "e.g. 1.17.8 or 1.17.8-1. Default: keep an installed toolkit, else install the newest.",
               "Container toolkit and runtimes", metavar="VERSION"),
    OptionSpec("toolkit_packages", "--toolkit-package", "list", "Offline: a toolkit .deb/.rpm file on this machine "
               "to upload and install instead of using NVIDIA's repository (repeatable).",
               "Container toolkit and runtimes", elements="path", metavar="FILE"),
    OptionSpec("set_as_default", "--set-as-default", "bool", "Make nvidia the default runtime of every configured "
               "container engine.", "Container toolkit and runtimes", default=False),
    OptionSpec("k8s", "--k8s", "bool", "Kubernetes node: nvidia becomes the default runtime of containerd / CRI-O, "
               "and docker's own containerd is configured too.", _K8S, default=False),
    OptionSpec("engines", "--engine", "list", "Configure only this container engine: docker, containerd or crio "
               "(repeatable). Default: every engine found.", "Container toolkit and runtimes", elements="str",
               choices=("docker", "containerd", "crio"), aliases=("cri-o",), metavar="ENGINE"),
    OptionSpec("kubeconfig", "--kubeconfig", "str", "Kubernetes: a kubeconfig ON THE NODE for the node's kubectl. "
               "Default: the first of /etc/kubernetes/admin.conf, /etc/rancher/k3s/k3s.yaml, "
               "/etc/rancher/rke2/rke2.yaml, /root/.kube/config found.", _K8S, metavar="PATH", inapplicable="note", needs="kubelet"),
    OptionSpec("gpu_replicas", "--gpu-replicas", "int", "Kubernetes time-slicing: the device plugin advertises each "
               "GPU N times (1: no sharing).", _K8S, default=1, metavar="N", inapplicable="note", needs="kubelet"),
    OptionSpec("mps", "--mps", "bool", "Kubernetes GPU sharing: run NVIDIA's MPS control daemon as a systemd unit "
               "(nvidia-mps.service).", _K8S, default=False, inapplicable="note", needs="kubelet"),
    OptionSpec("mps_thread_percentage", "--mps-thread-percentage", "int", "With --mps: the share of each GPU's SMs an "
               "MPS client may use (1-100).", _K8S, metavar="PCT", inapplicable="note", needs="kubelet"),
    OptionSpec("mig_layout", "--mig-layout", "list", "Kubernetes: MIG instances for every GPU, e.g. "
               "1g.10gb,1g.10gb,2g.20gb; applied at every boot before the kubelet.", _K8S, elements="str",
               metavar="PROFILES", split=",", inapplicable="note", needs="kubelet"),
    OptionSpec("bake", "--bake", "bool", "Image build: install the driver built for --kernel without a GPU, load "
               "nothing, never reboot, and leave /var/lib/gpunode/baked.json for the boot-time install.",
               "Image builds", default=False),
    OptionSpec("bake_kernel", "--kernel", "str", "With --bake: the kernel the image boots, e.g. 5.15.0-92-generic. "
               "Default: the newest installed kernel.", "Image builds", metavar="KERNEL", inapplicable="refuse"),
    OptionSpec("hold_kernel", "--hold-kernel/--no-hold-kernel", "bool", "Hold the kernel metapackages (apt-mark hold "
               "/ dnf versionlock) so upgrades cannot bring a kernel the driver is not built for; --no-hold-kernel "
               "releases them. Default: leave holds as they are.", "Upgrades and holds"),
    OptionSpec("hold_driver", "--hold-driver/--no-hold-driver", "bool", "Hold the driver's packages (a .run driver "
               "has none); --no-hold-driver releases them. Default: leave holds as they are.", "Upgrades and holds"),
    OptionSpec("stop_gpu_services", "--stop-gpu-services", "bool", "Driver upgrade: stop the GPU services that hold "
               "the loaded driver (persistenced, fabric manager, DCGM, MPS), unload it, install, and start them "
               "again. Never stops other processes.", "Upgrades and holds", default=False,
               commands=("plan", "install", "uninstall")),
    # the library and Ansible never reboot a node: they report reboot_required
    OptionSpec("reboot", "--reboot", "bool", "Reboot the node when a step needs it, wait for it to come back (new "
               "boot id) and carry on.", "Reboots", default=False, commands=("install", "uninstall"), fronts=(CLI,)),
    OptionSpec("reboot_timeout", "--reboot-timeout", "float", "Seconds to wait for a rebooted node (more than 0).",
               "Reboots", default=900.0, metavar="SECONDS", commands=("install", "uninstall"),
               fronts=(CLI,)),
)


def option_table() -> tuple[OptionSpec, ...]:
    """The table as the front doors read it (a test extends it through this function)."""
    return OPTION_TABLE


def options_for(front: str, command: str | None = None) -> tuple[OptionSpec, ...]:
    """The rows a front door (CLI, API, ANSIBLE) has, for one command or for all."""
    return tuple(o for o in option_table() if front in o.fronts and (command is None or command in o.commands))


def step_names() -> tuple[str, ...]:
    # the pipeline's order: its steps import this module, but their names load none of them
    from gpunode.steps import ORDER

    return ORDER


def choices_of(spec: OptionSpec) -> tuple[str, ...] | None:
    return step_names() if spec.choices == STEPS else spec.choices  # type: ignore[return-value]


def unused_options(opts: Options, missing: str) -> list[str]:
    """The options given (not at their default) that need what the node lacks (`missing`, a row's `needs`) and
    whose rule is a note: as the command line spells them, for the plan to say they do not apply."""
    found = []
    for row in option_table():
        value = getattr(opts, row.name, row.default)
        if row.needs == missing and row.inapplicable == "note" and value not in (row.default, (), None):
            found.append(row.cli_flag)
    return found
