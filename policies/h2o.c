/* h2o.c — H2O, Heavy-Hitter Oracle (Zhang et al., NeurIPS'23), as specified in POLICY_SPEC §2.6 B4.
 *
 * Budget B = H_h heavy hitters + R_w recent tokens. Score = accumulated attention: prefill column sums over
 * every prompt query, then acc[j] += a_t[j] at each decode step (the attention the engine computed over S_t:
 * H2O's only feedback, so no oracle information is used despite the name).
 * Decode is attend-then-evict: S_t = the cache (B-1 entries) + the new token (acc starts at 0 and receives
 * its own attention); after attention, if |S_t| = B, evict the lowest-acc token among the non-recent ones
 * (all but the last R_w positions of S_t).
 *
 * Ambiguities resolved (write-ups of the choices):
 *  - Split: H_h = floor((1 - recent) * B), R_w = B - H_h (recent = 0.5 gives the paper's 50:50; the current
 *    token counts in R_w, so R_w >= 1 whenever recent > 0). With H_h = 0 the policy degenerates to a window
 *    (the oldest token is evicted).
 *  - Budget convention (POLICY_SPEC preamble): the query sees B entries, so B-1 stay between steps. Prefill
 *    keeps TOPK(acc, H_h) over the prompt positions older than the last R_w-1, plus those R_w-1.
 *  - Ties: eviction picks the lowest acc; among equal acc the NEWER position is evicted (§1.4: the older
 *    token wins a tie). Prefill TOPK ties go to the older position.
 *  - GQA: gqa=expand (default; MorphKV's and D2O's references, "maintaining all attention heads"): every
 *    query head has its own cache of B entries and its own scores, storage G x. gqa=mean (KeyDiff App. F.2):
 *    one set per KV head, scored with the group-mean attention.
 *  - Multi-turn: a later turn's prompt queries attend (causally) to the cache kept from earlier turns plus the
 *    new prompt; their attention is added to acc and the set is compressed to B-1 the same way.
 * Variants (each off by default, so the defaults are the paper's H2O and keep their numbers):
 *  - prefill=budget: the MorphKV repository's H2O [REF, POLICY_SPEC §2.1 Δ-REF 5 and B4]: the prefill score sums
 *    the attention of only the last C_tot prompt queries (a tril-masked sum), C_tot = B here (kvsim's budget
 *    is the paper's capacity); the earlier prompt queries add nothing (their positions are still candidates).
 *  - window=R (> 0): an absolute recent window instead of the `recent` fraction, as that repository keeps "the
 *    top C_tot - R plus the last R + 1": R_w = R + 1 (the current token included), H_h = B - R - 1 (>= 0).
 *  - block=M (> 0): block-wise prompt processing (KeyDiff §2.4 Eq. 6, App. F.2 with M = 128) through the
 *    engine's chunked prefill (prefill_block): each block's queries attend causally to the cache kept after
 *    the previous block plus the block, add their attention to acc, and the candidates are compressed to B-1
 *    before the next block (a hard cap through the whole prompt). With prefill=budget, only the queries among
 *    the turn's last B prompt positions add attention, whichever block they fall in.
 * Sliding-window layers (sim/replay.h): the host's window_evict (before a prefill, and before observe) names the
 * first position the next step can attend; the positions before it leave every list (their scores with them) at
 * the start of the prefill, or in observe after this step's attention is added and before the eviction, and a
 * prefill takes no candidate before it. So the heavy hitters are chosen among the window's positions, the policy
 * never spends its eviction on a position the window drops anyway, and B >= the window W holds exactly the window.
 * Storage per cache: B slots (2d·B·kv_bytes) + B fp32 scores; traffic per step: the attended K/V plus the
 * attended tokens' scores (read-modify-write counted once as a read).
 */
#include <stdlib.h>
#include <string.h>

#include "../common/kvs_math.h"
#include "../sim/policy_memo.h"
#include "held.h"
#include "registry.h"

enum { H2O_EXPAND = 0, H2O_MEAN = 1 };
enum { H2O_PREFILL_ALL = 0, H2O_PREFILL_BUDGET = 1 };

static const kvs_policy_param h2o_params[] = {
    {.key = "recent", .type = KVS_PARAM_DOUBLE, .def = 0.5, .lo = 0.0, .hi = 1.0,
     .help = "fraction of the budget for the recent window (the rest are heavy hitters); H2O uses 0.5"},
    {.key = "gqa", .type = KVS_PARAM_ENUM, .def = H2O_EXPAND, .choices = "expand|mean",
     .help = "expand: a cache per query head (G x storage); mean: one per KV head, group-mean scores"},
    {.key = "prefill", .type = KVS_PARAM_ENUM, .def = H2O_PREFILL_ALL, .choices = "all|budget",
     .help = "prompt queries that score: all (H2O) or the last B of the prompt (MorphKV repo's H2O)"},
    {.key = "window", .type = KVS_PARAM_INT, .def = 0, .lo = 0, .hi = 1 << 20,
     .help = "R > 0: keep the last R positions + the current one, B - R - 1 heavy hitters (MorphKV repo); "
             "0: the recent fraction"},
    {.key = "block", .type = KVS_PARAM_INT, .def = 0, .lo = 0, .hi = 1 << 20,
     .help = "M > 0: prompt processed in blocks of M, compressed to B-1 after each (KeyDiff: 128); 0: at once"},
};

static const kvs_policy_preset h2o_presets[] = {
    {.name = "morphkv-longwriter", .params = "gqa=expand,prefill=budget,window=30",
     .help = "MorphKV §5.1 LongWriter (repo H2O, per query head): 600 per head (--budgets 600); window 30 = the "
             "runs' recent window (Table 7), not stated for H2O itself"},
    {.name = "morphkv-longgenbench", .params = "gqa=expand,prefill=budget",
     .help = "MorphKV §5.2 LongGenBench (repo H2O, per query head): 4K per head (--budgets 4096); its window is not "
             "stated: H2O's 50:50 split kept (add :window=R)"},
    {.name = "keydiff", .params = "gqa=mean,block=128",
     .help = "KeyDiff App. F.2: group-mean attention, block-wise prompt processing (block 128); budgets 2K-8K per "
             "KV head"},
};

typedef struct {
    int64_t budget, heavy, recent, block;
    int mode, n_lists, group, d, prefill_budget;
    float scale;
    int32_t aux_bytes;
    kvs_policy_model model;
    /* [n_lists] the caches: ascending positions (at attention time: + the current token), score = accumulated
     * attention; a prefill's candidates are appended to them and compressed in place */
    kvs_held **lists;
    void *work;           /* kvs_attn_colsum_scratch_bytes(work_cap): the prefill column sums' scratch */
    int64_t win_first;    /* positions before it are evicted by the host (sliding-window layer); 0 otherwise */
    int64_t work_cap;
} h2o_state;

static kvs_policy_granularity h2o_layout(const kvs_policy_config *cfg) {
    return (int)kvs_policy_param_get(cfg, "gqa") == H2O_EXPAND ? KVS_SEL_PER_QUERY_HEAD : KVS_SEL_PER_KV_HEAD;
}

static void h2o_free(void *state) {
    h2o_state *s = state;
    if (!s) return;
    if (s->lists)
        for (int i = 0; i < s->n_lists; i++) kvs_held_free(s->lists[i]);
    free(s->lists);
    free(s->work);
    free(s);
}

/* Heavy-hitter share H_h of budget B: floor((1 - recent) B), or B - window - 1 with an absolute window; at most
 * B - 1 (the current token is always recent) and at least 0. */
static int64_t heavy_of(const kvs_policy_config *cfg, int64_t budget) {
    int64_t window = (int64_t)kvs_policy_param_get(cfg, "window");
    int64_t heavy = window > 0 ? budget - 1 - window : (int64_t)((1.0 - kvs_policy_param_get(cfg, "recent")) * (double)budget);
    if (heavy > budget - 1) heavy = budget - 1;
    return heavy < 0 ? 0 : heavy;
}

/* Degenerate setting (kvs_policy_ops.notes): the heavy-hitter share is empty, so the policy is a sliding window. */
static int h2o_notes(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget, char *buf, size_t cap) {
    (void)m;
    if (heavy_of(cfg, budget) > 0) return 0;
    int64_t window = (int64_t)kvs_policy_param_get(cfg, "window");
    if (window > 0)
        return kvs_policy_note(buf, cap, "window=%lld leaves no heavy-hitter slot at this budget (a window)",
                               (long long)window);
    return kvs_policy_note(buf, cap, "recent=%g leaves no heavy-hitter slot at this budget (a window)",
                           kvs_policy_param_get(cfg, "recent"));
}

static kvs_status h2o_create(const kvs_policy_init *init, void **state) {
    h2o_state *s = calloc(1, sizeof *s);
    if (!s) return kvs_fail(KVS_ERR_NOMEM, "h2o: out of memory");
    s->budget = init->budget;
    s->heavy = heavy_of(init->cfg, init->budget);
    s->recent = s->budget - s->heavy;
    s->mode = (int)kvs_policy_param_get(init->cfg, "gqa");
    s->prefill_budget = (int)kvs_policy_param_get(init->cfg, "prefill") == H2O_PREFILL_BUDGET;
    s->block = (int64_t)kvs_policy_param_get(init->cfg, "block");
    s->group = init->model->group;
    s->d = init->model->head_dim;
    s->scale = init->model->scale;
    s->aux_bytes = init->model->aux_bytes;
    s->model = *init->model;
    s->n_lists = s->mode == H2O_EXPAND ? s->group : 1;
    s->lists = calloc((size_t)s->n_lists, sizeof *s->lists);
    if (!s->lists) goto nomem;
    for (int i = 0; i < s->n_lists; i++)
        if (!(s->lists[i] = kvs_held_create(s->budget))) goto nomem;
    *state = s;
    return KVS_OK;
nomem:
    h2o_free(s);
    return kvs_fail(KVS_ERR_NOMEM, "h2o: out of memory");
}

static kvs_status ensure_work(h2o_state *s, int64_t n) {
    if (n <= s->work_cap) return KVS_OK;
    free(s->work);
    s->work = malloc(kvs_attn_colsum_scratch_bytes(n));
    s->work_cap = s->work ? n : 0;
    return s->work ? KVS_OK : kvs_fail(KVS_ERR_NOMEM, "h2o: out of memory");
}

/* Prefill of one list: candidates = kept positions + the new prompt positions (the turn's, or the block's),
 * appended with acc 0; every new prompt query (prefill=budget: among the turn's last B) adds its causal
 * attention over the candidates to acc; then keep heavy TOPK + the last recent-1. */
static kvs_status h2o_prefill_list(h2o_state *s, int li, const kvs_policy_view *view) {
    kvs_held *L = s->lists[li];
    kvs_held_drop_before(L, (int32_t)s->win_first);
    /* views built without chunked prefill in mind leave block_begin 0: the new positions start at the turn */
    int64_t first = view->block_begin > view->turn_begin ? view->block_begin : view->turn_begin;
    if (first < s->win_first) first = s->win_first; /* evicted by the host before the prefill */
    int64_t n_new = view->n > first ? view->n - first : 0;
    int64_t nc = kvs_held_count(L) + n_new;
    if (nc == 0) return KVS_OK;
    if (kvs_held_reserve(L, nc) != KVS_OK) return kvs_fail(KVS_ERR_NOMEM, "h2o: out of memory");
    kvs_status st = ensure_work(s, nc);
    if (st != KVS_OK) return st;
    for (int64_t j = 0; j < n_new; j++) kvs_held_push(L, (int32_t)(first + j));
    /* Every scoring prompt query (causal: the old cache + the prompt up to its position) adds its attention,
     * averaged over the list's query heads (1 in expand mode), row by row in fp64 as observe() does. */
    int64_t q_lo = first;
    if (s->prefill_budget) {
        int64_t prompt_end = view->prompt_end > view->n ? view->prompt_end : view->n;
        if (prompt_end - s->budget > q_lo) q_lo = prompt_end - s->budget;
    }
    if (q_lo < view->n) {
        kvs_attn_src src = {.q = view->q, .q_first = view->q_first, .n_q = view->n_q, .group = s->group, .d = s->d,
                            .scale = s->scale, .keys = view->k, .idx = kvs_held_pos(L), .n_cand = nc};
        kvs_colsum_opts co = {.row_first = q_lo - view->q_first, .n_rows = view->n - q_lo,
                              .head_first = s->mode == H2O_EXPAND ? li : 0,
                              .n_heads = s->mode == H2O_EXPAND ? 1 : s->group, .reduce = KVS_GQA_MEAN, .n_out = nc};
        kvs_policy_colsum(view, &src, &co, NULL, kvs_held_score(L), s->work);
    }
    /* Compress to B-1: the last recent-1 candidates plus the top `heavy` of the older ones by acc in double
     * precision (ties: the older position). */
    int64_t keep = s->budget - 1;
    if (nc <= keep) return KVS_OK;
    int64_t rec = s->recent - 1, old = nc - rec;
    kvs_held_keep_top(L, 0, old, keep - rec);
    return KVS_OK;
}

static kvs_status h2o_prefill(void *state, const kvs_policy_view *view) {
    h2o_state *s = state;
    for (int li = 0; li < s->n_lists; li++) {
        kvs_status st = h2o_prefill_list(s, li, view);
        if (st != KVS_OK) return st;
    }
    return KVS_OK;
}

static kvs_status h2o_select(void *state, const kvs_policy_view *view, kvs_policy_sel *sel) {
    h2o_state *s = state;
    for (int li = 0; li < s->n_lists; li++) {
        kvs_held *L = s->lists[li];
        KVS_ASSERT(kvs_held_count(L) < s->budget);
        kvs_held_push(L, (int32_t)(view->n - 1)); /* acc 0: it receives its own attention */
        sel->n[li] = kvs_held_copy(L, sel->idx[li]);
    }
    return KVS_OK;
}

static kvs_status h2o_observe(void *state, const kvs_policy_view *view, const kvs_policy_sel *sel,
                              const float *const *probs) {
    h2o_state *s = state;
    (void)view;
    for (int li = 0; li < s->n_lists; li++) {
        kvs_held *L = s->lists[li];
        int64_t cnt = kvs_held_count(L);
        KVS_ASSERT(sel->n[li] == cnt);
        if (s->mode == H2O_EXPAND) kvs_held_add(L, probs[li]);
        else kvs_held_add_heads(L, probs, s->group, 1); /* acc += the group mean */
        cnt -= kvs_held_drop_before(L, (int32_t)s->win_first); /* the window's evictions first */
        if (cnt < s->budget) continue;
        /* Evict the lowest acc among the non-recent entries (the newer one on ties); with none (H_h = 0) the
         * oldest, a window. */
        kvs_held_remove(L, kvs_held_lowest(L, 0, cnt - s->recent));
    }
    return KVS_OK;
}

/* Takes effect in the next prefill or observe (the lists stay aligned with this step's selection until then). */
static kvs_status h2o_window_evict(void *state, int64_t first) {
    h2o_state *s = state;
    if (first > s->win_first) s->win_first = first;
    return KVS_OK;
}

static int64_t h2o_prefill_block(void *state) { return ((h2o_state *)state)->block; }

static int64_t h2o_stored(void *state, int g, int32_t *out) {
    h2o_state *s = state;
    return kvs_held_copy(s->lists[s->mode == H2O_EXPAND ? g : 0], out);
}

/* Retention scores (policy.h scores()): the accumulated attention of the entries eviction ranks; the recent window
 * (the last `recent` entries, the current token among them) is kept whatever its score. */
static int h2o_scores(void *state, int g, const int32_t *idx, int64_t n, double *out) {
    h2o_state *s = state;
    const kvs_held *L = s->lists[s->mode == H2O_EXPAND ? g : 0];
    kvs_held_scores_of(L, 0, kvs_held_count(L) - s->recent, idx, n, out);
    return 1;
}

/* Cost model v2 (policy.h kvs_policy_cost): KV resident and read stay the engine's default (every list holds
 * exactly its attended set); one score per attended slot is auxiliary storage and is read with its K/V (the
 * read-modify-write counted once; an unfused scorer reads nothing more). The new token's K/V is the default
 * write; the score updates are not counted as writes. */
static void h2o_account(void *state, const kvs_policy_view *view, const kvs_policy_sel *sel, kvs_policy_cost *out) {
    h2o_state *s = state;
    (void)view;
    double slots = 0;
    for (int li = 0; li < sel->n_lists; li++) slots += (double)sel->n[li];
    double scores = slots * s->aux_bytes;
    out->aux_bytes = scores;
    out->read_aux_bytes = scores;
    out->read_aux_unfused_bytes = scores;
}

const struct kvs_policy_ops kvs_policy_h2o = {
    .version = KVS_POLICY_INTERFACE_VERSION,
    .name = "h2o",
    .summary = "H2O: heavy hitters by accumulated attention + recent window (attend-then-evict)",
    .is_oracle = 0,
    .granularity = KVS_SEL_PER_QUERY_HEAD,
    .budget_scope = KVS_BUDGET_EVERY_STEP,
    .params = h2o_params,
    .n_params = (int)(sizeof h2o_params / sizeof h2o_params[0]),
    .presets = h2o_presets,
    .n_presets = (int)(sizeof h2o_presets / sizeof h2o_presets[0]),
    .layout = h2o_layout,
    .notes = h2o_notes,
    .create = h2o_create,
    .free = h2o_free,
    .prefill = h2o_prefill,
    .select = h2o_select,
    .observe = h2o_observe,
    .stored = h2o_stored,
    .prefill_block = h2o_prefill_block,
    .account = h2o_account,
    .scores = h2o_scores,
    .window_evict = h2o_window_evict,
};
