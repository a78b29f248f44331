"""Issue 14's doctor checks on node-simulator nodes, over SSH through the real CLI (`gpunode doctor --host ...`).

Each check gets every verdict it has (pass, warn, fail; some checks have no warn or no fail: then the other
outcomes it does have) from node state the simulator renders the way the real tools print it: `nvidia-smi -q`
ECC / retired-page / remapped-row / GSP / MIG blocks and `nvidia-smi -L` MIG devices (tests/nodesim
node_files/lib/smiqtext.awk), the kernel log (dmesg), `apt-get -s dist-upgrade` and `dnf check-update` over
package versions offered to the node's catalog. Then every `--format` on one finished node and the same node
broken.

The GPU nodes here have the driver preinstalled (`.run`, loaded) instead of a full `gpunode install`, except the
finished node of the format tests (test_doctor_nodesim's `finish`).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner

from gpunode.cli import app
from tests.conftest import FIXTURES
from tests.doctor.test_verdict import _parse as parse_metrics
from tests.integration.test_doctor_nodesim import KMSG, V, finish, mirror  # noqa: F401 - mirror is a pytest fixture
from tests.nodesim import SimNode, get_profile
from tests.nodesim.fixtures import host_guard, nodesim_available, sim_node  # noqa: F401 - pytest fixtures

pytestmark = pytest.mark.integration

cli = CliRunner()
STATE = "var/lib/nodesim"
KEPT = (f"{STATE}/gpuhealth", f"{STATE}/gpus", f"{STATE}/catalog", f"{STATE}/pkgdb", f"{STATE}/dmesg",
        f"{STATE}/pkgfiles/linux-generic", "/var/lib/dpkg/status", "/etc/systemd/system/nvidia-mig-manager.service",
        "/etc/nvidia-mig-manager/config.yaml", KMSG)
XID_119 = (FIXTURES / "errors" / "dmesg_xid-119_gsp-rpc-timeout_dell-xe9680.log").read_text()
MIG_CONFIG = """version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false

  # GPU 0 split for inference, the rest whole
  inference:
    - devices: [0]
      mig-enabled: true
      mig-devices:
        "3g.40gb": 1
        "1g.10gb": 2
    - devices: [1,2,3,4,5,6,7]
      mig-enabled: false
"""
MIG_UNIT = """[Unit]
Description=Apply the MIG configuration at boot
[Service]
Type=oneshot
Environment="MIG_PARTED_CONFIG_FILE=/etc/nvidia-mig-manager/config.yaml"
Environment="MIG_PARTED_SELECTED_CONFIG=inference"
ExecStart=/usr/bin/nvidia-mig-parted apply
[Install]
WantedBy=multi-user.target
"""


def on_node(fix: str) -> str:
    """The node command of a fix: for a remote node gpunode prints it as `ssh ... HOST "COMMAND"  # note`."""
    if not fix.startswith("ssh "):
        return fix
    words = shlex.split(fix, comments=True)
    assert words[:2] == ["ssh", "-t"], fix
    return words[-1]


def doctor(node: SimNode, *extra: str) -> tuple[int, dict[str, dict]]:
    result = cli.invoke(app, ["doctor", *node.cli_args(), "--json", *extra])
    assert result.exit_code in (0, 1), result.output
    data = json.loads(result.stdout)
    return result.exit_code, {c["id"]: c for c in data["checks"]}


def check(node: SimNode, check_id: str) -> dict:
    return doctor(node)[1][check_id]


def _start(profile: str, **overrides) -> SimNode:
    return SimNode(get_profile(profile, nouveau_loaded=False, **overrides)).start()


@pytest.fixture(scope="module")
def a100_node(nodesim_available: bool) -> Iterator[SimNode]:  # noqa: F811
    """8 x A100 (Ampere: remapped rows, MIG-capable), open module 580 (GSP always on), apt."""
    node = _start("ubuntu-22.04-a100x8", preinstalled_driver=V, driver_flavor="open")
    yield node
    node.stop()


@pytest.fixture(scope="module")
def t4_node(nodesim_available: bool) -> Iterator[SimNode]:  # noqa: F811
    """1 x T4 (Turing: page retirement, no row remapping, no MIG), proprietary module (GSP optional)."""
    node = _start("ubuntu-22.04-t4", preinstalled_driver="570.195.03", driver_flavor="proprietary")
    yield node
    node.stop()


def _restoring(node: SimNode) -> Iterator[SimNode]:
    """The node as the test found it afterwards: health knobs, catalog, package db, kernel log, MIG files."""
    saved = {path: node.read_bytes(path) if node.exists(path) else None for path in KEPT}
    modules = node.loaded_modules()
    uvm_node = node.exists("/dev/nvidia-uvm")
    yield node
    for path, data in saved.items():
        if data is None:
            if node.exists(path):
                node.remove(path)
        else:
            node.write(path, data)
    node.set_module_loaded("nvidia_uvm", "nvidia_uvm" in modules)
    if uvm_node and not node.exists("/dev/nvidia-uvm"):
        node.write("/dev/nvidia-uvm", "")


@pytest.fixture
def a100(a100_node: SimNode) -> Iterator[SimNode]:
    yield from _restoring(a100_node)


@pytest.fixture
def t4(t4_node: SimNode) -> Iterator[SimNode]:
    yield from _restoring(t4_node)


# ---- health.ecc ------------------------------------------------------------------------------------------------


def test_ecc_pass(a100):
    result = check(a100, "health.ecc")
    assert (result["status"], result["evidence"]) == ("pass", "ECC enabled on 8 GPU(s), no uncorrectable errors")


def test_ecc_pass_with_uncorrectable_errors_from_an_earlier_boot_only(a100):
    a100.set_gpu_health(3, agg_dram_unc=4)
    result = check(a100, "health.ecc")
    assert result["status"] == "pass"
    assert "GPU 3 (0004:00:00.0): 4 over its life" in result["evidence"]


def test_ecc_warn_when_disabled(t4):
    t4.set_gpu_health(0, ecc="Disabled")
    result = check(t4, "health.ecc")
    assert result["status"] == "warn"
    assert result["evidence"].startswith("ECC is disabled on GPU 0 (0000:00:1e.0)")
    assert on_node(result["fix"]) == "sudo nvidia-smi -e 1 && sudo reboot"


def test_ecc_warn_when_a_mode_change_waits_for_a_reboot(a100):
    a100.set_gpu_health(5, ecc_pending="Disabled")
    result = check(a100, "health.ecc")
    assert result["status"] == "warn"
    assert "GPU 5 (000c:00:00.0): ECC Enabled, pending Disabled" in result["evidence"]
    assert result["reboot"] is True


def test_ecc_fail_on_uncorrectable_errors_since_the_driver_loaded(a100):
    a100.set_gpu_health(0, vol_dram_unc=2, agg_dram_unc=2)
    a100.set_gpu_health(6, vol_sram_unc=1, agg_sram_unc=1)
    code, checks = doctor(a100)
    result = checks["health.ecc"]
    assert code == 1 and result["status"] == "fail"
    assert "GPU 0 (0001:00:00.0): 2 uncorrectable ECC error(s)" in result["evidence"]
    assert "GPU 6 (000d:00:00.0): 1 uncorrectable ECC error(s)" in result["evidence"]
    assert result["fix"].startswith("drain the node")


def test_ecc_on_a_board_without_ecc_memory(sim_node):  # noqa: F811
    node = sim_node("ubuntu-22.04-rtx4090", preinstalled_driver=V, nouveau_loaded=False)
    node.set_gpu_health(ecc="N/A")
    assert check(node, "health.ecc")["evidence"] == "these GPUs have no ECC memory (ECC Mode N/A)"


# ---- health.row-remapping (no warn: a pending remap fails, one in effect passes) --------------------------------


def test_row_remapping_pass(a100):
    result = check(a100, "health.row-remapping")
    assert (result["status"], result["evidence"]) == ("pass", "no pending row remap or page retirement on 8 GPU(s)")


def test_row_remapping_pass_when_earlier_remaps_are_in_effect(a100):
    a100.set_gpu_health(2, remap_unc=3, remap_cor=1)
    result = check(a100, "health.row-remapping")
    assert (result["status"], result["evidence"]) == ("pass", "rows remapped earlier and in effect: GPU 2 "
                                                              "(0003:00:00.0): 3")


def test_row_remapping_fail_while_a_remap_is_pending(a100):
    a100.set_gpu_health(1, remap_unc=1, remap_pending=True)
    result = check(a100, "health.row-remapping")
    assert result["status"] == "fail" and result["reboot"] is True
    assert result["evidence"] == ("GPU 1 (0002:00:00.0): row remap pending: the GPU needs a reset before it takes "
                                  "jobs")


def test_row_remapping_fail_when_no_spare_row_is_left(a100):
    a100.set_gpu_health(7, remap_unc=640, remap_failed=True)
    result = check(a100, "health.row-remapping")
    assert result["status"] == "fail"
    assert result["evidence"].startswith("row remapping failed on GPU 7 (000e:00:00.0)")
    assert "RMA" in result["fix"]


def test_page_retirement_pending_on_a_turing_gpu_fails(t4):
    t4.set_gpu_health(0, retired_dbe=1, retired_pending=True)
    result = check(t4, "health.row-remapping")
    assert result["status"] == "fail"
    assert result["evidence"].startswith("GPU 0 (0000:00:1e.0): page retirement pending")


def test_page_retirement_reported_on_a_turing_gpu_passes(t4):
    result = check(t4, "health.row-remapping")
    assert (result["status"], result["evidence"]) == ("pass", "no pending row remap or page retirement on 1 GPU(s)")


# ---- driver.gsp (no fail: GSP trouble with the open module is health.xid's; with the proprietary one, warn) -----


def test_gsp_pass_with_the_open_module(a100):
    result = check(a100, "driver.gsp")
    assert (result["status"], result["evidence"]) == ("pass", f"GSP firmware {V} on 8 GPU(s), no GSP errors since "
                                                              "boot")


def test_gsp_pass_when_the_proprietary_module_does_not_use_it(t4):
    result = check(t4, "driver.gsp")
    assert result["status"] == "pass" and result["evidence"].startswith("GSP firmware not in use")


def test_gsp_warn_on_gsp_timeouts_with_the_proprietary_module(t4):
    t4.set_gpu_health(0, gsp=True)
    t4.add_kernel_log(XID_119)
    code, checks = doctor(t4)
    result = checks["driver.gsp"]
    assert result["status"] == "warn" and result["reboot"] is True
    assert "NVreg_EnableGpuFirmware=0" in result["fix"]
    assert checks["health.xid"]["status"] == "fail"


def test_gsp_timeouts_with_the_open_module_are_left_to_health_xid(a100):
    a100.add_kernel_log(XID_119)
    _, checks = doctor(a100)
    assert checks["driver.gsp"]["status"] == "skip"
    assert "the open module cannot run without GSP" in checks["driver.gsp"]["evidence"]
    assert checks["health.xid"]["status"] == "fail"


# ---- driver.uvm (no warn) ---------------------------------------------------------------------------------------


def test_uvm_pass(a100):
    result = check(a100, "driver.uvm")
    assert (result["status"], result["evidence"]) == ("pass", "nvidia_uvm loaded, /dev/nvidia-uvm present")


def test_uvm_fail_when_the_module_is_not_loaded(a100):
    a100.set_module_loaded("nvidia_uvm", False)
    result = check(a100, "driver.uvm")
    assert result["status"] == "fail"
    assert "gpunode install --host " in result["fix"] and "--only nodesettings" in result["fix"]


def test_uvm_fail_without_the_device_node(a100):
    a100.remove("/dev/nvidia-uvm")
    result = check(a100, "driver.uvm")
    assert result["status"] == "fail"
    assert result["evidence"].startswith("nvidia_uvm is loaded but /dev/nvidia-uvm does not exist")


# ---- hw.mig-layout (no fail: a wrong layout warns) -------------------------------------------------------------


def _mig_manager(node: SimNode) -> None:
    node.write("/etc/nvidia-mig-manager/config.yaml", MIG_CONFIG)
    node.write("/etc/systemd/system/nvidia-mig-manager.service", MIG_UNIT)


def test_mig_layout_pass_without_mig(a100):
    result = check(a100, "hw.mig-layout")
    assert (result["status"], result["evidence"]) == ("pass", "MIG is not enabled; no MIG layout configured")


def test_mig_layout_pass_when_it_is_the_configured_one(a100):
    _mig_manager(a100)
    a100.set_mig(0, True, ("3g.40gb", "1g.10gb", "1g.10gb"))
    result = check(a100, "hw.mig-layout")
    assert (result["status"], result["evidence"]) == ("pass", "MIG layout matches mig-parted's 'inference'")


def test_mig_layout_warn_when_it_differs_from_the_configured_one(a100):
    _mig_manager(a100)
    a100.set_mig(0, True, ("3g.40gb",))  # as after a reboot that recreated only part of it
    result = check(a100, "hw.mig-layout")
    assert result["status"] == "warn"
    assert result["evidence"] == ("MIG layout differs from mig-parted's 'inference': GPU 0: 1 x 3g.40gb, "
                                  "configured 2 x 1g.10gb, 1 x 3g.40gb")
    assert "nvidia-mig-parted apply" in result["fix"] and "-c inference" in result["fix"]


def test_mig_layout_warn_when_mig_is_on_but_no_instance_survived_the_reboot(a100):
    a100.set_mig(4, True)
    result = check(a100, "hw.mig-layout")
    assert result["status"] == "warn"
    assert result["evidence"].startswith("MIG is enabled on GPU 4 but it has no MIG device")
    assert on_node(result["fix"]).startswith("sudo nvidia-smi mig -i 4 -cgi")


def test_mig_layout_warn_when_nothing_recreates_the_instances(a100):
    a100.set_mig(1, True, ("7g.80gb",))
    result = check(a100, "hw.mig-layout")
    assert result["status"] == "warn"
    assert result["evidence"].startswith("MIG devices now (GPU 1: 1) but no mig-parted configuration is selected")


# ---- hw.mig-mode (existing check, reachable now that the simulator has MIG) ----------------------------------------


def test_mig_mode_pass_when_enabled(a100):
    a100.set_mig(0, True, ("7g.80gb",))
    result = check(a100, "hw.mig-mode")
    assert result["status"] == "pass" and result["evidence"].startswith("MIG enabled on GPU 0:")


def test_mig_mode_warn_while_a_change_waits_for_a_gpu_reset(a100):
    a100.set_mig(3, False, pending=True)
    result = check(a100, "hw.mig-mode")
    assert result["status"] == "warn" and result["reboot"] is True
    assert result["evidence"].startswith("GPU 3 (0004:00:00.0): MIG Disabled, pending Enabled")
    assert on_node(result["fix"]).startswith("sudo nvidia-smi -r -i 3")


# ---- pkg.pending-upgrades (no fail: the node works until the upgrade runs) ---------------------------------------


def test_pending_upgrades_pass_with_none(a100):
    result = check(a100, "pkg.pending-upgrades")
    assert (result["status"], result["evidence"]) == ("pass", "no pending upgrades")


def test_pending_upgrades_pass_when_none_touches_the_driver(a100):
    a100.offer_package("curl", "7.81.0-1ubuntu1.20")
    result = check(a100, "pkg.pending-upgrades")
    assert (result["status"], result["evidence"]) == ("pass", "1 pending upgrade(s); none changes the driver")


def test_pending_upgrades_warn_on_a_new_kernel_without_dkms(a100):
    a100.offer_kernel_upgrade("5.15.0-92-generic")
    result = check(a100, "pkg.pending-upgrades")
    assert result["status"] == "warn"
    assert result["evidence"].startswith("the next upgrade installs kernel 5.15.0-92-generic and the nvidia module "
                                         "is not built by DKMS")
    assert f"gpunode install --host root@127.0.0.1:{a100.port} " in result["fix"]


def test_pending_kernel_upgrade_names_the_kernel_not_the_metapackage(sim_node):  # noqa: F811
    """Debian's apt-get -s dist-upgrade lists linux-image-amd64 (the metapackage) next to the new image."""
    node = sim_node("debian-12-t4", preinstalled_driver=V, nouveau_loaded=False)
    node.offer_kernel_upgrade("6.1.0-21-amd64")
    result = check(node, "pkg.pending-upgrades")
    assert result["status"] == "warn"
    assert result["evidence"].startswith("the next upgrade installs kernel 6.1.0-21-amd64 and")


@pytest.fixture
def rocky_dkms(sim_node) -> SimNode:  # noqa: F811
    """Rocky 9 with NVIDIA's DKMS driver package (570) installed and loaded; the CUDA repository not configured."""
    node = sim_node("rocky-9-t4", nouveau_loaded=False)
    node.install_package("nvidia-driver-570.195.03-1.el9")
    node.set_module_loaded("nvidia", True)
    node.set_module_loaded("nvidia_uvm", True)
    return node


CUDA_REPO = ("[cuda-rhel9-x86_64]\nname=cuda-rhel9-x86_64\n"
             "baseurl=https://developer.download.nvidia.com/compute/cuda/repos/rhel9/x86_64\nenabled=1\n")


def test_pending_upgrades_warn_when_the_driver_would_change_under_the_loaded_module(rocky_dkms):
    rocky_dkms.write("/etc/yum.repos.d/cuda-rhel9.repo", CUDA_REPO)
    result = check(rocky_dkms, "pkg.pending-upgrades")
    assert result["status"] == "warn"
    assert "nvidia-driver 590.48.01-1.el9" in result["evidence"]
    assert on_node(result["fix"]).startswith("sudo dnf versionlock add ") and "nvidia-driver" in on_node(result["fix"])


def test_pending_upgrades_pass_when_dkms_builds_for_the_new_kernel(rocky_dkms):
    rocky_dkms.offer_kernel_upgrade("5.14.0-427.13.1.el9_4.x86_64", headers=True)
    result = check(rocky_dkms, "pkg.pending-upgrades")
    assert result["status"] == "pass"
    assert "new kernel 5.14.0-427.13.1.el9_4; DKMS will build the nvidia module for it" in result["evidence"]


def test_pending_upgrades_warn_when_the_new_kernel_comes_without_headers(rocky_dkms):
    rocky_dkms.offer_kernel_upgrade("5.14.0-427.13.1.el9_4.x86_64", headers=False)
    result = check(rocky_dkms, "pkg.pending-upgrades")
    assert result["status"] == "warn"
    assert "without its headers: DKMS cannot build the nvidia module" in result["evidence"]
    assert on_node(result["fix"]).startswith("sudo dnf install -y kernel-devel")


# ---- output formats on one finished node and the same node broken -------------------------------------------------


@pytest.fixture(scope="module")
def finished(mirror) -> Iterator[SimNode]:  # noqa: F811
    """Installed by `gpunode install`, then rebooted: nvidia_uvm is loaded at boot, not by the .run installer
    (straight after the install driver.uvm fails: see the report of this branch)."""
    node = finish(mirror, "ubuntu-22.04-t4")
    try:
        node.reboot()
    except BaseException:
        node.stop()
        raise
    yield node
    node.stop()


@pytest.fixture(params=["finished", "broken"])
def state(request, finished) -> Iterator[tuple[SimNode, bool]]:
    """(node, broken): broken = an uncorrectable ECC error since the driver loaded (fails, and a reset clears
    the counter) and an Xid 119 in the kernel log."""
    broken = request.param == "broken"
    restore = _restoring(finished)
    next(restore)
    if broken:
        finished.set_gpu_health(0, vol_dram_unc=1, agg_dram_unc=1)
        finished.write(KMSG, (finished.read(KMSG) or "") + XID_119)  # finish() gave it a dmesg printing KMSG
    yield finished, broken
    next(restore, None)


def _host(node: SimNode) -> str:
    return f"root@127.0.0.1:{node.port}"


def test_format_json(state):
    node, broken = state
    result = cli.invoke(app, ["doctor", *node.cli_args(), "--format", "json"])
    data = json.loads(result.stdout)
    assert result.exit_code == data["exit_code"] == (1 if broken else 0)
    readiness = data["readiness"]
    assert readiness["ready"] is (not broken) and readiness["reboot_required"] is broken
    statuses = {c["id"]: c["status"] for c in data["checks"]}
    assert statuses["health.ecc"] == ("fail" if broken else "pass")
    assert statuses["health.xid"] == ("fail" if broken else "pass")


def test_format_nhc(state):
    node, broken = state
    result = cli.invoke(app, ["doctor", *node.cli_args(), "--format", "nhc"])
    assert result.exit_code == (1 if broken else 0), result.output
    lines = result.stdout.splitlines()
    if not broken:
        assert lines == []
        return
    assert len(lines) == 1
    line = lines[0]
    assert line.isascii() and line.isprintable()
    prefix = f"ERROR: gpunode: {_host(node)}: "
    assert line.startswith(prefix)
    first, _, rest = line[len(prefix):].partition(": ")
    assert first in ("health.xid", "health.ecc") and rest
    assert line.endswith("(+1 more)")


def test_format_prometheus(state):
    node, broken = state
    result = cli.invoke(app, ["doctor", *node.cli_args(), "--format", "prometheus"])
    assert result.exit_code == (1 if broken else 0), result.output
    metrics = parse_metrics(result.stdout)
    assert metrics["gpunode_node_ready"] == [({}, 0.0 if broken else 1.0)]
    assert metrics["gpunode_reboot_required"] == [({}, 1.0 if broken else 0.0)]
    status = {(labels["check"], labels["severity"]): value for labels, value in metrics["gpunode_check_status"]}
    assert status[("health.ecc", "fail")] == (1.0 if broken else 0.0)
    assert status[("health.ecc", "pass")] == (0.0 if broken else 1.0)
    checks = {check for check, _ in status}
    for check_id in checks:  # exactly one severity per check
        assert sum(v for (c, _), v in status.items() if c == check_id) == 1.0
    xids = {labels["xid"]: value for labels, value in metrics.get("gpunode_xid_errors_total", [])}
    assert (xids.get("119", 0) > 0) is broken
    assert len(metrics["gpunode_doctor_last_run_timestamp_seconds"]) == 1


def test_format_k8s_for_a_remote_node_prints_and_writes_nothing(state, tmp_path):
    node, broken = state
    ready_file, marker = tmp_path / "gpu-ready.json", tmp_path / "reboot-required"
    result = cli.invoke(app, ["doctor", *node.cli_args(), "--format", "k8s", "--ready-file", str(ready_file),
                              "--reboot-marker", str(marker)])
    assert result.exit_code == (1 if broken else 0), result.output
    document = json.loads(result.stdout)
    assert document["ready"] is (not broken) and document["reboot_required"] is broken
    assert document["host"] == _host(node)
    assert ("health.ecc" in document["failing"]) is broken
    assert ("health.ecc" in document["reboot_because"]) is broken
    assert not ready_file.exists() and not marker.exists()
    assert "the node is remote" in result.stderr


def test_format_textfile_is_not_written_for_a_remote_node(state, tmp_path):
    node, _ = state
    textfile = tmp_path / "gpunode.prom"
    result = cli.invoke(app, ["doctor", *node.cli_args(), "--format", "prometheus", "--textfile", str(textfile)])
    assert not textfile.exists()
    parse_metrics(result.stdout)

