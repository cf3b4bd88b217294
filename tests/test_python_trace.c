/* test_python_trace.c — tests of the Python trace module (python/kvsim: trace reader and writer of trace/FORMAT.md,
 * results database reader of results/SCHEMA.md). Each test runs one case of tests/python/check_trace.py with
 * /usr/bin/python3 against the kvsim binary under test ($KVSIM_BIN), in a fresh folder; the script asserts its own
 * checks and prints what it measured. This file then checks the Python-written traces through kvsim's C reader,
 * another implementation of the format than the one that wrote them (a reader and writer wrong in the same way
 * would agree with each other, not with trace/trace.c).
 *
 * Cases: roundtrip (kvsim capture -> Python -> trace: arrays bit-equal, verify OK, the one-shot bundled trace
 * byte-identical), hooks (float64 PyTorch reference recorded through forward hooks on the attention module:
 * verify OK, replay gives the capture's numbers), results (the results database read from Python equals `kvsim
 * runs`), corrupt (every flipped byte and truncation a clear TraceError; writer misuse a clear error).
 * Skips, saying so, where /usr/bin/python3 lacks NumPy (every case) or torch (hooks), or the shared models are
 * missing.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/kvs.h"
#include "tests/util/cli_run.h"
#include "tests/util/testenv.h"
#include "trace/trace.h"

#define PY "/usr/bin/python3"

/* Skips the test unless /usr/bin/python3 imports every module of `mods` (space-separated) and the binary under test
 * and the shared models are there. */
static void need(const char *mods) {
    if (!kvs_test_kvsim_bin()) {
        print_message("KVSIM_BIN is not set (run through `make test`): skipped\n");
        skip();
    }
    char models[512];
    snprintf(models, sizeof models, "%s/../shared/models/stories260K.bin", kvs_test_root());
    if (!kvs_test_exists(models)) {
        print_message("no shared models (%s): skipped\n", models);
        skip();
    }
    char cmd[512], list[256];
    snprintf(list, sizeof list, "%s", mods);
    for (char *m = strtok(list, " "); m; m = strtok(NULL, " ")) {
        snprintf(cmd, sizeof cmd, "%s -c 'import %s' >/dev/null 2>&1", PY, m);
        if (access(PY, X_OK) != 0 || system(cmd) != 0) {
            print_message("SKIPPED: %s cannot import %s (Debian: python3-numpy, python3-torch; "
                          "tools/install-debian-deps.sh --with-torch)\n", PY, m);
            skip();
        }
    }
}

/* Runs check_trace.py CASE in dir; prints its output; asserts exit status 0 and its "PASS CASE" line. */
static void run_case(const char *dir, const char *name) {
    char cmd[2048], log[256], pass[64];
    snprintf(log, sizeof log, "%s/%s.log", dir, name);
    /* timeout: a hang (the corrupt case's reason to exist) must fail, not stall the suite */
    snprintf(cmd, sizeof cmd, "KVSIM_ROOT='%s' KVSIM_BIN='%s' timeout 900 %s '%s/tests/python/check_trace.py' "
             "'%s' %s >'%s' 2>&1", kvs_test_root(), kvs_test_kvsim_bin(), PY, kvs_test_root(), dir, name, log);
    int rc = system(cmd);
    char *out = kvs_test_slurp(log, NULL);
    fputs(out ? out : "(no output)\n", stdout); /* whole: print_message cuts long text */
    fflush(stdout);
    snprintf(pass, sizeof pass, "PASS %s\n", name);
    int passed = out && strstr(out, pass) != NULL;
    free(out);
    assert_int_equal(rc, 0);
    assert_true(passed);
}

/* The positions, tokens and every stored array of two traces through kvs_trace_read_block (fp32 decode of the same
 * stored bits must be the same floats); the header's model fields equal. */
static void same_traces_c(const char *a_path, const char *b_path, int compare_outputs) {
    kvs_trace *a = NULL, *b = NULL;
    assert_int_equal(kvs_trace_open(a_path, &a), KVS_OK);
    assert_int_equal(kvs_trace_open(b_path, &b), KVS_OK);
    const kvs_trace_info *ia = kvs_trace_info_get(a), *ib = kvs_trace_info_get(b);
    assert_int_equal(ia->n_positions, ib->n_positions);
    assert_int_equal(ia->n_turns, ib->n_turns);
    assert_int_equal(ia->prompt_len, ib->prompt_len);
    assert_int_equal(ia->capture.dtype, ib->capture.dtype);
    assert_int_equal(ia->capture.block_positions, ib->capture.block_positions);
    assert_int_equal(ia->capture.flags, ib->capture.flags);
    assert_string_equal(ia->capture.settings, ib->capture.settings);
    assert_memory_equal(&ia->model, &ib->model, sizeof ia->model);
    int64_t n = ia->n_positions;
    assert_memory_equal(kvs_trace_tokens(a), kvs_trace_tokens(b), (size_t)n * sizeof(int32_t));
    assert_memory_equal(kvs_trace_roles(a), kvs_trace_roles(b), (size_t)n);
    assert_memory_equal(kvs_trace_turn_of(a), kvs_trace_turn_of(b), (size_t)n * sizeof(int32_t));
    kvs_trace_block *x = NULL, *y = NULL;
    assert_int_equal(kvs_trace_block_create(a, &x), KVS_OK);
    assert_int_equal(kvs_trace_block_create(b, &y), KVS_OK);
    int G = ia->model.n_heads / ia->model.n_kv_heads, d = ia->model.head_dim;
    for (int l = 0; l < ia->model.n_layers; l++)
        for (int h = 0; h < ia->model.n_kv_heads; h++)
            for (int64_t blk = 0; blk < ia->n_blocks; blk++) {
                assert_int_equal(kvs_trace_read_block(a, l, h, blk, x), KVS_OK);
                assert_int_equal(kvs_trace_read_block(b, l, h, blk, y), KVS_OK);
                size_t np = (size_t)x->n_pos;
                assert_int_equal(x->n_pos, y->n_pos);
                assert_memory_equal(x->q, y->q, np * (size_t)(G * d) * sizeof(float));
                assert_memory_equal(x->k, y->k, np * (size_t)d * sizeof(float));
                assert_memory_equal(x->v, y->v, np * (size_t)d * sizeof(float));
                if (compare_outputs) {
                    assert_memory_equal(x->o, y->o, np * (size_t)(G * d) * sizeof(float));
                    assert_memory_equal(x->lse, y->lse, np * (size_t)G * sizeof(float));
                }
            }
    kvs_trace_block_free(x);
    kvs_trace_block_free(y);
    kvs_trace_close(a);
    kvs_trace_close(b);
}

static void test_roundtrip(void **state) {
    (void)state;
    need("numpy");
    char dir[64], a[128], b[128];
    assert_int_equal(kvs_test_make_tmp(dir, sizeof dir), 0);
    run_case(dir, "roundtrip");
    static const char *const pairs[][2] = {{"cap", "py"},           {"cap_bf16", "py_bf16"},
                                           {"cap_fp32", "py_fp32"},   {"cap_fp16", "rounded_fp16"},
                                           {"cap_bf16", "rounded_bf16"}, {"cap_lean", "py_lean"}};
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        snprintf(a, sizeof a, "%s/%s.kvt", dir, pairs[i][0]);
        snprintf(b, sizeof b, "%s/%s.kvt", dir, pairs[i][1]);
        same_traces_c(a, b, 1); /* a lean pair: the C reader recomputes o/lse from equal q/k/v, equal too */
    }
    kvs_test_rm_rf(dir);
}

/* The hooks trace against the capture through the C reader: same header model fields and tokens (q/k/v/o differ
 * by the rounding of float64 vs fp32 values, which check_trace.py measures and bounds). */
static void test_hooks(void **state) {
    (void)state;
    if (kvs_test_sanitized()) { /* a PyTorch forward pass, the same under ASan; the C reader of Python-written
                                   traces runs under it in test_roundtrip */
        print_message("the PyTorch hooks reference runs in the plain suite: skipped under the sanitizers\n");
        skip();
    }
    need("numpy torch");
    char dir[64], a[160], b[160];
    assert_int_equal(kvs_test_make_tmp(dir, sizeof dir), 0);
    run_case(dir, "hooks");
    static const char *const models[] = {"stories260K", "tinystories-656K"};
    for (size_t i = 0; i < 2; i++) {
        snprintf(a, sizeof a, "%s/%s_cap.kvt", dir, models[i]);
        snprintf(b, sizeof b, "%s/%s_hooks.kvt", dir, models[i]);
        kvs_trace *ta = NULL, *tb = NULL;
        assert_int_equal(kvs_trace_open(a, &ta), KVS_OK);
        assert_int_equal(kvs_trace_open(b, &tb), KVS_OK);
        const kvs_trace_info *ia = kvs_trace_info_get(ta), *ib = kvs_trace_info_get(tb);
        assert_memory_equal(&ia->model, &ib->model, sizeof ia->model);
        assert_int_equal(ia->n_positions, ib->n_positions);
        assert_int_equal(ia->prompt_len, ib->prompt_len);
        assert_memory_equal(kvs_trace_tokens(ta), kvs_trace_tokens(tb), (size_t)ia->n_positions * sizeof(int32_t));
        assert_non_null(strstr(ib->capture.settings, "backend=pytorch-hooks"));
        kvs_trace_close(ta);
        kvs_trace_close(tb);
    }
    kvs_test_rm_rf(dir);
}

static void test_results(void **state) {
    (void)state;
    need("numpy");
    char dir[64];
    assert_int_equal(kvs_test_make_tmp(dir, sizeof dir), 0);
    run_case(dir, "results");
    kvs_test_rm_rf(dir);
}

static void test_corrupt(void **state) {
    (void)state;
    need("numpy");
    char dir[64], p[128];
    assert_int_equal(kvs_test_make_tmp(dir, sizeof dir), 0);
    run_case(dir, "corrupt");
    /* the small Python-written traces the case damaged open in kvsim's reader as written */
    snprintf(p, sizeof p, "%s/small_fp16_full.kvt", dir);
    kvs_trace *t = NULL;
    assert_int_equal(kvs_trace_open(p, &t), KVS_OK);
    assert_int_equal(kvs_trace_check_chunks(t), KVS_OK);
    assert_int_equal(kvs_trace_info_get(t)->n_turns, 2);
    kvs_trace_close(t);
    kvs_test_rm_rf(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_hooks),
        cmocka_unit_test(test_results),
        cmocka_unit_test(test_corrupt),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
