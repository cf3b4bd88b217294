/* hsa.c — Hybrid Sparse Attention alone: RocketKV's second stage without its SnapKV eviction
 * (../shared/papers/rocketkv.txt §3.4, Algorithm 1, App. B.1.1 Fig. 8, where it is compared with Quest and SparQ),
 * as specified in ../shared/POLICY_SPEC.md §2.2 "HSA standalone" and §8 item 2e.
 *
 * Every key stays resident; each decode step estimates the k2 = floor(t/2) best tokens from page min/max
 * summaries read on k1 head dimensions, and attends to them exactly (the algorithm, accounting and ambiguities
 * are rocketkv.c's, whose callbacks this file runs with its own parameter table; kvsim's budget B is the
 * paper's token budget t, estimation traffic included).
 *
 * Parameters the paper does not give for standalone HSA [SIM-CHOICE, POLICY_SPEC §2.2]: split r = 0, so the
 * whole compression goes to stage 2: cap = S, c2 = c = S/t, page Ppg = ceil(sqrt c) (1 when that exceeds c),
 * k1 = floor(d Ppg / c) (pipeline rounding; rounding=gptfast as in rocketkv). S = prompt + max_new_tokens (at
 * most the model's context), re-derived at every turn's prompt, whose pages are rebuilt then.
 * Reads: decode reads no key but the current one (the page summaries hold the rest); stored() = every position.
 * Sliding-window layers: rocketkv.c's "Sliding-window layers" (the resident set is the window; the oldest live page
 * keeps its summary over the keys folded into it; a live set of at most t positions is attended whole once the
 * window slides, so a budget covering the window attends exactly the window).
 */
#include "registry.h"
#include "rocketkv_internal.h"

static const kvs_policy_param hsa_params[] = {
    {.key = "rounding", .type = KVS_PARAM_ENUM, .def = KVS_ROCKETKV_PIPELINE, .choices = "pipeline|gptfast",
     .help = "parameter rounding: the accuracy pipeline's or gpt-fast's (page size, k1, k2)"},
    {.key = "max_new", .type = KVS_PARAM_INT, .def = 0, .lo = 0, .hi = 1 << 30,
     .help = "max_new_tokens in S = prompt + max_new; 0 = the trace's capture setting"},
};

/* The variant is named here; the instance callbacks below are rocketkv's, which read it from the state. No
 * validate(): hsa has no stage-1 parameter to check. */
static int hsa_notes(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget, char *buf, size_t cap) {
    return kvs_rocketkv_notes(KVS_ROCKETKV_HSA, cfg, m, budget, buf, cap);
}
static kvs_status hsa_create(const kvs_policy_init *init, void **state) {
    return kvs_rocketkv_create(KVS_ROCKETKV_HSA, init, state);
}
static void hsa_free(void *state) { kvs_policy_rocketkv.free(state); }
static kvs_status hsa_prefill(void *state, const kvs_policy_view *view) { return kvs_policy_rocketkv.prefill(state, view); }
static kvs_status hsa_select(void *state, const kvs_policy_view *view, kvs_policy_sel *sel) {
    return kvs_policy_rocketkv.select(state, view, sel);
}
static int64_t hsa_stored(void *state, int g, int32_t *out) { return kvs_policy_rocketkv.stored(state, g, out); }
static void hsa_account(void *state, const kvs_policy_view *view, const kvs_policy_sel *sel, kvs_policy_cost *out) {
    kvs_policy_rocketkv.account(state, view, sel, out);
}

const struct kvs_policy_ops kvs_policy_hsa = {
    .version = KVS_POLICY_INTERFACE_VERSION,
    .name = "hsa",
    .summary = "HSA: RocketKV's hybrid sparse attention alone (page min/max on top-k1 dims, k2 = B/2 attended; r = 0)",
    .is_oracle = 0,
    .granularity = KVS_SEL_PER_KV_HEAD,
    .budget_scope = KVS_BUDGET_EVERY_STEP,
    .params = hsa_params,
    .n_params = (int)(sizeof hsa_params / sizeof hsa_params[0]),
    .notes = hsa_notes,
    .create = hsa_create,
    .free = hsa_free,
    .prefill = hsa_prefill,
    .select = hsa_select,
    .stored = hsa_stored,
    .account = hsa_account,
    .window_evict = kvs_rocketkv_window_evict,
};
