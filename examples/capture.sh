#!/bin/sh
# capture.sh — captures a trace from each real model with a text prompt (CPU reference backend) and prints
# `kvsim info` for it. Usage: examples/capture.sh [LLAMA2C_BIN] [HF_FOLDER] [OUT_DIR]
# Defaults: ../shared/models/stories260K.bin (+ tok512.bin beside it), ../shared/models/tinystories-656K, /tmp.
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
kvsim=${KVSIM_BIN:-$here/kvsim} # the binary: $KVSIM_BIN, as in examples/main_job.sh
bin=${1:-$here/../shared/models/stories260K.bin}
hf=${2:-$here/../shared/models/tinystories-656K}
out=${3:-/tmp}
[ -x "$kvsim" ] || { echo "capture.sh: $kvsim not built (run make)" >&2; exit 1; }
mkdir -p "$out"
for m in "$bin" "$hf"; do
    [ -e "$m" ] || { echo "capture.sh: model $m not found" >&2; exit 1; }
    name=$(basename "$m" .bin)
    trace="$out/$name.kvt"
    echo "== $name"
    "$kvsim" capture --model "$m" --prompt "Once upon a time, a little fox" --steps 100 --out "$trace"
    "$kvsim" info "$trace"
done
