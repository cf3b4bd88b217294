/* chunkkv.c — ChunkKV (Liu et al., "ChunkKV: Semantic-Preserving KV Cache Compression for Efficient Long-Context
 * LLM Inference", arXiv 2502.00299), as specified in ../shared/POLICY_SPEC_2.md §2.3 [CK]: kvpress ChunkKVPress
 * wrapping SnapKVPress is the executable reference (REF); the paper's mode (PAPER) is the spec's reading of the
 * abstract.
 *
 * Prefill (the prompt of a turn; candidates = what earlier turns kept + the new prompt, in cache order):
 *  1. token scores as kvpress SnapKV: the last w = min(window, new prompt) queries attend causally over the
 *     candidates; per query head the window's attention to each prefix candidate, pooled along the prefix
 *     (kernel 5, average with zero padding), averaged over the GQA group: σ_kv;
 *  2. scope=layer (default, kvpress): one chunk set per layer, scored with σ = Σ_{KV heads} σ_kv (decided in
 *     layer_sync, so every KV head of the layer keeps the same positions); scope=head: each KV head alone;
 *  3. chunks of c consecutive candidates are kept or dropped whole (kvs_chunkkv_select):
 *     PAPER: chunks tile the prefix; keep ⌊(B − w)/c⌋ chunks by their sum (a partial last chunk: mean × c) plus
 *     the window; the budget left over (< c) stays unused and the run's measured memory shows it;
 *     REF: chunks tile every candidate, the window's scoring max(σ_kv) + 1 (the max over the layer's KV heads);
 *     a chunk scores its mean; keep max(1, ⌊B/c⌋) chunks.
 * Decode: nothing is evicted (PROMPT-ONLY: B bounds the retained prompt; every generated token kept).
 *
 * Decisions (§2.3 Δ-REF):
 *  - chunk 10 (PAPER) by default, 20 in the `ref` preset with select=ref; window 64, kernel 5, average pooling
 *    (SnapKVPress) in both;
 *  - REF's budget: kvpress keeps max(1, int(⌈P/c⌉(1 − cr))) chunks of a compression ratio cr; kvsim's budget B is
 *    a count of positions, so REF keeps ⌊B/c⌋ chunks (whole chunks only: the tokens kept may be fewer than B,
 *    never more); with B < c, the last B positions (the window's end);
 *  - the spec's σ = mean over the window rows, pooled, then averaged over the group, is computed here as the
 *    window SUM pooled after the group mean (kvs_snapkv_scores): average pooling and the group mean are linear,
 *    so σ differs by the constant factor w for every head and position: the same chunk ranking;
 *  - layer-wise index reuse (the paper's reuse experiments: one layer's kept indices serve the next N − 1 layers)
 *    is not replayed: an instance is one (layer, KV head) stream and the engine has no cross-layer channel after
 *    the allocation pass, which sees only the first turn. Its claim (CH2: the scoring saved is (1 − 1/N) of the
 *    per-layer scoring cost) is arithmetic; the replay's result would equal no reuse for the reusing group's first
 *    layer and differ for the others;
 *  - B <= w (PAPER): the window's last B positions are kept (SnapKV's rule; nothing is scored);
 *  - multi-turn (§0.3 [SIM-CHOICE]): a later turn compresses the retained context plus its prompt with its own
 *    window, the chunk grid over cache order.
 * Sliding-window layers (sim/replay.h): the host's window_evict drops the held positions before the window's first
 * at once (prompt-only: no observe() needs the list aligned), on every KV head of the layer alike (scope=layer's
 * invariant holds); a prefill takes no candidate before it. A chunk is a decision, not an entity that outlives it:
 * a kept chunk straddling the window's edge loses its older part and keeps the rest, and a later turn's grid tiles
 * the candidates the window leaves, starting at its oldest. ChunkKV evicts only in prefill, after the window's
 * evictions, so it never spends a chunk on a position the window drops, and B >= the window keeps all of it.
 * Accounting: the default (the attended K/V = B_p + t slots per KV head); the window attention and the token
 * scores are prefill temporaries.
 */
#include <stdlib.h>
#include <string.h>

#include "../common/kvs_math.h"
#include "../sim/policy_memo.h"
#include "chunkkv_internal.h"
#include "held.h"
#include "registry.h"

enum { CK_LAYER = 0, CK_HEAD = 1 };
enum { CK_POOL_AVG = 0, CK_POOL_MAX = 1 };

static const kvs_policy_param chunkkv_params[] = {
    {.key = "chunk", .type = KVS_PARAM_INT, .def = 10, .lo = 1, .hi = 1 << 20,
     .help = "chunk length c in tokens (paper 10; kvpress 20)"},
    {.key = "window", .type = KVS_PARAM_INT, .def = 64, .lo = 1, .hi = 1 << 20,
     .help = "observation window: the last W prompt queries score the tokens (SnapKVPress 64)"},
    {.key = "kernel", .type = KVS_PARAM_INT, .def = 5, .lo = 1, .hi = 4095,
     .help = "pooling kernel of the token scores (odd), stride 1, same padding"},
    {.key = "pool", .type = KVS_PARAM_ENUM, .def = CK_POOL_AVG, .choices = "avg|max",
     .help = "pooling of the token scores: avg with zero padding (SnapKVPress) or max"},
    {.key = "select", .type = KVS_PARAM_ENUM, .def = KVS_CHUNKKV_PAPER, .choices = "paper|ref",
     .help = "paper: chunks over the prefix, floor((B-w)/c) of them + the window; ref: kvpress (window forced, "
             "chunks over everything, mean score, floor(B/c) chunks)"},
    {.key = "scope", .type = KVS_PARAM_ENUM, .def = CK_LAYER, .choices = "layer|head",
     .help = "layer: one chunk set per layer, scores summed over KV heads (kvpress); head: per KV head"},
};

static const kvs_policy_preset chunkkv_presets[] = {
    {.name = "ref", .params = "chunk=20,window=64,kernel=5,pool=avg,select=ref,scope=layer",
     .help = "kvpress evaluation registry ChunkKVPress(SnapKVPress(), chunk_length=20); the budget B maps to "
             "floor(B/20) chunks"},
};

typedef struct {
    int64_t budget, chunk, window;
    int kernel, pool, select, scope, group, d;
    float scale;
    kvs_held *held;   /* ascending positions: after prefill the kept context, then + every generated token */
    int64_t pend_m;   /* candidates scored (the prefix) awaiting layer_sync's decision; -1 = none pending */
    int64_t cap;
    double *sigma;    /* [cap] σ_kv of the prefix (layer_sync reads every head's) */
    double *csum;     /* [cap] chunk scores */
    float *pooled;    /* [cap] */
    int32_t *top;     /* [cap] */
    char *mark;       /* [cap] */
    void *work;       /* kvs_attn_colsum_scratch_bytes(cap) */
    int64_t win_first; /* positions before it were evicted by the host (sliding-window layer); 0 otherwise */
} ck_state;

static void chunkkv_free(void *state) {
    ck_state *s = state;
    if (!s) return;
    kvs_held_free(s->held);
    free(s->sigma);
    free(s->csum);
    free(s->pooled);
    free(s->top);
    free(s->mark);
    free(s->work);
    free(s);
}

static kvs_status chunkkv_create(const kvs_policy_init *init, void **state) {
    ck_state *s = calloc(1, sizeof *s);
    if (!s) return kvs_fail(KVS_ERR_NOMEM, "chunkkv: out of memory");
    s->budget = init->budget;
    s->chunk = (int64_t)kvs_policy_param_get(init->cfg, "chunk");
    s->window = (int64_t)kvs_policy_param_get(init->cfg, "window");
    s->kernel = (int)kvs_policy_param_get(init->cfg, "kernel");
    s->pool = (int)kvs_policy_param_get(init->cfg, "pool");
    s->select = (int)kvs_policy_param_get(init->cfg, "select");
    s->scope = (int)kvs_policy_param_get(init->cfg, "scope");
    s->group = init->model->group;
    s->d = init->model->head_dim;
    s->scale = init->model->scale;
    s->pend_m = -1;
    s->held = kvs_held_create(s->budget + 1);
    if (!s->held) {
        chunkkv_free(s);
        return kvs_fail(KVS_ERR_NOMEM, "chunkkv: out of memory");
    }
    *state = s;
    return KVS_OK;
}

static kvs_status scratch_reserve(ck_state *s, int64_t n) {
    if (n <= s->cap) return KVS_OK;
    free(s->sigma);
    free(s->csum);
    free(s->pooled);
    free(s->top);
    free(s->mark);
    free(s->work);
    s->sigma = malloc((size_t)n * sizeof(double));
    s->csum = malloc((size_t)n * sizeof(double));
    s->pooled = malloc((size_t)n * sizeof(float));
    s->top = malloc((size_t)n * sizeof(int32_t));
    s->mark = malloc((size_t)n);
    s->work = malloc(kvs_attn_colsum_scratch_bytes(n));
    int ok = s->sigma && s->csum && s->pooled && s->top && s->mark && s->work;
    s->cap = ok ? n : 0;
    return ok ? KVS_OK : kvs_fail(KVS_ERR_NOMEM, "chunkkv: out of memory");
}

int64_t kvs_chunkkv_select(const double *sigma, int64_t m, int64_t n, int64_t c, int64_t budget, int mode,
                           double window_score, char *keep, int32_t *scratch, double *chunk_score) {
    memset(keep, 0, (size_t)n);
    int64_t span = mode == KVS_CHUNKKV_PAPER ? m : n; /* what the chunk grid tiles */
    int64_t n_chunks = (span + c - 1) / c;
    int64_t k = mode == KVS_CHUNKKV_PAPER ? (budget - (n - m)) / c : budget / c;
    if (mode == KVS_CHUNKKV_REF && k < 1) { /* B < c: no whole chunk fits; the last B candidates */
        for (int64_t j = n - budget; j < n; j++) keep[j] = 1;
        return budget;
    }
    for (int64_t ci = 0; ci < n_chunks; ci++) {
        int64_t a = ci * c, b = a + c < span ? a + c : span;
        double sum = 0;
        for (int64_t j = a; j < b; j++) sum += j < m ? sigma[j] : window_score;
        chunk_score[ci] = mode == KVS_CHUNKKV_PAPER ? (b - a == c ? sum : sum / (double)(b - a) * (double)c)
                                                    : sum / (double)(b - a);
    }
    int64_t kept = 0;
    if (k > n_chunks) k = n_chunks;
    if (k > 0) kvs_topk_f64_set(chunk_score, (size_t)n_chunks, (size_t)k, scratch);
    for (int64_t t = 0; t < k; t++) {
        int64_t a = (int64_t)scratch[t] * c, b = a + c < span ? a + c : span;
        for (int64_t j = a; j < b; j++) keep[j] = 1, kept++;
    }
    if (mode == KVS_CHUNKKV_PAPER)
        for (int64_t j = m; j < n; j++) keep[j] = 1, kept++;
    return kept;
}

/* σ_kv of this head over the prefix of nc candidates with a window of w: into s->sigma[0..m), @return m. */
static int64_t token_scores(ck_state *s, const kvs_policy_view *view, int64_t nc, int64_t w) {
    kvs_attn_src src = {.q = view->q, .q_first = view->q_first, .n_q = view->n_q, .group = s->group, .d = s->d,
                        .scale = s->scale, .keys = view->k, .idx = kvs_held_pos(s->held), .n_cand = nc};
    kvs_snapkv_opts so = {.window = w, .kernel = s->kernel, .pool = s->pool == CK_POOL_MAX ? KVS_POOL_MAX : KVS_POOL_AVG,
                          .head_first = 0, .n_heads = s->group, .reduce = KVS_GQA_MEAN};
    int64_t m = kvs_policy_snapkv_scores(view, &src, &so, s->pooled, s->work);
    KVS_ASSERT(m == nc - w);
    for (int64_t j = 0; j < m; j++) s->sigma[j] = (double)s->pooled[j];
    return m;
}

static double max_of(const double *x, int64_t n) {
    double mx = 0;
    for (int64_t j = 0; j < n; j++)
        if (j == 0 || x[j] > mx) mx = x[j];
    return mx;
}

/* Applies the chunk decision over the held candidates with the score `sigma` (prefix m). */
static void decide(ck_state *s, const double *sigma, int64_t m, double window_score) {
    int64_t n = kvs_held_count(s->held);
    kvs_chunkkv_select(sigma, m, n, s->chunk, s->budget, s->select, window_score, s->mark, s->top, s->csum);
    kvs_held_compact(s->held, s->mark);
}

static kvs_status chunkkv_prefill(void *state, const kvs_policy_view *view) {
    ck_state *s = state;
    int64_t first = view->block_begin > view->turn_begin ? view->block_begin : view->turn_begin;
    if (first < s->win_first) first = s->win_first; /* evicted by the host before the prefill: no candidate */
    int64_t n_new = view->n > first ? view->n - first : 0, nc = kvs_held_count(s->held) + n_new;
    s->pend_m = -1;
    if (kvs_held_reserve(s->held, nc + 1) != KVS_OK) return kvs_fail(KVS_ERR_NOMEM, "chunkkv: out of memory");
    for (int64_t j = 0; j < n_new; j++) kvs_held_push(s->held, (int32_t)(first + j));
    if (nc <= s->budget) return KVS_OK;
    int64_t w = s->window < n_new ? s->window : n_new;
    if (s->select == KVS_CHUNKKV_PAPER && s->budget <= w) { /* the window alone fills the budget */
        kvs_held_keep_top(s->held, 0, nc - s->budget, 0);
        return KVS_OK;
    }
    kvs_status st = scratch_reserve(s, nc);
    if (st != KVS_OK) return st;
    int64_t m = token_scores(s, view, nc, w);
    if (s->scope == CK_HEAD)
        decide(s, s->sigma, m, max_of(s->sigma, m) + 1.0);
    else
        s->pend_m = m; /* layer_sync sums the layer's heads and decides for all of them */
    return KVS_OK;
}

/* scope=layer: σ = Σ_heads σ_kv; REF's window score is the layer's max σ_kv + 1 on every head, so its sum is
 * n_kv_heads x (max + 1). Every head holds the same candidates (an invariant of layer scope). */
static kvs_status chunkkv_layer_sync(void *const *states, int n_kv_heads, kvs_policy_sync_phase phase) {
    ck_state *s0 = states[0];
    if (phase != KVS_SYNC_PREFILL || s0->scope != CK_LAYER || s0->pend_m < 0) return KVS_OK;
    int64_t m = s0->pend_m;
    double *sum = calloc((size_t)(m > 0 ? m : 1), sizeof(double));
    if (!sum) return kvs_fail(KVS_ERR_NOMEM, "chunkkv: out of memory");
    double mx = 0;
    for (int h = 0; h < n_kv_heads; h++) {
        ck_state *s = states[h];
        KVS_ASSERT(s->pend_m == m && kvs_held_count(s->held) == kvs_held_count(s0->held));
        for (int64_t j = 0; j < m; j++) sum[j] += s->sigma[j];
        double hm = max_of(s->sigma, m);
        if (h == 0 || hm > mx) mx = hm;
    }
    for (int h = 0; h < n_kv_heads; h++) {
        ck_state *s = states[h];
        decide(s, sum, m, (double)n_kv_heads * (mx + 1.0));
        s->pend_m = -1;
    }
    free(sum);
    return KVS_OK;
}

static kvs_status chunkkv_select(void *state, const kvs_policy_view *view, kvs_policy_sel *sel) {
    ck_state *s = state;
    if (kvs_held_reserve(s->held, kvs_held_count(s->held) + 1) != KVS_OK)
        return kvs_fail(KVS_ERR_NOMEM, "chunkkv: out of memory");
    kvs_held_push(s->held, (int32_t)(view->n - 1)); /* generated tokens are never evicted */
    sel->n[0] = kvs_held_copy(s->held, sel->idx[0]);
    return KVS_OK;
}

/* The host's eviction (sim/replay.h "Sliding-window layers"): at once, and for the candidates of a later prefill. */
static kvs_status chunkkv_window_evict(void *state, int64_t first) {
    ck_state *s = state;
    if (first <= s->win_first) return KVS_OK;
    s->win_first = first;
    kvs_held_drop_before(s->held, (int32_t)first);
    return KVS_OK;
}

static int64_t chunkkv_stored(void *state, int g, int32_t *out) {
    (void)g;
    return kvs_held_copy(((ck_state *)state)->held, out);
}

static kvs_status chunkkv_validate(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget) {
    (void)m;
    (void)budget;
    int64_t k = (int64_t)kvs_policy_param_get(cfg, "kernel");
    if (k % 2 == 0)
        return kvs_fail(KVS_ERR_INVALID_ARG, "policy chunkkv: parameter 'kernel' must be odd (same padding), got %lld",
                        (long long)k);
    return KVS_OK;
}

static int chunkkv_notes(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget, char *buf,
                         size_t cap) {
    int64_t w = (int64_t)kvs_policy_param_get(cfg, "window"), c = (int64_t)kvs_policy_param_get(cfg, "chunk");
    int ref = (int)kvs_policy_param_get(cfg, "select") == KVS_CHUNKKV_REF;
    if (m->prompt_len > 0 && w >= m->prompt_len)
        return kvs_policy_note(buf, cap, "window=%lld covers the whole %lld-position first prompt: no position is "
                                         "scored, the prompt's last positions are kept (a window)",
                               (long long)w, (long long)m->prompt_len);
    if (!ref && budget <= w)
        return kvs_policy_note(buf, cap, "the budget is at most window=%lld: no chunk is kept, only the window's "
                                         "last positions (a window)",
                               (long long)w);
    if (!ref && budget - w < c)
        return kvs_policy_note(buf, cap, "the budget leaves fewer than chunk=%lld positions beside the window: no "
                                         "chunk is kept, only the window",
                               (long long)c);
    if (ref && budget < c)
        return kvs_policy_note(buf, cap, "the budget is below chunk=%lld: no whole chunk fits, the prompt's last "
                                         "positions are kept (a window)",
                               (long long)c);
    return 0;
}

const struct kvs_policy_ops kvs_policy_chunkkv = {
    .version = KVS_POLICY_INTERFACE_VERSION,
    .name = "chunkkv",
    .summary = "ChunkKV: prompt compressed in whole chunks of c tokens scored by SnapKV's window attention; "
               "generated tokens all kept",
    .is_oracle = 0,
    .granularity = KVS_SEL_PER_KV_HEAD,
    .budget_scope = KVS_BUDGET_PROMPT,
    .params = chunkkv_params,
    .n_params = (int)(sizeof chunkkv_params / sizeof chunkkv_params[0]),
    .presets = chunkkv_presets,
    .n_presets = (int)(sizeof chunkkv_presets / sizeof chunkkv_presets[0]),
    .validate = chunkkv_validate,
    .notes = chunkkv_notes,
    .create = chunkkv_create,
    .free = chunkkv_free,
    .prefill = chunkkv_prefill,
    .layer_sync = chunkkv_layer_sync,
    .window_evict = chunkkv_window_evict,
    .select = chunkkv_select,
    .stored = chunkkv_stored,
};
