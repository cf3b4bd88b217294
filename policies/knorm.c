/* knorm.c — KNorm / KeyL2Norm (Devoto et al., "A simple and effective L2 norm-based strategy for KV cache
 * compression", arXiv 2406.11430, KeyDiff's reference [9]), the baseline of KeyDiff Table 10, as specified in
 * POLICY_SPEC §2.6 B12: keep the keys of smallest L2 norm (score -|k|, common/kvs_math.h kvs_key_scores
 * KVS_KEY_SCORE_L2NORM), "in the same block-wise framework as KeyDiff".
 *
 * The framework is keydiff.c's: its instance made by kvs_keydiff_create (keydiff_internal.h) with the key-norm
 * score, and its callbacks run with this file's parameter table (block, window_frac; as pyramidkv.c runs
 * snapkv.c's). Everything keydiff.c's header says about the budget (C = B - 1 held after every
 * eviction, prefill peak C + block), block prompt processing (Eq. 6, block 128), decode (attend-then-evict),
 * the sliding window carved out of the budget, ties (older position kept), multi-turn, GQA (one set per KV
 * head) and accounting (transient scores: n_c at aux_bytes) holds here.
 *
 * Ambiguities resolved: KeyDiff's Table 10 does not give KNorm's settings beyond the shared block size, so the
 * defaults are KeyDiff's (block 128, no window). Without a window, keeping the C smallest norms block after
 * block keeps exactly the C smallest norms of every position seen so far, whatever the block size (the
 * smallest C of a union are the smallest C of (the smallest C of a part) and the rest): the block size changes
 * only what prefill attention sees, not what is kept. Ties: the older position is kept.
 */
#include "keydiff_internal.h"
#include "registry.h"

static const kvs_policy_param knorm_params[] = {
    {.key = "block", .type = KVS_PARAM_INT, .def = 128, .lo = 1, .hi = 1 << 24,
     .help = "prompt block size M_blk: the prompt is processed (and evicted) block by block (KeyDiff Eq. 6)"},
    {.key = "window_frac", .type = KVS_PARAM_DOUBLE, .def = 0, .lo = 0, .hi = 1,
     .help = "share of the budget kept as a sliding window of the newest tokens"},
};

/* No validate(): KeyDiff's only check (pairwise with a raw anchor) concerns parameters KNorm does not have. */
static int knorm_notes(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget, char *buf, size_t cap) {
    return kvs_policy_keydiff.notes(cfg, m, budget, buf, cap);
}
static kvs_status knorm_create(const kvs_policy_init *init, void **state) {
    return kvs_keydiff_create(init, KVS_KEY_SCORE_L2NORM, state);
}
static void knorm_free(void *state) { kvs_policy_keydiff.free(state); }
static kvs_status knorm_prefill(void *state, const kvs_policy_view *view) {
    return kvs_policy_keydiff.prefill(state, view);
}
static int64_t knorm_prefill_block(void *state) { return kvs_policy_keydiff.prefill_block(state); }
static kvs_status knorm_select(void *state, const kvs_policy_view *view, kvs_policy_sel *sel) {
    return kvs_policy_keydiff.select(state, view, sel);
}
static kvs_status knorm_observe(void *state, const kvs_policy_view *view, const kvs_policy_sel *sel,
                                const float *const *probs) {
    return kvs_policy_keydiff.observe(state, view, sel, probs);
}
/* the framework's: the oldest held positions leave first, before the next eviction */
static kvs_status knorm_window_evict(void *state, int64_t first) { return kvs_policy_keydiff.window_evict(state, first); }
static int64_t knorm_stored(void *state, int g, int32_t *out) { return kvs_policy_keydiff.stored(state, g, out); }
static void knorm_account(void *state, const kvs_policy_view *view, const kvs_policy_sel *sel, kvs_policy_cost *out) {
    kvs_policy_keydiff.account(state, view, sel, out);
}

const struct kvs_policy_ops kvs_policy_knorm = {
    .version = KVS_POLICY_INTERFACE_VERSION,
    .name = "knorm",
    .summary = "KNorm (KeyL2Norm): keep the keys of smallest L2 norm, KeyDiff's block-wise framework",
    .is_oracle = 0,
    .granularity = KVS_SEL_PER_KV_HEAD,
    .budget_scope = KVS_BUDGET_EVERY_STEP,
    .params = knorm_params,
    .n_params = (int)(sizeof knorm_params / sizeof knorm_params[0]),
    .notes = knorm_notes,
    .create = knorm_create,
    .free = knorm_free,
    .prefill = knorm_prefill,
    .select = knorm_select,
    .observe = knorm_observe,
    .stored = knorm_stored,
    .prefill_block = knorm_prefill_block,
    .account = knorm_account,
    .scores = kvs_keydiff_norm_scores,
    .window_evict = knorm_window_evict,
};
