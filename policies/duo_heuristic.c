/* duo_heuristic.c — a HEURISTIC DuoAttention pattern, NOT the paper's trained gates: ../shared/POLICY_SPEC_2.md §2.5
 * (b). DuoAttention's gates are trained on synthetic passkey data against the model's own outputs, which a trace
 * cannot replay (policies/duo.c reads the authors' gates from a file). This entry derives a retrieval score ρ per KV
 * head from the evaluated trace's first prompt only (calib=self: what a real system holds at the end of prefill),
 * types the heads as duo.c does (the floor(sparsity·L·Hkv + 0.5) lowest ρ become streaming, ties to the lower flat
 * index) and runs duo.c's instance (retrieval heads keep everything, streaming heads n_s sinks + n_r recent).
 *
 * Scores, over the probe positions = the last min(probe, P − n_s − n_r) prompt positions and the G query heads of the
 * KV head (from the prompt's q/k/v of that head; the attention in fp32 on the shared SIMD routines, the sums in fp64;
 * computed once per (layer, KV head, n_s, n_r, probe count) and shared by every configuration of a replay through
 * the allocation pass's memo, sim/policy_memo.h kvs_policy_shared):
 *  - outerr (default; closest to the training objective): mean relative output error ‖O − O_str‖/‖O‖ of attending only
 *    {0..n_s−1} ∪ {i−n_r+1..i} instead of 0..i;
 *  - mass: mean attention mass that streaming set loses.
 * kvpress's ONTHEFLY score (pre-RoPE mean query/key, positional decay only) and a separate calibration trace are not
 * offered. A prompt of at most n_s + n_r positions has no probe: every ρ is 0 and the typing falls to flat-index order
 * (a note says so). Never report this as "DuoAttention" without its name.
 * Sliding-window layers: duo.c's "Sliding-window layers" (the instance is duo.c's). The probe scores are calibration
 * inputs and are unaffected: the allocation pass reads the first prompt of every layer as a full-attention one (it
 * is not told the window), so on a windowed layer ρ compares sinks + recent with attention over the whole prefix.
 */
#include <stdlib.h>
#include <string.h>

#include "../sim/policy_memo.h"
#include "duo_internal.h"
#include "registry.h"

enum { DUOH_OUTERR = 0, DUOH_MASS = 1 };

static const kvs_policy_param duoh_params[] = {
    {.key = "score", .type = KVS_PARAM_ENUM, .def = DUOH_OUTERR, .choices = "outerr|mass",
     .help = "retrieval score from the prompt: output error or lost attention mass of sinks + recent"},
    {.key = "sparsity", .type = KVS_PARAM_DOUBLE, .def = 0.5, .lo = -1.0, .hi = 1.0,
     .help = "fraction of KV heads made streaming (lowest scores); -1 = from the budget (mean B at prompt + max_new)"},
    {.key = "n_s", .type = KVS_PARAM_INT, .def = 64, .lo = 0, .hi = 1 << 20, .help = "sink tokens of streaming heads"},
    {.key = "n_r", .type = KVS_PARAM_INT, .def = 256, .lo = 1, .hi = 1 << 24,
     .help = "recent window of streaming heads, current token included"},
    {.key = "probe", .type = KVS_PARAM_INT, .def = 256, .lo = 1, .hi = 1 << 20,
     .help = "prompt positions (the last ones) scored per KV head"},
    {.key = "ref_plus_one", .type = KVS_PARAM_BOOL, .def = 0, .lo = 0, .hi = 1,
     .help = "streaming heads attend n_s + n_r + 1 (the reference: cache plus the new token)"},
};

typedef struct {
    kvs_duo_map map; /* first: kvs_duo_alloc_shared hands the allocation state itself */
    int G, d, score;
    int64_t n_s, n_r, probe;
    double sparsity, scale;
    double *rho;   /* [L·Hkv] */
    char *seen;    /* [L·Hkv] */
} duoh_alloc;

static void duoh_alloc_free(void *alloc) {
    duoh_alloc *a = alloc;
    if (!a) return;
    free(a->map.streaming);
    free(a->rho);
    free(a->seen);
    free(a);
}

static kvs_status duoh_alloc_begin(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget,
                                   void **alloc) {
    duoh_alloc *a = calloc(1, sizeof *a);
    size_t n = (size_t)(m->n_layers * m->n_kv_heads > 0 ? m->n_layers * m->n_kv_heads : 1);
    if (a) {
        a->map.streaming = calloc(n, 1);
        a->rho = calloc(n, sizeof *a->rho);
        a->seen = calloc(n, 1);
    }
    if (!a || !a->map.streaming || !a->rho || !a->seen) {
        duoh_alloc_free(a);
        return kvs_fail(KVS_ERR_NOMEM, "duo_heuristic: out of memory");
    }
    a->map.L = m->n_layers;
    a->map.Hkv = m->n_kv_heads;
    a->G = m->group;
    a->d = m->head_dim;
    a->scale = m->scale;
    a->score = (int)kvs_policy_param_get(cfg, "score");
    a->n_s = (int64_t)kvs_policy_param_get(cfg, "n_s");
    a->n_r = (int64_t)kvs_policy_param_get(cfg, "n_r");
    a->probe = (int64_t)kvs_policy_param_get(cfg, "probe");
    a->sparsity = kvs_duo_sparsity(cfg, m, budget);
    *alloc = a;
    return KVS_OK;
}

/* The probes of one (layer, KV head): the sums of the lost mass and of the output error over the last n_probe prompt
 * positions and the group's query rows. Budget-independent: every configuration with the same n_s, n_r and probe
 * count shares them (kvs_policy_shared), whatever its sparsity or score. */
typedef struct {
    const kvs_policy_view *v;
    int64_t n_s, n_r, n_probe;
    float scale;
} duoh_probes;

static kvs_status duoh_probe_sums(void *ctx, void *out) {
    const duoh_probes *c = ctx;
    const kvs_policy_view *v = c->v;
    int64_t P = v->n;
    float *scratch = malloc(kvs_duo_probe_scratch(v->group, v->head_dim, P - 1) * sizeof *scratch);
    if (!scratch) return kvs_fail(KVS_ERR_NOMEM, "duo_heuristic: out of memory");
    double sums[2] = {0, 0}; /* mass, err */
    for (int64_t i = P - c->n_probe; i < P; i++) {
        const float *q = v->q + (size_t)(i - v->q_first) * (size_t)v->group * (size_t)v->head_dim;
        kvs_duo_probe(q, v->group, v->k, v->v, i, v->head_dim, c->scale, c->n_s, c->n_r, &sums[0], &sums[1], scratch);
    }
    free(scratch);
    memcpy(out, sums, sizeof sums);
    return KVS_OK;
}

static kvs_status duoh_alloc_prefill(void *alloc, int layer, int kv_head, const kvs_policy_view *v) {
    duoh_alloc *a = alloc;
    if (layer < 0 || layer >= a->map.L || kv_head < 0 || kv_head >= a->map.Hkv)
        return kvs_fail(KVS_ERR_RANGE, "duo_heuristic: allocation pass got (layer %d, kv head %d) of (%d, %d)", layer,
                        kv_head, a->map.L, a->map.Hkv);
    size_t c = (size_t)layer * (size_t)a->map.Hkv + (size_t)kv_head;
    a->seen[c] = 1;
    int64_t P = v->n, n_probe = P - a->n_s - a->n_r;
    if (n_probe > a->probe) n_probe = a->probe;
    if (n_probe <= 0) return KVS_OK; /* no probe: ρ = 0 */
    duoh_probes ctx = {.v = v, .n_s = a->n_s, .n_r = a->n_r, .n_probe = n_probe, .scale = (float)a->scale};
    int64_t key[4] = {a->n_s, a->n_r, n_probe, 0};
    memcpy(&key[3], &ctx.scale, sizeof ctx.scale); /* the upper bytes stay 0 */
    double sums[2];
    kvs_status st = kvs_policy_shared(v, "duo_heuristic.probes", key, sizeof key, sums, sizeof sums, duoh_probe_sums,
                                      &ctx);
    if (st != KVS_OK) return st;
    a->rho[c] = (a->score == DUOH_MASS ? sums[0] : sums[1]) / (double)(n_probe * a->G);
    return KVS_OK;
}

static kvs_status duoh_alloc_end(void *alloc, int64_t *budgets) {
    duoh_alloc *a = alloc;
    (void)budgets; /* the engine's B everywhere: the budget bounds nothing (scope none) */
    int n = a->map.L * a->map.Hkv, seen = 0;
    for (int c = 0; c < n; c++) seen += a->seen[c];
    if (seen != 0 && seen != n) /* none: a trace without a prompt, every ρ 0 */
        return kvs_fail(KVS_ERR_STATE, "duo_heuristic: allocation pass saw %d of %d KV heads", seen, n);
    a->map.n_streaming = kvs_duo_type(a->rho, n, a->sparsity, -1.0, a->map.streaming);
    return KVS_OK;
}

static int duoh_notes(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget, char *buf, size_t cap) {
    (void)budget;
    int64_t win = (int64_t)kvs_policy_param_get(cfg, "n_s") + (int64_t)kvs_policy_param_get(cfg, "n_r");
    int n = 0;
    if (m->prompt_len > 0 && m->prompt_len <= win)
        n += kvs_policy_note(buf, cap, "prompt %lld <= n_s + n_r = %lld: no probe position, every head scores 0 and the "
                                       "streaming heads are the first ones in (layer, head) order",
                             (long long)m->prompt_len, (long long)win);
    if (m->n_positions > 0 && m->n_positions <= win)
        n += kvs_policy_note(buf, cap, "n_s + n_r = %lld covers the trace's %lld positions: streaming heads drop "
                                       "nothing (the run equals the full cache)",
                             (long long)win, (long long)m->n_positions);
    return n;
}

const struct kvs_policy_ops kvs_policy_duo_heuristic = {
    .version = KVS_POLICY_INTERFACE_VERSION,
    .name = "duo_heuristic",
    .summary = "HEURISTIC DuoAttention pattern from the prompt (not the trained gates): streaming vs full KV heads",
    .is_oracle = 0,
    .granularity = KVS_SEL_PER_KV_HEAD,
    .budget_scope = KVS_BUDGET_NONE,
    .params = duoh_params,
    .n_params = (int)(sizeof duoh_params / sizeof duoh_params[0]),
    .notes = duoh_notes,
    .create = kvs_duo_create,
    .free = kvs_duo_free,
    .prefill = kvs_duo_prefill,
    .select = kvs_duo_select,
    .stored = kvs_duo_stored,
    .account = kvs_duo_account,
    .window_evict = kvs_duo_window_evict,
    .alloc_begin = duoh_alloc_begin,
    .alloc_prefill = duoh_alloc_prefill,
    .alloc_end = duoh_alloc_end,
    .alloc_free = duoh_alloc_free,
    .alloc_shared = kvs_duo_alloc_shared,
    .alloc_concurrent = 1,
};
