# codecs.sh — KV quantization and key-channel pruning against eviction at equal bytes (FINDINGS.md, "KV
# quantization and key pruning against eviction at equal bytes"; sim/codec.h; KIVI, Liu et al. ICML 2024; ThinK, Xu
# et al. ICLR 2025): where full caches held in 4, 2 or 8 bits (int, KIVI-2, transformers' QuantizedCache, fp8) and
# ThinK's thinner keys sit against 16-bit eviction (window, StreamingLLM, H2O, TOVA, SnapKV) holding the same bytes,
# and what the compositions (a 4-bit window, KIVI + H2O, ThinK + SnapKV) buy — over the seven prompts of each model.
# Sourced by examples/findings.sh (its variables and functions: $KVSIM_BIN, $out, $blocks, $study_models,
# block_line, csv_to_tsv, fmt_iv, iv_of, n_traces_of).
#
# Bytes are a run's storage_bytes_mean: what the cache holds per (layer, KV head), mean over the decode steps,
# counted by the codec's own rule (codes, fp16 scales and zero points, 16-bit residual rows, ThinK's channel mask).
# Q-1 gives each representation's full cache; Q-2 reads every 16-bit eviction policy at the bytes of each of those
# full caches, trace by trace (`kvsim compare --match mem --at X --trace T --per-trace`: interpolated in log bytes
# between the policy's two runs around X), with the paired difference over the traces; Q-3 compares the compositions
# at fixed bytes across the traces (`kvsim compare --match mem --across-traces [--pairs]`); Q-4 at equal nominal size
# (a 4-bit window of 4B tokens against a 16-bit window of B; ThinK + SnapKV at SnapKV's budget) and ThinK + SnapKV
# at SnapKV's own bytes.

# The codecs, by their canonical specs (sim/codec.h). "Per-token" int groups run along the channels of one row
# (k_axis = v_axis = channel); a group of 32 is clipped to the row (d = 8 or 16 here). kivi's residual R = 32 is the
# smallest R its group of 32 allows (the repository's example.py uses it): R = 128 is half or more of these traces'
# decode, so the R = 32 row shows KIVI with a residual closer to the share it has on a long context.
q_i4="int:bits=4,group=32,k_axis=channel,v_axis=channel"
q_i2="int:bits=2,group=32,k_axis=channel,v_axis=channel"
q_kivi="kivi:bits=2,group=32,residual=128"
q_kivi32="kivi:bits=2,group=32,residual=32"
q_hf="hf:bits=4,group=64,residual=128"
q_fp8="fp8:format=e4m3,scale=1,per=tensor"
q_think="think:ratio=0.4,window=32,recent=32"
q_codecs="$q_i4 $q_i2 $q_kivi $q_kivi32 $q_hf $q_fp8 $q_think"
q_evict="window streaming h2o tova snapkv"

# q_name CODEC: how the tables name a representation ("" = 16 bits, as captured)
q_name() {
    case $1 in
        "") echo "16-bit (as captured)" ;;
        "$q_i4") echo "int4 per-token" ;;
        "$q_i2") echo "int2 per-token" ;;
        "$q_kivi") echo "KIVI-2 (G 32, R 128: the paper's)" ;;
        "$q_kivi32") echo "KIVI-2 (G 32, R 32: scaled to these traces, not the paper's default)" ;;
        "$q_hf") echo "HF QuantizedCache (int4, group 64, R 128)" ;;
        "$q_fp8") echo "fp8 e4m3 (scale 1)" ;;
        "$q_think") echo "ThinK (40 % of key channels pruned)" ;;
        *) echo "$1" ;;
    esac
}
# q_iv LABEL TOTAL: "mean [lo, hi]" of the values on standard input (one per trace), "(n = N of TOTAL)" when some
# traces have none, "none" when there is none; three significant figures
q_iv() {
    v=$(cat)
    if [ -z "$v" ]; then echo "none"; return; fi
    echo "$v" | "$KVSIM_BIN" interval --label "$1" | awk -F'\t' -v t="$2" '
        { if ($4 < 2) printf "%.3g (n = 1 of %d)\n", $1, t
          else if ($4 < t) printf "%.3g [%.3g, %.3g] (n = %d of %d)\n", $1, $2, $3, $4, t
          else printf "%.3g [%.3g, %.3g]\n", $1, $2, $3 }'
}
# q_piv LABEL TOTAL: the paired difference of the pairs "a b" on standard input: "+d [+lo, +hi], resolved" (or
# "not resolved"; resolved when the interval excludes 0), "(n = N of TOTAL)" when some traces have no pair; a single
# pair has no interval and no judgement (a table row's "resolved" is read against the nearest interval before it)
q_piv() {
    v=$(cat)
    if [ -z "$v" ]; then echo "none"; return; fi
    echo "$v" | "$KVSIM_BIN" interval --paired --label "$1" | awk -F'\t' -v t="$2" '
        { r = ($5 != 0 ? "resolved" : "not resolved")
          if ($4 < 2) printf "%+.3g (n = 1 of %d, no interval)\n", $1, t
          else printf "%+.3g [%+.3g, %+.3g]%s, %s\n", $1, $2, $3, ($4 < t ? sprintf(" (n = %d of %d)", $4, t) : ""), r }'
}

# ---- the runs: per trace, every representation's full cache and the policies over a grid of budgets ------------
# The grid: 32, 64, 128, 256 tokens per KV head (those below the trace's N positions), and N for the policies that
# hold one set per KV head (a window of N is the full cache, so a window series reaches the full cache's bytes). H2O
# and SnapKV keep a set per query head at their defaults (gqa=expand): G = 2 times the bytes, so their grid stops
# below N (at N they hold twice the full cache). SnapKV + ThinK also runs at 192 (below every trace's N), so that
# its series reaches above SnapKV's bytes at 128 on every trace (Q-4).
for mname in $study_models; do
    db="$out/codecs_$mname.db"
    for t in "$out/prompts/$mname"/*.kvt; do
        n_pos=$("$KVSIM_BIN" info "$t" | awk '/^positions/ { print $2 }')
        below=$(for B in 32 64 128 256; do if [ "$B" -lt "$n_pos" ]; then echo "$B"; fi; done | paste -sd, -)
        cs=""
        for c in $q_codecs; do cs="$cs --codec $c"; done
        # shellcheck disable=SC2086
        {
            "$KVSIM_BIN" replay "$t" --db "$db" --policy full --codec none $cs --budgets "$n_pos" > /dev/null
            "$KVSIM_BIN" replay "$t" --db "$db" --policy window --policy streaming --policy tova \
                --budgets "$below,$n_pos" > /dev/null
            "$KVSIM_BIN" replay "$t" --db "$db" --policy h2o --policy snapkv --budgets "$below" > /dev/null
            "$KVSIM_BIN" replay "$t" --db "$db" --policy window --codec "$q_i4" --budgets "$below,$n_pos" > /dev/null
            "$KVSIM_BIN" replay "$t" --db "$db" --policy h2o --codec "$q_kivi" --budgets "$below" > /dev/null
            "$KVSIM_BIN" replay "$t" --db "$db" --policy snapkv --codec "$q_think" --budgets "$below,192" > /dev/null
        } 2>> "$out/codecs_warnings.txt"
    done
    # one line per complete run: trace, policy, codec (empty = 16 bits), budget, storage_bytes_mean, out_err_mean
    "$KVSIM_BIN" runs "$db" --csv --summary | csv_to_tsv | awk -F'\t' '
        NR == 1 { for (i = 1; i <= NF; i++) if (!(($i) in c)) c[$i] = i; next }
        { printf "%s\t%s\t%s\t%s\t%s\t%s\n", $c["trace"], $c["policy"], $c["codec"], $c["budget_tokens"],
              $c["storage_bytes_mean"], $c["out_err_mean"] }' > "$out/codecs_$mname.tsv"
done

# q_col MODEL POLICY CODEC BUDGET COL: column COL (5 bytes, 6 err) of the runs of POLICY [CODEC] at BUDGET ("" = any),
# one line per trace, in the traces' order
q_col() {
    awk -F'\t' -v p="$2" -v c="$3" -v b="$4" -v col="$5" '$2 == p && $3 == c && (b == "" || $4 == b) { print $col }' \
        "$out/codecs_$1.tsv"
}

# ---- Q-1: every representation's full cache: bytes and error ---------------------------------------------------
block_line Q-1 "| model (traces) | full cache, K/V held as | bytes per KV head (KiB, mean over decode) | ÷ the 16-bit full cache (per trace) | err |"
block_line Q-1 "|---|---|---|---|---|"
for mname in $study_models; do
    n_traces=$(n_traces_of "$mname")
    for c in "" $q_codecs; do
        kib=$(q_col "$mname" full "$c" "" 5 | awk '{ printf "%.17g\n", $1 / 1024 }' | q_iv "Q-1 $mname $c KiB" "$n_traces")
        rat=$(awk -F'\t' -v c="$c" '$2 == "full" && $3 == "" { f[$1] = $5 } $2 == "full" && $3 == c { x[++n] = $1; v[n] = $5 }
            END { for (i = 1; i <= n; i++) printf "%.17g\n", v[i] / f[x[i]] }' "$out/codecs_$mname.tsv" |
            q_iv "Q-1 $mname $c ratio" "$n_traces")
        err=$(q_col "$mname" full "$c" "" 6 | q_iv "Q-1 $mname $c err" "$n_traces")
        block_line Q-1 "| $mname ($n_traces) | $(q_name "$c") | $kib | $rat | $err |"
    done
done

# ---- Q-2: the 16-bit eviction policies at the bytes of each quantized full cache, trace by trace ---------------
# match: model, codec (the level), trace, policy, status, err, the codec's own err on the trace
block_line Q-2 "| model (traces) | at the bytes of the full cache held as | that cache's err | window | StreamingLLM | H2O | TOVA | SnapKV |"
block_line Q-2 "|---|---|---|---|---|---|---|---|"
block_line Q-2-pairs "| model | the full cache held as … − | window | StreamingLLM | H2O | TOVA | SnapKV |"
block_line Q-2-pairs "|---|---|---|---|---|---|---|"
for mname in $study_models; do
    db="$out/codecs_$mname.db"
    n_traces=$(n_traces_of "$mname")
    match="$out/codecs_match_$mname.tsv"
    : > "$match"
    for c in $q_codecs; do
        awk -F'\t' -v c="$c" '$2 == "full" && $3 == c { print $1 "\t" $5 "\t" $6 }' "$out/codecs_$mname.tsv" |
            while IFS="$(printf '\t')" read -r t X e; do
                "$KVSIM_BIN" compare "$db" --match mem --at "$X" --trace "$t" --per-trace --csv --metric out_err_mean \
                    2> /dev/null | csv_to_tsv | awk -F'\t' -v c="$c" -v t="$t" -v e="$e" '
                    NR == 1 { for (i = 1; i <= NF; i++) c_[$i] = i; next }
                    $c_["codec"] == "" && $c_["policy"] != "full" {
                        printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", c, t, $c_["policy"], $c_["status"], $c_["out_err_mean"], e,
                            $c_["x_min"], $c_["at"] }' >> "$match"
            done
    done
    for c in $q_codecs; do
        own=$(awk -F'\t' -v c="$c" '$1 == c && $3 == "window" { print $6 }' "$match" | q_iv "Q-1 $mname $c err" "$n_traces")
        row="| $mname ($n_traces) | $(q_name "$c") | $own"
        prow="| $mname | $(q_name "$c")"
        for p in $q_evict; do
            v=$(awk -F'\t' -v c="$c" -v p="$p" '$1 == c && $3 == p && $5 != "" { print $5 }' "$match" |
                q_iv "Q-2 $mname $c $p" "$n_traces")
            # none: say why (every run of the policy holds more than the level on every trace, or otherwise)
            [ "$v" = none ] && v=$(awk -F'\t' -v c="$c" -v p="$p" '$1 == c && $3 == p { if ($7 + 0 > $8 + 0) above++; else other++ }
                END { print (above && !other ? "none: its least bytes are above the level on every trace" : "none on any trace") }' "$match")
            d=$(awk -F'\t' -v c="$c" -v p="$p" '$1 == c && $3 == p && $5 != "" { print $6, $5 }' "$match" |
                q_piv "Q-2 $mname $c - $p" "$n_traces")
            row="$row | $v"
            prow="$prow | $d"
        done
        block_line Q-2 "$row |"
        block_line Q-2-pairs "$prow |"
    done
done

# ---- Q-3: the compositions at fixed bytes, across the traces ---------------------------------------------------
# SnapKV (alone or with ThinK) is not a row: at its defaults it keeps every generated token and a set per query head,
# above 6 KiB on every trace; Q-2 and Q-4 compare it at its own bytes.
q3_rows="window||window
streaming||StreamingLLM
tova||TOVA
h2o||H2O
window|$q_i4|window, int4 per-token
h2o|$q_kivi|H2O + KIVI-2 (R 128)"
block_line Q-3 "| model (traces) | policy (K/V held as) | err at 2 KiB per KV head | at 4 KiB | at 6 KiB |"
block_line Q-3 "|---|---|---|---|---|"
for mname in $study_models; do
    db="$out/codecs_$mname.db"
    n_traces=$(n_traces_of "$mname")
    for X in 2KiB 4KiB 6KiB; do
        err_tables_at "$db" "$X" "$out/codecs_${mname}_$X"
    done
    echo "$q3_rows" | while IFS='|' read -r p c name; do
        row="| $mname ($n_traces) | $name"
        for X in 2KiB 4KiB 6KiB; do
            cell=$(err_cell "$out/codecs_${mname}_$X.tsv" "$n_traces" "$p" codec "$c")
            [ "$cell" = "-" ] && cell="none: out of range on every trace"
            row="$row | $cell"
        done
        block_line Q-3 "$row |"
    done
done
block_line Q-3 ""
block_line Q-3 "Paired differences of err over the same traces (resolved when the 95% interval excludes 0):"
block_line Q-3 ""
# q3_pair MODEL X POL_A CODEC_A POL_B CODEC_B NAME: one line for the pair (a − b) of the --pairs table
q3_pair() {
    awk -F'\t' -v m="$1" -v X="$2" -v pa="$3" -v ca="$4" -v pb="$5" -v cb="$6" -v name="$7" '
        NR == 1 { for (i = 1; i <= NF; i++) k[$i] = i; next }
        { a = $k["a"]; b = $k["b"] }
        function is(l, p, c) { if (c == "") return l == p || index(l, p " (") == 1 && index(l, "[") == 0
                               return index(l, p) == 1 && index(l, "[" c "]") > 0 }
        is(a, pa, ca) && is(b, pb, cb) { s = 1 } is(a, pb, cb) && is(b, pa, ca) { s = -1 }
        ((is(a, pa, ca) && is(b, pb, cb)) || (is(a, pb, cb) && is(b, pa, ca))) && $k["n"] > 0 {
            lo = s > 0 ? $k["diff_lo"] : -$k["diff_hi"]; hi = s > 0 ? $k["diff_hi"] : -$k["diff_lo"]
            r = ($k["resolved"] != 0 ? "resolved" : "not resolved"); found = 1
            if ($k["n"] < 2) { printf "- %s at %s: %s = %+.3g on 1 trace (no interval): %s\n", m, X, name, s * $k["diff"], r; exit }
            printf "- %s at %s: %s = %+.3g [%+.3g, %+.3g] over %d traces: %s\n", m, X, name, s * $k["diff"], lo, hi, $k["n"], r
            exit }
        END { if (!found) printf "- %s at %s: %s: no trace where both have a value\n", m, X, name }' "$out/codecs_${1}_${2}_pairs.tsv"
}
for mname in $study_models; do
    for X in 2KiB 4KiB 6KiB; do
        {
            q3_pair "$mname" "$X" window "$q_i4" window "" "window, int4 − window"
            q3_pair "$mname" "$X" h2o "$q_kivi" h2o "" "H2O + KIVI-2 − H2O"
            q3_pair "$mname" "$X" h2o "$q_kivi" window "" "H2O + KIVI-2 − window"
        } >> "$blocks/Q-3.md"
    done
done

# ---- Q-4: at equal nominal size, and ThinK + SnapKV at SnapKV's own bytes --------------------------------------
# A 4-bit window of 4B tokens has the nominal bits of a 16-bit window of B; ThinK + SnapKV at SnapKV's budget is the
# paper's composition (the same tokens, thinner keys). The bytes ratio is per trace (the codec's over the 16-bit
# run's); the last column reads ThinK + SnapKV at SnapKV's bytes on each trace (interpolated in log bytes between
# its runs around them: kvsim compare --trace --per-trace).
block_line Q-4 "| model (traces) | comparison | bytes ratio (per trace) | err of the first | err of the second | first − second (paired) |"
block_line Q-4 "|---|---|---|---|---|---|"
for mname in $study_models; do
    db="$out/codecs_$mname.db"
    n_traces=$(n_traces_of "$mname")
    tsv="$out/codecs_$mname.tsv"
    for B in 32 64; do
        B4=$((4 * B))
        # pairs per trace: "bytes_a err_a bytes_b err_b" (traces whose N holds 4B only)
        pr=$(awk -F'\t' -v B="$B" -v B4="$B4" -v c="$q_i4" '
            $2 == "window" && $3 == c && $4 == B4 { a[$1] = $5 " " $6 } $2 == "window" && $3 == "" && $4 == B { b[$1] = $5 " " $6; o[++n] = $1 }
            END { for (i = 1; i <= n; i++) if (o[i] in a) print a[o[i]], b[o[i]] }' "$tsv")
        r=$(echo "$pr" | awk 'NF { printf "%.17g\n", $1 / $3 }' | q_iv "Q-4 $mname window $B ratio" "$n_traces")
        ea=$(echo "$pr" | awk 'NF { print $2 }' | q_iv "Q-4 $mname window int4 $B4 err" "$n_traces")
        eb=$(echo "$pr" | awk 'NF { print $4 }' | q_iv "Q-4 $mname window $B err" "$n_traces")
        d=$(echo "$pr" | awk 'NF { print $2, $4 }' | q_piv "Q-4 $mname window int4 $B4 - window $B" "$n_traces")
        block_line Q-4 "| $mname ($n_traces) | window of $B4 in int4 per-token − 16-bit window of $B | $r | $ea | $eb | $d |"
    done
    for B in 32 64 128; do
        pr=$(awk -F'\t' -v B="$B" -v c="$q_think" '
            $2 == "snapkv" && $3 == c && $4 == B { a[$1] = $5 " " $6 } $2 == "snapkv" && $3 == "" && $4 == B { b[$1] = $5 " " $6; o[++n] = $1 }
            END { for (i = 1; i <= n; i++) if (o[i] in a) print a[o[i]], b[o[i]] }' "$tsv")
        r=$(echo "$pr" | awk 'NF { printf "%.17g\n", $1 / $3 }' | q_iv "Q-4 $mname snapkv $B ratio" "$n_traces")
        ea=$(echo "$pr" | awk 'NF { print $2 }' | q_iv "Q-4 $mname snapkv think $B err" "$n_traces")
        eb=$(echo "$pr" | awk 'NF { print $4 }' | q_iv "Q-4 $mname snapkv $B err" "$n_traces")
        d=$(echo "$pr" | awk 'NF { print $2, $4 }' | q_piv "Q-4 $mname snapkv think $B - snapkv $B" "$n_traces")
        block_line Q-4 "| $mname ($n_traces) | SnapKV + ThinK − SnapKV, both at budget $B | $r | $ea | $eb | $d |"
        [ "$B" -gt 32 ] || continue # at 32 SnapKV keeps no prunable row (its window is ThinK's 32 whole recent rows)
        # at SnapKV's bytes on each trace: ThinK + SnapKV interpolated there
        eq=$(awk -F'\t' -v B="$B" '$2 == "snapkv" && $3 == "" && $4 == B { print $1 "\t" $5 "\t" $6 }' "$tsv" |
            while IFS="$(printf '\t')" read -r t X e; do
                "$KVSIM_BIN" compare "$db" --match mem --at "$X" --trace "$t" --per-trace --csv --metric out_err_mean \
                    --policy snapkv 2> /dev/null | csv_to_tsv | awk -F'\t' -v c="$q_think" -v e="$e" '
                    NR == 1 { for (i = 1; i <= NF; i++) k[$i] = i; next }
                    $k["codec"] == c && $k["out_err_mean"] != "" { print $k["out_err_mean"], e }'
            done)
        ea=$(echo "$eq" | awk 'NF { print $1 }' | q_iv "Q-4 $mname snapkv think at snapkv $B bytes err" "$n_traces")
        d=$(echo "$eq" | awk 'NF { print $1, $2 }' | q_piv "Q-4 $mname snapkv think at snapkv $B bytes - snapkv" "$n_traces")
        block_line Q-4 "| $mname ($n_traces) | SnapKV + ThinK at the bytes of SnapKV at budget $B − SnapKV | 1 (matched) | $ea | $eb | $d |"
    done
done
