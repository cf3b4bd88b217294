#!/bin/sh
# Runs each benchmark binary given as an argument (make bench passes build/bench/bench_*), one after
# another so they do not compete for the cores, printing a banner per binary. Benchmarks print their own
# numbers; nothing is asserted. Exit status is non-zero if any benchmark failed.
# Environment: KVSIM_BIN, KVSIM_ROOT (set by make), KVSIM_BENCH_TRACE (optional real trace for bench_trace).
# When a python3 with torch and numpy is found, bench_speed also writes its side-by-side data to a temporary
# folder (KVSIM_BENCH_NPY_DIR) and bench/torch_replay.py runs the PyTorch replay on it afterwards.
status=0
torch_py=""
for py in python3 /usr/bin/python3; do
    if "$py" -c 'import torch, numpy' >/dev/null 2>&1; then torch_py=$py; break; fi
done
if [ -n "$torch_py" ]; then
    KVSIM_BENCH_NPY_DIR=$(mktemp -d /tmp/kvsim_bench_XXXXXX) || exit 1
    export KVSIM_BENCH_NPY_DIR
    trap 'rm -rf "$KVSIM_BENCH_NPY_DIR"' EXIT
fi
for bin in "$@"; do
    echo "== $(basename "$bin")"
    if ! "$bin"; then
        echo "== $(basename "$bin") FAILED (exit $?)"
        status=1
    fi
done
if [ -z "$torch_py" ]; then
    echo "== torch_replay.py: skipped (no python3 with torch and numpy)"
elif [ -f "$KVSIM_BENCH_NPY_DIR/kvsim.csv" ]; then
    echo "== torch_replay.py"
    "$torch_py" "$(dirname "$0")/torch_replay.py" "$KVSIM_BENCH_NPY_DIR" || status=1
fi
exit $status
