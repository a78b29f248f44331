# Sourced by every simulator shim inside a node (POSIX sh, run by dash).  State lives in plain files:
#   /var/lib/nodesim/*      simulator state (see README in tests/nodesim)
#   /proc/*, /sys/*         plain files kept consistent with that state (the chroot has no procfs/sysfs)
NS=/var/lib/nodesim
NSLIB=/opt/nodesim/lib
NSDATA=/opt/nodesim/data
NSSHIMS=/opt/nodesim/shims
NSPY=/opt/nodesim/python/bin/python3
EFIVAR_SB=/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c
. "$NS/profile.env"

# ---- call log -------------------------------------------------------------------------------------------
# One record per invocation: fields separated by \037, record ended by \036 (arguments may hold newlines).
ns_log() {
    [ -n "$NODESIM_NOLOG" ] && return 0
    { printf '%s' "$1"; shift; for _a in "$@"; do printf '\037%s' "$_a"; done; printf '\036'; } >> "$NS/calls.log"
}

ns_err() { printf '%s\n' "$*" >&2; }

# ---- process cost -----------------------------------------------------------------------------------------
# A real tool answers in one process. The shims on the paths the probe and the benchmarks take (systemctl show
# and is-*, modinfo, nvidia-smi, dpkg-query -W, uname, nvidia-ctk --version) use the shell's own read, case and
# parameter expansion instead of $(...), pipes, sed, tr or awk per item, and exec their one helper (awk,
# python) last; the helpers below set variables instead of printing, so a caller needs no $(...) (a fork).
ns_tr() {  # ns_tr WORD FROM TO : NSR = WORD with every character FROM replaced by TO
    NSR=; _trw=$1
    while :; do
        case $_trw in
            *"$2"*) NSR=$NSR${_trw%%"$2"*}$3; _trw=${_trw#*"$2"} ;;
            *) NSR=$NSR$_trw; return 0 ;;
        esac
    done
}
ns_read() {  # ns_read FILE : NSR = its first line (empty when it cannot be read), as $(head -n 1 FILE) says
    NSR=
    { IFS= read -r NSR || :; } 2>/dev/null < "$1"
}
ns_kmsg() {  # append a line to the simulated kernel log, dmesg style
    _up=$(cat "$NS/kmsg.clock" 2>/dev/null || echo 3)
    _up=$((_up + 1)); echo "$_up" > "$NS/kmsg.clock"
    printf '[%5d.%06d] %s\n' "$_up" $(( (_up * 7919) % 1000000 )) "$*" >> "$NS/dmesg"
}

# ---- small helpers ----------------------------------------------------------------------------------------
ns_kernel() { ns_read "$NS/kernel"; echo "$NSR"; }
ns_has_gpu() { [ -s "$NS/gpus" ]; }
ns_uuid() {  # random version-4 UUID, newline-terminated like /proc/sys/kernel/random/boot_id
    od -An -tx1 -N16 /dev/urandom | tr -d ' \n' |
        sed 's/^\(........\)\(....\).\(...\).\(...\)\(............\)$/\1-\2-4\3-a\4-\5/'
    echo
}
ns_py() {  # ns_py [--exec] SCRIPT ARGS... : the private interpreter (not on PATH) running /opt/nodesim/py/SCRIPT.py
    _px=; [ "$1" != --exec ] || { _px=exec; shift; }  # --exec: it replaces the shell (a shim's last command)
    _s=$1; shift
    PYTHONHOME=/opt/nodesim/python PYTHONDONTWRITEBYTECODE=1 PYTHONPATH= $_px "$NSPY" -S -B "/opt/nodesim/py/$_s.py" "$@"
}
ns_branch() { echo "${1%%.*}"; }
ns_cuda_for() { ns_cuda "$1"; echo "$NSR"; }  # driver version -> highest CUDA version
ns_cuda() {  # ns_cuda DRIVER_VERSION : NSR = the highest CUDA version of its branch (lib/cuda.tab, ascending)
    NSR=; _cb=${1%%.*}
    while read -r _cfb _cfv; do [ "$_cfb" -le "$_cb" ] 2>/dev/null && NSR=$_cfv; done < "$NSLIB/cuda.tab"
}
ns_ver_ge() {  # ns_ver_ge A B : A >= B (dotted numeric)
    [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | tail -n1)" = "$1" ]
}

# ---- secure boot / MOK -------------------------------------------------------------------------------------
ns_efi() { [ -d /sys/firmware/efi ]; }
ns_sb_enabled() {
    [ -r "$EFIVAR_SB" ] || return 1
    _sbv=$(od -An -tu1 -j4 -N1 "$EFIVAR_SB")  # "   1": the byte after the 4 attribute bytes
    [ "${_sbv##* }" = 1 ]
}
ns_key_id() { sha256sum "$1" | cut -c1-16; }
ns_key_trusted() {  # ns_key_trusted KEYID : modules signed with it load under Secure Boot
    case "$1" in
        distro) return 0 ;;
        ""|none) return 1 ;;
    esac
    [ -e "$NS/mok/enrolled/$1" ]
}

# ---- driver state -----------------------------------------------------------------------------------------
ns_driver_load_env() {
    DRIVER_VERSION=; DRIVER_FLAVOR=; DRIVER_METHOD=; DRIVER_PKG=; DRIVER_DKMS=0; DRIVER_KERNELS=; DRIVER_SIGNKEY=none
    DRIVER_DKMS_NAME=nvidia
    [ -r "$NS/driver.env" ] && . "$NS/driver.env"
    :
}
# The .ko file of a module name (nvidia, nvidia_uvm, nvidia-uvm): nvidia-uvm.ko, or under Debian's packaged driver
# (DRIVER_DKMS_NAME=nvidia-current) nvidia-current-uvm.ko; the kernel still calls it nvidia_uvm (modinfo -F name).
ns_driver_file() { ns_driver_file_v "$1"; echo "$NSR"; }
ns_driver_file_v() {  # NAME : NSR = ns_driver_file's answer
    ns_tr "$1" _ -
    case $NSR in nvidia*) NSR=$DRIVER_DKMS_NAME${NSR#nvidia} ;; esac
}
ns_driver_installed() { ns_driver_load_env; [ -n "$DRIVER_VERSION" ]; }
ns_driver_write_env() {
    cat > "$NS/driver.env" <<EOF
DRIVER_VERSION='$DRIVER_VERSION'
DRIVER_FLAVOR='$DRIVER_FLAVOR'
DRIVER_METHOD='$DRIVER_METHOD'
DRIVER_PKG='$DRIVER_PKG'
DRIVER_DKMS='$DRIVER_DKMS'
DRIVER_KERNELS='$DRIVER_KERNELS'
DRIVER_SIGNKEY='$DRIVER_SIGNKEY'
DRIVER_DKMS_NAME='$DRIVER_DKMS_NAME'
EOF
}
ns_driver_built_for() {  # ns_driver_built_for KVER
    ns_driver_load_env
    case " $DRIVER_KERNELS " in *" $1 "*) return 0 ;; esac
    return 1
}
ns_headers_present() { [ -d "/lib/modules/${1:-$(ns_kernel)}/build" ]; }

# ---- installed kernels and DKMS ------------------------------------------------------------------------------
# Real DKMS builds a registered module for a kernel when that kernel's PACKAGE is installed (the hook
# /etc/kernel/postinst.d/dkms; on Debian/Ubuntu also /etc/kernel/header_postinst.d/dkms when its headers arrive
# later), and at boot only where dkms.service runs `dkms autoinstall`. Without headers at that moment nothing is
# built, the kernel still installs, and a boot into it has no nvidia module.
ns_kernel_installed() { grep -qx "$1" "$NS/kernels" 2>/dev/null; }
ns_dkms_build() {  # KVER : build the registered nvidia module for KVER (dkms's own messages); 1 without headers
    ns_driver_load_env
    { [ -n "$DRIVER_VERSION" ] && [ "$DRIVER_DKMS" = 1 ]; } || return 0
    ns_driver_built_for "$1" && return 0
    if ! ns_headers_present "$1"; then
        echo "Error! Your kernel headers for kernel $1 cannot be found."
        if [ "$FAMILY" = rhel ]; then echo "Please install the kernel-devel-$1 package,"
        else echo "Please install the linux-headers-$1 package,"; fi
        echo "or use the --kernelsourcedir option to tell DKMS where it's located"
        return 1
    fi
    if grep -qxF "$1" "$NS/dkms-fails" 2>/dev/null; then  # the driver's sources do not compile for this kernel
        _db=/var/lib/dkms/$DRIVER_DKMS_NAME/$DRIVER_VERSION/build
        mkdir -p "$_db"
        # DKMS's make.log (its real first line; the compiler's error as Debian 12's open 535.261.03 gave it on 6.1.0-56)
        printf 'DKMS make.log for %s-%s for kernel %s (x86_64)\n%s\nmake -C /lib/modules/%s/build M=%s modules\n' \
            "$DRIVER_DKMS_NAME" "$DRIVER_VERSION" "$1" "$(date)" "$1" "$_db" > "$_db/make.log"
        printf "%s/nvidia/nv-pci.c:223:9: error: too few arguments to function \342\200\230pci_resize_resource\342\200\231\n" \
            "$_db" >> "$_db/make.log"
        printf '\nBuilding module:\nCleaning build area...\n'
        printf 'env NV_VERBOSE=1 make -j2 modules KERNEL_UNAME=%s....(bad exit status: 2)\n' "$1"
        printf 'Error! Bad return status for module build on kernel: %s (x86_64)\n' "$1"
        printf 'Consult %s/make.log for more information.\n' "$_db"
        return 10
    fi
    DRIVER_KERNELS="${DRIVER_KERNELS:+$DRIVER_KERNELS }$1"
    ns_driver_write_env
    _dk=/lib/modules/$1/updates/dkms
    mkdir -p "$_dk" "/var/lib/dkms/$DRIVER_DKMS_NAME/$DRIVER_VERSION/$1/x86_64/module"
    for _dm in nvidia nvidia-uvm nvidia-modeset nvidia-drm nvidia-peermem; do : > "$_dk/$(ns_driver_file $_dm).ko"; done
    printf '\nBuilding module:\ncleaning build area...\n'
    printf "'make' -j2 NV_EXCLUDE_BUILD_MODULES='' KERNEL_UNAME=%s modules....\n" "$1"
    printf 'cleaning build area...\n\n%s.ko:\nRunning module version sanity check.\n - Original module\n' "$DRIVER_DKMS_NAME"
    printf '   - No original module exists within this kernel\n - Installation\n   - Installing to %s/\n' "$_dk"
    printf '\ndepmod...\n\nDKMS: install completed.\n'
    return 0
}
ns_kernel_postinst_dkms() {  # KVER [header] : the kernel (or header) postinst hook of the dkms package
    [ -e /usr/sbin/dkms ] || [ -e /usr/bin/dkms ] || return 0
    ns_kernel_installed "$1" || return 0
    ns_driver_load_env
    { [ -n "$DRIVER_VERSION" ] && [ "$DRIVER_DKMS" = 1 ]; } || return 0
    ns_driver_built_for "$1" && return 0
    if [ "$2" = header ]; then echo "/etc/kernel/header_postinst.d/dkms:"; else echo "/etc/kernel/postinst.d/dkms:"; fi
    echo " * dkms: running auto installation service for kernel $1"
    if ! _pd=$(ns_dkms_build "$1" 2>&1); then
        printf '%s\n' "$_pd"
        if grep -qxF "$1" "$NS/dkms-fails" 2>/dev/null; then
            # a build that fails with the headers there fails the hook, and dpkg's configure of the package (real on
            # Debian 12, dkms 3.0.10: run-parts exit 11, the headers left half-configured; tests/realos)
            echo "Error! One or more modules failed to install during autoinstall."
            echo "Refer to previous errors for more information."
            echo "dkms: autoinstall for kernel: $1 failed!"
            if [ "$2" = header ]; then _ph=header_postinst.d; else _ph=postinst.d; fi
            echo "run-parts: /etc/kernel/$_ph/dkms exited with return code 11"
            return 1
        fi
    fi
    echo "   ...done."
    return 0  # missing headers: DKMS skips the build and the kernel's installation goes on
}
ns_kernel_add() {  # KVER : a kernel image was installed; the boot loader's default becomes the newest kernel
    mkdir -p "/lib/modules/$1/kernel/drivers/gpu/drm/nouveau" /boot
    : > "/lib/modules/$1/kernel/drivers/gpu/drm/nouveau/nouveau.ko"
    [ -e "/boot/vmlinuz-$1" ] || echo kernel > "/boot/vmlinuz-$1"
    ns_kernel_installed "$1" || echo "$1" >> "$NS/kernels"
    _kn=$(sort -V "$NS/kernels" | tail -n 1)
    if [ "$_kn" != "$(ns_kernel)" ]; then echo "$_kn" > "$NS/next-kernel"; fi
    :
}

# Why the nvidia module would not bind right now: prints ok | notfound | nodevice | keyrejected
ns_nvidia_probe() {
    ns_driver_load_env
    ns_read "$NS/kernel"
    if [ -z "$DRIVER_VERSION" ] || ! ns_driver_built_for "$NSR"; then echo notfound; return; fi
    if ns_sb_enabled && ! ns_key_trusted "$DRIVER_SIGNKEY"; then echo keyrejected; return; fi
    if ! ns_has_gpu; then echo nodevice; return; fi
    if ns_loaded nouveau; then echo nodevice; return; fi
    _br=$(ns_branch "$DRIVER_VERSION")
    if awk -F'\t' -v br="$_br" -v fl="$DRIVER_FLAVOR" '
        ($16 + 0) > br { bad = 1 }
        $17 == "1" && fl != "open" { bad = 1 }
        END { exit bad ? 0 : 1 }' "$NS/gpus"; then
        echo nodevice; return
    fi
    echo ok
}

# ---- kernel modules -----------------------------------------------------------------------------------------
ns_loaded() {  # the first field of a /proc/modules line
    [ -r /proc/modules ] || return 1
    while read -r _ldn _ldr; do [ "$_ldn" = "$1" ] && return 0; done < /proc/modules
    return 1
}
ns_loaded_list() { [ -r /proc/modules ] && awk '{ print $1 }' /proc/modules; }
ns_module_known() {  # does a .ko exist for the running kernel?
    case "$1" in
        nvidia|nvidia_uvm|nvidia_modeset|nvidia_drm|nvidia_peermem|nvidia-uvm|nvidia-modeset|nvidia-drm)
            ns_read "$NS/kernel"; ns_driver_built_for "$NSR" || return 1
            # Debian's renamed files (nvidia-current*.ko) answer to these names only through the `install` lines
            # of its modprobe configuration, linked by the glx alternative (libcuda1 or the GL libraries): the
            # real-OS tier's compute-only set says "Module nvidia not found" although DKMS built it
            ns_driver_load_env
            [ "$DRIVER_DKMS_NAME" != nvidia-current ] || ns_debian_modprobe_linked "$1" ;;
        *) awk -v m="$1" '$1 == m { f = 1 } END { exit f ? 0 : 1 }' "$NSLIB/modules.tab" ;;
    esac
}
ns_debian_modprobe_linked() {  # NAME: does a modprobe.d file redirect it (`install nvidia-uvm ...`)?
    _dn=$(echo "$1" | tr _ -)
    cat /etc/modprobe.d/*.conf /lib/modprobe.d/*.conf 2>/dev/null | grep -q "^install $_dn "
}
ns_module_deps() { awk -v m="$1" '$1 == m { if ($3 != "-") { gsub(",", " ", $3); print $3 } }' "$NSLIB/modules.tab"; }

# Rewrite /proc/modules from a list of names (most recently loaded first), then the derived files.
ns_write_modules() {
    ns_driver_load_env
    _taint="(OE)"
    [ "$DRIVER_FLAVOR" = proprietary ] && _taint="(POE)"
    printf '%s\n' "$@" | awk -v taint="$_taint" -v tab="$NSLIB/modules.tab" '
        BEGIN { while ((getline l < tab) > 0) { split(l, f, " "); size[f[1]] = f[2]; deps[f[1]] = f[3]; kind[f[1]] = f[4] } }
        NF { if (!($1 in seen)) { seen[$1] = 1; order[++n] = $1 } }
        END {
            for (i = 1; i <= n; i++) { users[order[i]] = ""; cnt[order[i]] = 0 }
            for (i = n; i >= 1; i--) {
                m = order[i]
                if (deps[m] == "-" || deps[m] == "") continue
                k = split(deps[m], d, ",")
                for (j = 1; j <= k; j++) if (d[j] in seen) { users[d[j]] = users[d[j]] m ","; cnt[d[j]]++ }
            }
            for (i = 1; i <= n; i++) {
                m = order[i]; u = users[m]; if (u == "") u = "-"
                c = cnt[m]; if (m == "nouveau" && c == 0) c = 1
                t = (kind[m] == "nvidia") ? " " taint : ""
                printf "%s %s %d %s Live 0x0000000000000000%s\n", m, (m in size ? size[m] : 16384), c, u, t
            }
        }' > /proc/modules.new
    mv /proc/modules.new /proc/modules
    ns_sync_derived
}

# A module and its dependencies, dependencies first.
ns_module_closure() {
    awk -v m="$1" '
        function visit(x,   n, i, d) {
            if (x in seen) return
            seen[x] = 1
            if (deps[x] != "-" && deps[x] != "") { n = split(deps[x], d, ","); for (i = 1; i <= n; i++) visit(d[i]) }
            print x
        }
        { deps[$1] = $3 }
        END { visit(m) }' "$NSLIB/modules.tab"
}

# Load one module (and its dependencies).  Prints a modprobe-style error and returns 1 on failure.
# (No recursion: shell functions share variables.)
ns_load_module() {
    _lm=$(echo "$1" | tr - _)
    ns_loaded "$_lm" && return 0
    if ! ns_module_known "$_lm"; then
        ns_err "modprobe: FATAL: Module $1 not found in directory /lib/modules/$(ns_kernel)"
        return 1
    fi
    _new=
    for _x in $(ns_module_closure "$_lm"); do
        ns_loaded "$_x" && continue
        if ! ns_module_known "$_x"; then
            ns_err "modprobe: FATAL: Module $_x not found in directory /lib/modules/$(ns_kernel)"
            return 1
        fi
        if [ "$_x" = nvidia ]; then
            case "$(ns_nvidia_probe)" in
                keyrejected)
                    ns_kmsg "Loading of unsigned module is rejected"
                    ns_err "modprobe: ERROR: could not insert 'nvidia': Key was rejected by service"; return 1 ;;
                nodevice)
                    if ns_loaded nouveau; then sed 's/^\[[^]]*\] //' "$NSDATA/errors/dmesg_nvrm-no-adapter-probed_nouveau-conflict.txt" | while IFS= read -r _l; do ns_kmsg "$_l"; done
                    else
                        # as the real module logs it (real-OS tier, tests/fixtures/real/debian-nvidia)
                        ns_kmsg "nvidia-nvlink: Nvlink Core is being initialized, major device number 245"
                        ns_kmsg "NVRM: No NVIDIA GPU found."
                        ns_kmsg "nvidia-nvlink: Unregistered Nvlink Core, major device number 245"
                    fi
                    if [ "$DRIVER_DKMS_NAME" = nvidia-current ]; then
                        # kmod around Debian's install hook (install nvidia modprobe -i nvidia-current)
                        ns_err "modprobe: ERROR: could not insert 'nvidia_current': No such device"
                        ns_err "modprobe: ERROR: ../libkmod/libkmod-module.c:1047 command_do() Error running install command 'modprobe -i nvidia-current ' for module nvidia: retcode 1"
                        ns_err "modprobe: ERROR: could not insert 'nvidia': Invalid argument"
                    else
                        ns_err "modprobe: ERROR: could not insert 'nvidia': No such device"
                    fi
                    return 1 ;;
                notfound) ns_err "modprobe: FATAL: Module nvidia not found in directory /lib/modules/$(ns_kernel)"; return 1 ;;
            esac
            ns_driver_load_env
            printf 'LOADED_VERSION=%s\nLOADED_FLAVOR=%s\n' "$DRIVER_VERSION" "$DRIVER_FLAVOR" > "$NS/loaded.env"
            ns_kmsg "nvidia: loading out-of-tree module taints kernel."
            if [ "$DRIVER_FLAVOR" = open ]; then
                ns_kmsg "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  $DRIVER_VERSION  Release Build  (dvs-builder@U16-I3-B03-4-3)  Thu Oct 19 18:56:32 UTC 2023"
            else
                ns_kmsg "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  $DRIVER_VERSION  Thu Oct 19 18:56:32 UTC 2023"
            fi
        fi
        [ "$_x" = nouveau ] && ns_has_gpu && ns_kmsg "nouveau 0000:$(awk -F'\t' 'NR == 1 { sub(/^0000:/, "", $2); print $2 }' "$NS/gpus"): DRM: VRAM: $(awk -F'\t' 'NR == 1 { print $5 }' "$NS/gpus") MiB"
        _new="$_x $_new"
    done
    ns_write_modules $_new $(ns_loaded_list)
    case " $_new " in *" nvidia "*) ns_udev_event add /module/nvidia module; ns_udev_event add /bus/pci/drivers/nvidia drivers ;; esac
    :
}

ns_module_users() { awk -v m="$1" '$1 == m { if ($4 != "-") { gsub(",", " ", $4); print $4 } }' /proc/modules; }
ns_module_busy() {  # held by something other than a module?
    case "$1" in
        nouveau) [ "$NOUVEAU_BUSY" = 1 ] ;;
        # an open /dev/nvidia* file holds the module (a daemon's, or a process from SimNode.hold_gpu)
        nvidia) ns_unit_active nvidia-persistenced.service || ns_unit_active nvidia-fabricmanager.service ||
                ns_dev_open '/dev/nvidiactl' '/dev/nvidia[0-9]*' ;;
        nvidia_uvm) ns_dev_open '/dev/nvidia-uvm*' ;;
        nvidia_modeset) ns_dev_open '/dev/nvidia-modeset' ;;
        # DRM clients (a display server, the framebuffer console: SimNode.set_drm_clients) hold nvidia_drm
        nvidia_drm) [ "$(cat "$NS/drm-clients" 2>/dev/null || echo 0)" -gt 0 ] ;;
        *) return 1 ;;
    esac
}

# ---- processes: /proc in the node is plain files, so a process holding a GPU is a /proc/PID directory with
# comm, cmdline, cgroup and fd/N symlinks (what gpunode reads), made for GPU daemons while their unit is active
# and by SimNode.hold_gpu (a real sleeping process with /dev/nvidia0 open, whose PID the directory carries)
ns_dev_open() {  # ns_dev_open PATTERN... : does any process have a matching file open?
    for _dol in /proc/[0-9]*/fd/*; do
        [ -L "$_dol" ] || continue
        _dot=$(readlink "$_dol")
        for _dop; do case "$_dot" in $_dop) return 0 ;; esac; done
    done
    return 1
}
ns_next_pid() {
    _np=$(cat "$NS/lastpid" 2>/dev/null || echo 1200)
    while :; do _np=$((_np + 7)); [ -e "/proc/$_np" ] || break; done
    echo "$_np" > "$NS/lastpid"; echo "$_np"
}
ns_proc_create() {  # ns_proc_create PID COMM EXE CGROUP DEVICE...
    _pp=/proc/$1; mkdir -p "$_pp/fd"
    printf '%.15s\n' "$2" > "$_pp/comm"; printf '%s\0' "$3" > "$_pp/cmdline"; printf '0::%s\n' "$4" > "$_pp/cgroup"
    ln -sf /dev/null "$_pp/fd/0"
    shift 4; _pfd=3
    for _pd; do ln -sf "$_pd" "$_pp/fd/$_pfd"; _pfd=$((_pfd + 1)); done
}
ns_daemon_info() {  # UNIT -> "COMM EXE" of the GPU daemons that keep /dev/nvidiactl and /dev/nvidiaN open
    case "$1" in
        nvidia-persistenced.service) echo "nvidia-persistenced /usr/bin/nvidia-persistenced" ;;
        nvidia-fabricmanager.service) echo "nv-fabricmanager /usr/bin/nv-fabricmanager" ;;
        nvidia-dcgm.service|dcgm.service) echo "nv-hostengine /usr/bin/nv-hostengine" ;;
        *) return 1 ;;
    esac
}
ns_daemon_sync() {  # ns_daemon_sync UNIT : its daemon's /proc entry exists exactly while the unit is active
    _dsi=$(ns_daemon_info "$1") || return 0
    _dsp=$(cat "$NS/daemons/$1" 2>/dev/null)
    if [ "$(ns_unit_get "$1" ACTIVE)" = active ]; then
        [ -n "$_dsp" ] && [ -d "/proc/$_dsp" ] && return 0
        _dsp=$(ns_next_pid); mkdir -p "$NS/daemons"; echo "$_dsp" > "$NS/daemons/$1"
        _dsd=/dev/nvidiactl; _dsn=0
        while [ "$_dsn" -lt "$(grep -c . "$NS/gpus" 2>/dev/null)" ]; do _dsd="$_dsd /dev/nvidia$_dsn"; _dsn=$((_dsn + 1)); done
        ns_proc_create "$_dsp" "${_dsi%% *}" "${_dsi#* }" "/system.slice/$1" $_dsd
    else
        [ -n "$_dsp" ] && rm -rf "/proc/$_dsp"
        rm -f "$NS/daemons/$1"
    fi
    return 0
}

# Unload one module.  $2 = "rmmod" or "modprobe" selects the error wording.
ns_unload_module() {
    _m=$(echo "$1" | tr - _)
    _how=${2:-modprobe}
    if ! ns_loaded "$_m"; then
        if [ "$_how" = rmmod ]; then ns_err "rmmod: ERROR: Module $_m is not currently loaded"; return 1; fi
        return 0
    fi
    if [ -n "$(ns_module_users "$_m")" ] || ns_module_busy "$_m"; then
        if [ "$_how" = rmmod ]; then
            _users=$(ns_module_users "$_m" | tr ' ' ',' | sed 's/,$//')
            ns_err "rmmod: ERROR: Module $_m is in use${_users:+ by: $_users}"
        else ns_err "modprobe: FATAL: Module $_m is in use."; fi
        return 1
    fi
    ns_write_modules $(ns_loaded_list | grep -vx "$_m")
    [ "$_m" = nvidia ] && rm -f "$NS/loaded.env"
    return 0
}

# ---- derived /proc, /sys and /dev files ------------------------------------------------------------------
ns_version_file() {  # contents of /proc/driver/nvidia/version for LOADED_VERSION/LOADED_FLAVOR
    if [ "$LOADED_FLAVOR" = open ]; then
        printf 'NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  %s  Release Build  (dvs-builder@U16-I3-B03-4-3)  Thu Oct 19 18:56:32 UTC 2023\n' "$LOADED_VERSION"
    else
        printf 'NVRM version: NVIDIA UNIX x86_64 Kernel Module  %s  Thu Oct 19 18:56:32 UTC 2023\n' "$LOADED_VERSION"
    fi
    printf 'GCC version:  %s\n' "$GCC_VERSION"
}

ns_sync_derived() {
    LOADED_VERSION=; LOADED_FLAVOR=
    [ -r "$NS/loaded.env" ] && . "$NS/loaded.env"
    for _m in nouveau nvidia nvidia_uvm nvidia_modeset nvidia_drm nvidia_peermem; do
        if ns_loaded "$_m"; then
            mkdir -p "/sys/module/$_m/holders"
            # refcnt: the modules using it (each is also a holders/ entry), plus DRM clients for nvidia_drm
            rm -f "/sys/module/$_m/holders/"*; _rc=0; for _h in $(ns_module_users "$_m"); do _rc=$((_rc + 1)); : > "/sys/module/$_m/holders/$_h"; done
            [ "$_m" = nvidia_drm ] && _rc=$((_rc + $(cat "$NS/drm-clients" 2>/dev/null || echo 0)))
            echo "$_rc" > "/sys/module/$_m/refcnt"
        else
            rm -rf "/sys/module/$_m"
        fi
    done
    _bind=
    if ns_loaded nvidia && [ -n "$LOADED_VERSION" ]; then
        _bind=nvidia
        mkdir -p /proc/driver/nvidia/gpus /sys/bus/pci/drivers/nvidia
        ns_version_file > /proc/driver/nvidia/version
        echo "$LOADED_VERSION" > /sys/module/nvidia/version
        : > /dev/nvidiactl
        rm -rf /proc/driver/nvidia/gpus/*
        _i=0
        while IFS='	' read -r _idx _bus _dev _name _rest; do
            mkdir -p "/proc/driver/nvidia/gpus/$_bus"
            printf 'Model: \t\t %s\nIRQ:   \t\t 0\nGPU UUID: \t %s\nBus Location: \t %s\n' \
                "$_name" "$(awk -F'\t' -v b="$_bus" '$2 == b { print $18 }' "$NS/gpus")" "$_bus" \
                > "/proc/driver/nvidia/gpus/$_bus/information"
            : > "/dev/nvidia$_i"
            _i=$((_i + 1))
        done < "$NS/gpus"
        if ns_loaded nvidia_uvm; then : > /dev/nvidia-uvm; : > /dev/nvidia-uvm-tools; else rm -f /dev/nvidia-uvm /dev/nvidia-uvm-tools; fi
        if ns_loaded nvidia_modeset; then : > /dev/nvidia-modeset; else rm -f /dev/nvidia-modeset; fi
        if [ -s "$NS/switches" ]; then
            mkdir -p /proc/driver/nvidia-nvswitch/devices /sys/bus/pci/drivers/nvidia-nvswitch
            rm -f /proc/driver/nvidia-nvswitch/devices/*
            _i=0
            while IFS='	' read -r _bus _dev; do
                printf 'Device Instance: %d\nPCI Address: %s\n' "$_i" "$_bus" > "/proc/driver/nvidia-nvswitch/devices/$_bus"
                : > "/dev/nvidia-nvswitch$_i"
                ln -sfn /sys/bus/pci/drivers/nvidia-nvswitch "/sys/bus/pci/devices/$_bus/driver"
                _i=$((_i + 1))
            done < "$NS/switches"
            : > /dev/nvidia-nvswitchctl
        fi
    else
        rm -rf /proc/driver/nvidia /proc/driver/nvidia-nvswitch /sys/bus/pci/drivers/nvidia /sys/bus/pci/drivers/nvidia-nvswitch
        rm -f /dev/nvidia*
        if [ -s "$NS/switches" ]; then
            while IFS='	' read -r _bus _dev; do rm -f "/sys/bus/pci/devices/$_bus/driver"; done < "$NS/switches"
        fi
    fi
    if [ -z "$_bind" ] && ns_loaded nouveau && ns_has_gpu; then
        _bind=nouveau
        mkdir -p /sys/bus/pci/drivers/nouveau
    fi
    ns_loaded nouveau || rm -rf /sys/bus/pci/drivers/nouveau
    if ns_has_gpu; then
        while IFS='	' read -r _idx _bus _rest; do
            if [ -n "$_bind" ]; then
                ln -sfn "/sys/bus/pci/drivers/$_bind" "/sys/bus/pci/devices/$_bus/driver"
            else
                rm -f "/sys/bus/pci/devices/$_bus/driver"
            fi
        done < "$NS/gpus"
    fi
}

# ---- modprobe configuration (what blocks nouveau) ---------------------------------------------------------
ns_modprobe_conf_files() {
    for _d in /etc/modprobe.d /run/modprobe.d /usr/local/lib/modprobe.d /usr/lib/modprobe.d; do
        for _f in "$_d"/*.conf; do [ -f "$_f" ] && echo "$_f"; done
    done
    [ -f /etc/modprobe.conf ] && echo /etc/modprobe.conf
    :
}
# Lines that keep a module from being autoloaded (blacklist / install ... /bin/false) or, for dracut,
# omit_drivers; printed in a canonical form for snapshots.
ns_blacklist_lines() {
    ns_modprobe_conf_files | while read -r _f; do
        sed -e 's/#.*//' -e 's/^[ 	]*//' "$_f" | awk '
            $1 == "blacklist" && NF >= 2 { print "blacklist " $2 }
            $1 == "install" && NF >= 3 && ($3 == "/bin/false" || $3 == "/bin/true" || $3 == "/usr/bin/false" || $3 == "/usr/bin/true") { print "blacklist " $2 }'
    done
    for _f in /etc/dracut.conf /etc/dracut.conf.d/*.conf; do
        [ -f "$_f" ] || continue
        sed -n 's/^[ 	]*omit_drivers+\{0,1\}=["'"'"']\(.*\)["'"'"'].*/\1/p' "$_f" | tr ' ' '\n' | sed -n 's/^\(..*\)$/omit \1/p'
    done
}
ns_blocked_in_modprobe_d() { ns_blacklist_lines | grep -qx "blacklist $1"; }
ns_blocked_in_initramfs() {  # ns_blocked_in_initramfs MOD KVER
    _snap="$NS/initramfs/$2"
    [ -f "$_snap" ] || return 1
    grep -qx "blacklist $1" "$_snap" || grep -qx "omit $1" "$_snap"
}
ns_blocked_on_cmdline() {
    tr ' ' '\n' < /proc/cmdline | grep -Eq "^(modprobe\.blacklist|rd\.driver\.blacklist|module_blacklist)=(.*,)?$1(,.*)?$"
}
ns_snapshot_initramfs() {  # record what an initramfs built now for KVER would contain
    mkdir -p "$NS/initramfs"
    ns_blacklist_lines | sort -u > "$NS/initramfs/$1"
}

# ---- systemd units ------------------------------------------------------------------------------------------
# $NS/units/UNIT holds the lines ACTIVE=, ENABLED=, DESC= (a unit without the file is not loaded).
ns_unit_norm() {  # UNIT : NSU = its full name (a bare name is a .service)
    case "$1" in *.service|*.socket|*.target|*.timer|*.path|*.mount) NSU=$1 ;; *) NSU=$1.service ;; esac
}
ns_unit_read() {  # UNIT : NSU, NSU_ACTIVE, NSU_ENABLED, NSU_DESC from its state; 1 (inactive, not-found) without
    ns_unit_norm "$1"; NSU_ACTIVE=; NSU_ENABLED=; NSU_DESC=
    if [ ! -f "$NS/units/$NSU" ]; then NSU_ACTIVE=inactive; NSU_ENABLED=not-found; return 1; fi
    while IFS= read -r _url || [ -n "$_url" ]; do
        case $_url in
            ACTIVE=*) NSU_ACTIVE=${_url#*=} ;; ENABLED=*) NSU_ENABLED=${_url#*=} ;; DESC=*) NSU_DESC=${_url#*=} ;;
        esac
    done < "$NS/units/$NSU"
    return 0
}
ns_unit_name() { ns_unit_norm "$1"; echo "$NSU"; }
ns_unit_exists() { ns_unit_norm "$1"; [ -f "$NS/units/$NSU" ]; }
ns_unit_get() {  # ns_unit_get UNIT ACTIVE|ENABLED|DESC
    ns_unit_read "$1"
    case "$2" in ACTIVE) echo "$NSU_ACTIVE" ;; ENABLED) echo "$NSU_ENABLED" ;; DESC) echo "$NSU_DESC" ;; esac
}
ns_unit_set() {  # ns_unit_set UNIT ACTIVE|ENABLED VALUE
    _u=$(ns_unit_name "$1")
    [ -f "$NS/units/$_u" ] || printf 'ACTIVE=inactive\nENABLED=disabled\nDESC=%s\n' "$_u" > "$NS/units/$_u"
    sed "s/^$2=.*/$2=$3/" "$NS/units/$_u" > "$NS/units/$_u.new" && mv "$NS/units/$_u.new" "$NS/units/$_u"
    [ "$2" != ACTIVE ] || ns_daemon_sync "$_u"
}
ns_unit_create() {  # ns_unit_create UNIT DESCRIPTION [ACTIVE] [ENABLED]
    _u=$(ns_unit_name "$1")
    mkdir -p "$NS/units"
    printf 'ACTIVE=%s\nENABLED=%s\nDESC=%s\n' "${3:-inactive}" "${4:-disabled}" "$2" > "$NS/units/$_u"
}
ns_unit_remove() { rm -f "$NS/units/$(ns_unit_name "$1")"; }
ns_unit_active() { ns_unit_read "$1"; [ "$NSU_ACTIVE" = active ]; }

# Unit files on disk (systemd's search path, the first directory wins).  A unit the simulator has no state for
# but whose file exists is known the way systemd knows it: disabled, or static without an [Install] section.
NS_UNIT_DIRS="/etc/systemd/system /run/systemd/system /usr/local/lib/systemd/system /usr/lib/systemd/system /lib/systemd/system"
ns_unit_file() { ns_unit_file_v "$1" && echo "$NSR"; }  # ns_unit_file UNIT : the unit file systemd would load
ns_unit_file_v() {  # UNIT : NSR = that file; 1 when there is none
    for _ufd in $NS_UNIT_DIRS; do [ -f "$_ufd/$1" ] && { NSR=$_ufd/$1; return 0; }; done
    NSR=; return 1
}
ns_unit_discover() {  # ns_unit_discover UNIT : state for a unit that exists only as a file
    ns_unit_norm "$1"; _dn=$NSU
    [ -f "$NS/units/$_dn" ] && return 0
    ns_unit_file_v "$_dn" || return 0
    _df=$NSR
    _desc=$(sed -n 's/^Description=//p' "$_df" | head -n 1)
    if grep -q '^\[Install\]' "$_df"; then _den=disabled; else _den=static; fi
    ns_unit_create "$_dn" "${_desc:-$_dn}" inactive "$_den"
    ns_unit_snapshot "$_dn"
}
ns_unit_execstart() {  # ns_unit_execstart UNIT : the ExecStart= in effect (unit file, then drop-ins in name order)
    _ef=$(ns_unit_file "$1") || return 0
    {
        echo "$_ef"
        for _ud in $NS_UNIT_DIRS; do
            for _eg in "$_ud/$1.d"/*.conf; do [ -f "$_eg" ] && echo "${_eg##*/} $_eg"; done
        done | awk '!seen[$1]++' | sort | cut -d' ' -f2-
    } | while read -r _eg; do cat "$_eg"; echo; done | awk '
        /^\[/ { sec = $0; next }
        sec == "[Service]" && /^ExecStart=/ { v = substr($0, 11) }
        END { print v }'
}
ns_unit_snapshot() {  # what systemd loaded at the last daemon-reload: the unit's ExecStart
    mkdir -p "$NS/unit-exec"
    if ns_unit_file "$1" >/dev/null; then ns_unit_execstart "$1" > "$NS/unit-exec/$1"; else rm -f "$NS/unit-exec/$1"; fi
}
ns_units_reload() {  # systemctl daemon-reload
    for _ud in $NS_UNIT_DIRS; do
        for _rf in "$_ud"/*.service; do [ -f "$_rf" ] && ns_unit_discover "${_rf##*/}"; done
    done
    for _rf in "$NS"/units/*; do [ -f "$_rf" ] && ns_unit_snapshot "${_rf##*/}"; done
    :
}
ns_unit_loaded_exec() { cat "$NS/unit-exec/$(ns_unit_name "$1")" 2>/dev/null; }

# ---- udev ---------------------------------------------------------------------------------------------------
# ns_udev_event ACTION DEVPATH SUBSYSTEM : run the RUN+= programs of the rules that match (rules files layered by
# name, /etc over /run over /lib; only ACTION, DEVPATH and SUBSYSTEM can match, any other match key makes a rule
# not match).  Programs run without a shell, their output discarded, as udev runs them.
ns_udev_event() {
    for _ud in /etc/udev/rules.d /run/udev/rules.d /usr/local/lib/udev/rules.d /usr/lib/udev/rules.d /lib/udev/rules.d; do
        for _uf in "$_ud"/*.rules; do [ -f "$_uf" ] && echo "${_uf##*/} $_uf"; done
    done | awk '!seen[$1]++' | sort | cut -d' ' -f2- | while read -r _uf; do
        awk -v action="$1" -v devpath="$2" -v subsystem="$3" '
            /^[ \t]*#/ || !NF { next }
            {
                line = $0; ok = 1; n = 0
                while (match(line, /[A-Z_]+(\{[^}]*\})?[ \t]*(==|!=|\+=|:=|=)[ \t]*"[^"]*"/)) {
                    kv = substr(line, RSTART, RLENGTH); line = substr(line, RSTART + RLENGTH)
                    match(kv, /(==|!=|\+=|:=|=)/); key = substr(kv, 1, RSTART - 1); op = substr(kv, RSTART, RLENGTH)
                    val = substr(kv, RSTART + RLENGTH); sub(/^[ \t]*"/, "", val); sub(/"$/, "", val); gsub(/[ \t]/, "", key)
                    if (op == "==" || op == "!=") {
                        have = (key == "ACTION") ? action : (key == "DEVPATH") ? devpath : \
                               (key == "SUBSYSTEM") ? subsystem : "\001"
                        if ((op == "==") != (have == val)) ok = 0
                    } else if (key == "RUN") run[++n] = val
                }
                if (ok) for (i = 1; i <= n; i++) print run[i]
                delete run
            }' "$_uf"
    done | while read -r _uprog; do
        # shellcheck disable=SC2086
        $_uprog >/dev/null 2>&1 </dev/null || true
    done
}

# ---- files dropped by packages / installers ----------------------------------------------------------------
ns_link_tool() {  # ns_link_tool /usr/bin/nvidia-smi nvidia-smi [owner-record-file]
    mkdir -p "$(dirname "$1")"
    rm -f "$1"
    ln -s "$NSSHIMS/$2" "$1"
    [ -n "$3" ] && echo "$1" >> "$3"
    :
}
