"""The packages routes (gpunode/driver_packages.py, data/driver_package_routes.csv): names per branch and flavour,
the exact distribution version of an upstream release, the precompiled signed modules under Secure Boot."""

from __future__ import annotations

from gpunode import driver_packages as routes

DEB = {"nvidia-kernel-dkms": ["535.309.01-0+deb12u1", "535.261.03-1"],
       "nvidia-open-kernel-dkms": ["535.309.01-0+deb12u1", "535.261.03-1"],
       "nvidia-smi": ["535.309.01-0+deb12u1", "535.261.03-1"],
       "libcuda1": ["535.309.01-0+deb12u1", "535.261.03-1"],
       "libnvidia-ml1": ["535.309.01-0+deb12u1", "535.261.03-1"],
       "firmware-nvidia-gsp": ["535.309.01-0+deb12u1", "535.261.03-1"],
       "nvidia-persistenced": ["535.171.04-1~deb12u1"], "nvidia-modprobe": ["535.171.04-1~deb12u1"]}
K = "5.15.0-91-generic"


def ubuntu(br: str = "535", ver: str = "535.230.02", older: str = "535.183.06") -> dict[str, list[str]]:
    dv, old = f"{ver}-0ubuntu0.22.04.1", f"{older}-0ubuntu0.22.04.1"
    offered = {f"nvidia-utils-{br}-server": [dv, old]}
    for tag in ("", "-open"):
        offered |= {f"nvidia-dkms-{br}-server{tag}": [dv, old], f"nvidia-headless-{br}-server{tag}": [dv, old],
                    f"nvidia-headless-no-dkms-{br}-server{tag}": [dv, old],
                    f"linux-modules-nvidia-{br}-server{tag}-{K}": ["5.15.0-91.101+1"]}
    return offered


def test_every_row_has_a_source_and_every_os_a_module_row():
    assert all(len(r.source) > 20 and "://" in r.source for r in routes.rows())
    for os_key in ("debian", "ubuntu", "rhel", "sles"):
        assert any(r.role == "module" for r in routes.rows() if r.os == os_key), os_key


def test_debian_exact_versions_per_upstream_release_and_flavour():
    r = routes.plan_route("debian", "535.261.03", "proprietary", kernel="6.1.0-18-amd64", secure_boot=False,
                          gsp=True, offered=DEB)
    assert dict(r.specs()) == {
        "nvidia-kernel-dkms": "535.261.03-1", "nvidia-smi": "535.261.03-1",
        "libcuda1": "535.261.03-1", "libnvidia-ml1": "535.261.03-1",
        "nvidia-persistenced": "535.171.04-1~deb12u1", "nvidia-modprobe": "535.171.04-1~deb12u1",
        "firmware-nvidia-gsp": "535.261.03-1"}
    assert not r.missing and r.module.name == "nvidia-kernel-dkms" and not r.precompiled
    newer = routes.plan_route("debian", "535.309.01", "open", kernel="6.1.0-18-amd64", secure_boot=False, gsp=False,
                              offered=DEB)
    assert newer.module.name == "nvidia-open-kernel-dkms" and newer.module.version == "535.309.01-0+deb12u1"
    assert "firmware-nvidia-gsp" in dict(newer.specs())  # the open module always needs GSP firmware
    pascal = routes.plan_route("debian", "535.261.03", "proprietary", kernel="k", secure_boot=False, gsp=False,
                               offered=DEB)
    # Debian's nvidia-kernel-dkms Depends on firmware-nvidia-gsp of its release whatever the GPU (real apt, real-OS tier)
    assert dict(pascal.specs())["firmware-nvidia-gsp"].startswith("535.261.03")


def test_a_release_not_offered_is_missing_with_what_is():
    r = routes.plan_route("debian", "535.999.01", "proprietary", kernel="k", secure_boot=False, gsp=True, offered=DEB)
    missing = {w.name: w.offered for w in r.missing}
    assert "nvidia-kernel-dkms" in missing and "535.261.03-1" in missing["nvidia-kernel-dkms"]
    assert "nvidia-persistenced" not in missing  # its own version: any release will do
    assert all(w.version is None for w in r.missing)


def test_ubuntu_secure_boot_takes_the_precompiled_signed_modules_for_the_current_release_only():
    signed = routes.plan_route("ubuntu", "535.230.02", "open", kernel=K, secure_boot=True, gsp=True,
                               offered=ubuntu())
    names = dict(signed.specs())
    assert signed.precompiled and f"linux-modules-nvidia-535-server-open-{K}" in names
    assert "nvidia-headless-no-dkms-535-server-open" in names and "nvidia-dkms-535-server-open" not in names
    assert "Canonical signed" in signed.why
    plain = routes.plan_route("ubuntu", "535.230.02", "open", kernel=K, secure_boot=False, gsp=True,
                              offered=ubuntu())
    assert not plain.precompiled and "nvidia-dkms-535-server-open" in dict(plain.specs())
    older = routes.plan_route("ubuntu", "535.183.06", "proprietary", kernel=K, secure_boot=True, gsp=True,
                              offered=ubuntu())
    assert not older.precompiled and older.module.name == "nvidia-dkms-535-server"  # no signed build of it
    assert "DKMS builds the module (see the Secure Boot note)" in older.why  # the step notes the key (signing)
    other_kernel = routes.plan_route("ubuntu", "535.230.02", "open", kernel="6.8.0-45-generic", secure_boot=True,
                                     gsp=True, offered=ubuntu())
    assert not other_kernel.precompiled


def test_rhel_versions_without_epoch_and_the_route_of_each_os():
    offered = {"kmod-nvidia-latest-dkms": ["535.274.02-1.el9", "570.195.03-1.el9"],
               "nvidia-driver": ["535.274.02-1.el9", "570.195.03-1.el9"]}
    r = routes.plan_route("rhel", "570.195.03", "proprietary", kernel="5.14.0-362.8.1.el9_3.x86_64",
                          secure_boot=False, gsp=True, offered=offered)
    assert dict(r.specs()) == {"kmod-nvidia-latest-dkms": "570.195.03-1.el9", "nvidia-driver": "570.195.03-1.el9"}
    assert routes.route_os("rocky", "rhel") == "rhel" and routes.route_os("almalinux", "rhel") == "rhel"
    assert routes.route_os("sles", "suse") == "sles" and routes.route_os("arch", "other") is None


def test_sources_fixes_name_the_repository():
    debian = routes.sources_fix("debian", "bookworm")
    assert routes.DEBIAN_NONFREE_LIST in debian and "bookworm main contrib non-free non-free-firmware" in debian
    assert "bookworm-security" in debian and debian.endswith("sudo apt-get update")
    assert "rhel8/x86_64/cuda-rhel8.repo" in routes.sources_fix("rhel", "", "8.10")
    # SUSE: NVIDIA's sles15 directory, opensuse15 for openSUSE Leap (the directory steps/fabricmanager names)
    assert "sles15/x86_64/cuda-sles15.repo && sudo zypper refresh" in routes.sources_fix("sles", None, "15.6")
    assert "opensuse15/x86_64/cuda-opensuse15.repo" in routes.sources_fix("sles", None, "15.6", "opensuse15")


def test_candidate_names_match_what_the_routes_install():
    assert routes.is_route_package("nvidia-dkms-570-server-open")
    assert routes.is_route_package(f"linux-modules-nvidia-535-server-{K}")
    assert routes.is_route_package("kmod-nvidia-open-dkms") and not routes.is_route_package("nvidia-container-toolkit")


def test_ubuntu_prefers_the_archive_and_takes_nvidias_repository_for_a_release_only_it_offers():
    cuda = {"nvidia-driver-570": ["570.195.03-0ubuntu1", "570.172.08-0ubuntu1"],
            "nvidia-driver-570-open": ["570.195.03-0ubuntu1"], "cuda-drivers-570": ["570.195.03-1"],
            # the archive's server set of the same branch, at another release
            "nvidia-utils-570-server": ["570.133.20-0ubuntu0.22.04.1"],
            "nvidia-dkms-570-server": ["570.133.20-0ubuntu0.22.04.1"],
            "nvidia-headless-570-server": ["570.133.20-0ubuntu0.22.04.1"]}
    offered = ubuntu() | cuda
    archive = routes.plan_route("ubuntu", "535.230.02", "proprietary", kernel=K, secure_boot=False, gsp=True,
                                offered=offered)
    assert archive.id == "ubuntu-archive" and not archive.missing
    nvidia = routes.plan_route("ubuntu", "570.195.03", "proprietary", kernel=K, secure_boot=False, gsp=True,
                               offered=offered)
    assert nvidia.id == "ubuntu-cuda"
    assert dict(nvidia.specs()) == {"nvidia-driver-570": "570.195.03-0ubuntu1", "cuda-drivers-570": "570.195.03-1"}
    assert nvidia.module.name == "nvidia-driver-570"
    opened = routes.plan_route("ubuntu", "570.195.03", "open", kernel=K, secure_boot=False, gsp=True, offered=offered)
    assert dict(opened.specs()) == {"nvidia-driver-570-open": "570.195.03-0ubuntu1"}
    # the archive's release of the branch stays the archive's
    server = routes.plan_route("ubuntu", "570.133.20", "proprietary", kernel=K, secure_boot=False, gsp=True,
                               offered=offered)
    assert server.id == "ubuntu-archive" and not server.missing
    # offered by neither: the distribution's route names what is missing
    neither = routes.plan_route("ubuntu", "570.999.01", "proprietary", kernel=K, secure_boot=False, gsp=True,
                                offered=offered)
    assert neither.id == "ubuntu-archive" and neither.missing
    assert routes.routes_of("ubuntu") == ("ubuntu-archive", "ubuntu-cuda")
    assert routes.is_route_package("cuda-drivers-570") and routes.is_route_package("nvidia-driver-570-open")


def test_nvidias_repository_is_set_up_by_its_keyring_package_per_release():
    assert routes.cuda_repo_dir("ubuntu", "22.04", "debian") == "ubuntu2204"
    assert routes.cuda_repo_dir("debian", "12", "debian") == "debian12"
    fix = str(routes.cuda_keyring_fix("ubuntu", "24.04", "debian", "x86_64"))
    assert ("https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/x86_64/cuda-keyring_1.1-1_all.deb"
            in fix and "sudo dpkg -i /tmp/cuda-keyring.deb && sudo apt-get update" in fix)
    # an Arm server's keyring lives under NVIDIA's "sbsa" directory, not x86_64's
    assert "/ubuntu2204/sbsa/cuda-keyring_1.1-1_all.deb" in str(routes.cuda_keyring_fix("ubuntu", "22.04", "debian",
                                                                                         "aarch64"))
    # a release or a machine NVIDIA publishes no repository for gets no keyring fix (its URL would not exist)
    assert routes.cuda_keyring_fix("ubuntu", "23.10", "debian", "x86_64") is None
    assert routes.cuda_keyring_fix("ubuntu", "22.04", "debian", "riscv64") is None


def test_the_repository_fix_names_the_nodes_machine_directory():
    assert "rhel9/sbsa/cuda-rhel9.repo" in str(routes.sources_fix("rhel", "", "9.4", "rhel9", "aarch64"))
    assert "sles15/sbsa/cuda-sles15.repo" in str(routes.sources_fix("sles", None, "15.6", "sles15", "aarch64"))
    assert "rhel9/x86_64/cuda-rhel9.repo" in str(routes.sources_fix("rhel", "", "9.4", "rhel9", "x86_64"))


def test_ubuntu_with_a_display_stack_takes_the_full_driver_not_the_headless_set():
    offered = ubuntu() | {f"nvidia-driver-535-server{t}": ["535.230.02-0ubuntu0.22.04.1"] for t in ("", "-open")}
    desk = routes.plan_route("ubuntu", "535.230.02", "proprietary", kernel=K, secure_boot=False, gsp=True,
                             offered=offered, desktop=True)
    assert dict(desk.specs()) == {n: "535.230.02-0ubuntu0.22.04.1" for n in (
        "nvidia-dkms-535-server", "nvidia-driver-535-server", "nvidia-utils-535-server")}
    headless = routes.plan_route("ubuntu", "535.230.02", "open", kernel=K, secure_boot=False, gsp=True,
                                 offered=offered)
    assert "nvidia-headless-535-server-open" in dict(headless.specs())
    assert not any(n.startswith("nvidia-driver-") for n in dict(headless.specs()))
    # Secure Boot with the precompiled signed modules: the no-DKMS headless set, display stack or not
    signed = routes.plan_route("ubuntu", "535.230.02", "proprietary", kernel=K, secure_boot=True, gsp=True,
                               offered=offered, desktop=True)
    assert signed.precompiled and "nvidia-headless-no-dkms-535-server" in dict(signed.specs())
    assert "nvidia-driver-535-server" not in dict(signed.specs())


def test_a_dkms_package_builds_at_install_for_the_kernels_its_maintainer_script_picks_not_every_kernel():
    """Debian and Ubuntu (dkms's common.postinst, as run on the real-OS tier): the running kernel and the newest
    installed one; a chroot whose running kernel is not installed: all installed kernels on a first install, the
    newest only on an upgrade. NVIDIA's RPMs: the running kernel. Unknown managers: None."""
    kernels = ("6.1.0-18-amd64", "6.1.0-20-amd64", "6.1.0-25-amd64")
    assert routes.dkms_kernels("apt", "6.1.0-18-amd64", kernels, kernels[-1], False) == ("6.1.0-18-amd64",
                                                                                         "6.1.0-25-amd64")
    assert routes.dkms_kernels("apt", "6.1.0-25-amd64", kernels, kernels[-1], True) == ("6.1.0-25-amd64",)
    assert routes.dkms_kernels("apt", "6.18.44-host", kernels, kernels[-1], False) == kernels
    assert routes.dkms_kernels("apt", "6.18.44-host", kernels, kernels[-1], True) == ("6.1.0-25-amd64",)
    assert routes.dkms_kernels("dnf", "5.14.0-427.el9.x86_64", ("5.14.0-427.el9.x86_64", "5.14.0-503.el9.x86_64"),
                               "5.14.0-503.el9.x86_64", False) == ("5.14.0-427.el9.x86_64",)
    assert routes.dkms_kernels("zypper", "6.4.0-150600.23.25-default", (), None, False) is None
    assert "every kernel" not in " ".join(routes.DKMS_AT_INSTALL.values())
