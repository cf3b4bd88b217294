#!/bin/sh
# run.sh BUILD SECONDS HARNESS... — runs each libFuzzer harness for SECONDS seconds (`make fuzz`), or until
# $FUZZ_RUNS executions when that is set and comes first (the long run: `make fuzz FUZZ_RUNS=1000000`): its working
# corpus BUILD/corpus/NAME starts from the seeds fuzz/corpus/NAME (never written: the repository's corpus holds
# seeds and reproducers only), with fuzz/dict/NAME.dict when present. Prints one line per harness (executions, exec/s,
# coverage cov / features ft from libFuzzer's last status line, peak RSS) and writes the table to
# BUILD/fuzz-summary.txt; a crash, sanitizer report, leak, timeout or out-of-memory is saved as
# BUILD/crashes/NAME-* and makes the exit status 1.
# FUZZ_JOBS=n runs up to n harnesses at once (fuzz.mk passes the core count), each a single libFuzzer process on
# its own core for its SECONDS, so a harness fuzzes as long as it would alone; the table keeps the harnesses' order.
set -u
# the harnesses write each input as a file (and recovery fsyncs its output): on tmpfs that costs no disk I/O
[ -z "${TMPDIR:-}" ] && [ -d /dev/shm ] && [ -w /dev/shm ] && export TMPDIR=/dev/shm

# run.sh --one BUILD SECONDS HARNESS: one harness; its table line goes to BUILD/logs/NAME.line
if [ "${1:-}" = --one ]; then
    build=$2; secs=$3; bin=$4
    name=${bin##*/}; name=${name#fuzz_}
    work="$build/corpus/$name"; mkdir -p "$work"
    set -- -max_total_time="$secs" -print_final_stats=1 -timeout=20 -rss_limit_mb=2560 \
        -artifact_prefix="$build/crashes/$name-"
    [ -n "${FUZZ_RUNS:-}" ] && set -- "$@" -runs="$FUZZ_RUNS"
    [ -f "fuzz/dict/$name.dict" ] && set -- "$@" -dict="fuzz/dict/$name.dict"
    # the trace reader may legitimately allocate up to 32768x the input per buffer (trace/FORMAT.md): inputs
    # beyond 32 KiB would let a valid but extreme zstd frame reach the RSS limit
    [ "$name" = trace ] && set -- "$@" -max_len=32768
    log="$build/logs/$name.log"
    "$bin" "$@" "$work" "fuzz/corpus/$name" >"$log" 2>&1
    rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    eps=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    rss=$(sed -n 's/^stat::peak_rss_mb: *//p' "$log" | tail -1)
    last=$(grep -E '^#[0-9]+' "$log" | tail -1)
    cov=$(printf '%s' "$last" | sed -n 's/.* cov: \([0-9]*\).*/\1/p')
    ft=$(printf '%s' "$last" | sed -n 's/.* ft: \([0-9]*\).*/\1/p')
    if [ "$rc" -eq 0 ]; then result=ok; else result="FAILED (rc $rc, see $log)"; fi
    printf '%-24s %12s %8s %8s %8s %8s  %s\n' "$name" "${execs:-?}" "${eps:-?}" "${cov:-?}" "${ft:-?}" "${rss:-?}" \
        "$result" >"$build/logs/$name.line"
    exit 0
fi

build=$1; secs=$2; shift 2
jobs=${FUZZ_JOBS:-1}
case $jobs in '' | *[!0-9]* | 0) echo "fuzz/run.sh: FUZZ_JOBS must be a positive integer, not '$jobs'" >&2; exit 2 ;; esac
mkdir -p "$build/crashes" "$build/logs"
for bin in "$@"; do name=${bin##*/}; rm -f "$build/logs/${name#fuzz_}.line"; done
summary="$build/fuzz-summary.txt"
printf '%-24s %12s %8s %8s %8s %8s  %s\n' harness executions exec_s cov ft rss_mb result | tee "$summary"
[ $# -gt 0 ] && printf '%s\n' "$@" | xargs -P "$jobs" -n 1 sh "$0" --one "$build" "$secs"
status=0
for bin in "$@"; do
    name=${bin##*/}; name=${name#fuzz_}
    line="$build/logs/$name.line"; log="$build/logs/$name.log"
    if [ ! -f "$line" ]; then # the harness did not run to its line (the runner was killed)
        printf '%-24s %12s %8s %8s %8s %8s  %s\n' "$name" ? ? ? ? ? "FAILED (no result, see $log)" >"$line"
    fi
    tee -a "$summary" <"$line"
    if ! grep -q ' ok$' "$line"; then
        status=1
        grep -E 'ERROR|SUMMARY|Test unit written' "$log" 2>/dev/null | head -5
    fi
done
exit $status
