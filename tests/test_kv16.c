/* test_kv16.c — K/V kept in the trace's 16-bit form (sim/BENCH.md "K/V in 16 bits"; common/kvs_math_simd.h
 * scores16 / output_add16, common/kvs_math.h kvs_attention_group16 / kvs_attention_causal_block16, the replay
 * engine's 16-bit history):
 *  - every kernel table this CPU has (the scalar reference included), fp16 and bf16: the 16-bit entries equal the
 *    same table's fp32 entries on the rows' exact fp32 conversion, bit for bit (strides, index lists, head_dims
 *    with tails, more rows than one conversion tile, special values);
 *  - the same against an independent fp64 reference whose half/bfloat16 decoding is written here (ldexp), within
 *    the fp32 dot-product bound, so the vector variants are checked against the reference on every ISA;
 *  - the attention functions against their fp32 counterparts, bit for bit;
 *  - the replay's per-layer numbers with the 16-bit history (KVS_KV16=1) equal to the fp32 history's
 *    (KVS_KV16=0): every step sample bit for bit through the library (memory source, ten policies of every
 *    kind), and the per-layer table text for text on fp16 and bf16 trace files through the CLI;
 *  - trace/kv_stream.c's full attention from its 16-bit history against its fp32 one and kvs_attention().
 * Variants the CPU lacks are skipped, saying so.
 */
#include <math.h>
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
#include "common/kvs_math.h"
#include "common/kvs_math_simd.h"
#include "trace/kv_stream.h"
#include "sim/policy.h"
#include "policies/registry.h"
#include "sim/replay.h"
#include "sim/replay_mem.h"
#include "tests/util/cli_run.h"
#include "tests/util/gen_trace.h"
#include "tests/util/replay_fixture.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static float frand(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rng_state >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}

static const kvs_dtype dtypes[] = {KVS_DTYPE_F16, KVS_DTYPE_BF16};

/* Independent decoding of one 16-bit element (not common/kvs.c's): sign, exponent, mantissa by ldexp. Finite
 * values only (the fp64 check skips the rows with special values). */
static double half_value(uint16_t h, kvs_dtype t) {
    if (t == KVS_DTYPE_BF16) {
        int e = (h >> 7) & 0xff, m = h & 0x7f;
        double v = e ? ldexp(1.0 + m / 128.0, e - 127) : ldexp(m / 128.0, -126);
        return (h & 0x8000) ? -v : v;
    }
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v = e ? ldexp(1.0 + m / 1024.0, e - 15) : ldexp(m / 1024.0, -14);
    return (h & 0x8000) ? -v : v;
}

/* n random 16-bit elements of dtype t (amplitude amp) in h, and their exact fp32 conversion in f. Every 97th
 * element is a special value: +-0, subnormals, the largest finite fp16 (bf16: 65280; its largest would overflow the fp32 sums) (when `specials`). */
static void fill16(uint16_t *h, float *f, size_t n, kvs_dtype t, float amp, int specials) {
    static const uint16_t spec_f16[] = {0x0000, 0x8000, 0x0001, 0x8001, 0x03ff, 0x7bff};
    static const uint16_t spec_bf16[] = {0x0000, 0x8000, 0x0001, 0x8001, 0x007f, 0x477f};
    for (size_t i = 0; i < n; i++) {
        float x = amp * frand();
        h[i] = t == KVS_DTYPE_BF16 ? kvs_f32_to_bf16(x) : kvs_f32_to_f16(x);
        if (specials && i % 97 == 13) h[i] = (t == KVS_DTYPE_BF16 ? spec_bf16 : spec_f16)[(i / 97) % 6];
    }
    kvs_decode(t, h, n, f); /* little-endian bytes = the uint16_t values on x86 */
}

/* The tables to check: every variant this CPU has and the scalar reference (last). */
static int tables(const kvs_math_kernels **out) {
    int n = 0;
    for (int i = 1; i < KVS_ISA_COUNT; i++) {
        const kvs_math_kernels *k = kvs_math_kernels_for((kvs_isa)i);
        if (k) out[n++] = k;
        else print_message("variant %s: not available on this CPU, skipped\n", kvs_math_isa_name((kvs_isa)i));
    }
    out[n++] = kvs_math_kernels_for(KVS_ISA_SCALAR);
    return n;
}

#define F32_EPS 1.1920929e-7
static const size_t dims[] = {1, 3, 8, 13, 64, 67, 128, 1024};

static void test_scores16_equal_fp32_and_fp64(void **state) {
    (void)state;
    const kvs_math_kernels *v[KVS_ISA_COUNT];
    int nv = tables(v);
    enum { ROWS = 150, MAXR = 9 };
    const size_t ns[] = {1, 4, 7, 33, 70, 150};
    for (int k = 0; k < nv; k++)
        for (size_t ti = 0; ti < 2; ti++)
            for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
                size_t d = dims[di], stride = d + 3;
                kvs_dtype t = dtypes[ti];
                uint16_t *k16 = malloc(ROWS * stride * sizeof *k16);
                float *k32 = malloc(ROWS * stride * sizeof *k32), *q = malloc(MAXR * d * sizeof *q);
                float *got = malloc(MAXR * (ROWS + 2) * sizeof *got), *ref = malloc(MAXR * (ROWS + 2) * sizeof *ref);
                fill16(k16, k32, ROWS * stride, t, 2.0f, 1);
                for (size_t i = 0; i < MAXR * d; i++) q[i] = frand();
                int32_t idx[ROWS];
                for (int j = 0; j < ROWS; j++) idx[j] = (int32_t)((j * 37 + 11) % ROWS);
                for (size_t nr = 1; nr <= MAXR; nr += nr < 5 ? 1 : 4) /* 1..3: in registers; 4..: tiles */
                    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
                        for (int use_idx = 0; use_idx < 2; use_idx++) {
                            size_t n = ns[ni];
                            float *gr[MAXR], *rr[MAXR];
                            for (size_t r = 0; r < nr; r++) gr[r] = got + r * (ROWS + 2), rr[r] = ref + r * (ROWS + 2);
                            const int32_t *ix = use_idx ? idx : NULL;
                            v[k]->scores16(q, nr, k16, t, stride, ix, n, d, 0.125f, gr, 2);
                            v[k]->scores(q, nr, k32, stride, ix, n, d, 0.125f, rr, 2);
                            for (size_t r = 0; r < nr; r++) {
                                assert_memory_equal(gr[r] + 2, rr[r] + 2, n * sizeof(float));
                                for (size_t j = 0; j < n; j++) {
                                    const uint16_t *kr = k16 + (ix ? (size_t)ix[j] : j) * stride;
                                    double s = 0, mag = 0;
                                    for (size_t i = 0; i < d; i++) {
                                        double x = (double)q[r * d + i] * half_value(kr[i], t);
                                        s += x;
                                        mag += fabs(x);
                                    }
                                    double tol = (double)(d + 2) * F32_EPS * 0.125 * mag + 1e-30;
                                    if (!(fabs(gr[r][2 + j] - 0.125 * s) <= tol))
                                        fail_msg("%s %s d %zu row %zu key %zu: %.9g vs fp64 %.9g", v[k]->name,
                                                 kvs_dtype_name(t), d, r, j, gr[r][2 + j], 0.125 * s);
                                }
                            }
                        }
                free(k16);
                free(k32);
                free(q);
                free(got);
                free(ref);
            }
}

static void test_output_add16_equal_fp32_and_fp64(void **state) {
    (void)state;
    const kvs_math_kernels *v[KVS_ISA_COUNT];
    int nv = tables(v);
    enum { ROWS = 300, MAXR = 6 };
    const size_t ns[] = {1, 5, 64, 65, 300};
    for (int k = 0; k < nv; k++)
        for (size_t ti = 0; ti < 2; ti++)
            for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
                size_t d = dims[di], stride = d + 1;
                kvs_dtype t = dtypes[ti];
                uint16_t *v16 = malloc(ROWS * stride * sizeof *v16);
                float *v32 = malloc(ROWS * stride * sizeof *v32), *p = malloc(MAXR * (ROWS + 1) * sizeof *p);
                float *got = malloc(MAXR * d * sizeof *got), *ref = malloc(MAXR * d * sizeof *ref);
                fill16(v16, v32, ROWS * stride, t, 1.0f, 1);
                for (size_t i = 0; i < MAXR * (ROWS + 1); i++) p[i] = 0.5f * (frand() + 1.0f);
                int32_t idx[ROWS];
                for (int j = 0; j < ROWS; j++) idx[j] = (int32_t)((j * 11 + 5) % ROWS);
                for (size_t nr = 1; nr <= MAXR; nr += nr < 4 ? 1 : 2)
                    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
                        for (int use_idx = 0; use_idx < 2; use_idx++) {
                            size_t n = ns[ni];
                            const int32_t *ix = use_idx ? idx : NULL;
                            const float *pr[MAXR];
                            float *go[MAXR], *ro[MAXR];
                            for (size_t r = 0; r < nr; r++) {
                                pr[r] = p + r * (ROWS + 1);
                                go[r] = got + r * d;
                                ro[r] = ref + r * d;
                                for (size_t i = 0; i < d; i++) go[r][i] = ro[r][i] = 0.25f; /* they add */
                            }
                            v[k]->output_add16(pr, nr, 1, v16, t, stride, ix, n, d, go);
                            v[k]->output_add(pr, nr, 1, v32, stride, ix, n, d, ro);
                            assert_memory_equal(got, ref, nr * d * sizeof(float));
                            for (size_t r = 0; r < nr; r++)
                                for (size_t i = 0; i < d; i++) {
                                    double s = 0.25, mag = 0.25;
                                    for (size_t j = 0; j < n; j++) {
                                        double x = (double)pr[r][1 + j] *
                                                   half_value(v16[(ix ? (size_t)ix[j] : j) * stride + i], t);
                                        s += x;
                                        mag += fabs(x);
                                    }
                                    if (!(fabs(go[r][i] - s) <= (double)(n + 2) * F32_EPS * mag))
                                        fail_msg("%s %s d %zu n %zu: %.9g vs fp64 %.9g", v[k]->name, kvs_dtype_name(t),
                                                 d, n, go[r][i], s);
                                }
                        }
                free(v16);
                free(v32);
                free(p);
                free(got);
                free(ref);
            }
}

/* NaN and infinities in the rows: the 16-bit entries give the fp32 entries' bits (the conversion keeps them). */
static void test_kv16_special_values_as_fp32(void **state) {
    (void)state;
    const kvs_math_kernels *v[KVS_ISA_COUNT];
    int nv = tables(v);
    enum { D = 24, N = 8 };
    for (int k = 0; k < nv; k++)
        for (size_t ti = 0; ti < 2; ti++) {
            kvs_dtype t = dtypes[ti];
            uint16_t h[N * D];
            float f[N * D], q[D], s16[N], s32[N], o16[D] = {0}, o32[D] = {0}, p[N];
            fill16(h, f, N * D, t, 1.0f, 0);
            /* row 1: +inf, row 2: -inf, row 3: a NaN, in lanes and in the d % 8 tail */
            uint16_t inf = t == KVS_DTYPE_BF16 ? 0x7f80 : 0x7c00, nan = t == KVS_DTYPE_BF16 ? 0x7fc1 : 0x7e01;
            h[1 * D + 2] = inf;
            h[2 * D + 20] = (uint16_t)(inf | 0x8000);
            h[3 * D + 5] = nan;
            kvs_decode(t, h, N * D, f);
            for (int i = 0; i < D; i++) q[i] = frand();
            for (int j = 0; j < N; j++) p[j] = 0.1f * (float)(j + 1);
            float *r16 = s16, *r32 = s32, *or16 = o16, *or32 = o32;
            const float *pp = p;
            v[k]->scores16(q, 1, h, t, D, NULL, N, D, 1.0f, &r16, 0);
            v[k]->scores(q, 1, f, D, NULL, N, D, 1.0f, &r32, 0);
            assert_memory_equal(s16, s32, sizeof s16);
            assert_true(isnan(s16[3]));
            v[k]->output_add16(&pp, 1, 0, h, t, D, NULL, N, D, &or16);
            v[k]->output_add(&pp, 1, 0, f, D, NULL, N, D, &or32);
            assert_memory_equal(o16, o32, sizeof o16);
        }
}

/* kvs_attention_group16 / kvs_attention_causal_block16 against the fp32 functions, bit for bit (active table). */
static void test_attention16_equals_fp32(void **state) {
    (void)state;
    const size_t G = 4, nb = 6, p0 = 700, n = p0 + nb;
    const size_t ds[] = {13, 64, 128};
    for (size_t ti = 0; ti < 2; ti++)
        for (size_t di = 0; di < sizeof ds / sizeof ds[0]; di++) {
            size_t d = ds[di];
            kvs_dtype t = dtypes[ti];
            uint16_t *k16 = malloc(n * d * 2), *v16 = malloc(n * d * 2);
            float *k = malloc(n * d * sizeof *k), *v = malloc(n * d * sizeof *v), *q = malloc(nb * G * d * sizeof *q);
            float *pa = malloc(nb * G * n * sizeof *pa), *pb = malloc(nb * G * n * sizeof *pb);
            float *oa = malloc(nb * G * d * sizeof *oa), *ob = malloc(nb * G * d * sizeof *ob);
            fill16(k16, k, n * d, t, 1.0f, 0);
            fill16(v16, v, n * d, t, 1.0f, 0);
            for (size_t i = 0; i < nb * G * d; i++) q[i] = 3.0f * frand();
            float *ra[24], *rb[24], *qa[24], *qb[24];
            double la[24], lb[24];
            for (size_t r = 0; r < nb * G; r++) {
                ra[r] = pa + r * n, rb[r] = pb + r * n;
                qa[r] = oa + r * d, qb[r] = ob + r * d;
            }
            float *sa = malloc(nb * G * n * sizeof *sa), *sb = malloc(nb * G * n * sizeof *sb), *sra[24], *srb[24];
            for (size_t r = 0; r < nb * G; r++) sra[r] = sa + r * n, srb[r] = sb + r * n;
            kvs_attention_causal_block16(q, nb, G, k16, v16, t, d, p0, 0.2f, ra, qa, la, sra);
            kvs_attention_causal_block(q, nb, G, k, v, d, p0, 0.2f, rb, qb, lb, srb);
            for (size_t r = 0; r < nb * G; r++) {
                assert_memory_equal(sra[r], srb[r], (p0 + 1 + r / G) * sizeof(float)); /* the kept scores */
                assert_memory_equal(ra[r], rb[r], (p0 + 1 + r / G) * sizeof(float));
                assert_memory_equal(qa[r], qb[r], d * sizeof(float));
                assert_memory_equal(&la[r], &lb[r], sizeof(double));
            }
            int32_t idx[300];
            for (int j = 0; j < 300; j++) idx[j] = (int32_t)(j * 2 + (j % 3));
            kvs_attention_group16(q, G, k16, v16, t, d, idx, 300, d, 0.2f, ra, oa, la);
            kvs_attention_group(q, G, k, v, d, idx, 300, d, 0.2f, rb, ob, lb);
            for (size_t r = 0; r < G; r++) assert_memory_equal(ra[r], rb[r], 300 * sizeof(float));
            assert_memory_equal(oa, ob, G * d * sizeof(float));
            assert_memory_equal(la, lb, G * sizeof(double));
            /* from the last block position's kept 16-bit-path scores, the output over the 16-bit values: the same */
            const float *const *last = (const float *const *)(sra + (nb - 1) * G);
            kvs_attention_group16(q + (nb - 1) * G * d, G, k16, v16, t, d, idx, 300, d, 0.2f, rb, ob, NULL);
            kvs_attention_group_scored(last, G, v, v16, t, d, idx, 300, d, ra, oa);
            for (size_t r = 0; r < G; r++) assert_memory_equal(ra[r], rb[r], 300 * sizeof(float));
            assert_memory_equal(oa, ob, G * d * sizeof(float));
            free(sa);
            free(sb);
            free(k16);
            free(v16);
            free(k);
            free(v);
            free(q);
            free(pa);
            free(pb);
            free(oa);
            free(ob);
        }
}

/* ---- the replay engine's 16-bit history: the same numbers as the fp32 one ---- */

/* Policies of every kind: the prefix reuse (full), S_t lists shared by the group (window, h2o, snapkv, quest,
 * keydiff), an oracle (topk), per-query-head lists (adakv), merged slots (d2o), chunked prefill (rocketkv). */
static const char *const replay_specs[] = {"full", "window", "topk", "h2o", "snapkv", "quest", "keydiff", "adakv",
                                           "d2o", "rocketkv"};
#define N_SPECS (int)(sizeof replay_specs / sizeof replay_specs[0])

/* Replays the fixture's memory source, declared to carry `dt` values, with the history mode `kv16`; every
 * configuration at budgets 8 and 24, every position measured, every step in the series. */
static kvs_replay_result *replay_mode(const kvs_test_replay_fixture *f, kvs_dtype dt, int kv16, int threads) {
    static kvs_replay_config cfg[2 * N_SPECS];
    for (int i = 0; i < 2 * N_SPECS; i++) {
        assert_int_equal(kvs_policy_parse(replay_specs[i % N_SPECS], &cfg[i].policy), KVS_OK);
        cfg[i].budget = i < N_SPECS ? 8 : 24;
        cfg[i].budget_fraction = -1;
    }
    kvs_replay_source src;
    assert_int_equal(kvs_replay_source_from_memory(&f->mem, &src), KVS_OK);
    src.kv_dtype = (int32_t)dt;
    kvs_replay_opts o = {.configs = cfg, .n_configs = 2 * N_SPECS, .threads = threads, .measure = KVS_MEASURE_ALL,
                         .series_every = 1, .kv16 = kv16};
    kvs_replay_result *r = NULL;
    assert_int_equal(kvs_replay_execute(&src, &o, &r), KVS_OK);
    for (int i = 0; i < r->n_runs; i++)
        if (r->runs[i].status != KVS_OK) fail_msg("%s: %s", replay_specs[i % N_SPECS], r->runs[i].error);
    return r;
}

/* @return the number of (run, step) samples whose metrics differ in any bit between a and b. */
static int64_t steps_differing(const kvs_replay_result *a, const kvs_replay_result *b, int64_t *compared) {
    int64_t diff = 0;
    *compared = 0;
    assert_int_equal(a->n_runs, b->n_runs);
    for (int i = 0; i < a->n_runs; i++) {
        assert_int_equal(a->runs[i].n_steps, b->runs[i].n_steps);
        for (int64_t s = 0; s < a->runs[i].n_steps; s++) {
            const kvs_results_step *x = &a->runs[i].steps[s], *y = &b->runs[i].steps[s];
            assert_true(x->layer == y->layer && x->q_head == y->q_head && x->position == y->position);
            diff += memcmp(x->v, y->v, sizeof x->v) != 0;
            (*compared)++;
        }
    }
    return diff;
}

static void test_replay_16bit_history_same_numbers(void **state) {
    (void)state;
    kvs_gen_trace_opts o = kvs_test_grouped_opts(2, 4, 90, -1, 40, 5);
    for (size_t ti = 0; ti < 2; ti++) {
        kvs_dtype t = dtypes[ti];
        kvs_test_replay_fixture f;
        assert_int_equal(kvs_test_replay_fixture_make(&o, 2, 11, &f), KVS_OK);
        /* K/V as a trace of dtype t holds them: values of that dtype */
        size_t nkv = (size_t)f.L * (size_t)f.N * (size_t)f.Hkv * (size_t)f.d;
        uint16_t *h = malloc(nkv * sizeof *h);
        kvs_encode(t, f.g->k, nkv, h);
        kvs_decode(t, h, nkv, f.g->k);
        kvs_encode(t, f.g->v, nkv, h);
        kvs_decode(t, h, nkv, f.g->v);
        free(h);
        kvs_replay_result *a = replay_mode(&f, t, -1, 2), *b = replay_mode(&f, t, 1, 2);
        int64_t n, differ = steps_differing(a, b, &n);
        print_message("%s: %lld step samples compared, fp32 vs 16-bit history\n", kvs_dtype_name(t), (long long)n);
        assert_true(n > 10000);
        assert_int_equal(differ, 0);
        for (int i = 0; i < a->n_runs; i++) assert_int_equal(a->runs[i].max_attended, b->runs[i].max_attended);
        kvs_replay_result_free(a);
        kvs_replay_result_free(b);
        kvs_test_replay_fixture_free(&f);
    }
}

/* The mode is live: a source that declares fp16 but carries other floats is replayed on their fp16 rounding
 * with the 16-bit history (both histories hold the converted rows), so its numbers move; and KVS_KV16=0 in the
 * environment turns the default off. */
static void test_replay_16bit_history_is_used(void **state) {
    (void)state;
    kvs_gen_trace_opts o = kvs_test_grouped_opts(1, 2, 40, -1, 16, 9);
    kvs_test_replay_fixture f;
    assert_int_equal(kvs_test_replay_fixture_make(&o, 2, 11, &f), KVS_OK);
    kvs_replay_result *a = replay_mode(&f, KVS_DTYPE_F16, -1, 1), *b = replay_mode(&f, KVS_DTYPE_F16, 1, 1);
    int64_t n;
    assert_true(steps_differing(a, b, &n) > 0);
    kvs_replay_result *c = replay_mode(&f, KVS_DTYPE_F32, 1, 1); /* an fp32 source has no 16-bit history */
    assert_int_equal(steps_differing(a, c, &n), 0);
    setenv("KVS_KV16", "0", 1);
    kvs_replay_result *d = replay_mode(&f, KVS_DTYPE_F16, 0, 1);
    unsetenv("KVS_KV16");
    assert_int_equal(steps_differing(a, d, &n), 0);
    kvs_replay_result *e = replay_mode(&f, KVS_DTYPE_F16, 0, 1); /* the default: on */
    assert_int_equal(steps_differing(b, e, &n), 0);
    kvs_replay_result_free(a);
    kvs_replay_result_free(b);
    kvs_replay_result_free(c);
    kvs_replay_result_free(d);
    kvs_replay_result_free(e);
    kvs_test_replay_fixture_free(&f);
}

/* Through the CLI on trace files: the source's dtype comes from the trace header. `kvsim runs --all --csv` (one
 * row per run and layer, every metric's statistics) with KVS_KV16=0 and KVS_KV16=1 must be the same text, except
 * the cells that are not results (run ids, wall times, creation times). */
static char *runs_csv(const char *kv16, const char *trace, const char *dir) {
    char db[256], out[256], err[256];
    snprintf(db, sizeof db, "%s.kv16_%s.db", trace, kv16);
    snprintf(out, sizeof out, "%s/out", dir);
    snprintf(err, sizeof err, "%s/err", dir);
    setenv("KVS_KV16", kv16, 1);
    const char *args[] = {"replay", trace, "--db", db, "--policy", "full", "--policy", "window", "--policy", "topk",
                          "--policy", "h2o", "--policy", "quest", "--budgets", "8,24", NULL};
    int rc = kvs_test_cli(out, err, args);
    unsetenv("KVS_KV16");
    assert_int_equal(rc, 0);
    const char *rargs[] = {"runs", db, "--all", "--csv", NULL};
    assert_int_equal(kvs_test_cli(out, NULL, rargs), 0);
    char *text = NULL;
    size_t n = 0;
    assert_int_equal(kvs_read_file(out, &text, &n), KVS_OK);
    return text;
}

/* Splits one CSV line into at most `cap` fields in place (RFC 4180: a quoted field may hold commas; the quotes
 * are kept, enough for comparing). */
static int split_line(char *line, char **f, int cap) {
    int n = 0, quoted = 0;
    f[n++] = line;
    for (char *p = line; *p; p++) {
        if (*p == '"') quoted = !quoted;
        else if (*p == ',' && !quoted && n < cap) {
            *p = 0;
            f[n++] = p + 1;
        }
    }
    return n;
}

static int64_t csv_same_results(char *a, char *b) {
    enum { MAXF = 512 };
    char *la, *lb, *sa = NULL, *sb = NULL, *fa[MAXF], *fb[MAXF], *names[MAXF];
    int ncol = 0;
    int64_t cells = 0;
    for (int row = 0;; row++) {
        la = strtok_r(row ? NULL : a, "\n", &sa);
        lb = strtok_r(row ? NULL : b, "\n", &sb);
        assert_true((la == NULL) == (lb == NULL));
        if (!la) break;
        int na = split_line(la, fa, MAXF), nb = split_line(lb, fb, MAXF);
        assert_int_equal(na, nb);
        if (row == 0) {
            ncol = na;
            memcpy(names, fa, sizeof names);
        }
        for (int c = 0; c < na; c++) {
            const char *name = c < ncol ? names[c] : "";
            if (strstr(name, "run_id") || strstr(name, "wall") || strstr(name, "created_at")) continue;
            if (strcmp(fa[c], fb[c])) fail_msg("row %d column %s: '%s' (fp32 history) vs '%s' (16-bit)", row, name, fa[c], fb[c]);
            cells++;
        }
    }
    return cells;
}

static void test_cli_replay_16bit_history_same_numbers(void **state) {
    (void)state;
    if (!kvs_test_kvsim_bin()) {
        print_message("KVSIM_BIN is not set (run through `make test`): skipping CLI test\n");
        skip();
    }
    char dir[] = "/tmp/kvs_kv16_XXXXXX", trace[128], cmd[200];
    assert_non_null(mkdtemp(dir));
    for (size_t ti = 0; ti < 2; ti++) {
        snprintf(trace, sizeof trace, "%s/%s.kvt", dir, kvs_dtype_name(dtypes[ti]));
        kvs_gen_trace_opts o = kvs_gen_trace_defaults();
        o.n_positions = 120;
        o.prompt_len = 48;
        o.n_layers = 2;
        o.dtype = dtypes[ti];
        kvs_gen_trace *g = NULL;
        assert_int_equal(kvs_gen_trace_create(&o, &g), KVS_OK);
        assert_int_equal(kvs_gen_trace_write(g, trace), KVS_OK);
        kvs_gen_trace_free(g);
        char *a = runs_csv("0", trace, dir), *b = runs_csv("1", trace, dir);
        int64_t n = csv_same_results(a, b);
        print_message("%s trace: %lld result cells equal, KVS_KV16=0 vs 1\n", kvs_dtype_name(dtypes[ti]), (long long)n);
        assert_true(n > 1000);
        free(a);
        free(b);
    }
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

/* trace/kv_stream.c's full attention from its 16-bit history: the same probabilities, outputs and LSEs bit for bit as
 * from the fp32 history (KVS_KV16=0), and as kvs_attention() row by row on the rows the stream hands out. */
static void test_kv_stream_16bit_history_same_numbers(void **state) {
    (void)state;
    char dir[] = "/tmp/kvs_kv16s_XXXXXX", path[128], cmd[200];
    assert_non_null(mkdtemp(dir));
    for (size_t ti = 0; ti < 2; ti++) {
        snprintf(path, sizeof path, "%s/%s.kvt", dir, kvs_dtype_name(dtypes[ti]));
        kvs_gen_trace_opts o = kvs_gen_trace_defaults();
        o.n_positions = 150;
        o.n_layers = 1;
        o.dtype = dtypes[ti];
        kvs_gen_trace *g = NULL;
        assert_int_equal(kvs_gen_trace_create(&o, &g), KVS_OK);
        assert_int_equal(kvs_gen_trace_write(g, path), KVS_OK);
        kvs_gen_trace_free(g);
        kvs_trace *t = NULL;
        assert_int_equal(kvs_trace_open(path, &t), KVS_OK);
        kvs_kv_stream *a = NULL, *b = NULL;
        setenv("KVS_KV16", "0", 1);
        assert_int_equal(kvs_kv_stream_open(t, 0, 1, KVS_KV_STREAM_FULL_ATTN, &a), KVS_OK);
        unsetenv("KVS_KV16");
        assert_int_equal(kvs_kv_stream_open(t, 0, 1, KVS_KV_STREAM_FULL_ATTN, &b), KVS_OK);
        kvs_kv_pos pa, pb;
        int64_t n = 0;
        while (kvs_kv_stream_next(a, &pa) == KVS_OK) {
            assert_int_equal(kvs_kv_stream_next(b, &pb), KVS_OK);
            size_t G = (size_t)pa.group, d = (size_t)pa.head_dim, nc = (size_t)pa.n_ctx;
            assert_memory_equal(pa.k, pb.k, nc * d * sizeof(float));
            assert_memory_equal(pa.probs, pb.probs, G * nc * sizeof(float));
            assert_memory_equal(pa.out, pb.out, G * d * sizeof(float));
            assert_memory_equal(pa.attn_lse, pb.attn_lse, G * sizeof(double));
            float *pr = malloc(nc * sizeof *pr), *out = malloc(d * sizeof *out);
            for (size_t gi = 0; gi < G; gi++) {
                double l = kvs_attention(pb.q + gi * d, pb.k, pb.v, d, NULL, nc, d, pb.scale, pr, out);
                assert_memory_equal(pr, pb.probs + gi * nc, nc * sizeof *pr);
                assert_memory_equal(out, pb.out + gi * d, d * sizeof *out);
                assert_true(l == pb.attn_lse[gi]);
            }
            free(pr);
            free(out);
            n++;
        }
        assert_int_equal(n, 150);
        kvs_kv_stream_free(a);
        kvs_kv_stream_free(b);
        kvs_trace_close(t);
    }
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scores16_equal_fp32_and_fp64),
        cmocka_unit_test(test_output_add16_equal_fp32_and_fp64),
        cmocka_unit_test(test_kv16_special_values_as_fp32),
        cmocka_unit_test(test_attention16_equals_fp32),
        cmocka_unit_test(test_replay_16bit_history_same_numbers),
        cmocka_unit_test(test_replay_16bit_history_is_used),
        cmocka_unit_test(test_cli_replay_16bit_history_same_numbers),
        cmocka_unit_test(test_kv_stream_16bit_history_same_numbers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
