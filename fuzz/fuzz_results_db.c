/* fuzz_results_db.c — libFuzzer harness of the results database opener and reader (sim/results.c:
 * kvs_results_open_readonly, then what `kvsim runs` and `plot` read): the input is the database file, a foreign
 * or corrupt SQLite file included; one that opens is queried for every run (failed ones and per-layer rows too),
 * each run's turns and a steps series. Seeds: fuzz/corpus/results_db (a real replay's database).
 */
#include "fuzz.h"

#include "../common/kvs.h"
#include "../sim/results.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[128];
    kvs_fuzz_write("results.db", data, size, path, sizeof path);
    kvs_results_db *db = NULL;
    if (kvs_results_open_readonly(path, &db) == KVS_OK) {
        (void)kvs_results_schema_version(db);
        kvs_results_filter f = {.include_failed = 1, .with_layers = 1};
        kvs_results_run_row *rows = NULL;
        int64_t n = 0;
        if (kvs_results_query_runs(db, &f, &rows, &n) == KVS_OK) {
            for (int64_t i = 0; i < n && i < 8; i++) {
                kvs_turn *turns = NULL;
                int64_t nt = 0;
                if (kvs_results_query_turns(db, rows[i].trace_id, &turns, &nt) == KVS_OK) free(turns);
                kvs_results_series s = {0};
                if (kvs_results_query_steps(db, rows[i].id, -1, KVS_M_OUT_ERR, &s) == KVS_OK)
                    kvs_results_series_free(&s);
            }
            kvs_results_run_rows_free(rows, n);
        }
    }
    kvs_results_close(db);
    /* SQLite may leave a journal beside a database it could not read cleanly: start the next input afresh */
    char j[160];
    snprintf(j, sizeof j, "%s-journal", path);
    unlink(j);
    kvs_clear_error();
    return 0;
}
