"""The driver step's kernels and holds (gpunode/steps/driver_kernels.py), on in-memory facts: builds for later
kernels (headers first), blocked when the repositories lack the headers, holds that are idempotent and reversible."""

from __future__ import annotations

import dataclasses

from gpunode.facts.osinfo import parse_os_release
from gpunode.facts.probe import Section
from gpunode.options import Options
from gpunode.plan import Reboot, Status
from tests.steps.test_driver import V, installed, plan

K = "5.15.0-91-generic"
NEW = "5.15.0-92-generic"
ROCKY = parse_os_release('ID="rocky"\nID_LIKE="rhel centos fedora"\nVERSION_ID="9.3"\nPRETTY_NAME="Rocky Linux 9.3"\n')


def node(kernels: str, *, dkms: str | None = None, extra: dict[str, tuple[str, int]] | None = None, **changes):
    f = installed(**changes)
    dkms_lines = dkms if dkms is not None else f"dkms nvidia/{V}, {K}, x86_64: installed\n"
    outs = dict(f.outputs)
    outs["doctor_kernels"] = Section(kernels + dkms_lines, 0)
    for name, (text, status) in (extra or {}).items():
        outs[name] = Section(text, status)
    return dataclasses.replace(f, outputs=outs, tools={"apt-get": "/usr/bin/apt-get", "dkms": "/usr/sbin/dkms"})


RUNNING = f"kernel {K} headers /lib/modules/{K}/updates/dkms/nvidia.ko image\n"


def commands(p) -> list[str]:
    return [c.removeprefix("sudo ") for a in p.actions for c in a.commands()]


def test_only_the_running_kernel_is_ok():
    assert plan(node(RUNNING)).status is Status.OK


def test_a_later_kernel_without_headers_gets_them_then_a_dkms_build():
    f = node(RUNNING + f"kernel {NEW} - - image\n",
             extra={"kernel_headers_available": (f"avail linux-headers-{NEW}\n", 0)})
    p = plan(f)
    assert p.status is Status.CHANGE
    assert commands(p) == [f"apt-get install -y --no-install-recommends linux-headers-{NEW}",
                           f"dkms install -m nvidia -v {V} -k {NEW}"]
    assert f"installed kernel {NEW} (not running) has no nvidia {V} module" in p.reason
    assert any(f"the next boot runs {NEW}" in n for n in p.notes)
    assert p.outputs.changes  # type: ignore[union-attr]


def test_a_later_kernel_with_headers_only_needs_the_build():
    p = plan(node(RUNNING + f"kernel {NEW} headers - image\n"))
    assert commands(p) == [f"dkms install -m nvidia -v {V} -k {NEW}"]


def test_built_already_or_older_kernels_or_leftover_trees_change_nothing():
    built = node(RUNNING + f"kernel {NEW} headers /lib/modules/{NEW}/updates/dkms/nvidia.ko image\n",
                 dkms=f"dkms nvidia/{V}, {K}, x86_64: installed\ndkms nvidia/{V}, {NEW}, x86_64: installed\n")
    assert plan(built).status is Status.OK
    older = node(RUNNING + "kernel 5.15.0-88-generic - - image\n")
    assert plan(older).status is Status.OK  # the next boot does not run an older kernel
    leftover = node(RUNNING + f"kernel {NEW} - /lib/modules/{NEW}/updates/dkms/nvidia.ko -\n")
    assert plan(leftover).status is Status.OK  # a removed kernel's modules tree is not a kernel


def test_an_older_kernel_that_grubby_boots_is_built_for():
    f = node(RUNNING + "kernel 5.15.0-88-generic headers - image\ngrubby /boot/vmlinuz-5.15.0-88-generic\n")
    assert commands(plan(f)) == [f"dkms install -m nvidia -v {V} -k 5.15.0-88-generic"]


def test_headers_missing_from_the_repositories_block_with_a_fix():
    f = node(RUNNING + f"kernel {NEW} - - image\n",
             extra={"kernel_headers_available": (f"missing linux-headers-{NEW}\n", 0)})
    p = plan(f)
    assert p.status is Status.BLOCKED and p.actions == ()
    assert f"linux-headers-{NEW} (its headers) is not available" in p.reason
    assert f"sudo apt-get remove linux-image-{NEW}" in (p.fix or "")


def test_an_upgrade_builds_the_new_version_for_the_later_kernel_too():
    f = node(RUNNING + f"kernel {NEW} headers /lib/modules/{NEW}/updates/dkms/nvidia.ko image\n",
             dkms=f"dkms nvidia/{V}, {K}, x86_64: installed\ndkms nvidia/{V}, {NEW}, x86_64: installed\n")
    p = plan(f, Options(driver="570.124.06"))
    assert p.status is Status.CHANGE
    kinds = [a.kind for a in p.actions]  # the upgrade sequence (unload, install, load) comes first
    assert kinds.index("download") < kinds.index("driver-install") < len(kinds) - 1
    assert commands(p)[-1] == f"dkms install -m nvidia -v 570.124.06 -k {NEW}"


def test_builds_go_before_a_reboot():
    f = node(RUNNING + f"kernel {NEW} headers - image\n", smi=("Failed to initialize NVML: Driver/library version "
                                                              "mismatch\n", 18))
    p = plan(f)
    assert p.status is Status.CHANGE and isinstance(p.actions[-1], Reboot)
    assert commands(p)[0] == f"dkms install -m nvidia -v {V} -k {NEW}"


def test_a_driver_without_dkms_is_a_note_not_an_action():
    f = node(RUNNING.replace("updates/dkms", "kernel/drivers/video") + f"kernel {NEW} headers - image\n", dkms="")
    p = plan(f)
    assert p.status is Status.OK and any("not registered with DKMS" in n for n in p.notes)


# ---- holds --------------------------------------------------------------------------------------------------

PKGS = "ii \tlinux-generic\t5.15.0.91.88\nii \tlinux-image-5.15.0-91-generic\t5.15.0-91.101\nii \tlinux-firmware\t1\n"


def test_hold_kernel_holds_the_metapackages_once():
    f = node(RUNNING, extra={"kernel_packages": (PKGS, 0)})
    p = plan(f, Options(driver=V, hold_kernel=True))
    assert p.status is Status.CHANGE and commands(p) == ["apt-mark hold linux-generic"]
    held = node(RUNNING, extra={"kernel_packages": (PKGS.replace("ii \tlinux-generic", "hi \tlinux-generic"), 0)})
    again = plan(held, Options(driver=V, hold_kernel=True))
    assert again.status is Status.OK and any("already held: linux-generic" in n for n in again.notes)
    released = plan(held, Options(driver=V, hold_kernel=False))
    assert commands(released) == ["apt-mark unhold linux-generic"]
    assert plan(f, Options(driver=V, hold_kernel=False)).status is Status.OK
    assert plan(held, Options(driver=V)).status is Status.OK  # absent: holds are left as they are


def test_hold_kernel_on_sles_locks_the_flavours_kernel_packages_with_zypper():
    sles = parse_os_release('ID="sles"\nID_LIKE="suse"\nVERSION_ID="15.6"\nPRETTY_NAME="SLES 15 SP6"\n')
    sk = "6.4.0-150600.23.25-default"
    f = node(f"kernel {sk} headers /lib/modules/{sk}/updates/nvidia.ko image\n", dkms="",
             extra={"kernel_packages": ("ii \tkernel-default\t6.4.0-150600.23.25.1\n"
                                        "ii \tkernel-default-devel\t6.4.0-150600.23.25.1\n", 0)}, os=sles, kernel=sk)
    f = dataclasses.replace(f, tools={"zypper": "/usr/bin/zypper"})
    p = plan(f, Options(driver=V, hold_kernel=True))
    assert commands(p) == ["zypper --non-interactive addlock kernel-default kernel-default-devel"]
    locked = dataclasses.replace(f, files={"/etc/zypp/locks": "type: package\nmatch_type: glob\nsolvable_name: "
                                           "kernel-default\n\ntype: package\nsolvable_name: kernel-default-devel\n"})
    assert plan(locked, Options(driver=V, hold_kernel=True)).status is Status.OK
    assert commands(plan(locked, Options(driver=V, hold_kernel=False))) == [
        "zypper --non-interactive removelock kernel-default kernel-default-devel"]


def test_hold_driver_on_a_run_driver_says_there_is_no_package():
    p = plan(node(RUNNING), Options(driver=V, hold_driver=True))
    assert p.status is Status.OK and any("the .run driver is not a package" in n for n in p.notes)


def test_hold_kernel_on_rocky_uses_versionlock_and_its_plugin():
    rk = "5.14.0-362.8.1.el9_3.x86_64"
    f = node(f"kernel {rk} headers /lib/modules/{rk}/extra/nvidia.ko image\n", dkms="",
             extra={"kernel_packages": ("ii \tkernel\t5.14.0-362.8.1.el9_3\nii \tkernel-core\t5.14.0-362.8.1.el9_3\n",
                                        0)}, os=ROCKY, kernel=rk)
    f = dataclasses.replace(f, tools={"dnf": "/usr/bin/dnf"})
    p = plan(f, Options(driver=V, hold_kernel=True))
    assert commands(p) == ["dnf install -y python3-dnf-plugin-versionlock",
                           "dnf versionlock add kernel-5.14.0-362.8.1.el9_3 kernel-core-5.14.0-362.8.1.el9_3"]
    locked = dataclasses.replace(f, files={"/etc/dnf/plugins/versionlock.list":
                                           "kernel-0:5.14.0-362.8.1.el9_3.*\nkernel-core-0:5.14.0-362.8.1.el9_3.*\n"})
    assert plan(locked, Options(driver=V, hold_kernel=True)).status is Status.OK
    assert commands(plan(locked, Options(driver=V, hold_kernel=False))) == ["dnf versionlock delete kernel kernel-core"]
