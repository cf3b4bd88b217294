/* ea_decode.c — Expected Attention while decoding (kvpress DecodingPress around ExpectedAttentionPress), as
 * specified in ../shared/POLICY_SPEC_2.md §2.1 "Decode" in kvsim's FIXED regime (§0.3: interval 1): at every step
 * the current key is appended and, when more than B are resident, the resident keys are scored by policies/ea.c's
 * expected attention (kvs_ea_scores) and the lowest evicted down to B, before attending, so |S_t| = B once n >= B.
 *
 * The query statistics come from the last `qbuf` queries (pre-RoPE, at their own positions; prompt queries while
 * fewer decode steps exist; sinks excluded), the future positions start at the current one (a0 = p: the current
 * query is the first to read the cut cache), the current key is protected (kvsim's choice: no query attends
 * without its own key; the reference can evict it), and the first n_sink positions are kept. The prompt is cut the
 * same way at the end of each prefill (statistics from its last qbuf queries, a0 = its end). One set per KV head
 * (the group's softmaxes averaged); no Ada-KV pool while decoding (kvpress's DecodingPress scores per head), so eps
 * defaults to 0 (the class default).
 *
 * Sliding-window layers (sim/replay.h): the positions before the host's `first` (window_evict) leave the resident set
 * at once (it is ascending: its first entries), before the next cut, so a cut never spends an eviction on a position
 * the window drops anyway and a budget B >= W holds exactly the window (the resident set never exceeds B); a
 * prompt's cut takes no candidate before first, and sinks are the first n_sink positions that still exist. The query
 * buffer (the statistics' input) holds queries, not cache contents: unaffected.
 * Cost per step and KV head: the statistics G qbuf d^2 MACs, the scores G (B + 1)(d + d^2) (§2.1 "Traffic"); the
 * query buffer is AUX, G qbuf d elements at kv_bytes (§3). Not within 2x of H2O at d = 128: the method's own
 * cost, paid every step in this regime (kvpress pays it every `interval` steps, 512 by default).
 */
#include <stdlib.h>
#include <string.h>

#include "../common/kvs_math.h"
#include "../common/kvs_rope.h"
#include "../trace/trace.h"
#include "ea_internal.h"
#include "held.h"
#include "registry.h"

enum { P_NFUT, P_NSINK, P_COV, P_VNORM, P_EPS, P_QBUF, P_SCALING };

static const kvs_policy_param ead_params[] = {
    [P_NFUT] = {.key = "n_future", .type = KVS_PARAM_INT, .def = 512, .lo = 1, .hi = 1 << 30,
                .help = "T_f: future positions the query statistics are rotated over (R̄)"},
    [P_NSINK] = {.key = "n_sink", .type = KVS_PARAM_INT, .def = 4, .lo = 0, .hi = 1 << 24,
                 .help = "first positions always kept, not scored, not in the statistics"},
    [P_COV] = {.key = "use_cov", .type = KVS_PARAM_BOOL, .def = 1, .help = "include s^2/2 k^T Sigma k"},
    [P_VNORM] = {.key = "use_vnorm", .type = KVS_PARAM_BOOL, .def = 1, .help = "multiply by |v|"},
    [P_EPS] = {.key = "eps", .type = KVS_PARAM_DOUBLE, .def = 0, .lo = 0, .hi = 1e6,
               .help = "score = (a + eps) |v|"},
    [P_QBUF] = {.key = "qbuf", .type = KVS_PARAM_INT, .def = 256, .lo = 1, .hi = 1 << 24,
                .help = "queries buffered for the statistics (kvpress hidden_states_buffer_size)"},
    [P_SCALING] = {.key = "rope_scaling", .type = KVS_PARAM_ENUM, .def = 0, .choices = KVS_ROPE_SCALING_CHOICES,
                   .help = "RoPE frequency scaling the trace does not record: none; llama31; llama32; auto = none, "
                           "refused for a Llama-3 model name"},
};

typedef struct {
    kvs_policy_model m;
    kvs_ea_params p;
    int64_t budget, qbuf, cap;
    int d, G;
    double freq[KVS_TRACE_MAX_HEAD_DIM / 2];
    float *qhist;   /* [cap][G][d] queries by position (only the last qbuf are read) */
    int32_t *res, *tmp, *keep;
    double *score;
    int64_t n_res;
    int64_t first;  /* positions before it were evicted by the host (sliding-window layer); 0 otherwise */
} ead_state;

static kvs_status ead_validate(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget) {
    (void)budget;
    if (!(m->rope_theta > 0))
        return kvs_fail(KVS_ERR_INVALID_ARG,
                        "ea_decode: the trace records no RoPE theta: pre-RoPE queries cannot be recovered");
    if (m->head_dim % 2 || m->head_dim > KVS_TRACE_MAX_HEAD_DIM)
        return kvs_fail(KVS_ERR_INVALID_ARG, "ea_decode: head_dim %d is not an even size up to %d",
                        (int)m->head_dim, KVS_TRACE_MAX_HEAD_DIM);
    kvs_rope_scaling sc;
    return kvs_rope_scaling_of((kvs_rope_scaling_choice)cfg->v[P_SCALING], m->model_name, "ea_decode", &sc);
}

static void ead_free(void *state) {
    ead_state *s = state;
    if (!s) return;
    free(s->qhist), free(s->res), free(s->tmp), free(s->keep), free(s->score), free(s);
}

static kvs_status ead_create(const kvs_policy_init *init, void **state) {
    const kvs_policy_config *cfg = init->cfg;
    ead_state *s = calloc(1, sizeof *s);
    if (!s) return kvs_fail(KVS_ERR_NOMEM, "ea_decode: out of memory");
    s->m = *init->model;
    s->p = (kvs_ea_params){.n_future = (int64_t)cfg->v[P_NFUT], .n_sink = (int64_t)cfg->v[P_NSINK],
                           .use_cov = cfg->v[P_COV] != 0, .use_vnorm = cfg->v[P_VNORM] != 0, .eps = cfg->v[P_EPS]};
    s->budget = init->budget, s->qbuf = (int64_t)cfg->v[P_QBUF];
    s->d = init->model->head_dim, s->G = init->model->group;
    s->cap = init->model->n_positions + 1;
    kvs_rope_scaling sc;
    kvs_status st = kvs_rope_scaling_of((kvs_rope_scaling_choice)cfg->v[P_SCALING], init->model->model_name,
                                        "ea_decode", &sc);
    if (st != KVS_OK) {
        free(s);
        return st;
    }
    kvs_rope_freqs(init->model->rope_theta, s->d, &sc, s->freq);
    s->qhist = malloc((size_t)s->cap * (size_t)s->G * (size_t)s->d * sizeof *s->qhist);
    s->res = malloc((size_t)s->cap * sizeof *s->res);
    s->tmp = malloc((size_t)s->cap * sizeof *s->tmp);
    s->keep = malloc((size_t)s->cap * sizeof *s->keep);
    s->score = malloc((size_t)s->cap * sizeof *s->score);
    if (!s->qhist || !s->res || !s->tmp || !s->keep || !s->score) {
        ead_free(s);
        return kvs_fail(KVS_ERR_NOMEM, "ea_decode: out of memory");
    }
    *state = s;
    return KVS_OK;
}

/* Cut the resident set to the budget: the entries at index >= n_protect_from (the current key) are kept, the others
 * scored (statistics from the last qbuf queries up to position `last`, future from a0) and the best kept. */
static kvs_status cut(ead_state *s, const kvs_policy_view *v, int64_t last, int64_t a0, int protect_last) {
    if (s->n_res <= s->budget) return KVS_OK;
    int64_t first = last + 1 - s->qbuf;
    if (first < 0) first = 0;
    size_t row = (size_t)s->G * (size_t)s->d;
    int64_t nc = s->n_res - (protect_last ? 1 : 0), keep = s->budget - (protect_last ? 1 : 0);
    kvs_status st = kvs_ea_scores(&s->p, s->freq, s->m.rope_layout, v->scale, s->G, s->d, s->qhist + (size_t)first * row,
                                  first, last + 1 - first, a0, v->k, v->v, s->res, nc, s->score);
    if (st != KVS_OK) return st;
    kvs_topk_f64(s->score, (size_t)nc, (size_t)keep, s->keep); /* ties: the older position */
    kvs_sort_positions(s->keep, (size_t)keep);
    for (int64_t i = 0; i < keep; i++) s->tmp[i] = s->res[s->keep[i]];
    if (protect_last) s->tmp[keep++] = s->res[s->n_res - 1];
    memcpy(s->res, s->tmp, (size_t)keep * sizeof *s->res);
    s->n_res = keep;
    return KVS_OK;
}

static kvs_status ead_prefill(void *state, const kvs_policy_view *v) {
    ead_state *s = state;
    size_t row = (size_t)s->G * (size_t)s->d;
    memcpy(s->qhist + (size_t)v->q_first * row, v->q, (size_t)v->n_q * row * sizeof *s->qhist);
    for (int64_t j = v->turn_begin > s->first ? v->turn_begin : s->first; j < v->n; j++) s->res[s->n_res++] = (int32_t)j;
    return cut(s, v, v->q_first + v->n_q - 1, v->n, 0);
}

static kvs_status ead_select(void *state, const kvs_policy_view *v, kvs_policy_sel *sel) {
    ead_state *s = state;
    int64_t p = v->n - 1;
    size_t row = (size_t)s->G * (size_t)s->d;
    memcpy(s->qhist + (size_t)p * row, v->q, row * sizeof *s->qhist);
    s->res[s->n_res++] = (int32_t)p;
    kvs_status st = cut(s, v, p, p, 1);
    if (st != KVS_OK) return st;
    memcpy(sel->idx[0], s->res, (size_t)s->n_res * sizeof *s->res);
    sel->n[0] = s->n_res;
    return KVS_OK;
}

static kvs_status ead_window_evict(void *state, int64_t first) {
    ead_state *s = state;
    if (first <= s->first) return KVS_OK;
    s->first = first;
    s->n_res = kvs_positions_drop_before(s->res, s->n_res, first);
    return KVS_OK;
}

static int64_t ead_stored(void *state, int g, int32_t *out) {
    ead_state *s = state;
    (void)g;
    memcpy(out, s->res, (size_t)s->n_res * sizeof *out);
    return s->n_res;
}

/* The query buffer is AUX (G qbuf d at kv_bytes); scoring re-reads the resident keys and values (fused with the
 * attention read: d per key, plus d per value for |v|). */
static void ead_account(void *state, const kvs_policy_view *v, const kvs_policy_sel *sel, kvs_policy_cost *out) {
    ead_state *s = state;
    (void)sel;
    double held = (double)(v->n < s->qbuf ? v->n : s->qbuf);
    out->aux_bytes = (double)s->m.kv_bytes * (double)s->G * held * (double)s->d;
    out->read_aux_bytes = (double)s->m.kv_bytes * (double)s->n_res * (double)s->d; /* the values' norms */
    out->read_aux_unfused_bytes = out->read_aux_bytes + (double)s->m.kv_bytes * (double)s->n_res * (double)s->d;
    out->write_bytes += (double)s->m.kv_bytes * (double)s->G * (double)s->d; /* the query into the buffer */
}

const struct kvs_policy_ops kvs_policy_ea_decode = {
    .version = KVS_POLICY_INTERFACE_VERSION,
    .name = "ea_decode",
    .summary = "Expected Attention while decoding: at every step the resident keys are scored by the expected "
               "attention of the next T_f queries (statistics of the last qbuf queries) times |v|; evict-then-attend",
    .is_oracle = 0,
    .granularity = KVS_SEL_PER_KV_HEAD,
    .budget_scope = KVS_BUDGET_EVERY_STEP,
    .params = ead_params,
    .n_params = (int)(sizeof ead_params / sizeof ead_params[0]),
    .validate = ead_validate,
    .create = ead_create,
    .free = ead_free,
    .prefill = ead_prefill,
    .select = ead_select,
    .stored = ead_stored,
    .account = ead_account,
    .window_evict = ead_window_evict,
};
