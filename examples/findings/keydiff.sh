# keydiff.sh — KeyDiff's findings (FINDINGS.md, KeyDiff; POLICY_SPEC §5.5).
# Sourced by examples/findings.sh (its variables and functions: $KVSIM_BIN, $out, $blocks, $traces, $study_models,
# say, block_line, field_like, budgets_of, ratio, fmt_iv, iv_of, csv_to_tsv, trace_facts).

for trace in $traces; do
    trace_facts "$trace"
    "$KVSIM_BIN" keys "$trace" --scope prompt > "$dir/keys_prompt.txt"
    "$KVSIM_BIN" keys "$trace" --scope all > "$dir/keys_all.txt"
    say "K3/K12 key geometry (medians over heads; rho < 0 = less similar keys get more attention):"
    for s in prompt all; do
        awk -v s="$s" '/^ +median/ { printf "  %-6s rho_sum %s  rho_perq %s  cos(mean k, mean q) %s  cos(k, mean k) %s  norm_cv %s  distinct %s\n", s, $2, $3, $4, $5, $6, $7 }
             /^heads with rho/ { print "         " $0 }
             /^ +[0-9]+ +[0-9]+ / { n++; if ($5 < 0) neg++ }
             END { printf "         heads with cos(mean k, mean q) < 0: %d of %d\n", neg, n }' "$dir/keys_$s.txt" | tee -a "$summary"
    done
    "$KVSIM_BIN" keys "$trace" --scope prompt --budget 33 --policy keydiff --policy keydiff@paper \
        --policy tova@keydiff --policy streaming@keydiff --policy snapkv@keydiff > "$dir/keys_logdet.txt"
    say "K11 retained-key diversity after the prompt at budget 33 (mean logdet over heads, heads where largest):"
    awk '/^retained key diversity/ { on = 1; next } on && NR > 1 && $1 != "policy" { print "  " $0 }' \
        "$dir/keys_logdet.txt" | tee -a "$summary"

    kdb="$dir/keydiff.db"
    "$KVSIM_BIN" replay "$trace" --db "$kdb" --policy keydiff --policy keydiff@paper --policy knorm \
        --policy tova@keydiff --policy snapkv@keydiff --policy streaming@keydiff --policy window \
        --budgets 17,33,65,129 > "$dir/keydiff_runs.txt" 2> "$dir/keydiff_warnings.txt"
    X=$(field_like "$kdb" window "" 65 storage_bytes_mean)
    "$KVSIM_BIN" compare "$kdb" --match mem --at "$X" > "$dir/keydiff_equal_memory.txt"
    say "KeyDiff at equal resident memory ($X bytes per KV head = window at budget 65), out_err_mean:"
    awk '/^(keydiff|knorm|tova|snapkv|streaming|window) / { e = ($5 ~ /^[0-9.]/) ? $5 : "out-of-range"; print "  " $1, e, $NF }' \
        "$dir/keydiff_equal_memory.txt" | tee -a "$summary"

done
