/* plot.c — plots from the kvsim results database through a gnuplot pipe (see plot.h). Follows
 * ../shared/DESIGN.md "Results (SQLite) and plots"; the tables read are documented in sim/SCHEMA.md.
 *
 * How a plot is made: all data is read from the database first (so a database problem is reported
 * before any program runs), gnuplot is located on PATH (a clear "gnuplot not found" instead of a shell
 * error), the script and the data (inline `plot '-' ... e` blocks, no temporary files) are written to
 * gnuplot's stdin, gnuplot writes OUT.partial, and only when gnuplot exited 0 and the file is non-empty is
 * it renamed to OUT. Any failure removes OUT.partial, so a failed plot leaves nothing behind.
 */
#include "plot.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define KVS_PLOT_SCHEMA_VERSION 1 /* the sim/results.c schema this reader understands */

/* ------------------------------------------------------------------------------------------------
 * Read-only database open
 * ---------------------------------------------------------------------------------------------- */

kvs_status kvs_plot_db_open(const char *path, sqlite3 **out) {
    static const char magic[16] = "SQLite format 3";
    if (!path || !out) return kvs_fail(KVS_ERR_INVALID_ARG, "results db: NULL path");
    *out = NULL;
    struct stat sb;
    if (stat(path, &sb) != 0) return kvs_fail(KVS_ERR_IO, "%s: cannot open results database: %s", path, strerror(errno));
    if (!S_ISREG(sb.st_mode)) return kvs_fail(KVS_ERR_DB, "%s: not a kvsim results database (not a regular file)", path);
    FILE *f = fopen(path, "rb");
    if (!f) return kvs_fail(KVS_ERR_IO, "%s: cannot open results database: %s", path, strerror(errno));
    char hdr[16];
    size_t n = fread(hdr, 1, sizeof hdr, f);
    fclose(f);
    if (n != sizeof hdr || memcmp(hdr, magic, sizeof magic) != 0)
        return kvs_fail(KVS_ERR_DB, "%s: not a kvsim results database (not an SQLite file)", path);

    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    kvs_status rc = KVS_OK;
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) {
        rc = kvs_fail(KVS_ERR_DB, "%s: cannot open results database: %s", path, db ? sqlite3_errmsg(db) : "no memory");
        goto cleanup;
    }
    sqlite3_busy_timeout(db, 30000);
    if (sqlite3_prepare_v2(db, "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'meta'", -1, &st,
                           NULL) != SQLITE_OK ||
        sqlite3_step(st) != SQLITE_ROW) {
        rc = kvs_fail(KVS_ERR_DB, "%s: not a kvsim results database (unreadable: %s)", path, sqlite3_errmsg(db));
        goto cleanup;
    }
    int has_meta = sqlite3_column_int(st, 0) > 0;
    sqlite3_finalize(st);
    st = NULL;
    if (!has_meta) {
        rc = kvs_fail(KVS_ERR_DB, "%s: not a kvsim results database (no meta table)", path);
        goto cleanup;
    }
    if (sqlite3_prepare_v2(db,
                           "SELECT (SELECT value FROM meta WHERE key = 'creator'),"
                           "       (SELECT value FROM meta WHERE key = 'schema_version')",
                           -1, &st, NULL) != SQLITE_OK ||
        sqlite3_step(st) != SQLITE_ROW) {
        rc = kvs_fail(KVS_ERR_DB, "%s: not a kvsim results database (meta unreadable: %s)", path, sqlite3_errmsg(db));
        goto cleanup;
    }
    const char *creator = (const char *)sqlite3_column_text(st, 0);
    if (!creator || strcmp(creator, "kvsim") != 0) {
        rc = kvs_fail(KVS_ERR_DB, "%s: not a kvsim results database (meta creator is not 'kvsim')", path);
        goto cleanup;
    }
    if (sqlite3_column_int64(st, 1) != KVS_PLOT_SCHEMA_VERSION) {
        rc = kvs_fail(KVS_ERR_VERSION, "%s: results schema version %" PRId64 " is not supported (expected %d)", path,
                      (int64_t)sqlite3_column_int64(st, 1), KVS_PLOT_SCHEMA_VERSION);
        goto cleanup;
    }
    sqlite3_finalize(st);
    *out = db;
    return KVS_OK;
cleanup:
    sqlite3_finalize(st);
    sqlite3_close(db);
    return rc;
}

/* ------------------------------------------------------------------------------------------------
 * Kinds and metrics
 * ---------------------------------------------------------------------------------------------- */

static const char *const kind_names[] = {"error-vs-budget", "error-vs-position", "memory-vs-budget"};

kvs_status kvs_plot_kind_parse(const char *name, kvs_plot_kind *out) {
    for (int i = 0; i < 3; i++)
        if (name && !strcmp(name, kind_names[i])) {
            *out = (kvs_plot_kind)i;
            return KVS_OK;
        }
    return kvs_fail(KVS_ERR_INVALID_ARG, "--kind: unknown plot kind '%s' (expected error-vs-budget, "
                                         "error-vs-position or memory-vs-budget)",
                    name ? name : "(none)");
}

/* A drawable metric: its option name, the column (aggregate tables) or step column it reads, axis label. */
typedef struct {
    const char *name;
    const char *agg_column;  /* run_summary / run_layers column */
    const char *step_column; /* steps column averaged per position, or NULL */
    const char *label;
} plot_metric;

static const plot_metric metrics[] = {
    {"out_err_mean", "out_err_mean", "out_err", "mean relative L2 output error ||O-O'||/||O|| (unitless)"},
    {"out_err_p50", "out_err_p50", NULL, "median relative L2 output error ||O-O'||/||O|| (unitless)"},
    {"out_err_p95", "out_err_p95", NULL, "p95 relative L2 output error ||O-O'||/||O|| (unitless)"},
    {"out_err_max", "out_err_max", NULL, "max relative L2 output error ||O-O'||/||O|| (unitless)"},
    {"attn_recall_mean", "attn_recall_mean", "attn_recall", "mean attention recall: full-attention mass on S_t (0..1)"},
    {"topk_overlap_mean", "topk_overlap_mean", "topk_overlap", "mean top-k overlap |S_t & TopK| / |S_t| (0..1)"},
};
#define N_METRICS (sizeof metrics / sizeof metrics[0])

static const plot_metric *find_metric(const char *name) {
    for (size_t i = 0; i < N_METRICS; i++)
        if (!strcmp(metrics[i].name, name)) return &metrics[i];
    return NULL;
}

kvs_status kvs_plot_metric_check(kvs_plot_kind kind, const char *metric) {
    const plot_metric *m = metric ? find_metric(metric) : NULL;
    if (kind == KVS_PLOT_ERROR_VS_POSITION) {
        if (!m || !m->step_column)
            return kvs_fail(KVS_ERR_INVALID_ARG, "--metric: '%s' cannot be drawn per position (expected out_err_mean, "
                                                 "attn_recall_mean or topk_overlap_mean)",
                            metric ? metric : "(none)");
        return KVS_OK;
    }
    if (kind == KVS_PLOT_MEMORY_VS_BUDGET) {
        if (metric && strcmp(metric, "storage_bytes_max") != 0)
            return kvs_fail(KVS_ERR_INVALID_ARG, "--metric: memory-vs-budget always draws storage_bytes_max, not '%s'",
                            metric);
        return KVS_OK;
    }
    if (!m)
        return kvs_fail(KVS_ERR_INVALID_ARG, "--metric: unknown metric '%s' (expected out_err_mean, out_err_p50, "
                                             "out_err_p95, out_err_max, attn_recall_mean or topk_overlap_mean)",
                        metric ? metric : "(none)");
    return KVS_OK;
}

/* ------------------------------------------------------------------------------------------------
 * Series read from the database
 * ---------------------------------------------------------------------------------------------- */

typedef struct {
    char *label;
    int dashed; /* oracle runs: drawn dashed */
    size_t n, cap;
    double *x, *y;
} plot_series;

typedef struct {
    plot_series *s;
    size_t n, cap;
} plot_data;

static void plot_data_free(plot_data *d) {
    for (size_t i = 0; i < d->n; i++) {
        free(d->s[i].label);
        free(d->s[i].x);
        free(d->s[i].y);
    }
    free(d->s);
    memset(d, 0, sizeof *d);
}

static kvs_status series_new(plot_data *d, const char *label, int dashed) {
    if (d->n == d->cap) {
        size_t cap = d->cap ? 2 * d->cap : 8;
        plot_series *s = realloc(d->s, cap * sizeof *s);
        if (!s) return kvs_fail(KVS_ERR_NOMEM, "plot: out of memory");
        d->s = s;
        d->cap = cap;
    }
    plot_series *s = &d->s[d->n];
    memset(s, 0, sizeof *s);
    if (!(s->label = strdup(label))) return kvs_fail(KVS_ERR_NOMEM, "plot: out of memory");
    s->dashed = dashed;
    d->n++;
    return KVS_OK;
}

static kvs_status series_add(plot_series *s, double x, double y) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 64;
        double *nx = realloc(s->x, cap * sizeof *nx);
        if (!nx) return kvs_fail(KVS_ERR_NOMEM, "plot: out of memory");
        s->x = nx;
        double *ny = realloc(s->y, cap * sizeof *ny);
        if (!ny) return kvs_fail(KVS_ERR_NOMEM, "plot: out of memory");
        s->y = ny;
        s->cap = cap;
    }
    s->x[s->n] = x;
    s->y[s->n] = y;
    s->n++;
    return KVS_OK;
}

static const char *col_text(sqlite3_stmt *st, int i) {
    const char *t = (const char *)sqlite3_column_text(st, i);
    return t ? t : "";
}

/* Counts complete runs (after the policy filter), to tell "empty database" from "no data for this plot". */
static kvs_status count_complete_runs(sqlite3 *db, const char *db_path, const char *policy, int64_t *n) {
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db, "SELECT count(*) FROM runs WHERE status = 'complete' AND (?1 IS NULL OR policy = ?1)",
                           -1, &st, NULL) != SQLITE_OK) {
        kvs_status rc = kvs_fail(KVS_ERR_DB, "%s: cannot query runs: %s", db_path, sqlite3_errmsg(db));
        sqlite3_finalize(st);
        return rc;
    }
    if (policy) sqlite3_bind_text(st, 1, policy, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    *n = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
    sqlite3_finalize(st);
    if (rc != SQLITE_ROW) return kvs_fail(KVS_ERR_DB, "%s: cannot query runs: %s", db_path, sqlite3_errmsg(db));
    return KVS_OK;
}

/* Budget kinds: one series per (policy, params), points (budget_tokens, metric averaged over traces). */
static kvs_status read_budget_series(sqlite3 *db, const char *db_path, const kvs_plot_options *o, const char *column,
                                     plot_data *d) {
    char sql[1024];
    snprintf(sql, sizeof sql,
             "SELECT r.policy, r.params, max(r.is_oracle), r.budget_tokens, avg(m.%s) "
             "FROM runs r JOIN %s m ON m.run_id = r.id %s "
             "WHERE r.status = 'complete' AND (?1 IS NULL OR r.policy = ?1) AND r.budget_tokens > 0 "
             "  AND m.%s IS NOT NULL "
             "GROUP BY r.policy, r.params, r.budget_tokens ORDER BY r.policy, r.params, r.budget_tokens",
             column, o->layer < 0 ? "run_summary" : "run_layers", o->layer < 0 ? "" : "AND m.layer = ?2", column);
    sqlite3_stmt *st = NULL;
    kvs_status rc = KVS_OK;
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) {
        rc = kvs_fail(KVS_ERR_DB, "%s: cannot query %s: %s", db_path, column, sqlite3_errmsg(db));
        goto cleanup;
    }
    if (o->policy) sqlite3_bind_text(st, 1, o->policy, -1, SQLITE_STATIC);
    if (o->layer >= 0) sqlite3_bind_int(st, 2, o->layer);
    char prev_key[2048] = "";
    int src;
    while ((src = sqlite3_step(st)) == SQLITE_ROW) {
        const char *policy = col_text(st, 0), *params = col_text(st, 1);
        int oracle = sqlite3_column_int(st, 2);
        double x = (double)sqlite3_column_int64(st, 3), y = sqlite3_column_double(st, 4);
        char key[2048];
        snprintf(key, sizeof key, "%s\x1f%s", policy, params);
        if (d->n == 0 || strcmp(key, prev_key) != 0) {
            char label[2048];
            snprintf(label, sizeof label, "%s%s%s%s%s", policy, params[0] ? " (" : "", params, params[0] ? ")" : "",
                     oracle ? " (oracle)" : "");
            KVS_TRY(rc = series_new(d, label, oracle));
            snprintf(prev_key, sizeof prev_key, "%s", key);
        }
        if (isfinite(y)) KVS_TRY(rc = series_add(&d->s[d->n - 1], x, y));
    }
    if (src != SQLITE_DONE) rc = kvs_fail(KVS_ERR_DB, "%s: cannot query %s: %s", db_path, column, sqlite3_errmsg(db));
cleanup:
    sqlite3_finalize(st);
    return rc;
}

/* Position kind: one series per run, points (position, mean over q heads [and layers] of the step metric). */
static kvs_status read_position_series(sqlite3 *db, const char *db_path, const kvs_plot_options *o, const char *column,
                                       plot_data *d) {
    char sql[1024];
    snprintf(sql, sizeof sql,
             "SELECT r.id, r.policy, r.params, r.budget_tokens, r.is_oracle, s.position, avg(s.%s) "
             "FROM steps s JOIN runs r ON r.id = s.run_id "
             "WHERE r.status = 'complete' AND (?1 IS NULL OR r.policy = ?1) AND (?2 < 0 OR r.budget_tokens = ?2) "
             "  AND (?3 < 0 OR s.layer = ?3) AND s.%s IS NOT NULL "
             "GROUP BY r.id, s.position ORDER BY r.id, s.position",
             column, column);
    sqlite3_stmt *st = NULL;
    kvs_status rc = KVS_OK;
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) {
        rc = kvs_fail(KVS_ERR_DB, "%s: cannot query steps: %s", db_path, sqlite3_errmsg(db));
        goto cleanup;
    }
    if (o->policy) sqlite3_bind_text(st, 1, o->policy, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, o->budget_tokens);
    sqlite3_bind_int(st, 3, o->layer);
    int64_t prev_run = -1;
    int src;
    while ((src = sqlite3_step(st)) == SQLITE_ROW) {
        int64_t run = sqlite3_column_int64(st, 0);
        if (run != prev_run) {
            const char *params = col_text(st, 2);
            int oracle = sqlite3_column_int(st, 4);
            char label[2048];
            snprintf(label, sizeof label, "%s%s%s%s budget=%" PRId64 "%s [run %" PRId64 "]", col_text(st, 1),
                     params[0] ? " (" : "", params, params[0] ? ")" : "", (int64_t)sqlite3_column_int64(st, 3),
                     oracle ? " (oracle)" : "", run);
            KVS_TRY(rc = series_new(d, label, oracle));
            prev_run = run;
        }
        double y = sqlite3_column_double(st, 6);
        if (isfinite(y)) KVS_TRY(rc = series_add(&d->s[d->n - 1], (double)sqlite3_column_int64(st, 5), y));
    }
    if (src != SQLITE_DONE) rc = kvs_fail(KVS_ERR_DB, "%s: cannot query steps: %s", db_path, sqlite3_errmsg(db));
cleanup:
    sqlite3_finalize(st);
    return rc;
}

/* ------------------------------------------------------------------------------------------------
 * gnuplot
 * ---------------------------------------------------------------------------------------------- */

/* Finds `prog` (a path, or a name on PATH) as an executable; writes the resolved path. */
static int find_program(const char *prog, char *resolved, size_t cap) {
    if (strchr(prog, '/')) {
        snprintf(resolved, cap, "%s", prog);
        return access(prog, X_OK) == 0;
    }
    const char *path = getenv("PATH");
    if (!path || !path[0]) path = "/usr/local/bin:/usr/bin:/bin";
    while (*path) {
        const char *colon = strchr(path, ':');
        size_t len = colon ? (size_t)(colon - path) : strlen(path);
        snprintf(resolved, cap, "%.*s/%s", (int)len, len ? path : ".", prog);
        struct stat sb;
        if (stat(resolved, &sb) == 0 && S_ISREG(sb.st_mode) && access(resolved, X_OK) == 0) return 1;
        path += len + (colon ? 1 : 0);
    }
    return 0;
}

/* Writes s as a gnuplot single-quoted string (inside '...' only a doubled quote is special). */
static void put_gp_string(FILE *f, const char *s) {
    fputc('\'', f);
    for (; *s; s++) {
        if (*s == '\'') fputc('\'', f);
        fputc(*s == '\n' || *s == '\r' ? ' ' : *s, f);
    }
    fputc('\'', f);
}

/* Writes s single-quoted for /bin/sh. */
static void sh_quote(char *dst, size_t cap, const char *s) {
    size_t j = 0;
    if (j + 1 < cap) dst[j++] = '\'';
    for (; *s && j + 5 < cap; s++) {
        if (*s == '\'') {
            memcpy(dst + j, "'\\''", 4);
            j += 4;
        } else {
            dst[j++] = *s;
        }
    }
    if (j + 1 < cap) dst[j++] = '\'';
    dst[j] = '\0';
}

static void write_script(FILE *gp, const kvs_plot_options *o, int is_svg, const char *partial, const char *title,
                         const char *xlabel, const char *ylabel, int logx, const plot_data *d) {
    /* noenhanced: labels contain '_' and '^' (params, metric names) that enhanced text would typeset. */
    if (is_svg) fprintf(gp, "set terminal svg size 1200,760 noenhanced font 'Sans,11' background rgb 'white'\n");
    else fprintf(gp, "set terminal pngcairo size 1200,760 noenhanced font 'Sans,10'\n");
    fprintf(gp, "set encoding utf8\nset output ");
    put_gp_string(gp, partial);
    fprintf(gp, "\nset title ");
    put_gp_string(gp, title);
    fprintf(gp, "\nset xlabel ");
    put_gp_string(gp, xlabel);
    fprintf(gp, "\nset ylabel ");
    put_gp_string(gp, ylabel);
    /* Legend under the plot: labels carry every parameter and would squeeze the plot area if put beside it. */
    fprintf(gp, "\nset grid\nset key outside below center vertical maxrows 6 Left reverse\n");
    if (logx) fprintf(gp, "set logscale x 2\nset format x '%%g'\n");
    (void)o;
    fprintf(gp, "plot ");
    for (size_t i = 0; i < d->n; i++) {
        /* gnuplot's default colours repeat after 8 series; a sweep easily has more. Oracles: black, dashed. */
        static const char *const palette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                                              "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#ad494a"};
        const char *color = d->s[i].dashed ? "#000000" : palette[i % (sizeof palette / sizeof palette[0])];
        fprintf(gp, "%s'-' using 1:2 with linespoints lw 2 pt %d ps 0.8 dt %d lc rgb '%s' title ",
                i ? ", \\\n     " : "", (int)(i % 13) + 1, d->s[i].dashed ? 2 : 1, color);
        put_gp_string(gp, d->s[i].label);
    }
    fprintf(gp, "\n");
    for (size_t i = 0; i < d->n; i++) {
        for (size_t k = 0; k < d->s[i].n; k++) fprintf(gp, "%.17g %.17g\n", d->s[i].x[k], d->s[i].y[k]);
        fprintf(gp, "e\n");
    }
    fprintf(gp, "unset output\nexit\n");
}

/* Runs gnuplot with the script; SIGPIPE is blocked for this thread while writing so a gnuplot that dies
 * early becomes an error status here instead of killing kvsim. */
static kvs_status run_gnuplot(const char *prog, const kvs_plot_options *o, int is_svg, const char *partial,
                              const char *title, const char *xlabel, const char *ylabel, int logx, const plot_data *d) {
    char cmd[PATH_MAX * 4 + 32], quoted[PATH_MAX * 4];
    sh_quote(quoted, sizeof quoted, prog);
    snprintf(cmd, sizeof cmd, "exec %s", quoted);

    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    fflush(NULL); /* so buffered output of ours is not duplicated or interleaved by the child */
    FILE *gp = popen(cmd, "w");
    kvs_status rc = KVS_OK;
    if (!gp) {
        rc = kvs_fail(KVS_ERR_EXTERNAL, "cannot start gnuplot (%s): %s", prog, strerror(errno));
        goto restore;
    }
    write_script(gp, o, is_svg, partial, title, xlabel, ylabel, logx, d);
    fflush(gp);
    int write_failed = ferror(gp);
    int status = pclose(gp);
    if (status == -1) rc = kvs_fail(KVS_ERR_EXTERNAL, "gnuplot (%s): cannot wait for it: %s", prog, strerror(errno));
    else if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
        rc = kvs_fail(KVS_ERR_EXTERNAL, "gnuplot not found: could not run '%s'", prog);
    else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        rc = kvs_fail(KVS_ERR_EXTERNAL, "gnuplot (%s) failed (%s %d); its messages are above", prog,
                      WIFEXITED(status) ? "exit status" : "signal",
                      WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    else if (write_failed)
        rc = kvs_fail(KVS_ERR_EXTERNAL, "gnuplot (%s): writing the script to its input failed", prog);
restore:;
    /* Drop a SIGPIPE raised while it was blocked, then restore the caller's mask. */
    sigset_t pending;
    sigpending(&pending);
    if (sigismember(&pending, SIGPIPE)) {
        struct timespec zero = {0, 0};
        sigtimedwait(&block, NULL, &zero);
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcasecmp(s + n - k, suffix);
}

kvs_status kvs_plot_make(const char *db_path, const kvs_plot_options *o) {
    if (!db_path || !o) return kvs_fail(KVS_ERR_INVALID_ARG, "plot: NULL database path or options");
    if (!o->out_path || !o->out_path[0]) return kvs_fail(KVS_ERR_INVALID_ARG, "--out: an output file is required");
    int is_svg = ends_with(o->out_path, ".svg");
    if (!is_svg && !ends_with(o->out_path, ".png"))
        return kvs_fail(KVS_ERR_INVALID_ARG, "--out: '%s' must end in .png or .svg", o->out_path);
    if (strpbrk(o->out_path, "\n\r"))
        return kvs_fail(KVS_ERR_INVALID_ARG, "--out: the file name must not contain a line break");
    if ((int)o->kind < 0 || (int)o->kind > 2) return kvs_fail(KVS_ERR_INVALID_ARG, "plot: bad kind %d", (int)o->kind);
    const char *metric_name = o->kind == KVS_PLOT_MEMORY_VS_BUDGET ? NULL : (o->metric ? o->metric : "out_err_mean");
    kvs_status rc = kvs_plot_metric_check(o->kind, o->kind == KVS_PLOT_MEMORY_VS_BUDGET ? o->metric : metric_name);
    if (rc != KVS_OK) return rc;
    const plot_metric *m = metric_name ? find_metric(metric_name) : NULL;

    sqlite3 *db = NULL;
    plot_data d = {0};
    char partial[PATH_MAX], title[1024], xlabel[256], ylabel[512], where[256] = "";
    if (snprintf(partial, sizeof partial, "%s.partial", o->out_path) >= (int)sizeof partial)
        return kvs_fail(KVS_ERR_INVALID_ARG, "--out: path too long");

    KVS_TRY(rc = kvs_plot_db_open(db_path, &db));
    int64_t n_complete = 0;
    KVS_TRY(rc = count_complete_runs(db, db_path, o->policy, &n_complete));
    if (n_complete == 0) {
        rc = kvs_fail(KVS_ERR_DB, "%s: no complete runs%s%s%s in the database: nothing to plot", db_path,
                      o->policy ? " of policy '" : "", o->policy ? o->policy : "", o->policy ? "'" : "");
        goto cleanup;
    }

    const char *base = strrchr(db_path, '/');
    base = base ? base + 1 : db_path;
    if (o->policy) snprintf(where, sizeof where, ", policy %s", o->policy);
    if (o->kind == KVS_PLOT_ERROR_VS_POSITION) {
        KVS_TRY(rc = read_position_series(db, db_path, o, m->step_column, &d));
        size_t len = strlen(where);
        if (o->budget_tokens >= 0)
            snprintf(where + len, sizeof where - len, ", budget %" PRId64 " tokens", o->budget_tokens);
        len = strlen(where);
        if (o->layer >= 0) snprintf(where + len, sizeof where - len, ", layer %d", o->layer);
        else snprintf(where + len, sizeof where - len, ", mean over layers");
        snprintf(title, sizeof title, "%s per decode position (mean over query heads%s) - %s", m->name, where, base);
        snprintf(xlabel, sizeof xlabel, "position in the sequence (tokens)");
        snprintf(ylabel, sizeof ylabel, "%s", m->label);
    } else {
        const char *column = o->kind == KVS_PLOT_MEMORY_VS_BUDGET ? "storage_bytes_max" : m->agg_column;
        KVS_TRY(rc = read_budget_series(db, db_path, o, column, &d));
        size_t len = strlen(where);
        if (o->layer >= 0) snprintf(where + len, sizeof where - len, ", layer %d", o->layer);
        else snprintf(where + len, sizeof where - len, ", run-wide aggregate");
        if (o->kind == KVS_PLOT_MEMORY_VS_BUDGET) {
            snprintf(title, sizeof title, "Resident KV storage vs budget (%s) - %s", where + 2, base);
            snprintf(ylabel, sizeof ylabel, "resident storage per KV head, max over steps (bytes, KV + auxiliary)");
        } else {
            snprintf(title, sizeof title, "%s vs KV budget (%s) - %s", m->name, where + 2, base);
            snprintf(ylabel, sizeof ylabel, "%s", m->label);
        }
        snprintf(xlabel, sizeof xlabel, "KV budget per KV head (tokens, log2 scale)");
    }
    size_t n_points = 0;
    for (size_t i = 0; i < d.n; i++) n_points += d.s[i].n;
    if (n_points == 0) {
        rc = kvs_fail(KVS_ERR_DB, "%s: no data for %s%s: %s", db_path, kind_names[o->kind], where,
                      o->kind == KVS_PLOT_ERROR_VS_POSITION
                          ? "the selected complete runs have no per-step samples (steps table)"
                          : "the selected complete runs have no aggregate rows with a positive budget for it");
        goto cleanup;
    }
    /* Series without a finite point would only add an empty key entry (and '-' needs at least one row). */
    size_t w = 0;
    for (size_t i = 0; i < d.n; i++) {
        if (d.s[i].n > 0) d.s[w++] = d.s[i];
        else {
            free(d.s[i].label);
            free(d.s[i].x);
            free(d.s[i].y);
        }
    }
    d.n = w;
    sqlite3_close(db);
    db = NULL;

    char prog[PATH_MAX];
    const char *want = o->gnuplot ? o->gnuplot : "gnuplot";
    if (!find_program(want, prog, sizeof prog)) {
        rc = kvs_fail(KVS_ERR_EXTERNAL, "gnuplot not found ('%s' is not an executable on PATH); install gnuplot "
                                        "(Debian: apt-get install gnuplot-nox)",
                      want);
        goto cleanup;
    }
    /* Create the partial file ourselves: an unwritable output is a clear I/O error, not a gnuplot message. */
    FILE *pf = fopen(partial, "w");
    if (!pf) {
        rc = kvs_fail(KVS_ERR_IO, "%s: cannot create output file: %s", partial, strerror(errno));
        goto cleanup;
    }
    fclose(pf);
    rc = run_gnuplot(prog, o, is_svg, partial, title, xlabel,
                     ylabel, o->kind != KVS_PLOT_ERROR_VS_POSITION, &d);
    if (rc == KVS_OK) {
        struct stat sb;
        if (stat(partial, &sb) != 0 || sb.st_size == 0)
            rc = kvs_fail(KVS_ERR_EXTERNAL, "gnuplot exited 0 but wrote no output to %s", partial);
        else if (rename(partial, o->out_path) != 0)
            rc = kvs_fail(KVS_ERR_IO, "%s: cannot rename %s into place: %s", o->out_path, partial, strerror(errno));
    }
    if (rc != KVS_OK) unlink(partial);

cleanup:
    if (db) sqlite3_close(db);
    plot_data_free(&d);
    return rc;
}
