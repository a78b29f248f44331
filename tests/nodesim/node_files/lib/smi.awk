# Renders the plain `nvidia-smi` table from /var/lib/nodesim/gpus (tab separated).
# -v ver=DRIVER -v cuda=X.Y -v style=n|w|p -v pm=On|Off (the timestamp: busybox awk's strftime, no date process)
# Column layouts are those of real captures: n = 535.x (89 wide), w = 545..575 (91 wide), p = 580+ (91 wide).
function rep(c, n,   s) { s = ""; while (n-- > 0) s = s c; return s }
function rjust(s, n) { return sprintf("%" n "s", s) }
function ljust(s, n) { return sprintf("%-" n "s", s) }
function smibus(b,   p, d) { split(b, p, ":"); d = "00000000" p[1]; return toupper(substr(d, length(d) - 7) ":" p[2] ":" p[3]) }
BEGIN {
    FS = "\t"
    if (style == "n") { W2 = 22; inner = 87 } else { W2 = 24; inner = 89 }
    sep = "+" rep("-", 41) "+" rep("-", W2) "+" rep("-", 22) "+"
    top = "+" rep("-", inner) "+"
    print strftime("%a %b %e %H:%M:%S %Y") "       "
    print top
    if (style == "n")
        print "| NVIDIA-SMI " ljust(ver, 23) "Driver Version: " ljust(ver, 13) "CUDA Version: " ljust(cuda, 9) "|"
    else
        print "| NVIDIA-SMI " ljust(ver, 23) "Driver Version: " ljust(ver, 15) "CUDA Version: " ljust(cuda, 9) "|"
    print (style == "p" ? "+" : "|") rep("-", 41) "+" rep("-", W2) "+" rep("-", 22) (style == "p" ? "+" : "+")
    if (style == "n") {
        print "| GPU  Name                 Persistence-M | Bus-Id        Disp.A | Volatile Uncorr. ECC |"
        print "| Fan  Temp   Perf          Pwr:Usage/Cap |         Memory-Usage | GPU-Util  Compute M. |"
        print "|                                         |                      |               MIG M. |"
    } else {
        print "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |"
        print "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |"
        print "|                                         |                        |               MIG M. |"
    }
    print "|" rep("=", 41) "+" rep("=", W2) "+" rep("=", 22) "|"
}
{
    name = $4; if (length(name) > 27) name = substr(name, 1, 24) "..."
    first = sprintf("%4s  %s%6s  ", $1, ljust(name, 27), pm)
    util = ($12 == "Enabled") ? "N/A" : "0%"
    if (style == "n") {
        s2a = " " smibus($2) " Off "
        pwr = rjust($7 "W", 17) " / " rjust($6 "W", 4) " "
        mem = rjust($13 "MiB", 10) " / " rjust($5 "MiB", 8) " "
    } else {
        s2a = rjust(smibus($2), 19) " Off "
        pwr = rjust($7 "W", 16) " / " rjust($6 "W", 5) " "
        mem = rjust($13 "MiB", 11) " / " rjust($5 "MiB", 9) " "
    }
    print "|" first "|" s2a "|" rjust($11, 21) " |"
    print "|" rjust($10, 4) rjust($8 "C", 6) rjust($9, 6) pwr "|" mem "|" rjust(util, 8) rjust("Default", 13) " |"
    print "|" rep(" ", 41) "|" rep(" ", W2) "|" rjust($12, 21) " |"
    print sep
}
END {
    if (style == "p") print ""; else print rep(" ", inner)
    print top
    print "| " ljust("Processes:", inner - 1) "|"
    if (style == "p") {
        print "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |"
        print "|        ID   ID                                                               Usage      |"
    } else if (style == "w") {
        print "|  GPU   GI   CI        PID   Type   Process name                              GPU Memory |"
        print "|        ID   ID                                                               Usage      |"
    } else {
        print "|  GPU   GI   CI        PID   Type   Process name                            GPU Memory |"
        print "|        ID   ID                                                             Usage      |"
    }
    print "|" rep("=", inner) "|"
    print "|  " ljust("No running processes found", inner - 2) "|"
    print top
}
