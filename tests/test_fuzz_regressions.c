/* test_fuzz_regressions.c — regression tests for what the libFuzzer harnesses of fuzz/ (fuzz/README.md) found in the
 * readers added with the sweep, heads and plan commands; each reproducer is also in the harness's seed corpus
 * (fuzz/corpus/NAME/regress_*), so `make fuzz` replays it too. (Findings in the trace and tokenizer readers are in
 * tests/test_limits.c; the head clusters reader's in tests/test_head_clusters.c.)
 *
 *  merge: a shard whose run has a NULL status (its schema rewritten without the NOT NULL, or a corrupt record
 *  that SQLite reads as NULL): `kvsim merge` passed the NULL to strcmp, a segmentation fault in the release build
 *  (found by fuzz_merge as an UBSan report; results/results_sweep.c). Now refused as a corrupt database, OUT unchanged.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/kvs.h"
#include "results/results.h"
#include "results/results_sweep.h"
#include "tests/util/testenv.h"

static char dir[64];

static int setup(void **state) {
    (void)state;
    strcpy(dir, "/tmp/kvs_fuzzreg_XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}


static void put(const char *p, const uint8_t *b, size_t n) {
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

/* Merges the corpus file `shard` into a copy of the corpus's replay database: refused with KVS_ERR_DB (detail
 * containing `want` when not NULL), OUT byte for byte as it was, no temporary beside it. */
static void merge_is_refused(const char *shard, const char *want) {
    char in[512], out_seed[512], out[128];
    snprintf(in, sizeof in, "%s/fuzz/corpus/merge/%s", kvs_test_root(), shard);
    snprintf(out_seed, sizeof out_seed, "%s/fuzz/corpus/results_db/window.db", kvs_test_root());
    snprintf(out, sizeof out, "%s/out.db", dir);
    size_t n0;
    uint8_t *before = kvs_test_slurp(out_seed, &n0);
    put(out, before, n0);
    const char *inputs[1] = {in};
    kvs_status st = kvs_results_merge(out, inputs, 1, NULL);
    if (st != KVS_ERR_DB || (want && !strstr(kvs_last_error(), want)))
        fail_msg("%s: status %d, detail '%s' (want %d, '%s')", shard, st, kvs_last_error(), KVS_ERR_DB,
                 want ? want : "");
    size_t n1;
    uint8_t *after = kvs_test_slurp(out, &n1);
    assert_int_equal(n1, n0);
    assert_memory_equal(after, before, n0);
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d))) assert_null(strstr(e->d_name, ".merge-"));
    closedir(d);
    free(before);
    free(after);
    unlink(out);
}

static void test_merge_refuses_a_run_without_status(void **state) {
    (void)state;
    /* a real one-task shard whose first run's status was set to NULL after its NOT NULL was dropped */
    merge_is_refused("regress_null_status.db", "run 1 has status NULL (neither complete nor failed): a corrupt database");
    /* the fuzzer's input: records whose status reads as NULL, runs referring to traces it lacks */
    merge_is_refused("regress_null_status_fuzzed.db", NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_merge_refuses_a_run_without_status, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
