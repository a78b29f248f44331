#!/bin/sh
# Runs inside a copy of the nvidia image's tree (chroot, native speed; build_image.sh OUT nvidia-open): Debian's
# open kernel modules (nvidia-open-kernel-dkms, contrib) in place of the proprietary ones, by real apt and dpkg.
# Its postinst runs the real DKMS build of the open modules for the image's own kernel.
#
# bookworm ships the open flavour only at 535.261.03 (bookworm contrib); bookworm-security moved the rest of the
# driver to 535.309.01, and every piece must be one version (nvidia-open-kernel-support needs
# nvidia-alternative-535.261.03). So the guest keeps an apt pin on bookworm's NVIDIA packages
# (/etc/apt/preferences.d/nvidia-open-bookworm), as an administrator must to install the open flavour there.
set -eu
export DEBIAN_FRONTEND=noninteractive
MIRROR=${REALOS_MIRROR:?}
say() { echo "[nvidia-open $(date +%H:%M:%S)] $*"; }
cat > /etc/apt/preferences.d/nvidia-open-bookworm <<PIN
# The open kernel modules exist only in bookworm (535.261.03): keep the whole driver at that version.
Package: nvidia-* libnvidia-* libcuda1 firmware-nvidia-*
Pin: release n=bookworm
Pin-Priority: 1001
PIN
# The build reaches the archive directly (the guest's own sources name the test relay, 10.0.2.100).
C="main contrib non-free non-free-firmware"
cat > /tmp/realos-build-sources.list <<LIST
deb $MIRROR bookworm $C
deb $MIRROR bookworm-updates $C
deb ${MIRROR%/debian}/debian-security bookworm-security $C
LIST
APT="-o Dir::Etc::sourcelist=/tmp/realos-build-sources.list -o Dir::Etc::sourceparts=-"
say "apt-get update"
# shellcheck disable=SC2086
apt-get $APT update -qq
KEEP=$(dpkg-query -W -f '${db:Status-Status} ${Package}\n' | awk '$1 == "installed" { print $2 }' |
  grep -E '^(nvidia-|libnvidia-|libcuda|firmware-nvidia-)' | grep -vx -e nvidia-kernel-dkms -e nvidia-kernel-support)
say "apt-get install nvidia-open-kernel-dkms (DKMS build inside), in place of nvidia-kernel-dkms; keeping:" $KEEP
# shellcheck disable=SC2086
apt-get $APT install -y --no-install-recommends --allow-downgrades --purge nvidia-open-kernel-dkms $KEEP \
  nvidia-kernel-dkms- nvidia-kernel-support- || {
  # found on 2026-11-24: bookworm's open modules (535.261.03) fail their DKMS build for bookworm-security's kernel
  say "apt-get failed; the DKMS build's log:"
  tail -n 80 /var/lib/dkms/nvidia-current-open/*/build/make.log 2>/dev/null || true
  exit 1
}
say "installed"
dpkg -l | grep -E 'nvidia|libcuda' || true
dkms status
ls -l /lib/modules/*/updates/dkms/
# shellcheck disable=SC2086
apt-get $APT clean
rm -f /tmp/realos-build-sources.list
