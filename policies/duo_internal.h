/* duo_internal.h — DuoAttention's shared parts (../shared/POLICY_SPEC_2.md §2.5) for its two registry entries: `duo`
 * (policies/duo.c, the authors' trained gates from a head-pattern file) and `duo_heuristic` (policies/duo_heuristic.c,
 * kvsim's trace-derived proxy, labelled as not the paper's): the head typing, the gate-file reader, the heuristic's
 * per-probe scores, and the one instance both run (retrieval heads keep everything; streaming heads keep n_s sinks
 * plus the n_r most recent tokens). STYLE.md rule 1: cross-module internals in *_internal.h.
 */
#ifndef KVS_POLICIES_DUO_INTERNAL_H
#define KVS_POLICIES_DUO_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "../sim/policy.h"

/*! kvs_duo_type() : streaming[c] = 1 for the heads made streaming among n heads with retrieval scores score[] (gates
 *  or heuristic ρ; higher = keep full). threshold >= 0: the heads with score < threshold; else the
 *  floor(sparsity·n + 0.5) lowest scores, ties to the lower flat index (layer-major), as kvpress's stable argsort.
 *  @return the number of streaming heads. */
int kvs_duo_type(const double *score, int n, double sparsity, double threshold, char *streaming);

/*! kvs_duo_read_pattern() : the authors' full_attention_heads.tsv: L lines of Hkv gate values (tabs or spaces),
 *  each clipped to [0, 1], into gates[L·Hkv] (layer-major). KVS_ERR_IO when unreadable, KVS_ERR_FORMAT (the detail
 *  names the file, line and what was found) when the shape is not (L, Hkv) or a value is not a number. */
kvs_status kvs_duo_read_pattern(const char *path, int L, int Hkv, double *gates);

/*! kvs_duo_probe() : one probe position i of nq query rows of one KV head (q [nq][d]; keys and values rows 0..i of
 *  the head, [i+1][d]): adds to *mass, for each row, the attention mass the streaming set {0..n_s−1} ∪ {i−n_r+1..i}
 *  loses (1 − its share), and to *err the relative output error ‖O − O_str‖/‖O‖ of attending only that set. The
 *  attention is fp32 on the shared SIMD routines (common/kvs_math.h kvs_attention_group, kvs_attn_output), as every
 *  other policy's; the shares and the error are summed in fp64. scratch: kvs_duo_probe_scratch(nq, d, i) floats. */
void kvs_duo_probe(const float *q, int nq, const float *k, const float *v, int64_t i, int d, float scale, int64_t n_s,
                   int64_t n_r, double *mass, double *err, float *scratch);

/*! kvs_duo_probe_scratch() : floats of kvs_duo_probe's scratch for nq rows at probe position i. */
size_t kvs_duo_probe_scratch(int nq, int d, int64_t i);

/* The map both tables' allocation passes hand to every instance (alloc_shared): streaming[layer·Hkv + kv_head]. */
typedef struct {
    int L, Hkv, n_streaming;
    char *streaming;
} kvs_duo_map;

/*! kvs_duo_sparsity() : the sparsity a configuration asks for: its `sparsity` parameter, or with sparsity = −1 the
 *  spec's budget mapping 1 − f, f = (B − (n_s+n_r)) / (S − (n_s+n_r)) clipped to [0, 1], S = prompt + max_new. */
double kvs_duo_sparsity(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget);

/* The instance both tables run (kvs_policy_ops callbacks); init->shared must be a kvs_duo_map. */
kvs_status kvs_duo_create(const kvs_policy_init *init, void **state);
void kvs_duo_free(void *state);
kvs_status kvs_duo_prefill(void *state, const kvs_policy_view *view);
kvs_status kvs_duo_select(void *state, const kvs_policy_view *view, kvs_policy_sel *sel);
int64_t kvs_duo_stored(void *state, int g, int32_t *out);
/* window_evict of both tables: duo.c "Sliding-window layers". */
kvs_status kvs_duo_window_evict(void *state, int64_t first);
void kvs_duo_account(void *state, const kvs_policy_view *view, const kvs_policy_sel *sel, kvs_policy_cost *out);
/* alloc_shared of both tables (their allocation states start with a kvs_duo_map); alloc_free of duo's (a bare map). */
const void *kvs_duo_alloc_shared(void *alloc);
void kvs_duo_alloc_free(void *alloc);

#endif /* KVS_POLICIES_DUO_INTERNAL_H */
