/* test_verify.c — tests of trace/verify.h, the checks behind `kvsim verify` (trace/FORMAT.md "What verify
 * checks"; the bound's derivation is in trace/verify.c).
 *
 * Row by row, on rows built here: fp32 "capture" values q, k_j, v_j are drawn from a seeded generator, rounded
 * to the storage dtype (fp16, bf16, fp32) as a trace stores them, and the exact attention of the UNROUNDED
 * values is computed in long double. The bound kvs_verify_row_check() computes for the fp32 recomputation from
 * the stored values must contain the true error of that recomputation against the long double reference, for
 * the output and the lse, over many shapes, sharpnesses and dtypes, and must not be vacuous (the errors use a
 * sizeable part of it). A stored output or lse moved by more than the bound is reported outside it, one moved
 * by less inside. Edge cases: one position, zero rows (query, values, all), large and tiny magnitudes, NaN.
 * Whole traces (tests/util/gen_trace.h): a correct trace passes, a corrupted layer fails alone, the report is
 * the same for any number of workers and for a caller's pool, a lean trace's q/k/v scan. Bad arguments give
 * their status and message. All data is GENERATED, not a model's.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/kvs.h"
#include "common/threadpool.h"
#include "tests/util/gen_trace.h"
#include "tests/util/testenv.h"
#include "trace/trace.h"
#include "trace/verify.h"

/* ------------------------------------------------------------------------------------------------
 * Rows built here
 * ---------------------------------------------------------------------------------------------- */

enum { MAX_N = 1024, MAX_D = 64 };

/* splitmix64 and Box-Muller: seeded test data */
static uint64_t next_u64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double next_unit(uint64_t *s) { return ((double)(next_u64(s) >> 11) + 0.5) / 9007199254740992.0; }
static float next_gauss(uint64_t *s) {
    double u1 = next_unit(s), u2 = next_unit(s);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* x rounded to nearest in dtype dt, as the trace writer stores it */
static void round_to(kvs_dtype dt, const float *x, size_t n, float *out) {
    uint8_t buf[4 * MAX_D];
    for (size_t i = 0; i < n; i += MAX_D) {
        size_t m = n - i < MAX_D ? n - i : MAX_D;
        kvs_encode(dt, x + i, m, buf);
        kvs_decode(dt, buf, m, out + i);
    }
}

/* How a row's values are drawn: Gaussian times a scale per array; a zero scale gives a zero array. */
typedef struct {
    kvs_dtype dt;
    size_t n, d;
    float q_scale, k_scale, v_scale, v_shift; /* v = v_scale * gauss + v_shift (a common part of the values) */
    uint64_t seed;
} row_spec;

/* One row: the capture's fp32 values, what the trace stores, the long double reference, the recomputation. */
typedef struct {
    row_spec sp;
    float scale;
    float q[MAX_D], k[MAX_N * MAX_D], v[MAX_N * MAX_D];    /* the capture's fp32 values */
    float qs[MAX_D], ks[MAX_N * MAX_D], vs[MAX_N * MAX_D]; /* stored (rounded to sp.dt) */
    long double o_ref[MAX_D], lse_ref;                     /* exact attention of q, k, v */
    float o_st[MAX_D], lse_st;                             /* stored o~ = rd(o_ref), lse~ = fp32(lse_ref) */
    float scores[MAX_N], probs[MAX_N], out[MAX_D];         /* the fp32 recomputation from qs, ks, vs */
    double attn_lse;
} row_case;

static row_case *row_build(const row_spec *sp) {
    assert_true(sp->n >= 1 && sp->n <= MAX_N && sp->d >= 1 && sp->d <= MAX_D);
    row_case *c = calloc(1, sizeof *c);
    assert_non_null(c);
    c->sp = *sp;
    size_t n = sp->n, d = sp->d;
    c->scale = (float)(1.0 / sqrt((double)d));
    uint64_t rng = sp->seed;
    for (size_t i = 0; i < d; i++) c->q[i] = sp->q_scale * next_gauss(&rng);
    for (size_t i = 0; i < n * d; i++) c->k[i] = sp->k_scale * next_gauss(&rng);
    for (size_t i = 0; i < n * d; i++) c->v[i] = sp->v_scale * next_gauss(&rng) + sp->v_shift;
    round_to(sp->dt, c->q, d, c->qs);
    round_to(sp->dt, c->k, n * d, c->ks);
    round_to(sp->dt, c->v, n * d, c->vs);
    /* the reference: softmax(scale q.k_j) of the unrounded values, in long double */
    long double s[MAX_N], m = -INFINITY, sum = 0;
    for (size_t j = 0; j < n; j++) {
        long double dot = 0;
        for (size_t i = 0; i < d; i++) dot += (long double)c->q[i] * (long double)c->k[j * d + i];
        s[j] = (long double)c->scale * dot;
        if (s[j] > m) m = s[j];
    }
    for (size_t j = 0; j < n; j++) sum += expl(s[j] - m);
    c->lse_ref = m + logl(sum);
    float o32[MAX_D];
    for (size_t i = 0; i < d; i++) {
        long double acc = 0;
        for (size_t j = 0; j < n; j++) acc += expl(s[j] - m) * (long double)c->v[j * d + i];
        c->o_ref[i] = acc / sum;
        o32[i] = (float)c->o_ref[i];
    }
    round_to(sp->dt, o32, d, c->o_st);
    c->lse_st = (float)c->lse_ref;
    c->attn_lse = kvs_verify_attention(c->qs, c->ks, c->vs, n, d, c->scale, c->scores, c->probs, c->out);
    return c;
}

/* Judges the row with stored output o and lse (the row's own, or perturbed ones) by cfg. */
static kvs_verify_row_result row_judge(const row_case *c, const kvs_verify_cfg *cfg, const float *o, float lse) {
    size_t n = c->sp.n, d = c->sp.d;
    kvs_verify_ctx *w = NULL;
    assert_int_equal(kvs_verify_ctx_create(cfg, n, d, &w), KVS_OK);
    for (size_t j = 0; j < n; j++) assert_int_equal(kvs_verify_ctx_add_key(w, j, c->ks + j * d, c->vs + j * d), KVS_OK);
    kvs_verify_row row = {.n = n, .d = d, .scale = c->scale, .q = c->qs, .v = c->vs, .o = o, .lse = lse,
                          .scores = c->scores, .probs = c->probs, .out = c->out, .attn_lse = c->attn_lse};
    kvs_verify_row_result r;
    assert_int_equal(kvs_verify_row_check(w, &row, &r), KVS_OK);
    kvs_verify_ctx_free(w);
    return r;
}

static kvs_verify_cfg bound_cfg(kvs_dtype dt) {
    kvs_verify_cfg cfg;
    assert_int_equal(kvs_verify_cfg_init(dt, -1, -1, &cfg), KVS_OK);
    assert_false(cfg.fixed);
    return cfg;
}

/* ||o_ref - out||, the true error of the fp32 recomputation */
static double true_err_o(const row_case *c) {
    long double e = 0;
    for (size_t i = 0; i < c->sp.d; i++) {
        long double x = c->o_ref[i] - (long double)c->out[i];
        e += x * x;
    }
    return (double)sqrtl(e);
}

/* The row's stored values pass, and its bound contains the true errors of the recomputation against the long
 * double reference. *use receives the larger bound usage of the stored output and lse (the verdict's numbers). */
static void assert_bound_contains(const row_case *c, double *use) {
    kvs_verify_cfg cfg = bound_cfg(c->sp.dt);
    kvs_verify_row_result r = row_judge(c, &cfg, c->o_st, c->lse_st);
    double eo = true_err_o(c), el = (double)fabsl(c->lse_ref - (long double)c->attn_lse);
    if (!r.pass || !(eo <= r.bound_o) || !(el <= r.bound_lse) || !isfinite(r.bound_o) || !isfinite(r.bound_lse))
        fail_msg("dtype %s n %zu d %zu q x%g k x%g v x%g + %g seed %llu: pass %d; output: true error %.6g, stored "
                 "error %.6g, bound %.6g; lse: true error %.6g, stored error %.6g, bound %.6g",
                 kvs_dtype_name(c->sp.dt), c->sp.n, c->sp.d, (double)c->sp.q_scale, (double)c->sp.k_scale,
                 (double)c->sp.v_scale, (double)c->sp.v_shift, (unsigned long long)c->sp.seed, r.pass, eo, r.err_o,
                 r.bound_o, el, r.err_lse, r.bound_lse);
    assert_true(r.use_o <= 1 && r.use_lse <= 1);
    if (use) *use = fmax(r.use_o, r.use_lse);
}

/* ------------------------------------------------------------------------------------------------
 * The bound, row by row
 * ---------------------------------------------------------------------------------------------- */

/* Over shapes from 1 to 1000 keys, head_dims 1 to 64, near-uniform to sharp attention, values with and
 * without a common part, every dtype: the bound contains the true error, and it is not vacuous: in fp16 and
 * bf16 the stored rows' errors reach a sizeable part of it (measured 0.3-0.5; a bound 10 times too loose
 * fails here), in fp32 the summation-order allowance dominates (measured 0.02-0.05). */
static void test_bound_contains_true_error(void **state) {
    (void)state;
    static const size_t shapes[][2] = {{1, 16}, {2, 8}, {5, 1}, {37, 16}, {300, 64}, {1000, 8}};
    static const float q_scales[] = {0.1f, 1.0f, 4.0f};
    for (int dt = 0; dt < 3; dt++) {
        double use_max = 0;
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
            for (size_t qi = 0; qi < 3; qi++)
                for (uint64_t seed = 1; seed <= 3; seed++) {
                    row_spec sp = {.dt = (kvs_dtype)dt, .n = shapes[si][0], .d = shapes[si][1],
                                   .q_scale = q_scales[qi], .k_scale = 1, .v_scale = 1,
                                   .v_shift = seed == 3 ? 4.0f : 0.0f, .seed = seed * 1000 + si * 10 + qi};
                    row_case *c = row_build(&sp);
                    double use;
                    assert_bound_contains(c, &use);
                    use_max = fmax(use_max, use);
                    free(c);
                }
        double lo = dt == KVS_DTYPE_F32 ? 5e-3 : 0.1;
        if (!(use_max > lo)) fail_msg("dtype %s: largest bound usage %g, at most %g", kvs_dtype_name((kvs_dtype)dt),
                                      use_max, lo);
    }
}

/* Stored output o' + c e (e a unit vector, c a multiple of the row's bound) and lse lse' + c: twice the bound is
 * outside, half of it inside, in every dtype and sharpness. */
static void test_perturbation_beyond_bound_fails(void **state) {
    (void)state;
    for (int dt = 0; dt < 3; dt++)
        for (int qi = 0; qi < 3; qi++) {
            row_spec sp = {.dt = (kvs_dtype)dt, .n = 50, .d = 16, .q_scale = qi == 0 ? 0.2f : qi == 1 ? 1.0f : 5.0f,
                           .k_scale = 1, .v_scale = 1, .seed = 77 + (uint64_t)qi};
            row_case *c = row_build(&sp);
            kvs_verify_cfg cfg = bound_cfg(sp.dt);
            kvs_verify_row_result r0 = row_judge(c, &cfg, c->o_st, c->lse_st);
            assert_true(r0.pass);
            float dir[MAX_D], o[MAX_D];
            double norm = 0;
            uint64_t rng = 5;
            for (size_t i = 0; i < sp.d; i++) dir[i] = next_gauss(&rng), norm += (double)dir[i] * dir[i];
            for (int k = 0; k < 2; k++) {
                double f = k == 0 ? 2.0 : 0.5;
                for (size_t i = 0; i < sp.d; i++)
                    o[i] = (float)((double)c->out[i] + f * r0.bound_o * dir[i] / sqrt(norm));
                kvs_verify_row_result r = row_judge(c, &cfg, o, (float)c->attn_lse);
                if (r.pass != (k == 1))
                    fail_msg("dtype %d q x%g: output moved by %g x its bound (%g): pass %d, error %g, bound %g", dt,
                             (double)sp.q_scale, f, r0.bound_o, r.pass, r.err_o, r.bound_o);
                assert_true(k == 0 ? r.use_o > 1 : r.use_o < 1);
                r = row_judge(c, &cfg, c->out, (float)(c->attn_lse + f * r0.bound_lse));
                if (r.pass != (k == 1))
                    fail_msg("dtype %d q x%g: lse moved by %g x its bound (%g): pass %d, error %g, bound %g", dt,
                             (double)sp.q_scale, f, r0.bound_lse, r.pass, r.err_lse, r.bound_lse);
                assert_true(k == 0 ? r.use_lse > 1 : r.use_lse < 1);
            }
            free(c);
        }
}

/* One position: the probability is 1, the output the one value row, the lse the one score. */
static void test_one_position(void **state) {
    (void)state;
    for (int dt = 0; dt < 3; dt++) {
        row_spec sp = {.dt = (kvs_dtype)dt, .n = 1, .d = 16, .q_scale = 3, .k_scale = 1, .v_scale = 2, .seed = 9};
        row_case *c = row_build(&sp);
        assert_true(c->probs[0] == 1.0f);
        assert_memory_equal(c->out, c->vs, sp.d * sizeof(float));
        assert_bound_contains(c, NULL);
        kvs_verify_cfg cfg = bound_cfg(sp.dt);
        float o[MAX_D];
        memcpy(o, c->o_st, sizeof o);
        o[3] = -o[3] + 1.0f; /* another row's value */
        assert_false(row_judge(c, &cfg, o, c->lse_st).pass);
        free(c);
    }
}

/* A zero query (uniform attention, lse = log n), zero values (output 0, error 0), everything zero; a stored
 * output of zeros where the true one is not is outside any bound. */
static void test_zero_rows(void **state) {
    (void)state;
    for (int dt = 0; dt < 3; dt++) {
        row_spec sp = {.dt = (kvs_dtype)dt, .n = 20, .d = 8, .q_scale = 0, .k_scale = 1, .v_scale = 1, .seed = 3};
        row_case *c = row_build(&sp);
        for (size_t j = 0; j < sp.n; j++) assert_true(fabsf(c->probs[j] - 1.0f / 20) < 1e-6f);
        assert_true(fabs(c->attn_lse - log(20.0)) < 1e-6);
        assert_bound_contains(c, NULL);
        kvs_verify_cfg cfg = bound_cfg(sp.dt);
        float zero[MAX_D] = {0};
        kvs_verify_row_result r = row_judge(c, &cfg, zero, c->lse_st);
        assert_false(r.pass);
        assert_true(r.rel == INFINITY); /* ||o~|| = 0: relative error +inf */
        free(c);

        sp.q_scale = 1, sp.v_scale = 0;
        c = row_build(&sp);
        r = row_judge(c, &cfg, c->o_st, c->lse_st);
        assert_true(r.pass);
        assert_true(r.err_o == 0 && r.rel == 0 && r.use_o == 0);
        assert_bound_contains(c, NULL);
        free(c);

        sp.q_scale = 0, sp.k_scale = 0;
        c = row_build(&sp);
        r = row_judge(c, &cfg, c->o_st, c->lse_st);
        assert_true(r.pass && r.use_o == 0);
        assert_bound_contains(c, NULL);
        free(c);
    }
}

/* Large magnitudes: scores spread over hundreds (most probabilities underflow to 0), values near the top of
 * the dtype's range (fp16: up to 65504) and far beyond fp16 for bf16 and fp32 (1e30); tiny magnitudes in the
 * subnormal range of fp16. The bound stays finite, contains the error, and catches a perturbation of twice
 * its size. */
static void test_large_and_tiny_magnitudes(void **state) {
    (void)state;
    for (int dt = 0; dt < 3; dt++)
        for (int k = 0; k < 3; k++) {
            float big = dt == KVS_DTYPE_F16 ? 8000.0f : 1e30f;
            row_spec sp = {.dt = (kvs_dtype)dt, .n = 64, .d = 16, .seed = 40 + (uint64_t)k};
            if (k == 0) sp.q_scale = 1, sp.k_scale = 1, sp.v_scale = big; /* large values */
            if (k == 1) sp.q_scale = 12, sp.k_scale = 12, sp.v_scale = 1; /* sharp: scores up to ~500 */
            if (k == 2) sp.q_scale = 1, sp.k_scale = 1, sp.v_scale = 3e-6f; /* tiny values (fp16 subnormal) */
            if (dt == KVS_DTYPE_F16 && k == 1) sp.q_scale = sp.k_scale = 6; /* scores that fp16 error keeps finite */
            row_case *c = row_build(&sp);
            assert_bound_contains(c, NULL);
            kvs_verify_cfg cfg = bound_cfg(sp.dt);
            kvs_verify_row_result r0 = row_judge(c, &cfg, c->o_st, c->lse_st);
            assert_true(isfinite(r0.bound_o) && isfinite(r0.bound_lse));
            float o[MAX_D];
            memcpy(o, c->out, sizeof o);
            o[0] = (float)((double)o[0] + 2 * r0.bound_o);
            kvs_verify_row_result r = row_judge(c, &cfg, o, (float)c->attn_lse);
            if (r.pass) fail_msg("dtype %d case %d: output moved by twice its bound %g passes", dt, k, r0.bound_o);
            free(c);
        }
}

/* NaN in a stored output or lse never passes, and its error reads +inf. */
static void test_nan_never_passes(void **state) {
    (void)state;
    row_spec sp = {.dt = KVS_DTYPE_F16, .n = 10, .d = 8, .q_scale = 1, .k_scale = 1, .v_scale = 1, .seed = 8};
    row_case *c = row_build(&sp);
    for (int fixed = 0; fixed < 2; fixed++) {
        kvs_verify_cfg cfg;
        assert_int_equal(kvs_verify_cfg_init(sp.dt, fixed ? 1e30 : -1, -1, &cfg), KVS_OK);
        float o[MAX_D];
        memcpy(o, c->o_st, sizeof o);
        o[2] = NAN;
        kvs_verify_row_result r = row_judge(c, &cfg, o, c->lse_st);
        assert_false(r.pass);
        assert_true(r.rel == INFINITY && r.err_o == INFINITY);
        r = row_judge(c, &cfg, c->o_st, NAN);
        assert_false(r.pass);
        assert_true(r.err_lse == INFINITY);
    }
    free(c);
}

/* Fixed tolerances: the relative output error and the absolute lse error against the given numbers; usage =
 * error / tolerance, 0 for an exact match even with a zero tolerance. */
static void test_fixed_tolerances(void **state) {
    (void)state;
    kvs_verify_cfg cfg;
    assert_int_equal(kvs_verify_cfg_init(KVS_DTYPE_BF16, 0.25, -1, &cfg), KVS_OK); /* one sets both */
    assert_true(cfg.fixed && cfg.tol == 0.25 && cfg.lse_tol == 0.25);
    assert_int_equal(kvs_verify_cfg_init(KVS_DTYPE_F16, -1, 1e-3, &cfg), KVS_OK); /* output at 128 u */
    assert_true(cfg.fixed && cfg.tol == 128.0 / 2048 && cfg.lse_tol == 1e-3);
    assert_int_equal(kvs_verify_cfg_init(KVS_DTYPE_F32, -1, 1e-3, &cfg), KVS_OK);
    assert_true(cfg.tol == 1e-4);
    assert_int_equal(kvs_verify_cfg_init(KVS_DTYPE_F32, NAN, -1, &cfg), KVS_ERR_INVALID_ARG);
    assert_string_equal(kvs_last_error(), "verify: tolerance is NaN");
    assert_int_equal(kvs_verify_cfg_init(KVS_DTYPE_F32, -1, NAN, &cfg), KVS_ERR_INVALID_ARG);
    assert_string_equal(kvs_last_error(), "verify: lse tolerance is NaN");

    row_spec sp = {.dt = KVS_DTYPE_F16, .n = 30, .d = 8, .q_scale = 1, .k_scale = 1, .v_scale = 1, .seed = 4};
    row_case *c = row_build(&sp);
    assert_int_equal(kvs_verify_cfg_init(sp.dt, 0, 0, &cfg), KVS_OK);
    kvs_verify_row_result r = row_judge(c, &cfg, c->out, (float)c->attn_lse);
    assert_true(r.rel == 0 && r.use_o == 0 && r.pass == (r.err_lse == 0)); /* lse: float of a double */
    r = row_judge(c, &cfg, c->o_st, c->lse_st);
    assert_true(r.rel > 0);
    assert_false(r.pass);
    double rel = r.rel, el = r.err_lse;
    assert_int_equal(kvs_verify_cfg_init(sp.dt, rel, el, &cfg), KVS_OK); /* exactly at the tolerance: passes */
    r = row_judge(c, &cfg, c->o_st, c->lse_st);
    assert_true(r.pass && r.use_o == 1 && r.bound_o == rel && r.bound_lse == el);
    assert_int_equal(kvs_verify_cfg_init(sp.dt, rel / 2, el * 4, &cfg), KVS_OK);
    r = row_judge(c, &cfg, c->o_st, c->lse_st);
    assert_false(r.pass);
    assert_true(r.use_o == 2 && r.use_lse == 0.25);
    free(c);
}

static void test_dtype_rounding(void **state) {
    (void)state;
    double u, eta;
    kvs_verify_dtype_rounding(KVS_DTYPE_F16, &u, &eta);
    assert_true(u == ldexp(1, -11) && eta == ldexp(1, -25));
    kvs_verify_dtype_rounding(KVS_DTYPE_BF16, &u, &eta);
    assert_true(u == ldexp(1, -8) && eta == ldexp(1, -134));
    kvs_verify_dtype_rounding(KVS_DTYPE_F32, &u, &eta);
    assert_true(u == ldexp(1, -24) && eta == ldexp(1, -150));
    /* and they are what the encoder does: every rounded value within u |x~| + eta */
    uint64_t rng = 12;
    for (int dt = 0; dt < 3; dt++) {
        kvs_verify_dtype_rounding((kvs_dtype)dt, &u, &eta);
        for (int i = 0; i < 10000; i++) {
            float x = next_gauss(&rng) * (float)ldexp(1, (int)(next_u64(&rng) % 60) - 40), xs;
            round_to((kvs_dtype)dt, &x, 1, &xs);
            if (!(fabs((double)x - xs) <= u * fabs((double)xs) + eta))
                fail_msg("%s: %a stored as %a", kvs_dtype_name((kvs_dtype)dt), (double)x, (double)xs);
        }
    }
}

static void test_row_bad_arguments(void **state) {
    (void)state;
    kvs_verify_cfg cfg = bound_cfg(KVS_DTYPE_F16);
    kvs_verify_ctx *w = NULL;
    assert_int_equal(kvs_verify_ctx_create(&cfg, 0, 8, &w), KVS_ERR_INVALID_ARG);
    assert_string_equal(kvs_last_error(), "verify: scratch of 0 keys x 8");
    assert_null(w);
    assert_int_equal(kvs_verify_ctx_create(NULL, 4, 8, &w), KVS_ERR_INVALID_ARG);
    assert_string_equal(kvs_last_error(), "verify: scratch of 4 keys x 8 without a configuration");
    assert_int_equal(kvs_verify_ctx_create(&cfg, 2, 8, &w), KVS_OK);
    float k[8] = {1}, v[8] = {1}, o[8] = {1}, p[2] = {0.5f, 0.5f};
    assert_int_equal(kvs_verify_ctx_add_key(w, 1, k, v), KVS_ERR_RANGE);
    assert_string_equal(kvs_last_error(), "verify: key 1 added after 0 keys (room for 2)");
    assert_int_equal(kvs_verify_ctx_add_key(w, 0, k, v), KVS_OK);
    kvs_verify_row row = {.n = 2, .d = 8, .scale = 1, .q = k, .v = v, .o = o, .scores = p, .probs = p, .out = o};
    kvs_verify_row_result r;
    assert_int_equal(kvs_verify_row_check(w, &row, &r), KVS_ERR_RANGE);
    assert_string_equal(kvs_last_error(), "verify: row over 2 keys, 1 added");
    row.n = 1, row.d = 4;
    assert_int_equal(kvs_verify_row_check(w, &row, &r), KVS_ERR_INVALID_ARG);
    assert_string_equal(kvs_last_error(), "verify: row of 1 keys x 4 (the scratch's head_dim: 8)");
    row.d = 8, row.scores = NULL;
    assert_int_equal(kvs_verify_row_check(w, &row, &r), KVS_ERR_INVALID_ARG);
    assert_string_equal(kvs_last_error(), "verify: row check: NULL array");
    assert_int_equal(kvs_verify_ctx_add_key(w, 1, k, v), KVS_OK);
    assert_int_equal(kvs_verify_ctx_add_key(w, 2, k, v), KVS_ERR_RANGE);
    assert_string_equal(kvs_last_error(), "verify: key 2 added after 2 keys (room for 2)");
    kvs_verify_ctx_free(w);
    kvs_verify_ctx_free(NULL);
}

/* ------------------------------------------------------------------------------------------------
 * Whole traces
 * ---------------------------------------------------------------------------------------------- */

/* Writes a generated trace: 3 layers, 8 query heads, 2 KV heads, d 16, 45 positions in blocks of 8. */
static void write_trace(const char *path, kvs_dtype dt, int corrupt_layer, uint32_t flags, int inf_at) {
    kvs_gen_trace_opts o = kvs_gen_trace_defaults();
    o.n_layers = 3, o.n_heads = 8, o.n_kv_heads = 2, o.n_positions = 45, o.block_positions = 8;
    o.dtype = dt, o.corrupt_o_layer = corrupt_layer, o.flags |= flags, o.seed = 21;
    kvs_gen_trace *g = NULL;
    assert_int_equal(kvs_gen_trace_create(&o, &g), KVS_OK);
    if (inf_at >= 0) g->k[inf_at] = INFINITY;
    assert_int_equal(kvs_gen_trace_write(g, path), KVS_OK);
    kvs_gen_trace_free(g);
}

static kvs_verify_report *verify_path(const char *path, const kvs_verify_options *vo) {
    kvs_trace *t = NULL;
    assert_int_equal(kvs_trace_open(path, &t), KVS_OK);
    kvs_verify_report *r = NULL;
    kvs_status s = kvs_trace_verify(t, vo, &r);
    if (s != KVS_OK) fail_msg("kvs_trace_verify: %s", kvs_last_error());
    kvs_trace_close(t);
    return r;
}

static void assert_same_report(const kvs_verify_report *a, const kvs_verify_report *b) {
    assert_int_equal(a->n_layers, b->n_layers);
    assert_int_equal(a->n_kv_heads, b->n_kv_heads);
    assert_int_equal(a->n_fail, b->n_fail);
    assert_int_equal(a->n_errors, b->n_errors);
    assert_true(a->max_usage == b->max_usage);
    assert_memory_equal(a->streams, b->streams, (size_t)(a->n_layers * a->n_kv_heads) * sizeof *a->streams);
}

/* A correct trace passes in every dtype; with layer 1's outputs another position's, layer 1 fails on every row
 * and the others pass; the report is the same for 1, 2, 3 and 6 workers and on a caller's pool of 4. */
static void test_trace_verify_any_thread_count(void **state) {
    kvs_test_tmp *c = *state;
    for (int dt = 0; dt < 3; dt++)
        for (int corrupt = -1; corrupt <= 1; corrupt += 2) {
            write_trace(c->path, (kvs_dtype)dt, corrupt, 0, -1);
            kvs_verify_options vo = kvs_verify_options_default();
            vo.threads = 1;
            kvs_verify_report *one = verify_path(c->path, &vo);
            assert_false(one->lean);
            assert_false(one->cfg.fixed);
            assert_int_equal(one->dtype, dt);
            assert_int_equal(one->n_chunks, 3 * 2 * 6 + 6);
            assert_int_equal(one->n_errors, 0);
            for (int l = 0; l < 3; l++) {
                kvs_verify_layer a;
                assert_int_equal(kvs_verify_report_layer(one, l, &a), KVS_OK);
                assert_int_equal(a.n_fail, l == corrupt ? 45 * 8 : 0);
                if (l != corrupt) assert_true(a.use_o <= 1 && a.use_lse <= 1 && a.worst_pos >= 0);
            }
            assert_int_equal(one->n_fail, corrupt >= 0 ? 45 * 8 : 0);
            if (corrupt < 0) assert_true(one->max_usage > 0 && one->max_usage <= 1);
            static const int counts[] = {2, 3, 6};
            for (int i = 0; i < 3; i++) {
                vo.threads = counts[i];
                kvs_verify_report *r = verify_path(c->path, &vo);
                assert_same_report(one, r);
                kvs_verify_report_free(r);
            }
            kvs_threadpool *pool = NULL;
            assert_int_equal(kvs_threadpool_create(4, &pool), KVS_OK);
            vo.pool = pool;
            kvs_verify_report *r = verify_path(c->path, &vo);
            assert_same_report(one, r);
            kvs_verify_report_free(r);
            kvs_threadpool_free(pool);
            kvs_verify_report_free(one);
        }
}

/* Fixed tolerances through the options: a loose one accepts the corrupted layer, a tight one rejects it. */
static void test_trace_verify_fixed(void **state) {
    kvs_test_tmp *c = *state;
    write_trace(c->path, KVS_DTYPE_F16, 1, 0, -1);
    kvs_verify_options vo = kvs_verify_options_default();
    vo.tolerance = 100;
    kvs_verify_report *r = verify_path(c->path, &vo);
    assert_true(r->cfg.fixed && r->cfg.tol == 100 && r->cfg.lse_tol == 100);
    assert_int_equal(r->n_fail, 0);
    kvs_verify_report_free(r);
    vo.tolerance = 0.05; /* 50 u: the correct layers' errors are a few u */
    r = verify_path(c->path, &vo);
    kvs_verify_layer a;
    assert_int_equal(kvs_verify_report_layer(r, 1, &a), KVS_OK);
    assert_true(a.n_fail > 0);
    assert_int_equal(r->n_fail, a.n_fail);
    kvs_verify_report_free(r);
}

/* A lean trace: no streams, every stored q/k/v value counted, a non-finite one found with its place. */
static void test_trace_verify_lean(void **state) {
    kvs_test_tmp *c = *state;
    write_trace(c->path, KVS_DTYPE_F16, -1, KVS_TRACE_FLAG_QKV, -1);
    kvs_verify_report *r = verify_path(c->path, NULL);
    assert_true(r->lean);
    assert_null(r->streams);
    assert_int_equal(r->lean_status, KVS_OK);
    assert_int_equal(r->lean_values, 3 * 45 * (8 + 2 * 2) * 16);
    assert_int_equal(r->lean_bad, 0);
    assert_int_equal(r->lean_first_pos, -1);
    kvs_verify_layer a;
    assert_int_equal(kvs_verify_report_layer(r, 0, &a), KVS_ERR_RANGE);
    assert_string_equal(kvs_last_error(), "verify: report layer 0: a lean trace's report has no layers");
    kvs_verify_report_free(r);
    /* k of layer 1, position 30, kv head 1, element 5 (gen_trace's k is [L][N][Hkv][d]) */
    write_trace(c->path, KVS_DTYPE_F16, -1, KVS_TRACE_FLAG_QKV, ((1 * 45 + 30) * 2 + 1) * 16 + 5);
    r = verify_path(c->path, NULL);
    assert_int_equal(r->lean_bad, 1);
    assert_int_equal(r->lean_first_layer, 1);
    assert_int_equal(r->lean_first_kv, 1);
    assert_int_equal(r->lean_first_pos, 30);
    kvs_verify_report_free(r);
}

static void test_trace_verify_bad_arguments(void **state) {
    kvs_test_tmp *c = *state;
    write_trace(c->path, KVS_DTYPE_BF16, -1, 0, -1);
    kvs_trace *t = NULL;
    assert_int_equal(kvs_trace_open(c->path, &t), KVS_OK);
    kvs_verify_report *r = NULL;
    kvs_verify_options vo = kvs_verify_options_default();
    vo.threads = 2000;
    assert_int_equal(kvs_trace_verify(t, &vo, &r), KVS_ERR_INVALID_ARG);
    assert_string_equal(kvs_last_error(), "verify: threads: 2000 is more than 1024");
    assert_null(r);
    vo = kvs_verify_options_default();
    vo.lse_tolerance = NAN;
    assert_int_equal(kvs_trace_verify(t, &vo, &r), KVS_ERR_INVALID_ARG);
    assert_string_equal(kvs_last_error(), "verify: lse tolerance is NaN");
    assert_int_equal(kvs_trace_verify(NULL, NULL, &r), KVS_ERR_INVALID_ARG);
    assert_string_equal(kvs_last_error(), "verify: NULL trace");
    assert_int_equal(kvs_trace_verify(t, NULL, NULL), KVS_ERR_INVALID_ARG);
    assert_int_equal(kvs_trace_verify(t, NULL, &r), KVS_OK);
    kvs_verify_layer a;
    assert_int_equal(kvs_verify_report_layer(r, 3, &a), KVS_ERR_RANGE);
    assert_string_equal(kvs_last_error(), "verify: report layer 3: no such layer");
    kvs_verify_report_free(r);
    kvs_verify_report_free(NULL);
    kvs_trace_close(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bound_contains_true_error),
        cmocka_unit_test(test_perturbation_beyond_bound_fails),
        cmocka_unit_test(test_one_position),
        cmocka_unit_test(test_zero_rows),
        cmocka_unit_test(test_large_and_tiny_magnitudes),
        cmocka_unit_test(test_nan_never_passes),
        cmocka_unit_test(test_fixed_tolerances),
        cmocka_unit_test(test_dtype_rounding),
        cmocka_unit_test(test_row_bad_arguments),
        cmocka_unit_test_setup_teardown(test_trace_verify_any_thread_count, kvs_test_tmp_setup, kvs_test_tmp_teardown),
        cmocka_unit_test_setup_teardown(test_trace_verify_fixed, kvs_test_tmp_setup, kvs_test_tmp_teardown),
        cmocka_unit_test_setup_teardown(test_trace_verify_lean, kvs_test_tmp_setup, kvs_test_tmp_teardown),
        cmocka_unit_test_setup_teardown(test_trace_verify_bad_arguments, kvs_test_tmp_setup, kvs_test_tmp_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
