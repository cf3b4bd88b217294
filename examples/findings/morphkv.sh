# morphkv.sh — MorphKV's findings (FINDINGS.md, MorphKV; POLICY_SPEC §5.1).
# Sourced by examples/findings.sh (its variables and functions: $KVSIM_BIN, $out, $blocks, $traces, $study_models,
# say, block_line, field_like, budgets_of, ratio, fmt_iv, iv_of, csv_to_tsv, trace_facts).

for trace in $traces; do
    trace_facts "$trace"
    mdb="$dir/morphkv.db"
    "$KVSIM_BIN" replay "$trace" --db "$mdb" --policy full --policy morphkv@longwriter \
        --policy morphkv@longwriter:fusion=max --policy morphkv@longwriter:profile=qz \
        --policy morphkv@longwriter:paper_ctot=0 \
        --policy h2o@morphkv-longwriter --policy snapkv@morphkv-longwriter --policy window \
        --budgets 33,65,129 > "$dir/morphkv_runs.txt" 2> "$dir/morphkv_warnings.txt"
    mk="recent=30,fusion=sum,fidelity=paper,profile=rows,evict_after=1,paper_ctot=600"
    mkmax="recent=30,fusion=max,fidelity=paper,profile=rows,evict_after=1,paper_ctot=600"
    mkqz="recent=30,fusion=sum,fidelity=paper,profile=qz,evict_after=1,paper_ctot=600"
    h2o="recent=0.5,gqa=expand,prefill=budget,window=30,block=0"
    snap="window=30,kernel=7,pool=max,gqa=expand,block=0"
    say "M2/M9/M13/M16 resident KV bytes per KV head at equal nominal capacity C_tot (mean over decode steps), as ratios:"
    say "  C_tot  morphkv/full  h2o/full  snapkv/full  morphkv/h2o (1/G = $(ratio 1 "$G"))  profiles/KV rows  qz   err: morphkv sum  max  h2o  snapkv  window"
    for B in 33 65 129; do
        full=$(field_like "$mdb" full "" "$B" storage_kv_bytes_mean)
        mkv=$(field_like "$mdb" morphkv "$mk" "$B" storage_kv_bytes_mean)
        maux=$(field_like "$mdb" morphkv "$mk" "$B" storage_aux_bytes_mean)
        qaux=$(field_like "$mdb" morphkv "$mkqz" "$B" storage_aux_bytes_mean)
        hkv=$(field_like "$mdb" h2o "$h2o" "$B" storage_kv_bytes_mean)
        skv=$(field_like "$mdb" snapkv "$snap" "$B" storage_kv_bytes_mean)
        e1=$(field_like "$mdb" morphkv "$mk" "$B" out_err_mean)
        e2=$(field_like "$mdb" morphkv "$mkmax" "$B" out_err_mean)
        e3=$(field_like "$mdb" h2o "$h2o" "$B" out_err_mean)
        e4=$(field_like "$mdb" snapkv "$snap" "$B" out_err_mean)
        e5=$(field_like "$mdb" window "" "$B" out_err_mean)
        say "$(printf '  %5d  %12s  %8s  %11s  %26s  %16s  %5s   %16.4f  %6.4f  %6.4f  %6.4f  %6.4f' $((B - 1)) \
            "$(ratio "$mkv" "$full")" "$(ratio "$hkv" "$full")" "$(ratio "$skv" "$full")" "$(ratio "$mkv" "$hkv")" \
            "$(ratio "$maux" "$mkv")" "$(ratio "$qaux" "$mkv")" "$e1" "$e2" "$e3" "$e4" "$e5")"
    done
    mk30="recent=30,fusion=sum,fidelity=paper,profile=rows,evict_after=1,paper_ctot=0"
    kv30=$(field_like "$mdb" morphkv "$mk30" 129 storage_kv_bytes_mean)
    aux30=$(field_like "$mdb" morphkv "$mk30" 129 storage_aux_bytes_mean)
    say "G7 profile store at the paper's R=30 (not scaled), C_tot=128: aux/KV measured $(ratio "$aux30" "$kv30"); G R/(2d) = $(awk -v g="$G" -v d="$d" 'BEGIN { printf "%.4f", g * 30 / (2 * d) }') in one dtype, x 2 for fp32 profiles beside fp16 KV = $(awk -v g="$G" -v d="$d" 'BEGIN { printf "%.4f", g * 30 / d }')"
    X=$(field_like "$mdb" window "" 129 storage_bytes_mean)
    "$KVSIM_BIN" compare "$mdb" --match mem --at "$X" \
        --metric out_err_mean,attended_tokens_mean,storage_kv_bytes_mean,storage_aux_bytes_mean > "$dir/morphkv_equal_memory.txt"
    say "MorphKV at equal resident memory ($X bytes per KV head = window at budget 129; KV + profiles), out_err_mean:"
    awk '/^(morphkv|h2o|snapkv|window|full) / { e = ($6 ~ /^[0-9.]/) ? $5 : "out-of-range"; print "  " $1, e, $NF }' \
        "$dir/morphkv_equal_memory.txt" | tee -a "$summary"

done
