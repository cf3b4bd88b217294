/* rocketkv_mt.c — RocketKV-MT, RocketKV's multi-turn variant (../shared/papers/rocketkv.txt §3.5, §3.7, Table 1,
 * App. A.3), as specified in ../shared/POLICY_SPEC.md §2.2 "RocketKV-MT".
 *
 * Stage 1 never evicts: at every turn's prompt, SnapKV (group sum, kernel 63) runs over the WHOLE history plus
 * the new prompt and selects the device set (the turn's prompt budget B_p); the rest of the history stays in a
 * host store that later turns read (readable()). Decode is RocketKV's hybrid sparse attention over the selected
 * set plus this turn's generated tokens. On a single-turn trace it selects exactly as rocketkv and differs only
 * in what it keeps (§4.1). Algorithm, derivation, accounting and ambiguities: rocketkv.c, whose callbacks this
 * file runs with its own parameter table.
 *
 * Storage model [SIM-CHOICE, §3.7: "the full KV cache needs to be stored in the prefill GPU ... only the filtered
 * set needs to be transferred and stored in the decode GPU"]: the history is kept once, device + host = every
 * position (Table 1's 1 + 2/c^((1+r)/2) counts both); a turn's prefill moves the positions its stage 1 selects
 * from the host to the device (h2d) and those it leaves from the device to the host (d2h), charged to the
 * turn's first decode step.
 * Sliding-window layers: rocketkv.c's "Sliding-window layers"; what the window drops leaves the host store too (it
 * does not exist in the model any more), so a later turn's stage 1 selects among the window's positions only and
 * moves none of the dropped ones.
 */
#include "registry.h"
#include "rocketkv_internal.h"

static const kvs_policy_param rocketkv_mt_params[] = {
    {.key = "window", .type = KVS_PARAM_INT, .def = 32, .lo = 1, .hi = 1 << 20,
     .help = "stage-1 observation window (App. A.3: 32 single-turn, 128 multi-turn SCBench)"},
    {.key = "kernel", .type = KVS_PARAM_INT, .def = 63, .lo = 1, .hi = 4095,
     .help = "stage-1 max-pooling kernel (odd; §3.3: 63)"},
    {.key = "r", .type = KVS_PARAM_DOUBLE, .def = -1, .lo = -1, .hi = 1,
     .help = "split factor; -1 = adaptive min(0.2 + 0.06 log2 c, 0.8) (§3.6), 0..1 static"},
    {.key = "rounding", .type = KVS_PARAM_ENUM, .def = KVS_ROCKETKV_PIPELINE, .choices = "pipeline|gptfast",
     .help = "parameter rounding: the accuracy pipeline's compress() or gpt-fast's"},
    {.key = "max_new", .type = KVS_PARAM_INT, .def = 0, .lo = 0, .hi = 1 << 30,
     .help = "max_new_tokens in S = prompt + max_new (per turn); 0 = the trace's capture setting"},
};

static const kvs_policy_preset rocketkv_mt_presets[] = {
    {.name = "scbench", .params = "window=128",
     .help = "RocketKV App. A.3 multi-turn SCBench: observation window 128 (budgets 1024-16384, --budgets t)"},
};

/* The variant is named here; the instance callbacks below are rocketkv's, which read it from the state. */
static kvs_status mt_validate(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget) {
    return kvs_rocketkv_validate(KVS_ROCKETKV_MT, cfg, m, budget);
}
static int mt_notes(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget, char *buf, size_t cap) {
    return kvs_rocketkv_notes(KVS_ROCKETKV_MT, cfg, m, budget, buf, cap);
}
static kvs_status mt_create(const kvs_policy_init *init, void **state) {
    return kvs_rocketkv_create(KVS_ROCKETKV_MT, init, state);
}
static void mt_free(void *state) { kvs_policy_rocketkv.free(state); }
static kvs_status mt_prefill(void *state, const kvs_policy_view *view) { return kvs_policy_rocketkv.prefill(state, view); }
static kvs_status mt_select(void *state, const kvs_policy_view *view, kvs_policy_sel *sel) {
    return kvs_policy_rocketkv.select(state, view, sel);
}
static int64_t mt_stored(void *state, int g, int32_t *out) { return kvs_policy_rocketkv.stored(state, g, out); }
static int64_t mt_readable(void *state, int g, int32_t *out) { return kvs_policy_rocketkv.readable(state, g, out); }
static void mt_account(void *state, const kvs_policy_view *view, const kvs_policy_sel *sel, kvs_policy_cost *out) {
    kvs_policy_rocketkv.account(state, view, sel, out);
}

const struct kvs_policy_ops kvs_policy_rocketkv_mt = {
    .version = KVS_POLICY_INTERFACE_VERSION,
    .name = "rocketkv_mt",
    .summary = "RocketKV-MT: RocketKV whose stage 1 only selects; the rest of the history waits in a host store "
               "for later turns",
    .is_oracle = 0,
    .granularity = KVS_SEL_PER_KV_HEAD,
    .budget_scope = KVS_BUDGET_EVERY_STEP,
    .params = rocketkv_mt_params,
    .n_params = (int)(sizeof rocketkv_mt_params / sizeof rocketkv_mt_params[0]),
    .presets = rocketkv_mt_presets,
    .n_presets = (int)(sizeof rocketkv_mt_presets / sizeof rocketkv_mt_presets[0]),
    .validate = mt_validate,
    .notes = mt_notes,
    .create = mt_create,
    .free = mt_free,
    .prefill = mt_prefill,
    .select = mt_select,
    .stored = mt_stored,
    .readable = mt_readable,
    .account = mt_account,
    .window_evict = kvs_rocketkv_window_evict,
};
