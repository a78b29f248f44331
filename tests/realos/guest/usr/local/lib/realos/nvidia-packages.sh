#!/bin/sh
# Runs inside the nvidia image's tree (chroot, native speed) during mmdebstrap: Debian's packaged NVIDIA
# driver installed by real apt and dpkg. nvidia-kernel-dkms's postinst runs the real DKMS build for every
# kernel whose headers are installed: here the image's own kernel, the one the VM boots.
set -eu
export DEBIAN_FRONTEND=noninteractive
echo "[nvidia-packages $(date +%H:%M:%S)] apt-get install (DKMS build inside)"
apt-get install -y --no-install-recommends nvidia-kernel-dkms nvidia-smi libnvidia-ml1 nvidia-modprobe \
  nvidia-persistenced firmware-nvidia-gsp
echo "[nvidia-packages $(date +%H:%M:%S)] installed"
dkms status
ls -l /lib/modules/*/updates/dkms/
