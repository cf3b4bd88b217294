/* attn.c — D2O's column-sum variance and RocketKV's top-k union per head (see attn.h). */
#include "attn.h"

#include <stdlib.h>
#include <string.h>

#include "../common/kvs_math.h"
#include "../trace/kv_stream.h"

kvs_status kvs_analysis_colsum_variance(const kvs_trace *t, int layer, double *var) {
    if (!t || !var) return kvs_fail(KVS_ERR_INVALID_ARG, "colsum variance: NULL argument");
    const kvs_trace_info *info = kvs_trace_info_get(t);
    const int Hkv = info->model.n_kv_heads, G = info->model.n_heads / Hkv;
    const int64_t P = info->turns[0].prompt_end;
    if (layer < 0 || layer >= info->model.n_layers)
        return kvs_fail(KVS_ERR_RANGE, "colsum variance: layer %d outside 0..%d", layer, info->model.n_layers - 1);
    if (P < 2) return kvs_fail(KVS_ERR_INVALID_ARG, "colsum variance: the prompt has %lld position(s)", (long long)P);
    double *col = malloc((size_t)G * (size_t)P * sizeof *col);
    if (!col) return kvs_fail(KVS_ERR_NOMEM, "colsum variance: out of memory");
    kvs_status st = KVS_OK;
    for (int h = 0; h < Hkv && st == KVS_OK; h++) {
        kvs_kv_stream *s = NULL;
        if ((st = kvs_kv_stream_open(t, layer, h, KVS_KV_STREAM_FULL_ATTN, &s)) != KVS_OK) break;
        memset(col, 0, (size_t)G * (size_t)P * sizeof *col);
        kvs_kv_pos p;
        for (int64_t i = 0; i < P; i++) {
            if ((st = kvs_kv_stream_next(s, &p)) != KVS_OK) {
                if (st == KVS_ERR_END) st = kvs_fail(KVS_ERR_TRUNCATED, "colsum variance: stream ended at %lld", (long long)i);
                break;
            }
            for (int g = 0; g < G; g++)
                for (int64_t j = 0; j <= i; j++) col[(size_t)g * (size_t)P + (size_t)j] += p.probs[(size_t)g * (size_t)p.n_ctx + (size_t)j];
        }
        kvs_kv_stream_free(s);
        for (int g = 0; g < G && st == KVS_OK; g++) {
            const double *c = col + (size_t)g * (size_t)P;
            double mean = 0, sq = 0;
            for (int64_t j = 0; j < P; j++) mean += c[j] / (double)P; /* = 1: every row sums to 1, P rows */
            for (int64_t j = 0; j < P; j++) sq += (c[j] - mean) * (c[j] - mean);
            var[h * G + g] = sq / (double)P;
        }
    }
    free(col);
    return st;
}

kvs_status kvs_analysis_topk_union(const kvs_trace *t, int layer, int kv_head, int64_t k, kvs_topk_union *out) {
    if (!t || !out || k < 1) return kvs_fail(KVS_ERR_INVALID_ARG, "top-k union: NULL argument or k < 1");
    const kvs_trace_info *info = kvs_trace_info_get(t);
    const int G = info->model.n_heads / info->model.n_kv_heads;
    const int64_t N = info->n_positions;
    kvs_kv_stream *s = NULL;
    kvs_status st = kvs_kv_stream_open(t, layer, kv_head, KVS_KV_STREAM_FULL_ATTN, &s);
    if (st != KVS_OK) return st;
    uint8_t *seen = calloc((size_t)G * (size_t)N, 1);
    int32_t *top = malloc((size_t)(k < N ? k : N) * sizeof *top);
    if (!seen || !top) {
        st = kvs_fail(KVS_ERR_NOMEM, "top-k union: out of memory");
        goto cleanup;
    }
    for (int g = 0; g < G; g++) out[g] = (kvs_topk_union){0};
    kvs_kv_pos p;
    while ((st = kvs_kv_stream_next(s, &p)) == KVS_OK) {
        if (p.is_prompt) continue;
        size_t kk = (size_t)(k < p.n_ctx ? k : p.n_ctx);
        for (int g = 0; g < G; g++) {
            kvs_topk(p.probs + (size_t)g * (size_t)p.n_ctx, (size_t)p.n_ctx, kk, top);
            uint8_t *mark = seen + (size_t)g * (size_t)N;
            for (size_t r = 0; r < kk; r++)
                if (!mark[top[r]]) {
                    mark[top[r]] = 1;
                    out[g].n_union++;
                }
            out[g].steps++;
            out[g].max_len = p.n_ctx;
        }
    }
    if (st == KVS_ERR_END) st = KVS_OK;
    if (st == KVS_OK && out[0].steps == 0)
        st = kvs_fail(KVS_ERR_INVALID_ARG, "top-k union: the trace has no generated position");
cleanup:
    kvs_kv_stream_free(s);
    free(seen);
    free(top);
    return st;
}
