/* test_replay_codec.c — the replay with a codec (the representation stage, sim/host.h; kvs_replay_opts.codecs;
 * `kvsim replay --codec`) against an independent computation on a GENERATED trace (tests/util/gen_trace.h, seeded
 * Gaussian q/k/v, not a model): the rows dequantized by hand with kvs_codec_quant_group under the codec's time rule,
 * attended with the shared kvs_attention, the error against the full-precision full attention and the bytes counted
 * by hand; the identity of a codec run; bad --codec specs at the command line. The fast and the reference replay
 * with codecs are compared bit for bit in tests/test_replay_ref.c.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/kvs_math.h"
#include "sim/codec.h"
#include "sim/host.h"
#include "policies/registry.h"
#include "sim/policy.h"
#include "sim/replay.h"
#include "sim/replay_mem.h"
#include "tests/util/cli_run.h"
#include "tests/util/gen_trace.h"
#include "tests/util/replay_fixture.h"
#include "tests/util/testenv.h"

/* window at budget B under int:bits=4 (K token-axis groups of 32 positions, V channel-axis, one group per row of
 * d = 16), every metric mean recomputed: attention over the window's dequantized rows against the full-precision
 * full attention; storage per the codec's byte rule for the window's positions. */
static void test_window_int4_by_hand(void **state) {
    (void)state;
    kvs_gen_trace_opts go = kvs_test_grouped_opts(1, 2, 120, 50, 16, 3);
    kvs_test_replay_fixture f;
    assert_int_equal(kvs_test_replay_fixture_make(&go, 2, 11, &f), KVS_OK);
    kvs_replay_source src;
    assert_int_equal(kvs_replay_source_from_memory(&f.mem, &src), KVS_OK);
    kvs_codec *c = NULL;
    assert_int_equal(kvs_codec_parse("int:bits=4", &c), KVS_OK);
    const int64_t B = 20;
    kvs_replay_config cfg[2] = {{.budget = B, .budget_fraction = -1}, {.budget = B, .budget_fraction = -1}};
    assert_int_equal(kvs_policy_parse("window", &cfg[0].policy), KVS_OK);
    cfg[1] = cfg[0];
    const kvs_codec *codecs[2] = {c, NULL};
    kvs_replay_opts o = {.configs = cfg, .n_configs = 2, .threads = 2, .measure = KVS_MEASURE_DECODE, .codecs = codecs};
    kvs_replay_result *r = NULL;
    assert_int_equal(kvs_replay_execute(&src, &o, &r), KVS_OK);
    assert_int_equal(r->runs[0].status, KVS_OK);

    const int d = f.d, G = f.G, Hkv = f.Hkv, H = f.H;
    const int64_t N = f.N, P = f.turns[0].prompt_end;
    float *kq = malloc((size_t)N * d * sizeof(float)), *vq = malloc((size_t)N * d * sizeof(float));
    float *kr = malloc((size_t)N * d * sizeof(float)), *vr = malloc((size_t)N * d * sizeof(float));
    float *probs = malloc((size_t)N * sizeof(float)), out[64], ref[64];
    int32_t *idx = malloc((size_t)N * sizeof(int32_t));
    assert_true(kq && vq && kr && vr && probs && idx && d <= 64);
    double err_sum = 0, bytes_sum = 0, n_samples = 0;
    for (int l = 0; l < f.L; l++)
        for (int h = 0; h < Hkv; h++) {
            for (int64_t p = 0; p < N; p++) {
                memcpy(kr + p * d, f.g->k + (((size_t)l * N + p) * Hkv + h) * d, d * sizeof(float));
                memcpy(vr + p * d, f.g->v + (((size_t)l * N + p) * Hkv + h) * d, d * sizeof(float));
            }
            for (int64_t p = P; p < N; p++) {
                int64_t n = p + 1, qk = 32 * (n / 32); /* K: whole groups of 32 positions; V: every row (q = n) */
                memcpy(kq, kr, (size_t)n * d * sizeof(float));
                memcpy(vq, vr, (size_t)n * d * sizeof(float));
                for (int64_t j = 0; j < qk; j += 32)
                    for (int ch = 0; ch < d; ch++)
                        assert_int_equal(kvs_codec_quant_group(kr + j * d + ch, d, 32, 4, kq + j * d + ch, NULL, NULL),
                                         KVS_OK);
                for (int64_t j = 0; j < n; j++)
                    assert_int_equal(kvs_codec_quant_group(vr + j * d, 1, d, 4, vq + j * d, NULL, NULL), KVS_OK);
                int64_t lo = n - B > 0 ? n - B : 0, m = 0;
                for (int64_t j = lo; j < n; j++) idx[m++] = (int32_t)j;
                /* bytes: K quantized below qk (d/2 codes + d x 4 per resident group), 2d above; V d/2 + 4 each */
                double kb = 0, vb = (double)m * (d / 2.0 + 4.0);
                int64_t last_group = -1;
                for (int64_t j = lo; j < n; j++) {
                    if (j >= qk) kb += 2.0 * d;
                    else {
                        kb += d / 2.0;
                        if (j / 32 != last_group) kb += 4.0 * d, last_group = j / 32;
                    }
                }
                for (int g = 0; g < G; g++) {
                    const float *q = f.g->q + (((size_t)l * N + p) * H + (size_t)h * G + g) * d;
                    kvs_attention(q, kq, vq, d, idx, (size_t)m, d, f.scale, probs, out);
                    kvs_attention(q, kr, vr, d, NULL, (size_t)n, d, f.scale, probs, ref);
                    double e2 = 0, r2 = 0;
                    for (int i = 0; i < d; i++) e2 += ((double)ref[i] - out[i]) * ((double)ref[i] - out[i]),
                                                r2 += (double)ref[i] * ref[i];
                    err_sum += (float)sqrt(e2 / r2);
                    bytes_sum += kb + vb;
                    n_samples++;
                }
            }
        }
    const kvs_replay_run_result *x = &r->runs[0], *y = &r->runs[1];
    assert_true(x->run_agg.m[KVS_M_OUT_ERR].n == (int64_t)n_samples);
    assert_float_equal(x->run_agg.m[KVS_M_OUT_ERR].mean, err_sum / n_samples, 1e-6 * err_sum / n_samples);
    assert_float_equal(x->run_agg.m[KVS_M_STORAGE_KV].mean, bytes_sum / n_samples, 1e-6 * bytes_sum / n_samples);
    /* the codec costs accuracy and saves bytes against the same window as captured (2-byte elements) */
    assert_true(x->run_agg.m[KVS_M_OUT_ERR].mean > y->run_agg.m[KVS_M_OUT_ERR].mean);
    assert_true(x->run_agg.m[KVS_M_STORAGE_KV].mean < y->run_agg.m[KVS_M_STORAGE_KV].mean);
    assert_float_equal(y->run_agg.m[KVS_M_STORAGE_KV].mean, (double)B * 2 * d * 2, 1e-9);
    free(kq), free(vq), free(kr), free(vr), free(probs), free(idx);
    kvs_replay_result_free(r);
    kvs_codec_free(c);
    kvs_test_replay_fixture_free(&f);
}

/* A run's identity: a codec changes the seed, two spellings of one spec (same canonical) do not. */
static void test_identity_by_codec(void **state) {
    (void)state;
    kvs_codec *a = NULL, *b = NULL, *k = NULL;
    assert_int_equal(kvs_codec_parse("int:bits=4", &a), KVS_OK);
    assert_int_equal(kvs_codec_parse("int:v_axis=channel,group=32,bits=4", &b), KVS_OK);
    assert_int_equal(kvs_codec_parse("kivi", &k), KVS_OK);
    assert_string_equal(kvs_codec_spec(a), kvs_codec_spec(b));
    kvs_policy_config pc;
    assert_int_equal(kvs_policy_parse("window", &pc), KVS_OK);
    kvs_policy_model m = {.n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .group = 2, .head_dim = 16, .kv_bytes = 2,
                          .aux_bytes = 4};
    kvs_host_identity id = {.content_hash = "h", .policy = &pc, .budget = 16};
    uint64_t none = kvs_host_run_seed(&id, &m);
    id.codec = kvs_codec_spec(a);
    uint64_t sa = kvs_host_run_seed(&id, &m);
    id.codec = kvs_codec_spec(b);
    uint64_t sb = kvs_host_run_seed(&id, &m);
    id.codec = kvs_codec_spec(k);
    uint64_t sk = kvs_host_run_seed(&id, &m);
    assert_true(sa == sb);
    assert_true(sa != none && sk != none && sk != sa);
    kvs_codec_free(a), kvs_codec_free(b), kvs_codec_free(k);
}

/* The command line: runs per (policy, codec, budget) with the codec recorded and shown; bad specs exit 1 with the
 * codec module's message and nothing recorded. */
static void test_cli_codec(void **state) {
    (void)state;
    char dir[] = "/tmp/kvs_replay_codec_XXXXXX", db[128], out[160], err[160], trace[4096];
    assert_non_null(mkdtemp(dir));
    snprintf(db, sizeof db, "%s/r.db", dir);
    snprintf(out, sizeof out, "%s/out", dir);
    snprintf(err, sizeof err, "%s/err", dir);
    snprintf(trace, sizeof trace, "%s/examples/stories260K.kvt", kvs_test_root());
    static const char *const bad[] = {"int:bits=5", "nosuch", "kivi:residual=7", "int:bits=4,bits=4", ""};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char *argv[] = {"replay", trace, "--db", db, "--policy", "window", "--budgets", "32", "--codec",
                        (char *)bad[i], NULL};
        assert_int_equal(kvs_test_cli(out, err, (const char *const *)argv), 1);
        char *e = kvs_test_slurp(err, NULL);
        assert_non_null(strstr(e, "codec"));
        free(e);
        assert_true(access(db, F_OK) != 0);
    }
    char *argv[] = {"replay", trace, "--db", db, "--policy", "window", "--budgets", "32", "--codec", "none",
                    "--codec", "int:bits=4", "--codec", "int:group=32,bits=4", "--no-progress", NULL};
    assert_int_equal(kvs_test_cli(out, err, (const char *const *)argv), 0);
    char *o = kvs_test_slurp(out, NULL);
    assert_non_null(strstr(o, "[int:bits=4,group=32,k_axis=token,v_axis=channel]"));
    free(o);
    char *runs[] = {"runs", db, "--json", NULL};
    assert_int_equal(kvs_test_cli(out, err, (const char *const *)runs), 0);
    o = kvs_test_slurp(out, NULL);
    assert_non_null(strstr(o, "\"codec\":\"int:bits=4,group=32,k_axis=token,v_axis=channel\""));
    assert_non_null(strstr(o, "\"codec\":null"));
    int n_int = 0; /* the two spellings of one spec ran once */
    for (const char *q = o; (q = strstr(q, "\"codec\":\"int")) != NULL; q++) n_int++;
    assert_int_equal(n_int, 1);
    free(o);
    unlink(db), unlink(out), unlink(err);
    rmdir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_window_int4_by_hand),
        cmocka_unit_test(test_identity_by_codec),
        cmocka_unit_test(test_cli_codec),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
