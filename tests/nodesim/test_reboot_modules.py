"""Reboots, /proc/modules and what decides which GPU driver binds at boot."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

pytestmark = pytest.mark.integration

BLACKLIST = "printf 'blacklist nouveau\\noptions nouveau modeset=0\\n' > /etc/modprobe.d/blacklist-nouveau.conf"


def test_fresh_gpu_node_has_nouveau_in_real_proc_modules_format(sim_node):
    node = sim_node("ubuntu-22.04-t4")
    assert node.loaded_modules()[0] == "nouveau"
    line = next(ln for ln in node.read("/proc/modules").splitlines() if ln.startswith("nouveau "))
    assert line == "nouveau 2797568 1 - Live 0x0000000000000000"
    assert node.exists("/sys/module/nouveau")
    assert node.read("/proc/driver/nvidia/version") is None
    rc, out, _ = node.ssh("readlink /sys/bus/pci/devices/0000:00:1e.0/driver; lsmod | head -2")
    assert out.splitlines() == ["/sys/bus/pci/drivers/nouveau", "Module                  Size  Used by",
                                "nouveau              2797568  1"]


def test_no_gpu_no_nouveau(sim_node):
    node = sim_node("debian-12-nogpu")
    assert "nouveau" not in node.loaded_modules() and node.loaded_modules()


def test_reboot_changes_boot_id_and_drops_the_session(sim_node):
    node = sim_node("ubuntu-22.04-t4")
    before = node.boot_id
    assert len(before) == 36
    t0 = time.monotonic()
    rc, out, err = node.ssh("echo going; reboot; echo after-reboot")
    assert rc == -1  # the session was dropped, no exit status
    assert "after-reboot" not in out
    assert time.monotonic() - t0 < 10
    node.wait_for_reboot(1, timeout=10)  # the session dies first, then the node boots (as a real one does)
    assert node.reboots == 1 and node.boot_id != before
    assert node.calls("reboot") == [["reboot"]]
    # sshd serves again
    assert node.ssh("cat /proc/sys/kernel/random/boot_id")[1].strip() == node.boot_id


def test_a_rebooted_node_waits_for_its_own_port_rather_than_moving(sim_node, monkeypatch):
    """Its clients (an Ansible inventory) know one port: a reboot that finds the port busy for a moment tries it
    again, and never comes back on another port (where nobody would find it)."""
    node = sim_node("rocky-9-nogpu")
    port = node.port
    node._stop_sshd()
    squatter = socket.socket()
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    squatter.bind(("127.0.0.1", port))
    squatter.listen()
    threading.Timer(3, squatter.close).start()  # longer than sshd takes to fail its bind and exit
    t0 = time.monotonic()
    node._start_sshd(same_port=True)
    assert node.port == port and time.monotonic() - t0 >= 2.9  # not "ready" on sshd's own bind failure
    assert node.ssh("echo back")[1] == "back\n"


def test_a_node_that_is_down_keeps_its_port_and_refuses_connections(sim_node):
    """While a node is off, no other process can bind its port or get it as an outgoing connection's port (a
    parallel test's); a client is refused, as by a machine that is off; it boots back on the same port."""
    node = sim_node("rocky-9-nogpu")
    port = node.port
    node.ssh("poweroff")
    deadline = time.monotonic() + 15
    while node.powered_on and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not node.powered_on
    other = socket.socket()
    with pytest.raises(OSError):
        other.bind(("127.0.0.1", port))
    other.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    node.power_on()
    assert node.port == port and node.ssh("echo up")[1] == "up\n"


def test_a_reboot_the_host_side_fails_is_reported_to_the_test(sim_node, monkeypatch):
    """The reboot watcher runs beside the test: a boot that fails there is recorded on the node (and fails the
    test at teardown) instead of leaving a node that silently never answers again."""
    node = sim_node("rocky-9-nogpu")

    def broken_boot(initial: bool = False) -> None:
        raise RuntimeError("node boot failed (124): timed out")

    monkeypatch.setattr(node, "_boot", broken_boot)
    node.ssh("reboot")
    deadline = time.monotonic() + 15
    while not node.faults and time.monotonic() < deadline:
        time.sleep(0.05)
    assert node.faults == ["reboot failed: RuntimeError('node boot failed (124): timed out')"]
    node.faults.clear()  # seen: the fixture's teardown would fail this test for it


@pytest.mark.parametrize("cmd", ["systemctl reboot", "shutdown -r now", "nohup sh -c 'sleep 0.3; reboot' >/dev/null 2>&1 &"])
def test_other_reboot_commands(sim_node, cmd):
    node = sim_node("rocky-9-nogpu")
    before = node.boot_id
    node.ssh(cmd)
    node.wait_for_reboot(1, timeout=15)
    assert node.boot_id != before


def test_blacklist_needs_the_initramfs_rebuilt(sim_node):
    node = sim_node("ubuntu-22.04-t4")
    node.ssh(BLACKLIST)
    node.reboot()
    assert "nouveau" in node.loaded_modules()  # the old initramfs still loads it
    rc, out, _ = node.ssh("update-initramfs -u")
    assert rc == 0 and out == "update-initramfs: Generating /boot/initrd.img-5.15.0-91-generic\n"
    assert "blacklist nouveau" in node.initramfs_blacklist()
    assert node.calls("update-initramfs") == [["update-initramfs", "-u"]]
    node.ssh("reboot")
    node.wait_for_reboot(2)
    assert "nouveau" not in node.loaded_modules()
    assert not node.exists("/sys/module/nouveau")
    assert not node.exists("/sys/bus/pci/devices/0000:00:1e.0/driver")


def test_initramfs_alone_is_not_enough_either(sim_node):
    node = sim_node("debian-12-rtx4090")
    node.ssh(BLACKLIST + " && update-initramfs -u && rm /etc/modprobe.d/blacklist-nouveau.conf")
    node.reboot()
    assert "nouveau" in node.loaded_modules()


def test_dracut_on_rocky(sim_node):
    node = sim_node("rocky-9-a100x8")
    node.ssh("echo 'blacklist nouveau' > /etc/modprobe.d/nouveau.conf")
    rc, _, err = node.ssh("dracut")
    assert rc == 1 and "Will not override existing initramfs" in err
    rc, _, err = node.ssh("dracut -f")
    assert rc == 0, err
    node.reboot()
    assert "nouveau" not in node.loaded_modules()


def test_kernel_cmdline_blacklist(sim_node):
    node = sim_node("ubuntu-24.04-t4", cmdline="BOOT_IMAGE=/vmlinuz root=/dev/vda1 ro modprobe.blacklist=nouveau")
    assert "nouveau" not in node.loaded_modules()


def test_nouveau_override_and_setters(sim_node):
    node = sim_node("ubuntu-22.04-h100x8", nouveau_loaded=False)
    assert "nouveau" not in node.loaded_modules()
    node.set_module_loaded("nouveau", True)
    assert node.is_loaded("nouveau") and node.exists("/sys/module/nouveau")
    node.set_module_loaded("nouveau", False)
    assert not node.is_loaded("nouveau")


def test_modprobe_rmmod_lsmod(sim_node):
    node = sim_node("ubuntu-22.04-t4")
    rc, _, err = node.ssh("modprobe nvidia")
    assert rc == 1 and err == "modprobe: FATAL: Module nvidia not found in directory /lib/modules/5.15.0-91-generic\n"
    rc, _, err = node.ssh("rmmod drm")
    assert rc == 1 and err.startswith("rmmod: ERROR: Module drm is in use by: ")
    rc, _, err = node.ssh("rmmod nouveau && modprobe -r nouveau && rmmod nouveau")
    assert rc == 1 and err == "rmmod: ERROR: Module nouveau is not currently loaded\n"
    rc, _, _ = node.ssh("modprobe nouveau && lsmod | grep -c '^nouveau '")
    assert rc == 0 and node.is_loaded("nouveau")
    rc, out, _ = node.ssh("echo 'blacklist nouveau' > /etc/modprobe.d/x.conf; modprobe -c | grep nouveau")
    assert out == "blacklist nouveau\n"


def test_nouveau_busy_on_a_console_gpu(sim_node):
    node = sim_node("ubuntu-22.04-rtx4090")
    rc, _, err = node.ssh("modprobe -r nouveau")
    assert rc == 1 and err == "modprobe: FATAL: Module nouveau is in use.\n"


def test_preinstalled_driver_loads_at_boot(sim_node):
    node = sim_node("ubuntu-22.04-h100x8", preinstalled_driver="565.57.01")
    mods = node.loaded_modules()
    assert {"nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm"} <= set(mods) and "nouveau" not in mods
    line = next(ln for ln in node.read("/proc/modules").splitlines() if ln.startswith("nvidia "))
    assert line.startswith("nvidia 56623104 2 ") and line.endswith(" Live 0x0000000000000000 (OE)")
    assert node.read("/proc/driver/nvidia/version").startswith(
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  565.57.01  Release Build")
    assert node.read("/sys/module/nvidia/version") == "565.57.01\n"
    assert sorted(node.listdir("/proc/driver/nvidia-nvswitch/devices")) == [
        "0000:83:00.0", "0000:84:00.0", "0000:85:00.0", "0000:86:00.0"]
    rc, out, _ = node.ssh("readlink /sys/bus/pci/devices/0000:18:00.0/driver; readlink /sys/bus/pci/devices/0000:83:00.0/driver")
    assert out.split() == ["/sys/bus/pci/drivers/nvidia", "/sys/bus/pci/drivers/nvidia-nvswitch"]
    # unloading the driver removes the derived files
    rc, _, err = node.ssh("modprobe -r nvidia")
    assert rc == 1 and "in use" in err
    rc, _, err = node.ssh("modprobe -r nvidia_drm nvidia_modeset nvidia_uvm nvidia")
    assert rc == 0, err
    assert node.read("/proc/driver/nvidia/version") is None
    assert node.listdir("/proc/driver/nvidia-nvswitch/devices") == []


def test_secure_boot_rejects_unsigned_module_and_mok_enrolment(sim_node):
    node = sim_node("ubuntu-22.04-t4", secure_boot=True, preinstalled_driver="550.127.05")
    assert "nvidia" not in node.loaded_modules() and "nouveau" not in node.loaded_modules()
    rc, out, _ = node.ssh("mokutil --sb-state")
    assert out == "SecureBoot enabled\n"
    rc, _, err = node.ssh("modprobe nvidia")
    assert rc == 1 and err == "modprobe: ERROR: could not insert 'nvidia': Key was rejected by service\n"
    node.set_secure_boot(False)
    assert node.ssh("mokutil --sb-state")[1] == "SecureBoot disabled\n"
    assert node.ssh("modprobe nvidia")[0] == 0


def test_efivar_and_legacy_bios(sim_node):
    node = sim_node("ubuntu-22.04-nogpu", secure_boot=True)
    raw = node.read_bytes("/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c")
    assert raw == bytes([6, 0, 0, 0, 1])
    bios = sim_node("ubuntu-22.04-nogpu", efi=False)
    assert not bios.exists("/sys/firmware/efi")
    rc, out, err = bios.ssh("mokutil --sb-state")
    assert rc != 0 and out == "" and err == "EFI variables are not supported on this system\n"


def test_dkms_builds_for_a_new_kernel_when_it_is_installed_not_at_boot(sim_node, fake_driver_run):
    """Real DKMS builds from the kernel's postinst hook (and the headers' header_postinst hook on Debian/Ubuntu);
    at boot only where dkms.service runs `dkms autoinstall`."""
    node = sim_node("ubuntu-22.04-t4", nouveau_loaded=False, extra_packages=("dkms",))
    node.write("/root/d.run", fake_driver_run("550.127.05").read_bytes(), 0o755)
    rc, _, err = node.ssh("sh /root/d.run --silent --dkms")
    assert rc == 0, err
    node.set_kernel("5.15.0-125-generic", headers=True)  # headers there when the kernel installs: built then
    assert "5.15.0-125-generic" in node.driver()["kernels"]
    node.reboot()
    assert node.kernel == "5.15.0-125-generic"
    assert node.ssh("uname -r")[1] == "5.15.0-125-generic\n"
    assert "nvidia" in node.loaded_modules()
    # without headers at install time nothing is built, and the boot has no driver
    node.set_kernel("5.15.0-126-generic", headers=False)
    assert node.ssh("dkms status")[1] == ("nvidia/550.127.05, 5.15.0-91-generic, x86_64: installed\n"
                                          "nvidia/550.127.05, 5.15.0-125-generic, x86_64: installed\n")
    node.reboot()
    assert node.kernel == "5.15.0-126-generic" and "nvidia" not in node.loaded_modules()
    # headers installed later: the header hook builds (Debian/Ubuntu)
    node.offer_package("linux-headers-5.15.0-126-generic", "5.15.0-126.1", effects="headers:5.15.0-126-generic")
    node.add_kernel_headers()  # header_postinst.d/dkms builds for the installed kernel
    assert "5.15.0-126-generic" in node.driver()["kernels"]
    rc, out, err = node.ssh("dkms install -m nvidia -v 550.127.05 -k 5.15.0-126-generic")
    assert rc == 0 and "already installed" in out
    rc, _, err = node.ssh("dkms install -m nvidia -v 550.127.05 -k 5.15.0-999-generic")
    assert rc == 1 and "/lib/modules/5.15.0-999-generic doesn't exist" in err
    # without DKMS the module does not follow a kernel update
    other = sim_node("ubuntu-22.04-t4", nouveau_loaded=False, preinstalled_driver="550.127.05")
    other.set_kernel("5.15.0-125-generic", headers=True)
    other.reboot()
    assert "nvidia" not in other.loaded_modules()


def test_dkms_service_builds_at_boot(sim_node, fake_driver_run):
    node = sim_node("ubuntu-22.04-t4", nouveau_loaded=False, extra_packages=("dkms",))
    node.write("/root/d.run", fake_driver_run("550.127.05").read_bytes(), 0o755)
    assert node.ssh("sh /root/d.run --silent --dkms")[0] == 0
    node.set_kernel("5.15.0-126-generic", headers=False)
    node._p("usr/src/linux-headers-5.15.0-126-generic/include").mkdir(parents=True)  # headers copied in by hand
    os.symlink("/usr/src/linux-headers-5.15.0-126-generic", node._p("usr/lib/modules/5.15.0-126-generic/build"))
    node.set_unit("dkms.service", active="inactive", enabled="enabled")
    node.reboot()
    assert node.kernel == "5.15.0-126-generic" and "nvidia" in node.loaded_modules()


def test_reboot_downtime_and_poweroff(sim_node):
    node = sim_node("debian-12-nogpu", reboot_downtime=0.8)
    node.ssh("nohup sh -c 'sleep 0.2; reboot' >/dev/null 2>&1 &")
    time.sleep(0.5)
    with socket.socket() as s:
        s.settimeout(1)
        with pytest.raises(OSError):
            s.connect(("127.0.0.1", node.port))
    node.wait_for_reboot(1, timeout=10)
    deadline = time.monotonic() + 10
    while True:
        try:
            assert node.ssh("echo up")[1] == "up\n"
            break
        except Exception:  # noqa: BLE001
            assert time.monotonic() < deadline
            time.sleep(0.1)
    assert node.ssh("poweroff")[0] == -1
    deadline = time.monotonic() + 10  # a loaded machine may take longer than a fixed sleep to stop sshd
    while node.powered_on and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not node.powered_on
    node.power_on()
    assert node.ssh("echo on")[1] == "on\n"


def test_a_reboot_request_caught_half_written_is_read_again_not_taken_for_a_reboot(sim_node):
    # the shims write "ACTION PID" with `echo >`, which creates the file before it writes it: a poll in between
    # must wait for the words (read as a reboot, a poweroff came back up under load)
    from tests.nodesim.node import STATE

    node = sim_node("debian-12-nogpu")
    boots = node.reboots
    request = node.root / STATE / "reboot-request"
    request.write_text("")
    node._poll_reboot()
    assert node.reboots == boots and node.powered_on and request.exists()
    request.write_text("poweroff 123\n")
    node._poll_reboot()
    assert node.reboots == boots and not node.powered_on
