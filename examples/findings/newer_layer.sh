# newer_layer.sh — the newer methods with per-layer or per-head budgets against their papers' checkable claims
# (FINDINGS.md, "CAKE, SimLayerKV, DuoAttention"; ../shared/POLICY_SPEC_2.md §2.2 CAKE, §2.6 SimLayerKV, §2.5
# DuoAttention): over the seven prompts of each model, CAKE (its defaults: window 32, τ 1.0/1.0 since neither tiny
# model is in model2tau.json), SimLayerKV (the Llama-3 threshold 0.9, lazy layers keeping the budget: kvsim's budgeted
# mode n_recent=0, since the paper's 1024 recent tokens cover these traces) and the HEURISTIC DuoAttention pattern
# (duo_heuristic: no trained gates exist for these models, so the paper's own method cannot run) at equal resident
# memory beside the plain baselines (StreamingLLM and H2O at their defaults; SnapKV and PyramidKV with one set per KV
# head, gqa=mean, as CAKE keeps: their default one set per query head holds every generated token twice and never comes
# down to these byte levels), each difference to CAKE paired over the traces; and DuoAttention's memory claim (DU1) as measured resident bytes against the arithmetic.
# Sourced by examples/findings.sh (its variables and functions: $KVSIM_BIN, $out, $blocks, $study_models,
# block_line, csv_to_tsv, fmt_iv, iv_of, n_traces_of).

nl_levels="2KiB 4KiB 8KiB"
nl_policies="cake simlayerkv duo_heuristic streaming h2o snapkv pyramidkv"

# nl_name POLICY: how the tables name a policy
nl_name() {
    case $1 in
        cake) echo "CAKE" ;; simlayerkv) echo "SimLayerKV (δ 0.9, lazy layers keep B)" ;;
        duo_heuristic) echo "DuoAttention, heuristic pattern (not the trained gates)" ;; streaming) echo "StreamingLLM" ;;
        h2o) echo "H2O" ;; snapkv) echo "SnapKV (one set per KV head)" ;;
        pyramidkv) echo "PyramidKV (one set per KV head)" ;; *) echo "$1" ;;
    esac
}

# ---- the runs: per trace, every policy at budgets 16 .. 192 (below every trace's positions); DU1's full and duo_heuristic at its defaults ---------
# duo_heuristic runs with sparsity=-1 (the retrieval fraction from the budget, POLICY_SPEC_2 §2.5 "Budget mapping") in
# the equal-memory sweep, and at its default sparsity 0.5 for DU1. The two models run side by side (one core each).
nl_run_model() {
    db="$out/newer_layer_$1.db"
    for t in "$out/prompts/$1"/*.kvt; do
        "$KVSIM_BIN" replay "$t" --db "$db" --threads 1 --policy cake --policy simlayerkv:n_recent=0 \
            --policy duo_heuristic:sparsity=-1 --policy streaming --policy h2o --policy snapkv:gqa=mean \
            --policy pyramidkv:gqa=mean --budgets 16,32,48,64,96,128,192 > /dev/null 2>> "$out/newer_layer_warnings_$1.txt"
        "$KVSIM_BIN" replay "$t" --db "$out/newer_layer_du1_$1.db" --threads 1 --policy full --policy duo_heuristic \
            --budgets 64 > /dev/null 2>> "$out/newer_layer_warnings_$1.txt"
    done
}
nl_pids=""
for mname in $study_models; do
    nl_run_model "$mname" &
    nl_pids="$nl_pids $!"
done
for nl_pid in $nl_pids; do wait "$nl_pid"; done

# nl_compare MODEL X: the across-traces table and the pairs table at X resident bytes
nl_compare() { err_tables_at "$out/newer_layer_$1.db" "$2" "$out/newer_layer_$1_$2"; }

# nl_cell MODEL X POLICY: the policy's err at X ("mean [lo, hi]"), or "out of range" when no trace reaches X
nl_cell() {
    c=$(err_cell "$out/newer_layer_$1_$2.tsv" "$(n_traces_of "$1")" "$3")
    [ "$c" = "-" ] && c="out of range"
    echo "$c"
}

# nl_pair MODEL X POLICY: the paired difference (POLICY − CAKE) of err at X over the traces where both have a value,
# "resolved" when its interval excludes 0
nl_pair() {
    awk -F'\t' -v p="$3" -v t="$(n_traces_of "$1")" 'NR == 1 { for (i = 1; i <= NF; i++) k[$i] = i; next }
        function ispol(l, q) { return l == q || index(l, q " (") == 1 }
        { a = $k["a"]; b = $k["b"] }
        ((ispol(a, "cake") && ispol(b, p)) || (ispol(b, "cake") && ispol(a, p))) && $k["n"] > 0 {
            s = ispol(b, "cake") ? 1 : -1 # diff is a − b: make it POLICY − CAKE
            lo = s > 0 ? $k["diff_lo"] : -$k["diff_hi"]; hi = s > 0 ? $k["diff_hi"] : -$k["diff_lo"]
            if ($k["n"] < 2) { printf "%+.3g (n = 1 of %d, no interval)\n", s * $k["diff"], t; found = 1; exit }
            printf "%+.3g [%+.3g, %+.3g]%s, %s\n", s * $k["diff"], lo, hi,
                ($k["n"] < t ? sprintf(" (n = %d of %d)", $k["n"], t) : ""), ($k["resolved"] != 0 ? "resolved" : "not resolved")
            found = 1; exit }
        END { if (!found) print "-" }' "$out/newer_layer_$1_$2_pairs.tsv"
}

# ---- N-L-1: equal resident memory -------------------------------------------------------------------------------
block_line N-L-1 "| model (traces) | policy | at (resident bytes per KV head) | err | policy − CAKE (paired) |"
block_line N-L-1 "|---|---|---|---|---|"
for mname in $study_models; do
    n_traces=$(n_traces_of "$mname")
    for X in $nl_levels; do nl_compare "$mname" "$X"; done
    for X in $nl_levels; do
        # a level CAKE does not reach on any trace is left out (its bytes never come near it on these traces)
        [ "$(nl_cell "$mname" "$X" cake)" = "out of range" ] && continue
        for p in $nl_policies; do
            c=$(nl_cell "$mname" "$X" "$p")
            pair="-"
            [ "$p" != cake ] && [ "$c" != "out of range" ] && pair=$(nl_pair "$mname" "$X" "$p")
            block_line N-L-1 "| $mname ($n_traces) | $(nl_name "$p") | $X | $c | $pair |"
        done
    done
done

# ---- N-L-2: DuoAttention's memory (DU1), measured and by arithmetic ----------------------------------------------
# Per trace: full's mean resident bytes over duo_heuristic's (sparsity 0.5: half the KV heads streaming with 64 sinks
# + 256 recent), against the arithmetic mean over the decode steps of n / (f·n + (1 − f)·min(n, n_s + n_r)) weighted as
# the replay's means are (Σ n / Σ resident), f = 0.5; and the large-n limit 1/f = 2.
block_line N-L-2 "| model (traces) | positions per trace | full ÷ DuoAttention-heuristic resident bytes, measured | the same by arithmetic | limit for long sequences (1/f) |"
block_line N-L-2 "|---|---|---|---|---|"
for mname in $study_models; do
    n_traces=$(n_traces_of "$mname")
    "$KVSIM_BIN" runs "$out/newer_layer_du1_$mname.db" --csv --summary | csv_to_tsv | awk -F'\t' '
        NR == 1 { for (i = 1; i <= NF; i++) if (!(($i) in c)) c[$i] = i; next }
        { printf "%s\t%s\t%s\n", $c["trace"], $c["policy"], $c["storage_bytes_mean"] }' > "$out/newer_layer_du1_$mname.tsv"
    measured=$(awk -F'\t' '$2 == "full" { f[$1] = $3 } $2 == "duo_heuristic" { x[++n] = $1; v[n] = $3 }
        END { for (i = 1; i <= n; i++) if (x[i] in f) printf "%.17g\n", f[x[i]] / v[i] }' "$out/newer_layer_du1_$mname.tsv" |
        iv_of "N-L-2 $mname measured")
    arith=$(for t in "$out/prompts/$mname"/*.kvt; do
        "$KVSIM_BIN" info "$t" | awk '/^positions/ { sub(/\(/, "", $3); N = $2; P = $3 }
            END { for (n = P + 1; n <= N; n++) { s += n; r += 0.5 * n + 0.5 * (n < 320 ? n : 320) }; printf "%.17g\n", s / r }'
    done | iv_of "N-L-2 $mname arithmetic")
    lens=$(for t in "$out/prompts/$mname"/*.kvt; do "$KVSIM_BIN" info "$t" | awk '/^positions/ { print $2 }'; done |
        sort -n | awk 'NR == 1 { lo = $1 } { hi = $1 } END { printf "%d-%d", lo, hi }')
    block_line N-L-2 "| $mname ($n_traces) | $lens | $measured | $arith | 2 |"
done
