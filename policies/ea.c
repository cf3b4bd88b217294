/* ea.c — Expected Attention (Devoto, Jeblick, Jégou, arXiv 2510.00636; the authors' code is NVIDIA/kvpress
 * ExpectedAttentionPress with AdaKVPress), as specified in ../shared/POLICY_SPEC_2.md §2.1 (with §1.1 inverse
 * RoPE and §1.2 R̄, common/kvs_rope.h), PREFILL mode: the prompt is compressed once, every generated token is kept
 * (prompt-only budget, §0.3 regime 2: compare at measured memory).
 *
 * Score of a cached key j at the end of a prompt (a0 = the prompt's end, the first position that reads the cache):
 * per query head g, the pre-RoPE prompt queries (positions >= n_sink) give mu_g and the population covariance
 * Sigma_g; moved to the next T_f positions by the averaged rotation R̄(a0, T_f): mu' = R̄ mu, Sigma' = R̄ Sigma R̄^T;
 * z_g[j] = s mu'.k_j + s^2/2 k_j^T Sigma' k_j (the log of E[exp(s q.k)] for q ~ N(mu', Sigma')), softmax over the
 * non-sink candidates, mean over the group, times (a + eps) |v_j|; the first n_sink positions get max + 1.
 * head_alloc=uniform keeps each KV head's TOPK(score, B) (ties: the older position, POLICY_SPEC §1.4);
 * head_alloc=adakv (the evaluated leaderboard configuration, the default) pools the layer: per head floor(alpha B)
 * best forced, then the Hkv (P - B) lowest (head, position) scores of the layer pruned (ties: the lower flat index
 * first, §2.1 G-ADAKV), done in the allocation pass, which hands each (layer, KV head) its count as its budget.
 *
 * Decisions (spec ambiguities and what a trace lacks):
 *  - eps defaults to 0.01, the leaderboard entry that goes with adakv; preset `kvpress-class` is the class default
 *    (uniform, eps 0).
 *  - RoPE: theta and layout from the trace header; the Llama-3 scaling, which the header does not record, from
 *    rope_scaling (none, llama31, llama32: the Llama-3.1/3.2 config.json values); `auto` refuses a model whose name
 *    says Llama-3 (§1.1 "Trace-format gap"), and a trace without theta is refused.
 *  - Later turns (multi-turn, §0.3 [SIM-CHOICE]): the same rule over the resident set plus the new prompt, the
 *    statistics from that turn's prompt queries, each head keeping its budget (adakv: the first turn's count).
 *  - Accounting: the resident positions (the default); the reference only masks what Ada-KV prunes and keeps all P
 *    (mem_ref_masked = 2dP), which kvsim does not count: the flattened Ada-KV layout is what the budget means.
 *  - DECODE mode (periodic compression while generating) is not in this file: a policy has one budget scope.
 * Sliding-window layers (sim/replay.h): the positions before the host's `first` (window_evict) leave the resident set
 * at once (kept prompt positions and generated tokens alike), and a prompt's compression takes no candidate before
 * it; sinks are the first n_sink positions that still exist. The query statistics are not cache contents and are
 * unaffected (every prompt query from n_sink on, as on a full layer). A budget B >= W keeps every candidate with
 * head_alloc=uniform, so the policy holds exactly the window. head_alloc=adakv: the allocation pass pools the layer's
 * heads over the whole first prompt (it is not told the window: the pool's inputs are computed as on a full layer),
 * and the host holds each head to its pooled count, so a head whose count is below the window's prompt positions
 * still drops some of them at B >= W (what the pool asked for); a head whose count covers the window keeps it whole.
 * Cost: per compression G (|I| d^2 + |cand| (d + d^2)) MACs, once per prompt and (layer, KV head): the budgets of a
 * replay share it (kvs_policy_shared, keyed by the parameters that enter the score; the allocation pass reads the
 * heads in parallel).
 */
#include "ea_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/kvs_math.h"
#include "../common/kvs_rope.h"
#include "../sim/policy_memo.h"
#include "../trace/trace.h"
#include "held.h"
#include "registry.h"

enum { P_NFUT, P_NSINK, P_COV, P_VNORM, P_EPS, P_ALLOC, P_ALPHA, P_SCALING };
enum { ALLOC_UNIFORM = 0, ALLOC_ADAKV = 1 };

static const kvs_policy_param ea_params[] = {
    [P_NFUT] = {.key = "n_future", .type = KVS_PARAM_INT, .def = 512, .lo = 1, .hi = 1 << 30,
                .help = "T_f: future positions the query statistics are rotated over (R̄)"},
    [P_NSINK] = {.key = "n_sink", .type = KVS_PARAM_INT, .def = 4, .lo = 0, .hi = 1 << 24,
                 .help = "first positions always kept, not scored, not in the statistics"},
    [P_COV] = {.key = "use_cov", .type = KVS_PARAM_BOOL, .def = 1, .help = "include s^2/2 k^T Sigma k"},
    [P_VNORM] = {.key = "use_vnorm", .type = KVS_PARAM_BOOL, .def = 1, .help = "multiply by |v|"},
    [P_EPS] = {.key = "eps", .type = KVS_PARAM_DOUBLE, .def = 0.01, .lo = 0, .hi = 1e6,
               .help = "score = (a + eps) |v| (0.01: kvpress leaderboard with adakv; the class default is 0)"},
    [P_ALLOC] = {.key = "head_alloc", .type = KVS_PARAM_ENUM, .def = ALLOC_ADAKV, .choices = "uniform|adakv",
                 .help = "uniform: B per KV head; adakv: the layer's Hkv*B pooled across heads (alpha floor)"},
    [P_ALPHA] = {.key = "alpha_safe", .type = KVS_PARAM_DOUBLE, .def = 0.2, .lo = 0, .hi = 1,
                 .help = "Ada-KV safeguard: each head keeps at least floor(alpha B) of its best"},
    [P_SCALING] = {.key = "rope_scaling", .type = KVS_PARAM_ENUM, .def = 0, .choices = KVS_ROPE_SCALING_CHOICES,
                   .help = "RoPE frequency scaling the trace does not record: none; llama31 (factor 8, low 1, high 4, "
                           "orig 8192); llama32 (factor 32); auto = none, refused for a Llama-3 model name"},
};

static const kvs_policy_preset ea_presets[] = {
    {.name = "leaderboard", .params = "head_alloc=adakv,eps=0.01",
     .help = "kvpress evaluate_registry \"expected_attention\": AdaKVPress(ExpectedAttentionPress(epsilon=1e-2)); "
             "budget B_p = int(P (1 - cr))"},
    {.name = "kvpress-class", .params = "head_alloc=uniform,eps=0",
     .help = "ExpectedAttentionPress class defaults (uniform per head, eps 0)"},
};

/* ---- the score ----------------------------------------------------------------------------------------------- */

kvs_status kvs_ea_scores(const kvs_ea_params *p, const double *freq, int layout, double scale, int G, int d,
                         const float *q, int64_t q_first, int64_t nq, int64_t a0, const float *k, const float *v,
                         const int32_t *cand, int64_t nc, double *score) {
    size_t dd = (size_t)d * (size_t)d;
    double *mu = malloc((size_t)d * sizeof *mu), *S = malloc(dd * sizeof *S), *M = malloc(dd * sizeof *M),
           *x = malloc((size_t)d * sizeof *x), *y = malloc((size_t)d * sizeof *y), *cb = malloc((size_t)d * sizeof *cb),
           *sb = malloc((size_t)d * sizeof *sb), *z = malloc((size_t)(nc > 0 ? nc : 1) * sizeof *z);
    double *pre = malloc((size_t)(nq > 0 ? nq : 1) * (size_t)d * sizeof *pre);
    kvs_status st = KVS_OK;
    if (!mu || !S || !M || !x || !y || !cb || !sb || !z || !pre) {
        st = kvs_fail(KVS_ERR_NOMEM, "ea: out of memory");
        goto done;
    }
    kvs_rope_avg(d, a0, p->n_future, freq, cb, sb);
    for (int64_t c = 0; c < nc; c++) score[c] = 0;
    int64_t first_stat = p->n_sink > q_first ? p->n_sink - q_first : 0, m = nq - first_stat;
    for (int g = 0; g < G; g++) {
        memset(mu, 0, (size_t)d * sizeof *mu);
        memset(S, 0, dd * sizeof *S);
        for (int64_t i = first_stat; i < nq; i++) { /* pre-RoPE queries at their own positions (§1.1) */
            const float *qi = q + ((size_t)i * (size_t)G + (size_t)g) * (size_t)d;
            for (int a = 0; a < d; a++) x[a] = qi[a];
            kvs_rope_invert_f64(x, pre + (size_t)i * d, d, layout, q_first + i, freq);
            for (int a = 0; a < d; a++) mu[a] += pre[(size_t)i * d + a] / (double)m;
        }
        if (p->use_cov) { /* the population covariance, its upper triangle accumulated and mirrored */
            for (int64_t i = first_stat; i < nq; i++) {
                const double *r = pre + (size_t)i * d;
                for (int a = 0; a < d; a++) x[a] = r[a] - mu[a];
                for (int a = 0; a < d; a++)
                    for (int b = a; b < d; b++) S[a * d + b] += x[a] * x[b];
            }
            for (int a = 0; a < d; a++)
                for (int b = a; b < d; b++) S[b * d + a] = S[a * d + b] = S[a * d + b] / (double)m;
        }
        kvs_rope_avg_apply(mu, mu, d, layout, cb, sb);
        if (p->use_cov) { /* Sigma' = R̄ Sigma R̄^T: R̄ on every column, then on every row */
            for (int c = 0; c < d; c++) {
                for (int a = 0; a < d; a++) x[a] = S[a * d + c];
                kvs_rope_avg_apply(x, y, d, layout, cb, sb);
                for (int a = 0; a < d; a++) M[a * d + c] = y[a];
            }
            for (int r = 0; r < d; r++) kvs_rope_avg_apply(M + (size_t)r * d, S + (size_t)r * d, d, layout, cb, sb);
        }
        int64_t nz = 0;
        double zmax = -INFINITY;
        for (int64_t c = 0; c < nc; c++) {
            if (cand[c] < p->n_sink) continue;
            const float *kj = k + (size_t)cand[c] * (size_t)d;
            double lin = 0, quad = 0;
            for (int a = 0; a < d; a++) lin += mu[a] * kj[a];
            if (p->use_cov) /* k^T Sigma' k over the upper triangle: the diagonal once, the rest twice */
                for (int a = 0; a < d; a++) {
                    double row = 0.5 * S[a * d + a] * kj[a];
                    for (int b = a + 1; b < d; b++) row += S[a * d + b] * kj[b];
                    quad += 2.0 * kj[a] * row;
                }
            z[c] = scale * lin + 0.5 * scale * scale * quad;
            if (z[c] > zmax) zmax = z[c];
            nz++;
        }
        if (!nz) continue;
        double sum = 0;
        for (int64_t c = 0; c < nc; c++)
            if (cand[c] >= p->n_sink) sum += (z[c] = exp(z[c] - zmax));
        for (int64_t c = 0; c < nc; c++)
            if (cand[c] >= p->n_sink) score[c] += z[c] / sum / (double)G;
    }
    double smax = -INFINITY;
    for (int64_t c = 0; c < nc; c++) {
        if (cand[c] < p->n_sink) continue;
        if (p->use_vnorm) {
            const float *vj = v + (size_t)cand[c] * (size_t)d;
            double nv = 0;
            for (int a = 0; a < d; a++) nv += (double)vj[a] * vj[a];
            score[c] = (score[c] + p->eps) * sqrt(nv);
        }
        if (score[c] > smax) smax = score[c];
    }
    if (smax == -INFINITY) smax = 0;
    for (int64_t c = 0; c < nc; c++)
        if (cand[c] < p->n_sink) score[c] = smax + 1;
done:
    free(mu), free(S), free(M), free(x), free(y), free(cb), free(sb), free(z), free(pre);
    return st;
}

/* kvs_ea_scores of the candidates over a view, shared by the configurations of a replay that ask for the same
 * computation (kvs_policy_shared: the budgets of a sweep score the first prompt alike). The key is everything the
 * score depends on besides the view's rows: the parameters that enter it (T_f, n_sink, use_cov, use_vnorm, eps),
 * the RoPE frequencies (theta, head_dim and the scaling), the layout, the softmax scale and the candidates. */
typedef struct {
    const kvs_ea_params *p;
    const double *freq;
    int layout;
    double scale;
    const kvs_policy_view *v;
    const int32_t *cand;
    int64_t nc;
} ea_job;

static kvs_status ea_job_run(void *ctx, void *out) {
    const ea_job *j = ctx;
    const kvs_policy_view *v = j->v;
    return kvs_ea_scores(j->p, j->freq, j->layout, j->scale, v->group, v->head_dim, v->q, v->q_first, v->n_q, v->n,
                         v->k, v->v, j->cand, j->nc, out);
}

static kvs_status ea_scores_shared(const kvs_policy_view *v, const kvs_ea_params *p, const double *freq, int layout,
                                   double scale, const int32_t *cand, int64_t nc, double *score) {
    ea_job job = {.p = p, .freq = freq, .layout = layout, .scale = scale, .v = v, .cand = cand, .nc = nc};
    if (!v->memo) return ea_job_run(&job, score);
    enum { HEAD = 8 };
    size_t nf = (size_t)v->head_dim / 2, head = (HEAD + nf) * sizeof(double);
    unsigned char *key = malloc(head + (size_t)nc * sizeof(int32_t));
    if (!key) return ea_job_run(&job, score); /* no memory for the key: computed, not shared */
    double h[HEAD] = {(double)p->n_future, (double)p->n_sink, p->use_cov, p->use_vnorm, p->eps, layout, scale,
                      (double)nc};
    memcpy(key, h, sizeof h);
    memcpy(key + sizeof h, freq, nf * sizeof(double));
    memcpy(key + head, cand, (size_t)nc * sizeof(int32_t));
    kvs_status st = kvs_policy_shared(v, "ea.scores", key, head + (size_t)nc * sizeof(int32_t), score,
                                      (size_t)nc * sizeof(double), ea_job_run, &job);
    free(key);
    return st;
}

/* ---- Ada-KV allocation --------------------------------------------------------------------------------------- */

typedef struct {
    double s;
    int64_t flat;
} flat_score;

static int cmp_prune(const void *a, const void *b) { /* prune order: lowest score first, then lower flat index */
    const flat_score *x = a, *y = b;
    if (x->s != y->s) return x->s < y->s ? -1 : 1;
    return x->flat < y->flat ? -1 : x->flat > y->flat;
}

kvs_status kvs_ea_adakv_counts(const double *scores, int Hkv, int64_t n, int64_t bp, double alpha, uint8_t *keep,
                               int64_t *counts) {
    size_t tot = (size_t)Hkv * (size_t)n;
    flat_score *fs = malloc(tot * sizeof *fs);
    if (!fs) {
        return kvs_fail(KVS_ERR_NOMEM, "ea: out of memory");
    }
    int64_t n_safe = (int64_t)floor((double)bp * alpha);
    for (size_t i = 0; i < tot; i++) fs[i] = (flat_score){scores[i], (int64_t)i};
    for (int h = 0; h < Hkv; h++) { /* the head's n_safe best (prune order reversed) are forced to +inf */
        flat_score *row = fs + (size_t)h * (size_t)n;
        qsort(row, (size_t)n, sizeof *row, cmp_prune);
        for (int64_t i = n - n_safe; i < n; i++) row[i].s = INFINITY;
    }
    qsort(fs, tot, sizeof *fs, cmp_prune);
    int64_t prune = (int64_t)Hkv * (n - bp);
    for (int h = 0; h < Hkv; h++) counts[h] = n;
    if (keep) memset(keep, 1, tot);
    for (int64_t i = 0; i < prune; i++) {
        counts[fs[i].flat / n]--;
        if (keep) keep[fs[i].flat] = 0;
    }
    free(fs);
    return KVS_OK;
}

void kvs_ea_keep_top(const double *score, int64_t n, int64_t count, int32_t *out) {
    flat_score *fs = malloc((size_t)(n > 0 ? n : 1) * sizeof *fs);
    if (!fs) { /* no memory for the order: keep the newest, a valid set of the right size */
        for (int64_t i = 0; i < count; i++) out[i] = (int32_t)(n - count + i);
        return;
    }
    for (int64_t i = 0; i < n; i++) fs[i] = (flat_score){score[i], i};
    qsort(fs, (size_t)n, sizeof *fs, cmp_prune);
    for (int64_t i = 0; i < count; i++) out[i] = (int32_t)fs[n - count + i].flat;
    kvs_sort_positions(out, (size_t)count);
    free(fs);
}

/* ---- configuration ------------------------------------------------------------------------------------------- */

static kvs_status ea_validate(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget) {
    (void)budget;
    if (!(m->rope_theta > 0))
        return kvs_fail(KVS_ERR_INVALID_ARG, "ea: the trace records no RoPE theta: pre-RoPE queries cannot be recovered");
    if (m->head_dim % 2 || m->head_dim > KVS_TRACE_MAX_HEAD_DIM)
        return kvs_fail(KVS_ERR_INVALID_ARG, "ea: head_dim %d is not an even size up to %d", (int)m->head_dim,
                        KVS_TRACE_MAX_HEAD_DIM);
    kvs_rope_scaling sc;
    return kvs_rope_scaling_of((kvs_rope_scaling_choice)cfg->v[P_SCALING], m->model_name, "ea", &sc);
}

static kvs_ea_params params_of(const kvs_policy_config *cfg) {
    return (kvs_ea_params){.n_future = (int64_t)cfg->v[P_NFUT], .n_sink = (int64_t)cfg->v[P_NSINK],
                           .use_cov = cfg->v[P_COV] != 0, .use_vnorm = cfg->v[P_VNORM] != 0, .eps = cfg->v[P_EPS]};
}

static kvs_status freqs_of(const kvs_policy_config *cfg, const kvs_policy_model *m, double *freq) {
    kvs_rope_scaling sc;
    kvs_status st = kvs_rope_scaling_of((kvs_rope_scaling_choice)cfg->v[P_SCALING], m->model_name, "ea", &sc);
    if (st == KVS_OK) kvs_rope_freqs(m->rope_theta, m->head_dim, &sc, freq);
    return st;
}

/* ---- allocation pass (adakv): the first prompt's scores of every head of a layer -> per-head counts -------- */

typedef struct {
    kvs_policy_config cfg;
    kvs_policy_model m;
    int64_t budget, P;
    double freq[KVS_TRACE_MAX_HEAD_DIM / 2];
    double *scores; /* [L][Hkv][P] */
} ea_alloc;

static kvs_status ea_alloc_begin(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget,
                                 void **alloc) {
    *alloc = NULL;
    if ((int)cfg->v[P_ALLOC] != ALLOC_ADAKV || m->prompt_len <= budget) return KVS_OK; /* nothing to pool */
    ea_alloc *a = calloc(1, sizeof *a);
    if (!a) return kvs_fail(KVS_ERR_NOMEM, "ea: out of memory");
    a->cfg = *cfg, a->m = *m, a->budget = budget, a->P = m->prompt_len;
    kvs_status st = freqs_of(cfg, m, a->freq);
    if (st == KVS_OK) {
        a->scores = calloc((size_t)m->n_layers * (size_t)m->n_kv_heads * (size_t)a->P, sizeof *a->scores);
        if (!a->scores) st = kvs_fail(KVS_ERR_NOMEM, "ea: out of memory");
    }
    if (st != KVS_OK) {
        free(a);
        return st;
    }
    *alloc = a;
    return KVS_OK;
}

static kvs_status ea_alloc_prefill(void *alloc, int layer, int kv_head, const kvs_policy_view *v) {
    ea_alloc *a = alloc;
    int32_t *cand = malloc((size_t)a->P * sizeof *cand);
    if (!cand) return kvs_fail(KVS_ERR_NOMEM, "ea: out of memory");
    for (int64_t j = 0; j < a->P; j++) cand[j] = (int32_t)j;
    kvs_ea_params p = params_of(&a->cfg);
    kvs_status st = ea_scores_shared(v, &p, a->freq, a->m.rope_layout, a->m.scale, cand, a->P,
                                     a->scores + ((size_t)layer * a->m.n_kv_heads + kv_head) * (size_t)a->P);
    free(cand);
    return st;
}

static kvs_status ea_alloc_end(void *alloc, int64_t *budgets) {
    ea_alloc *a = alloc;
    int Hkv = a->m.n_kv_heads;
    int64_t *cnt = malloc((size_t)Hkv * sizeof *cnt);
    if (!cnt) return kvs_fail(KVS_ERR_NOMEM, "ea: out of memory");
    kvs_status st = KVS_OK;
    for (int l = 0; l < a->m.n_layers && st == KVS_OK; l++) {
        st = kvs_ea_adakv_counts(a->scores + (size_t)l * Hkv * (size_t)a->P, Hkv, a->P, a->budget,
                                 a->cfg.v[P_ALPHA], NULL, cnt);
        for (int h = 0; h < Hkv && st == KVS_OK; h++) budgets[l * Hkv + h] = cnt[h] > 0 ? cnt[h] : 1;
    }
    free(cnt);
    return st;
}

static const void *ea_alloc_shared(void *alloc) { return alloc; }

static void ea_alloc_free(void *alloc) {
    ea_alloc *a = alloc;
    if (a) free(a->scores);
    free(a);
}

/* ---- instance ------------------------------------------------------------------------------------------------ */

typedef struct {
    kvs_policy_model m;
    kvs_ea_params p;
    int adakv;
    int64_t budget;
    double freq[KVS_TRACE_MAX_HEAD_DIM / 2];
    int32_t *res, *cand, *keep;
    double *score;
    int64_t n_res, cap;
    const double *first_scores; /* adakv: the allocation pass's scores of the first prompt for this head (the same
                                 * view, so the same numbers), or NULL */
    int64_t first_n;
    int64_t first;          /* positions before it were evicted by the host (sliding-window layer); 0 otherwise */
} ea_state;

static kvs_status ea_create(const kvs_policy_init *init, void **state) {
    ea_state *s = calloc(1, sizeof *s);
    if (!s) return kvs_fail(KVS_ERR_NOMEM, "ea: out of memory");
    s->m = *init->model;
    s->p = params_of(init->cfg);
    s->adakv = (int)init->cfg->v[P_ALLOC] == ALLOC_ADAKV;
    s->budget = init->budget;
    s->cap = init->model->n_positions + 1;
    const ea_alloc *a = init->shared;
    if (a && a->scores) {
        s->first_scores = a->scores + ((size_t)init->layer * a->m.n_kv_heads + init->kv_head) * (size_t)a->P;
        s->first_n = a->P;
    }
    kvs_status st = freqs_of(init->cfg, init->model, s->freq);
    s->res = malloc((size_t)s->cap * sizeof *s->res);
    s->cand = malloc((size_t)s->cap * sizeof *s->cand);
    s->keep = malloc((size_t)s->cap * sizeof *s->keep);
    s->score = malloc((size_t)s->cap * sizeof *s->score);
    if (st == KVS_OK && (!s->res || !s->cand || !s->keep || !s->score)) st = kvs_fail(KVS_ERR_NOMEM, "ea: out of memory");
    if (st != KVS_OK) {
        free(s->res), free(s->cand), free(s->keep), free(s->score), free(s);
        return st;
    }
    *state = s;
    return KVS_OK;
}

static void ea_free(void *state) {
    ea_state *s = state;
    if (!s) return;
    free(s->res), free(s->cand), free(s->keep), free(s->score), free(s);
}

static kvs_status ea_prefill(void *state, const kvs_policy_view *v) {
    ea_state *s = state;
    int64_t nc = 0, budget = s->budget;
    for (int64_t i = 0; i < s->n_res; i++) s->cand[nc++] = s->res[i];
    for (int64_t j = v->turn_begin > s->first ? v->turn_begin : s->first; j < v->n; j++) s->cand[nc++] = (int32_t)j;
    if (nc <= budget) { /* no compression when everything fits */
        memcpy(s->res, s->cand, (size_t)nc * sizeof *s->res);
        s->n_res = nc;
        return KVS_OK;
    }
    if (s->first_scores && v->turn_begin == 0 && nc == s->first_n) {
        memcpy(s->score, s->first_scores, (size_t)nc * sizeof *s->score); /* scored once, in the allocation pass */
    } else {
        kvs_status st = ea_scores_shared(v, &s->p, s->freq, s->m.rope_layout, v->scale, s->cand, nc, s->score);
        if (st != KVS_OK) return st;
    }
    if (s->adakv) {
        kvs_ea_keep_top(s->score, nc, budget, s->keep);
    } else {
        kvs_topk_f64(s->score, (size_t)nc, (size_t)budget, s->keep);
        kvs_sort_positions(s->keep, (size_t)budget);
    }
    for (int64_t i = 0; i < budget; i++) s->res[i] = s->cand[s->keep[i]];
    s->n_res = budget;
    return KVS_OK;
}

/* The host's eviction: the resident set is ascending, so the positions that left are its first entries. */
static kvs_status ea_window_evict(void *state, int64_t first) {
    ea_state *s = state;
    if (first <= s->first) return KVS_OK;
    s->first = first;
    s->n_res = kvs_positions_drop_before(s->res, s->n_res, first);
    return KVS_OK;
}

/* PREFILL mode: append only, attend everything resident. */
static kvs_status ea_select(void *state, const kvs_policy_view *v, kvs_policy_sel *sel) {
    ea_state *s = state;
    s->res[s->n_res++] = (int32_t)(v->n - 1);
    memcpy(sel->idx[0], s->res, (size_t)s->n_res * sizeof *s->res);
    sel->n[0] = s->n_res;
    return KVS_OK;
}

static int64_t ea_stored(void *state, int g, int32_t *out) {
    ea_state *s = state;
    (void)g;
    memcpy(out, s->res, (size_t)s->n_res * sizeof *out);
    return s->n_res;
}

static int ea_notes(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget, char *buf, size_t cap) {
    (void)m;
    int n = 0;
    if (cfg->v[P_NSINK] >= (double)budget)
        n += kvs_policy_note(buf, cap, "ea n_sink %g >= budget %lld: only sinks are kept", cfg->v[P_NSINK],
                             (long long)budget);
    return n;
}

const struct kvs_policy_ops kvs_policy_ea = {
    .version = KVS_POLICY_INTERFACE_VERSION,
    .name = "ea",
    .summary = "Expected Attention: keys scored by the expected attention of future queries (Gaussian pre-RoPE "
               "query statistics of the prompt, rotated over the next T_f positions) times |v|; prompt compressed "
               "once (Ada-KV head allocation by default)",
    .is_oracle = 0,
    .granularity = KVS_SEL_PER_KV_HEAD,
    .budget_scope = KVS_BUDGET_PROMPT,
    .params = ea_params,
    .n_params = (int)(sizeof ea_params / sizeof ea_params[0]),
    .presets = ea_presets,
    .n_presets = (int)(sizeof ea_presets / sizeof ea_presets[0]),
    .validate = ea_validate,
    .notes = ea_notes,
    .create = ea_create,
    .free = ea_free,
    .prefill = ea_prefill,
    .select = ea_select,
    .stored = ea_stored,
    .window_evict = ea_window_evict,
    .alloc_begin = ea_alloc_begin,
    .alloc_prefill = ea_alloc_prefill,
    .alloc_end = ea_alloc_end,
    .alloc_free = ea_alloc_free,
    .alloc_shared = ea_alloc_shared,
    .alloc_concurrent = 1,
};
