#!/bin/sh
# findings.sh — regenerates every number of examples/FINDINGS.md (the seed methods against their papers' claims,
# POLICY_SPEC §5) from real decoding of the two real models:
#
#   sh examples/findings.sh [--check | --update] [--only SECTION[,SECTION...]] [MODEL_DIR]
#
# --check regenerates the generated blocks of examples/FINDINGS.md (examples/findings_lib.sh) and fails on any
# difference (CI runs it); --update writes them into the file. --only runs the named sections of examples/findings/
# (intro, morphkv, keydiff, d2o, rocketkv, drift, heads, synckv, codecs, paging, task, calibration, newer_layer,
# newer_ea, newer_chunk) and checks or updates
# their blocks alone.
#
# Traces: seven prompts per model (examples/capture_prompts.sh: examples/prompt.txt and examples/prompts/, 128
# generated tokens each) for the multi-prompt blocks; the bundled examples/stories260K.kvt and a fresh 256-step
# capture of tinystories-656K with examples/prompt.txt for the single-trace tables of summary.txt. MODEL_DIR
# (default ../shared/models) holds the models; without them only the bundled trace is studied. Outputs go to $OUT
# (default examples/out/findings): one folder per trace with the databases and the text of every table,
# summary.txt, and blocks/ (the generated text of each block). $KVSIM_BIN names the kvsim binary.
# About two minutes on a 2-core machine.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
KVSIM_BIN=${KVSIM_BIN:-$root/kvsim}
mode=run
only=""
while [ $# -gt 0 ]; do
    case $1 in
        --check) mode=check; shift ;;
        --update) mode=update; shift ;;
        --only) [ $# -ge 2 ] || { echo "findings.sh: --only needs a list of sections" >&2; exit 2; }; only=$(echo "$2" | tr ',' ' '); shift 2 ;;
        --*) echo "findings.sh: unknown option $1" >&2; exit 2 ;;
        *) break ;;
    esac
done
models=${1:-$root/../shared/models}
out=${OUT:-$here/out/findings}
[ -x "$KVSIM_BIN" ] || { echo "findings.sh: $KVSIM_BIN not found: run 'make' first" >&2; exit 1; }
. "$here/findings_lib.sh"

# The sections in the order they run, and the names of the blocks each writes (a block NAME belongs to prefix P when
# NAME is P or starts with "P-": findings_blocks)
all_sections="intro morphkv keydiff d2o rocketkv drift heads synckv codecs paging task calibration newer_layer newer_ea newer_chunk"
section_blocks() {
    case $1 in
        intro) echo traces ;; morphkv) echo M ;; keydiff) echo K ;; d2o) echo D ;; rocketkv) echo R ;; drift) echo S1 S2 S3 ;;
        heads) echo S4 S12 ;; synckv) echo SyncKV ;; codecs) echo Q ;; paging) echo P ;; task) echo T ;; calibration) echo closed_loop ;;
        newer_layer) echo N-L ;;
        newer_ea) echo N-EA ;;
        newer_chunk) echo N-C ;;
        *) return 1 ;;
    esac
}
sections=${only:-$all_sections}
prefixes=""
for s in $sections; do
    p=$(section_blocks "$s") || { echo "findings.sh: unknown section $s (sections: $all_sections)" >&2; exit 2; }
    [ -f "$here/findings/$s.sh" ] || { echo "findings.sh: examples/findings/$s.sh not found" >&2; exit 1; }
    prefixes="$prefixes $p"
done
[ -n "$only" ] || prefixes=""

rm -rf "$out"
mkdir -p "$out"
blocks="$out/blocks"
mkdir -p "$blocks"
summary="$out/summary.txt"
: > "$summary"
say() { printf '%s\n' "$*" | tee -a "$summary"; }

traces="$here/stories260K.kvt"
if [ -d "$models/tinystories-656K" ]; then
    "$KVSIM_BIN" capture --model "$models/tinystories-656K" --prompt-file "$here/prompt.txt" --steps 256 \
        --ignore-eos --quiet --out "$out/tinystories-656K.kvt" > "$out/capture.log"
    traces="$traces $out/tinystories-656K.kvt"
else
    echo "findings.sh: $models/tinystories-656K not found: only the bundled stories260K trace is studied" >&2
fi

# trace_facts TRACE: name, dir (its output folder), G, d, P (prompt) and N (positions) of a trace (a prompt trace
# $out/prompts/MODEL/NAME.kvt is named MODEL_NAME: the two models' prompt traces share their file names)
trace_facts() {
    name=$(basename "$1" .kvt)
    case $1 in "$out/prompts/"*) name="$(basename "$(dirname "$1")")_$name" ;; esac
    dir="$out/$name"
    mkdir -p "$dir"
    "$KVSIM_BIN" info "$1" > "$dir/info.txt"
    G=$(awk '/kv heads/ { for (i = 1; i <= NF; i++) if ($i == "(group") { v = $(i+1); gsub(/[^0-9]/, "", v); print v } }' "$dir/info.txt")
    d=$(awk '/head_dim/ { for (i = 1; i <= NF; i++) if ($i == "head_dim") { v = $(i+1); gsub(/[^0-9]/, "", v); print v } }' "$dir/info.txt")
    P=$(awk '/^positions/ { sub(/\(/, "", $3); print $3 }' "$dir/info.txt")
    N=$(awk '/^positions/ { print $2 }' "$dir/info.txt")
}
for trace in $traces; do
    trace_facts "$trace"
    say "=== $name: $N positions, prompt $P, group G=$G, head_dim d=$d"
done

# One column ($5) of `kvsim runs DB --csv --summary` (run-wide aggregates) for policy $2 at budget $4: the run
# whose params hold every comma-separated key=value of $3 ("" = any; the full canonical string = that run).
field_like() {
    "$KVSIM_BIN" runs "$1" --csv --summary --policy "$2" --budget "$4" | awk -F, -v want="$3" -v col="$5" '
        NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
        { line = $0; nf = 0; f = ""; inq = 0
          for (i = 1; i <= length(line); i++) { ch = substr(line, i, 1)
              if (ch == "\"") { inq = !inq; continue }
              if (ch == "," && !inq) { v[++nf] = f; f = ""; continue }
              f = f ch }
          v[++nf] = f
          n = split(want, w, ","); ok = 1
          for (i = 1; i <= n; i++) if (index("," v[c["params"]] ",", "," w[i] ",") == 0) ok = 0
          if (ok) { print v[c[col]]; exit } }'
}
# The budgets of a policy's runs in a database, ascending.
budgets_of() { "$KVSIM_BIN" runs "$1" --csv --summary --policy "$2" | awk -F, 'NR > 1 { print $0 }' |
    sed 's/"[^"]*"//g' | awk -F, '{ print $3 }' | sort -n | uniq; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b == 0 || b == "") print "-"; else printf "%.3f", a / b }'; }

# ---- Several prompts per model: one prompt is one sample --------------------------------------------------
# Each model decodes the seven prompts of examples/capture_prompts.sh (128 generated tokens each); a finding is the
# mean over the traces with its percentile bootstrap 95% interval resampling traces (kvsim compare across traces),
# and a difference between two policies the paired one over the same traces.
study_models=""
for m in "$models/stories260K.bin" "$models/tinystories-656K"; do
    [ -e "$m" ] || continue
    mname=$(basename "$m" .bin)
    KVSIM_BIN="$KVSIM_BIN" sh "$here/capture_prompts.sh" "$m" "$out/prompts/$mname" > "$out/prompts_$mname.txt"
    study_models="$study_models $mname"
done

# fmt_iv MEAN LO HI N: "0.123 [0.120, 0.126]" (3 significant figures; "-" when there is no value)
# fmt_iv MEAN LO HI N TOTAL: "0.123 [0.120, 0.126]" (3 significant figures), "(n = N of TOTAL)" when some traces
# have no value there, "-" when none has
fmt_iv() { awk -v m="$1" -v l="$2" -v h="$3" -v n="$4" -v t="$5" 'BEGIN { if (m == "" || n == 0) { print "-"; exit }
    if (n < 2) printf "%.3g (n = 1 of %d)\n", m, t; else if (n < t) printf "%.3g [%.3g, %.3g] (n = %d of %d)\n", m, l, h, n, t
    else printf "%.3g [%.3g, %.3g]\n", m, l, h }'; }

# iv_of LABEL [--paired]: "mean [lo, hi]" of the numbers (pairs) on standard input, over the traces (kvsim interval)
iv_of() {
    label=$1
    shift
    "$KVSIM_BIN" interval --label "$label" "$@" | awk -F'\t' '{ if ($4 < 2) printf "%.3g (n = %d)", $1, $4
        else printf "%.3g [%.3g, %.3g]", $1, $2, $3; if (NF >= 5) printf "%s", ($5 != 0 ? ", resolved" : ", not resolved")
        printf "\n" }'
}
# n_traces_of MODEL: how many prompt traces the model has
n_traces_of() { ls "$out/prompts/$1"/*.kvt | wc -l; }

# err_tables_at DB X PREFIX: each configuration's out_err_mean over the traces at X resident bytes per KV head
# (kvsim compare --match mem --across-traces) into PREFIX.tsv, and the paired differences into PREFIX_pairs.tsv
err_tables_at() {
    "$KVSIM_BIN" compare "$1" --match mem --at "$2" --across-traces --csv --metric out_err_mean | csv_to_tsv > "$3.tsv"
    "$KVSIM_BIN" compare "$1" --match mem --at "$2" --across-traces --pairs --csv --metric out_err_mean |
        csv_to_tsv > "$3_pairs.tsv"
}

# err_cell TSV TOTAL POLICY [COLUMN TEXT]: fmt_iv of the first row of an err_tables_at table whose policy is POLICY
# (and whose COLUMN contains TEXT, e.g. params gqa=mean; an empty TEXT matches an empty COLUMN only, e.g. codec ""
# for K/V as captured), over TOTAL traces; "-" when no trace has a value there
err_cell() {
    v=$(awk -F'\t' -v p="$3" -v col="${4-}" -v txt="${5-}" 'NR == 1 { for (i = 1; i <= NF; i++) k[$i] = i; next }
        $k["policy"] == p && (col == "" || (txt == "" ? $k[col] == "" : index($k[col], txt) > 0)) {
            print $k["out_err_mean"] "\t" $k["out_err_mean_lo"] "\t" $k["out_err_mean_hi"] "\t" $k["out_err_mean_n"]; exit }' \
        "$1")
    fmt_iv "$(echo "$v" | cut -f1)" "$(echo "$v" | cut -f2)" "$(echo "$v" | cut -f3)" "$(echo "$v" | cut -f4)" "$2"
}


for s in $sections; do
    . "$here/findings/$s.sh"
done

if [ "$mode" != run ]; then
    findings_blocks "$mode" "$here/FINDINGS.md" "$blocks" "$prefixes" || exit 1
    echo "findings.sh: examples/FINDINGS.md's generated blocks${only:+ of $only} $( [ "$mode" = check ] && echo "match what kvsim measures now" || echo "updated")"
fi
echo "findings.sh: results in $out (summary.txt and one folder per trace)"
