/* duo.c — DuoAttention (Xiao et al., arXiv 2410.10819) with the authors' trained gates, as specified in
 * ../shared/POLICY_SPEC_2.md §2.5 (the authors' code mit-han-lab/duo-attention: duo_attn/utils.py load_attn_pattern
 * and sparsify_attention_heads, the streaming cache of duo_attn/patch/static_kv_cache.py; kvpress DuoAttentionPress).
 *
 * The gates α (one per KV head) are trained parameters a trace cannot give: they come from `pattern`, the authors'
 * full_attention_heads.tsv for the traced model (L lines of Hkv values, clipped to [0, 1]; its SHA-256 is part of
 * the run's parameters). The floor(sparsity·L·Hkv + 0.5) KV heads with the lowest gates become streaming heads
 * (typing global over layers; ties to the lower (layer, head) flat index, kvpress's stable argsort, instead of the
 * authors' random noise), or with threshold >= 0 the heads with α < threshold. Retrieval heads keep every position;
 * streaming heads keep the first n_s (sinks) and the last n_r positions, in prefill (cut at its end to sinks + the
 * last n_r prompt positions) and decoding (evict-then-attend: append, drop the oldest non-sink above n_s + n_r,
 * attend, the current token in the recent window). All G query heads of a KV head share its type.
 * `duo_heuristic` (policies/duo_heuristic.c) runs the same instance with a pattern derived from the prompt, under a
 * name that says it is not the trained gates; this file holds the parts the two share (duo_internal.h).
 *
 * Decisions where the spec leaves room:
 *  - n_s = 64 (the authors' LongBench script; their pattern config.json says 128, kvpress 128: preset @kvpress);
 *    config.json's sink/recent sizes are not read (give n_s and n_r).
 *  - ref_plus_one = 1 reproduces the reference's n_s + n_r + 1 attended (cache plus the new token); default 0, kvsim's
 *    budget convention.
 *  - Rounding at a half: floor(x + 0.5).
 *  - sparsity = −1 maps the run's budget B to the retrieval fraction f = (B − (n_s+n_r))/(S − (n_s+n_r)) clipped to
 *    [0, 1], S = first prompt + the capture's max_new_tokens (known before decoding); otherwise the budget is not
 *    used (scope "none": retrieval heads grow with the sequence, so nothing bounds S_t).
 *  - Later turns: streaming heads are cut to sinks + the last n_r at the end of every prompt; the typing is the
 *    first turn's. The streaming heads' Λ-masked prefill attention is not modelled (decode metrics only).
 * Storage (honest): retrieval heads 2d·n, streaming heads 2d·min(n, n_s + n_r); AUX the head map, one bit per KV
 * head. Traffic = the attended K/V, no score reads.
 * Sliding-window layers (sim/replay.h): the positions before the host's `first` (window_evict) are gone from both
 * kinds of head at once (both are position rules: nothing to re-score). A retrieval head holds the window; a
 * streaming head's sinks before first are gone and their slots go to its recent window (as policies/streaming.c),
 * so it holds min(window, n_s + n_r) positions and n_s + n_r >= W holds exactly the window. The head typing is
 * unaffected: duo's gates come from the file, duo_heuristic's scores from its allocation pass over the first prompt
 * (a calibration input, computed as on a full-attention layer).
 */
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../common/kvs_math.h"
#include "duo_internal.h"
#include "registry.h"

/* ---- shared parts (duo_internal.h) ---------------------------------------------------------------- */

int kvs_duo_type(const double *score, int n, double sparsity, double threshold, char *streaming) {
    int n_str = 0;
    if (threshold >= 0) {
        for (int c = 0; c < n; c++) n_str += streaming[c] = score[c] < threshold;
        return n_str;
    }
    int want = (int)floor(sparsity * (double)n + 0.5);
    memset(streaming, 0, (size_t)n);
    /* the lowest score not yet streaming, ties to the lower index: n is L·Hkv (small), a selection loop suffices */
    for (; n_str < want; n_str++) {
        int best = -1;
        for (int c = 0; c < n; c++)
            if (!streaming[c] && (best < 0 || score[c] < score[best])) best = c;
        streaming[best] = 1;
    }
    return n_str;
}

kvs_status kvs_duo_read_pattern(const char *path, int L, int Hkv, double *gates) {
    char *text = NULL;
    size_t len = 0;
    kvs_status st = kvs_read_file(path, &text, &len);
    if (st != KVS_OK) return st;
    const char *p = text;
    int line = 0;
    st = KVS_OK;
    while (*p && st == KVS_OK) {
        const char *eol = strchr(p, '\n');
        const char *end = eol ? eol : p + strlen(p);
        const char *t = p;
        while (t < end && isspace((unsigned char)*t)) t++;
        if (t < end) { /* a non-blank line: one layer */
            if (line >= L) {
                st = kvs_fail(KVS_ERR_FORMAT, "duo pattern %s: more than the model's %d layers", path, L);
                break;
            }
            int col = 0;
            while (t < end) {
                char *stop;
                double x = strtod(t, &stop);
                if (stop == t || stop > end || !isfinite(x)) {
                    st = kvs_fail(KVS_ERR_FORMAT, "duo pattern %s line %d: not a number at column %d", path, line + 1,
                                  col + 1);
                    break;
                }
                if (col >= Hkv) {
                    st = kvs_fail(KVS_ERR_FORMAT, "duo pattern %s line %d: more than the model's %d KV heads", path,
                                  line + 1, Hkv);
                    break;
                }
                gates[(size_t)line * (size_t)Hkv + (size_t)col++] = x < 0 ? 0 : x > 1 ? 1 : x;
                t = stop;
                while (t < end && isspace((unsigned char)*t)) t++;
            }
            if (st == KVS_OK && col != Hkv)
                st = kvs_fail(KVS_ERR_FORMAT, "duo pattern %s line %d: %d values, the model has %d KV heads", path,
                              line + 1, col, Hkv);
            line++;
        }
        p = eol ? eol + 1 : end;
    }
    if (st == KVS_OK && line != L)
        st = kvs_fail(KVS_ERR_FORMAT, "duo pattern %s: %d layers, the model has %d", path, line, L);
    free(text);
    return st;
}

void kvs_duo_probe(const float *q, int nq, const float *k, const float *v, int64_t i, int d, float scale, int64_t n_s,
                   int64_t n_r, double *mass, double *err, float *scratch) {
    size_t n = (size_t)i + 1, D = (size_t)d;
    /* the streaming set: sinks [0, ns) and the recent window [lo, n), disjoint */
    int64_t ns = n_s < (int64_t)n ? n_s : (int64_t)n, lo = i - n_r + 1 > ns ? i - n_r + 1 : ns;
    enum { ROWS = 16 }; /* query rows per attention call (their probability rows' pointers live on the stack) */
    float *o = scratch, *os = o + (size_t)nq * D, *tmp = os + D, *probs = tmp + D;
    for (int r0 = 0; r0 < nq; r0 += ROWS) {
        int nr = nq - r0 < ROWS ? nq - r0 : ROWS;
        float *rows[ROWS];
        for (int r = 0; r < nr; r++) rows[r] = probs + (size_t)r * n;
        /* full attention of the rows over 0..i, each key and value row read once for all of them */
        kvs_attention_group(q + (size_t)r0 * D, (size_t)nr, k, v, D, NULL, n, D, scale, rows, o, NULL);
        for (int r = 0; r < nr; r++) {
            const float *p = rows[r], *of = o + (size_t)r * D;
            double z = 0, zs = 0;
            for (size_t j = 0; j < n; j++) z += p[j];
            for (int64_t j = 0; j < ns; j++) zs += p[j];
            for (size_t j = (size_t)lo; j < n; j++) zs += p[j];
            kvs_attn_output(p, v, D, NULL, (size_t)ns, D, os);
            kvs_attn_output(p + lo, v + (size_t)lo * D, D, NULL, n - (size_t)lo, D, tmp);
            double num = 0, den = 0;
            for (int t = 0; t < d; t++) { /* O_str renormalised over the set's own mass */
                double a = (double)of[t] / z, b = ((double)os[t] + (double)tmp[t]) / zs;
                num += (a - b) * (a - b);
                den += a * a;
            }
            *mass += 1.0 - zs / z;
            *err += den > 0 ? sqrt(num / den) : 0.0;
        }
    }
}

size_t kvs_duo_probe_scratch(int nq, int d, int64_t i) {
    int rows = nq < 16 ? nq : 16;
    return (size_t)(nq + 2) * (size_t)d + (size_t)rows * (size_t)(i + 1);
}

double kvs_duo_sparsity(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget) {
    double sp = kvs_policy_param_get(cfg, "sparsity");
    if (sp >= 0) return sp;
    double win = kvs_policy_param_get(cfg, "n_s") + kvs_policy_param_get(cfg, "n_r");
    double S = (double)kvs_policy_seq_len(m, m->prompt_len, kvs_policy_max_new(m, 0));
    double f = S > win ? ((double)budget - win) / (S - win) : 1.0;
    f = f < 0 ? 0 : f > 1 ? 1 : f;
    return 1.0 - f;
}

/* ---- the instance --------------------------------------------------------------------------------- */

typedef struct {
    int streaming, d;
    int64_t n_s, n_r, extra; /* extra = 1 with ref_plus_one: the new token attended on top of n_s + n_r */
    int64_t seen;            /* positions 0..seen−1 arrived */
    int64_t first;           /* positions before it were evicted by the host (sliding-window layer); 0 otherwise */
    double aux_bytes;
} duo_state;

kvs_status kvs_duo_create(const kvs_policy_init *init, void **state) {
    const kvs_duo_map *map = init->shared;
    if (!map || init->layer < 0 || init->layer >= map->L || init->kv_head < 0 || init->kv_head >= map->Hkv)
        return kvs_fail(KVS_ERR_STATE, "duo: no head map for (layer %d, kv head %d)", init->layer, init->kv_head);
    duo_state *s = calloc(1, sizeof *s);
    if (!s) return kvs_fail(KVS_ERR_NOMEM, "duo: out of memory");
    s->streaming = map->streaming[(size_t)init->layer * (size_t)map->Hkv + (size_t)init->kv_head];
    s->n_s = (int64_t)kvs_policy_param_get(init->cfg, "n_s");
    s->n_r = (int64_t)kvs_policy_param_get(init->cfg, "n_r");
    s->extra = kvs_policy_param_get(init->cfg, "ref_plus_one") != 0;
    s->aux_bytes = 1.0 / 8.0; /* the head map: one bit per KV head */
    *state = s;
    return KVS_OK;
}

void kvs_duo_free(void *state) { free(state); }

/* The streaming set of [0, n): sinks plus the last `recent` positions not among them; retrieval: everything. On a
 * sliding-window layer nothing before `first`: the sinks that left give their slots to the recent window. */
static int64_t duo_set(const duo_state *s, int64_t n, int64_t recent, int32_t *out) {
    int64_t m = 0, ns = s->streaming ? (s->n_s < n ? s->n_s : n) : n;
    for (int64_t j = s->first; j < ns; j++) out[m++] = (int32_t)j;
    if (!s->streaming) return m;
    if (s->first > 0) recent += s->n_s - (ns > s->first ? ns - s->first : 0);
    int64_t lo = n - recent < ns ? ns : n - recent;
    if (lo < s->first) lo = s->first;
    for (int64_t j = lo; j < n; j++) out[m++] = (int32_t)j;
    return m;
}

kvs_status kvs_duo_prefill(void *state, const kvs_policy_view *view) {
    duo_state *s = state;
    s->seen = view->n;
    return KVS_OK;
}

kvs_status kvs_duo_select(void *state, const kvs_policy_view *view, kvs_policy_sel *sel) {
    duo_state *s = state;
    s->seen = view->n;
    sel->n[0] = duo_set(s, view->n, s->n_r + s->extra, sel->idx[0]);
    return KVS_OK;
}

/* What the cache holds between steps: sinks + the last n_r (after prefill: of the prompt), or everything. */
int64_t kvs_duo_stored(void *state, int g, int32_t *out) {
    duo_state *s = state;
    (void)g;
    return duo_set(s, s->seen, s->n_r, out);
}

kvs_status kvs_duo_window_evict(void *state, int64_t first) {
    duo_state *s = state;
    if (first > s->first) s->first = first;
    return KVS_OK;
}

void kvs_duo_account(void *state, const kvs_policy_view *view, const kvs_policy_sel *sel, kvs_policy_cost *out) {
    duo_state *s = state;
    (void)view;
    (void)sel;
    out->aux_bytes = s->aux_bytes;
}

const void *kvs_duo_alloc_shared(void *alloc) { return alloc; }

void kvs_duo_alloc_free(void *alloc) {
    kvs_duo_map *m = alloc;
    if (!m) return;
    free(m->streaming);
    free(m);
}

/* ---- `duo`: the trained gates ------------------------------------------------------------------------ */

static const kvs_policy_param duo_params[] = {
    {.key = "pattern", .type = KVS_PARAM_FILE,
     .help = "the authors' full_attention_heads.tsv for the traced model (L lines x Hkv gates); required"},
    {.key = "sparsity", .type = KVS_PARAM_DOUBLE, .def = 0.5, .lo = -1.0, .hi = 1.0,
     .help = "fraction of KV heads made streaming (lowest gates); -1 = from the budget (mean B at prompt + max_new)"},
    {.key = "threshold", .type = KVS_PARAM_DOUBLE, .def = -1.0, .lo = -1.0, .hi = 1.0,
     .help = ">= 0: heads with gate < threshold are streaming (instead of sparsity); -1 = unset"},
    {.key = "n_s", .type = KVS_PARAM_INT, .def = 64, .lo = 0, .hi = 1 << 20, .help = "sink tokens of streaming heads"},
    {.key = "n_r", .type = KVS_PARAM_INT, .def = 256, .lo = 1, .hi = 1 << 24,
     .help = "recent window of streaming heads, current token included"},
    {.key = "ref_plus_one", .type = KVS_PARAM_BOOL, .def = 0, .lo = 0, .hi = 1,
     .help = "streaming heads attend n_s + n_r + 1 (the reference: cache plus the new token)"},
};

static const kvs_policy_preset duo_presets[] = {
    {.name = "longbench", .params = "sparsity=0.5,n_s=64,n_r=256",
     .help = "DuoAttention scripts/longbench.sh + pred.py: half the KV heads streaming, 64 sinks, 256 recent"},
    {.name = "kvpress", .params = "n_s=128,n_r=256",
     .help = "kvpress DuoAttentionPress and the pattern config.json: 128 sinks, 256 recent"},
};

typedef struct {
    kvs_duo_map map; /* first: kvs_duo_alloc_shared hands the allocation state itself */
} duo_alloc;

static kvs_status duo_validate(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget) {
    (void)budget;
    const char *path = kvs_policy_param_str(cfg, "pattern");
    if (!path[0])
        return kvs_fail(KVS_ERR_INVALID_ARG, "policy duo: pattern=FILE is required (the trained gates, e.g. the "
                                             "authors' full_attention_heads.tsv); duo_heuristic derives a labelled "
                                             "proxy pattern from the prompt instead");
    if (m->n_layers <= 0 || m->n_kv_heads <= 0) return KVS_OK; /* no model yet: the file is read at allocation */
    double *g = malloc((size_t)m->n_layers * (size_t)m->n_kv_heads * sizeof *g);
    if (!g) return kvs_fail(KVS_ERR_NOMEM, "duo: out of memory");
    kvs_status st = kvs_duo_read_pattern(path, m->n_layers, m->n_kv_heads, g);
    free(g);
    return st == KVS_OK ? KVS_OK : kvs_fail(KVS_ERR_INVALID_ARG, "policy duo: %s", kvs_last_error());
}

static kvs_status duo_alloc_begin(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget,
                                  void **alloc) {
    duo_alloc *a = calloc(1, sizeof *a);
    int n = m->n_layers * m->n_kv_heads;
    double *g = malloc((size_t)(n > 0 ? n : 1) * sizeof *g);
    if (a) a->map.streaming = calloc((size_t)(n > 0 ? n : 1), 1);
    if (!a || !g || !a->map.streaming) {
        free(g);
        kvs_duo_alloc_free(a);
        return kvs_fail(KVS_ERR_NOMEM, "duo: out of memory");
    }
    a->map.L = m->n_layers;
    a->map.Hkv = m->n_kv_heads;
    kvs_status st = kvs_duo_read_pattern(kvs_policy_param_str(cfg, "pattern"), m->n_layers, m->n_kv_heads, g);
    if (st == KVS_OK)
        a->map.n_streaming = kvs_duo_type(g, n, kvs_duo_sparsity(cfg, m, budget),
                                          kvs_policy_param_get(cfg, "threshold"), a->map.streaming);
    free(g);
    if (st != KVS_OK) {
        kvs_duo_alloc_free(a);
        return st;
    }
    *alloc = a;
    return KVS_OK;
}

static kvs_status duo_alloc_prefill(void *alloc, int layer, int kv_head, const kvs_policy_view *prefill) {
    (void)alloc;
    (void)layer;
    (void)kv_head;
    (void)prefill;
    return KVS_OK; /* the gates are the file's: the prompt plays no part */
}

static kvs_status duo_alloc_end(void *alloc, int64_t *budgets) {
    (void)alloc;
    (void)budgets; /* the engine's B everywhere: the budget bounds nothing (scope none) */
    return KVS_OK;
}

const struct kvs_policy_ops kvs_policy_duo = {
    .version = KVS_POLICY_INTERFACE_VERSION,
    .name = "duo",
    .summary = "DuoAttention: trained gates (pattern file) pick retrieval heads (full) vs streaming (sinks+recent)",
    .is_oracle = 0,
    .granularity = KVS_SEL_PER_KV_HEAD,
    .budget_scope = KVS_BUDGET_NONE,
    .params = duo_params,
    .n_params = (int)(sizeof duo_params / sizeof duo_params[0]),
    .presets = duo_presets,
    .n_presets = (int)(sizeof duo_presets / sizeof duo_presets[0]),
    .validate = duo_validate,
    .create = kvs_duo_create,
    .free = kvs_duo_free,
    .prefill = kvs_duo_prefill,
    .select = kvs_duo_select,
    .stored = kvs_duo_stored,
    .account = kvs_duo_account,
    .window_evict = kvs_duo_window_evict,
    .alloc_begin = duo_alloc_begin,
    .alloc_prefill = duo_alloc_prefill,
    .alloc_end = duo_alloc_end,
    .alloc_free = kvs_duo_alloc_free,
    .alloc_shared = kvs_duo_alloc_shared,
    .alloc_concurrent = 1,
};
