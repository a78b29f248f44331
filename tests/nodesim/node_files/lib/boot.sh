# What happens when a simulated node boots (run by the reboot shims, and by the host at creation).
. /opt/nodesim/lib/common.sh
. /opt/nodesim/lib/units.sh

[ -s "$NS/next-kernel" ] && mv "$NS/next-kernel" "$NS/kernel"
K=$(ns_kernel)
mkdir -p /proc/sys/kernel/random
ns_uuid > /proc/sys/kernel/random/boot_id
echo $(( $(cat "$NS/boots" 2>/dev/null || echo 0) + 1 )) > "$NS/boots"

# Machine-owner keys queued with `mokutil --import` are enrolled by the operator in MokManager at boot.
if [ -d "$NS/mok/pending" ]; then
    mkdir -p "$NS/mok/enrolled"
    for _k in "$NS"/mok/pending/*; do [ -e "$_k" ] && mv "$_k" "$NS/mok/enrolled/"; done
fi

# DKMS builds for the booted kernel at boot only where dkms.service (`dkms autoinstall`) is enabled; otherwise
# what the kernel's postinst hook built when it was installed is all there is (see ns_kernel_postinst_dkms).
if [ "$(ns_unit_get dkms.service ENABLED 2>/dev/null)" = enabled ]; then
    ns_dkms_build "$K" >/dev/null 2>&1 || true
fi

rm -f "$NS/loaded.env" "$NS/smi.persistence" "$NS/kmsg.clock"
# every process of the last boot is gone (SimNode.hold_gpu's real ones too)
for _bootp in $(cat "$NS/held.pids" 2>/dev/null); do kill "$_bootp" 2>/dev/null; done
rm -f "$NS/held.pids" "$NS/compute-apps"; rm -rf "$NS/daemons"
for _bootp in /proc/[0-9]*; do [ -d "$_bootp" ] && rm -rf "$_bootp"; done
# PID 1 is systemd, with the environment the kernel hands init (gpunode's probe reads it: packages.SHOW_CALL)
mkdir -p /proc/1 && printf 'HOME=/\0init=/sbin/init\0TERM=linux\0' > /proc/1/environ && echo systemd > /proc/1/comm
# power-on: no unit runs yet; systemd loads the unit files afresh (udev rules may start units as modules load)
for _bootf in "$NS"/units/*; do [ -f "$_bootf" ] && ns_unit_set "${_bootf##*/}" ACTIVE inactive; done
ns_units_reload
# /dev is a fresh devtmpfs: the /dev/char links to NVIDIA devices are gone (a udev rule may re-create them)
for _bootl in /dev/char/*; do [ -L "$_bootl" ] && rm -f "$_bootl"; done
printf '[    0.000000] Linux version %s (buildd@lcy02-amd64) (%s) %s\n' "$K" "$GCC_VERSION" "$KERNEL_BUILD" > "$NS/dmesg"
printf '[    0.000000] Command line: %s\n' "$(cat /proc/cmdline)" >> "$NS/dmesg"
ns_write_modules $(cat "$NS/base-modules" 2>/dev/null)

if ns_has_gpu; then
    if ns_driver_installed; then
        if ns_driver_built_for "$K" && ns_load_module nvidia 2>/dev/null; then
            for _bootm in nvidia_modeset nvidia_drm nvidia_uvm; do ns_load_module "$_bootm" 2>/dev/null; done
        fi
    elif ! { ns_blocked_in_modprobe_d nouveau && ns_blocked_in_initramfs nouveau "$K"; } && ! ns_blocked_on_cmdline nouveau; then
        ns_load_module nouveau 2>/dev/null
    fi
fi

# units: enabled ones start (those udev started already run)
if [ -d "$NS/units" ]; then
    for _bootf in "$NS"/units/*; do
        [ -f "$_bootf" ] || continue
        _bootu=${_bootf##*/}
        if [ "$(sed -n 's/^ENABLED=//p' "$_bootf")" = enabled ] && ! ns_unit_active "$_bootu"; then
            ns_unit_start "$_bootu" || true
        fi
    done
fi
rm -f "$NS/apt.lock"
:
