/* streaming.c — StreamingLLM attention sinks + recent window (POLICY_SPEC §2.6 B3; Xiao et al. 2023).
 * Budget B = n_s sinks (the first n_s positions, default 4 as in StreamingLLM and KeyDiff App. F.2) plus a
 * recent window of B - n_s positions that includes the current one. Evict-then-attend: append, drop the
 * oldest non-sink if over B, attend. Shared by all heads (position-only rule).
 * Ambiguities resolved: B <= n_s is rejected (the window would not even hold the current token).
 * Prefill keeps the first n_s and the last B-n_s-1 prompt positions (the next token completes the window).
 * StreamingLLM re-indexes positions inside the cache; captured post-RoPE keys cannot be re-rotated, so this
 * is NOT modelled (POLICY_SPEC §0.4, B3): results are for the retention rule only.
 * Storage and traffic 2d·B, no auxiliary state.
 * On a sliding-window layer (sim/replay.h) the host's evictions raise `first`: sinks before it are gone and their
 * slots go to the recent window, so a budget B >= the layer's window W attends exactly the window.
 */
#include <stdlib.h>

#include "registry.h"

static const kvs_policy_param streaming_params[] = {
    {.key = "sinks", .type = KVS_PARAM_INT, .def = 4, .lo = 0, .hi = 1 << 20,
     .help = "attention-sink positions always kept (the first n_s tokens)"},
};

/* Block-wise prompt processing (KeyDiff's setting) keeps the same positions as one pass (a position rule), so
 * its preset needs no block parameter. */
static const kvs_policy_preset streaming_presets[] = {
    {.name = "keydiff", .params = "sinks=4",
     .help = "KeyDiff App. F.2 \"Sink\": the first four tokens as attention sinks; budgets 2K-8K per KV head"},
};

typedef struct {
    int64_t budget, sinks;
    int64_t seen;
    int64_t first; /* positions before it were evicted by the host (sliding-window layer); 0 otherwise */
} streaming_state;

static kvs_status streaming_validate(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget) {
    (void)m;
    int64_t sinks = (int64_t)kvs_policy_param_get(cfg, "sinks");
    if (budget <= sinks)
        return kvs_fail(KVS_ERR_INVALID_ARG, "policy streaming: budget %lld must exceed sinks=%lld", (long long)budget,
                        (long long)sinks);
    return KVS_OK;
}

/* Degenerate setting (kvs_policy_ops.notes): no sink is StreamingLLM without its point, a sliding window. */
static int streaming_notes(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget, char *buf,
                           size_t cap) {
    (void)m;
    (void)budget;
    if (kvs_policy_param_get(cfg, "sinks") == 0)
        return kvs_policy_note(buf, cap, "sinks=0 keeps no attention sink (a window)");
    return 0;
}

static kvs_status streaming_create(const kvs_policy_init *init, void **state) {
    streaming_state *s = calloc(1, sizeof *s);
    if (!s) return kvs_fail(KVS_ERR_NOMEM, "streaming: out of memory");
    s->budget = init->budget;
    s->sinks = (int64_t)kvs_policy_param_get(init->cfg, "sinks");
    if (s->budget <= s->sinks) {
        long long sinks = (long long)s->sinks;
        free(s);
        return kvs_fail(KVS_ERR_INVALID_ARG, "policy streaming: budget %lld must exceed sinks=%lld",
                        (long long)init->budget, sinks);
    }
    *state = s;
    return KVS_OK;
}

static void streaming_free(void *state) { free(state); }

/* Sinks [0, min(sinks, n)) plus the last `recent` = B - sinks - held positions not among them (held = 0 at attention
 * time, 1 between steps). Once the host evicted positions (first > 0), the sinks before first are gone and the
 * recent window takes their slots. */
static int64_t streaming_set(const streaming_state *s, int64_t n, int64_t held, int32_t *out) {
    int64_t m = 0, ns = s->sinks < n ? s->sinks : n;
    int64_t kept = s->first > 0 ? (ns > s->first ? ns - s->first : 0) : s->sinks;
    int64_t recent = s->budget - kept - held;
    for (int64_t j = s->first; j < ns; j++) out[m++] = (int32_t)j;
    int64_t lo = n - recent;
    if (lo < ns) lo = ns;
    if (lo < s->first) lo = s->first;
    for (int64_t j = lo; j < n; j++) out[m++] = (int32_t)j;
    return m;
}

static kvs_status streaming_prefill(void *state, const kvs_policy_view *view) {
    streaming_state *s = state;
    s->seen = view->n;
    return KVS_OK;
}

static kvs_status streaming_select(void *state, const kvs_policy_view *view, kvs_policy_sel *sel) {
    streaming_state *s = state;
    sel->n[0] = streaming_set(s, view->n, 0, sel->idx[0]);
    s->seen = view->n;
    return KVS_OK;
}

static int64_t streaming_stored(void *state, int g, int32_t *out) {
    streaming_state *s = state;
    (void)g;
    return streaming_set(s, s->seen, 1, out);
}

static kvs_status streaming_window_evict(void *state, int64_t first) {
    streaming_state *s = state;
    if (first > s->first) s->first = first;
    return KVS_OK;
}

const struct kvs_policy_ops kvs_policy_streaming = {
    .version = KVS_POLICY_INTERFACE_VERSION,
    .name = "streaming",
    .summary = "StreamingLLM: n_s attention sinks + recent window (no position re-indexing)",
    .is_oracle = 0,
    .granularity = KVS_SEL_PER_KV_HEAD,
    .budget_scope = KVS_BUDGET_EVERY_STEP,
    .params = streaming_params,
    .n_params = (int)(sizeof streaming_params / sizeof streaming_params[0]),
    .presets = streaming_presets,
    .n_presets = (int)(sizeof streaming_presets / sizeof streaming_presets[0]),
    .validate = streaming_validate,
    .notes = streaming_notes,
    .create = streaming_create,
    .free = streaming_free,
    .prefill = streaming_prefill,
    .select = streaming_select,
    .stored = streaming_stored,
    .window_evict = streaming_window_evict,
};
