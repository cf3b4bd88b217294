/* synckv_internal.h — SyncKV's budget derivation (policies/synckv.c), exposed for tests/test_synckv.c (STYLE.md
 * rule 1: cross-module internals in *_internal.h). The policy itself is reached through the registry.
 * Follows ../shared/POLICY_SPEC.md §2.4 "Budget from Mem%" and §7 G5, ../shared/papers/synckv.txt §5.1:
 * per layer of H units (KV groups) with N_r representative units keeping their full cache, a device share Mem%
 * of the full KV at prefill (n = P) leaves each non-representative unit k tokens,
 *     Mem% = [N_r P + (H - N_r) k] / (H P),   k = floor((Mem% H - N_r) P / (H - N_r)),
 * and k <= 0 is infeasible (the representatives alone exceed Mem%; §8.4a).
 */
#ifndef KVS_POLICIES_SYNCKV_INTERNAL_H
#define KVS_POLICIES_SYNCKV_INTERNAL_H

#include <stdint.h>

/*! kvs_synckv_k_ratio() : k/P = (mem H - N_r) / (H - N_r) before flooring (G5's table; negative or zero =
 *  infeasible). mem is a fraction (0.3 for 30 %); requires 1 <= nr < H. */
double kvs_synckv_k_ratio(double mem, int32_t H, int32_t nr);

/*! kvs_synckv_k_mem() : k = floor((mem H - N_r) P / (H - N_r)) for a Mem% given as a fraction (a 1e-9 guard
 *  against the binary rounding of e.g. 0.3); may be <= 0 (infeasible). Requires 1 <= nr < H, P >= 1. */
int64_t kvs_synckv_k_mem(double mem, int64_t P, int32_t H, int32_t nr);

/*! kvs_synckv_k_budget() : the same k for kvsim's budget B (device KV tokens per KV head at prefill, so
 *  Mem% = B/P), in exact integers: floor((B H - N_r P) / (H - N_r)); may be <= 0 (infeasible). */
int64_t kvs_synckv_k_budget(int64_t budget, int64_t P, int32_t H, int32_t nr);

/*! kvs_synckv_default_nr() : the paper's representative units per layer (§5.1): 2 for models with 8 KV heads
 *  (Llama-3.1), 1 for 4 (Qwen2.5-7B); [SIM-CHOICE] 2 from 8 KV heads up, 1 below. */
int32_t kvs_synckv_default_nr(int32_t H);

#endif /* KVS_POLICIES_SYNCKV_INTERNAL_H */
