/* test_prefill.c — the blocked prefill and the matrix products under it (gpu_capture/matmul.h, model.h
 * kvs_model_forward_block):
 *  - GEMM against a double-precision reference over odd shapes (rows, columns and positions that are not multiples
 *    of any tile or of the reduction chunk), fp32 / fp16 / bf16 weights, biases and row strides, on every
 *    instruction set this CPU has: within the fp32 summation bound, and each output row bit for bit the same
 *    whether computed alone, in a block, or on several threads (the property the prefill relies on).
 *  - packed 16-bit panels (the products of every 16-bit model): each element bit for bit the fmaf chain of
 *    matmul.h computed here, at every instruction set, over odd shapes (panel tails, tiles of positions, k-blocks),
 *    and within the double-precision bound; the panel layout read back from its definition equals the checkpoint;
 *    packed and unpacked products mixed in one multi-GEMM.
 *  - kvs_model_forward_block against kvs_model_forward position by position on both shared models and the 16-bit
 *    fixtures (qwen2_tiny bf16 with q/k/v biases, llama3_tiny fp16 sharded, mistral_tiny): q, k, v, o, lse of every
 *    layer and the logits at the end of each block, with tolerance 0 (bit for bit: the two paths run the same
 *    per-element arithmetic), over irregular block sizes, at every instruction set; a 16-bit model's logits are
 *    the same bits at every instruction set.
 *  - 16-bit matrices are kept 16-bit (no fp32 copy), and bad block arguments are refused.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/util/testenv.h"

#include "common/kvs.h"
#include "common/threadpool.h"
#include "gpu_capture/matmul.h"
#include "gpu_capture/model.h"
#include "gpu_capture/model_weights.h"

static void path_of(char *buf, size_t cap, const char *rel) { snprintf(buf, cap, "%s/%s", kvs_test_root(), rel); }

/* ---- GEMM ---- */

static uint64_t rng_state = 88172645463325252ull;
static float frand(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* Weights of `dt` from random floats; *wide receives their exact fp32 values. */
static void *make_weights(kvs_dtype dt, size_t count, float **wide) {
    float *f = malloc(count * sizeof *f);
    assert_non_null(f);
    for (size_t i = 0; i < count; i++) f[i] = frand();
    void *w = malloc(count * kvs_dtype_size(dt) + 1);
    assert_non_null(w);
    kvs_encode(dt, f, count, w);
    kvs_decode(dt, w, count, f);
    *wide = f;
    return w;
}

/* y = x w^T (+ bias) for n rows of x against a double reference: fp32 summation in any order is within
 * gamma_(cols+1) sum |x w| (Higham 3.1); each row alone, on the calling thread, gives the same bits as in the block;
 * the row padding past `rows` is left alone. packed: the matrix packed into panels (kvs_wmat_pack), every element
 * also, bit for bit, the one fmaf chain of matmul.h (x[k] * w[k] + acc over k in ascending order from +0, then
 * + bias) computed here — at every instruction set (the references computed once for all), block size and thread
 * count; unpacked: at the instruction set in use. */
static void check_gemm(kvs_threadpool *pool, kvs_dtype dt, int n, int rows, int cols, int with_bias, int packed) {
    kvs_gemm_isa keep = kvs_gemm_isa_get();
    size_t ldx = (size_t)cols + 3, ldy = (size_t)rows + 2; /* strides past the row ends */
    float *wf;
    void *w = make_weights(dt, (size_t)rows * (size_t)cols, &wf);
    float *x = malloc((size_t)n * ldx * sizeof *x), *bias = malloc((size_t)rows * sizeof *bias);
    float *y = malloc((size_t)n * ldy * sizeof *y), *y1 = malloc(ldy * sizeof *y1);
    float *chains = malloc((size_t)n * (size_t)rows * sizeof *chains);
    double *refs = malloc((size_t)n * (size_t)rows * sizeof *refs);
    double *bounds = malloc((size_t)n * (size_t)rows * sizeof *bounds);
    assert_true(x && bias && y && y1 && chains && refs && bounds);
    for (size_t i = 0; i < (size_t)n * ldx; i++) x[i] = frand();
    for (int r = 0; r < rows; r++) bias[r] = frand();
    kvs_wmat wm = {w, dt, NULL};
    if (packed) {
        assert_int_equal(kvs_wmat_pack(&wm, rows, cols), KVS_OK);
        assert_non_null(wm.packed);
    }
    for (int i = 0; i < n; i++)
        for (int r = 0; r < rows; r++) {
            float chain = 0.0f;
            double ref = with_bias ? bias[r] : 0, mag = with_bias ? fabs(bias[r]) : 0;
            for (int k = 0; k < cols; k++) {
                chain = fmaf(x[(size_t)i * ldx + k], wf[(size_t)r * cols + k], chain);
                double p = (double)x[(size_t)i * ldx + k] * wf[(size_t)r * cols + k];
                ref += p;
                mag += fabs(p);
            }
            if (with_bias) chain += bias[r];
            chains[(size_t)i * rows + r] = chain;
            refs[(size_t)i * rows + r] = ref;
            bounds[(size_t)i * rows + r] = (cols + 2) * 0x1p-24 * mag + 1e-30;
        }
    for (int isa = packed ? 0 : (int)keep; isa < (packed ? KVS_GEMM_COUNT : (int)keep + 1); isa++) {
        if (!kvs_gemm_isa_available((kvs_gemm_isa)isa)) continue;
        assert_int_equal(kvs_gemm_isa_set((kvs_gemm_isa)isa), KVS_OK);
        const char *level = kvs_gemm_isa_name((kvs_gemm_isa)isa), *form = packed ? "packed " : "";
        for (size_t i = 0; i < (size_t)n * ldy; i++) y[i] = 12345.0f;
        kvs_gemm(pool, x, ldx, n, cols, wm, with_bias ? bias : NULL, rows, y, ldy);
        for (int i = 0; i < n; i++) {
            kvs_gemm(NULL, x + (size_t)i * ldx, 0, 1, cols, wm, with_bias ? bias : NULL, rows, y1, 0);
            for (int r = 0; r < rows; r++) {
                float got = y[(size_t)i * ldy + r], chain = chains[(size_t)i * rows + r];
                double ref = refs[(size_t)i * rows + r], bound = bounds[(size_t)i * rows + r];
                if (!(fabs(got - ref) <= bound))
                    fail_msg("%s%s dtype %d n %d rows %d cols %d: y[%d][%d] = %.9g, reference %.9g (bound %.3g)", form,
                             level, (int)dt, n, rows, cols, i, r, got, ref, bound);
                if (packed && memcmp(&got, &chain, sizeof got))
                    fail_msg("%s%s dtype %d n %d rows %d cols %d: y[%d][%d] = %.9g, the fmaf chain %.9g", form, level,
                             (int)dt, n, rows, cols, i, r, got, chain);
                if (memcmp(&got, &y1[r], sizeof got))
                    fail_msg("%s%s n %d rows %d cols %d: row %d alone gives %.9g, in the block %.9g", form, level, n,
                             rows, cols, i, y1[r], got);
            }
            for (size_t r = (size_t)rows; r < ldy; r++) assert_true(y[(size_t)i * ldy + r] == 12345.0f);
        }
    }
    assert_int_equal(kvs_gemm_isa_set(keep), KVS_OK);
    free(chains);
    free(refs);
    free(bounds);
    free((void *)(uintptr_t)wm.packed);
    free(w);
    free(wf);
    free(x);
    free(bias);
    free(y);
    free(y1);
}

static void test_gemm_against_double_reference(void **state) {
    (void)state;
    kvs_threadpool *pool;
    assert_int_equal(kvs_threadpool_create(3, &pool), KVS_OK);
    kvs_gemm_isa keep = kvs_gemm_isa_get();
    static const int ns[] = {1, 2, 5, 9};
    static const int rows[] = {1, 7, 13, 37};
    static const int cols[] = {1, 15, 17, 1023, 1041, 2077};
    static const kvs_dtype dts[] = {KVS_DTYPE_F32, KVS_DTYPE_F16, KVS_DTYPE_BF16};
    int levels = 0;
    for (int isa = 0; isa < KVS_GEMM_COUNT; isa++) {
        if (!kvs_gemm_isa_available((kvs_gemm_isa)isa)) continue;
        levels++;
        assert_int_equal(kvs_gemm_isa_set((kvs_gemm_isa)isa), KVS_OK);
        for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
            for (size_t b = 0; b < sizeof rows / sizeof *rows; b++)
                for (size_t c = 0; c < sizeof cols / sizeof *cols; c++)
                    for (size_t t = 0; t < 3; t++)
                        check_gemm(pool, dts[t], ns[a], rows[b], cols[c], (int)((a + b + c) & 1), 0);
        /* blocks as large as the prefill's, split among the workers, their X past matmul.c's X_SMALL_BYTES (the
         * chunk-outer order; the single rows compared with them take the group-outer one) */
        check_gemm(pool, KVS_DTYPE_BF16, 130, 67, 1100, 1, 0);
        check_gemm(pool, KVS_DTYPE_F16, 129, 13, 2100, 0, 0);
    }
    fprintf(stderr, "gemm: %d instruction set(s) checked\n", levels);
    assert_int_equal(kvs_gemm_isa_set(keep), KVS_OK);
    kvs_threadpool_free(pool);
}

/* ---- packed 16-bit panels ---- */

static void test_gemm_packed_against_fmaf_chain(void **state) {
    (void)state;
    kvs_threadpool *pool;
    assert_int_equal(kvs_threadpool_create(3, &pool), KVS_OK);
    /* positions: 1 (decode: several panels streamed at once), within / past a tile of 3 and of 12; rows: a panel
     * tail, exactly one panel, one past it, 5 panels + 1 row (the decode kernel's groups of 4 and its tail);
     * columns: within a vector, past and across the 512-column k-blocks whose sums are carried through y */
    static const int ns[] = {1, 3, 13, 26};
    static const int rows[] = {7, 32, 33, 161};
    static const int cols[] = {1, 17, 530};
    static const kvs_dtype dts[] = {KVS_DTYPE_F16, KVS_DTYPE_BF16};
    for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
        for (size_t b = 0; b < sizeof rows / sizeof *rows; b++)
            for (size_t c = 0; c < sizeof cols / sizeof *cols; c++)
                for (size_t t = 0; t < 2; t++)
                    check_gemm(pool, dts[t], ns[a], rows[b], cols[c], (int)((a + b + c + t) & 1), 1);
    /* prefill-sized blocks split among the workers, three k-blocks (the middle one neither first nor last) */
    check_gemm(pool, KVS_DTYPE_BF16, 130, 100, 1041, 1, 1);
    check_gemm(pool, KVS_DTYPE_F16, 129, 70, 1100, 0, 1);
    check_gemm(pool, KVS_DTYPE_BF16, 1, 300, 1100, 1, 1);
    /* the same blocks when the workers' copy of X cannot be allocated: tile by tile, the same bits */
    kvs_gemm_test_scratch_fail(1);
    check_gemm(pool, KVS_DTYPE_BF16, 130, 100, 1041, 1, 1);
    check_gemm(pool, KVS_DTYPE_F16, 29, 70, 600, 0, 1);
    kvs_gemm_test_scratch_fail(0);
    int levels = 0;
    for (int isa = 0; isa < KVS_GEMM_COUNT; isa++) levels += kvs_gemm_isa_available((kvs_gemm_isa)isa);
    fprintf(stderr, "packed gemm: %d instruction set(s) checked\n", levels);
    kvs_threadpool_free(pool);
}

/* The panel layout of matmul.h, read here from its definition (not through kvs_wmat_packed_at): element (r, k) of
 * a bf16 panel is the low (r < 16) or high half of 32-bit word r % 16 of column k's 64 bytes, of an fp16 panel the
 * r-th 16-bit word; rows past the matrix are 0. kvs_wmat_packed_at and kvs_wmat_row_f32 read the same values. */
static void test_packed_layout_round_trip(void **state) {
    (void)state;
    static const kvs_dtype dts[] = {KVS_DTYPE_F16, KVS_DTYPE_BF16};
    static const int rows[] = {1, 16, 17, 31, 32, 33, 70};
    static const int cols[] = {1, 5, 19};
    for (size_t t = 0; t < 2; t++)
        for (size_t a = 0; a < sizeof rows / sizeof *rows; a++)
            for (size_t b = 0; b < sizeof cols / sizeof *cols; b++) {
                int R = rows[a], C = cols[b];
                float *wf;
                uint16_t *w = make_weights(dts[t], (size_t)R * (size_t)C, &wf);
                kvs_wmat wm = {w, dts[t], NULL};
                assert_int_equal(kvs_wmat_pack(&wm, R, C), KVS_OK);
                int panels = (R + KVS_PANEL - 1) / KVS_PANEL;
                for (int p = 0; p < panels; p++)
                    for (int k = 0; k < C; k++) {
                        const uint16_t *col = wm.packed + ((size_t)p * C + (size_t)k) * KVS_PANEL;
                        for (int rr = 0; rr < KVS_PANEL; rr++) {
                            int r = p * KVS_PANEL + rr;
                            uint16_t h;
                            if (dts[t] == KVS_DTYPE_BF16) {
                                uint32_t word;
                                memcpy(&word, col + 2 * (rr & 15), sizeof word);
                                h = (uint16_t)(rr < 16 ? word & 0xffffu : word >> 16);
                            } else {
                                h = col[rr];
                            }
                            uint16_t want = r < R ? w[(size_t)r * C + (size_t)k] : 0;
                            if (h != want)
                                fail_msg("dtype %d %d x %d: packed (%d, %d) = 0x%04x, checkpoint 0x%04x", (int)dts[t],
                                         R, C, r, k, h, want);
                            if (r < R) assert_true(kvs_wmat_packed_at(&wm, C, r, k) == wf[(size_t)r * C + (size_t)k]);
                        }
                    }
                float *row = malloc((size_t)C * sizeof *row);
                assert_non_null(row);
                for (int r = 0; r < R; r++) {
                    kvs_wmat_row_f32(wm, (size_t)C, (size_t)r, row);
                    assert_memory_equal(row, wf + (size_t)r * C, (size_t)C * sizeof *row);
                }
                free(row);
                free((void *)(uintptr_t)wm.packed);
                free(w);
                free(wf);
            }
    kvs_wmat f32 = {"abcd", KVS_DTYPE_F32, NULL};
    assert_int_equal(kvs_wmat_pack(&f32, 1, 1), KVS_ERR_INVALID_ARG);
    assert_null(f32.packed);
}

/* Packed products beside unpacked ones in one kvs_gemm_multi: each still equals its own kvs_gemm. */
static void test_gemm_multi_packed_mixed(void **state) {
    (void)state;
    int n = 5, cols = 70, r[3] = {40, 9, 33};
    kvs_dtype dt[3] = {KVS_DTYPE_BF16, KVS_DTYPE_BF16, KVS_DTYPE_F16};
    int pack[3] = {1, 0, 1};
    float *x = malloc((size_t)n * cols * sizeof *x), *wf[3], *y[3], *z[3];
    void *w[3];
    for (int i = 0; i < n * cols; i++) x[i] = frand();
    kvs_gemm_out outs[3];
    for (int j = 0; j < 3; j++) {
        w[j] = make_weights(dt[j], (size_t)r[j] * cols, &wf[j]);
        y[j] = calloc((size_t)n * r[j], sizeof(float));
        z[j] = calloc((size_t)n * r[j], sizeof(float));
        outs[j] = (kvs_gemm_out){{w[j], dt[j], NULL}, NULL, y[j], (size_t)r[j], r[j]};
        if (pack[j]) assert_int_equal(kvs_wmat_pack(&outs[j].w, r[j], cols), KVS_OK);
    }
    kvs_gemm_multi(NULL, x, (size_t)cols, n, cols, outs, 3);
    for (int j = 0; j < 3; j++) {
        kvs_gemm(NULL, x, (size_t)cols, n, cols, outs[j].w, NULL, r[j], z[j], (size_t)r[j]);
        assert_memory_equal(y[j], z[j], (size_t)n * r[j] * sizeof(float));
        free((void *)(uintptr_t)outs[j].w.packed);
        free(w[j]);
        free(wf[j]);
        free(y[j]);
        free(z[j]);
    }
    free(x);
}

static void test_gemm_multi_and_isa_control(void **state) {
    (void)state;
    /* three products over one input, as q/k/v: each equals its own kvs_gemm */
    int n = 6, cols = 40, r[3] = {9, 4, 4};
    float *x = malloc((size_t)n * cols * sizeof *x), *wf[3], *y[3], *z[3];
    void *w[3];
    for (int i = 0; i < n * cols; i++) x[i] = frand();
    kvs_gemm_out outs[3];
    for (int j = 0; j < 3; j++) {
        w[j] = make_weights(KVS_DTYPE_BF16, (size_t)r[j] * cols, &wf[j]);
        y[j] = calloc((size_t)n * r[j], sizeof(float));
        z[j] = calloc((size_t)n * r[j], sizeof(float));
        outs[j] = (kvs_gemm_out){{w[j], KVS_DTYPE_BF16, NULL}, NULL, y[j], (size_t)r[j], r[j]};
    }
    kvs_gemm_multi(NULL, x, (size_t)cols, n, cols, outs, 3);
    for (int j = 0; j < 3; j++) {
        kvs_gemm(NULL, x, (size_t)cols, n, cols, (kvs_wmat){w[j], KVS_DTYPE_BF16, NULL}, NULL, r[j], z[j], (size_t)r[j]);
        assert_memory_equal(y[j], z[j], (size_t)n * r[j] * sizeof(float));
        free(w[j]);
        free(wf[j]);
        free(y[j]);
        free(z[j]);
    }
    free(x);
    assert_int_equal(kvs_gemm_isa_set(KVS_GEMM_SCALAR), KVS_OK);
    assert_int_equal(kvs_gemm_isa_get(), KVS_GEMM_SCALAR);
    assert_string_equal(kvs_gemm_isa_name(KVS_GEMM_SCALAR), "scalar");
    assert_int_equal(kvs_gemm_isa_set(KVS_GEMM_COUNT), KVS_ERR_UNSUPPORTED);
    for (int isa = KVS_GEMM_COUNT - 1; isa >= 0; isa--)
        if (kvs_gemm_isa_available((kvs_gemm_isa)isa)) {
            assert_int_equal(kvs_gemm_isa_set((kvs_gemm_isa)isa), KVS_OK);
            break;
        }
}

/* ---- blocked prefill against the token-by-token forward ---- */

typedef struct {
    float *q, *k, *v, *o, *lse; /* [positions][layers][...] */
    float *logits;              /* [positions][vocab] (only block ends filled on the blocked side) */
} records;

static void records_alloc(records *r, const kvs_model_config *c, int n) {
    size_t L = (size_t)c->n_layers, qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
    r->q = malloc((size_t)n * L * qd * sizeof(float));
    r->o = malloc((size_t)n * L * qd * sizeof(float));
    r->k = malloc((size_t)n * L * kvd * sizeof(float));
    r->v = malloc((size_t)n * L * kvd * sizeof(float));
    r->lse = malloc((size_t)n * L * (size_t)c->n_heads * sizeof(float));
    r->logits = malloc((size_t)n * (size_t)c->vocab_size * sizeof(float));
    assert_true(r->q && r->o && r->k && r->v && r->lse && r->logits);
}

static void records_free(records *r) {
    free(r->q);
    free(r->o);
    free(r->k);
    free(r->v);
    free(r->lse);
    free(r->logits);
}

static void records_put(records *r, const kvs_model_config *c, const kvs_model_state *st, int pos, int last) {
    size_t L = (size_t)c->n_layers, qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
    for (int l = 0; l < c->n_layers; l++) {
        kvs_layer_record rec;
        assert_int_equal(last ? kvs_model_state_layer(st, l, &rec) : kvs_model_state_layer_at(st, l, pos, &rec), KVS_OK);
        size_t row = (size_t)pos * L + (size_t)l;
        memcpy(r->q + row * qd, rec.q, qd * sizeof(float));
        memcpy(r->o + row * qd, rec.o, qd * sizeof(float));
        memcpy(r->k + row * kvd, rec.k, kvd * sizeof(float));
        memcpy(r->v + row * kvd, rec.v, kvd * sizeof(float));
        memcpy(r->lse + row * (size_t)c->n_heads, rec.lse, (size_t)c->n_heads * sizeof(float));
    }
}

/* First position where a and b differ, or -1; *what names the record. */
static int first_diff(const float *a, const float *b, size_t per_pos, int n, size_t *at) {
    for (int p = 0; p < n; p++)
        for (size_t i = 0; i < per_pos; i++)
            if (memcmp(&a[(size_t)p * per_pos + i], &b[(size_t)p * per_pos + i], sizeof(float))) {
                *at = i;
                return p;
            }
    return -1;
}

static void compare_model(const char *rel, int max_n) {
    char p[4096];
    path_of(p, sizeof p, rel);
    if (!kvs_test_exists(p)) {
        fprintf(stderr, "SKIP: %s absent\n", p);
        return;
    }
    kvs_model *m;
    assert_int_equal(kvs_model_load(p, &m), KVS_OK);
    const kvs_model_config *c = &kvs_model_info_get(m)->config;
    int n = c->max_seq_len < max_n ? c->max_seq_len : max_n;
    int32_t *tok = malloc((size_t)n * sizeof *tok);
    for (int i = 0; i < n; i++) tok[i] = (int32_t)((i * 7919 + 13) % c->vocab_size);
    kvs_threadpool *pool;
    assert_int_equal(kvs_threadpool_create(2, &pool), KVS_OK);
    kvs_model_state *a, *b;
    assert_int_equal(kvs_model_state_create(m, n, pool, &a), KVS_OK);
    assert_int_equal(kvs_model_state_create(m, n, pool, &b), KVS_OK);
    records ra, rb;
    records_alloc(&ra, c, n);
    records_alloc(&rb, c, n);
    size_t V = (size_t)c->vocab_size;
    for (int pos = 0; pos < n; pos++) {
        const float *lg;
        assert_int_equal(kvs_model_forward(a, tok[pos], pos, &lg), KVS_OK);
        records_put(&ra, c, a, pos, 1);
        memcpy(ra.logits + (size_t)pos * V, lg, V * sizeof(float));
    }
    /* irregular blocks: 1, 5, then full blocks, the rest, and a last token fed alone after a block */
    int pos = 0, step = 0;
    while (pos < n) {
        int nb = step == 0 ? 1 : step == 1 ? 5 : KVS_MODEL_BLOCK;
        if (nb > n - 1 - pos && pos < n - 1) nb = n - 1 - pos;
        if (nb > n - pos) nb = n - pos;
        const float *lg;
        assert_int_equal(kvs_model_forward_block(b, tok + pos, nb, pos, &lg), KVS_OK);
        for (int i = 0; i < nb; i++) records_put(&rb, c, b, pos + i, 0);
        memcpy(rb.logits + (size_t)(pos + nb - 1) * V, lg, V * sizeof(float));
        /* kvs_model_state_layer after a block: its last position */
        kvs_layer_record r1, r2;
        assert_int_equal(kvs_model_state_layer(b, c->n_layers - 1, &r1), KVS_OK);
        assert_int_equal(kvs_model_state_layer_at(b, c->n_layers - 1, pos + nb - 1, &r2), KVS_OK);
        assert_ptr_equal(r1.q, r2.q);
        pos += nb;
        step++;
        int end = pos - 1;
        size_t at;
        int d = first_diff(ra.logits + (size_t)end * V, rb.logits + (size_t)end * V, V, 1, &at);
        if (d >= 0) fail_msg("%s: logits at position %d differ at %zu", rel, end, at);
    }
    size_t L = (size_t)c->n_layers, qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
    struct {
        const char *name;
        const float *x, *y;
        size_t per;
    } cmp[] = {{"q", ra.q, rb.q, L * qd}, {"k", ra.k, rb.k, L * kvd}, {"v", ra.v, rb.v, L * kvd},
               {"o", ra.o, rb.o, L * qd}, {"lse", ra.lse, rb.lse, L * (size_t)c->n_heads}};
    for (size_t i = 0; i < sizeof cmp / sizeof *cmp; i++) {
        size_t at;
        int d = first_diff(cmp[i].x, cmp[i].y, cmp[i].per, n, &at);
        if (d >= 0)
            fail_msg("%s: %s differs at position %d, element %zu (layer %zu): token path %.9g, blocked %.9g", rel,
                     cmp[i].name, d, at, at / (cmp[i].per / L), cmp[i].x[(size_t)d * cmp[i].per + at],
                     cmp[i].y[(size_t)d * cmp[i].per + at]);
    }
    fprintf(stderr, "%s: %d positions, blocked = token by token bit for bit (%s)\n", rel, n,
            kvs_gemm_isa_name(kvs_gemm_isa_get()));
    records_free(&ra);
    records_free(&rb);
    kvs_model_state_free(a);
    kvs_model_state_free(b);
    kvs_threadpool_free(pool);
    free(tok);
    kvs_model_free(m);
}

static void test_block_equals_token_path_real_models(void **state) {
    (void)state;
    compare_model("../shared/models/stories260K.bin", 300);
    compare_model("../shared/models/tinystories-656K", 300);
}

static void test_block_equals_token_path_16bit_fixtures(void **state) {
    (void)state;
    compare_model("tests/fixtures/qwen2_tiny", 300);
    compare_model("tests/fixtures/llama3_tiny", 300);
    compare_model("tests/fixtures/mistral_tiny", 300);
}

/* Qwen3's q/k norms; Gemma-3's sliding layers (window 6: every block past position 6 is cut, so the windowed
 * attention path runs), local RoPE base, (1 + w) and branch norms, GeGLU, scaled embedding, logit soft-capping */
static void test_block_equals_token_path_qwen3_gemma3(void **state) {
    (void)state;
    compare_model("tests/fixtures/qwen3_tiny", 200);
    compare_model("tests/fixtures/gemma3_tiny", 200);
}

/* Every instruction set below the default one: blocked = token by token on the 16-bit fixtures (their packed
 * products) and on stories260K (fp32 weights, the dot-product kernel). */
static void test_block_equals_token_path_every_isa(void **state) {
    (void)state;
    kvs_gemm_isa keep = kvs_gemm_isa_get();
    for (int isa = 0; isa < (int)keep; isa++) {
        if (!kvs_gemm_isa_available((kvs_gemm_isa)isa)) continue;
        assert_int_equal(kvs_gemm_isa_set((kvs_gemm_isa)isa), KVS_OK);
        compare_model("tests/fixtures/qwen2_tiny", 300);
        compare_model("tests/fixtures/llama3_tiny", 100);
        compare_model("tests/fixtures/mistral_tiny", 100);
        compare_model("../shared/models/stories260K.bin", 100);
    }
    assert_int_equal(kvs_gemm_isa_set(keep), KVS_OK);
}

/* A packed (16-bit) model's products are one fmaf chain per element at every instruction set (matmul.h), so its
 * logits are the same bits whichever level runs them. */
static void test_16bit_logits_same_at_every_isa(void **state) {
    (void)state;
    static const char *const rels[] = {"tests/fixtures/qwen2_tiny", "tests/fixtures/llama3_tiny"};
    kvs_gemm_isa keep = kvs_gemm_isa_get();
    for (size_t f = 0; f < 2; f++) {
        char p[4096];
        path_of(p, sizeof p, rels[f]);
        kvs_model *m;
        assert_int_equal(kvs_model_load(p, &m), KVS_OK);
        const kvs_model_config *c = &kvs_model_info_get(m)->config;
        int n = 20, V = c->vocab_size, levels = 0;
        float *first = malloc((size_t)n * (size_t)V * sizeof *first);
        assert_non_null(first);
        for (int isa = 0; isa < KVS_GEMM_COUNT; isa++) {
            if (!kvs_gemm_isa_available((kvs_gemm_isa)isa)) continue;
            assert_int_equal(kvs_gemm_isa_set((kvs_gemm_isa)isa), KVS_OK);
            kvs_model_state *st;
            assert_int_equal(kvs_model_state_create(m, n, NULL, &st), KVS_OK);
            for (int pos = 0; pos < n; pos++) {
                const float *lg;
                assert_int_equal(kvs_model_forward(st, (int32_t)((pos * 37 + 5) % V), pos, &lg), KVS_OK);
                if (!levels) memcpy(first + (size_t)pos * V, lg, (size_t)V * sizeof *lg);
                else if (memcmp(first + (size_t)pos * V, lg, (size_t)V * sizeof *lg))
                    fail_msg("%s: logits at position %d differ between %s and the first level", rels[f], pos,
                             kvs_gemm_isa_name((kvs_gemm_isa)isa));
            }
            kvs_model_state_free(st);
            levels++;
        }
        free(first);
        kvs_model_free(m);
    }
    assert_int_equal(kvs_gemm_isa_set(keep), KVS_OK);
}

static void test_16bit_matrices_kept_as_stored(void **state) {
    (void)state;
    static const struct {
        const char *rel;
        kvs_dtype dt;
    } cases[] = {{"tests/fixtures/qwen2_tiny", KVS_DTYPE_BF16}, {"tests/fixtures/llama3_tiny", KVS_DTYPE_F16}};
    for (size_t i = 0; i < 2; i++) {
        char p[4096];
        path_of(p, sizeof p, cases[i].rel);
        kvs_model *m;
        assert_int_equal(kvs_model_load(p, &m), KVS_OK);
        kvs_model_weights mw;
        kvs_model_layer_weights lw;
        assert_int_equal(kvs_model_weights_get(m, &mw), KVS_OK);
        assert_int_equal(kvs_model_layer_weights_get(m, 0, &lw), KVS_OK);
        assert_int_equal(mw.embed.dtype, cases[i].dt);
        assert_int_equal(lw.wq.dtype, cases[i].dt);
        assert_int_equal(lw.w2.dtype, cases[i].dt);
        /* packed by the first state, not at load (a CUDA-only run never pays for the panels) */
        assert_null(lw.wq.packed);
        assert_null(mw.cls.packed);
        kvs_model_state *st;
        assert_int_equal(kvs_model_state_create(m, 4, NULL, &st), KVS_OK);
        assert_int_equal(kvs_model_layer_weights_get(m, 0, &lw), KVS_OK);
        assert_int_equal(kvs_model_weights_get(m, &mw), KVS_OK);
        assert_non_null(lw.wq.packed);
        assert_non_null(lw.w2.packed);
        assert_non_null(mw.cls.packed);
        assert_int_equal(lw.wq.dtype, cases[i].dt); /* still 16-bit */
        kvs_model_state_free(st);
        /* bytes per token: matrices at 2 bytes, so under 60% of the fp32 count */
        const kvs_model_info *info = kvs_model_info_get(m);
        assert_true((double)info->weight_bytes < 0.6 * 4.0 * (double)info->n_params);
        kvs_model_free(m);
    }
}

static void test_block_bad_arguments(void **state) {
    (void)state;
    char p[4096];
    path_of(p, sizeof p, "tests/fixtures/qwen2_tiny");
    kvs_model *m;
    assert_int_equal(kvs_model_load(p, &m), KVS_OK);
    kvs_model_state *s;
    assert_int_equal(kvs_model_state_create(m, 16, NULL, &s), KVS_OK);
    int32_t tok[20] = {0};
    const float *lg;
    assert_int_equal(kvs_model_forward_block(s, tok, 0, 0, &lg), KVS_ERR_INVALID_ARG);
    assert_int_equal(kvs_model_forward_block(s, tok, KVS_MODEL_BLOCK + 1, 0, &lg), KVS_ERR_INVALID_ARG);
    assert_int_equal(kvs_model_forward_block(s, tok, 17, 0, &lg), KVS_ERR_RANGE);
    assert_int_equal(kvs_model_forward_block(s, tok, 2, 1, &lg), KVS_ERR_STATE); /* position 0 not fed */
    tok[1] = -1;
    assert_int_equal(kvs_model_forward_block(s, tok, 2, 0, &lg), KVS_ERR_RANGE);
    tok[1] = 3;
    assert_int_equal(kvs_model_forward_block(s, tok, 4, 0, &lg), KVS_OK);
    kvs_layer_record rec;
    assert_int_equal(kvs_model_state_layer_at(s, 0, 4, &rec), KVS_ERR_RANGE);
    assert_int_equal(kvs_model_state_layer_at(s, 0, 3, &rec), KVS_OK);
    assert_int_equal(kvs_model_forward(s, 5, 4, &lg), KVS_OK);
    assert_int_equal(kvs_model_state_layer_at(s, 0, 3, &rec), KVS_ERR_STATE); /* records are position 4's now */
    assert_int_equal(kvs_model_state_layer_at(s, 0, 4, &rec), KVS_OK);
    kvs_model_state_free(s);
    kvs_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm_against_double_reference),
        cmocka_unit_test(test_gemm_packed_against_fmaf_chain),
        cmocka_unit_test(test_packed_layout_round_trip),
        cmocka_unit_test(test_gemm_multi_packed_mixed),
        cmocka_unit_test(test_gemm_multi_and_isa_control),
        cmocka_unit_test(test_block_equals_token_path_real_models),
        cmocka_unit_test(test_block_equals_token_path_16bit_fixtures),
        cmocka_unit_test(test_block_equals_token_path_qwen3_gemma3),
        cmocka_unit_test(test_block_equals_token_path_every_isa),
        cmocka_unit_test(test_16bit_logits_same_at_every_isa),
        cmocka_unit_test(test_16bit_matrices_kept_as_stored),
        cmocka_unit_test(test_block_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
