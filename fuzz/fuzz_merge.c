/* fuzz_merge.c — libFuzzer harness of `kvsim merge` (results/results_sweep.c: kvs_results_merge, results/SCHEMA.md
 * "Family sweep"): the input is a shard database (a foreign or corrupt SQLite file included), merged into OUT,
 * which is each time a copy of a real results database (fuzz/corpus/results_db/window.db, one replay run). Odd
 * inputs merge into an OUT that does not exist yet. A refused merge must leave OUT exactly as it was (byte for
 * byte, or still absent) and no temporary file (OUT.merge-PID.tmp, its journal or WAL) behind; an accepted one
 * must leave an OUT that opens read-only and lists at least the runs the statistics say it holds. Seeds:
 * fuzz/corpus/merge (shards written by `kvsim sweep`, a replay database, one with a failed run).
 */
#include "fuzz.h"

#include <dirent.h>

#include "../common/kvs.h"
#include "../results/results.h"
#include "../results/results_sweep.h"

static uint8_t *out_seed;
static size_t out_seed_n;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    char src[512];
    snprintf(src, sizeof src, "%s/fuzz/corpus/results_db/window.db", kvs_fuzz_root());
    FILE *f = fopen(src, "rb");
    if (!f || fseek(f, 0, SEEK_END) != 0) {
        perror(src);
        abort();
    }
    out_seed_n = (size_t)ftell(f);
    rewind(f);
    if (!(out_seed = malloc(out_seed_n)) || fread(out_seed, 1, out_seed_n, f) != out_seed_n) abort();
    fclose(f);
    return 0;
}

/* 1 when OUT holds exactly the seed's bytes. */
static int out_unchanged(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    uint8_t *buf = malloc(out_seed_n + 1);
    if (!buf) abort();
    size_t n = fread(buf, 1, out_seed_n + 1, f);
    fclose(f);
    int same = n == out_seed_n && !memcmp(buf, out_seed, n);
    free(buf);
    return same;
}

/* Aborts when a temporary file of the merge is left in the scratch folder; removes every file but the two
 * databases (SQLite may leave a journal of the read-only input), and OUT itself when `remove_out`. */
static void check_and_clean(int remove_out) {
    DIR *d = opendir(kvs_fuzz_dir());
    if (!d) abort();
    struct dirent *e;
    char p[512];
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        if (strstr(e->d_name, ".merge-")) {
            fprintf(stderr, "merge left %s behind\n", e->d_name);
            abort();
        }
        if (!strcmp(e->d_name, "shard.db") || (!remove_out && !strcmp(e->d_name, "out.db"))) continue;
        snprintf(p, sizeof p, "%s/%s", kvs_fuzz_dir(), e->d_name);
        unlink(p);
    }
    closedir(d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char shard[128], out[128];
    kvs_fuzz_write("shard.db", data, size, shard, sizeof shard);
    snprintf(out, sizeof out, "%s/out.db", kvs_fuzz_dir());
    int fresh = size % 2 == 1;
    if (fresh) unlink(out);
    else kvs_fuzz_write("out.db", out_seed, out_seed_n, out, sizeof out);
    const char *inputs[1] = {shard};
    kvs_results_merge_stats stats;
    kvs_status st = kvs_results_merge(out, inputs, 1, &stats);
    if (st != KVS_OK) {
        struct stat sb;
        if (fresh ? stat(out, &sb) == 0 : !out_unchanged(out)) {
            fprintf(stderr, "refused merge (%s) changed OUT\n", kvs_last_error());
            abort();
        }
    } else {
        kvs_results_db *db = NULL;
        if (kvs_results_open_readonly(out, &db) != KVS_OK) {
            fprintf(stderr, "merged OUT does not open: %s\n", kvs_last_error());
            abort();
        }
        kvs_results_filter f = {.include_failed = 1};
        kvs_results_run_row *rows = NULL;
        int64_t n = 0;
        if (kvs_results_query_runs(db, &f, &rows, &n) != KVS_OK || n < stats.runs_copied) {
            fprintf(stderr, "merged OUT lists %lld runs, %lld copied: %s\n", (long long)n,
                    (long long)stats.runs_copied, kvs_last_error());
            abort();
        }
        kvs_results_run_rows_free(rows, n);
        kvs_results_close(db);
    }
    check_and_clean(1);
    kvs_clear_error();
    return 0;
}
