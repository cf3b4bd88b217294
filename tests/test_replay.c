/* test_replay.c — the replay engine (sim/replay.c) and `kvsim replay` (cli/cmd_replay.c) on GENERATED traces
 * (tests/util/gen_trace.h: seeded Gaussian q/k/v, not a model): exact zero error for full attention and
 * wide windows, budget parsing, sweep = individual runs, --measure all, the CLI's exit codes and that bad
 * input leaves the database untouched. Semantics under test: sim/replay.h and ../shared/DESIGN.md "Replay".
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../sim/host.h"
#include "../sim/policy.h"
#include "../policies/registry.h"
#include "../sim/replay.h"
#include "../sim/replay_mem.h"
#include "util/replay_fixture.h"

typedef kvs_test_replay_fixture fixture;

static void fixture_make(fixture *f, int n_turns, int n_pos) {
    kvs_gen_trace_opts o = kvs_gen_trace_defaults();
    o.n_positions = n_pos;
    o.n_turns = n_turns;
    o.q_scale = 2.0f;
    assert_int_equal(kvs_test_replay_fixture_make(&o, 4, 16, f), KVS_OK);
}

static void fixture_free(fixture *f) { kvs_test_replay_fixture_free(f); }

static kvs_replay_result *replay_hash(const fixture *f, const char *const *specs, const int64_t *budgets, int n,
                                      kvs_replay_measure measure, int threads, const char *content_hash) {
    kvs_replay_config cfg[16];
    assert_true(n <= 16);
    for (int i = 0; i < n; i++) {
        assert_int_equal(kvs_policy_parse(specs[i], &cfg[i].policy), KVS_OK);
        cfg[i].budget = budgets[i];
        cfg[i].budget_fraction = -1;
    }
    kvs_replay_source src;
    assert_int_equal(kvs_replay_source_from_memory(&f->mem, &src), KVS_OK);
    snprintf(src.content_hash, sizeof src.content_hash, "%s", content_hash);
    kvs_replay_opts o = {.configs = cfg, .n_configs = n, .threads = threads, .measure = measure, .series_every = 1};
    kvs_replay_result *r = NULL;
    assert_int_equal(kvs_replay_execute(&src, &o, &r), KVS_OK);
    for (int i = 0; i < n; i++) assert_int_equal(r->runs[i].status, KVS_OK);
    return r;
}

static kvs_replay_result *replay(const fixture *f, const char *const *specs, const int64_t *budgets, int n,
                                 kvs_replay_measure measure, int threads) {
    return replay_hash(f, specs, budgets, n, measure, threads, "");
}

static void test_full_and_wide_window_have_zero_error(void **state) {
    (void)state;
    fixture f;
    fixture_make(&f, 1, 50);
    const char *specs[] = {"full", "window", "streaming:sinks=0", "streaming"};
    const int64_t budgets[] = {5, 50, 50, 50};
    kvs_replay_result *r = replay(&f, specs, budgets, 4, KVS_MEASURE_DECODE, 2);
    int64_t decode = 50 - f.turns[0].prompt_end;
    int64_t samples = decode * f.mem.model.n_heads * f.mem.model.n_layers;
    for (int i = 0; i < 4; i++) {
        assert_int_equal(r->runs[i].run_agg.out_err.n, samples);
        assert_true(r->runs[i].run_agg.topk_overlap.min == 1.0);
        assert_true(fabs(r->runs[i].run_agg.attn_recall.min - 1.0) < 1e-5);
        assert_int_equal(r->runs[i].n_layers, f.mem.model.n_layers);
        assert_int_equal(r->runs[i].n_steps, samples); /* --series-every 1 */
    }
    assert_true(r->runs[0].run_agg.out_err.max == 0.0);
    assert_true(r->runs[1].run_agg.out_err.max == 0.0); /* B = length: nothing ever evicted */
    assert_true(r->runs[2].run_agg.out_err.max == 0.0);
    assert_true(r->runs[3].run_agg.out_err.max == 0.0);
    /* full cache: compression ratio 1, storage = n x 2 x d x 4 bytes at the last step */
    assert_true(r->runs[0].run_agg.compression_ratio.max == 1.0);
    assert_true(r->runs[0].run_agg.storage_bytes.max == 50.0 * 2 * f.mem.model.head_dim * 4);
    kvs_replay_result_free(r);
    fixture_free(&f);
}

static void test_small_window_has_error_and_bounded_storage(void **state) {
    (void)state;
    fixture f;
    fixture_make(&f, 1, 60);
    const char *specs[] = {"window"};
    const int64_t budgets[] = {4};
    kvs_replay_result *r = replay(&f, specs, budgets, 1, KVS_MEASURE_DECODE, 1);
    assert_true(r->runs[0].run_agg.out_err.mean > 0.01);
    assert_true(r->runs[0].run_agg.attn_recall.mean < 1.0);
    assert_true(r->runs[0].run_agg.storage_bytes.max == 4.0 * 2 * f.mem.model.head_dim * 4);
    assert_int_equal(r->runs[0].max_attended, 4);
    kvs_replay_result_free(r);
    fixture_free(&f);
}

/* Every statistic of two aggregates, bit for bit (NaN equal to NaN with the same bits). */
static void assert_agg_same(const kvs_results_agg *a, const kvs_results_agg *b) {
    assert_int_equal(a->layer, b->layer);
    for (int k = 0; k < KVS_N_METRICS; k++) {
        const kvs_results_stat *x = &a->m[k], *y = &b->m[k];
        assert_int_equal(x->n, y->n);
        const double xs[5] = {x->mean, x->p50, x->p95, x->min, x->max}, ys[5] = {y->mean, y->p50, y->p95, y->min, y->max};
        assert_memory_equal(xs, ys, sizeof xs);
    }
}

/* A sweep on several threads gives each configuration what a run of its own on one thread gives: every aggregate
 * and every step of the series, bit for bit. 3 and 8 threads: the runs' statistics are shared out between the
 * threads after the replay (8: more threads than runs). */
static void test_sweep_equals_individual_runs(void **state) {
    (void)state;
    fixture f;
    fixture_make(&f, 2, 64);
    const char *specs[] = {"h2o", "tova", "topk", "streaming:sinks=2", "window"};
    const int64_t budgets[] = {9, 7, 5, 8, 12};
    for (int threads = 3; threads <= 8; threads += 5) {
        kvs_replay_result *all = replay(&f, specs, budgets, 5, KVS_MEASURE_DECODE, threads);
        for (int i = 0; i < 5; i++) {
            kvs_replay_result *one = replay(&f, &specs[i], &budgets[i], 1, KVS_MEASURE_DECODE, 1);
            const kvs_replay_run_result *x = &one->runs[0], *y = &all->runs[i];
            assert_agg_same(&x->run_agg, &y->run_agg);
            assert_int_equal(x->n_layers, y->n_layers);
            for (int l = 0; l < x->n_layers; l++) assert_agg_same(&x->layer_aggs[l], &y->layer_aggs[l]);
            assert_int_equal(x->max_attended, y->max_attended);
            assert_int_equal(x->n_steps, y->n_steps);
            assert_true(x->n_steps > 0);
            for (int64_t k = 0; k < x->n_steps; k++) {
                assert_int_equal(x->steps[k].layer, y->steps[k].layer);
                assert_int_equal(x->steps[k].q_head, y->steps[k].q_head);
                assert_int_equal(x->steps[k].position, y->steps[k].position);
                assert_memory_equal(x->steps[k].v, y->steps[k].v, sizeof x->steps[k].v);
            }
            size_t per = (size_t)f.mem.model.n_layers * (size_t)f.mem.model.n_kv_heads;
            assert_memory_equal(x->budgets, y->budgets, per * sizeof *x->budgets);
            kvs_replay_result_free(one);
        }
        kvs_replay_result_free(all);
    }
    fixture_free(&f);
}


/* A randomised policy's numbers are the run's own: seeded from its identity (content hash, canonical spec, budget,
 * element sizes) and the (layer, KV head), never from its place among the sweep's configurations. Keyformer (Gumbel
 * noise) alone and after other configurations, at several thread counts, gives the same bits; another content hash
 * or budget draws other noise. */
static void test_randomised_policy_seeded_by_run_identity(void **state) {
    (void)state;
    fixture f;
    fixture_make(&f, 1, 64);
    const char *alone[] = {"keyformer"};
    const int64_t b_alone[] = {9};
    const char *among[] = {"window", "h2o", "keyformer", "keyformer:noise=none"};
    const int64_t b_among[] = {9, 9, 9, 9};
    kvs_replay_result *one = replay_hash(&f, alone, b_alone, 1, KVS_MEASURE_DECODE, 1, "hash-a");
    for (int threads = 1; threads <= 4; threads += 3) {
        kvs_replay_result *all = replay_hash(&f, among, b_among, 4, KVS_MEASURE_DECODE, threads, "hash-a");
        assert_agg_same(&one->runs[0].run_agg, &all->runs[2].run_agg);
        for (int l = 0; l < one->runs[0].n_layers; l++)
            assert_agg_same(&one->runs[0].layer_aggs[l], &all->runs[2].layer_aggs[l]);
        kvs_replay_result_free(all);
    }
    /* the noise matters on this trace, so a seed that ignored the identity would show */
    kvs_replay_result *other = replay_hash(&f, alone, b_alone, 1, KVS_MEASURE_DECODE, 1, "hash-b");
    assert_true(other->runs[0].run_agg.out_err.mean != one->runs[0].run_agg.out_err.mean);
    kvs_replay_result_free(other);
    kvs_replay_result_free(one);
    fixture_free(&f);

    /* the seed itself: a function of the identity's fields and nothing else */
    kvs_policy_config a, b;
    assert_int_equal(kvs_policy_parse("keyformer", &a), KVS_OK);
    assert_int_equal(kvs_policy_parse("keyformer:tau_init=1", &b), KVS_OK); /* the default spelled out */
    kvs_policy_model m = {.n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .group = 2, .head_dim = 16, .kv_bytes = 2,
                          .aux_bytes = 4};
    kvs_host_identity id = {.content_hash = "h", .policy = &a, .budget = 16};
    uint64_t s0 = kvs_host_run_seed(&id, &m);
    kvs_host_identity x = id;
    x.policy = &b;
    assert_true(s0 == kvs_host_run_seed(&x, &m)); /* same canonical spec */
    x = id, x.content_hash = "g";
    assert_true(s0 != kvs_host_run_seed(&x, &m));
    x = id, x.content_hash = NULL, id.content_hash = "";
    assert_true(kvs_host_run_seed(&x, &m) == kvs_host_run_seed(&id, &m)); /* NULL is "" */
    id.content_hash = "h";
    x = id, x.budget = 17;
    assert_true(s0 != kvs_host_run_seed(&x, &m));
    x = id, x.codec = "";
    assert_true(s0 == kvs_host_run_seed(&x, &m)); /* no codec, no page: the identity of before */
    x.codec = "int:bits=4";
    assert_true(s0 != kvs_host_run_seed(&x, &m));
    x = id, x.page_tokens = 16;
    assert_true(s0 != kvs_host_run_seed(&x, &m));
    kvs_policy_model m2 = m;
    m2.kv_bytes = 1;
    assert_true(s0 != kvs_host_run_seed(&id, &m2));
    assert_int_equal(kvs_policy_parse("keyformer:noise=none", &b), KVS_OK);
    x = id, x.policy = &b;
    assert_true(s0 != kvs_host_run_seed(&x, &m));
    assert_true(kvs_host_instance_seed(s0, 0, 1) != kvs_host_instance_seed(s0, 1, 0));
    assert_true(kvs_host_instance_seed(s0, 0, 0) != s0);
}

static void test_measure_all_includes_prompt_positions(void **state) {
    (void)state;
    fixture f;
    fixture_make(&f, 2, 64);
    const char *specs[] = {"window"};
    const int64_t budgets[] = {6};
    kvs_replay_result *dec = replay(&f, specs, budgets, 1, KVS_MEASURE_DECODE, 2);
    kvs_replay_result *all = replay(&f, specs, budgets, 1, KVS_MEASURE_ALL, 2);
    int64_t per_pos = f.mem.model.n_heads * f.mem.model.n_layers;
    assert_int_equal(all->runs[0].run_agg.out_err.n, 64 * per_pos);
    assert_int_equal(dec->runs[0].run_agg.out_err.n, (64 - 16 - 16) * per_pos);
    /* Turn 0's prompt is full causal attention (error 0); turn 1's prompt attends to the compressed cache
     * of turn 0 (B-1 = 5 positions) plus its own prompt, so its error is not 0. */
    int saw_turn0 = 0, saw_turn1_err = 0;
    for (int64_t i = 0; i < all->runs[0].n_steps; i++) {
        const kvs_results_step *s = &all->runs[0].steps[i];
        if (s->position < f.turns[0].prompt_end) {
            assert_true(s->out_err == 0.0f);
            assert_int_equal(s->attended_tokens, s->position + 1);
            saw_turn0 = 1;
        }
        if (s->position >= f.turns[1].begin && s->position < f.turns[1].prompt_end) {
            assert_int_equal(s->attended_tokens, 5 + (s->position - f.turns[1].begin) + 1);
            if (s->out_err > 0) saw_turn1_err = 1;
        }
    }
    assert_true(saw_turn0 && saw_turn1_err);
    kvs_replay_result_free(dec);
    kvs_replay_result_free(all);
    fixture_free(&f);
}

static void test_parse_budgets(void **state) {
    (void)state;
    int64_t *b;
    double *fr;
    int n;
    assert_int_equal(kvs_replay_parse_budgets("16,32,64", 50, 100, &b, &fr, &n), KVS_OK);
    assert_int_equal(n, 3);
    assert_int_equal(b[2], 64);
    assert_true(fr[0] == -1);
    free(b);
    free(fr);
    /* percentages are of the prompt (101 positions), whatever the trace's total length */
    assert_int_equal(kvs_replay_parse_budgets("10%,33%,100%", 101, 400, &b, &fr, &n), KVS_OK);
    assert_int_equal(b[0], 11); /* 10.1 rounded up */
    assert_int_equal(b[1], 34); /* 33.33 rounded up */
    assert_int_equal(b[2], 101);
    assert_true(fabs(fr[1] - 0.33) < 1e-12);
    free(b);
    free(fr);
    assert_int_equal(kvs_replay_parse_budgets("10%,33%,100%", 101, 101, &b, &fr, &n), KVS_OK);
    assert_int_equal(b[0], 11); /* the same budgets for a trace that generated nothing more */
    assert_int_equal(b[2], 101);
    free(b);
    free(fr);
    assert_int_equal(kvs_replay_parse_budgets("0.5%", 10, 20, &b, &fr, &n), KVS_OK);
    assert_int_equal(b[0], 1); /* at least one token */
    free(b);
    free(fr);
    assert_int_equal(kvs_replay_parse_budgets("16,0", 60, 100, &b, &fr, &n), KVS_ERR_INVALID_ARG);
    assert_non_null(strstr(kvs_last_error(), "at least 1"));
    assert_int_equal(kvs_replay_parse_budgets("101", 60, 100, &b, &fr, &n), KVS_ERR_INVALID_ARG);
    assert_non_null(strstr(kvs_last_error(), "larger than the trace"));
    assert_int_equal(kvs_replay_parse_budgets("0%", 60, 100, &b, &fr, &n), KVS_ERR_INVALID_ARG);
    assert_int_equal(kvs_replay_parse_budgets("150%", 60, 100, &b, &fr, &n), KVS_ERR_INVALID_ARG);
    assert_int_equal(kvs_replay_parse_budgets("12x", 60, 100, &b, &fr, &n), KVS_ERR_INVALID_ARG);
    assert_int_equal(kvs_replay_parse_budgets("8,,9", 60, 100, &b, &fr, &n), KVS_ERR_INVALID_ARG);
    assert_null(b);
    /* a positive percentage whose fraction underflows to 0 (fuzz_budgets' find, fuzz/corpus/budgets/
     * regress_fraction_underflow.txt): refused, never a fraction of 0; the smallest that divides is taken */
    assert_int_equal(kvs_replay_parse_budgets("3e-323%", 60, 100, &b, &fr, &n), KVS_ERR_INVALID_ARG);
    assert_non_null(strstr(kvs_last_error(), "too small a percentage"));
    assert_null(b);
    assert_int_equal(kvs_replay_parse_budgets("1e-300%", 60, 100, &b, &fr, &n), KVS_OK);
    assert_true(fr[0] > 0 && b[0] == 1);
    free(b);
    free(fr);
}

static void test_validate_rejects_bad_configs(void **state) {
    (void)state;
    fixture f;
    fixture_make(&f, 1, 40);
    kvs_replay_source src;
    assert_int_equal(kvs_replay_source_from_memory(&f.mem, &src), KVS_OK);
    kvs_replay_config c = {.budget = 4, .budget_fraction = -1};
    assert_int_equal(kvs_policy_parse("streaming", &c.policy), KVS_OK); /* sinks=4 needs B > 4 */
    kvs_replay_opts o = {.configs = &c, .n_configs = 1};
    assert_int_equal(kvs_replay_validate(&src, &o), KVS_ERR_INVALID_ARG);
    assert_non_null(strstr(kvs_last_error(), "sinks"));
    c.budget = 41;
    assert_int_equal(kvs_replay_validate(&src, &o), KVS_ERR_INVALID_ARG);
    c.budget = 0;
    assert_int_equal(kvs_replay_validate(&src, &o), KVS_ERR_INVALID_ARG);
    kvs_replay_result dummy;
    kvs_replay_result *r = &dummy; /* must be reset to NULL on failure */
    assert_int_equal(kvs_replay_execute(&src, &o, &r), KVS_ERR_INVALID_ARG);
    assert_null(r);
    fixture_free(&f);
}

/* ---- the CLI ---------------------------------------------------------------------------------------- */

static int run_cli(const char *args) {
    const char *bin = getenv("KVSIM_BIN");
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s %s >/dev/null 2>&1", bin, args);
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static void test_cli_replay_writes_runs_and_rejects_bad_input(void **state) {
    (void)state;
    if (!getenv("KVSIM_BIN")) skip(); /* the test runner exports KVSIM_BIN; run via `make test` */
    char dir[] = "/tmp/kvsim_replay_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char trace[256], db[256], args[1024];
    snprintf(trace, sizeof trace, "%s/t.kvt", dir);
    snprintf(db, sizeof db, "%s/r.db", dir);
    kvs_gen_trace_opts o = kvs_gen_trace_defaults();
    o.n_positions = 48;
    kvs_gen_trace *g;
    assert_int_equal(kvs_gen_trace_create(&o, &g), KVS_OK);
    assert_int_equal(kvs_gen_trace_write(g, trace), KVS_OK);
    kvs_gen_trace_free(g);
    struct stat sb;
    /* validation errors: exit 2, database never created */
    snprintf(args, sizeof args, "replay %s --db %s --policy window --budgets 0", trace, db);
    assert_int_equal(run_cli(args), 2);
    snprintf(args, sizeof args, "replay %s --db %s --policy window --budgets 49", trace, db);
    assert_int_equal(run_cli(args), 2);
    snprintf(args, sizeof args, "replay %s --db %s --policy nope --budgets 8", trace, db);
    assert_int_equal(run_cli(args), 2);
    snprintf(args, sizeof args, "replay %s --db %s --policy h2o:recent=2 --budgets 8", trace, db);
    assert_int_equal(run_cli(args), 2);
    /* a pair the policy rejects (streaming's budget must exceed its 4 sinks) is no usage error: it is recorded as
     * a failed run, exit 1, even when it is the only pair */
    snprintf(args, sizeof args, "replay %s --db %s --policy streaming --budgets 4", trace, db);
    assert_int_equal(run_cli(args), 1);
    assert_int_equal(stat(db, &sb), 0);
    assert_int_equal(unlink(db), 0);
    snprintf(args, sizeof args, "replay %s --db %s --policy window", trace, db);
    assert_int_equal(run_cli(args), 2);
    assert_int_equal(stat(db, &sb), -1);
    /* a good sweep */
    snprintf(args, sizeof args,
             "replay %s --db %s --policy full --policy h2o --policy topk --budgets 8,25%% --threads 2 --series-every 4",
             trace, db);
    assert_int_equal(run_cli(args), 0);
    assert_int_equal(stat(db, &sb), 0);
    off_t size_after = sb.st_size;
    /* a later bad call leaves it as it was */
    snprintf(args, sizeof args, "replay %s --db %s --policy tova:mode=row --budgets 8", trace, db);
    assert_int_equal(run_cli(args), 2);
    assert_int_equal(stat(db, &sb), 0);
    assert_int_equal(sb.st_size, size_after);
    /* a missing trace is a failure (1), not a usage error */
    snprintf(args, sizeof args, "replay %s/missing.kvt --db %s --policy full --budgets 8", dir, db);
    assert_int_equal(run_cli(args), 1);
    snprintf(args, sizeof args, "rm -rf %s", dir);
    assert_int_equal(system(args), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full_and_wide_window_have_zero_error),
        cmocka_unit_test(test_small_window_has_error_and_bounded_storage),
        cmocka_unit_test(test_sweep_equals_individual_runs),
        cmocka_unit_test(test_randomised_policy_seeded_by_run_identity),
        cmocka_unit_test(test_measure_all_includes_prompt_positions),
        cmocka_unit_test(test_parse_budgets),
        cmocka_unit_test(test_validate_rejects_bad_configs),
        cmocka_unit_test(test_cli_replay_writes_runs_and_rejects_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
