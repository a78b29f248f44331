# nvidia-smi --query-gpu=FIELDS --format=csv[,noheader][,nounits] over /var/lib/nodesim/gpus.
# -v health=/var/lib/nodesim/gpuhealth (mig_pending per GPU) -v fields=a,b,c -v noheader=0|1 -v nounits=0|1 -v ver=... -v pm=Enabled|Disabled -v fm=1|0 -v sel=IDX|""
function smibus(b,   p, d) { split(b, p, ":"); d = "00000000" p[1]; return toupper(substr(d, length(d) - 7) ":" p[2] ":" p[3]) }
function unit(v, u) { return nounits ? v : v " " u }
BEGIN {
    FS = "\t"
    while (health != "" && (getline hl < health) > 0) { split(hl, hf, "\t"); if (hf[2] == "mig_pending") MP[hf[1]] = hf[3] }
    n = split(fields, F, ",")
    H["name"] = "name"; H["gpu_name"] = "name"; H["driver_version"] = "driver_version"; H["pci.bus_id"] = "pci.bus_id"
    H["gpu_bus_id"] = "pci.bus_id"; H["uuid"] = "uuid"; H["gpu_uuid"] = "uuid"; H["index"] = "index"; H["count"] = "count"
    H["serial"] = "serial"; H["gpu_serial"] = "serial"; H["vbios_version"] = "vbios_version"; H["compute_cap"] = "compute_cap"
    H["persistence_mode"] = "persistence_mode"; H["pstate"] = "pstate"; H["temperature.gpu"] = "temperature.gpu"
    H["memory.total"] = "memory.total [MiB]"; H["memory.used"] = "memory.used [MiB]"; H["memory.free"] = "memory.free [MiB]"
    H["utilization.gpu"] = "utilization.gpu [%]"; H["power.draw"] = "power.draw [W]"; H["power.limit"] = "power.limit [W]"
    H["mig.mode.current"] = "mig.mode.current"; H["mig.mode.pending"] = "mig.mode.pending"
    H["fabric.state"] = "fabric.state"; H["fabric.status"] = "fabric.status"; H["pci.device_id"] = "pci.device_id"
    H["pci.sub_device_id"] = "pci.sub_device_id"; H["pci.domain"] = "pci.domain"; H["pci.bus"] = "pci.bus"
    H["pci.device"] = "pci.device"; H["ecc.mode.current"] = "ecc.mode.current"; H["display_mode"] = "display_mode"
    H["fan.speed"] = "fan.speed [%]"
    for (i = 1; i <= n; i++) {
        gsub(/^ +| +$/, "", F[i])
        if (!(F[i] in H)) { printf "Field \"%s\" is not a valid field to query.\n\n", F[i]; bad = 1; exit 2 }
        hdr = hdr (i > 1 ? ", " : "") (nounits ? H[F[i]] : H[F[i]])
    }
    if (!noheader) print hdr
}
{
    if (sel != "" && $1 != sel && $18 != sel && smibus($2) != toupper(sel)) next
    total++
    line = ""
    for (i = 1; i <= n; i++) {
        f = F[i]
        split($2, P, ":"); split(P[3], D, ".")
        if (f == "name" || f == "gpu_name") v = $4
        else if (f == "driver_version") v = ver
        else if (f == "pci.bus_id" || f == "gpu_bus_id") v = smibus($2)
        else if (f == "uuid" || f == "gpu_uuid") v = $18
        else if (f == "index") v = $1
        else if (f == "count") v = NCOUNT
        else if (f == "serial" || f == "gpu_serial") v = $20
        else if (f == "vbios_version") v = $15
        else if (f == "compute_cap") v = $14
        else if (f == "persistence_mode") v = pm
        else if (f == "pstate") v = $9
        else if (f == "temperature.gpu") v = $8
        else if (f == "memory.total") v = unit($5, "MiB")
        else if (f == "memory.used") v = unit($13, "MiB")
        else if (f == "memory.free") v = unit($5 - $13, "MiB")
        else if (f == "utilization.gpu") v = unit(0, "%")
        else if (f == "power.draw") v = unit(sprintf("%.2f", $7), "W")
        else if (f == "power.limit") v = unit(sprintf("%.2f", $6), "W")
        else if (f == "mig.mode.current") v = ($12 == "N/A") ? "[N/A]" : $12
        else if (f == "mig.mode.pending") v = ($12 == "N/A") ? "[N/A]" : (($1 in MP) ? MP[$1] : $12)
        else if (f == "fabric.state") v = ($21 == "0") ? "[N/A]" : (($21 == "2" && !fm) ? "In Progress" : "Completed")
        else if (f == "fabric.status") v = ($21 == "0") ? "[N/A]" : (($21 == "2" && !fm) ? "[N/A]" : "Success")
        else if (f == "pci.device_id") v = sprintf("0x%s10DE", toupper(substr($3, 3)))
        else if (f == "pci.sub_device_id") v = $19
        else if (f == "pci.domain") v = "0x" toupper(P[1])
        else if (f == "pci.bus") v = "0x" toupper(P[2])
        else if (f == "pci.device") v = "0x" toupper(D[1])
        else if (f == "ecc.mode.current") v = ($11 == "Off") ? "Disabled" : (($11 == "N/A") ? "[N/A]" : "Enabled")
        else if (f == "display_mode") v = "Disabled"
        else if (f == "fan.speed") v = ($10 == "N/A") ? "[N/A]" : unit($10 + 0, "%")
        line = line (i > 1 ? ", " : "") v
    }
    print line
}
END { if (!bad && sel != "" && total == 0) { print "No devices were found"; exit 6 } }
