/* simlayerkv.c — SimLayerKV (Zhang et al., arXiv 2410.13846): "lazy" layers, whose attention sits on the first few
 * and the most recent tokens, keep only those; the other layers keep everything. Follows ../shared/POLICY_SPEC_2.md
 * §2.6 (the authors' code sail-sg/SimLayerKV, LongBench/SimLayerKV_attention_llama.py "[SimLayerKV_decode]" and
 * SimLayerKV_llama.py's trim, thresholds from pred.py; kvpress SimLayerKVPress for the prefill variant).
 *
 * Lazy score of a layer (mean over all its query heads, layer_sync):
 *  - detect=decode1 (the authors' active code): at the first decode step (position P) the layer attends its full
 *    cache; from that step's attention (the engine's probabilities over the policy's own set, observe()),
 *    λ = mean_h Σ_{j<n_init} a_h[j] + mean_h Σ_{j>P−n_recent} a_h[j] (ranges overlap on short sequences and are then
 *    counted twice, REF, sic: it can flag a layer lazy only when trimming removes nothing). Lazy iff λ > delta; the
 *    lazy layer is then trimmed to the first n_init plus the last n_recent positions (current included).
 *  - detect=prefill_last (kvpress): the last prompt query's attention over the P prompt keys (computed here from the
 *    prefill view), its own column dropped without renormalising: λ = Σ_{j<n_init} ā + Σ over the last n_recent of
 *    the first P−1 columns; a lazy layer is trimmed at the end of prefill to the first n_init plus the last
 *    n_recent − 1 prompt positions (so the next token completes n_init + n_recent).
 * The decision is taken once (first turn) and never revisited. After it, lazy_evict=sliding (kvsim default, the
 * paper's description) evicts the oldest non-initial token every step (StreamingLLM, evict-then-attend); once (the
 * code) trims once and then lets the layer grow by one per step. Non-lazy layers append only.
 *
 * Decisions where the spec leaves room (POLICY_SPEC_2 appendix 6): the defaults take no budget (scope "none": the
 * threshold sets the memory); n_recent = 1024 is a no-op on traces shorter than 1028 positions (a note says so).
 * n_recent=0 is a budgeted mode offered here, not the paper's: lazy layers keep the run's budget B (n_init sinks +
 * B − n_init recent), non-lazy layers everything. detect=prefill_w (the authors' commented-out prefill detector) is
 * not offered. Later turns: a lazy sliding layer is cut to n_init + n_recent − 1 at the end of each prompt.
 * Sliding-window layers (sim/replay.h): the host's window_evict names the first position the next step can attend;
 * the held set is then [first, seen) minus the gap, at once (the set is a rule over positions, like StreamingLLM's).
 * The lazy score is the attention the layer really computes, placed by position: decode1 reads the first decode
 * step's probabilities over its windowed set, prefill_last the last prompt query's softmax over its own window
 * (first − 1 .. P − 1, the window before the host's eviction for the next token); the initial tokens' term is the
 * attention on positions < n_init, 0 once they left the window (a windowed layer then looks lazy only by its recent
 * mass). A lazy layer's initial tokens that left the window hand their slots to the recent part (as streaming.c's
 * sinks), so n_init + n_recent >= the window W (budgeted mode: B >= W) holds exactly the window; lazy or not, no
 * layer holds a position before the window.
 * Storage: KV of the held set; AUX one score per layer (/Hkv per KV head). Traffic = the attended K/V.
 */
#include <stdlib.h>
#include <string.h>

#include "../common/kvs_math.h"
#include "registry.h"
#include "simlayerkv_internal.h"

enum { SLK_DECODE1 = 0, SLK_PREFILL_LAST = 1 };
enum { SLK_SLIDING = 0, SLK_ONCE = 1 };

static const kvs_policy_param slk_params[] = {
    {.key = "delta", .type = KVS_PARAM_DOUBLE, .def = 0.9, .lo = 0.0, .hi = 2.0,
     .help = "laziness threshold: a layer is lazy when its sink + recent attention exceeds delta (Llama-3: 0.9)"},
    {.key = "n_init", .type = KVS_PARAM_INT, .def = 4, .lo = 0, .hi = 1 << 20, .help = "initial tokens a lazy layer keeps"},
    {.key = "n_recent", .type = KVS_PARAM_INT, .def = 1024, .lo = 0, .hi = 1 << 24,
     .help = "recent tokens a lazy layer keeps, current included; 0 = budget minus n_init (kvsim's budgeted mode)"},
    {.key = "detect", .type = KVS_PARAM_ENUM, .def = SLK_DECODE1, .choices = "decode1|prefill_last",
     .help = "decode1: first generated token's attention (authors); prefill_last: last prompt query (kvpress)"},
    {.key = "lazy_evict", .type = KVS_PARAM_ENUM, .def = SLK_SLIDING, .choices = "sliding|once",
     .help = "sliding: lazy layers stay at n_init + n_recent (StreamingLLM); once: trimmed once, then grow (code)"},
};

/* LongBench/pred.py thresholds (POLICY_SPEC_2 §2.6), and kvpress's prefill variant. */
static const kvs_policy_preset slk_presets[] = {
    {.name = "llama3", .params = "delta=0.9", .help = "SimLayerKV pred.py, Llama-3-8B threshold; no budget"},
    {.name = "llama2", .params = "delta=0.65", .help = "SimLayerKV pred.py, Llama-2-7B threshold; no budget"},
    {.name = "mistral", .params = "delta=0.8", .help = "SimLayerKV pred.py, Mistral-7B threshold; no budget"},
    {.name = "qwen", .params = "delta=0.85", .help = "SimLayerKV pred.py, Qwen threshold; no budget"},
    {.name = "kvpress", .params = "detect=prefill_last,lazy_evict=once",
     .help = "kvpress SimLayerKVPress: prefill-time detection on the last prompt query, trim once; no budget"},
};

double kvs_slk_lazy_score(const double *row, int64_t n, int64_t n_init, int64_t n_recent, int prefill_last) {
    int64_t cols = prefill_last ? n - 1 : n; /* prefill_last: the query's own column dropped, not renormalised */
    double s = 0;
    for (int64_t j = 0; j < n_init && j < cols; j++) s += row[j];
    int64_t lo = cols - n_recent < 0 ? 0 : cols - n_recent;
    for (int64_t j = lo; j < cols; j++) s += row[j];
    return s;
}

typedef struct {
    double delta;
    int64_t n_init, n_recent;
    int detect, evict, G, Hq, d, aux_bytes, Hkv;
    float scale;
    int64_t seen;          /* positions 0..seen−1 arrived */
    int64_t gap_lo, gap_hi; /* held = [win_first, seen) minus [gap_lo, gap_hi) */
    int64_t win_first;     /* positions before it were evicted by the host (sliding-window layer); 0 otherwise */
    int decided, lazy, pending;
    double part;           /* this KV head's Σ over its query heads of the lazy mass (awaiting layer_sync) */
} slk_state;

static int64_t slk_recent(const kvs_policy_config *cfg, int64_t budget) {
    int64_t r = (int64_t)kvs_policy_param_get(cfg, "n_recent");
    return r > 0 ? r : budget - (int64_t)kvs_policy_param_get(cfg, "n_init");
}

static kvs_status slk_validate(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget) {
    (void)m;
    if (slk_recent(cfg, budget) < 1)
        return kvs_fail(KVS_ERR_INVALID_ARG, "policy simlayerkv: n_recent=0 (budgeted mode) needs budget %lld > n_init=%lld",
                        (long long)budget, (long long)kvs_policy_param_get(cfg, "n_init"));
    return KVS_OK;
}

static int slk_notes(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget, char *buf, size_t cap) {
    int64_t keep = (int64_t)kvs_policy_param_get(cfg, "n_init") + slk_recent(cfg, budget);
    if (m->n_positions > 0 && keep >= m->n_positions)
        return kvs_policy_note(buf, cap, "n_init + n_recent = %lld covers the trace's %lld positions: a lazy layer "
                                         "drops nothing (the run equals the full cache)",
                               (long long)keep, (long long)m->n_positions);
    return 0;
}

static kvs_status slk_create(const kvs_policy_init *init, void **state) {
    slk_state *s = calloc(1, sizeof *s);
    if (!s) return kvs_fail(KVS_ERR_NOMEM, "simlayerkv: out of memory");
    s->delta = kvs_policy_param_get(init->cfg, "delta");
    s->n_init = (int64_t)kvs_policy_param_get(init->cfg, "n_init");
    s->n_recent = slk_recent(init->cfg, init->budget_nominal);
    s->detect = (int)kvs_policy_param_get(init->cfg, "detect");
    s->evict = (int)kvs_policy_param_get(init->cfg, "lazy_evict");
    s->G = init->model->group;
    s->Hkv = init->model->n_kv_heads;
    s->Hq = init->model->n_heads;
    s->d = init->model->head_dim;
    s->scale = init->model->scale;
    s->aux_bytes = init->model->aux_bytes;
    if (s->n_recent < 1) {
        free(s);
        return kvs_fail(KVS_ERR_INVALID_ARG, "policy simlayerkv: n_recent must be >= 1");
    }
    *state = s;
    return KVS_OK;
}

static void slk_free(void *state) { free(state); }

/* Trim to the first n_init plus the last `recent` of [0, seen); the initial tokens the window dropped give their
 * slots to the recent part. */
static void slk_trim(slk_state *s, int64_t recent) {
    int64_t gone = s->win_first < s->n_init ? s->win_first : s->n_init;
    int64_t lo = s->seen - recent - gone;
    if (lo <= s->n_init) return; /* nothing to drop beyond what is already gone */
    if (s->gap_hi <= s->gap_lo) s->gap_lo = s->n_init;
    if (lo > s->gap_hi) s->gap_hi = lo;
}

static kvs_status slk_prefill(void *state, const kvs_policy_view *view) {
    slk_state *s = state;
    s->seen = view->n;
    if (s->lazy && s->evict == SLK_SLIDING) slk_trim(s, s->n_recent - 1);
    if (s->decided || s->detect != SLK_PREFILL_LAST || view->turn != 0) return KVS_OK;
    /* the last prompt query of each head of the group over the P prompt keys (a windowed layer: over its window,
     * [first − 1, P) for the host's first = P − W + 1; the row by position, 0 before it) */
    int64_t n = view->n, lo = s->win_first > 0 ? s->win_first - 1 : 0, m = n - lo;
    double *row = calloc((size_t)n, sizeof *row);
    float *sc = malloc((size_t)n * sizeof *sc);
    int32_t *idx = malloc((size_t)n * sizeof *idx);
    if (!row || !sc || !idx) {
        free(row);
        free(sc);
        free(idx);
        return kvs_fail(KVS_ERR_NOMEM, "simlayerkv: out of memory");
    }
    for (int64_t j = 0; j < m; j++) idx[j] = (int32_t)(lo + j);
    for (int g = 0; g < s->G; g++) {
        const float *q = view->q + ((size_t)(n - 1 - view->q_first) * (size_t)view->group + (size_t)g) * (size_t)s->d;
        kvs_attn_scores(q, view->k, (size_t)s->d, idx, (size_t)m, (size_t)s->d, s->scale, sc);
        kvs_softmax(sc, (size_t)m);
        for (int64_t j = 0; j < m; j++) row[lo + j] += sc[j];
    }
    s->part = kvs_slk_lazy_score(row, n, s->n_init, s->n_recent, 1);
    s->pending = 1;
    free(row);
    free(sc);
    free(idx);
    return KVS_OK;
}

static int64_t slk_list(const slk_state *s, int64_t n, int32_t *out) {
    int64_t m = 0;
    for (int64_t j = s->win_first; j < n; j++)
        if (j < s->gap_lo || j >= s->gap_hi) out[m++] = (int32_t)j;
    return m;
}

static kvs_status slk_select(void *state, const kvs_policy_view *view, kvs_policy_sel *sel) {
    slk_state *s = state;
    s->seen = view->n;
    if (s->lazy && s->evict == SLK_SLIDING) slk_trim(s, s->n_recent);
    sel->n[0] = slk_list(s, view->n, sel->idx[0]);
    return KVS_OK;
}

static kvs_status slk_observe(void *state, const kvs_policy_view *view, const kvs_policy_sel *sel,
                              const float *const *probs) {
    slk_state *s = state;
    if (s->decided || s->detect != SLK_DECODE1) return KVS_OK;
    /* first decode step: the set is every position of the window (0..n−1 on a full layer), in ascending order
     * (slk_list without a gap); the row by position */
    int64_t n = view->n, ns = sel->n[0];
    const int32_t *idx = sel->idx[0];
    double *row = calloc((size_t)n, sizeof *row);
    if (!row) return kvs_fail(KVS_ERR_NOMEM, "simlayerkv: out of memory");
    for (int g = 0; g < s->G; g++)
        for (int64_t j = 0; j < ns; j++) row[idx[j]] += probs[g][j];
    s->part = kvs_slk_lazy_score(row, n, s->n_init, s->n_recent, 0);
    s->pending = 1;
    free(row);
    return KVS_OK;
}

static kvs_status slk_layer_sync(void *const *states, int n_kv_heads, kvs_policy_sync_phase phase) {
    slk_state *s0 = states[0];
    if (s0->decided || !s0->pending) return KVS_OK;
    if ((phase == KVS_SYNC_PREFILL) != (s0->detect == SLK_PREFILL_LAST)) return KVS_OK;
    double lambda = 0;
    for (int h = 0; h < n_kv_heads; h++) lambda += ((slk_state *)states[h])->part;
    lambda /= (double)s0->Hq;
    for (int h = 0; h < n_kv_heads; h++) {
        slk_state *s = states[h];
        s->decided = 1;
        s->pending = 0;
        s->lazy = lambda > s->delta;
        if (s->lazy) slk_trim(s, phase == KVS_SYNC_PREFILL ? s->n_recent - 1 : s->n_recent);
    }
    return KVS_OK;
}

/* The host's eviction (sim/replay.h "Sliding-window layers"): the held set starts at `first` from now on. */
static kvs_status slk_window_evict(void *state, int64_t first) {
    slk_state *s = state;
    if (first > s->win_first) s->win_first = first;
    return KVS_OK;
}

static int64_t slk_stored(void *state, int g, int32_t *out) {
    slk_state *s = state;
    (void)g;
    return slk_list(s, s->seen, out);
}

static void slk_account(void *state, const kvs_policy_view *view, const kvs_policy_sel *sel, kvs_policy_cost *out) {
    slk_state *s = state;
    (void)view;
    (void)sel;
    out->aux_bytes = (double)s->aux_bytes / (double)s->Hkv; /* the layer's score, shared by its KV heads */
}

const struct kvs_policy_ops kvs_policy_simlayerkv = {
    .version = KVS_POLICY_INTERFACE_VERSION,
    .name = "simlayerkv",
    .summary = "SimLayerKV: lazy layers (sink + recent attention > delta) keep n_init + n_recent, others all",
    .is_oracle = 0,
    .granularity = KVS_SEL_PER_KV_HEAD,
    .budget_scope = KVS_BUDGET_NONE,
    .params = slk_params,
    .n_params = (int)(sizeof slk_params / sizeof slk_params[0]),
    .presets = slk_presets,
    .n_presets = (int)(sizeof slk_presets / sizeof slk_presets[0]),
    .validate = slk_validate,
    .notes = slk_notes,
    .create = slk_create,
    .free = slk_free,
    .prefill = slk_prefill,
    .select = slk_select,
    .observe = slk_observe,
    .layer_sync = slk_layer_sync,
    .stored = slk_stored,
    .account = slk_account,
    .window_evict = slk_window_evict,
};
