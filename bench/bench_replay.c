/* bench_replay.c — replay throughput (`make bench`), in (query head x attended token) pairs per second, per
 * policy with all cores, beside two yardsticks: the machine's measured vector FMA peak (kvs_peak.h; pairs/s upper
 * bound = FMA/s / (2·head_dim): each pair needs a dot product and an axpy) and a naive scalar attention loop.
 * Data: the trace named by KVSIM_BENCH_TRACE when set, otherwise GENERATED Gaussian data (labelled as
 * such; tests/util/gen_trace.h), which has the shapes of a model but is not one.
 * Numbers go to stdout and are never asserted (DESIGN.md "Quality bar").
 * Also: replay peak memory against trace length (bounded by policy state, not trace length), each
 * length in a forked child so VmHWM is the replay's own peak.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../common/kvs.h"
#include "../common/kvs_peak.h"
#include "../sim/policy.h"
#include "../policies/registry.h"
#include "../sim/replay.h"
#include "../sim/samples.h"
#include "../sim/metrics.h"
#include "../sim/replay_mem.h"
#include "../tests/util/gen_trace.h"

#define CHECK(x)                                                                      \
    do {                                                                              \
        kvs_status st_ = (x);                                                         \
        if (st_ != KVS_OK) {                                                          \
            fprintf(stderr, "bench_replay: %s: %s\n", #x, kvs_last_error());          \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

/* FMAs per second of one core: the measured vector peak of the widest instruction set this CPU has
 * (common/kvs_peak.h): a loop compiled without vector ISA flags would understate it several times. */
static double fma_per_second(void) {
    double best = 0;
    for (int i = 0; i < KVS_PEAK_COUNT; i++) {
        double f = kvs_peak_fma((kvs_peak_isa)i, 1, 0.2);
        if (f > best) best = f;
    }
    return best;
}

/* Naive scalar full attention of every query head at every decode position; returns pairs/s. */
static double naive_pairs_per_second(const kvs_gen_trace *g, int64_t prompt) {
    int d = g->opt.head_dim, H = g->opt.n_heads, Hkv = g->opt.n_kv_heads, G = H / Hkv;
    int64_t N = g->opt.n_positions;
    float *p = malloc((size_t)N * sizeof *p), out[1024];
    double pairs = 0, t0 = kvs_now_s(), sink = 0;
    for (int l = 0; l < 1; l++)
        for (int qh = 0; qh < H; qh++)
            for (int64_t t = prompt; t < N; t++) {
                const float *q = g->q + (((size_t)l * (size_t)N + (size_t)t) * (size_t)H + (size_t)qh) * (size_t)d;
                float m = -INFINITY;
                for (int64_t j = 0; j <= t; j++) {
                    const float *k = g->k + (((size_t)l * (size_t)N + (size_t)j) * (size_t)Hkv + (size_t)(qh / G)) * (size_t)d;
                    float s = 0;
                    for (int i = 0; i < d; i++) s += q[i] * k[i];
                    p[j] = s / sqrtf((float)d);
                    if (p[j] > m) m = p[j];
                }
                double z = 0;
                for (int64_t j = 0; j <= t; j++) z += p[j] = expf(p[j] - m);
                for (int i = 0; i < d; i++) out[i] = 0;
                for (int64_t j = 0; j <= t; j++) {
                    const float *v = g->v + (((size_t)l * (size_t)N + (size_t)j) * (size_t)Hkv + (size_t)(qh / G)) * (size_t)d;
                    float w = (float)(p[j] / z);
                    for (int i = 0; i < d; i++) out[i] += w * v[i];
                }
                sink += out[0];
                pairs += (double)(t + 1);
            }
    double el = kvs_now_s() - t0;
    if (sink == 12345.0) printf(" ");
    free(p);
    return pairs / el;
}

/* VmHWM (peak resident set) of this process, bytes; -1 if unreadable. */
static double peak_rss_bytes(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double kb = -1;
    if (!f) return -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) kb = atof(line + 6);
    fclose(f);
    return kb * 1024.0;
}

/* One child: GENERATED data of n positions (1 layer, 8 query heads, 2 KV heads, d 16, 64 prompt
 * positions), then `nc` window configurations with no step series; prints the replay's peak RSS growth. */
static void memory_row(int64_t n, int nc) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) return;
    if (pid > 0) {
        int wst;
        waitpid(pid, &wst, 0);
        return;
    }
    kvs_gen_trace_opts o = kvs_gen_trace_defaults();
    o.n_layers = 1;
    o.n_heads = 8;
    o.n_kv_heads = 2;
    o.head_dim = 16;
    o.n_positions = (int32_t)n;
    o.prompt_len = 64;
    kvs_gen_trace *g = NULL;
    kvs_turn *turns = NULL;
    int64_t n_turns = 0;
    CHECK(kvs_gen_trace_create(&o, &g));
    kvs_model_config mc;
    kvs_capture_config cc;
    kvs_gen_trace_configs(g, &mc, &cc);
    CHECK(kvs_trace_turns_from_roles(g->roles, g->turn, o.n_positions, &turns, &n_turns, NULL));
    kvs_replay_mem mem = {
        .model = {.n_layers = 1, .n_heads = 8, .n_kv_heads = 2, .group = 4, .head_dim = 16, .scale = mc.attn_scale,
                  .kv_bytes = 2, .aux_bytes = 4, .n_positions = n, .prompt_len = 64},
        .turns = turns, .n_turns = n_turns, .q = g->q, .k = g->k, .v = g->v, .block_positions = 64};
    kvs_replay_source src;
    CHECK(kvs_replay_source_from_memory(&mem, &src));
    const int NC = nc;
    kvs_replay_config *cfgs = calloc((size_t)NC, sizeof *cfgs);
    if (!cfgs) _exit(1);
    for (int i = 0; i < NC; i++) {
        cfgs[i] = (kvs_replay_config){.budget = 4 + 4 * i, .budget_fraction = -1};
        CHECK(kvs_policy_parse("window", &cfgs[i].policy));
    }
    kvs_replay_opts ro = {.configs = cfgs, .n_configs = NC, .threads = kvs_n_cpus(), .measure = KVS_MEASURE_DECODE};
    double before = peak_rss_bytes(), t0 = kvs_now_s();
    kvs_replay_result *r = NULL;
    CHECK(kvs_replay_execute(&src, &ro, &r));
    double el = kvs_now_s() - t0, after = peak_rss_bytes();
    double samples = (double)r->runs[0].run_agg.out_err.n * NC;
    /* What the engine must hold per concurrent task (sim/replay.c task_alloc; one task per layer and group of
     * configurations, min(threads, configurations) groups here): the layer's K/V history (fp32, the rows a
     * policy may read) and the per-step buffers over every position (the full attention row and its ranking
     * that the metrics need, the selection and its row pointers, the gathered K/V). O(positions), never
     * O(samples). */
    const double N = (double)n, d = 16, Hkv = 2, G = 4, HG = 8, mp = 64;
    double history = Hkv * N * d * 4 * 2;
    /* the full attention rows of a reference block, their scores before the softmax (kvs_replay_opts.ref_scores, the
     * policies' S_t scores) and the ranks of the current position. The block counted is 8 positions; sim/replay.c
     * computes 64 query rows of a KV head together (ref_block_steps: 16 positions at G = 4), so this part of the
     * estimate is low. */
    const double ref_block = 8;
    double per_step = Hkv * mp * G * d * 4 + (2 * ref_block + 1) * HG * N * 4 + N * (4 + 12 + 4 + 1) + G * N * (4 + 4 + 8 + 8) + 2 * N * d * 4;
    int tasks = kvs_n_cpus() < NC ? kvs_n_cpus() : NC;
    double working = tasks * (history + per_step), peak = after - before;
    /* One sample buffer (KVS_SAMPLE_CHUNK samples of every metric) per configuration and layer (sim/samples.h):
     * O(configurations), whatever the trace length. */
    double buffers = (double)NC * 1 * KVS_N_METRICS * KVS_SAMPLE_CHUNK * sizeof(float);
    double old_bytes = samples * KVS_N_METRICS * sizeof(float); /* every sample held in RAM */
    printf("%8lld %7d %12.0f %10.2f %5d %12.2f %11.2f %14.1f %8.2f\n", (long long)n, NC, samples, peak / 1048576.0,
           tasks, working / 1048576.0, buffers / 1048576.0, old_bytes / 1048576.0, el);
    free(cfgs);
    kvs_replay_result_free(r);
    free(turns);
    kvs_gen_trace_free(g);
    fflush(stdout);
    _exit(0);
}

int main(void) {
    /* The memory rows first, in children forked before this process has run anything: a child inherits the
     * parent's heap, and what the throughput runs left in it skews the children's peak. */
    printf("replay peak memory vs trace length (GENERATED data: 1 layer, 8 query heads, 2 KV heads, d 16, prompt 64; "
           "window configurations, no step series; peak RSS growth during kvs_replay_execute, VmHWM):\n");
    printf("%8s %7s %12s %10s %5s %12s %11s %14s %8s\n", "positions", "configs", "samples", "peak_MiB", "tasks",
           "working_MiB", "buffers_MiB", "if_in_RAM_MiB", "wall_s");
    for (int64_t n = 1024; n <= 8192; n *= 2) memory_row(n, 16);
    memory_row(4096, 2); /* samples x 1/8 and x 4 at one length: the peak must not follow them */
    memory_row(4096, 64);
    printf("(working = tasks x (the layer's fp32 K/V history + the per-step buffers over every position: full attention "
           "row and ranks for the metrics, selection, gathered K/V) as allocated, O(positions) and inherent, an upper "
           "bound of what is resident (pages never touched are not); buffers = one in-memory sample buffer per "
           "configuration and layer (sim/samples.h), O(configurations); if_in_RAM = what holding every sample for exact percentiles would take: samples x %d "
           "metrics x 4 bytes, now spilled to a temporary file, percentiles still exact)\n",
           KVS_N_METRICS);
    printf("\n");
    const char *trace_path = getenv("KVSIM_BENCH_TRACE");
    kvs_trace *tr = NULL;
    kvs_gen_trace *g = NULL;
    kvs_replay_source src;
    kvs_replay_mem mem;
    kvs_turn *turns = NULL;
    int64_t n_turns = 0;
    /* A generated trace is always made: the naive yardstick runs on it. */
    kvs_gen_trace_opts o = kvs_gen_trace_defaults();
    o.n_layers = 4;
    o.n_heads = 8;
    o.n_kv_heads = 4;
    o.head_dim = 64;
    o.n_positions = 1024;
    o.prompt_len = 512;
    CHECK(kvs_gen_trace_create(&o, &g));
    if (trace_path) {
        CHECK(kvs_trace_open(trace_path, &tr));
        CHECK(kvs_replay_source_from_trace(tr, &src));
        printf("data: REAL trace %s (%s)\n", trace_path, kvs_trace_info_get(tr)->model.model_name);
    } else {
        kvs_model_config mc;
        kvs_capture_config cc;
        kvs_gen_trace_configs(g, &mc, &cc);
        CHECK(kvs_trace_turns_from_roles(g->roles, g->turn, o.n_positions, &turns, &n_turns, NULL));
        memset(&mem, 0, sizeof mem);
        mem.model = (kvs_policy_model){.n_layers = mc.n_layers, .n_heads = mc.n_heads, .n_kv_heads = mc.n_kv_heads,
                                       .group = mc.n_heads / mc.n_kv_heads, .head_dim = mc.head_dim,
                                       .scale = mc.attn_scale, .kv_bytes = 2, .aux_bytes = 4,
                                       .n_positions = o.n_positions, .prompt_len = turns[0].prompt_end,
                                       .max_new_tokens = o.n_positions - turns[0].prompt_end,
                                       .rope_theta = mc.rope_theta, .rope_layout = mc.rope_layout};
        mem.turns = turns;
        mem.n_turns = n_turns;
        mem.q = g->q;
        mem.k = g->k;
        mem.v = g->v;
        mem.block_positions = 64;
        CHECK(kvs_replay_source_from_memory(&mem, &src));
        printf("data: GENERATED Gaussian q/k/v (not a model): %d layers, %d heads, %d KV heads, d %d, %d positions "
               "(prompt %d)\n",
               o.n_layers, o.n_heads, o.n_kv_heads, o.head_dim, o.n_positions, o.prompt_len);
    }
    int threads = kvs_n_cpus();
    double fma = fma_per_second();
    int d = src.model.head_dim;
    printf("machine: %d CPUs; measured FMA peak %.3g FMA/s per core -> upper bound %.3g pairs/s per core, %.3g all cores "
           "(pair = one dot + one axpy = 2·d FMAs, d = %d)\n",
           threads, fma, fma / (2.0 * d), fma / (2.0 * d) * threads, d);
    printf("naive scalar full attention (1 core, generated data, d %d): %.3g pairs/s\n", o.head_dim,
           naive_pairs_per_second(g, o.prompt_len));
    const char *specs[] = {"full",  "window",  "streaming", "h2o",      "tova",        "keyformer", "topk",
                           "keydiff", "knorm", "morphkv",   "d2o",      "rocketkv", "rocketkv_mt", "hsa", "quest", "sparq"};
    int64_t budget = src.model.n_positions / 8;
    printf("%-11s %8s %12s %14s %10s  (budget %lld, %d threads; the engine also computes full attention and its "
           "ranking per step for the metrics, not counted in pairs)\n",
           "policy", "wall_s", "pairs", "pairs/s", "of_peak", (long long)budget, threads);
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        kvs_replay_config cfg = {.budget = budget, .budget_fraction = -1};
        CHECK(kvs_policy_parse(specs[i], &cfg.policy));
        kvs_replay_opts ro = {.configs = &cfg, .n_configs = 1, .threads = threads, .measure = KVS_MEASURE_DECODE,
                              .series_every = 1};
        kvs_replay_result *r = NULL;
        double t0 = kvs_now_s();
        CHECK(kvs_replay_execute(&src, &ro, &r));
        double el = kvs_now_s() - t0, pairs = 0;
        for (int64_t s = 0; s < r->runs[0].n_steps; s++) pairs += r->runs[0].steps[s].attended_tokens;
        printf("%-11s %8.3f %12.0f %14.4g %9.2f%%\n", specs[i], el, pairs, pairs / el,
               100.0 * (pairs / el) / (fma / (2.0 * d) * threads));
        kvs_replay_result_free(r);
    }
    kvs_trace_close(tr);
    kvs_gen_trace_free(g);
    free(turns);
    return 0;
}
