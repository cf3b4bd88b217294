/* replay_ref.c — the reference replay: the executable specification of what a replay measures, written as plain
 * loops that a reader can check line by line against ../shared/DESIGN.md ("Replay", "Metrics") and POLICY_SPEC.md
 * §1.2 (call order), §1.5 (budget and costs), §1.6 (per-step metrics). `kvsim replay --reference` runs it, and
 * tests/test_replay_ref.c requires the fast replay (sim/replay.c) to give the same numbers for every registered
 * policy.
 *
 * What it leaves out on purpose: no threads, no blocking of the reference attention, no 16-bit history, no score
 * memo, no reuse of the reference's scores, no shared output pass, no vector kernels of its own (attention is the
 * one shared routine, kvs_attention; the rest is scalar C), no spill files. Each configuration is replayed alone,
 * layer by layer; a layer's whole stream is read into memory first (n_positions x (2 + G) x head_dim floats per KV
 * head). What it shares with the fast replay is the policy host (sim/host.h: seeds, allocation pass, instances, the
 * accounting of a policy's account() and the metric formulas) and kvs_results_stat_compute for the statistics.
 * Its selection check, the counts of the default accounting, the full attention, the ranking behind the top-k
 * overlap (the rank-|S| position by quickselect in that order) and the sums behind every metric are its own.
 * Hooks, progress reports, kv16, the memo and the blocking options of kvs_replay_opts are not used.
 * Sliding-window layers (replay.h "Sliding-window layers"): the full attention at p is over the window's positions
 * only (probabilities of older positions exactly 0), the host evicts what the next position cannot attend before
 * each prefill and observe, and the check refuses a selection or a stored position older than the window. A
 * measured prompt position attends only what of the held positions and the block lies in its window; under pages
 * the attended set keeps the chosen pages' positions inside the window while a resident page counts whole (sim/host.h
 * "page granularity"); a codec's bytes without stored() are the window's positions'.
 */
#include "replay.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/kvs_math.h"
#include "host.h"

/* One layer's streams read whole: K, V [Hkv][N][d] and Q [Hkv][N][G][d]. */
typedef struct {
    float *k, *v, *q;
} layer_data;

static void layer_free(layer_data *ld) {
    free(ld->k);
    free(ld->v);
    free(ld->q);
    memset(ld, 0, sizeof *ld);
}

/* Reads KV heads [h0, h1) of layer l, every position, into ld (allocated for every KV head of the layer). */
static kvs_status layer_read(const kvs_replay_source *src, int l, int h0, int h1, layer_data *ld) {
    const kvs_policy_model *m = &src->model;
    size_t N = (size_t)m->n_positions, d = (size_t)m->head_dim, G = (size_t)m->group, H = (size_t)m->n_kv_heads;
    if (!ld->k) {
        ld->k = malloc(H * N * d * sizeof(float));
        ld->v = malloc(H * N * d * sizeof(float));
        ld->q = malloc(H * N * G * d * sizeof(float));
        if (!ld->k || !ld->v || !ld->q) return kvs_fail(KVS_ERR_NOMEM, "reference replay: out of memory for layer %d", l);
    }
    for (int h = h0; h < h1; h++) {
        void *stream = NULL;
        kvs_status st = src->stream_open(src->user, l, h, &stream);
        int64_t pos = 0;
        while (st == KVS_OK && pos < m->n_positions) {
            const kvs_trace_block *b = NULL;
            st = src->stream_next(stream, &b);
            if (st == KVS_ERR_END)
                st = kvs_fail(KVS_ERR_TRUNCATED, "reference replay: stream (layer %d, kv head %d) ended at %lld", l, h,
                              (long long)pos);
            if (st != KVS_OK) break;
            if (b->layer != l || b->kv_head != h || b->first_pos != pos || b->n_pos <= 0 ||
                pos + b->n_pos > m->n_positions || b->group != (int)G || b->head_dim != (int)d) {
                st = kvs_fail(KVS_ERR_FORMAT, "reference replay: unexpected block at (layer %d, kv head %d, position %lld)",
                              l, h, (long long)pos);
                break;
            }
            for (int i = 0; i < b->n_pos; i++, pos++) {
                memcpy(ld->k + ((size_t)h * N + (size_t)pos) * d, b->k + (size_t)i * d, d * sizeof(float));
                memcpy(ld->v + ((size_t)h * N + (size_t)pos) * d, b->v + (size_t)i * d, d * sizeof(float));
                memcpy(ld->q + ((size_t)h * N + (size_t)pos) * G * d, b->q + (size_t)i * G * d, G * d * sizeof(float));
            }
        }
        if (stream) src->stream_free(stream);
        if (st != KVS_OK) return st;
    }
    return KVS_OK;
}

/* ------------------------------------------------------------------------------------------------
 * The allocation pass reads the first turn's prompt of each (layer, KV head)
 * ---------------------------------------------------------------------------------------------- */

typedef struct {
    const kvs_replay_source *src;
    layer_data ld;
    int layer; /* whose data ld holds, -1 for none */
} alloc_reader;

static kvs_status alloc_prompt_view(void *user, int l, int h, kvs_policy_view *view) {
    alloc_reader *ar = user;
    const kvs_policy_model *m = &ar->src->model;
    size_t N = (size_t)m->n_positions, d = (size_t)m->head_dim, G = (size_t)m->group;
    if (ar->layer != l) {
        kvs_status st = layer_read(ar->src, l, 0, m->n_kv_heads, &ar->ld);
        if (st != KVS_OK) return st;
        ar->layer = l;
    }
    int64_t P = ar->src->turns[0].prompt_end;
    *view = (kvs_policy_view){
        .n = P, .group = m->group, .head_dim = m->head_dim, .scale = m->scale,
        .k = ar->ld.k + (size_t)h * N * d, .v = ar->ld.v + (size_t)h * N * d, .q = ar->ld.q + (size_t)h * N * G * d,
        .q_first = 0, .n_q = P, .turn_begin = 0, .prompt_end = P, .turn = 0, .block_begin = 0, .last_block = 1,
    };
    return KVS_OK;
}

/* ------------------------------------------------------------------------------------------------
 * One configuration
 * ---------------------------------------------------------------------------------------------- */

typedef struct {
    const kvs_replay_source *src;
    const kvs_replay_opts *o;
    const kvs_replay_config *rc;
    const kvs_codec *codec;      /* the run's codec, NULL for none */
    int64_t page;                /* the run's page size, 0 = token granularity */
    kvs_page_score rule;         /* the run's page score rule, resolved (kvs_host_page_rule) */
    int L, H, G, d, n_lists;
    int64_t N;
    int64_t window;              /* this layer's attention window, 0 = full causal attention (or one >= N) */
    const int64_t *budgets;      /* [L][H] */
    layer_data ld;
    void **states;               /* [H] this layer's instances */
    kvs_host_rep *rep;           /* this layer's codec states (NULL without a codec) */
    const float **hk, **hv;      /* [H] each KV head's history rows, for kvs_host_rep_sync */
    int32_t **idx;               /* [G][N] the selection's lists */
    int64_t *n;                  /* [G] */
    const float ***row_k, ***row_v; /* [G][N] merged-slot rows, all NULL between steps */
    float **probs;               /* [G][N] the policy's attention probabilities of each query head */
    float *out;                  /* [G][d] */
    float *gk, *gv;              /* [N][d] a merged list's rows, gathered */
    float *fullp, *fullo;        /* [H][G][N] (row g at stride p + 1) and [H][G][d]: full attention at p */
    int32_t *stored, *order;     /* [N] */
    uint8_t *mark, *umark;       /* [N] */
    double *samples;             /* [cap][KVS_N_METRICS] this run's measured samples, float-rounded */
    int64_t n_samples, cap_samples;
    int64_t *layer_first;        /* [L + 1] first sample of each layer */
    kvs_results_step *steps;
    int64_t n_steps, cap_steps;
    int64_t max_attended;
    /* page granularity: each list's attended set (positions, rows: NULL = the trace's), its size, the place of
     * S_t's entries in it (-1: not attended), each query head's probabilities over it; per page of the prefix, S_t's
     * positions on it and whether it is attended */
    int32_t **aidx, **place;     /* [G][N] */
    const float ***ark, ***arv;  /* [G][N] */
    int64_t *an;                 /* [G] */
    float **pa;                  /* [G][N] */
    int64_t *pcount;             /* [N] */
    uint8_t *ptake;              /* [N] */
    double *pscore, *escore;     /* [N] per page: its score (the score rules); per entry of S_t: the policy's score */
    uint8_t *pscored;            /* [N] per page: its score is set */
} ref_run;

static kvs_status push_sample(ref_run *r, int layer, int q_head, int64_t pos, int64_t measured_steps,
                              const double v[KVS_N_METRICS]) {
    if (r->n_samples == r->cap_samples) {
        int64_t cap = r->cap_samples ? 2 * r->cap_samples : 1024;
        double *p = realloc(r->samples, (size_t)cap * KVS_N_METRICS * sizeof *p);
        if (!p) return kvs_fail(KVS_ERR_NOMEM, "reference replay: out of memory for samples");
        r->samples = p, r->cap_samples = cap;
    }
    float vf[KVS_N_METRICS];
    for (int k = 0; k < KVS_N_METRICS; k++) {
        vf[k] = (float)v[k]; /* samples are stored as float (the fast replay's sample sets) */
        r->samples[(size_t)r->n_samples * KVS_N_METRICS + (size_t)k] = vf[k];
    }
    r->n_samples++;
    int64_t every = r->o->series_every;
    if (every > 0 && measured_steps % every == 0) {
        if (r->n_steps == r->cap_steps) {
            int64_t cap = r->cap_steps ? 2 * r->cap_steps : 256;
            kvs_results_step *p = realloc(r->steps, (size_t)cap * sizeof *p);
            if (!p) return kvs_fail(KVS_ERR_NOMEM, "reference replay: out of memory for the series");
            r->steps = p, r->cap_steps = cap;
        }
        kvs_results_step *s = &r->steps[r->n_steps++];
        s->layer = layer, s->q_head = q_head, s->position = pos;
        for (int k = 0; k < KVS_N_METRICS; k++)
            s->v[k] = kvs_metric_table[k].kind == KVS_METRIC_QUALITY ? (double)vf[k] : v[k];
    }
    return KVS_OK;
}

/* 1 when position a ranks before position b in the full attention's order: higher probability first, the lower
 * position first among equals (a total order, so the top-k set is unique). */
static int ranks_before(const float *fp, int32_t a, int32_t b) { return fp[a] > fp[b] || (fp[a] == fp[b] && a < b); }

/* The position of rank k (0-based) among order[0..n) in that order, by quickselect (order is permuted). */
static int32_t rank_select(const float *fp, int32_t *order, int64_t n, int64_t k) {
    int64_t lo = 0, hi = n - 1;
    while (lo < hi) {
        int32_t pivot = order[lo + (hi - lo) / 2];
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (ranks_before(fp, order[i], pivot)) i++;
            while (ranks_before(fp, pivot, order[j])) j--;
            if (i <= j) {
                int32_t t = order[i];
                order[i] = order[j], order[j] = t;
                i++, j--;
            }
        }
        if (k <= j) hi = j;
        else if (k >= i) lo = i;
        else return order[k];
    }
    return order[lo];
}

/* Measures query head (h, g) at position p over list[0..n) (merged[j] non-NULL: a merged slot), its output out[d],
 * against the full attention in r->fullp / r->fullo; the KV head's cost of the step. */
static kvs_status measure(ref_run *r, int layer, int h, int g, int64_t p, const int32_t *list,
                          const float *const *merged, int64_t n, const float *out, const kvs_policy_cost *cost,
                          int64_t measured_steps) {
    size_t N = (size_t)r->N, d = (size_t)r->d, G = (size_t)r->G;
    const float *fp = r->fullp + ((size_t)h * G) * N + (size_t)g * (size_t)(p + 1);
    const float *fo = r->fullo + ((size_t)h * G + (size_t)g) * d;
    /* top-|S| of the full attention: the positions ranking no later than the one of rank |S| - 1 */
    int32_t last = (int32_t)p;
    if (n <= p) {
        for (int64_t x = 0; x <= p; x++) r->order[x] = (int32_t)x;
        last = rank_select(fp, r->order, p + 1, n - 1);
    }
    kvs_host_sums s = {0};
    for (int64_t j = 0; j < n; j++) {
        double pj = fp[list[j]];
        s.recall_merged += pj;
        if (!merged || !merged[j]) s.recall += pj;
        s.hit += n > p || list[j] == last || ranks_before(fp, list[j], last);
    }
    kvs_host_out_sums(fo, out, (int64_t)d, &s);
    double v[KVS_N_METRICS];
    kvs_host_metrics(&r->src->model, p, n, &s, cost, v);
    if (n > r->max_attended) r->max_attended = n;
    return push_sample(r, layer, h * r->G + g, p, measured_steps, v);
}

/* Full attention of every query head of layer data at position p: over 0..p, or on a sliding-window layer over the
 * window lo..p, the probabilities of the positions before lo exactly 0 (they do not exist in the model). */
static void full_attention(ref_run *r, int64_t p) {
    size_t N = (size_t)r->N, d = (size_t)r->d, G = (size_t)r->G;
    size_t lo = (size_t)kvs_host_window_first(r->window, p);
    for (size_t h = 0; h < (size_t)r->H; h++)
        for (size_t g = 0; g < G; g++) {
            const float *q = r->ld.q + ((h * N + (size_t)p) * G + g) * d;
            float *fp = r->fullp + h * G * N + g * (size_t)(p + 1);
            for (size_t x = 0; x < lo; x++) fp[x] = 0.0f;
            kvs_attention(q, r->ld.k + (h * N + lo) * d, r->ld.v + (h * N + lo) * d, d, NULL, (size_t)p + 1 - lo, d,
                          r->src->model.scale, fp + lo, r->fullo + (h * G + g) * d);
        }
}

/* The selection contract (policy.h) checked entry by entry, and the counts of the default accounting:
 * *kv_slots = sum over lists of |stored() ∪ S_t|, *dedup = the union of those over lists (both p + 1 for a policy
 * without stored(): every position seen, stored once). */
static kvs_status check(ref_run *r, void *state, int64_t p, int64_t budget, const kvs_policy_sel *sel, int *has_merged,
                        double *kv_slots, double *dedup) {
    const struct kvs_policy_ops *ops = r->rc->policy.ops;
    int64_t slots = 0, uni = 0, lo = kvs_host_window_first(r->window, p);
    kvs_status st = KVS_OK;
    memset(r->umark, 0, (size_t)p + 1);
    for (int li = 0; li < sel->n_lists && st == KVS_OK; li++) {
        int64_t n = sel->n[li], prompt = 0;
        has_merged[li] = 0;
        memset(r->mark, 0, (size_t)p + 1);
        if (n < 1 || n > p + 1)
            st = kvs_fail(KVS_ERR_STATE, "policy %s selected %lld positions at position %lld", ops->name, (long long)n,
                          (long long)p);
        for (int64_t j = 0; j < n && st == KVS_OK; j++) {
            int32_t x = sel->idx[li][j];
            if (x < 0 || x > p)
                st = kvs_fail(KVS_ERR_STATE, "policy %s selected position %d at position %lld (future or invalid)",
                              ops->name, (int)x, (long long)p);
            else if (x < lo)
                st = kvs_fail(KVS_ERR_STATE, "policy %s selected position %d at position %lld, outside the layer's "
                              "sliding window (first position %lld)", ops->name, (int)x, (long long)p, (long long)lo);
            else if (r->mark[x])
                st = kvs_fail(KVS_ERR_STATE, "policy %s selected position %d twice", ops->name, (int)x);
            else if ((sel->row_k[li][j] != NULL) != (sel->row_v[li][j] != NULL))
                st = kvs_fail(KVS_ERR_STATE, "policy %s gave a merged slot at position %d with only one of its K/V rows",
                              ops->name, (int)x);
            else {
                r->mark[x] = 1;
                has_merged[li] |= sel->row_k[li][j] != NULL;
                for (int64_t t = 0; t < r->src->n_turns; t++)
                    prompt += x >= r->src->turns[t].begin && x < r->src->turns[t].prompt_end;
            }
        }
        if (st == KVS_OK && ops->stored) {
            int64_t ms = ops->stored(state, li, r->stored);
            for (int64_t k = 0; k < ms && st == KVS_OK; k++) {
                int32_t x = r->stored[k];
                if (x < 0 || x > p)
                    st = kvs_fail(KVS_ERR_STATE, "policy %s stored position %d at position %lld (future or invalid)",
                                  ops->name, (int)x, (long long)p);
                else if (x < lo)
                    st = kvs_fail(KVS_ERR_STATE, "policy %s still stores position %d at position %lld, outside the "
                                  "layer's sliding window (first position %lld)", ops->name, (int)x, (long long)p,
                                  (long long)lo);
                else r->mark[x] = 1;
            }
        }
        if (st != KVS_OK) break;
        for (int64_t x = 0; x <= p; x++)
            if (r->mark[x]) {
                slots++;
                if (!r->umark[x]) uni++;
                r->umark[x] = 1;
            }
        if (ops->budget_scope == KVS_BUDGET_EVERY_STEP && n > budget)
            st = kvs_fail(KVS_ERR_STATE, "policy %s attended %lld positions over its budget %lld at position %lld",
                          ops->name, (long long)n, (long long)budget, (long long)p);
        else if (ops->budget_scope == KVS_BUDGET_PROMPT && prompt > budget)
            st = kvs_fail(KVS_ERR_STATE, "policy %s kept %lld prompt positions over its budget %lld", ops->name,
                          (long long)prompt, (long long)budget);
    }
    memset(r->mark, 0, (size_t)p + 1); /* measure() counts top-k hits with it */
    *kv_slots = ops->stored ? (double)slots : (double)(p + 1 - lo); /* without stored(): the window, all of it */
    *dedup = ops->stored ? (double)uni : (double)(p + 1 - lo);
    return st;
}

/* A measured prompt position p of turn tk, prefill block [bb, be): S = what the policy held after its previous
 * prefill call, before the block, plus the block's positions up to p (chunked-prefill attention against the
 * compressed cache; full causal attention in turn 0 without blocks). The rest of the block is transient. */
static kvs_status prompt_step(ref_run *r, int layer, int64_t p, int64_t bb, int64_t be, int64_t measured_steps) {
    const struct kvs_policy_ops *ops = r->rc->policy.ops;
    const kvs_policy_model *m = &r->src->model;
    size_t N = (size_t)r->N, d = (size_t)r->d, G = (size_t)r->G;
    int64_t lo = kvs_host_window_first(r->window, p); /* a sliding-window layer attends lo..p only */
    for (int h = 0; h < r->H; h++) {
        double slots = 0;
        for (int li = 0; li < r->n_lists; li++) {
            int64_t k = 0;
            if (ops->stored) {
                int64_t ms = ops->stored(r->states[h], li, r->stored);
                for (int64_t j = 0; j < ms; j++)
                    if (r->stored[j] < bb && r->stored[j] >= lo) r->idx[li][k++] = r->stored[j];
            } else {
                for (int64_t j = 0; j < bb; j++)
                    if (j >= lo) r->idx[li][k++] = (int32_t)j;
            }
            for (int64_t j = bb; j <= p; j++)
                if (j >= lo) r->idx[li][k++] = (int32_t)j;
            r->n[li] = k;
            slots += (double)k;
        }
        kvs_policy_cost cost = {0};
        cost.kv_bytes = cost.dedup_kv_bytes = cost.read_kv_bytes = kvs_policy_kv_bytes(m, slots);
        if (r->n_lists > 1) cost.dedup_kv_bytes = kvs_policy_kv_bytes(m, (double)r->n[0]);
        cost.transient_bytes = kvs_policy_kv_bytes(m, (double)(be - 1 - p) * r->n_lists);
        cost.write_bytes = kvs_policy_kv_bytes(m, (double)r->n_lists);
        if (kvs_host_rep_active(r->rep)) { /* a later turn's prompt: the codec's bytes */
            double b = 0, x;
            kvs_status st;
            for (int li = 0; li < r->n_lists; li++) {
                if ((st = kvs_host_rep_list_bytes(r->rep, h, r->idx[li], r->n[li], &x)) != KVS_OK) return st;
                b += x;
            }
            cost.kv_bytes = cost.dedup_kv_bytes = cost.read_kv_bytes = b;
            if (r->n_lists > 1) cost.dedup_kv_bytes = b / r->n_lists;
        }
        const float *keys = kvs_host_rep_rows(r->rep, h, KVS_CODEC_K, r->ld.k + (size_t)h * N * d);
        const float *vals = kvs_host_rep_rows(r->rep, h, KVS_CODEC_V, r->ld.v + (size_t)h * N * d);
        for (int g = 0; g < r->G; g++) {
            int li = r->n_lists == 1 ? 0 : g;
            const float *q = r->ld.q + (((size_t)h * N + (size_t)p) * G + (size_t)g) * d;
            kvs_attention(q, keys, vals, d, r->idx[li], (size_t)r->n[li], d, m->scale, r->probs[g], r->out);
            kvs_status st = measure(r, layer, h, g, p, r->idx[li], NULL, r->n[li], r->out, &cost, measured_steps);
            if (st != KVS_OK) return st;
        }
    }
    return KVS_OK;
}

/* The prefill call of block [bb, be) of turn tk for every KV head, then the layer's prefill sync. */
static kvs_status prefill_call(ref_run *r, int64_t tk, int64_t bb, int64_t be) {
    const struct kvs_policy_ops *ops = r->rc->policy.ops;
    const kvs_turn *turn = &r->src->turns[tk];
    size_t N = (size_t)r->N, d = (size_t)r->d, G = (size_t)r->G;
    kvs_status st;
    for (int h = 0; h < r->H; h++) {
        kvs_policy_view view = {
            .n = be, .group = r->G, .head_dim = r->d, .scale = r->src->model.scale,
            .k = kvs_host_rep_rows(r->rep, h, KVS_CODEC_K, r->ld.k + (size_t)h * N * d),
            .v = kvs_host_rep_rows(r->rep, h, KVS_CODEC_V, r->ld.v + (size_t)h * N * d),
            .q = r->ld.q + ((size_t)h * N + (size_t)bb) * G * d, .q_first = bb, .n_q = be - bb,
            .turn_begin = turn->begin, .prompt_end = turn->prompt_end, .turn = (int32_t)tk, .block_begin = bb,
            .last_block = be == turn->prompt_end,
        };
        /* what the next position (be) cannot attend is gone before the policy decides what to keep */
        if ((st = kvs_host_window_evict(ops, r->states[h], kvs_host_window_first(r->window, be))) != KVS_OK)
            return st;
        if ((st = ops->prefill(r->states[h], &view)) != KVS_OK) return st;
        /* a codec scoring with the prompt's queries (think) takes them from the first prompt's last block */
        if (tk == 0 && be == turn->prompt_end &&
            (st = kvs_host_rep_prompt_queries(r->rep, h, r->ld.q + (size_t)h * N * G * d, be, r->G)) != KVS_OK)
            return st;
    }
    if (ops->layer_sync && (st = ops->layer_sync(r->states, r->H, KVS_SYNC_PREFILL)) != KVS_OK) return st;
    return KVS_OK;
}

/* ---- page granularity (sim/host.h "page granularity"), in plain loops ---- */

/* C: the pages list li of S_t may attend at position p with the list's budget. */
static int64_t page_cap(const ref_run *r, int64_t budget, const kvs_policy_sel *sel, int li, int64_t p) {
    const struct kvs_policy_ops *ops = r->rc->policy.ops;
    if (ops->budget_scope == KVS_BUDGET_NONE) return p / r->page + 1;
    int64_t allow = budget;
    if (ops->budget_scope == KVS_BUDGET_PROMPT)
        for (int64_t j = 0; j < sel->n[li]; j++) {
            int prompt = 0;
            for (int64_t t = 0; t < r->src->n_turns; t++)
                prompt |= sel->idx[li][j] >= r->src->turns[t].begin && sel->idx[li][j] < r->src->turns[t].prompt_end;
            allow += !prompt;
        }
    return allow / r->page < 1 ? 1 : allow / r->page;
}

/* Page a ranks before page b (both holding positions of S_t): by score under a score rule (a NaN below every number),
 * then by count, then the newer page. */
static int page_before(const ref_run *r, int scored, int64_t a, int64_t b) {
    if (scored) {
        double x = r->pscore[a], y = r->pscore[b];
        if (isnan(x) != isnan(y)) return !isnan(x);
        if (!isnan(x) && x != y) return x > y;
    }
    if (r->pcount[a] != r->pcount[b]) return r->pcount[a] > r->pcount[b];
    return a > b;
}

/* List li's attended set at position p with at most `cap` pages: the newest page, then one page at a time the best
 * by page_before (a page's score the max, or the sum in S_t's order, of its entries' scores from the policy's
 * scores()), none holding no position of S_t. The set: S_t's entries on those pages in S_t's order, then their
 * other positions <= p in ascending order. */
static void page_map(ref_run *r, void *state, const kvs_policy_sel *sel, int li, int64_t p, int64_t cap) {
    int64_t P = r->page, n_pages = p / P + 1, m = 0;
    for (int64_t q = 0; q < n_pages; q++) r->pcount[q] = 0, r->ptake[q] = 0, r->pscored[q] = 0, r->pscore[q] = 0;
    int scored = r->rule != KVS_PAGE_SCORE_COUNT &&
                 r->rc->policy.ops->scores(state, li, sel->idx[li], sel->n[li], r->escore);
    for (int64_t j = 0; j < sel->n[li]; j++) {
        int64_t q = sel->idx[li][j] / P;
        r->pcount[q]++;
        if (!scored) continue;
        double e = r->escore[j];
        if (!r->pscored[q]) r->pscore[q] = e, r->pscored[q] = 1;
        else if (r->rule == KVS_PAGE_SCORE_SUM) r->pscore[q] += e;
        else if (e > r->pscore[q] || isnan(r->pscore[q])) r->pscore[q] = e;
    }
    r->ptake[n_pages - 1] = 1;
    for (int64_t k = 1; k < cap; k++) {
        int64_t best = -1;
        for (int64_t q = 0; q < n_pages; q++)
            if (!r->ptake[q] && r->pcount[q] > 0 && (best < 0 || page_before(r, scored, q, best))) best = q;
        if (best < 0) break;
        r->ptake[best] = 1;
    }
    memset(r->mark, 0, (size_t)p + 1);
    for (int64_t j = 0; j < sel->n[li]; j++) {
        int32_t x = sel->idx[li][j];
        r->place[li][j] = -1;
        if (!r->ptake[x / P]) continue;
        r->aidx[li][m] = x;
        r->ark[li][m] = sel->row_k[li][j];
        r->arv[li][m] = sel->row_v[li][j];
        r->mark[x] = 1;
        r->place[li][j] = (int32_t)m++;
    }
    for (int64_t x = kvs_host_window_first(r->window, p); x <= p; x++) /* never a position outside the window */
        if (r->ptake[x / P] && !r->mark[x]) r->aidx[li][m] = (int32_t)x, r->ark[li][m] = r->arv[li][m] = NULL, m++;
    memset(r->mark, 0, (size_t)p + 1);
    r->an[li] = m;
}

/* The codec's bytes of the pages marked in take[0..n_pages) at position p: their rows <= p as the codec holds them,
 * plus each slot past p of a marked page at the codec's nominal bytes of one position. */
static kvs_status page_codec_bytes(ref_run *r, int h, const uint8_t *take, int64_t n_pages, int64_t p, double *bytes) {
    int64_t P = r->page, m = 0, pad = 0;
    for (int64_t q = 0; q < n_pages; q++) {
        if (!take[q]) continue;
        for (int64_t x = q * P; x < (q + 1) * P; x++) {
            if (x <= p) r->order[m++] = (int32_t)x;
            else pad++;
        }
    }
    kvs_status st = kvs_host_rep_list_bytes(r->rep, h, r->order, m, bytes);
    if (st == KVS_OK) *bytes += (double)pad * kvs_codec_position_bytes(r->codec, r->d);
    return st;
}

/* The cost under pages: the default classes and the policy's account(), then the KV classes from whole pages: a
 * page resident while it holds a position of stored() ∪ S_t (every page so far without stored()), N rows each (with
 * a codec: the codec's bytes of its rows, padding at the nominal bytes of a position), summed over lists and their
 * union; the attended entries read (with a codec: their rows' bytes). */
static kvs_status page_cost(ref_run *r, int h, void *state, const kvs_policy_view *view, const kvs_policy_sel *sel,
                            int64_t p, kvs_policy_cost *cost) {
    const struct kvs_policy_ops *ops = r->rc->policy.ops;
    const kvs_policy_model *m = &r->src->model;
    int64_t P = r->page, n_pages = p / P + 1, pages = 0, uni = 0, read = 0;
    int coded = r->rep && kvs_host_rep_active(r->rep);
    double kv_codec = 0, uni_codec = 0, read_codec = 0, x;
    kvs_status st;
    memset(r->umark, 0, (size_t)n_pages);
    int64_t first_page = kvs_host_window_first(r->window, p) / P; /* the oldest page holding a window position */
    for (int li = 0; li < sel->n_lists; li++) {
        memset(r->ptake, 0, (size_t)n_pages);
        if (!ops->stored) {
            memset(r->ptake + first_page, 1, (size_t)(n_pages - first_page));
        } else {
            int64_t ms = ops->stored(state, li, r->stored);
            for (int64_t k = 0; k < ms; k++) r->ptake[r->stored[k] / P] = 1;
            for (int64_t j = 0; j < sel->n[li]; j++) r->ptake[sel->idx[li][j] / P] = 1;
        }
        for (int64_t q = 0; q < n_pages; q++) {
            pages += r->ptake[q];
            uni += r->ptake[q] && !r->umark[q];
            r->umark[q] |= r->ptake[q];
        }
        if (coded) {
            if ((st = page_codec_bytes(r, h, r->ptake, n_pages, p, &x)) != KVS_OK) return st;
            kv_codec += x;
        }
    }
    if (coded && (st = page_codec_bytes(r, h, r->umark, n_pages, p, &uni_codec)) != KVS_OK) return st;
    if (!ops->stored) /* every position seen (of the window), stored once */
        pages = uni = n_pages - first_page, kv_codec = uni_codec;
    memset(r->umark, 0, (size_t)n_pages);
    for (int li = 0; li < sel->n_lists; li++) {
        read += r->an[li];
        if (coded) {
            if ((st = kvs_host_rep_list_bytes(r->rep, h, r->aidx[li], r->an[li], &x)) != KVS_OK) return st;
            read_codec += x;
        }
    }
    kvs_host_cost(ops, state, m, view, sel, (double)(pages * P), (double)(uni * P), cost);
    cost->kv_bytes = coded ? kv_codec : kvs_policy_kv_bytes(m, (double)(pages * P));
    cost->dedup_kv_bytes = coded ? uni_codec : kvs_policy_kv_bytes(m, (double)(uni * P));
    cost->read_kv_bytes = coded ? read_codec : kvs_policy_kv_bytes(m, (double)read);
    if (cost->dedup_kv_bytes > cost->kv_bytes) cost->dedup_kv_bytes = cost->kv_bytes;
    return KVS_OK;
}

/* A paged decode step of KV head h after its selection (sel checked): each list mapped to pages, every query head's
 * attention over its list's attended set, the policy's probabilities read back from it, the cost, the metrics on
 * the attended set, observe(). */
static kvs_status page_step(ref_run *r, int layer, int h, int64_t p, int measured, int64_t measured_steps,
                            const kvs_policy_view *view, kvs_policy_sel *sel) {
    const struct kvs_policy_ops *ops = r->rc->policy.ops;
    const kvs_policy_model *m = &r->src->model;
    size_t d = (size_t)r->d;
    void *state = r->states[h];
    int64_t budget = r->budgets[(size_t)layer * (size_t)r->H + (size_t)h];
    kvs_status st;
    int merged[64];
    for (int li = 0; li < sel->n_lists; li++) {
        page_map(r, state, sel, li, p, page_cap(r, budget, sel, li, p));
        merged[li] = 0;
        for (int64_t j = 0; j < r->an[li]; j++) merged[li] |= r->ark[li][j] != NULL;
    }
    for (int g = 0; g < r->G; g++) {
        int li = r->n_lists == 1 ? 0 : g;
        const float *q = view->q + (size_t)g * d, *keys = view->k, *vals = view->v;
        const int32_t *idx = r->aidx[li];
        if (merged[li]) {
            for (int64_t j = 0; j < r->an[li]; j++) {
                memcpy(r->gk + (size_t)j * d, r->ark[li][j] ? r->ark[li][j] : view->k + (size_t)idx[j] * d, d * sizeof(float));
                memcpy(r->gv + (size_t)j * d, r->arv[li][j] ? r->arv[li][j] : view->v + (size_t)idx[j] * d, d * sizeof(float));
            }
            keys = r->gk, vals = r->gv, idx = NULL;
        }
        kvs_attention(q, keys, vals, d, idx, (size_t)r->an[li], d, m->scale, r->pa[g], r->out + (size_t)g * d);
        for (int64_t j = 0; j < sel->n[li]; j++) {
            int32_t at = r->place[li][j];
            r->probs[g][j] = at >= 0 ? r->pa[g][at] : 0.0f;
        }
    }
    kvs_policy_cost cost;
    if ((st = page_cost(r, h, state, view, sel, p, &cost)) != KVS_OK) return st;
    if (measured)
        for (int g = 0; g < r->G; g++) {
            int li = r->n_lists == 1 ? 0 : g;
            if ((st = measure(r, layer, h, g, p, r->aidx[li], merged[li] ? r->ark[li] : NULL, r->an[li],
                              r->out + (size_t)g * d, &cost, measured_steps)) != KVS_OK)
                return st;
        }
    /* what the next position cannot attend is gone before the policy decides what to keep */
    if ((st = kvs_host_window_evict(ops, state, kvs_host_window_first(r->window, p + 1))) != KVS_OK) return st;
    if (ops->observe && (st = ops->observe(state, view, sel, (const float *const *)r->probs)) != KVS_OK) return st;
    for (int li = 0; li < sel->n_lists; li++)
        for (int64_t j = 0; j < sel->n[li]; j++) sel->row_k[li][j] = sel->row_v[li][j] = NULL;
    return KVS_OK;
}

/* Decode position p of turn tk: every KV head selects, attends over S_t, is accounted and measured, observes; then
 * the layer's decode sync. */
static kvs_status decode_step(ref_run *r, int layer, int64_t p, int64_t tk, int measured, int64_t measured_steps) {
    const struct kvs_policy_ops *ops = r->rc->policy.ops;
    const kvs_policy_model *m = &r->src->model;
    const kvs_turn *turn = &r->src->turns[tk];
    size_t N = (size_t)r->N, d = (size_t)r->d, G = (size_t)r->G;
    kvs_status st;
    for (int h = 0; h < r->H; h++) {
        void *state = r->states[h];
        kvs_policy_view view = {
            .n = p + 1, .group = r->G, .head_dim = r->d, .scale = m->scale,
            .k = kvs_host_rep_rows(r->rep, h, KVS_CODEC_K, r->ld.k + (size_t)h * N * d),
            .v = kvs_host_rep_rows(r->rep, h, KVS_CODEC_V, r->ld.v + (size_t)h * N * d),
            .q = r->ld.q + ((size_t)h * N + (size_t)p) * G * d, .q_first = p, .n_q = 1, .turn_begin = turn->begin,
            .prompt_end = turn->prompt_end, .turn = (int32_t)tk, .block_begin = p, .last_block = 1,
            .full_probs = ops->is_oracle ? r->fullp + (size_t)h * G * N : NULL,
        };
        kvs_policy_sel sel = {.idx = r->idx, .n = r->n, .n_lists = r->n_lists, .cap = r->N, .row_k = r->row_k,
                              .row_v = r->row_v};
        for (int li = 0; li < r->n_lists; li++) r->n[li] = 0;
        int has_merged[64];
        double kv_slots, dedup;
        if ((st = ops->select(state, &view, &sel)) != KVS_OK) return st;
        if ((st = check(r, state, p, r->budgets[(size_t)layer * (size_t)r->H + (size_t)h], &sel, has_merged, &kv_slots,
                        &dedup)) != KVS_OK)
            return st;
        if (r->page > 0) {
            if ((st = page_step(r, layer, h, p, measured, measured_steps, &view, &sel)) != KVS_OK) return st;
            continue;
        }
        for (int g = 0; g < r->G; g++) {
            int li = r->n_lists == 1 ? 0 : g;
            const float *q = view.q + (size_t)g * d, *keys = view.k, *vals = view.v;
            const int32_t *idx = sel.idx[li];
            if (has_merged[li]) { /* the list's rows in list order: trace rows and the policy's merged rows */
                for (int64_t j = 0; j < sel.n[li]; j++) {
                    const float *kr = sel.row_k[li][j] ? sel.row_k[li][j] : view.k + (size_t)idx[j] * d;
                    const float *vr = sel.row_v[li][j] ? sel.row_v[li][j] : view.v + (size_t)idx[j] * d;
                    memcpy(r->gk + (size_t)j * d, kr, d * sizeof(float));
                    memcpy(r->gv + (size_t)j * d, vr, d * sizeof(float));
                }
                keys = r->gk, vals = r->gv, idx = NULL;
            }
            kvs_attention(q, keys, vals, d, idx, (size_t)sel.n[li], d, m->scale, r->probs[g], r->out + (size_t)g * d);
        }
        kvs_policy_cost cost;
        if (r->rep) {
            if ((st = kvs_host_rep_cost(r->rep, h, ops, state, m, &view, &sel, p, &cost)) != KVS_OK) return st;
        } else {
            kvs_host_cost(ops, state, m, &view, &sel, kv_slots, dedup, &cost);
        }
        if (measured)
            for (int g = 0; g < r->G; g++) {
                int li = r->n_lists == 1 ? 0 : g;
                const float *const *merged = has_merged[li] ? sel.row_k[li] : NULL;
                if ((st = measure(r, layer, h, g, p, sel.idx[li], merged, sel.n[li], r->out + (size_t)g * d, &cost,
                                  measured_steps)) != KVS_OK)
                    return st;
            }
        /* what the next position cannot attend is gone before the policy decides what to keep */
        if ((st = kvs_host_window_evict(ops, state, kvs_host_window_first(r->window, p + 1))) != KVS_OK) return st;
        if (ops->observe && (st = ops->observe(state, &view, &sel, (const float *const *)r->probs)) != KVS_OK) return st;
        for (int li = 0; li < r->n_lists; li++)
            for (int64_t j = 0; j < sel.n[li]; j++) r->row_k[li][j] = r->row_v[li][j] = NULL;
    }
    if (ops->layer_sync && (st = ops->layer_sync(r->states, r->H, KVS_SYNC_DECODE)) != KVS_OK) return st;
    return KVS_OK;
}

/* Replays layer `layer` of the run: instances, then every position in order. */
static kvs_status run_layer(ref_run *r, int layer, uint64_t run_seed, const void *shared) {
    const kvs_replay_config *rc = r->rc;
    kvs_status st = layer_read(r->src, layer, 0, r->H, &r->ld);
    if (st != KVS_OK) return st;
    r->window = r->src->layer_window && r->src->layer_window[layer] > 0 && r->src->layer_window[layer] < r->N
                    ? r->src->layer_window[layer]
                    : 0;
    int64_t blk = 0;
    kvs_host_rep_free(r->rep);
    r->rep = NULL;
    if (r->codec && (st = kvs_host_rep_create(r->codec, &r->src->model, &r->rep)) != KVS_OK) return st;
    if (r->rep) kvs_host_rep_window(r->rep, r->window);
    for (int h = 0; h < r->H; h++) {
        r->hk[h] = r->ld.k + (size_t)h * (size_t)r->N * (size_t)r->d;
        r->hv[h] = r->ld.v + (size_t)h * (size_t)r->N * (size_t)r->d;
    }
    if ((st = kvs_host_create_layer(&rc->policy, &r->src->model, rc->budget, r->budgets + (size_t)layer * (size_t)r->H,
                                    run_seed, layer, shared, r->states, &blk)) != KVS_OK)
        return st;
    int64_t measured_steps = 0, bb = 0, tk = 0;
    for (int64_t p = 0; p < r->N && st == KVS_OK; p++) {
        while (tk + 1 < r->src->n_turns && p >= r->src->turns[tk].end) tk++;
        const kvs_turn *turn = &r->src->turns[tk];
        int is_prompt = p < turn->prompt_end;
        kvs_replay_measure ms = r->o->measure;
        int measured = ms == KVS_MEASURE_ALL || (ms == KVS_MEASURE_PREFILL) == is_prompt;
        if (measured || (!is_prompt && rc->policy.ops->is_oracle)) full_attention(r, p);
        /* the codec at step p + 1 (nothing within the first prompt) */
        if (r->rep) st = kvs_host_rep_sync(r->rep, r->hk, r->hv, p + 1);
        if (st != KVS_OK) break;
        if (is_prompt) {
            if (p == turn->begin) bb = p;
            int64_t be = blk > 0 && bb + blk < turn->prompt_end ? bb + blk : turn->prompt_end;
            if (measured) st = prompt_step(r, layer, p, bb, be, measured_steps);
            if (st == KVS_OK && p == be - 1) {
                if (r->rep) st = kvs_host_rep_sync(r->rep, r->hk, r->hv, be);
                if (st == KVS_OK) st = prefill_call(r, tk, bb, be);
                bb = be;
            }
        } else {
            st = decode_step(r, layer, p, tk, measured, measured_steps);
        }
        if (measured) measured_steps++;
        if (r->o->cancel && *r->o->cancel)
            st = kvs_fail(KVS_ERR_INTERRUPTED, "reference replay interrupted at layer %d, position %lld", layer,
                          (long long)p);
    }
    kvs_host_free_layer(&rc->policy, r->states, r->H);
    kvs_host_rep_free(r->rep);
    r->rep = NULL;
    return st;
}

static void ref_run_free(ref_run *r) {
    for (int g = 0; g < r->G; g++) {
        if (r->idx) free(r->idx[g]);
        if (r->probs) free(r->probs[g]);
        if (r->aidx) free(r->aidx[g]);
        if (r->place) free(r->place[g]);
        if (r->ark) free((void *)r->ark[g]);
        if (r->arv) free((void *)r->arv[g]);
        if (r->pa) free(r->pa[g]);
        if (r->row_k) free((void *)r->row_k[g]);
        if (r->row_v) free((void *)r->row_v[g]);
    }
    free(r->idx);
    free(r->n);
    free((void *)r->row_k);
    free((void *)r->row_v);
    free(r->probs);
    free(r->aidx);
    free(r->place);
    free((void *)r->ark);
    free((void *)r->arv);
    free(r->an);
    free(r->pa);
    free(r->pcount);
    free(r->ptake);
    free(r->pscore);
    free(r->escore);
    free(r->pscored);
    free(r->out);
    free(r->gk);
    free(r->gv);
    free(r->fullp);
    free(r->fullo);
    free(r->stored);
    free(r->order);
    free(r->mark);
    free(r->umark);
    free(r->states);
    free((void *)r->hk);
    free((void *)r->hv);
    kvs_host_rep_free(r->rep);
    free(r->samples);
    free(r->layer_first);
    free(r->steps);
    layer_free(&r->ld);
}

static kvs_status ref_run_alloc(ref_run *r) {
    size_t N = (size_t)r->N, d = (size_t)r->d, G = (size_t)r->G, H = (size_t)r->H;
    r->idx = calloc(G, sizeof *r->idx);
    r->n = calloc(G, sizeof *r->n);
    r->row_k = calloc(G, sizeof *r->row_k);
    r->row_v = calloc(G, sizeof *r->row_v);
    r->probs = calloc(G, sizeof *r->probs);
    r->out = malloc(G * d * sizeof(float));
    r->gk = malloc(N * d * sizeof(float));
    r->gv = malloc(N * d * sizeof(float));
    r->fullp = malloc(H * G * N * sizeof(float));
    r->fullo = malloc(H * G * d * sizeof(float));
    r->stored = malloc((N + 1) * sizeof(int32_t));
    r->order = malloc(N * sizeof(int32_t));
    r->mark = calloc(N, 1);
    r->umark = calloc(N, 1);
    r->states = calloc(H, sizeof *r->states);
    r->hk = calloc(H, sizeof *r->hk);
    r->hv = calloc(H, sizeof *r->hv);
    r->layer_first = calloc((size_t)r->L + 1, sizeof *r->layer_first);
    if (!r->idx || !r->n || !r->row_k || !r->row_v || !r->probs || !r->out || !r->gk || !r->gv || !r->fullp ||
        !r->fullo || !r->stored || !r->order || !r->mark || !r->umark || !r->states || !r->hk || !r->hv ||
        !r->layer_first)
        return kvs_fail(KVS_ERR_NOMEM, "reference replay: out of memory");
    if (r->page > 0) {
        r->aidx = calloc(G, sizeof *r->aidx);
        r->place = calloc(G, sizeof *r->place);
        r->ark = calloc(G, sizeof *r->ark);
        r->arv = calloc(G, sizeof *r->arv);
        r->an = calloc(G, sizeof *r->an);
        r->pa = calloc(G, sizeof *r->pa);
        r->pcount = malloc(N * sizeof *r->pcount);
        r->ptake = malloc(N);
        r->pscore = malloc(N * sizeof *r->pscore);
        r->escore = malloc(N * sizeof *r->escore);
        r->pscored = malloc(N);
        if (!r->aidx || !r->place || !r->ark || !r->arv || !r->an || !r->pa || !r->pcount || !r->ptake || !r->pscore ||
            !r->escore || !r->pscored)
            return kvs_fail(KVS_ERR_NOMEM, "reference replay: out of memory");
        for (size_t g = 0; g < G; g++) {
            r->aidx[g] = malloc(N * sizeof(int32_t));
            r->place[g] = malloc(N * sizeof(int32_t));
            r->ark[g] = malloc(N * sizeof **r->ark);
            r->arv[g] = malloc(N * sizeof **r->arv);
            r->pa[g] = malloc(N * sizeof(float));
            if (!r->aidx[g] || !r->place[g] || !r->ark[g] || !r->arv[g] || !r->pa[g])
                return kvs_fail(KVS_ERR_NOMEM, "reference replay: out of memory");
        }
    }
    for (size_t g = 0; g < G; g++) {
        r->idx[g] = malloc(N * sizeof(int32_t));
        r->probs[g] = malloc(N * sizeof(float));
        r->row_k[g] = calloc(N, sizeof **r->row_k);
        r->row_v[g] = calloc(N, sizeof **r->row_v);
        if (!r->idx[g] || !r->probs[g] || !r->row_k[g] || !r->row_v[g])
            return kvs_fail(KVS_ERR_NOMEM, "reference replay: out of memory");
    }
    return KVS_OK;
}

/* Statistics of samples [first, last) of metric k, by kvs_results_stat_compute. */
static kvs_status stat_of(const ref_run *r, int64_t first, int64_t last, int k, kvs_results_stat *out) {
    int64_t n = last - first;
    double *x = malloc((size_t)(n > 0 ? n : 1) * sizeof *x);
    if (!x) return kvs_fail(KVS_ERR_NOMEM, "reference replay: out of memory for statistics");
    for (int64_t i = 0; i < n; i++) x[i] = r->samples[(size_t)(first + i) * KVS_N_METRICS + (size_t)k];
    kvs_status st = kvs_results_stat_compute(x, n, out);
    free(x);
    return st;
}

/* Run c of the sweep, replayed alone into *res. A policy's failure is the run's status; other errors return. */
static kvs_status run_config(const kvs_replay_source *src, const kvs_replay_opts *o, int c, kvs_replay_run_result *res) {
    const kvs_policy_model *m = &src->model;
    ref_run r = {.src = src, .o = o, .rc = &o->configs[c], .codec = kvs_replay_codec_of(o, c),
                 .page = kvs_replay_page_of(o, c),
                 .rule = kvs_host_page_rule(o->configs[c].policy.ops, (kvs_page_score)kvs_replay_page_score_of(o, c)),
                 .L = m->n_layers, .H = m->n_kv_heads, .G = m->group,
                 .d = m->head_dim, .N = m->n_positions};
    r.n_lists = kvs_policy_layout(&r.rc->policy) == KVS_SEL_PER_QUERY_HEAD ? r.G : 1;
    size_t per = (size_t)r.L * (size_t)r.H;
    double t0 = kvs_now_s();
    void *alloc = NULL;
    const void *shared = NULL;
    res->n_layers = r.L;
    res->layer_aggs = calloc((size_t)r.L, sizeof *res->layer_aggs);
    res->budgets = malloc(per * sizeof(int64_t));
    kvs_status st = !res->layer_aggs || !res->budgets ? kvs_fail(KVS_ERR_NOMEM, "reference replay: out of memory")
                                                      : ref_run_alloc(&r);
    if (st != KVS_OK) goto done;
    r.budgets = res->budgets;
    uint64_t run_seed = kvs_host_run_seed(
        &(kvs_host_identity){.content_hash = src->content_hash, .policy = &r.rc->policy, .budget = r.rc->budget,
                             .codec = r.codec ? kvs_codec_spec(r.codec) : NULL, .page_tokens = r.page,
                             .page_score = r.rule},
        m);
    alloc_reader ar = {.src = src, .layer = -1};
    kvs_status pst = kvs_host_alloc_pass(&r.rc->policy, m, r.rc->budget, alloc_prompt_view, &ar, res->budgets, &alloc,
                                         &shared);
    layer_free(&ar.ld);
    for (int l = 0; l < r.L && pst == KVS_OK; l++) {
        r.layer_first[l] = r.n_samples;
        pst = run_layer(&r, l, run_seed, shared);
        if (pst != KVS_OK && (pst == KVS_ERR_NOMEM || pst == KVS_ERR_IO || pst == KVS_ERR_FORMAT ||
                              pst == KVS_ERR_TRUNCATED || pst == KVS_ERR_CHECKSUM || pst == KVS_ERR_INTERRUPTED)) {
            st = pst; /* the input or the machine, not the policy */
            goto done;
        }
        if (pst != KVS_OK) {
            res->status = pst;
            snprintf(res->error, sizeof res->error, "layer %d: %s", l, kvs_last_error());
        }
    }
    if (pst != KVS_OK && res->status == KVS_OK) {
        res->status = pst;
        snprintf(res->error, sizeof res->error, "layer 0: %s", kvs_last_error());
    }
    r.layer_first[r.L] = r.n_samples;
    if (res->status == KVS_OK) {
        for (int l = 0; l < r.L && st == KVS_OK; l++) {
            res->layer_aggs[l].layer = l;
            for (int k = 0; k < KVS_N_METRICS && st == KVS_OK; k++)
                if (r.layer_first[l + 1] > r.layer_first[l])
                    st = stat_of(&r, r.layer_first[l], r.layer_first[l + 1], k, &res->layer_aggs[l].m[k]);
        }
        res->run_agg.layer = -1;
        for (int k = 0; k < KVS_N_METRICS && st == KVS_OK; k++)
            if (r.n_samples > 0) st = stat_of(&r, 0, r.n_samples, k, &res->run_agg.m[k]);
        res->steps = r.steps, res->n_steps = r.n_steps;
        r.steps = NULL;
        res->max_attended = r.max_attended;
    }
done:
    kvs_host_alloc_free(&r.rc->policy, alloc);
    ref_run_free(&r);
    res->wall_seconds = kvs_now_s() - t0;
    return st;
}

kvs_status kvs_replay_reference(const kvs_replay_source *src, const kvs_replay_opts *o, kvs_replay_result **out) {
    *out = NULL;
    kvs_status st = kvs_replay_validate(src, o);
    if (st != KVS_OK) return st;
    if (src->model.group > 64) return kvs_fail(KVS_ERR_INVALID_ARG, "reference replay: at most 64 query heads a KV head");
    kvs_replay_result *r = calloc(1, sizeof *r);
    if (r) r->runs = calloc((size_t)o->n_configs, sizeof *r->runs);
    if (!r || !r->runs) {
        free(r);
        return kvs_fail(KVS_ERR_NOMEM, "reference replay: out of memory");
    }
    r->n_runs = o->n_configs;
    for (int c = 0; c < o->n_configs && st == KVS_OK; c++) st = run_config(src, o, c, &r->runs[c]);
    if (st != KVS_OK) {
        kvs_replay_result_free(r);
        return st;
    }
    *out = r;
    return KVS_OK;
}
