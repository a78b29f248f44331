"""Every doctor check on fake nodes: a finished node passes, a fresh one fails where it should, and each check has
a broken variant that makes exactly that check fail (or warn) with its fix, while the rest stay as they were or
skip because the broken fact is their precondition."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from gpunode.doctor import CHECKS, LAYERS, exit_code, run_checks
from gpunode.doctor import base as doctor_base
from gpunode.facts import FULL, gather
from gpunode.facts import containers as c
from tests.conftest import FIXTURES
from tests.doctor.fakes import (
    H100,
    K,
    V,
    check_results,
    finished,
    fresh,
    installed,
    packages,
    set_output,
    smi_health,
    smi_list,
    smi_q,
    statuses,
    units,
    virt_output,
)
from tests.fakes.connection import FakeConnection, FakeNode

# Kubernetes checks skip on nodes without a kubelet; their broken variants are in tests/doctor/test_doctor_k8s.py
K8S_CHECKS = {"container.k8s-kubelet-runtime", "container.k8s-device-plugin", "container.k8s-allocatable",
              "container.k8s-sharing-units"}
NOT_APPLICABLE_ON_T4 = {"container.crio-nvidia-runtime", "container.cdi-spec", "fabric.manager-version",
                        "fabric.manager-active", "hw.iommu",
                        "driver.packages-held"} | K8S_CHECKS  # the finished T4 has the .run driver: skipped


def test_at_least_30_checks_with_stable_unique_ids_and_known_layers():
    ids = [c.id for c in CHECKS]
    assert len(ids) >= 30 and len(set(ids)) == len(ids)
    assert all(c.layer in LAYERS and c.id.split(".")[0] in ("hw", "boot", "kernel", "driver", "cuda", "container",
                                                            "fabric", "health", "pkg") for c in CHECKS)
    for required in ("hw.gpu-present", "kernel.nouveau-loaded", "kernel.nouveau-blacklisted", "kernel.nouveau-initramfs",
                     "boot.secure-boot", "kernel.headers", "kernel.dkms-newest-kernel", "driver.loaded", "driver.smi",
                     "driver.version-mismatch", "driver.persistence", "driver.branch-supports-gpu",
                     "driver.module-flavour", "cuda.toolkit-vs-driver", "container.toolkit-installed",
                     "container.docker-nvidia-runtime", "container.containerd-nvidia-runtime",
                     "container.crio-nvidia-runtime", "container.default-runtime", "container.docker-version",
                     "container.snap-docker", "container.rootless-docker", "container.dev-char-symlinks",
                     "fabric.manager-installed", "fabric.manager-version", "fabric.manager-active", "health.xid",
                     "hw.vgpu", "pkg.unattended-upgrades", "hw.mig-mode"):
        assert required in ids


def test_results_are_grouped_by_layer_in_order():
    layers = [r.layer for r in run_checks(gather(FakeConnection(finished()), FULL))]
    assert layers == sorted(layers, key=LAYERS.index)


def test_finished_node_passes_every_check_that_applies():
    results = check_results(finished())
    assert {i for i, r in results.items() if r.status != "pass"} == NOT_APPLICABLE_ON_T4
    assert exit_code(list(results.values())) == 0


def test_finished_nvswitch_node_passes_the_fabric_checks_too():
    results = check_results(finished(H100, 8, switches=4))
    assert {i for i, r in results.items() if r.status != "pass"} == {"container.crio-nvidia-runtime",
                                                                     "container.cdi-spec", "hw.iommu",
                                                                     "driver.packages-held"} | K8S_CHECKS
    assert "4 NVSwitch(es): nvidia-fabricmanager 580.95.05-1" in results["fabric.manager-installed"].evidence
    assert "fabric Completed on 8 GPU(s)" in results["fabric.manager-active"].evidence


def test_fresh_node_fails_where_work_is_left_and_skips_what_depends_on_it():
    results = check_results(fresh())
    failing = {i for i, r in results.items() if r.status == "fail"}
    assert failing == {"kernel.nouveau-loaded", "kernel.nouveau-blacklisted", "driver.loaded",
                       "container.toolkit-installed"}
    assert all(results[i].fix for i in failing)
    assert results["kernel.nouveau-loaded"].fix == "gpunode install --only nouveau --reboot"
    assert results["container.toolkit-installed"].fix == "gpunode install --only toolkit"
    for skipped in ("driver.smi", "driver.version-mismatch", "container.docker-nvidia-runtime",
                    "container.containerd-nvidia-runtime", "kernel.nouveau-initramfs"):
        assert results[skipped].status == "skip"


def test_no_gpu_fails_one_check_and_skips_the_rest():
    node = FakeNode()
    results = check_results(node)
    assert results["hw.gpu-present"].status == "fail"
    assert "no NVIDIA GPU was found" in results["hw.gpu-present"].evidence
    assert {r.status for i, r in results.items() if i not in ("hw.gpu-present", "boot.secure-boot")} == {"skip"}


def test_checks_are_pure_functions_of_the_facts():
    facts = gather(FakeConnection(finished()), FULL)
    assert [r.to_dict() for r in run_checks(facts)] == [r.to_dict() for r in run_checks(facts)]


def test_a_check_that_crashes_is_reported_as_a_skip_not_a_traceback():
    target = next(c for c in CHECKS if c.id == "driver.persistence")

    def boom(node):
        raise ValueError("unexpected nvidia-smi output")

    index = CHECKS.index(target)
    CHECKS[index] = doctor_base.Check(target.id, target.layer, target.title, boom)
    try:
        result = check_results(finished())["driver.persistence"]
    finally:
        CHECKS[index] = target
    assert result.status == "skip" and "ValueError: unexpected nvidia-smi output" in result.evidence
    assert "please report it" in result.evidence


# ---- one broken variant per check -------------------------------------------------------------------------------

Mutation = Callable[[FakeNode], None]


def _unload(node: FakeNode) -> None:
    node.modules -= {"nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm"}
    node.nvidia_version = None
    set_output(node, "driver_smi", "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
               9)
    set_output(node, "doctor_gpus", None, 3)


def _kernel_log(text: str) -> Mutation:
    return lambda node: set_output(node, "doctor_kernel_log", "@source dmesg\n" + text)


def _fixture_log(name: str) -> Mutation:
    return _kernel_log((FIXTURES / "errors" / name).read_text(errors="replace"))


def _new_kernel(node: FakeNode) -> None:
    set_output(node, "doctor_kernels", node.outputs["doctor_kernels"][0] + "kernel 5.15.0-92-generic - -\n")


def _mismatch(node: FakeNode) -> None:
    lib = "/usr/lib/x86_64-linux-gnu"
    set_output(node, "driver_userspace", f"lib {lib}/libnvidia-ml.so.1\nlib {lib}/libnvidia-ml.so.580.105.08\n"
                                         "installer nvidia-installer:  version 580.105.08\n")
    set_output(node, "driver_smi", "Failed to initialize NVML: Driver/library version mismatch\n"
                                   "NVML library version: 580.105", 18)
    set_output(node, "doctor_gpus", "", 0)


def _secure_boot_unsigned(node: FakeNode) -> None:
    _unload(node)
    node.secure_boot = True


def _toolkit_skew(node: FakeNode) -> None:
    found = installed(node)
    found["libnvidia-container1"] = "1.17.8-1"
    packages(node, found)


def _no_toolkit(node: FakeNode) -> None:
    packages(node, {})
    node.tools -= {"nvidia-ctk", "nvidia-container-runtime", "nvidia-container-runtime-hook", "nvidia-container-cli"}


def _orphan_dropin(node: FakeNode) -> None:
    node.put(c.CONTAINERD_CONFIG, "version = 2\n")  # the `imports` line is gone: 99-nvidia.toml is not read


def _daemon(text: str) -> Mutation:
    return lambda node: node.put(c.DOCKER_CONFIG, text)


def _crio(node: FakeNode) -> None:
    node.tools.add("crio")
    node.put(c.CRIO_CONFIG, '[crio.runtime]\ndefault_runtime = "crun"\n')


def _no_engine(node: FakeNode) -> None:
    node.tools -= {"docker", "dockerd", "containerd", "ctr"}
    units(node, {})


def _engine_version(text: str) -> Mutation:
    return lambda node: set_output(node, "doctor_engines", text)


def _podman(node: FakeNode) -> None:
    node.tools.add("podman")


def _stale_cdi(node: FakeNode) -> None:
    _podman(node)
    set_output(node, "doctor_cdi", "spec /etc/cdi/nvidia.yaml libnvidia-ml.so.570.133.20\n")


def _dev_char_missing(node: FakeNode) -> None:
    set_output(node, "doctor_dev_char", "dev /dev/nvidia0\ndev /dev/nvidiactl\ndev /dev/nvidia-uvm\n")


def _persistence_off(node: FakeNode) -> None:
    set_output(node, "doctor_gpus", smi_q(["0000:18:00.0"], persistence="Disabled"))
    set_output(node, "doctor_units", "")


def _cuda_toolkit(version: str) -> Mutation:
    return lambda node: node.put(f"/usr/local/cuda-{version.rsplit('.', 1)[0]}/version.json",
                                 json.dumps({"cuda": {"name": "CUDA SDK", "version": version}}))


def _mig_pending(node: FakeNode) -> None:
    set_output(node, "doctor_gpus", smi_q(["0000:18:00.0"], "NVIDIA A100-SXM4-80GB", mig=("Disabled", "Enabled")))


def _vgpu_unlicensed(node: FakeNode) -> None:
    set_output(node, "doctor_gpus", smi_q(["0000:18:00.0"], virtualization="VGPU",
                                          license="Unlicensed (Restricted)"))


def _initramfs_stale(node: FakeNode) -> None:
    node.put("/etc/modprobe.d/blacklist-nouveau.conf", "blacklist nouveau\noptions nouveau modeset=0\n# edited\n")


def _both_sources(node: FakeNode) -> None:
    set_output(node, "driver_packages", "nvidia-utils-580 580.95.05-0ubuntu1\nlibnvidia-compute-580 "
                                        "580.95.05-0ubuntu1\n")


def _packages_moved(node: FakeNode) -> None:
    """gpunode installed the driver from packages (its journal's record) and one of them moved since."""
    import json

    from gpunode.records import DriverRecord

    record = DriverRecord(step="driver", version="580.95.05", source="packages",
                          packages=("nvidia-utils-580=580.95.05-0ubuntu1",))
    set_output(node, "gpunode_pending_restarts", json.dumps({"runs": [], "undo": [record.to_dict()]}))
    set_output(node, "pkg_status", "ii \tnvidia-utils-580\t580.105.08-0ubuntu1\n")


def _old_branch(version: str, flavour: str = "proprietary") -> Mutation:
    def mutate(node: FakeNode) -> None:
        lib = "/usr/lib/x86_64-linux-gnu"
        node.nvidia_version, node.nvidia_flavour = version, flavour
        set_output(node, "driver_userspace", f"lib {lib}/libnvidia-ml.so.{version}\n"
                                             f"installer nvidia-installer:  version {version}\n")
        set_output(node, "driver_module", f"version:        {version}\nlicense:        "
                                          f"{'NVIDIA' if flavour == 'proprietary' else 'Dual MIT/GPL'}\n")
        set_output(node, "driver_smi", f"{version}\n")
        set_output(node, "doctor_kernels", f"kernel {K} headers /lib/modules/{K}/updates/dkms/nvidia.ko\n"
                                           f"dkms nvidia/{version}, {K}, x86_64: installed\n")
    return mutate


def _unattended(node: FakeNode) -> None:
    set_output(node, "doctor_auto_upgrade", 'apt APT::Periodic::Unattended-Upgrade "1";\n'
                                            'apt Unattended-Upgrade::Package-Blacklist "";\n'
                                            "installed unattended-upgrades\n")
    found = installed(node)
    found.update({"nvidia-utils-580": "580.95.05-0ubuntu1", "libnvidia-compute-580": "580.95.05-0ubuntu1"})
    packages(node, found)


def _fm_removed(node: FakeNode) -> None:
    found = installed(node)
    del found["nvidia-fabricmanager"]
    packages(node, found)
    units(node, {"docker.service": ("active", "enabled"), "containerd.service": ("active", "enabled")})


def _fm_version(node: FakeNode) -> None:
    found = installed(node)
    found["nvidia-fabricmanager"] = "580.105.08-1"
    packages(node, found)


def _fm_failed(node: FakeNode) -> None:
    units(node, {"docker.service": ("active", "enabled"), "containerd.service": ("active", "enabled"),
                 "nvidia-fabricmanager.service": ("failed", "enabled")})
    set_output(node, "fabricmanager_log", "[ERROR] fabric manager NVIDIA GPU driver interface version 580.95.05 don't "
                                          "match with driver version 580.82.07. Please update with matching NVIDIA "
                                          "driver package.\n")


def _health(**kwargs: object) -> Mutation:
    return lambda node: set_output(node, "doctor_gpu_health", smi_health(["0000:18:00.0"], **kwargs))  # type: ignore[arg-type]


def _gsp_timeouts_proprietary(node: FakeNode) -> None:
    _old_branch(V, "proprietary")(node)
    _fixture_log("dmesg_xid-119_gsp-rpc-timeout_dell-xe9680.log")(node)


def _mig_lost(node: FakeNode) -> None:
    _mig_enabled(node)
    set_output(node, "doctor_mig", smi_list(["NVIDIA H100 80GB HBM3"]))


def _mig_configured(node: FakeNode) -> None:
    _mig_enabled(node)
    set_output(node, "doctor_mig", smi_list(["NVIDIA H100 80GB HBM3"], {0: ["1g.10gb"] * 3}) +
               "@selected all-1g.10gb\n@config\nversion: v1\nmig-configs:\n  all-disabled:\n    - devices: all\n"
               "      mig-enabled: false\n  all-1g.10gb:\n    - devices: all\n      mig-enabled: true\n"
               "      mig-devices:\n        \"1g.10gb\": 7\n")


def _mig_enabled(node: FakeNode) -> None:
    set_output(node, "doctor_gpus", smi_q(["0000:18:00.0"], "NVIDIA H100 80GB HBM3", mig=("Enabled", "Enabled")))


def _upgrades(lines: str) -> Mutation:
    return lambda node: set_output(node, "doctor_upgrades", lines)


# (check, expected status, node factory, mutation, other checks allowed to warn)
VARIANTS: list[tuple[str, str, Callable[[], FakeNode], Mutation, set[str]]] = [
    ("hw.vgpu", "warn", finished, _vgpu_unlicensed, set()),
    ("hw.vgpu", "fail", finished, lambda n: (_unload(n), _kernel_log(
        "[    4.0] NVRM: GPU 0000:00:1e.0: this vGPU guest needs the GRID driver (constructed line)\n")(n)), set()),
    ("hw.mig-mode", "warn", finished, _mig_pending, set()),
    ("hw.passthrough-bars", "fail", finished, lambda n: set_output(n, "virt", virt_output(
        ["0000:18:00.0"], "vmware", "VMware, Inc.", "VMware7,1",
        bar1="0x0000000000000000 0x0000000000000000 0x0000000000000000")), set()),
    ("hw.bar1-size", "warn", finished, lambda n: set_output(n, "virt", virt_output(
        ["0000:18:00.0"], bar1="0x00000000c0000000 0x00000000cfffffff 0x000000000014220c") + "~rebar=0x3f00\n"), set()),
    ("hw.iommu", "fail", finished, lambda n: set_output(n, "virt", "iommu_groups=0\n" + virt_output(
        ["0000:18:00.0"]) + "~driver=vfio-pci\n"), set()),
    ("hw.vgpu-driver-mode", "warn", finished, lambda n: set_output(n, "doctor_gpus", smi_q(
        ["0000:18:00.0"], license="Unlicensed (Unrestricted)")), set()),
    ("boot.secure-boot", "fail", finished, _secure_boot_unsigned, set()),
    ("kernel.nouveau-loaded", "fail", finished, lambda n: n.modules.add("nouveau"), set()),
    ("kernel.nouveau-blacklisted", "warn", finished,
     lambda n: n.files.pop("/etc/modprobe.d/blacklist-nouveau.conf"), set()),
    ("kernel.nouveau-initramfs", "fail", finished, _initramfs_stale, set()),
    ("kernel.headers", "fail", finished, lambda n: set_output(n, "kernel_headers", ""), set()),
    ("kernel.dkms-newest-kernel", "fail", finished, _new_kernel, set()),
    ("driver.loaded", "fail", finished, _unload, set()),
    ("driver.single-source", "fail", finished, _both_sources, set()),
    ("driver.packages-held", "fail", finished, _packages_moved, set()),
    ("driver.version-mismatch", "fail", finished, _mismatch, set()),
    ("driver.smi", "fail", finished, lambda n: set_output(n, "driver_smi", "No devices were found", 6), set()),
    ("driver.persistence", "warn", finished, _persistence_off, set()),
    ("driver.branch-supports-gpu", "fail", lambda: finished(0x15F8, flavour="proprietary"), _old_branch("590.48.01"),
     set()),
    ("driver.module-flavour", "fail", lambda: finished(0x2901), _old_branch(V, "proprietary"), set()),
    ("driver.branch-lifecycle", "warn", finished, _old_branch("535.129.03"), set()),
    ("cuda.toolkit-vs-driver", "fail", lambda: finished(0x15F8, flavour="proprietary"), _cuda_toolkit("13.0.0"),
     set()),
    ("cuda.toolkit-vs-driver", "warn", finished, _cuda_toolkit("13.1.0"), set()),
    ("container.engine-present", "warn", finished, _no_engine, set()),
    ("container.toolkit-installed", "fail", finished, _toolkit_skew, set()),
    ("container.toolkit-installed", "fail", finished, _no_toolkit, set()),
    ("container.docker-version", "fail", finished, _engine_version("docker Docker version 18.09.7, build 2d0083d\n"),
     set()),
    ("container.docker-nvidia-runtime", "fail", finished, _daemon('{"log-driver": "journald"}'), set()),
    ("container.docker-nvidia-runtime", "fail", finished, _daemon('{"default-runtime": "nvidia",}'), set()),
    ("container.containerd-nvidia-runtime", "fail", finished, _orphan_dropin, set()),
    ("container.crio-nvidia-runtime", "fail", finished, _crio, set()),
    ("container.default-runtime", "fail", finished,
     _daemon('{"runtimes": {"nvidia": {"path": "nvidia-container-runtime", "args": []}}, '
             '"default-runtime": "nvidia-experimental"}'), set()),
    ("container.default-runtime", "warn", finished, lambda n: n.tools.add("kubelet"), set()),
    ("container.runtime-loaded", "fail", finished,  # daemon.json names nvidia; the running dockerd never restarted
     lambda n: set_output(n, "docker_loaded_runtimes", '"runc" {"runc":{"path":"runc"}}\n'), set()),
    ("container.runtime-loaded", "fail", finished,  # the daemon does not say; gpunode's journal owes a restart
     lambda n: set_output(n, "gpunode_pending_restarts", '{"runs": [], "pending": [{"effect": "restart", '
                          '"target": "containerd.service"}]}'), set()),
    ("container.snap-docker", "fail", finished, lambda n: n.put(c.SNAP_DOCKER_CONFIG, "{}"), set()),
    ("container.rootless-docker", "warn", finished,
     lambda n: n.put("/home/alice/.config/systemd/user/docker.service", "[Service]\n"), set()),
    ("container.dev-char-symlinks", "warn", finished, _dev_char_missing, set()),
    ("container.cdi-spec", "fail", finished, _podman, set()),
    ("container.cdi-spec", "fail", finished, _stale_cdi, set()),
    ("fabric.manager-installed", "fail", lambda: finished(H100, 8, switches=4), _fm_removed, set()),
    ("fabric.manager-version", "fail", lambda: finished(H100, 8, switches=4), _fm_version, set()),
    ("fabric.manager-active", "fail", lambda: finished(H100, 8, switches=4), _fm_failed, set()),
    ("health.xid", "fail", finished, _fixture_log("dmesg_xid-119_gsp-rpc-timeout_dell-xe9680.log"), set()),
    ("health.xid", "warn", finished, _kernel_log(
        "[ 1234.5] NVRM: Xid (PCI:0000:18:00): 13, pid=4242, name=python3, Graphics SM Warp Exception\n"), set()),
    ("health.driver-errors", "warn", finished,
     _fixture_log("dmesg_gpu-fallen-off-bus_no-xid_open-module-570.158.01.log"), set()),
    ("pkg.unattended-upgrades", "warn", finished, _unattended, set()),
    ("health.ecc", "fail", finished, _health(volatile_dram_uncorrectable=2, aggregate_dram_uncorrectable=2), set()),
    ("health.ecc", "warn", finished, _health(ecc=("Enabled", "Disabled")), set()),
    ("health.row-remapping", "fail", finished, _health(remap="0 1 Yes No"), set()),
    ("health.row-remapping", "fail", finished, _health(remap="0 8 No Yes"), set()),
    ("driver.gsp", "warn", finished, _gsp_timeouts_proprietary, {"health.xid"}),
    ("driver.uvm", "fail", finished, lambda n: n.modules.discard("nvidia_uvm"), set()),
    ("driver.uvm", "fail", finished, _dev_char_missing_uvm := lambda n: set_output(
        n, "doctor_dev_char", "dev /dev/nvidia0\ndev /dev/nvidiactl\nlink 195:0 ../nvidia0\nlink 195:255 ../nvidiactl\n"),
     set()),
    ("hw.mig-layout", "warn", lambda: finished(H100), _mig_lost, set()),
    ("hw.mig-layout", "warn", lambda: finished(H100), _mig_configured, set()),
    ("pkg.pending-upgrades", "warn", finished, _upgrades(
        "Inst libnvidia-compute-580 [580.95.05-0ubuntu1] (580.105.08-0ubuntu1 Ubuntu:22.04/jammy-updates [amd64])\n"),
     set()),
    ("pkg.pending-upgrades", "warn", finished, lambda n: (set_output(n, "doctor_kernels", f"kernel {K} headers "
                                                                      f"/lib/modules/{K}/kernel/nvidia.ko\n"),
                                                           _upgrades("Inst linux-image-5.15.0-92-generic "
                                                                     "(5.15.0-92.102 Ubuntu:22.04/jammy-updates "
                                                                     "[amd64])\n")(n)), set()),
]


@pytest.mark.parametrize("variant", VARIANTS, ids=[f"{v[0]}-{v[1]}-{i}" for i, v in enumerate(VARIANTS)])
def test_broken_variant_produces_exactly_that_check_with_its_fix(variant):
    check_id, expected, make, mutate, allowed_warnings = variant
    node = make()
    before = statuses(node)
    mutate(node)
    results = check_results(node)
    target = results[check_id]
    assert target.status == expected, target
    assert target.fix and target.evidence
    flagged = {i for i, r in results.items() if r.status in ("fail", "warn")}
    baseline_flagged = {i for i, s in before.items() if s in ("fail", "warn")}
    assert flagged - baseline_flagged - allowed_warnings == {check_id}, {i: results[i].evidence for i in flagged}
    for other, result in results.items():  # nothing else moved, except to skip (its precondition broke)
        if other != check_id and other not in allowed_warnings and result.status != before[other]:
            assert result.status == "skip", (other, before[other], result)


def test_every_check_has_a_broken_variant():
    assert {v[0] for v in VARIANTS} == {c.id for c in CHECKS} - {"hw.gpu-present"} - K8S_CHECKS  # gpu: test_no_gpu_...


# ---- what the evidence and fixes say -----------------------------------------------------------------------------


def test_xid_evidence_names_the_meaning_and_the_worst_fix_wins():
    node = finished()
    _kernel_log("[ 10.0] NVRM: Xid (PCI:0000:18:00): 13, pid=1, name=a, Graphics Exception\n"
                "[ 11.0] NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=a, GPU has fallen off the bus.\n"
                "[ 12.0] NVRM: Xid (PCI:0000:18:00): 48, pid=1, name=a, An uncorrectable double bit error\n")(node)
    result = check_results(node)["health.xid"]
    assert result.status == "fail" and result.fix == "sudo reboot"
    assert "Xid 79 on 0000:18:00: GPU has fallen off the bus" in result.evidence
    assert "Xid 48" in result.evidence and "double-bit" in result.evidence and "Xid 13" in result.evidence
    assert result.evidence.index("Xid 79") < result.evidence.index("Xid 13")


def test_unreadable_kernel_log_skips_with_how_to_read_it():
    node = finished()
    set_output(node, "doctor_kernel_log", None, 3)
    results = check_results(node)
    assert results["health.xid"].status == results["health.driver-errors"].status == "skip"
    assert "adm or systemd-journal group" in results["health.xid"].evidence


def test_branch_fix_names_a_driver_that_supports_the_gpu():
    node = finished(0x15F8, version="590.48.01", flavour="proprietary")
    result = check_results(node)["driver.branch-supports-gpu"]
    assert "R580 is the last driver branch for Pascal" in result.evidence
    assert result.fix.startswith("gpunode install --driver 580.")


def test_module_flavour_fix_asks_for_the_open_module():
    result = check_results(finished(0x2901, flavour="proprietary"))["driver.module-flavour"]
    assert result.fix == f"gpunode install --driver {V} --kernel-module open"
    assert "B200 (Blackwell) need(s) the open module" in result.evidence


def test_dkms_fix_installs_headers_then_builds_for_the_new_kernel():
    node = finished()
    _new_kernel(node)
    result = check_results(node)["kernel.dkms-newest-kernel"]
    assert result.evidence.startswith("the next boot runs 5.15.0-92-generic (running 5.15.0-91-generic) (the newest "
                                      "installed kernel: GRUB_DEFAULT=0 boots it), which has no nvidia module and no "
                                      "headers")
    assert result.fix == (f"gpunode install --driver {V}  # installs the headers of 5.15.0-92-generic if missing and "
                          "builds the nvidia module for it (DKMS)")


def test_dkms_fix_for_a_driver_gpunode_did_not_install_is_the_dkms_command():
    node = finished()
    set_output(node, "doctor_kernels", f"kernel {K} headers /lib/modules/{K}/updates/dkms/nvidia.ko image\n"
                                       "kernel 5.15.0-92-generic - - image\n"
                                       f"dkms nvidia/550.127.05, {K}, x86_64: installed\n")  # not the loaded version
    result = check_results(node)["kernel.dkms-newest-kernel"]
    assert result.fix == ("sudo apt-get install -y linux-headers-5.15.0-92-generic && "
                          "sudo dkms autoinstall -k 5.15.0-92-generic")


def test_next_boot_kernel_is_grubbys_default_not_the_newest():
    node = finished()
    set_output(node, "doctor_kernels", f"kernel {K} headers /lib/modules/{K}/updates/dkms/nvidia.ko image\n"
                                       "kernel 5.15.0-92-generic - - image\n"
                                       f"dkms nvidia/{V}, {K}, x86_64: installed\ngrubby /boot/vmlinuz-{K}\n")
    result = check_results(node)["kernel.dkms-newest-kernel"]
    assert result.status == "pass" and result.evidence.startswith(f"next boot runs {K} (grubby --default-kernel)")


def test_a_modules_tree_without_a_kernel_image_is_not_a_kernel():
    node = finished()
    set_output(node, "doctor_kernels", f"kernel {K} headers /lib/modules/{K}/updates/dkms/nvidia.ko image\n"
                                       "kernel 5.15.0-92-generic - - -\n"  # removed kernel, DKMS leftovers
                                       f"dkms nvidia/{V}, {K}, x86_64: installed\n")
    assert check_results(node)["kernel.dkms-newest-kernel"].status == "pass"


def test_dkms_built_module_for_the_new_kernel_passes():
    node = finished()
    set_output(node, "doctor_kernels", f"kernel {K} headers /lib/modules/{K}/updates/dkms/nvidia.ko\n"
                                       "kernel 5.15.0-100-generic headers -\n"
                                       f"dkms nvidia/{V}, {K}, x86_64: installed\n"
                                       f"dkms nvidia/{V}, 5.15.0-100-generic, x86_64: installed\n")
    result = check_results(node)["kernel.dkms-newest-kernel"]
    assert result.status == "pass" and "5.15.0-100-generic" in result.evidence


def test_containerd_drop_in_not_imported_is_named():
    node = finished()
    _orphan_dropin(node)
    result = check_results(node)["container.containerd-nvidia-runtime"]
    assert result.evidence.startswith("/etc/containerd/conf.d/99-nvidia.toml defines the nvidia runtime, but "
                                      "/etc/containerd/config.toml does not import it")
    assert result.fix == "gpunode install --only runtime --engine containerd"


def test_containerd_that_serves_only_docker_passes():
    node = finished()
    node.files.pop(c.CONTAINERD_DROPIN)
    node.put(c.CONTAINERD_CONFIG, 'disabled_plugins = ["cri"]\n')  # what docker's containerd.io package ships
    result = check_results(node)["container.containerd-nvidia-runtime"]
    assert result.status == "pass" and "disables the CRI plugin" in result.evidence


def test_invalid_daemon_json_is_a_failure_with_the_parse_error():
    node = finished()
    node.put(c.DOCKER_CONFIG, (FIXTURES / "docker-daemon-json" /
                               "default-runtime-nvidia_unindented_TRAILING-COMMA-INVALID.json").read_text())
    result = check_results(node)["container.docker-nvidia-runtime"]
    assert result.status == "fail" and "not valid JSON" in result.evidence and "refuses to start" in result.evidence


def test_unattended_upgrades_respects_holds_and_blacklist():
    node = finished()
    _unattended(node)
    result = check_results(node)["pkg.unattended-upgrades"]
    assert result.fix == "sudo apt-mark hold libnvidia-compute-580 nvidia-utils-580"
    set_output(node, "doctor_auto_upgrade", 'apt APT::Periodic::Unattended-Upgrade "1";\n'
                                            'apt Unattended-Upgrade::Package-Blacklist:: "nvidia-";\n'
                                            'apt Unattended-Upgrade::Package-Blacklist:: "libnvidia-";\n'
                                            "installed unattended-upgrades\n")
    assert check_results(node)["pkg.unattended-upgrades"].status == "pass"


def test_unattended_upgrades_from_files_when_apt_config_is_missing():
    node = finished()
    _unattended(node)
    set_output(node, "doctor_auto_upgrade",
               'file /etc/apt/apt.conf.d/20auto-upgrades\nAPT::Periodic::Update-Package-Lists "1";\n'
               'APT::Periodic::Unattended-Upgrade "1";\n\nfile /etc/apt/apt.conf.d/50unattended-upgrades\n'
               "Unattended-Upgrade::Package-Blacklist {\n    // \"vim\";\n    \"nvidia-utils-580\";\n};\n\n"
               "installed unattended-upgrades\n")
    result = check_results(node)["pkg.unattended-upgrades"]
    assert result.status == "warn" and result.fix == "sudo apt-mark hold libnvidia-compute-580"


def test_dnf_automatic_without_versionlock_warns():
    node = finished()
    node.os_release = node.os_release.replace("ID=ubuntu", "ID=rocky").replace("ID_LIKE=debian", 'ID_LIKE="rhel"')
    found = installed(node)
    found["nvidia-fabric-manager"] = "535.129.03-1"
    packages(node, found)
    set_output(node, "doctor_units", "dnf-automatic-install.timer\tactive\tenabled\n")
    result = check_results(node)["pkg.unattended-upgrades"]
    assert result.status == "warn" and result.fix == "sudo dnf versionlock add nvidia-fabric-manager"
    node.put("/etc/dnf/plugins/versionlock.list", "nvidia-fabric-manager-0:535.129.03-1.*\n")
    assert check_results(node)["pkg.unattended-upgrades"].status == "pass"


def test_branch_lifecycle_uses_the_nodes_date():
    node = finished()
    _old_branch("535.129.03")(node)
    assert check_results(node)["driver.branch-lifecycle"].status == "warn"
    set_output(node, "doctor_date", "2025-01-01\n")
    assert check_results(node)["driver.branch-lifecycle"].status == "pass"
    set_output(node, "doctor_date", None)
    assert check_results(node)["driver.branch-lifecycle"].status == "skip"


def test_mig_enabled_passes_and_names_mig_devices():
    node = finished()
    set_output(node, "doctor_gpus", smi_q(["0000:18:00.0"], "NVIDIA A100-SXM4-80GB", mig=("Enabled", "Enabled")))
    result = check_results(node)["hw.mig-mode"]
    assert result.status == "pass" and "MIG enabled on GPU 0" in result.evidence


def test_secure_boot_with_the_module_loaded_passes():
    node = finished()
    node.secure_boot = True
    assert check_results(node)["boot.secure-boot"].status == "pass"


def test_driver_loaded_defers_to_the_root_cause():
    node = finished()
    _unload(node)
    node.modules.add("nouveau")
    results = check_results(node)
    assert results["driver.loaded"].status == "skip" and "kernel.nouveau-loaded" in results["driver.loaded"].evidence
    assert results["kernel.nouveau-loaded"].status == "fail"


def test_every_failing_or_warning_check_says_what_to_run():
    for variant in VARIANTS:
        node = variant[2]()
        variant[3](node)
        for result in check_results(node).values():
            if result.status in ("fail", "warn"):
                assert result.fix, result


def test_results_serialise():
    data = [r.to_dict() for r in run_checks(gather(FakeConnection(finished()), FULL))]
    assert json.loads(json.dumps(data))[0] == {"id": "hw.gpu-present", "layer": "hardware",
                                               "title": "NVIDIA GPU present (PCI)", "status": "pass",
                                               "evidence": "1 NVIDIA GPU(s): Tesla T4 (Turing) at 0000:18:00.0",
                                               "fix": None, "reboot": False}


def test_containerd_under_docker_is_docker_s_backend_unless_kubelet_runs():
    node = finished()
    node.files.pop(c.CONTAINERD_DROPIN)
    node.files.pop(c.CONTAINERD_CONFIG)
    result = check_results(node)["container.containerd-nvidia-runtime"]
    assert result.status == "pass" and "runs under docker" in result.evidence
    node.tools.add("kubelet")
    result = check_results(node)["container.containerd-nvidia-runtime"]
    assert result.status == "fail" and result.fix == "gpunode install --only runtime --engine containerd"


def test_booted_into_a_kernel_without_the_module_fails_once():
    node = finished()
    _unload(node)
    set_output(node, "driver_module", "")  # modinfo finds no nvidia module for the running kernel
    set_output(node, "doctor_kernels", f"kernel {K} headers -\nkernel 5.15.0-90-generic headers "
                                       "/lib/modules/5.15.0-90-generic/updates/dkms/nvidia.ko\n")
    results = check_results(node)
    assert {i for i, r in results.items() if r.status == "fail"} == {"kernel.dkms-newest-kernel"}
    assert "kernel.dkms-newest-kernel" in results["driver.loaded"].evidence


def test_a_next_boot_kernel_whose_dkms_build_failed_is_not_fixed_by_building_again():
    """DKMS's make.log says the build for the next boot's kernel failed (the real one: Debian's open modules against
    a newer kernel's API, tests/realos): the evidence names the error and the log, and the fix keeps the running
    kernel instead of printing the same failing build."""
    node = finished()
    log = "/var/lib/dkms/nvidia/550.127.05/build/make.log"
    set_output(node, "doctor_kernels", f"kernel {K} headers /lib/modules/{K}/updates/dkms/nvidia.ko image\n"
                                       "kernel 5.15.0-92-generic headers - image\n"
                                       f"dkms nvidia/550.127.05, {K}, x86_64: installed\n"
                                       f"dkmsfail {log} | DKMS make.log for nvidia-550.127.05 for kernel "
                                       "5.15.0-92-generic (x86_64) | /var/lib/dkms/nvidia/550.127.05/build/nvidia/"
                                       "nv-pci.c:223:9: error: too few arguments to function 'pci_resize_resource'\n")
    result = check_results(node)["kernel.dkms-newest-kernel"]
    assert result.status == "fail"
    assert "DKMS's build of nvidia-550.127.05 for it failed (nvidia/nv-pci.c:223:9: error: too few arguments to " \
           f"function 'pci_resize_resource'; {log})" in result.evidence
    assert result.fix == ("sudo apt-get remove linux-image-5.15.0-92-generic linux-headers-5.15.0-92-generic  # the "
                          f"next boot stays on {K}, until a driver release builds for 5.15.0-92-generic")
