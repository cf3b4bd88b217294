#!/bin/sh
# drift.sh — the attention-drift study (SyncKV §3.1-3.2, Fig. 2a/2b; POLICY_SPEC §5.4 S1-S3): `kvsim drift` and
# its two plots on each trace, one command per trace. The numbers of examples/FINDINGS.md "SyncKV" come from here.
#
#   sh examples/drift.sh            the bundled examples/stories260K.kvt, and tinystories-656K captured with
#                                   examples/prompt.txt and 256 steps when MODEL_DIR (default ../shared/models)
#                                   holds it (said on stderr when it does not)
#
# Outputs go to $OUT (default examples/out/drift): drift.db (both traces' runs), per trace the summary table
# (<trace>.txt) and the plots <trace>-curve.png (window prefill score, k 64 when it fits) and
# <trace>-locality.png. $KVSIM_BIN names the kvsim binary.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
KVSIM_BIN=${KVSIM_BIN:-$root/kvsim}
models=${MODEL_DIR:-$root/../shared/models}
out=${OUT:-$here/out/drift}
[ -x "$KVSIM_BIN" ] || { echo "drift.sh: $KVSIM_BIN not found: run 'make' first" >&2; exit 1; }
mkdir -p "$out"
rm -f "$out/drift.db" "$out/drift.db-wal" "$out/drift.db-shm"

study() { # TRACE NAME: the analysis with the default sweep (both prefill scores, delta up to 16), then the plots
    "$KVSIM_BIN" drift "$1" --db "$out/drift.db" > "$out/$2.txt"
    "$KVSIM_BIN" plot "$out/drift.db" --kind drift-curve --trace "$1" --out "$out/$2-curve.png" > /dev/null
    "$KVSIM_BIN" plot "$out/drift.db" --kind drift-locality --trace "$1" --out "$out/$2-locality.png" > /dev/null
    echo "== $2"
    cat "$out/$2.txt"
}

study "$here/stories260K.kvt" stories260K
if [ -d "$models/tinystories-656K" ]; then
    "$KVSIM_BIN" capture --model "$models/tinystories-656K" --prompt-file "$here/prompt.txt" --steps 256 \
        --ignore-eos --quiet --out "$out/tinystories-656K.kvt" > "$out/capture.log"
    study "$out/tinystories-656K.kvt" tinystories-656K
else
    echo "drift.sh: $models/tinystories-656K not found: only the bundled stories260K trace is studied" >&2
fi
echo "outputs in $out"
