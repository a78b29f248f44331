"""`gpunode doctor` against node-simulator nodes (real sshd on 127.0.0.1 serving a chroot).

A fresh node fails where work is left; a node finished by `gpunode install` passes everything that applies; then,
on that finished node, one broken variant per check makes exactly that check fail (or warn) with its fix, and undoing
it brings the node back to the all-pass baseline (checked before and after every variant).

"Finished" is `gpunode install --driver V --engine docker --engine containerd` (containerd wired in too, not only
left as docker's backend) and nothing else: its last step (nodesettings) runs nvidia-persistenced and links the
NVIDIA devices from /dev/char. The simulator has no kernel log, so the node gets a `dmesg` that prints a log file
the variants replace.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shlex
import threading
from collections.abc import Callable, Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpunode import compat, fixes, gpus
from gpunode.cli import app
from gpunode.cli._target import runnable
from gpunode.doctor import CHECKS
from tests.conftest import FIXTURES
from tests.nodesim import SimNode, build_fake_driver_run, get_profile
from tests.nodesim.fixtures import host_guard, nodesim_available, sim_node  # noqa: F401 - pytest fixtures
from tests.nodesim.node import gpu_resource

pytestmark = pytest.mark.integration

V = "580.95.05"  # what NVIDIA's CUDA repository (and so the simulator's catalog) has fabric manager for
OLD = "470.256.02"  # an end-of-life branch that still drives a T4
KMSG = "/var/log/gpunode-test-kmsg"
BOOT_LOG = ("[    5.104211] nvidia: loading out-of-tree module taints kernel.\n"
            f"[    5.231876] NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  {V}  Release Build\n")
cli = CliRunner()
# Kubernetes checks skip without a kubelet (their simulator nodes: tests/integration/test_k8s_nodesim.py)
K8S_CHECKS = {"container.k8s-kubelet-runtime", "container.k8s-device-plugin", "container.k8s-allocatable",
              "container.k8s-sharing-units"}
NOT_APPLICABLE = {"container.crio-nvidia-runtime", "container.cdi-spec",  # no CRI-O, no podman
                  "hw.iommu",  # no GPU bound to vfio-pci
                  "driver.packages-held"} | K8S_CHECKS  # the .run driver (packages: test_driver_packages_nodesim)


class Mirror:
    """NVIDIA's download layout on 127.0.0.1 (what GPUNODE_DRIVER_MIRROR points at)."""

    def __init__(self, root: Path, versions: tuple[str, ...]) -> None:
        self.cache = root.parent / "cache"  # gpunode's download cache, on this machine
        for version in versions:
            build_fake_driver_run(version, root / "tesla" / version / f"NVIDIA-Linux-x86_64-{version}.run")

        class Quiet(SimpleHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(root)))
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture(scope="module")
def mirror(tmp_path_factory: pytest.TempPathFactory, nodesim_available: bool) -> Iterator[Mirror]:  # noqa: F811
    served = Mirror(tmp_path_factory.mktemp("www"), (V, OLD))
    yield served
    served.httpd.shutdown()
    served.httpd.server_close()


def invoke(mirror: Mirror, *args: str):
    return cli.invoke(app, list(args), env={"GPUNODE_DRIVER_MIRROR": mirror.url,
                                            "GPUNODE_CACHE_DIR": str(mirror.cache)})


def kernel_log(node: SimNode) -> None:
    """The simulator has no kernel log: a `dmesg` that prints a file the variants replace."""
    node.write(KMSG, BOOT_LOG)
    node.write("usr/bin/dmesg", f"#!/bin/sh\ncat {KMSG}\n", 0o755)


def finish(mirror: Mirror, profile: str, **overrides) -> SimNode:
    node = SimNode(get_profile(profile, nouveau_loaded=False, **overrides)).start()
    try:
        result = invoke(mirror, "install", *node.cli_args(), "--driver", V, "--engine", "docker", "--engine",
                        "containerd")
        assert result.exit_code == 0, result.output
        kernel_log(node)
    except BaseException:
        node.stop()
        raise
    return node


def doctor(node: SimNode) -> dict[str, dict]:
    result = cli.invoke(app, ["doctor", *node.cli_args(), "--json"])
    assert result.exit_code in (0, 1), result.output
    data = json.loads(result.stdout)
    assert data["exit_code"] == result.exit_code
    return {c["id"]: c for c in data["checks"]}


def statuses(checks: dict[str, dict]) -> dict[str, str]:
    return {i: c["status"] for i, c in checks.items()}


def flagged(checks: dict[str, dict]) -> dict[str, str]:
    return {i: c["status"] for i, c in checks.items() if c["status"] in ("fail", "warn")}


# ---- fresh, finished, no GPU ---------------------------------------------------------------------------------


def test_fresh_node_fails_where_work_is_left(sim_node):  # noqa: F811
    node = sim_node("ubuntu-22.04-t4")
    result = cli.invoke(app, ["doctor", *node.cli_args()])
    assert result.exit_code == 1
    checks = doctor(node)
    assert flagged(checks) == {"kernel.nouveau-loaded": "fail", "kernel.nouveau-blacklisted": "fail",
                               "driver.loaded": "fail", "container.toolkit-installed": "fail"}
    # fixes name the node they are about (gpunode/cli/_target.py), so they run there as printed
    assert checks["kernel.nouveau-loaded"]["fix"] == runnable(fixes.gpunode("install", only="nouveau", reboot=True), node.cli_args())
    install = runnable(fixes.gpunode("install", driver=True), node.cli_args())
    fix = checks["driver.loaded"]["fix"]
    assert fix.startswith(install + " ")  # with a release that suits the T4, from the branch table
    version = fix[len(install):].split()[0]
    assert version in {str(b.latest_known) for b in compat.tables().branches.values()}
    assert compat.driver_supports(gpus.architecture_of(gpus.lookup_id(0x1EB8)), compat.parse_driver(version))[0]
    assert checks["container.docker-nvidia-runtime"]["status"] == "skip"  # waits for the toolkit
    assert checks["hw.gpu-present"]["evidence"] == "1 NVIDIA GPU(s): Tesla T4 (Turing) at 0000:00:1e.0"
    assert "fix: " + runnable(fixes.gpunode("install", only="nouveau", reboot=True), node.cli_args()) in " ".join(result.stdout.split())


def test_node_without_gpu(sim_node):  # noqa: F811
    node = sim_node("debian-12-nogpu")
    checks = doctor(node)
    assert flagged(checks) == {"hw.gpu-present": "fail"}
    assert "no NVIDIA GPU was found" in checks["hw.gpu-present"]["evidence"]


@pytest.fixture(scope="module")
def t4(mirror: Mirror) -> Iterator[SimNode]:
    node = finish(mirror, "ubuntu-22.04-t4")
    yield node
    node.stop()


@pytest.fixture(scope="module")
def h100(mirror: Mirror) -> Iterator[SimNode]:
    node = finish(mirror, "ubuntu-22.04-h100x8")
    yield node
    node.stop()


T4_BASELINE_SKIPS = NOT_APPLICABLE | {"fabric.manager-version", "fabric.manager-active"}
T4_BASELINE = {c.id: "skip" if c.id in T4_BASELINE_SKIPS else "pass" for c in CHECKS}
H100_BASELINE = {c.id: "skip" if c.id in NOT_APPLICABLE else "pass" for c in CHECKS}


def test_finished_t4_node_passes_everything_that_applies(t4):
    checks = doctor(t4)
    assert statuses(checks) == T4_BASELINE
    assert checks["driver.loaded"]["evidence"] == f"/proc/driver/nvidia/version: {V} (open kernel module)"
    assert checks["container.containerd-nvidia-runtime"]["evidence"] == (
        "nvidia runtime (/usr/bin/nvidia-container-runtime) loaded from /etc/containerd/config.toml, "
        "/etc/containerd/conf.d/99-nvidia.toml")
    assert checks["health.xid"]["evidence"] == "no Xid errors since boot (dmesg)"
    result = cli.invoke(app, ["doctor", *t4.cli_args()])
    assert result.exit_code == 0 and (f"{len(checks) - len(T4_BASELINE_SKIPS)} pass, 0 warn, 0 fail, "
                                                 f"{len(T4_BASELINE_SKIPS)} skip") in result.stdout


def test_finished_nvswitch_node_passes_the_fabric_checks(h100):
    checks = doctor(h100)
    assert statuses(checks) == H100_BASELINE
    assert checks["fabric.manager-version"]["evidence"] == f"nvidia-fabricmanager {V}-1 (held) matches driver {V}"
    assert checks["fabric.manager-active"]["evidence"] == ("nvidia-fabricmanager.service active and enabled, fabric "
                                                           "Completed on 8 GPU(s)")


# ---- broken variants ------------------------------------------------------------------------------------------


class Undo:
    """Records what a variant changes on the node and puts it back, contents and modification times."""

    def __init__(self, node: SimNode) -> None:
        self.node = node
        self.steps: list[Callable[[], None]] = []

    def _path(self, path: str) -> Path:
        return self.node.root / path.lstrip("/")

    def keep(self, path: str) -> None:
        """Remember `path` as it is now (file, symlink or absent)."""
        p = self._path(path)
        if p.is_symlink():
            target = os.readlink(p)
            self.steps.append(lambda: (self.node.remove(path), os.symlink(target, p)))
        elif p.exists():
            data, stat = p.read_bytes(), p.stat()
            self.steps.append(lambda: (self.node.write(path, data, stat.st_mode & 0o7777),
                                       os.utime(p, (stat.st_atime, stat.st_mtime))))
        else:
            self.steps.append(lambda: self.node.remove(path))

    def write(self, path: str, text: str, mode: int = 0o644) -> None:
        self.keep(path)
        self.node.write(path, text, mode)

    def remove(self, path: str) -> None:
        self.keep(path)
        self.node.remove(path)

    def ssh(self, command: str, undo: str | None = None) -> None:
        code, out, err = self.node.ssh(command)
        assert code == 0, out + err
        if undo:
            self.steps.append(lambda: self.ssh(undo))

    def then(self, step: Callable[[], None]) -> None:
        self.steps.append(step)

    def restore(self) -> None:
        for step in reversed(self.steps):
            step()


Variant = Callable[[SimNode, Undo], None]


def _kmsg(text: str) -> Variant:
    return lambda node, undo: undo.write(KMSG, text)


def _unload(node: SimNode, undo: Undo) -> None:
    node.set_module_loaded("nvidia", False)
    undo.then(lambda: node.set_module_loaded("nvidia", True))


def _secure_boot(node: SimNode, undo: Undo) -> None:
    node.set_secure_boot(True)
    undo.then(lambda: node.set_secure_boot(False))
    _unload(node, undo)  # as at the next boot: the unsigned module stays out


def _nouveau(node: SimNode, undo: Undo) -> None:
    node.set_module_loaded("nouveau", True)
    undo.then(lambda: node.set_module_loaded("nouveau", False))


def _stale_initramfs(node: SimNode, undo: Undo) -> None:
    image = f"/boot/initrd.img-{node.kernel}"
    undo.keep(image)
    stamp = (node.root / image.lstrip("/")).stat().st_mtime - 3600
    os.utime(node.root / image.lstrip("/"), (stamp, stamp))


def _new_kernel(node: SimNode, undo: Undo) -> None:
    for path in ("var/lib/nodesim/kernels", "var/lib/nodesim/next-kernel"):
        undo.keep(path)
    undo.then(lambda: node.remove("usr/lib/modules/5.15.0-92-generic"))
    node.set_kernel("5.15.0-92-generic", headers=False)


def _mismatch(node: SimNode, undo: Undo) -> None:
    """An upgrade of the user-space libraries under the loaded module (the classic partial upgrade)."""
    for path in ("var/lib/nodesim/driver.env", "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.105.08"):
        undo.keep(path)
    for module in ("nvidia", "nvidia-uvm", "nvidia-modeset", "nvidia-drm"):
        undo.keep(f"usr/lib/modules/{node.kernel}/kernel/drivers/video/{module}.ko")
    node.install_driver("580.105.08", "open", load=False)


def _daemon_json(text: str) -> Variant:
    return lambda node, undo: undo.write("/etc/docker/daemon.json", text)


def _no_imports(node: SimNode, undo: Undo) -> None:
    text = node.read("/etc/containerd/config.toml") or ""
    assert "imports" in text
    undo.write("/etc/containerd/config.toml", "".join(line + "\n" for line in text.splitlines()
                                                       if not line.startswith("imports")))


def _no_engine(node: SimNode, undo: Undo) -> None:
    for path in ("var/lib/nodesim/units/docker.service", "var/lib/nodesim/units/containerd.service", "/usr/bin/docker",
                 "/usr/bin/containerd", "/usr/bin/ctr"):
        undo.remove(path)


def _no_dev_char(node: SimNode, undo: Undo) -> None:
    for name in node.listdir("/dev/char"):
        undo.remove(f"/dev/char/{name}")


def _downgrade(mirror: Mirror) -> Variant:
    # nvidia-persistenced holds the old module: --stop-gpu-services stops it for the install and starts it again
    def apply(node: SimNode, undo: Undo) -> None:
        result = invoke(mirror, "install", *node.cli_args(), "--driver", OLD, "--only", "driver", "--only",
                        "nodesettings", "--stop-gpu-services")
        assert result.exit_code == 0, result.output

        def back() -> None:
            again = invoke(mirror, "install", *node.cli_args(), "--driver", V, "--only", "driver", "--only",
                           "nodesettings", "--stop-gpu-services")
            assert again.exit_code == 0, again.output
        undo.then(back)
    return apply


def _toolkit_skew(node: SimNode, undo: Undo) -> None:
    node.install_package("libnvidia-container1=1.17.8-1")
    undo.then(lambda: node.install_package("libnvidia-container1=1.20.0-1"))


def _passthrough(**how: object) -> Variant:
    """The node as a KVM host passing its T4 to a VM (SimNode.pass_through_gpu), undone path by path."""
    def apply(node: SimNode, undo: Undo) -> None:
        for path in node.passthrough_paths(0):
            undo.keep(path)
        node.pass_through_gpu(0, **how)  # type: ignore[arg-type]
    return apply


def _gpu_mode(**values: str) -> Variant:
    """What nvidia-smi -q says of how the T4 is attached (SimNode.set_gpu_health's virtualization keys)."""
    def apply(node: SimNode, undo: Undo) -> None:
        undo.keep("var/lib/nodesim/gpuhealth")
        node.set_gpu_health(0, **values)
    return apply


def _in_a_vm(node: SimNode, undo: Undo) -> None:
    """The node as a QEMU/KVM guest: DMI names the machine, the CPU carries the hypervisor flag."""
    undo.write("/sys/class/dmi/id/sys_vendor", "QEMU\n")
    undo.write("/sys/class/dmi/id/product_name", "Standard PC (Q35 + ICH9, 2009)\n")
    cpuinfo = node.read("/proc/cpuinfo") or ""
    undo.write("/proc/cpuinfo", cpuinfo.replace("\n\n", "\nflags\t\t: fpu vme de pse msr hypervisor\n\n"))


def _vgpu_manager_in_a_vm(node: SimNode, undo: Undo) -> None:
    _in_a_vm(node, undo)
    _gpu_mode(virt_mode="Host VGPU", host_vgpu_mode="SR-IOV")(node, undo)


# (check, status, variant, other checks allowed to warn). Lines marked "constructed" are not real captures.
T4_VARIANTS: list[tuple[str, str, Variant, set[str]]] = [
    ("hw.vgpu", "fail", _kmsg(BOOT_LOG + "[    5.4] NVRM: GPU 0000:00:1e.0: vGPU is not supported by this driver "
                              "(constructed line)\n"), set()),
    ("hw.passthrough-bars", "fail", lambda node, undo: undo.write(
        "/sys/bus/pci/devices/0000:00:1e.0/resource",
        gpu_resource(0, "0x0000000000000000 0x0000000000000000 0x0000000000000000")), set()),
    ("hw.bar1-size", "warn", lambda node, undo: (
        undo.write("/sys/bus/pci/devices/0000:00:1e.0/resource",
                   gpu_resource(0, "0x000000c000000000 0x000000c00fffffff 0x000000000014220c")),  # 256 MiB
        undo.write("/sys/bus/pci/devices/0000:00:1e.0/resource1_resize", "0000000000003f00\n")), set()),
    # a passthrough host: the GPU's HDMI audio function still on its host driver makes the IOMMU group not viable
    ("hw.iommu", "fail", _passthrough(audio_driver="snd_hda_intel"), set()),
    ("hw.iommu", "fail", _passthrough(iommu=False), set()),  # the IOMMU off: no groups at all
    ("hw.iommu", "warn", _passthrough(remapped=False), set()),  # no interrupt remapping
    # the vGPU (GRID) guest driver on a passed-through GPU, unlicensed; the vGPU Manager inside a VM
    ("hw.vgpu-driver-mode", "warn", _gpu_mode(virt_mode="Pass-Through", vgpu_license="Unlicensed (Restricted)"),
     set()),
    ("hw.vgpu-driver-mode", "fail", _vgpu_manager_in_a_vm, set()),
    ("boot.secure-boot", "fail", _secure_boot, set()),
    ("kernel.nouveau-loaded", "fail", _nouveau, set()),
    ("kernel.nouveau-blacklisted", "warn",
     lambda node, undo: undo.remove("/etc/modprobe.d/blacklist-nouveau.conf"), set()),
    ("kernel.nouveau-initramfs", "fail", _stale_initramfs, set()),
    ("kernel.headers", "fail", lambda node, undo: undo.remove(f"/usr/lib/modules/{node.kernel}/build"), set()),
    ("kernel.dkms-newest-kernel", "fail", _new_kernel, set()),
    ("driver.loaded", "fail", _unload, set()),
    ("driver.version-mismatch", "fail", _mismatch, set()),
    ("driver.smi", "fail", lambda node, undo: undo.remove("/usr/bin/nvidia-smi"), set()),
    ("driver.persistence", "warn", lambda node, undo: undo.ssh("nvidia-smi -pm 0", "nvidia-smi -pm 1"), set()),
    ("cuda.toolkit-vs-driver", "warn",
     lambda node, undo: undo.write("/usr/local/cuda-13.1/version.json",
                                   '{"cuda": {"name": "CUDA SDK", "version": "13.1.0"}}'), set()),
    ("container.engine-present", "warn", _no_engine, set()),
    ("container.toolkit-installed", "fail", _toolkit_skew, set()),
    ("container.docker-version", "fail",
     lambda node, undo: undo.write("/usr/bin/dockerd", '#!/bin/sh\necho "Docker version 18.09.7, build 2d0083d"\n',
                                   0o755), set()),
    ("container.docker-nvidia-runtime", "fail", _daemon_json('{\n    "log-driver": "journald"\n}'), set()),
    ("container.containerd-nvidia-runtime", "fail", _no_imports, set()),
    ("container.default-runtime", "fail",
     _daemon_json('{"default-runtime": "nvidia-experimental", "runtimes": {"nvidia": {"args": [], '
                  '"path": "nvidia-container-runtime"}}}'), set()),
    ("container.snap-docker", "fail",
     lambda node, undo: undo.write("/var/snap/docker/current/config/daemon.json", "{}\n"), set()),
    ("container.rootless-docker", "warn",
     lambda node, undo: undo.write("/home/alice/.config/systemd/user/docker.service", "[Service]\n"), set()),
    ("container.dev-char-symlinks", "warn", _no_dev_char, set()),
    ("container.cdi-spec", "fail",
     lambda node, undo: undo.write("/usr/bin/podman", '#!/bin/sh\necho "podman version 4.9.3"\n', 0o755), set()),
    ("health.xid", "fail", _kmsg((FIXTURES / "errors" / "dmesg_xid-119_gsp-rpc-timeout_dell-xe9680.log").read_text()),
     set()),
    ("health.driver-errors", "warn",
     _kmsg((FIXTURES / "errors" / "dmesg_gpu-fallen-off-bus_no-xid_open-module-570.158.01.log").read_text()), set()),
]


@contextlib.contextmanager
def broken(node: SimNode, variant: Variant, baseline: dict[str, str]) -> Iterator[None]:
    """Apply a variant, and afterwards check that undoing it restored the baseline (so the next variant starts
    from a finished node)."""
    undo = Undo(node)
    try:
        variant(node, undo)
        yield
    finally:
        undo.restore()
    assert statuses(doctor(node)) == baseline, "undoing the variant did not restore the baseline"


def assert_exactly(checks: dict[str, dict], check_id: str, status: str, baseline: dict[str, str],
                   also_warn: set[str]) -> None:
    target = checks[check_id]
    assert target["status"] == status, target
    assert target["fix"], target
    assert {i for i in flagged(checks)} - also_warn == {check_id}, flagged(checks)
    for other, check in checks.items():  # nothing else moved, except to skip: its precondition is what broke
        if other != check_id and other not in also_warn and check["status"] != baseline[other]:
            assert check["status"] == "skip", (other, baseline[other], check)


@pytest.mark.parametrize("variant", T4_VARIANTS, ids=[f"{v[0]}-{v[1]}-{i}" for i, v in enumerate(T4_VARIANTS)])
def test_broken_t4_variant(t4, variant):
    check_id, status, apply, also_warn = variant
    with broken(t4, apply, T4_BASELINE):
        assert_exactly(doctor(t4), check_id, status, T4_BASELINE, also_warn)


def test_a_passthrough_host_with_a_viable_group_and_remapped_interrupts_passes_hw_iommu(t4):
    with broken(t4, _passthrough(), T4_BASELINE):
        checks = doctor(t4)
        assert checks["hw.iommu"]["status"] == "pass", checks["hw.iommu"]
        assert "0000:00:1e.0 group 14" in checks["hw.iommu"]["evidence"]
        assert "interrupts are remapped" in checks["hw.iommu"]["evidence"]
        assert set(flagged(checks)) == set()


def test_the_passthrough_variants_name_their_evidence_and_the_hosts_fix(t4):
    with broken(t4, _passthrough(audio_driver="snd_hda_intel"), T4_BASELINE):
        check = doctor(t4)["hw.iommu"]
        assert "0000:00:1e.1 (snd_hda_intel)" in check["evidence"] and "not viable" in check["evidence"]
        assert "KVM" in check["fix"]
    with broken(t4, _gpu_mode(virt_mode="Pass-Through", vgpu_license="Unlicensed (Restricted)"), T4_BASELINE):
        check = doctor(t4)["hw.vgpu-driver-mode"]
        assert "'Unlicensed (Restricted)'" in check["evidence"] and "nvidia-gridd" in check["fix"]
    with broken(t4, _gpu_mode(virt_mode="Pass-Through", vgpu_license="Licensed (Expiry: 2027-3-8 23:59:59 GMT)"),
                T4_BASELINE):
        check = doctor(t4)["hw.vgpu-driver-mode"]
        assert check["status"] == "pass" and "vGPU guest driver, licensed" in check["evidence"]
    with broken(t4, _vgpu_manager_in_a_vm, T4_BASELINE):
        check = doctor(t4)["hw.vgpu-driver-mode"]
        assert "Host VGPU" in check["evidence"] and "KVM / QEMU" in check["evidence"]


def test_broken_t4_variant_end_of_life_branch(t4, mirror):
    with broken(t4, _downgrade(mirror), T4_BASELINE):
        checks = doctor(t4)
        assert_exactly(checks, "driver.branch-lifecycle", "warn", T4_BASELINE, set())
        assert checks["driver.branch-lifecycle"]["evidence"] == (
            f"driver {OLD}: R470 LTSB reached end of life in 2024-07")
        assert checks["driver.branch-lifecycle"]["fix"].startswith(runnable(fixes.gpunode("install"), t4.cli_args()) + " --driver 580.")


def _unattended(node: SimNode, undo: Undo) -> None:
    undo.write("/usr/bin/unattended-upgrade", "#!/bin/sh\nexit 0\n", 0o755)
    undo.write("/etc/apt/apt.conf.d/20auto-upgrades", 'APT::Periodic::Update-Package-Lists "1";\n'
                                                      'APT::Periodic::Unattended-Upgrade "1";\n')
    undo.ssh("apt-mark unhold nvidia-fabricmanager", "apt-mark hold nvidia-fabricmanager")


def _fm_reinstall(mirror: Mirror) -> Callable[[SimNode], None]:
    def back(node: SimNode) -> None:
        result = invoke(mirror, "install", *node.cli_args(), "--driver", V, "--only", "fabricmanager")
        assert result.exit_code == 0, result.output
    return back


H100_VARIANTS: list[tuple[str, str, str]] = [
    ("fabric.manager-installed", "fail", "apt-mark unhold nvidia-fabricmanager && apt-get remove -y nvidia-fabricmanager"),
    ("fabric.manager-version", "fail", "apt-mark unhold nvidia-fabricmanager && apt-get install -y --allow-downgrades "
                                       "nvidia-fabricmanager=590.48.01-1"),
    ("fabric.manager-active", "fail", "systemctl stop nvidia-fabricmanager"),
]


@pytest.mark.parametrize("variant", H100_VARIANTS, ids=[v[0] for v in H100_VARIANTS])
def test_broken_nvswitch_variant(h100, mirror, variant):
    check_id, status, command = variant
    repair = _fm_reinstall(mirror)
    with broken(h100, lambda node, undo: (undo.then(lambda: repair(node)), undo.ssh(command)), H100_BASELINE):
        assert_exactly(doctor(h100), check_id, status, H100_BASELINE, set())


def test_broken_nvswitch_variant_unattended_upgrades(h100):
    with broken(h100, _unattended, H100_BASELINE):
        checks = doctor(h100)
        # unheld, fabric manager has a newer version in the CUDA repository: the next upgrade changes it
        assert_exactly(checks, "pkg.unattended-upgrades", "warn", H100_BASELINE, {"pkg.pending-upgrades"})
        # a node command, run there through ssh with the node's port, key and known-hosts file
        ssh = ["ssh", "-t", "-i", h100.key_path, "-o", f"UserKnownHostsFile={h100.known_hosts}", "-p",
               str(h100.port), f"root@{h100.host}"]
        assert checks["pkg.unattended-upgrades"]["fix"] == shlex.join(ssh) + ' "sudo apt-mark hold nvidia-fabricmanager"'



def test_broken_variant_driver_branch_too_old_for_the_gpu(mirror):
    """An RTX 4090 (Ada) needs R520+; R515 installs but cannot drive it (its branch is end of life, too)."""
    node = finish(mirror, "ubuntu-22.04-rtx4090")
    try:
        node.set_module_loaded("nvidia", False)
        node.install_driver("515.105.01", "proprietary", load=False)
        checks = doctor(node)
        assert checks["driver.branch-supports-gpu"]["status"] == "fail"
        assert "Ada Lovelace" in checks["driver.branch-supports-gpu"]["evidence"]
        assert checks["driver.branch-supports-gpu"]["fix"].startswith(runnable(fixes.gpunode("install"), node.cli_args()) + " --driver ")
        assert set(flagged(checks)) == {"driver.branch-supports-gpu", "driver.branch-lifecycle"}
        assert checks["driver.loaded"]["status"] == "skip"  # the branch is why it does not load
    finally:
        node.stop()


def test_variants_cover_every_check_the_simulator_can_break():
    covered = {v[0] for v in T4_VARIANTS} | {v[0] for v in H100_VARIANTS} | {
        "hw.gpu-present", "driver.branch-lifecycle", "pkg.unattended-upgrades", "driver.branch-supports-gpu",
        "container.runtime-loaded"} | K8S_CHECKS  # runtime-loaded: broken in tests/integration/test_reliability_runtime.py
    covered |= {"driver.packages-held"}  # a released hold: tests/integration/test_driver_packages_nodesim.py
    # GPU health, MIG and pending upgrades: every verdict of each in test_doctor_health_nodesim.py
    covered |= {"health.ecc", "health.row-remapping", "driver.gsp", "driver.uvm", "hw.mig-layout", "hw.mig-mode",
                "pkg.pending-upgrades"}
    # not reachable in the simulator (unit-tested in tests/doctor/): every driver package in its catalog replaces
    # the .run driver; its GPUs that need the open module (B200) also need NVLink-5 fabric management gpunode does
    # not set up; it has no CRI-O
    assert {c.id for c in CHECKS} - covered == {"driver.single-source", "driver.module-flavour",
                                                "container.crio-nvidia-runtime"}
