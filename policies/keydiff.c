/* keydiff.c — KeyDiff (Park et al., "Key Similarity-Based KV Cache Eviction for Long-Context LLM Inference in
 * Resource-Constrained Environments", arXiv 2504.15364, ../shared/papers/keydiff.txt), as specified in
 * POLICY_SPEC §2.5, §4 items 5-8 (equation reconstructions) and §8 item 5; also the block-wise framework of
 * KNorm (policies/knorm.c, POLICY_SPEC §2.6 B12), which runs this file's instance with its own score
 * (keydiff_internal.h kvs_keydiff_create).
 *
 * Score (attention-free, keys only; common/kvs_math.h kvs_key_scores): s_i = -cos(k_i, mu) with the anchor
 * mu = mean of the normalised candidate keys (Eq. 8, default); anchor=raw uses the plain mean of the keys
 * (§3.2: "we evaluate the efficient KeyDiff ... using unnormalized keys in all subsequent sections");
 * pairwise=true scores with Eq. 7, s_i = -sum_j cos(k_i, k_j) in O(n^2 d) (the same ranking as Eq. 8 whenever
 * mu != 0, §4 item 7). The keys most similar to the others (lowest s) are evicted.
 *
 * Eviction event over a candidate list (held positions + new ones, ascending), whenever it exceeds the
 * capacity C = B - 1: W = floor(window_frac * C) newest candidates are protected (the sliding-window variant,
 * §3.2 and POLICY_SPEC §2.5: W_sw = floor(f_sw N) with the paper's N = C; 0 by default) and the scored older ones
 * keep TOPK(s, C - W); the anchor is computed over every candidate, the protected ones included.
 *  - Prefill (Eq. 6, block prompt processing): the prompt in blocks of `block` positions (128 by default,
 *    POLICY_SPEC §2.5 [RECON], kvpress BlockPress) through the engine's chunked prefill (prefill_block()):
 *    after every block, candidates = what is held + the block, evicted down to C. A block's queries attend
 *    what was held after the previous block plus the block (measured by the engine with --measure prefill).
 *  - Decode (block = 1, attend-then-evict, §4 "for token generation"): S_t = the C held positions + the
 *    current token; after attention (observe), if S_t exceeds C the lowest-scoring candidate is evicted (the
 *    current token included, unless the window protects it).
 *
 * Ambiguities resolved:
 *  - Budget: the paper's N bounds the cache at every moment and its decode attends N+1 entries (attend, then
 *    evict). kvsim's B bounds S_t with the current token included (sim/policy.h, POLICY_SPEC preamble), so the
 *    cache holds C = B - 1 after every eviction, prefill blocks included: decode attends at most B, and the
 *    prefill peak is C + block <= B + block (the paper's N + M_blk). This is the paper's process with
 *    N = B - 1, and block=1 prefill is then exactly decode's process (§2.4: "M_blk = 1 corresponds to the
 *    token generation phase").
 *  - Block size: lost in the extraction; 128 (POLICY_SPEC §8 5a). A block covering the whole prompt is the
 *    paper's one-shot processing (M_blk = L), reported by notes().
 *  - Anchor: Eq. 8 and kvpress normalise the keys, the paper's experiments used the raw mean (§8 5b): the
 *    default follows the equation (normalized), `anchor=raw` and the `paper` presets give the other. Eq. 7
 *    has no anchor, so pairwise=true with anchor=raw is rejected (validate) rather than silently ignored.
 *  - Window: W = floor(window_frac * C) newest positions of the candidates, C = B - 1 (the paper, §3.2: "a
 *    percentage of the cache budget", whose budget is N = C, see Budget above; POLICY_SPEC §2.5 "W_sw =
 *    floor(f_sw N)"); not floor(window_frac * B), which counts the current token kvsim's B includes. It is
 *    carved out of the budget, so the scored part keeps C - W. With window_frac > 0 but W = 0 (small budgets)
 *    the current token is not protected: notes() says so.
 *  - Guards (POLICY_SPEC §1.4, PyTorch): k/max(|k|, 1e-12), cos = a.b / max(|a||b|, 1e-8); scores in fp64.
 *  - Ties (§1.4): kvs_topk_f64 keeps the higher score, the OLDER position among equals (candidates are in
 *    position order). Sinks are not forced in (the paper: distinctive keys recover them, §3.1).
 *  - Multi-turn: a later turn's prompt is processed in blocks from its first position against what the
 *    earlier turns left (the same Eq. 6 recursion); generated tokens are candidates like prompt tokens.
 *  - GQA: keys only, so one set per KV head shared by its query heads; no query aggregation (POLICY_SPEC §2.5).
 *  - Sliding-window layers (sim/replay.h): the host's window_evict names the first position still in the window;
 *    the held positions before it leave at the start of the next eviction event (prefill block or observe), before
 *    the scores rank what remains, so a budget covering the window keeps all of it.
 * Accounting (POLICY_SPEC §2.5 "Storage", §3): KV resident = S_t (the engine's default, <= B); at a decode
 * step that evicts, the scoring temporaries are transient device memory (anchor: mu (d) + scores (n_c);
 * pairwise: scores + key norms (2 n_c), C(K) accumulated row by row, never materialised; knorm: scores (n_c))
 * at aux_bytes each, so storage_peak = KV + them. Scoring reuses the attention's K read (fused: 0 auxiliary
 * reads); unfused it re-reads the n_c keys (d n_c elements at kv_bytes). Prefill: the engine counts the whole
 * block as transient (peak = held + block); it has no account() hook there, so the block's scoring temporaries
 * are not added to the prefill peak.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../common/kvs_math.h"
#include "keydiff_internal.h"
#include "registry.h"

enum { KD_ANCHOR_NORMALIZED = 0, KD_ANCHOR_RAW = 1 };

static const kvs_policy_param keydiff_params[] = {
    {.key = "block", .type = KVS_PARAM_INT, .def = 128, .lo = 1, .hi = 1 << 24,
     .help = "prompt block size M_blk: the prompt is processed (and evicted) block by block (Eq. 6)"},
    {.key = "anchor", .type = KVS_PARAM_ENUM, .def = KD_ANCHOR_NORMALIZED, .choices = "normalized|raw",
     .help = "anchor = mean of the normalised keys (Eq. 8) or of the raw keys (the paper's experiments)"},
    {.key = "pairwise", .type = KVS_PARAM_BOOL, .def = 0, .lo = 0, .hi = 1,
     .help = "score with Eq. 7 (sum of pairwise cosines, O(n^2)) instead of the anchor"},
    {.key = "window_frac", .type = KVS_PARAM_DOUBLE, .def = 0, .lo = 0, .hi = 1,
     .help = "share of the budget kept as a sliding window of the newest tokens (KeyDiff with sliding window)"},
};

static const kvs_policy_preset keydiff_presets[] = {
    {.name = "paper", .params = "anchor=raw",
     .help = "KeyDiff §3.2/§4: unnormalised-key anchor as in the paper's experiments, block 128; N = 2K-8K: --budgets 2049,4097,6145,8193 (N + the current token)"},
    {.name = "paper-window10", .params = "anchor=raw,window_frac=0.1",
     .help = "KeyDiff Table 13: sliding window of 10% of the budget; N = 2K-8K: --budgets 2049,4097,6145,8193 (N + the current token)"},
    {.name = "paper-window20", .params = "anchor=raw,window_frac=0.2",
     .help = "KeyDiff Table 13: sliding window of 20% of the budget; N = 2K-8K: --budgets 2049,4097,6145,8193 (N + the current token)"},
};

typedef struct {
    kvs_policy_model model;
    int64_t budget;   /* B */
    int64_t cap;      /* C = B - 1: positions held after every eviction */
    int64_t window;   /* W = floor(window_frac * C): newest candidates protected */
    int64_t block;    /* prefill block size */
    kvs_key_score kind;
    int d;
    int32_t *pos;     /* [alloc] held positions, ascending (+ the current token during a decode step) */
    int64_t cnt;
    /* norm[j] = |k_pos[j]| (kvs_key_norms) for j < n_normed: a key's norm depends on its row alone, so it is
     * computed once, at the first eviction event that sees the key, and moves with the key rather than being
     * recomputed for every candidate at every event. A saving of the simulator only: account() still charges the
     * modelled system the paper's per-event scoring temporaries. */
    double *norm;
    int64_t n_normed;
    /* The anchor's running sum after each whole chunk of KVS_KEY_ANCHOR_CHUNK held keys ([alloc / chunk][d]), and
     * how many leading chunks are unchanged since it was summed (kvs_key_scores_resumed): a step evicts one key
     * and appends one, so the chunks before the evicted key are not summed again. The same bits. */
    double *ck;
    size_t ck_valid;
    /* eviction scratch, `alloc` candidates */
    double *score, *work; /* work: kvs_key_scores_lowest_scratch_bytes(alloc, d) */
    int32_t *top;
    char *mark;
    int64_t alloc;
    int64_t win_first; /* positions before it are evicted by the host (sliding-window layer, window_evict); 0 otherwise */
} kd_state;

/* KeyDiff's score from its anchor/pairwise parameters (KNorm passes its own to kvs_keydiff_create). */
static kvs_key_score kd_kind(const kvs_policy_config *cfg) {
    if (kvs_policy_param_get(cfg, "pairwise") != 0) return KVS_KEY_SCORE_PAIRWISE;
    return (int)kvs_policy_param_get(cfg, "anchor") == KD_ANCHOR_RAW ? KVS_KEY_SCORE_ANCHOR_RAW : KVS_KEY_SCORE_ANCHOR;
}

/* W for budget B: floor(window_frac * N) with the paper's cache size N = C = B - 1 (§3.2, POLICY_SPEC §2.5);
 * window_frac <= 1, so W <= C. */
static int64_t kd_window(const kvs_policy_config *cfg, int64_t budget) {
    int64_t cap = budget > 1 ? budget - 1 : 0;
    int64_t w = (int64_t)floor(kvs_policy_param_get(cfg, "window_frac") * (double)cap);
    return w > cap ? cap : w;
}

static void keydiff_free(void *state) {
    kd_state *s = state;
    if (!s) return;
    free(s->pos);
    free(s->norm);
    free(s->ck);
    free(s->score);
    free(s->work);
    free(s->top);
    free(s->mark);
    free(s);
}

/* Room for n candidates (held + a block, or held + the current token). */
static kvs_status kd_reserve(kd_state *s, int64_t n) {
    if (n <= s->alloc) return KVS_OK;
    int64_t a = s->alloc > 0 ? s->alloc : 16;
    while (a < n) a *= 2;
    int32_t *pos = realloc(s->pos, (size_t)a * sizeof *pos);
    if (pos) s->pos = pos;
    double *norm = realloc(s->norm, (size_t)a * sizeof *norm);
    if (norm) s->norm = norm;
    double *score = realloc(s->score, (size_t)a * sizeof *score);
    if (score) s->score = score;
    double *work = realloc(s->work, kvs_key_scores_lowest_scratch_bytes((size_t)a, (size_t)s->d));
    if (work) s->work = work;
    int32_t *top = realloc(s->top, (size_t)a * sizeof *top);
    if (top) s->top = top;
    char *mark = realloc(s->mark, (size_t)a);
    if (mark) s->mark = mark;
    double *ck = realloc(s->ck, ((size_t)a / KVS_KEY_ANCHOR_CHUNK + 1) * (size_t)s->d * sizeof *ck);
    if (ck) s->ck = ck;
    if (!pos || !norm || !score || !work || !top || !mark || !ck)
        return kvs_fail(KVS_ERR_NOMEM, "keydiff: out of memory");
    s->alloc = a;
    return KVS_OK;
}

kvs_status kvs_keydiff_create(const kvs_policy_init *init, kvs_key_score kind, void **state) {
    kd_state *s = calloc(1, sizeof *s);
    if (!s) return kvs_fail(KVS_ERR_NOMEM, "keydiff: out of memory");
    s->model = *init->model;
    s->budget = init->budget;
    s->cap = init->budget - 1;
    s->window = kd_window(init->cfg, init->budget);
    s->block = (int64_t)kvs_policy_param_get(init->cfg, "block");
    s->kind = kind;
    s->d = init->model->head_dim;
    kvs_status st = kd_reserve(s, init->budget + 1);
    if (st != KVS_OK) {
        keydiff_free(s);
        return st;
    }
    *state = s;
    return KVS_OK;
}

/* The candidate j < n, mark[j] set, that kvs_topk_f64's order ranks last (lowest score, the newer among equals,
 * NaN after every number): the one a top-(n-1) leaves out. */
static int64_t kd_last_ranked(const double *score, const char *mark, int64_t n) {
    int64_t w = -1;
    for (int64_t j = 0; j < n; j++) {
        if (!mark[j]) continue;
        if (w < 0 || isnan(score[j]) || (!isnan(score[w]) && score[j] <= score[w])) w = j;
    }
    return w;
}

/* Evictions per event below which repeated scans for the last-ranked candidate beat a top-k (a decode step
 * evicts one). */
#define KD_SCAN_EVICTIONS 4

/* One eviction event: the held list pos[0..cnt) (ascending candidates) down to the capacity C. */
static void kd_evict(kd_state *s, const float *keys) {
    int64_t out = 0; /* a sliding-window layer's evictions first: the oldest held positions */
    while (out < s->cnt && s->pos[out] < s->win_first) out++;
    if (out > 0) {
        int64_t normed_out = out < s->n_normed ? out : s->n_normed;
        memmove(s->pos, s->pos + out, (size_t)(s->cnt - out) * sizeof *s->pos);
        memmove(s->norm, s->norm + normed_out, (size_t)(s->n_normed - normed_out) * sizeof *s->norm);
        s->cnt -= out;
        s->n_normed -= normed_out;
        s->ck_valid = 0; /* the anchor's chunk sums start at the first held key */
    }
    int64_t nc = s->cnt;
    if (nc <= s->cap) return;
    int64_t scored = nc - s->window, keep = s->cap - s->window;
    if (s->n_normed < nc) /* the keys that entered since the last event */
        kvs_key_norms(keys, (size_t)s->d, s->pos + s->n_normed, (size_t)(nc - s->n_normed), (size_t)s->d,
                      s->norm + s->n_normed);
    if (scored - keep == 1) {
        /* a decode step: the one key the fp64 scores rank last, found by an fp32 screen that scores in fp64 only
         * the keys it cannot rule out (kvs_key_scores_lowest: the key the fp64 ranking evicts, sim/BENCH.md
         * "KeyDiff's eviction screened in fp32") */
        memset(s->mark, 1, (size_t)nc);
        s->mark[kvs_key_scores_lowest(keys, (size_t)s->d, s->pos, (size_t)nc, (size_t)scored, (size_t)s->d, s->kind,
                                      s->norm, s->score, s->work, s->ck, &s->ck_valid)] = 0;
    } else {
        kvs_key_scores_resumed(keys, (size_t)s->d, s->pos, (size_t)nc, (size_t)s->d, s->kind, s->norm, s->score,
                               s->work, s->ck, &s->ck_valid);
        if (scored - keep <= KD_SCAN_EVICTIONS) {
            /* the same set as the top-k below: all but the scored - keep last-ranked, each found in O(n), which for
             * a few evictions is cheaper than a top-k of n - 1 */
            memset(s->mark, 1, (size_t)nc);
            for (int64_t e = 0; e < scored - keep; e++) s->mark[kd_last_ranked(s->score, s->mark, scored)] = 0;
        } else {
            memset(s->mark, 0, (size_t)nc);
            kvs_topk_f64_set(s->score, (size_t)scored, (size_t)keep, s->top);
            for (int64_t j = 0; j < keep; j++) s->mark[s->top[j]] = 1;
        }
    }
    for (int64_t j = scored; j < nc; j++) s->mark[j] = 1; /* the sliding window */
    int64_t first_out = 0; /* the keys before the first evicted one keep their places: their checkpoints hold */
    while (first_out < nc && s->mark[first_out]) first_out++;
    if ((size_t)first_out / KVS_KEY_ANCHOR_CHUNK < s->ck_valid) s->ck_valid = (size_t)first_out / KVS_KEY_ANCHOR_CHUNK;
    int64_t m = 0;
    for (int64_t j = 0; j < nc; j++)
        if (s->mark[j]) {
            s->pos[m] = s->pos[j];
            s->norm[m++] = s->norm[j];
        }
    s->cnt = s->n_normed = m;
}

/* One prompt block [block_begin, n): candidates = held + the block (the engine lets the policy read both). */
static kvs_status keydiff_prefill(void *state, const kvs_policy_view *view) {
    kd_state *s = state;
    int64_t nb = view->n - view->block_begin;
    kvs_status st = kd_reserve(s, s->cnt + nb);
    if (st != KVS_OK) return st;
    for (int64_t j = 0; j < nb; j++) s->pos[s->cnt++] = (int32_t)(view->block_begin + j);
    kd_evict(s, view->k);
    return KVS_OK;
}

static int64_t keydiff_prefill_block(void *state) { return ((kd_state *)state)->block; }

static kvs_status keydiff_select(void *state, const kvs_policy_view *view, kvs_policy_sel *sel) {
    kd_state *s = state;
    KVS_ASSERT(s->cnt <= s->cap);
    s->pos[s->cnt++] = (int32_t)(view->n - 1);
    memcpy(sel->idx[0], s->pos, (size_t)s->cnt * sizeof(int32_t));
    sel->n[0] = s->cnt;
    return KVS_OK;
}

/* Attend-then-evict: the eviction after attention; the probabilities are not used (attention-free). */
static kvs_status keydiff_observe(void *state, const kvs_policy_view *view, const kvs_policy_sel *sel,
                                  const float *const *probs) {
    kd_state *s = state;
    (void)sel;
    (void)probs;
    kd_evict(s, view->k);
    return KVS_OK;
}

/* Sliding-window layers (sim/replay.h): takes effect in the next prefill or observe, before the policy's own
 * eviction, so that a budget covering the window keeps all of it (the host's window check fails a run that holds
 * an older position). */
static kvs_status keydiff_window_evict(void *state, int64_t first) {
    kd_state *s = state;
    if (first > s->win_first) s->win_first = first;
    return KVS_OK;
}

int kvs_keydiff_norm_scores(void *state, int g, const int32_t *idx, int64_t n, double *out) {
    kd_state *s = state;
    (void)g;
    KVS_ASSERT(s->kind == KVS_KEY_SCORE_L2NORM);
    int64_t ranked = s->cnt - s->window; /* the next event ranks candidates [0, cnt - W) */
    for (int64_t j = 0, k = 0; j < n; j++) {
        while (k < s->cnt && s->pos[k] < idx[j]) k++; /* both ascending: one merge */
        int held = k < s->cnt && s->pos[k] == idx[j];
        out[j] = held && k < ranked && k < s->n_normed ? -s->norm[k] : INFINITY;
    }
    return 1;
}

static int64_t keydiff_stored(void *state, int g, int32_t *out) {
    kd_state *s = state;
    (void)g;
    if (s->cnt > 0) memcpy(out, s->pos, (size_t)s->cnt * sizeof(int32_t)); /* pos may be NULL before the first block */
    return s->cnt;
}

/* The default KV accounting (S_t, <= B) plus this step's eviction temporaries (see the header comment). */
static void keydiff_account(void *state, const kvs_policy_view *view, const kvs_policy_sel *sel, kvs_policy_cost *out) {
    kd_state *s = state;
    (void)view;
    (void)sel;
    if (s->cnt <= s->cap) return; /* nothing is evicted this step: no scoring */
    double nc = (double)s->cnt, aux;
    switch (s->kind) {
    case KVS_KEY_SCORE_PAIRWISE: aux = 2 * nc; break;
    case KVS_KEY_SCORE_L2NORM: aux = nc; break;
    default: aux = nc + (double)s->d; break;
    }
    out->transient_bytes = aux * (double)s->model.aux_bytes;
    out->read_aux_unfused_bytes = nc * (double)s->d * (double)s->model.kv_bytes;
}

static kvs_status keydiff_create(const kvs_policy_init *init, void **state) {
    return kvs_keydiff_create(init, kd_kind(init->cfg), state);
}

static kvs_status keydiff_validate(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget) {
    (void)m;
    (void)budget;
    if (kvs_policy_param_get(cfg, "pairwise") != 0 && (int)kvs_policy_param_get(cfg, "anchor") == KD_ANCHOR_RAW)
        return kvs_fail(KVS_ERR_INVALID_ARG,
                        "policy %s: pairwise=true (Eq. 7) has no anchor; anchor=raw would be ignored", cfg->ops->name);
    return KVS_OK;
}

/* Degenerate settings (kvs_policy_ops.notes), shared with knorm. The texts name no budget. */
static int keydiff_notes(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget, char *buf,
                         size_t cap) {
    int n = 0;
    int64_t block = (int64_t)kvs_policy_param_get(cfg, "block");
    double f = kvs_policy_param_get(cfg, "window_frac");
    if (m->prompt_len > 0 && block >= m->prompt_len)
        n += kvs_policy_note(buf, cap, "block=%lld covers the whole %lld-position first prompt: one-shot prefill "
                                       "(M_blk = L), no block-wise eviction of the first prompt",
                             (long long)block, (long long)m->prompt_len);
    int64_t w = kd_window(cfg, budget);
    if (f > 0 && budget > 1 && w >= budget - 1)
        n += kvs_policy_note(buf, cap, "window_frac=%g reserves every held position for the sliding window: no key "
                                       "is scored (a sliding window)",
                             f);
    else if (f > 0 && budget > 1 && w == 0)
        n += kvs_policy_note(buf, cap, "window_frac=%g rounds to an empty window at this budget: no sliding window, "
                                       "the current token is not protected",
                             f);
    return n;
}

const struct kvs_policy_ops kvs_policy_keydiff = {
    .version = KVS_POLICY_INTERFACE_VERSION,
    .name = "keydiff",
    .summary = "KeyDiff: evict the keys most similar to the others (cosine to the mean key), block-wise prefill",
    .is_oracle = 0,
    .granularity = KVS_SEL_PER_KV_HEAD,
    .budget_scope = KVS_BUDGET_EVERY_STEP,
    .params = keydiff_params,
    .n_params = (int)(sizeof keydiff_params / sizeof keydiff_params[0]),
    .presets = keydiff_presets,
    .n_presets = (int)(sizeof keydiff_presets / sizeof keydiff_presets[0]),
    .validate = keydiff_validate,
    .notes = keydiff_notes,
    .create = keydiff_create,
    .free = keydiff_free,
    .prefill = keydiff_prefill,
    .select = keydiff_select,
    .observe = keydiff_observe,
    .stored = keydiff_stored,
    .prefill_block = keydiff_prefill_block,
    .account = keydiff_account,
    .window_evict = keydiff_window_evict,
};
