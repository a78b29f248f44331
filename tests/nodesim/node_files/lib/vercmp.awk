# Debian-style version comparison (epoch, then alternating non-digit / digit runs; ~ sorts first), shared by
# resolve.awk and upgrades.awk: vercmp(a, b) -> -1, 0, 1.
function isdigit(c) { return c ~ /^[0-9]$/ }
function order(c) { if (c == "~") return -1; if (c ~ /[A-Za-z]/) return index("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz", c); if (c == "") return 0; return 256 + index("+-.:", c) }
function cmpstr(a, b,   i, ca, cb, na, nb) {
    while (a != "" || b != "") {
        # non-digit prefix
        while ((a != "" && !isdigit(substr(a, 1, 1))) || (b != "" && !isdigit(substr(b, 1, 1)))) {
            ca = (a != "" && !isdigit(substr(a, 1, 1))) ? substr(a, 1, 1) : ""
            cb = (b != "" && !isdigit(substr(b, 1, 1))) ? substr(b, 1, 1) : ""
            if (order(ca) != order(cb)) return order(ca) < order(cb) ? -1 : 1
            if (ca != "") a = substr(a, 2); if (cb != "") b = substr(b, 2)
        }
        na = 0; while (a != "" && isdigit(substr(a, 1, 1))) { na = na * 10 + substr(a, 1, 1); a = substr(a, 2) }
        nb = 0; while (b != "" && isdigit(substr(b, 1, 1))) { nb = nb * 10 + substr(b, 1, 1); b = substr(b, 2) }
        if (na != nb) return na < nb ? -1 : 1
    }
    return 0
}
function vercmp(a, b,   ea, eb) {
    ea = 0; eb = 0
    if (a ~ /^[0-9]+:/) { ea = substr(a, 1, index(a, ":") - 1) + 0; a = substr(a, index(a, ":") + 1) }
    if (b ~ /^[0-9]+:/) { eb = substr(b, 1, index(b, ":") - 1) + 0; b = substr(b, index(b, ":") + 1) }
    if (ea != eb) return ea < eb ? -1 : 1
    return cmpstr(a, b)
}
