# keydiff.sh — KeyDiff's findings (FINDINGS.md, KeyDiff; POLICY_SPEC §2.5, §4 items 9 and 11, §5.5).
# Sourced by examples/findings.sh (its variables and functions: $KVSIM_BIN, $out, $blocks, $traces, $study_models,
# say, block_line, field_like, budgets_of, ratio, fmt_iv, iv_of, csv_to_tsv, trace_facts, n_traces_of).
#
# Blocks: K-1 (K3: key distinctiveness against attention), K-2 (K12: key and query geometry), K-3 (K11: diversity
# of the retained keys), K-4 (KeyDiff, its sliding-window variants and the baselines at equal resident memory),
# K-5 (K5: LongBench's lengths and compression ratios, arithmetic on the paper's Table 8) and K-6 (K14: the
# scoring cost per eviction event against n). K-1 .. K-4 are measured on the seven prompts of each model: the mean
# over the traces of a per-trace figure with its percentile bootstrap 95% interval, differences paired over the
# same traces.

# ---- summary.txt: key geometry and retained-key diversity of the single traces ----------------------------------
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
done

# ---- helpers over the CSV of `kvsim keys --csv` (one row per (layer, KV head)) -----------------------------------
# kd_median FILE COLUMN: the median over heads of a column, NaN skipped, the mean of the two middle values for an
# even count (kvsim keys' own summary median)
kd_median() {
    awk -F, -v col="$2" 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == col) c = i; next }
        $c ~ /^-?[0-9]/ { print $c }' "$1" | sort -g |
        awk '{ v[++n] = $1 } END { if (n == 0) print "nan"; else if (n % 2) printf "%.17g\n", v[(n + 1) / 2]
            else printf "%.17g\n", (v[n / 2] + v[n / 2 + 1]) / 2 }'
}
# kd_negative FILE COLUMN: "NEG N", the heads whose column is below 0 and the heads with a value
kd_negative() {
    awk -F, -v col="$2" 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == col) c = i; next }
        $c ~ /^-?[0-9]/ { n++; if ($c + 0 < 0) neg++ } END { printf "%d %d\n", neg, n }' "$1"
}
# kd_head_dim TRACE: the trace's head_dim d (not trace_facts: it caches by file name, and both models' prompt
# traces share their names)
kd_head_dim() { "$KVSIM_BIN" info "$1" | awk '/head_dim/ { for (i = 1; i <= NF; i++) if ($i == "head_dim") { v = $(i+1); gsub(/[^0-9]/, "", v); print v } }'; }
# kd_sum_counts FILE FIELD_NEG FIELD_N: "NEG of N" summed over the lines (the traces)
kd_sum_counts() { awk -v a="$2" -v b="$3" '{ s += $a; n += $b } END { printf "%d of %d", s, n }' "$1"; }

# The policies of K-3 (logdet_<i> of `kvsim keys`, in this order) and of K-4, as compare labels them
kd_logdet_specs="--policy keydiff --policy keydiff@paper --policy keydiff@paper-window20 --policy tova@keydiff
    --policy streaming@keydiff --policy snapkv@keydiff"
kd_specs="--policy keydiff --policy keydiff@paper --policy keydiff@paper-window10 --policy keydiff@paper-window20
    --policy knorm --policy tova@keydiff --policy streaming@keydiff --policy window --policy snapkv@keydiff"
kd_eq8="keydiff (block=128,anchor=normalized,pairwise=false,window_frac=0)"
kd_raw="keydiff (block=128,anchor=raw,pairwise=false,window_frac=0)"
kd_w10="keydiff (block=128,anchor=raw,pairwise=false,window_frac=0.1)"
kd_w20="keydiff (block=128,anchor=raw,pairwise=false,window_frac=0.2)"
kd_knorm="knorm (block=128,window_frac=0)"
kd_tova="tova (mode=group,protect_current=false,block=128)"
kd_sink="streaming (sinks=4)"
kd_snap="snapkv (window=32,kernel=7,pool=avg,gqa=mean,block=128)"
# K-4's budgets: below the shortest prompt trace (236 positions: replay refuses a budget above a trace's length),
# from below the smaller level compared (64 tokens' KV) to where the window holds more than the larger (128)
kd_budgets=33,65,129,193
# K-3's budget: 32 keys retained (N = B - 1), below every prompt
kd_logdet_budget=33

# ---- per prompt trace: the figures K-1 .. K-3 aggregate, and K-4's replays -------------------------------------
for mname in $study_models; do
    kd="$out/keydiff_$mname"
    mkdir -p "$kd"
    : > "$kd/stats_prompt.txt"
    : > "$kd/stats_all.txt"
    : > "$kd/logdet.txt"
    : > "$kd/prompt_lengths.txt"
    for t in "$out/prompts/$mname"/*.kvt; do kd_head_dim "$t" > "$kd/head_dim"; break; done
    for t in "$out/prompts/$mname"/*.kvt; do
        b=$(basename "$t" .kvt)
        for s in prompt all; do
            "$KVSIM_BIN" keys "$t" --scope "$s" --csv > "$kd/$b.keys_$s.csv"
            f="$kd/$b.keys_$s.csv"
            # trace, median rho_sum, rho_perq, heads with rho_sum < 0, heads, with rho_perq < 0, heads, median
            # cos(mean k, mean q), heads with it < 0, heads, median cos(k, mean k), median key-norm CV
            echo "$b $(kd_median "$f" rho_sum) $(kd_median "$f" rho_perq) $(kd_negative "$f" rho_sum)" \
                "$(kd_negative "$f" rho_perq) $(kd_median "$f" cos_kq) $(kd_negative "$f" cos_kq)" \
                "$(kd_median "$f" cos_k_mk) $(kd_median "$f" norm_cv)" >> "$kd/stats_$s.txt"
        done
        # shellcheck disable=SC2086
        "$KVSIM_BIN" keys "$t" --scope prompt --budget "$kd_logdet_budget" $kd_logdet_specs --csv > "$kd/$b.logdet.csv"
        # trace, the mean over heads of logdet_0 .. logdet_5, the heads where KeyDiff (Eq. 8) is above TOVA, Sink
        # and SnapKV, the heads
        awk -F, -v b="$b" 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
            { for (p = 0; p < 6; p++) s[p] += $c["logdet_" p]; n++
              if ($c["logdet_0"] > $c["logdet_3"] && $c["logdet_0"] > $c["logdet_4"] && $c["logdet_0"] > $c["logdet_5"]) w++ }
            END { printf "%s", b; for (p = 0; p < 6; p++) printf " %.17g", s[p] / n; printf " %d %d\n", w, n }' \
            "$kd/$b.logdet.csv" >> "$kd/logdet.txt"
        "$KVSIM_BIN" info "$t" | awk '/^positions/ { sub(/\(/, "", $3); print $3 }' >> "$kd/prompt_lengths.txt"
        # shellcheck disable=SC2086
        "$KVSIM_BIN" replay "$t" --db "$out/keydiff_$mname.db" $kd_specs --budgets "$kd_budgets" > /dev/null \
            2>> "$out/keydiff_warnings.txt"
    done
done

# ---- K-1: K3, does a key's distinctiveness go with the attention it receives? ----------------------------------
block_line K-1 "| model (traces) | scope | rho, attention summed over later queries | rho, attention per query that saw the key | heads with rho < 0 (summed, per query) |"
block_line K-1 "|---|---|---|---|---|"
for mname in $study_models; do
    kd="$out/keydiff_$mname"
    n_traces=$(n_traces_of "$mname")
    for s in prompt all; do
        f="$kd/stats_$s.txt"
        rs=$(cut -d' ' -f2 "$f" | iv_of "K-1 $mname $s rho_sum")
        rq=$(cut -d' ' -f3 "$f" | iv_of "K-1 $mname $s rho_perq")
        label=$([ "$s" = prompt ] && echo "first prompt" || echo "every position")
        block_line K-1 "| $mname ($n_traces) | $label | $rs | $rq | $(kd_sum_counts "$f" 4 5), $(kd_sum_counts "$f" 6 7) |"
    done
done

# ---- K-2: K12, key and query geometry -------------------------------------------------------------------------
block_line K-2 "| model (traces) | scope | cos(mean key, mean query) | heads where it is < 0 | cos(key, mean key) | key-norm coefficient of variation |"
block_line K-2 "|---|---|---|---|---|---|"
for mname in $study_models; do
    kd="$out/keydiff_$mname"
    n_traces=$(n_traces_of "$mname")
    for s in prompt all; do
        f="$kd/stats_$s.txt"
        kq=$(cut -d' ' -f8 "$f" | iv_of "K-2 $mname $s cos_kq")
        kmk=$(cut -d' ' -f11 "$f" | iv_of "K-2 $mname $s cos_k_mk")
        cv=$(cut -d' ' -f12 "$f" | iv_of "K-2 $mname $s norm_cv")
        label=$([ "$s" = prompt ] && echo "first prompt" || echo "every position")
        block_line K-2 "| $mname ($n_traces) | $label | $kq | $(kd_sum_counts "$f" 9 10) | $kmk | $cv |"
    done
done

# ---- K-3: K11, log-determinant of the retained unit keys' Gram matrix --------------------------------------------
block_line K-3 "| model (traces) | budget | KeyDiff (Eq. 8) | KeyDiff \`@paper\` | KeyDiff \`@paper-window20\` | TOVA | Sink | SnapKV | heads where KeyDiff is above TOVA, Sink and SnapKV |"
block_line K-3 "|---|---:|---|---|---|---|---|---|---|"
for mname in $study_models; do
    kd="$out/keydiff_$mname"
    n_traces=$(n_traces_of "$mname")
    f="$kd/logdet.txt"
    row="| $mname ($n_traces) | $kd_logdet_budget"
    for p in 0 1 2 3 4 5; do row="$row | $(cut -d' ' -f$((p + 2)) "$f" | iv_of "K-3 $mname $kd_logdet_budget logdet_$p")"; done
    block_line K-3 "$row | $(kd_sum_counts "$f" 8 9) |"
done
block_line K-3 ""
block_line K-3 "Paired differences of the mean logdet over the same traces (resolved when the 95% interval excludes 0):"
block_line K-3 ""
block_line K-3 "| model (traces) | budget | KeyDiff − TOVA | KeyDiff − Sink | KeyDiff − SnapKV | KeyDiff \`@paper-window20\` − KeyDiff \`@paper\` |"
block_line K-3 "|---|---:|---|---|---|---|"
for mname in $study_models; do
    kd="$out/keydiff_$mname"
    n_traces=$(n_traces_of "$mname")
    f="$kd/logdet.txt"
    row="| $mname ($n_traces) | $kd_logdet_budget"
    for ab in "2 5" "2 6" "2 7" "4 3"; do
        row="$row | $(awk -v a="${ab% *}" -v b="${ab#* }" '{ print $a, $b }' "$f" | iv_of "K-3 $mname $kd_logdet_budget pair $ab" --paired)"
    done
    block_line K-3 "$row |"
done

# ---- K-4: KeyDiff against the baselines at equal resident memory -------------------------------------------------
# The levels: the bytes of 64 and 128 tokens' fp16 keys and values per KV head (256 d and 512 d bytes), so both
# models are compared where the window holds 64 and 128 tokens.
# kd_cell CSV LABEL N_TRACES: "mean [lo, hi]" of out_err_mean for the group LABEL of `compare --across-traces --csv`
kd_cell() {
    v=$(csv_to_tsv < "$1" | awk -F'\t' -v want="$2" '
        NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
        $c["label"] == want && !done { print $c["out_err_mean"] "\t" $c["out_err_mean_lo"] "\t" $c["out_err_mean_hi"] "\t" $c["out_err_mean_n"]; done = 1 }')
    fmt_iv "$(echo "$v" | cut -f1)" "$(echo "$v" | cut -f2)" "$(echo "$v" | cut -f3)" "$(echo "$v" | cut -f4)" "$3"
}
# kd_pair CSV A B: the paired difference A − B of out_err_mean from `compare --pairs --csv` (either order), or "-"
kd_pair() {
    csv_to_tsv < "$1" | awk -F'\t' -v A="$2" -v B="$3" -v n="$4" '
        NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
        { if ($c["a"] == A && $c["b"] == B) s = 1; else if ($c["a"] == B && $c["b"] == A) s = -1; else next
          if ($c["n"] == 0) { print "-"; found = 1; exit }
          if ($c["n"] < 2) { printf "%+.3g (n = %d)\n", s * $c["diff"], $c["n"]; found = 1; exit }
          lo = s > 0 ? $c["diff_lo"] : -$c["diff_hi"]; hi = s > 0 ? $c["diff_hi"] : -$c["diff_lo"]
          printf "%+.3g [%+.3g, %+.3g]%s, %s\n", s * $c["diff"], lo, hi, ($c["n"] < n ? " (n = " $c["n"] ")" : ""),
              ($c["resolved"] != 0 ? "resolved" : "not resolved"); found = 1; exit }
        END { if (!found) print "-" }'
}
block_line K-4 "| model (traces) | configuration | out_err_mean at 64 tokens' KV | at 128 tokens' KV |"
block_line K-4 "|---|---|---|---|"
for mname in $study_models; do
    db="$out/keydiff_$mname.db"
    n_traces=$(n_traces_of "$mname")
    d=$(cat "$out/keydiff_$mname/head_dim")
    for X in $((256 * d)) $((512 * d)); do
        "$KVSIM_BIN" compare "$db" --match mem --at "$X" --across-traces --metric out_err_mean --csv > "$out/keydiff_${mname}_$X.csv"
        "$KVSIM_BIN" compare "$db" --match mem --at "$X" --across-traces --pairs --metric out_err_mean --csv \
            > "$out/keydiff_${mname}_${X}_pairs.csv"
        "$KVSIM_BIN" compare "$db" --match mem --at "$X" --across-traces --metric out_err_mean > "$out/keydiff_${mname}_$X.txt"
    done
    X1=$((256 * d)) X2=$((512 * d))
    mlabel="$mname ($n_traces; $((X1 / 1024)) / $((X2 / 1024)) KiB)"
    for entry in "KeyDiff (Eq. 8: normalised-key anchor)|$kd_eq8" "KeyDiff \`@paper\` (raw anchor)|$kd_raw" \
        "KeyDiff \`@paper-window10\` (10% window)|$kd_w10" "KeyDiff \`@paper-window20\` (20% window)|$kd_w20" \
        "KNorm|$kd_knorm" "TOVA|$kd_tova" "Sink (StreamingLLM, 4 sinks)|$kd_sink" "window|window" \
        "SnapKV (prompt only)|$kd_snap"; do
        block_line K-4 "| $mlabel | ${entry%%|*} | $(kd_cell "$out/keydiff_${mname}_$X1.csv" "${entry#*|}" "$n_traces") | $(kd_cell "$out/keydiff_${mname}_$X2.csv" "${entry#*|}" "$n_traces") |"
    done
done
block_line K-4 ""
block_line K-4 "Paired differences of out_err_mean over the same traces (resolved when the 95% interval excludes 0; n when"
block_line K-4 "fewer traces than the model's have both):"
block_line K-4 ""
block_line K-4 "| model (traces) | difference | at 64 tokens' KV | at 128 tokens' KV |"
block_line K-4 "|---|---|---|---|"
for mname in $study_models; do
    n_traces=$(n_traces_of "$mname")
    d=$(cat "$out/keydiff_$mname/head_dim")
    X1=$((256 * d)) X2=$((512 * d))
    for entry in "KeyDiff − TOVA|$kd_eq8|$kd_tova" "KeyDiff − Sink|$kd_eq8|$kd_sink" "KeyDiff − window|$kd_eq8|window" \
        "KeyDiff − SnapKV|$kd_eq8|$kd_snap" "KeyDiff \`@paper\` − KeyDiff (the raw anchor)|$kd_raw|$kd_eq8" \
        "\`@paper-window10\` − \`@paper\` (10% window)|$kd_w10|$kd_raw" \
        "\`@paper-window20\` − \`@paper-window10\` (10% more window)|$kd_w20|$kd_w10" \
        "window − \`@paper-window20\` (all window)|window|$kd_w20" "\`@paper-window20\` − KeyDiff|$kd_w20|$kd_eq8"; do
        rest=${entry#*|}
        block_line K-4 "| $mname ($n_traces) | ${entry%%|*} | $(kd_pair "$out/keydiff_${mname}_${X1}_pairs.csv" "${rest%%|*}" "${rest#*|}" "$n_traces") | $(kd_pair "$out/keydiff_${mname}_${X2}_pairs.csv" "${rest%%|*}" "${rest#*|}" "$n_traces") |"
    done
done

# ---- K-5: K5, LongBench's prompt lengths and average compression ratios (arithmetic) ------------------------------
# The paper's Table 8 (App. F.3, ../shared/papers/keydiff.txt): per dataset, the prompts (Llama tokenizer) shorter
# than 2K, in 2K-4K, 4K-6K, 6K-8K and longer than 8K, their total, and the average compression ratio
# CR = mean over the prompts of min(N / L_i, 1) it reports at N = 2K, 4K, 6K and 8K (POLICY_SPEC §4 item 9).
# Language: en, zh or code (LongBench's English subset of Table 1 is en and code).
cat > "$out/keydiff_longbench.txt" << 'EOF'
NarrativeQA en 0 0 0 8 192 200 0.10 0.20 0.30 0.40
Qasper en 1 77 83 25 14 200 0.47 0.82 0.96 0.98
MultiFieldQA-en en 9 31 21 32 57 150 0.40 0.66 0.82 0.93
MultiFieldQA-zh zh 14 69 47 33 37 200 0.49 0.78 0.91 0.98
HotpotQA en 1 4 12 12 171 200 0.19 0.37 0.52 0.66
2WikiMQA en 8 17 68 54 53 200 0.36 0.65 0.85 0.92
MuSiQue en 0 0 0 3 197 200 0.13 0.27 0.40 0.53
DuReader zh 0 0 0 16 184 200 0.17 0.34 0.52 0.68
GovReport en 0 20 29 45 106 200 0.28 0.52 0.70 0.81
QMSum en 0 1 17 15 167 200 0.18 0.36 0.52 0.66
MultiNews en 99 71 19 6 5 200 0.81 0.96 0.98 0.53
VCSUM zh 4 20 18 32 126 200 0.27 0.49 0.65 0.68
TREC en 4 43 41 39 73 200 0.38 0.66 0.84 0.94
TriviaQA en 4 21 15 21 139 200 0.26 0.46 0.60 0.72
SAMSum en 6 29 34 17 114 200 0.32 0.55 0.71 0.82
LSHT zh 0 0 3 8 189 200 0.13 0.27 0.39 0.52
PassageCount en 0 0 3 13 184 200 0.15 0.31 0.46 0.60
PassageRetrieval-en en 0 0 0 0 200 200 0.16 0.33 0.49 0.66
PassageRetrieval-zh zh 0 0 160 10 0 170 0.37 0.74 0.99 1.00
LCC code 80 86 21 4 9 200 0.78 0.95 0.98 0.99
RepoBench-P code 0 25 37 25 113 200 0.27 0.52 0.67 0.78
EOF
# A prompt in the bin (a, b] (in K tokens) has min(N / L, 1) in [min(N / b, 1), min(N / a, 1)]: the bins bound each
# dataset's CR (a = 0: 1; b = infinity: 0); a reported CR outside its bounds (by more than its rounding, 0.005)
# cannot be, nor can a CR that falls as N grows.
awk -v paper="0.31 0.53 0.67 0.77" '
    BEGIN { split("0 2 4 6 8", a, " "); split("2 4 6 8 0", b, " "); split(paper, avg, " ") }
    { n++; T += $8; over8 += $7; under2 += $3; if ($2 != "zh") { Te += $8; over8e += $7 }
      for (k = 1; k <= 4; k++) {
          N = 2 * k; lo = 0; hi = 0
          for (j = 1; j <= 5; j++) {
              c = $(j + 2); l = (b[j] == 0) ? 0 : (N / b[j] < 1 ? N / b[j] : 1); h = (a[j] == 0) ? 1 : (N / a[j] < 1 ? N / a[j] : 1)
              lo += c * l; hi += c * h
          }
          r = $(8 + k); sum[k] += r; wsum[k] += r * $8; LO[k] += lo; HI[k] += hi
          if (r < lo / $8 - 0.005 || r > hi / $8 + 0.005)
              bad = bad sprintf("- %s at %dK: the table gives %.2f; its bins allow [%.3f, %.3f]\n", $1, N, r, lo / $8, hi / $8)
          if (k > 1 && r < $(7 + k)) bad = bad sprintf("- %s: the CR falls from %.2f at %dK to %.2f at %dK (it cannot fall as N grows)\n", $1, $(7 + k), N - 2, r, N)
          name[n] = $1; cr[n, k] = r
      } }
    END {
        printf "Prompts longer than 8K: %d of %d (%.1f%%) over the 21 datasets, %d of %d (%.1f%%) over the English and code ones; the paper says 51%%.\n", over8, T, 100 * over8 / T, over8e, Te, 100 * over8e / Te
        printf "Prompts longer than 2K (compressed at N = 2K): %d of %d (%.1f%%); the paper reads 1 − CR(2K) = %.0f%% as the share compressed.\n", T - under2, T, 100 * (T - under2) / T, 100 * (1 - avg[1])
        print ""
        print "| N | the paper'"'"'s average CR | 1 − CR (the paper'"'"'s compression) | mean of the 21 datasets'"'"' CRs | mean over the prompts | CR the bins allow (over the prompts) |"
        print "|---|---:|---:|---:|---:|---|"
        for (k = 1; k <= 4; k++)
            printf "| %dK | %.2f | %.0f%% | %.4f | %.4f | [%.3f, %.3f] |\n", 2 * k, avg[k], 100 * (1 - avg[k]), sum[k] / n, wsum[k] / T, LO[k] / T, HI[k] / T
        print ""
        print "Per-dataset CRs the bins rule out:"
        print ""
        printf "%s", bad == "" ? "- none\n" : bad
        for (i = 1; i <= n; i++) if (name[i] == "MultiNews") m = i
        rest = sum[4] - cr[m, 4]
        printf "\nThe 8K average %.2f (the mean of the 21 rounded to 0.01) holds for MultiNews'"'"' 8K CR anywhere in [%.3f, 1]; the mean with the table'"'"'s %.2f is %.4f.\n", avg[4], (avg[4] - 0.005) * n - rest, cr[m, 4], sum[4] / n
    }' "$out/keydiff_longbench.txt" >> "$blocks/K-5.md"
block_line K-5 ""
block_line K-5 "The same ratio for the prompts of this study, CR = mean min(N / L_i, 1) over the first prompts (each model's own tokens), at K-4's levels (N = 64 and 128) and K-3's budgets (N = 32 and 64):"
block_line K-5 ""
block_line K-5 "| model (prompts) | prompt lengths | CR at N = 32 | 64 | 128 |"
block_line K-5 "|---|---|---:|---:|---:|"
for mname in $study_models; do
    sort -n "$out/keydiff_$mname/prompt_lengths.txt" | awk -v m="$mname" '{ L[++n] = $1 }
        END { printf "| %s (%d) | %d-%d |", m, n, L[1], L[n]
              for (k = 0; k < 3; k++) { N = 32 * 2 ^ k; s = 0; for (i = 1; i <= n; i++) s += (N < L[i] ? N / L[i] : 1); printf " %.3f |", s / n }
              printf "\n" }' >> "$blocks/K-5.md"
done

# ---- K-6: K14, the scoring cost per eviction event against n ----------------------------------------------------
# kvsim's replay charges a decode eviction event of KeyDiff with n_c candidates (the C held + the current token)
# d n_c key elements re-read when scoring is not fused with attention (traffic_aux_unfused_bytes) and n_c + d
# auxiliary temporaries (mu and the scores; storage_peak - storage_kv): n_c is read back from the replays, at the
# step where each is largest. Beside it, App. B.1's operation count for n_c keys of dimension d (POLICY_SPEC §4
# item 11, term by term): norms n d mul, n (d - 1) add, n sqrt; normalisation n d mul, n div; mean (n - 1) d add,
# 1 div, d mul; dots with mu n d mul, n (d - 1) add; |mu| d mul, d - 1 add, 1 sqrt; norm products n mul, n add;
# division n div; weighted add = sqrt = 1, mul = 3, div = 47.
kd_flops() {
    awk -v n="$1" -v d="$2" 'BEGIN {
        mul = n * d + n * d + d + n * d + d + n
        add = n * (d - 1) + (n - 1) * d + n * (d - 1) + (d - 1) + n
        sq = n + 1; dv = n + 1 + n
        f = add + 3 * mul + sq + 47 * dv
        printf "%d | %d | %d | %d | %d | %.1f\n", add, mul, sq, dv, f, f / n }'
}
block_line K-6 "| model (d) | budget B | candidates per event n (replay) | key bytes re-read per event, unfused | temporaries per event (bytes) | adds | multiplies | square roots | divides | weighted FLOPs | FLOPs / n |"
block_line K-6 "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for mname in $study_models; do
    db="$out/keydiff_$mname.db"
    d=$(cat "$out/keydiff_$mname/head_dim")
    for B in 33 65 129 193; do
        # the distinct values over the traces (one when every trace gives the same)
        vals=$("$KVSIM_BIN" runs "$db" --csv --summary --policy keydiff --budget "$B" | csv_to_tsv | awk -F'\t' -v want="$kd_eq8" '
            NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
            $c["policy"] " (" $c["params"] ")" == want { print $c["traffic_aux_unfused_bytes_max"], $c["storage_peak_bytes_max"] - $c["storage_kv_bytes_max"] }' |
            sort -u)
        if [ -z "$vals" ] || [ "$(echo "$vals" | wc -l)" -ne 1 ]; then
            echo "keydiff.sh: $mname budget $B: no single scoring cost per event over the traces: '$vals'" >&2
            exit 1
        fi
        rd=${vals% *} tmp=${vals#* }
        nc=$(awk -v r="$rd" -v d="$d" 'BEGIN { printf "%d", r / (2 * d) }') # fp16 keys: replay's default --kv-bytes 2
        block_line K-6 "| $mname ($d) | $B | $nc | $rd | $tmp | $(kd_flops "$nc" "$d") |"
    done
done
for N in 2048 4096 6144 8192; do
    nc=$((N + 1))
    block_line K-6 "| Llama-3.1-8B (128), arithmetic | $nc | $nc | $((nc * 128 * 2)) | $(((nc + 128) * 4)) | $(kd_flops "$nc" 128) |"
done
