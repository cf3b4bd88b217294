#!/bin/sh
# slurm_sweep.sh — CI check of examples/slurm/ on a real single-node Slurm: starts munged, slurmctld and
# slurmd under this script (own key, socket, state, spool and logs in a temporary folder, stopped and removed on
# exit), submits a small study of the bundled traces with examples/slurm/submit.sh (one array element per task,
# then the dependent merge job), waits for both jobs, and checks that the merged database equals, run by run, the
# database a one-process `kvsim sweep` of the same study gives (the comparison of tests/mpi_sweep.sh).
# When Slurm or munge is not installed (Debian: slurm-wlm munge) or the daemons cannot start here, it prints
# "SKIP: why" and exits 0. Usage: slurm_sweep.sh KVSIM   (KEEP=1 keeps the temporary folder)
set -eu
kvsim=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
root=$(cd "$(dirname "$0")/.." && pwd)

skip() {
    echo "slurm_sweep: SKIP: $*"
    exit 0
}
fail() {
    echo "slurm_sweep: FAIL: $*"
    exit 1
}
for c in munged munge unmunge slurmctld slurmd sbatch squeue scontrol sinfo scancel; do
    command -v "$c" >/dev/null 2>&1 || skip "$c not found (Debian: apt-get install slurm-wlm munge)"
done
[ "$(id -u)" -eq 0 ] || skip "the daemons of a private test cluster run as root here, and this is user $(id -un)"

dir=$(mktemp -d /tmp/kvsim-slurm.XXXXXX)
chmod 755 "$dir" # munged wants the path to its socket traversable by every user
mkdir -p "$dir/munge" "$dir/state" "$dir/spool" "$dir/log" "$dir/work"
munged_pid="" ctld_pid="" slurmd_pid=""
cleanup() {
    # jobs first (their steps outlive slurmd with proctrack/linuxproc), then the daemons this script started
    if [ -n "$ctld_pid" ]; then
        scancel --quiet --user=root >/dev/null 2>&1 || true
        i=0
        while [ $i -lt 20 ] && [ -n "$(squeue -h -o %i 2>/dev/null)" ]; do sleep 0.5; i=$((i + 1)); done
    fi
    for p in $slurmd_pid $ctld_pid $munged_pid; do kill "$p" 2>/dev/null || true; done
    for p in $slurmd_pid $ctld_pid $munged_pid; do wait "$p" 2>/dev/null || true; done
    if [ -n "${KEEP:-}" ]; then echo "slurm_sweep: kept $dir"; else rm -rf "$dir"; fi
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP
log_tail() {
    for f in "$@"; do [ -f "$f" ] && { echo "--- $f"; tail -n 15 "$f"; }; done
    return 0
}

# --- munge: a fresh key and a private socket (AuthInfo below points Slurm at it)
dd if=/dev/urandom of="$dir/munge/key" bs=1024 count=1 2>/dev/null
chmod 400 "$dir/munge/key"
sock="$dir/munge/socket"
munged --force --foreground --socket="$sock" --key-file="$dir/munge/key" --pid-file="$dir/munge/pid" \
    --seed-file="$dir/munge/seed" --log-file="$dir/munge/log" >"$dir/munge/out" 2>&1 &
munged_pid=$!
i=0
until munge -n -S "$sock" 2>/dev/null | unmunge -S "$sock" >/dev/null 2>&1; do
    i=$((i + 1))
    if [ $i -ge 20 ] || ! kill -0 "$munged_pid" 2>/dev/null; then
        log_tail "$dir/munge/out"
        skip "munged does not start on this machine (its output above)"
    fi
    sleep 0.25
done

# --- slurm.conf for this one node, cgroup-free (containers often have no writable cgroup tree)
host=$(hostname -s)
cpus=$(nproc)
mem=$(awk '/^MemTotal:/ { print int($2 / 1024 * 0.8) }' /proc/meminfo)
# two free TCP ports (a port in use would keep slurmctld from starting)
used=$(cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | awk 'NR > 1 { split($2, a, ":"); print a[2] }')
port=$((20000 + $$ % 20000))
while echo "$used" | grep -qi "^$(printf %04X $port)$\|^$(printf %04X $((port + 1)))$"; do port=$((port + 2)); done
cat >"$dir/slurm.conf" <<CONF
ClusterName=kvsimtest
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$port
SlurmdPort=$((port + 1))
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$sock
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/builtin
ReturnToService=2
MinJobAge=600
KillWait=5
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=kvsim Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
SLURM_CONF=$dir/slurm.conf
export SLURM_CONF
slurmctld -D -i >"$dir/log/slurmctld.out" 2>&1 &
ctld_pid=$!
slurmd -D >"$dir/log/slurmd.out" 2>&1 &
slurmd_pid=$!
i=0
until [ "$(sinfo -h -N -o %t 2>/dev/null)" = idle ]; do
    i=$((i + 1))
    if [ $i -ge 60 ] || ! kill -0 "$ctld_pid" 2>/dev/null || ! kill -0 "$slurmd_pid" 2>/dev/null; then
        log_tail "$dir/log/slurmctld.out" "$dir/log/slurmd.out"
        skip "slurmctld/slurmd do not start on this machine, or the node never came up idle (their logs above)"
    fi
    sleep 0.5
done
echo "slurm_sweep: single-node Slurm up ($host, $cpus CPUs, $mem MiB, ports $port-$((port + 1)))"

# --- the study (that of tests/mpi_sweep.sh): 2 traces x 4 policies x 3 budgets = 24 runs
cat >"$dir/work/study" <<STUDY
name slurm-check
trace $root/examples/stories260K*.kvt
policy h2o
policy window
policy streaming:sinks=4
policy tova
budgets 8,16,50%
series-every 4
threads 1
policies-per-task 2
STUDY
cd "$dir/work"
n_tasks=$("$kvsim" sweep study --list-tasks | awk -F'\t' '$1 ~ /^[0-9]+$/ { n++ } END { print n + 0 }')
# the examples' #SBATCH defaults (4 CPUs, 4 GiB) may exceed a CI machine: one CPU and 256 MiB per element here
out=$(KVSIM="$kvsim" bash "$root/examples/slurm/submit.sh" study shards study.db --cpus-per-task=1 --mem=256M \
    --time=5) || fail "submit.sh failed: $out"
echo "slurm_sweep: $out"
array=$(echo "$out" | sed -n 's/.* as job \([0-9]*\);.*/\1/p')
merge=$(echo "$out" | sed -n 's/.*merge job \([0-9]*\)$/\1/p')
[ -n "$array" ] && [ -n "$merge" ] || fail "cannot read the job ids from submit.sh's output"
i=0
while [ -n "$(squeue -h -o %i 2>/dev/null)" ]; do
    i=$((i + 1))
    if [ $i -ge 240 ]; then
        squeue
        log_tail "$dir/log/slurmctld.log" "$dir/log/slurmd.log"
        fail "the jobs did not finish within 120 s"
    fi
    sleep 0.5
done
# accounting is off (no slurmdbd): the controller still knows finished jobs for MinJobAge seconds
job_state() { scontrol show job "$1" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p'; }
states=$(job_state "$array" | sort | uniq -c | tr -s ' ' | tr '\n' ';')
[ "$(job_state "$array" | grep -c '^COMPLETED$')" -eq "$n_tasks" ] || {
    for f in slurm-*.out; do [ -f "$f" ] && { echo "--- $f"; cat "$f"; }; done
    fail "the array job $array did not complete all $n_tasks elements (states:$states)"
}
[ "$(job_state "$merge")" = COMPLETED ] || {
    cat "slurm-$merge.out" 2>/dev/null
    fail "the merge job $merge ended $(job_state "$merge")"
}
[ "$(ls shards/shard-*.db | wc -l)" -eq "$n_tasks" ] || fail "expected $n_tasks shards, found $(ls shards)"

"$kvsim" sweep study --db single.db >/dev/null 2>&1 || fail "the one-process sweep failed"
. "$root/tests/sweep_runs_key.sh"
runs_key "$kvsim" single.db >single.txt
runs_key "$kvsim" study.db >slurm.txt
n=$(wc -l <single.txt)
[ "$n" -eq 24 ] || fail "the one-process sweep has $n runs, not 24"
if ! cmp -s single.txt slurm.txt; then
    diff single.txt slurm.txt | head -20
    fail "the database merged by the Slurm job differs from the one-process sweep"
fi
echo "slurm_sweep: OK: $n_tasks array elements, merge job, $n runs, merged database equal to the one-process sweep run by run"
