/* window.c — Local (sliding) window baseline (POLICY_SPEC §2.6 B3 with n_s = 0; D2O's "Local Window").
 * S_t = the last B positions including the current one: [max(0, p-B+1), p]. Evict-then-attend, so
 * the cache holds the last B-1 positions between steps. Storage and traffic 2d·B (no auxiliary state).
 * Prefill keeps the last B-1 prompt positions; a later turn's prefill likewise keeps the last B-1 of
 * everything seen (a window has no other choice to make).
 * On a sliding-window layer (sim/replay.h) the host's evictions raise `first`: S_t = [max(first, p-B+1), p], so a
 * budget B >= the layer's window W attends exactly the layer's window.
 */
#include <stdlib.h>

#include "registry.h"

typedef struct {
    int64_t budget;
    int64_t seen; /* positions seen so far (0..seen-1) */
    int64_t first; /* positions before it were evicted by the host (sliding-window layer); 0 otherwise */
} window_state;

static kvs_status window_create(const kvs_policy_init *init, void **state) {
    window_state *s = calloc(1, sizeof *s);
    if (!s) return kvs_fail(KVS_ERR_NOMEM, "window: out of memory");
    s->budget = init->budget;
    *state = s;
    return KVS_OK;
}

static void window_free(void *state) { free(state); }

static kvs_status window_prefill(void *state, const kvs_policy_view *view) {
    window_state *s = state;
    s->seen = view->n;
    return KVS_OK;
}

static kvs_status window_select(void *state, const kvs_policy_view *view, kvs_policy_sel *sel) {
    window_state *s = state;
    int64_t lo = view->n > s->budget ? view->n - s->budget : 0;
    if (lo < s->first) lo = s->first;
    int64_t m = 0;
    for (int64_t j = lo; j < view->n; j++) sel->idx[0][m++] = (int32_t)j;
    sel->n[0] = m;
    s->seen = view->n;
    return KVS_OK;
}

/* Between steps the cache holds the last B-1 positions seen. */
static int64_t window_stored(void *state, int g, int32_t *out) {
    window_state *s = state;
    (void)g;
    int64_t keep = s->budget - 1;
    int64_t lo = s->seen > keep ? s->seen - keep : 0, m = 0;
    if (lo < s->first) lo = s->first;
    for (int64_t j = lo; j < s->seen; j++) out[m++] = (int32_t)j;
    return m;
}

static kvs_status window_window_evict(void *state, int64_t first) {
    window_state *s = state;
    if (first > s->first) s->first = first;
    return KVS_OK;
}

const struct kvs_policy_ops kvs_policy_window = {
    .version = KVS_POLICY_INTERFACE_VERSION,
    .name = "window",
    .summary = "sliding window: the last B positions including the current one",
    .is_oracle = 0,
    .granularity = KVS_SEL_PER_KV_HEAD,
    .budget_scope = KVS_BUDGET_EVERY_STEP,
    .params = NULL,
    .n_params = 0,
    .create = window_create,
    .free = window_free,
    .prefill = window_prefill,
    .select = window_select,
    .stored = window_stored,
    .window_evict = window_window_evict,
};
