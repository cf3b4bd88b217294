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
# compare_mem.txt, compare_mem_low.txt, compare_traffic.txt, error_vs_memory.png, error_vs_traffic.png, error_vs_budget.png,
# recall_vs_budget.png, memory_vs_budget.png, error_vs_position.png (on the bundled trace error_vs_memory.png is
# also the README's picture, examples/main_job.png), and last the study report
# report/report.html (one self-contained page: every table and plot above) with report/report.md.
# $KVSIM_BIN names the kvsim binary (default: the one built in this checkout), as in examples/capture.sh.
#
# The sweep is read at EQUAL MEASURED MEMORY first: a nominal budget B means different things to different
# policies (SnapKV, PyramidKV and Ada-KV bound only the prompt and keep every generated token, so at "B = 8"
# they hold 17x more than a window of 8). `kvsim compare --match mem` and the error-vs-memory plot put every
# policy at the same resident bytes; the budget plots come after, for reference.
#
# Beside the eviction policies, one KV codec: the window with 4-bit K/V (`--codec int:bits=4`, sim/codec.h), the
# other way to spend fewer bytes: keep more tokens, each quantized. Its runs are a series of their own
# ("window [int:bits=4,...]", thin, in window's colour) on the plots and in the report, and it joins the Pareto
# frontier; compare_mem_low.txt puts it against the policies at 1 KiB per KV head, where 4-bit K/V is within reach.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
KVSIM_BIN=${KVSIM_BIN:-$root/kvsim}
out=${OUT:-$here/out}
[ -x "$KVSIM_BIN" ] || { echo "main_job: $KVSIM_BIN not found: run 'make' first" >&2; exit 1; }
mkdir -p "$out"

if [ $# -ge 1 ]; then
    trace="$out/trace.kvt"
    "$KVSIM_BIN" capture --model "$1" --prompt-file "${2:-$here/prompt.txt}" --steps 256 --ignore-eos --out "$trace"
else
    trace="$here/stories260K.kvt"
fi
"$KVSIM_BIN" info "$trace"
"$KVSIM_BIN" verify "$trace"

# A fresh study each time, so the pictures show exactly this sweep. Budgets up to 384 tokens, so that the
# every-step policies reach the memory the prompt-only ones need for their generated tokens; the budgets follow
# the trace: those above its length are left out and its length (the full cache) takes their place.
n_positions=$("$KVSIM_BIN" info "$trace" | awk '$1 == "positions" { print $2; exit }')
case $n_positions in '' | *[!0-9]*) echo "main_job: cannot read the trace's length from kvsim info" >&2; exit 1 ;; esac
budgets=""
for b in 8 16 32 64 128 256 384; do
    if [ "$b" -le "$n_positions" ]; then budgets="$budgets${budgets:+,}$b"; else budgets="$budgets${budgets:+,}$n_positions"; break; fi
done
echo "== budgets $budgets (the trace has $n_positions positions)"
rm -f "$out/results.db" "$out/results.db-wal" "$out/results.db-shm"
"$KVSIM_BIN" replay "$trace" --db "$out/results.db" \
    --policy full --policy window --policy streaming --policy h2o --policy tova \
    --policy scissorhands --policy snapkv --policy pyramidkv --policy adakv --policy topk \
    --budgets "$budgets" --series-every 1
# the codec: one more pass of the trace, its runs in the same study (each (policy, codec, budget) is one run)
"$KVSIM_BIN" replay "$trace" --db "$out/results.db" --policy window --codec int:bits=4 \
    --budgets "$budgets" --series-every 1

# Equal memory and equal traffic: every policy interpolated to the same resident bytes (and bytes read per
# step) per KV head; the plots mark the Pareto frontier.
echo "== policies at equal resident memory (9 KiB per KV head)"
"$KVSIM_BIN" compare "$out/results.db" --match mem --at 9KiB > "$out/compare_mem.txt"
cat "$out/compare_mem.txt"
echo "== policies and window with 4-bit K/V at equal resident memory (1 KiB per KV head)"
"$KVSIM_BIN" compare "$out/results.db" --match mem --at 1KiB > "$out/compare_mem_low.txt"
cat "$out/compare_mem_low.txt"
echo "== policies at equal traffic (9 KiB read per step per KV head)"
"$KVSIM_BIN" compare "$out/results.db" --match traffic --at 9KiB > "$out/compare_traffic.txt"
cat "$out/compare_traffic.txt"
"$KVSIM_BIN" plot "$out/results.db" --kind error-vs-memory --out "$out/error_vs_memory.png"
"$KVSIM_BIN" plot "$out/results.db" --kind error-vs-traffic --out "$out/error_vs_traffic.png"
# The README's picture is this plot of the bundled trace: a run on it refreshes examples/main_job.png
# (README_PICTURE names another file; empty: none).
if [ $# -eq 0 ]; then
    picture=${README_PICTURE-$here/main_job.png}
    if [ -n "$picture" ]; then cp "$out/error_vs_memory.png" "$picture.tmp" && mv "$picture.tmp" "$picture"; fi
fi

# The runs themselves, and the views by nominal budget.
"$KVSIM_BIN" runs "$out/results.db"
"$KVSIM_BIN" runs "$out/results.db" --csv > "$out/runs.csv"
"$KVSIM_BIN" plot "$out/results.db" --kind error-vs-budget --out "$out/error_vs_budget.png"
"$KVSIM_BIN" plot "$out/results.db" --kind error-vs-budget --metric attn_recall_mean --out "$out/recall_vs_budget.png"
"$KVSIM_BIN" plot "$out/results.db" --kind memory-vs-budget --out "$out/memory_vs_budget.png"
"$KVSIM_BIN" plot "$out/results.db" --kind error-vs-position --budget 32 --out "$out/error_vs_position.png"
# The study report: the summary by memory level, the trace, every run, both comparisons and every plot on one
# self-contained page (and in Markdown), read from the database alone.
"$KVSIM_BIN" report "$out/results.db" --out "$out/report" --mem-at 9KiB --traffic-at 9KiB
echo "main_job: results in $out (results.db, runs.csv, compare_*.txt, *.png); the report: $out/report/report.html"
