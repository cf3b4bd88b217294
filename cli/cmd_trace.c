/* cmd_trace.c — the trace subcommands of kvsim: `info`, `verify`, `export` and `trace recover`.
 *
 * They are thin layers over trace/trace.h (file format: trace/FORMAT.md). `verify` recomputes exact causal
 * full attention from the stored q/k/v with kvs_attention() (common/kvs_math.h, the definitions in
 * ../shared/DESIGN.md "Capture"), position by position through sim/kv_stream.h, and compares it with the
 * stored o and lse. Exit codes as in cli.h.
 */
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/kvs_math.h"
#include "../common/kvs_out.h"
#include "../common/npy.h"
#include "../sim/kv_stream.h"
#include "../trace/trace.h"
#include "cli.h"

/* Reports getopt's complaint for the option it stopped at (opterr = 0, optstring starts with ':'). */
static int option_error(const char *cmd, int c, char **argv) {
    const char *arg = argv[optind - 1];
    if (c == ':') return kvs_cli_usage_error(cmd, "option '%s' needs a value", arg);
    if (optopt && optopt < 256) return kvs_cli_usage_error(cmd, "unknown option '-%c'", optopt);
    return kvs_cli_usage_error(cmd, "unknown option '%s'", arg);
}

/* The one rule for single-valued options (cli.h kvs_cli_once): the long option getopt_long matched
 * (longindex li; every option here is long-only) given a second time is a usage error naming it. seen[] has
 * one slot per entry of opts. */
static int option_once(const char *cmd, const struct option *opts, int li, int *seen) {
    if (li < 0) return 0;
    char name[64];
    snprintf(name, sizeof name, "--%s", opts[li].name);
    return kvs_cli_once(cmd, name, &seen[li]);
}

/* Reports a missing TRACE or an extra positional argument (exactly one is wanted). */
static int positional_error(const char *cmd, int argc, char **argv) {
    if (argc - optind < 1) return kvs_cli_usage_error(cmd, "missing TRACE argument");
    return kvs_cli_usage_error(cmd, "unexpected argument '%s'", argv[optind + 1]);
}

/* ------------------------------------------------------------------------------------------------
 * kvsim info TRACE
 * ---------------------------------------------------------------------------------------------- */

static void info_usage(FILE *f) {
    fprintf(f, "usage: kvsim info TRACE\n\n"
               "Prints the trace's model config, storage dtype and block size, positions (prompt / generated),\n"
               "turns, chunk count, raw vs compressed payload bytes and the capture settings.\n");
}

static void print_bytes(const char *label, uint64_t b) {
    printf("  %-11s %llu bytes (%.2f MiB)\n", label, (unsigned long long)b, (double)b / (1024.0 * 1024.0));
}

int kvs_cmd_info(int argc, char **argv) {
    static const struct option opts[] = {{"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
    opterr = 0;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        if (c == 'h') {
            info_usage(stdout);
            return kvs_cli_finish_stdout("info");
        }
        return option_error("info", c, argv);
    }
    if (argc - optind != 1) return positional_error("info", argc, argv);
    const char *path = argv[optind];
    kvs_trace *t = NULL;
    kvs_status s = kvs_trace_open(path, &t);
    if (s != KVS_OK) return kvs_cli_fail("info", s);
    const kvs_trace_info *in = kvs_trace_info_get(t);
    const kvs_model_config *m = &in->model;
    const kvs_capture_config *cp = &in->capture;
    printf("trace        %s (format version %u)\n", path, in->version);
    printf("model        %s\n", m->model_name[0] ? m->model_name : "(unnamed)");
    printf("  layers %d, query heads %d, kv heads %d (group %d), head_dim %d\n", m->n_layers, m->n_heads,
           m->n_kv_heads, m->n_heads / m->n_kv_heads, m->head_dim);
    printf("  dim %d, hidden_dim %d, vocab %d, max_seq_len %d\n", m->dim, m->hidden_dim, m->vocab_size,
           m->max_seq_len);
    printf("  rope_theta %g (%s pairs), norm_eps %g, attn_scale %g\n", (double)m->rope_theta,
           m->rope_layout == KVS_ROPE_HALVES ? "rotate_half" : "adjacent", (double)m->norm_eps, (double)m->attn_scale);
    if (cp->flags & KVS_TRACE_FLAG_QKV)
        printf("storage      %s q/k/v (lean record: o and lse not stored, readers recompute them), %d positions per "
               "block, byte shuffle %s\n", kvs_dtype_name((kvs_dtype)cp->dtype), cp->block_positions,
               (cp->flags & KVS_TRACE_FLAG_SHUFFLE) ? "on" : "off");
    else
        printf("storage      %s q/k/v/o (lse fp32), %d positions per block, byte shuffle %s\n",
               kvs_dtype_name((kvs_dtype)cp->dtype), cp->block_positions,
               (cp->flags & KVS_TRACE_FLAG_SHUFFLE) ? "on" : "off");
    int64_t generated = 0;
    for (int64_t i = 0; i < in->n_turns; i++) generated += in->turns[i].end - in->turns[i].prompt_end;
    printf("positions    %lld (%lld prompt, %lld generated; prompt length before the first generated token "
           "%lld)\n", (long long)in->n_positions, (long long)(in->n_positions - generated), (long long)generated,
           (long long)in->prompt_len);
    printf("max_new_tokens %d%s\n", cp->max_new_tokens, cp->max_new_tokens ? "" : " (unknown)");
    printf("turns        %lld\n", (long long)in->n_turns);
    for (int64_t i = 0; i < in->n_turns; i++) {
        const kvs_turn *tu = &in->turns[i];
        printf("  turn %lld: begin %lld, prompt_end %lld, end %lld (%lld prompt, %lld generated)\n", (long long)i,
               (long long)tu->begin, (long long)tu->prompt_end, (long long)tu->end,
               (long long)(tu->prompt_end - tu->begin), (long long)(tu->end - tu->prompt_end));
    }
    printf("chunks       %lld (%lld blocks x (%d layers x %d kv heads + 1 tokens chunk))\n", (long long)in->n_chunks,
           (long long)in->n_blocks, m->n_layers, m->n_kv_heads);
    printf("bytes\n");
    print_bytes("raw", in->raw_bytes);
    print_bytes("compressed", in->compressed_bytes);
    print_bytes("file", in->file_bytes);
    printf("  ratio       %.3f (raw / compressed)\n",
           in->compressed_bytes ? (double)in->raw_bytes / (double)in->compressed_bytes : 0.0);
    printf("settings     %s\n", cp->settings[0] ? cp->settings : "(none)");
    kvs_trace_close(t);
    return kvs_cli_finish_stdout("info");
}

/* ------------------------------------------------------------------------------------------------
 * kvsim verify TRACE [--tolerance X] [--lse-tolerance X] [--threads N]
 * ---------------------------------------------------------------------------------------------- */

/* The per-row error bound (the default check; --tolerance / --lse-tolerance switch to fixed tolerances).
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
 * which no rigorous bound can drop; 200 u32 fails. tests/test_cli_trace.c tests these cases. */

#define VERIFY_U32 (1.0 / 16777216.0) /* 2^-24, unit roundoff of the fp32 recomputation */
#define VERIFY_SLACK 1.05
#define VERIFY_FLOOR 1e-6

static double gamma32(double n) { return n * VERIFY_U32 / (1.0 - n * VERIFY_U32); }

/* Storage rounding of a dtype: |x − x~| <= u |x~| + eta. */
static void dtype_rounding(kvs_dtype dt, double *u, double *eta) {
    switch (dt) {
    case KVS_DTYPE_F16: *u = ldexp(1.0, -11), *eta = ldexp(1.0, -25); break;
    case KVS_DTYPE_BF16: *u = ldexp(1.0, -8), *eta = ldexp(1.0, -134); break;
    case KVS_DTYPE_F32:
    default: *u = ldexp(1.0, -24), *eta = ldexp(1.0, -150); break;
    }
}

typedef struct {
    int fixed;               /* 1: --tolerance/--lse-tolerance given: fixed tolerances, no bound */
    double tol, lse_tol;     /* fixed mode: max relative output error, max absolute lse error */
    double u, eta;           /* storage rounding (bound mode) */
} verify_cfg;

/* Per-thread scratch of the bound; N = n_positions, d = head_dim: (N d + 3 N + d) floats per thread (none
 * with fixed tolerances). The K/V history, probabilities, outputs and (bound mode) scores are the
 * kvs_kv_stream's (sim/kv_stream.h): 2 N d + G N (2 G N with the scores) + G d floats per stream in work. */
typedef struct {
    float *absk;               /* [N][d]: |k~| of the stream so far */
    float *k1, *vn;            /* [N]: |k~_j|_1 and ||v~_j||_2 */
    float *ehat;               /* [N]: ê_j */
    float *absq;               /* [d] */
} verify_scratch;

typedef struct {
    double max_rel, max_lse;       /* largest relative output error and absolute lse error */
    int64_t worst_pos;             /* position of max_rel */
    int worst_head;
    double use_o, use_lse;         /* largest error / bound (bound usage) */
    int64_t use_pos;               /* position and head of the largest usage */
    int use_head;
    int64_t n_fail;                /* rows over their bound or tolerance */
    kvs_status status;
    char detail[1024];
} stream_result;

typedef struct {
    const kvs_trace *t;
    const verify_cfg *cfg;
    stream_result *res;      /* [L * Hkv] */
    int n_streams;
    int next;                /* next stream to take (atomic) */
} verify_job;

/* error / bound, with 0/0 = 0 (a fixed tolerance of 0 and an exact match) */
static double usage(double err, double bound) {
    if (err == 0) return 0;
    return bound > 0 ? err / bound : INFINITY;
}

/* Checks query head g of position kp->pos: the stream's recomputation (kvs_attention's scores, probabilities,
 * lse and output over keys/values 0..pos; scores only in bound mode) against the stored o~ and lse~. Returns
 * whether it passes; *use_o / *use_lse receive the bound usages, *rel the relative output error, *el the
 * absolute lse error (NaN reported as +inf so that it can never look like a pass). */
static int verify_row(const verify_cfg *cfg, const kvs_kv_pos *kp, size_t g, verify_scratch *w, double *rel,
                      double *el, double *use_o, double *use_lse) {
    size_t n = (size_t)kp->n_ctx, d = (size_t)kp->head_dim;
    float scale = kp->scale;
    const float *q = kp->q + g * d, *o_st = kp->o + g * d, *probs = kp->probs + g * n, *out = kp->out + g * d;
    float lse_st = kp->lse[g];
    double lse = kp->attn_lse[g];
    *rel = kvs_rel_l2(o_st, out, d);
    *el = fabs(lse - (double)lse_st);
    if (isnan(*rel)) *rel = INFINITY;
    if (isnan(*el)) *el = INFINITY;
    if (cfg->fixed) {
        *use_o = usage(*rel, cfg->tol);
        *use_lse = usage(*el, cfg->lse_tol);
        return *rel <= cfg->tol && *el <= cfg->lse_tol;
    }
    const float *scores = kp->scores + g * n;
    float m = -INFINITY;
    for (size_t j = 0; j < n; j++)
        if (scores[j] > m) m = scores[j];
    double q1 = 0, u = cfg->u, eta = cfg->eta, ehat_max = 0;
    for (size_t i = 0; i < d; i++) w->absq[i] = fabsf(q[i]), q1 += w->absq[i];
    double a_rel = 1 + 2 * gamma32((double)d); /* fp32 sum of d non-negative products */
    for (size_t j = 0; j < n; j++) {
        double a = (double)kvs_dot(w->absq, w->absk + j * d, d) * a_rel;
        double e = scale * ((2 * u + u * u) * a + eta * (1 + u) * (q1 + w->k1[j]) + (double)d * eta * eta);
        e += 2 * (1 + u) * (1 + u) * (gamma32((double)d + 2) * scale * a + (fabs((double)scores[j] - m) + 4) * VERIFY_U32);
        w->ehat[j] = (float)(e * (1 + VERIFY_U32)); /* rounded up into float */
        if (e > ehat_max) ehat_max = e;
    }
    double pe = 0, pv = 0;
    for (size_t j = 0; j < n; j++) pe += (double)probs[j] * w->ehat[j], pv += (double)probs[j] * w->vn[j];
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
        const float *v = kp->v + j * d;
        double dist = 0;
        for (size_t i = 0; i < d; i++) {
            double x = (double)v[i] - out[i];
            dist += x * x;
        }
        double t = (double)w->ehat[j] + e_lse;
        bo += p * (expm1(t) * sqrt(dist) + exp(t) * (u * w->vn[j] + eta * sqrt_d));
    }
    double arith = 2 * ((double)n + 8) * VERIFY_U32; /* step 5 */
    bo += arith * (1 + u) * exp(ehat_max + e_lse) * pv + 4 * VERIFY_U32 * out_norm;
    double bl = e_lse + arith + 4 * VERIFY_U32 * fabs((double)lse_st);
    bo = VERIFY_SLACK * bo + VERIFY_FLOOR;
    bl = VERIFY_SLACK * bl + VERIFY_FLOOR;
    if (isnan(err_o)) err_o = INFINITY;
    *use_o = usage(err_o, bo);
    *use_lse = usage(*el, bl);
    return err_o <= bo && *el <= bl; /* NaN bounds (inf inputs) fail */
}

/* Recomputes one (layer, KV head) stream position by position with a kvs_kv_stream (one block + the K/V
 * history in memory), which also does the attention (kvs_attention's code path; scores kept for the bound). */
static void verify_stream(const kvs_trace *t, const verify_cfg *cfg, int layer, int kv_head, stream_result *r,
                          verify_scratch *w) {
    kvs_kv_stream *st = NULL;
    r->worst_pos = r->use_pos = -1;
    r->worst_head = r->use_head = -1;
    r->status = kvs_kv_stream_open(t, layer, kv_head, cfg->fixed ? KVS_KV_STREAM_FULL_ATTN : KVS_KV_STREAM_SCORES, &st);
    kvs_kv_pos kp;
    while (r->status == KVS_OK && (r->status = kvs_kv_stream_next(st, &kp)) == KVS_OK) {
        size_t p = (size_t)kp.pos, d = (size_t)kp.head_dim, G = (size_t)kp.group;
        if (!cfg->fixed) {
            const float *k = kp.k + p * d, *v = kp.v + p * d;
            double k1 = 0;
            for (size_t e = 0; e < d; e++) w->absk[p * d + e] = fabsf(k[e]), k1 += fabsf(k[e]);
            w->k1[p] = (float)(k1 * (1 + VERIFY_U32)); /* rounded up: it enters an upper bound */
            w->vn[p] = (float)(kvs_l2(v, d) * (1 + VERIFY_U32));
        }
        for (size_t g = 0; g < G; g++) {
            double rel, el, uo, ul;
            int head = kv_head * (int)G + (int)g;
            if (!verify_row(cfg, &kp, g, w, &rel, &el, &uo, &ul)) r->n_fail++;
            if (rel > r->max_rel || r->worst_pos < 0) r->max_rel = rel, r->worst_pos = (int64_t)p, r->worst_head = head;
            if (el > r->max_lse) r->max_lse = el;
            if (fmax(uo, ul) > fmax(r->use_o, r->use_lse) || r->use_pos < 0) r->use_pos = (int64_t)p, r->use_head = head;
            if (uo > r->use_o) r->use_o = uo;
            if (ul > r->use_lse) r->use_lse = ul;
        }
    }
    if (r->status == KVS_ERR_END) r->status = KVS_OK;
    if (r->status != KVS_OK) snprintf(r->detail, sizeof r->detail, "%s", kvs_last_error());
    kvs_kv_stream_free(st);
}

static void *verify_worker(void *arg) {
    verify_job *job = arg;
    const kvs_trace_info *in = kvs_trace_info_get(job->t);
    size_t N = (size_t)in->n_positions, d = (size_t)in->model.head_dim;
    verify_scratch w = {0};
    if (!job->cfg->fixed) { /* the bound's scratch; fixed tolerances need none */
        w.absk = malloc(N * d * sizeof(float));
        w.k1 = malloc(N * sizeof(float));
        w.vn = malloc(N * sizeof(float));
        w.ehat = malloc(N * sizeof(float));
        w.absq = malloc(d * sizeof(float));
    }
    int ok = job->cfg->fixed || (w.absk && w.k1 && w.vn && w.ehat && w.absq);
    for (;;) {
        int i = __atomic_fetch_add(&job->next, 1, __ATOMIC_RELAXED);
        if (i >= job->n_streams) break;
        stream_result *r = &job->res[i];
        if (!ok) {
            r->status = KVS_ERR_NOMEM;
            snprintf(r->detail, sizeof r->detail, "cannot allocate the error bound's scratch (%zu positions x %zu)", N, d);
            continue;
        }
        verify_stream(job->t, job->cfg, i / in->model.n_kv_heads, i % in->model.n_kv_heads, r, &w);
    }
    free(w.absk);
    free(w.k1);
    free(w.vn);
    free(w.ehat);
    free(w.absq);
    return NULL;
}

/* verify of a lean trace (KVS_TRACE_FLAG_QKV, trace/FORMAT.md "Lean record"): there is no recorded o or lse to
 * compare with a recomputation, so what is left to check after the checksums is that every stored q/k/v value is
 * finite (an overflow in the capture's storage dtype or a broken forward pass shows as Inf/NaN, which would make
 * every recomputed output of the stream NaN). Prints what was and was not checked. @return the exit status. */
static int verify_lean(const char *path, kvs_trace *t) {
    const kvs_trace_info *in = kvs_trace_info_get(t);
    int L = in->model.n_layers, Hkv = in->model.n_kv_heads;
    int64_t n_values = 0, n_bad = 0, first_pos = -1;
    int first_layer = -1, first_kv = -1;
    kvs_status s = KVS_OK;
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
                        if (!isfinite(arr[a][i]) && n_bad++ == 0) {
                            size_t row = a == 0 ? (size_t)b->group * (size_t)b->head_dim : (size_t)b->head_dim;
                            first_pos = b->first_pos + (int64_t)(i / row), first_layer = l, first_kv = kh;
                        }
                n_values += (int64_t)(nq + 2 * nk);
            }
            kvs_trace_stream_free(st);
            if (s == KVS_ERR_END) s = KVS_OK;
        }
    if (s != KVS_OK) return kvs_cli_fail("verify", s);
    printf("lean trace (recorded with --record qkv): o and lse were not stored, so the recorded attention outputs "
           "cannot be checked against a recomputation; readers recompute them from the stored q/k/v\n");
    printf("checked: every chunk's checksums and decoding; every stored q/k/v value finite (%lld values, %lld not "
           "finite)\n", (long long)n_values, (long long)n_bad);
    if (n_bad) {
        fprintf(stderr, "kvsim verify: %s: %lld stored q/k/v values are not finite (the first at layer %d, kv head %d, "
                "position %lld)\n", path, (long long)n_bad, first_layer, first_kv, (long long)first_pos);
        (void)kvs_cli_finish_stdout("verify");
        return KVS_EXIT_FAIL;
    }
    printf("verify: OK (lean trace: chunks and q/k/v only)\n");
    return kvs_cli_finish_stdout("verify");
}

static void verify_usage(FILE *f) {
    fprintf(f, "usage: kvsim verify TRACE [--tolerance X] [--lse-tolerance X] [--threads N]\n\n"
               "1. reads and checksums every chunk;\n"
               "2. for every (layer, KV head) stream recomputes exact causal full attention of every position and\n"
               "   query head from the stored q/k/v (fp32 math) and compares with the stored o and lse.\n"
               "By default each row (position, query head) is checked against a rigorous error bound computed for\n"
               "that row from the storage dtype's rounding (fp16 u = 2^-11, bf16 2^-8, fp32 2^-24) of q/k/v/o and\n"
               "the fp32 arithmetic of capture and recomputation (derivation: cli/cmd_trace.c; summary:\n"
               "trace/FORMAT.md \"What verify checks\"). Prints per layer the largest relative output error\n"
               "||o - o'|| / ||o||, the largest absolute lse error and the bound usage (error / bound, <= 1 on a\n"
               "correct trace). Exit 0 only when every row is within its bound (or the fixed tolerances).\n"
               "A lean trace (capture --record qkv) stores no o or lse: verify then checks the chunks and that\n"
               "every stored q/k/v value is finite, and says that the outputs cannot be checked.\n\n"
               "  --tolerance X      use fixed tolerances instead of the bound: max relative output error X;\n"
               "                     also the LSE tolerance unless --lse-tolerance is given\n"
               "  --lse-tolerance X  use fixed tolerances: max absolute LSE error X (the output tolerance is\n"
               "                     then --tolerance, or fp32 1e-4, fp16 0.0625, bf16 0.5)\n"
               "  --threads N        parallel streams, 1..%d (default: all %d cores)\n"
               "Each option may be given once.\n", KVS_CLI_MAX_THREADS, kvs_n_cpus());
}

/* Fixed output tolerance used when only --lse-tolerance is given: 128 u (1e-4 for fp32), the former
 * defaults, set from the largest errors measured on the stories260K captures (51 u) with a margin. */
static double fixed_output_tolerance(kvs_dtype dt) {
    switch (dt) {
    case KVS_DTYPE_F16: return 128.0 / 2048.0;
    case KVS_DTYPE_BF16: return 128.0 / 256.0;
    case KVS_DTYPE_F32:
    default: return 1e-4;
    }
}

int kvs_cmd_verify(int argc, char **argv) {
    static const struct option opts[] = {{"tolerance", required_argument, NULL, 't'},
                                         {"lse-tolerance", required_argument, NULL, 'l'},
                                         {"threads", required_argument, NULL, 'j'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    double tol = -1, lse_tol = -1;
    long threads = kvs_n_cpus();
    if (threads > KVS_CLI_MAX_THREADS) threads = KVS_CLI_MAX_THREADS;
    int seen[4] = {0};
    opterr = 0;
    optind = 1;
    int c, li = -1;
    while ((c = getopt_long(argc, argv, ":h", opts, &li)) != -1) {
        kvs_status s = KVS_OK;
        if (c != ':' && c != '?' && option_once("verify", opts, li, seen)) return KVS_EXIT_USAGE;
        li = -1;
        switch (c) {
        case 'h': verify_usage(stdout); return kvs_cli_finish_stdout("verify");
        case 't': s = kvs_cli_parse_double("--tolerance", optarg, 0, 1e30, &tol); break;
        case 'l': s = kvs_cli_parse_double("--lse-tolerance", optarg, 0, 1e30, &lse_tol); break;
        case 'j': s = kvs_cli_parse_long("--threads", optarg, 1, KVS_CLI_MAX_THREADS, &threads); break;
        default: return option_error("verify", c, argv);
        }
        if (s != KVS_OK) return kvs_cli_usage_error("verify", "%s", kvs_last_error());
    }
    if (argc - optind != 1) return positional_error("verify", argc, argv);
    const char *path = argv[optind];
    kvs_trace *t = NULL;
    kvs_status s = kvs_trace_open(path, &t);
    if (s != KVS_OK) return kvs_cli_fail("verify", s);
    const kvs_trace_info *in = kvs_trace_info_get(t);
    kvs_dtype dt = (kvs_dtype)in->capture.dtype;
    verify_cfg cfg = {.fixed = tol >= 0 || lse_tol >= 0};
    dtype_rounding(dt, &cfg.u, &cfg.eta);
    if (cfg.fixed) {
        cfg.lse_tol = lse_tol >= 0 ? lse_tol : tol; /* --tolerance alone sets both */
        cfg.tol = tol >= 0 ? tol : fixed_output_tolerance(dt);
    }

    s = kvs_trace_check_chunks(t);
    if (s != KVS_OK) {
        int rc = kvs_cli_fail("verify", s);
        kvs_trace_close(t);
        return rc;
    }
    printf("checksums: all %lld chunks ok\n", (long long)in->n_chunks);
    if (in->capture.flags & KVS_TRACE_FLAG_QKV) {
        int rc = verify_lean(path, t);
        kvs_trace_close(t);
        return rc;
    }

    int L = in->model.n_layers, Hkv = in->model.n_kv_heads;
    int n_streams = L * Hkv;
    if (threads > n_streams) threads = n_streams;
    stream_result *res = calloc((size_t)n_streams, sizeof *res);
    pthread_t *th = calloc((size_t)threads, sizeof *th);
    if (!res || !th) {
        free(res);
        free(th);
        kvs_trace_close(t);
        return kvs_cli_fail("verify", kvs_fail(KVS_ERR_NOMEM, "out of memory"));
    }
    verify_job job = {.t = t, .cfg = &cfg, .res = res, .n_streams = n_streams, .next = 0};
    long started = 0;
    for (; started < threads; started++)
        if (pthread_create(&th[started], NULL, verify_worker, &job) != 0) break;
    if (started == 0) verify_worker(&job); /* could not start a thread: do the work here */
    for (long i = 0; i < started; i++) pthread_join(th[i], NULL);

    int error = 0;
    int64_t n_fail = 0;
    const char *what = cfg.fixed ? "tolerance" : "bound";
    double use_all = 0;
    if (cfg.fixed)
        printf("attention recomputed from stored q/k/v (%s storage; fixed tolerances: output %.3g relative, lse "
               "%.3g absolute)\n", kvs_dtype_name(dt), cfg.tol, cfg.lse_tol);
    else
        printf("attention recomputed from stored q/k/v (%s storage, u = 2^%d; per-row error bound; usage = error / "
               "bound)\n", kvs_dtype_name(dt), (int)lround(log2(cfg.u)));
    for (int l = 0; l < L; l++) {
        double mr = 0, ml = 0, uo = 0, ul = 0;
        int64_t wp = -1, up = -1, lf = 0;
        int wh = -1, uh = -1;
        for (int h = 0; h < Hkv; h++) {
            stream_result *r = &res[l * Hkv + h];
            if (r->status != KVS_OK) {
                fprintf(stderr, "kvsim verify: %s\n", r->detail[0] ? r->detail : kvs_strerror(r->status));
                error = 1;
            }
            if (r->max_rel > mr || wp < 0) mr = r->max_rel, wp = r->worst_pos, wh = r->worst_head;
            if (r->max_lse > ml) ml = r->max_lse;
            if (fmax(r->use_o, r->use_lse) > fmax(uo, ul) || up < 0) up = r->use_pos, uh = r->use_head;
            uo = fmax(uo, r->use_o);
            ul = fmax(ul, r->use_lse);
            lf += r->n_fail;
        }
        n_fail += lf;
        use_all = fmax(use_all, fmax(uo, ul));
        printf("layer %3d: max rel output error %.3e (position %lld, head %d), max lse error %.3e, %s usage "
               "output %.3g lse %.3g (position %lld, head %d)  ", l, mr, (long long)wp, wh, ml, what, uo, ul,
               (long long)up, uh);
        if (lf) printf("FAIL (%lld rows)\n", (long long)lf);
        else printf("ok\n");
    }
    free(res);
    free(th);
    kvs_trace_close(t);
    if (error) {
        (void)kvs_cli_finish_stdout("verify"); /* a write error is reported too; exit 1 either way */
        return KVS_EXIT_FAIL;
    }
    if (n_fail) {
        fprintf(stderr, "kvsim verify: %s: stored attention outputs do not match the recomputation (%lld rows "
                        "exceed their %s)\n", path, (long long)n_fail, cfg.fixed ? "tolerance" : "error bound");
        (void)kvs_cli_finish_stdout("verify");
        return KVS_EXIT_FAIL;
    }
    printf("verify: OK (max %s usage %.3g)\n", what, use_all);
    return kvs_cli_finish_stdout("verify");
}

/* ------------------------------------------------------------------------------------------------
 * kvsim export TRACE --layer L --what q|k|v|o|lse|tokens --out F.npy
 * ---------------------------------------------------------------------------------------------- */

static void export_usage(FILE *f) {
    fprintf(f, "usage: kvsim export TRACE --what q|k|v|o|lse|tokens [--layer L] --out FILE.npy\n\n"
               "Writes one array of one layer as a NumPy .npy file (values decoded to float32):\n"
               "  q, o    float32 [positions, n_heads, head_dim]\n"
               "  k, v    float32 [positions, n_kv_heads, head_dim]\n"
               "  lse     float32 [positions, n_heads]\n"
               "          (a lean trace, capture --record qkv, stores no o or lse: they are recomputed in fp32\n"
               "          from its q/k/v)\n"
               "  tokens  int32   [positions] (no --layer needed)\n\n"
               "--out FILE: a regular file is replaced atomically (written beside it, then renamed); a symbolic\n"
               "link is written through (its target is replaced, the link stays); a FIFO or device is written\n"
               "directly; - is standard output (the \"wrote\" line then goes to stderr).\n"
               "Each option may be given once.\n");
}

/* Writes a .npy file to o: the common/npy.h header, then the elements little-endian (4 bytes each). */
static kvs_status write_npy(kvs_out *o, kvs_npy_type type, const int64_t *shape, int ndim, const void *data) {
    uint8_t hdr[640], chunk[1 << 16];
    size_t hlen;
    kvs_status s = kvs_npy_header(type, shape, ndim, hdr, sizeof hdr, &hlen);
    if (s != KVS_OK || (s = kvs_out_write(o, hdr, hlen)) != KVS_OK) return s;
    uint64_t count = 1;
    for (int i = 0; i < ndim; i++) count *= (uint64_t)shape[i];
    const uint32_t *src = data; /* float32 and int32 alike: their 4 bytes */
    for (uint64_t i = 0; i < count;) {
        size_t m = 0;
        for (; m < sizeof chunk / 4 && i < count; m++, i++) {
            uint32_t u;
            memcpy(&u, src + i, 4);
            kvs_put_u32(chunk + 4 * m, u);
        }
        if ((s = kvs_out_write(o, chunk, 4 * m)) != KVS_OK) return s;
    }
    return KVS_OK;
}

/* Writes the .npy to `path` through common/kvs_out.h (nothing half-written is left on failure);
 * *to_stdout: whether it went to standard output. */
static kvs_status export_npy(const char *path, kvs_npy_type type, const int64_t *shape, int ndim, const void *data,
                             int *to_stdout) {
    kvs_out *o = NULL;
    kvs_status s = kvs_out_open(path, &o);
    if (s != KVS_OK) return s;
    *to_stdout = kvs_out_is_stdout(o);
    if ((s = write_npy(o, type, shape, ndim, data)) != KVS_OK) {
        kvs_out_abort(o);
        return s;
    }
    return kvs_out_commit(o);
}

int kvs_cmd_export(int argc, char **argv) {
    static const struct option opts[] = {{"layer", required_argument, NULL, 'l'},
                                         {"what", required_argument, NULL, 'w'},
                                         {"out", required_argument, NULL, 'o'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    long layer = -1;
    const char *what = NULL, *out_path = NULL;
    int seen[4] = {0};
    opterr = 0;
    optind = 1;
    int c, li = -1;
    while ((c = getopt_long(argc, argv, ":h", opts, &li)) != -1) {
        if (c != ':' && c != '?' && option_once("export", opts, li, seen)) return KVS_EXIT_USAGE;
        li = -1;
        switch (c) {
        case 'h': export_usage(stdout); return kvs_cli_finish_stdout("export");
        case 'l':
            if (kvs_cli_parse_long("--layer", optarg, 0, KVS_TRACE_MAX_LAYERS - 1, &layer) != KVS_OK)
                return kvs_cli_usage_error("export", "%s", kvs_last_error());
            break;
        case 'w': what = optarg; break;
        case 'o': out_path = optarg; break;
        default: return option_error("export", c, argv);
        }
    }
    if (argc - optind != 1) return positional_error("export", argc, argv);
    if (!what) return kvs_cli_usage_error("export", "missing --what (q, k, v, o, lse or tokens)");
    int wi = -1;
    static const char *const whats[] = {"q", "k", "v", "o", "lse", "tokens"};
    for (int i = 0; i < 6; i++)
        if (!strcmp(what, whats[i])) wi = i;
    if (wi < 0) return kvs_cli_usage_error("export", "--what: '%s' is not one of q, k, v, o, lse, tokens", what);
    if (!out_path) return kvs_cli_usage_error("export", "missing --out FILE.npy");
    if (wi != 5 && layer < 0) return kvs_cli_usage_error("export", "missing --layer (needed for --what %s)", what);

    kvs_trace *t = NULL;
    kvs_status s = kvs_trace_open(argv[optind], &t);
    if (s != KVS_OK) return kvs_cli_fail("export", s);
    const kvs_trace_info *in = kvs_trace_info_get(t);
    uint32_t in_flags = in->capture.flags; /* `in` is borrowed from t, closed before the message */
    int64_t N = in->n_positions;
    int H = in->model.n_heads, Hkv = in->model.n_kv_heads, d = in->model.head_dim, G = H / Hkv;
    int to_stdout = 0;
    const char *out_name = strcmp(out_path, "-") ? out_path : "standard output";
    if (wi == 5) {
        int64_t shape[1] = {N};
        s = export_npy(out_path, KVS_NPY_I32, shape, 1, kvs_trace_tokens(t), &to_stdout);
        kvs_trace_close(t);
        if (s != KVS_OK) return kvs_cli_fail("export", s);
        fprintf(to_stdout ? stderr : stdout, "wrote %s: tokens int32 [%lld]\n", out_name, (long long)N);
        return kvs_cli_finish_stdout("export");
    }
    if (layer >= in->model.n_layers) {
        int n_layers = in->model.n_layers; /* `in` is borrowed from t */
        kvs_trace_close(t);
        return kvs_cli_usage_error("export", "--layer %ld: the trace has layers 0..%d", layer, n_layers - 1);
    }
    int per_pos_heads = (wi == 1 || wi == 2) ? Hkv : H; /* k, v per KV head; q, o, lse per query head */
    size_t row = wi == 4 ? 1 : (size_t)d;
    size_t n_elem = (size_t)N * (size_t)per_pos_heads * row;
    float *arr = malloc(n_elem * sizeof(float));
    kvs_trace_block *b = NULL;
    if (!arr) {
        kvs_trace_close(t);
        return kvs_cli_fail("export", kvs_fail(KVS_ERR_NOMEM, "cannot allocate %zu floats", n_elem));
    }
    if ((s = kvs_trace_block_create(t, &b)) != KVS_OK) goto done;
    for (int kh = 0; kh < Hkv && s == KVS_OK; kh++) {
        for (int64_t blk = 0; blk < in->n_blocks && s == KVS_OK; blk++) {
            if ((s = kvs_trace_read_block(t, (int)layer, kh, blk, b)) != KVS_OK) break;
            for (int32_t i = 0; i < b->n_pos; i++) {
                size_t p = (size_t)(b->first_pos + i);
                if (wi == 1 || wi == 2) {
                    const float *src = (wi == 1 ? b->k : b->v) + (size_t)i * row;
                    memcpy(arr + (p * (size_t)Hkv + (size_t)kh) * row, src, row * sizeof(float));
                    continue;
                }
                for (int g = 0; g < G; g++) {
                    size_t h = (size_t)kh * (size_t)G + (size_t)g;
                    const float *src = wi == 0 ? b->q : wi == 3 ? b->o : b->lse;
                    memcpy(arr + (p * (size_t)H + h) * row, src + ((size_t)i * (size_t)G + (size_t)g) * row,
                           row * sizeof(float));
                }
            }
        }
    }
    if (s == KVS_OK) {
        int64_t shape[3] = {N, per_pos_heads, d};
        s = export_npy(out_path, KVS_NPY_F32, shape, wi == 4 ? 2 : 3, arr, &to_stdout);
    }
done:
    kvs_trace_block_free(b);
    free(arr);
    kvs_trace_close(t);
    if (s != KVS_OK) return kvs_cli_fail("export", s);
    FILE *msg = to_stdout ? stderr : stdout; /* the .npy bytes own standard output */
    if (wi == 4) fprintf(msg, "wrote %s: layer %ld lse float32 [%lld, %d]\n", out_name, layer, (long long)N, per_pos_heads);
    else
        fprintf(msg, "wrote %s: layer %ld %s float32 [%lld, %d, %d]\n", out_name, layer, what, (long long)N,
                per_pos_heads, d);
    if ((wi == 3 || wi == 4) && (in_flags & KVS_TRACE_FLAG_QKV))
        fprintf(msg, "(a lean trace stores no %s: recomputed in fp32 from the stored q/k/v)\n", what);
    return kvs_cli_finish_stdout("export");
}

/* ------------------------------------------------------------------------------------------------
 * kvsim trace recover IN OUT
 * ---------------------------------------------------------------------------------------------- */

static void trace_usage(FILE *f) {
    fprintf(f, "usage: kvsim trace recover IN OUT\n\n"
               "  recover   restores the complete blocks of a trace whose writer was killed (IN is usually\n"
               "            CAPTURE.kvt.partial) into a complete, valid trace OUT\n\n"
               "OUT may be IN's final name (kvsim trace recover cap.kvt.partial cap.kvt): a regular file is\n"
               "replaced atomically (written beside it, then renamed), a symbolic link is written through, a\n"
               "FIFO or device directly, - is standard output (the report then goes to stderr).\n"
               "Prints the positions and blocks recovered and what was left out, and why. Exit status:\n"
               "  0  clean recovery: everything IN holds was recovered, except an unfinished tail (the chunks of\n"
               "     a block the killed writer had not finished, a chunk cut off by the end of the file)\n"
               "  1  partial recovery: OUT holds the positions before the first bad chunk, and stderr says\n"
               "     \"partial recovery\", how many positions and blocks IN holds past it that were dropped,\n"
               "     the bad chunk, its offset and its error (a checksum or header check failed, or the chunks\n"
               "     are out of order); or a failure: nothing to recover, I/O error (no OUT is written)\n"
               "  2  bad usage\n");
}

/* Prints the outcome of a recovery: what OUT holds (stdout, or stderr when OUT is standard output), an
 * unfinished tail that was left out, and for a partial recovery what was dropped and why (stderr).
 * @return the exit status: 0 clean, 1 partial. */
static int recover_report(const char *in_path, const char *out_path, const kvs_trace_recovery *r, int out_is_stdout) {
    FILE *msg = out_is_stdout ? stderr : stdout;
    fprintf(msg, "recovered %lld positions (%lld block%s) from %s into %s\n", (long long)r->positions,
            (long long)r->blocks, r->blocks == 1 ? "" : "s", in_path, out_is_stdout ? "standard output" : out_path);
    if (!r->partial) {
        if (r->tail[0]) fprintf(msg, "left out (an unfinished tail, as a killed capture leaves): %s\n", r->tail);
        return KVS_EXIT_OK;
    }
    fprintf(stderr, "kvsim trace recover: partial recovery: ");
    if (r->lost_positions > 0)
        fprintf(stderr, "dropped %lld positions (%lld..%lld, %lld block%s) that %s holds past the first bad chunk",
                (long long)r->lost_positions, (long long)r->positions, (long long)r->input_positions - 1,
                (long long)r->lost_blocks, r->lost_blocks == 1 ? "" : "s", in_path);
    else
        fprintf(stderr, "dropped what %s holds past the first bad chunk (no chunk header is readable there)", in_path);
    fprintf(stderr, " (%llu bytes from offset %lld on); first bad chunk%s%s at offset %lld: %s\n",
            (unsigned long long)r->dropped_bytes, (long long)r->bad_offset, r->bad_chunk[0] ? ": " : "", r->bad_chunk,
            (long long)r->bad_offset, r->bad_error);
    return KVS_EXIT_FAIL;
}

int kvs_cmd_trace(int argc, char **argv) {
    if (argc < 2) return kvs_cli_usage_error("trace", "missing subcommand (recover)");
    if (kvs_cli_is_help(argv[1])) {
        trace_usage(stdout);
        return kvs_cli_finish_stdout("trace");
    }
    if (strcmp(argv[1], "recover") != 0) return kvs_cli_usage_error("trace", "unknown subcommand '%s'", argv[1]);
    static const struct option opts[] = {{"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
    opterr = 0;
    optind = 1;
    int c, sub_argc = argc - 1;
    char **sub_argv = argv + 1;
    while ((c = getopt_long(sub_argc, sub_argv, ":h", opts, NULL)) != -1) {
        if (c == 'h') {
            trace_usage(stdout);
            return kvs_cli_finish_stdout("trace recover");
        }
        return option_error("trace recover", c, sub_argv);
    }
    int npos = sub_argc - optind;
    if (npos < 2) return kvs_cli_usage_error("trace recover", "needs IN and OUT arguments");
    if (npos > 2) return kvs_cli_usage_error("trace recover", "unexpected argument '%s'", sub_argv[optind + 2]);
    const char *in_path = sub_argv[optind], *out_path = sub_argv[optind + 1];
    kvs_trace_recovery rep;
    kvs_status s = kvs_trace_recover_with_report(in_path, out_path, &rep);
    if (s != KVS_OK) return kvs_cli_fail("trace recover", s);
    int rc = recover_report(in_path, out_path, &rep, kvs_out_path_is_stdout(out_path));
    int wrc = kvs_cli_finish_stdout("trace recover");
    return rc != KVS_EXIT_OK ? rc : wrc;
}
