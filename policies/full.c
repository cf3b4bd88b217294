/* full.c — Full-KV baseline (POLICY_SPEC §2.6 B1): attend to every position 0..p. Storage and traffic
 * 2d·n per KV head: the reference every relative number is measured against. Through the engine it has
 * exactly zero output error, recall 1 and top-k overlap 1 (a check of the engine itself).
 * The budget is ignored (documented: a full cache has no budget); runs still record the sweep's budget.
 */
#include <stdlib.h>

#include "registry.h"

typedef struct {
    int64_t first; /* positions before it were evicted by the host (a sliding-window layer's window); 0 otherwise */
} full_state;

static kvs_status full_create(const kvs_policy_init *init, void **state) {
    (void)init;
    full_state *s = calloc(1, sizeof *s);
    if (!s) return kvs_fail(KVS_ERR_NOMEM, "full: out of memory");
    *state = s;
    return KVS_OK;
}

static void full_free(void *state) { free(state); }

static kvs_status full_prefill(void *state, const kvs_policy_view *view) {
    (void)state;
    (void)view;
    return KVS_OK;
}

static kvs_status full_select(void *state, const kvs_policy_view *view, kvs_policy_sel *sel) {
    const full_state *s = state;
    int64_t m = 0;
    for (int64_t j = s->first; j < view->n; j++) sel->idx[0][m++] = (int32_t)j;
    sel->n[0] = m;
    return KVS_OK;
}

/* On a sliding-window layer the full cache is the window: what the host evicted is gone. */
static kvs_status full_window_evict(void *state, int64_t first) {
    full_state *s = state;
    if (first > s->first) s->first = first;
    return KVS_OK;
}

const struct kvs_policy_ops kvs_policy_full = {
    .version = KVS_POLICY_INTERFACE_VERSION,
    .name = "full",
    .summary = "full KV cache: attend to every position (reference; budget ignored)",
    .is_oracle = 0,
    .granularity = KVS_SEL_PER_KV_HEAD,
    .budget_scope = KVS_BUDGET_NONE,
    .params = NULL,
    .n_params = 0,
    .create = full_create,
    .free = full_free,
    .prefill = full_prefill,
    .select = full_select,
    .stored = NULL, /* stores everything (of the window, on a sliding-window layer) */
    .window_evict = full_window_evict,
};
