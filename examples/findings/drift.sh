# drift.sh — attention drift (FINDINGS.md, SyncKV: attention drift, S1-S3; POLICY_SPEC §5.4).
# Sourced by examples/findings.sh (its variables and functions: $KVSIM_BIN, $out, $blocks, $traces, $study_models,
# say, block_line, field_like, budgets_of, ratio, fmt_iv, iv_of, csv_to_tsv, trace_facts).

# ---- S1: drift against chance, over the prompts ----------------------------------------------------------------
block_line S1 "| model (traces) | k | window score | last-query score | chance (random top-k) | last-query − chance (paired) |"
block_line S1 "|---|---:|---|---|---|---|"
for mname in $study_models; do
    n_traces=$(ls "$out/prompts/$mname"/*.kvt | wc -l)
    : > "$out/drift_$mname.csv"
    for t in "$out/prompts/$mname"/*.kvt; do
        "$KVSIM_BIN" drift "$t" --db "$out/drift_$mname.db" --k 16,32,64 --csv | awk -F, '$1 == "head" && $3 == "all" && $4 == 50' \
            >> "$out/drift_$mname.csv"
    done
    for k in 16 32 64; do
        rows=$(awk -F, -v k="$k" '$2 == k' "$out/drift_$mname.csv")
        [ -n "$rows" ] || continue
        w=$(echo "$rows" | cut -d, -f5 | iv_of "S1 $mname k=$k window")
        l=$(echo "$rows" | cut -d, -f6 | iv_of "S1 $mname k=$k last")
        c=$(echo "$rows" | cut -d, -f7 | iv_of "S1 $mname k=$k chance")
        d=$(echo "$rows" | awk -F, '{ print $6, $7 }' | iv_of "S1 $mname k=$k last-chance" --paired)
        block_line S1 "| $mname ($n_traces) | $k | $w | $l | $c | $d |"
    done
done

