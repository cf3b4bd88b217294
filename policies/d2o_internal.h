/* d2o_internal.h — D2O's merge math, EMA threshold and layer allocation (policies/d2o.c), exposed for
 * tests/test_d2o.c only (STYLE.md rule 1: cross-module internals in *_internal.h). The policy itself is reached
 * through kvs_policy_d2o (policies/registry.h).
 * Follows ../shared/papers/d2o.txt §4.1 (Eqs. 4-5), §4.2.2 (Eqs. 9-12) and ../shared/POLICY_SPEC.md §2.3, §7 G4;
 * every choice is written up in policies/d2o.c's header.
 */
#ifndef KVS_POLICIES_D2O_INTERNAL_H
#define KVS_POLICIES_D2O_INTERNAL_H

#include <stdint.h>

/* Parameter choices, in the order of d2o.c's parameter table. */
enum { KVS_D2O_VAR_RAW = 0, KVS_D2O_VAR_MINMAX = 1 };                     /* variance: Eq. 4 / reference */
enum { KVS_D2O_ALLOC_PAPER = 0, KVS_D2O_ALLOC_REF = 1, KVS_D2O_ALLOC_UNIFORM = 2 }; /* alloc */
enum { KVS_D2O_MERGE_PAPER = 0, KVS_D2O_MERGE_REF = 1, KVS_D2O_MERGE_NONE = 2 };   /* merge weights */
enum { KVS_D2O_TAU_HEAD = 0, KVS_D2O_TAU_LAYER = 1 };                      /* tau */
enum { KVS_D2O_DECIDE_HEAD = 0, KVS_D2O_DECIDE_MEAN = 1 };                 /* decide */
enum { KVS_D2O_SKIP_NONE = 0, KVS_D2O_SKIP_REF = 1 };                      /* skip */
enum { KVS_D2O_GQA_EXPAND = 0, KVS_D2O_GQA_SUM = 1 };                      /* gqa */

/* ---- token level: nearest neighbour, EMA threshold, weighted merging -------------------------------- */

/*! kvs_d2o_nearest() : Eq. 9 for one evicted key: the index j* of the conserved row (rows[j], j < n, d floats
 *  each, contiguous, n >= 1) with the highest cosine similarity to `key` (kvs_cosine_f64: decided and returned
 *  in double, never rounded to float; ties go to the lower index, i.e. the older position), and that similarity
 *  in *m. */
int64_t kvs_d2o_nearest(const float *key, const float *rows, int64_t n, int32_t d, double *m);

/*! kvs_d2o_tau_next() : Eq. 10 with the event counter: the first event (events == 0) sets tau = m (the mean
 *  of the event's max similarities, "average of the highest similarity values"); later events
 *  tau = beta m + (1 - beta) tau. m is the mean over the event's evicted tokens (one token per decode step). */
double kvs_d2o_tau_next(int64_t events, double tau, double m, double beta);

/*! kvs_d2o_merge() : merges n_e evicted rows ke[i]/ve[i] (d floats) with similarities u[i] to the conserved
 *  row k/v, in place (Eqs. 11-12):
 *    KVS_D2O_MERGE_PAPER: w_c = e / Z, w_i = exp(u_i) / Z, Z = e + sum_i exp(u_i) (e = exp(cos(k, k)) = exp(1),
 *                         the conserved token's own term; POLICY_SPEC §2.3 step 7 [RECON] of Eq. 12);
 *    KVS_D2O_MERGE_REF:   k = (k + sum_i u_i k_i) / (1 + n_e) (scatter_reduce mean including self).
 *  Values take the same weights. Arithmetic in double, stored as float. n_e = 0 leaves k/v unchanged. */
void kvs_d2o_merge(int weights, float *k, float *v, int32_t d, int64_t n_e, const float *const *ke,
                   const float *const *ve, const double *u);

/* ---- layer level: density and allocation ------------------------------------------------------------ */

/*! kvs_d2o_variance() : variance of x[0..n-1] around its mean, divided by n (ddof 0, POLICY_SPEC §1.4 default)
 *  or n - 1 (ddof 1, torch.var); 0 when n <= ddof. In double. */
double kvs_d2o_variance(const double *x, int64_t n, int ddof);

/*! kvs_d2o_weights() : the inverse-variance softmax w_l = exp(-F_l) / sum_l' exp(-F_l') (Eq. 5 without L rho),
 *  computed as exp(-(F_l - min F)) so that a raw O(P) variance does not underflow every term. */
void kvs_d2o_weights(const double *F, int n_layers, double *w);

/* The allocation pass's result, handed to every instance (init->shared) and read by the tests. All arrays
 * [n_layers], owned by the allocation (freed with it). Cache sizes count the slots held BETWEEN decode steps
 * (the paper's S_l = T + N + M); the engine budget of layer l is cache[l] + 1 (the current token attended too),
 * or the trace length for a layer left uncompressed. */
typedef struct {
    int32_t n_layers;
    int variance, alloc;
    int64_t prompt_len;  /* P, the first turn's prompt */
    int64_t budget;      /* B, the run's nominal budget (attended set, current token included) */
    double rho;          /* (B - 1) / P: the paper's compression ratio (0 when P = 0) */
    double *F;           /* density F_l as used: raw variance (Eq. 4) or mean of min-max normalised head variances */
    double *w;           /* softmax(-F) */
    double *alpha;       /* cache[l] / P: the paper's alpha_l (sum = L rho with alloc=paper, D4); for an
                          * uncompressed layer the alpha it was allocated, not used */
    int64_t *cache;      /* S_l: slots held between steps (sinks + heavy + recent) */
    int64_t *sinks, *heavy, *recent; /* the split of S_l: T' sinks, N heavy hitters besides the sinks, M recent */
    char *full;          /* 1: layer not compressed (skip=ref: layers 0, 1, L-1) */
} kvs_d2o_layers;

/*! kvs_d2o_allocate() : fills out's alpha/cache/split arrays from out->w (weights), out->n_layers,
 *  out->prompt_len, out->budget and out->alloc (see policies/d2o.c "Allocation"): paper: S_total = L (B - 1)
 *  split by w with the largest-remainder rounding (sum exact); ref: ratio_l = clamp(w_l L rho, 0.01, 1),
 *  N_l = floor((P + 1) ratio_l heavy), M_l = floor((P + 1) ratio_l (1 - heavy)), sinks inside N_l;
 *  uniform: S_l = B - 1. `full` marks layers 0, 1 and L-1 when skip_ref != 0. */
void kvs_d2o_allocate(kvs_d2o_layers *out, int64_t sinks, double heavy, int skip_ref);

/*! kvs_d2o_split() : the paper's split of a cache of S slots (Eq. 7, S = T + N + M): T' = min(T, S) sinks,
 *  N = floor(heavy (S - T')) heavy hitters, M = S - T' - N recent. */
void kvs_d2o_split(int64_t cache, int64_t sinks, double heavy, int64_t *t, int64_t *n, int64_t *m);

/* ---- test hooks --------------------------------------------------------------------------------------- */

/*! kvs_d2o_tau() : the EMA threshold of list `li` of a D2O instance (state from kvs_policy_d2o.create) and its
 *  event count in *events (0: no eviction yet, tau undefined). */
double kvs_d2o_tau(const void *state, int li, int64_t *events);

#endif /* KVS_POLICIES_D2O_INTERNAL_H */
