/* tova.c — TOVA, Token Omission Via Attention (Oren et al. 2024), as specified in POLICY_SPEC §2.6 B8 and
 * the appendix (kvpress TOVAPress).
 *
 * Budget B, attend-then-evict: S_t = the cache (B-1 entries) + the new token; after attention, if |S_t| = B,
 * evict the entry with the lowest attention of the CURRENT query, averaged over heads. No accumulated
 * state: each step's decision uses only that step's attention (computed by the engine over S_t).
 *  - mode=layer (default; TOVA's layer-wise variant, kvpress "averaged across heads"): the average is over
 *    every query head of the layer and the same position is evicted from every KV head, so all KV heads of a
 *    layer hold identical sets (decided in layer_sync).
 *  - mode=group (KeyDiff App. F.2): average over the GQA group; each KV head decides alone.
 * Prefill (one shot): keep TOPK(B-1) of the last prompt query's averaged attention over the candidates (the
 * cache kept from earlier turns + the turn's prompt positions, attended causally = all of them).
 * Block mode (block=M > 0, KeyDiff §2.4 Eq. 6 and App. F.2 with M = 128; POLICY_SPEC B8 "the bottom row of each
 * block"): the prompt arrives through the engine's chunked prefill (prefill_block); after each block the cache
 * kept so far plus the block are scored by the block's last query and cut to B-1 the same way (layer mode:
 * averaged over the layer in layer_sync after every block), a hard cap through the whole prompt.
 * Ambiguities resolved: the current token is not protected (original TOVA); protect_current=true keeps it
 * (kvpress pads it with the max score). Ties: the lowest average is evicted, the NEWER position among equals
 * (§1.4: the older token wins); prefill TOPK ties go to the older position. No auxiliary storage; traffic =
 * the attended K/V.
 */
#include <stdlib.h>
#include <string.h>

#include "../common/kvs_math.h"
#include "../sim/policy_memo.h"
#include "registry.h"

enum { TOVA_LAYER = 0, TOVA_GROUP = 1 };

static const kvs_policy_param tova_params[] = {
    {.key = "mode", .type = KVS_PARAM_ENUM, .def = TOVA_LAYER, .choices = "layer|group",
     .help = "average the current query's attention over the layer's heads (one set per layer) or the GQA group"},
    {.key = "protect_current", .type = KVS_PARAM_BOOL, .def = 0, .lo = 0, .hi = 1,
     .help = "never evict the current token (kvpress); original TOVA does not protect it"},
    {.key = "block", .type = KVS_PARAM_INT, .def = 0, .lo = 0, .hi = 1 << 20,
     .help = "M > 0: prompt processed in blocks of M, cut to B-1 after each (KeyDiff: 128); 0: at once"},
};

static const kvs_policy_preset tova_presets[] = {
    {.name = "keydiff", .params = "mode=group,block=128",
     .help = "KeyDiff App. F.2: attention averaged over the GQA group, block-wise prompt processing (block 128); "
             "budgets 2K-8K per KV head"},
};

typedef struct {
    int64_t budget, block;
    int mode, protect, group, d;
    float scale;
    int32_t *pos;     /* [budget] ascending cache positions (+ current token during a step) */
    int64_t cnt;
    double *score;    /* [cap] this step's group-mean attention, aligned with pos (prefill: with cand) */
    /* prefill candidates */
    int32_t *cand;
    int64_t n_cand, cap;
    float *tmp;
    void *work;       /* [kvs_attn_colsum_scratch_bytes(cap)] prefill scratch */
} tova_state;

static void tova_free(void *state) {
    tova_state *s = state;
    if (!s) return;
    free(s->pos);
    free(s->score);
    free(s->cand);
    free(s->tmp);
    free(s->work);
    free(s);
}

static kvs_status tova_create(const kvs_policy_init *init, void **state) {
    tova_state *s = calloc(1, sizeof *s);
    if (!s) return kvs_fail(KVS_ERR_NOMEM, "tova: out of memory");
    s->budget = init->budget;
    s->mode = (int)kvs_policy_param_get(init->cfg, "mode");
    s->protect = kvs_policy_param_get(init->cfg, "protect_current") != 0;
    s->block = (int64_t)kvs_policy_param_get(init->cfg, "block");
    s->group = init->model->group;
    s->d = init->model->head_dim;
    s->scale = init->model->scale;
    s->pos = malloc((size_t)s->budget * sizeof(int32_t));
    s->score = malloc((size_t)s->budget * sizeof(double));
    s->cap = s->budget;
    if (!s->pos || !s->score) {
        tova_free(s);
        return kvs_fail(KVS_ERR_NOMEM, "tova: out of memory");
    }
    *state = s;
    return KVS_OK;
}

/* Keeps the B-1 best candidates (given their averaged scores) in position order. */
static kvs_status keep_top(tova_state *s, const double *score) {
    int64_t keep = s->budget - 1;
    if (s->n_cand <= keep) {
        memcpy(s->pos, s->cand, (size_t)s->n_cand * sizeof(int32_t));
        s->cnt = s->n_cand;
        return KVS_OK;
    }
    /* Selection by repeated scan keeps the tie rule explicit: best score, then older position; the last
     * prompt position is forced in when protected. */
    char *mark = calloc((size_t)s->n_cand, 1);
    if (!mark) return kvs_fail(KVS_ERR_NOMEM, "tova: out of memory");
    int64_t taken = 0;
    if (s->protect && keep > 0) {
        mark[s->n_cand - 1] = 1;
        taken = 1;
    }
    float *x = s->tmp;
    for (int64_t j = 0; j < s->n_cand; j++) x[j] = mark[j] ? -1.0f : (float)score[j];
    int32_t *top = malloc((size_t)(keep > 0 ? keep : 1) * sizeof(int32_t));
    if (!top) {
        free(mark);
        return kvs_fail(KVS_ERR_NOMEM, "tova: out of memory");
    }
    /* Probabilities are >= 0, so the protected entry (-1) never displaces a real one. Ranking in float is
     * the documented precision (scores are float probabilities averaged in double then rounded). */
    kvs_topk(x, (size_t)s->n_cand, (size_t)(keep - taken), top);
    for (int64_t j = 0; j < keep - taken; j++) mark[top[j]] = 1;
    s->cnt = 0;
    for (int64_t j = 0; j < s->n_cand; j++)
        if (mark[j]) s->pos[s->cnt++] = s->cand[j];
    free(top);
    free(mark);
    return KVS_OK;
}

static kvs_status tova_prefill(void *state, const kvs_policy_view *view) {
    tova_state *s = state;
    /* new positions: the turn's prompt, or the block's (views built without blocks leave block_begin 0) */
    int64_t first = view->block_begin > view->turn_begin ? view->block_begin : view->turn_begin;
    int64_t n_new = view->n - first;
    int64_t nc = s->cnt + n_new;
    if (nc > s->cap) {
        int32_t *c = realloc(s->cand, (size_t)nc * sizeof(int32_t));
        if (c) s->cand = c;
        double *sc = realloc(s->score, (size_t)nc * sizeof(double));
        if (sc) s->score = sc;
        float *t = realloc(s->tmp, (size_t)nc * sizeof(float));
        if (t) s->tmp = t;
        void *w = realloc(s->work, kvs_attn_colsum_scratch_bytes(nc));
        if (w) s->work = w;
        if (!c || !sc || !t || !w) return kvs_fail(KVS_ERR_NOMEM, "tova: out of memory");
        s->cap = nc;
    } else if (!s->cand) {
        s->cand = malloc((size_t)s->cap * sizeof(int32_t));
        s->tmp = malloc((size_t)s->cap * sizeof(float));
        s->work = malloc(kvs_attn_colsum_scratch_bytes(s->cap));
        if (!s->cand || !s->tmp || !s->work) return kvs_fail(KVS_ERR_NOMEM, "tova: out of memory");
    }
    memcpy(s->cand, s->pos, (size_t)s->cnt * sizeof(int32_t));
    for (int64_t j = 0; j < n_new; j++) s->cand[s->cnt + j] = (int32_t)(first + j);
    s->n_cand = nc;
    /* Group-mean attention of the last prompt query over all candidates (it sees them all), reduced in fp64
     * as tova_observe() reduces a decode step. */
    for (int64_t j = 0; j < nc; j++) s->score[j] = 0;
    kvs_attn_src src = {.q = view->q, .q_first = view->q_first, .n_q = view->n_q, .group = s->group, .d = s->d,
                        .scale = s->scale, .keys = view->k, .idx = s->cand, .n_cand = nc};
    kvs_colsum_opts co = {.row_first = view->n - 1 - view->q_first, .n_rows = 1, .head_first = 0, .n_heads = s->group,
                          .reduce = KVS_GQA_MEAN, .n_out = nc};
    kvs_policy_colsum(view, &src, &co, NULL, s->score, s->work);
    if (s->mode == TOVA_GROUP) return keep_top(s, s->score);
    return KVS_OK; /* layer mode: layer_sync averages over KV heads and keeps the same set everywhere */
}

static kvs_status tova_select(void *state, const kvs_policy_view *view, kvs_policy_sel *sel) {
    tova_state *s = state;
    KVS_ASSERT(s->cnt < s->budget);
    s->pos[s->cnt++] = (int32_t)(view->n - 1);
    memcpy(sel->idx[0], s->pos, (size_t)s->cnt * sizeof(int32_t));
    sel->n[0] = s->cnt;
    return KVS_OK;
}

/* Index of the entry to evict given averaged scores: lowest score, newer position on ties. */
static int64_t victim_of(const tova_state *s, const double *score) {
    int64_t lim = s->protect ? s->cnt - 1 : s->cnt, v = 0;
    for (int64_t j = 1; j < lim; j++)
        if (score[j] <= score[v]) v = j;
    return v;
}

static void evict(tova_state *s, int64_t v) {
    memmove(s->pos + v, s->pos + v + 1, (size_t)(s->cnt - v - 1) * sizeof(int32_t));
    s->cnt--;
}

static kvs_status tova_observe(void *state, const kvs_policy_view *view, const kvs_policy_sel *sel,
                               const float *const *probs) {
    tova_state *s = state;
    (void)view;
    KVS_ASSERT(sel->n[0] == s->cnt);
    /* score[j] = (0 + p_0[j] + ... + p_{G-1}[j]) / G, the adds of each j in head order */
    memset(s->score, 0, (size_t)s->cnt * sizeof *s->score);
    kvs_heads_add(probs, (size_t)s->group, (size_t)s->cnt, 1, s->score);
    if (s->mode == TOVA_GROUP && s->cnt >= s->budget) evict(s, victim_of(s, s->score));
    return KVS_OK;
}

/* Layer mode: average the KV heads' group means (equal group sizes, so this is the mean over all query
 * heads of the layer) and apply the same decision to every KV head. */
static kvs_status tova_layer_sync(void *const *states, int n_kv_heads, kvs_policy_sync_phase phase) {
    tova_state *s0 = states[0];
    if (s0->mode != TOVA_LAYER) return KVS_OK;
    int64_t n = phase == KVS_SYNC_PREFILL ? s0->n_cand : s0->cnt;
    double *avg = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    if (!avg) return kvs_fail(KVS_ERR_NOMEM, "tova: out of memory");
    for (int64_t j = 0; j < n; j++) avg[j] = 0;
    for (int h = 0; h < n_kv_heads; h++) {
        const tova_state *s = states[h];
        /* Identical sets across the layer's KV heads are an invariant of layer mode. */
        KVS_ASSERT((phase == KVS_SYNC_PREFILL ? s->n_cand : s->cnt) == n);
        for (int64_t j = 0; j < n; j++) avg[j] += s->score[j];
    }
    kvs_div_by(avg, (size_t)n, n_kv_heads);
    kvs_status st = KVS_OK;
    if (phase == KVS_SYNC_PREFILL) {
        for (int h = 0; h < n_kv_heads && st == KVS_OK; h++) st = keep_top(states[h], avg);
    } else if (s0->cnt >= s0->budget) {
        int64_t v = victim_of(s0, avg);
        for (int h = 0; h < n_kv_heads; h++) evict(states[h], v);
    }
    free(avg);
    return st;
}

static int64_t tova_prefill_block(void *state) { return ((tova_state *)state)->block; }

static int64_t tova_stored(void *state, int g, int32_t *out) {
    tova_state *s = state;
    (void)g;
    if (s->cnt > 0) memcpy(out, s->pos, (size_t)s->cnt * sizeof(int32_t)); /* pos may be NULL before the first block */
    return s->cnt;
}

static kvs_status tova_validate(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget) {
    (void)m;
    if (kvs_policy_param_get(cfg, "protect_current") != 0 && budget < 2)
        return kvs_fail(KVS_ERR_INVALID_ARG, "policy tova: protect_current=true needs a budget of at least 2");
    return KVS_OK;
}

const struct kvs_policy_ops kvs_policy_tova = {
    .name = "tova",
    .summary = "TOVA: evict the entry with the lowest head-averaged attention of the current query",
    .is_oracle = 0,
    .granularity = KVS_SEL_PER_KV_HEAD,
    .budget_scope = KVS_BUDGET_EVERY_STEP,
    .params = tova_params,
    .n_params = (int)(sizeof tova_params / sizeof tova_params[0]),
    .presets = tova_presets,
    .n_presets = (int)(sizeof tova_presets / sizeof tova_presets[0]),
    .validate = tova_validate,
    .create = tova_create,
    .free = tova_free,
    .prefill = tova_prefill,
    .select = tova_select,
    .observe = tova_observe,
    .layer_sync = tova_layer_sync,
    .stored = tova_stored,
    .prefill_block = tova_prefill_block,
};
