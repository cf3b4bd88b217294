/* verify.c — `kvsim verify`'s checks as library code (verify.h): the exact causal full attention of every row
 * recomputed in fp32 from a trace's stored q/k/v (common/kvs_math.h; ../shared/DESIGN.md "Capture"), each row
 * judged against its own rigorous rounding-error bound, derived below; the streams of a trace spread over a
 * common/threadpool.h pool; the checks of a lean trace. Trace layout and what verify promises: trace/FORMAT.md
 * ("Lean record", "What verify checks").
 *
 * The streams are read through kv_stream.h, the one (layer, KV head) iterator with its K/V history that the trace
 * analyses use too; the attention is recomputed here with the scores kept (kvs_verify_attention: common/kvs_math.h's
 * calls, in kvs_attention's order), which the bound needs.
 */
#include "verify.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/kvs_math.h"
#include "kv_stream.h"

/* The per-row error bound (the default check; fixed tolerances, `kvsim verify --tolerance / --lse-tolerance`,
 * replace it).
 *
 * What is compared. The capture computed in fp32 q, k_j, v_j (j <= p) and from them o and lse; the trace
 * holds q~ = rd(q), k~_j, v~_j, o~ = rd(o) rounded to nearest in the storage dtype, and lse in fp32. verify
 * recomputes in fp32, with kvs_math.h, s'_j = scale q~.k~_j, p' = softmax(s'), lse' and o' = Σ_j p'_j v~_j.
 * Rounding to nearest is rd(x) = x / (1 + δ), |δ| <= u (Higham, Accuracy and Stability of Numerical
 * Algorithms, eq. 2.5), plus an absolute η (half the smallest subnormal) where it underflows, so
 * |x − x~| <= u |x~| + η elementwise, in terms of the STORED value: fp16 u = 2^-11, η = 2^-25; bf16
 * u = 2^-8, η = 2^-134; fp32 u = 2^-24, η = 2^-150 (an fp32 trace of an fp32 model is not rounded at all;
 * u is kept as a margin). u32 = 2^-24 below is the unit roundoff of the arithmetic, γ_n = n u32/(1 − n u32).
 *
 * 1. Scores. Expanding (q~ + Δq).(k~ + Δk) − q~.k~ with A_j = Σ_i |q~_i||k~_ji|:
 *      |scale q.k_j − scale q~.k~_j| <= e_j = scale ((2u + u²) A_j + η (1 + u)(|q~|_1 + |k~_j|_1) + d η²).
 *    fp32 arithmetic moves a score by at most γ_{d+2} scale A_j (dot product of length d, then the scale;
 *    Higham §3.1), and exp(s − max) by a relative (|s'_j − m| + 4) u32 (the subtraction rounds relative to
 *    |s − m|, expf is within 1 ulp), i.e. like a score error of that size. The capture did the same on values
 *    up to (1 + u) times larger, so the probabilities of both sides are exact softmaxes of scores t, t' with
 *      |t_j − t'_j| <= ê_j = e_j + 2 (1 + u)² (γ_{d+2} scale A_j + (|s'_j − m| + 4) u32).
 * 2. LSE. The gradient of LSE is the softmax, so |LSE(t) − LSE(t')| <= Σ_j p^θ_j ê_j for the softmax p^θ at
 *    some point between t' and t, and p^θ_j <= p'_j exp(2Ê) with Ê = max_j ê_j (each score moves by at most
 *    Ê and LSE, being 1-Lipschitz in the max-norm, too). So
 *      |Δlse| <= E_lse = min(Ê, exp(2Ê) Σ_j p'_j ê_j);
 *    the weighted form is much tighter than Ê when the largest ê_j belongs to keys with no weight.
 * 3. Probabilities. p_j / p'_j = exp((t_j − t'_j) − Δlse), so |p_j − p'_j| <= p'_j expm1(ê_j + E_lse).
 * 4. Output. o − o' = Σ_j (p_j − p'_j)(v~_j − c) + Σ_j p_j (v_j − v~_j) for any vector c (both p sum to 1).
 *    With c = o' the part of the values common to all keys, which no probability error can move, drops out:
 *      ||o − o'|| <= Σ_j p'_j [expm1(ê_j + E_lse) ||v~_j − o'|| + exp(ê_j + E_lse)(u ||v~_j|| + η √d)],
 *    and storing o adds ||o − o~|| <= u ||o~|| + η √d.
 * 5. The other fp32 arithmetic: the sums over n keys of the normaliser and of Σ p v, by the capture (in an
 *    unknown order: a GPU kernel merges partial sums) and by verify, each err by at most γ_n relative (lse:
 *    absolute) and γ_n Σ p |v| (output); the normalisation and the lse's own fp32 rounding add a few u32.
 *    Allowance (factor 2 for the two sides): lse 2 (n + 8) u32 + 4 u32 |lse~|; output
 *    2 (n + 8) u32 (1 + u) exp(Ê + E_lse) Σ_j p'_j ||v~_j|| + 4 u32 ||o'||.
 * A row passes when |lse~ − lse'| <= 1.05 (E_lse + its allowance) + 1e-6 and ||o~ − o'|| <= 1.05 (bound of 4
 * + its allowance) + 1e-6. The 5% covers using the computed p' where the exact softmax of t' belongs (a
 * relative O(u32) difference) and the O(γ_d) error of computing A_j (both far below 5% for any n, d below
 * 10^5); the 1e-6 floor covers probabilities below e^-87 that fp32 computes as 0. "Bound usage" = error /
 * that bound; a correct trace stays <= 1. Compared with the plain form (E1 = max_j e_j for the lse and
 * (e^{2 E1} − 1 + u e^{2 E1}) Σ_j p_j ||v_j|| + u ||o|| for the output), steps 2 and 4 weight each key by its
 * probability and centre the values on o'; both remain rigorous, and they tighten the bound most on heads
 * whose largest e_j falls on keys of little weight and whose values share a large common part.
 *
 * What it can and cannot catch. The bound is worst case: every rounding aligned against the check. On a
 * correct trace the real errors have random signs and stay below it (largest bound usage on real captures:
 * 0.3-0.5 in fp16/bf16, about 0.02 in fp32; trace/FORMAT.md "What verify checks"), so a stored o that is
 * wrong by less than the bound passes. A wrong o (another position's, a kernel bug) is off by O(1) relative
 * and fails in every dtype. o scaled by (1 + 20u) fails on the rows where 20u ||o|| exceeds the bound
 * (attention not too sharp, values that do not cancel): in fp16 and bf16 a few percent of the rows of the
 * real captures and of the generated test traces, enough to fail the trace. In fp32 it passes: 20 u32 ||o||
 * (1.2e-6 relative) is below the allowance for the capture's unknown summation order, 2 (n + 8) u32 Σ p ||v||,
 * which no rigorous bound can drop; 200 u32 fails. tests/test_cli_trace.c tests these cases on whole traces,
 * tests/test_verify.c the bound row by row. */

#define VERIFY_U32 (1.0 / 16777216.0) /* 2^-24, unit roundoff of the fp32 recomputation */
#define VERIFY_SLACK 1.05
#define VERIFY_FLOOR 1e-6
#define VERIFY_MAX_THREADS 1024     /* kvs_threadpool_create's limit */

static double gamma32(double n) { return n * VERIFY_U32 / (1.0 - n * VERIFY_U32); }

void kvs_verify_dtype_rounding(kvs_dtype dt, double *u, double *eta) {
    switch (dt) {
    case KVS_DTYPE_F16: *u = ldexp(1.0, -11), *eta = ldexp(1.0, -25); break;
    case KVS_DTYPE_BF16: *u = ldexp(1.0, -8), *eta = ldexp(1.0, -134); break;
    case KVS_DTYPE_F32:
    default: *u = ldexp(1.0, -24), *eta = ldexp(1.0, -150); break;
    }
}

/* Fixed output tolerance used when only an lse tolerance is given: 128 u (1e-4 for fp32), set from the largest
 * errors measured on the stories260K captures (51 u) with a margin. */
static double fixed_output_tolerance(kvs_dtype dt) {
    switch (dt) {
    case KVS_DTYPE_F16: return 128.0 / 2048.0;
    case KVS_DTYPE_BF16: return 128.0 / 256.0;
    case KVS_DTYPE_F32:
    default: return 1e-4;
    }
}

kvs_status kvs_verify_cfg_init(kvs_dtype dt, double tolerance, double lse_tolerance, kvs_verify_cfg *cfg) {
    if (!cfg) return kvs_fail(KVS_ERR_INVALID_ARG, "verify: NULL configuration");
    if (isnan(tolerance) || isnan(lse_tolerance))
        return kvs_fail(KVS_ERR_INVALID_ARG, "verify: %s is NaN", isnan(tolerance) ? "tolerance" : "lse tolerance");
    memset(cfg, 0, sizeof *cfg);
    kvs_verify_dtype_rounding(dt, &cfg->u, &cfg->eta);
    cfg->fixed = tolerance >= 0 || lse_tolerance >= 0;
    if (cfg->fixed) {
        cfg->lse_tol = lse_tolerance >= 0 ? lse_tolerance : tolerance; /* a tolerance alone sets both */
        cfg->tol = tolerance >= 0 ? tolerance : fixed_output_tolerance(dt);
    }
    return KVS_OK;
}

/* ------------------------------------------------------------------------------------------------
 * One row
 * ---------------------------------------------------------------------------------------------- */

double kvs_verify_attention(const float *q, const float *k, const float *v, size_t n, size_t d, float scale,
                            float *scores, float *probs, float *out) {
    /* kvs_attention()'s own three steps (kvs_math.c), the scores kept on the way */
    kvs_attn_scores(q, k, d, NULL, n, d, scale, scores);
    memcpy(probs, scores, n * sizeof(float));
    double lse = kvs_softmax(probs, n);
    kvs_attn_output(probs, v, d, NULL, n, d, out);
    return lse;
}

struct kvs_verify_ctx {
    kvs_verify_cfg cfg;
    size_t max_keys, d;
    size_t n_keys;             /* keys added so far */
    float *absk;               /* [max_keys][d]: |k~_j| */
    float *k1, *vn;            /* [max_keys]: |k~_j|_1 and ||v~_j||_2, rounded up */
    float *ehat;               /* [max_keys]: ê_j of the row being checked */
    float *absq;               /* [d] */
};

kvs_status kvs_verify_ctx_create(const kvs_verify_cfg *cfg, size_t max_keys, size_t d, kvs_verify_ctx **out) {
    if (!out) return kvs_fail(KVS_ERR_INVALID_ARG, "verify: NULL output pointer");
    *out = NULL;
    if (!cfg || !max_keys || !d)
        return kvs_fail(KVS_ERR_INVALID_ARG, "verify: scratch of %zu keys x %zu%s", max_keys, d,
                        cfg ? "" : " without a configuration");
    if (max_keys > SIZE_MAX / sizeof(float) / (d + 3))
        return kvs_fail(KVS_ERR_NOMEM, "verify: scratch of %zu keys x %zu does not fit in memory", max_keys, d);
    kvs_verify_ctx *w = calloc(1, sizeof *w);
    if (!w) return kvs_fail(KVS_ERR_NOMEM, "verify: out of memory");
    w->cfg = *cfg;
    w->max_keys = max_keys;
    w->d = d;
    if (!cfg->fixed) { /* the bound's scratch; fixed tolerances need none */
        w->absk = malloc(max_keys * d * sizeof(float));
        w->k1 = malloc(max_keys * sizeof(float));
        w->vn = malloc(max_keys * sizeof(float));
        w->ehat = malloc(max_keys * sizeof(float));
        w->absq = malloc(d * sizeof(float));
        if (!w->absk || !w->k1 || !w->vn || !w->ehat || !w->absq) {
            kvs_verify_ctx_free(w);
            return kvs_fail(KVS_ERR_NOMEM, "cannot allocate the error bound's scratch (%zu positions x %zu)",
                            max_keys, d);
        }
    }
    *out = w;
    return KVS_OK;
}

void kvs_verify_ctx_free(kvs_verify_ctx *w) {
    if (!w) return;
    free(w->absk);
    free(w->k1);
    free(w->vn);
    free(w->ehat);
    free(w->absq);
    free(w);
}

kvs_status kvs_verify_ctx_add_key(kvs_verify_ctx *w, size_t j, const float *k, const float *v) {
    if (!w || !k || !v) return kvs_fail(KVS_ERR_INVALID_ARG, "verify: add_key: NULL argument");
    if (j != w->n_keys || j >= w->max_keys)
        return kvs_fail(KVS_ERR_RANGE, "verify: key %zu added after %zu keys (room for %zu)", j, w->n_keys,
                        w->max_keys);
    w->n_keys++;
    if (w->cfg.fixed) return KVS_OK;
    size_t d = w->d;
    double k1 = 0;
    for (size_t e = 0; e < d; e++) w->absk[j * d + e] = fabsf(k[e]), k1 += fabsf(k[e]);
    w->k1[j] = (float)(k1 * (1 + VERIFY_U32)); /* rounded up: it enters an upper bound */
    w->vn[j] = (float)(kvs_l2(v, d) * (1 + VERIFY_U32));
    return KVS_OK;
}

/* error / bound, with 0/0 = 0 (a fixed tolerance of 0 and an exact match) */
static double usage(double err, double bound) {
    if (err == 0) return 0;
    return bound > 0 ? err / bound : INFINITY;
}

/* The bound of one row (the comment above, steps 1-5) and its verdict; the arguments are checked. */
static void row_bound(kvs_verify_ctx *w, const kvs_verify_row *row, kvs_verify_row_result *res) {
    size_t n = row->n, d = row->d, k0 = row->first;
    double scale = row->scale;
    const float *q = row->q, *o_st = row->o, *scores = row->scores, *probs = row->probs, *out = row->out;
    float m = -INFINITY;
    for (size_t j = 0; j < n; j++)
        if (scores[j] > m) m = scores[j];
    double q1 = 0, u = w->cfg.u, eta = w->cfg.eta, ehat_max = 0;
    for (size_t i = 0; i < d; i++) w->absq[i] = fabsf(q[i]), q1 += w->absq[i];
    double a_rel = 1 + 2 * gamma32((double)d); /* fp32 sum of d non-negative products */
    for (size_t j = 0; j < n; j++) {
        double a = (double)kvs_dot(w->absq, w->absk + (k0 + j) * d, d) * a_rel;
        double e = scale * ((2 * u + u * u) * a + eta * (1 + u) * (q1 + w->k1[k0 + j]) + (double)d * eta * eta);
        e += 2 * (1 + u) * (1 + u) *
             (gamma32((double)d + 2) * scale * a + (fabs((double)scores[j] - m) + 4) * VERIFY_U32);
        w->ehat[j] = (float)(e * (1 + VERIFY_U32)); /* rounded up into float */
        if (e > ehat_max) ehat_max = e;
    }
    double pe = 0, pv = 0;
    for (size_t j = 0; j < n; j++) pe += (double)probs[j] * w->ehat[j], pv += (double)probs[j] * w->vn[k0 + j];
    double e_lse = fmin(ehat_max, exp(2 * ehat_max) * pe);
    double o_norm = kvs_l2(o_st, d), out_norm = kvs_l2(out, d), err_o = 0, sqrt_d = sqrt((double)d);
    for (size_t i = 0; i < d; i++) {
        double x = (double)o_st[i] - out[i];
        err_o += x * x;
    }
    err_o = sqrt(err_o);
    double bo = u * o_norm + eta * sqrt_d; /* step 4 */
    for (size_t j = 0; j < n; j++) {
        double p = probs[j];
        if (p == 0) continue;
        const float *v = row->v + j * d;
        double dist = 0;
        for (size_t i = 0; i < d; i++) {
            double x = (double)v[i] - out[i];
            dist += x * x;
        }
        double t = (double)w->ehat[j] + e_lse;
        bo += p * (expm1(t) * sqrt(dist) + exp(t) * (u * w->vn[k0 + j] + eta * sqrt_d));
    }
    double arith = 2 * ((double)n + 8) * VERIFY_U32; /* step 5 */
    bo += arith * (1 + u) * exp(ehat_max + e_lse) * pv + 4 * VERIFY_U32 * out_norm;
    double bl = e_lse + arith + 4 * VERIFY_U32 * fabs((double)row->lse);
    bo = VERIFY_SLACK * bo + VERIFY_FLOOR;
    bl = VERIFY_SLACK * bl + VERIFY_FLOOR;
    if (isnan(err_o)) err_o = INFINITY;
    res->err_o = err_o;
    res->bound_o = bo;
    res->bound_lse = bl;
    res->use_o = usage(err_o, bo);
    res->use_lse = usage(res->err_lse, bl);
    res->pass = err_o <= bo && res->err_lse <= bl; /* NaN bounds (inf inputs) fail */
}

kvs_status kvs_verify_row_check(kvs_verify_ctx *w, const kvs_verify_row *row, kvs_verify_row_result *res) {
    if (!w || !row || !res) return kvs_fail(KVS_ERR_INVALID_ARG, "verify: row check: NULL argument");
    memset(res, 0, sizeof *res);
    int fixed = w->cfg.fixed;
    if (!row->q || !row->v || !row->o || !row->probs || !row->out || (!fixed && !row->scores))
        return kvs_fail(KVS_ERR_INVALID_ARG, "verify: row check: NULL array");
    if (row->n < 1 || row->d != w->d)
        return kvs_fail(KVS_ERR_INVALID_ARG, "verify: row of %zu keys x %zu (the scratch's head_dim: %zu)", row->n,
                        row->d, w->d);
    if (!fixed && (row->first > w->n_keys || row->n > w->n_keys - row->first)) {
        if (row->first == 0) return kvs_fail(KVS_ERR_RANGE, "verify: row over %zu keys, %zu added", row->n, w->n_keys);
        return kvs_fail(KVS_ERR_RANGE, "verify: row over keys %zu..%zu, %zu added", row->first, row->first + row->n - 1,
                        w->n_keys);
    }
    res->rel = kvs_rel_l2(row->o, row->out, row->d);
    res->err_lse = fabs(row->attn_lse - (double)row->lse);
    if (isnan(res->rel)) res->rel = INFINITY;
    if (isnan(res->err_lse)) res->err_lse = INFINITY;
    if (fixed) {
        res->err_o = res->rel;
        res->bound_o = w->cfg.tol;
        res->bound_lse = w->cfg.lse_tol;
        res->use_o = usage(res->rel, w->cfg.tol);
        res->use_lse = usage(res->err_lse, w->cfg.lse_tol);
        res->pass = res->rel <= w->cfg.tol && res->err_lse <= w->cfg.lse_tol;
        return KVS_OK;
    }
    row_bound(w, row, res);
    return KVS_OK;
}

/* ------------------------------------------------------------------------------------------------
 * A stream: one (layer, KV head) of a trace, position by position
 * ---------------------------------------------------------------------------------------------- */

/* A worker's memory, reused stream after stream: the recomputation of one row (the history is the stream's). */
typedef struct {
    kvs_verify_ctx *ctx;       /* the bound's scratch (N keys) */
    float *scores, *probs;     /* [N] */
    float *out;                /* [d] */
} worker_mem;

static void worker_mem_free(worker_mem *m) {
    kvs_verify_ctx_free(m->ctx);
    free(m->scores);
    free(m->out);
    memset(m, 0, sizeof *m);
}

static kvs_status worker_mem_init(worker_mem *m, const kvs_verify_cfg *cfg, size_t N, size_t d) {
    memset(m, 0, sizeof *m);
    kvs_status s = kvs_verify_ctx_create(cfg, N, d, &m->ctx);
    if (s != KVS_OK) return s;
    m->scores = malloc(2 * N * sizeof(float));
    m->probs = m->scores ? m->scores + N : NULL;
    m->out = malloc(d * sizeof(float));
    if (!m->scores || !m->out) {
        worker_mem_free(m);
        return kvs_fail(KVS_ERR_NOMEM, "verify: cannot allocate a row's recomputation (%zu positions x %zu)", N, d);
    }
    return KVS_OK;
}

/* Folds one row's outcome into its stream's result (query head `head` at position `pos`). */
static void stream_add_row(kvs_verify_stream_result *r, const kvs_verify_row_result *x, int64_t pos, int head) {
    if (!x->pass) r->n_fail++;
    if (x->rel > r->max_rel || r->worst_pos < 0) r->max_rel = x->rel, r->worst_pos = pos, r->worst_head = head;
    if (x->err_lse > r->max_lse) r->max_lse = x->err_lse;
    if (fmax(x->use_o, x->use_lse) > fmax(r->use_o, r->use_lse) || r->use_pos < 0)
        r->use_pos = pos, r->use_head = head;
    if (x->use_o > r->use_o) r->use_o = x->use_o;
    if (x->use_lse > r->use_lse) r->use_lse = x->use_lse;
}

/* Checks every row of stream (layer, kv_head) of `t`: the stream (kv_stream.h) hands out each position with the K/V
 * history up to it; its key and value join the bound's scratch, then each of its G query heads is recomputed over
 * positions 0..p and judged. */
static kvs_status verify_stream(const kvs_trace *t, int layer, int kv_head, worker_mem *m,
                                kvs_verify_stream_result *r) {
    const kvs_trace_info *in = kvs_trace_info_get(t);
    size_t N = (size_t)in->n_positions, d = (size_t)in->model.head_dim;
    size_t G = (size_t)(in->model.n_heads / in->model.n_kv_heads);
    float scale = in->model.attn_scale;
    size_t win = (size_t)kvs_model_config_window(&in->model, layer); /* 0: full attention */
    kvs_kv_stream *st = NULL;
    kvs_status s = kvs_kv_stream_open(t, layer, kv_head, 0, &st);
    m->ctx->n_keys = 0;
    size_t p = 0;
    for (; s == KVS_OK && p < N; p++) {
        kvs_kv_pos x;
        s = kvs_kv_stream_next(st, &x);
        if (s == KVS_ERR_END)
            s = kvs_fail(KVS_ERR_FORMAT, "verify: (layer %d, kv head %d) ends after %zu of %zu positions", layer,
                         kv_head, p, N);
        if (s != KVS_OK) break;
        const float *kp = x.k + p * d, *vp = x.v + p * d;
        if ((s = kvs_verify_ctx_add_key(m->ctx, p, kp, vp)) != KVS_OK) break;
        size_t first = win > 0 && p + 1 > win ? p + 1 - win : 0; /* a sliding layer attends to its window only */
        for (size_t g = 0; g < G && s == KVS_OK; g++) {
            const float *q = x.q + g * d;
            const float *kw = x.k + first * d, *vw = x.v + first * d;
            kvs_verify_row row = {.n = p + 1 - first, .d = d, .first = first, .scale = scale, .q = q, .v = vw,
                                  .o = x.o + g * d, .lse = x.lse[g], .scores = m->scores, .probs = m->probs,
                                  .out = m->out};
            row.attn_lse = kvs_verify_attention(q, kw, vw, p + 1 - first, d, scale, m->scores, m->probs, m->out);
            kvs_verify_row_result res;
            if ((s = kvs_verify_row_check(m->ctx, &row, &res)) == KVS_OK)
                stream_add_row(r, &res, (int64_t)p, kv_head * (int)G + (int)g);
        }
    }
    kvs_kv_stream_free(st);
    return s;
}

/* The streams of a trace on a pool: each worker takes the next stream not yet taken (an atomic counter: one slow
 * stream does not hold up the others) and writes only that stream's result, so the report does not depend on
 * which worker ran what, nor on how many there are. */
typedef struct {
    const kvs_trace *t;
    const kvs_verify_cfg *cfg;
    kvs_verify_stream_result *res; /* [n_streams] */
    int n_streams, n_kv_heads;
    int next;                      /* next stream to take (atomic) */
} verify_job;

static void verify_worker(void *arg, int worker, int n_workers) {
    (void)worker, (void)n_workers;
    verify_job *job = arg;
    const kvs_trace_info *in = kvs_trace_info_get(job->t);
    worker_mem m;
    kvs_status ms = worker_mem_init(&m, job->cfg, (size_t)in->n_positions, (size_t)in->model.head_dim);
    char why[sizeof job->res[0].detail];
    snprintf(why, sizeof why, "%s", ms == KVS_OK ? "" : kvs_last_error());
    for (;;) {
        int i = __atomic_fetch_add(&job->next, 1, __ATOMIC_RELAXED);
        if (i >= job->n_streams) break;
        kvs_verify_stream_result *r = &job->res[i];
        r->worst_pos = r->use_pos = -1;
        r->worst_head = r->use_head = -1;
        r->status = ms == KVS_OK ? verify_stream(job->t, i / job->n_kv_heads, i % job->n_kv_heads, &m, r) : ms;
        if (r->status != KVS_OK) snprintf(r->detail, sizeof r->detail, "%s", ms == KVS_OK ? kvs_last_error() : why);
    }
    worker_mem_free(&m);
}

/* A lean trace (KVS_TRACE_FLAG_QKV, FORMAT.md "Lean record") has no recorded o or lse to compare with a
 * recomputation, so what is left to check after the checksums is that every stored q/k/v value is finite (an
 * overflow in the capture's storage dtype or a broken forward pass shows as Inf/NaN, which would make every
 * recomputed output of the stream NaN). Fills the report's lean_* fields. */
static void verify_lean(const kvs_trace *t, kvs_verify_report *rep) {
    const kvs_trace_info *in = kvs_trace_info_get(t);
    int L = in->model.n_layers, Hkv = in->model.n_kv_heads;
    kvs_status s = KVS_OK;
    rep->lean_first_pos = -1;
    rep->lean_first_layer = rep->lean_first_kv = -1;
    for (int l = 0; l < L && s == KVS_OK; l++)
        for (int kh = 0; kh < Hkv && s == KVS_OK; kh++) {
            kvs_trace_stream *st = NULL;
            if ((s = kvs_trace_stream_open(t, l, kh, &st)) != KVS_OK) break;
            kvs_trace_stream_qkv_only(st);
            const kvs_trace_block *b;
            while ((s = kvs_trace_stream_next(st, &b)) == KVS_OK) {
                size_t nq = (size_t)b->n_pos * (size_t)b->group * (size_t)b->head_dim;
                size_t nk = (size_t)b->n_pos * (size_t)b->head_dim;
                const float *arr[3] = {b->q, b->k, b->v};
                const size_t len[3] = {nq, nk, nk};
                for (int a = 0; a < 3; a++)
                    for (size_t i = 0; i < len[a]; i++)
                        if (!isfinite(arr[a][i]) && rep->lean_bad++ == 0) {
                            size_t row = a == 0 ? (size_t)b->group * (size_t)b->head_dim : (size_t)b->head_dim;
                            rep->lean_first_pos = b->first_pos + (int64_t)(i / row);
                            rep->lean_first_layer = l, rep->lean_first_kv = kh;
                        }
                rep->lean_values += (int64_t)(nq + 2 * nk);
            }
            kvs_trace_stream_free(st);
            if (s == KVS_ERR_END) s = KVS_OK;
        }
    rep->lean_status = s;
    if (s != KVS_OK) snprintf(rep->lean_detail, sizeof rep->lean_detail, "%s", kvs_last_error());
}

/* ------------------------------------------------------------------------------------------------
 * A whole trace
 * ---------------------------------------------------------------------------------------------- */

kvs_verify_options kvs_verify_options_default(void) {
    return (kvs_verify_options){.tolerance = -1, .lse_tolerance = -1, .threads = 0, .pool = NULL};
}

void kvs_verify_report_free(kvs_verify_report *r) {
    if (!r) return;
    free(r->streams);
    free(r);
}

kvs_status kvs_verify_report_layer(const kvs_verify_report *r, int layer, kvs_verify_layer *out) {
    if (!r || !out) return kvs_fail(KVS_ERR_INVALID_ARG, "verify: report layer: NULL argument");
    if (r->lean || !r->streams || layer < 0 || layer >= r->n_layers)
        return kvs_fail(KVS_ERR_RANGE, "verify: report layer %d: %s", layer,
                        r->lean || !r->streams ? "a lean trace's report has no layers" : "no such layer");
    kvs_verify_layer a = {.worst_pos = -1, .worst_head = -1, .use_pos = -1, .use_head = -1};
    for (int h = 0; h < r->n_kv_heads; h++) {
        const kvs_verify_stream_result *s = &r->streams[layer * r->n_kv_heads + h];
        if (s->max_rel > a.max_rel || a.worst_pos < 0)
            a.max_rel = s->max_rel, a.worst_pos = s->worst_pos, a.worst_head = s->worst_head;
        if (s->max_lse > a.max_lse) a.max_lse = s->max_lse;
        if (fmax(s->use_o, s->use_lse) > fmax(a.use_o, a.use_lse) || a.use_pos < 0)
            a.use_pos = s->use_pos, a.use_head = s->use_head;
        a.use_o = fmax(a.use_o, s->use_o);
        a.use_lse = fmax(a.use_lse, s->use_lse);
        a.n_fail += s->n_fail;
    }
    *out = a;
    return KVS_OK;
}

kvs_status kvs_trace_verify(const kvs_trace *t, const kvs_verify_options *opt, kvs_verify_report **out) {
    if (!out) return kvs_fail(KVS_ERR_INVALID_ARG, "verify: NULL output pointer");
    *out = NULL;
    if (!t) return kvs_fail(KVS_ERR_INVALID_ARG, "verify: NULL trace");
    kvs_verify_options o = opt ? *opt : kvs_verify_options_default();
    if (!o.pool && o.threads > VERIFY_MAX_THREADS)
        return kvs_fail(KVS_ERR_INVALID_ARG, "verify: threads: %d is more than %d", o.threads, VERIFY_MAX_THREADS);
    const kvs_trace_info *in = kvs_trace_info_get(t);
    kvs_threadpool *own = NULL;
    kvs_verify_report *rep = calloc(1, sizeof *rep);
    if (!rep) return kvs_fail(KVS_ERR_NOMEM, "verify: out of memory");
    rep->dtype = (kvs_dtype)in->capture.dtype;
    rep->n_layers = in->model.n_layers;
    rep->n_kv_heads = in->model.n_kv_heads;
    int n_streams = rep->n_layers * rep->n_kv_heads;
    kvs_status s;
    KVS_TRY(s = kvs_verify_cfg_init(rep->dtype, o.tolerance, o.lse_tolerance, &rep->cfg));
    KVS_TRY(s = kvs_trace_check_chunks(t));
    rep->n_chunks = in->n_chunks;
    if (in->capture.flags & KVS_TRACE_FLAG_QKV) {
        rep->lean = 1;
        verify_lean(t, rep);
        goto cleanup;
    }
    rep->streams = calloc((size_t)n_streams, sizeof *rep->streams);
    if (!rep->streams) KVS_TRY(s = kvs_fail(KVS_ERR_NOMEM, "out of memory"));
    if (!o.pool) {
        int threads = o.threads > 0 ? o.threads : kvs_n_cpus();
        if (threads > n_streams) threads = n_streams;
        if (threads > VERIFY_MAX_THREADS) threads = VERIFY_MAX_THREADS;
        KVS_TRY(s = kvs_threadpool_create(threads, &own));
    }
    verify_job job = {.t = t, .cfg = &rep->cfg, .res = rep->streams, .n_streams = n_streams,
                      .n_kv_heads = rep->n_kv_heads, .next = 0};
    kvs_threadpool_run(o.pool ? o.pool : own, verify_worker, &job);
    for (int i = 0; i < n_streams; i++) rep->n_errors += rep->streams[i].status != KVS_OK;
    for (int l = 0; l < rep->n_layers; l++) {
        kvs_verify_layer a;
        (void)kvs_verify_report_layer(rep, l, &a);
        rep->n_fail += a.n_fail;
        rep->max_usage = fmax(rep->max_usage, fmax(a.use_o, a.use_lse));
    }
cleanup:
    kvs_threadpool_free(own);
    if (s != KVS_OK) {
        kvs_verify_report_free(rep);
        return s;
    }
    *out = rep;
    return KVS_OK;
}
