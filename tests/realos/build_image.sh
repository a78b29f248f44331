#!/usr/bin/env bash
# Build the Debian 12 disk image of the real-OS test tier (tests/realos/README.md).
#
#   build_image.sh OUT_DIR [base|nvidia]
#   build_image.sh OUT_DIR nvidia-open NVIDIA_IMAGE_DIR
#
# With `nvidia`, the image also carries Debian's packaged NVIDIA driver (non-free, 535), installed by real
# apt/dpkg inside the image tree at native speed: the real DKMS build of the real kernel modules for the
# image's own kernel (the one the VM boots), nvidia-smi, libnvidia-ml1, nvidia-modprobe, nvidia-persistenced.
# No GPU is presented to that guest (realos-fake-gpu is masked): the driver meets a machine without one. Its
# finished tree is also kept (OUT_DIR/tree.tar.zst) for the variants derived from it.
# `nvidia-open` is derived from that tree, not from a second mmdebstrap: a copy of it, where real apt replaces
# nvidia-kernel-dkms by the open flavour, nvidia-open-kernel-dkms (real DKMS build, native speed again);
# guest/usr/local/lib/realos/nvidia-open.sh.
#
# Writes into OUT_DIR: disk.raw (sparse, 8 GiB, MBR + one ext4 partition, real grub in the MBR),
# id_ed25519[.pub] (root's login key), ssh_host_ed25519_key.pub (the guest's host key) and build.log.
# Everything comes from Debian's archive through mmdebstrap; the boot loader is installed by a first
# boot under QEMU (grub-install needs the guest's own /dev/vda). Needs root, mmdebstrap, qemu-system-x86,
# e2fsprogs, fdisk (sfdisk), zstd, util-linux (unshare) and openssh-client. Runs at nice 10: the machine is
# shared.
set -euo pipefail
OUT=${1:?usage: build_image.sh OUT_DIR [base|nvidia|nvidia-open NVIDIA_IMAGE_DIR]}
VARIANT=${2:-base}
PARENT=${3:-}
HERE=$(cd "$(dirname "$0")" && pwd)
MIRROR=${GPUNODE_REALOS_BUILD_MIRROR:-http://deb.debian.org/debian}
SIZE_MIB=8192
mkdir -p "$OUT"
WORK=$(mktemp -d /var/tmp/gpunode-realos-build.XXXXXX)
trap 'rm -rf --one-file-system "$WORK"' EXIT
ROOT=$WORK/root
stamp() { echo "[build_image $(date +%H:%M:%S)] $*"; }

stamp "keys"
rm -f "$OUT/id_ed25519" "$OUT/id_ed25519.pub"
ssh-keygen -q -t ed25519 -N '' -C gpunode-realos -f "$OUT/id_ed25519"

case "$VARIANT" in
base|nvidia)
stamp "mmdebstrap (Debian 12 from the archive)"
# The packages a GPU container host has before gpunode runs: real systemd, grub, initramfs-tools, kmod,
# apt/dpkg, sshd, python3 (only for the toolkit stand-in), and Debian's docker.io + containerd.
INCLUDE=systemd-sysv,udev,dbus,linux-image-amd64,grub-pc,initramfs-tools,zstd,kmod,openssh-server,python3,pciutils,iproute2,procps,docker.io,containerd,less
COMPONENTS=main
HOOKS=()
if [ "$VARIANT" = nvidia ]; then
  # non-free only in this image's own sources (the build chroot's, then the guest's): never the host's
  COMPONENTS="main contrib non-free non-free-firmware"
  INCLUDE=$INCLUDE,dkms,linux-headers-amd64
  HOOKS=(--customize-hook='chroot "$1" sh /usr/local/lib/realos/nvidia-packages.sh')
fi
nice -n 10 mmdebstrap --mode=root --variant=apt --format=directory \
  --include="$INCLUDE" --components="${COMPONENTS// /,}" \
  --customize-hook="cp -r '$HERE/guest/.' \"\$1/\"" \
  "${HOOKS[@]}" \
  --customize-hook="chroot \"\$1\" env REALOS_COMPONENTS='$COMPONENTS' REALOS_VARIANT='$VARIANT' sh /usr/local/lib/realos/customize.sh" \
  bookworm "$ROOT" "$MIRROR" "${MIRROR%/debian}/debian-security bookworm-security $COMPONENTS" \
  "$MIRROR bookworm-updates $COMPONENTS"

if [ "$VARIANT" = nvidia ]; then
  stamp "the finished tree, kept for the variants derived from it"
  tar -C "$ROOT" --numeric-owner --xattrs --xattrs-include='*' --acls -cf - . | nice -n 10 zstd -q -T0 -3 -o "$OUT/tree.tar.zst"
fi
;;
nvidia-open)
  [ -f "$PARENT/tree.tar.zst" ] || { echo "nvidia-open needs the nvidia image's tree: $PARENT/tree.tar.zst" >&2; exit 2; }
  stamp "copy of the nvidia image's tree"
  mkdir "$ROOT"
  nice -n 10 zstd -q -dc "$PARENT/tree.tar.zst" | tar -C "$ROOT" --numeric-owner --xattrs --xattrs-include='*' --acls -xf -
  install -m 0644 "$HERE/guest/usr/local/lib/realos/nvidia-open.sh" "$ROOT/usr/local/lib/realos/nvidia-open.sh"
  # apt inside the copy needs /proc, /dev and name resolution: mounted in a private mount namespace, so they
  # are gone with it (the tree is removed afterwards and must never hold a mount of this machine's /dev)
  cp /etc/resolv.conf "$WORK/resolv.conf"
  nice -n 10 unshare --mount --propagation private -- sh -ec '
    mount -t proc proc "$1/proc"; mount --rbind /dev "$1/dev"; mount -t sysfs sysfs "$1/sys"
    if [ -e "$1/etc/resolv.conf" ] || [ -L "$1/etc/resolv.conf" ]; then mv "$1/etc/resolv.conf" "$1/etc/resolv.conf.realos"; fi
    cp "$2/resolv.conf" "$1/etc/resolv.conf"
    rc=0; chroot "$1" env REALOS_MIRROR="$3" sh /usr/local/lib/realos/nvidia-open.sh || rc=$?
    rm -f "$1/etc/resolv.conf"
    if [ -e "$1/etc/resolv.conf.realos" ] || [ -L "$1/etc/resolv.conf.realos" ]; then mv "$1/etc/resolv.conf.realos" "$1/etc/resolv.conf"; fi
    exit $rc' realos-chroot "$ROOT" "$WORK" "$MIRROR"
  for m in proc dev sys; do ! mountpoint -q "$ROOT/$m" || { echo "$ROOT/$m still mounted" >&2; exit 1; }; done
  rm -f "$ROOT/root/.ssh/authorized_keys"
  touch "$ROOT/etc/realos-firstboot"
  ;;
*) echo "unknown variant $VARIANT" >&2; exit 2 ;;
esac

install -d -m 0700 "$ROOT/root/.ssh"
install -m 0600 "$OUT/id_ed25519.pub" "$ROOT/root/.ssh/authorized_keys"
cp "$ROOT/etc/ssh/ssh_host_ed25519_key.pub" "$OUT/ssh_host_ed25519_key.pub"
ls "$ROOT"/boot/vmlinuz-* >/dev/null
KVER=$(basename "$(ls "$ROOT"/boot/vmlinuz-* | sort -V | tail -n1)" | sed 's/^vmlinuz-//')
cp "$ROOT/boot/vmlinuz-$KVER" "$ROOT/boot/initrd.img-$KVER" "$WORK/"
echo "$KVER" > "$OUT/kernel"

stamp "disk image (ext4 from the tree, no loop device)"
DISK=$WORK/disk.raw
truncate -s "${SIZE_MIB}M" "$DISK"
echo 'start=2048, type=83, bootable' | sfdisk -q "$DISK"
nice -n 10 mke2fs -q -F -t ext4 -L realos-root -E offset=$((2048 * 512)) -d "$ROOT" "$DISK" $((SIZE_MIB - 1))M
rm -rf "$ROOT"

stamp "first boot: grub-install /dev/vda, update-grub, power off"
timeout 900 nice -n 10 qemu-system-x86_64 -accel tcg -m 2048 -smp 1 -display none -no-reboot \
  -drive file="$DISK",format=raw,if=virtio -nic none -serial file:"$WORK/firstboot.log" \
  -kernel "$WORK/vmlinuz-$KVER" -initrd "$WORK/initrd.img-$KVER" \
  -append "root=/dev/vda1 ro console=ttyS0"
grep -q 'realos-firstboot: done' "$WORK/firstboot.log" || { tail -n 60 "$WORK/firstboot.log"; stamp "first boot failed"; exit 1; }
cp "$WORK/firstboot.log" "$OUT/firstboot.log"
mv "$DISK" "$OUT/disk.raw"
stamp "done: $OUT/disk.raw (kernel $KVER)"
