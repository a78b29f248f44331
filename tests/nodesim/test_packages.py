"""apt/dpkg and dnf/rpm shims over the simulated package catalog."""

from __future__ import annotations

import hashlib

import pytest

from gpunode.facts import driver as driver_facts
from tests.conftest import FIXTURES

pytestmark = pytest.mark.integration

TOOLKIT_REPO = ("curl -fsSL https://nvidia.github.io/libnvidia-container/gpgkey | "
                "gpg --dearmor -o /usr/share/keyrings/nvidia-container-toolkit-keyring.gpg && "
                "curl -s -L https://nvidia.github.io/libnvidia-container/stable/deb/nvidia-container-toolkit.list | "
                "sed 's#deb https://#deb [signed-by=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg] https://#g' "
                "> /etc/apt/sources.list.d/nvidia-container-toolkit.list")
PINNED = " ".join(f"{p}=1.17.8-1" for p in ("nvidia-container-toolkit", "nvidia-container-toolkit-base",
                                             "libnvidia-container-tools", "libnvidia-container1"))


def test_apt_unknown_package_and_repo_gating(sim_node):
    node = sim_node("ubuntu-22.04-nogpu")
    rc, out, err = node.ssh("apt-get install -y no-such-package")
    assert rc == 100 and err == "E: Unable to locate package no-such-package\n"
    rc, out, err = node.ssh("apt-get install -y nvidia-container-toolkit")
    assert rc == 100 and "E: Unable to locate package nvidia-container-toolkit" in err
    rc, _, err = node.ssh(TOOLKIT_REPO)
    assert rc == 0, err
    # configured but not fetched yet
    assert node.ssh("apt-get install -y nvidia-container-toolkit")[0] == 100
    rc, out, err = node.ssh("apt-get update")
    assert rc == 0, err
    assert "https://nvidia.github.io/libnvidia-container/stable/deb/amd64  InRelease" in out
    rc, out, err = node.ssh("apt-get install -y " + PINNED)
    assert rc == 0, err
    assert node.installed_packages()["nvidia-container-toolkit"] == "1.17.8-1"
    assert node.exists("/usr/bin/nvidia-ctk") and node.exists("/usr/bin/nvidia-container-runtime-hook")
    assert node.calls("apt-get")[-1] == ["apt-get", "install", "-y", *PINNED.split()]
    # /var/lib/dpkg/status follows the database
    assert "Package: nvidia-container-toolkit\nStatus: install ok installed" in node.read("/var/lib/dpkg/status")
    rc, out, _ = node.ssh("dpkg-query -W -f='${Status} ${Version}\\n' nvidia-container-toolkit; dpkg -l libnvidia-container1 | tail -1")
    assert out.splitlines()[0] == "install ok installed 1.17.8-1"
    assert out.splitlines()[1].split()[:3] == ["ii", "libnvidia-container1", "1.17.8-1"]
    rc, _, err = node.ssh("dpkg-query -W nvidia-driver-535")
    assert rc == 1 and err == "dpkg-query: no packages found matching nvidia-driver-535\n"


def test_apt_unmet_pinned_dependency_and_missing_keyring(sim_node):
    node = sim_node("ubuntu-24.04-nogpu")
    node.ssh(TOOLKIT_REPO + " && apt-get update")
    rc, out, err = node.ssh("apt-get install -y nvidia-container-toolkit=1.17.8-1")
    assert rc == 100
    assert (" nvidia-container-toolkit : Depends: nvidia-container-toolkit-base (= 1.17.8-1) but 1.20.0-1 is to be "
            "installed") in out
    node.remove("/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg")
    rc, out, err = node.ssh("apt-get update")
    assert rc == 100 and "NO_PUBKEY" in err and "is not signed" in err


def test_apt_prompt_hold_downgrade_and_lock(sim_node):
    node = sim_node("ubuntu-22.04-nogpu")
    node.ssh(TOOLKIT_REPO + " && apt-get update")
    rc, out, _ = node.ssh("apt-get install nvidia-container-toolkit")  # no -y, extra packages: asks
    assert rc == 1 and out.endswith("Do you want to continue? [Y/n] Abort.\n")
    assert node.ssh("apt-get install -y nvidia-container-toolkit")[0] == 0
    rc, out, _ = node.ssh("apt-mark hold nvidia-container-toolkit; apt-mark showhold")
    assert out == "nvidia-container-toolkit set on hold.\nnvidia-container-toolkit\n"
    rc, _, err = node.ssh("apt-get install -y " + PINNED)
    assert rc == 100 and "E: Held packages were changed and -y was used without --allow-change-held-packages." in err
    rc, _, err = node.ssh("apt-get install -y --allow-change-held-packages " + PINNED)
    assert rc == 100 and "--allow-downgrades" in err
    rc, _, err = node.ssh("apt-get install -y --allow-change-held-packages --allow-downgrades " + PINNED)
    assert rc == 0, err
    node.set_apt_lock(2)
    for _ in range(2):
        rc, _, err = node.ssh("apt-get install -y curl")
        assert rc == 100 and "Could not get lock /var/lib/dpkg/lock-frontend" in err
    assert node.ssh("apt-get install -y curl")[0] == 0


def test_apt_profile_lock(sim_node):
    node = sim_node("debian-12-nogpu", apt_locked=True)
    assert node.ssh("apt-get update")[0] == 100


def test_cuda_keyring_deb_and_driver_package_dkms(sim_node):
    node = sim_node("ubuntu-22.04-t4", kernel_headers=False)
    url = "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/x86_64/cuda-keyring_1.1-1_all.deb"
    rc, _, err = node.ssh(f"cd /tmp && wget -q {url} && dpkg -i cuda-keyring_1.1-1_all.deb && apt-get update")
    assert rc == 0, err
    assert node.exists("/etc/apt/sources.list.d/cuda-ubuntu2204-x86_64.list")
    assert node.installed_packages()["cuda-keyring"] == "1.1-1"
    rc, out, err = node.ssh("apt-get install -y cuda-drivers-550")
    assert rc == 100
    assert "Error! Your kernel headers for kernel 5.15.0-91-generic cannot be found." in out
    assert "E: Sub-process /usr/bin/dpkg returned an error code (1)" in err
    rc, _, err = node.ssh("apt-get install -y linux-headers-$(uname -r) && apt-get install -y --reinstall cuda-drivers-550")
    assert rc == 0, err
    drv = node.driver()
    assert drv["version"] == "550.163.01" and drv["method"] == "pkg" and drv["dkms"] == "1"
    assert node.exists("/usr/bin/nvidia-smi")
    # packages do not load modules: a reboot does (nouveau is not loaded once a driver is installed)
    assert "nvidia" not in node.loaded_modules()
    node.reboot()
    assert "nvidia" in node.loaded_modules() and "nouveau" not in node.loaded_modules()
    rc, out, _ = node.ssh("nvidia-smi --query-gpu=driver_version --format=csv,noheader")
    assert out == "550.163.01\n"


def test_unknown_url(sim_node):
    node = sim_node("ubuntu-22.04-nogpu")
    rc, _, err = node.ssh("curl -fsSL https://example.invalid/x")
    assert rc == 6 and err == "curl: (6) Could not resolve host: example.invalid\n"
    rc, _, err = node.ssh("curl -fsSL https://nvidia.github.io/nope")
    assert rc == 22
    node.serve_url("https://example.invalid/x", "served\n")
    assert node.ssh("curl -fsSL https://example.invalid/x")[1] == "served\n"


def test_dnf_rpm_epel_cuda_versionlock(sim_node):
    node = sim_node("rocky-9-a100x8", nouveau_loaded=False)
    rc, out, err = node.ssh("dnf install -y dkms")
    assert rc == 1 and "No match for argument: dkms" in out and "Error: Unable to find a match: dkms" in err
    rc, out, _ = node.ssh("dnf install dkms epel-release")
    assert rc == 1
    assert node.ssh("dnf install -y epel-release && dnf install -y dkms")[0] == 0
    rc, out, err = node.ssh("dnf config-manager --add-repo "
                            "https://developer.download.nvidia.com/compute/cuda/repos/rhel9/x86_64/cuda-rhel9.repo")
    assert rc == 0, err
    rc, out, err = node.ssh("dnf module install -y nvidia-driver:535-dkms")
    assert rc == 0, err
    assert node.driver()["version"] == "535.274.02"
    rc, out, _ = node.ssh("rpm -q nvidia-driver; rpm -q --qf '%{VERSION}\\n' nvidia-driver; rpm -q nope")
    assert out == ("nvidia-driver-535.274.02-1.el9.x86_64\n535.274.02\npackage nope is not installed\n")
    rc, out, _ = node.ssh("dnf versionlock add nvidia-driver")
    assert rc == 1 and "No such command: versionlock" in out
    rc, out, err = node.ssh("dnf install -y python3-dnf-plugin-versionlock && dnf versionlock add nvidia-driver")
    assert rc == 0 and "Adding versionlock on: nvidia-driver-0:535.274.02-1.el9.*" in out
    assert "nvidia-driver" in node.held_packages()
    # the plugin's file (what gpunode's facts read), kept when the package goes, as real dnf keeps it
    lock_list = node.read("/etc/dnf/plugins/versionlock.list")
    assert lock_list.startswith("\n# Added lock on ") and lock_list.endswith("\nnvidia-driver-0:535.274.02-1.el9.*\n")
    rc, out, _ = node.ssh("dnf versionlock add nvidia-driver")
    assert rc == 0 and "Package already locked in equivalent form: nvidia-driver-0:535.274.02-1.el9.*" in out
    assert node.ssh("dnf -q versionlock list")[1] == "nvidia-driver-0:535.274.02-1.el9.*\n"
    assert node.ssh("dnf remove -y nvidia-driver")[0] == 0
    assert "nvidia-driver" not in node.installed_packages()
    assert node.ssh("dnf -q versionlock list")[1] == "nvidia-driver-0:535.274.02-1.el9.*\n"
    assert node.ssh("dnf install -y nvidia-driver-535.274.02-1.el9")[0] == 0  # the locked version installs
    assert "nvidia-driver" in node.held_packages()
    rc, out, _ = node.ssh("dnf versionlock delete nvidia-driver")
    assert rc == 0 and "Deleting versionlock for: nvidia-driver-0:535.274.02-1.el9.*" in out
    assert "nvidia-driver" not in node.held_packages() and node.ssh("dnf -q versionlock list")[1] == ""
    rc, _, err = node.ssh("dnf versionlock delete nvidia-driver")
    assert rc == 1 and "no matching package to delete" in err
    assert node.ssh("dnf versionlock add nvidia-driver")[0] == 0
    rc, out, _ = node.ssh("dnf install -y nvidia-fabric-manager-535.274.02-1")
    assert rc == 0 and node.installed_packages()["nvidia-fabric-manager"] == "535.274.02-1"
    node.reboot()
    rc, _, err = node.ssh("systemctl enable --now nvidia-fabricmanager")
    assert rc == 0, err
    assert node.unit("nvidia-fabricmanager") == {"active": "active", "enabled": "enabled"}


def test_fabric_manager_version_must_match_driver(sim_node):
    node = sim_node("ubuntu-22.04-h100x8", preinstalled_driver="565.57.01")
    node.install_package("nvidia-fabricmanager-550")
    rc, _, err = node.ssh("systemctl start nvidia-fabricmanager")
    assert rc == 1 and "Job for nvidia-fabricmanager.service failed" in err
    assert "don't match with driver version" in node.read("/var/log/fabricmanager.log")
    rc, out, _ = node.ssh("nvidia-smi --query-gpu=fabric.state,fabric.status --format=csv,noheader | head -1")
    assert out == "In Progress, [N/A]\n"
    node.install_package("nvidia-fabricmanager-565")
    assert node.ssh("systemctl restart nvidia-fabricmanager")[0] == 0
    rc, out, _ = node.ssh("nvidia-smi --query-gpu=fabric.state,fabric.status --format=csv,noheader | head -1")
    assert out == "Completed, Success\n"


def test_host_package_database_untouched_by_node_installs(sim_node):
    before = hashlib.sha256(open("/var/lib/dpkg/status", "rb").read()).hexdigest()
    node = sim_node("ubuntu-22.04-nogpu")
    node.ssh("apt-get install -y dkms && dpkg -r dkms")
    assert hashlib.sha256(open("/var/lib/dpkg/status", "rb").read()).hexdigest() == before


def test_apt_refuses_to_remove_a_held_package_like_real_apt(sim_node):
    node = sim_node("ubuntu-22.04-nogpu")
    node.ssh(TOOLKIT_REPO + " && apt-get update && apt-get install -y nvidia-container-toolkit")
    assert node.ssh("apt-mark hold nvidia-container-toolkit")[0] == 0
    rc, out, err = node.ssh("apt-get remove -y nvidia-container-toolkit")
    assert rc == 100 and "The following held packages will be changed:\n  nvidia-container-toolkit" in out
    assert "E: Held packages were changed and -y was used without --allow-change-held-packages." in err
    assert "nvidia-container-toolkit" in node.installed_packages()
    assert node.ssh("apt-mark unhold nvidia-container-toolkit && apt-get remove -y nvidia-container-toolkit")[0] == 0
    assert "nvidia-container-toolkit" not in node.installed_packages()


def test_debian_packaged_driver_has_debians_names(sim_node):
    """As on the real-OS tier's nvidia VM (tests/fixtures/real/debian-nvidia): DKMS module nvidia-current, module
    files nvidia-current*.ko in updates/dkms, libnvidia-ml under nvidia/current, the newest version the sources
    offer (bookworm-security's 535.309.01, as the VM got); gpunode's facts read them as Debian's packaged driver."""
    node = sim_node("debian-12-nogpu", kernel_headers=True)
    rc, _, err = node.ssh("apt-get install -y nvidia-kernel-dkms")
    assert rc == 0, err
    kernel = node.kernel
    rc, out, _ = node.ssh("dkms status")
    assert out == f"nvidia-current/535.309.01, {kernel}, x86_64: installed\n"
    assert node.exists(f"/lib/modules/{kernel}/updates/dkms/nvidia-current.ko")
    assert node.exists(f"/lib/modules/{kernel}/updates/dkms/nvidia-current-uvm.ko")
    assert not node.exists(f"/lib/modules/{kernel}/updates/dkms/nvidia.ko")
    assert node.exists("/usr/lib/x86_64-linux-gnu/nvidia/current/libnvidia-ml.so.535.309.01")
    rc, _, err = node.ssh("modinfo nvidia")  # real kmod: the file is nvidia-current.ko, no module is named so
    assert rc == 1 and err == "modinfo: ERROR: Module nvidia not found.\n"
    rc, out, _ = node.ssh(f"modinfo -F name /lib/modules/{kernel}/updates/dkms/nvidia-current-uvm.ko")
    assert (rc, out) == (0, "nvidia_uvm\n")
    # gpunode's module fact finds it by the name the kernel gives the file
    rc, out, _ = node.ssh(driver_facts.MODULE.snippet)
    module = driver_facts.parse_module(out)
    assert (module.version, module.flavour) == ("535.309.01", "proprietary")
    assert module.filename == f"/lib/modules/{kernel}/updates/dkms/nvidia-current.ko"


def test_debian_dkms_package_skips_a_kernel_without_headers_as_the_real_postinst(sim_node):
    """Debian's nvidia-kernel-dkms runs dkms's common.postinst (dkms 3.0.10, read on the real Debian 12 tree of
    tests/realos/test_debian12_packages_upgrade.py): a kernel without headers is skipped with this text and the
    package installs (exit 0); no module is built for it. The simulator used to fail the install with `dkms
    autoinstall`'s "Error! Your kernel headers ... cannot be found" (the kernel hook's text, not the package's)."""
    node = sim_node("debian-12-nogpu", kernel_headers=False)
    rc, out, err = node.ssh("apt-get install -y nvidia-kernel-dkms")
    assert rc == 0, out + err
    assert (f"Module build for kernel {node.kernel} was skipped since the\n"
            "kernel headers for this kernel do not seem to be installed.\n") in out, out
    assert "Error!" not in out
    assert not node.exists(f"/lib/modules/{node.kernel}/updates/dkms/nvidia-current.ko")


def test_debian_packaged_driver_without_gpu_answers_as_the_real_programs(sim_node):
    """The real texts of the tier's nvidia VM (tests/fixtures/real/debian-nvidia, the state with Debian's modprobe
    configuration linked in): the simulator prints the same for modprobe, nvidia-smi and nvidia-modprobe."""
    real = FIXTURES / "debian-nvidia"
    node = sim_node("debian-12-nogpu", kernel_headers=True)
    assert node.ssh("apt-get install -y nvidia-kernel-dkms libcuda1")[0] == 0
    rc, _, err = node.ssh("modprobe nvidia")
    assert rc == 1 and err == (real / "modprobe-nvidia_with-libcuda1.txt").read_text()
    _, dmesg, _ = node.ssh("dmesg")
    kernel_lines = [line.split("] ", 1)[1] for line in (real / "dmesg_modprobe-nvidia_no-gpu.txt").read_text().splitlines()]
    assert all(line in dmesg for line in kernel_lines), dmesg
    rc, out, err = node.ssh("nvidia-modprobe -u -c=0")
    assert (rc, out, err) == (1, "", "")
    rc, out, _ = node.ssh("nvidia-smi")
    assert rc == 9 and out == (real / "nvidia-smi_no-gpu.txt").read_text()


def _journal_of_failed_start(text: str) -> list[str]:
    """A failed start's journal lines with the daemon's PID taken out (it differs from run to run)."""
    return [line.replace(line[line.index("("):], "(PID)") if line.startswith(("Started (", "Shutdown (")) else line
            for line in text.splitlines()]


def test_debian_packaged_driver_needs_the_glx_alternative_as_on_the_real_vm(sim_node):
    """Debian links /etc/modprobe.d/nvidia.conf (its `install nvidia modprobe -i nvidia-current` redirect) and the
    loader path of its libraries only through the glx alternative, registered once libcuda1 (or the GL
    libraries of nvidia-driver) is installed. The compute-only set (the real-OS tier's nvidia VM) therefore
    answers `modprobe nvidia` with "not found" although DKMS built the module, and nvidia-persistenced cannot
    open libnvidia-cfg.so.1; with libcuda1 the real texts change (tests/fixtures/real/debian-nvidia)."""
    real = FIXTURES / "debian-nvidia"
    kernel_of_capture = "6.1.0-56-amd64"
    node = sim_node("debian-12-nogpu", kernel_headers=True)
    assert node.ssh("apt-get install -y nvidia-kernel-dkms")[0] == 0
    assert node.ssh(f"test -e /lib/modules/{node.kernel}/updates/dkms/nvidia-current.ko")[0] == 0  # built
    assert not node.exists("/etc/modprobe.d/nvidia.conf")
    assert node.read("/etc/nvidia/nvidia-modprobe.conf") == (real / "etc-nvidia-nvidia-modprobe.conf").read_text()
    for name in ("nvidia", "nvidia-uvm"):
        rc, _, err = node.ssh(f"modprobe {name}")
        expected = (real / f"modprobe-{name}_without-libcuda1.txt").read_text().replace(kernel_of_capture, node.kernel)
        assert (rc, err) == (1, expected)
    rc, _, err = node.ssh("systemctl restart nvidia-persistenced")
    assert rc == 1 and err == (real / "systemctl-restart-nvidia-persistenced.txt").read_text()
    rc, out, _ = node.ssh("journalctl -u nvidia-persistenced --no-pager -o cat")
    assert _journal_of_failed_start(out) == \
        _journal_of_failed_start((real / "journal_nvidia-persistenced_without-libcuda1.txt").read_text())

    assert node.ssh("apt-get install -y libcuda1")[0] == 0  # registers the glx alternative
    assert node.ssh("readlink -f /etc/modprobe.d/nvidia.conf")[1] == "/etc/nvidia/nvidia-modprobe.conf\n"
    rc, _, err = node.ssh("modprobe nvidia")
    assert (rc, err) == (1, (real / "modprobe-nvidia_with-libcuda1.txt").read_text())
    node.ssh("rm -f /var/lib/nodesim/journal/nvidia-persistenced.service")
    assert node.ssh("systemctl restart nvidia-persistenced")[0] == 1
    rc, out, _ = node.ssh("journalctl -u nvidia-persistenced --no-pager -o cat")
    assert _journal_of_failed_start(out) == \
        _journal_of_failed_start((real / "journal_nvidia-persistenced_no-gpu.txt").read_text())

    assert node.ssh("apt-get purge -y libcuda1")[0] == 0  # the alternative's links go with it
    assert not node.exists("/etc/modprobe.d/nvidia.conf")
    assert node.ssh("modprobe nvidia")[2].startswith("modprobe: FATAL: Module nvidia not found")


def test_debian_nvidia_driver_brings_the_glx_alternative(sim_node):
    node = sim_node("debian-12-nogpu", kernel_headers=True)
    assert node.ssh("apt-get install -y nvidia-driver")[0] == 0
    assert "libcuda1" in node.ssh("dpkg-query -W -f '${Package}\\n'")[1].split()
    assert node.exists("/etc/modprobe.d/nvidia.conf")


def test_apt_simulation_answers_like_real_apt_and_changes_nothing(sim_node):
    """`apt-get -s install` resolves as the real install would, prints apt's Inst/Conf lines (what
    facts/transaction.py parses) and changes nothing; a refused transaction is exit 100 with apt's wording."""
    from gpunode.facts.registry import Section
    from gpunode.facts.transaction import INSTALL, parse_apt

    node = sim_node("ubuntu-22.04-nogpu")
    node.ssh(TOOLKIT_REPO + " && apt-get update")
    before = node.read("/var/lib/dpkg/status")
    rc, out, err = node.ssh("apt-get -s install --no-install-recommends nvidia-container-toolkit=1.17.8-1 "
                            "nvidia-container-toolkit-base=1.17.8-1 libnvidia-container-tools=1.17.8-1 "
                            "libnvidia-container1=1.17.8-1")
    assert rc == 0, err
    assert "Inst nvidia-container-toolkit (1.17.8-1 " in out and "Conf nvidia-container-toolkit (1.17.8-1 " in out
    found = parse_apt(Section(out, rc))
    assert found.error is None
    assert {(c.action, c.name, c.version) for c in found.changes} == {
        (INSTALL, n, "1.17.8-1") for n in ("nvidia-container-toolkit", "nvidia-container-toolkit-base",
                                           "libnvidia-container-tools", "libnvidia-container1")}
    assert node.read("/var/lib/dpkg/status") == before and "nvidia-container-toolkit" not in node.installed_packages()
    node.ssh("apt-get install -y " + PINNED)
    rc, out, _ = node.ssh("apt-get -s install --allow-downgrades nvidia-container-toolkit=1.17.8-1")
    assert rc == 0 and "Inst" not in out  # already there: nothing to do
    rc, out, err = node.ssh("apt-get -s install nvidia-container-toolkit=9.9.9-1")
    assert rc == 100 and "E: Version '9.9.9-1' for 'nvidia-container-toolkit' was not found" in err
    assert parse_apt(Section(out + err, rc)).error == "E: Version '9.9.9-1' for 'nvidia-container-toolkit' was not found"


@pytest.mark.parametrize("profile", ["debian-12-nogpu", "rocky-9-t4"])
def test_the_toolkit_repository_metadata_is_read_as_the_real_layouts_publish_it(sim_node, profile):
    """facts/offers.py's scripts on the node's own shell and tools (dash, busybox awk/tr/gzip, curl): the flat
    apt repository's Packages index, or rpm-md's repomd.xml then its gzip'd primary metadata; read-only (no
    temporary file left); a repository the node cannot reach is the downloader's error."""
    from gpunode.facts import offers
    from gpunode.facts.registry import Section
    from gpunode.steps import toolkit

    node = sim_node(profile)
    deb = profile.startswith("debian")
    url = f"{toolkit.REPO}/stable/deb/amd64" if deb else f"{toolkit.REPO}/stable/rpm/x86_64"
    read = offers.apt_flat if deb else offers.rpm_md
    before = node.ssh("ls -a /tmp /var/tmp")[1]
    rc, out, err = node.ssh(read(url, toolkit.PACKAGES).script)
    found = read(url, toolkit.PACKAGES).parse(Section(out + err, rc))
    assert found.error is None, out + err
    assert found.common(toolkit.PACKAGES) == ["1.20.0-1", "1.18.0-1", "1.17.8-1"]  # the catalog's releases
    assert node.ssh("ls -a /tmp /var/tmp")[1] == before
    rc, out, err = node.ssh(read("https://nvidia.github.io/no-such", toolkit.PACKAGES).script)
    lost = read("https://nvidia.github.io/no-such", toolkit.PACKAGES).parse(Section(out + err, rc))
    assert lost.error is not None and "cannot read https://nvidia.github.io/no-such/" in lost.error
    assert "curl: (22)" in lost.error and lost.versions == {}
