# newer_ea.sh — Expected Attention, Q-Filters and ShadowKV against the plain baselines at equal resident memory
# (FINDINGS.md, "Newer methods that need pre-RoPE keys or calibration"; ../shared/POLICY_SPEC_2.md §2.1 EA3, §2.8
# QF3, §2.10 SK2), over the seven prompts of each model. Sourced by examples/findings.sh (its variables and functions:
# $KVSIM_BIN, $out, $blocks, $study_models, $here, block_line, csv_to_tsv, fmt_iv, n_traces_of).
#
# Configurations (the policies' defaults unless said): ea (kvpress's leaderboard setting: Ada-KV allocation, eps
# 0.01; prompt-only); qfilters with its filters from one calibration trace per model captured here from a prompt
# that is none of the seven (never the replayed trace); shadowkv@small-model (rank 160/1024 of Hkv d) with
# outliers=-1, ShadowKVCache_CPU's rule (floor(sparse/1024) 24 = 0 at these budgets: with the default 48 outlier
# chunks every chunk of a 240-position prompt is an outlier and nothing is ever rebuilt or fetched); window,
# StreamingLLM, H2O, TOVA, KNorm at their defaults and SnapKV with one set per KV head (gqa=mean, as the three new
# methods keep). Every-step and prompt-only policies meet at equal
# resident bytes per KV head (kvsim compare --match mem), at two levels given in tokens' worth of KV of the model.

nea_budgets=16,32,64,96,128,192,224
nea_levels="128 160"
nea_calib_prompt="The old clock in the hall stopped at noon. Tom climbed the stairs, opened the tiny door in its back and found a folded note, a brass key and a drawing of a boat."

# nea_name POLICY: how the tables name a policy
nea_name() {
    case $1 in
        window) echo "window" ;; streaming) echo "StreamingLLM" ;; h2o) echo "H2O" ;; tova) echo "TOVA" ;;
        snapkv) echo "SnapKV" ;; knorm) echo "KNorm" ;; ea) echo "Expected Attention" ;; qfilters) echo "Q-Filters" ;;
        shadowkv) echo "ShadowKV" ;; *) echo "$1" ;;
    esac
}
nea_policies="window streaming h2o tova snapkv knorm ea qfilters shadowkv"

# The calibration trace is named relative to $out (the replays run there): its path is part of the configuration's
# label, which seeds the bootstrap, so the intervals do not depend on where $out is.
nea_bin=$(cd "$(dirname "$KVSIM_BIN")" && pwd)/$(basename "$KVSIM_BIN")
nea_out=$(cd "$out" && pwd)
nea_run_model() {
    m=$1
    case $m in stories260K) mp="$models/stories260K.bin" ;; *) mp="$models/$m" ;; esac
    cal="newer_ea_calib_$m.kvt"
    "$nea_bin" capture --model "$mp" --prompt "$nea_calib_prompt" --steps 64 --ignore-eos --quiet --threads 1 \
        --out "$nea_out/$cal" > /dev/null
    for t in "$nea_out/prompts/$m"/*.kvt; do
        (cd "$nea_out" && "$nea_bin" replay "$t" --db "newer_ea_$m.db" --threads 1 --policy window \
            --policy streaming --policy h2o --policy tova --policy snapkv:gqa=mean --policy knorm --policy ea \
            --policy "qfilters:calib=$cal" --policy shadowkv@small-model:outliers=-1 --budgets "$nea_budgets" \
            > /dev/null 2>> "newer_ea_warnings_$m.txt")
    done
}
nea_pids=""
for mname in $study_models; do
    nea_run_model "$mname" &
    nea_pids="$nea_pids $!"
done
for nea_pid in $nea_pids; do wait "$nea_pid"; done

# nea_slot MODEL: bytes of one token's K and V per KV head (2 d x 2 bytes: the traces are fp16)
nea_slot() {
    "$KVSIM_BIN" info "$(ls "$out/prompts/$1"/*.kvt | head -1)" |
        awk '/head_dim/ { for (i = 1; i <= NF; i++) if ($i == "head_dim") { v = $(i+1); gsub(/[^0-9]/, "", v); print 4 * v } }'
}

# nea_compare MODEL TOKENS: the across-traces table and its pairs at TOKENS tokens' worth of KV
nea_compare() { err_tables_at "$out/newer_ea_$1.db" $(( $2 * $(nea_slot "$1") )) "$out/newer_ea_$1_$2"; }

# nea_cell MODEL TOKENS POLICY: "mean [lo, hi]" of the policy's err at the level
nea_cell() {
    c=$(err_cell "$out/newer_ea_$1_$2.tsv" "$(n_traces_of "$1")" "$3")
    [ "$c" = "-" ] && c="out of range"
    echo "$c"
}

# nea_pair MODEL TOKENS A B: the paired difference A − B of err at the level, "resolved" when its interval excludes 0
nea_pair() {
    awk -F'\t' -v pa="$3" -v pb="$4" -v t="$(n_traces_of "$1")" 'NR == 1 { for (i = 1; i <= NF; i++) k[$i] = i; next }
        function pol(l) { sub(/ \(.*$/, "", l); return l }
        { a = pol($k["a"]); b = pol($k["b"]); s = 0 }
        a == pa && b == pb { s = 1 } a == pb && b == pa { s = -1 }
        s != 0 && $k["n"] > 0 {
            lo = s > 0 ? $k["diff_lo"] : -$k["diff_hi"]; hi = s > 0 ? $k["diff_hi"] : -$k["diff_lo"]
            if ($k["n"] < 2) { printf "%+.3g (n = 1 of %d, no interval)\n", s * $k["diff"], t; found = 1; exit }
            printf "%+.3g [%+.3g, %+.3g]%s, %s\n", s * $k["diff"], lo, hi,
                ($k["n"] < t ? sprintf(" (n = %d of %d)", $k["n"], t) : ""), ($k["resolved"] != 0 ? "resolved" : "not resolved")
            found = 1; exit }
        END { if (!found) print "none: no trace where both have a value" }' "$out/newer_ea_$1_$2_pairs.tsv"
}

block_line N-EA-1 "| model (traces) | policy | err at 128 tokens' KV per KV head | err at 160 tokens' KV |"
block_line N-EA-1 "|---|---|---|---|"
block_line N-EA-2 "| model (traces) | difference (paired) | at 128 tokens' KV | at 160 tokens' KV |"
block_line N-EA-2 "|---|---|---|---|"
for mname in $study_models; do
    n_traces=$(n_traces_of "$mname")
    for X in $nea_levels; do nea_compare "$mname" "$X"; done
    for p in $nea_policies; do
        row="| $mname ($n_traces) | $(nea_name "$p")"
        for X in $nea_levels; do row="$row | $(nea_cell "$mname" "$X" "$p")"; done
        block_line N-EA-1 "$row |"
    done
    for pr in ea:snapkv ea:knorm ea:tova ea:h2o qfilters:streaming qfilters:window shadowkv:snapkv shadowkv:window; do
        a=${pr%%:*} b=${pr#*:}
        row="| $mname ($n_traces) | $(nea_name "$a") − $(nea_name "$b")"
        for X in $nea_levels; do row="$row | $(nea_pair "$mname" "$X" "$a" "$b")"; done
        block_line N-EA-2 "$row |"
    done
done
