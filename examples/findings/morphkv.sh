# morphkv.sh — MorphKV's findings (FINDINGS.md, MorphKV; POLICY_SPEC §5.1): the blocks M-1 .. M-7.
# Sourced by examples/findings.sh (its variables and functions: $KVSIM_BIN, $out, $blocks, $traces, $study_models,
# say, block_line, field_like, budgets_of, ratio, fmt_iv, iv_of, csv_to_tsv, trace_facts, n_traces_of).
#
# Over the seven prompts of each model: memory at equal nominal capacity (M-1), the profile store (M-2), error at
# equal resident memory with paired differences (M-3, M-3-pairs; SnapKV's floor: M-3-snapkv), sum against max fusion
# (M-4), tokens per query head at equal memory (M-5). From the paper's model configs (kvsim plan): the 1/G
# arithmetic behind the paper's memory ratios (M-1-paper), the profile store at its settings (M-2-paper), the GQA
# groups (M-5-paper), the memory behind M3 and M15 (M-6) and M22 (M-7). One trace per model: the profile store at the
# paper's R = 30 (M-2-r30) and the lines of summary.txt that tests/test_examples.c reads (the ratio rows, G7).

mk_rows="recent=30,fusion=sum,fidelity=paper,profile=rows,evict_after=1,paper_ctot=600"
mk_max="recent=30,fusion=max,fidelity=paper,profile=rows,evict_after=1,paper_ctot=600"
mk_qz="recent=30,fusion=sum,fidelity=paper,profile=qz,evict_after=1,paper_ctot=600"
mk_r30="recent=30,fusion=sum,fidelity=paper,profile=rows,evict_after=1,paper_ctot=0"
mk_h2o_repo="recent=0.5,gqa=expand,prefill=budget,window=30,block=0"
mk_snap="window=30,kernel=7,pool=max,gqa=expand,block=0"

# ---- One trace per model: the lines of summary.txt, and the profile store at the paper's R = 30 (M-2-r30) -------
block_line M-2-r30 "| trace | prompt | profile rows / KV at R = 30, C_tot = 128 (measured) | G·R/d (fp32 rows, fp16 KV) |"
block_line M-2-r30 "|---|---:|---:|---:|"
for trace in $traces; do
    trace_facts "$trace"
    mdb="$dir/morphkv.db"
    "$KVSIM_BIN" replay "$trace" --db "$mdb" --policy full --policy morphkv@longwriter \
        --policy morphkv@longwriter:profile=qz --policy morphkv@longwriter:paper_ctot=0 \
        --policy h2o@morphkv-longwriter --policy snapkv@morphkv-longwriter \
        --budgets 33,65,129 > "$dir/morphkv_runs.txt" 2> "$dir/morphkv_warnings.txt"
    say "M2/M9/M13/M16 resident KV bytes per KV head at equal nominal capacity C_tot (mean over decode steps), as ratios:"
    say "  C_tot  morphkv/full  h2o/full  snapkv/full  morphkv/h2o (1/G = $(ratio 1 "$G"))  profiles/KV rows  qz"
    for B in 33 65 129; do
        full=$(field_like "$mdb" full "" "$B" storage_kv_bytes_mean)
        mkv=$(field_like "$mdb" morphkv "$mk_rows" "$B" storage_kv_bytes_mean)
        maux=$(field_like "$mdb" morphkv "$mk_rows" "$B" storage_aux_bytes_mean)
        qaux=$(field_like "$mdb" morphkv "$mk_qz" "$B" storage_aux_bytes_mean)
        hkv=$(field_like "$mdb" h2o "$mk_h2o_repo" "$B" storage_kv_bytes_mean)
        skv=$(field_like "$mdb" snapkv "$mk_snap" "$B" storage_kv_bytes_mean)
        say "$(printf '  %5d  %12s  %8s  %11s  %26s  %16s  %5s' $((B - 1)) "$(ratio "$mkv" "$full")" \
            "$(ratio "$hkv" "$full")" "$(ratio "$skv" "$full")" "$(ratio "$mkv" "$hkv")" "$(ratio "$maux" "$mkv")" \
            "$(ratio "$qaux" "$mkv")")"
    done
    kv30=$(field_like "$mdb" morphkv "$mk_r30" 129 storage_kv_bytes_mean)
    aux30=$(field_like "$mdb" morphkv "$mk_r30" 129 storage_aux_bytes_mean)
    block_line M-2-r30 "| $name | $P | $(ratio "$aux30" "$kv30") | $(awk -v g="$G" -v d="$d" 'BEGIN { printf "%.3f", g * 30 / d }') |"
    say "G7 profile store at the paper's R=30 (not scaled), C_tot=128: aux/KV measured $(ratio "$aux30" "$kv30"); G R/(2d) = $(awk -v g="$G" -v d="$d" 'BEGIN { printf "%.4f", g * 30 / (2 * d) }') in one dtype, x 2 for fp32 profiles beside fp16 KV = $(awk -v g="$G" -v d="$d" 'BEGIN { printf "%.4f", g * 30 / d }')"
done

# ---- Over the prompts ------------------------------------------------------------------------------------------
# mk_values TSV BUDGET FIELD KEY...: per trace (sorted by path) one line with FIELD (a column number of the runs TSV
# below) of each KEY ("policy|params") at BUDGET; a trace lacking one of the keys prints nothing.
mk_values() {
    mk_tsv_in=$1 mk_b=$2 mk_f=$3
    shift 3
    awk -F'\t' -v b="$mk_b" -v f="$mk_f" -v keys="$*" '
        BEGIN { nk = split(keys, k, " ") }
        $4 == b { v[$1, $2 "|" $3] = $f; t[$1] = 1 }
        END { n = 0; for (x in t) tr[++n] = x
              for (i = 2; i <= n; i++) for (j = i; j > 1 && tr[j - 1] > tr[j]; j--) { s = tr[j]; tr[j] = tr[j - 1]; tr[j - 1] = s }
              for (i = 1; i <= n; i++) { line = ""; ok = 1
                  for (j = 1; j <= nk; j++) { if (!((tr[i], k[j]) in v)) ok = 0; line = line (j > 1 ? " " : "") v[tr[i], k[j]] }
                  if (ok) print line } }' "$mk_tsv_in"
}
# mk_facts TRACE: G, d, N (positions) and mk_T (generated tokens) of a prompt trace (trace_facts keeps one folder per
# trace name, and the prompts of two models share names)
mk_facts() {
    mk_info=$("$KVSIM_BIN" info "$1")
    G=$(echo "$mk_info" | sed -n 's/.*kv heads [0-9]* (group \([0-9]*\)).*/\1/p')
    d=$(echo "$mk_info" | sed -n 's/.*head_dim \([0-9]*\).*/\1/p')
    N=$(echo "$mk_info" | awk '/^positions/ { print $2 }')
    mk_T=$(echo "$mk_info" | awk '/^positions/ { sub(/\(/, "", $3); print $2 - $3 }')
}
# mk_across CSV LABEL METRIC TOTAL: "mean [lo, hi]" of a label in `kvsim compare --across-traces --csv` (fmt_iv)
mk_across() {
    mk_v=$(csv_to_tsv < "$1" | awk -F'\t' -v want="$2" -v m="$3" '
        NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
        $c["label"] == want && !done { print $c[m] "\t" $c[m "_lo"] "\t" $c[m "_hi"] "\t" $c[m "_n"]; done = 1 }')
    fmt_iv "$(echo "$mk_v" | cut -f1)" "$(echo "$mk_v" | cut -f2)" "$(echo "$mk_v" | cut -f3)" "$(echo "$mk_v" | cut -f4)" "$4"
}
# mk_pair CSV A B: "A − B = diff [lo, hi]" over n traces, resolved or not, from `kvsim compare --pairs --csv`
# (whichever order the pair is listed in); "-" when the pair has no common trace
mk_pair() {
    csv_to_tsv < "$1" | awk -F'\t' -v a="$2" -v b="$3" '
        NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
        ($c["a"] == a && $c["b"] == b) || ($c["a"] == b && $c["b"] == a) {
            s = ($c["a"] == a) ? 1 : -1
            lo = s > 0 ? $c["diff_lo"] : -$c["diff_hi"]; hi = s > 0 ? $c["diff_hi"] : -$c["diff_lo"]
            if ($c["n"] < 1) print "-"
            else if ($c["n"] < 2) printf "%+.3g (n = %d)\n", s * $c["diff"], $c["n"]
            else printf "%+.3g [%+.3g, %+.3g]%s%s\n", s * $c["diff"], lo, hi, ($c["n"] < total ? " (n = " $c["n"] ")" : ""),
                ($c["resolved"] != 0 ? "" : " not resolved")
            found = 1; exit }
        END { if (!found) print "-" }' total="$4"
}

mk_specs="--policy full --policy morphkv@longwriter --policy morphkv@longwriter:fusion=max
    --policy morphkv@longwriter:profile=qz --policy h2o@morphkv-longwriter --policy snapkv@morphkv-longwriter
    --policy window --policy streaming --policy tova"
mk_levels="2KiB 4KiB 6KiB"
# The configurations of M-3: "label in kvsim compare|name in the block"
mk_configs="morphkv ($mk_qz)|MorphKV \`qz\` (sum)
morphkv ($mk_rows)|MorphKV \`rows\` (sum)
morphkv ($mk_max)|MorphKV \`rows\` (max)
h2o ($mk_h2o_repo)|H2O (MorphKV's repo, window 30)
snapkv ($mk_snap)|SnapKV (MorphKV's LongWriter settings)
window|window
streaming (sinks=4)|StreamingLLM
tova (mode=layer,protect_current=false,block=0)|TOVA"

block_line M-1 "| model (traces) | C_tot | MorphKV / Full | H2O / Full | SnapKV / Full | MorphKV / H2O | 1/G |"
block_line M-1 "|---|---:|---|---|---|---|---:|"
block_line M-2 "| model (traces) | C_tot | R (scaled) | profile rows / KV | G·R/d (fp32 rows, fp16 KV) | \`qz\` store / KV | G·R·(d+1)/(d·(C_tot+1)) |"
block_line M-2 "|---|---:|---:|---|---:|---|---:|"
block_line M-3 "| model (traces) | configuration | out_err_mean at 2 KiB | at 4 KiB | at 6 KiB |"
block_line M-3 "|---|---|---|---|---|"
block_line M-3-pairs "| model | X | MorphKV \`qz\` − \`rows\` | \`qz\` − window | \`qz\` − StreamingLLM | \`qz\` − TOVA | \`qz\` − H2O (repo) | \`qz\` − SnapKV | \`rows\` − window | \`rows\` − H2O (repo) |"
block_line M-3-pairs "|---|---|---|---|---|---|---|---|---|---|"
block_line M-3-snapkv "| model (traces) | SnapKV at its smallest budget here (16 prompt positions per query head), KiB | as a fraction of the full cache | floor at any budget: G·(T+1)/2 generated tokens per KV head, KiB |"
block_line M-3-snapkv "|---|---|---|---:|"
block_line M-4 "| model (traces) | C_tot | R (scaled) | out_err_mean, sum | max | sum − max (paired) |"
block_line M-4 "|---|---:|---:|---|---|---|"
block_line M-5 "| model (traces) | attended tokens per query head at 4 KiB: MorphKV \`qz\` | MorphKV \`rows\` | H2O (repo) | window | MorphKV \`qz\` / H2O (repo), per trace | G |"
block_line M-5 "|---|---|---|---|---|---|---:|"
for mname in $study_models; do
    mk_n=$(n_traces_of "$mname")
    mk_db="$out/morphkv_$mname.db"
    # The budgets: C_tot 16, 32, 64, ... up to the first whose window holds more than the largest level (6 KiB of fp16
    # K and V, 4d bytes a token), so that every plain baseline brackets it, and below the shortest trace's length
    mk_facts "$(ls "$out/prompts/$mname"/*.kvt | head -n 1)"
    mk_shortest=$(for t in "$out/prompts/$mname"/*.kvt; do mk_facts "$t"; echo "$N"; done | sort -n | head -n 1)
    mk_budgets=$(for B in 17 33 65 129 193 257; do echo "$B"; done | awk -v d="$d" -v n="$mk_shortest" '
        $1 < n && !done { print; if ($1 * 4 * d > 6144) done = 1 }' | paste -sd, -)
    for t in "$out/prompts/$mname"/*.kvt; do
        # shellcheck disable=SC2086
        "$KVSIM_BIN" replay "$t" --db "$mk_db" $mk_specs --budgets "$mk_budgets" > /dev/null 2>> "$out/morphkv_warnings.txt"
    done
    # One row per run: trace policy params budget kv aux mem err R aux/kv (R: MorphKV's scaled recent window, from
    # the run's note)
    mk_tsv="$out/morphkv_$mname.tsv"
    "$KVSIM_BIN" runs "$mk_db" --csv --summary | csv_to_tsv | awk -F'\t' -v OFS='\t' '
        NR == 1 { for (i = 1; i <= NF; i++) if (!($i in c)) c[$i] = i; next }
        { r = "-"; if (match($c["notes"], /scaled to R=[0-9]+/)) r = substr($c["notes"], RSTART + 12, RLENGTH - 12)
          print $c["trace"], $c["policy"], $c["params"], $c["budget_tokens"], $c["storage_kv_bytes_mean"],
              $c["storage_aux_bytes_mean"], $c["storage_bytes_mean"], $c["out_err_mean"], r,
              ($c["storage_kv_bytes_mean"] > 0 ? $c["storage_aux_bytes_mean"] / $c["storage_kv_bytes_mean"] : "-") }' > "$mk_tsv"

    # M-1: resident KV bytes per KV head at equal nominal capacity, per trace as ratios
    for B in 33 65 129; do
        mk_v=$(mk_values "$mk_tsv" "$B" 5 "full|" "morphkv|$mk_rows" "h2o|$mk_h2o_repo" "snapkv|$mk_snap")
        mf=$(echo "$mk_v" | awk '{ print $2 / $1 }' | iv_of "M-1 $mname $B morphkv/full")
        hf=$(echo "$mk_v" | awk '{ print $3 / $1 }' | iv_of "M-1 $mname $B h2o/full")
        sf=$(echo "$mk_v" | awk '{ print $4 / $1 }' | iv_of "M-1 $mname $B snapkv/full")
        mh=$(echo "$mk_v" | awk '{ print $2 / $3 }' | iv_of "M-1 $mname $B morphkv/h2o")
        block_line M-1 "| $mname ($mk_n) | $((B - 1)) | $mf | $hf | $sf | $mh | $(ratio 1 "$G") |"
    done

    # M-2: the profile store against the KV (R scaled with C_tot, as the presets do), rows and qz
    for B in 33 65 129; do
        R=$(mk_values "$mk_tsv" "$B" 9 "morphkv|$mk_rows" | sort -u)
        [ "$(echo "$R" | wc -l)" -eq 1 ] || { echo "morphkv.sh: R differs across $mname's traces at budget $B" >&2; exit 1; }
        rows=$(mk_values "$mk_tsv" "$B" 10 "morphkv|$mk_rows" | iv_of "M-2 $mname $B rows/kv")
        qz=$(mk_values "$mk_tsv" "$B" 10 "morphkv|$mk_qz" | iv_of "M-2 $mname $B qz/kv")
        block_line M-2 "| $mname ($mk_n) | $((B - 1)) | $R | $rows | $(awk -v g="$G" -v r="$R" -v d="$d" 'BEGIN { printf "%.3g", g * r / d }') | $qz | $(awk -v g="$G" -v r="$R" -v d="$d" -v b="$B" 'BEGIN { printf "%.3g", g * r * (d + 1) / (d * b) }') |"
    done

    # M-3: relative output error at equal resident memory (KV + auxiliary per KV head), and the paired differences
    for X in $mk_levels; do
        "$KVSIM_BIN" compare "$mk_db" --match mem --at "$X" --across-traces --csv \
            --metric out_err_mean,attended_tokens_mean > "$out/morphkv_${mname}_$X.csv"
        "$KVSIM_BIN" compare "$mk_db" --match mem --at "$X" --across-traces --pairs --csv > "$out/morphkv_${mname}_${X}_pairs.csv"
        "$KVSIM_BIN" compare "$mk_db" --match mem --at "$X" --across-traces > "$out/morphkv_${mname}_$X.txt"
    done
    echo "$mk_configs" | while IFS='|' read -r label show; do
        row="| $mname ($mk_n) | $show"
        for X in $mk_levels; do row="$row | $(mk_across "$out/morphkv_${mname}_$X.csv" "$label" out_err_mean "$mk_n")"; done
        block_line M-3 "$row |"
    done
    for X in $mk_levels; do
        p="$out/morphkv_${mname}_${X}_pairs.csv"
        q="morphkv ($mk_qz)"
        row="| $mname | $X | $(mk_pair "$p" "$q" "morphkv ($mk_rows)" "$mk_n") | $(mk_pair "$p" "$q" window "$mk_n")"
        row="$row | $(mk_pair "$p" "$q" "streaming (sinks=4)" "$mk_n") | $(mk_pair "$p" "$q" "tova (mode=layer,protect_current=false,block=0)" "$mk_n")"
        row="$row | $(mk_pair "$p" "$q" "h2o ($mk_h2o_repo)" "$mk_n")"
        row="$row | $(mk_pair "$p" "$q" "snapkv ($mk_snap)" "$mk_n") | $(mk_pair "$p" "morphkv ($mk_rows)" window "$mk_n")"
        row="$row | $(mk_pair "$p" "morphkv ($mk_rows)" "h2o ($mk_h2o_repo)" "$mk_n")"
        block_line M-3-pairs "$row |"
    done
    # Where SnapKV cannot be made as small: its smallest run, and the floor every budget keeps (the generated tokens)
    mk_v=$(mk_values "$mk_tsv" 17 7 "full|" "snapkv|$mk_snap")
    sk=$(echo "$mk_v" | awk '{ print $2 / 1024 }' | iv_of "M-3 $mname snapkv min KiB")
    sf=$(echo "$mk_v" | awk '{ print $2 / $1 }' | iv_of "M-3 $mname snapkv min / full")
    floor=$(awk -v g="$G" -v t="$mk_T" -v d="$d" 'BEGIN { printf "%.3g", g * (t + 1) / 2 * 4 * d / 1024 }')
    block_line M-3-snapkv "| $mname ($mk_n) | $sk | $sf | $floor |"

    # M-4: sum against max fusion at the same C_tot (the same bytes: the fusion changes no storage)
    for B in 33 65 129; do
        R=$(mk_values "$mk_tsv" "$B" 9 "morphkv|$mk_rows" | sort -u)
        mk_v=$(mk_values "$mk_tsv" "$B" 8 "morphkv|$mk_rows" "morphkv|$mk_max")
        s=$(echo "$mk_v" | cut -d' ' -f1 | iv_of "M-4 $mname $B sum")
        m=$(echo "$mk_v" | cut -d' ' -f2 | iv_of "M-4 $mname $B max")
        dm=$(echo "$mk_v" | iv_of "M-4 $mname $B sum-max" --paired)
        block_line M-4 "| $mname ($mk_n) | $((B - 1)) | $R | $s | $m | $dm |"
    done

    # M-5: tokens held per query head at equal memory (one set per KV head against one per query head)
    c4="$out/morphkv_${mname}_4KiB.csv"
    "$KVSIM_BIN" compare "$mk_db" --match mem --at 4KiB --per-trace --csv --metric attended_tokens_mean > "$out/morphkv_${mname}_4KiB_traces.csv"
    tr=$(csv_to_tsv < "$out/morphkv_${mname}_4KiB_traces.csv" | awk -F'\t' -v a="$mk_qz" -v b="$mk_h2o_repo" '
        NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
        $c["status"] != "interpolated" && $c["status"] != "exact" { next }
        $c["policy"] == "morphkv" && $c["params"] == a { x[$c["trace_sha256"]] = $c["attended_tokens_mean"] }
        $c["policy"] == "h2o" && $c["params"] == b { y[$c["trace_sha256"]] = $c["attended_tokens_mean"] }
        END { for (t in x) if (t in y) print t, x[t] / y[t] }' | sort | cut -d' ' -f2 | iv_of "M-5 $mname qz/h2o tokens")
    block_line M-5 "| $mname ($mk_n) | $(mk_across "$c4" "morphkv ($mk_qz)" attended_tokens_mean "$mk_n") | $(mk_across "$c4" "morphkv ($mk_rows)" attended_tokens_mean "$mk_n") | $(mk_across "$c4" "h2o ($mk_h2o_repo)" attended_tokens_mean "$mk_n") | $(mk_across "$c4" window attended_tokens_mean "$mk_n") | $tr | $G |"
done

# ---- The paper's models: arithmetic from their configs (kvsim plan) --------------------------------------------
"$KVSIM_BIN" plan --list-presets > "$out/morphkv_presets.txt"
# mk_preset NAME FIELD: heads, kv or hd of a built-in preset
mk_preset() { awk -v n="$1" -v f="$2" '$1 == n { print (f == "heads" ? $3 : f == "kv" ? $4 : $5) }' "$out/morphkv_presets.txt"; }
# mk_plan MODEL POLICY BUDGET CONTEXT RESPONSE SERIES: seq_device_bytes of one series of `kvsim plan --csv`
mk_plan() {
    "$KVSIM_BIN" plan --model "$1" --policy "$2" --budget "$3" --context "$4" --responses "$5" --csv |
        csv_to_tsv | awk -F'\t' -v s="$6" -v c="$4" -v r="$5" '
            NR == 1 { for (i = 1; i <= NF; i++) k[$i] = i; next }
            $k["series"] == s && $k["context"] == c && $k["response"] == r { print $k["seq_device_bytes"]; exit }'
}
mk_paper_models="Llama-3.1-8B Mistral-7B-v0.2 Qwen2.5-7B Phi-4"
block_line M-1-paper "| paper model | G | MorphKV / H2O at equal C_tot = 1/G | saving | with the profile rows in the KV's dtype, R = 30: (1 + G·R/(2d))/G | R = 200 |"
block_line M-1-paper "|---|---:|---:|---:|---:|---:|"
for m in $mk_paper_models; do
    g=$(awk -v h="$(mk_preset "$m" heads)" -v k="$(mk_preset "$m" kv)" 'BEGIN { print h / k }')
    hd=$(mk_preset "$m" hd)
    block_line M-1-paper "$(awk -v m="$m" -v g="$g" -v d="$hd" 'BEGIN { printf "| %s | %d | %.3f | %.1f%% | %.3f | %.3f |\n", m, g,
        1 / g, 100 * (1 - 1 / g), (1 + g * 30 / (2 * d)) / g, (1 + g * 200 / (2 * d)) / g }')"
done
mk_gmin=$(for m in $mk_paper_models; do awk -v h="$(mk_preset "$m" heads)" -v k="$(mk_preset "$m" kv)" 'BEGIN { print h / k }'; done | sort -n | head -n 1)
mk_gmax=$(for m in $mk_paper_models; do awk -v h="$(mk_preset "$m" heads)" -v k="$(mk_preset "$m" kv)" 'BEGIN { print h / k }'; done | sort -n | tail -n 1)
# LongGenBench's models (Table 2): Llama, Mistral, Qwen
mk_glgb=$(for m in Llama-3.1-8B Mistral-7B-v0.2 Qwen2.5-7B; do awk -v h="$(mk_preset "$m" heads)" -v k="$(mk_preset "$m" kv)" 'BEGIN { print h / k }'; done |
    awk '{ s += $1; n++ } END { printf "%.3g", s / n }')
block_line M-1-paper ""
awk -v gmin="$mk_gmin" -v gmax="$mk_gmax" -v glgb="$mk_glgb" 'BEGIN {
    printf "- 1/G for any mix of these models: MorphKV / H2O between %.3f and %.3f (saving %.1f%% to %.1f%%)\n", 1 / gmax, 1 / gmin, 100 * (1 - 1 / gmin), 100 * (1 - 1 / gmax)
    printf "- LongWriter bars (Fig. 6: MorphKV 0.25x, H2O about 1x of Full): MorphKV / H2O = %.3f (saving %.1f%%); SnapKV (4x): saving %.2f%%\n", 0.25 / 1, 100 * (1 - 0.25), 100 * (1 - 0.25 / 4)
    printf "- LongGenBench bars (Fig. 8: 0.55x, 1.22x, 5.01x): MorphKV / H2O = %.3f (saving %.1f%%); against SnapKV: saving %.1f%%\n", 0.55 / 1.22, 100 * (1 - 0.55 / 1.22), 100 * (1 - 0.55 / 5.01)
    printf "- the mean of the two benchmarks'"'"' savings: %.1f%% against H2O, %.1f%% against SnapKV (the headline M1/M2: 52.9%% and 88.1%%)\n", 50 * ((1 - 0.25) + (1 - 0.55 / 1.22)), 50 * ((1 - 0.25 / 4) + (1 - 0.55 / 5.01))
    printf "- LongBench bars (Fig. 9, Llama: MorphKV 0.15x, SnapKV 0.42x of Full): MorphKV / SnapKV = %.3f; C_tot 2048 per KV head against 1024 per query head is 2048 / (G x 1024) = %.3f at G = %d before any output (M16)\n", 0.15 / 0.42, 2048 / (gmin * 1024), gmin
    printf "- LongGenBench'"'"'s prompts fit SnapKV'"'"'s 1K per query head (§5.2: it \"retains all prompt tokens\"), so SnapKV / Full = G: the mean G of Llama, Mistral and Qwen is %s (Fig. 8: 5.01x); no per-head accounting exceeds G = %d (Fig. 8: \"up to 13x\")\n", glgb, gmax
    printf "- H2O at LongGenBench keeps 4K per query head, G times MorphKV'"'"'s 4K per KV head: with MorphKV at 0.55x of Full, %.2fx (G = %d) to %.2fx (G = %d) of Full; Fig. 8'"'"'s 1.22x is %.2f x MorphKV'"'"'s\n", gmin * 0.55, gmin, gmax * 0.55, gmax, 1.22 / 0.55
}' | while IFS= read -r l; do block_line M-1-paper "$l"; done

# M-2-paper: the profile store at the paper's settings (G7: G·R/(2d) in one dtype); M-5-paper: the GQA groups (M6, M20,
# M21), each from the model's config
block_line M-2-paper "| paper model | G | head_dim d | G·R/(2d), R = 30 (LongWriter) | R = 32 (LongBench) | R = 200 (LongGenBench) |"
block_line M-2-paper "|---|---:|---:|---:|---:|---:|"
block_line M-5-paper "| paper model | query heads | KV heads | G = tokens per KV head at the bytes of one cache per query head |"
block_line M-5-paper "|---|---:|---:|---:|"
for m in $mk_paper_models; do
    block_line M-2-paper "$(awk -v m="$m" -v h="$(mk_preset "$m" heads)" -v k="$(mk_preset "$m" kv)" -v d="$(mk_preset "$m" hd)" 'BEGIN {
        g = h / k; printf "| %s | %d | %d | %.3f | %.3f | %.3f |\n", m, g, d, g * 30 / (2 * d), g * 32 / (2 * d), g * 200 / (2 * d) }')"
    block_line M-5-paper "$(awk -v m="$m" -v h="$(mk_preset "$m" heads)" -v k="$(mk_preset "$m" kv)" 'BEGIN {
        printf "| %s | %d | %d | %g |\n", m, h, k, h / k }')"
done

# M-6: the memory behind M3 (MorphKV against SnapKV) and M15 (20% of the memory), from kvsim plan's bytes. MorphKV
# holds C_tot + 1 positions per KV head (the constant series), SnapKV 1024 prompt positions per query head plus every
# generated token (its nominal prompt-only series, G sets per KV head), the full cache every position per KV head.
block_line M-6 "| claim | model (G) | MorphKV | SnapKV or Full | bytes of MorphKV / the other (kvsim plan) | what the stated figure needs |"
block_line M-6 "|---|---|---|---|---|---|"
# M3, Phi-4 VCSum (LongBench settings: C_tot 2K, SnapKV 1024 per query head; a long prompt): the ratio at T = 0, and the
# response length T at which the stated 56% saving holds, checked with plan at that T
g=$(awk -v h="$(mk_preset Phi-4 heads)" -v k="$(mk_preset Phi-4 kv)" 'BEGIN { print h / k }')
m0=$(mk_plan Phi-4 snapkv@morphkv-longbench 1024 8192 0 "snapkv B=1024 nominal")
c0=$(mk_plan Phi-4 morphkv@longbench 2049 8192 0 "morphkv B=2049 nominal")
T=$(awk -v g="$g" 'BEGIN { printf "%d", 2049 / (g * (1 - 0.56)) - 1024 + 0.5 }')
m1=$(mk_plan Phi-4 snapkv@morphkv-longbench 1024 8192 "$T" "snapkv B=1024 nominal")
c1=$(mk_plan Phi-4 morphkv@longbench 2049 8192 "$T" "morphkv B=2049 nominal")
block_line M-6 "| M3: VCSum, up to +8% at −56% KV | Phi-4 ($g) | C_tot 2048 | SnapKV 1024 + T per query head, prompt 8K | $(ratio "$c0" "$m0") at T = 0, $(ratio "$c1" "$m1") at T = $T | a response of about $T tokens |"
# M3, Qwen2.5-7B LongGenBench (C_tot 4K; SnapKV 1K prompt positions per query head and every generated token): while
# MorphKV evicts nothing and SnapKV keeps the whole prompt, the ratio is 1/G; the stated 83% (0.17 > 1/G) needs MorphKV
# to hold more than 1/G of SnapKV's tokens, as with a prompt longer than SnapKV's 1024 (found at T = 0, checked by plan)
g=$(awk -v h="$(mk_preset Qwen2.5-7B heads)" -v k="$(mk_preset Qwen2.5-7B kv)" 'BEGIN { print h / k }')
rs=""
for L in 1024 4096 8192; do
    s=$(mk_plan Qwen2.5-7B snapkv@morphkv-longgenbench 1024 512 $((L - 512)) "snapkv B=1024 nominal")
    c=$(mk_plan Qwen2.5-7B morphkv@longgenbench 4097 512 $((L - 512)) "morphkv B=4097 nominal")
    rs="$rs${rs:+, }$(ratio "$c" "$s") at $L tokens"
done
P17=$(awk -v g="$g" 'BEGIN { printf "%d", (1 - 0.83) * g * 1024 + 0.5 }')
s=$(mk_plan Qwen2.5-7B snapkv@morphkv-longgenbench 1024 "$P17" 0 "snapkv B=1024 nominal")
c=$(mk_plan Qwen2.5-7B morphkv@longgenbench 4097 "$P17" 0 "morphkv B=4097 nominal")
block_line M-6 "| M3: LongGenBench, up to +21% at −83% KV | Qwen2.5-7B ($g) | C_tot 4096 | SnapKV 1024 + T per query head, prompt 512 | $rs; $(ratio "$c" "$s") with a $P17-token prompt at T = 0 | 1/G = $(awk -v g="$g" 'BEGIN { printf "%.3f", 1 / g }') while nothing is evicted; 0.17 needs MorphKV to hold more than 1/G of SnapKV's tokens, e.g. a prompt of about $P17 tokens that SnapKV cuts to 1024 |"
# M15: Phi-4 at "20% of the memory" on LongBench (C_tot 2K, prompts of about 6K on average)
f6=$(mk_plan Phi-4 morphkv@longbench 2049 6000 0 "morphkv B=2049 nominal")
F6=$(mk_plan Phi-4 morphkv@longbench 2049 6000 0 "full")
L20=$(awk 'BEGIN { printf "%d", 2049 / 0.2 + 0.5 }')
f20=$(mk_plan Phi-4 morphkv@longbench 2049 "$L20" 0 "morphkv B=2049 nominal")
F20=$(mk_plan Phi-4 morphkv@longbench 2049 "$L20" 0 "full")
g=$(awk -v h="$(mk_preset Phi-4 heads)" -v k="$(mk_preset Phi-4 kv)" 'BEGIN { print h / k }')
block_line M-6 "| M15: beats Full on three tasks with 20% of the memory | Phi-4 ($g) | C_tot 2048 | Full | $(ratio "$f6" "$F6") at a 6000-token prompt, $(ratio "$f20" "$F20") at $L20; with the profile rows (R = 32, one dtype) x $(awk -v g="$g" -v d="$(mk_preset Phi-4 hd)" 'BEGIN { printf "%.2f", 1 + g * 32 / (2 * d) }') | contexts of $L20 tokens or more, the profile rows not counted |"

# M-7 (M22, Fig. 1): the full cache of Llama-3.1 70B and 405B at batch 256, fp16
block_line M-7 "| sequence length | Llama-3.1-70B, batch 256 | Llama-3.1-405B, batch 256 | KV bytes per token (70B / 405B) |"
block_line M-7 "|---:|---:|---:|---:|"
for L in 4096 32768 131072; do
    a=$(mk_plan Llama-3.1-70B full 1 "$L" 0 full)
    b=$(mk_plan Llama-3.1-405B full 1 "$L" 0 full)
    block_line M-7 "$(awk -v l="$L" -v a="$a" -v b="$b" 'BEGIN { t = 2 ^ 40; printf "| %d | %.4g TiB | %.4g TiB | %d / %d |\n", l, 256 * a / t, 256 * b / t, a / l, b / l }')"
done
