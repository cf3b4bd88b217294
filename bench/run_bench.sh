#!/bin/sh
# Runs each benchmark binary given as an argument (make bench passes build/bench/bench_*), one after
# another so they do not compete for the cores, printing a banner per binary. Benchmarks print their own
# numbers; nothing is asserted. Exit status is non-zero if any benchmark failed.
# Environment: KVSIM_BIN, KVSIM_ROOT (set by make), KVSIM_BENCH_TRACE (optional real trace for bench_trace).
status=0
for bin in "$@"; do
    echo "== $(basename "$bin")"
    if ! "$bin"; then
        echo "== $(basename "$bin") FAILED (exit $?)"
        status=1
    fi
done
exit $status
