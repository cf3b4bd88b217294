/* rocketkv.c — RocketKV, "Accelerating Long-Context LLM Inference via Two-Stage KV Cache Compression" (ICML'25,
 * ../shared/papers/rocketkv.txt §3.2-3.6, Algorithm 1, Table 1, App. A.1-A.3), as specified in
 * ../shared/POLICY_SPEC.md §2.2, §3 (RocketKV rows), §5.2 and §7 G2. This file also holds the implementation of
 * `hsa` (policies/hsa.c: stage 2 alone) and `rocketkv_mt` (policies/rocketkv_mt.c: the multi-turn variant): each
 * ops table's create/validate/notes pass their variant (rocketkv_internal.h kvs_rocketkv_variant), which the
 * instance keeps.
 *
 * Per (layer, KV head), with kvsim's budget B as the paper's token budget t (KV-pair equivalents read per step,
 * estimation included, for the whole GQA group):
 *  Derivation (each turn's prefill; rocketkv_internal.h, POLICY_SPEC §2.2): S = min(n + max_new, model context),
 *    n = the positions at the end of the turn's prompt; c = max(1, S/t); r = min(0.2 + 0.06 log2 c, 0.8) (or a
 *    static r); cap = max(floor(S/c^r), min(2 max_new, S)); prompt budget B_p = cap - max_new; k2 = floor(t/2);
 *    c2 = max(1, cap/t); page Ppg = ceil(sqrt c2) (1 if that exceeds c2); k1 = floor(d Ppg / c2).
 *    rounding=gptfast: Ppg = min(floor c2, ceil sqrt c2), k1 = min(d, max(1, round(d Ppg/c2))),
 *    k2 = min(round(t/2), cap), B_p = min(S - max_new, cap - max_new) (round = half to even, as Python's).
 *  Stage 1 (prefill, only when the candidates exceed B_p): SnapKV with per-group selection — the last
 *    w = min(window, prompt) prompt queries score the candidates before them (causal softmax), summed over the
 *    window and over the G query heads (SUM), max-pooled with kernel 63; keep TOPK(B_p - w) + the window.
 *    The scoring is kvs_snapkv_scores() (common/kvs_math.h), SnapKV's own. B_p <= w keeps the last B_p.
 *  Stage 2, hybrid sparse attention, every decode step: the current token joins the resident set (its key is
 *    folded into the last page's element-wise min/max, Ppg consecutive resident slots per page); i1 = the k1
 *    dimensions with the largest sum_g |q_g|; the sign of sum_g q_g picks Kmax (>= 0) or Kmin per dimension;
 *    page estimate s_g[pi] = sum_{i in i1} q_g[i] K{max|min}_pi[i]; per head a softmax over the resident tokens
 *    (each token its page's estimate) at SparQ's temperature sqrt(d sum_{i1}|q_g| / sum |q_g|), summed over the
 *    group; the k2 tokens with the best group score get exact attention (kvs_page_select: pages by score, whole,
 *    the boundary page's oldest tokens for the remainder — POLICY_SPEC §1.4/§2.2 step 8). Shared math:
 *    kvs_page_minmax_add, kvs_qdims_topk, kvs_page_scores, kvs_sparq_temperature, kvs_page_softmax_add.
 *  Nothing is evicted after stage 1; the resident set grows by one token per step (to cap for one turn).
 *
 * Modes: rocketkv (both stages; stage-1 evictions are permanent, a later turn's stage 1 runs over what is left
 * plus the new prompt, §3.5's motivation for MT); hsa (no stage 1, POLICY_SPEC §2.2 "HSA standalone": r = 0, so
 * cap = S and c2 = c); rocketkv_mt (§3.5: at every turn's prefill stage 1 runs over the WHOLE history plus the new
 * prompt and only SELECTS the device set; positions it does not select stay in a host store, readable() for
 * later turns; decode as rocketkv over the selected set plus this turn's generated tokens).
 *
 * Ambiguities resolved (paper / reference / what we do):
 *  - Budget. kvsim's B bounds |S_t| with the current token included; here B = t and |S_t| = k2 <= t/2 < B: the
 *    other half of t pays for the estimate (§3.6 "we evenly split the token budget"). The current token is not
 *    forced into S_t: it competes through its page (Algorithm 1; the reference appends it before estimating).
 *  - S and max_new. The reference's S is per sample: prompt + max_new_tokens (even if generation stops early),
 *    capped by the model's context. kvsim takes max_new from the trace's capture setting (or the max_new
 *    parameter); unknown (0) gives S = the prompt (a note). The floor cap >= min(2 max_new, S) is the
 *    reference's (the paper gives no prompt budget at all, so its derivation is the only complete one): on a
 *    trace whose generation is as long as its prompt (the bundled stories260K trace: 239 + 256) B_p >= the
 *    prompt, stage 1 keeps everything and RocketKV is HSA alone — notes() says so.
 *  - Multi-turn [SIM-CHOICE]: each turn is a new "sample" for the derivation (S from the context at its prompt
 *    end), stage 1 runs again (rocketkv: over the retained positions + the new prompt; rocketkv_mt: over every
 *    position) with the new turn's observation window, and the pages are rebuilt over the new resident set
 *    (the reference's RocketKV-MT rebuilds its page summaries per turn). The reference fixes the parameters once
 *    per conversation from the total of all turns, which a real system cannot know in advance.
 *  - Sign at exactly 0: Algorithm 1 (g_i >= 0 -> Kmax); the pipeline code uses > 0. Group reductions: sums (the
 *    pipeline's means rank the same).
 *  - Skipped layers (App. A.1: the first two for LongChat only) are not modelled: a dense layer would attend
 *    beyond the budget kvsim enforces at every step. Default skip 0, as for Llama-3.1 and Mistral.
 *  - Ties: dimensions to the lower index, stage-1 positions to the older (kvs_topk), pages as above.
 *  - kvsim clamps (notes() reports each): k2 >= 1 (t = 1), k1 in [1, d], B_p >= 1.
 *  - Precision: stage 1 in fp32 (kvs_snapkv_scores, as snapkv.c), page estimates and softmaxes in fp64.
 *
 * Storage and traffic (account(); POLICY_SPEC §1.5, §3; paper Table 1): KV = the resident slots n' (device);
 * auxiliary = Kmin and Kmax, 2d ceil(n'/Ppg) elements, or for Ppg = 1 one copy of the resident keys (d n', the
 * gpt-fast kt_cache); page summaries are keys, stored in the KV element size (kv_bytes), which is Table 1's
 * convention (auxiliary normalised to the K cache). Reads: the k2 attended K/V (read_kv) and the estimate, k1
 * elements of every page (read_aux) — together about t KV pairs — plus the read of the last page's min/max that
 * the new key updates (2d, read-modify-write; none when the key opens a page); no estimate (and no read) when all
 * n' <= k2 resident tokens are attended. Writes: the new K/V (2d) and the page update (2d; d for the key copy).
 * Transient: the per-head and group page scores ((G+1) ceil(n'/Ppg) aux elements). rocketkv_mt: host = every
 * position seen but not device-resident (the history is kept once, device + host = n: Table 1's "1 +"); h2d =
 * the selected positions that were on the host, d2h = the device positions a turn's stage 1 did not select
 * (the evicted prompt included), both charged to the turn's first decode step (account() runs only at decode).
 * The prefill's dense attention over the host store is not a decode cost and is not counted.
 * What a policy may read (the leak tests): stored() = the device set; readable() = stored() for rocketkv and hsa
 * (a later turn's prefill legitimately reads every stored key: dense prefill, stage-1 scores, page rebuild), the
 * whole history for rocketkv_mt. That decode reads no key but the current one (everything else goes through the
 * page summaries) is checked by tests/test_rocketkv.c, which scrambles every other row between decode steps.
 *
 * Sliding-window layers (sim/replay.h): positions before the host's `first` (window_evict) leave every stage at once:
 * the device set drops them (its oldest slots: the live slots start at `base`), rocketkv_mt's host store forgets them
 * (readable() and the host bytes start at first; a turn's prefill moves none of them), and a prefill takes no
 * candidate before first (stage 1 runs over the window's part of the retained set and the new prompt, its
 * observation window the last w of the prompt's in-window positions). Between prefills the pages keep their slots:
 * the oldest live page loses its slots before base and keeps its min/max over every key folded into it [SIM-CHOICE,
 * as quest.c: still an upper bound of its live keys; a re-fold would re-read them each time the edge moves], and the
 * estimate runs over the live pages, the oldest one counting its live tokens in the softmax and the selection
 * (kvs_page_softmax_add_span, kvs_page_select_span); a prefill rebuilds the pages over the live set. Once the window
 * slides [SIM-CHOICE]: a live set of at most t = B positions is attended whole with no estimate, and stage 1 keeps
 * every candidate when they are at most t (a windowed cache never grows past the window, so the generation that the
 * prompt budget B_p plans room for never materialises beyond it); a budget covering the window then holds and
 * attends exactly the window. A full-attention layer keeps both rules above (results unchanged). The derivation
 * (S, c, r, cap, page, k1) is a full layer's: the policy does not know W.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../common/kvs_math.h"
#include "../sim/policy_memo.h"
#include "registry.h"
#include "rocketkv_internal.h"

static const kvs_policy_param rocketkv_params[] = {
    {.key = "window", .type = KVS_PARAM_INT, .def = 32, .lo = 1, .hi = 1 << 20,
     .help = "stage-1 observation window (App. A.3: 32 single-turn, 128 multi-turn SCBench)"},
    {.key = "kernel", .type = KVS_PARAM_INT, .def = 63, .lo = 1, .hi = 4095,
     .help = "stage-1 max-pooling kernel (odd; §3.3: 63)"},
    {.key = "r", .type = KVS_PARAM_DOUBLE, .def = -1, .lo = -1, .hi = 1,
     .help = "split factor; -1 = adaptive min(0.2 + 0.06 log2 c, 0.8) (§3.6), 0..1 static (Fig. 9: 0.3/0.5/0.7)"},
    {.key = "rounding", .type = KVS_PARAM_ENUM, .def = KVS_ROCKETKV_PIPELINE, .choices = "pipeline|gptfast",
     .help = "parameter rounding: the accuracy pipeline's compress() or gpt-fast's (k1 +-1, page, k2, B_p)"},
    {.key = "max_new", .type = KVS_PARAM_INT, .def = 0, .lo = 0, .hi = 1 << 30,
     .help = "max_new_tokens in S = prompt + max_new; 0 = the trace's capture setting"},
};

static const kvs_policy_preset rocketkv_presets[] = {
    {.name = "scbench", .params = "window=128",
     .help = "RocketKV App. A.3 multi-turn SCBench: observation window 128 (budgets 1024-16384, --budgets t)"},
    {.name = "gptfast", .params = "rounding=gptfast",
     .help = "RocketKV §4.3 efficiency runs (gpt-fast): its parameter rounding (budgets 256-4096, --budgets t)"},
    {.name = "static-r0.3", .params = "r=0.3", .help = "RocketKV App. B.1.2 Fig. 9: static split factor 0.3"},
    {.name = "static-r0.5", .params = "r=0.5", .help = "RocketKV App. B.1.2 Fig. 9: static split factor 0.5"},
    {.name = "static-r0.7", .params = "r=0.7", .help = "RocketKV App. B.1.2 Fig. 9: static split factor 0.7"},
};

/* ---- derivation (rocketkv_internal.h) --------------------------------------------------------------- */

double kvs_rocketkv_split(double c) {
    double r = 0.2 + log2(c) * 0.06;
    return r < 0.8 ? r : 0.8;
}

void kvs_rocketkv_derive(int64_t S, int64_t t, int64_t max_new, int32_t d, double r_fixed, int rounding,
                         kvs_rocketkv_params *out) {
    double c = (double)S / (double)t;
    if (c < 1.0) c = 1.0;
    double r = r_fixed >= 0 ? r_fixed : kvs_rocketkv_split(c);
    int64_t cap = (int64_t)floor((double)S / pow(c, r));
    int64_t floor_cap = 2 * max_new < S ? 2 * max_new : S;
    if (cap < floor_cap) cap = floor_cap;
    double c2 = (double)cap / (double)t;
    if (c2 < 1.0) c2 = 1.0;
    int64_t page, k1, k2, bp;
    if (rounding == KVS_ROCKETKV_GPTFAST) {
        double ceil_sqrt = ceil(sqrt(c2)), fl = floor(c2);
        page = (int64_t)(fl < ceil_sqrt ? fl : ceil_sqrt);
        k1 = (int64_t)nearbyint((double)d * (double)page / c2);
        if (k1 < 1) k1 = 1;
        if (k1 > d) k1 = d;
        k2 = (int64_t)nearbyint((double)t / 2.0);
        if (k2 > cap) k2 = cap;
        bp = cap - max_new;
        if (S - max_new < bp) bp = S - max_new;
    } else {
        page = (int64_t)ceil(sqrt(c2));
        if ((double)page > c2) page = 1;
        k1 = (int64_t)floor((double)d * (double)page / c2);
        k2 = t / 2;
        bp = cap - max_new;
    }
    *out = (kvs_rocketkv_params){.c = c, .r = r, .cap = cap, .prompt_budget = bp, .k2 = k2, .c2 = c2,
                                 .page = page, .k1 = k1};
}

void kvs_rocketkv_table1(double c, double r, double *storage, double *storage_mt, double *traffic) {
    double aux = 2.0 / pow(c, (1.0 + r) / 2.0);
    if (storage) *storage = 1.0 / pow(c, r) + aux;
    if (storage_mt) *storage_mt = 1.0 + aux;
    if (traffic) *traffic = 1.0 / c;
}

/* ---- configuration -------------------------------------------------------------------------------- */

/* The three tables share `rounding` and `max_new`; `window`, `kernel` and `r` (stage 1) are rocketkv's and
 * rocketkv_mt's only, read for those variants only. */

static int64_t rk_max_new(const kvs_policy_config *cfg, const kvs_policy_model *m) {
    return kvs_policy_max_new(m, (int64_t)kvs_policy_param_get(cfg, "max_new"));
}

/* The derivation for this configuration, variant and context, with kvsim's clamps applied (raw: without them). */
static void rk_params(kvs_rocketkv_variant mode, const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t t,
                      int64_t n, kvs_rocketkv_params *raw, kvs_rocketkv_params *p) {
    int64_t max_new = rk_max_new(cfg, m);
    double r = mode == KVS_ROCKETKV_HSA ? 0.0 : kvs_policy_param_get(cfg, "r");
    kvs_rocketkv_derive(kvs_policy_seq_len(m, n, max_new), t, max_new, m->head_dim, r,
                        (int)kvs_policy_param_get(cfg, "rounding"), raw);
    *p = *raw;
    if (p->k2 < 1) p->k2 = 1;
    if (p->k1 < 1) p->k1 = 1;
    if (p->k1 > m->head_dim) p->k1 = m->head_dim;
    if (p->prompt_budget < 1) p->prompt_budget = 1;
}

kvs_status kvs_rocketkv_validate(kvs_rocketkv_variant v, const kvs_policy_config *cfg, const kvs_policy_model *m,
                                 int64_t budget) {
    (void)m;
    (void)budget;
    if (v == KVS_ROCKETKV_HSA) return KVS_OK;
    int64_t k = (int64_t)kvs_policy_param_get(cfg, "kernel");
    if (k % 2 == 0)
        return kvs_fail(KVS_ERR_INVALID_ARG, "policy %s: parameter 'kernel' must be odd (same padding), got %lld",
                        cfg->ops->name, (long long)k);
    double r = kvs_policy_param_get(cfg, "r");
    if (r < 0 && r != -1)
        return kvs_fail(KVS_ERR_INVALID_ARG, "policy %s: parameter 'r' must be -1 (adaptive) or in [0, 1], got %g",
                        cfg->ops->name, r);
    return KVS_OK;
}

/* Degenerate settings, judged on the first turn (prompt_len, the trace's max_new_tokens and context). */
int kvs_rocketkv_notes(kvs_rocketkv_variant mode, const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget,
                       char *buf, size_t cap) {
    int n = 0;
    int64_t P = m->prompt_len > 0 ? m->prompt_len : 1, max_new = rk_max_new(cfg, m);
    kvs_rocketkv_params raw, p;
    rk_params(mode, cfg, m, budget, P, &raw, &p);
    int64_t S = kvs_policy_seq_len(m, P, max_new);
    if (max_new == 0)
        n += kvs_policy_note(buf, cap, "max_new_tokens unknown (trace and max_new=0): S = the %lld-position prompt, "
                                       "not prompt + generation as the paper's",
                             (long long)P);
    if (raw.c <= 1.0)
        n += kvs_policy_note(buf, cap, "budget t=%lld >= S=%lld: c = 1, no compression asked; still only "
                                       "k2=%lld tokens are attended per step",
                             (long long)budget, (long long)S, (long long)p.k2);
    if (mode != KVS_ROCKETKV_HSA) {
        int64_t w = (int64_t)kvs_policy_param_get(cfg, "window"), kern = (int64_t)kvs_policy_param_get(cfg, "kernel");
        int64_t ww = w < P ? w : P, pre = P - ww;
        if (p.prompt_budget >= P) {
            int64_t fl = 2 * max_new < S ? 2 * max_new : S;
            n += kvs_policy_note(buf, cap, "stage 1 keeps the whole %lld-position first prompt (prompt budget "
                                           "B_p=%lld = cap %lld - max_new %lld%s): %s is HSA alone on it",
                                 (long long)P, (long long)p.prompt_budget, (long long)p.cap, (long long)max_new,
                                 fl == p.cap ? ", cap raised to the floor min(2 max_new, S)" : "", cfg->ops->name);
        } else if (p.prompt_budget <= ww) {
            n += kvs_policy_note(buf, cap, "prompt budget B_p=%lld <= observation window %lld: stage 1 keeps the "
                                           "prompt's last B_p positions (a window)",
                                 (long long)p.prompt_budget, (long long)ww);
        } else if (kern / 2 >= pre - 1) {
            n += kvs_policy_note(buf, cap, "kernel=%lld covers the whole %lld-position scored prefix: every pooled "
                                           "score is the maximum, stage 1 keeps the oldest positions",
                                 (long long)kern, (long long)pre);
        }
        if (raw.prompt_budget < 1)
            n += kvs_policy_note(buf, cap, "prompt budget B_p=%lld raised to 1", (long long)raw.prompt_budget);
    }
    if (raw.k2 < 1) n += kvs_policy_note(buf, cap, "budget %lld: k2 = 0 attended tokens raised to 1", (long long)budget);
    if (raw.k1 < 1) n += kvs_policy_note(buf, cap, "k1 = 0 head dimensions raised to 1 (c2 = %.4g)", raw.c2);
    if (p.page == 1 && raw.c > 1.0)
        n += kvs_policy_note(buf, cap, "page size 1 (c2=%.4g): the estimate reads k1=%lld of %d dimensions of every "
                                       "resident key (a key copy, SparQ-like), no page summary",
                             p.c2, (long long)p.k1, m->head_dim);
    else if (p.k1 >= m->head_dim && raw.c > 1.0)
        n += kvs_policy_note(buf, cap, "k1 = d = %d: the estimate uses every head dimension (Quest-like page bound)",
                             m->head_dim);
    return n;
}

/* ---- state ---------------------------------------------------------------------------------------- */

typedef struct {
    kvs_policy_model model;
    kvs_rocketkv_variant mode;
    int window, kernel, group, d; /* window, kernel: stage 1 (0 for hsa) */
    int64_t budget;
    float scale;
    kvs_policy_config cfg;       /* copy: parameters re-derived per turn */
    kvs_rocketkv_params prm;     /* the current turn's, clamped */
    int64_t seen;                /* positions seen (device + host for rocketkv_mt) */
    /* device-resident set, ascending positions; pages are its consecutive runs of prm.page slots */
    int32_t *pos;
    int64_t cnt, pos_cap;
    int64_t base;                /* sliding-window layer: the first live slot of pos (the older ones left) */
    int64_t first;               /* positions before it were evicted by the host (sliding-window layer); 0 otherwise */
    float *kmin, *kmax;          /* [pg_cap][d] page minima and maxima (kmax unused when prm.page == 1) */
    int64_t pg_cap;
    int64_t pend_h2d, pend_d2h;  /* rocketkv_mt: slots moved by the last prefill, charged at the next step */
    /* decode scratch */
    int32_t *dims;               /* [d] */
    uint8_t *use_max;            /* [d] */
    double *dscr;                /* [d] */
    double *ps, *grp;            /* [pg_cap] */
    int32_t *rank, *slots;       /* [pg_cap], [pos_cap] */
    /* prefill scratch, capacity scr_cap candidates */
    int32_t *cidx, *top;
    float *pooled;
    void *work;
    char *mark, *loc;            /* stage-1 kept flags; rocketkv_mt: where each position was */
    int64_t scr_cap;
    /* the step just selected, for account() */
    int64_t st_np, st_pages;
    int st_est, st_rmw;
} rk_state;

static void rocketkv_free(void *state) {
    rk_state *s = state;
    if (!s) return;
    free(s->pos);
    free(s->kmin);
    free(s->kmax);
    free(s->dims);
    free(s->use_max);
    free(s->dscr);
    free(s->ps);
    free(s->grp);
    free(s->rank);
    free(s->slots);
    free(s->cidx);
    free(s->top);
    free(s->pooled);
    free(s->work);
    free(s->mark);
    free(s->loc);
    free(s);
}

static kvs_status rk_nomem(const rk_state *s) { return kvs_fail(KVS_ERR_NOMEM, "%s: out of memory", s->cfg.ops->name); }

/* Room for `need` resident slots and their pages at the current page size. */
static kvs_status pos_reserve(rk_state *s, int64_t need) {
    if (need > s->pos_cap) {
        int64_t cap = s->pos_cap ? s->pos_cap : 64;
        while (cap < need) cap *= 2;
        int32_t *p = realloc(s->pos, (size_t)cap * sizeof *p);
        if (!p) return rk_nomem(s);
        s->pos = p;
        int32_t *sl = realloc(s->slots, (size_t)cap * sizeof *sl);
        if (!sl) return rk_nomem(s);
        s->slots = sl;
        s->pos_cap = cap;
    }
    int64_t pages = (need + s->prm.page - 1) / s->prm.page;
    if (pages > s->pg_cap) {
        int64_t cap = s->pg_cap ? s->pg_cap : 64;
        while (cap < pages) cap *= 2;
        size_t rows = (size_t)cap * (size_t)s->d;
        float *mn = realloc(s->kmin, rows * sizeof *mn);
        if (!mn) return rk_nomem(s);
        s->kmin = mn;
        float *mx = realloc(s->kmax, rows * sizeof *mx);
        if (!mx) return rk_nomem(s);
        s->kmax = mx;
        double *ps = realloc(s->ps, (size_t)cap * sizeof *ps);
        if (!ps) return rk_nomem(s);
        s->ps = ps;
        double *grp = realloc(s->grp, (size_t)cap * sizeof *grp);
        if (!grp) return rk_nomem(s);
        s->grp = grp;
        int32_t *rank = realloc(s->rank, (size_t)cap * sizeof *rank);
        if (!rank) return rk_nomem(s);
        s->rank = rank;
        s->pg_cap = cap;
    }
    return KVS_OK;
}

/* The page maxima: with pages of one key the minimum is the maximum (one copy of the key, kmin). */
static float *kmax_rows(const rk_state *s) { return s->prm.page == 1 ? s->kmin : s->kmax; }

static kvs_status scratch_reserve(rk_state *s, int64_t n) {
    if (n <= s->scr_cap) return KVS_OK;
    free(s->cidx);
    free(s->top);
    free(s->pooled);
    free(s->work);
    free(s->mark);
    free(s->loc);
    s->cidx = malloc((size_t)n * sizeof(int32_t));
    s->top = malloc((size_t)n * sizeof(int32_t));
    s->pooled = malloc((size_t)n * sizeof(float));
    s->work = malloc(kvs_attn_colsum_scratch_bytes(n));
    s->mark = malloc((size_t)n);
    s->loc = malloc((size_t)n);
    int ok = s->cidx && s->top && s->pooled && s->work && s->mark && s->loc;
    s->scr_cap = ok ? n : 0;
    return ok ? KVS_OK : rk_nomem(s);
}

kvs_status kvs_rocketkv_create(kvs_rocketkv_variant v, const kvs_policy_init *init, void **state) {
    rk_state *s = calloc(1, sizeof *s);
    if (!s) return kvs_fail(KVS_ERR_NOMEM, "%s: out of memory", init->cfg->ops->name);
    s->model = *init->model;
    s->cfg = *init->cfg;
    s->mode = v;
    if (v != KVS_ROCKETKV_HSA) {
        s->window = (int)kvs_policy_param_get(init->cfg, "window");
        s->kernel = (int)kvs_policy_param_get(init->cfg, "kernel");
    }
    s->group = init->model->group;
    s->d = init->model->head_dim;
    s->scale = init->model->scale;
    s->budget = init->budget;
    kvs_rocketkv_params raw;
    rk_params(s->mode, &s->cfg, &s->model, s->budget, s->model.prompt_len > 0 ? s->model.prompt_len : 1, &raw, &s->prm);
    size_t d = (size_t)s->d;
    s->dims = malloc(d * sizeof *s->dims);
    s->use_max = malloc(d);
    s->dscr = malloc(d * sizeof *s->dscr);
    kvs_status st = s->dims && s->use_max && s->dscr ? pos_reserve(s, 64) : rk_nomem(s);
    if (st != KVS_OK) {
        rocketkv_free(s);
        return st;
    }
    *state = s;
    return KVS_OK;
}

/* Rebuilds every page summary over the device set (keys read from the view: every device position is stored). */
static void rebuild_pages(rk_state *s, const float *k) {
    size_t d = (size_t)s->d;
    int64_t P = s->prm.page;
    for (int64_t j = 0; j < s->cnt; j++) {
        size_t pg = (size_t)(j / P);
        kvs_page_minmax_add(s->kmin + pg * d, kmax_rows(s) + pg * d, k + (size_t)s->pos[j] * d, d, j % P == 0);
    }
}

/* Stage 1 over the candidates cidx[0..nc) (ascending; the window = the turn's last w prompt positions, the last
 * w candidates): writes the kept positions, ascending, to s->pos and sets s->cnt. */
static void stage1(rk_state *s, const kvs_policy_view *view, int64_t nc, int64_t n_new) {
    int64_t bp = s->prm.prompt_budget;
    if (nc <= bp || (s->first > 0 && nc <= s->budget)) { /* nothing to evict (header "Sliding-window layers") */
        memcpy(s->pos, s->cidx, (size_t)nc * sizeof(int32_t));
        s->cnt = nc;
        return;
    }
    int64_t w = s->window < n_new ? s->window : n_new;
    if (bp <= w) { /* the window alone fills the prompt budget: its last B_p positions */
        memcpy(s->pos, s->cidx + nc - bp, (size_t)bp * sizeof(int32_t));
        s->cnt = bp;
        return;
    }
    kvs_attn_src src = {.q = view->q, .q_first = view->q_first, .n_q = view->n_q, .group = s->group, .d = s->d,
                        .scale = s->scale, .keys = view->k, .idx = s->cidx, .n_cand = nc};
    kvs_snapkv_opts so = {.window = w, .kernel = s->kernel, .pool = KVS_POOL_MAX, .head_first = 0,
                          .n_heads = s->group, .reduce = KVS_GQA_SUM};
    int64_t m = kvs_policy_snapkv_scores(view, &src, &so, s->pooled, s->work);
    KVS_ASSERT(m == nc - w);
    int64_t k = bp - w;
    kvs_topk(s->pooled, (size_t)m, (size_t)k, s->top);
    memset(s->mark, 0, (size_t)m);
    for (int64_t j = 0; j < k; j++) s->mark[s->top[j]] = 1;
    int64_t out = 0;
    for (int64_t j = 0; j < m; j++)
        if (s->mark[j]) s->pos[out++] = s->cidx[j];
    for (int64_t j = m; j < nc; j++) s->pos[out++] = s->cidx[j];
    s->cnt = out;
}

static kvs_status rocketkv_prefill(void *state, const kvs_policy_view *view) {
    rk_state *s = state;
    /* the turn's new prompt positions inside the window (all of them on a full-attention layer) */
    int64_t n = view->n, first = view->turn_begin > s->first ? view->turn_begin : s->first, n_new = n - first;
    if (view->n - view->turn_begin <= 0) return KVS_OK;
    if (n_new < 0) { /* the whole turn's prompt before the window (never: the window holds the prompt's end) */
        n_new = 0;
        first = n;
    }
    /* the live device set moves down to slot 0 (the pages are rebuilt below) */
    if (s->base > 0) {
        memmove(s->pos, s->pos + s->base, (size_t)(s->cnt - s->base) * sizeof(int32_t));
        s->cnt -= s->base;
        s->base = 0;
    }
    kvs_rocketkv_params raw;
    rk_params(s->mode, &s->cfg, &s->model, s->budget, n, &raw, &s->prm);
    kvs_status st = scratch_reserve(s, n);
    if (st == KVS_OK) st = pos_reserve(s, n + 1);
    if (st != KVS_OK) return st;
    /* candidates: hsa and rocketkv_mt every position; rocketkv the retained ones + the new prompt */
    int64_t nc = 0;
    if (s->mode == KVS_ROCKETKV_TWO_STAGE) {
        memcpy(s->cidx, s->pos, (size_t)s->cnt * sizeof(int32_t));
        nc = s->cnt;
        for (int64_t p = first; p < n; p++) s->cidx[nc++] = (int32_t)p;
    } else {
        for (int64_t p = s->first; p < n; p++) s->cidx[nc++] = (int32_t)p;
    }
    if (s->mode == KVS_ROCKETKV_HSA) {
        memcpy(s->pos, s->cidx, (size_t)nc * sizeof(int32_t));
        s->cnt = nc;
    } else if (s->mode == KVS_ROCKETKV_MT) {
        /* where each position was before: 1 = device, 2 = host, 3 = the new prompt (computed on the device) */
        memset(s->loc, 2, (size_t)n);
        memset(s->loc, 0, (size_t)(s->first < n ? s->first : n)); /* gone with the window: nowhere */
        for (int64_t j = 0; j < s->cnt; j++) s->loc[s->pos[j]] = 1;
        for (int64_t p = first; p < n; p++) s->loc[p] = 3;
        stage1(s, view, nc, n_new);
        int64_t h2d = 0, d2h = 0;
        for (int64_t j = 0; j < s->cnt; j++) {
            h2d += s->loc[s->pos[j]] == 2;
            s->loc[s->pos[j]] = 0;
        }
        for (int64_t p = 0; p < n; p++) d2h += s->loc[p] == 1 || s->loc[p] == 3;
        s->pend_h2d += h2d;
        s->pend_d2h += d2h;
    } else {
        stage1(s, view, nc, n_new);
    }
    s->seen = n;
    if ((st = pos_reserve(s, s->cnt + 1)) != KVS_OK) return st; /* pages at this turn's page size */
    rebuild_pages(s, view->k);
    return KVS_OK;
}

static kvs_status rocketkv_select(void *state, const kvs_policy_view *view, kvs_policy_sel *sel) {
    rk_state *s = state;
    int32_t p = (int32_t)(view->n - 1);
    kvs_status st = pos_reserve(s, s->cnt + 1);
    if (st != KVS_OK) return st;
    KVS_ASSERT(s->cnt == s->base || s->pos[s->cnt - 1] < p);
    size_t d = (size_t)s->d;
    int64_t P = s->prm.page, slot = s->cnt;
    s->pos[s->cnt++] = p;
    s->seen = view->n;
    /* a key opens its page, or the window's oldest live page when every older slot of it left */
    kvs_page_minmax_add(s->kmin + (size_t)(slot / P) * d, kmax_rows(s) + (size_t)(slot / P) * d, view->k + (size_t)p * d, d,
                        slot % P == 0 || slot == s->base);
    int64_t np = s->cnt - s->base, pages = (s->cnt + P - 1) / P, fp = s->base / P;
    s->st_np = np;
    s->st_pages = pages - fp;
    s->st_rmw = P >= 2 && slot % P != 0 && slot != s->base;
    s->st_est = s->first > 0 ? np > s->budget : np > s->prm.k2;
    if (!s->st_est) { /* every resident token fits the attention quota: nothing to estimate */
        memcpy(sel->idx[0], s->pos + s->base, (size_t)np * sizeof(int32_t));
        sel->n[0] = np;
        return KVS_OK;
    }
    if (s->first > 0) { /* the live pages fp.., the oldest holding its slots from base */
        size_t k1 = (size_t)s->prm.k1, live = (size_t)(pages - fp);
        kvs_qdims_topk(view->q, (size_t)s->group, d, k1, s->dims, s->use_max, s->dscr);
        memset(s->grp, 0, live * sizeof *s->grp);
        for (int g = 0; g < s->group; g++) {
            const float *q = view->q + (size_t)g * d;
            kvs_page_scores(q, s->dims, k1, s->use_max, s->kmin + (size_t)fp * d, kmax_rows(s) + (size_t)fp * d, d, live,
                            s->ps);
            kvs_page_softmax_add_span(s->ps, (size_t)P, (size_t)s->base, (size_t)s->cnt,
                                      kvs_sparq_temperature(q, s->dims, k1, d), s->grp);
        }
        int64_t k = kvs_page_select_span(s->grp, (size_t)P, (size_t)s->base, (size_t)s->cnt, (size_t)s->prm.k2, 0,
                                         s->slots, s->rank);
        for (int64_t j = 0; j < k; j++) sel->idx[0][j] = s->pos[s->slots[j]];
        sel->n[0] = k;
        return KVS_OK;
    }
    size_t k1 = (size_t)s->prm.k1;
    kvs_qdims_topk(view->q, (size_t)s->group, d, k1, s->dims, s->use_max, s->dscr);
    memset(s->grp, 0, (size_t)pages * sizeof *s->grp);
    for (int g = 0; g < s->group; g++) {
        const float *q = view->q + (size_t)g * d;
        kvs_page_scores(q, s->dims, k1, s->use_max, s->kmin, kmax_rows(s), d, (size_t)pages, s->ps);
        kvs_page_softmax_add(s->ps, (size_t)pages, (size_t)P, (size_t)np, kvs_sparq_temperature(q, s->dims, k1, d),
                             s->grp);
    }
    int64_t k = kvs_page_select(s->grp, (size_t)pages, (size_t)P, (size_t)np, (size_t)s->prm.k2, s->slots, s->rank);
    for (int64_t j = 0; j < k; j++) sel->idx[0][j] = s->pos[s->slots[j]];
    sel->n[0] = k;
    return KVS_OK;
}

static int64_t rocketkv_stored(void *state, int g, int32_t *out) {
    rk_state *s = state;
    (void)g;
    memcpy(out, s->pos + s->base, (size_t)(s->cnt - s->base) * sizeof(int32_t));
    return s->cnt - s->base;
}

/* rocketkv_mt: the device set and the host store, i.e. every position seen. */
static int64_t rocketkv_readable(void *state, int g, int32_t *out) {
    rk_state *s = state;
    (void)g;
    if (s->mode != KVS_ROCKETKV_MT) return rocketkv_stored(state, g, out);
    int64_t m = 0;
    for (int64_t p = s->first; p < s->seen; p++) out[m++] = (int32_t)p;
    return m;
}

/* The host's eviction (header "Sliding-window layers"): the device set's oldest slots and the host store's oldest
 * positions leave at once. */
kvs_status kvs_rocketkv_window_evict(void *state, int64_t first) {
    rk_state *s = state;
    if (first <= s->first) return KVS_OK;
    s->first = first;
    while (s->base < s->cnt && s->pos[s->base] < first) s->base++;
    return KVS_OK;
}

/* Cost model v2 (header "Storage and traffic"); KV storage and the attended reads stay the engine's default. */
static void rocketkv_account(void *state, const kvs_policy_view *view, const kvs_policy_sel *sel, kvs_policy_cost *out) {
    rk_state *s = state;
    (void)view;
    (void)sel;
    double kb = s->model.kv_bytes, d = s->d, pages = (double)s->st_pages;
    int paged = s->prm.page >= 2;
    out->aux_bytes = (paged ? 2.0 * d * pages : d * (double)s->st_np) * kb;
    out->read_aux_bytes = (s->st_est ? (double)s->prm.k1 * (paged ? pages : (double)s->st_np) : 0) * kb;
    if (s->st_rmw) out->read_aux_bytes += 2.0 * d * kb;
    out->read_aux_unfused_bytes = out->read_aux_bytes;
    out->write_bytes += (paged ? 2.0 * d : d) * kb;
    out->transient_bytes = s->st_est ? (double)(s->group + 1) * pages * s->model.aux_bytes : 0;
    if (s->mode == KVS_ROCKETKV_MT) {
        int64_t live_seen = s->seen - (s->first < s->seen ? s->first : s->seen);
        out->host_bytes = kvs_policy_kv_bytes(&s->model, (double)(live_seen - (s->cnt - s->base)));
        out->h2d_bytes = kvs_policy_kv_bytes(&s->model, (double)s->pend_h2d);
        out->d2h_bytes = kvs_policy_kv_bytes(&s->model, (double)s->pend_d2h);
        s->pend_h2d = s->pend_d2h = 0;
    }
}

static kvs_status rocketkv_validate(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget) {
    return kvs_rocketkv_validate(KVS_ROCKETKV_TWO_STAGE, cfg, m, budget);
}
static int rocketkv_notes(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget, char *buf, size_t cap) {
    return kvs_rocketkv_notes(KVS_ROCKETKV_TWO_STAGE, cfg, m, budget, buf, cap);
}
static kvs_status rocketkv_create(const kvs_policy_init *init, void **state) {
    return kvs_rocketkv_create(KVS_ROCKETKV_TWO_STAGE, init, state);
}

const struct kvs_policy_ops kvs_policy_rocketkv = {
    .version = KVS_POLICY_INTERFACE_VERSION,
    .name = "rocketkv",
    .summary = "RocketKV: SnapKV prompt eviction (group sum, kernel 63) + hybrid sparse attention (page min/max, "
               "top-k1 dims); t = B counts the estimate, k2 = B/2 attended",
    .is_oracle = 0,
    .granularity = KVS_SEL_PER_KV_HEAD,
    .budget_scope = KVS_BUDGET_EVERY_STEP,
    .params = rocketkv_params,
    .n_params = (int)(sizeof rocketkv_params / sizeof rocketkv_params[0]),
    .presets = rocketkv_presets,
    .n_presets = (int)(sizeof rocketkv_presets / sizeof rocketkv_presets[0]),
    .validate = rocketkv_validate,
    .notes = rocketkv_notes,
    .create = rocketkv_create,
    .free = rocketkv_free,
    .prefill = rocketkv_prefill,
    .select = rocketkv_select,
    .stored = rocketkv_stored,
    .readable = rocketkv_readable,
    .account = rocketkv_account,
    .window_evict = kvs_rocketkv_window_evict,
};
