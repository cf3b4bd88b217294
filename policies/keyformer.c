/* keyformer.c — Keyformer (Adnan et al., MLSys'24), as specified in POLICY_SPEC §2.6 B7 and the appendix row
 * "Keyformer"; reference d-matrix-ai/keyformer-llm models/keyformer-lib/attention.py and blog/README.md.
 *
 * Score: the accumulated Gumbel-softmax of the attention logits. At every query (each prompt query in
 * prefill, the current query at each decode step) and for each query head g, over the positions the query
 * attends (causal), with logits z_j = scale * q·k_j and fresh Gumbel(0,1) noise g_j:
 *     f_j = exp((z_j + g_j) / tau) / sum_j' exp((z_j' + g_j') / tau)      (torch gumbel_softmax, hard=False)
 * and acc[j] += f_j. The attention the model uses is the ordinary softmax over the kept positions (the engine
 * computes it); f only ranks. Temperature tau = tau_init + itr * dtau with itr = 0 for prompt queries and
 * itr = t for the t-th generated token of the turn (t = 1 at the first decode step).
 * Cache: budget B = R_k recent + (B - R_k) key tokens, R_k = floor(recent * B) (paper 30 %). Attend-then-evict:
 * S_t = the cache (B-1 entries) + the new token; after attention, if |S_t| = B, the lowest-acc entry among all
 * but the last R_k entries of S_t is discarded, permanently (the reference's cumulative mask). Prefill keeps
 * the last R_k - 1 prompt positions (the next token completes the recent window) and the top B - R_k of the
 * rest by acc.
 *
 * Ambiguities resolved (paper / reference / what we do):
 *  - Budget: the reference's cache is kv_cache % of the prompt (60 %): `kvsim replay --budgets 60%` gives
 *    B = ceil(0.6 P) tokens per KV head (per query head with gqa=expand). kvsim's B bounds the attended set,
 *    the current token included (POLICY_SPEC preamble): the reference keeps floor(0.6 P) and its query sees one
 *    more, so B = its cache + 1 compares the same attended size.
 *  - Temperature: tau_schedule=span (default; the paper and POLICY_SPEC B7): dtau = (tau_end - tau_init) / T_gen
 *    with T_gen = max_new_tokens of the trace, so tau reaches tau_end at the last token; itr is capped at T_gen
 *    (tau never passes tau_end, e.g. a trace generating past its cap), and with max_new_tokens unknown (0)
 *    tau stays at tau_init (a note says so). tau_schedule=step: tau = tau_init + itr * tau_delta without a cap,
 *    the reference code's 1.0 + 0.01 * step (preset keyformer@reference).
 *  - Noise [SIM-CHOICE, POLICY_SPEC B7]: PCG32 (common/kvs_rng.h). The Gumbel noise of query position i and
 *    query head g (0..G-1 within the KV group) is the stream kvs_rng_seed(seed, i * G + g) of the instance's
 *    seed (kvs_policy_init.seed: per run, layer and KV head); the query's visible candidates draw from it in
 *    ascending position order, one kvs_rng_gumbel() each. noise=none drops g (an ablation: the accumulated
 *    tempered softmax, an H2O-like ranking; notes() says so).
 *  - Precision: logits and the Gumbel-softmax in fp64 (kvs_attn_scores_f64, kvs_softmax_f64), accumulated in
 *    fp64; per query row the heads' f are summed in ascending g, then added (gqa=mean: divided by G first).
 *  - GQA: per head in the original (MHA models), so gqa=expand (default): each query head keeps its own B
 *    entries and scores, storage G x (DESIGN.md "GQA layout"); on MHA traces expand is per KV head.
 *    gqa=mean: one set per KV head scored with the group mean of the heads' f (each head its own noise).
 *  - Ties: the lowest acc is discarded, the NEWER position among equals; prefill TOPK ties go to the older
 *    position (§1.4). R_k = 0 (recent < 1/B) leaves the current token unprotected: it may be discarded right
 *    after it is attended, as in the reference with recent=0. R_k = B (recent=1) leaves no key token: a window.
 *  - Multi-turn [SIM-CHOICE, as h2o.c]: the reference restarts at every prompt (one sequence per prompt); here
 *    a later turn's prompt queries attend (causally) to the kept cache plus the new prompt and add their f to
 *    the running acc (itr = 0, tau = tau_init), then the set is compressed to B-1 the same way.
 * Cost (POLICY_SPEC §3 "Keyformer"): per cache |S_t| K/V slots plus one score per slot (model aux_bytes);
 * reads: the attended K/V plus the scores (fused with the attention's QK^T; unfused, the K are read again);
 * writes: the new token's K/V plus the updated scores.
 */
#include <stdlib.h>
#include <string.h>

#include "../common/kvs_math.h"
#include "../common/kvs_rng.h"
#include "held.h"
#include "registry.h"

enum { KF_EXPAND = 0, KF_MEAN = 1 };
enum { KF_SPAN = 0, KF_STEP = 1 };
enum { KF_GUMBEL = 0, KF_NONE = 1 };

static const kvs_policy_param keyformer_params[] = {
    {.key = "recent", .type = KVS_PARAM_DOUBLE, .def = 0.3, .lo = 0.0, .hi = 1.0,
     .help = "recent window R_k = floor(recent x budget) (Keyformer: 30%); the other entries are key tokens"},
    {.key = "tau_init", .type = KVS_PARAM_DOUBLE, .def = 1.0, .lo = 1e-3, .hi = 1e6,
     .help = "Gumbel-softmax temperature at the prompt (itr = 0)"},
    {.key = "tau_end", .type = KVS_PARAM_DOUBLE, .def = 2.0, .lo = 1e-3, .hi = 1e6,
     .help = "tau_schedule=span: temperature at the last of max_new_tokens generated tokens"},
    {.key = "tau_schedule", .type = KVS_PARAM_ENUM, .def = KF_SPAN, .choices = "span|step",
     .help = "span: tau_init + itr (tau_end - tau_init) / max_new_tokens (paper); step: tau_init + itr tau_delta "
             "(reference code)"},
    {.key = "tau_delta", .type = KVS_PARAM_DOUBLE, .def = 0.01, .lo = 0.0, .hi = 1e6,
     .help = "tau_schedule=step: temperature increase per generated token (reference: 0.01)"},
    {.key = "noise", .type = KVS_PARAM_ENUM, .def = KF_GUMBEL, .choices = "gumbel|none",
     .help = "none: no Gumbel noise (ablation: accumulated tempered softmax, an H2O-like ranking)"},
    {.key = "gqa", .type = KVS_PARAM_ENUM, .def = KF_EXPAND, .choices = "expand|mean",
     .help = "expand: a cache per query head (per head as in the MHA original, G x storage); mean: one per KV head"},
};

static const kvs_policy_preset keyformer_presets[] = {
    {.name = "reference", .params = "tau_schedule=step,tau_delta=0.01",
     .help = "d-matrix-ai/keyformer-llm attention.py: tau = 1.0 + 0.01 x step, recent 30%; its cache is 60% of "
             "the prompt (--budgets 60%)"},
};

typedef struct {
    int64_t budget, recent; /* B, R_k */
    int mode, n_lists, group, d, noise, schedule;
    double tau_init, dtau;  /* tau = tau_init + min(itr, itr_cap) * dtau */
    int64_t itr_cap;        /* span: T_gen (0: dtau = 0); step: no cap (INT64_MAX) */
    float scale;
    uint64_t seed;
    int32_t aux_bytes;
    kvs_policy_model model;
    /* [n_lists] the caches: ascending positions (at attention time: + the current token), score = accumulated
     * Gumbel-softmax; a prefill's candidates are appended to them and compressed in place */
    kvs_held **lists;
    /* scratch, capacity scratch_cap candidates */
    double *f, *t;
    int64_t scratch_cap;
    int64_t win_first; /* positions before it are evicted by the host (sliding-window layer); 0 otherwise */
} kf_state;

static int64_t recent_of(double recent, int64_t budget) {
    int64_t r = (int64_t)(recent * (double)budget);
    return r < 0 ? 0 : r > budget ? budget : r;
}

static kvs_policy_granularity kf_layout(const kvs_policy_config *cfg) {
    return (int)kvs_policy_param_get(cfg, "gqa") == KF_EXPAND ? KVS_SEL_PER_QUERY_HEAD : KVS_SEL_PER_KV_HEAD;
}

/* Degenerate settings (kvs_policy_ops.notes). */
static int kf_notes(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget, char *buf, size_t cap) {
    int n = 0;
    double recent = kvs_policy_param_get(cfg, "recent");
    if (recent_of(recent, budget) >= budget)
        n += kvs_policy_note(buf, cap, "recent=%g leaves no key-token slot at this budget (a window)", recent);
    if ((int)kvs_policy_param_get(cfg, "noise") == KF_NONE)
        n += kvs_policy_note(buf, cap, "noise=none: no Gumbel noise, the accumulated tempered softmax (an H2O-like "
                                       "ranking)");
    if ((int)kvs_policy_param_get(cfg, "tau_schedule") == KF_SPAN && m->max_new_tokens <= 0 &&
        kvs_policy_param_get(cfg, "tau_end") != kvs_policy_param_get(cfg, "tau_init"))
        n += kvs_policy_note(buf, cap, "max_new_tokens is unknown: the temperature stays at tau_init=%g",
                             kvs_policy_param_get(cfg, "tau_init"));
    return n;
}

static void kf_free(void *state) {
    kf_state *s = state;
    if (!s) return;
    if (s->lists)
        for (int i = 0; i < s->n_lists; i++) kvs_held_free(s->lists[i]);
    free(s->lists);
    free(s->f);
    free(s->t);
    free(s);
}

static kvs_status kf_create(const kvs_policy_init *init, void **state) {
    kf_state *s = calloc(1, sizeof *s);
    if (!s) return kvs_fail(KVS_ERR_NOMEM, "keyformer: out of memory");
    const kvs_policy_config *cfg = init->cfg;
    s->budget = init->budget;
    s->recent = recent_of(kvs_policy_param_get(cfg, "recent"), init->budget);
    s->mode = (int)kvs_policy_param_get(cfg, "gqa");
    s->noise = (int)kvs_policy_param_get(cfg, "noise");
    s->schedule = (int)kvs_policy_param_get(cfg, "tau_schedule");
    s->tau_init = kvs_policy_param_get(cfg, "tau_init");
    if (s->schedule == KF_STEP) {
        s->dtau = kvs_policy_param_get(cfg, "tau_delta");
        s->itr_cap = INT64_MAX;
    } else if (init->model->max_new_tokens > 0) {
        s->itr_cap = init->model->max_new_tokens;
        s->dtau = (kvs_policy_param_get(cfg, "tau_end") - s->tau_init) / (double)s->itr_cap;
    } /* else: T_gen unknown, dtau = 0 */
    s->group = init->model->group;
    s->d = init->model->head_dim;
    s->scale = init->model->scale;
    s->seed = init->seed;
    s->aux_bytes = init->model->aux_bytes;
    s->model = *init->model;
    s->n_lists = s->mode == KF_EXPAND ? s->group : 1;
    s->lists = calloc((size_t)s->n_lists, sizeof *s->lists);
    if (!s->lists) goto nomem;
    for (int i = 0; i < s->n_lists; i++)
        if (!(s->lists[i] = kvs_held_create(s->budget))) goto nomem;
    *state = s;
    return KVS_OK;
nomem:
    kf_free(s);
    return kvs_fail(KVS_ERR_NOMEM, "keyformer: out of memory");
}

static kvs_status ensure_scratch(kf_state *s, int64_t n) {
    if (n <= s->scratch_cap) return KVS_OK;
    free(s->f);
    free(s->t);
    s->f = malloc((size_t)n * sizeof(double));
    s->t = malloc((size_t)n * sizeof(double));
    s->scratch_cap = (s->f && s->t) ? n : 0;
    return s->scratch_cap ? KVS_OK : kvs_fail(KVS_ERR_NOMEM, "keyformer: out of memory");
}

/* Temperature of a query with iteration itr (0: prompt; t: the t-th generated token of the turn). */
static double tau_at(const kf_state *s, int64_t itr) {
    if (itr > s->itr_cap) itr = s->itr_cap;
    return s->tau_init + (double)itr * s->dtau;
}

/* The list's score of one query row at position qpos over the n candidates idx (all visible to it): t[j] =
 * sum over the list's heads (ascending) of the Gumbel-softmax f_j, with tau. The heads' queries are
 * qrow[g * d] (the row holds the group's G queries). */
static void row_scores(kf_state *s, int li, const float *qrow, int64_t qpos, const float *keys, const int32_t *idx,
                       int64_t n, double tau, double *t) {
    int g_lo = s->mode == KF_EXPAND ? li : 0, g_hi = s->mode == KF_EXPAND ? li + 1 : s->group;
    for (int64_t j = 0; j < n; j++) t[j] = 0;
    for (int g = g_lo; g < g_hi; g++) {
        kvs_attn_scores_f64(qrow + (size_t)g * (size_t)s->d, keys, (size_t)s->d, idx, (size_t)n, (size_t)s->d, s->scale,
                            s->f);
        kvs_rng rng;
        kvs_rng_seed(&rng, s->seed, (uint64_t)qpos * (uint64_t)s->group + (uint64_t)g);
        for (int64_t j = 0; j < n; j++) {
            double noise = s->noise == KF_GUMBEL ? kvs_rng_gumbel(&rng) : 0.0;
            s->f[j] = (s->f[j] + noise) / tau;
        }
        kvs_softmax_f64(s->f, (size_t)n);
        for (int64_t j = 0; j < n; j++) t[j] += s->f[j];
    }
    if (s->mode == KF_MEAN)
        for (int64_t j = 0; j < n; j++) t[j] /= s->group;
}

/* Prefill of one list: candidates = kept positions + the turn's new prompt positions, appended with acc 0; every
 * new prompt query adds its (causal) Gumbel-softmax at tau_init; then keep the last R_k - 1 and the top B - R_k of
 * the rest (ties: the older position). */
static kvs_status kf_prefill_list(kf_state *s, int li, const kvs_policy_view *view) {
    kvs_held *L = s->lists[li];
    kvs_held_drop_before(L, (int32_t)s->win_first);
    int64_t first = view->block_begin > view->turn_begin ? view->block_begin : view->turn_begin;
    if (first < s->win_first) first = s->win_first; /* evicted by the host before the prefill */
    int64_t held = kvs_held_count(L), n_new = view->n > first ? view->n - first : 0, nc = held + n_new;
    if (nc == 0) return KVS_OK;
    if (kvs_held_reserve(L, nc) != KVS_OK) return kvs_fail(KVS_ERR_NOMEM, "keyformer: out of memory");
    kvs_status st = ensure_scratch(s, nc);
    if (st != KVS_OK) return st;
    for (int64_t j = 0; j < n_new; j++) kvs_held_push(L, (int32_t)(first + j));
    size_t gd = (size_t)s->group * (size_t)s->d;
    double tau = tau_at(s, 0);
    for (int64_t i = first; i < view->n; i++) {
        int64_t vis = held + (i - first) + 1; /* the kept cache and the prompt up to i */
        row_scores(s, li, view->q + (size_t)(i - view->q_first) * gd, i, view->k, kvs_held_pos(L), vis, tau, s->t);
        kvs_held_add_f64(L, s->t, vis);
    }
    int64_t keep = s->budget - 1;
    if (nc <= keep) return KVS_OK;
    int64_t rec = s->recent > 0 ? s->recent - 1 : 0;
    if (rec > keep) rec = keep;
    kvs_held_keep_top(L, 0, nc - rec, keep - rec);
    return KVS_OK;
}

static kvs_status kf_prefill(void *state, const kvs_policy_view *view) {
    kf_state *s = state;
    for (int li = 0; li < s->n_lists; li++) {
        kvs_status st = kf_prefill_list(s, li, view);
        if (st != KVS_OK) return st;
    }
    return KVS_OK;
}

static kvs_status kf_select(void *state, const kvs_policy_view *view, kvs_policy_sel *sel) {
    kf_state *s = state;
    for (int li = 0; li < s->n_lists; li++) {
        kvs_held *L = s->lists[li];
        KVS_ASSERT(kvs_held_count(L) < s->budget);
        kvs_held_push(L, (int32_t)(view->n - 1)); /* acc 0: scored after its attention */
        sel->n[li] = kvs_held_copy(L, sel->idx[li]);
    }
    return KVS_OK;
}

/* After attention: the current query's Gumbel-softmax over S_t is added to acc, then (cache full) the
 * lowest-acc entry older than the recent window is discarded. The engine's probabilities are not needed:
 * the score uses the query's own logits over the same S_t. */
static kvs_status kf_observe(void *state, const kvs_policy_view *view, const kvs_policy_sel *sel,
                             const float *const *probs) {
    kf_state *s = state;
    (void)probs;
    int64_t p = view->n - 1;
    double tau = tau_at(s, p - view->prompt_end + 1);
    kvs_status st = ensure_scratch(s, s->budget);
    if (st != KVS_OK) return st;
    for (int li = 0; li < s->n_lists; li++) {
        kvs_held *L = s->lists[li];
        int64_t cnt = kvs_held_count(L);
        KVS_ASSERT(sel->n[li] == cnt);
        row_scores(s, li, view->q, p, view->k, kvs_held_pos(L), cnt, tau, s->t);
        kvs_held_add_f64(L, s->t, cnt);
        cnt -= kvs_held_drop_before(L, (int32_t)s->win_first); /* the window's evictions first */
        if (cnt < s->budget) continue;
        /* the lowest acc older than the recent window, the newer on ties; no key-token slot: the oldest (a window) */
        kvs_held_remove(L, kvs_held_lowest(L, 0, cnt - s->recent));
    }
    return KVS_OK;
}

/* Sliding-window layers (sim/replay.h): takes effect in the next prefill (no entry or candidate before `first`; a
 * prompt query before it would score only such candidates, so it scores nothing) or observe (after this step's
 * score is added, before the eviction), as in H2O. */
static kvs_status kf_window_evict(void *state, int64_t first) {
    kf_state *s = state;
    if (first > s->win_first) s->win_first = first;
    return KVS_OK;
}

static int64_t kf_stored(void *state, int g, int32_t *out) {
    kf_state *s = state;
    return kvs_held_copy(s->lists[s->mode == KF_EXPAND ? g : 0], out);
}

/* Retention scores (policy.h scores()): the accumulated Gumbel-softmax score of the key-token entries eviction ranks;
 * the recent window (the last R_k entries) is kept whatever its score. */
static int kf_scores(void *state, int g, const int32_t *idx, int64_t n, double *out) {
    kf_state *s = state;
    const kvs_held *L = s->lists[s->mode == KF_EXPAND ? g : 0];
    kvs_held_scores_of(L, 0, kvs_held_count(L) - s->recent, idx, n, out);
    return 1;
}

/* KV as the default counts it (S_t per cache) plus one score per attended entry (aux), read and written
 * once per step; unfused scoring reads the K of S_t again. */
static void kf_account(void *state, const kvs_policy_view *view, const kvs_policy_sel *sel, kvs_policy_cost *out) {
    kf_state *s = state;
    (void)view;
    double slots = 0;
    for (int li = 0; li < sel->n_lists; li++) slots += (double)sel->n[li];
    double scores = slots * (double)s->aux_bytes;
    out->aux_bytes = scores;
    out->read_aux_bytes = scores;
    out->read_aux_unfused_bytes = scores + kvs_policy_kv_bytes(&s->model, slots) / 2; /* K only */
    out->write_bytes += scores;
}

const struct kvs_policy_ops kvs_policy_keyformer = {
    .version = KVS_POLICY_INTERFACE_VERSION,
    .name = "keyformer",
    .summary = "Keyformer: key tokens by accumulated Gumbel-softmax score + recent window (attend-then-evict); the "
               "paper's cache of 60% of the prompt is --budgets 60%",
    .is_oracle = 0,
    .granularity = KVS_SEL_PER_QUERY_HEAD,
    .budget_scope = KVS_BUDGET_EVERY_STEP,
    .params = keyformer_params,
    .n_params = (int)(sizeof keyformer_params / sizeof keyformer_params[0]),
    .presets = keyformer_presets,
    .n_presets = (int)(sizeof keyformer_presets / sizeof keyformer_presets[0]),
    .layout = kf_layout,
    .notes = kf_notes,
    .create = kf_create,
    .free = kf_free,
    .prefill = kf_prefill,
    .select = kf_select,
    .observe = kf_observe,
    .stored = kf_stored,
    .scores = kf_scores,
    .account = kf_account,
    .window_evict = kf_window_evict,
};
