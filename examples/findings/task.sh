# task.sh — the task with a right answer (FINDINGS.md, T-1: name recall in closed loop).
# Sourced by examples/findings.sh (its variables and functions: $KVSIM_BIN, $out, $blocks, $traces, $study_models,
# say, block_line, field_like, budgets_of, ratio, fmt_iv, iv_of, csv_to_tsv, trace_facts).

# ---- T-1: a task with a right answer (name recall), closed loop -----------------------------------------------
block_line T-1 "| model | policy | budget | correct | accuracy [95% interval] | policy − full [95% interval] |"
block_line T-1 "|---|---|---:|---:|---|---|"
for mname in $study_models; do
    m="$models/$mname"
    [ -e "$m" ] || m="$models/$mname.bin"
    "$KVSIM_BIN" generate --model "$m" --task "$here/tasks/name_recall.txt" --policy window --policy streaming \
        --policy h2o --policy tova --policy snapkv --budgets 32,64 --db "$out/task_$mname.db" > "$out/task_$mname.txt" || true
    awk -v m="$mname" '
        /^\(full cache\)/ { printf "| %s | full cache | - | %s | %s %s %s | - |\n", m, $4, $5, $6, $7; next }
        /^[a-z_0-9]+ +[0-9]+ +[0-9]+\/[0-9]+ / { below = ($NF == "full") ? ", below full" : ""
            printf "| %s | %s | %s | %s | %s %s %s | %s %s %s%s |\n", m, $1, $2, $3, $4, $5, $6, $7, $8, $9, below }' \
        "$out/task_$mname.txt" >> "$blocks/T-1.md"
done

