/* scissorhands.c — Scissorhands (Liu et al., NeurIPS'23, "Exploiting the Persistence of Importance Hypothesis
 * for LLM KV Cache Compression at Test Time"), as POLICY_SPEC §2.6 B6 describes it: a fixed budget B; when the
 * cache is full, drop the tokens that were most often UNIMPORTANT (attention below a threshold) over a history
 * window of recent attention rows, the most recent tokens protected. None of the five papers specifies it
 * (POLICY_SPEC §8.6): this is a PARAMETRIC baseline, "configuration not from the five papers"; MorphKV's
 * description (a recent window only) conflicts with the original algorithm and is not followed.
 *
 * State per cache: the resident positions; for each, a ring of `history` flags (1 = unimportant at that
 * observation) and their count. An observation is one attention row: a prompt query in prefill, the current
 * query at a decode step. Unimportant at an observation: attention a_j < threshold / |attended set| (below
 * threshold x the uniform average, the original's "lower than average" criterion).
 * Decode (attend-then-evict, the kvsim budget convention): S_t = the cache (<= B−1) + the current token;
 * after attention every entry records its flag; if |S_t| = B, compress: keep the last `recent` entries plus
 * the entries with the LOWEST unimportance counts among the older ones, down to B − drop entries (drop > 1
 * amortises compressions as the original's "drop m tokens at a time").
 * Prefill: the last min(history, prompt) prompt queries are the observations (causal rows over the retained
 * cache + the prompt); if more than B−1 candidates remain, compress the same way. Multi-turn: a later prompt
 * is appended to the retained cache and compressed the same way.
 *
 * Ambiguities resolved [SIM-CHOICE] (the paper's hyper-parameters are not in POLICY_SPEC; our defaults):
 *  - history = 32 observations, recent = 8 protected positions, drop = 1 (so every policy is compared at a
 *    full attended set of B each step; larger drops trade fidelity for fewer compressions), threshold = 1.
 *  - An entry that was not visible to an observation (future prompt position in prefill, or not yet arrived)
 *    gets no flag for it: new tokens start with count 0 and are kept over older, persistently unimportant ones.
 *  - Ties in the count: the older token is kept (§1.4), i.e. the newer one with an equal count is dropped.
 *  - recent is capped at the target size B − drop; drop is capped at B (B = 1 keeps only the current token).
 *  - GQA: gqa=expand (default: the original is per attention head, like H2O here) keeps a cache per query head
 *    (storage G x); gqa=mean shares one cache per KV head, flags from the group-mean attention.
 * Sliding-window layers (sim/replay.h): the host's window_evict names the first position the next step can attend;
 * the entries before it leave the list with their flag rings and counts at the start of a prefill, or in observe
 * after this step's flags are recorded and before the compression (the list stays aligned with the step's
 * selection until then), and a prefill takes no candidate before it. The compression then ranks only the window's
 * positions, so Scissorhands never spends a drop on a position the window drops anyway, and B >= the window W holds
 * exactly the window (W − 1 entries between steps never reach B). The observation counter is the stream's: the
 * rings' slots do not move.
 * Storage: K/V of the attended slots + per slot one fp32-sized counter (aux_bytes) and history/8 bytes of
 * flags; traffic: the attended K/V + the counters (read-modify-write counted once).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../common/kvs_math.h"
#include "../sim/policy_memo.h"
#include "held.h"
#include "registry.h"

enum { SH_EXPAND = 0, SH_MEAN = 1 };

static const kvs_policy_param scissorhands_params[] = {
    {.key = "history", .type = KVS_PARAM_INT, .def = 32, .lo = 1, .hi = 1 << 16,
     .help = "importance history window: attention rows over which unimportance is counted"},
    {.key = "recent", .type = KVS_PARAM_INT, .def = 8, .lo = 0, .hi = 1 << 20,
     .help = "most recent positions never dropped"},
    {.key = "drop", .type = KVS_PARAM_INT, .def = 1, .lo = 1, .hi = 1 << 20,
     .help = "positions dropped per compression (the cache then refills to B)"},
    {.key = "threshold", .type = KVS_PARAM_DOUBLE, .def = 1.0, .lo = 0.0, .hi = 1e6,
     .help = "unimportant when attention < threshold / |attended set| (1 = below the average)"},
    {.key = "gqa", .type = KVS_PARAM_ENUM, .def = SH_EXPAND, .choices = "expand|mean",
     .help = "expand: a cache per query head (G x storage); mean: one per KV head, group-mean attention"},
};

/* One cache. The held list's score of an entry is MINUS its unimportance count (the flags set in its ring), so
 * that keeping the best scores keeps the least often unimportant entries, the older among equals. */
typedef struct {
    kvs_held *held; /* ascending resident positions; score = -(unimportant flags set in the ring) */
    uint8_t *ring;  /* [cap][history] flags, aligned with the held entries; slot = observation index mod history */
    int64_t cap;    /* entries the ring has room for */
} sh_list;

typedef struct {
    int64_t budget, target, recent;
    int history, mode, n_lists, group, d;
    double threshold;
    float scale;
    int32_t aux_bytes;
    kvs_policy_model model;
    int64_t obs;      /* observations so far (same for every list) */
    int64_t win_first; /* positions before it were evicted by the host (sliding-window layer); 0 otherwise */
    sh_list *lists;   /* [n_lists] */
    /* scratch */
    void *work;       /* kvs_attn_colsum_scratch_bytes(scratch_cap) */
    double *avg;
    char *keep;
    int64_t scratch_cap;
} sh_state;

static kvs_policy_granularity sh_layout(const kvs_policy_config *cfg) {
    return (int)kvs_policy_param_get(cfg, "gqa") == SH_EXPAND ? KVS_SEL_PER_QUERY_HEAD : KVS_SEL_PER_KV_HEAD;
}

static void sh_free(void *state) {
    sh_state *s = state;
    if (!s) return;
    if (s->lists)
        for (int i = 0; i < s->n_lists; i++) {
            kvs_held_free(s->lists[i].held);
            free(s->lists[i].ring);
        }
    free(s->lists);
    free(s->work);
    free(s->avg);
    free(s->keep);
    free(s);
}

/* Degenerate setting (kvs_policy_ops.notes): when the protected recent positions fill the compression
 * target B - drop, the only candidates for dropping are the oldest entries, whatever their importance. */
static int sh_notes(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget, char *buf, size_t cap) {
    (void)m;
    int64_t recent = (int64_t)kvs_policy_param_get(cfg, "recent"), drop = (int64_t)kvs_policy_param_get(cfg, "drop");
    if (recent >= budget - drop)
        return kvs_policy_note(buf, cap, "recent=%lld protects every position the budget keeps after dropping "
                                         "drop=%lld: the oldest are always dropped, importance is never used (a window)",
                               (long long)recent, (long long)drop);
    return 0;
}

static kvs_status sh_create(const kvs_policy_init *init, void **state) {
    sh_state *s = calloc(1, sizeof *s);
    if (!s) return kvs_fail(KVS_ERR_NOMEM, "scissorhands: out of memory");
    s->budget = init->budget;
    int64_t drop = (int64_t)kvs_policy_param_get(init->cfg, "drop");
    if (drop > s->budget) drop = s->budget;
    s->target = s->budget - drop;
    s->recent = (int64_t)kvs_policy_param_get(init->cfg, "recent");
    if (s->recent > s->target) s->recent = s->target;
    s->history = (int)kvs_policy_param_get(init->cfg, "history");
    s->threshold = kvs_policy_param_get(init->cfg, "threshold");
    s->mode = (int)kvs_policy_param_get(init->cfg, "gqa");
    s->group = init->model->group;
    s->d = init->model->head_dim;
    s->scale = init->model->scale;
    s->aux_bytes = init->model->aux_bytes;
    s->model = *init->model;
    s->n_lists = s->mode == SH_EXPAND ? s->group : 1;
    s->lists = calloc((size_t)s->n_lists, sizeof *s->lists);
    int ok = s->lists != NULL;
    for (int i = 0; ok && i < s->n_lists; i++) ok = (s->lists[i].held = kvs_held_create(16)) != NULL;
    if (!ok) {
        sh_free(s);
        return kvs_fail(KVS_ERR_NOMEM, "scissorhands: out of memory");
    }
    *state = s;
    return KVS_OK;
}

static kvs_status list_reserve(sh_state *s, sh_list *L, int64_t need) {
    if (need <= L->cap) return KVS_OK;
    int64_t cap = L->cap ? L->cap : 16;
    while (cap < need) cap *= 2;
    uint8_t *ring = realloc(L->ring, (size_t)cap * (size_t)s->history);
    if (ring) L->ring = ring;
    if (!ring || kvs_held_reserve(L->held, cap) != KVS_OK) return kvs_fail(KVS_ERR_NOMEM, "scissorhands: out of memory");
    L->cap = cap;
    return KVS_OK;
}

static kvs_status scratch_reserve(sh_state *s, int64_t n) {
    if (n <= s->scratch_cap) return KVS_OK;
    free(s->work);
    free(s->avg);
    free(s->keep);
    s->work = malloc(kvs_attn_colsum_scratch_bytes(n));
    s->avg = malloc((size_t)n * sizeof(double));
    s->keep = malloc((size_t)n);
    int ok = s->work && s->avg && s->keep;
    s->scratch_cap = ok ? n : 0;
    return ok ? KVS_OK : kvs_fail(KVS_ERR_NOMEM, "scissorhands: out of memory");
}

/* Appends position p with an empty history (count 0). */
static void list_push(sh_state *s, sh_list *L, int32_t p) {
    memset(L->ring + (size_t)kvs_held_count(L->held) * (size_t)s->history, 0, (size_t)s->history);
    kvs_held_push(L->held, p);
}

/* Drops the entries before s->win_first (the host's window evictions), their flag rings with them. */
static void drop_before(sh_state *s, sh_list *L) {
    int64_t n = kvs_held_count(L->held), k = 0;
    const int32_t *pos = kvs_held_pos(L->held);
    while (k < n && pos[k] < s->win_first) k++;
    if (k == 0) return;
    memmove(L->ring, L->ring + (size_t)k * (size_t)s->history, (size_t)(n - k) * (size_t)s->history);
    kvs_held_drop_before(L->held, (int32_t)s->win_first);
}

/* Records observation s->obs for list L: entries [0, visible) saw attention a[0..visible); the others were
 * not visible (flag 0). The caller advances s->obs once every list has recorded it. The flag leaving the ring
 * slot and the one entering it change the count (whole numbers, exact in the fp64 score). */
static void record(sh_state *s, sh_list *L, const double *a, int64_t visible) {
    size_t slot = (size_t)(s->obs % s->history);
    double thr = s->threshold / (double)visible, *score = kvs_held_score(L->held);
    for (int64_t j = 0; j < kvs_held_count(L->held); j++) {
        uint8_t *r = L->ring + (size_t)j * (size_t)s->history + slot;
        uint8_t f = j < visible && a[j] < thr;
        score[j] -= (double)((int32_t)f - (int32_t)*r);
        *r = f;
    }
}

/* Compresses L to s->target entries: the last `recent` plus the older ones with the lowest counts (the highest
 * scores; equal counts: the older entry is kept, the newer dropped). */
static void compress(sh_state *s, sh_list *L) {
    int64_t n = kvs_held_count(L->held);
    if (n <= s->target) return;
    int64_t rec = s->recent, old = n - rec, want = s->target - rec;
    kvs_held_mark_top(L->held, 0, old, want, s->keep);
    int64_t w = 0;
    for (int64_t j = 0; j < n; j++) {
        if (!s->keep[j]) continue;
        if (w != j)
            memcpy(L->ring + (size_t)w * (size_t)s->history, L->ring + (size_t)j * (size_t)s->history,
                   (size_t)s->history);
        w++;
    }
    kvs_held_compact(L->held, s->keep);
}

static kvs_status sh_prefill(void *state, const kvs_policy_view *view) {
    sh_state *s = state;
    int64_t begin = view->turn_begin > s->win_first ? view->turn_begin : s->win_first; /* no candidate before it */
    int64_t n_new = view->n > begin ? view->n - begin : 0;
    for (int li = 0; li < s->n_lists; li++) {
        drop_before(s, &s->lists[li]);
        int64_t need = kvs_held_count(s->lists[li].held) + n_new;
        kvs_status st = list_reserve(s, &s->lists[li], need);
        if (st == KVS_OK) st = scratch_reserve(s, need);
        if (st != KVS_OK) return st;
        for (int64_t j = 0; j < n_new; j++) list_push(s, &s->lists[li], (int32_t)(begin + j));
    }
    /* Observations: the last min(history, n_new) prompt queries (earlier rows would leave the ring anyway). */
    int64_t rows = n_new < s->history ? n_new : s->history;
    for (int64_t i = n_new - rows; i < n_new; i++) {
        int64_t p = begin + i;
        for (int li = 0; li < s->n_lists; li++) {
            sh_list *L = &s->lists[li];
            int64_t n = kvs_held_count(L->held), visible = n - n_new + i + 1; /* the retained cache + prompt <= p */
            /* One observation = one row's attention averaged over the list's heads (1 in expand mode), in
             * fp64 as sh_observe() averages a decode step. */
            kvs_attn_src src = {.q = view->q, .q_first = view->q_first, .n_q = view->n_q, .group = s->group,
                                .d = s->d, .scale = s->scale, .keys = view->k, .idx = kvs_held_pos(L->held), .n_cand = n};
            kvs_colsum_opts co = {.row_first = p - view->q_first, .n_rows = 1,
                                  .head_first = s->mode == SH_EXPAND ? li : 0,
                                  .n_heads = s->mode == SH_EXPAND ? 1 : s->group, .reduce = KVS_GQA_MEAN,
                                  .n_out = visible};
            for (int64_t j = 0; j < visible; j++) s->avg[j] = 0;
            kvs_policy_colsum(view, &src, &co, NULL, s->avg, s->work);
            record(s, L, s->avg, visible);
        }
        s->obs++;
    }
    for (int li = 0; li < s->n_lists; li++)
        if (kvs_held_count(s->lists[li].held) > s->budget - 1) compress(s, &s->lists[li]);
    return KVS_OK;
}

static kvs_status sh_select(void *state, const kvs_policy_view *view, kvs_policy_sel *sel) {
    sh_state *s = state;
    for (int li = 0; li < s->n_lists; li++) {
        sh_list *L = &s->lists[li];
        int64_t n = kvs_held_count(L->held);
        KVS_ASSERT(n < s->budget);
        kvs_status st = list_reserve(s, L, n + 1);
        if (st == KVS_OK) st = scratch_reserve(s, n + 1);
        if (st != KVS_OK) return st;
        list_push(s, L, (int32_t)(view->n - 1));
        sel->n[li] = kvs_held_copy(L->held, sel->idx[li]);
    }
    return KVS_OK;
}

static kvs_status sh_observe(void *state, const kvs_policy_view *view, const kvs_policy_sel *sel,
                             const float *const *probs) {
    sh_state *s = state;
    (void)view;
    for (int li = 0; li < s->n_lists; li++) {
        sh_list *L = &s->lists[li];
        int64_t n = kvs_held_count(L->held);
        KVS_ASSERT(sel->n[li] == n);
        if (s->mode == SH_EXPAND) {
            for (int64_t j = 0; j < n; j++) s->avg[j] = probs[li][j];
        } else { /* the group mean */
            memset(s->avg, 0, (size_t)n * sizeof *s->avg);
            kvs_heads_add(probs, (size_t)s->group, (size_t)n, 1, s->avg);
        }
        record(s, L, s->avg, n);
        drop_before(s, L); /* the window's evictions first */
        if (kvs_held_count(L->held) >= s->budget) compress(s, L);
    }
    s->obs++;
    return KVS_OK;
}

/* Takes effect in the next prefill or observe (the lists stay aligned with this step's selection until then). */
static kvs_status sh_window_evict(void *state, int64_t first) {
    sh_state *s = state;
    if (first > s->win_first) s->win_first = first;
    return KVS_OK;
}

static int64_t sh_stored(void *state, int g, int32_t *out) {
    sh_state *s = state;
    return kvs_held_copy(s->lists[s->mode == SH_EXPAND ? g : 0].held, out);
}

/* Retention scores (policy.h scores()): minus the unimportance count of the entries compression ranks; the recent
 * window (the last `recent` entries) is kept whatever its count. */
static int sh_scores(void *state, int g, const int32_t *idx, int64_t n, double *out) {
    sh_state *s = state;
    const kvs_held *L = s->lists[s->mode == SH_EXPAND ? g : 0].held;
    kvs_held_scores_of(L, 0, kvs_held_count(L) - s->recent, idx, n, out);
    return 1;
}

/* Cost model v2 (policy.h kvs_policy_cost): KV resident and read stay the engine's default (every list holds
 * exactly its attended set); per slot one counter (aux_bytes) and history/8 bytes of flags are auxiliary
 * storage, and the counters are read with the attended K/V (read-modify-write counted once; the flags are
 * touched only at a compression). No extra writes are counted beyond the new token's K/V. */
static void sh_account(void *state, const kvs_policy_view *view, const kvs_policy_sel *sel, kvs_policy_cost *out) {
    sh_state *s = state;
    (void)view;
    double slots = 0;
    for (int li = 0; li < sel->n_lists; li++) slots += (double)sel->n[li];
    double counters = slots * (double)s->aux_bytes, flags = slots * (double)((s->history + 7) / 8);
    out->aux_bytes = counters + flags;
    out->read_aux_bytes = counters;
    out->read_aux_unfused_bytes = counters;
}

const struct kvs_policy_ops kvs_policy_scissorhands = {
    .version = KVS_POLICY_INTERFACE_VERSION,
    .name = "scissorhands",
    .summary = "Scissorhands: drop the most often unimportant tokens over a history window (parametric, "
               "configuration not from the five papers)",
    .is_oracle = 0,
    .granularity = KVS_SEL_PER_QUERY_HEAD,
    .budget_scope = KVS_BUDGET_EVERY_STEP,
    .params = scissorhands_params,
    .n_params = (int)(sizeof scissorhands_params / sizeof scissorhands_params[0]),
    .layout = sh_layout,
    .notes = sh_notes,
    .create = sh_create,
    .free = sh_free,
    .prefill = sh_prefill,
    .select = sh_select,
    .observe = sh_observe,
    .stored = sh_stored,
    .scores = sh_scores,
    .account = sh_account,
    .window_evict = sh_window_evict,
};
