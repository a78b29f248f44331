#!/bin/sh
# Runs inside the image tree (chroot) at the end of mmdebstrap: configuration of the test guest.
set -eu
echo realos > /etc/hostname
printf '127.0.0.1\tlocalhost\n127.0.1.1\trealos\n' > /etc/hosts
echo 'LABEL=realos-root / ext4 errors=remount-ro 0 1' > /etc/fstab
# The guest reaches Debian's archive only through the test's forward at 10.0.2.100 (slirp guestfwd).
rm -f /etc/apt/sources.list /etc/apt/sources.list.d/*
C=${REALOS_COMPONENTS:-main}
cat > /etc/apt/sources.list <<LIST
deb http://10.0.2.100/debian bookworm $C
deb http://10.0.2.100/debian bookworm-updates $C
deb http://10.0.2.100/debian-security bookworm-security $C
LIST
# A quick boot on a serial console; later initramfs rebuilds in the guest take ~1 min under TCG, not ~9.
sed -i -e 's/^GRUB_TIMEOUT=.*/GRUB_TIMEOUT=0/' \
       -e 's/^GRUB_CMDLINE_LINUX_DEFAULT=.*/GRUB_CMDLINE_LINUX_DEFAULT="console=ttyS0"/' /etc/default/grub
echo 'MODULES=dep' > /etc/initramfs-tools/conf.d/realos-modules.conf
# The nvidia image meets the packaged driver with no NVIDIA GPU at all: nothing pretends to be one there.
if [ "${REALOS_VARIANT:-base}" = nvidia ]; then
  rm /etc/systemd/system/realos-fake-gpu.service /usr/local/sbin/realos-fake-gpu
  systemctl enable systemd-networkd.service realos-firstboot.service
else
  systemctl enable systemd-networkd.service realos-fake-gpu.service realos-firstboot.service
fi
# Timers that would take the apt lock or disk time at random moments during a test.
systemctl mask apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer man-db.timer \
  dpkg-db-backup.timer 2>/dev/null || true
touch /etc/realos-firstboot
apt-get clean
