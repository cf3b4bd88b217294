# heads.sh — head similarity and clustering (FINDINGS.md, SyncKV: head similarity, S4, S12).
# Sourced by examples/findings.sh (its variables and functions: $KVSIM_BIN, $out, $blocks, $traces, $study_models,
# say, block_line, field_like, budgets_of, ratio, fmt_iv, iv_of, csv_to_tsv, trace_facts).

# ---- S4: intralayer against interlayer head similarity, without the pairs that share a KV head -----------------
block_line S4 "| model (traces) | within a layer, all pairs | within, pairs of different KV heads | pairs sharing a KV head | across layers | within (different KV heads) − across (paired) |"
block_line S4 "|---|---|---|---|---|---|"
for mname in $study_models; do
    n_traces=$(ls "$out/prompts/$mname"/*.kvt | wc -l)
    : > "$out/heads_$mname.csv"
    for t in "$out/prompts/$mname"/*.kvt; do
        "$KVSIM_BIN" heads "$t" --db "$out/heads_$mname.db" --csv | awk -F, '$1 == "query" && ($2 == "within" || $2 == "across")' \
            >> "$out/heads_$mname.csv"
    done
    within=$(awk -F, '$2 == "within"' "$out/heads_$mname.csv")
    across=$(awk -F, '$2 == "across"' "$out/heads_$mname.csv")
    a=$(echo "$within" | cut -d, -f5 | iv_of "S4 $mname within all")
    o=$(echo "$within" | cut -d, -f6 | iv_of "S4 $mname within other kv")
    sk=$(echo "$within" | cut -d, -f7 | iv_of "S4 $mname within same kv")
    x=$(echo "$across" | cut -d, -f5 | iv_of "S4 $mname across")
    d=$(awk -F, '$2 == "within" { w[++i] = $6 } $2 == "across" { x[++j] = $5 }
        END { for (m = 1; m <= i; m++) print w[m], x[m] }' "$out/heads_$mname.csv" |
        iv_of "S4 $mname within-other-kv minus across" --paired)
    block_line S4 "| $mname ($n_traces) | $a | $o | $sk | $x | $d |"
done


# ---- S12: stability of the clustering across prompts and across the halves of one trace ------------------------
# Per trace one `kvsim heads --stability halves --json`: per layer the silhouette of the trace's clustering, the ARI
# of the clusterings of its two halves of decode steps, and the clustering itself (the "cluster" labels of the
# layer's units). The ARI of two traces' clusterings is computed here from those labels (ari_of, the formula of
# common/kvs_cluster.h); one pair per model is also run through `kvsim heads --stability TRACE2`, and a difference
# stops the script. Across prompts, a trace's sample is its mean ARI against the other traces of its model (the
# mean of the seven is the mean over the 21 pairs); the pairs share traces, so the interval resamples traces, not pairs.

# ari_of "L1 L2 ..." "M1 M2 ...": the adjusted Rand index of two labelings (1 when both are trivial)
ari_of() { awk -v a="$1" -v b="$2" 'function c2(x) { return x * (x - 1) / 2 }
    BEGIN { n = split(a, x, " "); split(b, y, " ")
        for (i = 1; i <= n; i++) { t[x[i] SUBSEP y[i]]++; ra[x[i]]++; rb[y[i]]++ }
        for (k in t) s += c2(t[k]); for (k in ra) sa += c2(ra[k]); for (k in rb) sb += c2(rb[k])
        e = sa * sb / c2(n); den = (sa + sb) / 2 - e
        printf "%.17g\n", den == 0 ? 1 : (s - e) / den }'; }

block_line S12 "| model (traces) | layer | silhouette | ARI of the two halves of a trace | ARI between two prompts (a trace against the others) |"
block_line S12 "|---|---|---|---|---|"
for mname in $study_models; do
    n_traces=$(n_traces_of "$mname")
    lay="$out/heads_layers_$mname.txt"
    : > "$lay"
    i=0
    for t in "$out/prompts/$mname"/*.kvt; do
        i=$((i + 1))
        # one line per layer: trace index, layer, silhouette, halves' ARI, the units' cluster labels
        "$KVSIM_BIN" heads "$t" --db "$out/heads_s12_$mname.db" --stability halves --json |
            sed -n 's/^{"layer":\([0-9]*\),"n_clusters":[0-9]*,"silhouette":\([^,]*\),"ari":\([^,]*\),"cluster":\[\([0-9,]*\)\].*/\1 \2 \3 \4/p' |
            awk -v i="$i" '{ gsub(/,/, " ", $4); print i, $0 }' >> "$lay"
    done
    n_layers=$(awk '{ print $2 }' "$lay" | sort -n | uniq | wc -l)
    # the ARI of every pair of traces, per layer: "i j layer ari"
    pairs="$out/heads_pairs_$mname.txt"
    : > "$pairs"
    l=0
    while [ "$l" -lt "$n_layers" ]; do
        awk -v l="$l" '$2 == l { s = $1; for (j = 5; j <= NF; j++) s = s " " $j; print s }' "$lay" > "$out/heads_l.txt"
        while read -r ia la; do
            while read -r ib lb; do
                [ "$ib" -gt "$ia" ] && echo "$ia $ib $l $(ari_of "$la" "$lb")" >> "$pairs"
            done < "$out/heads_l.txt"
        done < "$out/heads_l.txt"
        l=$((l + 1))
    done
    # the cross-check: the first two traces through kvsim heads --stability TRACE2
    t1=$(ls "$out/prompts/$mname"/*.kvt | sed -n 1p)
    t2=$(ls "$out/prompts/$mname"/*.kvt | sed -n 2p)
    "$KVSIM_BIN" heads "$t1" --db "$out/heads_s12_$mname.db" --stability "$t2" --json |
        sed -n 's/^{"layer":\([0-9]*\),.*"ari":\([^,]*\),.*/\1 \2/p' > "$out/heads_check_$mname.txt"
    if ! awk 'NR == FNR { want[$1] = $2; next } $1 == 1 && $2 == 2 { d = $4 - want[$3]; if (d < 0) d = -d
              if (d > 1e-12) bad = 1; seen++ } END { exit bad || seen == 0 }' "$out/heads_check_$mname.txt" "$pairs"; then
        echo "findings: S12: the ARI computed here differs from kvsim heads --stability for $t1 and $t2" >&2
        exit 1
    fi
    for l in $(seq 0 $((n_layers - 1))) all; do
        if [ "$l" = all ]; then sel='1'; label="mean over layers"; else sel="\$2 == $l"; label=$l; fi
        # per trace: the mean over the selected layers
        s=$(awk "$sel" "$lay" | awk '{ s[$1] += $3; c[$1]++ } END { for (i in s) print i, s[i] / c[i] }' | sort -n | cut -d' ' -f2 |
            iv_of "S12 $mname layer $l silhouette")
        h=$(awk "$sel" "$lay" | awk '{ s[$1] += $4; c[$1]++ } END { for (i in s) print i, s[i] / c[i] }' | sort -n | cut -d' ' -f2 |
            iv_of "S12 $mname layer $l halves")
        if [ "$l" = all ]; then psel='1'; else psel="\$3 == $l"; fi
        x=$(awk "$psel" "$pairs" | awk '{ s[$1] += $4; c[$1]++; s[$2] += $4; c[$2]++ } END { for (i in s) print i, s[i] / c[i] }' |
            sort -n | cut -d' ' -f2 | iv_of "S12 $mname layer $l across")
        block_line S12 "| $mname ($n_traces) | $label | $s | $h | $x |"
    done
done
