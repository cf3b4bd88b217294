/* calibrate.h — can offline replay rank KV-cache policies as closed-loop decoding does? The analysis behind `kvsim
 * calibrate` (../shared/DESIGN.md "Closed-loop decoding (calibration of the replay)"), on the runs of one results
 * database: every teacher-forced closed-loop run on a trace (results/results_closed.h, `kvsim generate --trace T`)
 * paired with the replay run of T (results/results.h, --measure decode) at the same policy, parameters and budget,
 * then the Spearman rank correlation of each offline metric with each closed-loop one.
 *
 * Pairs. A trace is its content hash (kvs_results_run_row.trace_sha256) where both runs recorded one, else its
 * traces row; a configuration run twice is paired by its latest runs.
 *
 * Duplicates collapsed. Within one trace, a pair whose offline numbers are those of an earlier pair (closed-loop run
 * id order) counts as that pair: every statistic (n, mean, p50, p95, max, min) of every quality and token-count
 * metric of the run-wide aggregate equal (NaN equal to NaN), and the two runs' stored out_err series (per position,
 * the mean over layers and query heads) equal where both stored one. Such configurations attend the same positions at every
 * step: a policy that degenerates into another (MorphKV whose window fills its budget, the SnapKV family at a budget
 * within its observation window, RocketKV and its multi-turn variant on a one-turn trace, `full` at every budget).
 * Storage is not compared: a window in disguise stores more, and its selection is still the window's. A replay note
 * (flag N) says how a configuration degenerates; it is counted as the configuration it degenerates into exactly when
 * its numbers are that one's (the rule above), and as itself otherwise: the notes of Quest's page quota, SparQ's
 * per-head estimates, D2O's sparsest layer or KeyDiff's one-shot prefill describe behaviours of their own.
 *
 * Selections. A correlation is over the pairs of one model in one selection:
 *   - BUDGET B: the pairs at budget_tokens B (nominal budget, tokens per KV head), the full cache left out
 *     (budget_scope "none": it is at no budget, and its 0 error and 0 KL would be a rank both sides agree on by
 *     construction);
 *   - MEMORY k: the pairs whose replay measured a mean resident size (storage_bytes mean over the decode steps,
 *     bytes per KV head, KV plus auxiliary) in [2^k, 2^(k+1)), whatever their budget, the full cache included (at
 *     equal memory it is one more configuration);
 *   - POOLED: every pair but the full cache, all budgets together: most of its correlation is the budget axis (a
 *     larger budget is better on both sides), kept for comparison with the within-budget figures.
 * In each trace the selection's distinct configurations are its units (a collapsed class counts once, as its first
 * member in the selection).
 *
 * Statistic. For each trace with at least 3 units, Spearman's rho over its units (common/kvs_stats.h kvs_spearman;
 * units whose two values are not both finite are left out of that cell); the figure is the mean over the traces
 * where rho is defined (n = their number). Ranks are compared within one text, never across texts: two texts'
 * different difficulty would otherwise enter the correlation the way the budget axis enters the pooled one; every
 * text weighs the same (one prompt is one sample).
 *
 * Interval. A percentile bootstrap (Efron & Tibshirani 1993, ch. 13) over the two crossed levels of the design
 * (the pigeonhole bootstrap, Owen 2007): each resample draws the model's policies (the registry names with a unit
 * in the selection) with replacement, keeping all of a policy's configurations on every trace together (a policy
 * drawn twice counts twice), and independently the traces with replacement; rho of each drawn trace over the drawn
 * policies' units, the resample's value the mean over the drawn traces where it is defined (resamples where none is
 * are dropped). lo and hi are the (1-level)/2 and (1+level)/2 quantiles of the resampled values
 * (kvs_quantile_sorted, type 7). One trace: the policy level alone; one policy: no interval (lo = hi = NaN). Each draw is a PCG32 output scaled to [0, n)
 * ((u32 * n) >> 32), the policies first, then the traces, per resample; the generator (common/kvs_rng.h) seeded with
 * the selection's identity: the 64-bit FNV-1a hash (offset basis 14695981039346656037, prime 1099511628211) of
 *   "calibrate|<model>|<selection>|<unit>,<unit>,...[|seed=<S>]"
 * where selection is "pooled", "budget=<B>" or "memory=<k>", each unit "<trace>|<policy>|<params>|<budget>" (the
 * trace its content hash, or "trace#<traces row id>" without one), ascending in strcmp order, and |seed=<S> only for
 * a nonzero extra seed. The same database gives the same intervals; the resamples are shared by the nine cells of a
 * selection.
 */
#ifndef KVS_CALIBRATE_H
#define KVS_CALIBRATE_H

#include <stddef.h>
#include <stdint.h>

#include "../common/kvs.h"
#include "../common/kvs_stats.h"
#include "results.h"
#include "results_closed.h"

/* The offline metrics (replay) and the closed-loop ones correlated. */
enum { KVS_CALIB_NX = 3, KVS_CALIB_NY = 3 };
/* "out_err_mean", "out_err_p95", "attn_recall": the replay's run-wide out_err mean and p95, attn_recall mean. */
extern const char *const kvs_calibration_x_names[KVS_CALIB_NX];
/* "kl_mean", "top1_agree", "delta_ppl": mean KL(full || policy), top-1 agreement, ppl_policy - ppl_full. */
extern const char *const kvs_calibration_y_names[KVS_CALIB_NY];

/* No memory bin (the run recorded no positive storage). */
#define KVS_CALIB_NO_MEM (-1000)

/* One pair. Read-only view owned by its kvs_calibration. */
typedef struct {
    const kvs_results_closed_row *c; /* the closed-loop run */
    const kvs_results_run_row *r;    /* the replay run */
    size_t trace;                    /* kvs_calibration_trace_at index */
    size_t policy;                   /* kvs_calibration_policy_name index: the bootstrap's cluster */
    size_t rep;                      /* the pair it collapses into (its own index when distinct): the first pair of
                                      * its trace with the same offline numbers */
    int full_cache;                  /* budget_scope "none" (closed or replay run) */
    int noted;                       /* the replay run carries a note (flag N) */
    int mem_log2;                    /* floor(log2(storage_bytes mean)), KVS_CALIB_NO_MEM when not recorded */
    double x[KVS_CALIB_NX], y[KVS_CALIB_NY];
} kvs_calibration_pair;

/* One trace with pairs. Read-only view owned by its kvs_calibration. */
typedef struct {
    const char *model;   /* the closed-loop runs' model name */
    const char *path;    /* the replay's trace path */
    char id[72];         /* the content hash, or "trace#<id>" */
    char label[160];     /* kvs_results_trace_label ("<model>@<8 hex>") */
    int64_t prompt_len;
    size_t first, n;     /* its pairs: kvs_calibration_pair_at(first .. first + n - 1), closed-loop run id order */
    size_t n_distinct;   /* classes among them (n - n_distinct collapsed) */
    size_t n_y_differ;   /* collapsed pairs whose closed-loop numbers differ from their class's first pair's */
} kvs_calibration_trace;

typedef struct kvs_calibration kvs_calibration;

/*! kvs_calibration_create() : reads the closed-loop and the replay runs of db, pairs and collapses them as above.
 *  @return KVS_OK and *out (caller frees with kvs_calibration_free); KVS_ERR_STATE when no pair exists (the detail
 *  says what to run); the database's errors; KVS_ERR_NOMEM. */
kvs_status kvs_calibration_create(kvs_results_db *db, kvs_calibration **out);
/*! kvs_calibration_free() : accepts NULL. */
void kvs_calibration_free(kvs_calibration *c);

size_t kvs_calibration_n_pairs(const kvs_calibration *c);
const kvs_calibration_pair *kvs_calibration_pair_at(const kvs_calibration *c, size_t i);
size_t kvs_calibration_n_traces(const kvs_calibration *c);
const kvs_calibration_trace *kvs_calibration_trace_at(const kvs_calibration *c, size_t i);
size_t kvs_calibration_n_policies(const kvs_calibration *c);
const char *kvs_calibration_policy_name(const kvs_calibration *c, size_t i);

typedef enum { KVS_CALIB_POOLED = 0, KVS_CALIB_BUDGET = 1, KVS_CALIB_MEMORY = 2 } kvs_calibration_kind;

/* A selection (above). Borrowed strings. */
typedef struct {
    const char *model;        /* the closed-loop runs' model name */
    kvs_calibration_kind kind;
    int64_t budget;           /* BUDGET: tokens per KV head */
    int mem_log2;             /* MEMORY: k of [2^k, 2^(k+1)) bytes */
} kvs_calibration_sel;

/*! kvs_calibration_in_sel() : 1 when pair i belongs to selection s (before collapsing), else 0. */
int kvs_calibration_in_sel(const kvs_calibration *c, const kvs_calibration_sel *s, size_t i);

/* The correlations of one selection. */
typedef struct {
    kvs_interval rho[KVS_CALIB_NX][KVS_CALIB_NY]; /* mean over traces of rho [lo, hi]; .n traces where rho is
                                                   * defined (0: mean NaN); lo = hi = NaN without an interval (no
                                                   * bootstrap, or no resample gave a value) */
    double rho_min[KVS_CALIB_NX][KVS_CALIB_NY], rho_max[KVS_CALIB_NX][KVS_CALIB_NY]; /* over those traces */
    int n_boot[KVS_CALIB_NX][KVS_CALIB_NY];       /* resamples that gave a value */
    size_t n_pairs;          /* pairs in the selection (all traces of the model) */
    size_t n_units;          /* distinct configurations in it, summed over traces */
    size_t n_traces;         /* traces with at least 3 units (the traces the figure and the bootstrap use) */
    size_t units_min, units_max; /* units per such trace */
    size_t n_policies;       /* policies with a unit on those traces (the bootstrap's clusters) */
    uint64_t seed;           /* the bootstrap's seed (the identity above) */
} kvs_calibration_corr;

/*! kvs_calibration_correlate() : the figures of selection s with `reps` bootstrap resamples (0: none) at `level`
 *  (in (0, 1)), seed_extra mixed into the identity seed when nonzero. KVS_ERR_INVALID_ARG for reps < 0, a level
 *  outside (0, 1) or no s->model; KVS_ERR_NOMEM. */
kvs_status kvs_calibration_correlate(const kvs_calibration *c, const kvs_calibration_sel *s, int reps, double level,
                                     uint64_t seed_extra, kvs_calibration_corr *out);

#endif /* KVS_CALIBRATE_H */
