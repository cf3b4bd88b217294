/* replay.c — the replay engine (semantics in replay.h; ../shared/DESIGN.md "Replay" and "Metrics";
 * POLICY_SPEC.md §1.2 call order, §1.6 metrics).
 *
 * Layout of the work: a task = (layer, group of configurations). It opens the layer's KV-head streams and
 * advances them in lockstep, block by block, keeping the K/V history of each KV head (policies may point
 * at any position they store) and the current turn's prompt queries. At each position, shared work (the
 * full attention of every query head, and its descending order for the top-k overlap) is done once and
 * reused by every configuration of the task. Tasks run on a pthread pool pulling from an atomic counter.
 *
 * Leak discipline (DESIGN.md "Replay" 3): views expose positions 0..p only; decode views carry only the
 * current query; full attention reaches a policy only when its ops say is_oracle. Selections are checked
 * (positions in range, distinct, within budget for bounded policies): a violating policy fails its run.
 */
#include "replay.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/kvs_math.h"

/* ------------------------------------------------------------------------------------------------
 * Per-(configuration, layer) sample accumulator
 * ---------------------------------------------------------------------------------------------- */

enum { M_ERR, M_RECALL, M_OVERLAP, M_STORAGE, M_TRAFFIC, M_TRANSFER, M_RATIO, N_METRICS };

typedef struct {
    float *m[N_METRICS];   /* [n] samples of each metric */
    int64_t n, cap;
    kvs_results_step *series;
    int64_t n_series, cap_series;
    int64_t max_attended;
    double wall;
    kvs_status status;
    char error[512];
} layer_acc;

static kvs_status acc_push(layer_acc *a, const float v[N_METRICS]) {
    if (a->n == a->cap) {
        int64_t nc = a->cap ? 2 * a->cap : 1024;
        for (int i = 0; i < N_METRICS; i++) {
            float *p = realloc(a->m[i], (size_t)nc * sizeof(float));
            if (!p) return kvs_fail(KVS_ERR_NOMEM, "replay: out of memory for metric samples");
            a->m[i] = p;
        }
        a->cap = nc;
    }
    for (int i = 0; i < N_METRICS; i++) a->m[i][a->n] = v[i];
    a->n++;
    return KVS_OK;
}

static kvs_status acc_series(layer_acc *a, const kvs_results_step *s) {
    if (a->n_series == a->cap_series) {
        int64_t nc = a->cap_series ? 2 * a->cap_series : 256;
        kvs_results_step *p = realloc(a->series, (size_t)nc * sizeof *p);
        if (!p) return kvs_fail(KVS_ERR_NOMEM, "replay: out of memory for the step series");
        a->series = p;
        a->cap_series = nc;
    }
    a->series[a->n_series++] = *s;
    return KVS_OK;
}

static void acc_free(layer_acc *a) {
    for (int i = 0; i < N_METRICS; i++) free(a->m[i]);
    free(a->series);
}

/* ------------------------------------------------------------------------------------------------
 * Engine context
 * ---------------------------------------------------------------------------------------------- */

typedef struct {
    const kvs_replay_source *src;
    const kvs_replay_opts *o;
    int L, Hkv, G, d;
    int64_t N;
    int64_t max_prompt;      /* longest turn prompt */
    uint8_t *is_prompt;      /* [N] */
    int64_t *budgets;        /* [n_configs][L * Hkv] */
    layer_acc *acc;          /* [n_configs][L] */
    atomic_int *cfg_failed;  /* [n_configs] */
    int n_groups, n_tasks;
    atomic_int next_task;
    pthread_mutex_t mu;
    kvs_status fatal;
    char fatal_msg[512];
} engine;

static void set_fatal(engine *e, kvs_status st) {
    pthread_mutex_lock(&e->mu);
    if (e->fatal == KVS_OK) {
        e->fatal = st;
        snprintf(e->fatal_msg, sizeof e->fatal_msg, "%s", kvs_last_error());
    }
    pthread_mutex_unlock(&e->mu);
}

/* Marks configuration c failed at layer l with the calling thread's error detail. */
static void fail_config(engine *e, int c, int l, kvs_status st) {
    layer_acc *a = &e->acc[(size_t)c * (size_t)e->L + (size_t)l];
    if (a->status == KVS_OK) {
        a->status = st;
        snprintf(a->error, sizeof a->error, "layer %d: %s", l, kvs_last_error()[0] ? kvs_last_error() : kvs_strerror(st));
    }
    atomic_store(&e->cfg_failed[c], 1);
}

/* Checks that block `b` is the expected next block of (layer, h). */
static kvs_status check_block(const engine *e, const kvs_trace_block *b, int layer, int h, int64_t first) {
    if (b->layer != layer || b->kv_head != h || b->first_pos != first || b->n_pos <= 0 || first + b->n_pos > e->N ||
        b->group != e->G || b->head_dim != e->d)
        return kvs_fail(KVS_ERR_FORMAT,
                        "replay: stream (layer %d, kv head %d) gave block (layer %d, kv head %d, first %lld, %d "
                        "positions, group %d, d %d) where position %lld was expected",
                        layer, h, (int)b->layer, (int)b->kv_head, (long long)b->first_pos, (int)b->n_pos,
                        (int)b->group, (int)b->head_dim, (long long)first);
    return KVS_OK;
}

/* ------------------------------------------------------------------------------------------------
 * One task: one layer, configurations [c_lo, c_hi)
 * ---------------------------------------------------------------------------------------------- */

typedef struct {
    engine *e;
    int layer, c_lo, c_hi, nc;
    void **streams;           /* [Hkv] */
    float **hk, **hv;         /* [Hkv] -> [N][d] */
    float **qb;               /* [Hkv] -> [max_prompt][G][d] current turn's prompt queries */
    void **states;            /* [nc][Hkv] */
    void **sync_states;       /* [Hkv] scratch */
    kvs_policy_granularity *layout; /* [nc] */
    int32_t **sel_idx;        /* [G] -> [N] */
    int64_t *sel_n;           /* [G] */
    float **pbuf;             /* [G] -> [N] policy attention */
    float *fullp;             /* [Hkv] blocks of G*N floats: [G][p+1] full attention of the current position */
    float *fullo;             /* [Hkv][G][d] */
    int32_t *order;           /* [N] rank -> position scratch of the ranking being built */
    uint32_t *sort_scratch;   /* [3N] scratch of kvs_argsort_desc */
    int32_t *rank;            /* [Hkv][G][N] position -> rank in the descending full attention */
    float *outp;              /* [G][d] policy-side outputs of the current step */
    int32_t *stored;          /* [N] */
    uint8_t *mark;            /* [N] */
    int64_t measured_steps;   /* measured positions so far (series downsampling) */
} task;

static void task_free(task *t) {
    engine *e = t->e;
    if (t->states) {
        for (int ci = 0; ci < t->nc; ci++) {
            const struct kvs_policy_ops *ops = e->o->configs[t->c_lo + ci].policy.ops;
            for (int h = 0; h < e->Hkv; h++) ops->free(t->states[(size_t)ci * (size_t)e->Hkv + (size_t)h]);
        }
    }
    for (int h = 0; h < e->Hkv; h++) {
        if (t->streams) e->src->stream_free(t->streams[h]);
        if (t->hk) free(t->hk[h]);
        if (t->hv) free(t->hv[h]);
        if (t->qb) free(t->qb[h]);
    }
    for (int g = 0; g < e->G; g++) {
        if (t->sel_idx) free(t->sel_idx[g]);
        if (t->pbuf) free(t->pbuf[g]);
    }
    free(t->streams);
    free(t->hk);
    free(t->hv);
    free(t->qb);
    free(t->states);
    free(t->sync_states);
    free(t->layout);
    free(t->sel_idx);
    free(t->sel_n);
    free(t->pbuf);
    free(t->fullp);
    free(t->fullo);
    free(t->order);
    free(t->sort_scratch);
    free(t->rank);
    free(t->outp);
    free(t->stored);
    free(t->mark);
}

static kvs_status task_alloc(task *t) {
    engine *e = t->e;
    size_t H = (size_t)e->Hkv, G = (size_t)e->G, N = (size_t)e->N, d = (size_t)e->d;
    size_t mp = (size_t)(e->max_prompt > 0 ? e->max_prompt : 1);
    t->streams = calloc(H, sizeof *t->streams);
    t->hk = calloc(H, sizeof *t->hk);
    t->hv = calloc(H, sizeof *t->hv);
    t->qb = calloc(H, sizeof *t->qb);
    t->states = calloc((size_t)t->nc * H, sizeof *t->states);
    t->sync_states = calloc(H, sizeof *t->sync_states);
    t->layout = calloc((size_t)t->nc, sizeof *t->layout);
    t->sel_idx = calloc(G, sizeof *t->sel_idx);
    t->sel_n = calloc(G, sizeof *t->sel_n);
    t->pbuf = calloc(G, sizeof *t->pbuf);
    t->fullp = malloc(H * G * N * sizeof(float));
    t->fullo = malloc(H * G * d * sizeof(float));
    t->order = malloc(N * sizeof(int32_t));
    t->sort_scratch = malloc(3 * N * sizeof(uint32_t));
    t->rank = malloc(H * G * N * sizeof(int32_t));
    t->outp = malloc(G * d * sizeof(float));
    t->stored = malloc(N * sizeof(int32_t));
    t->mark = calloc(N, 1);
    if (!t->streams || !t->hk || !t->hv || !t->qb || !t->states || !t->sync_states || !t->layout || !t->sel_idx ||
        !t->sel_n || !t->pbuf || !t->fullp || !t->fullo || !t->order || !t->sort_scratch || !t->rank || !t->outp || !t->stored || !t->mark)
        return kvs_fail(KVS_ERR_NOMEM, "replay: out of memory (layer %d)", t->layer);
    for (size_t h = 0; h < H; h++) {
        t->hk[h] = malloc(N * d * sizeof(float));
        t->hv[h] = malloc(N * d * sizeof(float));
        t->qb[h] = malloc(mp * G * d * sizeof(float));
        if (!t->hk[h] || !t->hv[h] || !t->qb[h])
            return kvs_fail(KVS_ERR_NOMEM, "replay: out of memory for the K/V history of layer %d", t->layer);
    }
    for (size_t g = 0; g < G; g++) {
        t->sel_idx[g] = malloc(N * sizeof(int32_t));
        t->pbuf[g] = malloc(N * sizeof(float));
        if (!t->sel_idx[g] || !t->pbuf[g]) return kvs_fail(KVS_ERR_NOMEM, "replay: out of memory (layer %d)", t->layer);
    }
    return KVS_OK;
}

static uint64_t mix_seed(uint64_t a, uint64_t b) {
    uint64_t x = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull);
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    return x;
}

/* Creates every instance of the task (configurations already validated). A failure fails the config. */
static void task_create_states(task *t) {
    engine *e = t->e;
    for (int ci = 0; ci < t->nc; ci++) {
        int c = t->c_lo + ci;
        const kvs_replay_config *rc = &e->o->configs[c];
        t->layout[ci] = kvs_policy_layout(&rc->policy);
        for (int h = 0; h < e->Hkv; h++) {
            kvs_policy_init init = {
                .model = &e->src->model,
                .cfg = &rc->policy,
                .layer = t->layer,
                .kv_head = h,
                .budget = e->budgets[(size_t)c * (size_t)e->L * (size_t)e->Hkv + (size_t)t->layer * (size_t)e->Hkv + (size_t)h],
                .budget_nominal = rc->budget,
                .seed = mix_seed(mix_seed((uint64_t)c + 1, (uint64_t)t->layer), (uint64_t)h),
            };
            kvs_status st = rc->policy.ops->create(&init, &t->states[(size_t)ci * (size_t)e->Hkv + (size_t)h]);
            if (st != KVS_OK) {
                fail_config(e, c, t->layer, st);
                break;
            }
        }
    }
}

/* Full attention of query head (h, g) at position p over 0..p, plus its descending order (for the top-k
 * overlap) when measured. Same kvs_attention code path as the policy side, so `full` matches bit for bit. */
static void full_attention(task *t, int h, int g, const float *q, int64_t p, int measured) {
    engine *e = t->e;
    size_t N = (size_t)e->N, n = (size_t)p + 1;
    size_t off = ((size_t)h * (size_t)e->G + (size_t)g);
    /* Rows of one KV head are n apart so that view->full_probs is a contiguous [group][n] array. */
    float *probs = t->fullp + (size_t)h * (size_t)e->G * N + (size_t)g * n;
    kvs_attention(q, t->hk[h], t->hv[h], (size_t)e->d, NULL, n, (size_t)e->d, e->src->model.scale, probs,
                  t->fullo + off * (size_t)e->d);
    if (measured) {
        int32_t *order = t->order, *rank = t->rank + off * N;
        kvs_argsort_desc(probs, n, order, t->sort_scratch); /* same order as kvs_topk(probs, n, n), O(n) */
        for (size_t r = 0; r < n; r++) rank[order[r]] = (int32_t)r;
    }
}

/* Records the metrics of query head (h, g) at position p, whose output over `list` (n entries) is `out`. */
static kvs_status measure_head(task *t, int ci, int h, int g, int64_t p, const int32_t *list, int64_t n,
                               const float *out, const kvs_policy_cost *cost) {
    engine *e = t->e;
    int c = t->c_lo + ci;
    size_t off = ((size_t)h * (size_t)e->G + (size_t)g);
    const float *fp = t->fullp + (size_t)h * (size_t)e->G * (size_t)e->N + (size_t)g * (size_t)(p + 1);
    const int32_t *rank = t->rank + off * (size_t)e->N;
    double recall = 0;
    int64_t hit = 0;
    for (int64_t j = 0; j < n; j++) {
        recall += fp[list[j]];
        if (rank[list[j]] < n) hit++;
    }
    double full_bytes = kvs_policy_kv_bytes(&e->src->model, (double)(p + 1));
    float v[N_METRICS];
    v[M_ERR] = (float)kvs_rel_l2(t->fullo + off * (size_t)e->d, out, (size_t)e->d);
    v[M_RECALL] = (float)recall;
    v[M_OVERLAP] = n > 0 ? (float)((double)hit / (double)n) : 0.0f;
    v[M_STORAGE] = (float)cost->storage_bytes;
    v[M_TRAFFIC] = (float)cost->traffic_bytes;
    v[M_TRANSFER] = (float)cost->transfer_bytes;
    v[M_RATIO] = cost->storage_bytes > 0 ? (float)(full_bytes / cost->storage_bytes) : 0.0f;
    layer_acc *a = &e->acc[(size_t)c * (size_t)e->L + (size_t)t->layer];
    if (n > a->max_attended) a->max_attended = n;
    kvs_status st = acc_push(a, v);
    if (st != KVS_OK) return st;
    int64_t every = e->o->series_every;
    if (every > 0 && (t->measured_steps % every) == 0) {
        kvs_results_step s = {.layer = t->layer, .q_head = h * e->G + g, .position = p};
        for (int k = 0; k < KVS_N_METRICS; k++) s.v[k] = NAN;
        s.out_err = v[M_ERR];
        s.attn_recall = v[M_RECALL];
        s.topk_overlap = v[M_OVERLAP];
        s.attended_tokens = (double)n;
        s.storage_bytes = cost->storage_bytes;
        s.traffic_bytes = cost->traffic_bytes;
        st = acc_series(a, &s);
    }
    return st;
}

/* Validates a selection: positions in [0, p], distinct, at least one, and within budget. */
static kvs_status check_sel(task *t, int ci, int h, const kvs_policy_sel *sel, int64_t p) {
    engine *e = t->e;
    int c = t->c_lo + ci;
    const kvs_replay_config *rc = &e->o->configs[c];
    int64_t budget = e->budgets[(size_t)c * (size_t)e->L * (size_t)e->Hkv + (size_t)t->layer * (size_t)e->Hkv + (size_t)h];
    for (int li = 0; li < sel->n_lists; li++) {
        int64_t n = sel->n[li], n_prompt = 0;
        kvs_status st = KVS_OK;
        if (n < 1 || n > p + 1)
            st = kvs_fail(KVS_ERR_STATE, "policy %s selected %lld positions at position %lld", rc->policy.ops->name,
                          (long long)n, (long long)p);
        for (int64_t j = 0; st == KVS_OK && j < n; j++) {
            int32_t x = sel->idx[li][j];
            if (x < 0 || x > p)
                st = kvs_fail(KVS_ERR_STATE, "policy %s selected position %d at position %lld (future or invalid)",
                              rc->policy.ops->name, (int)x, (long long)p);
            else if (t->mark[x])
                st = kvs_fail(KVS_ERR_STATE, "policy %s selected position %d twice", rc->policy.ops->name, (int)x);
            else {
                t->mark[x] = 1;
                n_prompt += e->is_prompt[x];
            }
        }
        for (int64_t j = 0; j < n; j++) {
            int32_t x = sel->idx[li][j];
            if (x >= 0 && x <= p) t->mark[x] = 0;
        }
        if (st != KVS_OK) return st;
        kvs_policy_budget_scope scope = rc->policy.ops->budget_scope;
        if (scope == KVS_BUDGET_EVERY_STEP && n > budget)
            return kvs_fail(KVS_ERR_STATE, "policy %s attended %lld positions over its budget %lld at position %lld",
                            rc->policy.ops->name, (long long)n, (long long)budget, (long long)p);
        if (scope == KVS_BUDGET_PROMPT && n_prompt > budget)
            return kvs_fail(KVS_ERR_STATE, "policy %s kept %lld prompt positions over its budget %lld",
                            rc->policy.ops->name, (long long)n_prompt, (long long)budget);
    }
    return KVS_OK;
}

static void default_cost(const kvs_policy_model *m, const struct kvs_policy_ops *ops, const kvs_policy_sel *sel,
                         int64_t n, kvs_policy_cost *cost) {
    double attended = 0;
    for (int li = 0; li < sel->n_lists; li++) attended += (double)sel->n[li];
    cost->storage_bytes = kvs_policy_kv_bytes(m, ops->stored ? attended : (double)n);
    cost->traffic_bytes = kvs_policy_kv_bytes(m, attended);
    cost->transfer_bytes = 0;
}

/* A decode step of configuration ci at position p (every KV head, then the layer sync). */
static kvs_status decode_step(task *t, int ci, const kvs_trace_block *const *blk, int i, int64_t p, int64_t tk,
                              int measured) {
    engine *e = t->e;
    int c = t->c_lo + ci;
    const kvs_replay_config *rc = &e->o->configs[c];
    const struct kvs_policy_ops *ops = rc->policy.ops;
    const kvs_turn *turn = &e->src->turns[tk];
    size_t Gd = (size_t)e->G * (size_t)e->d;
    kvs_policy_sel sel = {.idx = t->sel_idx, .n = t->sel_n, .cap = e->N};
    sel.n_lists = t->layout[ci] == KVS_SEL_PER_QUERY_HEAD ? e->G : 1;
    kvs_status st = KVS_OK;
    for (int h = 0; h < e->Hkv; h++) {
        void *state = t->states[(size_t)ci * (size_t)e->Hkv + (size_t)h];
        const float *q = blk[h]->q + (size_t)i * Gd;
        kvs_policy_view view = {
            .n = p + 1, .group = e->G, .head_dim = e->d, .scale = e->src->model.scale,
            .k = t->hk[h], .v = t->hv[h], .q = q, .q_first = p, .n_q = 1,
            .turn_begin = turn->begin, .prompt_end = turn->prompt_end, .turn = (int32_t)tk,
            .full_probs = ops->is_oracle ? t->fullp + (size_t)h * (size_t)e->G * (size_t)e->N : NULL,
        };
        for (int li = 0; li < sel.n_lists; li++) sel.n[li] = 0;
        if ((st = ops->select(state, &view, &sel)) != KVS_OK) return st;
        if ((st = check_sel(t, ci, h, &sel, p)) != KVS_OK) return st;
        if (e->o->hooks && e->o->hooks->on_select) e->o->hooks->on_select(e->o->hooks->user, c, t->layer, h, p, &sel);
        kvs_policy_cost cost = {0};
        /* Attention first (observe needs it); accounting needs only the selection. */
        for (int g = 0; g < e->G; g++) {
            int li = sel.n_lists == 1 ? 0 : g;
            kvs_attention(q + (size_t)g * (size_t)e->d, t->hk[h], t->hv[h], (size_t)e->d, sel.idx[li], (size_t)sel.n[li],
                          (size_t)e->d, e->src->model.scale, t->pbuf[g], t->outp + (size_t)g * (size_t)e->d);
        }
        if (ops->account) ops->account(state, &view, &sel, &cost);
        else default_cost(&e->src->model, ops, &sel, p + 1, &cost);
        if (measured) {
            for (int g = 0; g < e->G; g++) {
                int li = sel.n_lists == 1 ? 0 : g;
                st = measure_head(t, ci, h, g, p, sel.idx[li], sel.n[li], t->outp + (size_t)g * (size_t)e->d, &cost);
                if (st != KVS_OK) return st;
            }
        }
        if (ops->observe && (st = ops->observe(state, &view, &sel, (const float *const *)t->pbuf)) != KVS_OK) return st;
    }
    if (ops->layer_sync) {
        for (int h = 0; h < e->Hkv; h++) t->sync_states[h] = t->states[(size_t)ci * (size_t)e->Hkv + (size_t)h];
        if ((st = ops->layer_sync(t->sync_states, e->Hkv, KVS_SYNC_DECODE)) != KVS_OK) return st;
    }
    return KVS_OK;
}

/* A measured prompt position (--measure all): S = the cache kept from earlier turns + the turn's prompt
 * positions up to p (chunked prefill against the compressed cache; full causal attention in turn 0). */
static kvs_status prompt_measure(task *t, int ci, int64_t p, int64_t tk) {
    engine *e = t->e;
    const struct kvs_policy_ops *ops = e->o->configs[t->c_lo + ci].policy.ops;
    const kvs_turn *turn = &e->src->turns[tk];
    size_t Gd = (size_t)e->G * (size_t)e->d;
    int n_lists = t->layout[ci] == KVS_SEL_PER_QUERY_HEAD ? e->G : 1;
    for (int h = 0; h < e->Hkv; h++) {
        void *state = t->states[(size_t)ci * (size_t)e->Hkv + (size_t)h];
        for (int li = 0; li < n_lists; li++) {
            int64_t m = 0;
            if (ops->stored) {
                m = ops->stored(state, li, t->stored);
                int64_t w = 0; /* keep only positions before the turn (the new prompt is added below) */
                for (int64_t j = 0; j < m; j++)
                    if (t->stored[j] < turn->begin) t->stored[w++] = t->stored[j];
                m = w;
            } else {
                for (int64_t j = 0; j < turn->begin; j++) t->stored[m++] = (int32_t)j;
            }
            for (int64_t j = turn->begin; j <= p; j++) t->stored[m++] = (int32_t)j;
            memcpy(t->sel_idx[li], t->stored, (size_t)m * sizeof(int32_t));
            t->sel_n[li] = m;
        }
        double slots = 0;
        for (int li = 0; li < n_lists; li++) slots += (double)t->sel_n[li];
        kvs_policy_cost cost = {.storage_bytes = kvs_policy_kv_bytes(&e->src->model, slots),
                                .traffic_bytes = kvs_policy_kv_bytes(&e->src->model, slots)};
        const float *qrow = t->qb[h] + (size_t)(p - turn->begin) * Gd;
        for (int g = 0; g < e->G; g++) {
            int li = n_lists == 1 ? 0 : g;
            kvs_attention(qrow + (size_t)g * (size_t)e->d, t->hk[h], t->hv[h], (size_t)e->d, t->sel_idx[li],
                          (size_t)t->sel_n[li], (size_t)e->d, e->src->model.scale, t->pbuf[g], t->outp);
            kvs_status st = measure_head(t, ci, h, g, p, t->sel_idx[li], t->sel_n[li], t->outp, &cost);
            if (st != KVS_OK) return st;
        }
    }
    return KVS_OK;
}

static kvs_status prefill_turn(task *t, int ci, int64_t tk) {
    engine *e = t->e;
    const struct kvs_policy_ops *ops = e->o->configs[t->c_lo + ci].policy.ops;
    const kvs_turn *turn = &e->src->turns[tk];
    kvs_status st;
    for (int h = 0; h < e->Hkv; h++) {
        kvs_policy_view view = {
            .n = turn->prompt_end, .group = e->G, .head_dim = e->d, .scale = e->src->model.scale,
            .k = t->hk[h], .v = t->hv[h], .q = t->qb[h], .q_first = turn->begin,
            .n_q = turn->prompt_end - turn->begin, .turn_begin = turn->begin, .prompt_end = turn->prompt_end,
            .turn = (int32_t)tk, .full_probs = NULL,
        };
        if ((st = ops->prefill(t->states[(size_t)ci * (size_t)e->Hkv + (size_t)h], &view)) != KVS_OK) return st;
    }
    if (ops->layer_sync) {
        for (int h = 0; h < e->Hkv; h++) t->sync_states[h] = t->states[(size_t)ci * (size_t)e->Hkv + (size_t)h];
        if ((st = ops->layer_sync(t->sync_states, e->Hkv, KVS_SYNC_PREFILL)) != KVS_OK) return st;
    }
    return KVS_OK;
}

static void step_end_hook(task *t, int ci, int64_t p) {
    engine *e = t->e;
    if (!e->o->hooks || !e->o->hooks->on_step_end) return;
    int c = t->c_lo + ci;
    for (int h = 0; h < e->Hkv; h++)
        e->o->hooks->on_step_end(e->o->hooks->user, c, t->layer, h, p, t->states[(size_t)ci * (size_t)e->Hkv + (size_t)h],
                                 e->o->configs[c].policy.ops, t->hk[h], t->hv[h], p + 1);
}

static kvs_status run_task(engine *e, int layer, int c_lo, int c_hi) {
    task t = {.e = e, .layer = layer, .c_lo = c_lo, .c_hi = c_hi, .nc = c_hi - c_lo};
    kvs_status st = task_alloc(&t);
    const kvs_trace_block **blk = NULL;
    int any_oracle = 0;
    double *cfg_time = NULL;
    if (st != KVS_OK) goto cleanup;
    blk = calloc((size_t)e->Hkv, sizeof *blk);
    cfg_time = calloc((size_t)t.nc, sizeof *cfg_time);
    if (!blk || !cfg_time) {
        st = kvs_fail(KVS_ERR_NOMEM, "replay: out of memory");
        goto cleanup;
    }
    for (int h = 0; h < e->Hkv; h++) KVS_TRY(st = e->src->stream_open(e->src->user, layer, h, &t.streams[h]));
    task_create_states(&t);
    for (int ci = 0; ci < t.nc; ci++) any_oracle |= e->o->configs[c_lo + ci].policy.ops->is_oracle;
    size_t Gd = (size_t)e->G * (size_t)e->d, d = (size_t)e->d;
    int64_t pos = 0, tk = 0;
    while (pos < e->N) {
        for (int h = 0; h < e->Hkv; h++) {
            st = e->src->stream_next(t.streams[h], &blk[h]);
            if (st == KVS_ERR_END)
                st = kvs_fail(KVS_ERR_TRUNCATED, "replay: stream (layer %d, kv head %d) ended at position %lld of %lld",
                              layer, h, (long long)pos, (long long)e->N);
            if (st != KVS_OK) goto cleanup;
            KVS_TRY(st = check_block(e, blk[h], layer, h, pos));
            if (blk[h]->n_pos != blk[0]->n_pos) {
                st = kvs_fail(KVS_ERR_FORMAT, "replay: KV heads of layer %d disagree on block sizes", layer);
                goto cleanup;
            }
        }
        for (int i = 0; i < blk[0]->n_pos; i++, pos++) {
            while (tk + 1 < e->src->n_turns && pos >= e->src->turns[tk].end) tk++;
            const kvs_turn *turn = &e->src->turns[tk];
            int is_prompt = pos < turn->prompt_end;
            int measured = e->o->measure == KVS_MEASURE_ALL || !is_prompt;
            double t0 = kvs_now_s();
            for (int h = 0; h < e->Hkv; h++) {
                memcpy(t.hk[h] + (size_t)pos * d, blk[h]->k + (size_t)i * d, d * sizeof(float));
                memcpy(t.hv[h] + (size_t)pos * d, blk[h]->v + (size_t)i * d, d * sizeof(float));
                if (is_prompt)
                    memcpy(t.qb[h] + (size_t)(pos - turn->begin) * Gd, blk[h]->q + (size_t)i * Gd, Gd * sizeof(float));
            }
            if (measured || (!is_prompt && any_oracle))
                for (int h = 0; h < e->Hkv; h++)
                    for (int g = 0; g < e->G; g++)
                        full_attention(&t, h, g, blk[h]->q + (size_t)i * Gd + (size_t)g * d, pos, measured);
            double shared = kvs_now_s() - t0;
            int active = 0;
            for (int ci = 0; ci < t.nc; ci++) active += !atomic_load(&e->cfg_failed[c_lo + ci]);
            for (int ci = 0; ci < t.nc; ci++) {
                int c = c_lo + ci;
                if (atomic_load(&e->cfg_failed[c])) continue;
                double t1 = kvs_now_s();
                kvs_status cs = KVS_OK;
                if (is_prompt) {
                    if (measured) cs = prompt_measure(&t, ci, pos, tk);
                    if (cs == KVS_OK && pos == turn->prompt_end - 1) {
                        cs = prefill_turn(&t, ci, tk);
                        if (cs == KVS_OK) step_end_hook(&t, ci, pos);
                    }
                } else {
                    cs = decode_step(&t, ci, blk, i, pos, tk, measured);
                    if (cs == KVS_OK) step_end_hook(&t, ci, pos);
                }
                if (cs != KVS_OK) fail_config(e, c, layer, cs);
                cfg_time[ci] += kvs_now_s() - t1 + (active ? shared / active : 0);
            }
            if (measured) t.measured_steps++;
        }
    }
    st = KVS_OK;
cleanup:
    if (cfg_time)
        for (int ci = 0; ci < t.nc; ci++) e->acc[(size_t)(c_lo + ci) * (size_t)e->L + (size_t)layer].wall += cfg_time[ci];
    free(cfg_time);
    free(blk);
    task_free(&t);
    return st;
}

static void *worker(void *arg) {
    engine *e = arg;
    for (;;) {
        int k = atomic_fetch_add(&e->next_task, 1);
        if (k >= e->n_tasks) break;
        pthread_mutex_lock(&e->mu);
        int stop = e->fatal != KVS_OK;
        pthread_mutex_unlock(&e->mu);
        if (stop) break;
        int layer = k / e->n_groups, grp = k % e->n_groups;
        int nc = e->o->n_configs;
        int c_lo = (int)((int64_t)nc * grp / e->n_groups), c_hi = (int)((int64_t)nc * (grp + 1) / e->n_groups);
        if (c_lo == c_hi) continue;
        kvs_status st = run_task(e, layer, c_lo, c_hi);
        if (st != KVS_OK) set_fatal(e, st);
    }
    return NULL;
}

/* ------------------------------------------------------------------------------------------------
 * Allocation pass (PyramidKV, Ada-KV, D2O): over the first turn's prompt of every (layer, KV head)
 * ---------------------------------------------------------------------------------------------- */

static kvs_status allocation_pass(engine *e) {
    const kvs_replay_opts *o = e->o;
    size_t per = (size_t)e->L * (size_t)e->Hkv;
    void **alloc = calloc((size_t)o->n_configs, sizeof *alloc);
    float *k = NULL, *v = NULL, *q = NULL;
    void *stream = NULL;
    kvs_status st = KVS_OK;
    int any = 0;
    if (!alloc) return kvs_fail(KVS_ERR_NOMEM, "replay: out of memory");
    for (int c = 0; c < o->n_configs; c++) {
        for (size_t i = 0; i < per; i++) e->budgets[(size_t)c * per + i] = o->configs[c].budget;
        const struct kvs_policy_ops *ops = o->configs[c].policy.ops;
        if (!ops->alloc_begin) continue;
        any = 1;
        if ((st = ops->alloc_begin(&o->configs[c].policy, &e->src->model, o->configs[c].budget, &alloc[c])) != KVS_OK) {
            fail_config(e, c, 0, st);
            alloc[c] = NULL;
        }
    }
    int64_t P = e->src->n_turns > 0 ? e->src->turns[0].prompt_end : 0;
    if (!any || P <= 0) goto finish;
    size_t d = (size_t)e->d, Gd = (size_t)e->G * d;
    k = malloc((size_t)P * d * sizeof(float));
    v = malloc((size_t)P * d * sizeof(float));
    q = malloc((size_t)P * Gd * sizeof(float));
    if (!k || !v || !q) {
        st = kvs_fail(KVS_ERR_NOMEM, "replay: out of memory for the allocation pass");
        goto cleanup;
    }
    for (int l = 0; l < e->L; l++)
        for (int h = 0; h < e->Hkv; h++) {
            KVS_TRY(st = e->src->stream_open(e->src->user, l, h, &stream));
            int64_t pos = 0;
            while (pos < P) {
                const kvs_trace_block *b;
                st = e->src->stream_next(stream, &b);
                if (st == KVS_ERR_END) st = kvs_fail(KVS_ERR_TRUNCATED, "replay: stream (layer %d, kv head %d) ended early", l, h);
                if (st != KVS_OK) goto cleanup;
                KVS_TRY(st = check_block(e, b, l, h, pos));
                for (int i = 0; i < b->n_pos && pos < P; i++, pos++) {
                    memcpy(k + (size_t)pos * d, b->k + (size_t)i * d, d * sizeof(float));
                    memcpy(v + (size_t)pos * d, b->v + (size_t)i * d, d * sizeof(float));
                    memcpy(q + (size_t)pos * Gd, b->q + (size_t)i * Gd, Gd * sizeof(float));
                }
            }
            e->src->stream_free(stream);
            stream = NULL;
            kvs_policy_view view = {
                .n = P, .group = e->G, .head_dim = e->d, .scale = e->src->model.scale, .k = k, .v = v, .q = q,
                .q_first = 0, .n_q = P, .turn_begin = 0, .prompt_end = P, .turn = 0, .full_probs = NULL,
            };
            for (int c = 0; c < o->n_configs; c++) {
                if (!alloc[c] || atomic_load(&e->cfg_failed[c])) continue;
                kvs_status cs = o->configs[c].policy.ops->alloc_prefill(alloc[c], l, h, &view);
                if (cs != KVS_OK) fail_config(e, c, l, cs);
            }
        }
finish:
    for (int c = 0; c < o->n_configs; c++) {
        if (!alloc[c] || atomic_load(&e->cfg_failed[c])) continue;
        int64_t *b = e->budgets + (size_t)c * per;
        kvs_status cs = o->configs[c].policy.ops->alloc_end(alloc[c], b);
        for (size_t i = 0; cs == KVS_OK && i < per; i++)
            if (b[i] < 1)
                cs = kvs_fail(KVS_ERR_STATE, "policy %s allocated budget %lld to (layer %zu, kv head %zu)",
                              o->configs[c].policy.ops->name, (long long)b[i], i / (size_t)e->Hkv, i % (size_t)e->Hkv);
        if (cs != KVS_OK) fail_config(e, c, 0, cs);
    }
    st = KVS_OK;
cleanup:
    if (stream) e->src->stream_free(stream);
    for (int c = 0; c < o->n_configs; c++)
        if (alloc[c]) o->configs[c].policy.ops->alloc_free(alloc[c]);
    free(alloc);
    free(k);
    free(v);
    free(q);
    return st;
}

/* ------------------------------------------------------------------------------------------------
 * Public entry points
 * ---------------------------------------------------------------------------------------------- */

kvs_status kvs_replay_validate(const kvs_replay_source *src, const kvs_replay_opts *o) {
    const kvs_policy_model *m = &src->model;
    if (o->n_configs < 1) return kvs_fail(KVS_ERR_INVALID_ARG, "replay: no policy configuration to run");
    if (m->n_layers < 1 || m->n_kv_heads < 1 || m->group < 1 || m->head_dim < 1 || m->n_positions < 1 ||
        m->n_positions > INT32_MAX || src->n_turns < 1)
        return kvs_fail(KVS_ERR_INVALID_ARG, "replay: the trace has no positions, layers or turns to replay");
    if (o->series_every < 0) return kvs_fail(KVS_ERR_INVALID_ARG, "replay: --series-every must be >= 0");
    if (o->threads < 0) return kvs_fail(KVS_ERR_INVALID_ARG, "replay: --threads must be >= 0");
    int64_t prev = 0;
    for (int64_t i = 0; i < src->n_turns; i++) {
        const kvs_turn *t = &src->turns[i];
        if (t->begin != prev || t->prompt_end < t->begin || t->end < t->prompt_end)
            return kvs_fail(KVS_ERR_FORMAT, "replay: turn %lld [%lld, %lld, %lld) is not contiguous", (long long)i,
                            (long long)t->begin, (long long)t->prompt_end, (long long)t->end);
        prev = t->end;
    }
    if (prev != m->n_positions)
        return kvs_fail(KVS_ERR_FORMAT, "replay: turns cover %lld of %lld positions", (long long)prev,
                        (long long)m->n_positions);
    for (int c = 0; c < o->n_configs; c++) {
        const kvs_replay_config *rc = &o->configs[c];
        if (rc->budget < 1 || rc->budget > m->n_positions)
            return kvs_fail(KVS_ERR_INVALID_ARG, "replay: budget %lld for policy %s is outside [1, %lld] (trace positions)",
                            (long long)rc->budget, rc->policy.ops->name, (long long)m->n_positions);
        kvs_status st = kvs_policy_validate(&rc->policy, m, rc->budget);
        if (st != KVS_OK) return st;
    }
    return KVS_OK;
}

void kvs_replay_result_free(kvs_replay_result *r) {
    if (!r) return;
    for (int i = 0; i < r->n_runs; i++) {
        free(r->runs[i].layer_aggs);
        free(r->runs[i].steps);
        free(r->runs[i].budgets);
    }
    free(r->runs);
    free(r);
}

/* Fills one kvs_results_agg from n samples of each metric (float arrays). */
static kvs_status agg_fill(kvs_results_agg *agg, int32_t layer, float *const *m, const int64_t *counts, int n_parts,
                           double *tmp) {
    kvs_results_stat *dst[N_METRICS] = {&agg->out_err,       &agg->attn_recall,    &agg->topk_overlap,
                                        &agg->storage_bytes, &agg->traffic_bytes,  &agg->transfer_bytes,
                                        &agg->compression_ratio};
    agg->layer = layer;
    for (int k = 0; k < N_METRICS; k++) {
        int64_t n = 0;
        for (int p = 0; p < n_parts; p++)
            for (int64_t j = 0; j < counts[p]; j++) tmp[n++] = m[(size_t)p * N_METRICS + (size_t)k][j];
        kvs_status st = kvs_results_stat_compute(tmp, n, dst[k]);
        if (st != KVS_OK) return st;
    }
    return KVS_OK;
}

static kvs_status build_results(engine *e, kvs_replay_result *r) {
    const kvs_replay_opts *o = e->o;
    size_t per = (size_t)e->L * (size_t)e->Hkv;
    int64_t max_n = 0;
    for (size_t i = 0; i < (size_t)o->n_configs * (size_t)e->L; i++)
        if (e->acc[i].n > max_n) max_n = e->acc[i].n;
    double *tmp = malloc((size_t)(max_n * e->L + 1) * sizeof(double));
    float **parts = malloc((size_t)e->L * N_METRICS * sizeof(float *));
    int64_t *counts = malloc((size_t)e->L * sizeof(int64_t));
    if (!tmp || !parts || !counts) {
        free(tmp);
        free(parts);
        free(counts);
        return kvs_fail(KVS_ERR_NOMEM, "replay: out of memory for aggregates");
    }
    kvs_status st = KVS_OK;
    for (int c = 0; c < o->n_configs && st == KVS_OK; c++) {
        kvs_replay_run_result *run = &r->runs[c];
        run->n_layers = e->L;
        run->layer_aggs = calloc((size_t)e->L, sizeof *run->layer_aggs);
        run->budgets = malloc(per * sizeof(int64_t));
        if (!run->layer_aggs || !run->budgets) {
            st = kvs_fail(KVS_ERR_NOMEM, "replay: out of memory for aggregates");
            break;
        }
        memcpy(run->budgets, e->budgets + (size_t)c * per, per * sizeof(int64_t));
        int64_t n_series = 0;
        for (int l = 0; l < e->L; l++) {
            layer_acc *a = &e->acc[(size_t)c * (size_t)e->L + (size_t)l];
            run->wall_seconds += a->wall;
            if (a->max_attended > run->max_attended) run->max_attended = a->max_attended;
            if (a->status != KVS_OK && run->status == KVS_OK) {
                run->status = a->status;
                snprintf(run->error, sizeof run->error, "%s", a->error);
            }
            n_series += a->n_series;
            for (int k = 0; k < N_METRICS; k++) parts[(size_t)l * N_METRICS + (size_t)k] = a->m[k];
            counts[l] = a->n;
            if ((st = agg_fill(&run->layer_aggs[l], l, &parts[(size_t)l * N_METRICS], &counts[l], 1, tmp)) != KVS_OK)
                break;
        }
        if (st != KVS_OK) break;
        if ((st = agg_fill(&run->run_agg, -1, parts, counts, e->L, tmp)) != KVS_OK) break;
        if (n_series > 0) {
            run->steps = malloc((size_t)n_series * sizeof *run->steps);
            if (!run->steps) {
                st = kvs_fail(KVS_ERR_NOMEM, "replay: out of memory for the step series");
                break;
            }
            for (int l = 0; l < e->L; l++) {
                layer_acc *a = &e->acc[(size_t)c * (size_t)e->L + (size_t)l];
                memcpy(run->steps + run->n_steps, a->series, (size_t)a->n_series * sizeof *a->series);
                run->n_steps += a->n_series;
            }
        }
    }
    free(tmp);
    free(parts);
    free(counts);
    return st;
}

kvs_status kvs_replay_execute(const kvs_replay_source *src, const kvs_replay_opts *o, kvs_replay_result **out) {
    *out = NULL;
    kvs_status st = kvs_replay_validate(src, o);
    if (st != KVS_OK) return st;
    engine e = {.src = src, .o = o};
    e.L = src->model.n_layers;
    e.Hkv = src->model.n_kv_heads;
    e.G = src->model.group;
    e.d = src->model.head_dim;
    e.N = src->model.n_positions;
    pthread_mutex_init(&e.mu, NULL);
    kvs_replay_result *r = NULL;
    pthread_t *th = NULL;
    int n_started = 0;
    e.is_prompt = calloc((size_t)e.N, 1);
    e.budgets = calloc((size_t)o->n_configs * (size_t)e.L * (size_t)e.Hkv, sizeof(int64_t));
    e.acc = calloc((size_t)o->n_configs * (size_t)e.L, sizeof *e.acc);
    e.cfg_failed = calloc((size_t)o->n_configs, sizeof *e.cfg_failed);
    r = calloc(1, sizeof *r);
    if (r) r->runs = calloc((size_t)o->n_configs, sizeof *r->runs);
    if (!e.is_prompt || !e.budgets || !e.acc || !e.cfg_failed || !r || !r->runs) {
        st = kvs_fail(KVS_ERR_NOMEM, "replay: out of memory");
        goto cleanup;
    }
    r->n_runs = o->n_configs;
    for (int c = 0; c < o->n_configs; c++) atomic_init(&e.cfg_failed[c], 0);
    for (int64_t i = 0; i < src->n_turns; i++) {
        const kvs_turn *t = &src->turns[i];
        if (t->prompt_end - t->begin > e.max_prompt) e.max_prompt = t->prompt_end - t->begin;
        for (int64_t p = t->begin; p < t->prompt_end; p++) e.is_prompt[p] = 1;
    }
    KVS_TRY(st = allocation_pass(&e));

    int threads = o->threads > 0 ? o->threads : kvs_n_cpus();
    e.n_groups = (threads + e.L - 1) / e.L;
    if (e.n_groups > o->n_configs) e.n_groups = o->n_configs;
    if (e.n_groups < 1) e.n_groups = 1;
    e.n_tasks = e.L * e.n_groups;
    if (threads > e.n_tasks) threads = e.n_tasks;
    atomic_init(&e.next_task, 0);
    if (threads <= 1) {
        worker(&e);
    } else {
        th = calloc((size_t)threads, sizeof *th);
        if (!th) {
            st = kvs_fail(KVS_ERR_NOMEM, "replay: out of memory");
            goto cleanup;
        }
        for (; n_started < threads; n_started++)
            if (pthread_create(&th[n_started], NULL, worker, &e) != 0) break;
        if (n_started == 0) worker(&e); /* could not start any thread: do the work here */
        for (int i = 0; i < n_started; i++) pthread_join(th[i], NULL);
    }
    if (e.fatal != KVS_OK) {
        st = kvs_fail(e.fatal, "%s", e.fatal_msg);
        goto cleanup;
    }
    KVS_TRY(st = build_results(&e, r));
    *out = r;
    r = NULL;
cleanup:
    if (e.acc)
        for (size_t i = 0; i < (size_t)o->n_configs * (size_t)e.L; i++) acc_free(&e.acc[i]);
    free(e.acc);
    free(e.is_prompt);
    free(e.budgets);
    free(e.cfg_failed);
    free(th);
    pthread_mutex_destroy(&e.mu);
    kvs_replay_result_free(r);
    return st;
}

/* ------------------------------------------------------------------------------------------------
 * Trace-backed source
 * ---------------------------------------------------------------------------------------------- */

static kvs_status trace_open_cb(void *user, int layer, int kv_head, void **stream) {
    return kvs_trace_stream_open(user, layer, kv_head, (kvs_trace_stream **)stream);
}
static kvs_status trace_next_cb(void *stream, const kvs_trace_block **blk) { return kvs_trace_stream_next(stream, blk); }
static void trace_free_cb(void *stream) { kvs_trace_stream_free(stream); }

kvs_status kvs_replay_source_from_trace(const kvs_trace *t, kvs_replay_source *out) {
    const kvs_trace_info *info = kvs_trace_info_get(t);
    memset(out, 0, sizeof *out);
    kvs_policy_model *m = &out->model;
    m->n_layers = info->model.n_layers;
    m->n_heads = info->model.n_heads;
    m->n_kv_heads = info->model.n_kv_heads;
    if (m->n_kv_heads < 1 || m->n_heads % m->n_kv_heads)
        return kvs_fail(KVS_ERR_FORMAT, "replay: trace has %d query heads and %d KV heads", (int)m->n_heads,
                        (int)m->n_kv_heads);
    m->group = m->n_heads / m->n_kv_heads;
    m->head_dim = info->model.head_dim;
    m->scale = info->model.attn_scale;
    m->kv_bytes = (int32_t)kvs_dtype_size((kvs_dtype)info->capture.dtype);
    m->aux_bytes = 4;
    m->n_positions = info->n_positions;
    m->prompt_len = info->prompt_len;
    m->max_new_tokens = info->capture.max_new_tokens;
    out->n_turns = info->n_turns;
    out->turns = info->turns;
    out->user = (void *)t; /* the callbacks only read through the const reader API */
    out->stream_open = trace_open_cb;
    out->stream_next = trace_next_cb;
    out->stream_free = trace_free_cb;
    return KVS_OK;
}

/* ------------------------------------------------------------------------------------------------
 * Budgets
 * ---------------------------------------------------------------------------------------------- */

kvs_status kvs_replay_parse_budgets(const char *text, int64_t n_positions, int64_t **budgets, double **fractions,
                                    int *n) {
    *budgets = NULL;
    *fractions = NULL;
    *n = 0;
    int cap = 1;
    for (const char *p = text; *p; p++) cap += *p == ',';
    int64_t *b = malloc((size_t)cap * sizeof *b);
    double *f = malloc((size_t)cap * sizeof *f);
    if (!b || !f) {
        free(b);
        free(f);
        return kvs_fail(KVS_ERR_NOMEM, "replay: out of memory");
    }
    int cnt = 0;
    const char *p = text;
    kvs_status st = KVS_OK;
    for (;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char item[64];
        if (len == 0 || len >= sizeof item) {
            st = kvs_fail(KVS_ERR_INVALID_ARG, "--budgets: empty or overlong entry in '%s'", text);
            break;
        }
        memcpy(item, p, len);
        item[len] = 0;
        char *end;
        if (item[len - 1] == '%') {
            item[len - 1] = 0;
            double pct = strtod(item, &end);
            if (end == item || *end || !isfinite(pct) || pct <= 0 || pct > 100) {
                st = kvs_fail(KVS_ERR_INVALID_ARG, "--budgets: '%.*s' is not a percentage in (0, 100]", (int)len, p);
                break;
            }
            double frac = pct / 100.0;
            int64_t v = (int64_t)ceil(frac * (double)n_positions - 1e-9);
            if (v < 1) v = 1;
            if (v > n_positions) v = n_positions;
            b[cnt] = v;
            f[cnt] = frac;
        } else {
            long long v = strtoll(item, &end, 10);
            if (end == item || *end) {
                st = kvs_fail(KVS_ERR_INVALID_ARG, "--budgets: '%s' is not a token count or a percentage", item);
                break;
            }
            if (v < 1) {
                st = kvs_fail(KVS_ERR_INVALID_ARG, "--budgets: budget %lld must be at least 1 token", v);
                break;
            }
            if (v > n_positions) {
                st = kvs_fail(KVS_ERR_INVALID_ARG, "--budgets: budget %lld is larger than the trace's %lld positions", v,
                              (long long)n_positions);
                break;
            }
            b[cnt] = v;
            f[cnt] = -1;
        }
        cnt++;
        if (!comma) break;
        p = comma + 1;
    }
    if (st != KVS_OK) {
        free(b);
        free(f);
        return st;
    }
    *budgets = b;
    *fractions = f;
    *n = cnt;
    return KVS_OK;
}
