/* closed_loop.c — closed-loop decoding with a policy active inside the CPU forward pass (semantics in
 * closed_loop.h; ../shared/DESIGN.md "Closed-loop decoding", "Replay" 3 on leaks; POLICY_SPEC §1.2 call order).
 *
 * The policy model's attention hook keeps, per (layer, KV head), the policy model's own K/V history as
 * contiguous [positions][head_dim] rows (what sim/policy.h views expect) and its prompt queries; the policy
 * instances read only those. The full model runs in a separate kvs_model_state that this file never reads
 * except for its logits. Seeds, the allocation pass, the instances, the selection check (range, distinct, stored
 * positions, budget), the accounting and the metric formulas are the policy host's (sim/host.h), the replay's own:
 * a violating policy fails the run rather than producing numbers.
 */
#include "closed_loop.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/kvs_math.h"
#include "../common/sha256.h"
#include "host.h"

typedef struct {
    const kvs_closed_loop_opts *o;
    const struct kvs_policy_ops *ops;
    kvs_policy_model pm;
    int L, H, Hkv, G, d;
    int64_t N, P;           /* positions forwarded in all; prompt length */
    float *hk, *hv;         /* [L][Hkv][N][d] the policy model's keys / values */
    float *qb;              /* [L][Hkv][P][G][d] the policy model's prompt queries */
    void **states;          /* [L][Hkv] policy instances */
    int64_t *budgets;       /* [L][Hkv] after the allocation pass */
    void *alloc;
    const void *shared;
    int n_lists;
    int32_t **sel_idx;      /* [G][N] */
    int64_t *sel_n;         /* [G] */
    const float ***row_k, ***row_v; /* [G][N] merged-slot rows, NULL between steps */
    float **pbuf;           /* [G][N] the policy's attention probabilities (observe) */
    float *gk, *gv;         /* [N][d] gathered rows for lists with merged slots */
    float *fullp, *fullo;   /* [N], [d] exact attention over the policy model's own history */
    int32_t *order;         /* [N] */
    uint32_t *sort_scratch; /* [3N] */
    uint8_t *mark;          /* [N] zero between uses */
    kvs_host_check *check;  /* the host's selection check */
    kvs_turn turn;          /* the one turn: prompt [0, P), decode [P, N) */
    uint64_t run_seed;      /* kvs_host_run_seed of this run */
    int has_merged[KVS_CLOSED_LOOP_MAX_LISTS];
    uint8_t plain[KVS_CLOSED_LOOP_MAX_LISTS];
    kvs_policy_view *views; /* [Hkv] */
    void **sync;            /* [Hkv] */
    /* the representation stage (opts.codec; sim/host.h): one per layer, NULL without a codec */
    kvs_host_rep **reps;    /* [L] */
    const float **rep_k, **rep_v; /* [Hkv] the policy model's history rows a layer's stage reads */
    /* attention metrics of the position being forwarded, summed over (layer, query head) */
    double err_sum, recall_sum, overlap_sum, attended_sum, storage_sum, traffic_sum;
    int64_t n_costed;       /* (layer, KV head) costs summed */
    int64_t n_measured;
} cl_ctx;

static float *hist(const cl_ctx *c, float *base, int l, int h) {
    return base + ((size_t)l * (size_t)c->Hkv + (size_t)h) * (size_t)c->N * (size_t)c->d;
}

static float *prompt_q(const cl_ctx *c, int l, int h) {
    return c->qb + ((size_t)l * (size_t)c->Hkv + (size_t)h) * (size_t)c->P * (size_t)c->G * (size_t)c->d;
}

static void ctx_free(cl_ctx *c) {
    if (c->states)
        for (size_t i = 0; i < (size_t)c->L * (size_t)c->Hkv; i++) c->ops->free(c->states[i]);
    kvs_host_alloc_free(&c->o->policy, c->alloc);
    kvs_host_check_free(c->check);
    for (int g = 0; g < c->G; g++) {
        if (c->sel_idx) free(c->sel_idx[g]);
        if (c->pbuf) free(c->pbuf[g]);
        if (c->row_k) free((void *)c->row_k[g]);
        if (c->row_v) free((void *)c->row_v[g]);
    }
    free(c->hk);
    free(c->hv);
    free(c->qb);
    free(c->states);
    free(c->budgets);
    free(c->sel_idx);
    free(c->sel_n);
    free((void *)c->row_k);
    free((void *)c->row_v);
    free(c->pbuf);
    free(c->gk);
    free(c->gv);
    free(c->fullp);
    free(c->fullo);
    free(c->order);
    free(c->sort_scratch);
    free(c->mark);
    free(c->views);
    free(c->sync);
    if (c->reps)
        for (int l = 0; l < c->L; l++) kvs_host_rep_free(c->reps[l]);
    free(c->reps);
    free((void *)c->rep_k);
    free((void *)c->rep_v);
}

static kvs_status ctx_alloc(cl_ctx *c) {
    size_t LH = (size_t)c->L * (size_t)c->Hkv, N = (size_t)c->N, d = (size_t)c->d, G = (size_t)c->G;
    /* the policy model's K/V, whose rows S_t gathers: on huge pages where the system has them (kvs_alloc_rows) */
    c->hk = kvs_alloc_rows(LH * N * d * sizeof(float));
    c->hv = kvs_alloc_rows(LH * N * d * sizeof(float));
    c->qb = malloc(LH * (size_t)c->P * G * d * sizeof(float));
    c->states = calloc(LH, sizeof *c->states);
    c->budgets = malloc(LH * sizeof *c->budgets);
    c->sel_idx = calloc(G, sizeof *c->sel_idx);
    c->sel_n = calloc(G, sizeof *c->sel_n);
    c->row_k = calloc(G, sizeof *c->row_k);
    c->row_v = calloc(G, sizeof *c->row_v);
    c->pbuf = calloc(G, sizeof *c->pbuf);
    c->gk = malloc(N * d * sizeof(float));
    c->gv = malloc(N * d * sizeof(float));
    c->fullp = malloc(N * sizeof(float));
    c->fullo = malloc(d * sizeof(float));
    c->order = malloc(N * sizeof(int32_t));
    c->sort_scratch = malloc(3 * N * sizeof(uint32_t));
    c->mark = calloc(N, 1);
    c->views = calloc((size_t)c->Hkv, sizeof *c->views);
    c->sync = calloc((size_t)c->Hkv, sizeof *c->sync);
    if (!c->hk || !c->hv || !c->qb || !c->states || !c->budgets || !c->sel_idx || !c->sel_n || !c->row_k ||
        !c->row_v || !c->pbuf || !c->gk || !c->gv || !c->fullp || !c->fullo || !c->order || !c->sort_scratch ||
        !c->mark || !c->views || !c->sync)
        return kvs_fail(KVS_ERR_NOMEM, "closed loop: out of memory");
    kvs_status st = kvs_host_check_create(c->N, &c->turn, 1, &c->check);
    if (st != KVS_OK) return st;
    if (c->o->codec) {
        c->reps = calloc((size_t)c->L, sizeof *c->reps);
        c->rep_k = calloc((size_t)c->Hkv, sizeof *c->rep_k);
        c->rep_v = calloc((size_t)c->Hkv, sizeof *c->rep_v);
        if (!c->reps || !c->rep_k || !c->rep_v) return kvs_fail(KVS_ERR_NOMEM, "closed loop: out of memory");
        for (int l = 0; l < c->L; l++)
            if ((st = kvs_host_rep_create(c->o->codec, &c->pm, &c->reps[l])) != KVS_OK) return st;
    }
    for (size_t g = 0; g < G; g++) {
        c->sel_idx[g] = malloc(N * sizeof(int32_t));
        c->pbuf[g] = malloc(N * sizeof(float));
        c->row_k[g] = calloc(N, sizeof **c->row_k);
        c->row_v[g] = calloc(N, sizeof **c->row_v);
        if (!c->sel_idx[g] || !c->pbuf[g] || !c->row_k[g] || !c->row_v[g])
            return kvs_fail(KVS_ERR_NOMEM, "closed loop: out of memory");
    }
    return KVS_OK;
}

/* Copies position `pos`'s key/value of every KV head of layer l from the model's cache rows. */
static void take_kv(cl_ctx *c, int l, int64_t pos, const float *krow, const float *vrow) {
    size_t d = (size_t)c->d;
    for (int h = 0; h < c->Hkv; h++) {
        memcpy(hist(c, c->hk, l, h) + (size_t)pos * d, krow + (size_t)h * d, d * sizeof(float));
        memcpy(hist(c, c->hv, l, h) + (size_t)pos * d, vrow + (size_t)h * d, d * sizeof(float));
    }
}

/* The replay's attention metrics of one query head (kvs_host_metrics): exact attention of q over the policy model's
 * own history 0..p against the output over the selected list (out_err, recall of unmerged entries, top-k overlap). */
static void measure_head(cl_ctx *c, const float *q, const float *hk, const float *hv, const int32_t *list,
                         const float *const *merged, int64_t n, int64_t p, const float *out, const kvs_policy_cost *cost) {
    size_t d = (size_t)c->d, np = (size_t)p + 1;
    kvs_attention(q, hk, hv, d, NULL, np, d, c->pm.scale, c->fullp, c->fullo);
    kvs_argsort_desc(c->fullp, np, c->order, c->sort_scratch);
    for (int64_t r = 0; r < n; r++) c->mark[c->order[r]] = 1; /* the top-|S| of the full attention */
    kvs_host_sums sums = {0};
    for (int64_t j = 0; j < n; j++) {
        double pj = c->fullp[list[j]];
        sums.recall_merged += pj;
        if (!merged || !merged[j]) sums.recall += pj;
        sums.hit += c->mark[list[j]];
    }
    for (int64_t r = 0; r < n; r++) c->mark[c->order[r]] = 0;
    kvs_host_out_sums(c->fullo, out, (int64_t)d, &sums);
    double v[KVS_N_METRICS];
    kvs_host_metrics(&c->pm, p, n, &sums, cost, v);
    c->err_sum += v[KVS_M_OUT_ERR];
    c->recall_sum += v[KVS_M_ATTN_RECALL];
    c->overlap_sum += v[KVS_M_TOPK_OVERLAP];
    c->attended_sum += v[KVS_M_ATTENDED];
    c->n_measured++;
}

/* The policy model's attention (kvs_model_attn_fn) at decode position `pos` of layer `l`. */
static kvs_status policy_attention(void *user, int l, int pos, const float *q, const float *kcache,
                                   const float *vcache, size_t kv_stride, float *o, float *lse) {
    cl_ctx *c = user;
    const struct kvs_policy_ops *ops = c->ops;
    int64_t p = pos;
    size_t d = (size_t)c->d, Gd = (size_t)c->G * d;
    kvs_status st;
    if (p < c->P || p >= c->N) return kvs_fail(KVS_ERR_STATE, "closed loop: position %lld out of order", (long long)p);
    take_kv(c, l, p, kcache + (size_t)p * kv_stride, vcache + (size_t)p * kv_stride);
    kvs_host_rep *rep = c->reps ? c->reps[l] : NULL;
    if (rep) { /* the stage at step p + 1 over the policy model's own history (full precision within the prompt) */
        for (int h = 0; h < c->Hkv; h++) {
            c->rep_k[h] = hist(c, c->hk, l, h);
            c->rep_v[h] = hist(c, c->hv, l, h);
        }
        if ((st = kvs_host_rep_sync(rep, c->rep_k, c->rep_v, p + 1)) != KVS_OK) return st;
    }
    for (int h = 0; h < c->Hkv; h++) {
        /* what the policy model's cache holds: the codec's rows (dequantized) with a codec, else its K/V as computed */
        const float *vk = hist(c, c->hk, l, h), *vv = hist(c, c->hv, l, h);
        if (rep) {
            vk = kvs_host_rep_rows(rep, h, KVS_CODEC_K, vk);
            vv = kvs_host_rep_rows(rep, h, KVS_CODEC_V, vv);
        }
        c->views[h] = (kvs_policy_view){
            .n = p + 1, .group = c->G, .head_dim = c->d, .scale = c->pm.scale,
            .k = vk, .v = vv, .q = q + (size_t)h * Gd, .q_first = p, .n_q = 1,
            .turn_begin = 0, .prompt_end = c->P, .turn = 0, .full_probs = NULL, .block_begin = p, .last_block = 1,
        };
        c->sync[h] = c->states[(size_t)l * (size_t)c->Hkv + (size_t)h];
    }
    /* Oracles are refused before the run (they would need full attention the policy model does not have). */
    kvs_policy_sel sel = {.idx = c->sel_idx, .n = c->sel_n, .cap = c->N, .row_k = c->row_k, .row_v = c->row_v,
                          .n_lists = c->n_lists};
    for (int h = 0; h < c->Hkv; h++) {
        void *state = c->sync[h];
        const kvs_policy_view *view = &c->views[h];
        for (int li = 0; li < sel.n_lists; li++) sel.n[li] = 0;
        if ((st = ops->select(state, view, &sel)) != KVS_OK) return st;
        double kv_slots, dedup;
        if ((st = kvs_host_check_sel(c->check, ops, state, &sel, p, c->budgets[(size_t)l * (size_t)c->Hkv + (size_t)h],
                                     c->has_merged, c->plain, &kv_slots, &dedup)) != KVS_OK)
            return st;
        /* the step's cost as the replay counts it (stored() ∪ S_t, the policy's account()), before the metrics */
        kvs_policy_cost cost;
        if (rep) { /* the codec's bytes of the resident and attended sets (sim/host.h, the representation stage) */
            if ((st = kvs_host_rep_cost(rep, h, ops, state, &c->pm, view, &sel, p, &cost)) != KVS_OK) return st;
        } else {
            kvs_host_cost(ops, state, &c->pm, view, &sel, kv_slots, dedup, &cost);
        }
        c->storage_sum += kvs_host_storage_bytes(&cost);
        c->traffic_sum += kvs_host_traffic_bytes(&cost);
        c->n_costed++;
        for (int g = 0; g < c->G; g++) {
            int li = sel.n_lists == 1 ? 0 : g;
            int merged = c->has_merged[li];
            const float *keys = view->k, *vals = view->v;
            const int32_t *idx = sel.idx[li];
            if (merged) { /* gather trace rows and the policy's merged rows in list order */
                for (int64_t j = 0; j < sel.n[li]; j++) {
                    const float *kr = sel.row_k[li][j] ? sel.row_k[li][j] : view->k + (size_t)sel.idx[li][j] * d;
                    const float *vr = sel.row_v[li][j] ? sel.row_v[li][j] : view->v + (size_t)sel.idx[li][j] * d;
                    memcpy(c->gk + (size_t)j * d, kr, d * sizeof(float));
                    memcpy(c->gv + (size_t)j * d, vr, d * sizeof(float));
                }
                keys = c->gk;
                vals = c->gv;
                idx = NULL;
            }
            float *out = o + ((size_t)h * (size_t)c->G + (size_t)g) * d;
            lse[h * c->G + g] = (float)kvs_attention(view->q + (size_t)g * d, keys, vals, d, idx, (size_t)sel.n[li], d,
                                                     c->pm.scale, c->pbuf[g], out);
            /* against exact attention over the policy model's own history in full precision (with a codec too:
             * the reference is the uncompressed cache, as in the replay) */
            measure_head(c, view->q + (size_t)g * d, hist(c, c->hk, l, h), hist(c, c->hv, l, h), sel.idx[li],
                         merged ? sel.row_k[li] : NULL, sel.n[li], p, out, &cost);
        }
        if (ops->observe && (st = ops->observe(state, view, &sel, (const float *const *)c->pbuf)) != KVS_OK) return st;
        for (int li = 0; li < sel.n_lists; li++) {
            memset((void *)sel.row_k[li], 0, (size_t)sel.n[li] * sizeof *sel.row_k[li]);
            memset((void *)sel.row_v[li], 0, (size_t)sel.n[li] * sizeof *sel.row_v[li]);
        }
    }
    if (ops->layer_sync && (st = ops->layer_sync(c->sync, c->Hkv, KVS_SYNC_DECODE)) != KVS_OK) return st;
    return KVS_OK;
}

/* The first prompt of (layer, KV head) as the allocation pass reads it (kvs_host_prompt_view_fn). */
static kvs_status prompt_view(void *user, int l, int h, kvs_policy_view *view) {
    cl_ctx *c = user;
    *view = (kvs_policy_view){
        .n = c->P, .group = c->G, .head_dim = c->d, .scale = c->pm.scale, .k = hist(c, c->hk, l, h),
        .v = hist(c, c->hv, l, h), .q = prompt_q(c, l, h), .q_first = 0, .n_q = c->P, .turn_begin = 0,
        .prompt_end = c->P, .turn = 0, .full_probs = NULL, .block_begin = 0, .last_block = 1,
    };
    return KVS_OK;
}

/* Allocation pass, instances and prefill over the policy model's prompt (POLICY_SPEC §1.2), through the host. */
static kvs_status start_policy(cl_ctx *c) {
    const struct kvs_policy_ops *ops = c->ops;
    const kvs_policy_config *cfg = &c->o->policy;
    kvs_status st = kvs_host_alloc_pass(cfg, &c->pm, c->o->budget, prompt_view, c, c->budgets, &c->alloc, &c->shared);
    if (st != KVS_OK) return st;
    for (int l = 0; l < c->L; l++) {
        int64_t blk = 0;
        void **states = c->states + (size_t)l * (size_t)c->Hkv;
        if ((st = kvs_host_create_layer(cfg, &c->pm, c->o->budget, c->budgets + (size_t)l * (size_t)c->Hkv,
                                        c->run_seed, l, c->shared, states, &blk)) != KVS_OK)
            return st;
        size_t Gd = (size_t)c->G * (size_t)c->d;
        for (int64_t bb = 0; bb < c->P;) {
            int64_t be = blk > 0 && bb + blk < c->P ? bb + blk : c->P;
            for (int h = 0; h < c->Hkv; h++) {
                kvs_policy_view view = {
                    .n = be, .group = c->G, .head_dim = c->d, .scale = c->pm.scale, .k = hist(c, c->hk, l, h),
                    .v = hist(c, c->hv, l, h), .q = prompt_q(c, l, h) + (size_t)bb * Gd, .q_first = bb, .n_q = be - bb,
                    .turn_begin = 0, .prompt_end = c->P, .turn = 0, .full_probs = NULL, .block_begin = bb,
                    .last_block = be == c->P,
                };
                c->sync[h] = states[h];
                if ((st = ops->prefill(c->sync[h], &view)) != KVS_OK) return st;
            }
            if (ops->layer_sync && (st = ops->layer_sync(c->sync, c->Hkv, KVS_SYNC_PREFILL)) != KVS_OK) return st;
            bb = be;
        }
        /* a codec scoring with the prompt's queries (think) takes the policy model's, all P of them */
        for (int h = 0; c->reps && h < c->Hkv; h++)
            if ((st = kvs_host_rep_prompt_queries(c->reps[l], h, prompt_q(c, l, h), c->P, c->G)) != KVS_OK) return st;
    }
    return KVS_OK;
}

/* The run's identity as far as its policy instances can tell (kvs_host_run_seed's content hash): the model's
 * shape (not its file name: a path is no identity) and the tokens it reads, the mode and the generation length. */
static void run_identity(const kvs_closed_loop_opts *o, const kvs_model_config *mc, char out[65]) {
    kvs_sha256_ctx h;
    char head[512];
    int len = snprintf(head, sizeof head, "closed-loop|%d,%d,%d,%d,%d,%d,%d|%lld|%d|%lld|", mc->n_layers, mc->n_heads, mc->n_kv_heads, mc->head_dim, mc->dim, mc->vocab_size,
                       mc->max_seq_len, (long long)o->prompt_len, o->free_running, (long long)o->max_new);
    kvs_sha256_init(&h);
    kvs_sha256_update(&h, head, (size_t)len);
    for (int64_t i = 0; i < o->n_tokens; i++) {
        uint8_t b[4] = {(uint8_t)o->tokens[i], (uint8_t)(o->tokens[i] >> 8), (uint8_t)(o->tokens[i] >> 16),
                        (uint8_t)(o->tokens[i] >> 24)};
        kvs_sha256_update(&h, b, 4);
    }
    kvs_sha256_final_hex(&h, out);
}

double kvs_closed_loop_kl(const float *a, const float *b, int64_t n) {
    double ma = -INFINITY, mb = -INFINITY, sa = 0, sb = 0;
    for (int64_t i = 0; i < n; i++) {
        if (a[i] > ma) ma = a[i];
        if (b[i] > mb) mb = b[i];
    }
    for (int64_t i = 0; i < n; i++) {
        sa += exp((double)a[i] - ma);
        sb += exp((double)b[i] - mb);
    }
    double la = ma + log(sa), lb = mb + log(sb), kl = 0;
    for (int64_t i = 0; i < n; i++) {
        double lpa = (double)a[i] - la, lpb = (double)b[i] - lb;
        kl += exp(lpa) * (lpa - lpb);
    }
    return kl > 0 ? kl : 0.0; /* rounding can leave -1e-17 for equal distributions up to permutation */
}

double kvs_closed_loop_nll(const float *logits, int64_t n, int32_t token) {
    double m = -INFINITY, s = 0;
    for (int64_t i = 0; i < n; i++)
        if (logits[i] > m) m = logits[i];
    for (int64_t i = 0; i < n; i++) s += exp((double)logits[i] - m);
    return m + log(s) - (double)logits[token];
}

static int32_t argmax(const float *x, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return (int32_t)best;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Aggregates of the steps (p95 by nearest rank, as results/results). */
static kvs_status finish_result(kvs_closed_loop_result *r) {
    int64_t n = r->n_steps;
    if (n == 0) return KVS_OK;
    double *errs = malloc((size_t)n * sizeof *errs);
    if (!errs) return kvs_fail(KVS_ERR_NOMEM, "closed loop: out of memory");
    double agree = 0;
    for (int64_t i = 0; i < n; i++) {
        const kvs_closed_loop_step *s = &r->steps[i];
        r->kl_mean += s->kl / (double)n;
        if (s->kl > r->kl_max) r->kl_max = s->kl;
        agree += s->full_top1 == s->policy_top1;
        r->nll_full_mean += s->nll_full / (double)n;
        r->nll_policy_mean += s->nll_policy / (double)n;
        r->out_err_mean += s->out_err / (double)n;
        r->attn_recall_mean += s->attn_recall / (double)n;
        r->topk_overlap_mean += s->topk_overlap / (double)n;
        r->attended_mean += s->attended / (double)n;
        r->storage_bytes_mean += s->storage_bytes / (double)n;
        r->traffic_bytes_mean += s->traffic_bytes / (double)n;
        errs[i] = s->out_err;
    }
    qsort(errs, (size_t)n, sizeof *errs, cmp_double);
    int64_t k = (int64_t)ceil(0.95 * (double)n) - 1;
    r->out_err_p95 = errs[k < 0 ? 0 : k];
    free(errs);
    r->top1_agree = agree / (double)n;
    r->ppl_full = exp(r->nll_full_mean);
    r->ppl_policy = exp(r->nll_policy_mean);
    return KVS_OK;
}

static kvs_status validate_opts(const kvs_closed_loop_opts *o, const kvs_model_config *mc, int64_t *positions) {
    if (!o->model || !o->policy.ops || !o->tokens)
        return kvs_fail(KVS_ERR_INVALID_ARG, "closed loop: model, policy and tokens are required");
    if (o->policy.ops->is_oracle)
        return kvs_fail(KVS_ERR_INVALID_ARG, "policy %s is an oracle: it needs full attention, which a model decoding "
                        "with a compressed cache does not have", o->policy.ops->name);
    if (o->budget < 1) return kvs_fail(KVS_ERR_INVALID_ARG, "budget %lld must be >= 1", (long long)o->budget);
    if (mc->n_kv_heads < 1 || mc->n_heads / mc->n_kv_heads > KVS_CLOSED_LOOP_MAX_LISTS)
        return kvs_fail(KVS_ERR_INVALID_ARG, "closed loop: at most %d query heads per KV head", KVS_CLOSED_LOOP_MAX_LISTS);
    for (int64_t i = 0; i < o->n_tokens; i++)
        if (o->tokens[i] < 0 || o->tokens[i] >= mc->vocab_size)
            return kvs_fail(KVS_ERR_RANGE, "token %lld (id %d) is outside the vocabulary [0, %d)", (long long)i,
                            o->tokens[i], mc->vocab_size);
    if (o->free_running) {
        if (o->n_tokens < 1 || o->prompt_len < 1 || o->prompt_len > o->n_tokens)
            return kvs_fail(KVS_ERR_INVALID_ARG, "free-running: prompt length %lld must be in [1, %lld] (the tokens "
                            "given)", (long long)o->prompt_len, (long long)o->n_tokens);
        if (o->prompt_len == o->n_tokens && o->max_new < 2)
            return kvs_fail(KVS_ERR_INVALID_ARG, "free-running: --steps %lld must be >= 2 (the first generated token "
                            "comes from the uncompressed prompt)", (long long)o->max_new);
        if (o->max_new < 1)
            return kvs_fail(KVS_ERR_INVALID_ARG, "free-running: %lld tokens to generate, at least 1 needed",
                            (long long)o->max_new);
        *positions = o->n_tokens + o->max_new - 1;
    } else {
        if (o->prompt_len < 1 || o->prompt_len > o->n_tokens - 2)
            return kvs_fail(KVS_ERR_INVALID_ARG, "teacher-forced: prompt length %lld must leave at least 2 tokens of "
                            "the %lld to score (1 <= prompt <= %lld)", (long long)o->prompt_len,
                            (long long)o->n_tokens, (long long)(o->n_tokens - 2));
        *positions = o->n_tokens - 1;
    }
    if (*positions > mc->max_seq_len)
        return kvs_fail(KVS_ERR_INVALID_ARG, "closed loop needs %lld positions, more than the model's context %d",
                        (long long)*positions, mc->max_seq_len);
    return KVS_OK;
}

kvs_status kvs_closed_loop_run(const kvs_closed_loop_opts *o, kvs_closed_loop_result **out) {
    *out = NULL;
    const kvs_model_config *mc = &kvs_model_info_get(o->model)->config;
    int64_t N = 0;
    kvs_status st = validate_opts(o, mc, &N);
    if (st != KVS_OK) return st;
    cl_ctx c = {.o = o, .ops = o->policy.ops, .L = mc->n_layers, .H = mc->n_heads, .Hkv = mc->n_kv_heads,
                .G = mc->n_heads / mc->n_kv_heads, .d = mc->head_dim, .N = N, .P = o->prompt_len};
    c.pm = (kvs_policy_model){
        .n_layers = c.L, .n_heads = c.H, .n_kv_heads = c.Hkv, .group = c.G, .head_dim = c.d, .scale = mc->attn_scale,
        .kv_bytes = 2, .aux_bytes = 4, .n_positions = N, .prompt_len = c.P,
        .max_new_tokens = o->free_running ? o->max_new : o->n_tokens - c.P, .max_seq_len = mc->max_seq_len,
        .rope_theta = mc->rope_theta, .rope_layout = mc->rope_layout,
    };
    snprintf(c.pm.model_name, sizeof c.pm.model_name, "%s", mc->model_name);
    c.n_lists = kvs_policy_layout(&o->policy) == KVS_SEL_PER_QUERY_HEAD ? c.G : 1;
    c.turn = (kvs_turn){.begin = 0, .prompt_end = c.P, .end = N};
    {
        char identity[65];
        run_identity(o, mc, identity);
        c.run_seed = kvs_host_run_seed(&(kvs_host_identity){.content_hash = identity, .policy = &o->policy,
                                                            .budget = o->budget,
                                                            .codec = o->codec ? kvs_codec_spec(o->codec) : NULL},
                                       &c.pm);
    }
    kvs_model_state *full = NULL, *pol = NULL;
    kvs_closed_loop_result *r = calloc(1, sizeof *r);
    const int64_t V = mc->vocab_size;
    float *full_logits = malloc((size_t)V * sizeof(float));
    if (!r || !full_logits) {
        st = kvs_fail(KVS_ERR_NOMEM, "closed loop: out of memory");
        goto cleanup;
    }
    KVS_TRY(st = kvs_policy_validate(&o->policy, &c.pm, o->budget));
    KVS_TRY(st = ctx_alloc(&c));
    int64_t n_steps = N - c.P;
    r->steps = calloc((size_t)n_steps, sizeof *r->steps);
    if (o->free_running) {
        r->full_tokens = malloc((size_t)o->max_new * sizeof(int32_t));
        r->policy_tokens = malloc((size_t)o->max_new * sizeof(int32_t));
    }
    if (!r->steps || (o->free_running && (!r->full_tokens || !r->policy_tokens))) {
        st = kvs_fail(KVS_ERR_NOMEM, "closed loop: out of memory");
        goto cleanup;
    }
    KVS_TRY(st = kvs_model_state_create(o->model, (int)N, o->pool, &full));
    KVS_TRY(st = kvs_model_state_create(o->model, (int)N, o->pool, &pol));
    if (o->full_attn) kvs_model_state_set_attn(full, o->full_attn, o->full_attn_user);

    /* Prompt: full attention in both; the policy model's q/k/v become the policy's prefill. */
    const float *fl = NULL, *pl = NULL;
    size_t Gd = (size_t)c.G * (size_t)c.d;
    /* in blocks (kvs_model_forward_block: the numbers of the position-by-position forward, each weight read once
     * per block); a full-attention override is called position by position */
    for (int64_t p0 = 0; p0 < c.P; p0 += KVS_MODEL_BLOCK) {
        int nb = c.P - p0 < KVS_MODEL_BLOCK ? (int)(c.P - p0) : KVS_MODEL_BLOCK;
        if (o->full_attn)
            for (int64_t p = p0; p < p0 + nb; p++) KVS_TRY(st = kvs_model_forward(full, o->tokens[p], (int)p, &fl));
        else
            KVS_TRY(st = kvs_model_forward_block(full, o->tokens + p0, nb, (int)p0, &fl));
        KVS_TRY(st = kvs_model_forward_block(pol, o->tokens + p0, nb, (int)p0, &pl));
        for (int64_t p = p0; p < p0 + nb; p++)
            for (int l = 0; l < c.L; l++) {
                kvs_layer_record rec;
                KVS_TRY(st = kvs_model_state_layer_at(pol, l, (int)p, &rec));
                take_kv(&c, l, p, rec.k, rec.v);
                for (int h = 0; h < c.Hkv; h++)
                    memcpy(prompt_q(&c, l, h) + (size_t)p * Gd, rec.q + (size_t)h * Gd, Gd * sizeof(float));
            }
    }
    KVS_TRY(st = start_policy(&c));
    for (size_t i = 0; i < (size_t)c.L * (size_t)c.Hkv; i++)
        if (c.budgets[i] > r->budget_max) r->budget_max = c.budgets[i];
    kvs_model_state_set_attn(pol, policy_attention, &c);

    int32_t tok_full = 0, tok_pol = 0;
    int full_done = 0, pol_done = 0;
    /* the tokens given are read by both models (teacher-forced: all of them; free-running: those past the prompt are
     * read through the policy before the first generated token) */
    const int64_t n_given = o->n_tokens;
    if (o->free_running && c.P == o->n_tokens) {
        tok_full = argmax(fl, V);
        tok_pol = argmax(pl, V);
        r->full_tokens[0] = tok_full;
        r->policy_tokens[0] = tok_pol;
        r->n_generated = 1;
        full_done = o->stop_at_eos && kvs_model_is_eos(o->model, tok_full);
        pol_done = o->stop_at_eos && kvs_model_is_eos(o->model, tok_pol);
    }
    for (int64_t p = c.P; p < N && !(full_done && pol_done); p++) {
        int given = p < n_given;
        int32_t in_full = given ? o->tokens[p] : tok_full;
        int32_t in_pol = given ? o->tokens[p] : tok_pol;
        KVS_TRY(st = kvs_model_forward(full, in_full, (int)p, &fl));
        memcpy(full_logits, fl, (size_t)V * sizeof(float));
        c.err_sum = c.recall_sum = c.overlap_sum = c.attended_sum = c.storage_sum = c.traffic_sum = 0;
        c.n_measured = c.n_costed = 0;
        KVS_TRY(st = kvs_model_forward(pol, in_pol, (int)p, &pl));
        kvs_closed_loop_step *s = &r->steps[r->n_steps];
        s->position = p;
        s->full_top1 = argmax(full_logits, V);
        s->policy_top1 = argmax(pl, V);
        s->ref_token = p + 1 < n_given ? o->tokens[p + 1] : s->full_top1;
        s->kl = kvs_closed_loop_kl(full_logits, pl, V);
        s->nll_full = kvs_closed_loop_nll(full_logits, V, s->ref_token);
        s->nll_policy = kvs_closed_loop_nll(pl, V, s->ref_token);
        double nm = c.n_measured > 0 ? (double)c.n_measured : 1.0;
        s->out_err = c.err_sum / nm;
        s->attn_recall = c.recall_sum / nm;
        s->topk_overlap = c.overlap_sum / nm;
        s->attended = c.attended_sum / nm;
        double nc = c.n_costed > 0 ? (double)c.n_costed : 1.0;
        s->storage_bytes = c.storage_sum / nc;
        s->traffic_bytes = c.traffic_sum / nc;
        if (o->on_step) o->on_step(o->on_step_user, r->n_steps, full_logits, pl);
        r->n_steps++;
        if (o->free_running && p + 1 >= n_given) { /* a generated token: the prediction after the last given one on */
            tok_full = s->full_top1;
            tok_pol = s->policy_top1;
            r->full_tokens[r->n_generated] = tok_full;
            r->policy_tokens[r->n_generated] = tok_pol;
            r->n_generated++;
            full_done |= o->stop_at_eos && kvs_model_is_eos(o->model, tok_full);
            pol_done |= o->stop_at_eos && kvs_model_is_eos(o->model, tok_pol);
        }
    }
    if (o->free_running) {
        int64_t same = 0;
        r->first_divergence = -1;
        for (int64_t i = 0; i < r->n_generated; i++) {
            if (r->full_tokens[i] == r->policy_tokens[i]) same++;
            else if (r->first_divergence < 0) r->first_divergence = i;
        }
        r->token_agreement = (double)same / (double)r->n_generated;
    }
    KVS_TRY(st = finish_result(r));
    *out = r;
    r = NULL;
cleanup:
    kvs_model_state_free(full);
    kvs_model_state_free(pol);
    ctx_free(&c);
    free(full_logits);
    kvs_closed_loop_result_free(r);
    return st;
}

void kvs_closed_loop_result_free(kvs_closed_loop_result *r) {
    if (!r) return;
    free(r->steps);
    free(r->full_tokens);
    free(r->policy_tokens);
    free(r);
}

/* ---- tasks (closed_loop.h "Tasks") ---- */

#define TASK_MAGIC "# kvsim task v"
#define TASK_VERSION 1

void kvs_closed_loop_task_free(kvs_closed_loop_task *t) {
    if (!t) return;
    for (int64_t i = 0; i < t->n_items; i++) {
        free(t->items[i].context);
        free(t->items[i].answer);
    }
    free(t->items);
    free(t);
}

static int is_space(char ch) {
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f' || ch == '\v';
}

static char *dup_span(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

/* One item line (without its end of line) into *it; the detail names the file and line. */
static kvs_status task_item(const char *name, int64_t line, const char *s, size_t n, kvs_closed_loop_task_item *it) {
    const char *tab = memchr(s, '\t', n);
    if (!tab)
        return kvs_fail(KVS_ERR_FORMAT, "%s:%lld: an item is CONTEXT<TAB>ANSWER: no TAB on this line", name,
                        (long long)line);
    size_t nc = (size_t)(tab - s), na = n - nc - 1;
    const char *a = tab + 1;
    if (memchr(a, '\t', na))
        return kvs_fail(KVS_ERR_FORMAT, "%s:%lld: more than one TAB (an item is CONTEXT<TAB>ANSWER)", name,
                        (long long)line);
    if (nc == 0 || na == 0)
        return kvs_fail(KVS_ERR_FORMAT, "%s:%lld: empty %s", name, (long long)line, nc == 0 ? "context" : "answer");
    /* the one space between context and answer is the format's: white space at an end would double or hide it */
    if (is_space(s[0]) || is_space(s[nc - 1]) || is_space(a[0]) || is_space(a[na - 1]))
        return kvs_fail(KVS_ERR_FORMAT, "%s:%lld: white space at an end of the %s (the context and answer are joined "
                        "by one space)", name, (long long)line,
                        is_space(s[0]) || is_space(s[nc - 1]) ? "context" : "answer");
    it->context = dup_span(s, nc);
    it->answer = dup_span(a, na);
    it->line = line;
    if (!it->context || !it->answer) return kvs_fail(KVS_ERR_NOMEM, "out of memory");
    return KVS_OK;
}

kvs_status kvs_closed_loop_task_parse(const char *text, size_t len, const char *name, kvs_closed_loop_task **out) {
    *out = NULL;
    if (!text || !name) return kvs_fail(KVS_ERR_INVALID_ARG, "task: text and name are required");
    if (memchr(text, '\0', len)) return kvs_fail(KVS_ERR_FORMAT, "%s: a NUL byte: not a text file", name);
    kvs_closed_loop_task *t = calloc(1, sizeof *t);
    if (!t) return kvs_fail(KVS_ERR_NOMEM, "out of memory");
    kvs_sha256_hex(text, len, t->sha256);
    kvs_status st = KVS_OK;
    int64_t cap = 0, line = 0;
    for (size_t pos = 0; pos < len;) {
        const char *s = text + pos, *nl = memchr(s, '\n', len - pos);
        size_t n = nl ? (size_t)(nl - s) : len - pos;
        pos += n + (nl != NULL);
        line++;
        if (n > 0 && s[n - 1] == '\r') n--;
        if (line == 1) {
            size_t m = strlen(TASK_MAGIC);
            if (n < m || memcmp(s, TASK_MAGIC, m) != 0) {
                st = kvs_fail(KVS_ERR_FORMAT, "%s:1: not a task file: the first line must be '%s%d'", name,
                              TASK_MAGIC, TASK_VERSION);
                goto cleanup;
            }
            if (n != m + 1 || s[m] != '0' + TASK_VERSION) {
                st = kvs_fail(KVS_ERR_VERSION, "%s:1: task format '%.*s' is not supported (this kvsim reads '%s%d')",
                              name, (int)(n < 64 ? n : 64), s, TASK_MAGIC, TASK_VERSION);
                goto cleanup;
            }
            continue;
        }
        size_t k = 0;
        while (k < n && is_space(s[k])) k++;
        if (k == n || s[0] == '#') continue;
        if (t->n_items == cap) {
            cap = cap ? 2 * cap : 32;
            kvs_closed_loop_task_item *g = realloc(t->items, (size_t)cap * sizeof *g);
            if (!g) {
                st = kvs_fail(KVS_ERR_NOMEM, "out of memory");
                goto cleanup;
            }
            t->items = g;
        }
        kvs_closed_loop_task_item *it = &t->items[t->n_items];
        memset(it, 0, sizeof *it);
        t->n_items++; /* counted before filling: a half-filled item is freed with the task */
        if ((st = task_item(name, line, s, n, it)) != KVS_OK) goto cleanup;
    }
    if (line == 0) {
        st = kvs_fail(KVS_ERR_FORMAT, "%s: empty file: the first line must be '%s%d'", name, TASK_MAGIC, TASK_VERSION);
        goto cleanup;
    }
    if (t->n_items == 0) {
        st = kvs_fail(KVS_ERR_FORMAT, "%s: no item (an item is a line CONTEXT<TAB>ANSWER)", name);
        goto cleanup;
    }
    *out = t;
    return KVS_OK;
cleanup:
    kvs_closed_loop_task_free(t);
    return st;
}

kvs_status kvs_closed_loop_task_load(const char *path, kvs_closed_loop_task **out) {
    char *text = NULL;
    size_t len = 0;
    *out = NULL;
    kvs_status st = kvs_read_file(path, &text, &len);
    if (st != KVS_OK) return st;
    st = kvs_closed_loop_task_parse(text, len, path, out);
    free(text);
    return st;
}

void kvs_closed_loop_task_input_clear(kvs_closed_loop_task_input *in) {
    free(in->tokens);
    free(in->expected);
    memset(in, 0, sizeof *in);
}

/* The decoding of ids[0..n) into *text (kvs_tokenizer_decode; n = 0 gives ""). */
static kvs_status decode_ids(const kvs_tokenizer *tok, const int32_t *ids, int64_t n, char **text) {
    if (n == 0) {
        *text = calloc(1, 1);
        return *text ? KVS_OK : kvs_fail(KVS_ERR_NOMEM, "out of memory");
    }
    return kvs_tokenizer_decode(tok, ids, (size_t)n, text);
}

kvs_status kvs_closed_loop_task_tokenize(const kvs_tokenizer *tok, const kvs_closed_loop_task_item *it,
                                         kvs_closed_loop_task_input *out) {
    memset(out, 0, sizeof *out);
    size_t nc = strlen(it->context), na = strlen(it->answer), nt = nc + 1 + na;
    char *whole = malloc(nt + 1), *dec = NULL;
    size_t cap = nt + 8, got = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    kvs_status st = KVS_OK;
    if (!whole || !ids) {
        st = kvs_fail(KVS_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    snprintf(whole, nt + 1, "%s %s", it->context, it->answer);
    st = kvs_tokenizer_encode(tok, whole, 1, ids, cap, &got);
    if (st == KVS_ERR_RANGE && got > cap) { /* more ids than bytes: byte fallback and BOS can do that */
        int32_t *g = realloc(ids, got * sizeof *g);
        if (!g) {
            st = kvs_fail(KVS_ERR_NOMEM, "out of memory");
            goto cleanup;
        }
        ids = g;
        cap = got;
        st = kvs_tokenizer_encode(tok, whole, 1, ids, cap, &got);
    }
    if (st != KVS_OK) goto cleanup;
    KVS_TRY(st = decode_ids(tok, ids, (int64_t)got, &dec));
    if (strcmp(dec, whole) != 0) {
        st = kvs_fail(KVS_ERR_FORMAT, "task item at line %lld: the tokenizer does not give its text back (it "
                      "decodes to '%.80s'): the answer's place in the text is unknown", (long long)it->line, dec);
        goto cleanup;
    }
    /* the longest run of whole tokens inside CONTEXT + " ": each decoded prefix is a prefix of the text, so the
     * first prefix that reaches past it ends the run */
    int64_t k = 0;
    size_t klen = 0;
    for (int64_t j = 1; j < (int64_t)got; j++) {
        free(dec);
        dec = NULL;
        KVS_TRY(st = decode_ids(tok, ids, j, &dec));
        size_t dl = strlen(dec);
        if (dl > nc + 1 || strncmp(dec, whole, dl) != 0) break;
        k = j;
        klen = dl;
    }
    /* BOS alone (or nothing) read: no context to ask about */
    if (k < 2 || klen == 0) {
        st = kvs_fail(KVS_ERR_FORMAT, "task item at line %lld: the tokenizer joins the whole context to the "
                      "answer: nothing to read before it", (long long)it->line);
        goto cleanup;
    }
    out->expected = dup_span(whole + klen, nt - klen);
    if (!out->expected) {
        st = kvs_fail(KVS_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    out->tokens = ids;
    out->n_tokens = (int64_t)got;
    out->n_context = k;
    ids = NULL;
cleanup:
    free(whole);
    free(dec);
    free(ids);
    return st;
}

kvs_status kvs_closed_loop_task_continuation(const kvs_tokenizer *tok, const kvs_closed_loop_task_input *in,
                                             const int32_t *gen, int64_t n_gen, char **text) {
    *text = NULL;
    int64_t n = in->n_context + n_gen;
    int32_t *ids = malloc((size_t)(n > 0 ? n : 1) * sizeof *ids);
    char *ctx = NULL, *all = NULL;
    kvs_status st = KVS_OK;
    if (!ids) return kvs_fail(KVS_ERR_NOMEM, "out of memory");
    memcpy(ids, in->tokens, (size_t)in->n_context * sizeof *ids);
    if (n_gen > 0) memcpy(ids + in->n_context, gen, (size_t)n_gen * sizeof *ids);
    KVS_TRY(st = decode_ids(tok, ids, in->n_context, &ctx));
    KVS_TRY(st = decode_ids(tok, ids, n, &all));
    size_t cl = strlen(ctx);
    if (strncmp(all, ctx, cl) == 0) {
        *text = dup_span(all + cl, strlen(all + cl));
    } else { /* a piece that joins the context's last bytes (byte fallback): the generated tokens on their own */
        free(all);
        all = NULL;
        KVS_TRY(st = decode_ids(tok, gen, n_gen, &all));
        *text = dup_span(all, strlen(all));
    }
    if (!*text) st = kvs_fail(KVS_ERR_NOMEM, "out of memory");
cleanup:
    free(ids);
    free(ctx);
    free(all);
    return st;
}

static int word_byte(unsigned char ch) {
    return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch >= 0x80;
}

int kvs_closed_loop_task_match(const char *generated, const char *expected) {
    while (*generated && is_space(*generated)) generated++;
    while (*expected && is_space(*expected)) expected++;
    size_t n = strlen(expected);
    if (n == 0 || strncmp(generated, expected, n) != 0) return 0;
    return !(word_byte((unsigned char)expected[n - 1]) && word_byte((unsigned char)generated[n]));
}
