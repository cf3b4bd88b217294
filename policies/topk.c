/* topk.c — Exact-TopK ORACLE (POLICY_SPEC §2.6 B2; RocketKV §4.1 and App. A.3, reference topk.py).
 *
 * ORACLE: it reads the exact full-attention probabilities of the current query (view->full_probs), which no
 * real system has before attending. It is an upper-bound reference and is labelled "oracle" in every output.
 * At each decode step S_t = the B positions with the highest full-attention probability:
 *  - gqa=group (default, as the task brief asks): probabilities summed over the group's query heads, one set
 *    per KV head;
 *  - gqa=head (RocketKV's reference topk_forward): a set per query head.
 * Ties go to the older position (§1.4). The current token is included only if it ranks in the top B.
 * Prefill is dense (no compression: "prefill dense" in the appendix); the whole cache stays resident.
 * Accounting (§3): storage = the full cache (n slots, stored once, also in head mode: a selection policy's
 * lists index one shared store); traffic = the attended K/V (the paper's "estimation is free"); in head mode
 * the union of the G sets is what is physically read.
 * Sliding-window layers (sim/replay.h): the full attention of a position before the window is exactly 0, so the
 * top B of the whole row never reaches behind the window once B is capped at the window's positions (after the
 * host's window_evict: B' = min(B, n - first)). An in-window probability that underflows to exactly 0 would tie
 * with those zeros and lose to the older position: the selection check then fails the run (never a silent error).
 */
#include <stdlib.h>
#include <string.h>

#include "../common/kvs_math.h"
#include "../sim/policy_memo.h"
#include "registry.h"

enum { TOPK_GROUP = 0, TOPK_HEAD = 1 };

static const kvs_policy_param topk_params[] = {
    {.key = "gqa", .type = KVS_PARAM_ENUM, .def = TOPK_GROUP, .choices = "group|head",
     .help = "group: top-B of the group-summed full attention per KV head; head: top-B per query head"},
};

typedef struct {
    int64_t budget;
    int mode, group;
    kvs_policy_model model;
    float *sum;      /* [cap] */
    char *mark;      /* [cap] union scratch */
    int64_t cap;
    int64_t first;   /* positions before it were evicted by the host (sliding-window layer); 0 otherwise */
} topk_state;

static kvs_policy_granularity topk_layout(const kvs_policy_config *cfg) {
    return (int)kvs_policy_param_get(cfg, "gqa") == TOPK_HEAD ? KVS_SEL_PER_QUERY_HEAD : KVS_SEL_PER_KV_HEAD;
}

static void topk_free(void *state) {
    topk_state *s = state;
    if (!s) return;
    free(s->sum);
    free(s->mark);
    free(s);
}

static kvs_status topk_create(const kvs_policy_init *init, void **state) {
    topk_state *s = calloc(1, sizeof *s);
    if (!s) return kvs_fail(KVS_ERR_NOMEM, "topk: out of memory");
    s->budget = init->budget;
    s->mode = (int)kvs_policy_param_get(init->cfg, "gqa");
    s->group = init->model->group;
    s->model = *init->model;
    s->cap = init->model->n_positions > 0 ? init->model->n_positions : 1;
    s->sum = malloc((size_t)s->cap * sizeof(float));
    s->mark = malloc((size_t)s->cap);
    if (!s->sum || !s->mark) {
        topk_free(s);
        return kvs_fail(KVS_ERR_NOMEM, "topk: out of memory");
    }
    *state = s;
    return KVS_OK;
}

static kvs_status topk_prefill(void *state, const kvs_policy_view *view) {
    (void)state;
    (void)view;
    return KVS_OK;
}

static kvs_status topk_select(void *state, const kvs_policy_view *view, kvs_policy_sel *sel) {
    topk_state *s = state;
    if (!view->full_probs) return kvs_fail(KVS_ERR_STATE, "topk: the oracle was not given full attention");
    if (view->n > s->cap) return kvs_fail(KVS_ERR_RANGE, "topk: position %lld beyond the trace", (long long)view->n);
    int64_t k = s->budget < view->n - s->first ? s->budget : view->n - s->first;
    /* kvs_policy_topk_sorted: kvs_topk_sorted's set, shared through the view's memo with the task's other
     * budgets (sim/BENCH.md "Work shared between a task's configurations"); it reads only full_probs, which this
     * oracle already sees */
    if (s->mode == TOPK_GROUP) {
        /* each position's sum from +0 over the heads in head order */
        kvs_policy_topk_sorted(view, view->full_probs, (size_t)s->group, (size_t)view->n, (size_t)k, s->sum,
                               sel->idx[0]);
        sel->n[0] = k;
    } else {
        for (int g = 0; g < s->group; g++) {
            kvs_policy_topk_sorted(view, view->full_probs + (size_t)g * (size_t)view->n, 1, (size_t)view->n, (size_t)k,
                                   s->sum, sel->idx[g]);
            sel->n[g] = k;
        }
    }
    return KVS_OK;
}

static kvs_status topk_window_evict(void *state, int64_t first) {
    topk_state *s = state;
    if (first > s->first) s->first = first;
    return KVS_OK;
}

/* Cost model v2 (policy.h kvs_policy_cost): the resident KV is the engine's default (stored() is NULL: every
 * position seen, once); in head mode the K/V read is the union of the G sets, each position read once, not the
 * default sum over the lists. No auxiliary state, no transfers. */
static void topk_account(void *state, const kvs_policy_view *view, const kvs_policy_sel *sel, kvs_policy_cost *out) {
    topk_state *s = state;
    if (sel->n_lists == 1) return;
    int64_t read = 0;
    memset(s->mark, 0, (size_t)view->n);
    for (int g = 0; g < sel->n_lists; g++)
        for (int64_t j = 0; j < sel->n[g]; j++) {
            int32_t p = sel->idx[g][j];
            if (!s->mark[p]) {
                s->mark[p] = 1;
                read++;
            }
        }
    out->read_kv_bytes = kvs_policy_kv_bytes(&s->model, (double)read);
}

const struct kvs_policy_ops kvs_policy_topk = {
    .version = KVS_POLICY_INTERFACE_VERSION,
    .name = "topk",
    .summary = "Exact-TopK ORACLE: the B positions with the highest full attention (upper bound, not realisable)",
    .is_oracle = 1,
    .granularity = KVS_SEL_PER_KV_HEAD,
    .budget_scope = KVS_BUDGET_EVERY_STEP,
    .params = topk_params,
    .n_params = (int)(sizeof topk_params / sizeof topk_params[0]),
    .layout = topk_layout,
    .create = topk_create,
    .free = topk_free,
    .prefill = topk_prefill,
    .select = topk_select,
    .stored = NULL, /* keeps the whole cache */
    .account = topk_account,
    .window_evict = topk_window_evict,
};
