/* registry.c — the one table of replay policies (STYLE.md rule 5: a static const registry array, as zstd's
 * strategy table). `kvsim replay --policy NAME` and the conformance test look policies up here.
 * To add a policy: one line below and one extern in registry.h (see sim/policy.h "How to add a policy").
 */
#include "registry.h"

static const struct kvs_policy_ops *const registry[] = {
    &kvs_policy_full,
    &kvs_policy_window,
    &kvs_policy_streaming,
    &kvs_policy_h2o,
    &kvs_policy_tova,
    &kvs_policy_topk,
    /* other engineers: add `&kvs_policy_<name>,` lines below */
    &kvs_policy_scissorhands,
    &kvs_policy_snapkv,
    &kvs_policy_pyramidkv,
    &kvs_policy_adakv,
    &kvs_policy_keydiff,
    &kvs_policy_knorm,
    &kvs_policy_morphkv,
    &kvs_policy_keyformer,
    &kvs_policy_d2o,
    &kvs_policy_rocketkv,
    &kvs_policy_rocketkv_mt,
    &kvs_policy_hsa,
    &kvs_policy_quest,
    &kvs_policy_sparq,
    &kvs_policy_synckv,
};

int kvs_policy_count(void) { return (int)(sizeof registry / sizeof registry[0]); }

const struct kvs_policy_ops *kvs_policy_at(int i) {
    if (i < 0 || i >= kvs_policy_count()) return NULL;
    return registry[i];
}
