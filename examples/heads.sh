#!/bin/sh
# heads.sh — the head-similarity and clustering study of `kvsim heads` (SyncKV §3.3, §4.1, App. B.1; POLICY_SPEC
# §5.4 S4 and S12), the numbers of examples/FINDINGS.md's SyncKV entries:
#
#   sh examples/heads.sh                      the bundled trace examples/stories260K.kvt
#   sh examples/heads.sh tinystories-656K     a fresh capture of ../shared/models/tinystories-656K (MODEL_DIR)
#
# Per trace: S4 (layer-to-layer similarity of query heads and units, k_c = 64), the clustering SyncKV replays
# with (2 clusters per layer, and the number chosen by silhouette) written to the database and as a clusters file,
# and S12 (the adjusted Rand index of the clusterings of the two halves of the decode steps, and of two traces of
# the same model with different text: the bundled multi-turn trace for stories260K, a second capture with
# examples/turns.txt as the prompt for tinystories-656K), then the plots. Outputs in $OUT (default
# examples/out/heads/NAME): heads.db, clusters.txt, report_*.txt, the PNGs. $KVSIM_BIN names the kvsim binary.
# A few seconds per trace.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
KVSIM_BIN=${KVSIM_BIN:-$root/kvsim}
models=${MODEL_DIR:-$root/../shared/models}
which=${1:-stories260K}
[ -x "$KVSIM_BIN" ] || { echo "heads.sh: $KVSIM_BIN not found: run 'make' first" >&2; exit 1; }
out=${OUT:-$here/out/heads/$which}
rm -rf "$out"
mkdir -p "$out"
case "$which" in
stories260K)
    trace="$here/stories260K.kvt"
    other="$here/stories260K_multiturn.kvt"
    ;;
tinystories-656K)
    if [ ! -d "$models/tinystories-656K" ]; then
        echo "heads.sh: $models/tinystories-656K not found: the tinystories-656K study needs the model folder" \
             "(MODEL_DIR); the bundled trace's study is 'sh examples/heads.sh'" >&2
        exit 1
    fi
    trace="$out/tinystories-656K.kvt"
    other="$out/tinystories-656K_turns.kvt"
    "$KVSIM_BIN" capture --model "$models/tinystories-656K" --prompt-file "$here/prompt.txt" --steps 256 \
        --ignore-eos --quiet --out "$trace" > "$out/capture.log"
    "$KVSIM_BIN" capture --model "$models/tinystories-656K" --prompt-file "$here/turns.txt" --steps 256 \
        --ignore-eos --quiet --out "$other" >> "$out/capture.log"
    ;;
*)
    echo "heads.sh: unknown study '$which' (stories260K or tinystories-656K)" >&2
    exit 2
    ;;
esac
db="$out/heads.db"
echo "== $which: S4 and the clustering (2 clusters per layer), S12 across the two halves of the decode steps"
"$KVSIM_BIN" heads "$trace" --db "$db" --stability halves --clusters-out "$out/clusters.txt" | tee "$out/report_halves.txt"
echo "== $which: the number of clusters chosen by silhouette, S12 across the two halves"
"$KVSIM_BIN" heads "$trace" --db "$db" --clusters auto --stability halves | tee "$out/report_auto.txt"
echo "== $which: S12 across two traces of the same model ($(basename "$other"))"
"$KVSIM_BIN" heads "$trace" --db "$db" --stability "$other" | tee "$out/report_traces.txt"
"$KVSIM_BIN" plot "$db" --kind head-similarity --out "$out/head_similarity_units.png"
"$KVSIM_BIN" plot "$db" --kind head-similarity --metric query_sim --out "$out/head_similarity_query.png"
"$KVSIM_BIN" plot "$db" --kind layer-similarity --out "$out/layer_similarity.png"
echo "outputs in $out"
