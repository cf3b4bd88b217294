/* cmd_merge.c — `kvsim merge OUT.db IN.db...`: combines the shard databases of a sharded study into one
 * (results/results_sweep.h kvs_results_merge: run identity, conflicts, atomic replacement; results/SCHEMA.md
 * "Family sweep").
 */
#include <stdio.h>
#include <string.h>

#include "../results/results_sweep.h"
#include "cli.h"

static void usage(FILE *f) {
    fprintf(f, "usage: kvsim merge OUT.db IN.db [IN.db ...]\n\n"
               "Combines kvsim results databases (the shards of a sweep) into OUT.db; an existing OUT.db is kept and\n"
               "added to. Runs are de-duplicated by identity: trace content hash (or the whole trace row), policy,\n"
               "canonical params, budget, measure, kvsim version. A complete run replaces failed ones of the same\n"
               "identity; two complete runs of one identity must have equal run-wide results, else the merge is\n"
               "refused (conflicting duplicate). Inputs of another schema version are refused. OUT.db is written\n"
               "beside itself and renamed into place when complete: a failed or killed merge leaves it unchanged.\n");
}

int kvs_cmd_merge(int argc, char **argv) {
    const char *files[4096];
    int n = 0;
    for (int i = 1; i < argc; i++) {
        if (kvs_cli_is_help(argv[i])) {
            usage(stdout);
            return KVS_EXIT_OK;
        }
        if (argv[i][0] == '-' && argv[i][1]) return kvs_cli_usage_error("merge", "unknown option '%s'", argv[i]);
        if (n == (int)(sizeof files / sizeof files[0])) return kvs_cli_usage_error("merge", "too many files");
        files[n++] = argv[i];
    }
    if (n < 2) return kvs_cli_usage_error("merge", n ? "missing IN.db" : "missing OUT.db and IN.db");
    for (int i = 1; i < n; i++)
        if (!strcmp(files[i], files[0])) return kvs_cli_usage_error("merge", "%s is both OUT and an input", files[0]);
    kvs_results_merge_stats ms;
    double t0 = kvs_now_s();
    kvs_status st = kvs_results_merge(files[0], files + 1, n - 1, &ms);
    if (st != KVS_OK) return kvs_cli_fail("merge", st == KVS_ERR_INVALID_ARG ? KVS_ERR_IO : st);
    if (ms.skipped_tables[0])
        fprintf(stderr, "kvsim merge: warning: tables of other families not merged: %s\n", ms.skipped_tables);
    printf("merged %lld databases into %s in %.2f s: %lld runs copied, %lld duplicates dropped, %lld failed runs "
           "superseded; %lld traces, %lld completed sweep tasks\n",
           (long long)ms.inputs, files[0], kvs_now_s() - t0, (long long)ms.runs_copied, (long long)ms.runs_duplicate,
           (long long)ms.runs_superseded, (long long)ms.traces, (long long)ms.tasks);
    return kvs_cli_finish_stdout("merge");
}
