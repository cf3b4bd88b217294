# rocketkv.sh — RocketKV's, HSA's, Quest's, SparQ's and RocketKV-MT's findings (FINDINGS.md, RocketKV;
# POLICY_SPEC §5.2, ../shared/papers/rocketkv.txt).
# Sourced by examples/findings.sh (its variables and functions: $KVSIM_BIN, $out, $blocks, $traces, $study_models,
# say, block_line, field_like, budgets_of, ratio, fmt_iv, iv_of, csv_to_tsv, trace_facts, n_traces_of).
#
# Blocks: R-1 (error by token budget and at equal traffic, paired differences), R-2 (top-k union), R-3 (KV pairs
# read per step / t), R-4 (RocketKV-MT on multi-turn traces), R-arith (R1, R2, R6, R7: the paper's arithmetic).
# Every measured block is over the seven prompt traces of each model (one prompt is one sample), or for R-4 over
# five multi-turn traces per model (examples/turns.txt and examples/prompts/turns/). kvsim's budget for these
# methods is the paper's token budget t (KV pairs read per step per KV head, the estimate included).

# ---- helpers (rk_: this section's own) ---------------------------------------------------------------------------

# rk_compare NAME DB ARGS...: `kvsim compare DB ARGS --csv` as tab-separated fields in $out/NAME.tsv (converted once:
# the cells below read it many times)
rk_compare() {
    rk_name=$1 rk_db=$2
    shift 2
    "$KVSIM_BIN" compare "$rk_db" "$@" --csv | csv_to_tsv > "$out/$rk_name.tsv"
}

# rk_cell NAME POLICY METRIC TOTAL: the mean [lo, hi] of METRIC for POLICY's group in an across-traces comparison
# written by rk_compare (fmt_iv; "-" when no trace has a value there, "- (out of range on N)" when N traces' runs do
# not reach that cost); $rk_scale (default 1) divides the three numbers.
rk_cell() {
    rk_total=$4
    # shellcheck disable=SC2046 # five numeric fields
    set -- $(awk -F'\t' -v want="$2" -v m="$3" -v s="${rk_scale:-1}" '
        NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
        $c["policy"] == want { if ($c[m "_n"] == "" || $c[m "_n"] == 0) print "- - - 0", $c["n_out_of_range"] + 0
            else printf "%.17g %.17g %.17g %d 0\n", $c[m] / s, $c[m "_lo"] / s, $c[m "_hi"] / s, $c[m "_n"]
            exit }' "$out/$1.tsv")
    if [ $# -lt 5 ]; then echo "-"; elif [ "$5" -gt 0 ]; then echo "- (out of range on $5)"
    else fmt_iv "$1" "$2" "$3" "$4" "$rk_total"; fi
}

# rk_pair NAME A B: the paired difference A − B of the first metric in a `--pairs` comparison written by rk_compare,
# "d [lo, hi] (n), resolved|not resolved"; A and B are policy names (the first word of the labels), "-" when no
# trace has both.
rk_pair() {
    awk -F'\t' -v A="$2" -v B="$3" '
        function pol(l) { sub(/ .*/, "", l); return l }
        NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
        { a = pol($c["a"]); b = pol($c["b"])
          if (a == A && b == B) s = 1; else if (a == B && b == A) s = -1; else next
          lo = s > 0 ? $c["diff_lo"] : -$c["diff_hi"]; hi = s > 0 ? $c["diff_hi"] : -$c["diff_lo"]
          found = 1
          if ($c["n"] == 0 || $c["diff"] == "") { print "-"; exit }
          printf "%+.3g [%+.3g, %+.3g] (n = %d), %s\n", s * $c["diff"], lo, hi, $c["n"], $c["resolved"] != 0 ? "resolved" : "not resolved"
          exit }
        END { if (!found) print "-" }' "$out/$1.tsv"
}

# rk_label POLICY: the name a table row gives a policy
rk_label() {
    case $1 in
        topk) echo "Exact-TopK (oracle)" ;; rocketkv) echo RocketKV ;; rocketkv_mt) echo RocketKV-MT ;; hsa) echo HSA ;;
        quest) echo "Quest (\`fill=tokens\`)" ;; sparq) echo SparQ ;; h2o) echo H2O ;; tova) echo TOVA ;;
        window) echo window ;; streaming) echo StreamingLLM ;; *) echo "$1" ;;
    esac
}

# rk_pair_bytes TRACE: the bytes of one fp16 K/V pair of one KV head of TRACE's model (2 x head_dim x 2), the unit
# of "KV pairs read per step" (the replay's kv_bytes is fp16's 2 by default)
rk_pair_bytes() {
    "$KVSIM_BIN" info "$1" | awk '/head_dim/ { for (i = 1; i <= NF; i++) if ($i == "head_dim") { v = $(i + 1); gsub(/[^0-9]/, "", v); print 4 * v } }'
}

# rk_col DB POLICY BUDGET COL [TRACE]: one column of `kvsim runs DB --csv --summary` for the run of POLICY at BUDGET
# (of TRACE when given): the single-trace summary lines below
rk_col() {
    "$KVSIM_BIN" runs "$1" --csv --summary --policy "$2" --budget "$3" ${5:+--trace "$5"} | csv_to_tsv |
        awk -F'\t' -v col="$4" 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next } { print $c[col]; exit }'
}

# ---- the single 256-step traces: summary.txt's lines (stage 1 keeps the whole prompt there: RocketKV = HSA) ------
for trace in $traces; do
    trace_facts "$trace"
    rdb="$dir/rocketkv.db"
    "$KVSIM_BIN" replay "$trace" --db "$rdb" --policy topk --policy rocketkv --policy hsa --budgets 16,64 \
        > "$dir/rocketkv_runs.txt" 2> "$dir/rocketkv_warnings.txt"
    say "R3 out_err_mean by token budget t = 16 / 64 (Exact-TopK attends t; RocketKV and HSA t/2):"
    for pol in topk rocketkv hsa; do
        line=$(printf '  %-10s' "$pol")
        for B in 16 64; do line="$line $(printf '%9.4f' "$(rk_col "$rdb" "$pol" "$B" out_err_mean)")"; done
        say "$line"
    done
    [ -s "$dir/attn.txt" ] || "$KVSIM_BIN" attn "$trace" --k 16 > "$dir/attn.txt"
    say "R4 union of the top-16 positions over the generated steps (median over heads per layer; x k, x sequence length):"
    awk '/^ +[0-9]+ / { printf "  layer %s union %s = %sx k = %s of the sequence\n", $1, $5, $7, $8 }' "$dir/attn.txt" | tee -a "$summary"
done

# ---- R-1 and R-3: the prompts of each model, by token budget and at equal traffic ---------------------------------
# Quest with fill=tokens: exactly its t/2 quota, as the paper's Table 1 counts every method (fill=pages, Quest's own
# whole pages and kvsim's default, attends fewer when a page does not fit the quota).
rk_pols="topk rocketkv hsa quest sparq tova window streaming h2o"
rk_budgets="16 32 64 128"
rk_budgets_csv=16,32,64,128
# rk_cell_t MODEL POLICY BUDGET METRIC TOTAL: rk_cell at token budget BUDGET (SparQ has no t = 128 run)
rk_cell_t() {
    if [ "$2" = sparq ] && [ "$3" = 128 ]; then echo "not run"; return; fi
    rk_cell "rocketkv_$1_t$3" "$2" "$4" "$5"
}
block_line R-1 "| model (traces) | policy | t = 16 | t = 32 | t = 64 | t = 128 |"
block_line R-1 "|---|---|---|---|---|---|"
block_line R-1-traffic "| model (traces) | policy | out_err_mean at 32 KV pairs per step | at 64 KV pairs per step |"
block_line R-1-traffic "|---|---|---|---|"
block_line R-3 "| model (traces) | policy | pairs read / t at t = 16 | t = 32 | t = 64 | t = 128 |"
block_line R-3 "|---|---|---|---|---|---|"
for mname in $study_models; do
    n_traces=$(n_traces_of "$mname")
    db="$out/rocketkv_$mname.db"
    for t in "$out/prompts/$mname"/*.kvt; do
        "$KVSIM_BIN" replay "$t" --db "$db" --policy topk --policy rocketkv --policy hsa --policy quest:fill=tokens \
            --policy tova --policy window --policy streaming --policy h2o \
            --budgets "$rk_budgets_csv" > /dev/null 2>> "$out/rocketkv_warnings_$mname.txt"
        # SparQ reads more than 64 pairs per step from t = 32 on (it estimates per query head): its t = 128, the
        # slowest run of the section, is left out
        "$KVSIM_BIN" replay "$t" --db "$db" --policy sparq --budgets 16,32,64 > /dev/null 2>> "$out/rocketkv_warnings_$mname.txt"
    done
    pair_bytes=$(rk_pair_bytes "$(ls "$out/prompts/$mname"/*.kvt | head -n 1)")
    for B in $rk_budgets; do
        rk_compare "rocketkv_${mname}_t$B" "$db" --match tokens --at "$B" --across-traces --metric out_err_mean,traffic_bytes_mean
    done
    for p in 32 64; do
        X=$((p * pair_bytes))
        rk_compare "rocketkv_${mname}_x$p" "$db" --match traffic --at "$X" --across-traces --metric out_err_mean
        rk_compare "rocketkv_${mname}_x${p}_pairs" "$db" --match traffic --at "$X" --across-traces --pairs --metric out_err_mean
        "$KVSIM_BIN" compare "$db" --match traffic --at "$X" --across-traces > "$out/rocketkv_${mname}_x$p.txt"
    done
    for pol in $rk_pols; do
        row="| $mname ($n_traces) | $(rk_label "$pol")"
        for B in $rk_budgets; do row="$row | $(rk_cell_t "$mname" "$pol" "$B" out_err_mean "$n_traces")"; done
        block_line R-1 "$row |"
        row="| $mname ($n_traces) | $(rk_label "$pol")"
        for p in 32 64; do
            row="$row | $(rk_cell "rocketkv_${mname}_x$p" "$pol" out_err_mean "$n_traces")"
        done
        block_line R-1-traffic "$row |"
    done
    for pol in rocketkv hsa quest sparq topk; do
        row="| $mname ($n_traces) | $(rk_label "$pol")"
        for B in $rk_budgets; do
            row="$row | $(rk_scale=$((pair_bytes * B)) rk_cell_t "$mname" "$pol" "$B" traffic_bytes_mean "$n_traces")"
        done
        block_line R-3 "$row |"
    done
done
# How many prompts' first stage keeps the whole prompt at t = 16 (kvsim replay's note: RocketKV is HSA alone there)
block_line R-1 ""
for mname in $study_models; do
    kept=$(grep -c 'rocketkv:[^ ]* at budgets\{0,1\} 16[,:].*stage 1 keeps the whole' "$out/rocketkv_warnings_$mname.txt" || true)
    block_line R-1 "- $mname: stage 1 keeps the whole prompt (RocketKV is HSA alone) on $kept of $(n_traces_of "$mname") prompts at t = 16."
done
block_line R-1-pairs "| model (traces) | difference | at 32 KV pairs per step | at 64 KV pairs per step |"
block_line R-1-pairs "|---|---|---|---|"
for mname in $study_models; do
    n_traces=$(n_traces_of "$mname")
    for other in topk hsa quest sparq tova window streaming h2o; do
        row="| $mname ($n_traces) | RocketKV − $(rk_label "$other")"
        for p in 32 64; do row="$row | $(rk_pair "rocketkv_${mname}_x${p}_pairs" rocketkv "$other")"; done
        block_line R-1-pairs "$row |"
    done
    row="| $mname ($n_traces) | $(rk_label topk) − $(rk_label tova)"
    for p in 32 64; do row="$row | $(rk_pair "rocketkv_${mname}_x${p}_pairs" topk tova)"; done
    block_line R-1-pairs "$row |"
done

# ---- R-2: the union of the per-step top-16 over the generated steps, per prompt -------------------------------------
# Per trace (kvsim attn --csv: one row per layer and query head): the mean over heads of union / k and union / the
# sequence length, and of the last layer's heads (the paper's head is in the last layer); a window of k positions
# that moves one position a step would have a union of k + steps − 1.
block_line R-2 "| model (traces) | generated steps | union / k, every head | union / sequence, every head | union / k, last layer | a moving window's union / k |"
block_line R-2 "|---|---:|---|---|---|---:|"
for mname in $study_models; do
    n_traces=$(n_traces_of "$mname")
    : > "$out/rocketkv_union_$mname.txt"
    for t in "$out/prompts/$mname"/*.kvt; do
        "$KVSIM_BIN" attn "$t" --k 16 --csv | awk -F, 'NR == 1 { next } { r[NR] = $0; if ($1 > last) last = $1 }
            END { for (i in r) { split(r[i], f, ","); u += f[5] / f[4]; s += f[5] / f[7]; n++
                      if (f[1] == last) { ul += f[5] / f[4]; nl++ }; steps = f[6]; k = f[4] }
                  printf "%.17g %.17g %.17g %d %d\n", u / n, s / n, ul / nl, steps, k }' >> "$out/rocketkv_union_$mname.txt"
    done
    steps=$(awk '{ print $4 }' "$out/rocketkv_union_$mname.txt" | sort -u | tr '\n' ' ' | sed 's/ $//')
    k=$(awk '{ print $5 }' "$out/rocketkv_union_$mname.txt" | sort -u)
    uk=$(cut -d' ' -f1 "$out/rocketkv_union_$mname.txt" | iv_of "R4 $mname union/k")
    us=$(cut -d' ' -f2 "$out/rocketkv_union_$mname.txt" | iv_of "R4 $mname union/seq")
    ul=$(cut -d' ' -f3 "$out/rocketkv_union_$mname.txt" | iv_of "R4 $mname union/k last layer")
    win=$(awk -v k="$k" -v s="$steps" 'BEGIN { printf "%.3g", (k + s - 1) / k }')
    block_line R-2 "| $mname ($n_traces) | $steps | $uk | $us | $ul | $win |"
done

# ---- R-4: RocketKV-MT on multi-turn traces (R12) ------------------------------------------------------------------
# Five conversations per model, three turns of 40-60 words each, 32 generated tokens per turn (examples/turns.txt,
# whose stories260K capture is the bundled examples/stories260K_multiturn.kvt, and examples/prompts/turns/*.txt).
mt_budgets="16 32 64"
mt_budgets_csv=16,32,64
block_line R-4 "| model (traces) | policy | t = 16 | t = 32 | t = 64 |"
block_line R-4 "|---|---|---|---|---|"
block_line R-4-traffic "| model (traces) | policy | out_err_mean at 24 KV pairs per step | at 48 KV pairs per step | host store, KiB per KV head (mean over steps) at 48 pairs | host to device, bytes per step per KV head at 48 pairs |"
block_line R-4-traffic "|---|---|---|---|---|---|"
block_line R-4-pairs "| model (traces) | difference | at 24 KV pairs per step | at 48 KV pairs per step |"
block_line R-4-pairs "|---|---|---|---|"
for mname in $study_models; do
    mtd="$out/turns/$mname"
    mkdir -p "$mtd"
    case $mname in stories260K) model="$models/stories260K.bin" ;; *) model="$models/$mname" ;; esac
    for f in "$here/turns.txt" "$here"/prompts/turns/*.txt; do
        tn=$(basename "$f" .txt)
        if [ "$mname" = stories260K ] && [ "$tn" = turns ]; then
            cp "$here/stories260K_multiturn.kvt" "$mtd/turns.kvt"
        else
            "$KVSIM_BIN" capture --model "$model" --turns "$f" --steps 32 --ignore-eos --quiet --out "$mtd/$tn.kvt" > /dev/null
        fi
    done
    n_mt=$(ls "$mtd"/*.kvt | wc -l)
    for t in "$mtd"/*.kvt; do "$KVSIM_BIN" info "$t"; done | awk -v m="$mname" '
        /^positions/ { p = $2; if (!np++ || p < pmin) pmin = p; if (p > pmax) pmax = p }
        /^ +turn [0-9]+:/ { sub(/^\(/, "", $9); v = $9 + 0; if (!nt++ || v < tmin) tmin = v; if (v > tmax) tmax = v }
        END { printf "%s %d %d %d %d %d\n", m, nt / np, tmin, tmax, pmin, pmax }' >> "$out/rocketkv_mt_facts.txt"
    db="$out/rocketkv_mt_$mname.db"
    for t in "$mtd"/*.kvt; do
        "$KVSIM_BIN" replay "$t" --db "$db" --policy topk --policy rocketkv --policy rocketkv_mt --policy hsa \
            --policy window --budgets "$mt_budgets_csv" > /dev/null 2>> "$out/rocketkv_mt_warnings.txt"
    done
    pair_bytes=$(rk_pair_bytes "$mtd/turns.kvt")
    for B in $mt_budgets; do
        rk_compare "rocketkv_mt_${mname}_t$B" "$db" --match tokens --at "$B" --across-traces --metric out_err_mean
    done
    for p in 24 48; do
        X=$((p * pair_bytes))
        rk_compare "rocketkv_mt_${mname}_x$p" "$db" --match traffic --at "$X" --across-traces \
            --metric out_err_mean,storage_host_bytes_mean,h2d_bytes_mean
        rk_compare "rocketkv_mt_${mname}_x${p}_pairs" "$db" --match traffic --at "$X" --across-traces --pairs --metric out_err_mean
    done
    for pol in topk rocketkv rocketkv_mt hsa window; do
        row="| $mname ($n_mt) | $(rk_label "$pol")"
        for B in $mt_budgets; do row="$row | $(rk_cell "rocketkv_mt_${mname}_t$B" "$pol" out_err_mean "$n_mt")"; done
        block_line R-4 "$row |"
        row="| $mname ($n_mt) | $(rk_label "$pol")"
        for p in 24 48; do row="$row | $(rk_cell "rocketkv_mt_${mname}_x$p" "$pol" out_err_mean "$n_mt")"; done
        row="$row | $(rk_scale=1024 rk_cell "rocketkv_mt_${mname}_x48" "$pol" storage_host_bytes_mean "$n_mt")"
        row="$row | $(rk_cell "rocketkv_mt_${mname}_x48" "$pol" h2d_bytes_mean "$n_mt")"
        block_line R-4-traffic "$row |"
    done
    for ab in "rocketkv_mt rocketkv" "rocketkv_mt topk" "rocketkv hsa" "rocketkv_mt window"; do
        pa=${ab% *} pb=${ab#* }
        row="| $mname ($n_mt) | $(rk_label "$pa") − $(rk_label "$pb")"
        for p in 24 48; do row="$row | $(rk_pair "rocketkv_mt_${mname}_x${p}_pairs" "$pa" "$pb")"; done
        block_line R-4-pairs "$row |"
    done
done

if [ -s "$out/rocketkv_mt_facts.txt" ]; then
    block_line R-4 ""
    awk '{ printf "- %s: %d turns per conversation, %d-%d prompt tokens per turn, %d-%d positions per conversation.\n", $1, $2, $3, $4, $5, $6 }' \
        "$out/rocketkv_mt_facts.txt" >> "$blocks/R-4.md"
fi

# The bundled multi-turn trace alone (summary.txt's R12 lines)
mt="$here/stories260K_multiturn.kvt"
if [ -f "$out/rocketkv_mt_stories260K.db" ]; then
    mtdb="$out/rocketkv_mt_stories260K.db" mtt="turns/stories260K/turns.kvt"
else
    mtdb="$out/rocketkv_mt_bundled.db" mtt=""
    "$KVSIM_BIN" replay "$mt" --db "$mtdb" --policy topk --policy rocketkv --policy rocketkv_mt --policy hsa --policy window \
        --budgets 16,32,64 > /dev/null 2>> "$out/rocketkv_mt_warnings.txt"
fi
say ""
say "=== stories260K_multiturn: $("$KVSIM_BIN" info "$mt" | awk '/^positions/ { p = $2 } /^turns/ { t = $2 } END { print p " positions, " t " turns" }')"
say "R12 out_err_mean by token budget 16 / 32 / 64, and host bytes of RocketKV-MT's store (mean):"
for pol in topk rocketkv rocketkv_mt hsa window; do
    line=$(printf '  %-12s' "$pol")
    for B in 16 32 64; do line="$line $(printf '%9.4f' "$(rk_col "$mtdb" "$pol" "$B" out_err_mean "$mtt")")"; done
    say "$line"
done
line=$(printf '  %-12s' "mt host B")
for B in 16 32 64; do line="$line $(printf '%9.0f' "$(rk_col "$mtdb" rocketkv_mt "$B" storage_host_bytes_mean "$mtt")")"; done
say "$line"

# ---- R-arith: the paper's arithmetic (R1, R2, R6, R7) -----------------------------------------------------------
# R2 from kvsim plan (the preset's config.json shape) beside the same product written out; R1, R6 and R7 are the
# formulas of §3.6 (tests/test_rocketkv.c recomputes each through the policy's own derivation: G2).
r2=$("$KVSIM_BIN" plan --model Llama-3.1-70B --batch 32 --context 32768 --weights none --csv | csv_to_tsv |
    awk -F'\t' 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
        $c["kind"] == "full" && $c["context"] == 32768 && $c["response"] == 0 { print $c["total_bytes"]; exit }')
block_line R-arith "- R1: c = S / t = 109,000 / 256 = $(awk 'BEGIN { printf "%.1f", 109000 / 256 }') (NIAH's longest prompt at t = 256)."
block_line R-arith "- R2: \`kvsim plan --model Llama-3.1-70B --batch 32 --context 32768\`: $(awk -v b="$r2" 'BEGIN { printf "%.0f B = %.1f GB = %.1f GiB", b, b / 1e9, b / 2^30 }') of KV at fp16; 2·80·8·128·2 B × 32,768 × 32 = $(awk 'BEGIN { printf "%.0f B", 2 * 80 * 8 * 128 * 2 * 32768 * 32 }')."
awk 'BEGIN { c = 64; r = 0.2 + 0.06 * log(c) / log(2); if (r > 0.8) r = 0.8
    s1 = c ^ r; s2 = c ^ (1 - r); pg = c ^ ((1 - r) / 2); page = int(pg); if (page < pg) page++
    printf "- R6/R7: c = 64: r = min(0.2 + 0.06 log2 c, 0.8) = %.2f; stage 1 c^r = %.3f, stage 2 c^(1−r) = %.3f; ", r, s1, s2
    printf "page size ⌈c^((1−r)/2)⌉ = ⌈%.4f⌉ = %d; head dimension c^(1−r) / page = %.3f; ", pg, page, s2 / page
    printf "Table 1 storage 1/c^r + 2/c^((1+r)/2) = %.5f (RocketKV-MT %.5f), traffic 1/c = %.6f.\n",
        1 / s1 + 2 / c ^ ((1 + r) / 2), 1 + 2 / c ^ ((1 + r) / 2), 1 / c }' >> "$blocks/R-arith.md"

