/* adakv.c — Ada-KV (Feng et al., 2024, "Optimizing KV Cache Eviction by Adaptive Budget Allocation"): SnapKV
 * selection with the budget of a layer distributed across its KV heads from the observation-window scores.
 * Follows the POLICY_SPEC appendix row "Ada-KV" (per-head floor α = 0.2, the rest allocated by a global top-k
 * across the layer's heads; §2.6 B13 names it only) and the reference FFY0/AdaKV
 * adaptive_snapkv/monkeypatch/snapkv_utils.py (AdaptiveSnapKVCluster.update_kv_gqa, calcul_attn_sore).
 *
 * Allocation pass (sim/policy.h alloc_*), per layer, on the first turn's prompt (P positions), budget B:
 *  1. per KV head h: the SnapKV window score of the prefix (positions [0, P−W), W = min(window, P)): window
 *     queries' causal softmax summed over the window, reduced over the G query heads of the group (mean by
 *     default), pooled (max, kernel 7) — exactly what the instance (snapkv.c) computes in prefill;
 *  2. base = B − W; the top Hkv·base scores of ALL the layer's heads together decide c_h, how many each head
 *     would keep (Σ c_h = Hkv·base);
 *  3. safeguard: ideal_h = (1 − α)·c_h + α·base (the paper's B_i = (1−α)·B_i* + α·B/h);
 *  4. budget_h = round(ideal_h) + W with the total kept exact (below).
 * The instance of (layer, head h) is SnapKV with one set per KV head, the group reduced by this file's `gqa`
 * (snapkv.c's instance, kvs_snapkv_create, no prompt blocks): it keeps the top budget_h − W of its pooled scores
 * plus the window — the same set as the reference's "sorted indices[:head_capacity]" of each head.
 *
 * Ambiguities resolved (paper / reference / choice):
 *  - Layout: one set per KV head (the GQA-support version, gqa_support=True, that DESIGN.md lists among the
 *    per-KV-head policies), the group's scores reduced by mean (reference gqa_func 'mean'; 'max' optional).
 *    The reference's window MEAN and our window SUM rank identically, across heads too (same W for all).
 *  - Rounding: the reference computes round(c_h·(1−α) + int(α·base)) per head, whose total can differ from
 *    Hkv·base by a few positions. We keep the layer total exact: floor(ideal_h), then one more position to
 *    the largest fractional parts (ties: lower head). Every head keeps >= floor(α·base) + W (the floor), and
 *    <= P (c_h <= P − W and base <= P − W).
 *  - Ties in the global top-k (torch.topk: unspecified): higher score first, then lower head, then older
 *    position (§1.4).
 *  - P <= B (the reference returns uncompressed when base > prefix length) or B <= W: every head gets B.
 *  - Defaults: window 32, kernel 7, max pooling, α = 0.2 (AdaptiveSnapKVCluster defaults and the paper's
 *    experiments). The reference's optional "skip" layers and score "normalize" are not modelled.
 *  - Later turns reuse the first turn's per-head budgets (the allocation pass sees only the first prompt).
 * Budget convention: per (layer, KV head) budget bounds the retained prompt positions, window included;
 * generated tokens are all kept (prompt-only scope, as SnapKV).
 * Sliding-window layers (sim/replay.h): the instance is SnapKV's, so its window_evict (snapkv.c) applies: the
 * positions before the window's first leave the list at once and a prefill takes no candidate before it. The
 * allocation keeps its rule, over the whole first prompt (the pass sees the prompt as the model's full layers do,
 * and the layer total Hkv·B is what the paper shares out): a head of a windowed layer whose budget_h covers what the
 * window leaves holds all of it and the rest of its share stays unused (it is not handed to the other heads, which
 * all see the same window), so the layer never holds more than Hkv·B.
 */
#include <stdlib.h>

#include "../common/kvs_math.h"
#include "registry.h"
#include "snapkv_internal.h"

enum { ADA_MEAN = 0, ADA_MAX = 1 };
enum { ADA_POOL_MAX = 0, ADA_POOL_AVG = 1 };

static const kvs_policy_param adakv_params[] = {
    {.key = "window", .type = KVS_PARAM_INT, .def = 32, .lo = 1, .hi = 1 << 20,
     .help = "observation window W (queries scoring the prefix; the W positions are always kept)"},
    {.key = "kernel", .type = KVS_PARAM_INT, .def = 7, .lo = 1, .hi = 4095, .help = "pooling kernel (odd)"},
    {.key = "pool", .type = KVS_PARAM_ENUM, .def = ADA_POOL_MAX, .choices = "max|avg",
     .help = "pooling of the window scores"},
    {.key = "gqa", .type = KVS_PARAM_ENUM, .def = ADA_MEAN, .choices = "mean|max",
     .help = "reduction of the group's query-head scores (one set per KV head)"},
    {.key = "alpha", .type = KVS_PARAM_DOUBLE, .def = 0.2, .lo = 0.0, .hi = 1.0,
     .help = "safeguard: fraction of each head's average budget it keeps whatever the scores (1 = uniform)"},
};

typedef struct {
    int L, Hkv, G, d, window, kernel, pool, gqa;
    double alpha;
    float scale;
    int64_t budget, P, len; /* len = P − W scored positions per head */
    float *pooled;          /* [L][Hkv][len] pooled window scores, filled by alloc_prefill */
    char *seen;             /* [L][Hkv] */
    void *work;             /* scratch: kvs_attn_colsum_scratch_bytes(P) */
} ada_alloc;

static kvs_status ada_alloc_begin(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget,
                                  void **alloc) {
    ada_alloc *a = calloc(1, sizeof *a);
    if (!a) return kvs_fail(KVS_ERR_NOMEM, "adakv: out of memory");
    a->L = m->n_layers;
    a->Hkv = m->n_kv_heads;
    a->G = m->group;
    a->d = m->head_dim;
    a->scale = m->scale;
    a->window = (int)kvs_policy_param_get(cfg, "window");
    a->kernel = (int)kvs_policy_param_get(cfg, "kernel");
    a->pool = (int)kvs_policy_param_get(cfg, "pool");
    a->gqa = (int)kvs_policy_param_get(cfg, "gqa");
    a->alpha = kvs_policy_param_get(cfg, "alpha");
    a->budget = budget;
    a->P = -1; /* unknown until the first alloc_prefill */
    *alloc = a;
    return KVS_OK;
}

/* Pooled window score of the prefix of one (layer, KV head), into out[0..len): the same kvs_snapkv_scores
 * call as snapkv.c's prefill on a first-turn prompt (candidates = positions 0..P-1), the group reduced. */
static void ada_score(ada_alloc *a, const kvs_policy_view *v, float *out) {
    kvs_attn_src src = {.q = v->q, .q_first = v->q_first, .n_q = v->n_q, .group = a->G, .d = a->d,
                        .scale = a->scale, .keys = v->k, .idx = NULL, .n_cand = a->P};
    kvs_snapkv_opts so = {.window = a->P - a->len, .kernel = a->kernel,
                          .pool = a->pool == ADA_POOL_MAX ? KVS_POOL_MAX : KVS_POOL_AVG, .head_first = 0,
                          .n_heads = a->G, .reduce = a->gqa == ADA_MEAN ? KVS_GQA_MEAN : KVS_GQA_MAX};
    int64_t m = kvs_snapkv_scores(&src, &so, out, a->work);
    KVS_ASSERT(m == a->len);
}

static kvs_status ada_alloc_prefill(void *alloc, int layer, int kv_head, const kvs_policy_view *prefill) {
    ada_alloc *a = alloc;
    if (layer < 0 || layer >= a->L || kv_head < 0 || kv_head >= a->Hkv)
        return kvs_fail(KVS_ERR_RANGE, "adakv: allocation pass got (layer %d, kv head %d) of (%d, %d)", layer, kv_head,
                        a->L, a->Hkv);
    if (a->P < 0) {
        a->P = prefill->n;
        int64_t W = a->window < a->P ? a->window : a->P;
        a->len = a->P - W;
        if (a->P <= a->budget || a->budget <= W) return KVS_OK; /* uniform: no scores needed */
        size_t cells = (size_t)a->L * (size_t)a->Hkv;
        a->pooled = malloc(cells * (size_t)a->len * sizeof(float));
        a->seen = calloc(cells, 1);
        a->work = malloc(kvs_attn_colsum_scratch_bytes(a->P));
        if (!a->pooled || !a->seen || !a->work) return kvs_fail(KVS_ERR_NOMEM, "adakv: out of memory");
    } else if (prefill->n != a->P) {
        return kvs_fail(KVS_ERR_STATE, "adakv: allocation pass prompt length %lld after %lld", (long long)prefill->n,
                        (long long)a->P);
    }
    if (!a->pooled) return KVS_OK;
    size_t cell = (size_t)layer * (size_t)a->Hkv + (size_t)kv_head;
    ada_score(a, prefill, a->pooled + cell * (size_t)a->len);
    a->seen[cell] = 1;
    return KVS_OK;
}

static kvs_status ada_alloc_end(void *alloc, int64_t *budgets) {
    ada_alloc *a = alloc;
    size_t cells = (size_t)a->L * (size_t)a->Hkv;
    int64_t W = a->P < 0 ? 0 : (a->window < a->P ? a->window : a->P);
    for (size_t i = 0; i < cells; i++) budgets[i] = a->budget;
    if (!a->pooled) return KVS_OK; /* no prompt, P <= B or B <= W: uniform */
    int64_t base = a->budget - W, H = a->Hkv, len = a->len, K = H * base;
    int32_t *top = malloc((size_t)K * sizeof *top);
    int64_t *cnt = malloc((size_t)H * sizeof *cnt), *keep = malloc((size_t)H * sizeof *keep);
    double *ideal = malloc((size_t)H * sizeof *ideal);
    kvs_status st = KVS_OK;
    if (!top || !cnt || !keep || !ideal) {
        st = kvs_fail(KVS_ERR_NOMEM, "adakv: out of memory");
        goto cleanup;
    }
    for (int l = 0; l < a->L; l++) {
        for (int64_t h = 0; h < H; h++)
            if (!a->seen[(size_t)l * (size_t)H + (size_t)h]) {
                st = kvs_fail(KVS_ERR_STATE, "adakv: allocation pass skipped (layer %d, kv head %lld)", l, (long long)h);
                goto cleanup;
            }
        /* The layer's heads are contiguous: index h·len + j, so kvs_topk's lower-index tie rule is "lower
         * head, then older position". */
        kvs_topk(a->pooled + (size_t)l * (size_t)H * (size_t)len, (size_t)(H * len), (size_t)K, top);
        for (int64_t h = 0; h < H; h++) cnt[h] = 0;
        for (int64_t i = 0; i < K; i++) cnt[top[i] / len]++;
        int64_t total = 0;
        for (int64_t h = 0; h < H; h++) {
            ideal[h] = (1.0 - a->alpha) * (double)cnt[h] + a->alpha * (double)base;
            keep[h] = (int64_t)(ideal[h] + 1e-9); /* floor, robust to (1-a)c + a*base rounding */
            if (keep[h] > len) keep[h] = len; /* rounding guard: ideal <= len mathematically */
            total += keep[h];
        }
        for (int64_t left = K - total; left > 0; left--) {
            int64_t best = -1;
            double best_frac = -1;
            for (int64_t h = 0; h < H; h++) {
                double frac = ideal[h] - (double)keep[h];
                if (keep[h] < len && frac > best_frac) {
                    best = h;
                    best_frac = frac;
                }
            }
            KVS_ASSERT(best >= 0);
            keep[best]++;
            ideal[best] = (double)keep[best]; /* one extra position per head at most */
        }
        for (int64_t h = 0; h < H; h++) budgets[(size_t)l * (size_t)H + (size_t)h] = keep[h] + W;
    }
cleanup:
    free(top);
    free(cnt);
    free(keep);
    free(ideal);
    return st;
}

static void ada_alloc_free(void *alloc) {
    ada_alloc *a = alloc;
    if (!a) return;
    free(a->pooled);
    free(a->seen);
    free(a->work);
    free(a);
}

/* Within a head Ada-KV is SnapKV with one set per KV head: snapkv.c's instance with this table's group reduction
 * and no prompt blocks; validate() and notes() are SnapKV's checks of the window and kernel the tables share. */
static kvs_status ada_validate(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget) {
    return kvs_policy_snapkv.validate(cfg, m, budget);
}
static int ada_notes(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget, char *buf, size_t cap) {
    return kvs_policy_snapkv.notes(cfg, m, budget, buf, cap);
}
static kvs_status ada_create(const kvs_policy_init *init, void **state) {
    int gqa = (int)kvs_policy_param_get(init->cfg, "gqa") == ADA_MEAN ? KVS_SNAPKV_MEAN : KVS_SNAPKV_MAX;
    return kvs_snapkv_create(init, gqa, 0, state);
}
static void ada_free(void *state) { kvs_policy_snapkv.free(state); }
static kvs_status ada_prefill(void *state, const kvs_policy_view *view) { return kvs_policy_snapkv.prefill(state, view); }
static kvs_status ada_select(void *state, const kvs_policy_view *view, kvs_policy_sel *sel) {
    return kvs_policy_snapkv.select(state, view, sel);
}
static int64_t ada_stored(void *state, int g, int32_t *out) { return kvs_policy_snapkv.stored(state, g, out); }
static kvs_status ada_window_evict(void *state, int64_t first) { return kvs_policy_snapkv.window_evict(state, first); }

const struct kvs_policy_ops kvs_policy_adakv = {
    .version = KVS_POLICY_INTERFACE_VERSION,
    .name = "adakv",
    .summary = "Ada-KV: SnapKV selection, a layer's budget split across KV heads by window scores (floor alpha)",
    .is_oracle = 0,
    .granularity = KVS_SEL_PER_KV_HEAD,
    .budget_scope = KVS_BUDGET_PROMPT,
    .params = adakv_params,
    .n_params = (int)(sizeof adakv_params / sizeof adakv_params[0]),
    .validate = ada_validate,
    .notes = ada_notes,
    .create = ada_create,
    .free = ada_free,
    .prefill = ada_prefill,
    .select = ada_select,
    .stored = ada_stored,
    .scores = kvs_snapkv_retention,
    .alloc_begin = ada_alloc_begin,
    .alloc_prefill = ada_alloc_prefill,
    .alloc_end = ada_alloc_end,
    .alloc_free = ada_alloc_free,
    .window_evict = ada_window_evict,
};
