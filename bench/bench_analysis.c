/* bench_analysis.c — throughput of the trace analyses built on trace/kv_stream.h: `kvsim drift` (analysis/drift.h,
 * SyncKV §3.1-3.2), with and without its results writer (results/results_drift.h).
 *
 * Data sources, each labelled in the output: GENERATED Gaussian numbers (tests/util/gen_trace.h: not a model's)
 * at a size where the analysis, not the stream's attention, is measured separately from it; then the bundled
 * real trace examples/stories260K.kvt (KVSIM_ROOT locates it) through analysis + SQLite, what `kvsim drift` does.
 * Reported: decode steps x query heads per second (one "unit-step" = one head's top-k sets for every k of the
 * sweep, its overlaps, mass and locality), positions streamed per second, and the wall time. A benchmark, not a
 * test: numbers go to stdout and nothing is asserted.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "analysis/drift.h"
#include "common/kvs.h"
#include "results/results_drift.h"
#include "tests/util/gen_trace.h"

#define CHECK(expr)                                                                                              \
    do {                                                                                                         \
        kvs_status st_ = (expr);                                                                                 \
        if (st_ != KVS_OK) {                                                                                     \
            fprintf(stderr, "bench_analysis: %s failed: %s (%s)\n", #expr, kvs_strerror(st_), kvs_last_error()); \
            exit(1);                                                                                             \
        }                                                                                                        \
    } while (0)

static kvs_status count_step(void *ctx, const kvs_drift_step *r) {
    (void)r;
    ++*(int64_t *)ctx;
    return KVS_OK;
}

static kvs_status put_step(void *ctx, const kvs_drift_step *r) { return kvs_results_drift_put_step(ctx, r); }
static kvs_status put_loc(void *ctx, const kvs_drift_locality *r) { return kvs_results_drift_put_locality(ctx, r); }
static kvs_status put_lu(void *ctx, const kvs_drift_locality_unit *r) { return kvs_results_drift_put_locality_unit(ctx, r); }

static void row(const char *what, const kvs_trace *t, const kvs_drift_opts *o, double el) {
    const kvs_trace_info *info = kvs_trace_info_get(t);
    const double steps = (double)(info->turns[0].end - info->turns[0].prompt_end);
    const double units = (double)info->model.n_layers * info->model.n_heads;
    printf("%-44s %6d ks %9.0f head-steps/s %9.0f positions/s (all layers x KV heads) %7.3f s\n", what, (int)o->n_k,
           steps * units / el, (double)info->turns[0].end * info->model.n_layers * info->model.n_kv_heads / el, el);
}

int main(void) {
    char dir[] = "/tmp/kvs_bench_analysis_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    char path[128], db_path[128];
    snprintf(path, sizeof path, "%s/g.kvt", dir);
    snprintf(db_path, sizeof db_path, "%s/r.db", dir);
    kvs_gen_trace_opts go = kvs_gen_trace_defaults();
    go.n_layers = 2, go.n_heads = 8, go.n_kv_heads = 2, go.head_dim = 32;
    go.n_positions = 1536, go.prompt_len = 512, go.block_positions = 64, go.q_scale = 2.0f;
    kvs_gen_trace *g = NULL;
    CHECK(kvs_gen_trace_create(&go, &g));
    CHECK(kvs_gen_trace_write(g, path));
    kvs_gen_trace_free(g);
    kvs_trace *t = NULL;
    CHECK(kvs_trace_open(path, &t));
    printf("kvsim drift analysis, GENERATED data (not a model's): 2 layers, 8 query heads, 2 KV heads, d 32, prompt "
           "512, 1024 decode steps, window 32, delta-max 16, both prefill scores, no database:\n");
    const int64_t ks1[] = {64}, ks8[] = {4, 8, 16, 32, 64, 128, 240};
    kvs_drift_opts o = {.k = ks1, .n_k = 1, .scores = KVS_DRIFT_SCORE_WINDOW | KVS_DRIFT_SCORE_LAST, .window = 32,
                        .delta_max = 16};
    int64_t n = 0;
    kvs_drift_sink count = {.ctx = &n, .step = count_step};
    double t0 = kvs_now_s();
    CHECK(kvs_analysis_drift_run(t, &o, &count));
    row("  k = 64", t, &o, kvs_now_s() - t0);
    o.k = ks8, o.n_k = 7;
    t0 = kvs_now_s();
    CHECK(kvs_analysis_drift_run(t, &o, &count));
    row("  k sweep 4..240", t, &o, kvs_now_s() - t0);
    kvs_trace_close(t);

    const char *root = getenv("KVSIM_ROOT");
    char real[1024];
    snprintf(real, sizeof real, "%s/examples/stories260K.kvt", root && root[0] ? root : ".");
    if (kvs_trace_open(real, &t) == KVS_OK) {
        printf("real trace %s (stories260K, 239 prompt + 256 decode steps), default sweep, analysis + results "
               "database (one transaction):\n",
               real);
        const kvs_trace_info *info = kvs_trace_info_get(t);
        int64_t ks[KVS_DRIFT_MAX_KS];
        o.n_k = kvs_analysis_drift_default_ks(info, o.scores, 32, ks, KVS_DRIFT_MAX_KS);
        o.k = ks;
        kvs_results_db *db = NULL;
        kvs_results_drift_writer *w = NULL;
        t0 = kvs_now_s();
        CHECK(kvs_results_open(db_path, &db));
        const kvs_results_trace rt = kvs_results_trace_of(real, info);
        const kvs_results_drift_params pr = {.prompt_len = info->turns[0].prompt_end,
                                             .n_steps = info->turns[0].end - info->turns[0].prompt_end,
                                             .window = 32, .delta_max = 16, .scores = o.scores, .k = ks, .n_k = o.n_k};
        CHECK(kvs_results_drift_begin(db, &rt, &pr, &w));
        kvs_drift_sink sink = {.ctx = w, .step = put_step, .locality = put_loc, .locality_unit = put_lu};
        CHECK(kvs_analysis_drift_run(t, &o, &sink));
        CHECK(kvs_results_drift_commit(w, NULL));
        kvs_results_close(db);
        row("  with the results writer", t, &o, kvs_now_s() - t0);
        kvs_trace_close(t);
    } else printf("(no %s: the real-trace row is skipped)\n", real);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : 1;
}
