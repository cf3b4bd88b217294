# intro.sh — the traces every multi-prompt block of FINDINGS.md is measured on (its introduction: models, prompt
# traces, prompt lengths, positions, shapes).
# Sourced by examples/findings.sh (its variables and functions: $KVSIM_BIN, $out, $blocks, $traces, $study_models,
# say, block_line, field_like, budgets_of, ratio, fmt_iv, iv_of, csv_to_tsv, trace_facts, n_traces_of).

block_line traces "| model | prompt traces | prompt tokens | positions | layers | heads / KV heads (G) | head_dim d |"
block_line traces "|---|---:|---|---|---:|---|---:|"
for mname in $study_models; do
    for t in "$out/prompts/$mname"/*.kvt; do
        trace_facts "$t"
        L=$(awk '/layers/ && /query heads/ { v = $2; gsub(/,/, "", v); print v }' "$dir/info.txt")
        H=$(awk '/layers/ && /query heads/ { v = $5; gsub(/,/, "", v); print v }' "$dir/info.txt")
        echo "$P $N $L $H $G $d"
    done | sort -n | awk -v m="$mname" '{ n++; if (n == 1 || $1 < p0) p0 = $1; if ($1 > p1) p1 = $1
            if (n == 1 || $2 < n0) n0 = $2; if ($2 > n1) n1 = $2; L = $3; H = $4; G = $5; d = $6 }
        END { printf "| %s | %d | %d-%d | %d-%d | %d | %d / %d (%d) | %d |\n", m, n, p0, p1, n0, n1, L, H, H / G, G, d }' \
        >> "$blocks/traces.md"
done
