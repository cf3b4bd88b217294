# drift.sh — attention drift (FINDINGS.md, SyncKV: attention drift, S1-S3; POLICY_SPEC §5.4).
# Sourced by examples/findings.sh (its variables and functions: $KVSIM_BIN, $out, $blocks, $traces, $study_models,
# say, block_line, field_like, budgets_of, ratio, fmt_iv, iv_of, csv_to_tsv, trace_facts).
#
# One `kvsim drift` per prompt trace (k = 4, 16, 32, 64; locality up to δ = 16) gives every figure of the three
# findings: its --csv summary rows of the query heads over all layers (unit "head", layer "all"), one per k, are the
# trace's sample; S1 reads the overlaps with the prefill sets at step 50, S2 the mass on the top-k, S3 the overlap of
# steps t and t + δ; each beside the level a uniformly random k-subset gives (the chance columns).

# drift_col FILE K COL...: the columns COL (1-based, of the --csv summary) of the rows with that k, one trace a line
drift_col() { f=$1 k=$2; shift 2; awk -F, -v k="$k" -v cols="$*" '$2 == k { n = split(cols, c, " "); s = ""
    for (i = 1; i <= n; i++) s = s (i > 1 ? " " : "") $c[i]; print s }' "$f"; }

for mname in $study_models; do
    : > "$out/drift_$mname.csv"
    for t in "$out/prompts/$mname"/*.kvt; do
        "$KVSIM_BIN" drift "$t" --db "$out/drift_$mname.db" --k 4,16,32,64 --delta-max 16 --csv |
            awk -F, '$1 == "head" && $3 == "all"' >> "$out/drift_$mname.csv"
    done
done

# ---- S1: drift against chance, over the prompts ----------------------------------------------------------------
# columns: 5 win_at, 6 last_at, 7 chance_at (step 50)
block_line S1 "| model (traces) | k | window score | last-query score | chance (random top-k) | last-query − chance (paired) |"
block_line S1 "|---|---:|---|---|---|---|"
for mname in $study_models; do
    n_traces=$(n_traces_of "$mname")
    f="$out/drift_$mname.csv"
    for k in 16 32 64; do
        [ -n "$(drift_col "$f" "$k" 5)" ] || continue
        w=$(drift_col "$f" "$k" 5 | iv_of "S1 $mname k=$k window")
        l=$(drift_col "$f" "$k" 6 | iv_of "S1 $mname k=$k last")
        c=$(drift_col "$f" "$k" 7 | iv_of "S1 $mname k=$k chance")
        d=$(drift_col "$f" "$k" 6 7 | iv_of "S1 $mname k=$k last-chance" --paired)
        block_line S1 "| $mname ($n_traces) | $k | $w | $l | $c | $d |"
    done
done

# ---- S2: attention mass on the top-k, over the prompts --------------------------------------------------------
# columns: 10 mass (mean over heads, layers and decode steps), 11 chance_avg (= the mean k/n: the share of the
# positions the k tokens are, and the mass a random k-subset would carry)
block_line S2 "| model (traces) | k | share of the positions (k/n, mean over steps) | mass on the step's top-k | top-k mass − k/n (paired) |"
block_line S2 "|---|---:|---|---|---|"
for mname in $study_models; do
    n_traces=$(n_traces_of "$mname")
    f="$out/drift_$mname.csv"
    for k in 4 16 32 64; do
        [ -n "$(drift_col "$f" "$k" 10)" ] || continue
        c=$(drift_col "$f" "$k" 11 | iv_of "S2 $mname k=$k share")
        m=$(drift_col "$f" "$k" 10 | iv_of "S2 $mname k=$k mass")
        d=$(drift_col "$f" "$k" 10 11 | iv_of "S2 $mname k=$k mass-share" --paired)
        block_line S2 "| $mname ($n_traces) | $k | $c | $m | $d |"
    done
done

# ---- S3: overlap of adjacent steps and its decay with δ, over the prompts ---------------------------------------
# columns: 13 loc_d1, 14 chance_d1, 15 loc_dn, 16 chance_dn (δ = 16), 9 last_avg (overlap with the last-query
# prefill set, mean over the steps: the same k's drift, for scale)
block_line S3 "| model (traces) | k | overlap at δ = 1 | chance at δ = 1 | at δ = 16 | chance at δ = 16 | δ = 1 − δ = 16 (paired) | δ = 1 − prefill set (last query, mean over steps; paired) |"
block_line S3 "|---|---:|---|---|---|---|---|---|"
for mname in $study_models; do
    n_traces=$(n_traces_of "$mname")
    f="$out/drift_$mname.csv"
    for k in 4 16 32 64; do
        [ -n "$(drift_col "$f" "$k" 13)" ] || continue
        a=$(drift_col "$f" "$k" 13 | iv_of "S3 $mname k=$k d1")
        ac=$(drift_col "$f" "$k" 14 | iv_of "S3 $mname k=$k d1 chance")
        b=$(drift_col "$f" "$k" 15 | iv_of "S3 $mname k=$k d16")
        bc=$(drift_col "$f" "$k" 16 | iv_of "S3 $mname k=$k d16 chance")
        d=$(drift_col "$f" "$k" 13 15 | iv_of "S3 $mname k=$k d1-d16" --paired)
        p=$(drift_col "$f" "$k" 13 9 | iv_of "S3 $mname k=$k d1-prefill" --paired)
        block_line S3 "| $mname ($n_traces) | $k | $a | $ac | $b | $bc | $d | $p |"
    done
done
