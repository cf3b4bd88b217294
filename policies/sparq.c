/* sparq.c — SparQ Attention (Ribar et al., ICML'24) as a baseline of RocketKV (../shared/papers/rocketkv.txt §3.4,
 * §4, App. A.3, Table 1, App. B.1.1), specified in ../shared/POLICY_SPEC.md §2.6 B10, §3 (SparQ row) and the
 * appendix row "SparQ".
 *
 * Every key stays resident (plus SparQ's second, dimension-major copy of K). Each decode step, per query head:
 *  1. i1 = the r dimensions with the largest |q_i| (ties to the lower dimension; kvs_qdims_topk);
 *  2. approximate scores s_j = softmax_j(q[i1].k_j[i1] / tau), tau = sqrt(d sum_{i1}|q_i| / sum_i |q_i|)
 *     (kvs_page_scores on pages of one key, kvs_sparq_temperature);
 *  3. i2 = the k tokens with the largest s (ties to the older token), attended exactly.
 *
 * Ambiguities resolved (paper / reference / what we do):
 *  - Parameters: split=even (default; RocketKV App. A.3 "we evenly split the token budget", POLICY_SPEC B10
 *    [RECON]): kvsim's B is the token budget t; the estimate reads r n elements = t/2 KV pairs, so
 *    r = floor(t d / S) (within [1, d]) and k = floor(t/2), S = prompt + max_new_tokens (at most the model's
 *    context), re-derived at every turn's prompt. split=attend is SparQ's own setting (appendix: r = round(d/8),
 *    the budget counts attended tokens, k = B). The `r` parameter fixes r instead.
 *  - GQA (unspecified by both papers): gqa=head (default, POLICY_SPEC B10: SparQ is per head) selects per query
 *    head, so a GQA group reads up to G times the budget (notes() says so); gqa=group is HSA's treatment: i1 from
 *    sum_g |q_g|, the heads' softmaxes summed, one set per KV head.
 *  - Output: SparQ's step 5 mixes the running mean of V into the output with weight 1 - sum_{i2} s (a correction
 *    for the mass left out). kvsim's engine computes plain attention over the selected set, so that correction is
 *    NOT modelled (RocketKV's HSA omits it too); neither its d-element mean nor its reads are counted. In head
 *    mode the softmax is monotone, so step 3 ranks the partial dot products directly.
 *  - Ties: dimensions and tokens to the lower index (POLICY_SPEC §1.4).
 *
 * Storage and traffic (POLICY_SPEC §3 "SparQ"; Table 1's 2 with the K-normalised convention): KV = every position;
 * aux = the second K copy, d n elements in the KV element size; reads = the attended K/V plus r n elements of
 * the copy per estimating head (G of them in head mode, one in group mode); writes = the new K/V plus its copy
 * (d); no estimate when every token fits the quota. Transient: the scores, (G+1) n aux elements. The estimate
 * reads every key's r columns, so stored() = readable() = every position (the engine's default).
 *
 * Sliding-window layers (sim/replay.h): positions before the host's `first` (window_evict) leave the key copy and the
 * candidates: the estimate reads, softmaxes (group mode) and ranks only [first, n), so no selection reaches behind
 * the window, and the aux copy counts the window's keys. r is still derived from S (the policy does not know W), so
 * on a window the estimate reads fewer than t/2 KV pairs. Once the window slides, a live set of at most t = B
 * positions is attended whole with no estimate [SIM-CHOICE, as quest.c]: its reads fit the token budget, and a budget
 * covering the window attends exactly the window; a full-attention layer keeps the quota rule (results unchanged).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../common/kvs_math.h"
#include "registry.h"

enum { SPARQ_EVEN = 0, SPARQ_ATTEND = 1 };
enum { SPARQ_HEAD = 0, SPARQ_GROUP = 1 };

static const kvs_policy_param sparq_params[] = {
    {.key = "r", .type = KVS_PARAM_INT, .def = 0, .lo = 0, .hi = 1 << 16,
     .help = "query dimensions of the estimate (at most d); 0 = split=even: floor(t d/S), split=attend: round(d/8)"},
    {.key = "split", .type = KVS_PARAM_ENUM, .def = SPARQ_EVEN, .choices = "even|attend",
     .help = "even: B = the token budget t, floor(t/2) attended (RocketKV); attend: B tokens attended (SparQ)"},
    {.key = "gqa", .type = KVS_PARAM_ENUM, .def = SPARQ_HEAD, .choices = "head|group",
     .help = "head: a selection per query head (SparQ); group: HSA's group sums, one set per KV head"},
    {.key = "max_new", .type = KVS_PARAM_INT, .def = 0, .lo = 0, .hi = 1 << 30,
     .help = "split=even, r=0: max_new_tokens in S = prompt + max_new; 0 = the trace's capture setting"},
};

static const kvs_policy_preset sparq_presets[] = {
    {.name = "reference", .params = "r=0,split=attend,gqa=head",
     .help = "SparQ's own setting: r = round(d/8) dimensions, the budget counts attended tokens (the reference's "
             "k = S/16 tokens: choose --budgets for the trace)"},
};

static kvs_policy_granularity sparq_layout(const kvs_policy_config *cfg) {
    return (int)kvs_policy_param_get(cfg, "gqa") == SPARQ_HEAD ? KVS_SEL_PER_QUERY_HEAD : KVS_SEL_PER_KV_HEAD;
}

/* r for a context of n positions at a prompt's end. */
static int64_t sparq_r(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t t, int64_t n) {
    int64_t d = m->head_dim, r = (int64_t)kvs_policy_param_get(cfg, "r");
    if (r == 0 && (int)kvs_policy_param_get(cfg, "split") == SPARQ_ATTEND) r = (int64_t)nearbyint((double)d / 8.0);
    if (r == 0) {
        int64_t S = kvs_policy_seq_len(m, n, kvs_policy_max_new(m, (int64_t)kvs_policy_param_get(cfg, "max_new")));
        r = (int64_t)floor((double)t * (double)d / (double)S);
    }
    if (r < 1) r = 1;
    return r > d ? d : r;
}

static int64_t sparq_quota(const kvs_policy_config *cfg, int64_t t) {
    int64_t k = (int)kvs_policy_param_get(cfg, "split") == SPARQ_EVEN ? t / 2 : t;
    return k < 1 ? 1 : k;
}

static int sparq_notes(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget, char *buf, size_t cap) {
    int64_t P = m->prompt_len > 0 ? m->prompt_len : 1, r = sparq_r(cfg, m, budget, P);
    int n = 0;
    if ((int)kvs_policy_param_get(cfg, "gqa") == SPARQ_HEAD && m->group > 1)
        n += kvs_policy_note(buf, cap, "gqa=head: each of the %d query heads of a group estimates and attends on its "
                                       "own, so a group reads up to %d x the budget (RocketKV's t is per group; "
                                       "gqa=group keeps it)",
                             m->group, m->group);
    if (r >= m->head_dim)
        n += kvs_policy_note(buf, cap, "r = d = %d: the estimate is the exact logits (no dimension is dropped)",
                             m->head_dim);
    if ((int64_t)kvs_policy_param_get(cfg, "r") > m->head_dim)
        n += kvs_policy_note(buf, cap, "r=%lld exceeds head_dim %d: r = %d", (long long)kvs_policy_param_get(cfg, "r"),
                             m->head_dim, m->head_dim);
    if (budget == 1 && (int)kvs_policy_param_get(cfg, "split") == SPARQ_EVEN)
        n += kvs_policy_note(buf, cap, "budget 1: floor(t/2) = 0 attended tokens raised to 1");
    return n;
}

typedef struct {
    kvs_policy_model model;
    kvs_policy_config cfg;
    int mode, group, d;
    int64_t budget, quota, r;
    int32_t *dims;         /* [d] */
    double *dscr;          /* [d] */
    double *ps, *grp;      /* [cap] */
    int32_t *rank;         /* [cap] */
    int64_t cap;
    int st_est;            /* the step just selected estimated (for account()) */
    int64_t first;         /* positions before it were evicted by the host (sliding-window layer); 0 otherwise */
} sparq_state;

static void sparq_free(void *state) {
    sparq_state *s = state;
    if (!s) return;
    free(s->dims);
    free(s->dscr);
    free(s->ps);
    free(s->grp);
    free(s->rank);
    free(s);
}

static kvs_status sparq_reserve(sparq_state *s, int64_t n) {
    if (n <= s->cap) return KVS_OK;
    int64_t cap = s->cap ? s->cap : 256;
    while (cap < n) cap *= 2;
    double *ps = realloc(s->ps, (size_t)cap * sizeof *ps);
    if (ps) s->ps = ps;
    double *grp = ps ? realloc(s->grp, (size_t)cap * sizeof *grp) : NULL;
    if (grp) s->grp = grp;
    int32_t *rank = grp ? realloc(s->rank, (size_t)cap * sizeof *rank) : NULL;
    if (!rank) return kvs_fail(KVS_ERR_NOMEM, "sparq: out of memory");
    s->rank = rank;
    s->cap = cap;
    return KVS_OK;
}

static kvs_status sparq_create(const kvs_policy_init *init, void **state) {
    sparq_state *s = calloc(1, sizeof *s);
    if (!s) return kvs_fail(KVS_ERR_NOMEM, "sparq: out of memory");
    s->model = *init->model;
    s->cfg = *init->cfg;
    s->mode = (int)kvs_policy_param_get(init->cfg, "gqa");
    s->group = init->model->group;
    s->d = init->model->head_dim;
    s->budget = init->budget;
    s->quota = sparq_quota(init->cfg, init->budget);
    s->r = sparq_r(init->cfg, init->model, init->budget, init->model->prompt_len > 0 ? init->model->prompt_len : 1);
    s->dims = malloc((size_t)s->d * sizeof *s->dims);
    s->dscr = malloc((size_t)s->d * sizeof *s->dscr);
    kvs_status st = s->dims && s->dscr ? sparq_reserve(s, 256) : kvs_fail(KVS_ERR_NOMEM, "sparq: out of memory");
    if (st != KVS_OK) {
        sparq_free(s);
        return st;
    }
    *state = s;
    return KVS_OK;
}

static kvs_status sparq_prefill(void *state, const kvs_policy_view *view) {
    sparq_state *s = state;
    s->r = sparq_r(&s->cfg, &s->model, s->budget, view->n);
    return KVS_OK;
}

static kvs_status sparq_select(void *state, const kvs_policy_view *view, kvs_policy_sel *sel) {
    sparq_state *s = state;
    /* the live keys [first, n): every position on a full-attention layer */
    int64_t n = view->n - s->first;
    const float *keys = view->k + (size_t)s->first * (size_t)s->d;
    kvs_status st = sparq_reserve(s, n);
    if (st != KVS_OK) return st;
    size_t d = (size_t)s->d, r = (size_t)s->r;
    s->st_est = s->first > 0 ? n > s->budget : n > s->quota;
    if (!s->st_est) {
        for (int li = 0; li < sel->n_lists; li++) {
            for (int64_t j = 0; j < n; j++) sel->idx[li][j] = (int32_t)(s->first + j);
            sel->n[li] = n;
        }
        return KVS_OK;
    }
    /* Pages of one key: kmin = kmax = the key, so kvs_page_scores is the partial dot product q[i1].k[i1]. */
    if (s->mode == SPARQ_HEAD) {
        for (int g = 0; g < s->group; g++) {
            const float *q = view->q + (size_t)g * d;
            kvs_qdims_topk(q, 1, d, r, s->dims, NULL, s->dscr);
            kvs_page_scores(q, s->dims, r, NULL, keys, keys, d, (size_t)n, s->ps);
            sel->n[g] = kvs_page_select(s->ps, (size_t)n, 1, (size_t)n, (size_t)s->quota, sel->idx[g], s->rank);
        }
    } else {
        kvs_qdims_topk(view->q, (size_t)s->group, d, r, s->dims, NULL, s->dscr);
        memset(s->grp, 0, (size_t)n * sizeof *s->grp);
        for (int g = 0; g < s->group; g++) {
            const float *q = view->q + (size_t)g * d;
            kvs_page_scores(q, s->dims, r, NULL, keys, keys, d, (size_t)n, s->ps);
            kvs_page_softmax_add(s->ps, (size_t)n, 1, (size_t)n, kvs_sparq_temperature(q, s->dims, r, d), s->grp);
        }
        sel->n[0] = kvs_page_select(s->grp, (size_t)n, 1, (size_t)n, (size_t)s->quota, sel->idx[0], s->rank);
    }
    if (s->first > 0) /* slots of the live keys -> positions */
        for (int li = 0; li < sel->n_lists; li++)
            for (int64_t j = 0; j < sel->n[li]; j++) sel->idx[li][j] += (int32_t)s->first;
    return KVS_OK;
}

static kvs_status sparq_window_evict(void *state, int64_t first) {
    sparq_state *s = state;
    if (first > s->first) s->first = first;
    return KVS_OK;
}

/* Cost model v2 (header "Storage and traffic"); KV storage and attended reads stay the engine's default. */
static void sparq_account(void *state, const kvs_policy_view *view, const kvs_policy_sel *sel, kvs_policy_cost *out) {
    sparq_state *s = state;
    (void)sel;
    double kb = s->model.kv_bytes, d = s->d, n = (double)(view->n - s->first); /* the live keys */
    double estimators = s->mode == SPARQ_HEAD ? (double)s->group : 1.0;
    out->aux_bytes = d * n * kb;
    out->read_aux_bytes = out->read_aux_unfused_bytes = s->st_est ? estimators * (double)s->r * n * kb : 0;
    out->write_bytes = kvs_policy_kv_bytes(&s->model, 1) + d * kb; /* one shared store, not one per list */
    out->transient_bytes = s->st_est ? (double)(s->group + 1) * n * s->model.aux_bytes : 0;
}

const struct kvs_policy_ops kvs_policy_sparq = {
    .version = KVS_POLICY_INTERFACE_VERSION,
    .name = "sparq",
    .summary = "SparQ: top-r |q| dimensions estimate the attention, the top-k tokens get exact attention "
               "(even split: B/2 attended)",
    .is_oracle = 0,
    .granularity = KVS_SEL_PER_QUERY_HEAD,
    .budget_scope = KVS_BUDGET_EVERY_STEP,
    .params = sparq_params,
    .n_params = (int)(sizeof sparq_params / sizeof sparq_params[0]),
    .presets = sparq_presets,
    .n_presets = (int)(sizeof sparq_presets / sizeof sparq_presets[0]),
    .layout = sparq_layout,
    .notes = sparq_notes,
    .create = sparq_create,
    .free = sparq_free,
    .prefill = sparq_prefill,
    .select = sparq_select,
    .account = sparq_account,
    .window_evict = sparq_window_evict,
};
