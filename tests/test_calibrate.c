/* test_calibrate.c — `kvsim calibrate` (results/calibrate.h, cli/cmd_calibrate.c) on results databases written by
 * hand through the results API (replay runs with chosen aggregates and series, teacher-forced closed-loop runs with
 * chosen KL, top-1 agreement and perplexities), every printed figure recomputed here another way: Spearman's rho from
 * hand-given ranks (1 - 6 sum d^2 / (n (n^2 - 1)) where no value ties) or from ranks counted here, the collapsed
 * configurations counted by hand, the bootstrap interval against the exact distribution of every resample of the
 * policies and traces enumerated, the seed from its documented identity string. Then examples/closed_loop.sh on the
 * real models (skipped without them): several prompts of both models, the budgets each trace can hold, the
 * within-budget tables.
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
#include "tests/util/testenv.h"

#include <sqlite3.h>

#include "common/kvs.h"
#include "results/calibrate.h"
#include "results/results.h"
#include "results/results_closed.h"
#include "results/results_sweep.h"

/* |a - b| <= eps, both values printed when not. */
#define assert_near(a, b, eps)                                                                                \
    do {                                                                                                      \
        double a_ = (a), b_ = (b);                                                                            \
        if (!(fabs(a_ - b_) <= (eps))) fail_msg("%s = %.17g, want %.17g (+- %g)", #a, a_, b_, (double)(eps)); \
    } while (0)

/* ---- a hand-made database ----------------------------------------------------------------------------------- */

/* One configuration on one trace: the replay's run-wide numbers and the closed loop's. */
typedef struct {
    const char *policy;
    int64_t budget;
    double err, p95, recall; /* replay: out_err mean, out_err p95, attn_recall mean */
    double kl, top1, dppl;   /* closed loop: kl_mean, top1_agree, ppl_policy - ppl_full */
    double storage;          /* replay: storage_bytes mean */
    const char *scope;       /* NULL: every_step */
    const char *notes;       /* the replay's note, or NULL */
    int series;              /* 0: no per-step series; k > 0: the out_err series of variant k */
} cfg;

typedef struct {
    kvs_results_db *db;
    kvs_results_trace tr;
    char path[160], sha[65];
    const char *model;
} trace_w;

static void trace_open(trace_w *t, kvs_results_db *db, const char *dir, const char *model, int k) {
    memset(t, 0, sizeof *t);
    t->db = db;
    t->model = model;
    snprintf(t->path, sizeof t->path, "%s/%s_t%d.kvt", dir, model, k);
    for (int i = 0; i < 64; i++) t->sha[i] = "0123456789abcdef"[(k * 7 + i + (int)strlen(model)) % 16];
    t->sha[64] = 0;
    t->tr = (kvs_results_trace){.path = t->path, .model_name = model, .n_positions = 100, .prompt_len = 50,
                                .n_layers = 1, .n_heads = 1, .n_kv_heads = 1, .head_dim = 4, .dtype = "fp16",
                                .file_bytes = 1000 + (uint64_t)k};
    int64_t id = 0;
    assert_int_equal(kvs_results_sweep_trace(db, &t->tr, t->sha, &id), KVS_OK);
}

static kvs_results_stat stat_of(double mean, double p95) {
    return (kvs_results_stat){.n = 30, .mean = mean, .p50 = mean, .p95 = p95, .max = p95, .min = 0};
}

static void add(trace_w *t, const cfg *c) {
    kvs_results_agg agg;
    memset(&agg, 0, sizeof agg); /* every metric n = 0: not recorded */
    agg.layer = -1;
    agg.out_err = stat_of(c->err, c->p95);
    agg.attn_recall = stat_of(c->recall, 1);
    agg.attended_tokens = stat_of(c->scope && !strcmp(c->scope, "none") ? 75 : (double)c->budget, 100);
    agg.storage_bytes = stat_of(c->storage, c->storage);
    kvs_results_step steps[3];
    for (int i = 0; i < 3; i++) {
        memset(&steps[i], 0, sizeof steps[i]);
        for (int m = 0; m < KVS_N_METRICS; m++) steps[i].v[m] = NAN;
        steps[i].position = 50 + i;
        steps[i].v[KVS_M_OUT_ERR] = c->err + 0.01 * (c->series * (i + 1) % 5);
    }
    kvs_results_run run = {.policy = c->policy, .params = "p=1", .budget_tokens = c->budget, .budget_fraction = -1,
                           .measure = "decode", .budget_scope = c->scope, .notes = c->notes, .status = "complete",
                           .wall_seconds = 0.1, .kvsim_version = "test"};
    assert_int_equal(kvs_results_write_run(t->db, &t->tr, &run, NULL, 0, &agg, c->series ? steps : NULL,
                                           c->series ? 3 : 0, NULL),
                     KVS_OK);
    int32_t tokens[4] = {1, 2, 3, 4};
    /* one step: a run without steps stores no aggregates */
    kvs_closed_loop_step step = {.position = 2, .ref_token = 4, .kl = c->kl, .nll_full = log(2.0),
                                 .nll_policy = log(2.0 + c->dppl), .out_err = c->err};
    kvs_closed_loop_result res = {.n_steps = 1, .steps = &step, .kl_mean = c->kl, .top1_agree = c->top1,
                                  .ppl_full = 2.0, .ppl_policy = 2.0 + c->dppl, .out_err_mean = c->err,
                                  .first_divergence = -1};
    kvs_results_closed_run cr = {.model = t->model, .mode = "teacher", .source = t->path, .trace = &t->tr,
                                 .tokens = tokens, .n_tokens = 4, .prompt_len = 2, .policy = c->policy, .params = "p=1",
                                 .budget_tokens = c->budget, .layout = "per_kv_head",
                                 .budget_scope = c->scope ? c->scope : "every_step", .status = "complete",
                                 .result = &res, .kvsim_version = "test"};
    assert_int_equal(kvs_results_closed_write(t->db, &cr, NULL), KVS_OK);
}

/* A configuration whose three offline metrics rank as `err` does (p95 = 2 err, recall = 1 - err / 10) and whose three
 * closed-loop metrics rank as `kl` does (top-1 = 1 - kl / 10, delta ppl = kl / 2): every cell's |rho| is rho(err, kl). */
static cfg simple(const char *policy, int64_t budget, double err, double kl) {
    return (cfg){.policy = policy, .budget = budget, .err = err, .p95 = 2 * err, .recall = 1 - err / 10, .kl = kl,
                 .top1 = 1 - kl / 10, .dppl = kl / 2, .storage = 64.0 * (double)budget};
}

static cfg full_at(int64_t budget) {
    cfg c = simple("full", budget, 0, 0);
    c.scope = "none";
    c.storage = 6400;
    return c;
}

/* ---- independent statistics --------------------------------------------------------------------------------- */

/* Average ranks by counting (1 + number below + half the others equal), then Pearson's r of the ranks. */
static double rho_count(const double *x, const double *y, size_t n) {
    double rx[64], ry[64], m = 0.5 * (double)(n + 1), sxy = 0, sxx = 0, syy = 0;
    assert_true(n <= 64);
    for (size_t i = 0; i < n; i++) {
        double bx = 1, by = 1;
        for (size_t j = 0; j < n; j++) {
            if (j == i) continue;
            bx += x[j] < x[i] ? 1 : x[j] == x[i] ? 0.5 : 0;
            by += y[j] < y[i] ? 1 : y[j] == y[i] ? 0.5 : 0;
        }
        rx[i] = bx;
        ry[i] = by;
    }
    for (size_t i = 0; i < n; i++) {
        sxy += (rx[i] - m) * (ry[i] - m);
        sxx += (rx[i] - m) * (rx[i] - m);
        syy += (ry[i] - m) * (ry[i] - m);
    }
    return sxx > 0 && syy > 0 ? sxy / sqrt(sxx * syy) : NAN;
}

static kvs_calibration_corr corr_of(const kvs_calibration *c, const char *model, kvs_calibration_kind kind,
                                    int64_t budget, int mem, int reps) {
    kvs_calibration_sel s = {.model = model, .kind = kind, .budget = budget, .mem_log2 = mem};
    kvs_calibration_corr r;
    assert_int_equal(kvs_calibration_correlate(c, &s, reps, 0.95, 0, &r), KVS_OK);
    return r;
}

static char *cli_out(const char *dir, const char *const *args, int want_rc) {
    char out[192], err[192];
    snprintf(out, sizeof out, "%s/out.txt", dir);
    snprintf(err, sizeof err, "%s/err.txt", dir);
    int rc = kvs_test_cli(out, err, args);
    if (rc != want_rc) {
        char *e = kvs_test_slurp(err, NULL);
        fail_msg("exit %d (want %d): %s", rc, want_rc, e ? e : "");
    }
    return kvs_test_slurp(want_rc ? err : out, NULL);
}

static void db_path(const kvs_test_tmp *t, char *db, size_t n) { kvs_test_tmp_path(t, "r.db", db, n); }

/* ---- within-budget correlations ------------------------------------------------------------------------------- */

/* Trace 0: budget 8 ranks x 1,2,3,4 against y 1,3,2,4 (sum d^2 = 2: rho = 1 - 12/60 = 0.8); budget 16 x 1..4
 * against y 2,1,4,3 (sum d^2 = 4: 0.6); the full cache at both budgets (with it, budget 8 would read 1 - 12/120 =
 * 0.9). Trace 1: budget 8 in the same order both ways (rho 1). Trace 2: two configurations at budget 8 (too few to
 * rank: not used). So budget 8 is (0.8 + 1) / 2 = 0.9 over 2 traces, budget 16 is 0.6 over 1; pooled, trace 0's 8
 * configurations rank x 5,6,7,8,1,2,3,4 against y 5,7,6,8,2,1,4,3 (sum d^2 = 6: 1 - 36/504) and trace 1's rho 1. */
#define RHO_POOLED_T0 (1.0 - 36.0 / 504.0)

static void write_rank_db(const char *db_file, const char *dir) {
    kvs_results_db *db = NULL;
    assert_int_equal(kvs_results_open(db_file, &db), KVS_OK);
    trace_w t;
    const char *pol[4] = {"a", "b", "c", "d"};
    double y8[4] = {1, 3, 2, 4}, y16[4] = {0.02, 0.01, 0.04, 0.03};
    trace_open(&t, db, dir, "m", 0);
    for (int i = 0; i < 4; i++) {
        cfg c8 = simple(pol[i], 8, i + 1, y8[i]), c16 = simple(pol[i], 16, 0.1 * (i + 1), y16[i]);
        add(&t, &c8);
        add(&t, &c16);
    }
    cfg f8 = full_at(8), f16 = full_at(16);
    add(&t, &f8);
    add(&t, &f16);
    trace_open(&t, db, dir, "m", 1);
    for (int i = 0; i < 4; i++) {
        cfg c = simple(pol[i], 8, i + 1, 10 * (i + 1));
        add(&t, &c);
    }
    trace_open(&t, db, dir, "m", 2);
    for (int i = 0; i < 2; i++) {
        cfg c = simple(pol[i], 8, i + 1, 2 - i);
        add(&t, &c);
    }
    kvs_results_close(db);
}

static void test_within_budget_rho_by_hand(void **state) {
    const kvs_test_tmp *tmp = *state;
    char db_file[192];
    db_path(tmp, db_file, sizeof db_file);
    write_rank_db(db_file, tmp->dir);
    kvs_results_db *db = NULL;
    kvs_calibration *c = NULL;
    assert_int_equal(kvs_results_open_readonly(db_file, &db), KVS_OK);
    assert_int_equal(kvs_calibration_create(db, &c), KVS_OK);
    assert_int_equal(kvs_calibration_n_traces(c), 3);
    assert_int_equal(kvs_calibration_n_pairs(c), 10 + 4 + 2);

    kvs_calibration_corr r = corr_of(c, "m", KVS_CALIB_BUDGET, 8, 0, 0);
    assert_int_equal(r.n_pairs, 4 + 4 + 2); /* the full cache left out */
    assert_int_equal(r.n_traces, 2);        /* trace 2's two configurations rank nothing */
    assert_int_equal(r.units_min, 4);
    assert_int_equal(r.units_max, 4);
    assert_int_equal(r.n_policies, 4);
    /* every offline metric ranks as out_err mean, recall reversed; every closed-loop one as KL, top-1 reversed */
    for (int a = 0; a < KVS_CALIB_NX; a++)
        for (int b = 0; b < KVS_CALIB_NY; b++) {
            double sign = ((a == 2) ^ (b == 1)) ? -1 : 1;
            assert_int_equal(r.rho[a][b].n, 2);
            assert_near(r.rho[a][b].mean, sign * 0.9, 1e-12);
            assert_near(r.rho_min[a][b], sign > 0 ? 0.8 : -1.0, 1e-12);
            assert_near(r.rho_max[a][b], sign > 0 ? 1.0 : -0.8, 1e-12);
            assert_true(isnan(r.rho[a][b].lo)); /* reps 0: no interval */
        }
    r = corr_of(c, "m", KVS_CALIB_BUDGET, 16, 0, 0);
    assert_int_equal(r.n_traces, 1);
    assert_near(r.rho[0][0].mean, 0.6, 1e-12);
    r = corr_of(c, "m", KVS_CALIB_POOLED, 0, 0, 0);
    assert_int_equal(r.n_pairs, 8 + 4 + 2);
    assert_near(r.rho[0][0].mean, (RHO_POOLED_T0 + 1.0) / 2, 1e-12);
    assert_near(r.rho[2][1].mean, (RHO_POOLED_T0 + 1.0) / 2, 1e-12);
    /* the same from ranks counted here over the pairs the library lists */
    double x[8], y[8];
    size_t n = 0;
    for (size_t i = 0; i < kvs_calibration_n_pairs(c); i++) {
        const kvs_calibration_pair *p = kvs_calibration_pair_at(c, i);
        if (p->trace != 0 || p->full_cache) continue;
        x[n] = p->r->agg.out_err.mean;
        y[n++] = p->c->kl_mean;
    }
    assert_int_equal(n, 8);
    assert_near(rho_count(x, y, n), RHO_POOLED_T0, 1e-12);
    /* another model's name selects nothing */
    r = corr_of(c, "other", KVS_CALIB_BUDGET, 8, 0, 0);
    assert_int_equal(r.n_pairs, 0);
    assert_int_equal(r.n_traces, 0);
    kvs_calibration_free(c);
    kvs_results_close(db);

    if (!kvs_test_kvsim_bin()) return;
    const char *args[] = {"calibrate", db_file, "--bootstrap", "0", NULL};
    char *text = cli_out(tmp->dir, args, 0);
    assert_non_null(strstr(text, "model m: 16 (policy, budget) pairs on 3 traces"));
    assert_non_null(strstr(text, "budget 8: 10 pairs, 10 distinct configurations; n = 4 per trace on 2 traces, 4 policies"));
    assert_non_null(strstr(text, "budget 16: 4 pairs, 4 distinct configurations; n = 4 per trace on 1 trace"));
    char row[160];
    snprintf(row, sizeof row, "    %-14s %28s %28s %28s\n", "out_err_mean", "+0.900", "-0.900", "+0.900");
    assert_non_null(strstr(text, row));
    assert_non_null(strstr(text, "per trace, out_err_mean x kl_mean: +0.800 .. +1.000 over 2 traces"));
    assert_non_null(strstr(text, "pooled over budgets (mostly the budget axis):"));
    char want[64];
    snprintf(want, sizeof want, "%+.3f", (RHO_POOLED_T0 + 1.0) / 2);
    assert_non_null(strstr(strstr(text, "pooled over budgets"), want));
    assert_null(strstr(text, "["));
    assert_null(strstr(text, "nan"));
    free(text);
}

/* ---- duplicates collapsed ------------------------------------------------------------------------------------- */

/* On each of two traces, at budget 8: window; morphkv with the window's numbers (more storage, a note); snapkv and
 * pyramidkv alike (prompt-only, noted); quest noted but its own numbers; h2o with the window's mean error and KL but
 * another p95; quest worst offline, not in closed loop; tova, keyformer and d2o with equal aggregates, keyformer's out_err series different from tova's, d2o's
 * the same. At budget 16 window, morphkv (the same) and h2o. The full cache at 8 and 16. Per trace 14 pairs: morphkv
 * (8 and 16), pyramidkv, d2o and full at 16 collapse, 9 distinct. */
static void write_dup_db(const char *db_file, const char *dir) {
    kvs_results_db *db = NULL;
    assert_int_equal(kvs_results_open(db_file, &db), KVS_OK);
    for (int k = 0; k < 2; k++) {
        trace_w t;
        trace_open(&t, db, dir, "m", k);
        double s = 0.01 * k; /* trace 1 a little harder */
        cfg win = {.policy = "window", .budget = 8, .err = 0.5 + s, .p95 = 1.0, .recall = 0.7, .kl = 0.3 + s,
                   .top1 = 0.8, .dppl = 0.5, .storage = 256};
        cfg morph = win;
        morph.policy = "morphkv";
        morph.storage = 300;
        morph.notes = "R=32 leaves no distant slot in C_tot=7: a window of the last 8 positions";
        cfg snap = {.policy = "snapkv", .budget = 8, .err = 0.2 + s, .p95 = 0.6, .recall = 0.9, .kl = 0.1 + s,
                    .top1 = 0.9, .dppl = 0.2, .storage = 4000, .scope = "prompt",
                    .notes = "the budget is at most window=32: ... (a window)"};
        cfg pyr = snap;
        pyr.policy = "pyramidkv";
        cfg quest = {.policy = "quest", .budget = 8, .err = 0.9 + s, .p95 = 1.5, .recall = 0.5, .kl = 0.45 + s,
                     .top1 = 0.6, .dppl = 1.0, .storage = 9000, .notes = "the quota of 4 tokens is less than one page"};
        cfg h2o = win;
        h2o.policy = "h2o";
        h2o.p95 = 1.1;
        cfg tova = {.policy = "tova", .budget = 8, .err = 0.7 + s, .p95 = 1.2, .recall = 0.6, .kl = 0.5 + s,
                    .top1 = 0.7, .dppl = 0.6, .storage = 256, .series = 1};
        cfg kf = tova;
        kf.policy = "keyformer";
        kf.series = 2;
        cfg d2o = tova;
        d2o.policy = "d2o";
        cfg w16 = win, m16 = morph, h16 = h2o;
        w16.budget = m16.budget = h16.budget = 16;
        w16.err = m16.err = 0.3 + s;
        h16.err = 0.35 + s;
        w16.kl = m16.kl = 0.2 + s;
        h16.kl = 0.15 + s;
        cfg f8 = full_at(8), f16 = full_at(16);
        const cfg *all[] = {&win, &morph, &snap, &pyr, &quest, &h2o, &tova, &kf, &d2o, &f8, &w16, &m16, &h16, &f16};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) add(&t, all[i]);
    }
    kvs_results_close(db);
}

static void test_duplicates_collapsed(void **state) {
    const kvs_test_tmp *tmp = *state;
    char db_file[192];
    db_path(tmp, db_file, sizeof db_file);
    write_dup_db(db_file, tmp->dir);
    kvs_results_db *db = NULL;
    kvs_calibration *c = NULL;
    assert_int_equal(kvs_results_open_readonly(db_file, &db), KVS_OK);
    assert_int_equal(kvs_calibration_create(db, &c), KVS_OK);
    assert_int_equal(kvs_calibration_n_traces(c), 2);
    const char *into[][2] = {{"morphkv", "window"}, {"pyramidkv", "snapkv"}, {"d2o", "tova"}};
    for (size_t t = 0; t < 2; t++) {
        const kvs_calibration_trace *tr = kvs_calibration_trace_at(c, t);
        assert_int_equal(tr->n, 14);
        assert_int_equal(tr->n_distinct, 9);
        assert_int_equal(tr->n_y_differ, 0);
        for (size_t i = tr->first; i < tr->first + tr->n; i++) {
            const kvs_calibration_pair *p = kvs_calibration_pair_at(c, i);
            const kvs_calibration_pair *r = kvs_calibration_pair_at(c, p->rep);
            const char *want = p->c->policy;
            for (size_t k = 0; k < 3; k++)
                if (!strcmp(p->c->policy, into[k][0])) want = into[k][1];
            assert_string_equal(r->c->policy, want);
            /* full collapses across budgets (into budget 8), everything else within its budget */
            assert_int_equal(r->c->budget_tokens, !strcmp(want, "full") ? 8 : p->c->budget_tokens);
            assert_int_equal(r->trace, t);
        }
    }
    /* budget 8's distinct units are window, snapkv, quest, h2o, tova, keyformer: rho over them, not over all 8 */
    const char *units[] = {"window", "snapkv", "quest", "h2o", "tova", "keyformer"};
    double sum = 0, sum_all = 0;
    for (size_t t = 0; t < 2; t++) {
        double x[16], y[16], xa[16], ya[16];
        size_t n = 0, na = 0;
        const kvs_calibration_trace *tr = kvs_calibration_trace_at(c, t);
        for (size_t i = tr->first; i < tr->first + tr->n; i++) {
            const kvs_calibration_pair *p = kvs_calibration_pair_at(c, i);
            if (p->c->budget_tokens != 8 || !strcmp(p->c->policy, "full")) continue;
            xa[na] = p->r->agg.out_err.mean;
            ya[na++] = p->c->kl_mean;
            for (size_t k = 0; k < 6; k++)
                if (!strcmp(p->c->policy, units[k])) {
                    x[n] = p->r->agg.out_err.mean;
                    y[n++] = p->c->kl_mean;
                }
        }
        assert_int_equal(n, 6);
        assert_int_equal(na, 9);
        sum += rho_count(x, y, n);
        sum_all += rho_count(xa, ya, na);
    }
    kvs_calibration_corr r = corr_of(c, "m", KVS_CALIB_BUDGET, 8, 0, 0);
    assert_int_equal(r.n_pairs, 18);
    assert_int_equal(r.n_units, 12);
    assert_near(r.rho[0][0].mean, sum / 2, 1e-12);
    assert_true(fabs(sum / 2 - sum_all / 2) > 0.01); /* counting the duplicates would read otherwise */
    kvs_calibration_free(c);
    kvs_results_close(db);

    if (!kvs_test_kvsim_bin()) return;
    const char *args[] = {"calibrate", db_file, "--bootstrap", "0", "--pairs", NULL};
    char *text = cli_out(tmp->dir, args, 0);
    assert_non_null(strstr(text, ": 14 (policy, budget) pairs, 9 distinct"));
    assert_non_null(strstr(text, "duplicates: 10 of the 28 pairs collapsed into the configuration named first"));
    assert_non_null(strstr(text, "    full at budgets 8 = 16 (on 2 of 2 traces)\n"));
    assert_non_null(strstr(text, "    window = morphkv at budget 8 (on 2 of 2 traces), N: the replay noted it\n"));
    assert_non_null(strstr(text, "    window = morphkv at budget 16 (on 2 of 2 traces), N: the replay noted it\n"));
    assert_non_null(strstr(text, "    snapkv = pyramidkv at budget 8 (on 2 of 2 traces), N: the replay noted it\n"));
    assert_non_null(strstr(text, "    tova = d2o at budget 8 (on 2 of 2 traces)\n"));
    assert_non_null(strstr(text, "noted (N) but distinct, counted as themselves (on how many traces): quest@8 (2)\n"));
    assert_non_null(strstr(text, "budget 8: 18 pairs, 12 distinct configurations; n = 6 per trace on 2 traces"));
    /* --pairs: what each pair counts as */
    assert_non_null(strstr(text, "= window@8 (N)"));
    assert_non_null(strstr(text, "= snapkv@8 (N)"));
    assert_non_null(strstr(text, "= tova@8\n"));
    assert_non_null(strstr(text, "= full@8\n"));
    assert_non_null(strstr(text, "full cache (not ranked at a budget)"));
    /* within budget 8 the distinct units rank offline snapkv 1, window = h2o 2.5, tova = keyformer 4.5, quest 6 and
     * in closed loop snapkv 1, window = h2o 2.5, quest 4, tova = keyformer 5.5 */
    char row[160];
    snprintf(row, sizeof row, " %6s %6s  %s\n", "6.0", "4.0", "itself (N)");
    const char *q = strstr(text, "\n  quest ");
    assert_non_null(q);
    assert_non_null(strstr(q, row));
    assert_true(strstr(q, row) < strchr(q + 1, '\n'));
    snprintf(row, sizeof row, " %6s %6s  %s\n", "4.5", "5.5", "itself");
    assert_non_null(strstr(strstr(text, "\n  keyformer "), row));
    snprintf(row, sizeof row, " %6s %6s  %s\n", "-", "-", "= window@8 (N)");
    assert_non_null(strstr(strstr(text, "\n  morphkv "), row));
    assert_non_null(strstr(text, "largest within-budget rank disagreements (out_err_mean vs kl_mean, 1 = smallest):\n"
                                 "    quest budget 8: offline rank 6.0, closed-loop rank 4.0\n"));
    free(text);
}

/* ---- the bootstrap over policies x traces ------------------------------------------------------------------- */

/* Four policies at budgets 8 and 16 on two traces (the pooled selection: a policy is a cluster of two
 * configurations per trace), for two models. "bf": the two traces alike, each policy's two configurations swapped
 * against each other (drawing a policy twice repeats a discordant pair). "bf2": the policies rank in the same order
 * both ways on trace 0 (rho 1 - 48/504) and in opposite orders on trace 1 (rho 1 - 960/504): the figure, 0, depends
 * on which traces are drawn as much as on which policies. */
static const double BOOT_XY[2][2][8][2] = {
    {
        {{1, 2}, {2, 1}, {3, 3}, {4, 5}, {5, 4}, {6, 7}, {7, 8}, {8, 6}},
        {{1, 3}, {2, 4}, {3, 1}, {4, 2}, {5, 6}, {6, 5}, {7, 8}, {8, 7}},
    },
    {
        {{1, 2}, {2, 1}, {3, 4}, {4, 3}, {5, 6}, {6, 5}, {7, 8}, {8, 7}},
        {{1, 7}, {2, 8}, {3, 5}, {4, 6}, {5, 3}, {6, 4}, {7, 1}, {8, 2}},
    },
};
static const char *const BOOT_MODEL[2] = {"bf", "bf2"};

static void write_boot_db(const char *db_file, const char *dir) {
    const char *pol[4] = {"p", "q", "r", "s"};
    kvs_results_db *db = NULL;
    assert_int_equal(kvs_results_open(db_file, &db), KVS_OK);
    for (int m = 0; m < 2; m++)
        for (int k = 0; k < 2; k++) {
            trace_w t;
            trace_open(&t, db, dir, BOOT_MODEL[m], k);
            for (int i = 0; i < 8; i++) {
                cfg c = simple(pol[i / 2], i % 2 ? 16 : 8, BOOT_XY[m][k][i][0], BOOT_XY[m][k][i][1]);
                add(&t, &c);
            }
        }
    kvs_results_close(db);
}

/* The statistic of one resample: policy multiplicities w[4], trace multiplicities v[2]; NaN when no drawn trace has
 * a defined rho. x, y: [trace][config], config i of policy i / 2. */
static double resample_stat(double x[2][8], double y[2][8], const int *w, const int *v) {
    double sum = 0;
    int k = 0;
    for (int t = 0; t < 2; t++) {
        if (!v[t]) continue;
        double bx[32], by[32];
        size_t n = 0;
        for (int i = 0; i < 8; i++)
            for (int r = 0; r < w[i / 2]; r++) {
                bx[n] = x[t][i];
                by[n++] = y[t][i];
            }
        double rho = n >= 2 ? rho_count(bx, by, n) : NAN;
        if (isnan(rho)) continue;
        sum += v[t] * rho;
        k += v[t];
    }
    return k ? sum / k : NAN;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The q-quantile of an equally weighted discrete distribution (sorted v[n]): the smallest value whose cumulative
 * share reaches q. */
static double exact_q(const double *v, size_t n, double q) {
    size_t i = (size_t)ceil(q * (double)n);
    return v[i ? i - 1 : 0];
}

/* Every resample of model m's pooled selection (4^4 ordered policy draws x 2^2 ordered trace draws, equally likely;
 * with traces_fixed, both traces once each instead) into vals (sorted); @return how many had a value. */
static size_t enumerate(double x[2][8], double y[2][8], int traces_fixed, double *vals) {
    size_t nv = 0;
    for (int a = 0; a < 256; a++)
        for (int b = 0; b < (traces_fixed ? 1 : 4); b++) {
            int w[4] = {0}, v[2] = {0};
            for (int k = 0, z = a; k < 4; k++, z /= 4) w[z % 4]++;
            if (traces_fixed) {
                v[0] = v[1] = 1;
            } else {
                v[b & 1]++;
                v[(b >> 1) & 1]++;
            }
            double s = resample_stat(x, y, w, v);
            if (!isnan(s)) vals[nv++] = s;
        }
    qsort(vals, nv, sizeof *vals, cmp_d);
    return nv;
}

/* lo within 0.012 of the 2.5 % point of the exact distribution, hi of the 97.5 % point (2000 resamples: 3.4 standard
 * errors of an empirical quantile at that level). */
static int in_band(const double *vals, size_t nv, double lo, double hi) {
    return lo >= exact_q(vals, nv, 0.025 - 0.012) && lo <= exact_q(vals, nv, 0.025 + 0.012) &&
           hi >= exact_q(vals, nv, 0.975 - 0.012) && hi <= exact_q(vals, nv, 0.975 + 0.012);
}

static uint64_t fnv(uint64_t h, const char *s) {
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static int cmp_s(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void test_bootstrap_over_policies_and_traces_brute_force(void **state) {
    const kvs_test_tmp *tmp = *state;
    char db_file[192];
    db_path(tmp, db_file, sizeof db_file);
    write_boot_db(db_file, tmp->dir);
    kvs_results_db *db = NULL;
    kvs_calibration *c = NULL;
    assert_int_equal(kvs_results_open_readonly(db_file, &db), KVS_OK);
    assert_int_equal(kvs_calibration_create(db, &c), KVS_OK);
    double lo[2], hi[2], point[2];
    kvs_calibration_corr r[2];
    for (int m = 0; m < 2; m++) {
        double x[2][8], y[2][8];
        for (size_t i = 0; i < kvs_calibration_n_pairs(c); i++) {
            const kvs_calibration_pair *p = kvs_calibration_pair_at(c, i);
            if (strcmp(p->c->model, BOOT_MODEL[m]) != 0) continue;
            int ci = (p->c->policy[0] - 'p') * 2 + (p->c->budget_tokens == 16);
            x[p->trace - 2 * (size_t)m][ci] = p->r->agg.out_err.mean;
            y[p->trace - 2 * (size_t)m][ci] = p->c->kl_mean;
        }
        double vals[1024];
        size_t nv = enumerate(x, y, 0, vals);
        int w1[4] = {1, 1, 1, 1}, v1[2] = {1, 1};
        point[m] = resample_stat(x, y, w1, v1);
        r[m] = corr_of(c, BOOT_MODEL[m], KVS_CALIB_POOLED, 0, 0, KVS_BOOTSTRAP_REPS);
        assert_int_equal(r[m].n_policies, 4);
        assert_int_equal(r[m].n_traces, 2);
        assert_near(r[m].rho[0][0].mean, point[m], 1e-12);
        lo[m] = r[m].rho[0][0].lo;
        hi[m] = r[m].rho[0][0].hi;
        fprintf(stderr, "%s: %.4f [%.4f, %.4f]; exact 2.5%% %.4f 97.5%% %.4f (%zu of 1024 resamples defined)\n",
                BOOT_MODEL[m], point[m], lo[m], hi[m], exact_q(vals, nv, 0.025), exact_q(vals, nv, 0.975), nv);
        assert_true(in_band(vals, nv, lo[m], hi[m]));
        if (m == 1) {
            /* without the trace level (both traces in every resample) the interval would be another */
            nv = enumerate(x, y, 1, vals);
            fprintf(stderr, "  traces not resampled: exact 2.5%% %.4f 97.5%% %.4f\n", exact_q(vals, nv, 0.025),
                    exact_q(vals, nv, 0.975));
            assert_false(in_band(vals, nv, lo[m], hi[m]));
            continue;
        }
        /* resampling configurations one by one (a policy's two no longer together) is another distribution: the
         * clustered interval is not it (a Monte Carlo of it here, 20000 resamples) */
        uint64_t g = 88172645463325252ull;
        double *u = malloc(20000 * sizeof *u);
        size_t nu = 0;
        for (int b = 0; b < 20000; b++) {
            double sum = 0;
            int k = 0;
            for (int d = 0; d < 2; d++) {
                g ^= g << 13, g ^= g >> 7, g ^= g << 17;
                int t = (int)(g % 2);
                double bx[8], by[8];
                for (int i = 0; i < 8; i++) {
                    g ^= g << 13, g ^= g >> 7, g ^= g << 17;
                    int j = (int)(g % 8);
                    bx[i] = x[t][j];
                    by[i] = y[t][j];
                }
                double rho = rho_count(bx, by, 8);
                if (!isnan(rho)) {
                    sum += rho;
                    k++;
                }
            }
            if (k) u[nu++] = sum / k;
        }
        qsort(u, nu, sizeof *u, cmp_d);
        fprintf(stderr, "  configurations resampled: 2.5%% %.4f 97.5%% %.4f\n", exact_q(u, nu, 0.025),
                exact_q(u, nu, 0.975));
        assert_true(fabs(exact_q(u, nu, 0.025) - lo[m]) > 0.1);
        free(u);
    }

    /* the seed is the documented identity: FNV-1a of "calibrate|bf|pooled|<units sorted>" */
    char *ids[16];
    size_t n_ids = 0;
    for (size_t i = 0; i < kvs_calibration_n_pairs(c); i++) {
        const kvs_calibration_pair *p = kvs_calibration_pair_at(c, i);
        if (strcmp(p->c->model, "bf") != 0) continue;
        ids[n_ids] = malloc(128);
        snprintf(ids[n_ids++], 128, "%s|%s|p=1|%lld", kvs_calibration_trace_at(c, p->trace)->id, p->c->policy,
                 (long long)p->c->budget_tokens);
    }
    assert_int_equal(n_ids, 16);
    qsort(ids, n_ids, sizeof *ids, cmp_s);
    uint64_t h = fnv(14695981039346656037ull, "calibrate|bf|pooled|");
    for (size_t i = 0; i < n_ids; i++) {
        if (i) h = fnv(h, ",");
        h = fnv(h, ids[i]);
        free(ids[i]);
    }
    assert_true(r[0].seed == h);
    /* an extra seed changes the draws, not the figure */
    kvs_calibration_sel s = {.model = "bf", .kind = KVS_CALIB_POOLED};
    kvs_calibration_corr r2;
    assert_int_equal(kvs_calibration_correlate(c, &s, KVS_BOOTSTRAP_REPS, 0.95, 7, &r2), KVS_OK);
    assert_true(r2.seed != r[0].seed);
    assert_true(r2.rho[0][0].mean == r[0].rho[0][0].mean);
    /* bad arguments */
    assert_int_equal(kvs_calibration_correlate(c, &s, -1, 0.95, 0, &r2), KVS_ERR_INVALID_ARG);
    assert_int_equal(kvs_calibration_correlate(c, &s, 10, 1.0, 0, &r2), KVS_ERR_INVALID_ARG);
    kvs_calibration_free(c);
    kvs_results_close(db);

    if (!kvs_test_kvsim_bin()) return;
    /* the CLI prints those intervals (default resamples, the identity seed), the same on a second run */
    const char *args[] = {"calibrate", db_file, NULL};
    char *text = cli_out(tmp->dir, args, 0), want[96];
    for (int m = 0; m < 2; m++) {
        char head[64];
        snprintf(head, sizeof head, "\nmodel %s: ", BOOT_MODEL[m]);
        const char *sec = strstr(text, head);
        assert_non_null(sec);
        snprintf(want, sizeof want, "%+.3f [%+.2f, %+.2f]", point[m], lo[m], hi[m]);
        assert_non_null(strstr(strstr(sec, "pooled over budgets"), want));
    }
    assert_non_null(strstr(text, "[95% interval: 2000 resamples of policies x traces]"));
    char *again = cli_out(tmp->dir, args, 0);
    assert_string_equal(again, text);
    free(again);
    free(text);
}

/* ---- equal measured memory ------------------------------------------------------------------------------------ */

/* Resident bytes 256, 400, 511.5 and the full cache's 300 fall in the bin 256..511 whatever their budgets; 512 and
 * 1000 in 512..1023 (two: no correlation). In the first bin x ranks 2,3,4,1 (full smallest) against y 2,4,3,1:
 * sum d^2 = 2, rho = 1 - 12/60 = 0.8. */
static void test_equal_memory_bins(void **state) {
    const kvs_test_tmp *tmp = *state;
    char db_file[192];
    db_path(tmp, db_file, sizeof db_file);
    kvs_results_db *db = NULL;
    assert_int_equal(kvs_results_open(db_file, &db), KVS_OK);
    trace_w t;
    trace_open(&t, db, tmp->dir, "m", 0);
    cfg a = simple("a", 8, 1, 1), b = simple("b", 16, 2, 3), d = simple("d", 32, 3, 2), e = simple("e", 8, 4, 4),
        f = simple("f", 16, 5, 5), full = full_at(8);
    a.storage = 256;
    b.storage = 400;
    d.storage = 511.5;
    e.storage = 512;
    f.storage = 1000;
    full.storage = 300;
    const cfg *all[] = {&a, &b, &d, &e, &f, &full};
    for (size_t i = 0; i < 6; i++) add(&t, all[i]);
    kvs_results_close(db);
    kvs_calibration *c = NULL;
    assert_int_equal(kvs_results_open_readonly(db_file, &db), KVS_OK);
    assert_int_equal(kvs_calibration_create(db, &c), KVS_OK);
    kvs_calibration_corr r = corr_of(c, "m", KVS_CALIB_MEMORY, 0, 8, 0);
    assert_int_equal(r.n_pairs, 4);
    assert_int_equal(r.n_traces, 1);
    assert_near(r.rho[0][0].mean, 0.8, 1e-12);
    r = corr_of(c, "m", KVS_CALIB_MEMORY, 0, 9, 0);
    assert_int_equal(r.n_pairs, 2);
    assert_int_equal(r.n_traces, 0);
    assert_true(isnan(r.rho[0][0].mean));
    kvs_calibration_free(c);
    kvs_results_close(db);
    if (!kvs_test_kvsim_bin()) return;
    const char *args[] = {"calibrate", db_file, "--bootstrap", "100", NULL};
    char *text = cli_out(tmp->dir, args, 0);
    const char *m8 = strstr(text, "  memory 256B to <512B: 4 pairs, 4 distinct configurations; n = 4 per trace on 1 trace");
    assert_non_null(m8);
    assert_non_null(strstr(m8, "+0.800 ["));
    assert_non_null(strstr(text, "  memory 512B to <1KiB: 2 pairs, 2 distinct configurations\n"
                                 "    no trace has 3 distinct configurations here: no correlation\n"));
    free(text);
}

/* closed_runs.codec came after the table: a database written before it (the column dropped here) reads back with
 * every codec NULL, and the next write adds the column and records its codec. */
static void test_closed_runs_without_codec_column(void **state) {
    const kvs_test_tmp *tmp = *state;
    char db_file[192];
    db_path(tmp, db_file, sizeof db_file);
    kvs_results_db *db = NULL;
    assert_int_equal(kvs_results_open(db_file, &db), KVS_OK);
    trace_w t;
    trace_open(&t, db, tmp->dir, "m", 0);
    cfg a = simple("a", 8, 1, 1);
    add(&t, &a);
    kvs_results_close(db);
    sqlite3 *raw = NULL;
    assert_int_equal(sqlite3_open(db_file, &raw), SQLITE_OK);
    assert_int_equal(sqlite3_exec(raw, "ALTER TABLE closed_runs DROP COLUMN codec", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(raw);
    assert_int_equal(kvs_results_open_readonly(db_file, &db), KVS_OK);
    kvs_results_closed_row *rows = NULL;
    int64_t n = 0;
    assert_int_equal(kvs_results_closed_query(db, &rows, &n), KVS_OK);
    assert_int_equal(n, 1);
    assert_null(rows[0].codec);
    kvs_results_closed_rows_free(rows, n);
    kvs_results_close(db);
    assert_int_equal(kvs_results_open(db_file, &db), KVS_OK);
    int32_t tokens[4] = {1, 2, 3, 4};
    kvs_closed_loop_step step = {.position = 2, .ref_token = 4};
    kvs_closed_loop_result res = {.n_steps = 1, .steps = &step, .first_divergence = -1};
    kvs_results_closed_run cr = {.model = "m", .mode = "teacher", .source = t.path, .trace = &t.tr, .tokens = tokens,
                                 .n_tokens = 4, .prompt_len = 2, .policy = "a", .params = "p=1", .codec = "fp8:x",
                                 .budget_tokens = 8, .layout = "per_kv_head", .budget_scope = "every_step",
                                 .status = "complete", .result = &res, .kvsim_version = "test"};
    assert_int_equal(kvs_results_closed_write(db, &cr, NULL), KVS_OK);
    assert_int_equal(kvs_results_closed_query(db, &rows, &n), KVS_OK);
    assert_int_equal(n, 2);
    assert_null(rows[0].codec);
    assert_string_equal(rows[1].codec, "fp8:x");
    kvs_results_closed_rows_free(rows, n);
    kvs_results_close(db);
}

/* ---- words, not nan; bad input -------------------------------------------------------------------------------- */

static void test_one_policy_and_constant_sides(void **state) {
    const kvs_test_tmp *tmp = *state;
    char db_file[192];
    db_path(tmp, db_file, sizeof db_file);
    kvs_results_db *db = NULL;
    assert_int_equal(kvs_results_open(db_file, &db), KVS_OK);
    trace_w t;
    trace_open(&t, db, tmp->dir, "m", 0);
    /* budget 8: three policies with the same KL (a constant side); memory 64..127: one policy at three budgets */
    const int64_t wb[3] = {2, 4, 32};
    for (int i = 0; i < 3; i++) {
        cfg c = simple(i == 0 ? "a" : i == 1 ? "b" : "c", 8, i + 1, 0.5);
        c.storage = 1000 + i;
        add(&t, &c);
        cfg one = simple("w", wb[i], 3 - i, 3 - i);
        one.storage = 64 + 10 * i;
        add(&t, &one);
    }
    kvs_results_close(db);
    if (!kvs_test_kvsim_bin()) skip();
    const char *args[] = {"calibrate", db_file, NULL};
    char *text = cli_out(tmp->dir, args, 0);
    const char *b8 = strstr(text, "  budget 8: ");
    assert_non_null(b8);
    assert_non_null(strstr(b8, "undefined (constant)"));
    assert_non_null(strstr(text, "no ranking to correlate"));
    const char *m = strstr(text, "  memory 64B to <128B: 3 pairs");
    assert_non_null(m);
    assert_non_null(strstr(m, "+1.000 (one policy)"));
    assert_non_null(strstr(m, "one policy: no interval"));
    assert_null(strstr(text, "nan"));
    free(text);
    /* bad usage and a database with nothing to pair */
    const char *neg[] = {"calibrate", db_file, "--bootstrap", "-1", NULL};
    text = cli_out(tmp->dir, neg, 2);
    free(text);
    const char *val[] = {"calibrate", db_file, "--pairs", "x", NULL};
    text = cli_out(tmp->dir, val, 2);
    assert_non_null(strstr(text, "unexpected argument 'x'"));
    free(text);
    char empty[192];
    kvs_test_tmp_path(tmp, "replay_only.db", empty, sizeof empty);
    assert_int_equal(kvs_results_open(empty, &db), KVS_OK);
    trace_open(&t, db, tmp->dir, "m", 0);
    kvs_results_run run = {.policy = "a", .params = "p=1", .budget_tokens = 8, .budget_fraction = -1,
                           .measure = "decode", .status = "complete", .kvsim_version = "test"};
    kvs_results_agg agg;
    memset(&agg, 0, sizeof agg);
    agg.layer = -1;
    assert_int_equal(kvs_results_write_run(db, &t.tr, &run, NULL, 0, &agg, NULL, 0, NULL), KVS_OK);
    kvs_results_close(db);
    const char *none[] = {"calibrate", empty, NULL};
    text = cli_out(tmp->dir, none, 1);
    assert_non_null(strstr(text, "no closed-loop results"));
    free(text);
}

/* ---- examples/closed_loop.sh on the real models ----------------------------------------------------------------- */

/* Two prompts of each model, budgets 8,16 and 4096 (more than half of any prompt: left out on every trace), 8
 * generated tokens: the within-budget tables over two traces per model. */
static void test_closed_loop_script_on_two_prompts_of_both_models(void **state) {
    const kvs_test_tmp *tmp = *state;
    const char *bin = kvs_test_kvsim_bin();
    char m1[4096], m2[4096], cmd[8192], path[256];
    snprintf(m1, sizeof m1, "%s/../shared/models/stories260K.bin", kvs_test_root());
    snprintf(m2, sizeof m2, "%s/../shared/models/tinystories-656K", kvs_test_root());
    if (!bin || !kvs_test_exists(m1) || !kvs_test_exists(m2)) skip();
    if (kvs_test_sanitized()) {
        print_message("the closed-loop study script runs in the plain suite (minutes under the sanitizers)\n");
        skip();
    }
    snprintf(cmd, sizeof cmd, "CLOSED_LOOP_OUT='%s/cl' KVSIM_BIN='%s' sh '%s/examples/closed_loop.sh' 8,16,4096 2 8 "
             "> '%s/script.txt' 2> '%s/script.err'", tmp->dir, bin, kvs_test_root(), tmp->dir, tmp->dir);
    assert_int_equal(system(cmd), 0);
    snprintf(path, sizeof path, "%s/cl/calibrate.txt", tmp->dir);
    char *text = kvs_test_slurp(path, NULL);
    assert_non_null(text);
    const char *models[2] = {"stories260K", "tinystories-656K"};
    for (int k = 0; k < 2; k++) {
        char want[128];
        snprintf(want, sizeof want, "\nmodel %s: ", models[k]);
        const char *m = strstr(text, want);
        assert_non_null(m);
        assert_non_null(strstr(m, " on 2 traces\n"));
        const char *b8 = strstr(m, "  budget 8: ");
        assert_non_null(b8);
        assert_non_null(strstr(b8, " per trace on 2 traces"));
        assert_non_null(strstr(m, "  budget 16: "));
        assert_non_null(strstr(m, "pooled over budgets (mostly the budget axis):"));
        /* every registered policy but the oracles and full ran; the duplicates are listed */
        const char *dup = strstr(m, "window = scissorhands = morphkv"); /* and the policies equal to them here */
        assert_non_null(dup);
        const char *eol = strchr(dup, '\n'), *at8 = strstr(dup, " at budget 8 (on 2 of 2 traces)");
        assert_true(eol && at8 && at8 < eol);
        snprintf(path, sizeof path, "%s/cl/replay_%s.txt", tmp->dir, models[k]);
        char *log = kvs_test_slurp(path, NULL);
        assert_non_null(log);
        assert_non_null(strstr(log, ".kvt: budgets 8,16\n"));
        free(log);
    }
    assert_null(strstr(text, "budget 4096"));
    assert_null(strstr(text, "nan"));
    free(text);
    snprintf(path, sizeof path, "%s/cl/calibrate.png", tmp->dir);
    if (system("command -v gnuplot >/dev/null 2>&1") == 0) assert_true(kvs_test_exists(path));
    snprintf(cmd, sizeof cmd, "rm -rf '%s/cl'", tmp->dir);
    assert_int_equal(system(cmd), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_within_budget_rho_by_hand, kvs_test_tmp_setup, kvs_test_tmp_teardown),
        cmocka_unit_test_setup_teardown(test_duplicates_collapsed, kvs_test_tmp_setup, kvs_test_tmp_teardown),
        cmocka_unit_test_setup_teardown(test_bootstrap_over_policies_and_traces_brute_force, kvs_test_tmp_setup,
                                        kvs_test_tmp_teardown),
        cmocka_unit_test_setup_teardown(test_closed_runs_without_codec_column, kvs_test_tmp_setup, kvs_test_tmp_teardown),
        cmocka_unit_test_setup_teardown(test_equal_memory_bins, kvs_test_tmp_setup, kvs_test_tmp_teardown),
        cmocka_unit_test_setup_teardown(test_one_policy_and_constant_sides, kvs_test_tmp_setup, kvs_test_tmp_teardown),
        cmocka_unit_test_setup_teardown(test_closed_loop_script_on_two_prompts_of_both_models, kvs_test_tmp_setup,
                                        kvs_test_tmp_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
