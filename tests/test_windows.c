/* test_windows.c — per-layer attention windows (sliding-window layers, Gemma-3's local layers) through the trace
 * header and its readers (trace/FORMAT.md "Layer windows"):
 * - the header's window table round-trips through the writer and the reader; a trace without windows is byte for
 *   byte what it was (no flag bit, no table), and reads as all full;
 * - corrupt windows (negative, an n_layers that would size the table past the limit) are refused, never crash;
 * - a capture of the tiny Gemma-3 fixture (tests/fixtures/gemma3_tiny, windows 6,0,6,6): `kvsim info` prints the
 *   windows, `kvsim verify` recomputes each sliding layer over its window and passes, the kv_stream's full attention
 *   and the lean reader's recomputation equal a naive windowed attention written here from the stored q/k/v
 *   (probability 0 outside the window); the replay accepts it for every registered policy (--measure all too); a
 *   policy without window_evict is refused by name (a test-only table: every registered policy has the hook);
 * - capacity plans (analysis/plan.h) of hybrid shapes: windows from a config's layer_types / Gemma-3 pattern, from a
 *   trace header and from `--window`, each layer's cache capped at its window, against numbers computed by hand.
 * - the replay of sliding-window layers (sim/replay.h "Sliding-window layers"): a 3-layer trace with a window of 4
 *   on its middle layer against attention computed here by hand (window B = 2: the last two positions; B >= 4 and the
 *   full cache: error 0; bytes at most the window); a Gemma-3 capture and two generated two-turn traces (60
 *   positions, window 5; 200 positions, window 40, with variants sized so that chunks, partitions, merged slots,
 *   profiles and lazy layers meet the window's edge) through both engines: every registered policy with
 *   window_evict replayed, bit for bit, zero error wherever what the policy keeps covers the window, storage at most
 *   the window; a table without window_evict refused by both; the selection check failing a policy deaf to the
 *   evictions.
 * Data is GENERATED (tests/util/gen_trace.h) except the gemma3_tiny captures.
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

#include "analysis/plan.h"
#include "common/kvs.h"
#include "policies/registry.h"
#include "sim/replay.h"
#include "sim/replay_mem.h"
#include "tests/util/cli_run.h"
#include "tests/util/gen_trace.h"
#include "tests/util/replay_fixture.h"
#include "tests/util/testenv.h"
#include "trace/kv_stream.h"
#include "trace/trace.h"
#include "trace/verify.h"

/* Writes the generated trace `g` to `path` with the given per-layer windows. */
static void write_with_windows(kvs_gen_trace *g, const char *path, const int32_t *win) {
    kvs_model_config m;
    kvs_capture_config cp;
    kvs_gen_trace_configs(g, &m, &cp);
    for (int l = 0; l < m.n_layers; l++) m.layer_window[l] = win ? win[l] : 0;
    kvs_trace_writer *w = NULL;
    assert_int_equal(kvs_trace_writer_create(path, &m, &cp, &w), KVS_OK);
    assert_int_equal(kvs_gen_trace_put(g, w, 0, g->opt.n_positions), KVS_OK);
    assert_int_equal(kvs_trace_writer_close(w), KVS_OK);
    kvs_trace_writer_free(w);
}

static kvs_gen_trace *make_gen(int n_layers) {
    kvs_gen_trace_opts o = kvs_gen_trace_defaults();
    o.n_layers = n_layers;
    kvs_gen_trace *g = NULL;
    assert_int_equal(kvs_gen_trace_create(&o, &g), KVS_OK);
    return g;
}

/* Rewrites the header CRC of the file image `b` after an edit (header_size at offset 12). */
static void fix_header_crc(uint8_t *b) {
    uint32_t hs = kvs_get_u32(b + 12);
    kvs_put_u32(b + hs - 4, kvs_crc32(0, b, hs - 4));
}

static void test_header_round_trip_and_old_layout(void **state) {
    kvs_test_tmp *c = *state;
    kvs_gen_trace *g = make_gen(3);
    char plain[160], windowed[160];
    kvs_test_tmp_path(c, "plain.kvt", plain, sizeof plain);
    kvs_test_tmp_path(c, "win.kvt", windowed, sizeof windowed);
    write_with_windows(g, plain, NULL);
    static const int32_t win[3] = {5, 0, 17};
    write_with_windows(g, windowed, win);
    size_t n0 = 0, n1 = 0;
    uint8_t *b0 = kvs_test_slurp(plain, &n0), *b1 = kvs_test_slurp(windowed, &n1);
    assert_non_null(b0);
    assert_non_null(b1);
    uint32_t slen = kvs_get_u32(b0 + 144);
    /* no window: the version-1 layout of before (flags bits 0-1 only, header 152 + settings) */
    assert_int_equal(kvs_get_u32(b0 + 12), 152 + slen);
    assert_int_equal(kvs_get_u32(b0 + 76) & KVS_TRACE_FLAG_WINDOWS, 0);
    /* windows: flag bit 2 and the table of n_layers i32 after the settings */
    assert_int_equal(kvs_get_u32(b1 + 12), 152 + slen + 4 * 3);
    assert_int_equal(kvs_get_u32(b1 + 76) & KVS_TRACE_FLAG_WINDOWS, KVS_TRACE_FLAG_WINDOWS);
    for (int l = 0; l < 3; l++) assert_int_equal(kvs_get_u32(b1 + 148 + slen + 4 * l), (uint32_t)win[l]);
    assert_int_equal(n1, n0 + 12);

    kvs_trace *t = NULL;
    assert_int_equal(kvs_trace_open(plain, &t), KVS_OK);
    const kvs_trace_info *in = kvs_trace_info_get(t);
    assert_int_equal(kvs_model_config_has_windows(&in->model), 0);
    for (int l = 0; l < 3; l++) assert_int_equal(kvs_model_config_window(&in->model, l), 0);
    kvs_trace_close(t);
    assert_int_equal(kvs_trace_open(windowed, &t), KVS_OK);
    in = kvs_trace_info_get(t);
    for (int l = 0; l < 3; l++) assert_int_equal(kvs_model_config_window(&in->model, l), win[l]);
    assert_int_equal(in->capture.flags & KVS_TRACE_FLAG_WINDOWS, 0); /* a layout bit, not a capture setting */
    assert_int_equal(in->capture.flags, kvs_get_u32(b0 + 76));
    kvs_trace_close(t);

    /* a negative window given to the writer is refused naming the field */
    kvs_model_config m;
    kvs_capture_config cp;
    kvs_gen_trace_configs(g, &m, &cp);
    m.layer_window[1] = -3;
    kvs_trace_writer *w = NULL;
    assert_int_equal(kvs_trace_writer_create(windowed, &m, &cp, &w), KVS_ERR_INVALID_ARG);
    assert_non_null(strstr(kvs_last_error(), "layer_window[1]"));
    free(b0);
    free(b1);
    kvs_gen_trace_free(g);
}

static void test_corrupt_windows_refused(void **state) {
    kvs_test_tmp *c = *state;
    kvs_gen_trace *g = make_gen(2);
    char path[160], bad[160];
    kvs_test_tmp_path(c, "win.kvt", path, sizeof path);
    kvs_test_tmp_path(c, "bad.kvt", bad, sizeof bad);
    static const int32_t win[2] = {4, 0};
    write_with_windows(g, path, win);
    size_t n = 0;
    uint8_t *b = kvs_test_slurp(path, &n);
    uint32_t slen = kvs_get_u32(b + 144);
    kvs_trace *t = NULL;
    /* a window above INT32_MAX (negative as i32), with a valid CRC */
    uint8_t *x = malloc(n);
    memcpy(x, b, n);
    kvs_put_u32(x + 148 + slen, 0x80000000u);
    fix_header_crc(x);
    assert_int_equal(kvs_test_spit(bad, x, n), 0);
    assert_int_equal(kvs_trace_open(bad, &t), KVS_ERR_FORMAT);
    assert_non_null(strstr(kvs_last_error(), "layer_window[0]"));
    /* n_layers too large to size the table from: refused before anything is read with it */
    memcpy(x, b, n);
    kvs_put_u32(x + 16, 5000);
    fix_header_crc(x);
    assert_int_equal(kvs_test_spit(bad, x, n), 0);
    assert_int_equal(kvs_trace_open(bad, &t), KVS_ERR_FORMAT);
    assert_non_null(strstr(kvs_last_error(), "n_layers"));
    /* the flag cleared on a file that has the table: header_size no longer matches */
    memcpy(x, b, n);
    kvs_put_u32(x + 76, kvs_get_u32(x + 76) & ~KVS_TRACE_FLAG_WINDOWS);
    fix_header_crc(x);
    assert_int_equal(kvs_test_spit(bad, x, n), 0);
    assert_int_equal(kvs_trace_open(bad, &t), KVS_ERR_FORMAT);
    assert_non_null(strstr(kvs_last_error(), "header_size"));
    /* every single flipped byte of the header: refused (CRC), never a crash */
    for (uint32_t i = 0; i < kvs_get_u32(b + 12); i++) {
        memcpy(x, b, n);
        x[i] ^= 0x5a;
        assert_int_equal(kvs_test_spit(bad, x, n), 0);
        kvs_status s = kvs_trace_open(bad, &t);
        assert_int_not_equal(s, KVS_OK);
    }
    free(x);
    free(b);
    kvs_gen_trace_free(g);
}

/* ---- the Gemma-3 fixture captured by the CLI ---- */

static const int32_t gemma_windows[4] = {6, 0, 6, 6};

static int capture_gemma(kvs_test_cli_fx *f, const char *out, const char *record) {
    char fixture[4096];
    snprintf(fixture, sizeof fixture, "%s/tests/fixtures/gemma3_tiny", kvs_test_root());
    const char *args[] = {"capture", "--model", fixture, "--prompt-ids", "17,42,5,9,11,30,31,32", "--steps", "24",
                          "--ignore-eos", "--record", record, "--out", out, NULL};
    return kvs_test_cli_run(f, args);
}

/* Naive windowed attention in double of query q over keys/values rows [first, n) of k, v. */
static double naive_attention(const float *q, const float *k, const float *v, size_t first, size_t n, size_t d,
                              double scale, double *o) {
    double m = -INFINITY, z = 0;
    for (size_t j = first; j < n; j++) {
        double s = 0;
        for (size_t e = 0; e < d; e++) s += (double)q[e] * k[j * d + e];
        m = fmax(m, s * scale);
    }
    for (size_t e = 0; e < d; e++) o[e] = 0;
    for (size_t j = first; j < n; j++) {
        double s = 0;
        for (size_t e = 0; e < d; e++) s += (double)q[e] * k[j * d + e];
        double p = exp(s * scale - m);
        z += p;
        for (size_t e = 0; e < d; e++) o[e] += p * v[j * d + e];
    }
    for (size_t e = 0; e < d; e++) o[e] /= z;
    return m + log(z);
}

/* Every position of every stream of `path`: the stored (or lean-recomputed) o/lse, read by a plain stream, and the
 * full attention of a kv_stream computing it (which on a lean trace replaces the reader's own) equal the naive window
 * attention; probabilities outside the window are 0. */
static void check_windowed_outputs(const char *path, double tol) {
    kvs_trace *t = NULL;
    assert_int_equal(kvs_trace_open(path, &t), KVS_OK);
    const kvs_trace_info *in = kvs_trace_info_get(t);
    for (int l = 0; l < 4; l++) assert_int_equal(kvs_model_config_window(&in->model, l), gemma_windows[l]);
    size_t d = (size_t)in->model.head_dim;
    int cut = 0; /* rows where the window actually cut something */
    for (int l = 0; l < in->model.n_layers; l++)
        for (int h = 0; h < in->model.n_kv_heads; h++) {
            kvs_kv_stream *s = NULL, *s0 = NULL;
            assert_int_equal(kvs_kv_stream_open(t, l, h, KVS_KV_STREAM_SCORES, &s), KVS_OK);
            assert_int_equal(kvs_kv_stream_open(t, l, h, 0, &s0), KVS_OK);
            kvs_kv_pos x, x0;
            while (kvs_kv_stream_next(s, &x) == KVS_OK) {
                assert_int_equal(kvs_kv_stream_next(s0, &x0), KVS_OK);
                x.o = x0.o; /* the reader's: stored, or recomputed by the lean reader */
                x.lse = x0.lse;
                size_t n = (size_t)x.n_ctx, w = (size_t)gemma_windows[l];
                size_t first = w > 0 && n > w ? n - w : 0;
                cut += first > 0;
                for (int g = 0; g < x.group; g++) {
                    double o[64];
                    double lse = naive_attention(x.q + (size_t)g * d, x.k, x.v, first, n, d, x.scale, o);
                    double err = 0, nrm = 0, err2 = 0;
                    for (size_t e = 0; e < d; e++) {
                        err += (o[e] - x.o[(size_t)g * d + e]) * (o[e] - x.o[(size_t)g * d + e]);
                        err2 += (o[e] - x.out[(size_t)g * d + e]) * (o[e] - x.out[(size_t)g * d + e]);
                        nrm += o[e] * o[e];
                    }
                    if (!(sqrt(err / nrm) < tol) || !(fabs(lse - x.lse[g]) < tol) || !(sqrt(err2 / nrm) < 1e-5) ||
                        !(fabs(lse - x.attn_lse[g]) < 1e-5)) {
                        fprintf(stderr, "layer %d kv %d pos %lld head %d: stored rel %.3g lse %.3g, stream rel %.3g "
                                "lse %.3g\n", l, h, (long long)x.pos, g, sqrt(err / nrm), fabs(lse - x.lse[g]),
                                sqrt(err2 / nrm), fabs(lse - x.attn_lse[g]));
                        fail();
                    }
                    for (size_t j = 0; j < first; j++) {
                        assert_true(x.probs[(size_t)g * n + j] == 0);
                        assert_true(isinf(x.scores[(size_t)g * n + j]) && x.scores[(size_t)g * n + j] < 0);
                    }
                }
            }
            kvs_kv_stream_free(s);
            kvs_kv_stream_free(s0);
        }
    assert_true(cut > 0);
    kvs_trace_close(t);
}

static void test_gemma3_capture_info_verify_readers(void **state) {
    kvs_test_cli_fx *f = *state;
    if (!kvs_test_kvsim_bin()) skip();
    char full[256], lean[256];
    snprintf(full, sizeof full, "%s/g.kvt", f->dir);
    snprintf(lean, sizeof lean, "%s/gl.kvt", f->dir);
    assert_int_equal(capture_gemma(f, full, "full"), 0);
    assert_int_equal(capture_gemma(f, lean, "qkv"), 0);
    const char *info[] = {"info", full, NULL};
    assert_int_equal(kvs_test_cli_run(f, info), 0);
    assert_true(kvs_test_file_has(f->out, "layer windows 6,0,6,6 (positions attended"));
    const char *verify[] = {"verify", full, NULL};
    assert_int_equal(kvs_test_cli_run(f, verify), 0);
    assert_true(kvs_test_file_has(f->out, "verify: OK"));
    /* fp16 storage: the stored o/lse against fp64 over the stored q/k/v; the lean reader's fp32 recomputation */
    check_windowed_outputs(full, 5e-3);
    check_windowed_outputs(lean, 1e-5);
    /* the replay holds the sliding layers to their windows (test_replay_gemma3_engines) */
    char db[256];
    snprintf(db, sizeof db, "%s/r.db", f->dir);
    const char *replay[] = {"replay", full, "--db", db, "--policy", "window", "--budgets", "8", NULL};
    assert_int_equal(kvs_test_cli_run(f, replay), 0);
    /* every registered policy has window_evict: the refusal of one without is the library's, tested with a test-only
     * table in test_replay_gemma3_engines */
    const char *replay_all[] = {"replay", full, "--db", db, "--policy", "window", "--budgets", "8", "--measure", "all",
                                NULL};
    assert_int_equal(kvs_test_cli_run(f, replay_all), 0); /* prompt positions too (tests/test_windows_measure.c) */
    /* plan from the trace header and from the fixture's config.json: 4 layers, 2 KV heads, head_dim 16 (64 bytes per
     * token per (layer, KV head) in fp16); at 10 positions: 1 full layer x 10 + 3 windowed x 6 = 28 tokens x 2 x 64
     * = 3584 bytes; --window 0: 4 x 10 x 128 = 5120 */
    char fixture[4096];
    snprintf(fixture, sizeof fixture, "%s/tests/fixtures/gemma3_tiny", kvs_test_root());
    const char *plan_t[] = {"plan", "--trace", full, "--context", "10", "--csv", NULL};
    assert_int_equal(kvs_test_cli_run(f, plan_t), 0);
    assert_true(kvs_test_file_has(f->out, "full,full,full cache,,10,0,1,3584,"));
    const char *plan_c[] = {"plan", "--config", fixture, "--context", "10", NULL};
    assert_int_equal(kvs_test_cli_run(f, plan_c), 0);
    assert_true(kvs_test_file_has(f->out, "windows     3 of 4 layers attend to the last 6 positions"));
    const char *plan_c0[] = {"plan", "--config", fixture, "--context", "10", "--window", "0", "--csv", NULL};
    assert_int_equal(kvs_test_cli_run(f, plan_c0), 0);
    assert_true(kvs_test_file_has(f->out, "full,full,full cache,,10,0,1,5120,"));
    const char *plan_bad[] = {"plan", "--config", fixture, "--window", "6/0", NULL};
    assert_int_equal(kvs_test_cli_run(f, plan_bad), 2);
    assert_true(kvs_test_file_has(f->err, "--window: '6/0' is not W"));
}

/* A window row's bound uses the window's keys: the row (first = 5, 7 keys) over a scratch holding keys 0..11 is judged
 * exactly as the same row over a scratch holding only keys 5..11 (first = 0). */
static void test_verify_window_row_bound(void **state) {
    (void)state;
    enum { N = 12, D = 8, F = 5 };
    float k[N * D], v[N * D], q[D], scores[N], probs[N], out[D], o[D];
    uint64_t x = 88172645463325252ull;
    for (int i = 0; i < N * D; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        k[i] = (float)((double)(x >> 11) / 9007199254740992.0 * 4 - 2) * (i < F * D ? 8.0f : 1.0f); /* big old keys */
        v[i] = (float)((double)(x >> 20) / 8796093022208.0 * 2 - 1) * (i < F * D ? 8.0f : 1.0f);
    }
    for (int i = 0; i < D; i++) q[i] = k[(N - 1) * D + i];
    kvs_verify_cfg cfg;
    assert_int_equal(kvs_verify_cfg_init(KVS_DTYPE_F16, -1, -1, &cfg), KVS_OK);
    kvs_verify_ctx *all = NULL, *win = NULL;
    assert_int_equal(kvs_verify_ctx_create(&cfg, N, D, &all), KVS_OK);
    assert_int_equal(kvs_verify_ctx_create(&cfg, N, D, &win), KVS_OK);
    for (int j = 0; j < N; j++) assert_int_equal(kvs_verify_ctx_add_key(all, (size_t)j, k + j * D, v + j * D), KVS_OK);
    for (int j = F; j < N; j++)
        assert_int_equal(kvs_verify_ctx_add_key(win, (size_t)(j - F), k + j * D, v + j * D), KVS_OK);
    double lse = kvs_verify_attention(q, k + F * D, v + F * D, N - F, D, 0.35f, scores, probs, out);
    for (int i = 0; i < D; i++) o[i] = out[i] * 1.001f; /* a stored output a little off */
    kvs_verify_row row = {.n = N - F, .d = D, .first = F, .scale = 0.35f, .q = q, .v = v + F * D, .o = o,
                          .lse = (float)lse + 1e-4f, .scores = scores, .probs = probs, .out = out, .attn_lse = lse};
    kvs_verify_row_result ra, rw;
    assert_int_equal(kvs_verify_row_check(all, &row, &ra), KVS_OK);
    row.first = 0;
    assert_int_equal(kvs_verify_row_check(win, &row, &rw), KVS_OK);
    assert_true(ra.bound_o == rw.bound_o && ra.bound_lse == rw.bound_lse && ra.pass == rw.pass);
    assert_true(rw.bound_o > 0 && rw.bound_lse > 0);
    /* keys beyond what was added are refused, naming the range */
    row.first = 8;
    assert_int_equal(kvs_verify_row_check(all, &row, &ra), KVS_ERR_RANGE);
    assert_non_null(strstr(kvs_last_error(), "keys 8..14, 12 added"));
    kvs_verify_ctx_free(all);
    kvs_verify_ctx_free(win);
}

/* ---- capacity plans of hybrid shapes ---- */

static void test_plan_windows_by_hand(void **state) {
    kvs_test_tmp *c = *state;
    char cfg[160];
    kvs_test_tmp_path(c, "config.json", cfg, sizeof cfg);
    /* 6 layers, 2 of them full (layer_types), window 4; 2 KV heads of head_dim 4: 2 x 4 x 2 = 16 bytes per token per
     * (layer, KV head) in fp16 */
    assert_int_equal(kvs_test_spit_text(cfg, "{\"model_type\":\"gemma3_text\",\"num_hidden_layers\":6,"
        "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":4,\"hidden_size\":16,"
        "\"intermediate_size\":32,\"vocab_size\":10,\"max_position_embeddings\":64,\"sliding_window\":4,"
        "\"layer_types\":[\"sliding_attention\",\"sliding_attention\",\"full_attention\",\"sliding_attention\","
        "\"sliding_attention\",\"full_attention\"]}"), 0);
    kvs_plan_model m;
    assert_int_equal(kvs_plan_model_from_config(cfg, &m), KVS_OK);
    assert_int_equal(m.window, 4);
    assert_int_equal(m.window_layers, 4);
    kvs_plan_setup s = {.model = m, .kv_elem_bytes = 2, .weight_elem_bytes = 2, .n_gpus = 1};
    /* prompt 10, 2 generated (n = 12; the peak is at the end): per KV head and token 16 bytes, x 2 KV heads
     *   full:              2 full layers x 12 + 4 windowed x min(12, 4) = 24 + 16 = 40 tokens  -> 40 x 32 = 1280
     *   constant B = 8:    2 x min(12, 8) + 4 x min(8, 4)             = 16 + 16 = 32 tokens  -> 1024
     *   prompt-only B = 3: 2 x (min(10, 3) + 2) + 4 x min(5, 4)       = 10 + 16 = 26 tokens  -> 832 */
    const struct {
        kvs_plan_kind kind;
        int64_t budget;
        double bytes;
    } want[3] = {{KVS_PLAN_FULL, 0, 1280}, {KVS_PLAN_CONSTANT, 8, 1024}, {KVS_PLAN_PROMPT_ONLY, 3, 832}};
    for (int i = 0; i < 3; i++) {
        kvs_plan_policy pol = {.kind = want[i].kind, .budget = want[i].budget};
        kvs_plan_point p;
        assert_int_equal(kvs_plan_eval(&s, &pol, 10, 2, 1, &p), KVS_OK);
        if (p.seq_device_bytes != want[i].bytes) {
            fprintf(stderr, "kind %d: %g bytes, by hand %g\n", (int)want[i].kind, p.seq_device_bytes, want[i].bytes);
            fail();
        }
    }
    /* max context with a pool of 1000 bytes at batch 1, no response: 2 x 2 x 16 x C + 4 x 2 x 16 x min(C, 4)
     * <= 1000 -> 64 C + 512 <= 1000 -> C = 7 (without windows 6 x 32 x C <= 1000: C = 5) */
    s.gpu_bytes = 1000 + kvs_plan_weight_bytes(&s);
    kvs_plan_policy full = {.kind = KVS_PLAN_FULL};
    kvs_plan_point p;
    assert_int_equal(kvs_plan_eval(&s, &full, 4, 0, 1, &p), KVS_OK);
    assert_int_equal(p.max_context_memory, 7);
    /* --window: W/K on 6 layers (every 3rd full: 4 windowed), W alone (all), 0 (none); bad forms refused */
    assert_int_equal(kvs_plan_window_parse("4/3", &m), KVS_OK);
    assert_true(m.window == 4 && m.window_layers == 4);
    assert_int_equal(kvs_plan_window_parse("1024/6", &m), KVS_OK);
    assert_true(m.window == 1024 && m.window_layers == 5);
    assert_int_equal(kvs_plan_window_parse("7", &m), KVS_OK);
    assert_true(m.window == 7 && m.window_layers == 6);
    assert_int_equal(kvs_plan_window_parse("0", &m), KVS_OK);
    assert_true(m.window == 0 && m.window_layers == 0);
    static const char *const bad[] = {"", "x", "-1", "4/", "4/0", "4/x", "4/3/2", "99999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(kvs_plan_window_parse(bad[i], &m), KVS_ERR_INVALID_ARG);
        assert_non_null(strstr(kvs_last_error(), "--window"));
    }
    /* a trace header's windows */
    kvs_model_config mc;
    memset(&mc, 0, sizeof mc);
    mc.n_layers = 4;
    mc.n_heads = mc.n_kv_heads = 1;
    mc.head_dim = 8;
    memcpy(mc.layer_window, gemma_windows, sizeof gemma_windows);
    kvs_plan_model_from_trace(&mc, NULL, "t", &m);
    assert_true(m.window == 6 && m.window_layers == 3);
}

/* ---- the replay of a sliding-window layer (sim/replay.h "Sliding-window layers") ---- */


/* A generated 3-layer trace whose middle layer attends to a window of 4, replayed by hand: at every decode position
 * p and query head, window B = 2 attends p-1, p, and its output error and recall are those of attention over p-1..p
 * against attention over the window p-3..p (computed here in double from the generated q/k/v); window B = 4 and
 * B = 6 and the full cache attend exactly the window (error 0, recall 1, min(W, p+1) positions resident and read);
 * the full layers around it keep every position. Both engines give these numbers. */
static void test_replay_window_by_hand(void **state) {
    (void)state;
    enum { W = 4, WL = 1 };
    kvs_test_replay_fixture f;
    kvs_gen_trace_opts go = kvs_test_grouped_opts(1, 2, 24, 10, 8, 5);
    go.n_layers = 3;
    assert_int_equal(kvs_test_replay_fixture_make(&go, 2, 7, &f), KVS_OK);
    kvs_replay_source src;
    assert_int_equal(kvs_replay_source_from_memory(&f.mem, &src), KVS_OK);
    const int32_t windows[3] = {0, W, 0};
    src.layer_window = windows;
    static const char *const specs[] = {"window", "window", "window", "full"};
    const int64_t budgets[] = {2, W, 6, 3};
    kvs_replay_config cfg[4];
    for (int c = 0; c < 4; c++) {
        cfg[c] = (kvs_replay_config){.budget = budgets[c], .budget_fraction = -1};
        assert_int_equal(kvs_policy_parse(specs[c], &cfg[c].policy), KVS_OK);
    }
    kvs_replay_opts o = {.configs = cfg, .n_configs = 4, .threads = 2, .measure = KVS_MEASURE_DECODE, .series_every = 1};
    size_t d = (size_t)f.d, row = (size_t)f.H * d, krow = (size_t)f.Hkv * d, N = (size_t)f.N;
    double pos_bytes = 2.0 * (double)d * 2; /* K and V of one position, 2 bytes an element */
    double ref[64], out[64], pr[64], pw[64];
    for (int engine = 0; engine < 2; engine++) {
        kvs_replay_result *r = NULL;
        assert_int_equal(engine ? kvs_replay_reference(&src, &o, &r) : kvs_replay_execute(&src, &o, &r), KVS_OK);
        int checked = 0;
        for (int c = 0; c < 4; c++) {
            const kvs_replay_run_result *run = &r->runs[c];
            assert_int_equal(run->status, KVS_OK);
            for (int64_t s = 0; s < run->n_steps; s++) {
                const kvs_results_step *st = &run->steps[s];
                int64_t p = st->position, lo = st->layer == WL && p - W + 1 > 0 ? p - W + 1 : 0;
                int hq = st->q_head, h = hq / f.G;
                const float *q = f.g->q + ((size_t)st->layer * N + (size_t)p) * row + (size_t)hq * d;
                const float *k = f.g->k + (size_t)st->layer * N * krow + (size_t)h * d;
                const float *v = f.g->v + (size_t)st->layer * N * krow + (size_t)h * d;
                kvs_test_attend_rows(q, k, v, krow, lo, p, d, f.scale, ref, pr);
                /* what the configuration attends: window B from max(lo, p-B+1); the full cache the whole window */
                int64_t first = c == 3 ? lo : p - budgets[c] + 1 > lo ? p - budgets[c] + 1 : lo;
                kvs_test_attend_rows(q, k, v, krow, first, p, d, f.scale, out, pw);
                double e2 = 0, r2 = 0, recall = 0;
                for (size_t e = 0; e < d; e++) e2 += (ref[e] - out[e]) * (ref[e] - out[e]), r2 += ref[e] * ref[e];
                for (int64_t j = first; j <= p; j++) recall += pr[j];
                double err = sqrt(e2 / r2), n_att = (double)(p - first + 1);
                if (fabs(st->v[KVS_M_OUT_ERR] - err) > 1e-4 * err + 1e-6 || fabs(st->v[KVS_M_ATTN_RECALL] - recall) > 1e-5 ||
                    st->v[KVS_M_ATTENDED] != n_att) {
                    fprintf(stderr, "engine %d config %d layer %d pos %lld head %d: err %.9g (by hand %.9g) recall %.9g "
                            "(%.9g) attended %g (%g)\n", engine, c, (int)st->layer, (long long)p, hq,
                            st->v[KVS_M_OUT_ERR], err, st->v[KVS_M_ATTN_RECALL], recall, st->v[KVS_M_ATTENDED], n_att);
                    fail();
                }
                if (st->layer == WL && budgets[c] >= W) assert_true(st->v[KVS_M_OUT_ERR] == 0);
                /* resident and read bytes: what is attended (the window policy holds B - 1 between steps, the new
                 * token written), never more than the window on the windowed layer */
                assert_true(st->v[KVS_M_STORAGE_KV] == n_att * pos_bytes);
                assert_true(st->v[KVS_M_TRAFFIC_KV] == n_att * pos_bytes);
                if (st->layer == WL) assert_true(st->v[KVS_M_STORAGE] <= (double)W * pos_bytes);
                checked += st->layer == WL && p - W + 1 > 0;
            }
        }
        assert_true(checked >= 4 * 14 * 4); /* 4 configurations x 14 decode positions x 4 query heads */
        kvs_replay_result_free(r);
    }
    kvs_test_replay_fixture_free(&f);
}

/* What must cover a windowed layer's window for a run to hold exactly the window (zero error): the budget the
 * policy's allocation gave the head (hb); for the policies without a token budget, what their parameters keep
 * (LagKV never compresses fewer than 2 lag held positions, sinks gone with the window; SimLayerKV's lazy layers keep
 * n_init + n_recent, n_recent = 0 meaning the budget minus n_init); -1 when no setting promises it: SyncKV, whose
 * non-representative units miss the tokens generated since their last anticipation whatever k is (its suspension,
 * not the window: the same run on a full-attention trace has an error at any budget; engines_agree checks that its
 * representatives attend the whole window instead), and any other policy without a budget. */
static int64_t exact_cover(const kvs_replay_config *c, int64_t hb) {
    const struct kvs_policy_ops *ops = c->policy.ops;
    if (!strcmp(ops->name, "lagkv")) return 2 * (int64_t)kvs_policy_param_get(&c->policy, "lag") - 1;
    if (!strcmp(ops->name, "simlayerkv")) {
        int64_t r = (int64_t)kvs_policy_param_get(&c->policy, "n_recent");
        return r > 0 ? (int64_t)kvs_policy_param_get(&c->policy, "n_init") + r : c->budget;
    }
    if (!strcmp(ops->name, "synckv") || ops->budget_scope == KVS_BUDGET_NONE) return -1;
    return hb;
}

/* Asserts that every registered policy with window_evict has at least one configuration among cfg[0..n): the engine
 * tests replay them all (none skipped because validate() refused every budget tried). */
static void assert_every_windowed_policy_replayed(const kvs_replay_config *cfg, int n, const char *test) {
    for (int i = 0; i < kvs_policy_count(); i++) {
        const struct kvs_policy_ops *ops = kvs_policy_at(i);
        if (!ops->window_evict) continue;
        /* duo validates only with its gate file (pattern=FILE): tests/test_windows_retrieval.c replays it with one */
        if (!strcmp(ops->name, "duo")) continue;
        int runs = 0;
        for (int c = 0; c < n; c++) runs += cfg[c].policy.ops == ops;
        if (runs == 0) fail_msg("%s: policy %s has window_evict but no configuration was replayed", test, ops->name);
    }
}

/* A copy of H2O's table without window_evict: what a policy without the hook meets on a windowed trace (every
 * registered policy has it; the refusal stays tested with this one). */
static struct kvs_policy_ops h2o_without_hook(void) {
    struct kvs_policy_ops o = kvs_policy_h2o;
    o.window_evict = NULL;
    return o;
}

/* Both engines refuse configuration c (a policy without window_evict) on src, naming the window. */
static void assert_refused(const kvs_replay_source *src, kvs_replay_config c) {
    kvs_replay_opts o1 = {.configs = &c, .n_configs = 1, .threads = 1};
    kvs_replay_result *r = NULL;
    assert_int_equal(kvs_replay_execute(src, &o1, &r), KVS_ERR_UNSUPPORTED);
    assert_null(r);
    assert_non_null(strstr(kvs_last_error(), "cannot replay a sliding-window layer"));
    assert_int_equal(kvs_replay_reference(src, &o1, &r), KVS_ERR_UNSUPPORTED);
    assert_null(r);
    assert_non_null(strstr(kvs_last_error(), "cannot replay a sliding-window layer"));
}

/* A capture of the Gemma-3 fixture (3 of 4 layers windowed to 6 of 33 positions) through both engines, every
 * registered policy and preset at budgets 3, 6, 12 and 24: a policy with window_evict gives the same numbers bit for
 * bit in both (every statistic of every layer and the run, the series, the largest attended set), the full cache has
 * zero error and recall 1 to float rounding (its reference is the window), every policy replayed has zero error
 * on a windowed layer whose budget (after the policy's own allocation) is >= the window (exact_cover), and its
 * resident KV bytes (device and host) on a windowed layer never exceed the window; every registered policy with window_evict is
 * replayed; a policy without window_evict (a test-only copy of a table) is refused by both, naming it. */
static void test_replay_gemma3_engines(void **state) {
    kvs_test_cli_fx *f = *state;
    if (!kvs_test_kvsim_bin()) skip();
    char path[256];
    snprintf(path, sizeof path, "%s/g.kvt", f->dir);
    assert_int_equal(capture_gemma(f, path, "full"), 0);
    kvs_trace *t = NULL;
    assert_int_equal(kvs_trace_open(path, &t), KVS_OK);
    kvs_replay_source src;
    assert_int_equal(kvs_replay_source_from_trace(t, &src), KVS_OK);
    assert_non_null(src.layer_window);
    enum { MAX_CONFIGS = 512 };
    static kvs_replay_config cfg[MAX_CONFIGS];
    static char names[MAX_CONFIGS][128];
    const int64_t budgets[] = {3, 6, 12, 24};
    int n = 0;
    for (int i = 0; i < kvs_policy_count(); i++) {
        const struct kvs_policy_ops *ops = kvs_policy_at(i);
        for (int k = -1; k < ops->n_presets; k++) {
            char spec[96];
            if (k < 0) snprintf(spec, sizeof spec, "%s", ops->name);
            else snprintf(spec, sizeof spec, "%s@%s", ops->name, ops->presets[k].name);
            for (int b = 0; b < 4; b++) {
                kvs_replay_config c = {.budget = budgets[b], .budget_fraction = -1};
                assert_int_equal(kvs_policy_parse(spec, &c.policy), KVS_OK);
                if (kvs_policy_validate(&c.policy, &src.model, c.budget) != KVS_OK) continue;
                if (!ops->window_evict) fail_msg("policy %s has no window_evict: it cannot replay a windowed layer", ops->name);
                assert_true(n < MAX_CONFIGS);
                snprintf(names[n], sizeof names[n], "%.96s at budget %lld", spec, (long long)c.budget);
                cfg[n++] = c;
            }
        }
    }
    assert_true(n >= 6);
    assert_every_windowed_policy_replayed(cfg, n, "gemma3");
    { /* the refusal, whatever the registry holds */
        struct kvs_policy_ops bare = h2o_without_hook();
        kvs_replay_config c = {.budget = 6, .budget_fraction = -1};
        assert_int_equal(kvs_policy_parse("h2o", &c.policy), KVS_OK);
        c.policy.ops = &bare;
        assert_refused(&src, c);
    }
    kvs_replay_opts o = {.configs = cfg, .n_configs = n, .threads = 2, .measure = KVS_MEASURE_DECODE, .series_every = 1};
    kvs_replay_result *fast = NULL, *ref = NULL;
    assert_int_equal(kvs_replay_execute(&src, &o, &fast), KVS_OK);
    assert_int_equal(kvs_replay_reference(&src, &o, &ref), KVS_OK);
    double pos_bytes = 2.0 * src.model.head_dim * src.model.kv_bytes;
    for (int i = 0; i < n; i++) {
        const kvs_replay_run_result *x = &fast->runs[i], *y = &ref->runs[i];
        char why[512];
        if (kvs_test_runs_differ(x, y, why, sizeof why)) fail_msg("%s: %s", names[i], why);
        for (int64_t k = 0; k < x->n_steps; k++) {
            const kvs_results_step *a = &x->steps[k];
            int32_t w = gemma_windows[a->layer];
            if (w > 0) assert_true(a->v[KVS_M_STORAGE_KV] <= (double)w * pos_bytes * src.model.group);
            if (w > 0) assert_true(a->v[KVS_M_STORAGE_HOST] <= (double)w * pos_bytes * src.model.group); /* offloaded */
            /* a budget covering the window holds exactly the window (every policy replayed: bounded every step, over
             * the prompt only, or the full cache; the budget the policy's allocation gave this head) */
            int64_t hb = x->budgets[(size_t)a->layer * (size_t)src.model.n_kv_heads + (size_t)(a->q_head / src.model.group)];
            if (w > 0 && exact_cover(&cfg[i], hb) >= w && a->v[KVS_M_OUT_ERR] != 0)
                fail_msg("%s: layer %d pos %lld error %.9g with %lld covering the window", names[i],
                         (int)a->layer, (long long)a->position, a->v[KVS_M_OUT_ERR], (long long)exact_cover(&cfg[i], hb));
            if (w > 0 && !strcmp(cfg[i].policy.ops->name, "full")) {
                if (!(a->v[KVS_M_OUT_ERR] == 0 && fabs(a->v[KVS_M_ATTN_RECALL] - 1) < 1e-6))
                    fail_msg("%s: layer %d pos %lld err %.9g recall %.17g", names[i], (int)a->layer,
                             (long long)a->position, a->v[KVS_M_OUT_ERR], a->v[KVS_M_ATTN_RECALL]);
                assert_true(a->v[KVS_M_STORAGE_KV] == (double)w * pos_bytes); /* every decode position is past 6 */
            }
        }
    }
    kvs_replay_result_free(fast);
    kvs_replay_result_free(ref);
    kvs_trace_close(t);
}

/* A window policy that ignores the host's evictions: it keeps selecting its last B positions. */
static kvs_status deaf_evict(void *state, int64_t first) {
    (void)state;
    (void)first;
    return KVS_OK;
}

/* Replays every policy with window_evict (its presets, and the `extra` variants taking other paths) at `budgets` on
 * src in both engines and asserts the same numbers bit for bit (every layer's statistics and the series); every
 * registered policy with window_evict has a configuration. With check_exact, on the windowed layer (window W at layer
 * 0): resident KV bytes, on the device and offloaded to the host, never above the window, and zero error wherever
 * what the policy keeps covers the window (exact_cover). */
static void engines_agree(const kvs_replay_source *src, int32_t W, const int64_t *budgets, int nb,
                          const char *const *extra, int n_extra, int check_exact, const char *test) {
    enum { MAX_CONFIGS = 512 };
    static kvs_replay_config cfg[MAX_CONFIGS];
    static char names[MAX_CONFIGS][128];
    int n = 0;
    for (int i = 0; i < kvs_policy_count() + n_extra; i++) {
        const struct kvs_policy_ops *ops = i < kvs_policy_count() ? kvs_policy_at(i) : NULL;
        if (ops && !ops->window_evict) continue;
        for (int k = -1; k < (ops ? ops->n_presets : 0); k++) {
            char spec[96];
            if (!ops) snprintf(spec, sizeof spec, "%s", extra[i - kvs_policy_count()]);
            else if (k < 0) snprintf(spec, sizeof spec, "%s", ops->name);
            else snprintf(spec, sizeof spec, "%s@%s", ops->name, ops->presets[k].name);
            for (int b = 0; b < nb; b++) {
                kvs_replay_config c = {.budget = budgets[b], .budget_fraction = -1};
                assert_int_equal(kvs_policy_parse(spec, &c.policy), KVS_OK);
                if (kvs_policy_validate(&c.policy, &src->model, c.budget) != KVS_OK) continue;
                assert_true(n < MAX_CONFIGS);
                snprintf(names[n], sizeof names[n], "%s: %.96s at budget %lld", test, spec, (long long)c.budget);
                cfg[n++] = c;
            }
        }
    }
    assert_true(n >= 12);
    assert_every_windowed_policy_replayed(cfg, n, test);
    kvs_replay_opts o = {.configs = cfg, .n_configs = n, .threads = 2, .measure = KVS_MEASURE_DECODE, .series_every = 1};
    kvs_replay_result *fast = NULL, *ref = NULL;
    assert_int_equal(kvs_replay_execute(src, &o, &fast), KVS_OK);
    assert_int_equal(kvs_replay_reference(src, &o, &ref), KVS_OK);
    double pos_bytes = 2.0 * src->model.head_dim * src->model.kv_bytes;
    double *most = calloc((size_t)src->model.n_positions, sizeof *most); /* [position] largest |S_t| on layer 0 */
    assert_non_null(most);
    for (int i = 0; i < n; i++) {
        const kvs_replay_run_result *x = &fast->runs[i], *y = &ref->runs[i];
        char why[512];
        if (kvs_test_runs_differ(x, y, why, sizeof why)) fail_msg("%s: %s", names[i], why);
        for (int64_t k = 0; k < x->n_steps; k++) {
            const kvs_results_step *a = &x->steps[k];
            if (!check_exact || a->layer != 0) continue;
            if (!(a->v[KVS_M_STORAGE_KV] <= (double)W * pos_bytes * src->model.group) ||
                !(a->v[KVS_M_STORAGE_HOST] <= (double)W * pos_bytes * src->model.group))
                fail_msg("%s: pos %lld stores %g bytes (host %g), above the window", names[i], (long long)a->position,
                         a->v[KVS_M_STORAGE_KV], a->v[KVS_M_STORAGE_HOST]);
            int64_t hb = x->budgets[(size_t)(a->q_head / src->model.group)]; /* layer 0 */
            if (exact_cover(&cfg[i], hb) >= W && a->v[KVS_M_OUT_ERR] != 0)
                fail_msg("%s: pos %lld error %.9g with %lld covering the window", names[i],
                         (long long)a->position, a->v[KVS_M_OUT_ERR], (long long)exact_cover(&cfg[i], hb));
            if (a->position < src->model.n_positions && a->v[KVS_M_ATTENDED] > most[a->position])
                most[a->position] = a->v[KVS_M_ATTENDED];
        }
        /* SyncKV's representatives attend exactly the window at every step */
        if (check_exact && !strcmp(cfg[i].policy.ops->name, "synckv"))
            for (int64_t p = 0; p < src->model.n_positions; p++) {
                if (most[p] == 0) continue; /* not measured (a prompt position) */
                double want = (double)(p + 1 < W ? p + 1 : W);
                if (most[p] != want) fail_msg("%s: pos %lld attends at most %g, the window is %g", names[i], (long long)p, most[p], want);
            }
        memset(most, 0, (size_t)src->model.n_positions * sizeof *most);
    }
    free(most);
    kvs_replay_result_free(fast);
    kvs_replay_result_free(ref);
}

/* A generated two-turn trace (layer 0 windowed to 5 positions, layer 1 full) through both engines: every policy with
 * window_evict, its presets and the variants taking other paths (per-KV-head lists, chunked prefill), at budgets 3,
 * 5 and 9, bit for bit (the later turn's prefill after evictions, a prefill block by block); and the selection
 * check: a policy that ignores window_evict fails its run in both engines, saying the window. */
static void test_replay_windows_generated_two_turns(void **state) {
    (void)state;
    kvs_test_replay_fixture f;
    kvs_gen_trace_opts go = kvs_test_grouped_opts(2, 2, 60, -1, 8, 3);
    assert_int_equal(kvs_test_replay_fixture_make(&go, 2, 7, &f), KVS_OK);
    kvs_replay_source src;
    assert_int_equal(kvs_replay_source_from_memory(&f.mem, &src), KVS_OK);
    const int32_t windows[2] = {5, 0};
    src.layer_window = windows;
    static const char *const extra[] = {"h2o:gqa=mean", "h2o:block=4", "h2o:prefill=budget", "streaming:sinks=2"};
    const int64_t budgets[] = {3, 5, 9};
    engines_agree(&src, 5, budgets, 3, extra, 4, 0, "two turns");
    /* the check: policies deaf to the evictions select (full: no stored(), so only the selection tells) or store
     * (window) positions the window dropped */
    static const char *const deaf_names[2] = {"full", "window"};
    static const char *const deaf_says[2] = {"selected position", "outside the layer's sliding window"};
    for (int k = 0; k < 2; k++) {
        struct kvs_policy_ops deaf = k ? kvs_policy_window : kvs_policy_full;
        deaf.window_evict = deaf_evict;
        kvs_replay_config dc = {.budget = 9, .budget_fraction = -1};
        assert_int_equal(kvs_policy_parse(deaf_names[k], &dc.policy), KVS_OK);
        dc.policy.ops = &deaf;
        kvs_replay_opts od = {.configs = &dc, .n_configs = 1, .threads = 1, .measure = KVS_MEASURE_DECODE};
        for (int engine = 0; engine < 2; engine++) {
            kvs_replay_result *r = NULL;
            assert_int_equal(engine ? kvs_replay_reference(&src, &od, &r) : kvs_replay_execute(&src, &od, &r), KVS_OK);
            assert_int_equal(r->runs[0].status, KVS_ERR_STATE);
            if (!strstr(r->runs[0].error, "outside the layer's sliding window") || !strstr(r->runs[0].error, deaf_says[k]))
                fail_msg("%s, engine %d: %s", deaf_names[k], engine, r->runs[0].error);
            kvs_replay_result_free(r);
        }
    }
    kvs_test_replay_fixture_free(&f);
}

/* A longer generated two-turn trace (200 positions: 50 prompt + 50 generated per turn; layer 0 windowed to 40, layer
 * 1 full) at budgets 16, 48 and 96, with variants sized so that every structure is non-trivial while positions leave
 * the window: LagKV partitions of 8 after 2 sinks (compressed prefix and tail cut by the edge), ChunkKV chunks of 4
 * (both modes and scopes), MorphKV with a recent window of 4 (profile rows and qz), Scissorhands' rings, D2O's
 * merged slots (every merge mode, layer decisions, uniform allocation), SyncKV's sets (since_anticipation,
 * exclude_static, the layer union), lazy SimLayerKV layers (delta 0: every layer lazy; both detectors and both
 * evictions; n_init + n_recent = 41 covers the window only once the initial tokens' slots went to the recent part), short observation windows for SnapKV's family and CAKE, Q-Filters' and CurDKV's small windows: both
 * engines bit for bit, storage at most the window, and zero error where the budget covers the window (96). */
static void test_replay_windows_generated_long(void **state) {
    (void)state;
    kvs_test_replay_fixture f;
    kvs_gen_trace_opts go = kvs_test_grouped_opts(2, 2, 200, -1, 8, 11);
    assert_int_equal(kvs_test_replay_fixture_make(&go, 2, 13, &f), KVS_OK);
    kvs_replay_source src;
    assert_int_equal(kvs_replay_source_from_memory(&f.mem, &src), KVS_OK);
    const int32_t windows[2] = {40, 0};
    src.layer_window = windows;
    static const char *const extra[] = {
        "lagkv:sink=2,lag=8", "lagkv:sink=2,lag=8,use_then_compress=0", "lagkv:sink=0,lag=5,ratio=0.4",
        "chunkkv:chunk=4,window=8", "chunkkv:chunk=4,window=8,scope=head", "chunkkv:chunk=4,window=8,select=ref",
        "morphkv:recent=4", "morphkv:recent=4,profile=qz", "morphkv:recent=4,fidelity=ref,fusion=max",
        "morphkv:recent=4,evict_after=1.5", "scissorhands:history=8,recent=2", "scissorhands:history=8,recent=2,drop=3,gqa=mean",
        "d2o:alloc=uniform", "d2o:alloc=uniform,merge=ref,tau=layer,decide=mean", "d2o:alloc=uniform,gqa=sum,sinks=2",
        "d2o:merge=none", "synckv:nr_recent=since_anticipation,m=2", "synckv:exclude_static=1,nr_union=layer,m=3",
        "simlayerkv:delta=0,n_recent=0", "simlayerkv:delta=0,n_recent=0,detect=prefill_last,lazy_evict=once",
        "simlayerkv:delta=0,n_init=2,n_recent=12", "simlayerkv:delta=0,n_init=4,n_recent=37",
        "simlayerkv:delta=0,n_init=4,n_recent=37,lazy_evict=once", "snapkv:window=4", "pyramidkv:window=4", "adakv:window=4",
        "cake:window=4", "qfilters:window=4", "cur:local_w=8,sinks=2"};
    const int64_t budgets[] = {16, 48, 96};
    engines_agree(&src, 40, budgets, 3, extra, (int)(sizeof extra / sizeof extra[0]), 1, "long");
    kvs_test_replay_fixture_free(&f);
}

/* What the hook below checks: a score-count policy's retention scores after every step. */
typedef struct {
    int64_t history; /* Scissorhands: a count is at most the observations its ring holds */
    int64_t checked, bad;
} count_rec;

static void check_counts(void *user, int config, int layer, int kv_head, int64_t pos, void *state,
                         const struct kvs_policy_ops *ops, float *k, float *v, int64_t n) {
    count_rec *r = user;
    (void)config, (void)layer, (void)kv_head, (void)pos, (void)k, (void)v;
    int32_t *idx = malloc((size_t)(n + 1) * sizeof *idx);
    double *sc = malloc((size_t)(n + 1) * sizeof *sc);
    assert_true(idx && sc);
    for (int g = 0; g < 2; g++) { /* gqa=expand, group 2: a list per query head */
        int64_t m = ops->stored(state, g, idx);
        if (m > 0 && ops->scores(state, g, idx, m, sc))
            for (int64_t j = 0; j < m; j++) {
                if (isinf(sc[j])) continue; /* the protected recent entries */
                r->checked++;
                r->bad += !(sc[j] == floor(sc[j]) && sc[j] <= 0 && -sc[j] <= (double)r->history);
            }
    }
    free(idx);
    free(sc);
}

/* Scissorhands' counts stay the counts of the flags its rings hold while the window drops entries: after every
 * step of the long windowed trace each scored entry's retention score is minus a whole number of unimportant
 * observations, at most the ring's length (a ring left misaligned by a drop hands another entry's flags to the
 * count's updates, which then leave that range). The fast engine (the reference takes no hooks; both agree bit for
 * bit, test_replay_windows_generated_long). */
static void test_window_keeps_scissorhands_counts(void **state) {
    (void)state;
    kvs_test_replay_fixture f;
    kvs_gen_trace_opts go = kvs_test_grouped_opts(2, 2, 200, -1, 8, 11);
    assert_int_equal(kvs_test_replay_fixture_make(&go, 2, 13, &f), KVS_OK);
    kvs_replay_source src;
    assert_int_equal(kvs_replay_source_from_memory(&f.mem, &src), KVS_OK);
    const int32_t windows[2] = {40, 0};
    src.layer_window = windows;
    count_rec rec = {.history = 8};
    kvs_replay_hooks hooks = {.user = &rec, .on_step_end = check_counts};
    kvs_replay_config c = {.budget = 16, .budget_fraction = -1};
    assert_int_equal(kvs_policy_parse("scissorhands:history=8,recent=2", &c.policy), KVS_OK);
    kvs_replay_opts o = {.configs = &c, .n_configs = 1, .threads = 1, .measure = KVS_MEASURE_DECODE, .hooks = &hooks};
    kvs_replay_result *r = NULL;
    assert_int_equal(kvs_replay_execute(&src, &o, &r), KVS_OK);
    assert_int_equal(r->runs[0].status, KVS_OK);
    if (rec.bad || rec.checked < 1000)
        fail_msg("%lld of %lld counts out of [0, 8] or fractional", (long long)rec.bad, (long long)rec.checked);
    kvs_replay_result_free(r);
    kvs_test_replay_fixture_free(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_header_round_trip_and_old_layout, kvs_test_tmp_setup, kvs_test_tmp_teardown),
        cmocka_unit_test_setup_teardown(test_corrupt_windows_refused, kvs_test_tmp_setup, kvs_test_tmp_teardown),
        cmocka_unit_test_setup_teardown(test_gemma3_capture_info_verify_readers, kvs_test_cli_setup,
                                        kvs_test_cli_teardown),
        cmocka_unit_test(test_verify_window_row_bound),
        cmocka_unit_test_setup_teardown(test_plan_windows_by_hand, kvs_test_tmp_setup, kvs_test_tmp_teardown),
        cmocka_unit_test(test_replay_window_by_hand),
        cmocka_unit_test_setup_teardown(test_replay_gemma3_engines, kvs_test_cli_setup, kvs_test_cli_teardown),
        cmocka_unit_test(test_replay_windows_generated_two_turns),
        cmocka_unit_test(test_replay_windows_generated_long),
        cmocka_unit_test(test_window_keeps_scissorhands_counts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
