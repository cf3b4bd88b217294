/* chunkkv_internal.h — the chunk selection of ChunkKV (policies/chunkkv.c, ../shared/POLICY_SPEC_2.md §2.3), exposed
 * for the test of its worked example G-CK (tests/test_chunkkv.c). STYLE.md rule 1: cross-module internals in
 * *_internal.h; the policy itself is reached through the registry (policies/registry.h).
 */
#ifndef KVS_POLICIES_CHUNKKV_INTERNAL_H
#define KVS_POLICIES_CHUNKKV_INTERNAL_H

#include <stdint.h>

#include "../sim/policy.h"

/* chunkkv's `select` choices, in the parameter's order. */
enum { KVS_CHUNKKV_PAPER = 0, KVS_CHUNKKV_REF = 1 };

/*! kvs_chunkkv_select() : which of n candidates (cache order) to keep, given the token scores sigma[0..m) of the
 *  scored prefix (m = n - w: the last w candidates are the observation window) with chunks of c candidates and a
 *  budget of B (> w) retained positions:
 *   - PAPER: chunks tile [0, m), the last one partial (its score = its mean x c); keep the floor((B - w) / c) best
 *     chunks by their sum, plus the window;
 *   - REF (kvpress ChunkKVPress): the window's candidates score `window_score` each (the caller's max + 1, summed
 *     over the KV heads it sums), chunks tile [0, n), a chunk's score is its mean; keep the max(1, floor(B / c))
 *     best chunks (B < c: the window's last B candidates).
 *  Ties: the lower chunk index (POLICY_SPEC §1.4). keep: n bytes, written 0/1; scratch: n int32; chunk_score: n doubles
 *  (each chunk's score on return). @return the number kept (<= B). */
int64_t kvs_chunkkv_select(const double *sigma, int64_t m, int64_t n, int64_t c, int64_t budget, int mode,
                           double window_score, char *keep, int32_t *scratch, double *chunk_score);

#endif /* KVS_POLICIES_CHUNKKV_INTERNAL_H */
