/* test_cuda.c — tests of the CUDA capture backend (gpu_capture/cuda_backend.h, gpu_capture/cuda/):
 *  - every kernel against its CPU reference on random inputs (embedding, RMSNorm, q/k/v bias + RoPE in both
 *    layouts with Llama-3 frequency scaling, decode and prefill attention with LSE for head_dim 8..256 and
 *    up to 128 heads, SwiGLU, residual add, the cuBLAS GEMM in fp32/fp16/bf16);
 *  - PARITY: the CPU reference (kvs_model_forward) and the CUDA backend decode stories260K greedily from BOS
 *    to identical tokens with q/k/v/o/lse equal per layer within tolerance; batched prefill equals
 *    position-by-position decoding; the fp16 and bf16 fixtures agree within 16-bit tolerance;
 *  - a trace captured through the CUDA recording pipeline (ring wrap-around and back-pressure forced by a
 *    small ring) holds exactly the CPU's values and passes `$KVSIM_BIN verify`;
 *  - error paths: no device, bad arguments, positions out of order.
 * Builds without CUDA (default `make`) skip the GPU tests with "built without CUDA"; a CUDA build on a
 * machine without a usable GPU skips them with "no CUDA device". Never a silent pass.
 *
 * Tolerances (why):
 *  - kernels that do the same fp32 operations as the CPU in a different order (RMSNorm sums, attention,
 *    GEMM accumulation): relative 1e-5 .. 1e-4 of the natural scale, far above fp32 reordering noise
 *    (~1e-6) and far below any indexing or formula error (O(1));
 *  - results rounded to fp16/bf16: one unit in the last place of that type (a 1-ulp fp32 difference can
 *    flip the final rounding);
 *  - model parity, fp32 weights (stories260K): 1e-4 relative L2 per layer vector, as the CPU-vs-torch
 *    golden tests; 16-bit weights: the GEMM inputs are rounded to the weight dtype on the GPU but not on the
 *    CPU, a relative error of u per input (fp16 2^-11 = 4.9e-4, bf16 2^-8 = 3.9e-3) that grows through the
 *    layers; we allow ~40 u (fp16 2e-2, bf16 1.5e-1) for the 2-layer fixtures.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/util/testenv.h"

#include "common/kvs.h"
#include "common/kvs_math.h"
#include "gpu_capture/cuda_backend.h"
#include "gpu_capture/model.h"
#include "trace/trace.h"
#ifdef KVS_WITH_CUDA
#include "gpu_capture/cuda/cuda_testing.h"
#endif

/* ================================================================================================
 * Helpers
 * ============================================================================================== */

/* CPU references and random inputs only the CUDA build's kernel tests call */
#ifdef KVS_WITH_CUDA
#define CUDA_ONLY
#else
#define CUDA_ONLY __attribute__((unused))
#endif

/* KVSIM_REQUIRE_GPU=1 (tools/gpu_session.sh sets it) turns "no GPU" and "no model file" skips into
 * failures, so a GPU session cannot pass with its GPU tests silently skipped. */
static int gpu_required(void) {
    const char *r = getenv("KVSIM_REQUIRE_GPU");
    return r && !strcmp(r, "1");
}

/* 1 when a GPU can run the kernels; otherwise prints why and returns 0 (fails under KVSIM_REQUIRE_GPU=1). */
static int gpu_ready(void) {
#ifndef KVS_WITH_CUDA
    const char *why = "built without CUDA (run `make cuda-test` on a machine with a GPU)";
#else
    char desc[256];
    if (kvs_cuda_probe(desc, sizeof desc) == KVS_OK) return 1;
    const char *why = kvs_last_error();
#endif
    if (gpu_required()) {
        print_error("KVSIM_REQUIRE_GPU=1 but the GPU tests cannot run: %s\n", why);
        fail();
    }
    print_message("SKIP: %s\n", why);
    return 0;
}

#define NEED_GPU()                  \
    do {                            \
        if (!gpu_ready()) skip();   \
    } while (0)

static void model_path(char *buf, size_t cap, const char *rel) { snprintf(buf, cap, "%s/%s", kvs_test_root(), rel); }

/* The CLI under test ($KVSIM_BIN, set by the make targets that run the suite); skips without it. */
static const char *need_kvsim_bin(void) {
    const char *bin = getenv("KVSIM_BIN");
    if (!bin) {
        print_message("SKIP: KVSIM_BIN is not set (run through `make test`, `make cuda-test` or `make cuda-emu-test`)\n");
        skip();
    }
    return bin;
}

/* Skips unless the file exists (fails under KVSIM_REQUIRE_GPU=1). */
static void need_file(const char *p) {
    if (!kvs_test_exists(p)) {
        if (gpu_required()) {
            print_error("KVSIM_REQUIRE_GPU=1 but %s is absent\n", p);
            fail();
        }
        print_message("SKIP: %s absent (shared real models / fixtures not installed)\n", p);
        skip();
    }
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static double uniform01(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return ((rng_state >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

static float gauss(void) {
    double u = uniform01(), v = uniform01();
    return (float)(sqrt(-2.0 * log(u)) * cos(2.0 * M_PI * v));
}

CUDA_ONLY static float *rand_array(size_t n, float scale) {
    float *a = malloc(n * sizeof *a + 1);
    assert_non_null(a);
    for (size_t i = 0; i < n; i++) a[i] = scale * gauss();
    return a;
}

CUDA_ONLY static float round_to(kvs_dtype dt, float x) {
    if (dt == KVS_DTYPE_F16) return kvs_f16_to_f32(kvs_f32_to_f16(x));
    if (dt == KVS_DTYPE_BF16) return kvs_bf16_to_f32(kvs_f32_to_bf16(x));
    return x;
}

/* unit in the last place of dtype dt, relative */
CUDA_ONLY static double ulp_of(kvs_dtype dt) {
    return dt == KVS_DTYPE_F16 ? ldexp(1.0, -10) : dt == KVS_DTYPE_BF16 ? ldexp(1.0, -7) : ldexp(1.0, -22);
}

/* Asserts |got - ref| <= rel * |ref| + abs_tol elementwise, naming the first offender. */
CUDA_ONLY static void assert_close(const char *what, const float *ref, const float *got, size_t n, double rel, double abs_tol) {
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)ref[i]);
        if (!(d <= rel * fabs((double)ref[i]) + abs_tol)) {
            print_error("%s: element %zu: got %.9g, expected %.9g (|diff| %.3g > %.3g)\n", what, i, got[i], ref[i], d,
                        rel * fabs((double)ref[i]) + abs_tol);
            fail();
        }
    }
}

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* ================================================================================================
 * Tests that run everywhere: status of the build / device
 * ============================================================================================== */

static void test_probe_reports_device_or_no_device(void **state) {
    (void)state;
    char desc[256] = "unset";
    kvs_status s = kvs_cuda_probe(desc, sizeof desc);
    if (s == KVS_OK) {
        assert_true(strlen(desc) > 0);
        print_message("CUDA device: %s\n", desc);
        return;
    }
    if (s == KVS_ERR_UNSUPPORTED) { /* a GPU older than sm_80 */
        assert_non_null(strstr(kvs_last_error(), "compute capability"));
        return;
    }
    assert_int_equal(s, KVS_ERR_NO_DEVICE);
    assert_non_null(strstr(kvs_last_error(), "no CUDA device"));
    assert_string_equal(desc, "");
#ifndef KVS_WITH_CUDA
    assert_non_null(strstr(kvs_last_error(), "built without CUDA"));
    assert_non_null(strstr(kvs_last_error(), "make cuda"));
#endif
}

static void test_create_without_device_fails_cleanly(void **state) {
    (void)state;
    char p[4096];
    if (kvs_cuda_probe(NULL, 0) == KVS_OK) {
        print_message("SKIP: a CUDA device is present; the no-device path cannot be exercised here\n");
        skip();
    }
    model_path(p, sizeof p, "../shared/models/stories260K.bin");
    need_file(p);
    kvs_model *m = NULL;
    assert_int_equal(kvs_model_load(p, &m), KVS_OK);
    kvs_cuda_backend *b = (kvs_cuda_backend *)(uintptr_t)1;
    kvs_status s = kvs_cuda_backend_create(m, 16, NULL, &b);
    assert_int_equal(s, KVS_ERR_NO_DEVICE);
    assert_non_null(strstr(kvs_last_error(), "no CUDA device"));
    assert_null(b);
    kvs_cuda_backend_free(NULL);
    kvs_model_free(m);
}

static void test_create_rejects_bad_max_positions(void **state) {
    (void)state;
#ifndef KVS_WITH_CUDA
    print_message("SKIP: built without CUDA (the no-CUDA fallback reports no device before looking at arguments)\n");
    skip();
#else
    char p[4096];
    model_path(p, sizeof p, "../shared/models/stories260K.bin");
    need_file(p);
    kvs_model *m = NULL;
    assert_int_equal(kvs_model_load(p, &m), KVS_OK);
    kvs_cuda_backend *b = NULL;
    /* arguments are checked before the device, so this runs without a GPU too */
    assert_int_equal(kvs_cuda_backend_create(m, 0, NULL, &b), KVS_ERR_INVALID_ARG);
    assert_non_null(strstr(kvs_last_error(), "max positions 0"));
    assert_int_equal(kvs_cuda_backend_create(m, 513, NULL, &b), KVS_ERR_INVALID_ARG);
    assert_non_null(strstr(kvs_last_error(), "[1, 512]"));
    assert_null(b);
    kvs_model_free(m);
#endif
}

/* Qwen3 and Gemma-3 run on the CPU only: the backend refuses them by name before looking for a device. */
static void test_create_refuses_qwen3_and_gemma3(void **state) {
    (void)state;
#ifndef KVS_WITH_CUDA
    print_message("SKIP: built without CUDA (the no-CUDA fallback reports no device before looking at the model)\n");
    skip();
#else
    static const char *const fixtures[2] = {"tests/fixtures/qwen3_tiny", "tests/fixtures/gemma3_tiny"};
    for (int i = 0; i < 2; i++) {
        char p[4096];
        model_path(p, sizeof p, fixtures[i]);
        kvs_model *m = NULL;
        assert_int_equal(kvs_model_load(p, &m), KVS_OK);
        kvs_cuda_backend *b = NULL;
        assert_int_equal(kvs_cuda_backend_create(m, 16, NULL, &b), KVS_ERR_UNSUPPORTED);
        assert_non_null(strstr(kvs_last_error(), "Llama-family forward pass only"));
        assert_non_null(strstr(kvs_last_error(), i ? "Gemma3ForCausalLM" : "Qwen3ForCausalLM"));
        assert_null(b);
        kvs_model_free(m);
    }
#endif
}

/* ================================================================================================
 * Kernels vs CPU references
 * ============================================================================================== */

CUDA_ONLY static const kvs_dtype all_dtypes[3] = {KVS_DTYPE_F32, KVS_DTYPE_F16, KVS_DTYPE_BF16};

static void test_embed_kernel_matches_cpu(void **state) {
    (void)state;
    NEED_GPU();
#ifdef KVS_WITH_CUDA
    int vocab = 300, dim = 72, n = 64;
    float *table = rand_array((size_t)vocab * dim, 1.0f), *out = malloc((size_t)n * dim * sizeof(float));
    int32_t tok[64];
    for (int i = 0; i < n; i++) tok[i] = (int32_t)((i * 37 + 5) % vocab);
    tok[0] = vocab - 1;
    for (int t = 0; t < 3; t++) {
        kvs_dtype dt = all_dtypes[t];
        assert_int_equal(kvs_cuda_test_embed(dt, table, vocab, dim, tok, n, out), KVS_OK);
        for (int r = 0; r < n; r++)
            for (int i = 0; i < dim; i++) /* a lookup: exact */
                assert_true(out[(size_t)r * dim + i] == round_to(dt, table[(size_t)tok[r] * dim + i]));
    }
    free(table);
    free(out);
#endif
}

/* model.c rmsnorm */
CUDA_ONLY static void ref_rmsnorm(float *o, const float *x, const float *w, int n, float eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float inv = (float)(1.0 / sqrt(ss / n + eps));
    for (int i = 0; i < n; i++) o[i] = w[i] * (x[i] * inv);
}

static void test_rmsnorm_kernel_matches_cpu(void **state) {
    (void)state;
    NEED_GPU();
#ifdef KVS_WITH_CUDA
    const int dims[4] = {8, 64, 1000, 4096};
    for (int di = 0; di < 4; di++) {
        int dim = dims[di], n = di + 2;
        float *x = rand_array((size_t)n * dim, 3.0f), *w = rand_array((size_t)dim, 1.0f);
        float *ref = malloc((size_t)n * dim * sizeof(float)), *out = malloc((size_t)n * dim * sizeof(float));
        for (int r = 0; r < n; r++) ref_rmsnorm(ref + (size_t)r * dim, x + (size_t)r * dim, w, dim, 1e-5f);
        for (int t = 0; t < 3; t++) {
            kvs_dtype dt = all_dtypes[t];
            float *rr = malloc((size_t)n * dim * sizeof(float));
            for (size_t i = 0; i < (size_t)n * dim; i++) rr[i] = round_to(dt, ref[i]);
            assert_int_equal(kvs_cuda_test_rmsnorm(dt, x, w, n, dim, 1e-5f, out), KVS_OK);
            /* the fp64 sum differs only in order: inv within 1 fp32 ulp, so 2 ulps of the output dtype */
            assert_close("rmsnorm", rr, out, (size_t)n * dim, 2 * ulp_of(dt), 1e-30);
            free(rr);
        }
        free(x);
        free(w);
        free(ref);
        free(out);
    }
#endif
}

/* model.c finish_config's frequencies, optionally with Llama-3 scaling */
CUDA_ONLY static void ref_inv_freq(float *f, int hd, double theta, int llama3) {
    for (int i = 0; i < hd / 2; i++) {
        double v = pow(theta, -2.0 * i / (double)hd);
        if (llama3) {
            double old_ctx = 64, lo = 1.0, hi = 4.0, factor = 8.0;
            double low_wavelen = old_ctx / lo, high_wavelen = old_ctx / hi, wavelen = 2.0 * M_PI / v;
            if (wavelen > low_wavelen) v = v / factor;
            else if (wavelen >= high_wavelen) {
                double smooth = (old_ctx / wavelen - lo) / (hi - lo);
                v = (1.0 - smooth) * v / factor + smooth * v;
            }
        }
        f[i] = (float)v;
    }
}

/* model.c: bias in the projection, then rope() on each head */
CUDA_ONLY static void ref_rope(float *v, int d, int layout, int pos, const float *inv_freq) {
    int half = d / 2;
    for (int i = 0; i < half; i++) {
        double ang = (double)pos * (double)inv_freq[i];
        float c = (float)cos(ang), s = (float)sin(ang);
        int a = layout == KVS_ROPE_ADJACENT ? 2 * i : i, b = layout == KVS_ROPE_ADJACENT ? 2 * i + 1 : i + half;
        float x0 = v[a], x1 = v[b];
        v[a] = x0 * c - x1 * s;
        v[b] = x0 * s + x1 * c;
    }
}

static void test_qkv_rope_kernel_matches_cpu(void **state) {
    (void)state;
    NEED_GPU();
#ifdef KVS_WITH_CUDA
    struct {
        int H, Hkv, hd, n, pos0, layout, bias, llama3;
    } cases[] = {
        {8, 4, 8, 1, 0, KVS_ROPE_ADJACENT, 0, 0},   {8, 4, 16, 7, 3, KVS_ROPE_HALVES, 1, 0},
        {32, 8, 64, 64, 100, KVS_ROPE_HALVES, 0, 1}, {16, 16, 128, 5, 5000, KVS_ROPE_ADJACENT, 1, 0},
        {128, 8, 256, 3, 70000, KVS_ROPE_HALVES, 1, 1},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        int H = cases[ci].H, Hkv = cases[ci].Hkv, hd = cases[ci].hd, n = cases[ci].n, pos0 = cases[ci].pos0;
        int qd = H * hd, kvd = Hkv * hd, w = qd + 2 * kvd;
        float *qkv = rand_array((size_t)n * w, 2.0f);
        float *bq = cases[ci].bias ? rand_array((size_t)qd, 0.5f) : NULL;
        float *bk = cases[ci].bias ? rand_array((size_t)kvd, 0.5f) : NULL;
        float *bv = cases[ci].bias ? rand_array((size_t)kvd, 0.5f) : NULL;
        float freq[128];
        ref_inv_freq(freq, hd, cases[ci].llama3 ? 500000.0 : 10000.0, cases[ci].llama3);
        float *q = malloc((size_t)n * qd * 4), *k = malloc((size_t)n * kvd * 4), *v = malloc((size_t)n * kvd * 4);
        float *rq = malloc((size_t)n * qd * 4), *rk = malloc((size_t)n * kvd * 4), *rv = malloc((size_t)n * kvd * 4);
        for (int r = 0; r < n; r++) {
            const float *in = qkv + (size_t)r * w;
            for (int i = 0; i < qd; i++) rq[(size_t)r * qd + i] = in[i] + (bq ? bq[i] : 0.0f);
            for (int i = 0; i < kvd; i++) rk[(size_t)r * kvd + i] = in[qd + i] + (bk ? bk[i] : 0.0f);
            for (int i = 0; i < kvd; i++) rv[(size_t)r * kvd + i] = in[qd + kvd + i] + (bv ? bv[i] : 0.0f);
            for (int h = 0; h < H; h++) ref_rope(rq + (size_t)r * qd + (size_t)h * hd, hd, cases[ci].layout, pos0 + r, freq);
            for (int h = 0; h < Hkv; h++) ref_rope(rk + (size_t)r * kvd + (size_t)h * hd, hd, cases[ci].layout, pos0 + r, freq);
        }
        assert_int_equal(kvs_cuda_test_qkv_rope(qkv, bq, bk, bv, freq, cases[ci].layout, n, pos0, H, Hkv, hd, q, k, v),
                         KVS_OK);
        /* same fp32 operations (no FMA on either side); cos/sin from fp64 may differ by one fp64 ulp,
         * which can move the fp32 rounding by one ulp: 1e-6 of the vector scale */
        assert_close("rope q", rq, q, (size_t)n * qd, 1e-6, 1e-6);
        assert_close("rope k", rk, k, (size_t)n * kvd, 1e-6, 1e-6);
        assert_close("v", rv, v, (size_t)n * kvd, 0, 0);
        free(qkv);
        free(bq);
        free(bk);
        free(bv);
        free(q);
        free(k);
        free(v);
        free(rq);
        free(rk);
        free(rv);
    }
#endif
}

/* CPU reference: kvs_attention for each query row r (position n_keys - n + r) and head. */
CUDA_ONLY static void ref_attention(const float *q, const float *k, const float *v, int n_keys, int n, int H, int Hkv, int hd,
                          float scale, float *o, float *lse) {
    int G = H / Hkv, kvd = Hkv * hd;
    float *probs = malloc((size_t)n_keys * sizeof(float));
    for (int r = 0; r < n; r++) {
        int p = n_keys - n + r;
        for (int h = 0; h < H; h++) {
            double l = kvs_attention(q + ((size_t)r * H + h) * hd, k + (size_t)(h / G) * hd, v + (size_t)(h / G) * hd,
                                     (size_t)kvd, NULL, (size_t)p + 1, (size_t)hd, scale, probs,
                                     o + ((size_t)r * H + h) * hd);
            lse[(size_t)r * H + h] = (float)l;
        }
    }
    free(probs);
}

static void check_attention(int H, int Hkv, int hd, int n_keys, int n, int force_prefill) {
#ifdef KVS_WITH_CUDA
    int qd = H * hd, kvd = Hkv * hd;
    float scale = 1.0f / sqrtf((float)hd);
    /* q scaled so the scores spread over several units: softmax neither uniform nor one-hot */
    float *q = rand_array((size_t)n * qd, 2.0f), *k = rand_array((size_t)n_keys * kvd, 1.0f);
    float *v = rand_array((size_t)n_keys * kvd, 1.0f);
    float *o = malloc((size_t)n * qd * 4), *lse = malloc((size_t)n * H * 4);
    float *ro = malloc((size_t)n * qd * 4), *rl = malloc((size_t)n * H * 4);
    ref_attention(q, k, v, n_keys, n, H, Hkv, hd, scale, ro, rl);
    assert_int_equal(kvs_cuda_test_attention(q, k, v, n_keys, n, H, Hkv, hd, scale, force_prefill, o, lse), KVS_OK);
    for (int r = 0; r < n; r++)
        for (int h = 0; h < H; h++) {
            size_t off = ((size_t)r * H + h) * hd;
            double e = kvs_rel_l2(ro + off, o + off, (size_t)hd);
            double le = fabs((double)lse[(size_t)r * H + h] - rl[(size_t)r * H + h]);
            /* expf vs exp, fp32 running sums over up to 1000 keys: ~1e-6; a wrong key, head or mask: O(0.1) */
            if (!(e <= 2e-5) || !(le <= 2e-5 * (1 + fabs(rl[(size_t)r * H + h])))) {
                print_error("attention H %d Hkv %d hd %d keys %d rows %d%s: row %d head %d: o rel err %.3g, lse %.7g vs "
                            "%.7g\n", H, Hkv, hd, n_keys, n, force_prefill ? " (prefill kernel)" : "", r, h, e,
                            lse[(size_t)r * H + h], rl[(size_t)r * H + h]);
                fail();
            }
        }
    free(q);
    free(k);
    free(v);
    free(o);
    free(lse);
    free(ro);
    free(rl);
#else
    (void)H, (void)Hkv, (void)hd, (void)n_keys, (void)n, (void)force_prefill;
#endif
}

static void test_decode_attention_kernel_matches_cpu(void **state) {
    (void)state;
    NEED_GPU();
    const int shapes[][3] = {{8, 4, 8}, {8, 4, 16}, {32, 8, 64}, {4, 4, 128}, {128, 8, 128}, {16, 2, 256}, {12, 3, 80}};
    const int keys[] = {1, 2, 7, 9, 33, 1000};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
            check_attention(shapes[s][0], shapes[s][1], shapes[s][2], keys[k], 1, 0);
}

static void test_prefill_attention_kernel_matches_cpu(void **state) {
    (void)state;
    NEED_GPU();
    const int shapes[][3] = {{8, 4, 8}, {32, 8, 64}, {128, 8, 128}, {16, 2, 256}, {6, 6, 34}};
    const int rows[][2] = {{1, 1}, {1, 40}, {5, 5}, {17, 17}, {17, 300}, {64, 64}, {64, 400}}; /* {n, n_keys} */
    /* On the CPU emulation of CUDA (tests/cuda_emu, KVS_TEST_CUDA_EMU=1) the two cases above 1e8 multiply-adds (the
     * 64 x 400 block at 128 x 128 and 16 x 256) take two thirds of the emulated suite; every shape still runs with
     * several key tiles there. A GPU runs them all. */
    const char *emu = getenv("KVS_TEST_CUDA_EMU");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
            double work = (double)shapes[s][0] * shapes[s][2] * rows[r][0] * rows[r][1];
            if (emu && emu[0] == '1' && work > 1e8) continue;
            check_attention(shapes[s][0], shapes[s][1], shapes[s][2], rows[r][1], rows[r][0], 1);
        }
}

static void test_swiglu_kernel_matches_cpu(void **state) {
    (void)state;
    NEED_GPU();
#ifdef KVS_WITH_CUDA
    int n = 5, hid = 1003;
    float *gu = rand_array((size_t)n * 2 * hid, 3.0f), *out = malloc((size_t)n * hid * 4), *ref = malloc((size_t)n * hid * 4);
    for (int t = 0; t < 3; t++) {
        kvs_dtype dt = all_dtypes[t];
        for (int r = 0; r < n; r++)
            for (int i = 0; i < hid; i++) {
                float g = gu[(size_t)r * 2 * hid + i], u = gu[(size_t)r * 2 * hid + hid + i];
                ref[(size_t)r * hid + i] = round_to(dt, g / (1.0f + expf(-g)) * u);
            }
        assert_int_equal(kvs_cuda_test_swiglu(dt, gu, n, hid, out), KVS_OK);
        /* device expf is within 2 fp32 ulps of glibc's: a few fp32 ulps, or one ulp of the 16-bit type */
        assert_close("swiglu", ref, out, (size_t)n * hid, dt == KVS_DTYPE_F32 ? 1e-6 : ulp_of(dt), 1e-30);
    }
    free(gu);
    free(out);
    free(ref);
#endif
}

static void test_residual_kernel_matches_cpu(void **state) {
    (void)state;
    NEED_GPU();
#ifdef KVS_WITH_CUDA
    int n = 3, dim = 517;
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        float *x = rand_array((size_t)n * dim, 1.0f), *t = rand_array((size_t)n * dim, 1.0f);
        float *b = with_bias ? rand_array((size_t)dim, 1.0f) : NULL, *ref = malloc((size_t)n * dim * 4);
        for (int r = 0; r < n; r++)
            for (int i = 0; i < dim; i++) {
                float v = t[(size_t)r * dim + i];
                if (b) v += b[i];
                ref[(size_t)r * dim + i] = x[(size_t)r * dim + i] + v;
            }
        assert_int_equal(kvs_cuda_test_residual(x, t, b, n, dim), KVS_OK);
        assert_close("residual", ref, x, (size_t)n * dim, 0, 0); /* the same two fp32 additions: exact */
        free(x);
        free(t);
        free(b);
        free(ref);
    }
#endif
}

static void test_gemm_matches_cpu(void **state) {
    (void)state;
    NEED_GPU();
#ifdef KVS_WITH_CUDA
    const int shapes[][3] = {{1, 300, 64}, {7, 172, 64}, {64, 512, 1000}, {3, 2048, 2048}, {1, 32000, 256}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int n = shapes[s][0], out = shapes[s][1], in = shapes[s][2];
        float *W = rand_array((size_t)out * in, 1.0f), *x = rand_array((size_t)n * in, 1.0f);
        float *y = malloc((size_t)n * out * 4);
        for (int t = 0; t < 3; t++) {
            kvs_dtype dt = all_dtypes[t];
            assert_int_equal(kvs_cuda_test_gemm(dt, W, x, n, out, in, y), KVS_OK);
            for (int r = 0; r < n; r++)
                for (int o = 0; o < out; o++) {
                    double acc = 0, mag = 0;
                    for (int i = 0; i < in; i++) {
                        double p = (double)round_to(dt, W[(size_t)o * in + i]) * round_to(dt, x[(size_t)r * in + i]);
                        acc += p;
                        mag += fabs(p);
                    }
                    /* fp32 accumulation of exactly representable products: error <~ sqrt(in) 2^-24 sum|p|;
                     * 1e-5 sum|p| is loose for that and 4 orders below a wrong row or transposition */
                    double err = fabs(y[(size_t)r * out + o] - acc);
                    if (!(err <= 1e-5 * mag + 1e-6)) {
                        print_error("gemm %s n %d out %d in %d: y[%d][%d] = %.9g, expected %.9g\n", kvs_dtype_name(dt), n,
                                    out, in, r, o, y[(size_t)r * out + o], acc);
                        fail();
                    }
                }
        }
        free(W);
        free(x);
        free(y);
    }
#endif
}

/* ================================================================================================
 * Model parity: CPU reference vs CUDA backend
 * ============================================================================================== */

typedef struct {
    kvs_model *m;
    const kvs_model_info *info;
    kvs_model_state *cpu;
    kvs_cuda_backend *gpu;
    float *q, *k, *v, *o, *lse; /* GPU record scratch */
} parity;

/* Loads the model at `rel` (repo-relative; skips when absent) on the CPU and the GPU. */
static void parity_open(parity *p, const char *rel, int max_pos) {
    char path[4096];
    model_path(path, sizeof path, rel);
    need_file(path);
    memset(p, 0, sizeof *p);
    assert_int_equal(kvs_model_load(path, &p->m), KVS_OK);
    p->info = kvs_model_info_get(p->m);
    assert_int_equal(kvs_model_state_create(p->m, max_pos, NULL, &p->cpu), KVS_OK);
    kvs_status s = kvs_cuda_backend_create(p->m, max_pos, NULL, &p->gpu);
    if (s != KVS_OK) print_error("kvs_cuda_backend_create: %s\n", kvs_last_error());
    assert_int_equal(s, KVS_OK);
    const kvs_model_config *c = &p->info->config;
    size_t qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
    p->q = malloc(qd * 4);
    p->o = malloc(qd * 4);
    p->k = malloc(kvd * 4);
    p->v = malloc(kvd * 4);
    p->lse = malloc((size_t)c->n_heads * 4);
}

static void parity_close(parity *p) {
    kvs_cuda_backend_free(p->gpu);
    kvs_model_state_free(p->cpu);
    kvs_model_free(p->m);
    free(p->q);
    free(p->k);
    free(p->v);
    free(p->o);
    free(p->lse);
}

/* Compares every layer of position `pos` (the CPU's last forwarded position, and within the GPU's last
 * call) with relative-L2 tolerance tol per vector and |lse diff| <= tol * (1 + |lse|). */
static void parity_compare(parity *p, int pos, double tol) {
    const kvs_model_config *c = &p->info->config;
    size_t qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
    for (int l = 0; l < c->n_layers; l++) {
        kvs_layer_record rec;
        assert_int_equal(kvs_model_state_layer(p->cpu, l, &rec), KVS_OK);
        kvs_status s = kvs_cuda_backend_layer(p->gpu, l, pos, p->q, p->k, p->v, p->o, p->lse);
        if (s != KVS_OK) print_error("kvs_cuda_backend_layer: %s\n", kvs_last_error());
        assert_int_equal(s, KVS_OK);
        double e[4] = {kvs_rel_l2(rec.q, p->q, qd), kvs_rel_l2(rec.k, p->k, kvd), kvs_rel_l2(rec.v, p->v, kvd),
                       kvs_rel_l2(rec.o, p->o, qd)};
        static const char *const names[4] = {"q", "k", "v", "o"};
        for (int i = 0; i < 4; i++)
            if (!(e[i] <= tol)) {
                print_error("%s position %d layer %d: %s relative L2 error %.3g > %.3g\n", c->model_name, pos, l, names[i],
                            e[i], tol);
                fail();
            }
        for (int h = 0; h < c->n_heads; h++)
            if (!(fabs((double)p->lse[h] - rec.lse[h]) <= tol * (1 + fabs(rec.lse[h])))) {
                print_error("%s position %d layer %d head %d: lse %.7g vs CPU %.7g\n", c->model_name, pos, l, h, p->lse[h],
                            rec.lse[h]);
                fail();
            }
    }
}

/* Fails unless the CUDA logits are within relative L2 `tol` of the CPU's; `what` and pos name the step. */
static void expect_logits_close(const char *what, int pos, const float *cpu, const float *gpu, int vocab, double tol) {
    double le = kvs_rel_l2(cpu, gpu, (size_t)vocab);
    if (!(le <= tol)) {
        print_error("%s position %d: logits relative L2 error %.3g > %.3g\n", what, pos, le, tol);
        fail();
    }
}

static void test_parity_stories260K_greedy_decode(void **state) {
    (void)state;
    NEED_GPU();
    parity p;
    parity_open(&p, "../shared/models/stories260K.bin", 128);
    int V = p.info->config.vocab_size;
    const int expect[8] = {1, 403, 407, 261, 378, 432, 383, 286}; /* ../shared/models/README.md */
    int32_t tok = 1;
    for (int pos = 0; pos < 64; pos++) {
        const float *cl, *gl;
        if (pos < 8) assert_int_equal(tok, expect[pos]);
        assert_int_equal(kvs_model_forward(p.cpu, tok, pos, &cl), KVS_OK);
        assert_int_equal(kvs_cuda_backend_step(p.gpu, tok, pos, KVS_ROLE_GENERATED, 0, &gl), KVS_OK);
        parity_compare(&p, pos, 1e-4);
        expect_logits_close("stories260K decode", pos, cl, gl, V, 1e-4);
        int ct = argmax(cl, V), gt = argmax(gl, V);
        if (ct != gt) {
            print_error("position %d: CPU picks %d (logit %.7g), CUDA %d (logit %.7g)\n", pos, ct, cl[ct], gt, gl[gt]);
            fail();
        }
        tok = ct;
    }
    assert_int_equal(kvs_cuda_backend_finish(p.gpu), KVS_OK);
    parity_close(&p);
}

/* Batched prefill (several chunks, pos0 > 0 for later turns) against position-by-position CPU decoding. */
static void test_parity_prefill_matches_sequential(void **state) {
    (void)state;
    NEED_GPU();
    parity p;
    parity_open(&p, "../shared/models/stories260K.bin", 256);
    int V = p.info->config.vocab_size;
    int32_t toks[200];
    toks[0] = 1;
    for (int i = 1; i < 200; i++) toks[i] = (int32_t)((i * 7919) % (V - 3) + 3);
    /* turn 0: 40 prompt positions in one call; turn 1: 30 at pos0 40; turn 2: 130 at pos0 70 (3 chunks) */
    const int calls[3][2] = {{0, 40}, {40, 30}, {70, 130}};
    for (int c = 0; c < 3; c++) {
        int pos0 = calls[c][0], n = calls[c][1];
        const float *gl = NULL, *cl = NULL;
        assert_int_equal(kvs_cuda_backend_prefill(p.gpu, toks + pos0, n, pos0, KVS_ROLE_PROMPT, c, &gl), KVS_OK);
        /* the GPU keeps the records of its last chunk (up to 64 positions): compare those positions */
        int first_kept = pos0 + n - ((n - 1) % 64 + 1);
        for (int i = 0; i < n; i++) {
            assert_int_equal(kvs_model_forward(p.cpu, toks[pos0 + i], pos0 + i, &cl), KVS_OK);
            if (pos0 + i >= first_kept) parity_compare(&p, pos0 + i, 1e-4);
        }
        expect_logits_close("stories260K prefill, last", pos0 + n - 1, cl, gl, V, 1e-4);
    }
    /* and a decode step after the prefills */
    const float *gl, *cl;
    assert_int_equal(kvs_model_forward(p.cpu, 5, 200, &cl), KVS_OK);
    assert_int_equal(kvs_cuda_backend_step(p.gpu, 5, 200, KVS_ROLE_GENERATED, 2, &gl), KVS_OK);
    parity_compare(&p, 200, 1e-4);
    parity_close(&p);
}

/* The HF fixtures (fp16 Llama-3 with rope_scaling and shards; bf16 Qwen2 with q/k/v bias; fp32 Mistral with
 * head_dim 24 x 3 heads != hidden 32 and a group of 3): a batched prefill of 20 prompt positions (every
 * position's records and the last logits), then 20 decode steps teacher forced on the CPU's greedy tokens. */
static void check_hf_fixture(const char *rel, kvs_dtype expect_dt, double tol) {
    parity p;
    parity_open(&p, rel, 48);
    assert_int_equal(p.info->weight_dtype, expect_dt);
    int V = p.info->config.vocab_size;
    int32_t prompt[20];
    prompt[0] = p.info->bos_id >= 0 ? p.info->bos_id : 1;
    for (int i = 1; i < 20; i++) prompt[i] = (int32_t)((i * 37) % (V - 3) + 3);
    const float *cl = NULL, *gl = NULL;
    assert_int_equal(kvs_cuda_backend_prefill(p.gpu, prompt, 20, 0, KVS_ROLE_PROMPT, 0, &gl), KVS_OK);
    for (int pos = 0; pos < 20; pos++) {
        assert_int_equal(kvs_model_forward(p.cpu, prompt[pos], pos, &cl), KVS_OK);
        parity_compare(&p, pos, tol);
    }
    expect_logits_close(rel, 19, cl, gl, V, tol); /* the prefill's last position */
    int32_t tok = argmax(cl, V);
    for (int pos = 20; pos < 40; pos++) {
        assert_int_equal(kvs_model_forward(p.cpu, tok, pos, &cl), KVS_OK);
        assert_int_equal(kvs_cuda_backend_step(p.gpu, tok, pos, KVS_ROLE_GENERATED, 0, &gl), KVS_OK);
        parity_compare(&p, pos, tol);
        expect_logits_close(rel, pos, cl, gl, V, tol);
        tok = argmax(cl, V);
    }
    parity_close(&p);
}

static void test_parity_fp16_fixture(void **state) {
    (void)state;
    NEED_GPU();
    check_hf_fixture("tests/fixtures/llama3_tiny", KVS_DTYPE_F16, 2e-2);
}

static void test_parity_bf16_fixture(void **state) {
    (void)state;
    NEED_GPU();
    check_hf_fixture("tests/fixtures/qwen2_tiny", KVS_DTYPE_BF16, 1.5e-1);
}

static void test_parity_fp32_wide_heads_fixture(void **state) {
    (void)state;
    NEED_GPU();
    check_hf_fixture("tests/fixtures/mistral_tiny", KVS_DTYPE_F32, 1e-4);
}

static void test_step_rejects_bad_input(void **state) {
    (void)state;
    NEED_GPU();
    char path[4096];
    model_path(path, sizeof path, "../shared/models/stories260K.bin");
    need_file(path);
    kvs_model *m = NULL;
    kvs_cuda_backend *b = NULL;
    const float *lg;
    assert_int_equal(kvs_model_load(path, &m), KVS_OK);
    assert_int_equal(kvs_cuda_backend_create(m, 4, NULL, &b), KVS_OK);
    assert_int_equal(kvs_cuda_backend_step(b, 512, 0, KVS_ROLE_PROMPT, 0, &lg), KVS_ERR_RANGE);
    assert_non_null(strstr(kvs_last_error(), "token id 512"));
    assert_int_equal(kvs_cuda_backend_step(b, -1, 0, KVS_ROLE_PROMPT, 0, &lg), KVS_ERR_RANGE);
    assert_int_equal(kvs_cuda_backend_step(b, 1, 1, KVS_ROLE_PROMPT, 0, &lg), KVS_ERR_STATE);
    assert_non_null(strstr(kvs_last_error(), "expected 0"));
    int32_t t5[5] = {1, 2, 3, 4, 5};
    assert_int_equal(kvs_cuda_backend_prefill(b, t5, 5, 0, KVS_ROLE_PROMPT, 0, &lg), KVS_ERR_RANGE);
    assert_int_equal(kvs_cuda_backend_prefill(b, t5, 4, 0, KVS_ROLE_PROMPT, 0, &lg), KVS_OK);
    assert_non_null(lg);
    assert_int_equal(kvs_cuda_backend_step(b, 1, 4, KVS_ROLE_GENERATED, 0, &lg), KVS_ERR_RANGE);
    assert_int_equal(kvs_cuda_backend_layer(b, 5, 0, NULL, NULL, NULL, NULL, NULL), KVS_ERR_RANGE);
    assert_int_equal(kvs_cuda_backend_layer(b, 0, 4, NULL, NULL, NULL, NULL, NULL), KVS_ERR_RANGE);
    kvs_cuda_backend_free(b);
    kvs_model_free(m);
}

/* ================================================================================================
 * Recording pipeline: captured trace == CPU values, and `kvsim verify` passes
 * ============================================================================================== */

static int run_cmd(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int run_cmd(const char *fmt, ...) {
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Two traces of the same tokens (one per backend): identical tokens, roles and shape, and every q/k/v/o row
 * of every layer and head within relative L2 `tol`, every lse within tol * (1 + |lse|). Names the first
 * row that differs. */
static void compare_trace_files(const char *ref_path, const char *got_path, double tol) {
    kvs_trace *a = NULL, *b = NULL;
    assert_int_equal(kvs_trace_open(ref_path, &a), KVS_OK);
    assert_int_equal(kvs_trace_open(got_path, &b), KVS_OK);
    const kvs_trace_info *ia = kvs_trace_info_get(a), *ib = kvs_trace_info_get(b);
    assert_int_equal(ia->n_positions, ib->n_positions);
    assert_int_equal(ia->n_blocks, ib->n_blocks);
    assert_int_equal(ia->model.n_layers, ib->model.n_layers);
    assert_int_equal(ia->model.n_kv_heads, ib->model.n_kv_heads);
    assert_int_equal(ia->model.head_dim, ib->model.head_dim);
    for (int64_t i = 0; i < ia->n_positions; i++) {
        if (kvs_trace_tokens(a)[i] != kvs_trace_tokens(b)[i] || kvs_trace_roles(a)[i] != kvs_trace_roles(b)[i]) {
            print_error("position %lld: token %d role %d vs %d role %d\n", (long long)i, kvs_trace_tokens(a)[i],
                        kvs_trace_roles(a)[i], kvs_trace_tokens(b)[i], kvs_trace_roles(b)[i]);
            fail();
        }
    }
    kvs_trace_block *ba = NULL, *bb = NULL;
    assert_int_equal(kvs_trace_block_create(a, &ba), KVS_OK);
    assert_int_equal(kvs_trace_block_create(b, &bb), KVS_OK);
    for (int l = 0; l < ia->model.n_layers; l++)
        for (int kh = 0; kh < ia->model.n_kv_heads; kh++)
            for (int64_t bi = 0; bi < ia->n_blocks; bi++) {
                assert_int_equal(kvs_trace_read_block(a, l, kh, bi, ba), KVS_OK);
                assert_int_equal(kvs_trace_read_block(b, l, kh, bi, bb), KVS_OK);
                assert_int_equal(ba->n_pos, bb->n_pos);
                int G = ba->group;
                size_t hd = (size_t)ba->head_dim;
                for (int i = 0; i < ba->n_pos; i++) {
                    long long pos = (long long)(ba->first_pos + i);
                    const struct {
                        const char *name;
                        const float *x, *y;
                        int head;
                    } rows[2] = {{"k", ba->k + i * hd, bb->k + i * hd, -1}, {"v", ba->v + i * hd, bb->v + i * hd, -1}};
                    for (int r = 0; r < 2; r++)
                        if (!(kvs_rel_l2(rows[r].x, rows[r].y, hd) <= tol)) {
                            print_error("layer %d kv head %d position %lld: %s relative L2 error %.3g > %.3g\n", l, kh,
                                        pos, rows[r].name, kvs_rel_l2(rows[r].x, rows[r].y, hd), tol);
                            fail();
                        }
                    for (int g = 0; g < G; g++) {
                        size_t off = ((size_t)i * G + g) * hd;
                        double eq = kvs_rel_l2(ba->q + off, bb->q + off, hd), eo = kvs_rel_l2(ba->o + off, bb->o + off, hd);
                        float la = ba->lse[i * G + g], lb = bb->lse[i * G + g];
                        if (!(eq <= tol) || !(eo <= tol) || !(fabs((double)la - lb) <= tol * (1 + fabs((double)la)))) {
                            print_error("layer %d head %d position %lld: q error %.3g, o error %.3g, lse %.7g vs %.7g "
                                        "(tolerance %.3g)\n", l, kh * G + g, pos, eq, eo, la, lb, tol);
                            fail();
                        }
                    }
                }
            }
    kvs_trace_block_free(ba);
    kvs_trace_block_free(bb);
    kvs_trace_close(a);
    kvs_trace_close(b);
}

static void test_cuda_trace_matches_cpu_and_verifies(void **state) {
    (void)state;
    NEED_GPU();
    const char *bin = need_kvsim_bin();
    char path[4096], dir[] = "/tmp/kvsim_cuda_XXXXXX", trace_path[4200];
    model_path(path, sizeof path, "../shared/models/stories260K.bin");
    need_file(path);
    assert_non_null(mkdtemp(dir));
    snprintf(trace_path, sizeof trace_path, "%s/cuda.kvt", dir);
    setenv("KVSIM_CUDA_RING_POSITIONS", "128", 1); /* 300 positions wrap the ring twice and fill it */

    kvs_model *m = NULL;
    assert_int_equal(kvs_model_load(path, &m), KVS_OK);
    const kvs_model_info *info = kvs_model_info_get(m);
    kvs_capture_config cc;
    memset(&cc, 0, sizeof cc);
    cc.dtype = KVS_DTYPE_F32;
    cc.block_positions = 64;
    cc.max_new_tokens = 200;
    cc.flags = KVS_TRACE_FLAG_SHUFFLE;
    snprintf(cc.settings, sizeof cc.settings, "backend=cuda test=test_cuda");
    kvs_trace_writer *w = NULL;
    assert_int_equal(kvs_trace_writer_create(trace_path, &info->config, &cc, &w), KVS_OK);
    kvs_cuda_backend *b = NULL;
    assert_int_equal(kvs_cuda_backend_create(m, 300, w, &b), KVS_OK);
    unsetenv("KVSIM_CUDA_RING_POSITIONS");

    int32_t toks[300];
    toks[0] = 1;
    for (int i = 1; i < 100; i++) toks[i] = (int32_t)((i * 131) % 500 + 3);
    const float *lg;
    assert_int_equal(kvs_cuda_backend_prefill(b, toks, 100, 0, KVS_ROLE_PROMPT, 0, &lg), KVS_OK);
    for (int pos = 100; pos < 300; pos++) {
        toks[pos] = argmax(lg, info->config.vocab_size);
        assert_int_equal(kvs_cuda_backend_step(b, toks[pos], pos, KVS_ROLE_GENERATED, 0, &lg), KVS_OK);
    }
    assert_int_equal(kvs_cuda_backend_finish(b), KVS_OK);
    assert_int_equal(kvs_trace_writer_close(w), KVS_OK);
    kvs_cuda_backend_free(b);
    kvs_trace_writer_free(w);

    /* the trace holds the CPU's values for the same tokens: a CPU trace of them, teacher forced, compared
     * row by row (q, k, v, o, lse of every layer and head) */
    char cpu_path[4300];
    snprintf(cpu_path, sizeof cpu_path, "%s/cpu.kvt", dir);
    kvs_model_state *cpu = NULL;
    assert_int_equal(kvs_model_state_create(m, 300, NULL, &cpu), KVS_OK);
    assert_int_equal(kvs_trace_writer_create(cpu_path, &info->config, &cc, &w), KVS_OK);
    for (int pos = 0; pos < 300; pos++) {
        const float *cl;
        assert_int_equal(kvs_trace_writer_begin_position(w, toks[pos], pos < 100 ? KVS_ROLE_PROMPT : KVS_ROLE_GENERATED, 0),
                         KVS_OK);
        assert_int_equal(kvs_model_forward(cpu, toks[pos], pos, &cl), KVS_OK);
        for (int l = 0; l < info->config.n_layers; l++) {
            kvs_layer_record rec;
            assert_int_equal(kvs_model_state_layer(cpu, l, &rec), KVS_OK);
            assert_int_equal(kvs_trace_writer_put_layer(w, l, rec.q, rec.k, rec.v, rec.o, rec.lse), KVS_OK);
        }
        assert_int_equal(kvs_trace_writer_end_position(w), KVS_OK);
    }
    assert_int_equal(kvs_trace_writer_close(w), KVS_OK);
    kvs_trace_writer_free(w);
    kvs_model_state_free(cpu);
    kvs_model_free(m);
    compare_trace_files(cpu_path, trace_path, 1e-4);
    kvs_trace *t = NULL;
    assert_int_equal(kvs_trace_open(trace_path, &t), KVS_OK);
    assert_int_equal(kvs_trace_info_get(t)->prompt_len, 100);
    kvs_trace_close(t);
    assert_int_equal(run_cmd("'%s' verify '%s' > '%s/verify.txt' 2>&1", bin, trace_path, dir), 0);
    assert_int_equal(run_cmd("rm -rf '%s'", dir), 0);
}

/* `kvsim capture --device cuda`: without a device a clean "no CUDA device" failure (exit 1), with one a
 * trace that verifies. */
static void test_cli_capture_device_cuda(void **state) {
    (void)state;
    const char *bin = need_kvsim_bin();
    char path[4096], dir[] = "/tmp/kvsim_cuda_XXXXXX", out[4200];
    model_path(path, sizeof path, "../shared/models/stories260K.bin");
    need_file(path);
    assert_non_null(mkdtemp(dir));
    snprintf(out, sizeof out, "%s/err.txt", dir);
    int rc = run_cmd("'%s' capture --model '%s' --device cuda --steps 20 --out '%s/t.kvt' > '%s/out.txt' 2> '%s'", bin,
                     path, dir, dir, out);
    char *err = NULL;
    size_t len;
    assert_int_equal(kvs_read_file(out, &err, &len), KVS_OK);
    if (kvs_cuda_probe(NULL, 0) != KVS_OK) {
        assert_int_equal(rc, 1);
        assert_non_null(strstr(err, "no CUDA device"));
        char t[4300];
        snprintf(t, sizeof t, "%s/t.kvt", dir);
        assert_false(kvs_test_exists(t)); /* nothing left behind */
    } else {
        if (rc != 0) print_error("capture --device cuda failed: %s\n", err);
        assert_int_equal(rc, 0);
        assert_int_equal(run_cmd("'%s' verify '%s/t.kvt' > /dev/null 2>&1", bin, dir), 0);
        /* the parity check, through the CLI: CPU and CUDA fp16 traces of greedy decoding from BOS have
         * identical tokens, and rows within two fp16 steps (2^-10 relative each) plus fp32 noise */
        assert_int_equal(run_cmd("'%s' capture --model '%s' --device cpu --steps 20 --out '%s/c.kvt' > /dev/null 2>&1",
                                 bin, path, dir),
                         0);
        char cpu_trace[4300], cuda_trace[4300];
        snprintf(cpu_trace, sizeof cpu_trace, "%s/c.kvt", dir);
        snprintf(cuda_trace, sizeof cuda_trace, "%s/t.kvt", dir);
        compare_trace_files(cpu_trace, cuda_trace, 2.5e-3);
    }
    free(err);
    assert_int_equal(run_cmd("rm -rf '%s'", dir), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_probe_reports_device_or_no_device),
        cmocka_unit_test(test_create_without_device_fails_cleanly),
        cmocka_unit_test(test_create_rejects_bad_max_positions),
        cmocka_unit_test(test_create_refuses_qwen3_and_gemma3),
        cmocka_unit_test(test_cli_capture_device_cuda),
        cmocka_unit_test(test_embed_kernel_matches_cpu),
        cmocka_unit_test(test_rmsnorm_kernel_matches_cpu),
        cmocka_unit_test(test_qkv_rope_kernel_matches_cpu),
        cmocka_unit_test(test_decode_attention_kernel_matches_cpu),
        cmocka_unit_test(test_prefill_attention_kernel_matches_cpu),
        cmocka_unit_test(test_swiglu_kernel_matches_cpu),
        cmocka_unit_test(test_residual_kernel_matches_cpu),
        cmocka_unit_test(test_gemm_matches_cpu),
        cmocka_unit_test(test_parity_stories260K_greedy_decode),
        cmocka_unit_test(test_parity_prefill_matches_sequential),
        cmocka_unit_test(test_parity_fp16_fixture),
        cmocka_unit_test(test_parity_bf16_fixture),
        cmocka_unit_test(test_parity_fp32_wide_heads_fixture),
        cmocka_unit_test(test_step_rejects_bad_input),
        cmocka_unit_test(test_cuda_trace_matches_cpu_and_verifies),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
