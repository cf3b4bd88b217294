#!/bin/sh
# findings.sh — regenerates every number of examples/FINDINGS.md (MorphKV and KeyDiff against their papers'
# claims, POLICY_SPEC §5.1 and §5.5) from real decoding of the two real models:
#
#   sh examples/findings.sh [--check | --update] [MODEL_DIR]
#
# --check regenerates the generated blocks of examples/FINDINGS.md (examples/findings_lib.sh) and fails on any
# difference (CI runs it); --update writes them into the file.
#
# Traces: the bundled examples/stories260K.kvt (captured by kvsim from stories260K.bin with
# examples/prompt.txt), and a fresh capture of tinystories-656K with the same prompt when MODEL_DIR (default
# ../shared/models) holds it; without it only the bundled trace is studied. Outputs go to $OUT (default
# examples/out/findings): one folder per trace with the databases and the text of every table, and
# summary.txt, the claim-by-claim numbers FINDINGS.md quotes. $KVSIM_BIN names the kvsim binary.
# About 20 s on a 2-core machine.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
KVSIM_BIN=${KVSIM_BIN:-$root/kvsim}
mode=run
case ${1:-} in --check) mode=check; shift ;; --update) mode=update; shift ;; --*) echo "findings.sh: unknown option $1" >&2; exit 2 ;; esac
models=${1:-$root/../shared/models}
out=${OUT:-$here/out/findings}
[ -x "$KVSIM_BIN" ] || { echo "findings.sh: $KVSIM_BIN not found: run 'make' first" >&2; exit 1; }
. "$here/findings_lib.sh"
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

for trace in $traces; do
    name=$(basename "$trace" .kvt)
    dir="$out/$name"
    mkdir -p "$dir"
    "$KVSIM_BIN" info "$trace" > "$dir/info.txt"
    G=$(awk '/kv heads/ { for (i = 1; i <= NF; i++) if ($i == "(group") { v = $(i+1); gsub(/[^0-9]/, "", v); print v } }' "$dir/info.txt")
    d=$(awk '/head_dim/ { for (i = 1; i <= NF; i++) if ($i == "head_dim") { v = $(i+1); gsub(/[^0-9]/, "", v); print v } }' "$dir/info.txt")
    P=$(awk '/^positions/ { sub(/\(/, "", $3); print $3 }' "$dir/info.txt")
    N=$(awk '/^positions/ { print $2 }' "$dir/info.txt")
    say ""
    say "=== $name: $N positions, prompt $P, group G=$G, head_dim d=$d"

    # ---- MorphKV -------------------------------------------------------------------------------------
    mdb="$dir/morphkv.db"
    "$KVSIM_BIN" replay "$trace" --db "$mdb" --policy full --policy morphkv@longwriter \
        --policy morphkv@longwriter:fusion=max --policy morphkv@longwriter:profile=qz \
        --policy morphkv@longwriter:paper_ctot=0 \
        --policy h2o@morphkv-longwriter --policy snapkv@morphkv-longwriter --policy window \
        --budgets 33,65,129 > "$dir/morphkv_runs.txt" 2> "$dir/morphkv_warnings.txt"
    mk="recent=30,fusion=sum,fidelity=paper,profile=rows,evict_after=1,paper_ctot=600"
    mkmax="recent=30,fusion=max,fidelity=paper,profile=rows,evict_after=1,paper_ctot=600"
    mkqz="recent=30,fusion=sum,fidelity=paper,profile=qz,evict_after=1,paper_ctot=600"
    h2o="recent=0.5,gqa=expand,prefill=budget,window=30,block=0"
    snap="window=30,kernel=7,pool=max,gqa=expand,block=0"
    say "M2/M9/M13/M16 resident KV bytes per KV head at equal nominal capacity C_tot (mean over decode steps), as ratios:"
    say "  C_tot  morphkv/full  h2o/full  snapkv/full  morphkv/h2o (1/G = $(ratio 1 "$G"))  profiles/KV rows  qz   err: morphkv sum  max  h2o  snapkv  window"
    for B in 33 65 129; do
        full=$(field_like "$mdb" full "" "$B" storage_kv_bytes_mean)
        mkv=$(field_like "$mdb" morphkv "$mk" "$B" storage_kv_bytes_mean)
        maux=$(field_like "$mdb" morphkv "$mk" "$B" storage_aux_bytes_mean)
        qaux=$(field_like "$mdb" morphkv "$mkqz" "$B" storage_aux_bytes_mean)
        hkv=$(field_like "$mdb" h2o "$h2o" "$B" storage_kv_bytes_mean)
        skv=$(field_like "$mdb" snapkv "$snap" "$B" storage_kv_bytes_mean)
        e1=$(field_like "$mdb" morphkv "$mk" "$B" out_err_mean)
        e2=$(field_like "$mdb" morphkv "$mkmax" "$B" out_err_mean)
        e3=$(field_like "$mdb" h2o "$h2o" "$B" out_err_mean)
        e4=$(field_like "$mdb" snapkv "$snap" "$B" out_err_mean)
        e5=$(field_like "$mdb" window "" "$B" out_err_mean)
        say "$(printf '  %5d  %12s  %8s  %11s  %26s  %16s  %5s   %16.4f  %6.4f  %6.4f  %6.4f  %6.4f' $((B - 1)) \
            "$(ratio "$mkv" "$full")" "$(ratio "$hkv" "$full")" "$(ratio "$skv" "$full")" "$(ratio "$mkv" "$hkv")" \
            "$(ratio "$maux" "$mkv")" "$(ratio "$qaux" "$mkv")" "$e1" "$e2" "$e3" "$e4" "$e5")"
    done
    mk30="recent=30,fusion=sum,fidelity=paper,profile=rows,evict_after=1,paper_ctot=0"
    kv30=$(field_like "$mdb" morphkv "$mk30" 129 storage_kv_bytes_mean)
    aux30=$(field_like "$mdb" morphkv "$mk30" 129 storage_aux_bytes_mean)
    say "G7 profile store at the paper's R=30 (not scaled), C_tot=128: aux/KV measured $(ratio "$aux30" "$kv30"); G R/(2d) = $(awk -v g="$G" -v d="$d" 'BEGIN { printf "%.4f", g * 30 / (2 * d) }') in one dtype, x 2 for fp32 profiles beside fp16 KV = $(awk -v g="$G" -v d="$d" 'BEGIN { printf "%.4f", g * 30 / d }')"
    X=$(field_like "$mdb" window "" 129 storage_bytes_mean)
    "$KVSIM_BIN" compare "$mdb" --match mem --at "$X" \
        --metric out_err_mean,attended_tokens_mean,storage_kv_bytes_mean,storage_aux_bytes_mean > "$dir/morphkv_equal_memory.txt"
    say "MorphKV at equal resident memory ($X bytes per KV head = window at budget 129; KV + profiles), out_err_mean:"
    awk '/^(morphkv|h2o|snapkv|window|full) / { e = ($6 ~ /^[0-9.]/) ? $5 : "out-of-range"; print "  " $1, e, $NF }' \
        "$dir/morphkv_equal_memory.txt" | tee -a "$summary"

    # ---- KeyDiff -------------------------------------------------------------------------------------
    "$KVSIM_BIN" keys "$trace" --scope prompt > "$dir/keys_prompt.txt"
    "$KVSIM_BIN" keys "$trace" --scope all > "$dir/keys_all.txt"
    say "K3/K12 key geometry (medians over heads; rho < 0 = less similar keys get more attention):"
    for s in prompt all; do
        awk -v s="$s" '/^ +median/ { printf "  %-6s rho_sum %s  rho_perq %s  cos(mean k, mean q) %s  cos(k, mean k) %s  norm_cv %s  distinct %s\n", s, $2, $3, $4, $5, $6, $7 }
             /^heads with rho/ { print "         " $0 }
             /^ +[0-9]+ +[0-9]+ / { n++; if ($5 < 0) neg++ }
             END { printf "         heads with cos(mean k, mean q) < 0: %d of %d\n", neg, n }' "$dir/keys_$s.txt" | tee -a "$summary"
    done
    "$KVSIM_BIN" keys "$trace" --scope prompt --budget 33 --policy keydiff --policy keydiff@paper \
        --policy tova@keydiff --policy streaming@keydiff --policy snapkv@keydiff > "$dir/keys_logdet.txt"
    say "K11 retained-key diversity after the prompt at budget 33 (mean logdet over heads, heads where largest):"
    awk '/^retained key diversity/ { on = 1; next } on && NR > 1 && $1 != "policy" { print "  " $0 }' \
        "$dir/keys_logdet.txt" | tee -a "$summary"

    kdb="$dir/keydiff.db"
    "$KVSIM_BIN" replay "$trace" --db "$kdb" --policy keydiff --policy keydiff@paper --policy knorm \
        --policy tova@keydiff --policy snapkv@keydiff --policy streaming@keydiff --policy window \
        --budgets 17,33,65,129 > "$dir/keydiff_runs.txt" 2> "$dir/keydiff_warnings.txt"
    X=$(field_like "$kdb" window "" 65 storage_bytes_mean)
    "$KVSIM_BIN" compare "$kdb" --match mem --at "$X" > "$dir/keydiff_equal_memory.txt"
    say "KeyDiff at equal resident memory ($X bytes per KV head = window at budget 65), out_err_mean:"
    awk '/^(keydiff|knorm|tova|snapkv|streaming|window) / { e = ($5 ~ /^[0-9.]/) ? $5 : "out-of-range"; print "  " $1, e, $NF }' \
        "$dir/keydiff_equal_memory.txt" | tee -a "$summary"

    # ---- D2O -----------------------------------------------------------------------------------------
    "$KVSIM_BIN" attn "$trace" --k 16 > "$dir/attn.txt"
    say "D2/D3 attention density per layer (variance of the column-summed prompt attention, mean over heads; low = dense):"
    awk '/^ +[0-9]+ / { printf "  layer %s %s\n", $1, $2 }' "$dir/attn.txt" | tee -a "$summary"
    ddb="$dir/d2o.db"
    "$KVSIM_BIN" replay "$trace" --db "$ddb" --policy d2o --policy d2o:merge=none --policy d2o:alloc=uniform \
        --policy d2o:variance=raw --policy h2o --policy streaming --policy window \
        --budgets 20%,40%,80% > "$dir/d2o_runs.txt" 2> "$dir/d2o_warnings.txt"
    say "D9/merging: out_err_mean at budgets 20% / 40% / 80% of the prompt (rho = (B-1)/P):"
    for spec in "d2o|variance=minmax,alloc=paper,skip=none,merge=paper" "d2o|merge=none" "d2o|alloc=uniform" \
        "d2o|variance=raw" "h2o|" "streaming|" "window|"; do
        pol=${spec%%|*}
        want=${spec#*|}
        line=$(printf '  %-52s' "$pol${want:+ ($want)}")
        for B in $(budgets_of "$ddb" "$pol"); do line="$line $(printf '%8.4f' "$(field_like "$ddb" "$pol" "$want" "$B" out_err_mean)")"; done
        say "$line"
    done

    say "Merging's cost at the smallest budget (bytes per KV head per step, mean): kv / aux / aux read unfused / written; recall / merged recall:"
    B=$(budgets_of "$ddb" d2o | head -n 1)
    for want in "merge=paper,tau=head" "merge=none"; do
        line=$(printf '  d2o %-22s' "($want)")
        for col in storage_kv_bytes_mean storage_aux_bytes_mean traffic_aux_unfused_bytes_mean write_bytes_mean \
            attn_recall_mean attn_recall_merged_mean; do
            line="$line $(printf '%9.4g' "$(field_like "$ddb" d2o "variance=minmax,alloc=paper,$want" "$B" "$col")")"
        done
        say "$line"
    done

    # ---- RocketKV, HSA, Quest, SparQ -------------------------------------------------------------------
    # Quest with fill=tokens: exactly its t/2 quota, as the paper's Table 1 counts every method (fill=pages, Quest's
    # own whole pages and kvsim's default, attends fewer when a page does not fit the quota)
    rdb="$dir/rocketkv.db"
    "$KVSIM_BIN" replay "$trace" --db "$rdb" --policy topk --policy rocketkv --policy hsa --policy quest:fill=tokens \
        --policy sparq --policy snapkv --policy h2o --policy tova --policy window \
        --budgets 16,32,64,128,256 > "$dir/rocketkv_runs.txt" 2> "$dir/rocketkv_warnings.txt"
    say "R3 out_err_mean by token budget t = 16 / 32 / 64 / 128 / 256 (Exact-TopK attends t; RocketKV, HSA, Quest, SparQ t/2):"
    for pol in topk rocketkv hsa quest sparq snapkv h2o tova window; do
        line=$(printf '  %-10s' "$pol")
        for B in 16 32 64 128 256; do line="$line $(printf '%9.4f' "$(field_like "$rdb" "$pol" "" "$B" out_err_mean)")"; done
        say "$line"
    done
    X=$(field_like "$rdb" topk "" 64 traffic_bytes_mean)
    "$KVSIM_BIN" compare "$rdb" --match traffic --at "$X" > "$dir/rocketkv_equal_traffic.txt"
    say "R3 at equal traffic ($X bytes read per step per KV head = Exact-TopK at t = 64), out_err_mean:"
    awk '/^(topk|rocketkv|hsa|quest|sparq|snapkv|h2o|tova|window) / { e = ($5 ~ /^[0-9.]/) ? $5 : "out-of-range"; print "  " $1, e }' \
        "$dir/rocketkv_equal_traffic.txt" | tee -a "$summary"
    say "R9 KV pairs read per step / t (traffic_bytes_mean / (2 d kv_bytes) / t; Table 1: 1 for every method):"
    for pol in rocketkv hsa quest sparq topk; do
        line=$(printf '  %-10s' "$pol")
        for B in 64 128 256; do
            tr=$(field_like "$rdb" "$pol" "" "$B" traffic_bytes_mean)
            line="$line $(awk -v tr="$tr" -v d="$d" -v t="$B" 'BEGIN { printf "t=%d %.3f", t, tr / (2 * d * 2) / t }')"
        done
        say "$line"
    done
    say "R4 union of the top-16 positions over the generated steps (median over heads per layer; x k, x sequence length):"
    awk '/^ +[0-9]+ / { printf "  layer %s union %s = %sx k = %s of the sequence\n", $1, $5, $7, $8 }' "$dir/attn.txt" | tee -a "$summary"
done

# ---- RocketKV-MT on the bundled multi-turn trace (R12) ------------------------------------------------
mt="$here/stories260K_multiturn.kvt"
mdir="$out/stories260K_multiturn"
mkdir -p "$mdir"
mtdb="$mdir/rocketkv_mt.db"
"$KVSIM_BIN" replay "$mt" --db "$mtdb" --policy topk --policy rocketkv --policy rocketkv_mt --policy hsa \
    --policy snapkv --policy window --budgets 16,32,64,128 > "$mdir/runs.txt" 2> "$mdir/warnings.txt"
say ""
say "=== stories260K_multiturn: $("$KVSIM_BIN" info "$mt" | awk '/^positions/ { p = $2 } /^turns/ { t = $2 } END { print p " positions, " t " turns" }')"
say "R12 out_err_mean by token budget 16 / 32 / 64 / 128, and host bytes of RocketKV-MT's store (mean):"
for pol in topk rocketkv rocketkv_mt hsa snapkv window; do
    line=$(printf '  %-12s' "$pol")
    for B in 16 32 64 128; do line="$line $(printf '%9.4f' "$(field_like "$mtdb" "$pol" "" "$B" out_err_mean)")"; done
    say "$line"
done
line=$(printf '  %-12s' "mt host B")
for B in 16 32 64 128; do line="$line $(printf '%9.0f' "$(field_like "$mtdb" rocketkv_mt "" "$B" storage_host_bytes_mean)")"; done
say "$line"
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

# ---- D-2 at equal resident memory, over the prompts ---------------------------------------------------------
d2o_specs="--policy d2o --policy d2o:merge=none --policy d2o:alloc=uniform --policy d2o:variance=raw --policy h2o
    --policy streaming --policy window"
block_line D-2 "| model (traces) | configuration | out_err_mean at 2 KiB | at 4 KiB |"
block_line D-2 "|---|---|---|---|"
for mname in $study_models; do
    db="$out/d2o_$mname.db"
    for t in "$out/prompts/$mname"/*.kvt; do
        # shellcheck disable=SC2086
        "$KVSIM_BIN" replay "$t" --db "$db" $d2o_specs --budgets 10%,20%,40%,80% > /dev/null 2>> "$out/d2o_warnings.txt"
    done
    for X in 2KiB 4KiB; do
        "$KVSIM_BIN" compare "$db" --match mem --at "$X" --across-traces --csv > "$out/d2o_${mname}_$X.csv"
        "$KVSIM_BIN" compare "$db" --match mem --at "$X" --across-traces --pairs --csv > "$out/d2o_${mname}_${X}_pairs.csv"
    done
    "$KVSIM_BIN" compare "$db" --match mem --at 4KiB --across-traces --pairs > "$out/d2o_${mname}_4KiB.txt"
    n_traces=$(ls "$out/prompts/$mname"/*.kvt | wc -l)
    d2o_args="sinks=4,heavy=0.75,beta=0.7,variance=minmax,alloc=paper,merge=paper,tau=head,decide=head,skip=none,gqa=expand"
    for entry in "D2O (the paper's defaults)|d2o ($d2o_args)" \
        "D2O without merging (merge=none)|d2o ($(echo "$d2o_args" | sed 's/merge=paper/merge=none/'))" \
        "D2O with uniform layer budgets (alloc=uniform)|d2o ($(echo "$d2o_args" | sed 's/alloc=paper/alloc=uniform/'))" \
        "D2O with Eq. 4's raw variance (variance=raw)|d2o ($(echo "$d2o_args" | sed 's/variance=minmax/variance=raw/'))" \
        "H2O|h2o (recent=0.5,gqa=expand,prefill=all,window=0,block=0)" "StreamingLLM|streaming (sinks=4)" "window|window"; do
        label=${entry#*|}
        row="| $mname ($n_traces) | ${entry%%|*}"
        for X in 2KiB 4KiB; do
            v=$(csv_to_tsv < "$out/d2o_${mname}_$X.csv" | awk -F'\t' -v want="$label" '
                NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
                $c["label"] == want && !done { print $c["out_err_mean"] "\t" $c["out_err_mean_lo"] "\t" $c["out_err_mean_hi"] "\t" $c["out_err_mean_n"]; done = 1 }')
            row="$row | $(fmt_iv "$(echo "$v" | cut -f1)" "$(echo "$v" | cut -f2)" "$(echo "$v" | cut -f3)" "$(echo "$v" | cut -f4)" "$n_traces")"
        done
        block_line D-2 "$row |"
    done
done
block_line D-2 ""
block_line D-2 "Paired differences of out_err_mean over the same traces (D2O at its defaults minus the other; resolved when the"
block_line D-2 "95% interval excludes 0):"
block_line D-2 ""
for mname in $study_models; do
    for X in 2KiB 4KiB; do
        csv_to_tsv < "$out/d2o_${mname}_${X}_pairs.csv" | awk -F'\t' -v m="$mname" -v X="$X" '
            function short(l) { sub(/ \(.*/, "", l); return l }
            NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
            { d2o = "d2o (sinks=4,heavy=0.75,beta=0.7,variance=minmax,alloc=paper,merge=paper,tau=head,decide=head,skip=none,gqa=expand)"
              if ($c["a"] == d2o && $c["b"] !~ /^d2o/) { o = $c["b"]; s = 1 } else if ($c["b"] == d2o && $c["a"] !~ /^d2o/) { o = $c["a"]; s = -1 } else next
              r = $c["r"] != 0 ? "resolved" : "not resolved"
              lo = s > 0 ? $c["diff_lo"] : -$c["diff_hi"]; hi = s > 0 ? $c["diff_hi"] : -$c["diff_lo"]
              printf "- %s at %s: D2O − %s = %+.3g [%+.3g, %+.3g] over %d traces: %s\n", m, X, short(o), s * $c["diff"], lo, hi,
                  $c["n"], r }' >> "$blocks/D-2.md"
    done
done

# iv_of LABEL [--paired]: "mean [lo, hi]" of the numbers (pairs) on standard input, over the traces (kvsim interval)
iv_of() {
    label=$1
    shift
    "$KVSIM_BIN" interval --label "$label" "$@" | awk -F'\t' '{ if ($4 < 2) printf "%.3g (n = %d)", $1, $4
        else printf "%.3g [%.3g, %.3g]", $1, $2, $3; if (NF >= 5) printf "%s", ($5 != 0 ? ", resolved" : ", not resolved")
        printf "\n" }'
}

# ---- S1: drift against chance, over the prompts ----------------------------------------------------------------
block_line S1 "| model (traces) | k | window score | last-query score | chance (random top-k) | last-query − chance (paired) |"
block_line S1 "|---|---:|---|---|---|---|"
for mname in $study_models; do
    n_traces=$(ls "$out/prompts/$mname"/*.kvt | wc -l)
    : > "$out/drift_$mname.csv"
    for t in "$out/prompts/$mname"/*.kvt; do
        "$KVSIM_BIN" drift "$t" --db "$out/drift_$mname.db" --k 16,32,64 --csv | awk -F, '$1 == "head" && $3 == "all" && $4 == 50' \
            >> "$out/drift_$mname.csv"
    done
    for k in 16 32 64; do
        rows=$(awk -F, -v k="$k" '$2 == k' "$out/drift_$mname.csv")
        [ -n "$rows" ] || continue
        w=$(echo "$rows" | cut -d, -f5 | iv_of "S1 $mname k=$k window")
        l=$(echo "$rows" | cut -d, -f6 | iv_of "S1 $mname k=$k last")
        c=$(echo "$rows" | cut -d, -f7 | iv_of "S1 $mname k=$k chance")
        d=$(echo "$rows" | awk -F, '{ print $6, $7 }' | iv_of "S1 $mname k=$k last-chance" --paired)
        block_line S1 "| $mname ($n_traces) | $k | $w | $l | $c | $d |"
    done
done

# ---- S4: intralayer against interlayer head similarity, without the pairs that share a KV head -----------------
block_line S4 "| model (traces) | within a layer, all pairs | within, pairs of different KV heads | pairs sharing a KV head | across layers | within (different KV heads) − across (paired) |"
block_line S4 "|---|---|---|---|---|---|"
for mname in $study_models; do
    n_traces=$(ls "$out/prompts/$mname"/*.kvt | wc -l)
    : > "$out/heads_$mname.csv"
    for t in "$out/prompts/$mname"/*.kvt; do
        "$KVSIM_BIN" heads "$t" --db "$out/heads_$mname.db" --csv | awk -F, '$1 == "query" && ($2 == "within" || $2 == "across")' \
            >> "$out/heads_$mname.csv"
    done
    within=$(awk -F, '$2 == "within"' "$out/heads_$mname.csv")
    across=$(awk -F, '$2 == "across"' "$out/heads_$mname.csv")
    a=$(echo "$within" | cut -d, -f5 | iv_of "S4 $mname within all")
    o=$(echo "$within" | cut -d, -f6 | iv_of "S4 $mname within other kv")
    sk=$(echo "$within" | cut -d, -f7 | iv_of "S4 $mname within same kv")
    x=$(echo "$across" | cut -d, -f5 | iv_of "S4 $mname across")
    d=$(awk -F, '$2 == "within" { w[++i] = $6 } $2 == "across" { x[++j] = $5 }
        END { for (m = 1; m <= i; m++) print w[m], x[m] }' "$out/heads_$mname.csv" |
        iv_of "S4 $mname within-other-kv minus across" --paired)
    block_line S4 "| $mname ($n_traces) | $a | $o | $sk | $x | $d |"
done

# ---- T-1: a task with a right answer (name recall), closed loop -----------------------------------------------
block_line T-1 "| model | policy | budget | correct | accuracy [95% interval] | policy − full [95% interval] |"
block_line T-1 "|---|---|---:|---:|---|---|"
for mname in $study_models; do
    m="$models/$mname"
    [ -e "$m" ] || m="$models/$mname.bin"
    "$KVSIM_BIN" generate --model "$m" --task "$here/tasks/name_recall.txt" --policy window --policy streaming \
        --policy h2o --policy tova --policy snapkv --budgets 32,64 --db "$out/task_$mname.db" > "$out/task_$mname.txt" || true
    awk -v m="$mname" '
        /^\(full cache\)/ { printf "| %s | full cache | - | %s | %s %s %s | - |\n", m, $4, $5, $6, $7; next }
        /^[a-z_0-9]+ +[0-9]+ +[0-9]+\/[0-9]+ / { below = ($NF == "full") ? ", below full" : ""
            printf "| %s | %s | %s | %s | %s %s %s | %s %s %s%s |\n", m, $1, $2, $3, $4, $5, $6, $7, $8, $9, below }' \
        "$out/task_$mname.txt" >> "$blocks/T-1.md"
done

# ---- The closed-loop calibration over the prompts (examples/closed_loop.sh; --check / --update, or
# FINDINGS_CLOSED_LOOP=1; about 30 s on two cores) ------------------------------------------------------------------
if [ "$mode" != run ] || [ "${FINDINGS_CLOSED_LOOP:-0}" = 1 ]; then
    KVSIM_BIN="$KVSIM_BIN" CLOSED_LOOP_OUT="$out/closed_loop" sh "$here/closed_loop.sh" 8,16,32 5 > "$out/closed_loop.log" 2>&1
    block_line closed_loop "| model | offline × closed loop | n | ρ(out_err_mean, mean KL) | ρ(out_err_mean, top-1 agreement) | ρ(out_err_mean, Δ perplexity) |"
    block_line closed_loop "|---|---|---|---|---|---|"
    awk '/^model / { m = $2; sub(/:$/, "", m) }
         /^  budget [0-9]+: / { sec = "within budget " $2; sub(/:$/, "", sec); n = $0; sub(/.*; n = /, "", n); sub(/, [0-9]+ policies$/, "", n) }
         /^pooled over budgets/ { sec = "pooled over budgets (mostly the budget axis)"; n = "all pairs" }
         /^at equal measured memory/ { sec = "" }
         /^    out_err_mean / && sec != "" { printf "| %s | %s | %s | %s %s %s | %s %s %s | %s %s %s |\n", m, sec, n,
             $2, $3, $4, $5, $6, $7, $8, $9, $10; sec = "" }' "$out/closed_loop/calibrate.txt" |
        sort -s -t'|' -k2,2 >> "$blocks/closed_loop.md" # the models in name order, whichever finished first
fi

if [ "$mode" != run ]; then
    findings_blocks "$mode" "$here/FINDINGS.md" "$blocks" "" || exit 1
    echo "findings.sh: examples/FINDINGS.md's generated blocks $( [ "$mode" = check ] && echo "match what kvsim measures now" || echo "updated")"
fi
echo "findings.sh: results in $out (summary.txt and one folder per trace)"
