#!/bin/sh
# The main kvsim job, end to end: (capture ->) replay a policy x budget sweep -> results table -> plots.
#
#   sh examples/main_job.sh                  replay the bundled trace examples/stories260K.kvt, which kvsim
#                                            captured from the real stories260K model with the prompt
#                                            examples/prompt.txt (495 positions: 239 prompt + 256 greedy
#                                            tokens, fp16)
#   sh examples/main_job.sh MODEL [PROMPT_FILE]
#                                            first capture a fresh trace from your own checkpoint
#                                            (llama2.c .bin or Hugging Face folder), then the same
#
# Outputs go to $OUT (default examples/out): trace.kvt (when captured), results.db, runs.csv,
# error_vs_budget.png, recall_vs_budget.png, memory_vs_budget.png, error_vs_position.png.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
KVSIM=${KVSIM:-$root/kvsim}
out=${OUT:-$here/out}
[ -x "$KVSIM" ] || { echo "main_job: $KVSIM not found: run 'make' first" >&2; exit 1; }
mkdir -p "$out"

if [ $# -ge 1 ]; then
    trace="$out/trace.kvt"
    "$KVSIM" capture --model "$1" --prompt-file "${2:-$here/prompt.txt}" --steps 256 --ignore-eos --out "$trace"
else
    trace="$here/stories260K.kvt"
fi
"$KVSIM" info "$trace"
"$KVSIM" verify "$trace"

# A fresh study each time, so the pictures show exactly this sweep.
rm -f "$out/results.db" "$out/results.db-wal" "$out/results.db-shm"
"$KVSIM" replay "$trace" --db "$out/results.db" \
    --policy full --policy window --policy streaming --policy h2o --policy tova \
    --policy scissorhands --policy snapkv --policy pyramidkv --policy adakv --policy topk \
    --budgets 8,16,32,64,128 --series-every 1
"$KVSIM" runs "$out/results.db"
"$KVSIM" runs "$out/results.db" --csv > "$out/runs.csv"
"$KVSIM" plot "$out/results.db" --kind error-vs-budget --out "$out/error_vs_budget.png"
"$KVSIM" plot "$out/results.db" --kind error-vs-budget --metric attn_recall_mean --out "$out/recall_vs_budget.png"
"$KVSIM" plot "$out/results.db" --kind memory-vs-budget --out "$out/memory_vs_budget.png"
"$KVSIM" plot "$out/results.db" --kind error-vs-position --budget 32 --out "$out/error_vs_position.png"
echo "main_job: results in $out (results.db, runs.csv, *.png)"
