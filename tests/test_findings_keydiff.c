/* test_findings_keydiff.c — the KeyDiff section of examples/FINDINGS.md (examples/findings/keydiff.sh, run through
 * `examples/findings.sh --only keydiff` on the shared models): every generated block K-1 .. K-6 is recomputed here
 * another way and must agree with what the script wrote.
 *  - K-1, K-2: the mean over the prompt traces of `kvsim keys`' own summary medians (its text output, not the CSV the
 *    script reads) and the head counts of its summary and per-head rows;
 *  - K-3: the mean over the traces of `kvsim keys --policy`'s own per-policy means; a paired difference's mean is
 *    the difference of the two means (the same traces);
 *  - K-4: the mean over the traces of `kvsim compare --per-trace` values at the two levels, taken from the models'
 *    known head_dim (256 d and 512 d bytes), and the paired differences from the same per-trace values;
 *  - K-5: an independent copy of the paper's Table 8 (App. F.3) and the prompt lengths `kvsim info` reports;
 *  - K-6: the closed form of App. B.1's count (adds 3nd - n - 1, multiplies 3nd + n + 2d, n + 1 square roots,
 *    2n + 1 divides) and the replay's per-event charges for n = B candidates (d n fp16 key elements, n + d fp32
 *    temporaries).
 * The script runs once (group setup, about 10 s); without the shared models or under the sanitizers the tests skip.
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

#include "tests/util/cli_run.h"
#include "tests/util/findings_blocks.h"
#include "tests/util/testenv.h"

#define MAX_TRACES 16

/* snprintf into an array, failing the test when it does not fit (and using the result quiets gcc's truncation
 * warnings on paths) */
#define FMT(buf, ...) assert_true(snprintf((buf), sizeof(buf), __VA_ARGS__) < (int)sizeof(buf))

static const char *const k_models[2] = {"stories260K", "tinystories-656K"};
static const int k_head_dim[2] = {8, 16}; /* the models' configs: dim 64 / 8 heads, dim 128 / 8 heads */

/* The section's $OUT, the script run once for the whole file (about 10 s); skips when it cannot run here. */
static const char *section(void) {
    const char *out = NULL;
    if (kvs_test_findings_once("keydiff", &out) == 0) skip();
    if (!out) fail_msg("findings.sh --check --only keydiff failed");
    return out;
}

/* The block NAME the script wrote (caller frees). */
static char *block(const char *name) {
    char *s = kvs_test_findings_block(section(), name);
    assert_non_null(s);
    return s;
}

/* The sorted paths of a model's prompt traces; returns the count. */
static int prompt_traces(const char *model, char paths[][256]) {
    static kvs_test_trace_shape t[MAX_TRACES];
    int n = kvs_test_findings_prompts(section(), model, t, MAX_TRACES);
    assert_true(n >= 2);
    for (int i = 0; i < n; i++) assert_true(snprintf(paths[i], 256, "%s", t[i].path) < 256);
    return n;
}

/* Runs `kvsim ARGS` (a shell command line after the binary) and returns its standard output (caller frees). */
static char *kvsim_out(const char *args) {
    char o[1100], cmd[4096];
    snprintf(o, sizeof o, "%s/cmd.out", section());
    snprintf(cmd, sizeof cmd, "'%s' %s > '%s' 2>/dev/null", kvs_test_kvsim_bin(), args, o);
    assert_int_equal(system(cmd), 0);
    char *s = kvs_test_slurp(o, NULL);
    assert_non_null(s);
    return s;
}

/* The line of `text` starting with `prefix` (a pointer into text), or NULL. */
static const char *line_starting(const char *text, const char *prefix) {
    size_t n = strlen(prefix);
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (strncmp(p, prefix, n) == 0) return p;
    return NULL;
}

/* Cell `col` (0 = the first) of the table row whose first two cells are `c1` and `c2`, copied to out. */
static void cell(const char *text, const char *c1, const char *c2, int col, char *out, size_t n) {
    int rc = kvs_test_block_cell(text, c1, c2, KVS_TEST_CELL_EXACT, col, out, n);
    if (rc != 1) fail_msg("no row '%s' / '%s' with a cell %d (of fewer than %zu bytes)", c1, c2, col, n);
}

/* "mean [lo, hi]..." (or "mean (n = 1)"): asserts the mean is `want` to the 3 significant figures (plus `abs_tol`
 * for inputs that were themselves rounded) and, with an interval, lo <= mean <= hi. */
static void assert_mean(const char *c, double want, double abs_tol, const char *what) {
    kvs_test_iv v;
    int k = kvs_test_parse_iv(c, &v);
    if (k < 1) fail_msg("%s: '%s' is not a number", what, c);
    if (fabs(v.mean - want) > 0.006 * fabs(want) + abs_tol + 1e-12)
        fail_msg("%s: the block says %s, recomputed %.6g", what, c, want);
    if (k == 3 && !(v.lo <= v.mean && v.mean <= v.hi)) fail_msg("%s: the mean is outside its interval: %s", what, c);
}

/* ---- K-1, K-2: `kvsim keys` summary medians and head counts ------------------------------------------------- */
static void test_key_geometry_blocks_are_the_mean_of_keys_medians(void **state) {
    (void)state;
    (void)section();
    char *k1 = block("K-1"), *k2 = block("K-2");
    for (int m = 0; m < 2; m++) {
        char traces[MAX_TRACES][256];
        int n = prompt_traces(k_models[m], traces);
        for (int s = 0; s < 2; s++) {
            const char *scope = s ? "all" : "prompt";
            double med[5] = {0};
            int neg_sum = 0, neg_perq = 0, heads = 0, neg_kq = 0;
            for (int t = 0; t < n; t++) {
                char args[512];
                FMT(args, "keys '%s' --scope %s", traces[t], scope);
                char *o = kvsim_out(args);
                const char *ml = strstr(o, "median");
                assert_non_null(ml);
                double v[5];
                assert_int_equal(sscanf(ml, "median %lf %lf %lf %lf %lf", &v[0], &v[1], &v[2], &v[3], &v[4]), 5);
                for (int c = 0; c < 5; c++) med[c] += v[c] / n;
                const char *hl = strstr(o, "heads with rho < 0: ");
                assert_non_null(hl);
                int a, b, c2, d2;
                assert_int_equal(sscanf(hl, "heads with rho < 0: %d of %d (rho_sum), %d of %d", &a, &b, &c2, &d2), 4);
                neg_sum += a, neg_perq += c2, heads += b;
                /* per-head rows: layer, KV head, rho_sum, rho_perq, cos_kq, ... */
                for (const char *p = o; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
                    int layer, kvh;
                    double r1, r2, kq;
                    if (sscanf(p, " %d %d %lf %lf %lf", &layer, &kvh, &r1, &r2, &kq) == 5 && kq < 0) neg_kq++;
                }
                free(o);
            }
            char c1[128], c[256], want[128];
            const char *c2 = s ? "every position" : "first prompt";
            snprintf(c1, sizeof c1, "%s (%d)", k_models[m], n);
            /* the medians printed with 4 decimals: their mean is within 5e-5 of the script's */
            cell(k1, c1, c2, 2, c, sizeof c);
            assert_mean(c, med[0], 1e-4, "K-1 rho_sum");
            cell(k1, c1, c2, 3, c, sizeof c);
            assert_mean(c, med[1], 1e-4, "K-1 rho_perq");
            cell(k1, c1, c2, 4, c, sizeof c);
            snprintf(want, sizeof want, "%d of %d, %d of %d", neg_sum, heads, neg_perq, heads);
            assert_string_equal(c, want);
            cell(k2, c1, c2, 2, c, sizeof c);
            assert_mean(c, med[2], 1e-4, "K-2 cos_kq");
            cell(k2, c1, c2, 3, c, sizeof c);
            snprintf(want, sizeof want, "%d of %d", neg_kq, heads);
            assert_string_equal(c, want);
            cell(k2, c1, c2, 4, c, sizeof c);
            assert_mean(c, med[3], 1e-4, "K-2 cos_k_mk");
            cell(k2, c1, c2, 5, c, sizeof c);
            assert_mean(c, med[4], 1e-4, "K-2 norm_cv");
        }
    }
    free(k1);
    free(k2);
}

/* ---- K-3: `kvsim keys --policy` per-policy means ---------------------------------------------------------------- */
static void test_diversity_block_is_the_mean_of_keys_logdets(void **state) {
    (void)state;
    (void)section();
    static const char *const pol[6] = {"keydiff:block=128,anchor=normalized,", "keydiff:block=128,anchor=raw,pairwise=false,window_frac=0 ",
                                       "keydiff:block=128,anchor=raw,pairwise=false,window_frac=0.2", "tova:",
                                       "streaming:", "snapkv:"};
    char *k3 = block("K-3");
    for (int m = 0; m < 2; m++) {
        char traces[MAX_TRACES][256];
        int n = prompt_traces(k_models[m], traces);
        double mean[6] = {0};
        for (int t = 0; t < n; t++) {
            char args[1024];
            FMT(args, "keys '%s' --scope prompt --budget 33 --policy keydiff --policy keydiff@paper "
                     "--policy keydiff@paper-window20 --policy tova@keydiff --policy streaming@keydiff --policy snapkv@keydiff",
                     traces[t]);
            char *o = kvsim_out(args);
            const char *div = strstr(o, "retained key diversity");
            assert_non_null(div);
            for (int p = 0; p < 6; p++) {
                const char *l = strstr(div, pol[p]);
                if (!l) fail_msg("no row %s", pol[p]);
                const char *sp = strchr(l, ' ');
                assert_non_null(sp);
                mean[p] += atof(sp) / n; /* the policy's mean over heads, 4 decimals */
            }
            free(o);
        }
        char c1[128], c[256];
        snprintf(c1, sizeof c1, "%s (%d)", k_models[m], n);
        for (int p = 0; p < 6; p++) {
            cell(k3, c1, "33", 2 + p, c, sizeof c);
            assert_mean(c, mean[p], 1e-4, "K-3 logdet");
        }
        /* the paired table follows the first: the second row with these cells */
        const char *first = kvs_test_block_row(k3, c1, "33", KVS_TEST_CELL_EXACT);
        assert_non_null(first);
        const char *second = kvs_test_block_row(strchr(first, '\n') + 1, c1, "33", KVS_TEST_CELL_EXACT);
        assert_non_null(second);
        const int a[4] = {0, 0, 0, 2}, b[4] = {3, 4, 5, 1};
        for (int q = 0; q < 4; q++) {
            cell(second, c1, "33", 2 + q, c, sizeof c);
            assert_mean(c, mean[a[q]] - mean[b[q]], 2e-4, "K-3 paired difference");
            assert_non_null(strstr(c, "resolved"));
        }
    }
    free(k3);
}

/* ---- K-4: `kvsim compare --per-trace` at the two levels ---------------------------------------------------------- */
typedef struct {
    const char *label;  /* the block's configuration cell */
    const char *policy; /* compare's policy and params */
    const char *params;
} k4_config;

static const k4_config k4[] = {
    {"KeyDiff (Eq. 8: normalised-key anchor)", "keydiff", "block=128,anchor=normalized,pairwise=false,window_frac=0"},
    {"KeyDiff `@paper` (raw anchor)", "keydiff", "block=128,anchor=raw,pairwise=false,window_frac=0"},
    {"KeyDiff `@paper-window10` (10% window)", "keydiff", "block=128,anchor=raw,pairwise=false,window_frac=0.1"},
    {"KeyDiff `@paper-window20` (20% window)", "keydiff", "block=128,anchor=raw,pairwise=false,window_frac=0.2"},
    {"KNorm", "knorm", "block=128,window_frac=0"},
    {"TOVA", "tova", "mode=group,protect_current=false,block=128"},
    {"Sink (StreamingLLM, 4 sinks)", "streaming", "sinks=4"},
    {"window", "window", ""},
    {"SnapKV (prompt only)", "snapkv", "window=32,kernel=7,pool=avg,gqa=mean,block=128"},
};
#define N_K4 (sizeof k4 / sizeof k4[0])

/* per[c][t]: configuration c's out_err_mean on trace t at X (NAN where it has none) */
static void per_trace_values(const char *model, long x, int n_traces, char traces[][256], double per[][MAX_TRACES]) {
    char args[512];
    snprintf(args, sizeof args, "compare '%s/keydiff_%s.db' --match mem --at %ld --per-trace --metric out_err_mean --csv",
             section(), model, x);
    char *o = kvsim_out(args);
    for (size_t c = 0; c < N_K4; c++)
        for (int t = 0; t < n_traces; t++) per[c][t] = NAN;
    char *save = NULL, *col[64];
    int ic_pol = -1, ic_par = -1, ic_trace = -1, ic_val = -1, ic_status = -1;
    for (char *line = strtok_r(o, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        int nf = kvs_test_csv_fields(line, col, 64);
        if (ic_pol < 0) {
            ic_pol = kvs_test_csv_col(col, nf, "policy"), ic_par = kvs_test_csv_col(col, nf, "params");
            ic_trace = kvs_test_csv_col(col, nf, "trace"), ic_val = kvs_test_csv_col(col, nf, "out_err_mean");
            ic_status = kvs_test_csv_col(col, nf, "status");
            assert_true(ic_pol >= 0 && ic_par >= 0 && ic_trace >= 0 && ic_val >= 0 && ic_status >= 0);
            continue;
        }
        if (strcmp(col[ic_status], "interpolated") != 0 && strcmp(col[ic_status], "exact") != 0) continue;
        for (size_t c = 0; c < N_K4; c++) {
            if (strcmp(col[ic_pol], k4[c].policy) || strcmp(col[ic_par], k4[c].params)) continue;
            for (int t = 0; t < n_traces; t++) {
                const char *base = strrchr(traces[t], '/') + 1;
                size_t lt = strlen(col[ic_trace]), lb = strlen(base);
                if (lt >= lb && !strcmp(col[ic_trace] + lt - lb, base)) per[c][t] = atof(col[ic_val]);
            }
        }
    }
    free(o);
}

static void test_equal_memory_block_is_the_mean_of_per_trace_values(void **state) {
    (void)state;
    (void)section();
    char *k4b = block("K-4");
    /* the pairs of the block's second table, as indices of k4[] (a - b) */
    static const struct {
        const char *label;
        int a, b;
    } pairs[] = {{"KeyDiff − TOVA", 0, 5}, {"KeyDiff − Sink", 0, 6}, {"KeyDiff − window", 0, 7},
                 {"KeyDiff − SnapKV", 0, 8}, {"KeyDiff `@paper` − KeyDiff (the raw anchor)", 1, 0},
                 {"`@paper-window10` − `@paper` (10% window)", 2, 1},
                 {"`@paper-window20` − `@paper-window10` (10% more window)", 3, 2},
                 {"window − `@paper-window20` (all window)", 7, 3}, {"`@paper-window20` − KeyDiff", 3, 0}};
    int checked = 0;
    for (int m = 0; m < 2; m++) {
        char traces[MAX_TRACES][256];
        int n = prompt_traces(k_models[m], traces);
        const int d = k_head_dim[m];
        for (int lvl = 0; lvl < 2; lvl++) {
            long x = (lvl ? 512L : 256L) * d; /* 64 or 128 tokens x (K + V) x d x 2 bytes */
            double per[N_K4][MAX_TRACES];
            per_trace_values(k_models[m], x, n, traces, per);
            char c1[256], c[256];
            for (size_t k = 0; k < N_K4; k++) {
                double s = 0;
                int have = 0;
                for (int t = 0; t < n; t++)
                    if (!isnan(per[k][t])) s += per[k][t], have++;
                snprintf(c1, sizeof c1, "%s (%d; %d / %d KiB)", k_models[m], n, 256 * d / 1024, 512 * d / 1024);
                cell(k4b, c1, k4[k].label, 2 + lvl, c, sizeof c);
                if (have == 0) {
                    assert_string_equal(c, "-");
                    continue;
                }
                assert_mean(c, s / have, 0, "K-4 out_err_mean");
                if (have < n) {
                    char want[64];
                    snprintf(want, sizeof want, "(n = %d of %d)", have, n);
                    assert_non_null(strstr(c, want));
                }
                checked++;
            }
            for (size_t q = 0; q < sizeof pairs / sizeof pairs[0]; q++) {
                double s = 0;
                int have = 0;
                for (int t = 0; t < n; t++)
                    if (!isnan(per[pairs[q].a][t]) && !isnan(per[pairs[q].b][t]))
                        s += per[pairs[q].a][t] - per[pairs[q].b][t], have++;
                snprintf(c1, sizeof c1, "%s (%d)", k_models[m], n);
                cell(k4b, c1, pairs[q].label, 2 + lvl, c, sizeof c);
                if (have == 0) {
                    assert_string_equal(c, "-");
                    continue;
                }
                assert_mean(c, s / have, 0, "K-4 paired difference");
                assert_non_null(strstr(c, "resolved"));
                checked++;
            }
        }
    }
    assert_true(checked >= 60); /* SnapKV is out of range at some levels, everything else is compared */
    free(k4b);
}

/* ---- K-5: the paper's Table 8, again ---------------------------------------------------------------------- */
static const struct {
    const char *name;
    int zh;           /* a Chinese dataset (not in LongBench's English and code subset) */
    int bin[5], total; /* prompts < 2K, 2K-4K, 4K-6K, 6K-8K, > 8K (Llama tokens) */
    double cr[4];     /* the reported average CR at 2K, 4K, 6K, 8K */
} table8[] = {
    {"NarrativeQA", 0, {0, 0, 0, 8, 192}, 200, {0.10, 0.20, 0.30, 0.40}},
    {"Qasper", 0, {1, 77, 83, 25, 14}, 200, {0.47, 0.82, 0.96, 0.98}},
    {"MultiFieldQA-en", 0, {9, 31, 21, 32, 57}, 150, {0.40, 0.66, 0.82, 0.93}},
    {"MultiFieldQA-zh", 1, {14, 69, 47, 33, 37}, 200, {0.49, 0.78, 0.91, 0.98}},
    {"HotpotQA", 0, {1, 4, 12, 12, 171}, 200, {0.19, 0.37, 0.52, 0.66}},
    {"2WikiMQA", 0, {8, 17, 68, 54, 53}, 200, {0.36, 0.65, 0.85, 0.92}},
    {"MuSiQue", 0, {0, 0, 0, 3, 197}, 200, {0.13, 0.27, 0.40, 0.53}},
    {"DuReader", 1, {0, 0, 0, 16, 184}, 200, {0.17, 0.34, 0.52, 0.68}},
    {"GovReport", 0, {0, 20, 29, 45, 106}, 200, {0.28, 0.52, 0.70, 0.81}},
    {"QMSum", 0, {0, 1, 17, 15, 167}, 200, {0.18, 0.36, 0.52, 0.66}},
    {"MultiNews", 0, {99, 71, 19, 6, 5}, 200, {0.81, 0.96, 0.98, 0.53}},
    {"VCSUM", 1, {4, 20, 18, 32, 126}, 200, {0.27, 0.49, 0.65, 0.68}},
    {"TREC", 0, {4, 43, 41, 39, 73}, 200, {0.38, 0.66, 0.84, 0.94}},
    {"TriviaQA", 0, {4, 21, 15, 21, 139}, 200, {0.26, 0.46, 0.60, 0.72}},
    {"SAMSum", 0, {6, 29, 34, 17, 114}, 200, {0.32, 0.55, 0.71, 0.82}},
    {"LSHT", 1, {0, 0, 3, 8, 189}, 200, {0.13, 0.27, 0.39, 0.52}},
    {"PassageCount", 0, {0, 0, 3, 13, 184}, 200, {0.15, 0.31, 0.46, 0.60}},
    {"PassageRetrieval-en", 0, {0, 0, 0, 0, 200}, 200, {0.16, 0.33, 0.49, 0.66}},
    {"PassageRetrieval-zh", 1, {0, 0, 160, 10, 0}, 170, {0.37, 0.74, 0.99, 1.00}},
    {"LCC", 0, {80, 86, 21, 4, 9}, 200, {0.78, 0.95, 0.98, 0.99}},
    {"RepoBench-P", 0, {0, 25, 37, 25, 113}, 200, {0.27, 0.52, 0.67, 0.78}},
};
#define N_TABLE8 (sizeof table8 / sizeof table8[0])

static void test_longbench_block_recomputed_from_table_8(void **state) {
    (void)state;
    (void)section();
    char *k5 = block("K-5");
    int total = 0, over8 = 0, under2 = 0, total_en = 0, over8_en = 0;
    for (size_t i = 0; i < N_TABLE8; i++) {
        int s = 0;
        for (int j = 0; j < 5; j++) s += table8[i].bin[j];
        assert_int_equal(s, table8[i].total); /* the copy is consistent with itself */
        total += s, over8 += table8[i].bin[4], under2 += table8[i].bin[0];
        if (!table8[i].zh) total_en += s, over8_en += table8[i].bin[4];
    }
    char want[256];
    snprintf(want, sizeof want, "%d of %d (%.1f%%) over the 21 datasets, %d of %d (%.1f%%)", over8, total,
             100.0 * over8 / total, over8_en, total_en, 100.0 * over8_en / total_en);
    assert_non_null(strstr(k5, want));
    snprintf(want, sizeof want, "%d of %d (%.1f%%)", total - under2, total, 100.0 * (total - under2) / total);
    assert_non_null(strstr(k5, want));
    static const double paper[4] = {0.31, 0.53, 0.67, 0.77};
    /* a prompt in bin j: min(N / L, 1) between its values at the bin's upper and lower edges (edges 0, 2K .. 8K, inf) */
    static const double lo_edge[5] = {0, 2, 4, 6, 8}, hi_edge[5] = {2, 4, 6, 8, INFINITY};
    for (int k = 0; k < 4; k++) {
        double n_k = 2.0 * (k + 1), mean = 0, wmean = 0, lo = 0, hi = 0;
        for (size_t i = 0; i < N_TABLE8; i++) {
            mean += table8[i].cr[k] / N_TABLE8;
            wmean += table8[i].cr[k] * table8[i].total / total;
            for (int j = 0; j < 5; j++) {
                lo += table8[i].bin[j] * fmin(n_k / hi_edge[j], 1.0) / total;
                hi += table8[i].bin[j] * (lo_edge[j] == 0 ? 1.0 : fmin(n_k / lo_edge[j], 1.0)) / total;
            }
        }
        snprintf(want, sizeof want, "| %dK | %.2f | %.0f%% | %.4f | %.4f | [%.3f, %.3f] |", 2 * (k + 1), paper[k],
                 100 * (1 - paper[k]), mean, wmean, lo, hi);
        if (!strstr(k5, want)) fail_msg("K-5 lacks the row %s", want);
        assert_true(lo <= paper[k] && paper[k] <= hi);
    }
    /* MultiNews at 8K: 195 of its 200 prompts are at most 8K tokens long (CR 1 each) */
    assert_non_null(strstr(k5, "- MultiNews at 8K: the table gives 0.53; its bins allow [0.975, 1.000]"));
    assert_non_null(strstr(k5, "- MultiNews: the CR falls from 0.98 at 6K to 0.53 at 8K"));
    /* no other dataset is ruled out */
    int bullets = 0;
    for (const char *p = strstr(k5, "\n- "); p; p = strstr(p + 1, "\n- ")) bullets++;
    assert_int_equal(bullets, 2);
    double rest = 0;
    for (size_t i = 0; i < N_TABLE8; i++)
        if (strcmp(table8[i].name, "MultiNews") != 0) rest += table8[i].cr[3];
    snprintf(want, sizeof want, "anywhere in [%.3f, 1]", (0.77 - 0.005) * N_TABLE8 - rest);
    assert_non_null(strstr(k5, want));

    /* this study's prompts: CR = mean min(N / L, 1) from the prompt lengths kvsim info reports */
    for (int m = 0; m < 2; m++) {
        char traces[MAX_TRACES][256];
        int n = prompt_traces(k_models[m], traces);
        double cr[3] = {0};
        int lmin = 1 << 30, lmax = 0;
        for (int t = 0; t < n; t++) {
            char args[512];
            FMT(args, "info '%s'", traces[t]);
            char *o = kvsim_out(args);
            const char *p = line_starting(o, "positions");
            assert_non_null(p);
            long pos, prompt;
            assert_int_equal(sscanf(p, "positions %ld (%ld prompt", &pos, &prompt), 2);
            free(o);
            lmin = prompt < lmin ? (int)prompt : lmin;
            lmax = prompt > lmax ? (int)prompt : lmax;
            for (int k = 0; k < 3; k++) cr[k] += fmin((32 << k) / (double)prompt, 1.0) / n;
        }
        snprintf(want, sizeof want, "| %s (%d) | %d-%d | %.3f | %.3f | %.3f |", k_models[m], n, lmin, lmax, cr[0], cr[1],
                 cr[2]);
        if (!strstr(k5, want)) fail_msg("K-5 lacks the row %s", want);
    }
    free(k5);
}

/* ---- K-6: the count's closed form and the replay's charges ------------------------------------------------ */
static void test_flop_block_follows_the_closed_form(void **state) {
    (void)state;
    (void)section();
    char *k6 = block("K-6");
    int rows = 0;
    for (const char *p = k6; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        char model[64];
        int d;
        long b, n, rd, tmp, add, mul, sq, dv, fl;
        double per;
        if (sscanf(p, "| %63s (%d)%*[^|]| %ld | %ld | %ld | %ld | %ld | %ld | %ld | %ld | %ld | %lf |", model, &d, &b, &n,
                   &rd, &tmp, &add, &mul, &sq, &dv, &fl, &per) != 12)
            continue;
        rows++;
        if (strcmp(model, "Llama-3.1-8B") != 0) {
            int m = strcmp(model, k_models[0]) == 0 ? 0 : 1;
            assert_string_equal(model, k_models[m]);
            assert_int_equal(d, k_head_dim[m]);
        } else {
            assert_int_equal(d, 128);
        }
        assert_int_equal(n, b);                /* the C = B - 1 held keys and the current token */
        assert_int_equal(rd, n * d * 2);       /* the keys re-read unfused, fp16 */
        assert_int_equal(tmp, (n + d) * 4);    /* mu and the scores, fp32 */
        assert_int_equal(add, 3 * n * d - n - 1);
        assert_int_equal(mul, 3 * n * d + n + 2 * d);
        assert_int_equal(sq, n + 1);
        assert_int_equal(dv, 2 * n + 1);
        assert_int_equal(fl, 12 * n * d + 97 * n + 6 * d + 47);
        assert_true(fabs(per - (double)fl / (double)n) <= 0.05 + 1e-9);
        assert_true(per > 12 * d + 97); /* linear in n: the per-candidate cost falls toward 12d + 97 */
    }
    assert_int_equal(rows, 4 + 4 + 4); /* four budgets per model, four N of the paper */
    free(k6);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_key_geometry_blocks_are_the_mean_of_keys_medians),
        cmocka_unit_test(test_diversity_block_is_the_mean_of_keys_logdets),
        cmocka_unit_test(test_equal_memory_block_is_the_mean_of_per_trace_values),
        cmocka_unit_test(test_longbench_block_recomputed_from_table_8),
        cmocka_unit_test(test_flop_block_follows_the_closed_form),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
