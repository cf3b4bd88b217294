/* qfilters.c — Q-Filters (Godey et al., arXiv 2503.02812; authors' code NathanGodey/qfilters make_filters.py and
 * QFiltersCache.update), as specified in ../shared/POLICY_SPEC_2.md §2.8 (and §1.4 calibration traces).
 *
 * Per query head, the dominant direction of the post-RoPE queries (first right-singular vector v1 of the uncentred
 * calibration query matrix, here the top eigenvector of Q^T Q by Jacobi) signed so that most queries project
 * positively, f_h = -eps * v1; the KV head's filter is the mean over its group, and a key's score is -<k, f>
 * (post-RoPE k). DECODE mode (the authors', the default): evict-then-attend on every append; when the resident set
 * exceeds B, keep the newest `window` positions and the TOPK(score, B - window) of the others, so |S_t| = B once
 * n >= B (FIXED regime). kvpress's PREFILL mode (prompt top-k, no window, generated tokens all kept) is not offered:
 * a policy has one budget scope, and the spec's default is the authors' DECODE; `window=0` gives kvpress's
 * selection rule applied at every step (preset no-window).
 *
 * Calibration (`calib`): a calibration TRACE of the same model (checked: model_name, layers, heads, head_dim,
 * rope_theta, layout, attn_scale), every position of it (Δ-REF 4: all rows, not a 3000-row subsample), loaded once
 * in the allocation pass; or the keyword `self`: the replayed trace's own FIRST-TURN PROMPT queries — a labelled
 * deviation from the paper, which calibrates offline and input-agnostically; its decode queries are never used
 * (that would leak the future), and every run says so in its notes. A self filter depends on the prompt's queries
 * only: computed once per (layer, KV head) and shared by every configuration of a replay (kvs_policy_shared). `self` is the default only so that a run
 * without a calibration trace is possible; the paper's setting is a calibration trace.
 *
 * Decisions: ties in TOPK keep the older position (POLICY_SPEC §1.4); scores are cached per resident key (d MACs
 * per new key, spec's "Storage"), the filter is AUX (d x aux_bytes per KV head) and the cached scores B x aux_bytes;
 * the window is min(window, B); a later turn's prefill runs the same rule over the resident set plus the new
 * prompt. A filter whose group members cancel (|f| small) is reported by nothing here beyond the score itself.
 * Sliding-window layers (sim/replay.h): the host's window_evict drops the resident positions before the window's
 * first at once, with their cached scores (evict-then-attend: no observe() needs them aligned), and a prefill
 * appends none before it. The next append's cut then ranks only the window's positions, so Q-Filters never spends
 * its own eviction on a position the window drops, and B >= the window holds all of it. The filters are the
 * model's (or the calibration's), not the window's: they are unchanged.
 */
#include "qfilters_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../common/kvs_math.h"
#include "../common/kvs_rope.h"
#include "../sim/policy_memo.h"
#include "../trace/trace.h"
#include "registry.h"

enum { P_WINDOW, P_CALIB };

static const kvs_policy_param qf_params[] = {
    [P_WINDOW] = {.key = "window", .type = KVS_PARAM_INT, .def = 64, .lo = 0, .hi = 1 << 24,
                  .help = "newest positions always kept (DECODE mode; capped at B)"},
    [P_CALIB] = {.key = "calib", .type = KVS_PARAM_FILE, .choices = "self", .def_str = "self",
                 .help = "calibration trace of the same model (its post-RoPE queries give the filters); self = this "
                         "trace's first prompt (labelled deviation)"},
};

static const kvs_policy_preset qf_presets[] = {
    {.name = "qfilters-demo", .params = "window=64",
     .help = "Q-Filters README demo (QFiltersCache window_length 64, max_length 128: run at budget 128)"},
    {.name = "no-window", .params = "window=0",
     .help = "kvpress QFilterPress's selection (top-k by the filter score, no recent window), applied at every step"},
};

kvs_status kvs_qfilters_head_filter(const float *q, int64_t n, int64_t stride, int d, double *f, double *sigma1) {
    double *A = calloc((size_t)d * (size_t)d, sizeof *A), *V = malloc((size_t)d * (size_t)d * sizeof *V),
           *w = malloc((size_t)d * sizeof *w);
    if (!A || !V || !w) {
        free(A), free(V), free(w);
        return kvs_fail(KVS_ERR_NOMEM, "qfilters: out of memory");
    }
    for (int64_t i = 0; i < n; i++) {
        const float *x = q + i * stride;
        for (int a = 0; a < d; a++)
            for (int b = 0; b < d; b++) A[a * d + b] += (double)x[a] * (double)x[b];
    }
    kvs_status st = kvs_sym_eig(A, d, w, V);
    if (st == KVS_OK) {
        int64_t pos = 0;
        for (int64_t i = 0; i < n; i++) {
            double dot = 0;
            for (int a = 0; a < d; a++) dot += (double)q[i * stride + a] * V[a * d];
            pos += dot > 0;
        }
        double eps = 2 * pos > n ? 1.0 : -1.0; /* exactly half counts as -1 (REF) */
        for (int a = 0; a < d; a++) f[a] = -eps * V[a * d];
        if (sigma1) *sigma1 = sqrt(fmax(w[0], 0.0));
    }
    free(A), free(V), free(w);
    return st;
}

/* ---- allocation pass: one filter per (layer, KV head), shared by every instance ------------------------------ */

typedef struct {
    int L, Hkv, G, d;
    int self;
    float *filters; /* [L][Hkv][d] */
} qf_alloc;

static kvs_status group_filter(const float *q, int64_t n, int64_t stride, int G, int d, float *out) {
    double f[KVS_TRACE_MAX_HEAD_DIM], acc[KVS_TRACE_MAX_HEAD_DIM] = {0};
    for (int g = 0; g < G; g++) {
        kvs_status st = kvs_qfilters_head_filter(q + (size_t)g * d, n, stride, d, f, NULL);
        if (st != KVS_OK) return st;
        for (int a = 0; a < d; a++) acc[a] += f[a] / G;
    }
    for (int a = 0; a < d; a++) out[a] = (float)acc[a];
    return KVS_OK;
}

/* §1.4: a calibration trace must be of the replayed model (model_name, shapes, RoPE, softmax scale). */
static kvs_status check_model(const char *path, const kvs_model_config *c, const kvs_policy_model *m) {
    if (c->n_layers != m->n_layers || c->n_heads != m->n_heads || c->n_kv_heads != m->n_kv_heads ||
        c->head_dim != m->head_dim || c->rope_theta != m->rope_theta || c->rope_layout != m->rope_layout ||
        c->attn_scale != m->scale || strcmp(c->model_name, m->model_name))
        return kvs_fail(KVS_ERR_INVALID_ARG,
                        "qfilters: calibration trace %s is of another model (%s, %d layers, %d/%d heads, head_dim %d) "
                        "than the replayed one (%s, %d layers, %d/%d heads, head_dim %d) or differs in RoPE or scale",
                        path, c->model_name, c->n_layers, c->n_heads, c->n_kv_heads, c->head_dim, m->model_name,
                        m->n_layers, m->n_heads, m->n_kv_heads, m->head_dim);
    return KVS_OK;
}

static kvs_status qf_validate(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget) {
    (void)budget;
    const char *path = cfg->str[P_CALIB];
    if (!path[0] || !strcmp(path, "self")) return KVS_OK;
    kvs_trace *t = NULL;
    kvs_status st = kvs_trace_open(path, &t);
    if (st != KVS_OK) return kvs_fail(KVS_ERR_INVALID_ARG, "qfilters: calibration trace %s: %s", path, kvs_last_error());
    st = check_model(path, &kvs_trace_info_get(t)->model, m);
    kvs_trace_close(t);
    return st;
}

static kvs_status load_calibration(qf_alloc *a, const char *path, const kvs_policy_model *m) {
    kvs_trace *t = NULL;
    kvs_status st = kvs_trace_open(path, &t);
    if (st != KVS_OK) return st;
    const kvs_trace_info *info = kvs_trace_info_get(t);
    if ((st = check_model(path, &info->model, m)) != KVS_OK) {
        kvs_trace_close(t);
        return st;
    }
    int64_t N = info->n_positions;
    size_t row = (size_t)a->G * (size_t)a->d;
    float *q = malloc((size_t)N * row * sizeof *q);
    if (!q) {
        kvs_trace_close(t);
        return kvs_fail(KVS_ERR_NOMEM, "qfilters: out of memory");
    }
    for (int l = 0; l < a->L && st == KVS_OK; l++)
        for (int h = 0; h < a->Hkv && st == KVS_OK; h++) {
            kvs_trace_stream *s = NULL;
            if ((st = kvs_trace_stream_open(t, l, h, &s)) != KVS_OK) break;
            kvs_trace_stream_qkv_only(s);
            const kvs_trace_block *b;
            int64_t got = 0;
            while ((st = kvs_trace_stream_next(s, &b)) == KVS_OK) {
                memcpy(q + (size_t)got * row, b->q, (size_t)b->n_pos * row * sizeof *q);
                got += b->n_pos;
            }
            kvs_trace_stream_free(s);
            if (st != KVS_ERR_END) break;
            st = group_filter(q, got, (int64_t)row, a->G, a->d, a->filters + ((size_t)l * a->Hkv + h) * a->d);
        }
    free(q);
    kvs_trace_close(t);
    return st;
}

static kvs_status qf_alloc_begin(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget,
                                 void **alloc) {
    (void)budget;
    *alloc = NULL;
    qf_alloc *a = calloc(1, sizeof *a);
    if (!a) return kvs_fail(KVS_ERR_NOMEM, "qfilters: out of memory");
    a->L = m->n_layers, a->Hkv = m->n_kv_heads, a->G = m->group, a->d = m->head_dim;
    const char *path = cfg->str[P_CALIB];
    a->self = !path[0] || !strcmp(path, "self");
    a->filters = calloc((size_t)a->L * (size_t)a->Hkv * (size_t)a->d, sizeof *a->filters);
    kvs_status st = a->filters ? KVS_OK : kvs_fail(KVS_ERR_NOMEM, "qfilters: out of memory");
    if (st == KVS_OK && !a->self) st = load_calibration(a, path, m);
    if (st != KVS_OK) {
        free(a->filters);
        free(a);
        return st;
    }
    *alloc = a;
    return KVS_OK;
}

/* calib=self: the first turn's prompt queries of this (layer, KV head), never a decode query. The filter depends
 * on those rows only (no parameter enters it): every configuration of a replay shares it (kvs_policy_shared). */
typedef struct {
    const kvs_policy_view *v;
} qf_self;

static kvs_status qf_self_filter(void *ctx, void *out) {
    const kvs_policy_view *v = ((const qf_self *)ctx)->v;
    return group_filter(v->q, v->n_q, (int64_t)v->group * v->head_dim, v->group, v->head_dim, out);
}

static kvs_status qf_alloc_prefill(void *alloc, int layer, int kv_head, const kvs_policy_view *v) {
    qf_alloc *a = alloc;
    if (!a->self) return KVS_OK;
    if (v->group != a->G || v->head_dim != a->d)
        return kvs_fail(KVS_ERR_STATE, "qfilters: allocation view of %d x %d, the model has %d x %d", v->group,
                        v->head_dim, a->G, a->d);
    qf_self ctx = {.v = v};
    int32_t key = 1; /* the filter's recipe: group_filter of the view's queries, nothing else */
    return kvs_policy_shared(v, "qfilters.self_filter", &key, sizeof key,
                             a->filters + ((size_t)layer * a->Hkv + kv_head) * a->d, (size_t)a->d * sizeof(float),
                             qf_self_filter, &ctx);
}

static kvs_status qf_alloc_end(void *alloc, int64_t *budgets) {
    (void)alloc;
    (void)budgets; /* every (layer, KV head) keeps the nominal budget the engine filled in */
    return KVS_OK;
}

static void qf_alloc_free(void *alloc) {
    qf_alloc *a = alloc;
    if (a) free(a->filters);
    free(a);
}

static const void *qf_alloc_shared(void *alloc) { return alloc; }

/* ---- instance ------------------------------------------------------------------------------------------------ */

typedef struct {
    kvs_policy_model model;
    int64_t budget, window;
    int d;
    float f[KVS_TRACE_MAX_HEAD_DIM];
    int32_t *res;  /* resident positions, ascending */
    float *score;  /* cached -<k, f> of each resident position */
    int64_t n_res, cap;
    int32_t *tmp_i;
    float *tmp_f;
    int64_t win_first; /* positions before it were evicted by the host (sliding-window layer); 0 otherwise */
} qf_state;

static kvs_status qf_create(const kvs_policy_init *init, void **state) {
    const qf_alloc *a = init->shared;
    if (!a) return kvs_fail(KVS_ERR_STATE, "qfilters: no filters (the allocation pass failed)");
    qf_state *s = calloc(1, sizeof *s);
    if (!s) return kvs_fail(KVS_ERR_NOMEM, "qfilters: out of memory");
    s->model = *init->model;
    s->budget = init->budget;
    s->window = (int64_t)init->cfg->v[P_WINDOW] < s->budget ? (int64_t)init->cfg->v[P_WINDOW] : s->budget;
    s->d = init->model->head_dim;
    memcpy(s->f, a->filters + ((size_t)init->layer * a->Hkv + init->kv_head) * a->d, (size_t)s->d * sizeof(float));
    s->cap = init->model->n_positions + 1;
    s->res = malloc((size_t)s->cap * sizeof *s->res);
    s->score = malloc((size_t)s->cap * sizeof *s->score);
    s->tmp_i = malloc((size_t)s->cap * sizeof *s->tmp_i);
    s->tmp_f = malloc((size_t)s->cap * sizeof *s->tmp_f);
    if (!s->res || !s->score || !s->tmp_i || !s->tmp_f) {
        free(s->res), free(s->score), free(s->tmp_i), free(s->tmp_f), free(s);
        return kvs_fail(KVS_ERR_NOMEM, "qfilters: out of memory");
    }
    *state = s;
    return KVS_OK;
}

static void qf_free(void *state) {
    qf_state *s = state;
    if (!s) return;
    free(s->res), free(s->score), free(s->tmp_i), free(s->tmp_f), free(s);
}

static void append(qf_state *s, const kvs_policy_view *v, int64_t p) {
    double acc = 0;
    const float *k = v->k + (size_t)p * (size_t)s->d;
    for (int a = 0; a < s->d; a++) acc -= (double)k[a] * (double)s->f[a];
    s->res[s->n_res] = (int32_t)p;
    s->score[s->n_res++] = (float)acc;
}

/* Cut the resident set to `keep`: the newest `win` positions and the TOPK(score, keep - win) of the others (ties:
 * the older position, kvs_topk's lower index), re-sorted by position. */
static void cut(qf_state *s, int64_t keep, int64_t win) {
    if (s->n_res <= keep) return;
    if (win > keep) win = keep;
    int64_t old = s->n_res - win, k = keep - win;
    kvs_topk_sorted(s->score, (size_t)old, (size_t)k, s->tmp_i);
    int64_t m = 0;
    for (int64_t i = 0; i < k; i++) {
        s->tmp_f[m] = s->score[s->tmp_i[i]];
        s->tmp_i[m++] = s->res[s->tmp_i[i]];
    }
    for (int64_t i = old; i < s->n_res; i++) {
        s->tmp_f[m] = s->score[i];
        s->tmp_i[m++] = s->res[i];
    }
    memcpy(s->res, s->tmp_i, (size_t)m * sizeof *s->res);
    memcpy(s->score, s->tmp_f, (size_t)m * sizeof *s->score);
    s->n_res = m;
}

static kvs_status qf_prefill(void *state, const kvs_policy_view *v) {
    qf_state *s = state;
    for (int64_t p = v->turn_begin > s->win_first ? v->turn_begin : s->win_first; p < v->n; p++) append(s, v, p);
    cut(s, s->budget, s->window);
    return KVS_OK;
}

static kvs_status qf_select(void *state, const kvs_policy_view *v, kvs_policy_sel *sel) {
    qf_state *s = state;
    append(s, v, v->n - 1);
    cut(s, s->budget, s->window > 0 ? s->window : 1); /* the current key always stays */
    memcpy(sel->idx[0], s->res, (size_t)s->n_res * sizeof *s->res);
    sel->n[0] = s->n_res;
    return KVS_OK;
}

/* The host's eviction (sim/replay.h "Sliding-window layers"): the resident positions before `first` and their
 * cached scores leave at once (both ascending by position: a prefix). */
static kvs_status qf_window_evict(void *state, int64_t first) {
    qf_state *s = state;
    if (first <= s->win_first) return KVS_OK;
    s->win_first = first;
    int64_t j = 0;
    while (j < s->n_res && s->res[j] < first) j++;
    memmove(s->res, s->res + j, (size_t)(s->n_res - j) * sizeof *s->res);
    memmove(s->score, s->score + j, (size_t)(s->n_res - j) * sizeof *s->score);
    s->n_res -= j;
    return KVS_OK;
}

static int64_t qf_stored(void *state, int g, int32_t *out) {
    qf_state *s = state;
    (void)g;
    memcpy(out, s->res, (size_t)s->n_res * sizeof *out);
    return s->n_res;
}

/* Default KV accounting (the resident set) plus the filter and the cached scores (AUX), and the new key's score
 * (d MACs, its K read fused with attention: d elements at kv_bytes). */
static void qf_account(void *state, const kvs_policy_view *v, const kvs_policy_sel *sel, kvs_policy_cost *out) {
    qf_state *s = state;
    (void)v;
    (void)sel;
    out->aux_bytes = (double)s->model.aux_bytes * ((double)s->d + (double)s->n_res);
    out->write_bytes += (double)s->model.aux_bytes; /* the new key's cached score */
}

static int qf_notes(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget, char *buf, size_t cap) {
    (void)m;
    int n = 0;
    const char *path = cfg->str[P_CALIB];
    if (!path[0] || !strcmp(path, "self"))
        n += kvs_policy_note(buf, cap, "qfilters calib=self: filters from this trace's own prompt queries, a labelled "
                                       "deviation from the paper's offline calibration (give calib=TRACE)");
    if (cfg->v[P_WINDOW] >= (double)budget)
        n += kvs_policy_note(buf, cap, "qfilters window %g >= budget %lld: a sliding window, the filters choose nothing",
                             cfg->v[P_WINDOW], (long long)budget);
    return n;
}

const struct kvs_policy_ops kvs_policy_qfilters = {
    .version = KVS_POLICY_INTERFACE_VERSION,
    .name = "qfilters",
    .summary = "Q-Filters: keep the keys best aligned with each head's dominant query direction (filters from a "
               "calibration trace), plus a recent window; evict-then-attend",
    .is_oracle = 0,
    .granularity = KVS_SEL_PER_KV_HEAD,
    .budget_scope = KVS_BUDGET_EVERY_STEP,
    .params = qf_params,
    .n_params = (int)(sizeof qf_params / sizeof qf_params[0]),
    .presets = qf_presets,
    .n_presets = (int)(sizeof qf_presets / sizeof qf_presets[0]),
    .validate = qf_validate,
    .notes = qf_notes,
    .create = qf_create,
    .free = qf_free,
    .prefill = qf_prefill,
    .select = qf_select,
    .stored = qf_stored,
    .window_evict = qf_window_evict,
    .account = qf_account,
    .alloc_begin = qf_alloc_begin,
    .alloc_prefill = qf_alloc_prefill,
    .alloc_end = qf_alloc_end,
    .alloc_free = qf_alloc_free,
    .alloc_shared = qf_alloc_shared,
    .alloc_concurrent = 1,
};
