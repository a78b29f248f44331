"""The real-OS tier, chroot node: `gpunode install --driver-source packages` UPGRADING within the branch (issue 27),
with real apt, dpkg, maintainer scripts, holds and two real DKMS builds, at native speed.

Why a chroot node and not a VM: the upgrade rebuilds the kernel modules (DKMS), which takes over two hours under
QEMU TCG and ~100 s natively. The node (chroot.py) is the nvidia image's real Debian 12 userland in namespaces of
its own (root there is host uid 100000: no module can be loaded, nothing on the host written; its network is
`lo` only, apt reaches Debian's archive through the tier's mirror). Its kernel is the host's: `uname -r` names a
kernel the tree has no modules or headers for, while the tree's own kernel (the one the nvidia VM boots) has its
headers - the situation `--bake` is for (an image prepared for a kernel that is not running).

What it covers of the upgrade, and what it cannot. With `--bake` nothing is loaded, stopped or started, so the
sequence's first and last parts (holders of the old module, stop of GPU services, unload, load, start) are not
run here: they are the same functions as for the .run (steps/driver.replace_loaded_with) and are covered on the
simulator only (tests/integration/test_driver_packages_nodesim.py). What is real here: the exact-version
transaction from one release of the branch to the other (bookworm 535.261.03 -> bookworm-security 535.309.01)
resolved and run by real apt with gpunode's preferences pin, the holds released and placed again on the new
versions, the real DKMS removal of the old module and build of the new one for the tree's kernel, the journal's
records, the re-run that must change nothing, and the uninstall that must return the node to its state before.

The switch from a `.run`-installed state is not here: NVIDIA's .run cannot be had in this tier (Debian serves the
packaged driver's binaries, not NVIDIA's installer), and a state made by the simulator's installer would not be
real. It stays on the simulator.

Tests run in file order on one node, each from the state the previous one left:
pristine (the image's driver purged by apt: no NVIDIA driver) -> install the older release -> upgrade to the newer
-> re-run (nothing changes) -> uninstall (the node as it was) -> no traceback."""

from __future__ import annotations

import json
import re
import shlex
import time

import pytest

pytestmark = [pytest.mark.realos]

LABEL = "chroot node: "
# Everything a run could change, one line per item: files and links under /etc, the module tree, every package
# with its version and selection, the holds, DKMS's state.
STATE = (
    "find /etc -xdev -type f -print0 | sort -z | xargs -0 sha256sum | sed 's/^/file /'; "
    "find /lib/modules /usr/src /var/lib/dkms -xdev -type f -print0 | sort -z | xargs -0 sha256sum "
    "| sed 's/^/tree /'; "
    "find /etc /lib/modules -xdev -type l -printf 'link %p -> %l\\n' | sort; "
    "dpkg-query -W -f 'pkg ${Package} ${Version} ${db:Status-Abbrev}\\n' | sort; "
    "apt-mark showhold | sed 's/^/hold /'; "
    "dkms status | sed 's/^/dkms /'"
)
# Debian's NVIDIA driver packages (the image's, and what apt brings with them), purged to make the pristine node
NVIDIA_NAMES = r"^(nvidia-|libnvidia-|libcuda|firmware-nvidia-|glx-|update-glx|xserver-xorg-video-nvidia|lib\S*-nvidia)"
OWN_VERSION = ("nvidia-persistenced", "nvidia-modprobe")  # versioned on their own, not as the driver
NODE: dict = {}


def state(node) -> set[str]:
    return set(node.ssh(STATE, timeout=900).splitlines())


def diff(before: set[str], after: set[str]) -> list[str]:
    return [f"- {line}" for line in sorted(before - after)] + [f"+ {line}" for line in sorted(after - before)]


def packages(node) -> dict[str, str]:
    out = node.ssh("dpkg-query -W -f '${Package} ${Version} ${db:Status-Status}\\n'")
    return {p: v for p, v, s in (line.split() for line in out.splitlines()) if s == "installed"}


def upstream(version: str) -> str:
    return re.match(r"\d+\.\d+\.\d+", version).group(0)


def module(node, name: str = "nvidia-current") -> dict[str, str]:
    """The DKMS-built module file for the tree's kernel: its version, vermagic and sha256."""
    path = f"/lib/modules/{NODE['kernel']}/updates/dkms/{name}.ko"
    out = node.ssh(f"modinfo -F version {path}; modinfo -F vermagic {path}; sha256sum {path}").split("\n")
    return {"version": out[0].strip(), "vermagic": out[1].split()[0], "sha256": out[2].split()[0]}


def driver_step(run) -> dict:
    return {s["step"]: s for s in run.json()["steps"]}["driver"]


def install(node, version: str, stage: str):
    return node.gpunode("install", "--driver-source", "packages", "--driver", version, "--bake", "--only", "driver",
                        timeout=3600, stage=LABEL + stage)


def route_pins(step: dict) -> dict[str, str]:
    """{package: version} of the plan's package transaction (action kind `driver-packages`)."""
    commands = [c for a in step["actions"] if a.get("kind") == "driver-packages" for c in a.get("commands", [])]
    assert commands, step
    return dict(w.split("=", 1) for w in shlex.split(commands[-1]) if "=" in w and not w.startswith("-"))


def journal_drivers(node) -> list[dict]:
    text = node.ssh("cat /var/lib/gpunode/journal.json")
    found: list[dict] = []

    def walk(item: object) -> None:
        if isinstance(item, dict):
            if item.get("kind") == "driver":
                found.append(item)
            for value in item.values():
                walk(value)
        elif isinstance(item, list):
            for value in item:
                walk(value)

    walk(json.loads(text))
    return found


def test_the_pristine_node_has_no_nvidia_driver_and_two_releases_on_offer(realchroot):
    node = realchroot
    NODE["kernel"] = (node.vm.tree.parent / "kernel").read_text().strip()
    started = time.monotonic()
    node.ssh("apt-get update -qq", timeout=900)
    node.stage(LABEL + "apt-get update", time.monotonic() - started)
    # the pristine node: the image's packaged driver (installed by the image build, not by gpunode) purged by
    # apt, and only the tree's own kernel with headers (an image may carry others: DKMS would build for each)
    started = time.monotonic()
    names = [n for n in packages(node) if re.match(NVIDIA_NAMES, n)]
    assert "nvidia-kernel-dkms" in names, names
    others = [k for k in node.ssh("for d in /lib/modules/*/build; do [ -e \"$d\" ] && basename \"${d%/build}\"; done; "
                                  "true").split() if k != NODE["kernel"]]
    headers = [n for n in packages(node) if n in {f"linux-headers-{k}" for k in others}]
    node.ssh("export DEBIAN_FRONTEND=noninteractive; apt-get purge -y -q --allow-change-held-packages "
             + " ".join(names + headers) + " && apt-get autoremove -y -q --purge", timeout=1800)
    node.stage(LABEL + "purge the image's driver (setup)", time.monotonic() - started)
    assert node.ssh("dkms status").strip() == ""
    assert node.ssh(f"ls /lib/modules/{NODE['kernel']}/build/Makefile")  # headers for the tree's kernel
    offered = node.ssh("apt-cache madison nvidia-kernel-dkms | awk -F'|' '{ gsub(/ /, \"\", $2); print $2 }'")
    releases = sorted({upstream(v) for v in offered.split()}, key=lambda v: tuple(map(int, v.split("."))))
    if len(releases) < 2:
        pytest.skip(f"the archive offers one release of the branch only: {releases}")
    NODE["older"], NODE["newer"] = releases[0], releases[-1]
    NODE["pristine"] = state(node)


def test_install_the_older_release(realchroot):
    node = realchroot
    plan = node.gpunode("plan", "--json", "--driver-source", "packages", "--driver", NODE["older"], "--bake",
                        stage=LABEL + "plan (older release)")
    pins = route_pins(driver_step(plan))
    assert all(v.startswith(NODE["older"] + "-") for n, v in pins.items() if n not in OWN_VERSION), pins
    run = install(node, NODE["older"], f"install {NODE['older']} (real DKMS build)")
    assert run.rc == 0, run.out + run.err
    have = packages(node)
    assert {n: have.get(n) for n in pins} == pins, have
    # gpunode's pin let apt take the older release for every package of the driver, none left at the newer one
    mixed = {n: v for n, v in have.items()
             if re.match(NVIDIA_NAMES, n) and n not in OWN_VERSION and v.startswith(NODE["newer"])}
    assert mixed == {}, mixed
    assert node.ssh("dkms status").strip() == f"nvidia-current/{NODE['older']}, {NODE['kernel']}, x86_64: installed"
    built = module(node)
    assert built["version"] == NODE["older"] and built["vermagic"] == NODE["kernel"], built
    NODE["older_module"] = built
    assert set(pins) <= set(node.ssh("apt-mark showhold").split())
    NODE["older_pins"] = pins


def test_upgrade_within_the_branch(realchroot):
    node = realchroot
    plan = node.gpunode("plan", "--json", "--driver-source", "packages", "--driver", NODE["newer"], "--bake",
                        stage=LABEL + "plan (upgrade)")
    step = driver_step(plan)
    assert step["status"] == "change", step
    kinds = [a.get("kind") for a in step["actions"]]
    # the holds are released before the transaction and placed again after it
    assert 0 < kinds.index("driver-packages") < len(kinds) - 1, kinds
    pins = route_pins(step)
    assert all(v.startswith(NODE["newer"] + "-") for n, v in pins.items() if n not in OWN_VERSION), pins
    run = install(node, NODE["newer"], f"upgrade to {NODE['newer']} (real DKMS rebuild)")
    assert run.rc == 0, run.out + run.err
    have = packages(node)
    assert {n: have.get(n) for n in pins} == pins, have
    mixed = {n: v for n, v in have.items()
             if re.match(NVIDIA_NAMES, n) and n not in OWN_VERSION and v.startswith(NODE["older"])}
    assert mixed == {}, mixed
    # DKMS removed the old release's module and built the new one for the tree's kernel
    assert node.ssh("dkms status").strip() == f"nvidia-current/{NODE['newer']}, {NODE['kernel']}, x86_64: installed"
    built = module(node)
    assert built["version"] == NODE["newer"] and built["vermagic"] == NODE["kernel"], built
    assert built["sha256"] != NODE["older_module"]["sha256"]
    assert node.ssh(f"ls /usr/src | grep -c 'nvidia-current-{NODE['older']}' || true").strip() == "0"
    # the holds moved to the new versions: held, at the new version
    held = node.ssh("dpkg-query -W -f '${Package} ${Version} ${db:Status-Abbrev}\\n' " + " ".join(sorted(pins)))
    for line in held.splitlines():
        name, version, status = line.split()
        assert status.startswith("h") and version == pins[name], line
    # the journal records the upgrade: a driver record from packages, from the older release to the newer
    records = journal_drivers(node)
    assert records and records[-1].get("version") == NODE["newer"], records
    assert records[-1].get("previous") == NODE["older"] and records[-1].get("source") == "packages", records
    assert "load the driver" not in run.out  # --bake: nothing loaded (no module can be, here)


def test_a_second_install_changes_nothing(realchroot):
    node = realchroot
    before = state(node)
    plan = node.gpunode("plan", "--json", "--driver-source", "packages", "--driver", NODE["newer"], "--bake")
    assert driver_step(plan)["status"] == "ok", driver_step(plan)
    run = install(node, NODE["newer"], "second install (changes nothing)")
    assert run.rc == 0, run.out + run.err
    changed = diff(before, state(node))
    assert changed == [], "\n".join(changed[:60])


def test_uninstall_returns_the_node_to_its_state_before(realchroot):
    node = realchroot
    run = node.gpunode("uninstall", "--only", "driver", timeout=3600, stage=LABEL + "uninstall")
    assert run.rc == 0, run.out + run.err
    assert node.ssh("apt-mark showhold").split() == []
    assert node.ssh("dkms status").strip() == ""
    changed = diff(NODE["pristine"], state(node))
    assert changed == [], "\n".join(changed[:80])
    again = node.gpunode("uninstall", "--only", "driver")
    assert again.rc == 0 and "nothing to undo" in again.out.lower(), again.out + again.err


def test_no_traceback_in_any_run(realchroot):
    assert realchroot.runs and [r.argv for r in realchroot.runs if "Traceback" in r.err] == []
