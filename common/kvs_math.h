/* kvs_math.h — the one shared implementation of attention, softmax, log-sum-exp, top-k, pooling and
 * cosine similarity (../shared/STYLE.md rule 6). Capture (CPU forward pass), `kvsim verify`, the replay
 * engine and every policy call these; nobody re-implements them.
 *
 * Conventions: all math in fp32 with fp64 accumulation of softmax denominators; `scale` is the softmax
 * scale (1/sqrt(head_dim) for Llama-family models); LSE is the natural-log log-sum-exp of the *scaled*
 * scores, so probs[j] = exp(scale*q.k_j - lse). Rows of K and V are `stride` floats apart; an index list
 * `idx` selects rows (NULL = rows 0..n-1).
 */
#ifndef KVS_MATH_H
#define KVS_MATH_H

#include <stddef.h>
#include <stdint.h>

/*! kvs_dot() : sum_i a[i]*b[i] in fp32. */
float kvs_dot(const float *a, const float *b, size_t n);

/*! kvs_attn_scores() : scores[j] = scale * q . K[idx[j]] for j < n. */
void kvs_attn_scores(const float *q, const float *keys, size_t stride, const int32_t *idx, size_t n, size_t d,
                     float scale, float *scores);

/*! kvs_softmax() : in-place softmax of x[0..n-1]; @return the log-sum-exp of the input (n > 0). */
double kvs_softmax(float *x, size_t n);

/*! kvs_attn_output() : out[0..d-1] = sum_j p[j] * V[idx[j]]. */
void kvs_attn_output(const float *p, const float *values, size_t stride, const int32_t *idx, size_t n, size_t d,
                     float *out);

/*! kvs_attention() : softmax(scale q K_S^T) V_S over the n selected rows. `probs` (n floats, caller
 *  scratch) receives the attention probabilities; `out` the d-dim output. @return the LSE. n > 0. */
double kvs_attention(const float *q, const float *keys, const float *values, size_t stride, const int32_t *idx,
                     size_t n, size_t d, float scale, float *probs, float *out);

/*! kvs_topk() : writes to out_idx the indices of the k largest of x[0..n-1] (k <= n), ordered by
 *  descending value; ties go to the lower index, so the result is deterministic. NaN sorts lowest. */
void kvs_topk(const float *x, size_t n, size_t k, int32_t *out_idx);

/*! kvs_argsort_desc() : writes to order[0..n-1] all indices of x ordered exactly as kvs_topk(x, n, n)
 *  orders them (descending value, ties to the lower index, -0 equal to +0, NaN last), in O(n) with a
 *  stable LSD radix sort: the full ranking the replay engine needs for the top-k overlap of every step.
 *  `scratch` is caller memory of at least 3*n uint32_t. */
void kvs_argsort_desc(const float *x, size_t n, int32_t *order, uint32_t *scratch);

/*! kvs_maxpool1d() : out[i] = max(x[i-k/2 .. i+k/2]) clipped to [0,n) (odd kernel k, "same" padding,
 *  as SnapKV's max_pool1d with padding k//2). */
void kvs_maxpool1d(const float *x, size_t n, size_t k, float *out);

/*! kvs_avgpool1d() : same window as kvs_maxpool1d, mean over the in-range elements. */
void kvs_avgpool1d(const float *x, size_t n, size_t k, float *out);

/*! kvs_cosine() : a.b / (|a||b|); 0 when either norm is 0. */
float kvs_cosine(const float *a, const float *b, size_t n);

/*! kvs_l2() : Euclidean norm. */
double kvs_l2(const float *a, size_t n);

/*! kvs_rel_l2() : ||a-b|| / ||a|| (0 when both are zero, +inf when only a is zero). */
double kvs_rel_l2(const float *ref, const float *x, size_t n);

#endif /* KVS_MATH_H */
