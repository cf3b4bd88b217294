/* test_replay_ref.c — the fast replay (sim/replay.c) against the reference replay (sim/replay_ref.c, the executable
 * specification of ../shared/DESIGN.md "Replay" and "Metrics"): every registered policy, and the variants whose
 * parameters choose another code path, at several budgets, must give the same numbers bit for bit — every
 * statistic of every metric of every layer and of the run, the per-step series, the per-head budgets after the
 * allocation pass, the largest attended set and the run's status. The fast replay promises the same bits for all
 * its shortcuts (blocked reference, score memo, reused reference scores, shared output pass, 16-bit history,
 * per-query-head unions, threads), so no tolerance is allowed.
 * Inputs: a GENERATED two-turn trace (tests/util/gen_trace.h: seeded Gaussian q/k/v, not a model) in memory with
 * fp32 K/V, measured at every position (prompt measurement, chunked prefill, turns); the same kind of data written
 * as an fp16 trace file (the fast replay's 16-bit history); and the bundled trace examples/stories260K.kvt, real
 * decoding of the stories260K model captured by kvsim, measured at decode positions. The same comparison runs with
 * codecs (the representation stage) on the generated two-turn trace and the bundled one, and again with page
 * granularity (a paged cache).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "sim/codec.h"
#include "sim/policy.h"
#include "policies/registry.h"
#include "sim/replay.h"
#include "sim/replay_mem.h"
#include "tests/util/gen_trace.h"
#include "tests/util/replay_fixture.h"
#include "tests/util/testenv.h"

/* Every registered policy at its defaults and at every preset of a paper's settings, then variants whose
 * parameters take other paths through the engine (per-query-head vs shared lists, chunked prefill, merging). */
static const char *const extra_specs[] = {
    "h2o:gqa=mean",        "h2o:block=8",        "tova:mode=group,block=8", "topk:gqa=head",
    "keydiff:anchor=raw",  "morphkv:fusion=max", "d2o:merge=none",          "scissorhands:gqa=mean",
    "snapkv:gqa=mean",     "quest:gqa=head",     "sparq:gqa=group",
};
enum { MAX_CONFIGS = 512, MAX_SPECS = 128 };

/* The specs (a variant that stops parsing fails the test: a renamed parameter must not silently drop a case). */
static int all_specs(char specs[][96]) {
    int n = 0;
    for (int i = 0; i < kvs_policy_count(); i++) {
        const struct kvs_policy_ops *ops = kvs_policy_at(i);
        snprintf(specs[n++], 96, "%s", ops->name);
        for (int k = 0; k < ops->n_presets; k++) snprintf(specs[n++], 96, "%s@%s", ops->name, ops->presets[k].name);
    }
    for (size_t i = 0; i < sizeof extra_specs / sizeof *extra_specs; i++) {
        kvs_policy_config c;
        if (kvs_policy_parse(extra_specs[i], &c) != KVS_OK) fail_msg("%s: %s", extra_specs[i], kvs_last_error());
        snprintf(specs[n++], 96, "%s", extra_specs[i]);
    }
    assert_true(n <= MAX_SPECS);
    return n;
}

static void assert_stats_same(const char *what, const kvs_results_agg *a, const kvs_results_agg *b) {
    for (int k = 0; k < KVS_N_METRICS; k++) {
        const kvs_results_stat *x = &a->m[k], *y = &b->m[k];
        const double xs[6] = {(double)x->n, x->mean, x->p50, x->p95, x->min, x->max};
        const double ys[6] = {(double)y->n, y->mean, y->p50, y->p95, y->min, y->max};
        if (memcmp(xs, ys, sizeof xs))
            fail_msg("%s, %s: fast n %.0f mean %.17g p50 %.17g p95 %.17g min %.17g max %.17g; reference n %.0f mean "
                     "%.17g p50 %.17g p95 %.17g min %.17g max %.17g",
                     what, kvs_metric_table[k].name, xs[0], xs[1], xs[2], xs[3], xs[4], xs[5], ys[0], ys[1], ys[2],
                     ys[3], ys[4], ys[5]);
    }
}

static int compare_configs(const kvs_replay_source *src, const kvs_replay_config *cfg, char (*names)[128], int n,
                           kvs_replay_measure measure, int64_t series_every, const kvs_codec *const *codecs,
                           const int64_t *pages);

/* Replays every (spec, budget) pair that the policy accepts through both engines and compares them; @return the
 * number of runs compared that completed. */
static int compare_engines(const kvs_replay_source *src, const int64_t *budgets, int n_budgets,
                           kvs_replay_measure measure, int64_t series_every) {
    static char specs[MAX_SPECS][96];
    int n_specs = all_specs(specs);
    static kvs_replay_config cfg[MAX_CONFIGS];
    static char names[MAX_CONFIGS][128];
    int n = 0;
    for (int s = 0; s < n_specs; s++)
        for (int b = 0; b < n_budgets; b++) {
            kvs_replay_config c = {.budget = budgets[b], .budget_fraction = -1};
            assert_int_equal(kvs_policy_parse(specs[s], &c.policy), KVS_OK);
            if (kvs_policy_validate(&c.policy, &src->model, c.budget) != KVS_OK) continue; /* refused before a run */
            assert_true(n < MAX_CONFIGS);
            snprintf(names[n], sizeof names[n], "%.96s at budget %lld", specs[s], (long long)c.budget);
            cfg[n++] = c;
        }
    return compare_configs(src, cfg, names, n, measure, series_every, NULL, NULL);
}

/* Both engines on cfg[0..n) (names[i] in messages), compared bit for bit; @return the runs that completed. */
static int compare_configs(const kvs_replay_source *src, const kvs_replay_config *cfg, char (*names)[128], int n,
                           kvs_replay_measure measure, int64_t series_every, const kvs_codec *const *codecs,
                           const int64_t *pages) {
    kvs_replay_opts o = {.configs = cfg, .n_configs = n, .threads = 2, .measure = measure, .series_every = series_every,
                         .codecs = codecs, .pages = pages};
    kvs_replay_result *fast = NULL, *ref = NULL;
    assert_int_equal(kvs_replay_execute(src, &o, &fast), KVS_OK);
    assert_int_equal(kvs_replay_reference(src, &o, &ref), KVS_OK);
    size_t per = (size_t)src->model.n_layers * (size_t)src->model.n_kv_heads;
    int complete = 0;
    for (int i = 0; i < n; i++) {
        const kvs_replay_run_result *x = &fast->runs[i], *y = &ref->runs[i];
        if (x->status != y->status)
            fail_msg("%s: fast status %s (%s), reference %s (%s)", names[i], kvs_strerror(x->status), x->error,
                     kvs_strerror(y->status), y->error);
        if (x->status != KVS_OK) continue;
        complete++;
        assert_memory_equal(x->budgets, y->budgets, per * sizeof *x->budgets);
        assert_int_equal(x->max_attended, y->max_attended);
        assert_int_equal(x->n_layers, y->n_layers);
        char what[256];
        for (int l = 0; l < x->n_layers; l++) {
            snprintf(what, sizeof what, "%.96s, layer %d", names[i], l);
            assert_stats_same(what, &x->layer_aggs[l], &y->layer_aggs[l]);
        }
        snprintf(what, sizeof what, "%.96s, whole run", names[i]);
        assert_stats_same(what, &x->run_agg, &y->run_agg);
        assert_int_equal(x->n_steps, y->n_steps);
        for (int64_t k = 0; k < x->n_steps; k++)
            if (x->steps[k].layer != y->steps[k].layer || x->steps[k].q_head != y->steps[k].q_head ||
                x->steps[k].position != y->steps[k].position ||
                memcmp(x->steps[k].v, y->steps[k].v, sizeof x->steps[k].v))
                fail_msg("%s: series sample %lld differs", names[i], (long long)k);
    }
    kvs_replay_result_free(fast);
    kvs_replay_result_free(ref);
    return complete;
}

/* Two turns, four query heads a KV head, fp32 K/V in memory, every position measured. */
/* The generated two-turn trace every position of which is measured (f freed by the caller). */
static void two_turns_source(kvs_test_replay_fixture *f, kvs_replay_source *src) {
    kvs_gen_trace_opts go = kvs_test_grouped_opts(2, 4, 96, -1, 16, 7);
    assert_int_equal(kvs_test_replay_fixture_make(&go, 4, 11, f), KVS_OK);
    assert_int_equal(kvs_replay_source_from_memory(&f->mem, src), KVS_OK);
    snprintf(src->content_hash, sizeof src->content_hash, "generated-two-turns");
}

/* The bundled trace's comparisons (495 positions, every registered policy, both engines) are the suite's longest;
 * under the sanitizers the generated traces above take every engine path (memory errors do not depend on the
 * data) and the real trace's bit-for-bit comparisons run in the plain suite. */
#define SKIP_REAL_TRACE_UNDER_SANITIZERS()                                                                       \
    do {                                                                                                        \
        if (kvs_test_sanitized()) {                                                                             \
            print_message("the bundled trace under the sanitizers: its comparison runs in the plain suite\n"); \
            skip();                                                                                             \
        }                                                                                                       \
    } while (0)

/* Real decoding: the bundled trace of the stories260K model (closed by the caller). */
static kvs_trace *bundled_source(kvs_replay_source *src) {
    char path[4096];
    snprintf(path, sizeof path, "%s/examples/stories260K.kvt", kvs_test_root());
    kvs_trace *t = NULL;
    assert_int_equal(kvs_trace_open(path, &t), KVS_OK);
    assert_int_equal(kvs_replay_source_from_trace(t, src), KVS_OK);
    return t;
}

static void test_generated_two_turns_every_position(void **state) {
    (void)state;
    kvs_test_replay_fixture f;
    kvs_replay_source src;
    two_turns_source(&f, &src);
    const int64_t budgets[] = {6, 13, 30};
    int complete = compare_engines(&src, budgets, 3, KVS_MEASURE_ALL, 5);
    assert_true(complete >= 50);
    kvs_test_replay_fixture_free(&f);
}

/* The same kind of data written as an fp16 trace: the fast replay keeps a 16-bit history for its kernels. */
static void test_generated_fp16_trace(void **state) {
    (void)state;
    char dir[] = "/tmp/kvs_replay_ref_XXXXXX", path[128];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/t16.kvt", dir);
    kvs_gen_trace_opts go = kvs_test_grouped_opts(1, 2, 80, 40, 16, 11);
    go.dtype = KVS_DTYPE_F16;
    kvs_gen_trace *g = NULL;
    assert_int_equal(kvs_gen_trace_create(&go, &g), KVS_OK);
    assert_int_equal(kvs_gen_trace_write(g, path), KVS_OK);
    kvs_gen_trace_free(g);
    kvs_trace *t = NULL;
    assert_int_equal(kvs_trace_open(path, &t), KVS_OK);
    kvs_replay_source src;
    assert_int_equal(kvs_replay_source_from_trace(t, &src), KVS_OK);
    assert_int_equal(src.kv_dtype, KVS_DTYPE_F16);
    const int64_t budgets[] = {8, 21};
    int complete = compare_engines(&src, budgets, 2, KVS_MEASURE_DECODE, 0);
    assert_true(complete >= 30);
    kvs_trace_close(t);
    unlink(path);
    rmdir(dir);
}

/* Real decoding: the bundled trace of the stories260K model. */
static void test_bundled_real_trace(void **state) {
    (void)state;
    SKIP_REAL_TRACE_UNDER_SANITIZERS();
    kvs_replay_source src;
    kvs_trace *t = bundled_source(&src);
    const int64_t budgets[] = {24};
    int complete = compare_engines(&src, budgets, 1, KVS_MEASURE_DECODE, 7);
    assert_true(complete >= 20);
    kvs_trace_close(t);
}

/* With codecs (sim/codec.h, the representation stage): policies taking each of the fast replay's paths (one shared
 * list, per-query-head lists, merged slots, a chunked prefill, an oracle, the full cache) under every codec kind
 * (think's channels scored with the first prompt's queries from its last prefill block, in each engine), on both
 * engines, bit for bit; @return the runs that completed. */
static int compare_codecs(const kvs_replay_source *src, const int64_t *budgets, int n_budgets,
                          kvs_replay_measure measure, int64_t series_every) {
    static const char *const specs[] = {"full", "window", "h2o", "snapkv", "quest:gqa=head", "d2o", "h2o:block=8",
                                        "topk", "tova:mode=group,block=8"};
    static const char *const codec_specs[] = {"int:bits=4", "kivi", "kivi:bits=4,group=4,residual=8",
                                              "int:bits=2,group=8,k_axis=channel,v_axis=token", "hf:bits=2,residual=5",
                                              "fp8:scale=prompt,per=tensor", "think:ratio=0.5,window=8,recent=4"};
    enum { N_CODECS = sizeof codec_specs / sizeof *codec_specs };
    kvs_codec *codecs[N_CODECS];
    for (int k = 0; k < N_CODECS; k++) assert_int_equal(kvs_codec_parse(codec_specs[k], &codecs[k]), KVS_OK);
    static kvs_replay_config cfg[MAX_CONFIGS];
    static const kvs_codec *cfg_codec[MAX_CONFIGS];
    static char names[MAX_CONFIGS][128];
    int n = 0;
    for (size_t s = 0; s < sizeof specs / sizeof *specs; s++)
        for (int k = 0; k < N_CODECS; k++)
            for (int b = 0; b < n_budgets; b++) {
                kvs_replay_config c = {.budget = budgets[b], .budget_fraction = -1};
                assert_int_equal(kvs_policy_parse(specs[s], &c.policy), KVS_OK);
                if (kvs_policy_validate(&c.policy, &src->model, c.budget) != KVS_OK) continue;
                assert_true(n < MAX_CONFIGS);
                snprintf(names[n], sizeof names[n], "%.40s [%.60s] at budget %lld", specs[s], codec_specs[k],
                         (long long)c.budget);
                cfg_codec[n] = codecs[k];
                cfg[n++] = c;
            }
    int complete = compare_configs(src, cfg, names, n, measure, series_every, cfg_codec, NULL);
    print_message("%d of %d configurations with a codec completed on both engines\n", complete, n);
    for (int k = 0; k < N_CODECS; k++) kvs_codec_free(codecs[k]);
    return complete;
}

static void test_codecs_two_turns_every_position(void **state) {
    (void)state;
    kvs_test_replay_fixture f;
    kvs_replay_source src;
    two_turns_source(&f, &src);
    const int64_t budgets[] = {6, 30};
    int complete = compare_codecs(&src, budgets, 2, KVS_MEASURE_ALL, 5);
    assert_int_equal(complete, 126); /* every configuration of every codec kind completes */
    kvs_test_replay_fixture_free(&f);
}

static void test_codecs_bundled_real_trace(void **state) {
    (void)state;
    SKIP_REAL_TRACE_UNDER_SANITIZERS();
    kvs_replay_source src;
    kvs_trace *t = bundled_source(&src);
    const int64_t budgets[] = {24};
    int complete = compare_codecs(&src, budgets, 1, KVS_MEASURE_DECODE, 7);
    assert_int_equal(complete, 63); /* every configuration of every codec kind completes */
    kvs_trace_close(t);
}

/* With page granularity (sim/host.h "page granularity"): policies taking each path of the paged step (one shared list,
 * per-query-head lists, merged slots, a prompt-only budget, an oracle, the full cache, a layer-wide policy) at pages
 * of 1, 4 and 16 positions, on both engines, bit for bit; @return the runs that completed. */
static int compare_pages(const kvs_replay_source *src, const int64_t *budgets, int n_budgets,
                         kvs_replay_measure measure, int64_t series_every) {
    static const char *const specs[] = {"full", "window", "h2o", "h2o:gqa=mean", "snapkv", "quest:gqa=head", "d2o",
                                        "topk", "topk:gqa=head", "tova:mode=group,block=8", "streaming"};
    static const int64_t page_sizes[] = {1, 4, 16};
    static kvs_replay_config cfg[MAX_CONFIGS];
    static int64_t cfg_page[MAX_CONFIGS];
    static char names[MAX_CONFIGS][128];
    int n = 0;
    for (size_t s = 0; s < sizeof specs / sizeof *specs; s++)
        for (size_t k = 0; k < sizeof page_sizes / sizeof *page_sizes; k++)
            for (int b = 0; b < n_budgets; b++) {
                kvs_replay_config c = {.budget = budgets[b], .budget_fraction = -1};
                assert_int_equal(kvs_policy_parse(specs[s], &c.policy), KVS_OK);
                if (kvs_policy_validate(&c.policy, &src->model, c.budget) != KVS_OK) continue;
                assert_true(n < MAX_CONFIGS);
                snprintf(names[n], sizeof names[n], "%.40s [page %lld] at budget %lld", specs[s],
                         (long long)page_sizes[k], (long long)c.budget);
                cfg_page[n] = page_sizes[k];
                cfg[n++] = c;
            }
    int complete = compare_configs(src, cfg, names, n, measure, series_every, NULL, cfg_page);
    print_message("%d of %d paged configurations completed on both engines\n", complete, n);
    return complete;
}

static void test_pages_two_turns_every_position(void **state) {
    (void)state;
    kvs_test_replay_fixture f;
    kvs_replay_source src;
    two_turns_source(&f, &src);
    const int64_t budgets[] = {6, 30};
    int complete = compare_pages(&src, budgets, 2, KVS_MEASURE_ALL, 5);
    assert_int_equal(complete, 66); /* every configuration at every page size completes */
    kvs_test_replay_fixture_free(&f);
}

static void test_pages_bundled_real_trace(void **state) {
    (void)state;
    SKIP_REAL_TRACE_UNDER_SANITIZERS();
    kvs_replay_source src;
    kvs_trace *t = bundled_source(&src);
    const int64_t budgets[] = {40};
    int complete = compare_pages(&src, budgets, 1, KVS_MEASURE_DECODE, 7);
    assert_int_equal(complete, 33);
    kvs_trace_close(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_generated_two_turns_every_position),
        cmocka_unit_test(test_generated_fp16_trace),
        cmocka_unit_test(test_bundled_real_trace),
        cmocka_unit_test(test_codecs_two_turns_every_position),
        cmocka_unit_test(test_codecs_bundled_real_trace),
        cmocka_unit_test(test_pages_two_turns_every_position),
        cmocka_unit_test(test_pages_bundled_real_trace),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
