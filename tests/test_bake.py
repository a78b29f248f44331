"""gpunode/bake.py and its facts (gpunode/facts/bake.py): the kernel a bake builds for, the marker, and the
boot-time check of the marker against the running node."""

from __future__ import annotations

import json

from gpunode import bake
from gpunode.facts import Facts
from gpunode.facts.bake import parse_kernel_files, parse_module_sums
from gpunode.facts.registry import Section
from gpunode.options import Options

SUM = "a" * 64


def facts(kernel: str = "5.15.0-92-generic", marker: dict | str | None = None, sums: str = "") -> Facts:
    kernels = ("image 5.15.0-91-generic\nimage 5.15.0-100-generic\nimage 5.15.0-92-generic\nheaders 5.15.0-92-generic\n"
               "initramfs 1700000000 5.15.0-92-generic\n")
    files = {} if marker is None else {bake.MARKER_PATH: marker if isinstance(marker, str) else json.dumps(marker)}
    return Facts(kernel=kernel, files=files, outputs={"kernel_files": Section(kernels, 0),
                                                      "nvidia_module_sums": Section(sums, 0)})


def test_the_newest_installed_kernel_in_version_order_not_the_running_one():
    found = facts(kernel="5.15.0-91-generic")
    assert bake.installed_kernels(found) == ("5.15.0-91-generic", "5.15.0-92-generic", "5.15.0-100-generic")
    assert bake.target_kernel(found, Options(bake=True)) == "5.15.0-100-generic"
    assert bake.target_kernel(found, Options(bake=True, bake_kernel="5.15.0-92-generic")) == "5.15.0-92-generic"
    assert bake.headers_present(found, "5.15.0-92-generic") and not bake.headers_present(found, "5.15.0-100-generic")


def test_parsers_keep_only_well_formed_lines():
    parsed = parse_kernel_files("image ../../etc\nimage 6.8.0-45-generic\nheaders $(reboot)\ninitramfs x 6.8.0\n")
    assert parsed.images == ("6.8.0-45-generic",) and not parsed.headers and not parsed.initramfs
    sums = parse_module_sums(f"{SUM}  /lib/modules/6.8.0-45-generic/updates/dkms/nvidia.ko\n"
                             f"{SUM}  /lib/modules/6.8.0-45-generic/../../../etc/nvidia.ko\n"
                             f"{SUM}  /etc/nvidia.ko\nnot a line\n")
    assert sums == {"6.8.0-45-generic": {"updates/dkms/nvidia.ko": SUM}}


def test_module_sums_are_the_drivers_modules_not_the_kernels_own_nvidia_named_ones():
    """Found on the real Debian 12 tree (tests/realos/test_debian12_packages_upgrade.py): its kernel ships
    nvidia-wmi-ec-backlight.ko, which the bake marker recorded as a module of the driver, so 'the module is built
    for kernel K' held with no NVIDIA driver at all."""
    kernel = "/lib/modules/6.1.0-56-amd64/"
    driver = ["updates/dkms/nvidia-current.ko", "updates/dkms/nvidia-current-uvm.ko", "kernel/drivers/video/nvidia.ko",
              "kernel/drivers/video/nvidia-modeset.ko.xz", "updates/dkms/nvidia-tesla-535-drm.ko",
              "updates/dkms/nvidia-current-open-peermem.ko"]
    text = "".join(f"{SUM}  {kernel}{p}\n" for p in [*driver, "kernel/drivers/platform/x86/nvidia-wmi-ec-backlight.ko"])
    assert parse_module_sums(text) == {"6.1.0-56-amd64": dict.fromkeys(driver, SUM)}
    assert parse_module_sums(f"{SUM}  {kernel}kernel/drivers/platform/x86/nvidia-wmi-ec-backlight.ko\n") == {}


def marker(**changes: object) -> dict:
    base = bake.Marker("535.129.03", "proprietary", "5.15.0-92-generic", {"updates/dkms/nvidia.ko": SUM}, "1.17.8-1",
                       "2026-11-23T14:00:00Z").to_dict()
    return {**base, **changes}


def test_the_marker_applies_only_to_its_kernel_its_modules_and_its_driver():
    sums = f"{SUM}  /lib/modules/5.15.0-92-generic/updates/dkms/nvidia.ko\n"
    assert bake.check(facts(sums=sums), None).why == ""  # no marker: nothing to say
    applies = bake.check(facts(marker=marker(), sums=sums), "535.129.03")
    assert applies.applies and applies.why == "baked image: module built for 5.15.0-92-generic at bake time"
    other_kernel = bake.check(facts(kernel="5.15.0-91-generic", marker=marker(), sums=sums), "535.129.03")
    assert not other_kernel.applies and "built for kernel 5.15.0-92-generic, but 5.15.0-91-generic is running" in \
        other_kernel.why
    changed = bake.check(facts(marker=marker(), sums=sums.replace(SUM, "b" * 64)), "535.129.03")
    assert not changed.applies and "module files of 5.15.0-92-generic changed" in changed.why
    other_driver = bake.check(facts(marker=marker(), sums=sums), "570.172.08")
    assert not other_driver.applies and "records driver 535.129.03, not the requested 570.172.08" in other_driver.why
    broken = bake.check(facts(marker="{not json", sums=sums), None)
    assert not broken.applies and "not a marker gpunode can read" in broken.why
    future = bake.check(facts(marker=marker(schema=2), sums=sums), None)
    assert not future.applies and "schema 2" in future.why


def test_same_build_ignores_time_and_gpunode_version():
    one = bake.Marker("535.129.03", "open", "k", {"a.ko": SUM}, None, "t1", "0.1")
    assert one.same_build(bake.Marker("535.129.03", "open", "k", {"a.ko": SUM}, None, "t2", "0.2"))
    assert not one.same_build(bake.Marker("535.129.03", "open", "k", {"a.ko": "b" * 64}, None, "t1"))
