/* cake.c — CAKE, Cascading and Adaptive KV cache Eviction with layer preferences (Qin et al., ICLR 2025,
 * arXiv 2503.12491), as specified in ../shared/POLICY_SPEC_2.md §2.2 (the authors' code antgroup/cakekv read by the
 * spec: cake/cake_cache.py, cake/utils.py adjust_budgets, cake/model/modify_llama.py).
 *
 * Allocation pass (sim/policy.h alloc_*), once per (configuration, budget B) on the first turn's prompt (P):
 *   for every layer l, over its query heads h and window rows i (the last w prompt queries, causal) and the
 *   non-window columns j < P−w: dispersion H_l = −Σ A ln(A + 1e−10), shift V_l = Σ_j var_u,i A[i,j];
 *   preference P_l = H_l^(1/tau1) · V_l^(1/tau2); total T = L·(B − w); budgets b_l = ADJUST(P_l/ΣP · T) (cascade:
 *   the minimum over the stages l..L−1, each over layers 0..s with the same T: the stage-wise re-eviction keeps the
 *   top min(b, held) of stored scores, so a later stage cannot restore). Layer l's budget is B_l = b_l + w, the
 *   same for every KV head of the layer; Σ_l B_l = L·B (CK4).
 * Instance (one per layer and KV head):
 *   prefill: when P > B + w (the reference's trigger, sic: Δ-REF 1), keep the top b_l of the pooled group-mean
 *   indicator S[j] = mean_g AVGPOOL_5(mean_i A_g + gamma·var_u,i A_g) plus the window; else keep the whole prompt;
 *   decode (evict-then-attend, FIXED at B_l): append; if over B_l, the current query's softmax over the held set
 *   (current included), its non-window part pooled (AVGPOOL_5, position order) and averaged over the group, the top
 *   b_l kept plus the last w (which hold the current token).
 *
 * Decisions where the spec leaves room (POLICY_SPEC_2 appendix 1 and 8):
 *  - B <= w: the window is truncated to B (w_eff = min(w, B)); every layer gets B and the run is a sliding window of
 *    B (a note says so). With w = 1 the variance terms are 0 (one row has no unbiased variance).
 *  - ADJUST with no layer below its cap (stage 0 of G-CAKE): the excess is dropped (the layer holds cap). Its single
 *    pass (the reference's) may push a layer that received excess above cap: that layer keeps the whole prompt and
 *    grows during decode up to its B_l.
 *  - Later turns: the prefill rule re-runs on the held set plus the new prompt (window = the new prompt's last
 *    min(w_eff, its length) positions) whenever that exceeds B_l; the budgets stay the first turn's.
 *  - decode_score = CURRENT (REF) only and pooling in position order (§1.6); the spec's WINDOW score and the
 *    reference's cache-order pooling are not offered.
 *  - τ defaults 1.0/1.0 (the code's fallback); the presets carry model2tau.json's values, keyed by model and the
 *    nearest tabulated budget (1024 or 128): pick the one matching the traced model.
 * Sliding-window layers (sim/replay.h): the host's window_evict drops the held positions before the window's first
 * at once (CAKE has no observe(): nothing needs the list aligned with a past selection), and a prefill takes no
 * candidate before it; the reference's trigger P > B + w and the window w then apply to the candidates the window
 * leaves. Decode is evict-then-attend, so the window's evictions always come before CAKE's own: with B_l at least
 * the window the layer never scores and holds exactly the window. The allocation keeps its rule (preferences from
 * the whole first prompt, the total L·(B − w)); a windowed layer whose B_l exceeds its window leaves the rest unused
 * (its shift and dispersion are measured over the full causal rows the pass sees, not over the window).
 * Storage: KV of the held set (2d·B_l); AUX the layer preference (one scalar per layer, /Hkv per KV head). Traffic:
 * the attended K/V plus, on an evicting step, the scoring read of the one key attention does not read (fused), or of
 * all held keys (unfused). The prefill peak of the cascade is not reported by the replay (it counts decode steps).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../common/kvs_math.h"
#include "cake_internal.h"
#include "registry.h"

static const kvs_policy_param cake_params[] = {
    {.key = "window", .type = KVS_PARAM_INT, .def = 32, .lo = 1, .hi = 1 << 20,
     .help = "observation window w: the last w prompt queries score the prefix; the w newest tokens are kept"},
    {.key = "tau1", .type = KVS_PARAM_DOUBLE, .def = 1.0, .lo = 0.01, .hi = 100.0,
     .help = "preference exponent 1/tau1 on the dispersion (entropy) term"},
    {.key = "tau2", .type = KVS_PARAM_DOUBLE, .def = 1.0, .lo = 0.01, .hi = 100.0,
     .help = "preference exponent 1/tau2 on the shift (variance) term"},
    {.key = "gamma", .type = KVS_PARAM_DOUBLE, .def = 200.0, .lo = 0.0, .hi = 1e9,
     .help = "weight of the attention variance in the eviction indicator"},
    {.key = "kernel", .type = KVS_PARAM_INT, .def = 5, .lo = 1, .hi = 4095,
     .help = "average-pooling kernel on the indicator (odd; zero padding, divisor = kernel)"},
    {.key = "cascade", .type = KVS_PARAM_BOOL, .def = 1, .lo = 0, .hi = 1,
     .help = "cascading allocation (stage-wise re-eviction, nested sets); 0 = one-shot over all layers"},
};

/* antgroup/cakekv experiments/LongBench/config/model2tau.json via POLICY_SPEC_2 §2.2 (tau1, tau2 per model at the
 * tabulated budgets 1024 and 128). */
static const kvs_policy_preset cake_presets[] = {
    {.name = "llama3.1-8b-1024", .params = "tau1=1.6,tau2=0.4", .help = "CAKE model2tau.json, Llama-3.1-8B, B=1024"},
    {.name = "llama3.1-8b-128", .params = "tau1=1.6,tau2=0.6", .help = "CAKE model2tau.json, Llama-3.1-8B, B=128"},
    {.name = "llama2-7b-1024", .params = "tau1=1.9,tau2=1.8", .help = "CAKE model2tau.json, Llama-2-7B-chat, B=1024"},
    {.name = "llama2-7b-128", .params = "tau1=0.9,tau2=2.3", .help = "CAKE model2tau.json, Llama-2-7B-chat, B=128"},
    {.name = "llama2-13b-1024", .params = "tau1=0.5,tau2=0.4", .help = "CAKE model2tau.json, Llama-2-13B-chat, B=1024"},
    {.name = "llama2-13b-128", .params = "tau1=1.8,tau2=2", .help = "CAKE model2tau.json, Llama-2-13B-chat, B=128"},
    {.name = "mistral-7b-1024", .params = "tau1=0.8,tau2=0.5", .help = "CAKE model2tau.json, Mistral-7B-v0.3, B=1024"},
    {.name = "mistral-7b-128", .params = "tau1=1,tau2=0.8", .help = "CAKE model2tau.json, Mistral-7B-v0.3, B=128"},
    {.name = "qwen2.5-7b-1024", .params = "tau1=1.5,tau2=0.6", .help = "CAKE model2tau.json, Qwen2.5-7B-Instruct, B=1024"},
    {.name = "qwen2.5-7b-128", .params = "tau1=0.4,tau2=0.6", .help = "CAKE model2tau.json, Qwen2.5-7B-Instruct, B=128"},
};

/* ---- the pure parts (cake_internal.h) ------------------------------------------------------------- */

void kvs_cake_head_stats(const double *z, int64_t w, int64_t m, double gamma, double *H, double *V, double *ind,
                         double *prob) {
    int64_t nw = m - w; /* non-window columns */
    for (int64_t i = 0; i < w; i++) {
        int64_t len = nw + i + 1; /* row i sees candidates 0..m−w+i */
        double *p = prob + i * m;
        memcpy(p, z + i * m, (size_t)len * sizeof *p);
        kvs_softmax_f64(p, (size_t)len);
    }
    double h = 0, v = 0;
    for (int64_t j = 0; j < nw; j++) {
        double mean = 0;
        for (int64_t i = 0; i < w; i++) {
            double a = prob[i * m + j];
            mean += a;
            h -= a * log(a + 1e-10);
        }
        mean /= (double)w;
        double var = 0;
        if (w > 1) {
            for (int64_t i = 0; i < w; i++) {
                double dv = prob[i * m + j] - mean;
                var += dv * dv;
            }
            var /= (double)(w - 1);
        }
        v += var;
        ind[j] = mean + gamma * var;
    }
    *H += h;
    *V += v;
}

/* Spread `amount` over the layers eligible at entry (sign +1: below cap; −1: above 1) equally, the remainder one
 * each to the first ones (layer order); sign −1 takes instead of gives. A layer changes only at its own turn, so
 * testing it there is testing it at entry. */
static void cake_spread(int64_t *b, int L, int64_t amount, int sign, int64_t cap) {
    int64_t n = 0;
    for (int l = 0; l < L; l++) n += sign > 0 ? b[l] < cap : b[l] > 1;
    if (n == 0 || amount <= 0) return;
    int64_t each = amount / n, rest = amount % n;
    for (int l = 0; l < L; l++)
        if (sign > 0 ? b[l] < cap : b[l] > 1) {
            int64_t add = each + (rest > 0 ? 1 : 0);
            if (rest > 0) rest--;
            b[l] += sign * add;
        }
}

void kvs_cake_adjust(const double *raw, int L, int64_t T, int64_t cap, int64_t *out) {
    int64_t excess = 0, sum = 0;
    for (int l = 0; l < L; l++) {
        out[l] = (int64_t)raw[l]; /* toward zero, as Python's int() */
        if (out[l] > cap) {
            excess += out[l] - cap;
            out[l] = cap;
        }
    }
    cake_spread(out, L, excess, 1, cap); /* no layer below cap: the excess is dropped */
    for (int l = 0; l < L; l++) sum += out[l];
    int64_t diff = T - sum;
    if (diff > 0) cake_spread(out, L, diff, 1, cap);
    else if (diff < 0) cake_spread(out, L, -diff, -1, cap);
}

/* Stage budgets of layers 0..n−1 (n <= L) with the whole model's total T; raw: scratch [n]. */
static void cake_stage(const double *pref, int n, int64_t T, int64_t cap, double *raw, int64_t *out) {
    double tot = 0;
    for (int l = 0; l < n; l++) tot += pref[l];
    for (int l = 0; l < n; l++) raw[l] = tot > 0 ? pref[l] / tot * (double)T : (double)T / (double)n;
    kvs_cake_adjust(raw, n, T, cap, out);
}

kvs_status kvs_cake_budgets(const double *pref, int L, int64_t T, int64_t cap, int cascade, int64_t *out,
                            int64_t *stages) {
    size_t n = (size_t)(L > 0 ? L : 1);
    double *raw = malloc(n * sizeof *raw);
    int64_t *st = malloc(n * sizeof *st);
    if (!raw || !st) {
        free(raw);
        free(st);
        return kvs_fail(KVS_ERR_NOMEM, "cake: out of memory");
    }
    if (!cascade) cake_stage(pref, L, T, cap, raw, out);
    for (int s = 0; cascade && s < L; s++) {
        cake_stage(pref, s + 1, T, cap, raw, st);
        for (int l = 0; l <= s; l++) {
            if (stages) stages[(size_t)s * (size_t)L + (size_t)l] = st[l];
            out[l] = l == s || st[l] < out[l] ? st[l] : out[l];
        }
    }
    free(raw);
    free(st);
    return KVS_OK;
}

/* ---- allocation pass ----------------------------------------------------------------------------- */

typedef struct {
    int L, Hkv, G, d, cascade;
    int64_t B, w, wcfg, P;
    double tau1, tau2, gamma;
    float scale;
    double *H, *V; /* [L] */
    char *seen;    /* [L][Hkv] */
    double *z, *prob, *ind; /* scratch [w][P], [w][P], [P] */
} cake_alloc;

static int cake_compresses(int64_t P, int64_t B, int64_t wcfg) { return P > B + wcfg; }

static kvs_status cake_alloc_begin(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget,
                                   void **alloc) {
    cake_alloc *a = calloc(1, sizeof *a);
    if (!a) return kvs_fail(KVS_ERR_NOMEM, "cake: out of memory");
    a->L = m->n_layers;
    a->Hkv = m->n_kv_heads;
    a->G = m->group;
    a->d = m->head_dim;
    a->scale = m->scale;
    a->B = budget;
    a->wcfg = (int64_t)kvs_policy_param_get(cfg, "window");
    a->w = a->wcfg < budget ? a->wcfg : budget;
    a->tau1 = kvs_policy_param_get(cfg, "tau1");
    a->tau2 = kvs_policy_param_get(cfg, "tau2");
    a->gamma = kvs_policy_param_get(cfg, "gamma");
    a->cascade = kvs_policy_param_get(cfg, "cascade") != 0;
    a->P = -1;
    *alloc = a;
    return KVS_OK;
}

/* Window logits of query head g of a prefill view over candidates 0..P−1 into z ([w][P]; masked entries unset). */
static void cake_window_logits(const kvs_policy_view *v, const int32_t *cand, int64_t m, int64_t w, int g, int d,
                               float scale, double *z, float *tmp) {
    for (int64_t i = 0; i < w; i++) {
        int64_t pos = cand[m - w + i], len = m - w + i + 1;
        const float *q = v->q + ((size_t)(pos - v->q_first) * (size_t)v->group + (size_t)g) * (size_t)d;
        kvs_attn_scores(q, v->k, (size_t)d, cand, (size_t)len, (size_t)d, scale, tmp);
        for (int64_t j = 0; j < len; j++) z[i * m + j] = tmp[j];
    }
}

static kvs_status cake_alloc_prefill(void *alloc, int layer, int kv_head, const kvs_policy_view *prefill) {
    cake_alloc *a = alloc;
    if (layer < 0 || layer >= a->L || kv_head < 0 || kv_head >= a->Hkv)
        return kvs_fail(KVS_ERR_RANGE, "cake: allocation pass got (layer %d, kv head %d) of (%d, %d)", layer, kv_head,
                        a->L, a->Hkv);
    if (a->P < 0) {
        a->P = prefill->n;
        if (!cake_compresses(a->P, a->B, a->wcfg) || a->B <= a->w) return KVS_OK;
        size_t P = (size_t)a->P, w = (size_t)a->w;
        a->H = calloc((size_t)a->L, sizeof *a->H);
        a->V = calloc((size_t)a->L, sizeof *a->V);
        a->seen = calloc((size_t)a->L * (size_t)a->Hkv, 1);
        a->z = malloc(w * P * sizeof *a->z);
        a->prob = malloc(w * P * sizeof *a->prob);
        a->ind = malloc(P * sizeof *a->ind);
        if (!a->H || !a->V || !a->seen || !a->z || !a->prob || !a->ind) return kvs_fail(KVS_ERR_NOMEM, "cake: out of memory");
    } else if (prefill->n != a->P) {
        return kvs_fail(KVS_ERR_STATE, "cake: allocation pass prompt length %lld after %lld", (long long)prefill->n,
                        (long long)a->P);
    }
    if (!a->H) return KVS_OK;
    int32_t *cand = malloc((size_t)a->P * sizeof *cand);
    float *tmp = malloc((size_t)a->P * sizeof *tmp);
    if (!cand || !tmp) {
        free(cand);
        free(tmp);
        return kvs_fail(KVS_ERR_NOMEM, "cake: out of memory");
    }
    for (int64_t j = 0; j < a->P; j++) cand[j] = (int32_t)j;
    for (int g = 0; g < a->G; g++) {
        cake_window_logits(prefill, cand, a->P, a->w, g, a->d, a->scale, a->z, tmp);
        kvs_cake_head_stats(a->z, a->w, a->P, a->gamma, &a->H[layer], &a->V[layer], a->ind, a->prob);
    }
    a->seen[(size_t)layer * (size_t)a->Hkv + (size_t)kv_head] = 1;
    free(cand);
    free(tmp);
    return KVS_OK;
}

static kvs_status cake_alloc_end(void *alloc, int64_t *budgets) {
    cake_alloc *a = alloc;
    size_t cells = (size_t)a->L * (size_t)a->Hkv;
    for (size_t c = 0; c < cells; c++) budgets[c] = a->B;
    if (!a->H) return KVS_OK; /* no compression at prefill, or B <= w: every layer B */
    for (size_t c = 0; c < cells; c++)
        if (!a->seen[c]) return kvs_fail(KVS_ERR_STATE, "cake: allocation pass skipped cell %zu", c);
    double *pref = malloc((size_t)a->L * sizeof *pref);
    int64_t *b = malloc((size_t)a->L * sizeof *b);
    if (!pref || !b) {
        free(pref);
        free(b);
        return kvs_fail(KVS_ERR_NOMEM, "cake: out of memory");
    }
    for (int l = 0; l < a->L; l++) pref[l] = pow(a->H[l], 1.0 / a->tau1) * pow(a->V[l], 1.0 / a->tau2);
    kvs_status st = kvs_cake_budgets(pref, a->L, (int64_t)a->L * (a->B - a->w), a->P - a->w, a->cascade, b, NULL);
    for (int l = 0; st == KVS_OK && l < a->L; l++)
        for (int h = 0; h < a->Hkv; h++) budgets[(size_t)l * (size_t)a->Hkv + (size_t)h] = b[l] + a->w;
    free(pref);
    free(b);
    return st;
}

static void cake_alloc_free(void *alloc) {
    cake_alloc *a = alloc;
    if (!a) return;
    free(a->H);
    free(a->V);
    free(a->seen);
    free(a->z);
    free(a->prob);
    free(a->ind);
    free(a);
}

/* ---- instance ------------------------------------------------------------------------------------ */

typedef struct {
    int64_t budget, nominal, w, wcfg, kernel, Hkv;
    int G, d, aux_bytes, kv_bytes;
    double gamma;
    float scale;
    int32_t *pos; /* held positions, ascending */
    int64_t n, cap;
    int32_t *cand, *top;      /* [cap] */
    float *score, *pooled, *acc; /* [cap] */
    int64_t scored;           /* candidates scored at the last select (0: no eviction) */
    int64_t win_first;        /* positions before it were evicted by the host (sliding-window layer); 0 otherwise */
} cake_state;

static void cake_free(void *state) {
    cake_state *s = state;
    if (!s) return;
    free(s->pos);
    free(s->cand);
    free(s->top);
    free(s->score);
    free(s->pooled);
    free(s->acc);
    free(s);
}

static kvs_status cake_reserve(cake_state *s, int64_t need) {
    if (need <= s->cap) return KVS_OK;
    int64_t cap = s->cap * 2 > need ? s->cap * 2 : need;
    int32_t *pos = realloc(s->pos, (size_t)cap * sizeof *pos);
    if (pos) s->pos = pos;
    free(s->cand);
    free(s->top);
    free(s->score);
    free(s->pooled);
    free(s->acc);
    s->cand = malloc((size_t)cap * sizeof *s->cand);
    s->top = malloc((size_t)cap * sizeof *s->top);
    s->score = malloc((size_t)cap * sizeof *s->score);
    s->pooled = malloc((size_t)cap * sizeof *s->pooled);
    s->acc = malloc((size_t)cap * sizeof *s->acc);
    if (!pos || !s->cand || !s->top || !s->score || !s->pooled || !s->acc) {
        s->cap = 0;
        return kvs_fail(KVS_ERR_NOMEM, "cake: out of memory");
    }
    s->cap = cap;
    return KVS_OK;
}

static kvs_status cake_create(const kvs_policy_init *init, void **state) {
    cake_state *s = calloc(1, sizeof *s);
    if (!s) return kvs_fail(KVS_ERR_NOMEM, "cake: out of memory");
    s->budget = init->budget;
    s->nominal = init->budget_nominal;
    s->wcfg = (int64_t)kvs_policy_param_get(init->cfg, "window");
    s->w = s->wcfg < s->nominal ? s->wcfg : s->nominal;
    if (s->w > s->budget) s->w = s->budget;
    s->kernel = (int64_t)kvs_policy_param_get(init->cfg, "kernel");
    s->gamma = kvs_policy_param_get(init->cfg, "gamma");
    s->G = init->model->group;
    s->d = init->model->head_dim;
    s->Hkv = init->model->n_kv_heads;
    s->scale = init->model->scale;
    s->aux_bytes = init->model->aux_bytes;
    s->kv_bytes = init->model->kv_bytes;
    kvs_status st = cake_reserve(s, s->budget + 2);
    if (st != KVS_OK) {
        cake_free(s);
        return st;
    }
    *state = s;
    return KVS_OK;
}

/* Keep the top `b` of the candidates' first m−w (scores in s->acc) plus the last w, into s->pos ascending. */
static void cake_keep(cake_state *s, int64_t m, int64_t w, int64_t b) {
    int64_t nw = m - w, k = b < nw ? b : nw, n = 0;
    kvs_topk(s->acc, (size_t)nw, (size_t)k, s->top);
    kvs_sort_positions(s->top, (size_t)k);
    for (int64_t i = 0; i < k; i++) s->pos[n++] = s->cand[s->top[i]];
    for (int64_t j = nw; j < m; j++) s->pos[n++] = s->cand[j];
    s->n = n;
}

static kvs_status cake_prefill(void *state, const kvs_policy_view *view) {
    cake_state *s = state;
    int64_t begin = view->turn_begin > s->win_first ? view->turn_begin : s->win_first; /* no candidate before it */
    int64_t fresh = view->n > begin ? view->n - begin : 0, m = s->n + fresh;
    kvs_status rs = cake_reserve(s, m + 2);
    if (rs != KVS_OK) return rs;
    memcpy(s->cand, s->pos, (size_t)s->n * sizeof *s->cand);
    for (int64_t j = 0; j < fresh; j++) s->cand[s->n + j] = (int32_t)(begin + j);
    int64_t w = s->w < fresh ? s->w : fresh;
    int compress = view->turn == 0 ? cake_compresses(m, s->nominal, s->wcfg) : m > s->budget;
    if (!compress || m <= w) {
        memcpy(s->pos, s->cand, (size_t)m * sizeof *s->pos);
        s->n = m;
        return KVS_OK;
    }
    /* indicator per query head, pooled, averaged over the group (s->acc) */
    double *z = malloc((size_t)w * (size_t)m * sizeof *z), *prob = malloc((size_t)w * (size_t)m * sizeof *prob);
    double *ind = malloc((size_t)m * sizeof *ind);
    if (!z || !prob || !ind) {
        free(z);
        free(prob);
        free(ind);
        return kvs_fail(KVS_ERR_NOMEM, "cake: out of memory");
    }
    int64_t nw = m - w;
    for (int64_t j = 0; j < nw; j++) s->acc[j] = 0;
    for (int g = 0; g < s->G; g++) {
        double H = 0, V = 0;
        cake_window_logits(view, s->cand, m, w, g, s->d, s->scale, z, s->score);
        kvs_cake_head_stats(z, w, m, s->gamma, &H, &V, ind, prob);
        for (int64_t j = 0; j < nw; j++) s->score[j] = (float)ind[j];
        kvs_avgpool1d_pad(s->score, (size_t)nw, (size_t)s->kernel, s->pooled);
        for (int64_t j = 0; j < nw; j++) s->acc[j] += s->pooled[j];
    }
    for (int64_t j = 0; j < nw; j++) s->acc[j] /= (float)s->G;
    free(z);
    free(prob);
    free(ind);
    cake_keep(s, m, w, s->budget - w);
    return KVS_OK;
}

static kvs_status cake_select(void *state, const kvs_policy_view *view, kvs_policy_sel *sel) {
    cake_state *s = state;
    int64_t m = s->n + 1;
    kvs_status rs = cake_reserve(s, m + 2);
    if (rs != KVS_OK) return rs;
    memcpy(s->cand, s->pos, (size_t)s->n * sizeof *s->cand);
    s->cand[s->n] = (int32_t)(view->n - 1);
    s->scored = 0;
    if (m > s->budget) {
        /* the current query's attention over the held set, current included; non-window part pooled per head */
        int64_t nw = m - s->w;
        for (int64_t j = 0; j < nw; j++) s->acc[j] = 0;
        for (int g = 0; g < s->G; g++) {
            const float *q = view->q + (size_t)g * (size_t)s->d;
            kvs_attn_scores(q, view->k, (size_t)s->d, s->cand, (size_t)m, (size_t)s->d, s->scale, s->score);
            kvs_softmax(s->score, (size_t)m);
            kvs_avgpool1d_pad(s->score, (size_t)nw, (size_t)s->kernel, s->pooled);
            for (int64_t j = 0; j < nw; j++) s->acc[j] += s->pooled[j];
        }
        for (int64_t j = 0; j < nw; j++) s->acc[j] /= (float)s->G;
        cake_keep(s, m, s->w, s->budget - s->w);
        s->scored = m;
    } else {
        memcpy(s->pos, s->cand, (size_t)m * sizeof *s->pos);
        s->n = m;
    }
    memcpy(sel->idx[0], s->pos, (size_t)s->n * sizeof *s->pos);
    sel->n[0] = s->n;
    return KVS_OK;
}

/* The host's eviction (sim/replay.h "Sliding-window layers"): the held positions before `first` leave at once. */
static kvs_status cake_window_evict(void *state, int64_t first) {
    cake_state *s = state;
    if (first <= s->win_first) return KVS_OK;
    s->win_first = first;
    int64_t j = 0;
    while (j < s->n && s->pos[j] < first) j++;
    memmove(s->pos, s->pos + j, (size_t)(s->n - j) * sizeof *s->pos);
    s->n -= j;
    return KVS_OK;
}

static int64_t cake_stored(void *state, int g, int32_t *out) {
    cake_state *s = state;
    (void)g;
    memcpy(out, s->pos, (size_t)s->n * sizeof *out);
    return s->n;
}

static void cake_account(void *state, const kvs_policy_view *view, const kvs_policy_sel *sel, kvs_policy_cost *out) {
    cake_state *s = state;
    (void)view;
    (void)sel;
    out->aux_bytes = (double)s->aux_bytes / (double)s->Hkv; /* the layer's preference, shared by its KV heads */
    if (s->scored) {
        double key = (double)s->d * (double)s->kv_bytes;
        out->read_aux_bytes = key * (double)(s->scored - s->n);  /* the evicted key: scored, not attended */
        out->read_aux_unfused_bytes = key * (double)s->scored;  /* every held key re-read for scoring */
    }
}

static int cake_notes(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget, char *buf, size_t cap) {
    int64_t w = (int64_t)kvs_policy_param_get(cfg, "window");
    int n = 0;
    if (budget <= w)
        n += kvs_policy_note(buf, cap, "budget <= window=%lld: the window fills the budget, every layer keeps the "
                                       "newest tokens (a sliding window, no layer preference)",
                             (long long)w);
    else if (m->prompt_len > 0 && !cake_compresses(m->prompt_len, budget, w))
        n += kvs_policy_note(buf, cap, "prompt %lld <= budget + window=%lld: no prefill compression and no layer "
                                       "preference (every layer keeps the budget)",
                             (long long)m->prompt_len, (long long)w);
    return n;
}

static kvs_status cake_validate(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget) {
    (void)m;
    (void)budget;
    if ((int64_t)kvs_policy_param_get(cfg, "kernel") % 2 == 0)
        return kvs_fail(KVS_ERR_INVALID_ARG, "policy cake: kernel must be odd");
    return KVS_OK;
}

const struct kvs_policy_ops kvs_policy_cake = {
    .version = KVS_POLICY_INTERFACE_VERSION,
    .name = "cake",
    .summary = "CAKE: per-layer budgets from window attention dispersion x shift (cascade), mean+var indicator",
    .is_oracle = 0,
    .granularity = KVS_SEL_PER_KV_HEAD,
    .budget_scope = KVS_BUDGET_EVERY_STEP,
    .params = cake_params,
    .n_params = (int)(sizeof cake_params / sizeof cake_params[0]),
    .presets = cake_presets,
    .n_presets = (int)(sizeof cake_presets / sizeof cake_presets[0]),
    .validate = cake_validate,
    .notes = cake_notes,
    .create = cake_create,
    .free = cake_free,
    .prefill = cake_prefill,
    .select = cake_select,
    .stored = cake_stored,
    .window_evict = cake_window_evict,
    .account = cake_account,
    .alloc_begin = cake_alloc_begin,
    .alloc_prefill = cake_alloc_prefill,
    .alloc_end = cake_alloc_end,
    .alloc_free = cake_alloc_free,
};
