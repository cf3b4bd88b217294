/* heads.h — head-to-head similarity of a trace and the K-means clustering of each layer's units on it: what
 * `kvsim heads` computes (../shared/DESIGN.md "Analysis"; ../shared/papers/synckv.txt §3.3, §4.1 Eq. 2, Fig. 2c,
 * App. B.1; POLICY_SPEC §1.6 item 4, §2.4 "Offline clustering", §5.4 S4 and S12, §8.4 f-h).
 *
 * Similarity (Eq. 2). At every decode step t (every generated position of the trace, all turns) each head's
 * exact full attention over positions 0..t (trace/kv_stream.h, the replay engine's numbers) gives its top-k set
 * T_k (common/kvs_math.h kvs_topk: ties to the lower position). S_ij is the mean over the decode steps of the
 * overlap coefficient |T_i ∩ T_j| / min(|T_i|, |T_j|) (SyncKV Eq. 1, common/kvs_cluster.h). It is computed for
 * two kinds of head, every pair across every layer:
 *  - query heads: each query head's own attention;
 *  - units: the KV groups SyncKV clusters (App. B.1): the group's attention MAX-pooled over its query heads
 *    (the group is one query head under MHA, where a unit is a head).
 * Every set has exactly k members (k is never larger than the context of the first decode step), so the
 * coefficient is |T_i ∩ T_j| / k.
 *
 * Layer-to-layer similarity (Fig. 2c, S4; the §8.4g reading): Sim(a, b) = the mean of S_ij over the heads i of
 * layer a and j of layer b — "the average of the overlap coefficients from each head in a source layer to a
 * target layer" — where for a = b the pairs of a head with itself (S_ii = 1 by definition) are left out, so
 * the diagonal is the mean similarity of DISTINCT heads of the layer. The coefficient is symmetric, so the
 * matrix is too.
 *
 * Pairs that share a KV head. Under GQA the G query heads of one group read the same keys: their scores differ
 * only by their queries, so their top-k sets agree for a reason that is not "heads behave alike". The
 * within-layer mean therefore also reports it without those pairs (and the mean over them alone): heads i and j
 * of one layer share a KV head when i / G == j / G (G = query heads per KV head; units never share one, nor do
 * heads of different layers, so the across-layer mean is the same with and without). Every layer has as many
 * pairs of each kind, so a mean over the layer cells is the mean over the pairs.
 *
 * Clustering (§2.4 steps 3-5, §8.4h): per layer, K-means on the rows of D = max(S) − S of that layer's units
 * (common/head_clusters.h), with the number of clusters given, or chosen automatically as the k in
 * 2..units−1 with the highest mean silhouette of the D rows (common/kvs_cluster.h kvs_kmeans_auto; a layer of
 * fewer than 3 units gets 1 cluster: the silhouette needs 2 <= k <= n−1). Seeded and deterministic.
 *
 * Memory: besides the K/V histories the streams hold (inherent to exact full attention), the state is the
 * current top-k set of every head (heads × k indices), one pooled row and the heads² similarity sums: bounded
 * by the model's heads and k, never by the trace length (no step's sets are kept past the step).
 */
#ifndef KVS_ANALYSIS_HEADS_H
#define KVS_ANALYSIS_HEADS_H

#include <stdint.h>

#include "../common/kvs.h"
#include "../trace/trace.h"
#include "../common/head_clusters.h"

/* k_c when none is given: POLICY_SPEC §2.4 "64 when calibrating independently". */
#define KVS_ANALYSIS_HEADS_DEFAULT_K 64

typedef struct {
    int64_t k;  /* top-k size k_c; 0 = KVS_ANALYSIS_HEADS_DEFAULT_K, clipped to the context of the first decode
                 * step when larger (an explicit k larger than that context is KVS_ERR_INVALID_ARG) */
    int halves; /* 1: also the within-layer unit similarity of the first and of the second half of the decode
                 * steps (the first ceil(n/2) steps, then the rest), for the stability of the clustering */
} kvs_analysis_heads_opts;

/* The similarity of one trace. Caller owns, free with kvs_analysis_heads_sim_free. Head index of query head h of
 * layer l: l * n_heads + h; of unit (KV head) u of layer l: l * n_kv_heads + u. */
typedef struct {
    int32_t n_layers, n_heads, n_kv_heads;
    int64_t k;                /* k_c used */
    int k_clipped;            /* 1: the default k was clipped to the context of the first decode step */
    int64_t first_decode_ctx; /* positions attended at the first decode step (the smallest decode context) */
    int64_t n_steps;          /* decode steps averaged over */
    int64_t n_steps_half[2];  /* halves only: steps in each half */
    double *qhead_sim;        /* [L*H][L*H] S of query heads, every layer pair; diagonal 1 */
    double *unit_sim;         /* [L*Hkv][L*Hkv] S of units (MAX-pooled KV groups) */
    double *unit_sim_half[2]; /* halves only, else NULL: [L][Hkv][Hkv] within-layer S of each half */
} kvs_analysis_heads_sim;

/*! kvs_analysis_heads_similarity() : streams every (layer, KV head) of `t` in lockstep with exact full attention
 *  and accumulates S over the decode steps. `opts` NULL = defaults. Errors: KVS_ERR_UNSUPPORTED for a trace
 *  without generated positions (or, with halves, with fewer than 2), KVS_ERR_INVALID_ARG for k < 0 or an
 *  explicit k larger than the context of the first decode step (the detail names both), KVS_ERR_NOMEM, and
 *  the trace reader's errors for a corrupt chunk. @return KVS_OK and *out (free with kvs_analysis_heads_sim_free) */
kvs_status kvs_analysis_heads_similarity(const kvs_trace *t, const kvs_analysis_heads_opts *opts,
                                         kvs_analysis_heads_sim **out);
void kvs_analysis_heads_sim_free(kvs_analysis_heads_sim *s);

/*! kvs_analysis_heads_layer_sim() : the layer-to-layer similarity out[a][b] (caller memory, L*L) of a full
 *  similarity matrix sim [L*n][L*n] with n heads per layer (the §8.4g reading above; with n = 1 the diagonal has
 *  no pair of distinct heads and is NaN). */
void kvs_analysis_heads_layer_sim(const double *sim, int32_t n_layers, int32_t n, double *out);

/*! kvs_analysis_heads_layer_sim_kv() : the layer-to-layer similarity split by KV head, for a matrix sim
 *  [L*n][L*n] with n heads per layer, `group` heads per KV head (G for query heads, 1 for units): other[a][b] (L*L,
 *  caller memory) the mean over the pairs of layer a x layer b that do not share a KV head (on the diagonal: distinct
 *  heads of different groups; off it: every pair, as kvs_analysis_heads_layer_sim), same[a][b] the mean over the
 *  pairs of distinct heads that share one (the diagonal only). NaN where there is no such pair (same off the
 *  diagonal and whenever group is 1; other on the diagonal when the layer is one group). `same` may be NULL. */
void kvs_analysis_heads_layer_sim_kv(const double *sim, int32_t n_layers, int32_t n, int32_t group, double *other,
                                     double *same);

/* Within- and across-layer means of one kind of head (the S4 comparison), with and without the pairs that share a
 * KV head. */
typedef struct {
    double within, across;                   /* the mean of the layer matrix's diagonal / off-diagonal cells */
    double within_other_kv, across_other_kv; /* the same over the pairs that do not share a KV head */
    double within_same_kv;                   /* over the pairs of distinct heads that share one; NaN when none */
    int64_t pairs_within, pairs_within_same_kv, pairs_across; /* ordered pairs of distinct heads, all layers */
} kvs_analysis_heads_split;

/*! kvs_analysis_heads_split_of() : the split of a layer matrix `all` and its split cells `other`, `same`
 *  (kvs_analysis_heads_layer_sim, kvs_analysis_heads_layer_sim_kv; [L][L]) of n heads per layer, `group` per KV
 *  head. A mean without a cell is NaN (one layer: no across pair). */
kvs_analysis_heads_split kvs_analysis_heads_split_of(const double *all, const double *other, const double *same,
                                                     int32_t n_layers, int32_t n, int32_t group);

/*! kvs_analysis_heads_layer_block() : the n x n block of layer `layer` of a full matrix sim [L*n][L*n] into out. */
void kvs_analysis_heads_layer_block(const double *sim, int32_t n_layers, int32_t n, int32_t layer, double *out);

/*! kvs_analysis_heads_cluster() : the clustering of one layer's units from its within-layer similarity block S
 *  [n][n] (n = c->n_units) into layer `layer` of `c`: n_clusters in 1..n, or 0 for automatic (above). `seed`
 *  seeds K-means (10 restarts, §2.4). *silhouette receives the mean silhouette of the chosen clustering on the
 *  D rows, NaN when undefined (1 cluster or n clusters). Errors of kvs_head_clusters_from_similarity. */
kvs_status kvs_analysis_heads_cluster(kvs_head_clusters *c, int32_t layer, const double *S, int32_t n_clusters,
                                      uint64_t seed, double *silhouette);

#endif /* KVS_ANALYSIS_HEADS_H */
