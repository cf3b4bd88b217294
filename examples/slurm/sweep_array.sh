#!/bin/bash
# sweep_array.sh — one Slurm array element per task of a kvsim study (results/STUDY.md): element I runs task I into its
# own shard. Submit through submit.sh, which sizes the array from `kvsim sweep --list-tasks` and chains the merge.
# Size --time and --mem from `kvsim sweep STUDY --list-tasks --estimate` (results/STUDY.md "Task sizing").
#SBATCH --job-name=kvsim-sweep
#SBATCH --cpus-per-task=4
#SBATCH --mem=4G
#SBATCH --time=01:00:00
set -euo pipefail
: "${KVSIM:=kvsim}" "${STUDY:?set STUDY}" "${SHARDS:?set SHARDS (a folder)}"
mkdir -p "$SHARDS"
# a re-submitted element skips its task when it already completed (the shard records it)
exec "$KVSIM" sweep "$STUDY" --db "$SHARDS/shard-$SLURM_ARRAY_TASK_ID.db" --task "$SLURM_ARRAY_TASK_ID"
