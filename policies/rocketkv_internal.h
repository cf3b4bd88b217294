/* rocketkv_internal.h — RocketKV's implementation shared by its three policies (policies/rocketkv.c, hsa.c,
 * rocketkv_mt.c: each ops table names its variant explicitly) and its parameter derivation, exposed for
 * tests/test_rocketkv.c (STYLE.md rule 1: cross-module internals in *_internal.h). The policies themselves are
 * reached through the registry (policies/registry.h).
 * Follows ../shared/papers/rocketkv.txt §3.6 (adaptive split, page size and head ratio, Table 1) and
 * ../shared/POLICY_SPEC.md §2.2 "Hyper-parameters and derivation" (the reference pipeline's compress() and the
 * gpt-fast variant), §7 G2 (golden values).
 */
#ifndef KVS_POLICIES_ROCKETKV_INTERNAL_H
#define KVS_POLICIES_ROCKETKV_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "../sim/policy.h"

/* Rounding of the derivation (the `rounding` parameter, in its table order). */
enum { KVS_ROCKETKV_PIPELINE = 0, KVS_ROCKETKV_GPTFAST = 1 };

/* Stage parameters for one sequence (POLICY_SPEC §2.2), exactly as the reference computes them: no clamp of
 * kvsim's own is applied here (the policy raises k1 and k2 to at least 1 and B_p to at least 1; its notes()
 * say when). */
typedef struct {
    double c;              /* overall compression ratio max(1, S/t) */
    double r;              /* split factor: stage 1 compresses c^r, stage 2 c^(1-r) */
    int64_t cap;           /* tokens left after stage 1 plus the generated ones: max(floor(S/c^r), min(2 max_new, S)) */
    int64_t prompt_budget; /* B_p: prompt positions stage 1 keeps, observation window included */
    int64_t k2;            /* tokens attended exactly per step (half the budget) */
    double c2;             /* stage-2 ratio max(1, cap/t), about c^(1-r) */
    int64_t page;          /* Ppg: page size along the sequence */
    int64_t k1;            /* head dimensions read by the estimate */
} kvs_rocketkv_params;

/*! kvs_rocketkv_split() : the adaptive split factor r = min(0.2 + 0.06 log2 c, 0.8) (§3.6; c >= 1). */
double kvs_rocketkv_split(double c);

/*! kvs_rocketkv_derive() : the parameters for sequence length S (prompt + max_new, at most the model's context),
 *  token budget t >= 1, max_new generated tokens, head dimension d, split r_fixed (< 0: adaptive) and rounding
 *  (KVS_ROCKETKV_PIPELINE: the accuracy pipeline's compress() and rocket.py; KVS_ROCKETKV_GPTFAST: gpt-fast's
 *  get_params_for_token_budget, Python round = round-half-even), into *out. */
void kvs_rocketkv_derive(int64_t S, int64_t t, int64_t max_new, int32_t d, double r_fixed, int rounding,
                         kvs_rocketkv_params *out);

/*! kvs_rocketkv_table1() : paper Table 1 for compression ratio c and split r, normalised to Full-KV with the
 *  auxiliary data counted relative to the K cache alone (the table's convention, POLICY_SPEC §2.2 "Convention
 *  behind Table 1"; page rounding ignored): storage 1/c^r + 2/c^((1+r)/2), RocketKV-MT 1 + 2/c^((1+r)/2),
 *  traffic 1/c. Any output pointer may be NULL. */
void kvs_rocketkv_table1(double c, double r, double *storage, double *storage_mt, double *traffic);

/* ---- the shared implementation ------------------------------------------------------------------------ */

/* Which policy runs the implementation: passed by each ops table's own create/validate/notes (the variant is never
 * inferred from the configuration). The instance callbacks (free, prefill, select, stored, readable, account) are
 * kvs_policy_rocketkv's, which read the variant from the state that create() made. */
typedef enum {
    KVS_ROCKETKV_TWO_STAGE = 0, /* rocketkv: SnapKV stage 1 evicts at each prompt, then hybrid sparse attention */
    KVS_ROCKETKV_HSA = 1,       /* hsa: stage 2 alone, every key resident (r = 0); no stage-1 parameters */
    KVS_ROCKETKV_MT = 2,        /* rocketkv_mt: stage 1 only selects, the rest of the history in a host store */
} kvs_rocketkv_variant;

/*! kvs_rocketkv_validate() : the stage-1 parameters of cfg (kernel odd, r = -1 or in [0, 1]); KVS_OK for
 *  KVS_ROCKETKV_HSA, which has none. KVS_ERR_INVALID_ARG naming the policy and parameter. */
kvs_status kvs_rocketkv_validate(kvs_rocketkv_variant v, const kvs_policy_config *cfg, const kvs_policy_model *m,
                                 int64_t budget);

/*! kvs_rocketkv_notes() : the degenerate settings of variant v's configuration at this budget (kvs_policy_ops.notes). */
int kvs_rocketkv_notes(kvs_rocketkv_variant v, const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget,
                       char *buf, size_t cap);

/*! kvs_rocketkv_window_evict() : the host's eviction on a sliding-window layer (kvs_policy_ops.window_evict) of any
 *  variant's instance: rocketkv.c "Sliding-window layers". */
kvs_status kvs_rocketkv_window_evict(void *state, int64_t first);

/*! kvs_rocketkv_create() : an instance of variant v (kvs_policy_ops.create); released with kvs_policy_rocketkv.free. */
kvs_status kvs_rocketkv_create(kvs_rocketkv_variant v, const kvs_policy_init *init, void **state);

#endif /* KVS_POLICIES_ROCKETKV_INTERNAL_H */
