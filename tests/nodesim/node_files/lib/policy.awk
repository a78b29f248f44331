# `apt-cache policy NAME...` in one process: awk -F'\t' -v ids=" REPO-ID... " -f vercmp.awk -f policy.awk CATALOG
# PKGDB NAME... (the names are taken out of ARGV). Each name in the order asked: the installed version, the
# newest one the fetched repositories (ids) offer as candidate, and the table of those, newest first, in dpkg's
# version order as apt sorts it. A name with nothing on offer and nothing installed is left out, as apt-cache does.
BEGIN { for (i = 3; i < ARGC; i++) { want[++nw] = ARGV[i]; ARGV[i] = "" } }
FILENAME == ARGV[1] { if (index(ids, " " $3 " ")) { n[$1]++; v[$1, n[$1]] = $2 } next }
!($1 in inst) { inst[$1] = $2 }
END {
    for (w = 1; w <= nw; w++) {
        p = want[w]; c = n[p] + 0
        if (c == 0 && !(p in inst)) continue
        for (i = 2; i <= c; i++) {  # insertion sort, newest first
            x = v[p, i]
            for (j = i - 1; j >= 1 && vercmp(v[p, j], x) < 0; j--) v[p, j + 1] = v[p, j]
            v[p, j + 1] = x
        }
        print p ":"
        print "  Installed: " ((p in inst) ? inst[p] : "(none)")
        print "  Candidate: " (c ? v[p, 1] : "(none)")
        print "  Version table:"
        for (i = 1; i <= c; i++) print "     " v[p, i] " 500"
    }
}
