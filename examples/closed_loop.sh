#!/bin/sh
# closed_loop.sh — the closed-loop calibration study (../shared/DESIGN.md "Closed-loop decoding"): does offline
# replay rank policies as decoding with the compressed cache does? Every registered non-oracle policy on several
# prompts of stories260K and tinystories-656K:
#  1. examples/capture_prompts.sh captures one trace per prompt (examples/prompt.txt, examples/prompts/*.txt),
#     greedy, STEPS generated tokens; the study uses the first NPROMPTS of them per model (one prompt is one sample);
#  2. per trace, the budgets of BUDGETS that leave the prompt at least 2x compressed (budget <= prompt / 2: a larger
#     one would let prompt-only policies keep the whole prompt), the same list on every trace where they fit, so the
#     within-budget figures pool several texts;
#  3. per trace, `kvsim replay` (offline, teacher-forced attention error) and `kvsim generate --trace` (closed loop)
#     of every policy at those budgets, the two models side by side (one process each);
#  4. `kvsim calibrate`: per model, Spearman of offline against closed-loop metrics within each budget, at equal
#     measured memory and pooled over budgets, averaged over the traces with an interval over policies x traces,
#     the duplicate configurations collapsed; and the scatter plot.
# With CLOSED_LOOP_TEXT=1, also `kvsim generate --text` on examples/heldout_story.txt per model (perplexity with and
# without each policy on a held-out story: generate_text_<model>.txt; about 10 s more per model).
# Results in examples/out/closed_loop/ ($CLOSED_LOOP_OUT when set): results.db, calibrate.txt, calibrate.png,
# traces/, and the logs replay_<model>.txt (with the budgets each trace got), generate_trace_<model>.txt.
# Usage: sh examples/closed_loop.sh [BUDGETS [NPROMPTS [STEPS]]] (default 8,16,32, 4 prompts, 32 generated
# tokens: about a minute on two cores); KVSIM_BIN names the kvsim binary.
set -eu
cd "$(dirname "$0")/.."
KVSIM=${KVSIM_BIN:-./kvsim}
case $KVSIM in /*) ;; *) KVSIM=$(pwd)/$KVSIM ;; esac
BUDGETS=${1:-8,16,32}
NPROMPTS=${2:-4}
STEPS=${3:-32}
OUT=${CLOSED_LOOP_OUT:-examples/out/closed_loop}
MODELS=../shared/models
[ -x "$KVSIM" ] || { echo "closed_loop.sh: $KVSIM not found: run 'make' first" >&2; exit 1; }
mkdir -p "$OUT"
rm -rf "$OUT/traces"
rm -f "$OUT/results.db" "$OUT/results.db-wal" "$OUT/results.db-shm" "$OUT"/replay_*.txt "$OUT"/generate_trace_*.txt
POLICIES=$("$KVSIM" policies --json | grep -o '{"name":"[a-z0-9_]*","summary":"[^"]*","oracle":false' |
           sed 's/{"name":"\([a-z0-9_]*\)".*/--policy \1/' | tr '\n' ' ')

# The budgets of $BUDGETS at most half the prompt of trace $1 (comma-separated; empty when none fits).
budgets_for() {
    plen=$("$KVSIM" info "$1" | sed -n 's/^positions .*(\([0-9]*\) prompt,.*/\1/p') || plen=
    case $plen in
    '' | *[!0-9]*) echo "closed_loop.sh: $1: cannot read its prompt length (kvsim info): skipped" >&2; return 1 ;;
    esac
    echo "$BUDGETS" | tr ',' '\n' | while read -r b; do
        [ $((2 * b)) -le "$plen" ] && echo "$b"
    done | paste -sd, -
}

# One model: capture, then replay and closed loop per trace (sequential: this runs beside the other model).
study() {
    m=$1 name=${1%.bin}
    KVSIM_BIN=$KVSIM sh examples/capture_prompts.sh "$MODELS/$m" "$OUT/traces/$name" "$STEPS" > "$OUT/traces_$name.all"
    head -n "$NPROMPTS" "$OUT/traces_$name.all" > "$OUT/traces_$name.txt"
    : > "$OUT/replay_$name.txt"
    : > "$OUT/generate_trace_$name.txt"
    while read -r t; do
        b=$(budgets_for "$t") || continue
        if [ -z "$b" ]; then
            echo "closed_loop.sh: $t: no budget of $BUDGETS is at most half its prompt: skipped" >&2
            continue
        fi
        echo "$t: budgets $b" >> "$OUT/replay_$name.txt"
        # a policy the trace cannot hold (SyncKV's full caches above the budget) fails here and is recorded as
        # failed: the others stand, so a non-zero exit is not the study's failure
        # shellcheck disable=SC2086
        "$KVSIM" replay "$t" --db "$OUT/results.db" $POLICIES --budgets "$b" --threads 1 \
            >> "$OUT/replay_$name.txt" 2>&1 || true
        # shellcheck disable=SC2086
        "$KVSIM" generate --model "$MODELS/$m" --trace "$t" --db "$OUT/results.db" $POLICIES --budgets "$b" \
            >> "$OUT/generate_trace_$name.txt" 2>&1 || true
    done < "$OUT/traces_$name.txt"
    if [ "${CLOSED_LOOP_TEXT:-0}" = 1 ]; then
        # shellcheck disable=SC2086
        "$KVSIM" generate --model "$MODELS/$m" --text examples/heldout_story.txt --prompt-tokens 32 \
            --db "$OUT/results.db" $POLICIES --budgets "$BUDGETS" > "$OUT/generate_text_$name.txt" 2>&1 || true
    fi
}

study stories260K.bin &
p1=$!
study tinystories-656K &
p2=$!
wait "$p1"
wait "$p2"
"$KVSIM" calibrate "$OUT/results.db" --plot "$OUT/calibrate.png" | tee "$OUT/calibrate.txt"
