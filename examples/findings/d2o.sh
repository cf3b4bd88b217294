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
              r = $c["resolved"] != 0 ? "resolved" : "not resolved"
              lo = s > 0 ? $c["diff_lo"] : -$c["diff_hi"]; hi = s > 0 ? $c["diff_hi"] : -$c["diff_lo"]
              printf "- %s at %s: D2O − %s = %+.3g [%+.3g, %+.3g] over %d traces: %s\n", m, X, short(o), s * $c["diff"], lo, hi,
                  $c["n"], r }' >> "$blocks/D-2.md"
    done
done

# ---- D-1: attention density per layer over the prompts; D-5 (D14) on the same heads ----------------------------------
# `kvsim attn --csv` per prompt trace: one F_v (colsum_var) per (layer, query head). A trace's sample of a layer is
# the mean over its heads; the staircase is tested by the paired difference of adjacent layers over the same traces.
# D-5 (App. A.9's example) takes every head of a trace with the trace's prompt length (d2o_a9.awk says how).
block_line D-1 "| model (traces) | layer | F_v, mean over heads | − the layer before (paired) |"
block_line D-1 "|---|---:|---|---|"
block_line D-5 "| model (traces) | Q_uniform / Q_opt | Q_Eq.28 / Q_opt | Q_Eq.28 − Q_uniform, over Q_opt (paired) | heads the optimum leaves empty (mean) | check of Eq. 35-36: marginal gains − μ, ln μ by bisection − closed form (all traces) |"
block_line D-5 "|---|---|---|---|---|---|"
for mname in $study_models; do
    n_traces=$(n_traces_of "$mname")
    fv="$out/attn_$mname.txt"
    a9="$out/a9_$mname.txt"
    : > "$fv"
    : > "$a9"
    i=0
    for t in "$out/prompts/$mname"/*.kvt; do
        i=$((i + 1))
        "$KVSIM_BIN" attn "$t" --csv > "$out/attn_one.csv"
        awk -F, -v i="$i" 'NR > 1 { s[$1] += $3; c[$1]++ } END { for (l in s) print i, l, s[l] / c[l] }' "$out/attn_one.csv" |
            sort -k2,2n >> "$fv"
        Pt=$("$KVSIM_BIN" info "$t" | awk '/^positions/ { sub(/\(/, "", $3); print $3 }')
        awk -F, 'NR > 1 { print $3 }' "$out/attn_one.csv" | awk -v P="$Pt" -v rho=0.2 -f "$here/findings/d2o_a9.awk" >> "$a9"
    done
    n_layers=$(awk '{ print $2 }' "$fv" | sort -n | uniq | wc -l)
    for l in $(seq 0 $((n_layers - 1))); do
        v=$(awk -v l="$l" '$2 == l { print $3 }' "$fv" | iv_of "D-1 $mname layer $l")
        d="-"
        [ "$l" -eq 0 ] || d=$(awk -v l="$l" '$2 == l { a[$1] = $3 } $2 == l - 1 { b[$1] = $3 } END { for (i in a) print i, a[i], b[i] }' "$fv" |
            sort -n | cut -d' ' -f2- | iv_of "D-1 $mname layer $l - $((l - 1))" --paired)
        block_line D-1 "| $mname ($n_traces) | $l | $v | $d |"
    done
    d=$(awk -v L="$((n_layers - 1))" '$2 == L { a[$1] = $3 } $2 == 0 { b[$1] = $3 } END { for (i in a) print i, a[i], b[i] }' "$fv" |
        sort -n | cut -d' ' -f2- | iv_of "D-1 $mname last - first" --paired)
    block_line D-1 "| $mname ($n_traces) | last − first | | $d |"
    u=$(cut -d' ' -f1 "$a9" | iv_of "D-5 $mname uniform")
    e=$(cut -d' ' -f2 "$a9" | iv_of "D-5 $mname eq28")
    pd=$(awk '{ print $2, $1 }' "$a9" | iv_of "D-5 $mname eq28-uniform" --paired)
    cl=$(awk '{ s += $3 } END { printf "%.3g", s / NR }' "$a9")
    # the formula's check, as a verdict (the residuals themselves are rounding noise that differs between machines)
    ck=$(awk '{ if ($4 > g) g = $4; if ($5 > c) c = $5 } END { if (g < 1e-9 && c < 1e-9) print "both below 1e-9"; else printf "FAILED: %.3g, %.3g\n", g, c }' "$a9")
    heads=$(awk -F, 'NR > 1' "$out/attn_one.csv" | wc -l)
    block_line D-5 "| $mname ($n_traces traces, $heads heads each) | $u | $e | $pd | $cl | $ck |"
done

# ---- D-3 (D1): the KV cache of OPT-30B at 1024 tokens and batch 128, by kvsim plan and by the shape -------------
shape=$("$KVSIM_BIN" plan --list-presets | awk '$1 == "OPT-30B" { print $2, $4, $5 }')
kv_plan=$("$KVSIM_BIN" plan --model OPT-30B --batch 128 --context 1024 --csv |
    awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next } $1 == "full" && $c["context"] == 1024 && $c["response"] == 0 { print $c["total_bytes"]; exit }')
echo "$shape $kv_plan" | awk '{ L = $1; h = $2; d = $3; tok = 2 * L * h * d * 2; b = tok * 1024 * 128
    printf "- D1, OPT-30B (%d layers, %d KV heads, head_dim %d, fp16): 2 · %d · %d · %d · 2 B = %.0f B per token; × 1024 tokens × 128 sequences = %.0f B", L, h, d, L, h, d, tok, b
    printf " = %.1f GB = %.1f GiB; `kvsim plan --model OPT-30B --batch 128 --context 1024`: %.0f B (%s)\n", b / 1e9, b / 2^30, $4, (b == $4 ? "the same" : "DIFFERENT") }' \
    > "$blocks/D-3.md"

# ---- D-4 (D10): max batch of Table 5 (Llama-3-8B on an 80 GB A100, budget = prompt length) by kvsim plan ------------------
block_line D-4 "| prompt+gen | budget | full cache | one set per KV head (gqa=sum) | ratio | one set per query head (D2O's and H2O's gqa=expand) | ratio | (P+G)/B |"
block_line D-4 "|---|---:|---:|---:|---:|---:|---:|---:|"
for s in 256+1024 512+2048 1024+4096 2048+8192; do
    Pp=${s%+*}
    Gg=${s#*+}
    for pol in d2o:gqa=sum d2o; do
        "$KVSIM_BIN" plan --model Llama-3-8B --gpu-mem 80GB --settings "$s" --policy "$pol" --budget "$Pp" --csv | csv_to_tsv |
            awk -F'\t' -v P="$Pp" -v G="$Gg" -v pol="$pol" 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
                $c["context"] == P && $c["response"] == G && ($1 == "full" || $c["series"] ~ /^d2o/) { print pol, $1, $c["max_batch"] }'
    done > "$out/d10_$Pp.txt"
    full=$(awk '$2 == "full" { print $3; exit }' "$out/d10_$Pp.txt")
    sum=$(awk '$1 == "d2o:gqa=sum" && $2 != "full" { print $3 }' "$out/d10_$Pp.txt")
    exp=$(awk '$1 == "d2o" && $2 != "full" { print $3 }' "$out/d10_$Pp.txt")
    block_line D-4 "| $s | $Pp | $full | $sum | $(ratio "$sum" "$full") | $exp | $(ratio "$exp" "$full") | $(ratio $((Pp + Gg)) "$Pp") |"
done
