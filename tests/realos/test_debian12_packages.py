"""The real-OS tier, third VM: `gpunode install --driver-source packages` (issue 27) against Debian 12's real
non-free packages: real apt and dpkg, the real maintainer scripts (alternatives, update-glx, DKMS hooks), real
`apt-mark` holds, on a machine with NO NVIDIA GPU (hence `--bake`: a packages install cannot load a module there).

Why it starts from the nvidia image (build_image.sh OUT nvidia: Debian's compute set 535.309.01 installed by apt
at image build time, its DKMS module built natively for the VM's kernel): a DKMS build of the 535 modules under
QEMU TCG (no VMX here, nor on CI's runners) takes hours (measured: 43 of ~95 header conftests in 12 minutes, no
object yet; natively 96 s), so no test here may trigger one. At the image's version the route's transaction
installs what the image lacks (libcuda1 and its glx alternative), holds everything, and DKMS has nothing to build:
the module files must stay byte for byte the image's. Another version of the branch (bookworm's 535.261.03 beside
bookworm-security's 535.309.01) would rebuild, so that transaction is checked by real apt's resolver
(`apt-get install -s`, the plan's exact command) instead of being run.

Tests run in file order on one VM, each from the state the previous one left:
pristine -> plan (every package, exact version; nothing changes) -> install -> re-run (nothing changes) -> holds ->
doctor/status name the source -> the other version of the branch (resolved by real apt) -> a .run asked for over
the packages (refused or planned as a switch; nothing mixed, nothing changes) -> uninstall (the node as it was) ->
a second uninstall (nothing to undo)."""

from __future__ import annotations

import re
import shlex
import time

import pytest

pytestmark = [pytest.mark.realos]

LABEL = "packages VM: "
# Everything a run could change, one line per item, so a difference names the file or package: files and links
# under /etc and /lib/modules, every package with its version and selection (hold), the holds, DKMS's state.
STATE = (
    "find /etc -xdev -type f -print0 | sort -z | xargs -0 sha256sum | sed 's/^/file /'; "
    "find /lib/modules -xdev -type f -printf 'module-tree %p %s %T@\\n' | sort; "  # sha256 of it all: minutes on TCG
    "find /etc /lib/modules -xdev -type l -printf 'link %p -> %l\\n' | sort; "
    "dpkg-query -W -f 'pkg ${Package} ${Version} ${db:Status-Abbrev}\\n' | sort; "
    "apt-mark showhold | sed 's/^/hold /'; "
    "dkms status | sed 's/^/dkms /'"
)
RUN_DRIVER = "550.54.15"  # a .run version: asked for over the packages
NODE: dict = {}  # what the tests learn: kernel, version, older, pristine state, module sums, route packages


def state(realpkg) -> set[str]:
    return set(realpkg.ssh(STATE, timeout=900).splitlines())


def same_state(before: set[str], after: set[str], allowed: tuple[str, ...] = ()) -> list[str]:
    """The lines that differ (- before, + after), minus those starting with an `allowed` prefix."""
    diff = [f"- {line}" for line in sorted(before - after)] + [f"+ {line}" for line in sorted(after - before)]
    return [d for d in diff if not d[2:].startswith(allowed)]


def packages(realpkg, *, installed_only: bool = True) -> dict[str, str]:
    out = realpkg.ssh("dpkg-query -W -f '${Package} ${Version} ${db:Status-Status}\\n'")
    return {p: v for p, v, s in (line.split() for line in out.splitlines()) if s == "installed" or not installed_only}


def module_sums(realpkg) -> str:
    return realpkg.ssh(f"sha256sum /lib/modules/{NODE['kernel']}/updates/dkms/*.ko")


def driver_step(run) -> dict:
    return {s["step"]: s for s in run.json()["steps"]}["driver"]


def install_commands(step: dict) -> list[str]:
    """The apt command lines of the plan's package transaction (action kind `driver-packages`)."""
    return [c for a in step["actions"] if a.get("kind") == "driver-packages" for c in a.get("commands", [])]


def pin_text(step: dict) -> str:
    """The apt preferences stanza the plan writes (gpunode's own function for the text the action carries)."""
    from gpunode import driver_packages

    return driver_packages.apt_pin(step["outputs"]["version"])


def apt_pins(command: str) -> dict[str, str]:
    return dict(w.split("=", 1) for w in shlex.split(command) if "=" in w and not w.startswith("-"))


def simulate(realpkg, command: str) -> tuple[int, str, dict[str, str]]:
    """Real apt's resolver on the plan's own install command (`-s`: nothing is changed): its exit status, its
    text, and {package: version} of what it would install or change."""
    argv = shlex.split(command)
    assert argv[:2] == ["apt-get", "install"], command
    done = realpkg.vm.ssh(shlex.join(["apt-get", "-s", *argv[1:]]) + " 2>&1", timeout=900)
    inst = dict(re.findall(r"^Inst (\S+) (?:\[\S+\] )?\((\S+)", done.out, re.M))
    return done.rc, done.out, inst


def test_the_starting_point_is_the_images_packaged_driver(realpkg):
    realpkg.vm.wait_booted()  # degraded: nvidia-persistenced fails at boot without a GPU
    NODE["kernel"] = realpkg.ssh("uname -r").strip()
    started = time.monotonic()
    realpkg.ssh("apt-get update -qq", timeout=900)  # the image's lists are as old as the image
    realpkg.stage(LABEL + "apt-get update", time.monotonic() - started)
    have = packages(realpkg)
    NODE["package_version"] = have["nvidia-kernel-dkms"]
    NODE["version"] = re.match(r"\d+\.\d+\.\d+", have["nvidia-kernel-dkms"]).group(0)
    assert "libcuda1" not in have  # the image's compute-only set: the route's transaction has work to do
    offered = realpkg.ssh("apt-cache madison nvidia-kernel-dkms | awk -F'|' '{ gsub(/ /, \"\", $2); print $2 }'")
    upstreams = sorted({re.match(r"\d+\.\d+\.\d+", v).group(0) for v in offered.split()})
    assert NODE["version"] in upstreams, (NODE, offered)
    NODE["older"] = next((v for v in upstreams if v != NODE["version"]), None)  # bookworm beside -security
    NODE["modules"] = module_sums(realpkg)
    assert "nvidia-current.ko" in NODE["modules"]
    NODE["pristine"] = state(realpkg)


def test_plan_lists_every_package_at_its_exact_version_and_changes_nothing(realpkg):
    run = realpkg.gpunode("plan", "--json", "--driver-source", "packages", "--driver", NODE["version"], "--bake",
                          stage=LABEL + "plan")
    step = driver_step(run)
    assert step["status"] == "change", step
    commands = install_commands(step)
    assert len(commands) == 1, step
    pins = apt_pins(commands[0])
    NODE["route"] = pins
    # the route: the module package, the tools and libraries; every one pinned to one exact package version
    assert {"nvidia-kernel-dkms", "nvidia-smi", "libcuda1", "libnvidia-ml1"} <= set(pins), pins
    policy = realpkg.ssh("apt-cache policy " + " ".join(sorted(pins)))
    for name, version in pins.items():
        assert re.search(rf"^{re.escape(name)}:\n(?:  .*\n)*?\s+(?:\*\*\* )?{re.escape(version)} ", policy, re.M), \
            f"{name}={version} is not a version apt knows:\n{policy}"
        if name not in ("nvidia-persistenced", "nvidia-modprobe"):  # their own versions, not the driver's
            assert version.startswith(NODE["version"] + "-"), (name, version)
    # real apt resolves exactly that command, and installs (or keeps) every route package at the planned version
    rc, text, inst = simulate(realpkg, commands[0])
    assert rc == 0, text
    have = packages(realpkg)
    assert {n: inst.get(n, have.get(n)) for n in pins} == pins, text
    # the plan names every package it installs: what apt adds beyond the route are dependencies of them
    NODE["apt_adds"] = {n: v for n, v in inst.items() if n not in pins}
    # and the plan shows them too, before anything runs: gpunode's own simulation of the exact transaction (with its
    # apt pin in a throwaway preferences directory) lists every package real apt would install, at its version
    note = next((n for n in step["notes"] if n.startswith("the transaction, as apt-get -s install resolves it")),
                None)
    assert note is not None, step["notes"]
    listed = dict(entry.split(" ")[:2] for entry in note.split(": ", 1)[1].split("; "))
    assert {n: listed.get(n) for n in inst} == inst, (note, text)
    assert not [e for e in note.split("; ") if e.endswith("(removed)")], note
    assert realpkg.ssh("dkms status") and state(realpkg) == NODE["pristine"]


def test_install_from_packages_without_a_dkms_rebuild(realpkg):
    run = realpkg.gpunode("install", "--driver-source", "packages", "--driver", NODE["version"], "--bake",
                          "--only", "driver", timeout=3600, stage=LABEL + "install --driver-source packages --bake")
    assert run.rc == 0, run.out + run.err
    have = packages(realpkg)
    assert {n: have.get(n) for n in NODE["route"]} == NODE["route"]
    assert f"nvidia-current/{NODE['version']}, {NODE['kernel']}, x86_64: installed" in realpkg.ssh("dkms status")
    assert module_sums(realpkg) == NODE["modules"], "DKMS rebuilt (or lost) the module of the same version"
    # libcuda1 registered the glx alternative, which links Debian's modprobe configuration in
    assert "install nvidia modprobe -i nvidia-current" in realpkg.ssh("cat /etc/modprobe.d/nvidia.conf")
    assert "load the driver" not in run.out  # nothing is loaded with --bake (and there is no GPU)
    assert realpkg.ssh("grep -c '^nvidia' /proc/modules || true").strip() == "0"


def test_a_second_install_changes_nothing(realpkg):
    before = state(realpkg)
    plan = realpkg.gpunode("plan", "--json", "--driver-source", "packages", "--driver", NODE["version"], "--bake")
    assert driver_step(plan)["status"] == "ok", driver_step(plan)
    run = realpkg.gpunode("install", "--driver-source", "packages", "--driver", NODE["version"], "--bake",
                          "--only", "driver", stage=LABEL + "second install (changes nothing)")
    assert run.rc == 0, run.out + run.err
    assert same_state(before, state(realpkg)) == []


def test_the_packages_are_held(realpkg):
    held = set(realpkg.ssh("apt-mark showhold").split())
    assert set(NODE["route"]) <= held, held
    # a hold is what apt itself enforces: removing a held package with -y is refused (simulated: nothing changes)
    done = realpkg.vm.ssh("apt-get -s -y remove nvidia-smi 2>&1", timeout=600)
    assert done.rc == 100 and "Held packages were changed" in done.out, done.out


def test_doctor_and_status_name_the_source(realpkg):
    status = realpkg.gpunode("status", stage=LABEL + "status, doctor")
    assert status.rc == 0, status.err
    text = " ".join(status.out.split())
    assert f"driver {NODE['version']}" in text and "from packages" in text, status.out
    doctor = realpkg.gpunode("doctor", "--json")
    checks = {c["id"]: c for c in doctor.json()["checks"]}
    single = checks["driver.single-source"]
    assert single["status"] == "pass", single
    assert "distribution packages" in single["evidence"] and "installed by gpunode" in single["evidence"], single


def test_the_other_version_of_the_branch_resolves_in_real_apt(realpkg):
    """Upgrade within the branch: bookworm (535.261.03) and bookworm-security (535.309.01) both carry R535. The
    plan's transaction would rebuild DKMS (hours under TCG), so real apt resolves it (-s) instead of running it."""
    if not NODE["older"]:
        pytest.skip("the archive offers one version of the branch only")
    before = state(realpkg)
    run = realpkg.gpunode("plan", "--json", "--driver-source", "packages", "--driver", NODE["older"], "--bake",
                          stage=LABEL + "plan another version")
    step = driver_step(run)
    assert step["status"] == "change", step
    kinds = [a.get("kind") for a in step["actions"]]
    assert kinds.index("driver-packages") > 0, kinds  # the holds are released before the transaction
    commands = install_commands(step)
    pins = apt_pins(commands[-1])
    assert all(v.startswith(NODE["older"] + "-") for n, v in pins.items()
               if n not in ("nvidia-persistenced", "nvidia-modprobe")), pins
    # as the plan's actions before the transaction do: release the holds, write apt's preferences pin (the
    # plan's own file action, when it has one); both put back after apt's simulation
    pin = next((a for a in step["actions"] if a.get("kind") == "file" and "preferences.d" in a.get("summary", "")),
               None)
    realpkg.ssh("apt-mark unhold " + " ".join(sorted(NODE["route"])))
    if pin is not None:
        path = pin["summary"].rsplit("(", 1)[-1].rstrip(")")
        realpkg.ssh(f"cp -a {shlex.quote(path)} /root/pin.saved 2>/dev/null; printf %s {shlex.quote(pin_text(step))}"
                    f" > {shlex.quote(path)}")
    try:
        rc, text, inst = simulate(realpkg, commands[-1])
    finally:
        realpkg.ssh("apt-mark hold " + " ".join(sorted(NODE["route"])))
        if pin is not None:
            realpkg.ssh(f"if [ -e /root/pin.saved ]; then mv /root/pin.saved {shlex.quote(path)}; "
                        f"else rm -f {shlex.quote(path)}; fi")
    assert rc == 0, text
    assert all(inst.get(n, v) == v for n, v in pins.items()), text
    moved = {n: v for n, v in inst.items() if n not in pins and v.startswith(NODE["version"])}
    assert moved == {}, f"apt would keep these at the other version (two versions mixed): {moved}"
    assert same_state(before, state(realpkg)) == []


def test_a_run_over_the_packaged_driver_is_never_mixed(realpkg):
    before = state(realpkg)
    run = realpkg.gpunode("plan", "--json", "--driver", RUN_DRIVER, "--bake", stage=LABEL + "plan a .run over it")
    step = driver_step(run)
    text = " ".join(f"{step.get('reason', '')} {step.get('fix', '')}".split())
    if step["status"] == "blocked":  # refused: with a fix that removes the packages first
        assert "packages" in text and "apt-get purge" in text, step
    else:  # planned as a switch: the packages go before the .run comes
        assert step["status"] == "change", step
        descriptions = [a.get("description", "") for a in step["actions"]]
        assert any("purge" in d or "remove" in d for d in descriptions), descriptions
    assert same_state(before, state(realpkg)) == []


def test_uninstall_leaves_the_node_as_it_was(realpkg):
    run = realpkg.gpunode("uninstall", "--only", "driver", timeout=3600, stage=LABEL + "uninstall")
    assert run.rc == 0, run.out + run.err
    assert realpkg.ssh("apt-mark showhold").split() == []
    assert module_sums(realpkg) == NODE["modules"]  # the image's driver predates gpunode: it stays
    diff = same_state(NODE["pristine"], state(realpkg))
    assert diff == [], "\n".join(diff[:60])
    again = realpkg.gpunode("uninstall", "--only", "driver")
    assert again.rc == 0 and "nothing to undo" in again.out.lower(), again.out + again.err


def test_no_traceback_in_any_run(realpkg):
    assert realpkg.runs and [r.argv for r in realpkg.runs if "Traceback" in r.err] == []
