/* report.h — the study report of a results database (`kvsim report DB --out DIR`; ../shared/DESIGN.md "Results
 * (SQLite) and plots": "SQLite -> plots/ and the HTML/Markdown report"): one self-contained HTML page (every
 * image embedded as a data: URI, no external file, style sheet, script or network access) and the same report
 * in Markdown (its images written beside it in DIR).
 *
 * The report is a list of sections (plots/report.c, table `sections`), each a function that looks at the
 * database through results/results.h, results/compare.h and the family headers (results/results_<family>.h) and either
 * renders its part (Markdown + HTML + PNG plots drawn by plots/plot.h) or says why it is absent (listed at
 * the end of the report: "Not in this database"; only when the data really is absent: a database that fails
 * SQLite's integrity check, or a read that fails, fails the report). Adding a section is one function and one
 * table line. Today's sections: the summary (at each power-of-two memory level, every policy at its best
 * measured run using no more memory, the lowest mean output error crowned; one-candidate levels and ties said
 * so, degenerate (N) and oracle (O) runs marked and never crowned; the rule is written beside the table), the
 * traces used, every run with its parameters, KV codec and flags, the equal-memory
 * and equal-traffic comparisons (results/compare.h, what `kvsim compare` prints), error vs measured memory and
 * traffic with the Pareto frontier, error and memory vs nominal budget, and error vs decode position.
 * KV codecs (`kvsim replay --codec`, runs.codec): a codec's runs are a candidate of their own in the summary and a
 * row of their own in the comparisons, named "policy (params) [codec]" (the summary) or in a codec column (the tables,
 * "-" for K/V as captured); the plots draw them as their own series (plots/plot.h), the frontier over policies x
 * codecs.
 * With two or more traces of a model (one per prompt), the summary and the equal-cost sections answer over them
 * (results/compare.h "Across traces"): per policy the mean over the traces [lo, hi] (a percentile bootstrap interval
 * resampling traces, seeded from what is compared) and n; the summary counts a level as a win only when the paired
 * difference against the runner-up is resolved (its interval below 0), "not resolved over n traces" otherwise. One
 * trace: the tables of that trace, said to have no interval.
 *
 * DIR is never half-written: everything goes to a fresh folder beside it (.DIR.tmp.XXXXXX), which replaces DIR
 * only when complete. An existing DIR is replaced only when it holds a previous report and nothing else
 * (report.html, report.md, *.png); any other DIR is an error and is left as it was.
 */
#ifndef KVS_REPORT_H
#define KVS_REPORT_H

#include "../common/kvs.h"

typedef struct {
    const char *db_path;  /* the results database (opened read-only) */
    const char *out_dir;  /* the report folder */
    double mem_at;        /* equal-memory table at this many resident bytes per KV head; <= 0: chosen from the
                           * data (the middle one of the summary's memory levels) */
    double traffic_at;    /* equal-traffic table at this many bytes read per step per KV head; <= 0: chosen */
    const char *gnuplot;  /* program drawing the plots; NULL = "gnuplot" */
} kvs_report_options;

/* What was written (for the command's message and for tests). */
typedef struct {
    int n_present; /* sections rendered */
    int n_absent;  /* sections absent (with their reason in the report) */
    int n_images;  /* plots embedded */
} kvs_report_result;

/*! kvs_report_write() : writes DIR/report.html, DIR/report.md and DIR/<plot>.png from the database.
 *  Errors, with nothing written (no DIR created or changed, no temporary folder left): a missing or unreadable
 *  database KVS_ERR_IO; not a kvsim database, damaged (kvs_results_check: "database disk image is malformed"), a
 *  read failing mid-report, or a database without any run KVS_ERR_DB ("no runs in the database: nothing to
 *  report"); a newer schema KVS_ERR_VERSION; gnuplot missing or failing
 *  KVS_ERR_EXTERNAL; DIR not replaceable (not a previous report, or not writable) KVS_ERR_IO; bad options
 *  KVS_ERR_INVALID_ARG. `res` may be NULL. */
kvs_status kvs_report_write(const kvs_report_options *opt, kvs_report_result *res);

#endif /* KVS_REPORT_H */
