# calibration.sh — does replay order policies as closed-loop decoding does (FINDINGS.md, Closed loop).
# Sourced by examples/findings.sh (its variables and functions: $KVSIM_BIN, $out, $blocks, $traces, $study_models,
# say, block_line, field_like, budgets_of, ratio, fmt_iv, iv_of, csv_to_tsv, trace_facts).

# ---- The closed-loop calibration over the prompts (examples/closed_loop.sh; --check / --update, or
# FINDINGS_CLOSED_LOOP=1; about 30 s on two cores) ------------------------------------------------------------------
if [ "$mode" != run ] || [ "${FINDINGS_CLOSED_LOOP:-0}" = 1 ]; then
    KVSIM_BIN="$KVSIM_BIN" CLOSED_LOOP_OUT="$out/closed_loop" sh "$here/closed_loop.sh" 8,16,32 5 > "$out/closed_loop.log" 2>&1
    block_line closed_loop "| model | offline × closed loop | n | ρ(out_err_mean, mean KL) | ρ(out_err_mean, top-1 agreement) | ρ(out_err_mean, Δ perplexity) |"
    block_line closed_loop "|---|---|---|---|---|---|"
    awk '/^model / { m = $2; sub(/:$/, "", m) }
         /^  budget [0-9]+: / { sec = "within budget " $2; sub(/:$/, "", sec); n = $0; sub(/.*; n = /, "", n); sub(/, [0-9]+ policies$/, "", n) }
         /^pooled over budgets/ { sec = "pooled over budgets (mostly the budget axis)"; n = "all pairs" }
         /^at equal measured memory/ { sec = "" }
         /^    out_err_mean / && sec != "" { printf "| %s | %s | %s | %s %s %s | %s %s %s | %s %s %s |\n", m, sec, n,
             $2, $3, $4, $5, $6, $7, $8, $9, $10; sec = "" }' "$out/closed_loop/calibrate.txt" |
        sort -s -t'|' -k2,2 >> "$blocks/closed_loop.md" # the models in name order, whichever finished first
fi
