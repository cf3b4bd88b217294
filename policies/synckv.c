/* synckv.c — SyncKV, syncopated KV selection with representative heads (../shared/papers/synckv.txt §3-4, Eqs. 1-8,
 * Algorithm 1 in App. A, App. B.1 clustering, §5.1 configuration, App. C-D), as specified in
 * ../shared/POLICY_SPEC.md §2.4, §3 (SyncKV rows), §5.4 (S6, S11), §7 G5 and §8 item 4.
 *
 * Per layer the units (KV groups; MHA heads) are clustered (common/head_clusters.h); each cluster has one
 * representative unit (R) that keeps its full cache on the device and attends exactly. The other units (NR) keep
 * their full cache on the host and attend only to a small device-resident set: a static part I_S fixed at the
 * prompt and a dynamic part I_D that their representative re-selects every m decode steps (anticipation, Eqs.
 * 5-7) and that stays frozen in between (suspension, Eq. 8).
 *
 *  - Prompt (each turn; Eqs. 3-4): the R unit's attention of the last prompt query over every position, pooled
 *    (MAX) over its query heads, gives I_0 = TOPK(., k); by descending score its first k - k_dyn are static and
 *    the remaining k_dyn = floor((1 - rho) k) dynamic. layer_sync hands both to the NR units of the cluster.
 *  - Decode step t of a turn (t = 1, 2, ...): R attends 0..p. NR attends I_S ∪ I_D ∪ {p} (nr_recent adds the
 *    tokens generated since the anticipation that produced I_D). At t ≡ 0 (mod m) the R unit's own attention at
 *    this step (the engine's probabilities over 0..p, observe(): the same computation, reused as §2.4 says),
 *    pooled MAX, gives I_D,new = TOPK(., k_dyn); layer_sync hands it to the cluster, where it becomes visible at
 *    step t + 1 + fetch_latency_steps (Eq. 6 indexes it t+1).
 *  - Ablations (Table 3): anticipation=0 ("w/o Anticipation": I_D = I_D,0 for ever), m=1 ("w/o Suspension").
 *
 * Budget (kvsim's --budgets): B is the device KV per KV head at prefill, averaged over the layer's units, so
 * Mem% = B/P and `--budgets 30%` is the paper's Mem% = 30 % (kvsim's percentage is of the first prompt; B rounds
 * up to whole tokens). k per NR unit follows POLICY_SPEC §2.4 (policies/synckv_internal.h); k <= 0 is infeasible
 * and validate() rejects it with the reason (kvsim replay records the run as failed; §8.4a: Mem% = 20 % with
 * N_r = 2 of 8 units), never silently exceeding it. The engine's per-(layer, KV head) budget (the allocation
 * pass) is the whole trace for R units and k + 1 (plus the options' extra tokens) for NR units.
 *
 * Clusters: clusters=FILE reads `kvsim heads`' file (its SHA-256 is in the run's parameters) — the paper's way,
 * offline on a calibration corpus (App. B.1: 50 Wikipedia articles). clusters=prefill (the default: it needs
 * nothing but the trace, and says so in the run's notes) clusters on the replayed trace's own first prompt only:
 * S_ij = mean over the last `window` prompt queries of the overlap coefficient (Eq. 1, kvs_overlap_sorted) of
 * the units' top-kc sets of their pooled causal attention, then D = max(S) - S, K-means on rows of D and the
 * representative nearest the centroid (kvs_head_clusters_from_similarity; §2.4 steps 2-5). No future position
 * is read.
 *
 * Ambiguities resolved (POLICY_SPEC §8.4): N_r = 2 from 8 KV heads up, else 1 (b: the paper's two model sizes,
 * extrapolated); NR units see no newly generated token before the next anticipation (nr_recent=none, b) or the
 * tokens since it (since_anticipation); static and dynamic sets may overlap (exclude_static=0, c); the cluster's
 * own set (nr_union=cluster, §4.4 text) or the union over the layer (Algorithm 1 line 23, d); MAX pooling for the
 * selection as for the clustering (e); kc = k of the configuration, window 32 (f). Multi-turn [SIM-CHOICE]: k
 * stays the first prompt's; every turn's prompt re-initialises I_S and I_D from the R unit's last prompt query
 * over the whole history (the host holds it), positions of earlier turns fetched to the device; the step count t
 * restarts with each turn.
 *
 * Sliding-window layers (sim/replay.h): the host's window_evict names the first position the next step can attend,
 * and from then on a position before it exists nowhere (device or host): R units attend and store [first, n); the
 * static, dynamic and pending sets (R's and NR's) lose their positions before it at once (the NR units' sets are
 * lists of positions, no observe() needs them aligned); nr_recent's tokens start there too. The R unit's prompt
 * selection ranks its last prompt query's attention over the positions the window leaves, and an anticipation ranks
 * the step's attention (over the step's windowed set) among the positions still in the window after this step's
 * eviction, so no set is ever spent on a position the window drops. The host store holds the window (host bytes
 * and readable()). k keeps its rule (the first prompt's P and the budget, as every layer's): an NR unit of a
 * windowed layer whose k covers the window still misses the tokens generated since its last anticipation (the
 * method's suspension, not the window's), so unlike a plain budget a large k does not give zero error.
 * Storage and transfers (POLICY_SPEC §2.4 "Storage", "Traffic", §3): R units: device KV n, reads n. NR units:
 * device KV = the attended set (at most k + 1), aux = their index lists (int32), host = the full KV (n), d2h =
 * the new token every step plus the turn's prompt at its first decode step (the offload after prefill), h2d =
 * the fetched dynamic set (delta=1: only the tokens not already resident) charged at the step it becomes
 * visible, transient = that fetch (the old and new sets are both on the device while it swaps) plus a fetch
 * still in flight (fetch_latency_steps > 0). The run's Mem% (device KV / full KV) is in its notes, at prefill
 * and at the trace's end (R units grow with every token).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/head_clusters.h"
#include "../common/kvs_cluster.h"
#include "../common/kvs_math.h"
#include "registry.h"
#include "synckv_internal.h"

/* Parameter indices (table order). */
enum { P_NR, P_M, P_RHO, P_CLUSTERS, P_KC, P_WINDOW, P_ANTICIPATION, P_RECENT, P_UNION, P_EXCLUDE, P_LATENCY, P_DELTA };
enum { RECENT_NONE = 0, RECENT_SINCE = 1 };
enum { UNION_CLUSTER = 0, UNION_LAYER = 1 };

#define INDEX_BYTES 4.0 /* an index list entry is an int32 position */

static const kvs_policy_param synckv_params[] = {
    [P_NR] = {.key = "nr", .type = KVS_PARAM_INT, .def = 0, .lo = 0, .hi = KVS_HEAD_CLUSTERS_MAX_UNITS,
              .help = "clusters = representative units per layer (clusters=prefill); 0 = the paper's: 2 from 8 KV "
                      "heads up, else 1 (§5.1)"},
    [P_M] = {.key = "m", .type = KVS_PARAM_INT, .def = 5, .lo = 1, .hi = 1 << 20,
             .help = "anticipation period in decode steps (§5.1: 5; m=1 is 'w/o Suspension')"},
    [P_RHO] = {.key = "rho", .type = KVS_PARAM_DOUBLE, .def = 0.5, .lo = 0, .hi = 1,
               .help = "static ratio rho_s: k_dyn = floor((1-rho) k) tokens are re-selected (§5.1, App. D: 0.5)"},
    [P_CLUSTERS] = {.key = "clusters", .type = KVS_PARAM_FILE, .choices = "prefill", .def_str = "prefill",
                    .resolves = "head_clusters",
                    .help = "`kvsim heads` clusters file or results database (its latest heads run) - the paper's "
                            "offline calibration, App. B.1 - or prefill: K-means on this trace's own first prompt"},
    [P_KC] = {.key = "kc", .type = KVS_PARAM_INT, .def = 0, .lo = 0, .hi = 1 << 30,
              .help = "clusters=prefill: top-k of the overlaps; 0 = this configuration's k (POLICY_SPEC §2.4 k_c)"},
    [P_WINDOW] = {.key = "window", .type = KVS_PARAM_INT, .def = 32, .lo = 1, .hi = 1 << 20,
                  .help = "clusters=prefill: the overlaps are averaged over the last `window` prompt queries"},
    [P_ANTICIPATION] = {.key = "anticipation", .type = KVS_PARAM_BOOL, .def = 1,
                        .help = "0 = 'w/o Anticipation' (Table 3): the prompt's dynamic set for ever"},
    [P_RECENT] = {.key = "nr_recent", .type = KVS_PARAM_ENUM, .def = RECENT_NONE, .choices = "none|since_anticipation",
                  .help = "NR units also attend the tokens generated since the anticipation of their dynamic set"},
    [P_UNION] = {.key = "nr_union", .type = KVS_PARAM_ENUM, .def = UNION_CLUSTER, .choices = "cluster|layer",
                 .help = "cluster: own cluster's set (§4.4); layer: union over the layer's clusters (Algorithm 1 "
                         "l. 23, up to N_r k tokens: over the Mem% target)"},
    [P_EXCLUDE] = {.key = "exclude_static", .type = KVS_PARAM_BOOL, .def = 0,
                   .help = "the dynamic top-k skips static tokens (default: the sets may overlap)"},
    [P_LATENCY] = {.key = "fetch_latency_steps", .type = KVS_PARAM_INT, .def = 0, .lo = 0, .hi = 1 << 20,
                   .help = "extra steps before a fetched dynamic set is visible (0: from the next step; < m)"},
    [P_DELTA] = {.key = "delta", .type = KVS_PARAM_BOOL, .def = 0,
                 .help = "fetch only the dynamic tokens not already on the device (default: the whole set)"},
};

static const kvs_policy_preset synckv_presets[] = {
    {.name = "no-anticipation", .params = "anticipation=0",
     .help = "SyncKV Table 3 'w/o Anticipation': the prompt's selection for ever (--budgets 50%)"},
    {.name = "no-suspension", .params = "m=1",
     .help = "SyncKV Table 3 'w/o Suspension' (m = 1): re-selected every step (--budgets 50%)"},
    {.name = "m10", .params = "m=10", .help = "SyncKV Table 3, period m = 10 (--budgets 50%)"},
    {.name = "algorithm1", .params = "nr_union=layer",
     .help = "SyncKV Algorithm 1 line 23: NR units attend the union of the layer's clusters' sets"},
};

/* ---- the budget derivation (synckv_internal.h) ------------------------------------------------------------ */

double kvs_synckv_k_ratio(double mem, int32_t H, int32_t nr) { return (mem * H - nr) / (double)(H - nr); }

int64_t kvs_synckv_k_mem(double mem, int64_t P, int32_t H, int32_t nr) {
    return (int64_t)floor((mem * H - nr) * (double)P / (double)(H - nr) + 1e-9);
}

int64_t kvs_synckv_k_budget(int64_t budget, int64_t P, int32_t H, int32_t nr) {
    int64_t num = budget * H - (int64_t)nr * P, den = H - nr;
    return num >= 0 ? num / den : -((-num + den - 1) / den); /* floor for either sign */
}

int32_t kvs_synckv_default_nr(int32_t H) { return H >= 8 ? 2 : 1; }

/* ---- configuration: representatives per layer, k per layer ---------------------------------------------- */

/* A copy of c (caller frees with kvs_head_clusters_free). */
static kvs_status clusters_copy(const kvs_head_clusters *c, kvs_head_clusters **out) {
    kvs_status st = kvs_head_clusters_create(c->n_layers, c->n_units, out);
    if (st != KVS_OK) return st;
    size_t cells = (size_t)c->n_layers * (size_t)c->n_units;
    memcpy((*out)->n_clusters, c->n_clusters, (size_t)c->n_layers * sizeof *c->n_clusters);
    memcpy((*out)->cluster, c->cluster, cells * sizeof *c->cluster);
    memcpy((*out)->is_rep, c->is_rep, cells * sizeof *c->is_rep);
    return KVS_OK;
}

/* Representative units of every layer into nr[L] (and, for clusters=FILE, the clustering into *hc when hc is not
 * NULL; caller frees). KVS_ERR_INVALID_ARG naming the problem. */
static kvs_status layer_nr(const kvs_policy_config *cfg, const kvs_policy_model *m, int32_t *nr, kvs_head_clusters **hc) {
    const char *path = cfg->str[P_CLUSTERS];
    int32_t H = m->n_kv_heads;
    if (hc) *hc = NULL;
    if (!strcmp(path, "prefill") || !path[0]) {
        int32_t v = (int32_t)cfg->v[P_NR];
        if (v == 0) v = kvs_synckv_default_nr(H);
        if (v > H)
            return kvs_fail(KVS_ERR_INVALID_ARG, "synckv: nr=%d exceeds the %d KV heads (units) per layer", (int)v, (int)H);
        for (int l = 0; l < m->n_layers; l++) nr[l] = v;
        return KVS_OK;
    }
    if (cfg->v[P_NR] != 0)
        return kvs_fail(KVS_ERR_INVALID_ARG, "synckv: nr=%d conflicts with clusters=%s, whose clusters fix N_r per layer",
                        (int)cfg->v[P_NR], path);
    kvs_head_clusters *c = NULL;
    char sha[65];
    /* A results database is resolved above the engine into its latest heads run's clustering (cfg->resolved, pinned
     * by the digest of the database file taken when the spec was parsed; the run's notes say so). A clusters file is
     * read here and pinned by its digest (checked again: it must not change between parse and replay). */
    const kvs_head_clusters *given = cfg->resolved[P_CLUSTERS];
    int is_db = kvs_file_is_sqlite(path);
    if (is_db && !given)
        return kvs_fail(KVS_ERR_INVALID_ARG, "synckv: clusters=%s is a results database: its caller must resolve it "
                        "into a clustering (kvs_results_resolve_policy_inputs)", path);
    kvs_status st = given ? clusters_copy(given, &c) : kvs_head_clusters_read(path, &c, sha);
    if (st != KVS_OK) return kvs_fail(KVS_ERR_INVALID_ARG, "synckv: clusters=%s: %s", path, kvs_last_error());
    if (!given && cfg->sha256[P_CLUSTERS][0] && strcmp(sha, cfg->sha256[P_CLUSTERS])) {
        kvs_head_clusters_free(c);
        return kvs_fail(KVS_ERR_INVALID_ARG, "synckv: clusters=%s changed since it was given (sha256 %s, given %s)", path,
                        sha, cfg->sha256[P_CLUSTERS]);
    }
    if (c->n_layers != m->n_layers || c->n_units != H) {
        kvs_status e = kvs_fail(KVS_ERR_INVALID_ARG,
                                "synckv: clusters=%s has %d layers x %d units, the trace %d layers x %d KV heads", path,
                                (int)c->n_layers, (int)c->n_units, (int)m->n_layers, (int)H);
        kvs_head_clusters_free(c);
        return e;
    }
    for (int l = 0; l < m->n_layers; l++) nr[l] = c->n_clusters[l];
    if (hc) *hc = c;
    else kvs_head_clusters_free(c);
    return KVS_OK;
}

/* k of a layer with nr representatives for budget B (0 when every unit is a representative). */
static int64_t layer_k(const kvs_policy_model *m, int64_t budget, int32_t nr) {
    int32_t H = m->n_kv_heads;
    return nr < H ? kvs_synckv_k_budget(budget, m->prompt_len, H, nr) : 0;
}

static kvs_status synckv_validate(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget) {
    if (m->prompt_len < 1) return kvs_fail(KVS_ERR_INVALID_ARG, "synckv: the trace has no prompt to derive k from");
    if (cfg->v[P_LATENCY] >= cfg->v[P_M])
        return kvs_fail(KVS_ERR_INVALID_ARG, "synckv: fetch_latency_steps=%d must be less than m=%d (a fetch must "
                                             "land before the next anticipation)",
                        (int)cfg->v[P_LATENCY], (int)cfg->v[P_M]);
    if (cfg->v[P_RECENT] == RECENT_SINCE && !cfg->v[P_ANTICIPATION])
        return kvs_fail(KVS_ERR_INVALID_ARG, "synckv: nr_recent=since_anticipation needs anticipation=1 (without "
                                             "anticipation the recent tokens would grow without bound)");
    int32_t *nr = malloc((size_t)m->n_layers * sizeof *nr);
    if (!nr) return kvs_fail(KVS_ERR_NOMEM, "synckv: out of memory");
    kvs_status st = layer_nr(cfg, m, nr, NULL);
    for (int l = 0; st == KVS_OK && l < m->n_layers; l++) {
        int32_t H = m->n_kv_heads;
        if (nr[l] >= H) continue;
        int64_t k = layer_k(m, budget, nr[l]);
        if (k <= 0)
            st = kvs_fail(KVS_ERR_INVALID_ARG,
                          "synckv: infeasible: Mem%% = %.4g%% (budget %lld of the %lld-token prompt) with N_r = %d of %d "
                          "units per layer keeping full caches (they alone hold %.4g%%): k/P = %.4f, k = %lld <= 0 "
                          "(POLICY_SPEC §8.4a)",
                          100.0 * (double)budget / (double)m->prompt_len, (long long)budget, (long long)m->prompt_len,
                          (int)nr[l], (int)H, 100.0 * nr[l] / H,
                          kvs_synckv_k_ratio((double)budget / (double)m->prompt_len, H, nr[l]), (long long)k);
    }
    free(nr);
    return st;
}

/* Tokens an NR unit may attend beyond k + 1 (nr_recent=since_anticipation: at most m + latency - 1). */
static int64_t recent_extra(const kvs_policy_config *cfg) {
    return cfg->v[P_RECENT] == RECENT_SINCE ? (int64_t)cfg->v[P_M] + (int64_t)cfg->v[P_LATENCY] - 1 : 0;
}

/* Attended tokens bound of an NR unit of a layer with nr representatives and per-unit k. */
static int64_t nr_budget(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t k, int32_t nr) {
    int64_t sets = cfg->v[P_UNION] == UNION_LAYER ? (int64_t)nr * k : k;
    int64_t b = sets + 1 + recent_extra(cfg);
    return b < m->n_positions ? b : m->n_positions;
}

static int synckv_notes(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget, char *buf, size_t cap) {
    int n = 0;
    if (synckv_validate(cfg, m, budget) != KVS_OK) return 0;
    int32_t *nr = malloc((size_t)m->n_layers * sizeof *nr);
    if (!nr || layer_nr(cfg, m, nr, NULL) != KVS_OK) {
        free(nr);
        return 0;
    }
    int32_t H = m->n_kv_heads;
    int64_t P = m->prompt_len, N = m->n_positions;
    double dev_p = 0, dev_n = 0, kmin = -1, kmax = -1;
    int all_rep = 1;
    for (int l = 0; l < m->n_layers; l++) {
        int64_t k = layer_k(m, budget, nr[l]);
        int64_t kp = k < P ? k : P, kn = nr_budget(cfg, m, k, nr[l]);
        dev_p += (double)nr[l] * (double)P + (double)(H - nr[l]) * (double)kp;
        dev_n += (double)nr[l] * (double)N + (double)(H - nr[l]) * (double)(kn < N ? kn : N);
        if (nr[l] < H) {
            all_rep = 0;
            if (kmin < 0 || k < kmin) kmin = (double)k;
            if (k > kmax) kmax = (double)k;
        }
    }
    double full_p = (double)m->n_layers * H * (double)P, full_n = (double)m->n_layers * H * (double)N;
    if (all_rep)
        n += kvs_policy_note(buf, cap, "every unit is a representative (N_r = %d KV heads): the full cache", (int)H);
    else {
        char ks[64];
        if (kmin == kmax) snprintf(ks, sizeof ks, "%.0f", kmin);
        else snprintf(ks, sizeof ks, "%.0f..%.0f", kmin, kmax);
        n += kvs_policy_note(buf, cap,
                             "Mem%% target %.4g%%: k = %s tokens per NR unit (k_dyn = floor((1-rho) k)); device KV %.4g%% "
                             "of the full KV at prefill, at most %.4g%% at the trace's last position (R caches grow with n, NR sets stay)",
                             100.0 * (double)budget / (double)P, ks, 100.0 * dev_p / full_p, 100.0 * dev_n / full_n);
    }
    if (!strcmp(cfg->str[P_CLUSTERS], "prefill"))
        n += kvs_policy_note(buf, cap, "clusters=prefill: clustered on this trace's own prompt, not the paper's offline "
                                       "calibration corpus (App. B.1; give clusters=FILE from kvsim heads)");
    else if (kvs_file_is_sqlite(cfg->str[P_CLUSTERS]))
        n += kvs_policy_note(buf, cap, "clusters from the latest kvsim heads run of the results database %s",
                             kvs_path_base(cfg->str[P_CLUSTERS]));
    if (!all_rep && kmax >= (double)P)
        n += kvs_policy_note(buf, cap, "k >= the prompt (%lld): NR units keep the whole prompt at prefill", (long long)P);
    if (!all_rep && floor((1.0 - cfg->v[P_RHO]) * kmin) < 1)
        n += kvs_policy_note(buf, cap, "k_dyn = floor((1-rho) k) = 0: nothing is re-selected (the static set only)");
    if (cfg->v[P_UNION] == UNION_LAYER)
        n += kvs_policy_note(buf, cap, "nr_union=layer: NR units hold up to N_r k tokens, over the Mem%% target");
    if (cfg->v[P_RECENT] == RECENT_SINCE)
        n += kvs_policy_note(buf, cap, "nr_recent=since_anticipation: NR units hold up to m + fetch_latency_steps - 1 "
                                       "recent tokens beyond k + 1");
    free(nr);
    return n;
}

/* ---- shared math helpers -------------------------------------------------------------------------------- */

/* out[j] = max over the `group` query heads of softmax(scale q_g . k_j) over positions 0..n-1 (MAX pooling of a
 * group's attention, App. B.1). sc: n floats scratch. */
static void pooled_attention(const float *q, int group, int d, const float *keys, int64_t n, float scale, float *out,
                             float *sc) {
    for (int g = 0; g < group; g++) {
        kvs_attn_scores(q + (size_t)g * (size_t)d, keys, (size_t)d, NULL, (size_t)n, (size_t)d, scale, sc);
        kvs_softmax(sc, (size_t)n);
        for (int64_t j = 0; j < n; j++) out[j] = g == 0 || sc[j] > out[j] ? sc[j] : out[j];
    }
}

/* out = a ∪ b (strictly ascending inputs and output); @return its size. out may not alias a or b. */
static int64_t set_union(const int32_t *a, int64_t na, const int32_t *b, int64_t nb, int32_t *out) {
    int64_t i = 0, j = 0, w = 0;
    while (i < na || j < nb) {
        if (j >= nb || (i < na && a[i] < b[j])) out[w++] = a[i++];
        else if (i >= na || b[j] < a[i]) out[w++] = b[j++];
        else {
            out[w++] = a[i++];
            j++;
        }
    }
    return w;
}

/* ---- allocation pass: clusters and k per layer (init->shared) ------------------------------------------- */

typedef struct {
    kvs_head_clusters *hc; /* [L][H] clusters and representatives */
    int64_t *k;            /* [L] tokens per NR unit */
    int32_t *nr;           /* [L] representatives */
} synckv_shared;

typedef struct {
    synckv_shared sh;
    kvs_policy_config cfg;
    kvs_policy_model model;
    int64_t budget;
    int own_prefill;
    /* clusters=prefill, one layer at a time: the top-kc sets of the last W prompt queries of each unit */
    int64_t W, kc;
    int32_t *sets;   /* [H][W][kc] ascending positions */
    int64_t *set_n;  /* [H][W] */
    uint8_t *done;   /* [H] units of the current layer seen */
    int cur_layer;
    float *pool, *sc; /* [P] */
    int32_t *top;     /* [P] */
    double *S;        /* [H][H] */
} synckv_alloc;

static void synckv_alloc_free(void *alloc) {
    synckv_alloc *a = alloc;
    if (!a) return;
    kvs_head_clusters_free(a->sh.hc);
    free(a->sh.k);
    free(a->sh.nr);
    free(a->sets);
    free(a->set_n);
    free(a->done);
    free(a->pool);
    free(a->sc);
    free(a->top);
    free(a->S);
    free(a);
}

static kvs_status synckv_alloc_begin(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget,
                                     void **alloc) {
    *alloc = NULL;
    kvs_status st = synckv_validate(cfg, m, budget);
    if (st != KVS_OK) return st;
    synckv_alloc *a = calloc(1, sizeof *a);
    if (!a) return kvs_fail(KVS_ERR_NOMEM, "synckv: out of memory");
    a->cfg = *cfg;
    a->model = *m;
    a->budget = budget;
    a->cur_layer = -1;
    int L = m->n_layers, H = m->n_kv_heads;
    int64_t P = m->prompt_len;
    a->sh.k = calloc((size_t)L, sizeof *a->sh.k);
    a->sh.nr = calloc((size_t)L, sizeof *a->sh.nr);
    if (!a->sh.k || !a->sh.nr) goto nomem;
    if ((st = layer_nr(cfg, m, a->sh.nr, &a->sh.hc)) != KVS_OK) goto fail;
    for (int l = 0; l < L; l++) a->sh.k[l] = layer_k(m, budget, a->sh.nr[l]);
    a->own_prefill = a->sh.hc == NULL;
    if (a->own_prefill) {
        if ((st = kvs_head_clusters_create(L, H, &a->sh.hc)) != KVS_OK) goto fail;
        a->W = (int64_t)cfg->v[P_WINDOW] < P ? (int64_t)cfg->v[P_WINDOW] : P;
        int64_t kc = (int64_t)cfg->v[P_KC];
        if (kc == 0) { /* this configuration's k (the largest over layers; equal unless N_r differs) */
            for (int l = 0; l < L; l++)
                if (a->sh.k[l] > kc) kc = a->sh.k[l];
        }
        if (kc < 1) kc = 1;
        if (kc > P) kc = P;
        a->kc = kc;
        a->sets = malloc((size_t)H * (size_t)a->W * (size_t)kc * sizeof *a->sets);
        a->set_n = calloc((size_t)H * (size_t)a->W, sizeof *a->set_n);
        a->done = calloc((size_t)H, 1);
        a->pool = malloc((size_t)P * sizeof *a->pool);
        a->sc = malloc((size_t)P * sizeof *a->sc);
        a->top = malloc((size_t)P * sizeof *a->top);
        a->S = malloc((size_t)H * (size_t)H * sizeof *a->S);
        if (!a->sets || !a->set_n || !a->done || !a->pool || !a->sc || !a->top || !a->S) goto nomem;
    }
    *alloc = a;
    return KVS_OK;
nomem:
    st = kvs_fail(KVS_ERR_NOMEM, "synckv: out of memory");
fail:
    synckv_alloc_free(a);
    return st;
}

/* Clusters layer l from the sets of its H units (every unit seen). */
static kvs_status cluster_layer(synckv_alloc *a, int l) {
    int H = a->model.n_kv_heads;
    size_t W = (size_t)a->W, kc = (size_t)a->kc;
    for (int i = 0; i < H; i++)
        for (int j = 0; j < H; j++) {
            double s = 0;
            for (size_t r = 0; r < W; r++) {
                size_t ri = (size_t)i * W + r, rj = (size_t)j * W + r;
                s += kvs_overlap_sorted(a->sets + ri * kc, (size_t)a->set_n[ri], a->sets + rj * kc, (size_t)a->set_n[rj]);
            }
            a->S[(size_t)i * (size_t)H + (size_t)j] = W ? s / (double)W : 1.0;
        }
    return kvs_head_clusters_from_similarity(a->sh.hc, l, a->S, a->sh.nr[l], NULL);
}

static kvs_status synckv_alloc_prefill(void *alloc, int layer, int kv_head, const kvs_policy_view *v) {
    synckv_alloc *a = alloc;
    if (!a->own_prefill) return KVS_OK;
    int H = a->model.n_kv_heads;
    if (layer != a->cur_layer) {
        for (int h = 0; a->cur_layer >= 0 && h < H; h++)
            if (!a->done[h]) return kvs_fail(KVS_ERR_STATE, "synckv: layer %d's prompt came before layer %d was complete",
                                             layer, a->cur_layer);
        a->cur_layer = layer;
        memset(a->done, 0, (size_t)H);
    }
    size_t Gd = (size_t)v->group * (size_t)v->head_dim, kc = (size_t)a->kc;
    int64_t P = v->n;
    for (int64_t r = 0; r < a->W; r++) {
        int64_t pos = P - a->W + r, n = pos + 1; /* causal: the query at pos sees 0..pos */
        const float *q = v->q + (size_t)(pos - v->q_first) * Gd;
        pooled_attention(q, v->group, v->head_dim, v->k, n, v->scale, a->pool, a->sc);
        size_t kk = (size_t)n < kc ? (size_t)n : kc;
        int32_t *set = a->sets + ((size_t)kv_head * (size_t)a->W + (size_t)r) * kc;
        kvs_topk_sorted(a->pool, (size_t)n, kk, set);
        a->set_n[(size_t)kv_head * (size_t)a->W + (size_t)r] = (int64_t)kk;
    }
    a->done[kv_head] = 1;
    for (int h = 0; h < H; h++)
        if (!a->done[h]) return KVS_OK;
    return cluster_layer(a, layer);
}

static kvs_status synckv_alloc_end(void *alloc, int64_t *budgets) {
    synckv_alloc *a = alloc;
    int L = a->model.n_layers, H = a->model.n_kv_heads;
    kvs_status st = kvs_head_clusters_check(a->sh.hc);
    if (st != KVS_OK) return st; /* clusters=prefill with a layer never seen, or a bad file */
    for (int l = 0; l < L; l++)
        for (int h = 0; h < H; h++) {
            size_t c = (size_t)l * (size_t)H + (size_t)h;
            budgets[c] = a->sh.hc->is_rep[c] ? a->model.n_positions : nr_budget(&a->cfg, &a->model, a->sh.k[l], a->sh.nr[l]);
        }
    return KVS_OK;
}

static const void *synckv_alloc_shared(void *alloc) { return &((synckv_alloc *)alloc)->sh; }

/* ---- instances ------------------------------------------------------------------------------------------ */

typedef struct {
    kvs_policy_model model;
    int group, d, H, unit, cluster, is_rep, n_reps;
    int64_t m, latency, k, k_dyn, extra;
    int anticipation, recent, layer_union, exclude_static, delta;
    /* turn and step */
    int64_t turn_begin, prompt_end, n_seen, t; /* t: the last decode step of the turn (0 after its prompt) */
    int64_t win_first, sel_lo; /* the host evicted every position before win_first (sliding-window layer; 0
                                * otherwise); sel_lo: the first position of an R unit's last selection */
    /* R unit: its latest sets, ascending; r_new: a dynamic set computed at this step for layer_sync */
    int32_t *r_stat, *r_dyn;
    int64_t nr_stat, nr_dyn;
    int r_new;
    /* NR unit: active static/dynamic sets, a pending dynamic set (visible from step pend_step), ascending */
    int32_t *stat, *dyn, *pend;
    int64_t n_stat, n_dyn, n_pend, pend_step, anchor, pend_anchor; /* anchor: position of the anticipation */
    int has_pend;
    /* accounting of the step just selected (account()) */
    int64_t st_fetched, st_prompt_offload, st_turn_fetch;
    int first_decode;
    /* scratch */
    float *pool, *sc;
    int32_t *top, *tmp;
    int64_t cap;       /* positions the scratch holds */
    int64_t set_cap;   /* entries each set array holds */
} synckv_state;

static void synckv_free(void *state) {
    synckv_state *s = state;
    if (!s) return;
    free(s->r_stat);
    free(s->r_dyn);
    free(s->stat);
    free(s->dyn);
    free(s->pend);
    free(s->pool);
    free(s->sc);
    free(s->top);
    free(s->tmp);
    free(s);
}

static kvs_status reserve(synckv_state *s, int64_t n) {
    if (n <= s->cap) return KVS_OK;
    int64_t cap = s->cap ? s->cap : 256;
    while (cap < n) cap *= 2;
    float *pool = realloc(s->pool, (size_t)cap * sizeof *pool);
    if (pool) s->pool = pool;
    float *sc = pool ? realloc(s->sc, (size_t)cap * sizeof *sc) : NULL;
    if (sc) s->sc = sc;
    int32_t *top = sc ? realloc(s->top, (size_t)cap * sizeof *top) : NULL;
    if (top) s->top = top;
    int32_t *tmp = top ? realloc(s->tmp, (size_t)cap * sizeof *tmp) : NULL;
    if (!tmp) return kvs_fail(KVS_ERR_NOMEM, "synckv: out of memory");
    s->tmp = tmp;
    s->cap = cap;
    return KVS_OK;
}

static kvs_status synckv_create(const kvs_policy_init *init, void **state) {
    const synckv_shared *sh = init->shared;
    if (!sh) return kvs_fail(KVS_ERR_STATE, "synckv: no clusters from the allocation pass");
    synckv_state *s = calloc(1, sizeof *s);
    if (!s) return kvs_fail(KVS_ERR_NOMEM, "synckv: out of memory");
    const kvs_policy_config *cfg = init->cfg;
    s->model = *init->model;
    s->group = init->model->group;
    s->d = init->model->head_dim;
    s->H = init->model->n_kv_heads;
    s->unit = init->kv_head;
    size_t c = (size_t)init->layer * (size_t)s->H + (size_t)init->kv_head;
    s->cluster = sh->hc->cluster[c];
    s->is_rep = sh->hc->is_rep[c];
    s->n_reps = sh->nr[init->layer];
    s->m = (int64_t)cfg->v[P_M];
    s->latency = (int64_t)cfg->v[P_LATENCY];
    s->k = sh->k[init->layer];
    s->k_dyn = (int64_t)floor((1.0 - cfg->v[P_RHO]) * (double)s->k);
    if (s->k_dyn > s->k) s->k_dyn = s->k;
    if (s->k_dyn < 0) s->k_dyn = 0;
    s->anticipation = cfg->v[P_ANTICIPATION] != 0;
    s->recent = (int)cfg->v[P_RECENT];
    s->layer_union = (int)cfg->v[P_UNION] == UNION_LAYER;
    s->exclude_static = cfg->v[P_EXCLUDE] != 0;
    s->delta = cfg->v[P_DELTA] != 0;
    s->set_cap = (s->layer_union ? (int64_t)s->n_reps : 1) * (s->k > 0 ? s->k : 1);
    s->r_stat = malloc((size_t)s->set_cap * sizeof *s->r_stat);
    s->r_dyn = malloc((size_t)s->set_cap * sizeof *s->r_dyn);
    s->stat = malloc((size_t)s->set_cap * sizeof *s->stat);
    s->dyn = malloc((size_t)s->set_cap * sizeof *s->dyn);
    s->pend = malloc((size_t)s->set_cap * sizeof *s->pend);
    kvs_status st = KVS_OK;
    if (!s->r_stat || !s->r_dyn || !s->stat || !s->dyn || !s->pend) st = kvs_fail(KVS_ERR_NOMEM, "synckv: out of memory");
    if (st == KVS_OK) st = reserve(s, init->model->prompt_len + 1);
    if (st != KVS_OK) {
        synckv_free(s);
        return st;
    }
    *state = s;
    return KVS_OK;
}

/* R unit: I_0 = TOPK(pooled attention of the turn's last prompt query over 0..n-1, k), split by score into
 * static (first k - k_dyn) and dynamic (the rest). */
static kvs_status synckv_prefill(void *state, const kvs_policy_view *view) {
    synckv_state *s = state;
    s->first_decode = 1;
    s->st_prompt_offload = view->prompt_end - view->turn_begin;
    s->turn_begin = view->turn_begin;
    s->prompt_end = view->prompt_end;
    s->n_seen = view->n;
    kvs_status st = reserve(s, view->n + 1);
    if (st != KVS_OK || !s->is_rep || s->k <= 0) return st;
    size_t Gd = (size_t)s->group * (size_t)s->d;
    const float *q = view->q + (size_t)(view->n_q - 1) * Gd;
    int64_t lo = s->win_first < view->n ? s->win_first : view->n, n = view->n - lo; /* the window's positions */
    pooled_attention(q, s->group, s->d, view->k + (size_t)lo * (size_t)s->d, n, view->scale, s->pool, s->sc);
    int64_t k = s->k < n ? s->k : n, kd = s->k_dyn < k ? s->k_dyn : k;
    kvs_topk(s->pool, (size_t)n, (size_t)k, s->top); /* descending score */
    for (int64_t i = 0; i < k; i++) s->top[i] += (int32_t)lo;
    s->nr_stat = k - kd;
    s->nr_dyn = kd;
    memcpy(s->r_stat, s->top, (size_t)s->nr_stat * sizeof *s->top);
    memcpy(s->r_dyn, s->top + s->nr_stat, (size_t)kd * sizeof *s->top);
    kvs_sort_positions(s->r_stat, (size_t)s->nr_stat);
    kvs_sort_positions(s->r_dyn, (size_t)s->nr_dyn);
    return KVS_OK;
}

/* The NR unit's device set for decode step `t` (positions < `upto`): static ∪ the dynamic set visible at t ∪
 * (nr_recent) the positions after its anticipation. Into out (ascending); @return its size. Uses s->tmp. */
static int64_t nr_device_set(synckv_state *s, int64_t t, int64_t upto, int32_t *out) {
    int use_pend = s->has_pend && t >= s->pend_step;
    const int32_t *dyn = use_pend ? s->pend : s->dyn;
    int64_t n_dyn = use_pend ? s->n_pend : s->n_dyn, anchor = use_pend ? s->pend_anchor : s->anchor;
    int64_t w = set_union(s->stat, s->n_stat, dyn, n_dyn, s->tmp);
    memcpy(out, s->tmp, (size_t)w * sizeof *out);
    if (s->recent == RECENT_SINCE)
        for (int64_t j = anchor + 1 > s->win_first ? anchor + 1 : s->win_first; j < upto; j++)
            if (w == 0 || out[w - 1] < j) out[w++] = (int32_t)j; /* after every selected position: stays ascending */
    return w;
}

static kvs_status synckv_select(void *state, const kvs_policy_view *view, kvs_policy_sel *sel) {
    synckv_state *s = state;
    int64_t n = view->n, p = n - 1;
    kvs_status st = reserve(s, n + 1);
    if (st != KVS_OK) return st;
    s->t = p - view->prompt_end + 1;
    s->n_seen = n;
    s->st_fetched = 0;
    if (s->is_rep || s->k <= 0) {
        s->sel_lo = s->win_first;
        for (int64_t j = s->sel_lo; j < n; j++) sel->idx[0][j - s->sel_lo] = (int32_t)j;
        sel->n[0] = n - s->sel_lo;
        return KVS_OK;
    }
    if (s->has_pend && s->t >= s->pend_step) { /* the fetched dynamic set arrives */
        int64_t common = (int64_t)kvs_intersect_sorted(s->pend, (size_t)s->n_pend, s->dyn, (size_t)s->n_dyn);
        s->st_fetched = s->delta ? s->n_pend - common : s->n_pend;
        memcpy(s->dyn, s->pend, (size_t)s->n_pend * sizeof *s->dyn);
        s->n_dyn = s->n_pend;
        s->anchor = s->pend_anchor;
        s->has_pend = 0;
    }
    int64_t w = nr_device_set(s, s->t, p, sel->idx[0]);
    if (w == 0 || sel->idx[0][w - 1] < p) sel->idx[0][w++] = (int32_t)p;
    sel->n[0] = w;
    return KVS_OK;
}

/* R unit at an anticipation step: I_D,new = TOPK(pooled attention over 0..p, k_dyn) from the engine's
 * probabilities of its exact attention (sel = 0..p ascending). */
static kvs_status synckv_observe(void *state, const kvs_policy_view *view, const kvs_policy_sel *sel,
                                 const float *const *probs) {
    synckv_state *s = state;
    if (!s->is_rep || s->k <= 0 || !s->anticipation || s->t % s->m != 0) return KVS_OK;
    int64_t n = sel->n[0];
    if (n != view->n - s->sel_lo)
        return kvs_fail(KVS_ERR_STATE, "synckv: a representative attended %lld of %lld positions", (long long)n,
                        (long long)(view->n - s->sel_lo));
    for (int64_t j = 0; j < n; j++) { /* pool[j]: position sel_lo + j */
        float x = probs[0][j];
        for (int g = 1; g < s->group; g++) x = probs[g][j] > x ? probs[g][j] : x;
        s->pool[j] = x;
    }
    /* candidates: the positions still in the window after this step's eviction (window_evict ran before observe) */
    int64_t off = s->win_first - s->sel_lo, avail = n - off;
    if (s->exclude_static) {
        for (int64_t i = 0; i < s->nr_stat; i++) s->pool[s->r_stat[i] - s->sel_lo] = -INFINITY;
        avail -= s->nr_stat;
    }
    int64_t kd = s->k_dyn < avail ? s->k_dyn : avail;
    kvs_topk_sorted(s->pool + off, (size_t)(n - off), (size_t)kd, s->r_dyn);
    for (int64_t i = 0; i < kd; i++) s->r_dyn[i] += (int32_t)s->win_first;
    s->nr_dyn = kd;
    s->r_new = 1;
    return KVS_OK;
}

/* Hands the representatives' sets to the NR units: after the prompt (static + dynamic, visible at once) and
 * after an anticipation step (dynamic, visible latency + 1 steps later). */
static kvs_status synckv_layer_sync(void *const *states, int n_kv_heads, kvs_policy_sync_phase phase) {
    int any_new = 0;
    for (int h = 0; h < n_kv_heads; h++) {
        synckv_state *r = states[h];
        any_new |= r->is_rep && (phase == KVS_SYNC_PREFILL || r->r_new);
    }
    if (!any_new) return KVS_OK;
    for (int h = 0; h < n_kv_heads; h++) {
        synckv_state *s = states[h];
        if (s->is_rep || s->k <= 0) continue;
        /* A later turn's new sets may hold earlier turns' positions, which live on the host: fetched. The old
         * device set (positions before this turn) goes to s->top first. */
        int64_t n_old = phase == KVS_SYNC_PREFILL && s->turn_begin > 0 ? nr_device_set(s, s->t + 1, s->turn_begin, s->top) : 0;
        int64_t ns = 0, nd = 0;
        for (int j = 0; j < n_kv_heads; j++) {
            synckv_state *r = states[j];
            if (!r->is_rep || (!s->layer_union && r->cluster != s->cluster)) continue;
            if (ns + r->nr_stat > s->set_cap || nd + r->nr_dyn > s->set_cap)
                return kvs_fail(KVS_ERR_STATE, "synckv: the representatives' sets exceed a unit's %lld tokens",
                                (long long)s->set_cap);
            if (phase == KVS_SYNC_PREFILL) {
                ns = set_union(s->stat, ns, r->r_stat, r->nr_stat, s->tmp);
                memcpy(s->stat, s->tmp, (size_t)ns * sizeof *s->tmp);
            }
            nd = set_union(s->pend, nd, r->r_dyn, r->nr_dyn, s->tmp);
            memcpy(s->pend, s->tmp, (size_t)nd * sizeof *s->tmp);
        }
        if (phase == KVS_SYNC_PREFILL) {
            s->n_stat = ns;
            memcpy(s->dyn, s->pend, (size_t)nd * sizeof *s->dyn);
            s->n_dyn = nd;
            s->anchor = s->n_seen - 1;
            s->has_pend = 0;
            s->t = 0;
            int64_t w = set_union(s->stat, ns, s->dyn, nd, s->tmp), before = 0;
            while (before < w && s->tmp[before] < s->turn_begin) before++;
            s->st_turn_fetch = before - (int64_t)kvs_intersect_sorted(s->tmp, (size_t)before, s->top, (size_t)n_old);
        } else {
            s->n_pend = nd;
            s->has_pend = 1;
            s->pend_step = s->t + 1 + s->latency;
            s->pend_anchor = s->n_seen - 1;
        }
    }
    for (int h = 0; h < n_kv_heads; h++) ((synckv_state *)states[h])->r_new = 0;
    return KVS_OK;
}

/* Device-resident positions: R units every position seen; NR units the set the next step attends (the current
 * step's new token is on the host only, unless nr_recent keeps it). */
static int64_t synckv_stored(void *state, int g, int32_t *out) {
    synckv_state *s = state;
    (void)g;
    if (s->is_rep || s->k <= 0) {
        for (int64_t j = s->win_first; j < s->n_seen; j++) out[j - s->win_first] = (int32_t)j;
        return s->n_seen - s->win_first;
    }
    if (s->n_seen == 0) return 0;
    return nr_device_set(s, s->t + 1, s->n_seen, out);
}

/* Device plus the host store: every position seen (NR units keep their full cache on the host). */
static int64_t synckv_readable(void *state, int g, int32_t *out) {
    synckv_state *s = state;
    (void)g;
    for (int64_t j = s->win_first; j < s->n_seen; j++) out[j - s->win_first] = (int32_t)j;
    return s->n_seen - s->win_first;
}

/* Drops the entries before `first` of the ascending set a[0..*n). */
static void set_drop_before(int32_t *a, int64_t *n, int64_t first) {
    int64_t j = 0;
    while (j < *n && a[j] < first) j++;
    memmove(a, a + j, (size_t)(*n - j) * sizeof *a);
    *n -= j;
}

/* The host's eviction (sim/replay.h "Sliding-window layers"): every set loses its positions before `first` at once. */
static kvs_status synckv_window_evict(void *state, int64_t first) {
    synckv_state *s = state;
    if (first <= s->win_first) return KVS_OK;
    s->win_first = first;
    set_drop_before(s->r_stat, &s->nr_stat, first);
    set_drop_before(s->r_dyn, &s->nr_dyn, first);
    set_drop_before(s->stat, &s->n_stat, first);
    set_drop_before(s->dyn, &s->n_dyn, first);
    set_drop_before(s->pend, &s->n_pend, first);
    return KVS_OK;
}

static void synckv_account(void *state, const kvs_policy_view *view, const kvs_policy_sel *sel, kvs_policy_cost *out) {
    synckv_state *s = state;
    const kvs_policy_model *m = &s->model;
    int first = s->first_decode;
    s->first_decode = 0;
    if (s->is_rep || s->k <= 0) return; /* the default: every position on the device, attended, no transfer */
    double slots = (double)sel->n[0];
    out->kv_bytes = out->dedup_kv_bytes = kvs_policy_kv_bytes(m, slots);
    out->aux_bytes = INDEX_BYTES * (double)(s->n_stat + s->n_dyn + (s->has_pend ? s->n_pend : 0));
    out->host_bytes = kvs_policy_kv_bytes(m, (double)(view->n - s->win_first)); /* a windowed layer: its window */
    double fetched = (double)(s->st_fetched + (first ? s->st_turn_fetch : 0));
    if (first) s->st_turn_fetch = 0;
    out->h2d_bytes = kvs_policy_kv_bytes(m, fetched);
    out->d2h_bytes = kvs_policy_kv_bytes(m, 1.0 + (first ? (double)s->st_prompt_offload : 0.0));
    out->transient_bytes = kvs_policy_kv_bytes(m, (double)s->st_fetched + (s->has_pend ? (double)s->n_pend : 0.0));
    out->write_bytes = kvs_policy_kv_bytes(m, 1.0 + fetched);
}

const struct kvs_policy_ops kvs_policy_synckv = {
    .version = KVS_POLICY_INTERFACE_VERSION,
    .name = "synckv",
    .summary = "SyncKV: per-layer head clusters; representative KV groups attend fully, the others a static + "
               "dynamic set their representative refreshes every m steps, full KV on the host; budget B = device KV "
               "per KV head at prefill (Mem% = B/P: --budgets 30% is Mem% 30%; infeasible Mem% is rejected)",
    .is_oracle = 0,
    .granularity = KVS_SEL_PER_KV_HEAD,
    .budget_scope = KVS_BUDGET_EVERY_STEP,
    .params = synckv_params,
    .n_params = (int)(sizeof synckv_params / sizeof synckv_params[0]),
    .presets = synckv_presets,
    .n_presets = (int)(sizeof synckv_presets / sizeof synckv_presets[0]),
    .validate = synckv_validate,
    .notes = synckv_notes,
    .create = synckv_create,
    .free = synckv_free,
    .prefill = synckv_prefill,
    .select = synckv_select,
    .observe = synckv_observe,
    .layer_sync = synckv_layer_sync,
    .stored = synckv_stored,
    .readable = synckv_readable,
    .window_evict = synckv_window_evict,
    .account = synckv_account,
    .alloc_begin = synckv_alloc_begin,
    .alloc_prefill = synckv_alloc_prefill,
    .alloc_end = synckv_alloc_end,
    .alloc_free = synckv_alloc_free,
    .alloc_shared = synckv_alloc_shared,
};
