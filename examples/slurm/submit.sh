#!/bin/bash
# submit.sh STUDY SHARDS_DIR OUT.db — submits a kvsim study to Slurm: a job array with one element per task
# (sweep_array.sh), then the merge (merge.sh) once every element succeeded (afterok). Prints both job ids.
set -euo pipefail
study=$1 shards=$2 out=$3
here=$(cd "$(dirname "$0")" && pwd)
: "${KVSIM:=kvsim}"
n=$("$KVSIM" sweep "$study" --list-tasks | awk -F'\t' '$1 ~ /^[0-9]+$/ { n++ } END { print n + 0 }')
[ "$n" -gt 0 ] || { echo "submit.sh: the study has no tasks" >&2; exit 1; }
export KVSIM STUDY="$study" SHARDS="$shards" OUT="$out"
array=$(sbatch --parsable --array=0-$((n - 1)) --export=ALL "$here/sweep_array.sh")
merge=$(sbatch --parsable --dependency=afterok:"$array" --export=ALL "$here/merge.sh")
echo "submitted $n tasks as job $array; merge job $merge"
