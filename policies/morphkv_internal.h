/* morphkv_internal.h — MorphKV's scoring and sizing rules (policies/morphkv.c), exposed for
 * tests/test_morphkv.c only (STYLE.md rule 1: cross-module internals in *_internal.h). The policy itself is
 * reached through kvs_policy_morphkv (policies/registry.h).
 * Follows ../shared/POLICY_SPEC.md §2.1 steps 4-6 (group scores, fusion Eq. 5/6) and the paper's
 * Algorithm 1; the budget and scaling rules are written up in policies/morphkv.c's header.
 */
#ifndef KVS_POLICIES_MORPHKV_INTERNAL_H
#define KVS_POLICIES_MORPHKV_INTERNAL_H

#include <stdint.h>

/* Parameter choices, in the order of morphkv.c's parameter table. */
enum { KVS_MORPHKV_SUM = 0, KVS_MORPHKV_MAX = 1 };     /* fusion: Eq. 5 / Eq. 6 */
enum { KVS_MORPHKV_PAPER = 0, KVS_MORPHKV_REF = 1 };   /* fidelity (POLICY_SPEC §0.3) */
enum { KVS_MORPHKV_ROWS = 0, KVS_MORPHKV_QZ = 1 };     /* profile store (POLICY_SPEC §2.1 Storage) */

/*! kvs_morphkv_fuse() : the fused score F[j] of n_cand distant candidates from the attention profiles of
 *  n_rows window queries (Algorithm 1's loop and f; POLICY_SPEC §2.1 steps 4-5).
 *  vals: n_rows * group rows, row (r, g) at vals + (r * group + g) * stride, entries 0..n_cand-1 used:
 *    PAPER: probabilities AW_r^g[j] as recorded;  S_r[j] = sum_g AW_r^g[j]  (fp64);
 *    REF:   logits z_r^g[j] = scale q_{r,g}.k_j;   S_r[j] = softmax over the candidates of sum_g z_r^g[j]
 *           (kvs_softmax_f64: fp64 with the max subtracted, so no candidate within ~745 of a row's best
 *           underflows to a tie at 0, as fp32's exp does below ~-87).
 *  F[j] = sum_r S_r[j] (KVS_MORPHKV_SUM) or max_r S_r[j] (KVS_MORPHKV_MAX), in fp64; F = 0 when n_rows = 0.
 *  scratch: n_cand doubles (REF only; may be NULL for PAPER). */
void kvs_morphkv_fuse(int fidelity, int fusion, const float *vals, int64_t stride, int n_rows, int group,
                      int64_t n_cand, double *F, double *scratch);

/* TOP_C (Eq. 7: the C best of F, larger first, the older token among equals, POLICY_SPEC §1.4) is the held list's
 * keep-the-top rule, kvs_held_top_mask() in policies/held.h. */

/*! kvs_morphkv_ctot() : C_tot, the paper's total capacity (recent + distant, the current token excluded), for
 *  a kvsim budget B (attended positions, the current token included) and the eviction trigger factor
 *  evict_after >= 1: the largest C_tot >= 0 whose attended set never exceeds B, i.e. with c = C_tot + 1,
 *  max(c, ceil(evict_after * c) - 1) <= B. evict_after = 1 gives C_tot = B - 1. @return -1 when even
 *  C_tot = 0 exceeds B (evict_after > B + 1). */
int64_t kvs_morphkv_ctot(int64_t budget, double evict_after);

/*! kvs_morphkv_recent() : the recent window R the policy uses: `recent`, scaled by C_tot / paper_ctot
 *  (rounded to nearest, at least 1) when paper_ctot > 0 and C_tot < paper_ctot. */
int64_t kvs_morphkv_recent(int64_t recent, int64_t paper_ctot, int64_t ctot);

#endif /* KVS_POLICIES_MORPHKV_INTERNAL_H */
