/* heads.c — head-to-head similarity (SyncKV Eq. 2, Fig. 2c) over the decode steps of a trace, streamed in
 * lockstep over every (layer, KV head), and the per-layer K-means clustering of units on it (SyncKV App. B.1,
 * POLICY_SPEC §2.4 steps 3-5, §8.4h). Implements analysis/heads.h.
 */
#include "heads.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../common/kvs_cluster.h"
#include "../common/kvs_math.h"
#include "../trace/kv_stream.h"

void kvs_analysis_heads_sim_free(kvs_analysis_heads_sim *s) {
    if (!s) return;
    free(s->qhead_sim);
    free(s->unit_sim);
    free(s->unit_sim_half[0]);
    free(s->unit_sim_half[1]);
    free(s);
}

/* Adds the overlap of every pair i < j of the n sets (each of k members, set i at sets + i*k) to the upper
 * triangle of acc [n][n]. */
static void add_pair_overlaps(const int32_t *sets, size_t n, size_t k, double *acc) {
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n; j++) acc[i * n + j] += kvs_overlap_sorted(sets + i * k, k, sets + j * k, k);
}

/* The mean matrix from the upper-triangle sums over `steps` steps: symmetric, diagonal 1. */
static void finish_mean(double *m, size_t n, int64_t steps) {
    for (size_t i = 0; i < n; i++) {
        m[i * n + i] = 1.0;
        for (size_t j = i + 1; j < n; j++) m[j * n + i] = m[i * n + j] = m[i * n + j] / (double)steps;
    }
}

kvs_status kvs_analysis_heads_similarity(const kvs_trace *t, const kvs_analysis_heads_opts *opts,
                                         kvs_analysis_heads_sim **out) {
    if (!t || !out) return kvs_fail(KVS_ERR_INVALID_ARG, "heads: NULL argument");
    *out = NULL;
    kvs_analysis_heads_opts o = opts ? *opts : (kvs_analysis_heads_opts){0};
    if (o.k < 0) return kvs_fail(KVS_ERR_INVALID_ARG, "heads: k %lld < 0", (long long)o.k);
    const kvs_trace_info *info = kvs_trace_info_get(t);
    const int32_t L = info->model.n_layers, H = info->model.n_heads, U = info->model.n_kv_heads, G = H / U;
    const int64_t N = info->n_positions;
    const uint8_t *roles = kvs_trace_roles(t);
    int64_t n_dec = 0, first_dec = -1;
    for (int64_t p = 0; p < N; p++)
        if (roles[p] == KVS_ROLE_GENERATED) {
            if (first_dec < 0) first_dec = p;
            n_dec++;
        }
    if (n_dec == 0)
        return kvs_fail(KVS_ERR_UNSUPPORTED, "head similarity: the trace has no generated positions (decode steps): head "
                                             "similarity is measured over decode steps");
    if (o.halves && n_dec < 2)
        return kvs_fail(KVS_ERR_UNSUPPORTED, "head similarity: the trace has %lld decode step; two halves need at least 2",
                        (long long)n_dec);
    const int64_t ctx = first_dec + 1;
    int clipped = 0;
    int64_t k = o.k;
    if (k == 0) {
        k = KVS_ANALYSIS_HEADS_DEFAULT_K;
        if (k > ctx) k = ctx, clipped = 1;
    } else if (k > ctx) {
        return kvs_fail(KVS_ERR_INVALID_ARG, "head similarity: k %lld is larger than the context of the first decode step "
                                             "(%lld positions, position %lld): every top-k set would be the whole "
                                             "context",
                        (long long)k, (long long)ctx, (long long)first_dec);
    }
    const size_t nq = (size_t)L * (size_t)H, nu = (size_t)L * (size_t)U, kk = (size_t)k;
    kvs_status st = KVS_OK;
    kvs_analysis_heads_sim *s = calloc(1, sizeof *s);
    kvs_kv_stream **streams = calloc(nu, sizeof *streams);
    int32_t *qsets = malloc(nq * kk * sizeof *qsets), *usets = malloc(nu * kk * sizeof *usets);
    float *pooled = malloc((size_t)N * sizeof *pooled);
    if (!s || !streams || !qsets || !usets || !pooled) goto nomem;
    s->n_layers = L;
    s->n_heads = H;
    s->n_kv_heads = U;
    s->k = k;
    s->k_clipped = clipped;
    s->first_decode_ctx = ctx;
    s->qhead_sim = calloc(nq * nq, sizeof *s->qhead_sim);
    s->unit_sim = calloc(nu * nu, sizeof *s->unit_sim);
    if (!s->qhead_sim || !s->unit_sim) goto nomem;
    if (o.halves)
        for (int h = 0; h < 2; h++)
            if (!(s->unit_sim_half[h] = calloc((size_t)L * (size_t)U * (size_t)U, sizeof *s->unit_sim_half[h])))
                goto nomem;
    for (int32_t l = 0; l < L && st == KVS_OK; l++)
        for (int32_t u = 0; u < U && st == KVS_OK; u++)
            st = kvs_kv_stream_open(t, l, u, KVS_KV_STREAM_FULL_ATTN, &streams[(size_t)l * (size_t)U + (size_t)u]);
    if (st != KVS_OK) goto cleanup;
    const int64_t half_len = (n_dec + 1) / 2; /* the first half: steps 0 .. ceil(n/2)-1 */
    int64_t step = 0;
    for (int64_t p = 0; p < N; p++) {
        int generated = roles[p] == KVS_ROLE_GENERATED;
        for (size_t i = 0; i < nu; i++) {
            kvs_kv_pos q;
            if ((st = kvs_kv_stream_next(streams[i], &q)) != KVS_OK) {
                if (st == KVS_ERR_END)
                    st = kvs_fail(KVS_ERR_TRUNCATED, "heads: layer %zu KV head %zu ended at position %lld of %lld",
                                  i / (size_t)U, i % (size_t)U, (long long)p, (long long)N);
                goto cleanup;
            }
            if (!generated) continue; /* the prompt's attention is computed (the history needs it) but not used */
            const size_t n = (size_t)q.n_ctx;
            for (int32_t g = 0; g < G; g++) /* query head (layer l, head u*G + g) sits at i*G + g: l*H + u*G + g */
                kvs_topk_sorted(q.probs + (size_t)g * n, n, kk, qsets + (i * (size_t)G + (size_t)g) * kk);
            kvs_max_rows(q.probs, n, (size_t)G, n, pooled); /* App. B.1: MAX over the group's query heads */
            kvs_topk_sorted(pooled, n, kk, usets + i * kk);
        }
        if (!generated) continue;
        add_pair_overlaps(qsets, nq, kk, s->qhead_sim);
        add_pair_overlaps(usets, nu, kk, s->unit_sim);
        if (o.halves) {
            double *half = s->unit_sim_half[step < half_len ? 0 : 1];
            for (int32_t l = 0; l < L; l++)
                add_pair_overlaps(usets + (size_t)l * (size_t)U * kk, (size_t)U, kk,
                                  half + (size_t)l * (size_t)U * (size_t)U);
        }
        step++;
    }
    s->n_steps = step;
    finish_mean(s->qhead_sim, nq, step);
    finish_mean(s->unit_sim, nu, step);
    if (o.halves) {
        s->n_steps_half[0] = half_len;
        s->n_steps_half[1] = step - half_len;
        for (int h = 0; h < 2; h++)
            for (int32_t l = 0; l < L; l++)
                finish_mean(s->unit_sim_half[h] + (size_t)l * (size_t)U * (size_t)U, (size_t)U, s->n_steps_half[h]);
    }
    *out = s;
    s = NULL;
    goto cleanup;
nomem:
    st = kvs_fail(KVS_ERR_NOMEM, "heads: out of memory");
cleanup:
    if (streams)
        for (size_t i = 0; i < nu; i++) kvs_kv_stream_free(streams[i]);
    free(streams);
    free(qsets);
    free(usets);
    free(pooled);
    kvs_analysis_heads_sim_free(s);
    return st;
}

void kvs_analysis_heads_layer_sim(const double *sim, int32_t n_layers, int32_t n, double *out) {
    const size_t w = (size_t)n_layers * (size_t)n;
    for (int32_t a = 0; a < n_layers; a++)
        for (int32_t b = 0; b < n_layers; b++) {
            double sum = 0;
            int64_t pairs = 0;
            for (int32_t i = 0; i < n; i++)
                for (int32_t j = 0; j < n; j++) {
                    if (a == b && i == j) continue; /* a head with itself: 1 by definition, says nothing */
                    sum += sim[((size_t)a * (size_t)n + (size_t)i) * w + (size_t)b * (size_t)n + (size_t)j];
                    pairs++;
                }
            out[(size_t)a * (size_t)n_layers + (size_t)b] = pairs ? sum / (double)pairs : NAN;
        }
}

void kvs_analysis_heads_layer_sim_kv(const double *sim, int32_t n_layers, int32_t n, int32_t group, double *other,
                                     double *same) {
    const size_t w = (size_t)n_layers * (size_t)n;
    const int32_t g = group > 0 ? group : 1;
    for (int32_t a = 0; a < n_layers; a++)
        for (int32_t b = 0; b < n_layers; b++) {
            double s_other = 0, s_same = 0;
            int64_t n_other = 0, n_same = 0;
            for (int32_t i = 0; i < n; i++)
                for (int32_t j = 0; j < n; j++) {
                    if (a == b && i == j) continue; /* a head with itself: 1 by definition */
                    const double v = sim[((size_t)a * (size_t)n + (size_t)i) * w + (size_t)b * (size_t)n + (size_t)j];
                    if (a == b && i / g == j / g) s_same += v, n_same++; /* the same KV head: identical keys */
                    else s_other += v, n_other++;
                }
            const size_t at = (size_t)a * (size_t)n_layers + (size_t)b;
            other[at] = n_other ? s_other / (double)n_other : NAN;
            if (same) same[at] = n_same ? s_same / (double)n_same : NAN;
        }
}

/* The mean of the diagonal (diag != 0) or off-diagonal cells of m [L][L], NaN cells skipped; NaN when none. */
static double cells_mean(const double *m, int32_t L, int diag) {
    double sum = 0;
    int64_t n = 0;
    for (int32_t a = 0; a < L; a++)
        for (int32_t b = 0; b < L; b++) {
            const double v = m[(size_t)a * (size_t)L + (size_t)b];
            if ((a == b) != (diag != 0) || isnan(v)) continue;
            sum += v;
            n++;
        }
    return n ? sum / (double)n : NAN;
}

kvs_analysis_heads_split kvs_analysis_heads_split_of(const double *all, const double *other, const double *same,
                                                     int32_t n_layers, int32_t n, int32_t group) {
    const int64_t L = n_layers, g = group > 0 ? group : 1, per_kv = g < n ? g : n;
    kvs_analysis_heads_split s = {
        .within = cells_mean(all, n_layers, 1), .across = cells_mean(all, n_layers, 0),
        .within_other_kv = cells_mean(other, n_layers, 1), .across_other_kv = cells_mean(other, n_layers, 0),
        .within_same_kv = same ? cells_mean(same, n_layers, 1) : NAN,
        .pairs_within = L * n * (n - 1), .pairs_within_same_kv = L * n * (per_kv - 1), .pairs_across = L * (L - 1) * n * n};
    return s;
}

void kvs_analysis_heads_layer_block(const double *sim, int32_t n_layers, int32_t n, int32_t layer, double *out) {
    const size_t w = (size_t)n_layers * (size_t)n, base = (size_t)layer * (size_t)n;
    for (int32_t i = 0; i < n; i++)
        for (int32_t j = 0; j < n; j++) out[(size_t)i * (size_t)n + (size_t)j] = sim[(base + (size_t)i) * w + base + (size_t)j];
}

kvs_status kvs_analysis_heads_cluster(kvs_head_clusters *c, int32_t layer, const double *S, int32_t n_clusters,
                                      uint64_t seed, double *silhouette) {
    if (!c || !S || !silhouette) return kvs_fail(KVS_ERR_INVALID_ARG, "heads: NULL argument");
    const int32_t n = c->n_units;
    const kvs_kmeans_opts ko = {.seed = seed};
    *silhouette = NAN;
    if (n_clusters == 0 && n < 3) n_clusters = 1; /* the silhouette needs 2 <= k <= n - 1 */
    if (n_clusters != 0 && (n_clusters == 1 || n_clusters == n))
        return kvs_head_clusters_from_similarity(c, layer, S, n_clusters, &ko); /* no silhouette: undefined */
    if (n_clusters < 0 || n_clusters > n)
        return kvs_fail(KVS_ERR_INVALID_ARG, "heads: %d clusters of %d units (need 1..%d, or 0 for automatic)",
                        n_clusters, n, n);
    /* The features K-means sees (head_clusters.h): the rows of D = max(S) - S. Rebuilt here because the
     * silhouette and the automatic choice are computed on them. */
    const size_t nn = (size_t)n * (size_t)n;
    double *D = malloc(nn * sizeof *D), smax = -INFINITY;
    int32_t *labels = malloc((size_t)n * sizeof *labels);
    double *sil = malloc((size_t)n * sizeof *sil);
    kvs_status st = KVS_OK;
    if (!D || !labels || !sil) {
        st = kvs_fail(KVS_ERR_NOMEM, "heads: out of memory");
        goto cleanup;
    }
    for (size_t i = 0; i < nn; i++)
        if (S[i] > smax) smax = S[i];
    for (size_t i = 0; i < nn; i++) D[i] = smax - S[i];
    if (n_clusters == 0) {
        kvs_kmeans_result r;
        if ((st = kvs_kmeans_auto(D, (size_t)n, (size_t)n, 2, n - 1, &ko, &r, sil)) != KVS_OK) goto cleanup;
        n_clusters = r.k;
        kvs_kmeans_result_free(&r);
    }
    /* The same K-means (same features, k, seed and restarts) as the automatic choice ran: the same partition. */
    if ((st = kvs_head_clusters_from_similarity(c, layer, S, n_clusters, &ko)) != KVS_OK) goto cleanup;
    for (int32_t i = 0; i < n; i++) labels[i] = c->cluster[(size_t)layer * (size_t)n + (size_t)i];
    st = kvs_silhouette(D, (size_t)n, (size_t)n, labels, n_clusters, silhouette);
cleanup:
    free(D);
    free(labels);
    free(sil);
    return st;
}
