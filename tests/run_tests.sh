#!/bin/sh
# Runs each cmocka test binary given as an argument, echoes its output, and closes with one summary line
# "tests: N passed, N failed" counting individual cmocka tests (skipped tests are reported apart).
# Exit status is non-zero when any test failed or any binary crashed.
#
# TEST_JOBS=n runs up to n binaries at once (the Makefile passes the machine's core count; 1 runs them one
# after another). Each binary's output goes to its own file and is echoed whole, in the order of the arguments,
# once every binary has finished, so the log reads the same whatever the job count. The binaries share nothing
# but the read-only tree: each makes its own mkdtemp folder.
# The replay's score memo runs checked under test: every hit keyed under a contract is computed again and compared
# (sim/policy_memo.h, kvs_policy_memo_set_checked), so a broken contract aborts a test instead of passing unseen.
KVS_MEMO_CHECK=${KVS_MEMO_CHECK:-1}
export KVS_MEMO_CHECK
jobs=${TEST_JOBS:-1}
case $jobs in '' | *[!0-9]* | 0) echo "run_tests: TEST_JOBS must be a positive integer, not '$jobs'" >&2; exit 2 ;; esac
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvs_run_tests_XXXXXX") || { echo "run_tests: cannot make a scratch folder" >&2; exit 2; }
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM

i=0
: >"$tmp/list"
for bin in "$@"; do
    i=$((i + 1))
    printf '%s\n' "$bin" >>"$tmp/list"
done
# xargs hands out the indices 1..n; the child finds its binary on that line of the list (a path is never split
# or unquoted by xargs), writes the output, then the exit status: the .rc file says it ran to its end, crash or not
[ "$i" -gt 0 ] && seq 1 "$i" | xargs -P "$jobs" -n 1 sh -c \
    'bin=$(sed -n "$1p" "$0/list"); t0=$(date +%s.%N); { "$bin"; echo $? >"$0/$1.rc"; } >"$0/$1.out" 2>&1
     echo "$(date +%s.%N) $t0" | awk "{printf \"%.1f\n\", \$1 - \$2}" >"$0/$1.sec"' "$tmp"

passed=0; failed=0; skipped=0; bad_bins=""
i=0
for bin in "$@"; do
    i=$((i + 1))
    out=$(cat "$tmp/$i.out" 2>/dev/null)
    rc=$(cat "$tmp/$i.rc" 2>/dev/null)
    [ -n "$rc" ] || rc=127 # the runner itself could not start it
    printf '%s\n' "$out"
    p=$(printf '%s\n' "$out" | sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' | awk '{s+=$1} END {print s+0}')
    f=$(printf '%s\n' "$out" | sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' | awk '{s+=$1} END {print s+0}')
    s=$(printf '%s\n' "$out" | sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' | awk '{s+=$1} END {print s+0}')
    passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then failed=$((failed + 1)); bad_bins="$bad_bins $bin(rc=$rc)"; fi
done
[ -n "$bad_bins" ] && echo "binaries that exited abnormally:$bad_bins"
# where the suite's time goes: the ten slowest binaries, wall seconds each (they ran TEST_JOBS at a time)
i=0
for bin in "$@"; do
    i=$((i + 1))
    printf '%s %s\n' "$(cat "$tmp/$i.sec" 2>/dev/null || echo 0)" "${bin##*/}"
done | sort -rn | head -10 | awk 'BEGIN { printf "slowest:" } { printf " %s %s s;", $2, $1 } END { print "" }'
echo "tests: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
