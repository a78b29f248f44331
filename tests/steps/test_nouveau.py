"""The nouveau step's plan is pure: facts in, plan out."""

import dataclasses

from gpunode.facts import Facts
from gpunode.facts.kernel import PciDevice
from gpunode.facts.osinfo import parse_os_release
from gpunode.options import Options
from gpunode.plan import Reboot, RunCommand, Status, WriteFile
from gpunode.steps import nouveau

UBUNTU = parse_os_release('ID=ubuntu\nID_LIKE=debian\nVERSION_ID="22.04"\nPRETTY_NAME="Ubuntu 22.04.5 LTS"\n')
ROCKY = parse_os_release('ID="rocky"\nID_LIKE="rhel centos fedora"\nVERSION_ID="9.3"\nPRETTY_NAME="Rocky Linux 9.3"\n')
T4 = PciDevice("0000:00:1e.0", 0x10DE, 0x1EB8, 0x030200)
BLOCK = "blacklist nouveau\noptions nouveau modeset=0\n"


def facts(**changes) -> Facts:
    base = Facts(os=UBUNTU, kernel="5.15.0-91-generic", pci=(T4,), tools={"update-initramfs": "/usr/sbin/x"})
    return dataclasses.replace(base, **changes)


def plan(f: Facts):
    return nouveau.plan(f, Options(), {})


def test_not_blacklisted_writes_the_file_and_rebuilds_initramfs():
    p = plan(facts())
    assert p.status is Status.CHANGE
    write, rebuild = p.actions
    assert isinstance(write, WriteFile) and write.path == "/etc/modprobe.d/blacklist-nouveau.conf"
    assert write.before is None and "blacklist nouveau\noptions nouveau modeset=0\n" in write.after
    assert "+blacklist nouveau" in write.diff() and write.diff().startswith("--- /dev/null")
    assert isinstance(rebuild, RunCommand) and rebuild.commands() == ["sudo update-initramfs -u"]
    assert not p.reboot_required


def test_modprobe_dir_missing_is_just_a_new_file():
    # No modprobe.d file at all on the node: the write creates the directory (write-file does mkdir -p).
    p = plan(facts(files={}))
    assert p.actions[0].before is None


def test_blacklisted_under_another_file_name_is_ok():
    f = facts(files={"/usr/lib/modprobe.d/nvidia-installer-disable-nouveau.conf": BLOCK},
              mtimes={"/usr/lib/modprobe.d/nvidia-installer-disable-nouveau.conf": 100},
              initramfs_mtime=200)
    p = plan(f)
    assert p.status is Status.OK and "nvidia-installer-disable-nouveau.conf" in p.reason
    assert p.actions == ()


def test_nouveau_loaded_requires_a_reboot():
    p = plan(facts(modules=frozenset({"nouveau", "drm"})))
    assert p.status is Status.CHANGE and p.reboot_required
    assert isinstance(p.actions[-1], Reboot)
    assert "reboot is required" in p.reason


def test_blacklisted_but_still_loaded_only_reboots_when_initramfs_is_fresh():
    f = facts(modules=frozenset({"nouveau"}), files={nouveau.PATH: BLOCK},
              mtimes={nouveau.PATH: 100}, initramfs_mtime=150)
    p = plan(f)
    assert p.only_reboot_left


def test_stale_initramfs_is_rebuilt():
    f = facts(files={nouveau.PATH: BLOCK}, mtimes={nouveau.PATH: 300}, initramfs_mtime=150)
    p = plan(f)
    assert p.status is Status.CHANGE and [a.commands() for a in p.actions] == [["sudo update-initramfs -u"]]


def test_rhel_family_uses_dracut():
    p = plan(facts(os=ROCKY, tools={"dracut": "/usr/bin/dracut"}))
    assert p.actions[1].commands() == ["sudo dracut -f"]


def test_debian_uses_update_initramfs_even_if_dracut_is_installed():
    p = plan(facts(tools={"dracut": "/usr/bin/dracut", "update-initramfs": "/usr/sbin/update-initramfs"}))
    assert p.actions[1].commands() == ["sudo update-initramfs -u"]


def test_unknown_distro_without_initramfs_tool_is_blocked():
    other = parse_os_release("ID=flatcar\nVERSION_ID=3139.2.0\n")
    p = plan(facts(os=other, tools={}))
    assert p.status is Status.BLOCKED and "dracut" in (p.fix or "")


def test_user_lines_in_our_file_are_kept():
    mine = "# my notes\nblacklist nouveau\nblacklist floppy\n"
    p = plan(facts(files={nouveau.PATH: mine}))
    write = p.actions[0]
    assert write.after == mine + "options nouveau modeset=0\n"
    assert write.before == mine


def test_no_gpu_nothing_to_do():
    p = plan(facts(pci=()))
    assert p.status is Status.OK and "no NVIDIA GPU" in p.reason
