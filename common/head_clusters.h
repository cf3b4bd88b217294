/* head_clusters.h — a clustering of the attention units of every layer (KV groups under GQA, heads under
 * MHA) with one representative per cluster: what `kvsim heads` computes from a trace and what the SyncKV
 * policy replays with (SyncKV App. B.1; POLICY_SPEC §2.4 "Offline clustering", steps 2-5, and §8.4h).
 *
 * From a similarity matrix S (S_ij = mean overlap of the units' top-k sets over decode steps, Eq. 2), the
 * SyncKV derivation takes D = max(S) − S (the max over the whole matrix), represents unit i by its row D_i,:,
 * runs K-means (common/kvs_cluster.h: k-means++ seeded, restarts, lowest inertia, canonical labels) and makes
 * the member nearest each centroid the cluster's representative (R-unit; ties to the lowest index).
 *
 * The file form (`kvsim heads --clusters-out FILE`, SyncKV's `clusters=FILE`) is text, one unit per line:
 *
 *     kvsim-head-clusters 1
 *     layers 5 units 4
 *     # layer unit cluster representative
 *     0 0 0 1
 *     0 1 0 0
 *     ...
 *
 * Every (layer, unit) appears exactly once; clusters of a layer are numbered 0..n-1 and each has exactly one
 * representative. Blank lines and lines starting with '#' are ignored. The reader checks all of this and names
 * the line of the first error.
 */
#ifndef KVS_HEAD_CLUSTERS_H
#define KVS_HEAD_CLUSTERS_H

#include <stdint.h>

#include "kvs.h"
#include "kvs_cluster.h"
#include "kvs_out.h"

#define KVS_HEAD_CLUSTERS_MAX_LAYERS 4096
#define KVS_HEAD_CLUSTERS_MAX_UNITS 4096

/* A clustering of every layer's units. Caller owns, free with kvs_head_clusters_free. */
typedef struct {
    int32_t n_layers, n_units; /* units per layer: KV heads (GQA groups) */
    int32_t *n_clusters;       /* [n_layers] */
    int32_t *cluster;          /* [n_layers][n_units] cluster of each unit, 0..n_clusters[l]-1 */
    uint8_t *is_rep;           /* [n_layers][n_units] 1 for the representative of its cluster */
} kvs_head_clusters;

/*! kvs_head_clusters_create() : an empty clustering of n_layers x n_units (every unit in cluster 0, none a
 *  representative yet). KVS_ERR_INVALID_ARG for sizes outside 1..KVS_HEAD_CLUSTERS_MAX_*; KVS_ERR_NOMEM. */
kvs_status kvs_head_clusters_create(int32_t n_layers, int32_t n_units, kvs_head_clusters **out);
void kvs_head_clusters_free(kvs_head_clusters *c);

/*! kvs_head_clusters_from_similarity() : layer `layer` of `c` from the n_units x n_units similarity matrix S
 *  (row-major; S_ij in [0,1], NaN not allowed) by the SyncKV derivation above, with `n_clusters` clusters
 *  (1..n_units) and K-means options `opts` (NULL: seed 0, 10 restarts). KVS_ERR_INVALID_ARG on a bad layer,
 *  cluster count or non-finite S. */
kvs_status kvs_head_clusters_from_similarity(kvs_head_clusters *c, int32_t layer, const double *S, int32_t n_clusters,
                                             const kvs_kmeans_opts *opts);

/*! kvs_head_clusters_check() : KVS_OK when every layer's clusters are numbered 0..n-1, each non-empty with
 *  exactly one representative; otherwise KVS_ERR_FORMAT naming the first layer and cluster at fault. */
kvs_status kvs_head_clusters_check(const kvs_head_clusters *c);

/*! kvs_head_clusters_write() : writes `c` in the file form to `path` atomically (common/kvs_out.h; "-" is
 *  standard output). KVS_ERR_IO naming the path; nothing is left behind on failure. */
kvs_status kvs_head_clusters_write(const kvs_head_clusters *c, const char *path);

/*! kvs_head_clusters_write_begin() : writes `c` in the file form into a new output on `path` (common/kvs_out.h)
 *  and flushes it, without putting it in place: *out receives the open output, which the caller ends with
 *  kvs_out_commit (fsync, rename over `path`) or kvs_out_abort (nothing left behind). For a command that must
 *  write the file only when something else, a database transaction, succeeded: every write error surfaces here,
 *  before it. Errors of kvs_head_clusters_check; KVS_ERR_IO naming the path (*out NULL, nothing left behind). */
kvs_status kvs_head_clusters_write_begin(const kvs_head_clusters *c, const char *path, kvs_out **out);

/*! kvs_head_clusters_sha256() : the SHA-256 (64 hex digits + NUL) of the file form of `c`, equal to that of the
 *  file kvs_head_clusters_write() writes (and kvs_head_clusters_read() reports): how a clustering taken from
 *  elsewhere (a results database) is identified the same way as its file. Errors of kvs_head_clusters_check. */
kvs_status kvs_head_clusters_sha256(const kvs_head_clusters *c, char sha256_hex[65]);

/*! kvs_head_clusters_read() : reads the file form from `path`, checks it (kvs_head_clusters_check) and, when
 *  sha256_hex is not NULL, writes the SHA-256 of the file's bytes there as 64 hex digits + NUL (for a run's
 *  parameters). KVS_ERR_IO when it cannot be read, KVS_ERR_FORMAT with "PATH:LINE: ..." on bad content. */
kvs_status kvs_head_clusters_read(const char *path, kvs_head_clusters **out, char sha256_hex[65]);

#endif /* KVS_HEAD_CLUSTERS_H */
