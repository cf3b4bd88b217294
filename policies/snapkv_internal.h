/* snapkv_internal.h — SnapKV's instance (policies/snapkv.c) for the policies that run its selection with their
 * own parameter tables and budgets: PyramidKV (pyramidkv.c, per-layer budgets) and Ada-KV (adakv.c, per-head
 * budgets). STYLE.md rule 1: cross-module internals in *_internal.h; the policies are reached through the
 * registry (policies/registry.h).
 * Follows POLICY_SPEC §2.6 B5 and the appendix rows "SnapKV", "PyramidKV" and "Ada-KV"; snapkv.c's header
 * writes up the selection.
 */
#ifndef KVS_POLICIES_SNAPKV_INTERNAL_H
#define KVS_POLICIES_SNAPKV_INTERNAL_H

#include <stdint.h>

#include "../sim/policy.h"

/* The layout and group reduction of an instance: a set per query head, or one per KV head scored with the
 * group's mean or max. snapkv's and pyramidkv's `gqa` choices (expand|mean|max) are in this order. */
enum { KVS_SNAPKV_EXPAND = 0, KVS_SNAPKV_MEAN = 1, KVS_SNAPKV_MAX = 2 };

/*! kvs_snapkv_create() : a SnapKV instance (kvs_policy_ops.create) with the caller's layout `gqa` (KVS_SNAPKV_*)
 *  and prompt block size `block` (0: the prompt at once; snapkv's `block` parameter, 0 for the others). The
 *  `window`, `kernel` and `pool` parameters are read from init->cfg by key: every table that runs SnapKV has
 *  them, with snapkv's meaning and choice order. Released with kvs_policy_snapkv.free. */
kvs_status kvs_snapkv_create(const kvs_policy_init *init, int gqa, int64_t block, void **state);

/*! kvs_snapkv_retention() : the instance's retention scores (kvs_policy_ops.scores): a kept prompt position's pooled
 *  observation score, INFINITY for the window and generated tokens. */
int kvs_snapkv_retention(void *state, int g, const int32_t *idx, int64_t n, double *out);

#endif /* KVS_POLICIES_SNAPKV_INTERNAL_H */
