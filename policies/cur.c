/* cur.c — CurDKV, value-guided KV compression by approximated CUR leverage scores (Sengupta, Chaudhary,
 * Chakraborty, NeurIPS 2025, arXiv 2509.15038), as specified in ../shared/POLICY_SPEC_2.md §2.7 [CUR]: the kvpress
 * CURPress reading ("Press based on CurDKV"), the only executable reference; the section is marked partial.
 *
 * Prefill (per KV head, over the candidates = what earlier turns kept + the turn's prompt, in cache order):
 *  1. optional sketch (proj_r = r > 0): K' = K·Γ, V' = V·Γ, Γ ∈ R^{d×r} with i.i.d. N(0, 1/r) entries;
 *  2. κ_j = ‖K'_j‖², ν_j = ‖V'_j‖² (squared row norms: length-squared CUR sampling weights);
 *  3. local normalisation (local_w > 0): consecutive windows of local_w candidates, the last one shorter (the
 *     reference zero-pads it, which changes no sum); κ_j /= Σ_{window(j)} κ, the same for ν;
 *  4. score_j = κ_j·ν_j (kv_product), (κ_j + ν_j)/2 (kv_avg), κ_j (key) or ν_j (value), divided by Σ_j score_j;
 *  5. score_j = 1 for the first `sinks` candidates;
 *  6. keep TOPK(score, B) (ties: the older position, POLICY_SPEC §1.4).
 * Decode: nothing is evicted (PROMPT-ONLY regime: the budget B bounds the retained prompt; every generated token
 * is kept, so the attended size is B_p + t and runs are compared at their measured memory, DESIGN.md).
 *
 * Decisions where §2.7 is partial or leaves a choice (facts of the abstract and kvpress only):
 *  - Leverage: ROWNORM (squared row norms of the keys and values, or of their sketch), as kvpress. The spec's
 *    [RECON] EXACT_RANK_k alternative (leverage of a rank-k SVD basis) is not offered: no reference fixes k, and
 *    an unverified variant would be a second guess presented under the paper's name.
 *  - The sketch is off by default (kvpress use_random_leverage = False) although the abstract mentions random
 *    projections; proj_r = 20 is kvpress's width when it is on (the `sketch` preset). kvpress draws an unseeded
 *    torch.randn; here Γ is a function of the layer only (PCG32 seeded from the FNV-1a hash of "cur-sketch" and
 *    the layer, Box-Muller), so the same Γ serves keys, values and every KV head of a layer, and runs repeat.
 *  - Head budgets: uniform B per KV head (the spec's ADAKV allocation is [UNVERIFIED] and not offered).
 *  - Periodic decode-time compression (kvpress DecodingPress, the spec's cur.mode = DECODE) is not offered: the
 *    paper evaluates prompt compression.
 *  - A zero window sum (all-zero rows) leaves its scores 0 instead of dividing by zero.
 *  - Multi-turn (§0.3 [SIM-CHOICE]): a later turn's prefill scores the retained context plus the new prompt in
 *    cache order with the same B, the first `sinks` cache entries forced.
 * GQA: per KV head, from its own keys and values; no queries are read (the method is attention-free).
 * Accounting: the default (the attended K/V = B_p + t slots); the scores are prefill temporaries only.
 * Sliding-window layers (sim/replay.h): the host's window_evict drops the held positions before the window's first
 * at once (prompt-only: no observe() needs the list aligned) and a prefill takes no candidate before it, so the
 * leverage scores, their local windows and their normalisation are over the candidates the window leaves, and
 * the forced `sinks` are the first cache entries as for a later turn (the window's oldest: the stream's first
 * tokens are gone with the window). CurDKV evicts only in prefill, after the window's evictions, so B >= the
 * window keeps all of it.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/kvs_math.h"
#include "../common/kvs_rng.h"
#include "cur_internal.h"
#include "held.h"
#include "registry.h"

static const kvs_policy_param cur_params[] = {
    {.key = "type", .type = KVS_PARAM_ENUM, .def = KVS_CUR_KV_PRODUCT, .choices = "kv_product|kv_avg|key|value",
     .help = "score: key leverage x value leverage (default), their mean, key only or value only"},
    {.key = "local_w", .type = KVS_PARAM_INT, .def = 16, .lo = 0, .hi = 1 << 20,
     .help = "leverages normalised within consecutive windows of this many tokens (kvpress local approximation; "
             "0 = off)"},
    {.key = "sinks", .type = KVS_PARAM_INT, .def = 4, .lo = 0, .hi = 1 << 20,
     .help = "first cache entries always kept"},
    {.key = "proj_r", .type = KVS_PARAM_INT, .def = 0, .lo = 0, .hi = 4096,
     .help = "Gaussian sketch width r (N(0,1/r) entries, seeded per layer); 0 = exact row norms (kvpress default)"},
};

static const kvs_policy_preset cur_presets[] = {
    {.name = "sketch", .params = "proj_r=20",
     .help = "kvpress CURPress with use_random_leverage=True (sketch width 20); budgets as the prompt-only runs"},
};

typedef struct {
    int64_t budget;
    int type, local_w, sinks, proj_r, d;
    kvs_held *held;   /* ascending retained positions */
    double *score;    /* [cap] candidate scores */
    double *nu;       /* [cap] value leverages */
    char *mark;       /* [cap] */
    int32_t *top;     /* [cap] */
    float *gamma;     /* [d][proj_r] sketch, NULL when proj_r = 0 */
    int64_t cap;
    int64_t win_first; /* positions before it were evicted by the host (sliding-window layer); 0 otherwise */
} cur_state;

static void cur_free(void *state) {
    cur_state *s = state;
    if (!s) return;
    kvs_held_free(s->held);
    free(s->score);
    free(s->nu);
    free(s->mark);
    free(s->top);
    free(s->gamma);
    free(s);
}

/* Γ of one layer: d x r entries N(0, 1/r), Box-Muller over PCG32 open-interval uniforms. */
static void make_gamma(float *g, int d, int r, int layer) {
    kvs_rng rng;
    char id[32];
    snprintf(id, sizeof id, "%d", layer);
    kvs_rng_seed(&rng, kvs_fnv1a64(kvs_fnv1a64(KVS_FNV1A64_BASIS, "cur-sketch"), id), 54u);
    double sd = 1.0 / sqrt((double)r);
    for (int i = 0; i < d * r; i += 2) {
        double u1 = kvs_rng_open01(&rng), u2 = kvs_rng_open01(&rng);
        double rad = sqrt(-2.0 * log(u1)), ang = 6.283185307179586 * u2;
        g[i] = (float)(sd * rad * cos(ang));
        if (i + 1 < d * r) g[i + 1] = (float)(sd * rad * sin(ang));
    }
}

static kvs_status cur_create(const kvs_policy_init *init, void **state) {
    cur_state *s = calloc(1, sizeof *s);
    if (!s) return kvs_fail(KVS_ERR_NOMEM, "cur: out of memory");
    s->budget = init->budget;
    s->type = (int)kvs_policy_param_get(init->cfg, "type");
    s->local_w = (int)kvs_policy_param_get(init->cfg, "local_w");
    s->sinks = (int)kvs_policy_param_get(init->cfg, "sinks");
    s->proj_r = (int)kvs_policy_param_get(init->cfg, "proj_r");
    s->d = init->model->head_dim;
    s->held = kvs_held_create(s->budget + 1);
    if (s->held && s->proj_r > 0) {
        s->gamma = malloc((size_t)s->d * (size_t)s->proj_r * sizeof(float));
        if (s->gamma) make_gamma(s->gamma, s->d, s->proj_r, init->layer);
    }
    if (!s->held || (s->proj_r > 0 && !s->gamma)) {
        cur_free(s);
        return kvs_fail(KVS_ERR_NOMEM, "cur: out of memory");
    }
    *state = s;
    return KVS_OK;
}

/* ‖x‖² of one row, or of its sketch x·Γ (gamma [d][r]), in fp64. */
static double row_energy(const float *x, int d, const float *gamma, int r) {
    double e = 0;
    if (!gamma) {
        for (int i = 0; i < d; i++) e += (double)x[i] * (double)x[i];
        return e;
    }
    for (int c = 0; c < r; c++) {
        double y = 0;
        for (int i = 0; i < d; i++) y += (double)x[i] * (double)gamma[(size_t)i * (size_t)r + (size_t)c];
        e += y * y;
    }
    return e;
}

static void local_normalise(double *x, int64_t n, int w) {
    if (w <= 0) return;
    for (int64_t a = 0; a < n; a += w) {
        int64_t b = a + w < n ? a + w : n;
        double sum = 0;
        for (int64_t j = a; j < b; j++) sum += x[j];
        if (sum > 0)
            for (int64_t j = a; j < b; j++) x[j] /= sum;
    }
}

void kvs_cur_scores(const float *keys, const float *values, const int32_t *idx, int64_t n, int d,
                    const kvs_cur_opts *o, double *score, double *nu) {
    for (int64_t j = 0; j < n; j++) {
        size_t row = (size_t)(idx ? idx[j] : j) * (size_t)d;
        score[j] = row_energy(keys + row, d, o->gamma, o->proj_r);
        nu[j] = row_energy(values + row, d, o->gamma, o->proj_r);
    }
    local_normalise(score, n, o->local_w);
    local_normalise(nu, n, o->local_w);
    double total = 0;
    for (int64_t j = 0; j < n; j++) {
        double k = score[j], v = nu[j];
        score[j] = o->type == KVS_CUR_KV_PRODUCT ? k * v : o->type == KVS_CUR_KV_AVG ? 0.5 * (k + v)
                   : o->type == KVS_CUR_KEY      ? k
                                                 : v;
        total += score[j];
    }
    if (total > 0)
        for (int64_t j = 0; j < n; j++) score[j] /= total;
    for (int64_t j = 0; j < n && j < o->sinks; j++) score[j] = 1.0;
}

static kvs_status cur_prefill(void *state, const kvs_policy_view *view) {
    cur_state *s = state;
    int64_t first = view->block_begin > view->turn_begin ? view->block_begin : view->turn_begin;
    if (first < s->win_first) first = s->win_first; /* evicted by the host before the prefill: no candidate */
    int64_t n_new = view->n > first ? view->n - first : 0, nc = kvs_held_count(s->held) + n_new;
    if (kvs_held_reserve(s->held, nc + 1) != KVS_OK) return kvs_fail(KVS_ERR_NOMEM, "cur: out of memory");
    for (int64_t j = 0; j < n_new; j++) kvs_held_push(s->held, (int32_t)(first + j));
    if (nc <= s->budget) return KVS_OK;
    if (nc > s->cap) {
        free(s->score);
        free(s->nu);
        free(s->mark);
        free(s->top);
        s->score = malloc((size_t)nc * sizeof(double));
        s->nu = malloc((size_t)nc * sizeof(double));
        s->mark = malloc((size_t)nc);
        s->top = malloc((size_t)nc * sizeof(int32_t));
        s->cap = s->score && s->nu && s->mark && s->top ? nc : 0;
        if (!s->cap) return kvs_fail(KVS_ERR_NOMEM, "cur: out of memory");
    }
    kvs_cur_opts o = {.type = s->type, .local_w = s->local_w, .sinks = s->sinks, .proj_r = s->proj_r,
                      .gamma = s->gamma};
    kvs_cur_scores(view->k, view->v, kvs_held_pos(s->held), nc, s->d, &o, s->score, s->nu);
    kvs_held_top_mask(s->score, nc, s->budget, s->mark, s->top);
    kvs_held_compact(s->held, s->mark);
    return KVS_OK;
}

static kvs_status cur_select(void *state, const kvs_policy_view *view, kvs_policy_sel *sel) {
    cur_state *s = state;
    if (kvs_held_reserve(s->held, kvs_held_count(s->held) + 1) != KVS_OK)
        return kvs_fail(KVS_ERR_NOMEM, "cur: out of memory");
    kvs_held_push(s->held, (int32_t)(view->n - 1)); /* generated tokens are never evicted */
    sel->n[0] = kvs_held_copy(s->held, sel->idx[0]);
    return KVS_OK;
}

/* The host's eviction (sim/replay.h "Sliding-window layers"): at once, and for the candidates of a later prefill. */
static kvs_status cur_window_evict(void *state, int64_t first) {
    cur_state *s = state;
    if (first <= s->win_first) return KVS_OK;
    s->win_first = first;
    kvs_held_drop_before(s->held, (int32_t)first);
    return KVS_OK;
}

static int64_t cur_stored(void *state, int g, int32_t *out) {
    (void)g;
    return kvs_held_copy(((cur_state *)state)->held, out);
}

static int cur_notes(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget, char *buf,
                     size_t cap) {
    (void)m;
    int64_t sinks = (int64_t)kvs_policy_param_get(cfg, "sinks");
    if (budget <= sinks)
        return kvs_policy_note(buf, cap, "the budget is at most sinks=%lld: only the first positions are kept, "
                                         "nothing is scored",
                               (long long)sinks);
    return 0;
}

const struct kvs_policy_ops kvs_policy_cur = {
    .version = KVS_POLICY_INTERFACE_VERSION,
    .name = "cur",
    .summary = "CurDKV (kvpress CURPress): prompt compressed by key x value leverage (squared row norms, locally "
               "normalised); attention-free; generated tokens all kept",
    .is_oracle = 0,
    .granularity = KVS_SEL_PER_KV_HEAD,
    .budget_scope = KVS_BUDGET_PROMPT,
    .params = cur_params,
    .n_params = (int)(sizeof cur_params / sizeof cur_params[0]),
    .presets = cur_presets,
    .n_presets = (int)(sizeof cur_presets / sizeof cur_presets[0]),
    .notes = cur_notes,
    .create = cur_create,
    .free = cur_free,
    .prefill = cur_prefill,
    .select = cur_select,
    .stored = cur_stored,
    .window_evict = cur_window_evict,
};
