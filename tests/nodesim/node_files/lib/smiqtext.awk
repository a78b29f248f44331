# nvidia-smi -q (text) over /var/lib/nodesim/gpus, with the health state the host set in /var/lib/nodesim/gpuhealth
# (lines "INDEX<TAB>KEY<TAB>VALUE"; see SimNode.set_gpu_health / set_mig).  Block names, order and indentation
# follow the real captures in shared/fixtures/real/nvidia-smi-q-text: MIG Mode and MIG devices after the header
# fields, GSP Firmware Version, GPU Virtualization Mode (and the vGPU driver's licence block), Fabric (Hopper+
# on NVSwitch), ECC Mode / ECC Errors (the SRAM/DRAM layout of
# R510+), Retired Pages (Yes/No and counts before Ampere, N/A from Ampere on), Remapped Rows (a block from Ampere
# on, a single N/A line before).
#   awk -F'\t' -v pm=Enabled|Disabled -v fm=1|0 -v flavor=open|proprietary -v ver=VER -v cuda=X.Y -v ngpu=N
#       -v health=FILE -f smiqtext.awk GPUS
# The header (its timestamp from busybox awk's strftime) is printed here too: nvidia-smi -q is one process.
function kv(key, value) { printf "    %-34s: %s\n", key, value }
function kv2(key, value) { printf "        %-30s: %s\n", key, value }
function kv3(key, value) { printf "            %-26s: %s\n", key, value }
function h(i, key, dflt) { return ((i, key) in H) ? H[i, key] : dflt }
BEGIN {
    while ((getline line < health) > 0) { split(line, f, "\t"); H[f[1], f[2]] = f[3] }
    printf "\n==============NVSMI LOG==============\n\n"
    printf "%-38s: %s\n%-38s: %s\n%-38s: %s\n", "Timestamp", strftime("%a %b %e %H:%M:%S %Y"), "Driver Version", ver,
        "CUDA Version", cuda
    printf "\n%-38s: %s\n", "Attached GPUs", ngpu
}
{
    i = $1
    split($2, p, ":"); d = "00000000" p[1]; printf "GPU %s\n", toupper(substr(d, length(d) - 7) ":" p[2] ":" p[3])
    ampere = ($14 + 0 >= 8)
    kv("Product Name", $4)
    kv("Persistence Mode", pm)
    print "    MIG Mode"
    mig = ($12 == "N/A") ? "N/A" : $12
    kv2("Current", mig)
    kv2("Pending", h(i, "mig_pending", mig))
    n = split(h(i, "mig_devices", ""), devs, ",")
    for (m = 1; m <= n; m++) {
        print "    MIG Device"
        kv2("Index", m - 1)
        kv2("GPU Instance ID", m + 1)
        kv2("Compute Instance ID", 0)
    }
    kv("GPU UUID", $18)
    kv("VBIOS Version", $15)
    # GSP: always with the open module; the proprietary module runs it where the host says so (NVreg_EnableGpuFirmware)
    gsp = h(i, "gsp", (flavor == "open") ? "on" : "off")
    kv("GSP Firmware Version", gsp == "on" ? ver : "N/A")
    # printed when the host set a mode (real drivers always print it; the kernel-log-only hw.vgpu variant needs a
    # nvidia-smi that does not say "None")
    if (h(i, "virt_mode", "") != "") {
        print "    GPU Virtualization Mode"
        kv2("Virtualization Mode", h(i, "virt_mode", ""))
        kv2("Host VGPU Mode", h(i, "host_vgpu_mode", "N/A"))
        kv2("vGPU Heterogeneous Mode", "N/A")
    }
    if (h(i, "vgpu_license", "") != "") {
        print "    vGPU Software Licensed Product"
        kv2("Product Name", h(i, "vgpu_product", "NVIDIA Virtual Compute Server"))
        kv2("License Status", h(i, "vgpu_license", ""))
    }
    if ($21 != "0") {
        print "    Fabric"
        kv2("State", ($21 == "2" && !fm) ? "In Progress" : "Completed")
        kv2("Status", ($21 == "2" && !fm) ? "N/A" : "Success")
    }
    ecc = ($11 == "N/A") ? "N/A" : (($11 == "Off") ? "Disabled" : "Enabled")
    ecc = h(i, "ecc", ecc)
    print "    ECC Mode"
    kv2("Current", ecc)
    kv2("Pending", h(i, "ecc_pending", ecc))
    print "    ECC Errors"
    for (s = 1; s <= 2; s++) {
        scope = (s == 1) ? "Volatile" : "Aggregate"; key = (s == 1) ? "vol" : "agg"
        printf "        %s\n", scope
        na = (ecc != "Enabled") ? "N/A" : ""
        kv3("SRAM Correctable", na != "" ? na : h(i, key "_sram_cor", 0))
        kv3("SRAM Uncorrectable", na != "" ? na : h(i, key "_sram_unc", 0))
        kv3("DRAM Correctable", na != "" ? na : h(i, key "_dram_cor", 0))
        kv3("DRAM Uncorrectable", na != "" ? na : h(i, key "_dram_unc", 0))
    }
    print "    Retired Pages"
    if (ampere || ecc == "N/A") {
        kv2("Single Bit ECC", "N/A"); kv2("Double Bit ECC", "N/A"); kv2("Pending Page Blacklist", "N/A")
    } else {
        kv2("Single Bit ECC", h(i, "retired_sbe", 0)); kv2("Double Bit ECC", h(i, "retired_dbe", 0))
        kv2("Pending Page Blacklist", h(i, "retired_pending", "No"))
    }
    if (ampere && ecc != "N/A") {
        print "    Remapped Rows"
        kv2("Correctable Error", h(i, "remap_cor", 0))
        kv2("Uncorrectable Error", h(i, "remap_unc", 0))
        kv2("Pending", h(i, "remap_pending", "No"))
        kv2("Remapping Failure Occurred", h(i, "remap_failed", "No"))
        print "        Bank Remap Availability Histogram"
        kv3("Max", (h(i, "remap_failed", "No") == "Yes" ? 0 : 640 - h(i, "remap_unc", 0) - h(i, "remap_cor", 0)) " bank(s)")
        kv3("High", (h(i, "remap_unc", 0) + h(i, "remap_cor", 0)) " bank(s)")
        kv3("Partial", "0 bank(s)")
        kv3("Low", "0 bank(s)")
        kv3("None", (h(i, "remap_failed", "No") == "Yes" ? 1 : 0) " bank(s)")
    } else {
        kv("Remapped Rows", "N/A")
    }
    print ""
}
