/* test_attn_lists.c — kvs_attention_lists() / kvs_attention_lists16() (common/kvs_math.h; sim/BENCH.md
 * "Per-query-head lists"): the per-query-head selections of a KV head computed over their union must give every row's
 * probabilities and output bit for bit as kvs_attention() over the row's own list does, on the kernel table in
 * use (run with KVS_SIMD=scalar / avx512 for the others):
 *  - overlapping ascending lists (the union path), lists with probabilities that underflow to zero and negative
 *    values (the zero weights of non-members must not change a bit), head_dims with and without tails;
 *  - lists the union path must refuse (not ascending, duplicates, an empty list, a union far larger than the
 *    lists), which fall back to row by row: the same bits and the return value says which path ran;
 *  - lists over a sparse span and lists far from position 0;
 *  - the union's size limit at its edge, a position at cap, repeats and a descent at a list's end, positions on
 *    the union bitmap's word edges, a list that is the whole union, and 64 and 65 query rows;
 *  - the 16-bit variant against kvs_attention() on the rows' exact fp32 conversion;
 *  - kvs_attention_lists_scored_defer() (the scores gathered from rows computed once against every position)
 *    then kvs_out_calls_run() on every list of check_lists: the same path and the same bits, fp32 and 16-bit
 *    values, the union kept apart from the scratch (then overwritten) or in it, the output whole and cut in blocks
 *    of 1 and 13 value rows; lists ending in the same positions (its shared suffix), all alike, one of them only
 *    that suffix, and with no common end;
 *  - kvs_out_calls_run() over the calls of several selections at once (the replay's shared output pass): one list
 *    for the group (ascending, a run of positions, not ascending), per-row lists over their union and row by row,
 *    blocks of 0, 1, 5, 64 and CAP rows: every row's output bit for bit kvs_attention()'s.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/kvs.h"
#include "common/kvs_math.h"

enum { NQ = 4, CAP = 300 };

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;
static uint32_t urand(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}
/* urand() is 31 bits: [0, 2^31) / 2^30 - 1 is [-1, 1), both signs (/ 2^31 gave [-1, 0): every value negative) */
static float frand(void) { return (float)urand() / 1073741824.0f - 1.0f; }

typedef struct {
    size_t d;
    float *keys, *values, *q;         /* [CAP][d], [CAP][d], [NQ][d] */
    int32_t *idx[NQ];                 /* [NQ] -> [CAP] */
    int64_t n[NQ];
    float *probs[NQ], *ref_probs[NQ]; /* [NQ] -> [CAP] */
    float *out, *ref_out;             /* [NQ][d] */
    float *fs;
    int32_t *is;
} fixture;

static void fixture_init(fixture *f, size_t d, float qscale) {
    f->d = d;
    f->keys = malloc(CAP * d * sizeof(float));
    f->values = malloc(CAP * d * sizeof(float));
    f->q = malloc(NQ * d * sizeof(float));
    f->out = malloc(NQ * d * sizeof(float));
    f->ref_out = malloc(NQ * d * sizeof(float));
    f->fs = malloc(kvs_attn_lists_scratch_floats(NQ, CAP) * sizeof(float));
    f->is = malloc(kvs_attn_lists_scratch_ints(NQ, CAP) * sizeof(int32_t));
    assert_non_null(f->keys && f->values && f->q && f->out && f->ref_out && f->fs && f->is);
    for (size_t i = 0; i < CAP * d; i++) {
        f->keys[i] = frand();
        f->values[i] = frand(); /* both signs: a zero weight times a negative value is -0 */
    }
    for (size_t i = 0; i < NQ * d; i++) f->q[i] = qscale * frand();
    for (int r = 0; r < NQ; r++) {
        f->idx[r] = malloc(CAP * sizeof(int32_t));
        f->probs[r] = malloc(CAP * sizeof(float));
        f->ref_probs[r] = malloc(CAP * sizeof(float));
        assert_non_null(f->idx[r] && f->probs[r] && f->ref_probs[r]);
    }
}

static void fixture_free(fixture *f) {
    free(f->keys);
    free(f->values);
    free(f->q);
    free(f->out);
    free(f->ref_out);
    free(f->fs);
    free(f->is);
    for (int r = 0; r < NQ; r++) {
        free(f->idx[r]);
        free(f->probs[r]);
        free(f->ref_probs[r]);
    }
}

/* List r: a shared recent window [CAP-window, CAP) plus, below it, each position of a group-wide candidate set
 * (each position with probability `keep`) with probability 3/4, ascending: heads of a group that agree on
 * part of their selection, as H2O's and SnapKV's do. */
static void make_lists(fixture *f, int window, uint32_t keep_per_mille) {
    uint8_t cand[CAP];
    for (int32_t p = 0; p < CAP; p++) cand[p] = urand() % 1000 < keep_per_mille;
    for (int r = 0; r < NQ; r++) {
        int64_t m = 0;
        for (int32_t p = 0; p < CAP - window; p++)
            if (cand[p] && urand() % 4 != 0) f->idx[r][m++] = p;
        for (int32_t p = CAP - window; p < CAP; p++) f->idx[r][m++] = p;
        f->n[r] = m;
    }
}

/* Runs both paths; @return what kvs_attention_lists returned, after checking every bit of every row. */
static int check_lists(fixture *f) {
    size_t d = f->d;
    float scale = 1.0f / sqrtf((float)d);
    int used = kvs_attention_lists(f->q, NQ, f->keys, f->values, d, (const int32_t *const *)f->idx, f->n, CAP, d,
                                   scale, f->probs, f->out, f->fs, f->is);
    for (int r = 0; r < NQ; r++) {
        if (f->n[r] <= 0) continue;
        kvs_attention(f->q + (size_t)r * d, f->keys, f->values, d, f->idx[r], (size_t)f->n[r], d, scale,
                      f->ref_probs[r], f->ref_out + (size_t)r * d);
        assert_memory_equal(f->probs[r], f->ref_probs[r], (size_t)f->n[r] * sizeof(float));
        assert_memory_equal(f->out + (size_t)r * d, f->ref_out + (size_t)r * d, d * sizeof(float));
    }
    /* kvs_attention_lists_scored: each row's scores against all CAP positions computed once (the full reference's
     * part), gathered per list; the same path chosen and the same bits, with fp32 values and with the 16-bit rows
     * of values that are exactly fp16 numbers */
    float *srow[NQ];
    for (int r = 0; r < NQ; r++) {
        srow[r] = malloc(CAP * sizeof(float));
        assert_non_null(srow[r]);
        kvs_attn_scores(f->q + (size_t)r * d, f->keys, d, NULL, CAP, d, scale, srow[r]);
    }
    uint16_t *v16 = malloc(CAP * d * sizeof *v16);
    float *v32 = malloc(CAP * d * sizeof *v32);
    assert_non_null(v16 && v32);
    kvs_encode(KVS_DTYPE_F16, f->values, CAP * d, v16);
    kvs_decode(KVS_DTYPE_F16, v16, CAP * d, v32);
    /* the union's weights and rows kept apart (fkeep / ikeep) with the scratch overwritten before the output, or
     * left in the scratch; the output whole, and cut in blocks of 1 and 13 value rows (kvs_out_calls_run) */
    size_t total = 0;
    for (int r = 0; r < NQ; r++) total += f->n[r] > 0 ? (size_t)f->n[r] : 0;
    float *fkeep = malloc((kvs_attn_lists_keep_floats(NQ, total, CAP) + 1) * sizeof(float));
    int32_t *ikeep = malloc((kvs_attn_lists_keep_ints(NQ, total, CAP) + 1) * sizeof(int32_t));
    assert_non_null(fkeep && ikeep);
    const size_t blocks[] = {0, 1, 13};
    for (int pass = 0; pass < 3; pass++)
        for (int bk = 0; bk < 6; bk++) {
            const float *vals = pass == 0 ? f->values : v32;
            int keep = bk % 2;
            for (size_t i = 0; i < NQ * d; i++) f->out[i] = NAN; /* every row is written, empty lists' zero */
            kvs_out_call calls[NQ + 2], *cp[NQ + 2];
            assert_true(kvs_out_calls_max(NQ) <= NQ + 2);
            int sused = -1;
            size_t nc = kvs_attention_lists_scored_defer((const float *const *)srow, NQ, (const int32_t *const *)f->idx,
                                                         f->n, CAP, d, f->probs, f->out, f->fs, f->is,
                                                         keep ? fkeep : NULL, keep ? ikeep : NULL, calls, &sused);
            assert_int_equal(sused, used);
            assert_true(nc <= kvs_out_calls_max(NQ));
            if (keep) { /* the calls must not read the scratch */
                for (size_t i = 0; i < kvs_attn_lists_scratch_floats(NQ, CAP); i++) f->fs[i] = NAN;
                for (size_t i = 0; i < kvs_attn_lists_scratch_ints(NQ, CAP); i++) f->is[i] = -1;
            }
            for (size_t c = 0; c < nc; c++) cp[c] = &calls[c];
            kvs_out_calls_run(cp, nc, vals, pass == 2 ? v16 : NULL, KVS_DTYPE_F16, d, d, blocks[bk / 2]);
            for (int r = 0; r < NQ; r++) {
                if (f->n[r] <= 0) {
                    for (size_t i = 0; i < d; i++) assert_true(f->out[(size_t)r * d + i] == 0.0f);
                    continue;
                }
                kvs_attention(f->q + (size_t)r * d, f->keys, vals, d, f->idx[r], (size_t)f->n[r], d, scale,
                              f->ref_probs[r], f->ref_out + (size_t)r * d);
                assert_memory_equal(f->probs[r], f->ref_probs[r], (size_t)f->n[r] * sizeof(float));
                assert_memory_equal(f->out + (size_t)r * d, f->ref_out + (size_t)r * d, d * sizeof(float));
            }
        }
    free(fkeep);
    free(ikeep);
    free(v16);
    free(v32);
    for (int r = 0; r < NQ; r++) free(srow[r]);
    return used;
}

static void test_union_path_same_bits(void **st) {
    (void)st;
    const size_t dims[] = {8, 64, 128, 20, 3};
    for (size_t k = 0; k < sizeof dims / sizeof *dims; k++) {
        fixture f;
        fixture_init(&f, dims[k], 1.0f);
        for (int round = 0; round < 4; round++) {
            make_lists(&f, 16 + 8 * round, 250 + 100 * (uint32_t)round);
            assert_int_equal(check_lists(&f), 1);
        }
        fixture_free(&f);
    }
}

/* Large query norms: most probabilities underflow to exactly 0, so most union weights and many members' are 0. */
static void test_union_path_with_underflow_same_bits(void **st) {
    (void)st;
    fixture f;
    fixture_init(&f, 64, 400.0f);
    make_lists(&f, 32, 400);
    assert_int_equal(check_lists(&f), 1);
    int zeros = 0;
    for (int r = 0; r < NQ; r++)
        for (int64_t j = 0; j < f.n[r]; j++) zeros += f.probs[r][j] == 0.0f;
    assert_true(zeros > 0); /* the case this test is for did occur */
    fixture_free(&f);
}

static void test_refused_lists_fall_back_same_bits(void **st) {
    (void)st;
    fixture f;
    fixture_init(&f, 64, 1.0f);
    /* not ascending */
    make_lists(&f, 16, 300);
    int32_t tmp = f.idx[2][0];
    f.idx[2][0] = f.idx[2][1];
    f.idx[2][1] = tmp;
    assert_int_equal(check_lists(&f), 0);
    /* a duplicate */
    make_lists(&f, 16, 300);
    f.idx[1][1] = f.idx[1][0];
    assert_int_equal(check_lists(&f), 0);
    /* disjoint lists: the union is NQ times each list, more than twice the mean */
    for (int r = 0; r < NQ; r++) {
        f.n[r] = 0;
        for (int32_t p = r; p < CAP; p += NQ) f.idx[r][f.n[r]++] = p;
    }
    assert_int_equal(check_lists(&f), 0);
    /* identical lists: the union path */
    for (int r = 0; r < NQ; r++) {
        f.n[r] = CAP / 2;
        for (int32_t j = 0; j < CAP / 2; j++) f.idx[r][j] = 2 * j;
    }
    assert_int_equal(check_lists(&f), 1);
    /* an empty list is skipped by the union path */
    f.n[3] = 0;
    assert_int_equal(check_lists(&f), 0);
    fixture_free(&f);
}

/* The union of lists whose span is sparse (3 positions each over 300) or starts far from position 0, and a union
 * too wide there (refused): the same bits as row by row. */
static void test_sparse_and_shifted_lists_same_bits(void **st) {
    (void)st;
    fixture f;
    fixture_init(&f, 20, 1.0f);
    /* sparse: 3 positions per list over a 300-position span, union {1, 2, 150, 299} */
    for (int r = 0; r < NQ; r++) {
        f.n[r] = 3;
        f.idx[r][0] = 1 + (r % 2);
        f.idx[r][1] = 150;
        f.idx[r][2] = CAP - 1;
    }
    assert_int_equal(check_lists(&f), 1);
    /* starting at 200: every list holds [260, 300) and part of [200, 260) */
    for (int r = 0; r < NQ; r++) {
        int64_t m = 0;
        for (int32_t p = 200; p < 260; p++)
            if ((p + r) % 3 != 0) f.idx[r][m++] = p;
        for (int32_t p = 260; p < CAP; p++) f.idx[r][m++] = p;
        f.n[r] = m;
    }
    assert_int_equal(check_lists(&f), 1);
    /* too wide a union (disjoint lists over [100, 300)): refused, row by row */
    for (int r = 0; r < NQ; r++) {
        f.n[r] = 0;
        for (int32_t p = 100 + r; p < CAP; p += NQ) f.idx[r][f.n[r]++] = p;
    }
    assert_int_equal(check_lists(&f), 0);
    fixture_free(&f);
}

/* The union's size limit, twice the mean list, taken at its edge: lists 0-1 the even positions below 2m, lists 2-3
 * the odd ones (the union 2m = the limit: the union path), then one list with a position outside both (2m + 1:
 * refused); and with a mean that is not whole (n = 10,10,10,11: limit 82/4 = 20). */
static void test_union_at_the_limit(void **st) {
    (void)st;
    fixture f;
    fixture_init(&f, 20, 1.0f);
    const int32_t m = 40; /* positions 0..79: across 32-position words */
    for (int r = 0; r < NQ; r++) {
        f.n[r] = m;
        for (int32_t j = 0; j < m; j++) f.idx[r][j] = 2 * j + (r >= 2);
    }
    assert_int_equal(check_lists(&f), 1);
    f.idx[3][m - 1] = CAP - 1; /* odd positions but 79, and 299: the union has 2m + 1 members */
    assert_int_equal(check_lists(&f), 0);
    for (int r = 0; r < NQ; r++) {
        f.n[r] = 10 + (r == 3);
        for (int32_t j = 0; j < 10; j++) f.idx[r][j] = 2 * j + (r >= 2);
    }
    f.idx[3][10] = 20; /* union {0..20}: 21 > 20 */
    assert_int_equal(check_lists(&f), 0);
    f.idx[3][10] = 19 + 2; /* still 21 members: refused */
    assert_int_equal(check_lists(&f), 0);
    f.n[3] = 10; /* union {0..19}: 20, at the limit 80/4 */
    assert_int_equal(check_lists(&f), 1);
    fixture_free(&f);
}

/* Out of [0, cap) (a position at cap; the keys reach further, so row by row reads valid rows), a repeat at the
 * end of a list, one list descending at its last step, and lists whose positions sit on 32-position word edges
 * (0, 31, 32, 63, 64, 288..299) with one list the whole union (its rows copied rather than scattered). */
static void test_union_refusals_and_word_edges(void **st) {
    (void)st;
    fixture f;
    fixture_init(&f, 8, 1.0f);
    size_t d = f.d;
    float scale = 1.0f / sqrtf((float)d);
    const size_t small_cap = 200;
    for (int r = 0; r < NQ; r++) {
        f.n[r] = 5;
        for (int32_t j = 0; j < 5; j++) f.idx[r][j] = 190 + 2 * j + (r % 2); /* 190..199: below 200 */
    }
    f.idx[2][4] = (int32_t)small_cap; /* 198 -> 200: not below cap */
    float *probs[NQ];
    for (int r = 0; r < NQ; r++) probs[r] = f.probs[r];
    assert_int_equal(kvs_attention_lists(f.q, NQ, f.keys, f.values, d, (const int32_t *const *)f.idx, f.n, small_cap,
                                         d, scale, probs, f.out, f.fs, f.is),
                     0);
    for (int r = 0; r < NQ; r++) {
        kvs_attention(f.q + (size_t)r * d, f.keys, f.values, d, f.idx[r], (size_t)f.n[r], d, scale, f.ref_probs[r],
                      f.ref_out + (size_t)r * d);
        assert_memory_equal(f.probs[r], f.ref_probs[r], (size_t)f.n[r] * sizeof(float));
        assert_memory_equal(f.out + (size_t)r * d, f.ref_out + (size_t)r * d, d * sizeof(float));
    }
    f.idx[2][4] = (int32_t)small_cap - 1; /* 199: in range, the union path */
    assert_int_equal(kvs_attention_lists(f.q, NQ, f.keys, f.values, d, (const int32_t *const *)f.idx, f.n, small_cap,
                                         d, scale, probs, f.out, f.fs, f.is),
                     1);
    const int32_t edges[] = {0, 31, 32, 63, 64, 95, 288, 291, 295, 298, 299};
    const int n_edges = (int)(sizeof edges / sizeof *edges);
    for (int r = 0; r < NQ; r++) {
        f.n[r] = 0;
        for (int e = 0; e < n_edges; e++)
            if (r == 0 || (e + r) % 3 != 0) f.idx[r][f.n[r]++] = edges[e];
    }
    assert_int_equal(check_lists(&f), 1);
    f.idx[1][f.n[1] - 1] = f.idx[1][f.n[1] - 2]; /* a repeat at the end */
    assert_int_equal(check_lists(&f), 0);
    f.idx[1][f.n[1] - 1] = f.idx[1][f.n[1] - 3]; /* descending at the last step */
    assert_int_equal(check_lists(&f), 0);
    fixture_free(&f);
}

/* nq = 64 query rows (the union path's most) and 65 (row by row), lists drawn as make_lists draws them: every row's
 * bits as kvs_attention() gives them. */
static void test_union_of_64_rows(void **st) {
    (void)st;
    enum { MAXQ = 65, D = 16 };
    float *keys = malloc(CAP * D * sizeof(float)), *values = malloc(CAP * D * sizeof(float));
    float *q = malloc(MAXQ * D * sizeof(float)), *out = malloc(MAXQ * D * sizeof(float));
    float *ref_out = malloc(D * sizeof(float)), *ref_probs = malloc(CAP * sizeof(float));
    float *fs = malloc(kvs_attn_lists_scratch_floats(MAXQ, CAP) * sizeof(float));
    int32_t *is = malloc(kvs_attn_lists_scratch_ints(MAXQ, CAP) * sizeof(int32_t));
    int32_t *idx[MAXQ];
    float *probs[MAXQ];
    int64_t n[MAXQ];
    assert_non_null(keys && values && q && out && ref_out && ref_probs && fs && is);
    for (size_t i = 0; i < CAP * D; i++) {
        keys[i] = frand();
        values[i] = frand();
    }
    for (size_t i = 0; i < MAXQ * D; i++) q[i] = frand();
    uint8_t cand[CAP];
    for (int32_t p = 0; p < CAP; p++) cand[p] = urand() % 1000 < 300;
    for (int r = 0; r < MAXQ; r++) {
        idx[r] = malloc(CAP * sizeof(int32_t));
        probs[r] = malloc(CAP * sizeof(float));
        assert_non_null(idx[r] && probs[r]);
        n[r] = 0;
        for (int32_t p = 0; p < CAP - 20; p++)
            if (cand[p] && urand() % 4 != 0) idx[r][n[r]++] = p;
        for (int32_t p = CAP - 20; p < CAP; p++) idx[r][n[r]++] = p;
    }
    const size_t nqs[] = {64, 65};
    for (int t = 0; t < 2; t++) {
        size_t nq = nqs[t];
        assert_int_equal(kvs_attention_lists(q, nq, keys, values, D, (const int32_t *const *)idx, n, CAP, D, 0.25f,
                                             probs, out, fs, is),
                         nq <= 64);
        for (size_t r = 0; r < nq; r++) {
            kvs_attention(q + r * D, keys, values, D, idx[r], (size_t)n[r], D, 0.25f, ref_probs, ref_out);
            assert_memory_equal(probs[r], ref_probs, (size_t)n[r] * sizeof(float));
            assert_memory_equal(out + r * D, ref_out, D * sizeof(float));
        }
    }
    for (int r = 0; r < MAXQ; r++) {
        free(idx[r]);
        free(probs[r]);
    }
    free(keys);
    free(values);
    free(q);
    free(out);
    free(ref_out);
    free(ref_probs);
    free(fs);
    free(is);
}

/* Lists that end in the same positions (kvs_attention_lists_scored's shared suffix, output after the union of the
 * parts before it): all four lists the same (no part before the suffix), one list that is the suffix alone, a
 * suffix of one position, suffixes that differ only in their first position (80 in common), one list missing a
 * position 10 from the end, and no common last position; disjoint parts before the suffix (the union refused: the
 * parts row by row, the suffix one call for all rows), and the same with a part that ends above the suffix's first
 * position (not ascending: every row whole); each
 * with d 128 and 20 (the x32 tiles and the column tail). Every row's bits as kvs_attention gives them, the path as
 * kvs_attention_lists chooses it. */
static void test_shared_suffix_same_bits(void **st) {
    (void)st;
    const size_t dims[] = {128, 20};
    for (size_t k = 0; k < sizeof dims / sizeof *dims; k++) {
        fixture f;
        fixture_init(&f, dims[k], 1.0f);
        for (int c = 0; c < 8; c++) {
            for (int r = 0; r < NQ; r++) {
                int64_t m = 0;
                if (c >= 6) /* disjoint parts before the suffix: a union too wide, refused */
                    for (int32_t p = 50 * r; p < 50 * r + 50; p++) f.idx[r][m++] = p;
                if (c == 7 && r == 1) f.idx[r][m++] = 215; /* above the suffix's first: not cut apart from it */
                if (c != 0 && c < 6 && !(c == 1 && r == 2)) /* a part before the suffix of each list's own */
                    for (int32_t p = r; p < 200; p += 3 + r) f.idx[r][m++] = p;
                int32_t first = c == 3 ? 210 + r : 210; /* case 3: the suffix differs in its first position */
                if (c == 2) {
                    f.idx[r][m++] = 299; /* one common position */
                } else if (c == 4) {
                    f.idx[r][m++] = 250 + r; /* none in common */
                } else {
                    f.idx[r][m++] = first;
                    for (int32_t p = 220; p < 300; p++) /* 80: past a 64-entry compare block */
                        if (!(c == 5 && r == 3 && p == 290)) f.idx[r][m++] = p; /* case 5: 9 in common */
                }
                f.n[r] = m;
            }
            check_lists(&f);
        }
        fixture_free(&f);
    }
}

/* The calls of a refused union with a common suffix (the bits are checked above): the parts before the suffix row
 * by row and the suffix one call for every row when each part lies below it in order; every row whole when a part
 * ends above the suffix's first position (a block cut would run that entry after the suffix's first). */
static void test_refused_union_suffix_calls(void **st) {
    (void)st;
    fixture f;
    fixture_init(&f, 64, 1.0f);
    float scale = 1.0f / sqrtf(64.0f), *srow[NQ];
    for (int r = 0; r < NQ; r++) {
        srow[r] = malloc(CAP * sizeof(float));
        assert_non_null(srow[r]);
        kvs_attn_scores(f.q + (size_t)r * 64, f.keys, 64, NULL, CAP, 64, scale, srow[r]);
    }
    for (int c = 0; c < 2; c++) {
        for (int r = 0; r < NQ; r++) {
            int64_t m = 0;
            for (int32_t p = 50 * r; p < 50 * r + 50; p++) f.idx[r][m++] = p;
            if (c == 1 && r == 1) f.idx[r][m++] = 215;
            f.idx[r][m++] = 210;
            for (int32_t p = 220; p < 300; p++) f.idx[r][m++] = p;
            f.n[r] = m;
        }
        kvs_out_call calls[NQ + 2];
        int used = -1;
        size_t nc = kvs_attention_lists_scored_defer((const float *const *)srow, NQ, (const int32_t *const *)f.idx, f.n,
                                                     CAP, 64, f.probs, f.out, f.fs, f.is, NULL, NULL, calls, &used);
        assert_int_equal(used, 0);
        assert_int_equal(nc, c == 0 ? NQ + 1 : NQ);
        for (int r = 0; r < NQ; r++) {
            assert_int_equal(calls[r].nr, 1);
            assert_int_equal(calls[r].n, (size_t)f.n[r] - (c == 0 ? 81 : 0));
        }
        if (c == 0) {
            assert_int_equal(calls[NQ].nr, NQ);
            assert_int_equal(calls[NQ].n, 81);
            assert_int_equal(calls[NQ].idx[0], 210);
        }
    }
    for (int r = 0; r < NQ; r++) free(srow[r]);
    fixture_free(&f);
}

static void test_lists16_equal_fp32_on_converted_rows(void **st) {
    (void)st;
    const kvs_dtype types[] = {KVS_DTYPE_F16, KVS_DTYPE_BF16};
    for (int ti = 0; ti < 2; ti++) {
        fixture f;
        fixture_init(&f, 64, 1.0f);
        size_t d = f.d;
        uint16_t *k16 = malloc(CAP * d * sizeof(uint16_t)), *v16 = malloc(CAP * d * sizeof(uint16_t));
        assert_non_null(k16 && v16);
        kvs_encode(types[ti], f.keys, CAP * d, k16);
        kvs_encode(types[ti], f.values, CAP * d, v16);
        kvs_decode(types[ti], k16, CAP * d, f.keys); /* the fp32 rows = the 16-bit rows' conversion */
        kvs_decode(types[ti], v16, CAP * d, f.values);
        float scale = 1.0f / sqrtf((float)d);
        for (int round = 0; round < 2; round++) {
            make_lists(&f, 24, 350);
            if (round == 1) f.idx[0][1] = f.idx[0][0]; /* the row-by-row fallback reads the fp32 rows */
            int used = kvs_attention_lists16(f.q, NQ, k16, v16, types[ti], f.keys, f.values, d,
                                             (const int32_t *const *)f.idx, f.n, CAP, d, scale, f.probs, f.out, f.fs,
                                             f.is);
            assert_int_equal(used, round == 0);
            for (int r = 0; r < NQ; r++) {
                kvs_attention(f.q + (size_t)r * d, f.keys, f.values, d, f.idx[r], (size_t)f.n[r], d, scale,
                              f.ref_probs[r], f.ref_out + (size_t)r * d);
                assert_memory_equal(f.probs[r], f.ref_probs[r], (size_t)f.n[r] * sizeof(float));
                assert_memory_equal(f.out + (size_t)r * d, f.ref_out + (size_t)r * d, d * sizeof(float));
            }
        }
        free(k16);
        free(v16);
        fixture_free(&f);
    }
}

/* The calls of five selections over one value matrix run together, as the replay's shared output pass runs every
 * configuration's: one list for the group (ascending; a run of positions, no index; not ascending, which runs
 * whole), and per-row lists (over their union with a common suffix; row by row, a repeat refusing the union). */
static void test_out_calls_of_many_selections(void **st) {
    (void)st;
    enum { SELS = 5 };
    fixture f;
    fixture_init(&f, 40, 1.0f);
    size_t d = f.d;
    float scale = 1.0f / sqrtf((float)d);
    float *srow[NQ];
    for (int r = 0; r < NQ; r++) {
        srow[r] = malloc(CAP * sizeof(float));
        assert_non_null(srow[r]);
        kvs_attn_scores(f.q + (size_t)r * d, f.keys, d, NULL, CAP, d, scale, srow[r]);
    }
    int32_t *lists[SELS][NQ];
    int64_t n[SELS][NQ];
    float *probs[SELS][NQ], *out[SELS], *fkeep[SELS];
    int32_t *ikeep[SELS];
    for (int s = 0; s < SELS; s++) {
        out[s] = malloc(NQ * d * sizeof(float));
        fkeep[s] = malloc(kvs_attn_lists_keep_floats(NQ, NQ * CAP, CAP) * sizeof(float));
        ikeep[s] = malloc(kvs_attn_lists_keep_ints(NQ, NQ * CAP, CAP) * sizeof(int32_t));
        assert_non_null(out[s] && fkeep[s] && ikeep[s]);
        for (int r = 0; r < NQ; r++) {
            lists[s][r] = malloc(CAP * sizeof(int32_t));
            probs[s][r] = malloc(CAP * sizeof(float));
            assert_non_null(lists[s][r] && probs[s][r]);
        }
    }
    /* 0: every third position; 1: positions 37..236 (a run); 2: a descending list; 3: H2O-like lists (union and a
     * common suffix); 4: per-row lists, one with a repeat (row by row) */
    n[0][0] = 0;
    for (int32_t p = 2; p < CAP; p += 3) lists[0][0][n[0][0]++] = p;
    n[1][0] = 200;
    for (int32_t j = 0; j < 200; j++) lists[1][0][j] = 37 + j;
    n[2][0] = 90;
    for (int32_t j = 0; j < 90; j++) lists[2][0][j] = CAP - 1 - 3 * j;
    make_lists(&f, 20, 400);
    for (int r = 0; r < NQ; r++) {
        memcpy(lists[3][r], f.idx[r], (size_t)f.n[r] * sizeof(int32_t));
        n[3][r] = f.n[r];
    }
    make_lists(&f, 10, 150);
    f.idx[2][1] = f.idx[2][0];
    for (int r = 0; r < NQ; r++) {
        memcpy(lists[4][r], f.idx[r], (size_t)f.n[r] * sizeof(int32_t));
        n[4][r] = f.n[r];
    }
    const size_t blocks[] = {0, 1, 5, 64, CAP};
    for (size_t bk = 0; bk < sizeof blocks / sizeof *blocks; bk++) {
        kvs_out_call calls[SELS][NQ + 2], *cp[SELS * (NQ + 2)];
        size_t nc = 0;
        for (int s = 0; s < SELS; s++) {
            size_t m;
            if (s < 3) {
                int run = s == 1;
                m = kvs_attention_group_scored_defer((const float *const *)srow, NQ, run ? NULL : lists[s][0],
                                                     run ? 37 : 0, (size_t)n[s][0], d, probs[s], out[s], calls[s]);
            } else {
                int used;
                m = kvs_attention_lists_scored_defer((const float *const *)srow, NQ, (const int32_t *const *)lists[s],
                                                     n[s], CAP, d, probs[s], out[s], f.fs, f.is, fkeep[s], ikeep[s],
                                                     calls[s], &used);
                assert_int_equal(used, s == 3);
            }
            for (size_t c = 0; c < m; c++) cp[nc++] = &calls[s][c];
        }
        kvs_out_calls_run(cp, nc, f.values, NULL, KVS_DTYPE_F32, d, d, blocks[bk]);
        for (int s = 0; s < SELS; s++)
            for (int r = 0; r < NQ; r++) {
                int li = s < 3 ? 0 : r;
                kvs_attention(f.q + (size_t)r * d, f.keys, f.values, d, lists[s][li], (size_t)n[s][li], d, scale,
                              f.ref_probs[r], f.ref_out);
                assert_memory_equal(probs[s][r], f.ref_probs[r], (size_t)n[s][li] * sizeof(float));
                assert_memory_equal(out[s] + (size_t)r * d, f.ref_out, d * sizeof(float));
            }
    }
    for (int s = 0; s < SELS; s++) {
        free(out[s]);
        free(fkeep[s]);
        free(ikeep[s]);
        for (int r = 0; r < NQ; r++) {
            free(lists[s][r]);
            free(probs[s][r]);
        }
    }
    for (int r = 0; r < NQ; r++) free(srow[r]);
    fixture_free(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_union_path_same_bits),
        cmocka_unit_test(test_union_path_with_underflow_same_bits),
        cmocka_unit_test(test_refused_lists_fall_back_same_bits),
        cmocka_unit_test(test_sparse_and_shifted_lists_same_bits),
        cmocka_unit_test(test_union_at_the_limit),
        cmocka_unit_test(test_union_refusals_and_word_edges),
        cmocka_unit_test(test_union_of_64_rows),
        cmocka_unit_test(test_shared_suffix_same_bits),
        cmocka_unit_test(test_refused_union_suffix_calls),
        cmocka_unit_test(test_lists16_equal_fp32_on_converted_rows),
        cmocka_unit_test(test_out_calls_of_many_selections),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
