#!/bin/sh
# mpi_sweep.sh — CI check of the MPI launcher of `kvsim sweep`: a study of the bundled traces on 2 Open MPI
# ranks (--oversubscribe: CI machines may have fewer cores; --allow-run-as-root: CI runs as root) must give, run by
# run, the database a one-process sweep of the same study gives. Usage: mpi_sweep.sh MPI_KVSIM KVSIM
set -eu
mpi_kvsim=$1
kvsim=$2
root=$(cd "$(dirname "$0")/.." && pwd)
command -v mpirun >/dev/null 2>&1 || { echo "mpi_sweep: mpirun not found (Debian: openmpi-bin)"; exit 1; }
dir=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$dir"' EXIT
cat >"$dir/study" <<STUDY
name mpi-check
trace $root/examples/stories260K*.kvt
policy h2o
policy window
policy streaming:sinks=4
policy tova
budgets 8,16,50%
series-every 4
threads 1
STUDY
"$kvsim" sweep "$dir/study" --list-tasks
mpirun --allow-run-as-root --oversubscribe -np 2 "$mpi_kvsim" sweep "$dir/study" --db "$dir/shards/" >"$dir/mpi.log" 2>&1 ||
    { cat "$dir/mpi.log"; echo "mpi_sweep: FAIL: mpirun exited non-zero"; exit 1; }
grep -h "rank [01]: task" "$dir/mpi.log" | sed 's/^/  /'
"$kvsim" sweep "$dir/study" --db "$dir/single.db" >/dev/null 2>&1
. "$root/tests/sweep_runs_key.sh"
runs_key "$kvsim" "$dir/single.db" >"$dir/single.txt"
runs_key "$kvsim" "$dir/shards/study.db" >"$dir/mpi.txt"
n=$(wc -l <"$dir/single.txt")
[ "$n" -eq 24 ] || { echo "mpi_sweep: FAIL: the one-process sweep has $n runs, not 24"; exit 1; }
if ! cmp -s "$dir/single.txt" "$dir/mpi.txt"; then
    diff "$dir/single.txt" "$dir/mpi.txt" | head -20
    echo "mpi_sweep: FAIL: the merged 2-rank database differs from the one-process sweep"
    exit 1
fi
echo "mpi_sweep: OK: 2 ranks, $n runs, merged database equal to the one-process sweep run by run"
# A task failing on rank 1 (its shard cannot be opened: a folder stands in its place) ends the sweep on every rank
# with a non-zero status and no merge (timeout: a hang fails too); the same command afterwards resumes and merges.
mkdir -p "$dir/fail/shard-1.db"
rc=0
timeout 120 mpirun --allow-run-as-root --oversubscribe -np 2 "$mpi_kvsim" sweep "$dir/study" --db "$dir/fail/" \
    >"$dir/fail.log" 2>&1 || rc=$?
[ "$rc" -ne 0 ] || { cat "$dir/fail.log"; echo "mpi_sweep: FAIL: a failed task on rank 1 did not fail the sweep"; exit 1; }
[ "$rc" -ne 124 ] || { echo "mpi_sweep: FAIL: the ranks hung after a failed task"; exit 1; }
[ ! -e "$dir/fail/study.db" ] || { echo "mpi_sweep: FAIL: merged although a task failed"; exit 1; }
grep -q "run the same command again to resume" "$dir/fail.log" || { cat "$dir/fail.log"; echo "mpi_sweep: FAIL: no resume hint"; exit 1; }
rmdir "$dir/fail/shard-1.db"
mpirun --allow-run-as-root --oversubscribe -np 2 "$mpi_kvsim" sweep "$dir/study" --db "$dir/fail/" >"$dir/resume.log" 2>&1 ||
    { cat "$dir/resume.log"; echo "mpi_sweep: FAIL: the resumed sweep failed"; exit 1; }
# what rank 0 completed before the failure is skipped on resume, whichever rank draws it (not run again)
for t in $(sed -n 's/.*rank 0: task \([0-9]*\):.*/\1/p' "$dir/fail.log"); do
    grep -q "rank [01]: task $t:" "$dir/resume.log" &&
        { cat "$dir/resume.log"; echo "mpi_sweep: FAIL: task $t, complete in shard-0.db, ran again on resume"; exit 1; }
    grep -q "task $t (.*already complete in $dir/fail/shard-0.db" "$dir/resume.log" ||
        { cat "$dir/resume.log"; echo "mpi_sweep: FAIL: task $t not reported as complete on resume"; exit 1; }
done
runs_key "$kvsim" "$dir/fail/study.db" >"$dir/resumed.txt"
cmp -s "$dir/single.txt" "$dir/resumed.txt" || { echo "mpi_sweep: FAIL: the resumed sweep differs from the one-process sweep"; exit 1; }
echo "mpi_sweep: OK: a failed task on rank 1 stops both ranks (non-zero exit, no merge); the resumed sweep equals the one-process sweep"
