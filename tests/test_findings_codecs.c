/* test_findings_codecs.c — the section "KV quantization and key pruning against eviction at equal bytes" of
 * examples/FINDINGS.md (examples/findings/codecs.sh, run once through `examples/findings.sh --only codecs` on the
 * shared models), recomputed another way from what the script left under its $OUT:
 *  - every representation's full-cache bytes from the codec's byte rule (sim/codec.h, "Bytes" and the time
 *    rule's q(n)) and each trace's shape (P, N, d from its header), averaged over the decode steps by hand; the
 *    database's storage_bytes_mean equals the rule on every trace, and the printed KiB and ratio are their means;
 *  - the window's error at each quantized full cache's bytes, interpolated here in log bytes between the
 *    window's runs (their bytes from min(B, n) 16-bit rows, their errors from the database), and the paired
 *    difference as the mean of the per-trace differences; TOVA's column from `kvsim compare --per-trace --csv`'s
 *    per-trace values, averaged here;
 *  - the window and the 4-bit window at 2 and 4 KiB by the same hand interpolation (the 4-bit window's bytes
 *    from the per-token rule), and their paired difference;
 *  - a 4-bit window of 4B tokens against a 16-bit window of B: the bytes ratio from the two rules, the errors
 *    and their paired difference from the database;
 *  - every "resolved" of Q-2-pairs, Q-3 and Q-4 holds exactly when the interval printed beside it excludes 0.
 * Skips without the shared models, outside `make test` and under the sanitizers (a whole study script).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/util/findings_blocks.h"
#include "tests/util/testenv.h"

#define MAX_TRACES 16
#define MAX_RUNS 512

static const char *const k_models[2] = {"stories260K", "tinystories-656K"};

/* The codecs of the section by canonical spec, with the name its tables give them. */
typedef enum { C_NONE, C_I4, C_I2, C_KIVI, C_KIVI32, C_HF, C_FP8, C_THINK, N_CODECS } codec_id;
static const char *const k_spec[N_CODECS] = {"",
                                             "int:bits=4,group=32,k_axis=channel,v_axis=channel",
                                             "int:bits=2,group=32,k_axis=channel,v_axis=channel",
                                             "kivi:bits=2,group=32,residual=128",
                                             "kivi:bits=2,group=32,residual=32",
                                             "hf:bits=4,group=64,residual=128",
                                             "fp8:format=e4m3,scale=1,per=tensor",
                                             "think:ratio=0.4,window=32,recent=32"};
static const char *const k_name[N_CODECS] = {"16-bit (as captured)",
                                             "int4 per-token",
                                             "int2 per-token",
                                             "KIVI-2 (G 32, R 128: the paper's)",
                                             "KIVI-2 (G 32, R 32: scaled to these traces, not the paper's default)",
                                             "HF QuantizedCache (int4, group 64, R 128)",
                                             "fp8 e4m3 (scale 1)",
                                             "ThinK (40 % of key channels pruned)"};

/* The section's $OUT, the script run once for the whole file; skips when it cannot run here. */
static const char *section(void) {
    const char *out = NULL;
    if (kvs_test_findings_once("codecs", &out) == 0) skip();
    if (!out) fail_msg("findings.sh --check --only codecs failed");
    return out;
}

static char *block(const char *name) {
    char *s = kvs_test_findings_block(section(), name);
    assert_non_null(s);
    return s;
}

/* ---- traces and runs ------------------------------------------------------------------------------------------ */

typedef kvs_test_trace_shape trace_dims;

/* The prompt traces of a model (sorted by path) with their shapes; returns the count. */
static int prompt_traces(const char *model, trace_dims *t) {
    int n = kvs_test_findings_prompts(section(), model, t, MAX_TRACES);
    assert_true(n >= 2);
    for (int i = 0; i < n; i++) assert_int_equal(t[i].kv_bytes, 2); /* the 16-bit rows: 2 bytes */
    return n;
}

typedef struct {
    char trace[512], policy[32], codec[80];
    int64_t budget;
    double bytes, err;
} run_row;

/* Every complete run of the section's database of a model (kvsim runs --csv --summary). */
static int read_runs(const char *model, run_row *r) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' runs '%s/codecs_%s.db' --csv --summary", getenv("KVSIM_BIN"), section(), model);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    static char line[1 << 16];
    char *f[400];
    int c_tr = -1, c_pol = -1, c_codec = -1, c_bud = -1, c_sto = -1, c_err = -1, n = 0;
    for (int row = 0; fgets(line, sizeof line, p); row++) {
        int nf = kvs_test_csv_fields(line, f, 400);
        if (row == 0) {
            c_tr = kvs_test_csv_col(f, nf, "trace"), c_pol = kvs_test_csv_col(f, nf, "policy");
            c_codec = kvs_test_csv_col(f, nf, "codec"), c_bud = kvs_test_csv_col(f, nf, "budget_tokens");
            c_sto = kvs_test_csv_col(f, nf, "storage_bytes_mean"), c_err = kvs_test_csv_col(f, nf, "out_err_mean");
            assert_true(c_tr >= 0 && c_pol >= 0 && c_codec >= 0 && c_bud >= 0 && c_sto >= 0 && c_err >= 0);
            continue;
        }
        assert_true(nf > c_sto && nf > c_err && n < MAX_RUNS);
        snprintf(r[n].trace, sizeof r[n].trace, "%s", f[c_tr]);
        snprintf(r[n].policy, sizeof r[n].policy, "%s", f[c_pol]);
        snprintf(r[n].codec, sizeof r[n].codec, "%s", f[c_codec]);
        r[n].budget = atoll(f[c_bud]);
        r[n].bytes = atof(f[c_sto]);
        r[n].err = atof(f[c_err]);
        n++;
    }
    assert_int_equal(pclose(p), 0);
    return n;
}

/* The run of (trace, policy, codec, budget); budget < 0: any. */
static const run_row *find_run(const run_row *r, int n, const char *trace, const char *policy, const char *codec,
                               int64_t budget) {
    for (int i = 0; i < n; i++)
        if (!strcmp(r[i].trace, trace) && !strcmp(r[i].policy, policy) && !strcmp(r[i].codec, codec) &&
            (budget < 0 || r[i].budget == budget))
            return &r[i];
    return NULL;
}

/* A model's prompt traces and runs, read once for every test of the file. */
typedef struct {
    trace_dims t[MAX_TRACES];
    run_row r[MAX_RUNS];
    int nt, nr;
    char c1[64]; /* the tables' first cell: "MODEL (traces)" */
} model_data;

static const model_data *model_data_of(int m) {
    static model_data md[2];
    static int loaded[2];
    if (!loaded[m]) {
        md[m].nt = prompt_traces(k_models[m], md[m].t);
        md[m].nr = read_runs(k_models[m], md[m].r);
        snprintf(md[m].c1, sizeof md[m].c1, "%s (%d)", k_models[m], md[m].nt);
        loaded[m] = 1;
    }
    return &md[m];
}

/* ---- the byte rules (sim/codec.h), per (layer, KV head), at decode step n (positions 0..n-1 resident) ------- */

static int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }

/* A full cache at step n under codec c; d = head_dim, P = the prompt. */
static double full_bytes_at(codec_id c, int64_t n, int64_t P, int64_t d) {
    double row16 = 2.0 * (double)d; /* one K or V row in 16 bits */
    switch (c) {
    case C_NONE: return 2 * row16 * (double)n;
    case C_I4: /* channel axis: every row quantized (q(n) = n); one group of min(32, d) = d channels per row */
    case C_I2: {
        int bits = c == C_I4 ? 4 : 2;
        return 2.0 * (double)n * ((double)d * bits / 8.0 + 4.0);
    }
    case C_KIVI:
    case C_KIVI32: {
        int64_t R = c == C_KIVI ? 128 : 32;
        int64_t qk = R * ((n - 1) / R);    /* keys: token-axis groups of 32 positions per channel */
        int64_t qv = imax(0, n - 1 - R);   /* values: per token */
        double k = (double)qk * (double)d * 2.0 / 8.0 + (double)(qk / 32) * (double)d * 4.0 + (double)(n - qk) * row16;
        double v = (double)qv * ((double)d * 2.0 / 8.0 + 4.0) + (double)(n - qv) * row16;
        return k + v;
    }
    case C_HF: { /* one group of min(64, d) = d channels per row, both K and V; residual 128 after the prompt */
        int64_t q = P + 128 * ((n - 1 - P) / 128);
        return 2.0 * ((double)q * ((double)d * 4.0 / 8.0 + 4.0) + (double)(n - q) * row16);
    }
    case C_FP8: return 2.0 * (double)d * (double)n; /* one byte per element; a numeric scale costs nothing */
    case C_THINK: {
        int64_t kept = d - (int64_t)floor(0.4 * (double)d);
        int64_t pruned = imax(0, P - 32); /* prompt rows before the last `recent` */
        double k = (double)pruned * 2.0 * (double)kept + (double)(n - pruned) * row16 + (pruned > 0 ? (double)d : 0);
        return k + (double)n * row16;
    }
    default: fail(); return 0;
    }
}

/* Mean over the decode steps (query positions P..N-1, so n = P+1..N) of a full cache's bytes. */
static double full_bytes(codec_id c, const trace_dims *t) {
    double s = 0;
    for (int64_t n = t->P + 1; n <= t->N; n++) s += full_bytes_at(c, n, t->P, t->d);
    return s / (double)(t->N - t->P);
}

/* A window of B positions: min(B, n) rows, 16-bit (c = C_NONE) or int4 per-token (C_I4). */
static double window_bytes(codec_id c, const trace_dims *t, int64_t B) {
    double s = 0;
    for (int64_t n = t->P + 1; n <= t->N; n++) s += full_bytes_at(c, n < B ? n : B, t->P, t->d);
    return s / (double)(t->N - t->P);
}

/* A window series' error at X bytes on one trace: linear in log bytes between its runs around X (bytes from the
 * rule); NAN when X is outside its runs. */
static double window_err_at(const run_row *r, int n, const trace_dims *t, codec_id c, double X) {
    double xl = -1, xh = -1, el = 0, eh = 0;
    for (int i = 0; i < n; i++) {
        if (strcmp(r[i].trace, t->path) || strcmp(r[i].policy, "window") || strcmp(r[i].codec, k_spec[c])) continue;
        double x = window_bytes(c, t, r[i].budget);
        assert_true(fabs(x - r[i].bytes) <= 1e-9 * x); /* the database counts what the rule counts */
        if (x <= X && x > xl) xl = x, el = r[i].err;
        if (x >= X && (xh < 0 || x < xh)) xh = x, eh = r[i].err;
    }
    if (xl < 0 || xh < 0) return NAN;
    if (xh == xl) return el;
    double w = (log(X) - log(xl)) / (log(xh) - log(xl));
    return el + w * (eh - el);
}

/* ---- the blocks' text ---------------------------------------------------------------------------------------- */

/* The leading number of cell `col` (0 = the first) of the row of `text` whose first cells are `c1` and `c2`. */
static double row_num(const char *text, const char *c1, const char *c2, int col) {
    char cell[256];
    if (kvs_test_block_cell(text, c1, c2, KVS_TEST_CELL_EXACT, col, cell, sizeof cell) != 1)
        fail_msg("no row '%s' / '%s' with a cell %d", c1, c2, col);
    char *end;
    double v = strtod(cell, &end);
    if (end == cell) fail_msg("cell '%s' of '%s' / '%s' is not a number", cell, c1, c2);
    return v;
}

/* `printed` is `value` with 3 significant figures (%.3g). */
static void assert_printed(double printed, double value) {
    if (!kvs_test_sig_equal(printed, value, 3)) fail_msg("printed %.6g, recomputed %.6g", printed, value);
}

/* ---- Q-1 ------------------------------------------------------------------------------------------------------ */

static void test_full_cache_bytes_follow_the_byte_rules(void **state) {
    (void)state;
    char *q1 = block("Q-1");
    for (int m = 0; m < 2; m++) {
        const model_data *md = model_data_of(m);
        for (int c = 0; c < N_CODECS; c++) {
            double kib = 0, ratio = 0;
            for (int i = 0; i < md->nt; i++) {
                const run_row *run = find_run(md->r, md->nr, md->t[i].path, "full", k_spec[c], -1);
                assert_non_null(run);
                double want = full_bytes((codec_id)c, &md->t[i]);
                if (fabs(run->bytes - want) > 1e-9 * want)
                    fail_msg("%s %s: storage %.10g, the rule %.10g", md->t[i].path, k_spec[c], run->bytes, want);
                kib += want / 1024.0 / md->nt;
                ratio += want / full_bytes(C_NONE, &md->t[i]) / md->nt;
            }
            /* columns: 0 model, 1 representation, 2 KiB, 3 ratio, 4 err */
            assert_printed(row_num(q1, md->c1, k_name[c], 2), kib);
            assert_printed(row_num(q1, md->c1, k_name[c], 3), ratio);
        }
    }
    free(q1);
}

/* ---- the window by hand, TOVA through compare --per-trace ------------------------------------------------ */

/* TOVA's error at X bytes on trace `path`, from kvsim compare --per-trace --csv; NAN when it has none. */
static double tova_at(const char *model, const char *path, double X) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "'%s' compare '%s/codecs_%s.db' --match mem --at %.17g --trace '%s' --per-trace --csv --policy tova "
             "--metric out_err_mean",
             getenv("KVSIM_BIN"), section(), model, X, path);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    static char line[1 << 14];
    char *f[64];
    int c_err = -1, c_codec = -1;
    double v = NAN;
    for (int row = 0; fgets(line, sizeof line, p); row++) {
        int nf = kvs_test_csv_fields(line, f, 64);
        if (row == 0) {
            c_err = kvs_test_csv_col(f, nf, "out_err_mean"), c_codec = kvs_test_csv_col(f, nf, "codec");
            assert_true(c_err >= 0 && c_codec >= 0);
        } else if (nf > c_err && !f[c_codec][0] && f[c_err][0]) v = atof(f[c_err]);
    }
    assert_int_equal(pclose(p), 0);
    return v;
}

static void test_eviction_at_each_codec_bytes_recomputed(void **state) {
    (void)state;
    char *q2 = block("Q-2"), *q2p = block("Q-2-pairs");
    for (int m = 0; m < 2; m++) {
        const model_data *md = model_data_of(m);
        for (int c = C_I4; c < N_CODECS; c++) {
            double own = 0, win = 0, dwin = 0, tova = 0, dtova = 0;
            int n_win = 0, n_tova = 0;
            for (int i = 0; i < md->nt; i++) {
                const run_row *run = find_run(md->r, md->nr, md->t[i].path, "full", k_spec[c], -1);
                assert_non_null(run);
                double X = full_bytes((codec_id)c, &md->t[i]);
                own += run->err / md->nt;
                double w = window_err_at(md->r, md->nr, &md->t[i], C_NONE, X);
                assert_false(isnan(w)); /* a window series spans 32 tokens to the full cache */
                win += w, dwin += run->err - w, n_win++;
                double v = tova_at(k_models[m], md->t[i].path, run->bytes);
                if (!isnan(v)) tova += v, dtova += run->err - v, n_tova++;
            }
            /* Q-2 columns: 0 model, 1 level, 2 its err, 3 window, 4 StreamingLLM, 5 H2O, 6 TOVA, 7 SnapKV */
            assert_printed(row_num(q2, md->c1, k_name[c], 2), own);
            assert_printed(row_num(q2, md->c1, k_name[c], 3), win / n_win);
            assert_true(n_tova > 0);
            assert_printed(row_num(q2, md->c1, k_name[c], 6), tova / n_tova);
            /* Q-2-pairs: 0 model (no count), 1 level, 2 − window, ..., 5 − TOVA: the mean of the differences */
            assert_printed(row_num(q2p, k_models[m], k_name[c], 2), dwin / n_win);
            assert_printed(row_num(q2p, k_models[m], k_name[c], 5), dtova / n_tova);
        }
    }
    free(q2);
    free(q2p);
}

/* ---- the 16-bit and the 4-bit window --------------------------------------------------------------- */

/* The number after `key` on the line of `text` that starts with `start`. */
static double after(const char *text, const char *start, const char *key) {
    double v = 0;
    if (!kvs_test_block_after(text, start, key, &v)) fail_msg("no line '%s' ... '%s'", start, key);
    return v;
}

static void test_windows_at_fixed_bytes_and_nominal_size_recomputed(void **state) {
    (void)state;
    char *q3 = block("Q-3"), *q4 = block("Q-4");
    for (int m = 0; m < 2; m++) {
        const model_data *md = model_data_of(m);
        /* Q-3 at 2 and 4 KiB: columns 0 model, 1 policy, 2 at 2 KiB, 3 at 4 KiB */
        for (int k = 0; k < 2; k++) {
            double X = 2048.0 * (k + 1), w16 = 0, w4 = 0, d = 0;
            int n16 = 0, n4 = 0, nd = 0;
            for (int i = 0; i < md->nt; i++) {
                double a = window_err_at(md->r, md->nr, &md->t[i], C_NONE, X);
                double b = window_err_at(md->r, md->nr, &md->t[i], C_I4, X);
                if (!isnan(a)) w16 += a, n16++;
                if (!isnan(b)) w4 += b, n4++;
                if (!isnan(a) && !isnan(b)) d += b - a, nd++;
            }
            assert_true(n16 == md->nt && n4 == md->nt); /* both in range on every trace at 2 and 4 KiB */
            assert_printed(row_num(q3, md->c1, "window", 2 + k), w16 / n16);
            assert_printed(row_num(q3, md->c1, "window, int4 per-token", 2 + k), w4 / n4);
            char start[64];
            snprintf(start, sizeof start, "- %s at %dKiB: ", k_models[m], 2 * (k + 1));
            assert_printed(after(q3, start, "window, int4 − window = "), d / nd);
        }
        /* a 4-bit window of 4B against a 16-bit window of B, B = 32 (4B = 128 < N on every trace) */
        double ratio = 0, ea = 0, eb = 0;
        for (int i = 0; i < md->nt; i++) {
            const run_row *a = find_run(md->r, md->nr, md->t[i].path, "window", k_spec[C_I4], 128);
            const run_row *b = find_run(md->r, md->nr, md->t[i].path, "window", "", 32);
            assert_true(a && b);
            ratio += window_bytes(C_I4, &md->t[i], 128) / window_bytes(C_NONE, &md->t[i], 32) / md->nt;
            ea += a->err / md->nt, eb += b->err / md->nt;
        }
        const char *row = "window of 128 in int4 per-token − 16-bit window of 32";
        /* columns: 0 model, 1 comparison, 2 ratio, 3 first, 4 second, 5 first − second */
        assert_printed(row_num(q4, md->c1, row, 2), ratio);
        assert_printed(row_num(q4, md->c1, row, 3), ea);
        assert_printed(row_num(q4, md->c1, row, 4), eb);
        assert_printed(row_num(q4, md->c1, row, 5), ea - eb);
        /* nominal bits equal, bytes not: (d/2 + 4) x 2 bytes a row against 4d, times four rows */
        double d = (double)md->t[0].d;
        assert_true(fabs(ratio - 4.0 * 2.0 * (d / 2.0 + 4.0) / (4.0 * d)) < 0.02);
    }
    free(q3);
    free(q4);
}

/* ---- resolved exactly when the printed interval excludes 0 ------------------------------------------------------- */

static int check_resolved(const char *text) {
    int n = 0;
    for (const char *p = strstr(text, "resolved"); p; p = strstr(p + 1, "resolved")) {
        int not_ = p - text >= 4 && !strncmp(p - 4, "not ", 4);
        if (not_ && strncmp(p - 4, "not resolved", 12) != 0) continue;
        /* the interval: the last "[lo, hi]" before this word on its line */
        const char *bol = p;
        while (bol > text && bol[-1] != '\n') bol--;
        if (*bol != '|' && *bol != '-') continue; /* prose ("resolved when ..."), not a judgement */
        const char *br = NULL;
        for (const char *q = bol; q < p; q++)
            if (*q == '[') br = q;
        const char *prev = NULL; /* the previous judgement on the line: the interval must follow it */
        for (const char *q = strstr(bol, "resolved"); q && q < p - (not_ ? 4 : 0); q = strstr(q + 1, "resolved")) prev = q;
        if (!br || (prev && br < prev)) {
            /* n = 1: no interval, never resolved */
            assert_true(not_);
            n++;
            continue;
        }
        double lo = strtod(br + 1, NULL);
        const char *comma = strchr(br, ',');
        assert_non_null(comma);
        double hi = strtod(comma + 1, NULL);
        int excludes = lo > 0 || hi < 0;
        if (excludes == not_) fail_msg("'%.60s': [%g, %g] and %s", bol, lo, hi, not_ ? "not resolved" : "resolved");
        n++;
    }
    return n;
}

static void test_resolved_exactly_when_the_interval_excludes_zero(void **state) {
    (void)state;
    (void)section();
    const char *names[] = {"Q-2-pairs", "Q-3", "Q-4"};
    int n = 0;
    for (int i = 0; i < 3; i++) {
        char *s = block(names[i]);
        n += check_resolved(s);
        free(s);
    }
    assert_true(n >= 50); /* 70 cells of Q-2-pairs less those without a value, 24 lines of Q-3, 16 rows of Q-4 */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full_cache_bytes_follow_the_byte_rules),
        cmocka_unit_test(test_eviction_at_each_codec_bytes_recomputed),
        cmocka_unit_test(test_windows_at_fixed_bytes_and_nominal_size_recomputed),
        cmocka_unit_test(test_resolved_exactly_when_the_interval_excludes_zero),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
