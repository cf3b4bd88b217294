/* replay_mem.c — in-memory replay source (see replay_mem.h): slices [L][N][H][d] arrays into the
 * [n_pos][G][d] blocks of one (layer, KV head) stream, as trace/FORMAT.md chunks hold them.
 */
#include "replay_mem.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    const kvs_replay_mem *m;
    int layer, kv_head;
    int64_t next_pos;
    kvs_trace_block blk;
} mem_stream;

static kvs_status mem_open(void *user, int layer, int kv_head, void **out) {
    const kvs_replay_mem *m = user;
    if (layer < 0 || layer >= m->model.n_layers || kv_head < 0 || kv_head >= m->model.n_kv_heads)
        return kvs_fail(KVS_ERR_RANGE, "memory source: no stream (layer %d, kv head %d)", layer, kv_head);
    mem_stream *s = calloc(1, sizeof *s);
    size_t B = (size_t)m->block_positions, G = (size_t)m->model.group, d = (size_t)m->model.head_dim;
    if (s) {
        s->blk.q = malloc(B * G * d * sizeof(float));
        s->blk.k = malloc(B * d * sizeof(float));
        s->blk.v = malloc(B * d * sizeof(float));
    }
    if (!s || !s->blk.q || !s->blk.k || !s->blk.v) {
        if (s) {
            free(s->blk.q);
            free(s->blk.k);
            free(s->blk.v);
        }
        free(s);
        return kvs_fail(KVS_ERR_NOMEM, "memory source: out of memory");
    }
    s->m = m;
    s->layer = layer;
    s->kv_head = kv_head;
    *out = s;
    return KVS_OK;
}

static kvs_status mem_next(void *stream, const kvs_trace_block **blk) {
    mem_stream *s = stream;
    const kvs_replay_mem *m = s->m;
    int64_t N = m->model.n_positions;
    if (s->next_pos >= N) return KVS_ERR_END;
    size_t H = (size_t)m->model.n_heads, Hkv = (size_t)m->model.n_kv_heads, G = (size_t)m->model.group;
    size_t d = (size_t)m->model.head_dim;
    int64_t n = N - s->next_pos < m->block_positions ? N - s->next_pos : m->block_positions;
    for (int64_t i = 0; i < n; i++) {
        size_t p = (size_t)(s->next_pos + i), l = (size_t)s->layer, h = (size_t)s->kv_head;
        memcpy(s->blk.q + (size_t)i * G * d, m->q + ((l * (size_t)N + p) * H + h * G) * d, G * d * sizeof(float));
        memcpy(s->blk.k + (size_t)i * d, m->k + ((l * (size_t)N + p) * Hkv + h) * d, d * sizeof(float));
        memcpy(s->blk.v + (size_t)i * d, m->v + ((l * (size_t)N + p) * Hkv + h) * d, d * sizeof(float));
    }
    s->blk.layer = s->layer;
    s->blk.kv_head = s->kv_head;
    s->blk.block = s->next_pos / m->block_positions;
    s->blk.first_pos = s->next_pos;
    s->blk.n_pos = (int32_t)n;
    s->blk.group = (int32_t)G;
    s->blk.head_dim = (int32_t)d;
    s->next_pos += n;
    *blk = &s->blk;
    return KVS_OK;
}

static void mem_free(void *stream) {
    mem_stream *s = stream;
    if (!s) return;
    free(s->blk.q);
    free(s->blk.k);
    free(s->blk.v);
    free(s);
}

kvs_status kvs_replay_source_from_memory(const kvs_replay_mem *m, kvs_replay_source *out) {
    const kvs_policy_model *md = &m->model;
    if (md->n_layers < 1 || md->n_kv_heads < 1 || md->group < 1 || md->n_heads != md->n_kv_heads * md->group ||
        md->head_dim < 1 || md->n_positions < 1 || m->block_positions < 1 || !m->q || !m->k || !m->v || !m->turns)
        return kvs_fail(KVS_ERR_INVALID_ARG, "memory source: inconsistent shapes or missing arrays");
    memset(out, 0, sizeof *out);
    out->model = *md;
    out->n_turns = m->n_turns;
    out->turns = m->turns;
    out->user = (void *)m; /* read only */
    out->stream_open = mem_open;
    out->stream_next = mem_next;
    out->stream_free = mem_free;
    return KVS_OK;
}
