/* cake_internal.h — the pure parts of CAKE (policies/cake.c) that tests check against POLICY_SPEC_2 §2.2's worked
 * example G-CAKE: the window statistics of one layer (dispersion H_l, shift V_l, pooled group-mean indicator S),
 * the reference's ADJUST rounding and the cascade's final per-layer budgets. STYLE.md rule 1: cross-module
 * internals in *_internal.h; the policy itself is reached through the registry (policies/registry.h).
 */
#ifndef KVS_POLICIES_CAKE_INTERNAL_H
#define KVS_POLICIES_CAKE_INTERNAL_H

#include <stdint.h>

#include "../common/kvs.h"

/*! kvs_cake_head_stats() : one query head's window statistics. z = scaled logits s·q·k, [w][m] row-major: row i is
 *  the window query of candidate m−w+i and sees candidates 0..m−w+i (later entries of the row are not read).
 *  Adds the head's entropy over the non-window columns to *H and its summed unbiased variance (over the w rows)
 *  to *V, and writes the raw indicator mean_i A + gamma·var_u,i A of columns 0..m−w−1 to ind (unpooled).
 *  w >= 1, m > w; with w = 1 the variance is taken as 0 (one row has none). prob: scratch [w][m]. */
void kvs_cake_head_stats(const double *z, int64_t w, int64_t m, double gamma, double *H, double *V, double *ind,
                         double *prob);

/*! kvs_cake_adjust() : POLICY_SPEC_2 §2.2 ADJUST(raw, T, cap, L): truncation, clamp to cap with the excess shared
 *  among the layers below cap (dropped when none is), then the difference to T added to layers below cap or taken
 *  from layers above 1, equally with the remainder to the first ones. out[0..L). */
void kvs_cake_adjust(const double *raw, int L, int64_t T, int64_t cap, int64_t *out);

/*! kvs_cake_budgets() : the final scored-position counts b_l (window excluded) of L layers with preferences
 *  pref[0..L) (all > 0 or the uniform split is taken), total T, cap = P − w. cascade: the minimum over the stages
 *  l..L−1 of the stage budgets (a later stage cannot restore what an earlier one evicted); else one-shot ADJUST.
 *  stages (may be NULL): [L][L] row s = stage s's budgets of layers 0..s (cascade only). KVS_ERR_NOMEM. */
kvs_status kvs_cake_budgets(const double *pref, int L, int64_t T, int64_t cap, int cascade, int64_t *out, int64_t *stages);

#endif /* KVS_POLICIES_CAKE_INTERNAL_H */
