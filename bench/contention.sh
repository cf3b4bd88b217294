#!/bin/sh
# contention.sh — what load on the other core costs the sweep (sim/BENCH.md "Where the time goes now").
# `bench_speed sweep` (one run an invocation) pinned to core 1, alone and beside each neighbour of bench/neighbor.c
# pinned to core 0: fp64 multiply-adds on registers (no memory), reads over 4, 8 and 16 MiB (within the 32 MiB L3
# of the development machine), reads over 256 MiB (the memory). The neighbours take turns, ROUNDS times, so a
# change of the machine's outside load falls on all of them alike. Prints each sweep's CPU seconds and their median.
# Usage: sh bench/contention.sh [ROUNDS]   (from the repository root, ROUNDS 1..20, default 3; 2 cores or more)
set -eu
ROUNDS=${1:-3}
case $ROUNDS in [1-9] | 1[0-9] | 20) ;; *) echo "usage: sh bench/contention.sh [ROUNDS 1..20]" >&2; exit 2 ;; esac
[ "$(nproc)" -ge 2 ] || { echo "contention.sh: needs 2 cores" >&2; exit 2; }
make -s build/bench/bench_speed build/bench/neighbor
D=$(mktemp -d /tmp/kvs_contention_XXXXXX)
trap 'rm -rf "$D"' EXIT
KINDS="none fma read4 read8 read16 read256"
for r in $(seq "$ROUNDS"); do
    for k in $KINDS; do
        pid=
        case $k in
            fma) taskset -c 0 build/bench/neighbor fma 30 >"$D/n.out" & pid=$! ;;
            read*) taskset -c 0 build/bench/neighbor read "${k#read}" 30 >"$D/n.out" & pid=$! ;;
        esac
        sleep 1 # the neighbour's buffer written and its loop running before the sweep starts
        KVSIM_BENCH_SWEEP_REPS=1 taskset -c 1 build/bench/bench_speed sweep >"$D/s.out" 2>&1
        nb=
        if [ -n "$pid" ]; then # stopped by SIGTERM, the neighbour prints what it did
            kill "$pid" 2>/dev/null || true
            wait "$pid" 2>/dev/null || true
            nb=" ($(cat "$D/n.out"))"
        fi
        cpu=$(sed -n 's/.*in CPU time (what .*: \([0-9.]*\) CPU s.*/\1/p' "$D/s.out")
        [ -n "$cpu" ] || { echo "contention.sh: no CPU time in bench_speed's output:" >&2; cat "$D/s.out" >&2; exit 1; }
        echo "$k $cpu" >>"$D/all"
        echo "round $r: neighbour $k: sweep $cpu CPU s$nb"
    done
done
echo "neighbour   sweep CPU s (median; every round)"
for k in $KINDS; do
    printf '%-10s %s\n' "$k" "$(awk -v k="$k" '$1 == k { v[n++] = $2 } END {
        for (i = 0; i < n; i++) for (j = i + 1; j < n; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
        m = n % 2 ? v[(n - 1) / 2] : (v[n / 2 - 1] + v[n / 2]) / 2
        s = ""; for (i = 0; i < n; i++) s = s " " v[i]
        printf "%.2f  (sorted:%s)", m, s }' "$D/all")"
done
