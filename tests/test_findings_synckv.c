/* test_findings_synckv.c — the SyncKV section of examples/FINDINGS.md (examples/findings/synckv.sh) recomputed
 * another way, from what the script wrote under $OUT (its blocks, prompt traces and database):
 *  - SyncKV-3's h2d and d2h columns and its h2d ratios from POLICY_SPEC §2.4's traffic formulas and each prompt
 *    trace's header alone (P, T, H, d; no replay): k = floor((B H - N_r P) / (H - N_r)) for B = ceil(Mem% P),
 *    k_dyn = floor(k / 2), every NR unit fetches k_dyn tokens at each anticipation visible within the trace
 *    (floor((T - 1) / m) of them) and moves its new token to the host every step plus the prompt after prefill;
 *  - SyncKV-2's window row at SyncKV's memory and its paired difference: the window holds min(B, n) tokens of
 *    2 d kv_bytes, so its error at each trace's SyncKV level is interpolated here in log bytes between the
 *    window's two runs around it (their errors read from the database), independently of `kvsim compare`.
 * Runs `sh examples/findings.sh --only synckv` once (seconds) with the shared models beside the repository;
 * skips without them, outside `make test` and under the sanitizers (a whole study script).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/util/findings_blocks.h"
#include "tests/util/testenv.h"

static const char *const models[] = {"stories260K", "tinystories-656K"};
#define N_MODELS 2
#define MAX_TRACES 16

/* The section's $OUT, the script run once for the whole file; skips when it cannot run here. */
static const char *section(void) {
    const char *out = NULL;
    if (kvs_test_findings_once("synckv", &out) == 0) skip();
    if (!out) fail_msg("findings.sh --check --only synckv failed");
    return out;
}

/* The text of generated block NAME (caller frees). */
static char *block(const char *name) {
    char *text = kvs_test_findings_block(section(), name);
    assert_non_null(text);
    return text;
}

/* Cell `col` (0 = the model) of the table row of `text` whose model is `model` and whose second cell starts with
 * `label` ("" for any): its leading number. */
static double cell(const char *text, const char *model, const char *label, int col) {
    char buf[512];
    if (kvs_test_block_cell(text, model, label, KVS_TEST_CELL_PREFIX, col, buf, sizeof buf) != 1)
        fail_msg("no row '%s' / '%s' with a cell %d", model, label, col);
    char *end;
    double v = strtod(buf, &end);
    assert_true(end != buf);
    return v;
}

/* The number after `key` on the line of `text` that starts with "- MODEL, " and holds `key`. */
static double after(const char *text, const char *model, const char *key) {
    char want[256];
    snprintf(want, sizeof want, "- %s, ", model);
    double v = 0;
    if (!kvs_test_block_after(text, want, key, &v)) fail_msg("no line '%s' ... '%s'", model, key);
    return v;
}

/* The script prints 3 significant figures, whole numbers from 100 up: `printed` is `value` so rounded. */
static void assert_printed(double printed, double value) {
    double a = fabs(value);
    double half = a >= 99.5 ? 0.5 : a > 0 ? 0.5 * pow(10.0, floor(log10(a)) - 2) : 0;
    if (fabs(printed - value) > half * (1 + 1e-9)) fail_msg("printed %.6g, recomputed %.6g", printed, value);
}

typedef kvs_test_trace_shape trace_dims;

/* The prompt traces of a model with their shapes, sorted by path. */
static size_t traces_of(const char *model, trace_dims *t) {
    int n = kvs_test_findings_prompts(section(), model, t, MAX_TRACES);
    assert_true(n >= 2);
    return (size_t)n;
}

static trace_dims dims_of(const char *path) {
    trace_dims x;
    assert_int_equal(kvs_test_trace_shape_of(path, &x), 0);
    return x;
}

/* SyncKV's transfers per step per KV head, averaged over every unit of a layer (N_r representatives move none)
 * and the T decode steps, at Mem% = 50 % (B = ceil(P / 2)) and period m (0: w/o Anticipation). */
static double h2d_formula(trace_dims x, int64_t m) {
    int64_t nr = x.H >= 8 ? 2 : 1; /* §5.1: 2 for Llama's 8 KV heads, 1 for Qwen's 4 */
    int64_t B = (x.P + 1) / 2;
    int64_t k = (B * x.H - nr * x.P) / (x.H - nr); /* floor((B/P H - N_r) P / (H - N_r)); positive here */
    int64_t k_dyn = k / 2;                         /* floor((1 - rho_s) k), rho_s = 0.5 */
    int64_t fetches = m > 0 ? (x.T - 1) / m : 0;   /* anticipations at t = m, 2m, ... visible from t + 1 <= T */
    double kv_token = 2.0 * (double)x.d * (double)x.kv_bytes;
    return (double)(x.H - nr) / (double)x.H * kv_token * (double)(k_dyn * fetches) / (double)x.T;
}
static double d2h_formula(trace_dims x) {
    int64_t nr = x.H >= 8 ? 2 : 1;
    double kv_token = 2.0 * (double)x.d * (double)x.kv_bytes;
    return (double)(x.H - nr) / (double)x.H * kv_token * (double)(x.T + x.P) / (double)x.T;
}

/* SyncKV-3: h2d for m = 1, 5, 10 and w/o Anticipation, d2h of every row, the h2d ratios. */
static void test_period_transfers_follow_the_traffic_formulas(void **state) {
    (void)state;
    (void)section();
    char *t3 = block("SyncKV-3"), *p3 = block("SyncKV-3-pairs");
    static trace_dims tr[MAX_TRACES];
    for (int mi = 0; mi < N_MODELS; mi++) {
        size_t n = traces_of(models[mi], tr);
        double h1 = 0, h5 = 0, h10 = 0, d2h = 0, r15 = 0, r510 = 0;
        for (size_t i = 0; i < n; i++) {
            trace_dims x = tr[i];
            assert_int_equal(x.H, 4); /* both models: N_r = 1 of 4 */
            h1 += h2d_formula(x, 1) / (double)n;
            h5 += h2d_formula(x, 5) / (double)n;
            h10 += h2d_formula(x, 10) / (double)n;
            d2h += d2h_formula(x) / (double)n;
            r15 += h2d_formula(x, 1) / h2d_formula(x, 5) / (double)n;
            r510 += h2d_formula(x, 5) / h2d_formula(x, 10) / (double)n;
        }
        char row[64];
        snprintf(row, sizeof row, "%s (%zu)", models[mi], n);
        /* columns: 1 configuration, 2 err, 3 recall, 4 h2d, 5 d2h */
        assert_printed(cell(t3, row, "m = 1 (", 4), h1);
        assert_printed(cell(t3, row, "m = 5 (", 4), h5);
        double delta = cell(t3, row, "m = 5, delta", 4); /* delta=1 moves at most the full refetch */
        assert_true(delta > 0 && delta <= h5 * 1.005);
        assert_printed(cell(t3, row, "m = 5, nr_recent", 4), h5);
        assert_printed(cell(t3, row, "m = 10", 4), h10);
        assert_true(cell(t3, row, "w/o Anticipation", 4) == 0);
        const char *rows[] = {"m = 1 (", "m = 5 (", "m = 10", "w/o Anticipation", "m = 5, delta", "m = 5, nr_recent"};
        for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) assert_printed(cell(t3, row, rows[r], 5), d2h);
        assert_printed(after(p3, models[mi], "h2d m = 1 / m = 5: "), r15);
        assert_printed(after(p3, models[mi], "h2d m = 5 / m = 10: "), r510);
    }
    free(t3);
    free(p3);
}

/* ---- SyncKV-2: the window at SyncKV's memory ---------------------------------------------------------------- */

#define MAX_RUNS 64
typedef struct {
    char trace[512];
    double sync_x[2], sync_err[2]; /* SyncKV's storage_bytes_mean and err at Mem% 30, 50 */
    int64_t win_b[MAX_RUNS];       /* the window's budgets and errors */
    double win_err[MAX_RUNS];
    int n_win;
} trace_runs;

static const char *const synckv_defaults = "nr=0,m=5,rho=0.5,clusters=prefill,kc=0,window=32,anticipation=true,"
                                           "nr_recent=none,nr_union=cluster,exclude_static=false,fetch_latency_steps=0,"
                                           "delta=false";

/* The window's resident bytes per KV head, mean over the decode steps: min(B, n) tokens of 2 d kv_bytes, n = P + t
 * positions at decode step t = 1..T (the current one included), no auxiliary state. */
static double window_bytes(trace_dims x, int64_t B) {
    double sum = 0;
    for (int64_t t = 1; t <= x.T; t++) sum += (double)(B < x.P + t ? B : x.P + t);
    return sum / (double)x.T * 2.0 * (double)(x.d * x.kv_bytes);
}

/* Reads the SyncKV (paper defaults) and window runs of the section's database of a model, per trace. */
static size_t read_runs(const char *model, trace_runs *tr, size_t cap) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' runs '%s/synckv/%s/synckv.db' --csv --summary", getenv("KVSIM_BIN"), section(),
             model);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    static char line[1 << 16];
    char *f[256];
    int c_pol = -1, c_par = -1, c_bud = -1, c_tr = -1, c_frac = -1, c_err = -1, c_sto = -1;
    size_t n = 0;
    for (int row = 0; fgets(line, sizeof line, p); row++) {
        int nf = kvs_test_csv_fields(line, f, 256);
        if (row == 0) {
            c_pol = kvs_test_csv_col(f, nf, "policy"), c_par = kvs_test_csv_col(f, nf, "params");
            c_bud = kvs_test_csv_col(f, nf, "budget_tokens"), c_tr = kvs_test_csv_col(f, nf, "trace");
            c_frac = kvs_test_csv_col(f, nf, "budget_fraction"), c_err = kvs_test_csv_col(f, nf, "out_err_mean");
            c_sto = kvs_test_csv_col(f, nf, "storage_bytes_mean");
            assert_true(c_pol >= 0 && c_par >= 0 && c_bud >= 0 && c_tr >= 0 && c_frac >= 0 && c_err >= 0 && c_sto >= 0);
            continue;
        }
        assert_true(nf > c_sto && nf > c_frac);
        int is_sync = !strcmp(f[c_pol], "synckv") && !strcmp(f[c_par], synckv_defaults);
        int is_win = !strcmp(f[c_pol], "window");
        if (!is_sync && !is_win) continue;
        size_t t = 0;
        while (t < n && strcmp(tr[t].trace, f[c_tr])) t++;
        if (t == n) {
            assert_true(n < cap);
            memset(&tr[n], 0, sizeof tr[n]);
            snprintf(tr[n].trace, sizeof tr[n].trace, "%s", f[c_tr]);
            n++;
        }
        if (is_sync) {
            double frac = atof(f[c_frac]);
            int k = fabs(frac - 0.3) < 1e-9 ? 0 : fabs(frac - 0.5) < 1e-9 ? 1 : -1;
            if (k >= 0) tr[t].sync_x[k] = atof(f[c_sto]), tr[t].sync_err[k] = atof(f[c_err]);
        } else {
            assert_true(tr[t].n_win < MAX_RUNS);
            tr[t].win_b[tr[t].n_win] = atoll(f[c_bud]);
            tr[t].win_err[tr[t].n_win] = atof(f[c_err]);
            /* the stored resident bytes are the formula's */
            assert_true(fabs(atof(f[c_sto]) - window_bytes(dims_of(f[c_tr]), tr[t].win_b[tr[t].n_win])) < 1e-6);
            tr[t].n_win++;
        }
    }
    assert_int_equal(pclose(p), 0);
    return n;
}

/* The window's error at `x` resident bytes: linear in log bytes between its two runs around x. */
static double window_at(const trace_runs *r, double x) {
    trace_dims dm = dims_of(r->trace);
    int lo = -1, hi = -1;
    double xl = 0, xh = 0;
    for (int i = 0; i < r->n_win; i++) {
        double xi = window_bytes(dm, r->win_b[i]);
        if (xi <= x && (lo < 0 || xi > xl)) lo = i, xl = xi;
        if (xi >= x && (hi < 0 || xi < xh)) hi = i, xh = xi;
    }
    assert_true(lo >= 0 && hi >= 0);
    if (xh == xl) return r->win_err[lo];
    double w = (log(x) - log(xl)) / (log(xh) - log(xl));
    return r->win_err[lo] + w * (r->win_err[hi] - r->win_err[lo]);
}

static void test_window_at_synckv_memory_recomputed(void **state) {
    (void)state;
    (void)section();
    char *t2 = block("SyncKV-2"), *p2 = block("SyncKV-2-pairs");
    static trace_runs tr[MAX_TRACES];
    for (int mi = 0; mi < N_MODELS; mi++) {
        size_t n = read_runs(models[mi], tr, MAX_TRACES);
        assert_true(n >= 2);
        char row[64];
        snprintf(row, sizeof row, "%s (%zu)", models[mi], n);
        for (int k = 0; k < 2; k++) {
            double mean_w = 0, mean_s = 0;
            for (size_t t = 0; t < n; t++) {
                assert_true(tr[t].sync_x[k] > 0);
                mean_w += window_at(&tr[t], tr[t].sync_x[k]) / (double)n;
                mean_s += tr[t].sync_err[k] / (double)n;
            }
            /* columns: 1 policy, 2 at memory Mem% 30, 3 at Mem% 50 */
            assert_printed(cell(t2, row, "window", 2 + k), mean_w);
            assert_printed(cell(t2, row, "SyncKV", 2 + k), mean_s);
            assert_printed(cell(p2, models[mi], "window", 2 + k), mean_s - mean_w); /* paired: mean of differences */
            assert_true(mean_s > mean_w);
        }
    }
    free(t2);
    free(p2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_period_transfers_follow_the_traffic_formulas),
        cmocka_unit_test(test_window_at_synckv_memory_recomputed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
