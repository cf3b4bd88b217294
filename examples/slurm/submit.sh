#!/bin/bash
# submit.sh STUDY SHARDS_DIR OUT.db [SBATCH_OPTION...] — submits a kvsim study to Slurm: a job array with one
# element per task (sweep_array.sh), then the merge (merge.sh) once every element succeeded (afterok). Prints both
# job ids. SBATCH_OPTIONs (e.g. --partition=P --cpus-per-task=2 --mem=1G --time=10) go to both jobs and override
# the scripts' #SBATCH defaults, which a small node may not be able to satisfy.
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: submit.sh STUDY SHARDS_DIR OUT.db [SBATCH_OPTION...]" >&2; exit 2; }
study=$1 shards=$2 out=$3
shift 3
here=$(cd "$(dirname "$0")" && pwd)
: "${KVSIM:=kvsim}"
n=$("$KVSIM" sweep "$study" --list-tasks | awk -F'\t' '$1 ~ /^[0-9]+$/ { n++ } END { print n + 0 }')
[ "$n" -gt 0 ] || { echo "submit.sh: the study has no tasks" >&2; exit 1; }
export KVSIM STUDY="$study" SHARDS="$shards" OUT="$out"
array=$(sbatch --parsable --array=0-$((n - 1)) --export=ALL "$@" "$here/sweep_array.sh")
array=${array%%;*} # --parsable prints ID or ID;CLUSTER
merge=$(sbatch --parsable --dependency=afterok:"$array" --kill-on-invalid-dep=yes --export=ALL "$@" "$here/merge.sh")
merge=${merge%%;*}
echo "submitted $n tasks as job $array; merge job $merge"
