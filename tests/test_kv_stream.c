/* test_kv_stream.c — tests of the (layer, KV head) position iterator (trace/kv_stream.h): on small traces the
 * test writes itself with trace/trace.h's writer (a multi-turn sequence, a partial last block, a group of 3
 * query heads, a head_dim that is not a multiple of 4), the iterator's queries, K/V history, stored o/lse,
 * tokens, turns and prompt flags equal what was written, and its full attention equals an independent
 * fp64 computation written here and, bit for bit, kvs_attention() (which the replay engine's blocked reference
 * equals row by row). Bad
 * layer / head / flags give their status and message; corrupt traces give an error, never a crash.
 * All data is GENERATED (a seeded generator in this file and tests/util/gen_trace.h), not a model's.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/kvs.h"
#include "common/kvs_math.h"
#include "trace/kv_stream.h"
#include "tests/util/gen_trace.h"
#include "trace/trace.h"

/* ------------------------------------------------------------------------------------------------
 * The fixture: a trace written here, and the data it holds
 * ---------------------------------------------------------------------------------------------- */

enum { L = 2, H = 6, HKV = 2, G = H / HKV, D = 10, N = 37, BLOCK = 8 };
#define SCALE 0.3f /* not 1/sqrt(D): the iterator must take the trace's attn_scale */

/* Turns: 0 = prompt [0,9) generated [9,17); 1 = prompt [17,25) generated [25,31); 2 = prompt [31,37) only */
static const int turn_begin[] = {0, 17, 31}, turn_prompt_end[] = {9, 25, 37};

typedef struct {
    char dir[64], path[128];
    float q[L][N][H][D], k[L][N][HKV][D], v[L][N][HKV][D], o[L][N][H][D], lse[L][N][H];
    int32_t token[N], turn[N];
    uint8_t role[N];
} fixture;

static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
/* uniform in [-a, a) */
static float rng_uniform(uint64_t *s, float a) { return (float)(((double)(rng_next(s) >> 11) / 9007199254740992.0 * 2 - 1) * a); }

static void write_fixture_trace(const fixture *f) {
    kvs_model_config m = {.n_layers = L, .n_heads = H, .n_kv_heads = HKV, .head_dim = D, .dim = H * D,
                          .hidden_dim = 4 * H * D, .vocab_size = 500, .max_seq_len = 64, .rope_theta = 10000.0f,
                          .norm_eps = 1e-5f, .attn_scale = SCALE, .rope_layout = KVS_ROPE_ADJACENT};
    snprintf(m.model_name, sizeof m.model_name, "generated-kv-stream-test");
    kvs_capture_config c = {.dtype = KVS_DTYPE_F32, .block_positions = BLOCK, .flags = KVS_TRACE_FLAG_SHUFFLE};
    snprintf(c.settings, sizeof c.settings, "source=generated");
    kvs_trace_writer *w = NULL;
    assert_int_equal(kvs_trace_writer_create(f->path, &m, &c, &w), KVS_OK);
    for (int p = 0; p < N; p++) {
        assert_int_equal(kvs_trace_writer_begin_position(w, f->token[p], (kvs_role)f->role[p], f->turn[p]), KVS_OK);
        for (int l = 0; l < L; l++)
            assert_int_equal(kvs_trace_writer_put_layer(w, l, &f->q[l][p][0][0], &f->k[l][p][0][0], &f->v[l][p][0][0],
                                                        &f->o[l][p][0][0], &f->lse[l][p][0]),
                             KVS_OK);
        assert_int_equal(kvs_trace_writer_end_position(w), KVS_OK);
    }
    assert_int_equal(kvs_trace_writer_close(w), KVS_OK);
    kvs_trace_writer_free(w);
}

static int fixture_setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    if (!f) return -1;
    snprintf(f->dir, sizeof f->dir, "/tmp/kvs_kvstream_XXXXXX");
    if (!mkdtemp(f->dir)) return -1;
    snprintf(f->path, sizeof f->path, "%s/t.kvt", f->dir);
    uint64_t rng = 42;
    /* o and lse are arbitrary numbers: the iterator hands them through, it never checks them */
    for (int l = 0; l < L; l++)
        for (int p = 0; p < N; p++) {
            for (int h = 0; h < H; h++) {
                for (int i = 0; i < D; i++) f->q[l][p][h][i] = rng_uniform(&rng, 3.0f);
                for (int i = 0; i < D; i++) f->o[l][p][h][i] = rng_uniform(&rng, 1.0f);
                f->lse[l][p][h] = rng_uniform(&rng, 5.0f);
            }
            for (int h = 0; h < HKV; h++)
                for (int i = 0; i < D; i++) {
                    f->k[l][p][h][i] = rng_uniform(&rng, 2.0f);
                    f->v[l][p][h][i] = rng_uniform(&rng, 2.0f);
                }
        }
    for (int p = 0; p < N; p++) {
        f->token[p] = (int32_t)(rng_next(&rng) % 500);
        for (int t = 0; t < 3; t++)
            if (p >= turn_begin[t]) f->turn[p] = t;
        f->role[p] = p < turn_prompt_end[f->turn[p]] ? KVS_ROLE_PROMPT : KVS_ROLE_GENERATED;
    }
    write_fixture_trace(f);
    *state = f;
    return 0;
}

static int fixture_teardown(void **state) {
    fixture *f = *state;
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->dir);
    int rc = system(cmd);
    free(f);
    return rc == 0 ? 0 : -1;
}

static kvs_trace *open_fixture(const fixture *f) {
    kvs_trace *t = NULL;
    assert_int_equal(kvs_trace_open(f->path, &t), KVS_OK);
    return t;
}

/* Naive fp64 attention of one query over keys/values 0..n-1 (rows `stride` floats apart): scores, probs,
 * output and LSE, written independently of kvs_math.c. */
static double naive_attention(const float *q, const float *k, const float *v, size_t stride, size_t n, float scale,
                              double *scores, double *probs, double *out) {
    double mx = -INFINITY;
    for (size_t j = 0; j < n; j++) {
        double s = 0;
        for (size_t i = 0; i < D; i++) s += (double)q[i] * (double)k[j * stride + i];
        scores[j] = (double)scale * s;
        if (scores[j] > mx) mx = scores[j];
    }
    double z = 0;
    for (size_t j = 0; j < n; j++) z += exp(scores[j] - mx);
    for (size_t j = 0; j < n; j++) probs[j] = exp(scores[j] - mx) / z;
    for (size_t i = 0; i < D; i++) {
        out[i] = 0;
        for (size_t j = 0; j < n; j++) out[i] += probs[j] * (double)v[j * stride + i];
    }
    return mx + log(z);
}

/* ------------------------------------------------------------------------------------------------
 * History, queries, stored arrays, tokens, turns, roles
 * ---------------------------------------------------------------------------------------------- */

static void test_history_queries_and_roles(void **state) {
    const fixture *f = *state;
    kvs_trace *t = open_fixture(f);
    for (int l = 0; l < L; l++)
        for (int kh = 0; kh < HKV; kh++) {
            kvs_kv_stream *s = NULL;
            assert_int_equal(kvs_kv_stream_open(t, l, kh, 0, &s), KVS_OK);
            const float *k0 = NULL;
            kvs_kv_pos kp;
            for (int p = 0; p < N; p++) {
                assert_int_equal(kvs_kv_stream_next(s, &kp), KVS_OK);
                assert_int_equal(kp.layer, l);
                assert_int_equal(kp.kv_head, kh);
                assert_int_equal(kp.group, G);
                assert_int_equal(kp.head_dim, D);
                assert_true(kp.scale == SCALE);
                assert_int_equal(kp.pos, p);
                assert_int_equal(kp.n_ctx, p + 1);
                assert_int_equal(kp.token, f->token[p]);
                assert_int_equal(kp.turn, f->turn[p]);
                assert_int_equal(kp.is_prompt, f->role[p] == KVS_ROLE_PROMPT);
                /* fp32 storage: everything comes back exactly */
                for (int g = 0; g < G; g++) {
                    assert_memory_equal(kp.q + g * D, f->q[l][p][kh * G + g], D * sizeof(float));
                    assert_memory_equal(kp.o + g * D, f->o[l][p][kh * G + g], D * sizeof(float));
                    assert_true(kp.lse[g] == f->lse[l][p][kh * G + g]);
                }
                for (int j = 0; j <= p; j++) {
                    assert_memory_equal(kp.k + j * D, f->k[l][j][kh], D * sizeof(float));
                    assert_memory_equal(kp.v + j * D, f->v[l][j][kh], D * sizeof(float));
                }
                if (p == 0) k0 = kp.k;
                assert_ptr_equal(kp.k, k0); /* the history never moves */
                assert_null(kp.probs);
                assert_null(kp.out);
                assert_null(kp.attn_lse);
                assert_null(kp.scores);
            }
            assert_int_equal(kvs_kv_stream_next(s, &kp), KVS_ERR_END);
            assert_int_equal(kvs_kv_stream_next(s, &kp), KVS_ERR_END); /* and stays there */
            kvs_kv_stream_free(s);
        }
    kvs_trace_close(t);
}

/* The turn / prompt flags follow the trace's turn table (kvs_trace_info_get) as well as what was written. */
static void test_flags_match_turn_table(void **state) {
    const fixture *f = *state;
    kvs_trace *t = open_fixture(f);
    const kvs_trace_info *in = kvs_trace_info_get(t);
    assert_int_equal(in->n_turns, 3);
    kvs_kv_stream *s = NULL;
    assert_int_equal(kvs_kv_stream_open(t, 1, 0, KVS_KV_STREAM_FULL_ATTN, &s), KVS_OK);
    kvs_kv_pos kp;
    int n_prompt = 0;
    while (kvs_kv_stream_next(s, &kp) == KVS_OK) {
        const kvs_turn *tu = &in->turns[kp.turn];
        assert_true(kp.pos >= tu->begin && kp.pos < tu->end);
        assert_int_equal(kp.is_prompt, kp.pos < tu->prompt_end);
        n_prompt += kp.is_prompt;
    }
    assert_int_equal(n_prompt, 9 + 8 + 6);
    kvs_kv_stream_free(s);
    kvs_trace_close(t);
}

/* ------------------------------------------------------------------------------------------------
 * Full attention
 * ---------------------------------------------------------------------------------------------- */

/* Checks one stream opened with `flags` (FULL_ATTN or SCORES) against the naive computation and, bit for
 * bit, against kvs_attention() on the test's own copy of the history. */
static void check_full_attention(const fixture *f, kvs_trace *t, int l, int kh, unsigned flags) {
    kvs_kv_stream *s = NULL;
    assert_int_equal(kvs_kv_stream_open(t, l, kh, flags, &s), KVS_OK);
    float keys[N][D], vals[N][D], probs[N], out[D], scores[N];
    double nscores[N], nprobs[N], nout[D];
    kvs_kv_pos kp;
    for (int p = 0; p < N; p++) {
        assert_int_equal(kvs_kv_stream_next(s, &kp), KVS_OK);
        memcpy(keys[p], f->k[l][p][kh], sizeof keys[p]);
        memcpy(vals[p], f->v[l][p][kh], sizeof vals[p]);
        assert_non_null(kp.probs);
        assert_non_null(kp.out);
        assert_non_null(kp.attn_lse);
        if (flags & KVS_KV_STREAM_SCORES) assert_non_null(kp.scores);
        else assert_null(kp.scores);
        size_t n = (size_t)p + 1;
        for (int g = 0; g < G; g++) {
            const float *q = f->q[l][p][kh * G + g];
            const float *kprobs = kp.probs + (size_t)g * n, *kout = kp.out + (size_t)g * D;
            /* independent fp64 computation: fp32 rounding only (a few ulps on these small magnitudes) */
            double nlse = naive_attention(q, &f->k[l][0][kh][0], &f->v[l][0][kh][0], HKV * D, n, SCALE, nscores,
                                          nprobs, nout);
            assert_true(fabs(kp.attn_lse[g] - nlse) <= 1e-5 * (1 + fabs(nlse)));
            double psum = 0;
            for (size_t j = 0; j < n; j++) {
                assert_true(fabs(kprobs[j] - nprobs[j]) <= 1e-5 * nprobs[j] + 1e-7);
                psum += kprobs[j];
            }
            assert_true(fabs(psum - 1) <= 1e-5);
            for (int i = 0; i < D; i++) assert_true(fabs(kout[i] - nout[i]) <= 1e-5);
            if (flags & KVS_KV_STREAM_SCORES)
                for (size_t j = 0; j < n; j++)
                    assert_true(fabs(kp.scores[(size_t)g * n + j] - nscores[j]) <= 1e-5 * (1 + fabs(nscores[j])));
            /* kvs_attention(), which the replay engine's blocked reference equals: bit for bit */
            double lse = kvs_attention(q, &keys[0][0], &vals[0][0], D, NULL, n, D, SCALE, probs, out);
            assert_true(kp.attn_lse[g] == lse);
            assert_memory_equal(kprobs, probs, n * sizeof(float));
            assert_memory_equal(kout, out, D * sizeof(float));
            if (flags & KVS_KV_STREAM_SCORES) {
                kvs_attn_scores(q, &keys[0][0], D, NULL, n, D, SCALE, scores);
                assert_memory_equal(kp.scores + (size_t)g * n, scores, n * sizeof(float));
            }
        }
    }
    assert_int_equal(kvs_kv_stream_next(s, &kp), KVS_ERR_END);
    kvs_kv_stream_free(s);
}

static void test_full_attention_matches_naive_and_kvs_attention(void **state) {
    const fixture *f = *state;
    kvs_trace *t = open_fixture(f);
    for (int l = 0; l < L; l++)
        for (int kh = 0; kh < HKV; kh++) check_full_attention(f, t, l, kh, KVS_KV_STREAM_FULL_ATTN);
    kvs_trace_close(t);
}

/* SCORES keeps the scores and gives the same probabilities / outputs / lse as FULL_ATTN, bit for bit. */
static void test_scores_flag_same_attention(void **state) {
    const fixture *f = *state;
    kvs_trace *t = open_fixture(f);
    for (int l = 0; l < L; l++)
        for (int kh = 0; kh < HKV; kh++) check_full_attention(f, t, l, kh, KVS_KV_STREAM_SCORES);
    kvs_kv_stream *a = NULL, *b = NULL;
    assert_int_equal(kvs_kv_stream_open(t, 1, 1, KVS_KV_STREAM_FULL_ATTN, &a), KVS_OK);
    assert_int_equal(kvs_kv_stream_open(t, 1, 1, KVS_KV_STREAM_SCORES | KVS_KV_STREAM_FULL_ATTN, &b), KVS_OK);
    kvs_kv_pos pa, pb;
    while (kvs_kv_stream_next(a, &pa) == KVS_OK) {
        assert_int_equal(kvs_kv_stream_next(b, &pb), KVS_OK);
        size_t n = (size_t)pa.n_ctx;
        assert_memory_equal(pa.probs, pb.probs, G * n * sizeof(float));
        assert_memory_equal(pa.out, pb.out, G * D * sizeof(float));
        assert_memory_equal(pa.attn_lse, pb.attn_lse, G * sizeof(double));
    }
    assert_int_equal(kvs_kv_stream_next(b, &pb), KVS_ERR_END);
    kvs_kv_stream_free(a);
    kvs_kv_stream_free(b);
    kvs_trace_close(t);
}

/* On a generated trace whose o / lse were computed with kvs_attention (tests/util/gen_trace.h, fp32, several
 * turns, blocks of 16 with a partial last one), the recomputation reproduces the stored o exactly. */
static void test_recomputes_gen_trace_exactly(void **state) {
    const fixture *f = *state;
    char path[160];
    snprintf(path, sizeof path, "%s/gen.kvt", f->dir);
    kvs_gen_trace_opts o = kvs_gen_trace_defaults();
    o.n_positions = 45;
    o.n_turns = 2;
    o.n_heads = 6;
    o.n_kv_heads = 3;
    kvs_gen_trace *g = NULL;
    assert_int_equal(kvs_gen_trace_create(&o, &g), KVS_OK);
    assert_int_equal(kvs_gen_trace_write(g, path), KVS_OK);
    kvs_trace *t = NULL;
    assert_int_equal(kvs_trace_open(path, &t), KVS_OK);
    for (int l = 0; l < o.n_layers; l++)
        for (int kh = 0; kh < o.n_kv_heads; kh++) {
            kvs_kv_stream *s = NULL;
            assert_int_equal(kvs_kv_stream_open(t, l, kh, KVS_KV_STREAM_FULL_ATTN, &s), KVS_OK);
            kvs_kv_pos kp;
            int64_t n = 0;
            while (kvs_kv_stream_next(s, &kp) == KVS_OK) {
                assert_int_equal(kp.turn, g->turn[kp.pos]);
                assert_int_equal(kp.is_prompt, g->roles[kp.pos] == KVS_ROLE_PROMPT);
                assert_int_equal(kp.token, g->tokens[kp.pos]);
                for (int gg = 0; gg < kp.group; gg++) {
                    assert_memory_equal(kp.out + gg * kp.head_dim, kp.o + gg * kp.head_dim, (size_t)kp.head_dim * sizeof(float));
                    assert_true((float)kp.attn_lse[gg] == kp.lse[gg]);
                }
                n++;
            }
            assert_int_equal(n, o.n_positions);
            kvs_kv_stream_free(s);
        }
    kvs_trace_close(t);
    kvs_gen_trace_free(g);
}

/* ------------------------------------------------------------------------------------------------
 * Errors
 * ---------------------------------------------------------------------------------------------- */

static void test_bad_arguments(void **state) {
    const fixture *f = *state;
    kvs_trace *t = open_fixture(f);
    kvs_kv_stream *s = (kvs_kv_stream *)(uintptr_t)1; /* must be reset to NULL on failure */
    assert_int_equal(kvs_kv_stream_open(t, L, 0, 0, &s), KVS_ERR_RANGE);
    assert_null(s);
    assert_string_equal(kvs_last_error(), "kv_stream: layer 2 outside the trace (layers 0..1)");
    assert_int_equal(kvs_kv_stream_open(t, -1, 0, 0, &s), KVS_ERR_RANGE);
    assert_string_equal(kvs_last_error(), "kv_stream: layer -1 outside the trace (layers 0..1)");
    assert_int_equal(kvs_kv_stream_open(t, 0, HKV, 0, &s), KVS_ERR_RANGE);
    assert_string_equal(kvs_last_error(), "kv_stream: kv head 2 outside the trace (kv heads 0..1)");
    assert_int_equal(kvs_kv_stream_open(t, 0, -3, 0, &s), KVS_ERR_RANGE);
    assert_string_equal(kvs_last_error(), "kv_stream: kv head -3 outside the trace (kv heads 0..1)");
    assert_int_equal(kvs_kv_stream_open(t, 0, 0, 0x10u, &s), KVS_ERR_INVALID_ARG);
    assert_string_equal(kvs_last_error(), "kv_stream: unknown flags 0x10 (known: 0x3)");
    assert_int_equal(kvs_kv_stream_open(NULL, 0, 0, 0, &s), KVS_ERR_INVALID_ARG);
    assert_string_equal(kvs_last_error(), "kv_stream: NULL trace");
    assert_int_equal(kvs_kv_stream_open(t, 0, 0, 0, NULL), KVS_ERR_INVALID_ARG);
    kvs_kv_pos kp;
    assert_int_equal(kvs_kv_stream_next(NULL, &kp), KVS_ERR_INVALID_ARG);
    assert_int_equal(kvs_kv_stream_open(t, 0, 0, 0, &s), KVS_OK);
    assert_int_equal(kvs_kv_stream_next(s, NULL), KVS_ERR_INVALID_ARG);
    kvs_kv_stream_free(s);
    kvs_kv_stream_free(NULL); /* accepts NULL */
    kvs_trace_close(t);
}

static uint8_t *read_all(const char *path, size_t *len) {
    char *buf = NULL;
    assert_int_equal(kvs_read_file(path, &buf, len), KVS_OK);
    return (uint8_t *)buf;
}

static void write_all(const char *path, const uint8_t *data, size_t len) {
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(data, 1, len, fp), len);
    assert_int_equal(fclose(fp), 0);
}

/* Streams every (layer, KV head) of `path` with full attention. @return 0 when the trace opens and every
 * stream runs to its end, 1 when the open fails, 2 when a stream fails (with the error's rules checked). */
static int stream_everything(const char *path) {
    kvs_trace *t = NULL;
    kvs_status st = kvs_trace_open(path, &t);
    if (st != KVS_OK) {
        assert_true(st < 0);
        assert_true(kvs_last_error()[0] != '\0');
        return 1;
    }
    int failed = 0;
    for (int l = 0; l < L; l++)
        for (int kh = 0; kh < HKV; kh++) {
            kvs_kv_stream *s = NULL;
            st = kvs_kv_stream_open(t, l, kh, KVS_KV_STREAM_SCORES, &s);
            if (st != KVS_OK) {
                failed = 2;
                continue;
            }
            kvs_kv_pos kp;
            int64_t n = 0;
            while ((st = kvs_kv_stream_next(s, &kp)) == KVS_OK) n++;
            if (st == KVS_ERR_END) {
                assert_int_equal(n, N);
            } else {
                failed = 2;
                assert_true(st == KVS_ERR_CHECKSUM || st == KVS_ERR_FORMAT || st == KVS_ERR_TRUNCATED ||
                            st == KVS_ERR_COMPRESS || st == KVS_ERR_IO);
                assert_true(kvs_last_error()[0] != '\0');
                assert_int_equal(kvs_kv_stream_next(s, &kp), KVS_ERR_STATE); /* no going on after an error */
            }
            kvs_kv_stream_free(s);
        }
    kvs_trace_close(t);
    return failed;
}

/* A flipped byte (about 500 offsets spread over the file; tests/test_trace.c flips every byte) is caught by
 * the open or by a stream, never a crash; a truncated file fails to open. */
static void test_corrupt_trace_is_an_error(void **state) {
    const fixture *f = *state;
    char bad[160];
    snprintf(bad, sizeof bad, "%s/bad.kvt", f->dir);
    size_t len = 0;
    uint8_t *orig = read_all(f->path, &len);
    assert_int_equal(stream_everything(f->path), 0);
    uint8_t *buf = malloc(len);
    assert_non_null(buf);
    int caught_by_stream = 0;
    size_t step = len / 500 | 1; /* odd: every byte position within words comes up */
    for (size_t off = 0; off < len; off += step) {
        memcpy(buf, orig, len);
        buf[off] ^= 0x20;
        write_all(bad, buf, len);
        int r = stream_everything(bad);
        if (r == 0) fail_msg("flipped byte at offset %zu of %zu not detected", off, len);
        caught_by_stream += r == 2;
    }
    assert_true(caught_by_stream > 0); /* chunk payloads are checked while streaming, not at open */
    write_all(bad, orig, len / 2);
    assert_int_equal(stream_everything(bad), 1);
    free(buf);
    free(orig);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_history_queries_and_roles),
        cmocka_unit_test(test_flags_match_turn_table),
        cmocka_unit_test(test_full_attention_matches_naive_and_kvs_attention),
        cmocka_unit_test(test_scores_flag_same_attention),
        cmocka_unit_test(test_recomputes_gen_trace_exactly),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_corrupt_trace_is_an_error),
    };
    return cmocka_run_group_tests(tests, fixture_setup, fixture_teardown);
}
