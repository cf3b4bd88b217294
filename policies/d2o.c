/* d2o.c — D2O, Dynamic Discriminative Operations (Wan et al., ICLR'25, ../shared/papers/d2o.txt §4, App. A.2-A.3),
 * as specified in ../shared/POLICY_SPEC.md §2.3, §3 (storage/traffic row), §5.3 (D4), §7 G4 and §8 item 3.
 *
 * Two levels (paper §4):
 *  - Layer level (§4.1, Eqs. 4-5), an allocation pass over the first turn's prompt of every layer: the density
 *    F_l of layer l's prefill attention, then alpha_l = L rho softmax_l(-F_l) and a cache of S_l = alpha_l P
 *    slots for layer l (the same for all its heads). kvs_d2o_layers (d2o_internal.h) carries the per-layer
 *    sizes, splits and diagnostics to every instance (init->shared).
 *  - Token level (§4.2), per cache: accumulated attention (Eq. 6: prefill column sums, then + a_t every
 *    step); attend-then-evict: the first T positions are sinks (never evicted), the last M slots are recent,
 *    the N heavy hitters by accumulated attention are kept (Eqs. 7-8, S_l = T + N + M, N:M = 3:1); each
 *    evicted token is matched to its most similar held key (cosine, Eq. 9) and merged into it when that
 *    similarity m reaches the EMA threshold tau (Eq. 10, beta = 0.7), with the GAT-style weights (Eqs. 11-12);
 *    otherwise it is discarded for good. A merged slot keeps the position of its conserved token and hands the
 *    engine its own K/V rows (sel->row_k/row_v, POLICY_SPEC §1.3), which later steps attend to; recall counts
 *    it only in the merged variant (the engine).
 *
 * kvsim's budget and the paper's rho (sim/policy.h "Budget convention"):
 *  - kvsim's budget B bounds the attended set, the current token included. D2O attends its cache of S_l slots
 *    plus the new token, then evicts (attend-then-evict), so layer l runs with engine budget B_l = S_l + 1 and
 *    the paper's cache size is S_l = B_l - 1 (as MorphKV's C_tot = B - 1).
 *  - rho = (B - 1) / P, P = the first turn's prompt: the run's nominal B - 1 is the paper's average cache
 *    rho L_prompt. `--budgets 20%` gives B = ceil(0.2 P), i.e. rho = (ceil(0.2 P) - 1) / P, slightly under 0.2
 *    (0.1967 on the bundled 239-token prompt); the paper's rho exactly is `--budgets N` with N = rho P + 1.
 *    kvsim also takes budgets above P (rho > 1, up to the trace length), which the paper never uses.
 *    Per layer: S_total = L (B - 1) = L rho P is split by the weights (alloc=paper), so sum_l alpha_l =
 *    sum_l S_l / P = L rho exactly (D4, Eq. 15) and sum_l B_l = L B: the run holds as many slots in total as
 *    a uniform policy at B.
 *
 * Allocation (alloc_* callbacks; kvs_d2o_allocate):
 *  - variance=minmax (default, the reference's and POLICY_SPEC §2.3's default, §8.3a): per query head h of the
 *    layer, v_h = unbiased variance (torch.var) over the P columns of the column-summed causal prefill
 *    attention; normalised within the layer v~_h = (v_h - min) / (max - min + 1e-6); F_l = mean_h v~_h in [0, 1].
 *  - variance=raw (Eq. 4 literally): A_l = the head-mean prefill attention (Fig. 1 "mean value of heads"),
 *    F_l = population variance (POLICY_SPEC §1.4 default divisor) of its column sums. Where attention sinks
 *    collect a share s of every query, F_l grows like s^2 P, so layers a few units apart hand essentially all of
 *    L (B - 1) to the lowest-variance layer and leave the others S_l = 0 (B_l = 1: the current token alone):
 *    POLICY_SPEC §8.3a, shown in tests/test_d2o.c on generated data with sinks, and said by notes() on every raw
 *    run. Measured on the real tiny models (no attention sink, README): F_l stays 0.3-2 (stories260K, bundled
 *    trace: 0.30 0.41 0.44 0.44 0.68; tinystories-656K: 1.45 1.95), so raw does NOT collapse there (20 %:
 *    S_l = 56 50 48 48 38). The softmax is computed as exp(-(F - min F)) so it never underflows.
 *  - alloc=paper (default): S_l = the largest-remainder rounding of w_l L (B - 1) (floors, then one slot each to
 *    the largest fractional parts, ties to the lower layer): integers whose sum is exactly L (B - 1). No layer
 *    is capped at the prompt length (a layer allocated more than it ever holds wastes it, as Eq. 5 does).
 *  - alloc=ref (the reference's LlamaModel.forward, POLICY_SPEC §2.3 "REF" 5-7): ratio_l = clamp(w_l L rho, 0.01,
 *    1.0), N_l = floor((P+1) ratio_l heavy) (sinks inside N_l), M_l = floor((P+1) ratio_l (1 - heavy)),
 *    S_l = N_l + M_l. Where D4 breaks: (1) the clamp at 1.0 caps every layer with w_l L rho > 1 at the prompt
 *    and gives its excess to nobody: with minmax weights (w_l L <= L / (1 + (L-1)/e), 2.02 for L = 5) from
 *    rho > 0.49 at worst; on the bundled trace (max w_l L = 1.19) from rho > 0.84, e.g. at the paper's rho = 1
 *    (Table 5: budget = prompt) 66 of L(B-1) = 1195 slots are lost (sum alpha 4.728 for L rho = 5); with raw
 *    weights on a model with sinks at any rho > 1/L; (2) the 0.01 floor adds slots to layers below it (raw
 *    weights); (3) the floors of N_l and M_l drop up to 2 slots per layer while (P+1)/P adds about rho per layer:
 *    at 20 % on the bundled trace sum alpha = 0.9958 for L rho = 1.0042, at rho = 0.8 they cancel exactly.
 *    Measured by tests/test_d2o.c on both real models.
 *  - alloc=uniform: S_l = B - 1 for every layer (Table 4's "uniform allocation", Table 6 "w.o. layer operation").
 *  - skip=ref: layers 0, 1 and L-1 are not compressed (the reference); they keep every position (engine budget =
 *    the trace length) while the others keep their allocation, so the run holds more than L B in total.
 *  - Later turns reuse the first turn's allocation (the pass sees only the first prompt, as PyramidKV's).
 *
 * Token level, decisions:
 *  - T (sinks, default 4): not given by the paper; the reference's 4 (POLICY_SPEC §8.3b). alloc=paper|uniform
 *    split S_l as Eq. 7 writes it, S = T + N + M: T' = min(T, S) sinks, N = floor(heavy (S - T')) heavy hitters,
 *    M = the rest recent (heavy = N/(N+M) = 0.75 for N:M = 3:1; the rounding goes to the recent window, which
 *    then always holds the newest token when S > T'). alloc=ref takes the reference's N_l (sinks inside) and M_l.
 *  - Sinks are the first T' positions of the stream (held slots 0..T'-1: never evicted, always the oldest).
 *  - Compression at the end of every turn's prompt (Eq. 6's and Eq. 10's t = 0 "prompt encoding"): the candidates
 *    are the held slots plus the prompt; acc = the column sums of every prompt query's causal attention over them
 *    (merged slots with their merged keys); keep the sinks, the last M and TOPK(acc, N) of the others (ties: the
 *    older position). The reference compresses at the first decode step instead, after that query attended
 *    all P + 1 tokens (acc = colsum + a_1); under kvsim's budget no query may attend more than B_l, so the
 *    reference preset compresses at the prompt's end too (the first query's attention is then not in acc).
 *  - Decode: the new token arrives with acc = 0, the query attends the S_l held slots + it (B_l), acc += a_t
 *    (the engine's probabilities over S_t: the only feedback), then one slot is evicted when S_l + 1 are held:
 *    the lowest acc among the slots that are neither sinks nor among the last M (ties: the newer position goes,
 *    §1.4). A budget so small that nothing else fits evicts the new token itself.
 *  - Matching: u = kvs_cosine_f64(k_evicted, k_held) over every held slot after the eviction (sinks, recent and the
 *    current token included; keys as merged so far); j* = argmax, ties to the older position. Keys only, the
 *    weights shared with the values (§4.2.2, Table 7).
 *  - tau (Eq. 10), counted in eviction events: the first event sets tau to the mean of its max similarities, each
 *    later event tau = beta m + (1 - beta) tau with m the event's mean max similarity (one token per decode step;
 *    a later turn's prompt evicts several at once: their mean, [REF]). An evicted token merges when m >= tau,
 *    tau already updated ([REF] ">= after the update"); the others are discarded. With nothing held to merge
 *    into (S_l = 0) the evicted tokens are discarded and tau is not updated.
 *  - merge=paper (default): w_c = e/Z, w_i = exp(u_i)/Z, Z = e + sum_i exp(u_i) over the tokens merging into the
 *    same slot in one event (all relative to the slot's K/V before the event). Eq. 12 as extracted sums exp(u) m
 *    over K_e in the numerator of w_ei, which would not sum to 1 with w_c; the per-token numerator is
 *    POLICY_SPEC §2.3's [RECON], golden G4. merge=ref: (k + sum_i u_i k_i) / (1 + n) (scatter_reduce mean with
 *    self). merge=none: no merging, no tau (plain eviction with sinks: Table 6 "w.o. EMA threshold" is
 *    "only weighted merging" there, which this is not; none is an ablation of the compensation).
 *    acc is not changed by a merge [REF]; a merged slot can itself be evicted later (its merged K/V then match
 *    and merge as one token).
 *  - tau=head (default, POLICY_SPEC §2.3 [SIM-CHOICE]: the paper is silent): one tau per cache; tau=layer (REF
 *    quirk a): one per layer, updated from the mean of m over every cache and evicted token of the layer.
 *    decide=head (default): each cache compares its own m; decide=mean (REF quirk b): the i-th evicted token of
 *    every cache (ascending positions) merges when the mean of the layer's i-th m reaches tau. Both layer modes
 *    are decided in layer_sync (after every KV head's prefill or observe), so every instance copies the evicted
 *    K/V when it evicts (it reads nothing it no longer holds).
 *  - GQA: gqa=expand (default; the reference's repeat_kv, POLICY_SPEC §2.3 GQA, §8.3f): a cache per query head,
 *    each its own acc, tau and merges, storage G x; the layer budget applies per query head. gqa=sum: one cache
 *    per KV head, acc summed over the group (POLICY_SPEC's SHARED_SUM).
 *  - Precision: acc and merge arithmetic in double, K/V rows float; cosines through kvs_cosine_f64 (fp64 dot and
 *    norms, kept in double: the argmax of Eq. 9, the m >= tau test of Eq. 10, tau itself and the merge weights
 *    all see the unrounded similarity, so values 1e-8 apart are not tied or flipped by an fp32 rounding; no 1e-8
 *    guard: a zero key has similarity 0 to everything).
 *  - Presets: @reference = alloc=ref, merge=ref, tau=layer, decide=mean, skip=ref, gqa=expand, beta=0.5 (the
 *    reference CLI's alpha = belta = 0.5, POLICY_SPEC §2.3 beta row, §8.3e), variance=minmax. Not reproducible
 *    here: the compression at the first decode step (above) and the hard-coded "4 sinks over 32 heads"
 *    quirk (d), taken as T = 4. @paper = the paper's equations literally (variance=raw, the degenerate
 *    collapse of §8.3a), otherwise the defaults.
 *
 * Sliding-window layers (sim/replay.h): the host's window_evict names the first position the next step can attend.
 * At the start of a prefill, and in observe after this step's attention is added to acc and before D2O's own
 * eviction (the lists stay aligned with the step's selection until then), every slot whose position is before it
 * leaves with its acc, K/V and merge count; the window's evictions are not D2O's: they are neither matched nor
 * merged (that would carry a dropped token on) and do not move tau. A merged slot is as old as the oldest token
 * merged into it (each slot records that position): it leaves when that token leaves the window, its conserved
 * token with it, because the merge cannot be undone (a real cache overwrote the slot's own K/V) and the window's
 * model never sees the older token. The sinks are the stream's first T' positions: once they leave the window the
 * eviction ranks every slot older than the last M (their places go to the heavy hitters; full layers keep the
 * ranges by count as before). A prefill takes no candidate before the window. So D2O never spends an eviction (nor
 * a merge) on a position the window drops, and B_l >= the window W never evicts: the layer holds exactly the
 * window. The allocation keeps its rule (densities of the whole first prompt, sum_l B_l = L B); a windowed layer
 * with B_l above its window leaves the rest unused, and skip=ref's uncompressed layers hold their window.
 * Costs per decode step (account(); POLICY_SPEC §2.3 Storage/Traffic, §3 row): KV = the held slots (the
 * engine's default: merged slots are slots, their rows replace the original's in place, nothing extra);
 * aux = one score per slot plus tau (one per cache; tau=layer: one per layer, a 1/Hkv share per KV head);
 * reads (fused) = the scores (read-modify-write counted once) and tau; unfused adds, on an evicting step, every
 * held key re-read for the cosine (d per slot; the reference recomputes norms); writes = the new token's K/V +
 * the score updates + tau + the K/V of every slot a merge rewrote. A merge happens after attention, when
 * account() has already run, so its writes are reported at the next step (prompt-compression merges are not a
 * decode step's). Transient: the similarity row (one value per held slot) on an evicting step.
 * The owned float copies of unmerged slots are a simulator convenience, not counted (a real cache merges in place).
 * With --measure prefill|all the engine's prompt measurement of a later turn attends to the trace rows of
 * merged slots, not their merged K/V (it reads stored() only).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../common/kvs_math.h"
#include "../sim/policy_memo.h"
#include "d2o_internal.h"
#include "held.h"
#include "registry.h"

static const kvs_policy_param d2o_params[] = {
    {.key = "sinks", .type = KVS_PARAM_INT, .def = 4, .lo = 0, .hi = 1 << 20,
     .help = "T: the first T positions are attention sinks, never evicted (the reference's 4; the paper leaves T open)"},
    {.key = "heavy", .type = KVS_PARAM_DOUBLE, .def = 0.75, .lo = 0.0, .hi = 1.0,
     .help = "N/(N+M): heavy-hitter share of the non-sink cache (N:M = 3:1, §5.1); the rest is the recent window"},
    {.key = "beta", .type = KVS_PARAM_DOUBLE, .def = 0.7, .lo = 0.0, .hi = 1.0,
     .help = "EMA weight of the current similarity in the merge threshold tau (Eq. 10; 0.7, App. A.3)"},
    {.key = "variance", .type = KVS_PARAM_ENUM, .def = KVS_D2O_VAR_MINMAX, .choices = "raw|minmax",
     .help = "layer density: raw = Eq. 4 (grows with P where attention sinks are: one layer then gets the whole "
             "budget); minmax = the reference's per-head min-max normalised variances"},
    {.key = "alloc", .type = KVS_PARAM_ENUM, .def = KVS_D2O_ALLOC_PAPER, .choices = "paper|ref|uniform",
     .help = "layer budgets: paper = Eq. 5, sum exactly L(B-1); ref = clamp(0.01, 1) and floors; uniform = B"},
    {.key = "merge", .type = KVS_PARAM_ENUM, .def = KVS_D2O_MERGE_PAPER, .choices = "paper|ref|none",
     .help = "merge weights: paper = GAT-style e^u/(e + sum e^u) (Eqs. 11-12); ref = mean with u weights; none"},
    {.key = "tau", .type = KVS_PARAM_ENUM, .def = KVS_D2O_TAU_HEAD, .choices = "head|layer",
     .help = "EMA threshold per cache (head) or one per layer from the layer's mean similarity (reference)"},
    {.key = "decide", .type = KVS_PARAM_ENUM, .def = KVS_D2O_DECIDE_HEAD, .choices = "head|mean",
     .help = "merge decision on the cache's own similarity (head) or the layer's head mean (reference)"},
    {.key = "skip", .type = KVS_PARAM_ENUM, .def = KVS_D2O_SKIP_NONE, .choices = "none|ref",
     .help = "ref: layers 0, 1 and L-1 are not compressed (the reference code)"},
    {.key = "gqa", .type = KVS_PARAM_ENUM, .def = KVS_D2O_GQA_EXPAND, .choices = "expand|sum",
     .help = "expand: a cache per query head (reference repeat_kv, G x storage); sum: one per KV head, group-summed"},
};

static const kvs_policy_preset d2o_presets[] = {
    {.name = "reference", .params = "variance=minmax,alloc=ref,merge=ref,tau=layer,decide=mean,skip=ref,gqa=expand,beta=0.5",
     .help = "the D2O reference code: clamped layer ratios, mean merging, layer tau, head-mean decisions, layers 0, 1, "
             "L-1 uncompressed, CLI beta 0.5; LongBench rho = 0.2 (--budgets 20%)"},
    {.name = "paper", .params = "variance=raw",
     .help = "the paper's Eqs. 4-5 literally: raw variance (on models with attention sinks one layer gets the budget, "
             "POLICY_SPEC §8.3a); rho = 0.2 (--budgets 20%)"},
};

/* ================================================================================================
 * Token level (d2o_internal.h)
 * ============================================================================================== */

int64_t kvs_d2o_nearest(const float *key, const float *rows, int64_t n, int32_t d, double *m) {
    KVS_ASSERT(n >= 1);
    int64_t best = 0;
    double bm = kvs_cosine_f64(key, rows, (size_t)d);
    for (int64_t j = 1; j < n; j++) {
        double u = kvs_cosine_f64(key, rows + (size_t)j * (size_t)d, (size_t)d);
        if (u > bm) {
            bm = u;
            best = j;
        }
    }
    *m = bm;
    return best;
}

double kvs_d2o_tau_next(int64_t events, double tau, double m, double beta) {
    return events == 0 ? m : beta * m + (1.0 - beta) * tau;
}

void kvs_d2o_merge(int weights, float *k, float *v, int32_t d, int64_t n_e, const float *const *ke,
                   const float *const *ve, const double *u) {
    if (n_e <= 0) return;
    double wc, z = 0;
    if (weights == KVS_D2O_MERGE_PAPER) {
        z = M_E;
        for (int64_t i = 0; i < n_e; i++) z += exp(u[i]);
        wc = M_E / z;
    } else {
        z = 1.0 + (double)n_e;
        wc = 1.0 / z;
    }
    for (int32_t x = 0; x < d; x++) {
        double sk = wc * k[x], sv = wc * v[x];
        for (int64_t i = 0; i < n_e; i++) {
            double w = weights == KVS_D2O_MERGE_PAPER ? exp(u[i]) / z : u[i] / z;
            sk += w * ke[i][x];
            sv += w * ve[i][x];
        }
        k[x] = (float)sk;
        v[x] = (float)sv;
    }
}

/* ================================================================================================
 * Layer level (d2o_internal.h)
 * ============================================================================================== */

double kvs_d2o_variance(const double *x, int64_t n, int ddof) {
    if (n <= ddof) return 0;
    double mean = 0, ss = 0;
    for (int64_t i = 0; i < n; i++) mean += x[i];
    mean /= (double)n;
    for (int64_t i = 0; i < n; i++) ss += (x[i] - mean) * (x[i] - mean);
    return ss / (double)(n - ddof);
}

void kvs_d2o_weights(const double *F, int n_layers, double *w) {
    if (n_layers <= 0) return;
    double lo = F[0], sum = 0;
    for (int l = 1; l < n_layers; l++)
        if (F[l] < lo) lo = F[l];
    for (int l = 0; l < n_layers; l++) sum += w[l] = exp(-(F[l] - lo));
    for (int l = 0; l < n_layers; l++) w[l] /= sum;
}

void kvs_d2o_split(int64_t cache, int64_t sinks, double heavy, int64_t *t, int64_t *n, int64_t *m) {
    if (cache < 0) cache = 0;
    *t = sinks < cache ? sinks : cache;
    int64_t rest = cache - *t;
    *n = (int64_t)floor(heavy * (double)rest + 1e-9);
    if (*n > rest) *n = rest;
    *m = rest - *n;
}

void kvs_d2o_allocate(kvs_d2o_layers *out, int64_t sinks, double heavy, int skip_ref) {
    int L = out->n_layers;
    int64_t P = out->prompt_len, B = out->budget;
    out->rho = P > 0 ? (double)(B - 1) / (double)P : 0;
    for (int l = 0; l < L; l++) out->full[l] = skip_ref && (l <= 1 || l == L - 1);
    if (out->alloc == KVS_D2O_ALLOC_REF) {
        for (int l = 0; l < L; l++) {
            double r = out->w[l] * (double)L * out->rho;
            r = r < 0.01 ? 0.01 : r > 1.0 ? 1.0 : r;
            int64_t nl = (int64_t)floor((double)(P + 1) * r * heavy + 1e-9);
            int64_t ml = (int64_t)floor((double)(P + 1) * r * (1.0 - heavy) + 1e-9);
            out->cache[l] = nl + ml;
            out->sinks[l] = sinks < nl ? sinks : nl;
            out->heavy[l] = nl - out->sinks[l];
            out->recent[l] = ml;
        }
    } else {
        int64_t total = (int64_t)L * (B - 1);
        for (int l = 0; l < L; l++) out->cache[l] = B - 1;
        if (out->alloc == KVS_D2O_ALLOC_PAPER && L > 1) {
            int64_t sum = 0;
            for (int l = 0; l < L; l++) {
                out->cache[l] = (int64_t)floor(out->w[l] * (double)total);
                sum += out->cache[l];
            }
            KVS_ASSERT(sum <= total);
            /* the remainder, one slot each to the largest fractional parts (ties: the lower layer) */
            for (int64_t left = total - sum; left > 0; left--) {
                int best = -1;
                double bf = -1;
                for (int l = 0; l < L; l++) {
                    double frac = out->w[l] * (double)total - (double)out->cache[l];
                    if (frac > bf) {
                        bf = frac;
                        best = l;
                    }
                }
                KVS_ASSERT(best >= 0);
                out->cache[best]++;
            }
        }
        for (int l = 0; l < L; l++) kvs_d2o_split(out->cache[l], sinks, heavy, &out->sinks[l], &out->heavy[l], &out->recent[l]);
    }
    for (int l = 0; l < L; l++) out->alpha[l] = P > 0 ? (double)out->cache[l] / (double)P : 0;
}

/* ================================================================================================
 * Allocation pass
 * ============================================================================================== */

typedef struct {
    int L, Hkv, G, d;
    float scale;
    int64_t sinks, n_positions;
    double heavy;
    int skip;
    double *csum;  /* variance=raw: [L][P] column sums summed over the layer's query heads */
    double *hvar;  /* variance=minmax: [L][Hkv * G] unbiased variance of each query head's column sums */
    char *seen;    /* [L][Hkv] */
    double *hc;    /* [G][P] one KV head's per-query-head column sums */
    void *work;    /* kvs_attn_colsum_scratch_bytes(P) */
    kvs_d2o_layers out;
} d2o_alloc;

static void d2o_alloc_free(void *alloc) {
    d2o_alloc *a = alloc;
    if (!a) return;
    free(a->csum);
    free(a->hvar);
    free(a->seen);
    free(a->hc);
    free(a->work);
    free(a->out.F);
    free(a->out.w);
    free(a->out.alpha);
    free(a->out.cache);
    free(a->out.sinks);
    free(a->out.heavy);
    free(a->out.recent);
    free(a->out.full);
    free(a);
}

static kvs_status d2o_alloc_begin(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget, void **alloc) {
    d2o_alloc *a = calloc(1, sizeof *a);
    if (!a) return kvs_fail(KVS_ERR_NOMEM, "d2o: out of memory");
    a->L = m->n_layers;
    a->Hkv = m->n_kv_heads;
    a->G = m->group;
    a->d = m->head_dim;
    a->scale = m->scale;
    a->n_positions = m->n_positions;
    a->sinks = (int64_t)kvs_policy_param_get(cfg, "sinks");
    a->heavy = kvs_policy_param_get(cfg, "heavy");
    a->skip = (int)kvs_policy_param_get(cfg, "skip");
    a->out.n_layers = a->L;
    a->out.variance = (int)kvs_policy_param_get(cfg, "variance");
    a->out.alloc = (int)kvs_policy_param_get(cfg, "alloc");
    a->out.budget = budget;
    a->out.prompt_len = -1; /* unknown until the first alloc_prefill */
    size_t L = (size_t)(a->L > 0 ? a->L : 1);
    a->out.F = calloc(L, sizeof(double));
    a->out.w = calloc(L, sizeof(double));
    a->out.alpha = calloc(L, sizeof(double));
    a->out.cache = calloc(L, sizeof(int64_t));
    a->out.sinks = calloc(L, sizeof(int64_t));
    a->out.heavy = calloc(L, sizeof(int64_t));
    a->out.recent = calloc(L, sizeof(int64_t));
    a->out.full = calloc(L, 1);
    a->seen = calloc(L * (size_t)(a->Hkv > 0 ? a->Hkv : 1), 1);
    if (!a->out.F || !a->out.w || !a->out.alpha || !a->out.cache || !a->out.sinks || !a->out.heavy || !a->out.recent ||
        !a->out.full || !a->seen) {
        d2o_alloc_free(a);
        return kvs_fail(KVS_ERR_NOMEM, "d2o: out of memory");
    }
    *alloc = a;
    return KVS_OK;
}

/* Column sums c_h[j] = sum_i A_h[i][j] of the causal prefill attention of every query head h of one KV head
 * (Eq. 4's cumulative attention sequence), then what the density needs of them. */
static kvs_status d2o_alloc_prefill(void *alloc, int layer, int kv_head, const kvs_policy_view *v) {
    d2o_alloc *a = alloc;
    if (layer < 0 || layer >= a->L || kv_head < 0 || kv_head >= a->Hkv)
        return kvs_fail(KVS_ERR_RANGE, "d2o: allocation pass got (layer %d, kv head %d) of (%d, %d)", layer, kv_head,
                        a->L, a->Hkv);
    int64_t P = v->n;
    if (a->out.prompt_len < 0) {
        a->out.prompt_len = P;
        size_t cells = (size_t)a->L * (size_t)a->Hkv;
        a->hc = malloc((size_t)a->G * (size_t)(P > 0 ? P : 1) * sizeof(double));
        a->work = malloc(kvs_attn_colsum_scratch_bytes(P > 0 ? P : 1));
        if (a->out.variance == KVS_D2O_VAR_RAW) a->csum = calloc((size_t)a->L * (size_t)(P > 0 ? P : 1), sizeof(double));
        else a->hvar = calloc(cells * (size_t)a->G, sizeof(double));
        if (!a->hc || !a->work || !(a->csum || a->hvar)) return kvs_fail(KVS_ERR_NOMEM, "d2o: out of memory");
    } else if (P != a->out.prompt_len) {
        return kvs_fail(KVS_ERR_STATE, "d2o: allocation pass prompt length %lld after %lld", (long long)P,
                        (long long)a->out.prompt_len);
    }
    a->seen[(size_t)layer * (size_t)a->Hkv + (size_t)kv_head] = 1;
    if (P <= 0) return KVS_OK;
    memset(a->hc, 0, (size_t)a->G * (size_t)P * sizeof(double));
    kvs_attn_src src = {.q = v->q, .q_first = v->q_first, .n_q = v->n_q, .group = a->G, .d = a->d, .scale = a->scale,
                        .keys = v->k, .idx = NULL, .n_cand = P};
    kvs_colsum_opts co = {.row_first = 0, .n_rows = P, .head_first = 0, .n_heads = a->G, .reduce = KVS_GQA_NONE,
                          .n_out = P, .head_stride = P};
    kvs_attn_colsum(&src, &co, NULL, a->hc, a->work);
    for (int g = 0; g < a->G; g++) {
        const double *c = a->hc + (size_t)g * (size_t)P;
        if (a->csum) {
            double *dst = a->csum + (size_t)layer * (size_t)P;
            for (int64_t j = 0; j < P; j++) dst[j] += c[j];
        } else {
            a->hvar[((size_t)layer * (size_t)a->Hkv + (size_t)kv_head) * (size_t)a->G + (size_t)g] = kvs_d2o_variance(c, P, 1);
        }
    }
    return KVS_OK;
}

static kvs_status d2o_alloc_end(void *alloc, int64_t *budgets) {
    d2o_alloc *a = alloc;
    kvs_d2o_layers *o = &a->out;
    if (o->prompt_len < 0) o->prompt_len = 0; /* no prompt: every F_l = 0, a uniform split */
    for (size_t i = 0; i < (size_t)a->L * (size_t)a->Hkv && o->prompt_len > 0; i++)
        if (!a->seen[i])
            return kvs_fail(KVS_ERR_STATE, "d2o: allocation pass skipped (layer %zu, kv head %zu)", i / (size_t)a->Hkv,
                            i % (size_t)a->Hkv);
    int64_t P = o->prompt_len, H = (int64_t)a->Hkv * a->G;
    for (int l = 0; l < a->L && P > 0; l++) {
        if (a->csum) {
            double *c = a->csum + (size_t)l * (size_t)P;
            for (int64_t j = 0; j < P; j++) c[j] /= (double)H; /* the head mean A_l (Fig. 1) */
            o->F[l] = kvs_d2o_variance(c, P, 0);
        } else {
            const double *v = a->hvar + (size_t)l * (size_t)H;
            double lo = v[0], hi = v[0], mean = 0;
            for (int64_t h = 1; h < H; h++) {
                if (v[h] < lo) lo = v[h];
                if (v[h] > hi) hi = v[h];
            }
            for (int64_t h = 0; h < H; h++) mean += (v[h] - lo) / (hi - lo + 1e-6);
            o->F[l] = mean / (double)H;
        }
    }
    kvs_d2o_weights(o->F, a->L, o->w);
    kvs_d2o_allocate(o, a->sinks, a->heavy, a->skip == KVS_D2O_SKIP_REF);
    int64_t full_budget = a->n_positions > 1 ? a->n_positions : 1;
    for (int l = 0; l < a->L; l++)
        for (int h = 0; h < a->Hkv; h++)
            budgets[(size_t)l * (size_t)a->Hkv + (size_t)h] = o->full[l] ? full_budget : o->cache[l] + 1;
    return KVS_OK;
}

static const void *d2o_alloc_shared(void *alloc) { return &((d2o_alloc *)alloc)->out; }

/* ================================================================================================
 * Instances
 * ============================================================================================== */

/* One cache: a query head's (gqa=expand) or a KV head's (gqa=sum). */
typedef struct {
    /* the held slots: ascending positions (+ the current token at attention time), score = accumulated attention
     * (Eq. 6); the arrays below are aligned with its entries and compacted with the same keep masks */
    kvs_held *held;
    float *k, *v;     /* [cap][d] the slots' K/V: the trace rows copied on arrival, merged in place */
    int32_t *nm;      /* [cap] tokens merged into the slot so far (0: its own trace K/V) */
    int32_t *mo;      /* [cap] the oldest position in the slot: its own, or of a token merged into it */
    int64_t cap;      /* slots k, v and nm have room for */
    double tau;       /* EMA threshold (Eq. 10), defined once events > 0 */
    int64_t events;   /* eviction events so far */
    /* the pending eviction event (evicted, matched, not yet merged or discarded) */
    float *ek, *ev;   /* [ecap][d] copies of the evicted K/V, ascending positions */
    int64_t *ej;      /* [ecap] j*: index of the nearest held slot */
    int32_t *emo;     /* [ecap] the oldest position in each evicted slot (its mo) */
    double *em;       /* [ecap] its similarity */
    int64_t n_ev, ecap;
    int ev_decode;    /* the pending event is a decode step's (its merge writes are a step's cost) */
    double merged_writes; /* slots rewritten by decode merges, not yet reported by account() */
} d2o_list;

/* Slot j's K/V, merge count and oldest position into slot w (w < j): compaction in the order of the held list. */
static void slot_move(d2o_list *L, int64_t w, int64_t j, size_t d) {
    L->nm[w] = L->nm[j];
    L->mo[w] = L->mo[j];
    memcpy(L->k + (size_t)w * d, L->k + (size_t)j * d, d * sizeof(float));
    memcpy(L->v + (size_t)w * d, L->v + (size_t)j * d, d * sizeof(float));
}

typedef struct {
    kvs_policy_model model;
    int n_lists, group, d, n_kv_heads;
    float scale;
    int gqa, merge, tau_mode, decide;
    double beta;
    int full;                            /* layer not compressed: attend to everything */
    int64_t cache, n_sink, n_heavy, n_recent; /* S = T' + N + M */
    int64_t seen;                        /* positions seen (full layers' stored set) */
    int64_t win_first;                   /* positions before it were evicted by the host (sliding-window layer) */
    d2o_list *lists;                     /* [n_lists] */
    /* scratch */
    char *keep;                          /* [kcap] keep masks of the held slots */
    int64_t kcap;
    float *ktab;                         /* [ktab_n][d] keys by position, for a prefill over merged slots */
    int64_t ktab_n;
    void *work;                          /* kvs_attn_colsum_scratch_bytes(work_n) */
    int64_t work_n;
    d2o_list **sync;                     /* [n_kv_heads * n_lists] layer_sync's lists */
} d2o_state;

static void list_free(d2o_list *L) {
    kvs_held_free(L->held);
    free(L->k);
    free(L->v);
    free(L->nm);
    free(L->mo);
    free(L->emo);
    free(L->ek);
    free(L->ev);
    free(L->ej);
    free(L->em);
}

static void d2o_free(void *state) {
    d2o_state *s = state;
    if (!s) return;
    if (s->lists)
        for (int i = 0; i < s->n_lists; i++) list_free(&s->lists[i]);
    free(s->lists);
    free(s->keep);
    free(s->ktab);
    free(s->work);
    free(s->sync);
    free(s);
}

static kvs_status nomem(void) { return kvs_fail(KVS_ERR_NOMEM, "d2o: out of memory"); }

/* Room for `need` held slots in L and for the state's per-slot scratch. */
static kvs_status list_reserve(d2o_state *s, d2o_list *L, int64_t need) {
    size_t d = (size_t)s->d;
    if (need > L->cap) {
        int64_t cap = L->cap * 2 > need ? L->cap * 2 : need;
        if (!L->held && !(L->held = kvs_held_create(cap))) return nomem();
        if (kvs_held_reserve(L->held, cap) != KVS_OK) return nomem();
        float *k = realloc(L->k, (size_t)cap * d * sizeof *k);
        if (k) L->k = k;
        float *v = realloc(L->v, (size_t)cap * d * sizeof *v);
        if (v) L->v = v;
        int32_t *nm = realloc(L->nm, (size_t)cap * sizeof *nm);
        if (nm) L->nm = nm;
        int32_t *mo = realloc(L->mo, (size_t)cap * sizeof *mo);
        if (mo) L->mo = mo;
        if (!k || !v || !nm || !mo) return nomem();
        L->cap = cap;
    }
    if (need > s->kcap) {
        char *keep = realloc(s->keep, (size_t)need);
        if (!keep) return nomem();
        s->keep = keep;
        s->kcap = need;
    }
    return KVS_OK;
}

static kvs_status pending_reserve(d2o_state *s, d2o_list *L, int64_t need) {
    if (need <= L->ecap) return KVS_OK;
    size_t d = (size_t)s->d;
    float *ek = realloc(L->ek, (size_t)need * d * sizeof *ek);
    if (ek) L->ek = ek;
    float *ev = realloc(L->ev, (size_t)need * d * sizeof *ev);
    if (ev) L->ev = ev;
    int64_t *ej = realloc(L->ej, (size_t)need * sizeof *ej);
    if (ej) L->ej = ej;
    double *em = realloc(L->em, (size_t)need * sizeof *em);
    if (em) L->em = em;
    int32_t *emo = realloc(L->emo, (size_t)need * sizeof *emo);
    if (emo) L->emo = emo;
    if (!ek || !ev || !ej || !em || !emo) return nomem();
    L->ecap = need;
    return KVS_OK;
}

/* Appends position p (K/V rows from the view) with acc = 0. */
static void list_append(d2o_state *s, d2o_list *L, int32_t p, const kvs_policy_view *view) {
    size_t d = (size_t)s->d;
    int64_t j = kvs_held_count(L->held);
    KVS_ASSERT(j < L->cap);
    kvs_held_push(L->held, p);
    L->nm[j] = 0;
    L->mo[j] = p;
    memcpy(L->k + (size_t)j * d, view->k + (size_t)p * d, d * sizeof(float));
    memcpy(L->v + (size_t)j * d, view->v + (size_t)p * d, d * sizeof(float));
}

static kvs_policy_granularity d2o_layout(const kvs_policy_config *cfg) {
    return (int)kvs_policy_param_get(cfg, "gqa") == KVS_D2O_GQA_EXPAND ? KVS_SEL_PER_QUERY_HEAD : KVS_SEL_PER_KV_HEAD;
}

static kvs_status d2o_create(const kvs_policy_init *init, void **state) {
    d2o_state *s = calloc(1, sizeof *s);
    if (!s) return nomem();
    const kvs_policy_config *cfg = init->cfg;
    s->model = *init->model;
    s->group = init->model->group;
    s->d = init->model->head_dim;
    s->n_kv_heads = init->model->n_kv_heads > 0 ? init->model->n_kv_heads : 1;
    s->scale = init->model->scale;
    s->gqa = (int)kvs_policy_param_get(cfg, "gqa");
    s->merge = (int)kvs_policy_param_get(cfg, "merge");
    s->tau_mode = (int)kvs_policy_param_get(cfg, "tau");
    s->decide = (int)kvs_policy_param_get(cfg, "decide");
    s->beta = kvs_policy_param_get(cfg, "beta");
    s->n_lists = s->gqa == KVS_D2O_GQA_EXPAND ? s->group : 1;
    const kvs_d2o_layers *lay = init->shared;
    if (lay && init->layer >= 0 && init->layer < lay->n_layers) {
        s->full = lay->full[init->layer];
        s->n_sink = lay->sinks[init->layer];
        s->n_heavy = lay->heavy[init->layer];
        s->n_recent = lay->recent[init->layer];
        s->cache = lay->cache[init->layer];
    } else { /* created without the allocation pass (tests): the paper's split of this budget */
        s->cache = init->budget - 1;
        kvs_d2o_split(s->cache, (int64_t)kvs_policy_param_get(cfg, "sinks"), kvs_policy_param_get(cfg, "heavy"), &s->n_sink,
                      &s->n_heavy, &s->n_recent);
    }
    KVS_ASSERT(s->full || s->cache + 1 <= init->budget);
    s->lists = calloc((size_t)s->n_lists, sizeof *s->lists);
    s->sync = malloc((size_t)s->n_kv_heads * (size_t)s->n_lists * sizeof *s->sync);
    kvs_status st = s->lists && s->sync ? KVS_OK : nomem();
    int64_t cap = s->cache + 2 < 256 ? s->cache + 2 : 256;
    for (int i = 0; st == KVS_OK && !s->full && i < s->n_lists; i++) st = list_reserve(s, &s->lists[i], cap);
    if (st != KVS_OK) {
        d2o_free(s);
        return st;
    }
    *state = s;
    return KVS_OK;
}

/* ---- eviction and merging -------------------------------------------------------------------------- */

/* Moves the held slots with keep[j] == 0 into L's pending event (K/V copied, ascending positions), compacts the
 * held slots and matches every evicted key to its nearest held key (Eq. 9). With merge=none, or nothing left
 * to merge into, the evicted slots are discarded at once. */
static kvs_status evict(d2o_state *s, d2o_list *L, const char *keep, int decode) {
    size_t d = (size_t)s->d;
    int64_t n_e = 0, cnt = kvs_held_count(L->held);
    for (int64_t j = 0; j < cnt; j++) n_e += !keep[j];
    if (n_e == 0) return KVS_OK;
    if (L->n_ev) return kvs_fail(KVS_ERR_STATE, "d2o: an eviction event is still pending (layer_sync was not called)");
    kvs_status st = pending_reserve(s, L, n_e);
    if (st != KVS_OK) return st;
    int64_t w = 0, e = 0;
    for (int64_t j = 0; j < cnt; j++) {
        if (!keep[j]) {
            memcpy(L->ek + (size_t)e * d, L->k + (size_t)j * d, d * sizeof(float));
            memcpy(L->ev + (size_t)e * d, L->v + (size_t)j * d, d * sizeof(float));
            L->emo[e] = L->mo[j];
            e++;
            continue;
        }
        if (w != j) slot_move(L, w, j, d);
        w++;
    }
    kvs_held_compact(L->held, keep);
    if (s->merge == KVS_D2O_MERGE_NONE || w == 0) return KVS_OK;
    for (int64_t i = 0; i < n_e; i++) L->ej[i] = kvs_d2o_nearest(L->ek + (size_t)i * d, L->k, w, s->d, &L->em[i]);
    L->n_ev = n_e;
    L->ev_decode = decode;
    return KVS_OK;
}

typedef struct {
    int64_t j, i;
} d2o_pair;

static int pair_cmp(const void *a, const void *b) {
    const d2o_pair *x = a, *y = b;
    if (x->j != y->j) return x->j < y->j ? -1 : 1;
    return (x->i > y->i) - (x->i < y->i);
}

/* Merges the evicted tokens i of L with merge[i] != 0 into their nearest slots, one weighted merge per slot. */
static kvs_status merge_list(const d2o_state *s, d2o_list *L, const char *merge) {
    size_t d = (size_t)s->d;
    int64_t n = 0;
    for (int64_t i = 0; i < L->n_ev; i++) n += merge[i] != 0;
    if (n == 0) return KVS_OK;
    if (n == 1) { /* the decode step's case: no scratch */
        int64_t i = 0;
        while (!merge[i]) i++;
        const float *ke = L->ek + (size_t)i * d, *ve = L->ev + (size_t)i * d;
        int64_t j = L->ej[i];
        kvs_d2o_merge(s->merge, L->k + (size_t)j * d, L->v + (size_t)j * d, s->d, 1, &ke, &ve, &L->em[i]);
        L->nm[j]++;
        if (L->emo[i] < L->mo[j]) L->mo[j] = L->emo[i];
        if (L->ev_decode) L->merged_writes += 1;
        return KVS_OK;
    }
    d2o_pair *pr = malloc((size_t)n * sizeof *pr);
    const float **ke = malloc((size_t)n * sizeof *ke), **ve = malloc((size_t)n * sizeof *ve);
    double *u = malloc((size_t)n * sizeof *u);
    if (!pr || !ke || !ve || !u) {
        free(pr);
        free(ke);
        free(ve);
        free(u);
        return nomem();
    }
    int64_t m = 0;
    for (int64_t i = 0; i < L->n_ev; i++)
        if (merge[i]) pr[m++] = (d2o_pair){.j = L->ej[i], .i = i};
    qsort(pr, (size_t)n, sizeof *pr, pair_cmp);
    for (int64_t a = 0; a < n;) {
        int64_t b = a, j = pr[a].j;
        for (; b < n && pr[b].j == j; b++) {
            ke[b - a] = L->ek + (size_t)pr[b].i * d;
            ve[b - a] = L->ev + (size_t)pr[b].i * d;
            u[b - a] = L->em[pr[b].i];
            if (L->emo[pr[b].i] < L->mo[j]) L->mo[j] = L->emo[pr[b].i];
        }
        kvs_d2o_merge(s->merge, L->k + (size_t)j * d, L->v + (size_t)j * d, s->d, b - a, ke, ve, u);
        L->nm[j] += (int32_t)(b - a);
        if (L->ev_decode) L->merged_writes += 1;
        a = b;
    }
    free(pr);
    free(ke);
    free(ve);
    free(u);
    return KVS_OK;
}

/* Ends the pending events of n caches decided together (one cache, or every cache of a layer in the layer
 * modes): the EMA threshold (Eq. 10, per cache or shared by the layer), the merge decisions (own similarity or
 * the layer's head mean), the weighted merges; the pending tokens are then gone. */
static kvs_status finalize(const d2o_state *s, d2o_list *const *ls, int n) {
    int64_t most = 0, total = 0;
    double msum = 0;
    for (int c = 0; c < n; c++) {
        total += ls[c]->n_ev;
        if (ls[c]->n_ev > most) most = ls[c]->n_ev;
        for (int64_t i = 0; i < ls[c]->n_ev; i++) msum += ls[c]->em[i];
    }
    if (total == 0) return KVS_OK;
    if (s->tau_mode == KVS_D2O_TAU_LAYER) { /* one tau for the layer: every cache holds the same value */
        double tau = kvs_d2o_tau_next(ls[0]->events, ls[0]->tau, msum / (double)total, s->beta);
        for (int c = 0; c < n; c++) {
            ls[c]->tau = tau;
            ls[c]->events++;
        }
    } else {
        for (int c = 0; c < n; c++) {
            d2o_list *L = ls[c];
            if (!L->n_ev) continue;
            double m = 0;
            for (int64_t i = 0; i < L->n_ev; i++) m += L->em[i];
            L->tau = kvs_d2o_tau_next(L->events, L->tau, m / (double)L->n_ev, s->beta);
            L->events++;
        }
    }
    double *mean = NULL;
    char *merge = malloc((size_t)most);
    if (!merge) return nomem();
    if (s->decide == KVS_D2O_DECIDE_MEAN) { /* the i-th evicted token of every cache: the layer's mean similarity */
        mean = calloc((size_t)most, sizeof *mean);
        int64_t *cnt = calloc((size_t)most, sizeof *cnt);
        if (!mean || !cnt) {
            free(merge);
            free(mean);
            free(cnt);
            return nomem();
        }
        for (int c = 0; c < n; c++)
            for (int64_t i = 0; i < ls[c]->n_ev; i++) {
                mean[i] += ls[c]->em[i];
                cnt[i]++;
            }
        for (int64_t i = 0; i < most; i++) mean[i] /= (double)cnt[i];
        free(cnt);
    }
    kvs_status st = KVS_OK;
    for (int c = 0; c < n && st == KVS_OK; c++) {
        d2o_list *L = ls[c];
        for (int64_t i = 0; i < L->n_ev; i++) merge[i] = (mean ? mean[i] : L->em[i]) >= L->tau;
        st = merge_list(s, L, merge);
        L->n_ev = 0;
    }
    free(merge);
    free(mean);
    return st;
}

static int layer_modes(const d2o_state *s) {
    return s->merge != KVS_D2O_MERGE_NONE && (s->tau_mode == KVS_D2O_TAU_LAYER || s->decide == KVS_D2O_DECIDE_MEAN);
}

/* After a cache's eviction: decided now, unless a layer mode waits for layer_sync. */
static kvs_status settle(const d2o_state *s, d2o_list *L) {
    if (layer_modes(s) || !L->n_ev) return KVS_OK;
    return finalize(s, &L, 1);
}

/* ---- sliding-window layers --------------------------------------------------------------------------- */

/* The host's window evictions (header "Sliding-window layers"): the slots holding a position before s->win_first
 * (their own, or a merged token's) leave, neither matched nor merged. */
static void window_drop(d2o_state *s, d2o_list *L) {
    if (s->win_first <= 0) return;
    size_t d = (size_t)s->d;
    int64_t cnt = kvs_held_count(L->held), w = 0;
    for (int64_t j = 0; j < cnt; j++) w += s->keep[j] = L->mo[j] >= s->win_first;
    if (w == cnt) return;
    w = 0;
    for (int64_t j = 0; j < cnt; j++) {
        if (!s->keep[j]) continue;
        if (w != j) slot_move(L, w, j, d);
        w++;
    }
    kvs_held_compact(L->held, s->keep);
}

/* The first eviction index: the sinks (held slots 0..T'-1) are kept; on a windowed layer they are the stream's
 * first T' positions, so only those still held. */
static int64_t sink_end(const d2o_state *s, const d2o_list *L) {
    if (s->win_first <= 0) return s->n_sink;
    const int32_t *pos = kvs_held_pos(L->held);
    int64_t cnt = kvs_held_count(L->held), j = 0;
    while (j < cnt && j < s->n_sink && pos[j] < s->n_sink) j++;
    return j;
}

/* ---- prefill ----------------------------------------------------------------------------------------- */

/* The turn's prompt into cache li: candidates = the held slots + the prompt; acc += the column sums of every
 * prompt query's causal attention over them (Eq. 6, first case); then the sinks, the last M and TOPK(acc, N)
 * of the others are kept (Eqs. 7-8), the rest evicted (one event). */
static kvs_status prefill_list(d2o_state *s, int li, const kvs_policy_view *view) {
    d2o_list *L = &s->lists[li];
    window_drop(s, L);
    int64_t first = view->turn_begin > s->win_first ? view->turn_begin : s->win_first; /* no candidate before it */
    int64_t n_new = view->n - first, old = kvs_held_count(L->held);
    if (n_new <= 0) return KVS_OK;
    int64_t nc = old + n_new;
    kvs_status st = list_reserve(s, L, nc + 1);
    if (st != KVS_OK) return st;
    if (nc > s->work_n) {
        free(s->work);
        s->work = malloc(kvs_attn_colsum_scratch_bytes(nc));
        s->work_n = s->work ? nc : 0;
        if (!s->work) return nomem();
    }
    for (int64_t p = first; p < view->n; p++) list_append(s, L, (int32_t)p, view);
    /* merged slots of earlier turns are attended with their merged keys: a key table by position */
    const float *keys = view->k;
    int any_merged = 0;
    for (int64_t j = 0; j < old; j++) any_merged |= L->nm[j] > 0;
    if (any_merged) {
        if (view->n > s->ktab_n) {
            free(s->ktab);
            s->ktab = malloc((size_t)view->n * (size_t)s->d * sizeof *s->ktab);
            s->ktab_n = s->ktab ? view->n : 0;
            if (!s->ktab) return nomem();
        }
        for (int64_t j = 0; j < nc; j++)
            memcpy(s->ktab + (size_t)kvs_held_pos(L->held)[j] * (size_t)s->d, L->k + (size_t)j * (size_t)s->d,
                   (size_t)s->d * sizeof(float));
        keys = s->ktab;
    }
    kvs_attn_src src = {.q = view->q, .q_first = view->q_first, .n_q = view->n_q, .group = s->group, .d = s->d,
                        .scale = s->scale, .keys = keys, .idx = kvs_held_pos(L->held), .n_cand = nc};
    kvs_colsum_opts co = {.row_first = first - view->q_first, .n_rows = n_new,
                          .head_first = s->gqa == KVS_D2O_GQA_EXPAND ? li : 0,
                          .n_heads = s->gqa == KVS_D2O_GQA_EXPAND ? 1 : s->group, .reduce = KVS_GQA_SUM, .n_out = nc};
    kvs_policy_colsum(view, &src, &co, NULL, kvs_held_score(L->held), s->work);
    if (nc <= s->cache) return KVS_OK;
    /* keep the sinks (the oldest T' slots), the last M, and the N best acc in between (ties: the older) */
    int64_t lo = sink_end(s, L), hi = nc - s->n_recent;
    KVS_ASSERT(hi - lo > s->n_heavy);
    kvs_held_mark_top(L->held, lo, hi, s->n_heavy, s->keep);
    if ((st = evict(s, L, s->keep, 0)) != KVS_OK) return st;
    return settle(s, L);
}

static kvs_status d2o_prefill(void *state, const kvs_policy_view *view) {
    d2o_state *s = state;
    s->seen = view->n;
    if (s->full) return KVS_OK;
    for (int li = 0; li < s->n_lists; li++) {
        kvs_status st = prefill_list(s, li, view);
        if (st != KVS_OK) return st;
    }
    return KVS_OK;
}

/* ---- decode ------------------------------------------------------------------------------------------ */

static kvs_status d2o_select(void *state, const kvs_policy_view *view, kvs_policy_sel *sel) {
    d2o_state *s = state;
    s->seen = view->n;
    if (s->full) {
        for (int li = 0; li < sel->n_lists; li++) {
            for (int64_t j = s->win_first; j < view->n; j++) sel->idx[li][j - s->win_first] = (int32_t)j;
            sel->n[li] = view->n - s->win_first;
        }
        return KVS_OK;
    }
    size_t d = (size_t)s->d;
    for (int li = 0; li < s->n_lists; li++) {
        d2o_list *L = &s->lists[li];
        if (L->n_ev) return kvs_fail(KVS_ERR_STATE, "d2o: an eviction event is still pending (layer_sync was not called)");
        KVS_ASSERT(kvs_held_count(L->held) <= s->cache);
        kvs_status st = list_reserve(s, L, kvs_held_count(L->held) + 1);
        if (st != KVS_OK) return st;
        list_append(s, L, (int32_t)(view->n - 1), view);
        int64_t cnt = kvs_held_copy(L->held, sel->idx[li]);
        for (int64_t j = 0; j < cnt; j++)
            if (L->nm[j]) { /* a merged slot: the policy's rows */
                sel->row_k[li][j] = L->k + (size_t)j * d;
                sel->row_v[li][j] = L->v + (size_t)j * d;
            }
        sel->n[li] = cnt;
    }
    return KVS_OK;
}

static kvs_status d2o_observe(void *state, const kvs_policy_view *view, const kvs_policy_sel *sel,
                              const float *const *probs) {
    d2o_state *s = state;
    (void)view;
    if (s->full) return KVS_OK;
    for (int li = 0; li < s->n_lists; li++) {
        d2o_list *L = &s->lists[li];
        int64_t cnt = kvs_held_count(L->held);
        KVS_ASSERT(sel->n[li] == cnt);
        if (s->gqa == KVS_D2O_GQA_EXPAND) kvs_held_add(L->held, probs[li]);
        else kvs_held_add_heads(L->held, probs, s->group, 0); /* acc += the group sum */
        window_drop(s, L); /* the window's evictions first */
        cnt = kvs_held_count(L->held);
        if (cnt <= s->cache) continue;
        /* one victim: the lowest acc between the sinks and the last M (the newer on ties) */
        int64_t lo = sink_end(s, L), hi = cnt - s->n_recent;
        KVS_ASSERT(hi > lo);
        memset(s->keep, 1, (size_t)cnt);
        s->keep[kvs_held_lowest(L->held, lo, hi)] = 0;
        kvs_status st = evict(s, L, s->keep, 1);
        if (st == KVS_OK) st = settle(s, L);
        if (st != KVS_OK) return st;
    }
    return KVS_OK;
}

/* The layer modes (tau=layer, decide=mean): every cache of the layer evicted, now decide together. */
static kvs_status d2o_layer_sync(void *const *states, int n_kv_heads, kvs_policy_sync_phase phase) {
    (void)phase;
    if (n_kv_heads < 1) return KVS_OK;
    d2o_state *s0 = states[0];
    if (s0->full || !layer_modes(s0)) return KVS_OK;
    KVS_ASSERT(n_kv_heads <= s0->n_kv_heads);
    int n = 0;
    for (int h = 0; h < n_kv_heads; h++) {
        d2o_state *s = states[h];
        for (int li = 0; li < s->n_lists; li++) s0->sync[n++] = &s->lists[li];
    }
    return finalize(s0, s0->sync, n);
}

static int64_t d2o_stored(void *state, int g, int32_t *out) {
    d2o_state *s = state;
    if (s->full) {
        for (int64_t j = s->win_first; j < s->seen; j++) out[j - s->win_first] = (int32_t)j;
        return s->seen - s->win_first;
    }
    return kvs_held_copy(s->lists[s->gqa == KVS_D2O_GQA_EXPAND ? g : 0].held, out);
}

/* Takes effect in the next prefill or observe (the lists stay aligned with this step's selection until then); a
 * full layer's set starts there at once. */
static kvs_status d2o_window_evict(void *state, int64_t first) {
    d2o_state *s = state;
    if (first > s->win_first) s->win_first = first;
    return KVS_OK;
}

/* Cost model v2 (header "Costs per decode step"); KV storage and reads stay the engine's default. */
static void d2o_account(void *state, const kvs_policy_view *view, const kvs_policy_sel *sel, kvs_policy_cost *out) {
    d2o_state *s = state;
    (void)view;
    if (s->full) return;
    double ab = s->model.aux_bytes, kb = s->model.kv_bytes, d = s->d, slots = 0;
    int merging = s->merge != KVS_D2O_MERGE_NONE;
    double taus = !merging ? 0 : s->tau_mode == KVS_D2O_TAU_LAYER ? 1.0 / s->n_kv_heads : (double)s->n_lists;
    for (int li = 0; li < s->n_lists; li++) {
        d2o_list *L = &s->lists[li];
        double A = (double)sel->n[li];
        slots += A;
        out->write_bytes += L->merged_writes * 2.0 * d * kb;
        L->merged_writes = 0;
        if (sel->n[li] > s->cache && merging) { /* this step evicts and matches */
            out->transient_bytes += A * ab;
            out->read_aux_unfused_bytes += A * d * kb;
        }
    }
    out->aux_bytes = (slots + taus) * ab;
    out->read_aux_bytes = (slots + taus) * ab;
    out->read_aux_unfused_bytes += out->read_aux_bytes;
    out->write_bytes += (slots + taus) * ab;
}

/* ---- configuration notes ------------------------------------------------------------------------------ */

static int d2o_notes(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget, char *buf, size_t cap) {
    int n = 0, L = m->n_layers;
    int64_t T = (int64_t)kvs_policy_param_get(cfg, "sinks"), S = budget - 1;
    double heavy = kvs_policy_param_get(cfg, "heavy");
    int variance = (int)kvs_policy_param_get(cfg, "variance"), alloc = (int)kvs_policy_param_get(cfg, "alloc");
    if (alloc != KVS_D2O_ALLOC_UNIFORM && variance == KVS_D2O_VAR_RAW && L > 1)
        n += kvs_policy_note(buf, cap, "variance=raw: Eq. 4's raw variance grows with the prompt where attention sinks "
                                       "collect mass (about s^2 P for a sink taking a share s of every query); layers whose "
                                       "F differ by a few units give nearly all of L(B-1) to one layer and B_l = 1 to the "
                                       "others (POLICY_SPEC §8.3a; variance=minmax bounds F to [0, 1])");
    if (alloc != KVS_D2O_ALLOC_REF) {
        int64_t t, nh, mr;
        kvs_d2o_split(S, T, heavy, &t, &nh, &mr);
        if (S <= T)
            n += kvs_policy_note(buf, cap, "budget B-1=%lld <= sinks=%lld: an average layer holds sinks only (no heavy "
                                           "hitter, no recent window)",
                                 (long long)S, (long long)T);
        else if (nh == 0 && heavy > 0)
            n += kvs_policy_note(buf, cap, "budget B-1=%lld leaves an average layer no heavy-hitter slot beside %lld sinks "
                                           "(sinks + recent window, with merging)",
                                 (long long)S, (long long)t);
        else if (mr == 0)
            n += kvs_policy_note(buf, cap, "heavy=%g leaves no recent window: the newest token competes for eviction "
                                           "by its own attention",
                                 heavy);
        if (alloc == KVS_D2O_ALLOC_PAPER && variance == KVS_D2O_VAR_MINMAX && L > 1) {
            /* with F in [0, 1] a layer's share is at least 1/(1 + (L-1)e) of L(B-1) */
            int64_t lo = (int64_t)floor((double)L * (double)S / (1.0 + (double)(L - 1) * M_E));
            if (lo <= T && S > T)
                n += kvs_policy_note(buf, cap, "variance=minmax can give the sparsest layer as little as %lld slots, "
                                               "at most the %lld sinks: such a layer would keep sinks only",
                                     (long long)lo, (long long)T);
        }
    } else if (m->prompt_len > 0 && L > 1) {
        double rho = (double)S / (double)m->prompt_len;
        double wmax = variance == KVS_D2O_VAR_MINMAX ? 1.0 / (1.0 + (double)(L - 1) / M_E) : 1.0;
        if (wmax * L * rho > 1.0)
            n += kvs_policy_note(buf, cap, "alloc=ref: rho=%.3g lets a layer's ratio w L rho exceed 1, clamped without "
                                           "redistribution: the layers hold less than L(B-1) (D4 broken)",
                                 rho);
    }
    if ((int)kvs_policy_param_get(cfg, "skip") == KVS_D2O_SKIP_REF)
        n += kvs_policy_note(buf, cap, "skip=ref: layers 0, 1 and %d keep every position (not compressed)", L - 1);
    return n;
}

const struct kvs_policy_ops kvs_policy_d2o = {
    .version = KVS_POLICY_INTERFACE_VERSION,
    .name = "d2o",
    .summary = "D2O: variance-based layer budgets, sinks + recent + heavy hitters, EMA-threshold merging of evicted tokens",
    .is_oracle = 0,
    .granularity = KVS_SEL_PER_QUERY_HEAD,
    .budget_scope = KVS_BUDGET_EVERY_STEP,
    .params = d2o_params,
    .n_params = (int)(sizeof d2o_params / sizeof d2o_params[0]),
    .presets = d2o_presets,
    .n_presets = (int)(sizeof d2o_presets / sizeof d2o_presets[0]),
    .layout = d2o_layout,
    .notes = d2o_notes,
    .create = d2o_create,
    .free = d2o_free,
    .prefill = d2o_prefill,
    .select = d2o_select,
    .observe = d2o_observe,
    .layer_sync = d2o_layer_sync,
    .stored = d2o_stored,
    .window_evict = d2o_window_evict,
    .account = d2o_account,
    .alloc_begin = d2o_alloc_begin,
    .alloc_prefill = d2o_alloc_prefill,
    .alloc_end = d2o_alloc_end,
    .alloc_free = d2o_alloc_free,
    .alloc_shared = d2o_alloc_shared,
};

/* ---- test hooks (d2o_internal.h) --------------------------------------------------------------------- */

double kvs_d2o_tau(const void *state, int li, int64_t *events) {
    const d2o_state *s = state;
    if (s->full || li < 0 || li >= s->n_lists) {
        *events = 0;
        return 0;
    }
    *events = s->lists[li].events;
    return s->lists[li].tau;
}
