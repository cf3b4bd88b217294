/* kv_stream.c — position-by-position iterator over one (layer, KV head) stream of a trace, with the K/V
 * history and optional exact causal full attention; see kv_stream.h. Blocks come from kvs_trace_stream
 * (trace/trace.h, format trace/FORMAT.md); attention from common/kvs_math.h.
 */
#include "kv_stream.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../common/kvs_math.h"
#include "../common/kvs_math_simd.h"

#define KNOWN_FLAGS (KVS_KV_STREAM_FULL_ATTN | KVS_KV_STREAM_SCORES)

typedef enum { ST_RUNNING = 0, ST_END = 1, ST_FAILED = 2 } stream_state;

struct kvs_kv_stream {
    const kvs_trace *t;
    kvs_trace_stream *blocks;
    const kvs_trace_block *blk; /* current block (borrowed from `blocks`), NULL before the first */
    int32_t i;                  /* next position inside blk */
    int layer, kv_head;
    unsigned flags;
    size_t G, d;
    int64_t N;                  /* n_positions */
    int64_t pos;                /* next position to hand out */
    float scale;
    size_t window;              /* the layer's attention window (0 = full causal attention) */
    stream_state state;
    const int32_t *tokens, *turn_of; /* [N], borrowed from the trace */
    const uint8_t *roles;            /* [N] */
    float *k, *v;               /* [N][d] history */
    kvs_dtype kv16;             /* dtype of k16/v16, KVS_DTYPE_F32 when there are none */
    uint16_t *k16, *v16;        /* [N][d] the history in the trace's 16 bits (FULL_ATTN without SCORES on a 16-bit
                                 * trace): the full attention reads these, k/v are their exact conversion */
    float **prow;               /* [G] probability rows of the group attention (16-bit history) */
    float *probs, *scores;      /* [G][N] (FULL_ATTN / SCORES), rows n_ctx apart */
    float *out;                 /* [G][d] */
    double *attn_lse;           /* [G] */
    int lean_own_outputs;       /* lean trace with FULL_ATTN: o and lse are this stream's own full attention */
    float *lse32;               /* [G] (lean_own_outputs): attn_lse rounded to fp32, the trace's lse type */
};

kvs_status kvs_kv_stream_open(const kvs_trace *t, int layer, int kv_head, unsigned flags, kvs_kv_stream **out) {
    if (!out) return kvs_fail(KVS_ERR_INVALID_ARG, "kv_stream: NULL output pointer");
    *out = NULL;
    if (!t) return kvs_fail(KVS_ERR_INVALID_ARG, "kv_stream: NULL trace");
    if (flags & ~KNOWN_FLAGS)
        return kvs_fail(KVS_ERR_INVALID_ARG, "kv_stream: unknown flags 0x%x (known: 0x%x)", flags & ~KNOWN_FLAGS,
                        KNOWN_FLAGS);
    if (flags & KVS_KV_STREAM_SCORES) flags |= KVS_KV_STREAM_FULL_ATTN;
    const kvs_trace_info *in = kvs_trace_info_get(t);
    const kvs_model_config *m = &in->model;
    if (layer < 0 || layer >= m->n_layers)
        return kvs_fail(KVS_ERR_RANGE, "kv_stream: layer %d outside the trace (layers 0..%d)", layer, (int)m->n_layers - 1);
    if (kv_head < 0 || kv_head >= m->n_kv_heads)
        return kvs_fail(KVS_ERR_RANGE, "kv_stream: kv head %d outside the trace (kv heads 0..%d)", kv_head,
                        (int)m->n_kv_heads - 1);
    /* the reader validated these at open; checked again because the sizes below depend on them */
    if (m->n_heads < 1 || m->n_heads % m->n_kv_heads || m->head_dim < 1 || in->n_positions < 1)
        return kvs_fail(KVS_ERR_FORMAT, "kv_stream: trace has %d query heads, %d kv heads, head_dim %d, %lld positions",
                        (int)m->n_heads, (int)m->n_kv_heads, (int)m->head_dim, (long long)in->n_positions);
    size_t G = (size_t)(m->n_heads / m->n_kv_heads), d = (size_t)m->head_dim;
    size_t rows = G > d ? G : d;
    if ((uint64_t)in->n_positions > (uint64_t)(SIZE_MAX / sizeof(float) / rows / 2))
        return kvs_fail(KVS_ERR_NOMEM, "kv_stream: history of %lld positions x %zu does not fit in memory",
                        (long long)in->n_positions, rows);
    size_t N = (size_t)in->n_positions;

    kvs_kv_stream *s = calloc(1, sizeof *s);
    if (!s) return kvs_fail(KVS_ERR_NOMEM, "kv_stream: out of memory");
    s->t = t;
    s->layer = layer;
    s->kv_head = kv_head;
    s->flags = flags;
    s->G = G;
    s->d = d;
    s->N = in->n_positions;
    s->scale = m->attn_scale;
    s->window = (size_t)kvs_model_config_window(m, layer);
    s->tokens = kvs_trace_tokens(t);
    s->turn_of = kvs_trace_turn_of(t);
    s->roles = kvs_trace_roles(t);
    /* K and V in one block, on huge pages where the system has them (kvs_alloc_rows: gathered rows) */
    s->k = kvs_alloc_rows(2 * N * d * sizeof(float));
    s->v = s->k ? s->k + N * d : NULL;
    int ok = s->k != NULL;
    if (flags & KVS_KV_STREAM_FULL_ATTN) {
        s->probs = malloc(G * N * sizeof(float));
        s->out = malloc(G * d * sizeof(float));
        s->attn_lse = malloc(G * sizeof(double));
        ok = ok && s->probs && s->out && s->attn_lse;
    }
    if (flags & KVS_KV_STREAM_SCORES) {
        s->scores = malloc(G * N * sizeof(float));
        ok = ok && s->scores;
    }
    /* The full attention of every head of the group at once over the 16-bit rows: half the bytes
     * read, the same numbers (kvs_attention_group16 equals kvs_attention row by row on the converted rows). Not
     * with SCORES, whose scores come out of kvs_attention's separate steps. */
    s->kv16 = KVS_DTYPE_F32;
    kvs_dtype dt = (kvs_dtype)in->capture.dtype;
    if ((flags & KVS_KV_STREAM_FULL_ATTN) && !(flags & KVS_KV_STREAM_SCORES) &&
        (dt == KVS_DTYPE_F16 || dt == KVS_DTYPE_BF16) && d <= KVS_KV16_MAX_DIM && kvs_math_kv16_default() &&
        __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__) {
        s->kv16 = dt;
        s->k16 = kvs_alloc_rows(2 * N * d * sizeof(uint16_t));
        s->v16 = s->k16 ? s->k16 + N * d : NULL;
        s->prow = malloc(G * sizeof *s->prow);
        ok = ok && s->k16 && s->prow;
    }
    if (!ok) {
        kvs_kv_stream_free(s);
        return kvs_fail(KVS_ERR_NOMEM, "kv_stream: cannot allocate the K/V history of (layer %d, kv head %d): %zu "
                        "positions x %zu", layer, kv_head, N, d);
    }
    kvs_status st = kvs_trace_stream_open(t, layer, kv_head, &s->blocks);
    if (st != KVS_OK) {
        kvs_kv_stream_free(s);
        return st;
    }
    /* A lean trace stores no o/lse and the reader would recompute them: with FULL_ATTN this stream computes the
     * same attention anyway (the reader's is kvs_attention_group in fp32, equal bit for bit to the one here), so
     * the reader skips its copy and o/lse point at this stream's results instead of computing everything twice. */
    if ((flags & KVS_KV_STREAM_FULL_ATTN) && (in->capture.flags & KVS_TRACE_FLAG_QKV)) {
        s->lse32 = malloc(G * sizeof(float));
        if (!s->lse32) {
            kvs_kv_stream_free(s);
            return kvs_fail(KVS_ERR_NOMEM, "kv_stream: out of memory");
        }
        s->lean_own_outputs = 1;
        kvs_trace_stream_qkv_only(s->blocks);
    }
    *out = s;
    return KVS_OK;
}

/* Takes the next block and checks that it continues the stream where the previous one ended. */
static kvs_status next_block(kvs_kv_stream *s) {
    kvs_status st = kvs_trace_stream_next(s->blocks, &s->blk);
    if (st == KVS_ERR_END)
        return kvs_fail(KVS_ERR_FORMAT, "kv_stream: (layer %d, kv head %d) ends after %lld of %lld positions",
                        s->layer, s->kv_head, (long long)s->pos, (long long)s->N);
    if (st != KVS_OK) return st;
    const kvs_trace_block *b = s->blk;
    if (b->layer != s->layer || b->kv_head != s->kv_head || b->first_pos != s->pos || b->n_pos < 1 ||
        b->n_pos > s->N - s->pos || (size_t)b->group != s->G || (size_t)b->head_dim != s->d)
        return kvs_fail(KVS_ERR_FORMAT, "kv_stream: (layer %d, kv head %d): block %lld (positions %lld + %d, group %d, "
                        "head_dim %d) does not continue the stream at position %lld", s->layer, s->kv_head,
                        (long long)b->block, (long long)b->first_pos, (int)b->n_pos, (int)b->group, (int)b->head_dim,
                        (long long)s->pos);
    s->i = 0;
    return KVS_OK;
}

/* Full attention of every query head of the group at position p over 0..p, into s->probs / out / attn_lse
 * (and s->scores). Rows of probs are n apart, the replay engine's [group][n] layout. A sliding-window layer's
 * full attention is its window's: keys first..p, with probability 0 (and score -inf) before `first`. */
static void full_attention(kvs_kv_stream *s, const float *q, size_t n) {
    size_t d = s->d, f = s->window > 0 && n > s->window ? n - s->window : 0, w = n - f;
    if (s->kv16 != KVS_DTYPE_F32) {
        for (size_t g = 0; g < s->G; g++) {
            s->prow[g] = s->probs + g * n + f;
            for (size_t j = 0; j < f; j++) s->probs[g * n + j] = 0;
        }
        kvs_attention_group16(q, s->G, s->k16 + f * d, s->v16 + f * d, s->kv16, d, NULL, w, d, s->scale, s->prow,
                              s->out, s->attn_lse);
        return;
    }
    const float *k = s->k + f * d, *v = s->v + f * d;
    for (size_t g = 0; g < s->G; g++) {
        const float *qg = q + g * d;
        float *probs = s->probs + g * n, *out = s->out + g * d;
        for (size_t j = 0; j < f; j++) probs[j] = 0;
        probs += f;
        if (s->scores) {
            /* kvs_attention()'s own three steps (kvs_math.c), so that the scores can be kept on the way:
             * the same results bit for bit (tests/test_kv_stream.c compares the two) */
            float *scores = s->scores + g * n;
            for (size_t j = 0; j < f; j++) scores[j] = -INFINITY;
            scores += f;
            kvs_attn_scores(qg, k, d, NULL, w, d, s->scale, scores);
            memcpy(probs, scores, w * sizeof(float));
            s->attn_lse[g] = kvs_softmax(probs, w);
            kvs_attn_output(probs, v, d, NULL, w, d, out);
        } else {
            s->attn_lse[g] = kvs_attention(qg, k, v, d, NULL, w, d, s->scale, probs, out);
        }
    }
}

kvs_status kvs_kv_stream_next(kvs_kv_stream *s, kvs_kv_pos *out) {
    if (!s || !out) return kvs_fail(KVS_ERR_INVALID_ARG, "kv_stream: next: NULL argument");
    if (s->state == ST_END) return KVS_ERR_END;
    if (s->state == ST_FAILED)
        return kvs_fail(KVS_ERR_STATE, "kv_stream: (layer %d, kv head %d): next after an error", s->layer,
                        s->kv_head);
    if (s->pos >= s->N) {
        s->state = ST_END;
        return KVS_ERR_END;
    }
    if (!s->blk || s->i >= s->blk->n_pos) {
        kvs_status st = next_block(s);
        if (st != KVS_OK) {
            s->state = ST_FAILED;
            return st;
        }
    }
    const kvs_trace_block *b = s->blk;
    size_t d = s->d, G = s->G, i = (size_t)s->i, p = (size_t)s->pos, n = p + 1;
    if (s->kv16 != KVS_DTYPE_F32) { /* the trace's values back in 16 bits (exact), and k/v as their conversion */
        kvs_encode(s->kv16, b->k + i * d, d, s->k16 + p * d);
        kvs_encode(s->kv16, b->v + i * d, d, s->v16 + p * d);
        kvs_decode(s->kv16, s->k16 + p * d, d, s->k + p * d);
        kvs_decode(s->kv16, s->v16 + p * d, d, s->v + p * d);
    } else {
        memcpy(s->k + p * d, b->k + i * d, d * sizeof(float));
        memcpy(s->v + p * d, b->v + i * d, d * sizeof(float));
    }
    const float *q = b->q + i * G * d;
    if (s->flags & KVS_KV_STREAM_FULL_ATTN) full_attention(s, q, n);

    memset(out, 0, sizeof *out);
    out->layer = s->layer;
    out->kv_head = s->kv_head;
    out->group = (int32_t)G;
    out->head_dim = (int32_t)d;
    out->scale = s->scale;
    out->pos = s->pos;
    out->n_ctx = (int64_t)n;
    out->token = s->tokens[p];
    out->turn = s->turn_of[p];
    out->is_prompt = s->roles[p] == KVS_ROLE_PROMPT;
    out->q = q;
    out->k = s->k;
    out->v = s->v;
    if (s->lean_own_outputs) {
        for (size_t g = 0; g < G; g++) s->lse32[g] = (float)s->attn_lse[g];
        out->o = s->out;
        out->lse = s->lse32;
    } else {
        out->o = b->o + i * G * d;
        out->lse = b->lse + i * G;
    }
    if (s->flags & KVS_KV_STREAM_FULL_ATTN) {
        out->probs = s->probs;
        out->out = s->out;
        out->attn_lse = s->attn_lse;
        out->scores = s->scores; /* NULL without KVS_KV_STREAM_SCORES */
    }
    s->i++;
    s->pos++;
    return KVS_OK;
}

void kvs_kv_stream_free(kvs_kv_stream *s) {
    if (!s) return;
    kvs_trace_stream_free(s->blocks);
    free(s->k); /* v and v16 lie in the blocks of k and k16 */
    free(s->k16);
    free((void *)s->prow);
    free(s->probs);
    free(s->scores);
    free(s->out);
    free(s->attn_lse);
    free(s->lse32);
    free(s);
}
