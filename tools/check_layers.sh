#!/bin/sh
# check_layers.sh — checks the include graph of kvsim's C sources against the layers of ../shared/DESIGN.md
# "Architecture" (folders show the layers; lower ones never include higher ones).
#
# Layers, bottom to top: common trace gpu_capture sim policies analysis results plots cli; above them tests,
# bench, fuzz and tools, whose own includes are not checked. A file's folder is the first component of its path
# (gpu_capture/cuda/ is gpu_capture, tests/util/ is tests); folders that do not exist are simply absent.
# Every #include "..." of a .c, .h, .cu or .cuh file in a layer folder is resolved relative to the including
# file's folder, else relative to the repository root (the build's -I.); <...> includes, headers outside the
# repository and headers that do not exist are ignored. Two rules:
#   1. a file never includes a header of a higher folder; printed as
#        FILE: includes HEADER (LOWER -> HIGHER)
#   2. no include cycle spans two folders (folder A includes B and B includes A, directly or through other
#      folders); each such cycle is printed as
#        cycle: A -> B -> A
#      followed by one including file per step ("  FILE: includes HEADER").
# Usage: sh tools/check_layers.sh (from the repository root, or anywhere: it finds the root from its own path).
# Exit 0 when clean, 1 with the violations on standard output, 2 when it cannot run.
set -eu

root=$(cd "$(dirname "$0")/.." && pwd) || exit 2
cd "$root" || exit 2

LAYERS="common trace gpu_capture sim policies analysis results plots cli"
TOP="tests bench fuzz tools"

dirs=""
for d in $LAYERS; do
    [ -d "$d" ] && dirs="$dirs $d"
done
[ -n "$dirs" ] || { echo "check_layers.sh: no layer folder under $root" >&2; exit 2; }

# "FILE:LINE:TEXT" for every quoted include of the layer folders' sources (sorted: the output is stable)
# shellcheck disable=SC2086
find $dirs -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) | LC_ALL=C sort |
while IFS= read -r f; do
    grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$f" /dev/null || true
done | LC_ALL=C awk -v layers="$LAYERS" -v top="$TOP" '
function exists(p,    line, r) {
    if (p in seen_path) return seen_path[p]
    r = (getline line < p) >= 0
    close(p)
    seen_path[p] = r
    return r
}
# path normalised against the repository root ("a/./b/../c.h" -> "a/c.h"); "" when it leaves the repository
function normalise(p,    n, parts, out, k, i, res) {
    n = split(p, parts, "/")
    k = 0
    for (i = 1; i <= n; i++) {
        if (parts[i] == "" || parts[i] == ".") continue
        if (parts[i] == "..") { if (k == 0) return ""; k--; continue }
        out[++k] = parts[i]
    }
    res = ""
    for (i = 1; i <= k; i++) res = res (i > 1 ? "/" : "") out[i]
    return res
}
function folder(p) { sub(/\/.*/, "", p); return p }
BEGIN {
    n_layers = split(layers, L, " ")
    for (i = 1; i <= n_layers; i++) rank[L[i]] = i
    n_top = split(top, T, " ")
    for (i = 1; i <= n_top; i++) rank[T[i]] = n_layers + 1
    bad = 0
}
{
    # FILE:LINE:TEXT (source paths hold no colon)
    file = $0; sub(/:.*/, "", file)
    text = $0; sub(/^[^:]*:[^:]*:/, "", text)
    if (!match(text, /"[^"]*"/)) next
    inc = substr(text, RSTART + 1, RLENGTH - 2)
    dir = file; if (!sub(/\/[^\/]*$/, "", dir)) dir = "."
    hdr = normalise(dir "/" inc)
    if (hdr == "" || !exists(hdr)) {
        hdr = normalise(inc)
        if (hdr == "" || !exists(hdr)) next
    }
    a = folder(file); b = folder(hdr)
    if (!(b in rank) || a == b) next
    if (rank[b] > rank[a]) {
        printf "%s: includes %s (%s -> %s)\n", file, hdr, a, b
        bad = 1
    }
    if (rank[b] <= n_layers && !((a, b) in edge)) edge[a, b] = file ": includes " hdr
}
END {
    # reach[x, y]: folder y is reachable from folder x through includes (Floyd-Warshall on at most 9 folders)
    for (k in edge) reach[k] = 1
    for (m = 1; m <= n_layers; m++)
        for (i = 1; i <= n_layers; i++)
            if ((L[i], L[m]) in reach)
                for (j = 1; j <= n_layers; j++)
                    if ((L[m], L[j]) in reach) reach[L[i], L[j]] = 1
    # one cycle through the lowest folder of each strongly connected group and every other member of it
    for (i = 1; i <= n_layers; i++) {
        x = L[i]
        if (x in done) continue
        for (j = i + 1; j <= n_layers; j++) {
            y = L[j]
            if (!((x, y) in reach) || !((y, x) in reach)) continue
            done[y] = 1
            path = x; steps = ""
            cur = x
            for (leg = 1; leg <= 2; leg++) {
                goal = leg == 1 ? y : x
                # breadth-first shortest path cur -> goal over the edges, folders in layer order
                split("", prev); split("", queued)
                q[1] = cur; qh = 1; qt = 1; queued[cur] = 1
                while (qh <= qt && !(goal in prev)) {
                    u = q[qh++]
                    for (v = 1; v <= n_layers; v++)
                        if ((u, L[v]) in edge && !(L[v] in queued)) {
                            queued[L[v]] = 1; prev[L[v]] = u; q[++qt] = L[v]
                        }
                }
                # the folders of the leg and one including file per step, in the order of the steps
                seg = ""; n_seg = 0; w = goal
                while (w != cur) { seg = " -> " w seg; st[++n_seg] = edge[prev[w], w]; w = prev[w] }
                for (s = n_seg; s >= 1; s--) steps = steps "  " st[s] "\n"
                path = path seg
                cur = goal
            }
            printf "cycle: %s\n%s", path, steps
            bad = 1
        }
    }
    exit bad
}'
