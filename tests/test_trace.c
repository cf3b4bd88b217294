/* test_trace.c — tests of the trace library (trace/trace.h, format trace/FORMAT.md): round trips of every
 * dtype with and without byte shuffle, block geometry, random access vs streaming, tokens/roles/turns,
 * config and call validation, truncation and bit-flip fuzzing (every byte of a small file), recovery from
 * prefixes of an unfinished file and from a writer killed with SIGKILL.
 * All data is GENERATED (tests/util/gen_trace.h), not a model's.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/kvs.h"
#include "tests/util/gen_trace.h"
#include "trace/trace.h"
#include "tests/util/testenv.h"

/* ------------------------------------------------------------------------------------------------
 * helpers
 * ---------------------------------------------------------------------------------------------- */

static float round_dt(kvs_dtype dt, float x) {
    uint8_t b[4];
    float y;
    kvs_encode(dt, &x, 1, b);
    kvs_decode(dt, b, 1, &y);
    return y;
}

static void assert_same_float(float want, float got) {
    uint32_t a, b;
    memcpy(&a, &want, 4);
    memcpy(&b, &got, 4);
    if (a != b) fail_msg("float mismatch: want %.9g (0x%08x), got %.9g (0x%08x)", (double)want, a, (double)got, b);
}

/* Compares a decoded block with the generated data, rounded to the storage dtype (lse stays fp32). */
static void check_block(const kvs_gen_trace *g, const kvs_trace_block *b, int max_positions) {
    const kvs_gen_trace_opts *o = &g->opt;
    kvs_dtype dt = o->dtype;
    size_t N = (size_t)o->n_positions, H = (size_t)o->n_heads, Hkv = (size_t)o->n_kv_heads, d = (size_t)o->head_dim;
    size_t G = (size_t)g->G, l = (size_t)b->layer, kh = (size_t)b->kv_head;
    int B = o->block_positions;
    assert_int_equal(b->first_pos, b->block * B);
    int want_n = max_positions - (int)b->first_pos < B ? max_positions - (int)b->first_pos : B;
    assert_int_equal(b->n_pos, want_n);
    assert_int_equal(b->group, G);
    assert_int_equal(b->head_dim, d);
    for (int i = 0; i < b->n_pos; i++) {
        size_t p = (size_t)b->first_pos + (size_t)i;
        for (size_t e = 0; e < d; e++) {
            assert_same_float(round_dt(dt, g->k[((l * N + p) * Hkv + kh) * d + e]), b->k[(size_t)i * d + e]);
            assert_same_float(round_dt(dt, g->v[((l * N + p) * Hkv + kh) * d + e]), b->v[(size_t)i * d + e]);
        }
        for (size_t gg = 0; gg < G; gg++) {
            size_t h = kh * G + gg;
            const float *so = kvs_gen_trace_stored_o(g, (int)l, (int64_t)p, (int)h);
            for (size_t e = 0; e < d; e++) {
                assert_same_float(round_dt(dt, g->q[((l * N + p) * H + h) * d + e]), b->q[((size_t)i * G + gg) * d + e]);
                assert_same_float(round_dt(dt, so[e]), b->o[((size_t)i * G + gg) * d + e]);
            }
            assert_same_float(g->lse[(l * N + p) * H + h], b->lse[(size_t)i * G + gg]);
        }
    }
}

/* Reads every stream of `path` and compares with g (the first max_positions positions). */
static void check_trace_data(const kvs_gen_trace *g, const char *path, int max_positions) {
    kvs_trace *t = NULL;
    assert_int_equal(kvs_trace_open(path, &t), KVS_OK);
    const kvs_trace_info *in = kvs_trace_info_get(t);
    assert_int_equal(in->n_positions, max_positions);
    for (int l = 0; l < g->opt.n_layers; l++)
        for (int kh = 0; kh < g->opt.n_kv_heads; kh++) {
            kvs_trace_stream *s = NULL;
            assert_int_equal(kvs_trace_stream_open(t, l, kh, &s), KVS_OK);
            const kvs_trace_block *b;
            int64_t n = 0, blocks = 0;
            kvs_status st;
            while ((st = kvs_trace_stream_next(s, &b)) == KVS_OK) {
                assert_int_equal(b->block, blocks);
                check_block(g, b, max_positions);
                n += b->n_pos;
                blocks++;
            }
            assert_int_equal(st, KVS_ERR_END);
            assert_int_equal(n, max_positions);
            assert_int_equal(blocks, in->n_blocks);
            kvs_trace_stream_free(s);
        }
    const int32_t *tok = kvs_trace_tokens(t);
    const uint8_t *roles = kvs_trace_roles(t);
    const int32_t *turn = kvs_trace_turn_of(t);
    for (int p = 0; p < max_positions; p++) {
        assert_int_equal(tok[p], g->tokens[p]);
        assert_int_equal(roles[p], g->roles[p]);
        assert_int_equal(turn[p], g->turn[p]);
    }
    kvs_trace_close(t);
}

static kvs_gen_trace *make_gen(kvs_gen_trace_opts o) {
    kvs_gen_trace *g = NULL;
    assert_int_equal(kvs_gen_trace_create(&o, &g), KVS_OK);
    return g;
}

/* ------------------------------------------------------------------------------------------------
 * round trips and geometry
 * ---------------------------------------------------------------------------------------------- */

static void test_roundtrip_every_dtype_and_shuffle(void **state) {
    kvs_test_tmp *c = *state;
    for (int dt = 0; dt < 3; dt++)
        for (int sh = 0; sh < 2; sh++) {
            kvs_gen_trace_opts o = kvs_gen_trace_defaults(); /* 40 positions, block 16: partial last block */
            o.dtype = (kvs_dtype)dt;
            o.flags = sh ? KVS_TRACE_FLAG_SHUFFLE : 0;
            o.seed = 100 + (uint64_t)(dt * 2 + sh);
            kvs_gen_trace *g = make_gen(o);
            assert_int_equal(kvs_gen_trace_write(g, c->path), KVS_OK);
            char partial[160];
            snprintf(partial, sizeof partial, "%s.partial", c->path);
            assert_false(kvs_test_exists(partial));
            check_trace_data(g, c->path, o.n_positions);
            kvs_trace *t = NULL;
            assert_int_equal(kvs_trace_open(c->path, &t), KVS_OK);
            const kvs_trace_info *in = kvs_trace_info_get(t);
            assert_int_equal(in->version, 1);
            assert_int_equal(in->capture.dtype, dt);
            assert_int_equal(in->capture.flags, o.flags);
            assert_int_equal(in->n_blocks, 3);
            assert_int_equal(in->n_chunks, 3 * (2 * 2 + 1));
            assert_string_equal(in->model.model_name, "generated-gaussian");
            assert_non_null(strstr(in->capture.settings, "source=generated"));
            assert_int_equal(in->model.n_heads, 4);
            assert_true(in->compressed_bytes > 0 && in->compressed_bytes < in->file_bytes);
            /* raw bytes as FORMAT.md defines them */
            uint64_t es = dt == 0 ? 4 : 2, G = 2, d = 16;
            uint64_t raw = 2 * 2 * (40 * (2 * G + 2) * d * es + 40 * G * 4) + 9 * 40;
            assert_int_equal(in->raw_bytes, raw);
            assert_int_equal(kvs_trace_check_chunks(t), KVS_OK);
            kvs_trace_close(t);
            kvs_gen_trace_free(g);
        }
}

static void test_block_positions_one(void **state) {
    kvs_test_tmp *c = *state;
    kvs_gen_trace_opts o = kvs_gen_trace_defaults();
    o.block_positions = 1;
    o.n_positions = 7;
    o.dtype = KVS_DTYPE_F16;
    kvs_gen_trace *g = make_gen(o);
    assert_int_equal(kvs_gen_trace_write(g, c->path), KVS_OK);
    check_trace_data(g, c->path, 7);
    kvs_trace *t = NULL;
    assert_int_equal(kvs_trace_open(c->path, &t), KVS_OK);
    assert_int_equal(kvs_trace_info_get(t)->n_blocks, 7);
    kvs_trace_close(t);
    kvs_gen_trace_free(g);
}

static void test_exact_multiple_of_block(void **state) {
    kvs_test_tmp *c = *state;
    kvs_gen_trace_opts o = kvs_gen_trace_defaults();
    o.n_positions = 32; /* exactly two full blocks of 16 */
    o.n_layers = 3;
    o.n_heads = 6;
    o.n_kv_heads = 3;
    o.dtype = KVS_DTYPE_BF16;
    kvs_gen_trace *g = make_gen(o);
    assert_int_equal(kvs_gen_trace_write(g, c->path), KVS_OK);
    check_trace_data(g, c->path, 32);
    kvs_gen_trace_free(g);
}

/* Compressing a block's chunks on a pool must not change a byte: pools of 1..5 workers (waves of up to 20
 * chunks over 5 layers x 3 KV heads = 15 groups, so both one partial wave and several waves occur), with
 * a partial last block, and a pool switched mid-trace. */
static void test_pool_compression_same_bytes(void **state) {
    kvs_test_tmp *c = *state;
    kvs_gen_trace_opts o = kvs_gen_trace_defaults();
    o.n_layers = 5;
    o.n_heads = 6;
    o.n_kv_heads = 3;
    o.n_positions = 45; /* blocks of 16: 16 + 16 + 13 */
    o.dtype = KVS_DTYPE_F16;
    kvs_gen_trace *g = make_gen(o);
    kvs_model_config m;
    kvs_capture_config cp;
    kvs_gen_trace_configs(g, &m, &cp);
    assert_int_equal(kvs_gen_trace_write(g, c->path), KVS_OK); /* reference: no pool */
    size_t ref_len = 0;
    uint8_t *ref = kvs_test_slurp(c->path, &ref_len);
    char other[160];
    kvs_test_tmp_path(c, "pooled.kvt", other, sizeof other);
    for (int n = 1; n <= 6; n++) {
        kvs_threadpool *pool = NULL, *pool2 = NULL;
        assert_int_equal(kvs_threadpool_create(n <= 5 ? n : 3, &pool), KVS_OK);
        assert_int_equal(kvs_threadpool_create(2, &pool2), KVS_OK);
        kvs_trace_writer *w = NULL;
        assert_int_equal(kvs_trace_writer_create(other, &m, &cp, &w), KVS_OK);
        assert_int_equal(kvs_trace_writer_set_threadpool(w, pool), KVS_OK);
        if (n == 6) { /* switch pools between blocks, then back to none */
            assert_int_equal(kvs_gen_trace_put(g, w, 0, 20), KVS_OK);
            assert_int_equal(kvs_trace_writer_set_threadpool(w, pool2), KVS_OK);
            assert_int_equal(kvs_gen_trace_put(g, w, 20, 35), KVS_OK);
            assert_int_equal(kvs_trace_writer_set_threadpool(w, NULL), KVS_OK);
            assert_int_equal(kvs_gen_trace_put(g, w, 35, 45), KVS_OK);
        } else {
            assert_int_equal(kvs_gen_trace_put(g, w, 0, 45), KVS_OK);
        }
        assert_int_equal(kvs_trace_writer_close(w), KVS_OK);
        kvs_trace_writer_free(w);
        kvs_threadpool_free(pool);
        kvs_threadpool_free(pool2);
        size_t len = 0;
        uint8_t *got = kvs_test_slurp(other, &len);
        assert_int_equal(len, ref_len);
        assert_memory_equal(got, ref, ref_len);
        free(got);
    }
    check_trace_data(g, other, 45);
    free(ref);
    kvs_gen_trace_free(g);
}

static void test_random_access_equals_streaming(void **state) {
    kvs_test_tmp *c = *state;
    kvs_gen_trace_opts o = kvs_gen_trace_defaults();
    o.n_positions = 70;
    o.block_positions = 8; /* 9 blocks, last has 6 */
    o.dtype = KVS_DTYPE_F16;
    kvs_gen_trace *g = make_gen(o);
    assert_int_equal(kvs_gen_trace_write(g, c->path), KVS_OK);
    kvs_trace *t = NULL;
    assert_int_equal(kvs_trace_open(c->path, &t), KVS_OK);
    const kvs_trace_info *in = kvs_trace_info_get(t);
    int nb = (int)in->n_blocks, L = o.n_layers, Hkv = o.n_kv_heads;
    size_t qn = 8 * 2 * 16, kn = 8 * 16, ln = 8 * 2;
    size_t per = 2 * qn + 2 * kn + ln;
    float *streamed = calloc((size_t)(L * Hkv * nb) * per, sizeof(float));
    int32_t *npos = calloc((size_t)(L * Hkv * nb), sizeof(int32_t));
    for (int l = 0; l < L; l++)
        for (int kh = 0; kh < Hkv; kh++) {
            kvs_trace_stream *s;
            assert_int_equal(kvs_trace_stream_open(t, l, kh, &s), KVS_OK);
            const kvs_trace_block *b;
            while (kvs_trace_stream_next(s, &b) == KVS_OK) {
                size_t slot = ((size_t)(l * Hkv + kh) * (size_t)nb + (size_t)b->block);
                float *dst = streamed + slot * per;
                npos[slot] = b->n_pos;
                memcpy(dst, b->q, (size_t)b->n_pos * 32 * sizeof(float));
                memcpy(dst + qn, b->o, (size_t)b->n_pos * 32 * sizeof(float));
                memcpy(dst + 2 * qn, b->k, (size_t)b->n_pos * 16 * sizeof(float));
                memcpy(dst + 2 * qn + kn, b->v, (size_t)b->n_pos * 16 * sizeof(float));
                memcpy(dst + 2 * qn + 2 * kn, b->lse, (size_t)b->n_pos * 2 * sizeof(float));
            }
            kvs_trace_stream_free(s);
        }
    /* a seeded random permutation of all (layer, kv head, block) triples */
    int n = L * Hkv * nb;
    int *perm = malloc((size_t)n * sizeof *perm);
    for (int i = 0; i < n; i++) perm[i] = i;
    uint64_t r = 12345;
    for (int i = n - 1; i > 0; i--) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        int j = (int)((r >> 33) % (uint64_t)(i + 1));
        int tmp = perm[i];
        perm[i] = perm[j];
        perm[j] = tmp;
    }
    kvs_trace_block *b = NULL;
    assert_int_equal(kvs_trace_block_create(t, &b), KVS_OK);
    for (int i = 0; i < n; i++) {
        int slot = perm[i], blk = slot % nb, lh = slot / nb;
        assert_int_equal(kvs_trace_read_block(t, lh / Hkv, lh % Hkv, blk, b), KVS_OK);
        assert_int_equal(b->n_pos, npos[slot]);
        assert_int_equal(b->layer, lh / Hkv);
        assert_int_equal(b->kv_head, lh % Hkv);
        const float *src = streamed + (size_t)slot * per;
        assert_memory_equal(b->q, src, (size_t)b->n_pos * 32 * sizeof(float));
        assert_memory_equal(b->o, src + qn, (size_t)b->n_pos * 32 * sizeof(float));
        assert_memory_equal(b->k, src + 2 * qn, (size_t)b->n_pos * 16 * sizeof(float));
        assert_memory_equal(b->v, src + 2 * qn + kn, (size_t)b->n_pos * 16 * sizeof(float));
        assert_memory_equal(b->lse, src + 2 * qn + 2 * kn, (size_t)b->n_pos * 2 * sizeof(float));
        check_block(g, b, 70);
    }
    /* out-of-range indices */
    assert_int_equal(kvs_trace_read_block(t, L, 0, 0, b), KVS_ERR_RANGE);
    assert_int_equal(kvs_trace_read_block(t, 0, Hkv, 0, b), KVS_ERR_RANGE);
    assert_int_equal(kvs_trace_read_block(t, 0, 0, nb, b), KVS_ERR_RANGE);
    assert_int_equal(kvs_trace_read_block(t, -1, 0, 0, b), KVS_ERR_RANGE);
    assert_non_null(strstr(kvs_last_error(), "outside the trace"));
    kvs_trace_stream *s = NULL;
    assert_int_equal(kvs_trace_stream_open(t, 0, Hkv, &s), KVS_ERR_RANGE);
    assert_null(s);
    kvs_trace_block_free(b);
    kvs_trace_block_free(NULL);
    kvs_trace_stream_free(NULL);
    free(perm);
    free(streamed);
    free(npos);
    kvs_trace_close(t);
    kvs_trace_close(NULL);
    kvs_gen_trace_free(g);
}

static void test_tokens_roles_turns_multi_turn(void **state) {
    kvs_test_tmp *c = *state;
    kvs_gen_trace_opts o = kvs_gen_trace_defaults();
    o.n_positions = 31;
    o.block_positions = 4;
    o.n_turns = 3; /* turns of 10, 10, 11 positions; each first half prompt */
    kvs_gen_trace *g = make_gen(o);
    assert_int_equal(kvs_gen_trace_write(g, c->path), KVS_OK);
    check_trace_data(g, c->path, 31);
    kvs_trace *t = NULL;
    assert_int_equal(kvs_trace_open(c->path, &t), KVS_OK);
    const kvs_trace_info *in = kvs_trace_info_get(t);
    assert_int_equal(in->n_turns, 3);
    int64_t want[3][3] = {{0, 5, 10}, {10, 15, 20}, {20, 26, 31}};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(in->turns[i].begin, want[i][0]);
        assert_int_equal(in->turns[i].prompt_end, want[i][1]);
        assert_int_equal(in->turns[i].end, want[i][2]);
    }
    assert_int_equal(in->prompt_len, 5);
    kvs_trace_close(t);
    kvs_gen_trace_free(g);

    /* single turn, all prompt: prompt_len = N; a turn with no prompt positions is allowed too */
    o = kvs_gen_trace_defaults();
    o.prompt_len = 40;
    g = make_gen(o);
    assert_int_equal(kvs_gen_trace_write(g, c->path), KVS_OK);
    assert_int_equal(kvs_trace_open(c->path, &t), KVS_OK);
    in = kvs_trace_info_get(t);
    assert_int_equal(in->prompt_len, 40);
    assert_int_equal(in->n_turns, 1);
    assert_int_equal(in->turns[0].prompt_end, 40);
    assert_int_equal(in->turns[0].end, 40);
    kvs_trace_close(t);
    kvs_gen_trace_free(g);
}

static void test_concurrent_streams_in_threads(void **state);

/* ------------------------------------------------------------------------------------------------
 * writer validation
 * ---------------------------------------------------------------------------------------------- */

static void expect_bad_config(const char *path, const kvs_model_config *m, const kvs_capture_config *cp,
                              const char *field) {
    kvs_trace_writer *w = (kvs_trace_writer *)1;
    assert_int_equal(kvs_trace_writer_create(path, m, cp, &w), KVS_ERR_INVALID_ARG);
    assert_null(w);
    if (!strstr(kvs_last_error(), field)) fail_msg("error '%s' does not name '%s'", kvs_last_error(), field);
}

static void test_writer_rejects_bad_config(void **state) {
    kvs_test_tmp *c = *state;
    kvs_gen_trace_opts o = kvs_gen_trace_defaults();
    kvs_gen_trace *g = make_gen(o);
    kvs_model_config m0, m;
    kvs_capture_config c0, cp;
    kvs_gen_trace_configs(g, &m0, &c0);
    m = m0, cp = c0;
    m.n_kv_heads = 3;
    expect_bad_config(c->path, &m, &cp, "n_kv_heads");
    m = m0, m.n_layers = 0;
    expect_bad_config(c->path, &m, &cp, "n_layers");
    m = m0, m.n_layers = KVS_TRACE_MAX_LAYERS + 1;
    expect_bad_config(c->path, &m, &cp, "n_layers");
    m = m0, m.head_dim = 2000;
    expect_bad_config(c->path, &m, &cp, "head_dim");
    m = m0, m.vocab_size = 0;
    expect_bad_config(c->path, &m, &cp, "vocab_size");
    m = m0, m.attn_scale = NAN;
    expect_bad_config(c->path, &m, &cp, "attn_scale");
    m = m0, m.rope_layout = 2;
    expect_bad_config(c->path, &m, &cp, "rope_layout");
    m = m0, memset(m.model_name, 'x', sizeof m.model_name);
    expect_bad_config(c->path, &m, &cp, "model_name");
    m = m0, cp.dtype = 3;
    expect_bad_config(c->path, &m, &cp, "dtype");
    cp = c0, cp.block_positions = 0;
    expect_bad_config(c->path, &m, &cp, "block_positions");
    cp = c0, cp.block_positions = KVS_TRACE_MAX_BLOCK + 1;
    expect_bad_config(c->path, &m, &cp, "block_positions");
    cp = c0, cp.flags = 4; /* bits 0 (shuffle) and 1 (lean record) are defined */
    expect_bad_config(c->path, &m, &cp, "flags");
    cp = c0, cp.max_new_tokens = -1;
    expect_bad_config(c->path, &m, &cp, "max_new_tokens");
    cp = c0, memset(cp.settings, 'a', sizeof cp.settings);
    expect_bad_config(c->path, &m, &cp, "settings");
    assert_false(kvs_test_exists(c->path));
    /* an unwritable destination is an I/O error */
    kvs_trace_writer *w = NULL;
    assert_int_equal(kvs_trace_writer_create("/nonexistent-dir/x.kvt", &m0, &c0, &w), KVS_ERR_IO);
    kvs_gen_trace_free(g);
}

static void test_writer_rejects_bad_calls(void **state) {
    kvs_test_tmp *c = *state;
    kvs_gen_trace_opts o = kvs_gen_trace_defaults();
    kvs_gen_trace *g = make_gen(o);
    kvs_model_config m;
    kvs_capture_config cp;
    kvs_gen_trace_configs(g, &m, &cp);
    kvs_trace_writer *w = NULL;
    assert_int_equal(kvs_trace_writer_create(c->path, &m, &cp, &w), KVS_OK);
    char partial[160];
    snprintf(partial, sizeof partial, "%s.partial", c->path);
    assert_true(kvs_test_exists(partial));
    const float *q = g->q, *k = g->k, *v = g->v, *ob = g->o, *lse = g->lse;
    assert_int_equal(kvs_trace_writer_close(w), KVS_ERR_STATE); /* no positions */
    assert_int_equal(kvs_trace_writer_put_layer(w, 0, q, k, v, ob, lse), KVS_ERR_STATE); /* not begun */
    assert_int_equal(kvs_trace_writer_end_position(w), KVS_ERR_STATE);
    assert_int_equal(kvs_trace_writer_begin_position(w, 1000, KVS_ROLE_PROMPT, 0), KVS_ERR_RANGE);
    assert_non_null(strstr(kvs_last_error(), "token id 1000"));
    assert_int_equal(kvs_trace_writer_begin_position(w, -1, KVS_ROLE_PROMPT, 0), KVS_ERR_RANGE);
    assert_int_equal(kvs_trace_writer_begin_position(w, 5, KVS_ROLE_PROMPT, 1), KVS_ERR_INVALID_ARG);
    assert_non_null(strstr(kvs_last_error(), "turn"));
    assert_int_equal(kvs_trace_writer_begin_position(w, 5, (kvs_role)7, 0), KVS_ERR_INVALID_ARG);
    assert_non_null(strstr(kvs_last_error(), "role"));
    assert_int_equal(kvs_trace_writer_begin_position(w, 5, KVS_ROLE_PROMPT, 0), KVS_OK);
    assert_int_equal(kvs_trace_writer_begin_position(w, 5, KVS_ROLE_PROMPT, 0), KVS_ERR_STATE);
    assert_int_equal(kvs_trace_writer_put_layer(w, 2, q, k, v, ob, lse), KVS_ERR_RANGE);
    assert_int_equal(kvs_trace_writer_put_layer(w, 0, q, k, v, ob, lse), KVS_OK);
    assert_int_equal(kvs_trace_writer_put_layer(w, 0, q, k, v, ob, lse), KVS_ERR_STATE);
    assert_non_null(strstr(kvs_last_error(), "layer 0 recorded twice"));
    assert_int_equal(kvs_trace_writer_end_position(w), KVS_ERR_STATE);
    assert_non_null(strstr(kvs_last_error(), "layer 1 was not recorded"));
    assert_int_equal(kvs_trace_writer_close(w), KVS_ERR_STATE); /* position still open */
    assert_int_equal(kvs_trace_writer_put_layer(w, 1, q, k, v, ob, lse), KVS_OK);
    assert_int_equal(kvs_trace_writer_end_position(w), KVS_OK);
    assert_int_equal(kvs_trace_writer_positions(w), 1);
    assert_int_equal(kvs_trace_writer_begin_position(w, 5, KVS_ROLE_GENERATED, 0), KVS_OK);
    assert_int_equal(kvs_trace_writer_put_layer(w, 0, q, k, v, ob, lse), KVS_OK);
    assert_int_equal(kvs_trace_writer_put_layer(w, 1, q, k, v, ob, lse), KVS_OK);
    assert_int_equal(kvs_trace_writer_end_position(w), KVS_OK);
    /* prompt after generated within the same turn; turn skipping 0 -> 2 */
    assert_int_equal(kvs_trace_writer_begin_position(w, 5, KVS_ROLE_PROMPT, 0), KVS_ERR_INVALID_ARG);
    assert_non_null(strstr(kvs_last_error(), "prompt position after a generated one"));
    assert_int_equal(kvs_trace_writer_begin_position(w, 5, KVS_ROLE_PROMPT, 2), KVS_ERR_INVALID_ARG);
    assert_int_equal(kvs_trace_writer_begin_position(w, 5, KVS_ROLE_PROMPT, 1), KVS_OK); /* new turn: fine */
    /* freeing an unclosed writer removes the .partial */
    kvs_trace_writer_free(w);
    assert_false(kvs_test_exists(partial));
    assert_false(kvs_test_exists(c->path));
    kvs_trace_writer_free(NULL);
    kvs_gen_trace_free(g);
}

/* ------------------------------------------------------------------------------------------------
 * corrupt input
 * ---------------------------------------------------------------------------------------------- */

/* A small file for exhaustive fuzzing: 2 layers, 1 KV head, 3 blocks. */
static kvs_gen_trace *small_gen(void) {
    kvs_gen_trace_opts o = kvs_gen_trace_defaults();
    o.n_layers = 2;
    o.n_heads = 2;
    o.n_kv_heads = 1;
    o.head_dim = 4;
    o.n_positions = 10;
    o.block_positions = 4;
    o.dtype = KVS_DTYPE_F16;
    o.vocab_size = 50;
    return make_gen(o);
}

static int is_corruption_status(kvs_status s) {
    return s == KVS_ERR_TRUNCATED || s == KVS_ERR_FORMAT || s == KVS_ERR_CHECKSUM || s == KVS_ERR_VERSION;
}

/* Opens `path` and reads everything; returns the first failure (KVS_OK if all of it is accepted). */
static kvs_status open_and_read_all(const char *path) {
    kvs_trace *t = NULL;
    kvs_status s = kvs_trace_open(path, &t);
    if (s != KVS_OK) return s;
    s = kvs_trace_check_chunks(t);
    kvs_trace_block *b = NULL;
    if (s == KVS_OK) s = kvs_trace_block_create(t, &b);
    const kvs_trace_info *in = kvs_trace_info_get(t);
    for (int l = 0; s == KVS_OK && l < in->model.n_layers; l++)
        for (int kh = 0; s == KVS_OK && kh < in->model.n_kv_heads; kh++)
            for (int64_t blk = 0; s == KVS_OK && blk < in->n_blocks; blk++) s = kvs_trace_read_block(t, l, kh, blk, b);
    kvs_trace_block_free(b);
    kvs_trace_close(t);
    return s;
}

static void test_open_rejects_missing_and_garbage(void **state) {
    kvs_test_tmp *c = *state;
    kvs_trace *t = (kvs_trace *)1;
    assert_int_equal(kvs_trace_open("/nonexistent/none.kvt", &t), KVS_ERR_IO);
    assert_null(t);
    assert_non_null(strstr(kvs_last_error(), "/nonexistent/none.kvt"));
    assert_int_equal(kvs_test_spit(c->path, (const uint8_t *)"", 0), 0);
    assert_int_equal(kvs_trace_open(c->path, &t), KVS_ERR_TRUNCATED);
    uint8_t junk[600];
    for (size_t i = 0; i < sizeof junk; i++) junk[i] = (uint8_t)(i * 37 + 11);
    assert_int_equal(kvs_test_spit(c->path, junk, sizeof junk), 0);
    assert_int_equal(kvs_trace_open(c->path, &t), KVS_ERR_FORMAT);
    assert_non_null(strstr(kvs_last_error(), "bad magic"));
    assert_int_equal(kvs_trace_open(c->dir, &t), KVS_ERR_IO); /* a directory */

    /* a valid file with version 2 (and a correct header CRC) */
    kvs_gen_trace *g = small_gen();
    assert_int_equal(kvs_gen_trace_write(g, c->path), KVS_OK);
    size_t len;
    uint8_t *buf = kvs_test_slurp(c->path, &len);
    uint32_t hs = kvs_get_u32(buf + 12);
    kvs_put_u32(buf + 8, 2);
    kvs_put_u32(buf + hs - 4, kvs_crc32(0, buf, hs - 4));
    assert_int_equal(kvs_test_spit(c->path, buf, len), 0);
    assert_int_equal(kvs_trace_open(c->path, &t), KVS_ERR_VERSION);
    assert_non_null(strstr(kvs_last_error(), "unsupported trace version 2"));
    /* a header field out of range with a correct CRC: n_kv_heads = 3 does not divide n_heads = 2 */
    kvs_put_u32(buf + 8, 1);
    kvs_put_u32(buf + 24, 3);
    kvs_put_u32(buf + hs - 4, kvs_crc32(0, buf, hs - 4));
    assert_int_equal(kvs_test_spit(c->path, buf, len), 0);
    assert_int_equal(kvs_trace_open(c->path, &t), KVS_ERR_FORMAT);
    assert_non_null(strstr(kvs_last_error(), "n_kv_heads"));
    free(buf);
    kvs_gen_trace_free(g);
}

static void test_truncated_files_fail_cleanly(void **state) {
    kvs_test_tmp *c = *state;
    kvs_gen_trace *g = small_gen();
    assert_int_equal(kvs_gen_trace_write(g, c->path), KVS_OK);
    size_t len;
    uint8_t *buf = kvs_test_slurp(c->path, &len);
    char cut[160];
    kvs_test_tmp_path(c, "cut.kvt", cut, sizeof cut);
    assert_int_equal(open_and_read_all(c->path), KVS_OK);
    int n_cuts = 0;
    for (size_t n = 0; n < len; n++) { /* every byte */
        assert_int_equal(kvs_test_spit(cut, buf, n), 0);
        kvs_status s = open_and_read_all(cut);
        if (!is_corruption_status(s))
            fail_msg("file cut at %zu of %zu bytes: status %d (%s), expected truncated/format/checksum", n, len, s,
                     kvs_last_error());
        n_cuts++;
    }
    assert_true(n_cuts > 200);
    free(buf);
    kvs_gen_trace_free(g);
}

static void test_flipped_bytes_detected(void **state) {
    kvs_test_tmp *c = *state;
    kvs_gen_trace *g = small_gen();
    assert_int_equal(kvs_gen_trace_write(g, c->path), KVS_OK);
    size_t len;
    uint8_t *buf = kvs_test_slurp(c->path, &len);
    uint32_t header_size = kvs_get_u32(buf + 12);
    uint64_t footer_off = kvs_get_u64(buf + len - 32);
    char bad[160];
    kvs_test_tmp_path(c, "flip.kvt", bad, sizeof bad);
    int regions[4] = {0, 0, 0, 0}; /* header, chunks, footer, trailer */
    static const uint8_t masks[3] = {0x01, 0x80, 0xFF};
    for (size_t off = 0; off < len; off++) { /* every byte, three different flips */
        for (int mi = 0; mi < 3; mi++) {
            buf[off] ^= masks[mi];
            assert_int_equal(kvs_test_spit(bad, buf, len), 0);
            buf[off] ^= masks[mi];
            kvs_status s = open_and_read_all(bad);
            if (!is_corruption_status(s))
                fail_msg("byte %zu ^ 0x%02x of %zu: status %d (%s): not detected", off, masks[mi], len, s,
                         kvs_last_error());
        }
        regions[off < header_size ? 0 : off < footer_off ? 1 : off < len - 32 ? 2 : 3]++;
    }
    for (int r = 0; r < 4; r++) assert_true(regions[r] > 0);
    free(buf);
    kvs_gen_trace_free(g);
}

static void test_corrupt_chunk_is_named(void **state) {
    kvs_test_tmp *c = *state;
    kvs_gen_trace *g = small_gen();
    assert_int_equal(kvs_gen_trace_write(g, c->path), KVS_OK);
    size_t len;
    uint8_t *buf = kvs_test_slurp(c->path, &len);
    /* the first chunk is block 0's tokens chunk; the second is (layer 0, kv head 0, block 0); the third
     * (layer 1, kv head 0, block 0): corrupt a byte of the third one's payload */
    uint64_t off = kvs_get_u32(buf + 12);
    for (int i = 0; i < 2; i++) off += 56 + kvs_get_u64(buf + off + 40);
    assert_memory_equal(buf + off, "KVCK", 4);
    assert_int_equal(kvs_get_u32(buf + off + 8), 1); /* layer 1 */
    buf[off + 56 + 3] ^= 0x10;
    assert_int_equal(kvs_test_spit(c->path, buf, len), 0);
    kvs_trace *t = NULL;
    assert_int_equal(kvs_trace_open(c->path, &t), KVS_OK); /* payloads are checked when read */
    assert_int_equal(kvs_trace_check_chunks(t), KVS_ERR_CHECKSUM);
    const char *e = kvs_last_error();
    if (!strstr(e, "chunk (layer 1, kv head 0, block 0): payload checksum mismatch") || !strstr(e, c->path))
        fail_msg("unexpected message: %s", e);
    kvs_trace_block *b = NULL;
    assert_int_equal(kvs_trace_block_create(t, &b), KVS_OK);
    assert_int_equal(kvs_trace_read_block(t, 0, 0, 0, b), KVS_OK);
    assert_int_equal(kvs_trace_read_block(t, 1, 0, 0, b), KVS_ERR_CHECKSUM);
    kvs_trace_block_free(b);
    kvs_trace_close(t);
    free(buf);
    kvs_gen_trace_free(g);
}

/* ------------------------------------------------------------------------------------------------
 * recovery
 * ---------------------------------------------------------------------------------------------- */

static void test_recover_from_every_prefix(void **state) {
    kvs_test_tmp *c = *state;
    kvs_gen_trace *g = small_gen(); /* 10 positions, blocks of 4: two full blocks, then 2 */
    kvs_model_config m;
    kvs_capture_config cp;
    kvs_gen_trace_configs(g, &m, &cp);
    kvs_trace_writer *w = NULL;
    assert_int_equal(kvs_trace_writer_create(c->path, &m, &cp, &w), KVS_OK);
    uint64_t block_end[3];
    int nbe = 0;
    for (int p = 0; p < 10; p++) {
        assert_int_equal(kvs_gen_trace_put(g, w, p, p + 1), KVS_OK);
        if ((p + 1) % 4 == 0) block_end[nbe++] = kvs_trace_writer_bytes(w);
    }
    char partial[160], cut[160], rec[160];
    snprintf(partial, sizeof partial, "%s.partial", c->path);
    kvs_test_tmp_path(c, "cut.kvt.partial", cut, sizeof cut);
    kvs_test_tmp_path(c, "rec.kvt", rec, sizeof rec);
    size_t len;
    uint8_t *buf = kvs_test_slurp(partial, &len); /* what a kill now would leave: header + 2 full blocks */
    assert_int_equal(len, block_end[1]);
    uint32_t header_size = kvs_get_u32(buf + 12);
    for (size_t n = 0; n <= len; n++) { /* every cut point */
        assert_int_equal(kvs_test_spit(cut, buf, n), 0);
        int64_t got = -1;
        kvs_status s = kvs_trace_recover(cut, rec, &got);
        int want_blocks = n >= block_end[1] ? 2 : n >= block_end[0] ? 1 : 0;
        if (n < header_size) {
            assert_int_equal(s, KVS_ERR_FORMAT);
        } else if (want_blocks == 0) {
            if (s != KVS_ERR_TRUNCATED) fail_msg("cut %zu: status %d (%s)", n, s, kvs_last_error());
            assert_non_null(strstr(kvs_last_error(), "no complete block"));
        } else {
            if (s != KVS_OK) fail_msg("cut %zu: status %d (%s)", n, s, kvs_last_error());
            assert_int_equal(got, 4 * want_blocks);
            if (n == block_end[0] || n == block_end[1] || n == len - 1) check_trace_data(g, rec, 4 * want_blocks);
            else {
                kvs_trace *t = NULL;
                assert_int_equal(kvs_trace_open(rec, &t), KVS_OK);
                assert_int_equal(kvs_trace_info_get(t)->n_positions, 4 * want_blocks);
                kvs_trace_close(t);
            }
        }
        char recp[200];
        snprintf(recp, sizeof recp, "%s.partial", rec);
        assert_false(kvs_test_exists(recp));
    }
    /* closing writes the partial last block; recovering the complete file reproduces it byte for byte */
    assert_int_equal(kvs_trace_writer_close(w), KVS_OK);
    kvs_trace_writer_free(w);
    int64_t got = 0;
    assert_int_equal(kvs_trace_recover(c->path, rec, &got), KVS_OK);
    assert_int_equal(got, 10);
    size_t l1, l2;
    uint8_t *a = kvs_test_slurp(c->path, &l1), *b = kvs_test_slurp(rec, &l2);
    assert_int_equal(l1, l2);
    assert_memory_equal(a, b, l1);
    free(a);
    free(b);
    assert_int_equal(kvs_trace_recover("/nonexistent/x", rec, &got), KVS_ERR_IO);
    free(buf);
    kvs_gen_trace_free(g);
}

static void test_recover_after_sigkill(void **state) {
    kvs_test_tmp *c = *state;
    kvs_gen_trace_opts o = kvs_gen_trace_defaults();
    o.n_positions = 60;
    o.block_positions = 8;
    o.dtype = KVS_DTYPE_BF16;
    kvs_gen_trace *g = make_gen(o);
    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) { /* child: the capture that gets killed */
        close(pfd[0]);
        kvs_model_config m;
        kvs_capture_config cp;
        kvs_gen_trace_configs(g, &m, &cp);
        kvs_trace_writer *w = NULL;
        if (kvs_trace_writer_create(c->path, &m, &cp, &w) != KVS_OK) _exit(3);
        /* 3 full blocks and 5 positions of the 4th, then a position begun with one layer */
        if (kvs_gen_trace_put(g, w, 0, 29) != KVS_OK) _exit(4);
        if (kvs_trace_writer_begin_position(w, g->tokens[29], (kvs_role)g->roles[29], g->turn[29]) != KVS_OK) _exit(5);
        if (kvs_trace_writer_put_layer(w, 0, g->q, g->k, g->v, g->o, g->lse) != KVS_OK) _exit(6);
        if (write(pfd[1], "r", 1) != 1) _exit(7);
        for (;;) pause(); /* mid-capture when the SIGKILL arrives */
    }
    close(pfd[1]);
    char ch = 0;
    assert_int_equal(read(pfd[0], &ch, 1), 1);
    close(pfd[0]);
    assert_int_equal(kill(pid, SIGKILL), 0);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    char partial[160], rec[160];
    snprintf(partial, sizeof partial, "%s.partial", c->path);
    kvs_test_tmp_path(c, "rec.kvt", rec, sizeof rec);
    assert_false(kvs_test_exists(c->path));
    assert_true(kvs_test_exists(partial));
    /* the unfinished file itself is refused with a hint */
    kvs_trace *t = NULL;
    assert_int_equal(kvs_trace_open(partial, &t), KVS_ERR_TRUNCATED);
    assert_non_null(strstr(kvs_last_error(), "recover"));
    int64_t got = 0;
    assert_int_equal(kvs_trace_recover(partial, rec, &got), KVS_OK);
    assert_int_equal(got, 24);
    check_trace_data(g, rec, 24);
    kvs_gen_trace_free(g);
}

/* ------------------------------------------------------------------------------------------------
 * concurrency: threads reading different streams of one kvs_trace
 * ---------------------------------------------------------------------------------------------- */

typedef struct {
    const kvs_trace *t;
    const kvs_gen_trace *g;
    int layer, kv_head;
    int errors;
} stream_arg;

static void *read_stream_thread(void *p) {
    stream_arg *a = p;
    kvs_trace_stream *s = NULL;
    if (kvs_trace_stream_open(a->t, a->layer, a->kv_head, &s) != KVS_OK) {
        a->errors++;
        return NULL;
    }
    const kvs_trace_block *b;
    size_t N = (size_t)a->g->opt.n_positions, Hkv = (size_t)a->g->opt.n_kv_heads, d = (size_t)a->g->opt.head_dim;
    kvs_status st;
    for (int rep = 0; rep < 1; rep++)
        while ((st = kvs_trace_stream_next(s, &b)) == KVS_OK)
            for (int i = 0; i < b->n_pos; i++)
                for (size_t e = 0; e < d; e++) {
                    size_t p2 = (size_t)b->first_pos + (size_t)i;
                    float want = a->g->k[(((size_t)a->layer * N + p2) * Hkv + (size_t)a->kv_head) * d + e];
                    if (b->k[(size_t)i * d + e] != want) a->errors++;
                }
    if (st != KVS_ERR_END) a->errors++;
    kvs_trace_stream_free(s);
    return NULL;
}

static void test_concurrent_streams_in_threads(void **state) {
    kvs_test_tmp *c = *state;
    kvs_gen_trace_opts o = kvs_gen_trace_defaults();
    o.n_layers = 3;
    o.n_heads = 8;
    o.n_kv_heads = 4;
    o.n_positions = 100;
    kvs_gen_trace *g = make_gen(o); /* fp32: exact comparison */
    assert_int_equal(kvs_gen_trace_write(g, c->path), KVS_OK);
    kvs_trace *t = NULL;
    assert_int_equal(kvs_trace_open(c->path, &t), KVS_OK);
    stream_arg args[12];
    pthread_t th[12];
    for (int i = 0; i < 12; i++) {
        args[i] = (stream_arg){.t = t, .g = g, .layer = i / 4, .kv_head = i % 4};
        assert_int_equal(pthread_create(&th[i], NULL, read_stream_thread, &args[i]), 0);
    }
    for (int i = 0; i < 12; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(args[i].errors, 0);
    }
    kvs_trace_close(t);
    kvs_gen_trace_free(g);
}

/* A FIFO or other non-regular path is refused at once with a clear error, never waited on (opening a FIFO for
 * reading blocks until a writer comes); "-" says that standard input is not a trace. Run in a child that an alarm
 * kills if the open hangs. */
static void test_fifo_and_dash_refused_without_waiting(void **state) {
    kvs_test_tmp *c = *state;
    char fifo[160];
    kvs_test_tmp_path(c, "pipe.kvt", fifo, sizeof fifo);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        alarm(10);
        kvs_trace *t = NULL;
        int ok = kvs_trace_open(fifo, &t) == KVS_ERR_IO && strstr(kvs_last_error(), "not a regular file") &&
                 kvs_trace_open("-", &t) == KVS_ERR_IO && strstr(kvs_last_error(), "standard input");
        _exit(ok ? 0 : 1);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (WIFSIGNALED(status)) fail_msg("kvs_trace_open on a FIFO did not return (signal %d)", WTERMSIG(status));
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_roundtrip_every_dtype_and_shuffle, kvs_test_tmp_setup, kvs_test_tmp_teardown),
        cmocka_unit_test_setup_teardown(test_block_positions_one, kvs_test_tmp_setup, kvs_test_tmp_teardown),
        cmocka_unit_test_setup_teardown(test_exact_multiple_of_block, kvs_test_tmp_setup, kvs_test_tmp_teardown),
        cmocka_unit_test_setup_teardown(test_pool_compression_same_bytes, kvs_test_tmp_setup, kvs_test_tmp_teardown),
        cmocka_unit_test_setup_teardown(test_random_access_equals_streaming, kvs_test_tmp_setup, kvs_test_tmp_teardown),
        cmocka_unit_test_setup_teardown(test_tokens_roles_turns_multi_turn, kvs_test_tmp_setup, kvs_test_tmp_teardown),
        cmocka_unit_test_setup_teardown(test_writer_rejects_bad_config, kvs_test_tmp_setup, kvs_test_tmp_teardown),
        cmocka_unit_test_setup_teardown(test_writer_rejects_bad_calls, kvs_test_tmp_setup, kvs_test_tmp_teardown),
        cmocka_unit_test_setup_teardown(test_open_rejects_missing_and_garbage, kvs_test_tmp_setup, kvs_test_tmp_teardown),
        cmocka_unit_test_setup_teardown(test_truncated_files_fail_cleanly, kvs_test_tmp_setup, kvs_test_tmp_teardown),
        cmocka_unit_test_setup_teardown(test_flipped_bytes_detected, kvs_test_tmp_setup, kvs_test_tmp_teardown),
        cmocka_unit_test_setup_teardown(test_corrupt_chunk_is_named, kvs_test_tmp_setup, kvs_test_tmp_teardown),
        cmocka_unit_test_setup_teardown(test_recover_from_every_prefix, kvs_test_tmp_setup, kvs_test_tmp_teardown),
        cmocka_unit_test_setup_teardown(test_recover_after_sigkill, kvs_test_tmp_setup, kvs_test_tmp_teardown),
        cmocka_unit_test_setup_teardown(test_concurrent_streams_in_threads, kvs_test_tmp_setup, kvs_test_tmp_teardown),
        cmocka_unit_test_setup_teardown(test_fifo_and_dash_refused_without_waiting, kvs_test_tmp_setup,
                                        kvs_test_tmp_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
