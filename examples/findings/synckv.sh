# synckv.sh — SyncKV's findings (FINDINGS.md, "SyncKV (policies/synckv.c ...)"; POLICY_SPEC §2.4, §5.4): SyncKV
# against Quest, SnapKV and the Exact-TopK oracle at the same nominal Mem%, against every baseline at SyncKV's own
# resident memory and HBM traffic, the period m and its variants (Table 3 / S11), and the choice of representatives
# (the trace's own prompt, a fixed unit, a calibration trace) — over the seven prompts of each model.
# Sourced by examples/findings.sh (its variables and functions: $KVSIM_BIN, $out, $blocks, $here, $models,
# $study_models, block_line, iv_of, csv_to_tsv).
#
# SyncKV's budget is the device KV per KV head at prefill, so `--budgets 50%` is the paper's Mem% = 50 %. Measured
# Mem% = device KV (storage_kv_bytes_mean) / the full cache's, both averaged over the decode steps, per trace.
# Matching: on each trace SyncKV's own run sets the level (its storage_bytes_mean, its traffic_bytes_mean) and every
# other policy is read at that level on the same trace (`kvsim compare --match mem|traffic --at X --trace T
# --per-trace`, interpolated in log bytes between its runs); the per-trace values give the mean over the traces and
# its interval, and SyncKV minus each policy the paired interval (`kvsim interval [--paired]`).

# The policies matched at SyncKV's memory and traffic: their runs at 16-192 tokens (at most the trace's positions)
# bracket SyncKV's levels on these traces. SnapKV's default keeps a set per query head (G x its budget);
# snapkv:gqa=max (one set per KV head, group-max scores) is the variant that can fit at SyncKV's memory.
sk_base="--policy window --policy streaming --policy tova --policy h2o --policy snapkv --policy snapkv:gqa=max
    --policy quest@reference --policy topk"
sk_matched="synckv window streaming tova h2o snapkv snapkv_max quest topk"

# The configuration of a run, from its policy and params: the policy's name for the baselines (snapkv_max:
# gqa=max); for SyncKV synckv (the paper's defaults), m1, m10, noant, delta, recent (Table 3's variants), rep<U> (unit
# U represents every layer) or calib (clusters from the calibration trace)
sk_cfg_awk='
    function cfg(pol, params,   p) {
        p = "," params ","
        if (pol == "snapkv" && index(p, ",gqa=max,")) return "snapkv_max"
        if (pol != "synckv") return pol
        if (match(p, /\/rep[0-9]+\.txt@/)) return "rep" substr(p, RSTART + 4, RLENGTH - 9)
        if (index(p, "/calib.txt@")) return "calib"
        if (index(p, ",m=1,")) return "m1"
        if (index(p, ",m=10,")) return "m10"
        if (index(p, ",anticipation=false,")) return "noant"
        if (index(p, ",delta=true,")) return "delta"
        if (index(p, ",nr_recent=since_anticipation,")) return "recent"
        return "synckv" }'
sk_name() {
    case $1 in
        synckv) echo "SyncKV" ;; window) echo "window" ;; streaming) echo "StreamingLLM" ;; tova) echo "TOVA" ;;
        h2o) echo "H2O" ;; snapkv) echo "SnapKV" ;; snapkv_max) echo "SnapKV (gqa=max)" ;;
        quest) echo "Quest (@reference)" ;; topk) echo "Exact-TopK (oracle)" ;; *) echo "$1" ;;
    esac
}

# sk_slim DB: one line per complete run of DB (tab-separated): 1 trace, 2 configuration, 3 budget fraction, 4 err,
# 5 recall, 6 storage, 7 storage_kv, 8 traffic, 9 h2d, 10 d2h (bytes per KV head; traffic and transfers per step),
# and 11 measured Mem% (storage_kv / the full run's on the trace; empty without one)
sk_slim() {
    "$KVSIM_BIN" runs "$1" --csv --summary | csv_to_tsv | awk -F'\t' '
        NR == 1 { for (i = 1; i <= NF; i++) if (!(($i) in c)) c[$i] = i; next }
        { n++; t[n] = $c["trace"]; kv[n] = $c["storage_kv_bytes_mean"]; k = cfg($c["policy"], $c["params"])
          if (k == "full") full[t[n]] = kv[n]
          r[n] = sprintf("%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s", t[n], k, $c["budget_fraction"], $c["out_err_mean"],
              $c["attn_recall_mean"], $c["storage_bytes_mean"], kv[n], $c["traffic_bytes_mean"], $c["h2d_bytes_mean"],
              $c["d2h_bytes_mean"]) }
        END { for (i = 1; i <= n; i++) printf "%s\t%s\n", r[i], (full[t[i]] > 0 ? sprintf("%.17g", 100 * kv[i] / full[t[i]]) : "") }
        '"$sk_cfg_awk"
}
# sk_vals FILE CFG FRAC COL: column COL of configuration CFG at budget fraction FRAC, one line per trace
sk_vals() { awk -F'\t' -v cfg="$2" -v f="$3" -v col="$4" '$2 == cfg && $3 != "" && $3 + 0 == f + 0 { print $col }' "$1"; }
# sk_pairs FILE CFG_A CFG_B FRAC COL: "a b" per trace where both configurations have a run at FRAC
sk_pairs() {
    awk -F'\t' -v a="$2" -v b="$3" -v f="$4" -v col="$5" '
        $3 == "" || $3 + 0 != f + 0 { next }
        $2 == a { va[$1] = $col; order[++n] = $1 } $2 == b { vb[$1] = $col }
        END { for (i = 1; i <= n; i++) if (order[i] in vb) print va[order[i]], vb[order[i]] }' "$1"
}
# sk_ratio FILE CFG_A CFG_B FRAC COL: the per-trace ratio a / b
sk_ratio() { sk_pairs "$@" | awk '$2 != 0 { printf "%.17g\n", $1 / $2 }'; }
# sk_iv LABEL TOTAL: "mean [lo, hi]" of the values on standard input (one per trace; kvsim interval), "(n = N of
# TOTAL)" when some traces have none, "0" when every value is 0 (nothing moved), "-" when there is none. Three
# significant figures, whole numbers from 100 up. The label names the quantity only: the same values give the same
# interval in every table (SyncKV's error at Mem% 50 % is a row of several)
sk_iv() {
    v=$(cat)
    if [ -z "$v" ]; then echo "-"; return; fi
    if echo "$v" | awk '$1 + 0 != 0 { exit 1 }'; then echo "0"; return; fi
    echo "$v" | "$KVSIM_BIN" interval --label "$1" | awk -F'\t' -v t="$2" '
        function f(x) { return (x >= 100 || x <= -100) ? sprintf("%.0f", x) : sprintf("%.3g", x) }
        { if ($4 < 2) printf "%s (n = 1 of %d)\n", f($1), t
          else if ($4 < t) printf "%s [%s, %s] (n = %d of %d)\n", f($1), f($2), f($3), $4, t
          else printf "%s [%s, %s]\n", f($1), f($2), f($3) }'
}
# sk_pct FRAC: 0.3 -> 30
sk_pct() { awk -v f="$1" 'BEGIN { print 100 * f }'; }

block_line SyncKV-1 "| model (traces) | Mem% target | policy | err | recall | measured Mem% | h2d + d2h B/step |"
block_line SyncKV-1 "|---|---|---|---|---|---|---|"
block_line SyncKV-2 "| model (traces) | policy | err at SyncKV's memory, Mem% 30 | at Mem% 50 | err at SyncKV's HBM traffic, Mem% 30 | at Mem% 50 |"
block_line SyncKV-2 "|---|---|---|---|---|---|"
block_line SyncKV-2-pairs "| model | SyncKV − | at SyncKV's memory, Mem% 30 | at Mem% 50 | at SyncKV's HBM traffic, Mem% 30 | at Mem% 50 |"
block_line SyncKV-2-pairs "|---|---|---|---|---|---|"
block_line SyncKV-3 "| model (traces) | configuration | err | recall | h2d B/step | d2h B/step |"
block_line SyncKV-3 "|---|---|---|---|---|---|"
block_line SyncKV-4 "| model (traces) | own prompt | unit 0 | unit 1 | unit 2 | unit 3 |"
block_line SyncKV-4 "|---|---|---|---|---|---|"
block_line SyncKV-5 "| model (traces) | Mem% | err, own prompt | err, calibration | err: calibration − own (paired) | recall: calibration − own (paired) |"
block_line SyncKV-5 "|---|---|---|---|---|---|"
for mname in $study_models; do
    sdir="$out/synckv/$mname"
    mkdir -p "$sdir"
    db="$sdir/synckv.db"
    n_traces=$(ls "$out/prompts/$mname"/*.kvt | wc -l)
    first=$(ls "$out/prompts/$mname"/*.kvt | head -n 1)
    # Fixed representatives: unit U in every layer (a clusters file, common/head_clusters.h: one cluster per layer)
    "$KVSIM_BIN" info "$first" > "$sdir/info.txt"
    sk_layers=$(awk '/^  layers/ { sub(",", "", $2); print $2 }' "$sdir/info.txt")
    sk_units=$(awk '/^  layers/ { for (i = 1; i <= NF; i++) if ($i == "kv") { v = $(i + 2); sub(",", "", v); print v } }' "$sdir/info.txt")
    sk_reps=""
    u=0
    while [ "$u" -lt "$sk_units" ]; do
        awk -v L="$sk_layers" -v U="$sk_units" -v r="$u" 'BEGIN { print "kvsim-head-clusters 1"; print "layers " L " units " U
            for (l = 0; l < L; l++) for (x = 0; x < U; x++) print l, x, 0, (x == r) }' > "$sdir/rep$u.txt"
        sk_reps="$sk_reps --policy synckv:clusters=$sdir/rep$u.txt"
        u=$((u + 1))
    done
    # The paper's clusters come offline from a calibration corpus (App. B.1): here `kvsim heads --clusters 1` (N_r = 1,
    # the paper's for 4 KV heads) on the same model decoding other text — the bundled multi-turn trace for
    # stories260K, a capture of examples/turns.txt otherwise
    case $mname in
        stories260K) calib="$here/stories260K_multiturn.kvt" ;;
        *)
            m="$models/$mname"
            [ -e "$m" ] || m="$models/$mname.bin"
            calib="$sdir/calibration.kvt"
            "$KVSIM_BIN" capture --model "$m" --prompt-file "$here/turns.txt" --steps 256 --ignore-eos --quiet \
                --out "$calib" > /dev/null ;;
    esac
    "$KVSIM_BIN" heads "$calib" --db "$sdir/calib_heads.db" --clusters 1 --clusters-out "$sdir/calib.txt" > /dev/null
    for t in "$out/prompts/$mname"/*.kvt; do
        n_pos=$("$KVSIM_BIN" info "$t" | awk '/^positions/ { print $2 }')
        grid=$(for B in 16 32 64 128 192; do [ "$B" -le "$n_pos" ] && echo "$B"; done | paste -sd, -)
        # shellcheck disable=SC2086
        {
            "$KVSIM_BIN" replay "$t" --db "$db" --policy synckv --policy "synckv:clusters=$sdir/calib.txt" \
                --policy quest@reference --policy snapkv --policy topk --budgets 30%,50%,70% > /dev/null
            "$KVSIM_BIN" replay "$t" --db "$db" --policy synckv@no-suspension --policy synckv@m10 \
                --policy synckv@no-anticipation --policy synckv:delta=1 --policy synckv:nr_recent=since_anticipation \
                $sk_reps --policy full --budgets 50% > /dev/null
            "$KVSIM_BIN" replay "$t" --db "$db" $sk_base --budgets "$grid" > /dev/null
        } 2>> "$sdir/warnings.txt"
    done
    runs="$sdir/runs.tsv"
    sk_slim "$db" > "$runs"

    # ---- SyncKV-1: at the same nominal Mem% (Quest, SnapKV, Exact-TopK at the same budget) --------------------
    for f in 0.3 0.5; do
        for c in synckv quest snapkv topk; do
            e=$(sk_vals "$runs" "$c" "$f" 4 | sk_iv "SyncKV $mname err" "$n_traces")
            r=$(sk_vals "$runs" "$c" "$f" 5 | sk_iv "SyncKV $mname recall" "$n_traces")
            mp=$(sk_vals "$runs" "$c" "$f" 11 | sk_iv "SyncKV $mname Mem%" "$n_traces")
            h=$(sk_vals "$runs" "$c" "$f" 9 | sk_iv "SyncKV $mname h2d" "$n_traces")
            dh=$(sk_vals "$runs" "$c" "$f" 10 | sk_iv "SyncKV $mname d2h" "$n_traces")
            block_line SyncKV-1 "| $mname ($n_traces) | $(sk_pct "$f") % | $(sk_name "$c") | $e | $r | $mp % | $h + $dh |"
        done
    done

    # ---- SyncKV-2: every policy at each trace's SyncKV memory and HBM traffic --------------------------------
    # match.tsv: trace, mem|traffic, fraction, configuration, status, err, x_min, x_max, at
    match="$sdir/match.tsv"
    : > "$match"
    for t in "$out/prompts/$mname"/*.kvt; do
        for f in 0.3 0.5; do
            for mt in mem traffic; do
                col=6
                [ "$mt" = traffic ] && col=8
                X=$(awk -F'\t' -v t="$t" -v f="$f" -v col="$col" '$1 == t && $2 == "synckv" && $3 != "" && $3 + 0 == f + 0 { print $col; exit }' "$runs")
                [ -n "$X" ] || continue
                "$KVSIM_BIN" compare "$db" --match "$mt" --at "$X" --trace "$t" --per-trace --csv \
                    --metric out_err_mean | csv_to_tsv | awk -F'\t' -v mt="$mt" -v f="$f" -v t="$t" '
                    NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
                    { printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", t, mt, f, cfg($c["policy"], $c["params"]), $c["status"],
                          $c["out_err_mean"], $c["x_min"], $c["x_max"], $c["at"] }
                    '"$sk_cfg_awk" >> "$match"
            done
        done
    done
    for f in 0.3 0.5; do
        lm=$(sk_vals "$runs" synckv "$f" 6 | awk '{ printf "%.17g\n", $1 / 1024 }' | sk_iv "SyncKV $mname KiB" "$n_traces")
        lt=$(sk_vals "$runs" synckv "$f" 8 | awk '{ printf "%.17g\n", $1 / 1024 }' | sk_iv "SyncKV $mname KiB" "$n_traces")
        block_line SyncKV-2-levels "- $mname, Mem% $(sk_pct "$f"): SyncKV's resident memory $lm KiB per KV head (the level of the memory columns), its HBM traffic $lt KiB per step per KV head (the traffic columns)"
    done
    for c in $sk_matched; do
        row="| $mname ($n_traces) | $(sk_name "$c")"
        prow="| $mname | $(sk_name "$c")"
        for mt in mem traffic; do
            for f in 0.3 0.5; do
                vals=$(awk -F'\t' -v mt="$mt" -v f="$f" -v c="$c" '$2 == mt && $3 == f && $4 == c && $6 != "" { print $6 }' "$match")
                if [ -n "$vals" ]; then
                    row="$row | $(echo "$vals" | sk_iv "SyncKV $mname err" "$n_traces")"
                else
                    # none: every run of the policy holds (reads) more than SyncKV on every trace, or less
                    row="$row | $(awk -F'\t' -v mt="$mt" -v f="$f" -v c="$c" '$2 == mt && $3 == f && $4 == c {
                            if ($7 + 0 > $9 + 0) above++; else below++ }
                        END { what = (mt == "mem" ? "memory" : "traffic")
                              if (above && !below) print "none: its least " what " is above the level on every trace"
                              else if (below && !above) print "none: its most " what " is below the level on every trace"
                              else print "none on any trace" }' "$match")"
                fi
                [ "$c" = synckv ] && continue
                pairs=$(awk -F'\t' -v mt="$mt" -v f="$f" -v c="$c" '$2 != mt || $3 != f || $6 == "" { next }
                    $4 == "synckv" { s[$1] = $6; o[++n] = $1 } $4 == c { b[$1] = $6 }
                    END { for (i = 1; i <= n; i++) if (o[i] in b) print s[o[i]], b[o[i]] }' "$match")
                if [ -n "$pairs" ]; then
                    prow="$prow | $(echo "$pairs" | iv_of "SyncKV $mname paired err" --paired)"
                else
                    prow="$prow | -"
                fi
            done
        done
        block_line SyncKV-2 "$row |"
        [ "$c" = synckv ] || block_line SyncKV-2-pairs "$prow |"
    done

    # ---- SyncKV-3: the period m and the variants at Mem% 50 % ----------------------------------------------
    for entry in "m1|m = 1 (w/o Suspension)" "synckv|m = 5 (the paper's)" "m10|m = 10" "noant|w/o Anticipation" \
        "delta|m = 5, delta=1" "recent|m = 5, nr_recent=since_anticipation"; do
        c=${entry%%|*}
        e=$(sk_vals "$runs" "$c" 0.5 4 | sk_iv "SyncKV $mname err" "$n_traces")
        r=$(sk_vals "$runs" "$c" 0.5 5 | sk_iv "SyncKV $mname recall" "$n_traces")
        h=$(sk_vals "$runs" "$c" 0.5 9 | sk_iv "SyncKV $mname h2d" "$n_traces")
        dh=$(sk_vals "$runs" "$c" 0.5 10 | sk_iv "SyncKV $mname d2h" "$n_traces")
        block_line SyncKV-3 "| $mname ($n_traces) | ${entry#*|} | $e | $r | $h | $dh |"
    done
    for entry in "m1|synckv|m = 1 − m = 5" "synckv|m10|m = 5 − m = 10" "synckv|noant|m = 5 − w/o Anticipation" \
        "recent|synckv|nr_recent − m = 5" "recent|m1|nr_recent − m = 1" "delta|synckv|delta − m = 5"; do
        a=${entry%%|*}
        rest=${entry#*|}
        b=${rest%%|*}
        block_line SyncKV-3-pairs "- $mname, err ${rest#*|}: $(sk_pairs "$runs" "$a" "$b" 0.5 4 | iv_of "SyncKV $mname paired err" --paired)"
    done
    for entry in "m1|synckv|m = 1 / m = 5" "synckv|m10|m = 5 / m = 10" "delta|synckv|delta / full refetch (m = 5)"; do
        a=${entry%%|*}
        rest=${entry#*|}
        b=${rest%%|*}
        block_line SyncKV-3-pairs "- $mname, h2d ${rest#*|}: $(sk_ratio "$runs" "$a" "$b" 0.5 9 | sk_iv "SyncKV $mname h2d ratio" "$n_traces")"
    done

    # ---- SyncKV-4: the own prompt's representatives against a fixed unit in every layer (Mem% 50 %) ---------------
    row="| $mname ($n_traces) | $(sk_vals "$runs" synckv 0.5 4 | sk_iv "SyncKV $mname err" "$n_traces")"
    u=0
    while [ "$u" -lt "$sk_units" ]; do
        row="$row | $(sk_vals "$runs" "rep$u" 0.5 4 | sk_iv "SyncKV $mname err" "$n_traces")"
        block_line SyncKV-4-pairs "- $mname, err own prompt − unit $u: $(sk_pairs "$runs" synckv "rep$u" 0.5 4 | iv_of "SyncKV $mname paired err" --paired)"
        u=$((u + 1))
    done
    block_line SyncKV-4 "$row |"

    # ---- SyncKV-5: calibration clusters against the trace's own prompt ------------------------------------------
    for f in 0.3 0.5 0.7; do
        o=$(sk_vals "$runs" synckv "$f" 4 | sk_iv "SyncKV $mname err" "$n_traces")
        k=$(sk_vals "$runs" calib "$f" 4 | sk_iv "SyncKV $mname err" "$n_traces")
        de=$(sk_pairs "$runs" calib synckv "$f" 4 | iv_of "SyncKV $mname paired err" --paired)
        dr=$(sk_pairs "$runs" calib synckv "$f" 5 | iv_of "SyncKV $mname paired recall" --paired)
        block_line SyncKV-5 "| $mname ($n_traces) | $(sk_pct "$f") % | $o | $k | $de | $dr |"
    done
    block_line SyncKV-5-reps "- $mname (calibration: $(basename "$calib")): representatives (layer:unit)$(awk '$4 == 1 { printf " %s:%s", $1, $2 }' "$sdir/calib.txt")"
done
