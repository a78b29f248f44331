"""The driver step: plans from facts (idempotency, flavour, Secure Boot, distro packages, mismatch), the
installer's flags, failure explanations from real installer output, and applying on a fake node."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

import pytest

from gpunode import compat, gpus
from gpunode.actions.driver import FetchInstaller, RunInstaller, explain_failure
from gpunode.artifacts import DownloadError
from gpunode.errors import CommandError
from gpunode.facts import Facts
from gpunode.facts.kernel import PciDevice, SecureBoot, parse_nvidia_version
from gpunode.facts.osinfo import parse_os_release
from gpunode.facts.probe import Section
from gpunode.options import Options
from gpunode.plan import Earlier, Reboot, RunCommand, Status, change
from gpunode.steps import driver
from tests.conftest import FIXTURES
from tests.fakes.connection import FakeConnection, FakeNode
from tests.fakes.runfile import build_run

UBUNTU = parse_os_release('ID=ubuntu\nID_LIKE=debian\nVERSION_ID="22.04"\nPRETTY_NAME="Ubuntu 22.04.5 LTS"\n')
V = "535.129.03"
T4 = 0x1EB8


def gpu(device: int, n: int = 0) -> PciDevice:
    return PciDevice(f"0000:{0x17 + n:02x}:00.0", 0x10DE, device, 0x030200)


def loaded(version: str = V, open_module: bool = False) -> str:
    kind = "Open Kernel Module for x86_64" if open_module else "x86_64 Kernel Module"
    return f"NVRM version: NVIDIA UNIX {kind}  {version}  Thu Oct 19 18:56:32 UTC 2023\n"


def facts(devices=(T4,), **changes) -> Facts:
    base = Facts(os=UBUNTU, kernel="5.15.0-91-generic", arch="x86_64",
                 pci=tuple(gpu(d, i) for i, d in enumerate(devices)), secure_boot=SecureBoot(True, False, "efivar 0"))
    return dataclasses.replace(base, **changes)


def installed(version: str = V, *, load: bool = True, smi: tuple[str, int] | None = None, flavour: str = "NVIDIA",
              **changes) -> Facts:
    """A node where the .run installed `version` (and loaded it, unless load=False)."""
    outs = {
        "driver_userspace": Section(f"lib /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1\n"
                                    f"lib /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{version}\n"
                                    f"installer nvidia-installer:  version {version}\n", 0),
        "driver_module": Section(f"version:        {version}\nlicense:        {flavour}\n", 0),
        "driver_smi": Section(*(smi or (f"{version}\n", 0))),
    }
    return facts(loaded_driver=parse_nvidia_version(loaded(version, flavour != "NVIDIA")) if load else None,
                 outputs=outs, **changes)


def plan(f: Facts, options: Options | None = None, earlier=None):
    return driver.plan(f, options or Options(driver=V), earlier or {})


# -- flavour on a table of real GPUs (PCI device ids from pci.ids) ------------------------------------------
@pytest.mark.parametrize("devices, version, flavour, flag", [
    ((0x1EB8,), "535.129.03", "proprietary", "kernel"),  # Tesla T4, Turing: R535 defaults to proprietary
    ((0x1EB8,), "570.124.06", "open", "kernel-open"),  # T4 from R560: open
    ((0x20B2,), "550.54.15", "proprietary", "kernel"),  # A100 SXM4 80GB
    ((0x2330,), "580.65.06", "open", "kernel-open"),  # H100 SXM5
    ((0x2342,), "550.54.15", "open", "kernel-open"),  # GH200: Grace Hopper needs open
    ((0x2901,), "570.124.06", "open", "kernel-open"),  # B200: Blackwell needs open
    ((0x2684,), "565.57.01", "open", "kernel-open"),  # RTX 4090, Ada
    ((0x27B8,), "535.129.03", "proprietary", "kernel"),  # L4
    ((0x1DB4,), "570.124.06", "proprietary", "kernel"),  # V100: open needs Turing or newer
    ((0x15F8,), "535.129.03", "proprietary", "kernel"),  # P100
    ((0x13F2,), "535.129.03", "proprietary", "kernel"),  # M60
    ((0x1DB4, 0x1EB8), "570.124.06", "proprietary", "kernel"),  # V100 + T4: a mix -> proprietary
    ((0x102D,), "470.256.02", "proprietary", None),  # K80 on R470: one flavour only, no -m
])
def test_flavour_per_gpu(devices, version, flavour, flag):
    choice = driver.choose_flavour(list(devices), version, None)
    assert isinstance(choice, driver.Flavour), choice
    assert (choice.flavour, choice.flag) == (flavour, flag)


def test_a_mix_that_needs_both_flavours_is_refused():
    assert "no single NVIDIA module drives both" in driver.choose_flavour([0x2901, 0x1DB4], "570.124.06", None)


@pytest.mark.parametrize("devices, version, override, problem", [
    ((0x2901,), "570.124.06", "proprietary", "need the open module"),
    ((0x1DB4,), "570.124.06", "open", "cannot use the open module"),
    ((0x2901,), "470.256.02", None, "R470 has no open kernel module"),
])
def test_impossible_choices_are_refused(devices, version, override, problem):
    result = driver.choose_flavour(list(devices), version, override)
    assert isinstance(result, str) and problem in result


def test_override_wins_when_the_gpu_allows_it():
    choice = driver.choose_flavour([0x1EB8], "535.129.03", "open")
    assert isinstance(choice, driver.Flavour) and choice.flag == "kernel-open"
    assert choice.reason.startswith("--kernel-module open")


# -- installer flags --------------------------------------------------------------------------------------------
def test_installer_flags():
    choice = driver.Flavour("open", "", "kernel-open")
    assert driver.installer_flags("x86_64", choice, Options()) == (
        "--silent", "--dkms", "--tmpdir=/var/tmp", "--log-file-name=/var/log/nvidia-installer.log", "--no-x-check",
        "--no-install-compat32-libs", "-m=kernel-open")
    signed = driver.installer_flags("aarch64", driver.Flavour("proprietary", "", "kernel"), Options(
        module_signing_key="/root/mok.priv", module_signing_cert="/root/mok.der"))
    assert "--no-install-compat32-libs" not in signed and "-m=kernel" in signed
    assert signed[-2:] == ("--module-signing-secret-key=/root/mok.priv", "--module-signing-public-key=/root/mok.der")


# -- plans -------------------------------------------------------------------------------------------------------
def test_no_driver_requested_with_a_loaded_driver_or_no_gpu_is_ok():
    p = plan(installed(), Options())
    assert p.status is Status.OK and "535.129.03 (proprietary module) is loaded" in p.reason
    p = plan(facts(devices=()), Options())
    assert p.status is Status.OK and p.reason == "no NVIDIA GPU on this node: no driver to install"


def _recommended(p) -> str:
    words = shlex.split(p.fix.split("#")[0])
    assert words[:3] == ["gpunode", "install", "--driver"] and len(words) == 4, p.fix
    return words[3]


@pytest.mark.parametrize("device", [T4, 0x102D, 0x2901])  # Turing, Kepler (dropped after R470), Blackwell
def test_a_gpu_without_a_driver_is_blocked_with_a_driver_that_suits_it(device):
    p = plan(facts(devices=(device,)), Options())
    assert p.status is Status.BLOCKED
    assert "no NVIDIA driver, and no --driver was given" in p.reason and "container toolkit and no driver" in p.reason
    version = _recommended(p)
    gpu = gpus.lookup_id(device)
    assert gpu is not None and gpu.name in p.reason
    # the named release exists in the branch table and supports the GPU, module flavour included
    assert version in {str(b.latest_known) for b in compat.tables().branches.values()}
    assert compat.driver_supports(gpus.architecture_of(gpu), compat.parse_driver(version)) == (True, None)
    assert isinstance(driver.choose_flavour([device], version, None), driver.Flavour)
    assert any("--skip driver" in n for n in p.notes)
    assert p.outputs.version is None


def test_the_recommended_driver_also_runs_the_requested_cuda():
    p = plan(facts(devices=(T4,)), Options(cuda="13.0"))
    need = compat.driver_needed_for_cuda("13.0").native_min
    assert need is not None and compat.parse_driver(_recommended(p)) >= need


def test_an_installed_driver_that_is_not_loaded_is_named_in_the_fix():
    p = plan(installed(load=False), Options())
    assert p.status is Status.BLOCKED and f"driver {V} is installed but not loaded" in p.reason
    assert shlex.split(p.fix.split("#")[0]) == ["gpunode", "install", "--driver", V]
    packaged = facts(outputs={"driver_packages": Section("nvidia-driver-535 535.183.01-0ubuntu1\n", 0)})
    p = plan(packaged, Options())
    assert p.status is Status.BLOCKED and \
        "driver 535.183.01 from distribution packages (nvidia-driver-535 535.183.01-0ubuntu1) is installed but not " \
        "loaded" in p.reason
    assert p.fix.startswith("sudo modprobe nvidia  #")


DEBIAN_PACKAGES = "libnvidia-ml1 535.261.03-1\nnvidia-kernel-dkms 535.261.03-1\n"


def test_a_run_over_a_packaged_driver_is_refused_for_the_packages_gpu_or_not():
    """Debian's packaged driver (seen on the real-OS tier's nvidia VM): a .run on top is refused because of the
    packages, also on a node without a GPU (where the refusal used to name only the missing GPU), with a fix that
    removes exactly the installed packages."""
    for devices in ((T4,), ()):
        packaged = facts(devices=devices, outputs={"driver_packages": Section(DEBIAN_PACKAGES, 0)})
        p = plan(packaged, Options(driver=V))
        assert p.status is Status.BLOCKED and "would mix two drivers" in p.reason, p.reason
        assert "driver 535.261.03 from distribution packages" in p.reason and "proprietary kernel module" in p.reason
        command = p.fix.split("  #")[0]
        assert shlex.split(command) == ["sudo", "apt-get", "purge", "-y", "--allow-change-held-packages", "libnvidia-ml1",
                                        "nvidia-kernel-dkms", "&&",
                                        "sudo", "apt-get", "autoremove", "-y", "--purge"]
    quiet = plan(facts(devices=(), outputs={"driver_packages": Section(DEBIAN_PACKAGES, 0)}), Options())
    assert quiet.status is Status.OK and "driver 535.261.03 from distribution packages" in quiet.reason


def test_fresh_node_downloads_verifies_and_installs():
    p = plan(facts(), Options(driver=V, cache_dir="/cache"))
    assert p.status is Status.CHANGE and p.reason == f"no NVIDIA driver installed; installing {V}"
    fetch, run = p.actions
    assert isinstance(fetch, FetchInstaller) and isinstance(run, RunInstaller)
    assert fetch.where == "control" and fetch.commands() == []  # nothing runs on the node
    assert fetch.details()[0] == f"download https://us.download.nvidia.com/tesla/{V}/NVIDIA-Linux-x86_64-{V}.run"
    assert f"  into /cache/{V}/x86_64/NVIDIA-Linux-x86_64-{V}.run (resumable)" in fetch.details()
    assert run.where == "node" and run.commands()[0].startswith(
        f"sudo sh NVIDIA-Linux-x86_64-{V}.run --silent --dkms --tmpdir=/var/tmp")
    assert run.details()[0].startswith(f"upload NVIDIA-Linux-x86_64-{V}.run into a root-only directory")
    assert "kernel module: proprietary (Tesla T4 (Turing)" in p.notes[0]
    data = p.to_dict()
    assert data["actions"][0]["cached"] is False and data["actions"][1]["log"] == "/var/log/nvidia-installer.log"
    assert data["actions"][0]["where"] == "control" and data["actions"][1]["where"] == "node"
    assert data["outputs"] == {"version": V, "origin": "--driver", "changes": True, "reloads": False}


def test_a_cached_installer_is_shown_as_such():
    path = f"/cache/{V}/x86_64/NVIDIA-Linux-x86_64-{V}.run"
    p = plan(facts(), Options(driver=V, cache_dir="/cache", local_installers=((path, 325_000_000),)))
    assert p.actions[0].details()[0] == f"cached: {path} (325 MB)"
    assert p.actions[0].summary.startswith("verify ")


def test_same_version_loaded_is_ok_and_changes_nothing():
    p = plan(installed())
    assert p.status is Status.OK and p.actions == ()
    assert p.reason == f"driver {V} (proprietary kernel module) is loaded and nvidia-smi answers"


def test_another_run_version_plans_an_upgrade():
    p = plan(installed("535.104.05"))
    assert p.status is Status.CHANGE and "driver 535.104.05 is installed; 535.129.03 was requested: upgrading" == p.reason
    assert [a.kind for a in p.actions] == ["modules", "download", "driver-install", "command"]
    assert isinstance(p.actions[2], RunInstaller) and p.actions[-1].commands() == ["sudo modprobe nvidia"]


def test_a_distro_packaged_driver_blocks():
    pkgs = Section("nvidia-driver-535-server 535.161.07-0ubuntu0.22.04.1\nlibnvidia-compute-535-server 535.161.07\n"
                   "nvidia-container-toolkit 1.17.8-1\n", 0)
    p = plan(facts(outputs={"driver_packages": pkgs}))
    assert p.status is Status.BLOCKED and "nvidia-driver-535-server" in p.reason and "container" not in p.reason
    assert "mix two drivers" in p.reason and "apt-get purge" in (p.fix or "")


def test_a_distro_packaged_driver_at_the_requested_version_is_ok():
    f = installed()
    f = dataclasses.replace(f, outputs={**f.outputs, "driver_packages": Section(f"nvidia-driver-535 {V}-0ubuntu1\n", 0)})
    assert plan(f).status is Status.OK


def test_loaded_module_older_than_the_libraries_needs_a_reboot():
    mismatch = (FIXTURES / "errors" / "nvml-mismatch_with-nvml-library-version_570.124.txt").read_text()
    f = installed(smi=(mismatch, 18))
    f = dataclasses.replace(f, loaded_driver=parse_nvidia_version(loaded("535.104.05")))
    p = plan(f)
    assert p.only_reboot_left and "Driver/library version mismatch" in p.reason


def test_installed_but_not_loaded_loads_the_module():
    p = plan(installed(load=False, smi=("NVIDIA-SMI has failed because it couldn't communicate", 9)))
    (action,) = p.actions
    assert isinstance(action, RunCommand) and action.commands() == ["sudo modprobe nvidia"]


def test_installed_without_a_module_for_this_kernel_reinstalls():
    f = installed(load=False)
    f = dataclasses.replace(f, outputs={**f.outputs, "driver_module": Section("", 0)})
    p = plan(f)
    assert "no 535.129.03 module exists for kernel 5.15.0-91-generic" in p.reason
    assert isinstance(p.actions[-1], RunInstaller)


def test_installed_but_nouveau_holds_the_gpu_is_reboot_only():
    assert plan(installed(load=False, modules=frozenset({"nouveau"}))).only_reboot_left


def test_nouveau_loaded_waits_for_the_reboot_of_the_nouveau_step():
    earlier = Earlier({"nouveau": change("nouveau", "x", [Reboot("reboot")])}, driver.READS)
    p = plan(facts(modules=frozenset({"nouveau"})), earlier=earlier)
    assert p.status is Status.CHANGE and any("after the reboot the nouveau step needs" in n for n in p.notes)
    skipped = plan(facts(modules=frozenset({"nouveau"})))
    assert skipped.status is Status.BLOCKED and "nouveau is loaded" in skipped.reason


def test_secure_boot_without_keys_is_blocked_with_the_choices():
    p = plan(facts(secure_boot=SecureBoot(True, True, "efivar 1")))
    assert p.status is Status.BLOCKED and "Secure Boot is enabled" in p.reason
    assert all(word in (p.fix or "") for word in ("--module-signing-key", "disable Secure Boot", "ubuntu-drivers"))


def test_secure_boot_with_keys_passes_them_to_the_installer():
    options = Options(driver=V, module_signing_key="/root/mok.priv", module_signing_cert="/root/mok.der")
    p = plan(facts(secure_boot=SecureBoot(True, True, "efivar 1")), options)
    assert p.status is Status.CHANGE
    run = p.actions[-1]
    assert "--module-signing-secret-key=/root/mok.priv" in run.flags and run.signing_cert == "/root/mok.der"


def test_secure_boot_does_not_block_a_finished_node():
    assert plan(installed(secure_boot=SecureBoot(True, True, "efivar 1"))).status is Status.OK


def test_no_gpu_is_blocked():
    assert plan(facts(devices=())).status is Status.BLOCKED


def test_wrong_architecture_run_file_is_blocked():
    p = plan(facts(arch="aarch64"), Options(driver=V, driver_run=f"/x/NVIDIA-Linux-x86_64-{V}.run"))
    assert p.status is Status.BLOCKED and "this node is aarch64" in p.reason


def test_driver_loaded_but_nvidia_smi_failing_is_blocked():
    p = plan(installed(smi=("No devices were found", 6)))
    assert p.status is Status.BLOCKED and "nvidia-smi fails: No devices were found" in p.reason


def test_explicit_flavour_change_reinstalls():
    p = plan(installed(), Options(driver=V, kernel_module="open"))
    assert p.status is Status.CHANGE and "--kernel-module asks for open" in p.reason


# -- installer failures, explained from real installer output (data/installer_failures.csv via gpunode.explain) ---
@pytest.mark.parametrize("fixture, meaning", [
    ("nvidia-installer_nouveau-in-use_installation-failed.txt", "nouveau is loaded"),
    ("nvidia-installer_kernel-source-tree-not-found_fedora27.txt", "Kernel headers for the running kernel"),
    ("nvidia-installer_nvidia-drm-already-loaded_410.72.txt", "is loaded and in use"),
    ("nvidia-installer-log_header_nvidia-drm-already-loaded_460.73.01_truncated.log", "is loaded and in use"),
    ("nvidia-installer_unable-to-load-nvidia.ko_390.46.txt", "could not load it"),
])
def test_real_installer_errors_are_explained(fixture, meaning):
    text = (FIXTURES / "errors" / fixture).read_text(errors="replace")
    got, fix = explain_failure(text)
    assert meaning in got and fix


def test_unknown_failures_point_at_the_log():
    assert "/var/log/nvidia-installer.log" in explain_failure("something new")[1]


# -- applying on a fake node --------------------------------------------------------------------------------------
def fake_node() -> FakeNode:
    node = FakeNode(tools={"modprobe", "apt-get"})
    node.add_gpu(T4)
    node.outputs["kernel_headers"] = ("build /lib/modules/5.15.0-91-generic/build\n", 0)
    return node


def local_run(tmp_path: Path, version: str = V) -> Options:
    path = build_run(tmp_path / f"NVIDIA-Linux-x86_64-{version}.run", version=version)
    return Options(driver=version, driver_run=str(path), cache_dir=str(tmp_path / "cache"))


def apply_plan(conn: FakeConnection, options: Options):
    from gpunode.facts import gather

    p = plan(gather(conn), options)
    return p, [action.apply(conn) for action in p.actions]


def test_install_on_a_fake_node_converges_and_a_rerun_changes_nothing(tmp_path):
    from gpunode.facts import gather

    node = fake_node()
    conn = FakeConnection(node)
    options = local_run(tmp_path)
    p, notes = apply_plan(conn, options)
    assert "makeself MD5 OK" in notes[0] and "installer log: /var/log/nvidia-installer.log" in notes[1]
    assert node.nvidia_version == V and "nvidia" in node.modules
    installs = [c for c in node.calls if len(c) > 3 and c[3] == "gpunode-driver-install"]
    assert installs[0][10:] == list(p.actions[1].flags)
    assert not [f for f in node.files if f.startswith("/var/tmp/gpunode.")]  # the work directory is gone
    assert plan(gather(conn), options).status is Status.OK


def test_the_upload_reports_progress_through_the_options_factory(tmp_path):
    from contextlib import contextmanager

    from gpunode.facts import gather

    titles: list[str] = []
    seen: list[tuple[int, int | None]] = []

    @contextmanager
    def bars(title):
        titles.append(title)
        yield lambda done, total: seen.append((done, total))

    options = dataclasses.replace(local_run(tmp_path), progress=bars)
    size = Path(options.driver_run).stat().st_size
    conn = FakeConnection(fake_node())
    p = plan(gather(conn), options)
    assert p.actions[0].progress is bars and p.actions[1].progress is bars
    p.actions[1].apply(conn)
    assert titles == [f"upload NVIDIA-Linux-x86_64-{V}.run"] and seen[-1] == (size, size)


def test_corrupt_run_is_refused_before_anything_reaches_the_node(tmp_path):
    from gpunode.facts import gather

    options = local_run(tmp_path)
    data = bytearray(Path(options.driver_run).read_bytes())
    data[-5] ^= 0xFF
    Path(options.driver_run).write_bytes(bytes(data))
    node = fake_node()
    conn = FakeConnection(node)
    p = plan(gather(conn), options)
    with pytest.raises(DownloadError, match="the archive is corrupt"):
        p.actions[0].apply(conn)
    with pytest.raises(DownloadError):
        p.actions[1].apply(conn)  # the install re-verifies: nothing is uploaded or run
    assert not [c for c in node.calls if "gpunode-mktemp-dir" in c or "gpunode-driver-install" in c]
    assert node.nvidia_version is None


def test_an_upload_that_is_not_the_verified_file_runs_nothing_and_a_good_one_is_not_hashed_again(tmp_path):
    """The upload says what arrived (its sha256, checked on the node against what was sent); the installer runs
    only when that is the verified file, and the node is not asked to hash it a second time."""
    from gpunode.facts import gather

    node = fake_node()
    conn = FakeConnection(node)
    options = local_run(tmp_path)
    p = plan(gather(conn), options)
    real_upload = conn.upload
    conn.upload = lambda *a, **kw: (real_upload(*a, **kw), "0" * 64)[1]  # type: ignore[method-assign]
    with pytest.raises(CommandError, match=f"sha256 {'0' * 64}, not the verified"):
        p.actions[1].apply(conn)
    assert not [c for c in node.calls if "gpunode-driver-install" in c] and node.nvidia_version is None
    assert not [f for f in node.files if f.startswith("/var/tmp/gpunode.")]  # the work directory is gone
    conn.upload = real_upload  # type: ignore[method-assign]
    p.actions[1].apply(conn)
    installs = [c for c in node.calls if "gpunode-driver-install" in c]
    assert len(installs) == 1 and installs[0][installs[0].index("gpunode-driver-install") + 3] == ""  # no want
    assert node.nvidia_version == V


def test_installer_failure_shows_the_explanation_and_the_log(tmp_path):
    from gpunode.facts import gather

    node = fake_node()
    node.handlers["driver-install"] = lambda n, argv, stdin: (
        1, "", (FIXTURES / "errors" / "nvidia-installer_kernel-source-tree-not-found_fedora27.txt").read_text())
    conn = FakeConnection(node)
    options = local_run(tmp_path)
    p = plan(gather(conn), options)
    with pytest.raises(CommandError) as exc:
        p.actions[1].apply(conn)
    assert "the NVIDIA installer failed (exit 1): Kernel headers for the running kernel are not installed" in (
        exc.value.message)
    assert "installer log: /var/log/nvidia-installer.log" in exc.value.message
    assert "linux-headers-$(uname -r)" in (exc.value.fix or "")


def test_pipeline_reboots_for_nouveau_then_installs(tmp_path):
    from gpunode import runner
    from gpunode.runner import apply_pipeline
    from gpunode.steps import PIPELINE

    steps = [s for s in PIPELINE if s.name in ("nouveau", "prerequisites", "driver")]
    node = fake_node()
    node.tools |= {"update-initramfs", "gcc", "make", "dkms"}
    node.modules.add("nouveau")
    options = dataclasses.replace(local_run(tmp_path), reboot=True)
    runner.REBOOT_POLL_SECONDS, saved = 0.0, runner.REBOOT_POLL_SECONDS
    try:
        report = apply_pipeline(FakeConnection(node), steps, options, journal=False)
    finally:
        runner.REBOOT_POLL_SECONDS = saved
    results = {o.step: o.result for o in report.outcomes}
    assert results["nouveau"] == "changed" and results["driver"] == "changed" and report.reboots == 1
    assert node.nvidia_version == V and "nouveau" not in node.modules and report.exit_code == 0
    again = apply_pipeline(FakeConnection(node), steps, options, journal=False)
    assert {o.step: o.result for o in again.outcomes}["driver"] == "ok" and node.reboots == 1


def test_an_installer_whose_name_carries_no_version_says_how_to_read_it():
    p = plan(facts(), Options(driver_run="/srv/my installer.run"))
    assert p.status is Status.BLOCKED and "cannot tell which driver version" in p.reason
    assert "`sh '/srv/my installer.run' --info`" in p.fix and "--driver" in p.fix
