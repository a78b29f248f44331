#!/bin/sh
# Runs inside a copy of the nvidia image's tree (chroot, native speed; build_image.sh OUT nvidia-open). Three real
# states, each made by real apt, dpkg and DKMS, for the tier to read (tests/realos/README.md):
#
# 1. The open flavour. Debian's open kernel modules (nvidia-open-kernel-dkms, contrib) replace the proprietary
#    ones. bookworm ships them only at 535.261.03; bookworm-security moved the rest of the driver to 535.309.01, and
#    every piece must be one version, so the guest keeps an apt pin on bookworm's NVIDIA packages
#    (/etc/apt/preferences.d/nvidia-open-bookworm), as an administrator must. Those sources do not build for
#    bookworm-security's kernel (6.1.0-56: "nv-pci.c: too few arguments to function 'pci_resize_resource'", found
#    2026-11-24), but they do for the kernel of bookworm's own point release (bookworm main's linux-image-amd64, e.g.
#    6.1.0-50), the one the package was released against. So that kernel and its headers are installed with them,
#    and the VM's first boot runs it: one boot into it (grub-reboot, as an administrator trying a kernel does).
# 2. A second kernel's DKMS state. The image's own kernel (bookworm-security's) stays installed and is the boot
#    loader's default (GRUB_DEFAULT=0: the newest). Its headers are installed last, as a kernel update brings them:
#    DKMS's header hook builds the open modules for it and that real build fails, so dpkg leaves the headers
#    package half-configured. The output is kept in /var/log/realos/second-kernel-headers.log, DKMS's make.log in
#    its build tree. The next boot would run a kernel without an nvidia module.
# 3. A CUDA program built with Debian's packaged nvcc (nvidia-cuda-toolkit 11.8, non-free): in a throwaway copy of
#    the tree as the nvidia image made it (the toolkit is 1.6 GB to fetch and 5.6 GB installed), compiled there and
#    only the binary kept: /usr/local/bin/realos-cuda-devices (the CUDA runtime is linked statically by nvcc's
#    default; libcuda.so.1 is looked up at run time). It is never run here: it would ask this machine's kernel.
set -eu
export DEBIAN_FRONTEND=noninteractive
MIRROR=${REALOS_MIRROR:?}
say() { echo "[nvidia-open $(date +%H:%M:%S)] $*"; }
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

# 3. the CUDA program, first: the copy is the tree as the nvidia image made it
SCRATCH=/var/tmp/realos-cuda-root
say "CUDA program: a throwaway copy of the tree"
mkdir -p "$SCRATCH"
tar -C / --one-file-system --exclude=./var/tmp -cf - . | tar -C "$SCRATCH" -xf -
mkdir -p "$SCRATCH/var/tmp" "$SCRATCH/proc" "$SCRATCH/dev" "$SCRATCH/sys"
echo 'MODULES=most' > "$SCRATCH/etc/initramfs-tools/conf.d/zz-realos-build.conf"
mount -t proc proc "$SCRATCH/proc"
mount --rbind /dev "$SCRATCH/dev"
cat > "$SCRATCH/tmp/realos-cuda-devices.cu" <<'CU'
// realos: ask the CUDA runtime how many devices there are, as most CUDA programs do first
#include <cstdio>
#include <cuda_runtime.h>

int main() {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
        std::printf("cudaGetDeviceCount returned %d\n-> %s\n", static_cast<int>(err), cudaGetErrorString(err));
        std::printf("Result = FAIL\n");
        return 1;
    }
    std::printf("Detected %d CUDA Capable device(s)\n", count);
    return 0;
}
CU
cp /tmp/realos-build-sources.list "$SCRATCH/tmp/"
say "CUDA program: apt-get install nvidia-cuda-toolkit (copy)"
# shellcheck disable=SC2086
chroot "$SCRATCH" apt-get $APT install -y --no-install-recommends nvidia-cuda-toolkit g++-11 |
  grep -E '^(Need to get|After this operation|[0-9]+ upgraded)' || true
chroot "$SCRATCH" dpkg-query -W -f '${Package} ${Version}\n' nvidia-cuda-toolkit
say "CUDA program: nvcc (g++-11: nvcc 11.8 takes no newer host compiler)"
chroot "$SCRATCH" sh -ec 'nvcc --version | tail -n 2; cd /tmp && nvcc -ccbin g++-11 -o realos-cuda-devices realos-cuda-devices.cu'
install -m 0755 "$SCRATCH/tmp/realos-cuda-devices" /usr/local/bin/realos-cuda-devices
umount -R "$SCRATCH/dev"
umount "$SCRATCH/proc"
rm -rf --one-file-system "$SCRATCH"
ldd /usr/local/bin/realos-cuda-devices
say "CUDA program: kept /usr/local/bin/realos-cuda-devices, the copy removed"

# 1. the open flavour, with the kernel of bookworm's point release
cat > /etc/apt/preferences.d/nvidia-open-bookworm <<PIN
# The open kernel modules exist only in bookworm (535.261.03): keep the whole driver at that version.
Package: nvidia-* libnvidia-* libcuda1 firmware-nvidia-*
Pin: release n=bookworm
Pin-Priority: 1001
PIN
# mkinitramfs cannot find the root device of a chroot with the guest's MODULES=dep: MODULES=most while building
echo 'MODULES=most' > /etc/initramfs-tools/conf.d/zz-realos-build.conf
SECOND=$(ls /lib/modules)  # the image's own kernel (bookworm-security's); the only one so far
# shellcheck disable=SC2086
POINT=$(apt-cache $APT madison linux-image-amd64 | awk '/ bookworm\/main / { print $3; exit }')
# shellcheck disable=SC2086
FIRST=$(apt-cache $APT show "linux-image-amd64=$POINT" | sed -n 's/^Depends: .*linux-image-\([^ ,]*-amd64\).*/\1/p' | head -n 1)
[ -n "$FIRST" ] && [ "$FIRST" != "$SECOND" ] || { say "no older point-release kernel than $SECOND: '$FIRST'"; exit 1; }
KEEP=$(dpkg-query -W -f '${db:Status-Status} ${Package}\n' | awk '$1 == "installed" { print $2 }' |
  grep -E '^(nvidia-|libnvidia-|libcuda|firmware-nvidia-)' | grep -vx -e nvidia-kernel-dkms -e nvidia-kernel-support)
say "apt-get install nvidia-open-kernel-dkms (DKMS build inside) for $FIRST, in place of nvidia-kernel-dkms and" \
  "$SECOND's headers; keeping:" $KEEP
# shellcheck disable=SC2086
apt-get $APT install -y --no-install-recommends --allow-downgrades --purge nvidia-open-kernel-dkms $KEEP \
  "linux-image-$FIRST" "linux-headers-$FIRST" nvidia-kernel-dkms- nvidia-kernel-support- linux-headers-amd64- \
  "linux-headers-$SECOND-" || {
  say "apt-get failed; the DKMS build's log:"
  tail -n 80 /var/lib/dkms/nvidia-current-open/*/build/make.log 2>/dev/null || true
  exit 1
}
say "installed"
dkms status

# 2. the second kernel's headers: DKMS's header hook builds for it (and fails: the state is kept as it is)
mkdir -p /var/log/realos
say "apt-get install linux-headers-$SECOND (DKMS builds for it)"
rc=0
# shellcheck disable=SC2086
apt-get $APT install -y --no-install-recommends "linux-headers-$SECOND" > /var/log/realos/second-kernel-headers.log 2>&1 ||
  rc=$?
echo "exit $rc" >> /var/log/realos/second-kernel-headers.log
cat /var/log/realos/second-kernel-headers.log
dkms status
dpkg-query -W -f '${Package} ${Version} ${db:Status-Status}\n' "linux-headers-$SECOND" "linux-image-$FIRST"
rm /etc/initramfs-tools/conf.d/zz-realos-build.conf

# the first boot (realos-firstboot.service, after update-grub; '-': the power-off follows whatever happens) makes the next boot, the tier's, run $FIRST once
mkdir -p /etc/systemd/system/realos-firstboot.service.d
cat > /etc/systemd/system/realos-firstboot.service.d/boot-once.conf <<UNIT
[Service]
ExecStart=-/bin/sh -ec 'entry="Advanced options for Debian GNU/Linux>Debian GNU/Linux, with Linux $FIRST"; grep -qF "with Linux $FIRST" /boot/grub/grub.cfg; grub-reboot "\$\$entry"; grub-editenv list; echo "realos-firstboot: one boot into $FIRST"'
UNIT
echo "$FIRST" > /etc/realos-boot-once
dpkg -l | grep -E 'nvidia|libcuda|linux-(image|headers)' || true
ls -l /lib/modules/*/updates/dkms/ || true
# shellcheck disable=SC2086
apt-get $APT clean
rm -f /tmp/realos-build-sources.list
