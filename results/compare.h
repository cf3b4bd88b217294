/* compare.h — policies compared at an equal cost, the budget-matching modes of POLICY_SPEC.md §1.5, computed
 * from the complete runs of a results database (results/results.h); what `kvsim compare` prints and what
 * `kvsim report` tabulates and summarises (plots/report.h).
 *   mem     = equal resident bytes including auxiliary structures (run-wide storage_bytes per KV head: its mean
 *             over steps, or its peak with x_stat max),
 *   traffic = equal HBM bytes read per decode step (run-wide traffic_bytes per KV head, mean or max; RocketKV's
 *             "token budget"),
 *   tokens  = each paper's nominal budget (budget_tokens per KV head).
 * ../shared/DESIGN.md ("Replay"): a policy that keeps every generated token (prompt-only compression) is
 * compared with the others at its measured memory, never only at its nominal budget — that is mem.
 *
 * Method. Runs are grouped into series by what they measured: (policy, canonical params, trace, measure, kv_bytes,
 * aux_bytes). The trace is its content hash (kvs_results_run_row.trace_sha256) when recorded, so the runs of one
 * file reached through two path spellings are one series and two different files with one base name are two;
 * without a hash, its traces row. kv_bytes and aux_bytes (runs.options) change every byte metric, so runs that
 * differ only by them are never averaged together. Each run is a point (x, metrics); runs of one series with the
 * same x are averaged. At X, with the points sorted by x:
 *   - a point with x = X is used as is (EXACT);
 *   - X outside [x of the first point, x of the last] is OUT_OF_RANGE: never extrapolated;
 *   - otherwise the two adjacent points x_lo < X < x_hi bracket X. When x_hi / x_lo <= max_ratio (default
 *     KVS_COMPARE_MAX_RATIO = 4, two doublings of a power-of-two budget sweep) every selected column is
 *     interpolated linearly in log(x): t = (ln X - ln x_lo) / (ln x_hi - ln x_lo), v = v_lo + t (v_hi - v_lo)
 *     (INTERPOLATED). A wider span is a GAP: the policy's cost jumps there (MorphKV's profiles appear once its
 *     budget passes its recent window: 1 KiB at budget 32, 18 KiB at 64), so a value between them is one no
 *     configuration of the series was measured at, possibly one none reaches; no value is given and the two
 *     bracketing points (their runs and budgets) are named instead. Add budgets inside the span to close it.
 * The matched quantity itself (storage_bytes_<x_stat> under mem, traffic_bytes_<x_stat> under traffic) is X by
 * construction. A value not recorded in a bracketing run is NaN.
 *
 * Flags (kvs_compare_run_flags): one derivation of the letters `kvsim runs`, `kvsim report` and `kvsim compare`
 * show: O oracle, P prompt-only budget, F failed, N a replay note (the configuration degenerates).
 *
 * Across traces (the second half of this header): with several traces of one model, each configuration's mean at X
 * over them with a percentile bootstrap interval resampling traces, and paired differences between configurations
 * (`kvsim compare` shows it by default when a model has two or more traces; `kvsim report` tabulates it).
 */
#ifndef KVS_COMPARE_H
#define KVS_COMPARE_H

#include <stddef.h>
#include <stdint.h>

#include "../common/kvs.h"
#include "../common/kvs_stats.h"
#include "results.h"

typedef enum { KVS_COMPARE_MEM = 0, KVS_COMPARE_TRAFFIC = 1, KVS_COMPARE_TOKENS = 2 } kvs_compare_match;
#define KVS_COMPARE_N_MATCH 3

/* The widest x_hi / x_lo two adjacent points of a series are interpolated across by default (the method above). */
#define KVS_COMPARE_MAX_RATIO 4.0

/*! kvs_compare_match_name() : "mem", "traffic", "tokens" ("?" out of range). */
const char *kvs_compare_match_name(kvs_compare_match m);
/*! kvs_compare_match_x() : the x of a match with the mean statistic: "storage_bytes_mean", "traffic_bytes_mean",
 *  "budget_tokens" (kvs_compare_x_name gives the x of a comparison, whichever statistic it uses). */
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
    KVS_COMPARE_INTERPOLATED = 0, /* between two adjacent points at most max_ratio apart */
    KVS_COMPARE_EXACT = 1,        /* a point at exactly X */
    KVS_COMPARE_OUT_OF_RANGE = 2, /* X outside [x of the first point, x of the last] */
    KVS_COMPARE_NO_X = 3,         /* no run of the series recorded its x */
    KVS_COMPARE_GAP = 4,          /* between two adjacent points more than max_ratio apart: no value */
} kvs_compare_status;

/*! kvs_compare_status_name() : "interpolated", "exact", "out_of_range", "no_x", "gap". */
const char *kvs_compare_status_name(kvs_compare_status s);

/* The flag letters of a run, in this order: O oracle (is_oracle), P prompt-only budget (budget_scope "prompt":
 * generated tokens all kept), F failed (status not "complete"), N a note (notes non-empty: replay warned that the
 * configuration degenerates at this budget or on this trace). */
#define KVS_COMPARE_FLAGS_CAP 5
/*! kvs_compare_run_flags() : run w's flag letters into out, NUL-terminated ("" when none). */
void kvs_compare_run_flags(const kvs_results_run_row *w, char out[KVS_COMPARE_FLAGS_CAP]);
/*! kvs_compare_run_prompt_only() : 1 when w has flag P. */
int kvs_compare_run_prompt_only(const kvs_results_run_row *w);
/*! kvs_compare_run_noted() : 1 when w has flag N. */
int kvs_compare_run_noted(const kvs_results_run_row *w);

/* One x of a series: the runs at that x averaged. */
typedef struct {
    double x;
    int64_t run_id, n_runs; /* the first run of the point; runs averaged into it */
    int64_t budget_tokens;  /* the first run's budget (tokens per KV head) */
    int64_t n_noted;        /* runs of the point with flag N */
    double *v;              /* [n_columns] */
} kvs_compare_point;

/* One series and its outcome at X. Read-only view owned by the kvs_compare it came from. */
typedef struct {
    const kvs_results_run_row *rep; /* the series' first run (policy, params, trace, measure); borrowed from the
                                     * rows given to kvs_compare_create */
    int is_oracle;                  /* some run of the series is an oracle (flag O) */
    int prompt_only;                /* some run has budget_scope "prompt": generated tokens all kept (flag P) */
    int degenerate;                 /* flag N: a run the value at X is drawn from carries a replay note (a run of
                                     * the bracketing points; of the exact point; of any point when there is no
                                     * bracket: out of range, no x) */
    int kv_bytes, aux_bytes;        /* the series' bytes per K/V and per auxiliary element; -1 when not recorded */
    int bytes_in_label;             /* 1 when another series differs from this one only by kv_bytes/aux_bytes */
    kvs_compare_point *pts;         /* [n] ascending x */
    size_t n;
    kvs_compare_status status;
    size_t lo, hi;                  /* bracketing points (lo == hi when exact); valid when status <= EXACT or GAP */
    double t;                       /* interpolation weight of hi (0 when exact, NaN for a gap) */
    double *val;                    /* [n_columns] the values at X; NaN when not available (always for a gap) */
    char label[512];                /* "policy (params)[ [kv_bytes=K,aux_bytes=A]][ (oracle)]" (bytes when
                                     * bytes_in_label) */
    char trace_label[160];          /* kvs_results_trace_label of rep ("<model>@<8 hex>" or the base name), with
                                     * " (trace N)" added when another series' different trace reads the same */
} kvs_compare_series;

/* What to compare at. A zero-initialised struct with match and at set is the default comparison. */
typedef struct {
    kvs_compare_match match;
    double at;              /* X, finite and > 0 */
    kvs_stat_kind x_stat;   /* mem and traffic: the statistic of the bytes metric that is x, KVS_STAT_MEAN (mean
                             * over steps) or KVS_STAT_MAX (peak); KVS_STAT_N (0 in a zeroed struct) = the mean;
                             * tokens: mean only (a budget has no statistic) */
    double max_ratio;       /* interpolate across adjacent points with x_hi / x_lo <= max_ratio (>= 1; INFINITY:
                             * across any span); 0 = KVS_COMPARE_MAX_RATIO */
} kvs_compare_opts;

/* A comparison: the series sorted by the first column, best first (usable series first, a NaN value after the
 * others; then gaps, then out of range, then no x; ties by label, then trace label). Opaque. */
typedef struct kvs_compare kvs_compare;

/*! kvs_compare_create_opts() : compares the complete runs among rows[0..n_rows) (failed runs and runs without a
 *  run-wide aggregate contribute no point) as `o` says, for the n_cols columns `cols` (copied; n_cols >= 1; a
 *  KVS_STAT_N column is KVS_ERR_INVALID_ARG). The rows are borrowed: keep them until kvs_compare_free.
 *  KVS_ERR_INVALID_ARG: X not finite and > 0, x_stat not mean or max (or max under tokens), max_ratio < 1 or NaN.
 *  @return KVS_OK and *out (caller frees with kvs_compare_free); KVS_ERR_NOMEM. */
kvs_status kvs_compare_create_opts(const kvs_results_run_row *rows, int64_t n_rows, const kvs_compare_opts *o,
                                   const kvs_compare_column *cols, int n_cols, kvs_compare **out);

/*! kvs_compare_create() : kvs_compare_create_opts with match and X, x the mean and max_ratio INFINITY: every
 *  bracketing span interpolated, no GAP (the comparison `kvsim report` tabulates; `kvsim compare` applies the
 *  default KVS_COMPARE_MAX_RATIO). */
kvs_status kvs_compare_create(const kvs_results_run_row *rows, int64_t n_rows, kvs_compare_match match, double X,
                              const kvs_compare_column *cols, int n_cols, kvs_compare **out);

/*! kvs_compare_free() : accepts NULL. */
void kvs_compare_free(kvs_compare *c);

size_t kvs_compare_n_series(const kvs_compare *c);
/*! kvs_compare_series_at() : series i (0 <= i < n_series) in sorted order; borrowed from c. */
const kvs_compare_series *kvs_compare_series_at(const kvs_compare *c, size_t i);
/*! kvs_compare_series_flags() : the series' flags among O P N (kvs_compare_run_flags' order) into out. */
void kvs_compare_series_flags(const kvs_compare_series *s, char out[KVS_COMPARE_FLAGS_CAP]);
kvs_compare_match kvs_compare_match_of(const kvs_compare *c);
double kvs_compare_at(const kvs_compare *c);
/*! kvs_compare_x_stat() : KVS_STAT_MEAN or KVS_STAT_MAX (tokens: KVS_STAT_MEAN). */
kvs_stat_kind kvs_compare_x_stat(const kvs_compare *c);
/*! kvs_compare_x_name() : the x of the comparison: "storage_bytes_mean", "storage_bytes_max", "traffic_bytes_mean",
 *  "traffic_bytes_max" or "budget_tokens". */
const char *kvs_compare_x_name(const kvs_compare *c);
/*! kvs_compare_max_ratio() : the widest span interpolated across (the default resolved). */
double kvs_compare_max_ratio(const kvs_compare *c);
int kvs_compare_n_columns(const kvs_compare *c);
/*! kvs_compare_column_at() : column i (0 <= i < n_columns); borrowed from c. */
const kvs_compare_column *kvs_compare_column_at(const kvs_compare *c, int i);

/*! kvs_compare_column_parse() : one column "<metric>_<stat>" (results/results.h kvs_results_column_parse) that
 *  can be compared (not a sample count); else KVS_ERR_INVALID_ARG with a detail naming it. */
kvs_status kvs_compare_column_parse(const char *name, kvs_compare_column *out);

/* ------------------------------------------------------------------------------------------------
 * Across traces: a policy's value at X over the traces of a model (one trace per prompt), with intervals
 *
 * One trace is one sample: with several traces of one model in the database (examples/capture_prompts.sh captures
 * one per prompt) the answer a reader needs is over the traces. The series of a comparison (above) are grouped:
 *   - a SET is (model, measure): the series compared with each other; its traces are the distinct traces (content
 *     hash, else traces row) of its series, ordered by their identity string (below);
 *   - a GROUP is one (policy, params, measure, kv_bytes, aux_bytes, model): the series of one configuration, one
 *     per trace of its set at most. On each trace it has a value at X (interpolated or exact), or is excluded there:
 *     out of range, gap, no x, or not run (no complete run on that trace).
 * Per column, the group's mean over the traces where it has a finite value, and the percentile bootstrap 95%
 * interval of that mean resampling traces (common/kvs_stats.h kvs_bootstrap_mean, KVS_BOOTSTRAP_REPS resamples);
 * n is the number of traces used (n = 1: lo = hi = mean, "one trace: no interval"). Groups of a set are sorted by
 * the first column's mean, best first (then by label; groups without a value last). The set's best group is its
 * first non-oracle group with a value (the first with a value when every one is an oracle: an oracle is a bound).
 *
 * A difference between two groups of a set is PAIRED: mean over the traces where both have a finite value of
 * (a - b), with its bootstrap interval (kvs_bootstrap_mean_diff). It is resolved when the interval excludes 0
 * (kvs_interval_resolved: +1 a above b, -1 below, 0 not resolved, always 0 over fewer than 2 traces). Two groups'
 * own intervals can overlap while their paired difference is resolved: the traces' common difficulty cancels.
 *
 * Seeds: an interval is a function of what is compared. Each is seeded with the 64-bit FNV-1a hash (offset basis
 * 14695981039346656037, prime 1099511628211) of the bytes of the identity string
 *   mean:        "<match>|<x name>|<X as %.17g>|<column>|<group key>|<trace ids>"
 *   difference:  "<match>|<x name>|<X as %.17g>|<column>|<group key a>|-|<group key b>|<trace ids>"
 * where match is kvs_compare_match_name, x name kvs_compare_x_name, the group key
 * "<policy>|<params>|<measure>|<kv_bytes>|<aux_bytes>|<model>" (bytes -1 when not recorded), and trace ids the
 * identities of the traces used, ascending in strcmp order, joined by ',': a trace's identity is its content hash
 * (64 lowercase hex digits), or "trace#<traces row id>" when the hash is not recorded. The values are passed to the
 * bootstrap in that order of traces. So the same database compared the same way gives the same intervals, and one
 * trace more or less changes the seed as it changes what is compared.
 * ---------------------------------------------------------------------------------------------- */

/* The seed hash: h = KVS_FNV1A64_BASIS, then h = kvs_fnv1a64(h, piece) for each piece of the identity string in
 * order (common/kvs_rng.h). */

/* The identity of a trace in a seed: its content hash (64 hex), or "trace#<id>". */
#define KVS_COMPARE_TRACE_ID_CAP 72
/*! kvs_compare_trace_identity() : run w's trace identity into out. */
void kvs_compare_trace_identity(const kvs_results_run_row *w, char out[KVS_COMPARE_TRACE_ID_CAP]);

/* One (model, measure) set of an across-traces comparison. Read-only view owned by its kvs_compare_across. */
typedef struct {
    const char *model, *measure;  /* borrowed from the rows */
    size_t n_traces;
    char (*trace_id)[KVS_COMPARE_TRACE_ID_CAP]; /* [n_traces] ascending (strcmp) */
    char (*trace_label)[160];                   /* [n_traces] as the series' trace_label reads */
    size_t first, n;                            /* its groups: kvs_compare_across_group_at(first .. first + n - 1) */
    size_t best;                                /* the index of its best group; SIZE_MAX when no group has a value */
} kvs_compare_set;

/* One group: a configuration over the traces of its set. Read-only view owned by its kvs_compare_across. */
typedef struct {
    const kvs_compare_series *rep;  /* its first series (policy, params, measure, model, bytes); borrowed */
    const char *label;              /* rep->label: "policy (params)[ [kv_bytes=K,aux_bytes=A]][ (oracle)]" */
    size_t set;                     /* kvs_compare_across_set_at(set) */
    const kvs_compare_series **by_trace; /* [n_traces of the set], in the set's trace order; NULL: not run there */
    size_t n_used;                  /* traces where it has a value at X (interpolated or exact) */
    size_t n_out_of_range, n_gap, n_no_x, n_not_run; /* traces excluded, by reason */
    int is_oracle, prompt_only;     /* some series is an oracle; some has a prompt-only budget */
    int degenerate;                 /* flag N on some series its value comes from */
    kvs_interval *col;              /* [n_columns]: mean [lo, hi] over the n traces with a finite value (n = 0 and
                                     * NaN when none) */
    uint64_t *seed;                 /* [n_columns] the seed of each interval (the identity above) */
} kvs_compare_group;

/* A paired difference a - b of one column between two groups of one set. */
typedef struct {
    size_t a, b;         /* group indices */
    int col;             /* column index */
    kvs_interval d;      /* mean(a - b) [lo, hi] over d.n common traces (d.n = 0, NaN: none in common) */
    uint64_t seed;       /* the seed of d (the identity above) */
    int resolved;        /* kvs_interval_resolved(&d) */
} kvs_compare_diff;

/* The across-traces view of a comparison. Opaque. */
typedef struct kvs_compare_across kvs_compare_across;

/*! kvs_compare_across_create() : groups the series of c as above and computes every group's means and intervals.
 *  c is borrowed: keep it until kvs_compare_across_free. @return KVS_OK and *out (caller frees with
 *  kvs_compare_across_free); KVS_ERR_NOMEM. */
kvs_status kvs_compare_across_create(const kvs_compare *c, kvs_compare_across **out);
/*! kvs_compare_across_free() : accepts NULL. */
void kvs_compare_across_free(kvs_compare_across *a);
size_t kvs_compare_across_n_sets(const kvs_compare_across *a);
const kvs_compare_set *kvs_compare_across_set_at(const kvs_compare_across *a, size_t i);
size_t kvs_compare_across_n_groups(const kvs_compare_across *a);
const kvs_compare_group *kvs_compare_across_group_at(const kvs_compare_across *a, size_t i);
/*! kvs_compare_across_max_traces() : the most traces of any set (`kvsim compare` aggregates by default when >= 2). */
size_t kvs_compare_across_max_traces(const kvs_compare_across *a);
/*! kvs_compare_across_diff() : the paired difference group ga - group gb of column col (both of one set, else
 *  KVS_ERR_INVALID_ARG) into *out, seeded as above. KVS_ERR_NOMEM. */
kvs_status kvs_compare_across_diff(const kvs_compare_across *a, size_t ga, size_t gb, int col, kvs_compare_diff *out);
/*! kvs_compare_group_flags() : the group's flags among O P N into out (as kvs_compare_series_flags). */
void kvs_compare_group_flags(const kvs_compare_group *g, char out[KVS_COMPARE_FLAGS_CAP]);
/*! kvs_compare_group_excluded() : the traces the group is excluded on, by reason, "out of range: m1@0f0e0d0c,
 *  m1@a1a2a3a4; not run: m1@77aa0b1c" (reasons in the order out of range, gap, no x, not run), into buf ("" when
 *  none; truncated to cap). */
void kvs_compare_group_excluded(const kvs_compare_across *a, const kvs_compare_group *g, char *buf, size_t cap);

#endif /* KVS_COMPARE_H */
