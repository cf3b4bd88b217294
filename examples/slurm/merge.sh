#!/bin/bash
# merge.sh — the dependent job of a kvsim study on Slurm: merges every shard into one database (kvsim merge is atomic:
# a killed merge leaves OUT unchanged; running it again is safe).
#SBATCH --job-name=kvsim-merge
#SBATCH --cpus-per-task=1
#SBATCH --mem=2G
#SBATCH --time=00:30:00
set -euo pipefail
: "${KVSIM:=kvsim}" "${SHARDS:?set SHARDS}" "${OUT:?set OUT}"
exec "$KVSIM" merge "$OUT" "$SHARDS"/shard-*.db
