/* bench_trace.c — throughput and compression ratio of the trace writer and reader (trace/trace.h,
 * format trace/FORMAT.md) for fp16 / bf16 / fp32 storage, with and without byte shuffle, and the trace bytes per
 * position per layer of real captures (trace/FORMAT.md "Trace bytes per position per layer").
 *
 * Data sources, each labelled in the output: GENERATED Gaussian numbers (8 layers x 8 KV heads, G = 4,
 * d = 64, 1024 positions: "generated data (not a model's)") for throughput on a sizeable volume, then a
 * trace captured from a real model (KVSIM_BENCH_TRACE, else the bundled examples/stories260K.kvt) whose
 * q/k/v/o/lse and tokens are decoded and re-encoded in every configuration, for the compression ratio of
 * real activations.
 *
 * Reported per configuration: write MB/s (create + put every position + close with fsync), read MB/s
 * (open + stream every (layer, KV head) group in one thread, decoded to fp32), both in MB of fp32-equivalent
 * raw data and of stored-dtype raw payload, and raw / compressed payload bytes; first, the speed of the fp16/bf16
 * conversions alone.
 *
 * Trace bytes (the table "bytes per position per layer"): for the bundled trace and traces captured here from
 * each real model in ../shared/models (stories260K llama2.c, tinystories-656K HF) and from a Llama-shaped
 * random-weight HF checkpoint (bench/gen_llama_checkpoint.py, run with /usr/bin/python3 when it has numpy, or
 * KVSIM_BENCH_LLAMA=DIR; speed-only weights, labelled so), the compressed chunk payload of kvsim's chunks in
 * the full and the lean (--record qkv) record, with the one-shot zstd coding of earlier writers and with the
 * byte planes as zstd blocks (FORMAT.md), against plain libzstd level 3 and level 19 (what `zstd -3` / `zstd -19`
 * use) of the same raw arrays: the chunks' uncompressed payloads, unshuffled, in file order, as one stream.
 * Also the coding's own speed: compression and decompression MB/s of every chunk payload, one-shot vs planes.
 * A benchmark, not a test: numbers go to stdout and nothing is asserted.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zstd.h>

#include "common/kvs.h"
#include "gpu_capture/capture.h"
#include "trace/trace.h"

#define CHECK(expr)                                                                                          \
    do {                                                                                                     \
        kvs_status st_ = (expr);                                                                             \
        if (st_ != KVS_OK) {                                                                                 \
            fprintf(stderr, "bench_trace: %s failed: %s (%s)\n", #expr, kvs_strerror(st_), kvs_last_error()); \
            exit(1);                                                                                         \
        }                                                                                                    \
    } while (0)

/* Source data, fp32: q/o [N][L][H][d], k/v [N][L][Hkv][d], lse [N][L][H]. */
typedef struct {
    kvs_model_config model;
    int L, H, Hkv, d;
    int64_t N;
    float *q, *k, *v, *o, *lse;
    int32_t *tokens, *turn;
    uint8_t *roles;
    const char *label;
    kvs_dtype dtype;        /* storage dtype of a real trace's values (the bytes table writes them in it) */
    kvs_capture_config cap; /* a real trace's capture config */
} source;

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "bench_trace: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

static void alloc_source(source *s) {
    size_t N = (size_t)s->N, L = (size_t)s->L, H = (size_t)s->H, Hkv = (size_t)s->Hkv, d = (size_t)s->d;
    s->q = xmalloc(N * L * H * d * sizeof(float));
    s->o = xmalloc(N * L * H * d * sizeof(float));
    s->k = xmalloc(N * L * Hkv * d * sizeof(float));
    s->v = xmalloc(N * L * Hkv * d * sizeof(float));
    s->lse = xmalloc(N * L * H * sizeof(float));
    s->tokens = xmalloc(N * sizeof(int32_t));
    s->turn = xmalloc(N * sizeof(int32_t));
    s->roles = xmalloc(N);
}

static uint64_t rng_next(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static float gauss(uint64_t *x) {
    double u1 = ((double)(rng_next(x) >> 11) + 0.5) / 9007199254740992.0;
    double u2 = ((double)(rng_next(x) >> 11) + 0.5) / 9007199254740992.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static void generated_source(source *s) {
    memset(s, 0, sizeof *s);
    s->L = 8, s->H = 32, s->Hkv = 8, s->d = 64, s->N = 1024;
    s->label = "generated data (not a model's): Gaussian q/k/v/o, 8 layers x 8 KV heads, G=4, d=64, 1024 positions";
    kvs_model_config *m = &s->model;
    m->n_layers = s->L, m->n_heads = s->H, m->n_kv_heads = s->Hkv, m->head_dim = s->d;
    m->dim = s->H * s->d, m->hidden_dim = 4 * m->dim, m->vocab_size = 32000, m->max_seq_len = 4096;
    m->rope_theta = 10000.0f, m->norm_eps = 1e-5f, m->attn_scale = 1.0f / 8.0f;
    snprintf(m->model_name, sizeof m->model_name, "generated-gaussian");
    alloc_source(s);
    uint64_t x = 42;
    size_t nq = (size_t)s->N * (size_t)(s->L * s->H * s->d), nk = (size_t)s->N * (size_t)(s->L * s->Hkv * s->d);
    for (size_t i = 0; i < nq; i++) s->q[i] = gauss(&x);
    for (size_t i = 0; i < nq; i++) s->o[i] = 0.3f * gauss(&x);
    for (size_t i = 0; i < nk; i++) s->k[i] = gauss(&x);
    for (size_t i = 0; i < nk; i++) s->v[i] = gauss(&x);
    for (size_t i = 0; i < (size_t)s->N * (size_t)(s->L * s->H); i++) s->lse[i] = 3.0f + gauss(&x);
    for (int64_t p = 0; p < s->N; p++) {
        s->tokens[p] = (int32_t)(rng_next(&x) % 32000);
        s->turn[p] = 0;
        s->roles[p] = p < s->N / 2 ? KVS_ROLE_PROMPT : KVS_ROLE_GENERATED;
    }
}

static void trace_source(source *s, const char *path) {
    memset(s, 0, sizeof *s);
    kvs_trace *t = NULL;
    CHECK(kvs_trace_open(path, &t));
    const kvs_trace_info *in = kvs_trace_info_get(t);
    s->model = in->model;
    s->L = in->model.n_layers, s->H = in->model.n_heads, s->Hkv = in->model.n_kv_heads, s->d = in->model.head_dim;
    s->N = in->n_positions;
    s->dtype = (kvs_dtype)in->capture.dtype;
    s->cap = in->capture;
    static char label[600];
    snprintf(label, sizeof label, "real trace %.300s (model %s, stored as %s): %d layers x %d KV heads, G=%d, d=%d, %lld "
             "positions", path, in->model.model_name, kvs_dtype_name((kvs_dtype)in->capture.dtype), s->L, s->Hkv,
             s->H / s->Hkv, s->d, (long long)s->N);
    s->label = label;
    alloc_source(s);
    size_t N = (size_t)s->N, L = (size_t)s->L, H = (size_t)s->H, Hkv = (size_t)s->Hkv, d = (size_t)s->d;
    size_t G = H / Hkv;
    memcpy(s->tokens, kvs_trace_tokens(t), N * sizeof(int32_t));
    memcpy(s->turn, kvs_trace_turn_of(t), N * sizeof(int32_t));
    memcpy(s->roles, kvs_trace_roles(t), N);
    kvs_trace_block *b = NULL;
    CHECK(kvs_trace_block_create(t, &b));
    for (size_t l = 0; l < L; l++)
        for (size_t kh = 0; kh < Hkv; kh++)
            for (int64_t blk = 0; blk < in->n_blocks; blk++) {
                CHECK(kvs_trace_read_block(t, (int)l, (int)kh, blk, b));
                for (int32_t i = 0; i < b->n_pos; i++) {
                    size_t p = (size_t)b->first_pos + (size_t)i;
                    memcpy(s->k + ((p * L + l) * Hkv + kh) * d, b->k + (size_t)i * d, d * sizeof(float));
                    memcpy(s->v + ((p * L + l) * Hkv + kh) * d, b->v + (size_t)i * d, d * sizeof(float));
                    for (size_t g = 0; g < G; g++) {
                        size_t h = kh * G + g;
                        memcpy(s->q + ((p * L + l) * H + h) * d, b->q + ((size_t)i * G + g) * d, d * sizeof(float));
                        memcpy(s->o + ((p * L + l) * H + h) * d, b->o + ((size_t)i * G + g) * d, d * sizeof(float));
                        s->lse[(p * L + l) * H + h] = b->lse[(size_t)i * G + g];
                    }
                }
            }
    kvs_trace_block_free(b);
    kvs_trace_close(t);
}

static void run_config(const source *s, const char *path, kvs_dtype dt, int shuffle, int planes, kvs_threadpool *pool) {
    kvs_capture_config cap;
    memset(&cap, 0, sizeof cap);
    cap.dtype = (int32_t)dt;
    cap.block_positions = KVS_TRACE_DEFAULT_BLOCK;
    cap.flags = shuffle ? KVS_TRACE_FLAG_SHUFFLE : 0;
    snprintf(cap.settings, sizeof cap.settings, "source=bench_trace");
    size_t L = (size_t)s->L, H = (size_t)s->H, Hkv = (size_t)s->Hkv, d = (size_t)s->d;
    double t0 = kvs_now_s();
    kvs_trace_writer *w = NULL;
    CHECK(kvs_trace_writer_create(path, &s->model, &cap, &w));
    CHECK(kvs_trace_writer_set_threadpool(w, pool));
    CHECK(kvs_trace_writer_set_plane_blocks(w, planes));
    for (int64_t p = 0; p < s->N; p++) {
        CHECK(kvs_trace_writer_begin_position(w, s->tokens[p], (kvs_role)s->roles[p], s->turn[p]));
        for (size_t l = 0; l < L; l++) {
            size_t pl = (size_t)p * L + l;
            CHECK(kvs_trace_writer_put_layer(w, (int)l, s->q + pl * H * d, s->k + pl * Hkv * d, s->v + pl * Hkv * d,
                                             s->o + pl * H * d, s->lse + pl * H));
        }
        CHECK(kvs_trace_writer_end_position(w));
    }
    CHECK(kvs_trace_writer_close(w));
    kvs_trace_writer_free(w);
    double t_write = kvs_now_s() - t0;

    t0 = kvs_now_s();
    kvs_trace *t = NULL;
    CHECK(kvs_trace_open(path, &t));
    double checksum = 0;
    for (int l = 0; l < s->L; l++)
        for (int kh = 0; kh < s->Hkv; kh++) {
            kvs_trace_stream *st = NULL;
            CHECK(kvs_trace_stream_open(t, l, kh, &st));
            const kvs_trace_block *b;
            kvs_status rs;
            while ((rs = kvs_trace_stream_next(st, &b)) == KVS_OK) checksum += b->k[0] + b->o[0];
            if (rs != KVS_ERR_END) CHECK(rs);
            kvs_trace_stream_free(st);
        }
    double t_read = kvs_now_s() - t0;
    const kvs_trace_info *in = kvs_trace_info_get(t);
    double es = (double)kvs_dtype_size(dt);
    /* fp32-equivalent bytes: q, k, v, o at 4 bytes + lse + tokens (what the raw payload would be in fp32) */
    double stored = (double)in->raw_bytes;
    double elems = (double)s->N * (double)L * ((double)Hkv * (2.0 * (double)(H / Hkv) + 2.0) * (double)d);
    double fp32eq = stored + elems * (4.0 - es);
    double mb = 1e6;
    printf("%-5s shuffle %-3s%s %2d thr | write %7.1f MB/s fp32-eq %7.1f MB/s stored | read %7.1f MB/s fp32-eq %7.1f MB/s "
           "stored | ratio %.3f (raw %.1f MB / compressed %.1f MB) [chk %.3g]\n",
           kvs_dtype_name(dt), shuffle ? "on" : "off", shuffle ? (planes ? " planes" : " 1-shot") : "       ",
           kvs_threadpool_size(pool), fp32eq / mb / t_write, stored / mb / t_write,
           fp32eq / mb / t_read, stored / mb / t_read, stored / (double)in->compressed_bytes, stored / mb,
           (double)in->compressed_bytes / mb, checksum);
    kvs_trace_close(t);
    unlink(path);
}

static void free_source(source *s) {
    free(s->q);
    free(s->k);
    free(s->v);
    free(s->o);
    free(s->lse);
    free(s->tokens);
    free(s->turn);
    free(s->roles);
}

static void bench_source(source *s, const char *path) {
    printf("bench_trace: %s\n", s->label);
    printf("bench_trace: block %d positions, zstd level 3; write includes fsync; 'thr' = compression threads "
           "(reading is one thread)\n", KVS_TRACE_DEFAULT_BLOCK);
    static const kvs_dtype dts[3] = {KVS_DTYPE_F16, KVS_DTYPE_BF16, KVS_DTYPE_F32};
    for (int i = 0; i < 3; i++) {
        run_config(s, path, dts[i], 1, 1, NULL);
        run_config(s, path, dts[i], 1, 0, NULL);
        run_config(s, path, dts[i], 0, 0, NULL);
    }
    /* the writer compressing each block's chunks on a pool of every core (the file is byte-identical) */
    if (kvs_n_cpus() > 1) {
        kvs_threadpool *pool = NULL;
        CHECK(kvs_threadpool_create(kvs_n_cpus(), &pool));
        for (int i = 0; i < 2; i++) run_config(s, path, dts[i], 1, 1, pool);
        kvs_threadpool_free(pool);
    }
    free_source(s);
}

/* ------------------------------------------------------------------------------------------------
 * Trace bytes per position per layer
 * ---------------------------------------------------------------------------------------------- */

/* Writes `s` (its own dtype, block 64, shuffle on, one thread) with the given record and coding; returns the
 * compressed payload bytes of its chunks (what the coding decides; the file adds 56-byte chunk headers and the
 * index). *mbps receives [0] the write speed and [1] the read speed (every stream, q/k/v/o/lse decoded to fp32;
 * o/lse not recomputed for a lean record), in MB of raw payload per second. */
static uint64_t write_variant(const source *s, const char *path, int lean, int planes, double *mbps) {
    kvs_capture_config cap = s->cap;
    cap.block_positions = KVS_TRACE_DEFAULT_BLOCK;
    cap.flags = KVS_TRACE_FLAG_SHUFFLE | (lean ? KVS_TRACE_FLAG_QKV : 0u);
    size_t L = (size_t)s->L, H = (size_t)s->H, Hkv = (size_t)s->Hkv, d = (size_t)s->d;
    kvs_trace_writer *w = NULL;
    double t0 = kvs_now_s();
    CHECK(kvs_trace_writer_create(path, &s->model, &cap, &w));
    CHECK(kvs_trace_writer_set_plane_blocks(w, planes));
    for (int64_t p = 0; p < s->N; p++) {
        CHECK(kvs_trace_writer_begin_position(w, s->tokens[p], (kvs_role)s->roles[p], s->turn[p]));
        for (size_t l = 0; l < L; l++) {
            size_t pl = (size_t)p * L + l;
            CHECK(kvs_trace_writer_put_layer(w, (int)l, s->q + pl * H * d, s->k + pl * Hkv * d, s->v + pl * Hkv * d,
                                             s->o + pl * H * d, s->lse + pl * H));
        }
        CHECK(kvs_trace_writer_end_position(w));
    }
    CHECK(kvs_trace_writer_close(w));
    kvs_trace_writer_free(w);
    double t_write = kvs_now_s() - t0;
    kvs_trace *t = NULL;
    t0 = kvs_now_s();
    CHECK(kvs_trace_open(path, &t));
    double sink = 0;
    for (int l = 0; l < s->L; l++)
        for (int kh = 0; kh < s->Hkv; kh++) {
            kvs_trace_stream *st = NULL;
            CHECK(kvs_trace_stream_open(t, l, kh, &st));
            kvs_trace_stream_qkv_only(st);
            const kvs_trace_block *b;
            kvs_status rs;
            while ((rs = kvs_trace_stream_next(st, &b)) == KVS_OK) sink += b->k[0];
            if (rs != KVS_ERR_END) CHECK(rs);
            kvs_trace_stream_free(st);
        }
    double t_read = kvs_now_s() - t0;
    const kvs_trace_info *in = kvs_trace_info_get(t);
    uint64_t comp = in->compressed_bytes;
    mbps[0] = (double)in->raw_bytes / 1e6 / t_write;
    mbps[1] = (double)in->raw_bytes / 1e6 / t_read + 0.0 * sink;
    kvs_trace_close(t);
    unlink(path);
    return comp;
}

/* The raw arrays kvsim's chunks hold, unshuffled, in file order (per block: tokens, then per layer and KV head q,
 * k, v[, o, lse]), as one buffer: what plain zstd is given. *n receives its size. */
static uint8_t *raw_stream(const source *s, int lean, size_t *n) {
    size_t L = (size_t)s->L, H = (size_t)s->H, Hkv = (size_t)s->Hkv, d = (size_t)s->d, G = H / Hkv;
    size_t N = (size_t)s->N, B = KVS_TRACE_DEFAULT_BLOCK, es = kvs_dtype_size(s->dtype);
    size_t per_pos = 9 + L * Hkv * ((lean ? G + 2 : 2 * G + 2) * d * es + (lean ? 0 : G * 4));
    uint8_t *buf = xmalloc(N * per_pos), *p = buf;
    for (size_t b0 = 0; b0 < N; b0 += B) {
        size_t nb = N - b0 < B ? N - b0 : B;
        for (size_t i = 0; i < nb; i++, p += 4) kvs_put_u32(p, (uint32_t)s->tokens[b0 + i]);
        for (size_t i = 0; i < nb; i++) *p++ = s->roles[b0 + i];
        for (size_t i = 0; i < nb; i++, p += 4) kvs_put_u32(p, (uint32_t)s->turn[b0 + i]);
        for (size_t l = 0; l < L; l++)
            for (size_t kh = 0; kh < Hkv; kh++) {
                const float *arr[4] = {s->q, s->k, s->v, s->o};
                for (int a = 0; a < (lean ? 3 : 4); a++) {
                    size_t rows = (a == 1 || a == 2) ? Hkv : H, cols = (a == 1 || a == 2) ? d : G * d;
                    for (size_t i = 0; i < nb; i++, p += cols * es)
                        kvs_encode(s->dtype, arr[a] + (((b0 + i) * L + l) * rows + kh * (cols / d)) * d, cols, p);
                }
                if (!lean)
                    for (size_t i = 0; i < nb; i++)
                        for (size_t g = 0; g < G; g++, p += 4)
                            kvs_put_u32(p, kvs_f32_bits(s->lse[((b0 + i) * L + l) * H + kh * G + g]));
            }
    }
    *n = (size_t)(p - buf);
    return buf;
}

static size_t zstd_size(const uint8_t *src, size_t n, int level) {
    size_t cap = ZSTD_compressBound(n);
    uint8_t *dst = xmalloc(cap);
    size_t r = ZSTD_compress(dst, cap, src, n, level);
    if (ZSTD_isError(r)) {
        fprintf(stderr, "bench_trace: zstd: %s\n", ZSTD_getErrorName(r));
        exit(1);
    }
    free(dst);
    return r;
}

/* The zstd stage alone, as the writer drives it (trace.c compress_chunk / compress_planes, restated here because
 * the library keeps them private): every group chunk payload of `s` (full record, its dtype, byte-shuffled)
 * compressed one-shot and as byte planes with a zstd block boundary after each plane, then decompressed; MB of
 * raw payload per second, best of 3 passes. The planes' total must equal what the writer produced (printed
 * beside it as a cross-check of this restatement). */
static void coding_speed(const source *s, uint64_t writer_planes_bytes) {
    size_t L = (size_t)s->L, H = (size_t)s->H, Hkv = (size_t)s->Hkv, d = (size_t)s->d, G = H / Hkv;
    size_t N = (size_t)s->N, B = KVS_TRACE_DEFAULT_BLOCK, es = kvs_dtype_size(s->dtype);
    size_t cap = B * ((2 * G + 2) * d * es + G * 4), zcap = ZSTD_compressBound(cap);
    uint8_t *raw = xmalloc(cap), *shuf = xmalloc(cap), *out = xmalloc(zcap), *back = xmalloc(cap);
    ZSTD_CCtx *cc = ZSTD_createCCtx();
    ZSTD_DCtx *dc = ZSTD_createDCtx();
    if (!cc || !dc || ZSTD_isError(ZSTD_CCtx_setParameter(cc, ZSTD_c_compressionLevel, 3)) ||
        ZSTD_isError(ZSTD_CCtx_setParameter(cc, ZSTD_c_checksumFlag, 1))) {
        fprintf(stderr, "bench_trace: zstd setup failed\n");
        exit(1);
    }
    double best_c[2] = {1e30, 1e30}, best_d[2] = {1e30, 1e30};
    uint64_t total = 0, comp[2] = {0, 0};
    for (int pass = 0; pass < 3; pass++) {
        double tc[2] = {0, 0}, td[2] = {0, 0};
        for (size_t b0 = 0; b0 < N; b0 += B)
            for (size_t l = 0; l < L; l++)
                for (size_t kh = 0; kh < Hkv; kh++) {
                    size_t nb = N - b0 < B ? N - b0 : B;
                    size_t m[5] = {nb * G * d, nb * d, nb * d, nb * G * d, nb * G}, sz[5] = {es, es, es, es, 4};
                    const float *arr[4] = {s->q, s->k, s->v, s->o};
                    uint8_t *p = raw;
                    for (int a = 0; a < 4; a++) {
                        size_t rows = (a == 1 || a == 2) ? Hkv : H, cols = (a == 1 || a == 2) ? d : G * d;
                        for (size_t i = 0; i < nb; i++, p += cols * es)
                            kvs_encode(s->dtype, arr[a] + (((b0 + i) * L + l) * rows + kh * (cols / d)) * d, cols, p);
                    }
                    for (size_t i = 0; i < nb; i++)
                        for (size_t g = 0; g < G; g++, p += 4)
                            kvs_put_u32(p, kvs_f32_bits(s->lse[((b0 + i) * L + l) * H + kh * G + g]));
                    size_t n = (size_t)(p - raw), off = 0, n_planes = 0;
                    for (int a = 0; a < 5; a++) {
                        for (size_t i = 0; i < m[a]; i++)
                            for (size_t j = 0; j < sz[a]; j++) shuf[off + j * m[a] + i] = raw[off + i * sz[a] + j];
                        off += m[a] * sz[a];
                        n_planes += sz[a];
                    }
                    if (pass == 0) total += n;
                    for (int mode = 0; mode < 2; mode++) {
                        double t0 = kvs_now_s();
                        size_t z;
                        if (mode == 0) {
                            z = ZSTD_compress2(cc, out, zcap, shuf, n);
                        } else {
                            ZSTD_CCtx_reset(cc, ZSTD_reset_session_only);
                            ZSTD_CCtx_setPledgedSrcSize(cc, n);
                            ZSTD_outBuffer ob = {out, zcap, 0};
                            size_t o2 = 0, pi = 0;
                            z = 0;
                            for (int a = 0; a < 5; a++)
                                for (size_t j = 0; j < sz[a]; j++, pi++) {
                                    ZSTD_inBuffer ib = {shuf + o2, m[a], 0};
                                    o2 += m[a];
                                    size_t r;
                                    do r = ZSTD_compressStream2(cc, &ob, &ib, pi + 1 == n_planes ? ZSTD_e_end : ZSTD_e_flush);
                                    while (!ZSTD_isError(r) && r != 0);
                                    if (ZSTD_isError(r)) z = r;
                                }
                            if (!ZSTD_isError(z)) z = ob.pos;
                        }
                        tc[mode] += kvs_now_s() - t0;
                        if (ZSTD_isError(z)) {
                            fprintf(stderr, "bench_trace: zstd: %s\n", ZSTD_getErrorName(z));
                            exit(1);
                        }
                        if (pass == 0) comp[mode] += z;
                        t0 = kvs_now_s();
                        size_t r = ZSTD_decompressDCtx(dc, back, cap, out, z);
                        td[mode] += kvs_now_s() - t0;
                        if (r != n || memcmp(back, shuf, n) != 0) {
                            fprintf(stderr, "bench_trace: coding round trip failed\n");
                            exit(1);
                        }
                    }
                }
        for (int mode = 0; mode < 2; mode++) {
            if (tc[mode] < best_c[mode]) best_c[mode] = tc[mode];
            if (td[mode] < best_d[mode]) best_d[mode] = td[mode];
        }
    }
    printf("  coding alone (zstd stage of the full record's group chunks, 1 thread, best of 3): one-shot compress %.0f "
           "MB/s, decompress %.0f MB/s; planes compress %.0f MB/s, decompress %.0f MB/s (group payload %llu -> "
           "%llu / %llu bytes; the writer's planes total incl. tokens chunks: %llu)\n",
           (double)total / 1e6 / best_c[0], (double)total / 1e6 / best_d[0], (double)total / 1e6 / best_c[1],
           (double)total / 1e6 / best_d[1], (unsigned long long)total, (unsigned long long)comp[0],
           (unsigned long long)comp[1], (unsigned long long)writer_planes_bytes);
    ZSTD_freeCCtx(cc);
    ZSTD_freeDCtx(dc);
    free(raw);
    free(shuf);
    free(out);
    free(back);
}

/* One source's row of the bytes table: bytes per position per layer of every variant. */
static void bytes_table_row(source *s, const char *path) {
    double div = (double)s->N * (double)s->L;
    printf("bench_trace: bytes: %s\n", s->label);
    for (int lean = 0; lean < 2; lean++) {
        double sp_old[2], sp_new[2];
        uint64_t old = write_variant(s, path, lean, 0, sp_old), planes = write_variant(s, path, lean, 1, sp_new);
        size_t n;
        uint8_t *raw = raw_stream(s, lean, &n);
        size_t z3 = zstd_size(raw, n, 3), z19 = zstd_size(raw, n, 19);
        free(raw);
        printf("  %-5s record: raw %8.1f | kvsim one-shot %8.1f  planes %8.1f (%+.1f%%) | zstd -3 %8.1f  zstd -19 %8.1f  "
               "bytes/position/layer  (totals: raw %zu, one-shot %llu, planes %llu, zstd-3 %zu, zstd-19 %zu)\n",
               lean ? "lean" : "full", (double)n / div, (double)old / div, (double)planes / div,
               100.0 * ((double)planes / (double)old - 1.0), (double)z3 / div, (double)z19 / div, n,
               (unsigned long long)old, (unsigned long long)planes, z3, z19);
        printf("  %-5s speed MB/s of raw payload (write incl. fsync / read to fp32, 1 thread): one-shot %.0f / %.0f, "
               "planes %.0f / %.0f\n", lean ? "lean" : "full", sp_old[0], sp_old[1], sp_new[0], sp_new[1]);
        if (!lean) coding_speed(s, planes);
    }
}

/* Captures `steps` greedy tokens from `model` (BOS plus prompt ids 1..3) into `out` as a full fp16 record. */
static int capture_source(const char *model, int steps, const char *out) {
    kvs_capture_opts o;
    memset(&o, 0, sizeof o);
    static const int32_t ids[3] = {1, 2, 3};
    o.model_path = model;
    o.prompt_ids = ids;
    o.n_prompt_ids = 3;
    o.steps = steps;
    o.ignore_eos = 1;
    o.top_p = 1;
    o.seed = 42;
    o.dtype = KVS_DTYPE_F16;
    o.out_path = out;
    kvs_capture_result r;
    kvs_status st = kvs_capture_run(&o, &r);
    if (st != KVS_OK) {
        printf("bench_trace: capture of %s failed: %s (%s); skipped\n", model, kvs_strerror(st), kvs_last_error());
        return 0;
    }
    kvs_capture_result_free(&r);
    return 1;
}

/* The bytes table over the bundled trace and captures of every model at hand. */
static void bench_bytes(const char *dir, const char *root, const char *path) {
    printf("bench_trace: trace bytes per position per layer, block %d, fp16 q/k/v/o, fp32 lse; kvsim = compressed "
           "chunk payloads; zstd = libzstd one-shot of the same raw arrays (unshuffled, file order) at that level\n",
           KVS_TRACE_DEFAULT_BLOCK);
    char p[4096], cap[4200];
    source s;
    snprintf(p, sizeof p, "%s/examples/stories260K.kvt", root);
    if (access(p, R_OK) == 0) {
        trace_source(&s, p);
        bytes_table_row(&s, path);
        free_source(&s);
    }
    struct {
        const char *label, *rel;
        int steps;
    } models[2] = {{"stories260K", "../shared/models/stories260K.bin", 500},
                   {"tinystories-656K", "../shared/models/tinystories-656K", 500}};
    for (int i = 0; i < 2; i++) {
        snprintf(p, sizeof p, "%s/%s", root, models[i].rel);
        snprintf(cap, sizeof cap, "%s/%s.kvt", dir, models[i].label);
        if (access(p, R_OK) != 0) {
            printf("bench_trace: %s absent: skipped\n", p);
            continue;
        }
        if (!capture_source(p, models[i].steps, cap)) continue;
        trace_source(&s, cap);
        bytes_table_row(&s, path);
        free_source(&s);
        unlink(cap);
    }
    /* the Llama-shaped random-weight checkpoint (speed and size only: its activations are those of random weights) */
    const char *llama = getenv("KVSIM_BENCH_LLAMA");
    char gen[4200];
    int made = 0;
    if (!llama || !llama[0]) {
        snprintf(gen, sizeof gen, "%s/random-weights-llama", dir);
        char cmd[8600];
        snprintf(cmd, sizeof cmd, "/usr/bin/python3 -c 'import numpy' 2>/dev/null && /usr/bin/python3 "
                 "'%s/bench/gen_llama_checkpoint.py' '%s' --positions 2048 >/dev/null", root, gen);
        made = system(cmd) == 0;
        llama = made ? gen : NULL;
    }
    if (llama) {
        snprintf(cap, sizeof cap, "%s/llama.kvt", dir);
        if (capture_source(llama, 509, cap)) {
            trace_source(&s, cap);
            bytes_table_row(&s, path);
            free_source(&s);
            unlink(cap);
        }
    } else {
        printf("bench_trace: Llama-shaped checkpoint: skipped (set KVSIM_BENCH_LLAMA=DIR, or have /usr/bin/python3 "
               "with numpy for bench/gen_llama_checkpoint.py)\n");
    }
    if (made) {
        char cmd[8600];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", gen);
        if (system(cmd) != 0) printf("bench_trace: could not remove %s\n", gen);
    }
}

/* dtype conversion of one array, the writer's and reader's per-value work besides zstd: kvs_encode /
 * kvs_decode (F16C for fp16 where the CPU has it) beside the scalar per-value functions. */
static void bench_conversion(void) {
    enum { N = 1 << 20, REPS = 50 };
    float *x = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * N);
    uint8_t *h = malloc(2 * N);
    if (!x || !y || !h) {
        fprintf(stderr, "bench_trace: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < N; i++) x[i] = (float)((i * 2654435761u) % 20001u) / 1000.0f - 10.0f;
    double t0 = kvs_now_s();
    for (int r = 0; r < REPS; r++)
        for (size_t i = 0; i < N; i++) kvs_put_u16(h + 2 * i, kvs_f32_to_f16(x[i]));
    double scalar_enc = kvs_now_s() - t0;
    t0 = kvs_now_s();
    for (int r = 0; r < REPS; r++) kvs_encode(KVS_DTYPE_F16, x, N, h);
    double array_enc = kvs_now_s() - t0;
    t0 = kvs_now_s();
    for (int r = 0; r < REPS; r++)
        for (size_t i = 0; i < N; i++) y[i] = kvs_f16_to_f32(kvs_get_u16(h + 2 * i));
    double scalar_dec = kvs_now_s() - t0;
    t0 = kvs_now_s();
    for (int r = 0; r < REPS; r++) kvs_decode(KVS_DTYPE_F16, h, N, y);
    double array_dec = kvs_now_s() - t0;
    t0 = kvs_now_s();
    for (int r = 0; r < REPS; r++) kvs_encode(KVS_DTYPE_BF16, x, N, h);
    double bf_enc = kvs_now_s() - t0;
    double mv = (double)N * REPS / 1e6;
    printf("bench_trace: conversion, M values/s: fp16 encode %.0f scalar, %.0f kvs_encode (%s); fp16 decode %.0f "
           "scalar, %.0f kvs_decode; bf16 encode %.0f [chk %.3g]\n",
           mv / scalar_enc, mv / array_enc, kvs_f16_fast_path() ? "F16C" : "scalar", mv / scalar_dec, mv / array_dec,
           mv / bf_enc, (double)y[N / 3]);
    free(x);
    free(y);
    free(h);
}

int main(void) {
    bench_conversion();
    char dir[] = "/tmp/kvs_bench_trace_XXXXXX";
    if (!mkdtemp(dir)) {
        perror("bench_trace: mkdtemp");
        return 1;
    }
    char path[64];
    snprintf(path, sizeof path, "%s/b.kvt", dir);
    /* Generated data for volume (throughput on ~85 MB), then a real trace for the compression ratio of
     * real activations: KVSIM_BENCH_TRACE, or the bundled capture of stories260K. */
    source s;
    generated_source(&s);
    bench_source(&s, path);
    char bundled[4096];
    const char *real = getenv("KVSIM_BENCH_TRACE");
    const char *root = getenv("KVSIM_ROOT");
    if (!real || !real[0]) {
        snprintf(bundled, sizeof bundled, "%s/examples/stories260K.kvt", root && root[0] ? root : ".");
        real = access(bundled, R_OK) == 0 ? bundled : NULL;
    }
    if (real) {
        trace_source(&s, real);
        if (strstr(s.label, "stored as fp32") == NULL)
            printf("bench_trace: note: this trace's values are already rounded to 16 bits, so re-encoded as fp32 "
                   "their low mantissa bytes are zero and compress better than a real fp32 capture would\n");
        bench_source(&s, path);
    } else {
        printf("bench_trace: no real trace (set KVSIM_BENCH_TRACE or keep examples/stories260K.kvt)\n");
    }
    bench_bytes(dir, root && root[0] ? root : ".", path);
    rmdir(dir);
    return 0;
}
