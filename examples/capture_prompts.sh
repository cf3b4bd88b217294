#!/bin/sh
# capture_prompts.sh — one trace per prompt of examples/prompts/ (and examples/prompt.txt, the bundled trace's
# prompt) from one model: the several samples a study needs (one prompt is one sample; the studies aggregate over
# traces with bootstrap intervals).
#
#   sh examples/capture_prompts.sh MODEL OUT_DIR [STEPS]
#
# MODEL is a llama2.c .bin or a Hugging Face folder (../shared/models/stories260K.bin, ../shared/models/
# tinystories-656K); each trace is OUT_DIR/<prompt name>.kvt, greedy, STEPS generated tokens (default 128; fewer
# when the prompt leaves less room in the model's context), --ignore-eos so every trace has its decode steps.
# The prompts: four short stories and two texts unlike TinyStories (a list of facts to recall, an expository text)
# where the models still continue sensibly. $KVSIM_BIN names the kvsim binary.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
KVSIM_BIN=${KVSIM_BIN:-$root/kvsim}
[ $# -ge 2 ] || { echo "usage: sh examples/capture_prompts.sh MODEL OUT_DIR [STEPS]" >&2; exit 2; }
model=$1 out=$2 steps=${3:-128}
[ -x "$KVSIM_BIN" ] || { echo "capture_prompts.sh: $KVSIM_BIN not found: run 'make' first" >&2; exit 1; }
[ -e "$model" ] || { echo "capture_prompts.sh: model $model not found" >&2; exit 1; }
mkdir -p "$out"
for p in "$here/prompt.txt" "$here"/prompts/*.txt; do
    name=$(basename "$p" .txt)
    [ "$name" = prompt ] && name=story_lily
    "$KVSIM_BIN" capture --model "$model" --prompt-file "$p" --steps "$steps" --ignore-eos --quiet \
        --out "$out/$name.kvt" > /dev/null
    echo "$out/$name.kvt"
done
