/* test_plan_time.c — time in capacity plans (analysis/plan_time.h, `kvsim plan --hw`): the GPU presets' datasheet
 * figures, hand-computed rooflines (batch-1 decode of Llama-3.1-8B in bf16 on an H100 SXM = 3.35e12 / weight bytes
 * tokens/s; the prefill's FLOPs; the compute-bound plateau; tensor parallelism's all-reduces; an offloading
 * policy's PCIe time), a measured profile's reads against its storage (Quest stores every position and reads a
 * budget), the CLI's text, CSV, JSON, database rows and plot against the library, examples/capacity.sh's latency
 * table recomputed from its database, and bad input.
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

#include "analysis/plan.h"
#include "analysis/plan_time.h"
#include "results/results_plan.h"
#include "tests/util/cli_run.h"
#include "tests/util/testenv.h"

/* a == b to 1e-12 relative */
static int near(double a, double b) { return fabs(a - b) <= 1e-12 * fabs(b); }

static kvs_plan_setup llama8b(void) {
    const kvs_plan_model *m = NULL;
    assert_int_equal(kvs_plan_preset_find("Llama-3.1-8B", &m), KVS_OK);
    kvs_plan_setup s = {.model = *m, .kv_elem_bytes = 2, .weight_elem_bytes = 2, .n_gpus = 1};
    return s;
}

static kvs_plan_time_setup on(const char *gpu) {
    kvs_plan_time_setup t = {.mbu = 1, .mfu = 1};
    assert_int_equal(kvs_plan_hw_find(gpu, &t.hw), KVS_OK);
    return t;
}

/* Llama-3.1-8B's weights from its shape, by hand: per layer q 4096², k and v 4096·1024 each, o 4096², MLP 3·4096·
 * 14336, two norms of 4096; 32 layers; embedding and classifier 128256·4096 each (untied); the final norm. */
static double llama8b_params(void) {
    const double h = 4096, kv = 1024, f = 14336, v = 128256;
    return 32 * (h * h + 2 * h * kv + h * h + 3 * h * f + 2 * h) + 2 * v * h + h;
}

/* ---- presets ---- */
static void test_presets_datasheet_figures(void **state) {
    (void)state;
    const struct {
        const char *name;
        double mem, bw, f16, f8;
    } want[] = {{"A100-40GB-SXM", 40e9, 1555e9, 312e12, 0},      {"A100-80GB-SXM", 80e9, 2039e9, 312e12, 0},
                {"H100-SXM", 80e9, 3.35e12, 989.5e12, 1979e12},   {"H100-PCIe", 80e9, 2.0e12, 756.5e12, 1513e12},
                {"H200", 141e9, 4.8e12, 989.5e12, 1979e12},       {"L40S", 48e9, 864e9, 362.05e12, 733e12},
                {"RTX-4090", 24e9, 1008e9, 165.2e12, 330.3e12},   {"MI300X", 192e9, 5.3e12, 1307.4e12, 2614.9e12}};
    assert_int_equal(kvs_plan_hw_count(), (int)(sizeof want / sizeof want[0]));
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        kvs_plan_hw h;
        assert_int_equal(kvs_plan_hw_find(want[i].name, &h), KVS_OK);
        assert_true(near(h.mem_bytes, want[i].mem) && near(h.hbm_bw, want[i].bw) && near(h.flops16, want[i].f16));
        assert_true(want[i].f8 == 0 ? h.flops8 == 0 : near(h.flops8, want[i].f8));
        assert_true(h.host_bw > 0 && h.link_bw > 0 && h.source[0]);
    }
    kvs_plan_hw h;
    assert_int_equal(kvs_plan_hw_find("h100-sxm", &h), KVS_OK); /* case-insensitive */
    assert_int_equal(kvs_plan_hw_find("B200", &h), KVS_ERR_INVALID_ARG);
    assert_non_null(strstr(kvs_last_error(), "unknown GPU 'B200' (kvsim plan --list-hw"));
}

/* ---- the figure: batch-1 decode of Llama-3.1-8B bf16 on an H100 SXM ---- */
static void test_h100_batch1_decode_by_hand(void **state) {
    (void)state;
    kvs_plan_setup s = llama8b();
    kvs_plan_time_setup t = on("H100-SXM");
    const double W = 2 * llama8b_params();
    assert_true(W == kvs_plan_weight_bytes(&s));
    assert_true(fabs(W - 16.06e9) < 0.005e9); /* ~16.06e9 bytes */
    /* nothing resident (a constant budget of 0): the weights alone, 3.35e12 / W tokens/s, ~208.6 */
    kvs_plan_policy none = {.kind = KVS_PLAN_CONSTANT, .budget = 0};
    kvs_plan_timing r;
    assert_int_equal(kvs_plan_time(&s, &t, &none, 1, 0, 1, &r), KVS_OK);
    assert_true(near(r.tokens_per_s, 3.35e12 / W));
    assert_true(r.tokens_per_s > 208.5 && r.tokens_per_s < 208.7);
    assert_false(r.decode_compute_bound);
    /* the full cache at context 1, response 1: one step at n = 2 reads 2 positions x 131072 bytes (2 x 32 layers x
     * 8 KV heads x 128 x 2 bytes) beside the weights */
    kvs_plan_policy full = {.kind = KVS_PLAN_FULL};
    assert_int_equal(kvs_plan_time(&s, &t, &full, 1, 1, 1, &r), KVS_OK);
    assert_true(near(r.tokens_per_s, 3.35e12 / (W + 2 * 131072.0)));
    /* at mbu 0.5 the memory time doubles */
    t.mbu = 0.5;
    assert_int_equal(kvs_plan_time(&s, &t, &none, 1, 0, 1, &r), KVS_OK);
    assert_true(near(r.tokens_per_s, 0.5 * 3.35e12 / W));
    /* TPOT over a response of 4 at context 100, full cache: the mean of the steps at n = 101..104 */
    t.mbu = 1;
    assert_int_equal(kvs_plan_time(&s, &t, &full, 100, 4, 1, &r), KVS_OK);
    double want = 0;
    for (int n = 101; n <= 104; n++) want += (W + n * 131072.0) / 3.35e12 / 4;
    assert_true(near(r.tpot, want));
}

/* ---- per layer: one layer's weights and reads; the rest is the classifier and the embedding ---- */
static void test_per_layer(void **state) {
    (void)state;
    kvs_plan_setup s = llama8b();
    kvs_plan_time_setup t = on("H100-SXM");
    const double layer = 2 * 4096.0 * 4096 + 2 * 4096.0 * 1024 + 3 * 4096.0 * 14336 + 2 * 4096;
    assert_true(kvs_plan_layer_params(&s.model) == layer);
    kvs_plan_policy full = {.kind = KVS_PLAN_FULL};
    /* batch 2 at n = 1000: a layer's weights + 2 sequences x 8 KV heads x 1000 positions x 512 bytes */
    kvs_plan_phase ph = kvs_plan_decode_step(&s, &t, &full, 500, 1000, 2);
    assert_true(near(ph.layer_bytes, 2 * layer + 2 * 8 * 1000 * 512.0));
    assert_true(near(ph.layer_seconds, ph.layer_bytes / 3.35e12));
    /* the rest: embedding and classifier (2 x 128256 x 4096 x 2 bytes) and the final norm, read once */
    assert_true(near(ph.seconds - 32 * ph.layer_seconds, (2 * 128256.0 * 4096 + 4096) * 2 / 3.35e12));
}

/* ---- prefill: matmul + causal attention FLOPs against the tensor rate ---- */
static void test_prefill_by_hand(void **state) {
    (void)state;
    kvs_plan_setup s = llama8b();
    kvs_plan_time_setup t = on("H100-SXM");
    const double Pm = llama8b_params() - 128256.0 * 4096, P = 4096;
    assert_true(kvs_plan_matmul_params(&s.model) == Pm);
    /* 2 FLOPs per parameter per token; QK^T and PV: 2 x 2 x 128 per attended pair, P(P+1)/2 pairs, 32 heads x 32
     * layers */
    const double flops = 2 * Pm * P + 32.0 * 32 * 4 * 128 * P * (P + 1) / 2;
    kvs_plan_phase ph = kvs_plan_prefill(&s, &t, 4096, 1);
    assert_true(near(ph.flops, flops));
    /* activations: per token per layer 4h + 2q + 2kv + 3f elements, 2 bytes */
    assert_true(near(ph.bytes, 2 * llama8b_params() + P * 32 * (4 * 4096 + 2 * 4096 + 2 * 1024 + 3 * 14336) * 2.0));
    assert_true(ph.compute_bound);
    assert_true(near(ph.seconds, flops / 989.5e12));
    kvs_plan_policy full = {.kind = KVS_PLAN_FULL};
    kvs_plan_timing r;
    assert_int_equal(kvs_plan_time(&s, &t, &full, 4096, 16, 1, &r), KVS_OK);
    assert_true(near(r.ttft, flops / 989.5e12));
    /* fp8 weights run at the fp8 rate, twice as fast */
    s.weight_elem_bytes = 1;
    assert_true(near(kvs_plan_prefill(&s, &t, 4096, 1).seconds, flops / 1979e12));
    /* an A100 has no fp8: its bf16 rate */
    kvs_plan_time_setup a = on("A100-80GB-SXM");
    assert_true(near(kvs_plan_prefill(&s, &a, 4096, 1).seconds, flops / 312e12));
}

/* ---- the compute-bound plateau: tokens/s stops growing at F / (2 Pm) ---- */
static void test_decode_plateau(void **state) {
    (void)state;
    kvs_plan_setup s = llama8b();
    kvs_plan_time_setup t = on("H100-SXM");
    const double Pm = kvs_plan_matmul_params(&s.model), W = kvs_plan_weight_bytes(&s);
    kvs_plan_policy none = {.kind = KVS_PLAN_CONSTANT, .budget = 0};
    /* crossover where b 2 Pm / F = W / BW: b* = W F / (BW 2 Pm) ~ 316 */
    const double bstar = W * 989.5e12 / (3.35e12 * 2 * Pm);
    assert_true(bstar > 256 && bstar < 512);
    assert_false(kvs_plan_decode_step(&s, &t, &none, 1, 2, 256).compute_bound);
    kvs_plan_phase ph = kvs_plan_decode_step(&s, &t, &none, 1, 2, 512);
    assert_true(ph.compute_bound);
    assert_true(near(512 / ph.seconds, 989.5e12 / (2 * Pm)));
}

/* ---- tensor parallelism: weights and KV heads split, two ring all-reduces per layer ---- */
static void test_tensor_parallel(void **state) {
    (void)state;
    kvs_plan_setup s = llama8b();
    s.n_gpus = 2;
    kvs_plan_time_setup t = on("H100-SXM");
    kvs_plan_policy full = {.kind = KVS_PLAN_FULL};
    const double W = kvs_plan_weight_bytes(&s);
    kvs_plan_phase ph = kvs_plan_decode_step(&s, &t, &full, 1000, 1000, 8);
    /* per GPU: half the weights, 4 of the 8 KV heads of 8 sequences at 1000 positions (512 bytes each) */
    assert_true(near(ph.t_memory, (W / 2 + 8 * 32 * 4 * 1000 * 512.0) / 3.35e12));
    /* 2 x 32 all-reduces of 8 tokens x 4096 x 2 bytes, each 2 (2-1)/2 x S over 450 GB/s */
    assert_true(near(ph.t_comm, 64 * (8 * 4096 * 2.0) / 450e9));
    /* a GPU each for fewer KV heads than GPUs: each holds one whole head (16 GPUs, 8 heads) */
    s.n_gpus = 16;
    ph = kvs_plan_decode_step(&s, &t, &full, 1000, 1000, 8);
    assert_true(near(ph.t_memory, (W / 16 + 8 * 32 * 1 * 1000 * 512.0) / 3.35e12));
}

/* ---- an offloading policy: its host transfers over PCIe, on the critical path ---- */
static void test_offload_pcie(void **state) {
    (void)state;
    kvs_plan_setup s = llama8b();
    kvs_plan_time_setup t = on("H100-PCIe");
    kvs_plan_policy off = {.kind = KVS_PLAN_OFFLOAD, .budget = 64}, con = {.kind = KVS_PLAN_CONSTANT, .budget = 64};
    kvs_plan_phase a = kvs_plan_decode_step(&s, &t, &off, 4096, 5000, 4);
    kvs_plan_phase b = kvs_plan_decode_step(&s, &t, &con, 4096, 5000, 4);
    /* 4 sequences x 32 layers x 8 KV heads x (64 + 1) tokens x 512 bytes over 64 GB/s */
    assert_true(near(a.t_pcie, 4 * 32 * 8 * 65 * 512.0 / 64e9));
    assert_true(b.t_pcie == 0);
    assert_true(near(a.seconds - b.seconds, a.t_pcie));
}

/* ---- a GPU file ---- */
static void test_hw_file(void **state) {
    (void)state;
    char dir[] = "/tmp/kvs_plan_time_XXXXXX", path[96];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/gpu.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"name\": \"toy\", \"memory_gb\": 10, \"hbm_tb_s\": 1, \"bf16_tflops\": 100, \"host_gb_s\": 16}", f);
    fclose(f);
    kvs_plan_hw h;
    assert_int_equal(kvs_plan_hw_resolve(path, &h), KVS_OK);
    assert_string_equal(h.name, "toy");
    assert_true(h.mem_bytes == 10e9 && h.hbm_bw == 1e12 && h.flops16 == 100e12 && h.flops8 == 0);
    assert_true(h.host_bw == 16e9 && h.link_bw == 16e9); /* no link given: over the host link */
    f = fopen(path, "w");
    fputs("{\"name\": \"toy\", \"memory_gb\": 10, \"bf16_tflops\": 100, \"host_gb_s\": 16}", f);
    fclose(f);
    assert_int_equal(kvs_plan_hw_resolve(path, &h), KVS_ERR_FORMAT);
    assert_non_null(strstr(kvs_last_error(), "hbm_tb_s is missing"));
    f = fopen(path, "w");
    fputs("{\"memory_gb\": 10, \"hbm_tb_s\": -1, \"bf16_tflops\": 100, \"host_gb_s\": 16}", f);
    fclose(f);
    assert_int_equal(kvs_plan_hw_resolve(path, &h), KVS_ERR_FORMAT);
    assert_non_null(strstr(kvs_last_error(), "hbm_tb_s must be a positive number"));
    remove(path);
    rmdir(dir);
    /* an efficiency factor outside (0, 1] */
    kvs_plan_setup s = llama8b();
    kvs_plan_time_setup t = on("L40S");
    t.mfu = 1.5;
    kvs_plan_policy full = {.kind = KVS_PLAN_FULL};
    kvs_plan_timing r;
    assert_int_equal(kvs_plan_time(&s, &t, &full, 1, 0, 1, &r), KVS_ERR_INVALID_ARG);
}

/* ---- the CLI ---- */
typedef kvs_test_cli_fx cli_fx;
static int run(cli_fx *f, const char *const *args) { return kvs_test_cli_run(f, args); }
static void expect_out(cli_fx *f, const char *needle) { assert_true(kvs_test_file_has(f->out, needle)); }
static void expect_err(cli_fx *f, const char *needle) { assert_true(kvs_test_file_has(f->err, needle)); }

/* field `col` (0-based) of the CSV row of series `id` at (context, response, batch) in the last run's output; NAN
 * when absent */
static double csv_at(cli_fx *f, const char *id, long long context, long long response, long long batch, int col) {
    char *t = kvs_test_slurp(f->out, NULL), *save = NULL;
    double v = NAN;
    for (char *line = strtok_r(t, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *fld[32];
        if (kvs_test_csv_fields(line, fld, 32) < 23 || strcmp(fld[1], id) || atoll(fld[4]) != context ||
            atoll(fld[5]) != response || atoll(fld[6]) != batch)
            continue;
        v = atof(fld[col]);
    }
    free(t);
    return v;
}

static void test_cli_time(void **state) {
    cli_fx *f = *state;
    if (!kvs_test_kvsim_bin()) skip();
    const char *txt[] = {"plan", "--model", "Llama-3.1-8B", "--hw", "H100-SXM", "--context", "1", "--response", "1",
                         "--kv-dtype", "bf16", "--weights", "bf16", NULL};
    assert_int_equal(run(f, txt), 0);
    expect_out(f, "time on 1 x H100-SXM: HBM 3.35 TB/s x mbu 1, bf16 tensor 989.5 TFLOP/s x mfu 1");
    /* 3.35e12 / (16060522496 + 2 x 131072) = 208.58 */
    expect_out(f, "4.794 ms        208.6");
    /* CSV: the time columns after the plan's, the sweep rows; the library's numbers */
    const char *csv[] = {"plan", "--model", "Llama-3.1-8B", "--hw", "H100-SXM", "--context", "1024", "--response",
                         "1024", "--batch", "4", "--csv", NULL};
    assert_int_equal(run(f, csv), 0);
    expect_out(f, ",context_clamped,kv,kv_bytes_per_token,ttft_s,tpot_s,tokens_per_s,prefill_bound,decode_bound,"
                  "best_batch\n");
    kvs_plan_setup s = llama8b();
    s.gpu_bytes = 80e9;
    kvs_plan_time_setup t = on("H100-SXM");
    kvs_plan_policy full = {.kind = KVS_PLAN_FULL};
    kvs_plan_timing r;
    for (long long b = 1; b <= 64; b *= 4) {
        assert_int_equal(kvs_plan_time(&s, &t, &full, 1024, 1024, b, &r), KVS_OK);
        assert_true(fabs(csv_at(f, "full", 1024, 1024, b, 19) - r.tokens_per_s) <= 1e-9 * r.tokens_per_s);
        assert_true(fabs(csv_at(f, "full", 1024, 1024, b, 17) - r.ttft) <= 1e-9 * r.ttft);
    }
    /* the best batch: the largest that fits (tokens/s grows with the batch while memory-bound); the max batch at
     * 2048 tokens per sequence is (80e9 - W) / (2048 x 131072) */
    kvs_plan_point p;
    assert_int_equal(kvs_plan_eval(&s, &full, 1024, 1024, 1, &p), KVS_OK);
    assert_true(p.max_batch == (int64_t)floor((80e9 - kvs_plan_weight_bytes(&s)) / (2048 * 131072.0)));
    assert_true(csv_at(f, "full", 1024, 1024, 4, 22) == (double)p.max_batch);
    assert_false(isnan(csv_at(f, "full", 1024, 1024, p.max_batch, 19)));
    /* JSON, the database, the plot */
    char db[160], svg[160];
    snprintf(db, sizeof db, "%s/p.db", f->dir);
    snprintf(svg, sizeof svg, "%s/t.svg", f->dir);
    const char *js[] = {"plan", "--model", "Llama-3.1-8B", "--hw", "H100-SXM", "--mbu", "0.8", "--context", "1024",
                        "--response", "1024", "--batches", "1,8,5000", "--json", "--db", db, "--plot-throughput", svg,
                        NULL};
    assert_int_equal(run(f, js), 0);
    expect_out(f, "\"time\":{\"hw\":\"H100-SXM\"");
    expect_out(f, "\"mbu\":0.8,");
    expect_out(f, "\"batch\":5000,");
    expect_out(f, "\"fits\":false}");
    char *img = kvs_test_slurp(svg, NULL);
    assert_non_null(strstr(img, "<svg"));
    assert_non_null(strstr(img, "prompt-only, budget 1024"));
    free(img);
    kvs_results_db *h = NULL;
    assert_int_equal(kvs_results_open_readonly(db, &h), KVS_OK);
    kvs_results_plan_time *tm = NULL;
    int64_t nt = 0;
    assert_int_equal(kvs_results_query_plan_times(h, &tm, &nt), KVS_OK);
    t.mbu = 0.8;
    int seen = 0;
    for (int64_t i = 0; i < nt; i++) {
        if (strcmp(tm[i].series, "full") || tm[i].context != 1024 || tm[i].response != 1024) continue;
        assert_int_equal(kvs_plan_time(&s, &t, &full, 1024, 1024, tm[i].batch, &r), KVS_OK);
        assert_true(fabs(tm[i].tpot_s - r.tpot) <= 1e-12 * r.tpot);
        assert_string_equal(tm[i].hw, "H100-SXM");
        assert_int_equal(tm[i].fits, tm[i].batch <= p.max_batch);
        assert_int_equal(tm[i].best, tm[i].batch == 8); /* 5000 does not fit */
        seen++;
    }
    assert_int_equal(seen, 3);
    kvs_results_plan_times_free(tm, nt);
    kvs_results_close(h);
    /* bad input */
    const char *nohw[] = {"plan", "--model", "Llama-3.1-8B", "--mbu", "0.5", NULL};
    assert_int_equal(run(f, nohw), 2);
    expect_err(f, "--mbu, --mfu, --batches and --plot-throughput need --hw GPU");
    const char *badmbu[] = {"plan", "--model", "Llama-3.1-8B", "--hw", "H200", "--mbu", "0", NULL};
    assert_int_equal(run(f, badmbu), 2);
    expect_err(f, "--mbu");
    const char *badhw[] = {"plan", "--model", "Llama-3.1-8B", "--hw", "TPUv5", NULL};
    assert_int_equal(run(f, badhw), 2);
    expect_err(f, "unknown GPU 'TPUv5'");
    const char *nofile[] = {"plan", "--model", "Llama-3.1-8B", "--hw", "/nonexistent/gpu.json", NULL};
    assert_int_equal(run(f, nofile), 1);
    const char *list[] = {"plan", "--list-hw", NULL};
    assert_int_equal(run(f, list), 0);
    expect_out(f, "MI300X");
}

/* A measured profile reads what its replay read: Quest keeps every position resident (its storage is the full
 * cache's) but reads its selection and page summaries, so it decodes faster than the full cache and slower than a
 * constant budget of what it reads; the window reads what it stores, so its measured time is the nominal one. */
static void test_cli_measured_reads(void **state) {
    cli_fx *f = *state;
    if (!kvs_test_kvsim_bin()) skip();
    char trace[512], db[160];
    snprintf(trace, sizeof trace, "%s/examples/stories260K.kvt", kvs_test_root());
    snprintf(db, sizeof db, "%s/r.db", f->dir);
    const char *replay[] = {"replay", trace, "--db", db, "--policy", "quest", "--policy", "window", "--budgets", "64",
                            "--series-every", "1", "--threads", "2", NULL};
    assert_int_equal(run(f, replay), 0);
    kvs_plan_profile q = {0}, w = {0};
    assert_int_equal(kvs_plan_profile_read(db, 0, "quest", 64, &q), KVS_OK);
    assert_int_equal(kvs_plan_profile_read(db, 0, "window", 64, &w), KVS_OK);
    assert_true(q.has_reads && w.has_reads);
    kvs_plan_setup s = llama8b();
    kvs_plan_time_setup t = on("H100-SXM");
    kvs_plan_policy mq = {.kind = KVS_PLAN_MEASURED, .profile = &q}, mw = {.kind = KVS_PLAN_MEASURED, .profile = &w};
    kvs_plan_policy full = {.kind = KVS_PLAN_FULL}, win = {.kind = KVS_PLAN_CONSTANT, .budget = 64};
    /* storage: Quest holds the full cache, and its page summaries beside it */
    const double fq = kvs_plan_footprint_at(&mq, &s, 400, 450).device, ff = kvs_plan_footprint_at(&full, &s, 400, 450)
                                                                               .device;
    assert_true(fq >= ff * (1 - 1e-9) && fq < 1.2 * ff);
    /* reads: its fitted lines, by hand: read_kv token equivalents x the planned token size (512 bytes) + read_aux
     * x the run's token size x the aux factor */
    kvs_plan_reads rq = kvs_plan_reads_at(&mq, &s, 400, 450);
    const double rk = q.read_kv.a + q.read_kv.b * 450, ra = q.read_aux.a + q.read_aux.b * 450;
    assert_true(fabs(rq.kv - rk * 512) <= 1e-9 * rk * 512);
    assert_true(fabs(rq.aux - ra * q.tok_bytes * kvs_plan_aux_factor(&q, &s)) <= 1e-9 * (rq.aux + 1));
    assert_true(rq.kv + rq.aux < 0.5 * ff);
    kvs_plan_timing a, b, c;
    assert_int_equal(kvs_plan_time(&s, &t, &mq, 400, 95, 64, &a), KVS_OK);
    assert_int_equal(kvs_plan_time(&s, &t, &full, 400, 95, 64, &b), KVS_OK);
    assert_true(a.tpot < b.tpot);
    /* the window: measured = nominal */
    assert_int_equal(kvs_plan_time(&s, &t, &mw, 400, 95, 64, &a), KVS_OK);
    assert_int_equal(kvs_plan_time(&s, &t, &win, 400, 95, 64, &c), KVS_OK);
    assert_true(fabs(a.tpot - c.tpot) <= 1e-9 * c.tpot);
    /* through the CLI: the measured series' TPOT is the library's */
    const char *plan[] = {"plan", "--model", "Llama-3.1-8B", "--hw", "H100-SXM", "--profile", db, "--policy",
                          "quest", "--budget", "64", "--context", "400", "--response", "95", "--batch", "64",
                          "--csv", NULL};
    assert_int_equal(run(f, plan), 0);
    assert_int_equal(kvs_plan_time(&s, &t, &mq, 400, 95, 64, &a), KVS_OK);
    char id[64];
    snprintf(id, sizeof id, "measured quest B=64 (run %lld)", (long long)q.run_id);
    assert_true(fabs(csv_at(f, id, 400, 95, 64, 18) - a.tpot) <= 1e-9 * a.tpot);
}

/* examples/capacity.sh's latency/throughput table: the stories260K H2O row recomputed from the run's profile in the
 * script's database with the library (TPOT at batch 16 and the tokens/s of the best batch). */
static void test_capacity_script(void **state) {
    cli_fx *f = *state;
    if (!kvs_test_kvsim_bin()) skip();
    if (system("command -v gnuplot >/dev/null 2>&1") != 0) {
        print_message("gnuplot is not installed: skipping capacity.sh (it draws plots)\n");
        skip();
    }
    char cmd[2048], path[256];
    snprintf(cmd, sizeof cmd, "OUT='%s/cap' KVSIM_BIN='%s' sh '%s/examples/capacity.sh' >'%s/cap.log' 2>&1", f->dir,
             kvs_test_kvsim_bin(), kvs_test_root(), f->dir);
    int rc = system(cmd);
    if (rc != 0) {
        snprintf(cmd, sizeof cmd, "cat '%s/cap.log'", f->dir);
        (void)system(cmd);
    }
    assert_int_equal(rc, 0);
    snprintf(path, sizeof path, "%s/cap/capacity_time.txt", f->dir);
    char *t = kvs_test_slurp(path, NULL), *save = NULL;
    assert_non_null(t);
    double ttft = NAN, tpot = NAN, tps = NAN, tps_best = NAN;
    long long best = -1;
    int rows = 0;
    for (char *line = strtok_r(t, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char model[64], policy[64], budget[16];
        if (sscanf(line, "%63s %63s %15s", model, policy, budget) != 3) continue;
        if (!strcmp(model, "stories260K") || !strcmp(model, "tinystories-656K")) rows++;
        if (!strcmp(model, "stories260K") && !strcmp(policy, "h2o"))
            assert_int_equal(sscanf(line, "%*s %*s %*s %lf %lf %lf %lld %lf", &ttft, &tpot, &tps, &best, &tps_best), 5);
    }
    free(t);
    assert_int_equal(rows, 8); /* 4 policies x the 2 shared models */
    /* H2O was the first run replayed */
    snprintf(path, sizeof path, "%s/cap/capacity_time.db", f->dir);
    kvs_plan_profile p = {0};
    assert_int_equal(kvs_plan_profile_read(path, 1, NULL, 0, &p), KVS_OK);
    assert_string_equal(p.policy, "h2o");
    kvs_plan_setup s = llama8b();
    s.gpu_bytes = 80e9;
    kvs_plan_time_setup hw = on("H100-SXM");
    kvs_plan_policy m = {.kind = KVS_PLAN_MEASURED, .profile = &p};
    kvs_plan_timing r;
    assert_int_equal(kvs_plan_time(&s, &hw, &m, 8192, 8192, 16, &r), KVS_OK);
    /* printed to 4 significant digits */
    assert_true(fabs(tpot - r.tpot * 1e3) <= 1e-3 * tpot);
    assert_true(fabs(ttft - r.ttft * 1e3) <= 1e-3 * ttft);
    assert_true(fabs(tps - r.tokens_per_s) <= 1e-3 * tps);
    assert_int_equal(kvs_plan_time(&s, &hw, &m, 8192, 8192, best, &r), KVS_OK);
    assert_true(fabs(tps_best - r.tokens_per_s) <= 1e-3 * tps_best);
    kvs_plan_point pt;
    assert_int_equal(kvs_plan_eval(&s, &m, 8192, 8192, 1, &pt), KVS_OK);
    assert_true(best <= pt.max_batch);
    /* the report's capacity section names every measured policy and carries the time of each at batch 16 */
    snprintf(cmd, sizeof cmd, "'%s' report '%s' --out '%s/rep' >'%s/rep.log' 2>&1", kvs_test_kvsim_bin(), path, f->dir,
             f->dir);
    assert_int_equal(system(cmd), 0);
    snprintf(path, sizeof path, "%s/rep/report.md", f->dir);
    assert_true(kvs_test_file_has(path, "Measured policies planned here (policy, budget, replay run): h2o B=64 (run 1); "
                                        "snapkv B=64 (run 2); quest B=64 (run 3); synckv B=64 (run 4); h2o B=64 (run "
                                        "5);"));
    assert_int_equal(kvs_plan_time(&s, &hw, &m, 8192, 8192, 16, &r), KVS_OK);
    char row[256];
    snprintf(row, sizeof row, "| measured h2o B=64 (run 1) | 1 x H100-SXM | 1 / 1 | 8192 + 8192 | 16 | %.4g ms | %.4g ms |",
             r.ttft * 1e3, r.tpot * 1e3);
    assert_true(kvs_test_file_has(path, row));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_presets_datasheet_figures),
        cmocka_unit_test(test_h100_batch1_decode_by_hand),
        cmocka_unit_test(test_per_layer),
        cmocka_unit_test(test_prefill_by_hand),
        cmocka_unit_test(test_decode_plateau),
        cmocka_unit_test(test_tensor_parallel),
        cmocka_unit_test(test_offload_pcie),
        cmocka_unit_test(test_hw_file),
        cmocka_unit_test_setup_teardown(test_cli_time, kvs_test_cli_setup, kvs_test_cli_teardown),
        cmocka_unit_test_setup_teardown(test_cli_measured_reads, kvs_test_cli_setup, kvs_test_cli_teardown),
        cmocka_unit_test_setup_teardown(test_capacity_script, kvs_test_cli_setup, kvs_test_cli_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
