# rocketkv.sh — RocketKV's, HSA's, Quest's and SparQ's findings (FINDINGS.md, RocketKV; POLICY_SPEC §5.2).
# Sourced by examples/findings.sh (its variables and functions: $KVSIM_BIN, $out, $blocks, $traces, $study_models,
# say, block_line, field_like, budgets_of, ratio, fmt_iv, iv_of, csv_to_tsv, trace_facts).

for trace in $traces; do
    trace_facts "$trace"
    # Quest with fill=tokens: exactly its t/2 quota, as the paper's Table 1 counts every method (fill=pages, Quest's
    # own whole pages and kvsim's default, attends fewer when a page does not fit the quota)
    rdb="$dir/rocketkv.db"
    "$KVSIM_BIN" replay "$trace" --db "$rdb" --policy topk --policy rocketkv --policy hsa --policy quest:fill=tokens \
        --policy sparq --policy snapkv --policy h2o --policy tova --policy window \
        --budgets 16,32,64,128,256 > "$dir/rocketkv_runs.txt" 2> "$dir/rocketkv_warnings.txt"
    say "R3 out_err_mean by token budget t = 16 / 32 / 64 / 128 / 256 (Exact-TopK attends t; RocketKV, HSA, Quest, SparQ t/2):"
    for pol in topk rocketkv hsa quest sparq snapkv h2o tova window; do
        line=$(printf '  %-10s' "$pol")
        for B in 16 32 64 128 256; do line="$line $(printf '%9.4f' "$(field_like "$rdb" "$pol" "" "$B" out_err_mean)")"; done
        say "$line"
    done
    X=$(field_like "$rdb" topk "" 64 traffic_bytes_mean)
    "$KVSIM_BIN" compare "$rdb" --match traffic --at "$X" > "$dir/rocketkv_equal_traffic.txt"
    say "R3 at equal traffic ($X bytes read per step per KV head = Exact-TopK at t = 64), out_err_mean:"
    awk '/^(topk|rocketkv|hsa|quest|sparq|snapkv|h2o|tova|window) / { e = ($5 ~ /^[0-9.]/) ? $5 : "out-of-range"; print "  " $1, e }' \
        "$dir/rocketkv_equal_traffic.txt" | tee -a "$summary"
    say "R9 KV pairs read per step / t (traffic_bytes_mean / (2 d kv_bytes) / t; Table 1: 1 for every method):"
    for pol in rocketkv hsa quest sparq topk; do
        line=$(printf '  %-10s' "$pol")
        for B in 64 128 256; do
            tr=$(field_like "$rdb" "$pol" "" "$B" traffic_bytes_mean)
            line="$line $(awk -v tr="$tr" -v d="$d" -v t="$B" 'BEGIN { printf "t=%d %.3f", t, tr / (2 * d * 2) / t }')"
        done
        say "$line"
    done
    say "R4 union of the top-16 positions over the generated steps (median over heads per layer; x k, x sequence length):"
    awk '/^ +[0-9]+ / { printf "  layer %s union %s = %sx k = %s of the sequence\n", $1, $5, $7, $8 }' "$dir/attn.txt" | tee -a "$summary"
done

# ---- RocketKV-MT on the bundled multi-turn trace (R12) ------------------------------------------------
mt="$here/stories260K_multiturn.kvt"
mdir="$out/stories260K_multiturn"
mkdir -p "$mdir"
mtdb="$mdir/rocketkv_mt.db"
"$KVSIM_BIN" replay "$mt" --db "$mtdb" --policy topk --policy rocketkv --policy rocketkv_mt --policy hsa \
    --policy snapkv --policy window --budgets 16,32,64,128 > "$mdir/runs.txt" 2> "$mdir/warnings.txt"
say ""
say "=== stories260K_multiturn: $("$KVSIM_BIN" info "$mt" | awk '/^positions/ { p = $2 } /^turns/ { t = $2 } END { print p " positions, " t " turns" }')"
say "R12 out_err_mean by token budget 16 / 32 / 64 / 128, and host bytes of RocketKV-MT's store (mean):"
for pol in topk rocketkv rocketkv_mt hsa snapkv window; do
    line=$(printf '  %-12s' "$pol")
    for B in 16 32 64 128; do line="$line $(printf '%9.4f' "$(field_like "$mtdb" "$pol" "" "$B" out_err_mean)")"; done
    say "$line"
done
line=$(printf '  %-12s' "mt host B")
for B in 16 32 64 128; do line="$line $(printf '%9.0f' "$(field_like "$mtdb" rocketkv_mt "" "$B" storage_host_bytes_mean)")"; done
say "$line"
