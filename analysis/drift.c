/* drift.c — attention drift, top-k mass and temporal locality per layer, unit and k (SyncKV §3.1-3.2, Fig. 2a/2b;
 * POLICY_SPEC §5.4 S1-S3, §6.3); see drift.h for the definitions and the memory bound.
 */
#include "drift.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../common/kvs_cluster.h"
#include "../common/kvs_math.h"
#include "../trace/kv_stream.h"

const char *kvs_drift_unit_name(kvs_drift_unit u) {
    return u == KVS_DRIFT_HEAD ? "head" : u == KVS_DRIFT_GROUP ? "group" : "?";
}

double kvs_analysis_drift_chance(int64_t k, int64_t n) {
    if (k < 1 || n < k) return NAN;
    return (double)k / (double)n;
}

double kvs_analysis_drift_locality_chance(int64_t k, int64_t prompt_len, int64_t n_steps, int32_t delta) {
    if (delta < 1 || n_steps <= delta) return NAN;
    double sum = 0;
    for (int64_t t = 0; t + delta < n_steps; t++) sum += kvs_analysis_drift_chance(k, prompt_len + t + delta + 1);
    return sum / (double)(n_steps - delta);
}

int64_t kvs_analysis_drift_candidates(const kvs_trace_info *info, unsigned scores, int32_t window) {
    const int64_t P = info->n_turns > 0 ? info->turns[0].prompt_end : 0;
    int64_t m = P;
    if (scores & KVS_DRIFT_SCORE_WINDOW) m = P - window;
    return m < 0 ? 0 : m;
}

int32_t kvs_analysis_drift_default_ks(const kvs_trace_info *info, unsigned scores, int32_t window, int64_t *out,
                                      int32_t cap) {
    static const int64_t all[] = KVS_DRIFT_DEFAULT_KS;
    const int64_t m = kvs_analysis_drift_candidates(info, scores, window);
    int32_t n = 0;
    for (size_t i = 0; i < sizeof all / sizeof all[0] && n < cap; i++)
        if (2 * all[i] <= m) out[n++] = all[i];
    return n;
}

kvs_status kvs_analysis_drift_check(const kvs_trace *t, const kvs_drift_opts *o) {
    if (!t || !o) return kvs_fail(KVS_ERR_INVALID_ARG, "drift: NULL argument");
    if (o->n_k < 1 || o->n_k > KVS_DRIFT_MAX_KS || !o->k)
        return kvs_fail(KVS_ERR_INVALID_ARG, "drift: between 1 and %d values of k are needed (got %d)", KVS_DRIFT_MAX_KS,
                        (int)o->n_k);
    for (int32_t i = 0; i < o->n_k; i++) {
        if (o->k[i] < 1) return kvs_fail(KVS_ERR_INVALID_ARG, "drift: k = %lld: k must be >= 1", (long long)o->k[i]);
        if (i > 0 && o->k[i] <= o->k[i - 1])
            return kvs_fail(KVS_ERR_INVALID_ARG, "drift: the values of k must be distinct and ascending (%lld after %lld)",
                            (long long)o->k[i], (long long)o->k[i - 1]);
    }
    if (!(o->scores & (KVS_DRIFT_SCORE_WINDOW | KVS_DRIFT_SCORE_LAST)) ||
        (o->scores & ~(KVS_DRIFT_SCORE_WINDOW | KVS_DRIFT_SCORE_LAST)))
        return kvs_fail(KVS_ERR_INVALID_ARG, "drift: the prefill score must be window, last or both");
    if (o->window < 1) return kvs_fail(KVS_ERR_INVALID_ARG, "drift: the window must be >= 1 (got %d)", (int)o->window);
    if (o->delta_max < 0) return kvs_fail(KVS_ERR_INVALID_ARG, "drift: delta-max must be >= 0 (got %d)", (int)o->delta_max);
    const kvs_trace_info *info = kvs_trace_info_get(t);
    if (info->n_turns < 1 || info->turns[0].end <= info->turns[0].prompt_end)
        return kvs_fail(KVS_ERR_INVALID_ARG, "drift: the trace has no decode steps (its first turn generated no token): "
                                             "drift compares the prompt's top-k with the generated steps'");
    const int64_t P = info->turns[0].prompt_end;
    if (P < 1) return kvs_fail(KVS_ERR_INVALID_ARG, "drift: the first turn has no prompt");
    if ((o->scores & KVS_DRIFT_SCORE_WINDOW) && P - o->window < 1)
        return kvs_fail(KVS_ERR_INVALID_ARG,
                        "drift: the prompt (%lld positions) leaves no position before the %d-query window of the "
                        "window score; use a smaller --window or --prefill-score last",
                        (long long)P, (int)o->window);
    const int64_t m = kvs_analysis_drift_candidates(info, o->scores, o->window);
    if (o->k[o->n_k - 1] > m) {
        /* with the window score, the last query's score (--prefill-score last) chooses among the whole prompt */
        int64_t m_last = kvs_analysis_drift_candidates(info, KVS_DRIFT_SCORE_LAST, o->window);
        int last_fits = (o->scores & KVS_DRIFT_SCORE_WINDOW) && o->k[o->n_k - 1] <= m_last;
        return kvs_fail(KVS_ERR_INVALID_ARG,
                        "drift: k = %lld is larger than the context the prefill set is chosen from (%lld prompt "
                        "positions%s); %s",
                        (long long)o->k[o->n_k - 1], (long long)m,
                        (o->scores & KVS_DRIFT_SCORE_WINDOW) ? " before the observation window" : "",
                        last_fits ? "use --prefill-score last (the last prompt query scores every prompt position) "
                                    "or a smaller --k"
                                  : "use a smaller --k");
    }
    return KVS_OK;
}

/* The analysis state of one layer. Units of a KV head: u < G its query heads, u == G the group. */
typedef struct {
    const kvs_drift_opts *o;
    int32_t G, d, Hkv, U, D; /* U = G + 1 units per KV head; D = delta_max */
    int64_t P, m_window, sum_k;
    int64_t koff[KVS_DRIFT_MAX_KS]; /* offset of k[i]'s set in a [sum_k] row of sets */
    kvs_kv_stream **s;              /* [Hkv] */
    float *wq;                      /* [Hkv][window][G][d]: the window's queries */
    int32_t *pre;                   /* [2][Hkv][U][sum_k]: prefill sets (window, last), ascending */
    int32_t *ring;                  /* [Hkv][U][D][sum_k]: the step sets of the last D steps, ascending */
    double *uacc;                   /* [Hkv][U][n_k][D]: per-unit locality sums */
    double *agg;                    /* [2 kinds][n_k][D][4]: sum, min, max, n over the layer's units, this step */
    /* scratch for one attention row */
    float *map, *wout;              /* [N], [G][m_window] */
    int32_t *order, *cur, *top;     /* [N], [sum_k], [P] */
    uint32_t *radix;                /* [3N] */
    void *colsum_scratch;
} layer_state;

static int32_t *pre_set(layer_state *L, int score, int h, int u, int ki) {
    return L->pre + (((size_t)score * (size_t)L->Hkv + (size_t)h) * (size_t)L->U + (size_t)u) * (size_t)L->sum_k +
           (size_t)L->koff[ki];
}

static int32_t *ring_set(layer_state *L, int h, int u, int64_t slot, int ki) {
    return L->ring + ((((size_t)h * (size_t)L->U + (size_t)u) * (size_t)L->D + (size_t)slot) * (size_t)L->sum_k) +
           (size_t)L->koff[ki];
}

/* The unit's map over n positions: head g's row of `probs`, or the max over the group's rows (u == G). */
static const float *unit_map(layer_state *L, const float *rows, size_t stride, size_t n, int u) {
    if (u < L->G) return rows + (size_t)u * stride;
    kvs_max_rows(rows, stride, (size_t)L->G, n, L->map);
    return L->map;
}

/* The prefill sets of KV head h from the stream's position P - 1 (its keys and, for `last`, its attention). */
static void prefill_sets(layer_state *L, int h, const kvs_kv_pos *p) {
    const kvs_drift_opts *o = L->o;
    const int64_t kmax = o->k[o->n_k - 1];
    if (o->scores & KVS_DRIFT_SCORE_WINDOW) {
        const kvs_attn_src src = {.q = L->wq + (size_t)h * (size_t)o->window * (size_t)L->G * (size_t)L->d,
                                  .q_first = L->P - o->window,
                                  .n_q = o->window,
                                  .group = L->G,
                                  .d = L->d,
                                  .scale = p->scale,
                                  .keys = p->k,
                                  .idx = NULL,
                                  .n_cand = L->P};
        for (int u = 0; u < L->U; u++) {
            kvs_snapkv_opts so = {.window = o->window, .kernel = 1, .pool = KVS_POOL_MAX, .head_first = u < L->G ? u : 0,
                                  .n_heads = u < L->G ? 1 : L->G, .reduce = u < L->G ? KVS_GQA_SUM : KVS_GQA_MAX};
            kvs_snapkv_scores(&src, &so, L->wout, L->colsum_scratch);
            kvs_topk(L->wout, (size_t)L->m_window, (size_t)kmax, L->top);
            for (int ki = 0; ki < o->n_k; ki++) {
                int32_t *set = pre_set(L, 0, h, u, ki);
                memcpy(set, L->top, (size_t)o->k[ki] * sizeof *set);
                kvs_sort_positions(set, (size_t)o->k[ki]);
            }
        }
    }
    if (o->scores & KVS_DRIFT_SCORE_LAST) {
        for (int u = 0; u < L->U; u++) {
            const float *map = unit_map(L, p->probs, (size_t)p->n_ctx, (size_t)p->n_ctx, u);
            kvs_topk(map, (size_t)p->n_ctx, (size_t)kmax, L->top);
            for (int ki = 0; ki < o->n_k; ki++) {
                int32_t *set = pre_set(L, 1, h, u, ki);
                memcpy(set, L->top, (size_t)o->k[ki] * sizeof *set);
                kvs_sort_positions(set, (size_t)o->k[ki]);
            }
        }
    }
}

/* One decode step s of KV head h: step rows, locality against the ring, the ring updated. */
static kvs_status step_unit_rows(layer_state *L, int layer, int h, int64_t s, const kvs_kv_pos *p,
                                 const kvs_drift_sink *sink) {
    const kvs_drift_opts *o = L->o;
    const size_t n = (size_t)p->n_ctx;
    for (int u = 0; u < L->U; u++) {
        const kvs_drift_unit kind = u < L->G ? KVS_DRIFT_HEAD : KVS_DRIFT_GROUP;
        const float *map = unit_map(L, p->probs, n, n, u);
        kvs_argsort_desc(map, n, L->order, L->radix);
        for (int ki = 0; ki < o->n_k; ki++) {
            const size_t k = (size_t)o->k[ki];
            int32_t *cur = L->cur;
            memcpy(cur, L->order, k * sizeof *cur);
            kvs_sort_positions(cur, k);
            kvs_drift_step row = {.layer = layer, .unit = kind, .index = kind == KVS_DRIFT_HEAD ? h * L->G + u : h,
                                  .k = (int64_t)k, .step = s, .pos = p->pos, .overlap_window = NAN,
                                  .overlap_last = NAN, .chance = kvs_analysis_drift_chance((int64_t)k, (int64_t)n)};
            if (o->scores & KVS_DRIFT_SCORE_WINDOW) row.overlap_window = kvs_overlap_sorted(pre_set(L, 0, h, u, ki), k, cur, k);
            if (o->scores & KVS_DRIFT_SCORE_LAST) row.overlap_last = kvs_overlap_sorted(pre_set(L, 1, h, u, ki), k, cur, k);
            const int g0 = u < L->G ? u : 0, g1 = u < L->G ? u + 1 : L->G;
            double mass = 0;
            for (int g = g0; g < g1; g++) {
                const float *pr = p->probs + (size_t)g * n;
                double mg = 0;
                for (size_t r = 0; r < k; r++) mg += pr[cur[r]];
                mass += mg;
            }
            row.mass = mass / (double)(g1 - g0);
            if (sink->step) {
                kvs_status st = sink->step(sink->ctx, &row);
                if (st != KVS_OK) return st;
            }
            for (int32_t dl = 1; dl <= L->D && dl <= s; dl++) {
                const int32_t *prev = ring_set(L, h, u, (s - dl) % L->D, ki);
                const double ov = kvs_overlap_sorted(prev, k, cur, k);
                L->uacc[(((size_t)h * (size_t)L->U + (size_t)u) * (size_t)o->n_k + (size_t)ki) * (size_t)L->D +
                        (size_t)(dl - 1)] += ov;
                double *a = L->agg + ((((size_t)kind * (size_t)o->n_k + (size_t)ki) * (size_t)L->D + (size_t)(dl - 1)) * 4);
                if (a[3] == 0 || ov < a[1]) a[1] = ov;
                if (a[3] == 0 || ov > a[2]) a[2] = ov;
                a[0] += ov;
                a[3] += 1;
            }
            if (L->D > 0) memcpy(ring_set(L, h, u, s % L->D, ki), cur, k * sizeof *cur);
        }
    }
    return KVS_OK;
}

static void layer_state_free(layer_state *L) {
    if (L->s)
        for (int h = 0; h < L->Hkv; h++) kvs_kv_stream_free(L->s[h]);
    free(L->s);
    free(L->wq);
    free(L->pre);
    free(L->ring);
    free(L->uacc);
    free(L->agg);
    free(L->map);
    free(L->wout);
    free(L->order);
    free(L->cur);
    free(L->top);
    free(L->radix);
    free(L->colsum_scratch);
}

static kvs_status run_layer(const kvs_trace *t, const kvs_drift_opts *o, int layer, const kvs_drift_sink *sink) {
    const kvs_trace_info *info = kvs_trace_info_get(t);
    layer_state L = {.o = o};
    L.Hkv = info->model.n_kv_heads;
    L.G = info->model.n_heads / L.Hkv;
    L.d = info->model.head_dim;
    L.U = L.G + 1;
    L.D = o->delta_max;
    L.P = info->turns[0].prompt_end;
    const int64_t end = info->turns[0].end, N = end;
    const int W = (o->scores & KVS_DRIFT_SCORE_WINDOW) ? o->window : 0;
    L.m_window = W ? L.P - W : 0;
    for (int ki = 0; ki < o->n_k; ki++) {
        L.koff[ki] = L.sum_k;
        L.sum_k += o->k[ki];
    }
    const size_t DD = L.D > 0 ? (size_t)L.D : 1;
    kvs_status st = KVS_OK;
    L.s = calloc((size_t)L.Hkv, sizeof *L.s);
    L.wq = malloc(((size_t)L.Hkv * (size_t)(W ? W : 1) * (size_t)L.G * (size_t)L.d) * sizeof *L.wq);
    L.pre = malloc((size_t)2 * (size_t)L.Hkv * (size_t)L.U * (size_t)L.sum_k * sizeof *L.pre);
    L.ring = malloc((size_t)L.Hkv * (size_t)L.U * DD * (size_t)L.sum_k * sizeof *L.ring);
    L.uacc = calloc((size_t)L.Hkv * (size_t)L.U * (size_t)o->n_k * DD, sizeof *L.uacc);
    L.agg = malloc((size_t)KVS_DRIFT_N_UNITS * (size_t)o->n_k * DD * 4 * sizeof *L.agg);
    L.map = malloc((size_t)N * sizeof *L.map);
    L.wout = malloc((size_t)L.G * (size_t)(L.m_window > 0 ? L.m_window : 1) * sizeof *L.wout);
    L.order = malloc((size_t)N * sizeof *L.order);
    L.cur = malloc((size_t)L.sum_k * sizeof *L.cur);
    L.top = malloc((size_t)L.P * sizeof *L.top);
    L.radix = malloc((size_t)3 * (size_t)N * sizeof *L.radix);
    L.colsum_scratch = malloc(kvs_attn_colsum_scratch_bytes(L.P));
    if (!L.s || !L.wq || !L.pre || !L.ring || !L.uacc || !L.agg || !L.map || !L.wout || !L.order || !L.cur || !L.top ||
        !L.radix || !L.colsum_scratch) {
        st = kvs_fail(KVS_ERR_NOMEM, "drift: out of memory");
        goto cleanup;
    }
    for (int h = 0; h < L.Hkv; h++)
        KVS_TRY(st = kvs_kv_stream_open(t, layer, h, KVS_KV_STREAM_FULL_ATTN, &L.s[h]));
    for (int64_t pos = 0; pos < end; pos++) {
        const int64_t s = pos - L.P; /* decode step, < 0 in the prompt */
        if (s >= 0) memset(L.agg, 0, (size_t)KVS_DRIFT_N_UNITS * (size_t)o->n_k * DD * 4 * sizeof *L.agg);
        for (int h = 0; h < L.Hkv; h++) {
            kvs_kv_pos p;
            if ((st = kvs_kv_stream_next(L.s[h], &p)) != KVS_OK) {
                if (st == KVS_ERR_END)
                    st = kvs_fail(KVS_ERR_TRUNCATED, "drift: layer %d KV head %d ended at position %lld of %lld", layer,
                                  h, (long long)pos, (long long)end);
                goto cleanup;
            }
            if (W && pos >= L.P - W && pos < L.P)
                memcpy(L.wq + (((size_t)h * (size_t)W + (size_t)(pos - (L.P - W))) * (size_t)L.G * (size_t)L.d), p.q,
                       (size_t)L.G * (size_t)L.d * sizeof *L.wq);
            if (pos == L.P - 1) prefill_sets(&L, h, &p);
            if (s >= 0) KVS_TRY(st = step_unit_rows(&L, layer, h, s, &p, sink));
        }
        if (s < 1 || !sink->locality) continue;
        for (int kind = 0; kind < KVS_DRIFT_N_UNITS; kind++)
            for (int ki = 0; ki < o->n_k; ki++)
                for (int32_t dl = 1; dl <= L.D && dl <= s; dl++) {
                    const double *a = L.agg + ((((size_t)kind * (size_t)o->n_k + (size_t)ki) * DD + (size_t)(dl - 1)) * 4);
                    kvs_drift_locality row = {.layer = layer, .unit = (kvs_drift_unit)kind, .k = o->k[ki],
                                              .step = s - dl, .delta = dl, .n_units = (int32_t)a[3],
                                              .mean = a[0] / a[3], .min = a[1], .max = a[2],
                                              .chance = kvs_analysis_drift_chance(o->k[ki], pos + 1)};
                    KVS_TRY(st = sink->locality(sink->ctx, &row));
                }
    }
    if (sink->locality_unit) {
        const int64_t T = end - L.P;
        for (int h = 0; h < L.Hkv; h++)
            for (int u = 0; u < L.U; u++)
                for (int ki = 0; ki < o->n_k; ki++)
                    for (int32_t dl = 1; dl <= L.D && dl < T; dl++) {
                        const kvs_drift_unit kind = u < L.G ? KVS_DRIFT_HEAD : KVS_DRIFT_GROUP;
                        kvs_drift_locality_unit row = {
                            .layer = layer, .unit = kind, .index = kind == KVS_DRIFT_HEAD ? h * L.G + u : h,
                            .k = o->k[ki], .delta = dl, .n_pairs = T - dl,
                            .mean = L.uacc[(((size_t)h * (size_t)L.U + (size_t)u) * (size_t)o->n_k + (size_t)ki) * DD +
                                           (size_t)(dl - 1)] /
                                    (double)(T - dl),
                            .chance = kvs_analysis_drift_locality_chance(o->k[ki], L.P, T, dl)};
                        KVS_TRY(st = sink->locality_unit(sink->ctx, &row));
                    }
    }
cleanup:
    layer_state_free(&L);
    return st;
}

kvs_status kvs_analysis_drift_run(const kvs_trace *t, const kvs_drift_opts *o, const kvs_drift_sink *sink) {
    kvs_status st = kvs_analysis_drift_check(t, o);
    if (st != KVS_OK) return st;
    static const kvs_drift_sink none = {0};
    if (!sink) sink = &none;
    const kvs_trace_info *info = kvs_trace_info_get(t);
    for (int l = 0; l < info->model.n_layers && st == KVS_OK; l++) st = run_layer(t, o, l, sink);
    return st;
}
