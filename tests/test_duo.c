/* test_duo.c — DuoAttention (policies/duo.c with the trained gates from a pattern file, policies/duo_heuristic.c with
 * a labelled prompt-derived pattern; ../shared/POLICY_SPEC_2.md §2.5):
 *  - golden example G-DUO (a): the gates [[0.61, 0, 0.97, 0.68], [0.99, 0, 0.81, 1]] at sparsity 0.5 type layer 0
 *    {S, S, R, S} and layer 1 {R, S, R, R} (the tie at 0 broken by flat index); at n = 1000, n_s = 64, n_r = 256 the
 *    mean resident per KV head is 660 and the KV ratio 1.515152 (DU1 arithmetic), and threshold typing;
 *  - golden example G-DUO (b): lost mass and relative output error of the four (position, query head) probes, and
 *    ρ_OUTERR = 0.3432476, ρ_MASS = 0.4619312;
 *  - the pattern reader: clipping to [0, 1], and the exact errors for a wrong shape or a non-number;
 *  - through the engine on a generated trace with a pattern file: streaming heads attend exactly n_s + n_r (the first
 *    decode step too: the prefill kept sinks + the last n_r prompt positions, the new token evicts the oldest),
 *    retrieval heads every position, the types those of the file's lowest gates; ref_plus_one attends one more;
 *  - duo_heuristic's typing against ρ_OUTERR recomputed here naively (fp64 softmax and outputs from the generator's
 *    q/k/v) over the last prompt positions: the lowest half become streaming;
 *  - duo without a pattern file is rejected with a message that points at duo_heuristic.
 * Data: the spec's hand-set vectors or GENERATED Gaussian streams (tests/util/gen_trace.h), never a model's.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../policies/duo_internal.h"
#include "../policies/registry.h"
#include "../sim/policy.h"
#include "../sim/replay.h"
#include "../sim/replay_mem.h"
#include "util/replay_fixture.h"

static void close_rel(double got, double want, double rel) {
    double tol = fabs(want) * rel;
    if (tol < 1e-7) tol = 1e-7;
    if (fabs(got - want) > tol) fail_msg("got %.9g, want %.9g", got, want);
}

static void test_gduo_a_typing(void **state) {
    (void)state;
    const double gates[8] = {0.61, 0.00, 0.97, 0.68, 0.99, 0.00, 0.81, 1.00};
    const char want[8] = {1, 1, 0, 1, 0, 1, 0, 0};
    char str[8];
    assert_int_equal(kvs_duo_type(gates, 8, 0.5, -1.0, str), 4);
    assert_memory_equal(str, want, 8);
    /* DU1: mean resident per KV head at n = 1000, n_s + n_r = 320 */
    double n = 1000, win = 64 + 256, sum = 0;
    for (int c = 0; c < 8; c++) sum += str[c] ? (n < win ? n : win) : n;
    close_rel(sum / 8.0, 660.0, 1e-12);
    close_rel(n / (sum / 8.0), 1.515152, 1e-6);
    /* threshold typing: gates below 0.7 */
    const char want_t[8] = {1, 1, 0, 1, 0, 1, 0, 0};
    assert_int_equal(kvs_duo_type(gates, 8, 0.5, 0.7, str), 4);
    assert_memory_equal(str, want_t, 8);
    assert_int_equal(kvs_duo_type(gates, 8, 0.25, -1.0, str), 2); /* the two zeros, in flat order */
    assert_true(str[1] && str[5]);
    assert_int_equal(kvs_duo_type(gates, 8, 0.125, -1.0, str), 1); /* one of the tied zeros: the lower flat index */
    assert_true(str[1] && !str[5]);
    assert_int_equal(kvs_duo_type(gates, 8, 0.3125, -1.0, str), 3); /* 2.5 heads: a half rounds up */
    assert_true(str[1] && str[5] && str[0]);
}

static void test_gduo_b_probes(void **state) {
    (void)state;
    const float k[8][2] = {{-0.8f, -1.3f}, {-0.2f, 0.4f}, {1.1f, 0.1f}, {-0.6f, -0.8f},
                           {0.7f, 1.6f},   {0.3f, -1.2f}, {-1.0f, 1.6f}, {0.2f, -1.7f}};
    const float v[8][2] = {{-0.1f, -1.2f}, {-0.6f, -0.5f}, {-0.7f, 0.6f}, {-0.1f, -0.6f},
                           {0.4f, 0.8f},   {-1.6f, -0.3f}, {-1.0f, -0.2f}, {-1.3f, 0.0f}};
    const float q[2][2][2] = {{{0.0f, -0.3f}, {-1.0f, -0.4f}}, {{-1.1f, -1.4f}, {0.2f, -1.1f}}};
    const double mass_w[4] = {0.533395, 0.432034, 0.385688, 0.496607};
    const double err_w[4] = {0.730053, 0.361776, 0.138667, 0.142494};
    float scratch[64];
    double msum = 0, esum = 0;
    const float scale = (float)(1.0 / sqrt(2.0));
    for (int pi = 0; pi < 2; pi++) {
        assert_true(kvs_duo_probe_scratch(2, 2, 6 + pi) <= 64);
        double mg = 0, eg = 0; /* the group's two rows in one call: the sums of the one-row calls */
        for (int g = 0; g < 2; g++) {
            double m = 0, e = 0;
            kvs_duo_probe(q[pi][g], 1, &k[0][0], &v[0][0], 6 + pi, 2, scale, 1, 2, &m, &e, scratch);
            /* fp32 attention (the shared SIMD routines): the fp64 worked values to 1e-5, the rounding of 8 terms */
            close_rel(m, mass_w[pi * 2 + g], 1e-5);
            close_rel(e, err_w[pi * 2 + g], 1e-5);
            msum += m;
            esum += e;
            mg += m;
            eg += e;
        }
        double m2 = 0, e2 = 0;
        kvs_duo_probe(q[pi][0], 2, &k[0][0], &v[0][0], 6 + pi, 2, scale, 1, 2, &m2, &e2, scratch);
        assert_true(m2 == mg && e2 == eg);
    }
    close_rel(esum / 4.0, 0.3432476, 1e-5);
    close_rel(msum / 4.0, 0.4619312, 1e-5);
}

static void write_text(const char *path, const char *text) {
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    fputs(text, fp);
    fclose(fp);
}

static void test_pattern_reader(void **state) {
    (void)state;
    char path[64];
    snprintf(path, sizeof path, "/tmp/kvs_test_duo_%d.tsv", (int)getpid());
    double g[4];
    write_text(path, "1.5\t-0.2\n\n0.25 0.75\n");
    assert_int_equal(kvs_duo_read_pattern(path, 2, 2, g), KVS_OK);
    assert_true(g[0] == 1.0 && g[1] == 0.0 && g[2] == 0.25 && g[3] == 0.75);
    write_text(path, "0.1\t0.2\t0.3\n0.1 0.2\n");
    assert_int_equal(kvs_duo_read_pattern(path, 2, 2, g), KVS_ERR_FORMAT);
    assert_non_null(strstr(kvs_last_error(), "line 1: more than the model's 2 KV heads"));
    write_text(path, "0.1\t0.2\n0.1\n");
    assert_int_equal(kvs_duo_read_pattern(path, 2, 2, g), KVS_ERR_FORMAT);
    assert_non_null(strstr(kvs_last_error(), "line 2: 1 values, the model has 2 KV heads"));
    write_text(path, "0.1\t0.2\n");
    assert_int_equal(kvs_duo_read_pattern(path, 2, 2, g), KVS_ERR_FORMAT);
    assert_non_null(strstr(kvs_last_error(), ": 1 layers, the model has 2"));
    write_text(path, "0.1\tx\n0.1 0.2\n");
    assert_int_equal(kvs_duo_read_pattern(path, 2, 2, g), KVS_ERR_FORMAT);
    assert_non_null(strstr(kvs_last_error(), "line 1: not a number at column 2"));
    unlink(path);
    assert_int_equal(kvs_duo_read_pattern(path, 2, 2, g), KVS_ERR_IO);
    /* duo without a pattern: rejected, pointing at the labelled heuristic */
    kvs_policy_config cfg;
    kvs_policy_model m = {.n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .group = 2, .head_dim = 4, .scale = 0.5f};
    assert_int_equal(kvs_policy_parse("duo", &cfg), KVS_OK);
    assert_int_equal(kvs_policy_validate(&cfg, &m, 64), KVS_ERR_INVALID_ARG);
    assert_non_null(strstr(kvs_last_error(), "pattern=FILE is required"));
    assert_non_null(strstr(kvs_last_error(), "duo_heuristic"));
}

/* ---- through the engine ------------------------------------------------------------------------ */

enum { NL = 2, NKV = 4, NPOS = 120, PROMPT = 70, NS = 3, NR = 12 };

typedef struct {
    int64_t first[NL * NKV], last[NL * NKV];
} duo_rec;

static void duo_on_select(void *user, int config, int layer, int kv_head, int64_t pos, const kvs_policy_sel *sel) {
    duo_rec *r = user;
    (void)config;
    int c = layer * NKV + kv_head;
    if (pos == PROMPT) r->first[c] = sel->n[0];
    if (pos == NPOS - 1) r->last[c] = sel->n[0];
}

static void make_fixture(kvs_test_replay_fixture *f, uint64_t seed) {
    kvs_gen_trace_opts o = kvs_test_grouped_opts(1, 2, NPOS, PROMPT, 8, seed);
    o.n_layers = NL;
    o.n_kv_heads = NKV;
    o.n_heads = 2 * NKV;
    assert_int_equal(kvs_test_replay_fixture_make(&o, 2, 11, f), KVS_OK);
}

static void run(kvs_test_replay_fixture *f, const char *spec, duo_rec *rec) {
    kvs_policy_config cfg;
    if (kvs_policy_parse(spec, &cfg) != KVS_OK) fail_msg("%s: %s", spec, kvs_last_error());
    kvs_replay_hooks hooks = {.user = rec, .on_select = duo_on_select};
    kvs_replay_config rc = {.policy = cfg, .budget = 16, .budget_fraction = -1};
    kvs_replay_source src;
    assert_int_equal(kvs_replay_source_from_memory(&f->mem, &src), KVS_OK);
    kvs_replay_opts ro = {.configs = &rc, .n_configs = 1, .threads = 1, .measure = KVS_MEASURE_DECODE, .hooks = &hooks};
    kvs_replay_result *r = NULL;
    assert_int_equal(kvs_replay_execute(&src, &ro, &r), KVS_OK);
    if (r->runs[0].status != KVS_OK) fail_msg("%s: %s", spec, r->runs[0].error);
    kvs_replay_result_free(r);
}

static void test_pattern_file_through_the_engine(void **state) {
    (void)state;
    kvs_test_replay_fixture f;
    make_fixture(&f, 5);
    char path[64], spec[256];
    snprintf(path, sizeof path, "/tmp/kvs_test_duo_e_%d.tsv", (int)getpid());
    write_text(path, "0.9 0.1 0.6 0.2\n0.3 0.8 0.05 0.7\n"); /* lowest four: 0.05, 0.1, 0.2, 0.3 */
    const char want[NL * NKV] = {0, 1, 0, 1, 1, 0, 1, 0};
    for (int plus = 0; plus < 2; plus++) {
        duo_rec rec = {{0}, {0}};
        snprintf(spec, sizeof spec, "duo:pattern=%s,n_s=%d,n_r=%d,ref_plus_one=%d", path, NS, NR, plus);
        run(&f, spec, &rec);
        for (int c = 0; c < NL * NKV; c++) {
            int64_t w = NS + NR + plus;
            assert_int_equal(rec.first[c], want[c] ? w : PROMPT + 1);
            assert_int_equal(rec.last[c], want[c] ? w : NPOS);
        }
    }
    unlink(path);
    kvs_test_replay_fixture_free(&f);
}

/* ρ_OUTERR of one (layer, KV head) from the generator's arrays, written out without kvs_duo_probe. */
static double naive_outerr(const kvs_test_replay_fixture *f, int l, int kvh, int64_t probes) {
    double total = 0;
    int64_t n = 0;
    for (int64_t i = PROMPT - probes; i < PROMPT; i++)
        for (int g = 0; g < f->G; g++) {
            int h = kvh * f->G + g;
            const float *q = f->g->q + (((size_t)l * (size_t)f->N + (size_t)i) * (size_t)f->H + (size_t)h) * (size_t)f->d;
            double lg[NPOS], mx = -INFINITY, of[16] = {0}, os[16] = {0}, z = 0, zs = 0;
            for (int64_t j = 0; j <= i; j++) {
                const float *k =
                    f->g->k + (((size_t)l * (size_t)f->N + (size_t)j) * (size_t)f->Hkv + (size_t)kvh) * (size_t)f->d;
                lg[j] = 0;
                for (int t = 0; t < f->d; t++) lg[j] += (double)q[t] * (double)k[t];
                lg[j] *= (double)f->scale;
                mx = lg[j] > mx ? lg[j] : mx;
            }
            for (int64_t j = 0; j <= i; j++) {
                const float *v =
                    f->g->v + (((size_t)l * (size_t)f->N + (size_t)j) * (size_t)f->Hkv + (size_t)kvh) * (size_t)f->d;
                double e = exp(lg[j] - mx);
                int keep = j < NS || j >= i - NR + 1;
                z += e;
                zs += keep ? e : 0;
                for (int t = 0; t < f->d; t++) {
                    of[t] += e * v[t];
                    if (keep) os[t] += e * v[t];
                }
            }
            double num = 0, den = 0;
            for (int t = 0; t < f->d; t++) {
                num += (of[t] / z - os[t] / zs) * (of[t] / z - os[t] / zs);
                den += (of[t] / z) * (of[t] / z);
            }
            total += sqrt(num / den);
            n++;
        }
    return total / (double)n;
}

static void test_heuristic_types_the_lowest_outerr(void **state) {
    (void)state;
    kvs_test_replay_fixture f;
    make_fixture(&f, 9);
    const int64_t probes = 20;
    double rho[NL * NKV];
    for (int l = 0; l < NL; l++)
        for (int h = 0; h < NKV; h++) rho[l * NKV + h] = naive_outerr(&f, l, h, probes);
    char want[NL * NKV];
    /* the four lowest: count how many are below each */
    for (int c = 0; c < NL * NKV; c++) {
        int below = 0;
        for (int o = 0; o < NL * NKV; o++) below += rho[o] < rho[c] || (rho[o] == rho[c] && o < c);
        want[c] = below < 4;
    }
    duo_rec rec = {{0}, {0}};
    char spec[256];
    snprintf(spec, sizeof spec, "duo_heuristic:n_s=%d,n_r=%d,probe=%d", NS, NR, (int)probes);
    run(&f, spec, &rec);
    for (int c = 0; c < NL * NKV; c++) assert_int_equal(rec.last[c], want[c] ? NS + NR : NPOS);
    kvs_test_replay_fixture_free(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gduo_a_typing),
        cmocka_unit_test(test_gduo_b_probes),
        cmocka_unit_test(test_pattern_reader),
        cmocka_unit_test(test_pattern_file_through_the_engine),
        cmocka_unit_test(test_heuristic_types_the_lowest_outerr),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
