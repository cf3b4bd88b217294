#!/bin/sh
# Runs each cmocka test binary given as an argument, echoes its output, and closes with one summary line
# "tests: N passed, N failed" counting individual cmocka tests (skipped tests are reported apart).
# Exit status is non-zero when any test failed or any binary crashed.
passed=0; failed=0; skipped=0; bad_bins=""
for bin in "$@"; do
    out=$("$bin" 2>&1); rc=$?
    printf '%s\n' "$out"
    p=$(printf '%s\n' "$out" | sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' | awk '{s+=$1} END {print s+0}')
    f=$(printf '%s\n' "$out" | sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' | awk '{s+=$1} END {print s+0}')
    s=$(printf '%s\n' "$out" | sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' | awk '{s+=$1} END {print s+0}')
    passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then failed=$((failed + 1)); bad_bins="$bad_bins $bin(rc=$rc)"; fi
done
[ -n "$bad_bins" ] && echo "binaries that exited abnormally:$bad_bins"
echo "tests: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
