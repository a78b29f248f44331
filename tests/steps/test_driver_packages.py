"""The driver step with --driver-source packages (gpunode/steps/driver_packages.py): plans from facts."""

from __future__ import annotations

import dataclasses

from gpunode import driver_packages as routes
from gpunode.actions.driver import InstallDriverPackages, UnloadModules
from gpunode.actions.packages import PackageCommand
from gpunode.facts import Facts
from gpunode.facts.kernel import PciDevice, SecureBoot, parse_nvidia_version
from gpunode.facts.osinfo import parse_os_release
from gpunode.facts.probe import Section
from gpunode.options import Options
from gpunode.plan import RunCommand, Status
from gpunode.steps import driver

DEBIAN = parse_os_release('ID=debian\nVERSION_ID="12"\nVERSION_CODENAME=bookworm\nPRETTY_NAME="Debian GNU/Linux 12"\n')
OLD, NEW = "535.261.03", "535.309.01"
SET = ("nvidia-kernel-dkms", "nvidia-smi", "libcuda1", "libnvidia-ml1", "firmware-nvidia-gsp")


def policy(names=SET, versions=(f"{NEW}-0+deb12u1", f"{OLD}-1")) -> str:
    text = ""
    for name in (*names, "nvidia-persistenced", "nvidia-modprobe"):
        own = name in ("nvidia-persistenced", "nvidia-modprobe")
        text += f"{name}:\n  Installed: (none)\n  Candidate: x\n  Version table:\n"
        for v in (("535.171.04-1~deb12u1",) if own else versions):
            text += f"     {v} 500\n        500 http://deb.debian.org/debian bookworm/non-free amd64 Packages\n"
    return text


def node(*, offered: str | None = None, installed: str | None = None, held: bool = True, loaded: str | None = None,
         journal: str = "", devices=(0x1EB8,), **outputs: Section) -> Facts:
    outs = {"driver_offered": Section(policy() if offered is None else offered, 0),
            "gpunode_pending_restarts": Section(journal, 0 if journal else 3), **outputs}
    if installed:
        names = (*SET, "nvidia-persistenced", "nvidia-modprobe")
        ver = lambda n: "535.171.04-1~deb12u1" if n in ("nvidia-persistenced", "nvidia-modprobe") else installed  # noqa: E731
        outs["pkg_status"] = Section("".join(f"{'h' if held else 'i'}i \t{n}\t{ver(n)}\n" for n in names), 0)
        outs["driver_packages"] = Section("".join(f"{n} {ver(n)}\n" for n in SET), 0)
        outs["driver_userspace"] = Section(f"lib /usr/lib/x86_64-linux-gnu/nvidia/current/libnvidia-ml.so."
                                           f"{installed.split('-')[0]}\n", 0)
    pinned = {routes.APT_PIN: routes.apt_pin(installed.split("-")[0])} if installed else {}
    nvrm = (f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {loaded}  Thu Oct 19 18:56:32 UTC 2023\n"
            if loaded else None)
    return Facts(os=DEBIAN, kernel="6.1.0-18-amd64", arch="x86_64",
                 pci=tuple(PciDevice(f"0000:{0x17 + i:02x}:00.0", 0x10DE, d, 0x030200) for i, d in enumerate(devices)),
                 secure_boot=SecureBoot(False, False, "efivar 0"), outputs=outs, files=pinned,
                 loaded_driver=parse_nvidia_version(nvrm) if nvrm else None,
                 modules=frozenset({"nvidia"} if loaded else ()))


def plan(f: Facts, version: str = OLD, **opts: object):  # type: ignore[no-untyped-def]
    return driver.plan(f, Options(driver=version, driver_source="packages", **opts), {})  # type: ignore[arg-type]


def test_fresh_debian_installs_the_compute_set_at_exact_versions_loads_and_holds():
    p = plan(node())
    assert p.status is Status.CHANGE and "installing 535.261.03 from packages (debian-nonfree)" in p.reason
    pin, install, load, hold = p.actions
    assert pin.kind == "file" and pin.path == "/etc/apt/preferences.d/gpunode-nvidia-driver"
    assert "Pin: version 535.261.03-*\nPin-Priority: 1001" in pin.after  # apt's resolver needs the whole release
    assert isinstance(install, InstallDriverPackages) and install.version == OLD
    line = install.commands()[-1]
    for name in SET:
        assert f"{name}=535.261.03-1" in line
    assert "nvidia-persistenced=535.171.04-1~deb12u1" in line and "--allow-downgrades" in line
    assert isinstance(load, RunCommand) and load.commands() == ["sudo modprobe nvidia"]
    assert isinstance(hold, PackageCommand) and hold.commands()[0].startswith("sudo apt-mark hold nvidia-kernel-dkms")
    assert any(n.startswith("packages: nvidia-kernel-dkms 535.261.03-1") for n in p.notes)
    assert p.outputs is not None


def test_in_place_and_held_is_ok_unheld_gets_only_the_hold():
    done = plan(node(installed=f"{OLD}-1", loaded=OLD))
    assert done.status is Status.OK and "from packages (nvidia-kernel-dkms 535.261.03-1) is loaded" in \
        done.reason
    loose = plan(node(installed=f"{OLD}-1", loaded=OLD, held=False))
    assert loose.status is Status.CHANGE and [a.commands()[0].split()[:3] for a in loose.actions] == \
        [["sudo", "apt-mark", "hold"]]
    assert plan(node(installed=f"{OLD}-1", loaded=OLD, held=False), hold_driver=False).status is Status.OK


def test_upgrade_within_the_branch_releases_unloads_installs_loads_and_holds_again():
    p = plan(node(installed=f"{OLD}-1", loaded=OLD), NEW)
    kinds = [type(a).__name__ for a in p.actions]
    assert kinds == ["PackageCommand", "UnloadModules", "WriteFile", "InstallDriverPackages", "RunCommand",
                     "PackageCommand"], kinds
    assert "Pin: version 535.309.01-*" in p.actions[2].after
    assert p.actions[0].commands()[0].startswith("sudo apt-mark unhold")
    assert isinstance(p.actions[1], UnloadModules)
    assert f"nvidia-kernel-dkms={NEW}-0+deb12u1" in p.actions[3].commands()[-1]
    assert p.actions[-1].commands()[0].startswith("sudo apt-mark hold")


def test_a_version_the_repositories_do_not_offer_is_refused_before_any_change():
    p = plan(node(), "535.999.01")
    assert p.status is Status.BLOCKED and p.lasting
    assert "do not offer driver 535.999.01" in p.reason and "535.261.03-1" in p.reason
    assert "sudo apt-get update" in p.fix and "--driver 535.309.01" in p.fix and "--driver-source packages" in p.fix
    nothing = plan(node(offered=""))
    assert nothing.status is Status.BLOCKED and "gpunode-nonfree.list" in nothing.fix
    assert "deb http://deb.debian.org/debian bookworm main contrib non-free non-free-firmware" in nothing.fix


def test_a_run_driver_someone_else_installed_is_refused_one_gpunode_installed_is_switched():
    run = {"driver_userspace": Section("lib /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.535.129.03\n"
                                       "installer nvidia-installer:  version 535.129.03\n", 0)}
    p = plan(node(**run))
    assert p.status is Status.BLOCKED and "not by gpunode" in p.reason
    assert p.fix.startswith("sudo nvidia-installer --uninstall --silent")
    journal = ('{"runs": [], "undo": [{"kind": "driver", "step": "driver", "version": "535.129.03", '
               '"previous": null}]}')
    switch = plan(node(journal=journal, **run))
    assert switch.status is Status.CHANGE and any("switching source" in n for n in switch.notes)
    assert switch.actions[0].commands() == ["sudo nvidia-installer --uninstall --silent"]
    assert isinstance(switch.actions[2], InstallDriverPackages)


def test_no_gpu_needs_bake_and_the_flavour_follows_the_gpu():
    assert plan(node(devices=())).status is Status.BLOCKED
    h100 = plan(node(devices=(0x2330,)))  # R535 on an H100: proprietary, the default before R560 (as for a .run)
    assert "nvidia-kernel-dkms=535.261.03-1 " in h100.actions[1].commands()[-1]
    bake = plan(node(devices=()), bake=True, bake_kernel=None)
    assert bake.status is Status.BLOCKED and "no installed kernel" in bake.reason  # nothing tells which kernel
    forced = plan(node(offered=policy((*SET, "nvidia-open-kernel-dkms"))), kernel_module="open")
    assert "nvidia-open-kernel-dkms=535.261.03-1" in forced.actions[1].commands()[-1]


def test_install_records_the_driver_and_its_source():
    action = dataclasses.replace(plan(node()).actions[1])
    assert isinstance(action, InstallDriverPackages) and action.kind == "driver-packages"


def test_nvswitch_node_needs_the_fabric_manager_of_exactly_that_release():
    switch = PciDevice("0000:05:00.0", 0x10DE, 0x22A3, 0x068000)
    f = node(devices=(0x2330,))
    offered = "nvidia-fabricmanager-535:\n  Version table:\n     535.183.01-1 500\n"
    blocked = plan(dataclasses.replace(f, pci=(*f.pci, switch), outputs={**f.outputs,
                                                                         "fm_available": Section(offered, 0)}))
    assert blocked.status is Status.BLOCKED and blocked.lasting and "nvidia-fabricmanager-535 535.261.03" in \
        blocked.reason
    fine = f"nvidia-fabricmanager-535:\n  Version table:\n     {OLD}-1 500\n"
    ok = plan(dataclasses.replace(f, pci=(*f.pci, switch), outputs={**f.outputs, "fm_available": Section(fine, 0)}))
    assert ok.status is Status.CHANGE


def test_suse_route_uses_zypper_with_exact_versions_and_locks():
    sles = parse_os_release('ID="sles"\nID_LIKE="suse"\nVERSION_ID="15.6"\nPRETTY_NAME="SLES 15 SP6"\n')
    # two KMPs of the release, each built for another kernel (SUSE's `_k<kernel>` in the version): the running
    # kernel's is taken, the newer kernel's is not
    offered = ("S | Name | Type | Version | Arch | Repository\n"
               "  | nvidia-driver-G06-kmp-default | package | 580.95.05_k6.4.0_150600.23.38-1 | x86_64 | cuda\n"
               "  | nvidia-driver-G06-kmp-default | package | 580.95.05_k6.4.0_150600.23.25-1 | x86_64 | cuda\n"
               "  | nvidia-compute-utils-G06 | package | 580.95.05-1 | x86_64 | cuda\n"
               "  | nvidia-compute-G06 | package | 580.95.05-1 | x86_64 | cuda\n")
    f = dataclasses.replace(node(offered=offered, devices=(0x1EB8,)), os=sles, kernel="6.4.0-150600.23.25-default")
    p = plan(f, "580.95.05", kernel_module="proprietary")
    assert p.status is Status.CHANGE, p.reason
    install = next(a for a in p.actions if isinstance(a, InstallDriverPackages))
    assert install.manager == "zypper" and "nvidia-driver-G06-kmp-default-580.95.05_k6.4.0_150600.23.25-1" in \
        install.commands()[-1]
    assert "nvidia-compute-G06-580.95.05-1" in install.commands()[-1]
    assert any("zypper --non-interactive addlock" in c for a in p.actions for c in a.commands())
    # a KMP comes built: no DKMS note under Secure Boot's wording, the route says why
    assert any("kernel module package (KMP)" in n for n in p.notes), p.notes
    assert not any("Secure Boot" in n for n in p.notes)
    # under Secure Boot: NVIDIA signed the KMP's module with its own key, which the firmware does not trust
    secure = plan(dataclasses.replace(f, secure_boot=SecureBoot(True, True, "efivar 1")), "580.95.05",
                  kernel_module="proprietary")
    sb = [n for n in secure.notes if "Secure Boot" in n]
    assert len(sb) == 1 and "nvidia-driver-G06-kmp-default carries a module NVIDIA signed" in sb[0], secure.notes
    assert "mokutil" not in sb[0]  # not DKMS's key: no DKMS certificate to enroll
    # without the compute libraries offered the route is refused with zypper's repository fix
    short = dataclasses.replace(f, outputs={**f.outputs, "driver_offered": Section(offered.rsplit("  |", 1)[0], 0)})
    refused = plan(short, "580.95.05", kernel_module="proprietary")
    assert refused.status is Status.BLOCKED and "nvidia-compute-G06 (offered: none)" in refused.reason
    assert "sudo zypper --non-interactive refresh" in (refused.fix or "")
    # openSUSE Leap with no NVIDIA repository: the fix adds NVIDIA's opensuse15 directory, not SLES's
    leap = parse_os_release('ID="opensuse-leap"\nID_LIKE="suse opensuse"\nVERSION_ID="15.6"\n'
                            'PRETTY_NAME="openSUSE Leap 15.6"\n')
    bare = dataclasses.replace(f, os=leap, outputs={**f.outputs, "driver_offered": Section("", 0)})
    none = plan(bare, "580.95.05", kernel_module="proprietary")
    assert none.status is Status.BLOCKED and "/opensuse15/x86_64/cuda-opensuse15.repo" in (none.fix or ""), none.fix


def test_rhel_enables_the_branch_stream_on_el9_and_not_on_el10():
    offered = ("Available Packages\nkmod-nvidia-open-dkms.x86_64   3:570.195.03-1.el9   cuda\n"
               "nvidia-driver.x86_64   3:570.195.03-1.el9   cuda\n")
    for version, stream in (("9.4", True), ("10.0", False)):
        os = parse_os_release(f'ID="rocky"\nID_LIKE="rhel centos fedora"\nVERSION_ID="{version}"\nPRETTY_NAME="Rocky"\n')
        f = dataclasses.replace(node(offered=offered, devices=(0x2330,)), os=os, tools={"dnf": "/usr/bin/dnf"})
        p = plan(f, "570.195.03")
        install = next(a for a in p.actions if isinstance(a, InstallDriverPackages))
        lines = install.commands()
        assert ("sudo dnf module enable -y nvidia-driver:570-open" in lines) is stream, lines
        assert "kmod-nvidia-open-dkms-570.195.03-1.el9" in lines[-1]
        assert any("dnf versionlock add" in c for a in p.actions for c in a.commands())


def _answered(f: Facts, text: str, status: int = 0) -> tuple[Facts, InstallDriverPackages]:
    """The facts with the node's answer to the plan's own simulation query (what preflight.plan_asking adds)."""
    install = next(a for a in plan(f).actions if isinstance(a, InstallDriverPackages))
    assert install.query is not None and install.query.name == "apt-get -s install"
    return dataclasses.replace(f, answers={install.query.script: Section(text, status)}), install


def test_the_plan_lists_what_apt_would_install_with_versions_once_the_node_answered_its_simulation():
    f = node()
    unasked = plan(f)
    assert not any(n.startswith("the transaction") for n in unasked.notes)  # no answer yet: no listing, no guess
    # the query simulates exactly the install command, with the pin the plan writes first (not there yet)
    install = next(a for a in unasked.actions if isinstance(a, InstallDriverPackages))
    assert install.query is not None
    for name in SET:
        assert f"{name}=535.261.03-1" in install.query.script
    assert "Pin: version 535.261.03-*" in install.query.script and "PreferencesParts" in install.query.script
    answered, _ = _answered(f, "".join(f"Inst {n} ({OLD}-1 Debian:12.12/stable [amd64])\n" for n in SET)
                            + f"Inst nvidia-support (20220217+3~deb12u1 Debian:12.12/stable [amd64])\n"
                              f"Inst libnvidia-ptxjitcompiler1 ({OLD}-1 Debian:12.12/stable [amd64])\n")
    p = plan(answered)
    assert p.status is Status.CHANGE
    note = next(n for n in p.notes if n.startswith("the transaction, as apt-get -s install resolves it"))
    assert "nvidia-support 20220217+3~deb12u1 (dependency)" in note
    assert f"libnvidia-ptxjitcompiler1 {OLD}-1 (dependency)" in note and f"nvidia-smi {OLD}-1;" in note


def test_a_simulation_that_removes_a_package_not_the_drivers_or_that_apt_refuses_blocks_before_any_change():
    f = node()
    answered, _ = _answered(f, f"Remv cuda-samples [12.2-1]\nRemv nvidia-open-kernel-dkms [{NEW}-0+deb12u1]\n"
                               f"Inst nvidia-smi ({OLD}-1 Debian:12.12/stable [amd64])\n")
    p = plan(answered)
    assert p.status is Status.BLOCKED and p.lasting
    assert "would remove packages that are not the driver's" in p.reason and "cuda-samples 12.2-1" in p.reason
    assert "nvidia-open-kernel-dkms" not in p.reason  # the driver's own packages may go (the other flavour)
    assert p.fix is not None and "apt-get -s install" in p.fix and "cuda-samples" in p.fix
    refused, _ = _answered(f, f" libcuda1 : Depends: nvidia-alternative (= {OLD}-1) but {NEW}-0+deb12u1 is to be "
                              "installed\nE: Unable to correct problems, you have held broken packages.\n", 100)
    p = plan(refused)
    assert p.status is Status.BLOCKED and p.lasting and "apt-get -s install refuses" in p.reason
    assert "nvidia-alternative (= 535.261.03-1)" in p.reason


def test_bake_builds_the_module_for_a_kernel_the_packages_dkms_does_not_pick():
    """--bake --kernel K with Debian's DKMS package: its install builds for the running kernel and the newest one
    only, so K between them gets `dkms autoinstall -k K` after the install; the newest needs nothing more; once
    installed, a K with no module built is planned again with that build alone."""
    files = Section("".join(f"image {k}\nheaders {k}\n" for k in ("6.1.0-18-amd64", "6.1.0-20-amd64",
                                                                    "6.1.0-25-amd64")), 0)
    middle = plan(node(devices=(), kernel_files=files), bake=True, bake_kernel="6.1.0-20-amd64")
    assert middle.status is Status.CHANGE
    build = middle.actions[-2]  # then the hold
    assert isinstance(build, RunCommand) and build.commands() == ["sudo dkms autoinstall -k 6.1.0-20-amd64"]
    assert isinstance(middle.actions[-3], InstallDriverPackages)
    assert any("not 6.1.0-20-amd64: built for it after the install" in n for n in middle.notes)
    assert not any("every kernel" in n for n in middle.notes)
    newest = plan(node(devices=(), kernel_files=files), bake=True, bake_kernel=None)
    assert not any(isinstance(a, RunCommand) and "dkms" in a.commands()[0] for a in newest.actions)
    assert any("builds the module for 6.1.0-25-amd64 at install" in n for n in newest.notes)
    installed = dict(installed=f"{OLD}-1", held=True, devices=(), kernel_files=files)
    again = plan(node(**installed), bake=True, bake_kernel="6.1.0-20-amd64")
    assert again.status is Status.CHANGE and again.actions[-1].commands() == ["sudo dkms autoinstall -k 6.1.0-20-amd64"]
    sums = Section(f"{'a' * 64}  /lib/modules/6.1.0-20-amd64/updates/dkms/nvidia-current.ko\n", 0)
    assert plan(node(**installed, nvidia_module_sums=sums), bake=True, bake_kernel="6.1.0-20-amd64").status \
        is Status.OK


UBUNTU = parse_os_release('ID=ubuntu\nID_LIKE=debian\nVERSION_ID="22.04"\nVERSION_CODENAME=jammy\n'
                          'PRETTY_NAME="Ubuntu 22.04.4 LTS"\n')


def test_every_dkms_route_under_secure_boot_names_the_key_to_enroll_nvidias_on_ubuntu_too():
    """Secure Boot with a DKMS-built module: the note names the certificate that distribution's DKMS signs with
    (Ubuntu's shim-signed MOK, dkms's own elsewhere) and the mokutil command; NVIDIA's CUDA repository route on
    Ubuntu (no precompiled modules) had none."""
    offered = ("".join(f"{name}:\n  Installed: (none)\n  Candidate: {v}\n  Version table:\n     {v} 500\n        500 "
                       "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/x86_64  Packages\n"
                       for name, v in (("nvidia-driver-570", "570.195.03-0ubuntu1"),
                                       ("nvidia-driver-570-open", "570.195.03-0ubuntu1"),
                                       ("cuda-drivers-570", "570.195.03-1"))))
    secure = SecureBoot(True, True, "efivar 1")
    cuda = dataclasses.replace(node(offered=offered, devices=(0x1EB8,)), os=UBUNTU, kernel="5.15.0-91-generic",
                               secure_boot=secure)
    p = plan(cuda, "570.195.03")
    assert p.status is Status.CHANGE and any("ubuntu-cuda" in n for n in p.notes), p.reason
    assert any("sudo mokutil --import /var/lib/shim-signed/mok/MOK.der" in n for n in p.notes)
    debian = plan(dataclasses.replace(node(), secure_boot=secure))
    assert any("sudo mokutil --import /var/lib/dkms/mok.pub" in n for n in debian.notes)
    assert not any("mokutil" in n for n in plan(node()).notes)  # Secure Boot off: no note
