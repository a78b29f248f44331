"""The package-manager table: each manager's command lines, and the lock wait wrapped around every call."""

from __future__ import annotations

import pytest

from gpunode import fabric_packages, pkgmgr


def test_install_pinned_and_downgrade_per_manager():
    apt, dnf, yum, zypper = (pkgmgr.get(n) for n in ("apt", "dnf", "yum", "zypper"))
    assert apt.install([apt.spec("x", "1-1")], downgrade=True) == (
        "apt-get", "install", "-y", "--no-install-recommends", "--allow-downgrades", "x=1-1")
    assert dnf.install([dnf.spec("x", "1-1")], downgrade=True) == ("dnf", "install", "-y", "x-1-1")
    assert yum.downgrade(["x-1-1"]) == ("yum", "downgrade", "-y", "x-1-1")
    assert zypper.install(["x-1-1"], downgrade=True) == ("zypper", "--non-interactive", "install", "--oldpackage",
                                                         "x-1-1")
    assert zypper.install_files(["/d/x.rpm"]) == ("zypper", "--non-interactive", "install", "--oldpackage",
                                                  "--allow-unsigned-rpm", "/d/x.rpm")


def test_hold_refresh_and_repositories_per_manager():
    assert pkgmgr.get("apt").hold("x", "1-1") == ("apt-mark", "hold", "x")
    assert pkgmgr.get("dnf").hold("x", "1-1") == ("dnf", "versionlock", "add", "x-1-1")
    assert pkgmgr.get("zypper").unhold(["x"]) == ("zypper", "--non-interactive", "removelock", "x")
    assert pkgmgr.get("apt").refresh_argv == ("apt-get", "update") and pkgmgr.get("dnf").refresh_argv is None
    assert pkgmgr.get("yum").add_repo("u") == ("yum-config-manager", "--add-repo", "u")
    with pytest.raises(ValueError, match="repositories are files"):
        pkgmgr.get("apt").add_repo("u")
    with pytest.raises(ValueError, match="unknown package manager 'pacman'"):
        pkgmgr.get("pacman")


def test_the_lock_wait_knows_every_managers_lock():
    for manager in pkgmgr.MANAGERS.values():
        assert all(f in pkgmgr.LOCKED_RUN for f in manager.lock_files)
    assert "Could not get lock" in pkgmgr.LOCKED_RUN and "System management is locked" in pkgmgr.LOCKED_RUN
    assert "@PIDFILES@" not in pkgmgr.LOCKED_RUN


def test_failures_are_explained():
    message, fix = pkgmgr.explain_failure("E: Unable to locate package linux-headers-6.1.0-99-amd64\n",
                                          "apt-get install -y x", 100)
    assert message.startswith("linux-headers-6.1.0-99-amd64 is not available") and fix == pkgmgr.HEADERS_FIX
    message, _ = pkgmgr.explain_failure("No match for argument: dkms\n", "dnf install -y dkms", 1)
    assert "no package dkms" in message


def test_fabric_manager_names_around_the_r580_rename():
    assert fabric_packages.package_name(535, "deb") == "nvidia-fabricmanager-535"
    assert fabric_packages.package_name(535, "rpm") == "nvidia-fabric-manager"
    assert {fabric_packages.package_name(580, f) for f in ("deb", "rpm")} == {"nvidia-fabricmanager"}
    assert fabric_packages.package_version("580.105.08") == "580.105.08-1"
    assert all(fabric_packages.PACKAGE.match(n) for f in ("deb", "rpm") for n in fabric_packages.all_names(f))
    assert not fabric_packages.PACKAGE.match("nvidia-fabricmanager-dev-535")


def test_kernel_metapackages_and_headers_packages():
    from gpunode import pkgmgr

    metas = [n for n in ("linux-generic", "linux-image-generic", "linux-headers-generic", "linux-image-amd64",
                         "linux-generic-hwe-22.04", "linux-aws", "linux-image-5.15.0-91-generic", "linux-firmware",
                         "linux-base", "linux-libc-dev", "linux-tools-generic", "linux-image-unsigned-6.8.0-45-generic",
                         "linux-modules-nvidia-535-server-generic", "linux-hwe-6.5-tools-6.5.0-1")
             if pkgmgr.is_kernel_metapackage("apt", n)]
    assert metas == ["linux-generic", "linux-image-generic", "linux-headers-generic", "linux-image-amd64",
                     "linux-generic-hwe-22.04", "linux-aws"]
    assert pkgmgr.is_kernel_metapackage("dnf", "kernel") and not pkgmgr.is_kernel_metapackage("dnf", "kernel-headers")
    assert pkgmgr.headers_package("apt", "5.15.0-92-generic") == "linux-headers-5.15.0-92-generic"
    assert pkgmgr.headers_package("dnf", "5.14.0-427.13.1.el9_4.x86_64") == "kernel-devel-5.14.0-427.13.1.el9_4.x86_64"
    assert pkgmgr.rpm_kernel_version("5.14.0-427.13.1.el9_4.x86_64") == "5.14.0-427.13.1.el9_4"


def test_suse_names_a_kernels_packages_by_its_flavour():
    from gpunode import pkgmgr

    suse = "6.4.0-150600.23.25-default"
    assert pkgmgr.headers_package("zypper", suse) == "kernel-default-devel=6.4.0-150600.23.25"
    assert pkgmgr.headers_package("zypper", "6.4.0-150600.23.25-azure") == "kernel-azure-devel=6.4.0-150600.23.25"
    assert pkgmgr.headers_package("zypper", "6.4.0") is None  # no flavour: the package cannot be told
    assert pkgmgr.remove_kernel("zypper", suse, headers=True) == (
        "zypper remove kernel-default=6.4.0-150600.23.25 kernel-default-devel=6.4.0-150600.23.25")
    assert pkgmgr.is_kernel_metapackage("zypper", "kernel-default")
    # zypper does not remove a locked package: its locks go first; apt's purge and dnf's remove ignore holds
    assert pkgmgr.get("zypper").purge_held(["a"]) == (("zypper", "--non-interactive", "removelock", "a"),
                                                     ("zypper", "--non-interactive", "remove", "a"))
    assert pkgmgr.get("dnf").purge_held(["a"]) == (("dnf", "remove", "-y", "a"),)
    assert not pkgmgr.is_kernel_metapackage("zypper", "kernel-firmware-nvidia")
    # zypper's refusal of the headers is the headers' failure, with the fix naming SUSE's packages
    message, fix = pkgmgr.explain_failure("No provider of 'kernel-default-devel=6.4.0-150600.23.25' found.\n",
                                          "zypper install", 104)
    assert message.startswith("kernel-default-devel=6.4.0-150600.23.25 is not available") and "kernel-default-devel" \
        in fix
    assert pkgmgr.get("apt").hold_all([("linux-generic", "1"), ("linux-image-generic", "1")]) == (
        "apt-mark", "hold", "linux-generic", "linux-image-generic")
    assert pkgmgr.get("dnf").hold_all([("kernel", "5.14.0-362.8.1.el9_3")]) == (
        "dnf", "versionlock", "add", "kernel-5.14.0-362.8.1.el9_3")


def test_a_kernel_release_read_from_the_node_is_quoted_in_the_removal_command():
    """The release is a directory name on the node (node text): the printed command keeps it one word; an
    ordinary release is printed as it is."""
    from gpunode import pkgmgr

    assert pkgmgr.remove_kernel("apt", "6.1.0-18-amd64", headers=True) == (
        "apt-get remove linux-image-6.1.0-18-amd64 linux-headers-6.1.0-18-amd64")
    assert pkgmgr.remove_kernel("dnf", "5.14.0-427.13.1.el9_4.x86_64") == "dnf remove kernel-core-5.14.0-427.13.1.el9_4"
    hostile = "6.1.0-18-amd64;reboot"
    assert pkgmgr.remove_kernel("apt", hostile) == "apt-get remove 'linux-image-6.1.0-18-amd64;reboot'"
    assert pkgmgr.remove_kernel("zypper", "6.4.0-1$(id)-default") == "zypper remove 'kernel-default=6.4.0-1$(id)'"
