#!/bin/sh
# synckv.sh — SyncKV's tables for one prompt per model, to read every run of a single trace: SyncKV against Quest,
# SnapKV and the Exact-TopK oracle at equal device memory and at equal HBM traffic, the period m (Table 3 / S11: m =
# 1, 5, 10 and "w/o Anticipation") on error and host<->device transfers, and the clustering (own prompt vs fixed
# representatives, calibration clusters) — on the bundled stories260K trace and, when MODEL_DIR (default
# ../shared/models) holds tinystories-656K, on a fresh capture of it with examples/prompt.txt. The numbers of
# examples/FINDINGS.md's SyncKV section come from examples/findings/synckv.sh instead: seven prompts per model with
# intervals, every baseline at SyncKV's memory and traffic, Quest as the SyncKV paper's (@reference).
#
#   sh examples/synckv.sh          outputs in $OUT (default examples/out): synckv_<model>.db, synckv.txt
#
# SyncKV's budget is the device KV per KV head at prefill: `--budgets 50%` is the paper's Mem% = 50 %
# (policies/synckv.c). Mem% below is measured: device KV (storage_kv_bytes_mean) / the full cache's, both averaged
# over the decode steps. h2d and d2h are bytes per step per KV head, averaged over every unit (R units move none).
# $KVSIM_BIN names the kvsim binary.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
KVSIM_BIN=${KVSIM_BIN:-$root/kvsim}
out=${OUT:-$here/out}
models=${MODEL_DIR:-$root/../shared/models}
[ -x "$KVSIM_BIN" ] || { echo "synckv.sh: $KVSIM_BIN not found: run 'make' first" >&2; exit 1; }
mkdir -p "$out"
report="$out/synckv.txt"
: > "$report"

traces="$here/stories260K.kvt"
if [ -d "$models/tinystories-656K" ]; then
    "$KVSIM_BIN" capture --model "$models/tinystories-656K" --prompt-file "$here/prompt.txt" --steps 256 \
        --ignore-eos --quiet --out "$out/tinystories-656K.kvt" > "$out/synckv_capture.log"
    traces="$traces $out/tinystories-656K.kvt"
    # its calibration trace (section 5): the same model on other text
    "$KVSIM_BIN" capture --model "$models/tinystories-656K" --prompt-file "$here/turns.txt" --steps 256 \
        --ignore-eos --quiet --out "$out/tinystories-656K_calib.kvt" >> "$out/synckv_capture.log"
else
    echo "synckv.sh: $models/tinystories-656K not found: only the bundled stories260K trace is studied" >&2
fi

# columns of `kvsim runs --csv` by name (the params field is quoted and holds commas: drop quoted fields first)
table() {
    "$KVSIM_BIN" runs "$1" --csv --summary | sed 's/"[^"]*"/Q/g' | awk -F, -v want="$2" '
        NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
        $col["status"] != "complete" || $col["layer"] != "" { next }
        $col["policy"] == "full" { full[$col["budget_tokens"]] = $col["storage_kv_bytes_mean"] }
        { rows[++n] = $0 }
        END {
            printf "%-8s %-6s %8s %8s %9s %7s %10s %9s %9s\n", "policy", "budget", "err_mean", "recall", "device_B",
                   "Mem%", "hbm_B/st", "h2d_B/st", "d2h_B/st"
            for (r = 1; r <= n; r++) {
                split(rows[r], f, ",")
                if (want != "" && f[col["policy"]] != want) continue
                fb = 0; for (b in full) fb = full[b]
                printf "%-8s %-6s %8.4f %8.4f %9.0f %6.1f%% %10.0f %9.1f %9.1f\n", f[col["policy"]],
                       f[col["budget_tokens"]], f[col["out_err_mean"]], f[col["attn_recall_mean"]],
                       f[col["storage_bytes_mean"]], (fb > 0 ? 100 * f[col["storage_kv_bytes_mean"]] / fb : 0),
                       f[col["traffic_bytes_mean"]], f[col["h2d_bytes_mean"]], f[col["d2h_bytes_mean"]]
            }
        }'
}

# a clusters file (common/head_clusters.h form): one cluster per layer, unit $2 its representative
fixed_clusters() {
    layers=$("$KVSIM_BIN" info "$1" | awk '/^  layers/ { sub(",", "", $2); print $2 }')
    units=$("$KVSIM_BIN" info "$1" | awk '/^  layers/ { for (i = 1; i <= NF; i++) if ($i == "kv") { v = $(i+2); sub(",", "", v); print v } }')
    {
        echo "kvsim-head-clusters 1"
        echo "layers $layers units $units"
        l=0
        while [ "$l" -lt "$layers" ]; do
            x=0
            while [ "$x" -lt "$units" ]; do
                echo "$l $x 0 $([ "$x" -eq "$2" ] && echo 1 || echo 0)"
                x=$((x + 1))
            done
            l=$((l + 1))
        done
    } > "$3"
}

for trace in $traces; do
    model=$(basename "$trace" .kvt)
    db="$out/synckv_$model.db"
    rm -f "$db" "$db-wal" "$db-shm"
    {
        echo "=================== $model ($(basename "$trace"))"
        "$KVSIM_BIN" info "$trace" | sed -n '2,3p;/^positions/p'
    } >> "$report"

    # 1. SyncKV against Quest (fill=tokens: its whole token budget, as these tables were measured), SnapKV and
    #    Exact-TopK, by budget
    "$KVSIM_BIN" replay "$trace" --db "$db" --policy synckv --policy quest:fill=tokens --policy snapkv --policy topk \
        --policy full --budgets 30%,40%,50%,70% --threads 2 > /dev/null 2> "$out/synckv_$model.log"
    # SnapKV keeps every generated token: smaller prompt budgets reach SyncKV's device memory
    "$KVSIM_BIN" replay "$trace" --db "$db" --policy snapkv --budgets 2%,5%,10%,20% --threads 2 > /dev/null \
        2>> "$out/synckv_$model.log"
    {
        echo "--- 1. by budget (synckv: Mem% = budget / prompt; others: their own budget)"
        table "$db" ""
    } >> "$report"

    # 2. at equal device memory and equal HBM traffic: SyncKV's own at 50 %
    at_mem=$("$KVSIM_BIN" runs "$db" --csv --summary | sed 's/"[^"]*"/Q/g' | awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
        $c["layer"] == "" && $c["policy"] == "synckv" && $c["budget_fraction"] == 0.5 { print int($c["storage_bytes_mean"]) }')
    at_tr=$("$KVSIM_BIN" runs "$db" --csv --summary | sed 's/"[^"]*"/Q/g' | awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
        $c["layer"] == "" && $c["policy"] == "synckv" && $c["budget_fraction"] == 0.5 { print int($c["traffic_bytes_mean"]) }')
    {
        echo "--- 2a. at equal device memory ($at_mem B per KV head: synckv at Mem% 50 %)"
        "$KVSIM_BIN" compare "$db" --match mem --at "$at_mem" --metric out_err_mean,attn_recall_mean,traffic_bytes_mean
        echo "--- 2b. at equal HBM traffic ($at_tr B per step per KV head)"
        "$KVSIM_BIN" compare "$db" --match traffic --at "$at_tr" --metric out_err_mean,attn_recall_mean,storage_bytes_mean
    } >> "$report"

    # 3. the period m (Table 3): m = 1, 5, 10 and w/o Anticipation, at Mem% 50 %; nr_recent and delta beside
    dbm="$out/synckv_${model}_m.db"
    rm -f "$dbm" "$dbm-wal" "$dbm-shm"
    "$KVSIM_BIN" replay "$trace" --db "$dbm" --policy synckv@no-suspension --policy synckv --policy synckv@m10 \
        --policy synckv@no-anticipation --policy synckv:delta=1 --policy synckv:nr_recent=since_anticipation \
        --policy full --budgets 50% --threads 2 > /dev/null 2>> "$out/synckv_$model.log"
    {
        echo "--- 3. period m at Mem% 50% (rows: m=1, m=5, m=10, w/o anticipation, m=5 delta=1, m=5 nr_recent=since_anticipation; params in the db)"
        "$KVSIM_BIN" runs "$dbm" --csv --summary | sed 's/"[^"]*"/Q/g' | awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
            $c["layer"] == "" && $c["policy"] == "synckv" { printf "run %-3s err_mean %.4f recall %.4f h2d_B/step %8.1f d2h_B/step %6.1f transfer_B/step %8.1f\n",
                $c["run_id"], $c["out_err_mean"], $c["attn_recall_mean"], $c["h2d_bytes_mean"], $c["d2h_bytes_mean"], $c["transfer_bytes_mean"] }'
    } >> "$report"

    # 4. clustering: the trace's own prompt (default) against each fixed representative (one cluster per layer)
    dbc="$out/synckv_${model}_clusters.db"
    rm -f "$dbc" "$dbc-wal" "$dbc-shm"
    set -- --policy synckv
    for u in 0 1 2 3; do
        fixed_clusters "$trace" "$u" "$out/synckv_${model}_rep$u.txt"
        set -- "$@" --policy "synckv:clusters=$out/synckv_${model}_rep$u.txt"
    done
    "$KVSIM_BIN" replay "$trace" --db "$dbc" "$@" --budgets 50% --threads 2 > /dev/null 2>> "$out/synckv_$model.log"
    {
        echo "--- 4. clusters at Mem% 50%: own prompt (first row), then representative = unit 0, 1, 2, 3 in every layer"
        "$KVSIM_BIN" runs "$dbc" --csv --summary | sed 's/"[^"]*"/Q/g' | awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
            $c["layer"] == "" { printf "run %-3s err_mean %.4f recall %.4f\n", $c["run_id"], $c["out_err_mean"], $c["attn_recall_mean"] }'
    } >> "$report"

    # 5. clusters from a calibration trace (the paper's way, App. B.1: offline, on other text) against the trace's
    # own prompt. N_r = 1, the paper's for 4-KV-head models (§5.1), so `kvsim heads --clusters 1`. Calibration:
    # the bundled multi-turn trace (other stories) for stories260K, a capture on turns.txt for tinystories-656K.
    case "$model" in
    stories260K) calib="$here/stories260K_multiturn.kvt" ;;
    *) calib="$out/${model}_calib.kvt" ;;
    esac
    dbh="$out/synckv_${model}_calib_heads.db"
    dbk="$out/synckv_${model}_calib.db"
    rm -f "$dbh" "$dbh-wal" "$dbh-shm" "$out/synckv_${model}_calib_rows.txt"
    "$KVSIM_BIN" heads "$calib" --db "$dbh" --clusters 1 --clusters-out "$out/synckv_${model}_calib.txt" \
        > /dev/null 2>> "$out/synckv_$model.log"
    for src in prefill "$out/synckv_${model}_calib.txt"; do
        rm -f "$dbk" "$dbk-wal" "$dbk-shm"
        "$KVSIM_BIN" replay "$trace" --db "$dbk" --policy "synckv:clusters=$src" --budgets 30%,50%,70% --threads 2 \
            > /dev/null 2>> "$out/synckv_$model.log"
        [ "$src" = prefill ] && label="own prompt " || label="calibration"
        "$KVSIM_BIN" runs "$dbk" --csv --summary | sed 's/"[^"]*"/Q/g' | awk -F, -v label="$label" 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
            $c["layer"] == "" { printf "%s Mem%% %-4s err_mean %.4f recall %.4f\n", label, $c["budget_fraction"] * 100,
                $c["out_err_mean"], $c["attn_recall_mean"] }' >> "$out/synckv_${model}_calib_rows.txt"
    done
    {
        echo "--- 5. clusters from a calibration trace ($(basename "$calib"), kvsim heads --clusters 1) vs the own prompt"
        printf "representatives (layer: unit) from calibration:"
        awk '$4 == 1 { printf " %s:%s", $1, $2 }' "$out/synckv_${model}_calib.txt"
        echo
        cat "$out/synckv_${model}_calib_rows.txt"
    } >> "$report"
done
cat "$report"
