/* keys.c — key geometry against attention (KeyDiff's premises, POLICY_SPEC §5.5 K3, K11, K12); see keys.h. */
#include "keys.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "../common/kvs_math.h"
#include "../common/kvs_stats.h"
#include "../trace/kv_stream.h"
#include "../sim/replay.h"

kvs_status kvs_analysis_key_stats(const kvs_trace *t, int layer, int kv_head, kvs_keys_scope scope,
                                  kvs_key_stats *out) {
    if (!t || !out) return kvs_fail(KVS_ERR_INVALID_ARG, "key stats: NULL argument");
    const kvs_trace_info *info = kvs_trace_info_get(t);
    int64_t n = scope == KVS_KEYS_PROMPT ? info->turns[0].prompt_end : info->n_positions;
    if (n < 2)
        return kvs_fail(KVS_ERR_INVALID_ARG, "key stats: the %s has %lld position(s); at least 2 are needed",
                        scope == KVS_KEYS_PROMPT ? "first prompt" : "trace", (long long)n);
    kvs_kv_stream *s = NULL;
    kvs_status st = kvs_kv_stream_open(t, layer, kv_head, KVS_KV_STREAM_FULL_ATTN, &s);
    if (st != KVS_OK) return st;
    const int d = info->model.head_dim, G = info->model.n_heads / info->model.n_kv_heads;
    double *recv = calloc((size_t)n, sizeof *recv);          /* attention received, summed over queries */
    double *meancos = malloc((size_t)n * sizeof *meancos);   /* mean cos to the other keys */
    double *per_query = malloc((size_t)n * sizeof *per_query);
    double *unit_sum = calloc((size_t)d, sizeof *unit_sum), *qsum = calloc((size_t)d, sizeof *qsum),
           *ksum = calloc((size_t)d, sizeof *ksum);
    double *norm = malloc((size_t)n * sizeof *norm);
    if (!recv || !meancos || !per_query || !unit_sum || !qsum || !ksum || !norm) {
        st = kvs_fail(KVS_ERR_NOMEM, "key stats: out of memory");
        goto cleanup;
    }
    kvs_kv_pos p;
    const float *keys = NULL;
    for (int64_t pos = 0; pos < n; pos++) {
        if ((st = kvs_kv_stream_next(s, &p)) != KVS_OK) {
            if (st == KVS_ERR_END) st = kvs_fail(KVS_ERR_TRUNCATED, "key stats: the stream ended at %lld", (long long)pos);
            goto cleanup;
        }
        for (int g = 0; g < G; g++) {
            const float *row = p.probs + (size_t)g * (size_t)p.n_ctx;
            for (int64_t j = 0; j <= pos; j++) recv[j] += (double)row[j] / G;
            for (int c = 0; c < d; c++) qsum[c] += p.q[(size_t)g * (size_t)d + (size_t)c];
        }
        keys = p.k; /* the history never moves: rows 0..n-1 stay valid until the stream is freed */
    }
    /* Unit keys, their sum (for the mean cosine to the others: k̂_i·(Σ_j k̂_j − k̂_i) / (n − 1)) and the raw sum. */
    for (int64_t i = 0; i < n; i++) {
        const float *k = keys + (size_t)i * (size_t)d;
        norm[i] = kvs_l2(k, (size_t)d);
        for (int c = 0; c < d; c++) {
            ksum[c] += k[c];
            if (norm[i] > 0) unit_sum[c] += k[c] / norm[i];
        }
    }
    double mk_norm = 0, mq_norm = 0, mkmq = 0, norm_sum = 0, norm_sq = 0, cos_mk_sum = 0, min_cos = INFINITY;
    int64_t distinct = 0;
    for (int c = 0; c < d; c++) {
        mk_norm += ksum[c] * ksum[c];
        mq_norm += qsum[c] * qsum[c];
        mkmq += ksum[c] * qsum[c];
    }
    mk_norm = sqrt(mk_norm);
    mq_norm = sqrt(mq_norm);
    for (int64_t i = 0; i < n; i++) {
        const float *k = keys + (size_t)i * (size_t)d;
        double dot_unit = 0, dot_mk = 0;
        for (int c = 0; c < d; c++) {
            dot_unit += (norm[i] > 0 ? k[c] / norm[i] : 0.0) * unit_sum[c];
            dot_mk += k[c] * ksum[c];
        }
        double self = norm[i] > 0 ? 1.0 : 0.0; /* k̂_i·k̂_i */
        meancos[i] = (dot_unit - self) / (double)(n - 1);
        per_query[i] = recv[i] / (double)(n - i); /* queries i..n-1 saw key i */
        double c_mk = norm[i] > 0 && mk_norm > 0 ? dot_mk / (norm[i] * mk_norm) : 0.0;
        cos_mk_sum += c_mk;
        if (c_mk < min_cos) {
            min_cos = c_mk;
            distinct = i;
        }
        norm_sum += norm[i];
        norm_sq += norm[i] * norm[i];
    }
    *out = (kvs_key_stats){.layer = layer, .kv_head = kv_head, .n_keys = n};
    if ((st = kvs_spearman(meancos, recv, (size_t)n, &out->spearman_sum)) != KVS_OK) goto cleanup;
    if ((st = kvs_spearman(meancos, per_query, (size_t)n, &out->spearman_per_query)) != KVS_OK) goto cleanup;
    out->cos_meank_meanq = mk_norm > 0 && mq_norm > 0 ? mkmq / (mk_norm * mq_norm) : NAN;
    out->mean_cos_to_meank = cos_mk_sum / (double)n;
    double mean_norm = norm_sum / (double)n, var = norm_sq / (double)n - mean_norm * mean_norm;
    out->norm_cv = mean_norm > 0 ? sqrt(var > 0 ? var : 0) / mean_norm : NAN;
    int64_t below = 0;
    for (int64_t i = 0; i < n; i++) below += recv[i] < recv[distinct];
    out->distinct_key_pct = (double)below / (double)(n - 1);
cleanup:
    kvs_kv_stream_free(s);
    free(recv);
    free(meancos);
    free(per_query);
    free(unit_sum);
    free(qsum);
    free(ksum);
    free(norm);
    return st;
}

/* ---- K11: diversity of the keys a policy retains ---------------------------------------------------- */

typedef struct {
    int64_t at;      /* the first turn's last prompt position */
    int n_kv_heads, d;
    double eps;
    double *logdet;  /* [L * Hkv] */
    int64_t *count;  /* [L * Hkv] */
    int *done;       /* [L * Hkv] */
    kvs_status *st;  /* [L * Hkv]: the hook's outcome per slot (hooks of different layers run concurrently, and
                      * an error detail set on a worker thread is that thread's: the status is kept per slot) */
    atomic_int n_done;  /* slots measured so far, over every layer's worker */
    int n_slots;
    volatile int stop;  /* set once every slot is measured: the replay stops there (opts.cancel) */
} logdet_ctx;

/* logdet(K̂_Sᵀ K̂_S + eps·I_d) of the unit keys of positions idx[0..m-1]. */
static kvs_status unit_gram_logdet(const float *k, int d, const int32_t *idx, int64_t m, double eps, double *out) {
    double *A = calloc((size_t)d * (size_t)d, sizeof *A);
    if (!A) return kvs_fail(KVS_ERR_NOMEM, "retained logdet: out of memory");
    for (int64_t r = 0; r < m; r++) {
        const float *row = k + (size_t)idx[r] * (size_t)d;
        double nr = kvs_l2(row, (size_t)d);
        if (!(nr > 0)) continue; /* a zero key has no direction: it adds nothing */
        for (int a = 0; a < d; a++)
            for (int b = 0; b <= a; b++) A[(size_t)a * (size_t)d + (size_t)b] += (row[a] / nr) * (row[b] / nr);
    }
    for (int a = 0; a < d; a++) A[(size_t)a * (size_t)d + (size_t)a] += eps;
    kvs_status st = kvs_logdet_spd(A, (size_t)d, out);
    free(A);
    return st;
}

static void logdet_hook(void *user, int config, int layer, int kv_head, int64_t pos, void *state,
                        const struct kvs_policy_ops *ops, float *k, float *v, int64_t n) {
    (void)config;
    (void)v;
    logdet_ctx *c = user;
    size_t slot = (size_t)layer * (size_t)c->n_kv_heads + (size_t)kv_head;
    if (pos != c->at || c->done[slot]) return;
    c->done[slot] = 1;
    int32_t *idx = malloc((size_t)n * sizeof *idx);
    if (!idx) {
        c->st[slot] = KVS_ERR_NOMEM;
        return;
    }
    int64_t m = n;
    if (ops->stored) m = ops->stored(state, 0, idx);
    else
        for (int64_t j = 0; j < n; j++) idx[j] = (int32_t)j;
    c->count[slot] = m;
    c->st[slot] = unit_gram_logdet(k, c->d, idx, m, c->eps, &c->logdet[slot]);
    free(idx);
    if (atomic_fetch_add(&c->n_done, 1) + 1 == c->n_slots) c->stop = 1; /* nothing after the prompt is needed */
}

kvs_status kvs_analysis_retained_logdet(const kvs_trace *t, const kvs_policy_config *cfg, int64_t budget, double eps,
                                        double *logdet, int64_t *count) {
    if (!t || !cfg || !logdet || !count || !(eps > 0))
        return kvs_fail(KVS_ERR_INVALID_ARG, "retained logdet: NULL argument or eps <= 0");
    const kvs_trace_info *info = kvs_trace_info_get(t);
    const int L = info->model.n_layers, H = info->model.n_kv_heads;
    logdet_ctx c = {.at = info->turns[0].prompt_end - 1, .n_kv_heads = H, .d = info->model.head_dim, .eps = eps,
                    .logdet = logdet, .count = count, .n_slots = L * H};
    atomic_init(&c.n_done, 0);
    c.done = calloc((size_t)L * (size_t)H, sizeof *c.done);
    c.st = calloc((size_t)L * (size_t)H, sizeof *c.st);
    if (!c.done || !c.st) {
        free(c.done);
        free(c.st);
        return kvs_fail(KVS_ERR_NOMEM, "retained logdet: out of memory");
    }
    for (size_t i = 0; i < (size_t)L * (size_t)H; i++) logdet[i] = NAN, count[i] = 0;
    kvs_replay_source src;
    kvs_status st = kvs_replay_source_from_trace(t, &src);
    kvs_replay_config rc = {.policy = *cfg, .budget = budget, .budget_fraction = -1};
    kvs_replay_hooks hooks = {.user = &c, .on_step_end = logdet_hook};
    /* Every position is measured so that a prompt-only trace replays too; the metrics are not used. */
    kvs_replay_opts o = {.configs = &rc, .n_configs = 1, .measure = KVS_MEASURE_ALL, .hooks = &hooks, .cancel = &c.stop};
    kvs_replay_result *res = NULL;
    if (st == KVS_OK) st = kvs_replay_validate(&src, &o);
    if (st == KVS_OK) st = kvs_replay_execute(&src, &o, &res);
    /* Stopped by the hook once the prompt's end was measured everywhere: the rest of the trace is not needed. */
    int stopped_here = st == KVS_ERR_INTERRUPTED && atomic_load(&c.n_done) == c.n_slots;
    if (stopped_here) st = KVS_OK;
    if (st == KVS_OK && !stopped_here && res->runs[0].status != KVS_OK)
        st = kvs_fail(res->runs[0].status, "%s", res->runs[0].error);
    for (size_t i = 0; st == KVS_OK && i < (size_t)L * (size_t)H; i++) {
        if (!c.done[i]) st = kvs_fail(KVS_ERR_STATE, "retained logdet: the prompt's end was never reported");
        else if (c.st[i] != KVS_OK)
            st = kvs_fail(c.st[i], "retained logdet of layer %d, KV head %d: %s", (int)(i / (size_t)H),
                          (int)(i % (size_t)H), kvs_strerror(c.st[i]));
    }
    kvs_replay_result_free(res);
    free(c.done);
    free(c.st);
    return st;
}
