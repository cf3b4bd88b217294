/* results_heads.h — the "heads" table family of the results database: what `kvsim heads` measures (head-to-head
 * similarity of query heads and of units, layer-to-layer similarity, the per-layer K-means clustering of units
 * with its representatives, and the stability of that clustering) and the reads of it: the SyncKV policy's
 * clustering (SyncKV App. B.1, POLICY_SPEC §2.4) and the heads plots. Tables: results/SCHEMA.md "Table family
 * heads"; the analysis: analysis/heads.h. A run is written in one transaction (all of it or nothing).
 */
#ifndef KVS_RESULTS_HEADS_H
#define KVS_RESULTS_HEADS_H

#include <stdint.h>

#include "../common/head_clusters.h"
#include "results.h"
#include "../sim/policy.h"

/* One `kvsim heads` run: how it was configured. Borrowed strings. */
typedef struct {
    int64_t k;                  /* k_c used for the top-k sets */
    int64_t k_requested;        /* the --k given, 0 when the default was used */
    int64_t n_steps;            /* decode steps averaged over */
    int32_t n_clusters_requested; /* clusters per layer asked for; 0 = automatic (silhouette) */
    uint64_t seed;              /* K-means seed */
    const char *stability;      /* NULL (none), "halves" (two halves of the decode steps) or "trace" (a 2nd trace) */
    const kvs_results_trace *stability_trace; /* "trace" only: the second trace */
    const char *notes;          /* e.g. that k was clipped to the context; NULL when none */
    double wall_seconds;
    const char *kvsim_version;
} kvs_results_heads_run;

/* What the run measured (borrowed). L layers, H query heads and U units (KV heads) per layer. */
typedef struct {
    int32_t n_layers, n_heads, n_kv_heads;
    const double *qhead_sim;         /* [L*H][L*H] */
    const double *unit_sim;          /* [L*U][L*U] */
    const double *layer_sim_q;       /* [L][L] layer-to-layer similarity of query heads */
    const double *layer_sim_u;       /* [L][L] of units (NaN on the diagonal when U = 1) */
    const kvs_head_clusters *clusters; /* L x U: the clustering of the whole run (checked before writing) */
    const double *silhouette;        /* [L] of that clustering, NaN = undefined */
    const kvs_head_clusters *stab_a, *stab_b; /* the two clusterings compared, or NULL without stability */
    const double *ari;               /* [L] adjusted Rand index of stab_a vs stab_b, or NULL */
} kvs_results_heads_data;

/*! kvs_results_heads_write() : writes the trace row (if new), the heads_runs row and every table of the family
 *  in one transaction (creating the tables when the database has none); *run_id receives the new id (may be
 *  NULL). The split of the layer matrices by KV head (which pairs share one, their means) is computed here from
 *  the pair matrices, by analysis/heads.h kvs_analysis_heads_layer_sim_kv: it cannot disagree with them. KVS_ERR_INVALID_ARG (nothing written) when the shapes disagree with the trace or a clustering fails
 *  kvs_head_clusters_check; KVS_ERR_STATE on a read-only handle; KVS_ERR_DB on a database error (rolled back). */
kvs_status kvs_results_heads_write(kvs_results_db *db, const kvs_results_trace *trace, const kvs_results_heads_run *run,
                                   const kvs_results_heads_data *d, int64_t *run_id);

/*! kvs_results_heads_read_clusters() : the clustering of heads run `heads_run_id` (the latest run when <= 0) into
 *  *out (caller frees with kvs_head_clusters_free) and, when sha256_hex is not NULL, the SHA-256 of its file form
 *  (common/head_clusters.h: the digest of the file `kvsim heads --clusters-out` writes for it, so a policy
 *  records the same identity whichever it read). KVS_ERR_DB with "no heads results in DB" when the database
 *  has none, "no heads run ID in DB" for a missing id, or when the stored rows do not form a valid clustering. */
kvs_status kvs_results_heads_read_clusters(kvs_results_db *db, int64_t heads_run_id, kvs_head_clusters **out,
                                           char sha256_hex[65]);

/* A heads run as read back. Owned by the row (kvs_results_heads_row_free). */
typedef struct {
    int64_t id, trace_id;
    char *trace_path, *model, *stability, *notes, *created_at, *clusters_sha256;
    int32_t n_layers, n_heads, n_kv_heads;
    int64_t k, n_steps;
    int32_t n_clusters_requested; /* 0 = automatic */
    uint64_t seed;
    double *qhead_sim, *unit_sim;       /* [L*H][L*H], [L*U][L*U] */
    double *layer_sim_q, *layer_sim_u;  /* [L][L] */
    /* [L][L] the split by KV head (analysis/heads.h kvs_analysis_heads_layer_sim_kv): of query heads over the pairs
     * that do not share a KV head and over the distinct pairs that do (NaN where none), of units (none share) */
    double *layer_sim_q_other_kv, *layer_sim_q_same_kv, *layer_sim_u_other_kv;
    kvs_head_clusters *clusters;        /* the run's clustering */
    double *silhouette;                 /* [L], NaN = undefined */
    double *ari;                        /* [L], NaN = no stability measured */
} kvs_results_heads_row;

/*! kvs_results_heads_read() : heads run `heads_run_id`, or when <= 0 the latest run whose trace path is
 *  `trace_path` or ends in "/" + trace_path (NULL = any) and whose model is `model` (NULL = any). Errors as
 *  kvs_results_heads_read_clusters ("no heads run matching ..." when none matches). @return KVS_OK and *out
 *  (caller frees with kvs_results_heads_row_free, which accepts NULL) */
kvs_status kvs_results_heads_read(kvs_results_db *db, int64_t heads_run_id, const char *trace_path, const char *model,
                                  kvs_results_heads_row **out);
void kvs_results_heads_row_free(kvs_results_heads_row *r);

/*! kvs_results_resolve_policy_inputs() : for every FILE parameter of cfgs[0..n) whose table entry says what a results
 *  database stands for (kvs_policy_param.resolves) and whose path is one: loads that object into cfgs[c].resolved
 *  ("head_clusters": the clustering of the database's latest `kvsim heads` run, as kvs_results_heads_read_clusters)
 *  so that the policy never opens a database. *owned (free with kvs_results_policy_inputs_free, which accepts NULL,
 *  after every use of the configurations and their copies) holds what was loaded. KVS_ERR_INVALID_ARG naming the
 *  policy and parameter when the database cannot give it (no heads results...) or for a kind this kvsim does not
 *  know; nothing is left loaded then. */
kvs_status kvs_results_resolve_policy_inputs(kvs_policy_config *cfgs, int n, void **owned);
void kvs_results_policy_inputs_free(void *owned);

#endif /* KVS_RESULTS_HEADS_H */
