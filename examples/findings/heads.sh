# heads.sh — head similarity and clustering (FINDINGS.md, SyncKV: head similarity, S4, S12).
# Sourced by examples/findings.sh (its variables and functions: $KVSIM_BIN, $out, $blocks, $traces, $study_models,
# say, block_line, field_like, budgets_of, ratio, fmt_iv, iv_of, csv_to_tsv, trace_facts).

# ---- S4: intralayer against interlayer head similarity, without the pairs that share a KV head -----------------
block_line S4 "| model (traces) | within a layer, all pairs | within, pairs of different KV heads | pairs sharing a KV head | across layers | within (different KV heads) − across (paired) |"
block_line S4 "|---|---|---|---|---|---|"
for mname in $study_models; do
    n_traces=$(ls "$out/prompts/$mname"/*.kvt | wc -l)
    : > "$out/heads_$mname.csv"
    for t in "$out/prompts/$mname"/*.kvt; do
        "$KVSIM_BIN" heads "$t" --db "$out/heads_$mname.db" --csv | awk -F, '$1 == "query" && ($2 == "within" || $2 == "across")' \
            >> "$out/heads_$mname.csv"
    done
    within=$(awk -F, '$2 == "within"' "$out/heads_$mname.csv")
    across=$(awk -F, '$2 == "across"' "$out/heads_$mname.csv")
    a=$(echo "$within" | cut -d, -f5 | iv_of "S4 $mname within all")
    o=$(echo "$within" | cut -d, -f6 | iv_of "S4 $mname within other kv")
    sk=$(echo "$within" | cut -d, -f7 | iv_of "S4 $mname within same kv")
    x=$(echo "$across" | cut -d, -f5 | iv_of "S4 $mname across")
    d=$(awk -F, '$2 == "within" { w[++i] = $6 } $2 == "across" { x[++j] = $5 }
        END { for (m = 1; m <= i; m++) print w[m], x[m] }' "$out/heads_$mname.csv" |
        iv_of "S4 $mname within-other-kv minus across" --paired)
    block_line S4 "| $mname ($n_traces) | $a | $o | $sk | $x | $d |"
done

