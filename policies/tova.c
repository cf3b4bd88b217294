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
 * Sliding-window layers (sim/replay.h): the host's window_evict (before a prefill, and before observe) names the
 * first position the next step can attend; the positions before it leave the held list at the start of the
 * prefill, or in observe after this step's attention is taken and before any eviction (in layer mode on every KV
 * head alike, so the sets stay identical), and a prefill takes no candidate before it; a budget B >= the window W
 * then holds exactly the window.
 */
#include <stdlib.h>
#include <string.h>

#include "../common/kvs_math.h"
#include "../sim/policy_memo.h"
#include "held.h"
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
    /* ascending cache positions (+ the current token during a step; a prefill's candidates until they are cut),
     * score = this step's group-mean attention (no state carries over between steps) */
    kvs_held *held;
    char *mark;       /* [cap] the cut's keep mask */
    void *work;       /* [kvs_attn_colsum_scratch_bytes(cap)] prefill scratch */
    int64_t cap;      /* candidates mark and work have room for */
    int64_t win_first; /* positions before it are evicted by the host (sliding-window layer); 0 otherwise */
} tova_state;

static void tova_free(void *state) {
    tova_state *s = state;
    if (!s) return;
    kvs_held_free(s->held);
    free(s->mark);
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
    s->held = kvs_held_create(s->budget);
    if (!s->held) {
        tova_free(s);
        return kvs_fail(KVS_ERR_NOMEM, "tova: out of memory");
    }
    *state = s;
    return KVS_OK;
}

/* Cuts the candidates to the B-1 best by `score` (the held list's own, or the layer's mean, which may alias it),
 * in position order; the last prompt position is forced in when protected. Ranking in float is the documented
 * precision (scores are float probabilities averaged in double, then rounded): the held scores become the
 * rounded values, so the fp64 ranking of the helper ranks exactly as a float one (same order, same ties: the
 * older position). The protected entry is ranked at -1: probabilities are >= 0, so it never displaces a real
 * one. */
static void keep_top(tova_state *s, const double *score) {
    int64_t keep = s->budget - 1, n = kvs_held_count(s->held);
    if (n <= keep) return;
    double *own = kvs_held_score(s->held);
    for (int64_t j = 0; j < n; j++) own[j] = (double)(float)score[j];
    int protect = s->protect && keep > 0;
    if (protect) own[n - 1] = -1.0;
    kvs_held_mark_top(s->held, 0, n, keep - protect, s->mark);
    if (protect) s->mark[n - 1] = 1;
    kvs_held_compact(s->held, s->mark);
}

static kvs_status tova_prefill(void *state, const kvs_policy_view *view) {
    tova_state *s = state;
    kvs_held_drop_before(s->held, (int32_t)s->win_first);
    /* new positions: the turn's prompt, or the block's (views built without blocks leave block_begin 0) */
    int64_t first = view->block_begin > view->turn_begin ? view->block_begin : view->turn_begin;
    if (first < s->win_first) first = s->win_first; /* evicted by the host before the prefill */
    int64_t n_new = view->n > first ? view->n - first : 0;
    int64_t nc = kvs_held_count(s->held) + n_new;
    if (nc == 0) return KVS_OK;
    if (nc > s->cap || !s->work) {
        int64_t cap = nc > s->budget ? nc : s->budget; /* at least B: an empty first prompt still gets scratch */
        char *m = realloc(s->mark, (size_t)cap);
        if (m) s->mark = m;
        void *w = realloc(s->work, kvs_attn_colsum_scratch_bytes(cap));
        if (w) s->work = w;
        if (!m || !w) return kvs_fail(KVS_ERR_NOMEM, "tova: out of memory");
        s->cap = cap;
    }
    if (kvs_held_reserve(s->held, nc) != KVS_OK) return kvs_fail(KVS_ERR_NOMEM, "tova: out of memory");
    for (int64_t j = 0; j < n_new; j++) kvs_held_push(s->held, (int32_t)(first + j));
    /* Group-mean attention of the last prompt query over all candidates (it sees them all), reduced in fp64
     * as tova_observe() reduces a decode step. */
    kvs_held_reset_scores(s->held);
    kvs_attn_src src = {.q = view->q, .q_first = view->q_first, .n_q = view->n_q, .group = s->group, .d = s->d,
                        .scale = s->scale, .keys = view->k, .idx = kvs_held_pos(s->held), .n_cand = nc};
    kvs_colsum_opts co = {.row_first = view->n - 1 - view->q_first, .n_rows = 1, .head_first = 0, .n_heads = s->group,
                          .reduce = KVS_GQA_MEAN, .n_out = nc};
    kvs_policy_colsum(view, &src, &co, NULL, kvs_held_score(s->held), s->work);
    if (s->mode == TOVA_GROUP) keep_top(s, kvs_held_score(s->held));
    return KVS_OK; /* layer mode: layer_sync averages over KV heads and keeps the same set everywhere */
}

static kvs_status tova_select(void *state, const kvs_policy_view *view, kvs_policy_sel *sel) {
    tova_state *s = state;
    KVS_ASSERT(kvs_held_count(s->held) < s->budget); /* the list was created with room for B */
    kvs_held_push(s->held, (int32_t)(view->n - 1));
    sel->n[0] = kvs_held_copy(s->held, sel->idx[0]);
    return KVS_OK;
}

/* The entry to evict by the held scores: the lowest, the newer position on ties; the current token is no
 * candidate when protected. */
static int64_t victim_of(const tova_state *s) {
    int64_t n = kvs_held_count(s->held);
    return kvs_held_lowest(s->held, 0, s->protect ? n - 1 : n);
}

static kvs_status tova_observe(void *state, const kvs_policy_view *view, const kvs_policy_sel *sel,
                               const float *const *probs) {
    tova_state *s = state;
    (void)view;
    KVS_ASSERT(sel->n[0] == kvs_held_count(s->held));
    /* score[j] = (0 + p_0[j] + ... + p_{G-1}[j]) / G, the adds of each j in head order */
    kvs_held_reset_scores(s->held);
    kvs_held_add_heads(s->held, probs, s->group, 1);
    kvs_held_drop_before(s->held, (int32_t)s->win_first); /* the window's evictions first */
    if (s->mode == TOVA_GROUP && kvs_held_count(s->held) >= s->budget) kvs_held_remove(s->held, victim_of(s));
    return KVS_OK;
}

/* Layer mode: average the KV heads' group means (equal group sizes, so this is the mean over all query
 * heads of the layer) and apply the same decision to every KV head: at a decode step the mean replaces every
 * head's scores (they serve this step's eviction and the next step's scores() only), the victim is chosen on the
 * first head and evicted everywhere. */
static kvs_status tova_layer_sync(void *const *states, int n_kv_heads, kvs_policy_sync_phase phase) {
    tova_state *s0 = states[0];
    if (s0->mode != TOVA_LAYER) return KVS_OK;
    int64_t n = kvs_held_count(s0->held);
    double *avg = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    if (!avg) return kvs_fail(KVS_ERR_NOMEM, "tova: out of memory");
    for (int64_t j = 0; j < n; j++) avg[j] = 0;
    for (int h = 0; h < n_kv_heads; h++) {
        tova_state *s = states[h];
        /* Identical sets across the layer's KV heads are an invariant of layer mode. */
        KVS_ASSERT(kvs_held_count(s->held) == n);
        const double *score = kvs_held_score(s->held);
        for (int64_t j = 0; j < n; j++) avg[j] += score[j];
    }
    kvs_div_by(avg, (size_t)n, n_kv_heads);
    if (phase == KVS_SYNC_PREFILL) {
        for (int h = 0; h < n_kv_heads; h++) keep_top(states[h], avg);
    } else {
        /* every head ranks by the layer mean (the eviction below, and the scores() of the next step) */
        for (int h = 0; h < n_kv_heads; h++)
            memcpy(kvs_held_score(((tova_state *)states[h])->held), avg, (size_t)n * sizeof *avg);
    }
    if (phase == KVS_SYNC_DECODE && n >= s0->budget) {
        int64_t v = victim_of(s0);
        for (int h = 0; h < n_kv_heads; h++) kvs_held_remove(((tova_state *)states[h])->held, v);
    }
    free(avg);
    return KVS_OK;
}

/* Retention scores (policy.h scores()): the attention of the last step the held entries are ranked by (the group
 * mean, or the layer mean in layer mode); the current token is kept whatever its score when protected. */
static int tova_scores(void *state, int g, const int32_t *idx, int64_t n, double *out) {
    tova_state *s = state;
    (void)g;
    int64_t cnt = kvs_held_count(s->held);
    kvs_held_scores_of(s->held, 0, s->protect ? cnt - 1 : cnt, idx, n, out);
    return 1;
}

/* Takes effect in the next prefill or observe (the list stays aligned with this step's selection until then). */
static kvs_status tova_window_evict(void *state, int64_t first) {
    tova_state *s = state;
    if (first > s->win_first) s->win_first = first;
    return KVS_OK;
}

static int64_t tova_prefill_block(void *state) { return ((tova_state *)state)->block; }

static int64_t tova_stored(void *state, int g, int32_t *out) {
    tova_state *s = state;
    (void)g;
    return kvs_held_copy(s->held, out);
}

static kvs_status tova_validate(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget) {
    (void)m;
    if (kvs_policy_param_get(cfg, "protect_current") != 0 && budget < 2)
        return kvs_fail(KVS_ERR_INVALID_ARG, "policy tova: protect_current=true needs a budget of at least 2");
    return KVS_OK;
}

const struct kvs_policy_ops kvs_policy_tova = {
    .version = KVS_POLICY_INTERFACE_VERSION,
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
    .scores = tova_scores,
    .prefill_block = tova_prefill_block,
    .window_evict = tova_window_evict,
};
