/* kvs_math.h — the one shared implementation of attention, softmax, log-sum-exp, top-k, pooling, cosine
 * similarity and the policies' prefill attention scores (../shared/STYLE.md rule 6). Capture (CPU forward pass), `kvsim verify`, the replay
 * engine and every policy call these; nobody re-implements them.
 *
 * The hot loops run on runtime-dispatched SIMD kernels (kvs_math_simd.h; KVS_SIMD=scalar forces the plain-C
 * reference, which reproduces earlier releases bit for bit).
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

#include "kvs.h"

/*! kvs_dot() : sum_i a[i]*b[i] in fp32. */
float kvs_dot(const float *a, const float *b, size_t n);

/*! kvs_attn_scores() : scores[j] = scale * q . K[idx[j]] for j < n. */
void kvs_attn_scores(const float *q, const float *keys, size_t stride, const int32_t *idx, size_t n, size_t d,
                     float scale, float *scores);

/*! kvs_softmax() : in-place softmax of x[0..n-1]; @return the log-sum-exp of the input (n > 0). */
double kvs_softmax(float *x, size_t n);

/*! kvs_attn_scores_f64() : scores[j] = (double)scale * sum_i (double)q[i] * (double)K[idx[j]][i] for j < n, the
 *  sum in ascending i from 0 in fp64 (one running sum, no partial sums): exact-order logits a naive fp64
 *  reference reproduces bit for bit (Keyformer's Gumbel-softmax score, whose ranking is compared selection by
 *  selection). */
void kvs_attn_scores_f64(const float *q, const float *keys, size_t stride, const int32_t *idx, size_t n, size_t d,
                         float scale, double *scores);

/*! kvs_softmax_f64() : in-place softmax of x[0..n-1] in fp64: m = max x, x[j] = exp(x[j] - m) / sum with the sum
 *  in ascending j from 0; @return the log-sum-exp m + log(sum) (n > 0). */
double kvs_softmax_f64(double *x, size_t n);

/*! kvs_attn_output() : out[0..d-1] = sum_j p[j] * V[idx[j]]. */
void kvs_attn_output(const float *p, const float *values, size_t stride, const int32_t *idx, size_t n, size_t d,
                     float *out);

/*! kvs_attention() : softmax(scale q K_S^T) V_S over the n selected rows. `probs` (n floats, caller
 *  scratch) receives the attention probabilities; `out` the d-dim output. @return the LSE. n > 0. */
double kvs_attention(const float *q, const float *keys, const float *values, size_t stride, const int32_t *idx,
                     size_t n, size_t d, float scale, float *probs, float *out);

/*! kvs_attention_group() : kvs_attention() of nq query rows (q: [nq][d]) over one shared selection, every key and
 *  value row read once for all of them (the G query heads of a KV head). probs_rows[r]: n floats
 *  each (caller's); out: [nq][d]; lse: [nq] or NULL. Row r's numbers equal kvs_attention()'s for that row. */
void kvs_attention_group(const float *q, size_t nq, const float *keys, const float *values, size_t stride,
                         const int32_t *idx, size_t n, size_t d, float scale, float *const *probs_rows, float *out,
                         double *lse);

/*! kvs_attention_causal_block() : the full causal attention of nb consecutive decode positions p0..p0+nb-1 at
 *  once, `group` query rows each (q: [nb][group][d], row r = b*group + g), over keys/values rows 0..p0+nb-1 (d
 *  floats apart): row r attends rows 0..p0+b. Computed as blocked matrix products (each key and value row read
 *  once for the whole block) with the causal triangle apart. probs_rows[r]: p0+b+1 floats; out_rows[r]: d
 *  floats; lse: [nb*group] or NULL. Row r's numbers equal kvs_attention(q_r, keys, values, d, NULL, p0+b+1, ...)
 *  bit for bit (kvs_math_simd.h: a row's result does not depend on the rows computed with it). score_rows: NULL,
 *  or row r's scaled scores before the softmax are also copied to score_rows[r] (p0+b+1 floats): the scores of
 *  every selection at that position (kvs_attention_group_scored). */
void kvs_attention_causal_block(const float *q, size_t nb, size_t group, const float *keys, const float *values,
                                size_t d, size_t p0, float scale, float *const *probs_rows, float *const *out_rows,
                                double *lse, float *const *score_rows);

/* Scratch of kvs_attention_lists() for lists of positions below `cap`, nq query rows: caller-owned, sized with
 * kvs_attn_lists_scratch_floats() floats and kvs_attn_lists_scratch_ints() int32s. */
size_t kvs_attn_lists_scratch_floats(size_t nq, size_t cap);
size_t kvs_attn_lists_scratch_ints(size_t nq, size_t cap);

/*! kvs_attention_lists() : kvs_attention() of query row r (q: [nq][d]) over its own list idx[r][0..n[r]) of K/V
 *  rows, for every r < nq (the per-query-head selections of a KV head). probs_rows[r] (n[r] floats) and out
 *  ([nq][d]) receive each row's probabilities in its list's order and its output, bit for bit kvs_attention()'s
 *  for that row, given finite V rows. When every list is strictly ascending, non-empty, below `cap`, and their
 *  union U is at most twice the mean list, the scores of all rows run over U at once (each key row read once:
 *  the group kernel), each row's softmax over its own list, and the output over U with a zero weight for a
 *  non-member: an exact zero added into an accumulator that starts at +0, in the same ascending order, so the
 *  same bits (sim/BENCH.md "Per-query-head lists"). Otherwise row by row (an empty list: a zero output row).
 *  fscratch / iscratch: sized as above.
 *  @return 1 when the union path ran, 0 when row by row. */
int kvs_attention_lists(const float *q, size_t nq, const float *keys, const float *values, size_t stride,
                        const int32_t *const *idx, const int64_t *n, size_t cap, size_t d, float scale,
                        float *const *probs_rows, float *out, float *fscratch, int32_t *iscratch);

/*! kvs_attention_lists16() : kvs_attention_lists() over 16-bit K/V rows (below); the row-by-row fallback reads
 *  the fp32 rows `keys32` / `values32` (the same numbers: the 16-bit kernels equal the fp32 ones bit for bit). */
int kvs_attention_lists16(const float *q, size_t nq, const uint16_t *keys, const uint16_t *values, kvs_dtype dtype,
                          const float *keys32, const float *values32, size_t stride, const int32_t *const *idx,
                          const int64_t *n, size_t cap, size_t d, float scale, float *const *probs_rows, float *out,
                          float *fscratch, int32_t *iscratch);

/* ---- K/V kept in a trace's 16-bit form (sim/BENCH.md "K/V in 16 bits") ----
 * The two functions above over K/V rows of fp16 or bf16 (`dtype`: KVS_DTYPE_F16 or KVS_DTYPE_BF16 of
 * common/kvs.h; rows `stride` uint16_t apart, d <= KVS_KV16_MAX_DIM of kvs_math_simd.h), converted to fp32 on
 * the way into the kernels: half the bytes read. The results equal the fp32 functions' on the rows' exact fp32
 * conversion (kvs_decode) bit for bit, on every instruction set. */

/*! kvs_attention_group16() : kvs_attention_group() over 16-bit K/V rows. */
void kvs_attention_group16(const float *q, size_t nq, const uint16_t *keys, const uint16_t *values, kvs_dtype dtype,
                           size_t stride, const int32_t *idx, size_t n, size_t d, float scale,
                           float *const *probs_rows, float *out, double *lse);

/*! kvs_attention_causal_block16() : kvs_attention_causal_block() over 16-bit K/V rows (d apart). */
void kvs_attention_causal_block16(const float *q, size_t nb, size_t group, const uint16_t *keys,
                                  const uint16_t *values, kvs_dtype dtype, size_t d, size_t p0, float scale,
                                  float *const *probs_rows, float *const *out_rows, double *lse,
                                  float *const *score_rows);

/* ---- attention over a selection whose scores are already computed ----
 * In an open-loop replay a query's score against a position is the same whichever selection holds that position,
 * and the full reference has computed it against every position. These take each query row's scaled scores
 * against positions 0..p (score_rows[r], as kvs_attention_causal_block's score_rows keep them) and gather a
 * selection's scores instead of computing them again: only the softmax and the output remain. A score's bits do
 * not depend on the rows or tiles it was computed with (kvs_math_simd.h), so the results equal the computing
 * functions' bit for bit. values16 non-NULL: the output reads those 16-bit rows (`dtype` fp16 / bf16, the exact
 * fp32 conversion of `values`; d <= KVS_KV16_MAX_DIM) instead of `values`, with the same bits. */

/*! kvs_attention_group_scored() : kvs_attention_group() of nq rows (no LSE) over idx[0..n) (NULL: 0..n-1). */
void kvs_attention_group_scored(const float *const *score_rows, size_t nq, const float *values,
                                const uint16_t *values16, kvs_dtype dtype, size_t stride, const int32_t *idx, size_t n,
                                size_t d, float *const *probs_rows, float *out);

/* ---- the outputs of many selections over one KV head's value rows in one pass ----
 * The configurations of a sweep each attend their own selection over the same value rows at a step, and one by
 * one each would read its rows from wherever they were: the L3 or memory once a head's rows outgrow the L2
 * (sim/BENCH.md "The shared output pass"). The _defer variants below do all of the functions above but the
 * output, which they describe as calls of the output kernel (kvs_out_call); kvs_out_calls_run() then runs the
 * calls of every selection together, a block of value rows at a time, each call taking its entries in the block
 * while the block stays in L2. An output element is an fma chain over ascending entries from the value it holds
 * (kvs_math_simd.h), so a call cut at block edges adds the same products in the same order: the same bits as one
 * call. */
enum { KVS_OUT_CALL_ROWS = 64 };
typedef struct {
    const float *p_rows[KVS_OUT_CALL_ROWS]; /* row r's weight of entry j: p_rows[r][j] */
    float *out_rows[KVS_OUT_CALL_ROWS];     /* out_rows[r] += sum_j p_rows[r][j] * V[row of entry j] */
    size_t nr;
    const int32_t *idx;                     /* the entries' value rows; NULL: rows first + j */
    size_t first, n;
    size_t done, upto;                      /* kvs_out_calls_run's: entries run so far, to run in this block */
} kvs_out_call;

/*! kvs_out_calls_max() : the most calls the _defer functions below write for nq query rows. */
size_t kvs_out_calls_max(size_t nq);

/*! kvs_out_calls_run() : runs calls[0..n_calls) over one value matrix (as kvs_attention_group_scored reads it:
 *  fp32 `values`, or `values16` when non-NULL), block_rows value rows at a time (0: each call whole), the calls in
 *  their order within a block; a call whose idx is not strictly ascending runs whole, in its turn, in the first
 *  block. A block whose rows the calls take at least as many entries from as it has rows is first read through in
 *  order, one sequential stream, so that the indexed reads find it in the caches. Every output row ends as running the calls whole one after the other would leave it, bit for bit,
 *  provided that of two calls sharing an output row, the earlier one's value rows all lie below the later one's
 *  (the _defer functions' calls do: a union's rows lie below the lists' common suffix). */
void kvs_out_calls_run(kvs_out_call *const *calls, size_t n_calls, const float *values, const uint16_t *values16,
                       kvs_dtype dtype, size_t stride, size_t d, size_t block_rows);

/*! kvs_attention_group_scored_defer() : kvs_attention_group_scored() over idx[0..n) (NULL: positions first ..
 *  first+n-1, the scores read at those places of score_rows) up to the output: the probabilities written, out
 *  zeroed, the output's calls in calls[]. @return the number of calls (<= kvs_out_calls_max(nq)). */
size_t kvs_attention_group_scored_defer(const float *const *score_rows, size_t nq, const int32_t *idx, size_t first,
                                        size_t n, size_t d, float *const *probs_rows, float *out, kvs_out_call *calls);

/*! kvs_attn_lists_keep_floats() / _ints() : the sizes of kvs_attention_lists_scored_defer's fkeep / ikeep for nq
 *  lists of `total` entries in all below `cap`. */
size_t kvs_attn_lists_keep_floats(size_t nq, size_t total, size_t cap);
size_t kvs_attn_lists_keep_ints(size_t nq, size_t total, size_t cap);

/*! kvs_attention_lists_scored_defer() : kvs_attention_lists() (its output over the union of the lists under the
 *  same condition; scratch sized the same) from the scores, up to the output, as above. The union path's
 *  weights go to fkeep and its rows to ikeep (NULL: left in iscratch), which the calls read: they must live until
 *  the calls have run (fscratch and iscratch need not); fkeep NULL: in fscratch. *used_union: 1 when the union
 *  path ran (kvs_attention_lists' return), 0 when row by row; row by row, the lists' common suffix is one call for
 *  every row after the rows' parts before it when every list is strictly ascending (the same order of products). */
size_t kvs_attention_lists_scored_defer(const float *const *score_rows, size_t nq, const int32_t *const *idx,
                                        const int64_t *n, size_t cap, size_t d, float *const *probs_rows, float *out,
                                        float *fscratch, int32_t *iscratch, float *fkeep, int32_t *ikeep,
                                        kvs_out_call *calls, int *used_union);

/*! kvs_topk() : writes to out_idx the indices of the k largest of x[0..n-1] (k <= n), ordered by
 *  descending value; ties go to the lower index, so the result is deterministic. NaN sorts lowest. */
void kvs_topk(const float *x, size_t n, size_t k, int32_t *out_idx);

/*! kvs_sort_positions() : sorts n positions (indices) ascending in place: the set form that attend sets and
 *  kvs_overlap_sorted() take. */
void kvs_sort_positions(int32_t *idx, size_t n);

/*! kvs_topk_sorted() : the same k positions as kvs_topk(), as an ascending set. */
void kvs_topk_sorted(const float *x, size_t n, size_t k, int32_t *out_idx);

/*! kvs_max_rows() : out[j] = max over the n_rows rows r of rows[r * stride + j], j < n (the MAX pooling of a GQA
 *  group's attention maps, SyncKV App. B.1). out may not alias rows. n_rows >= 1. */
void kvs_max_rows(const float *rows, size_t stride, size_t n_rows, size_t n, float *out);

/*! kvs_topk_f64() : kvs_topk() over doubles (same order and tie rule), for scores ranked in fp64. */
void kvs_topk_f64(const double *x, size_t n, size_t k, int32_t *out_idx);

/*! kvs_topk_f64_set() : the same min(k, n) indices as kvs_topk_f64(), in no stated order (for a caller that wants
 *  the set: the ranking's k log k sort is skipped). */
void kvs_topk_f64_set(const double *x, size_t n, size_t k, int32_t *out_idx);

/*! kvs_desc_key() : the radix sort key of kvs_argsort_desc / kvs_topk's order: ascending key = descending value,
 *  -0 equal to +0, NaN strictly after everything (UINT32_MAX; no number maps there). Computed from the float's
 *  bits without branches, so a loop filling a row of keys vectorises. */
static inline uint32_t kvs_desc_key(float f) {
    uint32_t b;
    __builtin_memcpy(&b, &f, sizeof b);
    uint32_t mag = b & 0x7fffffffu;
    b = mag == 0 ? 0 : b;                                       /* -0 ranks as +0 */
    uint32_t key = (b & 0x80000000u) ? b : ~(b | 0x80000000u); /* descending: ~(ascending bits) */
    key = key == UINT32_MAX ? UINT32_MAX - 1 : key;             /* keep NaN strictly last */
    return mag > 0x7f800000u ? UINT32_MAX : key;
}

/*! kvs_desc_keys() : key[i] = kvs_desc_key(x[i]) for i < n, through the active kernel table (vectors where the CPU
 *  has them; the same keys). */
void kvs_desc_keys(const float *x, size_t n, uint32_t *key);

/*! kvs_radix_sort_pairs() : a stable LSD radix sort of the pairs (key[i], val[i]), i < n, on the whole 32-bit key,
 *  bytes low to high, a byte every key shares skipped; writes the values in ascending key order (equal keys in
 *  their given order) to out[0..n-1]. key2, val2: n entries of caller memory; key, val, key2 and val2 are
 *  overwritten; out may be val or val2. */
void kvs_radix_sort_pairs(uint32_t *key, uint32_t *val, uint32_t *key2, uint32_t *val2, size_t n, uint32_t *out);

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

/*! kvs_avgpool1d_pad() : POLICY_SPEC §1.4 AVGPOOL, i.e. PyTorch avg_pool1d(padding=k//2) with its default
 *  count_include_pad=True: the sum over the in-range part of kvs_maxpool1d's window, always divided by k
 *  (zero padding), so the two end values are pulled towards 0. Odd k; out[0..n-1], x and out distinct. */
void kvs_avgpool1d_pad(const float *x, size_t n, size_t k, float *out);

/*! kvs_div_by() : x[j] /= m for j < n (m >= 1), bit for bit as the division: a power-of-two m multiplies by its
 *  reciprocal instead, which is exact, so each product is the same correctly rounded quotient (a division per
 *  element bounded TOVA's per-step group mean). */
void kvs_div_by(double *x, size_t n, int64_t m);

/*! kvs_heads_add() : out[j] += t_j (mean: t_j / nh) for j < n, t_j = 0 + p[0][j] + ... + p[nh-1][j] in fp64 in head
 *  order (nh >= 1; a power-of-two nh divides as the product with its exact reciprocal: the same quotient). The GQA
 *  group's sum or mean of one step's attention per position that H2O, D2O, Scissorhands and TOVA reduce their query
 *  heads by, and the prefill column sums' heads: the f64 kernel table's heads_add (4 positions a vector, each the
 *  same operations, so the same bits as the loop). Into a zeroed out, out[j] = t_j (or t_j / nh) bit for bit: t_j is
 *  never -0 (its sum starts at +0), nor is t_j / nh (the floats' sum is 0 or at least 2^-149 in magnitude). */
void kvs_heads_add(const float *const *p, size_t nh, size_t n, int mean, double *out);

/* ---- prefill attention column sums (POLICY_SPEC §1.4 attention and GQA reducers) ----
 * H2O, TOVA, Scissorhands, SnapKV, PyramidKV, Ada-KV (and RocketKV's stage 1) all score cache candidates by
 * the causal softmax attention that some prompt queries pay them, reduced over the query heads of a GQA
 * group. kvs_attn_colsum() is that computation, kvs_snapkv_scores() SnapKV's pooled window score on top. */

/* GQA reducer over the query heads of one KV group (POLICY_SPEC §1.4). */
typedef enum {
    KVS_GQA_NONE = 0, /* per query head (EXPAND): one output row per head */
    KVS_GQA_SUM = 1,
    KVS_GQA_MEAN = 2,
    KVS_GQA_MAX = 3,
} kvs_gqa_reduce;

/* Pooling along the sequence (POLICY_SPEC §1.4): kvs_maxpool1d or kvs_avgpool1d_pad. */
typedef enum { KVS_POOL_MAX = 0, KVS_POOL_AVG = 1 } kvs_pool;

/* Prompt-attention inputs of one KV head: the queries, the keys and the candidate positions attended. All
 * borrowed. Causal rule: the query at position p attends the candidates whose position is <= p (a leading
 * run of the ascending list; at least one). Shapes follow sim/policy.h's kvs_policy_view. */
typedef struct {
    const float *q;      /* [n_q][group][d]: row r = the queries of position q_first + r */
    int64_t q_first, n_q;
    int32_t group;       /* query heads per KV head (a row holds group*d floats) */
    int32_t d;           /* head_dim */
    float scale;         /* softmax scale */
    const float *keys;   /* [*][d]: row p = key of position p */
    const int32_t *idx;  /* [n_cand] candidate positions, strictly ascending; NULL = positions 0..n_cand-1 */
    int64_t n_cand;
} kvs_attn_src;

/* What kvs_attn_colsum() sums and how it reduces the heads. */
typedef struct {
    int64_t row_first, n_rows;   /* query rows row_first .. row_first+n_rows-1 of src->q */
    int32_t head_first, n_heads; /* query heads head_first .. head_first+n_heads-1 of each row */
    kvs_gqa_reduce reduce;
    int64_t n_out;               /* columns accumulated: candidates 0..n_out-1 (n_out <= n_cand) */
    int64_t head_stride;         /* KVS_GQA_NONE only: elements between the heads' output rows; 0 = n_out */
} kvs_colsum_opts;

/*! kvs_attn_colsum_scratch_bytes() : bytes of the scratch that kvs_attn_colsum() and kvs_snapkv_scores() need
 *  for n_cand candidates (caller memory from malloc, so aligned for double; 12 bytes per candidate). */
size_t kvs_attn_colsum_scratch_bytes(int64_t n_cand);

/*! kvs_attn_colsum() : ADDS to the output, for every candidate column j < n_out, the causal softmax
 *  attention that the selected rows pay candidate j, reduced over the selected heads:
 *      REDUCE_h  sum_r  p[r][h][j],  p[r][h] = softmax_j(scale * q[r][h] . K[idx[j]]) over the visible j
 *  (0 where j is not visible to row r). Exactly one of out_f32 / out_f64 is non-NULL; it chooses the
 *  precision AND the order of the two reductions (kept from the policies this replaced, bit for bit):
 *   - out_f32 (SnapKV family): head by head, S_h[j] = sum over the rows in fp32, from 0; then NONE adds S_h
 *     to row h, SUM adds S_h, MEAN adds S_h / n_heads, MAX adds max_h S_h (heads in ascending order);
 *   - out_f64 (H2O, TOVA, Scissorhands: the same per-row reduction as their decode-time observe): row by row,
 *     t[j] = the row's heads reduced in fp64 (SUM: sum from 0; MEAN: that sum / n_heads; MAX: max), added
 *     to the output; NONE adds each head's probability to its row. So MAX sums each row's max over the heads
 *     here but takes the max of the head sums with out_f32; SUM and MEAN differ between the two only by
 *     rounding.
 *  Output: [n_out] floats or doubles, or [n_heads][head_stride] for KVS_GQA_NONE; the caller initialises it
 *  (zero, or a running score to add to). `scratch`: kvs_attn_colsum_scratch_bytes(src->n_cand) bytes. */
void kvs_attn_colsum(const kvs_attn_src *src, const kvs_colsum_opts *opts, float *out_f32, double *out_f64,
                     void *scratch);

/* SnapKV's scoring parameters (POLICY_SPEC §2.6 B5; RocketKV stage 1 is window 32, kernel 63, MAX pool, SUM). */
typedef struct {
    int64_t window;              /* observation window: the last min(window, n_q) queries (0: scores all 0) */
    int64_t kernel;              /* pooling kernel, odd (1 = no pooling), stride 1, "same" padding */
    kvs_pool pool;
    int32_t head_first, n_heads; /* the query heads scored (reduced by `reduce`) */
    kvs_gqa_reduce reduce;
} kvs_snapkv_opts;

/*! kvs_snapkv_scores() : SnapKV's pooled observation-window score of the candidates before the window.
 *  The window is the last w = min(window, n_q) query rows of src->q, and their positions must be the last w
 *  candidates; the scored prefix is candidates 0..m-1, m = n_cand - w. out[j] (j < m) =
 *  POOL_j( REDUCE_h sum_window p[r][h][j] ), the column sum in fp32 as kvs_attn_colsum(out_f32) computes it,
 *  pooled along the prefix (MAX: kvs_maxpool1d; AVG: kvs_avgpool1d_pad). Overwrites out: [m] floats, or
 *  [n_heads][m] for KVS_GQA_NONE (each head's row pooled on its own). `scratch`:
 *  kvs_attn_colsum_scratch_bytes(src->n_cand) bytes. @return m (0: nothing before the window, out untouched). */
int64_t kvs_snapkv_scores(const kvs_attn_src *src, const kvs_snapkv_opts *opts, float *out, void *scratch);

/* ---- key-only eviction scores (KeyDiff, POLICY_SPEC §2.5 and §4 items 6-7; KNorm, §2.6 B12) ----
 * Scores of n cached keys (rows idx[j] of `keys`, `stride` floats apart; idx NULL = rows 0..n-1) that depend
 * on the keys alone, higher = more worth keeping (KeyDiff evicts the keys most similar to the others). All in
 * fp64. Guards as PyTorch (POLICY_SPEC §1.4): k/max(|k|, 1e-12) normalises a key (a zero key stays zero),
 * cos(a, b) = a.b / max(|a||b|, 1e-8). */
typedef enum {
    KVS_KEY_SCORE_ANCHOR = 0,     /* KeyDiff Eq. 8: -cos(k_i, mu), mu = (1/n) sum_j k_j/|k_j| (the anchor) */
    KVS_KEY_SCORE_ANCHOR_RAW = 1, /* -cos(k_i, mu), mu = (1/n) sum_j k_j (KeyDiff §3.2 "unnormalized keys") */
    KVS_KEY_SCORE_PAIRWISE = 2,   /* KeyDiff Eq. 7: -sum_j cos(k_i, k_j) over all n keys, i itself included;
                                   * O(n^2 d). Same ranking as ANCHOR: sum_j cos(k_i,k_j) = n|mu|cos(k_i,mu) */
    KVS_KEY_SCORE_L2NORM = 3,     /* KNorm / KeyL2Norm: -|k_i| (keep the smallest norms) */
} kvs_key_score;

/*! kvs_key_anchor() : mu[0..d-1] = (1/n) sum_j k_j/max(|k_j|, 1e-12) (normalized != 0, Eq. 8's anchor) or
 *  (1/n) sum_j k_j (normalized == 0); all zero when n == 0. */
void kvs_key_anchor(const float *keys, size_t stride, const int32_t *idx, size_t n, size_t d, int normalized,
                    double *mu);

/*! kvs_key_scores() : score[0..n-1] of `kind` for the n keys. `scratch`: n + d doubles, caller memory. */
void kvs_key_scores(const float *keys, size_t stride, const int32_t *idx, size_t n, size_t d, kvs_key_score kind,
                    double *score, double *scratch);

/*! kvs_key_norms() : norm[0..n-1] = |k_j| in fp64 (the sum of squares in ascending i, then sqrt): the norms
 *  kvs_key_scores computes, bit for bit. A key's norm depends on its row alone, so a policy may keep it from the
 *  step the key entered its cache (KeyDiff, KNorm). */
void kvs_key_norms(const float *keys, size_t stride, const int32_t *idx, size_t n, size_t d, double *norm);

/*! kvs_key_scores_normed() : kvs_key_scores with the n keys' norms given (norm[j] = kvs_key_norms' value for
 *  key j): the same scores bit for bit. `scratch`: d doubles, caller memory. */
void kvs_key_scores_normed(const float *keys, size_t stride, const int32_t *idx, size_t n, size_t d,
                           kvs_key_score kind, const double *norm, double *score, double *scratch);

/*! kvs_key_scores_resumed() : kvs_key_scores_normed, bit for bit, with the anchor's running sum resumed from
 *  checkpoints of an earlier call over the same first keys (a policy that evicts a few keys a step and appends
 *  the new one keeps the sum of the keys before the first change). The anchor is summed in chunks of
 *  KVS_KEY_ANCHOR_CHUNK keys; ck[c*d .. c*d+d) holds the sum after chunk c (caller memory: n / chunk of them),
 *  *ck_valid how many leading chunks' checkpoints still hold for these keys and norms (the caller lowers it to
 *  j / chunk when it changes key j; 0 at first). On return the whole chunks' checkpoints are written and
 *  *ck_valid = n / chunk. ck NULL: none (kvs_key_scores_normed). Kinds without an anchor leave them alone. */
enum { KVS_KEY_ANCHOR_CHUNK = 64 };
void kvs_key_scores_resumed(const float *keys, size_t stride, const int32_t *idx, size_t n, size_t d,
                            kvs_key_score kind, const double *norm, double *score, double *scratch, double *ck,
                            size_t *ck_valid);

/*! kvs_key_scores_lowest() : the key j < m (1 <= m <= n) whose kvs_key_scores_resumed score is the lowest (the
 *  later among equals; a NaN, the last one, before any number): the one a decode step of KeyDiff evicts, the n keys
 *  the anchor's (the m first the candidates; the rest a window that is not scored). For the anchor kinds the
 *  scores are screened in fp32 (the fp32 kernels' dots with fl32(mu), within a proven bound of the fp64 scores)
 *  and only the keys the bound cannot rule out are scored in fp64: the same key as the fp64 scores
 *  would give, for a fraction of their cost. On return score[j] holds the fp64 score of the returned key and of
 *  each candidate; the other entries are unspecified. The anchor's checkpoints as kvs_key_scores_resumed.
 *  `scratch`: kvs_key_scores_lowest_scratch_bytes(n, d) bytes, caller memory, aligned for doubles. */
size_t kvs_key_scores_lowest_scratch_bytes(size_t n, size_t d);
int64_t kvs_key_scores_lowest(const float *keys, size_t stride, const int32_t *idx, size_t n, size_t m, size_t d,
                              kvs_key_score kind, const double *norm, double *score, void *scratch, double *ck,
                              size_t *ck_valid);

/* ---- sparse-attention estimation (RocketKV's hybrid sparse attention, Quest, SparQ; POLICY_SPEC §2.2 stage 2,
 * §2.6 B9-B10) ----
 * These policies keep every cached key but attend to few: they estimate which from summaries. Keys are grouped in
 * pages of consecutive cache slots with an element-wise min and max per page (Quest; HSA step 1), the estimate of
 * a query's largest logit in a page uses the min or the max of each dimension by the sign of the query there,
 * and SparQ/HSA keep only the k1 head dimensions with the largest |q|. A page of one slot (min = max = the key)
 * is SparQ's per-token estimate. All scores in fp64; ties as POLICY_SPEC §1.4 (lower index wins). */

/*! kvs_page_minmax_add() : folds key k[0..d-1] into one page's element-wise summaries: kmin[i] = min(kmin[i], k[i])
 *  and kmax[i] = max(kmax[i], k[i]); `first` != 0 starts the page (kmin = kmax = k). kmin, kmax: [d], caller's. */
void kvs_page_minmax_add(float *kmin, float *kmax, const float *k, size_t d, int first);

/*! kvs_qdims_topk() : HSA step 2 / SparQ step 1 over the `group` query rows q[g*d .. g*d+d-1]: a[i] = sum_g |q_g[i]|
 *  (fp64), dims[0..k-1] = the k dimensions with the largest a (ties to the lower dimension), written in ASCENDING
 *  dimension order; use_max[m] (when non-NULL) = 1 when sum_g q_g[dims[m]] >= 0 (Algorithm 1: g_i >= 0 reads
 *  Kmax), else 0 (Kmin). k <= d. `scratch`: d doubles. */
void kvs_qdims_topk(const float *q, size_t group, size_t d, size_t k, int32_t *dims, uint8_t *use_max,
                    double *scratch);

/*! kvs_page_scores() : the estimate of query q's logit in each page, unscaled, in fp64:
 *      out[pi] = sum_m q[i_m] * (use_max[m] ? kmax : kmin)[pi][i_m],   i_m = dims[m], m ascending,
 *  for pi < n_pages, page rows `stride` floats apart. dims NULL = every dimension 0..n_dims-1. use_max NULL = each
 *  dimension by q's own sign (q[i] >= 0 reads kmax): Quest's sum_i max(q_i Kmax_i, q_i Kmin_i), an upper bound of
 *  every logit in the page. kmin == kmax (pages of one key) gives the partial dot product q[dims].k[dims]. */
void kvs_page_scores(const float *q, const int32_t *dims, size_t n_dims, const uint8_t *use_max, const float *kmin,
                     const float *kmax, size_t stride, size_t n_pages, double *out);

/*! kvs_page_scores_rows() : kvs_page_scores(q + r*d, NULL, d, NULL, kmin, kmax, stride, n_pages, out + r*n_pages)
 *  for every query row r < nq (Quest's G heads over the same pages: each page row read once for all of them),
 *  bit for bit. */
void kvs_page_scores_rows(const float *q, size_t nq, size_t d, const float *kmin, const float *kmax, size_t stride,
                          size_t n_pages, double *out);

/*! kvs_sparq_temperature() : SparQ's softmax temperature for an estimate on n_dims of q's d dimensions:
 *  sqrt(d * sum_m |q[dims[m]]| / sum_i |q[i]|) (replaces sqrt(d) of exact attention); 1 when q is all zero. */
double kvs_sparq_temperature(const float *q, const int32_t *dims, size_t n_dims, size_t d);

/*! kvs_page_softmax_add() : ADDS to out[pi] the probability of one token of page pi under the softmax over all
 *  n_tokens tokens of score[page(token)] / temp, the tokens in consecutive pages of `page` (the last may hold fewer):
 *      out[pi] += exp(score[pi]/temp - M) / sum_pi' cnt(pi') exp(score[pi']/temp - M),  cnt(pi) = min(page, n_tokens - pi*page),
 *  fp64 (M = the largest scaled score). HSA steps 5-7: every head's softmax over the expanded page scores, summed
 *  over the group by calling this once per head. n_pages = ceil(n_tokens / page) >= 1, temp > 0. */
void kvs_page_softmax_add(const double *score, size_t n_pages, size_t page, size_t n_tokens, double temp, double *out);

/*! kvs_page_select() : the k tokens (cache slots 0..n_tokens-1 in consecutive pages of `page`, the last may hold
 *  fewer) with the best page score: pages ranked by score (descending, ties to the lower page, NaN last), taken
 *  whole, and the first tokens (ascending slot) of the page that does not fit whole: TOPK over the tokens' page
 *  scores with ties to the older token (POLICY_SPEC §1.4, §2.2 step 8). Writes min(k, n_tokens) slots to out in
 *  ascending order and returns the count. `scratch`: n_pages int32. */
int64_t kvs_page_select(const double *score, size_t n_pages, size_t page, size_t n_tokens, size_t k, int32_t *out,
                        int32_t *scratch);

/*! kvs_page_select_depth() : how many of the best pages kvs_page_select() ranks for k <= n_tokens tokens:
 *  k / page + 2 (every page but the last is full), at most n_pages. */
size_t kvs_page_select_depth(size_t n_pages, size_t page, size_t k);

/*! kvs_page_take() : kvs_page_select()'s tokens from its ranking: ranked[0..n_ranked) the best pages in order
 *  (kvs_topk_f64 of the page scores, at least kvs_page_select_depth(n_pages, page, min(k, n_tokens)) deep; a
 *  deeper ranking's prefix is the same). Writes min(k, n_tokens) ascending slots to out and returns the count. */
int64_t kvs_page_take(const int32_t *ranked, size_t n_ranked, size_t page, size_t n_tokens, size_t k, int32_t *out);

/*! kvs_page_softmax_add_span() : kvs_page_softmax_add() over the tokens in slots [lo, hi) of pages of `page` slots
 *  aligned at slot 0, for a sliding-window layer whose oldest live page lost its slots before lo (and holds only
 *  those from lo): score[i] and out[i] belong to page lo/page + i, i < (hi-1)/page - lo/page + 1, and each page
 *  counts its slots inside [lo, hi). lo = 0 is kvs_page_softmax_add(score, n_pages, page, hi, temp, out), bit for
 *  bit. lo < hi, temp > 0. */
void kvs_page_softmax_add_span(const double *score, size_t page, size_t lo, size_t hi, double temp, double *out);

/*! kvs_page_select_span() : kvs_page_select() over slots [lo, hi) (pages aligned at slot 0, the oldest live one
 *  holding only its slots from lo; score[i] = page lo/page + i's score): pages ranked by score (descending, ties to
 *  the lower page, NaN last) and taken whole (their live slots) while they fit k; the first page that does not fit
 *  gives its first live slots for the rest when whole == 0, nothing when whole != 0 (then fewer than k). Writes the
 *  absolute slots ascending to out and returns their count (<= min(k, hi - lo)). lo = 0, whole = 0 gives
 *  kvs_page_select's slots. `scratch`: n_pages int32. */
int64_t kvs_page_select_span(const double *score, size_t page, size_t lo, size_t hi, size_t k, int whole, int32_t *out,
                             int32_t *scratch);

/*! kvs_cosine() : a.b / (|a||b|); 0 when either norm is 0. */
float kvs_cosine(const float *a, const float *b, size_t n);

/*! kvs_cosine_f64() : kvs_cosine() without the final rounding to float: a.b / (|a||b|) with the dot product and
 *  both norms summed in double (ascending index, as kvs_cosine), the quotient returned in double; 0 when either
 *  norm is 0. For decisions that compare similarities with each other or with a threshold (D2O's matching and
 *  merge test), where fp32 rounding would tie or flip close values; (float)kvs_cosine_f64(a, b, n) ==
 *  kvs_cosine(a, b, n). */
double kvs_cosine_f64(const float *a, const float *b, size_t n);

/*! kvs_l2() : Euclidean norm. */
double kvs_l2(const float *a, size_t n);

/*! kvs_rel_l2() : ||a-b|| / ||a|| (0 when both are zero, +inf when only a is zero). */
double kvs_rel_l2(const float *ref, const float *x, size_t n);

#endif /* KVS_MATH_H */
