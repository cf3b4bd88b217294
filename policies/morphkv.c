/* morphkv.c — MorphKV, "Dialogue Without Limits: Constant-Sized KV Caches for Extended Responses in LLMs"
 * (ICML'25, ../shared/papers/morphkv.txt §3.1-3.3, Algorithm 1, Eqs. 4-7, Fig. 5, §4-6), as specified in
 * ../shared/POLICY_SPEC.md §2.1, §3 (storage/traffic row) and §8 item 1.
 *
 * A constant-size cache per KV head: the R most recent tokens plus the C = C_tot - R older ("distant") tokens
 * that the R recent queries attended to most. Each decode step, evict-then-attend (spec §2.1 steps 1-8):
 *  1. append the current token p;
 *  2. trigger: when the resident count n_r >= evict_after * (C_tot + 1), compress to C_tot + 1;
 *  3. window W_t = {p-R, ..., p-1} (always resident) and the current token are protected; the candidates are
 *     the resident tokens older than p-R;
 *  4. group scores of each window row r (GQA: SUM over the G query heads of the KV head, Algorithm 1; MHA is
 *     the same with G = 1: one selection per head):
 *       fidelity=paper (default): S_r[j] = sum_g AW_r^g[j], the probabilities as recorded at step r;
 *       fidelity=ref:   S_r[j] = softmax over the candidates of sum_g z_r^g[j], z = the raw logits (the
 *                       reference code renormalises over the candidates and sums logits, not probabilities);
 *  5. fuse: F[j] = sum_r S_r[j] (fusion=sum, Eq. 5) or max_r S_r[j] (fusion=max, Eq. 6);
 *  6. keep TOP_C(F) (ties: the older token, spec §1.4) with the protected tokens; evict the others and delete
 *     their columns from every profile row;
 *  7. attend to the resident set (shared by the group's query heads);
 *  8. record the row of q_p over the attend set (probabilities; logits in ref mode), dropping the oldest row
 *     once there are more than R.
 * Prefill keeps the whole prompt (the reference compresses only at the first decode step) and initialises the
 * profile rows from the last min(R, P) prompt queries (paper: causal softmax rows; ref: logits over every
 * resident key, no causal mask, as the reference — harmless, a window row's later columns are never
 * candidates). The first trigger thus compresses P + 1 tokens to C_tot + 1 in one shot.
 *
 * Decisions (what the paper/spec leave to us):
 *  - Budget. kvsim's budget B bounds the attended set, the current token included (sim/policy.h). MorphKV
 *    attends to C_tot + 1 tokens (its C_tot-token cache and the current token, spec §2.1 "Budget counting"),
 *    so C_tot = B - 1: `--budgets 601` is the paper's C_tot = 600, and at equal B MorphKV attends to as many
 *    tokens as every other policy. The cache holds B tokens between steps and B + 1 within a step (the evicted
 *    token's slot is reported as transient storage). With evict_after > 1 the cache grows between
 *    compressions; C_tot is then the largest value whose peak attended set still fits in B:
 *    max(C_tot + 1, ceil(evict_after (C_tot + 1)) - 1) <= B (kvs_morphkv_ctot()).
 *  - Defaults. The paper has no single setting: LongWriter R=30 sum, LongGenBench R=200 max, LongBench R=32
 *    sum (§5.1-5.3). The defaults are LongBench's (recent=32, fusion=sum): the paper's long-context setting,
 *    also its §6.1.1 and §6.3 ablation setting (R=32, sum), so the one most of its experiments share. The
 *    three settings are presets (@longwriter, @longgenbench, @longbench); their C_tot is a budget, never part
 *    of a preset: pass B = C_tot + 1. "4K"/"2K" are read as 4096/2048 (the paper writes "1K" where the
 *    reference's max capacity is 1024).
 *  - Scaling to a short trace. The paper's C_tot (600 to 4096) exceeds short traces (the bundled
 *    stories260K trace has 495 positions, prompt 239), where a run would never evict and R=200 would be most
 *    of the context. Rule: choose the budget for the trace like every other policy's (`--budgets 16,32,64` or
 *    a percentage of the prompt, `--budgets 25%`); with paper_ctot > 0 (each preset sets the paper's C_tot)
 *    and the run's C_tot below it, R is scaled by C_tot / paper_ctot (rounded, at least 1), keeping the
 *    paper's share of the cache for the recent window (5 % for LongWriter and LongGenBench, 1.6 % for
 *    LongBench). Where C_tot >= paper_ctot nothing changes. The scaled R is reported by notes(); the
 *    canonical string keeps the parameters as given. examples/morphkv.sh shows it on the bundled trace.
 *  - Fidelity. paper (default) and ref as above (spec §2.1 Δ-REF 1-2). REF_BUGCOMPAT (the reference's GQA
 *    path masking attention and profile columns with per-query-head selections while the KV is pruned with
 *    the group-summed one, spec Δ-REF 3, §8 1c) is not implemented: it looks like a defect, and this policy
 *    keeps one selection per KV head in both modes.
 *  - Profiles (auxiliary state, spec §2.1 Storage; §8 1a: the paper does not say whether its cache sizes
 *    include them, so they are reported apart, storage_aux_bytes beside storage_kv_bytes):
 *      profile=rows (default, the reference): R rows per query head over the resident tokens,
 *        G R (C_tot+1) values (G R / (2d) of the KV, spec G7);
 *      profile=qz: the R window queries and, in paper mode, each row's log-sum-exp Z: G R (d+1) values
 *        (G R d in ref mode, which renormalises and needs no Z); rows are recomputed when scoring as
 *        AW_r^g[j] = exp(scale q_{r,g}.k_j - Z_r^g) (ref: the logits), from the keys of resident tokens only.
 *    Both store b_aux-byte elements (the model's aux_bytes). With no distant slot (R >= C_tot) nothing is
 *    ever scored and no profile is kept.
 *  - Costs per step (account()): KV = the resident slots (the default); aux as above; aux reads only at
 *    steps that score: rows: the candidates' columns of the G R rows, G R (C_tot - R + 1) values in the
 *    steady state (POLICY_SPEC §3 counts whole rows, G R (C_tot+1); the window's own columns are never
 *    candidates, so they are not read); qz: the G R (d+1) queries and Z plus, fused, the keys of the evicted
 *    tokens (attention reads the others), or unfused every candidate key; writes: the new token's K/V plus the new profile row (G (C_tot+1) values,
 *    or G (d+1)); transient: the evicted tokens' K/V (resident until the eviction) and the fused score
 *    vector (plus one row buffer when the row is renormalised or recomputed).
 *  - Multi-turn: a later turn's prompt is appended to the resident cache uncompressed, its last min(R, P)
 *    queries push their rows into the same ring (rows of earlier positions stay: the window is the last R
 *    positions, whichever phase produced them) and the turn's first decode step compresses.
 *  - Ties and precision: profiles are fp32 (paper: the engine's probabilities as computed; ref: the logits);
 *    group scores, the ref candidate softmax (kvs_softmax_f64: the reference's max-subtracted exponent in fp64)
 *    and the fused scores are fp64; TOP_C ranks fp64 scores, the older token first among equals. The ref
 *    softmax is fp64, not fp32, because fp32 exp returns 0 below about -87.3: candidates that far below a row's
 *    best all tied at 0 and the tie rule evicted a newer one that the fp64 reading ranks above an older one
 *    (fp64 exp underflows only below about -745, out of reach of real logit gaps).
 * Sliding-window layers (sim/replay.h): the host's window_evict names the first position the next step can attend;
 * the residents before it leave the resident set and their columns leave every profile row, at the start of a
 * prefill, or in observe after this step's row is recorded (the row is aligned with the step's selection). The
 * profile rows themselves stay: a row is a recent QUERY's attention, still one of the last R queries whatever the
 * window, and only its columns of positions the window keeps remain (profile=qz recomputes those from the resident
 * keys; its Z is the row's attention as it was computed). A prefill appends no position before the window and its
 * window rows' visible counts start there. The next compression (select, evict-then-attend) ranks only the window's
 * positions, so MorphKV never spends an eviction on a position the window drops, and B >= the window W never
 * compresses: it holds exactly the window.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../common/kvs_math.h"
#include "held.h"
#include "morphkv_internal.h"
#include "registry.h"

static const kvs_policy_param morphkv_params[] = {
    {.key = "recent", .type = KVS_PARAM_INT, .def = 32, .lo = 1, .hi = 1 << 20,
     .help = "R: recent window (window queries and protected recent tokens); 32 = the paper's LongBench setting"},
    {.key = "fusion", .type = KVS_PARAM_ENUM, .def = KVS_MORPHKV_SUM, .choices = "sum|max",
     .help = "fusion of the window rows' scores: sum (Eq. 5) or max (Eq. 6)"},
    {.key = "fidelity", .type = KVS_PARAM_ENUM, .def = KVS_MORPHKV_PAPER, .choices = "paper|ref",
     .help = "paper: group-summed probabilities as recorded; ref: group-summed logits, softmax over the candidates"},
    {.key = "profile", .type = KVS_PARAM_ENUM, .def = KVS_MORPHKV_ROWS, .choices = "rows|qz",
     .help = "profile store: rows (G R (C_tot+1) values) or window queries + log-sum-exp (G R (d+1)), recomputed"},
    {.key = "evict_after", .type = KVS_PARAM_DOUBLE, .def = 1.0, .lo = 1.0, .hi = 64.0,
     .help = "compress when the cache reaches evict_after (C_tot+1) tokens (reference -ea; C_tot shrinks to fit B)"},
    {.key = "paper_ctot", .type = KVS_PARAM_INT, .def = 0, .lo = 0, .hi = 1 << 30,
     .help = "C_tot the paper used with `recent`: a smaller run's C_tot scales R by C_tot/paper_ctot; 0 = never"},
};

static const kvs_policy_preset morphkv_presets[] = {
    {.name = "longwriter", .params = "recent=30,fusion=sum,paper_ctot=600",
     .help = "MorphKV §5.1 LongWriter: R=30, sum, C_tot=600 (--budgets 601; R scales with smaller budgets)"},
    {.name = "longgenbench", .params = "recent=200,fusion=max,paper_ctot=4096",
     .help = "MorphKV §5.2 LongGenBench: R=200, max, C_tot=4K (--budgets 4097; R scales with smaller budgets)"},
    {.name = "longbench", .params = "recent=32,fusion=sum,paper_ctot=2048",
     .help = "MorphKV §5.3 LongBench: R=32, sum, C_tot=2K (--budgets 2049; R scales with smaller budgets)"},
};

/* ---- scoring and sizing (morphkv_internal.h) ------------------------------------------------------ */

void kvs_morphkv_fuse(int fidelity, int fusion, const float *vals, int64_t stride, int n_rows, int group,
                      int64_t n_cand, double *F, double *scratch) {
    for (int64_t j = 0; j < n_cand; j++) F[j] = 0;
    if (n_cand <= 0) return;
    for (int r = 0; r < n_rows; r++) {
        const float *row0 = vals + (size_t)r * (size_t)group * (size_t)stride;
        if (fidelity == KVS_MORPHKV_REF) {
            /* the reference's softmax (max-subtracted exponent) read in fp64: exp(z - max) underflows only for a
             * candidate more than ~745 below the row's best, where fp32 (kvs_softmax) gave 0 below ~-87 and
             * every such candidate tied at 0, leaving the eviction to the tie rule */
            for (int64_t j = 0; j < n_cand; j++) {
                double z = 0;
                for (int g = 0; g < group; g++) z += row0[(size_t)g * (size_t)stride + (size_t)j];
                scratch[j] = z;
            }
            kvs_softmax_f64(scratch, (size_t)n_cand);
        }
        for (int64_t j = 0; j < n_cand; j++) {
            double sr;
            if (fidelity == KVS_MORPHKV_REF) {
                sr = scratch[j];
            } else {
                sr = 0;
                for (int g = 0; g < group; g++) sr += row0[(size_t)g * (size_t)stride + (size_t)j];
            }
            if (fusion == KVS_MORPHKV_SUM) F[j] += sr;
            else if (sr > F[j]) F[j] = sr; /* scores are >= 0, so F = 0 is the identity of max */
        }
    }
}

/* The smallest resident count that triggers a compression to c = C_tot + 1 tokens (the same expression as
 * the trigger test in morphkv_select()). */
static double trigger_count(double evict_after, int64_t c) { return ceil(evict_after * (double)c); }

int64_t kvs_morphkv_ctot(int64_t budget, double evict_after) {
    if (budget < 1) return -1;
    int64_t c = budget;
    double cap = floor((double)(budget + 1) / evict_after) + 1; /* larger c always break the peak rule */
    if (cap < (double)c) c = (int64_t)cap;
    for (; c >= 1; c--)
        if (trigger_count(evict_after, c) - 1 <= (double)budget) return c - 1;
    return -1;
}

int64_t kvs_morphkv_recent(int64_t recent, int64_t paper_ctot, int64_t ctot) {
    if (paper_ctot <= 0 || ctot >= paper_ctot) return recent;
    int64_t r = llround((double)recent * (double)ctot / (double)paper_ctot);
    return r < 1 ? 1 : r;
}

/* ---- state ---------------------------------------------------------------------------------------- */

typedef struct {
    kvs_policy_model model;
    int64_t ctot, R;         /* C_tot and the recent window in use */
    double evict_after;
    int fusion, fidelity, profile, group, d;
    float scale;
    int scoring;             /* C_tot > R: distant slots exist, so profiles are kept and scored */
    /* resident set: ascending positions; score = the fused score F of the candidates at a compression (TOP_C,
     * Eq. 7, is the held list's keep-the-top rule: the older token among equals) */
    kvs_held *held;
    int64_t cap;             /* residents the held list, the profile rows and the scratch have room for */
    /* profile ring: R rows (one per window query), slots 0..ring_n-1 valid */
    float *prof;             /* profile=rows: [R][group][cap] over the resident index (paper: probabilities,
                              * ref: logits); columns appended after a row was recorded hold 0 / -inf */
    float *qz_q;             /* profile=qz: [R][group][d] window queries */
    float *qz_z;             /* profile=qz: [R][group] log-sum-exp of each row (paper mode) */
    int ring_n, ring_head;   /* rows held; the slot the next row overwrites once the ring is full */
    /* scratch, capacity cap */
    float *tmp;
    float *vals;             /* profile=qz: [R][group][cap] recomputed candidate rows */
    double *ftmp;            /* [cap] fidelity=ref: one window row's candidate softmax (fp64) */
    char *keep;              /* the residents a compression keeps */
    /* the step just selected, for account() */
    int64_t step_nr, step_nd;
    int step_scored, step_rows;
    int64_t win_first;       /* positions before it were evicted by the host (sliding-window layer); 0 otherwise */
} morph_state;

static int64_t cfg_ctot(const kvs_policy_config *cfg, int64_t budget) {
    return kvs_morphkv_ctot(budget, kvs_policy_param_get(cfg, "evict_after"));
}

static int64_t cfg_recent(const kvs_policy_config *cfg, int64_t ctot) {
    return kvs_morphkv_recent((int64_t)kvs_policy_param_get(cfg, "recent"),
                              (int64_t)kvs_policy_param_get(cfg, "paper_ctot"), ctot);
}

static float fill_value(const morph_state *s) { return s->fidelity == KVS_MORPHKV_REF ? -INFINITY : 0.0f; }

static void morphkv_free(void *state) {
    morph_state *s = state;
    if (!s) return;
    kvs_held_free(s->held);
    free(s->prof);
    free(s->qz_q);
    free(s->qz_z);
    free(s->tmp);
    free(s->ftmp);
    free(s->vals);
    free(s->keep);
    free(s);
}

/* Re-lays out every per-resident array for capacity `cap` (>= cnt): grows for a prompt, shrinks after the
 * first compression so a long prompt does not pin its profile memory. */
static kvs_status relayout(morph_state *s, int64_t cap) {
    int64_t cnt = kvs_held_count(s->held);
    KVS_ASSERT(cap >= cnt);
    if (kvs_held_resize(s->held, cap) != KVS_OK) return kvs_fail(KVS_ERR_NOMEM, "morphkv: out of memory");
    float *tmp = malloc((size_t)cap * sizeof *tmp);
    double *ftmp = malloc((size_t)cap * sizeof *ftmp);
    char *keep = malloc((size_t)cap);
    float *prof = NULL, *vals = NULL;
    size_t rows = (size_t)s->R * (size_t)s->group;
    int ok = tmp && ftmp && keep;
    if (ok && s->scoring && s->profile == KVS_MORPHKV_ROWS) ok = (prof = malloc(rows * (size_t)cap * sizeof *prof)) != NULL;
    if (ok && s->scoring && s->profile == KVS_MORPHKV_QZ) ok = (vals = malloc(rows * (size_t)cap * sizeof *vals)) != NULL;
    if (!ok) {
        free(tmp);
        free(ftmp);
        free(keep);
        free(prof);
        free(vals);
        return kvs_fail(KVS_ERR_NOMEM, "morphkv: out of memory");
    }
    if (prof && s->prof)
        for (size_t r = 0; r < (size_t)s->ring_n * (size_t)s->group; r++)
            memcpy(prof + r * (size_t)cap, s->prof + r * (size_t)s->cap, (size_t)cnt * sizeof *prof);
    free(s->tmp);
    free(s->ftmp);
    free(s->keep);
    free(s->prof);
    free(s->vals);
    s->tmp = tmp;
    s->ftmp = ftmp;
    s->keep = keep;
    s->prof = prof;
    s->vals = vals;
    s->cap = cap;
    return KVS_OK;
}

static kvs_status reserve(morph_state *s, int64_t need) {
    if (need <= s->cap) return KVS_OK;
    int64_t cap = s->cap * 2;
    if (cap < need) cap = need;
    return relayout(s, cap);
}

static kvs_status morphkv_create(const kvs_policy_init *init, void **state) {
    morph_state *s = calloc(1, sizeof *s);
    if (!s) return kvs_fail(KVS_ERR_NOMEM, "morphkv: out of memory");
    s->model = *init->model;
    s->ctot = cfg_ctot(init->cfg, init->budget);
    KVS_ASSERT(s->ctot >= 0); /* validate() rejected budgets too small for evict_after */
    s->R = cfg_recent(init->cfg, s->ctot);
    s->evict_after = kvs_policy_param_get(init->cfg, "evict_after");
    s->fusion = (int)kvs_policy_param_get(init->cfg, "fusion");
    s->fidelity = (int)kvs_policy_param_get(init->cfg, "fidelity");
    s->profile = (int)kvs_policy_param_get(init->cfg, "profile");
    s->group = init->model->group;
    s->d = init->model->head_dim;
    s->scale = init->model->scale;
    s->scoring = s->ctot > s->R;
    kvs_status st = (s->held = kvs_held_create(1)) ? KVS_OK : kvs_fail(KVS_ERR_NOMEM, "morphkv: out of memory");
    if (st == KVS_OK && s->scoring && s->profile == KVS_MORPHKV_QZ) {
        s->qz_q = malloc((size_t)s->R * (size_t)s->group * (size_t)s->d * sizeof *s->qz_q);
        s->qz_z = malloc((size_t)s->R * (size_t)s->group * sizeof *s->qz_z);
        if (!s->qz_q || !s->qz_z) st = kvs_fail(KVS_ERR_NOMEM, "morphkv: out of memory");
    }
    /* room for the steady state (grown by doubling for a longer prompt, and up to a large budget) */
    if (st == KVS_OK) st = relayout(s, s->ctot + 2 < 1024 ? s->ctot + 2 : 1024);
    if (st != KVS_OK) {
        morphkv_free(s);
        return st;
    }
    *state = s;
    return KVS_OK;
}

/* Appends position p to the resident set; every recorded profile row gets the "appended later" value. */
static void append(morph_state *s, int32_t p) {
    size_t cnt = (size_t)kvs_held_count(s->held);
    KVS_ASSERT((int64_t)cnt < s->cap);
    if (s->prof) {
        float fv = fill_value(s);
        for (size_t r = 0; r < (size_t)s->ring_n * (size_t)s->group; r++) s->prof[r * (size_t)s->cap + cnt] = fv;
    }
    kvs_held_push(s->held, p);
}

/* The ring slot for the row of a new window query (the oldest row is dropped once R are held). */
static int ring_push(morph_state *s) {
    if (s->ring_n < s->R) return s->ring_n++;
    int slot = s->ring_head;
    s->ring_head = (s->ring_head + 1) % (int)s->R;
    return slot;
}

/* Records the profile row of query q_row ([group][d], position qp) over the resident set: `vis` leading
 * residents are visible to it (causal), `probs` (NULL in prefill) the probabilities the engine computed over
 * all cnt residents. */
static void record_row(morph_state *s, const float *q_row, const float *k, int64_t vis, const float *const *probs) {
    int slot = ring_push(s);
    size_t d = (size_t)s->d, cnt = (size_t)kvs_held_count(s->held);
    const int32_t *pos = kvs_held_pos(s->held);
    for (int g = 0; g < s->group; g++) {
        const float *q = q_row + (size_t)g * d;
        if (s->profile == KVS_MORPHKV_ROWS) {
            float *row = s->prof + ((size_t)slot * (size_t)s->group + (size_t)g) * (size_t)s->cap;
            if (s->fidelity == KVS_MORPHKV_REF) {
                /* raw logits over every resident key (the reference's prefill rows are not causally masked) */
                kvs_attn_scores(q, k, d, pos, cnt, d, s->scale, row);
            } else if (probs) {
                memcpy(row, probs[g], cnt * sizeof *row);
            } else {
                kvs_attn_scores(q, k, d, pos, (size_t)vis, d, s->scale, row);
                kvs_softmax(row, (size_t)vis);
                for (size_t j = (size_t)vis; j < cnt; j++) row[j] = 0;
            }
        } else {
            size_t rg = (size_t)slot * (size_t)s->group + (size_t)g;
            memcpy(s->qz_q + rg * d, q, d * sizeof *q);
            if (s->fidelity == KVS_MORPHKV_PAPER) {
                kvs_attn_scores(q, k, d, pos, (size_t)vis, d, s->scale, s->tmp);
                s->qz_z[rg] = (float)kvs_softmax(s->tmp, (size_t)vis);
            }
        }
    }
}

static void compact(morph_state *s);

/* Drops the residents before s->win_first (the host's window evictions) and their profile columns. */
static void drop_before(morph_state *s) {
    int64_t cnt = kvs_held_count(s->held), k = 0;
    const int32_t *pos = kvs_held_pos(s->held);
    while (k < cnt && pos[k] < s->win_first) k++;
    if (k == 0) return;
    memset(s->keep, 0, (size_t)k);
    memset(s->keep + k, 1, (size_t)(cnt - k));
    compact(s);
}

static kvs_status morphkv_prefill(void *state, const kvs_policy_view *view) {
    morph_state *s = state;
    drop_before(s);
    int64_t begin = view->turn_begin > s->win_first ? view->turn_begin : s->win_first; /* no position before it */
    int64_t n_new = view->n - begin, old = kvs_held_count(s->held);
    if (n_new <= 0) return KVS_OK;
    kvs_status st = reserve(s, old + n_new + 1);
    if (st != KVS_OK) return st;
    for (int64_t p = begin; p < view->n; p++) append(s, (int32_t)p);
    if (!s->scoring) return KVS_OK;
    /* the last min(R, P) prompt queries initialise (or continue) the window rows, oldest first */
    int64_t w = n_new < s->R ? n_new : s->R;
    size_t Gd = (size_t)s->group * (size_t)s->d;
    for (int64_t qp = view->n - w; qp < view->n; qp++)
        record_row(s, view->q + (size_t)(qp - view->q_first) * Gd, view->k, old + (qp - begin) + 1, NULL);
    return KVS_OK;
}

/* Recomputes (profile=qz) the candidate columns [0, nd) of every window row into s->vals ([ring_n][group][nd]). */
static void qz_rows(morph_state *s, const float *k, int64_t nd) {
    size_t d = (size_t)s->d;
    for (size_t rg = 0; rg < (size_t)s->ring_n * (size_t)s->group; rg++) {
        float *row = s->vals + rg * (size_t)nd;
        kvs_attn_scores(s->qz_q + rg * d, k, d, kvs_held_pos(s->held), (size_t)nd, d, s->scale, row);
        if (s->fidelity == KVS_MORPHKV_PAPER)
            for (int64_t j = 0; j < nd; j++) row[j] = expf(row[j] - s->qz_z[rg]);
    }
}

/* Drops the residents with keep[j] = 0 from the resident set and from every profile row. */
static void compact(morph_state *s) {
    int64_t cnt = kvs_held_count(s->held);
    if (s->prof)
        for (size_t r = 0; r < (size_t)s->ring_n * (size_t)s->group; r++) {
            float *row = s->prof + r * (size_t)s->cap;
            int64_t m = 0;
            for (int64_t j = 0; j < cnt; j++)
                if (s->keep[j]) row[m++] = row[j];
        }
    kvs_held_compact(s->held, s->keep);
}

static kvs_status morphkv_select(void *state, const kvs_policy_view *view, kvs_policy_sel *sel) {
    morph_state *s = state;
    int32_t p = (int32_t)(view->n - 1);
    kvs_status st = reserve(s, kvs_held_count(s->held) + 1);
    if (st != KVS_OK) return st;
    append(s, p);
    int64_t nr = kvs_held_count(s->held), c = s->ctot + 1;
    const int32_t *pos = kvs_held_pos(s->held);
    s->step_nr = nr;
    s->step_nd = 0;
    s->step_scored = 0;
    s->step_rows = s->scoring ? s->ring_n : 0;
    if ((double)nr >= s->evict_after * (double)c && nr > c) {
        /* protected: the window W_t (positions >= p - R) and p, a suffix of the ascending resident list */
        int64_t nd = 0;
        while (nd < nr && pos[nd] < (int64_t)p - s->R) nd++;
        int64_t n_prot = nr - nd;
        if (n_prot >= c) {
            /* no distant slot left (R >= C_tot, or early steps): the newest c tokens, a window */
            nd = nr - c;
            memset(s->keep, 0, (size_t)nd);
            memset(s->keep + nd, 1, (size_t)c);
        } else {
            KVS_ASSERT(s->scoring && nd > c - n_prot);
            const float *vals = s->prof;
            int64_t stride = s->cap;
            if (s->profile == KVS_MORPHKV_QZ) {
                qz_rows(s, view->k, nd);
                vals = s->vals;
                stride = nd;
            }
            kvs_morphkv_fuse(s->fidelity, s->fusion, vals, stride, s->ring_n, s->group, nd, kvs_held_score(s->held),
                             s->ftmp);
            kvs_held_mark_top(s->held, 0, nd, c - n_prot, s->keep); /* the protected suffix kept */
            s->step_scored = 1;
            s->step_nd = nd;
        }
        compact(s);
        int64_t cnt = kvs_held_count(s->held);
        if (s->cap > 4 * (cnt + 1) && s->cap > 64 && (st = relayout(s, 2 * (cnt + 1))) != KVS_OK) return st;
    }
    sel->n[0] = kvs_held_copy(s->held, sel->idx[0]);
    return KVS_OK;
}

static kvs_status morphkv_observe(void *state, const kvs_policy_view *view, const kvs_policy_sel *sel,
                                  const float *const *probs) {
    morph_state *s = state;
    KVS_ASSERT(sel->n[0] == kvs_held_count(s->held));
    if (s->scoring) record_row(s, view->q, view->k, kvs_held_count(s->held), probs);
    drop_before(s); /* the window's evictions, after the row aligned with this step's selection */
    return KVS_OK;
}

/* Takes effect in the next prefill or observe (the resident set stays aligned with this step's selection). */
static kvs_status morphkv_window_evict(void *state, int64_t first) {
    morph_state *s = state;
    if (first > s->win_first) s->win_first = first;
    return KVS_OK;
}

static int64_t morphkv_stored(void *state, int g, int32_t *out) {
    morph_state *s = state;
    (void)g;
    return kvs_held_copy(s->held, out);
}

/* Cost model v2 (policy.h kvs_policy_cost; header "Costs per step"). KV storage and reads stay the
 * engine's default (the resident = attended slots). */
static void morphkv_account(void *state, const kvs_policy_view *view, const kvs_policy_sel *sel, kvs_policy_cost *out) {
    morph_state *s = state;
    (void)view;
    double ab = s->model.aux_bytes, kb = s->model.kv_bytes, G = s->group, d = s->d;
    double A = (double)sel->n[0], rows = s->step_rows, nd = (double)s->step_nd;
    double evicted = (double)(s->step_nr - sel->n[0]);
    double buffers = s->step_scored ? nd * (1.0 + (s->fidelity == KVS_MORPHKV_REF || s->profile == KVS_MORPHKV_QZ)) : 0;
    out->transient_bytes = kvs_policy_kv_bytes(&s->model, evicted) + buffers * ab;
    if (!s->scoring) return;
    if (s->profile == KVS_MORPHKV_ROWS) {
        out->aux_bytes = G * rows * A * ab;
        out->write_bytes += G * A * ab;
        if (s->step_scored) out->read_aux_bytes = out->read_aux_unfused_bytes = G * rows * nd * ab;
    } else {
        double per = d + (s->fidelity == KVS_MORPHKV_PAPER); /* the query, and Z in paper mode */
        out->aux_bytes = G * rows * per * ab;
        out->write_bytes += G * per * ab;
        if (s->step_scored) {
            out->read_aux_bytes = G * rows * per * ab + evicted * d * kb;
            out->read_aux_unfused_bytes = G * rows * per * ab + nd * d * kb;
        }
    }
}

/* ---- configuration checks ------------------------------------------------------------------------- */

static kvs_status morphkv_validate(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget) {
    (void)m;
    double ea = kvs_policy_param_get(cfg, "evict_after");
    if (cfg_ctot(cfg, budget) < 0) {
        int64_t need = (int64_t)trigger_count(ea, 1) - 1;
        return kvs_fail(KVS_ERR_INVALID_ARG, "policy morphkv: evict_after=%g needs a budget of at least %lld, got %lld",
                        ea, (long long)(need > 1 ? need : 1), (long long)budget);
    }
    return KVS_OK;
}

static int morphkv_notes(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget, char *buf, size_t cap) {
    (void)m;
    int64_t ctot = cfg_ctot(cfg, budget);
    if (ctot < 0) return 0; /* validate() rejects it */
    int64_t recent = (int64_t)kvs_policy_param_get(cfg, "recent"), R = cfg_recent(cfg, ctot);
    double ea = kvs_policy_param_get(cfg, "evict_after");
    int n = 0;
    if (R != recent)
        n += kvs_policy_note(buf, cap, "recent=%lld scaled to R=%lld for C_tot=%lld (paper_ctot=%lld)", (long long)recent,
                             (long long)R, (long long)ctot, (long long)kvs_policy_param_get(cfg, "paper_ctot"));
    if (R >= ctot)
        n += kvs_policy_note(buf, cap, "R=%lld leaves no distant slot in C_tot=%lld: a window of the last %lld positions",
                             (long long)R, (long long)ctot, (long long)(ctot + 1));
    if (ea > 1.0)
        n += kvs_policy_note(buf, cap, "evict_after=%g: C_tot=%lld, the cache grows back to the budget between "
                                       "compressions", ea, (long long)ctot);
    /* A trace too short to ever trigger: the trigger count is at most B + 1, so that is the engine's "budget at
     * least the trace's positions" note. */
    return n;
}

const struct kvs_policy_ops kvs_policy_morphkv = {
    .version = KVS_POLICY_INTERFACE_VERSION,
    .name = "morphkv",
    .summary = "MorphKV: R recent + the distant tokens the recent queries attended to most (constant cache)",
    .is_oracle = 0,
    .granularity = KVS_SEL_PER_KV_HEAD,
    .budget_scope = KVS_BUDGET_EVERY_STEP,
    .params = morphkv_params,
    .n_params = (int)(sizeof morphkv_params / sizeof morphkv_params[0]),
    .presets = morphkv_presets,
    .n_presets = (int)(sizeof morphkv_presets / sizeof morphkv_presets[0]),
    .validate = morphkv_validate,
    .notes = morphkv_notes,
    .create = morphkv_create,
    .free = morphkv_free,
    .prefill = morphkv_prefill,
    .select = morphkv_select,
    .observe = morphkv_observe,
    .stored = morphkv_stored,
    .window_evict = morphkv_window_evict,
    .account = morphkv_account,
};
