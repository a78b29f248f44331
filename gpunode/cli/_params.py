"""Every command-line option, declared once, and the decorator that gives a command its shared ones.

A command declares only its own options. `@command(reach=...)` adds the options that say how to reach nodes
(and the fleet options where a command has a fleet mode), checks them in gpunode/cli/_inputs.py before
anything connects or is created, and calls the command with one typed `Target`. Expected errors become
`error:` / `fix:` and their exit code; a closed stdout (`| head`) ends quietly.
"""

from __future__ import annotations

import functools
import inspect
import shlex
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, get_args

import typer

from gpunode.errors import GpunodeError
from gpunode.ui import broken_pipe, print_error

# -- connection (every command that reaches a node) ---------------------------------------------------------
HostOpt = Annotated[str | None, typer.Option(
    "--host", "-H", metavar="[USER@]HOST[:PORT]", show_default=False,
    help="The node: user@host, host:port, or a Host alias from ~/.ssh/config. Default: this machine.")]
HostsOpt = Annotated[list[str] | None, typer.Option(
    "--host", "-H", metavar="[USER@]HOST[:PORT]", show_default=False,
    help="The node: user@host, host:port, or a Host alias from ~/.ssh/config. Repeatable: several nodes run in "
    "parallel. Default: this machine.")]
IdentityOpt = Annotated[list[str] | None, typer.Option(
    "--identity", "-i", metavar="FILE", show_default=False,
    help="Private key file (repeatable). Default: IdentityFile from ssh config, ssh-agent, ~/.ssh/id_*.")]
KnownHostsOpt = Annotated[list[str] | None, typer.Option(
    "--known-hosts", metavar="FILE", show_default=False,
    help="Extra known_hosts file (repeatable); ~/.ssh/known_hosts is always read.")]
AcceptNewOpt = Annotated[bool, typer.Option(
    "--accept-new-host-key", metavar="",
    help="Trust and record the host key of a node never seen before. A CHANGED key is still refused.")]
SshConfigOpt = Annotated[str | None, typer.Option(
    "--ssh-config", metavar="FILE", show_default=False, help="ssh config file. Default: ~/.ssh/config.")]
AskPassOpt = Annotated[bool, typer.Option("--ask-pass", metavar="", help="Prompt for the SSH login password.")]
AskBecomePassOpt = Annotated[bool, typer.Option(
    "--ask-become-pass", "-K", metavar="",
    help="Prompt once for the sudo password (sent on stdin, never on a command line).")]
ConnectTimeoutOpt = Annotated[float, typer.Option(
    "--connect-timeout", metavar="SECONDS", help="Seconds to wait for SSH to connect (more than 0).")]
JsonOpt = Annotated[bool, typer.Option("--json", metavar="", help="Print JSON on stdout (schema in README).")]
# -- engines and image builds (docs/engines.md) ---------------------------------------------------------------
LocalOpt = Annotated[bool, typer.Option(
    "--local", metavar="", help="This machine, no SSH: for engines (DaemonSet, Slurm, cloud-init, Packer). Refused "
    "with --host or --inventory; must run as root.")]
ProgressFormatOpt = Annotated[str, typer.Option(
    "--progress", metavar="human|jsonl", help="jsonl: one JSON event per line on stdout (schema 1, docs/engines.md); "
    "human text goes to stderr.")]
BakeOpt = Annotated[bool, typer.Option(
    "--bake", metavar="", help="Image build: install the driver built for --kernel without a GPU, load nothing, "
    "never reboot, and leave /var/lib/gpunode/baked.json for the boot-time install.")]
BakeKernelOpt = Annotated[str | None, typer.Option(
    "--kernel", metavar="KERNEL", show_default=False,
    help="With --bake: the kernel the image boots, e.g. 5.15.0-92-generic. Default: the newest installed kernel.")]

# -- fleet (plan, install, doctor) --------------------------------------------------------------------------
InventoryOpt = Annotated[str | None, typer.Option(
    "--inventory", "-I", metavar="FILE", show_default=False,
    help="Nodes from a file: gpunode TOML/YAML, or an Ansible INI/YAML inventory.")]
LimitOpt = Annotated[str | None, typer.Option(
    "--limit", "-l", metavar="PATTERN", show_default=False,
    help="Only these hosts/groups (globs; a,b union, !x exclude, &x intersect).")]
ParallelOpt = Annotated[int, typer.Option("--parallel", metavar="N", help="How many nodes at once (1 or more).")]
LogDirOpt = Annotated[str | None, typer.Option(
    "--log-dir", metavar="DIR", show_default=False,
    help="Per-node logs of a fleet run. Default: ./gpunode-logs/<time>/.")]
LogLevelOpt = Annotated[str, typer.Option(
    "--log-level", metavar="info|debug",
    help="Per-node log detail of a fleet run: info (commands and exit codes) or debug (also node output, file "
    "contents and the run's report, secrets masked).")]
BatchOpt = Annotated[str | None, typer.Option(
    "--batch", metavar="N|P%", show_default=False,
    help="Rolling batches: N nodes or P% of them at a time; the next batch starts when one is done.")]
MaxFailOpt = Annotated[str | None, typer.Option(
    "--max-fail", metavar="P%", show_default=False,
    help="Start no new batch once more than P% of the nodes failed.")]

# -- the pipeline (plan, install) ---------------------------------------------------------------------------
OnlyOpt = Annotated[list[str] | None, typer.Option(
    "--only", metavar="STEP", show_default=False, help="Run only this step (repeatable).")]
SkipOpt = Annotated[list[str] | None, typer.Option(
    "--skip", metavar="STEP", show_default=False, help="Skip this step (repeatable).")]
DriverOpt = Annotated[str | None, typer.Option(
    "--driver", metavar="VERSION", show_default=False, help="NVIDIA driver version, e.g. 535.129.03.")]
CudaOpt = Annotated[str | None, typer.Option(
    "--cuda", metavar="VERSION", show_default=False, help="CUDA version, e.g. 12.4 or 12.4.1.")]
ImageOpt = Annotated[str | None, typer.Option(
    "--image", metavar="IMAGE", show_default=False, help="Container image, e.g. nvidia/cuda:12.4.1-base-ubuntu22.04.")]
GpuOpt = Annotated[str | None, typer.Option(
    "--gpu", metavar="NAME|PCI-ID", show_default=False,
    help="GPU name as nvidia-smi or lspci prints it (H100, NVIDIA H100 80GB HBM3, RTX 4090) or PCI id (10de:2330).")]
DriverRunOpt = Annotated[str | None, typer.Option(
    "--driver-run", metavar="FILE|URL", show_default=False,
    help="The NVIDIA .run installer to use instead of NVIDIA's download: a local file or a URL.")]
Sha256Opt = Annotated[str | None, typer.Option(
    "--sha256", metavar="HEX", show_default=False, help="Expected sha256 of the .run; refused if different.")]
KernelModuleOpt = Annotated[str | None, typer.Option(
    "--kernel-module", metavar="open|proprietary", show_default=False,
    help="open or proprietary. Default: chosen from the GPUs and the driver branch.")]
SigningKeyOpt = Annotated[str | None, typer.Option(
    "--module-signing-key", metavar="PATH", show_default=False,
    help="Secure Boot: private key (path on the node) the installer signs the module with.")]
SigningCertOpt = Annotated[str | None, typer.Option(
    "--module-signing-cert", metavar="PATH", show_default=False,
    help="Secure Boot: its certificate (path on the node), enrolled with mokutil.")]
CacheDirOpt = Annotated[str | None, typer.Option(
    "--cache-dir", metavar="DIR", show_default=False,
    help="Download cache. Default: $GPUNODE_CACHE_DIR or ~/.cache/gpunode/drivers.")]
LockTimeoutOpt = Annotated[float, typer.Option(
    "--lock-timeout", metavar="SECONDS",
    help="Seconds to wait for a lock another process holds: apt/dpkg or dnf (unattended-upgrades), or the node's "
    "gpunode lock (another gpunode run); 0: do not wait.")]
ToolkitVersionOpt = Annotated[str | None, typer.Option(
    "--toolkit-version", metavar="VERSION", show_default=False,
    help="Pin the NVIDIA Container Toolkit (all four packages), e.g. 1.17.8 or 1.17.8-1. "
    "Default: keep an installed toolkit, else install the newest.")]
ToolkitPackageOpt = Annotated[list[Path] | None, typer.Option(
    "--toolkit-package", metavar="FILE", exists=True, dir_okay=False, readable=True, show_default=False,
    help="Offline: a toolkit .deb/.rpm file on this machine to upload and install instead of using NVIDIA's "
    "repository (repeatable).")]
SetAsDefaultOpt = Annotated[bool, typer.Option(
    "--set-as-default", metavar="", help="Make nvidia the default runtime of every configured container engine.")]
K8sOpt = Annotated[bool, typer.Option(
    "--k8s", metavar="", help="Kubernetes node: nvidia becomes the default runtime of containerd / CRI-O, and "
    "docker's own containerd is configured too.")]
KubeconfigOpt = Annotated[str | None, typer.Option(
    "--kubeconfig", metavar="PATH", show_default=False,
    help="Kubernetes: a kubeconfig ON THE NODE for the node's kubectl. Default: the first of "
    "/etc/kubernetes/admin.conf, /etc/rancher/k3s/k3s.yaml, /etc/rancher/rke2/rke2.yaml, /root/.kube/config found.")]
GpuReplicasOpt = Annotated[int, typer.Option(
    "--gpu-replicas", metavar="N", help="Kubernetes time-slicing: the device plugin advertises each GPU N times "
    "(1: no sharing).")]
MpsOpt = Annotated[bool, typer.Option(
    "--mps", metavar="", help="Kubernetes GPU sharing: run NVIDIA's MPS control daemon as a systemd unit "
    "(nvidia-mps.service).")]
MpsThreadsOpt = Annotated[int | None, typer.Option(
    "--mps-thread-percentage", metavar="PCT", show_default=False,
    help="With --mps: the share of each GPU's SMs an MPS client may use (1-100).")]
MigLayoutOpt = Annotated[str | None, typer.Option(
    "--mig-layout", metavar="PROFILES", show_default=False,
    help="Kubernetes: MIG instances for every GPU, e.g. 1g.10gb,1g.10gb,2g.20gb; applied at every boot before the "
    "kubelet.")]
EngineOpt = Annotated[list[str] | None, typer.Option(
    "--engine", metavar="ENGINE", show_default=False,
    help="Configure only this container engine: docker, containerd or crio (repeatable). Default: every engine "
    "found.")]
# -- kernel upgrades and holds (tri-state: absent leaves holds as they are) --------------------------------------
HoldKernelOpt = Annotated[bool | None, typer.Option(
    "--hold-kernel/--no-hold-kernel", metavar="", show_default=False,
    help="Hold the kernel metapackages (apt-mark hold / dnf versionlock) so upgrades cannot bring a kernel the "
    "driver is not built for; --no-hold-kernel releases them. Default: leave holds as they are.")]
HoldDriverOpt = Annotated[bool | None, typer.Option(
    "--hold-driver/--no-hold-driver", metavar="", show_default=False,
    help="Hold the driver's packages (a .run driver has none); --no-hold-driver releases them. Default: leave "
    "holds as they are.")]
# driver upgrades (gpunode/facts/holders.py)
StopGpuServicesOpt = Annotated[bool, typer.Option(
    "--stop-gpu-services", metavar="", help="Driver upgrade: stop the GPU services that hold the loaded driver "
    "(persistenced, fabric manager, DCGM, MPS), unload it, install, and start them again. Never stops other "
    "processes.")]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", metavar="", help="Same as `gpunode plan`: show, change nothing.")]
RebootOpt = Annotated[bool, typer.Option(
    "--reboot", metavar="", help="Reboot the node when a step needs it, wait for it to come back (new boot id) and "
    "carry on.")]
RebootTimeoutOpt = Annotated[float, typer.Option(
    "--reboot-timeout", metavar="SECONDS", help="Seconds to wait for a rebooted node (more than 0).")]

# -- uninstall (gpunode/cli/uninstall.py) -------------------------------------------------------------------
UndoOnlyOpt = Annotated[list[str] | None, typer.Option(
    "--only", metavar="STEP", show_default=False,
    help="Undo only this step (repeatable). The build prerequisites are removed only when named.")]


def _help(ctx: typer.Context, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        typer.echo(ctx.get_help(), color=ctx.color)
        raise typer.Exit(0)


# typer's own help option shows a `<bool>` type; commands use this one instead (app.command(add_help_option=False))
HelpOpt = Annotated[bool, typer.Option("--help", "-h", metavar="", is_eager=True, expose_value=False,
                                       callback=_help, help="Show this message and exit.")]

# name, annotation, default: the shared parameters, in the order --help lists them
CONNECTION: tuple[tuple[str, Any, Any], ...] = (
    ("local", LocalOpt, False), ("identity", IdentityOpt, None), ("known_hosts", KnownHostsOpt, None),
    ("accept_new_host_key", AcceptNewOpt, False), ("ssh_config", SshConfigOpt, None), ("ask_pass", AskPassOpt, False),
    ("ask_become_pass", AskBecomePassOpt, False), ("connect_timeout", ConnectTimeoutOpt, 15.0),
    ("json_output", JsonOpt, False))
FLEET: tuple[tuple[str, Any, Any], ...] = (
    ("inventory", InventoryOpt, None), ("limit", LimitOpt, None), ("parallel", ParallelOpt, 8),
    ("log_dir", LogDirOpt, None), ("log_level", LogLevelOpt, "info"))
ROLLING: tuple[tuple[str, Any, Any], ...] = (("batch", BatchOpt, None), ("max_fail", MaxFailOpt, None))

# plan and install: what to make true on the node (checked into a Request by _inputs.request)
PIPELINE: tuple[tuple[str, Any, Any], ...] = (
    ("only", OnlyOpt, None), ("skip", SkipOpt, None), ("driver", DriverOpt, None), ("cuda", CudaOpt, None),
    ("image", ImageOpt, None), ("driver_run", DriverRunOpt, None), ("sha256", Sha256Opt, None),
    ("kernel_module", KernelModuleOpt, None), ("module_signing_key", SigningKeyOpt, None),
    ("module_signing_cert", SigningCertOpt, None), ("cache_dir", CacheDirOpt, None),
    ("lock_timeout", LockTimeoutOpt, 600.0), ("toolkit_version", ToolkitVersionOpt, None),
    ("toolkit_package", ToolkitPackageOpt, None), ("set_as_default", SetAsDefaultOpt, False), ("k8s", K8sOpt, False),
    ("engine", EngineOpt, None), ("kubeconfig", KubeconfigOpt, None), ("gpu_replicas", GpuReplicasOpt, 1),
    ("mps", MpsOpt, False), ("mps_thread_percentage", MpsThreadsOpt, None), ("mig_layout", MigLayoutOpt, None),
    ("bake", BakeOpt, False), ("bake_kernel", BakeKernelOpt, None),
    ("hold_kernel", HoldKernelOpt, None), ("hold_driver", HoldDriverOpt, None),
    ("stop_gpu_services", StopGpuServicesOpt, False))
REBOOT: tuple[tuple[str, Any, Any], ...] = (("reboot", RebootOpt, False), ("reboot_timeout", RebootTimeoutOpt, 900.0))

# reach: which shared options a command takes
REACH = {
    "none": (),  # compat, explain: offline
    "one": (("host", HostOpt, None), *CONNECTION),  # verify, status, facts
    "fleet": (("host", HostsOpt, None), *CONNECTION, *FLEET),  # doctor
    "rolling": (("host", HostsOpt, None), *CONNECTION, *FLEET, *ROLLING),  # plan, install
}


def option_name(annotation: Any) -> str:
    """--long-name of an Annotated typer option."""
    info = get_args(annotation)[1]
    first = [info.default] if isinstance(info.default, str) else []  # Annotated form: the first name is `default`
    return next(d for d in [*first, *info.param_decls] if d.startswith("--"))


def same_args(params: Sequence[inspect.Parameter], values: dict[str, Any], drop: Sequence[str] = ()) -> list[str]:
    """The options the user gave, as argv words, in a canonical order: to print the same command again."""
    words: list[str] = []
    for p in params:
        value = values.get(p.name, p.default)
        if p.name in drop or p.name == "help_" or value == p.default or value is None or value == []:
            continue
        name = option_name(p.annotation)
        if isinstance(value, bool):
            on, _, off = name.partition("/")  # "--hold-kernel/--no-hold-kernel": the word for the value given
            words.append(on if value or not off else off)
        elif isinstance(value, list):
            for item in value:
                words += [name, str(item)]
        else:
            words += [name, f"{value:g}" if isinstance(value, float) else str(value)]
    return words


def quoted(words: Sequence[str]) -> str:
    return shlex.join(words)


@contextmanager
def expected_errors(fixer: Callable[[str], str] | None = None) -> Iterator[None]:
    """GpunodeError -> `error: ...` and `fix: ...` on stderr and its exit code; no traceback."""
    try:
        yield
    except GpunodeError as exc:
        print_error(exc.message, fixer(exc.fix) if fixer and exc.fix else exc.fix)
        raise typer.Exit(exc.exit_code) from None


def command(reach: str = "none", pipeline: bool = False,
            reboot: bool = False) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Adds the shared options of `reach` (and of the pipeline, and --reboot) to a command. The command gets
    `target` (a Target, see gpunode/cli/_target.py), `request` (a Request: the steps and Options) and `argv`
    (the options it was given, to print the same command again), each only if it declares them."""
    def params(group: tuple[tuple[str, Any, Any], ...]) -> list[inspect.Parameter]:
        return [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
                for name, annotation, default in group]

    shared = params(REACH[reach])
    wanted = params((*(PIPELINE if pipeline else ()), *(REBOOT if reboot else ())))

    def decorate(func: Callable[..., None]) -> Callable[..., None]:
        own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
               for p in inspect.signature(func, eval_str=True).parameters.values()
               if p.name not in ("target", "argv", "request")]
        every = [*shared, *wanted, *own, inspect.Parameter("help_", inspect.Parameter.KEYWORD_ONLY, default=False,
                                                  annotation=HelpOpt)]

        @functools.wraps(func)
        def run(**values: Any) -> None:
            values.pop("help_", None)
            from gpunode.cli import _inputs  # the checks load the pipeline: only when a command runs

            try:
                extra: dict[str, Any] = {}
                if "argv" in inspect.signature(func).parameters:
                    extra["argv"] = same_args(every, values, drop=("json_output",))
                with expected_errors():
                    if reach != "none":
                        again = ["gpunode", func.__name__, *same_args(every, values)]  # for the --local root fix
                        extra["target"] = _inputs.target(reach, {p.name: values.pop(p.name) for p in shared}, again)
                    if wanted:
                        extra["request"] = _inputs.request({p.name: values.pop(p.name) for p in wanted},
                                                           extra.get("target"))
                func(**values, **extra)
            except BrokenPipeError:
                broken_pipe()
            except KeyboardInterrupt:
                print_error("interrupted (Ctrl-C)", "run the same command again: every step starts from what it "
                            "finds on the node")
                raise typer.Exit(130) from None

        run.__signature__ = inspect.Signature(every)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in every}
        return run

    return decorate
