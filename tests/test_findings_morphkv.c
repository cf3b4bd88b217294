/* test_findings_morphkv.c — the MorphKV section of examples/FINDINGS.md (examples/findings/morphkv.sh) recomputed
 * another way, from what the script wrote under $OUT (its blocks, prompt traces and databases):
 *  - M-1 and M-2 from each prompt trace's header alone (P, T, G, d; no replay): at decode step i the full cache holds
 *    P + i positions per KV head, MorphKV and the repository's H2O min(C_tot + 1, P + i) (H2O once per query head),
 *    SnapKV min(C_tot + 1, P) + i per query head; MorphKV's profile rows are G·R fp32 values per resident position
 *    and its `qz` store G·R·(d + 1) fp32 values, with R = round(30 C_tot / 600);
 *  - M-3's window and MorphKV `qz` rows and their paired difference, M-4's fusions and M-5's token ratio from the
 *    runs in the section's databases read through the results API, interpolated here in log bytes between each
 *    trace's two runs around the level, independently of `kvsim compare` and of the script's awk;
 *  - SnapKV's floor and where it cannot be compared (M-3-snapkv, M-3);
 *  - the paper arithmetic (M-1-paper, M-2-paper, M-5-paper, M-6, M-7) from the published configs of the paper's
 *    models written out here (not kvsim's presets) and the paper's bar heights.
 * Runs `sh examples/findings.sh --only morphkv` once (seconds) with the shared models beside the repository; skips
 * without them, outside `make test` and under the sanitizers (a whole study script).
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

#include "common/kvs.h"
#include "results/results.h"
#include "tests/util/findings_blocks.h"
#include "tests/util/testenv.h"

static const char *const models[] = {"stories260K", "tinystories-656K"};
#define N_MODELS 2
#define MAX_TRACES 16

static const char *const mk_qz = "recent=30,fusion=sum,fidelity=paper,profile=qz,evict_after=1,paper_ctot=600";
static const char *const mk_rows = "recent=30,fusion=sum,fidelity=paper,profile=rows,evict_after=1,paper_ctot=600";
static const char *const mk_max = "recent=30,fusion=max,fidelity=paper,profile=rows,evict_after=1,paper_ctot=600";
static const char *const h2o_repo = "recent=0.5,gqa=expand,prefill=budget,window=30,block=0";

/* The section's $OUT, the script run once for the whole file; skips when it cannot run here. */
static const char *section(void) {
    const char *out = NULL;
    if (kvs_test_findings_once("morphkv", &out) == 0) skip();
    if (!out) fail_msg("findings.sh --check --only morphkv failed");
    return out;
}

/* The text of generated block NAME (caller frees). */
static char *block(const char *name) {
    char *text = kvs_test_findings_block(section(), name);
    assert_non_null(text);
    return text;
}

/* Cell `col` (0 = the first) of the table row of `text` whose first cell is `first` and whose second cell starts
 * with `second` ("" for any), trimmed (into buf). */
static const char *cell_text(const char *text, const char *first, const char *second, int col, char *buf, size_t cap) {
    if (kvs_test_block_cell(text, first, second, KVS_TEST_CELL_PREFIX, col, buf, cap) != 1)
        fail_msg("no row '%s' / '%s' with a cell %d", first, second, col);
    return buf;
}

/* The leading number of a cell (fails on "-"). */
static double cell(const char *text, const char *first, const char *second, int col) {
    char buf[512];
    const char *c = cell_text(text, first, second, col, buf, sizeof buf);
    char *end;
    double v = strtod(c, &end);
    if (end == c) fail_msg("row '%s' / '%s' cell %d is '%s', not a number", first, second, col, c);
    return v;
}

static int cell_is_dash(const char *text, const char *first, const char *second, int col) {
    char buf[512];
    return !strcmp(cell_text(text, first, second, col, buf, sizeof buf), "-");
}

/* The number after `key` on the line of `text` that starts with `start` and holds `key`. */
static double after(const char *text, const char *start, const char *key) {
    double v = 0;
    if (!kvs_test_block_after(text, start, key, &v)) fail_msg("no line '%s' ... '%s'", start, key);
    return v;
}

/* `printed` is `value` printed to `sig` significant figures. */
static void assert_sig(double printed, double value, int sig) {
    if (!kvs_test_sig_equal(printed, value, sig)) fail_msg("printed %.6g, recomputed %.6g", printed, value);
}
/* `printed` is `value` printed with `dec` decimals. */
static void assert_dec(double printed, double value, int dec) {
    if (fabs(printed - value) > 0.5 * pow(10.0, -dec) * (1 + 1e-9)) fail_msg("printed %.6g, recomputed %.6g", printed, value);
}

/* ---- the prompt traces ---------------------------------------------------------------------------------------- */

typedef kvs_test_trace_shape trace_dims;

/* The prompt traces of a model, sorted by path (as the script reads them). */
static size_t traces_of(const char *model, trace_dims *t) {
    int n = kvs_test_findings_prompts(section(), model, t, MAX_TRACES);
    assert_true(n >= 2);
    return (size_t)n;
}

/* Mean over the T decode steps of the positions a cache of `cap` positions (0: unbounded) holds, P + i at step i. */
static double held_mean(const trace_dims *x, int64_t cap) {
    double s = 0;
    for (int64_t i = 1; i <= x->T; i++) s += (double)(cap > 0 && cap < x->P + i ? cap : x->P + i);
    return s / (double)x->T;
}
/* SnapKV at budget B: min(B, P) prompt positions plus the i generated so far, per query head. */
static double snap_mean(const trace_dims *x, int64_t B) { return (double)(B < x->P ? B : x->P) + (double)(x->T + 1) / 2; }

static int64_t scaled_R(int64_t ctot) { return (int64_t)llround(30.0 * (double)ctot / 600.0); }

/* M-1 and M-2: every ratio from the headers. */
static void test_memory_ratios_follow_the_trace_headers(void **state) {
    (void)state;
    (void)section();
    char *m1 = block("M-1"), *m2 = block("M-2");
    static trace_dims tr[MAX_TRACES];
    for (int mi = 0; mi < N_MODELS; mi++) {
        size_t n = traces_of(models[mi], tr);
        char row[64];
        snprintf(row, sizeof row, "%s (%zu)", models[mi], n);
        for (int64_t ctot = 32; ctot <= 128; ctot *= 2) {
            char c[24];
            snprintf(c, sizeof c, "%lld", (long long)ctot);
            double mf = 0, hf = 0, sf = 0, rows = 0, qz = 0;
            int64_t G = tr[0].G, d = tr[0].d, R = scaled_R(ctot);
            for (size_t i = 0; i < n; i++) {
                const trace_dims *x = &tr[i];
                assert_true(x->G == G && x->d == d);
                double full = held_mean(x, 0), mk = held_mean(x, ctot + 1);
                mf += mk / full / (double)n;
                hf += (double)x->G * mk / full / (double)n;
                sf += (double)x->G * snap_mean(x, ctot + 1) / full / (double)n;
                /* rows: G R fp32 values per resident position beside 2 d fp16 values; qz: G R (d + 1) fp32 values */
                rows += ((double)(G * R) * 4.0 * mk) / (mk * 4.0 * (double)d) / (double)n;
                qz += ((double)(G * R * (d + 1)) * 4.0) / (mk * 4.0 * (double)d) / (double)n;
            }
            /* columns: 1 C_tot, 2 MorphKV/Full, 3 H2O/Full, 4 SnapKV/Full, 5 MorphKV/H2O, 6 1/G */
            assert_sig(cell(m1, row, c, 2), mf, 3);
            assert_sig(cell(m1, row, c, 3), hf, 3);
            assert_sig(cell(m1, row, c, 4), sf, 3);
            char buf[128];
            snprintf(buf, sizeof buf, "%.3g [%.3g, %.3g]", 1.0 / (double)G, 1.0 / (double)G, 1.0 / (double)G);
            char got[512];
            assert_string_equal(cell_text(m1, row, c, 5, got, sizeof got), buf); /* exactly 1/G on every prompt */
            assert_dec(cell(m1, row, c, 6), 1.0 / (double)G, 3);
            /* M-2 columns: 2 R, 3 rows/KV, 4 its formula, 5 qz/KV, 6 its formula */
            assert_true(cell(m2, row, c, 2) == (double)R);
            assert_sig(cell(m2, row, c, 3), rows, 3);
            assert_sig(cell(m2, row, c, 4), (double)(G * R) / (double)d, 3);
            assert_sig(cell(m2, row, c, 5), qz, 3);
        }
    }
    free(m1);
    free(m2);
}

/* ---- the runs of the section's databases ------------------------------------------------------------------- */

typedef struct {
    double x[8], err[8], tok[8]; /* per budget: storage_bytes_mean, out_err_mean, attended_tokens_mean */
    int64_t budget[8];
    int n;
} series;

/* The runs of (policy, params) on one trace of the model's database, ascending budget. */
static series runs_of(const char *model, const trace_dims *t, const char *policy, const char *params) {
    char path[1200];
    snprintf(path, sizeof path, "%s/morphkv_%s.db", section(), model);
    kvs_results_db *db = NULL;
    assert_int_equal(kvs_results_open_readonly(path, &db), KVS_OK);
    kvs_results_filter f = {.policy = policy, .trace_path = t->path, .measure = "decode"};
    kvs_results_run_row *rows = NULL;
    int64_t n = 0;
    assert_int_equal(kvs_results_query_runs(db, &f, &rows, &n), KVS_OK);
    series s = {.n = 0};
    for (int64_t i = 0; i < n; i++) {
        if (strcmp(rows[i].params ? rows[i].params : "", params) != 0) continue;
        assert_true(s.n < 8);
        int j = s.n++;
        while (j > 0 && s.budget[j - 1] > rows[i].budget_tokens) {
            s.budget[j] = s.budget[j - 1], s.x[j] = s.x[j - 1], s.err[j] = s.err[j - 1], s.tok[j] = s.tok[j - 1];
            j--;
        }
        s.budget[j] = rows[i].budget_tokens;
        s.x[j] = rows[i].agg.storage_bytes.mean;
        s.err[j] = rows[i].agg.out_err.mean;
        s.tok[j] = rows[i].agg.attended_tokens.mean;
    }
    kvs_results_run_rows_free(rows, n);
    kvs_results_close(db);
    assert_true(s.n >= 3);
    return s;
}

/* The value (out_err or attended tokens) of a series at X bytes: linear in log bytes between the two runs around X
 * (at most 4x apart, kvsim compare's default); 0 when X is outside its runs. */
static int at_level(const series *s, double X, int tokens, double *v) {
    for (int i = 0; i + 1 < s->n; i++) {
        if (!(s->x[i] <= X && X <= s->x[i + 1])) continue;
        if (s->x[i + 1] / s->x[i] > 4) return 0;
        const double *y = tokens ? s->tok : s->err;
        double w = log(X / s->x[i]) / log(s->x[i + 1] / s->x[i]);
        *v = y[i] + w * (y[i + 1] - y[i]);
        return 1;
    }
    return 0;
}

/* M-3 (window and MorphKV qz at each level, their paired difference), SnapKV's floor, M-5's token ratio. */
static void test_equal_memory_values_recomputed_from_the_runs(void **state) {
    (void)state;
    (void)section();
    char *m3 = block("M-3"), *pairs = block("M-3-pairs"), *snap = block("M-3-snapkv"), *m5 = block("M-5");
    static trace_dims tr[MAX_TRACES];
    const char *levels[] = {"2KiB", "4KiB", "6KiB"};
    for (int mi = 0; mi < N_MODELS; mi++) {
        size_t n = traces_of(models[mi], tr);
        char row[64];
        snprintf(row, sizeof row, "%s (%zu)", models[mi], n);
        double floor_b = (double)tr[0].G * (double)(tr[0].T + 1) / 2 * 4.0 * (double)tr[0].d;
        assert_sig(cell(snap, row, "", 3), floor_b / 1024, 3);
        for (int l = 0; l < 3; l++) {
            double X = 2048.0 * (l + 1);
            double w = 0, q = 0, dq = 0;
            int nw = 0, nq = 0, nd = 0;
            for (size_t i = 0; i < n; i++) {
                series sw = runs_of(models[mi], &tr[i], "window", ""), sq = runs_of(models[mi], &tr[i], "morphkv", mk_qz);
                double a = 0, b = 0;
                int ha = at_level(&sw, X, 0, &a), hb = at_level(&sq, X, 0, &b);
                if (ha) w += a, nw++;
                if (hb) q += b, nq++;
                if (ha && hb) dq += b - a, nd++;
            }
            assert_true(nw == (int)n && nq == (int)n && nd == (int)n); /* both reach every level on every prompt */
            /* M-3 columns: 2, 3, 4 = the levels */
            assert_sig(cell(m3, row, "window", 2 + l), w / nw, 3);
            assert_sig(cell(m3, row, "MorphKV `qz`", 2 + l), q / nq, 3);
            /* M-3-pairs columns: 1 X, 2 qz - rows, 3 qz - window */
            assert_sig(cell(pairs, models[mi], levels[l], 3), dq / nd, 3);
            /* SnapKV keeps every generated token per query head: below its floor it has no value */
            if (X < floor_b) assert_true(cell_is_dash(m3, row, "SnapKV", 2 + l));
        }
        /* M-5: attended tokens of MorphKV qz over the repository's H2O at 4 KiB, per trace; G from the header */
        double ratio = 0;
        for (size_t i = 0; i < n; i++) {
            series sq = runs_of(models[mi], &tr[i], "morphkv", mk_qz), sh = runs_of(models[mi], &tr[i], "h2o", h2o_repo);
            double a = 0, b = 0;
            assert_true(at_level(&sq, 4096, 1, &a));
            assert_true(at_level(&sh, 4096, 1, &b));
            ratio += a / b / (double)n;
        }
        assert_sig(cell(m5, row, "", 5), ratio, 3);
        assert_true(cell(m5, row, "", 6) == (double)tr[0].G);
    }
    free(m3);
    free(pairs);
    free(snap);
    free(m5);
}

/* M-4: each fusion's mean and the paired difference, from the runs at C_tot 32, 64, 128. */
static void test_fusion_means_and_paired_difference(void **state) {
    (void)state;
    (void)section();
    char *m4 = block("M-4");
    static trace_dims tr[MAX_TRACES];
    for (int mi = 0; mi < N_MODELS; mi++) {
        size_t n = traces_of(models[mi], tr);
        char row[64];
        snprintf(row, sizeof row, "%s (%zu)", models[mi], n);
        for (int k = 0; k < 3; k++) {
            int64_t B = (int64_t)32 << k;
            double s = 0, m = 0;
            for (size_t i = 0; i < n; i++) {
                series ss = runs_of(models[mi], &tr[i], "morphkv", mk_rows), sm = runs_of(models[mi], &tr[i], "morphkv", mk_max);
                int js = -1, jm = -1;
                for (int j = 0; j < ss.n; j++) js = ss.budget[j] == B + 1 ? j : js;
                for (int j = 0; j < sm.n; j++) jm = sm.budget[j] == B + 1 ? j : jm;
                assert_true(js >= 0 && jm >= 0);
                assert_true(ss.x[js] == sm.x[jm]); /* the fusion changes no byte */
                s += ss.err[js] / (double)n;
                m += sm.err[jm] / (double)n;
            }
            char c[16];
            snprintf(c, sizeof c, "%lld", (long long)B);
            /* columns: 2 R, 3 sum, 4 max, 5 sum - max */
            assert_true(cell(m4, row, c, 2) == (double)scaled_R(B));
            assert_sig(cell(m4, row, c, 3), s, 3);
            assert_sig(cell(m4, row, c, 4), m, 3);
            assert_sig(cell(m4, row, c, 5), s - m, 3); /* a paired mean over the same traces is the difference of means */
        }
    }
    free(m4);
}

/* ---- the paper's models ------------------------------------------------------------------------------------- */

/* Published configs (config.json of each model): query heads, KV heads, head_dim, layers. */
static const struct {
    const char *name;
    int heads, kv, hd, layers;
} paper[] = {{"Llama-3.1-8B", 32, 8, 128, 32}, {"Mistral-7B-v0.2", 32, 8, 128, 32}, {"Qwen2.5-7B", 28, 4, 128, 28},
             {"Phi-4", 40, 10, 128, 40}};

static void test_paper_arithmetic_from_the_published_configs(void **state) {
    (void)state;
    (void)section();
    char *p1 = block("M-1-paper"), *p2 = block("M-2-paper"), *p5 = block("M-5-paper"), *m6 = block("M-6"),
         *m7 = block("M-7"), *r30 = block("M-2-r30");
    for (size_t i = 0; i < sizeof paper / sizeof paper[0]; i++) {
        double G = (double)paper[i].heads / paper[i].kv, d = paper[i].hd;
        assert_true(cell(p1, paper[i].name, "", 1) == G);
        assert_dec(cell(p1, paper[i].name, "", 2), 1 / G, 3);
        assert_dec(cell(p1, paper[i].name, "", 3), 100 * (1 - 1 / G), 1);
        assert_dec(cell(p1, paper[i].name, "", 4), (1 + G * 30 / (2 * d)) / G, 3);
        assert_dec(cell(p1, paper[i].name, "", 5), (1 + G * 200 / (2 * d)) / G, 3);
        assert_true(cell(p2, paper[i].name, "", 2) == d);
        assert_dec(cell(p2, paper[i].name, "", 3), G * 30 / (2 * d), 3);
        assert_dec(cell(p2, paper[i].name, "", 4), G * 32 / (2 * d), 3);
        assert_dec(cell(p2, paper[i].name, "", 5), G * 200 / (2 * d), 3);
        assert_true(cell(p5, paper[i].name, "", 1) == paper[i].heads && cell(p5, paper[i].name, "", 2) == paper[i].kv);
        assert_true(cell(p5, paper[i].name, "", 3) == G);
    }
    assert_true(cell(p5, "Qwen2.5-7B", "", 3) == 7); /* M21 */
    /* the paper's bars: LongGenBench (Fig. 8) 0.55, 1.22, 5.01; LongWriter (Fig. 6) 0.25, 1, 4 */
    assert_dec(after(p1, "- 1/G for any mix", "between "), 1.0 / 7, 3);
    assert_dec(after(p1, "- LongGenBench bars", "MorphKV / H2O = "), 0.55 / 1.22, 3);
    assert_dec(after(p1, "- LongGenBench bars", "(saving "), 100 * (1 - 0.55 / 1.22), 1);
    assert_dec(after(p1, "- LongGenBench bars", "against SnapKV: saving "), 100 * (1 - 0.55 / 5.01), 1);
    assert_dec(after(p1, "- the mean of the two", "savings: "), 50 * (0.75 + 1 - 0.55 / 1.22), 1);
    assert_dec(after(p1, "- the mean of the two", "against H2O, "), 50 * (1 - 0.25 / 4 + 1 - 0.55 / 5.01), 1);
    assert_dec(after(p1, "- LongBench bars", "MorphKV / SnapKV = "), 0.15 / 0.42, 3);
    assert_dec(after(p1, "- LongGenBench's prompts", "Mistral and Qwen is "), (4 + 4 + 7) / 3.0, 3);
    assert_dec(after(p1, "- H2O at LongGenBench", "0.55x of Full, "), 4 * 0.55, 2);
    assert_dec(after(p1, "- H2O at LongGenBench", "1.22x is "), 1.22 / 0.55, 2);
    /* M-6 from the settings: Phi-4 (G 4) C_tot 2048 against SnapKV's 1024 + T per query head */
    int T = (int)floor(2049 / (4 * (1 - 0.56)) - 1024 + 0.5);
    char want[512];
    snprintf(want, sizeof want, "| %.3f at T = 0, %.3f at T = %d |", 2049.0 / (4 * 1024), 2049.0 / (4.0 * (1024 + T)), T);
    assert_non_null(strstr(m6, want));
    /* Qwen2.5-7B (G 7), prompt 512: everything kept per query head until MorphKV evicts at 4097 positions */
    int P17 = (int)floor(0.17 * 7 * 1024 + 0.5);
    snprintf(want, sizeof want, "| %.3f at 1024 tokens, %.3f at 4096 tokens, %.3f at 8192 tokens; %.3f with a %d-token prompt",
             1.0 / 7, 4096.0 / (7 * 4096), 4097.0 / (7 * 8192), (double)P17 / (7 * 1024), P17);
    assert_non_null(strstr(m6, want));
    int L20 = (int)floor(2049 / 0.2 + 0.5);
    snprintf(want, sizeof want, "| %.3f at a 6000-token prompt, %.3f at %d; with the profile rows (R = 32, one dtype) x %.2f |",
             2049.0 / 6000, 2049.0 / L20, L20, 1 + 4 * 32 / 256.0);
    assert_non_null(strstr(m6, want));
    /* M-7: 2 x layers x 8 KV heads x 128 x 2 bytes per token, x length x 256 (Llama-3.1 70B: 80 layers, 405B: 126) */
    for (int64_t L = 4096; L <= 131072; L *= 8) {
        double a = 2.0 * 80 * 8 * 128 * 2, b = 2.0 * 126 * 8 * 128 * 2;
        snprintf(want, sizeof want, "| %lld | %.4g TiB | %.4g TiB | %.0f / %.0f |", (long long)L,
                 a * (double)L * 256 / pow(2, 40), b * (double)L * 256 / pow(2, 40), a, b);
        assert_non_null(strstr(m7, want));
    }
    assert_non_null(strstr(m7, "| 131072 | 10 TiB | 15.75 TiB |")); /* POLICY_SPEC §5.1 M22 */
    /* M-2-r30: R = 30 rows over the bundled trace's header (G 2, d 8): G R / d = 7.5, measured the same */
    assert_dec(cell(r30, "stories260K", "", 2), 7.5, 3);
    assert_dec(cell(r30, "stories260K", "", 3), 7.5, 3);
    free(p1);
    free(p2);
    free(p5);
    free(m6);
    free(m7);
    free(r30);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_memory_ratios_follow_the_trace_headers),
        cmocka_unit_test(test_equal_memory_values_recomputed_from_the_runs),
        cmocka_unit_test(test_fusion_means_and_paired_difference),
        cmocka_unit_test(test_paper_arithmetic_from_the_published_configs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
