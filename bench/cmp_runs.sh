#!/bin/sh
# cmp_runs.sh — are two kvsim builds' replay numbers identical? (A speed change keeps every number; sim/BENCH.md
# "Comparing two builds".)
# Replays 24 policy configurations at budgets 16,48,100,200 on a generated trace, fp32 and fp16, with the default
# kernels and with KVS_SIMD=scalar, through each binary, and compares `kvsim runs DB --all --csv` field by field
# (all but wall_seconds and created_at). SynCKV fails at budgets 16 and 48 on this trace on both sides
# ("infeasible", its §8.4a check): those runs are recorded as failed and compared too.
# Usage: sh bench/cmp_runs.sh KVSIM_A KVSIM_B   (from the repository root; builds build/bench/gen_cmp_trace)
# Exit status: 0 all identical, 1 a difference, 2 bad usage.
set -eu
[ $# -eq 2 ] || { echo "usage: sh bench/cmp_runs.sh KVSIM_A KVSIM_B" >&2; exit 2; }
A=$1 B=$2
make -s build/bench/gen_cmp_trace
D=$(mktemp -d /tmp/kvs_cmp_XXXXXX)
trap 'rm -rf "$D"' EXIT
build/bench/gen_cmp_trace "$D/t32.kvt"
build/bench/gen_cmp_trace "$D/t16.kvt" f16
P="--policy full --policy window --policy streaming --policy h2o --policy h2o:gqa=mean --policy tova --policy topk
   --policy topk:gqa=head --policy snapkv --policy knorm --policy quest --policy quest@reference --policy keydiff
   --policy keydiff:anchor=raw --policy scissorhands --policy pyramidkv --policy adakv --policy sparq
   --policy rocketkv --policy hsa --policy keyformer --policy morphkv --policy d2o --policy synckv"
rc=0
for tr in t32 t16; do
    for simd in "" scalar; do
        for side in a b; do
            bin=$A; [ $side = b ] && bin=$B
            # a non-zero exit is expected (SynCKV's infeasible budgets); the databases are compared
            KVS_SIMD=$simd $bin replay "$D/$tr.kvt" --db "$D/$side.db" $P --budgets 16,48,100,200 --threads 2 \
                --no-progress >/dev/null 2>"$D/$side.err" || true
            $bin runs "$D/$side.db" --all --csv >"$D/$side.csv"
            rm -f "$D/$side.db"
        done
        if ! /usr/bin/python3 - "$D/a.csv" "$D/b.csv" "$tr" "${simd:-default}" <<'PY'
import csv, sys
a = list(csv.reader(open(sys.argv[1]))); b = list(csv.reader(open(sys.argv[2])))
h = a[0]; skip = {i for i, x in enumerate(h) if x in ("wall_seconds", "created_at")}
fields = diff = 0
if len(a) != len(b) or len(a) < 2:
    print("trace %s, kernels %s: %d rows against %d" % (sys.argv[3], sys.argv[4], len(a) - 1, len(b) - 1)); sys.exit(1)
for ra, rb in zip(a[1:], b[1:]):
    for i, (x, y) in enumerate(zip(ra, rb)):
        if i in skip: continue
        fields += 1
        if x != y:
            diff += 1
            if diff <= 5: print("  %s: %s against %s" % (h[i], x, y))
print("trace %s, kernels %s: %d rows, %d fields, %d different" % (sys.argv[3], sys.argv[4], len(a) - 1, fields, diff))
sys.exit(1 if diff else 0)
PY
        then rc=1; fi
    done
done
exit $rc
