/* keydiff_internal.h — KeyDiff's block-wise eviction framework (policies/keydiff.c) for KNorm (policies/knorm.c),
 * which runs it with its own score. STYLE.md rule 1: cross-module internals in *_internal.h; the policies are
 * reached through the registry (policies/registry.h).
 * Follows POLICY_SPEC §2.5 (KeyDiff) and §2.6 B12 (KNorm in the same block-wise framework); keydiff.c's header
 * writes up the framework.
 */
#ifndef KVS_POLICIES_KEYDIFF_INTERNAL_H
#define KVS_POLICIES_KEYDIFF_INTERNAL_H

#include "../common/kvs_math.h"
#include "../sim/policy.h"

/*! kvs_keydiff_create() : an instance of the framework (kvs_policy_ops.create) ranking keys by `kind`
 *  (common/kvs_math.h kvs_key_score: KeyDiff's anchor or pairwise cosine, KNorm's key norm), chosen by the
 *  caller's ops table. `block` and `window_frac` are read from init->cfg by key (both tables have them).
 *  Released with kvs_policy_keydiff.free. */
kvs_status kvs_keydiff_create(const kvs_policy_init *init, kvs_key_score kind, void **state);

/*! kvs_keydiff_norm_scores() : KNorm's retention scores (kvs_policy_ops.scores): -|k| of a held key eviction ranks
 *  (its norm is computed at the first eviction event that sees the key), INFINITY for the protected window, the
 *  current token and a key no event has scored yet. For a KNorm instance only (KeyDiff's scores need every held key,
 *  which scores() does not get). */
int kvs_keydiff_norm_scores(void *state, int g, const int32_t *idx, int64_t n, double *out);

#endif /* KVS_POLICIES_KEYDIFF_INTERNAL_H */
