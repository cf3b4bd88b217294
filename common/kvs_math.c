/* kvs_math.c — shared attention/softmax/top-k/pooling/column-sum routines; see kvs_math.h. The hot kernels
 * (dot, scores, output, softmax, top-k's filter) go through the runtime-dispatched tables of kvs_math_simd.h;
 * the replay engine's throughput is measured against the machine's peak by `make bench`.
 */
#include "kvs_math.h"

#include "kvs.h"
#include "kvs_math_simd.h"
#include "kvs_math_simd_f64.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

float kvs_dot(const float *a, const float *b, size_t n) { return kvs_math_kernels_active()->dot(a, b, n); }

void kvs_attn_scores(const float *q, const float *keys, size_t stride, const int32_t *idx, size_t n, size_t d,
                     float scale, float *scores) {
    kvs_math_kernels_active()->scores(q, 1, keys, stride, idx, n, d, scale, &scores, 0);
}

double kvs_softmax(float *x, size_t n) { return kvs_math_kernels_active()->softmax(x, n); }

void kvs_attn_scores_f64(const float *q, const float *keys, size_t stride, const int32_t *idx, size_t n, size_t d,
                         float scale, double *scores) {
    for (size_t j = 0; j < n; j++) {
        const float *k = keys + (idx ? (size_t)idx[j] : j) * stride;
        double z = 0;
        for (size_t i = 0; i < d; i++) z += (double)q[i] * (double)k[i];
        scores[j] = (double)scale * z;
    }
}

double kvs_softmax_f64(double *x, size_t n) {
    double m = -INFINITY;
    for (size_t j = 0; j < n; j++)
        if (x[j] > m) m = x[j];
    double sum = 0;
    for (size_t j = 0; j < n; j++) {
        x[j] = exp(x[j] - m);
        sum += x[j];
    }
    for (size_t j = 0; j < n; j++) x[j] /= sum;
    return m + log(sum);
}

void kvs_attn_output(const float *p, const float *values, size_t stride, const int32_t *idx, size_t n, size_t d,
                     float *out) {
    memset(out, 0, d * sizeof *out);
    kvs_math_kernels_active()->output_add(&p, 1, 0, values, stride, idx, n, d, &out);
}

double kvs_attention(const float *q, const float *keys, const float *values, size_t stride, const int32_t *idx,
                     size_t n, size_t d, float scale, float *probs, float *out) {
    kvs_attn_scores(q, keys, stride, idx, n, d, scale, probs);
    double lse = kvs_softmax(probs, n);
    kvs_attn_output(probs, values, stride, idx, n, d, out);
    return lse;
}

void kvs_attention_group(const float *q, size_t nq, const float *keys, const float *values, size_t stride,
                         const int32_t *idx, size_t n, size_t d, float scale, float *const *probs_rows, float *out,
                         double *lse) {
    const kvs_math_kernels *k = kvs_math_kernels_active();
    enum { MAX_ROWS = 64 }; /* query rows per kernel call (the out row pointers live on the stack) */
    for (size_t r0 = 0; r0 < nq; r0 += MAX_ROWS) {
        size_t nr = nq - r0 < MAX_ROWS ? nq - r0 : MAX_ROWS;
        float *orow[MAX_ROWS];
        for (size_t r = 0; r < nr; r++) orow[r] = out + (r0 + r) * d;
        k->scores(q + r0 * d, nr, keys, stride, idx, n, d, scale, probs_rows + r0, 0);
        for (size_t r = 0; r < nr; r++) {
            if (lse) lse[r0 + r] = k->softmax(probs_rows[r0 + r], n);
            else k->softmax_probs(probs_rows[r0 + r], n);
            memset(orow[r], 0, d * sizeof(float));
        }
        k->output_add((const float *const *)(probs_rows + r0), nr, 0, values, stride, idx, n, d, orow);
    }
}

/* The causal block's scaled scores, row r's p0+1+r/group of them, copied to score_rows[r] before the softmax
 * overwrites them (score_rows NULL: none kept). */
static void keep_scores(float *const *rows, size_t nr, size_t group, size_t p0, float *const *score_rows) {
    if (!score_rows) return;
    for (size_t r = 0; r < nr; r++) memcpy(score_rows[r], rows[r], (p0 + 1 + r / group) * sizeof(float));
}

void kvs_attention_causal_block(const float *q, size_t nb, size_t group, const float *keys, const float *values,
                                size_t d, size_t p0, float scale, float *const *probs_rows, float *const *out_rows,
                                double *lse, float *const *score_rows) {
    const kvs_math_kernels *k = kvs_math_kernels_active();
    size_t nr = nb * group;
    /* keys 0..p0 are visible to every row: one pass over them serves the whole block */
    k->scores(q, nr, keys, d, NULL, p0 + 1, d, scale, probs_rows, 0);
    /* the triangle: block position b also sees keys p0+1..p0+b */
    for (size_t b = 1; b < nb; b++)
        k->scores(q + b * group * d, group, keys + (p0 + 1) * d, d, NULL, b, d, scale, probs_rows + b * group, p0 + 1);
    keep_scores(probs_rows, nr, group, p0, score_rows);
    for (size_t r = 0; r < nr; r++) {
        if (lse) lse[r] = k->softmax(probs_rows[r], p0 + 1 + r / group);
        else k->softmax_probs(probs_rows[r], p0 + 1 + r / group);
        memset(out_rows[r], 0, d * sizeof(float));
    }
    k->output_add((const float *const *)probs_rows, nr, 0, values, d, NULL, p0 + 1, d, out_rows);
    for (size_t b = 1; b < nb; b++)
        k->output_add((const float *const *)(probs_rows + b * group), group, p0 + 1, values + (p0 + 1) * d, d, NULL, b,
                      d, out_rows + b * group);
}

/* ---- per-row lists over their union (kvs_attention_lists) ---- */

enum { LISTS_MAX_ROWS = 64 }; /* query rows of one call on the union path (row pointers on the stack) */

/* The int scratch, in this order: uidx [cap] (the union, ascending), map [cap] (position -> its place in the
 * union, written for members only), bits [ceil(cap/32)] (the union as a bitmap), pos [nq][cap] (list r's j-th
 * entry's place in the union). The per-row part comes last, so a caller's scratch for nq rows serves fewer. */
static size_t lists_bitmap_words(size_t cap) { return (cap + 31) / 32; }

size_t kvs_attn_lists_scratch_floats(size_t nq, size_t cap) { return nq * cap; }
size_t kvs_attn_lists_scratch_ints(size_t nq, size_t cap) { return (nq + 2) * cap + lists_bitmap_words(cap); }

/* The union of the nq ascending lists into uidx (ascending) and, for list r's j-th entry, its place in the union
 * in pos[r*cap + j]. @return |U|, or 0 when a list is empty, not strictly ascending, out of [0, cap), or the
 * union exceeds twice the mean list (then the G-row kernels do more work than the rows alone would save).
 * cs > 0: the lists end in the same cs positions (lists_common_suffix), which are then left out of uidx and pos:
 * uidx holds the union of the parts before them (|U| - cs entries, all below the suffix) and pos their entries;
 * the checks and the limit are the whole lists' as with cs = 0.
 * Why a bitmap: a G-way merge looks at every list's head for each member (branchy; it was 5% of a sweep's replay
 * time). Here each list sets its positions' bits (one OR per entry, no branch: OR-ing a list's
 * bits a word at a time, on a change of word, measured no faster), |U| is the bitmap's popcount over the lists'
 * span (checked against the limit before anything else is written), the set bits in ascending order give uidx
 * and the position -> union map, and pos is one map lookup per entry: the same uidx and pos as the merge. */
static size_t lists_union(size_t nq, const int32_t *const *idx, const int64_t *n, size_t cap, int32_t *iscratch,
                          int64_t cs) {
    int32_t *uidx = iscratch, *map = iscratch + cap, *pos = iscratch + 2 * cap + lists_bitmap_words(cap);
    uint32_t *bits = (uint32_t *)(iscratch + 2 * cap);
    int64_t total = 0;
    int32_t lo = INT32_MAX, hi = -1; /* the span of the lists' positions */
    for (size_t r = 0; r < nq; r++) {
        const int32_t *ir = idx[r];
        if (n[r] <= 0 || (uint64_t)n[r] > cap) return 0;
        int bad = ir[0] < 0;
        for (int64_t j = 1; j < n[r]; j++) bad |= ir[j] <= ir[j - 1];
        if (bad || (size_t)ir[n[r] - 1] >= cap) return 0; /* ascending from >= 0: in range iff the last is */
        if (n[r] > cs && ir[0] < lo) lo = ir[0]; /* the span of the parts before the suffix */
        if (n[r] > cs && ir[n[r] - cs - 1] > hi) hi = ir[n[r] - cs - 1];
        total += n[r];
    }
    size_t limit = (size_t)(2 * total) / nq, nu = (size_t)cs;
    if (hi < lo) return nu <= limit ? nu : 0; /* the lists are the suffix alone */
    size_t w_lo = (size_t)lo / 32, w_hi = (size_t)hi / 32;
    memset(bits + w_lo, 0, (w_hi - w_lo + 1) * sizeof *bits);
    for (size_t r = 0; r < nq; r++) {
        const int32_t *ir = idx[r];
        for (int64_t j = 0; j < n[r] - cs; j++) bits[(uint32_t)ir[j] / 32] |= 1u << ((uint32_t)ir[j] % 32);
    }
    for (size_t w = w_lo; w <= w_hi; w++) nu += (size_t)__builtin_popcount(bits[w]);
    if (nu > limit) return 0;
    int32_t u = 0;
    for (size_t w = w_lo; w <= w_hi; w++)
        for (uint32_t word = bits[w]; word; word &= word - 1) {
            int32_t x = (int32_t)(w * 32) + __builtin_ctz(word);
            uidx[u] = x;
            map[x] = u++;
        }
    for (size_t r = 0; r < nq; r++) {
        int32_t *pr = pos + r * cap;
        for (int64_t j = 0; j < n[r] - cs; j++) pr[j] = map[idx[r][j]];
    }
    return nu;
}

/* How many of their last `most` entries lists a and b share (the same positions in the same order): 64 at a time
 * by memcmp while whole blocks agree, then one by one. */
static int64_t common_tail(const int32_t *a, int64_t na, const int32_t *b, int64_t nb, int64_t most) {
    enum { STEP = 64 };
    int64_t k = 0;
    while (k + STEP <= most && !memcmp(a + na - k - STEP, b + nb - k - STEP, STEP * sizeof *a)) k += STEP;
    while (k < most && a[na - 1 - k] == b[nb - 1 - k]) k++;
    return k;
}

/* How many positions the nq lists (nq >= 1) all end with, the same in the same order: H2O's recent window,
 * SnapKV's observation window and generated tokens, kept by every head of a group; 0 when a list is empty. */
static int64_t lists_common_suffix(size_t nq, const int32_t *const *idx, const int64_t *n) {
    int64_t most = n[0];
    for (size_t r = 1; r < nq; r++)
        if (n[r] < most) most = n[r];
    if (most <= 0) return 0;
    for (size_t r = 1; r < nq && most > 0; r++) most = common_tail(idx[0], n[0], idx[r], n[r], most);
    return most;
}

/* A row's probabilities over its list (n entries, list order) onto its union row for the output kernel: at their
 * places in the union (pr[j]), zeros elsewhere; a list that is the whole union (pr[j] = j) is copied. */
static void union_row(const float *probs, int64_t n, const int32_t *pr, size_t nu, float *urow) {
    if ((size_t)n == nu) {
        memcpy(urow, probs, nu * sizeof(float));
        return;
    }
    memset(urow, 0, nu * sizeof(float));
    for (int64_t j = 0; j < n; j++) urow[pr[j]] = probs[j];
}

/* The union path once scores are in urow[r][0..nu): each row's softmax over its own list (its scores gathered in
 * list order, as kvs_attention() has them), then its probabilities back over the union (union_row); out rows
 * zeroed. A list that is the whole union (pos[j] = j) needs no gather: a copy. */
static void lists_softmax(const kvs_math_kernels *k, size_t nq, const int64_t *n, size_t cap, const int32_t *pos,
                          size_t nu, float *const *urow, float *const *probs_rows, float *out, size_t d) {
    for (size_t r = 0; r < nq; r++) {
        const int32_t *pr = pos + r * cap;
        if ((size_t)n[r] == nu)
            memcpy(probs_rows[r], urow[r], nu * sizeof(float));
        else
            for (int64_t j = 0; j < n[r]; j++) probs_rows[r][j] = urow[r][pr[j]];
        k->softmax_probs(probs_rows[r], (size_t)n[r]);
        union_row(probs_rows[r], n[r], pr, nu, urow[r]);
        memset(out + r * d, 0, d * sizeof(float));
    }
}

/* kvs_attention_lists's fallback: every list row by row (kvs_attention), an empty list's output zero. */
static void lists_row_by_row(const float *q, size_t nq, const float *keys, const float *values, size_t stride,
                             const int32_t *const *idx, const int64_t *n, size_t d, float scale,
                             float *const *probs_rows, float *out) {
    for (size_t r = 0; r < nq; r++)
        if (n[r] > 0)
            kvs_attention(q + r * d, keys, values, stride, idx[r], (size_t)n[r], d, scale, probs_rows[r], out + r * d);
        else
            memset(out + r * d, 0, d * sizeof(float));
}

/* The union path's rows: scores of query row r over the union at fscratch + r * cap, its output at out + r * d. */
static void lists_rows(size_t nq, size_t cap, size_t d, float *fscratch, float *out, float **urow, float **orow) {
    for (size_t r = 0; r < nq; r++) {
        urow[r] = fscratch + r * cap;
        orow[r] = out + r * d;
    }
}

int kvs_attention_lists(const float *q, size_t nq, const float *keys, const float *values, size_t stride,
                        const int32_t *const *idx, const int64_t *n, size_t cap, size_t d, float scale,
                        float *const *probs_rows, float *out, float *fscratch, int32_t *iscratch) {
    const kvs_math_kernels *k = kvs_math_kernels_active();
    const int32_t *uidx = iscratch, *pos = iscratch + 2 * cap + lists_bitmap_words(cap);
    size_t nu = nq > 1 && nq <= LISTS_MAX_ROWS ? lists_union(nq, idx, n, cap, iscratch, 0) : 0;
    if (!nu) {
        lists_row_by_row(q, nq, keys, values, stride, idx, n, d, scale, probs_rows, out);
        return 0;
    }
    float *urow[LISTS_MAX_ROWS], *orow[LISTS_MAX_ROWS];
    lists_rows(nq, cap, d, fscratch, out, urow, orow);
    k->scores(q, nq, keys, stride, uidx, nu, d, scale, urow, 0);
    lists_softmax(k, nq, n, cap, pos, nu, urow, probs_rows, out, d);
    k->output_add((const float *const *)urow, nq, 0, values, stride, uidx, nu, d, orow);
    return 1;
}

int kvs_attention_lists16(const float *q, size_t nq, const uint16_t *keys, const uint16_t *values, kvs_dtype dtype,
                          const float *keys32, const float *values32, size_t stride, const int32_t *const *idx,
                          const int64_t *n, size_t cap, size_t d, float scale, float *const *probs_rows, float *out,
                          float *fscratch, int32_t *iscratch) {
    const kvs_math_kernels *k = kvs_math_kernels_active();
    const int32_t *uidx = iscratch, *pos = iscratch + 2 * cap + lists_bitmap_words(cap);
    size_t nu = nq > 1 && nq <= LISTS_MAX_ROWS ? lists_union(nq, idx, n, cap, iscratch, 0) : 0;
    if (!nu) {
        lists_row_by_row(q, nq, keys32, values32, stride, idx, n, d, scale, probs_rows, out);
        return 0;
    }
    float *urow[LISTS_MAX_ROWS], *orow[LISTS_MAX_ROWS];
    lists_rows(nq, cap, d, fscratch, out, urow, orow);
    k->scores16(q, nq, keys, dtype, stride, uidx, nu, d, scale, urow, 0);
    lists_softmax(k, nq, n, cap, pos, nu, urow, probs_rows, out, d);
    k->output_add16((const float *const *)urow, nq, 0, values, dtype, stride, uidx, nu, d, orow);
    return 1;
}

/* ---- deferred outputs (kvs_out_call) ---- */

size_t kvs_out_calls_max(size_t nq) { return nq + 1 > 2 ? nq + 1 : 2; }

/* Entries j0 .. j1-1 of call c through the fp32 or the 16-bit output kernel (its weights from column j0 on). */
static void call_run(const kvs_math_kernels *k, kvs_out_call *c, size_t j0, size_t j1, const float *values,
                     const uint16_t *values16, kvs_dtype dtype, size_t stride, size_t d) {
    if (j1 <= j0) return;
    const int32_t *ix = c->idx ? c->idx + j0 : NULL;
    size_t row0 = c->idx ? 0 : c->first + j0;
    if (values16)
        k->output_add16(c->p_rows, c->nr, j0, values16 + row0 * stride, dtype, stride, ix, j1 - j0, d, c->out_rows);
    else
        k->output_add(c->p_rows, c->nr, j0, values + row0 * stride, stride, ix, j1 - j0, d, c->out_rows);
    c->done = j1;
}

/* The first j in [lo, hi) with idx[j] >= x (idx ascending there), or hi. */
static size_t lower_bound_entry(const int32_t *idx, size_t lo, size_t hi, int64_t x) {
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (idx[mid] < x) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* Reads a byte in every 64 of [p, p + bytes): a block of value rows brought into the caches as one sequential
 * stream, the hardware prefetcher's pattern, before the calls read its rows by index, when they will read at least
 * as many rows as the block holds (each indexed row alone would wait on memory; sim/BENCH.md "The shared output
 * pass"). */
static void stream_in(const char *p, size_t bytes) {
    const volatile char *c = p;
    for (size_t o = 0; o < bytes; o += 64) (void)c[o];
}

/* 1 when idx[0..n) is strictly ascending from >= 0 (a call that can be cut at row blocks). */
static int entries_ascending(const int32_t *idx, size_t n) {
    int bad = n > 0 && idx[0] < 0;
    for (size_t j = 1; j < n; j++) bad |= idx[j] <= idx[j - 1];
    return !bad;
}

void kvs_out_calls_run(kvs_out_call *const *calls, size_t n_calls, const float *values, const uint16_t *values16,
                       kvs_dtype dtype, size_t stride, size_t d, size_t block_rows) {
    const kvs_math_kernels *k = kvs_math_kernels_active();
    size_t end = 0; /* one past the last value row any cut call reads */
    for (size_t i = 0; i < n_calls; i++) {
        kvs_out_call *c = calls[i];
        c->done = 0;
        if (!block_rows) {
            call_run(k, c, 0, c->n, values, values16, dtype, stride, d);
            continue;
        }
        if (c->n == 0) continue;
        if (!c->idx) {
            if (c->first + c->n > end) end = c->first + c->n;
        } else if (entries_ascending(c->idx, c->n)) {
            if ((size_t)c->idx[c->n - 1] + 1 > end) end = (size_t)c->idx[c->n - 1] + 1;
        } else {
            c->done = SIZE_MAX; /* marks a call run whole in the first block */
        }
    }
    if (!block_rows) return;
    size_t row_bytes = stride * (values16 ? sizeof *values16 : sizeof *values);
    const char *base = values16 ? (const char *)values16 : (const char *)values;
    for (size_t x0 = 0, first_block = 1; first_block || x0 < end; x0 += block_rows, first_block = 0) {
        size_t x1 = end - x0 > block_rows ? x0 + block_rows : end, demand = 0;
        for (size_t i = 0; i < n_calls; i++) { /* each call's entries in the block: done .. upto */
            kvs_out_call *c = calls[i];
            if (c->done == SIZE_MAX) continue;
            c->upto = c->done >= c->n ? c->n
                      : c->idx        ? lower_bound_entry(c->idx, c->done, c->n, (int64_t)x1)
                                      : (x1 > c->first ? (x1 - c->first < c->n ? x1 - c->first : c->n) : 0);
            if (c->upto > c->done) demand += c->upto - c->done;
        }
        if (demand >= x1 - x0) stream_in(base + x0 * row_bytes, (x1 - x0) * row_bytes);
        for (size_t i = 0; i < n_calls; i++) {
            kvs_out_call *c = calls[i];
            if (c->done == SIZE_MAX) {
                c->done = 0;
                call_run(k, c, 0, c->n, values, values16, dtype, stride, d);
            } else {
                call_run(k, c, c->done, c->upto, values, values16, dtype, stride, d);
            }
        }
        if (x1 >= end) break;
    }
}

/* ---- attention over S_t from scores already computed (the full reference's) ---- */

/* Row r's scores over its list, gathered in list order from its row of scores against every position: what the
 * scores kernel writes for that list (a score's bits do not depend on the rows and tiles computed with it). idx
 * NULL: positions first .. first+n-1. */
static void gather_scores(const float *score_row, const int32_t *idx, size_t first, size_t n, float *dst) {
    if (!idx) {
        memcpy(dst, score_row + first, n * sizeof(float));
        return;
    }
    for (size_t j = 0; j < n; j++) dst[j] = score_row[idx[j]];
}

size_t kvs_attention_group_scored_defer(const float *const *score_rows, size_t nq, const int32_t *idx, size_t first,
                                        size_t n, size_t d, float *const *probs_rows, float *out, kvs_out_call *calls) {
    const kvs_math_kernels *k = kvs_math_kernels_active();
    size_t n_calls = 0;
    for (size_t r0 = 0; r0 < nq; r0 += KVS_OUT_CALL_ROWS) {
        size_t nr = nq - r0 < KVS_OUT_CALL_ROWS ? nq - r0 : KVS_OUT_CALL_ROWS;
        kvs_out_call *c = &calls[n_calls++];
        for (size_t r = 0; r < nr; r++) {
            gather_scores(score_rows[r0 + r], idx, first, n, probs_rows[r0 + r]);
            k->softmax_probs(probs_rows[r0 + r], n);
            memset(out + (r0 + r) * d, 0, d * sizeof(float));
            c->p_rows[r] = probs_rows[r0 + r];
            c->out_rows[r] = out + (r0 + r) * d;
        }
        c->nr = nr;
        c->idx = idx;
        c->first = idx ? 0 : first;
        c->n = n;
        c->done = 0;
    }
    return n_calls;
}

void kvs_attention_group_scored(const float *const *score_rows, size_t nq, const float *values,
                                const uint16_t *values16, kvs_dtype dtype, size_t stride, const int32_t *idx, size_t n,
                                size_t d, float *const *probs_rows, float *out) {
    kvs_out_call call, *cp = &call; /* KVS_OUT_CALL_ROWS rows at a time: one call each */
    for (size_t r0 = 0; r0 < nq; r0 += KVS_OUT_CALL_ROWS) {
        size_t nr = nq - r0 < KVS_OUT_CALL_ROWS ? nq - r0 : KVS_OUT_CALL_ROWS;
        kvs_attention_group_scored_defer(score_rows + r0, nr, idx, 0, n, d, probs_rows + r0, out + r0 * d, &call);
        kvs_out_calls_run(&cp, 1, values, values16, dtype, stride, d, 0);
    }
}

size_t kvs_attn_lists_keep_floats(size_t nq, size_t total, size_t cap) {
    return 2 * total < nq * cap ? 2 * total : nq * cap; /* nq * |union| <= nq * (2 total / nq), and |union| <= cap */
}
size_t kvs_attn_lists_keep_ints(size_t nq, size_t total, size_t cap) {
    size_t u = nq ? 2 * total / nq : 0;
    return u < cap ? u : cap;
}

/* 1 when the lists' common suffix of cs entries may go through one call after each row's part before it, the
 * same products in the same order however kvs_out_calls_run cuts them at blocks: the suffix strictly ascending,
 * each part before it strictly ascending and below the suffix (when the union is refused, SnapKV's per-head lists
 * at decode share the observation window and every decoded position, which row by row would be read once per
 * query head). */
static int suffix_split_ordered(size_t nq, const int32_t *const *idx, const int64_t *n, int64_t cs) {
    const int32_t *sfx = idx[0] + (n[0] - cs);
    if (!entries_ascending(sfx, (size_t)cs)) return 0;
    for (size_t r = 0; r < nq; r++) {
        int64_t m = n[r] - cs;
        if (m > 0 && (!entries_ascending(idx[r], (size_t)m) || idx[r][m - 1] >= sfx[0])) return 0;
    }
    return 1;
}

/* The call of every row over the lists' common suffix of cs entries (row r's weights from its entry n[r] - cs on). */
static void suffix_call(size_t nq, const int32_t *const *idx, const int64_t *n, int64_t cs, float *const *probs_rows,
                        float *out, size_t d, kvs_out_call *c) {
    for (size_t r = 0; r < nq; r++) {
        c->p_rows[r] = probs_rows[r] + (n[r] - cs);
        c->out_rows[r] = out + r * d;
    }
    c->nr = nq, c->idx = idx[0] + (n[0] - cs), c->first = 0, c->n = (size_t)cs, c->done = 0;
}

size_t kvs_attention_lists_scored_defer(const float *const *score_rows, size_t nq, const int32_t *const *idx,
                                        const int64_t *n, size_t cap, size_t d, float *const *probs_rows, float *out,
                                        float *fscratch, int32_t *iscratch, float *fkeep, int32_t *ikeep,
                                        kvs_out_call *calls, int *used_union) {
    const kvs_math_kernels *k = kvs_math_kernels_active();
    for (size_t r = 0; r < nq; r++) {
        memset(out + r * d, 0, d * sizeof(float));
        if (n[r] <= 0) continue;
        gather_scores(score_rows[r], idx[r], 0, (size_t)n[r], probs_rows[r]);
        k->softmax_probs(probs_rows[r], (size_t)n[r]);
    }
    int use_union = nq > 1 && nq <= LISTS_MAX_ROWS; /* lists_union refuses empty lists itself */
    /* The positions every list ends with go through the output kernel as one shared list after the rest (issue
     * 17): each row's entries still in its list order (the rest lie below the suffix), so the same bits, and the
     * union below (its bitmap, its map, the rows scattered onto it) covers only the parts that differ. */
    int64_t cs = use_union ? lists_common_suffix(nq, idx, n) : 0;
    size_t nu = use_union ? lists_union(nq, idx, n, cap, iscratch, cs) : 0;
    size_t n_calls = 0;
    *used_union = nu > 0;
    if (!nu) { /* row by row; the common suffix, where the calls can be cut at blocks in order, for all rows at once */
        int64_t split = cs > 0 && suffix_split_ordered(nq, idx, n, cs) ? cs : 0;
        for (size_t r = 0; r < nq; r++)
            if (n[r] - split > 0)
                calls[n_calls++] = (kvs_out_call){.p_rows = {probs_rows[r]}, .out_rows = {out + r * d}, .nr = 1,
                                                  .idx = idx[r], .n = (size_t)(n[r] - split)};
        if (split > 0) suffix_call(nq, idx, n, split, probs_rows, out, d, &calls[n_calls++]);
        return n_calls;
    }
    /* the output over the union, each row's probabilities at their places in it, zeros elsewhere (an exact zero
     * added into an accumulator that starts at +0: kvs_attention_lists's argument), then over the suffix */
    const int32_t *uidx = iscratch, *pos = iscratch + 2 * cap + lists_bitmap_words(cap);
    size_t nd = nu - (size_t)cs; /* the union of the parts before the suffix */
    float *ukeep = fkeep ? fkeep : fscratch;
    if (nd > 0) {
        if (ikeep) {
            memcpy(ikeep, uidx, nd * sizeof *uidx);
            uidx = ikeep;
        }
        kvs_out_call *c = &calls[n_calls++];
        for (size_t r = 0; r < nq; r++) {
            float *urow = ukeep + r * nd;
            union_row(probs_rows[r], n[r] - cs, pos + r * cap, nd, urow);
            c->p_rows[r] = urow;
            c->out_rows[r] = out + r * d;
        }
        c->nr = nq, c->idx = uidx, c->first = 0, c->n = nd, c->done = 0;
    }
    if (cs > 0) suffix_call(nq, idx, n, cs, probs_rows, out, d, &calls[n_calls++]);
    return n_calls;
}

/* The 16-bit versions: kvs_attention_group / kvs_attention_causal_block step for step, with the scores and output
 * kernels' 16-bit entries (kvs_math_simd.h), so every row equals the fp32 function's on the converted rows. */
void kvs_attention_group16(const float *q, size_t nq, const uint16_t *keys, const uint16_t *values, kvs_dtype dtype,
                           size_t stride, const int32_t *idx, size_t n, size_t d, float scale,
                           float *const *probs_rows, float *out, double *lse) {
    const kvs_math_kernels *k = kvs_math_kernels_active();
    enum { MAX_ROWS = 64 };
    for (size_t r0 = 0; r0 < nq; r0 += MAX_ROWS) {
        size_t nr = nq - r0 < MAX_ROWS ? nq - r0 : MAX_ROWS;
        float *orow[MAX_ROWS];
        for (size_t r = 0; r < nr; r++) orow[r] = out + (r0 + r) * d;
        k->scores16(q + r0 * d, nr, keys, dtype, stride, idx, n, d, scale, probs_rows + r0, 0);
        for (size_t r = 0; r < nr; r++) {
            if (lse) lse[r0 + r] = k->softmax(probs_rows[r0 + r], n);
            else k->softmax_probs(probs_rows[r0 + r], n);
            memset(orow[r], 0, d * sizeof(float));
        }
        k->output_add16((const float *const *)(probs_rows + r0), nr, 0, values, dtype, stride, idx, n, d, orow);
    }
}

void kvs_attention_causal_block16(const float *q, size_t nb, size_t group, const uint16_t *keys,
                                  const uint16_t *values, kvs_dtype dtype, size_t d, size_t p0, float scale,
                                  float *const *probs_rows, float *const *out_rows, double *lse,
                                  float *const *score_rows) {
    const kvs_math_kernels *k = kvs_math_kernels_active();
    size_t nr = nb * group;
    k->scores16(q, nr, keys, dtype, d, NULL, p0 + 1, d, scale, probs_rows, 0);
    for (size_t b = 1; b < nb; b++)
        k->scores16(q + b * group * d, group, keys + (p0 + 1) * d, dtype, d, NULL, b, d, scale, probs_rows + b * group,
                    p0 + 1);
    keep_scores(probs_rows, nr, group, p0, score_rows);
    for (size_t r = 0; r < nr; r++) {
        if (lse) lse[r] = k->softmax(probs_rows[r], p0 + 1 + r / group);
        else k->softmax_probs(probs_rows[r], p0 + 1 + r / group);
        memset(out_rows[r], 0, d * sizeof(float));
    }
    k->output_add16((const float *const *)probs_rows, nr, 0, values, dtype, d, NULL, p0 + 1, d, out_rows);
    for (size_t b = 1; b < nb; b++)
        k->output_add16((const float *const *)(probs_rows + b * group), group, p0 + 1, values + (p0 + 1) * d, dtype, d,
                        NULL, b, d, out_rows + b * group);
}

/* kvs_topk() and kvs_topk_f64(): one heap selection for both element types. Ordering: larger value first,
 * NaN last, lower index first among equals. The root of the heap is the element that sorts last among the
 * kept k; O(n log k), then heap-sorted in place. */
#define KVS_TOPK_DEFINE(LINK, NAME, T, NEXT)                                                                         \
    static int NAME##_before(const T *x, int32_t a, int32_t b) {                                              \
        T va = x[a], vb = x[b];                                                                               \
        int na = isnan(va), nb = isnan(vb);                                                                   \
        if (na != nb) return nb;                                                                              \
        if (!na && va != vb) return va > vb;                                                                  \
        return a < b;                                                                                         \
    }                                                                                                         \
    static void NAME##_sift(const T *x, int32_t *h, size_t k, size_t i) {                                     \
        for (;;) {                                                                                            \
            size_t l = 2 * i + 1, r = l + 1, w = i;                                                           \
            if (l < k && NAME##_before(x, h[w], h[l])) w = l;                                                 \
            if (r < k && NAME##_before(x, h[w], h[r])) w = r;                                                 \
            if (w == i) return;                                                                               \
            int32_t t = h[i];                                                                                 \
            h[i] = h[w];                                                                                      \
            h[w] = t;                                                                                         \
            i = w;                                                                                            \
        }                                                                                                     \
    }                                                                                                         \
    /* The k first as a heap in out_idx[0..k) (its root sorts last among them); @return k, capped at n. */     \
    static size_t NAME##_heap(const T *x, size_t n, size_t k, int32_t *out_idx) {                             \
        if (k > n) k = n;                                                                                     \
        for (size_t i = 0; i < k; i++) out_idx[i] = (int32_t)i;                                               \
        for (size_t i = k / 2; i-- > 0;) NAME##_sift(x, out_idx, k, i);                                       \
        for (size_t j = k; j < n; j++) {                                                                      \
            if ((j = NEXT(x, j, n, out_idx[0])) >= n) break;                                                  \
            if (NAME##_before(x, (int32_t)j, out_idx[0])) {                                                   \
                out_idx[0] = (int32_t)j;                                                                      \
                NAME##_sift(x, out_idx, k, 0);                                                                \
            }                                                                                                 \
        }                                                                                                     \
        return k;                                                                                             \
    }                                                                                                         \
    LINK void NAME(const T *x, size_t n, size_t k, int32_t *out_idx) {                                        \
        if (k == 0) return;                                                                                   \
        k = NAME##_heap(x, n, k, out_idx);                                                                    \
        for (size_t end = k; end > 1; end--) {                                                                \
            int32_t t = out_idx[0];                                                                           \
            out_idx[0] = out_idx[end - 1];                                                                    \
            out_idx[end - 1] = t;                                                                             \
            NAME##_sift(x, out_idx, end - 1, 0);                                                              \
        }                                                                                                     \
    }

/* The next candidate that can enter the heap: a later index must beat the root's value strictly (ties go to the
 * lower index), which the vector kernel finds 8 values per compare; a NaN root is beaten by any number, left to
 * the plain loop. */
static size_t topk_next_f32(const float *x, size_t j, size_t n, int32_t root) {
    float r = x[root];
    return isnan(r) ? j : kvs_math_kernels_active()->first_above(x, j, n, r);
}
static size_t topk_next_f64(const double *x, size_t j, size_t n, int32_t root) {
    double r = x[root];
    return isnan(r) ? j : kvs_math_f64_kernels_active()->first_above(x, j, n, r);
}

KVS_TOPK_DEFINE(static, topk_heap, float, topk_next_f32)
KVS_TOPK_DEFINE(, kvs_topk_f64, double, topk_next_f64)
#undef KVS_TOPK_DEFINE

/* The heap before its sort: a caller that only marks the kept set would pay k log k for an order it drops (KeyDiff's
 * prefill evictions, 128 of about 2,000, spent 80% of their top-k in that sort). */
void kvs_topk_f64_set(const double *x, size_t n, size_t k, int32_t *out_idx) {
    if (k > 0) kvs_topk_f64_heap(x, n, k, out_idx);
}

/* A large k (the oracle top-k keeps hundreds of a few thousand) costs the heap k log k on top of the scan; the
 * O(n) radix ranking of kvs_argsort_desc gives the same order (its contract) at a fixed cost per element. */
static int cmp_i32_asc(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Positions sort by an LSD radix sort (the oracle top-k sorts its k positions every decode step, and qsort's
 * comparisons cost more than the ranking): 3 passes of 11 bits over the value with its sign bit flipped (so the
 * unsigned order is the signed one), a pass skipped when every value shares its digit. Short lists by insertion;
 * without memory for the scratch, qsort. The result is the one ascending order of the values, whatever the method. */
#define SORT_SMALL 32
void kvs_sort_positions(int32_t *idx, size_t n) {
    if (n <= SORT_SMALL) {
        for (size_t i = 1; i < n; i++) {
            int32_t v = idx[i];
            size_t j = i;
            for (; j > 0 && idx[j - 1] > v; j--) idx[j] = idx[j - 1];
            idx[j] = v;
        }
        return;
    }
    uint32_t *tmp = malloc(n * sizeof *tmp);
    if (!tmp) {
        qsort(idx, n, sizeof *idx, cmp_i32_asc);
        return;
    }
    uint32_t *a = (uint32_t *)idx, *b = tmp; /* same width */
    for (size_t i = 0; i < n; i++) a[i] ^= 0x80000000u;
    for (int pass = 0; pass < 3; pass++) {
        int shift = 11 * pass;
        size_t count[2048] = {0};
        for (size_t i = 0; i < n; i++) count[(a[i] >> shift) & 2047u]++;
        if (count[(a[0] >> shift) & 2047u] == n) continue;
        size_t sum = 0;
        for (size_t v = 0; v < 2048; v++) {
            size_t c = count[v];
            count[v] = sum;
            sum += c;
        }
        for (size_t i = 0; i < n; i++) b[count[(a[i] >> shift) & 2047u]++] = a[i];
        uint32_t *t = a;
        a = b;
        b = t;
    }
    if (a != (uint32_t *)idx) memcpy(idx, a, n * sizeof *idx);
    for (size_t i = 0; i < n; i++) idx[i] = (int32_t)((uint32_t)idx[i] ^ 0x80000000u);
    free(tmp);
}

/* The k positions first in kvs_desc_key's order (ties to the lower index: kvs_argsort_desc's, so kvs_topk's order),
 * ascending, without ranking them (the oracle top-k wants the set at every step; ranking n values and sorting k
 * positions cost more than finding the k-th). A radix select over the keys (key[n], caller memory):
 * the top 11 bits' histogram finds the bucket of the k-th key, the keys in that bucket (cand[], caller memory
 * of n) narrow it down over the next 11 and the last 10 bits to the k-th key T and how many keys equal to T the
 * set takes (`need`); a last pass in ascending position takes every key below T and the first `need` equal to
 * it: the same set, already sorted. 0 < k < n. */
static void topk_select(const float *x, size_t n, size_t k, uint32_t *key, uint32_t *cand, int32_t *out_idx) {
    uint32_t count[2048]; /* n < 2^31: positions are int32 */
    size_t need = k;
    memset(count, 0, sizeof count);
    kvs_desc_keys(x, n, key);
    for (size_t j = 0; j < n; j++) count[key[j] >> 21]++;
    uint32_t top = 0;
    while (count[top] < need) need -= count[top++]; /* ends: bucket `top` holds the k-th key */
    size_t nc = 0;
    for (size_t j = 0; j < n; j++)
        if (key[j] >> 21 == top) cand[nc++] = key[j];
    uint32_t prefix = top << 21;
    static const int shift[2] = {10, 0};
    static const uint32_t digits[2] = {2047u, 1023u}, known[2] = {0xffe00000u, 0xfffffc00u}; /* bits fixed so far */
    for (int p = 0; p < 2; p++) {
        memset(count, 0, ((size_t)digits[p] + 1) * sizeof count[0]);
        for (size_t c = 0; c < nc; c++)
            if ((cand[c] & known[p]) == prefix) count[(cand[c] >> shift[p]) & digits[p]]++;
        uint32_t b = 0;
        while (count[b] < need) need -= count[b++];
        prefix |= b << shift[p];
    }
    size_t m = 0;
    for (size_t j = 0; j < n && m < k; j++) {
        if (key[j] < prefix) {
            out_idx[m++] = (int32_t)j;
        } else if (key[j] == prefix && need > 0) {
            out_idx[m++] = (int32_t)j;
            need--;
        }
    }
}

/* The heap (kvs_topk's small-k path, with its vector filter) is faster below this k; the select costs about the
 * same at any k (2048 values: 5-6 us against the heap's 5 us at k 24 and 7.4 us at 32, and ranking's 18-20 us at 64-512). */
#define TOPK_SELECT_MIN 32

void kvs_topk_sorted(const float *x, size_t n, size_t k, int32_t *out_idx) {
    if (k > n) k = n;
    if (k == n) {
        for (size_t j = 0; j < n; j++) out_idx[j] = (int32_t)j;
        return;
    }
    uint32_t *scratch = k >= TOPK_SELECT_MIN ? malloc(2 * n * sizeof *scratch) : NULL;
    if (scratch) {
        topk_select(x, n, k, scratch, scratch + n, out_idx);
        free(scratch);
        return;
    }
    kvs_topk(x, n, k, out_idx); /* small k, or no memory for the select */
    kvs_sort_positions(out_idx, k);
}

void kvs_max_rows(const float *rows, size_t stride, size_t n_rows, size_t n, float *out) {
    memcpy(out, rows, n * sizeof *out);
    for (size_t r = 1; r < n_rows; r++)
        for (size_t j = 0; j < n; j++)
            if (rows[r * stride + j] > out[j]) out[j] = rows[r * stride + j];
}

void kvs_topk(const float *x, size_t n, size_t k, int32_t *out_idx) {
    if (k > n) k = n;
    if (k >= 64 && k * 16 >= n) {
        int32_t *order = malloc(n * sizeof *order);
        uint32_t *scratch = malloc(3 * n * sizeof *scratch);
        if (order && scratch) {
            kvs_argsort_desc(x, n, order, scratch);
            memcpy(out_idx, order, k * sizeof *out_idx);
            free(order);
            free(scratch);
            return;
        }
        free(order); /* out of memory: the heap needs none */
        free(scratch);
    }
    topk_heap(x, n, k, out_idx);
}

void kvs_desc_keys(const float *x, size_t n, uint32_t *key) { kvs_math_kernels_active()->desc_keys(x, n, key); }

void kvs_radix_sort_pairs(uint32_t *key, uint32_t *val, uint32_t *key2, uint32_t *val2, size_t n, uint32_t *out) {
    size_t count[4][256];
    memset(count, 0, sizeof count);
    for (size_t i = 0; i < n; i++) {
        uint32_t k = key[i];
        count[0][k & 0xffu]++;
        count[1][(k >> 8) & 0xffu]++;
        count[2][(k >> 16) & 0xffu]++;
        count[3][k >> 24]++;
    }
    /* Passes ping-pong between (key, val) and (key2, val2); the values are copied out once at the end. */
    uint32_t *ka = key, *va = val, *kb = key2, *vb = val2;
    for (int b = 0; b < 4; b++) {
        int shift = 8 * b;
        /* A digit shared by every key leaves the order as it is: skip the pass (common for high bytes). */
        if (n == 0 || count[b][(ka[0] >> shift) & 0xffu] == n) continue;
        size_t sum = 0;
        for (int v = 0; v < 256; v++) {
            size_t c = count[b][v];
            count[b][v] = sum;
            sum += c;
        }
        for (size_t i = 0; i < n; i++) { /* stable scatter: equal keys keep their order */
            size_t dst = count[b][(ka[i] >> shift) & 0xffu]++;
            kb[dst] = ka[i];
            vb[dst] = va[i];
        }
        uint32_t *t = ka;
        ka = kb;
        kb = t;
        t = va;
        va = vb;
        vb = t;
    }
    if (va != out) memcpy(out, va, n * sizeof *out);
}

void kvs_argsort_desc(const float *x, size_t n, int32_t *order, uint32_t *scratch) {
    uint32_t *key = scratch, *idx = (uint32_t *)order; /* same width; indices stay below 2^31 */
    kvs_desc_keys(x, n, key);
    for (size_t i = 0; i < n; i++) idx[i] = (uint32_t)i;
    kvs_radix_sort_pairs(key, idx, scratch + n, scratch + 2 * n, n, idx);
}

void kvs_maxpool1d(const float *x, size_t n, size_t k, float *out) {
    size_t h = k / 2;
    for (size_t i = 0; i < n; i++) {
        size_t lo = i >= h ? i - h : 0, hi = i + h < n ? i + h : n - 1;
        float m = x[lo];
        for (size_t j = lo + 1; j <= hi; j++)
            if (x[j] > m) m = x[j];
        out[i] = m;
    }
}

/* The two average poolings share the window sum. With zero padding the in-range mean is rescaled by
 * in_range/k in fp32 rather than dividing the sum by k directly: that is the arithmetic SnapKV and Ada-KV
 * used before the pooling moved here, and keeping it keeps their rankings bit for bit. */
static void avgpool1d(const float *x, size_t n, size_t k, int include_pad, float *out) {
    size_t h = k / 2;
    for (size_t i = 0; i < n; i++) {
        size_t lo = i >= h ? i - h : 0, hi = i + h < n ? i + h : n - 1;
        double s = 0;
        for (size_t j = lo; j <= hi; j++) s += x[j];
        float mean = (float)(s / (double)(hi - lo + 1));
        out[i] = include_pad ? mean * ((float)(hi - lo + 1) / (float)k) : mean;
    }
}

void kvs_div_by(double *x, size_t n, int64_t m) {
    KVS_ASSERT(m >= 1);
    if ((m & (m - 1)) == 0) {
        double r = 1.0 / (double)m;
        for (size_t j = 0; j < n; j++) x[j] *= r;
    } else {
        for (size_t j = 0; j < n; j++) x[j] /= (double)m;
    }
}

void kvs_heads_add(const float *const *p, size_t nh, size_t n, int mean, double *out) {
    KVS_ASSERT(nh >= 1);
    kvs_math_f64_kernels_active()->heads_add(p, nh, n, mean, out);
}

void kvs_avgpool1d(const float *x, size_t n, size_t k, float *out) { avgpool1d(x, n, k, 0, out); }

void kvs_avgpool1d_pad(const float *x, size_t n, size_t k, float *out) { avgpool1d(x, n, k, 1, out); }

/* ---- prefill attention column sums ---- */

size_t kvs_attn_colsum_scratch_bytes(int64_t n_cand) {
    /* [n_cand] doubles (fp64 row reduction) or 2 x [n_cand] floats (fp32 head sum and running max), then
     * [n_cand] floats of probabilities. Doubles first, so malloc's alignment suffices. */
    return (size_t)(n_cand > 0 ? n_cand : 1) * (sizeof(double) + sizeof(float));
}

/* Probabilities of query head h of row r over its visible candidates into p; @return how many are visible.
 * `*vis` carries the visible count between ascending rows, so the causal prefix is found in O(n) overall. */
static int64_t colsum_row_probs(const kvs_attn_src *src, int64_t r, int32_t h, int64_t *vis, float *p) {
    int64_t pos = src->q_first + r;
    if (src->idx) {
        while (*vis < src->n_cand && src->idx[*vis] <= pos) (*vis)++;
    } else {
        *vis = pos + 1 < src->n_cand ? pos + 1 : src->n_cand;
    }
    KVS_ASSERT(*vis > 0);
    const float *q = src->q + ((size_t)r * (size_t)src->group + (size_t)h) * (size_t)src->d;
    kvs_attn_scores(q, src->keys, (size_t)src->d, src->idx, (size_t)*vis, (size_t)src->d, src->scale, p);
    kvs_math_kernels_active()->softmax_probs(p, (size_t)*vis);
    return *vis;
}

/* Batches of query rows: the candidates visible to every row of a batch are scored in one kernel call
 * for all its (row, head) pairs, so each key row is read once per batch instead of once per query; the keys the
 * later rows see besides (the causal triangle) per row. Each probability equals colsum_row_probs' bit for bit
 * (kvs_math_simd.h: a score does not depend on the rows computed with it; the same softmax per row), and the
 * column sums below consume them in the same order as row by row. Without memory for the batch buffers the
 * rows go one at a time through the caller's scratch, as before. */
enum { COLSUM_MAX_QROWS = 32 };                /* (row, head) pairs per batch */
#define COLSUM_MAX_BATCH_FLOATS ((size_t)8 << 20) /* 32 MiB of probabilities at most */

typedef struct {
    int64_t rows;                     /* query rows per batch; 1 when mem is NULL */
    int32_t nh;                       /* heads per row */
    float *mem;                       /* [rows*nh][d] packed queries, then [rows*nh][n_cand] probabilities */
    float *prow[COLSUM_MAX_QROWS];    /* probability row of (row i, head hh): prow[i*nh + hh] */
    int64_t vis[COLSUM_MAX_QROWS];    /* visible candidates of row i */
} colsum_batch;

static void colsum_batch_init(colsum_batch *b, const kvs_attn_src *src, int64_t n_rows, int32_t nh) {
    size_t n = (size_t)src->n_cand, d = (size_t)src->d;
    b->nh = nh;
    b->mem = NULL;
    b->rows = nh <= COLSUM_MAX_QROWS ? COLSUM_MAX_QROWS / nh : 1;
    while (b->rows > 1 && (size_t)b->rows * (size_t)nh * n > COLSUM_MAX_BATCH_FLOATS) b->rows /= 2;
    if (b->rows > n_rows) b->rows = n_rows;
    if (b->rows <= 1) {
        b->rows = 1;
        return;
    }
    size_t qr = (size_t)b->rows * (size_t)nh;
    b->mem = malloc(qr * (d + n) * sizeof(float));
    if (!b->mem) {
        b->rows = 1;
        return;
    }
    for (size_t i = 0; i < qr; i++) b->prow[i] = b->mem + qr * d + i * n;
}

/* Probabilities of rows r0..r0+nr-1 (nr <= b->rows), heads h0..h0+nh-1, into b->prow; `*vis` as in
 * colsum_row_probs (carried across ascending rows). */
static void colsum_batch_probs(colsum_batch *b, const kvs_attn_src *src, int64_t r0, int64_t nr, int32_t h0,
                               int64_t *vis) {
    const kvs_math_kernels *k = kvs_math_kernels_active();
    size_t d = (size_t)src->d, nh = (size_t)b->nh;
    for (int64_t i = 0; i < nr; i++) {
        int64_t pos = src->q_first + r0 + i;
        if (src->idx) {
            while (*vis < src->n_cand && src->idx[*vis] <= pos) (*vis)++;
        } else {
            *vis = pos + 1 < src->n_cand ? pos + 1 : src->n_cand;
        }
        KVS_ASSERT(*vis > 0);
        b->vis[i] = *vis;
        const float *q = src->q + ((size_t)(r0 + i) * (size_t)src->group + (size_t)h0) * d;
        memcpy(b->mem + (size_t)i * nh * d, q, nh * d * sizeof(float)); /* a row's heads are contiguous */
    }
    size_t v0 = (size_t)b->vis[0]; /* the first row sees the fewest */
    k->scores(b->mem, (size_t)nr * nh, src->keys, d, src->idx, v0, d, src->scale, b->prow, 0);
    for (int64_t i = 1; i < nr; i++) {
        size_t extra = (size_t)b->vis[i] - v0;
        if (extra == 0) continue;
        const float *keys = src->idx ? src->keys : src->keys + v0 * d;
        k->scores(b->mem + (size_t)i * nh * d, nh, keys, d, src->idx ? src->idx + v0 : NULL, extra, d, src->scale,
                  b->prow + (size_t)i * nh, v0);
    }
    for (int64_t i = 0; i < nr; i++)
        for (size_t hh = 0; hh < nh; hh++) k->softmax_probs(b->prow[(size_t)i * nh + hh], (size_t)b->vis[i]);
}

/* fp32, head by head: S_h = the rows' column sums, then the heads combined (SnapKV's order). */
static void colsum_f32(const kvs_attn_src *src, const kvs_colsum_opts *o, float *out, void *scratch) {
    size_t n = (size_t)src->n_cand, n_out = (size_t)o->n_out;
    float *col = scratch, *mx = col + n, *p = (float *)((double *)scratch + n);
    size_t stride = o->head_stride > 0 ? (size_t)o->head_stride : n_out;
    colsum_batch b;
    colsum_batch_init(&b, src, o->n_rows, 1);
    for (int32_t hh = 0; hh < o->n_heads; hh++) {
        int64_t vis = 0, end = o->row_first + o->n_rows;
        for (size_t j = 0; j < n_out; j++) col[j] = 0;
        for (int64_t r0 = o->row_first; r0 < end; r0 += b.rows) {
            int64_t nr = end - r0 < b.rows ? end - r0 : b.rows;
            if (b.mem) colsum_batch_probs(&b, src, r0, nr, o->head_first + hh, &vis);
            for (int64_t i = 0; i < nr; i++) {
                const float *pp = b.mem ? b.prow[i] : p;
                int64_t v = b.mem ? b.vis[i] : colsum_row_probs(src, r0 + i, o->head_first + hh, &vis, p);
                size_t lim = (size_t)v < n_out ? (size_t)v : n_out;
                for (size_t j = 0; j < lim; j++) col[j] += pp[j];
            }
        }
        switch (o->reduce) {
        case KVS_GQA_NONE: {
            float *row = out + (size_t)hh * stride;
            for (size_t j = 0; j < n_out; j++) row[j] += col[j];
            break;
        }
        case KVS_GQA_SUM:
            for (size_t j = 0; j < n_out; j++) out[j] += col[j];
            break;
        case KVS_GQA_MEAN:
            for (size_t j = 0; j < n_out; j++) out[j] += col[j] / (float)o->n_heads;
            break;
        case KVS_GQA_MAX: /* the first head sets the max: starting from 0 would drop a NaN sum */
            for (size_t j = 0; j < n_out; j++) mx[j] = hh == 0 || col[j] > mx[j] ? col[j] : mx[j];
            break;
        }
    }
    if (o->reduce == KVS_GQA_MAX)
        for (size_t j = 0; j < n_out; j++) out[j] += mx[j];
    free(b.mem);
}

/* fp64, row by row: each row's heads reduced, then added (H2O/TOVA/Scissorhands' per-step order). */
static void colsum_f64(const kvs_attn_src *src, const kvs_colsum_opts *o, double *out, void *scratch) {
    size_t n = (size_t)src->n_cand, n_out = (size_t)o->n_out;
    double *t = scratch;
    float *p = (float *)(t + n);
    size_t stride = o->head_stride > 0 ? (size_t)o->head_stride : n_out;
    int64_t vis = 0, end = o->row_first + o->n_rows;
    colsum_batch b;
    colsum_batch_init(&b, src, o->n_rows, o->n_heads);
    for (int64_t r0 = o->row_first; r0 < end; r0 += b.rows) {
        int64_t nr = end - r0 < b.rows ? end - r0 : b.rows;
        if (b.mem) colsum_batch_probs(&b, src, r0, nr, o->head_first, &vis);
        for (int64_t i = 0; i < nr; i++) {
            if (b.mem && (o->reduce == KVS_GQA_SUM || o->reduce == KVS_GQA_MEAN)) {
                /* a batch row's heads reduced and added in one pass, the loops below' arithmetic */
                size_t lim = (size_t)b.vis[i] < n_out ? (size_t)b.vis[i] : n_out;
                kvs_heads_add((const float *const *)(b.prow + i * o->n_heads), (size_t)o->n_heads, lim,
                              o->reduce == KVS_GQA_MEAN, out);
                continue;
            }
            size_t lim = 0;
            for (int32_t hh = 0; hh < o->n_heads; hh++) {
                const float *pp = b.mem ? b.prow[i * o->n_heads + hh] : p;
                int64_t v = b.mem ? b.vis[i] : colsum_row_probs(src, r0 + i, o->head_first + hh, &vis, p);
                lim = (size_t)v < n_out ? (size_t)v : n_out;
                if (o->reduce == KVS_GQA_NONE) {
                    double *row = out + (size_t)hh * stride;
                    for (size_t j = 0; j < lim; j++) row[j] += pp[j];
                } else if (o->reduce == KVS_GQA_MAX) {
                    for (size_t j = 0; j < lim; j++) t[j] = hh == 0 || pp[j] > t[j] ? pp[j] : t[j];
                } else {
                    for (size_t j = 0; j < lim; j++) t[j] = (hh == 0 ? 0.0 : t[j]) + pp[j];
                }
            }
            if (o->reduce == KVS_GQA_MEAN) {
                for (size_t j = 0; j < lim; j++) out[j] += t[j] / (double)o->n_heads;
            } else if (o->reduce != KVS_GQA_NONE) {
                for (size_t j = 0; j < lim; j++) out[j] += t[j];
            }
        }
    }
    free(b.mem);
}

void kvs_attn_colsum(const kvs_attn_src *src, const kvs_colsum_opts *opts, float *out_f32, double *out_f64,
                     void *scratch) {
    KVS_ASSERT((out_f32 == NULL) != (out_f64 == NULL));
    KVS_ASSERT(opts->n_heads >= 1 && opts->head_first >= 0 && opts->head_first + opts->n_heads <= src->group);
    KVS_ASSERT(opts->n_rows == 0 || (opts->row_first >= 0 && opts->n_rows > 0 &&
                                     opts->row_first + opts->n_rows <= src->n_q));
    KVS_ASSERT(opts->n_out >= 0 && opts->n_out <= src->n_cand);
    if (out_f32) colsum_f32(src, opts, out_f32, scratch);
    else colsum_f64(src, opts, out_f64, scratch);
}

int64_t kvs_snapkv_scores(const kvs_attn_src *src, const kvs_snapkv_opts *opts, float *out, void *scratch) {
    int64_t w = opts->window < src->n_q ? opts->window : src->n_q;
    KVS_ASSERT(w >= 0 && w <= src->n_cand);
    int64_t m = src->n_cand - w; /* the scored prefix: candidates before the window */
    /* The window's queries must be the window's candidates: the first window row is candidate m. */
    KVS_ASSERT(w == 0 || (src->idx ? (int64_t)src->idx[m] : m) == src->q_first + src->n_q - w);
    if (m == 0) return 0;
    int32_t heads = opts->reduce == KVS_GQA_NONE ? opts->n_heads : 1;
    memset(out, 0, (size_t)heads * (size_t)m * sizeof *out);
    kvs_colsum_opts co = {.row_first = src->n_q - w, .n_rows = w, .head_first = opts->head_first,
                          .n_heads = opts->n_heads, .reduce = opts->reduce, .n_out = m, .head_stride = m};
    kvs_attn_colsum(src, &co, out, NULL, scratch);
    /* Pool each row through the (now free) scratch: the column sum is copied out, pooled back in place. */
    float *tmp = scratch;
    for (int32_t h = 0; h < heads; h++) {
        float *row = out + (size_t)h * (size_t)m;
        memcpy(tmp, row, (size_t)m * sizeof *tmp);
        if (opts->pool == KVS_POOL_MAX) kvs_maxpool1d(tmp, (size_t)m, (size_t)opts->kernel, row);
        else kvs_avgpool1d_pad(tmp, (size_t)m, (size_t)opts->kernel, row);
    }
    return m;
}

double kvs_l2(const float *a, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * a[i];
    return sqrt(s);
}

float kvs_cosine(const float *a, const float *b, size_t n) {
    double na = kvs_l2(a, n), nb = kvs_l2(b, n);
    if (na == 0 || nb == 0) return 0;
    double dot = 0;
    for (size_t i = 0; i < n; i++) dot += (double)a[i] * b[i];
    return (float)(dot / (na * nb));
}

double kvs_cosine_f64(const float *a, const float *b, size_t n) {
    double na = kvs_l2(a, n), nb = kvs_l2(b, n);
    if (na == 0 || nb == 0) return 0;
    double dot = 0;
    for (size_t i = 0; i < n; i++) dot += (double)a[i] * b[i];
    return dot / (na * nb);
}

double kvs_rel_l2(const float *ref, const float *x, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double e = (double)ref[i] - x[i];
        num += e * e;
        den += (double)ref[i] * ref[i];
    }
    if (den == 0) return num == 0 ? 0 : INFINITY;
    return sqrt(num / den);
}

/* ---- key-only eviction scores ---------------------------------------------------------------------- */

#define KVS_KEY_NORM_EPS 1e-12 /* F.normalize: k / max(|k|, eps) */
#define KVS_KEY_COS_EPS 1e-8   /* F.cosine_similarity: a.b / max(|a||b|, eps) (POLICY_SPEC §1.4) */

/* The fp64 sums (key norms, the anchor, the cosines' dot products) run on kvs_math_simd_f64.h's kernels, which
 * keep the scalar order of every sum: the same bits on every instruction set. */

static const float *key_row(const float *keys, size_t stride, const int32_t *idx, size_t j) {
    return keys + (idx ? (size_t)idx[j] : j) * stride;
}

/* The anchor mu = (1/n) sum_j w_j k_j, keys folded in ascending order a chunk at a time (their weights on the
 * stack): w_j = 1/max(|k_j|, eps) when normalized, |k_j| from norm[j] or (norm NULL, no caller scratch) computed
 * here per chunk; w_j = 1 when not. */
static void key_anchor_w(const float *keys, size_t stride, const int32_t *idx, size_t n, size_t d, int normalized,
                         const double *norm, double *mu, double *ck, size_t *ck_valid) {
    const kvs_math_f64_kernels *f = kvs_math_f64_kernels_active();
    enum { CHUNK = KVS_KEY_ANCHOR_CHUNK };
    double w[CHUNK];
    size_t c0 = 0; /* whole chunks whose running sum a checkpoint holds */
    if (ck) {
        c0 = *ck_valid < n / CHUNK ? *ck_valid : n / CHUNK;
        *ck_valid = c0;
    }
    if (c0 > 0) memcpy(mu, ck + (c0 - 1) * d, d * sizeof *mu);
    else
        for (size_t i = 0; i < d; i++) mu[i] = 0;
    for (size_t j0 = c0 * CHUNK; j0 < n; j0 += CHUNK) {
        size_t m = n - j0 < CHUNK ? n - j0 : CHUNK;
        const float *base = idx ? keys : keys + j0 * stride;
        const int32_t *sub = idx ? idx + j0 : NULL;
        if (!normalized) {
            for (size_t j = 0; j < m; j++) w[j] = 1.0;
        } else {
            if (norm) memcpy(w, norm + j0, m * sizeof *w);
            else f->norms(base, stride, sub, m, d, w);
            for (size_t j = 0; j < m; j++) w[j] = 1.0 / (w[j] > KVS_KEY_NORM_EPS ? w[j] : KVS_KEY_NORM_EPS);
        }
        f->wsum(base, stride, sub, m, d, w, mu);
        if (ck && m == CHUNK) { /* the sum after a whole chunk: where a later call over the same keys resumes */
            memcpy(ck + (j0 / CHUNK) * d, mu, d * sizeof *mu);
            *ck_valid = j0 / CHUNK + 1;
        }
    }
    if (n > 0)
        for (size_t i = 0; i < d; i++) mu[i] /= (double)n;
}

void kvs_key_anchor(const float *keys, size_t stride, const int32_t *idx, size_t n, size_t d, int normalized,
                    double *mu) {
    key_anchor_w(keys, stride, idx, n, d, normalized, NULL, mu, NULL, NULL);
}

void kvs_key_norms(const float *keys, size_t stride, const int32_t *idx, size_t n, size_t d, double *norm) {
    kvs_math_f64_kernels_active()->norms(keys, stride, idx, n, d, norm);
}

void kvs_key_scores(const float *keys, size_t stride, const int32_t *idx, size_t n, size_t d, kvs_key_score kind,
                    double *score, double *scratch) {
    double *norm = scratch; /* [n] key norms */
    kvs_key_norms(keys, stride, idx, n, d, norm);
    kvs_key_scores_normed(keys, stride, idx, n, d, kind, norm, score, scratch + n);
}

void kvs_key_scores_normed(const float *keys, size_t stride, const int32_t *idx, size_t n, size_t d,
                           kvs_key_score kind, const double *norm, double *score, double *scratch) {
    kvs_key_scores_resumed(keys, stride, idx, n, d, kind, norm, score, scratch, NULL, NULL);
}

static double anchor_norm(const double *mu, size_t d) {
    double s = 0;
    for (size_t i = 0; i < d; i++) s += mu[i] * mu[i];
    return sqrt(s);
}

/* -cos(k_j, mu) from k_j . mu: F.cosine_similarity's clamp of |k_j||mu| */
static double cos_score(double dot, double norm, double nmu) {
    double den = norm * nmu;
    return -dot / (den > KVS_KEY_COS_EPS ? den : KVS_KEY_COS_EPS);
}

/* score[j] = -cos(k_j, mu) of the first n keys: k_j . mu in fp64, then the cosine in place */
static void anchor_cosines(const float *keys, size_t stride, const int32_t *idx, size_t n, size_t d, const double *mu,
                           double nmu, const double *norm, double *score) {
    kvs_math_f64_kernels_active()->dots(keys, stride, idx, n, d, mu, score);
    for (size_t j = 0; j < n; j++) score[j] = cos_score(score[j], norm[j], nmu);
}

void kvs_key_scores_resumed(const float *keys, size_t stride, const int32_t *idx, size_t n, size_t d,
                            kvs_key_score kind, const double *norm, double *score, double *scratch, double *ck,
                            size_t *ck_valid) {
    if (kind == KVS_KEY_SCORE_L2NORM) {
        for (size_t j = 0; j < n; j++) score[j] = -norm[j];
        return;
    }
    if (kind == KVS_KEY_SCORE_PAIRWISE) { /* Eq. 7 as written: -sum_j cos(k_i, k_j), j over all n (self too) */
        for (size_t a = 0; a < n; a++) {
            const float *ka = key_row(keys, stride, idx, a);
            double s = 0;
            for (size_t b = 0; b < n; b++) {
                const float *kb = key_row(keys, stride, idx, b);
                double dot = 0, den = norm[a] * norm[b];
                for (size_t i = 0; i < d; i++) dot += (double)ka[i] * (double)kb[i];
                s += dot / (den > KVS_KEY_COS_EPS ? den : KVS_KEY_COS_EPS);
            }
            score[a] = -s;
        }
        return;
    }
    double *mu = scratch; /* [d] the anchor */
    key_anchor_w(keys, stride, idx, n, d, kind == KVS_KEY_SCORE_ANCHOR, norm, mu, ck, ck_valid);
    anchor_cosines(keys, stride, idx, n, d, mu, anchor_norm(mu, d), norm, score);
}

/* kvs_key_scores_lowest's order: the lowest score, the later among equals, a NaN (the last one) before any
 * number; over j < m, or over the m entries of `only` (ascending) when it is not NULL. */
static int64_t last_lowest(const double *score, const int32_t *only, size_t m) {
    int64_t w = -1;
    for (size_t c = 0; c < m; c++) {
        int64_t j = only ? only[c] : (int64_t)c;
        if (w < 0 || isnan(score[j]) || (!isnan(score[w]) && score[j] <= score[w])) w = j;
    }
    return w;
}

size_t kvs_key_scores_lowest_scratch_bytes(size_t n, size_t d) {
    /* mu [d] doubles, the exact dots of the candidates [n] doubles, mu in fp32 [d], the fp32 dots [n], the
     * candidates' rows and places [2n] int32 */
    return (d + n) * sizeof(double) + (d + n) * sizeof(float) + 2 * n * sizeof(int32_t);
}

/* The bound of the fp32 screen below. For key j, s~_j = -(double)dot32_j / den_j against the fp64
 * score s_j = -dot64_j / den_j (the same den_j). dot32 is the fp32 kernels' k_j . fl32(mu) (dots_loose), summed in some order
 * of d products: |dot32 - k.mu| <= gamma_d sum_i |k_i fl32(mu_i)| + u sum_i |k_i mu_i| + (2d) 2^-150 (the
 * products and sums that underflow, each off by at most half the least subnormal), u = 2^-24,
 * gamma_d = d u / (1 - d u) (Higham, Accuracy and Stability, 3.1: any order of summation), and with
 * Cauchy-Schwarz sum_i |k_i mu_i| <= |k||mu|, |fl32(mu)| <= (1 + u)|mu| (no mu_i subnormal in fp32: gated). dot64
 * is within gamma_d of fp64 of k.mu, norm_j and |mu| within (d/2 + 1) 2^-53 of |k|, |mu|, so
 * |k||mu| / den_j <= 1 + 1e-13, and the divisions round by 2^-53 each. All together the difference is below
 * (d + 3) 2^-24 (1.001) + 1e-12 while norm_j and |mu| lie in [2^-40, 2^40] (the underflow term then < 2^-60).
 * KEY_SCREEN_SLACK doubles it: the screen needs a bound, not a tight one. */
#define KEY_SCREEN_SLACK 2.0
#define KEY_SCREEN_LO 0x1p-40
#define KEY_SCREEN_HI 0x1p40

int64_t kvs_key_scores_lowest(const float *keys, size_t stride, const int32_t *idx, size_t n, size_t m, size_t d,
                              kvs_key_score kind, const double *norm, double *score, void *scratch, double *ck,
                              size_t *ck_valid) {
    KVS_ASSERT(m >= 1 && m <= n);
    double *mu = scratch, *exact = mu + d;
    if (kind != KVS_KEY_SCORE_ANCHOR && kind != KVS_KEY_SCORE_ANCHOR_RAW) {
        kvs_key_scores_resumed(keys, stride, idx, n, d, kind, norm, score, mu, ck, ck_valid);
        return last_lowest(score, NULL, m);
    }
    const kvs_math_f64_kernels *f = kvs_math_f64_kernels_active();
    float *mu32 = (float *)(exact + n), *dot32 = mu32 + d;
    int32_t *cand_row = (int32_t *)(dot32 + n), *cand = cand_row + n;
    key_anchor_w(keys, stride, idx, n, d, kind == KVS_KEY_SCORE_ANCHOR, norm, mu, ck, ck_valid);
    double nmu = anchor_norm(mu, d);
    /* The screen needs mu in fp32's normal range (a subnormal fp32 mu_i would be off by more than u) and |mu|
     * where the bound above holds; otherwise every score exactly, as kvs_key_scores_resumed has them. */
    int screen = nmu >= KEY_SCREEN_LO && nmu <= KEY_SCREEN_HI;
    for (size_t i = 0; i < d && screen; i++) {
        double a = fabs(mu[i]);
        screen = a == 0 || (a >= 0x1p-100 && a <= 0x1p100);
        mu32[i] = (float)mu[i];
    }
    if (!screen) {
        anchor_cosines(keys, stride, idx, m, d, mu, nmu, norm, score);
        return last_lowest(score, NULL, m);
    }
    kvs_math_kernels_active()->dots_loose(mu32, keys, stride, idx, m, d, dot32);
    double eps = KEY_SCREEN_SLACK * ((double)(d + 3) * 0x1p-24 * 1.001 + 1e-12);
    /* A key whose norm lies outside [2^-40, 2^40] (zero, subnormal, huge, inf, NaN) or whose fp32 dot is not
     * finite has no bound: it is always a candidate (score[j] = NaN marks it here). */
    double lo = INFINITY;
    for (size_t j = 0; j < m; j++) {
        int bounded = norm[j] >= KEY_SCREEN_LO && norm[j] <= KEY_SCREEN_HI && isfinite(dot32[j]);
        score[j] = bounded ? cos_score((double)dot32[j], norm[j], nmu) : NAN;
        if (bounded && score[j] < lo) lo = score[j];
    }
    /* Every key with s~_j > lo + 2 eps has s_j > lo + eps >= s of the key that gave lo >= the lowest: it is
     * neither the lowest nor tied with it. The others are scored exactly, in ascending j. */
    double cut = lo + 2 * eps;
    size_t nc = 0;
    for (size_t j = 0; j < m; j++)
        if (isnan(score[j]) || score[j] <= cut) {
            cand[nc] = (int32_t)j;
            cand_row[nc++] = idx ? idx[j] : (int32_t)j;
        }
    f->dots(keys, stride, cand_row, nc, d, mu, exact);
    for (size_t c = 0; c < nc; c++) score[cand[c]] = cos_score(exact[c], norm[cand[c]], nmu);
    return last_lowest(score, cand, nc);
}

/* ---- sparse-attention estimation (RocketKV HSA, Quest, SparQ) ---- */

void kvs_page_minmax_add(float *kmin, float *kmax, const float *k, size_t d, int first) {
    if (first) {
        memcpy(kmin, k, d * sizeof *k);
        if (kmax != kmin) memcpy(kmax, k, d * sizeof *k);
        return;
    }
    /* Every element stored, the choice a select, not a branch: the loop vectorizes (minps/maxps keep the old
     * value on a NaN exactly as the compares do); conditional stores would be a branch per element (they made the
     * page summaries 10% of Quest's replay time). Element by element in the same order, so a kmax that
     * is kmin sees the min just stored, as before. */
    for (size_t i = 0; i < d; i++) {
        float x = k[i], lo = kmin[i];
        kmin[i] = x < lo ? x : lo;
        float hi = kmax[i];
        kmax[i] = x > hi ? x : hi;
    }
}


void kvs_qdims_topk(const float *q, size_t group, size_t d, size_t k, int32_t *dims, uint8_t *use_max,
                    double *scratch) {
    KVS_ASSERT(k <= d);
    for (size_t i = 0; i < d; i++) {
        double a = 0;
        for (size_t g = 0; g < group; g++) a += fabs((double)q[g * d + i]);
        scratch[i] = a;
    }
    kvs_topk_f64(scratch, d, k, dims);
    kvs_sort_positions(dims, k);
    if (!use_max) return;
    for (size_t m = 0; m < k; m++) {
        double s = 0;
        for (size_t g = 0; g < group; g++) s += (double)q[g * d + (size_t)dims[m]];
        use_max[m] = s >= 0;
    }
}

void kvs_page_scores(const float *q, const int32_t *dims, size_t n_dims, const uint8_t *use_max, const float *kmin,
                     const float *kmax, size_t stride, size_t n_pages, double *out) {
    enum { MAX_VEC_DIMS = 1024 };
    if (!dims && n_dims <= MAX_VEC_DIMS) { /* every dimension (Quest, HSA's full pass): the vector kernel */
        uint8_t up[MAX_VEC_DIMS];
        for (size_t i = 0; i < n_dims; i++) up[i] = use_max ? use_max[i] != 0 : q[i] >= 0;
        kvs_math_f64_kernels_active()->page_scores(q, up, kmin, kmax, stride, n_pages, n_dims, out);
        return;
    }
    for (size_t pi = 0; pi < n_pages; pi++) {
        const float *lo = kmin + pi * stride, *hi = kmax + pi * stride;
        double s = 0;
        for (size_t m = 0; m < n_dims; m++) {
            size_t i = dims ? (size_t)dims[m] : m;
            int up = use_max ? use_max[m] : q[i] >= 0;
            s += (double)q[i] * (double)(up ? hi[i] : lo[i]);
        }
        out[pi] = s;
    }
}

void kvs_page_scores_rows(const float *q, size_t nq, size_t d, const float *kmin, const float *kmax, size_t stride,
                          size_t n_pages, double *out) {
    enum { MAX_VEC_DIMS = 1024, ROWS = 8 }; /* the up rows live on the stack: 8 KiB */
    if (d > MAX_VEC_DIMS) {
        for (size_t r = 0; r < nq; r++)
            kvs_page_scores(q + r * d, NULL, d, NULL, kmin, kmax, stride, n_pages, out + r * n_pages);
        return;
    }
    uint8_t up[ROWS * MAX_VEC_DIMS];
    for (size_t r0 = 0; r0 < nq; r0 += ROWS) {
        size_t nr = nq - r0 < ROWS ? nq - r0 : ROWS;
        for (size_t i = 0; i < nr * d; i++) up[i] = q[r0 * d + i] >= 0;
        kvs_math_f64_kernels_active()->page_scores_rows(q + r0 * d, nr, up, kmin, kmax, stride, n_pages, d,
                                                        out + r0 * n_pages);
    }
}

double kvs_sparq_temperature(const float *q, const int32_t *dims, size_t n_dims, size_t d) {
    double part = 0, all = 0;
    for (size_t m = 0; m < n_dims; m++) part += fabs((double)q[dims ? (size_t)dims[m] : m]);
    for (size_t i = 0; i < d; i++) all += fabs((double)q[i]);
    if (all == 0) return 1.0;
    return sqrt((double)d * part / all);
}

void kvs_page_softmax_add(const double *score, size_t n_pages, size_t page, size_t n_tokens, double temp, double *out) {
    KVS_ASSERT(n_pages >= 1 && temp > 0);
    double m = -INFINITY;
    for (size_t pi = 0; pi < n_pages; pi++)
        if (score[pi] / temp > m) m = score[pi] / temp;
    double z = 0;
    for (size_t pi = 0; pi < n_pages; pi++) {
        size_t cnt = n_tokens - pi * page < page ? n_tokens - pi * page : page;
        z += (double)cnt * exp(score[pi] / temp - m);
    }
    for (size_t pi = 0; pi < n_pages; pi++) out[pi] += exp(score[pi] / temp - m) / z;
}

/* The live slots of page pi within [lo, hi) (pages of `page` aligned at slot 0). */
static size_t span_count(size_t pi, size_t page, size_t lo, size_t hi) {
    size_t a = pi * page > lo ? pi * page : lo, b = (pi + 1) * page < hi ? (pi + 1) * page : hi;
    return b > a ? b - a : 0;
}

void kvs_page_softmax_add_span(const double *score, size_t page, size_t lo, size_t hi, double temp, double *out) {
    KVS_ASSERT(lo < hi && temp > 0);
    size_t fp = lo / page, n_pages = (hi - 1) / page - fp + 1;
    double m = -INFINITY;
    for (size_t i = 0; i < n_pages; i++)
        if (score[i] / temp > m) m = score[i] / temp;
    double z = 0;
    for (size_t i = 0; i < n_pages; i++) z += (double)span_count(fp + i, page, lo, hi) * exp(score[i] / temp - m);
    for (size_t i = 0; i < n_pages; i++) out[i] += exp(score[i] / temp - m) / z;
}

int64_t kvs_page_select_span(const double *score, size_t page, size_t lo, size_t hi, size_t k, int whole, int32_t *out,
                             int32_t *scratch) {
    if (hi <= lo) return 0;
    if (k > hi - lo) k = hi - lo;
    if (k == 0) return 0;
    size_t fp = lo / page, n_pages = (hi - 1) / page - fp + 1;
    /* every page but the first and the last is full: k/page + 3 ranked pages cover k slots */
    size_t need = k / page + 3 < n_pages ? k / page + 3 : n_pages;
    kvs_topk_f64(score, n_pages, need, scratch);
    /* the pages in rank order while they fit, the one that does not cut to its first live slots (or dropped) */
    size_t got = 0, np = 0, cut = SIZE_MAX, cut_cnt = 0;
    for (size_t r = 0; r < need && got < k; r++) {
        size_t pi = fp + (size_t)scratch[r], cnt = span_count(pi, page, lo, hi);
        if (cnt > k - got) {
            if (whole) break;
            cut = pi;
            cnt = cut_cnt = k - got;
        }
        got += cnt;
        scratch[np++] = (int32_t)pi;
    }
    kvs_sort_positions(scratch, np);
    size_t w = 0;
    for (size_t i = 0; i < np; i++) {
        size_t pi = (size_t)scratch[i], first = pi * page > lo ? pi * page : lo;
        size_t cnt = pi == cut ? cut_cnt : span_count(pi, page, lo, hi);
        for (size_t j = 0; j < cnt; j++) out[w++] = (int32_t)(first + j);
    }
    KVS_ASSERT(w == got);
    return (int64_t)got;
}

size_t kvs_page_select_depth(size_t n_pages, size_t page, size_t k) {
    /* enough ranked pages to cover k tokens: every page but the last is full */
    size_t need = k / page + 2;
    return need < n_pages ? need : n_pages;
}

int64_t kvs_page_take(const int32_t *ranked, size_t n_ranked, size_t page, size_t n_tokens, size_t k, int32_t *out) {
    if (k > n_tokens) k = n_tokens;
    if (k == 0) return 0;
    /* The pages in rank order until they hold k tokens, the last one cut to its first tokens; their numbers in
     * out[0..np). */
    size_t got = 0, np = 0, cut = SIZE_MAX, cut_cnt = 0;
    for (size_t r = 0; r < n_ranked && got < k; r++) {
        size_t pi = (size_t)ranked[r], first = pi * page;
        size_t cnt = n_tokens - first < page ? n_tokens - first : page;
        if (cnt > k - got) {
            cut = pi;
            cnt = cut_cnt = k - got;
        }
        got += cnt;
        out[np++] = (int32_t)pi;
    }
    KVS_ASSERT(got == k);
    /* The pages in ascending order, expanded from the back of out: the slots of the i-th page land at out[i] or
     * later (each page before it adds one slot at least), past the page numbers still to be read. Ascending
     * pages give ascending slots: no sort of the k slots. */
    kvs_sort_positions(out, np);
    size_t w = k;
    for (size_t i = np; i-- > 0;) {
        size_t pi = (size_t)out[i], first = pi * page;
        size_t cnt = pi == cut ? cut_cnt : (n_tokens - first < page ? n_tokens - first : page);
        w -= cnt;
        for (size_t j = cnt; j-- > 0;) out[w + j] = (int32_t)(first + j);
    }
    KVS_ASSERT(w == 0);
    return (int64_t)k;
}

int64_t kvs_page_select(const double *score, size_t n_pages, size_t page, size_t n_tokens, size_t k, int32_t *out,
                        int32_t *scratch) {
    if (k > n_tokens) k = n_tokens;
    if (k == 0) return 0;
    size_t need = kvs_page_select_depth(n_pages, page, k);
    kvs_topk_f64(score, n_pages, need, scratch);
    return kvs_page_take(scratch, need, page, n_tokens, k, out);
}
