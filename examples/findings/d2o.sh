# d2o.sh — D2O's findings (FINDINGS.md, D2O; POLICY_SPEC §5.3).
# Sourced by examples/findings.sh (its variables and functions: $KVSIM_BIN, $out, $blocks, $traces, $study_models,
# say, block_line, field_like, budgets_of, ratio, fmt_iv, iv_of, csv_to_tsv, trace_facts).

for trace in $traces; do
    trace_facts "$trace"
    "$KVSIM_BIN" attn "$trace" --k 16 > "$dir/attn.txt"
    say "D2/D3 attention density per layer (variance of the column-summed prompt attention, mean over heads; low = dense):"
    awk '/^ +[0-9]+ / { printf "  layer %s %s\n", $1, $2 }' "$dir/attn.txt" | tee -a "$summary"
    ddb="$dir/d2o.db"
    "$KVSIM_BIN" replay "$trace" --db "$ddb" --policy d2o --policy d2o:merge=none --policy d2o:alloc=uniform \
        --policy d2o:variance=raw --policy h2o --policy streaming --policy window \
        --budgets 20%,40%,80% > "$dir/d2o_runs.txt" 2> "$dir/d2o_warnings.txt"
    say "D9/merging: out_err_mean at budgets 20% / 40% / 80% of the prompt (rho = (B-1)/P):"
    for spec in "d2o|variance=minmax,alloc=paper,skip=none,merge=paper" "d2o|merge=none" "d2o|alloc=uniform" \
        "d2o|variance=raw" "h2o|" "streaming|" "window|"; do
        pol=${spec%%|*}
        want=${spec#*|}
        line=$(printf '  %-52s' "$pol${want:+ ($want)}")
        for B in $(budgets_of "$ddb" "$pol"); do line="$line $(printf '%8.4f' "$(field_like "$ddb" "$pol" "$want" "$B" out_err_mean)")"; done
        say "$line"
    done

    say "Merging's cost at the smallest budget (bytes per KV head per step, mean): kv / aux / aux read unfused / written; recall / merged recall:"
    B=$(budgets_of "$ddb" d2o | head -n 1)
    for want in "merge=paper,tau=head" "merge=none"; do
        line=$(printf '  d2o %-22s' "($want)")
        for col in storage_kv_bytes_mean storage_aux_bytes_mean traffic_aux_unfused_bytes_mean write_bytes_mean \
            attn_recall_mean attn_recall_merged_mean; do
            line="$line $(printf '%9.4g' "$(field_like "$ddb" d2o "variance=minmax,alloc=paper,$want" "$B" "$col")")"
        done
        say "$line"
    done

done

# ---- D-2 at equal resident memory, over the prompts ---------------------------------------------------------
d2o_specs="--policy d2o --policy d2o:merge=none --policy d2o:alloc=uniform --policy d2o:variance=raw --policy h2o
    --policy streaming --policy window"
block_line D-2 "| model (traces) | configuration | out_err_mean at 2 KiB | at 4 KiB |"
block_line D-2 "|---|---|---|---|"
for mname in $study_models; do
    db="$out/d2o_$mname.db"
    for t in "$out/prompts/$mname"/*.kvt; do
        # shellcheck disable=SC2086
        "$KVSIM_BIN" replay "$t" --db "$db" $d2o_specs --budgets 10%,20%,40%,80% > /dev/null 2>> "$out/d2o_warnings.txt"
    done
    for X in 2KiB 4KiB; do
        "$KVSIM_BIN" compare "$db" --match mem --at "$X" --across-traces --csv > "$out/d2o_${mname}_$X.csv"
        "$KVSIM_BIN" compare "$db" --match mem --at "$X" --across-traces --pairs --csv > "$out/d2o_${mname}_${X}_pairs.csv"
    done
    "$KVSIM_BIN" compare "$db" --match mem --at 4KiB --across-traces --pairs > "$out/d2o_${mname}_4KiB.txt"
    n_traces=$(ls "$out/prompts/$mname"/*.kvt | wc -l)
    d2o_args="sinks=4,heavy=0.75,beta=0.7,variance=minmax,alloc=paper,merge=paper,tau=head,decide=head,skip=none,gqa=expand"
    for entry in "D2O (the paper's defaults)|d2o ($d2o_args)" \
        "D2O without merging (merge=none)|d2o ($(echo "$d2o_args" | sed 's/merge=paper/merge=none/'))" \
        "D2O with uniform layer budgets (alloc=uniform)|d2o ($(echo "$d2o_args" | sed 's/alloc=paper/alloc=uniform/'))" \
        "D2O with Eq. 4's raw variance (variance=raw)|d2o ($(echo "$d2o_args" | sed 's/variance=minmax/variance=raw/'))" \
        "H2O|h2o (recent=0.5,gqa=expand,prefill=all,window=0,block=0)" "StreamingLLM|streaming (sinks=4)" "window|window"; do
        label=${entry#*|}
        row="| $mname ($n_traces) | ${entry%%|*}"
        for X in 2KiB 4KiB; do
            v=$(csv_to_tsv < "$out/d2o_${mname}_$X.csv" | awk -F'\t' -v want="$label" '
                NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
                $c["label"] == want && !done { print $c["out_err_mean"] "\t" $c["out_err_mean_lo"] "\t" $c["out_err_mean_hi"] "\t" $c["out_err_mean_n"]; done = 1 }')
            row="$row | $(fmt_iv "$(echo "$v" | cut -f1)" "$(echo "$v" | cut -f2)" "$(echo "$v" | cut -f3)" "$(echo "$v" | cut -f4)" "$n_traces")"
        done
        block_line D-2 "$row |"
    done
done
block_line D-2 ""
block_line D-2 "Paired differences of out_err_mean over the same traces (D2O at its defaults minus the other; resolved when the"
block_line D-2 "95% interval excludes 0):"
block_line D-2 ""
for mname in $study_models; do
    for X in 2KiB 4KiB; do
        csv_to_tsv < "$out/d2o_${mname}_${X}_pairs.csv" | awk -F'\t' -v m="$mname" -v X="$X" '
            function short(l) { sub(/ \(.*/, "", l); return l }
            NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
            { d2o = "d2o (sinks=4,heavy=0.75,beta=0.7,variance=minmax,alloc=paper,merge=paper,tau=head,decide=head,skip=none,gqa=expand)"
              if ($c["a"] == d2o && $c["b"] !~ /^d2o/) { o = $c["b"]; s = 1 } else if ($c["b"] == d2o && $c["a"] !~ /^d2o/) { o = $c["a"]; s = -1 } else next
              r = $c["r"] != 0 ? "resolved" : "not resolved"
              lo = s > 0 ? $c["diff_lo"] : -$c["diff_hi"]; hi = s > 0 ? $c["diff_hi"] : -$c["diff_lo"]
              printf "- %s at %s: D2O − %s = %+.3g [%+.3g, %+.3g] over %d traces: %s\n", m, X, short(o), s * $c["diff"], lo, hi,
                  $c["n"], r }' >> "$blocks/D-2.md"
    done
done
