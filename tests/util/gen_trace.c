/* gen_trace.c — TEST HELPER: generated (seeded Gaussian) trace data with exact full attention; see
 * gen_trace.h. Not a model: nothing here pretends to be real decoding.
 */
#include "gen_trace.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/kvs_math.h"

kvs_gen_trace_opts kvs_gen_trace_defaults(void) {
    kvs_gen_trace_opts o = {
        .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .head_dim = 16, .n_positions = 40, .block_positions = 16,
        .vocab_size = 1000, .dtype = KVS_DTYPE_F32, .flags = KVS_TRACE_FLAG_SHUFFLE, .seed = 1, .n_turns = 1,
        .prompt_len = -1, .q_scale = 1.0f, .corrupt_o_layer = -1,
    };
    return o;
}

/* splitmix64: small, seedable, good enough for test data. */
static uint64_t next_u64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double next_unit(uint64_t *s) { return ((double)(next_u64(s) >> 11) + 0.5) / 9007199254740992.0; }
static float next_gauss(uint64_t *s) {
    double u1 = next_unit(s), u2 = next_unit(s);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

void kvs_gen_trace_free(kvs_gen_trace *g) {
    if (!g) return;
    free(g->q);
    free(g->o);
    free(g->k);
    free(g->v);
    free(g->lse);
    free(g->tokens);
    free(g->turn);
    free(g->roles);
    free(g);
}

kvs_status kvs_gen_trace_create(const kvs_gen_trace_opts *opt, kvs_gen_trace **out) {
    *out = NULL;
    const kvs_gen_trace_opts *o = opt;
    if (o->n_layers < 1 || o->n_heads < 1 || o->n_kv_heads < 1 || o->n_heads % o->n_kv_heads || o->head_dim < 1 ||
        o->n_positions < 1 || o->n_turns < 1 || o->n_turns > o->n_positions || o->vocab_size < 1)
        return kvs_fail(KVS_ERR_INVALID_ARG, "gen_trace: bad options");
    kvs_gen_trace *g = calloc(1, sizeof *g);
    if (!g) return kvs_fail(KVS_ERR_NOMEM, "gen_trace: out of memory");
    g->opt = *o;
    g->G = o->n_heads / o->n_kv_heads;
    size_t L = (size_t)o->n_layers, N = (size_t)o->n_positions, H = (size_t)o->n_heads, Hkv = (size_t)o->n_kv_heads,
           d = (size_t)o->head_dim;
    g->q = malloc(L * N * H * d * sizeof(float));
    g->o = malloc(L * N * H * d * sizeof(float));
    g->k = malloc(L * N * Hkv * d * sizeof(float));
    g->v = malloc(L * N * Hkv * d * sizeof(float));
    g->lse = malloc(L * N * H * sizeof(float));
    g->tokens = malloc(N * sizeof(int32_t));
    g->turn = malloc(N * sizeof(int32_t));
    g->roles = malloc(N);
    float *probs = malloc(N * sizeof(float));
    if (!g->q || !g->o || !g->k || !g->v || !g->lse || !g->tokens || !g->turn || !g->roles || !probs) {
        free(probs);
        kvs_gen_trace_free(g);
        return kvs_fail(KVS_ERR_NOMEM, "gen_trace: out of memory");
    }
    uint64_t rng = o->seed;
    for (size_t i = 0; i < L * N * H * d; i++) g->q[i] = o->q_scale * next_gauss(&rng);
    for (size_t i = 0; i < L * N * Hkv * d; i++) g->k[i] = next_gauss(&rng);
    for (size_t i = 0; i < L * N * Hkv * d; i++) g->v[i] = next_gauss(&rng);
    for (size_t p = 0; p < N; p++) g->tokens[p] = (int32_t)(next_u64(&rng) % (uint64_t)o->vocab_size);
    /* turns: even split; in each turn the first half (at least one) is prompt, the rest generated */
    size_t per = N / (size_t)o->n_turns;
    for (size_t p = 0; p < N; p++) {
        size_t t = p / per;
        if (t >= (size_t)o->n_turns) t = (size_t)o->n_turns - 1;
        size_t begin = t * per, end = t + 1 == (size_t)o->n_turns ? N : begin + per;
        size_t plen = o->n_turns == 1 && o->prompt_len >= 0 ? (size_t)o->prompt_len : (end - begin + 1) / 2;
        g->turn[p] = (int32_t)t;
        g->roles[p] = p - begin < plen ? KVS_ROLE_PROMPT : KVS_ROLE_GENERATED;
    }
    float scale = 1.0f / sqrtf((float)d);
    for (size_t l = 0; l < L; l++)
        for (size_t p = 0; p < N; p++)
            for (size_t h = 0; h < H; h++) {
                size_t kh = h / (size_t)g->G;
                const float *keys = g->k + (l * N * Hkv + kh) * d, *vals = g->v + (l * N * Hkv + kh) * d;
                size_t qi = ((l * N + p) * H + h) * d;
                double lse = kvs_attention(g->q + qi, keys, vals, Hkv * d, NULL, p + 1, d, scale, probs, g->o + qi);
                g->lse[(l * N + p) * H + h] = (float)lse;
            }
    free(probs);
    *out = g;
    return KVS_OK;
}

void kvs_gen_trace_configs(const kvs_gen_trace *g, kvs_model_config *m, kvs_capture_config *c) {
    const kvs_gen_trace_opts *o = &g->opt;
    memset(m, 0, sizeof *m);
    memset(c, 0, sizeof *c);
    m->n_layers = o->n_layers;
    m->n_heads = o->n_heads;
    m->n_kv_heads = o->n_kv_heads;
    m->head_dim = o->head_dim;
    m->dim = o->n_heads * o->head_dim;
    m->hidden_dim = 4 * m->dim;
    m->vocab_size = o->vocab_size;
    m->max_seq_len = o->n_positions;
    m->rope_theta = 10000.0f;
    m->norm_eps = 1e-5f;
    m->attn_scale = 1.0f / sqrtf((float)o->head_dim);
    m->rope_layout = KVS_ROPE_ADJACENT;
    snprintf(m->model_name, sizeof m->model_name, "generated-gaussian");
    c->dtype = (int32_t)o->dtype;
    c->block_positions = o->block_positions;
    c->max_new_tokens = 0;
    c->flags = o->flags;
    snprintf(c->settings, sizeof c->settings, "source=generated seed=%llu q_scale=%g corrupt_o_layer=%d",
             (unsigned long long)o->seed, (double)o->q_scale, o->corrupt_o_layer);
}

const float *kvs_gen_trace_stored_o(const kvs_gen_trace *g, int layer, int64_t pos, int head) {
    const kvs_gen_trace_opts *o = &g->opt;
    int64_t src = pos;
    if ((o->corrupt_o_layer == -2 || o->corrupt_o_layer == layer) && o->n_positions > 1) src = pos ? pos - 1 : 1;
    return g->o + (((size_t)layer * (size_t)o->n_positions + (size_t)src) * (size_t)o->n_heads + (size_t)head) *
                      (size_t)o->head_dim;
}

kvs_status kvs_gen_trace_put(const kvs_gen_trace *g, kvs_trace_writer *w, int64_t from, int64_t to) {
    const kvs_gen_trace_opts *o = &g->opt;
    size_t N = (size_t)o->n_positions, H = (size_t)o->n_heads, Hkv = (size_t)o->n_kv_heads, d = (size_t)o->head_dim;
    float *obuf = malloc(H * d * sizeof(float));
    if (!obuf) return kvs_fail(KVS_ERR_NOMEM, "gen_trace: out of memory");
    kvs_status s = KVS_OK;
    for (int64_t p = from; p < to && s == KVS_OK; p++) {
        s = kvs_trace_writer_begin_position(w, g->tokens[p], (kvs_role)g->roles[p], g->turn[p]);
        for (int l = 0; l < o->n_layers && s == KVS_OK; l++) {
            size_t base = (size_t)l * N + (size_t)p;
            for (size_t h = 0; h < H; h++) memcpy(obuf + h * d, kvs_gen_trace_stored_o(g, l, p, (int)h), d * sizeof(float));
            s = kvs_trace_writer_put_layer(w, l, g->q + base * H * d, g->k + base * Hkv * d, g->v + base * Hkv * d, obuf,
                                           g->lse + base * H);
        }
        if (s == KVS_OK) s = kvs_trace_writer_end_position(w);
    }
    free(obuf);
    return s;
}

kvs_status kvs_gen_trace_write(const kvs_gen_trace *g, const char *path) {
    kvs_model_config m;
    kvs_capture_config c;
    kvs_gen_trace_configs(g, &m, &c);
    kvs_trace_writer *w = NULL;
    kvs_status s = kvs_trace_writer_create(path, &m, &c, &w);
    if (s == KVS_OK) s = kvs_gen_trace_put(g, w, 0, g->opt.n_positions);
    if (s == KVS_OK) s = kvs_trace_writer_close(w);
    kvs_trace_writer_free(w);
    return s;
}

void kvs_gen_trace_naive_probs(const kvs_gen_trace *g, int layer, int head, int64_t t, double *p) {
    const kvs_gen_trace_opts *o = &g->opt;
    const int d = o->head_dim, G = o->n_heads / o->n_kv_heads;
    const float *q = g->q + (((size_t)layer * (size_t)o->n_positions + (size_t)t) * (size_t)o->n_heads + (size_t)head) * (size_t)d;
    double mx = -INFINITY, z = 0;
    for (int64_t j = 0; j <= t; j++) {
        const float *k = g->k + (((size_t)layer * (size_t)o->n_positions + (size_t)j) * (size_t)o->n_kv_heads +
                                 (size_t)(head / G)) * (size_t)d;
        double s = 0;
        for (int c = 0; c < d; c++) s += (double)q[c] * k[c];
        p[j] = s / sqrt((double)d);
        if (p[j] > mx) mx = p[j];
    }
    for (int64_t j = 0; j <= t; j++) z += (p[j] = exp(p[j] - mx));
    for (int64_t j = 0; j <= t; j++) p[j] /= z;
}
