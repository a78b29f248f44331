# Package database shared by the apt/dpkg and dnf/rpm shims.  Sourced after common.sh and units.sh.
#   $NS/catalog   name ver repo deps effects arch summary     (what the configured repos could offer)
#   $NS/pkgdb     name ver arch held auto                      (what is installed)
#   $NS/repos.tab repo-id marker                               (a repo is configured when a sources file names its marker)
#   $NS/pkgfiles/NAME   paths / units a package created (removed with it)
PKGDB=$NS/pkgdb
CATALOG=$NS/catalog
[ -d "$NS/pkgfiles" ] || mkdir -p "$NS/pkgfiles"
[ -f "$PKGDB" ] || : > "$PKGDB"

pkg_source_files() {
    if [ "$FAMILY" = rhel ]; then
        for _f in /etc/yum.repos.d/*.repo; do [ -f "$_f" ] && echo "$_f"; done
    elif [ "$FAMILY" = suse ]; then
        for _f in /etc/zypp/repos.d/*.repo; do [ -f "$_f" ] && echo "$_f"; done
    else
        [ -f /etc/apt/sources.list ] && echo /etc/apt/sources.list
        for _f in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do [ -f "$_f" ] && echo "$_f"; done
    fi
    :
}
# Lines of the sources files that are not comments (for .repo files, only sections with enabled=1 or no key).
pkg_source_lines() {
    pkg_source_files | while read -r _f; do
        if [ "$FAMILY" != debian ]; then
            awk '/^\[/ { if (sec != "" && en) printf "%s", buf; sec = $0; buf = ""; en = 1; next }
                 /^[ \t]*enabled[ \t]*=[ \t]*0/ { en = 0 }
                 !/^[ \t]*#/ { buf = buf $0 "\n" }
                 END { if (sec != "" && en) printf "%s", buf }' "$_f"
        else
            grep -v '^[[:space:]]*#' "$_f"
        fi
    done
}
pkg_enabled_repos() {
    echo base
    _lines=$(pkg_source_lines)
    while IFS='	' read -r _id _marker; do
        case "$_lines" in *"$_marker"*) echo "$_id" ;; esac
    done < "$NS/repos.tab"
}
pkg_available() {  # catalog lines from the given repo ids (args)
    _ids=" $* "
    awk -F'\t' -v ids="$_ids" 'index(ids, " " $3 " ") > 0' "$CATALOG"
}
pkg_installed_version() { awk -F'\t' -v n="$1" '$1 == n { print $2; exit }' "$PKGDB"; }
pkg_is_installed() { [ -n "$(pkg_installed_version "$1")" ]; }
pkg_catalog_field() {  # NAME VER FIELDNO
    awk -F'\t' -v n="$1" -v v="$2" -v f="$3" '$1 == n && $2 == v { print $f; exit }' "$CATALOG"
}
pkg_arch() { _a=$(pkg_catalog_field "$1" "$2" 6); echo "${_a:-amd64}"; }

pkg_db_set() {  # NAME VER ARCH AUTO  (keeps the hold flag)
    awk -F'\t' -v OFS='\t' -v n="$1" -v v="$2" -v a="$3" -v au="$4" '
        $1 == n { held = $4; next } { print }
        END { print n, v, a, (held == "" ? 0 : held), au }' "$PKGDB" > "$PKGDB.new" && mv "$PKGDB.new" "$PKGDB"
    pkg_sync_locks
    pkg_sync_status
}
pkg_db_del() {
    awk -F'\t' -v n="$1" '$1 != n' "$PKGDB" > "$PKGDB.new" && mv "$PKGDB.new" "$PKGDB"
    pkg_sync_status
}
pkg_db_hold() {  # NAME 1|0
    awk -F'\t' -v OFS='\t' -v n="$1" -v h="$2" '$1 == n { $4 = h } { print }' "$PKGDB" > "$PKGDB.new" && mv "$PKGDB.new" "$PKGDB"
    pkg_sync_status
}
# RHEL family: dnf's versionlock plugin keeps its locks in a file, not in the rpm database. An entry
# `NAME-EPOCH:VERSION-RELEASE.*` stays when the package is removed (as real dnf's does) and applies again when it
# is installed; the hold flag of the database mirrors the file (pkg_sync_locks).
VERSIONLOCK_LIST=/etc/dnf/plugins/versionlock.list
# SUSE: zypper's addlock writes a block per lock into /etc/zypp/locks (zypper(8) `locks`, libzypp's locks file)
ZYPP_LOCKS=/etc/zypp/locks
pkg_lock_names() {  # names with a lock entry (not comments, not '!' exclusions)
    if [ "$FAMILY" = suse ]; then  # zypper's locks: `solvable_name: NAME` in a block of /etc/zypp/locks
        [ -f "$ZYPP_LOCKS" ] && sed -n 's/^solvable_name:[ \t]*//p' "$ZYPP_LOCKS"
        return 0
    fi
    [ -f "$VERSIONLOCK_LIST" ] || return 0
    sed -n 's/^\([A-Za-z0-9_.+-]*\)-[0-9][0-9]*:.*/\1/p' "$VERSIONLOCK_LIST"
}
pkg_sync_locks() {
    [ "$FAMILY" != debian ] || return 0
    _locks=" $(pkg_lock_names | tr '\n' ' ') "
    awk -F'\t' -v OFS='\t' -v l="$_locks" '{ $4 = index(l, " " $1 " ") ? 1 : 0; print }' "$PKGDB" > "$PKGDB.new" \
        && mv "$PKGDB.new" "$PKGDB"
}
pkg_is_held() { [ "$(awk -F'\t' -v n="$1" '$1 == n { print $4 }' "$PKGDB")" = 1 ]; }

# /var/lib/dpkg/status mirrors the database on Debian-family nodes.
pkg_sync_status() {
    [ "$FAMILY" = debian ] || return 0
    mkdir -p /var/lib/dpkg
    sort "$PKGDB" | awk -F'\t' -v cat="$CATALOG" '
        BEGIN { while ((getline l < cat) > 0) { split(l, f, "\t"); desc[f[1]] = f[7] } }
        { printf "Package: %s\nStatus: %s ok installed\nPriority: optional\nSection: misc\nMaintainer: nodesim\nArchitecture: %s\nVersion: %s\nDescription: %s\n\n", $1, ($4 == 1 ? "hold" : "install"), $3, $2, (desc[$1] == "" ? $1 : desc[$1]) }' > /var/lib/dpkg/status.new
    mv /var/lib/dpkg/status.new /var/lib/dpkg/status
}

# ---- effects of installing a package ----------------------------------------------------------------------
pkg_record() { echo "$2" >> "$NS/pkgfiles/$1"; }

pkg_driver_effect() {  # NAME VER FLAVOR SIGN  -> 0, or 1 with DKMS-style errors on stdout
    _k=$(ns_kernel)
    ns_driver_load_env
    DRIVER_VERSION=$2; DRIVER_FLAVOR=$3; DRIVER_METHOD=pkg; DRIVER_PKG=$1; DRIVER_KERNELS=; DRIVER_DKMS=0
    # Debian's packages (as the real-OS tier's nvidia VM shows): DKMS module nvidia-current, files
    # nvidia-current*.ko, libraries under LIBDIR/nvidia/current behind the `nvidia` alternative
    _sub=
    case "$1" in
        nvidia-kernel-dkms|nvidia-open-kernel-dkms)
            DRIVER_DKMS_NAME=nvidia-current; _sub=/nvidia/current
            # nvidia-kernel-support's configuration for the renamed modules; /etc/modprobe.d/nvidia.conf points
            # at it only once the glx alternative is registered (the `glx` effect)
            if [ ! -e /etc/nvidia/nvidia-modprobe.conf ]; then
                mkdir -p /etc/nvidia; cp "$NS/pkgdata/nvidia-modprobe.conf" /etc/nvidia/nvidia-modprobe.conf
                pkg_record "$1" /etc/nvidia/nvidia-modprobe.conf
            fi ;;
        *) DRIVER_DKMS_NAME=nvidia ;;
    esac
    _rc=0
    case "$4" in
        distro) DRIVER_SIGNKEY=distro; DRIVER_KERNELS=$_k ;;
        *)
            DRIVER_DKMS=1
            mkdir -p /var/lib/shim-signed/mok
            if [ ! -f /var/lib/shim-signed/mok/MOK.der ]; then
                od -An -tx1 -N64 /dev/urandom | tr -d ' \n' > /var/lib/shim-signed/mok/MOK.der
                od -An -tx1 -N64 /dev/urandom | tr -d ' \n' > /var/lib/shim-signed/mok/MOK.priv
            fi
            DRIVER_SIGNKEY=$(ns_key_id /var/lib/shim-signed/mok/MOK.der)
            if ns_headers_present "$_k"; then
                DRIVER_KERNELS=$_k
                mkdir -p "/var/lib/dkms/$DRIVER_DKMS_NAME/$2/$_k/x86_64/module"
                mkdir -p "/lib/modules/$_k/updates/dkms"
                for _dm in nvidia nvidia-uvm nvidia-modeset nvidia-drm nvidia-peermem; do
                    : > "/lib/modules/$_k/updates/dkms/$(ns_driver_file $_dm).ko"
                done
            elif [ "$DRIVER_DKMS_NAME" = nvidia-current ]; then
                # Debian's packages run dkms's common.postinst, which skips a kernel without headers (exit 0;
                # its text as dkms 3.0.10 on the real Debian 12 tree prints it)
                echo "Module build for kernel $_k was skipped since the"
                echo "kernel headers for this kernel do not seem to be installed."
            else
                echo "Error! Your kernel headers for kernel $_k cannot be found."
                if [ "$FAMILY" = rhel ]; then echo "Please install the kernel-devel-$_k package,"
                else echo "Please install the linux-headers-$_k package,"; fi
                echo "or use the --kernelsourcedir option to tell DKMS where it's located"
                _rc=1
            fi
            ;;
    esac
    ns_driver_write_env
    # DKMS's package post-install builds for other installed kernels with headers too, not only the running one
    # (an image build installs the driver for the kernel it will boot). Debian's common.postinst (dkms 3.0.10, read
    # on the real tree) builds for the running kernel and the newest installed one only.
    _others=$(cat "$NS/kernels" 2>/dev/null)
    [ "$DRIVER_DKMS_NAME" != nvidia-current ] || _others=$(printf '%s\n' $_others | sort -V | tail -n 1)
    if [ "$DRIVER_DKMS" = 1 ]; then
        for _ok in $_others; do
            [ "$_ok" = "$_k" ] || ! ns_headers_present "$_ok" || ns_dkms_build "$_ok" >/dev/null 2>&1 || true
        done
    fi
    mkdir -p /usr/lib/nvidia
    echo "The NVIDIA driver provided by your distribution's package manager is installed." > /usr/lib/nvidia/alternate-install-present
    pkg_record "$1" /usr/lib/nvidia/alternate-install-present
    ns_link_tool /usr/bin/nvidia-smi nvidia-smi "$NS/pkgfiles/$1"
    for _t in nvidia-persistenced nvidia-modprobe nvidia-debugdump; do
        ns_link_tool "/usr/bin/$_t" nvidia-tool "$NS/pkgfiles/$1"
    done
    mkdir -p "$LIBDIR$_sub"
    : > "$LIBDIR$_sub/libnvidia-ml.so.$2"; ln -sf "${_sub#/}${_sub:+/}libnvidia-ml.so.$2" "$LIBDIR/libnvidia-ml.so.1"
    pkg_record "$1" "$LIBDIR$_sub/libnvidia-ml.so.$2"; pkg_record "$1" "$LIBDIR/libnvidia-ml.so.1"
    ns_unit_exists nvidia-persistenced.service || { ns_unit_create nvidia-persistenced.service "NVIDIA Persistence Daemon" inactive enabled; pkg_record "$1" "unit:nvidia-persistenced.service"; }
    return $_rc
}

pkg_apply_effects() {  # NAME VER ; prints error text, returns 1 on a failed post-install step
    _eff=$(pkg_catalog_field "$1" "$2" 5)
    [ -z "$_eff" ] || [ "$_eff" = - ] && return 0
    _ret=0
    _old_ifs=$IFS; IFS=';'; set -f
    for _e in $_eff; do
        IFS=$_old_ifs
        _typ=${_e%%:*}; _rest=${_e#*:}
        case "$_typ" in
            tool) ns_link_tool "${_rest%%:*}" "${_rest#*:}" "$NS/pkgfiles/$1" ;;
            file)
                _dest=${_rest%%:*}
                if [ ! -e "$_dest" ]; then
                    mkdir -p "$(dirname "$_dest")"; cp "$NS/pkgdata/${_rest#*:}" "$_dest"; pkg_record "$1" "$_dest"
                fi ;;
            unit)
                _unitn=${_rest%%:*}; _r2=${_rest#*:}; _desc=${_r2%%:*}; _en=${_r2#*:}
                if ! ns_unit_exists "$_unitn"; then ns_unit_create "$_unitn" "$_desc"; pkg_record "$1" "unit:$_unitn"; fi
                if [ "$_en" = enable ]; then ns_unit_set "$_unitn" ENABLED enabled; ns_unit_start "$_unitn" || true; fi ;;
            headers)
                case "$FAMILY" in
                    rhel) _src=/usr/src/kernels/$_rest ;;
                    suse) _src=/usr/src/linux-${_rest%-*}-obj/x86_64/${_rest##*-} ;;
                    *) _src=/usr/src/linux-headers-$_rest ;;
                esac
                mkdir -p "$_src/include" "/lib/modules/$_rest"
                ln -sfn "$_src" "/lib/modules/$_rest/build"
                pkg_record "$1" "/lib/modules/$_rest/build"; pkg_record "$1" "dir:$_src"
                ns_kernel_postinst_dkms "$_rest" header || _ret=1 ;;
            kernel)
                ns_kernel_add "$_rest"
                pkg_record "$1" "dir:/lib/modules/$_rest/kernel"; pkg_record "$1" "/boot/vmlinuz-$_rest"
                ns_kernel_postinst_dkms "$_rest" || _ret=1 ;;
            driver)
                _v=${_rest%%:*}; _r2=${_rest#*:}; _fl=${_r2%%:*}; _sg=${_r2#*:}
                pkg_driver_effect "$1" "$_v" "$_fl" "$_sg" || _ret=1 ;;
            glx)
                # glx-alternative-nvidia registers the glx alternative once libcuda1 (or the GL libraries)
                # come in; its slaves link Debian's modprobe configuration and the loader path of LIBDIR/nvidia
                if [ ! -e /etc/modprobe.d/nvidia.conf ] && [ -e /etc/nvidia/nvidia-modprobe.conf ]; then
                    mkdir -p /etc/alternatives /etc/modprobe.d
                    ln -sfn /etc/nvidia/nvidia-modprobe.conf /etc/alternatives/glx--nvidia-modprobe.conf
                    ln -sfn /etc/alternatives/glx--nvidia-modprobe.conf /etc/modprobe.d/nvidia.conf
                    pkg_record "$1" /etc/modprobe.d/nvidia.conf; pkg_record "$1" /etc/alternatives/glx--nvidia-modprobe.conf
                fi ;;
            fm)
                echo "$_rest" > "$NS/fabricmanager.version"; pkg_record "$1" "$NS/fabricmanager.version"
                ns_link_tool /usr/bin/nv-fabricmanager nv-fabricmanager "$NS/pkgfiles/$1"
                if ! ns_unit_exists nvidia-fabricmanager.service; then
                    ns_unit_create nvidia-fabricmanager.service "NVIDIA fabric manager service"; pkg_record "$1" "unit:nvidia-fabricmanager.service"
                fi ;;
        esac
        IFS=';'
    done
    IFS=$_old_ifs; set +f
    return $_ret
}

pkg_remove_files() {  # NAME
    if [ -f "$NS/pkgfiles/$1" ]; then
        while read -r _p; do
            case "$_p" in
                unit:*) ns_unit_remove "${_p#unit:}" ;;
                dir:*) rm -rf "${_p#dir:}" ;;
                *) rm -f "$_p" ;;
            esac
        done < "$NS/pkgfiles/$1"
        rm -f "$NS/pkgfiles/$1"
    fi
    ns_driver_load_env
    if [ "$DRIVER_PKG" = "$1" ]; then rm -f "$NS/driver.env"; fi
}

# Apt's view: repos as of the last `apt-get update`.
pkg_apt_ids() {  # PKG_IDS = the repositories apt has fetched (apt-get update; before any: base), read by the shell
    PKG_IDS=; [ -r "$NS/apt-updated" ] || { PKG_IDS=base; return 0; }
    while read -r _l || [ -n "$_l" ]; do PKG_IDS="$PKG_IDS $_l"; done < "$NS/apt-updated"
}
pkg_apt_available() { pkg_apt_ids; pkg_available $PKG_IDS; }

# Resolve request specs (args) -> actions on stdout (see resolve.awk).
pkg_resolve() {  # MODE AVAILFILE SPECS...
    _mode=$1; _avail=$2; shift 2
    printf '%s\n' "$@" > "$NS/.req"
    awk -v mode="$_mode" -f "$NSLIB/vercmp.awk" -f "$NSLIB/resolve.awk" "$_avail" "$PKGDB" "$NS/.req"
    rm -f "$NS/.req"
}

# Pending upgrades of installed, not held packages -> "name old new repo arch new_package(0|1)" (upgrades.awk).
pkg_upgrades() {  # MODE AVAILFILE
    awk -v mode="$1" -f "$NSLIB/vercmp.awk" -f "$NSLIB/upgrades.awk" "$2" "$PKGDB"
}

# The simulated package lock (set by the host to imitate unattended-upgrades); each attempt uses one try.
pkg_lock_held() {
    [ -f "$NS/apt.lock" ] || return 1
    _n=$(cat "$NS/apt.lock")
    if [ "${_n:-0}" -le 1 ]; then rm -f "$NS/apt.lock"; else echo $((_n - 1)) > "$NS/apt.lock"; fi
    return 0
}
