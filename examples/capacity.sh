#!/bin/sh
# capacity.sh — a capacity-planning study with `kvsim plan` (analysis/plan.h): the papers' figures on presets,
# then a trace's MEASURED storage profiles carried to a real model.
#
#   sh examples/capacity.sh [TRACE]     default: the bundled examples/stories260K.kvt
#
# 1. Presets (POLICY_SPEC §7 G3): Llama-3.1-70B at batch 32 x 32K in fp16 (RocketKV §1: 343.6 GB = 320.0 GiB),
#    OPT-30B at batch 128 x 1024 (D2O §1: 180.4 GB), Llama-3.1-70B/405B at batch 256 x 128K (MorphKV Fig. 1:
#    10.0 / 15.75 TiB), and D2O Table 5's max-batch comparison on Llama-3-8B with one A100-80G: full cache
#    against H2O with one set per KV head (h2o:gqa=mean: a constant-size policy) at budget 256, D2O's budget =
#    prompt of the first setting 256+1024 (5x in theory, 4x observed there; tests/test_plan.c checks every setting
#    at its own budget = prompt). H2O's default layout (gqa=expand, a set per query head) would hold 4 sets per
#    KV head on Llama-3-8B's groups of 4, as its replay measures.
# 2. Measured: kvsim replay of TRACE with H2O and SnapKV (per-step series kept), then each run's profile planned
#    on Llama-3.1-8B on one 80 GB GPU: 8K context + 8K response, batch 16, with the plots. The budget is 64
#    tokens per KV head, or half the trace's prompt when the prompt is shorter than 64: a prompt-only policy
#    (SnapKV) compresses only a prompt at least as long as its budget, and the plan fits each run on its steady
#    state (an every-step policy's steps with the cache full, a prompt-only policy's decode steps), refusing a run
#    that never reaches it. The plan prints the steps its fit used.
# 3. Time (`kvsim plan --hw`, analysis/plan_time.h): the shared models' measured policies (TRACE, and a trace of
#    ../shared/models/tinystories-656K captured here when that model is present: 128 generated tokens, a second
#    or so) replayed with H2O, SnapKV, Quest and SyncKV at budget 64, each run's profile (storage, reads, host
#    transfers) scaled to Llama-3.1-8B in bf16 on one H100 SXM at 8K + 8K: a latency/throughput table (TTFT, TPOT,
#    decode tokens/s at batch 16, the throughput-maximising batch that fits and its tokens/s) at the roofline bound
#    (mbu = mfu = 1; docs/REFERENCE.md "Time in plans" has the factors published servers reach), and the
#    tokens/s-vs-batch plot of one of them. Skipped with CAPACITY_TIME=0.
# Outputs go to $OUT (default examples/out): capacity.db (runs and plans), capacity_*.txt, capacity_*.png.
# $KVSIM_BIN names the kvsim binary; $KVSIM_MODELS the shared models (default ../shared/models).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
KVSIM_BIN=${KVSIM_BIN:-$root/kvsim}
out=${OUT:-$here/out}
trace=${1:-$here/stories260K.kvt}
[ -x "$KVSIM_BIN" ] || { echo "capacity.sh: $KVSIM_BIN not found: run 'make' first" >&2; exit 1; }
mkdir -p "$out"
db=$out/capacity.db
rm -f "$db" "$db-wal" "$db-shm"

echo "== R2: Llama-3.1-70B, batch 32, 32K context, fp16 (8 x 80 GB)"
"$KVSIM_BIN" plan --model Llama-3.1-70B --batch 32 --context 32768 --gpu-mem 80GB --gpus 8 --db "$db" \
    | tee "$out/capacity_r2.txt"
echo "== D1: OPT-30B, batch 128, 1024 tokens"
"$KVSIM_BIN" plan --model OPT-30B --batch 128 --context 1024 --db "$db" | tee "$out/capacity_d1.txt"
echo "== M22: batch 256 at 128K"
for m in Llama-3.1-70B Llama-3.1-405B; do
    "$KVSIM_BIN" plan --model "$m" --batch 256 --context 131072 --db "$db" | tee "$out/capacity_m22_$m.txt"
done
echo "== D10: max batch, full cache vs H2O (one set per KV head) at budget 256, Llama-3-8B on one A100-80G"
"$KVSIM_BIN" plan --model Llama-3-8B --gpu-mem 80GiB --policy h2o:gqa=mean --budget 256 --context 256 \
    --response 1024 --settings 256+1024,512+2048,1024+4096,2048+8192 --db "$db" \
    --plot-batch "$out/capacity_d10_batch.png" | tee "$out/capacity_d10.txt"

# The first prompt's length, from the trace header (`kvsim info`: "... prompt length before the first generated
# token P)").
prompt=$("$KVSIM_BIN" info "$trace" | sed -n 's/.*before the first generated token \([0-9][0-9]*\)).*/\1/p')
[ -n "$prompt" ] || { echo "capacity.sh: cannot read the prompt length of $trace" >&2; exit 1; }
budget=64
if [ "$prompt" -lt "$budget" ]; then
    budget=$((prompt / 2))
    [ "$budget" -ge 1 ] || budget=1
    echo "capacity.sh: the trace's prompt has $prompt tokens (< 64): budget $budget, so that SnapKV compresses it"
fi
echo "== measured profiles from $trace at budget $budget"
"$KVSIM_BIN" replay "$trace" --db "$db" --policy h2o --policy snapkv --budgets "$budget" --series-every 1 --threads 2
for p in h2o snapkv; do
    echo "== $p's measured profile planned on Llama-3.1-8B, one 80 GB GPU, 8K + 8K, batch 16"
    "$KVSIM_BIN" plan --model Llama-3.1-8B --gpu-mem 80GB --profile "$db" --policy "$p" --budget "$budget" \
        --context 8192 --response 8192 --batch 16 --db "$db" \
        --plot-memory "$out/capacity_${p}_memory.png" --plot-batch "$out/capacity_${p}_batch.png" \
        | tee "$out/capacity_$p.txt"
done
# ---- 3. time: the measured policies of the shared models on Llama-3.1-8B, one H100 SXM ----
if [ "${CAPACITY_TIME:-1}" != 0 ]; then
    models=${KVSIM_MODELS:-$(dirname "$root")/shared/models}
    tdb=$out/capacity_time.db
    rm -f "$tdb" "$tdb-wal" "$tdb-shm"
    traces=$trace
    if [ -d "$models/tinystories-656K" ]; then
        "$KVSIM_BIN" capture --model "$models/tinystories-656K" --prompt "$(head -c 600 "$here/prompt.txt")" \
            --steps 128 --ignore-eos --threads 2 --out "$out/capacity_tinystories.kvt" >/dev/null 2>&1 &&
            traces="$traces $out/capacity_tinystories.kvt"
    fi
    for t in $traces; do
        tp=$("$KVSIM_BIN" info "$t" | sed -n 's/.*before the first generated token \([0-9][0-9]*\)).*/\1/p')
        tb=64
        [ "$tp" -ge 64 ] || tb=$((tp / 2))
        "$KVSIM_BIN" replay "$t" --db "$tdb" --policy h2o --policy snapkv --policy quest --policy synckv \
            --budgets "$tb" --series-every 1 --threads 2 >/dev/null
    done
    echo "== time: measured policies scaled to Llama-3.1-8B (bf16 weights and KV) on 1 x H100-SXM, 8192 + 8192 tokens"
    echo "   (roofline bound: mbu = mfu = 1; TTFT of the batch's prompts, TPOT the mean decode step, tokens/s = batch / TPOT)"
    # one row per run: the plan's latency table (text) gives the planned series' row, marked '*', and the full cache's
    "$KVSIM_BIN" runs "$tdb" | awk '$1 ~ /^[0-9]+$/ && /@/ {t = $0; sub(/@.*/, "", t); n = split(t, w, " "); print $1, w[n]}' \
        > "$out/capacity_time_runs.txt"
    {
        printf '%-18s %-10s %6s %10s %10s %12s %10s %14s\n' "trace model" policy budget "TTFT ms" "TPOT ms" \
            "tokens/s@16" "best batch" "tokens/s@best"
        first=1
        while read -r r model; do
            "$KVSIM_BIN" plan --model Llama-3.1-8B --kv-dtype bf16 --weights bf16 --hw H100-SXM --profile "$tdb" \
                --run "$r" --context 8192 --response 8192 --batch 16 --db "$tdb" 2>/dev/null |
                sed -n '/^latency at batch/,/^(TTFT/p' |
                awk -v model="$model" -v first="$first" '
                    /^\* measured: / || (first == 1 && /^  full cache /) {
                        name = "full cache"; m = "-"; bud = "-"
                        if ($1 == "*") { name = $3; sub(/,$/, "", name); m = model; bud = $5 }
                        printf "%-18s %-10s %6s %10s %10s %12s %10s %14s\n", m, name, bud, $(NF - 7), $(NF - 5),
                            $(NF - 3), $(NF - 1), $NF
                    }'
            first=0
        done < "$out/capacity_time_runs.txt"
    } | tee "$out/capacity_time.txt"
    last=$(awk 'END {print $1}' "$out/capacity_time_runs.txt")
    [ -n "$last" ] && "$KVSIM_BIN" plan --model Llama-3.1-8B --kv-dtype bf16 --weights bf16 --hw H100-SXM \
        --profile "$tdb" --run "$last" --context 8192 --response 8192 --batch 16 \
        --plot-throughput "$out/capacity_time_throughput.png" >/dev/null 2>&1 || true
fi
echo "capacity.sh: plans and runs in $db; tables and plots in $out"
