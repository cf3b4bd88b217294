/* compare.h — policies compared at an equal cost, the budget-matching modes of POLICY_SPEC.md §1.5, computed
 * from the complete runs of a results database (results/results.h); what `kvsim compare` prints and what
 * `kvsim report` tabulates and summarises (plots/report.h).
 *   mem     = equal resident bytes including auxiliary structures (run-wide storage_bytes mean per KV head),
 *   traffic = equal HBM bytes read per decode step (run-wide traffic_bytes mean per KV head; RocketKV's
 *             "token budget"),
 *   tokens  = each paper's nominal budget (budget_tokens per KV head).
 * ../shared/DESIGN.md ("Replay"): a policy that keeps every generated token (prompt-only compression) is
 * compared with the others at its measured memory, never only at its nominal budget — that is mem.
 *
 * Method. Runs are grouped into series (policy, params, trace, measure). Each run is a point (x, metrics);
 * runs of one series with the same x are averaged. At X, every selected column is interpolated linearly in
 * log(x) between the two points that bracket X: t = (ln X - ln x_lo) / (ln x_hi - ln x_lo),
 * v = v_lo + t (v_hi - v_lo); a point with x = X is used as is. The matched quantity itself (storage_bytes_mean
 * under mem, traffic_bytes_mean under traffic) is X by construction. A series whose points do not bracket X is
 * KVS_COMPARE_OUT_OF_RANGE: never extrapolated. A value not recorded in a bracketing run is NaN.
 */
#ifndef KVS_COMPARE_H
#define KVS_COMPARE_H

#include <stddef.h>
#include <stdint.h>

#include "../common/kvs.h"
#include "results.h"

typedef enum { KVS_COMPARE_MEM = 0, KVS_COMPARE_TRAFFIC = 1, KVS_COMPARE_TOKENS = 2 } kvs_compare_match;
#define KVS_COMPARE_N_MATCH 3

/*! kvs_compare_match_name() : "mem", "traffic", "tokens" ("?" out of range). */
const char *kvs_compare_match_name(kvs_compare_match m);
/*! kvs_compare_match_x() : the x of a match: "storage_bytes_mean", "traffic_bytes_mean", "budget_tokens". */
const char *kvs_compare_match_x(kvs_compare_match m);
/*! kvs_compare_match_parse() : "mem", "traffic" or "tokens"; else KVS_ERR_INVALID_ARG. */
kvs_status kvs_compare_match_parse(const char *s, kvs_compare_match *out);

/* One compared value: a statistic of a metric ("out_err_p95"). */
typedef struct {
    kvs_metric m;
    kvs_stat_kind s;
    char name[96];
} kvs_compare_column;

/* Where a series stands at X. */
typedef enum {
    KVS_COMPARE_INTERPOLATED = 0, /* between two points */
    KVS_COMPARE_EXACT = 1,        /* a point at exactly X */
    KVS_COMPARE_OUT_OF_RANGE = 2, /* X outside [x of the first point, x of the last] */
    KVS_COMPARE_NO_X = 3,         /* no run of the series recorded its x */
} kvs_compare_status;

/*! kvs_compare_status_name() : "interpolated", "exact", "out_of_range", "no_x". */
const char *kvs_compare_status_name(kvs_compare_status s);

/* One x of a series: the runs at that x averaged. */
typedef struct {
    double x;
    int64_t run_id, n_runs; /* the first run of the point; runs averaged into it */
    double *v;              /* [n_columns] */
} kvs_compare_point;

/* One series and its outcome at X. Read-only view owned by the kvs_compare it came from. */
typedef struct {
    const kvs_results_run_row *rep; /* the series' first run (policy, params, trace, measure); borrowed from the
                                     * rows given to kvs_compare_create */
    int is_oracle;                  /* some run of the series is an oracle */
    int prompt_only;                /* some run has budget_scope "prompt": generated tokens all kept */
    kvs_compare_point *pts;         /* [n] ascending x */
    size_t n;
    kvs_compare_status status;
    size_t lo, hi;                  /* bracketing points (lo == hi when exact); valid when status <= EXACT */
    double t;                       /* interpolation weight of hi */
    double *val;                    /* [n_columns] the values at X; NaN when not available */
    char label[512];                /* "policy (params)[ (oracle)]" */
} kvs_compare_series;

/* A comparison: the series sorted by the first column, best first (usable series first, a NaN value after the
 * others; then out of range, then no x; ties by label). Opaque. */
typedef struct kvs_compare kvs_compare;

/*! kvs_compare_create() : compares the complete runs among rows[0..n_rows) (failed runs and runs without a
 *  run-wide aggregate contribute no point) at X under `match`, for the n_cols columns `cols` (copied; n_cols
 *  >= 1; a KVS_STAT_N column is KVS_ERR_INVALID_ARG). The rows are borrowed: keep them until kvs_compare_free.
 *  X must be finite and > 0 (KVS_ERR_INVALID_ARG). @return KVS_OK and *out (caller frees with kvs_compare_free);
 *  KVS_ERR_NOMEM. */
kvs_status kvs_compare_create(const kvs_results_run_row *rows, int64_t n_rows, kvs_compare_match match, double X,
                              const kvs_compare_column *cols, int n_cols, kvs_compare **out);

/*! kvs_compare_free() : accepts NULL. */
void kvs_compare_free(kvs_compare *c);

size_t kvs_compare_n_series(const kvs_compare *c);
/*! kvs_compare_series_at() : series i (0 <= i < n_series) in sorted order; borrowed from c. */
const kvs_compare_series *kvs_compare_series_at(const kvs_compare *c, size_t i);
kvs_compare_match kvs_compare_match_of(const kvs_compare *c);
double kvs_compare_at(const kvs_compare *c);
int kvs_compare_n_columns(const kvs_compare *c);
/*! kvs_compare_column_at() : column i (0 <= i < n_columns); borrowed from c. */
const kvs_compare_column *kvs_compare_column_at(const kvs_compare *c, int i);

/*! kvs_compare_column_parse() : one column "<metric>_<stat>" (results/results.h kvs_results_column_parse) that
 *  can be compared (not a sample count); else KVS_ERR_INVALID_ARG with a detail naming it. */
kvs_status kvs_compare_column_parse(const char *name, kvs_compare_column *out);

#endif /* KVS_COMPARE_H */
