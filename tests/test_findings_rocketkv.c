/* test_findings_rocketkv.c — the RocketKV section of examples/FINDINGS.md (examples/findings/rocketkv.sh; POLICY_SPEC
 * §5.2): runs `findings.sh --only rocketkv` on the shared models once and recomputes every kind of number its
 * generated blocks print another way:
 *  - by token budget: the mean over the traces of each run's out_err_mean (and traffic_bytes_mean /
 *    (2 d 2 t), KV pairs read per step over t) from `kvsim runs --csv --summary`, d from `kvsim info`;
 *  - R-1's count of prompts whose stage 1 keeps the whole prompt: the runs' own notes;
 *  - R-1-pairs and R-4-pairs: each paired difference over every trace equals the difference of the two means of
 *    the equal-traffic table, and "resolved" is said exactly when the printed interval excludes 0;
 *  - the top-16 union statistics from `kvsim attn --csv` of each prompt trace;
 *  - R-arith: R1, R2, R6 and R7 through the policy's own derivation (policies/rocketkv_internal.h) and the
 *    configuration arithmetic.
 * Skips without $KVSIM_BIN or the shared models, and under the sanitizers (a study script: the commands it calls
 * have their own tests there).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../policies/rocketkv_internal.h"
#include "tests/util/findings_blocks.h"
#include "tests/util/testenv.h"

#define MAX_CELLS 16
#define MINUS "\xe2\x88\x92" /* the blocks' "−" (U+2212) between the two sides of a difference */

static const char *const models[] = {"stories260K", "tinystories-656K"};

/* The section's $OUT, the script run once for the whole file; skips when it cannot run here. */
static const char *section(void) {
    const char *out = NULL;
    if (kvs_test_findings_once("rocketkv", &out) == 0) skip();
    if (!out) fail_msg("findings.sh --check --only rocketkv failed");
    return out;
}

/* ---- reading the blocks ---------------------------------------------------------------------------------- */

typedef kvs_test_iv iv;

/* A cell "m [lo, hi]" with an optional " (n = K of N)": 1 and the numbers (n_of = K, 0 when every trace has a
 * value), or 0 for "-", "- (out of range on N)" and "not run". */
static int parse_iv(const char *cell, iv *v) { return kvs_test_parse_iv(cell, v) == 3; }

/* Agreement to the 3 significant figures the blocks print (%.3g) of a value recomputed to full precision. */
static int close3(double printed, double exact) {
    if (exact == 0) return fabs(printed) < 1e-12;
    double unit = pow(10.0, floor(log10(fabs(exact))) - 2);
    return fabs(printed - exact) <= 0.5 * unit * 1.0001 + 1e-12;
}

/* The policy a row label names (the script's rk_label). */
static const char *policy_of(const char *label) {
    static const struct {
        const char *label, *policy;
    } map[] = {{"Exact-TopK (oracle)", "topk"}, {"RocketKV-MT", "rocketkv_mt"}, {"RocketKV", "rocketkv"},
               {"HSA", "hsa"},
               {"Quest (`fill=tokens`)", "quest"},
               {"SparQ", "sparq"},
               {"H2O", "h2o"},
               {"TOVA", "tova"},
               {"window", "window"},
               {"StreamingLLM", "streaming"}};
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (!strcmp(label, map[i].label)) return map[i].policy;
    fail_msg("unknown row label '%s'", label);
    return NULL;
}

static char *read_block(const char *name) {
    char *text = kvs_test_findings_block(section(), name);
    if (!text) fail_msg("block %s not written (in %s/blocks)", name, section());
    return text;
}

/* ---- recomputing from kvsim's own tables ------------------------------------------------------------------- */

/* Runs `kvsim ARGS` with its standard output in FILE (under the output folder); fails the test on an error. */
static void kvsim_to(const char *file, const char *args) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' %s > '%s/%s'", getenv("KVSIM_BIN"), args, section(), file);
    if (system(cmd) != 0) fail_msg("%s failed", cmd);
}

/* One run-wide row of `kvsim runs DB --csv --summary`. */
typedef struct {
    char policy[32];
    int budget;
    double out_err, traffic;
    int stage1_keeps_all; /* its notes say stage 1 keeps the whole prompt */
} run_row;

/* Every complete run of DB (under the output folder); *n their count. Caller frees. */
static run_row *read_runs(const char *db, int *n) {
    char args[512], file[128];
    snprintf(args, sizeof args, "runs '%s/%s' --csv --summary", section(), db);
    snprintf(file, sizeof file, "%s.runs.csv", db);
    kvsim_to(file, args);
    char path[512];
    snprintf(path, sizeof path, "%s/%s", section(), file);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    static char line[65536];
    char *fields[512];
    assert_non_null(fgets(line, sizeof line, f));
    int nf = kvs_test_csv_fields(line, fields, 512);
    int c_pol = kvs_test_csv_col(fields, nf, "policy"), c_b = kvs_test_csv_col(fields, nf, "budget_tokens");
    int c_err = kvs_test_csv_col(fields, nf, "out_err_mean"), c_tr = kvs_test_csv_col(fields, nf, "traffic_bytes_mean");
    int c_notes = kvs_test_csv_col(fields, nf, "notes");
    assert_true(c_pol >= 0 && c_b >= 0 && c_err >= 0 && c_tr >= 0 && c_notes >= 0);
    int cap = 64;
    run_row *rows = malloc(sizeof *rows * (size_t)cap);
    assert_non_null(rows);
    *n = 0;
    while (fgets(line, sizeof line, f)) {
        if (kvs_test_csv_fields(line, fields, 512) <= c_notes) continue;
        if (*n == cap) {
            cap *= 2;
            rows = realloc(rows, sizeof *rows * (size_t)cap);
            assert_non_null(rows);
        }
        run_row *r = &rows[(*n)++];
        snprintf(r->policy, sizeof r->policy, "%s", fields[c_pol]);
        r->budget = atoi(fields[c_b]);
        r->out_err = strtod(fields[c_err], NULL);
        r->traffic = strtod(fields[c_tr], NULL);
        r->stage1_keeps_all = strstr(fields[c_notes], "stage 1 keeps the whole") != NULL;
    }
    fclose(f);
    return rows;
}

/* The head_dim of the model of the first trace under DIR (`kvsim info`). */
static int head_dim_of(const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", section(), dir);
    DIR *d = opendir(path);
    assert_non_null(d);
    struct dirent *e;
    char trace[1024] = "";
    while ((e = readdir(d)))
        if (strstr(e->d_name, ".kvt")) {
            snprintf(trace, sizeof trace, "%s/%s", path, e->d_name);
            break;
        }
    closedir(d);
    assert_true(trace[0]);
    char args[1200];
    snprintf(args, sizeof args, "info '%s'", trace);
    kvsim_to("info.txt", args);
    snprintf(path, sizeof path, "%s/info.txt", section());
    char *text = kvs_test_slurp(path, NULL);
    assert_non_null(text);
    const char *h = strstr(text, "head_dim ");
    assert_non_null(h);
    int hd = atoi(h + strlen("head_dim "));
    free(text);
    return hd;
}

/* Checks every cell of a by-budget table (columns "t = B") against the mean over the runs of the model's database:
 * out_err_mean, or with `pairs_per_t` traffic_bytes_mean / (4 d t). Returns the cells checked. */
static int check_budget_table(const char *block, const char *db_prefix, int pairs_per_t) {
    char *text = read_block(block);
    int budgets[MAX_CELLS], nb = 0, checked = 0;
    char *save = NULL;
    run_row *runs[2] = {NULL, NULL};
    int n_runs[2] = {0, 0}, d[2] = {0, 0};
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *cells[MAX_CELLS];
        int nc = kvs_test_row_cells(line, cells, MAX_CELLS);
        if (nc < 3) continue;
        if (!strcmp(cells[0], "model (traces)")) {
            nb = 0;
            for (int i = 2; i < nc; i++) {
                const char *t = strstr(cells[i], "t = ");
                assert_non_null(t);
                budgets[nb++] = atoi(t + 4);
            }
            continue;
        }
        int m = strncmp(cells[0], "stories260K ", 12) == 0 ? 0 : 1;
        assert_true(m == 0 || !strncmp(cells[0], "tinystories-656K ", 17));
        int total = atoi(strchr(cells[0], '(') + 1);
        if (!runs[m]) {
            char db[128];
            snprintf(db, sizeof db, "%s_%s.db", db_prefix, models[m]);
            runs[m] = read_runs(db, &n_runs[m]);
            char dir[128];
            snprintf(dir, sizeof dir, "%s/%s", strcmp(db_prefix, "rocketkv") ? "turns" : "prompts", models[m]);
            d[m] = head_dim_of(dir);
        }
        const char *pol = policy_of(cells[1]);
        for (int b = 0; b < nb && 2 + b < nc; b++) {
            double sum = 0;
            int n = 0;
            for (int i = 0; i < n_runs[m]; i++) {
                const run_row *r = &runs[m][i];
                if (strcmp(r->policy, pol) || r->budget != budgets[b]) continue;
                sum += pairs_per_t ? r->traffic / (4.0 * d[m] * budgets[b]) : r->out_err;
                n++;
            }
            iv v;
            if (!parse_iv(cells[2 + b], &v)) {
                /* only the run the script leaves out, SparQ at t = 128, has no value */
                if (n != 0 || strcmp(pol, "sparq") || strcmp(cells[2 + b], "not run"))
                    fail_msg("%s %s %s t=%d: '%s' with %d runs", block, models[m], pol, budgets[b], cells[2 + b], n);
                continue;
            }
            if (n != total || v.n_of != 0)
                fail_msg("%s %s %s t=%d: %d runs for %d traces", block, models[m], pol, budgets[b], n, total);
            if (!close3(v.mean, sum / n))
                fail_msg("%s %s %s t=%d: printed %g, the runs' mean %.6g", block, models[m], pol, budgets[b], v.mean,
                         sum / n);
            assert_true(v.lo <= v.mean && v.mean <= v.hi);
            checked++;
        }
    }
    free(runs[0]);
    free(runs[1]);
    free(text);
    return checked;
}

static void test_budget_tables_are_the_mean_of_the_runs(void **state) {
    (void)state;
    (void)section();
    /* 9 policies x 4 budgets x 2 models, SparQ's t = 128 left out */
    assert_int_equal(check_budget_table("R-1", "rocketkv", 0), 9 * 4 * 2 - 2);
    assert_int_equal(check_budget_table("R-3", "rocketkv", 1), 5 * 4 * 2 - 2);
    assert_int_equal(check_budget_table("R-4", "rocketkv_mt", 0), 5 * 3 * 2);
}

/* R-1's "stage 1 keeps the whole prompt on K of N prompts at t = 16" against the runs' notes. */
static void test_stage1_count_is_the_runs_notes(void **state) {
    (void)state;
    (void)section();
    char *text = read_block("R-1");
    for (int m = 0; m < 2; m++) {
        char db[128], want[256];
        snprintf(db, sizeof db, "rocketkv_%s.db", models[m]);
        int n = 0, kept = 0, runs = 0;
        run_row *rows = read_runs(db, &n);
        for (int i = 0; i < n; i++)
            if (!strcmp(rows[i].policy, "rocketkv") && rows[i].budget == 16) kept += rows[i].stage1_keeps_all, runs++;
        free(rows);
        snprintf(want, sizeof want, "- %s: stage 1 keeps the whole prompt (RocketKV is HSA alone) on %d of %d prompts", models[m],
                 kept, runs);
        if (!strstr(text, want)) fail_msg("R-1 lacks '%s'", want);
    }
    free(text);
}

/* A pair table's cells against the equal-traffic table of the same levels: the difference over every trace is the
 * difference of the means, and "resolved" means the interval excludes 0. Returns the cells checked. */
static int check_pairs(const char *pairs_block, const char *table_block) {
    char *table = read_block(table_block), *pairs = read_block(pairs_block);
    /* the equal-traffic table's means: [model][row][level] */
    char labels[2][16][64];
    iv vals[2][16][4];
    int n_rows[2] = {0, 0}, total[2] = {0, 0};
    char *save = NULL;
    for (char *line = strtok_r(table, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *cells[MAX_CELLS];
        int nc = kvs_test_row_cells(line, cells, MAX_CELLS);
        if (nc < 4 || !strcmp(cells[0], "model (traces)")) continue;
        int m = strncmp(cells[0], "stories260K ", 12) == 0 ? 0 : 1;
        total[m] = atoi(strchr(cells[0], '(') + 1);
        int r = n_rows[m]++;
        assert_true(r < 16);
        snprintf(labels[m][r], sizeof labels[m][r], "%s", cells[1]);
        for (int l = 0; l < 2; l++)
            if (!parse_iv(cells[2 + l], &vals[m][r][l])) vals[m][r][l].n_of = -1; /* no value */
    }
    int checked = 0;
    save = NULL;
    for (char *line = strtok_r(pairs, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *cells[MAX_CELLS];
        int nc = kvs_test_row_cells(line, cells, MAX_CELLS);
        if (nc < 4 || !strcmp(cells[0], "model (traces)")) continue;
        int m = strncmp(cells[0], "stories260K ", 12) == 0 ? 0 : 1;
        char *minus = strstr(cells[1], " " MINUS " ");
        assert_non_null(minus);
        *minus = '\0';
        const char *a = cells[1], *b = minus + strlen(" " MINUS " ");
        int ra = -1, rb = -1;
        for (int r = 0; r < n_rows[m]; r++) {
            if (!strcmp(labels[m][r], a)) ra = r;
            if (!strcmp(labels[m][r], b)) rb = r;
        }
        if (ra < 0 || rb < 0) fail_msg("%s: '%s' or '%s' not in %s", pairs_block, a, b, table_block);
        for (int l = 0; l < 2; l++) {
            double diff, lo, hi;
            int n;
            if (!strcmp(cells[2 + l], "-")) {
                assert_true(vals[m][ra][l].n_of == -1 || vals[m][rb][l].n_of == -1); /* one side has no value */
                continue;
            }
            if (sscanf(cells[2 + l], "%lf [%lf, %lf] (n = %d)", &diff, &lo, &hi, &n) != 4)
                fail_msg("%s: cell '%s'", pairs_block, cells[2 + l]);
            int resolved = strstr(cells[2 + l], "), resolved") != NULL;
            if (!resolved && !strstr(cells[2 + l], "), not resolved")) fail_msg("%s: cell '%s'", pairs_block, cells[2 + l]);
            if (resolved != (lo > 0 || hi < 0)) fail_msg("%s: '%s' says %s", pairs_block, cells[2 + l], resolved ? "resolved" : "not resolved");
            assert_true(lo <= diff && diff <= hi);
            const iv *va = &vals[m][ra][l], *vb = &vals[m][rb][l];
            if (n != total[m] || va->n_of != 0 || vb->n_of != 0) continue; /* over fewer traces than the means */
            /* |printed diff - (a - b)| within the three printed roundings */
            double tol = 0;
            const double xs[3] = {diff, va->mean, vb->mean};
            for (int i = 0; i < 3; i++) tol += xs[i] == 0 ? 0 : 0.5 * pow(10.0, floor(log10(fabs(xs[i]))) - 2) * 1.0001;
            if (fabs(diff - (va->mean - vb->mean)) > tol + 1e-12)
                fail_msg("%s %s %s − %s level %d: %g, the means differ by %g", pairs_block, models[m], a, b, l, diff,
                         va->mean - vb->mean);
            checked++;
        }
    }
    free(table);
    free(pairs);
    return checked;
}

static void test_pairs_match_the_tables_and_their_intervals(void **state) {
    (void)state;
    (void)section();
    assert_true(check_pairs("R-1-pairs", "R-1-traffic") >= 20);
    assert_true(check_pairs("R-4-pairs", "R-4-traffic") >= 12);
}

/* R-2 from `kvsim attn --csv` of every prompt trace. */
static void test_union_is_recomputed_from_attn(void **state) {
    (void)state;
    (void)section();
    char *text = read_block("R-2");
    for (int m = 0; m < 2; m++) {
        char dir[512];
        snprintf(dir, sizeof dir, "%s/prompts/%s", section(), models[m]);
        DIR *dp = opendir(dir);
        assert_non_null(dp);
        struct dirent *e;
        double s_uk = 0, s_us = 0, s_last = 0;
        int n_traces = 0, steps = -1, k = -1;
        while ((e = readdir(dp))) {
            if (!strstr(e->d_name, ".kvt")) continue;
            char args[1200];
            snprintf(args, sizeof args, "attn '%s/%s' --k 16 --csv", dir, e->d_name);
            kvsim_to("attn.csv", args);
            char path[512];
            snprintf(path, sizeof path, "%s/attn.csv", section());
            FILE *f = fopen(path, "r");
            assert_non_null(f);
            char line[512];
            assert_non_null(fgets(line, sizeof line, f));
            assert_string_equal(line, "layer,q_head,colsum_var,k,union,steps,max_len\n");
            int layer, head, kk, u, st, len, last = -1, rows = 0, rows_last = 0;
            double var, uk = 0, us = 0, ul = 0;
            /* two passes: the last layer is the largest index */
            long start = ftell(f);
            while (fscanf(f, "%d,%d,%lf,%d,%d,%d,%d\n", &layer, &head, &var, &kk, &u, &st, &len) == 7)
                if (layer > last) last = layer;
            fseek(f, start, SEEK_SET);
            while (fscanf(f, "%d,%d,%lf,%d,%d,%d,%d\n", &layer, &head, &var, &kk, &u, &st, &len) == 7) {
                uk += (double)u / kk;
                us += (double)u / len;
                rows++;
                if (layer == last) ul += (double)u / kk, rows_last++;
                steps = st;
                k = kk;
            }
            fclose(f);
            assert_true(rows > 0 && rows_last > 0);
            s_uk += uk / rows;
            s_us += us / rows;
            s_last += ul / rows_last;
            n_traces++;
        }
        closedir(dp);
        assert_int_equal(n_traces, 7);
        char prefix[64];
        snprintf(prefix, sizeof prefix, "| %s (%d) | %d | ", models[m], n_traces, steps);
        char *row = strstr(text, prefix);
        if (!row) fail_msg("R-2 has no row '%s'", prefix);
        char copy[1024];
        snprintf(copy, sizeof copy, "%.*s", (int)strcspn(row, "\n"), row);
        char *cells[MAX_CELLS];
        assert_int_equal(kvs_test_row_cells(copy, cells, MAX_CELLS), 6);
        iv v;
        assert_true(parse_iv(cells[2], &v) && close3(v.mean, s_uk / n_traces));
        assert_true(parse_iv(cells[3], &v) && close3(v.mean, s_us / n_traces));
        assert_true(parse_iv(cells[4], &v) && close3(v.mean, s_last / n_traces));
        assert_true(close3(atof(cells[5]), (double)(k + steps - 1) / k));
    }
    free(text);
}

/* R1, R2, R6 and R7 through kvsim's own derivation and the configuration's product. */
static void test_arithmetic_is_the_policy_derivation(void **state) {
    (void)state;
    (void)section();
    char *text = read_block("R-arith");
    char want[256];
    kvs_rocketkv_params p;
    /* R1: NIAH's 109,000-token prompt at t = 256 (G2's derivation row) */
    kvs_rocketkv_derive(109000, 256, 32, 128, -1, KVS_ROCKETKV_PIPELINE, &p);
    snprintf(want, sizeof want, "109,000 / 256 = %.1f ", p.c);
    if (!strstr(text, want)) fail_msg("R-arith lacks '%s'", want);
    /* R2: 2 x layers x KV heads x head_dim x fp16 bytes x context x batch, twice (kvsim plan and the product) */
    double kv = 2.0 * 80 * 8 * 128 * 2 * 32768 * 32;
    snprintf(want, sizeof want, "%.0f B = %.1f GB = %.1f GiB", kv, kv / 1e9, kv / 1073741824.0);
    if (!strstr(text, want)) fail_msg("R-arith lacks '%s'", want);
    snprintf(want, sizeof want, "× 32,768 × 32 = %.0f B.", kv);
    if (!strstr(text, want)) fail_msg("R-arith lacks '%s'", want);
    /* R6/R7 at c = 64 (S = 64 t: the floor does not bind) */
    kvs_rocketkv_derive(131072, 2048, 128, 128, -1, KVS_ROCKETKV_PIPELINE, &p);
    assert_true(p.c == 64);
    double st, mt, tr;
    kvs_rocketkv_table1(p.c, p.r, &st, &mt, &tr);
    snprintf(want, sizeof want, "0.8) = %.2f; stage 1 c^r = %.3f, stage 2 c^(1−r) = %.3f; ", kvs_rocketkv_split(64),
             pow(p.c, p.r), p.c2);
    if (!strstr(text, want)) fail_msg("R-arith lacks '%s'", want);
    snprintf(want, sizeof want, "= ⌈%.4f⌉ = %lld; head dimension c^(1−r) / page = %.3f; ", pow(p.c, (1 - p.r) / 2),
             (long long)p.page, p.c2 / (double)p.page);
    if (!strstr(text, want)) fail_msg("R-arith lacks '%s'", want);
    snprintf(want, sizeof want, "= %.5f (RocketKV-MT %.5f), traffic 1/c = %.6f.", st, mt, tr);
    if (!strstr(text, want)) fail_msg("R-arith lacks '%s'", want);
    free(text);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_budget_tables_are_the_mean_of_the_runs),
        cmocka_unit_test(test_stage1_count_is_the_runs_notes),
        cmocka_unit_test(test_pairs_match_the_tables_and_their_intervals),
        cmocka_unit_test(test_union_is_recomputed_from_attn),
        cmocka_unit_test(test_arithmetic_is_the_policy_derivation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
