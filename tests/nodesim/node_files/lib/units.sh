# Unit start/stop with the side effects the simulator cares about.  Sourced after common.sh.

# ns_unit_start UNIT : returns 0 when the unit ends up active, 1 when it fails (state "failed").
ns_unit_start() {
    _unit=$(ns_unit_name "$1")
    case "$_unit" in
        docker.service)
            mkdir -p "$NS/engines"
            if [ -f /etc/docker/daemon.json ] && ! ns_py engines docker-validate /etc/docker/daemon.json >/dev/null 2>&1; then
                ns_unit_set "$_unit" ACTIVE failed; return 1
            fi
            if [ -f /etc/docker/daemon.json ]; then cp /etc/docker/daemon.json "$NS/engines/docker.json"; else rm -f "$NS/engines/docker.json"; fi
            # moby registers the "nvidia" --gpus device driver at daemon start when the hook is on PATH
            if command -v nvidia-container-runtime-hook >/dev/null 2>&1; then echo 1 > "$NS/engines/docker.hook"; else echo 0 > "$NS/engines/docker.hook"; fi
            ;;
        containerd.service)
            mkdir -p "$NS/engines"
            if ! ns_py engines containerd-effective /etc/containerd/config.toml "$NS/engines/containerd.json" >/dev/null 2>&1; then
                ns_unit_set "$_unit" ACTIVE failed; return 1
            fi
            ;;
        k3s.service|k3s-agent.service)
            # k3s writes containerd's config.toml from its template (config-v3.toml.tmpl for containerd 2 configs,
            # else config.toml.tmpl; none: its built-in one, kept as generated) and starts its containerd
            mkdir -p "$NS/engines"
            _kd=/var/lib/rancher/k3s/agent/etc/containerd
            for _t in "$_kd/config-v3.toml.tmpl" "$_kd/config.toml.tmpl"; do
                [ -f "$_t" ] && { cp "$_t" "$_kd/config.toml"; break; }
            done
            if ! ns_py engines containerd-effective "$_kd/config.toml" "$NS/engines/k3s-containerd.json" >/dev/null 2>&1; then
                ns_unit_set "$_unit" ACTIVE failed; return 1
            fi
            ;;
        nvidia-persistenced.service)
            # the command systemd loaded (none known: a packaged unit, persistence on); the daemon needs the driver
            _pexec=$(ns_unit_loaded_exec "$_unit")
            _pbin=${_pexec%% *}; _pbin=${_pbin#[-@+!:]}
            if [ -n "$_pbin" ] && [ ! -x "$_pbin" ]; then ns_unit_set "$_unit" ACTIVE failed; return 1; fi
            # what the real daemon logs (real-OS tier, tests/fixtures/real/debian-nvidia): Debian's libraries are
            # on the loader path only through the glx alternative (libcuda1), else libnvidia-cfg is not found
            ns_driver_load_env
            if [ "$DRIVER_DKMS_NAME" = nvidia-current ] && [ ! -e /etc/modprobe.d/nvidia.conf ]; then
                ns_persistenced_failed "Failed to open libnvidia-cfg.so.1: libnvidia-cfg.so.1: cannot open shared object file: No such file or directory"
                return 1
            fi
            if ! ns_loaded nvidia; then
                ns_persistenced_failed "Failed to query NVIDIA devices. Please ensure that the NVIDIA device files (/dev/nvidia*) exist, and that user 102 has read and write permissions for those files."
                return 1
            fi
            case " $_pexec " in
                *" --no-persistence-mode "*) rm -f "$NS/smi.persistence" ;;
                *) : > "$NS/smi.persistence" ;;
            esac
            ;;
        nvidia-fabricmanager.service)
            LOADED_VERSION=; [ -r "$NS/loaded.env" ] && . "$NS/loaded.env"
            _fmv=$(cat "$NS/fabricmanager.version" 2>/dev/null)
            _ts=$(date '+[%b %d %Y %H:%M:%S]')
            if ! ns_loaded nvidia; then
                echo "$_ts [ERROR] [tid 1] Fabric Manager failed to open the NVIDIA driver: driver not loaded" >> /var/log/fabricmanager.log
                ns_unit_set "$_unit" ACTIVE failed; return 1
            fi
            if [ "$_fmv" != "$LOADED_VERSION" ]; then
                echo "$_ts [ERROR] [tid 1] fabric manager NVIDIA GPU driver interface version $LOADED_VERSION don't match with driver version $_fmv. Please update with matching NVIDIA driver package." >> /var/log/fabricmanager.log
                ns_unit_set "$_unit" ACTIVE failed; return 1
            fi
            if [ ! -s "$NS/switches" ] && [ "$NVLINK5" != 1 ]; then
                echo "$_ts [INFO] [tid 1] No NVSwitch devices found: NV_WARN_NOTHING_TO_DO" >> /var/log/fabricmanager.log
                ns_unit_set "$_unit" ACTIVE failed; return 1
            fi
            echo "$_ts [INFO] [tid 1] Successfully configured all the available NVSwitches to route GPU NVLink traffic." >> /var/log/fabricmanager.log
            ;;
    esac
    ns_unit_set "$_unit" ACTIVE active
    return 0
}

ns_persistenced_failed() {  # REASON: the failed start's journal lines, as the real daemon and systemd log them
    _u=nvidia-persistenced.service; _pp=$$
    mkdir -p "$NS/journal"
    printf '%s\n' "Starting $_u - NVIDIA Persistence Daemon..." "Started ($_pp)" "$1" \
        "nvidia-persistenced failed to initialize. Check syslog for more details." "Shutdown ($_pp)" \
        "$_u: Control process exited, code=exited, status=1/FAILURE" "$_u: Failed with result 'exit-code'." \
        "Failed to start $_u - NVIDIA Persistence Daemon." >> "$NS/journal/$_u"
    ns_unit_set "$_u" ACTIVE failed
}

ns_unit_stop() {
    _unit=$(ns_unit_name "$1")
    ns_unit_exists "$_unit" && ns_unit_set "$_unit" ACTIVE inactive
    # without its daemon the driver keeps no GPU state: persistence mode goes off with it
    [ "$_unit" = nvidia-persistenced.service ] && rm -f "$NS/smi.persistence"
    :
}
