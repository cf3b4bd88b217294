# newer_chunk.sh — ChunkKV, LagKV, CurDKV and R-KV against their checkable claims (FINDINGS.md, "Newer chunk and score
# methods"; ../shared/POLICY_SPEC_2.md §2.3 CH3, §2.4 LG1-LG3, §2.7 CU2, §2.9 RK1), over the seven prompts of each
# model. Sourced by examples/findings.sh (its variables and functions: $KVSIM_BIN, $out, $blocks, $study_models,
# block_line, csv_to_tsv, fmt_iv, iv_of, n_traces_of, trace_facts).
#
# Every policy at its defaults (chunkkv, cur, rkv; lagkv and lagkv@x8, which have no token budget) beside the plain
# baselines SnapKV (gqa=mean: one set per KV head, as ChunkKV's and CurDKV's) , H2O and StreamingLLM. N-C-1 and N-C-2
# compare at equal resident bytes per KV head (prompt-only policies keep every generated token, so their bytes are
# measured, never their budget); N-C-3 puts LagKV, whose memory follows its ratio, against the baselines at LagKV's
# own measured bytes on each trace.

nc_base="snapkv:gqa=mean h2o streaming"
nc_new="chunkkv cur rkv"

# nc_name SPEC: how the tables name a configuration
nc_name() {
    case $1 in
        chunkkv) echo "ChunkKV" ;; cur) echo "CurDKV" ;; rkv) echo "R-KV" ;; snapkv:gqa=mean) echo "SnapKV (gqa=mean)" ;;
        h2o) echo "H2O" ;; streaming) echo "StreamingLLM" ;; lagkv) echo "LagKV (r 0.5)" ;; lagkv@x8) echo "LagKV (r 0.125)" ;;
        *) echo "$1" ;;
    esac
}
# nc_pol SPEC: the policy name a spec runs
nc_pol() { echo "${1%%[:@]*}"; }

# ---- the runs ----------------------------------------------------------------------------------------------------
nc_run_model() {
    db="$out/newer_chunk_$1.db"
    for t in "$out/prompts/$1"/*.kvt; do
        "$KVSIM_BIN" replay "$t" --db "$db" --policy chunkkv --policy cur --policy rkv --policy snapkv:gqa=mean \
            --policy h2o --policy streaming --budgets 16,32,48,64,96,128,192 > /dev/null 2>> "$out/newer_chunk_warnings_$1.txt"
        "$KVSIM_BIN" replay "$t" --db "$db" --policy lagkv --policy lagkv@x8 --budgets 1 > /dev/null \
            2>> "$out/newer_chunk_warnings_$1.txt"
    done
}
nc_pids=""
for mname in $study_models; do
    nc_run_model "$mname" &
    nc_pids="$nc_pids $!"
done
for nc_pid in $nc_pids; do wait "$nc_pid"; done

# nc_levels MODEL: the compared resident bytes per KV head, as 96 and 128 tokens' K/V (2 d elements of 2 bytes): in
# reach of every budgeted series (a prompt-only series starts at its budget plus the generated tokens)
nc_levels() {
    trace_facts "$(ls "$out/prompts/$1"/*.kvt | head -n 1)"
    echo "$((96 * 4 * d)) $((128 * 4 * d))"
}

# ---- N-C-1: error at equal resident bytes; N-C-2: the claims' paired differences ----------------------------------
block_line N-C-1 "| model (traces) | at (resident bytes per KV head)$(for s in $nc_new $nc_base; do printf ' | %s' "$(nc_name "$s")"; done) |"
block_line N-C-1 "|---|---|---|---|---|---|---|---|"
block_line N-C-2 "| model (traces) | at (resident bytes per KV head) | claim | difference in mean output error (paired) |"
block_line N-C-2 "|---|---|---|---|"
for mname in $study_models; do
    n_traces=$(n_traces_of "$mname")
    db="$out/newer_chunk_$mname.db"
    for X in $(nc_levels "$mname"); do
        err_tables_at "$db" "$X" "$out/newer_chunk_${mname}_$X"
        row="| $mname ($n_traces) | $X"
        for s in $nc_new $nc_base; do
            p=$(nc_pol "$s")
            if [ "$p" = snapkv ]; then c=$(err_cell "$out/newer_chunk_${mname}_$X.tsv" "$n_traces" snapkv params gqa=mean)
            else c=$(err_cell "$out/newer_chunk_${mname}_$X.tsv" "$n_traces" "$p"); fi
            [ "$c" = "-" ] && c="out of range"
            row="$row | $c"
        done
        block_line N-C-1 "$row |"
        # the pairs: a − b of the policies' groups (labels start with the policy name)
        for pr in "chunkkv snapkv CH3: ChunkKV − SnapKV" "cur snapkv CU2: CurDKV − SnapKV" "cur chunkkv CU2: CurDKV − ChunkKV" \
                  "rkv h2o RK: R-KV − H2O"; do
            a=$(echo "$pr" | cut -d' ' -f1)
            b=$(echo "$pr" | cut -d' ' -f2)
            what=$(echo "$pr" | cut -d' ' -f3-)
            d_=$(awk -F'\t' -v a="$a" -v b="$b" -v t="$n_traces" 'NR == 1 { for (i = 1; i <= NF; i++) k[$i] = i; next }
                function pol(l) { sub(/ .*/, "", l); return l }
                { la = pol($k["a"]); lb = pol($k["b"]); s = 0 }
                la == a && lb == b { s = 1 } la == b && lb == a { s = -1 }
                s != 0 && $k["n"] > 0 {
                    lo = s > 0 ? $k["diff_lo"] : -$k["diff_hi"]; hi = s > 0 ? $k["diff_hi"] : -$k["diff_lo"]
                    if ($k["n"] < 2) { printf "%+.3g (n = 1 of %d, no interval)\n", s * $k["diff"], t; found = 1; exit }
                    printf "%+.3g [%+.3g, %+.3g]%s, %s\n", s * $k["diff"], lo, hi,
                        ($k["n"] < t ? sprintf(" (n = %d of %d)", $k["n"], t) : ""), ($k["resolved"] != 0 ? "resolved" : "not resolved")
                    found = 1; exit }
                END { if (!found) print "none: no trace where both have a value" }' "$out/newer_chunk_${mname}_${X}_pairs.tsv")
            block_line N-C-2 "| $mname ($n_traces) | $X | $what | $d_ |"
        done
    done
done

# ---- N-C-3: LagKV (no token budget) — its memory against the ratio, and the baselines at its own bytes -----------
# Per trace: LagKV's mean attended tokens over the decode steps against §2.4's |Res(n)| (sink 16, lag 128, floor(r 128)
# kept per partition; a step at position p attends |Res(p)| + 1, the triggering one before it compresses), and the
# formula's |Res(n)|/n at the trace's end (LG1: it tends to floor(r L)/L); then each baseline's error at LagKV's mean
# resident bytes on that trace (kvsim compare --per-trace --at), paired with LagKV's own error over the traces.
block_line N-C-3 "| model (traces) | LagKV | mean attended, measured ÷ §2.4 formula | \\|Res(n)\\|/n at the end (formula) | its error | SnapKV (gqa=mean) at its bytes: error − LagKV's (paired) | H2O, same | StreamingLLM, same |"
block_line N-C-3 "|---|---|---|---|---|---|---|---|"
for mname in $study_models; do
    n_traces=$(n_traces_of "$mname")
    db="$out/newer_chunk_$mname.db"
    for lg in lagkv lagkv@x8; do
        keep=$([ "$lg" = lagkv ] && echo 64 || echo 16)
        params=$([ "$lg" = lagkv ] && echo "ratio=0.5" || echo "ratio=0.125")
        : > "$out/newer_chunk_${mname}_$lg.tsv"
        : > "$out/newer_chunk_${mname}_${lg}_pairs.tsv"
        for t in "$out/prompts/$mname"/*.kvt; do
            trace_facts "$t"
            "$KVSIM_BIN" runs "$db" --csv --summary --policy lagkv --trace "$t" | csv_to_tsv | awk -F'\t' -v want="$params" \
                -v n="$N" -v P="$P" -v keep="$keep" 'function res(x, m) { if (x < 16 + 256) return x; m = int((x - 16) / 128) - 1
                    return 16 + keep * m + (x - 16) - m * 128 }
                NR == 1 { for (i = 1; i <= NF; i++) if (!(($i) in c)) c[$i] = i; next }
                index($c["params"], want) > 0 {
                    for (p = P; p < n; p++) f += res(p) + 1
                    printf "-\t%.17g\t%.17g\t%.17g\t%.17g\n", $c["attended_tokens_mean"] / (f / (n - P)), res(n) / n,
                        $c["out_err_mean"], $c["storage_bytes_mean"]; exit }' > "$out/nc_row.tsv"
            x=$(cut -f5 "$out/nc_row.tsv")
            [ -n "$x" ] || continue
            "$KVSIM_BIN" compare "$db" --match mem --at "$x" --per-trace --trace "$t" --csv --metric out_err_mean |
                csv_to_tsv > "$out/nc_at.tsv"
            for b in snapkv h2o streaming; do
                bv=$(awk -F'\t' -v p="$b" 'NR == 1 { for (i = 1; i <= NF; i++) k[$i] = i; next }
                    $k["policy"] == p && (p != "snapkv" || index($k["params"], "gqa=mean") > 0) && $k["status"] != "gap" &&
                    $k["status"] != "out_of_range" { print $k["out_err_mean"]; exit }' "$out/nc_at.tsv")
                printf '%s\t%s\t%s\n' "$b" "$(cut -f4 "$out/nc_row.tsv")" "${bv:--}" >> "$out/newer_chunk_${mname}_${lg}_pairs.tsv"
            done
            cat "$out/nc_row.tsv" >> "$out/newer_chunk_${mname}_$lg.tsv"
        done
        meas=$(cut -f2 "$out/newer_chunk_${mname}_$lg.tsv" | iv_of "N-C-3 $mname $lg measured")
        form=$(cut -f3 "$out/newer_chunk_${mname}_$lg.tsv" | iv_of "N-C-3 $mname $lg formula")
        err=$(cut -f4 "$out/newer_chunk_${mname}_$lg.tsv" | iv_of "N-C-3 $mname $lg err")
        cmp=""
        for b in snapkv h2o streaming; do
            # a baseline within reach of LagKV's bytes on fewer than two traces has no interval: the values alone
            nb=$(awk -F'\t' -v b="$b" '$1 == b && $3 != "-"' "$out/newer_chunk_${mname}_${lg}_pairs.tsv" | wc -l)
            if [ "$nb" -ge 2 ]; then
                pv=$(awk -F'\t' -v b="$b" '$1 == b && $3 != "-" { print $3 "\t" $2 }' "$out/newer_chunk_${mname}_${lg}_pairs.tsv" |
                    iv_of "N-C-3 $mname $lg $b" --paired)
            elif [ "$nb" -eq 1 ]; then
                pv=$(awk -F'\t' -v b="$b" -v t="$n_traces" '$1 == b && $3 != "-" { printf "%+.3g (n = 1 of %d, no interval)", $3 - $2, t }' \
                    "$out/newer_chunk_${mname}_${lg}_pairs.tsv")
            else
                pv="none: its budgets never reach LagKV's bytes"
            fi
            cmp="$cmp | $pv"
        done
        block_line N-C-3 "| $mname ($n_traces) | $(nc_name "$lg") | $meas | $form | $err$cmp |"
    done
done
rm -f "$out/nc_row.tsv" "$out/nc_at.tsv"
