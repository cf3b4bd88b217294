/* rkv.c — R-KV, redundancy-aware KV compression for reasoning models (Cai et al., arXiv 2505.24133), as specified
 * in ../shared/POLICY_SPEC_2.md §2.9 [RKV]: the authors' Zefan-Cai/R-KV (R1KV.update_kv, compute_attention_scores,
 * cal_similarity, the step-level trigger of the CausalLM forward) and the README's default table.
 *
 * Per KV head, the cache is compressed while decoding: whenever a buffer of Δ new tokens has filled, after that
 * step's attention, every resident token but
 * the α most recent (the window, always kept) is scored
 *   F_j = λ·I_j − (1 − λ)·R_j
 *  - importance I: the α cached queries (the last α positions' queries of every query head of the group) give
 *    logits max_g s·q_g·k_j, softmaxed over the candidates only, averaged over the queries, max-pooled (kernel 7)
 *    in position order;
 *  - redundancy R: cosine similarities of all m resident keys (diagonal 0); in each row the most recent key with
 *    cosine > 0.5 is exempted (zeroed: the latest copy of a repeated token is not penalised); column means;
 *    softmax over the m keys;
 * and the TOPK(F) candidates are kept with the window (ties: the older position, POLICY_SPEC §1.4). The prompt is
 * compressed the same way at prefill when it exceeds the target (its last α queries seed the query cache).
 *
 * Budget (§0.3 PERIODIC, budget_mode PEAK, the kvsim default): each compression cuts to T = B − Δ, so the attended
 * size never exceeds B (the current token included) and the policy is EVERY_STEP-scoped. The trigger is the
 * cache's fill [SIM-CHOICE]: a step (or a prefill) that leaves B resident compresses after its attention, so the
 * compressions come every Δ steps as the reference's, but phased on the fill instead of on positions p with
 * p mod Δ = 0 (the reference's step_length flag, which in PEAK would compress caches far below B); a budget
 * covering the trace therefore evicts nothing (lossless), as TARGET's B >= n does in the reference. The reference's TARGET
 * mode (compress to B every Δ steps; attended B+1 … B+Δ) is this policy at the budget B + Δ: replay it as
 * `--budgets (B+Δ)`. With Δ = 1 (preset `fixed`) the cache is a FIXED B every step.
 * Small budgets [SIM-CHOICE; the reference requires B > Δ + α]: the window is α' = min(α, B − 1); when the room
 * beside it, B − α', is at most Δ (the reference's B > Δ + α fails), the buffer is Δ' = ⌈(B − α')/2⌉ (half the room buffers new tokens, half keeps
 * scored ones) instead of leaving no candidate; otherwise Δ' = Δ. The notes say when this happens; with B − α' = 1
 * the policy is a sliding window.
 *
 * Decisions (§2.9 Δ-REF):
 *  1. λ = 0.1 (the README's "Default Hyper-parameters" table); the code's 0.07 is the `ref` preset;
 *  2. softmax over the candidates only, redundancy over all keys including the window: as REF;
 *  3. a row with no similar key zeroes nothing (PAPER); ref_quirks=1 zeroes its column 0 as the reference does
 *     (on in the `ref` preset);
 *  4. pooling in position order (the cache is kept sorted by position; the reference pools in its score-ordered
 *     cache order, §1.6: not reproduced);
 *  5. PEAK, not TARGET (above);
 *  6. β = 1 similar neighbour exempted (the code's `last` mode);
 *  - the NEWLINE trigger (compress after a newline token) needs the tokenizer's newline ids, which a policy does
 *    not see: not offered; GQA pooling is the code's default `max` only.
 * Speed: a compression of m resident keys costs m(m − 1)/2 · d multiply-adds for the cosines (each pair once) plus
 * G·α·(m − α)·d for the logits; the prompt's compression scores every prompt key, so at the bench's shape (2 layers,
 * 2 KV heads, d 128, a 7680-position prompt, budgets 128..2048) it is 7680·7679/2·128 = 3.8e9 per (layer, KV head),
 * against decode events of B²·d/2 every Δ steps. That is the method's own cost (the reference builds the same
 * m x m matrix), but it does not depend on the budget: the redundancy of a compression is shared by the
 * configurations of a replay task that hold the same keys at the same position (kvs_policy_shared, keyed by the held
 * positions, m, d, sim_thr and ref_quirks), so the prompt's is computed once for every budget below the prompt
 * (sim/BENCH.md "Policies against H2O" has the time). The `fixed` preset (Δ = 1) scores
 * at every step, B²·d/2 a step: 175 CPU s there (41x H2O); keeping the cosine column sums across steps (one key in,
 * one out: O(B·d) a step) would remove that, at the price of tracking every row's exempted entry; not done.
 * Sliding-window layers (sim/replay.h): the positions before the host's `first` (window_evict) leave the held list at
 * once, and a prefill pushes none of them. The decode step's compression runs in observe(), after the host's eviction
 * (select() only appends and attends; a full-attention layer compresses the same cache at the same step, since
 * nothing changes it in between), so the trigger sees what the step leaves resident in the window and a compression
 * never spends a slot on a position the window drops anyway: a budget B >= W never fills (at most W resident) and
 * holds exactly the window. The redundancy and importance are computed over the held (in-window) keys only; the query
 * cache holds queries, not cache contents, and is unaffected. The compression's costs are charged to the step that
 * compresses: account() predicts it from the held set (exact on a full layer); once the window slides, account()
 * charges the compression the previous step's observe() did instead (one step late, exact in size) [SIM-CHOICE]; the
 * one step on which the window first slides is charged the prediction made before that eviction.
 * Accounting: KV as the default (the attended set); AUX the query cache G·α·d elements per KV head (kv_bytes,
 * as the model keeps queries); at a compression TRANSIENT the cosine matrix m² and the logits α·m (aux_bytes, as
 * the reference materialises them) and an unfused re-read of the m keys and the query cache.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../common/kvs_math.h"
#include "../sim/policy_memo.h"
#include "held.h"
#include "registry.h"
#include "rkv_internal.h"

static const kvs_policy_param rkv_params[] = {
    {.key = "window", .type = KVS_PARAM_INT, .def = 8, .lo = 1, .hi = 1 << 20,
     .help = "alpha: queries cached for scoring, and the most recent tokens always kept (README 8)"},
    {.key = "buffer", .type = KVS_PARAM_INT, .def = 128, .lo = 1, .hi = 1 << 20,
     .help = "Delta: compression every Delta positions, to B - Delta (README divide_length 128; 1 = a fixed cache)"},
    {.key = "lambda", .type = KVS_PARAM_DOUBLE, .def = 0.1, .lo = 0, .hi = 1,
     .help = "importance weight lambda; 1 - lambda on the redundancy (README 0.1; code 0.07)"},
    {.key = "kernel", .type = KVS_PARAM_INT, .def = 7, .lo = 1, .hi = 4095,
     .help = "max-pool kernel on the importance (odd), position order"},
    {.key = "sim_thr", .type = KVS_PARAM_DOUBLE, .def = 0.5, .lo = -1, .hi = 1,
     .help = "cosine above which a key counts as a near-duplicate (the most recent one is exempted)"},
    {.key = "ref_quirks", .type = KVS_PARAM_BOOL, .def = 0, .lo = 0, .hi = 1,
     .help = "a key with no near-duplicate zeroes its similarity to position 0, as the reference code does"},
};

static const kvs_policy_preset rkv_presets[] = {
    {.name = "ref", .params = "window=8,buffer=128,lambda=0.07,ref_quirks=1",
     .help = "the authors' code (run_math.py, R1KV): lambda 0.07, the column-0 quirk; README budgets 128-4096 "
             "(TARGET B = --budgets B+128)"},
    {.name = "fixed", .params = "buffer=1",
     .help = "Delta = 1: scored and cut to B at every step (the FIXED regime of POLICY_SPEC_2 §0.3)"},
};

typedef struct {
    int64_t budget, alpha, delta, target; /* alpha, delta: the effective α' and Δ'; target T = B − Δ' */
    kvs_rkv_opts o;
    int group, d, kv_bytes, aux_bytes;
    float scale;
    kvs_held *held;
    float *qc;          /* [alpha][group][d] the last n_qc queries, oldest first */
    int64_t n_qc;
    int64_t event_m;    /* keys scored at this step's compression (0: none), for account() */
    int64_t late_m;     /* sliding-window layer: keys scored by the last observe()'s compression, not yet charged */
    int pending;        /* select() appended and the step's compression is observe()'s */
    int charged;        /* account() charged this step's predicted compression (event_m) */
    int64_t win_first;  /* positions before it were evicted by the host (sliding-window layer); 0 otherwise */
    double *F;          /* [cap] */
    double *red;        /* [cap] the redundancy of a compression's keys */
    char *mark;         /* [cap] */
    int32_t *top;       /* [cap] */
    void *work;         /* kvs_rkv_scratch_bytes(cap) */
    int64_t cap;
} rkv_state;

static void rkv_free(void *state) {
    rkv_state *s = state;
    if (!s) return;
    kvs_held_free(s->held);
    free(s->qc);
    free(s->F);
    free(s->red);
    free(s->mark);
    free(s->top);
    free(s->work);
    free(s);
}

static void effective(int64_t B, int64_t alpha, int64_t delta, int64_t *a, int64_t *dl) {
    *a = alpha < B - 1 ? alpha : B - 1;
    int64_t half = (B - *a + 1) / 2; /* B <= α + Δ: half the room beside the window buffers, half is kept */
    *dl = delta < B - *a ? delta : half;
}

static kvs_status rkv_create(const kvs_policy_init *init, void **state) {
    rkv_state *s = calloc(1, sizeof *s);
    if (!s) return kvs_fail(KVS_ERR_NOMEM, "rkv: out of memory");
    s->budget = init->budget;
    effective(s->budget, (int64_t)kvs_policy_param_get(init->cfg, "window"),
              (int64_t)kvs_policy_param_get(init->cfg, "buffer"), &s->alpha, &s->delta);
    s->target = s->budget - s->delta;
    s->o.lambda = kvs_policy_param_get(init->cfg, "lambda");
    s->o.kernel = (int)kvs_policy_param_get(init->cfg, "kernel");
    s->o.sim_thr = kvs_policy_param_get(init->cfg, "sim_thr");
    s->o.ref_quirks = kvs_policy_param_get(init->cfg, "ref_quirks") != 0;
    s->group = init->model->group;
    s->d = init->model->head_dim;
    s->scale = init->model->scale;
    s->kv_bytes = init->model->kv_bytes;
    s->aux_bytes = init->model->aux_bytes;
    s->held = kvs_held_create(s->budget + 1);
    s->qc = malloc((size_t)(s->alpha > 0 ? s->alpha : 1) * (size_t)s->group * (size_t)s->d * sizeof(float));
    if (!s->held || !s->qc) {
        rkv_free(s);
        return kvs_fail(KVS_ERR_NOMEM, "rkv: out of memory");
    }
    *state = s;
    return KVS_OK;
}

/* ---- scoring ---------------------------------------------------------------------------------------- */

/* scratch: doubles u[m], norm[m], row[m], col[m], lastv[m]; int64 last[m]; floats logit[m], tmp[m], uf[m],
 * pooled[m]. */
size_t kvs_rkv_scratch_bytes(int64_t m) {
    size_t n = (size_t)(m > 0 ? m : 1);
    return 5 * n * sizeof(double) + n * sizeof(int64_t) + 4 * n * sizeof(float);
}

/* R: the redundancy of the m keys (§2.9 step 3) into col[m]: cosines (diagonal 0), each row's most recent
 * near-duplicate exempted, column means, softmax over the m keys. Uses the scratch's norm, row, lastv and last
 * (kvs_rkv_scores' layout), never its importance part. A function of the keys' rows, idx, m, d, sim_thr and
 * ref_quirks only: the budgets of a replay that hold the same keys share it (rkv_redundancy_shared). */
static void rkv_redundancy(const float *keys, const int32_t *idx, int64_t m, int d, const kvs_rkv_opts *o, double *col,
                           void *scratch) {
    double *u = scratch, *norm = u + m, *row = norm + m, *lastv = row + 2 * m;
    int64_t *last = (int64_t *)(lastv + m);
    /* The matrix is symmetric (the same products and norms in either order give the same double), so each pair is
     * computed once: its value is added to both columns, and each row's latest key above the threshold (and that
     * cosine) is tracked as the pairs go by; the exemptions are taken off the column sums at the end. */
    kvs_key_norms(keys, (size_t)d, idx, (size_t)m, (size_t)d, norm);
    for (int64_t b = 0; b < m; b++) col[b] = 0, last[b] = -1, row[b] = 0;
    for (int64_t a = 0; a < m; a++) {
        const float *ka = keys + (size_t)idx[a] * (size_t)d;
        for (int64_t b = a + 1; b < m; b++) {
            double den = norm[a] * norm[b];
            double c = (double)kvs_dot(ka, keys + (size_t)idx[b] * (size_t)d, (size_t)d) / (den > 1e-8 ? den : 1e-8);
            col[a] += c;
            col[b] += c;
            if (a == 0) row[b] = c; /* C[b, 0], for the reference's quirk */
            if (c > o->sim_thr) {
                last[a] = b, lastv[a] = c; /* b grows: the latest so far */
                if (a > last[b]) last[b] = a, lastv[b] = c;
            }
        }
    }
    for (int64_t a = 0; a < m; a++) {
        if (last[a] >= 0)
            col[last[a]] -= lastv[a];
        else if (o->ref_quirks)
            col[0] -= row[a];
    }
    double mx = -INFINITY, sum = 0;
    for (int64_t b = 0; b < m; b++) {
        col[b] /= (double)m;
        if (col[b] > mx) mx = col[b];
    }
    for (int64_t b = 0; b < m; b++) sum += (col[b] = exp(col[b] - mx));
    for (int64_t b = 0; b < m; b++) col[b] /= sum;
}

/* kvs_rkv_scores with the redundancy `red` (m doubles) given, or computed when NULL. */
static void rkv_scores(const float *keys, const int32_t *idx, int64_t m, int64_t n_cand, const float *q, int64_t n_q,
                       int group, int d, float scale, const kvs_rkv_opts *o, const double *red, double *F, double *I,
                       double *R, void *scratch) {
    double *u = scratch, *norm = u + m, *row = norm + m, *col = row + m, *lastv = col + m;
    int64_t *last = (int64_t *)(lastv + m);
    float *logit = (float *)(last + m), *tmp = logit + m, *uf = tmp + m, *pooled = uf + m;
    /* importance: group-max logits of each cached query row over the candidates, softmax, mean over the rows */
    for (int64_t j = 0; j < n_cand; j++) u[j] = 0;
    for (int64_t i = 0; i < n_q; i++) {
        for (int g = 0; g < group; g++) {
            const float *qi = q + ((size_t)i * (size_t)group + (size_t)g) * (size_t)d;
            kvs_attn_scores(qi, keys, (size_t)d, idx, (size_t)n_cand, (size_t)d, scale, g == 0 ? logit : tmp);
            if (g > 0)
                for (int64_t j = 0; j < n_cand; j++)
                    if (tmp[j] > logit[j]) logit[j] = tmp[j];
        }
        kvs_softmax(logit, (size_t)n_cand);
        for (int64_t j = 0; j < n_cand; j++) u[j] += logit[j];
    }
    for (int64_t j = 0; j < n_cand; j++) uf[j] = n_q > 0 ? (float)(u[j] / (double)n_q) : 0.0f;
    kvs_maxpool1d(uf, (size_t)n_cand, (size_t)o->kernel, pooled);
    if (!red) {
        rkv_redundancy(keys, idx, m, d, o, col, scratch);
        red = col;
    }
    for (int64_t j = 0; j < n_cand; j++) {
        if (I) I[j] = (double)pooled[j];
        F[j] = o->lambda * (double)pooled[j] - (1.0 - o->lambda) * red[j];
    }
    if (R) memcpy(R, red, (size_t)m * sizeof(double));
}

void kvs_rkv_scores(const float *keys, const int32_t *idx, int64_t m, int64_t n_cand, const float *q, int64_t n_q,
                    int group, int d, float scale, const kvs_rkv_opts *o, double *F, double *I, double *R,
                    void *scratch) {
    rkv_scores(keys, idx, m, n_cand, q, n_q, group, d, scale, o, NULL, F, I, R, scratch);
}

/* ---- the policy --------------------------------------------------------------------------------------- */

static kvs_status reserve(rkv_state *s, int64_t n) {
    if (kvs_held_reserve(s->held, n) != KVS_OK) return kvs_fail(KVS_ERR_NOMEM, "rkv: out of memory");
    if (n <= s->cap) return KVS_OK;
    free(s->F);
    free(s->red);
    free(s->mark);
    free(s->top);
    free(s->work);
    s->F = malloc((size_t)n * sizeof(double));
    s->red = malloc((size_t)n * sizeof(double));
    s->mark = malloc((size_t)n);
    s->top = malloc((size_t)n * sizeof(int32_t));
    s->work = malloc(kvs_rkv_scratch_bytes(n));
    s->cap = s->F && s->red && s->mark && s->top && s->work ? n : 0;
    return s->cap ? KVS_OK : kvs_fail(KVS_ERR_NOMEM, "rkv: out of memory");
}

/* Appends the query rows q[0..n) ([n][group][d]) to the cache, keeping the last alpha. */
static void cache_queries(rkv_state *s, const float *q, int64_t n) {
    size_t row = (size_t)s->group * (size_t)s->d;
    if (s->alpha == 0) return;
    if (n > s->alpha) {
        q += (size_t)(n - s->alpha) * row;
        n = s->alpha;
    }
    int64_t drop = s->n_qc + n - s->alpha;
    if (drop > 0) {
        memmove(s->qc, s->qc + (size_t)drop * row, (size_t)(s->n_qc - drop) * row * sizeof(float));
        s->n_qc -= drop;
    }
    memcpy(s->qc + (size_t)s->n_qc * row, q, (size_t)n * row * sizeof(float));
    s->n_qc += n;
}

/* The redundancy of the m held keys into s->red, shared by the configurations of a task that hold the same keys at
 * the same position (kvs_policy_shared: at the first prompt's compression every budget below the prompt holds all
 * of it). The key: m, d, sim_thr, ref_quirks and the held positions; the view's rows are the memo's part. */
typedef struct {
    rkv_state *s;
    const float *keys;
    const int32_t *idx;
    int64_t m;
} rkv_red_job;

static kvs_status rkv_red_run(void *ctx, void *out) {
    const rkv_red_job *j = ctx;
    rkv_redundancy(j->keys, j->idx, j->m, j->s->d, &j->s->o, out, j->s->work);
    return KVS_OK;
}

static kvs_status redundancy_shared(rkv_state *s, const kvs_policy_view *view, const int32_t *idx, int64_t m) {
    rkv_red_job job = {.s = s, .keys = view->k, .idx = idx, .m = m};
    if (!view->memo) return rkv_red_run(&job, s->red);
    double h[4] = {(double)m, (double)s->d, s->o.sim_thr, (double)s->o.ref_quirks};
    size_t bytes = sizeof h + (size_t)m * sizeof(int32_t);
    unsigned char *key = malloc(bytes);
    if (!key) return rkv_red_run(&job, s->red); /* no memory for the key: computed, not shared */
    memcpy(key, h, sizeof h);
    memcpy(key + sizeof h, idx, (size_t)m * sizeof(int32_t));
    kvs_status st = kvs_policy_shared(view, "rkv.redundancy", key, bytes, s->red, (size_t)m * sizeof(double),
                                      rkv_red_run, &job);
    free(key);
    return st;
}

/* The keys compress() would score now (0 when it scores none: nothing above the target, or only the window kept). */
static int64_t compress_m(const rkv_state *s) {
    int64_t m = kvs_held_count(s->held);
    if (m <= s->target || s->target - s->alpha <= 0 || s->n_qc == 0) return 0;
    return m;
}

/* Cuts the resident set to the target: the window (last alpha) and the TOPK(F, T − alpha) candidates. */
static kvs_status compress(rkv_state *s, const kvs_policy_view *view) {
    int64_t m = kvs_held_count(s->held);
    s->event_m = 0;
    if (m <= s->target) return KVS_OK;
    int64_t n_cand = m - s->alpha, k = s->target - s->alpha;
    if (k <= 0 || s->n_qc == 0) { /* no room beside the window (or nothing to score with): the window */
        kvs_held_keep_top(s->held, 0, m - s->target, 0);
        return KVS_OK;
    }
    kvs_status st = reserve(s, m);
    if (st != KVS_OK) return st;
    const int32_t *idx = kvs_held_pos(s->held);
    if ((st = redundancy_shared(s, view, idx, m)) != KVS_OK) return st;
    rkv_scores(view->k, idx, m, n_cand, s->qc, s->n_qc, s->group, s->d, s->scale, &s->o, s->red, s->F, NULL, NULL,
               s->work);
    kvs_held_top_mask(s->F, n_cand, k, s->mark, s->top);
    memset(s->mark + n_cand, 1, (size_t)s->alpha);
    kvs_held_compact(s->held, s->mark);
    s->event_m = m;
    return KVS_OK;
}

static kvs_status rkv_prefill(void *state, const kvs_policy_view *view) {
    rkv_state *s = state;
    int64_t first = view->block_begin > view->turn_begin ? view->block_begin : view->turn_begin;
    if (first < s->win_first) first = s->win_first; /* evicted by the host before the prefill */
    int64_t n_new = view->n > first ? view->n - first : 0;
    kvs_status st = reserve(s, kvs_held_count(s->held) + n_new + 1);
    if (st != KVS_OK) return st;
    for (int64_t p = first; p < view->n; p++) kvs_held_push(s->held, (int32_t)p);
    /* the turn's last alpha prompt queries (rows q_first .. n-1 of the view) */
    cache_queries(s, view->q, view->n_q);
    return kvs_held_count(s->held) >= s->budget ? compress(s, view) : KVS_OK;
}

static kvs_status rkv_select(void *state, const kvs_policy_view *view, kvs_policy_sel *sel) {
    rkv_state *s = state;
    kvs_status st = reserve(s, kvs_held_count(s->held) + 1);
    if (st != KVS_OK) return st;
    kvs_held_push(s->held, (int32_t)(view->n - 1));
    cache_queries(s, view->q, 1);
    KVS_ASSERT(kvs_held_count(s->held) <= s->budget);
    sel->n[0] = kvs_held_copy(s->held, sel->idx[0]);
    /* attend-then-compress: the step that fills the cache to B cuts it to T after its attention, in observe() (after
     * the host's eviction on a sliding-window layer) */
    s->pending = 1;
    s->event_m = kvs_held_count(s->held) >= s->budget ? compress_m(s) : 0;
    return KVS_OK;
}

static kvs_status rkv_observe(void *state, const kvs_policy_view *view, const kvs_policy_sel *sel,
                              const float *const *probs) {
    rkv_state *s = state;
    (void)sel;
    (void)probs;
    if (!s->pending) return KVS_OK;
    s->pending = 0;
    s->event_m = 0;
    kvs_status st = kvs_held_count(s->held) >= s->budget ? compress(s, view) : KVS_OK;
    if (!s->charged) s->late_m += s->event_m; /* charged by the next account() */
    s->event_m = 0;
    return st;
}

static kvs_status rkv_window_evict(void *state, int64_t first) {
    rkv_state *s = state;
    if (first <= s->win_first) return KVS_OK;
    s->win_first = first;
    kvs_held_drop_before(s->held, (int32_t)first);
    return KVS_OK;
}

static void rkv_account(void *state, const kvs_policy_view *view, const kvs_policy_sel *sel, kvs_policy_cost *out) {
    rkv_state *s = state;
    (void)view;
    (void)sel;
    double qc = (double)s->alpha * (double)s->group * (double)s->d * (double)s->kv_bytes;
    out->aux_bytes += qc;
    /* the compression select() predicts (exact: nothing changes the cache before observe()), or once the window
     * slides the one the last observe() did (header "Sliding-window layers") */
    s->charged = s->win_first == 0;
    int64_t event = s->charged ? s->event_m : s->late_m;
    if (!s->charged) s->late_m = 0;
    if (event > 0) {
        double m = (double)event;
        out->transient_bytes += (m * m + (double)s->alpha * m) * (double)s->aux_bytes;
        out->read_aux_bytes += qc;
        out->read_aux_unfused_bytes += qc + m * (double)s->d * (double)s->kv_bytes;
    }
}

static int64_t rkv_stored(void *state, int g, int32_t *out) {
    (void)g;
    return kvs_held_copy(((rkv_state *)state)->held, out);
}

static kvs_status rkv_validate(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget) {
    (void)m;
    (void)budget;
    int64_t k = (int64_t)kvs_policy_param_get(cfg, "kernel");
    if (k % 2 == 0)
        return kvs_fail(KVS_ERR_INVALID_ARG, "policy rkv: parameter 'kernel' must be odd (same padding), got %lld",
                        (long long)k);
    return KVS_OK;
}

static int rkv_notes(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget, char *buf, size_t cap) {
    (void)m;
    int64_t alpha = (int64_t)kvs_policy_param_get(cfg, "window"), delta = (int64_t)kvs_policy_param_get(cfg, "buffer");
    int64_t a, dl;
    effective(budget, alpha, delta, &a, &dl);
    if (budget - dl <= a)
        return kvs_policy_note(buf, cap, "the budget leaves no candidate beside the window (window %lld, buffer "
                                         "%lld): a sliding window",
                               (long long)a, (long long)dl);
    if (a != alpha || dl != delta)
        return kvs_policy_note(buf, cap, "budget %lld <= window + buffer = %lld: window %lld and buffer %lld used",
                               (long long)budget, (long long)(alpha + delta), (long long)a, (long long)dl);
    return 0;
}

const struct kvs_policy_ops kvs_policy_rkv = {
    .version = KVS_POLICY_INTERFACE_VERSION,
    .name = "rkv",
    .summary = "R-KV: every Delta steps cut to B - Delta by window-query importance minus key redundancy (cosine); "
               "the last alpha kept",
    .is_oracle = 0,
    .granularity = KVS_SEL_PER_KV_HEAD,
    .budget_scope = KVS_BUDGET_EVERY_STEP,
    .params = rkv_params,
    .n_params = (int)(sizeof rkv_params / sizeof rkv_params[0]),
    .presets = rkv_presets,
    .n_presets = (int)(sizeof rkv_presets / sizeof rkv_presets[0]),
    .validate = rkv_validate,
    .notes = rkv_notes,
    .create = rkv_create,
    .free = rkv_free,
    .prefill = rkv_prefill,
    .select = rkv_select,
    .observe = rkv_observe,
    .stored = rkv_stored,
    .account = rkv_account,
    .window_evict = rkv_window_evict,
};
