/* pyramidkv.c — PyramidKV (Cai et al., 2024, "Pyramidal Information Funneling"): SnapKV-style prompt compression
 * with per-layer budgets that decrease linearly from the first layer to the last. Follows the POLICY_SPEC
 * appendix row "PyramidKV" (β = 20; min = (C−W)//β, max = 2(C−W) − min clamped to prompt−W; layer l keeps
 * max − l·step, plus W) and the reference Zefan-Cai/PyramidKV pyramidkv/pyramidkv_utils.py
 * (PyramidKVCluster.update_kv); POLICY_SPEC §2.6 B13 names PyramidKV without specifying it further.
 *
 * Allocation pass (sim/policy.h alloc_*), once per (configuration, budget B) on the first turn's prompt length P:
 *   W = min(window, P), base = B − W (scored positions per head on average), L layers;
 *   min = base // beta, max = 2·base − min; if max >= P − W: max = P − W, min = 2·base − max;
 *   layer l keeps s_l scored positions + the W window positions, s_0 = max ... s_{L−1} = min (arithmetic).
 * Every KV head of a layer gets the same budget s_l + W; within a layer the selection is SnapKV's (snapkv.c:
 * window-query attention summed over the window, pooled, top s_l of the prefix + the window), snapkv.c's instance
 * (kvs_snapkv_create) with this file's layout and no prompt blocks; window, kernel and pool are read by key.
 *
 * Ambiguities resolved (paper / reference / choice):
 *  - Total: the paper defines the arithmetic sequence so that the layers' total equals L·(C−W) (average C per
 *    layer); the reference rounds step = (max−min)//(L−1) down, so its layers keep slightly MORE than L·C in
 *    total. fidelity=paper (default) keeps the exact total L·B: s_l = floor of the real-valued line
 *    max − l·(max−min)/(L−1), with the remainder handed out one position each to the largest fractional
 *    parts (ties to the lower layer); this keeps the sequence non-increasing and every s_l >= min.
 *    fidelity=ref reproduces the reference: integer step, and its branch "prompt < 2(C−W)" that falls back to
 *    a uniform C per layer.
 *  - P <= B (nothing to compress: the reference returns early when q_len < C), B <= W (the window fills the
 *    budget) and L = 1: every layer gets B (uniform SnapKV).
 *  - Defaults: the reference cluster defaults to window 64, kernel 5, avgpool, β 20; the PyramidKV paper's
 *    LongBench runs use SnapKV's setting (window 32, kernel 7, maxpool), which we take, as for snapkv, so
 *    the two differ only in the allocation. β = 20 (both).
 *  - GQA: per query head (expand) as KVCache-Factory's repeat_kv path, the same per-layer budget for every
 *    head of the layer; gqa=mean|max share one set per KV head (see snapkv.c).
 *  - Later turns reuse the first turn's per-layer budgets (the allocation pass sees only the first prompt).
 * Budget convention: each layer's budget bounds its retained prompt positions, window included (prompt-only
 * scope like SnapKV); generated tokens are all kept.
 * Sliding-window layers (sim/replay.h): the instance is SnapKV's, so its window_evict (snapkv.c) applies: the
 * positions before the window's first leave the list at once and a prefill takes no candidate before it. The
 * pyramid keeps its rule (it depends on the first prompt's length only, the same for every layer): a windowed
 * layer whose s_l + W is at least its attention window holds the whole window and leaves the rest of its share
 * unused, as a layer given more than its prompt does; the other layers are not handed that excess, so the run's
 * total stays at most L·B.
 */
#include <stdlib.h>
#include <string.h>

#include "registry.h"
#include "snapkv_internal.h"

enum { PYR_PAPER = 0, PYR_REF = 1 };

static const kvs_policy_param pyramidkv_params[] = {
    {.key = "window", .type = KVS_PARAM_INT, .def = 32, .lo = 1, .hi = 1 << 20,
     .help = "observation window W (queries scoring the prefix; the W positions are always kept)"},
    {.key = "kernel", .type = KVS_PARAM_INT, .def = 7, .lo = 1, .hi = 4095, .help = "pooling kernel (odd)"},
    {.key = "pool", .type = KVS_PARAM_ENUM, .def = 0, .choices = "max|avg", .help = "pooling of the window scores"},
    /* snapkv's choices in snapkv's order: the value is the KVS_SNAPKV_* layout */
    {.key = "gqa", .type = KVS_PARAM_ENUM, .def = KVS_SNAPKV_EXPAND, .choices = "expand|mean|max",
     .help = "expand: a set per query head (KVCache-Factory, G x storage); mean/max: one set per KV head"},
    {.key = "beta", .type = KVS_PARAM_INT, .def = 20, .lo = 1, .hi = 1 << 20,
     .help = "pyramid steepness: the last layer keeps (B−W)//beta scored positions"},
    {.key = "fidelity", .type = KVS_PARAM_ENUM, .def = PYR_PAPER, .choices = "paper|ref",
     .help = "paper: exact total L*B; ref: the reference's integer step and uniform fallback"},
};

typedef struct {
    int L, Hkv, window, beta, fidelity;
    int64_t budget, P;
} pyr_alloc;

/* Scored-position counts s[0..L-1] of the pyramid (budget = s + W); see the header comment. */
static void pyr_layer_scored(const pyr_alloc *a, int64_t W, int64_t *s) {
    int64_t base = a->budget - W, L = a->L;
    for (int64_t l = 0; l < L; l++) s[l] = base;
    if (a->P <= a->budget || base <= 0 || L == 1) return;
    if (a->fidelity == PYR_REF && a->P < 2 * base) return; /* reference: uniform branch */
    int64_t lo = base / a->beta, hi = 2 * base - lo;
    if (hi >= a->P - W) {
        hi = a->P - W;
        lo = 2 * base - hi;
    }
    if (a->fidelity == PYR_REF) {
        int64_t step = (hi - lo) / (L - 1);
        for (int64_t l = 0; l < L; l++) s[l] = hi - l * step;
        return;
    }
    /* Exact total L·base: floor of the line, then the remainder to the largest fractional parts. The
     * fractions are (l·(hi−lo)) mod (L−1) over L−1, compared exactly in integers. */
    int64_t span = hi - lo, total = 0;
    for (int64_t l = 0; l < L; l++) {
        s[l] = hi - (l * span + (L - 2)) / (L - 1); /* floor(hi − l·span/(L−1)) */
        total += s[l];
    }
    for (int64_t left = L * base - total; left > 0; left--) {
        int64_t best = -1, best_frac = -1;
        for (int64_t l = 0; l < L; l++) {
            int64_t rem = (l * span) % (L - 1), frac = rem ? (L - 1) - rem : 0; /* (ideal − floor)·(L−1) */
            if (frac > best_frac && s[l] == hi - (l * span + (L - 2)) / (L - 1)) {
                best = l;
                best_frac = frac;
            }
        }
        KVS_ASSERT(best >= 0 && best_frac > 0);
        s[best]++;
    }
}

static kvs_status pyr_alloc_begin(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget,
                                  void **alloc) {
    pyr_alloc *a = calloc(1, sizeof *a);
    if (!a) return kvs_fail(KVS_ERR_NOMEM, "pyramidkv: out of memory");
    a->L = m->n_layers;
    a->Hkv = m->n_kv_heads;
    a->window = (int)kvs_policy_param_get(cfg, "window");
    a->beta = (int)kvs_policy_param_get(cfg, "beta");
    a->fidelity = (int)kvs_policy_param_get(cfg, "fidelity");
    a->budget = budget;
    a->P = m->prompt_len;
    *alloc = a;
    return KVS_OK;
}

static kvs_status pyr_alloc_prefill(void *alloc, int layer, int kv_head, const kvs_policy_view *prefill) {
    pyr_alloc *a = alloc;
    (void)kv_head;
    if (layer < 0 || layer >= a->L)
        return kvs_fail(KVS_ERR_RANGE, "pyramidkv: allocation pass got layer %d of %d", layer, a->L);
    a->P = prefill->n; /* only the prompt length matters: the pyramid does not depend on attention */
    return KVS_OK;
}

static kvs_status pyr_alloc_end(void *alloc, int64_t *budgets) {
    pyr_alloc *a = alloc;
    int64_t W = a->window < a->P ? a->window : a->P;
    int64_t *s = malloc((size_t)(a->L > 0 ? a->L : 1) * sizeof *s);
    if (!s) return kvs_fail(KVS_ERR_NOMEM, "pyramidkv: out of memory");
    pyr_layer_scored(a, W, s);
    for (int l = 0; l < a->L; l++)
        for (int h = 0; h < a->Hkv; h++) budgets[(size_t)l * (size_t)a->Hkv + (size_t)h] = s[l] + W < 1 ? 1 : s[l] + W;
    free(s);
    return KVS_OK;
}

static void pyr_alloc_free(void *alloc) { free(alloc); }

/* Within a layer PyramidKV is SnapKV: the instance is snapkv.c's, with this table's layout and no prompt blocks;
 * validate() and notes() are SnapKV's checks of the window and kernel the tables share. */
static kvs_policy_granularity pyr_layout(const kvs_policy_config *cfg) {
    return (int)kvs_policy_param_get(cfg, "gqa") == KVS_SNAPKV_EXPAND ? KVS_SEL_PER_QUERY_HEAD : KVS_SEL_PER_KV_HEAD;
}
static kvs_status pyr_validate(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget) {
    return kvs_policy_snapkv.validate(cfg, m, budget);
}
/* SnapKV's degenerate settings, plus the pyramid's own: its last layer keeps (B - W) / beta scored positions,
 * none when that is below 1, so the top layers are windows of the prompt. */
static int pyr_notes(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget, char *buf, size_t cap) {
    int n = kvs_policy_snapkv.notes(cfg, m, budget, buf, cap);
    if (n) return n;
    int64_t w = (int64_t)kvs_policy_param_get(cfg, "window"), beta = (int64_t)kvs_policy_param_get(cfg, "beta");
    if (m->n_layers > 1 && (budget - w) / beta < 1)
        n += kvs_policy_note(buf, cap, "(budget - window=%lld) / beta=%lld < 1: the last layers score no position "
                                       "(windows of the prompt)",
                             (long long)w, (long long)beta);
    return n;
}
static kvs_status pyr_create(const kvs_policy_init *init, void **state) {
    return kvs_snapkv_create(init, (int)kvs_policy_param_get(init->cfg, "gqa"), 0, state);
}
static void pyr_free(void *state) { kvs_policy_snapkv.free(state); }
static kvs_status pyr_prefill(void *state, const kvs_policy_view *view) { return kvs_policy_snapkv.prefill(state, view); }
static kvs_status pyr_select(void *state, const kvs_policy_view *view, kvs_policy_sel *sel) {
    return kvs_policy_snapkv.select(state, view, sel);
}
static int64_t pyr_stored(void *state, int g, int32_t *out) { return kvs_policy_snapkv.stored(state, g, out); }
static kvs_status pyr_window_evict(void *state, int64_t first) { return kvs_policy_snapkv.window_evict(state, first); }

const struct kvs_policy_ops kvs_policy_pyramidkv = {
    .version = KVS_POLICY_INTERFACE_VERSION,
    .name = "pyramidkv",
    .summary = "PyramidKV: SnapKV selection with per-layer budgets decreasing linearly (total L*B)",
    .is_oracle = 0,
    .granularity = KVS_SEL_PER_QUERY_HEAD,
    .budget_scope = KVS_BUDGET_PROMPT,
    .params = pyramidkv_params,
    .n_params = (int)(sizeof pyramidkv_params / sizeof pyramidkv_params[0]),
    .layout = pyr_layout,
    .validate = pyr_validate,
    .notes = pyr_notes,
    .create = pyr_create,
    .free = pyr_free,
    .prefill = pyr_prefill,
    .select = pyr_select,
    .stored = pyr_stored,
    .scores = kvs_snapkv_retention,
    .alloc_begin = pyr_alloc_begin,
    .alloc_prefill = pyr_alloc_prefill,
    .alloc_end = pyr_alloc_end,
    .alloc_free = pyr_alloc_free,
    .window_evict = pyr_window_evict,
};
