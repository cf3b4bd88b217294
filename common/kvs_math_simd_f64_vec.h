/* kvs_math_simd_f64_vec.h — the vector fp64 kernels of kvs_math_simd_f64.c, written once and compiled once per
 * target there (included twice): AVX2 + FMA with the 16 ymm registers, and the same AVX2 arithmetic with
 * AVX-512VL's 32 (EVEX encoding, 256-bit operations), as kvs_math_simd.c's avx2x32 table. Both give the scalar
 * table's bits (kvs_math_simd_f64.h): the register count changes only what the compiler must spill; with 16,
 * dots' four groups of transposed rows spill their sums, each add a store and a load.
 *
 * The includer defines F64_TARGET (the function attribute), F64_FN(name) (the name of this instance's kernel)
 * and F64_TABLE_NAME, and has row_at(), the scalar tails (norm_scalar, dot_scalar, page_scalar, page_rows_finish,
 * out_sums_row, out_sums_scalar, recall_lane, heads_cols), UNROLL, GROUPS and <immintrin.h>. Not a header of its own: no include guard.
 */

/* Rows r0..r3 (8 floats each, dimensions i..i+7) -> x[m] = the 4 rows' dimension i+m, widened to fp64. */
F64_TARGET static inline void F64_FN(transpose4x8)(__m256 r0, __m256 r1, __m256 r2, __m256 r3, __m256d x[8]) {
    __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
    __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    x[0] = _mm256_cvtps_pd(_mm256_castps256_ps128(u0));
    x[1] = _mm256_cvtps_pd(_mm256_castps256_ps128(u1));
    x[2] = _mm256_cvtps_pd(_mm256_castps256_ps128(u2));
    x[3] = _mm256_cvtps_pd(_mm256_castps256_ps128(u3));
    x[4] = _mm256_cvtps_pd(_mm256_extractf128_ps(u0, 1));
    x[5] = _mm256_cvtps_pd(_mm256_extractf128_ps(u1, 1));
    x[6] = _mm256_cvtps_pd(_mm256_extractf128_ps(u2, 1));
    x[7] = _mm256_cvtps_pd(_mm256_extractf128_ps(u3, 1));
}

/* The 4 * GROUPS lane sums of rows r[0..4*GROUPS) over dimensions 0..d8-1 (d8 a multiple of 8) into s:
 * sum_i (double)k[i] * (double)k[i] when `squares` (norms), else sum_i (double)k[i] * v[i] (dots). Inlined into
 * each with `squares` a constant, so each gets its own loop. */
__attribute__((always_inline)) F64_TARGET static inline void F64_FN(lane_sums)(const float *const *r, size_t d8,
                                                                                 int squares, const double *v,
                                                                                 double *s) {
    __m256d acc[GROUPS];
    for (int g = 0; g < GROUPS; g++) acc[g] = _mm256_setzero_pd();
    for (size_t i = 0; i < d8; i += 8) {
        UNROLL
        for (int g = 0; g < GROUPS; g++) {
            __m256d x[8];
            F64_FN(transpose4x8)(_mm256_loadu_ps(r[4 * g] + i), _mm256_loadu_ps(r[4 * g + 1] + i),
                                 _mm256_loadu_ps(r[4 * g + 2] + i), _mm256_loadu_ps(r[4 * g + 3] + i), x);
            UNROLL
            for (int m = 0; m < 8; m++) {
                __m256d y = squares ? x[m] : _mm256_broadcast_sd(v + i + (size_t)m);
                acc[g] = _mm256_add_pd(acc[g], _mm256_mul_pd(x[m], y));
            }
        }
    }
    for (int g = 0; g < GROUPS; g++) _mm256_storeu_pd(s + 4 * g, acc[g]);
}

/* norms (v NULL: sqrt of each key's sum of squares) or dots (each key . v) of n keys, 4 * GROUPS keys a pass
 * through lane_sums, the d % 8 last dimensions and the n % (4 * GROUPS) last keys in scalar, in order. Inlined
 * into each with v a constant NULL or not, so each keeps its own loop. */
__attribute__((always_inline)) F64_TARGET static inline void F64_FN(key_sums)(const float *keys, size_t stride,
                                                                                const int32_t *idx, size_t n,
                                                                                size_t d, const double *v,
                                                                                double *out) {
    size_t d8 = d & ~(size_t)7, j = 0;
    for (; j + 4 * GROUPS <= n; j += 4 * GROUPS) {
        const float *r[4 * GROUPS];
        for (int l = 0; l < 4 * GROUPS; l++) r[l] = row_at(keys, stride, idx, j + (size_t)l);
        double s[4 * GROUPS];
        F64_FN(lane_sums)(r, d8, v == NULL, v, s);
        for (int l = 0; l < 4 * GROUPS; l++)
            out[j + (size_t)l] = v ? dot_scalar(r[l], v, d8, d, s[l]) : sqrt(norm_scalar(r[l], d8, d, s[l]));
    }
    for (; j < n; j++) {
        const float *k = row_at(keys, stride, idx, j);
        out[j] = v ? dot_scalar(k, v, 0, d, 0) : sqrt(norm_scalar(k, 0, d, 0));
    }
}

F64_TARGET static void F64_FN(norms)(const float *keys, size_t stride, const int32_t *idx, size_t n, size_t d,
                                     double *out) {
    F64_FN(key_sums)(keys, stride, idx, n, d, NULL, out);
}

F64_TARGET static void F64_FN(dots)(const float *keys, size_t stride, const int32_t *idx, size_t n, size_t d,
                                    const double *v, double *out) {
    F64_FN(key_sums)(keys, stride, idx, n, d, v, out);
}

F64_TARGET static void F64_FN(page_scores)(const float *q, const uint8_t *up, const float *kmin, const float *kmax,
                                  size_t stride, size_t n_pages, size_t d, double *out) {
    size_t d8 = d & ~(size_t)7, pi = 0;
    for (; pi + 4 * GROUPS <= n_pages; pi += 4 * GROUPS) {
        __m256d acc[GROUPS];
        for (int g = 0; g < GROUPS; g++) acc[g] = _mm256_setzero_pd();
        for (size_t i = 0; i < d8; i += 8) {
            /* lanes whose dimension reads kmax: up[i..i+7] != 0 */
            __m128i u8 = _mm_loadl_epi64((const __m128i *)(const void *)(up + i));
            __m256 sel = _mm256_castsi256_ps(
                _mm256_cmpgt_epi32(_mm256_cvtepu8_epi32(u8), _mm256_setzero_si256()));
            UNROLL
            for (int g = 0; g < GROUPS; g++) {
                __m256 rw[4];
                UNROLL
                for (int l = 0; l < 4; l++) {
                    size_t off = (pi + 4 * (size_t)g + (size_t)l) * stride + i;
                    rw[l] = _mm256_blendv_ps(_mm256_loadu_ps(kmin + off), _mm256_loadu_ps(kmax + off), sel);
                }
                __m256d x[8];
                F64_FN(transpose4x8)(rw[0], rw[1], rw[2], rw[3], x);
                UNROLL
                for (int m = 0; m < 8; m++)
                    acc[g] = _mm256_add_pd(acc[g], _mm256_mul_pd(x[m], _mm256_set1_pd((double)q[i + (size_t)m])));
            }
        }
        double s[4 * GROUPS];
        for (int g = 0; g < GROUPS; g++) _mm256_storeu_pd(s + 4 * g, acc[g]);
        for (size_t l = 0; l < 4 * GROUPS; l++)
            out[pi + l] = page_scalar(q, up, kmin + (pi + l) * stride, kmax + (pi + l) * stride, d8, d, s[l]);
    }
    for (; pi < n_pages; pi++) out[pi] = page_scalar(q, up, kmin + pi * stride, kmax + pi * stride, 0, d, 0);
}

/* Four pages at a time (one output per lane, as page_scores), their kmin and kmax rows widened once per 8
 * dimensions and shared by up to 4 query rows: a row's lane picks kmax or kmin whole per dimension (its up[i]),
 * then the same mul and add in the same order as page_scores, so the same bits. */
F64_TARGET static void F64_FN(page_scores_rows)(const float *q, size_t nq, const uint8_t *up, const float *kmin,
                                       const float *kmax, size_t stride, size_t n_pages, size_t d, double *out) {
    enum { ROWS = 4 };
    size_t d8 = d & ~(size_t)7;
    for (size_t r0 = 0; r0 < nq; r0 += ROWS) {
        size_t nr = nq - r0 < ROWS ? nq - r0 : ROWS, pi = 0;
        const float *qr = q + r0 * d;
        const uint8_t *ur = up + r0 * d;
        for (; pi + 4 <= n_pages; pi += 4) {
            __m256d acc[ROWS];
            for (size_t r = 0; r < ROWS; r++) acc[r] = _mm256_setzero_pd();
            for (size_t i = 0; i < d8; i += 8) {
                const float *lo = kmin + pi * stride + i, *hi = kmax + pi * stride + i;
                __m256d xl[8], xh[8];
                F64_FN(transpose4x8)(_mm256_loadu_ps(lo), _mm256_loadu_ps(lo + stride),
                                     _mm256_loadu_ps(lo + 2 * stride), _mm256_loadu_ps(lo + 3 * stride), xl);
                F64_FN(transpose4x8)(_mm256_loadu_ps(hi), _mm256_loadu_ps(hi + stride),
                                     _mm256_loadu_ps(hi + 2 * stride), _mm256_loadu_ps(hi + 3 * stride), xh);
                for (size_t r = 0; r < nr; r++)
                    for (size_t m = 0; m < 8; m++) {
                        __m256d sel = _mm256_castsi256_pd(_mm256_set1_epi64x(-(int64_t)(ur[r * d + i + m] != 0)));
                        __m256d x = _mm256_blendv_pd(xl[m], xh[m], sel);
                        acc[r] = _mm256_add_pd(acc[r], _mm256_mul_pd(x, _mm256_set1_pd((double)qr[r * d + i + m])));
                    }
            }
            double s[ROWS * 4];
            for (size_t r = 0; r < nr; r++) _mm256_storeu_pd(s + 4 * r, acc[r]);
            page_rows_finish(qr, ur, kmin, kmax, stride, n_pages, d, d8, r0, nr, pi, 4, s, out);
        }
        static const double zero[ROWS] = {0};
        for (; pi < n_pages; pi++) page_rows_finish(qr, ur, kmin, kmax, stride, n_pages, d, 0, r0, nr, pi, 1, zero, out);
    }
}

/* 32 dimensions of the sums at a time (8 vectors) held in registers across all n keys: each key's 32 floats
 * widened, multiplied by its weight and added, key after key, so each acc[i] is the scalar loop's chain in order.
 * (One key at a time over all d, as the axpy it replaces, sent each acc vector through a store and a load per
 * key.) The d % 32 last dimensions 4 at a time, then one by one, in the same key order. */
F64_TARGET static void F64_FN(wsum)(const float *keys, size_t stride, const int32_t *idx, size_t n, size_t d,
                                    const double *w, double *acc) {
    size_t i = 0;
    for (; i + 32 <= d; i += 32) {
        __m256d a[8];
        UNROLL
        for (int m = 0; m < 8; m++) a[m] = _mm256_loadu_pd(acc + i + 4 * (size_t)m);
        for (size_t j = 0; j < n; j++) {
            const float *k = row_at(keys, stride, idx, j) + i;
            if (idx && j + WSUM_AHEAD < n) { /* scattered rows: a later one's 128 bytes on their way */
                const char *ahead = (const char *)(row_at(keys, stride, idx, j + WSUM_AHEAD) + i);
                _mm_prefetch(ahead, _MM_HINT_T0);
                _mm_prefetch(ahead + 64, _MM_HINT_T0);
            }
            __m256d wv = _mm256_set1_pd(w[j]);
            UNROLL
            for (int m = 0; m < 8; m++)
                a[m] = _mm256_add_pd(a[m], _mm256_mul_pd(wv, _mm256_cvtps_pd(_mm_loadu_ps(k + 4 * m))));
        }
        UNROLL
        for (int m = 0; m < 8; m++) _mm256_storeu_pd(acc + i + 4 * (size_t)m, a[m]);
    }
    for (; i + 4 <= d; i += 4) {
        __m256d a = _mm256_loadu_pd(acc + i);
        for (size_t j = 0; j < n; j++)
            a = _mm256_add_pd(a, _mm256_mul_pd(_mm256_set1_pd(w[j]),
                                               _mm256_cvtps_pd(_mm_loadu_ps(row_at(keys, stride, idx, j) + i))));
        _mm256_storeu_pd(acc + i, a);
    }
    if (i < d)
        for (size_t j = 0; j < n; j++) {
            const float *k = row_at(keys, stride, idx, j);
            for (size_t t = i; t < d; t++) acc[t] += w[j] * (double)k[t];
        }
}

F64_TARGET static size_t F64_FN(first_above)(const double *x, size_t from, size_t n, double thr) {
    __m256d t = _mm256_set1_pd(thr);
    size_t j = from;
    for (; j + 4 <= n; j += 4) {
        int mask = _mm256_movemask_pd(_mm256_cmp_pd(_mm256_loadu_pd(x + j), t, _CMP_GT_OQ));
        if (mask) return j + (size_t)__builtin_ctz((unsigned)mask);
    }
    for (; j < n; j++)
        if (x[j] > thr) return j;
    return n;
}

/* Four rows at a time, one per lane: 4 dimensions of the 4 rows transposed in registers (vectors of the 4 rows'
 * dimension i+m, widened to fp64), then the scalar loop's subtract, multiplies and adds dimension by dimension;
 * fewer than 4 rows, or the d % 4 last dimensions, continue in scalar, in order. The four sums of one pass are
 * four dependent chains of vector adds instead of sixteen of scalar ones. */
F64_TARGET static void F64_FN(out_sums)(const float *const *ref, const float *const *out, size_t nr, size_t d,
                                        double *sums) {
    size_t d4 = d & ~(size_t)3, r = 0;
    for (; r + 4 <= nr; r += 4) {
        __m256d e = _mm256_setzero_pd(), f = _mm256_setzero_pd(), o = _mm256_setzero_pd(), t = _mm256_setzero_pd();
        for (size_t i = 0; i < d4; i += 4) {
            __m128 a0 = _mm_loadu_ps(ref[r] + i), a1 = _mm_loadu_ps(ref[r + 1] + i), a2 = _mm_loadu_ps(ref[r + 2] + i),
                   a3 = _mm_loadu_ps(ref[r + 3] + i);
            __m128 b0 = _mm_loadu_ps(out[r] + i), b1 = _mm_loadu_ps(out[r + 1] + i), b2 = _mm_loadu_ps(out[r + 2] + i),
                   b3 = _mm_loadu_ps(out[r + 3] + i);
            _MM_TRANSPOSE4_PS(a0, a1, a2, a3);
            _MM_TRANSPOSE4_PS(b0, b1, b2, b3);
            __m128 av[4] = {a0, a1, a2, a3}, bv[4] = {b0, b1, b2, b3};
            for (int m = 0; m < 4; m++) {
                __m256d a = _mm256_cvtps_pd(av[m]), b = _mm256_cvtps_pd(bv[m]), x = _mm256_sub_pd(a, b);
                e = _mm256_add_pd(e, _mm256_mul_pd(x, x));
                f = _mm256_add_pd(f, _mm256_mul_pd(a, a));
                o = _mm256_add_pd(o, _mm256_mul_pd(b, b));
                t = _mm256_add_pd(t, _mm256_mul_pd(a, b));
            }
        }
        double se[4], sf[4], so[4], st[4];
        _mm256_storeu_pd(se, e);
        _mm256_storeu_pd(sf, f);
        _mm256_storeu_pd(so, o);
        _mm256_storeu_pd(st, t);
        for (size_t l = 0; l < 4; l++) {
            double *sr = sums + 4 * (r + l);
            sr[0] = se[l], sr[1] = sf[l], sr[2] = so[l], sr[3] = st[l];
            out_sums_row(ref[r + l], out[r + l], d4, d, sr);
        }
    }
    if (r < nr) out_sums_scalar(ref + r, out + r, nr - r, d, sums + 4 * r);
}

/* The 4 lanes step through their lists together, one entry a step: the 4 probabilities loaded (scalar loads into
 * one vector), widened to fp64 and added (lane k's chain in its order), the 4 ranks loaded and compared with the
 * lanes' thresholds th (the true lanes counted). With one list for all lanes (a KV head's shared S_t) each step loads one position.
 * A scalar loop loses its time keeping 16 pointers and counters in 15 registers; AVX2's gathers measured slower
 * than these loads on Zen 4. */
__attribute__((always_inline)) F64_TARGET static inline void F64_FN(recall4_loop)(
    const float *const fp[4], const int32_t *const list[4], const int32_t *const rank[4], __m128i th, size_t n,
    int shared, __m256d *acc, __m128i *hits) {
    const float *f0 = fp[0], *f1 = fp[1], *f2 = fp[2], *f3 = fp[3];
    const int32_t *l0 = list[0], *l1 = list[1], *l2 = list[2], *l3 = list[3];
    __m256d a = *acc;
    __m128i h = *hits;
    for (size_t j = 0; j < n; j++) {
        int32_t x0 = l0[j], x1 = shared ? x0 : l1[j], x2 = shared ? x0 : l2[j], x3 = shared ? x0 : l3[j];
        a = _mm256_add_pd(a, _mm256_cvtps_pd(_mm_setr_ps(f0[x0], f1[x1], f2[x2], f3[x3])));
        if (rank) {
            __m128i rk = _mm_setr_epi32(rank[0][x0], rank[1][x1], rank[2][x2], rank[3][x3]);
            h = _mm_sub_epi32(h, _mm_cmplt_epi32(rk, th));
        }
    }
    *acc = a, *hits = h;
}

F64_TARGET static void F64_FN(recall4)(int m, const float *const fp[4], const int32_t *const list[4],
                                       const int32_t *const rank[4], const int64_t n[4], double r[4],
                                       int64_t hit[4]) {
    /* the entries every lane has, when all 4 lanes run and the thresholds and counts fit 32-bit lanes */
    int64_t common = m == 4 ? n[0] : 0, most = n[0];
    for (int k = 1; k < m; k++) {
        if (n[k] < common) common = n[k];
        if (n[k] > most) most = n[k];
    }
    size_t nv = common > 0 && most <= INT32_MAX ? (size_t)common : 0;
    __m256d acc = _mm256_setzero_pd();
    __m128i hits = _mm_setzero_si128(), th = _mm_setzero_si128();
    if (nv && rank) th = _mm_setr_epi32((int32_t)n[0], (int32_t)n[1], (int32_t)n[2], (int32_t)n[3]);
    int shared = nv && list[1] == list[0] && list[2] == list[0] && list[3] == list[0];
    if (shared && rank)
        F64_FN(recall4_loop)(fp, list, rank, th, nv, 1, &acc, &hits);
    else if (shared)
        F64_FN(recall4_loop)(fp, list, NULL, th, nv, 1, &acc, &hits);
    else if (rank)
        F64_FN(recall4_loop)(fp, list, rank, th, nv, 0, &acc, &hits);
    else
        F64_FN(recall4_loop)(fp, list, NULL, th, nv, 0, &acc, &hits);
    double rv[4];
    int32_t hv[4];
    _mm256_storeu_pd(rv, acc);
    _mm_storeu_si128((__m128i *)(void *)hv, hits);
    for (int k = 0; k < m; k++) { /* each lane's rest (or all of it), continuing in order */
        r[k] = rv[k], hit[k] = hv[k];
        recall_lane(fp[k], list[k], rank ? rank[k] : NULL, n[k], nv, (size_t)n[k], &r[k], &hit[k]);
    }
}

/* 4 columns a vector: the heads' widened probabilities added from 0 in head order, the mean's product or quotient,
 * the add to out; every lane the scalar table's operations on its column, so its bits. The rest one by one. */
F64_TARGET static void F64_FN(heads_add)(const float *const *p, size_t nh, size_t n, int mean, double *out) {
    int pow2 = (nh & (nh - 1)) == 0;
    __m256d vinv = _mm256_set1_pd(1.0 / (double)nh), vnh = _mm256_set1_pd((double)nh);
    size_t j = 0;
    for (; j + 4 <= n; j += 4) {
        __m256d t = _mm256_setzero_pd();
        for (size_t h = 0; h < nh; h++) t = _mm256_add_pd(t, _mm256_cvtps_pd(_mm_loadu_ps(p[h] + j)));
        if (mean) t = pow2 ? _mm256_mul_pd(t, vinv) : _mm256_div_pd(t, vnh);
        _mm256_storeu_pd(out + j, _mm256_add_pd(_mm256_loadu_pd(out + j), t));
    }
    heads_cols(p, nh, j, n, mean, out);
}

static const kvs_math_f64_kernels F64_FN(f64) = {
    /* .name = */ F64_TABLE_NAME,
    /* .norms = */ F64_FN(norms),
    /* .dots = */ F64_FN(dots),
    /* .page_scores = */ F64_FN(page_scores),
    /* .wsum = */ F64_FN(wsum),
    /* .first_above = */ F64_FN(first_above),
    /* .page_scores_rows = */ F64_FN(page_scores_rows),
    /* .out_sums = */ F64_FN(out_sums),
    /* .recall4 = */ F64_FN(recall4),
    /* .heads_add = */ F64_FN(heads_add),
};
