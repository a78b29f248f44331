# What an upgrade of everything would do: awk -v mode=apt|dnf -f vercmp.awk -f upgrades.awk AVAILABLE PKGDB
# AVAILABLE: catalog lines from enabled repos (name ver repo deps effects arch); PKGDB: name ver arch held auto.
# Prints "name old new repo arch 0 -" for each installed, not held package with a newer version available, and
# (apt: dist-upgrade installs new dependencies, e.g. the new kernel a metapackage depends on) "name - ver repo
# arch 1 parent" for each dependency of those new versions that is not installed.
FNR == NR { n = ++nv[$1]; V[$1, n] = $2; R[$1, $2] = $3; D[$1, $2] = $4; A[$1, $2] = $6; next }
{ inst[$1] = $2; held[$1] = $4; order[++ni] = $1 }
function best(name,   i, b) {
    b = ""
    for (i = 1; i <= nv[name]; i++) if (b == "" || vercmp(V[name, i], b) > 0) b = V[name, i]
    return b
}
END {
    for (k = 1; k <= ni; k++) {
        name = order[k]
        if (held[name] == 1 || !(name in nv)) continue
        new = best(name)
        if (vercmp(new, inst[name]) <= 0) continue
        print name, inst[name], new, R[name, new], A[name, new], 0, "-"
        if (mode != "apt" || D[name, new] == "-") continue
        nd = split(D[name, new], deps, ",")
        for (j = 1; j <= nd; j++) {
            dn = deps[j]; dv = ""
            if (index(dn, "=")) { dv = substr(dn, index(dn, "=") + 1); dn = substr(dn, 1, index(dn, "=") - 1) }
            if ((dn in inst) || (dn in added) || !(dn in nv)) continue
            if (dv == "") dv = best(dn)
            added[dn] = 1
            print dn, "-", dv, R[dn, dv], A[dn, dv], 1, name
        }
    }
}
