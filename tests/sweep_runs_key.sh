# sweep_runs_key.sh — sourced by tests/mpi_sweep.sh and tests/slurm_sweep.sh: runs_key KVSIM DB prints
# one line per run of DB, every column of `kvsim runs --csv --summary --all` except those that differ between two
# executions of the same run (id, wall time, write time), sorted; two sweeps of one study give equal lines.
runs_key() {
    # (commas inside quoted fields, e.g. params, become ';' first so that awk can split on commas)
    "$1" runs "$2" --csv --summary --all | sed -E ':a; s/("[^",]*),([^"]*")/\1;\2/; ta' | awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) drop[i] = ($i == "run_id" || $i == "wall_seconds" || $i == "created_at"); next }
        { line = ""; for (i = 1; i <= NF; i++) if (!drop[i]) line = line $i ","; print line }' | sort
}
