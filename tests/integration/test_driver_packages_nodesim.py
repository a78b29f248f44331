"""`--driver-source packages` end to end on node-simulator nodes whose repositories are modelled on the real ones
(tests/nodesim/catalog.py): Debian 12's non-free, Ubuntu's archive (DKMS and the precompiled signed modules under
Secure Boot), NVIDIA's CUDA repository on Rocky 9 and SLES 15 (zypper). install -> re-run changes nothing -> upgrade within the branch
-> uninstall -> switch to and from a .run. Nothing here touches this machine."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from gpunode.actions import packages as package_actions
from gpunode.cli import app
from gpunode.driver_packages import sources_fix

pytestmark = pytest.mark.integration

STEPS = ["--only", "nouveau", "--only", "prerequisites", "--only", "driver", "--reboot"]
cli = CliRunner()

DEBIAN_OLD, DEBIAN_NEW = "535.261.03", "535.309.01"
DEBIAN_SET = ("nvidia-kernel-dkms", "nvidia-smi", "libcuda1", "libnvidia-ml1", "nvidia-persistenced",
              "nvidia-modprobe", "firmware-nvidia-gsp")


@pytest.fixture(autouse=True)
def _fast_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(package_actions, "LOCK_POLL_SECONDS", 1.0)


def run(node, *args: str) -> tuple[int, str]:  # type: ignore[no-untyped-def]
    result = cli.invoke(app, [*args, *node.cli_args()])
    return result.exit_code, result.output


def plan_json(node, *args: str) -> dict:  # type: ignore[no-untyped-def,type-arg]
    code, out = run(node, "plan", "--json", *(a for a in args if a != "--reboot"))
    assert code in (0, 1), out
    return json.loads(out)


def driver_step(doc: dict) -> dict:  # type: ignore[type-arg]
    return next(s for s in doc["steps"] if s["step"] == "driver")


def test_debian_install_rerun_upgrade_uninstall(sim_node) -> None:  # type: ignore[no-untyped-def]
    node = sim_node("debian-12-t4")
    args = ("--driver-source", "packages", "--driver", DEBIAN_OLD, *STEPS)
    # the plan names every package with its exact Debian version before anything runs
    doc = plan_json(node, *args)
    step = driver_step(doc)
    text = json.dumps(step)
    for name in DEBIAN_SET:
        assert name in text
    assert "nvidia-kernel-dkms=535.261.03-1" in text and "apt-mark hold" in text
    assert not any(name in node.installed_packages() for name in DEBIAN_SET)

    code, out = run(node, "install", *args)
    assert code == 0, out
    have = node.installed_packages()
    assert have["nvidia-kernel-dkms"] == "535.261.03-1" and have["libcuda1"] == "535.261.03-1"
    assert set(DEBIAN_SET) <= set(node.held_packages())
    assert "Pin: version 535.261.03-*" in node.read("/etc/apt/preferences.d/gpunode-nvidia-driver")
    assert node.is_loaded("nvidia")
    assert "open-kernel" not in " ".join(have)  # T4 + R535: proprietary, as the .run path chooses

    # re-run: nothing changes
    node.clear_calls()
    code, out = run(node, "install", *args)
    assert code == 0, out
    assert not node.calls("apt-get") and not node.calls("apt-mark")

    # upgrade within the branch: holds released for the transaction, services around it, held again
    code, out = run(node, "install", "--driver-source", "packages", "--driver", DEBIAN_NEW, "--stop-gpu-services",
                    *STEPS)
    assert code == 0, out
    have = node.installed_packages()
    assert have["nvidia-kernel-dkms"] == "535.309.01-0+deb12u1" and have["nvidia-smi"] == "535.309.01-0+deb12u1"
    assert "Pin: version 535.309.01-*" in node.read("/etc/apt/preferences.d/gpunode-nvidia-driver")
    assert "nvidia-kernel-dkms" in node.held_packages()
    assert (node.driver() or {}).get("version") == DEBIAN_NEW and node.is_loaded("nvidia")

    # status and doctor say packages own the driver
    code, out = run(node, "status")
    flat = " ".join(out.split())  # the terminal wraps the long line
    line = flat[flat.index(f"driver {DEBIAN_NEW}: "):]
    # every package of the route at its exact version, the ones the transaction only changed too
    assert "installed by gpunode from packages: " in line, out
    for name in DEBIAN_SET:
        own = name in ("nvidia-persistenced", "nvidia-modprobe")  # their own versions
        assert (f"{name} " if own else f"{name} 535.309.01-0+deb12u1") in line, (name, line)
    code, out = run(node, "doctor", "--format", "json")
    checks = {c["id"]: c for c in json.loads(out)["checks"]}
    single = checks["driver.single-source"]
    assert "from distribution packages" in single["evidence"] and "installed by gpunode" in single["evidence"]
    assert checks["driver.packages-held"]["status"] == "pass", checks["driver.packages-held"]
    # an unattended upgrade cannot move them alone: doctor notices a released hold and gives the command back
    node.ssh("apt-mark unhold nvidia-smi")
    code, out = run(node, "doctor", "--format", "json")
    held = next(c for c in json.loads(out)["checks"] if c["id"] == "driver.packages-held")
    assert held["status"] == "warn" and "nvidia-smi" in held["evidence"], held
    assert held["fix"].startswith("ssh -t ") and held["fix"].endswith(' "sudo apt-mark hold nvidia-smi"'), held
    rc, _, err = node.ssh("apt-mark hold nvidia-smi")  # what it runs there (root on the node)
    assert rc == 0, err
    assert "nvidia-smi" in node.held_packages()

    # uninstall purges exactly what gpunode added
    code, out = run(node, "uninstall", "--only", "driver", "--stop-gpu-services")
    assert code == 0, out
    have = node.installed_packages()
    assert not any(name in have for name in DEBIAN_SET), have
    assert not node.exists("/etc/apt/preferences.d/gpunode-nvidia-driver")
    assert "dkms" in have  # the prerequisites step's, removed only by its own undo


def test_debian_version_not_offered_is_refused_before_any_change(sim_node) -> None:  # type: ignore[no-untyped-def]
    node = sim_node("debian-12-t4")
    node.clear_calls()
    code, out = run(node, "install", "--driver-source", "packages", "--driver", "535.999.01", *STEPS)
    assert code == 1, out
    assert "do not offer driver 535.999.01" in out and "535.261.03-1" in out
    assert not node.calls("apt-get")  # refused before the first change: not even prerequisites ran
    assert "nvidia-kernel-dkms" not in node.installed_packages()


def test_debian_without_non_free_gets_the_sources_line(sim_node) -> None:  # type: ignore[no-untyped-def]
    node = sim_node("debian-12-t4")
    node.write("/etc/apt/sources.list", "deb http://deb.debian.org/debian bookworm main non-free-firmware\n")
    node.ssh("apt-get update")
    code, out = run(node, "plan", "--driver-source", "packages", "--driver", DEBIAN_OLD, *STEPS[:-1])
    assert code == 1, out
    assert "gpunode-nonfree.list" in out and "contrib non-free non-free-firmware" in out


def test_debian_bake_without_a_gpu_builds_for_the_image_kernel_and_loads_nothing(sim_node) -> None:  # type: ignore[no-untyped-def]
    node = sim_node("debian-12-nogpu")
    new = "6.1.0-21-amd64"
    node.set_kernel(new)
    args = ("install", "--driver-source", "packages", "--driver", DEBIAN_OLD, "--bake")
    code, out = run(node, *args)
    assert code == 0, out
    assert node.installed_packages()["nvidia-kernel-dkms"] == "535.261.03-1"
    # Debian's nvidia-kernel-dkms Depends on the GSP firmware of its release, GPU or not (real apt, real-OS tier)
    assert node.installed_packages()["firmware-nvidia-gsp"] == "535.261.03-1"
    assert not node.is_loaded("nvidia") and node.reboots == 0
    assert not [c for c in node.calls("modprobe") if "nvidia" in " ".join(c)]
    assert new in (node.driver() or {}).get("kernels", ""), node.driver()
    marker = json.loads(node.read("/var/lib/gpunode/baked.json"))
    assert marker["kernel"] == new and marker["driver"]["version"] == DEBIAN_OLD
    node.clear_calls()
    code, out = run(node, *args)
    assert code == 0, out
    assert not node.calls("apt-get")


def test_debian_no_gpu_without_bake_is_refused(sim_node) -> None:  # type: ignore[no-untyped-def]
    node = sim_node("debian-12-nogpu")
    code, out = run(node, "plan", "--driver-source", "packages", "--driver", DEBIAN_OLD, "--only", "driver")
    assert code == 1 and "no NVIDIA GPU" in out, out


UBUNTU_OLD, UBUNTU_NEW = "535.183.06", "535.230.02"


def test_ubuntu_secure_boot_takes_the_signed_precompiled_modules(sim_node) -> None:  # type: ignore[no-untyped-def]
    node = sim_node("ubuntu-22.04-t4", secure_boot=True)
    kernel = node.kernel
    args = ("--driver-source", "packages", "--driver", UBUNTU_NEW, *STEPS)
    step = driver_step(plan_json(node, *args))
    text = json.dumps(step)
    assert f"linux-modules-nvidia-535-server-{kernel}=" in text and "nvidia-headless-no-dkms-535-server=" in text
    assert "nvidia-dkms-535" not in text and "Canonical signed" in text
    code, out = run(node, "install", *args)
    assert code == 0, out
    have = node.installed_packages()
    assert f"linux-modules-nvidia-535-server-{kernel}" in have and "nvidia-dkms-535-server" not in have
    assert (node.driver() or {}).get("signkey") == "distro" and node.is_loaded("nvidia")
    assert f"linux-modules-nvidia-535-server-{kernel}" in node.held_packages()


def test_ubuntu_without_secure_boot_builds_with_dkms_and_upgrades_within_the_branch(sim_node) -> None:  # type: ignore[no-untyped-def]
    node = sim_node("ubuntu-22.04-t4")
    code, out = run(node, "install", "--driver-source", "packages", "--driver", UBUNTU_OLD, *STEPS)
    assert code == 0, out
    have = node.installed_packages()
    assert have["nvidia-dkms-535-server"] == "535.183.06-0ubuntu0.22.04.1"
    assert have["nvidia-utils-535-server"] == "535.183.06-0ubuntu0.22.04.1"
    assert not any(n.startswith("linux-modules-nvidia") for n in have)
    code, out = run(node, "install", "--driver-source", "packages", "--driver", UBUNTU_NEW, "--stop-gpu-services",
                    *STEPS)
    assert code == 0, out
    assert node.installed_packages()["nvidia-dkms-535-server"] == "535.230.02-0ubuntu0.22.04.1"
    assert (node.driver() or {}).get("version") == UBUNTU_NEW and node.is_loaded("nvidia")
    code, out = run(node, "uninstall", "--only", "driver", "--stop-gpu-services")
    assert code == 0, out
    assert not [n for n in node.installed_packages() if "nvidia" in n and "container" not in n]


def test_ubuntu_switch_from_a_run_gpunode_installed_to_packages_and_back(sim_node, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from tests.integration.test_driver_nodesim import Mirror

    mirror = Mirror(tmp_path / "www")
    monkeypatch.setenv("GPUNODE_DRIVER_MIRROR", mirror.url)
    try:
        mirror.publish("535.129.03")
        node = sim_node("ubuntu-22.04-t4")
        code, out = run(node, "install", "--driver", "535.129.03", "--cache-dir", str(tmp_path / "c"), *STEPS)
        assert code == 0, out
        assert (node.driver() or {}).get("method") == "run"
        args = ("--driver-source", "packages", "--driver", UBUNTU_NEW, "--stop-gpu-services", *STEPS)
        step = driver_step(plan_json(node, *args))
        assert "nvidia-installer --uninstall --silent" in json.dumps(step) and "switching source" in json.dumps(step)
        code, out = run(node, "install", *args)
        assert code == 0, out
        assert (node.driver() or {}).get("method") == "pkg" and node.is_loaded("nvidia")
        assert not node.exists("/usr/bin/nvidia-installer")
        # and back to a .run: the packages gpunode installed are purged first, never mixed
        back = ("--driver", "535.129.03", "--cache-dir", str(tmp_path / "c"), "--stop-gpu-services", *STEPS)
        step = driver_step(plan_json(node, *back))
        assert "switching source" in json.dumps(step) and "apt-get purge" in json.dumps(step), step
        code, out = run(node, "install", *back)
        assert code == 0, out
        assert (node.driver() or {}).get("method") == "run" and node.is_loaded("nvidia")
        assert not [n for n in node.installed_packages() if n.startswith(("nvidia-", "linux-modules-nvidia"))
                    and "container" not in n]
    finally:
        mirror.stop()


def add_the_repository_by_the_fix(node, args: tuple[str, ...], distro: tuple[str, str, str],  # type: ignore[no-untyped-def]
                                  repo_file: str) -> None:
    """No NVIDIA repository yet: the driver step is blocked, and the fix it prints (the one sources_fix gives
    for the distribution) adds the repository when run on the node."""
    blocked = driver_step(plan_json(node, *args))
    assert blocked["status"] == "blocked", blocked
    command = sources_fix(*distro)
    assert repo_file in command and command in blocked["fix"], blocked["fix"]
    rc, _, err = node.ssh(command)
    assert rc == 0, err


def test_rocky_from_the_cuda_repository(sim_node) -> None:  # type: ignore[no-untyped-def]
    node = sim_node("rocky-9-t4")
    args = ("--driver-source", "packages", "--driver", "535.274.02", *STEPS)
    add_the_repository_by_the_fix(node, args, ("rhel", "", "9"), "cuda-rhel9.repo")
    step = driver_step(plan_json(node, *args))
    text = json.dumps(step)
    assert "kmod-nvidia-latest-dkms-535.274.02-1.el9" in text and "nvidia-driver:535-dkms" in text
    code, out = run(node, "install", *args)
    assert code == 0, out
    assert node.installed_packages()["kmod-nvidia-latest-dkms"] == "535.274.02-1.el9"
    assert "kmod-nvidia-latest-dkms" in node.held_packages() and node.is_loaded("nvidia")
    node.clear_calls()
    code, out = run(node, "install", *args)
    assert code == 0 and not node.calls("dnf") or all(c[1:2] != ["install"] for c in node.calls("dnf")), out
    code, out = run(node, "uninstall", "--only", "driver", "--stop-gpu-services")
    assert code == 0, out
    assert "kmod-nvidia-latest-dkms" not in node.installed_packages()


SUSE_SET = ("nvidia-open-driver-G06-kmp-default", "nvidia-compute-G06", "nvidia-compute-utils-G06")
SUSE_KMP = "580.95.05_k6.4.0_150600.23.25-1"


def test_sles_from_nvidias_repository_install_rerun_uninstall(sim_node) -> None:  # type: ignore[no-untyped-def]
    """SLES 15 SP6 with zypper: NVIDIA's sles15 repository added by the refusal's own fix, the KMP built for the
    running kernel and the compute-only userspace at their exact versions in the plan, zypper's dry run listing the
    transaction, zypper locks; a re-run changes nothing; uninstall releases the locks and removes the packages."""
    node = sim_node("sles-15-t4")
    args = ("--driver-source", "packages", "--driver", "580.95.05", *STEPS)
    add_the_repository_by_the_fix(node, args, ("sles", "", "15.6"), "cuda-sles15.repo")
    doc = plan_json(node, *args)
    step = driver_step(doc)
    text = json.dumps(step)
    for spec in (f"nvidia-open-driver-G06-kmp-default-{SUSE_KMP}", "nvidia-compute-G06-580.95.05-1",
                 "nvidia-compute-utils-G06-580.95.05-1"):
        assert spec in text, text
    assert "zypper install --dry-run resolves it on the node" in text and "zypper --non-interactive addlock" in text
    prereq = next(s for s in doc["steps"] if s["step"] == "prerequisites")
    assert prereq["status"] == "ok" and "KMP" in prereq["reason"], prereq  # nothing is built on the node
    assert not any(name in node.installed_packages() for name in SUSE_SET)

    code, out = run(node, "install", *args)
    assert code == 0, out
    have = node.installed_packages()
    assert have["nvidia-open-driver-G06-kmp-default"] == SUSE_KMP and have["nvidia-compute-G06"] == "580.95.05-1"
    assert set(SUSE_SET) <= set(node.held_packages())
    assert "solvable_name: nvidia-compute-G06" in node.read("/etc/zypp/locks")
    assert node.is_loaded("nvidia") and "dkms" not in have and "gcc" not in have
    code, out = run(node, "doctor", "--format", "json")
    checks = {c["id"]: c for c in json.loads(out)["checks"]}
    assert checks["driver.packages-held"]["status"] == "pass", checks["driver.packages-held"]
    # SUSE's dracut names the image /boot/initrd-K: found, and rebuilt after the nouveau blacklist
    assert node.exists(f"/boot/initrd-{node.kernel}") and not node.exists(f"/boot/initramfs-{node.kernel}.img")
    assert checks["kernel.nouveau-initramfs"]["status"] == "pass", checks["kernel.nouveau-initramfs"]

    # re-run: nothing changes (no zypper transaction, no lock added again)
    node.clear_calls()
    code, out = run(node, "install", *args)
    assert code == 0, out
    changing = [c for c in node.calls("zypper") if {"install", "remove", "addlock", "removelock"} & set(c)
                and "--dry-run" not in c]
    assert not changing, changing

    # uninstall: the locks are released first (zypper does not remove a locked package), then the packages go
    code, out = run(node, "uninstall", "--only", "driver", "--stop-gpu-services")
    assert code == 0, out
    have = node.installed_packages()
    assert not any(name in have for name in SUSE_SET), have
    assert "solvable_name: nvidia" not in (node.read("/etc/zypp/locks") if node.exists("/etc/zypp/locks") else "")


TOOLKIT = ("nvidia-container-toolkit", "nvidia-container-toolkit-base", "libnvidia-container-tools",
           "libnvidia-container1")
# a toolkit repository configured before gpunode (a mirror of NVIDIA's, or NVIDIA's own set up by hand)
MIRROR = ("[nvidia-container-toolkit]\nname=nvidia-container-toolkit (site mirror)\n"
          "baseurl=https://nvidia.github.io/libnvidia-container/stable/rpm/$basearch\nenabled=1\ngpgcheck=0\n"
          "autorefresh=1\ntype=rpm-md\n")


def test_sles_switch_from_packages_to_a_run_releases_the_zypper_locks_first(sim_node, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """zypper does not remove a locked package: switching to the .run, the locks gpunode placed on the driver
    packages are released, then the packages removed, then the .run installs."""
    from tests.integration.test_driver_nodesim import Mirror

    mirror = Mirror(tmp_path / "www")
    monkeypatch.setenv("GPUNODE_DRIVER_MIRROR", mirror.url)
    try:
        mirror.publish("570.195.03")
        node = sim_node("sles-15-t4", cuda_repo=True)
        code, out = run(node, "install", "--driver-source", "packages", "--driver", "580.95.05", *STEPS)
        assert code == 0, out
        assert set(SUSE_SET) <= set(node.held_packages())
        back = ("--driver", "570.195.03", "--cache-dir", str(tmp_path / "c"), "--stop-gpu-services", *STEPS)
        step = driver_step(plan_json(node, *back))
        text = json.dumps(step)
        assert "switching source" in text and "zypper --non-interactive removelock" in text, step
        code, out = run(node, "install", *back)
        assert code == 0, out
        assert (node.driver() or {}).get("method") == "run" and node.is_loaded("nvidia")
        assert not any(name in node.installed_packages() for name in SUSE_SET)
    finally:
        mirror.stop()


@pytest.mark.parametrize("profile", ["sles-15-t4", "debian-12-t4"])
def test_a_configured_toolkit_repository_is_read_after_its_refresh_and_the_toolkit_pinned(sim_node, profile) -> None:  # type: ignore[no-untyped-def]
    """With the toolkit repository configured already, gpunode cannot read its versions before the change: the
    install refreshes it, reads the package manager's own lists (zypper's search table, apt-cache policy) and pins
    the newest version all four packages are offered at (not the newest of one: 1.21.0-1 of
    nvidia-container-toolkit alone is not taken); an asked version the repository lacks fails before anything is
    installed, naming what it offers."""
    suse = profile.startswith("sles")
    node = sim_node(profile, cuda_repo=True) if suse else sim_node(profile)
    if suse:
        node.write("/etc/zypp/repos.d/nvidia-container-toolkit.repo", MIRROR)
    else:
        keyring = "/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg"
        node.write(keyring, "NODESIM-GPG-KEYRING\n")
        node.write("/etc/apt/sources.list.d/nvidia-container-toolkit.list",
                   f"deb [signed-by={keyring}] https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH) /\n")
    node.offer_package("nvidia-container-toolkit", "1.21.0-1", repo="nvidia-container-toolkit",
                       deps="nvidia-container-toolkit-base,libnvidia-container-tools")
    base = ("--driver-source", "packages", "--driver", "580.95.05" if suse else DEBIAN_OLD, "--only", "toolkit")
    doc = plan_json(node, *base)
    step = next(s for s in doc["steps"] if s["step"] == "toolkit")
    text = json.dumps(step)
    listing = "zypper -n -q search -s --match-exact" if suse else "apt-cache policy"
    assert "is configured on the node already" in text and listing in text, text
    assert "libnvidia-container/stable/rpm/x86_64" not in text and "Packages" not in text  # NVIDIA's is not read

    # asked for a version the repository lacks: refused at the install, nothing installed, the fix names one
    code, out = run(node, "install", *base, "--toolkit-version", "1.19.0")
    flat = " ".join(out.split())
    assert code != 0 and "do not offer 1.19.0-1 of" in flat, out
    # the fix is this run's whole command again with a version the lists offer, runnable against the same node
    fix = re.search(rf"fix: (gpunode install --host \S+:{node.port} [^#]*)# a version they offer", flat)
    assert fix and "--driver-source packages" in fix[1] and fix[1].endswith("--toolkit-version 1.20.0-1 "), out
    assert "1.19.0" not in fix[1], out
    assert not any(name in node.installed_packages() for name in TOOLKIT)

    code, out = run(node, "install", *base)
    assert code == 0, out
    have = node.installed_packages()
    assert {name: have.get(name) for name in TOOLKIT} == {name: "1.20.0-1" for name in TOOLKIT}, have
    assert set(TOOLKIT) <= set(node.held_packages())
    refresh = ["--non-interactive", "--gpg-auto-import-keys", "refresh"] if suse else ["update"]
    assert any(c[1:] == refresh for c in node.calls("zypper" if suse else "apt-get"))
    node.clear_calls()
    code, out = run(node, "install", *base)  # re-run: nothing changes
    assert code == 0, out
    changing = {"install", "addlock"} if suse else {"install", "hold"}
    assert not [c for c in node.calls() if c[0] in ("zypper", "apt-get", "apt-mark") and changing & set(c)]


def test_ubuntu_takes_nvidias_repository_for_a_release_the_archive_lacks(sim_node) -> None:  # type: ignore[no-untyped-def]
    """570.195.03 is in NVIDIA's CUDA repository only (the archive's 570 is 570.133.20): refused with the
    cuda-keyring command while that repository is not configured; once it is (the fix, run as printed on the
    node), the ubuntu-cuda route installs nvidia-driver-570 and cuda-drivers-570 at exact versions and holds
    them; uninstall removes them."""
    node = sim_node("ubuntu-22.04-t4")
    # the proprietary module (R570 would choose open on a T4): its set has the branch's cuda-drivers meta package
    args = ("--driver-source", "packages", "--driver", "570.195.03", "--kernel-module", "proprietary", *STEPS)
    step = driver_step(plan_json(node, *args))
    assert step["status"] == "blocked", step
    keyring = ("https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/x86_64/cuda-keyring_1.1-1_all.deb")
    assert keyring in step["fix"] and "ubuntu-archive route" in step["reason"], step
    rc, _, err = node.ssh(f"wget -qO /tmp/cuda-keyring.deb {keyring} && dpkg -i /tmp/cuda-keyring.deb && "
                          "apt-get update")  # the fix's node command (root on the node: no sudo)
    assert rc == 0, err
    step = driver_step(plan_json(node, *args))
    assert step["status"] == "change" and "ubuntu-cuda" in step["reason"], step
    assert any(n.startswith("the transaction, as apt-get -s install resolves it") and "nvidia-driver-570 "
               "570.195.03-0ubuntu1" in n for n in step["notes"]), step["notes"]
    code, out = run(node, "install", *args)
    assert code == 0, out
    have = node.installed_packages()
    assert have["nvidia-driver-570"] == "570.195.03-0ubuntu1" and have["cuda-drivers-570"] == "570.195.03-1"
    assert {"nvidia-driver-570", "cuda-drivers-570"} <= set(node.held_packages())
    assert (node.driver() or {}).get("version") == "570.195.03" and node.is_loaded("nvidia")
    code, out = run(node, "uninstall", "--only", "driver", "--stop-gpu-services")
    assert code == 0, out
    assert not {"nvidia-driver-570", "cuda-drivers-570"} & set(node.installed_packages())


def test_ubuntu_with_a_display_manager_plans_the_full_server_driver(sim_node) -> None:  # type: ignore[no-untyped-def]
    node = sim_node("ubuntu-22.04-t4")
    args = ("--driver-source", "packages", "--driver", UBUNTU_NEW, *STEPS)
    headless = json.dumps(driver_step(plan_json(node, *args)))
    assert "nvidia-headless-535-server=" in headless and "nvidia-driver-535-server=" not in headless
    node.write("/etc/X11/default-display-manager", "/usr/sbin/gdm3\n")  # what a display manager's package writes
    full = json.dumps(driver_step(plan_json(node, *args)))
    assert "nvidia-driver-535-server=535.230.02-0ubuntu0.22.04.1" in full and "nvidia-headless-535-server=" not in full
