/* lagkv.c — LagKV (Liang, Zhang, Li, Li, "LagKV: Lag-Relative Information of the KV Cache Tells Which Tokens Are
 * Important", arXiv 2504.04704), as specified in ../shared/POLICY_SPEC_2.md §2.4 [LAG]: the authors' recursive rule
 * (AI-Lab-China-Merchants-Bank/LagKV lag_kv.py, LagKV._compress_kv_by_lag) with the defaults of their published
 * custom-generate (sink 16, lag 128, ratio 0.5).
 *
 * Attention-free: only keys and values are read, never a query. Per (layer, KV head) the cache holds the S sink
 * tokens, a compressed prefix that is never scored again, and an uncompressed tail. After every append (a turn's
 * whole prompt, or one decode token), with n = |Res| and `base` the end of the compressed prefix:
 *  1. if n < base + 2L nothing happens;
 *  2. else the M = ⌊(n − base)/L⌋ full partitions of L tokens after base are cut out; partitions 0 … M−2 are
 *     scored each against its successor (the "lag" reference);
 *  3. score of a token: X̄ = X min-max normalised channel-wise by the reference partition's per-channel min and
 *     max, σ = unbiased std of X̄'s channels, softmax of σ over the partition; score = sc_K + v_weight·sc_V;
 *  4. each scored partition keeps its ⌊rL⌋ best tokens (ties: the older position, POLICY_SPEC §1.4);
 *  5. the last full partition and the remainder stay as the tail; base += (M − 1)·⌊rL⌋.
 * So |Res(n)| = S + ⌊rL⌋·(⌊(n − S)/L⌋ − 1) + tail, tail ∈ [L, 2L), once n ≥ S + 2L: |Res|/n → ⌊rL⌋/L.
 *
 * Budget: LagKV has no token budget (§2.4 "Budget mapping"): the resident size follows the ratio r and the lag
 * L, so budget_scope is NONE and runs are compared at their measured memory (choose r, or compare at equal
 * measured bytes). The run's budget is ignored (the engine notes it).
 *
 * Decisions (§2.4 Δ-REF):
 *  - use_then_compress = 1 (the authors' "important" default): the decode step that triggers a compression
 *    attends the uncompressed cache, and the compression follows its attention (the selection is copied first);
 *    use_then_compress = 0 compresses before attending;
 *  - the defaults of the authors' usage artefact (S 16, L 128, r 0.5); the class defaults (L 1024) are the
 *    `class` preset, the 8x ratio of the abstract's claim is the `x8` preset (r = 0.125);
 *  - a constant channel in the reference partition (max = min: the reference divides by zero) uses 1 as its
 *    denominator;
 *  - kvpress's prefill-only global top-k variant (LagKVPress, PREFILL_GLOBAL) is not offered: it is a re-
 *    implementation with a budget, not the authors' method, and would need a prompt-scoped budget this table
 *    cannot declare beside the recursive mode's none;
 *  - multi-turn: the recursive rule simply continues over a later turn's prompt (one append of its positions).
 * Sliding-window layers (sim/replay.h): the host's window_evict drops the held positions before the window's first
 * at once, whichever part of the cache holds them: the sinks (the stream's first S tokens: gone with the window,
 * nothing replaces them), then the compressed prefix, then the tail; `base` shrinks by the entries dropped before it
 * (never below 0), so the next partitions start at the oldest uncompressed position the window leaves. A prefill
 * appends no position before it (and the sinks among those never arrive: a first prompt longer than the window keeps
 * no sink). With use_then_compress on a layer whose window already moves (first > 0), the
 * step's compression waits for the window's eviction of that step (window_evict runs it, over the same keys), so
 * no partition is scored with a position the window drops at once; before the window moves, and on every full
 * layer, it runs in select() as always. LagKV has no budget: a windowed layer holds at most its window.
 * Accounting: the default (KV of the resident set at attention time); the integer `base` is the only state; the
 * per-trigger min/max vectors and scores are temporaries.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "held.h"
#include "lagkv_internal.h"
#include "registry.h"

/* The trace format's largest head_dim (trace/trace.h KVS_TRACE_MAX_HEAD_DIM; policies do not include trace/): the
 * scoring's per-channel arrays live on the stack. */
enum { LAG_MAX_D = 1024 };

static const kvs_policy_param lagkv_params[] = {
    {.key = "sink", .type = KVS_PARAM_INT, .def = 16, .lo = 0, .hi = 1 << 20,
     .help = "sink tokens S, never compressed (authors 16; kvpress 4)"},
    {.key = "lag", .type = KVS_PARAM_INT, .def = 128, .lo = 2, .hi = 1 << 20,
     .help = "partition (lag) size L: each partition is scored against the next one (custom generate 128; class 1024)"},
    {.key = "ratio", .type = KVS_PARAM_DOUBLE, .def = 0.5, .lo = 0, .hi = 1,
     .help = "kept fraction r of each scored partition: floor(r L) tokens"},
    {.key = "v_weight", .type = KVS_PARAM_DOUBLE, .def = 1.0, .lo = 0, .hi = 1e6,
     .help = "weight of the value score beside the key score"},
    {.key = "use_then_compress", .type = KVS_PARAM_BOOL, .def = 1, .lo = 0, .hi = 1,
     .help = "the triggering decode step attends the uncompressed cache, then compresses (authors); 0: before"},
};

static const kvs_policy_preset lagkv_presets[] = {
    {.name = "class", .params = "sink=16,lag=1024,ratio=0.5",
     .help = "the defaults of the authors' LagKV class (lag_kv.py); no token budget (measured memory)"},
    {.name = "x8", .params = "sink=16,lag=128,ratio=0.125",
     .help = "the abstract's 8x compression (|Res|/n -> 0.125), ~90% of the original performance claimed"},
};

typedef struct {
    int64_t sink, lag, keep;  /* keep = floor(r L) per scored partition */
    double v_weight;
    int use_then, d;
    int64_t base;             /* held entries [0, base) are the sinks and the compressed prefix */
    kvs_held *held;
    double *sk, *sv;          /* [lag] */
    char *mark;               /* [cap] */
    int32_t *scratch;         /* [lag] */
    int64_t mark_cap;
    int64_t win_first;        /* positions before it were evicted by the host (sliding-window layer); 0 otherwise */
    const float *pend_k, *pend_v; /* the history rows of a compression waiting for this step's window_evict */
    int pending;
} lag_state;

static void lagkv_free(void *state) {
    lag_state *s = state;
    if (!s) return;
    kvs_held_free(s->held);
    free(s->sk);
    free(s->sv);
    free(s->mark);
    free(s->scratch);
    free(s);
}

static kvs_status lagkv_create(const kvs_policy_init *init, void **state) {
    lag_state *s = calloc(1, sizeof *s);
    if (!s) return kvs_fail(KVS_ERR_NOMEM, "lagkv: out of memory");
    s->sink = (int64_t)kvs_policy_param_get(init->cfg, "sink");
    s->lag = (int64_t)kvs_policy_param_get(init->cfg, "lag");
    s->keep = (int64_t)floor(kvs_policy_param_get(init->cfg, "ratio") * (double)s->lag);
    s->v_weight = kvs_policy_param_get(init->cfg, "v_weight");
    s->use_then = kvs_policy_param_get(init->cfg, "use_then_compress") != 0;
    s->d = init->model->head_dim;
    s->base = s->sink;
    s->held = kvs_held_create(2 * s->lag + s->sink + 1);
    s->sk = malloc((size_t)s->lag * sizeof(double));
    s->sv = malloc((size_t)s->lag * sizeof(double));
    s->scratch = malloc((size_t)s->lag * sizeof(int32_t));
    if (!s->held || !s->sk || !s->sv || !s->scratch) {
        lagkv_free(s);
        return kvs_fail(KVS_ERR_NOMEM, "lagkv: out of memory");
    }
    *state = s;
    return KVS_OK;
}

void kvs_lagkv_partition_scores(const float *x, const int32_t *part, int64_t len, const int32_t *ref,
                                int64_t ref_len, int d, double *sc) {
    double lo[LAG_MAX_D], hi[LAG_MAX_D];
    for (int c = 0; c < d; c++) {
        lo[c] = hi[c] = x[(size_t)ref[0] * (size_t)d + (size_t)c];
        for (int64_t i = 1; i < ref_len; i++) {
            double v = x[(size_t)ref[i] * (size_t)d + (size_t)c];
            if (v < lo[c]) lo[c] = v;
            if (v > hi[c]) hi[c] = v;
        }
    }
    double mx = -INFINITY;
    for (int64_t i = 0; i < len; i++) {
        const float *row = x + (size_t)part[i] * (size_t)d;
        double mean = 0, ss = 0, y[LAG_MAX_D];
        for (int c = 0; c < d; c++) {
            double den = hi[c] > lo[c] ? hi[c] - lo[c] : 1.0;
            y[c] = ((double)row[c] - lo[c]) / den;
            mean += y[c];
        }
        mean /= d;
        for (int c = 0; c < d; c++) ss += (y[c] - mean) * (y[c] - mean);
        sc[i] = sqrt(ss / (d - 1));
        if (sc[i] > mx) mx = sc[i];
    }
    double sum = 0;
    for (int64_t i = 0; i < len; i++) sum += (sc[i] = exp(sc[i] - mx));
    for (int64_t i = 0; i < len; i++) sc[i] /= sum;
}

/* The recursive rule after an append (header steps 1-5), over the keys and values of the view. */
static kvs_status compress(lag_state *s, const float *keys, const float *values) {
    int64_t n = kvs_held_count(s->held);
    if (n < s->base + 2 * s->lag) return KVS_OK;
    int64_t M = (n - s->base) / s->lag;
    if (n > s->mark_cap) {
        char *m = realloc(s->mark, (size_t)n);
        if (!m) return kvs_fail(KVS_ERR_NOMEM, "lagkv: out of memory");
        s->mark = m;
        s->mark_cap = n;
    }
    memset(s->mark, 1, (size_t)n);
    const int32_t *pos = kvs_held_pos(s->held);
    for (int64_t p = 0; p + 1 < M; p++) {
        const int32_t *part = pos + s->base + p * s->lag, *ref = part + s->lag;
        kvs_lagkv_partition_scores(keys, part, s->lag, ref, s->lag, s->d, s->sk);
        kvs_lagkv_partition_scores(values, part, s->lag, ref, s->lag, s->d, s->sv);
        for (int64_t i = 0; i < s->lag; i++) s->sk[i] += s->v_weight * s->sv[i];
        kvs_held_top_mask(s->sk, s->lag, s->keep, s->mark + s->base + p * s->lag, s->scratch);
    }
    kvs_held_compact(s->held, s->mark);
    s->base += (M - 1) * s->keep;
    return KVS_OK;
}

static kvs_status append(lag_state *s, int64_t first, int64_t end) {
    if (kvs_held_reserve(s->held, kvs_held_count(s->held) + (end - first)) != KVS_OK)
        return kvs_fail(KVS_ERR_NOMEM, "lagkv: out of memory");
    for (int64_t p = first; p < end; p++) kvs_held_push(s->held, (int32_t)p);
    return KVS_OK;
}

/* A compression still waiting for a window_evict (defensive: the host calls it every step once the window moves)
 * runs before anything else changes the held set, over the same history rows. */
static kvs_status flush_pending(lag_state *s) {
    if (!s->pending) return KVS_OK;
    s->pending = 0;
    return compress(s, s->pend_k, s->pend_v);
}

static kvs_status lagkv_prefill(void *state, const kvs_policy_view *view) {
    lag_state *s = state;
    kvs_status st = flush_pending(s);
    if (st != KVS_OK) return st;
    int64_t first = view->block_begin > view->turn_begin ? view->block_begin : view->turn_begin;
    if (first < s->win_first) first = s->win_first; /* evicted by the host before the prefill */
    st = append(s, first, view->n);
    return st != KVS_OK ? st : compress(s, view->k, view->v);
}

static kvs_status lagkv_select(void *state, const kvs_policy_view *view, kvs_policy_sel *sel) {
    lag_state *s = state;
    kvs_status st = flush_pending(s);
    if (st == KVS_OK) st = append(s, view->n - 1, view->n);
    if (st == KVS_OK && !s->use_then) st = compress(s, view->k, view->v);
    if (st != KVS_OK) return st;
    sel->n[0] = kvs_held_copy(s->held, sel->idx[0]);
    if (!s->use_then) return KVS_OK;
    if (s->win_first > 0) { /* the window moves: its eviction of this step comes first (window_evict) */
        s->pend_k = view->k;
        s->pend_v = view->v;
        s->pending = 1;
        return KVS_OK;
    }
    return compress(s, view->k, view->v); /* after the selection: this step attends the full tail */
}

/* The host's eviction (sim/replay.h "Sliding-window layers"): the held positions before `first` leave at once; the
 * compressed prefix shrinks with them; then the step's waiting compression. */
static kvs_status lagkv_window_evict(void *state, int64_t first) {
    lag_state *s = state;
    if (first > s->win_first) {
        s->win_first = first;
        /* before anything arrived (a first prompt longer than the window), the sinks before `first` never will */
        int64_t k = kvs_held_count(s->held) == 0 ? (first < s->base ? first : s->base)
                                                 : kvs_held_drop_before(s->held, (int32_t)first);
        s->base = s->base > k ? s->base - k : 0;
    }
    return flush_pending(s);
}

static int64_t lagkv_stored(void *state, int g, int32_t *out) {
    (void)g;
    return kvs_held_copy(((lag_state *)state)->held, out);
}

static kvs_status lagkv_validate(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget) {
    (void)budget;
    if (m->head_dim < 2)
        return kvs_fail(KVS_ERR_INVALID_ARG, "policy lagkv: needs head_dim >= 2 (a standard deviation over the "
                                             "channels), the trace has %d",
                        (int)m->head_dim);
    if (m->head_dim > LAG_MAX_D)
        return kvs_fail(KVS_ERR_INVALID_ARG, "policy lagkv: head_dim %d above %d", (int)m->head_dim,
                        LAG_MAX_D);
    (void)cfg;
    return KVS_OK;
}

static int lagkv_notes(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget, char *buf,
                       size_t cap) {
    int64_t S = (int64_t)kvs_policy_param_get(cfg, "sink"), L = (int64_t)kvs_policy_param_get(cfg, "lag");
    int n = kvs_policy_note(buf, cap, "LagKV has no token budget: budget %lld is ignored, the ratio sets the memory "
                                      "(compare at measured memory)",
                            (long long)budget);
    if (m->n_positions > 0 && m->n_positions < S + 2 * L)
        n += kvs_policy_note(buf, cap, "the trace's %lld positions are fewer than sink + 2 lag = %lld: nothing is "
                                       "ever compressed (the full cache)",
                             (long long)m->n_positions, (long long)(S + 2 * L));
    return n;
}

const struct kvs_policy_ops kvs_policy_lagkv = {
    .version = KVS_POLICY_INTERFACE_VERSION,
    .name = "lagkv",
    .summary = "LagKV: attention-free; each partition of L tokens keeps its r L tokens whose K/V, min-max scaled "
               "by the next partition, vary most; recursive; no token budget (ratio r)",
    .is_oracle = 0,
    .granularity = KVS_SEL_PER_KV_HEAD,
    .budget_scope = KVS_BUDGET_NONE,
    .params = lagkv_params,
    .n_params = (int)(sizeof lagkv_params / sizeof lagkv_params[0]),
    .presets = lagkv_presets,
    .n_presets = (int)(sizeof lagkv_presets / sizeof lagkv_presets[0]),
    .validate = lagkv_validate,
    .notes = lagkv_notes,
    .create = lagkv_create,
    .free = lagkv_free,
    .prefill = lagkv_prefill,
    .select = lagkv_select,
    .stored = lagkv_stored,
    .window_evict = lagkv_window_evict,
};
