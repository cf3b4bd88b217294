/* snapkv.c — SnapKV (Li et al., 2024), prompt-only KV compression, as specified in POLICY_SPEC §2.6 B5 and
 * the appendix row "SnapKV (authors' LongBench configs)"; reference FasterDecoding/SnapKV
 * snapkv/monkeypatch/snapkv_utils.py (SnapKVCluster.update_kv).
 *
 * Prefill (per list, see GQA below), with B = the budget of retained context positions:
 *  1. observation window: the last w = min(window, prompt positions of the turn) prompt queries;
 *  2. each window query attends causally to the candidates up to its own position (softmax over them);
 *  3. score[j] = Σ_window α[i][j] over the candidates j outside the window ("prefix");
 *  4. pooled = MAXPOOL(score, kernel) (or AVGPOOL) along the prefix, stride 1, "same" padding;
 *  5. keep TOPK(pooled, B − w) of the prefix plus the w window positions.
 * Decode: nothing is evicted ("retains all generated output tokens"): S_t = the kept prompt + every generated
 * token, the current one included (budget_scope KVS_BUDGET_PROMPT: B bounds the retained prompt only).
 *
 * Ambiguities resolved (what the paper says / what the reference does / what we do):
 *  - Defaults: the paper's LongBench configurations (ablation_c*_w32_k7_maxpool.json; RocketKV §3.3): window
 *    32, kernel 7, max pooling. The SnapKVCluster code defaults (window 64, kernel 5, avgpool) are reachable
 *    through the parameters.
 *  - Budget convention: B counts every retained prompt position, the window included (the reference's
 *    max_capacity_prompt = C keeps C − w + w). The reference skips compression when the prompt is shorter
 *    than C; here "prompt <= B keeps everything" is the same rule.
 *  - B smaller than the window (the reference asserts C > w): the window itself is cut to its last B
 *    positions (no scored prefix is kept). A prompt shorter than the window uses the whole prompt as its
 *    observation window, so everything is "window" and the last B positions are kept.
 *  - GQA: gqa=expand (default) is the original behaviour: the reference applies repeat_kv and selects per
 *    query head, so each query head keeps its own B positions (storage G x, DESIGN.md "GQA layout").
 *    gqa=mean (kvpress; equal ranking to RocketKV's group sum) and gqa=max share one set per KV head, scored
 *    with the group-mean (group-max) of the per-head window scores.
 *  - Average pooling divides by the kernel size at the edges (PyTorch avg_pool1d count_include_pad=True,
 *    POLICY_SPEC §1.4): kvs_avgpool1d_pad. The scoring itself (steps 1-4) is kvs_snapkv_scores.
 *  - Ties (§1.4): the older position wins (kvs_topk breaks ties to the lower index; candidates are in
 *    position order). Max pooling creates plateaus of equal values, so this rule is exercised.
 *  - Multi-turn [SIM-CHOICE, as RocketKV-MT's stage 1 over the history]: a later turn's prefill compresses the
 *    whole retained context (the kept prompt and generated tokens of earlier turns) plus the new prompt,
 *    using the new turn's observation window. Candidates are scored and pooled in cache order (the kept
 *    positions are contiguous in a real compacted cache), and the total retained is again at most B.
 *  - Block mode (block=M > 0; KeyDiff §2.4 Eq. 6 and App. F.2: "average smoothing ... kernel size of 7 and keep
 *    the most recent 32 tokens", blocks of 128): the prompt arrives through the engine's chunked prefill
 *    (prefill_block); each block is one compression as above with the block's last min(window, block) queries
 *    as the observation window over the positions kept so far plus the block, so at most B prompt positions
 *    are held after every block. KeyDiff also evicts during generation (one token at a time); this policy
 *    keeps every generated token (prompt-only), so decode is SnapKV's, not KeyDiff's setup.
 * PyramidKV and Ada-KV (pyramidkv.c, adakv.c) reuse this file's instance (snapkv_internal.h kvs_snapkv_create)
 * with their own parameter tables: they pass the layout and block size explicitly; window, kernel and pool are
 * read by key (every such table has them).
 * Accounting (POLICY_SPEC §3 "SnapKV"): the default — storage and traffic = the attended K/V summed over the
 * lists (B_p + t per list, G lists for expand); no auxiliary state survives the prefill.
 */
#include <stdlib.h>
#include <math.h>
#include <string.h>

#include "../common/kvs_math.h"
#include "../sim/policy_memo.h"
#include "registry.h"
#include "snapkv_internal.h"

enum { SNAP_POOL_MAX = 0, SNAP_POOL_AVG = 1 };

static const kvs_policy_param snapkv_params[] = {
    {.key = "window", .type = KVS_PARAM_INT, .def = 32, .lo = 1, .hi = 1 << 20,
     .help = "observation window: the last W prompt queries score the prefix and the W positions are kept"},
    {.key = "kernel", .type = KVS_PARAM_INT, .def = 7, .lo = 1, .hi = 4095,
     .help = "pooling kernel (odd), stride 1, same padding; 7 in the paper's LongBench configurations"},
    {.key = "pool", .type = KVS_PARAM_ENUM, .def = SNAP_POOL_MAX, .choices = "max|avg",
     .help = "pooling of the window scores: max (paper configs) or avg (SnapKVCluster default)"},
    {.key = "gqa", .type = KVS_PARAM_ENUM, .def = KVS_SNAPKV_EXPAND, .choices = "expand|mean|max",
     .help = "expand: a set per query head (original, G x storage); mean/max: one set per KV head"},
    {.key = "block", .type = KVS_PARAM_INT, .def = 0, .lo = 0, .hi = 1 << 20,
     .help = "M > 0: prompt compressed after every block of M positions (KeyDiff: 128); 0: once, whole prompt"},
};

static const kvs_policy_preset snapkv_presets[] = {
    {.name = "morphkv-longwriter", .params = "window=30,kernel=7,pool=max,gqa=expand",
     .help = "MorphKV §5.1 and Table 7 LongWriter: 600 prompt positions per query head (--budgets 600), window 30, "
             "every generated token kept"},
    {.name = "morphkv-longgenbench", .params = "window=32,kernel=7,pool=max,gqa=expand",
     .help = "MorphKV §5.2 LongGenBench: window 32, capacity 1K per query head (--budgets 1024)"},
    {.name = "morphkv-longbench", .params = "window=32,kernel=7,pool=max,gqa=expand",
     .help = "MorphKV §5.3 LongBench: 1024 prompt positions per query head (--budgets 1024); window 32 as in its "
             "§6.3 LongBench ablation"},
    {.name = "keydiff", .params = "window=32,kernel=7,pool=avg,gqa=mean,block=128",
     .help = "KeyDiff App. F.2: group-mean attention, average smoothing kernel 7, the last 32 kept, blocks of 128; "
             "budgets 2K-8K per KV head (KeyDiff also evicts while generating: not modelled)"},
};

typedef struct {
    int32_t *pos;  /* [cap] ascending positions retained (after prefill: kept context; then + generated) */
    float *score;  /* [cap] aligned with pos: the pooled observation score of a scored position the last
                    * compression kept, INFINITY for one kept whatever its score (the window, generated tokens,
                    * positions no compression has ranked): what scores() reports */
    int64_t cnt, cap;
} snap_list;

typedef struct {
    int64_t budget, block;
    int window, kernel, pool, mode, n_lists, group, d; /* mode: KVS_SNAPKV_EXPAND|MEAN|MAX */
    float scale;
    snap_list *lists; /* [n_lists] */
    /* prefill scratch, capacity scratch_cap candidates */
    int32_t *cidx, *top;
    float *pooled;
    void *work; /* kvs_attn_colsum_scratch_bytes(scratch_cap) */
    char *mark;
    int64_t scratch_cap;
    int64_t win_first; /* positions before it were evicted by the host (sliding-window layer); 0 otherwise */
} snap_state;

/* Sliding-window layers (sim/replay.h): the positions before `first` leave the list (kept prompt positions and
 * generated tokens alike), their scores with them. */
static void snap_drop_before(snap_list *L, int64_t first) {
    int64_t j = 0;
    while (j < L->cnt && L->pos[j] < first) j++;
    if (j == 0) return;
    memmove(L->pos, L->pos + j, (size_t)(L->cnt - j) * sizeof *L->pos);
    memmove(L->score, L->score + j, (size_t)(L->cnt - j) * sizeof *L->score);
    L->cnt -= j;
}

static kvs_policy_granularity snapkv_layout(const kvs_policy_config *cfg) {
    return (int)kvs_policy_param_get(cfg, "gqa") == KVS_SNAPKV_EXPAND ? KVS_SEL_PER_QUERY_HEAD : KVS_SEL_PER_KV_HEAD;
}

static kvs_status snapkv_validate(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget) {
    (void)m;
    (void)budget;
    int64_t k = (int64_t)kvs_policy_param_get(cfg, "kernel");
    if (k % 2 == 0)
        return kvs_fail(KVS_ERR_INVALID_ARG, "policy %s: parameter 'kernel' must be odd (same padding), got %lld",
                        cfg->ops->name, (long long)k);
    return KVS_OK;
}

/* Degenerate settings (kvs_policy_ops.notes); PyramidKV and Ada-KV share them. With the observation window
 * covering the whole first prompt, or the budget no larger than the window, no prefix position is ever
 * scored: the policy keeps the prompt's last B positions, a window, whatever the attention says. */
static int snapkv_notes(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget, char *buf,
                        size_t cap) {
    int64_t w = (int64_t)kvs_policy_param_get(cfg, "window");
    if (m->prompt_len > 0 && w >= m->prompt_len)
        return kvs_policy_note(buf, cap, "window=%lld covers the whole %lld-position first prompt: no position is "
                                         "scored, the prompt's last positions are kept (a window)",
                               (long long)w, (long long)m->prompt_len);
    if (budget <= w)
        return kvs_policy_note(buf, cap, "the budget is at most window=%lld: no position is scored, only the "
                                         "observation window's last positions are kept (a window)",
                               (long long)w);
    return 0;
}

static void snapkv_free(void *state) {
    snap_state *s = state;
    if (!s) return;
    if (s->lists)
        for (int i = 0; i < s->n_lists; i++) free(s->lists[i].pos), free(s->lists[i].score);
    free(s->lists);
    free(s->cidx);
    free(s->top);
    free(s->pooled);
    free(s->work);
    free(s->mark);
    free(s);
}

kvs_status kvs_snapkv_create(const kvs_policy_init *init, int gqa, int64_t block, void **state) {
    snap_state *s = calloc(1, sizeof *s);
    if (!s) return kvs_fail(KVS_ERR_NOMEM, "%s: out of memory", init->cfg->ops->name);
    s->budget = init->budget;
    s->window = (int)kvs_policy_param_get(init->cfg, "window");
    s->kernel = (int)kvs_policy_param_get(init->cfg, "kernel");
    s->pool = (int)kvs_policy_param_get(init->cfg, "pool");
    s->mode = gqa;
    s->block = block;
    s->group = init->model->group;
    s->d = init->model->head_dim;
    s->scale = init->model->scale;
    s->n_lists = s->mode == KVS_SNAPKV_EXPAND ? s->group : 1;
    s->lists = calloc((size_t)s->n_lists, sizeof *s->lists);
    if (!s->lists) {
        snapkv_free(s);
        return kvs_fail(KVS_ERR_NOMEM, "%s: out of memory", init->cfg->ops->name);
    }
    *state = s;
    return KVS_OK;
}

static kvs_status list_reserve(snap_list *L, int64_t need) {
    if (need <= L->cap) return KVS_OK;
    int64_t cap = L->cap ? L->cap : 64;
    while (cap < need) cap *= 2;
    int32_t *p = realloc(L->pos, (size_t)cap * sizeof *p);
    if (!p) return kvs_fail(KVS_ERR_NOMEM, "snapkv: out of memory");
    L->pos = p;
    float *f = realloc(L->score, (size_t)cap * sizeof *f);
    if (!f) return kvs_fail(KVS_ERR_NOMEM, "snapkv: out of memory");
    L->score = f;
    L->cap = cap;
    return KVS_OK;
}

static kvs_status scratch_reserve(snap_state *s, int64_t n) {
    if (n <= s->scratch_cap) return KVS_OK;
    free(s->cidx);
    free(s->top);
    free(s->pooled);
    free(s->work);
    free(s->mark);
    s->cidx = malloc((size_t)n * sizeof(int32_t));
    s->top = malloc((size_t)n * sizeof(int32_t));
    s->pooled = malloc((size_t)n * sizeof(float));
    s->work = malloc(kvs_attn_colsum_scratch_bytes(n));
    s->mark = malloc((size_t)n);
    int ok = s->cidx && s->top && s->pooled && s->work && s->mark;
    s->scratch_cap = ok ? n : 0;
    return ok ? KVS_OK : kvs_fail(KVS_ERR_NOMEM, "snapkv: out of memory");
}

/* Prefill of one list: candidates = the list's retained positions + the new prompt positions (the turn's, or
 * the block's; views built without blocks leave block_begin 0). */
static kvs_status snap_prefill_list(snap_state *s, int li, const kvs_policy_view *view) {
    snap_list *L = &s->lists[li];
    snap_drop_before(L, s->win_first);
    int64_t first = view->block_begin > view->turn_begin ? view->block_begin : view->turn_begin;
    if (first < s->win_first) first = s->win_first; /* evicted by the host before the prefill: no candidate */
    int64_t n_new = view->n > first ? view->n - first : 0, nc = L->cnt + n_new;
    kvs_status st = list_reserve(L, nc);
    if (st == KVS_OK) st = scratch_reserve(s, nc);
    if (st != KVS_OK) return st;
    for (int64_t j = 0; j < n_new; j++) L->pos[L->cnt + j] = (int32_t)(first + j), L->score[L->cnt + j] = INFINITY;
    if (nc <= s->budget) { /* nothing to compress */
        L->cnt = nc;
        return KVS_OK;
    }
    int64_t w = s->window < n_new ? s->window : n_new; /* observation window (new prompt queries) */
    if (s->budget <= w) { /* the window alone fills the budget: keep its last B positions */
        memmove(L->pos, L->pos + nc - s->budget, (size_t)s->budget * sizeof(int32_t));
        for (int64_t j = 0; j < s->budget; j++) L->score[j] = INFINITY;
        L->cnt = s->budget;
        return KVS_OK;
    }
    memcpy(s->cidx, L->pos, (size_t)nc * sizeof(int32_t));
    /* The window queries are the turn's last w prompt positions = the last w candidates; the scored prefix
     * is candidates [0, m). Expand scores list li with its own query head; mean/max reduce the group. */
    kvs_attn_src src = {.q = view->q, .q_first = view->q_first, .n_q = view->n_q, .group = s->group, .d = s->d,
                        .scale = s->scale, .keys = view->k, .idx = s->cidx, .n_cand = nc};
    kvs_snapkv_opts so = {.window = w, .kernel = s->kernel,
                          .pool = s->pool == SNAP_POOL_MAX ? KVS_POOL_MAX : KVS_POOL_AVG,
                          .head_first = s->mode == KVS_SNAPKV_EXPAND ? li : 0,
                          .n_heads = s->mode == KVS_SNAPKV_EXPAND ? 1 : s->group,
                          .reduce = s->mode == KVS_SNAPKV_EXPAND ? KVS_GQA_NONE
                                    : s->mode == KVS_SNAPKV_MEAN ? KVS_GQA_MEAN
                                                                 : KVS_GQA_MAX};
    int64_t m = kvs_policy_snapkv_scores(view, &src, &so, s->pooled, s->work);
    KVS_ASSERT(m == nc - w);
    int64_t k = s->budget - w;
    kvs_topk(s->pooled, (size_t)m, (size_t)k, s->top);
    memset(s->mark, 0, (size_t)m);
    for (int64_t j = 0; j < k; j++) s->mark[s->top[j]] = 1;
    int64_t out = 0;
    for (int64_t j = 0; j < m; j++)
        if (s->mark[j]) L->score[out] = s->pooled[j], L->pos[out++] = s->cidx[j];
    for (int64_t j = m; j < nc; j++) L->score[out] = INFINITY, L->pos[out++] = s->cidx[j];
    L->cnt = out;
    return KVS_OK;
}

static kvs_status snapkv_prefill(void *state, const kvs_policy_view *view) {
    snap_state *s = state;
    for (int li = 0; li < s->n_lists; li++) {
        kvs_status st = snap_prefill_list(s, li, view);
        if (st != KVS_OK) return st;
    }
    return KVS_OK;
}

static kvs_status snapkv_select(void *state, const kvs_policy_view *view, kvs_policy_sel *sel) {
    snap_state *s = state;
    for (int li = 0; li < s->n_lists; li++) {
        snap_list *L = &s->lists[li];
        kvs_status st = list_reserve(L, L->cnt + 1);
        if (st != KVS_OK) return st;
        KVS_ASSERT(L->cnt == 0 || L->pos[L->cnt - 1] < view->n - 1);
        L->score[L->cnt] = INFINITY;
        L->pos[L->cnt++] = (int32_t)(view->n - 1); /* generated tokens are never evicted */
        memcpy(sel->idx[li], L->pos, (size_t)L->cnt * sizeof(int32_t));
        sel->n[li] = L->cnt;
    }
    return KVS_OK;
}

/* Retention scores (policy.h scores()): a kept prompt position's pooled observation score; the observation window
 * and every generated token are kept whatever their scores (INFINITY). S_t is the list, in its order. */
static int snapkv_scores(void *state, int g, const int32_t *idx, int64_t n, double *out) {
    snap_state *s = state;
    const snap_list *L = &s->lists[s->mode == KVS_SNAPKV_EXPAND ? g : 0];
    for (int64_t j = 0, k = 0; j < n; j++) {
        while (k < L->cnt && L->pos[k] < idx[j]) k++; /* both ascending: one merge */
        out[j] = k < L->cnt && L->pos[k] == idx[j] ? (double)L->score[k] : INFINITY;
    }
    return 1;
}

/* The scores() of PyramidKV and Ada-KV, which run this instance. */
int kvs_snapkv_retention(void *state, int g, const int32_t *idx, int64_t n, double *out) {
    return snapkv_scores(state, g, idx, n, out);
}

/* The host's eviction (sim/replay.h "Sliding-window layers"): at once (no observe() needs the list aligned), and
 * for the candidates of a later prefill. With B >= the window the prefill keeps every candidate, so the policy
 * holds exactly the window. */
static kvs_status snapkv_window_evict(void *state, int64_t first) {
    snap_state *s = state;
    if (first <= s->win_first) return KVS_OK;
    s->win_first = first;
    for (int li = 0; li < s->n_lists; li++) snap_drop_before(&s->lists[li], first);
    return KVS_OK;
}

static int64_t snapkv_prefill_block(void *state) { return ((snap_state *)state)->block; }

static int64_t snapkv_stored(void *state, int g, int32_t *out) {
    snap_state *s = state;
    snap_list *L = &s->lists[s->mode == KVS_SNAPKV_EXPAND ? g : 0];
    if (L->cnt > 0) memcpy(out, L->pos, (size_t)L->cnt * sizeof(int32_t)); /* pos may be NULL before the first block */
    return L->cnt;
}

static kvs_status snapkv_create(const kvs_policy_init *init, void **state) {
    return kvs_snapkv_create(init, (int)kvs_policy_param_get(init->cfg, "gqa"),
                             (int64_t)kvs_policy_param_get(init->cfg, "block"), state);
}

const struct kvs_policy_ops kvs_policy_snapkv = {
    .version = KVS_POLICY_INTERFACE_VERSION,
    .name = "snapkv",
    .summary = "SnapKV: prompt compressed once by pooled observation-window attention; generated tokens all kept",
    .is_oracle = 0,
    .granularity = KVS_SEL_PER_QUERY_HEAD,
    .budget_scope = KVS_BUDGET_PROMPT,
    .params = snapkv_params,
    .n_params = (int)(sizeof snapkv_params / sizeof snapkv_params[0]),
    .presets = snapkv_presets,
    .n_presets = (int)(sizeof snapkv_presets / sizeof snapkv_presets[0]),
    .layout = snapkv_layout,
    .validate = snapkv_validate,
    .notes = snapkv_notes,
    .create = snapkv_create,
    .free = snapkv_free,
    .prefill = snapkv_prefill,
    .select = snapkv_select,
    .stored = snapkv_stored,
    .scores = snapkv_scores,
    .prefill_block = snapkv_prefill_block,
    .window_evict = snapkv_window_evict,
};
