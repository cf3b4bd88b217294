/* replay.c — the fast replay driver (semantics in replay.h; ../shared/DESIGN.md "Replay" and "Metrics";
 * POLICY_SPEC.md §1.2 call order, §1.6 metrics). Every rule that decides a number — seeds, allocation pass,
 * instances, the selection check, the accounting, the metric formulas — is the policy host's (host.h), shared with
 * closed-loop decoding; what this file adds is speed, held to the reference replay (replay_ref.c) bit for bit by
 * tests/test_replay_ref.c.
 *
 * Layout of the work: a task = (layer, group of configurations). It opens the layer's KV-head streams and
 * advances them in lockstep, block by block, keeping the K/V history of each KV head (policies may point
 * at any position they store) and the current turn's prompt queries. At each position, shared work (the
 * full attention of every query head, and its descending order for the top-k overlap, as deep as the task's
 * lists ask: sim/ref_rank.h) is done once and reused by every configuration of the task. At a decode position the
 * configurations go in phases, KV head by KV head (decode_position): every one selects and takes its softmax, one
 * pass over the head's value rows computes all their outputs, then every one is measured and observes; each
 * configuration's own calls keep their order, so its numbers are those of a replay of it alone. Tasks run on a
 * thread pool (common/threadpool.h) whose workers pull from an atomic counter.
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
#include "../common/kvs_math_simd_f64.h"
#include "../common/kvs_math_simd.h"
#include "../common/threadpool.h"
#include "host.h"
#include "policy_memo.h"
#include "ref_rank.h"
#include "samples.h"

/* ------------------------------------------------------------------------------------------------
 * Per-(configuration, layer) sample accumulator
 * ---------------------------------------------------------------------------------------------- */

/* One sample = one value per metric of sim/metrics.h, stored as float (byte counts above 2^24 round to
 * 24 significant bits, a relative 6e-8; the step series keeps doubles). */
#define N_METRICS KVS_N_METRICS

typedef struct {
    kvs_sample_set *samples; /* every measured sample's metrics; buffered, spilled to the task's file */
    kvs_results_step *series;
    int64_t n_series, cap_series;
    int64_t max_attended;
    double wall;
    kvs_status status;
    char error[512];
} layer_acc;

static kvs_status acc_push(layer_acc *a, const float v[N_METRICS]) { return kvs_sample_set_push(a->samples, v); }

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
    kvs_sample_set_free(a->samples);
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
    int64_t *budgets;        /* [n_configs][L * Hkv] */
    uint64_t *run_seed;      /* [n_configs] kvs_host_run_seed of each run */
    void **alloc;            /* [n_configs] allocation-pass objects, alive until every instance is freed */
    const void **shared;     /* [n_configs] alloc_shared() results (init->shared), NULL if none */
    layer_acc *acc;          /* [n_configs][L] */
    atomic_int *cfg_failed;  /* [n_configs] */
    int n_groups, n_tasks;
    kvs_sample_spill **spills; /* [n_tasks] one spill file per task (its single writer), alive until the
                                * aggregates are computed */
    atomic_int next_task;
    pthread_mutex_t mu;
    atomic_llong steps_done;   /* (layer, position) steps replayed by all tasks, for progress */
    atomic_llong last_progress_us; /* kvs_now_s() of the last report, microseconds */
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

/* The next of n work items from the shared counter `next`, or -1 when none is left or a thread has failed
 * (set_fatal): the claim loop of the replay's workers and of the statistics' (build_results). */
static int claim_next(engine *e, atomic_int *next, int n) {
    int k = atomic_fetch_add(next, 1);
    if (k >= n) return -1;
    pthread_mutex_lock(&e->mu);
    int stop = e->fatal != KVS_OK;
    pthread_mutex_unlock(&e->mu);
    return stop ? -1 : k;
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
    int64_t window;           /* the layer's attention window (replay.h "Sliding-window layers"), 0 = full causal */
    void **streams;           /* [Hkv] */
    float **hk, **hv;         /* [Hkv] -> [N][d], slices of kv_rows */
    float *kv_rows;           /* every KV head's K then V history, one kvs_alloc_rows block (gathered rows) */
    uint16_t *kv16_rows;      /* the same for hk16/hv16 */
    kvs_dtype kv16;           /* the 16-bit history's dtype, KVS_DTYPE_F32 when there is none (history16_dtype) */
    uint16_t **hk16, **hv16;  /* [Hkv] -> [N][d] the same rows in the source's 16 bits (kv16 != F32), read by the
                               * reference and the group attention; hk/hv are their exact conversion */
    float **qb;               /* [Hkv] -> [max_prompt][G][d] current turn's prompt queries */
    void **states;            /* [nc][Hkv] */
    kvs_policy_granularity *layout; /* [nc] */
    int32_t **sel_idx;        /* [G] -> [N] */
    int64_t *sel_n;           /* [G] */
    float **pbuf;             /* [G] -> [N] policy attention */
    float *fullp;             /* [ref_cap][Hkv] blocks of G*N floats: [G][p+1] full attention of each position of
                               * the reference block */
    float *fullo;             /* [ref_cap][Hkv][G][d] */
    int64_t ref_cap;          /* positions per reference block (about 32 query rows of a KV head) */
    int64_t ref_first, ref_n; /* positions ref_first .. ref_first+ref_n-1 have their full attention computed */
    float *fulls;             /* NULL, or (ref_scores) laid out as fullp: each row's scaled scores before the softmax,
                               * the scores of any selection at that position (kvs_attention_group_scored) */
    float *cur_p, *cur_o;     /* the current position's blocks of fullp and fullo (NULL: no reference) */
    float *cur_s;             /* the current position's block of fulls (NULL: none) */
    float **ref_prow, **ref_orow, **ref_srow; /* [ref_cap*G] row pointers for kvs_attention_causal_block */
    float **srow;             /* [G] the current KV head's rows of cur_s */
    int32_t *order;           /* [N] the leading part of the ranking being built (kvs_ref_rank_prefix) */
    uint32_t *sort_scratch;   /* [3N] scratch of kvs_ref_rank_prefix */
    int32_t *rank;            /* [Hkv][G][N] position -> rank in the descending full attention of query head hg,
                               * exact below top_m[hg], top_m[hg] for the rest (kvs_ref_rank_positions); valid at
                               * position top_pos[hg] */
    int64_t *top_m;           /* [Hkv*G] */
    int64_t *top_pos;         /* [Hkv*G] the position rank[hg] ranks, -1 for none yet */
    int64_t *top_hint;        /* [Hkv*G] the longest list ranked at hg so far: the depth asked for next time */
    double rank_seconds;      /* time spent ranking, shared out among the configurations like the reference */
    double *prefix_recall;    /* [Hkv*G] the recall of the whole prefix 0..p in order at position prefix_pos[hg]: the
                               * same sum for every configuration whose list is the prefix (full cache) */
    int64_t *prefix_pos;      /* [Hkv*G] -1 for none yet */
    float *outp;              /* [G][d] policy-side outputs of the current step */
    int32_t *stored;          /* [N] a policy's stored() answer (prompt measurement) */
    kvs_host_check *check;    /* the selection check's scratch */
    int64_t measured_steps;   /* measured positions so far (series downsampling) */
    const float ***row_k, ***row_v; /* [G] -> [N] merged-slot row pointers (sel.row_k/row_v), kept all NULL */
    float *gk, *gv;           /* [N][d] gathered K/V of a list holding merged slots */
    int64_t *blk_size;        /* [nc] chunked-prefill block size (0 = whole prompt) */
    int64_t *blk_begin;       /* [nc] first position of the current prefill block */
    kvs_policy_view *views;   /* [Hkv] decode views of the current position */
    int *has_merged;          /* [G] per list: holds merged slots this step */
    uint8_t *plain;           /* [G] per list: passed list_plain this step (strictly ascending in [0, p]) */
    float *lists_f;           /* kvs_attention_lists() scratch: [G][N] union scores / weights */
    int32_t *lists_i;         /* kvs_attention_lists() scratch: [G+1][N] the union, places in it */
    kvs_policy_memo *memo;    /* scores shared by this task's configurations at one position (NULL = none) */
    kvs_policy_view *oviews;  /* [Hkv] the oracles' decode views (full_probs set), filled when the task has one */
    struct cfg_step *steps;   /* [nc] each configuration's decode step at the current KV head (decode_position) */
    kvs_host_rep **rep;       /* [nc] the configuration's codec states (NULL: none), shared by the configurations of
                               * one canonical spec: the first of them owns it (rep_owner) */
    uint8_t *rep_owner;       /* [nc] */
    kvs_policy_view *cviews;  /* [nc][Hkv] a codec configuration's views over the codec's rows (decode_position) */
    kvs_out_call **call_ptrs; /* [nc * kvs_out_calls_max(G)] the deferred output calls of one KV head */
    /* page granularity (sim/host.h): each paged configuration's page map (NULL: token granularity), and, when the
     * task has one, a list's attended set (positions, rows: NULL = the trace's), the place of S_t's entries in it,
     * each query head's probabilities over it */
    kvs_host_page **pages;    /* [nc] */
    int32_t **att_idx, **att_place; /* [G] -> [N] */
    const float ***att_k, ***att_v; /* [G] -> [N] */
    int64_t *att_n;           /* [G] */
    int *att_merged;          /* [G] */
    float **att_p;            /* [G] -> [N] */
    double *att_score;        /* [N] the policy's retention scores of one list of S_t (the page score rules) */
} task;

/* A configuration's decode step at one KV head, kept from its selection to its metrics while the task's other
 * configurations select (decode_position): its selection, probabilities and output, and the calls of the output
 * kernel that the shared pass over the value rows runs for every configuration at once (kvs_out_calls_run). The
 * arenas grow to the largest selection seen. */
typedef struct cfg_step {
    int deferred;             /* 1: the output waits for the shared pass; 0: the step at this head is done */
    int32_t **idx;            /* [G] -> the selection's lists, copied into iarena */
    int64_t *n;               /* [G] */
    float **probs;            /* [G] -> each list's probabilities, in farena */
    float *out;               /* [G][d] */
    kvs_out_call *calls;      /* [kvs_out_calls_max(G)] */
    size_t n_calls;
    double fmas;              /* its entries x d (x G over a shared list): its share of the shared pass's time */
    double kv_slots, dedup;   /* check_sel's counts */
    int32_t *iarena;
    float *farena;
    size_t icap, fcap;
} cfg_step;

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
        if (t->qb) free(t->qb[h]);
    }
    for (int g = 0; g < e->G; g++) {
        if (t->sel_idx) free(t->sel_idx[g]);
        if (t->pbuf) free(t->pbuf[g]);
    }
    free(t->streams);
    free(t->kv_rows);
    free(t->kv16_rows);
    free(t->hk);
    free(t->hv);
    free(t->hk16);
    free(t->hv16);
    free(t->qb);
    free(t->states);
    free(t->layout);
    free(t->sel_idx);
    free(t->sel_n);
    free(t->pbuf);
    free(t->fullp);
    free(t->fullo);
    free(t->fulls);
    free((void *)t->ref_prow);
    free((void *)t->ref_orow);
    free((void *)t->ref_srow);
    free((void *)t->srow);
    free(t->order);
    free(t->sort_scratch);
    free(t->rank);
    free(t->top_m);
    free(t->top_pos);
    free(t->top_hint);
    free(t->prefix_recall);
    free(t->prefix_pos);
    free(t->outp);
    free(t->stored);
    kvs_host_check_free(t->check);
    for (int g = 0; g < e->G; g++) {
        if (t->row_k) free((void *)t->row_k[g]);
        if (t->row_v) free((void *)t->row_v[g]);
    }
    free((void *)t->row_k);
    free((void *)t->row_v);
    free(t->gk);
    free(t->gv);
    free(t->blk_size);
    free(t->blk_begin);
    free(t->views);
    free(t->has_merged);
    free(t->plain);
    free(t->lists_f);
    free(t->lists_i);
    kvs_policy_memo_free(t->memo);
    free(t->oviews);
    if (t->steps)
        for (int ci = 0; ci < t->nc; ci++) {
            cfg_step *cs = &t->steps[ci];
            free(cs->idx);
            free(cs->n);
            free(cs->probs);
            free(cs->out);
            free(cs->calls);
            free(cs->iarena);
            free(cs->farena);
        }
    free(t->steps);
    free((void *)t->call_ptrs);
    if (t->rep)
        for (int ci = 0; ci < t->nc; ci++)
            if (t->rep_owner[ci]) kvs_host_rep_free(t->rep[ci]);
    free(t->rep);
    free(t->rep_owner);
    free(t->cviews);
    if (t->pages)
        for (int ci = 0; ci < t->nc; ci++) kvs_host_page_free(t->pages[ci]);
    free(t->pages);
    for (int g = 0; g < e->G; g++) {
        if (t->att_idx) free(t->att_idx[g]);
        if (t->att_place) free(t->att_place[g]);
        if (t->att_k) free((void *)t->att_k[g]);
        if (t->att_v) free((void *)t->att_v[g]);
        if (t->att_p) free(t->att_p[g]);
    }
    free(t->att_idx);
    free(t->att_place);
    free((void *)t->att_k);
    free((void *)t->att_v);
    free(t->att_n);
    free(t->att_merged);
    free(t->att_p);
    free(t->att_score);
}

/* 1 when the policies' attention over S_t takes its scores from the full reference's (kvs_attention_group_scored:
 * the same bits, the score FMAs done once per position instead of once per configuration). Off when asked
 * (ref_scores < 0, the tests' comparison) or when an on_step_end hook is set (it may rewrite the rows the
 * reference read). */
static int reuse_ref_scores(const engine *e) {
    return e->o->ref_scores >= 0 && !(e->o->hooks && e->o->hooks->on_step_end);
}

/* The most bytes of a reference block's probabilities (and as many of its kept scores) per task. */
#define REF_BLOCK_MAX_BYTES ((size_t)32 << 20)

/* Decode steps of a reference block that hold `rows` query rows of a KV head of G: at least 1, at most 16. */
static int64_t ref_block_steps(int64_t rows, int64_t G) {
    int64_t steps = rows / G;
    return steps < 1 ? 1 : steps > 16 ? 16 : steps;
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
    t->layout = calloc((size_t)t->nc, sizeof *t->layout);
    t->sel_idx = calloc(G, sizeof *t->sel_idx);
    t->sel_n = calloc(G, sizeof *t->sel_n);
    t->pbuf = calloc(G, sizeof *t->pbuf);
    /* The reference is computed for blocks of decode steps at once (blocked causal attention: every K/V row read
     * once per block instead of once per position): 64 query rows of a KV head per block (at 8192 positions a
     * block's K/V rows come from L3 or memory, so more rows a block read them fewer times), fewer where its
     * probabilities (and as many kept scores) would pass REF_BLOCK_MAX_BYTES (a long trace with many heads), but never
     * fewer than 32 rows. */
    int64_t rows_min = ref_block_steps(32, (int64_t)G);
    t->ref_cap = ref_block_steps(64, (int64_t)G);
    while (t->ref_cap > rows_min && (size_t)t->ref_cap * H * G * N * sizeof(float) > REF_BLOCK_MAX_BYTES) t->ref_cap /= 2;
    if (t->ref_cap < rows_min) t->ref_cap = rows_min;
    size_t RC = (size_t)t->ref_cap;
    t->fullp = malloc(RC * H * G * N * sizeof(float));
    t->fullo = malloc(RC * H * G * d * sizeof(float));
    t->ref_prow = calloc(RC * G, sizeof *t->ref_prow);
    t->ref_orow = calloc(RC * G, sizeof *t->ref_orow);
    t->ref_srow = calloc(RC * G, sizeof *t->ref_srow);
    t->srow = calloc(G, sizeof *t->srow);
    if (!t->ref_prow || !t->ref_orow || !t->ref_srow || !t->srow)
        return kvs_fail(KVS_ERR_NOMEM, "replay: out of memory (layer %d)", t->layer);
    /* a sliding-window layer's reference is not blocked and keeps no scores (reference_block) */
    if (reuse_ref_scores(e) && !t->window && !(t->fulls = malloc(RC * H * G * N * sizeof(float))))
        return kvs_fail(KVS_ERR_NOMEM, "replay: out of memory (layer %d)", t->layer);
    t->order = malloc(N * sizeof(int32_t));
    t->sort_scratch = malloc(3 * N * sizeof(uint32_t));
    t->rank = malloc(H * G * N * sizeof(int32_t));
    t->top_m = calloc(H * G, sizeof *t->top_m);
    t->top_pos = malloc(H * G * sizeof *t->top_pos);
    t->top_hint = calloc(H * G, sizeof *t->top_hint);
    t->prefix_recall = calloc(H * G, sizeof *t->prefix_recall);
    t->prefix_pos = malloc(H * G * sizeof *t->prefix_pos);
    if (!t->top_m || !t->top_pos || !t->top_hint || !t->prefix_recall || !t->prefix_pos)
        return kvs_fail(KVS_ERR_NOMEM, "replay: out of memory (layer %d)", t->layer);
    for (size_t hg = 0; hg < H * G; hg++) t->top_pos[hg] = t->prefix_pos[hg] = -1;
    t->outp = malloc(G * d * sizeof(float));
    t->stored = malloc(N * sizeof(int32_t));
    t->row_k = calloc(G, sizeof *t->row_k);
    t->row_v = calloc(G, sizeof *t->row_v);
    t->gk = malloc(N * d * sizeof(float));
    t->gv = malloc(N * d * sizeof(float));
    t->blk_size = calloc((size_t)t->nc, sizeof *t->blk_size);
    t->blk_begin = calloc((size_t)t->nc, sizeof *t->blk_begin);
    t->views = calloc(H, sizeof *t->views);
    t->oviews = calloc(H, sizeof *t->oviews);
    t->has_merged = calloc(G, sizeof *t->has_merged);
    t->plain = calloc(G, sizeof *t->plain);
    kvs_status cst = kvs_host_check_create(e->N, e->src->turns, e->src->n_turns, &t->check);
    if (cst != KVS_OK) return cst;
    t->lists_f = malloc(kvs_attn_lists_scratch_floats(G, N) * sizeof(float));
    t->lists_i = malloc(kvs_attn_lists_scratch_ints(G, N) * sizeof(int32_t));
    /* no memo when a hook may rewrite rows between configurations; without memory, simply none */
    if (e->o->prefill_memo >= 0 && !(e->o->hooks && e->o->hooks->on_step_end)) t->memo = kvs_policy_memo_create();
    if (!t->has_merged || !t->plain || !t->lists_f || !t->lists_i || !t->row_k || !t->row_v || !t->gk || !t->gv || !t->blk_size || !t->blk_begin || !t->views || !t->oviews)
        return kvs_fail(KVS_ERR_NOMEM, "replay: out of memory (layer %d)", t->layer);
    if (!t->streams || !t->hk || !t->hv || !t->qb || !t->states || !t->layout || !t->sel_idx ||
        !t->sel_n || !t->pbuf || !t->fullp || !t->fullo || !t->order || !t->sort_scratch || !t->rank || !t->outp || !t->stored)
        return kvs_fail(KVS_ERR_NOMEM, "replay: out of memory (layer %d)", t->layer);
    if (t->kv16 != KVS_DTYPE_F32) {
        t->hk16 = calloc(H, sizeof *t->hk16);
        t->hv16 = calloc(H, sizeof *t->hv16);
        if (!t->hk16 || !t->hv16) return kvs_fail(KVS_ERR_NOMEM, "replay: out of memory (layer %d)", t->layer);
        t->kv16_rows = kvs_alloc_rows(2 * H * N * d * sizeof(uint16_t));
        if (!t->kv16_rows)
            return kvs_fail(KVS_ERR_NOMEM, "replay: out of memory for the 16-bit K/V history of layer %d", t->layer);
        for (size_t h = 0; h < H; h++) {
            t->hk16[h] = t->kv16_rows + 2 * h * N * d;
            t->hv16[h] = t->hk16[h] + N * d;
        }
    }
    /* One block for every head's history, on huge pages where the system has them (kvs_alloc_rows). */
    t->kv_rows = kvs_alloc_rows(2 * H * N * d * sizeof(float));
    if (!t->kv_rows) return kvs_fail(KVS_ERR_NOMEM, "replay: out of memory for the K/V history of layer %d", t->layer);
    for (size_t h = 0; h < H; h++) {
        t->hk[h] = t->kv_rows + 2 * h * N * d;
        t->hv[h] = t->hk[h] + N * d;
        t->qb[h] = malloc(mp * G * d * sizeof(float));
        if (!t->qb[h]) return kvs_fail(KVS_ERR_NOMEM, "replay: out of memory for the K/V history of layer %d", t->layer);
    }
    t->rep = calloc((size_t)t->nc, sizeof *t->rep);
    t->rep_owner = calloc((size_t)t->nc, 1);
    t->cviews = calloc((size_t)t->nc * H, sizeof *t->cviews);
    if (!t->rep || !t->rep_owner || !t->cviews) return kvs_fail(KVS_ERR_NOMEM, "replay: out of memory (layer %d)", t->layer);
    for (int ci = 0; ci < t->nc; ci++) {
        const kvs_codec *c = kvs_replay_codec_of(e->o, t->c_lo + ci);
        if (!c) continue;
        for (int cj = 0; cj < ci && !t->rep[ci]; cj++) {
            const kvs_codec *o = kvs_replay_codec_of(e->o, t->c_lo + cj);
            if (o && !strcmp(kvs_codec_spec(o), kvs_codec_spec(c))) t->rep[ci] = t->rep[cj];
        }
        if (t->rep[ci]) continue;
        kvs_status rst = kvs_host_rep_create(c, &e->src->model, &t->rep[ci]);
        if (rst != KVS_OK) return rst;
        kvs_host_rep_window(t->rep[ci], t->window);
        t->rep_owner[ci] = 1;
    }
    t->pages = calloc((size_t)t->nc, sizeof *t->pages);
    if (!t->pages) return kvs_fail(KVS_ERR_NOMEM, "replay: out of memory (layer %d)", t->layer);
    int any_page = 0;
    for (int ci = 0; ci < t->nc; ci++) {
        int64_t page = kvs_replay_page_of(e->o, t->c_lo + ci);
        if (page <= 0) continue;
        any_page = 1;
        kvs_status pst = kvs_host_page_create(e->N, page, e->src->turns, e->src->n_turns, &t->pages[ci]);
        if (pst != KVS_OK) return pst;
        kvs_host_page_window(t->pages[ci], t->window);
    }
    if (any_page) {
        t->att_idx = calloc(G, sizeof *t->att_idx);
        t->att_place = calloc(G, sizeof *t->att_place);
        t->att_k = calloc(G, sizeof *t->att_k);
        t->att_v = calloc(G, sizeof *t->att_v);
        t->att_n = calloc(G, sizeof *t->att_n);
        t->att_merged = calloc(G, sizeof *t->att_merged);
        t->att_p = calloc(G, sizeof *t->att_p);
        t->att_score = malloc(N * sizeof *t->att_score);
        if (!t->att_idx || !t->att_place || !t->att_k || !t->att_v || !t->att_n || !t->att_merged || !t->att_p ||
            !t->att_score)
            return kvs_fail(KVS_ERR_NOMEM, "replay: out of memory (layer %d)", t->layer);
        for (size_t g = 0; g < G; g++) {
            t->att_idx[g] = malloc(N * sizeof(int32_t));
            t->att_place[g] = malloc(N * sizeof(int32_t));
            t->att_k[g] = malloc(N * sizeof **t->att_k);
            t->att_v[g] = malloc(N * sizeof **t->att_v);
            t->att_p[g] = malloc(N * sizeof(float));
            if (!t->att_idx[g] || !t->att_place[g] || !t->att_k[g] || !t->att_v[g] || !t->att_p[g])
                return kvs_fail(KVS_ERR_NOMEM, "replay: out of memory (layer %d)", t->layer);
        }
    }
    size_t max_calls = kvs_out_calls_max(G);
    t->steps = calloc((size_t)t->nc, sizeof *t->steps);
    t->call_ptrs = calloc((size_t)t->nc * max_calls, sizeof *t->call_ptrs);
    if (!t->steps || !t->call_ptrs) return kvs_fail(KVS_ERR_NOMEM, "replay: out of memory (layer %d)", t->layer);
    for (int ci = 0; ci < t->nc; ci++) {
        cfg_step *cs = &t->steps[ci];
        cs->idx = calloc(G, sizeof *cs->idx);
        cs->n = calloc(G, sizeof *cs->n);
        cs->probs = calloc(G, sizeof *cs->probs);
        cs->out = malloc(G * d * sizeof(float));
        cs->calls = malloc(max_calls * sizeof *cs->calls);
        if (!cs->idx || !cs->n || !cs->probs || !cs->out || !cs->calls)
            return kvs_fail(KVS_ERR_NOMEM, "replay: out of memory (layer %d)", t->layer);
    }
    for (size_t g = 0; g < G; g++) {
        t->sel_idx[g] = malloc(N * sizeof(int32_t));
        t->pbuf[g] = malloc(N * sizeof(float));
        t->row_k[g] = calloc(N, sizeof **t->row_k);
        t->row_v[g] = calloc(N, sizeof **t->row_v);
        if (!t->sel_idx[g] || !t->pbuf[g] || !t->row_k[g] || !t->row_v[g]) return kvs_fail(KVS_ERR_NOMEM, "replay: out of memory (layer %d)", t->layer);
    }
    return KVS_OK;
}

/* Creates every instance of the task (configurations already validated). A failure fails the config. */
static void task_create_states(task *t) {
    engine *e = t->e;
    size_t per = (size_t)e->L * (size_t)e->Hkv;
    for (int ci = 0; ci < t->nc; ci++) {
        int c = t->c_lo + ci;
        const kvs_replay_config *rc = &e->o->configs[c];
        t->layout[ci] = kvs_policy_layout(&rc->policy);
        kvs_status st = kvs_host_create_layer(&rc->policy, &e->src->model, rc->budget,
                                              e->budgets + (size_t)c * per + (size_t)t->layer * (size_t)e->Hkv,
                                              e->run_seed[c], t->layer, e->shared[c],
                                              t->states + (size_t)ci * (size_t)e->Hkv, &t->blk_size[ci]);
        if (st != KVS_OK) fail_config(e, c, t->layer, st);
    }
}

/* Full causal attention of every query head at positions p0..p0+nb-1 (all of one trace block, whose K/V rows
 * are already in the history), as one blocked computation per KV head (kvs_attention_causal_block). Each row
 * equals kvs_attention over 0..p bit for bit, the code path of the policy side, so `full` matches exactly. */
static void reference_block(task *t, const kvs_trace_block *const *blk, int i0, int64_t p0, int64_t nb) {
    engine *e = t->e;
    size_t N = (size_t)e->N, G = (size_t)e->G, H = (size_t)e->Hkv, d = (size_t)e->d;
    for (size_t h = 0; h < H; h++) {
        for (size_t b = 0; b < (size_t)nb; b++)
            for (size_t g = 0; g < G; g++) {
                t->ref_prow[b * G + g] = t->fullp + (b * H + h) * G * N + g * ((size_t)p0 + b + 1);
                t->ref_orow[b * G + g] = t->fullo + ((b * H + h) * G + g) * d;
                if (t->fulls) t->ref_srow[b * G + g] = t->fulls + (b * H + h) * G * N + g * ((size_t)p0 + b + 1);
            }
        float *const *srow = t->fulls ? t->ref_srow : NULL;
        if (t->window) {
            /* A sliding-window layer: row by row over the window lo..p (kvs_attention on the fp32 rows, the reference
             * replay's call), the positions before it probability 0; the blocked kernel assumes keys 0..p. */
            for (size_t b = 0; b < (size_t)nb; b++) {
                size_t p = (size_t)p0 + b, lo = (size_t)kvs_host_window_first(t->window, (int64_t)p);
                for (size_t g = 0; g < G; g++) {
                    float *fp = t->ref_prow[b * G + g];
                    for (size_t x = 0; x < lo; x++) fp[x] = 0.0f;
                    kvs_attention(blk[h]->q + ((size_t)i0 + b) * G * d + g * d, t->hk[h] + lo * d, t->hv[h] + lo * d,
                                  d, NULL, p + 1 - lo, d, e->src->model.scale, fp + lo, t->ref_orow[b * G + g]);
                }
            }
        } else if (t->kv16 != KVS_DTYPE_F32)
            kvs_attention_causal_block16(blk[h]->q + (size_t)i0 * G * d, (size_t)nb, G, t->hk16[h], t->hv16[h],
                                         t->kv16, d, (size_t)p0, e->src->model.scale, t->ref_prow, t->ref_orow, NULL,
                                         srow);
        else
            kvs_attention_causal_block(blk[h]->q + (size_t)i0 * G * d, (size_t)nb, G, t->hk[h], t->hv[h], d,
                                       (size_t)p0, e->src->model.scale, t->ref_prow, t->ref_orow, NULL, srow);
    }
    t->ref_first = p0;
    t->ref_n = nb;
}

/* Ranks query head hg's full attention `fp` at position p (p+1 probabilities) at least n deep (n <= p): as deep as
 * the longest list ranked at hg so far, plus a margin, so that one ranking per position serves every
 * configuration of the task (a list longer than that ranks again, deeper). */
static void rank_prefix(task *t, size_t hg, const float *fp, int64_t p, int64_t n) {
    double t0 = kvs_now_s();
    if (n > t->top_hint[hg]) t->top_hint[hg] = n;
    size_t depth = (size_t)t->top_hint[hg];
    depth += depth / 16 + 16;
    size_t m = kvs_ref_rank_prefix(fp, (size_t)p + 1, depth, t->order, t->sort_scratch);
    kvs_ref_rank_positions(t->order, m, (size_t)p + 1, t->rank + hg * (size_t)t->e->N);
    t->top_m[hg] = (int64_t)m;
    t->top_pos[hg] = p;
    t->rank_seconds += kvs_now_s() - t0;
}

/* The sums behind one query head's metrics (kvs_host_sums), gathered for all heads of a KV head before any is
 * recorded. */
typedef kvs_host_sums head_sums;

/* Up to 4 query heads' recall sums interleaved, and with `hits` their top-k hits (rank[k][x] < n[k]); without, a
 * head's hits are its n (every entry is ranked within n). Each head's chain of fp64 adds runs over its own list in
 * ascending j exactly as one head at a time adds it, so every sum is the same bits; the 4 chains only overlap in
 * time. A single head's chain is bound by the add latency (4 cycles), which made the recall as slow as a quarter
 * of the policy's attention at d 128. The f64 table's recall4 keeps the 4 lanes in vector registers (a scalar
 * loop spilled its 16 pointers and counters to the stack). */
enum { SUM_LANES = 4 };
static void recall_sums(int m, int hits, const float *const fp[SUM_LANES], const int32_t *const list[SUM_LANES],
                        const int64_t n[SUM_LANES], const int32_t *const rank[SUM_LANES], head_sums *s[SUM_LANES]) {
    double r[SUM_LANES];
    int64_t hit[SUM_LANES];
    kvs_math_f64_kernels_active()->recall4(m, fp, list, hits ? rank : NULL, n, r, hit);
    for (int k = 0; k < m; k++) {
        s[k]->recall = r[k];
        s[k]->hit = hits ? hit[k] : n[k];
    }
}

/* Records the metrics of query head (h, g) at position p from its sums (n attended entries). */
static kvs_status measure_record(task *t, int ci, int h, int g, int64_t p, int64_t n, const head_sums *s,
                                 const kvs_policy_cost *cost) {
    engine *e = t->e;
    int c = t->c_lo + ci;
    double v[N_METRICS];
    kvs_host_metrics(&e->src->model, p, n, s, cost, v);
    float vf[N_METRICS];
    for (int k = 0; k < N_METRICS; k++) vf[k] = (float)v[k];
    layer_acc *a = &e->acc[(size_t)c * (size_t)e->L + (size_t)t->layer];
    if (n > a->max_attended) a->max_attended = n;
    kvs_status st = acc_push(a, vf);
    if (st != KVS_OK) return st;
    int64_t every = e->o->series_every;
    if (every > 0 && (t->measured_steps % every) == 0) {
        kvs_results_step step = {.layer = t->layer, .q_head = h * e->G + g, .position = p};
        /* The series keeps float-rounded quality metrics (as the aggregates see them) and exact byte counts. */
        for (int k = 0; k < N_METRICS; k++)
            step.v[k] = kvs_metric_table[k].kind == KVS_METRIC_QUALITY ? (double)vf[k] : v[k];
        st = acc_series(a, &step);
    }
    return st;
}

/* Records the metrics of query heads g0 .. g0+ng-1 of KV head h at position p. Head g attended list
 * li = (n_lists == 1 ? 0 : g): lists[li], n[li] entries; when has_merged (may be NULL) says list li holds merged
 * slots, row_k[li][j] non-NULL marks one. Head g's output is out + (g - g0) * d. Every metric of sim/metrics.h.
 * is_prefix: every list is 0..p in order without merged slots (list_is_prefix), its recall the one every such list
 * has at (h, g, p). The heads' sums are computed together (their chains interleaved), then recorded head by head
 * in order. */
static kvs_status measure_heads(task *t, int ci, int h, int g0, int ng, int64_t p, int n_lists,
                                const int32_t *const *lists, const int64_t *n, const int *has_merged,
                                const float *const *const *row_k, const float *out, const kvs_policy_cost *cost,
                                int is_prefix) {
    engine *e = t->e;
    size_t d = (size_t)e->d;
    enum { MAX_HEADS = 64 };
    head_sums sums[MAX_HEADS];
    /* recall chains waiting to be summed, SUM_LANES at a time: [0] without hits (every entry ranked), [1] with */
    const float *fp_w[2][SUM_LANES];
    const int32_t *list_w[2][SUM_LANES], *rank_w[2][SUM_LANES];
    int64_t n_w[2][SUM_LANES];
    head_sums *s_w[2][SUM_LANES];
    int m_w[2] = {0, 0};
    for (int r0 = 0; r0 < ng; r0 += MAX_HEADS) {
        int nr = ng - r0 < MAX_HEADS ? ng - r0 : MAX_HEADS;
        for (int r = 0; r < nr; r++) {
            int g = g0 + r0 + r, li = n_lists == 1 ? 0 : g;
            size_t off = (size_t)h * (size_t)e->G + (size_t)g;
            const float *fp = t->cur_p + (size_t)h * (size_t)e->G * (size_t)e->N + (size_t)g * (size_t)(p + 1);
            const int32_t *list = lists[li];
            const float *const *mg = has_merged && has_merged[li] ? row_k[li] : NULL;
            int64_t nl = n[li];
            head_sums *s = &sums[r];
            /* The top-k overlap counts list entries among the first n of the full attention's ranking. A list as
             * long as the row (n = p+1: its positions are distinct, so all of them) or longer has every entry there. */
            int all_hit = nl > p;
            if (!all_hit && (t->top_pos[off] != p || t->top_m[off] < nl)) rank_prefix(t, off, fp, p, nl);
            const int32_t *rank = t->rank + off * (size_t)e->N;
            if (mg) {
                double recall = 0, recall_merged = 0;
                int64_t hit = 0;
                for (int64_t j = 0; j < nl; j++) {
                    double mv = fp[list[j]];
                    recall_merged += mv;
                    if (!mg[j]) recall += mv;
                    hit += all_hit || rank[list[j]] < nl;
                }
                s->recall = recall;
                s->recall_merged = recall_merged;
                s->hit = hit;
                continue;
            }
            if (is_prefix && t->prefix_pos[off] == p) {
                s->recall = t->prefix_recall[off]; /* another configuration's sum of the same terms in order */
                s->hit = nl;
            } else { /* queued: summed with up to 3 other heads' chains */
                int w = !all_hit, k = m_w[w]++;
                fp_w[w][k] = fp;
                list_w[w][k] = list;
                rank_w[w][k] = rank;
                n_w[w][k] = nl;
                s_w[w][k] = s;
                if (m_w[w] == SUM_LANES) {
                    recall_sums(SUM_LANES, w, fp_w[w], list_w[w], n_w[w], rank_w[w], s_w[w]);
                    m_w[w] = 0;
                }
            }
        }
        for (int w = 0; w < 2; w++) {
            if (m_w[w]) recall_sums(m_w[w], w, fp_w[w], list_w[w], n_w[w], rank_w[w], s_w[w]);
            m_w[w] = 0;
        }
        /* The output metrics' four fp64 sums of each head, each in ascending i as kvs_rel_l2 and kvs_cosine sum it,
         * so the values are theirs bit for bit: err2 = sum (ref-out)^2, ref2 = sum ref^2, out2 = sum out^2,
         * dot = sum ref*out (kvs_math_simd_f64.h out_sums: 4 heads a pass, one per vector lane). */
        const float *ref = t->cur_o + ((size_t)h * (size_t)e->G + (size_t)(g0 + r0)) * d, *o = out + (size_t)r0 * d;
        const float *ref_rows[MAX_HEADS], *out_rows[MAX_HEADS];
        double osum[4 * MAX_HEADS];
        for (int r = 0; r < nr; r++) ref_rows[r] = ref + (size_t)r * d, out_rows[r] = o + (size_t)r * d;
        kvs_math_f64_kernels_active()->out_sums(ref_rows, out_rows, (size_t)nr, d, osum);
        for (int r = 0; r < nr; r++) {
            const double *x = osum + 4 * r;
            sums[r].err2 = x[0], sums[r].ref2 = x[1], sums[r].out2 = x[2], sums[r].dot = x[3];
        }
        for (int r = 0; r < nr; r++) {
            int g = g0 + r0 + r, li = n_lists == 1 ? 0 : g;
            size_t off = (size_t)h * (size_t)e->G + (size_t)g;
            head_sums *s = &sums[r];
            if (!(has_merged && has_merged[li])) { /* both recalls are the same sum in the same order */
                s->recall_merged = s->recall;
                if (is_prefix && n[li] > p && t->prefix_pos[off] != p) {
                    t->prefix_recall[off] = s->recall;
                    t->prefix_pos[off] = p;
                }
            }
            kvs_status st = measure_record(t, ci, h, g, p, n[li], s, cost);
            if (st != KVS_OK) return st;
        }
    }
    return KVS_OK;
}

/* The selection check of configuration ci at KV head h (kvs_host_check_sel, its budget after the allocation pass);
 * t->plain[li] says which lists are plain (strictly ascending in [0, p], no merged slot). */
static kvs_status check_sel(task *t, int ci, int h, const struct kvs_policy_ops *ops, void *state,
                            const kvs_policy_sel *sel, int64_t p, int *has_merged, double *kv_slots, double *dedup) {
    engine *e = t->e;
    int c = t->c_lo + ci;
    int64_t budget = e->budgets[((size_t)c * (size_t)e->L + (size_t)t->layer) * (size_t)e->Hkv + (size_t)h];
    return kvs_host_check_sel(t->check, ops, state, sel, p, budget, has_merged, t->plain, kv_slots, dedup);
}

/* 1 when list li of sel is the whole prefix 0..p in order and the full reference of p is at hand: its
 * attention is the reference's, bit for bit (same kernels, rows independent of blocking). */
static int list_is_prefix(const task *t, const kvs_policy_sel *sel, int li, int has_merged, int64_t p) {
    if (has_merged || !t->cur_p || sel->n[li] != p + 1) return 0;
    if (t->plain[li]) return 1; /* p + 1 strictly ascending positions in [0, p] are 0..p (check_sel) */
    for (int64_t j = 0; j <= p; j++)
        if (sel->idx[li][j] != (int32_t)j) return 0;
    return 1;
}

/* Attention of query q over list li of sel: through the trace rows, or (when the list holds merged slots)
 * over gathered rows, trace rows and policy rows in list order. */
static void attend_list(task *t, const float *hk, const float *hv, const float *q, const kvs_policy_sel *sel, int li,
                        int has_merged, float *probs, float *out) {
    engine *e = t->e;
    size_t d = (size_t)e->d;
    if (!has_merged) {
        kvs_attention(q, hk, hv, d, sel->idx[li], (size_t)sel->n[li], d, e->src->model.scale, probs, out);
        return;
    }
    for (int64_t j = 0; j < sel->n[li]; j++) {
        const float *kr = sel->row_k[li][j] ? sel->row_k[li][j] : hk + (size_t)sel->idx[li][j] * d;
        const float *vr = sel->row_v[li][j] ? sel->row_v[li][j] : hv + (size_t)sel->idx[li][j] * d;
        memcpy(t->gk + (size_t)j * d, kr, d * sizeof(float));
        memcpy(t->gv + (size_t)j * d, vr, d * sizeof(float));
    }
    kvs_attention(q, t->gk, t->gv, d, NULL, (size_t)sel->n[li], d, e->src->model.scale, probs, out);
}

/* Configuration ci's instances, one per KV head in order (what layer_sync takes). */
static void *const *config_states(const task *t, int ci) { return t->states + (size_t)ci * (size_t)t->e->Hkv; }

/* The number of lists configuration ci selects: one per query head or one for the group (kvs_policy_sel). */
static int config_lists(const task *t, int ci) {
    return t->layout[ci] == KVS_SEL_PER_QUERY_HEAD ? t->e->G : 1;
}

static int any_merged(const int *has_merged, int n_lists) {
    for (int li = 0; li < n_lists; li++)
        if (has_merged[li]) return 1;
    return 0;
}

static void step_end_hook(task *t, int ci, int64_t p) {
    engine *e = t->e;
    if (!e->o->hooks || !e->o->hooks->on_step_end) return;
    int c = t->c_lo + ci;
    for (int h = 0; h < e->Hkv; h++)
        e->o->hooks->on_step_end(e->o->hooks->user, c, t->layer, h, p, config_states(t, ci)[h],
                                 e->o->configs[c].policy.ops, t->hk[h], t->hv[h], p + 1);
}

/* The decode views of position p, every KV head: t->views for every policy, t->oviews (full_probs set) for the
 * oracles when the task has one. */
static void decode_views(task *t, const kvs_trace_block *const *blk, int i, int64_t p, int64_t tk, int any_oracle) {
    engine *e = t->e;
    const kvs_turn *turn = &e->src->turns[tk];
    size_t Gd = (size_t)e->G * (size_t)e->d;
    for (int h = 0; h < e->Hkv; h++) {
        t->views[h] = (kvs_policy_view){
            .n = p + 1, .group = e->G, .head_dim = e->d, .scale = e->src->model.scale,
            .k = t->hk[h], .v = t->hv[h], .q = blk[h]->q + (size_t)i * Gd, .q_first = p, .n_q = 1,
            .turn_begin = turn->begin, .prompt_end = turn->prompt_end, .turn = (int32_t)tk,
            .full_probs = NULL, .block_begin = p, .last_block = 1, .memo = t->memo,
        };
        if (any_oracle) {
            t->oviews[h] = t->views[h];
            t->oviews[h].full_probs = t->cur_p + (size_t)h * (size_t)e->G * (size_t)e->N;
        }
    }
    for (int ci = 0; ci < t->nc; ci++) {
        if (!kvs_host_rep_active(t->rep[ci])) continue;
        const kvs_policy_view *base = e->o->configs[t->c_lo + ci].policy.ops->is_oracle ? t->oviews : t->views;
        for (int h = 0; h < e->Hkv; h++) {
            kvs_policy_view *v = t->cviews + (size_t)ci * (size_t)e->Hkv + (size_t)h;
            *v = base[h];
            v->k = kvs_host_rep_rows(t->rep[ci], h, KVS_CODEC_K, t->hk[h]);
            v->v = kvs_host_rep_rows(t->rep[ci], h, KVS_CODEC_V, t->hv[h]);
            v->memo = NULL; /* the memo's entries are keyed for the captured rows */
        }
    }
}

/* Configuration ci's decode view of KV head h: over the codec's rows when it has one past the first prompt. */
static const kvs_policy_view *cfg_view(const task *t, int ci, const struct kvs_policy_ops *ops, int h) {
    if (kvs_host_rep_active(t->rep[ci])) return t->cviews + (size_t)ci * (size_t)t->e->Hkv + (size_t)h;
    return (ops->is_oracle ? t->oviews : t->views) + h;
}

/* A configuration's step at KV head h after its attention: the accounting, the metrics (measured steps) and
 * observe(), then its row arrays cleared for the next select(). */
static kvs_status head_finish(task *t, int ci, int h, int64_t p, int measured, const kvs_policy_sel *sel,
                              float *const *probs, const float *out, const int *has_merged, int prefix,
                              double kv_slots, double dedup) {
    engine *e = t->e;
    const struct kvs_policy_ops *ops = e->o->configs[t->c_lo + ci].policy.ops;
    void *state = config_states(t, ci)[h];
    const kvs_policy_view *view = cfg_view(t, ci, ops, h);
    kvs_status st = KVS_OK;
    kvs_policy_cost cost;
    if (kvs_host_rep_active(t->rep[ci]))
        st = kvs_host_rep_cost(t->rep[ci], h, ops, state, &e->src->model, view, sel, p, &cost);
    else
        kvs_host_cost(ops, state, &e->src->model, view, sel, kv_slots, dedup, &cost);
    if (st == KVS_OK && measured)
        st = measure_heads(t, ci, h, 0, e->G, p, sel->n_lists, (const int32_t *const *)sel->idx, sel->n, has_merged,
                           (const float *const *const *)sel->row_k, out, &cost, prefix);
    /* what the next position cannot attend is gone before the policy decides what to keep */
    if (st == KVS_OK) st = kvs_host_window_evict(ops, state, kvs_host_window_first(t->window, p + 1));
    if (st == KVS_OK && ops->observe) st = ops->observe(state, view, sel, (const float *const *)probs);
    if (has_merged)
        for (int li = 0; li < sel->n_lists; li++) /* keep the row arrays all NULL for the next select() */
            if (has_merged[li]) {
                memset((void *)sel->row_k[li], 0, (size_t)sel->n[li] * sizeof *sel->row_k[li]);
                memset((void *)sel->row_v[li], 0, (size_t)sel->n[li] * sizeof *sel->row_v[li]);
            }
    return st;
}

/* Grows a configuration's arenas to n_int ints and n_float floats. */
static kvs_status step_reserve(task *t, cfg_step *cs, size_t n_int, size_t n_float) {
    if (n_int > cs->icap) {
        size_t cap = n_int + n_int / 2;
        int32_t *p = realloc(cs->iarena, cap * sizeof *p);
        if (!p) return kvs_fail(KVS_ERR_NOMEM, "replay: out of memory for a selection (layer %d)", t->layer);
        cs->iarena = p, cs->icap = cap;
    }
    if (n_float > cs->fcap) {
        size_t cap = n_float + n_float / 2;
        float *p = realloc(cs->farena, cap * sizeof *p);
        if (!p) return kvs_fail(KVS_ERR_NOMEM, "replay: out of memory for a selection (layer %d)", t->layer);
        cs->farena = p, cs->fcap = cap;
    }
    return KVS_OK;
}

/* The attention of a selection whose scores are the reference's (t->cur_s), without merged slots, one list or one
 * per query head, up to its output: the selection copied into the configuration's arena, each query head's
 * softmax, and the output's kernel calls in cs->calls for the shared pass (decode_position). A score's bits do not
 * depend on the rows computed with it (the reference's kernels), so these are the computing path's bits. */
static kvs_status defer_scored(task *t, cfg_step *cs, int h, int64_t p, const kvs_policy_sel *sel) {
    engine *e = t->e;
    size_t G = (size_t)e->G, N = (size_t)e->N, d = (size_t)e->d, total = 0;
    int shared = sel->n_lists == 1; /* one list for the G query heads: G rows of probabilities over it */
    for (int li = 0; li < sel->n_lists; li++) total += (size_t)sel->n[li];
    size_t keep_f = shared ? 0 : kvs_attn_lists_keep_floats(G, total, N);
    size_t keep_i = shared ? 0 : kvs_attn_lists_keep_ints(G, total, N);
    kvs_status st = step_reserve(t, cs, total + keep_i, (shared ? G * total : total) + keep_f);
    if (st != KVS_OK) return st;
    size_t off = 0;
    for (int li = 0; li < sel->n_lists; li++) {
        cs->idx[li] = cs->iarena + off;
        cs->n[li] = sel->n[li];
        memcpy(cs->idx[li], sel->idx[li], (size_t)sel->n[li] * sizeof(int32_t));
        off += (size_t)sel->n[li];
    }
    for (size_t g = 0, foff = 0; g < G; g++) {
        cs->probs[g] = cs->farena + foff;
        foff += shared ? total : (size_t)sel->n[g];
    }
    for (size_t g = 0; g < G; g++) t->srow[g] = t->cur_s + (size_t)h * G * N + g * (size_t)(p + 1);
    cs->fmas = (double)total * (double)d * (shared ? (double)G : 1.0);
    if (shared) {
        /* a run of consecutive positions (a window; check_sel found the list ascending and distinct): no index,
         * the value rows in order (the same numbers in the same order) */
        const int32_t *i0 = cs->idx[0];
        int64_t n0 = cs->n[0];
        int run = t->plain[0] && i0[n0 - 1] - i0[0] == n0 - 1;
        cs->n_calls = kvs_attention_group_scored_defer((const float *const *)t->srow, G, run ? NULL : i0,
                                                       run ? (size_t)i0[0] : 0, (size_t)n0, d, cs->probs, cs->out,
                                                       cs->calls);
    } else {
        int used_union;
        cs->n_calls = kvs_attention_lists_scored_defer(
            (const float *const *)t->srow, G, (const int32_t *const *)cs->idx, cs->n, N, d, cs->probs, cs->out,
            t->lists_f, t->lists_i, cs->farena + total, cs->iarena + total, cs->calls, &used_union);
    }
    return KVS_OK;
}

/* A paged configuration's step at KV head h after its checked selection (sim/host.h "page granularity"): each list
 * mapped to its attended set of whole pages, the attention of every query head over it (the kernels of the codec
 * path: no reference scores, no 16-bit history, no shared pass), the policy's probabilities read back from it
 * (0 off the attended pages), the page cost, the metrics on the attended set, observe(). */
static kvs_status head_page(task *t, int ci, int h, int64_t p, int measured, const kvs_policy_sel *sel,
                            const int *has_merged) {
    engine *e = t->e;
    int c = t->c_lo + ci;
    const struct kvs_policy_ops *ops = e->o->configs[c].policy.ops;
    void *state = config_states(t, ci)[h];
    const kvs_policy_view *view = cfg_view(t, ci, ops, h);
    kvs_host_page *pg = t->pages[ci];
    int64_t budget = e->budgets[((size_t)c * (size_t)e->L + (size_t)t->layer) * (size_t)e->Hkv + (size_t)h];
    size_t d = (size_t)e->d, N = (size_t)e->N;
    kvs_policy_sel att = {.idx = t->att_idx, .n = t->att_n, .n_lists = sel->n_lists, .cap = e->N, .row_k = t->att_k,
                          .row_v = t->att_v};
    kvs_status st = KVS_OK;
    kvs_page_score rule = kvs_host_page_rule(ops, (kvs_page_score)kvs_replay_page_score_of(e->o, c));
    for (int li = 0; li < sel->n_lists; li++) {
        int64_t cap = kvs_host_page_cap(pg, ops->budget_scope, budget, sel->idx[li], sel->n[li], p);
        /* the policy's retention scores of S_t's entries (the score rules; none: the count rule) */
        const double *score = rule != KVS_PAGE_SCORE_COUNT &&
                                      ops->scores(state, li, sel->idx[li], sel->n[li], t->att_score)
                                  ? t->att_score
                                  : NULL;
        att.n[li] = kvs_host_page_map(pg, sel->idx[li], has_merged[li] ? sel->row_k[li] : NULL,
                                      has_merged[li] ? sel->row_v[li] : NULL, sel->n[li], p, cap, score, rule,
                                      att.idx[li], att.row_k[li], att.row_v[li], t->att_place[li]);
        t->att_merged[li] = 0;
        for (int64_t j = 0; has_merged[li] && j < att.n[li]; j++) t->att_merged[li] |= att.row_k[li][j] != NULL;
    }
    const float *q = view->q;
    if (att.n_lists == 1 && !t->att_merged[0])
        kvs_attention_group(q, (size_t)e->G, view->k, view->v, d, att.idx[0], (size_t)att.n[0], d,
                            e->src->model.scale, t->att_p, t->outp, NULL);
    else if (att.n_lists == e->G && !any_merged(t->att_merged, att.n_lists))
        kvs_attention_lists(q, (size_t)e->G, view->k, view->v, d, (const int32_t *const *)att.idx, att.n, N, d,
                            e->src->model.scale, t->att_p, t->outp, t->lists_f, t->lists_i);
    else
        for (int g = 0; g < e->G; g++) {
            int li = att.n_lists == 1 ? 0 : g;
            attend_list(t, view->k, view->v, q + (size_t)g * d, &att, li, t->att_merged[li], t->att_p[g],
                        t->outp + (size_t)g * d);
        }
    for (int g = 0; g < e->G; g++) {
        int li = sel->n_lists == 1 ? 0 : g;
        for (int64_t j = 0; j < sel->n[li]; j++) {
            int32_t at = t->att_place[li][j];
            t->pbuf[g][j] = at >= 0 ? t->att_p[g][at] : 0.0f;
        }
    }
    kvs_policy_cost cost;
    if ((st = kvs_host_page_cost(pg, t->rep[ci], h, ops, state, &e->src->model, view, sel, &att, p, &cost)) != KVS_OK)
        return st;
    if (measured)
        st = measure_heads(t, ci, h, 0, e->G, p, att.n_lists, (const int32_t *const *)att.idx, att.n, t->att_merged,
                           (const float *const *const *)att.row_k, t->outp, &cost, 0);
    /* what the next position cannot attend is gone before the policy decides what to keep (head_finish) */
    if (st == KVS_OK) st = kvs_host_window_evict(ops, state, kvs_host_window_first(t->window, p + 1));
    if (st == KVS_OK && ops->observe) st = ops->observe(state, view, sel, (const float *const *)t->pbuf);
    for (int li = 0; li < sel->n_lists; li++) /* keep the row arrays all NULL for the next select() */
        if (has_merged[li]) {
            memset((void *)sel->row_k[li], 0, (size_t)sel->n[li] * sizeof *sel->row_k[li]);
            memset((void *)sel->row_v[li], 0, (size_t)sel->n[li] * sizeof *sel->row_v[li]);
        }
    return st;
}

/* A configuration's step at KV head h up to its output: select() and its check, then its attention, deferred
 * (defer_scored: cs->deferred) when the scores are the reference's and no list holds merged slots; otherwise
 * computed now and the step at this head finished here (head_finish). */
static kvs_status head_select(task *t, int ci, int h, int64_t p, int measured) {
    engine *e = t->e;
    int c = t->c_lo + ci;
    const struct kvs_policy_ops *ops = e->o->configs[c].policy.ops;
    cfg_step *cs = &t->steps[ci];
    void *state = config_states(t, ci)[h];
    const kvs_policy_view *view = cfg_view(t, ci, ops, h);
    const float *q = view->q;
    kvs_policy_sel sel = {.idx = t->sel_idx, .n = t->sel_n, .cap = e->N, .row_k = t->row_k, .row_v = t->row_v};
    sel.n_lists = config_lists(t, ci);
    for (int li = 0; li < sel.n_lists; li++) sel.n[li] = 0;
    int *has_merged = t->has_merged;
    double kv_slots, dedup;
    kvs_status st;
    cs->deferred = 0;
    if ((st = ops->select(state, view, &sel)) != KVS_OK ||
        (st = check_sel(t, ci, h, ops, state, &sel, p, has_merged, &kv_slots, &dedup)) != KVS_OK) {
        /* the run ends here; the task's other configurations still need the row arrays all NULL */
        for (int li = 0; li < sel.n_lists; li++) {
            memset((void *)sel.row_k[li], 0, (size_t)sel.cap * sizeof *sel.row_k[li]);
            memset((void *)sel.row_v[li], 0, (size_t)sel.cap * sizeof *sel.row_v[li]);
        }
        return st;
    }
    if (e->o->hooks && e->o->hooks->on_select) e->o->hooks->on_select(e->o->hooks->user, c, t->layer, h, p, &sel);
    /* Attention first (observe needs it); accounting needs only the selection. A list that is the whole prefix
     * copies the reference; one list shared by the group is computed for all G heads at once (each key and value
     * row read once). */
    if (t->pages[ci]) return head_page(t, ci, h, p, measured, &sel, has_merged);
    size_t d = (size_t)e->d, N = (size_t)e->N;
    if (kvs_host_rep_active(t->rep[ci])) {
        /* over the codec's rows: neither the reference's scores, its output nor the 16-bit history apply */
        const float *hk = view->k, *hv = view->v;
        if (sel.n_lists == 1 && !has_merged[0])
            kvs_attention_group(q, (size_t)e->G, hk, hv, d, sel.idx[0], (size_t)sel.n[0], d, e->src->model.scale,
                                t->pbuf, t->outp, NULL);
        else if (sel.n_lists == e->G && !any_merged(has_merged, sel.n_lists))
            kvs_attention_lists(q, (size_t)e->G, hk, hv, d, (const int32_t *const *)sel.idx, sel.n, N, d,
                                e->src->model.scale, t->pbuf, t->outp, t->lists_f, t->lists_i);
        else
            for (int g = 0; g < e->G; g++) {
                int li = sel.n_lists == 1 ? 0 : g;
                attend_list(t, hk, hv, q + (size_t)g * d, &sel, li, has_merged[li], t->pbuf[g], t->outp + (size_t)g * d);
            }
        return head_finish(t, ci, h, p, measured, &sel, t->pbuf, t->outp, has_merged, 0, kv_slots, dedup);
    }
    int prefix = sel.n_lists == 1 && list_is_prefix(t, &sel, 0, has_merged[0], p);
    if (!prefix && t->cur_s && !any_merged(has_merged, sel.n_lists) && (sel.n_lists == 1 || sel.n_lists == e->G)) {
        if ((st = defer_scored(t, cs, h, p, &sel)) != KVS_OK) return st;
        cs->deferred = 1;
        cs->kv_slots = kv_slots;
        cs->dedup = dedup;
        return KVS_OK;
    }
    if (prefix) {
        for (int g = 0; g < e->G; g++) {
            if (ops->observe) /* the only reader of the policy-side probabilities */
                memcpy(t->pbuf[g], t->cur_p + ((size_t)h * (size_t)e->G * N + (size_t)g * (size_t)(p + 1)),
                       (size_t)(p + 1) * sizeof(float));
            memcpy(t->outp + (size_t)g * d, t->cur_o + ((size_t)h * (size_t)e->G + (size_t)g) * d, d * sizeof(float));
        }
    } else if (sel.n_lists == 1 && !has_merged[0] && t->kv16 != KVS_DTYPE_F32) {
        kvs_attention_group16(q, (size_t)e->G, t->hk16[h], t->hv16[h], t->kv16, d, sel.idx[0], (size_t)sel.n[0], d,
                              e->src->model.scale, t->pbuf, t->outp, NULL);
    } else if (sel.n_lists == 1 && !has_merged[0]) {
        kvs_attention_group(q, (size_t)e->G, t->hk[h], t->hv[h], d, sel.idx[0], (size_t)sel.n[0], d,
                            e->src->model.scale, t->pbuf, t->outp, NULL);
    } else if (sel.n_lists == e->G && !any_merged(has_merged, sel.n_lists)) {
        /* per-query-head lists: over their union where it pays (each K/V row read once for the G heads), every
         * head's numbers bit for bit its own list's (kvs_attention_lists) */
        if (t->kv16 != KVS_DTYPE_F32)
            kvs_attention_lists16(q, (size_t)e->G, t->hk16[h], t->hv16[h], t->kv16, t->hk[h], t->hv[h], d,
                                  (const int32_t *const *)sel.idx, sel.n, N, d, e->src->model.scale, t->pbuf, t->outp,
                                  t->lists_f, t->lists_i);
        else
            kvs_attention_lists(q, (size_t)e->G, t->hk[h], t->hv[h], d, (const int32_t *const *)sel.idx, sel.n, N, d,
                                e->src->model.scale, t->pbuf, t->outp, t->lists_f, t->lists_i);
    } else {
        for (int g = 0; g < e->G; g++) {
            int li = sel.n_lists == 1 ? 0 : g;
            attend_list(t, t->hk[h], t->hv[h], q + (size_t)g * d, &sel, li, has_merged[li], t->pbuf[g],
                        t->outp + (size_t)g * d);
        }
    }
    return head_finish(t, ci, h, p, measured, &sel, t->pbuf, t->outp, has_merged, prefix, kv_slots, dedup);
}

/* Value rows per block of the shared output pass (kvs_replay_opts.out_block_rows): by default 256 KiB, which stay
 * in L2 (1 MiB and more on the CPUs this runs on) while every configuration's calls take their entries in the
 * block (sim/BENCH.md "The shared output pass": 64 to 512 KiB measured alike, 1 MiB and unblocked slower). */
enum { OUT_BLOCK_BYTES = 256 * 1024 };

static size_t out_block_rows(const task *t) {
    int64_t asked = t->e->o->out_block_rows;
    if (asked != 0) return asked > 0 ? (size_t)asked : 0; /* 0: kvs_out_calls_run's whole calls */
    size_t row_bytes = (size_t)t->e->d * (t->kv16 != KVS_DTYPE_F32 ? sizeof(uint16_t) : sizeof(float));
    size_t rows = OUT_BLOCK_BYTES / row_bytes;
    return rows > 0 ? rows : 1;
}

/* Fails configuration ci (fail_config) and takes it out of the rest of the position (live[ci]). */
static void stop_config(task *t, int ci, kvs_status st, uint8_t *live) {
    fail_config(t->e, t->c_lo + ci, t->layer, st);
    live[ci] = 0;
}

/* Charges the time since *t1 to configuration ci, less the ranking done meanwhile (shared work, shared out by
 * run_task); the clock read ends ci's time and starts the next one's. */
static void charge(task *t, double *cfg_time, int ci, double *t1, double *r1) {
    double t2 = kvs_now_s();
    cfg_time[ci] += t2 - *t1 - (t->rank_seconds - *r1);
    *t1 = t2;
    *r1 = t->rank_seconds;
}

/* A decode step at position p of every configuration with live[ci] set, in phases, so that each value row of a KV
 * head is read once for all of them instead of once each (sim/BENCH.md "The shared output pass"): per KV head,
 * every configuration's select and attention up to the output
 * (head_select), the outputs deferred there in one pass over the head's value rows (kvs_out_calls_run, the same
 * bits), and those configurations' metrics and observe (head_finish); then every layer_sync (and the step-end
 * hook). Each configuration's own calls keep their order, and what its calls share with the others' gives the same
 * numbers whichever asks first (the memo, the ranking), so every number is the one it gets replayed alone. A
 * configuration that fails is failed (fail_config) and its live[ci] cleared. cfg_time[ci] += its time less the
 * ranking's, the shared pass shared out by multiply-adds. */
static void decode_position(task *t, const kvs_trace_block *const *blk, int i, int64_t p, int64_t tk, int measured,
                            int any_oracle, uint8_t *live, double *cfg_time) {
    engine *e = t->e;
    kvs_status st;
    decode_views(t, blk, i, p, tk, any_oracle);
    double t1 = kvs_now_s(), r1 = t->rank_seconds;
    size_t block_rows = out_block_rows(t);
    for (int h = 0; h < e->Hkv; h++) {
        size_t n_calls = 0;
        double fmas = 0;
        for (int ci = 0; ci < t->nc; ci++) {
            if (!live[ci]) continue;
            if ((st = head_select(t, ci, h, p, measured)) != KVS_OK) {
                stop_config(t, ci, st, live);
            } else if (t->steps[ci].deferred) {
                cfg_step *cs = &t->steps[ci];
                for (size_t k = 0; k < cs->n_calls; k++) t->call_ptrs[n_calls++] = &cs->calls[k];
                fmas += cs->fmas;
            }
            charge(t, cfg_time, ci, &t1, &r1);
        }
        if (!n_calls) continue;
        kvs_out_calls_run(t->call_ptrs, n_calls, t->hv[h], t->kv16 != KVS_DTYPE_F32 ? t->hv16[h] : NULL, t->kv16,
                          (size_t)e->d, (size_t)e->d, block_rows);
        double t2 = kvs_now_s();
        for (int ci = 0; ci < t->nc; ci++)
            if (live[ci] && t->steps[ci].deferred) cfg_time[ci] += (t2 - t1) * (t->steps[ci].fmas / fmas);
        t1 = t2;
        for (int ci = 0; ci < t->nc; ci++) {
            cfg_step *cs = &t->steps[ci];
            if (!live[ci] || !cs->deferred) continue;
            cs->deferred = 0;
            kvs_policy_sel sel = {.idx = cs->idx, .n = cs->n, .n_lists = config_lists(t, ci), .cap = e->N,
                                  .row_k = t->row_k, .row_v = t->row_v};
            if ((st = head_finish(t, ci, h, p, measured, &sel, cs->probs, cs->out, NULL, 0, cs->kv_slots,
                                  cs->dedup)) != KVS_OK)
                stop_config(t, ci, st, live);
            charge(t, cfg_time, ci, &t1, &r1);
        }
    }
    for (int ci = 0; ci < t->nc; ci++) {
        const struct kvs_policy_ops *ops = e->o->configs[t->c_lo + ci].policy.ops;
        if (!live[ci]) continue;
        st = KVS_OK;
        if (ops->layer_sync) st = ops->layer_sync(config_states(t, ci), e->Hkv, KVS_SYNC_DECODE);
        if (st == KVS_OK) step_end_hook(t, ci, p);
        else stop_config(t, ci, st, live);
        charge(t, cfg_time, ci, &t1, &r1);
    }
}

/* A measured prompt position (--measure all|prefill): S = what the policy held after the previous prefill
 * call (earlier turns, or the previous block of a chunked prefill), positions before the current block,
 * plus the block's positions up to p: chunked-prefill attention against the compressed cache (full causal
 * attention for turn 0 without blocks). On a sliding-window layer S keeps only the positions inside p's window
 * (a prefill kernel with a sliding window masks the older ones, which the cache may still hold until the next
 * prefill call evicts them): windowed attention for turn 0 without blocks. Storage: S resident; the rest of the
 * block is transient (its K/V are computed with the block), so the peak is the held positions + the whole
 * block. */
static kvs_status prompt_measure(task *t, int ci, int64_t p, int64_t tk) {
    engine *e = t->e;
    const struct kvs_policy_ops *ops = e->o->configs[t->c_lo + ci].policy.ops;
    const kvs_turn *turn = &e->src->turns[tk];
    size_t Gd = (size_t)e->G * (size_t)e->d;
    int n_lists = config_lists(t, ci);
    int64_t bb = t->blk_begin[ci];
    int64_t be = t->blk_size[ci] > 0 ? bb + t->blk_size[ci] : turn->prompt_end;
    if (be > turn->prompt_end) be = turn->prompt_end;
    int64_t lo = kvs_host_window_first(t->window, p); /* 0 on a full-attention layer */
    for (int h = 0; h < e->Hkv; h++) {
        void *state = config_states(t, ci)[h];
        for (int li = 0; li < n_lists; li++) {
            int64_t m = 0;
            if (ops->stored) {
                m = ops->stored(state, li, t->stored);
                int64_t w = 0; /* keep only positions in the window before the block (the block is added below) */
                for (int64_t j = 0; j < m; j++)
                    if (t->stored[j] < bb && t->stored[j] >= lo) t->stored[w++] = t->stored[j];
                m = w;
            } else {
                for (int64_t j = lo; j < bb; j++) t->stored[m++] = (int32_t)j;
            }
            for (int64_t j = bb > lo ? bb : lo; j <= p; j++) t->stored[m++] = (int32_t)j;
            memcpy(t->sel_idx[li], t->stored, (size_t)m * sizeof(int32_t));
            t->sel_n[li] = m;
        }
        double slots = 0;
        for (int li = 0; li < n_lists; li++) slots += (double)t->sel_n[li];
        kvs_policy_cost cost = {0};
        cost.kv_bytes = cost.dedup_kv_bytes = cost.read_kv_bytes = kvs_policy_kv_bytes(&e->src->model, slots);
        if (n_lists > 1) cost.dedup_kv_bytes = kvs_policy_kv_bytes(&e->src->model, (double)t->sel_n[0]);
        cost.transient_bytes = kvs_policy_kv_bytes(&e->src->model, (double)(be - 1 - p) * n_lists);
        cost.write_bytes = kvs_policy_kv_bytes(&e->src->model, (double)n_lists);
        kvs_host_rep *rp = t->rep[ci];
        if (kvs_host_rep_active(rp)) { /* a later turn's prompt: the codec's bytes */
            double b = 0, x;
            kvs_status st;
            for (int li = 0; li < n_lists; li++) {
                if ((st = kvs_host_rep_list_bytes(rp, h, t->sel_idx[li], t->sel_n[li], &x)) != KVS_OK) return st;
                b += x;
            }
            cost.kv_bytes = cost.dedup_kv_bytes = cost.read_kv_bytes = b;
            if (n_lists > 1) cost.dedup_kv_bytes = b / n_lists;
        }
        const float *hk = kvs_host_rep_rows(rp, h, KVS_CODEC_K, t->hk[h]);
        const float *hv = kvs_host_rep_rows(rp, h, KVS_CODEC_V, t->hv[h]);
        const float *qrow = t->qb[h] + (size_t)(p - turn->begin) * Gd;
        for (int g = 0; g < e->G; g++) {
            int li = n_lists == 1 ? 0 : g;
            kvs_attention(qrow + (size_t)g * (size_t)e->d, hk, hv, (size_t)e->d, t->sel_idx[li],
                          (size_t)t->sel_n[li], (size_t)e->d, e->src->model.scale, t->pbuf[g], t->outp);
            kvs_status st = measure_heads(t, ci, h, g, 1, p, n_lists, (const int32_t *const *)t->sel_idx, t->sel_n,
                                          NULL, NULL, t->outp, &cost, 0);
            if (st != KVS_OK) return st;
        }
    }
    return KVS_OK;
}

/* Prefill call of configuration ci for the block [bb, be) of turn tk (the whole prompt unless chunked). */
static kvs_status prefill_block(task *t, int ci, int64_t tk, int64_t bb, int64_t be) {
    engine *e = t->e;
    const struct kvs_policy_ops *ops = e->o->configs[t->c_lo + ci].policy.ops;
    const kvs_turn *turn = &e->src->turns[tk];
    size_t Gd = (size_t)e->G * (size_t)e->d;
    kvs_status st;
    for (int h = 0; h < e->Hkv; h++) {
        kvs_policy_view view = {
            .n = be, .group = e->G, .head_dim = e->d, .scale = e->src->model.scale,
            .k = kvs_host_rep_rows(t->rep[ci], h, KVS_CODEC_K, t->hk[h]),
            .v = kvs_host_rep_rows(t->rep[ci], h, KVS_CODEC_V, t->hv[h]),
            .q = t->qb[h] + (size_t)(bb - turn->begin) * Gd, .q_first = bb,
            .n_q = be - bb, .turn_begin = turn->begin, .prompt_end = turn->prompt_end,
            .turn = (int32_t)tk, .full_probs = NULL, .block_begin = bb, .last_block = be == turn->prompt_end,
            .memo = kvs_host_rep_active(t->rep[ci]) ? NULL : t->memo,
        };
        /* what the next position (be) cannot attend is gone before the policy decides what to keep */
        if ((st = kvs_host_window_evict(ops, config_states(t, ci)[h], kvs_host_window_first(t->window, be))) !=
                KVS_OK ||
            (st = ops->prefill(config_states(t, ci)[h], &view)) != KVS_OK)
            return st;
        /* a codec scoring with the prompt's queries (think) takes them from the first prompt's last block */
        if (tk == 0 && be == turn->prompt_end &&
            (st = kvs_host_rep_prompt_queries(t->rep[ci], h, t->qb[h], be - turn->begin, e->G)) != KVS_OK)
            return st;
    }
    if (ops->layer_sync) {
        if ((st = ops->layer_sync(config_states(t, ci), e->Hkv, KVS_SYNC_PREFILL)) != KVS_OK) return st;
    }
    return KVS_OK;
}

/* A prompt position p of every configuration with run[ci] set: the measurement of p (measured positions) and, at
 * the end of a configuration's prefill block, its prefill call and the step-end hook. A configuration that fails is
 * failed (fail_config). cfg_time[ci] += its time less the ranking's (charge). */
static void prompt_position(task *t, int64_t p, int64_t tk, int measured, const uint8_t *run, double *cfg_time) {
    const kvs_turn *turn = &t->e->src->turns[tk];
    double t1 = kvs_now_s(), r1 = t->rank_seconds;
    for (int ci = 0; ci < t->nc; ci++) {
        if (!run[ci]) continue;
        kvs_status st = KVS_OK;
        if (p == turn->begin) t->blk_begin[ci] = p;
        int64_t bb = t->blk_begin[ci];
        int64_t be = t->blk_size[ci] > 0 ? bb + t->blk_size[ci] : turn->prompt_end;
        if (be > turn->prompt_end) be = turn->prompt_end;
        if (measured) st = prompt_measure(t, ci, p, tk);
        if (st == KVS_OK && p == be - 1) {
            st = prefill_block(t, ci, tk, bb, be);
            /* the leak check runs between blocks too: a policy must not read prompt K/V it already evicted */
            if (st == KVS_OK) step_end_hook(t, ci, p);
            t->blk_begin[ci] = be;
        }
        if (st != KVS_OK) fail_config(t->e, t->c_lo + ci, t->layer, st);
        charge(t, cfg_time, ci, &t1, &r1);
    }
}

/* Counts `n` more steps and calls the progress callback when 0.25 s passed since the last report (one
 * thread at a time: a busy lock just skips the report). */
static void report_progress(engine *e, int64_t n) {
    int64_t done = atomic_fetch_add(&e->steps_done, n) + n;
    if (!e->o->progress) return;
    long long now = (long long)(kvs_now_s() * 1e6), total = (long long)e->n_tasks * e->N;
    if (now - atomic_load(&e->last_progress_us) < 250000 && done < total) return;
    if (pthread_mutex_trylock(&e->mu) != 0) return;
    if (now - atomic_load(&e->last_progress_us) >= 250000 || done == total) {
        atomic_store(&e->last_progress_us, now);
        e->o->progress(e->o->progress_user, done, (int64_t)e->n_tasks * e->N);
    }
    pthread_mutex_unlock(&e->mu);
}

/* 1 when position p needs the full attention: measured, or a decode step some oracle configuration reads it
 * at. `tk` is a turn at or before p's (advanced here). */
static int needs_reference(const engine *e, int64_t p, int64_t tk, int any_oracle) {
    while (tk + 1 < e->src->n_turns && p >= e->src->turns[tk].end) tk++;
    int is_prompt = p < e->src->turns[tk].prompt_end;
    int measured = e->o->measure == KVS_MEASURE_ALL || (e->o->measure == KVS_MEASURE_PREFILL) == is_prompt;
    return measured || (!is_prompt && any_oracle);
}

/* The dtype the task keeps a 16-bit K/V history in (kvs_replay_opts.kv16), or KVS_DTYPE_F32 for none. The
 * 16-bit rows are kvs_encode's little-endian bytes read as uint16_t by the kernels: little-endian hosts only. */
static kvs_dtype history16_dtype(const engine *e) {
    kvs_dtype dt = (kvs_dtype)e->src->kv_dtype;
    if ((dt != KVS_DTYPE_F16 && dt != KVS_DTYPE_BF16) || e->d > KVS_KV16_MAX_DIM) return KVS_DTYPE_F32;
    if (e->o->hooks && e->o->hooks->on_step_end) return KVS_DTYPE_F32;
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
    return KVS_DTYPE_F32;
#endif
    int want = e->o->kv16 ? e->o->kv16 > 0 : kvs_math_kv16_default();
    return want ? dt : KVS_DTYPE_F32;
}

/* Brings every codec of the task to step p + 1 (kvs_host_rep_sync: nothing within the first prompt): the rows the
 * configurations with a codec attend over at position p. A codec's failure (a non-finite row) fails the
 * configurations that use it. Its time is the configurations' own (charged with the reference's shared time). */
static void sync_codecs(task *t, int64_t p) {
    engine *e = t->e;
    for (int ci = 0; ci < t->nc; ci++) {
        if (!t->rep_owner[ci] || atomic_load(&e->cfg_failed[t->c_lo + ci])) continue;
        kvs_status st = kvs_host_rep_sync(t->rep[ci], (const float *const *)t->hk, (const float *const *)t->hv, p + 1);
        if (st != KVS_OK)
            for (int cj = ci; cj < t->nc; cj++)
                if (t->rep[cj] == t->rep[ci]) fail_config(e, t->c_lo + cj, t->layer, st);
    }
}

static kvs_status run_task(engine *e, int task_index, int layer, int c_lo, int c_hi) {
    const int32_t *lw = e->src->layer_window;
    task t = {.e = e, .layer = layer, .c_lo = c_lo, .c_hi = c_hi, .nc = c_hi - c_lo,
              .window = lw && lw[layer] > 0 && lw[layer] < e->N ? lw[layer] : 0, .kv16 = history16_dtype(e)};
    kvs_status st = task_alloc(&t);
    if (st == KVS_OK) kvs_host_check_window(t.check, t.window);
    const kvs_trace_block **blk = NULL;
    int any_oracle = 0;
    double *cfg_time = NULL;
    uint8_t *ran = NULL;  /* [nc] configurations active at the current position */
    uint8_t *live = NULL; /* [nc] those still running within it (decode_position) */
    if (st != KVS_OK) goto cleanup;
    blk = calloc((size_t)e->Hkv, sizeof *blk);
    cfg_time = calloc((size_t)t.nc, sizeof *cfg_time);
    ran = calloc((size_t)t.nc, 1);
    live = calloc((size_t)t.nc, 1);
    if (!blk || !cfg_time || !ran || !live) {
        st = kvs_fail(KVS_ERR_NOMEM, "replay: out of memory");
        goto cleanup;
    }
    for (int h = 0; h < e->Hkv; h++) KVS_TRY(st = e->src->stream_open(e->src->user, layer, h, &t.streams[h]));
    /* Samples go to this task's spill file: replay memory stays bounded by policy state, not trace length. */
    KVS_TRY(st = kvs_sample_spill_create(&e->spills[task_index]));
    for (int ci = 0; ci < t.nc; ci++)
        KVS_TRY(st = kvs_sample_set_create(e->spills[task_index], N_METRICS,
                                           &e->acc[(size_t)(c_lo + ci) * (size_t)e->L + (size_t)layer].samples));
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
        /* The block's K/V join the history at once (views still expose only 0..p), so the reference can be
         * computed for several positions together. */
        for (int h = 0; h < e->Hkv; h++) {
            size_t rows = (size_t)blk[0]->n_pos * d;
            float *hk = t.hk[h] + (size_t)pos * d, *hv = t.hv[h] + (size_t)pos * d;
            if (t.kv16 != KVS_DTYPE_F32) {
                /* the 16-bit rows, and the fp32 rows as their conversion (the block's own values for a source
                 * whose values are that dtype's, as a trace's are): both histories hold the same numbers */
                uint16_t *hk16 = t.hk16[h] + (size_t)pos * d, *hv16 = t.hv16[h] + (size_t)pos * d;
                kvs_encode(t.kv16, blk[h]->k, rows, hk16);
                kvs_encode(t.kv16, blk[h]->v, rows, hv16);
                kvs_decode(t.kv16, hk16, rows, hk);
                kvs_decode(t.kv16, hv16, rows, hv);
            } else {
                memcpy(hk, blk[h]->k, rows * sizeof(float));
                memcpy(hv, blk[h]->v, rows * sizeof(float));
            }
        }
        t.ref_n = 0;
        for (int i = 0; i < blk[0]->n_pos; i++, pos++) {
            if (e->o->cancel && *e->o->cancel) {
                st = kvs_fail(KVS_ERR_INTERRUPTED, "replay interrupted at layer %d, position %lld of %lld", layer,
                              (long long)pos, (long long)e->N);
                goto cleanup;
            }
            report_progress(e, 1);
            while (tk + 1 < e->src->n_turns && pos >= e->src->turns[tk].end) tk++;
            const kvs_turn *turn = &e->src->turns[tk];
            int is_prompt = pos < turn->prompt_end;
            int measured = e->o->measure == KVS_MEASURE_ALL || (e->o->measure == KVS_MEASURE_PREFILL) == is_prompt;
            double t0 = kvs_now_s();
            if (is_prompt)
                for (int h = 0; h < e->Hkv; h++)
                    memcpy(t.qb[h] + (size_t)(pos - turn->begin) * Gd, blk[h]->q + (size_t)i * Gd, Gd * sizeof(float));
            t.cur_p = t.cur_o = t.cur_s = NULL;
            if (needs_reference(e, pos, tk, any_oracle)) {
                if (pos >= t.ref_first + t.ref_n) { /* the next run of positions needing it, within this block */
                    int64_t nb = 1;
                    while (nb < t.ref_cap && i + nb < blk[0]->n_pos && needs_reference(e, pos + nb, tk, any_oracle))
                        nb++;
                    reference_block(&t, blk, i, pos, nb);
                }
                size_t b = (size_t)(pos - t.ref_first), blk_floats = (size_t)e->Hkv * (size_t)e->G;
                t.cur_p = t.fullp + b * blk_floats * (size_t)e->N;
                t.cur_o = t.fullo + b * blk_floats * d;
                if (t.fulls) t.cur_s = t.fulls + b * blk_floats * (size_t)e->N;
            }
            double shared = kvs_now_s() - t0;
            kvs_policy_memo_clear(t.memo); /* entries hold only this position's computations */
            sync_codecs(&t, pos);
            int active = 0;
            for (int ci = 0; ci < t.nc; ci++) active += ran[ci] = !atomic_load(&e->cfg_failed[c_lo + ci]);
            double ranked0 = t.rank_seconds;
            if (is_prompt) {
                prompt_position(&t, pos, tk, measured, ran, cfg_time);
            } else {
                memcpy(live, ran, (size_t)t.nc);
                decode_position(&t, blk, i, pos, tk, measured, any_oracle, live, cfg_time);
            }
            /* the reference, and the ranking done for whichever configuration asked first, are shared work */
            double ranked = t.rank_seconds - ranked0;
            for (int ci = 0; ci < t.nc && active; ci++)
                if (ran[ci]) cfg_time[ci] += (shared + ranked) / active;
            if (measured) t.measured_steps++;
        }
    }
    st = KVS_OK;
cleanup:
    if (cfg_time)
        for (int ci = 0; ci < t.nc; ci++) e->acc[(size_t)(c_lo + ci) * (size_t)e->L + (size_t)layer].wall += cfg_time[ci];
    free(cfg_time);
    free(ran);
    free(live);
    free(blk);
    task_free(&t);
    return st;
}

typedef struct {
    engine *e;
    int max_workers; /* no more workers than tasks */
} replay_job;

/* Takes tasks one at a time until none is left or one failed (e->fatal). */
static void replay_worker(void *arg, int worker_index, int n_workers) {
    (void)n_workers;
    replay_job *job = arg;
    engine *e = job->e;
    if (worker_index >= job->max_workers) return;
    for (int k; (k = claim_next(e, &e->next_task, e->n_tasks)) >= 0;) {
        int layer = k / e->n_groups, grp = k % e->n_groups;
        int nc = e->o->n_configs;
        int c_lo = (int)((int64_t)nc * grp / e->n_groups), c_hi = (int)((int64_t)nc * (grp + 1) / e->n_groups);
        if (c_lo == c_hi) continue;
        kvs_status st = run_task(e, k, layer, c_lo, c_hi);
        if (st != KVS_OK) set_fatal(e, st);
    }
}

/* ------------------------------------------------------------------------------------------------
 * Allocation pass (PyramidKV, Ada-KV, D2O): over the first turn's prompt of every (layer, KV head)
 * ---------------------------------------------------------------------------------------------- */

/* One reader of the allocation pass: a first prompt's rows and the memo its configurations share. */
typedef struct {
    float *k, *v, *q;
    kvs_policy_memo *memo; /* NULL: none (prefill_memo = -1, a hook, or no memory) */
} alloc_reader;

static void alloc_reader_free(alloc_reader *w) {
    free(w->k);
    free(w->v);
    free(w->q);
    kvs_policy_memo_free(w->memo);
}

static kvs_status alloc_reader_init(engine *e, int64_t P, alloc_reader *w) {
    size_t d = (size_t)e->d, Gd = (size_t)e->G * d;
    memset(w, 0, sizeof *w);
    w->k = malloc((size_t)P * d * sizeof(float));
    w->v = malloc((size_t)P * d * sizeof(float));
    w->q = malloc((size_t)P * Gd * sizeof(float));
    if (e->o->prefill_memo >= 0 && !(e->o->hooks && e->o->hooks->on_step_end)) w->memo = kvs_policy_memo_create();
    if (!w->k || !w->v || !w->q) {
        alloc_reader_free(w);
        return kvs_fail(KVS_ERR_NOMEM, "replay: out of memory for the allocation pass");
    }
    return KVS_OK;
}

/* Whether configuration c takes part in the allocation pass's phase `concurrent` (policies whose alloc_prefill of
 * different (layer, KV head) may run at once, kvs_policy_ops.alloc_concurrent; the others in a serial phase). */
static int alloc_in_phase(const engine *e, int c, int concurrent) {
    return e->alloc[c] && !atomic_load(&e->cfg_failed[c]) &&
           (e->o->configs[c].policy.ops->alloc_concurrent != 0) == concurrent;
}

/* The first prompt (P positions) of (layer l, KV head h) read into w, then alloc_prefill of every configuration of
 * the phase over that one view. The memo is cleared first (its entries are keyed by w's buffers, which held
 * another head's rows) and then shared: a policy's budget-independent prompt scoring (kvs_policy_shared) is
 * computed by its first configuration and copied by the others. `mu`: the lock around fail_config when
 * several readers run at once, NULL when serial. */
static kvs_status alloc_head(engine *e, alloc_reader *w, int l, int h, int64_t P, int concurrent,
                             pthread_mutex_t *mu) {
    size_t d = (size_t)e->d, Gd = (size_t)e->G * d;
    void *stream = NULL;
    kvs_status st = e->src->stream_open(e->src->user, l, h, &stream);
    if (st != KVS_OK) return st;
    int64_t pos = 0;
    while (pos < P) {
        const kvs_trace_block *b;
        st = e->src->stream_next(stream, &b);
        if (st == KVS_ERR_END) st = kvs_fail(KVS_ERR_TRUNCATED, "replay: stream (layer %d, kv head %d) ended early", l, h);
        if (st == KVS_OK) st = check_block(e, b, l, h, pos);
        if (st != KVS_OK) {
            e->src->stream_free(stream);
            return st;
        }
        for (int i = 0; i < b->n_pos && pos < P; i++, pos++) {
            memcpy(w->k + (size_t)pos * d, b->k + (size_t)i * d, d * sizeof(float));
            memcpy(w->v + (size_t)pos * d, b->v + (size_t)i * d, d * sizeof(float));
            memcpy(w->q + (size_t)pos * Gd, b->q + (size_t)i * Gd, Gd * sizeof(float));
        }
    }
    e->src->stream_free(stream);
    kvs_policy_memo_clear(w->memo);
    kvs_policy_view view = {
        .n = P, .group = e->G, .head_dim = e->d, .scale = e->src->model.scale, .k = w->k, .v = w->v, .q = w->q,
        .q_first = 0, .n_q = P, .turn_begin = 0, .prompt_end = P, .turn = 0, .full_probs = NULL,
        .block_begin = 0, .last_block = 1, .memo = w->memo,
    };
    for (int c = 0; c < e->o->n_configs; c++) {
        if (!alloc_in_phase(e, c, concurrent)) continue;
        kvs_status cs = e->o->configs[c].policy.ops->alloc_prefill(e->alloc[c], l, h, &view);
        if (cs != KVS_OK) {
            if (mu) pthread_mutex_lock(mu);
            fail_config(e, c, l, cs);
            if (mu) pthread_mutex_unlock(mu);
        }
    }
    return KVS_OK;
}

typedef struct {
    engine *e;
    int64_t P;
    alloc_reader *readers; /* [workers] */
    atomic_int next;
    pthread_mutex_t mu;
} alloc_job;

/* A worker of the concurrent phase: (layer, KV head) pairs one at a time, on its own reader. */
static void alloc_worker(void *arg, int worker, int n_workers) {
    (void)n_workers;
    alloc_job *j = arg;
    engine *e = j->e;
    for (int k; (k = claim_next(e, &j->next, e->L * e->Hkv)) >= 0;) {
        kvs_status st = alloc_head(e, &j->readers[worker], k / e->Hkv, k % e->Hkv, j->P, 1, &j->mu);
        if (st != KVS_OK) set_fatal(e, st);
    }
}

static kvs_status allocation_pass(engine *e) {
    const kvs_replay_opts *o = e->o;
    size_t per = (size_t)e->L * (size_t)e->Hkv;
    void **alloc = e->alloc; /* freed by kvs_replay_execute after every instance */
    kvs_status st = KVS_OK;
    int any[2] = {0, 0};
    for (int c = 0; c < o->n_configs; c++) {
        kvs_status cs = kvs_host_alloc_begin(&o->configs[c].policy, &e->src->model, o->configs[c].budget,
                                             e->budgets + (size_t)c * per, &alloc[c]);
        if (cs != KVS_OK) fail_config(e, c, 0, cs);
        if (alloc[c]) any[o->configs[c].policy.ops->alloc_concurrent != 0] = 1;
    }
    int64_t P = e->src->n_turns > 0 ? e->src->turns[0].prompt_end : 0;
    if (P > 0 && any[1]) { /* the heads at once, one reader (buffers, memo) a worker */
        int threads = o->threads > 0 ? o->threads : kvs_n_cpus();
        if (threads > (int)per) threads = (int)per;
        kvs_threadpool *pool = NULL;
        if (threads > 1 && kvs_threadpool_create(threads, &pool) != KVS_OK) pool = NULL;
        int nw = kvs_threadpool_size(pool);
        alloc_job job = {.e = e, .P = P, .readers = calloc((size_t)nw, sizeof(alloc_reader))};
        if (!job.readers) st = kvs_fail(KVS_ERR_NOMEM, "replay: out of memory for the allocation pass");
        for (int i = 0; i < nw && st == KVS_OK; i++) st = alloc_reader_init(e, P, &job.readers[i]);
        if (st == KVS_OK) {
            atomic_init(&job.next, 0);
            pthread_mutex_init(&job.mu, NULL);
            kvs_threadpool_run(pool, alloc_worker, &job);
            pthread_mutex_destroy(&job.mu);
            if (e->fatal != KVS_OK) st = kvs_fail(e->fatal, "%s", e->fatal_msg);
        }
        for (int i = 0; job.readers && i < nw; i++) alloc_reader_free(&job.readers[i]);
        free(job.readers);
        kvs_threadpool_free(pool);
        if (st != KVS_OK) return st;
    }
    if (P > 0 && any[0]) { /* the others in (layer, KV head) order, as they may accumulate across heads */
        alloc_reader w;
        if ((st = alloc_reader_init(e, P, &w)) != KVS_OK) return st;
        for (int l = 0; l < e->L && st == KVS_OK; l++)
            for (int h = 0; h < e->Hkv && st == KVS_OK; h++) st = alloc_head(e, &w, l, h, P, 0, NULL);
        alloc_reader_free(&w);
        if (st != KVS_OK) return st;
    }
    for (int c = 0; c < o->n_configs; c++) {
        if (!alloc[c] || atomic_load(&e->cfg_failed[c])) continue;
        kvs_status cs = kvs_host_alloc_end(&o->configs[c].policy, &e->src->model, alloc[c],
                                           e->budgets + (size_t)c * per, &e->shared[c]);
        if (cs != KVS_OK) fail_config(e, c, 0, cs);
    }
    return KVS_OK;
}

/* ------------------------------------------------------------------------------------------------
 * Public entry points
 * ---------------------------------------------------------------------------------------------- */

/* What the replay of a sliding-window layer (replay.h "Sliding-window layers") does not support is refused here,
 * naming the layer and the policy, rather than measured against the wrong reference: a policy without window_evict
 * (it cannot be told what the window dropped). */
static kvs_status validate_windows(const kvs_replay_source *src, const kvs_replay_opts *o) {
    const kvs_policy_model *m = &src->model;
    for (int l = 0; src->layer_window && l < m->n_layers; l++) {
        int32_t w = src->layer_window[l];
        if (w <= 0 || w >= m->n_positions) continue; /* full attention over this trace */
        for (int c = 0; c < o->n_configs; c++) {
            const struct kvs_policy_ops *ops = o->configs[c].policy.ops;
            if (!ops->window_evict)
                return kvs_fail(KVS_ERR_UNSUPPORTED, "layer %d attends to a sliding window of %d positions and the trace "
                                "has %lld: policy %s cannot replay a sliding-window layer (it has no window_evict, so it "
                                "cannot be told what the window dropped)", l, (int)w, (long long)m->n_positions,
                                ops->name);
        }
    }
    return KVS_OK;
}

kvs_status kvs_replay_validate(const kvs_replay_source *src, const kvs_replay_opts *o) {
    const kvs_policy_model *m = &src->model;
    if (o->n_configs < 1) return kvs_fail(KVS_ERR_INVALID_ARG, "no policy configuration to run");
    if (m->n_layers < 1 || m->n_kv_heads < 1 || m->group < 1 || m->head_dim < 1 || m->n_positions < 1 ||
        m->n_positions > INT32_MAX || src->n_turns < 1)
        return kvs_fail(KVS_ERR_INVALID_ARG, "the trace has no positions, layers or turns to replay");
    if (o->series_every < 0) return kvs_fail(KVS_ERR_INVALID_ARG, "--series-every must be >= 0");
    if (o->threads < 0) return kvs_fail(KVS_ERR_INVALID_ARG, "--threads must be >= 0");
    int64_t prev = 0;
    for (int64_t i = 0; i < src->n_turns; i++) {
        const kvs_turn *t = &src->turns[i];
        if (t->begin != prev || t->prompt_end < t->begin || t->end < t->prompt_end)
            return kvs_fail(KVS_ERR_FORMAT, "turn %lld [%lld, %lld, %lld) is not contiguous", (long long)i,
                            (long long)t->begin, (long long)t->prompt_end, (long long)t->end);
        prev = t->end;
    }
    if (prev != m->n_positions)
        return kvs_fail(KVS_ERR_FORMAT, "turns cover %lld of %lld positions", (long long)prev,
                        (long long)m->n_positions);
    if (o->measure != KVS_MEASURE_DECODE && o->measure != KVS_MEASURE_ALL && o->measure != KVS_MEASURE_PREFILL)
        return kvs_fail(KVS_ERR_INVALID_ARG, "unknown measurement mode %d", (int)o->measure);
    if (m->kv_bytes < 1 || m->aux_bytes < 1)
        return kvs_fail(KVS_ERR_INVALID_ARG, "kv_bytes %d and aux_bytes %d must be at least 1", (int)m->kv_bytes,
                        (int)m->aux_bytes);
    /* Nothing to measure is refused, never reported as a perfect run. */
    int64_t n_generated = 0, n_prompt = 0;
    for (int64_t i = 0; i < src->n_turns; i++) {
        n_generated += src->turns[i].end - src->turns[i].prompt_end;
        n_prompt += src->turns[i].prompt_end - src->turns[i].begin;
    }
    if (o->measure == KVS_MEASURE_DECODE && n_generated == 0)
        return kvs_fail(KVS_ERR_INVALID_ARG, "the trace has no generated position to measure (%lld prompt "
                                             "positions, 0 generated); use --measure prefill to measure prompt positions",
                        (long long)n_prompt);
    if (o->measure == KVS_MEASURE_PREFILL && n_prompt == 0)
        return kvs_fail(KVS_ERR_INVALID_ARG, "the trace has no prompt position to measure");
    for (int c = 0; c < o->n_configs; c++) {
        const kvs_replay_config *rc = &o->configs[c];
        if (rc->budget < 1 || rc->budget > m->n_positions)
            return kvs_fail(KVS_ERR_INVALID_ARG, "replay: budget %lld for policy %s is outside [1, %lld] (trace positions)",
                            (long long)rc->budget, rc->policy.ops->name, (long long)m->n_positions);
        int64_t page = kvs_replay_page_of(o, c);
        if (page < 0 || page > m->n_positions)
            return kvs_fail(KVS_ERR_INVALID_ARG, "replay: page size %lld is outside [0, %lld] (trace positions)",
                            (long long)page, (long long)m->n_positions);
        int ps = kvs_replay_page_score_of(o, c);
        if (ps < KVS_PAGE_SCORE_AUTO || ps > KVS_PAGE_SCORE_SUM)
            return kvs_fail(KVS_ERR_INVALID_ARG, "replay: unknown page score rule %d", ps);
        kvs_status st = kvs_policy_validate(&rc->policy, m, rc->budget);
        if (st != KVS_OK) return st;
    }
    return validate_windows(src, o);
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

/* Fills one kvs_results_agg with the exact statistics of every metric over the samples of `sets` (NULL
 * entries skipped: a task that failed before creating them). */
static kvs_status agg_fill(kvs_results_agg *agg, int32_t layer, kvs_sample_set **sets, int n_sets) {
    int w = 0;
    for (int i = 0; i < n_sets; i++)
        if (sets[i]) sets[w++] = sets[i];
    memset(agg, 0, sizeof *agg);
    agg->layer = layer;
    if (w == 0) return KVS_OK;
    return kvs_sample_stats_all(sets, w, agg->m);
}

/* Run c's result: its budgets, per-layer and whole-run aggregates, wall time, status and step series. sets: scratch
 * for L set pointers. */
static kvs_status build_run(engine *e, kvs_replay_run_result *run, int c, kvs_sample_set **sets) {
    size_t per = (size_t)e->L * (size_t)e->Hkv;
    run->n_layers = e->L;
    run->layer_aggs = calloc((size_t)e->L, sizeof *run->layer_aggs);
    run->budgets = malloc(per * sizeof(int64_t));
    if (!run->layer_aggs || !run->budgets) return kvs_fail(KVS_ERR_NOMEM, "replay: out of memory for aggregates");
    memcpy(run->budgets, e->budgets + (size_t)c * per, per * sizeof(int64_t));
    int64_t n_series = 0;
    kvs_status st = KVS_OK;
    for (int l = 0; l < e->L; l++) {
        layer_acc *a = &e->acc[(size_t)c * (size_t)e->L + (size_t)l];
        run->wall_seconds += a->wall;
        if (a->max_attended > run->max_attended) run->max_attended = a->max_attended;
        if (a->status != KVS_OK && run->status == KVS_OK) {
            run->status = a->status;
            snprintf(run->error, sizeof run->error, "%s", a->error);
        }
        n_series += a->n_series;
        kvs_sample_set *one = a->samples;
        if (run->status == KVS_OK && (st = agg_fill(&run->layer_aggs[l], l, &one, 1)) != KVS_OK) return st;
    }
    for (int l = 0; l < e->L; l++) sets[l] = e->acc[(size_t)c * (size_t)e->L + (size_t)l].samples;
    if (run->status == KVS_OK && (st = agg_fill(&run->run_agg, -1, sets, e->L)) != KVS_OK) return st;
    if (n_series > 0) {
        run->steps = malloc((size_t)n_series * sizeof *run->steps);
        if (!run->steps) return kvs_fail(KVS_ERR_NOMEM, "replay: out of memory for the step series");
        for (int l = 0; l < e->L; l++) {
            layer_acc *a = &e->acc[(size_t)c * (size_t)e->L + (size_t)l];
            if (a->n_series == 0) continue; /* a run that failed early: no series (a->series NULL) here */
            memcpy(run->steps + run->n_steps, a->series, (size_t)a->n_series * sizeof *a->series);
            run->n_steps += a->n_series;
        }
    }
    return KVS_OK;
}

typedef struct {
    engine *e;
    kvs_replay_result *r;
    atomic_int next_run;
    int max_workers;
} results_job;

/* Takes runs one at a time until none is left or one failed (e->fatal, with its detail); workers past max_workers
 * take none (each sorting worker holds its own statistics memory). */
static void results_worker(void *arg, int worker_index, int n_workers) {
    (void)n_workers;
    results_job *j = arg;
    engine *e = j->e;
    if (worker_index >= j->max_workers) return;
    kvs_sample_set **sets = calloc((size_t)e->L, sizeof *sets);
    if (!sets) {
        set_fatal(e, kvs_fail(KVS_ERR_NOMEM, "replay: out of memory for aggregates"));
        return;
    }
    for (int c; (c = claim_next(e, &j->next_run, e->o->n_configs)) >= 0;) {
        kvs_status st = build_run(e, &j->r->runs[c], c, sets);
        if (st != KVS_OK) {
            set_fatal(e, st);
            break;
        }
    }
    free(sets);
}

/* Every run's result, the runs shared out among the pool's workers: the exact statistics sort every metric's
 * samples, which is worth doing in parallel after the replay. At most 64 sort at once, each with up to the spills'
 * stats memory (KVS_SAMPLE_STATS_MEMORY_DEFAULT). */
static kvs_status build_results(engine *e, kvs_replay_result *r, kvs_threadpool *pool) {
    results_job j = {.e = e, .r = r, .max_workers = 64};
    atomic_init(&j.next_run, 0);
    kvs_threadpool_run(pool, results_worker, &j);
    if (e->fatal != KVS_OK) return kvs_fail(e->fatal, "%s", e->fatal_msg);
    return KVS_OK;
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
    kvs_threadpool *pool = NULL;
    e.budgets = calloc((size_t)o->n_configs * (size_t)e.L * (size_t)e.Hkv, sizeof(int64_t));
    e.acc = calloc((size_t)o->n_configs * (size_t)e.L, sizeof *e.acc);
    e.cfg_failed = calloc((size_t)o->n_configs, sizeof *e.cfg_failed);
    e.alloc = calloc((size_t)o->n_configs, sizeof *e.alloc);
    e.shared = calloc((size_t)o->n_configs, sizeof *e.shared);
    e.run_seed = calloc((size_t)o->n_configs, sizeof *e.run_seed);
    r = calloc(1, sizeof *r);
    if (r) r->runs = calloc((size_t)o->n_configs, sizeof *r->runs);
    if (!e.budgets || !e.acc || !e.cfg_failed || !e.alloc || !e.shared || !e.run_seed || !r || !r->runs) {
        st = kvs_fail(KVS_ERR_NOMEM, "replay: out of memory");
        goto cleanup;
    }
    r->n_runs = o->n_configs;
    for (int c = 0; c < o->n_configs; c++) {
        atomic_init(&e.cfg_failed[c], 0);
        e.run_seed[c] = kvs_host_run_seed(
            &(kvs_host_identity){.content_hash = src->content_hash, .policy = &o->configs[c].policy,
                                 .budget = o->configs[c].budget,
                                 .codec = kvs_replay_codec_of(o, c) ? kvs_codec_spec(kvs_replay_codec_of(o, c)) : NULL,
                                 .page_tokens = kvs_replay_page_of(o, c),
                                 .page_score = kvs_host_page_rule(o->configs[c].policy.ops,
                                                                  (kvs_page_score)kvs_replay_page_score_of(o, c))},
            &src->model);
    }
    for (int64_t i = 0; i < src->n_turns; i++) {
        const kvs_turn *t = &src->turns[i];
        if (t->prompt_end - t->begin > e.max_prompt) e.max_prompt = t->prompt_end - t->begin;
    }
    KVS_TRY(st = allocation_pass(&e));

    int threads = o->threads > 0 ? o->threads : kvs_n_cpus(), all_threads = threads;
    e.n_groups = (threads + e.L - 1) / e.L;
    if (e.n_groups > o->n_configs) e.n_groups = o->n_configs;
    if (e.n_groups < 1) e.n_groups = 1;
    e.n_tasks = e.L * e.n_groups;
    e.spills = calloc((size_t)e.n_tasks, sizeof *e.spills);
    if (!e.spills) {
        st = kvs_fail(KVS_ERR_NOMEM, "replay: out of memory");
        goto cleanup;
    }
    if (threads > e.n_tasks) threads = e.n_tasks;
    atomic_init(&e.next_task, 0);
    atomic_init(&e.steps_done, 0);
    atomic_init(&e.last_progress_us, (long long)(kvs_now_s() * 1e6));
    /* one pool for the replay and the statistics after it; without threads the work runs here */
    if (all_threads > 1 && kvs_threadpool_create(all_threads, &pool) != KVS_OK) pool = NULL;
    {
        replay_job job = {.e = &e, .max_workers = threads};
        kvs_threadpool_run(pool, replay_worker, &job);
    }
    if (e.fatal != KVS_OK) {
        st = kvs_fail(e.fatal, "%s", e.fatal_msg);
        goto cleanup;
    }
    KVS_TRY(st = build_results(&e, r, pool));
    *out = r;
    r = NULL;
cleanup:
    if (e.acc)
        for (size_t i = 0; i < (size_t)o->n_configs * (size_t)e.L; i++) acc_free(&e.acc[i]);
    free(e.acc);
    if (e.spills)
        for (int i = 0; i < e.n_tasks; i++) kvs_sample_spill_free(e.spills[i]);
    free(e.spills);
    free(e.budgets);
    free(e.cfg_failed);
    if (e.alloc)
        for (int c = 0; c < o->n_configs; c++)
            kvs_host_alloc_free(&o->configs[c].policy, e.alloc[c]);
    free(e.alloc);
    free((void *)e.shared);
    free(e.run_seed);
    kvs_threadpool_free(pool);
    pthread_mutex_destroy(&e.mu);
    kvs_replay_result_free(r);
    return st;
}

/* ------------------------------------------------------------------------------------------------
 * Trace-backed source
 * ---------------------------------------------------------------------------------------------- */

static kvs_status trace_open_cb(void *user, int layer, int kv_head, void **stream) {
    kvs_status st = kvs_trace_stream_open(user, layer, kv_head, (kvs_trace_stream **)stream);
    if (st == KVS_OK) kvs_trace_stream_qkv_only(*stream); /* the engine computes its own reference from q/k/v */
    return st;
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
    m->max_seq_len = info->model.max_seq_len;
    m->rope_theta = info->model.rope_theta;
    m->rope_layout = info->model.rope_layout;
    snprintf(m->model_name, sizeof m->model_name, "%s", info->model.model_name);
    out->n_turns = info->n_turns;
    out->turns = info->turns;
    out->user = (void *)t; /* the callbacks only read through the const reader API */
    out->stream_open = trace_open_cb;
    out->stream_next = trace_next_cb;
    out->stream_free = trace_free_cb;
    out->kv_dtype = info->capture.dtype;
    out->layer_window = info->model.layer_window;
    return kvs_trace_content_sha256(t, out->content_hash);
}

/* ------------------------------------------------------------------------------------------------
 * Budgets
 * ---------------------------------------------------------------------------------------------- */

kvs_status kvs_replay_parse_budgets(const char *text, int64_t prompt_len, int64_t n_positions, int64_t **budgets,
                                    double **fractions, int *n) {
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
            /* Of the first turn's prompt: known before decoding starts, unlike the trace's final length,
             * so a percentage means the same budget however long the model then generates. */
            double frac = pct / 100.0;
            if (!(frac > 0)) { /* a positive percentage below the smallest double's hundredfold divides to 0 */
                st = kvs_fail(KVS_ERR_INVALID_ARG, "--budgets: '%.*s' is too small a percentage (it rounds to 0)",
                              (int)len, p);
                break;
            }
            int64_t v = (int64_t)ceil(frac * (double)prompt_len - 1e-9);
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
