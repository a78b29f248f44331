# Package resolver for the apt/dnf shims.
#   awk -v mode=apt|dnf -f resolve.awk AVAILABLE PKGDB REQUESTS
# AVAILABLE: catalog lines from enabled repos (name ver repo deps effects arch)
# PKGDB:     installed packages (name ver arch held auto)
# REQUESTS:  one spec per line (apt: name | name=ver ; dnf: name | name-ver | name-ver-rel | name-ver.arch)
# Prints one action per line:
#   NOTFOUND spec | NOVERSION name ver | UNMET pkg pkgver dep depver candidate
#   KEEP name ver | INST name ver explicit | CHANGE name old new held downgrade explicit
# vercmp() comes from vercmp.awk (awk -f vercmp.awk -f resolve.awk)
function newest(name,   i, best) {
    best = ""
    for (i = 1; i <= nv[name]; i++) if (best == "" || vercmp(V[name, i], best) > 0) best = V[name, i]
    return best
}
function has(name, ver,   i) { for (i = 1; i <= nv[name]; i++) if (V[name, i] == ver) return 1; return 0 }
function plan(name, ver, explicit,   deps, n, i, d, dn, dv, cand) {
    if (name in planned) return
    planned[name] = ver
    if (name in inst) {
        if (inst[name] == ver) { if (explicit) print "KEEP", name, ver; return }
        print "CHANGE", name, inst[name], ver, held[name], (vercmp(ver, inst[name]) < 0) ? 1 : 0, explicit
    } else {
        print "INST", name, ver, explicit
    }
    if (DEPS[name, ver] == "-" || DEPS[name, ver] == "") return
    n = split(DEPS[name, ver], deps, ",")
    for (i = 1; i <= n; i++) {
        d = deps[i]; dn = d; dv = ""
        if (index(d, "=") > 0) { dn = substr(d, 1, index(d, "=") - 1); dv = substr(d, index(d, "=") + 1) }
        if (dn in planned) { cand = planned[dn] }
        else if (dn in want) { cand = want[dn] }
        else if (dn in inst && (dv == "" || inst[dn] == dv)) { continue }
        else if (mode == "dnf" && dv != "" && has(dn, dv)) { cand = dv }
        else if (dn in inst && mode == "apt") { cand = inst[dn] }
        else { cand = newest(dn) }
        if (cand == "") { print "NOTFOUND", dn; continue }
        if (dv != "" && cand != dv) { print "UNMET", name, ver, dn, dv, cand; continue }
        plan(dn, cand, 0)
    }
}
BEGIN { FS = "[\t]" }
FILENAME == ARGV[1] { if (!((($1, $2)) in seen)) { seen[$1, $2] = 1; nv[$1]++; V[$1, nv[$1]] = $2; DEPS[$1, $2] = $4; ARCH[$1, $2] = $6 } next }
FILENAME == ARGV[2] { inst[$1] = $2; held[$1] = $4; next }
{
    spec = $0; gsub(/^[ \t]+|[ \t]+$/, "", spec); if (spec == "") next
    nreq++; REQ[nreq] = spec
}
END {
    # first pass: decide the version of every explicitly requested package
    for (r = 1; r <= nreq; r++) {
        spec = REQ[r]; name = ""; ver = ""
        if (mode == "apt") {
            if (index(spec, "=") > 0) { name = substr(spec, 1, index(spec, "=") - 1); ver = substr(spec, index(spec, "=") + 1) }
            else name = spec
            if (!(name in nv)) { print "NOTFOUND", spec; continue }
            if (ver != "" && !has(name, ver)) { print "NOVERSION", name, ver; continue }
        } else {
            if (spec in nv) name = spec
            else {
                for (k in seen) {
                    split(k, kk, SUBSEP)
                    if (spec == kk[1] "-" kk[2] || spec == kk[1] "-" kk[2] "." ARCH[kk[1], kk[2]] || (index(kk[2], "-") && spec == kk[1] "-" substr(kk[2], 1, index(kk[2], "-") - 1))) {
                        if (name == "" || vercmp(kk[2], ver) > 0) { name = kk[1]; ver = kk[2] }
                    }
                }
            }
            if (name == "") { print "NOTFOUND", spec; continue }
        }
        if (ver == "") ver = newest(name)
        want[name] = ver; wantorder[++nw] = name
    }
    for (w = 1; w <= nw; w++) plan(wantorder[w], want[wantorder[w]], 1)
}
