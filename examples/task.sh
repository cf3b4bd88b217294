#!/bin/sh
# task.sh — accuracy on a task with a right answer, per policy and budget, in closed loop (kvsim generate --task;
# sim/closed_loop.h "Tasks"). Attention error is a proxy; here the question is whether the model still produces the
# answer when every layer attends only to the policy's selection:
#  1. examples/tasks/name_recall.txt (32 items: a child's name given in a story's first sentence, asked for ~40-110
#     tokens later): the full model and POLICIES at BUDGETS on stories260K and tinystories-656K, the two models side
#     by side (one process each). Per row: correct items, accuracy with a 95% percentile bootstrap interval over the
#     items, and the paired difference against the full model ("below full" when its interval lies under 0);
#  2. examples/tasks/object_recall.txt (24 items: a toy named early, asked for after "could not find the <colour>"),
#     the full model only (a window of 512 covers every context: it scores as the full model), to show how far a
#     second task design gets.
# The prompt is each context but its last token: the policy compresses the context, then the last token and the
# answer are decoded through it.
# Results in examples/out/task/ ($TASK_OUT when set), per model: results_<model>.db (tables closed_task_runs,
# closed_task_items; each item's closed-loop run in closed_runs; one database per model, as the two run at once),
# name_recall_<model>.txt, object_recall_<model>.txt and items_<model>.txt (each name item's answer and the full
# model's continuation, when sqlite3 is installed).
# Usage: sh examples/task.sh [BUDGETS [POLICIES]] (default 16,32,64 and "window streaming h2o snapkv": about 40 s on
# two cores); KVSIM_BIN names the kvsim binary.
set -eu
cd "$(dirname "$0")/.."
KVSIM=${KVSIM_BIN:-./kvsim}
case $KVSIM in /*) ;; *) KVSIM=$(pwd)/$KVSIM ;; esac
BUDGETS=${1:-16,32,64}
POLICIES=${2:-window streaming h2o snapkv}
OUT=${TASK_OUT:-examples/out/task}
MODELS=../shared/models
[ -x "$KVSIM" ] || { echo "task.sh: $KVSIM not found: run 'make' first" >&2; exit 1; }
mkdir -p "$OUT"
rm -f "$OUT"/results*.db "$OUT"/results*.db-wal "$OUT"/results*.db-shm "$OUT"/*_recall_*.txt "$OUT"/items_*.txt
POL=""
for p in $POLICIES; do POL="$POL --policy $p"; done

# One model into its own database.
study() {
    m=$1 name=${1%.bin}
    # shellcheck disable=SC2086
    "$KVSIM" generate --model "$MODELS/$m" --task examples/tasks/name_recall.txt $POL --budgets "$BUDGETS" \
        --db "$OUT/results_$name.db" > "$OUT/name_recall_$name.txt"
    "$KVSIM" generate --model "$MODELS/$m" --task examples/tasks/object_recall.txt --policy window --budgets 512 \
        --db "$OUT/results_$name.db" > "$OUT/object_recall_$name.txt"
}
study stories260K.bin & pid=$!
study tinystories-656K
wait "$pid"
for name in stories260K tinystories-656K; do
    if command -v sqlite3 > /dev/null; then
        sqlite3 -separator ' | ' "$OUT/results_$name.db" "SELECT i.line, i.answer, i.full_correct,
            replace(i.full_text, char(10), ' ') FROM closed_task_items i WHERE i.task_run_id = (SELECT MIN(id) FROM
            closed_task_runs WHERE task LIKE '%name_recall.txt' AND status = 'complete') ORDER BY i.item" \
            > "$OUT/items_$name.txt"
    fi
    echo "== $name"
    cat "$OUT/name_recall_$name.txt"
    sed -n '3p' "$OUT/object_recall_$name.txt" | sed 's/^(full cache) */object_recall, full cache: /'
done
