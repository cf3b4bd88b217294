# paging.sh — what page granularity costs each policy (FINDINGS.md, "Paged caches: what page granularity costs each
# policy"; sim/host.h, "page granularity"; vLLM's PagedAttention, Kwon et al. SOSP 2023, whose default block is 16
# positions): window, StreamingLLM, H2O, TOVA and SnapKV (their defaults, gqa included) on pages of 16 against their
# own token-level selves, at equal resident bytes and at equal bytes read per step, over the seven prompts of each
# model. Sourced by examples/findings.sh (its variables and functions: $KVSIM_BIN, $out, $blocks, $study_models,
# block_line, csv_to_tsv, fmt_iv, iv_of, n_traces_of).
#
# A paged run keeps C = floor(B / 16) pages per list (the newest always), attends over whole resident pages, and
# holds a page while it holds any position the policy keeps, counted whole with its padding: its resident bytes can
# exceed its budget's (a policy that keeps scattered positions pins many partly used pages), while what it reads per
# step is C pages at most. So P-1 (equal resident bytes) and P-2 (equal traffic) can disagree, and P-3 says by how
# much each policy's bytes move at one budget. Which pages: a policy with retention scores (H2O, TOVA, SnapKV) ranks
# its pages by the max of its own scores over each page's selected positions (the default, --page-score max), the
# others (window, StreamingLLM) by how many selected positions a page holds; P-4 sets the two rules side by side for
# the three scored policies at equal resident bytes.

p_policies="window streaming h2o tova snapkv"
p_scored="h2o tova snapkv"
p_levels="2KiB 4KiB 12KiB"

# p_rule POLICY: the page score rule a policy's paged runs follow by default ("max" with scores, "" = count)
p_rule() {
    case " $p_scored " in *" $1 "*) echo max ;; *) echo "" ;; esac
}

# p_name POLICY: how the tables name a policy
p_name() {
    case $1 in
        window) echo "window" ;; streaming) echo "StreamingLLM" ;; h2o) echo "H2O" ;; tova) echo "TOVA" ;;
        snapkv) echo "SnapKV" ;; *) echo "$1" ;;
    esac
}

# ---- the runs: per trace, every policy at token level and on pages of 16 -----------------------------------------
# Budgets 16 .. 192 (below every prompt trace's positions): at 16 a paged cache is its newest page alone, the least
# bytes a paged series has, so its series reaches down to the token-level series' bytes. The two models run side by
# side (one core each).
p_run_model() {
    db="$out/paging_$1.db"
    for t in "$out/prompts/$1"/*.kvt; do
        "$KVSIM_BIN" replay "$t" --db "$db" --policy window --policy streaming --policy h2o --policy tova \
            --policy snapkv --budgets 16,32,64,128,192 --page 0,16 > /dev/null 2>> "$out/paging_warnings_$1.txt"
        # the scored policies' pages by the count rule too (P-4; labelled "[page 16]", the default "[page 16 max]")
        "$KVSIM_BIN" replay "$t" --db "$db" --policy h2o --policy tova --policy snapkv --budgets 16,32,64,128,192 \
            --page 16 --page-score count > /dev/null 2>> "$out/paging_warnings_$1.txt"
    done
}
p_pids=""
for mname in $study_models; do
    p_run_model "$mname" &
    p_pids="$p_pids $!"
done
for p_pid in $p_pids; do wait "$p_pid"; done

# p_compare MODEL MATCH X: the across-traces table and the pairs table at X (out/paging_MODEL_MATCH_X[_pairs].tsv)
p_compare() {
    "$KVSIM_BIN" compare "$out/paging_$1.db" --match "$2" --at "$3" --across-traces --csv --metric out_err_mean |
        csv_to_tsv > "$out/paging_$1_$2_$3.tsv"
    "$KVSIM_BIN" compare "$out/paging_$1.db" --match "$2" --at "$3" --across-traces --pairs --csv \
        --metric out_err_mean | csv_to_tsv > "$out/paging_$1_$2_$3_pairs.tsv"
}

# p_cell MODEL MATCH X POLICY PAGE [RULE]: the policy's err at X ("mean [lo, hi]"), PAGE 0 = token level, 16 = pages
# of 16 by RULE (default: the policy's, p_rule; "count" = the count rule)
p_cell() {
    rule=${6-$(p_rule "$4")}
    [ "$rule" = count ] && rule=""
    suffix=$([ "$5" = 16 ] && echo " [page 16${rule:+ $rule}]" || echo "")
    v=$(awk -F'\t' -v p="$4" -v sfx="$suffix" 'NR == 1 { for (i = 1; i <= NF; i++) k[$i] = i; next }
        function suf(l) { i = index(l, " [page "); return i ? substr(l, i) : "" }
        $k["policy"] == p && $k["codec"] == "" && suf($k["label"]) == sfx {
            print $k["out_err_mean"] "\t" $k["out_err_mean_lo"] "\t" $k["out_err_mean_hi"] "\t" $k["out_err_mean_n"]; exit }' \
        "$out/paging_$1_$2_$3.tsv")
    c=$(fmt_iv "$(echo "$v" | cut -f1)" "$(echo "$v" | cut -f2)" "$(echo "$v" | cut -f3)" "$(echo "$v" | cut -f4)" \
        "$(n_traces_of "$1")")
    [ "$c" = "-" ] && c="none: out of range on every trace"
    echo "$c"
}

# p_pair MODEL MATCH X POLICY [FROM TO]: the paired difference (TO − FROM) of the policy's err at X over the traces
# where both have a value, "resolved" when its interval excludes 0; FROM and TO are label suffixes, by default ""
# (token level) and the policy's pages of 16 (" [page 16]" or " [page 16 max]")
p_pair() {
    rule=$(p_rule "$4")
    from=${5-}
    to=${6-" [page 16${rule:+ $rule}]"}
    awk -F'\t' -v p="$4" -v sa="$from" -v sb="$to" -v t="$(n_traces_of "$1")" 'NR == 1 { for (i = 1; i <= NF; i++) k[$i] = i; next }
        function suf(l) { i = index(l, " [page "); return i ? substr(l, i) : "" }
        function base(l) { i = index(l, " [page "); return i ? substr(l, 1, i - 1) : l }
        function ispol(l) { return l == p || index(l, p " (") == 1 }
        { a = $k["a"]; b = $k["b"] }
        ispol(base(a)) && base(a) == base(b) && ((suf(a) == sa && suf(b) == sb) || (suf(a) == sb && suf(b) == sa)) && $k["n"] > 0 {
            s = suf(a) == sb ? 1 : -1
            lo = s > 0 ? $k["diff_lo"] : -$k["diff_hi"]; hi = s > 0 ? $k["diff_hi"] : -$k["diff_lo"]
            if ($k["n"] < 2) { printf "%+.3g (n = 1 of %d, no interval)\n", s * $k["diff"], t; found = 1; exit }
            printf "%+.3g [%+.3g, %+.3g]%s, %s\n", s * $k["diff"], lo, hi,
                ($k["n"] < t ? sprintf(" (n = %d of %d)", $k["n"], t) : ""), ($k["resolved"] != 0 ? "resolved" : "not resolved")
            found = 1; exit }
        END { if (!found) print "none: no trace where both have a value" }' "$out/paging_$1_$2_$3_pairs.tsv"
}

# ---- P-1 (equal resident bytes) and P-2 (equal bytes read per step) ----------------------------------------------
for blk in P-1:mem P-2:traffic; do
    name=${blk%%:*}
    match=${blk#*:}
    what=$([ "$match" = mem ] && echo "resident bytes per KV head" || echo "bytes read per step per KV head")
    block_line "$name" "| model (traces) | policy | at ($what) | err, token level | err, pages of 16 | pages of 16 − token level (paired) |"
    block_line "$name" "|---|---|---|---|---|---|"
    for mname in $study_models; do
        n_traces=$(n_traces_of "$mname")
        for X in $p_levels; do p_compare "$mname" "$match" "$X"; done
        for p in $p_policies; do
            for X in $p_levels; do
                c0=$(p_cell "$mname" "$match" "$X" "$p" 0)
                c16=$(p_cell "$mname" "$match" "$X" "$p" 16)
                # a level neither reaches is left out (the policy's bytes never come near it on these traces)
                case "$c0$c16" in "none: out of range on every tracenone: out of range on every trace") continue ;; esac
                block_line "$name" "| $mname ($n_traces) | $(p_name "$p") | $X | $c0 | $c16 | $(p_pair "$mname" "$match" "$X" "$p") |"
            done
        done
    done
done

# ---- P-3: what pages of 16 do to a policy's bytes at one nominal budget (64 positions per KV head) ---------------
# Per trace: the paged run's resident bytes (and bytes read per step) over the token-level run's, at budget 64.
block_line P-3 "| model (traces) | policy | resident bytes, pages of 16 ÷ token level (budget 64) | bytes read per step, pages of 16 ÷ token level (budget 64) |"
block_line P-3 "|---|---|---|---|"
for mname in $study_models; do
    n_traces=$(n_traces_of "$mname")
    "$KVSIM_BIN" runs "$out/paging_$mname.db" --csv --summary --budget 64 | csv_to_tsv | awk -F'\t' '
        NR == 1 { for (i = 1; i <= NF; i++) if (!(($i) in c)) c[$i] = i; next }
        { printf "%s\t%s\t%s\t%s\t%s\t%s\n", $c["trace"], $c["policy"], $c["page"], $c["storage_bytes_mean"],
              $c["traffic_bytes_per_step_mean"], $c["page_score"] }' > "$out/paging_${mname}_64.tsv"
    for p in $p_policies; do
        row="| $mname ($n_traces) | $(p_name "$p")"
        for col in 4 5; do
            # the paged runs of the policy's own rule (its count-rule runs are P-4's)
            v=$(awk -F'\t' -v p="$p" -v col="$col" -v r="$(p_rule "$p")" '$2 == p && $3 == 0 { b[$1] = $col }
                $2 == p && $3 == 16 && $6 == r { x[++n] = $1; v[n] = $col }
                END { for (i = 1; i <= n; i++) if (x[i] in b) printf "%.17g\n", v[i] / b[x[i]] }' "$out/paging_${mname}_64.tsv" |
                iv_of "P-3 $mname $p $col")
            row="$row | $v"
        done
        block_line P-3 "$row |"
    done
done

# ---- P-4: the scored policies' pages by their own scores (max) against the count rule, at equal resident bytes ----
block_line P-4 "| model (traces) | policy | at (resident bytes per KV head) | err, pages of 16 by count | err, pages of 16 by max score | max − count (paired) |"
block_line P-4 "|---|---|---|---|---|---|"
for mname in $study_models; do
    n_traces=$(n_traces_of "$mname")
    for p in $p_scored; do
        for X in $p_levels; do
            cc=$(p_cell "$mname" mem "$X" "$p" 16 count)
            cm=$(p_cell "$mname" mem "$X" "$p" 16 max)
            case "$cc$cm" in "none: out of range on every tracenone: out of range on every trace") continue ;; esac
            block_line P-4 "| $mname ($n_traces) | $(p_name "$p") | $X | $cc | $cm | $(p_pair "$mname" mem "$X" "$p" " [page 16]" " [page 16 max]") |"
        done
    done
done
