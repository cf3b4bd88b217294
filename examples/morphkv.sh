#!/bin/sh
# morphkv.sh — MorphKV's three paper settings (the presets) replayed on a trace shorter than the paper's
# caches, beside H2O and TOVA (policies/morphkv.c, header "Scaling to a short trace").
#
#   sh examples/morphkv.sh [TRACE]      default: the bundled examples/stories260K.kvt (495 positions,
#                                       239 prompt + 256 generated)
#
# The presets are the paper's settings without their budget:
#   morphkv@longwriter    R=30,  sum fusion (§5.1), paper C_tot=600: --budgets 601 on a long enough trace
#   morphkv@longgenbench  R=200, max fusion (§5.2), paper C_tot=4K:  --budgets 4097
#   morphkv@longbench     R=32,  sum fusion (§5.3), paper C_tot=2K:  --budgets 2049
# kvsim's budget B counts the attended tokens, the current one included, so C_tot = B - 1. On a short trace
# those C_tot never evict (and R=200 is most of the context). The rule: choose the budgets for the trace as
# for any other policy (here 10%, 25% and 50% of the prompt); each preset carries its paper_ctot, and where
# the run's C_tot is smaller R is scaled by C_tot/paper_ctot (rounded, at least 1), keeping the paper's share
# of the cache for the recent window. kvsim replay warns with the R it used and the runs table repeats it
# (flag N, the note after the params). `morphkv@longwriter:paper_ctot=0` keeps R=30 as given.
#
# The attention profiles of the R window queries are auxiliary state (G R (C_tot+1) fp32 values with
# profile=rows, G R (d+1) with profile=qz): the last table shows the resident KV and aux bytes per KV head
# apart (runs --csv: storage_kv_bytes_* and storage_aux_bytes_*).
# Outputs go to $OUT (default examples/out): morphkv.db. $KVSIM_BIN names the kvsim binary.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
KVSIM_BIN=${KVSIM_BIN:-$root/kvsim}
out=${OUT:-$here/out}
trace=${1:-$here/stories260K.kvt}
[ -x "$KVSIM_BIN" ] || { echo "morphkv.sh: $KVSIM_BIN not found: run 'make' first" >&2; exit 1; }
mkdir -p "$out"
db="$out/morphkv.db"
rm -f "$db" "$db-wal" "$db-shm"

"$KVSIM_BIN" replay "$trace" --db "$db" \
    --policy morphkv@longwriter --policy morphkv@longgenbench --policy morphkv@longbench \
    --policy morphkv@longwriter:profile=qz --policy h2o:gqa=mean --policy tova \
    --budgets 10%,25%,50%

echo "== resident bytes per KV head: KV and auxiliary (attention profiles), mean over decode steps"
"$KVSIM_BIN" runs "$db" --csv --summary | sed 's/"[^"]*"//g' | awk -F, '
    NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i
              printf "%4s %-8s %6s %12s %12s %10s\n", "run", "policy", "budget", "kv_bytes", "aux_bytes", "out_err"
              next }
    { printf "%4s %-8s %6s %12.0f %12.0f %10.4f\n", $col["run_id"], $col["policy"], $col["budget_tokens"],
             $col["storage_kv_bytes_mean"], $col["storage_aux_bytes_mean"], $col["out_err_mean"] }'
echo "morphkv.sh: results in $db"
