#!/bin/sh
# closed_loop.sh — the closed-loop calibration study (../shared/DESIGN.md "Closed-loop decoding"):
# every registered non-oracle policy at three budgets on stories260K and tinystories-656K.
#  1. capture a trace whose prompt is the first paragraph of examples/heldout_story.txt (a short story written
#     for this study, never seen by the models' training data as such), 96 generated tokens;
#  2. replay it (offline, teacher-forced attention error) and run `kvsim generate --trace` on it (closed loop);
#  3. `kvsim generate --text` on the whole held-out story: perplexity with and without each policy;
#  4. `kvsim calibrate`: Spearman of offline vs closed-loop metrics, rank disagreements, scatter plot.
# Results in examples/out/closed_loop/: results.db, calibrate.txt, calibrate.png, generate_*.txt.
# Usage: sh examples/closed_loop.sh [BUDGETS] (default 8,16,32); KVSIM_BIN names the kvsim binary.
set -eu
cd "$(dirname "$0")/.."
KVSIM=${KVSIM_BIN:-./kvsim}
BUDGETS=${1:-8,16,32}
OUT=examples/out/closed_loop
MODELS=../shared/models
mkdir -p "$OUT"
rm -f "$OUT/results.db" "$OUT/results.db-wal" "$OUT/results.db-shm"
head -n 1 examples/heldout_story.txt > "$OUT/prompt.txt"
POLICIES=$("$KVSIM" policies --json | grep -o '{"name":"[a-z0-9_]*","summary":"[^"]*","oracle":false' |
           sed 's/{"name":"\([a-z0-9_]*\)".*/--policy \1/' | tr '\n' ' ')
for m in stories260K.bin tinystories-656K; do
    name=${m%.bin}
    "$KVSIM" capture --model "$MODELS/$m" --prompt-file "$OUT/prompt.txt" --steps 96 --ignore-eos --dtype fp32 \
        --threads 2 --out "$OUT/$name.kvt" > /dev/null
    # shellcheck disable=SC2086
    "$KVSIM" replay "$OUT/$name.kvt" --db "$OUT/results.db" $POLICIES --budgets "$BUDGETS" > /dev/null 2>&1 || true
    # shellcheck disable=SC2086
    "$KVSIM" generate --model "$MODELS/$m" --trace "$OUT/$name.kvt" --db "$OUT/results.db" $POLICIES \
        --budgets "$BUDGETS" > "$OUT/generate_trace_$name.txt" || true
    # shellcheck disable=SC2086
    "$KVSIM" generate --model "$MODELS/$m" --text examples/heldout_story.txt --prompt-tokens 32 \
        --db "$OUT/results.db" $POLICIES --budgets "$BUDGETS" > "$OUT/generate_text_$name.txt" || true
done
"$KVSIM" calibrate "$OUT/results.db" --plot "$OUT/calibrate.png" | tee "$OUT/calibrate.txt"
